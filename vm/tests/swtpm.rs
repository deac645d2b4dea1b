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
