//! Extended attributes: stored in the inode's spare space after `i_extra_isize` when they fit,
//! the rest in one attribute block (shared between inodes with identical attribute sets).
//!
//! Names are stored without their namespace prefix, which becomes `e_name_index`. POSIX ACLs
//! arrive in the VFS xattr format (version 2) and are stored in ext4's compact format (version 1).

use super::csum::crc32c_raw;
use super::le::{put_u16, put_u32, put_u64};
use super::BLOCK_SIZE;

const XATTR_MAGIC: u32 = 0xEA02_0000;
/// Entry header size before the name.
const ENTRY_HEADER: usize = 16;
/// Block header size (magic, refcount, blocks, hash, checksum, reserved).
const BLOCK_HEADER: usize = 32;

/// One attribute in on-disk form.
#[derive(Debug, Clone, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct Attr {
    pub index: u8,
    pub name: Vec<u8>,
    pub value: Vec<u8>,
}

fn pad4(n: usize) -> usize {
    (n + 3) & !3
}

/// Splits a full attribute name into ext4's namespace index and the stored suffix, converting
/// ACL values. `Err` carries a reason.
pub fn to_disk(name: &[u8], value: &[u8]) -> Result<Attr, String> {
    let (index, suffix, value): (u8, &[u8], Vec<u8>) = if let Some(s) = name.strip_prefix(b"user.")
    {
        (1, s, value.to_vec())
    } else if name == b"system.posix_acl_access" {
        (2, b"", acl_to_disk(value)?)
    } else if name == b"system.posix_acl_default" {
        (3, b"", acl_to_disk(value)?)
    } else if let Some(s) = name.strip_prefix(b"trusted.") {
        (4, s, value.to_vec())
    } else if let Some(s) = name.strip_prefix(b"security.") {
        (6, s, value.to_vec())
    } else {
        return Err(
            "namespace not supported (user., trusted., security., system.posix_acl_*)".into(),
        );
    };
    if suffix.is_empty() && index != 2 && index != 3 {
        return Err("empty attribute name".into());
    }
    if suffix.contains(&0) {
        return Err("name holds a NUL byte".into());
    }
    if suffix.len() > 255 {
        return Err("name longer than 255 bytes".into());
    }
    Ok(Attr {
        index,
        name: suffix.to_vec(),
        value,
    })
}

/// VFS `posix_acl_xattr` (version 2, 8-byte entries) to ext4's `ext4_acl` (version 1, 4-byte
/// entries for the owner/group/mask/other tags, 8 bytes for named users and groups).
fn acl_to_disk(v: &[u8]) -> Result<Vec<u8>, String> {
    if v.len() < 4 || (v.len() - 4) % 8 != 0 || u32::from_le_bytes([v[0], v[1], v[2], v[3]]) != 2 {
        return Err("malformed POSIX ACL value".into());
    }
    let mut out = 1u32.to_le_bytes().to_vec();
    for e in v[4..].chunks(8) {
        let tag = u16::from_le_bytes([e[0], e[1]]);
        out.extend_from_slice(&e[0..4]);
        match tag {
            0x01 | 0x04 | 0x10 | 0x20 => {}
            0x02 | 0x08 => out.extend_from_slice(&e[4..8]),
            _ => return Err(format!("unknown POSIX ACL tag {tag:#x}")),
        }
    }
    Ok(out)
}

/// `e_hash`: e2fsprogs' ext2fs_ext_attr_hash_entry (name bytes, then the value as
/// zero-padded little-endian words).
fn entry_hash(a: &Attr) -> u32 {
    let mut h: u32 = 0;
    for &c in &a.name {
        h = (h << 5) ^ (h >> 27) ^ u32::from(c);
    }
    if !a.value.is_empty() {
        let mut padded = a.value.clone();
        padded.resize(pad4(a.value.len()), 0);
        for w in padded.chunks(4) {
            h = (h << 16) ^ (h >> 16) ^ u32::from_le_bytes([w[0], w[1], w[2], w[3]]);
        }
    }
    h
}

/// Bytes the attributes take in the inode body: magic, entries, end marker, padded values.
pub fn inline_size(attrs: &[Attr]) -> usize {
    4 + 4
        + attrs
            .iter()
            .map(|a| ENTRY_HEADER + pad4(a.name.len()) + pad4(a.value.len()))
            .sum::<usize>()
}

/// Bytes the attributes take in a block.
pub fn block_size(attrs: &[Attr]) -> usize {
    BLOCK_HEADER
        + 4
        + attrs
            .iter()
            .map(|a| ENTRY_HEADER + pad4(a.name.len()) + pad4(a.value.len()))
            .sum::<usize>()
}

/// Lays out entries and values in `area` (entries from `entries_at`, values packed downwards
/// from the end; value offsets relative to `base`).
fn lay_out(area: &mut [u8], entries_at: usize, base: usize, attrs: &[Attr]) {
    let mut e = entries_at;
    let mut v = area.len();
    for a in attrs {
        v -= pad4(a.value.len());
        area[v..v + a.value.len()].copy_from_slice(&a.value);
        area[e] = a.name.len() as u8;
        area[e + 1] = a.index;
        let offs = if a.value.is_empty() { 0 } else { v - base };
        put_u16(area, e + 2, offs as u16);
        put_u32(area, e + 4, 0);
        put_u32(area, e + 8, a.value.len() as u32);
        put_u32(area, e + 12, entry_hash(a));
        area[e + ENTRY_HEADER..e + ENTRY_HEADER + a.name.len()].copy_from_slice(&a.name);
        e += ENTRY_HEADER + pad4(a.name.len());
    }
    // The four zero bytes after the last entry end the list; `area` is zeroed by the caller.
}

/// Writes in-inode attributes into `body` (the inode bytes after `128 + i_extra_isize`).
pub fn write_inline(body: &mut [u8], attrs: &[Attr]) {
    debug_assert!(inline_size(attrs) <= body.len());
    put_u32(body, 0, XATTR_MAGIC);
    lay_out(body, 4, 4, attrs);
}

/// The contents of an attribute block, checksum not yet set (see [`seal_block`]). Entries are
/// sorted by (index, name length, name) as the kernel's lookup expects.
pub fn block_contents(attrs: &[Attr], refcount: u32) -> Vec<u8> {
    let mut b = vec![0u8; BLOCK_SIZE];
    put_u32(&mut b, 0, XATTR_MAGIC);
    put_u32(&mut b, 4, refcount);
    put_u32(&mut b, 8, 1);
    let mut h: u32 = 0;
    for a in attrs {
        let eh = entry_hash(a);
        if eh == 0 {
            // e2fsprogs' block rehash gives up (hash 0) when any entry hash is 0.
            h = 0;
            break;
        }
        h = (h << 16) ^ (h >> 16) ^ eh;
    }
    put_u32(&mut b, 12, h);
    lay_out(&mut b, BLOCK_HEADER, 0, attrs);
    b
}

/// Sets the block checksum: crc32c(fs seed, block number, block with checksum zeroed).
pub fn seal_block(b: &mut [u8], fs_seed: u32, block: u64) {
    put_u32(b, 16, 0);
    let mut num = [0u8; 8];
    put_u64(&mut num, 0, block);
    let c = crc32c_raw(crc32c_raw(fs_seed, &num), b);
    put_u32(b, 16, c);
}

/// Orders attributes as the block format requires.
pub fn sort_for_block(attrs: &mut [Attr]) {
    attrs.sort_by(|a, b| (a.index, a.name.len(), &a.name).cmp(&(b.index, b.name.len(), &b.name)));
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn names_map_to_namespaces() {
        assert_eq!(to_disk(b"security.capability", b"x").unwrap().index, 6);
        assert_eq!(to_disk(b"user.a", b"").unwrap().name, b"a");
        assert!(to_disk(b"bogus.a", b"").is_err());
        let acl: Vec<u8> = [
            2u32.to_le_bytes().to_vec(),
            vec![1, 0, 6, 0, 0xff, 0xff, 0xff, 0xff],
            vec![2, 0, 4, 0, 0xe8, 3, 0, 0],
        ]
        .concat();
        let d = to_disk(b"system.posix_acl_access", &acl).unwrap();
        assert_eq!(
            d.value,
            vec![1, 0, 0, 0, 1, 0, 6, 0, 2, 0, 4, 0, 0xe8, 3, 0, 0]
        );
    }

    #[test]
    fn inline_layout_fits_exactly() {
        let attrs = vec![Attr {
            index: 1,
            name: b"ab".to_vec(),
            value: vec![7; 5],
        }];
        let mut body = vec![0u8; inline_size(&attrs)];
        write_inline(&mut body, &attrs);
        // entry at 4, value in the last 8 bytes, offset relative to the first entry.
        assert_eq!(body[4], 2);
        assert_eq!(
            u16::from_le_bytes([body[6], body[7]]) as usize,
            body.len() - 8 - 4
        );
        assert_eq!(&body[body.len() - 8..body.len() - 3], &[7; 5]);
    }
}
