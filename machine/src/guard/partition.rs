//! A disk's partition table: GPT (through the `gpt` crate), or MBR with primary, extended and
//! logical partitions (parsed here: the `gpt` crate reads only the protective MBR's four records
//! and knows no extended partitions).

use serde::Serialize;

use super::probe::Slice;

/// One partition: where it is, and what the table says it is.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct Partition {
    /// Partition number as the kernel counts it (GPT: entry index + 1; MBR: 1-4 primary, 5+ logical).
    pub number: u32,
    /// Byte offset on the disk.
    pub offset: u64,
    /// Length in bytes.
    pub size: u64,
    /// GPT type GUID, or the MBR type byte as `0x83`.
    pub type_id: String,
    /// GPT partition name (empty for MBR).
    pub label: String,
}

/// Which table a disk has.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
#[serde(rename_all = "kebab-case")]
pub enum TableKind {
    /// GUID partition table.
    Gpt,
    /// DOS/MBR partition table.
    Mbr,
    /// None: the whole disk is one region.
    None,
}

/// The table of a disk: its kind and partitions. A GPT the `gpt` crate cannot read is reported
/// as an error, not as "no table", so the guard cannot be fooled into skipping a disk.
pub fn read_table(
    disk: &Slice,
    logical_block_size: u32,
) -> Result<(TableKind, Vec<Partition>), String> {
    let lb = u64::from(logical_block_size);
    let has_gpt_sig = |at: u64| disk.bytes(at, 8).is_some_and(|s| s == b"EFI PART");
    let backup_at = (disk.len() / lb).checked_sub(1).map(|l| l * lb);
    if has_gpt_sig(lb) || backup_at.is_some_and(has_gpt_sig) {
        return read_gpt(disk, logical_block_size).map(|p| (TableKind::Gpt, p));
    }
    let Some(mbr) = disk.bytes(0, 512) else {
        return Ok((TableKind::None, vec![]));
    };
    if mbr[510..512] != [0x55, 0xaa] || super::probe::looks_like_fat(disk) {
        return Ok((TableKind::None, vec![]));
    }
    let records = mbr_records(&mbr);
    // A boot sector of a filesystem also ends in 55 AA; only status bytes 0x00/0x80 and at least
    // one used record make it a partition table.
    if records.iter().any(|r| r.status != 0 && r.status != 0x80)
        || records.iter().all(|r| r.kind == 0)
    {
        return Ok((TableKind::None, vec![]));
    }
    if records.iter().any(|r| r.kind == 0xee) {
        // A protective MBR without a readable GPT signature: a damaged GPT.
        return Err("protective MBR but no GPT header".into());
    }
    Ok((TableKind::Mbr, mbr_partitions(disk, &records)))
}

fn read_gpt(disk: &Slice, logical_block_size: u32) -> Result<Vec<Partition>, String> {
    let lb = match logical_block_size {
        512 => gpt::disk::LogicalBlockSize::Lb512,
        4096 => gpt::disk::LogicalBlockSize::Lb4096,
        other => return Err(format!("GPT with a {other}-byte block size")),
    };
    // The gpt crate asserts (panics) on entries of any size but 128 bytes, which the spec allows;
    // check the primary header first and refuse such a table with an error instead.
    if let Some(h) = disk.bytes(u64::from(logical_block_size), 92) {
        if h[0..8] == *b"EFI PART" && u32::from_le_bytes([h[84], h[85], h[86], h[87]]) != 128 {
            return Err("GPT entries are not 128 bytes".into());
        }
    }
    let gpt = gpt::GptConfig::new()
        .writable(false)
        .logical_block_size(lb)
        .open_from_device(disk.clone())
        .map_err(|e| format!("unreadable GPT: {e}"))?;
    let lbs = u64::from(logical_block_size);
    Ok(gpt
        .partitions()
        .iter()
        .filter(|(_, p)| p.is_used())
        .map(|(&n, p)| Partition {
            number: n,
            offset: p.first_lba * lbs,
            size: (p.last_lba + 1).saturating_sub(p.first_lba) * lbs,
            type_id: p.part_type_guid.guid.to_string(),
            label: p.name.clone(),
        })
        .collect())
}

#[derive(Debug, Clone, Copy)]
struct Record {
    status: u8,
    kind: u8,
    lba: u64,
    sectors: u64,
}

fn mbr_records(sector: &[u8]) -> [Record; 4] {
    std::array::from_fn(|i| {
        let e = &sector[446 + 16 * i..446 + 16 * (i + 1)];
        Record {
            status: e[0],
            kind: e[4],
            lba: u32::from_le_bytes([e[8], e[9], e[10], e[11]]).into(),
            sectors: u32::from_le_bytes([e[12], e[13], e[14], e[15]]).into(),
        }
    })
}

fn is_extended(kind: u8) -> bool {
    matches!(kind, 0x05 | 0x0f | 0x85)
}

/// MBR LBAs are in 512-byte units: the DOS format has no notion of other block sizes here.
fn mbr_partitions(disk: &Slice, records: &[Record; 4]) -> Vec<Partition> {
    let mut out = Vec::new();
    for (i, r) in records.iter().enumerate() {
        if r.kind == 0 || r.sectors == 0 {
            continue;
        }
        if is_extended(r.kind) {
            logical_partitions(disk, r.lba, &mut out);
            continue;
        }
        out.push(Partition {
            number: i as u32 + 1,
            offset: r.lba * 512,
            size: r.sectors * 512,
            type_id: format!("{:#04x}", r.kind),
            label: String::new(),
        });
    }
    out
}

/// Follow the chain of extended boot records: each one's first record is a logical partition
/// (relative to that EBR), its second points at the next EBR (relative to the extended partition).
fn logical_partitions(disk: &Slice, ext_lba: u64, out: &mut Vec<Partition>) {
    let mut ebr_lba = ext_lba;
    let mut number = 5;
    // A corrupt chain may loop; no real disk has hundreds of logical partitions.
    for _ in 0..256 {
        let Some(sector) = disk.bytes(ebr_lba * 512, 512) else {
            return;
        };
        if sector[510..512] != [0x55, 0xaa] {
            return;
        }
        let recs = mbr_records(&sector);
        if recs[0].kind != 0 && recs[0].sectors != 0 {
            out.push(Partition {
                number,
                offset: (ebr_lba + recs[0].lba) * 512,
                size: recs[0].sectors * 512,
                type_id: format!("{:#04x}", recs[0].kind),
                label: String::new(),
            });
            number += 1;
        }
        if !is_extended(recs[1].kind) || recs[1].lba == 0 {
            return;
        }
        ebr_lba = ext_lba + recs[1].lba;
    }
}
