//! A software TPM 2.0 for one VM: `swtpm socket` with its state in a directory (kept there for
//! the next boot, or fresh), stopped when dropped.

use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

/// How long swtpm may take to open its control socket.
const START_TIMEOUT: Duration = Duration::from_secs(30);

/// swtpm did not start.
#[derive(Debug, thiserror::Error)]
pub enum SwtpmError {
    #[error("creating the TPM state directory {}", path.display())]
    State {
        path: PathBuf,
        source: std::io::Error,
    },
    #[error("starting {}", program.display())]
    Start {
        program: PathBuf,
        source: std::io::Error,
    },
    #[error("swtpm ended ({status}) before opening its control socket {}", socket.display())]
    Ended {
        status: std::process::ExitStatus,
        socket: PathBuf,
    },
    #[error("swtpm did not open its control socket {} within {START_TIMEOUT:?}", socket.display())]
    TimedOut { socket: PathBuf },
}

/// A running swtpm.
pub struct Swtpm {
    child: Child,
    socket: PathBuf,
}

impl Swtpm {
    /// Starts `program` (swtpm, from [`crate::firmware::Lookup::swtpm`]) with its state in
    /// `state` (created if missing; a state from an earlier boot is kept); waits for its control
    /// socket, `state/ctrl.sock`.
    pub fn start(program: &Path, state: &Path) -> Result<Swtpm, SwtpmError> {
        std::fs::create_dir_all(state).map_err(|source| SwtpmError::State {
            path: state.into(),
            source,
        })?;
        let socket = state.join("ctrl.sock");
        // A socket left by an earlier run would pass for this one's.
        let _ = std::fs::remove_file(&socket);
        let child = Command::new(program)
            .arg("socket")
            .arg("--tpm2")
            .arg("--tpmstate")
            .arg(format!("dir={}", state.display()))
            .arg("--ctrl")
            .arg(format!("type=unixio,path={}", socket.display()))
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .spawn()
            .map_err(|source| SwtpmError::Start {
                program: program.into(),
                source,
            })?;
        let mut tpm = Swtpm { child, socket };
        let started = Instant::now();
        while !tpm.socket.exists() {
            if let Ok(Some(status)) = tpm.child.try_wait() {
                let socket = tpm.socket.clone();
                return Err(SwtpmError::Ended { status, socket });
            }
            if started.elapsed() > START_TIMEOUT {
                let socket = tpm.socket.clone();
                return Err(SwtpmError::TimedOut { socket });
            }
            std::thread::sleep(Duration::from_millis(50));
        }
        Ok(tpm)
    }

    /// The control socket QEMU connects to (a machine's `tpm`).
    pub fn socket(&self) -> &Path {
        &self.socket
    }

    /// Stops swtpm (dropping it does the same).
    pub fn stop(self) {}
}

impl Drop for Swtpm {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}
