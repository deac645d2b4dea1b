//! `wipe`: the partition-table areas at both ends of the disk cleared, before anything else is
//! written. From here on a failure leaves the disk without a partition table, so a half-written
//! disk never looks bootable.
//!
//! Reads the opened target; returns nothing. [`after_failure`] clears them again.

use crate::report::{Reporter, Stage};
use crate::table::{self, TableError};
use crate::target::Target;

pub fn run(target: &Target, reporter: &Reporter) -> Result<(), TableError> {
    reporter.stage(
        Stage::Wipe,
        "clearing the partition tables at both ends of the disk",
    );
    table::clear(target)
}

/// After a failure past the wipe: the partition-table areas cleared again. Returns whether
/// they were; a failure to clear is logged (the run's own error is what is reported) and said
/// in the run's [`DiskState`](crate::report::DiskState).
pub fn after_failure(target: &Target) -> bool {
    match table::clear(target) {
        Ok(()) => true,
        Err(clear) => {
            tracing::error!("clearing the partition tables after a failure also failed: {clear}");
            false
        }
    }
}
