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

use std::path::Path;
use std::process::Command;
use std::time::Instant;

use common::{partitions, repo_root};
use ingot_testkit::rescue::{self, Caph, Disk, Firmware, Rescue};
use ingot_testkit::skip::in_ci;

const TOKEN: &str = "ghp_ingotRescueVmToken0123456789abcdef";
const WRITER: &str = env!("CARGO_BIN_EXE_ingot-writer");

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
    Rescue::get(Path::new(env!("CARGO_TARGET_TMPDIR")), &[Path::new(WRITER)])
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
    // The boot fixture stack carries a BIOS loader: every disk boots from BIOS and UEFI.
    let mut want = vec!["ESP", "var", "ingot-node", "ingot-node-verity", "bios-boot"];
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
            extra_args: &[],
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

/// installimage's software RAID1 as a rescue system finds it: partitions on every disk, an md
/// array for /boot over sda1, sdb1 and (here) sdc1, one over sda2 and sdb2 carrying an LVM volume
/// group, built with the real mdadm and lvm, stopped and assembled again the way the rescue
/// system's boot does. CAPH targets the first two disks; the /boot array reaches the third, so
/// the run stops with `md-spans-disks` and every disk's SHA-256 (taken in the VM, arrays
/// assembled) is the same after the run as before.
#[test]
fn rescue_vm_refuses_an_installimage_array_reaching_another_disk() {
    if !usable("rescue_vm_refuses_an_installimage_array_reaching_another_disk") {
        return;
    }
    let p = publish();
    let rescue = rescue_system();
    let dir = tempfile::tempdir_in("/var/tmp").unwrap();
    let wwns = [
        "0x5000c500a1b2c3d4",
        "0x5000c500a1b2c3d5",
        "0x5000c500a1b2c3d6",
    ];
    let disks: Vec<Disk> = wwns
        .iter()
        .enumerate()
        .map(|(i, w)| {
            Disk::create(
                dir.path().join(format!("d{i}.img")),
                256 << 20,
                w,
                &format!("ZA1ABC{i:02}"),
            )
        })
        .collect();
    let by_id = |w: &str| format!("$(readlink -f /dev/disk/by-id/wwn-{w})");
    let before = format!(
        r#"set -x
A={a}; B={b}; C={c}
for d in $A $B $C; do sgdisk -n1:0:+64M -t1:fd00 -n2:0:+128M -t2:fd00 $d >/dev/null; done
udevadm settle
yes | mdadm --create /dev/md0 --run --assume-clean --level=1 --metadata=1.2 --raid-devices=3 ${{A}}1 ${{B}}1 ${{C}}1
yes | mdadm --create /dev/md1 --run --assume-clean --level=1 --metadata=1.2 --raid-devices=2 ${{A}}2 ${{B}}2
pvcreate -y /dev/md1 && vgcreate vg0 /dev/md1 && lvcreate -y -Zn -L 32M -n root vg0
# The server reboots into the rescue system: everything stops, then comes back as it assembles.
vgchange -an vg0; mdadm --stop /dev/md1 /dev/md0
mdadm --assemble --scan; vgchange -aay
cat /proc/mdstat; lvs
sha256sum $A $B $C >/mnt/job/sha-before
"#,
        a = by_id(wwns[0]),
        b = by_id(wwns[1]),
        c = by_id(wwns[2]),
    );
    let after = format!(
        "cat /proc/mdstat; sha256sum {} {} {} >/mnt/job/sha-after; diff /mnt/job/sha-before /mnt/job/sha-after && echo SHA-UNCHANGED",
        by_id(wwns[0]),
        by_id(wwns[1]),
        by_id(wwns[2])
    );
    let devices = format!("{} {}", wwns[0], wwns[1]);
    let refs: Vec<&Disk> = disks.iter().collect();
    let run = rescue::caph(
        rescue,
        Firmware::Uefi,
        &refs,
        p.registry.front.port,
        &Caph {
            command: Path::new(WRITER),
            url: &p.registry.url,
            token: TOKEN,
            bootstrap: &worker_data(),
            machine_name: "installimage-1",
            devices: &devices,
            trust_key: &p.stack.public,
            before: &before,
            after: &after,
            extra_args: &[],
        },
    );
    // The old installation was there, assembled, when the writer ran.
    assert!(run.before.contains("md0 : active raid1"), "{}", run.show());
    assert!(run.before.contains("md1 : active raid1"), "{}", run.show());
    assert!(run.before.contains(" root vg0 "), "{}", run.show());
    assert_eq!(run.exit, Some(1), "{}", run.show());
    assert!(
        run.last_line().contains("FAILED (md-spans-disks)")
            && run.last_line().contains("no disk was changed"),
        "{}",
        run.show()
    );
    assert!(!run.log.contains("IMAGE_URL_DONE"), "{}", run.show());
    assert_eq!(run.output_json["state"], "failed", "{}", run.show());
    assert!(run.after.contains("SHA-UNCHANGED"), "{}", run.show());
    assert_eq!(
        run.after.matches("active raid1").count(),
        2,
        "{}",
        run.show()
    );
}

/// A Hetzner cloud VM: legacy BIOS (SeaBIOS, QEMU's default firmware), CAPH's `sda`. The writer
/// sees no UEFI, boots the disk through the stack's BIOS loader, and the written disk, booted by
/// SeaBIOS alone, reaches the same end marker as the UEFI boot test with every layer and the node
/// layer verified by dm-verity. The same disk boots from OVMF too.
#[test]
fn rescue_vm_bios_machine_boots_its_disk_from_seabios() {
    if !usable("rescue_vm_bios_machine_boots_its_disk_from_seabios") {
        return;
    }
    let p = publish();
    let rescue = rescue_system();
    let dir = tempfile::tempdir_in("/var/tmp").unwrap();
    let disk = Disk::create(
        dir.path().join("sda.img"),
        1 << 30,
        "0x5002538e40a1b2d0",
        "HC-VOLUME-1",
    );
    let run = rescue::caph(
        rescue,
        Firmware::Bios,
        &[&disk],
        p.registry.front.port,
        &Caph {
            command: Path::new(WRITER),
            url: &p.registry.url,
            token: TOKEN,
            bootstrap: &worker_data(),
            machine_name: "hcloud-worker-1",
            devices: "sda",
            trust_key: &p.stack.public,
            before: "",
            after: "ls /sys/firmware/efi 2>&1",
            extra_args: &["--kernel-arg", "console=ttyS0", "--kernel-arg", "panic=-1"],
        },
    );
    assert!(
        run.after.contains("No such file"),
        "a BIOS machine: {}",
        run.show()
    );
    assert_succeeded(&run);
    assert!(run.log.contains("BIOS firmware"), "{}", run.show());
    let parts = partitions(&disk.image);
    assert_eq!(parts.last().unwrap().0, "bios-boot", "{parts:?}");
    for (firmware, what) in [(Firmware::Bios, "seabios"), (Firmware::Uefi, "ovmf")] {
        let console = rescue::boot_disk(&disk.image, firmware, what);
        for (name, root) in p.stack.layers.iter().filter(|(n, _)| n == "base") {
            let line = format!("ingot: layer {name} verified root hash {root}\n");
            assert!(
                console.contains(&line),
                "{what}: missing {line:?}:\n{console}"
            );
        }
        assert!(
            console.contains("ingot: layer node verified root hash "),
            "{what}: {console}"
        );
        assert!(
            console.contains("ingot-node: hostname hcloud-worker-1\n"),
            "{what}: {console}"
        );
        assert!(console.contains("INGOT-BOOT-OK\n"), "{what}: {console}");
        assert!(!console.contains("INGOT-BOOT-FAILED"), "{what}: {console}");
    }
}
