//! The one seam between the writer and the machine it runs on for everything that is not a
//! file: every command the writer runs and every query it makes of the host (`smartctl`, `ip
//! -json`, the teardown's `mdadm`, `dmsetup` and `wipefs`) goes through a [`Host`], chosen once
//! by the binary. [`Live`] runs the programs; [`Fixture`] answers for a fixture machine (a
//! sysroot directory, `docs/machine-checks.md`) from files below it, records what it was asked
//! to run, and fails any program the fixture names, so tests take the same code paths as a real
//! machine and can make any command fail. [`crate::Sysroot`] only reads files.

use std::fmt::Debug;
use std::io::Write;
use std::os::unix::process::ExitStatusExt;
use std::path::{Path, PathBuf};
use std::process::{Command, ExitStatus, Output};

/// Runs the machine's programs.
pub trait Host: Debug + Send + Sync {
    /// Runs `program` with `args` to its end and returns what it printed and its status.
    fn run(&self, program: &str, args: &[&str]) -> std::io::Result<Output>;

    /// Starts `program` with `args` in its own session, its output discarded, and returns at
    /// once: it outlives this process (the delayed reboot after a run).
    fn spawn_detached(&self, program: &str, args: &[&str]) -> std::io::Result<()>;
}

/// The machine this runs on: programs from `PATH`.
#[derive(Debug, Clone, Copy, Default)]
pub struct Live;

impl Host for Live {
    fn run(&self, program: &str, args: &[&str]) -> std::io::Result<Output> {
        Command::new(program).args(args).output()
    }

    #[allow(unsafe_code)] // setsid in the child between fork and exec
    fn spawn_detached(&self, program: &str, args: &[&str]) -> std::io::Result<()> {
        use std::os::unix::process::CommandExt;
        use std::process::Stdio;
        let mut cmd = Command::new(program);
        cmd.args(args)
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(Stdio::null());
        // SAFETY: setsid is async-signal-safe; it detaches the child from our session so it
        // outlives us (CAPH runs the writer under nohup over SSH).
        unsafe {
            cmd.pre_exec(|| {
                libc::setsid();
                Ok(())
            });
        }
        cmd.spawn().map(drop)
    }
}

/// A fixture machine below `root`. Answers:
/// - `smartctl ... /dev/NAME`: `<root>/smartctl/NAME.json` as its output (a missing file is a
///   program that cannot run);
/// - `ip -json addr show`, `ip -json route show`, `ip -6 -json route show`:
///   `<root>/ip/{addr,route,route6}.json`;
/// - `mdadm --stop /dev/NAME` and `dmsetup remove NAME`: the device leaves `<root>/sys/block`,
///   as the kernel's does;
/// - any other program: succeeds and prints nothing.
///
/// Every command (a detached one too, which is never started) is appended to
/// `<root>/host/ran`, one line each. A program named by a file
/// `<root>/host/fail/PROGRAM` fails instead: exit status 1, the file's text on stderr.
#[derive(Debug, Clone)]
pub struct Fixture {
    root: PathBuf,
}

impl Fixture {
    pub fn new(root: impl Into<PathBuf>) -> Fixture {
        Fixture { root: root.into() }
    }

    fn record(&self, program: &str, args: &[&str]) -> std::io::Result<()> {
        let dir = self.root.join("host");
        std::fs::create_dir_all(&dir)?;
        let mut log = std::fs::OpenOptions::new()
            .create(true)
            .append(true)
            .open(dir.join("ran"))?;
        writeln!(log, "{}", [&[program], args].concat().join(" "))
    }

    /// What the kernel does when the device `name` stops: it leaves sysfs.
    fn remove_block(&self, name: &str) -> std::io::Result<()> {
        let dir = self.root.join("sys/block").join(name);
        match std::fs::remove_dir_all(&dir) {
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => Ok(()),
            other => other,
        }
    }

    /// The dm-N device whose `dm/name` is `name`.
    fn dm_device(&self, name: &str) -> Option<String> {
        let dir = std::fs::read_dir(self.root.join("sys/block")).ok()?;
        dir.flatten()
            .map(|e| e.file_name().to_string_lossy().into_owned())
            .find(|dev| {
                let label = self.root.join("sys/block").join(dev).join("dm/name");
                std::fs::read_to_string(label).is_ok_and(|l| l.trim() == name)
            })
    }

    fn answer(&self, program: &str, args: &[&str]) -> std::io::Result<Vec<u8>> {
        let file = |rel: &str| std::fs::read(self.root.join(rel));
        match (program, args) {
            ("smartctl", [.., dev]) => {
                let name = Path::new(dev).file_name().unwrap_or_default();
                file(&format!("smartctl/{}.json", name.to_string_lossy()))
            }
            ("ip", ["-json", "addr", "show"]) => file("ip/addr.json"),
            ("ip", ["-json", "route", "show"]) => file("ip/route.json"),
            ("ip", ["-6", "-json", "route", "show"]) => file("ip/route6.json"),
            ("mdadm", ["--stop", dev]) => {
                self.remove_block(dev.trim_start_matches("/dev/"))?;
                Ok(Vec::new())
            }
            ("dmsetup", ["remove", name]) => {
                if let Some(dev) = self.dm_device(name) {
                    self.remove_block(&dev)?;
                }
                Ok(Vec::new())
            }
            _ => Ok(Vec::new()),
        }
    }
}

impl Host for Fixture {
    /// Recorded like [`Host::run`], never started; a program the fixture fails cannot start.
    fn spawn_detached(&self, program: &str, args: &[&str]) -> std::io::Result<()> {
        let out = self.run(program, args)?;
        if out.status.success() {
            Ok(())
        } else {
            Err(std::io::Error::other(
                String::from_utf8_lossy(&out.stderr).trim().to_owned(),
            ))
        }
    }

    fn run(&self, program: &str, args: &[&str]) -> std::io::Result<Output> {
        self.record(program, args)?;
        let fail = self.root.join("host/fail").join(program);
        if let Ok(why) = std::fs::read(&fail) {
            return Ok(Output {
                status: ExitStatus::from_raw(1 << 8),
                stdout: Vec::new(),
                stderr: why,
            });
        }
        Ok(Output {
            status: ExitStatus::from_raw(0),
            stdout: self.answer(program, args)?,
            stderr: Vec::new(),
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_fixture_answers_records_and_fails_what_it_is_told_to() {
        let dir = tempfile::tempdir().unwrap();
        let root = dir.path();
        std::fs::create_dir_all(root.join("smartctl")).unwrap();
        std::fs::write(root.join("smartctl/sda.json"), "{}").unwrap();
        std::fs::create_dir_all(root.join("sys/block/md127/slaves")).unwrap();
        let host = Fixture::new(root);
        let out = host
            .run("smartctl", &["--json=c", "-H", "-i", "/dev/sda"])
            .unwrap();
        assert!(out.status.success());
        assert_eq!(out.stdout, b"{}");
        assert!(
            host.run("smartctl", &["-H", "/dev/sdb"]).is_err(),
            "no fixture file"
        );
        host.run("mdadm", &["--stop", "/dev/md127"]).unwrap();
        assert!(
            !root.join("sys/block/md127").exists(),
            "the array left sysfs"
        );
        std::fs::create_dir_all(root.join("host/fail")).unwrap();
        std::fs::write(root.join("host/fail/wipefs"), "wipefs: busy").unwrap();
        let out = host.run("wipefs", &["--all", "/dev/sda1"]).unwrap();
        assert_eq!(
            (out.status.code(), &out.stderr[..]),
            (Some(1), &b"wipefs: busy"[..])
        );
        let ran = std::fs::read_to_string(root.join("host/ran")).unwrap();
        assert_eq!(
            ran.lines().collect::<Vec<_>>(),
            [
                "smartctl --json=c -H -i /dev/sda",
                "smartctl -H /dev/sdb",
                "mdadm --stop /dev/md127",
                "wipefs --all /dev/sda1"
            ]
        );
    }
}
