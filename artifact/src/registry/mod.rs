//! Stacks in OCI registries: publish an image layout, pull one back, and read an artifact
//! straight from a registry for `verify` and `inspect`.
//!
//! - [`reference`]: `oci://HOST[:PORT]/REPO[:TAG][@DIGEST]` and whether it speaks plain HTTP.
//! - [`auth`]: where credentials come from (flags, `OCI_REGISTRY_AUTH_TOKEN`, docker's
//!   `config.json`), wrapped in [`auth::Secret`] so they never reach a log or an error.
//! - [`client`]: the transport (`oci-client` over rustls), retries with backoff, and
//!   [`client::Registry::stream_blob`]: one blob to a sink, its digest checked, an interrupted
//!   transfer resumed with an HTTP `Range` request from the last good byte.
//! - `partial`: a blob's `.partial-<hex>` file while it downloads, and resuming from one an
//!   interrupted run left.
//! - [`limits`]: the most a registry can make ingot spend: 4 MiB per manifest, a minimum
//!   throughput per download.
//! - [`push`] / [`pull`]: whole artifacts, with progress bars.
//! - [`source`]: [`source::RegistrySource`], the [`crate::verify::ArtifactSource`] of a registry.
//!
//! See `docs/registry.md` for the user-facing contract (exit codes, auth precedence, resume).

pub mod args;
pub mod auth;
pub mod client;
pub mod limits;
pub(crate) mod partial;
pub mod progress;
pub mod pull;
pub mod push;
pub mod reference;
pub mod source;

pub use auth::{Credentials, Secret};
pub use client::{FetchedStack, Registry, RegistryOptions, RetryPolicy};
pub use limits::{SpeedLimit, MAX_MANIFEST_SIZE};
pub use reference::RegistryRef;

/// Why a registry operation failed. Callers branch on the variant (see [`RegistryError::exit_code`]).
#[derive(Debug, thiserror::Error)]
pub enum RegistryError {
    /// The reference is malformed, or lacks what the operation needs.
    #[error("{0}")]
    Reference(String),
    /// The registry refused the credentials, or wants some and none were given.
    #[error("authentication to {registry} failed ({source_desc}): {detail}")]
    Auth {
        /// `host[:port]`.
        registry: String,
        /// Where the credentials came from (never the credentials themselves).
        source_desc: String,
        /// What the registry said.
        detail: String,
    },
    /// A tag, manifest or blob is not in the registry.
    #[error("{0}: not found in the registry")]
    NotFound(String),
    /// Bytes from the registry do not match their digest or size; they were discarded.
    #[error("blob {blob}: {detail}")]
    Integrity {
        /// The blob's (expected) digest.
        blob: String,
        /// What is wrong.
        detail: String,
    },
    /// The registry or the network kept failing; retries are exhausted.
    #[error("{op}: gave up after {attempts} attempts: {detail}")]
    Transient {
        /// What was being done.
        op: String,
        /// How many attempts were made.
        attempts: u32,
        /// The last failure.
        detail: String,
    },
    /// The tag already names different content.
    #[error(
        "{reference} already names {existing}, not {ours}: refusing to move a published tag \
         (--allow-overwrite moves it)"
    )]
    Conflict {
        /// The reference.
        reference: String,
        /// The digest the tag names now.
        existing: String,
        /// The digest we would publish.
        ours: String,
    },
    /// The registry answered something this client cannot use.
    #[error("{0}")]
    Protocol(String),
    /// A local file could not be read or written.
    #[error("{path}: {source}")]
    Io {
        /// The file.
        path: std::path::PathBuf,
        /// The error.
        source: std::io::Error,
    },
    /// The local OCI image layout is unusable.
    #[error(transparent)]
    Layout(#[from] crate::oci_layout::LayoutError),
}

impl RegistryError {
    /// The documented exit code (`docs/registry.md`): 1 other, 2 usage, 4 integrity,
    /// 6 authentication, 7 not found, 8 registry unreachable or failing, 9 tag conflict.
    pub fn exit_code(&self) -> u8 {
        match self {
            RegistryError::Reference(_) => 2,
            RegistryError::Integrity { .. } => 4,
            RegistryError::Auth { .. } => 6,
            RegistryError::NotFound(_) => 7,
            RegistryError::Transient { .. } => 8,
            RegistryError::Conflict { .. } => 9,
            RegistryError::Protocol(_) | RegistryError::Io { .. } | RegistryError::Layout(_) => 1,
        }
    }

    pub(crate) fn io(path: &std::path::Path) -> impl FnOnce(std::io::Error) -> RegistryError {
        let path = path.to_owned();
        move |source| RegistryError::Io { path, source }
    }
}
