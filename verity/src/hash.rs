//! The hash algorithms dm-verity uses and the salted hash both levels of the tree share.

use digest::Digest;

use crate::error::ParamError;

/// dm-verity hash type (`--format`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum HashType {
    /// 0: the original Chrome OS format: `H(block || salt)`, digests packed back to back.
    ChromeOs,
    /// 1: normal: `H(salt || block)`, each digest padded to a power of two.
    Normal,
}

impl HashType {
    pub fn from_u32(v: u32) -> Result<Self, ParamError> {
        match v {
            0 => Ok(HashType::ChromeOs),
            1 => Ok(HashType::Normal),
            other => Err(ParamError::HashType(other)),
        }
    }

    pub fn as_u32(self) -> u32 {
        match self {
            HashType::ChromeOs => 0,
            HashType::Normal => 1,
        }
    }
}

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
    salt: Vec<u8>,
    salt_last: bool,
    /// SHA-256 on a CPU with the SHA extensions: hash two blocks at once (see `sha256x2`).
    two_way: bool,
}

impl<D: Digest + Clone + 'static> SaltedHasher<D> {
    pub(crate) fn new(hash_type: HashType, salt: &[u8]) -> Self {
        let salt_last = hash_type == HashType::ChromeOs;
        SaltedHasher {
            prefixed: if salt_last {
                D::new()
            } else {
                D::new_with_prefix(salt)
            },
            suffix: if salt_last { salt.to_vec() } else { Vec::new() },
            salt: salt.to_vec(),
            salt_last,
            two_way: two_way_available::<D>(),
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

    /// Hashes two blocks of equal length, at once where the CPU allows.
    #[inline]
    pub(crate) fn hash_two(&self, a: &[u8], b: &[u8], out_a: &mut [u8], out_b: &mut [u8]) {
        #[cfg(target_arch = "x86_64")]
        if self.two_way {
            crate::sha256x2::hash_pair(&self.salt, self.salt_last, a, b, out_a, out_b);
            return;
        }
        self.hash_into(a, out_a);
        self.hash_into(b, out_b);
    }

    pub(crate) fn hash(&self, block: &[u8]) -> Vec<u8> {
        let mut out = vec![0u8; <D as Digest>::output_size()];
        self.hash_into(block, &mut out);
        out
    }
}

fn two_way_available<D: 'static>() -> bool {
    #[cfg(target_arch = "x86_64")]
    {
        std::any::TypeId::of::<D>() == std::any::TypeId::of::<sha2::Sha256>()
            && crate::sha256x2::available()
            && std::env::var_os("INGOT_VERITY_NO_2WAY").is_none()
    }
    #[cfg(not(target_arch = "x86_64"))]
    {
        false
    }
}

/// True when every byte of `block` is zero. Sparse images are mostly zeros: the scan leaves on
/// the first non-zero 256-byte stretch of dense data and runs at memory speed over zeros.
#[inline]
pub fn is_zero(block: &[u8]) -> bool {
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
