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
    /// Target regions (partitions, or a whole disk) holding an md or LVM signature, partitions
    /// before whole disks: their signatures are cleared.
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

/// An md or LVM signature: what would be assembled or activated again if left (a filesystem
/// the new table no longer points at is harmless).
fn holds_storage(region: &super::RegionScan) -> bool {
    region
        .findings
        .iter()
        .any(|f| matches!(f, Finding::MdMember(_) | Finding::LvmPv { .. }))
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
    let found = Signatures::collect(scans);
    Ok(Teardown {
        md_arrays: arrays_on_targets(&found.arrays)?,
        volume_groups: groups_on_targets(&found.vgs, &found.pvs)?,
        regions: regions_to_clear(scans),
    })
}

/// The md arrays, LVM PVs and volume groups the scans show, each with where it was found.
#[derive(Default)]
struct Signatures<'a> {
    arrays: BTreeMap<&'a str, (&'a super::MdMember, Vec<Place<'a>>)>,
    pvs: BTreeMap<&'a str, Vec<Place<'a>>>,
    vgs: BTreeMap<&'a str, &'a super::VolumeGroup>,
}

impl<'a> Signatures<'a> {
    fn collect(scans: &'a [DiskScan]) -> Self {
        let mut found = Self::default();
        for scan in scans {
            for region in &scan.regions {
                for f in &region.findings {
                    found.add(f, place(scan, region));
                }
            }
        }
        found
    }

    fn add(&mut self, finding: &'a Finding, at: Place<'a>) {
        match finding {
            Finding::MdMember(m) => self
                .arrays
                .entry(&m.array_uuid)
                .or_insert_with(|| (m, Vec::new()))
                .1
                .push(at),
            Finding::LvmPv {
                uuid, volume_group, ..
            } => {
                self.pvs.entry(uuid).or_default().push(at);
                if let Some(vg) = volume_group {
                    self.vgs.entry(&vg.id).or_insert(vg);
                }
            }
            _ => {}
        }
    }
}

/// Target partitions holding md or LVM signatures, then whole target disks that do: clearing
/// a disk drops its partition table, and with it the partitions.
fn regions_to_clear(scans: &[DiskScan]) -> Vec<String> {
    let targets = || scans.iter().filter(|s| s.target);
    let partitions = targets().flat_map(|scan| {
        scan.regions
            .iter()
            .filter(|r| r.partition.is_some() && holds_storage(r))
    });
    let disks = targets().filter(|scan| scan.regions.first().is_some_and(holds_storage));
    partitions
        .map(|r| r.name.clone())
        .chain(disks.map(|scan| scan.disk.clone()))
        .collect()
}

/// The arrays with a member on a target; `md-spans-disks` when one also has a member elsewhere.
fn arrays_on_targets(
    arrays: &BTreeMap<&str, (&super::MdMember, Vec<Place>)>,
) -> Result<Vec<ArrayOnTargets>, GateFailure> {
    let mut on_targets = Vec::new();
    for (uuid, (member, places)) in arrays {
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
        on_targets.push(ArrayOnTargets {
            uuid: uuid.to_string(),
            name: member.name.clone(),
            level: member.level,
            members: on_target.iter().map(|s| s.to_string()).collect(),
        });
    }
    Ok(on_targets)
}

/// The volume groups with a PV on a target; `lvm-on-target` when one also uses a PV on another
/// disk or one no disk shows.
fn groups_on_targets(
    vgs: &BTreeMap<&str, &super::VolumeGroup>,
    pvs: &BTreeMap<&str, Vec<Place>>,
) -> Result<Vec<VgOnTargets>, GateFailure> {
    let mut on_targets = Vec::new();
    for (id, vg) in vgs {
        let on_target = vg.pv_ids.iter().any(|pv| {
            pvs.get(pv.as_str())
                .is_some_and(|ps| ps.iter().any(|p| p.target))
        });
        if !on_target {
            continue;
        }
        on_targets.push(VgOnTargets {
            name: vg.name.clone(),
            id: id.to_string(),
            pvs: pv_regions(vg, pvs)?,
        });
    }
    Ok(on_targets)
}

/// The regions holding a target volume group's PVs, refused when one is not on a target.
fn pv_regions(
    vg: &super::VolumeGroup,
    pvs: &BTreeMap<&str, Vec<Place>>,
) -> Result<Vec<String>, GateFailure> {
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
    Ok(regions)
}
