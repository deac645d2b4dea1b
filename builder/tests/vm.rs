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
    refused(
        &ingot_vm(&["layout", "--firmware", "secure-boot"]),
        2,
        "--secure-boot-keys",
    );
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
