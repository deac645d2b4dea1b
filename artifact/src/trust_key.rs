//! The one loader of trusted public keys, for every command that checks a signature.
//!
//! A key is given as a minisign `.pub` file, or as the key text itself (the builder's
//! `--trust-key` takes either); the writer also takes `INGOT_TRUST_KEY` and a key compiled in.

use std::path::{Path, PathBuf};

use ingot_verity::input::{self, Symlinks};

use crate::sign::{PublicKey, SignError};

/// The largest key file read: a minisign public key file is about 100 bytes.
pub const MAX_KEY_FILE_SIZE: u64 = 16 << 10;

#[derive(Debug, thiserror::Error)]
pub enum KeyError {
    #[error("reading the public key {path}")]
    Read {
        path: PathBuf,
        #[source]
        source: std::io::Error,
    },
    #[error("loading the public key from {from}")]
    Parse {
        from: String,
        #[source]
        source: SignError,
    },
    #[error(
        "no trusted key: pass --trust-key PUB or set INGOT_TRUST_KEY (the writer never accepts \
         an unsigned stack)"
    )]
    Missing,
}

fn parse(text: &str, from: String) -> Result<PublicKey, KeyError> {
    PublicKey::from_minisign(text).map_err(|source| KeyError::Parse { from, source })
}

/// Reads a minisign public key file: a regular file of at most [`MAX_KEY_FILE_SIZE`] bytes
/// (`/dev/zero` or a FIFO is refused, not read).
pub fn read(path: &Path) -> Result<PublicKey, KeyError> {
    let text =
        input::read_text_bounded(path, MAX_KEY_FILE_SIZE, Symlinks::Follow).map_err(|source| {
            KeyError::Read {
                path: path.to_path_buf(),
                source,
            }
        })?;
    parse(&text, path.display().to_string())
}

/// A key named by an argument: a file when one exists at that path, else the key text itself.
pub fn from_arg(arg: &str) -> Result<PublicKey, KeyError> {
    let path = Path::new(arg);
    if path.exists() {
        read(path)
    } else {
        parse(arg, "the command line".into())
    }
}

/// The first key given: a file named on the command line, else the file `INGOT_TRUST_KEY`
/// names, else the key text compiled in.
pub fn first_of(explicit: Option<&Path>, builtin: Option<&str>) -> Result<PublicKey, KeyError> {
    if let Some(path) = explicit {
        read(path)
    } else if let Some(path) = std::env::var_os("INGOT_TRUST_KEY") {
        read(Path::new(&path))
    } else if let Some(text) = builtin {
        parse(text, "the built-in key".into())
    } else {
        Err(KeyError::Missing)
    }
}
