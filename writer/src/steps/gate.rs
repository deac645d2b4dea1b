//! `gate`: what CAPH's own disk checks would have refused, refused here before anything is
//! touched: tools, UEFI, the target disks, SMART health, read speed, and (once the node layer is
//! sealed) the size.
//!
//! Reads the sysroot, the machine's facts and the request's gate settings; returns the resolved
//! target disks in the order given (all are written, the first first). [`size`] reads a disk
//! and the bytes the plan needs.
//! A failed gate is a [`GateFailure`](ingot_machine::GateFailure) naming its reason.

use ingot_machine::{Disk, Facts, GateReport, Sysroot};

use crate::report::{Reporter, Stage};
use crate::request::ProvisionRequest;
use crate::tpm::{Decision, Policy, TpmSetting};
use ingot_machine::GateFailure;

fn passed(reporter: &Reporter, report: &GateReport) {
    for w in &report.warnings {
        reporter.warning(Stage::Gate, format!("{}: {}", w.reason, w.message));
    }
}

pub fn run(
    sysroot: &Sysroot,
    facts: &Facts,
    req: &ProvisionRequest,
    reporter: &Reporter,
) -> Result<Vec<Disk>, GateFailure> {
    reporter.stage(Stage::Gate, "checking tools, firmware and the target disks");
    let tools: Vec<&str> = req.required_tools.iter().map(String::as_str).collect();
    passed(reporter, &ingot_machine::gate_tools(&tools, None)?);
    crate::tpm::gate_machine(req.tpm, facts, req.tpm_device.is_some())?;
    if facts.uefi {
        passed(reporter, &ingot_machine::gate_uefi(facts)?);
    } // BIOS firmware: whether the stack can boot it is known after `verify` ([`firmware`]).
    let targets = ingot_machine::resolve_targets(sysroot, facts, &req.root_devices)?;
    // Every target is written, so every target must be healthy and fast enough.
    let mut gates = Vec::new();
    for disk in &targets {
        reporter.stage(Stage::Gate, format!("{}: SMART health", disk.name));
        let r = ingot_machine::gate_smart(disk, req.host.as_ref())?;
        passed(reporter, &r);
        gates.push(r);
        let min = req
            .min_read_kib_s
            .unwrap_or_else(|| ingot_machine::default_min_kib_s(disk));
        reporter.stage(
            Stage::Gate,
            format!(
                "{}: read speed test ({} s, at least {min} KiB/s)",
                disk.name,
                req.read_test.as_secs_f64()
            ),
        );
        let r = ingot_machine::gate_read_speed(disk, min, req.read_test)?;
        passed(reporter, &r);
        gates.push(r);
    }
    reporter.detail("gates", &gates);
    Ok(targets)
}

/// The firmware gate on a BIOS machine, once the stack is verified: it boots only when the stack
/// carries a BIOS loader (`[boot] bios`); otherwise `not-uefi`, before any disk is touched.
pub fn firmware(facts: &Facts, bios_loader: bool, reporter: &Reporter) -> Result<(), GateFailure> {
    if facts.uefi {
        return Ok(());
    }
    if !bios_loader {
        ingot_machine::gate_uefi(facts)?;
    }
    reporter.stage(
        Stage::Gate,
        "BIOS firmware: the disk boots through the stack's BIOS loader (GRUB i386-pc)",
    );
    Ok(())
}

/// The secrets gate, once the stack is verified: whether the node's secrets are sealed, from
/// the `tpm` setting, the machine's TPM and the stack's PCR policy ([`crate::tpm`]); `require`
/// without a policy stops here (`pcr-policy-missing`), before any disk is touched.
pub fn secrets(
    setting: TpmSetting,
    facts: &Facts,
    reachable: bool,
    uki: Option<&[u8]>,
    reporter: &Reporter,
) -> Result<Decision, GateFailure> {
    reporter.stage(
        Stage::Gate,
        format!("secrets: the setting tpm = {}", setting.as_str()),
    );
    let decision = crate::tpm::decide(setting, facts.tpm, reachable, Policy::of(uki))?;
    reporter.stage(
        Stage::Gate,
        match &decision {
            Decision::Seal { .. } => format!(
                "secrets: sealed to this machine's TPM 2.0 under the release's PCR policy (tpm = \
                 {})",
                setting.as_str()
            ),
            Decision::Clear(why) => format!(
                "secrets: written in the clear (tpm = {}): {}",
                setting.as_str(),
                why.why()
            ),
        },
    );
    Ok(decision)
}

/// The size gate: `disk` holds the `need` bytes the plan asks for.
pub fn size(disk: &Disk, need: u64, reporter: &Reporter) -> Result<(), GateFailure> {
    reporter.stage(Stage::Gate, format!("{}: size", disk.name));
    passed(reporter, &ingot_machine::gate_size(disk, need)?);
    Ok(())
}
