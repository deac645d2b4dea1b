//! The partition table on the disk: cleared first (by `wipe`), written last (by
//! `partition-table`), confirmed after; the protective MBR, with GRUB's boot code for a BIOS
//! loader ([`crate::bios`]).
//!
//! A disk without a valid GPT (and protective MBR) is not bootable, so clearing both ends before
//! anything else and writing the table only after every partition verified means no failure, kill
//! or power cut leaves a disk that looks bootable with unverified contents.

use std::collections::BTreeMap;

use gpt::disk::LogicalBlockSize;
use gpt::partition::Partition;
use gpt::partition_types::{OperatingSystem, Type};

use crate::layout::{Content, DiskPlan, MIB};
use crate::target::{Target, TargetError};

#[derive(Debug, thiserror::Error)]
pub enum TableError {
    #[error(transparent)]
    Target(#[from] TargetError),
    #[error("writing the partition table: {0}")]
    Gpt(String),
    #[error("the partition table read back from the disk does not match the plan: {0}")]
    Mismatch(String),
    #[error("the stack's BIOS loader")]
    Bios(#[from] crate::boot::bios::BiosError),
}

/// The byte ranges that hold partition-table signatures: the protective MBR, the primary GPT
/// and the gap up to the first partition at the start; the backup GPT at the end.
fn signature_ranges(disk_size: u64) -> [(u64, u64); 2] {
    let head = MIB.min(disk_size);
    let tail_start = disk_size.saturating_sub(MIB).max(head);
    [(0, head), (tail_start, disk_size - tail_start)]
}

/// Zeroes the partition-table areas at both ends of the disk and syncs.
pub fn clear(target: &Target) -> Result<(), TableError> {
    let zeros = vec![0u8; MIB as usize];
    for (offset, len) in signature_ranges(target.size()) {
        target.write_small(&zeros[..len as usize], offset)?;
    }
    target.sync()?;
    Ok(())
}

fn lb(plan: &DiskPlan) -> LogicalBlockSize {
    if plan.sector_size == 4096 {
        LogicalBlockSize::Lb4096
    } else {
        LogicalBlockSize::Lb512
    }
}

fn entries(plan: &DiskPlan) -> BTreeMap<u32, Partition> {
    let sector = plan.sector_size as u64;
    plan.partitions
        .iter()
        .enumerate()
        .map(|(i, p)| {
            let part = Partition {
                part_type_guid: Type {
                    guid: p.type_guid,
                    os: OperatingSystem::Custom("ingot".into()),
                },
                part_guid: p.part_guid,
                first_lba: p.offset / sector,
                last_lba: (p.offset + p.size) / sector - 1,
                flags: p.attributes,
                name: p.label.clone(),
            };
            (i as u32 + 1, part)
        })
        .collect()
}

/// Writes the protective MBR (with `mbr_code` patched in, when given) and the GPT (backup, then
/// primary) for `plan`, syncs, reads the table back and checks every entry against the plan.
pub fn write(target: &Target, plan: &DiskPlan, mbr_code: Option<&[u8]>) -> Result<(), TableError> {
    let gpt_err = |e: &dyn std::fmt::Display| TableError::Gpt(e.to_string());
    let device = target.clone_buffered()?;
    let mut disk = gpt::GptConfig::new()
        .writable(true)
        .logical_block_size(lb(plan))
        .create_from_device(device, Some(plan.disk_guid))
        .map_err(|e| gpt_err(&e))?;
    disk.update_partitions(entries(plan))
        .map_err(|e| gpt_err(&e))?;
    let mut device = disk.write().map_err(|e| gpt_err(&e))?;
    let sectors = plan.disk_size / plan.sector_size as u64;
    let mbr = gpt::mbr::ProtectiveMBR::with_lb_size(u32::try_from(sectors - 1).unwrap_or(u32::MAX));
    mbr.overwrite_lba0(&mut device).map_err(|e| gpt_err(&e))?;
    drop(device);
    let boot_sector = match (mbr_code, plan.find(&Content::BiosBoot)) {
        (Some(code), Some(part)) => {
            let mut protective = [0u8; 512];
            target.read_small(&mut protective, 0)?;
            let sector = crate::boot::bios::mbr(code, &protective, part.offset / 512)?;
            target.write_small(&sector, 0)?;
            Some(sector)
        }
        _ => None,
    };
    target.sync()?;
    confirm(target, plan)?;
    if let Some(sector) = boot_sector {
        let mut back = [0u8; 512];
        target.read_small(&mut back, 0)?;
        if back != sector {
            return Err(TableError::Mismatch(
                "the MBR boot code read back differs".into(),
            ));
        }
    }
    Ok(())
}

/// Reads the GPT back (both headers must be valid) and compares it with the plan.
pub fn confirm(target: &Target, plan: &DiskPlan) -> Result<(), TableError> {
    let device = target.clone_buffered()?;
    let disk = gpt::GptConfig::new()
        .writable(false)
        .logical_block_size(lb(plan))
        .open_from_device(device)
        .map_err(|e| TableError::Mismatch(format!("cannot read it: {e}")))?;
    if *disk.guid() != plan.disk_guid {
        return Err(TableError::Mismatch(format!(
            "disk GUID {} instead of {}",
            disk.guid(),
            plan.disk_guid
        )));
    }
    let want = entries(plan);
    let have = disk.partitions();
    if have.len() != want.len() {
        return Err(TableError::Mismatch(format!(
            "{} partitions instead of {}",
            have.len(),
            want.len()
        )));
    }
    for ((_, h), (_, w)) in have.iter().zip(want.iter()) {
        if h.part_type_guid.guid != w.part_type_guid.guid
            || h.part_guid != w.part_guid
            || h.first_lba != w.first_lba
            || h.last_lba != w.last_lba
            || h.flags != w.flags
            || h.name != w.name
        {
            return Err(TableError::Mismatch(format!(
                "partition `{}`: read back {h:?}",
                w.name
            )));
        }
    }
    Ok(())
}
