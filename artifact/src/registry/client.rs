//! [`Registry`]: the sources of one reference (the mirrors a registries.conf names, then the
//! origin) and, for each, an [`Endpoint`], a connection to one registry host. An endpoint's
//! jobs are in their own modules, each an `impl Endpoint` block or free functions: `http` (the
//! one HTTP configuration), `retry`, `token`, `manifest`, `blob`, `partial` and `upload`; trying
//! the sources in order, and counting what each served, is `fallback`'s.

use std::collections::{HashMap, HashSet};
use std::future::Future;
use std::sync::{Arc, Mutex};

use tracing::info;

use super::auth::{self, ResolvedAuth};
use super::error::RegistryError;
use super::http::{self, Transport};
use super::mirrors::{MirrorConfig, PullSource};
use super::options::RegistryOptions;
use super::reference::RegistryRef;
use super::retry::Context;
use super::scrub::Scrubber;

/// A connection to one registry host, with the credentials scoped to it.
pub(crate) struct Endpoint {
    pub(crate) transport: Transport,
    pub(crate) registry: String,
    pub(crate) auth: ResolvedAuth,
    /// Every form of the credentials (and tokens issued for them), kept out of messages.
    pub(crate) scrubber: Scrubber,
    pub(crate) options: RegistryOptions,
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
    /// An endpoint for `reference`'s host. `explicit`: the host the user named, which alone gets
    /// the command line's and `OCI_REGISTRY_AUTH_TOKEN`'s credentials; any other host (a mirror,
    /// a rewritten location) only what docker's files hold for it.
    pub(crate) fn connect(
        reference: &RegistryRef,
        options: RegistryOptions,
        explicit: bool,
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
        let transport = http::transport(reference, &options)?;
        Ok(Endpoint {
            transport,
            registry: reference.registry.clone(),
            scrubber: Scrubber::new(&auth.credentials),
            auth,
            options,
        })
    }

    /// Who is asking, for the classification of failures.
    pub(crate) fn ctx(&self) -> Context<'_> {
        Context {
            registry: &self.registry,
            auth_source: &self.auth.source,
            scrubber: &self.scrubber,
        }
    }

    /// `…/v2/REPO/` of `reference`'s repository.
    pub(crate) fn repo_url(&self, reference: &RegistryRef) -> String {
        let oref = reference.to_oci();
        format!(
            "{}://{}/v2/{}",
            self.transport.scheme,
            oref.resolve_registry(),
            oref.repository()
        )
    }
}

/// Attempts in a row a mirror gets before the next source is tried (the origin gets
/// `--retries`).
pub const MIRROR_ATTEMPTS: u32 = 2;

/// What one source served during a run.
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
}

/// One source of a request, with its connection.
pub(crate) struct Src {
    pub(crate) endpoint: Arc<Endpoint>,
    pub(crate) reference: RegistryRef,
    pub(crate) location: String,
    pub(crate) mirror: bool,
}

/// The sources of one reference: its mirrors, then its origin. Publishing goes to the origin
/// only; pulls try the sources in order (`fallback`).
pub struct Registry {
    rt: tokio::runtime::Runtime,
    /// The host the reference names, with the explicit credentials.
    pub(crate) origin: Arc<Endpoint>,
    mirrors: Option<Arc<MirrorConfig>>,
    endpoints: Mutex<HashMap<(String, bool), Arc<Endpoint>>>,
    pub(crate) served: Mutex<Vec<Served>>,
    /// (blob digest, location): a source whose bytes failed that blob's digest.
    pub(crate) refused: Mutex<HashSet<(String, String)>>,
    /// Mirrors that stayed unreachable or failing (retries used up): skipped for the rest of
    /// the run, so a dead mirror costs one short wait, not one per blob.
    pub(crate) down: Mutex<HashSet<String>>,
    pub(crate) options: RegistryOptions,
}

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
    /// Connect to the registry `reference` names, and to the mirrors `options.mirrors` gives
    /// for it (no request is made yet).
    pub fn connect(
        reference: &RegistryRef,
        options: RegistryOptions,
    ) -> Result<Self, RegistryError> {
        let origin = Arc::new(Endpoint::connect(reference, options.clone(), true)?);
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
            (reference.registry.clone(), options.insecure),
            Arc::clone(&origin),
        );
        let registry = Registry {
            rt,
            origin,
            mirrors: options.mirrors.clone(),
            endpoints: Mutex::new(endpoints),
            served: Mutex::new(Vec::new()),
            refused: Mutex::new(HashSet::new()),
            down: Mutex::new(HashSet::new()),
            options,
        };
        // Every source is connected now, so a wrong credential helper for a mirror fails here.
        for by_digest in [false, true] {
            registry.sources(reference, by_digest)?;
        }
        Ok(registry)
    }

    /// Where the origin's credentials came from (safe to print).
    pub fn auth_source(&self) -> &str {
        &self.origin.auth.source
    }

    /// What each source served so far, in the order they were first used.
    pub fn served(&self) -> Vec<Served> {
        self.served.lock().expect("not poisoned").clone()
    }

    pub(crate) fn block_on<F: Future>(&self, f: F) -> F::Output {
        self.rt.block_on(f)
    }

    /// The sources of `reference` for a request by digest or by tag, in order, each connected.
    pub(crate) fn sources(
        &self,
        reference: &RegistryRef,
        by_digest: bool,
    ) -> Result<Vec<Src>, RegistryError> {
        let plan = match &self.mirrors {
            None => vec![PullSource {
                reference: reference.clone(),
                insecure: false,
                mirror: false,
            }],
            Some(m) => m.pull_sources(reference, by_digest)?,
        };
        let down = self.down.lock().expect("not poisoned").clone();
        plan.into_iter()
            .filter(|p| !(p.mirror && down.contains(&p.location())))
            .map(|p| {
                let insecure = self.options.insecure || p.insecure;
                let key = (p.reference.registry.clone(), insecure);
                let mut map = self.endpoints.lock().expect("not poisoned");
                let endpoint = match map.get(&key) {
                    Some(e) => Arc::clone(e),
                    None => {
                        let mut options = RegistryOptions {
                            insecure,
                            ..self.options.clone()
                        };
                        if p.mirror {
                            // A mirror that fails is skipped for the next source, not waited on.
                            options.retry.attempts = options.retry.attempts.min(MIRROR_ATTEMPTS);
                        }
                        let explicit = p.reference.registry == self.origin.registry;
                        let e = Arc::new(Endpoint::connect(&p.reference, options, explicit)?);
                        map.insert(key, Arc::clone(&e));
                        e
                    }
                };
                Ok(Src {
                    endpoint,
                    location: p.location(),
                    reference: p.reference,
                    mirror: p.mirror,
                })
            })
            .collect()
    }
}
