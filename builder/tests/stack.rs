//! The stack build, end to end, against independent tools: the demo builds reproducibly,
//! `minisign -V` checks its signature, `skopeo` reads and copies it, `ingot verify` refuses every
//! kind of tampering with a message that names it, and the preloaded image imports into a real
//! containerd.

mod common;

use std::fs;
use std::path::Path;
use std::process::Command;

use common::*;
use serde_json::Value;

fn sha256_hex(bytes: &[u8]) -> String {
    use sha2::Digest;
    hex::encode(sha2::Sha256::digest(bytes))
}

/// Every file of a layout, relative path → bytes.
fn files(dir: &Path) -> Vec<(String, Vec<u8>)> {
    let mut out = Vec::new();
    let mut stack = vec![dir.to_owned()];
    while let Some(d) = stack.pop() {
        for e in fs::read_dir(&d).unwrap() {
            let p = e.unwrap().path();
            if p.is_dir() {
                stack.push(p);
            } else {
                let rel = p.strip_prefix(dir).unwrap().to_string_lossy().into_owned();
                out.push((rel, fs::read(&p).unwrap()));
            }
        }
    }
    out.sort();
    out
}

#[test]
fn demo_builds_reproducibly() {
    let tmp = tempfile::tempdir().unwrap();
    let (sk, _) = keypair(tmp.path(), "release");
    let a = tmp.path().join("a/demo");
    let b = tmp.path().join("b/demo");
    build(&demo_manifest(), &a, Some(&sk));
    build(&demo_manifest(), &b, Some(&sk));
    let (la, lb) = (read_layout(&a), read_layout(&b));
    assert_eq!(la.manifest_digest, lb.manifest_digest);
    let (fa, fb) = (files(&a), files(&b));
    assert_eq!(
        fa.iter().map(|f| &f.0).collect::<Vec<_>>(),
        fb.iter().map(|f| &f.0).collect::<Vec<_>>()
    );
    for ((name, x), (_, y)) in fa.iter().zip(&fb) {
        assert!(x == y, "{name} differs between two builds");
    }
    // Every blob is stored under its own digest.
    for (name, bytes) in &fa {
        if let Some(hex) = name.strip_prefix("blobs/sha256/") {
            assert_eq!(sha256_hex(bytes), hex, "{name}");
        }
    }
    // Four layer kinds, two blobs each, and the manifest's shape.
    let m = &la.manifest;
    assert_eq!(m["artifactType"], "application/vnd.ingot.stack.v1");
    assert_eq!(
        m["config"]["mediaType"],
        "application/vnd.ingot.stack.v1+json"
    );
    let kinds: Vec<&str> = la.descriptor["layers"]
        .as_array()
        .unwrap()
        .iter()
        .map(|l| l["kind"].as_str().unwrap())
        .collect();
    assert_eq!(kinds, ["base", "control-plane", "nvidia", "kata"]);
    let layers = m["layers"].as_array().unwrap();
    assert_eq!(layers.len(), 12);
    for triple in layers.chunks(3) {
        assert_eq!(
            triple[0]["mediaType"],
            "application/vnd.ingot.layer.v1.ext4+zstd"
        );
        assert_eq!(triple[1]["mediaType"], "application/vnd.ingot.verity.v1");
        assert_eq!(triple[2]["mediaType"], "application/spdx+json");
    }
    for key in ["version", "created", "revision", "source"] {
        assert!(
            m["annotations"][format!("org.opencontainers.image.{key}")].is_string(),
            "annotation {key}"
        );
    }
    assert_eq!(
        m["annotations"]["org.opencontainers.image.created"],
        "2023-11-14T22:13:20Z"
    );
    // The descriptor is canonical: re-serializing the parsed value gives the same bytes.
    assert_eq!(
        serde_json::to_vec(&la.descriptor).unwrap(),
        la.descriptor_bytes
    );
    assert_eq!(
        la.layer("control-plane")["data"]["compression"]["frameSize"],
        4 * 1024 * 1024
    );
}

#[test]
fn one_changed_byte_changes_one_layer() {
    let tmp = tempfile::tempdir().unwrap();
    let work = tmp.path().join("repo");
    copy_tree(
        &repo().join("tests/fixtures/demo"),
        &work.join("tests/fixtures/demo"),
    );
    copy_tree(
        &repo().join("tests/fixtures/images"),
        &work.join("tests/fixtures/images"),
    );
    fs::create_dir_all(work.join("manifests")).unwrap();
    fs::copy(demo_manifest(), work.join("manifests/demo.toml")).unwrap();
    let manifest = work.join("manifests/demo.toml");

    build(&manifest, &tmp.path().join("before"), None);
    // One byte of one file of the control-plane layer's tree.
    let file = work.join("tests/fixtures/demo/control-plane/etc/kubernetes/kubeadm-defaults.yaml");
    let mut bytes = fs::read(&file).unwrap();
    let last = bytes.len() - 2;
    bytes[last] ^= 0x01;
    fs::write(&file, &bytes).unwrap();
    build(&manifest, &tmp.path().join("after"), None);

    let before = read_layout(&tmp.path().join("before"));
    let after = read_layout(&tmp.path().join("after"));
    assert_ne!(before.manifest_digest, after.manifest_digest);
    let changed: Vec<String> = before
        .root_hashes()
        .iter()
        .zip(after.root_hashes())
        .filter(|(a, b)| a.1 != b.1)
        .map(|(a, _)| a.0.clone())
        .collect();
    assert_eq!(changed, ["control-plane"]);
}

/// Save the descriptor and the signature from the manifest annotation as files.
fn export_signature(built: &Built, dir: &Path) -> (std::path::PathBuf, std::path::PathBuf) {
    let desc = dir.join("descriptor.json");
    let sig = dir.join("descriptor.json.minisig");
    fs::write(&desc, &built.descriptor_bytes).unwrap();
    fs::write(
        &sig,
        built.manifest["annotations"]["dev.ingot.signature"]
            .as_str()
            .expect("signed"),
    )
    .unwrap();
    (desc, sig)
}

#[test]
fn minisign_cli_verifies_the_signature() {
    let test = ingot_testkit::test_name!();
    if !have_tool(test, "minisign") {
        return;
    }
    let tmp = tempfile::tempdir().unwrap();
    // A key made by the minisign CLI signs the build...
    let (sk, pk) = (tmp.path().join("cli.key"), tmp.path().join("cli.pub"));
    run_ok(
        Command::new("minisign")
            .args(["-G", "-W", "-s"])
            .arg(&sk)
            .arg("-p")
            .arg(&pk),
    );
    let out = tmp.path().join("demo");
    build(&demo_manifest(), &out, Some(&sk));
    let built = read_layout(&out);
    let (desc, sig) = export_signature(&built, tmp.path());
    // ...and the CLI verifies the descriptor with the signature from the annotation.
    let stdout = run_ok(
        Command::new("minisign")
            .arg("-V")
            .arg("-p")
            .arg(&pk)
            .arg("-m")
            .arg(&desc)
            .arg("-x")
            .arg(&sig),
    );
    assert!(
        stdout.contains("Signature and comment signature verified"),
        "{stdout}"
    );
    assert!(
        stdout.contains("ingot stack=demo version=1.0.0"),
        "{stdout}"
    );
    ingot_ok([
        "verify".as_ref(),
        out.as_os_str(),
        "--trust-key".as_ref(),
        pk.as_os_str(),
    ]);

    // A key made by `ingot key generate` is one the CLI signs with.
    let (isk, ipk) = keypair(tmp.path(), "ingot");
    let data = tmp.path().join("data");
    fs::write(&data, b"some bytes").unwrap();
    run_ok(
        Command::new("minisign")
            .arg("-S")
            .arg("-s")
            .arg(&isk)
            .arg("-m")
            .arg(&data),
    );
    run_ok(
        Command::new("minisign")
            .arg("-V")
            .arg("-p")
            .arg(&ipk)
            .arg("-m")
            .arg(&data),
    );

    // A tampered descriptor fails the CLI too.
    let mut bytes = built.descriptor_bytes.clone();
    bytes[10] ^= 1;
    fs::write(&desc, bytes).unwrap();
    let st = Command::new("minisign")
        .arg("-V")
        .arg("-p")
        .arg(&pk)
        .arg("-m")
        .arg(&desc)
        .arg("-x")
        .arg(&sig)
        .output()
        .unwrap();
    assert!(!st.status.success());
}

/// `ingot verify` output and exit code.
fn verify(dir: &Path, key: Option<&Path>, extra: &[&str]) -> (i32, String) {
    let mut args: Vec<std::ffi::OsString> = vec!["verify".into(), dir.into()];
    if let Some(k) = key {
        args.push("--trust-key".into());
        args.push(k.into());
    }
    args.extend(extra.iter().map(Into::into));
    let out = ingot(args);
    (
        out.status.code().unwrap_or(-1),
        format!(
            "{}{}",
            String::from_utf8_lossy(&out.stdout),
            String::from_utf8_lossy(&out.stderr)
        ),
    )
}

/// Rewrite a layout's descriptor (with a new digest), keeping the manifest's signature.
fn replace_descriptor(dir: &Path, new_descriptor: &[u8]) {
    let built = read_layout(dir);
    let digest = format!("sha256:{}", sha256_hex(new_descriptor));
    fs::write(blob_path(dir, &digest), new_descriptor).unwrap();
    let mut m = built.manifest.clone();
    m["config"]["digest"] = Value::from(digest);
    m["config"]["size"] = Value::from(new_descriptor.len());
    let mbytes = serde_json::to_vec(&m).unwrap();
    let mdigest = format!("sha256:{}", sha256_hex(&mbytes));
    fs::write(blob_path(dir, &mdigest), &mbytes).unwrap();
    let mut index: Value =
        serde_json::from_slice(&fs::read(dir.join("index.json")).unwrap()).unwrap();
    index["manifests"][0]["digest"] = Value::from(mdigest);
    index["manifests"][0]["size"] = Value::from(mbytes.len());
    fs::write(dir.join("index.json"), serde_json::to_vec(&index).unwrap()).unwrap();
}

#[test]
fn verify_refuses_tampering_and_names_it() {
    let tmp = tempfile::tempdir().unwrap();
    let (sk, pk) = keypair(tmp.path(), "release");
    let (other_sk, other_pk) = keypair(tmp.path(), "other");
    let good = tmp.path().join("good");
    build(&demo_manifest(), &good, Some(&sk));

    let (code, out) = verify(&good, Some(&pk), &[]);
    assert_eq!(code, 0, "{out}");

    // Verified with another key than the one that signed.
    let (code, out) = verify(&good, Some(&other_pk), &[]);
    assert_eq!(code, 3, "{out}");
    assert!(out.contains("signed by another key"), "{out}");

    // Signed by another key, checked with ours.
    let other = tmp.path().join("other");
    build(&demo_manifest(), &other, Some(&other_sk));
    let (code, out) = verify(&other, Some(&pk), &[]);
    assert_eq!(code, 3, "{out}");
    assert!(out.contains("signed by another key"), "{out}");

    // Unsigned: refused, unless --allow-unsigned.
    let unsigned = tmp.path().join("unsigned");
    build(&demo_manifest(), &unsigned, None);
    let (code, out) = verify(&unsigned, Some(&pk), &[]);
    assert_eq!(code, 3, "{out}");
    assert!(out.contains("unsigned"), "{out}");
    let (code, out) = verify(&unsigned, None, &["--allow-unsigned"]);
    assert_eq!(code, 0, "{out}");

    // A flipped byte in any blob: refused, naming the blob.
    let built = read_layout(&good);
    let blobs: Vec<String> = fs::read_dir(good.join("blobs/sha256"))
        .unwrap()
        .map(|e| e.unwrap().file_name().to_string_lossy().into_owned())
        .collect();
    assert_eq!(blobs.len(), 14, "manifest, descriptor and 12 layer blobs");
    for (i, hex) in blobs.iter().enumerate() {
        let copy = tmp.path().join(format!("flip{i}"));
        copy_tree(&good, &copy);
        let path = copy.join("blobs/sha256").join(hex);
        let mut bytes = fs::read(&path).unwrap();
        let at = bytes.len() / 2;
        bytes[at] ^= 0x40;
        fs::write(&path, &bytes).unwrap();
        let (code, out) = verify(&copy, Some(&pk), &[]);
        assert_eq!(code, 4, "flipped {hex}: {out}");
        assert!(out.contains(hex.as_str()), "flipped {hex}: {out}");
        let what = if *hex == built.manifest_digest[7..] {
            "the image manifest"
        } else if built.manifest["config"]["digest"].as_str().unwrap()[7..] == **hex {
            "the stack descriptor"
        } else {
            "blob"
        };
        assert!(out.contains(what), "flipped {hex}: {out}");
    }

    // The descriptor edited to claim another root hash for the nvidia layer.
    let mut d = built.descriptor.clone();
    let layers = d["layers"].as_array_mut().unwrap();
    let nvidia = layers.iter_mut().find(|l| l["name"] == "nvidia").unwrap();
    let claimed = "ab".repeat(32);
    nvidia["verity"]["rootHash"] = Value::from(claimed.clone());
    let edited = tmp.path().join("edited");
    copy_tree(&good, &edited);
    replace_descriptor(&edited, &serde_json::to_vec(&d).unwrap());
    let (code, out) = verify(&edited, Some(&pk), &[]);
    assert_eq!(code, 3, "{out}");
    assert!(out.contains("does not match the signed bytes"), "{out}");
    // Without the signature check, the verity check catches it and names the layer.
    let (code, out) = verify(&edited, Some(&pk), &["--allow-unsigned"]);
    assert_eq!(code, 5, "{out}");
    assert!(
        out.contains("layer `nvidia`: verity root hash mismatch"),
        "{out}"
    );
    assert!(out.contains(&claimed), "{out}");
}

#[test]
fn skopeo_reads_and_copies_the_artifact() {
    let test = ingot_testkit::test_name!();
    if !have_tool(test, "skopeo") {
        return;
    }
    let tmp = tempfile::tempdir().unwrap();
    let (sk, pk) = keypair(tmp.path(), "release");
    let dir = tmp.path().join("demo");
    build(&demo_manifest(), &dir, Some(&sk));
    let built = read_layout(&dir);
    let raw = run_ok(
        Command::new("skopeo")
            .args(["inspect", "--raw"])
            .arg(format!("oci:{}", dir.display())),
    );
    assert_eq!(
        format!("sha256:{}", sha256_hex(raw.as_bytes())),
        built.manifest_digest
    );
    let copy = tmp.path().join("copy");
    run_ok(
        Command::new("skopeo")
            .arg("copy")
            .arg(format!("oci:{}", dir.display()))
            .arg(format!("oci:{}", copy.display())),
    );
    assert_eq!(read_layout(&copy).manifest_digest, built.manifest_digest);
    let (code, out) = verify(&copy, Some(&pk), &[]);
    assert_eq!(code, 0, "{out}");
    assert!(out.contains("verified demo 1.0.0: 4 layers"), "{out}");

    // skopeo's `oci:DIR:TAG`, the same string in both tools: the build tags its manifest with the
    // version, and one layout holding two tags is read at either, by ingot as by skopeo.
    let multi = tmp.path().join("multi");
    for tag in ["one", "two"] {
        run_ok(
            Command::new("skopeo")
                .arg("copy")
                .arg(format!("oci:{}:1.0.0", dir.display()))
                .arg(format!("oci:{}:{tag}", multi.display())),
        );
    }
    let at = |tag: &str| Path::new(&format!("oci:{}:{tag}", multi.display())).to_path_buf();
    for tag in ["one", "two"] {
        let (code, out) = verify(&at(tag), Some(&pk), &[]);
        assert_eq!(code, 0, "{tag}: {out}");
        assert!(out.contains("verified demo 1.0.0"), "{out}");
    }
    let (code, out) = verify(&multi, Some(&pk), &[]);
    assert_eq!(code, 1, "{out}");
    assert!(out.contains("more than one manifest"), "{out}");
    let (code, out) = verify(&at("three"), Some(&pk), &[]);
    assert_eq!(code, 1, "{out}");
    assert!(out.contains("no manifest is tagged `three`"), "{out}");
    let out = ingot([
        std::ffi::OsString::from("inspect"),
        at("two").into_os_string(),
    ]);
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
}

#[test]
fn preloaded_image_imports_into_containerd() {
    let test = ingot_testkit::test_name!();
    if !have_root(test) || !have_tool(test, "containerd") || !have_tool(test, "ctr") {
        return;
    }
    let tmp = tempfile::tempdir().unwrap();
    let dir = tmp.path().join("demo");
    build(&demo_manifest(), &dir, None);
    let built = read_layout(&dir);
    let cp = built.layer("control-plane");
    let preload = cp["preload"].as_array().expect("preload list");
    assert_eq!(preload.len(), 1);

    // The layer image, decompressed with the zstd crate (an ordinary zstd reader).
    let image = tmp.path().join("control-plane.ext4");
    let blob = fs::read(built.data_blob("control-plane")).unwrap();
    fs::write(&image, zstd::stream::decode_all(&blob[..]).unwrap()).unwrap();
    let mount = LoopMount::new(&image, &tmp.path().join("mnt"));

    let ctrd = Containerd::start(&tmp.path().join("containerd"));
    for p in preload {
        let path = p["path"].as_str().unwrap();
        assert!(path.starts_with("/usr/lib/ingot/preload/"), "{path}");
        let archive = mount.dir.join(path.trim_start_matches('/'));
        let out = ctrd.ctr(&["images", "import", archive.to_str().unwrap()]);
        assert!(
            out.status.success(),
            "ctr import {path}: {}",
            String::from_utf8_lossy(&out.stderr)
        );
    }
    let out = ctrd.ctr(&["images", "ls"]);
    let listing = String::from_utf8_lossy(&out.stdout).into_owned();
    for p in preload {
        let reference = p["reference"].as_str().unwrap();
        let digest = p["digest"].as_str().unwrap();
        assert!(
            listing
                .lines()
                .any(|l| l.starts_with(&format!("{reference} ")) && l.contains(digest)),
            "{reference}@{digest} not listed:\n{listing}"
        );
    }
    drop(ctrd);
    drop(mount);
}

#[test]
fn inspect_shows_layers_and_selection() {
    let tmp = tempfile::tempdir().unwrap();
    let (sk, pk) = keypair(tmp.path(), "release");
    let dir = tmp.path().join("demo");
    build(&demo_manifest(), &dir, Some(&sk));
    let cases: [(&[&str], &[&str]); 4] = [
        (&["--role", "control-plane"], &["base", "control-plane"]),
        (&["--role", "worker"], &["base"]),
        (
            &["--role", "worker", "--gpu", "nvidia", "--uefi"],
            &["base", "nvidia"],
        ),
        (
            &["--role", "worker", "--gpu", "nvidia", "--virt", "--uefi"],
            &["base", "nvidia", "kata"],
        ),
    ];
    for (machine, want) in cases {
        let mut args = vec!["inspect", dir.to_str().unwrap(), "--json"];
        args.extend_from_slice(machine);
        let v: Value = serde_json::from_str(&ingot_ok(&args)).unwrap();
        let got: Vec<&str> = v["selected"]
            .as_array()
            .unwrap()
            .iter()
            .map(|s| s.as_str().unwrap())
            .collect();
        assert_eq!(got, want, "{machine:?}");
    }
    let table = ingot_ok([
        "inspect",
        dir.to_str().unwrap(),
        "--trust-key",
        pk.to_str().unwrap(),
        "--role",
        "worker",
        "--virt",
        "--uefi",
    ]);
    let built = read_layout(&dir);
    for (name, root) in built.root_hashes() {
        assert!(
            table
                .lines()
                .any(|l| l.starts_with(&name) && l.ends_with(&root)),
            "{name}: {table}"
        );
    }
    assert!(table.contains("all(virt, uefi)"), "{table}");
    assert!(table.contains("signature  verified"), "{table}");
    assert!(table.contains("gets: base, kata"), "{table}");
}

#[test]
fn manifest_errors_name_file_line_and_reason() {
    let tmp = tempfile::tempdir().unwrap();
    let good = fs::read_to_string(demo_manifest()).unwrap();
    let fixtures = repo().join("tests/fixtures");
    // Absolute paths, so the manifests can live in the temp dir.
    let good = good.replace("../tests/fixtures", fixtures.to_str().unwrap());
    let line_of = |text: &str, needle: &str| -> usize {
        text.lines()
            .position(|l| l.contains(needle))
            .unwrap_or_else(|| panic!("{needle} not in manifest"))
            + 1
    };
    let hello_digest = "sha256:4f437677bf5b207bb0be5461a86d0c04f2a4cf5aa9ac04d0e42f6243df604f48";
    // (name, edit, line marker in the edited text, expected words)
    let cases: Vec<(&str, String, &str, &str)> = vec![
        (
            "unknown-field",
            good.replacen("kind = \"kata\"", "kind = \"kata\"\ncolour = \"red\"", 1),
            "colour",
            "unknown field `colour`",
        ),
        (
            "missing-digest",
            good.replacen(&format!("digest = \"{hello_digest}\"\n"), "", 1),
            "[[layer.preload]]",
            "missing field `digest`",
        ),
        (
            "duplicate-name",
            good.replacen("name = \"kata\"", "name = \"nvidia\"", 1),
            "kind = \"kata\"",
            "duplicate layer name `nvidia`",
        ),
        (
            "rule-on-base",
            good.replacen("kind = \"base\"", "kind = \"base\"\nwhen = \"virt\"", 1),
            "when = \"virt\"",
            "is the base layer: it has no `when` rule",
        ),
        (
            "missing-source",
            good.replacen("demo/control-plane", "demo/no-such-dir", 1),
            "no-such-dir",
            "does not exist",
        ),
        (
            "tar-digest-mismatch",
            good.replacen("sha256 = \"73c1", "sha256 = \"83c1", 1),
            "sha256 = \"83c1",
            "the manifest pins 83c1",
        ),
        (
            "image-digest-mismatch",
            good.replacen(hello_digest, &format!("sha256:{}", "5".repeat(64)), 1),
            "5555555555",
            "digest does not match",
        ),
    ];
    for (name, text, marker, want) in cases {
        assert_ne!(text, good, "{name}: the edit did not apply");
        let path = tmp.path().join(format!("{name}.toml"));
        fs::write(&path, &text).unwrap();
        // `line_of` finds the first line with the marker; for the duplicate name the error
        // points at the second layer's name, one line above its kind.
        let mut line = line_of(&text, marker);
        if name == "duplicate-name" {
            line -= 1;
        }
        let out = ingot([
            "build".as_ref(),
            path.as_os_str(),
            "--out".as_ref(),
            tmp.path().join(format!("{name}-out")).as_os_str(),
        ]);
        let stderr = String::from_utf8_lossy(&out.stderr);
        assert_eq!(out.status.code(), Some(1), "{name}: {stderr}");
        let place = format!("{}:{line}:", path.display());
        assert!(stderr.contains(&place), "{name}: want {place} in: {stderr}");
        assert!(stderr.contains(want), "{name}: want `{want}` in: {stderr}");
        assert!(!tmp.path().join(format!("{name}-out")).exists());
    }
}

#[test]
fn a_failed_build_leaves_nothing() {
    let tmp = tempfile::tempdir().unwrap();
    // A tarball whose digest is pinned correctly but whose content is not a tar archive: the
    // manifest checks pass, the layer build fails.
    let junk = tmp.path().join("junk.tar");
    fs::write(&junk, vec![0x5a; 3000]).unwrap();
    let text = fs::read_to_string(demo_manifest())
        .unwrap()
        .replace(
            "../tests/fixtures",
            repo().join("tests/fixtures").to_str().unwrap(),
        )
        .replace(
            &format!(
                "{}/demo/nvidia.tar",
                repo().join("tests/fixtures").display()
            ),
            junk.to_str().unwrap(),
        )
        .replace(
            "73c1a4629267580589ceb5142d1ab64a3e98248d87109b4d816655a7149528dd",
            &sha256_hex(&fs::read(&junk).unwrap()),
        );
    let manifest = tmp.path().join("junk.toml");
    fs::write(&manifest, text).unwrap();
    let parent = tmp.path().join("out");
    fs::create_dir_all(&parent).unwrap();
    let out = ingot([
        "build".as_ref(),
        manifest.as_os_str(),
        "--out".as_ref(),
        parent.join("demo").as_os_str(),
        "--quiet".as_ref(),
    ]);
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(!out.status.success(), "{stderr}");
    assert!(stderr.contains("layer `nvidia`"), "{stderr}");
    let left: Vec<_> = fs::read_dir(&parent).unwrap().collect();
    assert!(left.is_empty(), "left behind: {left:?}");
}

#[test]
fn key_generate_protects_the_secret_key() {
    use std::os::unix::fs::PermissionsExt;
    let tmp = tempfile::tempdir().unwrap();
    let (sk, pk) = keypair(tmp.path(), "k");
    assert_eq!(
        fs::metadata(&sk).unwrap().permissions().mode() & 0o777,
        0o600
    );
    let first = fs::read(&sk).unwrap();
    // A second run refuses to overwrite either file.
    let out = ingot([
        "key".as_ref(),
        "generate".as_ref(),
        "--secret".as_ref(),
        sk.as_os_str(),
        "--public".as_ref(),
        pk.as_os_str(),
    ]);
    assert!(!out.status.success());
    assert!(String::from_utf8_lossy(&out.stderr).contains("--force"));
    assert_eq!(fs::read(&sk).unwrap(), first);
}

/// Issue 15, item 11: `--force` deleted whatever `--out` named, even the directory holding the
/// manifest and its sources. It now replaces only a previous layout; anything else is refused and
/// left exactly as it was.
#[test]
fn force_replaces_only_a_previous_layout() {
    let tmp = tempfile::tempdir().unwrap();
    let force = |out: &Path| {
        ingot([
            "build".as_ref(),
            demo_manifest().as_os_str(),
            "--out".as_ref(),
            out.as_os_str(),
            "--quiet".as_ref(),
            "--force".as_ref(),
        ])
    };
    // A directory of someone's files, a directory that happens to hold an `oci-layout` file
    // beside other things, and a plain file.
    let precious = tmp.path().join("precious");
    fs::create_dir_all(precious.join("src")).unwrap();
    fs::write(precious.join("stack.toml"), "name = \"mine\"\n").unwrap();
    let mixed = tmp.path().join("mixed");
    fs::create_dir_all(&mixed).unwrap();
    fs::write(
        mixed.join("oci-layout"),
        "{\"imageLayoutVersion\":\"1.0.0\"}",
    )
    .unwrap();
    fs::write(mixed.join("notes.txt"), "keep me").unwrap();
    let file = tmp.path().join("file");
    fs::write(&file, "keep me too").unwrap();
    for (out, why) in [
        (&precious, "no `oci-layout` file"),
        (&mixed, "notes.txt"),
        (&file, "not a directory"),
    ] {
        let before = files(out.parent().unwrap());
        let o = force(out);
        let stderr = String::from_utf8_lossy(&o.stderr);
        assert!(!o.status.success(), "{}: {stderr}", out.display());
        assert!(
            stderr.contains("--force only replaces a previous OCI image layout")
                && stderr.contains(why),
            "{stderr}"
        );
        assert_eq!(files(out.parent().unwrap()), before, "{stderr}");
    }
    // A previous layout is replaced.
    let layout = tmp.path().join("layout");
    build(&demo_manifest(), &layout, None);
    let o = force(&layout);
    assert!(o.status.success(), "{}", String::from_utf8_lossy(&o.stderr));
    ingot_ok(["inspect".as_ref(), layout.as_os_str()]);
}

/// Issue "hostile input, second pass", items 14, 15 and 18: `ingot build` refuses, naming the
/// limit and leaving no output, a stack of 70 layers (144 GPT entries with the node layer), of
/// 40 (a 2,9xx-byte kernel command line), one whose kernel is missing from the base layer, one
/// whose kernel (sparse, 300 MiB) does not fit the default ESP, and one whose descriptor would
/// pass the 4 MiB every reader accepts (a `when` rule of 650,000 terms).
#[test]
fn build_refuses_stacks_past_a_boot_or_size_limit() {
    let tmp = tempfile::tempdir().unwrap();
    let fixtures = repo().join("tests/fixtures");
    let base_dir = fixtures.join("demo/base");
    let top = |kernel: &str| {
        format!(
            "name = \"limits\"\nversion = \"1\"\nsource_date_epoch = 1700000000\n\n[boot]\n\
             kernel = \"{kernel}\"\ninitrd = \"/boot/initrd.img\"\n\
             efi = \"/boot/efi/EFI/BOOT/BOOTX64.EFI\"\n"
        )
    };
    let layer = |name: &str, kind: &str, when: Option<&str>, dir: &Path| {
        let when = when.map_or(String::new(), |w| format!("when = \"{w}\"\n"));
        format!(
            "\n[[layer]]\nname = \"{name}\"\nkind = \"{kind}\"\n{when}source = {{ dir = \"{}\" }}\n",
            dir.display()
        )
    };
    let stack = |kernel: &str, base: &Path, extra: usize, when: &str| {
        let mut text = top(kernel) + &layer("base", "base", None, base);
        for i in 0..extra {
            text += &layer(&format!("layer-{i:02}"), "extra", Some(when), &base_dir);
        }
        text
    };
    let fat_base = tmp.path().join("fat-base");
    copy_tree(&base_dir, &fat_base);
    fs::File::create(fat_base.join("boot/vmlinuz"))
        .unwrap()
        .set_len(300 << 20)
        .unwrap();
    let huge_rule = format!("any({})", vec!["virt"; 650_000].join(", "));
    let cases: Vec<(&str, String, Vec<&str>)> = vec![
        (
            "seventy",
            stack("/boot/vmlinuz", &base_dir, 69, "virt"),
            vec!["144 partitions for 71 layers", "128 entries of a GPT"],
        ),
        (
            "forty",
            stack("/boot/vmlinuz", &base_dir, 39, "virt"),
            vec!["kernel command line is", "more than the 2047", "41 layers"],
        ),
        (
            "no-kernel",
            stack("/boot/vmlinuz-missing", &base_dir, 0, ""),
            vec![
                "boot.kernel \"/boot/vmlinuz-missing\"",
                "is missing from the base layer",
            ],
        ),
        (
            "fat-kernel",
            stack("/boot/vmlinuz", &fat_base, 0, ""),
            vec![
                "boot files are",
                "an ESP of 268435456 bytes holds at most 260046848",
            ],
        ),
        (
            "huge-descriptor",
            stack("/boot/vmlinuz", &base_dir, 1, &huge_rule),
            vec![
                "the stack descriptor is",
                "more than the 4194304 bytes every reader accepts",
            ],
        ),
    ];
    for (name, text, want) in cases {
        let manifest = tmp.path().join(format!("{name}.toml"));
        fs::write(&manifest, text).unwrap();
        let out_dir = tmp.path().join(format!("{name}-out"));
        let started = std::time::Instant::now();
        let out = ingot([
            "build".as_ref(),
            manifest.as_os_str(),
            "--out".as_ref(),
            out_dir.as_os_str(),
            "--quiet".as_ref(),
        ]);
        println!("{name}: refused in {:.2?}", started.elapsed());
        let stderr = String::from_utf8_lossy(&out.stderr);
        assert_eq!(out.status.code(), Some(1), "{name}: {stderr}");
        for w in want {
            assert!(stderr.contains(w), "{name}: want {w:?} in: {stderr}");
        }
        assert!(!out_dir.exists(), "{name}: output left behind");
    }
}
