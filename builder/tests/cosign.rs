//! cosign's key-based signatures against a real `docker-registry` on loopback and tools that
//! share none of ingot's code: openssl checks the ECDSA signatures ingot makes and makes some of
//! its own for ingot to check; Python's scrypt, PyNaCl and python3-cryptography read and write
//! the encrypted key file. skopeo's `sigstoreSigned` policy and `--sign-by-sigstore-private-key`
//! are run too, and asserted on where skopeo has sigstore: Debian 12's skopeo 1.9.3 is built
//! with it disabled ("Debian-local change: sigstore disabled"), so there the skopeo half is
//! reported and left out (a note on stderr), never counted as passed.

mod common;

use std::fs;
use std::path::{Path, PathBuf};
use std::process::{Command, Output};

use common::{build, demo_manifest, have_tool};
use ingot_artifact::cosign::payload;
use ingot_artifact::cosign::sig_manifest::{SigManifest, SIGNATURE_ANNOTATION};
use ingot_artifact::oci_layout::sha256_digest;
use ingot_testkit::command::describe as text;
use ingot_testkit::registry::Registry;

const PASSWORD: &str = "cosign-test-pw";

fn p(path: &Path) -> &str {
    path.to_str().unwrap()
}

/// `ingot ARGS` with COSIGN_PASSWORD set and no inherited credentials.
fn ingot(args: &[&str]) -> Output {
    Command::new(env!("CARGO_BIN_EXE_ingot"))
        .args(args)
        .env_remove("RUST_LOG")
        .env("COSIGN_PASSWORD", PASSWORD)
        .env("DOCKER_CONFIG", "/nonexistent-ingot-test")
        .output()
        .unwrap()
}

fn ok(o: Output) -> String {
    assert!(o.status.success(), "ingot failed:\n{}", text(&o));
    String::from_utf8_lossy(&o.stdout).trim().to_owned()
}

/// `ingot key generate --cosign` in `dir/NAME.key`, `dir/NAME.pub`.
fn cosign_keys(dir: &Path, name: &str) -> (PathBuf, PathBuf) {
    let (sk, pk) = (
        dir.join(format!("{name}.key")),
        dir.join(format!("{name}.pub")),
    );
    ok(ingot(&[
        "key",
        "generate",
        "--cosign",
        "-s",
        p(&sk),
        "-p",
        p(&pk),
    ]));
    (sk, pk)
}

/// skopeo's configuration: a registries.d turning sigstore attachments on for `host`, and a
/// policy.json requiring a sigstore signature by `public` for it (anything else accepted).
struct Skopeo {
    registries_d: PathBuf,
    policy: PathBuf,
}

impl Skopeo {
    fn new(dir: &Path, host: &str, public: &Path) -> Skopeo {
        let registries_d = dir.join("registries.d");
        fs::create_dir_all(&registries_d).unwrap();
        fs::write(
            registries_d.join("test.yaml"),
            format!("docker:\n  {host}:\n    use-sigstore-attachments: true\n"),
        )
        .unwrap();
        let policy = dir.join("policy.json");
        let v = serde_json::json!({
            "default": [{"type": "insecureAcceptAnything"}],
            "transports": {"docker": {host: [{
                "type": "sigstoreSigned",
                "keyPath": public,
                "signedIdentity": {"type": "matchRepository"},
            }]}},
        });
        fs::write(&policy, v.to_string()).unwrap();
        Skopeo {
            registries_d,
            policy,
        }
    }

    fn run(&self, args: &[&str]) -> Output {
        Command::new("skopeo")
            .arg("--policy")
            .arg(&self.policy)
            .arg("--registries.d")
            .arg(&self.registries_d)
            .args(args)
            .output()
            .unwrap()
    }

    /// `skopeo copy docker://SRC oci:DEST`.
    fn pull(&self, src: &str, dest: &Path) -> Output {
        let dest = format!("oci:{}:x", dest.display());
        self.run(&[
            "copy",
            "--src-tls-verify=false",
            &format!("docker://{src}"),
            &dest,
        ])
    }
}

/// The raw manifest `docker://REF` names (`skopeo inspect --raw`).
fn raw_manifest(reference: &str) -> Vec<u8> {
    let out = Command::new("skopeo")
        .args(["inspect", "--raw", "--tls-verify=false"])
        .arg(format!("docker://{reference}"))
        .output()
        .unwrap();
    assert!(out.status.success(), "{}", text(&out));
    out.stdout
}

/// Publishes a cosign signature manifest made of `blobs` (payloads and config) and `manifest`
/// under `target` (`oci://…:sha256-HEX.sig`), through a layout and `ingot publish`.
fn push_sig_manifest(dir: &Path, blobs: &[&[u8]], manifest: &[u8], target: &str) {
    let layout = dir.join(format!("sig-{}", &sha256_digest(manifest)[7..19]));
    let blob_dir = layout.join("blobs/sha256");
    fs::create_dir_all(&blob_dir).unwrap();
    for b in blobs.iter().chain([&manifest]) {
        fs::write(blob_dir.join(&sha256_digest(b)[7..]), b).unwrap();
    }
    fs::write(
        layout.join("oci-layout"),
        r#"{"imageLayoutVersion":"1.0.0"}"#,
    )
    .unwrap();
    let index = serde_json::json!({"schemaVersion": 2, "manifests": [{
        "mediaType": "application/vnd.oci.image.manifest.v1+json",
        "digest": sha256_digest(manifest), "size": manifest.len(),
    }]});
    fs::write(layout.join("index.json"), index.to_string()).unwrap();
    ok(ingot(&[
        "publish",
        p(&layout),
        target,
        "--allow-overwrite",
        "-q",
    ]));
}

fn stderr(o: &Output) -> String {
    String::from_utf8_lossy(&o.stderr).into_owned()
}

/// Whether skopeo answered that it cannot do sigstore at all (Debian's build); a note says so.
fn skopeo_lacks_sigstore(test: &str, o: &Output) -> bool {
    let lacks = stderr(o).contains("sigstore disabled");
    if lacks {
        eprintln!(
            "\n*** NOTE {test}: this skopeo has sigstore disabled ({}); its half is left out ***\n",
            stderr(o).trim()
        );
    }
    lacks
}

/// `openssl dgst -sha256 -verify PUB -signature SIG PAYLOAD` on a base64 signature.
fn openssl_verifies(dir: &Path, public: &Path, payload: &[u8], signature_b64: &str) -> bool {
    use base64::Engine;
    let der = base64::engine::general_purpose::STANDARD
        .decode(signature_b64)
        .unwrap();
    let (sig, data) = (dir.join("sig.der"), dir.join("payload"));
    fs::write(&sig, der).unwrap();
    fs::write(&data, payload).unwrap();
    let out = Command::new("openssl")
        .args([
            "dgst",
            "-sha256",
            "-verify",
            p(public),
            "-signature",
            p(&sig),
            p(&data),
        ])
        .output()
        .unwrap();
    out.status.success()
}

/// A cosign key pair generated in `dir` by ingot, which then refuses to overwrite it without
/// `--force`.
fn cosign_keys_not_overwritten(dir: &Path) -> (PathBuf, PathBuf) {
    let (sk, pk) = cosign_keys(dir, "cosign");
    let key_text = fs::read_to_string(&sk).unwrap();
    assert!(key_text.starts_with("-----BEGIN ENCRYPTED SIGSTORE PRIVATE KEY-----\n"));
    let again = ingot(&["key", "generate", "--cosign", "-s", p(&sk), "-p", p(&pk)]);
    assert!(!again.status.success() && stderr(&again).contains("--force"));
    assert_eq!(fs::read_to_string(&sk).unwrap(), key_text);
    (sk, pk)
}

/// The payload `good` changed, with its `signature` kept: the bytes and a signature manifest
/// holding them.
fn tampered_payload(good: &[u8], signature: &str) -> (Vec<u8>, SigManifest) {
    let tampered = String::from_utf8(good.to_vec())
        .unwrap()
        .replace("\"optional\":null", "\"optional\":{\"creator\":\"x\"}")
        .into_bytes();
    let mut bad = SigManifest { layers: vec![] };
    bad.add(&ingot_artifact::cosign::sig_manifest::SigLayer {
        digest: sha256_digest(&tampered),
        size: tampered.len() as u64,
        signature: signature.to_owned(),
    });
    (tampered, bad)
}

/// Another build of the demo stack (another revision) published over `target`; its digest.
fn publish_other_content(dir: &Path, target: &str) -> String {
    let other = dir.join("other");
    ok(ingot(&[
        "build",
        p(&demo_manifest()),
        "--out",
        p(&other),
        "--quiet",
        "--revision",
        "other",
    ]));
    ok(ingot(&[
        "publish",
        p(&other),
        target,
        "--allow-overwrite",
        "-q",
    ]))
}

/// (a) ingot signs; skopeo's sigstoreSigned policy accepts the stack, and refuses it after the
/// signature's payload is changed or the tag is moved to other content.
#[test]
fn skopeo_checks_what_ingot_signed() {
    let test = ingot_testkit::test_name!();
    if !have_tool(test, "docker-registry") || !have_tool(test, "skopeo") {
        return;
    }
    let tmp = tempfile::tempdir().unwrap();
    let dir = tmp.path();
    let (sk, pk) = cosign_keys_not_overwritten(dir);

    // Unsigned by minisign: the cosign signature is the only one.
    let layout = dir.join("demo");
    build(&demo_manifest(), &layout, None);
    let reg = Registry::start(&dir.join("reg"), None);
    let repo = format!("{}/stacks/demo", reg.host());
    let target = reg.url("stacks/demo:1.0.0");
    let digest = ok(ingot(&[
        "publish",
        p(&layout),
        &target,
        "-q",
        "--cosign-key",
        p(&sk),
    ]));
    let tag = format!("sha256-{}.sig", &digest[7..]);
    let skopeo = Skopeo::new(dir, &reg.host(), &pk);
    let copied = skopeo.pull(&format!("{repo}:1.0.0"), &dir.join("copy-ok"));
    let with_skopeo = !skopeo_lacks_sigstore(test, &copied);
    if with_skopeo {
        assert!(copied.status.success(), "skopeo refused: {}", text(&copied));
    }
    ok(ingot(&["verify", &target, "--trust-key", p(&pk)]));

    // Publishing again with the same key adds nothing (the same signature is there).
    let o = ingot(&["publish", p(&layout), &target, "--cosign-key", p(&sk)]);
    assert!(stderr(&o).contains("already there"), "{}", text(&o));

    // The signature manifest is cosign's, byte for byte what ingot rebuilds from its layers.
    let raw = raw_manifest(&format!("{repo}:{tag}"));
    let sigs = SigManifest::parse(&raw).unwrap();
    assert_eq!(sigs.manifest(&sigs.config()), raw);
    let good = payload::build(&repo, &digest);
    assert_eq!(sigs.layers.len(), 1);
    assert_eq!(sigs.layers[0].digest, sha256_digest(&good));
    let signature = sigs.signatures()[0].signature.clone();
    assert!(
        openssl_verifies(dir, &pk, &good, &signature),
        "openssl refused ingot's signature"
    );

    // The payload changed, its signature kept: skopeo and ingot refuse.
    let (tampered, bad) = tampered_payload(&good, &signature);
    let config = bad.config();
    push_sig_manifest(
        dir,
        &[&tampered, &config],
        &bad.manifest(&config),
        &reg.url(&format!("stacks/demo:{tag}")),
    );
    let refused = skopeo.pull(&format!("{repo}:1.0.0"), &dir.join("copy-tampered"));
    assert!(
        !refused.status.success(),
        "skopeo accepted a changed payload"
    );
    let o = ingot(&["verify", &target, "--trust-key", p(&pk)]);
    assert_eq!(o.status.code(), Some(3), "{}", text(&o));
    assert!(
        stderr(&o).contains("does not verify with the key"),
        "{}",
        text(&o)
    );

    // Signing again appends to the signature manifest there; one good signature is enough.
    let o = ingot(&["publish", p(&layout), &target, "--cosign-key", p(&sk)]);
    assert!(
        stderr(&o).contains("pushed (2 signature(s)"),
        "{}",
        text(&o)
    );
    let appended = SigManifest::parse(&raw_manifest(&format!("{repo}:{tag}"))).unwrap();
    assert_eq!(appended.layers[0].digest, sha256_digest(&tampered));
    assert_eq!(appended.layers[1], sigs.layers[0]);
    ok(ingot(&["verify", &target, "--trust-key", p(&pk)]));

    // Other content under the tag, and the old signature under the new digest's tag: refused.
    let moved = publish_other_content(dir, &target);
    assert_ne!(moved, digest);
    let unsigned = skopeo.pull(&format!("{repo}:1.0.0"), &dir.join("copy-unsigned"));
    assert!(
        !unsigned.status.success(),
        "skopeo accepted an unsigned manifest"
    );
    let moved_tag = format!("stacks/demo:sha256-{}.sig", &moved[7..]);
    push_sig_manifest(dir, &[&good, &sigs.config()], &raw, &reg.url(&moved_tag));
    let replayed = skopeo.pull(&format!("{repo}:1.0.0"), &dir.join("copy-replayed"));
    assert!(
        !replayed.status.success(),
        "skopeo accepted another manifest's signature"
    );
    let o = ingot(&["verify", &target, "--trust-key", p(&pk)]);
    assert!(
        stderr(&o).contains(&format!("it signs the manifest {digest}, not {moved}")),
        "{}",
        text(&o)
    );
}

/// The config blob of a signature manifest written here.
const SIG_CONFIG: &[u8] =
    br#"{"architecture":"","os":"","rootfs":{"type":"layers","diff_ids":[]},"config":{}}"#;

/// An openssl P-256 key in `dir` and its signature of the cosign payload for `repo@digest`:
/// (the public key's path, the payload, the signature manifest naming it).
fn openssl_signature(dir: &Path, repo: &str, digest: &str) -> (PathBuf, String, String) {
    let ec = dir.join("ec.pem");
    let ec_pub = dir.join("openssl.pub");
    common::run_ok(Command::new("openssl").args([
        "ecparam",
        "-name",
        "prime256v1",
        "-genkey",
        "-noout",
        "-out",
        p(&ec),
    ]));
    common::run_ok(Command::new("openssl").args([
        "pkey",
        "-in",
        p(&ec),
        "-pubout",
        "-out",
        p(&ec_pub),
    ]));
    let payload = format!(
        r#"{{"critical":{{"identity":{{"docker-reference":"{repo}"}},"image":{{"docker-manifest-digest":"{digest}"}},"type":"cosign container image signature"}},"optional":{{"creator":"openssl"}}}}"#
    );
    fs::write(dir.join("payload"), &payload).unwrap();
    common::run_ok(Command::new("openssl").args([
        "dgst",
        "-sha256",
        "-sign",
        p(&ec),
        "-out",
        p(&dir.join("sig.der")),
        p(&dir.join("payload")),
    ]));
    use base64::Engine;
    let sig =
        base64::engine::general_purpose::STANDARD.encode(fs::read(dir.join("sig.der")).unwrap());
    let manifest = serde_json::json!({
        "schemaVersion": 2,
        "mediaType": "application/vnd.oci.image.manifest.v1+json",
        "config": {"mediaType": "application/vnd.oci.image.config.v1+json",
                   "digest": sha256_digest(SIG_CONFIG), "size": SIG_CONFIG.len()},
        "layers": [{"mediaType": "application/vnd.dev.cosign.simplesigning.v1+json",
                    "digest": sha256_digest(payload.as_bytes()), "size": payload.len(),
                    "annotations": {SIGNATURE_ANNOTATION: sig}}],
    })
    .to_string();
    (ec_pub, payload, manifest)
}

/// A copy of `layout` at `copy` holding `blobs` (payload, config, signature manifest, the last
/// tagged `tag` in index.json); its reference to the stack.
fn layout_with_signature(layout: &Path, copy: &Path, blobs: &[&[u8]; 3], tag: &str) -> String {
    let manifest = blobs[2];
    common::cp_a(layout, copy);
    let dir = copy.join("blobs/sha256");
    for b in blobs {
        fs::write(dir.join(&sha256_digest(b)[7..]), b).unwrap();
    }
    let mut index: serde_json::Value =
        serde_json::from_slice(&fs::read(copy.join("index.json")).unwrap()).unwrap();
    let stack_tag = index["manifests"][0]["annotations"]["org.opencontainers.image.ref.name"]
        .as_str()
        .unwrap()
        .to_owned();
    index["manifests"]
        .as_array_mut()
        .unwrap()
        .push(serde_json::json!({
            "mediaType": "application/vnd.oci.image.manifest.v1+json",
            "digest": sha256_digest(manifest), "size": manifest.len(),
            "annotations": {"org.opencontainers.image.ref.name": tag},
        }));
    fs::write(copy.join("index.json"), index.to_string()).unwrap();
    format!("oci:{}:{stack_tag}", copy.display())
}

/// (b) A signature made by openssl, with openssl's key, in a manifest written here: ingot
/// verifies it with that key's PEM, refuses it with another cosign.pub (naming the key and the
/// tag), and names the tag it looked for when there is none. skopeo's
/// `--sign-by-sigstore-private-key` with ingot's key too, where skopeo has sigstore.
#[test]
fn ingot_checks_signatures_made_elsewhere() {
    let test = ingot_testkit::test_name!();
    if !have_tool(test, "docker-registry") || !have_tool(test, "skopeo") {
        return;
    }
    let tmp = tempfile::tempdir().unwrap();
    let dir = tmp.path();
    let (sk, pk) = cosign_keys(dir, "cosign");
    let layout = dir.join("demo");
    build(&demo_manifest(), &layout, None);
    let reg = Registry::start(&dir.join("reg"), None);
    let repo = format!("{}/stacks/signed", reg.host());
    let target = reg.url("stacks/signed:1");
    let digest = ok(ingot(&["publish", p(&layout), &target, "-q"]));
    let tag = format!("sha256-{}.sig", &digest[7..]);
    // Without a cosign signature the error names the tag looked for; a layout has none either.
    let o = ingot(&["verify", &target, "--trust-key", p(&pk)]);
    assert_eq!(o.status.code(), Some(3), "{}", text(&o));
    assert!(
        stderr(&o).contains(&format!("no manifest tagged `{tag}`")),
        "{}",
        text(&o)
    );
    let o = ingot(&["verify", p(&layout), "--trust-key", p(&pk)]);
    assert_eq!(o.status.code(), Some(3), "{}", text(&o));

    // openssl's key and signature, the payload and manifest spelt out here.
    let (ec_pub, payload, manifest) = openssl_signature(dir, &repo, &digest);
    let sig_target = reg.url(&format!("stacks/signed:{tag}"));
    push_sig_manifest(
        dir,
        &[payload.as_bytes(), SIG_CONFIG],
        manifest.as_bytes(),
        &sig_target,
    );
    let out = ok(ingot(&[
        "verify",
        &target,
        "--trust-key",
        p(&ec_pub),
        "--json",
    ]));
    let v: serde_json::Value = serde_json::from_str(&out).unwrap();
    assert_eq!(v["signature"]["status"], "verified", "{v}");

    // The same signature in a layout: index.json names the `.sig` manifest by its tag.
    let copy = dir.join("layout-signed");
    let blobs: [&[u8]; 3] = [payload.as_bytes(), SIG_CONFIG, manifest.as_bytes()];
    let in_layout = layout_with_signature(&layout, &copy, &blobs, &tag);
    ok(ingot(&["verify", &in_layout, "--trust-key", p(&ec_pub)]));

    let o = ingot(&["verify", &target, "--trust-key", p(&pk)]);
    assert_eq!(o.status.code(), Some(3), "{}", text(&o));
    let e = stderr(&o);
    assert!(
        e.contains(p(&pk)) && e.contains(&format!("`{tag}`")) && e.contains("does not verify"),
        "{e}"
    );

    // skopeo signs with ingot's key (appending to the signature manifest); ingot checks it.
    let skopeo = Skopeo::new(dir, &reg.host(), &pk);
    let pw = dir.join("pw");
    fs::write(&pw, format!("{PASSWORD}\n")).unwrap();
    let dest = format!("docker://{}/stacks/by-skopeo:1", reg.host());
    let signed = skopeo.run(&[
        "copy",
        "--dest-tls-verify=false",
        "--sign-by-sigstore-private-key",
        p(&sk),
        "--sign-passphrase-file",
        p(&pw),
        &format!("oci:{}", layout.display()),
        &dest,
    ]);
    if !skopeo_lacks_sigstore(test, &signed) {
        assert!(
            signed.status.success(),
            "skopeo could not sign with ingot's key: {}",
            text(&signed)
        );
        ok(ingot(&[
            "verify",
            &reg.url("stacks/by-skopeo:1"),
            "--trust-key",
            p(&pk),
        ]));
    }
}

/// The path of a Python with PyNaCl and python3-cryptography, or a skip.
fn python_with_nacl(test: &str) -> Option<&'static str> {
    let found = ["python3", "/usr/bin/python3"].into_iter().find(|py| {
        Command::new(py)
            .args(["-c", "import nacl.secret, cryptography"])
            .output()
            .is_ok_and(|o| o.status.success())
    });
    if found.is_none() {
        ingot_testkit::skip::skip(test, "no python3 with nacl (python3-nacl) and cryptography");
    }
    found
}

fn keyfile_py(py: &str, mode: &str, key: &Path, public: &Path, password: &str) -> Output {
    let script = Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/cosign/keyfile.py");
    Command::new(py)
        .arg(script)
        .args([mode, p(key), p(public)])
        .env("COSIGN_PASSWORD", password)
        .output()
        .unwrap()
}

/// (c) The encrypted key file against an implementation that shares nothing with ingot's:
/// Python decrypts ingot's keys (an empty password too, as cosign allows), and ingot signs with
/// a key Python wrote; a wrong password is named as such.
#[test]
fn key_files_match_an_independent_implementation() {
    let test = ingot_testkit::test_name!();
    let Some(py) = python_with_nacl(test) else {
        return;
    };
    if !have_tool(test, "docker-registry") {
        return;
    }
    let tmp = tempfile::tempdir().unwrap();
    let dir = tmp.path();
    let (sk, pk) = cosign_keys(dir, "cosign");
    let checked = keyfile_py(py, "check", &sk, &pk, PASSWORD);
    assert!(checked.status.success(), "{}", text(&checked));
    let wrong = keyfile_py(py, "check", &sk, &pk, "not-it");
    assert!(
        !wrong.status.success(),
        "Python decrypted with a wrong password"
    );
    let (esk, epk) = (dir.join("empty.key"), dir.join("empty.pub"));
    let o = Command::new(env!("CARGO_BIN_EXE_ingot"))
        .args(["key", "generate", "--cosign", "-s", p(&esk), "-p", p(&epk)])
        .env("COSIGN_PASSWORD", "")
        .output()
        .unwrap();
    assert!(o.status.success(), "{}", text(&o));
    let checked = keyfile_py(py, "check", &esk, &epk, "");
    assert!(checked.status.success(), "{}", text(&checked));

    let (psk, ppk) = (dir.join("python.key"), dir.join("python.pub"));
    let written = keyfile_py(py, "write", &psk, &ppk, PASSWORD);
    assert!(written.status.success(), "{}", text(&written));
    let layout = dir.join("demo");
    build(&demo_manifest(), &layout, None);
    let reg = Registry::start(&dir.join("reg"), None);
    let target = reg.url("stacks/demo:1");
    ok(ingot(&[
        "publish",
        p(&layout),
        &target,
        "-q",
        "--cosign-key",
        p(&psk),
    ]));
    ok(ingot(&["verify", &target, "--trust-key", p(&ppk)]));
    let pw = dir.join("wrong-pw");
    fs::write(&pw, "nope\n").unwrap();
    let o = ingot(&[
        "publish",
        p(&layout),
        &target,
        "--cosign-key",
        p(&psk),
        "--cosign-password-file",
        p(&pw),
    ]);
    assert!(!o.status.success());
    assert!(
        stderr(&o).contains(&format!("{}: decryption failed: wrong password", p(&psk))),
        "{}",
        text(&o)
    );
}
