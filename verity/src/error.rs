//! Errors callers branch on: bad parameters, a bad superblock, a failed verification, I/O.

use std::path::PathBuf;

/// A parameter set veritysetup (or the kernel) would refuse.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum ParamError {
    #[error(
        "{which} block size {size} is invalid: it must be a power of two from 512 to 524288 bytes"
    )]
    BlockSize { which: &'static str, size: u64 },
    #[error("hash type {0} is invalid: it must be 0 (Chrome OS) or 1 (normal)")]
    HashType(u32),
    #[error("salt is {0} bytes: at most 256 are allowed")]
    SaltTooLong(usize),
    #[error("hash offset {0} is not a multiple of 512 bytes")]
    HashOffsetMisaligned(u64),
    #[error("the number of data blocks is zero: there is nothing to hash")]
    NoDataBlocks,
    #[error("unknown hash algorithm {0:?}: use sha1, sha224, sha256, sha384 or sha512")]
    UnknownAlgorithm(String),
    #[error("hash block size {hash_block_size} is too small for {algorithm} digests of {digest_size} bytes")]
    DigestTooBig {
        algorithm: &'static str,
        hash_block_size: u32,
        digest_size: usize,
    },
    #[error("{0} data blocks need a hash tree deeper than dm-verity allows")]
    TooManyLevels(u64),
    #[error("the hash device would end past 2^64 bytes")]
    Overflow,
    #[error("data is {have} bytes, the data blocks need {need}")]
    DataTooShort { have: u64, need: u64 },
}

/// A superblock that veritysetup would refuse to load.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum SuperblockError {
    #[error("superblock is {0} bytes long: 512 are needed")]
    Truncated(usize),
    #[error("no verity superblock (signature is {0:02x?}, expected \"verity\\0\\0\")")]
    Signature([u8; 8]),
    #[error("unsupported verity superblock version {0} (only 1 exists)")]
    Version(u32),
    #[error("hash algorithm name in the superblock is not NUL-terminated text")]
    AlgorithmName,
    #[error(transparent)]
    Param(#[from] ParamError),
}

/// Where verification found the first mismatch.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum VerifyError {
    #[error(
        "root hash mismatch: the top of the hash tree hashes to {actual}, expected {expected}"
    )]
    RootHash { expected: String, actual: String },
    #[error("hash block {index} of level {level} (byte {offset} of the hash device) does not match its parent's hash")]
    HashBlock {
        level: usize,
        index: u64,
        offset: u64,
    },
    #[error("data block {block} (byte offset {offset}) does not match its hash")]
    DataBlock { block: u64, offset: u64 },
    #[error("root hash is {actual} bytes: {algorithm} needs {expected}")]
    RootHashLength {
        algorithm: &'static str,
        expected: usize,
        actual: usize,
    },
    #[error("hash tree is {actual} bytes, the parameters need {expected}")]
    TreeLength { expected: u64, actual: u64 },
    #[error(
        "data range {first}..{end} is outside the {data_blocks} data blocks, or not block-aligned"
    )]
    Range {
        first: u64,
        end: u64,
        data_blocks: u64,
    },
}

/// Everything the file-level operations can fail with.
#[derive(Debug, thiserror::Error)]
pub enum VerityError {
    #[error(transparent)]
    Param(#[from] ParamError),
    #[error("{path}")]
    Superblock {
        path: PathBuf,
        source: SuperblockError,
    },
    #[error(transparent)]
    Verify(#[from] VerifyError),
    #[error("{path}: {what}")]
    Io {
        path: PathBuf,
        what: &'static str,
        source: std::io::Error,
    },
    #[error("{path}: data device is empty")]
    EmptyData { path: PathBuf },
    #[error("{path}: data device has {have} bytes, {need} are needed for {blocks} blocks of {block_size}")]
    DataTooSmall {
        path: PathBuf,
        have: u64,
        need: u64,
        blocks: u64,
        block_size: u32,
    },
    #[error("data area (bytes 0..{data_end}) overlaps the hash area at offset {hash_offset} on the same device {path}")]
    Overlap {
        path: PathBuf,
        data_end: u64,
        hash_offset: u64,
    },
    #[error(
        "{path}: data device ended at byte {at} while being read, {need} bytes are needed (it \
         shrank)"
    )]
    DataShrank { path: PathBuf, at: u64, need: u64 },
    #[error("{path}: hash device has {have} bytes after the hash offset, the tree needs {need}")]
    HashTooSmall { path: PathBuf, have: u64, need: u64 },
}
