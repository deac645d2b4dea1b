//! Running a command on hostile input and measuring it: peak RSS (`wait4`'s `ru_maxrss` of the
//! child), wall time, and a kill after a deadline so that a hang fails the test instead of
//! hanging it. The child's address space is capped (RLIMIT_AS) so that a build without the
//! bounds under test fails on its own instead of taking the machine's memory.

// wait4 and setrlimit through libc: std and rustix do not return a child's rusage.
#![allow(unsafe_code)]

use std::io::Read;
use std::os::unix::process::{CommandExt, ExitStatusExt};
use std::process::{Command, ExitStatus, Stdio};
use std::time::{Duration, Instant};

/// The address-space cap of a measured child.
pub const AS_LIMIT: u64 = 3 << 30;

/// How a measured run ended.
#[derive(Debug)]
pub struct Run {
    pub status: ExitStatus,
    pub stdout: String,
    pub stderr: String,
    pub max_rss_kib: i64,
    pub elapsed: Duration,
    /// Killed at the deadline.
    pub timed_out: bool,
}

impl Run {
    /// Prints the measurements (the test's output shows them with `--nocapture`).
    pub fn print(&self, what: &str) {
        eprintln!(
            "{what}: exit {:?} (signal {:?}){}, peak RSS {} KiB, wall {:.2?}",
            self.status.code(),
            self.status.signal(),
            if self.timed_out {
                ", KILLED at the deadline"
            } else {
                ""
            },
            self.max_rss_kib,
            self.elapsed
        );
    }
}

/// Runs `cmd`, calling `poll(pid)` every 2 ms while it runs, killing it at `deadline`.
pub fn measured_with(mut cmd: Command, deadline: Duration, mut poll: impl FnMut(u32)) -> Run {
    cmd.stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped());
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
    let started = Instant::now();
    let mut child = cmd.spawn().expect("running the command");
    let pipe = |mut r: Box<dyn Read + Send>| {
        std::thread::spawn(move || {
            let mut s = Vec::new();
            let _ = r.read_to_end(&mut s);
            String::from_utf8_lossy(&s).into_owned()
        })
    };
    let out = pipe(Box::new(child.stdout.take().unwrap()));
    let err = pipe(Box::new(child.stderr.take().unwrap()));
    let pid = child.id() as libc::pid_t;
    let mut status = 0i32;
    // SAFETY: an all-zero rusage is a valid value; wait4 fills it in for this child only.
    let mut usage: libc::rusage = unsafe { std::mem::zeroed() };
    let mut timed_out = false;
    loop {
        // SAFETY: waits for our own child by pid; std's Child is not waited on afterwards.
        let got = unsafe { libc::wait4(pid, &mut status, libc::WNOHANG, &mut usage) };
        if got == pid {
            break;
        }
        assert_eq!(got, 0, "wait4: {}", std::io::Error::last_os_error());
        if started.elapsed() > deadline && !timed_out {
            timed_out = true;
            // SAFETY: signals our own child, not yet reaped.
            unsafe { libc::kill(pid, libc::SIGKILL) };
        }
        poll(pid as u32);
        std::thread::sleep(Duration::from_millis(2));
    }
    std::mem::forget(child);
    Run {
        status: ExitStatus::from_raw(status),
        stdout: out.join().unwrap(),
        stderr: err.join().unwrap(),
        max_rss_kib: usage.ru_maxrss,
        elapsed: started.elapsed(),
        timed_out,
    }
}
