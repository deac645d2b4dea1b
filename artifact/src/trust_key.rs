//! The one loader of trusted public keys, for every command that checks a signature.
//!
//! A key is given as a minisign `.pub` file, or as the key text itself (the builder's
//! `--trust-key` takes either); the writer also takes `INGOT_TRUST_KEY` and a key compiled in.
//! Either kind of key is read: a minisign public key (checked against the signature annotation
//! over the descriptor) or cosign's PEM `PUBLIC KEY` (checked against the cosign signature of
//! the manifest digest, under the `sha256-<HEX>.sig` tag).

use std::path::{Path, PathBuf};

use ingot_verity::input::{self, Symlinks};

use crate::cosign::public_key::PublicKeyError;
use crate::sign::{PublicKey, SignError};

/// A trusted key of either kind.
#[derive(Debug, Clone)]
pub enum TrustedKey {
    /// A minisign key: the signature annotation over the descriptor must verify with it.
    Minisign(PublicKey),
    /// A cosign key: a cosign signature of the manifest digest must verify with it.
    Cosign(crate::cosign::PublicKey),
}

impl TrustedKey {
    /// The key's id: minisign's key id, or `sha256:` and 16 hex digits of the cosign key.
    pub fn key_id(&self) -> String {
        match self {
            TrustedKey::Minisign(k) => k.key_id(),
            TrustedKey::Cosign(k) => k.key_id(),
        }
    }

    /// Parses a key's text, either kind; `from` names where it came from.
    pub fn parse(text: &str, from: &str) -> Result<Self, KeyError> {
        if crate::cosign::PublicKey::is_pem(text) {
            crate::cosign::PublicKey::from_pem(text, from)
                .map(TrustedKey::Cosign)
                .map_err(KeyError::Cosign)
        } else {
            PublicKey::from_minisign(text)
                .map(TrustedKey::Minisign)
                .map_err(|source| KeyError::Parse {
                    from: from.to_owned(),
                    source,
                })
        }
    }
}

impl From<PublicKey> for TrustedKey {
    fn from(k: PublicKey) -> Self {
        TrustedKey::Minisign(k)
    }
}

/// The largest key file read: a minisign public key file is about 100 bytes, a cosign one 180.
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
    #[error(transparent)]
    Cosign(PublicKeyError),
    #[error(
        "no trusted key: pass --trust-key PUB or set INGOT_TRUST_KEY (the writer never accepts \
         an unsigned stack)"
    )]
    Missing,
}

fn parse(text: &str, from: String) -> Result<TrustedKey, KeyError> {
    TrustedKey::parse(text, &from)
}

/// Reads a public key file (minisign or cosign): a regular file of at most [`MAX_KEY_FILE_SIZE`] bytes
/// (`/dev/zero` or a FIFO is refused, not read).
pub fn read(path: &Path) -> Result<TrustedKey, KeyError> {
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
pub fn from_arg(arg: &str) -> Result<TrustedKey, KeyError> {
    let path = Path::new(arg);
    if path.exists() {
        read(path)
    } else {
        parse(arg, "the command line".into())
    }
}

/// The first key given: a file named on the command line, else the file `INGOT_TRUST_KEY`
/// names, else the key text compiled in.
pub fn first_of(explicit: Option<&Path>, builtin: Option<&str>) -> Result<TrustedKey, KeyError> {
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

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn either_kind_of_key_is_read() {
        let pem = crate::cosign::SigningKey::generate().public_key().to_pem();
        assert!(matches!(
            TrustedKey::parse(&pem, "cosign.pub"),
            Ok(TrustedKey::Cosign(_))
        ));
        let minisign = crate::sign::SecretKey::generate()
            .public_key()
            .to_minisign();
        assert!(matches!(
            TrustedKey::parse(&minisign, "ingot.pub"),
            Ok(TrustedKey::Minisign(_))
        ));
        let broken = pem.replace('A', "B");
        let e = TrustedKey::parse(&broken, "cosign.pub")
            .unwrap_err()
            .to_string();
        assert!(e.starts_with("cosign.pub: not a PEM `PUBLIC KEY`"), "{e}");
    }
}
