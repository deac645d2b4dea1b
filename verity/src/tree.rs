//! Building the tree. Level 0 (the hashes of the data blocks) is over 99% of the work, so it is
//! split across cores; every hash block of a level is independent of its neighbours.

use std::ops::Range;

use digest::Digest;
use rayon::prelude::*;

use crate::error::{ParamError, VerityError};
use crate::hash::{is_zero, with_digest, SaltedHasher};
use crate::params::{Geometry, VerityParams};
use crate::root_hash::RootHash;

/// A complete hash tree.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Tree {
    pub params: VerityParams,
    pub geometry: Geometry,
    pub root_hash: RootHash,
    /// The tree as stored on the hash device from `hash_start_block` on: top level first.
    pub blocks: Vec<u8>,
}

/// Byte ranges of the data known to read as zeros (holes of a sparse file), sorted and disjoint.
/// Blocks inside them are never read: their digest is the one all-zero block digest.
#[derive(Debug, Clone, Default)]
pub struct ZeroRanges(Vec<Range<u64>>);

impl ZeroRanges {
    pub fn new(mut ranges: Vec<Range<u64>>) -> Self {
        ranges.retain(|r| r.start < r.end);
        ranges.sort_by_key(|r| r.start);
        ZeroRanges(ranges)
    }

    /// True when `[start, end)` lies inside one known-zero range.
    fn covers(&self, start: u64, end: u64) -> bool {
        let i = self.0.partition_point(|r| r.end <= start);
        self.0
            .get(i)
            .is_some_and(|r| r.start <= start && end <= r.end)
    }

    pub fn is_empty(&self) -> bool {
        self.0.is_empty()
    }
}

/// Builds the tree and root hash of the first `params.data_blocks` blocks of `data`.
pub fn build_tree(params: &VerityParams, data: &[u8]) -> Result<Tree, VerityError> {
    build_tree_sparse(params, data, &ZeroRanges::default())
}

/// Like [`build_tree`], skipping the bytes in `zeros` (known holes) without reading them.
pub fn build_tree_sparse(
    params: &VerityParams,
    data: &[u8],
    zeros: &ZeroRanges,
) -> Result<Tree, VerityError> {
    let geometry = params.geometry()?;
    let need = params.data_blocks * params.data_block_size as u64;
    if (data.len() as u64) < need {
        return Err(ParamError::DataTooShort {
            have: data.len() as u64,
            need,
        }
        .into());
    }
    let (root_hash, blocks) = with_digest!(params.algorithm, D => build::<D>(params, &geometry, &data[..need as usize], zeros));
    Ok(Tree {
        params: params.clone(),
        geometry,
        root_hash: RootHash::from_bytes(root_hash),
        blocks,
    })
}

fn build<D: Digest + Clone + Send + Sync + 'static>(
    params: &VerityParams,
    g: &Geometry,
    data: &[u8],
    zeros: &ZeroRanges,
) -> (Vec<u8>, Vec<u8>) {
    let hasher = SaltedHasher::<D>::new(params.hash_type, &params.salt);
    let dbs = params.data_block_size as usize;
    let hbs = params.hash_block_size as usize;
    if g.levels == 0 {
        // One data block: the root is its hash and no hash block exists.
        return (hasher.hash(&data[..dbs]), Vec::new());
    }
    let mut tree = vec![0u8; g.tree_size() as usize];
    let zero_digest = hasher.hash(&vec![0u8; dbs]);

    let off0 = g.level_offset_in_tree(0);
    let len0 = g.level_blocks[0] as usize * hbs;
    hash_level(
        &hasher,
        g,
        &mut tree[off0..off0 + len0],
        data,
        dbs,
        Some((&zero_digest, zeros)),
    );

    for level in 1..g.levels {
        // Levels are stored top first, so level `level` lies before level `level - 1`.
        let below = g.level_offset_in_tree(level - 1);
        let (head, tail) = tree.split_at_mut(below);
        let off = g.level_offset_in_tree(level);
        let out = &mut head[off..off + g.level_blocks[level] as usize * hbs];
        let input = &tail[..g.level_blocks[level - 1] as usize * hbs];
        hash_level(&hasher, g, out, input, hbs, None);
    }

    let top = g.level_offset_in_tree(g.levels - 1);
    let root = hasher.hash(&tree[top..top + hbs]);
    (root, tree)
}

/// Fills one level: each output hash block holds the digests of up to `hash_per_block`
/// consecutive input blocks; the rest of it stays zero, as the format requires.
fn hash_level<D: Digest + Clone + Send + Sync + 'static>(
    hasher: &SaltedHasher<D>,
    g: &Geometry,
    out: &mut [u8],
    input: &[u8],
    in_block: usize,
    zero: Option<(&[u8], &ZeroRanges)>,
) {
    let hbs = g.hash_block_size as usize;
    let per = g.hash_per_block() as usize;
    let slot = g.slot_size;
    let ds = g.digest_size;
    let count = input.len() / in_block;
    out.par_chunks_mut(hbs)
        .enumerate()
        .for_each(|(j, hash_block)| {
            let first = j * per;
            let last = count.min(first + per);
            // A block waiting for a partner, so that two are hashed at once: (slot index, offset).
            let mut pending: Option<(usize, usize)> = None;
            for (k, b) in (first..last).enumerate() {
                let start = b * in_block;
                if let Some((zero_digest, zeros)) = zero {
                    let (s, e) = (start as u64, (start + in_block) as u64);
                    if (!zeros.is_empty() && zeros.covers(s, e))
                        || is_zero(&input[start..start + in_block])
                    {
                        hash_block[k * slot..k * slot + ds].copy_from_slice(zero_digest);
                        continue;
                    }
                }
                match pending.take() {
                    None => pending = Some((k, start)),
                    Some((k0, s0)) => {
                        let (lo, hi) = hash_block.split_at_mut(k * slot);
                        hasher.hash_two(
                            &input[s0..s0 + in_block],
                            &input[start..start + in_block],
                            &mut lo[k0 * slot..k0 * slot + ds],
                            &mut hi[..ds],
                        );
                    }
                }
            }
            if let Some((k0, s0)) = pending {
                hasher.hash_into(
                    &input[s0..s0 + in_block],
                    &mut hash_block[k0 * slot..k0 * slot + ds],
                );
            }
        });
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::hash::HashAlgorithm;
    use crate::hash::HashType;
    use sha2::Sha256;

    fn mod251(n: usize) -> Vec<u8> {
        (0..n).map(|k| (k % 251) as u8).collect()
    }

    fn vector_params(n: u64) -> VerityParams {
        VerityParams {
            data_blocks: n,
            salt: (0u8..32).collect(),
            uuid: crate::parse_uuid("12345678-1234-1234-1234-123456789abc"),
            ..VerityParams::default()
        }
    }

    /// The hash image veritysetup writes on a fresh file: superblock, zero gap, tree.
    fn image(t: &Tree) -> Vec<u8> {
        let mut img = vec![0u8; t.geometry.hash_device_size as usize];
        if t.params.superblock {
            img[..512].copy_from_slice(&crate::Superblock::from_params(&t.params).to_bytes());
        }
        let off = t.geometry.tree_offset() as usize - t.params.hash_offset as usize;
        img[off..off + t.blocks.len()].copy_from_slice(&t.blocks);
        img
    }

    fn check(p: VerityParams, data: &[u8], image_sha: &str, root: &str) {
        let t = build_tree(&p, data).unwrap();
        assert_eq!(t.root_hash.to_string(), root, "root hash");
        assert_eq!(
            hex::encode(Sha256::digest(image(&t))),
            image_sha,
            "hash image"
        );
    }

    // Vectors from the reference's table 1.8 (veritysetup 2.6.1).
    #[test]
    fn reference_vectors() {
        check(
            vector_params(1),
            &mod251(4096),
            "46eab3c1a60e76e7d838dad873cd6b67867c9668a346d3692fadcb6712b37d3f",
            "f9629ec228b5c00268d95f3299754de3ec27dd878f059ded6c9b3955d01775ee",
        );
        check(
            vector_params(2),
            &mod251(2 * 4096),
            "520e622cad690a9bac3ad38187e16a28135ca3aac354f41334a591eeabe0ee87",
            "f3c6c4e5ec27940a193ff84f3a96c5956ed6854bbc1d46c3c5ef2dec6e670fc0",
        );
        check(
            vector_params(128),
            &mod251(128 * 4096),
            "37fec04f7adbd57f91648f31fa59f34a1428a2429d9631ba0693afc321eec1e3",
            "aeed836743e049ba4415cf73bdbeed1b509b9a2c614611abde9367616afbfa99",
        );
        check(
            vector_params(129),
            &mod251(129 * 4096),
            "e1bfd39fa19de23dad69254085e72e58554f2b5e4367f55c0356b1ade14aecf6",
            "47dc6c1d9c2cc61492a6d2448ad946ed1192d281478f00c3a8a29316890a435b",
        );
        check(
            vector_params(16385),
            &mod251(16385 * 4096),
            "5f3e9bad4979548b4662ebf368994270204144806d9117d8d4dfd99d7e51ad46",
            "4cb89ba5dd50276027e74fa4a5dd1107e55032057f716997bbc5e236b2f52fc7",
        );
        check(
            vector_params(256),
            &vec![0u8; 256 * 4096],
            "c84124ad9a023145d7debe5301b3595908a57d302c5d4533b67b9db0383cc566",
            "7722fefaac5735743fbbc956822bd9be4d8475282267a65a652b459ffa7b9606",
        );
        let mut p = vector_params(129);
        p.salt.clear();
        check(
            p,
            &mod251(129 * 4096),
            "eb02b6a127af82e144e73a577372728e4465b895526f9cdad595813917b402c4",
            "6febabcdf0b08f8ebb0583e06d1747ec3cd63a99efb0437efef8fe54223c7760",
        );
        let mut p = vector_params(129);
        p.hash_type = HashType::ChromeOs;
        check(
            p,
            &mod251(129 * 4096),
            "a2b02d70cb27f7434c8f09ff9c00d62e1468115519ac626d212cb7bd880647b8",
            "e50dc76f89b022cae57350bb7da5388b26e5a0cced7ad6e18d6566c53cb7085c",
        );
        let mut p = vector_params(129);
        p.algorithm = HashAlgorithm::Sha1;
        check(
            p,
            &mod251(129 * 4096),
            "273c7bac14b2d245b7e5a18a1728b2d8f7631ca3c3e35376f18b559d031a78cc",
            "e349d7b9874c11694d5da6273f3014dd9dfb6324",
        );
        let mut p = vector_params(129);
        p.algorithm = HashAlgorithm::Sha512;
        check(p, &mod251(129 * 4096), "a1e78a25de0b17b03b39a7a52ed14644e763b77d92336d671cc5d0dc915ef0fe", "b2ab4df2ed9a5a71a1d79da37c4aaa66c1045d234861ec704d0d830677d6906084db23c0dc2e2818866d830e51382368e9c96c2eeed44b969d8de6d4702cd3a3");
        let mut p = vector_params(129);
        p.superblock = false;
        check(
            p,
            &mod251(129 * 4096),
            "dc224dfb0f3991edd311ecaac76ebeb994b4000171003a79b9e9ad3090829448",
            "47dc6c1d9c2cc61492a6d2448ad946ed1192d281478f00c3a8a29316890a435b",
        );
    }

    #[test]
    fn holes_give_the_same_tree_as_zeros() {
        let mut data = mod251(1000 * 4096);
        data[100 * 4096..600 * 4096].fill(0);
        let p = vector_params(1000);
        let plain = build_tree(&p, &data).unwrap();
        let holes = ZeroRanges::new(vec![100 * 4096..300 * 4096, 300 * 4096..600 * 4096]);
        let sparse = build_tree_sparse(&p, &data, &holes).unwrap();
        assert_eq!(plain, sparse);
    }

    #[test]
    fn short_data_is_refused() {
        let p = vector_params(3);
        assert!(matches!(
            build_tree(&p, &[0u8; 8192]),
            Err(VerityError::Param(ParamError::DataTooShort {
                have: 8192,
                need: 12288
            }))
        ));
    }
}
