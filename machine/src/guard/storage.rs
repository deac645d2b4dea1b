//! md arrays and LVM volume groups: which live only on the target disks (and are torn down
//! before writing), and which reach another disk (and stop the run, disks untouched).
//!
//! installimage's default is software RAID1 over exactly the disks CAPH then names as targets,
//! sometimes with LVM on the arrays; an ingot node on two disks mirrors `var` the same way. Those
//! are replaced as a whole. An array or a volume group that also uses a disk we do not write
//! would be broken by writing, so it stops the run.

use std::collections::BTreeMap;

use serde::Serialize;

use super::{DiskScan, Finding};
use crate::gate::{GateFailure, Reason};

/// What the writer stops and clears before writing; see `teardown` in the crate.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize)]
pub struct Teardown {
    /// md arrays with every member on a target disk.
    pub md_arrays: Vec<ArrayOnTargets>,
    /// LVM volume groups with every PV on a target disk (directly or inside such an array).
    pub volume_groups: Vec<VgOnTargets>,
    /// Target regions (partitions, or a whole disk) holding an md, LVM or filesystem signature,
    /// partitions before whole disks: their signatures are cleared.
    pub regions: Vec<String>,
}

impl Teardown {
    /// Nothing to stop and nothing to clear.
    pub fn is_empty(&self) -> bool {
        self.md_arrays.is_empty() && self.volume_groups.is_empty() && self.regions.is_empty()
    }
}

/// An md array living only on target disks.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct ArrayOnTargets {
    /// The array UUID, `mdadm --examine` spelling.
    pub uuid: String,
    /// Its name (`rescue:0`), empty for 0.90.
    pub name: String,
    /// RAID level.
    pub level: i32,
    /// The member regions (`sda1`, `sdb1`).
    pub members: Vec<String>,
}

/// An LVM volume group living only on target disks.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct VgOnTargets {
    /// The VG name.
    pub name: String,
    /// The VG UUID.
    pub id: String,
    /// The regions holding its PVs (a member partition when the PV is inside an md array).
    pub pvs: Vec<String>,
}

/// One place a signature was found.
struct Place<'a> {
    region: &'a str,
    disk: &'a str,
    target: bool,
}

fn place<'a>(scan: &'a DiskScan, region: &'a super::RegionScan) -> Place<'a> {
    Place {
        region: &region.name,
        disk: &scan.disk,
        target: scan.target,
    }
}

/// Applies the md and LVM rules to the scans: `md-spans-disks` when an array has members on
/// target and non-target disks, `lvm-on-target` when a volume group with a PV on a target also
/// uses a PV on another disk (or one no disk shows); otherwise what to tear down.
pub(super) fn storage_on_targets(scans: &[DiskScan]) -> Result<Teardown, GateFailure> {
    let mut teardown = Teardown::default();
    let mut arrays: BTreeMap<&str, (&super::MdMember, Vec<Place>)> = BTreeMap::new();
    let mut pvs: BTreeMap<&str, Vec<Place>> = BTreeMap::new();
    let mut vgs: BTreeMap<&str, &super::VolumeGroup> = BTreeMap::new();
    for scan in scans {
        for region in &scan.regions {
            for f in &region.findings {
                match f {
                    Finding::MdMember(m) => arrays
                        .entry(&m.array_uuid)
                        .or_insert_with(|| (m, Vec::new()))
                        .1
                        .push(place(scan, region)),
                    Finding::LvmPv {
                        uuid, volume_group, ..
                    } => {
                        pvs.entry(uuid).or_default().push(place(scan, region));
                        if let Some(vg) = volume_group {
                            vgs.entry(&vg.id).or_insert(vg);
                        }
                    }
                    _ => {}
                }
            }
            if scan.target && !region.findings.is_empty() && region.partition.is_some() {
                teardown.regions.push(region.name.clone());
            }
        }
    }
    // Whole disks last: clearing one drops its partition table, and with it the partitions.
    for scan in scans.iter().filter(|s| s.target) {
        if scan.regions.first().is_some_and(|r| !r.findings.is_empty()) {
            teardown.regions.push(scan.disk.clone());
        }
    }

    for (uuid, (member, places)) in &arrays {
        let on_target: Vec<&str> = places
            .iter()
            .filter(|p| p.target)
            .map(|p| p.region)
            .collect();
        let elsewhere: Vec<&Place> = places.iter().filter(|p| !p.target).collect();
        if on_target.is_empty() {
            continue;
        }
        if let Some(first) = elsewhere.first() {
            let others: Vec<&str> = elsewhere.iter().map(|p| p.region).collect();
            return Err(GateFailure::new(
                Reason::MdSpansDisks,
                Some(first.disk),
                format!(
                    "md array {uuid} has members on targets ({}) and on other disks ({}): \
                     target all its disks, or stop the array and wipe its members",
                    on_target.join(", "),
                    others.join(", ")
                ),
            ));
        }
        teardown.md_arrays.push(ArrayOnTargets {
            uuid: uuid.to_string(),
            name: member.name.clone(),
            level: member.level,
            members: on_target.iter().map(|s| s.to_string()).collect(),
        });
    }

    for (id, vg) in &vgs {
        let on_target = vg.pv_ids.iter().any(|pv| {
            pvs.get(pv.as_str())
                .is_some_and(|ps| ps.iter().any(|p| p.target))
        });
        if !on_target {
            continue;
        }
        let mut regions = Vec::new();
        for pv in &vg.pv_ids {
            let places = pvs.get(pv.as_str()).map(Vec::as_slice).unwrap_or_default();
            if places.is_empty() {
                return Err(GateFailure::new(
                    Reason::LvmOnTarget,
                    None,
                    format!(
                        "volume group {} has a PV on a target disk and also uses PV {pv}, which \
                         no disk of this machine shows: writing would break it; remove the \
                         volume group first (vgremove, pvremove) or wipe its disks",
                        vg.name
                    ),
                ));
            }
            if let Some(p) = places.iter().find(|p| !p.target) {
                return Err(GateFailure::new(
                    Reason::LvmOnTarget,
                    Some(p.disk),
                    format!(
                        "volume group {} has PVs on target disks and on {} (PV {pv}): target \
                         all its disks, or remove the volume group first (vgremove, pvremove)",
                        vg.name, p.region
                    ),
                ));
            }
            regions.extend(places.iter().map(|p| p.region.to_string()));
        }
        regions.sort();
        regions.dedup();
        teardown.volume_groups.push(VgOnTargets {
            name: vg.name.clone(),
            id: id.to_string(),
            pvs: regions,
        });
    }
    Ok(teardown)
}
