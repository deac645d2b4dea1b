//! Writing a layer so that no byte that fails its hash reaches the disk unnoticed.
//!
//! For each batch of zstd frames (decompressed in parallel): every data block is checked against
//! its leaf in the signed hash tree BEFORE it is written; the batch is written with large aligned
//! O_DIRECT writes; then it is read back with O_DIRECT, bypassing the page cache, and checked
//! again, while the next batch is being written. A frame that reads back wrong is written again
//! a bounded number of times, then the run fails naming the layer, offset and attempts.
//! All-zero blocks are skipped when the partition was first made to read zeros (a hole punched
//! in an image file, BLKZEROOUT on a device that offloads it), and still read back and checked.

use ingot_verity::{is_zero, Verifier};
use rayon::prelude::*;

use crate::report::{Reporter, Rewrite, Stage};
use crate::target::{AlignedBuf, Target, TargetError, ALIGN};

#[derive(Debug, thiserror::Error)]
pub enum EngineError {
    #[error(transparent)]
    Target(#[from] TargetError),
    #[error("layer `{layer}`: the data blob is not the signed image: {reason}")]
    Blob { layer: String, reason: String },
    #[error("layer `{layer}`: data block {block} does not match the signed hash tree; nothing of it was written")]
    BadSource { layer: String, block: u64 },
    #[error(
        "layer `{layer}`: {length} bytes at target offset {offset} still read back wrong after {attempts} \
         attempts ({reason})"
    )]
    ReadBack {
        layer: String,
        offset: u64,
        length: u64,
        attempts: u32,
        reason: String,
    },
    #[error("layer `{layer}` needs {need} bytes, its partition has {have}")]
    TooLarge { layer: String, need: u64, have: u64 },
}

#[derive(Debug, Clone, Copy)]
pub struct WriteOptions {
    /// Writes of one range before giving up (the first write included).
    pub max_attempts: u32,
}

impl Default for WriteOptions {
    fn default() -> Self {
        WriteOptions { max_attempts: 3 }
    }
}

#[derive(Debug, Clone, Copy, Default)]
pub struct WriteStats {
    /// Bytes sent to the disk.
    pub written: u64,
    /// All-zero bytes not sent because the partition already reads zeros.
    pub skipped: u64,
    pub rewrites: u32,
}

/// One layer's data to put on the disk.
pub struct LayerData<'a> {
    pub name: &'a str,
    /// The tree, already checked against the signed root hash.
    pub verifier: &'a Verifier,
    /// The compressed blob (digest already checked): zstd frames of `frame_size` bytes each.
    pub blob: &'a [u8],
    pub frame_size: u64,
    pub image_size: u64,
    /// Partition on the target.
    pub offset: u64,
    pub partition_size: u64,
}

/// A decompressed, source-verified frame waiting to be written and read back.
struct Frame {
    /// Byte offset inside the image.
    at: u64,
    len: usize,
    data: AlignedBuf,
}

/// Writes one layer's image into its partition with both checks. `zeroed`: the partition reads
/// zeros already, so zero blocks need not be sent.
pub fn write_layer(
    target: &Target,
    layer: &LayerData<'_>,
    zeroed: bool,
    opts: WriteOptions,
    reporter: &Reporter,
) -> Result<WriteStats, EngineError> {
    let name = layer.name.to_string();
    let blob_err = |reason: String| EngineError::Blob {
        layer: name.clone(),
        reason,
    };
    if layer.image_size > layer.partition_size {
        return Err(EngineError::TooLarge {
            layer: name,
            need: layer.image_size,
            have: layer.partition_size,
        });
    }
    let dbs = layer.verifier.params().data_block_size as u64;
    if layer.frame_size == 0 || layer.frame_size % ALIGN as u64 != 0 || layer.frame_size % dbs != 0
    {
        return Err(blob_err(format!(
            "frame size {} is not a multiple of {ALIGN}",
            layer.frame_size
        )));
    }
    if layer.image_size % ALIGN as u64 != 0
        || layer.image_size != layer.verifier.params().data_blocks * dbs
    {
        return Err(blob_err(format!(
            "image size {} does not match the hash tree",
            layer.image_size
        )));
    }
    let frames = ingot::compress::split_frames(layer.blob).map_err(|e| blob_err(e.to_string()))?;
    let want = layer.image_size.div_ceil(layer.frame_size) as usize;
    if frames.len() != want {
        return Err(blob_err(format!(
            "{} zstd frames, {want} expected",
            frames.len()
        )));
    }

    let batch = (rayon::current_num_threads() * 2).max(2);
    let mut stats = WriteStats::default();
    let mut pending: Option<Vec<Frame>> = None;
    let mut done_bytes = 0u64;
    for (batch_no, chunk) in frames.chunks(batch).enumerate() {
        // Decompress and check against the tree, in parallel, before anything is written.
        let decoded: Vec<Result<Frame, EngineError>> = chunk
            .par_iter()
            .enumerate()
            .map(|(i, frame)| {
                let index = (batch_no * batch + i) as u64;
                let at = index * layer.frame_size;
                let len = layer.frame_size.min(layer.image_size - at) as usize;
                let mut data = AlignedBuf::new(layer.frame_size as usize);
                let n = zstd::bulk::Decompressor::new()
                    .and_then(|mut d| d.decompress_to_buffer(frame, &mut data[..]))
                    .map_err(|e| blob_err(format!("frame {index}: {e}")))?;
                if n != len {
                    return Err(blob_err(format!(
                        "frame {index} holds {n} bytes, {len} expected"
                    )));
                }
                layer
                    .verifier
                    .verify_blocks(at / dbs, &data[..len])
                    .map_err(|e| match e {
                        ingot_verity::VerifyError::DataBlock { block, .. } => {
                            EngineError::BadSource {
                                layer: name.clone(),
                                block,
                            }
                        }
                        other => blob_err(other.to_string()),
                    })?;
                Ok(Frame { at, len, data })
            })
            .collect();
        let current: Vec<Frame> = decoded.into_iter().collect::<Result<_, _>>()?;

        // Write this batch while the previous one is read back and checked.
        let previous = pending.take();
        let (written, checked) = rayon::join(
            || write_frames(target, layer, &current, zeroed),
            || match &previous {
                Some(frames) => read_back(target, layer, frames, opts, reporter),
                None => Ok((0, 0)),
            },
        );
        let (w, s) = written?;
        stats.written += w;
        stats.skipped += s;
        let (rw, rewrites) = checked?;
        stats.written += rw;
        stats.rewrites += rewrites;
        done_bytes += current.iter().map(|f| f.len as u64).sum::<u64>();
        reporter.progress(Stage::Write, layer.name, done_bytes, layer.image_size);
        pending = Some(current);
    }
    if let Some(frames) = pending {
        let (rw, rewrites) = read_back(target, layer, &frames, opts, reporter)?;
        stats.written += rw;
        stats.rewrites += rewrites;
    }
    reporter.add_written(stats.written);
    Ok(stats)
}

/// Writes frames; with `zeroed`, only the runs of non-zero 4 KiB blocks. Returns
/// (bytes written, zero bytes skipped).
fn write_frames(
    target: &Target,
    layer: &LayerData<'_>,
    frames: &[Frame],
    zeroed: bool,
) -> Result<(u64, u64), EngineError> {
    let mut written = 0;
    let mut skipped = 0;
    for f in frames {
        let (w, s) = write_runs(target, &f.data[..f.len], layer.offset + f.at, zeroed)?;
        written += w;
        skipped += s;
    }
    Ok((written, skipped))
}

/// Writes `data` (a multiple of ALIGN) at `offset`, skipping all-zero ALIGN blocks when the
/// target already reads zeros there.
fn write_runs(
    target: &Target,
    data: &[u8],
    offset: u64,
    zeroed: bool,
) -> Result<(u64, u64), TargetError> {
    if !zeroed {
        target.write_direct(data, offset)?;
        return Ok((data.len() as u64, 0));
    }
    let mut written = 0u64;
    let mut skipped = 0u64;
    let blocks: Vec<&[u8]> = data.chunks(ALIGN).collect();
    let mut i = 0;
    while i < blocks.len() {
        let zero = is_zero(blocks[i]);
        let start = i;
        while i < blocks.len() && is_zero(blocks[i]) == zero {
            i += 1;
        }
        let (a, b) = (start * ALIGN, i * ALIGN);
        if zero {
            skipped += (b - a) as u64;
        } else {
            target.write_direct(&data[a..b], offset + a as u64)?;
            written += (b - a) as u64;
        }
    }
    Ok((written, skipped))
}

/// Reads each frame back with O_DIRECT and checks it against the tree; a frame that fails is
/// written again (whole, zeros included) up to the attempt limit. Returns (bytes rewritten,
/// number of rewrites).
fn read_back(
    target: &Target,
    layer: &LayerData<'_>,
    frames: &[Frame],
    opts: WriteOptions,
    reporter: &Reporter,
) -> Result<(u64, u32), EngineError> {
    let dbs = layer.verifier.params().data_block_size as u64;
    let mut rewritten = 0u64;
    let mut rewrites = 0u32;
    let mut buf = AlignedBuf::new(layer.frame_size as usize);
    for f in frames {
        let offset = layer.offset + f.at;
        let mut attempt = 1;
        loop {
            target.read_direct(&mut buf[..f.len], offset)?;
            let check = layer.verifier.verify_blocks(f.at / dbs, &buf[..f.len]);
            let Err(e) = check else { break };
            if attempt >= opts.max_attempts {
                return Err(EngineError::ReadBack {
                    layer: layer.name.to_string(),
                    offset,
                    length: f.len as u64,
                    attempts: attempt,
                    reason: e.to_string(),
                });
            }
            attempt += 1;
            reporter.rewrite(Rewrite {
                layer: layer.name.to_string(),
                offset,
                length: f.len as u64,
                attempt,
            });
            target.write_direct(&f.data[..f.len], offset)?;
            target.sync()?;
            rewritten += f.len as u64;
            rewrites += 1;
        }
    }
    Ok((rewritten, rewrites))
}

/// Writes bytes that carry no hash tree of their own (a verity hash device, the ESP) and checks
/// them by reading back and comparing, with the same bounded rewrites.
pub fn write_bytes(
    target: &Target,
    what: &str,
    bytes: &[u8],
    offset: u64,
    zeroed: bool,
    opts: WriteOptions,
    reporter: &Reporter,
) -> Result<WriteStats, EngineError> {
    let mut stats = WriteStats::default();
    const CHUNK: usize = 8 << 20;
    let mut buf = AlignedBuf::new(CHUNK);
    let mut back = AlignedBuf::new(CHUNK);
    for (i, part) in bytes.chunks(CHUNK).enumerate() {
        let at = offset + (i * CHUNK) as u64;
        let len = part.len().div_ceil(ALIGN) * ALIGN;
        buf[..len].fill(0);
        buf[..part.len()].copy_from_slice(part);
        let (w, s) = write_runs(target, &buf[..len], at, zeroed)?;
        stats.written += w;
        stats.skipped += s;
        let mut attempt = 1;
        loop {
            target.read_direct(&mut back[..len], at)?;
            if back[..len] == buf[..len] {
                break;
            }
            if attempt >= opts.max_attempts {
                return Err(EngineError::ReadBack {
                    layer: what.to_string(),
                    offset: at,
                    length: len as u64,
                    attempts: attempt,
                    reason: "bytes differ from what was written".into(),
                });
            }
            attempt += 1;
            reporter.rewrite(Rewrite {
                layer: what.to_string(),
                offset: at,
                length: len as u64,
                attempt,
            });
            target.write_direct(&buf[..len], at)?;
            target.sync()?;
            stats.written += len as u64;
            stats.rewrites += 1;
        }
    }
    reporter.add_written(stats.written);
    Ok(stats)
}
