//! [`Registry`]: a connection to one registry host. Its jobs are in their own modules, each an
//! `impl Registry` block or free functions: `http` (the one HTTP configuration), `retry`,
//! `token`, `manifest`, `blob`, `partial` and `upload` (see the module list in `registry`).

use std::future::Future;

use tracing::info;

use super::auth::{self, ResolvedAuth};
use super::error::RegistryError;
use super::http::{self, Transport};
use super::reference::RegistryRef;
use super::retry::Context;
use super::scrub::Scrubber;

use super::options::RegistryOptions;

/// A connection to one registry host.
pub struct Registry {
    rt: tokio::runtime::Runtime,
    pub(crate) transport: Transport,
    pub(crate) registry: String,
    pub(crate) auth: ResolvedAuth,
    /// Every form of the credentials (and tokens issued for them), kept out of messages.
    pub(crate) scrubber: Scrubber,
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
        let transport = http::transport(reference, &options)?;
        let rt = tokio::runtime::Builder::new_multi_thread()
            .worker_threads(options.concurrency.clamp(2, 8))
            .enable_all()
            .build()
            .map_err(|e| RegistryError::Setup {
                what: "the I/O runtime",
                source: Box::new(e),
            })?;
        Ok(Registry {
            rt,
            transport,
            registry: reference.registry.clone(),
            scrubber: Scrubber::new(&auth.credentials),
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
