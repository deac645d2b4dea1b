//! `partition-table`: the partition table written last, after a sync, and read back
//! ([`crate::table`]). Reads the opened target and the plan; returns nothing but a table that
//! matches it.

use crate::layout::DiskPlan;
use crate::report::{Reporter, Stage};
use crate::table::{write, TableError};
use crate::target::Target;

/// The `partition-table` step: after a sync, the table written and read back. `mbr_code` is
/// GRUB's `boot.img` when the disk also boots from BIOS firmware: it goes into the protective
/// MBR with the table, patched to load the core image from the BIOS boot partition.
pub fn run(
    target: &Target,
    plan: &DiskPlan,
    mbr_code: Option<&[u8]>,
    reporter: &Reporter,
) -> Result<(), TableError> {
    reporter.stage(
        Stage::PartitionTable,
        "writing the partition table (last) and reading it back",
    );
    target.sync()?;
    write(target, plan, mbr_code)?;
    target.reread_partitions();
    Ok(())
}
