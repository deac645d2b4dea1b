//! `write`: every selected layer's image and tree, and the sealed node layer, into their
//! partitions, so that no byte that fails its hash reaches the disk unnoticed; `var` left blank.
//!
//! Reads the opened target, the verified stack, the node layer and the plan; returns the bytes
//! written and skipped and the rewrites ([`WriteStats`]).
//!
//! For each batch of zstd frames (decompressed in parallel): every data block is checked against
//! its leaf in the signed hash tree BEFORE it is written; the batch is written with large aligned
//! O_DIRECT writes; then it is read back with O_DIRECT, bypassing the page cache, and checked
//! again, while the next batch is being written. A frame that reads back wrong is written again
//! a bounded number of times, then the run fails naming the layer, offset and attempts.
//! All-zero blocks are skipped when the partition was first made to read zeros (a hole punched
//! in an image file, BLKZEROOUT on a device that offloads it), and still read back and checked.

use ingot_verity::{is_zero, Verifier};
use std::sync::{mpsc, Mutex};
use std::time::Instant;

use rayon::prelude::*;

use crate::error::WriteError;
use crate::report::{Reporter, Rewrite, Stage};
use crate::steps::plan::{Content, DiskPlan, MIB};
use crate::steps::seal::NodeLayer;
use crate::steps::verify::{map_blob, OpenedStack, Prepared};
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
    #[error("the deadline passed while {during}")]
    Deadline { during: String },
}

#[derive(Debug, Clone, Copy)]
pub struct WriteOptions {
    /// Writes of one range before giving up (the first write included).
    pub max_attempts: u32,
    /// The run fails (and the disk is left without a partition table) once this passes.
    pub deadline: Option<Instant>,
}

impl Default for WriteOptions {
    fn default() -> Self {
        WriteOptions {
            max_attempts: 3,
            deadline: None,
        }
    }
}

impl WriteOptions {
    /// Fails once the deadline has passed; `during` says what was going on.
    pub fn check_deadline(&self, during: &str) -> Result<(), EngineError> {
        match self.deadline {
            Some(d) if Instant::now() >= d => Err(EngineError::Deadline {
                during: during.to_string(),
            }),
            _ => Ok(()),
        }
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

impl std::ops::AddAssign for WriteStats {
    fn add_assign(&mut self, s: WriteStats) {
        self.written += s.written;
        self.skipped += s.skipped;
        self.rewrites += s.rewrites;
    }
}

/// One layer's data to put on the disk.
pub struct LayerData<'a> {
    pub name: &'a str,
    /// The tree, already checked against the signed root hash.
    pub verifier: &'a Verifier,
    /// The compressed blob (not hashed whole; each decoded block is checked): zstd frames of `frame_size` bytes each.
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

/// The `write` step; see the module docs.
pub fn run(
    target: &Target,
    opened: &OpenedStack,
    node: Option<&NodeLayer>,
    plan: &DiskPlan,
    opts: WriteOptions,
    reporter: &Reporter,
) -> Result<WriteStats, WriteError> {
    let mut total = WriteStats::default();
    for (index, p) in opened.layers().iter().enumerate() {
        total += stack_layer(target, index, p, plan, opts, reporter)?;
    }
    if let Some(n) = node {
        let index = opened.layers().len();
        reporter.stage(
            Stage::Write,
            format!(
                "writing the sealed node layer ({} bytes, root hash {})",
                n.image.len(),
                hex::encode(&n.root_hash)
            ),
        );
        for (content, what, bytes) in [
            (Content::LayerData { index }, "node", &n.image),
            (Content::LayerHash { index }, "node-verity", &n.hash),
        ] {
            let part = plan.part(&content);
            let zeroed = target.zero_range(part.offset, part.size)?;
            total += write_bytes(target, what, bytes, part.offset, zeroed, opts, reporter)?;
        }
    }

    // var: left blank (no file system signature) for first boot to format, per the boot contract.
    let var = plan.part(&Content::Var);
    if !target.zero_range(var.offset, MIB)? {
        target.write_direct(&AlignedBuf::new(MIB as usize), var.offset)?;
    }
    opts.check_deadline("write")?;
    Ok(total)
}

/// One layer of the stack: its image from the blob, then its hash device.
fn stack_layer(
    target: &Target,
    index: usize,
    p: &Prepared,
    plan: &DiskPlan,
    opts: WriteOptions,
    reporter: &Reporter,
) -> Result<WriteStats, WriteError> {
    let data = plan.part(&Content::LayerData { index });
    let hash = plan.part(&Content::LayerHash { index });
    reporter.stage(
        Stage::Write,
        format!(
            "writing layer {} ({} bytes, root hash {})",
            p.entry.name,
            p.entry.size,
            hex::encode(p.verifier.root_hash())
        ),
    );
    let map = map_blob(&p.data_path)?;
    // Zeroing first pays only when many blocks are zeros (the tree says which): on a thin
    // or file-backed disk it frees space that dense data must then allocate again.
    let zero_blocks = p.verifier.zero_blocks();
    let blocks = p.verifier.params().data_blocks;
    let zeroed = zero_blocks * 8 >= blocks && target.zero_range(data.offset, data.size)?;
    tracing::debug!(
        "layer {}: {zero_blocks} of {blocks} blocks are zeros; zeroing first: {zeroed}",
        p.entry.name
    );
    let mut total = write_layer(
        target,
        &LayerData {
            name: &p.entry.name,
            verifier: &p.verifier,
            blob: &map,
            frame_size: p.entry.data.compression.frame_size,
            image_size: p.entry.size,
            offset: data.offset,
            partition_size: data.size,
        },
        zeroed,
        opts,
        reporter,
    )?;
    reporter.finish_bar();
    let zeroed = target.zero_range(hash.offset, hash.size)?;
    total += write_bytes(
        target,
        &format!("{}-verity", p.entry.name),
        &p.hash_bytes,
        hash.offset,
        zeroed,
        opts,
        reporter,
    )?;
    Ok(total)
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
    let frames =
        ingot_artifact::compress::split_frames(layer.blob).map_err(|e| blob_err(e.to_string()))?;
    let want = layer.image_size.div_ceil(layer.frame_size) as usize;
    if frames.len() != want {
        return Err(blob_err(format!(
            "{} zstd frames, {want} expected",
            frames.len()
        )));
    }

    // Three stages joined by short bounded queues, so that the disk always has work:
    //   decode (rayon: decompress and check against the tree) → write (O_DIRECT)
    //   → read back (O_DIRECT) and check again.
    // The queues hold a few frames each: memory stays bounded and every frame is checked before
    // it is written. Buffers go back to a pool, so the run does not fault in fresh pages for
    // every frame.
    let batch = (rayon::current_num_threads() * 2).max(2);
    let depth = batch * 2;
    let pool: Mutex<Vec<AlignedBuf>> = Mutex::new(Vec::new());
    let (write_tx, write_rx) = mpsc::sync_channel::<Frame>(depth);
    let (check_tx, check_rx) = mpsc::sync_channel::<Frame>(depth);
    let (decoded, written, checked) = std::thread::scope(|s| {
        let writer = s.spawn(|| -> Result<(u64, u64), EngineError> {
            let (mut written, mut skipped) = (0, 0);
            for f in write_rx {
                let (w, sk) = write_runs(target, &f.data[..f.len], layer.offset + f.at, zeroed)?;
                written += w;
                skipped += sk;
                if check_tx.send(f).is_err() {
                    break; // the read-back stage failed; its error is the one to report
                }
            }
            drop(check_tx);
            Ok((written, skipped))
        });
        let checker = s.spawn(|| -> Result<(u64, u32), EngineError> {
            let (mut rewritten, mut rewrites) = (0, 0);
            // Frames already written are read back together in one large request: a few
            // large reads cost far less than many 4 MiB ones.
            const GROUP: usize = 4;
            let mut back = AlignedBuf::new(GROUP * layer.frame_size as usize);
            let mut done = 0u64;
            let mut group: Vec<Frame> = Vec::with_capacity(GROUP);
            let check_rx = check_rx; // owned here: the writer sees when this stage stops
            while let Ok(first) = check_rx.recv() {
                group.push(first);
                while group.len() < GROUP {
                    match check_rx.try_recv() {
                        Ok(f) => group.push(f),
                        Err(_) => break,
                    }
                }
                let (rw, n) = read_back_group(target, layer, &group, &mut back, opts, reporter)?;
                rewritten += rw;
                rewrites += n;
                for f in group.drain(..) {
                    done += f.len as u64;
                    pool.lock().expect("buffer pool").push(f.data);
                }
                reporter.progress(Stage::Write, layer.name, done, layer.image_size);
            }
            Ok((rewritten, rewrites))
        });
        let decoded = (|| -> Result<(), EngineError> {
            for (batch_no, chunk) in frames.chunks(batch).enumerate() {
                opts.check_deadline(&format!("writing layer {}", layer.name))?;
                let frames: Vec<Result<Frame, EngineError>> = chunk
                    .par_iter()
                    .enumerate()
                    .map(|(i, frame)| {
                        let index = (batch_no * batch + i) as u64;
                        let buf = pool.lock().expect("buffer pool").pop();
                        decode_frame(layer, index, frame, buf, &blob_err)
                    })
                    .collect();
                for f in frames {
                    if write_tx.send(f?).is_err() {
                        return Ok(()); // a later stage failed; its error is the one to report
                    }
                }
            }
            Ok(())
        })();
        drop(write_tx);
        let written = writer.join().expect("write stage panicked");
        let checked = checker.join().expect("read-back stage panicked");
        (decoded, written, checked)
    });
    decoded?;
    let (w, skipped) = written?;
    let (rw, rewrites) = checked?;
    let stats = WriteStats {
        written: w + rw,
        skipped,
        rewrites,
    };
    reporter.add_written(stats.written);
    Ok(stats)
}

/// Decompresses frame `index` into `buf` (or a new buffer) and checks every block against the
/// tree: nothing that fails leaves this function.
fn decode_frame(
    layer: &LayerData<'_>,
    index: u64,
    frame: &[u8],
    buf: Option<AlignedBuf>,
    blob_err: &(dyn Fn(String) -> EngineError + Sync),
) -> Result<Frame, EngineError> {
    let dbs = layer.verifier.params().data_block_size as u64;
    let at = index * layer.frame_size;
    let len = layer.frame_size.min(layer.image_size - at) as usize;
    let mut data = buf.unwrap_or_else(|| AlignedBuf::new(layer.frame_size as usize));
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
            ingot_verity::VerifyError::DataBlock { block, .. } => EngineError::BadSource {
                layer: layer.name.to_string(),
                block,
            },
            other => blob_err(other.to_string()),
        })?;
    Ok(Frame { at, len, data })
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

/// Reads consecutive frames back in one request and checks them; when that fails, each frame
/// is read back and handled on its own (see [`read_back`]).
fn read_back_group(
    target: &Target,
    layer: &LayerData<'_>,
    group: &[Frame],
    buf: &mut AlignedBuf,
    opts: WriteOptions,
    reporter: &Reporter,
) -> Result<(u64, u32), EngineError> {
    let dbs = layer.verifier.params().data_block_size as u64;
    let first = &group[0];
    let contiguous = group
        .windows(2)
        .all(|w| w[0].at + w[0].len as u64 == w[1].at);
    if contiguous {
        let len: usize = group.iter().map(|f| f.len).sum();
        target.read_direct(&mut buf[..len], layer.offset + first.at)?;
        if layer
            .verifier
            .verify_blocks(first.at / dbs, &buf[..len])
            .is_ok()
        {
            return Ok((0, 0));
        }
    }
    let (mut rewritten, mut rewrites) = (0, 0);
    for f in group {
        let (rw, n) = read_back(target, layer, f, buf, opts, reporter)?;
        rewritten += rw;
        rewrites += n;
    }
    Ok((rewritten, rewrites))
}

/// Reads a frame back with O_DIRECT into `buf` and checks it against the tree; a frame that
/// fails is written again (whole, zeros included) up to the attempt limit. Returns (bytes
/// rewritten, number of rewrites).
fn read_back(
    target: &Target,
    layer: &LayerData<'_>,
    f: &Frame,
    buf: &mut AlignedBuf,
    opts: WriteOptions,
    reporter: &Reporter,
) -> Result<(u64, u32), EngineError> {
    let dbs = layer.verifier.params().data_block_size as u64;
    let mut rewritten = 0u64;
    let mut rewrites = 0u32;
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
    Ok((rewritten, rewrites))
}

/// Writes bytes that carry no hash tree of their own (a verity hash device, the ESP) and checks
/// them by reading back and comparing, with the same bounded rewrites. Chunk N is written while
/// chunk N-1 is read back.
pub fn write_bytes(
    target: &Target,
    what: &str,
    bytes: &[u8],
    offset: u64,
    zeroed: bool,
    opts: WriteOptions,
    reporter: &Reporter,
) -> Result<WriteStats, EngineError> {
    const CHUNK: usize = 8 << 20;
    let mut stats = WriteStats::default();
    let mut current = AlignedBuf::new(CHUNK);
    let mut previous = AlignedBuf::new(CHUNK);
    let mut back = AlignedBuf::new(CHUNK);
    // (offset, length) of the chunk in `previous`, waiting to be read back.
    let mut pending: Option<(u64, usize)> = None;
    let mut parts = bytes.chunks(CHUNK).enumerate();
    loop {
        opts.check_deadline(&format!("writing {what}"))?;
        let next = parts.next().map(|(i, part)| {
            let len = part.len().div_ceil(ALIGN) * ALIGN;
            current[..len].fill(0);
            current[..part.len()].copy_from_slice(part);
            (offset + (i * CHUNK) as u64, len)
        });
        if next.is_none() && pending.is_none() {
            break;
        }
        let (written, checked) = rayon::join(
            || match next {
                Some((at, len)) => write_runs(target, &current[..len], at, zeroed),
                None => Ok((0, 0)),
            },
            || match pending {
                Some((at, len)) => check_bytes(
                    target,
                    what,
                    &previous[..len],
                    &mut back,
                    at,
                    opts,
                    reporter,
                ),
                None => Ok((0, 0)),
            },
        );
        let (w, s) = written?;
        let (rw, n) = checked?;
        stats.written += w + rw;
        stats.skipped += s;
        stats.rewrites += n;
        std::mem::swap(&mut current, &mut previous);
        pending = next;
    }
    reporter.add_written(stats.written);
    Ok(stats)
}

/// Reads `expect.len()` bytes back at `at` and compares; rewrites up to the attempt limit.
/// Returns (bytes rewritten, number of rewrites).
fn check_bytes(
    target: &Target,
    what: &str,
    expect: &[u8],
    back: &mut AlignedBuf,
    at: u64,
    opts: WriteOptions,
    reporter: &Reporter,
) -> Result<(u64, u32), EngineError> {
    let len = expect.len();
    let (mut rewritten, mut rewrites) = (0u64, 0u32);
    let mut attempt = 1;
    loop {
        target.read_direct(&mut back[..len], at)?;
        if back[..len] == *expect {
            return Ok((rewritten, rewrites));
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
        target.write_direct(expect, at)?;
        target.sync()?;
        rewritten += len as u64;
        rewrites += 1;
    }
}
