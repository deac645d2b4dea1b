//! A software TPM 2.0: `swtpm socket` with its state in a directory (kept there for the next
//! boot, or fresh), stopped when dropped. For a VM, QEMU talks to its control socket; for tools
//! on the host (systemd-measure, systemd-creds, tpm2-tools), [`Swtpm::start_for_host`] also
//! opens a data socket they reach through the TSS2 TCTI `swtpm:path=...` ([`Swtpm::tcti`]).

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
    #[error("shutting down the TPM at {}: {what}", socket.display())]
    Shutdown { socket: PathBuf, what: String },
}

/// TPM2_Shutdown(TPM_SU_CLEAR): tag TPM_ST_NO_SESSIONS, size 12, TPM_CC_Shutdown (TPM 2.0
/// Part 3, 9.4), what a kernel sends at power-off.
const TPM2_SHUTDOWN_CLEAR: [u8; 12] = [0x80, 0x01, 0, 0, 0, 12, 0, 0, 0x01, 0x45, 0, 0];
/// swtpm's control command that stores its state and ends it (`CMD_SHUTDOWN`, swtpm_ioctls(3)).
const CMD_SHUTDOWN: [u8; 4] = [0, 0, 0, 3];
/// How long swtpm may take to answer and end.
const SHUTDOWN_TIMEOUT: Duration = Duration::from_secs(10);

/// A running swtpm.
pub struct Swtpm {
    child: Child,
    socket: PathBuf,
    /// The data socket of [`Swtpm::start_for_host`].
    data: Option<PathBuf>,
}

impl Swtpm {
    /// Starts `program` (swtpm, from [`crate::firmware::Lookup::swtpm`]) with its state in
    /// `state` (created if missing; a state from an earlier boot is kept); waits for its control
    /// socket, `state/ctrl.sock`.
    pub fn start(program: &Path, state: &Path) -> Result<Swtpm, SwtpmError> {
        Swtpm::spawn(program, state, false)
    }

    /// Starts `program` as [`Swtpm::start`] does, powered up (`startup-clear`, as firmware
    /// would), with a data socket `state/sock` for tools on the host as well; waits for both
    /// sockets (control: `state/sock.ctrl`). swtpm has no resource manager: a tool's sessions stay loaded after it exits
    /// until flushed (`tpm2_flushcontext`).
    pub fn start_for_host(program: &Path, state: &Path) -> Result<Swtpm, SwtpmError> {
        Swtpm::spawn(program, state, true)
    }

    fn spawn(program: &Path, state: &Path, host: bool) -> Result<Swtpm, SwtpmError> {
        std::fs::create_dir_all(state).map_err(|source| SwtpmError::State {
            path: state.into(),
            source,
        })?;
        // The TCTI finds the control socket beside the data socket, as `PATH.ctrl`.
        let socket = state.join(if host { "sock.ctrl" } else { "ctrl.sock" });
        let data = host.then(|| state.join("sock"));
        // A socket left by an earlier run would pass for this one's.
        for s in std::iter::once(&socket).chain(&data) {
            let _ = std::fs::remove_file(s);
        }
        let mut cmd = Command::new(program);
        cmd.arg("socket")
            .arg("--tpm2")
            .arg("--tpmstate")
            .arg(format!("dir={}", state.display()))
            .arg("--ctrl")
            .arg(format!("type=unixio,path={}", socket.display()));
        if let Some(data) = &data {
            cmd.args(["--flags", "startup-clear"])
                .arg("--server")
                .arg(format!("type=unixio,path={}", data.display()));
        }
        let child = cmd
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .spawn()
            .map_err(|source| SwtpmError::Start {
                program: program.into(),
                source,
            })?;
        let mut tpm = Swtpm {
            child,
            socket,
            data,
        };
        let started = Instant::now();
        while !tpm.socket.exists() || tpm.data.as_ref().is_some_and(|d| !d.exists()) {
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

    /// The TSS2 TCTI that reaches this TPM from the host (`--tpm2-device=` of systemd's tools,
    /// `TPM2TOOLS_TCTI`); None unless started with [`Swtpm::start_for_host`].
    pub fn tcti(&self) -> Option<String> {
        self.data
            .as_ref()
            .map(|d| format!("swtpm:path={}", d.display()))
    }

    /// Stops swtpm (dropping it does the same).
    pub fn stop(self) {}

    /// Ends a TPM started with [`Swtpm::start_for_host`] as a machine's power-off does: an
    /// orderly TPM2_Shutdown on the data socket, then swtpm's own shutdown on the control socket,
    /// which stores its state and ends it. Killed instead, the TPM counts a disorderly shutdown
    /// at its next start, and a few of those lock it out (dictionary-attack protection): the
    /// node booting next on this state could open nothing.
    pub fn shutdown(mut self) -> Result<(), SwtpmError> {
        let fail = |socket: &Path, what: String| SwtpmError::Shutdown {
            socket: socket.into(),
            what,
        };
        if let Some(data) = &self.data {
            let rc = exchange(data, &TPM2_SHUTDOWN_CLEAR, 10)
                .map_err(|e| fail(data, format!("TPM2_Shutdown: {e}")))?;
            let code = u32::from_be_bytes([rc[6], rc[7], rc[8], rc[9]]);
            if code != 0 {
                return Err(fail(data, format!("TPM2_Shutdown answered {code:#x}")));
            }
        }
        let rc = exchange(&self.socket, &CMD_SHUTDOWN, 4)
            .map_err(|e| fail(&self.socket, format!("CMD_SHUTDOWN: {e}")))?;
        if rc != [0; 4] {
            return Err(fail(
                &self.socket,
                format!("CMD_SHUTDOWN answered {rc:02x?}"),
            ));
        }
        let started = Instant::now();
        while self.child.try_wait().ok().flatten().is_none() {
            if started.elapsed() > SHUTDOWN_TIMEOUT {
                return Err(fail(&self.socket, "swtpm did not end".into()));
            }
            std::thread::sleep(Duration::from_millis(20));
        }
        Ok(())
    }
}

/// Sends `request` on the Unix socket `path` and reads `len` bytes of answer.
fn exchange(path: &Path, request: &[u8], len: usize) -> std::io::Result<Vec<u8>> {
    use std::io::{Read, Write};
    let mut stream = std::os::unix::net::UnixStream::connect(path)?;
    stream.set_read_timeout(Some(SHUTDOWN_TIMEOUT))?;
    stream.write_all(request)?;
    let mut answer = vec![0; len];
    stream.read_exact(&mut answer)?;
    Ok(answer)
}

impl Drop for Swtpm {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}
