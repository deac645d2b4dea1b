//! Where a layer's files come from: a host directory, a tar archive, or the flattened filesystem
//! of an OCI image. Each is read into the same [`Tree`](crate::tree::Tree) model.

use std::path::{Path, PathBuf};

use crate::error::LayerError;
use crate::tree::Tree;

mod dir;
mod oci;
mod tar;

pub(crate) use dir::open_scanned;

/// The longest path of an entry accepted from a source, in bytes: Linux's `PATH_MAX`, the
/// longest path a program on the node can open in one call.
pub const MAX_PATH_LEN: usize = 4096;

/// The deepest entry accepted from a source (directories above it). Real trees stay far below;
/// the bound keeps the image writer's per-entry paths (each entry keeps its own for messages)
/// from growing with the square of the depth.
pub const MAX_DEPTH: usize = 256;

/// An entry's path for a message, cut at 200 bytes (a hostile one may be megabytes).
fn shown(path: &[u8]) -> Vec<u8> {
    if path.len() <= 200 {
        return path.to_vec();
    }
    let mut s = path[..200].to_vec();
    s.extend_from_slice(format!("… ({} bytes)", path.len()).as_bytes());
    s
}

/// Refuses a path longer than [`MAX_PATH_LEN`]; `what` says which path (`path`, `link target`).
fn check_path_len(entry: &[u8], path: &[u8], what: &str) -> Result<(), LayerError> {
    if path.len() > MAX_PATH_LEN {
        return Err(LayerError::bad(
            &shown(entry),
            format!(
                "the {what} is {} bytes, more than the {MAX_PATH_LEN} bytes (PATH_MAX) accepted",
                path.len()
            ),
        ));
    }
    Ok(())
}

/// Refuses an entry more than [`MAX_DEPTH`] components deep.
fn check_depth(entry: &[u8], depth: usize) -> Result<(), LayerError> {
    if depth > MAX_DEPTH {
        return Err(LayerError::bad(
            &shown(entry),
            format!("the path is {depth} components deep, more than the {MAX_DEPTH} accepted"),
        ));
    }
    Ok(())
}

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
        let tree = match self {
            Source::Dir(p) => dir::load(p)?,
            Source::Tar(p) => {
                let mut tree = Tree::new();
                tar::apply(&mut tree, p, scratch, false)?;
                tree
            }
            Source::OciLayout {
                path,
                manifest_digest,
            } => oci::load(path, manifest_digest, scratch)?,
        };
        // The one point every source kind's tree passes, whole, before anything uses it.
        crate::stack_rules::check_overlay_metadata(&tree, &self.describe())?;
        Ok(tree)
    }

    /// The source for a message: its kind and path.
    pub fn describe(&self) -> String {
        match self {
            Source::Dir(p) => format!("directory {}", p.display()),
            Source::Tar(p) => format!("tar archive {}", p.display()),
            Source::OciLayout {
                path,
                manifest_digest,
            } if manifest_digest.is_empty() => format!("OCI layout {}", path.display()),
            Source::OciLayout {
                path,
                manifest_digest,
            } => format!("OCI layout {} (manifest {manifest_digest})", path.display()),
        }
    }
}
