//! A blob on its way into a file: `.partial-<hex>` beside its destination, named by the blob's
//! digest so that a rerun after an interruption (a killed `ingot pull`) finds it and resumes
//! from its length instead of starting over. The bytes already there are hashed again first,
//! so the digest check at the end still covers every byte of the blob.

use std::io::Read;
use std::path::{Path, PathBuf};

use sha2::{Digest, Sha256};
use tracing::{info, warn};

use super::RegistryError;

/// What a partial file's name starts with.
pub(crate) const PARTIAL_PREFIX: &str = ".partial-";

/// The first bytes of a blob a sink already holds, and their running SHA-256.
#[derive(Default)]
pub(crate) struct Prefix {
    pub(crate) len: u64,
    pub(crate) hasher: Sha256,
}

/// The partial file of blob `digest` (`sha256:<hex>`) downloading to `dest`.
pub(crate) fn path_for(dest: &Path, digest: &str) -> Result<PathBuf, RegistryError> {
    let hex = digest
        .strip_prefix("sha256:")
        .filter(|_| ingot_layers::descriptor::is_sha256_digest(digest))
        .ok_or_else(|| RegistryError::Protocol(format!("`{digest}` is not a sha256 digest")))?;
    let dir = dest.parent().unwrap_or(Path::new("."));
    Ok(dir.join(format!("{PARTIAL_PREFIX}{hex}")))
}

/// The blob (`sha256:<hex>`) a file named `name` is the partial file of, if it is one.
pub(crate) fn digest_of(name: &str) -> Option<String> {
    let digest = format!("sha256:{}", name.strip_prefix(PARTIAL_PREFIX)?);
    ingot_layers::descriptor::is_sha256_digest(&digest).then_some(digest)
}

/// What an interrupted download of `digest` left at `path`: its length and the SHA-256 of
/// those bytes; nothing if there is no such file. One longer than the blob cannot be a prefix
/// of it: it is removed, with a warning, and the blob fetched from the start.
pub(crate) fn resume(path: &Path, digest: &str, size: u64) -> Result<Prefix, RegistryError> {
    let file = match std::fs::File::open(path) {
        Ok(f) => f,
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(Prefix::default()),
        Err(e) => return Err(RegistryError::io(path)(e)),
    };
    let len = file.metadata().map_err(RegistryError::io(path))?.len();
    if len > size {
        warn!(
            "{}: {len} bytes, more than the {size} of blob {digest}; discarded, fetching the \
             blob from the start",
            path.display()
        );
        discard(path)?;
        return Ok(Prefix::default());
    }
    let mut hasher = Sha256::new();
    let len = std::io::copy(&mut file.take(len), &mut hasher).map_err(RegistryError::io(path))?;
    let prefix = Prefix { len, hasher };
    if prefix.len > 0 {
        info!(
            "blob {digest}: resuming from the {} bytes an interrupted download left in {}",
            prefix.len,
            path.display()
        );
    }
    Ok(prefix)
}

/// Remove a partial file (already gone is fine).
pub(crate) fn discard(path: &Path) -> Result<(), RegistryError> {
    match std::fs::remove_file(path) {
        Err(e) if e.kind() != std::io::ErrorKind::NotFound => Err(RegistryError::io(path)(e)),
        _ => Ok(()),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn names_round_trip_and_strangers_are_not_partials() {
        let digest = format!("sha256:{}", "ab".repeat(32));
        let path = path_for(Path::new("/l/blobs/sha256/x"), &digest).unwrap();
        assert_eq!(
            path,
            Path::new("/l/blobs/sha256").join(format!(".partial-{}", "ab".repeat(32)))
        );
        let name = path.file_name().unwrap().to_str().unwrap();
        assert_eq!(digest_of(name), Some(digest));
        // An older pull's random name, or a truncated one: not the partial file of any blob.
        assert_eq!(digest_of(".partial-Xy12ab"), None);
        assert_eq!(digest_of(&format!(".partial-{}", "ab".repeat(31))), None);
        assert!(path_for(Path::new("/l/x"), "sha256:../../etc").is_err());
    }

    #[test]
    fn a_prefix_is_hashed_and_one_longer_than_the_blob_is_discarded() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join(".partial-x");
        assert_eq!(resume(&path, "sha256:x", 10).unwrap().len, 0);
        std::fs::write(&path, b"hello").unwrap();
        let prefix = resume(&path, "sha256:x", 10).unwrap();
        assert_eq!(prefix.len, 5);
        assert_eq!(prefix.hasher.finalize(), Sha256::digest(b"hello"));
        let prefix = resume(&path, "sha256:x", 4).unwrap();
        assert_eq!(prefix.len, 0);
        assert!(!path.exists());
    }
}
