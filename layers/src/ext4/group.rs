//! Block group descriptors (64 bytes with the 64bit feature, 32 without) and bitmap checksums.

use super::csum::crc32c_raw;
use super::le::{put_u16, put_u32};

/// `bg_flags`: the inode table is zeroed (we write every table in full).
const BG_INODE_ZEROED: u16 = 0x0004;

#[derive(Debug, Clone, Default)]
pub struct GroupDesc {
    pub block_bitmap: u64,
    pub inode_bitmap: u64,
    pub inode_table: u64,
    pub free_blocks: u32,
    pub free_inodes: u32,
    pub used_dirs: u32,
    pub itable_unused: u32,
    pub block_bitmap_csum: u32,
    pub inode_bitmap_csum: u32,
}

/// Serializes descriptor `group` into `out` (`desc_size` bytes) with its checksum:
/// crc32c(fs seed, le32 group, descriptor with bg_checksum zeroed) & 0xFFFF.
pub fn write(out: &mut [u8], d: &GroupDesc, group: u32, fs_seed: u32, desc_size: usize) {
    let b = &mut out[..desc_size];
    b.fill(0);
    put_u32(b, 0x00, d.block_bitmap as u32);
    put_u32(b, 0x04, d.inode_bitmap as u32);
    put_u32(b, 0x08, d.inode_table as u32);
    put_u16(b, 0x0C, d.free_blocks as u16);
    put_u16(b, 0x0E, d.free_inodes as u16);
    put_u16(b, 0x10, d.used_dirs as u16);
    put_u16(b, 0x12, BG_INODE_ZEROED);
    put_u16(b, 0x18, d.block_bitmap_csum as u16);
    put_u16(b, 0x1A, d.inode_bitmap_csum as u16);
    put_u16(b, 0x1C, d.itable_unused as u16);
    if desc_size >= 64 {
        put_u32(b, 0x20, (d.block_bitmap >> 32) as u32);
        put_u32(b, 0x24, (d.inode_bitmap >> 32) as u32);
        put_u32(b, 0x28, (d.inode_table >> 32) as u32);
        put_u16(b, 0x2C, (d.free_blocks >> 16) as u16);
        put_u16(b, 0x2E, (d.free_inodes >> 16) as u16);
        put_u16(b, 0x30, (d.used_dirs >> 16) as u16);
        put_u16(b, 0x32, (d.itable_unused >> 16) as u16);
        put_u16(b, 0x38, (d.block_bitmap_csum >> 16) as u16);
        put_u16(b, 0x3A, (d.inode_bitmap_csum >> 16) as u16);
    }
    let c = crc32c_raw(crc32c_raw(fs_seed, &group.to_le_bytes()), b);
    put_u16(b, 0x1E, (c & 0xFFFF) as u16);
}

/// A bitmap's checksum: crc32c(fs seed, the bitmap's meaningful bytes).
pub fn bitmap_csum(fs_seed: u32, bitmap: &[u8]) -> u32 {
    crc32c_raw(fs_seed, bitmap)
}
