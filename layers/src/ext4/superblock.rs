//! The superblock (1024 bytes at byte 1024 of block 0, copied into backup groups) and the
//! feature set ingot images carry.

use super::csum::crc32c_raw;
use super::le::{put_u16, put_u32, put_u8};

pub const COMPAT_EXT_ATTR: u32 = 0x0008;
pub const COMPAT_DIR_INDEX: u32 = 0x0020;
pub const INCOMPAT_FILETYPE: u32 = 0x0002;
pub const INCOMPAT_EXTENTS: u32 = 0x0040;
pub const INCOMPAT_64BIT: u32 = 0x0080;
pub const INCOMPAT_FLEX_BG: u32 = 0x0200;
pub const RO_COMPAT_SPARSE_SUPER: u32 = 0x0001;
pub const RO_COMPAT_LARGE_FILE: u32 = 0x0002;
pub const RO_COMPAT_HUGE_FILE: u32 = 0x0008;
pub const RO_COMPAT_DIR_NLINK: u32 = 0x0020;
pub const RO_COMPAT_EXTRA_ISIZE: u32 = 0x0040;
pub const RO_COMPAT_METADATA_CSUM: u32 = 0x0400;

/// Everything that varies between images; the rest is fixed by the format choices.
#[derive(Debug, Clone)]
pub struct SuperblockFields {
    pub inodes_count: u32,
    pub blocks_count: u64,
    pub free_blocks: u64,
    pub free_inodes: u32,
    pub inodes_per_group: u32,
    pub time: u64,
    pub uuid: [u8; 16],
    pub hash_seed: [u8; 16],
    pub group_nr: u16,
    pub want_64bit: bool,
    pub log_groups_per_flex: u8,
}

pub const INODE_SIZE: u16 = 256;
/// `i_extra_isize`: room for checksum_hi, the *_extra time fields, crtime, version_hi, projid.
pub const EXTRA_ISIZE: u16 = 32;
pub const FIRST_INO: u32 = 11;
pub const BLOCKS_PER_GROUP: u32 = 32768;

/// Serializes a superblock (1024 bytes) with its checksum.
pub fn to_bytes(f: &SuperblockFields) -> [u8; 1024] {
    let mut b = [0u8; 1024];
    let t = f.time as u32;
    let t_hi = (f.time >> 32) as u8;
    put_u32(&mut b, 0x00, f.inodes_count);
    put_u32(&mut b, 0x04, f.blocks_count as u32);
    put_u32(&mut b, 0x08, 0); // no blocks reserved for root: the image is read-only
    put_u32(&mut b, 0x0C, f.free_blocks as u32);
    put_u32(&mut b, 0x10, f.free_inodes);
    put_u32(&mut b, 0x14, 0); // first data block: 0 with 4 KiB blocks
    put_u32(&mut b, 0x18, 2); // log2(4096) - 10
    put_u32(&mut b, 0x1C, 2);
    put_u32(&mut b, 0x20, BLOCKS_PER_GROUP);
    put_u32(&mut b, 0x24, BLOCKS_PER_GROUP);
    put_u32(&mut b, 0x28, f.inodes_per_group);
    put_u32(&mut b, 0x2C, 0); // never mounted
    put_u32(&mut b, 0x30, t);
    put_u16(&mut b, 0x34, 0);
    put_u16(&mut b, 0x36, 0xFFFF); // max mount count -1: no forced fsck
    put_u16(&mut b, 0x38, 0xEF53);
    put_u16(&mut b, 0x3A, 1); // cleanly unmounted
    put_u16(&mut b, 0x3C, 1); // errors: continue
    put_u32(&mut b, 0x40, t); // last check
    put_u32(&mut b, 0x48, 0); // creator OS: Linux
    put_u32(&mut b, 0x4C, 1); // dynamic revision
    put_u32(&mut b, 0x54, FIRST_INO);
    put_u16(&mut b, 0x58, INODE_SIZE);
    put_u16(&mut b, 0x5A, f.group_nr);
    put_u32(&mut b, 0x5C, COMPAT_EXT_ATTR | COMPAT_DIR_INDEX);
    let mut incompat = INCOMPAT_FILETYPE | INCOMPAT_EXTENTS | INCOMPAT_FLEX_BG;
    if f.want_64bit {
        incompat |= INCOMPAT_64BIT;
    }
    put_u32(&mut b, 0x60, incompat);
    put_u32(
        &mut b,
        0x64,
        RO_COMPAT_SPARSE_SUPER
            | RO_COMPAT_LARGE_FILE
            | RO_COMPAT_HUGE_FILE
            | RO_COMPAT_DIR_NLINK
            | RO_COMPAT_EXTRA_ISIZE
            | RO_COMPAT_METADATA_CSUM,
    );
    b[0x68..0x78].copy_from_slice(&f.uuid);
    b[0xEC..0xFC].copy_from_slice(&f.hash_seed);
    put_u8(&mut b, 0xFC, super::htree::DX_HASH_HALF_MD4);
    put_u16(&mut b, 0xFE, if f.want_64bit { 64 } else { 32 });
    put_u32(&mut b, 0x100, 0x000C); // default mount options: user_xattr, acl (as mke2fs)
    put_u32(&mut b, 0x108, t); // mkfs time
    put_u32(&mut b, 0x150, (f.blocks_count >> 32) as u32);
    put_u32(&mut b, 0x158, (f.free_blocks >> 32) as u32);
    put_u16(&mut b, 0x15C, EXTRA_ISIZE);
    put_u16(&mut b, 0x15E, EXTRA_ISIZE);
    put_u32(&mut b, 0x160, 0x0001); // EXT2_FLAGS_SIGNED_HASH: name bytes hash as signed (htree.rs)
    put_u8(&mut b, 0x174, f.log_groups_per_flex);
    put_u8(&mut b, 0x175, 1); // checksum type: crc32c
                              // *_hi time bytes: wtime, mtime, mkfs_time, lastcheck.
    put_u8(&mut b, 0x27C, t_hi);
    put_u8(&mut b, 0x27E, t_hi);
    put_u8(&mut b, 0x27F, t_hi);
    let c = crc32c_raw(!0, &b[..0x3FC]);
    put_u32(&mut b, 0x3FC, c);
    b
}

/// Groups holding a backup superblock with sparse_super: 0, 1 and powers of 3, 5 and 7.
pub fn has_super(group: u64) -> bool {
    if group <= 1 {
        return true;
    }
    for base in [3u64, 5, 7] {
        let mut p = base;
        while p < group {
            p *= base;
        }
        if p == group {
            return true;
        }
    }
    false
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn backup_groups() {
        let v: Vec<u64> = (0..50).filter(|&g| has_super(g)).collect();
        assert_eq!(v, vec![0, 1, 3, 5, 7, 9, 25, 27, 49]);
    }
}
