//! A deterministic, read-only ext4 image writer.
//!
//! The image is planned completely in memory from the [`Tree`] (inode numbers in sorted-path
//! order, every block placed by a bump allocator), then written front to back in one pass: the
//! metadata bytes and the file data in block order, holes left as holes. See
//! `docs/layer-images.md` for the format choices.

use std::fmt;
use std::fs::File;
use std::path::Path;
use std::sync::Arc;

use sha2::{Digest, Sha256};

use crate::error::LayerError;
use crate::source::Source;
use crate::tree::Tree;

mod csum;
mod dir;
mod extent;
mod group;
mod htree;
mod inode;
mod layout;
mod le;
mod superblock;
mod writer;
mod xattr;

/// The only block size ingot writes.
pub const BLOCK_SIZE: usize = 4096;

/// The last second an ext4 inode time can hold (2446-05-10T22:38:55Z): 32 signed bits plus the
/// two epoch bits of `*_extra`. A later `source_date_epoch` would wrap to 1901.
pub const MAX_SOURCE_DATE_EPOCH: u64 = 0x7fff_ffff + (3 << 32);

/// Called with (bytes written, bytes to write) as the image is written.
pub type ProgressFn = Arc<dyn Fn(u64, u64) + Send + Sync>;

/// How to build an image. Two builds with equal options from equal trees are byte-identical.
#[derive(Clone, Default)]
pub struct Ext4Options {
    /// Identity of the layer (stack name + version + layer name): the filesystem UUID and the
    /// directory hash seed are derived from it.
    pub seed: Vec<u8>,
    /// Every timestamp in the image (and the superblock's times).
    pub source_date_epoch: u64,
    /// Total image size in bytes (rounded down to 4 KiB); `None` sizes the image to fit.
    pub size: Option<u64>,
    /// Progress callback for long builds.
    pub progress: Option<ProgressFn>,
}

impl fmt::Debug for Ext4Options {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Ext4Options")
            .field("seed", &String::from_utf8_lossy(&self.seed))
            .field("source_date_epoch", &self.source_date_epoch)
            .field("size", &self.size)
            .field("progress", &self.progress.is_some())
            .finish()
    }
}

/// What was written.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ImageInfo {
    /// Image size in bytes (`blocks * 4096`).
    pub size: u64,
    /// Filesystem blocks.
    pub blocks: u64,
    /// Blocks in use (metadata and data); the rest are free.
    pub used_blocks: u64,
    /// Inodes in use, including the reserved ones (1..=10).
    pub inodes: u32,
    /// The filesystem UUID.
    pub uuid: [u8; 16],
    /// SHA-256 of the image bytes, when the caller asked for it (computed while writing).
    pub sha256: Option<[u8; 32]>,
}

/// A UUID (version 4 layout) derived from `seed` within a named domain, so the filesystem and
/// the verity superblock of one layer get different UUIDs from the same seed.
pub fn derive_uuid(domain: &str, seed: &[u8]) -> [u8; 16] {
    let d = Sha256::new()
        .chain_update(domain.as_bytes())
        .chain_update([0u8])
        .chain_update(seed)
        .finalize();
    let mut u = [0u8; 16];
    u.copy_from_slice(&d[..16]);
    u[6] = (u[6] & 0x0f) | 0x40;
    u[8] = (u[8] & 0x3f) | 0x80;
    u
}

/// Builds an image from `source` at `out`. The image is written to a temporary file in the same
/// directory and renamed into place only when complete.
pub fn build_image(
    source: &Source,
    out: &Path,
    opts: &Ext4Options,
) -> Result<ImageInfo, LayerError> {
    write_tree(&load(source, out)?, out, opts, false)
}

/// Loads a source into the tree model, logging how long it took.
pub(crate) fn load(source: &Source, out: &Path) -> Result<Tree, LayerError> {
    let t0 = std::time::Instant::now();
    let tree = source.load(out_dir(out))?;
    tracing::info!(nodes = tree.nodes.len(), elapsed = ?t0.elapsed(), "loaded source tree");
    Ok(tree)
}

/// Temporary files are created 0600; a published image is readable by everyone (0644).
pub(crate) fn readable(tmp: &tempfile::NamedTempFile) -> Result<(), LayerError> {
    use std::os::unix::fs::PermissionsExt;
    tmp.as_file()
        .set_permissions(std::fs::Permissions::from_mode(0o644))
        .map_err(|e| LayerError::io("setting the mode of", tmp.path(), e))
}

pub(crate) fn out_dir(out: &Path) -> &Path {
    match out.parent() {
        Some(p) if !p.as_os_str().is_empty() => p,
        _ => Path::new("."),
    }
}

/// An image written to a temporary file beside its destination, not yet synced or renamed.
pub(crate) struct Unpersisted {
    pub info: ImageInfo,
    pub tmp: tempfile::NamedTempFile,
}

impl Unpersisted {
    /// Syncs the image and renames it to `out`.
    pub(crate) fn persist(self, out: &Path) -> Result<ImageInfo, LayerError> {
        let f: &File = self.tmp.as_file();
        f.sync_all()
            .map_err(|e| LayerError::io("syncing", self.tmp.path(), e))?;
        self.persist_synced(out)
    }

    /// Renames an already synced image to `out`.
    pub(crate) fn persist_synced(self, out: &Path) -> Result<ImageInfo, LayerError> {
        self.tmp
            .persist(out)
            .map_err(|e| LayerError::io("renaming the image to", out, e.error))?;
        Ok(self.info)
    }
}

/// Writes an image of an already loaded tree (see [`build_image`]); with `digest` the SHA-256
/// of the image is computed on the way.
pub fn write_tree(
    tree: &Tree,
    out: &Path,
    opts: &Ext4Options,
    digest: bool,
) -> Result<ImageInfo, LayerError> {
    write_unpersisted(tree, out, opts, digest)?.persist(out)
}

pub(crate) fn write_unpersisted(
    tree: &Tree,
    out: &Path,
    opts: &Ext4Options,
    digest: bool,
) -> Result<Unpersisted, LayerError> {
    if opts.source_date_epoch > MAX_SOURCE_DATE_EPOCH {
        return Err(LayerError::EpochTooLate {
            epoch: opts.source_date_epoch,
            max: MAX_SOURCE_DATE_EPOCH,
        });
    }
    let uuid = derive_uuid("ingot ext4 uuid", &opts.seed);
    let mut hash_seed = [0u8; 16];
    hash_seed.copy_from_slice(
        &Sha256::new()
            .chain_update(b"ingot ext4 hash seed\0")
            .chain_update(&opts.seed)
            .finalize()[..16],
    );
    let t0 = std::time::Instant::now();
    let plan = layout::plan(tree, opts, uuid, hash_seed)?;
    tracing::info!(blocks = plan.blocks, inodes = plan.inodes, elapsed = ?t0.elapsed(), "planned image");
    let dir = out_dir(out);
    let tmp = tempfile::Builder::new()
        .prefix(".ingot-layer-")
        .suffix(".tmp")
        .tempfile_in(dir)
        .map_err(|e| LayerError::io("creating a temporary file in", dir, e))?;
    readable(&tmp)?;
    let t1 = std::time::Instant::now();
    let sha = writer::write(tmp.as_file(), &plan, digest, opts.progress.as_ref())?;
    tracing::info!(elapsed = ?t1.elapsed(), "wrote image");
    Ok(Unpersisted {
        info: ImageInfo {
            size: plan.blocks * BLOCK_SIZE as u64,
            blocks: plan.blocks,
            used_blocks: plan.used_blocks,
            inodes: plan.inodes,
            uuid,
            sha256: sha,
        },
        tmp,
    })
}
