//! One blob streamed into a sink: every byte once and in order, hashed as it arrives, resumed
//! after a failure with `Range: bytes=OFFSET-` from the last good byte, and checked against its
//! size and digest at the end. A registry that ignores the `Range` request (a 200) sends bytes
//! the sink has again: they are dropped. One that answers it for the wrong bytes is caught by
//! the `Content-Range` it gives, or by the digest, and the error says a range answer was wrong.
//!
//! The minimum speed ([`crate::limits`]) holds per blob: one window runs across every response
//! of the blob, and a failure that moved forward starts the retry count over only if the blob
//! is on pace. So a registry that sends a few bytes per connection and closes is given up on.

use std::io::Write;

use bytes::Bytes;
use futures_util::StreamExt;
use indicatif::ProgressBar;
use reqwest::header::{HeaderValue, CONTENT_RANGE, RANGE};
use reqwest::StatusCode;
use sha2::{Digest, Sha256};
use tracing::{debug, info, warn};

use crate::client::Endpoint;
use crate::error::{Cause, RegistryError};
use crate::http::error_answer;
use crate::limits::Throughput;
use crate::reference::RegistryRef;
use crate::retry::{Budget, Failure};
use crate::token::Access;

/// The largest blob [`Registry::fetch_blob`] reads into memory.
pub const MAX_IN_MEMORY_BLOB: u64 = 64 << 20;

/// The first bytes of a blob a sink already holds, and their running SHA-256.
#[derive(Default)]
pub(crate) struct Prefix {
    pub(crate) len: u64,
    pub(crate) hasher: Sha256,
}

/// One blob of a repository.
struct BlobAt<'a> {
    reference: &'a RegistryRef,
    digest: &'a str,
    size: u64,
}

/// A blob answer: the whole blob (200), or the range asked for (206).
enum Answer {
    Full(reqwest::Response),
    Partial(reqwest::Response),
}

/// Where one blob's bytes go as they arrive: the running digest, the sink, the progress bar;
/// `offset` is how many bytes the sink has, across every resumed request.
struct Received<'a, W: Write + ?Sized> {
    digest: &'a str,
    size: u64,
    /// Where this transfer stops: `size`, or the end of the range asked for.
    end: u64,
    offset: &'a mut u64,
    hasher: &'a mut Sha256,
    sink: &'a mut W,
    progress: Option<&'a ProgressBar>,
}

impl<W: Write + ?Sized> Received<'_, W> {
    /// Reads one response to its end (or the blob's): `skip` bytes are already in the sink (a
    /// registry that ignored the Range request sends them again). `pace` is the blob's, across
    /// its responses. Returns why the response stopped early, if it did; an error only for what
    /// no retry can fix.
    async fn drain<S>(
        &mut self,
        mut stream: S,
        mut skip: u64,
        pace: &mut Throughput,
    ) -> Result<Option<Failure>, RegistryError>
    where
        S: futures_util::Stream<Item = Result<Bytes, reqwest::Error>> + Unpin,
    {
        let (size, end, digest) = (self.size, self.end, self.digest);
        while *self.offset < end {
            let next = match tokio::time::timeout_at(pace.window_end(), stream.next()).await {
                Ok(next) => next,
                Err(_) => match pace.check() {
                    Ok(()) => continue,
                    Err(slow) => return Ok(Some(Failure::TooSlow(Cause::TooSlow(slow.0)))),
                },
            };
            let mut chunk = match next {
                None => {
                    return Ok(Some(Failure::Transient(Cause::Truncated {
                        at: *self.offset,
                        size,
                    })))
                }
                Some(Err(e)) => return Ok(Some(Failure::Transient(Cause::Http(e)))),
                Some(Ok(chunk)) => chunk,
            };
            if skip > 0 {
                // Bytes already handed to the sink, sent again.
                let n = skip.min(chunk.len() as u64);
                skip -= n;
                chunk = chunk.slice(n as usize..);
                if chunk.is_empty() {
                    continue;
                }
            }
            if end < size && chunk.len() as u64 > end - *self.offset {
                // A range inside the blob: a registry that ignored the Range request goes on.
                chunk = chunk.slice(..(end - *self.offset) as usize);
            }
            if chunk.len() as u64 > size - *self.offset {
                return Err(RegistryError::Integrity {
                    blob: digest.to_owned(),
                    detail: format!(
                        "the registry sent more than the {size} bytes the manifest gives; \
                         discarded"
                    ),
                });
            }
            self.hasher.update(&chunk);
            self.sink
                .write_all(&chunk)
                .map_err(RegistryError::io(&sink_name(digest)))?;
            *self.offset += chunk.len() as u64;
            if let Some(p) = self.progress {
                p.inc(chunk.len() as u64);
            }
            pace.add(chunk.len() as u64);
            if let Err(slow) = pace.check() {
                return Ok(Some(Failure::TooSlow(Cause::TooSlow(slow.0))));
            }
        }
        Ok(None)
    }
}

/// How an error names a blob's sink.
fn sink_name(digest: &str) -> std::path::PathBuf {
    format!("(destination of blob {digest})").into()
}

/// The first byte a `Content-Range: bytes FIRST-LAST/SIZE` answer holds.
fn content_range_start(value: &HeaderValue) -> Option<u64> {
    let v = value
        .to_str()
        .ok()?
        .trim()
        .strip_prefix("bytes")?
        .trim_start();
    v.split('-').next()?.trim().parse().ok()
}

impl Endpoint {
    /// `GET` a blob, from `offset` (to `offset + length` when given).
    async fn blob_request(
        &self,
        blob: &BlobAt<'_>,
        offset: u64,
        length: Option<u64>,
        what: &str,
    ) -> Result<Answer, Failure> {
        let ctx = self.ctx();
        let url = format!("{}/blobs/{}", self.repo_url(blob.reference), blob.digest);
        let range = match length {
            Some(len) => Some(format!(
                "bytes={offset}-{}",
                (offset + len).saturating_sub(1)
            )),
            None if offset > 0 => Some(format!("bytes={offset}-")),
            None => None,
        };
        let build = || {
            let request = self.transport.http.get(&url);
            match &range {
                Some(r) => request.header(RANGE, r.as_str()),
                None => request,
            }
        };
        let (response, _) = self.send(blob.reference, Access::Pull, what, build).await?;
        match response.status() {
            StatusCode::OK => Ok(Answer::Full(response)),
            StatusCode::PARTIAL_CONTENT => {
                let first = response.headers().get(CONTENT_RANGE);
                match first.map(content_range_start) {
                    Some(Some(first)) if first != offset => {
                        Err(Failure::Fatal(RegistryError::Integrity {
                            blob: blob.digest.to_owned(),
                            detail: format!(
                                "the registry's range answer was wrong: asked for {}, it \
                                 answered with bytes from {first} (Content-Range: {})",
                                range.as_deref().unwrap_or("the whole blob"),
                                ctx.text(first_header(&response).as_bytes())
                            ),
                        }))
                    }
                    _ => Ok(Answer::Partial(response)),
                }
            }
            s if s.is_success() => Err(Failure::Fatal(RegistryError::Refused {
                what: what.to_owned(),
                cause: Cause::Answer(format!("HTTP {s} is not an answer to a blob request")),
            })),
            _ => Err(error_answer(&ctx, what, response).await),
        }
    }

    /// Bytes `range` of a blob, read into memory (one zstd frame of a layer, say). Not checked
    /// against the digest, which covers the whole blob: the caller checks what it reads (the
    /// writer checks every block against the layer's signed verity tree).
    pub(crate) async fn fetch_range_async(
        &self,
        reference: &RegistryRef,
        digest: &str,
        size: u64,
        range: std::ops::Range<u64>,
    ) -> Result<Vec<u8>, RegistryError> {
        if range.start > range.end || range.end > size {
            return Err(RegistryError::Protocol(format!(
                "blob {digest}: bytes {range:?} lie outside its {size} bytes"
            )));
        }
        if range.end - range.start > MAX_IN_MEMORY_BLOB {
            return Err(RegistryError::Protocol(format!(
                "blob {digest}: {} bytes at once are too many to read into memory",
                range.end - range.start
            )));
        }
        let mut sink = Vec::with_capacity((range.end - range.start) as usize);
        let blob = BlobAt {
            reference,
            digest,
            size,
        };
        let mut hasher = Sha256::new(); // unused: a range has no digest of its own
        self.stream_range_async(&blob, range, &mut hasher, &mut sink, None)
            .await?;
        Ok(sink)
    }

    /// Streams bytes `range` of a blob into `sink` and `hasher`, resuming with `Range` requests
    /// after transient failures. Every byte of the range reaches the sink once, in order (a
    /// registry that ignores a `Range` request sends the blob from its start; the bytes before
    /// the range, or already in the sink, are dropped). Returns the offsets at which a 206
    /// answer began (for the message when the digest then fails).
    async fn stream_range_async<W: Write + ?Sized>(
        &self,
        blob: &BlobAt<'_>,
        range: std::ops::Range<u64>,
        hasher: &mut Sha256,
        sink: &mut W,
        progress: Option<&ProgressBar>,
    ) -> Result<Vec<u64>, RegistryError> {
        let (digest, size) = (blob.digest, blob.size);
        if !ingot_layers::descriptor::is_sha256_digest(digest) {
            return Err(RegistryError::Protocol(format!(
                "`{digest}` is not a sha256 digest"
            )));
        }
        let what = format!("blob {digest}");
        let mut budget = Budget::new(self.options.retry);
        // One window for the whole blob, across its responses and the waits between them.
        let mut pace = Throughput::start(self.options.speed);
        let mut ranged = Vec::new();
        let mut offset = range.start;
        while offset < range.end {
            let start = offset;
            if offset > range.start || (offset > 0 && range.end == size) {
                info!("{what}: resuming at byte {offset} of {size}");
            }
            // A whole blob starts with a plain request (a 200); anything else asks for a Range,
            // to the end of the range when it ends inside the blob.
            let length = (range.end < size).then(|| range.end - offset);
            let failure = match self.blob_request(blob, offset, length, &what).await {
                Err(f) => Some(f),
                Ok(answer) => {
                    // After a Range request the registry ignored: bytes to drop from the front.
                    let (response, skip) = match answer {
                        Answer::Partial(r) => {
                            ranged.push(offset);
                            (r, 0)
                        }
                        Answer::Full(r) if offset != 0 => {
                            warn!(
                                "{what}: the registry ignored the Range request; skipping the \
                                 {offset} bytes it sends again"
                            );
                            (r, offset)
                        }
                        Answer::Full(r) => (r, 0),
                    };
                    let mut into = Received {
                        digest,
                        size,
                        end: range.end,
                        offset: &mut offset,
                        hasher: &mut *hasher,
                        sink: &mut *sink,
                        progress,
                    };
                    into.drain(Box::pin(response.bytes_stream()), skip, &mut pace)
                        .await?
                }
            };
            let (cause, slow) = match failure {
                None => continue,
                Some(Failure::Fatal(e)) => return Err(e),
                Some(Failure::Transient(c)) => (c, false),
                Some(Failure::TooSlow(c)) => (c, true),
            };
            if slow {
                pace.restart();
            }
            // Progress renews the retry budget, unless it came too slowly to count.
            let renewed = offset > start && !slow && pace.on_pace();
            let Some(wait) = budget.failed(renewed) else {
                return Err(RegistryError::Transient {
                    op: format!("{what} (at byte {offset} of {size})"),
                    attempts: budget.failures(),
                    last: cause,
                });
            };
            warn!(
                "{what}: {} at byte {offset} of {size}; resuming in {wait:?} ({}/{})",
                crate::error_chain::text(&cause),
                budget.failures(),
                budget.attempts()
            );
            tokio::time::sleep(wait).await;
        }
        Ok(ranged)
    }

    pub(crate) async fn stream_blob_async<W: Write + ?Sized>(
        &self,
        reference: &RegistryRef,
        digest: &str,
        size: u64,
        sink: &mut W,
        progress: Option<&ProgressBar>,
    ) -> Result<(), RegistryError> {
        let from_zero = Prefix::default();
        self.stream_blob_after_async(reference, digest, size, from_zero, sink, progress)
            .await
    }

    /// A blob into a sink that already holds its first `prefix.len` bytes (an interrupted
    /// run's partial file): the first request is a `Range` request from there, as after a
    /// dropped connection, and the digest check covers the prefix too.
    pub(crate) async fn stream_blob_after_async<W: Write + ?Sized>(
        &self,
        reference: &RegistryRef,
        digest: &str,
        size: u64,
        prefix: Prefix,
        sink: &mut W,
        progress: Option<&ProgressBar>,
    ) -> Result<(), RegistryError> {
        let Prefix { len, mut hasher } = prefix;
        if let Some(p) = progress {
            p.set_position(len);
        }
        let ranged = self
            .stream_part_async(reference, digest, size, len, &mut hasher, sink, progress)
            .await?;
        check_digest(digest, size, hasher, &ranged)
    }

    /// Bytes `from..` of a blob into `sink` and `hasher` (no digest check: the caller makes it
    /// when the blob is whole, [`check_digest`]). Returns where 206 answers began.
    #[allow(clippy::too_many_arguments)]
    pub(crate) async fn stream_part_async<W: Write + ?Sized>(
        &self,
        reference: &RegistryRef,
        digest: &str,
        size: u64,
        from: u64,
        hasher: &mut Sha256,
        sink: &mut W,
        progress: Option<&ProgressBar>,
    ) -> Result<Vec<u64>, RegistryError> {
        let blob = BlobAt {
            reference,
            digest,
            size,
        };
        let ranged = self
            .stream_range_async(&blob, from..size, hasher, sink, progress)
            .await?;
        sink.flush()
            .map_err(RegistryError::io(&sink_name(digest)))?;
        Ok(ranged)
    }
}

/// Whether the bytes hashed into `hasher` are the blob `digest`; `ranged`: where answers to
/// Range requests began, for the message.
pub(crate) fn check_digest(
    digest: &str,
    size: u64,
    hasher: Sha256,
    ranged: &[u64],
) -> Result<(), RegistryError> {
    let actual = format!("sha256:{}", hex::encode(hasher.finalize()));
    if actual != digest {
        let why = if ranged.is_empty() {
            "the registry's copy is corrupt or was replaced".to_owned()
        } else {
            format!(
                "the bytes from {} came in answers to Range requests: the registry's range \
                 answer was wrong, or its copy is corrupt",
                ranged
                    .iter()
                    .map(|o| format!("byte {o}"))
                    .collect::<Vec<_>>()
                    .join(", ")
            )
        };
        return Err(RegistryError::Integrity {
            blob: digest.to_owned(),
            detail: format!("the registry's bytes hash to {actual}; discarded ({why})"),
        });
    }
    debug!("blob {digest}: {size} bytes, digest ok");
    Ok(())
}

/// The `Content-Range` header of a response, for a message.
fn first_header(response: &reqwest::Response) -> String {
    response
        .headers()
        .get(CONTENT_RANGE)
        .and_then(|v| v.to_str().ok())
        .unwrap_or("")
        .to_owned()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn content_range_starts_are_read() {
        let v = |s: &str| HeaderValue::from_str(s).unwrap();
        assert_eq!(content_range_start(&v("bytes 100-199/1000")), Some(100));
        assert_eq!(content_range_start(&v("bytes 0-9/*")), Some(0));
        assert_eq!(content_range_start(&v("bytes */1000")), None);
        assert_eq!(content_range_start(&v("items 1-2/3")), None);
    }
}
