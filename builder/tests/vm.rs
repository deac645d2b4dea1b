//! `ingot vm`'s refusals, which come before any VM boots or anything is written.

use std::process::{Command, Output};

fn ingot_vm(args: &[&str]) -> Output {
    Command::new(env!("CARGO_BIN_EXE_ingot"))
        .arg("vm")
        .args(args)
        .output()
        .unwrap()
}

fn refused(out: &Output, code: i32, says: &str) {
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(code), "{stderr}");
    assert!(stderr.contains(says), "{says:?} not in {stderr}");
}

#[test]
fn ssh_port_needs_user_networking() {
    refused(
        &ingot_vm(&["layout", "--ssh-port", "2222"]),
        1,
        "--ssh-port needs --net user",
    );
}

#[test]
fn an_empty_state_needs_a_source() {
    let dir = tempfile::tempdir().unwrap();
    let state = dir.path().to_str().unwrap();
    refused(&ingot_vm(&["--state", state]), 1, "no stack to write");
}

/// A kept VM is booted again, not written over, unless --rewrite says so.
#[test]
fn a_kept_vm_is_not_written_over_without_rewrite() {
    let dir = tempfile::tempdir().unwrap();
    std::fs::write(dir.path().join("disk0.img"), b"").unwrap();
    let state = dir.path().to_str().unwrap();
    refused(
        &ingot_vm(&["layout", "--state", state]),
        1,
        "already holds a VM",
    );
    refused(
        &ingot_vm(&["--state", state, "--rewrite"]),
        1,
        "--rewrite needs SOURCE",
    );
    refused(&ingot_vm(&["layout", "--rewrite"]), 2, "--state");
}

#[test]
fn sizes_and_firmware_are_checked() {
    refused(
        &ingot_vm(&["layout", "--disk-size", "8X"]),
        2,
        "unknown unit",
    );
    refused(
        &ingot_vm(&["layout", "--disk-size", "1K"]),
        2,
        "at least 1M",
    );
    refused(&ingot_vm(&["layout", "--firmware", "coreboot"]), 2, "uefi");
    // A new VM needs the keys its first boot enrolls (a kept one has them in its store).
    refused(
        &ingot_vm(&["layout", "--firmware", "secure-boot"]),
        1,
        "--secure-boot-keys",
    );
}

/// A kept machine description that is not one is refused naming it, not taken for the defaults.
#[test]
fn a_damaged_machine_description_is_refused() {
    let dir = tempfile::tempdir().unwrap();
    std::fs::write(dir.path().join("disk0.img"), b"").unwrap();
    std::fs::write(dir.path().join("vm.json"), b"{\"firmware\": \"amiga\"}").unwrap();
    let state = dir.path().to_str().unwrap();
    refused(&ingot_vm(&["--state", state]), 1, "vm.json");
}

/// --ssh-key with data that cannot take it: refused before anything is written.
#[test]
fn an_ssh_key_needs_cloud_config_data() {
    let dir = tempfile::tempdir().unwrap();
    let data = dir.path().join("ignition.json");
    std::fs::write(&data, br#"{"ignition":{"version":"3.2.0"}}"#).unwrap();
    let key = dir.path().join("id.pub");
    std::fs::write(&key, "ssh-ed25519 AAAAC3NzaC1lZDI1NTE5AAAAIG me@host\n").unwrap();
    let state = dir.path().join("vm");
    let out = ingot_vm(&[
        "layout",
        "--state",
        state.to_str().unwrap(),
        "--bootstrap",
        data.to_str().unwrap(),
        "--ssh-key",
        key.to_str().unwrap(),
        "--accel",
        "tcg",
    ]);
    refused(&out, 1, "Ignition, put the key in passwd.users");
    assert!(!state.join("disk0.img").exists(), "a disk was made");
}

#[test]
fn ssh_needs_the_port_the_vm_was_started_with() {
    let dir = tempfile::tempdir().unwrap();
    let out = Command::new(env!("CARGO_BIN_EXE_ingot"))
        .args(["vm", "ssh", "--state", dir.path().to_str().unwrap()])
        .output()
        .unwrap();
    refused(&out, 1, "--net user --ssh-port");
}
