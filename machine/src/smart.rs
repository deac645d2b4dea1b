//! SMART health from `smartctl --json=c -H -i`, as CAPH's `check-disk.sh` asks `smartctl -H`.

use serde::Deserialize;

use crate::gate::{GateDetail, GateFailure, GateReport, Reason, Warning};
use crate::host::Host;
use crate::Disk;

/// `smartctl --json=c -H -i NODE` for `disk`, through the host; smartctl's exit status is a bit
/// mask that is also in the JSON, so stdout is what counts. An error: it could not be run.
fn query(host: &dyn Host, disk: &Disk) -> std::io::Result<String> {
    let node = disk.node.to_string_lossy();
    let out = host.run("smartctl", &["--json=c", "-H", "-i", &node])?;
    Ok(String::from_utf8_lossy(&out.stdout).into_owned())
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
pub fn gate_smart(disk: &Disk, host: &dyn Host) -> Result<GateReport, GateFailure> {
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
    let text = match query(host, disk) {
        Ok(t) => t,
        Err(e) => return Ok(unavailable(format!("cannot run smartctl: {e}"))),
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
