//! Directory blocks: linear blocks of `ext4_dir_entry_2` records, and hashed (htree) directories
//! whose first block is a `dx_root` index over leaf blocks sorted by name hash.
//!
//! With metadata_csum every leaf block ends in a 12-byte fake entry (inode 0, rec_len 12,
//! name_len 0, file_type 0xDE) holding the crc32c of the block; index blocks end in a `dx_tail`
//! (reserved word + crc32c) placed right after the `limit` index slots.

use super::csum::crc32c_raw;
use super::htree::{half_md4_hash, DX_HASH_HALF_MD4};
use super::le::{put_u16, put_u32, put_u8};
use super::BLOCK_SIZE;
use crate::error::LayerError;

/// One name in a directory.
#[derive(Debug, Clone)]
pub struct Entry<'a> {
    pub name: &'a [u8],
    pub ino: u32,
    pub file_type: u8,
}

const TAIL: usize = 12;
/// Usable bytes in a leaf block.
const LEAF_SPACE: usize = BLOCK_SIZE - TAIL;
/// Index slots in the root block: (4096 - 32 header - 8 dx_tail) / 8.
const ROOT_LIMIT: usize = (BLOCK_SIZE - 32 - 8) / 8;
/// Index slots in an interior index block: (4096 - 8 fake dirent - 8 dx_tail) / 8.
const NODE_LIMIT: usize = (BLOCK_SIZE - 8 - 8) / 8;

pub const FT_DIR: u8 = 2;

fn rec_len(name_len: usize) -> usize {
    (8 + name_len + 3) & !3
}

fn put_entry(b: &mut [u8], off: usize, ino: u32, rec: usize, name: &[u8], ft: u8) {
    put_u32(b, off, ino);
    put_u16(b, off + 4, rec as u16);
    put_u8(b, off + 6, name.len() as u8);
    put_u8(b, off + 7, ft);
    b[off + 8..off + 8 + name.len()].copy_from_slice(name);
}

/// Packs entries into leaf blocks in the given order, starting a block whenever `split_before(i)`
/// says so or the next entry would not fit. Returns the blocks (tails not yet sealed) and the
/// index of each block's first entry.
fn pack<'a>(
    entries: &[Entry<'a>],
    mut split_before: impl FnMut(usize) -> bool,
) -> (Vec<Vec<u8>>, Vec<usize>) {
    let mut blocks: Vec<Vec<u8>> = Vec::new();
    let mut firsts = Vec::new();
    let mut cur = vec![0u8; BLOCK_SIZE];
    let mut used = 0usize;
    let mut last_off: Option<usize> = None;
    let finish = |cur: &mut Vec<u8>, used: usize, last_off: Option<usize>| {
        if let Some(lo) = last_off {
            put_u16(cur, lo + 4, (LEAF_SPACE - lo) as u16);
        }
        debug_assert!(used <= LEAF_SPACE);
        std::mem::replace(cur, vec![0u8; BLOCK_SIZE])
    };
    for (i, e) in entries.iter().enumerate() {
        let r = rec_len(e.name.len());
        if last_off.is_some() && (used + r > LEAF_SPACE || split_before(i)) {
            blocks.push(finish(&mut cur, used, last_off));
            used = 0;
            last_off = None;
        }
        if last_off.is_none() {
            firsts.push(i);
        }
        put_entry(&mut cur, used, e.ino, r, e.name, e.file_type);
        last_off = Some(used);
        used += r;
    }
    if last_off.is_some() {
        blocks.push(finish(&mut cur, used, last_off));
    }
    (blocks, firsts)
}

/// Writes the checksum tail of a leaf block.
fn seal_leaf(b: &mut [u8], seed: u32) {
    let t = LEAF_SPACE;
    put_u32(b, t, 0);
    put_u16(b, t + 4, TAIL as u16);
    put_u8(b, t + 6, 0);
    put_u8(b, t + 7, 0xDE);
    let c = crc32c_raw(seed, &b[..t]);
    put_u32(b, t + 8, c);
}

/// Seals an index block whose count/limit field is at `cl` (dx_tail follows `limit` slots).
fn seal_dx(b: &mut [u8], cl: usize, seed: u32) {
    let limit = u16::from_le_bytes([b[cl], b[cl + 1]]) as usize;
    let count = u16::from_le_bytes([b[cl + 2], b[cl + 3]]) as usize;
    let tail = cl + limit * 8;
    put_u32(b, tail, 0);
    put_u32(b, tail + 4, 0);
    let mut c = crc32c_raw(seed, &b[..cl + count * 8]);
    c = crc32c_raw(c, &b[tail..tail + 8]);
    put_u32(b, tail + 4, c);
}

/// A directory's blocks in logical order and whether it is hashed (`EXT4_INDEX_FL`).
pub struct DirBlocks {
    pub blocks: Vec<Vec<u8>>,
    pub indexed: bool,
}

/// Builds a directory. `entries` are the children sorted by name (no `.`/`..`); `seed` is the
/// directory inode's checksum seed; `hash_seed` the superblock's `s_hash_seed`.
pub fn build(
    path: &[u8],
    ino: u32,
    parent: u32,
    entries: &[Entry<'_>],
    seed: u32,
    hash_seed: &[u32; 4],
) -> Result<DirBlocks, LayerError> {
    let linear_bytes: usize = 24 + entries.iter().map(|e| rec_len(e.name.len())).sum::<usize>();
    if linear_bytes <= LEAF_SPACE {
        return Ok(DirBlocks {
            blocks: linear(ino, parent, entries, seed),
            indexed: false,
        });
    }
    let (leaves, keys) = hashed_leaves(entries, seed, hash_seed);
    let n = leaves.len();
    let levels = if n <= ROOT_LIMIT {
        0
    } else if n <= ROOT_LIMIT * NODE_LIMIT {
        1
    } else {
        return Err(LayerError::TooLarge(format!(
            "directory {:?} needs {n} leaf blocks; without large_dir an htree holds at most {}",
            crate::error::show(path),
            ROOT_LIMIT * NODE_LIMIT
        )));
    };
    let mut blocks = index_blocks(ino, parent, &keys, levels, seed);
    blocks.extend(leaves);
    Ok(DirBlocks {
        blocks,
        indexed: true,
    })
}

/// A linear directory: `.`, `..` and the entries, packed into sealed leaf blocks.
fn linear(ino: u32, parent: u32, entries: &[Entry<'_>], seed: u32) -> Vec<Vec<u8>> {
    let dot = [
        Entry {
            name: b".",
            ino,
            file_type: FT_DIR,
        },
        Entry {
            name: b"..",
            ino: parent,
            file_type: FT_DIR,
        },
    ];
    let all: Vec<Entry<'_>> = dot.iter().cloned().chain(entries.iter().cloned()).collect();
    let (mut blocks, _) = pack(&all, |_| false);
    for b in &mut blocks {
        seal_leaf(b, seed);
    }
    blocks
}

/// A hashed directory's sealed leaves, entries sorted by (hash, name), and each leaf's index
/// key: the hash of its first entry, with the low bit set when that hash continues from the
/// previous leaf (a collision run split across blocks).
fn hashed_leaves(
    entries: &[Entry<'_>],
    seed: u32,
    hash_seed: &[u32; 4],
) -> (Vec<Vec<u8>>, Vec<u32>) {
    let mut hashed: Vec<(u32, Entry<'_>)> = entries
        .iter()
        .map(|e| (half_md4_hash(e.name, hash_seed), e.clone()))
        .collect();
    hashed.sort_by(|a, b| (a.0, a.1.name).cmp(&(b.0, b.1.name)));
    let sorted: Vec<Entry<'_>> = hashed.iter().map(|h| h.1.clone()).collect();
    let (mut leaves, firsts) = pack(&sorted, |_| false);
    for b in &mut leaves {
        seal_leaf(b, seed);
    }
    let keys: Vec<u32> = firsts
        .iter()
        .map(|&i| {
            let h = hashed[i].0;
            if i > 0 && hashed[i - 1].0 == h {
                h | 1
            } else {
                h
            }
        })
        .collect();
    (leaves, keys)
}

/// The index blocks of a hashed directory whose leaves have `keys`: the root (logical block 0)
/// then, with `levels` = 1, the index nodes; the leaves follow them.
fn index_blocks(ino: u32, parent: u32, keys: &[u32], levels: usize, seed: u32) -> Vec<Vec<u8>> {
    let n = keys.len();
    let node_count = if levels == 1 {
        n.div_ceil(NODE_LIMIT)
    } else {
        0
    };
    let first_leaf = 1 + node_count;
    let mut root = vec![0u8; BLOCK_SIZE];
    put_entry(&mut root, 0, ino, 12, b".", FT_DIR);
    put_entry(&mut root, 12, parent, BLOCK_SIZE - 12, b"..", FT_DIR);
    // dx_root_info: reserved_zero, hash_version, info_length, indirect_levels, unused_flags.
    put_u32(&mut root, 24, 0);
    put_u8(&mut root, 28, DX_HASH_HALF_MD4);
    put_u8(&mut root, 29, 8);
    put_u8(&mut root, 30, levels as u8);
    put_u8(&mut root, 31, 0);

    let leaf_items: Vec<(u32, usize)> = keys
        .iter()
        .enumerate()
        .map(|(i, &k)| (k, first_leaf + i))
        .collect();
    let mut blocks = Vec::with_capacity(1 + node_count + n);
    if levels == 0 {
        write_index(&mut root, 32, ROOT_LIMIT, &leaf_items);
        seal_dx(&mut root, 32, seed);
        blocks.push(root);
    } else {
        let mut nodes = Vec::new();
        let mut root_items = Vec::new();
        for (j, chunk) in leaf_items.chunks(NODE_LIMIT).enumerate() {
            let mut b = vec![0u8; BLOCK_SIZE];
            // A fake empty dirent covering the whole block hides the index from old readers.
            put_u32(&mut b, 0, 0);
            put_u16(&mut b, 4, BLOCK_SIZE as u16);
            write_index(&mut b, 8, NODE_LIMIT, chunk);
            seal_dx(&mut b, 8, seed);
            nodes.push(b);
            root_items.push((chunk[0].0, 1 + j));
        }
        write_index(&mut root, 32, ROOT_LIMIT, &root_items);
        seal_dx(&mut root, 32, seed);
        blocks.push(root);
        blocks.extend(nodes);
    }
    blocks
}

/// Writes a count/limit header at `cl` and the (hash key, block) entries after it; the first
/// entry's key slot is the count/limit header itself.
fn write_index(b: &mut [u8], cl: usize, limit: usize, items: &[(u32, usize)]) {
    put_u16(b, cl, limit as u16);
    put_u16(b, cl + 2, items.len() as u16);
    for (i, &(key, blk)) in items.iter().enumerate() {
        if i > 0 {
            put_u32(b, cl + i * 8, key);
        }
        put_u32(b, cl + i * 8 + 4, blk as u32);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn small_directory_is_one_linear_block() {
        let e = [Entry {
            name: b"a",
            ino: 12,
            file_type: 1,
        }];
        let d = build(b"d", 11, 2, &e, 0, &[0; 4]).unwrap();
        assert!(!d.indexed);
        assert_eq!(d.blocks.len(), 1);
        let b = &d.blocks[0];
        assert_eq!(u16::from_le_bytes([b[4], b[5]]), 12);
        // "a" is last: its rec_len runs to the tail.
        assert_eq!(u16::from_le_bytes([b[28], b[29]]) as usize, LEAF_SPACE - 24);
        assert_eq!(b[BLOCK_SIZE - 5], 0xDE);
    }

    #[test]
    fn large_directory_is_hashed_with_every_leaf_indexed() {
        let names: Vec<Vec<u8>> = (0..5000)
            .map(|i| format!("file-{i:05}").into_bytes())
            .collect();
        let e: Vec<Entry<'_>> = names
            .iter()
            .enumerate()
            .map(|(i, n)| Entry {
                name: n,
                ino: 20 + i as u32,
                file_type: 1,
            })
            .collect();
        let d = build(b"d", 11, 2, &e, 0, &[1, 2, 3, 4]).unwrap();
        assert!(d.indexed);
        let count = u16::from_le_bytes([d.blocks[0][34], d.blocks[0][35]]) as usize;
        assert_eq!(count, d.blocks.len() - 1);
    }
}
