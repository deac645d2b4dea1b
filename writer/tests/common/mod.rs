//! What the writer's test files share: a stack built from a manifest and signed with a fresh key.

#![allow(dead_code)] // not every test file uses every helper

use std::fs;
use std::io::{Read, Seek, SeekFrom, Write};
use std::path::{Path, PathBuf};

use ingot::build::{build, BuildOptions};
use ingot::manifest::Manifest;
use ingot_artifact::sign::SecretKey;

/// The registry fixtures: a real docker-registry and a token-checking front.
pub use ingot_testkit::registry as registry_support;

/// The repository's root.
pub fn repo_root() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("..")
}

/// A built, signed stack: an OCI image layout and the public key that verifies it.
pub struct Stack {
    pub dir: tempfile::TempDir,
    pub layout: PathBuf,
    pub public: PathBuf,
    /// Every layer of the stack and its root hash, in stacking order.
    pub layers: Vec<(String, String)>,
}

impl Stack {
    /// The stack in `layout` (signed with the key whose public half is `public`), its layers'
    /// names and root hashes from `descriptor`.
    fn new(
        dir: tempfile::TempDir,
        layout: PathBuf,
        public: PathBuf,
        descriptor: &ingot_layers::descriptor::StackDescriptor,
    ) -> Stack {
        let layers = descriptor
            .layers
            .iter()
            .map(|l| (l.name.clone(), l.verity.root_hash.to_string()))
            .collect();
        Stack {
            dir,
            layout,
            public,
            layers,
        }
    }
}

/// Builds `manifest` signed with a fresh key (4 MiB zstd frames, level 3).
pub fn build_stack(manifest: &Path) -> Stack {
    build_stack_framed(manifest, 4 << 20)
}

/// Builds `manifest` signed with a fresh key, in zstd frames of `frame_size` bytes (level 3).
pub fn build_stack_framed(manifest: &Path, frame_size: usize) -> Stack {
    build_stack_with(manifest, frame_size, None)
}

/// [`build_stack_framed`], with the release's signed UKI when `secure_boot` names a db key.
pub fn build_stack_with(
    manifest: &Path,
    frame_size: usize,
    secure_boot: Option<ingot::uki::SecureBootKey>,
) -> Stack {
    build_stack_keyed(manifest, frame_size, secure_boot, SecretKey::generate())
}

/// [`build_stack_with`], signed with `key` (two releases signed alike).
pub fn build_stack_keyed(
    manifest: &Path,
    frame_size: usize,
    secure_boot: Option<ingot::uki::SecureBootKey>,
    key: SecretKey,
) -> Stack {
    let dir = tempfile::tempdir().unwrap();
    let public = dir.path().join("ingot.pub");
    fs::write(&public, key.public_key().to_minisign()).unwrap();
    let layout = dir.path().join("layout");
    let m = Manifest::load(manifest).unwrap_or_else(|e| panic!("{e}"));
    // A Secure Boot release also carries a signed PCR policy (boot-contract.md, "Measured
    // boot"): boot_secure.rs checks the TPM's PCR 11 against it.
    let pcr_key = secure_boot.as_ref().map(|_| {
        let (_, pem) = ingot_artifact::pcr_policy::PcrKey::generate().unwrap();
        let path = dir.path().join("pcr.key");
        fs::write(&path, pem).unwrap();
        path
    });
    let built = build(
        &m,
        &BuildOptions {
            out: layout.clone(),
            sign_key: Some(key),
            frame_size,
            zstd_level: 3,
            revision: None,
            force: false,
            progress: false,
            events: ingot::events::Events::off(),
            secure_boot,
            pcr_key,
        },
    )
    .unwrap_or_else(|e| panic!("building {}: {e}", manifest.display()));
    Stack::new(dir, layout, public, &built.descriptor)
}

/// The demo stack (`manifests/demo.toml`).
pub fn demo() -> Stack {
    build_stack(&repo_root().join("manifests/demo.toml"))
}

/// A stack in a real docker-registry behind a front that demands CAPH's token (sent as
/// `Bearer base64(token)`). Dropping it stops both.
pub struct Published {
    pub registry: registry_support::Registry,
    pub front: registry_support::Front,
    /// `oci://127.0.0.1:PORT/REPO:TAG` through the front.
    pub url: String,
}

/// Publishes `layout` to a fresh registry as `repo_tag` (`stacks/demo:1.0.0`), straight to the
/// registry; the returned URL goes through the token-checking front.
pub fn publish_behind_token(layout: &Path, repo_tag: &str, token: &str, dir: &Path) -> Published {
    use base64::Engine;
    use ingot_artifact::registry::{push, Registry as Client, RegistryOptions, RegistryRef};
    use registry_support::{Front, FrontOptions, Registry};
    let registry = Registry::start(dir, None);
    let direct: RegistryRef = format!("oci://127.0.0.1:{}/{repo_tag}", registry.port)
        .parse()
        .unwrap();
    let client = Client::connect(&direct, RegistryOptions::default()).unwrap();
    push::publish(&client, layout, &direct, false).unwrap();
    let front = Front::start(
        registry.port,
        FrontOptions {
            bearer: Some(base64::engine::general_purpose::STANDARD.encode(token)),
            rate: None,
        },
    );
    let url = front.url(repo_tag);
    Published {
        registry,
        front,
        url,
    }
}

/// Flips every bit of one byte of the image, in place; flipping again restores it.
pub fn flip(image: &Path, offset: u64) {
    let mut f = fs::OpenOptions::new()
        .read(true)
        .write(true)
        .open(image)
        .unwrap();
    let mut b = [0u8; 1];
    f.seek(SeekFrom::Start(offset)).unwrap();
    f.read_exact(&mut b).unwrap();
    b[0] ^= 0xff;
    f.seek(SeekFrom::Start(offset)).unwrap();
    f.write_all(&b).unwrap();
    f.sync_all().unwrap();
}

/// Partitions as `sfdisk --json` reads them: (name, start byte, size bytes).
pub fn partitions(image: &Path) -> Vec<(String, u64, u64)> {
    ingot_testkit::partitions::read(image)
        .into_iter()
        .map(|p| (p.name, p.start, p.size))
        .collect()
}

/// `ingot-writer` invoked exactly as CAPH's imageURLCommand does (the token in the environment,
/// four positional arguments), against fixture machine `sysroot`, reporting to `output` and
/// `events`, with a short read test. Callers add their own flags.
#[allow(clippy::too_many_arguments)]
pub fn caph_command(
    url: &str,
    token: &str,
    bootstrap: &Path,
    machine_name: &str,
    devices: &str,
    sysroot: &Path,
    output: &Path,
    events: &Path,
    public: &Path,
) -> std::process::Command {
    let mut cmd = std::process::Command::new(env!("CARGO_BIN_EXE_ingot-writer"));
    cmd.env("OCI_REGISTRY_AUTH_TOKEN", token)
        .arg(url)
        .arg(bootstrap)
        .arg(machine_name)
        .arg(devices)
        .arg("--sysroot")
        .arg(sysroot)
        .arg("--output-json")
        .arg(output)
        .arg("--events")
        .arg(events)
        .arg("--trust-key")
        .arg(public)
        .args(["--read-test-seconds", "0.3"])
        .stdout(std::process::Stdio::piped())
        .stderr(std::process::Stdio::piped());
    cmd
}

/// Runs a [`caph_command`] for a disk a boot test will boot (no reboot, the serial console, a
/// panic that ends the VM) and asserts the run ended with `IMAGE_URL_DONE`.
pub fn caph_write_for_boot(mut cmd: std::process::Command, what: &str) {
    let out = cmd
        .arg("--no-reboot")
        .args(ingot_testkit::qemu::writer_kernel_args())
        .output()
        .unwrap();
    assert_caph_done(&out, what);
}

/// Asserts a CAPH-mode run succeeded and its last stdout line is `IMAGE_URL_DONE`.
pub fn assert_caph_done(out: &std::process::Output, what: &str) {
    let stdout = String::from_utf8_lossy(&out.stdout);
    assert!(
        out.status.success()
            && stdout
                .lines()
                .last()
                .unwrap_or("")
                .starts_with("IMAGE_URL_DONE"),
        "{what}: writer failed: {:?}\n{stdout}\n{}",
        out.status.code(),
        String::from_utf8_lossy(&out.stderr)
    );
}

pub mod boot;
pub mod secure_boot;
pub mod vm;

/// Waits (up to 120 s) until the writer `child` has written an event to `events` (its
/// `--events` file) with this `event` and `stage` (`None`: any stage), then sends it `signal`
/// (`TERM`, `KILL`) and returns its output.
pub fn signal_at(
    mut child: std::process::Child,
    events: &Path,
    signal: &str,
    event: &str,
    stage: Option<&str>,
) -> std::process::Output {
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(120);
    let wanted = |line: &str| {
        serde_json::from_str::<serde_json::Value>(line)
            .is_ok_and(|e| e["event"] == event && stage.is_none_or(|s| e["stage"] == s))
    };
    loop {
        let seen = fs::read_to_string(events).unwrap_or_default();
        if seen.lines().any(wanted) {
            break;
        }
        assert!(
            std::time::Instant::now() < deadline,
            "no {event} event in {stage:?}: {seen}"
        );
        assert!(
            child.try_wait().unwrap().is_none(),
            "the writer finished before the signal: {seen}"
        );
        std::thread::sleep(std::time::Duration::from_millis(5));
    }
    let kill = std::process::Command::new("kill")
        .args([format!("-{signal}"), child.id().to_string()])
        .status()
        .unwrap();
    assert!(kill.success());
    child.wait_with_output().unwrap()
}

/// A copy of `stack`'s layout with its descriptor changed by `edit` and signed again with a
/// fresh key (manifest and index re-pointed at it): a stack `ingot build` now refuses, as an
/// older builder or anyone holding a signing key could still publish.
pub fn resigned(
    stack: &Stack,
    edit: impl FnOnce(&mut ingot_layers::descriptor::StackDescriptor),
) -> Stack {
    use ingot_artifact::stack_format::{layer_blobs, SIGNATURE_ANNOTATION};
    use ingot_layers::descriptor::StackDescriptor;
    use sha2::Digest;
    let dir = tempfile::tempdir().unwrap();
    let layout = dir.path().join("layout");
    let copied = std::process::Command::new("cp")
        .arg("-a")
        .arg(&stack.layout)
        .arg(&layout)
        .status()
        .unwrap();
    assert!(copied.success());
    let blob = |digest: &str| {
        layout
            .join("blobs/sha256")
            .join(digest.strip_prefix("sha256:").unwrap())
    };
    let put = |bytes: &[u8]| -> String {
        let digest = format!("sha256:{}", hex::encode(sha2::Sha256::digest(bytes)));
        fs::write(blob(&digest), bytes).unwrap();
        digest
    };
    let index_path = layout.join("index.json");
    let mut index: serde_json::Value =
        serde_json::from_slice(&fs::read(&index_path).unwrap()).unwrap();
    let digest = index["manifests"][0]["digest"]
        .as_str()
        .unwrap()
        .to_string();
    let mut m: serde_json::Value =
        serde_json::from_slice(&fs::read(blob(&digest)).unwrap()).unwrap();
    let config = m["config"]["digest"].as_str().unwrap().to_string();
    let mut d: StackDescriptor = serde_json::from_slice(&fs::read(blob(&config)).unwrap()).unwrap();
    edit(&mut d);
    let bytes = d.to_canonical_json();
    m["config"]["digest"] = put(&bytes).into();
    m["config"]["size"] = bytes.len().into();
    m["layers"] = serde_json::to_value(layer_blobs(&d)).unwrap();
    let key = SecretKey::generate();
    m["annotations"][SIGNATURE_ANNOTATION] = key.sign(&bytes, "resigned by a test").into();
    let manifest_bytes = serde_json::to_vec(&m).unwrap();
    index["manifests"][0]["digest"] = put(&manifest_bytes).into();
    index["manifests"][0]["size"] = manifest_bytes.len().into();
    fs::write(&index_path, serde_json::to_vec(&index).unwrap()).unwrap();
    let public = dir.path().join("ingot.pub");
    fs::write(&public, key.public_key().to_minisign()).unwrap();
    Stack::new(dir, layout, public, &d)
}

/// `count` more layers, each the base layer's blobs under another name (always selected).
pub fn with_extra_layers(d: &mut ingot_layers::descriptor::StackDescriptor, count: usize) {
    let base = d.layers[0].clone();
    d.layers.truncate(1);
    for i in 0..count {
        let mut l = base.clone();
        l.name = format!("layer-{i:02}");
        l.kind = "extra".into();
        d.layers.push(l);
    }
}
