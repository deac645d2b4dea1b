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

use common::boot::{publish, Published};
use common::{partitions, repo_root};
use ingot_testkit::rescue::{self, Caph, Disk, Firmware, Rescue};
use ingot_testkit::skip::{find_tool, have_file, have_root, have_tools};

const TOKEN: &str = "ghp_ingotRescueVmToken0123456789abcdef";
const WRITER: &str = env!("CARGO_BIN_EXE_ingot-writer");
/// TCG's emulated disks on a shared, loaded host read at a few MiB/s, which says nothing about a
/// server's disk: the read-speed gate's floor, in KiB/s, lowered as an operator's settings would.
const TCG_SETTINGS: &str = "min_read_speed = 1000\n";

fn usable(test: &str) -> bool {
    have_root(test)
        && have_tools(test, &["qemu-system-x86_64", "docker-registry"])
        && have_file(test, Path::new(rescue::OVMF_CODE))
}

fn rescue_system() -> &'static Rescue {
    Rescue::get(Path::new(env!("CARGO_TARGET_TMPDIR")), &[Path::new(WRITER)])
}

fn worker_data() -> std::path::PathBuf {
    repo_root().join("bootstrap/tests/fixtures/cloud-config-worker-join.yaml")
}

/// `rescue::caph` with what every test here shares: the writer as the command, the published
/// fixture stack, the worker's bootstrap data.
#[allow(clippy::too_many_arguments)]
fn run_caph(
    p: &Published,
    firmware: Firmware,
    disks: &[&Disk],
    machine_name: &str,
    devices: &str,
    before: &str,
    after: &str,
    extra_args: &[&str],
) -> rescue::CaphRun {
    rescue::caph(
        rescue_system(),
        firmware,
        disks,
        p.registry.front.port,
        &Caph {
            command: Path::new(WRITER),
            url: &p.registry.url,
            token: TOKEN,
            bootstrap: &worker_data(),
            machine_name,
            devices,
            trust_key: Some(&p.stack.public),
            settings_beside: Some(TCG_SETTINGS),
            before,
            after,
            extra_args,
        },
    )
}

/// `/dev/sdX` of the disk with WWN `wwn`, as a shell expression in the rescue system.
fn by_id(wwn: &str) -> String {
    format!("$(readlink -f /dev/disk/by-id/wwn-{wwn})")
}

/// installimage's software RAID1 as a rescue system finds it, built by the real mdadm and lvm
/// in the rescue VM: on each of `wwns`, partition 1 (64 MiB) and 2 (128 MiB), type fd00; md0
/// (/boot) over every disk's partition 1, md1 over the first two disks' partition 2 carrying the
/// volume group vg0 with an LV `root`; everything stopped and assembled again as the rescue
/// system's boot does. Then the SHA-256 of the disks `keep` (WWNs) goes to /mnt/job/sha-before.
fn installimage_before(wwns: &[&str], keep: &[&str]) -> String {
    let disks: Vec<String> = wwns.iter().map(|w| by_id(w)).collect();
    let p1: Vec<String> = (0..wwns.len()).map(|i| format!("${{D{i}}}1")).collect();
    let vars: String = disks
        .iter()
        .enumerate()
        .map(|(i, d)| format!("D{i}={d}; "))
        .collect();
    let keep: Vec<String> = keep.iter().map(|w| by_id(w)).collect();
    format!(
        r#"set -x
{vars}
for d in {all}; do sgdisk -n1:0:+64M -t1:fd00 -n2:0:+128M -t2:fd00 $d >/dev/null; done
udevadm settle
yes | mdadm --create /dev/md0 --run --assume-clean --level=1 --metadata=1.2 --raid-devices={n} {p1}
yes | mdadm --create /dev/md1 --run --assume-clean --level=1 --metadata=1.2 --raid-devices=2 ${{D0}}2 ${{D1}}2
pvcreate -y /dev/md1 && vgcreate vg0 /dev/md1 && lvcreate -y -Zn -L 32M -n root vg0
# The server reboots into the rescue system: everything stops, then comes back as it assembles.
vgchange -an vg0; mdadm --stop /dev/md1 /dev/md0
mdadm --assemble --scan; vgchange -aay
cat /proc/mdstat; lvs
sha256sum {keep} /dev/null >/mnt/job/sha-before
"#,
        all = (0..wwns.len())
            .map(|i| format!("$D{i}"))
            .collect::<Vec<_>>()
            .join(" "),
        n = wwns.len(),
        p1 = p1.join(" "),
        keep = keep.join(" "),
    )
}

/// Shell that compares the SHA-256 of the disks `keep` with /mnt/job/sha-before: `SHA-UNCHANGED`.
fn sha_unchanged(keep: &[&str]) -> String {
    let keep: Vec<String> = keep.iter().map(|w| by_id(w)).collect();
    format!(
        "sha256sum {} /dev/null >/mnt/job/sha-after; diff /mnt/job/sha-before /mnt/job/sha-after && echo SHA-UNCHANGED\n",
        keep.join(" ")
    )
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

/// CAPH's image-url-command as `ci/release` makes it (`ci/image-url-command`): ingot-writer with
/// the stack's public key and the settings built in, static where the musl toolchain is
/// installed (ci/test installs it). Returns its path.
fn release_binary(public: &Path) -> std::path::PathBuf {
    let dir =
        Path::new(env!("CARGO_TARGET_TMPDIR")).join(format!("release-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let settings = dir.join("image-url-command.toml");
    std::fs::write(&settings, TCG_SETTINGS).unwrap();
    let out = dir.join("image-url-command-ingot");
    let o = Command::new(repo_root().join("ci/image-url-command"))
        .arg(public)
        .arg(&out)
        .arg(&settings)
        .output()
        .expect("ci/image-url-command");
    let said =
        String::from_utf8_lossy(&o.stdout).into_owned() + &String::from_utf8_lossy(&o.stderr);
    assert!(o.status.success(), "ci/image-url-command: {said}");
    eprintln!("{said}");
    let elf = Command::new("readelf")
        .arg("-lW")
        .arg(&out)
        .output()
        .unwrap();
    let is_static = !String::from_utf8_lossy(&elf.stdout).contains("INTERP");
    // With the musl toolchain there (ci/test installs it where rustup can fetch the target),
    // the binary must be static: no program interpreter, no glibc version to match.
    let musl = Command::new("rustup")
        .args(["target", "list", "--installed"])
        .output()
        .is_ok_and(|o| String::from_utf8_lossy(&o.stdout).contains("x86_64-unknown-linux-musl"))
        && find_tool("musl-gcc").is_some();
    assert_eq!(is_static, musl, "static with musl, dynamic without: {said}");
    if !musl {
        eprintln!(
            "note: no musl toolchain here; the image-url-command under test is a glibc build"
        );
    }
    out
}

/// A UEFI rescue VM with two disks; CAPH names the second by its WWN, and the command is the
/// release binary, run exactly as CAPH runs it: no flags, no key or settings file beside it, the
/// key and settings built in. The writer finds the disk through the kernel's sysfs and udev's
/// links, writes it, and leaves the other disk's every byte alone.
#[test]
fn rescue_vm_release_binary_provisions_one_disk_by_wwn() {
    if !usable(ingot_testkit::test_name!()) {
        return;
    }
    let p = publish(TOKEN);
    let command = release_binary(&p.stack.public);
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
        rescue_system(),
        Firmware::Uefi,
        &[&other, &target],
        p.registry.front.port,
        &Caph {
            command: &command,
            url: &p.registry.url,
            token: TOKEN,
            bootstrap: &worker_data(),
            machine_name: "worker-wwn-1",
            devices: &target.wwn,
            trust_key: None,
            settings_beside: None,
            before: "",
            after: "ls -l /dev/disk/by-id/; cat /sys/block/sd*/device/wwid; ls /root",
            extra_args: &[],
        },
    );
    assert_succeeded(&run);
    // Nothing beside the command: the key and the settings came from inside it.
    assert!(
        !run.after.contains("image-url-command.toml"),
        "{}",
        run.after
    );
    let settings = &run.output_json["details"]["settings"];
    assert_eq!(settings["trust_key"], "the built-in key", "{settings}");
    assert_eq!(settings["from"][0], "built in", "{settings}");
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

/// installimage's RAID1 (`installimage_before`) over three disks: the /boot array reaches the
/// third, which CAPH does not name, so the run stops with `md-spans-disks` and every disk's
/// SHA-256 (taken in the VM, arrays assembled) is the same after the run as before.
#[test]
fn rescue_vm_refuses_an_installimage_array_reaching_another_disk() {
    if !usable(ingot_testkit::test_name!()) {
        return;
    }
    let p = publish(TOKEN);
    let dir = tempfile::tempdir_in("/var/tmp").unwrap();
    let wwns = [
        "0x5000c500a1b2c3d4",
        "0x5000c500a1b2c3d5",
        "0x5000c500a1b2c3d6",
    ];
    let disks = installimage_disks(dir.path(), &wwns, 256 << 20);
    let refs: Vec<&Disk> = disks.iter().collect();
    let after = format!("cat /proc/mdstat; {}", sha_unchanged(&wwns));
    let devices = format!("{} {}", wwns[0], wwns[1]);
    let run = run_caph(
        &p,
        Firmware::Uefi,
        &refs,
        "installimage-1",
        &devices,
        &installimage_before(&wwns, &wwns),
        &after,
        &[],
    );
    // The old installation was there, assembled, when the writer ran.
    assert_installimage_assembled(&run);
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

/// Disks of `size` bytes for an installimage server, one per WWN, with serials.
fn installimage_disks(dir: &Path, wwns: &[&str], size: u64) -> Vec<Disk> {
    wwns.iter()
        .enumerate()
        .map(|(i, w)| {
            Disk::create(
                dir.join(format!("d{i}.img")),
                size,
                w,
                &format!("ZA1ABC{i:02}"),
            )
        })
        .collect()
}

fn assert_installimage_assembled(run: &rescue::CaphRun) {
    assert!(run.before.contains("md0 : active raid1"), "{}", run.show());
    assert!(run.before.contains("md1 : active raid1"), "{}", run.show());
    assert!(run.before.contains(" root vg0 "), "{}", run.show());
}

/// installimage's RAID1 (`installimage_before`) over exactly the two disks CAPH names, assembled
/// with its volume group active, and a third disk outside it: the writer stops the volume group
/// and the arrays, clears their signatures and writes both disks. In the rescue system
/// afterwards no old array or volume group is left, the real mdadm assembles the writer's `var`
/// mirror from the two disks (`ingot:var`, 2 of 2 members), and the third disk's SHA-256 is
/// unchanged; on the host both disks hold the layout, `sgdisk -v` clean.
#[test]
fn rescue_vm_provisions_an_installimage_raid1_server() {
    if !usable(ingot_testkit::test_name!()) {
        return;
    }
    let p = publish(TOKEN);
    let dir = tempfile::tempdir_in("/var/tmp").unwrap();
    let wwns = ["0x5000c500a1b2c3e1", "0x5000c500a1b2c3e2"];
    // Room for the boot fixture's layout (about 350 MiB).
    let mut disks = installimage_disks(dir.path(), &wwns, 512 << 20);
    let other = Disk::create(
        dir.path().join("other.img"),
        64 << 20,
        "0x5000c500a1b2c3e3",
        "ZA1ABC99",
    );
    let other_wwn = other.wwn.clone();
    disks.push(other);
    let refs: Vec<&Disk> = disks.iter().collect();
    let before = format!(
        "sgdisk -n1:0:+16M {} >/dev/null\n{}",
        by_id(&other_wwn),
        installimage_before(&wwns, &[&other_wwn]),
    );
    let after = format!(
        r#"{sha}
blockdev --rereadpt {a}; blockdev --rereadpt {b}; udevadm settle
echo '--- left over'; cat /proc/mdstat; vgs 2>&1
echo '--- assembled'
mdadm --assemble --scan; udevadm settle
cat /proc/mdstat; mdadm --detail --scan
"#,
        sha = sha_unchanged(&[&other_wwn]),
        a = by_id(wwns[0]),
        b = by_id(wwns[1]),
    );
    let devices = format!("{} {}", wwns[0], wwns[1]);
    let run = run_caph(
        &p,
        Firmware::Uefi,
        &refs,
        "installimage-2",
        &devices,
        &before,
        &after,
        &[],
    );
    assert_installimage_assembled(&run);
    assert_succeeded(&run);
    assert_eq!(run.output_json["status"], "Succeeded", "{}", run.show());
    let warnings = run.output_json["warnings"].to_string();
    assert!(warnings.contains("storage-torn-down"), "{}", run.show());
    assert!(run.after.contains("SHA-UNCHANGED"), "{}", run.show());
    let (left, assembled) = run.after.split_once("--- assembled").unwrap();
    // The old arrays and volume group are gone (the rescue's udev may already have assembled
    // the writer's new mirror from the new partition tables: that one is checked below).
    for old in ["md0 :", "md1 :", "rescue:", "vg0"] {
        assert!(!left.contains(old), "{old} is left:\n{}", run.show());
    }
    // The writer's mirror, and only it, assembled by the kernel from both disks.
    let active: Vec<&str> = assembled
        .lines()
        .filter(|l| l.contains(" : active") && l.contains(" raid1 "))
        .collect();
    assert_eq!(active.len(), 1, "{}", run.show());
    assert!(assembled.contains("[2/2]"), "{}", run.show());
    assert!(assembled.contains("name=ingot:var"), "{}", run.show());
    assert_eq!(assembled.matches("ARRAY ").count(), 1, "{}", run.show());
    for disk in &disks[..2] {
        assert_layout(disk, &["base"]);
    }
}

/// A Hetzner cloud VM: legacy BIOS (SeaBIOS, QEMU's default firmware), CAPH's `sda`. The writer
/// sees no UEFI, boots the disk through the stack's BIOS loader, and the written disk, booted by
/// SeaBIOS alone, reaches the same end marker as the UEFI boot test with every layer and the node
/// layer verified by dm-verity. The same disk boots from OVMF too.
#[test]
fn rescue_vm_bios_machine_boots_its_disk_from_seabios() {
    if !usable(ingot_testkit::test_name!()) {
        return;
    }
    let p = publish(TOKEN);
    let dir = tempfile::tempdir_in("/var/tmp").unwrap();
    let disk = Disk::create(
        dir.path().join("sda.img"),
        1 << 30,
        "0x5002538e40a1b2d0",
        "HC-VOLUME-1",
    );
    let run = run_caph(
        &p,
        Firmware::Bios,
        &[&disk],
        "hcloud-worker-1",
        "sda",
        "",
        "ls /sys/firmware/efi 2>&1",
        &ingot_testkit::qemu::writer_kernel_args(),
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
