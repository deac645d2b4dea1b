//! What an ingot layer is: a deterministic, read-only ext4 image built from a file tree
//! ([`ext4`]), optionally sealed with a dm-verity hash tree ([`build_layer`]); plus the selection
//! rules and the stack descriptor schema.
//!
//! Sources ([`source::Source`]: a directory, a tar archive, an OCI image layout) are read into an
//! in-memory [`tree::Tree`] first; the image is written from that model alone.

use std::path::Path;

pub mod boot;
pub mod descriptor;
pub mod error;
pub mod ext4;
pub mod kmod_index;
#[cfg(feature = "cli")]
pub mod machine_args;
pub mod names;
pub mod select;
pub mod source;
pub mod stack_rules;
pub mod tree;
pub mod var_rule;

pub use error::LayerError;
pub use ext4::{build_image, Ext4Options, ImageInfo, MAX_SOURCE_DATE_EPOCH};
pub use source::Source;

/// A built layer.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct LayerBuild {
    pub image: ImageInfo,
    /// Image size in bytes.
    pub image_size: u64,
    /// 4 KiB data blocks covered by verity (= filesystem blocks).
    pub data_blocks: u64,
    /// The dm-verity side, as the descriptor names it: format 1, sha256, 4096-byte data and
    /// hash blocks, superblock at offset 0 of the hash file, salt = SHA-256 of the image, UUID
    /// derived from the layer seed.
    pub verity: Option<descriptor::VerityInfo>,
    /// Size of the hash file in bytes (0 without one).
    pub hash_size: u64,
}

/// Builds a layer image at `out_img` and, with `out_hash`, its dm-verity hash tree (salt =
/// SHA-256 of the image, UUID derived from `opts.seed`). Outputs appear only when complete.
pub fn build_layer(
    source: &Source,
    out_img: &Path,
    out_hash: Option<&Path>,
    opts: &Ext4Options,
) -> Result<LayerBuild, LayerError> {
    build_layer_checked(source, out_img, out_hash, opts, |_| Ok(()))
}

/// [`build_layer`], with `check` run on the loaded tree before anything is written (e.g.
/// [`var_rule::check`]).
pub fn build_layer_checked(
    source: &Source,
    out_img: &Path,
    out_hash: Option<&Path>,
    opts: &Ext4Options,
    check: impl FnOnce(&tree::Tree) -> Result<(), LayerError>,
) -> Result<LayerBuild, LayerError> {
    let tree = ext4::load(source, out_img)?;
    check(&tree)?;
    match out_hash {
        Some(hash) => seal_tree(&tree, out_img, hash, opts),
        None => {
            let image = ext4::write_tree(&tree, out_img, opts, false)?;
            Ok(LayerBuild {
                image_size: image.size,
                data_blocks: image.blocks,
                image,
                verity: None,
                hash_size: 0,
            })
        }
    }
}

/// The one sealing step every layer goes through (the stack's layers in `ingot build`, the
/// per-node layer in the writer): a file tree in, a deterministic ext4 image at `out_img`, its
/// dm-verity tree at `out_hash` (salt = SHA-256 of the image, UUID derived from `opts.seed`) and
/// the root hash out. Both files appear only when complete.
pub fn seal_tree(
    tree: &tree::Tree,
    out_img: &Path,
    out_hash: &Path,
    opts: &Ext4Options,
) -> Result<LayerBuild, LayerError> {
    let image = ext4::write_unpersisted(tree, out_img, opts, true)?;
    // The image's writeback (fsync) runs while the hash tree is computed from the page cache.
    let (synced, sealed) = std::thread::scope(|s| {
        let syncer = s.spawn(|| image.tmp.as_file().sync_all());
        let sealed = seal(image.tmp.path(), out_hash, &image.info, opts);
        (syncer.join().expect("sync thread panicked"), sealed)
    });
    synced.map_err(|e| LayerError::io("syncing", image.tmp.path(), e))?;
    let (verity, hash_size, hash_tmp) = sealed?;
    // Image first, then its tree; if the second rename fails, take the image back out.
    let info = image.persist_synced(out_img)?;
    if let Err(e) = hash_tmp.persist(out_hash) {
        let _ = std::fs::remove_file(out_img);
        return Err(LayerError::io(
            "renaming the hash tree to",
            out_hash,
            e.error,
        ));
    }
    Ok(LayerBuild {
        image_size: info.size,
        data_blocks: info.blocks,
        image: info,
        verity: Some(verity),
        hash_size,
    })
}

/// Builds the verity tree of `img` into a synced temporary file beside `hash`.
fn seal(
    img: &Path,
    hash: &Path,
    image: &ImageInfo,
    opts: &Ext4Options,
) -> Result<(descriptor::VerityInfo, u64, tempfile::NamedTempFile), LayerError> {
    let salt = image.sha256.expect("digest requested").to_vec();
    let uuid = ext4::derive_uuid("ingot verity uuid", &opts.seed);
    let params = ingot_verity::VerityParams {
        data_blocks: image.blocks,
        salt,
        uuid: Some(uuid),
        ..ingot_verity::VerityParams::default()
    };
    let dir = ext4::out_dir(hash);
    let tmp = tempfile::Builder::new()
        .prefix(".ingot-verity-")
        .suffix(".tmp")
        .tempfile_in(dir)
        .map_err(|e| LayerError::io("creating a temporary file in", dir, e))?;
    ext4::readable(&tmp)?;
    let t0 = std::time::Instant::now();
    let r = ingot_verity::format_file(img, tmp.path(), &params).map_err(|source| {
        LayerError::Verity {
            path: hash.to_path_buf(),
            source,
        }
    })?;
    tracing::info!(elapsed = ?t0.elapsed(), "built verity tree");
    tmp.as_file()
        .sync_all()
        .map_err(|e| LayerError::io("syncing", tmp.path(), e))?;
    let hash_size = tmp
        .as_file()
        .metadata()
        .map_err(|e| LayerError::io("reading", tmp.path(), e))?
        .len();
    Ok((
        descriptor::VerityInfo::new(r.root_hash, &params),
        hash_size,
        tmp,
    ))
}
