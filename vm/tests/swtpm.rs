//! swtpm against the real program: it starts with its state in a directory, QEMU's control
//! socket appears, and a state directory is kept for the next start.

use ingot_testkit::{skip, test_name};
use ingot_vm::firmware::{Lookup, SWTPM};
use ingot_vm::swtpm::Swtpm;

#[test]
fn swtpm_starts_with_its_control_socket_and_its_state_is_kept() {
    if !skip::have_tool(test_name!(), SWTPM) {
        return;
    }
    let program = Lookup::system().swtpm().unwrap();
    let dir = tempfile::tempdir().unwrap();
    let state = dir.path().join("tpm");
    let tpm = Swtpm::start(&program, &state).unwrap();
    assert!(tpm.socket().exists() && tpm.socket().starts_with(&state));
    tpm.stop();
    // A second start over the same state (its socket left behind) starts again.
    let again = Swtpm::start(&program, &state).unwrap();
    assert!(again.socket().exists());
}

#[test]
fn swtpm_that_cannot_start_is_named() {
    let dir = tempfile::tempdir().unwrap();
    let missing = dir.path().join("no-swtpm");
    let err = Swtpm::start(&missing, &dir.path().join("tpm"))
        .err()
        .expect("a missing program started");
    assert!(err.to_string().contains("no-swtpm"), "{err}");
}

/// `orderly` of the TPM's TPM2_PT_STARTUP_CLEAR, as tpm2-tools reads it: whether its last start
/// followed a TPM2_Shutdown.
fn orderly(tpm: &Swtpm) -> bool {
    let out = std::process::Command::new("tpm2_getcap")
        .arg("properties-variable")
        .env("TPM2TOOLS_TCTI", tpm.tcti().unwrap())
        .output()
        .unwrap();
    assert!(out.status.success(), "{out:?}");
    let text = String::from_utf8(out.stdout).unwrap();
    let line = text
        .lines()
        .skip_while(|l| !l.starts_with("TPM2_PT_STARTUP_CLEAR"))
        .find(|l| l.trim_start().starts_with("orderly:"))
        .unwrap_or_else(|| panic!("no orderly bit:\n{text}"));
    line.trim().ends_with('1')
}

#[test]
fn a_host_tpm_shut_down_starts_orderly_and_a_killed_one_does_not() {
    if !skip::have_tools(test_name!(), &[SWTPM, "tpm2_getcap"]) {
        return;
    }
    let program = Lookup::system().swtpm().unwrap();
    let dir = tempfile::tempdir().unwrap();
    let state = dir.path().join("tpm");
    // Killed (dropped): the next start is a disorderly one. A command answered first makes
    // sure swtpm made the TPM and ran its startup (kept in the state) before it is killed.
    let first = Swtpm::start_for_host(&program, &state).unwrap();
    orderly(&first);
    drop(first);
    let tpm = Swtpm::start_for_host(&program, &state).unwrap();
    assert!(!orderly(&tpm), "a killed TPM's next start is not orderly");
    // Shut down as a power-off does: the next start is orderly.
    tpm.shutdown().unwrap();
    let tpm = Swtpm::start_for_host(&program, &state).unwrap();
    assert!(
        orderly(&tpm),
        "the shut-down TPM's next start is not orderly"
    );
    tpm.shutdown().unwrap();
}
