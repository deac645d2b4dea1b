//! `ingot vm` end to end, as README's "Boot it" runs it (`tests/boot/try-vm`): the boot fixture
//! stack (`tests/boot/build-stack.sh`) built into a signed layout, written by `ingot-writer` run
//! as CAPH runs it onto two sparse disks of a UEFI machine with an NVIDIA GPU and the
//! control-plane role, then booted under OVMF from the VM's SCSI disks: the layers the writer
//! selected for that machine are active, var is formatted on this first boot, the node powers
//! off and `ingot vm` exits 0. The same `--state`, with no machine flag, boots the same machine
//! again: nothing written, var kept. Then `--rewrite --firmware bios` re-provisions the kept VM's
//! disks as a BIOS machine, booted under SeaBIOS. Then the kept disks' base layer gets one byte
//! changed, and `ingot vm` exits 3 naming the boot contract's failure line. (Secure Boot through
//! `ingot vm` is one of boot_secure's machines.)
//!
//! Needs root (the writer's machine checks), qemu-system-x86_64, OVMF, SeaBIOS and the tools
//! `build-stack.sh` names; skipped with a message without them, except in CI.

mod common;

use std::ffi::OsStr;
use std::fs;
use std::path::{Path, PathBuf};
use std::process::{Command, Output};

use common::boot::run_ok;
use common::{flip, partitions, vm};
use ingot_testkit::qemu::{OVMF_CODE, SEABIOS};
use ingot_testkit::skip::{have_file, have_root, have_tools};

fn usable(test: &str) -> bool {
    have_root(test)
        && have_tools(test, &["qemu-system-x86_64"])
        && have_file(test, Path::new(SEABIOS))
        && have_file(test, Path::new(OVMF_CODE))
}

fn ingot_vm(args: &[&OsStr]) -> Output {
    vm::run(args, &[], vm::TIMEOUT)
}

/// Flips one byte of `layer`'s partition (its superblock: a data block every boot reads) on
/// every disk that has one.
fn flip_layer(images: &[PathBuf], layer: &str) -> usize {
    let mut flipped = 0;
    for image in images {
        for (name, start, _) in partitions(image) {
            if name == layer {
                flip(image, start + 1024);
                flipped += 1;
            }
        }
    }
    flipped
}

/// The boot fixture stack built into a signed layout in `dir`; the layout and its public key.
fn signed_layout(dir: &Path) -> (PathBuf, PathBuf) {
    let trees = dir.join("trees");
    run_ok(Command::new(common::repo_root().join("tests/boot/build-stack.sh")).arg(&trees));
    let (key, public) = (dir.join("ingot.key"), dir.join("ingot.pub"));
    run_ok(
        Command::new(vm::ingot())
            .args(["key", "generate", "-s"])
            .arg(&key)
            .arg("-p")
            .arg(&public),
    );
    let layout = dir.join("layout");
    run_ok(
        Command::new(vm::ingot())
            .arg("build")
            .arg(trees.join("stack.toml"))
            .arg("--out")
            .arg(&layout)
            .arg("--sign-key")
            .arg(&key)
            .arg("--quiet"),
    );
    (layout, public)
}

/// `ingot vm` with `args`: its status must be `status`, its console and messages show every one
/// of `want`; the text.
fn ingot_vm_shows(args: &[&OsStr], status: i32, want: &[&str]) -> String {
    let out = ingot_vm(args);
    let text = vm::text(&out);
    assert_eq!(out.status.code(), Some(status), "{text}");
    for w in want {
        assert!(text.contains(w), "no {w:?}:\n{text}");
    }
    text
}

/// SOURCE and its key, the kept state, and `flags`.
fn with<'a>(source: [&'a OsStr; 3], kept: [&'a OsStr; 2], flags: &'a [&'a str]) -> Vec<&'a OsStr> {
    let mut args: Vec<&OsStr> = source.into();
    args.extend(kept);
    args.extend(flags.iter().map(OsStr::new));
    args
}

#[test]
fn ingot_vm_writes_boots_reboots_and_rewrites_a_two_disk_gpu_control_plane() {
    if !usable(ingot_testkit::test_name!()) {
        return;
    }
    let dir = tempfile::tempdir_in("/var/tmp").unwrap();
    let (layout, public) = signed_layout(dir.path());
    let source = [
        layout.as_os_str(),
        "--trust-key".as_ref(),
        public.as_os_str(),
    ];
    let state = dir.path().join("vm");
    let kept: [&OsStr; 2] = ["--state".as_ref(), state.as_os_str()];
    let machine = [
        "--role",
        "control-plane",
        "--gpu",
        "nvidia",
        "--disks",
        "2",
        "--disk-size",
        "1G",
        "--cpus",
        "1",
        "--memory",
        "1024",
        "--name",
        "vm-cp-1",
    ];
    let console = ingot_vm_shows(
        &with(source, kept, &machine),
        0,
        &[
            "IMAGE_URL_DONE wrote bootfix 1.0.0",
            "for vm-cp-1 (control-plane)",
            "booting 2 disk(s) with uefi",
            "ingot-node: hostname vm-cp-1",
            "ingot-node: layer active: base",
            "ingot-node: layer active: control-plane",
            "ingot-node: layer active: nvidia",
            "formatting it (first boot)",
            "INGOT-BOOT-OK",
        ],
    );
    // No --virt: the kata layer's rule (all(virt, uefi)) leaves it out.
    assert!(!console.contains("layer active: kata"), "{console}");
    let log = fs::read(state.join("console.log")).unwrap();
    assert!(console.contains(&ingot_vm::console::clean(&log)));

    // The kept machine, with no flag: the same UEFI machine, its disks as the first boot left them.
    let again = ingot_vm_shows(
        &kept,
        0,
        &[
            "again as it was left\n",
            "booting 2 disk(s) with uefi",
            "INGOT-BOOT-OK",
        ],
    );
    assert!(!again.contains("IMAGE_URL_DONE"), "written again:\n{again}");
    assert!(!again.contains("formatting it (first boot)"), "{again}");

    // Re-provisioned as a BIOS machine: written anew over the same disks, with the data it was
    // written with (its name, its role from the flag), a GPU no more.
    let rewrite = [
        "--rewrite",
        "--firmware",
        "bios",
        "--gpu",
        "none",
        "--role",
        "control-plane",
    ];
    let bios = ingot_vm_shows(
        &with(source, kept, &rewrite),
        0,
        &[
            "IMAGE_URL_DONE wrote bootfix 1.0.0",
            "for vm-cp-1 (control-plane)",
            "booting 2 disk(s) with bios",
            "ingot-node: layer active: control-plane",
            "INGOT-BOOT-OK",
        ],
    );
    assert!(!bios.contains("layer active: nvidia"), "{bios}");
    let spec = fs::read_to_string(state.join("vm.json")).unwrap();
    assert!(spec.contains("\"firmware\": \"bios\""), "{spec}");

    // One byte of the base layer changed: the boot contract stops the boot, `ingot vm` says so.
    let images = [state.join("disk0.img"), state.join("disk1.img")];
    assert!(
        flip_layer(&images, "ingot-base") > 0,
        "{:?}",
        partitions(&images[0])
    );
    ingot_vm_shows(
        &kept,
        3,
        &["ingot vm: the node's boot failed: INGOT-BOOT-FAILED: layer base"],
    );
}
