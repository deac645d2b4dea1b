//! `guard`: refuses to wipe when another disk holds an operating system (it could be booted
//! instead), or when LVM or md RAID spans the disks.
//!
//! Reads the machine's facts, the target disks and whether a foreign OS is allowed; returns the
//! scan (also in the status file, its warnings reported), whose `teardown` lists the md arrays
//! and volume groups living only on the targets, or the guard's refusal.

use ingot_machine::{Disk, Facts, GuardOptions, GuardReport};

use crate::report::{Reporter, Stage};
use ingot_machine::GateFailure;

pub fn run(
    facts: &Facts,
    targets: &[Disk],
    allow_foreign_os: bool,
    reporter: &Reporter,
) -> Result<GuardReport, GateFailure> {
    reporter.stage(
        Stage::Guard,
        "looking for other operating systems, LVM and md RAID on the disks",
    );
    let guard = ingot_machine::guard(facts, targets, &GuardOptions { allow_foreign_os })?;
    for w in &guard.warnings {
        reporter.warning(Stage::Guard, format!("{}: {}", w.reason, w.message));
    }
    reporter.detail("guard", &guard);
    Ok(guard)
}
