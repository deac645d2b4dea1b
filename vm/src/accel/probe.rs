//! The probe guest and its run: a firmware image of a few dozen instructions (its source is
//! probe.S beside this file) that QEMU boots with `-bios`, no other firmware, disk or device but
//! `isa-debug-exit`. The guest goes to long mode as every x86-64 kernel does, runs a loop of ten
//! million iterations and writes to port 0xf4, which ends QEMU with [`EXIT_STATUS`]: that status
//! is the only proof the guest ran. The loop is the point: on a host whose KVM emulates each
//! instruction (KVM without hardware virtualization, as PVM's `kvm_pvm` on a nested host), a
//! guest of a few instructions exits at once, yet a kernel is still decompressing itself after
//! 25 s; the loop takes seconds there (11 s measured), milliseconds where guests run on the CPU and
//! about a tenth of a second under TCG.

use std::fs::File;
use std::io::{Read, Seek, Write};
use std::path::PathBuf;
use std::process::{Child, Command, ExitStatus, Stdio};
use std::time::{Duration, Instant};

use crate::firmware::QEMU;

/// QEMU's status when the guest wrote 0x2a to isa-debug-exit: `(0x2a << 1) | 1`.
pub const EXIT_STATUS: i32 = 85;
/// The firmware image's size: QEMU takes a BIOS of whole 64 KiB units.
const IMAGE_SIZE: usize = 0x10000;
/// Where the reset vector sits in the image: 16 bytes below its end (below 4 GiB).
const RESET_VECTOR: usize = 0xFFF0;
/// `ljmp $0xF000, $0`: from the reset vector to the image's copy at 0xF0000.
const RESET_JUMP: [u8; 5] = [0xea, 0x00, 0x00, 0x00, 0xf0];
/// probe.S from its start to its GDT pointer, as GNU as assembles it.
const CODE: [u8; 189] = [
    0xfa, 0xb8, 0x00, 0xf0, 0x8e, 0xd8, 0x66, 0x0f, 0x01, 0x16, 0xb8, 0x00, 0x0f, 0x20, 0xc0, 0x66,
    0x83, 0xc8, 0x01, 0x0f, 0x22, 0xc0, 0x66, 0xea, 0x1e, 0x00, 0x0f, 0x00, 0x08, 0x00, 0x66, 0xb8,
    0x10, 0x00, 0x8e, 0xd8, 0x8e, 0xc0, 0x8e, 0xd0, 0xbf, 0x00, 0x10, 0x00, 0x00, 0x31, 0xc0, 0xb9,
    0x00, 0x0c, 0x00, 0x00, 0xf3, 0xab, 0xc7, 0x05, 0x00, 0x10, 0x00, 0x00, 0x03, 0x20, 0x00, 0x00,
    0xc7, 0x05, 0x00, 0x20, 0x00, 0x00, 0x03, 0x30, 0x00, 0x00, 0xc7, 0x05, 0x00, 0x30, 0x00, 0x00,
    0x83, 0x00, 0x00, 0x00, 0xb8, 0x00, 0x10, 0x00, 0x00, 0x0f, 0x22, 0xd8, 0x0f, 0x20, 0xe0, 0x83,
    0xc8, 0x20, 0x0f, 0x22, 0xe0, 0xb9, 0x80, 0x00, 0x00, 0xc0, 0x0f, 0x32, 0x0d, 0x00, 0x01, 0x00,
    0x00, 0x0f, 0x30, 0x0f, 0x20, 0xc0, 0x0d, 0x00, 0x00, 0x00, 0x80, 0x0f, 0x22, 0xc0, 0xea, 0x85,
    0x00, 0x0f, 0x00, 0x18, 0x00, 0xb9, 0x80, 0x96, 0x98, 0x00, 0xff, 0xc9, 0x75, 0xfc, 0xb0, 0x2a,
    0xe6, 0xf4, 0xf4, 0xeb, 0xfd, 0x8d, 0x74, 0x00, 0x00, 0x00, 0x00, 0x00, 0x00, 0x00, 0x00, 0x00,
    0xff, 0xff, 0x00, 0x00, 0x00, 0x9b, 0xcf, 0x00, 0xff, 0xff, 0x00, 0x00, 0x00, 0x93, 0xcf, 0x00,
    0xff, 0xff, 0x00, 0x00, 0x00, 0x9b, 0xaf, 0x00, 0x1f, 0x00, 0x98, 0x00, 0x0f,
];

/// Why the probe guest did not finish.
#[derive(Debug, thiserror::Error)]
pub enum ProbeError {
    #[error("{QEMU} is not installed (Debian package qemu-system-x86)")]
    QemuMissing,
    #[error("starting {QEMU}")]
    Start { source: std::io::Error },
    #[error("writing the probe's temporary files (the guest's image, QEMU's stderr)")]
    TempFiles { source: std::io::Error },
    #[error("waiting for {QEMU}")]
    Wait { source: std::io::Error },
    /// QEMU ended before the guest did: it refused the accelerator (its stderr says why), or
    /// the guest crashed (a triple fault ends QEMU under `-no-reboot`).
    #[error("QEMU -accel {accel} ended ({status}) before the probe guest finished: {stderr}")]
    Ended {
        accel: &'static str,
        status: ExitStatus,
        stderr: String,
    },
    #[error(
        "the probe guest (ten million loop iterations) did not finish within {}s under \
         -accel {accel}: guests do not run, or run far too slowly to use",
        timeout.as_secs_f32()
    )]
    TimedOut {
        accel: &'static str,
        timeout: Duration,
    },
}

/// The 64 KiB firmware image: probe.S's code at its start, the reset jump at its vector.
pub fn image() -> Vec<u8> {
    let mut image = vec![0; IMAGE_SIZE];
    image[..CODE.len()].copy_from_slice(&CODE);
    image[RESET_VECTOR..RESET_VECTOR + RESET_JUMP.len()].copy_from_slice(&RESET_JUMP);
    image
}

/// Boots the probe guest under `-accel accel` and waits up to `timeout` for its exit status;
/// returns how long QEMU ran. On timeout QEMU's process group is killed.
pub fn run(accel: &'static str, timeout: Duration) -> Result<Duration, ProbeError> {
    let mut bios = tempfile::Builder::new()
        .prefix("ingot-kvm-probe")
        .suffix(".bin")
        .tempfile()
        .map_err(|source| ProbeError::TempFiles { source })?;
    bios.write_all(&image())
        .and_then(|()| bios.flush())
        .map_err(|source| ProbeError::TempFiles { source })?;
    // QEMU's stderr goes to a file: nothing to drain while waiting, all of it read after.
    let mut stderr = tempfile::tempfile().map_err(|source| ProbeError::TempFiles { source })?;
    let started = Instant::now();
    let mut child = start(accel, bios.path().into(), &stderr)?;
    let status =
        wait(&mut child, started, timeout).map_err(|source| ProbeError::Wait { source })?;
    let elapsed = started.elapsed();
    tracing::debug!(accel, ?status, ?elapsed, "KVM probe guest");
    match status {
        None => Err(ProbeError::TimedOut { accel, timeout }),
        Some(status) if status.code() == Some(EXIT_STATUS) => Ok(elapsed),
        Some(status) => Err(ProbeError::Ended {
            accel,
            status,
            stderr: clipped(&mut stderr),
        }),
    }
}

/// Starts QEMU in a process group of its own, so a timeout kills all of it.
fn start(accel: &str, bios: PathBuf, stderr: &File) -> Result<Child, ProbeError> {
    use std::os::unix::process::CommandExt;
    let stderr = stderr
        .try_clone()
        .map_err(|source| ProbeError::TempFiles { source })?;
    let mut cmd = Command::new(QEMU);
    cmd.args(["-machine", "pc", "-accel", accel, "-m", "16"])
        .args(["-nodefaults", "-display", "none", "-no-reboot"])
        .args(["-monitor", "none", "-serial", "none"])
        .arg("-bios")
        .arg(bios)
        .args(["-device", "isa-debug-exit,iobase=0xf4,iosize=0x04"])
        .stdin(Stdio::null())
        .stdout(Stdio::null())
        .stderr(stderr)
        .process_group(0);
    cmd.spawn().map_err(|source| match source.kind() {
        std::io::ErrorKind::NotFound => ProbeError::QemuMissing,
        _ => ProbeError::Start { source },
    })
}

/// The child's status, or `None` once `timeout` has passed since `started` (then the child's
/// process group is killed and reaped).
fn wait(
    child: &mut Child,
    started: Instant,
    timeout: Duration,
) -> std::io::Result<Option<ExitStatus>> {
    loop {
        if let Some(status) = child.try_wait()? {
            return Ok(Some(status));
        }
        if started.elapsed() >= timeout {
            let group = rustix::process::Pid::from_child(child);
            // Already gone is fine: the wait below reaps it either way.
            let _ = rustix::process::kill_process_group(group, rustix::process::Signal::KILL);
            child.wait()?;
            return Ok(None);
        }
        std::thread::sleep(Duration::from_millis(10));
    }
}

/// QEMU's stderr on one line, its warnings left out, at most 300 characters.
fn clipped(stderr: &mut File) -> String {
    let mut text = String::new();
    let _ = stderr
        .rewind()
        .and_then(|()| stderr.read_to_string(&mut text));
    let line = text
        .lines()
        .filter(|l| !l.is_empty() && !l.contains(": warning: "))
        .collect::<Vec<_>>()
        .join("; ");
    match line.char_indices().nth(300) {
        Some((at, _)) => format!("{}…", &line[..at]),
        None if line.is_empty() => "nothing on stderr".to_owned(),
        None => line,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// QEMU refusing the accelerator is reported with its own words, on one line.
    #[test]
    fn a_refused_accelerator_is_named_with_qemu_s_stderr() {
        if !ingot_testkit::skip::have_tool(ingot_testkit::test_name!(), QEMU) {
            return;
        }
        let err = run("no-such-accel", Duration::from_secs(10)).unwrap_err();
        let text = err.to_string();
        eprintln!("{text}");
        assert!(matches!(err, ProbeError::Ended { .. }), "{err:?}");
        assert!(text.contains("no-such-accel"), "{text}");
        assert!(!text.contains('\n'), "{text}");
    }
}
