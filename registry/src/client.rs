//! [`Registry`]: the sources of one reference (the mirrors a registries.conf names, then the
//! origin) and, for each, an [`Endpoint`], a connection to one registry host, made when the
//! source is first tried (a registries.conf may name thousands of mirrors; a run pays only for
//! those it asks). An endpoint's jobs are in their own modules, each an `impl Endpoint` block or
//! free functions: `http` (the one HTTP configuration), `retry`, `token`, `manifest`, `blob`,
//! `partial` and `upload`, every request authorized by `token`; trying the sources in order, and recording what each served and why
//! one failed ([`SourceLog`]), is `fallback`'s.

use std::collections::{HashMap, HashSet};
use std::future::Future;
use std::sync::{Arc, Mutex};

use tracing::info;

use crate::auth::{self, ResolvedAuth};
use crate::error::{Cause, RegistryError};
use crate::http::{self, Transport};
use crate::mirrors::MirrorConfig;
use crate::options::RegistryOptions;
use crate::reference::RegistryRef;
use crate::retry::Context;
use crate::scrub::Scrubber;

/// A connection to one registry host, with the credentials scoped to it.
pub(crate) struct Endpoint {
    pub(crate) transport: Transport,
    pub(crate) registry: String,
    pub(crate) auth: ResolvedAuth,
    /// Every form of the credentials (and tokens issued for them), kept out of messages.
    pub(crate) scrubber: Scrubber,
    pub(crate) options: RegistryOptions,
    /// A mirror's endpoint: a connection that cannot be made is not retried (`retry`).
    pub(crate) mirror: bool,
}

impl std::fmt::Debug for Endpoint {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Endpoint")
            .field("registry", &self.registry)
            .field("auth_source", &self.auth.source)
            .finish_non_exhaustive()
    }
}

impl Endpoint {
    /// An endpoint for `reference`'s host over `transport`. `explicit`: the host the user named,
    /// which alone gets the command line's and `OCI_REGISTRY_AUTH_TOKEN`'s credentials; any other
    /// host (a mirror, a rewritten location) only what docker's files hold for it.
    pub(crate) fn connect(
        reference: &RegistryRef,
        options: RegistryOptions,
        explicit: bool,
        mirror: bool,
        transport: Transport,
    ) -> Result<Self, RegistryError> {
        let auth = if explicit {
            auth::resolve(&reference.registry, &options.auth)?
        } else {
            auth::resolve_for_mirror(&reference.registry, &options.auth)?
        };
        info!(
            "registry {}: credentials from {}",
            reference.registry, auth.source
        );
        Ok(Endpoint {
            transport,
            registry: reference.registry.clone(),
            scrubber: Scrubber::new(&auth.credentials),
            auth,
            options,
            mirror,
        })
    }

    /// Who is asking, for the classification of failures.
    pub(crate) fn ctx(&self) -> Context<'_> {
        Context {
            registry: &self.registry,
            auth_source: &self.auth.source,
            scrubber: &self.scrubber,
            mirror: self.mirror,
        }
    }

    /// `…/v2/REPO/` of `reference`'s repository.
    pub(crate) fn repo_url(&self, reference: &RegistryRef) -> String {
        format!(
            "{}://{}/v2/{}",
            self.transport.scheme,
            reference.api_host(),
            reference.repository
        )
    }
}

/// Attempts in a row a mirror gets before the next source is tried (the origin gets
/// `--retries`). A mirror that cannot be connected to at all gets one.
pub const MIRROR_ATTEMPTS: u32 = 2;

/// One source of a pull, as warnings, errors and reports name it.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub struct SourceName {
    /// `host[:port]/repository`.
    pub location: String,
    /// A mirror (else the origin).
    pub mirror: bool,
}

impl std::fmt::Display for SourceName {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let kind = if self.mirror { "mirror" } else { "origin" };
        write!(f, "{kind} {}", self.location)
    }
}

impl SourceName {
    pub(crate) fn of(src: &Src) -> Self {
        SourceName {
            location: src.location.clone(),
            mirror: src.mirror,
        }
    }
}

/// The most failures kept as text per source in [`Served::errors`] (all are counted).
pub const ERRORS_KEPT: usize = 4;

/// The longest failure text kept in [`Served::errors`], in characters.
const ERROR_TEXT: usize = 600;

/// What one source served during a run, and how it failed.
#[derive(Debug, Clone, PartialEq, Eq, serde::Serialize)]
pub struct Served {
    /// `host[:port]/repository` of the source.
    pub location: String,
    /// Whether it is a mirror (else the origin).
    pub mirror: bool,
    /// Bytes it delivered (manifests and blobs, including those of a blob another source then
    /// finished).
    pub bytes: u64,
    /// Blobs it delivered whole or finished.
    pub blobs: u64,
    /// Requests it failed, and blobs refused from it for bytes that failed a check.
    pub failures: u64,
    /// The first [`ERRORS_KEPT`] of those failures: what was asked, and why it failed.
    pub errors: Vec<String>,
    /// Skipped for the rest of the run: a mirror that could not be reached.
    pub down: bool,
}

/// Which source answered a tag, and with what.
#[derive(Debug, Clone, PartialEq, Eq, serde::Serialize)]
pub struct Resolved {
    /// The tag.
    pub tag: String,
    /// The manifest digest it named there.
    pub digest: String,
    /// `host[:port]/repository` of the source that answered.
    pub location: String,
    /// Whether that source is a mirror (else the origin).
    pub mirror: bool,
}

#[derive(Debug, Default)]
struct LogState {
    served: Vec<Served>,
    resolved: Vec<Resolved>,
}

/// What each source of a run served, how each failed, and which resolved a tag: shared by the
/// [`Registry`] that writes it and whoever reports on the run, so that it outlives a registry
/// that failed (a run that fails names the sources it tried as well as one that succeeds).
#[derive(Debug, Clone, Default)]
pub struct SourceLog(Arc<Mutex<LogState>>);

impl SourceLog {
    /// What each source served so far, in the order they were first tried.
    pub fn served(&self) -> Vec<Served> {
        self.lock().served.clone()
    }

    /// Every tag resolved so far, and by whom.
    pub fn resolved(&self) -> Vec<Resolved> {
        self.lock().resolved.clone()
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, LogState> {
        self.0.lock().expect("not poisoned")
    }

    /// The entry of `src`, made on first use.
    fn with<T>(&self, src: &SourceName, f: impl FnOnce(&mut Served) -> T) -> T {
        let mut state = self.lock();
        let served = &mut state.served;
        let i = match served.iter().position(|s| s.location == src.location) {
            Some(i) => i,
            None => {
                served.push(Served {
                    location: src.location.clone(),
                    mirror: src.mirror,
                    bytes: 0,
                    blobs: 0,
                    failures: 0,
                    errors: Vec::new(),
                    down: false,
                });
                served.len() - 1
            }
        };
        f(&mut served[i])
    }

    pub(crate) fn count(&self, src: &SourceName, bytes: u64, blob: bool) {
        self.with(src, |s| {
            s.bytes += bytes;
            s.blobs += u64::from(blob);
        });
    }

    /// `src` failed `what` because of `why`; `down`: it is skipped from now on.
    pub(crate) fn failed(&self, src: &SourceName, what: &str, why: &str, down: bool) {
        self.with(src, |s| {
            s.failures += 1;
            s.down |= down;
            if s.errors.len() < ERRORS_KEPT {
                let text = format!("{what}: {why}");
                s.errors.push(match text.char_indices().nth(ERROR_TEXT) {
                    Some((i, _)) => format!("{}…", &text[..i]),
                    None => text,
                });
            }
        });
    }

    pub(crate) fn resolved_by(&self, resolved: Resolved) {
        self.lock().resolved.push(resolved);
    }
}

/// One source of a request; its connection is made when it is first tried
/// ([`Registry::endpoint`]).
#[derive(Debug, Clone)]
pub(crate) struct Src {
    pub(crate) reference: RegistryRef,
    pub(crate) location: String,
    pub(crate) mirror: bool,
    /// TLS without certificate checks.
    insecure: bool,
    /// Marked `insecure` in the registries configuration: plain HTTP allowed too.
    plain_allowed: bool,
}

/// The sources of one reference: its mirrors, then its origin. Publishing goes to the origin
/// only; pulls try the sources in order (`fallback`).
pub struct Registry {
    rt: tokio::runtime::Runtime,
    /// The host the reference names, with the explicit credentials.
    pub(crate) origin: Arc<Endpoint>,
    mirrors: Option<Arc<MirrorConfig>>,
    /// By (host, TLS unchecked, plain HTTP allowed).
    endpoints: Mutex<HashMap<(String, bool, bool), Arc<Endpoint>>>,
    /// The HTTP clients, one per configuration (plain HTTP, TLS unchecked, a mirror's), shared
    /// by every host: building one costs more than the request a mirror answers.
    transports: Mutex<HashMap<TransportKey, Transport>>,
    pub(crate) log: SourceLog,
    /// (blob digest, location): a source whose bytes failed that blob's digest.
    pub(crate) refused: Mutex<HashSet<(String, String)>>,
    /// Mirrors that could not be reached or stayed failing (retries used up), or whose
    /// connection could not be set up: skipped for the rest of the run, so a dead mirror costs
    /// one failed attempt, not one per blob.
    pub(crate) down: Mutex<HashSet<String>>,
    pub(crate) options: RegistryOptions,
}

/// What a [`Transport`] depends on besides the run's options: plain HTTP, TLS unchecked, for a
/// mirror.
type TransportKey = (bool, bool, bool);

impl std::fmt::Debug for Registry {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Registry")
            .field("registry", &self.origin.registry)
            .field("auth_source", &self.origin.auth.source)
            .field("mirrors", &self.mirrors.as_ref().map(|m| &m.path))
            .finish_non_exhaustive()
    }
}

impl Registry {
    /// Connect to the registry `reference` names; the mirrors `options.mirrors` gives for it are
    /// connected to when first tried (no request is made yet).
    pub fn connect(
        reference: &RegistryRef,
        options: RegistryOptions,
    ) -> Result<Self, RegistryError> {
        Self::connect_logged(reference, options, SourceLog::default())
    }

    /// [`Registry::connect`], recording into `log` what each source serves and why one fails.
    pub fn connect_logged(
        reference: &RegistryRef,
        options: RegistryOptions,
        log: SourceLog,
    ) -> Result<Self, RegistryError> {
        let key = (http::is_plain(reference, &options), options.insecure, false);
        let transport = http::transport(reference, &options, false)?;
        let origin = Arc::new(Endpoint::connect(
            reference,
            options.clone(),
            true,
            false,
            transport.clone(),
        )?);
        let rt = tokio::runtime::Builder::new_multi_thread()
            .worker_threads(options.concurrency.clamp(2, 8))
            .enable_all()
            .build()
            .map_err(|e| RegistryError::Setup {
                what: "the I/O runtime",
                source: Box::new(e),
            })?;
        let mut endpoints = HashMap::new();
        endpoints.insert(
            (reference.registry.clone(), options.insecure, false),
            Arc::clone(&origin),
        );
        let registry = Registry {
            rt,
            origin,
            mirrors: options.mirrors.clone(),
            endpoints: Mutex::new(endpoints),
            transports: Mutex::new(HashMap::from([(key, transport)])),
            log,
            refused: Mutex::new(HashSet::new()),
            down: Mutex::new(HashSet::new()),
            options,
        };
        // A blocked reference, or a location that does not rewrite to one, fails here.
        for by_digest in [false, true] {
            registry.sources(reference, by_digest)?;
        }
        Ok(registry)
    }

    /// Where the origin's credentials came from (safe to print).
    pub fn auth_source(&self) -> &str {
        &self.origin.auth.source
    }

    /// What each source served so far, in the order they were first tried.
    pub fn served(&self) -> Vec<Served> {
        self.log.served()
    }

    /// The record of this run's sources (shared: it stays readable after the registry is gone).
    pub fn log(&self) -> SourceLog {
        self.log.clone()
    }

    /// The connections made so far (the origin's, and those of the sources tried).
    pub fn connections(&self) -> usize {
        self.endpoints.lock().expect("not poisoned").len()
    }

    pub(crate) fn block_on<F: Future>(&self, f: F) -> F::Output {
        self.rt.block_on(f)
    }

    /// The sources of `reference` for a request by digest or by tag, in order, without the
    /// mirrors that are down. A location listed twice is tried once, where it is first listed;
    /// a mirror whose location is the origin's is the origin, tried last as the origin.
    pub(crate) fn sources(
        &self,
        reference: &RegistryRef,
        by_digest: bool,
    ) -> Result<Vec<Src>, RegistryError> {
        let plan = match &self.mirrors {
            None => vec![crate::mirrors::PullSource {
                reference: reference.clone(),
                insecure: false,
                mirror: false,
            }],
            Some(m) => m.pull_sources(reference, by_digest)?,
        };
        let origin = plan
            .iter()
            .find(|p| !p.mirror)
            .map(crate::mirrors::PullSource::location);
        let down = self.down.lock().expect("not poisoned").clone();
        let mut seen = HashSet::new();
        Ok(plan
            .into_iter()
            .filter_map(|p| {
                let location = p.location();
                let skip =
                    p.mirror && (down.contains(&location) || origin.as_ref() == Some(&location));
                (!skip && seen.insert(location.clone())).then_some(Src {
                    insecure: self.options.insecure || p.insecure,
                    plain_allowed: p.insecure,
                    location,
                    reference: p.reference,
                    mirror: p.mirror,
                })
            })
            .collect())
    }

    /// The connection to `src`, made on first use. A mirror whose connection cannot be set up
    /// (its credentials, its HTTP client) is down for the rest of the run.
    pub(crate) async fn endpoint(&self, src: &Src) -> Result<Arc<Endpoint>, RegistryError> {
        let key = (
            src.reference.registry.clone(),
            src.insecure,
            src.plain_allowed,
        );
        if let Some(e) = self.endpoints.lock().expect("not poisoned").get(&key) {
            return Ok(Arc::clone(e));
        }
        let made = self.make_endpoint(src).await;
        if made.is_err() && src.mirror {
            self.mark_down(src);
        }
        let e = made?;
        let mut map = self.endpoints.lock().expect("not poisoned");
        Ok(Arc::clone(map.entry(key).or_insert(e)))
    }

    async fn make_endpoint(&self, src: &Src) -> Result<Arc<Endpoint>, RegistryError> {
        let mut options = RegistryOptions {
            insecure: src.insecure,
            ..self.options.clone()
        };
        if src.mirror {
            // A mirror that fails is skipped for the next source, not waited on.
            options.retry.attempts = options.retry.attempts.min(MIRROR_ATTEMPTS);
        }
        let plain = src.plain_allowed
            && !http::is_plain(&src.reference, &options)
            && self.speaks_plain_http(src, &options).await?;
        if plain {
            options.plain_http = true;
        }
        let transport = self.transport(&src.reference, &options, src.mirror)?;
        // The command line's credentials and CAPH's token never travel in clear text to a
        // host that was not named as plain HTTP: over a fallback only docker's files' own
        // entry for the host is sent (containers/image sends them all).
        let named = src.reference.registry == self.origin.registry;
        let explicit = named && (!plain || src.reference.is_loopback());
        if named && !explicit {
            tracing::warn!(
                "{}: speaks plain HTTP (insecure = true in the registries configuration): the \
                 command line's credentials are not sent to it, only docker's config entry for \
                 it",
                src.reference.registry
            );
        }
        Ok(Arc::new(Endpoint::connect(
            &src.reference,
            options,
            explicit,
            src.mirror,
            transport,
        )?))
    }

    /// Whether a location marked `insecure` speaks plain HTTP: as containers/image does, TLS
    /// first (its certificate unchecked), and plain HTTP only when the TLS request fails.
    async fn speaks_plain_http(
        &self,
        src: &Src,
        options: &RegistryOptions,
    ) -> Result<bool, RegistryError> {
        let tls = self.transport(&src.reference, options, src.mirror)?;
        let host = &src.reference.registry;
        let tls_failed = match tls.http.get(format!("https://{host}/v2/")).send().await {
            Ok(_) => return Ok(false),
            Err(e) => e,
        };
        let clear = RegistryOptions {
            plain_http: true,
            ..options.clone()
        };
        let clear = self.transport(&src.reference, &clear, src.mirror)?;
        match clear.http.get(format!("http://{host}/v2/")).send().await {
            Ok(_) => {
                info!(
                    "{host}: no TLS; plain HTTP (insecure = true in the registries configuration)"
                );
                Ok(true)
            }
            // A mirror reachable neither way is down now, not asked a third time; the origin
            // keeps TLS and its retries.
            Err(_) if src.mirror && tls_failed.is_connect() => Err(RegistryError::Transient {
                op: format!("{host}: /v2/ over TLS, then over plain HTTP (insecure = true)"),
                attempts: 1,
                last: Cause::Connect(tls_failed),
            }),
            Err(_) => Ok(false),
        }
    }

    /// The HTTP clients for `options`, shared by every host with the same settings.
    fn transport(
        &self,
        reference: &RegistryRef,
        options: &RegistryOptions,
        mirror: bool,
    ) -> Result<Transport, RegistryError> {
        let key = (http::is_plain(reference, options), options.insecure, mirror);
        if let Some(t) = self.transports.lock().expect("not poisoned").get(&key) {
            return Ok(t.clone());
        }
        let t = http::transport(reference, options, mirror)?;
        self.transports
            .lock()
            .expect("not poisoned")
            .insert(key, t.clone());
        Ok(t)
    }

    /// `src` (a mirror) is skipped for the rest of the run.
    pub(crate) fn mark_down(&self, src: &Src) {
        self.down
            .lock()
            .expect("not poisoned")
            .insert(src.location.clone());
    }
}
