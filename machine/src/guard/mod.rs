//! The guard: refuse to write when the machine could still boot an OS we did not write, or when
//! a target is part of storage that spans other disks. CAPH's `detect-linux-on-another-disk.sh`
//! rules ("otherwise it is likely that the old OS gets booted"):
//!
//! * `foreign-os`: a non-target disk holds a Linux root, a /boot, an ESP with boot entries, or a
//!   filesystem that may be a root and cannot be read without mounting (xfs, btrfs).
//! * `lvm-on-target`: a target disk (or a partition of it) is an LVM physical volume.
//! * `md-spans-disks`: an md array has members on target and non-target disks.
//!
//! Every disk is opened read-only and read with positional reads; no tool (blkid, mount) runs.

mod lvm;
mod md;
mod partition;
mod probe;
mod slice;
mod storage;

use std::fs::File;
use std::io::{Seek, SeekFrom};
use std::sync::Arc;

use serde::Serialize;

use crate::gate::{GateFailure, Reason, Warning};
use crate::{Disk, Facts};

pub use lvm::VolumeGroup;
pub use md::MdMember;
use storage::storage_on_targets;
pub use storage::{ArrayOnTargets, Teardown, VgOnTargets};

/// The GPT type of ingot's base layer partition (DPS root x86-64), see docs/writer.md.
const INGOT_BASE_TYPE: &str = "4f68bce3-e8cd-4db1-96e7-fbcaf984b709";
pub use partition::{Partition, TableKind};
pub use probe::{probe as probe_region, Finding};
pub use slice::Slice;

#[cfg(feature = "fixtures")]
pub use lvm::write_pv;
#[cfg(feature = "fixtures")]
pub use md::parse_uuid as parse_md_uuid;
pub use md::{write_v1 as write_md_v1, V1Params as MdV1Params};

/// How strict the guard is.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize)]
pub struct GuardOptions {
    /// Turn `foreign-os` into a warning (the operator knows the other disk's OS will not boot,
    /// e.g. because the boot order is pinned).
    pub allow_foreign_os: bool,
}

/// What the guard read, disk by disk.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct GuardReport {
    /// Every disk read.
    pub disks: Vec<DiskScan>,
    /// What does not stop the run (an allowed foreign OS, an unreadable table, storage that
    /// is torn down).
    pub warnings: Vec<Warning>,
    /// md arrays and LVM volume groups that live only on target disks, and every target region
    /// holding a signature: what must be stopped and cleared before the disks are written
    /// (installimage's software RAID, an earlier ingot mirror).
    pub teardown: Teardown,
}

/// One disk as the guard read it.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct DiskScan {
    /// Kernel name.
    pub disk: String,
    /// One of the targets.
    pub target: bool,
    /// Its partition table.
    pub table: TableKind,
    /// Why the table could not be read (the whole disk was probed instead).
    pub table_error: Option<String>,
    /// Why the primary GPT was passed over for the backup, when it was.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub table_note: Option<String>,
    /// The whole disk first, then each partition.
    pub regions: Vec<RegionScan>,
    /// The disk carries ingot's layout (a GPT with an `ingot-base` partition of the DPS root
    /// type): a node ingot wrote before.
    pub ingot: bool,
}

/// One partition (or the whole disk) and what it holds.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct RegionScan {
    /// `sdb2`, or `sdb` for the whole disk.
    pub name: String,
    /// The partition table entry; `None` for the whole disk.
    pub partition: Option<Partition>,
    /// What was found.
    pub findings: Vec<Finding>,
}

/// Read every disk of `facts` (and every target) and apply the rules above. Fails with
/// `disk-unreadable` when a disk cannot be opened or read, since then nothing can be ruled out.
pub fn guard(
    facts: &Facts,
    targets: &[Disk],
    options: &GuardOptions,
) -> Result<GuardReport, GateFailure> {
    let mut disks: Vec<&Disk> = facts.disks.iter().collect();
    for t in targets {
        if !disks.iter().any(|d| d.name == t.name) {
            disks.push(t);
        }
    }
    let is_target = |name: &str| targets.iter().any(|t| t.name == name);
    let mut scans = Vec::new();
    let mut warnings = Vec::new();
    for disk in disks {
        // An empty card reader or optical drive has nothing to boot.
        if disk.size_bytes == 0 {
            continue;
        }
        let scan = scan_disk(disk, is_target(&disk.name))?;
        if let Some(e) = &scan.table_error {
            // An unreadable table hides its partitions: on a disk that is kept, an OS there
            // cannot be ruled out.
            if !scan.target && !options.allow_foreign_os {
                return Err(GateFailure::new(
                    Reason::DiskUnreadable,
                    Some(&disk.name),
                    format!(
                        "partition table: {e}: whether {} holds an operating system cannot be \
                         told; wipe it, or target it too",
                        disk.name
                    ),
                ));
            }
            warnings.push(Warning::new(
                Reason::DiskUnreadable,
                Some(&disk.name),
                format!("partition table: {e}; probed the whole disk instead"),
            ));
        }
        if let Some(note) = &scan.table_note {
            warnings.push(Warning::new(
                Reason::DiskUnreadable,
                Some(&disk.name),
                format!("partition table: {note}"),
            ));
        }
        scans.push(scan);
    }

    let teardown = storage_on_targets(&scans)?;
    for a in &teardown.md_arrays {
        warnings.push(Warning::new(
            Reason::StorageTornDown,
            None,
            format!(
                "md array {} ({}) lives only on target disks ({}): it is stopped and its \
                 superblocks cleared before writing",
                a.uuid,
                a.name,
                a.members.join(", ")
            ),
        ));
    }
    for v in &teardown.volume_groups {
        warnings.push(Warning::new(
            Reason::StorageTornDown,
            None,
            format!(
                "LVM volume group {} lives only on target disks ({}): it is deactivated and \
                 its physical volumes cleared before writing",
                v.name,
                v.pvs.join(", ")
            ),
        ));
    }

    // foreign-os
    for scan in scans.iter().filter(|s| !s.target) {
        for region in &scan.regions {
            if let Some(f) = region.findings.iter().find(|f| f.is_os()) {
                let ingot = if scan.ingot {
                    " (a disk ingot wrote earlier: it is rewritten only as a target)"
                } else {
                    ""
                };
                let message = format!(
                    "{} holds {}{ingot}; it could boot instead of the new node: wipe it, or \
                     target it too",
                    region.name,
                    f.describe()
                );
                if !options.allow_foreign_os {
                    return Err(GateFailure::new(
                        Reason::ForeignOs,
                        Some(&scan.disk),
                        message,
                    ));
                }
                warnings.push(Warning::new(Reason::ForeignOs, Some(&scan.disk), message));
            }
        }
    }
    Ok(GuardReport {
        disks: scans,
        warnings,
        teardown,
    })
}

/// Reads one disk's partition table and probes the whole disk and each partition (read-only).
/// Public for the fuzz target, which feeds it arbitrary disk contents.
pub fn scan_disk(disk: &Disk, target: bool) -> Result<DiskScan, GateFailure> {
    let unreadable = |e: std::io::Error| {
        GateFailure::new(
            Reason::DiskUnreadable,
            Some(&disk.name),
            format!("{}: {e}", disk.node.display()),
        )
    };
    // Read-only: File::open never asks for write access.
    let mut file = File::open(&disk.node).map_err(unreadable)?;
    // The device's own length (a block device reports 0 in its metadata, seeking to the end
    // gives its size), not sysfs's, so a stale fixture cannot hide the end of a disk.
    let len = file.seek(SeekFrom::End(0)).map_err(unreadable)?;
    let whole = Slice::whole(Arc::new(file), len);
    let (table, partitions, table_note, table_error) =
        match partition::read_table(&whole, disk.logical_block_size) {
            Ok((kind, parts, note)) => (kind, parts, note, None),
            Err(e) => (TableKind::None, vec![], None, Some(e)),
        };
    let mut regions = vec![RegionScan {
        name: disk.name.clone(),
        partition: None,
        // With a table, the whole disk gets only the LVM and md probes; a filesystem at its
        // start would be the table's own first sectors.
        findings: probe::probe(&whole, table == TableKind::None).map_err(unreadable)?,
    }];
    for p in partitions {
        let region = whole.sub(p.offset, p.size);
        regions.push(RegionScan {
            name: disk.partition_name(p.number),
            findings: probe::probe(&region, true).map_err(unreadable)?,
            partition: Some(p),
        });
    }
    let ingot = table == TableKind::Gpt
        && regions
            .iter()
            .filter_map(|r| r.partition.as_ref())
            .any(|p| p.label == "ingot-base" && p.type_id.eq_ignore_ascii_case(INGOT_BASE_TYPE));
    Ok(DiskScan {
        disk: disk.name.clone(),
        target,
        table,
        table_error,
        table_note,
        regions,
        ingot,
    })
}
