//! `teardown`: the md arrays and LVM volume groups the guard found living only on the
//! target disks (installimage's software RAID1, an earlier ingot mirror) are stopped and their
//! signatures cleared, the first step that changes a disk, right before the partition tables are
//! wiped (`docs/machine-checks.md`).
//!
//! [`plan`] runs before anything is touched (with the other gates): the commands from what the
//! rescue system has active, and their tools on `PATH`. [`run`] runs them through the run's
//! host, one stage message each, then checks that nothing holds a target any more.

use ingot_machine::host::Host;
use ingot_machine::teardown::{self, Step};
use ingot_machine::{Disk, GuardReport, Sysroot};

use crate::report::{Reporter, Stage};
use ingot_machine::GateFailure;

/// The teardown commands for `guard`'s findings; empty when there is nothing to stop or clear.
pub fn plan(
    sysroot: &Sysroot,
    targets: &[Disk],
    guard: &GuardReport,
    reporter: &Reporter,
) -> Result<Vec<Step>, GateFailure> {
    let steps = teardown::plan(sysroot, targets, &guard.teardown)?;
    if !steps.is_empty() {
        ingot_machine::gate_tools(&teardown::tools(&steps), None)?;
        reporter.detail("teardown", &steps);
    }
    Ok(steps)
}

/// Runs `steps`, then checks that nothing holds a target any more.
pub fn run(
    host: &dyn Host,
    sysroot: &Sysroot,
    targets: &[Disk],
    steps: &[Step],
    reporter: &Reporter,
) -> Result<(), GateFailure> {
    if steps.is_empty() {
        return Ok(());
    }
    let names: Vec<&str> = targets.iter().map(|d| d.name.as_str()).collect();
    reporter.stage(
        Stage::Teardown,
        format!(
            "stopping and clearing the old md arrays and volume groups on {}",
            names.join(", ")
        ),
    );
    for step in steps {
        reporter.stage(
            Stage::Teardown,
            format!("{}: {}", step.why, step.command_line()),
        );
        teardown::run_step(host, step)?;
    }
    teardown::check_released(sysroot, targets)
}
