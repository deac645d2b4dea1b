//! Inodes: 256 bytes each, 32 of them past the classic 128 (`i_extra_isize`), the rest free for
//! in-inode extended attributes.

use super::csum::crc32c_raw;
use super::le::{put_u16, put_u32};
use super::superblock::{EXTRA_ISIZE, INODE_SIZE};

pub const S_IFIFO: u16 = 0o010000;
pub const S_IFCHR: u16 = 0o020000;
pub const S_IFDIR: u16 = 0o040000;
pub const S_IFBLK: u16 = 0o060000;
pub const S_IFREG: u16 = 0o100000;
pub const S_IFLNK: u16 = 0o120000;
pub const S_IFSOCK: u16 = 0o140000;

pub const FL_INDEX: u32 = 0x0000_1000;
pub const FL_EXTENTS: u32 = 0x0008_0000;

/// The fixed fields of one inode.
#[derive(Debug, Clone)]
pub struct InodeFields {
    pub mode: u16,
    pub uid: u32,
    pub gid: u32,
    pub size: u64,
    pub links: u16,
    /// In 512-byte sectors.
    pub sectors: u64,
    pub flags: u32,
    pub i_block: [u8; 60],
    pub xattr_block: u64,
    pub time: u64,
}

impl Default for InodeFields {
    fn default() -> Self {
        InodeFields {
            mode: 0,
            uid: 0,
            gid: 0,
            size: 0,
            links: 0,
            sectors: 0,
            flags: 0,
            i_block: [0; 60],
            xattr_block: 0,
            time: 0,
        }
    }
}

/// Seconds → (32-bit field, `*_extra` field): the low two bits of `extra` extend the epoch
/// past 2038 as the kernel's ext4_encode_extra_time does; nanoseconds are zero.
fn encode_time(secs: u64) -> (u32, u32) {
    let s = secs as i64;
    let lo = s as i32;
    let extra = (((s - i64::from(lo)) >> 32) & 3) as u32;
    (lo as u32, extra)
}

/// Serializes an inode into `out` (256 bytes, already zeroed or holding in-inode xattrs past
/// byte 160) and sets its checksum.
pub fn write(out: &mut [u8], f: &InodeFields, ino: u32, fs_seed: u32) {
    let (t, t_extra) = encode_time(f.time);
    put_u16(out, 0x00, f.mode);
    put_u16(out, 0x02, f.uid as u16);
    put_u32(out, 0x04, f.size as u32);
    put_u32(out, 0x08, t); // atime
    put_u32(out, 0x0C, t); // ctime
    put_u32(out, 0x10, t); // mtime
    put_u32(out, 0x14, 0); // dtime
    put_u16(out, 0x18, f.gid as u16);
    put_u16(out, 0x1A, f.links);
    put_u32(out, 0x1C, f.sectors as u32);
    put_u32(out, 0x20, f.flags);
    out[0x28..0x64].copy_from_slice(&f.i_block);
    put_u32(out, 0x64, 0); // generation
    put_u32(out, 0x68, f.xattr_block as u32);
    put_u32(out, 0x6C, (f.size >> 32) as u32);
    put_u16(out, 0x74, (f.sectors >> 32) as u16);
    put_u16(out, 0x76, (f.xattr_block >> 32) as u16);
    put_u16(out, 0x78, (f.uid >> 16) as u16);
    put_u16(out, 0x7A, (f.gid >> 16) as u16);
    put_u16(out, 0x80, EXTRA_ISIZE);
    put_u32(out, 0x84, t_extra); // ctime_extra
    put_u32(out, 0x88, t_extra); // mtime_extra
    put_u32(out, 0x8C, t_extra); // atime_extra
    put_u32(out, 0x90, t); // crtime
    put_u32(out, 0x94, t_extra);
    seal(out, ino, fs_seed);
}

/// A reserved inode (1, 3..10): empty but with a valid checksum, as mke2fs leaves them.
pub fn write_reserved(out: &mut [u8], ino: u32, fs_seed: u32) {
    put_u16(out, 0x80, EXTRA_ISIZE);
    seal(out, ino, fs_seed);
}

/// Inode checksum: crc32c(fs seed, ino, generation, whole inode with both checksum halves 0).
fn seal(out: &mut [u8], ino: u32, fs_seed: u32) {
    let size = INODE_SIZE as usize;
    put_u16(out, 0x7C, 0);
    put_u16(out, 0x82, 0);
    let seed = super::csum::inode_seed(fs_seed, ino, 0);
    let c = crc32c_raw(seed, &out[..size]);
    put_u16(out, 0x7C, c as u16);
    put_u16(out, 0x82, (c >> 16) as u16);
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn times_past_2038_use_the_epoch_bits() {
        assert_eq!(encode_time(1_700_000_000), (1_700_000_000, 0));
        let (lo, extra) = encode_time(1u64 << 31);
        assert_eq!(lo, 1u32 << 31);
        assert_eq!(extra, 1);
        assert_eq!(encode_time(1u64 << 32), (0, 1));
    }
}
