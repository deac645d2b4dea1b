//! The fixtures and the guard's parsers checked by the real tools: e2fsck, fsck.fat, sgdisk and
//! sfdisk for what the fixtures make; mdadm --examine and pvck/pvs for the md and LVM labels
//! written from their formats; and the read-speed gate on a loop device.
//!
//! Skips (printing why) only when a tool is not installed or, for loop devices, when not root.

mod common;

use std::fs::File;
use std::io::{Read, Seek, SeekFrom, Write};
use std::path::{Path, PathBuf};
use std::process::Command;
use std::sync::Arc;
use std::time::Duration;

use common::with_machine;
use ingot_machine::guard::{
    probe_region, write_md_v1, Finding, GuardReport, MdV1Params, RegionScan, Slice,
};
use ingot_machine::*;
use ingot_testkit::loopdev::{LoopDevice, LoopOptions};
use ingot_testkit::skip::have_loop_devices;

fn output(cmd: &mut Command) -> (bool, String) {
    let out = cmd.output().unwrap_or_else(|e| panic!("{cmd:?}: {e}"));
    let text =
        String::from_utf8_lossy(&out.stdout).into_owned() + &String::from_utf8_lossy(&out.stderr);
    (out.status.success(), text)
}

fn skip_without(tools: &[&str]) -> bool {
    !ingot_testkit::skip::have_tools(&ingot_testkit::skip::current_test(), tools)
}

fn report(m: &common::Machine, spec: &str) -> GuardReport {
    let t = resolve_targets(&m.m.sysroot(), &m.facts, spec).unwrap();
    guard(
        &m.facts,
        &t,
        &GuardOptions {
            allow_foreign_os: true,
        },
    )
    .unwrap()
}

fn region<'a>(r: &'a GuardReport, name: &str) -> &'a RegionScan {
    r.disks
        .iter()
        .flat_map(|d| &d.regions)
        .find(|x| x.name == name)
        .unwrap()
}

/// Copy a partition (as the guard located it) out of its image, for checkers that take no offset.
fn extract(m: &common::Machine, disk: &str, reg: &RegionScan, dir: &Path) -> PathBuf {
    let p = reg.partition.as_ref().unwrap();
    let mut from = File::open(&m.m.images[disk]).unwrap();
    from.seek(SeekFrom::Start(p.offset)).unwrap();
    let out = dir.join(format!("{}.part", reg.name));
    let mut to = File::create(&out).unwrap();
    std::io::copy(&mut from.take(p.size), &mut to).unwrap();
    to.flush().unwrap();
    out
}

#[test]
fn fixture_filesystems_and_tables_pass_their_checkers() {
    if skip_without(&["e2fsck", "fsck.fat", "sgdisk", "sfdisk"]) {
        return;
    }
    with_machine("foreign-os", |m| {
        let r = report(m, "sda");
        let tmp = tempfile::tempdir().unwrap();
        for name in ["sdb2", "sdc1", "sdc6"] {
            let part = extract(m, &name[..3], region(&r, name), tmp.path());
            let (ok, text) = output(Command::new("e2fsck").arg("-fn").arg(&part));
            assert!(ok, "e2fsck -fn {name}: {text}");
        }
        let esp = extract(m, "sdb", region(&r, "sdb1"), tmp.path());
        let (ok, text) = output(Command::new("fsck.fat").arg("-n").arg(&esp));
        assert!(ok, "fsck.fat -n sdb1: {text}");

        let (ok, text) = output(Command::new("sgdisk").arg("-v").arg(&m.m.images["sdb"]));
        assert!(
            ok && text.contains("No problems found"),
            "sgdisk -v: {text}"
        );
        // sfdisk reads the MBR chain back with the same partition numbers and offsets.
        let (ok, text) = output(Command::new("sfdisk").arg("--json").arg(&m.m.images["sdc"]));
        assert!(ok, "{text}");
        let json: serde_json::Value = serde_json::from_str(&text).unwrap();
        for reg in r
            .disks
            .iter()
            .find(|d| d.disk == "sdc")
            .unwrap()
            .regions
            .iter()
            .skip(1)
        {
            let p = reg.partition.as_ref().unwrap();
            let node = format!("{}{}", m.m.images["sdc"].display(), p.number);
            let entry = json["partitiontable"]["partitions"]
                .as_array()
                .unwrap()
                .iter()
                .find(|e| e["node"] == node.as_str())
                .unwrap_or_else(|| panic!("{node} not in {text}"));
            assert_eq!(
                entry["start"].as_u64().unwrap() * 512,
                p.offset,
                "{}",
                reg.name
            );
            assert_eq!(
                entry["size"].as_u64().unwrap() * 512,
                p.size,
                "{}",
                reg.name
            );
        }
    });
}

#[test]
fn md_superblocks_pass_mdadm_examine() {
    if skip_without(&["mdadm"]) {
        return;
    }
    with_machine("md-spanning", |m| {
        let r = report(m, "sda sdb");
        let tmp = tempfile::tempdir().unwrap();
        for (disk, role) in [("sda", 0), ("sdb", 1)] {
            let part = extract(m, disk, region(&r, &format!("{disk}1")), tmp.path());
            let (ok, text) = output(Command::new("mdadm").arg("--examine").arg(&part));
            assert!(ok, "mdadm --examine {disk}1: {text}");
            for want in [
                "Version : 1.2",
                "Array UUID : 3f5a2b1c:8d4e6f70:a1b2c3d4:e5f60718",
                "Name : rescue:0",
                "Raid Level : raid1",
                "Raid Devices : 2",
                "Data Offset : 2048 sectors",
                "Super Offset : 8 sectors",
                &format!("Device Role : Active device {role}"),
            ] {
                assert!(text.contains(want), "{disk}1: want {want:?} in\n{text}");
            }
            assert!(
                text.lines()
                    .any(|l| l.contains("Checksum") && l.ends_with("- correct")),
                "{text}"
            );
        }
    });
    // 1.0 (at the end) and 1.1 (at the start): mdadm finds each where the guard does.
    let tmp = tempfile::tempdir().unwrap();
    for metadata in ["1.0", "1.1"] {
        let len: u64 = 8 << 20;
        let params = MdV1Params {
            metadata: metadata.into(),
            array_uuid: [0x11; 16],
            device_uuid: [0x22; 16],
            name: "rescue:1".into(),
            level: 1,
            raid_disks: 2,
            dev_number: 1,
            time: 1_700_000_000,
            clean: true,
        };
        let (at, sb) = write_md_v1(&params, len).unwrap();
        let path = tmp.path().join(format!("member-{metadata}.img"));
        let f = File::create(&path).unwrap();
        f.set_len(len).unwrap();
        std::os::unix::fs::FileExt::write_all_at(&f, &sb, at).unwrap();
        let (ok, text) = output(Command::new("mdadm").arg("--examine").arg(&path));
        assert!(ok, "mdadm --examine {metadata}: {text}");
        assert!(text.contains(&format!("Version : {metadata}")), "{text}");
        assert!(
            text.contains("Array UUID : 11111111:11111111:11111111:11111111"),
            "{text}"
        );
        assert!(
            text.lines()
                .any(|l| l.contains("Checksum") && l.ends_with("- correct")),
            "{text}"
        );
        let slice = Slice::whole(Arc::new(File::open(&path).unwrap()), len);
        let found = probe_region(&slice, true).unwrap();
        assert!(
            matches!(&found[..], [Finding::MdMember(md)] if md.metadata == metadata),
            "{metadata}: {found:?}"
        );
    }
}

/// A read-only loop device over part of a file, detached on drop.
fn attach(file: &Path, offset: u64, size: Option<u64>) -> LoopDevice {
    let options = LoopOptions {
        read_only: true,
        offset,
        size,
        ..LoopOptions::default()
    };
    LoopDevice::attach(file, &options)
}

fn loop_ok() -> bool {
    have_loop_devices(&ingot_testkit::skip::current_test())
}

#[test]
fn lvm_label_passes_pvck_and_pvs() {
    if !loop_ok() || skip_without(&["pvck", "pvs"]) {
        return;
    }
    with_machine("lvm-target", |m| {
        let r = report(m, "sdb");
        let p = region(&r, "sda1").partition.clone().unwrap();
        let dev = attach(&m.m.images["sda"], p.offset, Some(p.size));
        let (ok, text) = output(Command::new("pvck").arg(dev.path()));
        assert!(ok, "pvck: {text}");
        assert!(
            text.contains("Found label on") && text.contains("type=LVM2 001"),
            "{text}"
        );
        assert!(
            text.contains("Found text metadata area: offset=4096"),
            "{text}"
        );
        let (ok, text) = output(Command::new("pvs").args([
            "--devices",
            dev.as_str(),
            "--noheadings",
            "-o",
            "pv_name,pv_uuid,pv_fmt",
        ]));
        assert!(ok, "pvs: {text}");
        assert!(
            text.contains("Xq3Rtc-7bKf-8sLm-2PqW-Vn4d-Hy6J-Zt1uQe"),
            "{text}"
        );
        assert!(text.contains("lvm2"), "{text}");
    });
}

#[test]
fn read_speed_and_guard_on_a_loop_device() {
    if !loop_ok() {
        return;
    }
    with_machine("cpu-worker", |m| {
        let dev = attach(&m.m.images["sda"], 0, None);
        let name = dev.name();
        // The real machine's sysfs: a loop device is left out of the disk list, but may be
        // targeted by name.
        let real = Sysroot::default();
        let facts = detect(&real).unwrap();
        assert!(facts.disk(name).is_none());
        let t = resolve_targets(&real, &facts, name).unwrap();
        assert_eq!(t[0].size_bytes, 512 << 20);
        // The whole 512 MiB within the window: a generous one, so that a loaded machine (a full
        // run read 500 MB in its first second here) still reads to the end; no timing is
        // asserted.
        let r = gate_read_speed(&t[0], 1, Duration::from_secs(120)).unwrap();
        match r.detail {
            GateDetail::ReadSpeed(s) => {
                assert!(s.direct && s.reached_end && s.bytes == 512 << 20, "{s:?}")
            }
            other => panic!("{other:?}"),
        }
        let err = gate_read_speed(&t[0], u64::MAX / 4, Duration::from_millis(200)).unwrap_err();
        assert_eq!(err.reason, Reason::DiskTooSlow);
    });
}

#[test]
fn an_os_inside_a_raid1_member_is_found() {
    if skip_without(&["mkfs.ext4"]) {
        return;
    }
    // A RAID1 member (metadata 1.2) keeps a plain copy of the array from data_offset (1 MiB):
    // a root filesystem there boots like any other, so the guard looks inside.
    let tmp = tempfile::tempdir().unwrap();
    let tree = tmp.path().join("tree/etc");
    std::fs::create_dir_all(&tree).unwrap();
    std::fs::write(
        tree.join("os-release"),
        "PRETTY_NAME=\"Rocky Linux 9.4 (Blue Onyx)\"\n",
    )
    .unwrap();
    let fs = tmp.path().join("fs.img");
    File::create(&fs).unwrap().set_len(16 << 20).unwrap();
    let (ok, text) = output(
        Command::new("mkfs.ext4")
            .args(["-q", "-F", "-d"])
            .arg(tmp.path().join("tree"))
            .arg(&fs),
    );
    assert!(ok, "{text}");
    let member = tmp.path().join("member.img");
    let len: u64 = 24 << 20;
    let f = File::create(&member).unwrap();
    f.set_len(len).unwrap();
    let params = MdV1Params {
        metadata: "1.2".into(),
        array_uuid: [0x33; 16],
        device_uuid: [0x44; 16],
        name: "rescue:2".into(),
        level: 1,
        raid_disks: 2,
        dev_number: 0,
        time: 1_700_000_000,
        clean: true,
    };
    let (at, sb) = write_md_v1(&params, len).unwrap();
    std::os::unix::fs::FileExt::write_all_at(&f, &sb, at).unwrap();
    std::os::unix::fs::FileExt::write_all_at(&f, &std::fs::read(&fs).unwrap(), 1 << 20).unwrap();
    let slice = Slice::whole(Arc::new(File::open(&member).unwrap()), len);
    let found = probe_region(&slice, true).unwrap();
    assert!(
        found.contains(&Finding::LinuxRoot {
            pretty_name: "Rocky Linux 9.4 (Blue Onyx)".into()
        }),
        "{found:?}"
    );
    assert!(
        found.iter().any(|f| matches!(f, Finding::MdMember(_))),
        "{found:?}"
    );
}
