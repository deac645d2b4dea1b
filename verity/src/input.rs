//! Opening and reading the local files a command is given (layout blobs, `index.json`,
//! bootstrap data, trusted keys, tree sources) so that a hostile path cannot hang or exhaust
//! the process: only regular files are read (a FIFO cannot hang the open, `/dev/zero` is
//! refused before a byte is read), and never more than a limit plus one byte.
//!
//! It lives in the lowest crate: every crate that reads such a file (layers, artifact, the
//! builder, the writer) depends on this one, so there is one copy of the rules.

use std::fs::{File, OpenOptions};
use std::io::{self, Read};
use std::os::unix::fs::{FileTypeExt, OpenOptionsExt};
use std::path::Path;

use rustix::fs::OFlags;

/// Whether the last component of a path may be a symbolic link.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Symlinks {
    /// Follow it (a path the user named, such as a bootstrap data file); the target must still
    /// be a regular file.
    Follow,
    /// Refuse it (`O_NOFOLLOW`): a file found by a scan, which must be the file scanned.
    Refuse,
}

/// Why a local input was refused. Carried inside the [`io::Error`] the functions here return,
/// so callers keep their `Io { path, source }` variants and the cause stays typed.
#[derive(Debug, thiserror::Error)]
pub enum InputError {
    /// Not a regular file.
    #[error("not a regular file: it is {kind}")]
    NotRegular {
        /// `a FIFO`, `a character device`, ...
        kind: &'static str,
    },
    /// A symbolic link where none is followed.
    #[error("it is a symbolic link, which is not followed here")]
    Symlink,
    /// Larger than the limit; `size` is what fstat said, or the limit plus one when it grew
    /// while being read.
    #[error("it has {size} bytes, more than the {limit} accepted")]
    TooLarge {
        /// The size found.
        size: u64,
        /// The most accepted.
        limit: u64,
    },
}

impl From<InputError> for io::Error {
    fn from(e: InputError) -> io::Error {
        let kind = match e {
            InputError::TooLarge { .. } => io::ErrorKind::FileTooLarge,
            _ => io::ErrorKind::InvalidInput,
        };
        io::Error::new(kind, e)
    }
}

/// The [`InputError`] inside `e`, if it is one of ours.
pub fn input_error(e: &io::Error) -> Option<&InputError> {
    e.get_ref()?.downcast_ref()
}

fn kind_of(ft: std::fs::FileType) -> &'static str {
    if ft.is_dir() {
        "a directory"
    } else if ft.is_fifo() {
        "a FIFO"
    } else if ft.is_char_device() {
        "a character device"
    } else if ft.is_block_device() {
        "a block device"
    } else if ft.is_socket() {
        "a socket"
    } else if ft.is_symlink() {
        "a symbolic link"
    } else {
        "not a file"
    }
}

/// Opens `path` for reading if it is a regular file. `O_NONBLOCK` keeps a FIFO from blocking
/// the open (it is then refused by fstat, and the flag cleared on the file kept).
pub fn open_regular(path: &Path, symlinks: Symlinks) -> io::Result<File> {
    let mut flags = OFlags::NONBLOCK | OFlags::NOCTTY;
    if symlinks == Symlinks::Refuse {
        flags |= OFlags::NOFOLLOW;
    }
    let file = match OpenOptions::new()
        .read(true)
        .custom_flags(flags.bits() as i32)
        .open(path)
    {
        Ok(f) => f,
        // O_NOFOLLOW on a symlink fails with ELOOP.
        Err(e)
            if symlinks == Symlinks::Refuse
                && e.raw_os_error() == Some(rustix::io::Errno::LOOP.raw_os_error()) =>
        {
            return Err(InputError::Symlink.into())
        }
        Err(e) => return Err(e),
    };
    let ft = file.metadata()?.file_type();
    if !ft.is_file() {
        return Err(InputError::NotRegular { kind: kind_of(ft) }.into());
    }
    let fl = rustix::fs::fcntl_getfl(&file)?;
    rustix::fs::fcntl_setfl(&file, fl - OFlags::NONBLOCK)?;
    Ok(file)
}

/// Reads the regular file `path` whole, refusing one of more than `limit` bytes: by its size
/// before anything is read, and by reading at most `limit + 1` bytes in case it grows.
pub fn read_bounded(path: &Path, limit: u64, symlinks: Symlinks) -> io::Result<Vec<u8>> {
    let file = open_regular(path, symlinks)?;
    read_file_bounded(file, limit)
}

/// [`read_bounded`] on a file already opened with [`open_regular`].
pub fn read_file_bounded(file: File, limit: u64) -> io::Result<Vec<u8>> {
    let size = file.metadata()?.len();
    if size > limit {
        return Err(InputError::TooLarge { size, limit }.into());
    }
    let mut bytes = Vec::with_capacity(size as usize);
    file.take(limit.saturating_add(1)).read_to_end(&mut bytes)?;
    if bytes.len() as u64 > limit {
        return Err(InputError::TooLarge {
            size: bytes.len() as u64,
            limit,
        }
        .into());
    }
    Ok(bytes)
}

/// [`read_bounded`] as UTF-8 text.
pub fn read_text_bounded(path: &Path, limit: u64, symlinks: Symlinks) -> io::Result<String> {
    String::from_utf8(read_bounded(path, limit, symlinks)?)
        .map_err(|e| io::Error::new(io::ErrorKind::InvalidData, e))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn refuses_devices_fifos_symlinks_and_large_files() {
        let dir = tempfile::tempdir().unwrap();
        let e = read_bounded(Path::new("/dev/zero"), 10, Symlinks::Follow).unwrap_err();
        assert!(
            matches!(
                input_error(&e),
                Some(InputError::NotRegular {
                    kind: "a character device"
                })
            ),
            "{e}"
        );
        let fifo = dir.path().join("fifo");
        rustix::fs::mkfifoat(
            rustix::fs::CWD,
            &fifo,
            rustix::fs::Mode::from_raw_mode(0o600),
        )
        .unwrap();
        // With no writer a blocking open would hang here.
        let e = read_bounded(&fifo, 10, Symlinks::Follow).unwrap_err();
        assert!(e.to_string().contains("a FIFO"), "{e}");
        let link = dir.path().join("link");
        std::os::unix::fs::symlink("/dev/zero", &link).unwrap();
        let e = read_bounded(&link, 10, Symlinks::Follow).unwrap_err();
        assert!(e.to_string().contains("character device"), "{e}");
        let file = dir.path().join("file");
        std::fs::write(&file, b"0123456789ab").unwrap();
        std::os::unix::fs::symlink(&file, dir.path().join("flink")).unwrap();
        let e = read_bounded(&dir.path().join("flink"), 100, Symlinks::Refuse).unwrap_err();
        assert!(matches!(input_error(&e), Some(InputError::Symlink)), "{e}");
        let e = read_bounded(&file, 11, Symlinks::Follow).unwrap_err();
        assert!(
            matches!(
                input_error(&e),
                Some(InputError::TooLarge {
                    size: 12,
                    limit: 11
                })
            ),
            "{e}"
        );
        assert_eq!(
            read_bounded(&file, 12, Symlinks::Refuse).unwrap(),
            b"0123456789ab"
        );
    }
}
