//! A blob on its way into a file: `.partial-<hex>` beside its destination, named by the blob's
//! digest so that a rerun after an interruption (a killed `ingot pull`) finds it and resumes
//! from its length instead of starting over. The bytes already there are hashed again first,
//! so the digest check at the end still covers every byte of the blob.
//!
//! A partial file is opened with `O_NOFOLLOW` and must be a regular file: a symlink (or a FIFO,
//! a device, …) planted under a partial file's name is removed, with a warning, never followed
//! or written through; a directory there is refused.

use std::fs::{File, OpenOptions};
use std::io::{Read, Seek, SeekFrom};
use std::os::unix::fs::OpenOptionsExt;
use std::path::{Path, PathBuf};

use indicatif::ProgressBar;
use sha2::{Digest, Sha256};
use tracing::{info, warn};

use crate::blob::Prefix;
use crate::client::Endpoint;
use crate::error::RegistryError;
use crate::reference::RegistryRef;

/// What a partial file's name starts with.
pub(crate) const PARTIAL_PREFIX: &str = ".partial-";

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

/// Opens a partial file without following a symlink, and only if it is a regular file
/// (`O_NONBLOCK`: a FIFO planted there must not hang the open).
fn open_regular(path: &Path, options: &mut OpenOptions) -> std::io::Result<File> {
    let file = options
        .custom_flags(libc::O_NOFOLLOW | libc::O_NONBLOCK)
        .open(path)?;
    if !file.metadata()?.is_file() {
        return Err(std::io::Error::other("not a regular file"));
    }
    Ok(file)
}

/// Makes sure nothing but a regular file (or nothing) is at `path`: anything else is removed,
/// saying so; a directory is refused.
fn clear_stranger(path: &Path) -> Result<(), RegistryError> {
    let meta = match std::fs::symlink_metadata(path) {
        Ok(m) => m,
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(()),
        Err(e) => return Err(RegistryError::io(path)(e)),
    };
    let kind = meta.file_type();
    if kind.is_file() {
        return Ok(());
    }
    if kind.is_dir() {
        return Err(RegistryError::Protocol(format!(
            "{}: a directory where a blob's partial file goes; remove it",
            path.display()
        )));
    }
    warn!(
        "{}: not a regular file ({}); removed, not followed, and the blob fetched from the start",
        path.display(),
        if kind.is_symlink() {
            "a symlink"
        } else {
            "a special file"
        }
    );
    discard(path)
}

/// What an interrupted download of `digest` left at `path`: its length and the SHA-256 of
/// those bytes; nothing if there is no such file. One longer than the blob cannot be a prefix
/// of it: it is removed, with a warning, and the blob fetched from the start.
pub(crate) fn resume(path: &Path, digest: &str, size: u64) -> Result<Prefix, RegistryError> {
    clear_stranger(path)?;
    let file = match open_regular(path, OpenOptions::new().read(true)) {
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

impl Endpoint {
    /// [`Registry::pull_blob_to_file`]; returns how many bytes this call downloaded (less than
    /// the blob when an interrupted run's partial file was resumed, more when that partial
    /// proved bad and the blob came again from the start).
    pub(crate) async fn pull_blob_to_file_async(
        &self,
        reference: &RegistryRef,
        digest: &str,
        size: u64,
        dest: &Path,
        progress: Option<&ProgressBar>,
    ) -> Result<u64, RegistryError> {
        let path = path_for(dest, digest)?;
        let prefix = resume(&path, digest, size)?;
        let kept = prefix.len;
        let mut downloaded = size - kept;
        let mut result = self
            .fill_partial(reference, digest, size, &path, prefix, progress)
            .await;
        if kept > 0 && matches!(result, Err(RegistryError::Integrity { .. })) {
            warn!(
                "blob {digest}: the {kept} bytes an interrupted download left in {} and the \
                 rest do not give its digest; discarded, fetching the blob from the start",
                path.display()
            );
            downloaded += size;
            result = self
                .fill_partial(reference, digest, size, &path, Prefix::default(), progress)
                .await;
        }
        if let Err(e) = result {
            if matches!(e, RegistryError::Integrity { .. }) {
                discard(&path)?;
            }
            return Err(e);
        }
        std::fs::set_permissions(&path, std::os::unix::fs::PermissionsExt::from_mode(0o644))
            .map_err(RegistryError::io(&path))?;
        std::fs::rename(&path, dest).map_err(RegistryError::io(dest))?;
        Ok(downloaded)
    }

    /// Streams the rest of a blob into its partial file, which holds `prefix` (cut to its
    /// length: nothing past what was hashed stays), and syncs it.
    async fn fill_partial(
        &self,
        reference: &RegistryRef,
        digest: &str,
        size: u64,
        path: &Path,
        prefix: Prefix,
        progress: Option<&ProgressBar>,
    ) -> Result<(), RegistryError> {
        clear_stranger(path)?;
        let mut options = OpenOptions::new();
        options.write(true).create(true).truncate(false).mode(0o600);
        let mut file = open_regular(path, &mut options).map_err(RegistryError::io(path))?;
        file.set_len(prefix.len).map_err(RegistryError::io(path))?;
        file.seek(SeekFrom::Start(prefix.len))
            .map_err(RegistryError::io(path))?;
        let mut writer = std::io::BufWriter::with_capacity(1 << 20, file);
        self.stream_blob_after_async(reference, digest, size, prefix, &mut writer, progress)
            .await?;
        let file = writer
            .into_inner()
            .map_err(|e| RegistryError::io(path)(e.into_error()))?;
        file.sync_all().map_err(RegistryError::io(path))
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

    #[test]
    fn a_symlinked_partial_is_removed_not_followed() {
        let dir = tempfile::tempdir().unwrap();
        let victim = dir.path().join("victim");
        std::fs::write(&victim, b"precious").unwrap();
        let path = dir.path().join(".partial-x");
        std::os::unix::fs::symlink(&victim, &path).unwrap();
        assert_eq!(resume(&path, "sha256:x", 100).unwrap().len, 0);
        assert!(
            std::fs::symlink_metadata(&path).is_err(),
            "the link is gone"
        );
        assert_eq!(std::fs::read(&victim).unwrap(), b"precious");
        // Planted between the check and the open: O_NOFOLLOW refuses it.
        std::os::unix::fs::symlink(&victim, &path).unwrap();
        let mut options = OpenOptions::new();
        options.write(true).create(true);
        assert!(open_regular(&path, &mut options).is_err());
        assert_eq!(std::fs::read(&victim).unwrap(), b"precious");
        // A directory is refused, naming it.
        std::fs::remove_file(&path).unwrap();
        std::fs::create_dir(&path).unwrap();
        let Err(e) = resume(&path, "sha256:x", 100) else {
            panic!("a directory was taken for a partial file")
        };
        let e = e.to_string();
        assert!(e.contains(".partial-x") && e.contains("directory"), "{e}");
    }
}
