//! ingot-writer run exactly as cluster-api-provider-hetzner's imageURLCommand runs it:
//! `OCI_REGISTRY_AUTH_TOKEN=... ingot-writer IMAGE_URL BOOTSTRAP_DATA MACHINE_NAME 'ROOT_DEVICES'`,
//! against fixture machines (`tests/fixtures/machines/`, read through `--sysroot`), pulling from
//! a real `docker-registry` behind a front that demands the token. Checks the layers on disk, the
//! sealed node layer's files (mounted by the kernel), the last stdout line, output.json over
//! time, that no secret reaches any output, and that every gate and guard stops the run with
//! its reason and leaves every disk byte-identical.
//!
//! Needs root (loop devices, mount) and docker-registry; skipped with a message otherwise, except
//! in CI, where a missing piece fails the test.

mod common;

use std::collections::BTreeSet;
use std::fs;
use std::path::{Path, PathBuf};
use std::process::{Command, Output};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use ingot_testkit::machine::{materialize, Materialized};
use ingot_testkit::skip::{have_root, have_tool};

const TOKEN: &str = "ghp_ingotProvisionToken0123456789abcdef";

fn usable(test: &str) -> bool {
    have_root(test) && have_tool(test, "docker-registry")
}

use common::{partitions, repo_root};

/// The demo stack, signed, published to a registry that only answers with the token. Each test
/// makes its own, so that dropping it stops the registry.
struct Fixture {
    stack: common::Stack,
    published: common::Published,
}

fn published() -> Fixture {
    let stack = common::demo();
    let published = common::publish_behind_token(
        &stack.layout,
        "stacks/demo:1.0.0",
        TOKEN,
        &stack.dir.path().join("registry"),
    );
    Fixture { stack, published }
}

/// A fixture machine built in a temporary directory.
struct Machine {
    dir: tempfile::TempDir,
    m: Materialized,
}

fn machine(name: &str) -> Machine {
    let dir = tempfile::tempdir_in("/var/tmp").unwrap();
    let m = materialize(
        &repo_root().join("tests/fixtures/machines").join(name),
        &dir.path().join("machine"),
    )
    .unwrap_or_else(|e| panic!("materializing {name}: {e}"));
    Machine { dir, m }
}

fn bootstrap_fixture(name: &str) -> PathBuf {
    repo_root().join("bootstrap/tests/fixtures").join(name)
}

struct Run {
    out: Output,
    stdout: String,
    stderr: String,
    /// Every distinct `message` output.json held while the writer ran, in order.
    messages: Vec<String>,
    output_json: serde_json::Value,
    events: String,
}

/// Runs the writer as CAPH does, polling output.json while it runs.
fn caph(
    p: &Fixture,
    m: &Machine,
    bootstrap: &Path,
    machine_name: &str,
    devices: &str,
    extra: &[&str],
) -> Run {
    caph_env(p, m, bootstrap, machine_name, devices, extra, &[], false)
}

#[allow(clippy::too_many_arguments)]
fn caph_env(
    p: &Fixture,
    m: &Machine,
    bootstrap: &Path,
    machine_name: &str,
    devices: &str,
    extra: &[&str],
    env: &[(&str, &str)],
    reboot: bool,
) -> Run {
    let output = m.dir.path().join("output.json");
    let events = m.dir.path().join("events.jsonl");
    let _ = fs::remove_file(&output);
    let mut cmd = common::caph_command(
        &p.published.url,
        TOKEN,
        bootstrap,
        machine_name,
        devices,
        &m.m.root,
        &output,
        &events,
        &p.stack.public,
    );
    cmd.arg("-vv")
        .args(if reboot {
            &["--reboot"][..]
        } else {
            &["--no-reboot"][..]
        })
        .args(extra);
    for (k, v) in env {
        cmd.env(k, v);
    }
    let child = cmd.spawn().unwrap();
    let messages = Arc::new(Mutex::new(Vec::<String>::new()));
    let done = Arc::new(std::sync::atomic::AtomicBool::new(false));
    let poller = {
        let (messages, done, output) = (messages.clone(), done.clone(), output.clone());
        std::thread::spawn(move || loop {
            let finished = done.load(std::sync::atomic::Ordering::SeqCst);
            if let Ok(v) = fs::read(&output)
                .map_err(|_| ())
                .and_then(|b| serde_json::from_slice::<serde_json::Value>(&b).map_err(|_| ()))
            {
                let msg = v["message"].as_str().unwrap_or_default().to_string();
                let mut m = messages.lock().unwrap();
                if m.last() != Some(&msg) {
                    m.push(msg);
                }
            }
            if finished {
                break;
            }
            std::thread::sleep(Duration::from_millis(5));
        })
    };
    let out = child.wait_with_output().unwrap();
    done.store(true, std::sync::atomic::Ordering::SeqCst);
    poller.join().unwrap();
    let output_json = fs::read(&output)
        .ok()
        .and_then(|b| serde_json::from_slice(&b).ok())
        .unwrap_or(serde_json::Value::Null);
    let messages = messages.lock().unwrap().clone();
    Run {
        stdout: String::from_utf8_lossy(&out.stdout).into_owned(),
        stderr: String::from_utf8_lossy(&out.stderr).into_owned(),
        out,
        messages,
        output_json,
        events: fs::read_to_string(&events).unwrap_or_default(),
    }
}

impl Run {
    fn last_line(&self) -> &str {
        self.stdout.lines().last().unwrap_or_default()
    }

    fn all_output(&self) -> String {
        format!(
            "{}\n{}\n{}\n{}\n{}",
            self.stdout,
            self.stderr,
            self.output_json,
            self.events,
            self.messages.join("\n")
        )
    }

    fn show(&self) -> String {
        format!(
            "exit {:?}\n--- stdout\n{}\n--- stderr\n{}",
            self.out.status.code(),
            self.stdout,
            self.stderr
        )
    }
}

/// A read-only kernel mount of a byte range of an image; unmounted and detached on drop.
struct Mount {
    dir: ingot_testkit::loopdev::LoopMount,
}

impl Mount {
    fn new(image: &Path, offset: u64, size: u64) -> Mount {
        use ingot_testkit::loopdev::{LoopMount, LoopOptions};
        let options = LoopOptions::read_only_range(offset, size);
        Mount {
            dir: LoopMount::temp(image, &options, Some("ext4")),
        }
    }
}

fn stat(path: &Path) -> (u32, u32, u32) {
    use std::os::unix::fs::MetadataExt;
    let m = fs::symlink_metadata(path).unwrap_or_else(|e| panic!("{}: {e}", path.display()));
    (m.mode() & 0o7777, m.uid(), m.gid())
}

/// The sealed node layer passes veritysetup against the root hash the seal step reported.
fn assert_node_layer_verifies(run: &Run, work: &Path, image: &Path, parts: &[(String, u64, u64)]) {
    let cmdline_root = run
        .events
        .lines()
        .find_map(|l| {
            let msg = serde_json::from_str::<serde_json::Value>(l).ok()?["message"]
                .as_str()?
                .to_string();
            msg.split("root hash ")
                .nth(1)
                .filter(|_| msg.contains("sealed"))
                .map(str::to_string)
        })
        .expect("a sealed message with the root hash");
    let node = parts.iter().find(|p| p.0 == "ingot-node").unwrap();
    let node_hash = parts.iter().find(|p| p.0 == "ingot-node-verity").unwrap();
    let (data_img, hash_img) = (work.join("node.img"), work.join("node.hash"));
    let bytes = fs::read(image).unwrap();
    fs::write(
        &data_img,
        &bytes[node.1 as usize..(node.1 + node.2) as usize],
    )
    .unwrap();
    fs::write(
        &hash_img,
        &bytes[node_hash.1 as usize..(node_hash.1 + node_hash.2) as usize],
    )
    .unwrap();
    drop(bytes);
    let v = Command::new("veritysetup")
        .arg("verify")
        .arg(&data_img)
        .arg(&hash_img)
        .arg(&cmdline_root)
        .output()
        .unwrap();
    assert!(v.status.success(), "veritysetup verify: {v:?}");
}

/// Every file of the bootstrap data is in the mounted node layer, byte-exact, with its mode
/// (secrets tightened) and owner.
fn assert_staged_files(root: &Path, parsed: &ingot_bootstrap::Bootstrap) {
    let passwd =
        fs::read_to_string(repo_root().join("tests/fixtures/demo/base/etc/passwd")).unwrap();
    let uid_of = |name: &str| -> u32 {
        passwd
            .lines()
            .find(|l| l.split(':').next() == Some(name))
            .and_then(|l| l.split(':').nth(2))
            .and_then(|s| s.parse().ok())
            .unwrap_or_else(|| panic!("no user {name}"))
    };
    let mut checked = 0;
    for f in &parsed.files {
        // Appends merge with other files; jinja text gets the hostname substituted.
        if f.append || (f.jinja && f.content.windows(2).any(|w| w == b"{{")) {
            continue;
        }
        let rel = f.path.strip_prefix("/").unwrap();
        let on_disk = match rel.strip_prefix("run") {
            Ok(rest) => root.join("etc/ingot/run").join(rest),
            Err(_) => root.join(rel),
        };
        let got = fs::read(&on_disk).unwrap_or_else(|e| panic!("{}: {e}", on_disk.display()));
        assert!(got == f.content, "{} differs", f.path.display());
        let (mode, uid, _gid) = stat(&on_disk);
        let secret = ingot_bootstrap::secrets::is_secret(&f.path, &f.content);
        if secret {
            assert_eq!(
                mode & 0o077,
                0,
                "{}: secret mode {mode:o}",
                f.path.display()
            );
        } else {
            assert_eq!(mode, f.mode & 0o7777, "{}", f.path.display());
        }
        match &f.owner.user {
            Some(ingot_bootstrap::IdOrName::Name(n)) => {
                assert_eq!(uid, uid_of(n), "{}", f.path.display())
            }
            Some(ingot_bootstrap::IdOrName::Id(id)) => assert_eq!(uid, *id),
            None => assert_eq!(uid, 0, "{}", f.path.display()),
        }
        checked += 1;
    }
    assert!(checked > 0, "no files checked");
}

/// One successful CAPH run: layers, staged files, output.json, stdout, secrets.
fn provisions(
    fixture: &str,
    disk: &str,
    devices: &str,
    bootstrap: &str,
    want_layers: &[&str],
    role: &str,
) {
    provisions_with(fixture, disk, devices, bootstrap, &[], want_layers, role)
}

/// No TPM in these machines (and no PCR policy in the demo stack): `prefer`, the default,
/// writes the secrets in the clear and says so, in the status file and the summary. Returns the
/// ed25519 host key's entry.
fn assert_secrets_in_the_clear(status: &serde_json::Value) -> serde_json::Value {
    let secrets = &status["details"]["secrets"];
    assert_eq!(secrets["sealed"], false, "{secrets}");
    assert_eq!(secrets["policy"], "prefer", "{secrets}");
    assert_eq!(secrets["tpm"], serde_json::Value::Null, "{secrets}");
    assert_eq!(secrets["reason"], "no-tpm", "{secrets}");
    // Two SSH host keys and the kubeadm configuration at least.
    assert!(secrets["count"].as_u64().unwrap() >= 3, "{secrets}");
    let summary = status["message"].as_str().unwrap();
    assert!(summary.contains("secrets are in the clear"), "{summary}");
    let ed25519 = secrets["secrets"]
        .as_array()
        .unwrap()
        .iter()
        .find(|s| s["path"] == "/etc/ssh/ssh_host_ed25519_key")
        .unwrap_or_else(|| panic!("{secrets}"));
    assert!(ed25519["ssh_fingerprint"]
        .as_str()
        .unwrap()
        .starts_with("SHA256:"));
    ed25519.clone()
}

fn provisions_with(
    fixture: &str,
    disk: &str,
    devices: &str,
    bootstrap: &str,
    extra: &[&str],
    want_layers: &[&str],
    role: &str,
) {
    let m = machine(fixture);
    let data = bootstrap_fixture(bootstrap);
    let p = published();
    let run = caph(&p, &m, &data, "node-7", devices, extra);
    assert_eq!(run.out.status.code(), Some(0), "{}", run.show());
    assert!(
        run.last_line().contains("IMAGE_URL_DONE"),
        "last line: {}",
        run.show()
    );
    assert_eq!(
        run.stdout.matches("IMAGE_URL_DONE").count(),
        1,
        "{}",
        run.show()
    );
    assert_eq!(run.output_json["state"], "done", "{}", run.output_json);

    assert_stages_in_order(&run);

    // The layers this machine gets, the node layer, and nothing else.
    let image = &m.m.images[disk];
    let parts = partitions(image);
    let names: BTreeSet<&str> = parts.iter().map(|(n, _, _)| n.as_str()).collect();
    let mut want: BTreeSet<String> = ["ESP", "var", "ingot-node", "ingot-node-verity"]
        .iter()
        .map(|s| s.to_string())
        .collect();
    for l in want_layers {
        want.insert(format!("ingot-{l}"));
        want.insert(format!("ingot-{l}-verity"));
    }
    assert_eq!(
        names,
        want.iter().map(String::as_str).collect::<BTreeSet<_>>(),
        "{}",
        run.show()
    );
    let sgdisk = Command::new("sgdisk")
        .arg("-v")
        .arg(image)
        .output()
        .unwrap();
    assert!(
        String::from_utf8_lossy(&sgdisk.stdout).contains("No problems found"),
        "{sgdisk:?}"
    );

    // The sealed node layer passes veritysetup against the root hash on the command line.
    let status = &run.output_json;
    assert_eq!(status["details"]["selection"]["role"], role, "{status}");
    let ed25519 = assert_secrets_in_the_clear(status);
    assert_node_layer_verifies(&run, m.dir.path(), image, &parts);

    // Mount the node layer: every staged file byte-exact, with its mode and owner.
    let node = parts.iter().find(|p| p.0 == "ingot-node").unwrap();
    let mount = Mount::new(image, node.1, node.2);
    let root = mount.dir.path();
    let parsed = ingot_bootstrap::parse(&fs::read(&data).unwrap()).unwrap();
    assert_staged_files(root, &parsed);
    assert_eq!(
        fs::read_to_string(root.join("etc/hostname"))
            .unwrap()
            .trim(),
        "node-7"
    );
    // The fingerprint the writer reported is ssh-keygen's for the staged public key.
    let keygen = Command::new("ssh-keygen")
        .arg("-lf")
        .arg(root.join("etc/ssh/ssh_host_ed25519_key.pub"))
        .output()
        .unwrap();
    let keygen = String::from_utf8_lossy(&keygen.stdout);
    assert_eq!(
        keygen.split_whitespace().nth(1),
        ed25519["ssh_fingerprint"].as_str(),
        "{keygen}"
    );
    let (mode, uid, gid) = stat(&root.join("etc/ssh/ssh_host_ed25519_key"));
    assert_eq!((mode, uid, gid), (0o600, 0, 0));
    let host_key = fs::read_to_string(root.join("etc/ssh/ssh_host_ed25519_key")).unwrap();
    let machine_id = fs::read_to_string(root.join("etc/machine-id")).unwrap();
    assert_eq!(machine_id.trim().len(), 32);
    // The kubeadm command runs on first boot: runcmd through the script the base's
    // ingot-bootstrap.service runs, Ignition's own units as they came, byte-exact.
    if !parsed.commands.is_empty() {
        assert!(root.join("etc/ingot/bootstrap.sh").exists());
        assert!(!root
            .join("etc/systemd/system/ingot-bootstrap.service")
            .exists());
    }
    for u in &parsed.units {
        if let Some(contents) = &u.contents {
            let path = root.join("etc/systemd/system").join(&u.name);
            assert_eq!(fs::read_to_string(&path).unwrap(), *contents, "{}", u.name);
        }
    }
    assert!(
        !parsed.commands.is_empty() || parsed.units.iter().any(|u| u.contents.is_some()),
        "the fixture runs kubeadm somehow"
    );

    assert_no_secret_in_output(&run, &host_key, &parsed);
    let seen = p.published.front.auth_seen.lock().unwrap().clone();
    assert!(!seen.is_empty(), "the writer authenticated to the registry");
}

/// Every stage started, in order (the events file has them all), and output.json's message,
/// polled while the writer ran, changed with them.
fn assert_stages_in_order(run: &Run) {
    let stages: Vec<String> = run
        .events
        .lines()
        .filter_map(|l| serde_json::from_str::<serde_json::Value>(l).ok())
        .filter(|e| e["event"] == "start")
        .map(|e| e["stage"].as_str().unwrap().to_string())
        .fold(Vec::new(), |mut v, s| {
            if v.last() != Some(&s) {
                v.push(s);
            }
            v
        });
    let want_stages = [
        "check",
        "gate",
        "guard",
        "resolve",
        "verify",
        "gate",
        "stage",
        "seal",
        "gate",
        "plan",
        "wipe",
        "write",
        "esp",
        "partition-table",
    ];
    assert_eq!(stages, want_stages, "{}", run.events);
    // ... and output.json's message, polled while the writer ran, changed with them, each
    // message naming its stage, the last one the result.
    assert!(run.messages.len() >= 3, "{:#?}", run.messages);
    for m in &run.messages[..run.messages.len() - 1] {
        assert!(
            want_stages.iter().any(|s| m.starts_with(&format!("{s}: "))),
            "{m}"
        );
    }
    assert!(run.messages.last().unwrap().starts_with("wrote demo 1.0.0"));
}

/// Nothing secret in any output: the token, the host key, the data's private keys.
fn assert_no_secret_in_output(run: &Run, host_key: &str, parsed: &ingot_bootstrap::Bootstrap) {
    let all = run.all_output();
    assert!(!all.contains(TOKEN), "the token leaked");
    use base64::Engine;
    assert!(!all.contains(&base64::engine::general_purpose::STANDARD.encode(TOKEN)));
    let key_body: String = host_key.lines().nth(1).unwrap().to_string();
    assert!(!all.contains(&key_body), "the host key leaked");
    for f in &parsed.files {
        let text = String::from_utf8_lossy(&f.content);
        if text.contains("PRIVATE KEY-----") {
            let body = text.lines().nth(1).unwrap_or_default();
            assert!(
                !body.is_empty() && !all.contains(body),
                "{} leaked",
                f.path.display()
            );
        }
    }
}

#[test]
fn cpu_worker_from_cloud_config_by_wwn() {
    if !usable(ingot_testkit::test_name!()) {
        return;
    }
    provisions(
        "cpu-worker",
        "sda",
        "0x5002538e40a1b2c3",
        "cloud-config-worker-join.yaml",
        &["base"],
        "worker",
    );
}

#[test]
fn gpu_worker_from_ignition() {
    if !usable(ingot_testkit::test_name!()) {
        return;
    }
    provisions(
        "gpu-worker",
        "nvme0n1",
        "nvme0n1",
        "ignition-v2-worker-join.json",
        &["base", "nvidia"],
        "worker",
    );
}

#[test]
fn kvm_control_plane_from_cloud_config_init() {
    if !usable(ingot_testkit::test_name!()) {
        return;
    }
    provisions(
        "kvm-control-plane",
        "sda",
        "sda",
        "cloud-config-controlplane-init.yaml",
        &["base", "control-plane", "kata"],
        "control-plane",
    );
}

/// `--role` overrides the role the bootstrap data implies: worker join data, written as a
/// control plane, gets the control-plane layer.
#[test]
fn role_flag_overrides_the_bootstrap_data() {
    if !usable(ingot_testkit::test_name!()) {
        return;
    }
    provisions_with(
        "cpu-worker",
        "sda",
        "sda",
        "cloud-config-worker-join.yaml",
        &["--role", "control-plane"],
        &["base", "control-plane"],
        "control-plane",
    );
}

/// Each gate and guard: the run stops with its reason, says so on the last stdout line and in
/// output.json, and every disk of the machine is byte-identical afterwards.
#[test]
fn every_gate_and_guard_stops_before_touching_a_disk() {
    if !usable(ingot_testkit::test_name!()) {
        return;
    }
    let p = published();
    let worker = bootstrap_fixture("cloud-config-worker-join.yaml");
    let empty = tempfile::tempdir().unwrap();
    let no_path = [("PATH", empty.path().to_str().unwrap())];
    type Case<'a> = (
        &'a str,
        &'a str,
        Vec<&'a str>,
        &'a [(&'a str, &'a str)],
        &'a str,
    );
    let cases: Vec<Case> = vec![
        ("bios-only", "sda", vec![], &[], "not-uefi"),
        (
            "cpu-worker",
            "0x5000deadbeef0000",
            vec![],
            &[],
            "disk-not-found",
        ),
        (
            "cpu-worker",
            "sda",
            vec!["--min-read-speed", "1000000000000"],
            &[],
            "disk-too-slow",
        ),
        ("failing-disk", "sda", vec![], &[], "smart-failing"),
        ("foreign-os", "sda", vec![], &[], "foreign-os"),
        // Allowed, the foreign OS no longer stops it; the 64 MiB disk is then too small.
        (
            "foreign-os",
            "sda",
            vec!["--allow-foreign-os"],
            &[],
            "disk-too-small",
        ),
        // An orphan PV on the target no longer stops it (it would be cleared); the 64 MiB disk
        // is then too small.
        ("lvm-target", "sda", vec![], &[], "disk-too-small"),
        ("md-spanning", "sda", vec![], &[], "md-spans-disks"),
        // installimage's RAID1 over sda and sdb, only sda targeted.
        ("installimage-raid1", "sda", vec![], &[], "md-spans-disks"),
        // `tpm = require` on a machine without a TPM.
        (
            "cpu-worker",
            "sda",
            vec!["--tpm", "require"],
            &[],
            "tpm-missing",
        ),
        // With --reboot the writer needs sh and reboot: an empty PATH has neither.
        ("cpu-worker", "sda", vec![], &no_path, "tools-missing"),
    ];
    for (fixture, devices, extra, env, reason) in cases {
        let m = machine(fixture);
        let before = m.m.digests().unwrap();
        let args = extra.clone();
        // With --reboot the writer needs sh and reboot on PATH (it fails at the gate).
        let reboot = reason == "tools-missing";
        let run = caph_env(&p, &m, &worker, "node-1", devices, &args, env, reboot);
        let what = format!("{fixture} {devices} {args:?}");
        assert_stopped_untouched(&run, reason, &what);
        assert_eq!(m.m.digests().unwrap(), before, "{what}: a disk changed");
    }
}

/// The run failed with `reason` and said so (the last stdout line, with "no disk was changed";
/// output.json's state and message), never IMAGE_URL_DONE; `what` names the case.
fn assert_stopped_untouched(run: &Run, reason: &str, what: &str) {
    assert_eq!(run.out.status.code(), Some(1), "{what}: {}", run.show());
    assert!(
        run.last_line().contains(&format!("FAILED ({reason})")),
        "{what}: last line {:?}\n{}",
        run.last_line(),
        run.show()
    );
    assert!(!run.stdout.contains("IMAGE_URL_DONE"), "{what}");
    assert!(
        run.last_line().contains("no disk was changed"),
        "{what}: {}",
        run.show()
    );
    assert_eq!(run.output_json["state"], "failed", "{what}");
    assert!(
        run.output_json["message"]
            .as_str()
            .unwrap_or_default()
            .contains(reason),
        "{what}: {}",
        run.output_json
    );
}

/// `tpm = require` stops in `gate`, every disk unchanged, naming the TPM and the setting: on a
/// machine without a TPM (`tpm-missing`, before the stack is even fetched), and on one with a
/// TPM 2.0 when the stack has no signed PCR policy (the demo stack has no UKI:
/// `pcr-policy-missing`). The setting comes from the settings file as well as from `--tpm`.
#[test]
fn tpm_require_stops_in_gate_before_any_disk() {
    if !usable(ingot_testkit::test_name!()) {
        return;
    }
    let p = published();
    let worker = bootstrap_fixture("cloud-config-worker-join.yaml");
    for (tpm, reason, named) in [
        (None, "tpm-missing", "no usable TPM 2.0"),
        (Some("2"), "pcr-policy-missing", "signed UKI"),
    ] {
        let m = machine("cpu-worker");
        if let Some(v) = tpm {
            let dir = m.m.root.join("sys/class/tpm/tpm0");
            fs::create_dir_all(&dir).unwrap();
            fs::write(dir.join("tpm_version_major"), format!("{v}\n")).unwrap();
        }
        let before = m.m.digests().unwrap();
        // A fixture's TPM is reached only through a device named for it (never used here: the
        // run stops before sealing).
        let env = [("INGOT_TPM2_DEVICE", "swtpm:path=/nonexistent")];
        let run = caph_env(
            &p,
            &m,
            &worker,
            "node-1",
            "sda",
            &["--tpm", "require"],
            &env[..usize::from(tpm.is_some())],
            false,
        );
        assert_stopped_untouched(&run, reason, reason);
        let status = &run.output_json;
        assert_eq!(status["stage"], "gate", "{status}");
        let message = status["message"].as_str().unwrap_or_default();
        for want in [reason, "tpm = require", named] {
            assert!(message.contains(want), "{want}: {status}");
        }
        assert_eq!(m.m.digests().unwrap(), before, "{reason}: a disk changed");
        // Without a TPM the run stops before it reads a disk or fetches the stack.
        let resolved = run.events.contains(r#""stage":"resolve""#);
        let speed = run.events.contains("read speed test");
        assert_eq!(resolved, tpm.is_some(), "{reason}: {}", run.events);
        assert_eq!(speed, tpm.is_some(), "{reason}: {}", run.events);
    }
}

/// `--dry-run` as CAPH's command line would carry it: every step up to and including the plan
/// runs (check, gate, guard, resolve, verify, stage, seal, plan), the plan of every disk is
/// printed and recorded in output.json (state `dry-run`), the run exits 0, never says
/// IMAGE_URL_DONE, and every disk of the machine is byte-identical afterwards. On installimage's
/// RAID1 server the teardown is listed, not run. A dry run a real run would refuse fails alike.
#[test]
fn dry_run_plans_every_disk_and_writes_nothing() {
    if !usable(ingot_testkit::test_name!()) {
        return;
    }
    let p = published();
    let worker = bootstrap_fixture("cloud-config-worker-join.yaml");
    let two = "0x5002538e40a1b2c3 0x5002538e40a1b2c4";
    for (fixture, devices, disks) in [("cpu-worker", "sda", 1), ("installimage-raid1", two, 2)] {
        let m = machine(fixture);
        let before = m.m.digests().unwrap();
        let run = caph(&p, &m, &worker, "node-1", devices, &["--dry-run"]);
        let what = format!("{fixture} {devices}");
        assert_eq!(run.out.status.code(), Some(0), "{what}: {}", run.show());
        assert!(!run.stdout.contains("IMAGE_URL_DONE"), "{what}");
        assert!(
            run.last_line().starts_with("dry run: every check passed")
                && run.last_line().contains("nothing was written"),
            "{what}: {}",
            run.show()
        );
        for stage in [
            "check", "gate", "guard", "resolve", "verify", "stage", "seal", "plan",
        ] {
            assert!(
                run.events
                    .contains(&format!(r#""stage":"{stage}","event":"start""#)),
                "{what}: no {stage} stage in the events:\n{}",
                run.events
            );
        }
        for stage in ["wipe", "write", "esp", "partition-table"] {
            assert!(
                !run.events.contains(&format!(r#""stage":"{stage}""#)),
                "{what}: a dry run reached {stage}"
            );
        }
        let json = &run.output_json;
        assert_eq!(json["state"], "dry-run", "{what}: {json}");
        let plan = &json["details"]["plan"];
        assert_eq!(
            plan["disks"].as_array().map(Vec::len),
            Some(disks),
            "{json}"
        );
        for disk in plan["disks"].as_array().unwrap() {
            let labels: Vec<&str> = disk["partitions"]
                .as_array()
                .unwrap()
                .iter()
                .map(|p| p["label"].as_str().unwrap())
                .collect();
            assert_eq!(labels.first(), Some(&"ESP"), "{labels:?}");
            assert!(labels.contains(&"var"), "{labels:?}");
            // Every planned partition is printed.
            for l in &labels {
                assert!(
                    run.stdout.contains(&format!(" {l} ")),
                    "{l}: {}",
                    run.show()
                );
            }
        }
        assert_eq!(
            plan["layers"].as_array().unwrap().last().unwrap()["name"],
            "node",
            "{json}"
        );
        if disks == 2 {
            assert!(run
                .stdout
                .contains("would first run: mdadm --stop /dev/md127"));
            assert!(
                !run.stdout.contains("fixture machine, not run"),
                "{}",
                run.show()
            );
        }
        assert_eq!(m.m.digests().unwrap(), before, "{what}: a disk changed");
    }

    let m = machine("foreign-os");
    let before = m.m.digests().unwrap();
    let run = caph(&p, &m, &worker, "node-1", "sda", &["--dry-run"]);
    assert_eq!(run.out.status.code(), Some(1), "{}", run.show());
    assert!(
        run.last_line().contains("FAILED (foreign-os)"),
        "{}",
        run.show()
    );
    assert_eq!(run.output_json["state"], "failed");
    assert_eq!(m.m.digests().unwrap(), before);
}

/// Bad bootstrap data stops the run before any disk is touched, naming the file.
#[test]
fn bad_bootstrap_data_is_refused_before_the_disk() {
    if !usable(ingot_testkit::test_name!()) {
        return;
    }
    let m = machine("cpu-worker");
    let before = m.m.digests().unwrap();
    let bad = m.dir.path().join("bootstrap.data");
    fs::write(&bad, "#!/bin/sh\necho not cloud-config\n").unwrap();
    let p = published();
    let run = caph(&p, &m, &bad, "node-1", "sda", &[]);
    assert_eq!(run.out.status.code(), Some(1), "{}", run.show());
    assert!(
        run.last_line().contains("FAILED (bootstrap-invalid)")
            && run.last_line().contains("bootstrap.data"),
        "{}",
        run.show()
    );
    assert_eq!(m.m.digests().unwrap(), before);
}

/// Every partition of `image` as sfdisk reads it: (name, offset, size, partition UUID), and the
/// disk's GUID.
fn gpt(image: &Path) -> (Vec<(String, u64, u64, String)>, String) {
    let out = Command::new("sfdisk")
        .arg("--json")
        .arg(image)
        .output()
        .unwrap();
    assert!(out.status.success(), "{out:?}");
    let v: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
    let t = &v["partitiontable"];
    let parts = t["partitions"]
        .as_array()
        .unwrap()
        .iter()
        .map(|p| {
            (
                p["name"].as_str().unwrap_or_default().to_string(),
                p["start"].as_u64().unwrap() * 512,
                p["size"].as_u64().unwrap() * 512,
                p["uuid"].as_str().unwrap_or_default().to_ascii_lowercase(),
            )
        })
        .collect();
    (
        parts,
        t["id"].as_str().unwrap_or_default().to_ascii_lowercase(),
    )
}

fn sha256_range(image: &Path, offset: u64, size: u64) -> String {
    use sha2::Digest;
    use std::io::{Read, Seek};
    let mut f = fs::File::open(image).unwrap();
    f.seek(std::io::SeekFrom::Start(offset)).unwrap();
    let mut h = sha2::Sha256::new();
    let mut rest = size;
    let mut buf = vec![0u8; 1 << 20];
    while rest > 0 {
        let n = rest.min(buf.len() as u64) as usize;
        f.read_exact(&mut buf[..n]).unwrap();
        h.update(&buf[..n]);
        rest -= n as u64;
    }
    hex::encode(h.finalize())
}

/// `mdadm --examine` of a byte range of `image`, through a read-only loop device.
fn md_examine(image: &Path, offset: u64, size: u64) -> String {
    use ingot_testkit::loopdev::{LoopDevice, LoopOptions};
    let dev = LoopDevice::attach(image, &LoopOptions::read_only_range(offset, size));
    let ex = Command::new("mdadm")
        .arg("--examine")
        .arg(dev.path())
        .output();
    drop(dev);
    let ex = ex.unwrap();
    assert!(ex.status.success(), "mdadm --examine: {ex:?}");
    String::from_utf8_lossy(&ex.stdout).into_owned()
}

/// The ESP's loader entry `options` line.
fn esp_options(image: &Path, esp_offset: u64) -> String {
    let out = Command::new("mcopy")
        .env("MTOOLS_SKIP_CHECK", "1")
        .arg("-i")
        .arg(format!("{}@@{esp_offset}", image.display()))
        .args(["::loader/entries/ingot.conf", "-"])
        .output()
        .unwrap();
    assert!(out.status.success(), "mcopy: {out:?}");
    String::from_utf8_lossy(&out.stdout)
        .lines()
        .find_map(|l| l.strip_prefix("options ").map(str::to_string))
        .expect("an options line")
}

/// Both disks of one machine after a run: same layers, each bootable alone, var mirrored.
fn check_two_disks(m: &Machine) {
    let (a, b) = (&m.m.images["sda"], &m.m.images["sdb"]);
    let ((pa, guid_a), (pb, guid_b)) = (gpt(a), gpt(b));
    assert_ne!(guid_a, guid_b, "each disk has its own GUID");
    let names = |p: &[(String, u64, u64, String)]| -> Vec<String> {
        p.iter().map(|x| x.0.clone()).collect()
    };
    assert_eq!(names(&pa), names(&pb));
    let mut vars = Vec::new();
    for ((name, off_a, size_a, uuid_a), (_, off_b, size_b, uuid_b)) in pa.iter().zip(&pb) {
        assert_eq!((off_a, size_a), (off_b, size_b), "{name}");
        if name.starts_with("ingot-") {
            // The same layer on both disks, found by the same PARTUUID from its root hash.
            assert_eq!(uuid_a, uuid_b, "{name}");
            assert_eq!(
                sha256_range(a, *off_a, *size_a),
                sha256_range(b, *off_b, *size_b),
                "{name}"
            );
        } else {
            assert_ne!(uuid_a, uuid_b, "{name} has its own PARTUUID per disk");
        }
        if name == "var" {
            vars.push((*off_a, *size_a, uuid_a.clone(), uuid_b.clone()));
        }
    }
    for image in [a, b] {
        let sgdisk = Command::new("sgdisk")
            .arg("-v")
            .arg(image)
            .output()
            .unwrap();
        assert!(
            String::from_utf8_lossy(&sgdisk.stdout).contains("No problems found"),
            "{sgdisk:?}"
        );
    }
    // Each disk's ESP names every var member, in disk order.
    let (var_off, var_size, var_a, var_b) = vars.pop().expect("a var partition");
    let esp = pa.iter().find(|p| p.0 == "ESP").unwrap().1;
    let want = format!("ingot.var=PARTUUID={var_a},PARTUUID={var_b} ");
    for image in [a, b] {
        let options = esp_options(image, esp);
        assert!(options.contains(&want), "{options}\nwant {want}");
    }
    // var is an md RAID1 member on each disk, as mdadm reads it.
    let mut arrays = Vec::new();
    for (slot, image) in [a, b].iter().enumerate() {
        let text = md_examine(image, var_off, var_size);
        for want in [
            "Version : 1.2".to_string(),
            "Raid Level : raid1".into(),
            "Raid Devices : 2".into(),
            "Name : ingot:var".into(),
            format!("Device Role : Active device {slot}"),
        ] {
            assert!(text.contains(&want), "{want}:\n{text}");
        }
        assert!(
            text.lines()
                .any(|l| l.contains("Checksum") && l.ends_with("- correct")),
            "{text}"
        );
        let uuid = text
            .lines()
            .find_map(|l| l.trim().strip_prefix("Array UUID : "))
            .unwrap()
            .to_string();
        arrays.push(uuid);
    }
    assert_eq!(arrays[0], arrays[1], "one array");
}

/// An installimage server (software RAID1 over both disks, assembled by the rescue system),
/// CAPH naming both disks by WWN: the arrays are torn down (through the fixture machine's host),
/// both disks written and each bootable alone, `var` mirrored. A second
/// CAPH run over the finished node rewrites it.
#[test]
fn installimage_raid1_server_is_provisioned_on_both_disks() {
    if !usable(ingot_testkit::test_name!()) {
        return;
    }
    let m = machine("installimage-raid1");
    let data = bootstrap_fixture("cloud-config-worker-join.yaml");
    let p = published();
    let devices = "0x5002538e40a1b2c3 0x5002538e40a1b2c4";
    let run = caph(&p, &m, &data, "node-9", devices, &[]);
    assert_eq!(run.out.status.code(), Some(0), "{}", run.show());
    assert!(run.last_line().contains("IMAGE_URL_DONE"), "{}", run.show());
    assert_eq!(
        run.output_json["status"], "Succeeded",
        "{}",
        run.output_json
    );
    let warnings = run.output_json["warnings"].to_string();
    assert_eq!(
        warnings.matches("storage-torn-down").count(),
        3,
        "{warnings}"
    );
    // The teardown ran through the fixture machine's host, as on a real one through its own.
    let ran = fs::read_to_string(m.m.root.join("host/ran")).unwrap_or_default();
    for cmd in [
        "wipefs --all --force /dev/md126",
        "mdadm --stop /dev/md127",
        "wipefs --all --force /dev/sdb3",
    ] {
        assert!(ran.lines().any(|l| l == cmd), "{cmd} was not run:\n{ran}");
        let reported = format!(": {cmd}");
        assert!(
            run.stdout
                .lines()
                .any(|l| l.starts_with("[teardown] ") && l.ends_with(&reported)),
            "{cmd} is not reported under teardown:\n{}",
            run.show()
        );
    }
    assert_eq!(
        run.output_json["details"]["teardown"]
            .as_array()
            .map(Vec::len),
        Some(10),
        "{}",
        run.output_json
    );
    check_two_disks(&m);
    // Again over the finished node: recognised as ingot's, rewritten, still two good disks.
    let run = caph(&p, &m, &data, "node-9", "sda sdb", &[]);
    assert_eq!(run.out.status.code(), Some(0), "{}", run.show());
    let disks = run.output_json["details"]["guard"]["disks"]
        .as_array()
        .unwrap();
    assert!(disks.iter().all(|d| d["ingot"] == true), "{disks:?}");
    assert!(
        run.output_json["warnings"]
            .to_string()
            .contains("ingot:var"),
        "the old var mirror is torn down: {}",
        run.output_json
    );
    check_two_disks(&m);
}

/// The binary as CAPH runs it: copied to `<dir>/image-url-command`, its settings (the trusted
/// key, the deadline) in `image-url-command.toml` beside it, started with `nohup`, stdout to a
/// log. Only the fixture machine and the status file's place are flags (a real rescue system
/// needs neither); there is no `reboot` on PATH and none is needed.
#[test]
fn the_image_url_command_takes_its_settings_from_beside_it() {
    if !usable(ingot_testkit::test_name!()) {
        return;
    }
    let m = machine("cpu-worker");
    let data = bootstrap_fixture("cloud-config-worker-join.yaml");
    let p = published();
    let root = m.dir.path().join("root");
    fs::create_dir_all(&root).unwrap();
    let exe = root.join("image-url-command");
    ingot_testkit::command::copy_executable(env!("CARGO_BIN_EXE_ingot-writer").as_ref(), &exe);
    let key = fs::read_to_string(&p.stack.public).unwrap();
    fs::write(
        root.join("image-url-command.toml"),
        format!("trust_key = '''{key}'''\ndeadline = \"5m\"\nread_test_seconds = 0.3\n"),
    )
    .unwrap();
    let output = root.join("output.json");
    let log = root.join("image-url-command.log");
    let nohup = Command::new("sh")
        .arg("-c")
        .arg("nohup \"$@\" > \"$LOG\" 2>&1")
        .arg("sh")
        .arg(&exe)
        .arg(&p.published.url)
        .arg(&data)
        .arg("node-3")
        .arg("sda")
        .arg("--sysroot")
        .arg(&m.m.root)
        .arg("--output-json")
        .arg(&output)
        .env("LOG", &log)
        .env("OCI_REGISTRY_AUTH_TOKEN", TOKEN)
        .env("PATH", "/usr/sbin:/usr/bin:/sbin:/bin")
        .env_remove("INGOT_TRUST_KEY")
        .status()
        .unwrap();
    let log_text = fs::read_to_string(&log).unwrap();
    assert!(nohup.success(), "{log_text}");
    let last = log_text.lines().last().unwrap_or_default();
    assert!(last.contains("IMAGE_URL_DONE"), "{log_text}");
    assert!(!log_text.contains("rebooting"), "{log_text}");
    let status: serde_json::Value = serde_json::from_slice(&fs::read(&output).unwrap()).unwrap();
    assert_eq!(status["status"], "Succeeded", "{status}");
    let settings = &status["details"]["settings"];
    assert_eq!(settings["deadline_seconds"], 300, "{status}");
    assert_eq!(settings["reboot"], false, "{status}");
    assert!(
        settings["from"]
            .to_string()
            .contains("image-url-command.toml"),
        "{status}"
    );

    // A broken settings file is a usage error naming it, before any disk is read.
    fs::write(root.join("image-url-command.toml"), "deadline = 5\n").unwrap();
    let out = Command::new(&exe)
        .arg(&p.published.url)
        .arg(&data)
        .arg("node-3")
        .arg("sda")
        .arg("--sysroot")
        .arg(&m.m.root)
        .arg("--output-json")
        .arg(&output)
        .output()
        .unwrap();
    assert_eq!(out.status.code(), Some(2), "{out:?}");
    assert!(
        String::from_utf8_lossy(&out.stderr).contains("image-url-command.toml"),
        "{out:?}"
    );
}

/// A preloaded control-plane image that is not the one the bootstrap data's ClusterConfiguration
/// (kubernetesVersion v1.31.4, default imageRepository registry.k8s.io) makes kubeadm use is a
/// `stage` warning, in output.json and on stdout, naming the image kubeadm expects; the node is
/// still written.
#[test]
fn a_preload_kubeadm_would_not_use_is_a_stage_warning() {
    if !usable(ingot_testkit::test_name!()) {
        return;
    }
    // The demo stack with its preload renamed as an old-registry pause image.
    let dir = tempfile::tempdir().unwrap();
    let root = repo_root().canonicalize().unwrap();
    let demo = fs::read_to_string(root.join("manifests/demo.toml")).unwrap();
    let renamed = demo
        .replace(
            "reference = \"example.invalid/ingot/hello:1.0\"",
            "reference = \"k8s.gcr.io/pause:3.10\"",
        )
        .replace("\"../", &format!("\"{}/", root.display()));
    assert!(renamed.contains("k8s.gcr.io/pause:3.10"));
    let manifest = dir.path().join("demo.toml");
    fs::write(&manifest, renamed).unwrap();
    let stack = common::build_stack(&manifest);
    let published = common::publish_behind_token(
        &stack.layout,
        "stacks/demo:1.0.0",
        TOKEN,
        &stack.dir.path().join("registry"),
    );
    let p = Fixture { stack, published };
    let m = machine("kvm-control-plane");
    let data = bootstrap_fixture("cloud-config-controlplane-init.yaml");
    let run = caph(&p, &m, &data, "node-7", "sda", &[]);
    assert_eq!(run.out.status.code(), Some(0), "{}", run.show());
    let want = "preloaded image k8s.gcr.io/pause:3.10 does not match \
                /run/kubeadm/kubeadm.yaml's ClusterConfiguration (kubernetesVersion v1.31.4, \
                imageRepository registry.k8s.io): kubeadm expects registry.k8s.io/pause:3.10";
    let warnings: Vec<&str> = run.output_json["warnings"]
        .as_array()
        .unwrap()
        .iter()
        .filter_map(|w| w.as_str())
        .filter(|w| w.contains("preloaded image"))
        .collect();
    assert_eq!(warnings.len(), 1, "{}", run.output_json);
    assert!(warnings[0].contains(want), "{}", run.output_json);
    assert!(
        run.stdout
            .lines()
            .any(|l| l.starts_with("[stage] warning: preloaded image") && l.contains(want)),
        "{}",
        run.show()
    );
}

/// Staging reads the base layer's `/etc/passwd` and `/etc/group` from the registry frame by
/// frame (`Range` requests found through the descriptor's frame index), the `write` step
/// streams the blob, and a second disk copies it from the first: the base layer crosses the
/// network about once, never whole into a temporary file first. The base here is the demo's plus 6 MiB of incompressible data, in
/// 64 KiB frames (about a hundred of them).
#[test]
fn the_base_layer_crosses_the_network_once() {
    if !usable(ingot_testkit::test_name!()) {
        return;
    }
    let dir = tempfile::tempdir().unwrap();
    let root = repo_root().canonicalize().unwrap();
    let base = dir.path().join("base");
    let cp = Command::new("cp")
        .arg("-a")
        .arg(root.join("tests/fixtures/demo/base"))
        .arg(&base)
        .status()
        .unwrap();
    assert!(cp.success());
    let noise = ingot_testkit::noise::noise(1, 6 << 20);
    fs::create_dir_all(base.join("usr/share/noise")).unwrap();
    fs::write(base.join("usr/share/noise/data"), &noise).unwrap();
    let manifest = dir.path().join("stack.toml");
    fs::write(
        &manifest,
        format!(
            "name = \"demo\"\nversion = \"1.0.0\"\nsource_date_epoch = 1700000000\n\
             [boot]\nkernel = \"/boot/vmlinuz\"\ninitrd = \"/boot/initrd.img\"\n\
             efi = \"/boot/efi/EFI/BOOT/BOOTX64.EFI\"\n\
             [[layer]]\nname = \"base\"\nkind = \"base\"\nsource = {{ dir = \"{}\" }}\n",
            base.display()
        ),
    )
    .unwrap();
    let stack = common::build_stack_framed(&manifest, 64 << 10);
    let blobs: u64 = fs::read_dir(stack.layout.join("blobs/sha256"))
        .unwrap()
        .map(|e| e.unwrap().metadata().unwrap().len())
        .sum();
    let published = common::publish_behind_token(
        &stack.layout,
        "stacks/demo:1.0.0",
        TOKEN,
        &stack.dir.path().join("registry"),
    );
    let p = Fixture { stack, published };
    let data = bootstrap_fixture("cloud-config-worker-join.yaml");
    let traffic = &p.published.front.traffic;
    let bytes = || traffic.bytes.load(std::sync::atomic::Ordering::Relaxed);
    // One disk, then two (installimage's RAID1 pair): the second disk's layers are copied from
    // the first, not downloaded again.
    for (fixture, devices) in [
        ("cpu-worker", "sda"),
        (
            "installimage-raid1",
            "0x5002538e40a1b2c3 0x5002538e40a1b2c4",
        ),
    ] {
        let m = machine(fixture);
        let before = bytes();
        let run = caph(&p, &m, &data, "node-7", devices, &[]);
        assert_eq!(run.out.status.code(), Some(0), "{fixture}: {}", run.show());
        let served = bytes() - before;
        // Before the frame index the base blob came twice (staging, then the write), and once
        // more for each further disk: 2x, 3x.
        assert!(
            served < blobs + blobs / 4,
            "{fixture}: {served} bytes served for {blobs} bytes of blobs\n{}",
            run.show()
        );
        assert!(run.stderr.contains("fetching zstd frame"), "{}", run.show());
    }
    let ranged = traffic.ranged.load(std::sync::atomic::Ordering::Relaxed);
    assert!(ranged > 0, "no Range request");
}

/// A stack big enough to be caught mid-write: the demo's base, and a second layer (every UEFI
/// machine's) holding `bytes` of random (incompressible) data, which the writer streams from
/// the registry while it writes (the base it downloads before, to stage files from it).
fn bulky_stack(work: &Path, bytes: usize) -> common::Stack {
    let tree = work.join("bulky-tree");
    fs::create_dir_all(tree.join("opt")).unwrap();
    let data = ingot_testkit::noise::noise(2, bytes);
    fs::write(tree.join("opt/random.bin"), data).unwrap();
    let manifest = work.join("bulky.toml");
    fs::write(
        &manifest,
        format!(
            "name = \"bulky\"\nversion = \"1\"\nsource_date_epoch = 1700000000\n\n[boot]\n\
             kernel = \"/boot/vmlinuz\"\ninitrd = \"/boot/initrd.img\"\n\
             efi = \"/boot/efi/EFI/BOOT/BOOTX64.EFI\"\n\n[[layer]]\nname = \"base\"\n\
             kind = \"base\"\nsource = {{ dir = \"{}\" }}\n\n[[layer]]\nname = \"bulky\"\n\
             kind = \"bulky\"\nwhen = \"uefi\"\nsource = {{ dir = \"{}\" }}\n",
            repo_root().join("tests/fixtures/demo/base").display(),
            tree.display()
        ),
    )
    .unwrap();
    common::build_stack(&manifest)
}

/// Whether a disk image has a partition table: a protective MBR, a primary or backup GPT
/// header, or anything else `sfdisk` recognizes.
fn has_partition_table(image: &Path) -> bool {
    use std::os::unix::fs::FileExt;
    let f = fs::File::open(image).unwrap();
    let mut head = [0u8; 1024];
    f.read_exact_at(&mut head, 0).unwrap();
    let mut last = [0u8; 8];
    f.read_exact_at(&mut last, f.metadata().unwrap().len() - 512)
        .unwrap();
    head[510..512] == [0x55, 0xAA]
        || &head[512..520] == b"EFI PART"
        || &last == b"EFI PART"
        || Command::new("sfdisk")
            .arg("--dump")
            .arg(image)
            .output()
            .unwrap()
            .status
            .success()
}

/// SIGTERM while CAPH's command writes the layers (CAPH, or an operator, stopping it): the last
/// stdout line is CAPH's `FAILED (interrupted)` line saying the disk was left without a
/// partition table, never IMAGE_URL_DONE; output.json says failed; and the disk, which held a
/// previous install's table, has none.
#[test]
fn sigterm_mid_write_ends_caph_mode_with_its_failed_line() {
    // Also: SIGTERM before the write stops the run with the disk untouched.
    if !usable(ingot_testkit::test_name!()) {
        return;
    }
    use base64::Engine;
    let m = machine("cpu-worker");
    let image = m.m.images["sda"].clone();
    let data = bootstrap_fixture("cloud-config-worker-join.yaml");
    let stack = bulky_stack(m.dir.path(), 48 << 20);
    let published = common::publish_behind_token(
        &stack.layout,
        "stacks/bulky:1",
        TOKEN,
        &m.dir.path().join("registry"),
    );
    let output = m.dir.path().join("output.json");
    let events = m.dir.path().join("events.jsonl");
    let command = |url: &str| {
        let mut cmd = common::caph_command(
            url,
            TOKEN,
            &data,
            "node-9",
            "sda",
            &m.m.root,
            &output,
            &events,
            &stack.public,
        );
        cmd.args(["--no-reboot", "--esp-size", "64"]);
        cmd
    };

    // A previous install: the interrupted run must not leave its table either.
    let out = command(&published.url).output().unwrap();
    assert!(
        out.status.success(),
        "first install: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    assert!(has_partition_table(&image));

    // SIGTERM while the machine is still being checked (the gate's read test takes seconds):
    // the run stops before the teardown, every byte of the disk as it was.
    let before = sha256_range(&image, 0, fs::metadata(&image).unwrap().len());
    let _ = fs::remove_file(&events);
    let child = command(&published.url).spawn().unwrap();
    let out = common::signal_at(child, &events, "TERM", "start", Some("gate"));
    let stdout = String::from_utf8_lossy(&out.stdout);
    let show = format!("{stdout}\n{}", String::from_utf8_lossy(&out.stderr));
    assert_eq!(out.status.code(), Some(1), "{show}");
    let last = stdout.lines().last().unwrap_or_default();
    assert!(
        last.starts_with("ingot-writer: FAILED (interrupted): ")
            && last.ends_with("; no disk was changed"),
        "last line {last:?}\n{show}"
    );
    assert_eq!(
        sha256_range(&image, 0, fs::metadata(&image).unwrap().len()),
        before,
        "the disk changed: {show}"
    );

    // Blobs at 8 MB/s, so the 48 MiB layer takes seconds to write.
    let slow = ingot_testkit::registry::Front::start(
        published.registry.port,
        ingot_testkit::registry::FrontOptions {
            bearer: Some(base64::engine::general_purpose::STANDARD.encode(TOKEN)),
            rate: Some(8_000_000),
        },
    );
    let _ = fs::remove_file(&events);
    let child = command(&slow.url("stacks/bulky:1")).spawn().unwrap();
    let out = common::signal_at(child, &events, "TERM", "progress", Some("write"));
    let stdout = String::from_utf8_lossy(&out.stdout);
    let show = format!("{stdout}\n{}", String::from_utf8_lossy(&out.stderr));
    assert_eq!(out.status.code(), Some(1), "{show}");
    let last = stdout.lines().last().unwrap_or_default();
    assert!(
        last.starts_with("ingot-writer: FAILED (interrupted): ")
            && last.ends_with("; the target disk was left without a partition table"),
        "last line {last:?}\n{show}"
    );
    assert!(!stdout.contains("IMAGE_URL_DONE"), "{show}");
    let status: serde_json::Value = serde_json::from_slice(&fs::read(&output).unwrap()).unwrap();
    eprintln!(
        "last line: {last}\noutput.json message: {}",
        status["message"]
    );
    assert_eq!(status["state"], "failed", "{status}");
    assert!(
        status["message"]
            .as_str()
            .unwrap_or_default()
            .contains("interrupted by a signal while writing"),
        "{status}"
    );
    assert!(
        !has_partition_table(&image),
        "an interrupted write leaves no partition table"
    );
}

/// The second of two disks cannot be written (an immutable image file, refused when its plan
/// opens it, after the first disk is written): the run fails, and the first disk, complete and
/// bootable a moment before, is left without a partition table too.
#[test]
fn a_failure_on_the_second_disk_leaves_neither_disk_bootable() {
    if !usable(ingot_testkit::test_name!()) || !have_tool(ingot_testkit::test_name!(), "chattr") {
        return;
    }
    /// Clears the immutable flag again, so the temporary directory can go.
    struct Immutable(PathBuf);
    impl Drop for Immutable {
        fn drop(&mut self) {
            let _ = Command::new("chattr").arg("-i").arg(&self.0).status();
        }
    }
    let m = machine("installimage-raid1");
    let data = bootstrap_fixture("cloud-config-worker-join.yaml");
    let p = published();
    let (sda, sdb) = (m.m.images["sda"].clone(), m.m.images["sdb"].clone());
    let ok = Command::new("chattr").arg("+i").arg(&sdb).status().unwrap();
    assert!(ok.success(), "chattr +i {}", sdb.display());
    let _undo = Immutable(sdb.clone());
    let run = caph(
        &p,
        &m,
        &data,
        "node-9",
        "0x5002538e40a1b2c3 0x5002538e40a1b2c4",
        &[],
    );
    assert_eq!(run.out.status.code(), Some(1), "{}", run.show());
    assert!(
        run.last_line()
            .contains("the target disk was left without a partition table"),
        "{}",
        run.show()
    );
    // The first disk got as far as its partition table before the second was refused.
    assert!(
        run.stdout
            .contains("[partition-table] writing the partition table"),
        "{}",
        run.show()
    );
    assert!(
        !has_partition_table(&sda),
        "the first disk keeps its table: {}",
        run.show()
    );
}

/// The teardown is the first step that changes a disk: when one of its commands fails (here
/// the first `mdadm --stop`, failed by the fixture machine's host), the run fails in `teardown` with
/// `teardown-failed`, and the disks it began to change are left without a partition table.
/// The last line and output.json say so, from the run's own record of what it changed.
#[test]
fn a_failed_teardown_leaves_the_disks_without_a_partition_table_and_says_so() {
    if !usable(ingot_testkit::test_name!()) {
        return;
    }
    let m = machine("installimage-raid1");
    let data = bootstrap_fixture("cloud-config-worker-join.yaml");
    let p = published();
    let (sda, sdb) = (m.m.images["sda"].clone(), m.m.images["sdb"].clone());
    assert!(has_partition_table(&sda) && has_partition_table(&sdb));
    let fail = m.m.root.join("host/fail");
    fs::create_dir_all(&fail).unwrap();
    fs::write(
        fail.join("mdadm"),
        "mdadm: Cannot get exclusive access to /dev/md126",
    )
    .unwrap();
    let run = caph(
        &p,
        &m,
        &data,
        "node-9",
        "0x5002538e40a1b2c3 0x5002538e40a1b2c4",
        &[],
    );
    assert_eq!(run.out.status.code(), Some(1), "{}", run.show());
    let last = run.last_line();
    assert!(
        last.starts_with("ingot-writer: FAILED (teardown-failed): ")
            && last.contains("mdadm --stop /dev/md126")
            && last.contains("Cannot get exclusive access")
            && last.ends_with("; the target disk was left without a partition table"),
        "{}",
        run.show()
    );
    let status = &run.output_json;
    assert_eq!(status["status"], "Failed", "{status}");
    assert_eq!(status["stage"], "teardown", "{status}");
    assert_eq!(status["disks"], "cleared", "{status}");
    assert!(!has_partition_table(&sda), "sda keeps its table");
    assert!(!has_partition_table(&sdb), "sdb keeps its table");
}

/// The demo stack with 70 layers, with 40, and with a missing kernel, each published.
fn stacks_past_a_limit(demo: &Fixture) -> (Fixture, Fixture, Fixture) {
    let publish = |stack: common::Stack| {
        let published = common::publish_behind_token(
            &stack.layout,
            "stacks/demo:1.0.0",
            TOKEN,
            &stack.dir.path().join("registry"),
        );
        Fixture { stack, published }
    };
    let seventy = publish(common::resigned(&demo.stack, |d| {
        common::with_extra_layers(d, 69)
    }));
    let forty = publish(common::resigned(&demo.stack, |d| {
        common::with_extra_layers(d, 39)
    }));
    let no_kernel = publish(common::resigned(&demo.stack, |d| {
        d.boot.kernel = "/boot/vmlinuz-missing".into()
    }));
    (seventy, forty, no_kernel)
}

/// sda1 as sysfs shows a partition: a directory of its disk's, linked from /sys/class/block.
fn sda1_as_a_partition(root: &Path) {
    let part = root.join("sys/block/sda/sda1");
    fs::create_dir_all(&part).unwrap();
    fs::write(part.join("partition"), "1\n").unwrap();
    fs::create_dir_all(root.join("sys/class/block")).unwrap();
    std::os::unix::fs::symlink("../../block/sda/sda1", root.join("sys/class/block/sda1")).unwrap();
}

/// sdb with the WWN of sda.
fn sdb_with_sdas_wwn(root: &Path) {
    fs::write(
        root.join("sys/block/sdb/device/wwid"),
        "naa.5002538e40a1b2c3\n",
    )
    .unwrap();
}

/// Issue "hostile input, second pass", items 14, 15 and 16 as CAPH runs the writer: a target
/// spec naming a partition, naming a disk twice, or a WWN two disks share; a stack of 70
/// layers (144 GPT entries), of 40 (a kernel command line past 2047 bytes) and one whose
/// kernel is missing. Each fails with its reason before any disk changes.
#[test]
fn targets_and_stacks_past_a_limit_fail_before_any_disk_changes() {
    if !usable(ingot_testkit::test_name!()) {
        return;
    }
    let worker = bootstrap_fixture("cloud-config-worker-join.yaml");
    let demo = published();
    let (seventy, forty, no_kernel) = stacks_past_a_limit(&demo);
    // What a test does to the materialized machine first.
    type Edit = fn(&Path);
    let none: Edit = |_| {};
    let partition: Edit = sda1_as_a_partition;
    let same_wwn: Edit = sdb_with_sdas_wwn;
    let cases: Vec<(&str, &str, Edit, &Fixture, &str, &str)> = vec![
        (
            "cpu-worker",
            "sda1",
            partition,
            &demo,
            "bad-target",
            "a partition of disk sda",
        ),
        (
            "two-disk",
            "sda sdb sda",
            none,
            &demo,
            "bad-target",
            "\"sda\" already named",
        ),
        (
            "two-disk",
            "0x5002538e40a1b2c3",
            same_wwn,
            &demo,
            "bad-target",
            "matches 2 disks",
        ),
        (
            "cpu-worker",
            "sda",
            none,
            &seventy,
            "cannot-boot",
            "128 entries of a GPT",
        ),
        (
            "cpu-worker",
            "sda",
            none,
            &forty,
            "cannot-boot",
            "more than the 2047",
        ),
        (
            "cpu-worker",
            "sda",
            none,
            &no_kernel,
            "cannot-boot",
            "/boot/vmlinuz-missing",
        ),
    ];
    for (fixture, devices, edit, stack, reason, want) in cases {
        let m = machine(fixture);
        edit(&m.m.root);
        let before = m.m.digests().unwrap();
        let run = caph(stack, &m, &worker, "node-1", devices, &[]);
        let what = format!("{fixture} {devices:?} {want}");
        assert_eq!(run.out.status.code(), Some(1), "{what}: {}", run.show());
        let last = run.last_line();
        assert!(
            last.contains(&format!("FAILED ({reason})")),
            "{what}: {last}"
        );
        assert!(last.contains(want), "{what}: {last}");
        assert!(last.contains("no disk was changed"), "{what}: {last}");
        assert_eq!(m.m.digests().unwrap(), before, "{what}: a disk changed");
    }
}

/// Boot contract v3's allow-list for the per-node layer: CAPH-shaped data (the worker-join
/// fixture) with one hostile addition each, a `write_files` entry at /usr/bin/kubelet (it would
/// shadow the release's kubelet for the machine's life) and a user whose home is /usr or / (the
/// sealed layer would make that directory the user's, mode 0700), is refused in the stage step:
/// `FAILED (bootstrap-invalid)` naming the path and where in the data it came from, and both
/// disks of the two-disk machine are byte for byte as before.
#[test]
fn node_layer_paths_outside_the_allow_list_are_refused_before_the_disk() {
    if !usable(ingot_testkit::test_name!()) {
        return;
    }
    let good = fs::read_to_string(bootstrap_fixture("cloud-config-worker-join.yaml")).unwrap();
    assert!(good.contains("\nwrite_files:\n"), "{good}");
    let kubelet = good.replacen(
        "\nwrite_files:\n",
        "\nwrite_files:\n-   path: /usr/bin/kubelet\n    permissions: '0755'\n    content: |\n      #!/bin/sh\n      echo not the release's kubelet\n",
        1,
    );
    assert!(good.contains("\nusers:\n  - name: capi\n"), "{good}");
    let home = |dir: &str| {
        good.replacen(
            "\nusers:\n",
            &format!("\nusers:\n  - name: intruder\n    homedir: {dir}\n"),
            1,
        )
    };
    let p = published();
    let cases = [
        (kubelet, "write_files: /usr/bin/kubelet: "),
        (home("/usr"), "users \"intruder\" homedir: /usr: "),
        (home("/"), "users \"intruder\" homedir: /: "),
    ];
    for (data, why) in cases {
        let m = machine("two-disk");
        let before = m.m.digests().unwrap();
        assert_eq!(before.len(), 2, "two disks: {before:?}");
        let file = m.dir.path().join("bootstrap.data");
        fs::write(&file, data).unwrap();
        let devices = "0x5002538e40a1b2c3 0x5002538e40a1b2c4";
        let run = caph(&p, &m, &file, "node-1", devices, &[]);
        assert_eq!(run.out.status.code(), Some(1), "{why}: {}", run.show());
        assert!(
            run.last_line().contains("FAILED (bootstrap-invalid)"),
            "{why}: {}",
            run.show()
        );
        assert!(
            run.stdout.contains(why) || run.stderr.contains(why),
            "{why}: {}",
            run.show()
        );
        assert_eq!(m.m.digests().unwrap(), before, "{why}: a disk changed");
    }
}

/// The demo stack as a Secure Boot release with a signed PCR policy (`ingot build
/// --secure-boot-key --pcr-key`): the demo base with systemd's stub, every path absolute.
fn pcr_policy_stack(dir: &Path) -> common::Stack {
    let stub = "/usr/lib/systemd/boot/efi/linuxx64.efi.stub";
    let base = dir.join("base");
    let cp = Command::new("cp")
        .arg("-a")
        .arg(repo_root().join("tests/fixtures/demo/base"))
        .arg(&base)
        .status()
        .unwrap();
    assert!(cp.success());
    let in_base = base.join(&stub[1..]);
    fs::create_dir_all(in_base.parent().unwrap()).unwrap();
    fs::copy(stub, &in_base).unwrap();
    let manifests = repo_root().join("manifests");
    let text = fs::read_to_string(manifests.join("demo.toml"))
        .unwrap()
        .replace("\"../tests/fixtures/demo/base\"", &format!("{:?}", base))
        .replace("\"../", &format!("\"{}/../", manifests.display()));
    let manifest = dir.join("sealdemo.toml");
    fs::write(&manifest, text).unwrap();
    let key = common::secure_boot::key_set(dir, "seal");
    common::build_stack_with(&manifest, 4 << 20, Some(key))
}

/// Extends `device`'s PCR 11 as systemd-stub does when it boots `uki` (each measured section's
/// name with a NUL, then its bytes), flushing swtpm's contexts after each tool.
fn measure_uki(device: &str, uki: &[u8]) {
    use sha2::{Digest, Sha256};
    for name in ingot_artifact::uki::MEASURED {
        let Ok(bytes) = ingot_artifact::uki::section(uki, name) else {
            continue;
        };
        for data in [format!("{name}\0").into_bytes(), bytes.to_vec()] {
            let digest = hex::encode(Sha256::digest(&data));
            let out = Command::new("tpm2_pcrextend")
                .arg(format!("11:sha256={digest}"))
                .env("TPM2TOOLS_TCTI", device)
                .output()
                .unwrap();
            assert!(out.status.success(), "{out:?}");
            for what in ["-t", "-l", "-s"] {
                Command::new("tpm2_flushcontext")
                    .arg(what)
                    .env("TPM2TOOLS_TCTI", device)
                    .output()
                    .unwrap();
            }
        }
    }
}

fn holds(haystack: &[u8], needle: &[u8]) -> bool {
    haystack.windows(needle.len()).any(|w| w == needle)
}

/// Seconds from the first event whose message starts with `from` to the first starting with
/// `to`.
fn seconds_between(events: &str, from: &str, to: &str) -> f64 {
    let at = |prefix: &str| {
        events
            .lines()
            .filter_map(|l| serde_json::from_str::<serde_json::Value>(l).ok())
            .find(|e| e["message"].as_str().is_some_and(|m| m.starts_with(prefix)))
            .and_then(|e| e["time"].as_f64())
            .unwrap_or_else(|| panic!("no event {prefix:?}"))
    };
    at(to) - at(from)
}

/// The bootstrap token and every private key line of `data`'s files.
fn secret_needles(data: &Path) -> Vec<Vec<u8>> {
    let parsed = ingot_bootstrap::parse(&fs::read(data).unwrap()).unwrap();
    let mut needles: Vec<Vec<u8>> = vec![b"6h4ylc.5x2jgkf0q8t7mw1d".to_vec()];
    for f in &parsed.files {
        let text = String::from_utf8_lossy(&f.content);
        if text.contains("PRIVATE KEY-----") {
            needles.extend(
                text.lines()
                    .filter(|l| !l.contains("-----") && l.trim().len() >= 16)
                    .map(|l| l.trim().as_bytes().to_vec()),
            );
        }
    }
    needles
}

/// The node layer's sealed secrets (table and credentials) copied below `root`; the SSH host
/// key's symlink target.
fn copy_sealed(image: &Path, offset: u64, size: u64, root: &Path) -> PathBuf {
    let mount = Mount::new(image, offset, size);
    for dir in ["etc/ingot", "etc/credstore.encrypted"] {
        fs::create_dir_all(root.join(dir)).unwrap();
    }
    let cp = Command::new("cp")
        .arg("-a")
        .arg(mount.dir.path().join("etc/credstore.encrypted/."))
        .arg(root.join("etc/credstore.encrypted"))
        .status()
        .unwrap();
    assert!(cp.success());
    let table = "etc/ingot/sealed-secrets";
    fs::copy(mount.dir.path().join(table), root.join(table)).unwrap();
    fs::read_link(mount.dir.path().join("etc/ssh/ssh_host_ed25519_key")).unwrap()
}

/// What the node's initramfs does: the booted UKI's `.pcrsig` where systemd looks for it.
fn hand_over_pcr_signature(uki: &[u8], root: &Path) {
    let signature = root.join("run/systemd/tpm2-pcr-signature.json");
    fs::create_dir_all(signature.parent().unwrap()).unwrap();
    let pcrsig = ingot_artifact::uki::section(uki, ".pcrsig").unwrap();
    fs::write(&signature, pcrsig).unwrap();
}

/// The node's `unseal-secrets` run on the tree at `root` with the swtpm `device`.
fn unseal_on_swtpm(work: &Path, device: &str, root: &Path) -> Output {
    // swtpm has no resource manager (a node's /dev/tpmrm0 has the kernel's): the real
    // systemd-creds, each run followed by a flush of what it left loaded.
    let bin = work.join("bin");
    fs::create_dir_all(&bin).unwrap();
    fs::write(
        bin.join("systemd-creds"),
        "#!/bin/sh\n/usr/bin/systemd-creds \"$@\"; rc=$?\n\
         for w in -t -l -s; do tpm2_flushcontext $w >/dev/null 2>&1; done\nexit $rc\n",
    )
    .unwrap();
    use std::os::unix::fs::PermissionsExt;
    fs::set_permissions(bin.join("systemd-creds"), fs::Permissions::from_mode(0o755)).unwrap();
    let script = repo_root().join("boot/systemd/unseal-secrets");
    Command::new("sh")
        .arg(&script)
        .env(
            "PATH",
            format!("{}:{}", bin.display(), std::env::var("PATH").unwrap()),
        )
        .env("TPM2TOOLS_TCTI", device)
        .env("INGOT_ROOT", root)
        .env("INGOT_TPM2_DEVICE", device)
        .env(
            "INGOT_PCR_SIGNATURE",
            root.join("run/systemd/tpm2-pcr-signature.json"),
        )
        .output()
        .unwrap()
}

/// `ssh-keygen -l`'s line for the public half of the private key at `key`.
fn fingerprint_of(key: &Path, work: &Path) -> String {
    let public = Command::new("ssh-keygen")
        .arg("-yf")
        .arg(key)
        .output()
        .unwrap();
    assert!(public.status.success(), "{public:?}");
    let pub_file = work.join("host.pub");
    fs::write(&pub_file, &public.stdout).unwrap();
    let fp = Command::new("ssh-keygen")
        .arg("-lf")
        .arg(&pub_file)
        .output()
        .unwrap();
    String::from_utf8_lossy(&fp.stdout).into_owned()
}

/// The whole sealed path on a machine with a TPM 2.0 (swtpm, `INGOT_TPM2_DEVICE`) and a release
/// with a PCR policy, `--tpm require`: a control plane whose bootstrap data carries four CA keys
/// and a bootstrap token. The disk holds none of their bytes, nor the SSH host key's; the node
/// layer's credentials open with the node's own `unseal-secrets` once PCR 11 holds what the
/// release's UKI (read off the written ESP) measures, and the host key that comes out is the one
/// whose fingerprint the writer reported.
#[test]
fn a_machine_with_a_tpm_gets_its_secrets_sealed_and_none_on_its_disk() {
    if !usable(ingot_testkit::test_name!())
        || !common::secure_boot::usable(ingot_testkit::test_name!())
        || !ingot_testkit::skip::have_tools(
            ingot_testkit::test_name!(),
            &["swtpm", "systemd-creds", "tpm2_pcrextend", "mtype"],
        )
    {
        return;
    }
    let work = tempfile::tempdir_in("/var/tmp").unwrap();
    let stack = pcr_policy_stack(work.path());
    let published = common::publish_behind_token(
        &stack.layout,
        "stacks/demo:1.0.0",
        TOKEN,
        &stack.dir.path().join("registry"),
    );
    let p = Fixture { stack, published };
    let tpm = ingot_vm::swtpm::Swtpm::start_for_host(Path::new("swtpm"), work.path()).unwrap();
    let device = tpm.tcti().unwrap();
    let m = machine("cpu-worker");
    let tpm_dir = m.m.root.join("sys/class/tpm/tpm0");
    fs::create_dir_all(&tpm_dir).unwrap();
    fs::write(tpm_dir.join("tpm_version_major"), "2\n").unwrap();
    let data = bootstrap_fixture("cloud-config-controlplane-init.yaml");
    let run = caph_env(
        &p,
        &m,
        &data,
        "node-1",
        "sda",
        &["--tpm", "require"],
        &[("INGOT_TPM2_DEVICE", device.as_str())],
        false,
    );
    assert_eq!(run.out.status.code(), Some(0), "{}", run.show());
    let secrets = &run.output_json["details"]["secrets"];
    assert_eq!(secrets["sealed"], true, "{secrets}");
    assert_eq!(secrets["tpm"], "2.0", "{secrets}");
    assert_eq!(secrets["policy"], "require", "{secrets}");
    let summary = run.output_json["message"].as_str().unwrap();
    assert!(
        summary.contains("sealed to this machine's TPM"),
        "{summary}"
    );
    eprintln!(
        "sealing {} secrets with swtpm: {:.2} s",
        secrets["count"],
        seconds_between(&run.events, "sealing ", "sealing the per-node layer")
    );

    // Not one private key line, nor the token, anywhere on the disk.
    let image = &m.m.images["sda"];
    let disk = fs::read(image).unwrap();
    let needles = secret_needles(&data);
    assert!(needles.len() > 4, "the fixture carries CA keys");
    for n in &needles {
        assert!(
            !holds(&disk, n),
            "{:?} is on the disk",
            String::from_utf8_lossy(n)
        );
    }

    // The node's side: the node layer's table, credentials and signatures, opened by the
    // node's own script under PCR 11 as the written UKI leaves it.
    let parts = partitions(image);
    let node = parts.iter().find(|p| p.0 == "ingot-node").unwrap();
    let root = work.path().join("node");
    let host_key_link = copy_sealed(image, node.1, node.2, &root);
    let esp = parts.iter().find(|p| p.0 == "ESP").unwrap().1;
    let uki = Command::new("mtype")
        .args(["-i", &format!("{}@@{esp}", image.display())])
        .arg("::/EFI/BOOT/BOOTX64.EFI")
        .output()
        .unwrap();
    assert!(uki.status.success());
    measure_uki(&device, &uki.stdout);
    hand_over_pcr_signature(&uki.stdout, &root);
    let out = unseal_on_swtpm(work.path(), &device, &root);
    assert!(out.status.success(), "{out:?}");
    let opened = root.join(host_key_link.strip_prefix("/").unwrap());
    let host_key = fs::read(&opened).unwrap();
    assert!(holds(&host_key, b"OPENSSH PRIVATE KEY"));
    let body = String::from_utf8_lossy(&host_key)
        .lines()
        .nth(1)
        .unwrap()
        .to_string();
    assert!(
        !holds(&disk, body.as_bytes()),
        "the host key is on the disk"
    );
    // The key that opened is the one the writer reported.
    let fp = fingerprint_of(&opened, work.path());
    let reported = secrets["secrets"]
        .as_array()
        .unwrap()
        .iter()
        .find(|s| s["path"] == "/etc/ssh/ssh_host_ed25519_key")
        .unwrap();
    assert_eq!(
        fp.split_whitespace().nth(1),
        reported["ssh_fingerprint"].as_str()
    );
}
