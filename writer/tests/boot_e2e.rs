//! End to end: a disk written by ingot-writer, run as cluster-api-provider-hetzner runs it, boots
//! under QEMU with UEFI firmware (OVMF, TCG). The fixture stack (`tests/boot/build-stack.sh`:
//! Debian's kernel, busybox, systemd-boot, an initramfs running `boot/initramfs-tools/scripts/ingot`,
//! the implementation of `docs/boot-contract.md` a real base's initrd runs) is
//! built with the `ingot` library, published to a real docker-registry behind a token-checking
//! front, and written to fixture machines' disks. The serial console must show every selected
//! layer verified with the root hash on the ESP's command line, the per-node hostname and a file
//! from the sealed node layer, and the end marker; a flipped byte in the base or the node
//! partition must stop the boot with the kernel's dm-verity corruption message.
//!
//! Needs root (the writer's machine checks), qemu-system-x86_64, OVMF, docker-registry and the
//! tools `build-stack.sh` names; skipped with a message without root or qemu, except in CI, where
//! a missing piece fails the test.

mod common;

use std::fs;
use std::path::Path;
use std::process::Command;

use common::boot::{assert_good_boot, boot, publish, run_ok, write_machine, Written, END, FAILED};
use common::flip;
use ingot_testkit::qemu::OVMF_CODE;
use ingot_testkit::skip::{have_file, have_root, have_tools};

const TOKEN: &str = "ghp_ingotBootE2eToken0123456789abcdef";

fn usable(test: &str) -> bool {
    have_root(test)
        && have_tools(test, &["qemu-system-x86_64", "docker-registry"])
        && have_file(test, Path::new(OVMF_CODE))
}

/// The file system block that holds byte 0 of `path` in an ext4 image (debugfs `bmap`).
fn block_of(fs_image: &Path, path: &str) -> u64 {
    let out = run_ok(
        Command::new("debugfs")
            .arg("-R")
            .arg(format!("bmap {path} 0"))
            .arg(fs_image),
    );
    let text = String::from_utf8_lossy(&out.stdout);
    let block: u64 = text
        .trim()
        .parse()
        .unwrap_or_else(|_| panic!("debugfs bmap {path}: {text:?}"));
    assert!(block > 0, "{path} has no data block (inline?)");
    block
}

/// One flipped byte in a data block of `layer`'s partition (the first block of `file`): the
/// boot stops with the kernel's dm-verity corruption message for that block and the failure
/// marker. The byte is restored afterwards.
fn assert_tamper_stops_boot(w: &Written, layer: &str, label: &str, file: &str) {
    let fs_image = w.extract(label);
    let block = block_of(&fs_image, file);
    let (start, _) = w.part(label);
    let offset = start + block * 4096 + 17;
    flip(&w.image, offset);
    let console = boot(w, &format!("tampered-{layer}"));
    flip(&w.image, offset);
    // The data partition's device number, as the initramfs printed it; the kernel names it.
    let opened = format!("ingot: layer {layer} data ");
    let line = console
        .lines()
        .find(|l| l.starts_with(&opened))
        .unwrap_or_else(|| panic!("layer {layer} not opened:\n{console}"));
    let majmin = line
        .split(['(', ')'])
        .nth(1)
        .unwrap_or_else(|| panic!("{line}"));
    let kernel = format!("device-mapper: verity: {majmin}: data block {block} is corrupted");
    assert!(console.contains(&kernel), "missing {kernel:?}:\n{console}");
    assert!(
        console.contains(&format!("{FAILED}: layer {layer}: ")),
        "{console}"
    );
    assert!(
        !console.contains(&format!("ingot: layer {layer} verified")),
        "{console}"
    );
    assert!(!console.contains(END), "{console}");
    assert!(!console.contains("ingot-node: hostname"), "{console}");
}

/// The worker (base only) and the control plane (base, control-plane, kata) are written and
/// booted side by side; the worker's disk is then tampered with, once in the base layer and
/// once in the node layer, and booted again after each flip is undone.
#[test]
fn written_disks_boot_verified_and_tampering_stops_them() {
    if !usable(ingot_testkit::test_name!()) {
        return;
    }
    let p = publish(TOKEN);
    std::thread::scope(|s| {
        let p = &p;
        s.spawn(move || {
            let w = write_machine(
                p,
                TOKEN,
                "kvm-control-plane",
                "sda",
                "sda",
                "cloud-config-controlplane-init.yaml",
                "cp-1",
            );
            let console = boot(&w, "control-plane");
            assert_good_boot(
                p,
                &w,
                &console,
                "cp-1",
                &["base", "control-plane", "kata"],
                &["nvidia"],
            );
        });
        s.spawn(move || {
            let w = write_machine(
                p,
                TOKEN,
                "cpu-worker",
                "sda",
                "0x5002538e40a1b2c3",
                "cloud-config-worker-join.yaml",
                "worker-7",
            );
            let console = boot(&w, "worker");
            assert_good_boot(
                p,
                &w,
                &console,
                "worker-7",
                &["base"],
                &["control-plane", "nvidia", "kata"],
            );
            assert!(
                console.contains("formatting it (first boot)"),
                "var formatted on first boot:\n{console}"
            );
            assert_tamper_stops_boot(&w, "base", "ingot-base", "/sbin/init");
            assert_tamper_stops_boot(&w, "node", "ingot-node", "/etc/ingot/node.json");
            // Restored, it boots again (var keeps its file system).
            let again = boot(&w, "worker-again");
            assert!(again.contains(&format!("{END}\n")), "{again}");
            assert!(!again.contains(FAILED), "{again}");
            assert!(!again.contains("formatting it"), "{again}");
        });
    });
}

/// Rewrites the `options` line of the disk's ESP loader entry (mtools, as an attacker with the
/// ESP would): the ESP is not covered by dm-verity, the initramfs is what refuses a bad line.
fn set_loader_options(w: &Written, options: &str) {
    let (esp, _) = w.part("ESP");
    let at = format!("{}@@{esp}", w.image.display());
    let out = run_ok(
        Command::new("mtype")
            .args(["-i", &at])
            .arg("::/loader/entries/ingot.conf"),
    );
    let entry = String::from_utf8(out.stdout).unwrap();
    let edited: String = entry
        .lines()
        .map(|l| {
            if l.starts_with("options ") {
                format!("options {options}\n")
            } else {
                format!("{l}\n")
            }
        })
        .collect();
    assert_ne!(edited, entry, "no options line:\n{entry}");
    let file = w.dir.path().join("ingot.conf");
    fs::write(&file, edited).unwrap();
    run_ok(
        Command::new("mcopy")
            .args(["-o", "-i", &at])
            .arg(&file)
            .arg("::/loader/entries/ingot.conf"),
    );
}

/// Boot contract v3 on the fixture stack (it boots through the same `scripts/ingot`): var, /etc
/// and /opt/cni/bin are mounted nosuid,nodev, /opt is read-only; then the ESP's loader entry is
/// edited, once to carry a second `ingot.layers=` (an attacker's own layer list after the real
/// one, which version 2 took), once with the base's root hash in upper case: neither boots, and
/// the console says why before any layer is opened.
#[test]
fn places_are_v3_and_an_edited_command_line_does_not_boot() {
    if !usable("places_are_v3_and_an_edited_command_line_does_not_boot") {
        return;
    }
    let p = publish(TOKEN);
    let w = write_machine(
        &p,
        TOKEN,
        "cpu-worker",
        "sda",
        "0x5002538e40a1b2c3",
        "cloud-config-worker-join.yaml",
        "worker-7",
    );
    let console = boot(&w, "v3");
    assert_good_boot(&p, &w, &console, "worker-7", &["base"], &["control-plane"]);
    for line in [
        "ingot-node: /opt is read-only\n",
        "ingot-node: /opt/cni/bin is writable\n",
        "ingot-node: /etc/kubernetes is writable\n",
    ] {
        assert!(console.contains(line), "missing {line:?}:\n{console}");
    }
    for (at, fs_type) in [
        ("/var", "ext4"),
        ("/etc", "overlay"),
        ("/etc/kubernetes", "ext4"),
        ("/opt/cni/bin", "overlay"),
    ] {
        let prefix = format!("ingot-node: mount {at} {fs_type} ");
        let opts = console
            .lines()
            .find_map(|l| l.strip_prefix(&prefix))
            .unwrap_or_else(|| panic!("no {prefix:?}:\n{console}"));
        let opts: Vec<&str> = opts.split(',').collect();
        for want in ["rw", "nosuid", "nodev"] {
            assert!(opts.contains(&want), "{at}: {opts:?} lacks {want}");
        }
    }

    let base_root = &w.layers[0].1;
    let twice = format!(
        "{} ingot.layers=base:{}",
        w.cmdline,
        "0".repeat(base_root.len())
    );
    set_loader_options(&w, &twice);
    let console = boot(&w, "layers-twice");
    let why = format!(
        "{FAILED}: ingot.layers appears twice on the kernel command line: refusing to guess"
    );
    assert!(console.contains(&why), "missing {why:?}:\n{console}");
    assert!(!console.contains("ingot: layer base"), "{console}");
    assert!(!console.contains(END), "{console}");

    let upper = w
        .cmdline
        .replace(base_root.as_str(), &base_root.to_uppercase());
    assert_ne!(upper, w.cmdline);
    set_loader_options(&w, &upper);
    let console = boot(&w, "upper-case-root");
    let why = format!(
        "{FAILED}: layer base: root hash '{}' is not lower-case hex",
        base_root.to_uppercase()
    );
    assert!(console.contains(&why), "missing {why:?}:\n{console}");
    assert!(!console.contains("ingot: layer base"), "{console}");
    assert!(!console.contains(END), "{console}");

    // The line as the writer wrote it boots again.
    set_loader_options(&w, &w.cmdline);
    let console = boot(&w, "restored");
    assert!(console.contains(&format!("{END}\n")), "{console}");
}
