//! dm-verity hash trees, byte-compatible with `veritysetup format` and the kernel.
//!
//! Pure computation, no policy: callers choose salts, UUIDs and where bytes go.
//!
//! - [`VerityParams`] and [`Geometry`]: the parameters veritysetup takes and the tree shape they
//!   imply (levels, where each level sits on the hash device, its size).
//! - [`build_tree`]: the whole tree and root hash of in-memory (or mapped) data, level 0 split
//!   across cores, all-zero blocks hashed once.
//! - [`Superblock`]: the 512-byte header veritysetup writes, with every check it makes on read.
//! - [`Verifier`]: checks a tree against a trusted root hash once, then checks any data block or
//!   range against its leaf without rehashing the device.
//! - [`RootHash`]: the root hash, one type from the tree builder to the kernel command line.
//! - [`format_file`], [`verify_files`], [`read_superblock`]: the same on files and block devices.
//! - [`input`]: the one bounded reader of local input files (regular files only, a size limit).

mod error;
mod file;
mod hash;
pub mod input;
mod params;
mod root_hash;
#[cfg(target_arch = "x86_64")]
mod sha256x2;
mod superblock;
mod tree;
mod verify;

pub use error::{ParamError, SuperblockError, VerifyError, VerityError};
pub use file::{format_file, read_superblock, verify_files, FormatResult};
pub use hash::HashType;
pub use hash::{is_zero, HashAlgorithm};
pub use params::{
    Geometry, VerityParams, MAX_BLOCK_SIZE, MAX_SALT_SIZE, MIN_BLOCK_SIZE, SUPERBLOCK_SIZE,
};
pub use root_hash::{RootHash, RootHashError, MAX_ROOT_HASH_SIZE};
pub use superblock::Superblock;
pub use tree::{build_tree, build_tree_sparse, Tree, ZeroRanges};
pub use verify::Verifier;

/// Lower-case hex, as veritysetup prints digests and salts.
pub fn to_hex(bytes: &[u8]) -> String {
    hex::encode(bytes)
}

/// Formats a UUID in its canonical 8-4-4-4-12 form (the superblock stores raw RFC 4122 bytes).
pub fn uuid_to_string(uuid: &[u8; 16]) -> String {
    let h = hex::encode(uuid);
    format!(
        "{}-{}-{}-{}-{}",
        &h[0..8],
        &h[8..12],
        &h[12..16],
        &h[16..20],
        &h[20..32]
    )
}

/// Parses a canonical UUID string (hyphens optional, any case) into raw RFC 4122 bytes.
pub fn parse_uuid(text: &str) -> Option<[u8; 16]> {
    let compact: String = text.chars().filter(|c| *c != '-').collect();
    let hyphens = text.chars().filter(|c| *c == '-').count();
    if compact.len() != 32 || !(hyphens == 0 || hyphens == 4) {
        return None;
    }
    if hyphens == 4 {
        let parts: Vec<&str> = text.split('-').collect();
        let lens: Vec<usize> = parts.iter().map(|p| p.len()).collect();
        if lens != [8, 4, 4, 4, 12] {
            return None;
        }
    }
    let mut out = [0u8; 16];
    hex::decode_to_slice(compact, &mut out).ok()?;
    Some(out)
}
