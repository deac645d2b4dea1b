//! Extent trees (`EXT4_EXTENTS_FL`): the map from a file's logical blocks to disk blocks.
//!
//! Up to four extents fit in the inode's `i_block`; more need tree blocks of 340 entries each,
//! every one ending in a crc32c tail keyed to the owning inode.

use super::csum::crc32c_raw;
use super::le::{put_u16, put_u32};
use super::BLOCK_SIZE;

const EXT_MAGIC: u16 = 0xF30A;
/// The longest initialized extent (the top bit of `ee_len` marks unwritten extents).
pub const MAX_EXTENT_LEN: u64 = 32768;
/// Entries in the inode's `i_block` (60 bytes: 12-byte header + 4 × 12).
pub const ROOT_ENTRIES: usize = 4;
/// Entries in a tree block: (4096 - 12 header - 4 tail) / 12.
pub const BLOCK_ENTRIES: usize = (BLOCK_SIZE - 12 - 4) / 12;

/// One extent: `len` blocks of the file from `logical` live at `physical`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Extent {
    pub logical: u32,
    pub physical: u64,
    pub len: u16,
}

/// How many tree blocks a file with `n` extents needs (0 when they fit in the inode).
pub fn tree_blocks(n: usize) -> usize {
    let mut total = 0;
    let mut level = n;
    while level > ROOT_ENTRIES {
        let blocks = level.div_ceil(BLOCK_ENTRIES);
        total += blocks;
        level = blocks;
    }
    total
}

fn header(buf: &mut [u8], entries: usize, max: usize, depth: u16) {
    put_u16(buf, 0, EXT_MAGIC);
    put_u16(buf, 2, entries as u16);
    put_u16(buf, 4, max as u16);
    put_u16(buf, 6, depth);
    put_u32(buf, 8, 0);
}

fn leaf_entry(buf: &mut [u8], e: &Extent) {
    put_u32(buf, 0, e.logical);
    put_u16(buf, 4, e.len);
    put_u16(buf, 6, (e.physical >> 32) as u16);
    put_u32(buf, 8, e.physical as u32);
}

fn index_entry(buf: &mut [u8], logical: u32, child: u64) {
    put_u32(buf, 0, logical);
    put_u32(buf, 4, child as u32);
    put_u16(buf, 8, (child >> 32) as u16);
    put_u16(buf, 10, 0);
}

/// Builds the extent tree: fills `i_block` (60 bytes) and returns the tree blocks, each paired
/// with the disk block it must be written to (taken in order from `tree_block_nums`, whose length
/// must be `tree_blocks(extents.len())`). `seed` is the owning inode's checksum seed.
pub fn build(
    extents: &[Extent],
    tree_block_nums: &[u64],
    seed: u32,
    i_block: &mut [u8; 60],
) -> Vec<(u64, Vec<u8>)> {
    assert_eq!(tree_block_nums.len(), tree_blocks(extents.len()));
    let mut out = Vec::new();
    if extents.len() <= ROOT_ENTRIES {
        header(i_block, extents.len(), ROOT_ENTRIES, 0);
        for (i, e) in extents.iter().enumerate() {
            leaf_entry(&mut i_block[12 + i * 12..], e);
        }
        return out;
    }
    let mut nums = tree_block_nums.iter().copied();
    // Level entries as (first logical block, child block) once we move above the leaves.
    let mut level: Vec<(u32, u64)> = Vec::new();
    for chunk in extents.chunks(BLOCK_ENTRIES) {
        let blk = nums.next().expect("counted by tree_blocks");
        let mut b = vec![0u8; BLOCK_SIZE];
        header(&mut b, chunk.len(), BLOCK_ENTRIES, 0);
        for (i, e) in chunk.iter().enumerate() {
            leaf_entry(&mut b[12 + i * 12..], e);
        }
        seal(&mut b, seed);
        level.push((chunk[0].logical, blk));
        out.push((blk, b));
    }
    let mut depth = 1u16;
    while level.len() > ROOT_ENTRIES {
        let mut next = Vec::new();
        for chunk in level.chunks(BLOCK_ENTRIES) {
            let blk = nums.next().expect("counted by tree_blocks");
            let mut b = vec![0u8; BLOCK_SIZE];
            header(&mut b, chunk.len(), BLOCK_ENTRIES, depth);
            for (i, &(logical, child)) in chunk.iter().enumerate() {
                index_entry(&mut b[12 + i * 12..], logical, child);
            }
            seal(&mut b, seed);
            next.push((chunk[0].0, blk));
            out.push((blk, b));
        }
        level = next;
        depth += 1;
    }
    header(i_block, level.len(), ROOT_ENTRIES, depth);
    for (i, &(logical, child)) in level.iter().enumerate() {
        index_entry(&mut i_block[12 + i * 12..], logical, child);
    }
    out
}

/// The extent block tail: crc32c over the header and all `eh_max` slots.
fn seal(b: &mut [u8], seed: u32) {
    let end = 12 + BLOCK_ENTRIES * 12;
    let c = crc32c_raw(seed, &b[..end]);
    put_u32(b, end, c);
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn tree_sizes() {
        assert_eq!(tree_blocks(0), 0);
        assert_eq!(tree_blocks(4), 0);
        assert_eq!(tree_blocks(5), 1);
        assert_eq!(tree_blocks(340 * 4), 4);
        assert_eq!(tree_blocks(340 * 4 + 1), 5 + 1);
    }

    #[test]
    fn deep_tree_has_one_root_and_all_blocks_used() {
        let n = 340 * 5;
        let ext: Vec<Extent> = (0..n)
            .map(|i| Extent {
                logical: i as u32 * 2,
                physical: 1000 + i as u64 * 2,
                len: 1,
            })
            .collect();
        let nums: Vec<u64> = (0..tree_blocks(n) as u64).map(|i| 10 + i).collect();
        let mut ib = [0u8; 60];
        let blocks = build(&ext, &nums, 1, &mut ib);
        assert_eq!(blocks.len(), nums.len());
        assert_eq!(u16::from_le_bytes([ib[6], ib[7]]), 2, "depth");
        assert_eq!(u16::from_le_bytes([ib[2], ib[3]]), 1, "root entries");
    }
}
