//! `ingot vm` run as a developer runs it, for the boot tests that go through the command: the
//! `ingot` binary the workspace build put beside `ingot-writer`, with that writer, its console
//! and messages captured, one host core held (TCG, one vCPU), killed at [`TIMEOUT`].

use std::ffi::OsStr;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Output, Stdio};
use std::time::{Duration, Instant};

/// TCG beside the rest of the suite: generous, never asserted on.
pub const TIMEOUT: Duration = Duration::from_secs(900);

/// The `ingot` binary beside `ingot-writer`.
pub fn ingot() -> PathBuf {
    let writer = Path::new(env!("CARGO_BIN_EXE_ingot-writer"));
    let ingot = writer.with_file_name("ingot");
    assert!(
        ingot.is_file(),
        "{} is not built (cargo test --workspace builds it)",
        ingot.display()
    );
    ingot
}

/// The arguments every test's `ingot vm` of a published stack starts with: the stack's URL (or
/// layout), the key it is signed with, the VM's state directory.
pub fn stack_args<'a>(source: &'a str, public: &'a Path, state: &'a Path) -> Vec<&'a OsStr> {
    vec![
        source.as_ref(),
        "--trust-key".as_ref(),
        public.as_os_str(),
        "--state".as_ref(),
        state.as_os_str(),
    ]
}

/// `ingot vm ARGS`, with `envs` added to its environment (the writer it runs inherits them);
/// killed after `timeout`.
pub fn run<S: AsRef<OsStr>>(args: &[S], envs: &[(&str, &str)], timeout: Duration) -> Output {
    spawn(args, envs).finish(timeout)
}

/// A running `ingot vm`, one host core held for it.
pub struct Running {
    child: Child,
    started: Instant,
    shown: String,
    _core: ingot_testkit::cores::Held,
}

/// Starts `ingot vm ARGS` (see [`run`]); [`Running::finish`] waits for it.
pub fn spawn<S: AsRef<OsStr>>(args: &[S], envs: &[(&str, &str)]) -> Running {
    let core = ingot_testkit::cores::hold(1);
    let child = Command::new(ingot())
        .arg("vm")
        .args(args)
        .env("INGOT_WRITER", env!("CARGO_BIN_EXE_ingot-writer"))
        .envs(envs.iter().copied())
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    let shown: Vec<_> = args.iter().map(|a| a.as_ref().to_string_lossy()).collect();
    Running {
        child,
        started: Instant::now(),
        shown: format!("{shown:?}"),
        _core: core,
    }
}

impl Running {
    /// Waits for the command to end, killing it once `timeout` has passed since its start.
    pub fn finish(self, timeout: Duration) -> Output {
        let (pid, started) = (self.child.id(), self.started);
        let watchdog = std::thread::spawn(move || {
            while started.elapsed() < timeout {
                std::thread::sleep(Duration::from_secs(1));
                if !Path::new(&format!("/proc/{pid}")).exists() {
                    return;
                }
            }
            let _ = Command::new("kill").arg(pid.to_string()).status();
        });
        let out = self.child.wait_with_output().unwrap();
        drop(watchdog);
        eprintln!("ingot vm {}: {:.1?}", self.shown, started.elapsed());
        out
    }
}

/// `ingot vm ssh --state STATE -- COMMAND`: its output.
pub fn ssh(state: &Path, command: &str) -> Output {
    Command::new(ingot())
        .args(["vm", "ssh", "--state"])
        .arg(state)
        .arg("--")
        .arg(command)
        .stdin(Stdio::null())
        .output()
        .unwrap()
}

/// The console (stdout) and `ingot vm`'s own messages (stderr), cleaned of CRs and escapes.
pub fn text(out: &Output) -> String {
    ingot_vm::console::clean(&[out.stdout.as_slice(), out.stderr.as_slice()].concat())
}
