//! Running the real tools a test compares against.

use std::process::{Command, Output};

/// Asserts that `out` (of `what`, a command) is a success, naming it, its status, stdout and
/// stderr if not.
pub fn assert_success(what: &dyn std::fmt::Debug, out: &Output) {
    assert!(
        out.status.success(),
        "{what:?} failed ({}):\nstdout: {}\nstderr: {}",
        out.status,
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
}

/// Runs `cmd` and asserts it succeeded ([`assert_success`]); its output.
pub fn output_ok(cmd: &mut Command) -> Output {
    let out = cmd
        .output()
        .unwrap_or_else(|e| panic!("running {cmd:?}: {e}"));
    assert_success(cmd, &out);
    out
}

/// Runs `cmd` and asserts it succeeded ([`assert_success`]); its stdout.
pub fn run_ok(cmd: &mut Command) -> String {
    String::from_utf8_lossy(&output_ok(cmd).stdout).into_owned()
}

/// `out` as a failed assertion shows it: exit code, stdout, stderr.
pub fn describe(out: &Output) -> String {
    format!(
        "status {:?}\nstdout: {}\nstderr: {}",
        out.status.code(),
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    )
}

/// Copies the executable `from` to `to` with `cp`, for a test that runs the copy (as an
/// installed binary). Not with `std::fs::copy`: a child another test thread forks while this
/// process holds the copy's write handle keeps that handle until it execs, and exec'ing the
/// copy meanwhile fails with ETXTBSY ("Text file busy"); `cp`'s handle is never in this process.
pub fn copy_executable(from: &std::path::Path, to: &std::path::Path) {
    output_ok(Command::new("cp").arg(from).arg(to));
}
