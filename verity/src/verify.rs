//! Checking data against a tree whose root hash is trusted.
//!
//! [`Verifier::new`] checks every hash block top-down against the root once (about 0.8% of the
//! data's size for sha256 with 4 KiB blocks). After that each data block needs only its own hash
//! and a compare with its leaf, so a writer can check blocks as they stream past, in any order.

use digest::Digest;
use rayon::prelude::*;

use crate::error::VerifyError;
use crate::hash::{is_zero, with_digest, SaltedHasher};
use crate::params::{Geometry, VerityParams};
use crate::root_hash::RootHash;

/// A hash tree checked against its root hash, ready to check data blocks.
#[derive(Debug, Clone)]
pub struct Verifier {
    params: VerityParams,
    geometry: Geometry,
    root_hash: RootHash,
    /// The tree from `hash_start_block` on, top level first.
    tree: Vec<u8>,
}

impl Verifier {
    /// Checks `tree` (the tree bytes only, as [`crate::Tree::blocks`]) against `root_hash`.
    /// Fails on the first hash block (top-down) that does not match its parent.
    pub fn new(
        params: &VerityParams,
        tree: Vec<u8>,
        root_hash: &RootHash,
    ) -> Result<Verifier, crate::VerityError> {
        let geometry = params.geometry()?;
        let ds = geometry.digest_size;
        if root_hash.len() != ds {
            return Err(VerifyError::RootHashLength {
                algorithm: params.algorithm.name(),
                expected: ds,
                actual: root_hash.len(),
            }
            .into());
        }
        if tree.len() as u64 != geometry.tree_size() {
            return Err(VerifyError::TreeLength {
                expected: geometry.tree_size(),
                actual: tree.len() as u64,
            }
            .into());
        }
        let v = Verifier {
            params: params.clone(),
            geometry,
            root_hash: root_hash.clone(),
            tree,
        };
        with_digest!(params.algorithm, D => v.check_tree::<D>())?;
        Ok(v)
    }

    /// Same as [`Verifier::new`], taking the hash device's bytes from `hash_offset` on.
    pub fn from_hash_device(
        params: &VerityParams,
        hash_device: &[u8],
        root_hash: &RootHash,
    ) -> Result<Verifier, crate::VerityError> {
        let g = params.geometry()?;
        let start = (g.tree_offset() - params.hash_offset) as usize;
        let end = start + g.tree_size() as usize;
        if hash_device.len() < end {
            return Err(VerifyError::TreeLength {
                expected: end as u64,
                actual: hash_device.len() as u64,
            }
            .into());
        }
        Verifier::new(params, hash_device[start..end].to_vec(), root_hash)
    }

    pub fn params(&self) -> &VerityParams {
        &self.params
    }

    pub fn geometry(&self) -> &Geometry {
        &self.geometry
    }

    pub fn root_hash(&self) -> &RootHash {
        &self.root_hash
    }

    /// The expected digest of data block `block` (the root hash when there is one block).
    pub fn leaf(&self, block: u64) -> &[u8] {
        let g = &self.geometry;
        if g.levels == 0 {
            return self.root_hash.as_bytes();
        }
        let per_bits = g.hash_per_block_bits;
        let hbs = g.hash_block_size as usize;
        let block_in_level = (block >> per_bits) as usize;
        let idx = (block & ((1 << per_bits) - 1)) as usize;
        let off = g.level_offset_in_tree(0) + block_in_level * hbs + idx * g.slot_size;
        &self.tree[off..off + g.digest_size]
    }

    /// Checks one data block (exactly `data_block_size` bytes).
    pub fn verify_block(&self, block: u64, data: &[u8]) -> Result<(), VerifyError> {
        self.verify_blocks(block, data)
    }

    /// Checks consecutive data blocks starting at `first_block`, in parallel; `data` must be a
    /// whole number of data blocks inside the device. Names the lowest bad block.
    pub fn verify_blocks(&self, first_block: u64, data: &[u8]) -> Result<(), VerifyError> {
        let dbs = self.params.data_block_size as usize;
        let count = (data.len() / dbs) as u64;
        let end = first_block.saturating_add(count);
        if data.len() % dbs != 0 || end > self.params.data_blocks {
            return Err(VerifyError::Range {
                first: first_block,
                end,
                data_blocks: self.params.data_blocks,
            });
        }
        with_digest!(self.params.algorithm, D => self.check_data::<D>(first_block, data))
    }

    /// How many data blocks the tree says are all zeros (their leaf is the digest of a zero
    /// block). Lets a writer decide up front whether skipping zero blocks is worth zeroing the
    /// target first.
    pub fn zero_blocks(&self) -> u64 {
        with_digest!(self.params.algorithm, D => self.count_zero_blocks::<D>())
    }

    fn count_zero_blocks<D: Digest + Clone + Send + Sync + 'static>(&self) -> u64 {
        let hasher = SaltedHasher::<D>::new(self.params.hash_type, &self.params.salt);
        let zero = hasher.hash(&vec![0u8; self.params.data_block_size as usize]);
        (0..self.params.data_blocks)
            .into_par_iter()
            .filter(|&b| *self.leaf(b) == *zero)
            .count() as u64
    }

    fn check_data<D: Digest + Clone + Send + Sync + 'static>(
        &self,
        first_block: u64,
        data: &[u8],
    ) -> Result<(), VerifyError> {
        let hasher = SaltedHasher::<D>::new(self.params.hash_type, &self.params.salt);
        let dbs = self.params.data_block_size as usize;
        // Sparse images are mostly zeros: hash the zero block once.
        let zero_digest = hasher.hash(&vec![0u8; dbs]);
        let ds = self.geometry.digest_size;
        // Pairs of blocks, so the two-way hasher can take them together.
        let bad = data
            .par_chunks(2 * dbs)
            .enumerate()
            .with_min_len(32)
            .filter_map(|(i, pair)| {
                let b = first_block + 2 * i as u64;
                let (mut da, mut db) = ([0u8; 64], [0u8; 64]);
                if pair.len() == 2 * dbs && !is_zero(&pair[..dbs]) && !is_zero(&pair[dbs..]) {
                    hasher.hash_two(&pair[..dbs], &pair[dbs..], &mut da[..ds], &mut db[..ds]);
                    return if da[..ds] != *self.leaf(b) {
                        Some(b)
                    } else {
                        (db[..ds] != *self.leaf(b + 1)).then_some(b + 1)
                    };
                }
                pair.chunks(dbs).enumerate().find_map(|(k, block)| {
                    let b = b + k as u64;
                    if is_zero(block) {
                        return (zero_digest != self.leaf(b)).then_some(b);
                    }
                    hasher.hash_into(block, &mut da[..ds]);
                    (da[..ds] != *self.leaf(b)).then_some(b)
                })
            })
            .min();
        match bad {
            Some(block) => Err(VerifyError::DataBlock {
                block,
                offset: block * dbs as u64,
            }),
            None => Ok(()),
        }
    }

    fn check_tree<D: Digest + Clone + Send + Sync + 'static>(&self) -> Result<(), VerifyError> {
        let g = &self.geometry;
        let hasher = SaltedHasher::<D>::new(self.params.hash_type, &self.params.salt);
        if g.levels == 0 {
            return Ok(());
        }
        let hbs = g.hash_block_size as usize;
        let top = g.level_offset_in_tree(g.levels - 1);
        let actual = hasher.hash(&self.tree[top..top + hbs]);
        if actual.as_slice() != self.root_hash.as_bytes() {
            return Err(VerifyError::RootHash {
                expected: self.root_hash.to_string(),
                actual: hex::encode(actual),
            });
        }
        let tree_offset = g.tree_offset() - self.params.hash_offset;
        for level in (0..g.levels - 1).rev() {
            let parent = g.level_offset_in_tree(level + 1);
            let this = g.level_offset_in_tree(level);
            let bad = (0..g.level_blocks[level] as usize)
                .into_par_iter()
                .filter_map(|j| {
                    let block = &self.tree[this + j * hbs..this + (j + 1) * hbs];
                    let p = (j >> g.hash_per_block_bits) * hbs
                        + (j & (g.hash_per_block() as usize - 1)) * g.slot_size;
                    let expected = &self.tree[parent + p..parent + p + g.digest_size];
                    (hasher.hash(block) != expected).then_some(j as u64)
                })
                .min();
            if let Some(index) = bad {
                return Err(VerifyError::HashBlock {
                    level,
                    index,
                    offset: tree_offset + this as u64 + index * hbs as u64,
                });
            }
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::tree::build_tree;

    fn data(n: usize) -> Vec<u8> {
        (0..n * 4096).map(|k| (k % 251) as u8).collect()
    }

    fn params(n: u64) -> VerityParams {
        VerityParams {
            data_blocks: n,
            salt: vec![7; 32],
            ..VerityParams::default()
        }
    }

    #[test]
    fn accepts_intact_and_names_bad_blocks() {
        let mut d = data(20_000);
        let p = params(20_000);
        let t = build_tree(&p, &d).unwrap();
        let v = Verifier::new(&p, t.blocks.clone(), &t.root_hash).unwrap();
        v.verify_blocks(0, &d).unwrap();
        v.verify_block(19_999, &d[19_999 * 4096..]).unwrap();
        d[12_345 * 4096 + 17] ^= 1;
        d[15_000 * 4096] ^= 1;
        assert_eq!(
            v.verify_blocks(0, &d),
            Err(VerifyError::DataBlock {
                block: 12_345,
                offset: 12_345 * 4096
            })
        );
        assert_eq!(
            v.verify_blocks(13_000, &d[13_000 * 4096..]),
            Err(VerifyError::DataBlock {
                block: 15_000,
                offset: 15_000 * 4096
            })
        );
        assert!(matches!(
            v.verify_blocks(19_999, &d[..8192]),
            Err(VerifyError::Range { .. })
        ));
    }

    #[test]
    fn counts_zero_blocks_from_the_tree() {
        let mut d = data(3_000);
        for b in [0usize, 7, 8, 2_999] {
            d[b * 4096..(b + 1) * 4096].fill(0);
        }
        // Nearly zero is not zero.
        d[100 * 4096..101 * 4096].fill(0);
        d[100 * 4096 + 4095] = 1;
        let p = params(3_000);
        let t = build_tree(&p, &d).unwrap();
        let v = Verifier::new(&p, t.blocks.clone(), &t.root_hash).unwrap();
        assert_eq!(v.zero_blocks(), 4);
        let zeros = vec![0u8; 5 * 4096];
        let p = params(5);
        let t = build_tree(&p, &zeros).unwrap();
        assert_eq!(
            Verifier::new(&p, t.blocks, &t.root_hash)
                .unwrap()
                .zero_blocks(),
            5
        );
    }

    #[test]
    fn rejects_a_tampered_tree() {
        let p = params(20_000);
        let t = build_tree(&p, &data(20_000)).unwrap();
        let level0 = t.geometry.level_offset_in_tree(0);
        let mut tree = t.blocks.clone();
        tree[level0 + 3 * 4096 + 5] ^= 0x80;
        let err = Verifier::new(&p, tree, &t.root_hash).unwrap_err();
        assert!(
            matches!(
                err,
                crate::VerityError::Verify(VerifyError::HashBlock {
                    level: 0,
                    index: 3,
                    ..
                })
            ),
            "{err}"
        );
        let mut tree = t.blocks.clone();
        tree[0] ^= 1;
        let err = Verifier::new(&p, tree, &t.root_hash).unwrap_err();
        assert!(
            matches!(
                err,
                crate::VerityError::Verify(VerifyError::RootHash { .. })
            ),
            "{err}"
        );
        let err = Verifier::new(
            &p,
            t.blocks.clone(),
            &RootHash::from_bytes(&t.root_hash.as_bytes()[..31]),
        )
        .unwrap_err();
        assert!(
            matches!(
                err,
                crate::VerityError::Verify(VerifyError::RootHashLength { .. })
            ),
            "{err}"
        );
    }

    #[test]
    fn single_block_checks_against_the_root() {
        let p = params(1);
        let d = data(1);
        let t = build_tree(&p, &d).unwrap();
        let v = Verifier::new(&p, Vec::new(), &t.root_hash).unwrap();
        v.verify_block(0, &d).unwrap();
        let mut bad = d.clone();
        bad[0] ^= 1;
        assert!(v.verify_block(0, &bad).is_err());
    }
}
