//! `seal`: the per-node layer, built on this machine from the staged files: a deterministic
//! ext4 image and its dm-verity tree, with the layer builder every stack layer comes from.
//!
//! Reads the [`Staged`] files, the stack's name and the machine name (they seed the image);
//! returns the [`NodeLayer`]: image, hash device and root hash.

use ingot_bootstrap::Staged;
use ingot_verity::RootHash;

use crate::error::ProvisionError;
use crate::report::{Reporter, Stage};

/// The sealed per-node layer, built on this machine: an ext4 image and its verity hash device.
#[derive(Debug, Clone)]
pub struct NodeLayer {
    pub image: Vec<u8>,
    pub hash: Vec<u8>,
    pub root_hash: RootHash,
}

pub fn run(
    staged: &Staged,
    stack: &str,
    machine_name: &str,
    reporter: &Reporter,
) -> Result<NodeLayer, ProvisionError> {
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
fn seal(staged: &Staged, stack: &str, machine_name: &str) -> Result<NodeLayer, ProvisionError> {
    let err = |what: &str, e: &dyn std::fmt::Display| ProvisionError::Seal(format!("{what}: {e}"));
    let tree = staged.to_tree().map_err(|e| err("the staged files", &e))?;
    let dir = tempfile::tempdir().map_err(|e| err("making a scratch directory", &e))?;
    let img = dir.path().join("node.img");
    let hash = dir.path().join("node.hash");
    let opts = ingot_layers::Ext4Options {
        seed: format!("{stack}/node/{machine_name}").into_bytes(),
        source_date_epoch: 0,
        size: None,
        progress: None,
    };
    let built = ingot_layers::seal_tree(&tree, &img, &hash, &opts)
        .map_err(|e| err("building the image", &e))?;
    let verity = built
        .verity
        .ok_or_else(|| ProvisionError::Seal("the layer builder made no hash tree".into()))?;
    Ok(NodeLayer {
        image: std::fs::read(&img).map_err(|e| err("reading the image", &e))?,
        hash: std::fs::read(&hash).map_err(|e| err("reading the hash tree", &e))?,
        root_hash: verity.root_hash,
    })
}
