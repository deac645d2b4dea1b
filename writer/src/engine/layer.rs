//! One layer's image onto its partition: decode (rayon) → write (O_DIRECT) → read back
//! (O_DIRECT) and check against the signed tree, three phases joined by short bounded queues.

use std::sync::{mpsc, Mutex};
use std::time::{Duration, Instant};

use rayon::prelude::*;

use crate::report::{Reporter, Rewrite, Stage};
use crate::target::{AlignedBuf, Target, ALIGN};

use super::bytes::write_runs;
use super::frames::{FrameData, Frames};
use super::{EngineError, LayerData, WriteOptions, WriteStats};

/// Where one layer's time went, per phase of the pipeline (each phase's busy time; they overlap).
#[derive(Debug, Clone, Copy, Default, serde::Serialize)]
pub struct PhaseTimes {
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

/// A decompressed frame waiting to be written and read back.
struct Frame {
    index: u64,
    /// Byte offset inside the image.
    at: u64,
    len: usize,
    data: AlignedBuf,
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
    // Three threads joined by short bounded queues, so that the disk always has work:
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
        let writer = s.spawn(|| write_phase(target, layer, zeroed, write_rx, check_tx, flush_tx));
        let checker = s.spawn(|| check_phase(target, layer, check_rx, &pool, opts, reporter));
        let decoded = decode_phase(layer, frames, batch, &pool, &write_tx, opts);
        drop(write_tx);
        let written = writer.join().expect("write thread panicked");
        let checked = checker.join().expect("read-back thread panicked");
        let flushed = flusher.join().expect("flusher panicked");
        (decoded, written.and_then(|w| flushed.map(|()| w)), checked)
    });
    // A later thread's error explains an earlier thread's stop; a decode error stands on its own.
    let (written, checked) = (written?, checked?);
    let (input_wait, decode) = decoded?;
    let (w, skipped, write_time) = written;
    let (rw, rewrites, read_time, verify_time) = checked;
    let stats = WriteStats {
        written: w + rw,
        skipped,
        rewrites,
    };
    let times = PhaseTimes {
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

/// Whether the layer fits its partition and its frame and image sizes agree with its tree
/// (the signed descriptor's facts, no byte of the blob read).
pub fn check_geometry(layer: &LayerData<'_>) -> Result<(), EngineError> {
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
fn decode_phase(
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
        opts.check_stop(&format!("writing layer {}", layer.name))?;
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
                return Ok((wait, decode)); // a later thread failed; its error is the one to report
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
fn write_phase(
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
            break; // the read-back thread failed; its error is the one to report
        }
    }
    Ok((written, skipped, time))
}

/// Reads written frames back, a few at a time in one request (a few large reads cost far less
/// than many 4 MiB ones), and checks them against the tree. Returns (bytes rewritten,
/// rewrites, read time, check time).
fn check_phase(
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
    frame: &FrameData<'_>,
    buf: Option<AlignedBuf>,
) -> Result<Frame, EngineError> {
    let at = index * layer.frame_size;
    let len = layer.frame_size.min(layer.image_size - at) as usize;
    let mut data = buf.unwrap_or_else(|| AlignedBuf::new(layer.frame_size as usize));
    let compressed = match frame {
        FrameData::Mapped(s) => *s,
        FrameData::Owned(v) => v.as_slice(),
        FrameData::Plain(raw) => {
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
