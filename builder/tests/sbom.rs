//! Per-layer SBOMs (SPDX 2.3 JSON) from small stacks whose trees carry a hand-made dpkg status:
//! what each layer lists, that `pyspdxtools` (spdx-tools) accepts every document and refuses a
//! broken one, that `sbomcheck` (ntia-conformance-checker) finds every document NTIA-conformant,
//! the licences real Debian copyright files declare, that `verify` checks the SBOM blobs' digests, that `diff` shows version changes,
//! and that a hostile status fails the build naming the layer and the file.

mod common;

use std::fs;
use std::path::{Path, PathBuf};
use std::process::Command;

use common::{ingot, ingot_ok, write_manifest, TestLayer};
use ingot_testkit::skip::{current_test, find_tool, skip};
use serde_json::Value;

const BASE_STATUS: &str = "Package: zlib1g\nStatus: install ok installed\n\
Maintainer: Mark Brown <broonie@debian.org>\nArchitecture: amd64\nVersion: 1:1.2.13.dfsg-1\n\
Description: compression library - runtime\n zlib is a library.\n\n\
Package: libc6\nStatus: install ok installed\nMaintainer: GNU Libc Maintainers \
<debian-glibc@lists.debian.org>\nArchitecture: amd64\nVersion: 2.36-9+deb12u4\n\n\
Package: gone\nStatus: deinstall ok config-files\nArchitecture: amd64\nVersion: 1.0\n\n\
Package: libstdc++6\nStatus: install ok installed\nArchitecture: amd64\nVersion: 12.2.0-14\n";

/// The base's status plus one new package and a newer libc6.
fn tools_status(libc: &str) -> String {
    BASE_STATUS.replace("2.36-9+deb12u4", libc)
        + "\nPackage: socat\nStatus: install ok installed\nArchitecture: amd64\nVersion: 1.7.4.4-2\n"
}

/// A three-layer stack: the demo's base tree with `BASE_STATUS` at the Debian base's copy,
/// `tools` with its own status, `plain` with none.
fn stack(dir: &Path, tools: &[u8]) -> PathBuf {
    let (base, t) = common::dpkg_layers(dir, BASE_STATUS.as_bytes(), tools);
    let plain = dir.join("plain");
    fs::create_dir_all(plain.join("usr/share")).unwrap();
    fs::write(plain.join("usr/share/hello"), b"hello").unwrap();
    write_manifest(
        dir,
        "sbomtest",
        &[
            TestLayer::new("base", "base", None, &base),
            TestLayer::new("tools", "tools", Some("virt"), &t),
            TestLayer::new("plain", "extra", Some("uefi"), &plain),
        ],
    )
}

fn build(manifest: &Path, out: &Path) {
    ingot_ok([
        "build".as_ref(),
        manifest.as_os_str(),
        "--out".as_ref(),
        out.as_os_str(),
        "--quiet".as_ref(),
        "--revision".as_ref(),
        "test".as_ref(),
    ]);
}

fn json(text: &str) -> Value {
    serde_json::from_str(text).unwrap_or_else(|e| panic!("not JSON ({e}): {text}"))
}

fn descriptor(layout: &Path) -> Value {
    let built = common::read_layout(layout);
    built.descriptor.clone()
}

fn blob(layout: &Path, digest: &str) -> PathBuf {
    layout
        .join("blobs/sha256")
        .join(digest.strip_prefix("sha256:").unwrap())
}

/// `pyspdxtools`: from ci/test's venv (`INGOT_PYSPDXTOOLS`), or on the PATH.
fn pyspdxtools() -> Option<PathBuf> {
    std::env::var_os("INGOT_PYSPDXTOOLS")
        .map(PathBuf::from)
        .or_else(|| {
            Some(PathBuf::from(
                "/var/cache/ingot-ci/spdx-venv/bin/pyspdxtools",
            ))
        })
        .filter(|p| p.is_file())
        .or_else(|| find_tool("pyspdxtools"))
}

/// `sbomcheck` (PyPI's ntia-conformance-checker): from ci/test's venv (`INGOT_SBOMCHECK`), or on
/// the PATH.
fn sbomcheck() -> Option<PathBuf> {
    std::env::var_os("INGOT_SBOMCHECK")
        .map(PathBuf::from)
        .or_else(|| Some(PathBuf::from("/var/cache/ingot-ci/spdx-venv/bin/sbomcheck")))
        .filter(|p| p.is_file())
        .or_else(|| find_tool("sbomcheck"))
}

/// Whether `sbomcheck -r json` calls the document NTIA-conformant (its report, for messages).
fn ntia_conformant(tool: &Path, doc: &[u8], dir: &Path, name: &str) -> (bool, String) {
    let file = dir.join(format!("{name}.spdx.json"));
    fs::write(&file, doc).unwrap();
    let out = Command::new(tool)
        .args(["-r", "json"])
        .arg(&file)
        .output()
        .unwrap();
    let text = String::from_utf8_lossy(&out.stdout).into_owned();
    let report: Value = serde_json::from_str(&text).unwrap_or_else(|e| {
        panic!(
            "sbomcheck printed no JSON ({e}): {text}{}",
            String::from_utf8_lossy(&out.stderr)
        )
    });
    let conformant = report["isNtiaConformant"] == true;
    assert_eq!(
        out.status.success(),
        conformant,
        "exit status and report: {text}"
    );
    (conformant, text)
}

/// Whether `pyspdxtools` accepts the document (its output, for messages).
fn spdx_valid(tool: &Path, doc: &[u8], dir: &Path, name: &str) -> (bool, String) {
    let file = dir.join(format!("{name}.spdx.json"));
    fs::write(&file, doc).unwrap();
    let out = Command::new(tool).arg("-i").arg(&file).output().unwrap();
    let text = format!(
        "{}{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
    (out.status.success(), text)
}

fn names(packages: &Value) -> Vec<String> {
    packages
        .as_array()
        .unwrap()
        .iter()
        .map(|p| {
            format!(
                "{} {} {}",
                p["name"].as_str().unwrap(),
                p["version"].as_str().unwrap(),
                p["arch"].as_str().unwrap()
            )
        })
        .collect()
}

#[test]
fn every_layer_lists_its_packages_and_spdx_tools_accepts_each_document() {
    let tmp = tempfile::tempdir().unwrap();
    let manifest = stack(tmp.path(), tools_status("2.36-9+deb12u7").as_bytes());
    let out = tmp.path().join("out");
    build(&manifest, &out);
    ingot_ok([
        "verify".as_ref(),
        out.as_os_str(),
        "--allow-unsigned".as_ref(),
    ]);

    let report = json(&ingot_ok([
        "inspect".as_ref(),
        out.as_os_str(),
        "--packages".as_ref(),
        "--json".as_ref(),
    ]));
    let layers = report["layers"].as_array().unwrap();
    assert_eq!(
        names(&layers[0]["packages"]),
        [
            "libc6 2.36-9+deb12u4 amd64",
            "libstdc++6 12.2.0-14 amd64",
            "zlib1g 1:1.2.13.dfsg-1 amd64"
        ]
    );
    // Above the base: only what its status adds or changes.
    assert_eq!(
        names(&layers[1]["packages"]),
        ["libc6 2.36-9+deb12u7 amd64", "socat 1.7.4.4-2 amd64"]
    );
    assert_eq!(names(&layers[2]["packages"]), Vec::<String>::new());
    let table = ingot_ok(["inspect".as_ref(), out.as_os_str(), "--packages".as_ref()]);
    assert!(table.contains("layer `tools`: 2 packages"), "{table}");
    assert!(table.contains("  zlib1g 1:1.2.13.dfsg-1 amd64"), "{table}");

    let d = descriptor(&out);
    assert_eq!(d["schemaVersion"], 2);
    let mut docs = Vec::new();
    for l in d["layers"].as_array().unwrap() {
        let digest = l["sbom"]["digest"].as_str().unwrap();
        let bytes = fs::read(blob(&out, digest)).unwrap();
        let doc: Value = serde_json::from_slice(&bytes).unwrap();
        let name = l["name"].as_str().unwrap();
        assert_eq!(doc["spdxVersion"], "SPDX-2.3");
        assert_eq!(doc["creationInfo"]["created"], "2023-11-14T22:13:20Z");
        assert_eq!(
            doc["documentNamespace"],
            format!("https://ingot.invalid/spdx/sbomtest/1.0.0/{name}")
        );
        docs.push((name.to_owned(), bytes));
    }
    let zlib = String::from_utf8(docs[0].1.clone()).unwrap();
    assert!(
        zlib.contains("pkg:deb/debian/zlib1g@1%3A1.2.13.dfsg-1?arch=amd64"),
        "{zlib}"
    );
    assert!(
        zlib.contains("Person: Mark Brown (broonie@debian.org)"),
        "{zlib}"
    );
    // The tools layer has no os-release: its packages get the base's distribution.
    let tools = String::from_utf8(docs[1].1.clone()).unwrap();
    assert!(
        tools.contains("?arch=amd64&distro=ingot-demo-1.0.0\""),
        "{tools}"
    );

    // Deterministic: a second build gives the same SBOM blobs.
    let again = tmp.path().join("again");
    build(&manifest, &again);
    assert_eq!(descriptor(&again)["layers"], d["layers"]);

    let Some(tool) = pyspdxtools() else {
        return skip(
            &current_test(),
            "pyspdxtools (PyPI spdx-tools) is not installed",
        );
    };
    for (name, bytes) in &docs {
        let (ok, text) = spdx_valid(&tool, bytes, tmp.path(), name);
        assert!(ok, "pyspdxtools refuses layer `{name}`'s SBOM:\n{text}");
        println!("pyspdxtools, layer `{name}`: {}", text.trim());
    }
    let Some(check) = sbomcheck() else {
        return skip(
            &current_test(),
            "sbomcheck (PyPI ntia-conformance-checker) is not installed",
        );
    };
    for (name, bytes) in &docs {
        let (ok, text) = ntia_conformant(&check, bytes, tmp.path(), name);
        assert!(
            ok,
            "sbomcheck: layer `{name}`'s SBOM is not NTIA-conformant:\n{text}"
        );
    }
}

const REAL_STATUS: &str = "Package: zlib1g\nStatus: install ok installed\n\
Maintainer: Mark Brown <broonie@debian.org>\nArchitecture: amd64\nVersion: 1:1.2.13.dfsg-1\n\n\
Package: dash\nStatus: install ok installed\nMaintainer: Andrej Shadura <andrewsh@debian.org>\n\
Architecture: amd64\nVersion: 0.5.12-2\n\n\
Package: gzip\nStatus: install ok installed\nMaintainer: Milan Kupcevic <milan@debian.org>\n\
Architecture: amd64\nVersion: 1.12-1\n\n\
Package: base-files\nStatus: install ok installed\nMaintainer: Santiago Vila <sanvila@debian.org>\n\
Architecture: amd64\nVersion: 12.4+deb12u11\n\n\
Package: libc6\nStatus: install ok installed\nMaintainer: GNU Libc Maintainers \
<debian-glibc@lists.debian.org>\nArchitecture: amd64\nVersion: 2.36-9+deb12u4\n";

/// A two-layer stack whose base holds real copyright files for four of `REAL_STATUS`'s
/// packages (libc6 has none).
fn licence_stack(dir: &Path) -> PathBuf {
    let (base, tools) = common::dpkg_layers(dir, REAL_STATUS.as_bytes(), REAL_STATUS.as_bytes());
    for pkg in ["zlib1g", "dash", "gzip", "base-files"] {
        let doc = base.join("usr/share/doc").join(pkg);
        fs::create_dir_all(&doc).unwrap();
        fs::copy(
            common::repo().join("tests/fixtures/copyright").join(pkg),
            doc.join("copyright"),
        )
        .unwrap();
    }
    write_manifest(
        dir,
        "licences",
        &[
            TestLayer::new("base", "base", None, &base),
            TestLayer::new("tools", "tools", Some("virt"), &tools),
        ],
    )
}

/// Real Debian copyright files (this repository's copies of Debian 12's, in
/// tests/fixtures/copyright): DEP-5 ones give each package's declared licence, the others
/// NOASSERTION; every package has a supplier and a purl, and both checkers accept the document.
#[test]
fn real_copyright_files_give_declared_licences_and_the_sbom_is_ntia_conformant() {
    let tmp = tempfile::tempdir().unwrap();
    let manifest = licence_stack(tmp.path());
    let out = tmp.path().join("out");
    build(&manifest, &out);
    let d = descriptor(&out);
    let bytes = fs::read(blob(
        &out,
        d["layers"][0]["sbom"]["digest"].as_str().unwrap(),
    ))
    .unwrap();
    let doc: Value = serde_json::from_slice(&bytes).unwrap();
    let package = |name: &str| {
        doc["packages"]
            .as_array()
            .unwrap()
            .iter()
            .find(|p| p["name"] == name)
            .unwrap_or_else(|| panic!("no package {name}"))
            .clone()
    };
    assert_eq!(package("zlib1g")["licenseDeclared"], "Zlib");
    assert_eq!(
        package("zlib1g")["supplier"],
        "Person: Mark Brown (broonie@debian.org)"
    );
    assert_eq!(
        package("libc6")["supplier"],
        "Organization: GNU Libc Maintainers (debian-glibc@lists.debian.org)"
    );
    // The distro qualifier is the base's os-release's ID and VERSION_ID (the demo base's).
    assert_eq!(
        package("gzip")["externalRefs"][0]["referenceLocator"],
        "pkg:deb/debian/gzip@1.12-1?arch=amd64&distro=ingot-demo-1.0.0"
    );
    // Not DEP-5 (base-files), or no copyright file in the tree (libc6): nothing said.
    assert_eq!(package("base-files")["licenseDeclared"], "NOASSERTION");
    assert_eq!(package("libc6")["licenseDeclared"], "NOASSERTION");
    // dash: BSD-3-Clause, a public-domain file (its text from the copyright file), GPL-2+.
    let dash = package("dash")["licenseDeclared"]
        .as_str()
        .unwrap()
        .to_owned();
    let refs: Vec<Value> = doc["hasExtractedLicensingInfos"]
        .as_array()
        .unwrap()
        .clone();
    let pd = refs
        .iter()
        .find(|r| r["name"] == "public-domain")
        .expect("dash's public-domain text is declared");
    assert_eq!(
        dash,
        format!(
            "(BSD-3-Clause) AND ({}) AND (GPL-2.0-or-later)",
            pd["licenseId"].as_str().unwrap()
        )
    );
    assert!(pd["extractedText"].as_str().unwrap().len() > 20, "{pd}");
    let gzip = package("gzip")["licenseDeclared"]
        .as_str()
        .unwrap()
        .to_owned();
    assert!(
        gzip.starts_with("(GPL-3.0-or-later) AND (LicenseRef-GFDL-1.3--no-invariant-"),
        "{gzip}"
    );
    // A prepared directory: no .deb digest is known, so none is claimed.
    assert!(doc["packages"]
        .as_array()
        .unwrap()
        .iter()
        .all(|p| p.get("checksums").is_none()));

    let (Some(tool), Some(check)) = (pyspdxtools(), sbomcheck()) else {
        return skip(
            &current_test(),
            "pyspdxtools or sbomcheck (PyPI spdx-tools, ntia-conformance-checker) is not installed",
        );
    };
    let (ok, text) = spdx_valid(&tool, &bytes, tmp.path(), "licences");
    assert!(ok, "pyspdxtools refuses the SBOM:\n{text}");
    let (ok, text) = ntia_conformant(&check, &bytes, tmp.path(), "licences");
    assert!(ok, "sbomcheck: not NTIA-conformant:\n{text}");
    // The checker can say no: a package without a supplier is not conformant.
    let mut broken = doc.clone();
    broken["packages"][1]["supplier"] = "NOASSERTION".into();
    let (ok, text) = ntia_conformant(
        &check,
        &serde_json::to_vec(&broken).unwrap(),
        tmp.path(),
        "nosupplier",
    );
    assert!(
        !ok,
        "sbomcheck accepted a package without a supplier:\n{text}"
    );
}

#[test]
fn spdx_tools_refuses_a_broken_document() {
    let Some(tool) = pyspdxtools() else {
        return skip(
            &current_test(),
            "pyspdxtools (PyPI spdx-tools) is not installed",
        );
    };
    let tmp = tempfile::tempdir().unwrap();
    let manifest = stack(tmp.path(), tools_status("2.36-9+deb12u7").as_bytes());
    let out = tmp.path().join("out");
    build(&manifest, &out);
    let d = descriptor(&out);
    let digest = d["layers"][0]["sbom"]["digest"].as_str().unwrap();
    let good: Value = serde_json::from_slice(&fs::read(blob(&out, digest)).unwrap()).unwrap();
    let (ok, text) = spdx_valid(
        &tool,
        &serde_json::to_vec(&good).unwrap(),
        tmp.path(),
        "good",
    );
    assert!(ok, "{text}");
    // A DESCRIBES relationship to an element the document does not hold, and an SPDXID with a
    // character SPDX 2.3 does not allow: both are invalid.
    let mut broken = good.clone();
    broken["relationships"][1]["relatedSpdxElement"] = "SPDXRef-Nothing".into();
    let (ok, text) = spdx_valid(
        &tool,
        &serde_json::to_vec(&broken).unwrap(),
        tmp.path(),
        "b1",
    );
    assert!(!ok, "pyspdxtools accepted a dangling relationship:\n{text}");
    let mut broken = good;
    broken["packages"][1]["SPDXID"] = "SPDXRef-not_valid".into();
    let (ok, text) = spdx_valid(
        &tool,
        &serde_json::to_vec(&broken).unwrap(),
        tmp.path(),
        "b2",
    );
    assert!(!ok, "pyspdxtools accepted an SPDXID with `_`:\n{text}");
}

#[test]
fn verify_checks_the_sbom_blobs_and_diff_shows_package_changes() {
    let tmp = tempfile::tempdir().unwrap();
    let a = tmp.path().join("a");
    build(
        &stack(
            &tmp.path().join("sa"),
            tools_status("2.36-9+deb12u7").as_bytes(),
        ),
        &a,
    );
    let b = tmp.path().join("b");
    build(
        &stack(
            &tmp.path().join("sb"),
            tools_status("2.36-9+deb12u9").as_bytes(),
        ),
        &b,
    );

    let out = ingot([
        "diff".as_ref(),
        a.as_os_str(),
        b.as_os_str(),
        "--json".as_ref(),
    ]);
    assert_eq!(
        out.status.code(),
        Some(1),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let v = json(&String::from_utf8_lossy(&out.stdout));
    let tools = &v["layers"][1];
    assert_eq!(tools["name"], "tools");
    assert_eq!(
        tools["packages"]["changed"],
        serde_json::json!([{"name": "libc6", "arch": "amd64", "a": "2.36-9+deb12u7", "b": "2.36-9+deb12u9"}])
    );
    assert_eq!(v["layers"][0]["packages"]["changed"], serde_json::json!([]));
    let text =
        String::from_utf8_lossy(&ingot(["diff".as_ref(), a.as_os_str(), b.as_os_str()]).stdout)
            .into_owned();
    assert!(
        text.contains("package ~ libc6 amd64: 2.36-9+deb12u7 -> 2.36-9+deb12u9"),
        "{text}"
    );

    // One byte of layer `tools`' SBOM flipped: verify names it, exit 4 (a blob's digest).
    let d = descriptor(&a);
    let sbom = blob(&a, d["layers"][1]["sbom"]["digest"].as_str().unwrap());
    let mut bytes = fs::read(&sbom).unwrap();
    bytes[10] ^= 1;
    fs::write(&sbom, bytes).unwrap();
    let out = ingot([
        "verify".as_ref(),
        a.as_os_str(),
        "--allow-unsigned".as_ref(),
    ]);
    let err = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(4), "{err}");
    assert!(err.contains("layer `tools`: SBOM blob"), "{err}");
}

#[test]
fn a_hostile_dpkg_status_fails_the_build_naming_layer_and_path() {
    let cases: [(&str, Vec<u8>, &str); 4] = [
        (
            "binary",
            b"\x7fELF\x02\x01\x01\0\0\0junk".to_vec(),
            "NUL byte",
        ),
        (
            "no-package",
            b"Status: install ok installed\nVersion: 1\nArchitecture: all\n".to_vec(),
            "has no Package field",
        ),
        (
            "duplicate",
            tools_status("1").replace("socat", "zlib1g").into_bytes(),
            "listed twice",
        ),
        ("huge", vec![b'x'; (32 << 20) + 1], "more than"),
    ];
    for (what, status, want) in cases {
        let tmp = tempfile::tempdir().unwrap();
        let manifest = stack(tmp.path(), &status);
        let out = tmp.path().join("out");
        let run = ingot([
            "build".as_ref(),
            manifest.as_os_str(),
            "--out".as_ref(),
            out.as_os_str(),
            "--quiet".as_ref(),
        ]);
        let err = String::from_utf8_lossy(&run.stderr);
        assert_eq!(run.status.code(), Some(1), "{what}: {err}");
        assert!(
            err.contains("layer `tools`: dpkg status usr/lib/ingot/dpkg/status")
                && err.contains(want),
            "{what}: {err}"
        );
        assert!(!out.exists(), "{what}: a failed build left its output");
    }
}
