//! Reading the machine failed: the facts every step reads are missing or unreadable.

use std::path::PathBuf;

/// Reading the machine failed (not a gate decision: the facts themselves are missing).
#[derive(Debug, thiserror::Error)]
pub enum MachineError {
    /// A file or directory every Linux machine has could not be read.
    #[error("cannot read {path}")]
    Io {
        /// The path below the sysroot.
        path: PathBuf,
        /// The I/O error.
        #[source]
        source: std::io::Error,
    },
    /// A file had content we cannot interpret.
    #[error("cannot parse {path}: {what}")]
    Parse {
        /// The path below the sysroot.
        path: PathBuf,
        /// What was wrong with it.
        what: String,
    },
}
