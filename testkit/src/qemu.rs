//! QEMU (TCG) for the boot tests: a VM runs until its guest powers off, and its serial console
//! comes back as text. [`boot_disk`] boots written disk images the way a node's firmware does.
//! The machines, their command lines, the firmware's files, swtpm and the watched run are
//! `ingot-vm`'s, the code `ingot vm` boots with; this module adds the tests' policy: TCG, a
//! free host core per vCPU, generous limits, a failure that panics with the console's end.

use std::fs;
use std::path::Path;
use std::process::Command;
use std::time::Duration;

use ingot_vm::accel::Accel;
/// The firmware's files where Debian installs them (the boot tests check for them to skip).
pub use ingot_vm::firmware::*;
use ingot_vm::machine::{Boot, Disk, Machine, Serial};
use ingot_vm::run::{End, Watch};
use ingot_vm::swtpm::Swtpm;

/// TCG on two shared cores: generous, never a measure of anything.
pub const TIMEOUT: Duration = Duration::from_secs(900);

/// The kernel arguments every test boot adds: the serial console the test reads, a panic that
/// ends the VM, and `no_timer_check`: under TCG on a loaded host the kernel's IO-APIC timer check
/// can miss its ticks and panic ("IO-APIC + timer doesn't work!", seen in a full run beside
/// other VMs), a check KVM guests skip for the same reason.
pub const KERNEL_ARGS: [&str; 3] = ["no_timer_check", "console=ttyS0", "panic=-1"];

/// [`KERNEL_ARGS`] as the writer's options (`--kernel-arg ARG` each).
pub fn writer_kernel_args() -> Vec<&'static str> {
    KERNEL_ARGS
        .iter()
        .flat_map(|a| ["--kernel-arg", *a])
        .collect()
}

/// Boots a written disk (virtio-blk) with `firmware` until the node powers off; returns the
/// serial console.
pub fn boot_disk(image: &Path, firmware: Firmware, what: &str) -> String {
    boot_disks(&[image], firmware, what)
}

/// Boots a machine with `images` as its virtio-blk disks, in order (the firmware boots the
/// first), until it powers off; returns the serial console.
pub fn boot_disks(images: &[&Path], firmware: Firmware, what: &str) -> String {
    let work = tempfile::tempdir_in("/var/tmp").unwrap();
    let log = work.path().join("serial.log");
    let mut m = machine(firmware, 1, 1024, work.path());
    m.disks = virtio(images);
    m.serial = Serial::File(log.clone());
    run_qemu(m.command(), &log, &work.path().join("qemu.err"), what)
}

/// A test machine (TCG) booting with `firmware` (UEFI: its own copy of the variable
/// store in `work`), `cpus` and `mem_mib`, no disks and no serial port yet.
pub fn machine(firmware: Firmware, cpus: u32, mem_mib: u32, work: &Path) -> Machine {
    let images = Lookup::system()
        .firmware(firmware)
        .unwrap_or_else(|e| panic!("{e}"));
    let boot = match images.vars_template {
        None => Boot::Bios { image: images.code },
        Some(template) => {
            let vars = work.join("vars.fd");
            fs::copy(template, &vars).unwrap();
            match firmware {
                Firmware::SecureBoot => Boot::SecureBoot {
                    code: images.code,
                    vars,
                },
                _ => Boot::Uefi {
                    code: images.code,
                    vars,
                },
            }
        }
    };
    let mut m = Machine::new(boot, Serial::None);
    (m.accel, m.cpus, m.memory_mib) = (Accel::Tcg, cpus, mem_mib);
    m
}

/// `images` as virtio-blk disks.
pub fn virtio(images: &[&Path]) -> Vec<Disk> {
    images
        .iter()
        .map(|i| Disk {
            image: i.to_path_buf(),
            id: None,
        })
        .collect()
}

/// Boots `images` (virtio-blk, the firmware boots the first) under the Secure Boot firmware with
/// a copy of the variable store `vars` (and, with `tpm`, a fresh software TPM), until the guest
/// powers off, or, with `until`, until the console shows one of those texts (a refused image:
/// the firmware then waits for a boot option for ever); returns the serial console. `smbios`:
/// OEM strings (SMBIOS type 11) the firmware hands the guest, as a machine's firmware or BMC
/// may.
pub fn boot_secure(
    images: &[&Path],
    vars: &Path,
    tpm: bool,
    until: &[&str],
    smbios: &[&str],
    what: &str,
) -> String {
    let work = tempfile::tempdir_in("/var/tmp").unwrap();
    let log = work.path().join("serial.log");
    let mut m = machine(Firmware::SecureBoot, 1, 1024, work.path());
    m.serial = Serial::File(log.clone());
    if let Boot::SecureBoot { vars: copy, .. } = &m.boot {
        fs::copy(vars, copy).unwrap();
    }
    m.oem_strings = smbios.iter().map(|s| s.to_string()).collect();
    m.disks = virtio(images);
    let swtpm = tpm.then(|| {
        let program = Lookup::system().swtpm().unwrap_or_else(|e| panic!("{e}"));
        Swtpm::start(&program, &work.path().join("tpm")).expect("swtpm")
    });
    m.tpm = swtpm.as_ref().map(|t| t.socket().to_path_buf());
    let console = run_qemu_until(
        m.command(),
        &log,
        &work.path().join("qemu.err"),
        what,
        until,
        TIMEOUT,
    );
    drop(swtpm);
    console
}

/// Runs qemu until it exits (the guest powered off); returns the cleaned serial console.
pub fn run_qemu(cmd: Command, log: &Path, err: &Path, what: &str) -> String {
    run_qemu_within(cmd, log, err, what, TIMEOUT)
}

/// [`run_qemu`] with its own limit (a full distribution boots slower than the fixture).
pub fn run_qemu_within(
    cmd: Command,
    log: &Path,
    err: &Path,
    what: &str,
    timeout: Duration,
) -> String {
    run_qemu_until(cmd, log, err, what, &[], timeout)
}

/// [`run_qemu_within`] that also ends (killing qemu) once the console shows one of `until`.
/// The guest first waits for a free host core per vCPU ([`crate::cores`]); `timeout` counts from
/// its start.
pub fn run_qemu_until(
    cmd: Command,
    log: &Path,
    err: &Path,
    what: &str,
    until: &[&str],
    timeout: Duration,
) -> String {
    run_qemu_watched(cmd, log, err, what, until, timeout, None)
}

/// [`run_qemu_until`] that also fails once the console has printed nothing for `silence`
/// ([`Watch::silence`]), naming its last line, and not only at `timeout`.
pub fn run_qemu_watched(
    cmd: Command,
    log: &Path,
    err: &Path,
    what: &str,
    until: &[&str],
    timeout: Duration,
    silence: Option<Duration>,
) -> String {
    let cores = crate::cores::hold(vcpus(&cmd));
    if cores.waited > Duration::from_secs(1) {
        eprintln!("{what}: waited {:.1?} for a free core", cores.waited);
    }
    let watch = Watch {
        log,
        stderr: err,
        until,
        timeout,
        silence,
    };
    let ran = ingot_vm::run::watch(cmd, &watch).unwrap_or_else(|e| panic!("{what}: {e}"));
    let console = ran.console;
    let tail = || crate::console::tail(&console, TAIL_LINES);
    match ran.end {
        End::Marker(_) => {
            eprintln!("{what}: console showed {until:?} after {:.1?}", ran.ran);
        }
        End::Silent => panic!(
            "{what}: the console printed nothing for {:?} (the guest hung) after {:.1?}; \
             whole console in {}; its end:\n{}",
            silence.unwrap_or_default(),
            ran.ran,
            keep_console(what, &console),
            tail()
        ),
        End::TimedOut => panic!(
            "{what}: no poweroff within {timeout:?}; whole console in {}; its end:\n{}",
            keep_console(what, &console),
            tail()
        ),
        End::Exited(status) if !status.success() => panic!(
            "{what}: qemu {status}: {}\nwhole console in {}; its end:\n{}",
            ran.stderr,
            keep_console(what, &console),
            tail()
        ),
        End::Exited(_) => eprintln!("{what}: qemu ran {:.1?}", ran.ran),
    }
    record(what, cores.waited, ran.ran);
    console
}

/// One finished guest of this test process: where a VM test's time went.
#[derive(Clone, Debug)]
pub struct Run {
    pub what: String,
    /// Waiting for free cores ([`crate::cores`]).
    pub waited: Duration,
    /// From its start to its end.
    pub ran: Duration,
}

fn runs_log() -> &'static std::sync::Mutex<Vec<Run>> {
    static RUNS: std::sync::OnceLock<std::sync::Mutex<Vec<Run>>> = std::sync::OnceLock::new();
    RUNS.get_or_init(Default::default)
}

fn record(what: &str, waited: Duration, ran: Duration) {
    let run = Run {
        what: what.to_string(),
        waited,
        ran,
    };
    runs_log()
        .lock()
        .unwrap_or_else(|e| e.into_inner())
        .push(run);
}

/// Every guest this process ran to its end so far, in the order they ended.
pub fn runs() -> Vec<Run> {
    runs_log().lock().unwrap_or_else(|e| e.into_inner()).clone()
}

/// [`runs`] as a table (guest, waited for cores, ran), with the sums, for a test's log.
pub fn runs_table() -> String {
    let runs = runs();
    let mut out = format!("{:<24} {:>10} {:>10}\n", "guest", "waited", "ran");
    for r in &runs {
        let (w, t) = (r.waited.as_secs_f64(), r.ran.as_secs_f64());
        out += &format!("{:<24} {w:>9.0}s {t:>9.0}s\n", r.what);
    }
    let waited: f64 = runs.iter().map(|r| r.waited.as_secs_f64()).sum();
    let ran: f64 = runs.iter().map(|r| r.ran.as_secs_f64()).sum();
    out += &format!("{:<24} {waited:>9.0}s {ran:>9.0}s\n", "sum");
    out
}

/// The guest's vCPUs: `-smp N` (or `-smp cpus=N,...`), else QEMU's default of one.
fn vcpus(cmd: &Command) -> usize {
    let args: Vec<_> = cmd.get_args().filter_map(|a| a.to_str()).collect();
    args.windows(2)
        .find(|w| w[0] == "-smp")
        .and_then(|w| {
            let first = w[1].split(',').next()?;
            first.strip_prefix("cpus=").unwrap_or(first).parse().ok()
        })
        .unwrap_or(1)
}

/// How much of a failed guest's console a panic message shows: its end says why it stopped, and
/// CI's report keeps only so much of a message.
const TAIL_LINES: usize = 150;

/// Copies a failed guest's console out of its work directory (removed as the test unwinds) to
/// `/var/tmp/ingot-consoles/`; returns where, or why not.
fn keep_console(what: &str, console: &str) -> String {
    let dir = Path::new("/var/tmp/ingot-consoles");
    let name: String = what
        .chars()
        .map(|c| {
            if c.is_ascii_alphanumeric() || c == '-' {
                c
            } else {
                '_'
            }
        })
        .collect();
    let path = dir.join(format!("{name}-{}.log", std::process::id()));
    match fs::create_dir_all(dir).and_then(|()| fs::write(&path, console)) {
        Ok(()) => path.display().to_string(),
        Err(e) => format!("(not kept: {e})"),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn runs_table_lists_each_run_and_the_sums() {
        record("a-guest", Duration::from_secs(3), Duration::from_secs(100));
        record("b-guest", Duration::from_secs(0), Duration::from_secs(50));
        let table = runs_table();
        let row = |name: &str| {
            table
                .lines()
                .find(|l| l.starts_with(name))
                .unwrap_or_else(|| panic!("no {name} in\n{table}"))
                .split_whitespace()
                .skip(1)
                .collect::<Vec<_>>()
                .join(" ")
        };
        assert_eq!(row("a-guest"), "3s 100s");
        assert_eq!(row("b-guest"), "0s 50s");
        // Other tests of this process may have run guests too: the sums cover at least these.
        let sum: Vec<f64> = row("sum")
            .split(' ')
            .map(|v| v.trim_end_matches('s').parse().unwrap())
            .collect();
        assert!(sum[0] >= 3.0 && sum[1] >= 150.0, "{table}");
    }

    #[test]
    fn vcpus_come_from_smp() {
        let mut c = Command::new(QEMU);
        assert_eq!(vcpus(&c), 1);
        c.args(["-m", "2048", "-smp", "2"]);
        assert_eq!(vcpus(&c), 2);
        let mut c = Command::new(QEMU);
        c.args(["-smp", "cpus=4,sockets=1"]);
        assert_eq!(vcpus(&c), 4);
    }
}
