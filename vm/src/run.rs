//! A VM run watched: QEMU started with its serial console in a file ([`Serial::File`]), polled
//! until the guest powers off (QEMU exits: `-no-reboot` turns a reboot or a panic into an exit
//! too), the console shows a marker, a time limit passes, or the console stays silent too long.
//! QEMU is killed when the watch ends early, and when the watcher unwinds.
//!
//! [`Serial::File`]: crate::machine::Serial::File

use std::fs;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, ExitStatus, Stdio};
use std::time::{Duration, Instant};

use crate::console;

/// What a watched run waits for.
#[derive(Clone, Debug)]
pub struct Watch<'a> {
    /// The serial log the machine writes.
    pub log: &'a Path,
    /// Where QEMU's stderr goes.
    pub stderr: &'a Path,
    /// Texts that end the run once the console shows one (a refused image: the firmware then
    /// waits for a boot option for ever).
    pub until: &'a [&'a str],
    /// The longest the guest may run.
    pub timeout: Duration,
    /// The longest the console may print nothing: a guest frozen whole (a nested guest that
    /// never gives its vCPU back stops every timer of its own, so no bound inside it can fire)
    /// ends the run then, not only at `timeout`.
    pub silence: Option<Duration>,
}

/// How a watched run ended.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum End {
    /// QEMU exited (the guest powered off, or QEMU failed: its stderr says why).
    Exited(ExitStatus),
    /// The console showed this one of [`Watch::until`].
    Marker(String),
    /// [`Watch::timeout`] passed.
    TimedOut,
    /// The console printed nothing for [`Watch::silence`].
    Silent,
}

/// A watched run's result.
#[derive(Clone, Debug)]
pub struct Ran {
    pub end: End,
    /// The whole console, cleaned ([`console::clean`]).
    pub console: String,
    /// QEMU's stderr.
    pub stderr: String,
    /// From QEMU's start to the end.
    pub ran: Duration,
}

/// QEMU could not be run or watched.
#[derive(Debug, thiserror::Error)]
pub enum RunError {
    #[error("creating QEMU's stderr file {}", path.display())]
    Stderr {
        path: PathBuf,
        source: std::io::Error,
    },
    #[error("creating the console log {}", path.display())]
    Log {
        path: PathBuf,
        source: std::io::Error,
    },
    #[error("starting {program}")]
    Start {
        program: String,
        source: std::io::Error,
    },
    #[error("waiting for QEMU")]
    Wait { source: std::io::Error },
}

/// A QEMU process, killed on drop.
struct Qemu(Child);

impl Drop for Qemu {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

/// Runs `cmd` (a machine's QEMU, its console in `watch.log`) until one of [`End`].
pub fn watch(mut cmd: Command, watch: &Watch<'_>) -> Result<Ran, RunError> {
    let stderr = fs::File::create(watch.stderr).map_err(|source| RunError::Stderr {
        path: watch.stderr.into(),
        source,
    })?;
    let started = Instant::now();
    let child = cmd
        .stdin(Stdio::null())
        .stdout(Stdio::null())
        .stderr(stderr)
        .spawn()
        .map_err(|source| RunError::Start {
            program: cmd.get_program().to_string_lossy().into_owned(),
            source,
        })?;
    let mut qemu = Qemu(child);
    let (mut printed, mut last_output) = (0, Instant::now());
    let end = loop {
        if let Some(status) = qemu
            .0
            .try_wait()
            .map_err(|source| RunError::Wait { source })?
        {
            break End::Exited(status);
        }
        if started.elapsed() > watch.timeout {
            break End::TimedOut;
        }
        if let Some(limit) = watch.silence {
            let len = fs::metadata(watch.log).map_or(0, |m| m.len());
            if len != printed {
                (printed, last_output) = (len, Instant::now());
            } else if last_output.elapsed() > limit {
                break End::Silent;
            }
        }
        if !watch.until.is_empty() {
            let text = read_console(watch.log);
            if let Some(marker) = watch.until.iter().find(|u| text.contains(*u)) {
                break End::Marker(marker.to_string());
            }
        }
        std::thread::sleep(Duration::from_millis(200));
    };
    let ran = started.elapsed();
    drop(qemu);
    Ok(Ran {
        end,
        console: read_console(watch.log),
        stderr: fs::read_to_string(watch.stderr).unwrap_or_default(),
        ran,
    })
}

/// The console so far, cleaned; nothing yet when QEMU has not created the file.
fn read_console(log: &Path) -> String {
    console::clean(&fs::read(log).unwrap_or_default())
}

/// Console lines that say the node's boot failed, whatever QEMU's status: the boot contract's
/// own failure line (the initramfs's `ingot_fail`, docs/boot-contract.md), the TPM refusing the
/// node's sealed secrets (`ingot-unseal.service`: nothing joins), and a kernel panic (which
/// `-no-reboot` turns into QEMU exiting with 0, as a reboot).
pub const BOOT_FAILED: [&str; 3] = [
    "INGOT-BOOT-FAILED",
    "INGOT-SECRETS-SEALED",
    "Kernel panic - not syncing",
];

/// How an interactive run ended.
#[derive(Clone, Debug)]
pub struct Interactive {
    /// QEMU's exit status.
    pub status: ExitStatus,
    /// The first console line showing one of [`BOOT_FAILED`], cleaned.
    pub failed: Option<String>,
}

/// Runs `cmd` (a machine with its console on QEMU's stdio, [`Serial::Terminal`]) with the
/// terminal's stdin and stderr; its console is copied to `term` (the terminal's stdout) as it
/// comes, kept in `log`, and read for [`BOOT_FAILED`].
///
/// [`Serial::Terminal`]: crate::machine::Serial::Terminal
pub fn interactive(
    mut cmd: Command,
    log: &Path,
    term: &mut dyn std::io::Write,
) -> Result<Interactive, RunError> {
    let program = cmd.get_program().to_string_lossy().into_owned();
    let mut file = fs::File::create(log).map_err(|source| RunError::Log {
        path: log.into(),
        source,
    })?;
    let mut child = cmd
        .stdout(Stdio::piped())
        .spawn()
        .map_err(|source| RunError::Start { program, source })?;
    let mut out = child.stdout.take().expect("piped");
    let (mut failed, mut line) = (None, Vec::new());
    let mut buf = [0u8; 8192];
    loop {
        let n = match std::io::Read::read(&mut out, &mut buf) {
            Ok(0) => break,
            Ok(n) => n,
            Err(e) if e.kind() == std::io::ErrorKind::Interrupted => continue,
            Err(_) => break,
        };
        let chunk = &buf[..n];
        // The terminal and the log are best effort: a closed terminal must not stop the VM.
        let _ = term.write_all(chunk).and_then(|()| term.flush());
        let _ = std::io::Write::write_all(&mut file, chunk);
        for &b in chunk {
            if b == b'\n' {
                failed = failed.or_else(|| failed_line(&line));
                line.clear();
            } else {
                line.push(b);
            }
        }
    }
    failed = failed.or_else(|| failed_line(&line));
    let status = child.wait().map_err(|source| RunError::Wait { source })?;
    Ok(Interactive { status, failed })
}

/// `raw` (one console line), cleaned, when it shows one of [`BOOT_FAILED`].
fn failed_line(raw: &[u8]) -> Option<String> {
    let text = console::clean(raw);
    BOOT_FAILED
        .iter()
        .any(|f| text.contains(f))
        .then(|| text.trim().to_string())
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A real QEMU-less run: `sh` prints a console with OVMF's escapes and CRs; the boot
    /// contract's failure line is found, the log is the exact output.
    #[test]
    fn an_interactive_run_keeps_the_console_and_finds_the_failure_line() {
        let dir = tempfile::tempdir().unwrap();
        let log = dir.path().join("console.log");
        let mut cmd = Command::new("sh");
        cmd.args([
            "-c",
            "printf '\\033[2Jboot\\r\\nINGOT-BOOT-FAILED: layer base: bad\\r\\nKernel panic - not syncing: x'",
        ]);
        let mut term = Vec::new();
        let run = interactive(cmd, &log, &mut term).unwrap();
        assert!(run.status.success());
        assert_eq!(
            run.failed.as_deref(),
            Some("INGOT-BOOT-FAILED: layer base: bad")
        );
        assert!(term.starts_with(b"\x1b[2Jboot\r\n"));
        assert_eq!(fs::read(&log).unwrap(), term);
        let mut clean = Command::new("sh");
        clean.args(["-c", "echo INGOT-BOOT-OK"]);
        assert_eq!(
            interactive(clean, &log, &mut Vec::new()).unwrap().failed,
            None
        );
        let mut sealed = Command::new("sh");
        sealed.args([
            "-c",
            "echo 'INGOT-SECRETS-SEALED: ingot.x: the TPM refused'",
        ]);
        assert!(interactive(sealed, &log, &mut Vec::new())
            .unwrap()
            .failed
            .is_some());
        let mut panic = Command::new("sh");
        panic.args(["-c", "printf 'Kernel panic - not syncing: VFS'"]);
        assert!(interactive(panic, &log, &mut Vec::new())
            .unwrap()
            .failed
            .is_some());
    }
}
