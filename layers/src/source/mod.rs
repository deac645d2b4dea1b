//! Where a layer's files come from: a host directory, a tar archive, or the flattened filesystem
//! of an OCI image. Each is read into the same [`Tree`](crate::tree::Tree) model.

use std::path::{Path, PathBuf};

use crate::error::LayerError;
use crate::tree::Tree;

mod dir;
mod oci;
mod tar;

/// A layer's source tree.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Source {
    /// A directory on the host, read as is (owners, modes, xattrs, holes).
    Dir(PathBuf),
    /// A tar archive: plain, gzip or zstd (sniffed from the first bytes).
    Tar(PathBuf),
    /// An OCI image layout directory; the image's layers are applied in order, whiteouts
    /// honoured. An empty `manifest_digest` takes the only manifest in `index.json`.
    OciLayout {
        path: PathBuf,
        manifest_digest: String,
    },
}

impl Source {
    /// Reads the source into a tree. `scratch` is a directory for temporary files (decompressed
    /// archives), normally the output's directory; they are deleted when the tree is dropped.
    pub fn load(&self, scratch: &Path) -> Result<Tree, LayerError> {
        let _span = tracing::info_span!("load_source", source = ?self).entered();
        match self {
            Source::Dir(p) => dir::load(p),
            Source::Tar(p) => {
                let mut tree = Tree::new();
                tar::apply(&mut tree, p, scratch, false)?;
                Ok(tree)
            }
            Source::OciLayout {
                path,
                manifest_digest,
            } => oci::load(path, manifest_digest, scratch),
        }
    }
}
