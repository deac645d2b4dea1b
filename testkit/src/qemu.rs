//! QEMU (TCG) for the boot tests: a VM runs until its guest powers off, and its serial console
//! comes back as text. [`boot_disk`] boots written disk images the way a node's firmware does.

use std::fs;
use std::path::Path;
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

pub const OVMF_CODE: &str = "/usr/share/OVMF/OVMF_CODE_4M.fd";
pub const OVMF_VARS: &str = "/usr/share/OVMF/OVMF_VARS_4M.fd";
/// OVMF built with Secure Boot (needs SMM and a secure flash); with [`OVMF_VARS`] it starts in
/// Setup Mode (no keys: Secure Boot off until a PK is enrolled).
pub const OVMF_CODE_SECBOOT: &str = "/usr/share/OVMF/OVMF_CODE_4M.secboot.fd";
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

/// The firmware a VM boots with.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Firmware {
    /// OVMF: the machine has `/sys/firmware/efi`.
    Uefi,
    /// QEMU's default SeaBIOS: legacy BIOS, as Hetzner's cloud VMs boot.
    Bios,
}

/// A qemu process, killed on drop (a failing assertion must not leave it running).
struct Qemu(std::process::Child);

impl Drop for Qemu {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
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
    let mut cmd = vm(firmware, 1, 1024, work.path());
    for image in images {
        cmd.arg("-drive")
            .arg(format!("file={},format=raw,if=virtio", image.display()));
    }
    cmd.arg("-serial").arg(format!("file:{}", log.display()));
    run_qemu(cmd, &log, &work.path().join("qemu.err"), what)
}

/// A q35 TCG machine with `cpus` and `mem_mib`, no devices yet, that powers off instead of
/// rebooting; with UEFI, OVMF with its own copy of the variable store in `work`.
pub fn vm(firmware: Firmware, cpus: u32, mem_mib: u32, work: &Path) -> Command {
    let mut cmd = Command::new("qemu-system-x86_64");
    cmd.args(["-machine", "q35", "-accel", "tcg", "-cpu", "max"])
        .args(["-smp", &cpus.to_string(), "-m", &mem_mib.to_string()])
        .args(["-display", "none", "-monitor", "none"])
        .args(["-nodefaults", "-no-reboot"]);
    if firmware == Firmware::Uefi {
        let vars = work.join("vars.fd");
        fs::copy(OVMF_VARS, &vars).unwrap();
        cmd.arg("-drive")
            .arg(format!(
                "if=pflash,format=raw,unit=0,readonly=on,file={OVMF_CODE}"
            ))
            .arg("-drive")
            .arg(format!(
                "if=pflash,format=raw,unit=1,file={}",
                vars.display()
            ));
    }
    cmd
}

/// A q35 TCG machine with OVMF's Secure Boot build, SMM and a secure flash, booting with the
/// variable store `vars` (used in place: pass a copy), that powers off instead of rebooting;
/// no disks yet.
pub fn vm_secure_boot(cpus: u32, mem_mib: u32, vars: &Path) -> Command {
    let mut cmd = Command::new("qemu-system-x86_64");
    cmd.args(["-machine", "q35,smm=on", "-accel", "tcg", "-cpu", "max"])
        .args(["-smp", &cpus.to_string(), "-m", &mem_mib.to_string()])
        .args(["-display", "none", "-monitor", "none"])
        .args(["-nodefaults", "-no-reboot"])
        .args(["-global", "driver=cfi.pflash01,property=secure,value=on"])
        .arg("-drive")
        .arg(format!(
            "if=pflash,format=raw,unit=0,readonly=on,file={OVMF_CODE_SECBOOT}"
        ))
        .arg("-drive")
        .arg(format!(
            "if=pflash,format=raw,unit=1,file={}",
            vars.display()
        ));
    cmd
}

/// A software TPM 2.0 (`swtpm socket`) for one VM, its state in a directory of its own; the
/// process is killed on drop.
pub struct Swtpm {
    child: std::process::Child,
    socket: std::path::PathBuf,
}

impl Swtpm {
    /// Starts swtpm with a fresh state in `dir`; waits for its control socket.
    pub fn start(dir: &Path) -> Swtpm {
        let state = dir.join("tpm");
        fs::create_dir_all(&state).unwrap();
        let socket = state.join("ctrl.sock");
        let child = Command::new("swtpm")
            .arg("socket")
            .arg("--tpm2")
            .arg("--tpmstate")
            .arg(format!("dir={}", state.display()))
            .arg("--ctrl")
            .arg(format!("type=unixio,path={}", socket.display()))
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .spawn()
            .expect("swtpm");
        let tpm = Swtpm { child, socket };
        let started = Instant::now();
        while !tpm.socket.exists() {
            assert!(
                started.elapsed() < Duration::from_secs(30),
                "swtpm did not start"
            );
            std::thread::sleep(Duration::from_millis(50));
        }
        tpm
    }

    /// The qemu arguments that give the VM this TPM (TIS, as on most servers).
    pub fn qemu_args(&self) -> Vec<String> {
        vec![
            "-chardev".into(),
            format!("socket,id=chrtpm,path={}", self.socket.display()),
            "-tpmdev".into(),
            "emulator,id=tpm0,chardev=chrtpm".into(),
            "-device".into(),
            "tpm-tis,tpmdev=tpm0".into(),
        ]
    }
}

impl Drop for Swtpm {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// Boots `images` (virtio-blk, the firmware boots the first) under OVMF's Secure Boot build with
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
    let copy = work.path().join("vars.fd");
    fs::copy(vars, &copy).unwrap();
    let mut cmd = vm_secure_boot(1, 1024, &copy);
    for s in smbios {
        cmd.arg("-smbios").arg(format!("type=11,value={s}"));
    }
    for image in images {
        cmd.arg("-drive")
            .arg(format!("file={},format=raw,if=virtio", image.display()));
    }
    let swtpm = tpm.then(|| Swtpm::start(work.path()));
    if let Some(t) = &swtpm {
        cmd.args(t.qemu_args());
    }
    cmd.arg("-serial").arg(format!("file:{}", log.display()));
    let console = run_qemu_until(
        cmd,
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

/// [`run_qemu_until`] that also fails once the console has printed nothing for `silence`: a
/// guest frozen whole (a nested guest that never gives its vCPU back stops every timer of the
/// guest's own, so no bound inside it can fire) fails then, naming its last line, and not only
/// at `timeout`.
pub fn run_qemu_watched(
    mut cmd: Command,
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
    let started = Instant::now();
    let child = cmd
        .stdin(Stdio::null())
        .stdout(Stdio::null())
        .stderr(fs::File::create(err).unwrap())
        .spawn()
        .expect("qemu-system-x86_64");
    let mut q = Qemu(child);
    let mut seen = false;
    let (mut printed, mut last_output) = (0, Instant::now());
    let mut silent = false;
    let status = loop {
        if let Some(s) = q.0.try_wait().unwrap() {
            break Some(s);
        }
        if started.elapsed() > timeout {
            break None;
        }
        if let Some(limit) = silence {
            let len = fs::metadata(log).map_or(0, |m| m.len());
            if len != printed {
                (printed, last_output) = (len, Instant::now());
            } else if last_output.elapsed() > limit {
                silent = true;
                break None;
            }
        }
        if !until.is_empty() {
            let text = crate::console::clean(&fs::read(log).unwrap_or_default());
            if until.iter().any(|u| text.contains(u)) {
                seen = true;
                break None;
            }
        }
        std::thread::sleep(Duration::from_millis(200));
    };
    let console = crate::console::clean(&fs::read(log).unwrap_or_default());
    if seen {
        eprintln!(
            "{what}: console showed {until:?} after {:.1?}",
            started.elapsed()
        );
        record(what, cores.waited, started.elapsed());
        return console;
    }
    let Some(status) = status else {
        let kept = keep_console(what, &console);
        if silent {
            panic!(
                "{what}: the console printed nothing for {:?} (the guest hung) after {:.1?}; \
                 whole console in {kept}; its end:\n{}",
                silence.unwrap_or_default(),
                started.elapsed(),
                crate::console::tail(&console, TAIL_LINES)
            );
        }
        panic!(
            "{what}: no poweroff within {timeout:?}; whole console in {kept}; its end:\n{}",
            crate::console::tail(&console, TAIL_LINES)
        );
    };
    let err = fs::read_to_string(err).unwrap_or_default();
    if !status.success() {
        let kept = keep_console(what, &console);
        panic!(
            "{what}: qemu {status}: {err}\nwhole console in {kept}; its end:\n{}",
            crate::console::tail(&console, TAIL_LINES)
        );
    }
    eprintln!("{what}: qemu ran {:.1?}", started.elapsed());
    record(what, cores.waited, started.elapsed());
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
        let mut c = Command::new("qemu-system-x86_64");
        assert_eq!(vcpus(&c), 1);
        c.args(["-m", "2048", "-smp", "2"]);
        assert_eq!(vcpus(&c), 2);
        let mut c = Command::new("qemu-system-x86_64");
        c.args(["-smp", "cpus=4,sockets=1"]);
        assert_eq!(vcpus(&c), 4);
    }
}
