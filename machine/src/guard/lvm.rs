//! LVM2 physical volume labels (LVM2's `lib/label/label.h` and `lib/format_text/layout.h`).
//!
//! The label is one 512-byte sector among the first four of the device (sector 1 by default):
//! `LABELONE`, its own sector number (u64), a CRC (u32) over the rest of the sector from byte 20,
//! the offset of the contents (u32, 32), and the type `LVM2 001`. At byte 32 the PV header
//! follows: the PV UUID (32 characters, no dashes), the device size, then two zero-terminated
//! lists of (offset, size) areas: data areas, then metadata areas. All integers little-endian.

use super::slice::Slice;

const SECTOR: usize = 512;

/// The PV UUID (as `pvs -o pv_uuid` prints it: 6-4-4-4-4-4-6 characters) if `region` carries an
/// LVM2 label in one of its first four sectors.
pub fn probe_label(region: &Slice) -> Option<String> {
    (0..4u64).find_map(|sector| {
        let s = region.bytes(sector * SECTOR as u64, SECTOR)?;
        if &s[0..8] != b"LABELONE" || &s[24..32] != b"LVM2 001" {
            return None;
        }
        let uuid = std::str::from_utf8(&s[32..64]).ok()?;
        Some(dashed_uuid(uuid))
    })
}

/// The volume group a PV belongs to, from the newest metadata in the PV's metadata area.
#[derive(Debug, Clone, PartialEq, Eq, serde::Serialize)]
pub struct VolumeGroup {
    /// The VG's name, e.g. `vg0`.
    pub name: String,
    /// The VG UUID.
    pub id: String,
    /// Every PV of the VG (UUIDs, `pvs` spelling), wherever they are.
    pub pv_ids: Vec<String>,
}

/// The VG recorded in the first metadata area of the PV labelled in `region`, if the PV belongs
/// to one (an orphan PV's metadata area is empty). Layout: LVM2's `lib/format_text/layout.h`
/// (`mda_header` with its `raw_locn` list, a circular text buffer after the 512-byte header).
pub fn probe_vg(region: &Slice) -> Option<VolumeGroup> {
    let label = (0..4u64).find_map(|sector| {
        let s = region.bytes(sector * SECTOR as u64, SECTOR)?;
        (&s[0..8] == b"LABELONE" && &s[24..32] == b"LVM2 001").then_some(s)
    })?;
    let le64 = |b: &[u8], at: usize| u64::from_le_bytes(b[at..at + 8].try_into().expect("8"));
    // pv_header: uuid (32), device size (8), then two zero-terminated (offset, size) lists of
    // 16 bytes each: data areas, then metadata areas.
    let mut at = 72;
    while at + 16 <= SECTOR && le64(&label, at) != 0 {
        at += 16;
    }
    at += 16;
    if at + 16 > SECTOR {
        return None;
    }
    let mda_start = le64(&label, at);
    let mda_size = le64(&label, at + 8);
    let header = region.bytes(mda_start, SECTOR)?;
    if &header[4..20] != b" LVM2 x[5A%r0N*>" {
        return None;
    }
    // The first raw_locn names the committed metadata: offset within the area, size.
    let (offset, size) = (le64(&header, 40), le64(&header, 48));
    if offset == 0 || size == 0 || size > 16 << 20 || mda_size <= SECTOR as u64 {
        return None;
    }
    let text = if offset + size <= mda_size {
        region.bytes(mda_start + offset, size as usize)?
    } else {
        // Wrapped around the end of the circular buffer, continuing after the header.
        let first = mda_size.checked_sub(offset)?;
        let mut t = region.bytes(mda_start + offset, first as usize)?;
        t.extend(region.bytes(mda_start + SECTOR as u64, (size - first) as usize)?);
        t
    };
    parse_vg_text(&String::from_utf8_lossy(&text))
}

/// The VG name, its id and the ids of its `physical_volumes` from LVM2's text metadata.
fn parse_vg_text(text: &str) -> Option<VolumeGroup> {
    let mut path: Vec<String> = Vec::new();
    let mut vg: Option<VolumeGroup> = None;
    for line in text.lines() {
        let line = line.trim();
        if let Some(section) = line.strip_suffix('{') {
            path.push(section.trim().to_string());
            if path.len() == 1 && vg.is_none() {
                vg = Some(VolumeGroup {
                    name: path[0].clone(),
                    id: String::new(),
                    pv_ids: Vec::new(),
                });
            }
            continue;
        }
        if line == "}" {
            path.pop();
            continue;
        }
        let Some(id) = line
            .strip_prefix("id = \"")
            .and_then(|r| r.split('"').next())
        else {
            continue;
        };
        let vg = vg.as_mut()?;
        match path.len() {
            1 => vg.id = id.to_string(),
            3 if path[1] == "physical_volumes" => vg.pv_ids.push(id.to_string()),
            _ => {}
        }
    }
    vg.filter(|v| !v.id.is_empty())
}

fn dashed_uuid(u: &str) -> String {
    let mut out = String::new();
    let mut rest = u;
    for (i, n) in [6, 4, 4, 4, 4, 4, 6].into_iter().enumerate() {
        let (part, tail) = rest.split_at(n.min(rest.len()));
        if i > 0 {
            out.push('-');
        }
        out.push_str(part);
        rest = tail;
    }
    out
}

#[cfg(any(test, feature = "fixtures"))]
/// LVM's CRC-32: the reflected polynomial 0xEDB88320, initial value 0xf597a6cf, no final xor
/// (`calc_crc` with `INITIAL_CRC`).
pub fn lvm_crc(buf: &[u8]) -> u32 {
    let mut crc: u32 = 0xf597_a6cf;
    for &b in buf {
        crc ^= b as u32;
        for _ in 0..8 {
            crc = (crc >> 1) ^ if crc & 1 != 0 { 0xedb8_8320 } else { 0 };
        }
    }
    crc
}

/// The first 1 MiB of a fresh PV, as `pvcreate` lays it out on a device of `dev_bytes`: the label
/// in sector 1 and an empty metadata area header at 4 KiB (an orphan PV has no VG metadata),
/// data from 1 MiB.
///
/// Written from the format instead of running `pvcreate`, because pvcreate needs a block device
/// (root and a loop device) and records the device in the host's LVM devices file and cache;
/// the tests check the result with `pvck` and `pvs --devices` on a loop device.
#[cfg(feature = "fixtures")]
pub fn write_pv(uuid: &str, dev_bytes: u64) -> Option<Vec<u8>> {
    const MDA_START: u64 = 4096;
    const DATA_START: u64 = 1 << 20;
    let uuid: String = uuid.chars().filter(|&c| c != '-').collect();
    if uuid.len() != 32 || dev_bytes < 2 * DATA_START {
        return None;
    }
    let mut out = vec![0u8; DATA_START as usize];
    let put32 = |b: &mut [u8], at: usize, v: u32| b[at..at + 4].copy_from_slice(&v.to_le_bytes());
    let put64 = |b: &mut [u8], at: usize, v: u64| b[at..at + 8].copy_from_slice(&v.to_le_bytes());

    let label = &mut out[SECTOR..2 * SECTOR];
    label[0..8].copy_from_slice(b"LABELONE");
    put64(label, 8, 1); // sector_xl
    put32(label, 20, 32); // offset_xl
    label[24..32].copy_from_slice(b"LVM2 001");
    label[32..64].copy_from_slice(uuid.as_bytes());
    put64(label, 64, dev_bytes); // device_size_xl
    put64(label, 72, DATA_START); // data area: offset, size 0 = to the end
                                  // 88..104: end of the data area list
    put64(label, 104, MDA_START); // metadata area: offset, size
    put64(label, 112, DATA_START - MDA_START);
    // 120..136: end of the metadata area list; then the header extension: version 2, flags 0,
    // and an empty bootloader area list.
    put32(label, 136, 2);
    let crc = lvm_crc(&label[20..]);
    put32(label, 16, crc);

    let mda = &mut out[MDA_START as usize..MDA_START as usize + SECTOR];
    mda[4..20].copy_from_slice(b" LVM2 x[5A%r0N*>");
    put32(mda, 20, 1); // version
    put64(mda, 24, MDA_START); // start
    put64(mda, 32, DATA_START - MDA_START); // size
    let crc = lvm_crc(&mda[4..]);
    put32(mda, 0, crc);
    Some(out)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn vg_text_as_vgcreate_writes_it() {
        // The head of the metadata `vgcreate hzvg0 /dev/loop0` (LVM 2.03.16) wrote.
        let text = "hzvg0 {\nid = \"kz0sfp-B7Ur-w3sr-ieHx-Htbr-8qyM-SD6CJ6\"\nseqno = 1\n\
            status = [\"RESIZEABLE\", \"READ\", \"WRITE\"]\nphysical_volumes {\n\npv0 {\n\
            id = \"lALpAK-Vh44-XBQy-flZG-yoFN-pVwe-sQ4KLy\"\ndevice = \"/dev/loop0\"\n}\n\
            pv1 {\nid = \"aaaaaa-bbbb-cccc-dddd-eeee-ffff-gggggg\"\n}\n}\n\
            logical_volumes {\n\nroot {\nid = \"LVLVLV-bbbb-cccc-dddd-eeee-ffff-gggggg\"\n}\n}\n}\n\
            # Generated by LVM2\ncontents = \"Text Format Volume Group\"\n";
        let vg = parse_vg_text(text).unwrap();
        assert_eq!(vg.name, "hzvg0");
        assert_eq!(vg.id, "kz0sfp-B7Ur-w3sr-ieHx-Htbr-8qyM-SD6CJ6");
        assert_eq!(
            vg.pv_ids,
            [
                "lALpAK-Vh44-XBQy-flZG-yoFN-pVwe-sQ4KLy",
                "aaaaaa-bbbb-cccc-dddd-eeee-ffff-gggggg"
            ]
        );
        assert_eq!(parse_vg_text("contents = \"x\"\n"), None);
    }

    #[test]
    fn uuid_is_dashed_like_pvs() {
        assert_eq!(
            dashed_uuid("aaaaaabbbbccccddddeeeeffffgggggg"),
            "aaaaaa-bbbb-cccc-dddd-eeee-ffff-gggggg"
        );
    }

    #[test]
    fn crc_matches_a_label_pvcreate_wrote() {
        // Sector 1 of a 64 MiB loop device after
        // `pvcreate --uuid aaaaaa-bbbb-cccc-dddd-eeee-ffff-gggggg` (LVM 2.03.16): CRC f09be4af.
        let mut s = [0u8; 512];
        s[0..8].copy_from_slice(b"LABELONE");
        s[8] = 1;
        s[20] = 0x20;
        s[24..32].copy_from_slice(b"LVM2 001");
        s[32..64].copy_from_slice(b"aaaaaabbbbccccddddeeeeffffgggggg");
        s[64..72].copy_from_slice(&(64u64 << 20).to_le_bytes());
        s[72..80].copy_from_slice(&(1u64 << 20).to_le_bytes());
        s[104..112].copy_from_slice(&4096u64.to_le_bytes());
        s[112..120].copy_from_slice(&0xff000u64.to_le_bytes());
        s[136] = 2;
        assert_eq!(lvm_crc(&s[20..]), 0xf09b_e4af);
    }
}
