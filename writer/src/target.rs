//! The disk being written: a block device or an image file, opened for O_DIRECT I/O (with the
//! machine crate's aligned buffers), and the ways to make a range read as zeros cheaply.

#![allow(unsafe_code)]

use std::fs::{File, OpenOptions};
use std::io::{Seek, SeekFrom};
use std::os::fd::AsRawFd;
use std::os::unix::fs::{FileExt, FileTypeExt, MetadataExt, OpenOptionsExt};
use std::path::{Path, PathBuf};

pub use ingot_machine::aligned::{AlignedBuf, ALIGN};

#[derive(Debug, thiserror::Error)]
pub enum TargetError {
    #[error("{path}: {what}")]
    Io {
        path: PathBuf,
        what: String,
        source: std::io::Error,
    },
    #[error("{path} is neither a block device nor a regular file")]
    Kind { path: PathBuf },
    #[error(
        "{path} is locked by another process (another ingot-writer writing it?): refusing to \
         write it at the same time; nothing was written"
    )]
    Locked { path: PathBuf },
    #[error("{path} is read-only ({why}): refusing to write it; nothing was written")]
    ReadOnly { path: PathBuf, why: &'static str },
    #[error(
        "{path} was deleted or replaced while it was being written: what was written is gone \
         with it"
    )]
    Gone { path: PathBuf },
    #[error("{path} is {size} bytes: not a whole number of {sector}-byte sectors")]
    Unaligned {
        path: PathBuf,
        size: u64,
        sector: u32,
    },
}

/// How the target can be made to read zeros without writing every byte.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Zeroing {
    /// Punch a hole in the image file.
    PunchHole,
    /// BLKZEROOUT on a device that advertises hardware write-zeroes (or a loop device, which
    /// turns it into a hole in its backing file).
    WriteZeroes,
    /// Nothing cheap: zero blocks must be written.
    None,
}

/// An open target disk.
pub struct Target {
    path: PathBuf,
    direct: File,
    buffered: File,
    size: u64,
    sector: u32,
    block_device: bool,
    zeroing: Zeroing,
}

const BLKZEROOUT: libc::Ioctl = 0x127f; // _IO(0x12, 127)
const BLKRRPART: libc::Ioctl = 0x125f; // _IO(0x12, 95)
const BLKROGET: libc::Ioctl = 0x125e; // _IO(0x12, 94)

/// How [`Target::open_with`] opens the target.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Access {
    /// Read and write: a real run.
    Write,
    /// Read only, with every check a write would pass (exclusive, locked, writable): a dry run.
    Probe,
}

impl Target {
    /// Opens `path` for reading and writing, O_DIRECT. A block device is opened O_EXCL, which
    /// the kernel refuses while it (or a partition of it) is mounted or held; any target is
    /// locked (`flock`, exclusive) until the `Target` is dropped, so a second writer is refused.
    pub fn open(path: &Path) -> Result<Target, TargetError> {
        Self::open_with(path, Access::Write)
    }

    /// Opens `path` read-only, with the checks [`Target::open`] makes (exclusive, locked, and
    /// writable: not a read-only device, file or filesystem) but without opening it for writing,
    /// which would make the kernel rescan a device's partitions when it is closed: a dry run.
    pub fn probe(path: &Path) -> Result<Target, TargetError> {
        Self::open_with(path, Access::Probe)
    }

    fn open_with(path: &Path, access: Access) -> Result<Target, TargetError> {
        let writable = access == Access::Write;
        let io = |what: &str| {
            let what = what.to_string();
            let path = path.to_path_buf();
            move |source| TargetError::Io { path, what, source }
        };
        let meta = std::fs::metadata(path).map_err(io("reading metadata"))?;
        let block_device = meta.file_type().is_block_device();
        if !block_device && !meta.file_type().is_file() {
            return Err(TargetError::Kind {
                path: path.to_path_buf(),
            });
        }
        let mut flags = libc::O_DIRECT;
        if block_device {
            flags |= libc::O_EXCL;
        }
        if !block_device {
            // An immutable file, a read-only filesystem, or (for anyone but root) no write
            // permission: refused here rather than at the first write.
            writable_file(path)?;
        }
        let mut direct = OpenOptions::new()
            .read(true)
            .write(writable)
            .custom_flags(flags)
            .open(path)
            .map_err(io("opening for direct I/O (is it mounted or in use?)"))?;
        // One writer per target for the whole run: an exclusive lock on the open file, held
        // until the Target is dropped. O_EXCL guards a block device against mounts; the lock
        // also covers an image file, and a device opened by another ingot-writer.
        match rustix::fs::flock(
            &direct,
            rustix::fs::FlockOperation::NonBlockingLockExclusive,
        ) {
            Ok(()) => {}
            Err(rustix::io::Errno::WOULDBLOCK) => {
                return Err(TargetError::Locked {
                    path: path.to_path_buf(),
                })
            }
            Err(e) => return Err(io("locking")(e.into())),
        }
        if block_device {
            writable_device(path, &direct)?;
        }
        let buffered = OpenOptions::new()
            .read(true)
            .write(writable)
            .open(path)
            .map_err(io("opening"))?;
        let size = direct
            .seek(SeekFrom::End(0))
            .map_err(io("measuring size"))?;
        let sector = if block_device {
            rustix::fs::ioctl_blksszget(&direct)
                .map_err(|e| io("reading the logical sector size")(e.into()))?
        } else {
            512
        };
        if size % sector as u64 != 0 {
            return Err(TargetError::Unaligned {
                path: path.to_path_buf(),
                size,
                sector,
            });
        }
        let zeroing = if !block_device {
            Zeroing::PunchHole
        } else if write_zeroes_supported(meta.rdev()) {
            Zeroing::WriteZeroes
        } else {
            Zeroing::None
        };
        Ok(Target {
            path: path.to_path_buf(),
            direct,
            buffered,
            size,
            sector,
            block_device,
            zeroing,
        })
    }

    pub fn path(&self) -> &Path {
        &self.path
    }

    pub fn size(&self) -> u64 {
        self.size
    }

    pub fn sector_size(&self) -> u32 {
        self.sector
    }

    pub fn is_block_device(&self) -> bool {
        self.block_device
    }

    fn err(&self, what: String) -> impl FnOnce(std::io::Error) -> TargetError + '_ {
        move |source| TargetError::Io {
            path: self.path.clone(),
            what,
            source,
        }
    }

    /// O_DIRECT write: `offset` and `buf.len()` must be multiples of [`ALIGN`].
    pub fn write_direct(&self, buf: &[u8], offset: u64) -> Result<(), TargetError> {
        debug_assert!(offset % ALIGN as u64 == 0 && buf.len() % ALIGN == 0);
        self.direct
            .write_all_at(buf, offset)
            .map_err(self.err(format!("writing {} bytes at {offset}", buf.len())))
    }

    /// O_DIRECT read, bypassing the page cache: what the disk holds, not what we wrote.
    pub fn read_direct(&self, buf: &mut [u8], offset: u64) -> Result<(), TargetError> {
        debug_assert!(offset % ALIGN as u64 == 0 && buf.len() % ALIGN == 0);
        let len = buf.len();
        self.direct
            .read_exact_at(buf, offset)
            .map_err(self.err(format!("reading {len} bytes at {offset}")))
    }

    /// Buffered write of a few sectors (partition tables, signatures).
    pub fn write_small(&self, buf: &[u8], offset: u64) -> Result<(), TargetError> {
        self.buffered
            .write_all_at(buf, offset)
            .map_err(self.err(format!("writing {} bytes at {offset}", buf.len())))
    }

    /// Buffered read (partition tables, boot files).
    pub fn read_small(&self, buf: &mut [u8], offset: u64) -> Result<(), TargetError> {
        let len = buf.len();
        self.buffered
            .read_exact_at(buf, offset)
            .map_err(self.err(format!("reading {len} bytes at {offset}")))
    }

    /// A second buffered handle, for the `gpt` crate which wants to own a `Read + Write + Seek`.
    pub fn clone_buffered(&self) -> Result<File, TargetError> {
        self.buffered
            .try_clone()
            .map_err(self.err("duplicating the file handle".into()))
    }

    /// Makes `[offset, offset + len)` read as zeros without writing it, when the target can.
    /// Returns false when it cannot: the caller must then write every block, zeros included.
    pub fn zero_range(&self, offset: u64, len: u64) -> Result<bool, TargetError> {
        if len == 0 {
            return Ok(true);
        }
        match self.zeroing {
            Zeroing::PunchHole => {
                use rustix::fs::{fallocate, FallocateFlags};
                match fallocate(
                    &self.direct,
                    FallocateFlags::PUNCH_HOLE | FallocateFlags::KEEP_SIZE,
                    offset,
                    len,
                ) {
                    Ok(()) => Ok(true),
                    Err(rustix::io::Errno::OPNOTSUPP) => Ok(false),
                    Err(e) => Err(self.err(format!("punching a hole at {offset}+{len}"))(
                        e.into(),
                    )),
                }
            }
            Zeroing::WriteZeroes => {
                let range: [u64; 2] = [offset, len];
                // SAFETY: BLKZEROOUT reads a [u64; 2] {start, length}; the fd is a block device.
                let rc =
                    unsafe { libc::ioctl(self.direct.as_raw_fd(), BLKZEROOUT, range.as_ptr()) };
                if rc == 0 {
                    Ok(true)
                } else {
                    let e = std::io::Error::last_os_error();
                    tracing::warn!(
                        "{}: BLKZEROOUT failed ({e}); writing zero blocks instead",
                        self.path.display()
                    );
                    Ok(false)
                }
            }
            Zeroing::None => Ok(false),
        }
    }

    /// Fails when the path no longer names the file being written (deleted, or replaced by
    /// another), so a run never reports as written a disk nobody can reach.
    pub fn check_still_named(&self) -> Result<(), TargetError> {
        let gone = || TargetError::Gone {
            path: self.path.clone(),
        };
        let open = self
            .direct
            .metadata()
            .map_err(self.err("reading metadata".into()))?;
        if open.nlink() == 0 {
            return Err(gone());
        }
        match std::fs::metadata(&self.path) {
            Ok(named) if named.dev() == open.dev() && named.ino() == open.ino() => Ok(()),
            Ok(_) => Err(gone()),
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => Err(gone()),
            Err(e) => Err(self.err("reading metadata".into())(e)),
        }
    }

    /// Flushes what the O_DIRECT handle wrote to stable storage (the device's write cache
    /// included).
    pub fn flush_data(&self) -> Result<(), TargetError> {
        self.direct.sync_data().map_err(self.err("flushing".into()))
    }

    /// Flushes everything written to stable storage.
    pub fn sync(&self) -> Result<(), TargetError> {
        self.direct.sync_all().map_err(self.err("syncing".into()))?;
        self.buffered.sync_all().map_err(self.err("syncing".into()))
    }

    /// Asks the kernel to re-read the partition table (block devices only; a loop device needs
    /// partition scanning enabled, `losetup -P`). Failure is reported, not fatal: the table on
    /// disk is what the next boot reads.
    pub fn reread_partitions(&self) {
        if !self.block_device {
            return;
        }
        // SAFETY: BLKRRPART takes no argument.
        let rc = unsafe { libc::ioctl(self.buffered.as_raw_fd(), BLKRRPART, 0) };
        if rc != 0 {
            tracing::info!(
                "{}: the kernel did not re-read the partition table ({})",
                self.path.display(),
                std::io::Error::last_os_error()
            );
        }
    }
}

/// Refuses a block device the kernel marks read-only (`BLKROGET`: `blockdev --setro`, a
/// write-protected medium, `losetup -r`); opening it for writing succeeds, the first write fails.
fn writable_device(path: &Path, file: &File) -> Result<(), TargetError> {
    let mut ro: libc::c_int = 0;
    // SAFETY: BLKROGET writes one int through the pointer; the fd is a block device.
    let rc = unsafe { libc::ioctl(file.as_raw_fd(), BLKROGET, &mut ro as *mut libc::c_int) };
    if rc != 0 {
        return Err(TargetError::Io {
            path: path.to_path_buf(),
            what: "asking whether it is read-only (BLKROGET)".into(),
            source: std::io::Error::last_os_error(),
        });
    }
    if ro != 0 {
        return Err(TargetError::ReadOnly {
            path: path.to_path_buf(),
            why: "the kernel marks the device read-only (BLKROGET)",
        });
    }
    Ok(())
}

/// Refuses an image file that cannot be written: `access(W_OK)` fails for an immutable file and
/// on a read-only filesystem even for root.
fn writable_file(path: &Path) -> Result<(), TargetError> {
    match rustix::fs::access(path, rustix::fs::Access::WRITE_OK) {
        Ok(()) => Ok(()),
        Err(e) => Err(TargetError::ReadOnly {
            path: path.to_path_buf(),
            why: match e {
                rustix::io::Errno::ROFS => "on a read-only filesystem",
                rustix::io::Errno::PERM => "an immutable file",
                _ => "no write permission",
            },
        }),
    }
}

/// True when the block device behind `rdev` advertises write-zeroes offload in sysfs.
fn write_zeroes_supported(rdev: u64) -> bool {
    let (major, minor) = (libc::major(rdev), libc::minor(rdev));
    let path = format!("/sys/dev/block/{major}:{minor}/queue/write_zeroes_max_bytes");
    std::fs::read_to_string(path)
        .ok()
        .and_then(|s| s.trim().parse::<u64>().ok())
        .is_some_and(|n| n > 0)
}
