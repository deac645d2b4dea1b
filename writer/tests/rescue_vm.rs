//! ingot-writer in a rescue system as it really is: a QEMU VM (TCG) running Debian's kernel, udev,
//! mdadm, lvm2 and smartctl (`tests/rescue/`), its disks virtio-scsi `scsi-hd` devices with WWNs
//! and serials, so the writer reads the kernel's own sysfs, udev's by-id links and SMART answers.
//! The writer runs exactly as cluster-api-provider-hetzner runs its imageURLCommand (copied to
//! `/root/image-url-command`, four arguments, the registry token in the environment, `nohup`,
//! output to a log) and pulls the boot fixture stack (`tests/boot/`) from a real docker-registry
//! behind a token-checking front on the host, reached through QEMU's user network.
//!
//! Needs root (the registry front's fixtures run as root in CI), qemu-system-x86_64, OVMF,
//! docker-registry and the tools `tests/rescue/build-rescue.sh` and `tests/boot/build-stack.sh`
//! name; skipped with a message otherwise, except in CI, where a missing piece fails the test.

mod common;

#[path = "../../tests/rescue/vm.rs"]
mod rescue;

use std::path::Path;
use std::process::Command;
use std::time::Instant;

use common::{partitions, repo_root};
use rescue::{Caph, Disk, Firmware, Rescue};

const TOKEN: &str = "ghp_ingotRescueVmToken0123456789abcdef";
const WRITER: &str = env!("CARGO_BIN_EXE_ingot-writer");

fn in_ci() -> bool {
    std::env::var_os("CI").is_some()
}

fn have(tool: &str) -> bool {
    Command::new("sh")
        .args(["-c", &format!("command -v {tool}")])
        .output()
        .is_ok_and(|o| o.status.success())
}

fn usable(test: &str) -> bool {
    let root = rustix::process::geteuid().is_root();
    let qemu = have("qemu-system-x86_64") && Path::new(rescue::OVMF_CODE).exists();
    if root && qemu {
        assert!(
            have("docker-registry"),
            "{test}: docker-registry is missing (ci/test installs it)"
        );
        return true;
    }
    assert!(
        !in_ci(),
        "{test}: CI must run this as root with qemu-system-x86_64 and OVMF installed"
    );
    eprintln!("skipping {test}: needs root, qemu-system-x86_64 and OVMF");
    false
}

/// The boot fixture stack, built, signed and published behind the token front. Dropping it
/// stops the registry and removes its files.
struct Published {
    _trees: tempfile::TempDir,
    stack: common::Stack,
    registry: common::Published,
}

fn publish() -> Published {
    let trees = tempfile::tempdir_in("/var/tmp").unwrap();
    let started = Instant::now();
    let out = trees.path().join("stack");
    let status = Command::new(repo_root().join("tests/boot/build-stack.sh"))
        .arg(&out)
        .status()
        .unwrap();
    assert!(status.success(), "build-stack.sh: {status}");
    eprintln!("build-stack.sh: {:.1?}", started.elapsed());
    let stack = common::build_stack(&out.join("stack.toml"));
    let registry = common::publish_behind_token(
        &stack.layout,
        "stacks/boot:1.0.0",
        TOKEN,
        &stack.dir.path().join("registry"),
    );
    Published {
        _trees: trees,
        stack,
        registry,
    }
}

fn rescue_system() -> &'static Rescue {
    Rescue::get(&[Path::new(WRITER)])
}

fn worker_data() -> std::path::PathBuf {
    repo_root().join("bootstrap/tests/fixtures/cloud-config-worker-join.yaml")
}

/// A successful run: exit 0, `IMAGE_URL_DONE` on the last line only, output.json done, its
/// message followed the stages while CAPH's poll watched.
fn assert_succeeded(run: &rescue::CaphRun) {
    assert_eq!(run.exit, Some(0), "{}", run.show());
    assert!(
        run.last_line().contains("IMAGE_URL_DONE"),
        "last line: {}",
        run.show()
    );
    assert_eq!(
        run.log.matches("IMAGE_URL_DONE").count(),
        1,
        "{}",
        run.show()
    );
    assert_eq!(run.output_json["state"], "done", "{}", run.show());
    assert!(run.messages.len() >= 2, "{:#?}", run.messages);
    assert!(!run.log.contains(TOKEN), "the token leaked into the log");
    assert!(!run.output_json.to_string().contains(TOKEN));
}

/// The layout the writer promises, read back by the host's own tools.
fn assert_layout(disk: &Disk, layers: &[&str]) {
    let parts = partitions(&disk.image);
    let mut names: Vec<&str> = parts.iter().map(|p| p.0.as_str()).collect();
    names.sort();
    let mut want = vec!["ESP", "var", "ingot-node", "ingot-node-verity"];
    let owned: Vec<String> = layers
        .iter()
        .flat_map(|l| [format!("ingot-{l}"), format!("ingot-{l}-verity")])
        .collect();
    want.extend(owned.iter().map(String::as_str));
    want.sort();
    assert_eq!(names, want, "{}", disk.image.display());
    let v = Command::new("sgdisk")
        .arg("-v")
        .arg(&disk.image)
        .output()
        .unwrap();
    assert!(
        String::from_utf8_lossy(&v.stdout).contains("No problems found"),
        "sgdisk -v: {v:?}"
    );
}

/// A UEFI rescue VM with two disks; CAPH names the second by its WWN. The writer finds it
/// through the kernel's sysfs and udev's links, writes it, and leaves the other disk's every
/// byte alone.
#[test]
fn rescue_vm_provisions_one_disk_by_wwn() {
    if !usable("rescue_vm_provisions_one_disk_by_wwn") {
        return;
    }
    let p = publish();
    let rescue = rescue_system();
    let dir = tempfile::tempdir_in("/var/tmp").unwrap();
    let other = Disk::create(
        dir.path().join("other.img"),
        1 << 30,
        "0x5002538e40a1b2c3",
        "S3Z9NB0K100001",
    );
    let target = Disk::create(
        dir.path().join("target.img"),
        1 << 30,
        "0x5002538e40a1b2c4",
        "S3Z9NB0K100002",
    );
    let other_before = other.sha256();
    let run = rescue::caph(
        rescue,
        Firmware::Uefi,
        &[&other, &target],
        p.registry.front.port,
        &Caph {
            command: Path::new(WRITER),
            url: &p.registry.url,
            token: TOKEN,
            bootstrap: &worker_data(),
            machine_name: "worker-wwn-1",
            devices: &target.wwn,
            trust_key: &p.stack.public,
            before: "",
            after: "ls -l /dev/disk/by-id/; cat /sys/block/sd*/device/wwid",
        },
    );
    assert_succeeded(&run);
    // The kernel's own names, not a fixture's: udev's link and sysfs' wwid for the target.
    assert!(
        run.after.contains(&format!("wwn-{} -> ", target.wwn)),
        "{}",
        run.after
    );
    assert!(run.after.contains("naa.5002538e40a1b2c4"), "{}", run.after);
    let facts = run.output_json["details"].to_string();
    assert!(facts.contains("5002538e40a1b2c4"), "{facts}");
    assert_layout(&target, &["base"]);
    assert_eq!(other.sha256(), other_before, "the other disk changed");
    let seen = p.registry.front.auth_seen.lock().unwrap().clone();
    assert!(!seen.is_empty(), "the writer authenticated to the registry");
}
