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
    let mut cmd = Command::new("qemu-system-x86_64");
    cmd.args([
        "-machine", "q35", "-accel", "tcg", "-cpu", "max", "-smp", "1",
    ])
    .args(["-m", "1024", "-display", "none", "-monitor", "none"])
    .args(["-nodefaults", "-no-reboot"]);
    if firmware == Firmware::Uefi {
        let vars = work.path().join("vars.fd");
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
    for image in images {
        cmd.arg("-drive")
            .arg(format!("file={},format=raw,if=virtio", image.display()));
    }
    cmd.arg("-serial").arg(format!("file:{}", log.display()));
    run_qemu(cmd, &log, &work.path().join("qemu.err"), what)
}

/// Runs qemu until it exits (the guest powered off); returns the cleaned serial console.
pub fn run_qemu(mut cmd: Command, log: &Path, err: &Path, what: &str) -> String {
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
        if started.elapsed() > TIMEOUT {
            break None;
        }
        std::thread::sleep(Duration::from_millis(200));
    };
    let console = crate::console::clean(&fs::read(log).unwrap_or_default());
    let Some(status) = status else {
        panic!("{what}: no poweroff within {TIMEOUT:?}; console:\n{console}");
    };
    let err = fs::read_to_string(err).unwrap_or_default();
    assert!(status.success(), "{what}: qemu {status}: {err}\n{console}");
    eprintln!("{what}: qemu ran {:.1?}", started.elapsed());
    console
}
