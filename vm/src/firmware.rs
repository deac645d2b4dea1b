//! The files and programs a VM needs, found where Debian installs them or refused naming the
//! Debian package that does: QEMU, OVMF (plain and its Secure Boot build), SeaBIOS, swtpm.

use std::path::{Path, PathBuf};

/// The QEMU binary every VM (and the accelerator probe) runs.
pub const QEMU: &str = "qemu-system-x86_64";
/// The software TPM.
pub const SWTPM: &str = "swtpm";
/// OVMF's code (UEFI without Secure Boot).
pub const OVMF_CODE: &str = "/usr/share/OVMF/OVMF_CODE_4M.fd";
/// OVMF's variable store template: no keys, so its Secure Boot build starts in Setup Mode
/// (Secure Boot off until a PK is enrolled).
pub const OVMF_VARS: &str = "/usr/share/OVMF/OVMF_VARS_4M.fd";
/// OVMF built with Secure Boot (needs SMM and a secure flash).
pub const OVMF_CODE_SECBOOT: &str = "/usr/share/OVMF/OVMF_CODE_4M.secboot.fd";
/// SeaBIOS, QEMU's legacy BIOS (the image QEMU takes by default for a q35 machine).
pub const SEABIOS: &str = "/usr/share/seabios/bios-256k.bin";

/// The firmware a VM boots with.
#[derive(Clone, Copy, Debug, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
#[serde(rename_all = "kebab-case")]
pub enum Firmware {
    /// OVMF: the machine has `/sys/firmware/efi`.
    Uefi,
    /// OVMF's Secure Boot build with SMM and a secure flash; Secure Boot is on once its
    /// variable store has keys enrolled.
    SecureBoot,
    /// SeaBIOS: legacy BIOS, as Hetzner's cloud VMs boot.
    Bios,
}

impl Firmware {
    /// The name `ingot vm --firmware` takes.
    pub fn name(self) -> &'static str {
        match self {
            Firmware::Uefi => "uefi",
            Firmware::SecureBoot => "secure-boot",
            Firmware::Bios => "bios",
        }
    }

    /// Whether the machine boots with UEFI (and so has a variable store).
    pub fn is_uefi(self) -> bool {
        self != Firmware::Bios
    }
}

/// A file or program that is not installed.
#[derive(Debug, thiserror::Error)]
#[error("{what} is not installed: no {} (Debian package {package})", path.display())]
pub struct Missing {
    /// What it is (`OVMF's Secure Boot build`).
    pub what: &'static str,
    /// Where it was looked for (a program: its name).
    pub path: PathBuf,
    /// The Debian package that installs it.
    pub package: &'static str,
}

/// The firmware images of a machine, found.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Images {
    /// OVMF's code, or SeaBIOS.
    pub code: PathBuf,
    /// OVMF's variable store template (copied for each VM, which writes to its copy).
    pub vars_template: Option<PathBuf>,
}

/// Where files and programs are looked for: below a root (`/`), and in the directories of
/// `PATH`. Tests point it at an empty root to see the refusals.
#[derive(Clone, Debug)]
pub struct Lookup {
    root: PathBuf,
    path: Vec<PathBuf>,
}

impl Lookup {
    /// The running system: `/` and this process's `PATH`.
    pub fn system() -> Lookup {
        let path = std::env::var_os("PATH").unwrap_or_default();
        Lookup::new("/", std::env::split_paths(&path).collect())
    }

    /// Files below `root`, programs in `path`.
    pub fn new(root: impl Into<PathBuf>, path: Vec<PathBuf>) -> Lookup {
        Lookup {
            root: root.into(),
            path,
        }
    }

    /// `file` (absolute, as installed) below the root, or which package installs it.
    pub fn file(
        &self,
        file: &str,
        what: &'static str,
        package: &'static str,
    ) -> Result<PathBuf, Missing> {
        let found = self.root.join(file.trim_start_matches('/'));
        if found.is_file() {
            Ok(found)
        } else {
            Err(Missing {
                what,
                path: PathBuf::from(file),
                package,
            })
        }
    }

    /// The program `name` in `PATH`, or which package installs it.
    pub fn program(&self, name: &'static str, package: &'static str) -> Result<PathBuf, Missing> {
        self.path
            .iter()
            .map(|dir| dir.join(name))
            .find(|p| is_executable(p))
            .ok_or(Missing {
                what: name,
                path: PathBuf::from(name),
                package,
            })
    }

    /// QEMU for x86-64.
    pub fn qemu(&self) -> Result<PathBuf, Missing> {
        self.program(QEMU, "qemu-system-x86")
    }

    /// swtpm, for a machine's TPM.
    pub fn swtpm(&self) -> Result<PathBuf, Missing> {
        self.program(SWTPM, "swtpm")
    }

    /// The images `firmware` boots from.
    pub fn firmware(&self, firmware: Firmware) -> Result<Images, Missing> {
        let vars = || self.file(OVMF_VARS, "OVMF's variable store", "ovmf");
        Ok(match firmware {
            Firmware::Uefi => Images {
                code: self.file(OVMF_CODE, "OVMF", "ovmf")?,
                vars_template: Some(vars()?),
            },
            Firmware::SecureBoot => Images {
                code: self.file(OVMF_CODE_SECBOOT, "OVMF's Secure Boot build", "ovmf")?,
                vars_template: Some(vars()?),
            },
            Firmware::Bios => Images {
                code: self.file(SEABIOS, "SeaBIOS", "seabios")?,
                vars_template: None,
            },
        })
    }
}

fn is_executable(path: &Path) -> bool {
    use std::os::unix::fs::PermissionsExt;
    path.metadata()
        .is_ok_and(|m| m.is_file() && m.permissions().mode() & 0o111 != 0)
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A lookup whose root and `PATH` are empty directories.
    fn empty() -> (tempfile::TempDir, Lookup) {
        let dir = tempfile::tempdir().unwrap();
        let lookup = Lookup::new(dir.path(), vec![dir.path().to_path_buf()]);
        (dir, lookup)
    }

    #[test]
    fn missing_firmware_names_the_debian_package() {
        let (_dir, lookup) = empty();
        for (firmware, file, package) in [
            (Firmware::Uefi, OVMF_CODE, "ovmf"),
            (Firmware::SecureBoot, OVMF_CODE_SECBOOT, "ovmf"),
            (Firmware::Bios, SEABIOS, "seabios"),
        ] {
            let err = lookup.firmware(firmware).unwrap_err();
            let text = err.to_string();
            assert_eq!(err.package, package, "{text}");
            assert!(
                text.contains(&format!("Debian package {package}")) && text.contains(file),
                "{text}"
            );
        }
    }

    #[test]
    fn missing_programs_name_the_debian_package() {
        let (_dir, lookup) = empty();
        let text = lookup.qemu().unwrap_err().to_string();
        assert!(
            text.contains(QEMU) && text.contains("Debian package qemu-system-x86"),
            "{text}"
        );
        let text = lookup.swtpm().unwrap_err().to_string();
        assert!(text.contains("Debian package swtpm"), "{text}");
    }

    /// Found below the root: a file as installed, a program only when executable.
    #[test]
    fn installed_files_and_programs_are_found() {
        use std::os::unix::fs::PermissionsExt;
        let (dir, lookup) = empty();
        let code = dir.path().join(SEABIOS.trim_start_matches('/'));
        std::fs::create_dir_all(code.parent().unwrap()).unwrap();
        std::fs::write(&code, b"bios").unwrap();
        let images = lookup.firmware(Firmware::Bios).unwrap();
        assert_eq!((images.code, images.vars_template), (code, None));
        let swtpm = dir.path().join(SWTPM);
        std::fs::write(&swtpm, b"#!/bin/sh\n").unwrap();
        assert!(lookup.swtpm().is_err(), "not executable, yet found");
        std::fs::set_permissions(&swtpm, std::fs::Permissions::from_mode(0o755)).unwrap();
        assert_eq!(lookup.swtpm().unwrap(), swtpm);
    }
}
