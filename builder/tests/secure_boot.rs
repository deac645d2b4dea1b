//! `ingot build --secure-boot-key/--secure-boot-cert`: the release's unified kernel image, made
//! with the real tools (objcopy, sbsign under faketime) and checked with the real verifier
//! (`sbverify`): two builds give the same bytes, its `.cmdline` names every layer, its root
//! hash, its rule and the stack's kernel arguments, `ingot verify` accepts it and refuses it
//! changed. `ingot key secure-boot` makes the key set (openssl, efitools).

mod common;

use std::fs;
use std::path::{Path, PathBuf};
use std::process::Command;

use common::{copy_tree, ingot, ingot_ok, keypair, read_layout, repo, write_manifest, TestLayer};
use ingot_artifact::verify::LayoutSource;
use ingot_artifact::verify::{read_uki, verify_metadata, Trust, VerifyError};
use ingot_testkit::skip::{have_file, have_tools};

const STUB: &str = "/usr/lib/systemd/boot/efi/linuxx64.efi.stub";

fn usable(test: &str) -> bool {
    have_tools(
        test,
        &[
            "objcopy",
            "sbsign",
            "sbverify",
            "faketime",
            "openssl",
            "cert-to-efi-sig-list",
            "sign-efi-sig-list",
        ],
    ) && have_file(test, Path::new(STUB))
        && have_file(test, Path::new("/lib/systemd/systemd-measure"))
        && have_tools(test, &["swtpm"])
        && have_file(test, Path::new(TCTI_SWTPM))
        && have_file(test, Path::new(ESYS))
}

/// What `systemd-measure sign` loads to reach a TPM (it computes the policy digest in a TPM
/// trial session): the TSS2 ESAPI and its swtpm transport.
const ESYS: &str = "/usr/lib/x86_64-linux-gnu/libtss2-esys.so.0";
const TCTI_SWTPM: &str = "/usr/lib/x86_64-linux-gnu/libtss2-tcti-swtpm.so.0";
/// The boot phases ingot signs (`ingot_artifact::pcr_policy::PHASES`), as inspect names them.
const SHOWN_PHASES: &str = "(stub), sysinit, sysinit:ready";

/// The demo's base with systemd-stub, and one more layer with a rule; the manifest carries
/// kernel arguments.
fn stack(dir: &Path) -> PathBuf {
    let base = dir.join("base");
    copy_tree(&repo().join("tests/fixtures/demo/base"), &base);
    fs::create_dir_all(base.join("usr/lib/systemd/boot/efi")).unwrap();
    fs::copy(STUB, base.join(&STUB[1..])).unwrap();
    let cp = dir.join("cp");
    copy_tree(&repo().join("tests/fixtures/demo/control-plane"), &cp);
    let manifest = write_manifest(
        dir,
        "sbdemo",
        &[
            TestLayer::new("base", "base", None, &base),
            TestLayer::new(
                "control-plane",
                "control-plane",
                Some("all(role == control-plane, uefi)"),
                &cp,
            ),
        ],
    );
    let text = fs::read_to_string(&manifest).unwrap().replace(
        "efi = \"/boot/efi/EFI/BOOT/BOOTX64.EFI\"\n",
        "efi = \"/boot/efi/EFI/BOOT/BOOTX64.EFI\"\nkernel_args = [\"console=ttyS0\", \"panic=-1\"]\n",
    );
    fs::write(&manifest, text).unwrap();
    manifest
}

fn build(manifest: &Path, out: &Path, sign: &Path, keys: &Path, pcr: &Path) {
    ingot_ok([
        "build".as_ref(),
        manifest.as_os_str(),
        "--out".as_ref(),
        out.as_os_str(),
        "--quiet".as_ref(),
        "--revision".as_ref(),
        "test".as_ref(),
        "--sign-key".as_ref(),
        sign.as_os_str(),
        "--secure-boot-key".as_ref(),
        keys.join("db.key").as_os_str(),
        "--secure-boot-cert".as_ref(),
        keys.join("db.crt").as_os_str(),
        "--pcr-key".as_ref(),
        pcr.as_os_str(),
    ]);
}

/// `ingot key generate --pcr`: (private, public) PEM, the public half what openssl derives.
fn pcr_keypair(dir: &Path, name: &str) -> (PathBuf, PathBuf) {
    let (sk, pk) = (
        dir.join(format!("{name}.key")),
        dir.join(format!("{name}.pub")),
    );
    let out = ingot_ok([
        "key".as_ref(),
        "generate".as_ref(),
        "--pcr".as_ref(),
        "--secret".as_ref(),
        sk.as_os_str(),
        "--public".as_ref(),
        pk.as_os_str(),
    ]);
    let derived = common::run_ok(
        Command::new("openssl")
            .args(["pkey", "-pubout", "-in"])
            .arg(&sk),
    );
    assert_eq!(derived, fs::read_to_string(&pk).unwrap(), "{out}");
    let text = common::run_ok(
        Command::new("openssl")
            .args(["pkey", "-noout", "-text", "-in"])
            .arg(&sk),
    );
    assert!(text.contains("Private-Key: (2048 bit"), "{text}");
    (sk, pk)
}

fn uki_path(layout: &Path) -> PathBuf {
    let l = read_layout(layout);
    let digest = l.descriptor["uki"]["digest"]
        .as_str()
        .expect("a uki")
        .to_string();
    common::blob_path(layout, &digest)
}

/// `ingot key secure-boot` in `dir`: the whole set, subjects as named, not overwritten.
fn secure_boot_keys(dir: &Path) -> PathBuf {
    let keys = dir.join("keys");
    let out = ingot_ok([
        "key".as_ref(),
        "secure-boot".as_ref(),
        "--out".as_ref(),
        keys.as_os_str(),
        "--name".as_ref(),
        "ingot test".as_ref(),
    ]);
    for k in ["PK", "KEK", "db"] {
        for ext in ["key", "crt", "esl", "auth"] {
            let f = keys.join(format!("{k}.{ext}"));
            assert!(
                f.is_file() && out.contains(&f.display().to_string()),
                "{out}"
            );
        }
    }
    // The certificates' subjects are the name as given, read back by openssl.
    let subject = common::run_ok(
        Command::new("openssl")
            .args(["x509", "-noout", "-subject", "-nameopt", "RFC2253", "-in"])
            .arg(keys.join("db.crt")),
    );
    assert_eq!(subject.trim(), "subject=CN=ingot test db");
    // The set exists: a second run refuses to overwrite it.
    let again = ingot([
        "key".as_ref(),
        "secure-boot".as_ref(),
        "--out".as_ref(),
        keys.as_os_str(),
    ]);
    assert!(!again.status.success());
    assert!(String::from_utf8_lossy(&again.stderr).contains("--force"));
    keys
}

/// The firmware's check, by the real tool: `uki` is signed by db, not by another key.
fn sbverify_checks(keys: &Path, uki: &Path) {
    let ok = Command::new("sbverify")
        .arg("--cert")
        .arg(keys.join("db.crt"))
        .arg(uki)
        .output()
        .unwrap();
    assert!(
        ok.status.success(),
        "{}",
        String::from_utf8_lossy(&ok.stderr)
    );
    let other = Command::new("sbverify")
        .arg("--cert")
        .arg(keys.join("KEK.crt"))
        .arg(uki)
        .output()
        .unwrap();
    assert!(
        !other.status.success(),
        "sbverify accepted the KEK certificate"
    );
}

#[test]
fn a_signed_uki_is_deterministic_verified_and_names_every_layer() {
    if !usable(ingot_testkit::test_name!()) {
        return;
    }
    let dir = tempfile::tempdir().unwrap();
    let keys = secure_boot_keys(dir.path());

    let (sign, public) = keypair(dir.path(), "release");
    let (pcr_key, pcr_pub) = pcr_keypair(dir.path(), "pcr");
    let manifest = stack(dir.path());
    let (a, b) = (dir.path().join("a"), dir.path().join("b"));
    let started = std::time::Instant::now();
    build(&manifest, &a, &sign, &keys, &pcr_key);
    eprintln!("secure boot build: {:.1?}", started.elapsed());
    std::thread::sleep(std::time::Duration::from_millis(1100));
    build(&manifest, &b, &sign, &keys, &pcr_key);
    let (la, lb) = (read_layout(&a), read_layout(&b));
    assert_eq!(la.manifest_digest, lb.manifest_digest, "two builds differ");
    let (ua, ub) = (uki_path(&a), uki_path(&b));
    let uki = fs::read(&ua).unwrap();
    assert!(uki == fs::read(&ub).unwrap(), "two UKIs differ");
    eprintln!("UKI: {} bytes", uki.len());

    sbverify_checks(&keys, &ua);

    // .cmdline: every layer with its root hash and rule, the marker, the stack's arguments.
    let cmdline = ingot_artifact::uki::cmdline(&uki).unwrap();
    let roots = la.root_hashes();
    let want = format!(
        "ingot.stack=sbdemo:1.0.0 ingot.layers=base:{},control-plane:{} \
         ingot.when=control-plane:all(role==control-plane,uefi) ingot.boot=uki ro console=ttyS0 panic=-1",
        roots[0].1, roots[1].1
    );
    assert_eq!(cmdline, want);
    assert_eq!(la.descriptor["uki"]["cmdline"], want);
    assert_eq!(la.descriptor["boot"]["kernelArgs"][0], "console=ttyS0");
    // The other sections are the base's files.
    let base = dir.path().join("base");
    for (section, file) in [
        (".linux", "boot/vmlinuz"),
        (".initrd", "boot/initrd.img"),
        (".osrel", "etc/os-release"),
    ] {
        let inside = ingot_artifact::uki::section(&uki, section).unwrap();
        assert!(inside == fs::read(base.join(file)).unwrap(), "{section}");
    }

    // inspect shows it.
    let shown = ingot_ok(["inspect".as_ref(), a.as_os_str()]);
    assert!(
        shown.contains(&format!(
            "uki        {}",
            la.descriptor["uki"]["digest"].as_str().unwrap()
        )),
        "{shown}"
    );
    assert!(shown.contains(&format!("cmdline    {want}")), "{shown}");
    let sections = dir.path().join("sections");
    assert_pcr11_is_systemd_measure(&uki, &shown, &sections);
    assert_pcr_policy_is_systemd_measure(&uki, &shown, &sections, (&pcr_key, &pcr_pub));

    // verify accepts it; a flipped byte in the UKI blob is a digest mismatch (exit 4).
    ingot_ok([
        "verify".as_ref(),
        a.as_os_str(),
        "--trust-key".as_ref(),
        public.as_os_str(),
    ]);
    let mut bytes = uki.clone();
    let at = bytes.len() / 2;
    bytes[at] ^= 0x01;
    fs::write(&ub, &bytes).unwrap();
    let r = ingot([
        "verify".as_ref(),
        b.as_os_str(),
        "--trust-key".as_ref(),
        public.as_os_str(),
    ]);
    assert_eq!(
        r.status.code(),
        Some(4),
        "{}",
        String::from_utf8_lossy(&r.stderr)
    );
    assert!(
        String::from_utf8_lossy(&r.stderr).contains("UKI"),
        "{}",
        String::from_utf8_lossy(&r.stderr)
    );

    assert_a_foreign_cmdline_is_refused(&a, &want, &roots[1].1, &base, &keys, dir.path());
    assert_a_foreign_pcr_key_is_refused(&a, &ua, dir.path());
}

/// Puts `bytes` into the layout's blob store; (digest, size).
fn layout_blob(layout: &Path, bytes: &[u8]) -> (String, u64) {
    let digest = ingot_artifact::oci_layout::sha256_digest(bytes);
    fs::write(common::blob_path(layout, &digest), bytes).unwrap();
    (digest, bytes.len() as u64)
}

/// The PCR 11 `inspect` showed is systemd-measure's for the UKI's sections (no boot phase: what
/// systemd-stub itself leaves).
fn assert_pcr11_is_systemd_measure(uki: &[u8], shown: &str, sections: &Path) {
    fs::create_dir_all(sections).unwrap();
    let mut measure = Command::new("/lib/systemd/systemd-measure");
    measure.args(["calculate", "--bank=sha256", "--phase="]);
    measure.args(section_args(uki, sections));
    let oracle = common::run_ok(&mut measure);
    let value = oracle
        .lines()
        .find_map(|l| l.strip_prefix("11:sha256="))
        .unwrap_or_else(|| panic!("{oracle}"));
    assert!(
        shown.contains(&format!("pcr 11     sha256:{value} (systemd-stub)")),
        "{shown}\n{oracle}"
    );
}

/// `--linux=FILE ...` for systemd-measure: every measured section `uki` has, written to
/// `sections`.
fn section_args(uki: &[u8], sections: &Path) -> Vec<std::ffi::OsString> {
    let mut args = Vec::new();
    for name in ingot_artifact::uki::MEASURED {
        let Ok(bytes) = ingot_artifact::uki::section(uki, name) else {
            continue;
        };
        let file = sections.join(&name[1..]);
        fs::write(&file, bytes).unwrap();
        let mut arg = std::ffi::OsString::from(format!("--{}=", &name[1..]));
        arg.push(&file);
        args.push(arg);
    }
    args
}

/// The UKI's `.pcrsig` is what `systemd-measure sign` makes (on swtpm) for its sections, phases
/// and key, signature for signature (RSA PKCS#1 v1.5 is deterministic), and inspect names the
/// phases.
fn assert_pcr_policy_is_systemd_measure(
    uki: &[u8],
    shown: &str,
    sections: &Path,
    (key, public): (&Path, &Path),
) {
    // A software TPM for `systemd-measure sign`'s trial session.
    let tpm = ingot_vm::swtpm::Swtpm::start_for_host(Path::new("swtpm"), &sections.join("tpm"))
        .expect("swtpm");
    let device = tpm.tcti().unwrap();
    let mut measure = Command::new("/lib/systemd/systemd-measure");
    measure
        .args(["sign", "--bank=sha256", "--json=short"])
        .args(["--phase=", "--phase=sysinit", "--phase=sysinit:ready"])
        .arg(format!("--tpm2-device={device}"))
        .arg(format!("--private-key={}", key.display()))
        .arg(format!("--public-key={}", public.display()))
        .args(section_args(uki, sections));
    let oracle: serde_json::Value = serde_json::from_str(&common::run_ok(&mut measure)).unwrap();
    let inside = ingot_artifact::uki::section(uki, ".pcrsig").unwrap();
    let ours: serde_json::Value = serde_json::from_slice(inside).unwrap();
    assert_eq!(ours, oracle);
    let pkey = ingot_artifact::uki::section(uki, ".pcrpkey").unwrap();
    assert!(
        pkey == fs::read(public).unwrap(),
        ".pcrpkey is not the key's public half"
    );
    let pkfp = oracle["sha256"][0]["pkfp"].as_str().unwrap();
    assert!(
        shown.contains(&format!(
            "pcr policy key {pkfp} signs PCR 11 in: {SHOWN_PHASES}"
        )),
        "{shown}"
    );
}

/// The release's UKI with its `.pcrpkey` replaced by another key's (objcopy; the signatures then
/// name a key the UKI does not carry) is refused by what `verify` and the writer run.
fn assert_a_foreign_pcr_key_is_refused(a: &Path, uki: &Path, dir: &Path) {
    let (_, other) = pcr_keypair(dir, "other-pcr");
    let evil = dir.join("evil-pcrpkey.efi");
    let mut objcopy = Command::new("objcopy");
    objcopy
        .arg(format!("--update-section=.pcrpkey={}", other.display()))
        .arg(uki)
        .arg(&evil);
    common::run_ok(&mut objcopy);
    let evil = fs::read(&evil).unwrap();
    let layout = LayoutSource::open(a).unwrap();
    let (digest, size) = layout_blob(a, &evil);
    let trust = Trust {
        key: None,
        allow_unsigned: true,
    };
    let (report, _) = verify_metadata(&layout, &trust).unwrap();
    let mut d = report.descriptor;
    let pinned = d.uki.as_mut().unwrap();
    (pinned.digest, pinned.size) = (digest, size);
    let e = read_uki(&layout, &d).unwrap_err();
    assert!(matches!(e, VerifyError::PcrPolicy(_)), "{e}");
    let chain = ingot_artifact::error_chain::text(&e);
    assert!(chain.contains("names key"), "{chain}");
    assert_eq!(e.exit_code(), 5);
}

/// A UKI whose .cmdline is not the layers' (here: one root hash changed), correctly pinned and
/// signed by the same db key, is refused by what `verify` and the writer run.
fn assert_a_foreign_cmdline_is_refused(
    a: &Path,
    want: &str,
    root: &str,
    base: &Path,
    keys: &Path,
    dir: &Path,
) {
    let changed = want.replace(root, &"0".repeat(64));
    let parts = ingot::uki::BootParts {
        stub: fs::read(STUB).unwrap(),
        kernel: fs::read(base.join("boot/vmlinuz")).unwrap(),
        initrd: fs::read(base.join("boot/initrd.img")).unwrap(),
        osrel: fs::read(base.join("etc/os-release")).unwrap(),
    };
    let key = ingot::uki::SecureBootKey {
        key: keys.join("db.key"),
        cert: keys.join("db.crt"),
    };
    let signer = ingot::uki::Signer {
        db: &key,
        pcr: None,
    };
    let evil = ingot::uki::make(
        &parts,
        &changed,
        "2023-11-14T22:13:20Z",
        &signer,
        &dir.join("evil"),
    )
    .unwrap();
    let layout = LayoutSource::open(a).unwrap();
    let evil_desc = layout_blob(a, &evil);
    let trust = Trust {
        key: None,
        allow_unsigned: true,
    };
    let (report, _) = verify_metadata(&layout, &trust).unwrap();
    let mut d = report.descriptor.clone();
    let pinned = d.uki.as_mut().unwrap();
    pinned.digest = evil_desc.0;
    pinned.size = evil_desc.1;
    let e = read_uki(&layout, &d).unwrap_err();
    assert!(matches!(e, VerifyError::Uki { .. }), "{e}");
    assert!(e.to_string().contains(".cmdline section"), "{e}");
    assert_eq!(e.exit_code(), 5);
    // The recorded command line must be the layers' too.
    let mut d = report.descriptor;
    d.uki.as_mut().unwrap().cmdline = changed;
    let e = read_uki(&layout, &d).unwrap_err();
    assert!(e.to_string().contains("the descriptor records"), "{e}");
}

/// `--name` goes into `openssl req -subj`: a name that would add or split attributes, or put a
/// control character or Latin-1 into every certificate, is refused before anything is written.
#[test]
fn a_key_set_name_that_is_not_one_common_name_is_refused() {
    let dir = tempfile::tempdir().unwrap();
    let long = "n".repeat(61);
    for (name, says) in [
        ("lab/CN=evil", "'/'"),
        ("lab/O=Example", "'/'"),
        ("a=b", "'='"),
        ("a+CN=b", "'+'"),
        ("a\\b", "'\\\\'"),
        ("lab\nforged", "'\\n'"),
        ("lab\u{1b}]0;title\u{7}", "'\\u{1b}'"),
        ("café", "'é'"),
        ("", "empty"),
        (" lab", "white space"),
        (long.as_str(), "61 bytes, more than the 60"),
    ] {
        let out = dir.path().join("keys");
        let r = ingot([
            "key".as_ref(),
            "secure-boot".as_ref(),
            "--out".as_ref(),
            out.as_os_str(),
            "--name".as_ref(),
            name.as_ref(),
        ]);
        let err = String::from_utf8_lossy(&r.stderr);
        assert_eq!(r.status.code(), Some(1), "{name:?}: {err}");
        assert!(
            err.contains("--name") && err.contains(says),
            "{name:?}: {err}"
        );
        assert!(!out.exists(), "{name:?}: {} was created", out.display());
    }
}

/// Makes a self-signed certificate for a new key `openssl req -newkey SPEC` makes, in `dir`.
fn openssl_key(dir: &Path, name: &str, spec: &[&str]) -> (PathBuf, PathBuf) {
    let (key, cert) = (
        dir.join(format!("{name}.key")),
        dir.join(format!("{name}.crt")),
    );
    common::run_ok(
        Command::new("openssl")
            .args(["req", "-new", "-x509", "-nodes", "-days", "1", "-subj"])
            .arg(format!("/CN={name}/"))
            .args(spec)
            .arg("-keyout")
            .arg(&key)
            .arg("-out")
            .arg(&cert),
    );
    (key, cert)
}

/// UEFI only requires firmware to accept RSA-2048 Authenticode: an EC or Ed25519 db key, a
/// short RSA key and a certificate of another key are refused before the build writes
/// anything (sbsign itself signs with the first two without a word); a larger RSA key is
/// accepted, with a warning.
#[test]
fn a_db_key_firmware_need_not_accept_is_refused_before_anything_is_written() {
    if !usable(ingot_testkit::test_name!()) {
        return;
    }
    let dir = tempfile::tempdir().unwrap();
    let (rsa, rsa_crt) = openssl_key(dir.path(), "rsa2048", &["-newkey", "rsa:2048"]);
    let (ec, ec_crt) = openssl_key(
        dir.path(),
        "ec",
        &["-newkey", "ec", "-pkeyopt", "ec_paramgen_curve:prime256v1"],
    );
    let (ed, ed_crt) = openssl_key(dir.path(), "ed", &["-newkey", "ed25519"]);
    let (small, small_crt) = openssl_key(dir.path(), "rsa1024", &["-newkey", "rsa:1024"]);
    let (big, big_crt) = openssl_key(dir.path(), "rsa3072", &["-newkey", "rsa:3072"]);

    assert_eq!(ingot::db_key::check(&rsa, &rsa_crt).unwrap().bits, 2048);
    let k = ingot::db_key::check(&big, &big_crt).unwrap();
    assert_eq!(k.bits, 3072);
    assert!(ingot::db_key::check(&rsa, &rsa_crt)
        .unwrap()
        .warning(&rsa)
        .is_none());
    assert!(k.warning(&big).unwrap().contains("RSA-3072"));

    let (sign, _) = keypair(dir.path(), "release");
    let manifest = stack(dir.path());
    let out = dir.path().join("out");
    for (key, cert, says) in [
        (&ec, &ec_crt, "is an EC key"),
        (&ed, &ed_crt, "is an Ed25519 key"),
        (&small, &small_crt, "is RSA-1024"),
        (&rsa, &ec_crt, "does not hold the public half"),
        (
            &rsa,
            &dir.path().join("missing.crt"),
            "reading the Secure Boot certificate",
        ),
    ] {
        let r = ingot([
            "build".as_ref(),
            manifest.as_os_str(),
            "--out".as_ref(),
            out.as_os_str(),
            "--quiet".as_ref(),
            "--sign-key".as_ref(),
            sign.as_os_str(),
            "--secure-boot-key".as_ref(),
            key.as_os_str(),
            "--secure-boot-cert".as_ref(),
            cert.as_os_str(),
        ]);
        let err = String::from_utf8_lossy(&r.stderr);
        assert!(!r.status.success(), "{}: built", key.display());
        assert!(err.contains(says), "{}: {err}", key.display());
        let left: Vec<_> = fs::read_dir(dir.path())
            .unwrap()
            .map(|e| e.unwrap().file_name().to_string_lossy().into_owned())
            .filter(|n| n.starts_with("out") || n.starts_with(".out"))
            .collect();
        assert!(left.is_empty(), "{}: left {left:?}", key.display());
    }
}
