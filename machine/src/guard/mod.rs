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

use std::collections::BTreeMap;
use std::fs::File;
use std::io::{Seek, SeekFrom};
use std::sync::Arc;

use serde::Serialize;

use crate::gate::{GateFailure, Reason, Warning};
use crate::{Disk, Facts};

pub use md::MdMember;
pub use partition::{Partition, TableKind};
pub use probe::{probe as probe_region, Finding, Slice};

#[cfg(feature = "fixtures")]
pub use lvm::write_pv;
#[cfg(feature = "fixtures")]
pub use md::{parse_uuid as parse_md_uuid, write_v1 as write_md_v1, V1Params as MdV1Params};

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
    /// What does not stop the run (an allowed foreign OS, an unreadable table).
    pub warnings: Vec<Warning>,
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
    /// The whole disk first, then each partition.
    pub regions: Vec<RegionScan>,
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
            warnings.push(Warning::new(
                Reason::DiskUnreadable,
                Some(&disk.name),
                format!("partition table: {e}; probed the whole disk instead"),
            ));
        }
        scans.push(scan);
    }

    // lvm-on-target
    for scan in scans.iter().filter(|s| s.target) {
        for region in &scan.regions {
            if let Some(f @ Finding::LvmPv { .. }) = region
                .findings
                .iter()
                .find(|f| matches!(f, Finding::LvmPv { .. }))
            {
                return Err(GateFailure::new(
                    Reason::LvmOnTarget,
                    Some(&scan.disk),
                    format!(
                        "target {} holds {}: remove the volume group first (vgremove, pvremove) \
                         or wipe the disk",
                        region.name,
                        f.describe()
                    ),
                ));
            }
        }
    }

    // md-spans-disks: group members by array UUID, then look for both kinds of disk in a group.
    let mut arrays: BTreeMap<&str, Vec<(&str, bool)>> = BTreeMap::new();
    for scan in &scans {
        for region in &scan.regions {
            for f in &region.findings {
                if let Finding::MdMember(m) = f {
                    arrays
                        .entry(&m.array_uuid)
                        .or_default()
                        .push((&region.name, scan.target));
                }
            }
        }
    }
    for (uuid, members) in &arrays {
        let on_target: Vec<&str> = members.iter().filter(|m| m.1).map(|m| m.0).collect();
        let elsewhere: Vec<&str> = members.iter().filter(|m| !m.1).map(|m| m.0).collect();
        if !on_target.is_empty() && !elsewhere.is_empty() {
            let disk = scans
                .iter()
                .find(|s| !s.target && s.regions.iter().any(|r| r.name == elsewhere[0]))
                .map(|s| s.disk.as_str());
            return Err(GateFailure::new(
                Reason::MdSpansDisks,
                disk,
                format!(
                    "md array {uuid} has members on targets ({}) and on other disks ({}): \
                     target all its disks, or stop the array and wipe its members",
                    on_target.join(", "),
                    elsewhere.join(", ")
                ),
            ));
        }
    }

    // foreign-os
    for scan in scans.iter().filter(|s| !s.target) {
        for region in &scan.regions {
            if let Some(f) = region.findings.iter().find(|f| f.is_os()) {
                let message = format!(
                    "{} holds {}; it could boot instead of the new node: wipe it, or target it too",
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
    let (table, partitions, table_error) =
        match partition::read_table(&whole, disk.logical_block_size) {
            Ok((kind, parts)) => (kind, parts, None),
            Err(e) => (TableKind::None, vec![], Some(e)),
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
    Ok(DiskScan {
        disk: disk.name.clone(),
        target,
        table,
        table_error,
        regions,
    })
}
