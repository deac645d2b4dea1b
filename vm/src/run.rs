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

/// Runs `cmd` (a machine with its console on the terminal) with the terminal's stdin, stdout
/// and stderr; its exit status.
pub fn interactive(mut cmd: Command) -> Result<ExitStatus, RunError> {
    let program = cmd.get_program().to_string_lossy().into_owned();
    cmd.status()
        .map_err(|source| RunError::Start { program, source })
}
