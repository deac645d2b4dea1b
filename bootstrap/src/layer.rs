//! The staged files as a layer tree, ready for [`ingot_layers::seal_tree`]: no archive in
//! between. Entries go in their staged order (sorted, parents first) with their numeric owners
//! and modes; file contents stay in memory (they are small: configuration, keys, units).

use std::collections::BTreeMap;
use std::os::unix::ffi::OsStrExt;
use std::sync::Arc;

use ingot_layers::tree::{split_path, FileData, Meta, Node, NodeKind, Tree};
use ingot_layers::LayerError;

use crate::stage::{EntryKind, Staged};

impl Staged {
    /// The per-node layer's file tree. A staged path the layer builder cannot hold (a NUL byte,
    /// `..`, a name over 255 bytes) is an error naming the path.
    pub fn to_tree(&self) -> Result<Tree, LayerError> {
        let mut tree = Tree::new();
        for e in &self.entries {
            let path = e.path.as_os_str().as_bytes();
            let kind = match &e.kind {
                EntryKind::Dir => NodeKind::Dir(BTreeMap::new()),
                EntryKind::File(bytes) => {
                    NodeKind::File(FileData::from_bytes(Arc::from(bytes.as_slice())))
                }
                EntryKind::Symlink(target) => {
                    NodeKind::Symlink(target.as_os_str().as_bytes().to_vec())
                }
            };
            let node = Node {
                meta: Meta::new(e.mode, e.uid, e.gid),
                kind,
            };
            tree.insert(&split_path(path, true)?, node, path)?;
        }
        Ok(tree)
    }
}
