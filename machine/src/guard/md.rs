//! Linux md RAID member superblocks (layout: the kernel's `include/uapi/linux/raid/md_p.h`).
//!
//! Where a superblock sits depends on its version: 1.1 at byte 0, 1.2 at 4 KiB, 1.0 at the end
//! minus 8 KiB rounded down to 4 KiB, 0.90 at the end rounded down to 64 KiB minus 64 KiB.
//! Version 1 is little-endian; 0.90 is in the writer's byte order (little-endian on x86, which is
//! what a Hetzner machine runs; a big-endian 0.90 superblock is not recognised).

use serde::Serialize;

use super::slice::Slice;

/// `MD_SB_MAGIC`.
pub const MD_MAGIC: u32 = 0xa92b_4efc;

/// One md member superblock.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct MdMember {
    /// `0.90`, `1.0`, `1.1` or `1.2`.
    pub metadata: String,
    /// The array UUID, as `mdadm --examine` prints it (`aabbccdd:eeff0011:...`).
    pub array_uuid: String,
    /// RAID level (-1 linear, 0, 1, 4, 5, 6, 10).
    pub level: i32,
    /// The array's name (1.x only), e.g. `rescue:0`.
    pub name: String,
    /// Where the array's data begins in this member, bytes (0 for 0.90 and 1.0).
    pub data_offset_bytes: u64,
}

/// Every md superblock in `region` (normally none or one).
pub fn probe(region: &Slice) -> Vec<MdMember> {
    let len = region.len();
    let mut out = Vec::new();
    let v1 = [
        ("1.1", Some(0)),
        ("1.2", Some(4096)),
        ("1.0", v10_offset(len)),
    ];
    for (metadata, offset) in v1 {
        if let Some(m) = offset.and_then(|o| parse_v1(region, o, metadata)) {
            out.push(m);
        }
    }
    if let Some(m) = v090_offset(len).and_then(|o| parse_v090(region, o)) {
        out.push(m);
    }
    out
}

/// 1.0: `(size - 8 KiB) & ~(4 KiB - 1)`.
pub fn v10_offset(len: u64) -> Option<u64> {
    len.checked_sub(8192).map(|o| o & !4095)
}

/// 0.90: `(size & ~(64 KiB - 1)) - 64 KiB`.
pub fn v090_offset(len: u64) -> Option<u64> {
    (len & !65535).checked_sub(65536)
}

fn le32(b: &[u8], at: usize) -> u32 {
    u32::from_le_bytes(b[at..at + 4].try_into().expect("4 bytes"))
}

fn le64(b: &[u8], at: usize) -> u64 {
    u64::from_le_bytes(b[at..at + 8].try_into().expect("8 bytes"))
}

fn parse_v1(region: &Slice, offset: u64, metadata: &str) -> Option<MdMember> {
    let sb = region.bytes(offset, 256)?;
    if le32(&sb, 0) != MD_MAGIC || le32(&sb, 4) != 1 {
        return None;
    }
    // super_offset (sectors) names where the superblock believes it is; it tells 1.1 from 1.2
    // from 1.0 and rejects a stray copy inside another member's data.
    if le64(&sb, 144) != offset / 512 {
        return None;
    }
    let name_bytes = &sb[32..64];
    let name_end = name_bytes.iter().position(|&b| b == 0).unwrap_or(32);
    Some(MdMember {
        metadata: metadata.to_string(),
        array_uuid: mdadm_uuid(&sb[16..32]),
        level: le32(&sb, 72) as i32,
        name: String::from_utf8_lossy(&name_bytes[..name_end]).into_owned(),
        // Any 64-bit sector count: one past the end of every disk saturates, never overflows.
        data_offset_bytes: le64(&sb, 128).saturating_mul(512),
    })
}

fn parse_v090(region: &Slice, offset: u64) -> Option<MdMember> {
    let sb = region.bytes(offset, 64)?;
    if le32(&sb, 0) != MD_MAGIC || le32(&sb, 4) != 0 || le32(&sb, 8) != 90 {
        return None;
    }
    // set_uuid0 is word 5, set_uuid1..3 are words 13..15; `mdadm --examine` prints them as
    // four 32-bit numbers.
    let uuid: Vec<String> = [5usize, 13, 14, 15]
        .iter()
        .map(|&w| format!("{:08x}", le32(&sb, w * 4)))
        .collect();
    Some(MdMember {
        metadata: "0.90".into(),
        array_uuid: uuid.join(":"),
        level: le32(&sb, 28) as i32,
        name: String::new(),
        data_offset_bytes: 0,
    })
}

/// mdadm prints the 16 UUID bytes as four 8-hex-digit groups joined by `:`.
fn mdadm_uuid(b: &[u8]) -> String {
    b.chunks(4).map(hex_lower).collect::<Vec<_>>().join(":")
}

fn hex_lower(b: &[u8]) -> String {
    b.iter().map(|x| format!("{x:02x}")).collect()
}

#[cfg(any(test, feature = "fixtures"))]
/// Parse an array UUID in mdadm's spelling (`aabbccdd:eeff0011:22334455:66778899`) or as a plain
/// UUID with dashes.
pub fn parse_uuid(s: &str) -> Option<[u8; 16]> {
    let hex: String = s.chars().filter(|c| c.is_ascii_hexdigit()).collect();
    if hex.len() != 32
        || s.chars()
            .any(|c| !(c.is_ascii_hexdigit() || c == ':' || c == '-'))
    {
        return None;
    }
    let mut out = [0u8; 16];
    for (i, byte) in out.iter_mut().enumerate() {
        *byte = u8::from_str_radix(&hex[i * 2..i * 2 + 2], 16).ok()?;
    }
    Some(out)
}

/// What a member superblock written by [`write_v1`] says.
#[derive(Debug, Clone)]
pub struct V1Params {
    /// `1.0`, `1.1` or `1.2`.
    pub metadata: String,
    /// Array UUID.
    pub array_uuid: [u8; 16],
    /// This device's UUID.
    pub device_uuid: [u8; 16],
    /// Array name, e.g. `rescue:0`.
    pub name: String,
    /// RAID level.
    pub level: i32,
    /// Members in the array.
    pub raid_disks: u32,
    /// This member's slot.
    pub dev_number: u32,
    /// Creation and update time, seconds since the epoch.
    pub time: u64,
    /// The members are known to be identical. `false` asks the kernel for the initial resync
    /// on first assembly, as `mdadm --create` does (`resync_offset` 0).
    pub clean: bool,
}

/// A version-1 member superblock for a member device of `dev_bytes`, and the byte offset to
/// write it at. Written from md_p.h's `struct mdp_superblock_1`, because `mdadm --create` needs
/// the md kernel driver (absent in CI containers, and the writer makes `var`'s mirror before
/// the partitions exist); `mdadm --examine` on the image checks it.
pub fn write_v1(p: &V1Params, dev_bytes: u64) -> Option<(u64, Vec<u8>)> {
    let dev_sectors = dev_bytes / 512;
    // 1 MiB of room before the data for 1.1/1.2, as mdadm leaves on small devices; 1.0 keeps
    // the data at 0 and the superblock (plus 8 KiB reserve) at the end.
    let (sb_offset, data_offset, data_size) = match p.metadata.as_str() {
        "1.1" => (0u64, 2048u64, dev_sectors.checked_sub(2048)?),
        "1.2" => (8, 2048, dev_sectors.checked_sub(2048)?),
        "1.0" => {
            let off = v10_offset(dev_bytes)? / 512;
            (off, 0, off)
        }
        _ => return None,
    };
    let max_dev: u32 = 384; // fills the superblock to 1 KiB, as mdadm does
    let mut sb = vec![0u8; 256 + 2 * max_dev as usize];
    let put32 = |sb: &mut [u8], at: usize, v: u32| sb[at..at + 4].copy_from_slice(&v.to_le_bytes());
    let put64 = |sb: &mut [u8], at: usize, v: u64| sb[at..at + 8].copy_from_slice(&v.to_le_bytes());
    put32(&mut sb, 0, MD_MAGIC);
    put32(&mut sb, 4, 1); // major_version
    sb[16..32].copy_from_slice(&p.array_uuid);
    let name = p.name.as_bytes();
    sb[32..32 + name.len().min(32)].copy_from_slice(&name[..name.len().min(32)]);
    put64(&mut sb, 64, p.time); // ctime
    put32(&mut sb, 72, p.level as u32);
    put64(&mut sb, 80, data_size); // size: sectors of each member the array uses
    put32(&mut sb, 88, if p.level == 1 { 0 } else { 1024 }); // chunksize (sectors)
    put32(&mut sb, 92, p.raid_disks);
    put64(&mut sb, 128, data_offset);
    put64(&mut sb, 136, data_size);
    put64(&mut sb, 144, sb_offset);
    put32(&mut sb, 160, p.dev_number);
    sb[168..184].copy_from_slice(&p.device_uuid);
    put64(&mut sb, 192, p.time); // utime
    put64(&mut sb, 200, 1); // events
                            // resync_offset: MaxSector when clean, else 0 (resync everything on first assembly).
    put64(&mut sb, 208, if p.clean { u64::MAX } else { 0 });
    put32(&mut sb, 220, max_dev);
    for slot in 0..max_dev as usize {
        // dev_roles: member i has role i, every other slot is a spare (0xffff).
        let role: u16 = if (slot as u32) < p.raid_disks {
            slot as u16
        } else {
            0xffff
        };
        sb[256 + 2 * slot..258 + 2 * slot].copy_from_slice(&role.to_le_bytes());
    }
    let csum = v1_checksum(&sb);
    put32(&mut sb, 216, csum);
    Some((sb_offset * 512, sb))
}

/// `sb_csum`: the 32-bit little-endian words of the superblock (256 bytes plus 2 per `max_dev`)
/// with the checksum field as zero, summed in 64 bits, then the carry folded in once.
fn v1_checksum(sb: &[u8]) -> u32 {
    let mut sum: u64 = 0;
    let mut chunks = sb.chunks_exact(4);
    for (i, w) in chunks.by_ref().enumerate() {
        if i != 216 / 4 {
            sum += u32::from_le_bytes(w.try_into().expect("4 bytes")) as u64;
        }
    }
    if let [a, b] = chunks.remainder() {
        sum += u16::from_le_bytes([*a, *b]) as u64;
    }
    ((sum & 0xffff_ffff) + (sum >> 32)) as u32
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn offsets_by_version() {
        let len = 64 << 20;
        assert_eq!(v10_offset(len), Some(len - 8192));
        assert_eq!(v10_offset(len + 512), Some(len - 8192));
        assert_eq!(v10_offset(len + 4096), Some(len - 4096));
        assert_eq!(v090_offset(len), Some(len - 65536));
        assert_eq!(v090_offset(len + 4096), Some(len - 65536));
        assert_eq!(v090_offset(1000), None);
    }

    #[test]
    fn uuid_spellings() {
        let u = parse_uuid("0a1b2c3d:4e5f6071:8293a4b5:c6d7e8f9").unwrap();
        assert_eq!(mdadm_uuid(&u), "0a1b2c3d:4e5f6071:8293a4b5:c6d7e8f9");
        assert_eq!(parse_uuid("0a1b2c3d-4e5f-6071-8293-a4b5c6d7e8f9"), Some(u));
        assert_eq!(parse_uuid("zz"), None);
    }

    /// What [`probe`] finds in a disk holding `img`.
    fn probe_image(img: &[u8]) -> Vec<MdMember> {
        use std::io::Write;
        let mut f = tempfile::NamedTempFile::new().unwrap();
        f.write_all(img).unwrap();
        let s = Slice::whole(
            std::sync::Arc::new(std::fs::File::open(f.path()).unwrap()),
            img.len() as u64,
        );
        probe(&s)
    }

    #[test]
    fn v090_superblock_at_the_end() {
        let len = 1 << 20;
        let mut img = vec![0u8; len];
        let at = v090_offset(len as u64).unwrap() as usize;
        let w = |img: &mut Vec<u8>, word: usize, v: u32| {
            img[at + word * 4..at + word * 4 + 4].copy_from_slice(&v.to_le_bytes())
        };
        w(&mut img, 0, MD_MAGIC);
        w(&mut img, 2, 90);
        w(&mut img, 5, 0x11223344);
        w(&mut img, 7, 1);
        w(&mut img, 13, 0x55667788);
        w(&mut img, 14, 0x99aabbcc);
        w(&mut img, 15, 0xddeeff00);
        let found = probe_image(&img);
        assert_eq!(found.len(), 1, "{found:?}");
        assert_eq!(found[0].metadata, "0.90");
        assert_eq!(found[0].level, 1);
        assert_eq!(found[0].array_uuid, "11223344:55667788:99aabbcc:ddeeff00");
    }

    /// Found by the disk_scan fuzz target: a 1.2 superblock whose data_offset (sectors) times
    /// 512 overflows u64 panicked ("attempt to multiply with overflow"); it is still reported
    /// as a member, its data offset saturated.
    #[test]
    fn a_v1_data_offset_beyond_u64_bytes_saturates() {
        let len = 1 << 20;
        let at = 4096usize; // 1.2: 4 KiB from the start
        let mut img = vec![0u8; len];
        img[at..at + 4].copy_from_slice(&MD_MAGIC.to_le_bytes());
        img[at + 4..at + 8].copy_from_slice(&1u32.to_le_bytes());
        img[at + 128..at + 136].copy_from_slice(&u64::MAX.to_le_bytes());
        img[at + 144..at + 152].copy_from_slice(&((at / 512) as u64).to_le_bytes());
        let found = probe_image(&img);
        assert_eq!(found.len(), 1, "{found:?}");
        assert_eq!(found[0].data_offset_bytes, u64::MAX);
    }
}
