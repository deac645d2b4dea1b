//! The reboot after a successful provisioning run.
#![allow(unsafe_code)] // setsid in the child between fork and exec; see `schedule`.

use std::os::unix::process::CommandExt;
use std::process::{Command, Stdio};

/// Reboots after `delay` seconds, from a detached shell, so this process can exit and the
/// provisioner can read its result first.
pub fn schedule(delay: u64) -> std::io::Result<()> {
    let mut cmd = Command::new("sh");
    cmd.args(["-c", &format!("sleep {delay}; sync; reboot")])
        .stdin(Stdio::null())
        .stdout(Stdio::null())
        .stderr(Stdio::null());
    // SAFETY: setsid is async-signal-safe; it detaches the shell from our session so it
    // outlives us (CAPH runs us under nohup over SSH).
    unsafe {
        cmd.pre_exec(|| {
            libc::setsid();
            Ok(())
        });
    }
    cmd.spawn()?;
    Ok(())
}
