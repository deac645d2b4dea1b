//! Blobs and manifests up to a registry, by the distribution spec's upload protocol, on the same
//! client, authorization (`token`, a `pull,push` token) and failure classification (`retry`) as
//! every pull:
//!
//! - a blob: `POST …/blobs/uploads/` opens a session (`202`, its URL in `Location`), then either
//!   one `PUT <location>?digest=…` streaming the whole file (the default), or, with `chunked`, a
//!   `PATCH <location>` per 4 MiB (`Content-Range`, each answer naming the next location) and an
//!   empty closing `PUT`; `201` is success;
//! - a manifest: `PUT …/manifests/<tag or digest>` with its exact bytes and media type.
//!
//! Uploads are streamed from the file in `push_item`-sized items, never the whole blob in memory.
//! An interrupted upload restarts that blob from a new session; before a retry the registry is
//! asked whether the blob arrived after all.

use std::io::Read;
use std::path::Path;

use bytes::Bytes;
use futures_util::StreamExt;
use indicatif::ProgressBar;
use reqwest::header::{HeaderValue, AUTHORIZATION, CONTENT_LENGTH, CONTENT_TYPE, LOCATION};
use reqwest::StatusCode;

use crate::client::Endpoint;
use crate::error::{Cause, RegistryError};
use crate::http::error_answer;
use crate::oci_layout::sha256_digest;
use crate::reference::RegistryRef;
use crate::retry::{classify_http, retry, Failure};
use crate::token::Access;

/// The media type of a blob's bytes in an upload request.
const OCTET_STREAM: &str = "application/octet-stream";

/// The bytes of one `PATCH` with `chunked`: small enough for a registry or proxy that caps a
/// request body at 5 MiB (why anyone asks for chunks), whatever `push_item` says.
const CHUNK: usize = 4 << 20;

/// An open upload session: where the next request goes, and the `Authorization` it carries.
struct Session {
    location: reqwest::Url,
    authorization: Option<HeaderValue>,
}

impl Endpoint {
    pub(crate) async fn blob_exists_async(
        &self,
        reference: &RegistryRef,
        digest: &str,
    ) -> Result<bool, RegistryError> {
        let what = format!("blob {digest}");
        retry(self.options.retry, &what, || {
            self.head_blob(reference, digest, &what)
        })
        .await
    }

    /// One `HEAD` of a blob: whether the registry has it.
    async fn head_blob(
        &self,
        reference: &RegistryRef,
        digest: &str,
        what: &str,
    ) -> Result<bool, Failure> {
        let url = format!("{}/blobs/{digest}", self.repo_url(reference));
        let (answer, _) = self
            .send(reference, Access::Pull, what, || {
                self.transport.http.head(&url)
            })
            .await?;
        match answer.status() {
            s if s.is_success() => Ok(true),
            StatusCode::NOT_FOUND => Ok(false),
            _ => Err(error_answer(&self.ctx(), what, answer).await),
        }
    }

    /// Upload a file as a blob, streamed in `push_item`-sized items. A failed upload is retried
    /// from its start (a new session), unless the registry has the blob by then.
    pub(crate) async fn push_blob_file_async(
        &self,
        reference: &RegistryRef,
        path: &Path,
        digest: &str,
        size: u64,
        progress: Option<&ProgressBar>,
    ) -> Result<(), RegistryError> {
        let what = format!("uploading blob {digest}");
        let mut first = true;
        retry(self.options.retry, &what, || {
            let retried = !std::mem::replace(&mut first, false);
            let what = &what;
            async move {
                // One HEAD, its failure an attempt of this loop (not a retry loop of its own).
                if retried && self.head_blob(reference, digest, what).await? {
                    return Ok(());
                }
                if let Some(p) = progress {
                    p.set_position(0);
                }
                let session = self.open_session(reference, what).await?;
                if self.options.chunked {
                    self.put_chunks(session, path, digest, progress, what).await
                } else {
                    let body = file_stream(path.to_owned(), self.push_item(), progress.cloned());
                    let body = reqwest::Body::wrap_stream(body);
                    self.close_session(session, digest, Some((body, size)), what)
                        .await
                }
            }
        })
        .await
    }

    /// Upload a small blob held in memory (a cosign payload or config), unless it is there.
    pub(crate) async fn push_blob_bytes_async(
        &self,
        reference: &RegistryRef,
        bytes: &[u8],
    ) -> Result<(), RegistryError> {
        let digest = sha256_digest(bytes);
        if self.blob_exists_async(reference, &digest).await? {
            return Ok(());
        }
        let what = format!("uploading blob {digest}");
        let body = Bytes::copy_from_slice(bytes);
        retry(self.options.retry, &what, || async {
            let session = self.open_session(reference, &what).await?;
            let body = Some((reqwest::Body::from(body.clone()), body.len() as u64));
            self.close_session(session, &digest, body, &what).await
        })
        .await
    }

    /// Push a manifest's exact bytes under `reference`'s tag (or its digest). Returns the
    /// digest the registry stored it under, checked against the bytes' digest.
    pub(crate) async fn push_manifest_async(
        &self,
        reference: &RegistryRef,
        bytes: &[u8],
        media_type: &str,
    ) -> Result<String, RegistryError> {
        let ours = sha256_digest(bytes);
        let target = match &reference.tag {
            Some(t) => reference.with_tag(t),
            None => reference.with_digest(&ours),
        };
        let content_type = HeaderValue::from_str(media_type)
            .map_err(|_| RegistryError::Protocol(format!("bad media type `{media_type}`")))?;
        let what = format!("pushing manifest {target}");
        let url = format!(
            "{}/manifests/{}",
            self.repo_url(&target),
            target.tag.as_deref().unwrap_or(&ours)
        );
        let body = Bytes::copy_from_slice(bytes);
        retry(self.options.retry, &what, || async {
            let build = || {
                self.transport
                    .http
                    .put(&url)
                    .header(CONTENT_TYPE, content_type.clone())
                    .body(body.clone())
            };
            let (answer, _) = self.send(&target, Access::Push, &what, build).await?;
            expect(&self.ctx(), &what, answer, StatusCode::CREATED).await
        })
        .await?;
        let stored = self.resolve_async(&target).await?;
        if stored != ours {
            return Err(RegistryError::Integrity {
                blob: ours,
                detail: format!("the registry stored the manifest as {stored}"),
            });
        }
        Ok(ours)
    }

    /// The bytes per upload item (at least 1 MiB).
    fn push_item(&self) -> usize {
        self.options.push_item.max(1 << 20)
    }

    /// `POST …/blobs/uploads/`: a new upload session.
    async fn open_session(&self, reference: &RegistryRef, what: &str) -> Result<Session, Failure> {
        let url = format!("{}/blobs/uploads/", self.repo_url(reference));
        let build = || self.transport.http.post(&url).header(CONTENT_LENGTH, "0");
        let (answer, authorization) = self.send(reference, Access::Push, what, build).await?;
        let answer = expect(&self.ctx(), what, answer, StatusCode::ACCEPTED).await?;
        let location = next_location(&answer, what)?;
        Ok(Session {
            location,
            authorization,
        })
    }

    /// `PATCH` the file to the session an item at a time, then close it.
    async fn put_chunks(
        &self,
        mut session: Session,
        path: &Path,
        digest: &str,
        progress: Option<&ProgressBar>,
        what: &str,
    ) -> Result<(), Failure> {
        let mut file = std::fs::File::open(path).map_err(|e| {
            Failure::Fatal(RegistryError::Io {
                path: path.to_owned(),
                source: e,
            })
        })?;
        let mut at = 0u64;
        loop {
            let chunk = read_item(&mut file, CHUNK).map_err(|e| {
                Failure::Fatal(RegistryError::Io {
                    path: path.to_owned(),
                    source: e,
                })
            })?;
            if chunk.is_empty() {
                break;
            }
            let len = chunk.len() as u64;
            let request = self
                .session_request(reqwest::Method::PATCH, session.location.clone(), &session)
                .header(CONTENT_TYPE, OCTET_STREAM)
                .header("Content-Range", format!("{at}-{}", at + len - 1))
                .header(CONTENT_LENGTH, len)
                .body(chunk);
            let answer = request
                .send()
                .await
                .map_err(|e| classify_http(&self.ctx(), what, e))?;
            let answer = expect(&self.ctx(), what, answer, StatusCode::ACCEPTED).await?;
            session.location = next_location(&answer, what)?;
            at += len;
            if let Some(p) = progress {
                p.inc(len);
            }
        }
        self.close_session(session, digest, None, what).await
    }

    /// `PUT <location>?digest=…`, with the blob's bytes (`body`, its length) or after the
    /// chunks.
    async fn close_session(
        &self,
        session: Session,
        digest: &str,
        body: Option<(reqwest::Body, u64)>,
        what: &str,
    ) -> Result<(), Failure> {
        let mut url = session.location.clone();
        url.query_pairs_mut().append_pair("digest", digest);
        let request = self.session_request(reqwest::Method::PUT, url, &session);
        let request = match body {
            Some((body, len)) => request
                .header(CONTENT_TYPE, OCTET_STREAM)
                .header(CONTENT_LENGTH, len)
                .body(body),
            None => request.header(CONTENT_LENGTH, "0"),
        };
        let answer = request
            .send()
            .await
            .map_err(|e| classify_http(&self.ctx(), what, e))?;
        expect(&self.ctx(), what, answer, StatusCode::CREATED).await?;
        Ok(())
    }

    /// A request to the session's `url`, with its `Authorization`.
    fn session_request(
        &self,
        method: reqwest::Method,
        url: reqwest::Url,
        session: &Session,
    ) -> reqwest::RequestBuilder {
        let request = self.transport.http.request(method, url);
        match &session.authorization {
            Some(a) => request.header(AUTHORIZATION, a.clone()),
            None => request,
        }
    }
}

/// `answer` when it has the status the protocol gives for success; a failure otherwise.
async fn expect(
    ctx: &crate::retry::Context<'_>,
    what: &str,
    answer: reqwest::Response,
    status: StatusCode,
) -> Result<reqwest::Response, Failure> {
    match answer.status() {
        s if s == status => Ok(answer),
        s if s.is_success() => Err(Failure::Fatal(RegistryError::Refused {
            what: what.to_owned(),
            cause: Cause::Answer(format!(
                "HTTP {s}, where the upload protocol answers {status}"
            )),
        })),
        _ => Err(error_answer(ctx, what, answer).await),
    }
}

/// The session URL an upload answer names in `Location`, resolved against the request's URL (a
/// registry may answer with a path alone).
fn next_location(answer: &reqwest::Response, what: &str) -> Result<reqwest::Url, Failure> {
    let refused = |detail: String| {
        Failure::Fatal(RegistryError::Refused {
            what: what.to_owned(),
            cause: Cause::Answer(detail),
        })
    };
    let Some(value) = answer.headers().get(LOCATION) else {
        return Err(refused("the upload answer has no Location".to_owned()));
    };
    let text = value
        .to_str()
        .map_err(|_| refused("the upload answer's Location is not text".to_owned()))?;
    let url = answer
        .url()
        .join(text)
        .map_err(|e| refused(format!("the upload answer's Location is not a URL: {e}")))?;
    match url.scheme() {
        "http" | "https" => Ok(url),
        other => Err(refused(format!(
            "the upload answer's Location has the scheme `{other}`, not http(s)"
        ))),
    }
}

/// Up to `item` bytes of `file` (fewer only at its end).
fn read_item(file: &mut std::fs::File, item: usize) -> std::io::Result<Bytes> {
    let mut buf = vec![0u8; item];
    let mut filled = 0;
    while filled < item {
        match file.read(&mut buf[filled..]) {
            Ok(0) => break,
            Ok(n) => filled += n,
            Err(e) if e.kind() == std::io::ErrorKind::Interrupted => {}
            Err(e) => return Err(e),
        }
    }
    buf.truncate(filled);
    Ok(Bytes::from(buf))
}

/// A file as a stream of `item`-sized `Bytes`, read on a blocking thread; at most two items
/// are in flight, so memory stays bounded whatever the file's size.
fn file_stream(
    path: std::path::PathBuf,
    item: usize,
    progress: Option<ProgressBar>,
) -> impl futures_util::Stream<Item = std::io::Result<Bytes>> + Send + 'static {
    let (tx, rx) = tokio::sync::mpsc::channel::<std::io::Result<Bytes>>(2);
    tokio::task::spawn_blocking(move || {
        let mut file = match std::fs::File::open(&path) {
            Ok(f) => f,
            Err(e) => {
                let _ = tx.blocking_send(Err(e));
                return;
            }
        };
        loop {
            let read = read_item(&mut file, item);
            let last = matches!(&read, Ok(b) if b.len() < item) || read.is_err();
            if matches!(&read, Ok(b) if b.is_empty()) {
                return;
            }
            if tx.blocking_send(read).is_err() || last {
                return; // the upload stopped, or the file ended
            }
        }
    });
    futures_util::stream::unfold(rx, |mut rx| async move {
        rx.recv().await.map(|item| (item, rx))
    })
    .map(move |r| {
        if let (Ok(b), Some(p)) = (&r, &progress) {
            p.inc(b.len() as u64);
        }
        r
    })
}
