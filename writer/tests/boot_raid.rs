//! A dedicated server with two disks, as CAPH provisions it (`rootDeviceHints.raid` names both
//! WWNs): the writer writes the whole layout to each disk and makes `var` an md RAID1 mirror
//! across them (`docs/boot-contract.md`, "several disks"). Each disk then boots alone under QEMU
//! with OVMF (the other one pulled): every layer verified by dm-verity, `var` assembled by the
//! initramfs' real mdadm from the one member present (degraded), formatted on first boot and
//! mounted read-write, the end marker reached; the disk that is not attached is byte-identical
//! afterwards. Then a second CAPH run over the finished node writes a new release of the stack,
//! and the machine, both disks attached, boots the new stack with `var` complete.
//!
//! Uses the boot fixture stack (`tests/boot/`). Needs root (the writer's machine checks),
//! qemu-system-x86_64, OVMF, docker-registry, mdadm and the tools `build-stack.sh` names;
//! skipped with a message without them, except in CI, where a missing piece fails the test.

mod common;

use std::fs;
use std::path::Path;

use common::boot::{
    assert_good_boot, assert_var_mirror, boot, boot_disks, publish, republish, var_members, write,
    write_machine,
};
use ingot_testkit::digest::sha256_file;
use ingot_testkit::qemu::OVMF_CODE;
use ingot_testkit::skip::{have_file, have_root, have_tools};

const TOKEN: &str = "ghp_ingotBootRaidToken0123456789abcdef";
const DEVICES: &str = "0x5002538e40a1b2c3 0x5002538e40a1b2c4";
const DATA: &str = "cloud-config-worker-join.yaml";
const NAME: &str = "raid-worker-1";
/// The fixture has `/dev/kvm` and UEFI: the worker gets the kata layer.
const LAYERS: &[&str] = &["base", "kata"];
const NOT: &[&str] = &["control-plane", "nvidia"];

fn usable(test: &str) -> bool {
    have_root(test)
        && have_tools(test, &["qemu-system-x86_64", "docker-registry", "mdadm"])
        && have_file(test, Path::new(OVMF_CODE))
}

fn sha(path: &Path) -> String {
    sha256_file(path).unwrap()
}

#[test]
fn two_disk_node_boots_from_either_disk_alone_and_rewritten_boots_the_new_stack() {
    if !usable(ingot_testkit::test_name!()) {
        return;
    }
    let p = publish(TOKEN);
    let mut w = write_machine(&p, TOKEN, "two-disk", "sda", DEVICES, DATA, NAME);
    let members = var_members(&w.cmdline);
    assert_eq!(members.len(), 2, "{}", w.cmdline);
    let (sda, sdb) = (w.images["sda"].clone(), w.images["sdb"].clone());

    // Each disk alone, the other pulled (and untouched).
    for (disk, other, missing) in [("sda", &sdb, &members[1]), ("sdb", &sda, &members[0])] {
        w.select(disk);
        let other_before = sha(other);
        let console = boot(&w, &format!("{disk}-alone"));
        assert_good_boot(&p, &w, &console, NAME, LAYERS, NOT);
        let gone = format!("ingot: var: member PARTUUID {missing} missing, going on without it\n");
        assert!(console.contains(&gone), "missing {gone:?}:\n{console}");
        assert_var_mirror(&console, 1, 2, "degraded");
        assert_eq!(
            sha(other),
            other_before,
            "{disk} alone changed the other disk"
        );
    }

    // A new release over the finished node, CAPH-style: the base layer changes, so does its root
    // hash; the machine boots it with both disks, var whole again (and fresh).
    let p2 = republish(&p, TOKEN, "2.0.0", |trees| {
        fs::write(trees.join("base/etc/ingot/release"), "2.0.0\n").unwrap();
    });
    let old_base = &p.stack.layers[0].1;
    let new_base = &p2.stack.layers[0].1;
    assert_ne!(old_base, new_base);
    let w = write(&p2, TOKEN, w.into_machine(), "sda", DEVICES, DATA, NAME);
    assert_eq!(w.arg("ingot.stack="), "bootfix:2.0.0");
    assert_eq!(&w.layers[0].1, new_base);
    let console = boot_disks(&[&sda, &sdb], "rewritten");
    assert_good_boot(&p2, &w, &console, NAME, LAYERS, NOT);
    assert!(
        console.contains("ingot: stack bootfix:2.0.0\n"),
        "{console}"
    );
    assert!(!console.contains(old_base.as_str()), "{console}");
    assert_var_mirror(&console, 2, 2, "complete");
}
