//! Running a command on hostile input and measuring it: peak RSS (the child's `VmHWM`, sampled
//! while it runs), wall time, and a kill after a deadline (or past an RSS cap) so that a hang or a
//! runaway read fails the test instead of hanging it or taking the machine's memory. The child's
//! address space is capped (RLIMIT_AS) so that a build without the bounds under test fails on
//! its own.

// wait4 and setrlimit through libc: std and rustix do not return a child's rusage.
#![allow(unsafe_code)]

use std::io::{Read, Write};
use std::os::unix::process::{CommandExt, ExitStatusExt};
use std::process::{Command, ExitStatus, Stdio};
use std::time::{Duration, Instant};

/// The address-space cap of a measured child.
pub const AS_LIMIT: u64 = 3 << 30;

/// Why a measured run was killed (SIGKILL) by the measurement.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Killed {
    /// It ran past its deadline.
    Deadline,
    /// Its resident set passed [`Limits::rss_cap_kib`].
    Memory,
}

/// What a measured run may spend, and what it reads on stdin.
#[derive(Debug, Clone)]
pub struct Limits {
    pub deadline: Duration,
    /// Killed once `VmRSS` passes this many KiB; `None`: only RLIMIT_AS bounds it.
    pub rss_cap_kib: Option<u64>,
    /// Written to the child's stdin, which is then closed; `None`: stdin is /dev/null.
    pub stdin: Option<Vec<u8>>,
}

impl Limits {
    /// A deadline alone.
    pub fn deadline(deadline: Duration) -> Self {
        Limits {
            deadline,
            rss_cap_kib: None,
            stdin: None,
        }
    }
}

/// How a measured run ended.
#[derive(Debug)]
pub struct Run {
    pub status: ExitStatus,
    pub stdout: String,
    pub stderr: String,
    pub max_rss_kib: i64,
    pub elapsed: Duration,
    /// Killed by the measurement, and why.
    pub killed: Option<Killed>,
}

impl Run {
    /// Prints the measurements (the test's output shows them with `--nocapture`).
    pub fn print(&self, what: &str) {
        eprintln!(
            "{what}: exit {:?} (signal {:?}){}, peak RSS {} KiB, wall {:.2?}",
            self.status.code(),
            self.status.signal(),
            match self.killed {
                Some(Killed::Deadline) => ", KILLED at the deadline",
                Some(Killed::Memory) => ", KILLED past its RSS cap",
                None => "",
            },
            self.max_rss_kib,
            self.elapsed
        );
    }
}

/// Runs `cmd`, calling `poll(pid)` every 2 ms while it runs, killing it at `deadline`.
pub fn measured_with(cmd: Command, deadline: Duration, poll: impl FnMut(u32)) -> Run {
    measured(cmd, Limits::deadline(deadline), poll)
}

/// Runs `cmd` within `limits`, calling `poll(pid)` every 2 ms while it runs.
pub fn measured(mut cmd: Command, limits: Limits, mut poll: impl FnMut(u32)) -> Run {
    cmd.stdin(if limits.stdin.is_some() {
        Stdio::piped()
    } else {
        Stdio::null()
    })
    .stdout(Stdio::piped())
    .stderr(Stdio::piped());
    cap_address_space(&mut cmd);
    let started = Instant::now();
    let mut child = cmd.spawn().expect("running the command");
    if let (Some(bytes), Some(mut stdin)) = (limits.stdin, child.stdin.take()) {
        // A thread: a child that does not read its stdin must not block the measurement.
        std::thread::spawn(move || {
            let _ = stdin.write_all(&bytes);
        });
    }
    let out = read_all(Box::new(child.stdout.take().unwrap()));
    let err = read_all(Box::new(child.stderr.take().unwrap()));
    let pid = child.id() as libc::pid_t;
    let mut status = 0i32;
    // SAFETY: an all-zero rusage is a valid value; wait4 fills it in for this child only.
    let mut usage: libc::rusage = unsafe { std::mem::zeroed() };
    let mut killed = None;
    let mut hwm = None;
    let ours = std::fs::read_link("/proc/self/exe").ok();
    loop {
        // SAFETY: waits for our own child by pid; std's Child is not waited on afterwards.
        let got = unsafe { libc::wait4(pid, &mut status, libc::WNOHANG, &mut usage) };
        if got == pid {
            break;
        }
        assert_eq!(got, 0, "wait4: {}", std::io::Error::last_os_error());
        if killed.is_none() {
            killed = over_limits(pid, started, &limits.deadline, limits.rss_cap_kib);
            if killed.is_some() {
                // SAFETY: signals our own child, not yet reaped.
                unsafe { libc::kill(pid, libc::SIGKILL) };
            }
        }
        hwm = hwm.max(exec_hwm_kib(pid, ours.as_deref()));
        poll(pid as u32);
        std::thread::sleep(Duration::from_millis(2));
    }
    std::mem::forget(child);
    Run {
        status: ExitStatus::from_raw(status),
        stdout: out.join().unwrap(),
        stderr: err.join().unwrap(),
        // wait4's ru_maxrss counts the forked copy of this test process too (the kernel keeps
        // the larger of the pre-exec and post-exec peaks), so it grows with whatever the other
        // tests of this binary hold at the moment: only a child too short to be sampled once
        // falls back to it.
        max_rss_kib: hwm.unwrap_or(usage.ru_maxrss),
        elapsed: started.elapsed(),
        killed,
    }
}

fn cap_address_space(cmd: &mut Command) {
    // SAFETY: only setrlimit (async-signal-safe) runs between fork and exec.
    unsafe {
        cmd.pre_exec(|| {
            let lim = libc::rlimit {
                rlim_cur: AS_LIMIT,
                rlim_max: AS_LIMIT,
            };
            if libc::setrlimit(libc::RLIMIT_AS, &lim) != 0 {
                return Err(std::io::Error::last_os_error());
            }
            Ok(())
        });
    }
}

fn read_all(mut r: Box<dyn Read + Send>) -> std::thread::JoinHandle<String> {
    std::thread::spawn(move || {
        let mut s = Vec::new();
        let _ = r.read_to_end(&mut s);
        String::from_utf8_lossy(&s).into_owned()
    })
}

/// The peak RSS of `pid`'s own program, once it has exec'd (its exe is no longer `ours`).
fn exec_hwm_kib(pid: libc::pid_t, ours: Option<&std::path::Path>) -> Option<i64> {
    let exe = std::fs::read_link(format!("/proc/{pid}/exe")).ok()?;
    if Some(exe.as_path()) == ours {
        return None;
    }
    std::fs::read_to_string(format!("/proc/{pid}/status"))
        .ok()?
        .lines()
        .find_map(|l| l.strip_prefix("VmHWM:"))
        .and_then(|v| v.split_whitespace().next()?.parse().ok())
}

/// Whether the running child `pid` is past its deadline or its RSS cap.
fn over_limits(
    pid: libc::pid_t,
    started: Instant,
    deadline: &Duration,
    rss_cap_kib: Option<u64>,
) -> Option<Killed> {
    if started.elapsed() > *deadline {
        return Some(Killed::Deadline);
    }
    let cap = rss_cap_kib?;
    let rss_kib: u64 = std::fs::read_to_string(format!("/proc/{pid}/status"))
        .ok()?
        .lines()
        .find_map(|l| l.strip_prefix("VmRSS:"))
        .and_then(|v| v.split_whitespace().next()?.parse().ok())?;
    (rss_kib > cap).then_some(Killed::Memory)
}
