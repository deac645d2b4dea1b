//! `seal`: the per-node layer, built on this machine from the staged files: a deterministic
//! ext4 image and its dm-verity tree, with the layer builder every stack layer comes from.
//!
//! Reads the [`Staged`] files, the stack's name and the machine name (they seed the image);
//! returns the [`NodeLayer`]: image, hash device and root hash.

use crate::node::NodeLayer;
use ingot_bootstrap::Staged;

/// Why the per-node layer could not be sealed.
#[derive(Debug, thiserror::Error)]
pub enum SealError {
    #[error("sealing the per-node layer: the staged files")]
    Tree(#[source] ingot_layers::LayerError),
    #[error("sealing the per-node layer: {what}")]
    Io {
        what: &'static str,
        #[source]
        source: std::io::Error,
    },
    #[error("sealing the per-node layer: building the image")]
    Build(#[source] ingot_layers::LayerError),
    #[error("sealing the per-node layer: the layer builder made no hash tree")]
    NoTree,
}
use crate::report::{Reporter, Stage};

pub fn run(
    staged: &Staged,
    stack: &str,
    machine_name: &str,
    reporter: &Reporter,
) -> Result<NodeLayer, SealError> {
    reporter.stage(
        Stage::Seal,
        "sealing the per-node layer (ext4 image and dm-verity tree)",
    );
    let node = seal(staged, stack, machine_name)?;
    reporter.stage(
        Stage::Seal,
        format!(
            "sealed the per-node layer: {} bytes, root hash {}",
            node.image.len(),
            node.root_hash
        ),
    );
    Ok(node)
}

/// Builds the node layer: the staged files as a tree, sealed by the layer builder every stack
/// layer comes from ([`ingot_layers::seal_tree`]), in a scratch directory read back into memory.
fn seal(staged: &Staged, stack: &str, machine_name: &str) -> Result<NodeLayer, SealError> {
    let io = |what| move |source| SealError::Io { what, source };
    let tree = staged.to_tree().map_err(SealError::Tree)?;
    let dir = tempfile::tempdir().map_err(io("making a scratch directory"))?;
    let img = dir.path().join("node.img");
    let hash = dir.path().join("node.hash");
    let opts = ingot_layers::Ext4Options {
        seed: format!("{stack}/node/{machine_name}").into_bytes(),
        source_date_epoch: 0,
        size: None,
        progress: None,
    };
    let built = ingot_layers::seal_tree(&tree, &img, &hash, &opts).map_err(SealError::Build)?;
    let verity = built.verity.ok_or(SealError::NoTree)?;
    Ok(NodeLayer {
        image: std::fs::read(&img).map_err(io("reading the image"))?,
        hash: std::fs::read(&hash).map_err(io("reading the hash tree"))?,
        root_hash: verity.root_hash,
    })
}
