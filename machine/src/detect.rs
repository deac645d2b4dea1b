//! What this machine is: firmware, PCI devices, CPU virtualization, disks.

use serde::Serialize;

use crate::error::MachineError;
use crate::{disks, Disk, Sysroot};

/// One PCI function from `/sys/bus/pci/devices/*`.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct PciDevice {
    /// The bus address, e.g. `0000:01:00.0`.
    pub slot: String,
    /// PCI vendor id (`0x10de` is NVIDIA).
    pub vendor: u16,
    /// PCI device id.
    pub device: u16,
    /// Class code, 24 bits: class, subclass, programming interface (`0x030200`: 3D controller).
    pub class: u32,
}

impl PciDevice {
    /// An NVIDIA display controller: VGA-compatible (0x0300xx) or 3D controller (0x0302xx).
    pub fn is_nvidia_gpu(&self) -> bool {
        self.vendor == 0x10de && matches!(self.class >> 8, 0x0300 | 0x0302)
    }
}

/// Everything the writer needs to know about the machine before it touches a disk.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct Facts {
    /// Booted by UEFI firmware (`/sys/firmware/efi` exists).
    pub uefi: bool,
    /// Every PCI function.
    pub pci: Vec<PciDevice>,
    /// At least one NVIDIA GPU is present.
    pub nvidia_gpu: bool,
    /// The CPU advertises `vmx` (Intel VT-x) or `svm` (AMD-V) in `/proc/cpuinfo`.
    pub cpu_virt_flags: bool,
    /// `/dev/kvm` exists (the kernel's KVM module is loaded and the firmware allows it).
    pub kvm_device: bool,
    /// Both: hardware virtualization is usable.
    pub virtualization: bool,
    /// The TPM's major version, as the kernel reports it
    /// (`/sys/class/tpm/tpm0/tpm_version_major`): 2 for a TPM 2.0 (what secrets are sealed
    /// to); None when the machine shows no TPM (Hetzner's cloud VMs have none).
    pub tpm: Option<u8>,
    /// The machine's disks, sorted by name, without loop, ram, zram, dm, md, optical and floppy
    /// devices (those can still be targeted by name, see `resolve_targets`).
    pub disks: Vec<Disk>,
}

impl Facts {
    /// The disk named `name`, if listed.
    pub fn disk(&self, name: &str) -> Option<&Disk> {
        self.disks.iter().find(|d| d.name == name)
    }
}

/// Read the machine's facts below `sysroot`.
pub fn detect(sysroot: &Sysroot) -> Result<Facts, MachineError> {
    let uefi = sysroot.path("/sys/firmware/efi").is_dir();
    let pci = read_pci(sysroot)?;
    let nvidia_gpu = pci.iter().any(PciDevice::is_nvidia_gpu);
    let cpu_virt_flags = read_cpu_virt_flags(sysroot)?;
    // In fixtures `dev/kvm` is a marker file, on a real machine a character device.
    let kvm_device = sysroot.path("/dev/kvm").exists();
    let disks = disks::list_disks(sysroot)?;
    let tpm = read_tpm_version(sysroot)?;
    Ok(Facts {
        uefi,
        pci,
        nvidia_gpu,
        cpu_virt_flags,
        kvm_device,
        virtualization: cpu_virt_flags && kvm_device,
        tpm,
        disks,
    })
}

fn read_pci(sysroot: &Sysroot) -> Result<Vec<PciDevice>, MachineError> {
    let dir = sysroot.path("/sys/bus/pci/devices");
    // Some virtual machines have no PCI bus at all: that is not an error.
    let Ok(entries) = std::fs::read_dir(&dir) else {
        return Ok(vec![]);
    };
    let mut out = Vec::new();
    for entry in entries {
        let entry = entry.map_err(|source| MachineError::Io {
            path: dir.clone(),
            source,
        })?;
        let slot = entry.file_name().to_string_lossy().into_owned();
        let base = format!("/sys/bus/pci/devices/{slot}");
        let hex = |attr: &str| -> Result<u32, MachineError> {
            let path = sysroot.path(format!("{base}/{attr}"));
            let text = std::fs::read_to_string(&path).map_err(|source| MachineError::Io {
                path: path.clone(),
                source,
            })?;
            let text = text.trim();
            u32::from_str_radix(text.trim_start_matches("0x"), 16).map_err(|e| {
                MachineError::Parse {
                    path,
                    what: format!("{text:?}: {e}"),
                }
            })
        };
        out.push(PciDevice {
            vendor: hex("vendor")? as u16,
            device: hex("device")? as u16,
            class: hex("class")?,
            slot,
        });
    }
    out.sort_by(|a, b| a.slot.cmp(&b.slot));
    Ok(out)
}

/// The first TPM's major version; None without one.
fn read_tpm_version(sysroot: &Sysroot) -> Result<Option<u8>, MachineError> {
    let path = sysroot.path("/sys/class/tpm/tpm0/tpm_version_major");
    let text = match std::fs::read_to_string(&path) {
        Ok(text) => text,
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(None),
        Err(source) => return Err(MachineError::Io { path, source }),
    };
    match text.trim().parse::<u8>() {
        Ok(v @ (1 | 2)) => Ok(Some(v)),
        _ => Err(MachineError::Parse {
            path,
            what: format!("{:?} is not a TPM version (1 or 2)", text.trim()),
        }),
    }
}

fn read_cpu_virt_flags(sysroot: &Sysroot) -> Result<bool, MachineError> {
    let path = sysroot.path("/proc/cpuinfo");
    let text =
        std::fs::read_to_string(&path).map_err(|source| MachineError::Io { path, source })?;
    // x86 says `flags`; the words are what matter, not their order.
    Ok(text.lines().any(|line| {
        line.split_once(':').is_some_and(|(key, value)| {
            key.trim() == "flags" && value.split_whitespace().any(|f| f == "vmx" || f == "svm")
        })
    }))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_tpm_version_is_read_and_a_strange_one_refused() {
        let dir = tempfile::tempdir().unwrap();
        let sysroot = Sysroot::new(dir.path());
        assert_eq!(read_tpm_version(&sysroot).unwrap(), None);
        let file = dir.path().join("sys/class/tpm/tpm0/tpm_version_major");
        std::fs::create_dir_all(file.parent().unwrap()).unwrap();
        std::fs::write(&file, "2\n").unwrap();
        assert_eq!(read_tpm_version(&sysroot).unwrap(), Some(2));
        std::fs::write(&file, "two\n").unwrap();
        let err = read_tpm_version(&sysroot).unwrap_err().to_string();
        assert!(err.contains("tpm_version_major"), "{err}");
    }

    #[test]
    fn nvidia_gpu_classes() {
        let dev = |vendor, class| PciDevice {
            slot: String::new(),
            vendor,
            device: 0,
            class,
        };
        assert!(dev(0x10de, 0x030000).is_nvidia_gpu());
        assert!(dev(0x10de, 0x030200).is_nvidia_gpu());
        assert!(
            !dev(0x10de, 0x040300).is_nvidia_gpu(),
            "HDMI audio function is no GPU"
        );
        assert!(!dev(0x1002, 0x030000).is_nvidia_gpu());
    }
}
