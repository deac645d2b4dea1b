//! Layers' data blobs straight from a registry into the write pipeline, nothing staged on a
//! file system: one download thread fetches the selected layers' blobs in stacking order and
//! cuts each into its zstd frames as the bytes arrive; each layer's frames wait in a short
//! bounded queue for [`crate::engine::layer::write_layer`]. The next layer's download therefore
//! overlaps this layer's write, memory stays bounded (a full queue holds the download back),
//! and a dropped connection resumes with a `Range` request from the last byte received
//! ([`ingot_artifact::registry::Registry::stream_blob_sourced`]), which also checks each blob's
//! digest at its end.
//!
//! Each stream records which source sent which frames ([`Senders`]): when a layer's bytes fail
//! the engine's check, the `write` step refuses that source for the blob and asks for the layer
//! again ([`Streams::again`]): the download thread of the first attempt stops (its queues are
//! dropped) and a new one streams this layer, and those after it, from the sources left.

use std::collections::VecDeque;
use std::io::Write;
use std::sync::mpsc::{sync_channel, Receiver, SyncSender};
use std::sync::{Arc, Mutex};
use std::thread::Scope;

use ingot_artifact::registry::{Registry, RegistryError, RegistryRef, SourceName, SourcedWrite};

use crate::engine::frames::{FrameData, Frames};
use crate::engine::EngineError;

/// Compressed frames a layer's queue holds (each at most a frame's compressed size).
const QUEUE: usize = 8;

type Item = Result<Vec<u8>, EngineError>;

/// One blob to stream.
#[derive(Clone)]
pub struct Job {
    pub layer: String,
    pub digest: String,
    pub size: u64,
    pub frame_size: u64,
}

/// Who sent what of one attempt at a blob.
#[derive(Default)]
struct Log {
    /// Each source that sent, with the blob offset it started at, in order.
    spans: Vec<(SourceName, u64)>,
    /// The blob offset where each queued frame starts.
    frame_starts: Vec<u64>,
    /// The blob offset reached.
    end: u64,
    /// The frame the splitter found corrupt (not a zstd frame).
    corrupt_frame: Option<u64>,
    /// The blob's bytes failed its digest at the end.
    digest_failed: bool,
}

/// The record of which source sent which frames of one attempt at a blob.
pub struct Senders(Arc<Mutex<Log>>);

impl Senders {
    /// The sources that sent bytes of compressed frame `frame`, or of the whole attempt when
    /// `None`.
    pub fn of(&self, frame: Option<u64>) -> Vec<SourceName> {
        let log = self.0.lock().expect("not poisoned");
        let range = match frame.and_then(|f| log.frame_starts.get(f as usize).map(|s| (f, *s))) {
            Some((f, start)) => {
                let end = log
                    .frame_starts
                    .get(f as usize + 1)
                    .copied()
                    .unwrap_or(log.end);
                start..end.max(start + 1)
            }
            None => 0..log.end.max(1),
        };
        let mut out: Vec<SourceName> = Vec::new();
        for (i, (source, from)) in log.spans.iter().enumerate() {
            let to = log.spans.get(i + 1).map_or(u64::MAX, |(_, at)| *at);
            // A span that sent nothing (the source failed at once) covers no byte.
            if *from < to && *from < range.end && range.start < to && !out.contains(source) {
                out.push(source.clone());
            }
        }
        out
    }

    /// The frame the download found corrupt, if the splitter did.
    pub fn corrupt_frame(&self) -> Option<u64> {
        self.0.lock().expect("not poisoned").corrupt_frame
    }

    /// Whether the blob's bytes failed its digest at the end (the registry refused its senders
    /// for it already).
    pub fn digest_failed(&self) -> bool {
        self.0.lock().expect("not poisoned").digest_failed
    }
}

/// One blob's compressed frames, as they arrive, and who sent them.
pub struct Stream {
    rx: Receiver<Item>,
    log: Arc<Mutex<Log>>,
}

impl Stream {
    /// The frames, for [`crate::engine::layer::write_layer`], and the record of who sent them.
    pub fn frames<'f>(self) -> (Frames<'f>, Senders) {
        (
            Box::new(self.rx.into_iter().map(|r| r.map(FrameData::Owned))),
            Senders(self.log),
        )
    }
}

/// The streams of the layers not on this machine, handed out in order.
pub struct Streams<'scope, 'env> {
    scope: &'scope Scope<'scope, 'env>,
    registry: &'env Registry,
    reference: &'env RegistryRef,
    jobs: Vec<Job>,
    /// Jobs handed out so far.
    next: usize,
    /// The streams of `jobs[next..]`.
    queued: VecDeque<Stream>,
}

impl<'scope, 'env> Streams<'scope, 'env> {
    /// Starts the download thread in `scope`. Drop this (so the download stops) before the
    /// scope ends: a stream still held keeps its download waiting.
    pub fn start(
        scope: &'scope Scope<'scope, 'env>,
        registry: &'env Registry,
        reference: &'env RegistryRef,
        jobs: Vec<Job>,
    ) -> Self {
        let queued = spawn(scope, registry, reference, jobs.clone());
        Streams {
            scope,
            registry,
            reference,
            jobs,
            next: 0,
            queued,
        }
    }

    /// The registry the blobs come from.
    pub fn registry(&self) -> &'env Registry {
        self.registry
    }

    /// The reference they are fetched for.
    pub fn reference(&self) -> &'env RegistryRef {
        self.reference
    }

    /// The next layer's stream.
    pub fn next_stream(&mut self) -> Stream {
        self.next += 1;
        self.queued
            .pop_front()
            .expect("one stream per layer not on this machine")
    }

    /// The last layer handed out, streamed again from the start (from the sources not refused
    /// for its blob): the download of the attempt before stops, and a new one streams this
    /// layer and those after it.
    pub fn again(&mut self) -> Stream {
        self.queued.clear();
        let from = self.next - 1;
        self.queued = spawn(
            self.scope,
            self.registry,
            self.reference,
            self.jobs[from..].to_vec(),
        );
        self.queued.pop_front().expect("this layer's stream")
    }
}

/// Starts a download thread in `scope` for `jobs`; returns one stream per job, in order.
fn spawn<'scope, 'env>(
    scope: &'scope Scope<'scope, 'env>,
    registry: &'env Registry,
    reference: &'env RegistryRef,
    jobs: Vec<Job>,
) -> VecDeque<Stream> {
    let mut streams = VecDeque::new();
    let mut work = Vec::new();
    for job in jobs {
        let (tx, rx) = sync_channel::<Item>(QUEUE);
        let log = Arc::new(Mutex::new(Log::default()));
        streams.push_back(Stream {
            rx,
            log: Arc::clone(&log),
        });
        work.push((job, tx, log));
    }
    scope.spawn(move || {
        for (job, tx, log) in work {
            if !download(registry, reference, &job, tx, log) {
                break;
            }
        }
    });
    streams
}

/// Streams one blob into its queue. Returns false when the run cannot go on (the blob failed,
/// or the writer stopped listening).
fn download(
    registry: &Registry,
    reference: &RegistryRef,
    job: &Job,
    tx: SyncSender<Item>,
    log: Arc<Mutex<Log>>,
) -> bool {
    let mut splitter = Splitter::new(job, tx, log);
    let result =
        registry.stream_blob_sourced(reference, &job.digest, job.size, &mut splitter, None);
    if matches!(result, Err(RegistryError::Integrity { .. })) {
        splitter.log().digest_failed = true;
    }
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
    /// Who sent what.
    log: Arc<Mutex<Log>>,
    /// The blob offset of `buf[0]`.
    at: u64,
}

impl<'a> Splitter<'a> {
    fn new(job: &'a Job, tx: SyncSender<Item>, log: Arc<Mutex<Log>>) -> Self {
        Splitter {
            job,
            tx,
            buf: Vec::new(),
            frames: 0,
            bound: zstd::zstd_safe::compress_bound(job.frame_size as usize) + (64 << 10),
            stopped: false,
            log,
            at: 0,
        }
    }

    fn log(&self) -> std::sync::MutexGuard<'_, Log> {
        self.log.lock().expect("not poisoned")
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
                    let start = self.at;
                    self.log().frame_starts.push(start);
                    self.at += n as u64;
                    self.queue(Ok(frame))?;
                    self.frames += 1;
                }
                Ok(_) => return Ok(()),
                Err(_) if self.buf.len() < self.bound => return Ok(()), // not all here yet
                Err(code) => {
                    let (start, frame) = (self.at, self.frames);
                    let mut log = self.log();
                    log.frame_starts.push(start);
                    log.corrupt_frame = Some(frame);
                    drop(log);
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
        self.log().end += data.len() as u64;
        self.cut()?;
        Ok(data.len())
    }

    fn flush(&mut self) -> std::io::Result<()> {
        Ok(())
    }
}

impl SourcedWrite for Splitter<'_> {
    fn source(&mut self, source: &SourceName, at: u64) {
        self.log().spans.push((source.clone(), at));
    }
}
