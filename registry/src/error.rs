//! [`RegistryError`], what every registry operation fails with, and [`Cause`], why the last
//! attempt of an operation that ran out of retries failed. Causes stay typed (a `reqwest` error is
//! a `reqwest` error); registry text in them is scrubbed of credentials before it gets here.

use std::path::PathBuf;

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
        /// What the registry said (scrubbed of credentials).
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
    #[error("{op}: gave up after {attempts} attempts")]
    Transient {
        /// What was being done.
        op: String,
        /// How many attempts were made.
        attempts: u32,
        /// Why the last one failed.
        #[source]
        last: Cause,
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
    /// The registry answered something this client cannot use, for good (not retried).
    #[error("{0}")]
    Protocol(String),
    /// The registry answered something this client cannot use, for this reason.
    #[error("{what}")]
    Refused {
        /// What was asked, and what was wrong with the answer.
        what: String,
        /// The failure itself.
        #[source]
        cause: Cause,
    },
    /// A JSON document from the registry or a file is not what it should be.
    #[error("{what}")]
    Decode {
        /// The document.
        what: String,
        /// The parser's complaint.
        #[source]
        source: serde_json::Error,
    },
    /// The HTTP client or the I/O runtime could not be set up.
    #[error("setting up {what}")]
    Setup {
        /// The HTTP client, or the runtime.
        what: &'static str,
        /// Why.
        #[source]
        source: Box<dyn std::error::Error + Send + Sync>,
    },
    /// A local file could not be read or written.
    #[error("{path}")]
    Io {
        /// The file.
        path: PathBuf,
        /// The error.
        #[source]
        source: std::io::Error,
    },
    /// The local OCI image layout is unusable.
    #[error(transparent)]
    Layout(#[from] crate::oci_layout::LayoutError),
    /// The registries configuration (mirrors) is unusable, or blocks the reference.
    #[error(transparent)]
    Mirrors(#[from] crate::mirrors_error::MirrorsError),
    /// A `--ca-file` holds no usable certificate.
    #[error("--ca-file {path}: not a usable certificate")]
    Certificate {
        /// The file.
        path: PathBuf,
        /// Why.
        #[source]
        source: reqwest::Error,
    },
    /// A docker config file (`--authfile`, `config.json`) could not be used.
    #[error("{path}: not a usable docker config file")]
    DockerConfig {
        /// The file.
        path: PathBuf,
        /// Why.
        #[source]
        source: docker_credential::CredentialRetrievalError,
    },
    /// Every source of a reference failed (mirrors, then the origin): `tried` names each source
    /// before the last and why it failed; the last one's error is the source.
    #[error("{what}: every source failed: {tried}; then {last_source}")]
    AllSources {
        /// What was being fetched.
        what: String,
        /// Each source but the last, with its error.
        tried: String,
        /// The last source tried (the origin).
        last_source: String,
        /// Why it failed.
        #[source]
        last: Box<RegistryError>,
    },
}

/// Why one attempt at a request failed.
#[derive(Debug, thiserror::Error)]
pub enum Cause {
    /// The registry answered with an error status; `body` is what it said, cut short and
    /// scrubbed of credentials.
    #[error("HTTP {status}: {body}")]
    Status {
        /// The HTTP status.
        status: u16,
        /// The start of the body.
        body: String,
    },
    /// An answer's body was longer than anything it may be read into memory for.
    #[error("the {what} passed {cap} bytes, the most read into memory; stopped reading")]
    BodyTooLarge {
        /// `error body (HTTP 500)`, `token service answer`, …
        what: String,
        /// The cap.
        cap: u64,
    },
    /// The connection or the HTTP exchange failed.
    #[error("the request failed")]
    Http(#[source] reqwest::Error),
    /// A mirror could not be connected to (refused, no answer in time, the TLS handshake
    /// failed): not retried.
    #[error("no connection could be made")]
    Connect(#[source] reqwest::Error),
    /// A response ended before the bytes it promised.
    #[error("the response ended at byte {at} of {size}")]
    Truncated {
        /// The last byte received.
        at: u64,
        /// The blob's size.
        size: u64,
    },
    /// Slower than the minimum speed (`limits`).
    #[error("{0}")]
    TooSlow(String),
    /// Followed redirects in a circle, or too many of them.
    #[error("too many redirects (a redirect loop?)")]
    Redirects(#[source] reqwest::Error),
    /// What the registry sent is not what the protocol allows.
    #[error("{0}")]
    Answer(String),
}

impl RegistryError {
    /// The documented exit code (`docs/registry.md`): 1 other, 2 usage, 4 integrity,
    /// 6 authentication, 7 not found, 8 registry unreachable or failing, 9 tag conflict.
    pub fn exit_code(&self) -> u8 {
        match self {
            RegistryError::Reference(_)
            | RegistryError::Mirrors(_)
            | RegistryError::Certificate { .. } => 2,
            RegistryError::AllSources { last, .. } => last.exit_code(),
            RegistryError::Integrity { .. } => 4,
            RegistryError::Auth { .. } => 6,
            RegistryError::NotFound(_) => 7,
            RegistryError::Transient { .. } => 8,
            RegistryError::Conflict { .. } => 9,
            RegistryError::Protocol(_)
            | RegistryError::Refused { .. }
            | RegistryError::Decode { .. }
            | RegistryError::Setup { .. }
            | RegistryError::Io { .. }
            | RegistryError::Layout(_)
            | RegistryError::DockerConfig { .. } => 1,
        }
    }

    /// Whether this is the network or the registry failing to deliver (unreachable, dropped
    /// connections, too slow, 5xx: retries used up), as opposed to what it delivered being
    /// wrong, missing or refused. With several sources: whether the last one (the origin)
    /// failed so.
    pub fn is_transport(&self) -> bool {
        match self {
            RegistryError::Transient { .. } => true,
            RegistryError::AllSources { last, .. } => last.is_transport(),
            _ => false,
        }
    }

    /// An I/O error on `path`, for `map_err`.
    pub fn io(path: &std::path::Path) -> impl FnOnce(std::io::Error) -> RegistryError {
        let path = path.to_owned();
        move |source| RegistryError::Io { path, source }
    }

    /// The message with every cause: what a command prints.
    pub fn full_text(&self) -> String {
        crate::error_chain::text(self)
    }
}
