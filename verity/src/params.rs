//! veritysetup's parameters, their validation, and the tree geometry they imply.
//!
//! The geometry follows cryptsetup's `lib/verity/verity_hash.c` and the kernel's `verity_ctr()`:
//! digests per hash block are rounded down to a power of two, level sizes are computed directly
//! from the data block count, and levels are stored top first.

use crate::error::ParamError;
use crate::hash::{HashAlgorithm, HashType};

/// Smallest block size veritysetup accepts.
pub const MIN_BLOCK_SIZE: u32 = 512;
/// Largest block size veritysetup accepts (`VERITY_BLOCK_SIZE_OK`). The kernel only activates
/// data blocks up to the page size.
pub const MAX_BLOCK_SIZE: u32 = 512 * 1024;
/// Largest salt the superblock can hold.
pub const MAX_SALT_SIZE: usize = 256;

/// The size of the verity superblock at the start of a hash device (when it has one): the
/// tree starts at the next hash block.
pub const SUPERBLOCK_SIZE: usize = 512;

/// Everything that determines a hash tree and where it sits on the hash device.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct VerityParams {
    pub hash_type: HashType,
    pub algorithm: HashAlgorithm,
    pub data_block_size: u32,
    pub hash_block_size: u32,
    /// Number of data blocks covered by the tree.
    pub data_blocks: u64,
    /// 0 to 256 bytes. veritysetup's default is 32 random bytes: callers choose.
    pub salt: Vec<u8>,
    /// Superblock UUID (raw RFC 4122 bytes); `None` writes the nil UUID.
    pub uuid: Option<[u8; 16]>,
    /// Byte offset of the superblock (or, without one, of the tree) on the hash device.
    pub hash_offset: u64,
    /// Write and expect the 512-byte superblock at `hash_offset`.
    pub superblock: bool,
}

impl Default for VerityParams {
    /// veritysetup's defaults, except the salt (empty) and UUID (none): those are random there.
    fn default() -> Self {
        VerityParams {
            hash_type: HashType::Normal,
            algorithm: HashAlgorithm::Sha256,
            data_block_size: 4096,
            hash_block_size: 4096,
            data_blocks: 0,
            salt: Vec::new(),
            uuid: None,
            hash_offset: 0,
            superblock: true,
        }
    }
}

/// True for a block size veritysetup accepts (`VERITY_BLOCK_SIZE_OK`).
pub(crate) fn block_size_ok(size: u64) -> bool {
    size >= MIN_BLOCK_SIZE as u64 && size <= MAX_BLOCK_SIZE as u64 && size.is_power_of_two()
}

impl VerityParams {
    /// Checks every rule veritysetup applies before it formats or loads a device.
    pub fn validate(&self) -> Result<(), ParamError> {
        if !block_size_ok(self.data_block_size as u64) {
            return Err(ParamError::BlockSize {
                which: "data",
                size: self.data_block_size as u64,
            });
        }
        if !block_size_ok(self.hash_block_size as u64) {
            return Err(ParamError::BlockSize {
                which: "hash",
                size: self.hash_block_size as u64,
            });
        }
        if self.salt.len() > MAX_SALT_SIZE {
            return Err(ParamError::SaltTooLong(self.salt.len()));
        }
        if self.hash_offset % 512 != 0 {
            return Err(ParamError::HashOffsetMisaligned(self.hash_offset));
        }
        if self.data_blocks == 0 {
            return Err(ParamError::NoDataBlocks);
        }
        let digest_size = self.algorithm.digest_size();
        // The kernel refuses "Digest size too big"; veritysetup's sizes never reach it, but a
        // 512-byte hash block with a future 512-bit-plus digest would.
        if (self.hash_block_size as usize) < 2 * digest_size {
            return Err(ParamError::DigestTooBig {
                algorithm: self.algorithm.name(),
                hash_block_size: self.hash_block_size,
                digest_size,
            });
        }
        self.data_blocks
            .checked_mul(self.data_block_size as u64)
            .ok_or(ParamError::Overflow)?;
        Ok(())
    }

    /// Validates the parameters and computes the tree's shape.
    pub fn geometry(&self) -> Result<Geometry, ParamError> {
        self.validate()?;
        Geometry::compute(self)
    }
}

/// The shape of a tree: levels, their sizes and positions on the hash device.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Geometry {
    pub digest_size: usize,
    /// Bytes one digest occupies in a hash block (v1: the next power of two; v0: the digest size).
    pub slot_size: usize,
    pub hash_per_block_bits: u32,
    /// Number of hash levels; 0 when there is a single data block (the root hashes it directly).
    pub levels: usize,
    /// Blocks per level, index 0 = the leaves (hashes of data blocks).
    pub level_blocks: Vec<u64>,
    /// First block of each level on the hash device, in hash-block units (index 0 = leaves).
    pub level_start: Vec<u64>,
    /// First tree block on the hash device, in hash-block units (the kernel's `hash_start_block`).
    pub hash_start_block: u64,
    /// Tree blocks in all (veritysetup's "Hash blocks").
    pub hash_blocks: u64,
    /// Bytes the hash device needs from `hash_offset` on (veritysetup's "Hash device size").
    pub hash_device_size: u64,
    pub hash_block_size: u32,
}

impl Geometry {
    fn compute(p: &VerityParams) -> Result<Geometry, ParamError> {
        let hbs = p.hash_block_size as u64;
        let digest_size = p.algorithm.digest_size();
        // floor(log2(hbs / digest_size)): the count is rounded down to a power of two.
        let hash_per_block_bits = (hbs / digest_size as u64).ilog2();
        let slot_size = match p.hash_type {
            HashType::Normal => (hbs >> hash_per_block_bits) as usize,
            HashType::ChromeOs => digest_size,
        };
        let n = p.data_blocks;

        let mut levels = 0usize;
        while (hash_per_block_bits as usize) * levels < 64
            && ((n - 1) >> (hash_per_block_bits as usize * levels)) != 0
        {
            levels += 1;
        }
        if levels > 63 {
            return Err(ParamError::TooManyLevels(n));
        }

        let hash_start_block = if p.superblock {
            (p.hash_offset + SUPERBLOCK_SIZE as u64).div_ceil(hbs)
        } else {
            p.hash_offset / hbs
        };

        // ceil(n / 2^((i+1)*bits)), straight from n: the iterative form had an off-by-one that
        // the kernel and cryptsetup both fixed (16385 blocks is the classic case).
        let level_blocks: Vec<u64> = (0..levels)
            .map(|i| {
                let shift = (i as u32 + 1) * hash_per_block_bits;
                if shift >= 64 {
                    1
                } else {
                    n.div_ceil(1u64 << shift)
                }
            })
            .collect();

        let mut level_start = vec![0u64; levels];
        let mut pos = hash_start_block;
        for i in (0..levels).rev() {
            level_start[i] = pos;
            pos = pos
                .checked_add(level_blocks[i])
                .ok_or(ParamError::Overflow)?;
        }
        let hash_blocks = pos - hash_start_block;
        let hash_device_size = pos
            .checked_mul(hbs)
            .ok_or(ParamError::Overflow)?
            .checked_sub(p.hash_offset)
            .ok_or(ParamError::Overflow)?;
        p.hash_offset
            .checked_add(hash_device_size)
            .ok_or(ParamError::Overflow)?;

        Ok(Geometry {
            digest_size,
            slot_size,
            hash_per_block_bits,
            levels,
            level_blocks,
            level_start,
            hash_start_block,
            hash_blocks,
            hash_device_size,
            hash_block_size: p.hash_block_size,
        })
    }

    /// Digests per hash block (a power of two).
    pub fn hash_per_block(&self) -> u64 {
        1u64 << self.hash_per_block_bits
    }

    /// Byte offset of level `i` inside the tree (the bytes from `hash_start_block` on).
    pub fn level_offset_in_tree(&self, level: usize) -> usize {
        ((self.level_start[level] - self.hash_start_block) * self.hash_block_size as u64) as usize
    }

    /// Size of the tree in bytes (all levels, without superblock or gap).
    pub fn tree_size(&self) -> u64 {
        self.hash_blocks * self.hash_block_size as u64
    }

    /// Byte offset of the tree on the hash device.
    pub fn tree_offset(&self) -> u64 {
        self.hash_start_block * self.hash_block_size as u64
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn params(n: u64) -> VerityParams {
        VerityParams {
            data_blocks: n,
            ..VerityParams::default()
        }
    }

    #[test]
    fn one_gib_has_three_levels() {
        let g = params(262_144).geometry().unwrap();
        assert_eq!(g.level_blocks, vec![2048, 16, 1]);
        assert_eq!(g.hash_blocks, 2065);
        assert_eq!(g.hash_device_size, 2066 * 4096);
    }

    #[test]
    fn sixteen_k_plus_one_blocks() {
        // The historic off-by-one case.
        let g = params(16385).geometry().unwrap();
        assert_eq!(g.level_blocks, vec![129, 2, 1]);
        assert_eq!(g.hash_device_size, 544_768);
    }

    #[test]
    fn single_block_has_no_tree() {
        let g = params(1).geometry().unwrap();
        assert_eq!(g.levels, 0);
        assert_eq!(g.hash_blocks, 0);
        assert_eq!(g.hash_device_size, 4096);
    }

    #[test]
    fn sha1_uses_power_of_two_slots() {
        let mut p = params(129);
        p.algorithm = HashAlgorithm::Sha1;
        let g = p.geometry().unwrap();
        assert_eq!(g.hash_per_block(), 128);
        assert_eq!(g.slot_size, 32);
        p.hash_type = HashType::ChromeOs;
        assert_eq!(p.geometry().unwrap().slot_size, 20);
    }

    #[test]
    fn hash_start_with_offsets() {
        let mut p = params(129);
        p.hash_offset = 1536;
        assert_eq!(p.geometry().unwrap().hash_start_block, 1);
        p.superblock = false;
        p.hash_offset = 8192;
        assert_eq!(p.geometry().unwrap().hash_start_block, 2);
    }

    #[test]
    fn rejects_bad_parameters() {
        let mut p = params(1);
        p.data_block_size = 3000;
        assert!(matches!(
            p.validate(),
            Err(ParamError::BlockSize { which: "data", .. })
        ));
        let mut p = params(1);
        p.hash_block_size = 256;
        assert!(matches!(
            p.validate(),
            Err(ParamError::BlockSize { which: "hash", .. })
        ));
        let mut p = params(1);
        p.salt = vec![0; 257];
        assert_eq!(p.validate(), Err(ParamError::SaltTooLong(257)));
        let mut p = params(1);
        p.hash_offset = 100;
        assert_eq!(p.validate(), Err(ParamError::HashOffsetMisaligned(100)));
        assert_eq!(params(0).validate(), Err(ParamError::NoDataBlocks));
        let mut p = params(u64::MAX);
        p.data_block_size = 1 << 19;
        assert_eq!(p.validate(), Err(ParamError::Overflow));
    }
}
