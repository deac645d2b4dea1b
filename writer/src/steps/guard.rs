//! `guard`: refuses to wipe when another disk holds an operating system (it could be booted
//! instead), or when LVM or md RAID spans the disks.
//!
//! Reads the machine's facts, the target disks and whether a foreign OS is allowed; returns
//! nothing but warnings and the scan in the status file, or the guard's refusal.

use ingot_machine::{Disk, Facts, GuardOptions};

use crate::error::ProvisionError;
use crate::report::{Reporter, Stage};

pub fn run(
    facts: &Facts,
    targets: &[Disk],
    allow_foreign_os: bool,
    reporter: &Reporter,
) -> Result<(), ProvisionError> {
    reporter.stage(
        Stage::Guard,
        "looking for other operating systems, LVM and md RAID on the disks",
    );
    let guard = ingot_machine::guard(facts, targets, &GuardOptions { allow_foreign_os })?;
    for w in &guard.warnings {
        reporter.warning(Stage::Guard, format!("{}: {}", w.reason, w.message));
    }
    reporter.detail("guard", &guard);
    Ok(())
}
