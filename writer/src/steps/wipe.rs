//! `wipe`: the partition-table areas at both ends of the disk cleared, before anything else is
//! written. From here on a failure leaves the disk without a partition table, so a half-written
//! disk never looks bootable.
//!
//! Reads the opened target; returns nothing. [`after_failure`] clears them again.

use crate::error::WriteError;
use crate::report::{Reporter, Stage};
use crate::steps::partition_table;
use crate::target::Target;

pub fn run(target: &Target, reporter: &Reporter) -> Result<(), WriteError> {
    reporter.stage(
        Stage::Wipe,
        "clearing the partition tables at both ends of the disk",
    );
    partition_table::clear(target)?;
    Ok(())
}

/// After a failure past the wipe: the partition-table areas cleared again (a failure to do so
/// is logged; the run's own error is what is reported).
pub fn after_failure(target: &Target) {
    if let Err(clear) = partition_table::clear(target) {
        tracing::error!("clearing the partition tables after a failure also failed: {clear}");
    }
}
