//! What a gate returns, and the gates that need no disk I/O: tools, UEFI, size.

use std::ffi::OsStr;
use std::os::unix::fs::PermissionsExt;
use std::path::PathBuf;

use serde::Serialize;

use crate::{Disk, Facts};

/// Why a gate or the guard stopped (or warned). The kebab-case names are stable: the writer puts
/// them in its JSON report and in CAPH's `message`, and callers branch on them.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize)]
#[serde(rename_all = "kebab-case")]
pub enum Reason {
    /// A required program is not on `PATH`.
    ToolsMissing,
    /// The machine booted with BIOS, not UEFI firmware.
    NotUefi,
    /// A target name or WWN matches no disk (or no target was given).
    DiskNotFound,
    /// A target names a partition rather than a whole disk, names a disk a second time, or is
    /// a WWN more than one disk has.
    BadTarget,
    /// The target disk is smaller than the layout needs.
    DiskTooSmall,
    /// SMART says the disk is failing.
    SmartFailing,
    /// SMART could not be read (warning only).
    SmartUnavailable,
    /// SMART passed, but smartctl flagged attributes or logs (warning only).
    SmartDegraded,
    /// Sequential reads are slower than the threshold.
    DiskTooSlow,
    /// The device could not be opened with `O_DIRECT`; the rate includes the page cache (warning).
    ReadNotDirect,
    /// A non-target disk holds a Linux root, a /boot or an ESP with boot entries.
    ForeignOs,
    /// A target disk holds an LVM physical volume.
    LvmOnTarget,
    /// An md array has members on target and non-target disks.
    MdSpansDisks,
    /// A disk could not be read.
    DiskUnreadable,
    /// md arrays or LVM volume groups living only on target disks are stopped and cleared
    /// (warning only).
    StorageTornDown,
    /// Stopping or clearing them failed; the disks may hold a partly cleared old layout.
    TeardownFailed,
    /// The setting `tpm = require`, and the machine shows no usable TPM 2.0.
    TpmMissing,
    /// The setting `tpm = require`, and the stack has no signed PCR policy this machine boots
    /// through (no `.pcrpkey`/`.pcrsig` in its UKI, or no UKI on this machine).
    PcrPolicyMissing,
}

impl Reason {
    /// The stable kebab-case name, e.g. `disk-too-small`.
    pub fn as_str(self) -> &'static str {
        match self {
            Reason::ToolsMissing => "tools-missing",
            Reason::NotUefi => "not-uefi",
            Reason::DiskNotFound => "disk-not-found",
            Reason::BadTarget => "bad-target",
            Reason::DiskTooSmall => "disk-too-small",
            Reason::SmartFailing => "smart-failing",
            Reason::SmartUnavailable => "smart-unavailable",
            Reason::SmartDegraded => "smart-degraded",
            Reason::DiskTooSlow => "disk-too-slow",
            Reason::ReadNotDirect => "read-not-direct",
            Reason::ForeignOs => "foreign-os",
            Reason::LvmOnTarget => "lvm-on-target",
            Reason::MdSpansDisks => "md-spans-disks",
            Reason::DiskUnreadable => "disk-unreadable",
            Reason::StorageTornDown => "storage-torn-down",
            Reason::TeardownFailed => "teardown-failed",
            Reason::TpmMissing => "tpm-missing",
            Reason::PcrPolicyMissing => "pcr-policy-missing",
        }
    }
}

impl std::fmt::Display for Reason {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(self.as_str())
    }
}

/// A gate (or the guard) said stop.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, thiserror::Error)]
#[error("{reason}{}: {message}", disk.as_ref().map(|d| format!(" ({d})")).unwrap_or_default())]
pub struct GateFailure {
    /// Why, as a stable name.
    pub reason: Reason,
    /// The disk it is about (`sdb`), when it is about one.
    pub disk: Option<String>,
    /// What was found, for a human.
    pub message: String,
}

impl GateFailure {
    pub(crate) fn new(reason: Reason, disk: Option<&str>, message: impl Into<String>) -> Self {
        GateFailure {
            reason,
            disk: disk.map(str::to_string),
            message: message.into(),
        }
    }
}

/// Something a gate noticed that does not stop the run.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct Warning {
    /// Why, as a stable name (`smart-unavailable`, ...).
    pub reason: Reason,
    /// The disk it is about.
    pub disk: Option<String>,
    /// What was found, for a human.
    pub message: String,
}

impl Warning {
    pub(crate) fn new(reason: Reason, disk: Option<&str>, message: impl Into<String>) -> Self {
        Warning {
            reason,
            disk: disk.map(str::to_string),
            message: message.into(),
        }
    }
}

/// A gate passed: what it saw, and its warnings.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct GateReport {
    /// The disk it checked, if any.
    pub disk: Option<String>,
    /// What was measured or found.
    pub detail: GateDetail,
    /// What does not stop the run but belongs in the report.
    pub warnings: Vec<Warning>,
}

/// The facts behind a passed gate.
#[derive(Debug, Clone, PartialEq, Serialize)]
#[serde(tag = "gate", rename_all = "kebab-case")]
pub enum GateDetail {
    /// Every tool, with where it was found.
    Tools { found: Vec<(String, PathBuf)> },
    /// The machine runs UEFI firmware.
    Uefi,
    /// The disk's size against the size needed.
    Size { size_bytes: u64, needed_bytes: u64 },
    /// SMART health; `passed` is `None` when SMART could not be read.
    Smart {
        passed: Option<bool>,
        model: Option<String>,
        exit_status: Option<u32>,
    },
    /// The measured sequential read rate.
    ReadSpeed(crate::ReadSpeed),
    /// The machine's TPM (its major version).
    Tpm { version: u8 },
}

/// Every program in `required` must be an executable file in one of `path_env`'s directories
/// (`PATH`'s syntax; `None` reads `PATH` from the environment). Fails with `tools-missing`,
/// naming each missing program.
pub fn gate_tools(required: &[&str], path_env: Option<&OsStr>) -> Result<GateReport, GateFailure> {
    let from_env = std::env::var_os("PATH");
    let path_env = path_env.or(from_env.as_deref()).unwrap_or_default();
    // An empty entry means "the current directory" to a shell; a gate must not depend on it.
    let dirs: Vec<PathBuf> = std::env::split_paths(path_env)
        .filter(|d| !d.as_os_str().is_empty())
        .collect();
    let mut found = Vec::new();
    let mut missing = Vec::new();
    for &tool in required {
        let hit = dirs.iter().map(|d| d.join(tool)).find(|p| {
            // A directory or a non-executable file of that name would fail at exec time.
            std::fs::metadata(p).is_ok_and(|m| m.is_file() && m.permissions().mode() & 0o111 != 0)
        });
        match hit {
            Some(p) => found.push((tool.to_string(), p)),
            None => missing.push(tool),
        }
    }
    if !missing.is_empty() {
        return Err(GateFailure::new(
            Reason::ToolsMissing,
            None,
            format!("not found on PATH: {}", missing.join(", ")),
        ));
    }
    Ok(GateReport {
        disk: None,
        detail: GateDetail::Tools { found },
        warnings: vec![],
    })
}

/// The machine must have booted with UEFI firmware (the layout boots from an ESP only).
pub fn gate_uefi(facts: &Facts) -> Result<GateReport, GateFailure> {
    if !facts.uefi {
        return Err(GateFailure::new(
            Reason::NotUefi,
            None,
            "/sys/firmware/efi is absent: the machine booted with BIOS; switch it to UEFI boot",
        ));
    }
    Ok(GateReport {
        disk: None,
        detail: GateDetail::Uefi,
        warnings: vec![],
    })
}

/// The machine must show a TPM 2.0 (`/sys/class/tpm/tpm0/tpm_version_major` is 2): secrets
/// are sealed to it. `setting` names what asks for it (`tpm = require`), for the message.
pub fn gate_tpm(facts: &Facts, setting: &str) -> Result<GateReport, GateFailure> {
    match facts.tpm {
        Some(2) => Ok(GateReport {
            disk: None,
            detail: GateDetail::Tpm { version: 2 },
            warnings: vec![],
        }),
        found => Err(tpm_missing(found, setting)),
    }
}

/// The machine shows no TPM 2.0 (`found`: the major version it shows, if any): `tpm-missing`.
pub fn tpm_missing(found: Option<u8>, setting: &str) -> GateFailure {
    GateFailure::new(
        Reason::TpmMissing,
        None,
        format!(
            "{setting}, and this machine has no usable TPM 2.0 ({}): its secrets cannot be \
             sealed; enable the TPM in the firmware setup, or run with --tpm prefer to write \
             them in the clear",
            match found {
                None => "/sys/class/tpm/tpm0 is absent".to_string(),
                Some(v) => format!("/sys/class/tpm/tpm0 is a TPM {v}.x"),
            }
        ),
    )
}

/// The machine shows a TPM 2.0 the writer cannot reach (a fixture machine's, with no device
/// named for it): `tpm-missing`, `why` saying so.
pub fn tpm_unreachable(setting: &str, why: &str) -> GateFailure {
    GateFailure::new(
        Reason::TpmMissing,
        None,
        format!("{setting}, and {why}: its secrets cannot be sealed"),
    )
}

/// The stack must carry a signed PCR policy this machine boots through; `why` says what is
/// missing (the caller reads the stack), `setting` what asks for it.
pub fn pcr_policy_missing(setting: &str, why: &str) -> GateFailure {
    GateFailure::new(
        Reason::PcrPolicyMissing,
        None,
        format!(
            "{setting}, and {why}: nothing binds the secrets to the release's boot chain; \
             release the stack with a PCR key (`ingot build --pcr-key`), or run with --tpm prefer"
        ),
    )
}

/// The disk must hold at least `needed_bytes`.
pub fn gate_size(disk: &Disk, needed_bytes: u64) -> Result<GateReport, GateFailure> {
    if disk.size_bytes < needed_bytes {
        return Err(GateFailure::new(
            Reason::DiskTooSmall,
            Some(&disk.name),
            format!(
                "{} has {} bytes, the layout needs {} bytes",
                disk.name, disk.size_bytes, needed_bytes
            ),
        ));
    }
    Ok(GateReport {
        disk: Some(disk.name.clone()),
        detail: GateDetail::Size {
            size_bytes: disk.size_bytes,
            needed_bytes,
        },
        warnings: vec![],
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn reason_names_are_kebab_case_in_json_and_display() {
        for r in [
            Reason::ForeignOs,
            Reason::MdSpansDisks,
            Reason::SmartUnavailable,
        ] {
            assert_eq!(
                serde_json::to_value(r).unwrap(),
                serde_json::json!(r.as_str())
            );
            assert_eq!(r.to_string(), r.as_str());
        }
    }

    #[test]
    fn tools_found_and_missing() {
        let dir = tempfile::tempdir().unwrap();
        let tool = dir.path().join("sgdisk");
        std::fs::write(&tool, "#!/bin/sh\n").unwrap();
        std::fs::set_permissions(&tool, std::fs::Permissions::from_mode(0o755)).unwrap();
        std::fs::write(dir.path().join("noexec"), "").unwrap();
        let path = dir.path().as_os_str();
        assert!(gate_tools(&["sgdisk"], Some(path)).is_ok());
        let err = gate_tools(&["sgdisk", "noexec", "mkfs.ext4"], Some(path)).unwrap_err();
        assert_eq!(err.reason, Reason::ToolsMissing);
        assert!(err.message.contains("noexec, mkfs.ext4"), "{err}");
        let err = gate_tools(&["sh"], Some(OsStr::new(""))).unwrap_err();
        assert_eq!(err.reason, Reason::ToolsMissing);
    }

    #[test]
    fn only_a_tpm_2_passes_and_the_failure_names_tpm_and_setting() {
        let mut facts = Facts {
            uefi: true,
            pci: vec![],
            nvidia_gpu: false,
            cpu_virt_flags: false,
            kvm_device: false,
            virtualization: false,
            tpm: None,
            disks: vec![],
        };
        for tpm in [None, Some(1)] {
            facts.tpm = tpm;
            let err = gate_tpm(&facts, "tpm = require").unwrap_err();
            assert_eq!(err.reason, Reason::TpmMissing);
            assert!(err.message.starts_with("tpm = require"), "{err}");
            assert!(err.message.contains("TPM"), "{err}");
        }
        facts.tpm = Some(2);
        assert!(gate_tpm(&facts, "tpm = require").is_ok());
    }
}
