//! The hash algorithms dm-verity uses and the salted hash both levels of the tree share.

use digest::Digest;

use crate::error::ParamError;
use crate::params::HashType;

/// A hash algorithm known to both veritysetup (OpenSSL names) and the kernel's crypto API.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum HashAlgorithm {
    Sha1,
    Sha224,
    Sha256,
    Sha384,
    Sha512,
}

impl HashAlgorithm {
    /// The lower-case name veritysetup stores in the superblock and the kernel table uses.
    pub fn name(self) -> &'static str {
        match self {
            HashAlgorithm::Sha1 => "sha1",
            HashAlgorithm::Sha224 => "sha224",
            HashAlgorithm::Sha256 => "sha256",
            HashAlgorithm::Sha384 => "sha384",
            HashAlgorithm::Sha512 => "sha512",
        }
    }

    /// Digest length in bytes.
    pub fn digest_size(self) -> usize {
        match self {
            HashAlgorithm::Sha1 => 20,
            HashAlgorithm::Sha224 => 28,
            HashAlgorithm::Sha256 => 32,
            HashAlgorithm::Sha384 => 48,
            HashAlgorithm::Sha512 => 64,
        }
    }

    /// Parses a name case-insensitively, as OpenSSL does (veritysetup stores it lower-cased).
    pub fn from_name(name: &str) -> Result<Self, ParamError> {
        match name.to_ascii_lowercase().as_str() {
            "sha1" => Ok(HashAlgorithm::Sha1),
            "sha224" => Ok(HashAlgorithm::Sha224),
            "sha256" => Ok(HashAlgorithm::Sha256),
            "sha384" => Ok(HashAlgorithm::Sha384),
            "sha512" => Ok(HashAlgorithm::Sha512),
            _ => Err(ParamError::UnknownAlgorithm(name.to_string())),
        }
    }
}

impl std::fmt::Display for HashAlgorithm {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(self.name())
    }
}

impl std::str::FromStr for HashAlgorithm {
    type Err = ParamError;
    fn from_str(s: &str) -> Result<Self, Self::Err> {
        Self::from_name(s)
    }
}

/// Runs `$body` with `$D` bound to the digest type of `$alg`, so the hot loops are monomorphic.
macro_rules! with_digest {
    ($alg:expr, $D:ident => $body:expr) => {
        match $alg {
            $crate::hash::HashAlgorithm::Sha1 => {
                type $D = sha1::Sha1;
                $body
            }
            $crate::hash::HashAlgorithm::Sha224 => {
                type $D = sha2::Sha224;
                $body
            }
            $crate::hash::HashAlgorithm::Sha256 => {
                type $D = sha2::Sha256;
                $body
            }
            $crate::hash::HashAlgorithm::Sha384 => {
                type $D = sha2::Sha384;
                $body
            }
            $crate::hash::HashAlgorithm::Sha512 => {
                type $D = sha2::Sha512;
                $body
            }
        }
    };
}
pub(crate) use with_digest;

/// The salted hash of one block: `H(salt || block)` for format 1, `H(block || salt)` for the
/// original Chrome OS format 0. The same function hashes data blocks, hash blocks and the root.
#[derive(Clone)]
pub(crate) struct SaltedHasher<D: Digest + Clone> {
    /// For format 1 the salt is absorbed once here and the state cloned per block.
    prefixed: D,
    suffix: Vec<u8>,
}

impl<D: Digest + Clone> SaltedHasher<D> {
    pub(crate) fn new(hash_type: HashType, salt: &[u8]) -> Self {
        match hash_type {
            HashType::Normal => SaltedHasher {
                prefixed: D::new_with_prefix(salt),
                suffix: Vec::new(),
            },
            HashType::ChromeOs => SaltedHasher {
                prefixed: D::new(),
                suffix: salt.to_vec(),
            },
        }
    }

    /// Hashes `block` into `out` (exactly the digest size).
    #[inline]
    pub(crate) fn hash_into(&self, block: &[u8], out: &mut [u8]) {
        let mut h = self.prefixed.clone();
        h.update(block);
        if !self.suffix.is_empty() {
            h.update(&self.suffix);
        }
        out.copy_from_slice(&h.finalize());
    }

    pub(crate) fn hash(&self, block: &[u8]) -> Vec<u8> {
        let mut out = vec![0u8; <D as Digest>::output_size()];
        self.hash_into(block, &mut out);
        out
    }
}

/// True when every byte of `block` is zero. Sparse images are mostly zeros: the scan leaves on
/// the first non-zero 256-byte stretch of dense data and runs at memory speed over zeros.
#[inline]
pub(crate) fn is_zero(block: &[u8]) -> bool {
    let mut chunks = block.chunks_exact(256);
    for chunk in &mut chunks {
        let acc = chunk.chunks_exact(8).fold(0u64, |acc, w| {
            acc | u64::from_ne_bytes(w.try_into().expect("8-byte chunk"))
        });
        if acc != 0 {
            return false;
        }
    }
    chunks.remainder().iter().all(|b| *b == 0)
}
