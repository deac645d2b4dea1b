//! A read-only window on a disk, the one way the guard reads a disk: positional reads only.

use std::fs::File;
use std::io::{self, Read, Seek, SeekFrom, Write};
use std::os::unix::fs::FileExt;
use std::sync::Arc;

/// A read-only window `[start, start + len)` on a disk. It implements `Write` only because the
/// `gpt` and `fatfs` crates demand it; every write fails, so nothing here can change a disk.
#[derive(Debug, Clone)]
pub struct Slice {
    file: Arc<File>,
    start: u64,
    len: u64,
    pos: u64,
}

impl Slice {
    /// The whole of `file` (opened read-only by the caller), `len` bytes long.
    pub fn whole(file: Arc<File>, len: u64) -> Self {
        Slice {
            file,
            start: 0,
            len,
            pos: 0,
        }
    }

    /// The part of this slice from `offset`, `len` bytes long (clamped to this slice).
    pub fn sub(&self, offset: u64, len: u64) -> Self {
        let offset = offset.min(self.len);
        Slice {
            file: self.file.clone(),
            start: self.start + offset,
            len: len.min(self.len - offset),
            pos: 0,
        }
    }

    /// Length in bytes.
    pub fn len(&self) -> u64 {
        self.len
    }

    /// Zero bytes long.
    pub fn is_empty(&self) -> bool {
        self.len == 0
    }

    /// Read exactly `buf.len()` bytes at `offset` within the slice.
    pub fn read_at(&self, offset: u64, buf: &mut [u8]) -> io::Result<()> {
        if offset
            .checked_add(buf.len() as u64)
            .is_none_or(|end| end > self.len)
        {
            return Err(io::Error::new(
                io::ErrorKind::UnexpectedEof,
                "read past the region's end",
            ));
        }
        self.file.read_exact_at(buf, self.start + offset)
    }

    /// `len` bytes at `offset`, or `None` when the region is too small or the read fails.
    pub fn bytes(&self, offset: u64, len: usize) -> Option<Vec<u8>> {
        let mut buf = vec![0; len];
        self.read_at(offset, &mut buf).ok()?;
        Some(buf)
    }
}

impl Read for Slice {
    fn read(&mut self, buf: &mut [u8]) -> io::Result<usize> {
        let n = (self.len.saturating_sub(self.pos)).min(buf.len() as u64) as usize;
        if n == 0 {
            return Ok(0);
        }
        self.file
            .read_exact_at(&mut buf[..n], self.start + self.pos)?;
        self.pos += n as u64;
        Ok(n)
    }
}

impl Seek for Slice {
    fn seek(&mut self, to: SeekFrom) -> io::Result<u64> {
        let new = match to {
            SeekFrom::Start(p) => Some(p),
            SeekFrom::End(d) => self.len.checked_add_signed(d),
            SeekFrom::Current(d) => self.pos.checked_add_signed(d),
        };
        self.pos = new.ok_or_else(|| io::Error::new(io::ErrorKind::InvalidInput, "bad seek"))?;
        Ok(self.pos)
    }
}

impl Write for Slice {
    fn write(&mut self, _: &[u8]) -> io::Result<usize> {
        Err(io::Error::new(
            io::ErrorKind::PermissionDenied,
            "the guard never writes to a disk",
        ))
    }

    fn flush(&mut self) -> io::Result<()> {
        Ok(())
    }
}

impl ext4_view::Ext4Read for Slice {
    fn read(
        &mut self,
        start_byte: u64,
        dst: &mut [u8],
    ) -> Result<(), Box<dyn std::error::Error + Send + Sync + 'static>> {
        Ok(self.read_at(start_byte, dst)?)
    }
}
