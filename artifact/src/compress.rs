//! zstd in independent frames.
//!
//! A layer image is cut into frames of `frame_size` input bytes (the last one may be shorter);
//! each frame is compressed on its own, in parallel, and the frames are concatenated. The result
//! is an ordinary zstd stream (`zstd -d` reads it), and because no frame refers to another, a
//! reader can decompress frames in parallel or resume a download at any frame boundary.
//!
//! Each frame is compressed single-threaded at a fixed level, so the output does not depend on
//! the number of cores: the same image gives the same bytes.

use std::fs::File;
use std::io::{self, Read, Write};
use std::path::Path;

use rayon::prelude::*;
use sha2::{Digest, Sha256};

/// Default uncompressed bytes per frame.
pub const DEFAULT_FRAME_SIZE: usize = 4 << 20;
/// Default zstd level.
pub const DEFAULT_LEVEL: i32 = 3;

/// What compressing a file gave.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Compressed {
    /// `sha256:<hex>` of the compressed bytes.
    pub digest: String,
    /// Compressed size.
    pub size: u64,
    /// Uncompressed size.
    pub input_size: u64,
    /// Compressed size of each frame, in order (the descriptor's frame index).
    pub frames: Vec<u64>,
}

/// Why a blob does not decompress to what the descriptor says.
#[derive(Debug, thiserror::Error)]
pub enum FrameError {
    /// Reading or writing failed.
    #[error(transparent)]
    Io(#[from] io::Error),
    /// A frame header or body is damaged.
    #[error("frame {index} at byte {offset} is not a valid zstd frame: {reason}")]
    Corrupt {
        /// 0-based frame index.
        index: u64,
        /// Byte offset of the frame in the compressed blob.
        offset: u64,
        /// What zstd said.
        reason: String,
    },
    /// A frame decompressed to a size other than the frame size.
    #[error("frame {index} holds {got} bytes, expected {want}")]
    FrameSize {
        /// 0-based frame index.
        index: u64,
        /// Bytes it held.
        got: u64,
        /// Bytes it should hold.
        want: u64,
    },
    /// Reading the blob failed.
    #[error("reading the blob")]
    Read(#[source] io::Error),
    /// The blob ended before its size while it was read.
    #[error(
        "the blob ended at byte {at} while it was read, {size} bytes were expected (it shrank)"
    )]
    Shrank {
        /// Where it ended.
        at: u64,
        /// Its size when opened.
        size: u64,
    },
    /// The frames add up to another size than the image size.
    #[error("the frames hold {got} bytes, the image is {want} bytes")]
    TotalSize {
        /// Bytes the frames held.
        got: u64,
        /// Bytes the descriptor gives.
        want: u64,
    },
}

/// Compress `input` into `output` in independent frames; `progress` is called with the number
/// of input bytes done after every batch.
pub fn compress_file(
    input: &Path,
    output: &Path,
    frame_size: usize,
    level: i32,
    progress: &(dyn Fn(u64) + Sync),
) -> io::Result<Compressed> {
    assert!(frame_size > 0, "frame size must not be 0");
    let mut reader = File::open(input)?;
    let mut writer = io::BufWriter::new(File::create(output)?);
    let mut hasher = Sha256::new();
    let batch_frames = rayon::current_num_threads().max(1) * 2;
    let (mut size, mut input_size) = (0u64, 0u64);
    let mut sizes = Vec::new();
    loop {
        let mut frames = Vec::with_capacity(batch_frames);
        for _ in 0..batch_frames {
            let mut buf = Vec::with_capacity(frame_size);
            (&mut reader)
                .take(frame_size as u64)
                .read_to_end(&mut buf)?;
            if buf.is_empty() {
                break;
            }
            let last = buf.len() < frame_size;
            frames.push(buf);
            if last {
                break;
            }
        }
        if frames.is_empty() {
            break;
        }
        let done = frames.len() < batch_frames || frames.last().map(Vec::len) != Some(frame_size);
        let compressed: Vec<Vec<u8>> = frames
            .par_iter()
            .map(|f| zstd::bulk::compress(f, level))
            .collect::<io::Result<_>>()?;
        for (raw, c) in frames.iter().zip(&compressed) {
            hasher.update(c);
            writer.write_all(c)?;
            size += c.len() as u64;
            input_size += raw.len() as u64;
            sizes.push(c.len() as u64);
        }
        progress(input_size);
        if done {
            break;
        }
    }
    writer.flush()?;
    writer
        .into_inner()
        .map_err(|e| e.into_error())?
        .sync_all()?;
    Ok(Compressed {
        digest: format!("sha256:{}", hex::encode(hasher.finalize())),
        size,
        input_size,
        frames: sizes,
    })
}

/// Split a blob of concatenated zstd frames into its frames.
pub fn split_frames(blob: &[u8]) -> Result<Vec<&[u8]>, FrameError> {
    let mut frames = Vec::new();
    let mut offset = 0usize;
    while offset < blob.len() {
        let len = zstd::zstd_safe::find_frame_compressed_size(&blob[offset..]).map_err(|code| {
            FrameError::Corrupt {
                index: frames.len() as u64,
                offset: offset as u64,
                reason: zstd::zstd_safe::get_error_name(code).to_owned(),
            }
        })?;
        frames.push(&blob[offset..offset + len]);
        offset += len;
    }
    Ok(frames)
}

/// Decompress a blob made by [`compress_file`] into `out`, frames in parallel, checking that
/// every frame but the last holds exactly `frame_size` bytes and that they add up to
/// `image_size`. Returns the number of bytes written.
pub fn decompress_frames(
    blob: &[u8],
    frame_size: u64,
    image_size: u64,
    out: &mut dyn Write,
) -> Result<u64, FrameError> {
    let frames = split_frames(blob)?;
    let mut sink = FrameSink::new(frame_size, image_size, out);
    let mut at = 0u64;
    for chunk in frames.chunks(FrameSink::batch()) {
        let mut batch = Vec::with_capacity(chunk.len());
        for f in chunk {
            batch.push((at, *f));
            at += f.len() as u64;
        }
        sink.put(&batch)?;
    }
    sink.finish()
}

/// [`decompress_frames`] on the blob in `file` (`blob_size` bytes), read with `pread` a batch
/// of frames at a time instead of mapped: a blob that shrinks while it is read is an error
/// ([`FrameError::Shrank`]), not a SIGBUS.
pub fn decompress_frames_file(
    file: &File,
    blob_size: u64,
    frame_size: u64,
    image_size: u64,
    out: &mut dyn Write,
) -> Result<u64, FrameError> {
    use std::os::unix::fs::FileExt;
    // ZSTD_compressBound: no frame of `frame_size` input bytes is larger.
    let bound =
        frame_size + frame_size / 255 + 64 + ((128 << 10) as u64).saturating_sub(frame_size) / 2048;
    let mut sink = FrameSink::new(frame_size, image_size, out);
    // Compressed bytes read but not yet cut into frames start at `buf[0]`, blob offset `at`.
    let mut buf: Vec<u8> = Vec::new();
    let (mut at, mut read) = (0u64, 0u64);
    while at < blob_size {
        let mut frames: Vec<(u64, std::ops::Range<usize>)> = Vec::new();
        let mut pos = 0usize;
        while frames.len() < FrameSink::batch() && at + (pos as u64) < blob_size {
            // Enough bytes for the largest frame (or the rest of the blob) after `pos`.
            let want = (pos as u64 + bound).min(blob_size - at) as usize;
            if buf.len() < want {
                let old = buf.len();
                buf.resize(want, 0);
                let mut got = old;
                while got < want {
                    match file.read_at(&mut buf[got..], read) {
                        Ok(0) => {
                            return Err(FrameError::Shrank {
                                at: read,
                                size: blob_size,
                            })
                        }
                        Ok(n) => {
                            got += n;
                            read += n as u64;
                        }
                        Err(e) if e.kind() == io::ErrorKind::Interrupted => {}
                        Err(e) => return Err(FrameError::Read(e)),
                    }
                }
            }
            let len =
                zstd::zstd_safe::find_frame_compressed_size(&buf[pos..want]).map_err(|code| {
                    FrameError::Corrupt {
                        index: (sink.frames + frames.len()) as u64,
                        offset: at + pos as u64,
                        reason: zstd::zstd_safe::get_error_name(code).to_owned(),
                    }
                })?;
            frames.push((at + pos as u64, pos..pos + len));
            pos += len;
        }
        let batch: Vec<(u64, &[u8])> = frames.iter().map(|(o, r)| (*o, &buf[r.clone()])).collect();
        sink.put(&batch)?;
        buf.drain(..pos);
        at += pos as u64;
    }
    sink.finish()
}

/// Decompresses batches of frames in parallel and writes them in order, with the size checks.
struct FrameSink<'o> {
    frame_size: u64,
    image_size: u64,
    want_frames: u64,
    /// Frames written so far.
    frames: usize,
    written: u64,
    out: &'o mut dyn Write,
}

impl<'o> FrameSink<'o> {
    fn new(frame_size: u64, image_size: u64, out: &'o mut dyn Write) -> Self {
        FrameSink {
            frame_size,
            image_size,
            want_frames: image_size.div_ceil(frame_size),
            frames: 0,
            written: 0,
            out,
        }
    }

    /// Frames decompressed at once: two per thread.
    fn batch() -> usize {
        rayon::current_num_threads().max(1) * 2
    }

    /// The next frames, each with its offset in the blob.
    fn put(&mut self, batch: &[(u64, &[u8])]) -> Result<(), FrameError> {
        let (first, frame_size, want_frames, image_size) = (
            self.frames,
            self.frame_size,
            self.want_frames,
            self.image_size,
        );
        let results: Vec<Result<Vec<u8>, FrameError>> = batch
            .par_iter()
            .enumerate()
            .map(|(i, (offset, frame))| {
                let index = (first + i) as u64;
                let want = if index + 1 < want_frames {
                    frame_size
                } else {
                    image_size.saturating_sub(index * frame_size)
                };
                // Never allocate more than one frame, whatever the header claims.
                let cap = frame_size.min(usize::MAX as u64) as usize;
                let data = zstd::bulk::decompress(frame, cap).map_err(|e| FrameError::Corrupt {
                    index,
                    offset: *offset,
                    reason: e.to_string(),
                })?;
                if index < want_frames && data.len() as u64 != want {
                    return Err(FrameError::FrameSize {
                        index,
                        got: data.len() as u64,
                        want,
                    });
                }
                Ok(data)
            })
            .collect();
        self.frames += batch.len();
        for r in results {
            let data = r?;
            self.written += data.len() as u64;
            if self.written > image_size {
                return Err(FrameError::TotalSize {
                    got: self.written,
                    want: image_size,
                });
            }
            self.out.write_all(&data)?;
        }
        Ok(())
    }

    fn finish(self) -> Result<u64, FrameError> {
        if self.written != self.image_size {
            return Err(FrameError::TotalSize {
                got: self.written,
                want: self.image_size,
            });
        }
        Ok(self.written)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn sample(len: usize) -> Vec<u8> {
        (0..len).map(|i| ((i * 7) ^ (i >> 9)) as u8).collect()
    }

    #[test]
    fn frames_round_trip_and_are_independent() {
        let dir = tempfile::tempdir().unwrap();
        let input = dir.path().join("in");
        let data = sample(10 * 1000 + 17);
        std::fs::write(&input, &data).unwrap();
        let out = dir.path().join("out.zst");
        let c = compress_file(&input, &out, 1000, 3, &|_| {}).unwrap();
        assert_eq!(c.input_size, data.len() as u64);
        let blob = std::fs::read(&out).unwrap();
        assert_eq!(blob.len() as u64, c.size);
        assert_eq!(split_frames(&blob).unwrap().len(), 11);
        // An ordinary zstd reader reads the concatenation.
        assert_eq!(zstd::stream::decode_all(&blob[..]).unwrap(), data);
        let mut back = Vec::new();
        decompress_frames(&blob, 1000, data.len() as u64, &mut back).unwrap();
        assert_eq!(back, data);
        // Same input, same bytes.
        let out2 = dir.path().join("out2.zst");
        assert_eq!(compress_file(&input, &out2, 1000, 3, &|_| {}).unwrap(), c);
    }

    #[test]
    fn damage_is_named() {
        let dir = tempfile::tempdir().unwrap();
        let input = dir.path().join("in");
        let data = sample(5000);
        std::fs::write(&input, &data).unwrap();
        let out = dir.path().join("out.zst");
        compress_file(&input, &out, 1000, 3, &|_| {}).unwrap();
        let blob = std::fs::read(&out).unwrap();
        // Wrong frame size claimed.
        let err = decompress_frames(&blob, 2000, 5000, &mut Vec::new()).unwrap_err();
        assert!(
            matches!(err, FrameError::FrameSize { index: 0, .. }),
            "{err}"
        );
        // Wrong image size claimed.
        let err = decompress_frames(&blob, 1000, 6000, &mut Vec::new()).unwrap_err();
        assert!(matches!(err, FrameError::TotalSize { .. }), "{err}");
        // Truncated.
        let err =
            decompress_frames(&blob[..blob.len() - 3], 1000, 5000, &mut Vec::new()).unwrap_err();
        assert!(matches!(err, FrameError::Corrupt { index: 4, .. }), "{err}");
        // Empty input gives an empty blob.
        let empty = dir.path().join("empty");
        std::fs::write(&empty, b"").unwrap();
        let c = compress_file(&empty, &out, 1000, 3, &|_| {}).unwrap();
        assert_eq!(c.size, 0);
    }
}
