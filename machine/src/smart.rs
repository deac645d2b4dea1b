//! SMART health from `smartctl --json=c -H -i`, as CAPH's `check-disk.sh` asks `smartctl -H`.

use std::path::PathBuf;
use std::process::Command;

use serde::Deserialize;

use crate::gate::{GateDetail, GateFailure, GateReport, Reason, Warning};
use crate::{Disk, Sysroot};

/// Where smartctl's JSON comes from.
pub trait SmartSource {
    /// smartctl's JSON output for `disk` (`smartctl --json=c -H -i <node>`).
    fn query(&self, sysroot: &Sysroot, disk: &Disk) -> Result<String, SmartError>;
}

/// No JSON could be had at all; the gate turns it into a `smart-unavailable` warning.
#[derive(Debug, thiserror::Error)]
pub enum SmartError {
    /// smartctl could not be started.
    #[error("cannot run {program}: {source}")]
    Spawn {
        /// The program.
        program: PathBuf,
        /// Why.
        source: std::io::Error,
    },
    /// A fixture has no captured output for the disk.
    #[error("cannot read {path}: {source}")]
    Read {
        /// The fixture file.
        path: PathBuf,
        /// Why.
        source: std::io::Error,
    },
}

/// The real machine: runs `smartctl` (found on `PATH` unless a path is given).
#[derive(Debug, Clone)]
pub struct Smartctl {
    /// The program to run.
    pub program: PathBuf,
}

impl Default for Smartctl {
    fn default() -> Self {
        Smartctl {
            program: PathBuf::from("smartctl"),
        }
    }
}

impl SmartSource for Smartctl {
    fn query(&self, _sysroot: &Sysroot, disk: &Disk) -> Result<String, SmartError> {
        // smartctl's exit status is a bit mask that is also in the JSON; stdout is what counts.
        let out = Command::new(&self.program)
            .args(["--json=c", "-H", "-i"])
            .arg(&disk.node)
            .output()
            .map_err(|source| SmartError::Spawn {
                program: self.program.clone(),
                source,
            })?;
        Ok(String::from_utf8_lossy(&out.stdout).into_owned())
    }
}

/// Fixture machines: reads captured output from `<sysroot>/smartctl/<disk>.json`.
#[derive(Debug, Clone, Copy, Default)]
pub struct FixtureSmart;

impl SmartSource for FixtureSmart {
    fn query(&self, sysroot: &Sysroot, disk: &Disk) -> Result<String, SmartError> {
        let path = sysroot.path(format!("smartctl/{}.json", disk.name));
        std::fs::read_to_string(&path).map_err(|source| SmartError::Read { path, source })
    }
}

/// The parts of smartctl's JSON the gate reads; everything else is ignored.
#[derive(Debug, Deserialize)]
struct SmartJson {
    smartctl: Option<SmartctlInfo>,
    smart_status: Option<SmartStatus>,
    model_name: Option<String>,
}

#[derive(Debug, Deserialize)]
struct SmartctlInfo {
    exit_status: Option<u32>,
    #[serde(default)]
    messages: Vec<SmartMessage>,
}

#[derive(Debug, Deserialize)]
struct SmartMessage {
    string: String,
}

#[derive(Debug, Deserialize)]
struct SmartStatus {
    passed: Option<bool>,
}

// smartctl(8), EXIT STATUS: bits 0-2 mean it could not parse its arguments, open the device, or
// a command to it failed; bit 3 is "SMART status check returned DISK FAILING"; bits 4-7 flag
// prefail attributes, past threshold crossings, error log and self-test log entries.
const EXIT_COULD_NOT_RUN: u32 = 0b0000_0111;
const EXIT_DISK_FAILING: u32 = 1 << 3;
const EXIT_DEGRADED: u32 = 0b1111_0000;

/// SMART health of `disk` must not be failing. SMART that cannot be read (no smartctl, a RAID
/// controller hiding the disk, a virtual disk) is a `smart-unavailable` warning, not a stop;
/// bits 4-7 of smartctl's exit status are a `smart-degraded` warning.
pub fn gate_smart(
    sysroot: &Sysroot,
    disk: &Disk,
    source: &dyn SmartSource,
) -> Result<GateReport, GateFailure> {
    let name = disk.name.as_str();
    let unavailable = |why: String| GateReport {
        disk: Some(name.to_string()),
        detail: GateDetail::Smart {
            passed: None,
            model: None,
            exit_status: None,
        },
        warnings: vec![Warning::new(Reason::SmartUnavailable, Some(name), why)],
    };
    let text = match source.query(sysroot, disk) {
        Ok(t) => t,
        Err(e) => return Ok(unavailable(e.to_string())),
    };
    let json: SmartJson = match serde_json::from_str(&text) {
        Ok(j) => j,
        Err(e) => return Ok(unavailable(format!("smartctl output is not its JSON: {e}"))),
    };
    let exit = json
        .smartctl
        .as_ref()
        .and_then(|s| s.exit_status)
        .unwrap_or(0);
    let messages: Vec<&str> = json
        .smartctl
        .as_ref()
        .map(|s| s.messages.iter().map(|m| m.string.as_str()).collect())
        .unwrap_or_default();
    let passed = json.smart_status.as_ref().and_then(|s| s.passed);

    if exit & EXIT_DISK_FAILING != 0 || passed == Some(false) {
        return Err(GateFailure::new(
            Reason::SmartFailing,
            Some(name),
            format!(
                "SMART overall-health self-assessment: FAILED (smartctl exit status {exit:#x}){}",
                if messages.is_empty() {
                    String::new()
                } else {
                    format!(": {}", messages.join("; "))
                }
            ),
        ));
    }
    let mut warnings = Vec::new();
    if exit & EXIT_COULD_NOT_RUN != 0 || passed.is_none() {
        let why = if messages.is_empty() {
            format!("smartctl exit status {exit:#x}, no health verdict")
        } else {
            format!("smartctl exit status {exit:#x}: {}", messages.join("; "))
        };
        warnings.push(Warning::new(Reason::SmartUnavailable, Some(name), why));
    }
    if exit & EXIT_DEGRADED != 0 {
        warnings.push(Warning::new(
            Reason::SmartDegraded,
            Some(name),
            format!("smartctl exit status {exit:#x}: attributes or logs record past problems"),
        ));
    }
    Ok(GateReport {
        disk: Some(name.to_string()),
        detail: GateDetail::Smart {
            passed,
            model: json.model_name,
            exit_status: Some(exit),
        },
        warnings,
    })
}
