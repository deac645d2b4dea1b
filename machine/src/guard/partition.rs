//! A disk's partition table: GPT (through the `gpt` crate), or MBR with primary, extended and
//! logical partitions (parsed here: the `gpt` crate reads only the protective MBR's four records
//! and knows no extended partitions).

use serde::Serialize;

use super::slice::Slice;

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

/// The table of a disk: its kind, partitions, and a note when the primary GPT was passed over
/// for the backup. A GPT that cannot be read from either header is reported as an error, not as
/// "no table", so the guard cannot be fooled into skipping a disk.
pub fn read_table(
    disk: &Slice,
    logical_block_size: u32,
) -> Result<(TableKind, Vec<Partition>, Option<String>), String> {
    let lb = u64::from(logical_block_size);
    let has_gpt_sig = |at: u64| disk.bytes(at, 8).is_some_and(|s| s == b"EFI PART");
    let backup_at = (disk.len() / lb).checked_sub(1).map(|l| l * lb);
    if has_gpt_sig(lb) || backup_at.is_some_and(has_gpt_sig) {
        return read_gpt(disk, logical_block_size).map(|(p, note)| (TableKind::Gpt, p, note));
    }
    let Some(mbr) = disk.bytes(0, 512) else {
        return Ok((TableKind::None, vec![], None));
    };
    if mbr[510..512] != [0x55, 0xaa] || super::probe::looks_like_fat(disk) {
        return Ok((TableKind::None, vec![], None));
    }
    let records = mbr_records(&mbr);
    // A boot sector of a filesystem also ends in 55 AA; only status bytes 0x00/0x80 and at least
    // one used record make it a partition table.
    if records.iter().any(|r| r.status != 0 && r.status != 0x80)
        || records.iter().all(|r| r.kind == 0)
    {
        return Ok((TableKind::None, vec![], None));
    }
    if records.iter().any(|r| r.kind == 0xee) {
        // A protective MBR without a readable GPT signature: a damaged GPT.
        return Err("protective MBR but no GPT header".into());
    }
    Ok((TableKind::Mbr, mbr_partitions(disk, &records), None))
}

/// The most entries a GPT header may claim: far more than partitioning tools make (128), few
/// enough to read at once. A header claiming more is bogus, whatever its checksum says.
const MAX_GPT_ENTRIES: u64 = 16_384;

/// A GPT's partitions, from the primary table or, when that one is bogus or unreadable, from
/// the backup (at the disk's last block, with its own entry array); also why the primary was
/// passed over. Both unreadable is an error naming both.
fn read_gpt(
    disk: &Slice,
    logical_block_size: u32,
) -> Result<(Vec<Partition>, Option<String>), String> {
    let lb = match logical_block_size {
        512 => gpt::disk::LogicalBlockSize::Lb512,
        4096 => gpt::disk::LogicalBlockSize::Lb4096,
        other => return Err(format!("GPT with a {other}-byte block size")),
    };
    let lbs = u64::from(logical_block_size);
    let primary_at = lbs;
    let backup_at = (disk.len() / lbs).saturating_sub(1) * lbs;
    // The gpt crate takes the primary header when it is valid and the backup otherwise; each
    // attempt shows it only the header checked here, the other block reading as zeros.
    let attempt = |at: u64, hide: u64| {
        check_header(disk, at, lbs)?;
        let device = Masked {
            inner: disk.clone(),
            hide: hide..hide + lbs,
        };
        gpt::GptConfig::new()
            .writable(false)
            .logical_block_size(lb)
            .open_from_device(device)
            .map(|gpt| partitions(&gpt, lbs))
            .map_err(|e| format!("unreadable: {e}"))
    };
    let primary_error = match attempt(primary_at, backup_at) {
        Ok(parts) => return Ok((parts, None)),
        Err(e) => e,
    };
    match attempt(backup_at, primary_at) {
        Ok(parts) => Ok((
            parts,
            Some(format!(
                "the primary GPT header {primary_error}; read the backup GPT instead"
            )),
        )),
        Err(backup_error) => Err(format!(
            "the primary GPT header {primary_error}; the backup GPT header {backup_error}"
        )),
    }
}

/// What the GPT header at byte `at` claims, checked before the gpt crate trusts it: the
/// signature, 128-byte entries (the crate asserts that, i.e. panics on others, which the spec
/// allows), an entry count of at most [`MAX_GPT_ENTRIES`] and an entry array inside the disk.
fn check_header(disk: &Slice, at: u64, lbs: u64) -> Result<(), String> {
    let h = disk
        .bytes(at, 92)
        .ok_or_else(|| format!("at byte {at} is past the disk's end"))?;
    if h[0..8] != *b"EFI PART" {
        return Err(format!("at byte {at} has no GPT signature"));
    }
    let u32_at = |i: usize| u64::from(u32::from_le_bytes(h[i..i + 4].try_into().expect("4")));
    let entry_size = u32_at(84);
    if entry_size != 128 {
        return Err(format!("gives {entry_size}-byte entries, not 128"));
    }
    let count = u32_at(80);
    if count > MAX_GPT_ENTRIES {
        return Err(format!(
            "claims {count} partition entries, more than the {MAX_GPT_ENTRIES} any table has"
        ));
    }
    let start = u64::from_le_bytes(h[72..80].try_into().expect("8"));
    let end = start
        .checked_mul(lbs)
        .and_then(|s| s.checked_add(count * entry_size));
    if end.is_none_or(|end| end > disk.len()) {
        return Err(format!(
            "puts its {count} entries at block {start}, past the disk's end"
        ));
    }
    Ok(())
}

fn partitions(gpt: &gpt::GptDisk<Masked>, lbs: u64) -> Vec<Partition> {
    gpt.partitions()
        .iter()
        .filter(|(_, p)| p.is_used())
        .map(|(&n, p)| Partition {
            number: n,
            offset: p.first_lba * lbs,
            size: (p.last_lba + 1).saturating_sub(p.first_lba) * lbs,
            type_id: p.part_type_guid.guid.to_string(),
            label: p.name.clone(),
        })
        .collect()
}

/// A disk whose bytes in `hide` read as zeros: the gpt crate then sees only one GPT header.
#[derive(Debug)]
struct Masked {
    inner: Slice,
    hide: std::ops::Range<u64>,
}

impl std::io::Read for Masked {
    fn read(&mut self, buf: &mut [u8]) -> std::io::Result<usize> {
        use std::io::Seek;
        let at = self.inner.stream_position()?;
        let n = self.inner.read(buf)?;
        let (start, end) = (at, at + n as u64);
        let (from, to) = (self.hide.start.max(start), self.hide.end.min(end));
        if from < to {
            buf[(from - start) as usize..(to - start) as usize].fill(0);
        }
        Ok(n)
    }
}

impl std::io::Seek for Masked {
    fn seek(&mut self, to: std::io::SeekFrom) -> std::io::Result<u64> {
        self.inner.seek(to)
    }
}

impl std::io::Write for Masked {
    fn write(&mut self, buf: &[u8]) -> std::io::Result<usize> {
        self.inner.write(buf)
    }

    fn flush(&mut self) -> std::io::Result<()> {
        self.inner.flush()
    }
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
