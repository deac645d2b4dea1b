//! The one error type of the layer builder. Every variant names the input (a path on the host or an
//! entry inside the source tree) so a failed release build says what to fix. Wrapped errors are
//! reachable through `source()` (print with `{:#}` in anyhow to see the whole chain).

use std::io;
use std::path::PathBuf;

/// Why a layer image could not be built.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum LayerError {
    /// The base layer's boot files break the boot contract: missing, or too big for the ESP.
    #[error("the base layer's boot files")]
    Boot {
        #[source]
        source: crate::boot::BootLimitError,
    },
    /// A host file or directory could not be read or written.
    #[error("{op} {}", path.display())]
    Io {
        op: &'static str,
        path: PathBuf,
        #[source]
        source: io::Error,
    },
    /// An entry would land outside the image root (`..`, or a hard link pointing outside).
    #[error("entry {entry:?} escapes the image root")]
    EscapesRoot { entry: String },
    /// A tar member name is absolute.
    #[error("entry {entry:?} has an absolute path; layer archives must use relative member names")]
    AbsolutePath { entry: String },
    /// A path component is longer than ext4 allows.
    #[error("entry {entry:?}: name is {len} bytes, ext4 allows at most 255")]
    NameTooLong { entry: String, len: usize },
    /// An entry cannot be represented or makes no sense (hard link to a directory, unknown type...).
    #[error("entry {entry:?}: {reason}")]
    BadEntry { entry: String, reason: String },
    /// Overlayfs metadata (a whiteout, an overlay attribute) in a layer's tree, from any source:
    /// the node's overlay would honour it (`stack_rules::check_overlay_metadata`).
    #[error(
        "{origin}: entry {entry:?} {what}: a layer may hold no overlayfs metadata, whatever its \
         source (refused, not stripped: build from the merged tree, not an overlay's upper \
         directory or an image diff)"
    )]
    OverlayMetadata {
        origin: String,
        entry: String,
        what: String,
    },
    /// An extended attribute cannot be stored.
    #[error("entry {entry:?}: extended attribute {name:?}: {reason}")]
    Xattr {
        entry: String,
        name: String,
        reason: String,
    },
    /// A tar archive is malformed or truncated.
    #[error("tar archive {}: {reason}", path.display())]
    Tar { path: PathBuf, reason: String },
    /// An OCI image layout is malformed or does not hold what was asked for.
    #[error("OCI layout {}: {reason}", path.display())]
    Oci { path: PathBuf, reason: String },
    /// A source file changed between scanning and copying.
    #[error("{}: file changed while the image was being written", path.display())]
    FileChanged { path: PathBuf },
    /// The tree does not fit the requested size, or exceeds an ext4 limit.
    #[error("{0}")]
    TooLarge(String),
    /// A timestamp later than ext4 can store.
    #[error(
        "source_date_epoch {epoch} is past ext4's last timestamp {max} (2446-05-10T22:38:55Z)"
    )]
    EpochTooLate { epoch: u64, max: u64 },
    /// Building the dm-verity hash tree failed.
    #[error("dm-verity hash tree for {}", path.display())]
    Verity {
        path: PathBuf,
        #[source]
        source: ingot_verity::VerityError,
    },
}

impl LayerError {
    pub(crate) fn io(op: &'static str, path: impl Into<PathBuf>, source: io::Error) -> Self {
        LayerError::Io {
            op,
            path: path.into(),
            source,
        }
    }

    pub(crate) fn bad(entry: &[u8], reason: impl Into<String>) -> Self {
        LayerError::BadEntry {
            entry: show(entry),
            reason: reason.into(),
        }
    }
}

/// An entry path for messages: names are bytes, shown lossily.
pub(crate) fn show(path: &[u8]) -> String {
    if path.is_empty() {
        "/".to_string()
    } else {
        String::from_utf8_lossy(path).into_owned()
    }
}
