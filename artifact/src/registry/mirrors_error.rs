//! Why a registries.conf cannot be used (`mirrors`): its own module, below `error` and
//! `reference`, so that `RegistryError` can carry it while `mirrors` uses references.

use std::path::PathBuf;

/// The most of a registries.conf read (real ones are a few KiB).
pub const MAX_FILE: u64 = 1 << 20;

/// Why a registries.conf cannot be used, or refuses a reference.
#[derive(Debug, thiserror::Error)]
pub enum MirrorsError {
    /// The file could not be read.
    #[error("reading the registries configuration {path}")]
    Read {
        /// The file.
        path: PathBuf,
        /// Why.
        #[source]
        source: std::io::Error,
    },
    /// The file is larger than any registries.conf.
    #[error("{path}: larger than {MAX_FILE} bytes; not a registries.conf (not read further)")]
    TooLarge {
        /// The file.
        path: PathBuf,
    },
    /// The file is not TOML.
    #[error("{path}: not a TOML registries.conf")]
    Toml {
        /// The file.
        path: PathBuf,
        /// The parser's complaint.
        #[source]
        source: toml::de::Error,
    },
    /// A key is unknown or its value wrong.
    #[error("{path}: `{key}`: {problem}")]
    Invalid {
        /// The file.
        path: PathBuf,
        /// The key, as a TOML path (`registry[2].mirror[0].location`).
        key: String,
        /// What is wrong.
        problem: String,
    },
    /// Version 1 tables beside version 2 keys.
    #[error(
        "{path}: mixes the version 1 format (`[registries.*]`) with version 2 (`{v2_key}`); \
         containers/image refuses this too: convert the file to version 2 (`[[registry]]`)"
    )]
    Mixed {
        /// The file.
        path: PathBuf,
        /// The first version 2 key found.
        v2_key: String,
    },
    /// The configuration blocks the reference.
    #[error("{reference}: blocked by `prefix = \"{prefix}\"` (blocked = true) in {path}")]
    Blocked {
        /// The reference.
        reference: String,
        /// The matching prefix.
        prefix: String,
        /// The file.
        path: PathBuf,
    },
    /// A rewritten location does not make a valid reference.
    #[error("{reference}: `{location}` in {path} rewrites it to `{rewritten}`, not a reference")]
    Rewrite {
        /// The reference.
        reference: String,
        /// The location.
        location: String,
        /// The result.
        rewritten: String,
        /// The file.
        path: PathBuf,
    },
}
