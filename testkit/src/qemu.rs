//! QEMU (TCG) for the boot tests: a VM runs until its guest powers off, and its serial console
//! comes back as text. [`boot_disk`] boots written disk images the way a node's firmware does.

use std::fs;
use std::path::Path;
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

pub const OVMF_CODE: &str = "/usr/share/OVMF/OVMF_CODE_4M.fd";
pub const OVMF_VARS: &str = "/usr/share/OVMF/OVMF_VARS_4M.fd";
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

/// Runs qemu until it exits (the guest powered off); returns the cleaned serial console.
pub fn run_qemu(cmd: Command, log: &Path, err: &Path, what: &str) -> String {
    run_qemu_within(cmd, log, err, what, TIMEOUT)
}

/// [`run_qemu`] with its own limit (a full distribution boots slower than the fixture).
pub fn run_qemu_within(
    mut cmd: Command,
    log: &Path,
    err: &Path,
    what: &str,
    timeout: Duration,
) -> String {
    let started = Instant::now();
    let child = cmd
        .stdin(Stdio::null())
        .stdout(Stdio::null())
        .stderr(fs::File::create(err).unwrap())
        .spawn()
        .expect("qemu-system-x86_64");
    let mut q = Qemu(child);
    let status = loop {
        if let Some(s) = q.0.try_wait().unwrap() {
            break Some(s);
        }
        if started.elapsed() > timeout {
            break None;
        }
        std::thread::sleep(Duration::from_millis(200));
    };
    let console = crate::console::clean(&fs::read(log).unwrap_or_default());
    let Some(status) = status else {
        panic!("{what}: no poweroff within {timeout:?}; console:\n{console}");
    };
    let err = fs::read_to_string(err).unwrap_or_default();
    assert!(status.success(), "{what}: qemu {status}: {err}\n{console}");
    eprintln!("{what}: qemu ran {:.1?}", started.elapsed());
    console
}
