//! The `.deb` cache: one file per package file, named by its SHA-256 (`<64 hex>.deb`), so a
//! locked build finds exactly the bytes stack.lock names, and a file whose bytes do not hash to
//! its name is never used. Files enter through a temporary file in the cache directory renamed
//! into place, so a reader never sees half a file and two builds may fill it at once.

use std::fs::{self, File};
use std::io::{self, Read, Write};
use std::path::{Path, PathBuf};

use sha2::{Digest, Sha256};

/// Why the cache refused a file or an operation.
#[derive(Debug, thiserror::Error)]
pub enum CacheError {
    /// A file operation failed.
    #[error("the .deb cache: {what} {}", path.display())]
    Io {
        /// What was being done.
        what: &'static str,
        /// On which path.
        path: PathBuf,
        /// The error.
        source: io::Error,
    },
    /// A cached file's bytes do not hash to its name (not used; the next insert replaces it).
    #[error("the .deb cache: {} is corrupt: its bytes hash to {actual}", path.display())]
    Corrupt {
        /// The cached file.
        path: PathBuf,
        /// What its bytes hash to.
        actual: String,
    },
}

fn io_err(what: &'static str, path: &Path) -> impl FnOnce(io::Error) -> CacheError {
    let path = path.to_owned();
    move |source| CacheError::Io { what, path, source }
}

/// Whether `s` is a SHA-256 as the cache names files: 64 lowercase hex digits.
pub fn is_sha256_hex(s: &str) -> bool {
    s.len() == 64 && s.bytes().all(|b| matches!(b, b'0'..=b'9' | b'a'..=b'f'))
}

/// Copies `from` to `to` (created; must not exist), returning the SHA-256 of what was copied.
fn copy_hashing(from: &Path, to: &mut File, to_path: &Path) -> Result<String, CacheError> {
    let mut src = File::open(from).map_err(io_err("opening", from))?;
    let mut hasher = Sha256::new();
    let mut buf = vec![0u8; 1 << 20];
    loop {
        let n = src.read(&mut buf).map_err(io_err("reading", from))?;
        if n == 0 {
            break;
        }
        hasher.update(&buf[..n]);
        to.write_all(&buf[..n])
            .map_err(io_err("writing", to_path))?;
    }
    Ok(hex::encode(hasher.finalize()))
}

/// SHA-256 (lowercase hex) of a file's bytes.
pub fn sha256_of(path: &Path) -> Result<String, CacheError> {
    let mut f = File::open(path).map_err(io_err("opening", path))?;
    let mut hasher = Sha256::new();
    io::copy(&mut f, &mut hasher).map_err(io_err("reading", path))?;
    Ok(hex::encode(hasher.finalize()))
}

/// A `.deb` cache directory.
#[derive(Debug, Clone)]
pub struct DebCache {
    dir: PathBuf,
}

impl DebCache {
    /// The cache at `dir`, created if missing.
    pub fn open(dir: &Path) -> Result<Self, CacheError> {
        fs::create_dir_all(dir).map_err(io_err("creating", dir))?;
        Ok(Self {
            dir: dir.to_owned(),
        })
    }

    /// Where the cache is when `--deb-cache` is not given: `$XDG_CACHE_HOME/ingot/debs`, or
    /// `/var/cache/ingot/debs` for root (mmdebstrap's root mode is how ingot runs it), or
    /// `~/.cache/ingot/debs`.
    pub fn default_dir() -> PathBuf {
        if let Some(x) = std::env::var_os("XDG_CACHE_HOME").filter(|v| !v.is_empty()) {
            return PathBuf::from(x).join("ingot/debs");
        }
        let root =
            fs::metadata("/proc/self").is_ok_and(|m| std::os::unix::fs::MetadataExt::uid(&m) == 0);
        if root {
            return PathBuf::from("/var/cache/ingot/debs");
        }
        let home = std::env::var_os("HOME").unwrap_or_else(|| "/".into());
        PathBuf::from(home).join(".cache/ingot/debs")
    }

    /// The directory.
    pub fn dir(&self) -> &Path {
        &self.dir
    }

    /// Where the file with this SHA-256 is (or would be).
    pub fn path_of(&self, sha256: &str) -> PathBuf {
        self.dir.join(format!("{sha256}.deb"))
    }

    /// Stores a copy of `file` under its SHA-256, which is returned. A file already there is
    /// replaced (the bytes are the same, unless the one there was corrupt).
    pub fn insert(&self, file: &Path) -> Result<String, CacheError> {
        let mut tmp = tempfile::Builder::new()
            .prefix(".incoming-")
            .tempfile_in(&self.dir)
            .map_err(io_err("creating a temporary file in", &self.dir))?;
        let tmp_path = tmp.path().to_owned();
        let sha = copy_hashing(file, tmp.as_file_mut(), &tmp_path)?;
        tmp.as_file()
            .sync_all()
            .map_err(io_err("syncing", &tmp_path))?;
        let dest = self.path_of(&sha);
        tmp.persist(&dest)
            .map_err(|e| io_err("renaming into", &dest)(e.error))?;
        Ok(sha)
    }

    /// Puts the cached file with this SHA-256 at `dest` (a hard link, or a copy across file
    /// systems) and checks the bytes there. `Ok(false)`: not cached. A file whose bytes do not
    /// match is refused ([`CacheError::Corrupt`]) and nothing is left at `dest`.
    pub fn place(&self, sha256: &str, dest: &Path) -> Result<bool, CacheError> {
        let src = self.path_of(sha256);
        if !src.is_file() {
            return Ok(false);
        }
        let actual = match fs::hard_link(&src, dest) {
            Ok(()) => sha256_of(dest),
            Err(_) => {
                let mut out = File::create_new(dest).map_err(io_err("creating", dest))?;
                copy_hashing(&src, &mut out, dest)
            }
        };
        match actual {
            Ok(a) if a == sha256 => Ok(true),
            Ok(actual) => {
                let _ = fs::remove_file(dest);
                Err(CacheError::Corrupt { path: src, actual })
            }
            Err(e) => {
                let _ = fs::remove_file(dest);
                Err(e)
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn files_are_named_by_their_hash_and_placed_checked() {
        let dir = tempfile::tempdir().unwrap();
        let cache = DebCache::open(&dir.path().join("debs")).unwrap();
        let src = dir.path().join("hello_1.0_all.deb");
        fs::write(&src, b"not really a deb").unwrap();
        let sha = cache.insert(&src).unwrap();
        // sha256("not really a deb")
        assert_eq!(sha, hex::encode(Sha256::digest(b"not really a deb")));
        assert_eq!(
            cache.path_of(&sha),
            dir.path().join("debs").join(format!("{sha}.deb"))
        );
        // No temporary file is left beside it.
        let names: Vec<_> = fs::read_dir(cache.dir())
            .unwrap()
            .map(|e| e.unwrap().file_name())
            .collect();
        assert_eq!(names, [std::ffi::OsString::from(format!("{sha}.deb"))]);

        let dest = dir.path().join("placed.deb");
        assert!(cache.place(&sha, &dest).unwrap());
        assert_eq!(fs::read(&dest).unwrap(), b"not really a deb");
        let other = "0".repeat(64);
        assert!(!cache.place(&other, &dir.path().join("absent.deb")).unwrap());
    }

    #[test]
    fn a_corrupt_file_is_refused_and_replaced_by_the_next_insert() {
        let dir = tempfile::tempdir().unwrap();
        let cache = DebCache::open(dir.path()).unwrap();
        let src = dir.path().join("x.deb");
        fs::write(&src, b"the real bytes").unwrap();
        let sha = cache.insert(&src).unwrap();
        // Bit rot, or someone's edit: the name no longer matches the bytes.
        fs::write(cache.path_of(&sha), b"the real bytez").unwrap();
        let dest = dir.path().join("out.deb");
        let err = cache.place(&sha, &dest).unwrap_err();
        assert!(matches!(err, CacheError::Corrupt { .. }), "{err}");
        assert!(err.to_string().contains("is corrupt"), "{err}");
        assert!(
            !dest.exists(),
            "nothing is left where the corrupt file was to go"
        );
        assert_eq!(cache.insert(&src).unwrap(), sha);
        assert!(cache.place(&sha, &dest).unwrap());
        assert_eq!(fs::read(&dest).unwrap(), b"the real bytes");
    }

    #[test]
    fn hex_names() {
        assert!(is_sha256_hex(&"a".repeat(64)));
        assert!(!is_sha256_hex(&"A".repeat(64)));
        assert!(!is_sha256_hex(&"a".repeat(63)));
    }
}
