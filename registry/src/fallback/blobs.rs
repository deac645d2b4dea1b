//! Blobs from a reference's sources in order (the machinery is the parent's: `Failures`, the
//! sources of a blob, the refusals): a small blob into memory, a blob streamed into a sink
//! (continued by the next source from the byte reached), a range for `layerfs`, a blob into a
//! file through its partial file. [`SourcedWrite`] is the sink that learns who sent which bytes.

use std::io::Write;
use std::path::Path;

use indicatif::ProgressBar;
use sha2::{Digest, Sha256};
use tracing::warn;

use super::{kind, Failures};
use crate::blob::{check_digest, MAX_IN_MEMORY_BLOB};
use crate::client::{Registry, SourceName};
use crate::error::RegistryError;
use crate::error_chain::text as chain;
use crate::reference::RegistryRef;

/// A sink of a streamed blob that is told which source sends the bytes that follow, so that it
/// can blame the right one for bytes that fail its own check.
pub trait SourcedWrite: Write {
    /// The bytes from blob offset `at` on come from `source` (until the next call).
    fn source(&mut self, source: &SourceName, at: u64);
}

/// A plain `Write` as a [`SourcedWrite`] that does not care who sends.
struct Unsourced<'a, W: Write + ?Sized>(&'a mut W);

impl<W: Write + ?Sized> Write for Unsourced<'_, W> {
    fn write(&mut self, buf: &[u8]) -> std::io::Result<usize> {
        self.0.write(buf)
    }

    fn flush(&mut self) -> std::io::Result<()> {
        self.0.flush()
    }
}

impl<W: Write + ?Sized> SourcedWrite for Unsourced<'_, W> {
    fn source(&mut self, _: &SourceName, _: u64) {}
}

/// A `Write` that counts what passes, and what the sink refused with an error (the writer's
/// pipeline, stopped by a block that failed its check): a source sent those bytes all the same.
struct Counting<'a, W: Write + ?Sized> {
    inner: &'a mut W,
    n: u64,
    refused: u64,
}

impl<W: Write + ?Sized> Write for Counting<'_, W> {
    fn write(&mut self, buf: &[u8]) -> std::io::Result<usize> {
        match self.inner.write(buf) {
            Ok(n) => {
                self.n += n as u64;
                Ok(n)
            }
            Err(e) => {
                self.refused += buf.len() as u64;
                Err(e)
            }
        }
    }

    fn flush(&mut self) -> std::io::Result<()> {
        self.inner.flush()
    }
}

impl Registry {
    /// A small blob (the stack descriptor), read into memory, digest and size checked; a
    /// source whose bytes fail is skipped.
    pub fn fetch_blob(
        &self,
        reference: &RegistryRef,
        digest: &str,
        size: u64,
    ) -> Result<Vec<u8>, RegistryError> {
        if size > MAX_IN_MEMORY_BLOB {
            return Err(RegistryError::Protocol(format!(
                "blob {digest} is {size} bytes: too large to read into memory (stream it)"
            )));
        }
        let sources = self.blob_sources(reference, digest)?;
        let what = format!("blob {digest}");
        let mut failures = Failures::default();
        for (i, src) in sources.iter().enumerate() {
            let mut sink = std::io::Cursor::new(Vec::with_capacity(size as usize));
            let got = self.block_on(async {
                let ep = self.endpoint(src).await?;
                ep.stream_blob_async(&src.reference, digest, size, &mut sink, None)
                    .await
            });
            let bytes = sink.into_inner();
            self.count(src, bytes.len() as u64, got.is_ok());
            match got {
                Ok(()) => return Ok(bytes),
                Err(e) => failures.add(self, &what, src, sources.get(i + 1), e),
            }
        }
        Err(failures.into_error(&what))
    }

    /// Stream one blob into `sink`, and check its size and SHA-256. Every byte reaches the sink
    /// once, in order: a dropped connection resumes with a `Range` request, and a source that
    /// gives up (its retries used, too slow) is continued by the next source from the byte
    /// reached. Bytes reach the sink before the digest is known, so a caller that must not keep
    /// bad bytes writes to a temporary place (as [`Registry::pull_blob_to_file`] does) or checks
    /// them finer-grained itself (the writer checks every block against the layer's signed
    /// verity tree). A digest that fails at the end refuses the sources that sent the blob for
    /// it: a caller that streams the blob again gets the others.
    pub fn stream_blob<W: Write + ?Sized>(
        &self,
        reference: &RegistryRef,
        digest: &str,
        size: u64,
        sink: &mut W,
        progress: Option<&ProgressBar>,
    ) -> Result<(), RegistryError> {
        let mut sink = Unsourced(sink);
        self.stream_blob_sourced(reference, digest, size, &mut sink, progress)
    }

    /// [`Registry::stream_blob`], the sink told which source sends which bytes
    /// ([`SourcedWrite::source`]) before they arrive.
    pub fn stream_blob_sourced<W: SourcedWrite + ?Sized>(
        &self,
        reference: &RegistryRef,
        digest: &str,
        size: u64,
        sink: &mut W,
        progress: Option<&ProgressBar>,
    ) -> Result<(), RegistryError> {
        let sources = self.blob_sources(reference, digest)?;
        let what = format!("blob {digest}");
        let mut hasher = Sha256::new();
        let mut sink = Counting {
            inner: sink,
            n: 0,
            refused: 0,
        };
        let mut ranged = Vec::new();
        let mut senders = Vec::new();
        let mut failures = Failures::default();
        for (i, src) in sources.iter().enumerate() {
            let before = sink.n;
            sink.inner.source(&SourceName::of(src), before);
            let got = self.block_on(async {
                let ep = self.endpoint(src).await?;
                ep.stream_part_async(
                    &src.reference,
                    digest,
                    size,
                    before,
                    &mut hasher,
                    &mut sink,
                    progress,
                )
                .await
            });
            if sink.n > before {
                senders.push(src.clone());
            }
            match got {
                Ok(r) => {
                    ranged.extend(r);
                    let checked = check_digest(digest, size, hasher, &ranged);
                    // A blob whose bytes fail its digest is not one this source served.
                    self.count(src, sink.n - before, checked.is_ok());
                    if let Err(e) = &checked {
                        let why = format!("refused for this blob: {}", chain(e));
                        let mut refused = self.refused.lock().expect("not poisoned");
                        for s in senders {
                            warn!(
                                "{what}: {} {} is refused for this blob from now on",
                                kind(&s),
                                s.location
                            );
                            self.log.failed(&SourceName::of(&s), &what, &why, false);
                            refused.insert((digest.to_owned(), s.location));
                        }
                    }
                    return checked;
                }
                // The sink refused the bytes: no other source changes that.
                Err(e @ RegistryError::Io { .. }) => {
                    self.count(src, sink.n - before + sink.refused, false);
                    return Err(e);
                }
                Err(e) => {
                    self.count(src, sink.n - before, false);
                    failures.add(self, &what, src, sources.get(i + 1), e);
                }
            }
        }
        Err(failures.into_error(&what))
    }

    /// Bytes `range` of a blob, read into memory (one zstd frame of a layer, say), from the
    /// first source not refused for the blob that serves them, and that source. Not checked
    /// against the digest, which covers the whole blob: the caller checks what it reads (a
    /// layer's frames, every block against the signed verity tree: `BlobFrames`) and
    /// refuses the source whose bytes fail ([`Registry::refuse`]).
    pub fn fetch_range(
        &self,
        reference: &RegistryRef,
        digest: &str,
        size: u64,
        range: std::ops::Range<u64>,
    ) -> Result<(Vec<u8>, SourceName), RegistryError> {
        let sources = self.blob_sources(reference, digest)?;
        let what = format!("blob {digest} (bytes {range:?})");
        let mut failures = Failures::default();
        for (i, src) in sources.iter().enumerate() {
            let got = self.block_on(async {
                let ep = self.endpoint(src).await?;
                ep.fetch_range_async(&src.reference, digest, size, range.clone())
                    .await
            });
            match got {
                Ok(bytes) => {
                    // Counted now: bytes the caller then refuses were served all the same.
                    self.count(src, bytes.len() as u64, false);
                    return Ok((bytes, SourceName::of(src)));
                }
                Err(e @ RegistryError::Protocol(_)) => return Err(e),
                Err(e) => failures.add(self, &what, src, sources.get(i + 1), e),
            }
        }
        Err(failures.into_error(&what))
    }

    /// Download a blob to `dest`: into its partial file beside it (`.partial-<hex>`), renamed
    /// into place only after the size and digest check. Bad bytes are never left at `dest`.
    /// A partial file an interrupted run left is resumed from its length; a source that gives
    /// up is continued by the next from the partial file; bytes that fail the digest are
    /// discarded and the blob fetched whole from the next source.
    pub fn pull_blob_to_file(
        &self,
        reference: &RegistryRef,
        digest: &str,
        size: u64,
        dest: &Path,
        progress: Option<&ProgressBar>,
    ) -> Result<(), RegistryError> {
        self.block_on(self.pull_blob_to_file_async(reference, digest, size, dest, progress))
            .map(|_| ())
    }

    /// [`Registry::pull_blob_to_file`]; returns how many bytes this call downloaded.
    pub(crate) async fn pull_blob_to_file_async(
        &self,
        reference: &RegistryRef,
        digest: &str,
        size: u64,
        dest: &Path,
        progress: Option<&ProgressBar>,
    ) -> Result<u64, RegistryError> {
        let sources = self.blob_sources(reference, digest)?;
        let what = format!("blob {digest}");
        let mut failures = Failures::default();
        let mut downloaded = 0;
        for (i, src) in sources.iter().enumerate() {
            let partial = crate::partial::path_for(dest, digest)?;
            let had = std::fs::metadata(&partial).map_or(0, |m| m.len());
            let got = match self.endpoint(src).await {
                Ok(ep) => {
                    ep.pull_blob_to_file_async(&src.reference, digest, size, dest, progress)
                        .await
                }
                Err(e) => Err(e),
            };
            match got {
                Ok(n) => {
                    self.count(src, n, true);
                    return Ok(downloaded + n);
                }
                Err(e) => {
                    let now = std::fs::metadata(&partial).map_or(0, |m| m.len());
                    let n = now.saturating_sub(had);
                    self.count(src, n, false);
                    downloaded += n;
                    if matches!(e, RegistryError::Io { .. } | RegistryError::Layout(_)) {
                        return Err(e);
                    }
                    failures.add(self, &what, src, sources.get(i + 1), e);
                }
            }
        }
        Err(failures.into_error(&what))
    }

    /// Whether the origin already has a blob (a HEAD request; publishing only).
    pub fn blob_exists(
        &self,
        reference: &RegistryRef,
        digest: &str,
    ) -> Result<bool, RegistryError> {
        self.block_on(self.origin.blob_exists_async(reference, digest))
    }
}
