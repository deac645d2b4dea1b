//! Every fixture machine: detect, resolve targets, each gate, the guard. Each check runs on a
//! materialized machine and must leave its disk images byte-identical.

mod common;

use std::ffi::OsStr;
use std::time::Duration;

use common::with_machine;
use ingot_machine::guard::Finding;
use ingot_machine::host::{Fixture, Live};
use ingot_machine::*;

fn targets(m: &common::Machine, spec: &str) -> Vec<Disk> {
    resolve_targets(&m.m.sysroot(), &m.facts, spec).unwrap_or_else(|e| panic!("{spec}: {e}"))
}

/// The fixture machine's answers to the programs the gates run.
fn fixture(m: &common::Machine) -> Fixture {
    Fixture::new(&m.m.root)
}

#[test]
fn detect_cpu_worker() {
    with_machine("cpu-worker", |m| {
        let f = &m.facts;
        assert!(f.uefi);
        assert!(!f.nvidia_gpu, "an Intel VGA controller is no NVIDIA GPU");
        assert!(f
            .pci
            .iter()
            .any(|p| p.vendor == 0x8086 && p.class == 0x030000));
        assert!(f.cpu_virt_flags && !f.kvm_device && !f.virtualization);
        assert_eq!(f.disks.len(), 1);
        let sda = &f.disks[0];
        assert_eq!(sda.name, "sda");
        assert_eq!(sda.size_bytes, 512 << 20);
        assert_eq!(sda.logical_block_size, 512);
        assert!(!sda.rotational && !sda.removable);
        assert_eq!(sda.model.as_deref(), Some("SAMSUNG MZ7LH480"));
        assert_eq!(sda.serial.as_deref(), Some("S45PNA0M512345"));
        assert_eq!(sda.wwn.as_deref(), Some("0x5002538e40a1b2c3"));
        assert_eq!(sda.node, m.m.root.join("dev/sda"));
        // Facts go into the writer's JSON report.
        let json = serde_json::to_value(f).unwrap();
        assert_eq!(json["disks"][0]["wwn"], "0x5002538e40a1b2c3");
    });
}

#[test]
fn detect_gpu_worker() {
    with_machine("gpu-worker", |m| {
        let f = &m.facts;
        assert!(f.uefi && f.nvidia_gpu);
        let gpu = f.pci.iter().find(|p| p.is_nvidia_gpu()).unwrap();
        assert_eq!(
            (gpu.vendor, gpu.device, gpu.class),
            (0x10de, 0x2330, 0x030200)
        );
        assert!(
            f.cpu_virt_flags && !f.kvm_device && !f.virtualization,
            "svm without /dev/kvm"
        );
        let d = f.disk("nvme0n1").unwrap();
        assert_eq!(d.wwn.as_deref(), Some("eui.0025388b91b1b2c3"));
        assert_eq!(d.serial.as_deref(), Some("S64HNE0T123456"));
        assert_eq!(d.model.as_deref(), Some("SAMSUNG MZQL23T8HCLS-00A07"));
    });
}

#[test]
fn detect_kvm_control_plane_and_bios_only() {
    with_machine("kvm-control-plane", |m| {
        let f = &m.facts;
        assert!(f.uefi && !f.nvidia_gpu && f.cpu_virt_flags && f.kvm_device && f.virtualization);
        let names: Vec<&str> = f.disks.iter().map(|d| d.name.as_str()).collect();
        assert_eq!(names, ["sda", "sdb"]);
        // sdb has no udev entry: its WWN comes from sysfs device/wwid, spelled as lsblk does.
        assert_eq!(
            f.disk("sdb").unwrap().wwn.as_deref(),
            Some("0x500a0751e1234568")
        );
    });
    with_machine("bios-only", |m| {
        let f = &m.facts;
        assert!(!f.uefi && f.virtualization);
        assert!(f.disk("sda").unwrap().rotational);
    });
}

#[test]
fn resolve_by_name_and_every_wwn_spelling() {
    with_machine("kvm-control-plane", |m| {
        for spec in [
            "sda",
            "/dev/sda",
            "0x500a0751e1234567",
            "0x500A0751E1234567",
            "naa.500a0751e1234567",
            "wwn-0x500a0751e1234567",
            "/dev/disk/by-id/wwn-0x500a0751e1234567",
        ] {
            let t = targets(m, spec);
            assert_eq!(t.len(), 1, "{spec}");
            assert_eq!(t[0].name, "sda", "{spec}");
        }
        // sdb: sysfs only.
        assert_eq!(targets(m, "0x500a0751e1234568")[0].name, "sdb");
        let both: Vec<String> = targets(m, "sdb 0x500a0751e1234567")
            .into_iter()
            .map(|d| d.name)
            .collect();
        assert_eq!(both, ["sdb", "sda"]);
        // A disk named twice, by name or by its WWN, is refused naming both tokens.
        for (spec, token, earlier) in [
            ("sdb 0x500a0751e1234567 sdb", "sdb", "sdb"),
            (
                "sda /dev/sdb naa.500a0751e1234567",
                "naa.500a0751e1234567",
                "sda",
            ),
        ] {
            let err = resolve_targets(&m.m.sysroot(), &m.facts, spec).unwrap_err();
            assert_eq!(err.reason, Reason::BadTarget, "{spec}: {err}");
            assert_eq!(err.disk.as_deref(), Some(token), "{spec}");
            assert!(
                err.message
                    .contains(&format!("which {earlier:?} already named")),
                "{spec}: {err}"
            );
        }

        let err = resolve_targets(&m.m.sysroot(), &m.facts, "0x5000c500deadbeef").unwrap_err();
        assert_eq!(err.reason, Reason::DiskNotFound);
        assert_eq!(err.disk.as_deref(), Some("0x5000c500deadbeef"));
        assert!(
            err.message
                .contains("sda (536870912 bytes, wwn 0x500a0751e1234567)"),
            "{err}"
        );
        assert!(
            err.message
                .contains("sdb (67108864 bytes, wwn 0x500a0751e1234568)"),
            "{err}"
        );
        let err = resolve_targets(&m.m.sysroot(), &m.facts, "sdz").unwrap_err();
        assert_eq!(err.reason, Reason::DiskNotFound);
        let err = resolve_targets(&m.m.sysroot(), &m.facts, "  ").unwrap_err();
        assert_eq!(err.reason, Reason::DiskNotFound);
    });
    with_machine("gpu-worker", |m| {
        for spec in [
            "nvme0n1",
            "eui.0025388b91b1b2c3",
            "nvme-eui.0025388B91B1B2C3",
        ] {
            assert_eq!(targets(m, spec)[0].name, "nvme0n1", "{spec}");
        }
    });
}

#[test]
fn gate_uefi_and_tools() {
    with_machine("cpu-worker", |m| assert!(gate_uefi(&m.facts).is_ok()));
    with_machine("bios-only", |m| {
        assert_eq!(gate_uefi(&m.facts).unwrap_err().reason, Reason::NotUefi);
    });
    let err = gate_tools(&["sgdisk", "mkfs.fat"], Some(OsStr::new(""))).unwrap_err();
    assert_eq!(err.reason, Reason::ToolsMissing);
    assert!(err.message.contains("sgdisk") && err.message.contains("mkfs.fat"));
    assert!(gate_tools(&["sh"], Some(OsStr::new("/usr/bin:/bin"))).is_ok());
}

#[test]
fn gate_size_passes_and_fails() {
    with_machine("cpu-worker", |m| {
        let sda = &targets(m, "sda")[0];
        assert!(gate_size(sda, 512 << 20).is_ok());
        let err = gate_size(sda, (512 << 20) + 1).unwrap_err();
        assert_eq!(err.reason, Reason::DiskTooSmall);
        assert_eq!(err.disk.as_deref(), Some("sda"));
    });
}

#[test]
fn gate_smart_from_captured_json() {
    with_machine("cpu-worker", |m| {
        let r = gate_smart(&targets(m, "sda")[0], &fixture(m)).unwrap();
        assert!(r.warnings.is_empty(), "{:?}", r.warnings);
        assert!(matches!(
            r.detail,
            GateDetail::Smart {
                passed: Some(true),
                ..
            }
        ));
    });
    with_machine("gpu-worker", |m| {
        let r = gate_smart(&targets(m, "nvme0n1")[0], &fixture(m)).unwrap();
        assert!(r.warnings.is_empty(), "{:?}", r.warnings);
        match &r.detail {
            GateDetail::Smart { passed, model, .. } => {
                assert_eq!(*passed, Some(true));
                assert_eq!(model.as_deref(), Some("SAMSUNG MZQL23T8HCLS-00A07"));
            }
            other => panic!("{other:?}"),
        }
    });
    with_machine("failing-disk", |m| {
        let err = gate_smart(&targets(m, "sda")[0], &fixture(m)).unwrap_err();
        assert_eq!(err.reason, Reason::SmartFailing);
        assert_eq!(err.disk.as_deref(), Some("sda"));
    });
    with_machine("bios-only", |m| {
        // Behind a RAID controller smartctl cannot open the disk: a warning, not a stop.
        let r = gate_smart(&targets(m, "sda")[0], &fixture(m)).unwrap();
        assert_eq!(r.warnings.len(), 1);
        assert_eq!(r.warnings[0].reason, Reason::SmartUnavailable);
        assert!(
            r.warnings[0].message.contains("megaraid"),
            "{:?}",
            r.warnings
        );
    });
    with_machine("kvm-control-plane", |m| {
        // No captured output at all.
        let r = gate_smart(&targets(m, "sdb")[0], &fixture(m)).unwrap();
        assert_eq!(r.warnings[0].reason, Reason::SmartUnavailable);
    });
}

#[test]
fn gate_smart_runs_smartctl_and_tolerates_it_missing() {
    with_machine("cpu-worker", |m| {
        let sda = &targets(m, "sda")[0];
        // A fixture without smartctl's output for the disk: smartctl cannot be run.
        let bare = Fixture::new(m.m.root.join("no-such-fixture"));
        let r = gate_smart(sda, &bare).unwrap();
        assert_eq!(r.warnings[0].reason, Reason::SmartUnavailable);
        if ingot_testkit::skip::have_tool(&ingot_testkit::skip::current_test(), "smartctl") {
            // A disk image is no ATA device: smartctl answers in JSON with exit status bits 0-2.
            let r = gate_smart(sda, &Live).unwrap();
            assert_eq!(
                r.warnings[0].reason,
                Reason::SmartUnavailable,
                "{:?}",
                r.warnings
            );
        }
    });
}

#[test]
fn gate_read_speed_measures_and_fails_on_an_absurd_threshold() {
    with_machine("cpu-worker", |m| {
        let sda = &targets(m, "sda")[0];
        assert_eq!(default_min_kib_s(sda), 40_000);
        let r = gate_read_speed(sda, 1, Duration::from_millis(500)).unwrap();
        match &r.detail {
            GateDetail::ReadSpeed(s) => {
                assert_eq!(s.bytes, 512 << 20, "a 512 MiB disk is read to its end");
                assert!(s.reached_end && s.kib_per_s > 0 && s.direct, "{s:?}");
            }
            other => panic!("{other:?}"),
        }
        let err = gate_read_speed(sda, u64::MAX / 4, Duration::from_millis(200)).unwrap_err();
        assert_eq!(err.reason, Reason::DiskTooSlow);
        assert_eq!(err.disk.as_deref(), Some("sda"));
    });
    with_machine("failing-disk", |m| {
        assert_eq!(
            default_min_kib_s(&targets(m, "sda")[0]),
            20_000,
            "rotational"
        );
    });
}

fn region_of<'a>(r: &'a GuardReport, name: &str) -> &'a guard::RegionScan {
    r.disks
        .iter()
        .flat_map(|d| &d.regions)
        .find(|x| x.name == name)
        .unwrap_or_else(|| panic!("no region {name}"))
}

fn guard_ok(m: &common::Machine, spec: &str) -> GuardReport {
    guard(&m.facts, &targets(m, spec), &GuardOptions::default())
        .unwrap_or_else(|e| panic!("guard {spec}: {e}"))
}

#[test]
fn guard_passes_clean_machines() {
    for (name, spec) in [
        ("cpu-worker", "sda"),
        ("gpu-worker", "nvme0n1"),
        ("bios-only", "sda"),
        ("failing-disk", "sda"),
    ] {
        with_machine(name, |m| {
            let r = guard_ok(m, spec);
            assert!(r.warnings.is_empty(), "{name}: {:?}", r.warnings);
        });
    }
    with_machine("kvm-control-plane", |m| {
        // The old install is on the target, which is overwritten; sdb holds only data.
        let r = guard_ok(m, "sda");
        let sda = r.disks.iter().find(|d| d.disk == "sda").unwrap();
        assert_eq!(sda.table, guard::TableKind::Gpt);
        let found: Vec<&Finding> = sda.regions.iter().flat_map(|r| &r.findings).collect();
        assert!(
            found
                .iter()
                .any(|f| matches!(f, Finding::EspWithEntries { .. })),
            "{found:?}"
        );
        assert!(found.contains(&&Finding::LinuxRoot {
            pretty_name: "Ubuntu 24.04.1 LTS".into()
        }));
        let sdb = r.disks.iter().find(|d| d.disk == "sdb").unwrap();
        assert_eq!(sdb.regions[1].findings, [Finding::ExtData]);
        // Targeting sdb instead leaves sda's OS in place: stop.
        let err = guard(&m.facts, &targets(m, "sdb"), &GuardOptions::default()).unwrap_err();
        assert_eq!(err.reason, Reason::ForeignOs);
        assert_eq!(err.disk.as_deref(), Some("sda"));
    });
    with_machine("bios-only", |m| {
        let r = guard_ok(m, "sda");
        assert_eq!(r.disks[0].table, guard::TableKind::Mbr);
        assert_eq!(
            r.disks[0].regions[1].findings,
            [Finding::LinuxRoot {
                pretty_name: "Debian GNU/Linux 12 (bookworm)".into()
            }]
        );
    });
}

#[test]
fn guard_stops_on_a_foreign_os_unless_allowed() {
    with_machine("foreign-os", |m| {
        let t = targets(m, "sda");
        let err = guard(&m.facts, &t, &GuardOptions::default()).unwrap_err();
        assert_eq!(err.reason, Reason::ForeignOs);
        assert_eq!(err.disk.as_deref(), Some("sdb"));
        assert!(
            err.message
                .starts_with("sdb1 holds an EFI system partition"),
            "{err}"
        );
        assert!(err.message.contains("EFI/ubuntu/shimx64.efi"), "{err}");

        let r = guard(
            &m.facts,
            &t,
            &GuardOptions {
                allow_foreign_os: true,
            },
        )
        .unwrap();
        let msgs: Vec<&str> = r.warnings.iter().map(|w| w.message.as_str()).collect();
        assert!(r.warnings.iter().all(|w| w.reason == Reason::ForeignOs));
        assert_eq!(msgs.len(), 3, "{msgs:#?}");
        assert!(msgs[1].starts_with("sdb2 holds a Linux root filesystem (Ubuntu 22.04.4 LTS)"));
        // The /boot sits in a logical partition: primaries 1-3, the extended one 4, then 5, 6.
        assert!(
            msgs[2].starts_with("sdc6 holds a /boot filesystem"),
            "{msgs:#?}"
        );
        assert!(msgs[2].contains("grub/grub.cfg") && msgs[2].contains("vmlinuz-6.8.0-45-generic"));
        let sdc = r.disks.iter().find(|d| d.disk == "sdc").unwrap();
        let names: Vec<&str> = sdc.regions.iter().map(|r| r.name.as_str()).collect();
        assert_eq!(names, ["sdc", "sdc1", "sdc2", "sdc3", "sdc5", "sdc6"]);
        assert_eq!(sdc.regions[1].findings, [Finding::ExtData]);

        // Targeting every disk with an OS is fine.
        assert!(guard(
            &m.facts,
            &targets(m, "sda sdb sdc"),
            &GuardOptions::default()
        )
        .is_ok());
    });
}

#[test]
fn guard_clears_an_orphan_pv_on_the_target() {
    with_machine("lvm-target", |m| {
        // An orphan PV on a target belongs to no volume group that could break: it is cleared.
        let r = guard_ok(m, "sda");
        assert_eq!(r.teardown.regions, ["sda1"]);
        assert!(r.teardown.volume_groups.is_empty() && r.teardown.md_arrays.is_empty());
        match &region_of(&r, "sda1").findings[..] {
            [Finding::LvmPv {
                uuid,
                volume_group: None,
                in_md_array: None,
            }] => assert_eq!(uuid, "Xq3Rtc-7bKf-8sLm-2PqW-Vn4d-Hy6J-Zt1uQe"),
            other => panic!("{other:?}"),
        }
        // A PV on a disk we do not write is none of our business.
        let r = guard_ok(m, "sdb");
        assert!(r.teardown.is_empty(), "{:?}", r.teardown);
    });
}

#[test]
fn guard_stops_on_md_spanning_target_and_other_disks() {
    with_machine("md-spanning", |m| {
        let err = guard(&m.facts, &targets(m, "sda"), &GuardOptions::default()).unwrap_err();
        assert_eq!(err.reason, Reason::MdSpansDisks);
        assert_eq!(err.disk.as_deref(), Some("sdb"));
        assert!(
            err.message.contains("3f5a2b1c:8d4e6f70:a1b2c3d4:e5f60718"),
            "{err}"
        );
        assert!(
            err.message.contains("targets (sda1)") && err.message.contains("other disks (sdb1)")
        );
        // The whole array targeted: fine.
        let r = guard_ok(m, "sda sdb");
        let member = &r.disks[0].regions[1].findings[0];
        match member {
            Finding::MdMember(md) => {
                assert_eq!(
                    (md.level, md.metadata.as_str(), md.name.as_str()),
                    (1, "1.2", "rescue:0")
                );
                assert_eq!(md.data_offset_bytes, 1 << 20);
            }
            other => panic!("{other:?}"),
        }
    });
}

/// Issue "hostile input, second pass", item 16: a partition given as a target (sysfs shows it
/// as one: `/sys/class/block/sda1` with a `partition` file, inside sda's directory) is refused
/// naming its disk; a WWN two disks share is refused naming both.
#[test]
fn a_partition_or_a_shared_wwn_is_no_target() {
    with_machine("two-disk", |m| {
        let root = &m.m.root;
        let part = root.join("sys/block/sda/sda1");
        std::fs::create_dir_all(&part).unwrap();
        std::fs::write(part.join("partition"), "1\n").unwrap();
        std::fs::create_dir_all(root.join("sys/class/block")).unwrap();
        std::os::unix::fs::symlink("../../block/sda/sda1", root.join("sys/class/block/sda1"))
            .unwrap();
        for spec in ["sda1", "/dev/sda1", "sdb sda1"] {
            let err = resolve_targets(&m.m.sysroot(), &m.facts, spec).unwrap_err();
            assert_eq!(err.reason, Reason::BadTarget, "{spec}: {err}");
            assert_eq!(err.reason.as_str(), "bad-target");
            assert!(
                err.message
                    .contains("is a partition of disk sda, not a whole disk"),
                "{spec}: {err}"
            );
        }

        let mut facts = m.facts.clone();
        let sda_ids = facts.disks[0].identifiers.clone();
        facts.disks[1].identifiers = sda_ids;
        let err = resolve_targets(&m.m.sysroot(), &facts, "0x5002538e40a1b2c3").unwrap_err();
        assert_eq!(err.reason, Reason::BadTarget, "{err}");
        assert!(err.message.contains("matches 2 disks"), "{err}");
        assert!(
            err.message.contains("sda (") && err.message.contains("sdb ("),
            "{err}"
        );
        // Either disk by name still resolves.
        assert_eq!(targets(m, "sdb sda").len(), 2);
    });
}

/// The IEEE CRC-32 GPT headers carry.
fn crc32(bytes: &[u8]) -> u32 {
    let mut crc = !0u32;
    for &b in bytes {
        crc ^= u32::from(b);
        for _ in 0..8 {
            crc = if crc & 1 != 0 {
                (crc >> 1) ^ 0xEDB8_8320
            } else {
                crc >> 1
            };
        }
    }
    !crc
}

/// Sets the entry count of the GPT header at byte `at` of `image` and fixes the header's CRC,
/// so only the count is wrong.
fn bogus_entry_count(image: &std::path::Path, at: u64, count: u32) {
    use std::os::unix::fs::FileExt;
    let f = std::fs::OpenOptions::new()
        .read(true)
        .write(true)
        .open(image)
        .unwrap();
    let mut h = [0u8; 92];
    f.read_exact_at(&mut h, at).unwrap();
    assert_eq!(&h[..8], b"EFI PART");
    h[80..84].copy_from_slice(&count.to_le_bytes());
    h[16..20].fill(0);
    let crc = crc32(&h);
    h[16..20].copy_from_slice(&crc.to_le_bytes());
    f.write_all_at(&h, at).unwrap();
}

/// Item 17: sdb's primary GPT claims 2^28 entries (its CRC correct): the guard reads the
/// backup table and still finds the Ubuntu install; with both headers bogus it stops, since
/// what the disk holds cannot be told.
#[test]
fn a_bogus_gpt_entry_count_does_not_hide_a_foreign_os() {
    let Some(m) = common::machine("foreign-os") else {
        return;
    };
    let sdb = m.m.images["sdb"].clone();
    bogus_entry_count(&sdb, 512, 1 << 28);
    let t = targets(&m, "sda");
    let err = guard(&m.facts, &t, &GuardOptions::default()).unwrap_err();
    assert_eq!(err.reason, Reason::ForeignOs, "{err}");
    assert!(
        err.message
            .starts_with("sdb1 holds an EFI system partition"),
        "{err}"
    );
    let allowed = GuardOptions {
        allow_foreign_os: true,
    };
    let r = guard(&m.facts, &t, &allowed).unwrap();
    let note = r
        .warnings
        .iter()
        .find(|w| w.reason == Reason::DiskUnreadable)
        .expect("a warning about sdb's primary GPT");
    assert!(
        note.message.contains("claims 268435456 partition entries")
            && note.message.contains("read the backup GPT instead"),
        "{}",
        note.message
    );

    let len = std::fs::metadata(&sdb).unwrap().len();
    bogus_entry_count(&sdb, len - 512, 1 << 28);
    let err = guard(&m.facts, &t, &GuardOptions::default()).unwrap_err();
    assert_eq!(err.reason, Reason::DiskUnreadable, "{err}");
    assert_eq!(err.disk.as_deref(), Some("sdb"));
    assert!(
        err.message.contains("the primary GPT header claims")
            && err.message.contains("the backup GPT header claims")
            && err.message.contains("cannot be told"),
        "{err}"
    );
    // Targeted, the disk is wiped anyway: a warning (sdc's /boot is targeted too).
    let all = targets(&m, "sda sdb sdc");
    let r = guard(&m.facts, &all, &GuardOptions::default()).unwrap();
    assert!(r
        .warnings
        .iter()
        .any(|w| w.reason == Reason::DiskUnreadable));
}
