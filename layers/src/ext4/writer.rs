//! Writes a planned image front to back: large positional writes from one buffer, file data read
//! straight into it, gaps (holes, free space) skipped so the output stays sparse. The SHA-256 of
//! the whole image (zeros of the gaps included) is computed on the way, from the buffer while it
//! is still in cache: a 1 MiB buffer read, hashed and written in turn costs less CPU than a
//! hasher thread fed with large buffers, and CPU is what a busy build machine lacks.

use std::fs::File;
use std::os::unix::fs::FileExt;

use sha2::{Digest, Sha256};

use super::layout::{Plan, Segment};
use super::{ProgressFn, BLOCK_SIZE};
use crate::error::LayerError;
use crate::tree::DataSource;

const BUF: usize = 1 << 20;
/// Gaps shorter than this are written as zeros rather than skipped.
const SMALL_GAP: u64 = 256 << 10;

struct Sink<'a> {
    out: &'a File,
    /// Always `BUF` bytes long (filled once, never re-zeroed); `fill` bytes are image data.
    buf: Vec<u8>,
    fill: usize,
    /// Image offset of `buf[0]`.
    pos: u64,
    hasher: Option<Sha256>,
    done: u64,
    total: u64,
    progress: Option<&'a ProgressFn>,
}

impl Sink<'_> {
    fn end(&self) -> u64 {
        self.pos + self.fill as u64
    }

    fn flush(&mut self) -> Result<(), LayerError> {
        if self.fill == 0 {
            return Ok(());
        }
        if let Some(h) = &mut self.hasher {
            h.update(&self.buf[..self.fill]);
        }
        self.out
            .write_all_at(&self.buf[..self.fill], self.pos)
            .map_err(|e| LayerError::io("writing", "the image", e))?;
        self.pos += self.fill as u64;
        self.done += self.fill as u64;
        self.fill = 0;
        if let Some(p) = self.progress {
            p(self.done, self.total);
        }
        Ok(())
    }

    /// Moves the write position forward to `off` (zero-filled or skipped).
    fn seek(&mut self, off: u64) -> Result<(), LayerError> {
        let end = self.end();
        debug_assert!(off >= end, "segments overlap at {off}");
        let gap = off - end;
        if gap == 0 {
            return Ok(());
        }
        if gap <= SMALL_GAP {
            if self.fill + gap as usize > BUF {
                self.flush()?;
            }
            self.buf[self.fill..self.fill + gap as usize].fill(0);
            self.fill += gap as usize;
            return Ok(());
        }
        self.flush()?;
        if let Some(h) = &mut self.hasher {
            // The skipped range reads back as zeros; hash it from a zeroed buffer.
            self.buf.fill(0);
            let mut n = gap;
            while n > 0 {
                let k = n.min(BUF as u64) as usize;
                h.update(&self.buf[..k]);
                n -= k as u64;
            }
        }
        self.pos = off;
        Ok(())
    }

    fn put(&mut self, mut data: &[u8]) -> Result<(), LayerError> {
        while !data.is_empty() {
            let room = BUF - self.fill;
            if room == 0 {
                self.flush()?;
                continue;
            }
            let n = room.min(data.len());
            self.buf[self.fill..self.fill + n].copy_from_slice(&data[..n]);
            self.fill += n;
            data = &data[n..];
        }
        Ok(())
    }

    /// Copies `len` bytes of `src` from `offset` into the image.
    fn copy(
        &mut self,
        src: &File,
        name: &std::path::Path,
        mut offset: u64,
        mut len: u64,
    ) -> Result<(), LayerError> {
        while len > 0 {
            if self.fill == BUF {
                self.flush()?;
            }
            let start = self.fill;
            let n = ((BUF - start) as u64).min(len) as usize;
            let mut got = 0;
            while got < n {
                match src.read_at(&mut self.buf[start + got..start + n], offset + got as u64) {
                    Ok(0) => {
                        return Err(LayerError::FileChanged {
                            path: name.to_path_buf(),
                        })
                    }
                    Ok(k) => got += k,
                    Err(e) if e.kind() == std::io::ErrorKind::Interrupted => {}
                    Err(e) => return Err(LayerError::io("reading", name, e)),
                }
            }
            self.fill += n;
            offset += n as u64;
            len -= n as u64;
        }
        Ok(())
    }
}

/// Writes `plan` into `out`; returns the image's SHA-256 when `digest` is set.
pub(super) fn write(
    out: &File,
    plan: &Plan<'_>,
    digest: bool,
    progress: Option<&ProgressFn>,
) -> Result<Option<[u8; 32]>, LayerError> {
    let total = plan.blocks * BLOCK_SIZE as u64;
    out.set_len(total)
        .map_err(|e| LayerError::io("sizing", "the image", e))?;
    let mut sink = Sink {
        out,
        buf: vec![0u8; BUF],
        fill: 0,
        pos: 0,
        hasher: digest.then(Sha256::new),
        done: 0,
        total: plan.data_bytes,
        progress,
    };
    emit(&mut sink, plan, total)?;
    Ok(sink.hasher.map(|h| h.finalize().into()))
}

fn emit(sink: &mut Sink<'_>, plan: &Plan<'_>, total: u64) -> Result<(), LayerError> {
    let mut open: Option<(u32, File)> = None;
    for seg in &plan.segments {
        match seg {
            Segment::Meta { block, bytes } => {
                sink.seek(block * BLOCK_SIZE as u64)?;
                sink.put(bytes)?;
            }
            Segment::Data {
                block,
                ino,
                source,
                offset,
                len,
            } => {
                sink.seek(block * BLOCK_SIZE as u64)?;
                match source {
                    DataSource::None => {}
                    DataSource::Path(p) => {
                        if open.as_ref().map(|o| o.0) != Some(*ino) {
                            let f = File::open(p).map_err(|e| LayerError::io("opening", p, e))?;
                            open = Some((*ino, f));
                        }
                        let f = &open.as_ref().expect("just opened").1;
                        sink.copy(f, p, *offset, *len)?;
                    }
                    DataSource::Scanned(f) => {
                        if open.as_ref().map(|o| o.0) != Some(*ino) {
                            open = Some((*ino, crate::source::open_scanned(f)?));
                        }
                        let file = &open.as_ref().expect("just opened").1;
                        sink.copy(file, &f.path, *offset, *len)?;
                    }
                    DataSource::Region { file, offset: base } => {
                        sink.copy(&file.file, &file.name, base + offset, *len)?;
                    }
                    DataSource::Bytes(bytes) => {
                        // The plan's ranges come from the same bytes, so they are in bounds.
                        let start = *offset as usize;
                        sink.put(&bytes[start..start + *len as usize])?;
                    }
                }
            }
        }
    }
    sink.seek(total)?;
    sink.flush()
}
