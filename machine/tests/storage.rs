//! Servers installed before: installimage's software RAID1 (and LVM) living only on the target
//! disks is torn down, storage reaching another disk stops the run; the teardown commands the
//! writer would run. Every check leaves the disk images byte-identical (`with_machine`, and
//! digests for the loop-device tests).

mod common;

use std::path::{Path, PathBuf};
use std::process::Command;

use common::with_machine;
use ingot_machine::guard::{write_md_v1, Finding, MdV1Params};
use ingot_machine::*;
use ingot_testkit::loopdev::{LoopDevice, LoopOptions};
use ingot_testkit::skip::{have_loop_devices, have_tools};

fn targets(m: &common::Machine, spec: &str) -> Vec<Disk> {
    resolve_targets(&m.m.sysroot(), &m.facts, spec).unwrap_or_else(|e| panic!("{spec}: {e}"))
}

#[test]
fn installimage_raid1_on_the_targets_is_torn_down() {
    with_machine("installimage-raid1", |m| {
        let t = targets(m, "sda sdb");
        let r = guard(&m.facts, &t, &GuardOptions::default()).unwrap();
        let arrays: Vec<(&str, &[String])> = r
            .teardown
            .md_arrays
            .iter()
            .map(|a| (a.uuid.as_str(), a.members.as_slice()))
            .collect();
        assert_eq!(
            arrays,
            [
                (
                    "1b2c3d4e:5f607182:93a4b5c6:d7e8f901",
                    &["sda1".to_string(), "sdb1".into()][..]
                ),
                (
                    "2c3d4e5f:60718293:a4b5c6d7:e8f90112",
                    &["sda2".to_string(), "sdb2".into()][..]
                ),
                (
                    "3d4e5f60:718293a4:b5c6d7e8:f9011223",
                    &["sda3".to_string(), "sdb3".into()][..]
                ),
            ]
        );
        assert_eq!(
            r.teardown.regions,
            ["sda1", "sda2", "sda3", "sdb1", "sdb2", "sdb3"]
        );
        // The OS inside the mirror was seen (and is replaced, being on targets).
        let sda3 = &r.disks[0].regions[3];
        assert!(
            sda3.findings
                .iter()
                .any(|f| matches!(f, Finding::LinuxRoot { pretty_name } if pretty_name == "Ubuntu 24.04.1 LTS")),
            "{:?}",
            sda3.findings
        );
        let torn: Vec<&Warning> = r
            .warnings
            .iter()
            .filter(|w| w.reason == Reason::StorageTornDown)
            .collect();
        assert_eq!(torn.len(), 3, "{:?}", r.warnings);

        // The rescue system assembled md126 (sda2, sdb2) and md127 (sda3, sdb3): each is emptied
        // and stopped, then every member's signatures cleared.
        let steps = teardown::plan(&m.m.sysroot(), &t, &r.teardown).unwrap();
        let lines: Vec<String> = steps.iter().map(|s| s.command_line()).collect();
        assert_eq!(
            lines,
            [
                "wipefs --all --force /dev/md126",
                "mdadm --stop /dev/md126",
                "wipefs --all --force /dev/md127",
                "mdadm --stop /dev/md127",
                "wipefs --all --force /dev/sda1",
                "wipefs --all --force /dev/sda2",
                "wipefs --all --force /dev/sda3",
                "wipefs --all --force /dev/sdb1",
                "wipefs --all --force /dev/sdb2",
                "wipefs --all --force /dev/sdb3",
            ]
        );
        assert_eq!(teardown::tools(&steps), ["mdadm", "wipefs"]);
    });
}

#[test]
fn installimage_raid1_reaching_another_disk_stops_untouched() {
    with_machine("installimage-raid1", |m| {
        let t = targets(m, "sda");
        let err = guard(&m.facts, &t, &GuardOptions::default()).unwrap_err();
        assert_eq!(err.reason, Reason::MdSpansDisks);
        assert_eq!(err.disk.as_deref(), Some("sdb"));
        assert!(
            err.message.contains("1b2c3d4e:5f607182:93a4b5c6:d7e8f901")
                && err.message.contains("targets (sda1)")
                && err.message.contains("other disks (sdb1)"),
            "{err}"
        );
        // The running arrays say the same, should the superblocks not: md126 uses sda2 and sdb2.
        let err = teardown::plan(&m.m.sysroot(), &t, &Teardown::default()).unwrap_err();
        assert_eq!(err.reason, Reason::MdSpansDisks);
        assert!(
            err.message.contains("md126") && err.message.contains("sda2, sdb2"),
            "{err}"
        );
    });
}

#[test]
fn a_mounted_target_stops_the_teardown_before_it_runs() {
    with_machine("installimage-raid1", |m| {
        let t = targets(m, "sda sdb");
        let r = guard(&m.facts, &t, &GuardOptions::default()).unwrap();
        let proc = m.m.root.join("proc/mounts");
        std::fs::write(&proc, "/dev/sdb2 /mnt ext4 rw 0 0\n").unwrap();
        let err = teardown::plan(&m.m.sysroot(), &t, &r.teardown).unwrap_err();
        std::fs::remove_file(&proc).unwrap();
        assert_eq!(err.reason, Reason::TeardownFailed);
        assert_eq!(err.disk.as_deref(), Some("sdb2"));
        assert!(err.message.contains("mounted at /mnt"), "{err}");
    });
}

/// A loop device over a file from `offset` (read-write: pvcreate writes), detached on drop.
fn attach(file: &Path, offset: u64) -> LoopDevice {
    let options = LoopOptions {
        offset,
        ..LoopOptions::default()
    };
    LoopDevice::attach(file, &options)
}

/// Runs an LVM command restricted to `devs` (so the host's LVM devices file and other disks
/// are left alone).
fn lvm(cmd: &str, devs: &[&LoopDevice], args: &[&str]) {
    let mut c = Command::new(cmd);
    for d in devs {
        c.args(["--devices", d.as_str()]);
    }
    let out = c.args(args).output().unwrap();
    assert!(out.status.success(), "{cmd} {args:?}: {out:?}");
}

fn disk_files(dir: &Path, n: usize) -> Vec<PathBuf> {
    (0..n)
        .map(|i| {
            let p = dir.join(format!("disk{i}.img"));
            std::fs::File::create(&p)
                .unwrap()
                .set_len(64 << 20)
                .unwrap();
            p
        })
        .collect()
}

fn sha(p: &Path) -> String {
    ingot_testkit::digest::sha256_file(p).unwrap()
}

/// The guard over loop devices `targets` plus the other loops as further disks of the machine.
fn guard_loops(
    targets: &[&LoopDevice],
    others: &[&LoopDevice],
) -> Result<GuardReport, GateFailure> {
    let real = Sysroot::default();
    let mut facts = detect(&real).unwrap();
    // Only the loop devices: this host's own disks are no part of the test.
    facts.disks.clear();
    let names = |l: &[&LoopDevice]| {
        l.iter()
            .map(|d| d.name().to_string())
            .collect::<Vec<_>>()
            .join(" ")
    };
    let t = resolve_targets(&real, &facts, &names(targets)).unwrap();
    if !others.is_empty() {
        facts
            .disks
            .extend(resolve_targets(&real, &facts, &names(others)).unwrap());
    }
    guard(&facts, &t, &GuardOptions::default())
}

fn lvm_ok() -> bool {
    let test = ingot_testkit::skip::current_test();
    have_loop_devices(&test) && have_tools(&test, &["pvcreate", "vgcreate"])
}

#[test]
fn volume_groups_made_by_lvm_are_followed_across_disks() {
    if !lvm_ok() {
        return;
    }
    let dir = tempfile::tempdir().unwrap();
    let files = disk_files(dir.path(), 3);
    let (a, b, c) = (
        attach(&files[0], 0),
        attach(&files[1], 0),
        attach(&files[2], 0),
    );
    lvm(
        "pvcreate",
        &[&a, &b, &c],
        &["-y", a.as_str(), b.as_str(), c.as_str()],
    );
    lvm("vgcreate", &[&a, &b], &["ingotvg0", a.as_str(), b.as_str()]);
    let before: Vec<String> = files.iter().map(|f| sha(f)).collect();

    // Both PVs targeted: the VG is torn down.
    let r = guard_loops(&[&a, &b], &[&c]).unwrap();
    assert_eq!(r.teardown.volume_groups.len(), 1, "{:?}", r.teardown);
    let vg = &r.teardown.volume_groups[0];
    assert_eq!(vg.name, "ingotvg0");
    let mut pvs = vec![a.name().to_string(), b.name().to_string()];
    pvs.sort();
    assert_eq!(vg.pvs, pvs);
    // c is an orphan PV on no target: nothing to do with it.
    assert!(!r
        .teardown
        .regions
        .iter()
        .any(|x| c.as_str().ends_with(x.as_str())));

    // Only one of its PVs targeted, the other on a disk we keep: stop, naming that disk.
    let err = guard_loops(&[&a], &[&b, &c]).unwrap_err();
    assert_eq!(err.reason, Reason::LvmOnTarget);
    assert_eq!(err.disk.as_deref(), Some(b.name()));
    assert!(err.message.contains("ingotvg0"), "{err}");

    // The other PV on no disk the machine shows: stop as well.
    let err = guard_loops(&[&a], &[]).unwrap_err();
    assert_eq!(err.reason, Reason::LvmOnTarget);
    assert!(
        err.message.contains("no disk of this machine shows"),
        "{err}"
    );

    let after: Vec<String> = files.iter().map(|f| sha(f)).collect();
    assert_eq!(before, after, "the guard changed a disk");
}

#[test]
fn lvm_inside_an_installimage_mirror_is_found() {
    if !lvm_ok() {
        return;
    }
    let dir = tempfile::tempdir().unwrap();
    let files = disk_files(dir.path(), 2);
    // Whole-disk RAID1 members (metadata 1.2, data at 1 MiB) written from the format (no md
    // driver here), the PV made by pvcreate/vgcreate inside the first member's data, then
    // mirrored to the second as md would.
    let uuid = guard::parse_md_uuid("4e5f6071:8293a4b5:c6d7e8f9:0a1b2c3d").unwrap();
    for (i, f) in files.iter().enumerate() {
        let (at, sb) = write_md_v1(
            &MdV1Params {
                metadata: "1.2".into(),
                array_uuid: uuid,
                device_uuid: [i as u8 + 1; 16],
                name: "rescue:1".into(),
                level: 1,
                raid_disks: 2,
                dev_number: i as u32,
                time: 1_700_000_000,
                clean: true,
            },
            64 << 20,
        )
        .unwrap();
        std::os::unix::fs::FileExt::write_all_at(
            &std::fs::OpenOptions::new().write(true).open(f).unwrap(),
            &sb,
            at,
        )
        .unwrap();
    }
    {
        let data = attach(&files[0], 1 << 20);
        lvm("pvcreate", &[&data], &["-y", data.as_str()]);
        lvm("vgcreate", &[&data], &["vg0", data.as_str()]);
    }
    let mut head = vec![0u8; 1 << 20];
    std::os::unix::fs::FileExt::read_exact_at(
        &std::fs::File::open(&files[0]).unwrap(),
        &mut head,
        1 << 20,
    )
    .unwrap();
    std::os::unix::fs::FileExt::write_all_at(
        &std::fs::OpenOptions::new()
            .write(true)
            .open(&files[1])
            .unwrap(),
        &head,
        1 << 20,
    )
    .unwrap();

    let (a, b) = (attach(&files[0], 0), attach(&files[1], 0));
    let r = guard_loops(&[&a, &b], &[]).unwrap();
    assert_eq!(r.teardown.md_arrays.len(), 1, "{:?}", r.teardown);
    assert_eq!(r.teardown.volume_groups.len(), 1, "{:?}", r.teardown);
    assert_eq!(r.teardown.volume_groups[0].name, "vg0");
    let pv = r.disks[0].regions[0].findings.iter().find_map(|f| match f {
        Finding::LvmPv { in_md_array, .. } => in_md_array.clone(),
        _ => None,
    });
    assert_eq!(pv.as_deref(), Some("4e5f6071:8293a4b5:c6d7e8f9:0a1b2c3d"));
    // Whole-disk members: the disks themselves are cleared.
    let mut regions: Vec<String> = [&a, &b].iter().map(|d| d.name().to_string()).collect();
    regions.sort();
    let mut got = r.teardown.regions.clone();
    got.sort();
    assert_eq!(got, regions);
    // One target only: the mirror reaches the other disk.
    let err = guard_loops(&[&a], &[&b]).unwrap_err();
    assert_eq!(err.reason, Reason::MdSpansDisks);
}
