//! The registry transport: `oci-client` (rustls) under a small tokio runtime, with retries.
//!
//! `oci-client` speaks the distribution protocol (auth challenges, token cache, chunked
//! uploads, `Range` requests). What it leaves to its caller is done here:
//! - **retries**: every request is retried on transient failures (connection refused or reset,
//!   timeouts, truncated bodies, HTTP 408/429/5xx) with exponential backoff; authentication,
//!   not-found and integrity failures are not retried;
//! - **resume**: [`Registry::stream_blob`] keeps the running SHA-256 of the bytes it has
//!   handed to the sink; after a failure it asks for `Range: bytes=OFFSET-` from the last good
//!   byte (`pull_blob_stream_partial`; a partial response is not verified by `oci-client`, so the
//!   digest is always checked here, over the whole blob); a download to a file starts the same
//!   way from the length of the partial file an interrupted run left (`partial`);
//! - **digests**: a blob is accepted only if its size and SHA-256 match; manifests are re-hashed;
//! - **uploads** are streamed from the file in large items (never the whole blob in memory). An
//!   interrupted upload restarts that blob: `oci-client` cannot resume an upload session.
//! - **limits** ([`super::limits`]): manifests are read by this module itself, capped at 4 MiB;
//!   every download must keep up a minimum throughput or it is dropped and retried.

use std::future::Future;
use std::io::{Read, Seek, SeekFrom, Write};
use std::path::Path;
use std::time::Duration;

use bytes::Bytes;
use futures_util::StreamExt;
use indicatif::ProgressBar;
use oci_client::client::{BlobResponse, ClientConfig, ClientProtocol};
use oci_client::errors::{OciDistributionError, OciErrorCode};
use oci_client::manifest::OciDescriptor;
use oci_client::Client;
use sha2::{Digest, Sha256};
use tracing::{debug, info, warn};

use super::auth::{self, Credentials, ExplicitAuth, ResolvedAuth};
use super::limits::{self, GetError, SpeedLimit, Throughput, MAX_MANIFEST_SIZE};
use super::partial::{self, Prefix};
use super::reference::RegistryRef;
use super::RegistryError;
use crate::oci_layout::{sha256_digest, ImageManifest, INDEX_MEDIA_TYPE, MANIFEST_MEDIA_TYPE};

/// Default size of the items a blob upload is streamed in (with `chunked`, `oci-client` sends
/// at most 4 MiB per PATCH; larger items are split without copying).
pub const DEFAULT_PUSH_ITEM: usize = 8 << 20;
/// The largest blob [`Registry::fetch_blob`] reads into memory.
pub const MAX_IN_MEMORY_BLOB: u64 = 64 << 20;

/// How often and how patiently to retry.
#[derive(Debug, Clone, Copy)]
pub struct RetryPolicy {
    /// Attempts in a row without progress before giving up (at least 1).
    pub attempts: u32,
    /// The first backoff.
    pub initial: Duration,
    /// The longest backoff.
    pub max: Duration,
}

impl Default for RetryPolicy {
    fn default() -> Self {
        RetryPolicy {
            attempts: 8,
            initial: Duration::from_millis(500),
            max: Duration::from_secs(8),
        }
    }
}

impl RetryPolicy {
    fn backoff(&self, failures: u32) -> Duration {
        let factor = 1u32 << failures.saturating_sub(1).min(16);
        self.initial.saturating_mul(factor).min(self.max)
    }
}

/// How to talk to a registry.
#[derive(Debug, Clone)]
pub struct RegistryOptions {
    /// Plain HTTP even for a non-loopback host (loopback hosts use it too, unless `insecure` or
    /// `ca_file` asks for TLS).
    pub plain_http: bool,
    /// TLS without verifying the registry's certificate (`--insecure`, as oras spells it).
    pub insecure: bool,
    /// PEM certificates to trust besides the system's (`--ca-file`, a self-signed registry).
    pub ca_file: Option<std::path::PathBuf>,
    /// Credentials from the command line (others come from the environment, see [`auth`]).
    pub auth: ExplicitAuth,
    /// Retry policy.
    pub retry: RetryPolicy,
    /// Blobs transferred at once.
    pub concurrency: usize,
    /// Bytes per upload stream item.
    pub push_item: usize,
    /// Upload each blob as 4 MiB PATCH requests instead of one streamed PUT. The PUT is the
    /// default: on a local distribution registry it is about twice as fast (`ci/bench-registry.sh`:
    /// 1 GiB in ~8 s against ~14 s chunked); chunks are for registries or proxies that cap a
    /// request body's size.
    pub chunked: bool,
    /// Draw progress bars on stderr (only when it is a terminal).
    pub progress: bool,
    /// The minimum throughput of every download.
    pub speed: SpeedLimit,
}

impl Default for RegistryOptions {
    fn default() -> Self {
        RegistryOptions {
            plain_http: false,
            insecure: false,
            ca_file: None,
            auth: ExplicitAuth::default(),
            retry: RetryPolicy::default(),
            concurrency: 4,
            push_item: DEFAULT_PUSH_ITEM,
            chunked: false,
            progress: true,
            speed: SpeedLimit::default(),
        }
    }
}

/// A `--ca-file`: PEM, checked here so a wrong file is named rather than failing every request.
fn read_ca_file(path: &Path) -> Result<oci_client::client::Certificate, RegistryError> {
    let data = std::fs::read(path).map_err(RegistryError::io(path))?;
    if !String::from_utf8_lossy(&data).contains("-----BEGIN CERTIFICATE-----") {
        return Err(RegistryError::Reference(format!(
            "--ca-file {}: not a PEM certificate (no BEGIN CERTIFICATE line)",
            path.display()
        )));
    }
    Ok(oci_client::client::Certificate {
        encoding: oci_client::client::CertificateEncoding::Pem,
        data,
    })
}

/// What [`Registry::fetch_stack`] returns.
#[derive(Debug, Clone)]
pub struct FetchedStack {
    /// `sha256:…` of the manifest.
    pub manifest_digest: String,
    /// The manifest's exact bytes.
    pub manifest_bytes: Vec<u8>,
    /// The manifest, parsed.
    pub manifest: ImageManifest,
    /// The config blob's bytes: the stack descriptor (signature not yet checked).
    pub descriptor_bytes: Vec<u8>,
}

enum Failure {
    Transient(String),
    /// Transient, but no progress however many bytes came: the retry budget is not renewed.
    TooSlow(String),
    Fatal(RegistryError),
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
    /// registry that ignored the Range request sends them again). Returns why the response
    /// stopped early, if it did; an error only for what no retry can fix.
    async fn drain<S, E>(
        &mut self,
        mut stream: S,
        mut skip: u64,
        speed: SpeedLimit,
    ) -> Result<Option<Failure>, RegistryError>
    where
        S: futures_util::Stream<Item = Result<Bytes, E>> + Unpin,
        E: std::fmt::Display,
    {
        let (size, end, digest) = (self.size, self.end, self.digest);
        let mut pace = Throughput::start(speed);
        while *self.offset < end {
            let next = match tokio::time::timeout_at(pace.window_end(), stream.next()).await {
                Ok(next) => next,
                Err(_) => match pace.check() {
                    Ok(()) => continue,
                    Err(slow) => return Ok(Some(Failure::TooSlow(slow.0))),
                },
            };
            let mut chunk = match next {
                None => {
                    return Ok(Some(Failure::Transient(format!(
                        "the response ended at byte {} of {size}",
                        self.offset
                    ))))
                }
                Some(Err(e)) => return Ok(Some(Failure::Transient(e.to_string()))),
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
            self.sink.write_all(&chunk).map_err(|e| RegistryError::Io {
                path: format!("(destination of blob {digest})").into(),
                source: e,
            })?;
            *self.offset += chunk.len() as u64;
            if let Some(p) = self.progress {
                p.inc(chunk.len() as u64);
            }
            pace.add(chunk.len() as u64);
            if let Err(slow) = pace.check() {
                return Ok(Some(Failure::TooSlow(slow.0)));
            }
        }
        Ok(None)
    }
}

/// One blob of a repository.
struct BlobAt<'a> {
    reference: &'a RegistryRef,
    digest: &'a str,
    size: u64,
}

/// The media types a tag may resolve to (what `oci-client` asks for in a HEAD request).
const ANY_MANIFEST: &str = "application/vnd.oci.image.manifest.v1+json, \
     application/vnd.oci.image.index.v1+json, \
     application/vnd.docker.distribution.manifest.v2+json, \
     application/vnd.docker.distribution.manifest.list.v2+json";

/// A connection to one registry host.
pub struct Registry {
    rt: tokio::runtime::Runtime,
    client: Client,
    /// For manifests, read with a cap (`oci-client` reads a body whole).
    http: reqwest::Client,
    scheme: &'static str,
    registry: String,
    auth: ResolvedAuth,
    pub(crate) options: RegistryOptions,
}

impl std::fmt::Debug for Registry {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Registry")
            .field("registry", &self.registry)
            .field("auth_source", &self.auth.source)
            .finish_non_exhaustive()
    }
}

impl Registry {
    /// Connect to the registry `reference` names (no request is made yet).
    pub fn connect(
        reference: &RegistryRef,
        options: RegistryOptions,
    ) -> Result<Self, RegistryError> {
        let auth = auth::resolve(&reference.registry, &options.auth)?;
        info!(
            "registry {}: credentials from {}",
            reference.registry, auth.source
        );
        let tls_asked = options.insecure || options.ca_file.is_some();
        let plain = options.plain_http || (reference.is_loopback() && !tls_asked);
        let scheme = if plain { "http" } else { "https" };
        let protocol = if plain {
            ClientProtocol::Http
        } else {
            ClientProtocol::Https
        };
        let extra_root_certificates = match &options.ca_file {
            Some(path) => vec![read_ca_file(path)?],
            None => Vec::new(),
        };
        let config = ClientConfig {
            protocol,
            use_monolithic_push: !options.chunked,
            read_timeout: Some(Duration::from_secs(60)),
            connect_timeout: Some(Duration::from_secs(15)),
            max_concurrent_download: options.concurrency.max(1),
            max_concurrent_upload: options.concurrency.max(1),
            user_agent: crate::version::USER_AGENT,
            accept_invalid_certificates: options.insecure,
            extra_root_certificates: extra_root_certificates.clone(),
            // HTTPS_PROXY, HTTP_PROXY and NO_PROXY (either case) are read by reqwest itself.
            ..Default::default()
        };
        let client = Client::try_from(config)
            .map_err(|e| RegistryError::Protocol(format!("setting up the HTTP client: {e}")))?;
        // The capped manifest reads go through reqwest directly: same TLS trust as oci-client.
        let mut http = reqwest::Client::builder()
            .read_timeout(Duration::from_secs(60))
            .connect_timeout(Duration::from_secs(15))
            .user_agent(crate::version::USER_AGENT)
            .danger_accept_invalid_certs(options.insecure);
        for cert in &extra_root_certificates {
            let cert = reqwest::Certificate::from_pem(&cert.data).map_err(|e| {
                RegistryError::Reference(format!("--ca-file: not a usable certificate: {e}"))
            })?;
            http = http.add_root_certificate(cert);
        }
        let http = http
            .build()
            .map_err(|e| RegistryError::Protocol(format!("setting up the HTTP client: {e}")))?;

        let rt = tokio::runtime::Builder::new_multi_thread()
            .worker_threads(options.concurrency.clamp(2, 8))
            .enable_all()
            .build()
            .map_err(|e| RegistryError::Protocol(format!("starting the I/O runtime: {e}")))?;
        Ok(Registry {
            rt,
            client,
            http,
            scheme,
            registry: reference.registry.clone(),
            auth,
            options,
        })
    }

    /// Where the credentials came from (safe to print).
    pub fn auth_source(&self) -> &str {
        &self.auth.source
    }

    pub(crate) fn block_on<F: Future>(&self, f: F) -> F::Output {
        self.rt.block_on(f)
    }

    /// Remove secrets from text that came from elsewhere (a registry's error body).
    fn scrub(&self, text: String) -> String {
        let mut text = text;
        for s in self.auth.credentials.secrets() {
            if !s.is_empty() {
                text = text.replace(s, "<redacted>");
            }
        }
        text
    }

    fn classify(&self, what: &str, e: OciDistributionError) -> Failure {
        let auth_failed = |detail: String| {
            Failure::Fatal(RegistryError::Auth {
                registry: self.registry.clone(),
                source_desc: format!("credentials: {}", self.auth.source),
                detail: self.scrub(detail),
            })
        };
        let by_status = |code: u16, detail: String| match code {
            401 | 403 => auth_failed(format!("HTTP {code} for {what}")),
            404 => Failure::Fatal(RegistryError::NotFound(what.to_owned())),
            408 | 429 | 500..=599 => {
                Failure::Transient(self.scrub(format!("HTTP {code}: {detail}")))
            }
            _ => Failure::Fatal(RegistryError::Protocol(
                self.scrub(format!("{what}: HTTP {code}: {detail}")),
            )),
        };
        match e {
            OciDistributionError::AuthenticationFailure(m) => {
                auth_failed(format!("the token service refused: {}", m.trim()))
            }
            OciDistributionError::UnauthorizedError { .. } => {
                auth_failed(format!("HTTP 401 Unauthorized for {what}"))
            }
            OciDistributionError::RegistryError { envelope, .. } => {
                let codes: Vec<&OciErrorCode> = envelope.errors.iter().map(|e| &e.code).collect();
                let text = envelope.to_string();
                if codes
                    .iter()
                    .any(|c| matches!(c, OciErrorCode::Unauthorized | OciErrorCode::Denied))
                {
                    auth_failed(format!("{what}: {text}"))
                } else if codes.iter().any(|c| {
                    matches!(
                        c,
                        OciErrorCode::BlobUnknown
                            | OciErrorCode::ManifestUnknown
                            | OciErrorCode::NameUnknown
                            | OciErrorCode::NotFound
                    )
                }) {
                    Failure::Fatal(RegistryError::NotFound(what.to_owned()))
                } else if codes
                    .iter()
                    .any(|c| matches!(c, OciErrorCode::Toomanyrequests))
                {
                    Failure::Transient(text)
                } else {
                    Failure::Fatal(RegistryError::Protocol(
                        self.scrub(format!("{what}: {text}")),
                    ))
                }
            }
            OciDistributionError::ServerError { code, message, .. } => by_status(code, message),
            OciDistributionError::RequestError(re) => match re.status() {
                Some(st) => by_status(st.as_u16(), re.to_string()),
                None => Failure::Transient(self.scrub(format!("{re:#}"))),
            },
            OciDistributionError::IoError(io) => Failure::Transient(io.to_string()),
            OciDistributionError::ImageManifestNotFoundError(_) => {
                Failure::Fatal(RegistryError::NotFound(what.to_owned()))
            }
            OciDistributionError::DigestError(d) => Failure::Fatal(RegistryError::Integrity {
                blob: what.to_owned(),
                detail: d.to_string(),
            }),
            other => Failure::Fatal(RegistryError::Protocol(
                self.scrub(format!("{what}: {other}")),
            )),
        }
    }

    /// Run `op` until it succeeds, fails for good, or the retries are used up.
    async fn retry<T, F, Fut>(&self, what: &str, mut op: F) -> Result<T, RegistryError>
    where
        F: FnMut() -> Fut,
        Fut: Future<Output = Result<T, OciDistributionError>>,
    {
        self.retry_failures(what, || {
            let fut = op();
            async move { fut.await.map_err(|e| self.classify(what, e)) }
        })
        .await
    }

    /// [`Registry::retry`] for an `op` that classifies its own failures.
    async fn retry_failures<T, F, Fut>(&self, what: &str, mut op: F) -> Result<T, RegistryError>
    where
        F: FnMut() -> Fut,
        Fut: Future<Output = Result<T, Failure>>,
    {
        let policy = self.options.retry;
        let mut failures = 0u32;
        loop {
            match op().await {
                Ok(v) => return Ok(v),
                Err(e) => match e {
                    Failure::Fatal(e) => return Err(e),
                    Failure::Transient(detail) | Failure::TooSlow(detail) => {
                        failures += 1;
                        if failures >= policy.attempts.max(1) {
                            return Err(RegistryError::Transient {
                                op: what.to_owned(),
                                attempts: failures,
                                detail,
                            });
                        }
                        let wait = policy.backoff(failures);
                        warn!(
                            "{what}: {detail}; retrying in {wait:?} ({failures}/{})",
                            policy.attempts
                        );
                        tokio::time::sleep(wait).await;
                    }
                },
            }
        }
    }

    async fn store_auth(&self, reference: &RegistryRef) {
        self.client
            .store_auth_if_needed(&reference.registry, &self.auth.credentials.to_oci())
            .await;
    }

    /// The digest a reference names: its digest if it has one, else the tag's (a HEAD request).
    pub fn resolve(&self, reference: &RegistryRef) -> Result<String, RegistryError> {
        self.block_on(self.resolve_async(reference))
    }

    /// Like [`Registry::resolve`], but a missing tag is `None`.
    pub fn try_resolve(&self, reference: &RegistryRef) -> Result<Option<String>, RegistryError> {
        match self.resolve(reference) {
            Ok(d) => Ok(Some(d)),
            Err(RegistryError::NotFound(_)) => Ok(None),
            Err(e) => Err(e),
        }
    }

    pub(crate) async fn resolve_async(
        &self,
        reference: &RegistryRef,
    ) -> Result<String, RegistryError> {
        if let Some(d) = &reference.digest {
            return Ok(d.clone());
        }
        let (_, digest) = self.get_manifest(reference, ANY_MANIFEST).await?;
        Ok(digest)
    }

    /// `Authorization` for a pull from `oref`'s repository: a bearer token (fetched through
    /// `oci-client`'s token flow), else the basic credentials, else none.
    async fn authorization(
        &self,
        oref: &oci_client::Reference,
    ) -> Result<Option<http::HeaderValue>, OciDistributionError> {
        let auth = self.auth.credentials.to_oci();
        let token = self
            .client
            .auth(oref, &auth, oci_client::RegistryOperation::Pull)
            .await?;
        let value = match (token, &self.auth.credentials) {
            (Some(t), _) => format!("Bearer {t}"),
            (None, Credentials::Basic { username, password }) => {
                use base64::Engine;
                let pair = format!("{username}:{}", password.expose());
                format!(
                    "Basic {}",
                    base64::engine::general_purpose::STANDARD.encode(pair)
                )
            }
            (None, _) => return Ok(None),
        };
        let mut value = http::HeaderValue::from_str(&value).map_err(|_| {
            OciDistributionError::GenericError(Some("a credential is not header-safe".into()))
        })?;
        value.set_sensitive(true);
        Ok(Some(value))
    }

    /// The manifest `reference` names (by tag or digest), read by ingot itself so that neither
    /// its size nor its pace is the registry's choice ([`limits`]). Returns the exact bytes and
    /// their digest, checked against the reference's digest and the registry's
    /// `Docker-Content-Digest`.
    async fn get_manifest(
        &self,
        reference: &RegistryRef,
        accept: &str,
    ) -> Result<(Bytes, String), RegistryError> {
        self.store_auth(reference).await;
        let oref = reference.to_oci();
        let what = format!("manifest {reference}");
        let url = format!(
            "{}://{}/v2/{}/manifests/{}",
            self.scheme,
            oref.resolve_registry(),
            oref.repository(),
            reference
                .digest
                .as_deref()
                .or(reference.tag.as_deref())
                .unwrap_or("latest")
        );
        let got = self
            .retry_failures(&what, || async {
                let authorization = self
                    .authorization(&oref)
                    .await
                    .map_err(|e| self.classify(&what, e))?;
                limits::get_capped(&self.http, &url, accept, authorization, self.options.speed)
                    .await
                    .map_err(|e| self.classify_get(&what, e))
            })
            .await?;
        let actual = sha256_digest(&got.body);
        for (whose, claimed) in [
            ("the reference", reference.digest.as_ref()),
            (
                "the registry's Docker-Content-Digest",
                got.digest_header.as_ref(),
            ),
        ] {
            if let Some(claimed) = claimed.filter(|c| **c != actual) {
                return Err(RegistryError::Integrity {
                    blob: claimed.clone(),
                    detail: format!("{what}: the bytes hash to {actual}, not {whose}'s digest"),
                });
            }
        }
        Ok((got.body, actual))
    }

    fn classify_get(&self, what: &str, e: GetError) -> Failure {
        match e {
            GetError::Status(code, body) => self.classify(
                what,
                OciDistributionError::ServerError {
                    code,
                    url: what.to_owned(),
                    message: body,
                },
            ),
            GetError::TooLarge(detail) => {
                Failure::Fatal(RegistryError::Protocol(format!("{what}: {detail}")))
            }
            GetError::TooSlow(detail) => Failure::TooSlow(detail),
            GetError::Http(e) => self.classify(what, OciDistributionError::RequestError(e)),
        }
    }

    /// The manifest a reference names: its exact bytes and their digest (checked).
    pub fn fetch_manifest(
        &self,
        reference: &RegistryRef,
    ) -> Result<(Vec<u8>, String), RegistryError> {
        self.block_on(self.fetch_manifest_async(reference))
    }

    pub(crate) async fn fetch_manifest_async(
        &self,
        reference: &RegistryRef,
    ) -> Result<(Vec<u8>, String), RegistryError> {
        let accept = format!("{MANIFEST_MEDIA_TYPE}, {INDEX_MEDIA_TYPE}");
        let (bytes, digest) = self.get_manifest(reference, &accept).await?;
        Ok((bytes.to_vec(), digest))
    }

    /// A stack's manifest and the stack descriptor it names (its config blob), both fetched
    /// by digest and digest-checked. The descriptor's signature is not checked here: do that
    /// (with [`crate::verify::verify_metadata`] or the signing key) before believing it.
    pub fn fetch_stack(&self, reference: &RegistryRef) -> Result<FetchedStack, RegistryError> {
        let (manifest_bytes, manifest_digest) = self.fetch_manifest(reference)?;
        let manifest: ImageManifest = serde_json::from_slice(&manifest_bytes).map_err(|e| {
            RegistryError::Protocol(format!(
                "{reference}: manifest {manifest_digest} is not an OCI image manifest: {e}"
            ))
        })?;
        if manifest.config.size > MAX_MANIFEST_SIZE {
            return Err(RegistryError::Protocol(format!(
                "{reference}: the stack descriptor (config {}) is {} bytes; it may have at most \
                 {MAX_MANIFEST_SIZE}",
                manifest.config.digest, manifest.config.size
            )));
        }
        let descriptor_bytes = self.fetch_blob(
            &reference.with_digest(&manifest_digest),
            &manifest.config.digest,
            manifest.config.size,
        )?;
        Ok(FetchedStack {
            manifest_digest,
            manifest_bytes,
            manifest,
            descriptor_bytes,
        })
    }

    /// A small blob (the stack descriptor), read into memory, digest and size checked.
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
        let mut sink = std::io::Cursor::new(Vec::with_capacity(size as usize));
        self.stream_blob(reference, digest, size, &mut sink, None)?;
        Ok(sink.into_inner())
    }

    /// Stream one blob into `sink`, resuming with `Range` requests after transient failures,
    /// and check its size and SHA-256. Every byte reaches the sink once, in order (a registry
    /// that ignores a `Range` request sends the blob again from the start; the bytes the sink
    /// already has are dropped). Bytes reach it before the digest is known, so a caller that
    /// must not keep bad bytes writes to a temporary place (as [`Registry::pull_blob_to_file`]
    /// does) or checks them finer-grained itself (the writer checks every block against the
    /// layer's signed verity tree).
    pub fn stream_blob<W: Write + ?Sized>(
        &self,
        reference: &RegistryRef,
        digest: &str,
        size: u64,
        sink: &mut W,
        progress: Option<&ProgressBar>,
    ) -> Result<(), RegistryError> {
        self.block_on(self.stream_blob_async(reference, digest, size, sink, progress))
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

    /// [`Registry::stream_blob`] into a sink that already holds the blob's first `prefix.len`
    /// bytes (an interrupted run's partial file): the first request is a `Range` request from
    /// there, as after a dropped connection, and the digest check covers the prefix too.
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
        let blob = BlobAt {
            reference,
            digest,
            size,
        };
        self.stream_range_async(&blob, len..size, &mut hasher, sink, progress)
            .await?;
        sink.flush().map_err(|e| RegistryError::Io {
            path: format!("(destination of blob {digest})").into(),
            source: e,
        })?;
        let actual = format!("sha256:{}", hex::encode(hasher.finalize()));
        if actual != digest {
            return Err(RegistryError::Integrity {
                blob: digest.to_owned(),
                detail: format!(
                    "the registry's bytes hash to {actual}; discarded (the registry's copy is \
                     corrupt or was replaced)"
                ),
            });
        }
        debug!("blob {digest}: {size} bytes, digest ok");
        Ok(())
    }

    /// Bytes `range` of a blob, read into memory (one zstd frame of a layer, say). Not checked
    /// against the digest, which covers the whole blob: the caller checks what it reads (the
    /// writer checks every block against the layer's signed verity tree).
    pub fn fetch_range(
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
        self.block_on(self.stream_range_async(&blob, range, &mut hasher, &mut sink, None))?;
        Ok(sink)
    }

    /// Streams bytes `range` of a blob into `sink` and `hasher`, resuming with `Range` requests
    /// after transient failures. Every byte of the range reaches the sink once, in order (a
    /// registry that ignores a `Range` request sends the blob from its start; the bytes before
    /// the range, or already in the sink, are dropped).
    async fn stream_range_async<W: Write + ?Sized>(
        &self,
        blob: &BlobAt<'_>,
        range: std::ops::Range<u64>,
        hasher: &mut Sha256,
        sink: &mut W,
        progress: Option<&ProgressBar>,
    ) -> Result<(), RegistryError> {
        let (reference, digest, size) = (blob.reference, blob.digest, blob.size);
        if !ingot_layers::descriptor::is_sha256_digest(digest) {
            return Err(RegistryError::Protocol(format!(
                "`{digest}` is not a sha256 digest"
            )));
        }
        self.store_auth(reference).await;
        let oref = reference.to_oci();
        let desc = OciDescriptor {
            digest: digest.to_owned(),
            size: size as i64,
            ..Default::default()
        };
        let what = format!("blob {digest}");
        let policy = self.options.retry;
        let mut offset = range.start;
        let mut failures = 0u32;
        while offset < range.end {
            let start = offset;
            // A whole blob starts with a plain request (a 200); anything else asks for a Range,
            // to the end of the range when it ends inside the blob.
            let response = if offset == 0 && range.end == size {
                self.client
                    .pull_blob_stream(&oref, &desc)
                    .await
                    .map(BlobResponse::Full)
            } else {
                // A retry, or the first request of a blob whose start is already here.
                if offset > range.start || range.end == size {
                    info!("{what}: resuming at byte {offset} of {size}");
                }
                let length = (range.end < size).then(|| range.end - offset);
                self.client
                    .pull_blob_stream_partial(&oref, &desc, offset, length)
                    .await
            };
            let failure = match response {
                Err(e) => Some(self.classify(&what, e)),
                Ok(resp) => {
                    // After a Range request the registry ignored: bytes to drop from the front.
                    let mut skip = 0u64;
                    let stream = match resp {
                        BlobResponse::Partial(s) => s,
                        BlobResponse::Full(s) => {
                            if offset != 0 {
                                warn!(
                                    "{what}: the registry ignored the Range request; skipping \
                                     the {offset} bytes it sends again"
                                );
                                skip = offset;
                            }
                            s
                        }
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
                    into.drain(stream, skip, self.options.speed).await?
                }
            };
            let (detail, slow) = match failure {
                None => continue,
                Some(Failure::Fatal(e)) => return Err(e),
                Some(Failure::Transient(d)) => (d, false),
                Some(Failure::TooSlow(d)) => (d, true),
            };
            // Progress renews the retry budget, unless it came too slowly to count.
            if offset > start && !slow {
                failures = 0;
            }
            failures += 1;
            if failures >= policy.attempts.max(1) {
                return Err(RegistryError::Transient {
                    op: format!("{what} (at byte {offset} of {size})"),
                    attempts: failures,
                    detail,
                });
            }
            let wait = policy.backoff(failures);
            warn!(
                "{what}: {detail} at byte {offset} of {size}; resuming in {wait:?} \
                 ({failures}/{})",
                policy.attempts
            );
            tokio::time::sleep(wait).await;
        }
        Ok(())
    }

    /// Download a blob to `dest`: into its partial file beside it (`.partial-<hex>`), renamed
    /// into place only after the size and digest check. Bad bytes are never left at `dest`.
    /// A partial file an interrupted run left is resumed from its length; if the whole then
    /// fails the digest check, it is discarded and the blob fetched again from the start. A
    /// download that fails for another reason keeps its partial file for the next run.
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

    /// [`Registry::pull_blob_to_file`]; returns how many bytes this call downloaded (less than
    /// the blob when an interrupted run's partial file was resumed, more when that partial
    /// proved bad and the blob came again from the start).
    pub(crate) async fn pull_blob_to_file_async(
        &self,
        reference: &RegistryRef,
        digest: &str,
        size: u64,
        dest: &Path,
        progress: Option<&ProgressBar>,
    ) -> Result<u64, RegistryError> {
        let path = partial::path_for(dest, digest)?;
        let prefix = partial::resume(&path, digest, size)?;
        let kept = prefix.len;
        let mut downloaded = size - kept;
        let mut result = self
            .fill_partial(reference, digest, size, &path, prefix, progress)
            .await;
        if kept > 0 && matches!(result, Err(RegistryError::Integrity { .. })) {
            warn!(
                "blob {digest}: the {kept} bytes an interrupted download left in {} and the \
                 rest do not give its digest; discarded, fetching the blob from the start",
                path.display()
            );
            downloaded += size;
            result = self
                .fill_partial(reference, digest, size, &path, Prefix::default(), progress)
                .await;
        }
        if let Err(e) = result {
            if matches!(e, RegistryError::Integrity { .. }) {
                partial::discard(&path)?;
            }
            return Err(e);
        }
        std::fs::set_permissions(&path, std::os::unix::fs::PermissionsExt::from_mode(0o644))
            .map_err(RegistryError::io(&path))?;
        std::fs::rename(&path, dest).map_err(RegistryError::io(dest))?;
        Ok(downloaded)
    }

    /// Streams the rest of a blob into its partial file, which holds `prefix` (cut to its
    /// length: nothing past what was hashed stays), and syncs it.
    async fn fill_partial(
        &self,
        reference: &RegistryRef,
        digest: &str,
        size: u64,
        path: &Path,
        prefix: Prefix,
        progress: Option<&ProgressBar>,
    ) -> Result<(), RegistryError> {
        let mut file = std::fs::OpenOptions::new()
            .write(true)
            .create(true)
            .truncate(false)
            .open(path)
            .map_err(RegistryError::io(path))?;
        file.set_len(prefix.len).map_err(RegistryError::io(path))?;
        file.seek(SeekFrom::Start(prefix.len))
            .map_err(RegistryError::io(path))?;
        let mut writer = std::io::BufWriter::with_capacity(1 << 20, file);
        self.stream_blob_after_async(reference, digest, size, prefix, &mut writer, progress)
            .await?;
        let file = writer
            .into_inner()
            .map_err(|e| RegistryError::io(path)(e.into_error()))?;
        file.sync_all().map_err(RegistryError::io(path))
    }

    /// Whether the repository already has a blob (a HEAD request).
    pub fn blob_exists(
        &self,
        reference: &RegistryRef,
        digest: &str,
    ) -> Result<bool, RegistryError> {
        self.block_on(self.blob_exists_async(reference, digest))
    }

    pub(crate) async fn blob_exists_async(
        &self,
        reference: &RegistryRef,
        digest: &str,
    ) -> Result<bool, RegistryError> {
        self.store_auth(reference).await;
        let oref = reference.to_oci();
        self.retry(&format!("blob {digest}"), || {
            self.client.blob_exists(&oref, digest)
        })
        .await
    }

    /// Upload a file as a blob, streamed in [`RegistryOptions::push_item`]-sized items. A
    /// failed upload is retried from its start (upload sessions cannot be resumed).
    pub(crate) async fn push_blob_file_async(
        &self,
        reference: &RegistryRef,
        path: &Path,
        digest: &str,
        size: u64,
        progress: Option<&ProgressBar>,
    ) -> Result<(), RegistryError> {
        self.store_auth(reference).await;
        let oref = reference.to_oci();
        let what = format!("uploading blob {digest}");
        let item = self.options.push_item.max(1 << 20);
        let mut first = true;
        self.retry(&what, || {
            let path = path.to_owned();
            let progress = progress.cloned();
            let oref = oref.clone();
            let retried = !std::mem::replace(&mut first, false);
            async move {
                if retried && self.client.blob_exists(&oref, digest).await? {
                    return Ok(());
                }
                if let Some(p) = &progress {
                    p.set_position(0);
                }
                let stream = file_stream(path, item, progress);
                self.client
                    .push_blob_stream(&oref, stream, digest, Some(size))
                    .await
                    .map(|_| ())
            }
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
        self.store_auth(reference).await;
        let ours = sha256_digest(bytes);
        let target = match &reference.tag {
            Some(t) => reference.with_tag(t),
            None => reference.with_digest(&ours),
        };
        let oref = target.to_oci();
        let content_type = http::HeaderValue::from_str(media_type)
            .map_err(|_| RegistryError::Protocol(format!("bad media type `{media_type}`")))?;
        let body = Bytes::copy_from_slice(bytes);
        self.retry(&format!("pushing manifest {target}"), || {
            self.client
                .push_manifest_raw(&oref, body.clone(), content_type.clone())
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
}

/// A file as a stream of `item`-sized `Bytes`, read on a blocking thread; at most two items
/// are in flight, so memory stays bounded whatever the file's size.
fn file_stream(
    path: std::path::PathBuf,
    item: usize,
    progress: Option<ProgressBar>,
) -> impl futures_util::Stream<Item = oci_client::errors::Result<Bytes>> + Send + 'static {
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
            let mut buf = vec![0u8; item];
            let mut filled = 0;
            while filled < item {
                match file.read(&mut buf[filled..]) {
                    Ok(0) => break,
                    Ok(n) => filled += n,
                    Err(e) if e.kind() == std::io::ErrorKind::Interrupted => {}
                    Err(e) => {
                        let _ = tx.blocking_send(Err(e));
                        return;
                    }
                }
            }
            if filled == 0 {
                return;
            }
            buf.truncate(filled);
            if tx.blocking_send(Ok(Bytes::from(buf))).is_err() {
                return; // the upload stopped
            }
            if filled < item {
                return;
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
        r.map_err(OciDistributionError::IoError)
    })
}
