//! `write`: every selected layer's image and tree, and the sealed node layer, into their
//! partitions, so that no byte that fails its hash can boot; `var` left blank.
//!
//! Reads the opened target, the verified stack, the node layer and the plan; returns the bytes
//! written and skipped and the rewrites ([`WriteStats`]).
//!
//! A layer's zstd frames arrive in order (from a mapped blob, or straight from a registry
//! download, see [`crate::stream`]); batches of them are decompressed in parallel, written with
//! large aligned O_DIRECT writes, then read back with O_DIRECT, bypassing the page cache, and
//! checked against the layer's signed hash tree, all three stages overlapping. Each block is
//! hashed once, after the read-back: the partition table is written last, so a block that
//! reaches the disk unchecked cannot boot. Only when a read-back fails is the in-memory copy
//! hashed too, to tell a bad source (the run fails, naming the frame and the blob) from a bad
//! write (the frame is written again, a bounded number of times, and counted).
//! All-zero blocks are skipped when the partition was first made to read zeros (a hole punched
//! in an image file, BLKZEROOUT on a device that offloads it), and still read back and checked.

use ingot_verity::{is_zero, Verifier};
use std::sync::{mpsc, Mutex};
use std::time::{Duration, Instant};

use rayon::prelude::*;

use crate::error::WriteError;
use crate::report::{Reporter, Rewrite, Stage};
use crate::steps::plan::{Content, DiskPlan, MIB};
use crate::steps::resolve::Source;
use crate::steps::seal::NodeLayer;
use crate::steps::verify::{map_blob, OpenedStack, Prepared};
use crate::stream;
use crate::target::{AlignedBuf, Target, TargetError, ALIGN};

#[derive(Debug, thiserror::Error)]
pub enum EngineError {
    #[error(transparent)]
    Target(#[from] TargetError),
    #[error("layer `{layer}`: the data blob {blob} is not the signed image: {reason}")]
    Blob {
        layer: String,
        blob: String,
        reason: String,
    },
    #[error(
        "layer `{layer}`: data block {block} (zstd frame {frame} of the data blob {blob}) does not \
         match the signed hash tree: the blob is corrupt"
    )]
    BadSource {
        layer: String,
        blob: String,
        frame: u64,
        block: u64,
    },
    #[error("layer `{layer}`: downloading the data blob {blob}: {reason}")]
    Download {
        layer: String,
        blob: String,
        reason: String,
    },
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
    #[error("interrupted by a signal while {during}")]
    Interrupted { during: String },
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
    /// Fails once the deadline has passed or SIGTERM/SIGINT arrived; `during` says what was
    /// going on.
    pub fn check_deadline(&self, during: &str) -> Result<(), EngineError> {
        if crate::interrupt::requested() {
            return Err(EngineError::Interrupted {
                during: during.to_string(),
            });
        }
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

/// Where one layer's time went, per pipeline stage (each stage's busy time; they overlap).
#[derive(Debug, Clone, Copy, Default, serde::Serialize)]
pub struct StageTimes {
    /// Waiting for compressed frames (the download, on a registry source).
    pub input_wait_s: f64,
    /// Decompressing frames (wall time of the parallel batches).
    pub decode_s: f64,
    /// O_DIRECT writes.
    pub write_s: f64,
    /// O_DIRECT reads of what was written.
    pub read_back_s: f64,
    /// Checking what was read against the tree (and any rewrites).
    pub verify_s: f64,
    /// The whole layer.
    pub total_s: f64,
}

/// One layer's data to put on the disk.
pub struct LayerData<'a> {
    pub name: &'a str,
    /// The data blob's digest, for messages.
    pub blob: &'a str,
    /// The tree, already checked against the signed root hash.
    pub verifier: &'a Verifier,
    /// Uncompressed bytes per zstd frame of the blob.
    pub frame_size: u64,
    pub image_size: u64,
    /// Partition on the target.
    pub offset: u64,
    pub partition_size: u64,
}

impl LayerData<'_> {
    fn blob_err(&self, reason: String) -> EngineError {
        EngineError::Blob {
            layer: self.name.to_string(),
            blob: self.blob.to_string(),
            reason,
        }
    }
}

/// One zstd frame: borrowed from a mapped blob, or received from a download; or a frame's
/// image bytes as they are (read from a disk written before).
pub enum Compressed<'a> {
    Mapped(&'a [u8]),
    Owned(Vec<u8>),
    Raw(AlignedBuf),
}

/// The image bytes of a layer as written at `offset` of `source`, one frame's worth at a time.
fn copied_frames<'a>(source: &'a Target, offset: u64, layer: &LayerData<'_>) -> Frames<'a> {
    let (frame_size, image_size) = (layer.frame_size, layer.image_size);
    Box::new((0..image_size.div_ceil(frame_size)).map(move |i| {
        let at = i * frame_size;
        let len = frame_size.min(image_size - at) as usize; // image sizes are ALIGN multiples
        let mut buf = AlignedBuf::new(len);
        source.read_direct(&mut buf[..len], offset + at)?;
        Ok(Compressed::Raw(buf))
    }))
}

/// A layer's compressed frames, in order; an error ends the layer.
pub type Frames<'a> = Box<dyn Iterator<Item = Result<Compressed<'a>, EngineError>> + Send + 'a>;

/// The frames of a blob that is in memory (a mapped file).
pub fn mapped_frames<'a>(layer: &LayerData<'_>, blob: &'a [u8]) -> Result<Frames<'a>, EngineError> {
    let frames =
        ingot_artifact::compress::split_frames(blob).map_err(|e| layer.blob_err(e.to_string()))?;
    Ok(Box::new(
        frames.into_iter().map(|f| Ok(Compressed::Mapped(f))),
    ))
}

/// A decompressed frame waiting to be written and read back.
struct Frame {
    index: u64,
    /// Byte offset inside the image.
    at: u64,
    len: usize,
    data: AlignedBuf,
}

/// A disk this run has already written: the layers of the next disk are copied from it
/// rather than downloaded again.
pub struct CopyFrom {
    pub target: Target,
    pub plan: DiskPlan,
}

/// The `write` step; see the module docs.
pub fn run(
    target: &Target,
    opened: &OpenedStack,
    node: Option<&NodeLayer>,
    plan: &DiskPlan,
    copy: Option<&CopyFrom>,
    opts: WriteOptions,
    reporter: &Reporter,
) -> Result<WriteStats, WriteError> {
    let mut total = WriteStats::default();
    // Blobs not on this machine stream from the registry, the next one downloading while
    // this one is written (unless they come from a disk written before).
    let jobs: Vec<stream::Job> = opened
        .layers()
        .iter()
        .filter(|p| p.data_path.get().is_none() && copy.is_none())
        .map(|p| stream::Job {
            layer: p.entry.name.clone(),
            digest: p.entry.data.digest.clone(),
            size: p.entry.data.size,
            frame_size: p.entry.data.compression.frame_size,
        })
        .collect();
    std::thread::scope(|s| -> Result<(), WriteError> {
        // Owned by this closure: dropped (so the download stops) before the scope ends.
        let mut streams = match opened.source() {
            Source::Registry(r) if !jobs.is_empty() => {
                stream::start(s, r.registry(), r.reference(), jobs)
            }
            _ => Vec::new(),
        }
        .into_iter();
        for (index, p) in opened.layers().iter().enumerate() {
            let source = LayerSource {
                streams: &mut streams,
                copy,
            };
            total += stack_layer(target, index, p, plan, source, opts, reporter)?;
        }
        Ok(())
    })?;
    if let Some(n) = node {
        let index = opened.layers().len();
        reporter.stage(
            Stage::Write,
            format!(
                "writing the sealed node layer ({} bytes, root hash {})",
                n.image.len(),
                n.root_hash
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
    opts.check_deadline("writing the layers")?;
    Ok(total)
}

/// Where a layer not on this machine comes from: the next registry stream, or a disk written
/// before.
struct LayerSource<'s, I: Iterator<Item = stream::Stream>> {
    streams: &'s mut I,
    copy: Option<&'s CopyFrom>,
}

/// One layer of the stack: its image (from its local blob, a disk written before, or the next
/// registry stream), then its hash device, each read back and checked.
fn stack_layer<I: Iterator<Item = stream::Stream>>(
    target: &Target,
    index: usize,
    p: &Prepared,
    plan: &DiskPlan,
    source: LayerSource<'_, I>,
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
            p.verifier.root_hash()
        ),
    );
    // Zeroing first pays only when many blocks are zeros (the tree says which): on a thin
    // or file-backed disk it frees space that dense data must then allocate again.
    let zero_blocks = p.verifier.zero_blocks();
    let blocks = p.verifier.params().data_blocks;
    let zeroed = zero_blocks * 8 >= blocks && target.zero_range(data.offset, data.size)?;
    tracing::debug!(
        "layer {}: {zero_blocks} of {blocks} blocks are zeros; zeroing first: {zeroed}",
        p.entry.name
    );
    let layer = LayerData {
        name: &p.entry.name,
        blob: &p.entry.data.digest,
        verifier: &p.verifier,
        frame_size: p.entry.data.compression.frame_size,
        image_size: p.entry.size,
        offset: data.offset,
        partition_size: data.size,
    };
    let map;
    let frames = match (p.data_path.get(), source.copy) {
        (Some(path), _) => {
            map = map_blob(path)?;
            mapped_frames(&layer, &map)?
        }
        (None, Some(copy)) => {
            let from = copy.plan.part(&Content::LayerData { index }).offset;
            copied_frames(&copy.target, from, &layer)
        }
        (None, None) => source
            .streams
            .next()
            .expect("one stream per layer not on this machine")
            .frames(),
    };
    let mut total = write_layer(target, &layer, frames, zeroed, opts, reporter)?;
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

/// Writes one layer's image into its partition, each block checked after it is read back.
/// `zeroed`: the partition reads zeros already, so zero blocks need not be sent.
pub fn write_layer(
    target: &Target,
    layer: &LayerData<'_>,
    frames: Frames<'_>,
    zeroed: bool,
    opts: WriteOptions,
    reporter: &Reporter,
) -> Result<WriteStats, EngineError> {
    check_geometry(layer)?;
    let started = Instant::now();
    // Three stages joined by short bounded queues, so that the disk always has work:
    //   decode (rayon) → write (O_DIRECT) → read back (O_DIRECT) and check against the tree.
    // The queues hold a few frames each: memory stays bounded whatever the layer's size.
    // Buffers go back to a pool, so the run does not fault in fresh pages for every frame.
    let batch = (rayon::current_num_threads() * 2).max(2);
    let depth = batch * 2;
    let pool: Mutex<Vec<AlignedBuf>> = Mutex::new(Vec::new());
    let (write_tx, write_rx) = mpsc::sync_channel::<Frame>(depth);
    let (check_tx, check_rx) = mpsc::sync_channel::<Frame>(depth);
    let (flush_tx, flush_rx) = mpsc::sync_channel::<()>(0);
    let (decoded, written, checked) = std::thread::scope(|s| {
        // A flush every FLUSH_EVERY bytes, beside the writes, while later frames still arrive:
        // the flush the partition table waits for then has little left to do. Its errors come
        // back at the end (the read-back checks every byte in any case).
        let flusher = s.spawn(move || -> Result<(), EngineError> {
            for () in flush_rx {
                target.flush_data()?;
            }
            Ok(())
        });
        let writer = s.spawn(|| write_stage(target, layer, zeroed, write_rx, check_tx, flush_tx));
        let checker = s.spawn(|| check_stage(target, layer, check_rx, &pool, opts, reporter));
        let decoded = decode_stage(layer, frames, batch, &pool, &write_tx, opts);
        drop(write_tx);
        let written = writer.join().expect("write stage panicked");
        let checked = checker.join().expect("read-back stage panicked");
        let flushed = flusher.join().expect("flusher panicked");
        (decoded, written.and_then(|w| flushed.map(|()| w)), checked)
    });
    // A later stage's error explains an earlier stage's stop; a decode error stands on its own.
    let (written, checked) = (written?, checked?);
    let (input_wait, decode) = decoded?;
    let (w, skipped, write_time) = written;
    let (rw, rewrites, read_time, verify_time) = checked;
    let stats = WriteStats {
        written: w + rw,
        skipped,
        rewrites,
    };
    let times = StageTimes {
        input_wait_s: input_wait.as_secs_f64(),
        decode_s: decode.as_secs_f64(),
        write_s: write_time.as_secs_f64(),
        read_back_s: read_time.as_secs_f64(),
        verify_s: verify_time.as_secs_f64(),
        total_s: started.elapsed().as_secs_f64(),
    };
    tracing::info!("layer {}: pipeline {times:?}", layer.name);
    reporter.detail(&format!("pipeline-{}", layer.name), times);
    reporter.add_written(stats.written);
    Ok(stats)
}

fn check_geometry(layer: &LayerData<'_>) -> Result<(), EngineError> {
    if layer.image_size > layer.partition_size {
        return Err(EngineError::TooLarge {
            layer: layer.name.to_string(),
            need: layer.image_size,
            have: layer.partition_size,
        });
    }
    let dbs = layer.verifier.params().data_block_size as u64;
    if layer.frame_size == 0 || layer.frame_size % ALIGN as u64 != 0 || layer.frame_size % dbs != 0
    {
        return Err(layer.blob_err(format!(
            "frame size {} is not a multiple of {ALIGN}",
            layer.frame_size
        )));
    }
    if layer.image_size % ALIGN as u64 != 0
        || layer.image_size != layer.verifier.params().data_blocks * dbs
    {
        return Err(layer.blob_err(format!(
            "image size {} does not match the hash tree",
            layer.image_size
        )));
    }
    Ok(())
}

/// Takes frames in batches and decompresses each batch on all cores. Returns (time waiting
/// for input, time decoding).
fn decode_stage(
    layer: &LayerData<'_>,
    mut frames: Frames<'_>,
    batch: usize,
    pool: &Mutex<Vec<AlignedBuf>>,
    write_tx: &mpsc::SyncSender<Frame>,
    opts: WriteOptions,
) -> Result<(Duration, Duration), EngineError> {
    let want = layer.image_size.div_ceil(layer.frame_size);
    let (mut wait, mut decode) = (Duration::ZERO, Duration::ZERO);
    let mut next = 0u64;
    loop {
        opts.check_deadline(&format!("writing layer {}", layer.name))?;
        let t = Instant::now();
        let mut chunk = Vec::with_capacity(batch);
        for f in frames.by_ref().take(batch) {
            chunk.push(f?);
        }
        wait += t.elapsed();
        if chunk.is_empty() {
            break;
        }
        if next + chunk.len() as u64 > want {
            return Err(layer.blob_err(format!("more than the {want} zstd frames expected")));
        }
        let t = Instant::now();
        let decoded: Vec<Result<Frame, EngineError>> = chunk
            .par_iter()
            .enumerate()
            .map(|(i, frame)| {
                let buf = pool.lock().expect("buffer pool").pop();
                decode_frame(layer, next + i as u64, frame, buf)
            })
            .collect();
        decode += t.elapsed();
        next += chunk.len() as u64;
        for f in decoded {
            if write_tx.send(f?).is_err() {
                return Ok((wait, decode)); // a later stage failed; its error is the one to report
            }
        }
    }
    if next != want {
        return Err(layer.blob_err(format!("{next} zstd frames, {want} expected")));
    }
    Ok((wait, decode))
}

/// Bytes written between two background flushes.
const FLUSH_EVERY: u64 = 256 << 20;

/// Writes each frame, then hands it on to be read back; asks `flush_tx` for a flush every
/// [`FLUSH_EVERY`] bytes. Returns (written, skipped, time).
fn write_stage(
    target: &Target,
    layer: &LayerData<'_>,
    zeroed: bool,
    write_rx: mpsc::Receiver<Frame>,
    check_tx: mpsc::SyncSender<Frame>,
    flush_tx: mpsc::SyncSender<()>,
) -> Result<(u64, u64, Duration), EngineError> {
    let (mut written, mut skipped, mut time) = (0, 0, Duration::ZERO);
    let mut unflushed = 0u64;
    for f in write_rx {
        let t = Instant::now();
        let (w, sk) = write_runs(target, &f.data[..f.len], layer.offset + f.at, zeroed)?;
        unflushed += w;
        if unflushed >= FLUSH_EVERY {
            // Skipped while the flusher is still busy with the last one.
            if flush_tx.try_send(()).is_ok() {
                unflushed = 0;
            }
        }
        time += t.elapsed();
        written += w;
        skipped += sk;
        if check_tx.send(f).is_err() {
            break; // the read-back stage failed; its error is the one to report
        }
    }
    Ok((written, skipped, time))
}

/// Reads written frames back, a few at a time in one request (a few large reads cost far less
/// than many 4 MiB ones), and checks them against the tree. Returns (bytes rewritten,
/// rewrites, read time, check time).
fn check_stage(
    target: &Target,
    layer: &LayerData<'_>,
    check_rx: mpsc::Receiver<Frame>,
    pool: &Mutex<Vec<AlignedBuf>>,
    opts: WriteOptions,
    reporter: &Reporter,
) -> Result<(u64, u32, Duration, Duration), EngineError> {
    const GROUP: usize = 4;
    let (mut rewritten, mut rewrites) = (0, 0);
    let (mut read_time, mut verify_time) = (Duration::ZERO, Duration::ZERO);
    let mut back = AlignedBuf::new(GROUP * layer.frame_size as usize);
    let mut done = 0u64;
    let mut group: Vec<Frame> = Vec::with_capacity(GROUP);
    while let Ok(first) = check_rx.recv() {
        group.push(first);
        while group.len() < GROUP {
            match check_rx.try_recv() {
                Ok(f) => group.push(f),
                Err(_) => break,
            }
        }
        let t = Instant::now();
        let len: usize = group.iter().map(|f| f.len).sum();
        let contiguous = group
            .windows(2)
            .all(|w| w[0].at + w[0].len as u64 == w[1].at);
        let read = if contiguous {
            target.read_direct(&mut back[..len], layer.offset + group[0].at)?;
            true
        } else {
            false
        };
        let t2 = Instant::now();
        read_time += t2 - t;
        let dbs = layer.verifier.params().data_block_size as u64;
        let good = read
            && layer
                .verifier
                .verify_blocks(group[0].at / dbs, &back[..len])
                .is_ok();
        if !good {
            for f in &group {
                let (rw, n) = read_back(target, layer, f, &mut back, opts, reporter)?;
                rewritten += rw;
                rewrites += n;
            }
        }
        verify_time += t2.elapsed();
        for f in group.drain(..) {
            done += f.len as u64;
            pool.lock().expect("buffer pool").push(f.data);
        }
        reporter.progress(Stage::Write, layer.name, done, layer.image_size);
    }
    Ok((rewritten, rewrites, read_time, verify_time))
}

/// Decompresses frame `index` into `buf` (or a new buffer). Not hashed here: every block is
/// checked after it is read back from the disk.
fn decode_frame(
    layer: &LayerData<'_>,
    index: u64,
    frame: &Compressed<'_>,
    buf: Option<AlignedBuf>,
) -> Result<Frame, EngineError> {
    let at = index * layer.frame_size;
    let len = layer.frame_size.min(layer.image_size - at) as usize;
    let mut data = buf.unwrap_or_else(|| AlignedBuf::new(layer.frame_size as usize));
    let compressed = match frame {
        Compressed::Mapped(s) => *s,
        Compressed::Owned(v) => v.as_slice(),
        Compressed::Raw(raw) => {
            data[..len].copy_from_slice(&raw[..len]);
            return Ok(Frame {
                index,
                at,
                len,
                data,
            });
        }
    };
    let n = zstd::bulk::Decompressor::new()
        .and_then(|mut d| d.decompress_to_buffer(compressed, &mut data[..]))
        .map_err(|e| layer.blob_err(format!("zstd frame {index}: {e}")))?;
    if n != len {
        return Err(layer.blob_err(format!(
            "zstd frame {index} holds {n} bytes, {len} expected"
        )));
    }
    Ok(Frame {
        index,
        at,
        len,
        data,
    })
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

/// Reads a frame back with O_DIRECT into `buf` and checks it against the tree. When that fails,
/// the in-memory copy is checked too: if it is wrong the source is (the run fails, naming the
/// frame); if it is right the write was, and the frame is written again (whole, zeros included)
/// up to the attempt limit. Returns (bytes rewritten, number of rewrites).
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
        if attempt == 1 {
            if let Err(bad) = layer.verifier.verify_blocks(f.at / dbs, &f.data[..f.len]) {
                return Err(match bad {
                    ingot_verity::VerifyError::DataBlock { block, .. } => EngineError::BadSource {
                        layer: layer.name.to_string(),
                        blob: layer.blob.to_string(),
                        frame: f.index,
                        block,
                    },
                    other => layer.blob_err(format!("zstd frame {}: {other}", f.index)),
                });
            }
        }
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
