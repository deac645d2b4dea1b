//! Layers' data blobs straight from a registry into the write pipeline, nothing staged on a
//! file system: one download thread fetches the selected layers' blobs in stacking order and
//! cuts each into its zstd frames as the bytes arrive; each layer's frames wait in a short
//! bounded queue for [`crate::engine::layer::write_layer`]. The next layer's download therefore
//! overlaps this layer's write, memory stays bounded (a full queue holds the download back),
//! and a dropped connection resumes with a `Range` request from the last byte received
//! ([`ingot_artifact::registry::Registry::stream_blob`]), which also checks each blob's digest
//! at its end.

use std::io::Write;
use std::sync::mpsc::{sync_channel, Receiver, SyncSender};

use ingot_artifact::registry::{Registry, RegistryRef};

use crate::engine::frames::{FrameData, Frames};
use crate::engine::EngineError;

/// Compressed frames a layer's queue holds (each at most a frame's compressed size).
const QUEUE: usize = 8;

type Item = Result<Vec<u8>, EngineError>;

/// One blob to stream.
pub struct Job {
    pub layer: String,
    pub digest: String,
    pub size: u64,
    pub frame_size: u64,
}

/// One blob's compressed frames, as they arrive.
pub struct Stream(Receiver<Item>);

impl Stream {
    /// The frames, for [`crate::engine::layer::write_layer`].
    pub fn frames<'f>(self) -> Frames<'f> {
        Box::new(self.0.into_iter().map(|r| r.map(FrameData::Owned)))
    }
}

/// Starts the download thread in `scope`; returns one stream per job, in order. Drop the
/// streams (all of them) before the scope ends: a stream still held keeps its download waiting.
pub fn start<'scope, 'env>(
    scope: &'scope std::thread::Scope<'scope, 'env>,
    registry: &'env Registry,
    reference: &'env RegistryRef,
    jobs: Vec<Job>,
) -> Vec<Stream> {
    let mut sources = Vec::new();
    let mut work = Vec::new();
    for job in jobs {
        let (tx, rx) = sync_channel::<Item>(QUEUE);
        sources.push(Stream(rx));
        work.push((job, tx));
    }
    scope.spawn(move || {
        for (job, tx) in work {
            if !download(registry, reference, &job, tx) {
                break;
            }
        }
    });
    sources
}

/// Streams one blob into its queue. Returns false when the run cannot go on (the blob failed,
/// or the writer stopped listening).
fn download(registry: &Registry, reference: &RegistryRef, job: &Job, tx: SyncSender<Item>) -> bool {
    let mut splitter = Splitter::new(job, tx);
    let result = registry.stream_blob(reference, &job.digest, job.size, &mut splitter, None);
    if splitter.stopped {
        return false;
    }
    let err = |reason: String| EngineError::Download {
        layer: job.layer.clone(),
        blob: job.digest.clone(),
        reason,
    };
    match result {
        Ok(()) if splitter.buf.is_empty() => true,
        Ok(()) => {
            let n = splitter.frames;
            splitter.fail(err(format!("the blob ends inside zstd frame {n}")));
            false
        }
        Err(e) => {
            splitter.fail(err(e.full_text()));
            false
        }
    }
}

/// A `Write` that cuts the bytes into zstd frames and queues each whole frame.
struct Splitter<'a> {
    job: &'a Job,
    tx: SyncSender<Item>,
    buf: Vec<u8>,
    /// Frames queued so far.
    frames: u64,
    /// A frame never compresses to more than this; a longer undecodable run is corrupt.
    bound: usize,
    /// The writer dropped its end (it failed, and reports why).
    stopped: bool,
}

impl<'a> Splitter<'a> {
    fn new(job: &'a Job, tx: SyncSender<Item>) -> Self {
        Splitter {
            job,
            tx,
            buf: Vec::new(),
            frames: 0,
            bound: zstd::zstd_safe::compress_bound(job.frame_size as usize) + (64 << 10),
            stopped: false,
        }
    }

    fn fail(&mut self, e: EngineError) {
        let _ = self.tx.send(Err(e));
    }

    fn queue(&mut self, item: Item) -> std::io::Result<()> {
        self.tx.send(item).map_err(|_| {
            self.stopped = true;
            std::io::Error::other("the writer stopped")
        })
    }

    /// Queues every whole frame at the front of the buffer.
    fn cut(&mut self) -> std::io::Result<()> {
        while !self.buf.is_empty() {
            match zstd::zstd_safe::find_frame_compressed_size(&self.buf) {
                Ok(n) if n <= self.buf.len() => {
                    // The next frame's buffer, sized so that it need not grow as bytes arrive.
                    let mut next = Vec::with_capacity(self.bound.min(8 << 20));
                    next.extend_from_slice(&self.buf[n..]);
                    self.buf.truncate(n);
                    let frame = std::mem::replace(&mut self.buf, next);
                    self.queue(Ok(frame))?;
                    self.frames += 1;
                }
                Ok(_) => return Ok(()),
                Err(_) if self.buf.len() < self.bound => return Ok(()), // not all here yet
                Err(code) => {
                    let e = EngineError::Blob {
                        layer: self.job.layer.clone(),
                        blob: self.job.digest.clone(),
                        reason: format!(
                            "zstd frame {}: {}",
                            self.frames,
                            zstd::zstd_safe::get_error_name(code)
                        ),
                    };
                    self.queue(Err(e))?;
                    self.stopped = true;
                    return Err(std::io::Error::other("corrupt zstd frame"));
                }
            }
        }
        Ok(())
    }
}

impl Write for Splitter<'_> {
    fn write(&mut self, data: &[u8]) -> std::io::Result<usize> {
        if self.buf.capacity() == 0 {
            self.buf.reserve(self.bound.min(8 << 20));
        }
        self.buf.extend_from_slice(data);
        self.cut()?;
        Ok(data.len())
    }

    fn flush(&mut self) -> std::io::Result<()> {
        Ok(())
    }
}
