//! `ingot-registry`: OCI image layouts and the registries they travel through: publish a
//! layout, pull one back, and read manifests and blobs straight from a registry (the artifact
//! crate's verifier and `layerfs` read a stack this way). It sits above `ingot-layers` (digests,
//! canonical JSON) and below `ingot-artifact`, which knows what a stack is.
//!
//! One transport, one authorization path, one failure classification: every request (pull,
//! push, HEAD, mirrors) is ingot's own over one `reqwest` client (`http` says why not
//! `oci-client`), authorized by `token`, its failure classified by [`retry`].
//!
//! - [`oci_layout`]: the OCI image layout on disk and the manifest/descriptor types.
//! - [`error_chain`]: an error and its causes as one line, each said once.
//! - [`reference`]: `oci://HOST[:PORT]/REPO[:TAG][@DIGEST]` and whether it speaks plain HTTP.
//! - [`auth`]: where credentials come from (flags, `OCI_REGISTRY_AUTH_TOKEN`, docker's
//!   `config.json`), wrapped in [`auth::Secret`] so they never reach a log or an error.
//! - [`mirrors`]: a containers-registries.conf(5) (version 2) file read, and which sources
//!   (mirrors, then the origin) a reference is pulled from, in which order.
//! - [`client`]: [`Registry`], the sources of one reference, each an `Endpoint` (a connection
//!   to one registry host, credentials scoped to it); `fallback` tries them in order, counts
//!   what each served, and lets a caller that checks a streamed blob itself refuse the source
//!   whose bytes failed ([`SourcedWrite`], [`Registry::refuse`]). An endpoint's jobs, each an
//!   `impl Endpoint` block or free functions in
//!   its own module:
//!   - `http`: the one HTTP client (timeouts, TLS trust, plain HTTP) every request goes through,
//!     and every body read into memory read with a cap (why ingot speaks the distribution API
//!     itself, not through `oci-client`, is said there);
//!   - [`retry`]: which failures are worth another attempt, and how many attempts to make;
//!   - `token`: the one authorization path: the `Authorization` of every request (the
//!     distribution token flow, its answers capped, a `401` naming a new token service answered);
//!   - `manifest`: manifests, read with a cap; tags resolved;
//!   - `blob`: one blob to a sink, its digest checked, an interrupted transfer resumed with an
//!     HTTP `Range` request from the last good byte, the minimum speed held per blob;
//!   - `partial`: a blob into a file through its `.partial-<hex>` file, resuming from one an
//!     interrupted run left;
//!   - `upload`: blobs and manifests up (the distribution spec's upload sessions).
//! - [`error`]: [`RegistryError`] and the typed [`Cause`] of a last failed attempt.
//! - [`options`]: [`RegistryOptions`], what the command line's registry flags set.
//! - `scrub`: every form of the credentials, kept out of any message.
//! - [`limits`]: the most a registry can make ingot spend: 4 MiB per manifest, capped error and
//!   token bodies, a minimum throughput per blob.
//! - [`push`] / [`pull`]: whole artifacts, with progress bars.
//!
//! See `docs/registry.md` for the user-facing contract (exit codes, auth precedence, resume).

pub mod args;
pub mod auth;
mod blob;
pub mod client;
pub mod error;
pub mod error_chain;
mod fallback;
mod http;
pub mod limits;
mod manifest;
pub mod mirrors;
mod mirrors_error;
pub mod oci_layout;
pub mod options;
pub(crate) mod partial;
pub mod progress;
pub mod pull;
pub mod push;
pub mod reference;
pub mod retry;
mod scrub;
mod token;
mod upload;

pub use auth::{Credentials, Secret};
pub use blob::MAX_IN_MEMORY_BLOB;
pub use client::{Registry, Resolved, Served, SourceLog, SourceName};
pub use error::{Cause, RegistryError};
pub use fallback::SourcedWrite;
pub use limits::{SpeedLimit, MAX_MANIFEST_SIZE};
pub use manifest::FetchedStack;
pub use options::{RegistryOptions, DEFAULT_PUSH_ITEM};
pub use reference::RegistryRef;
pub use retry::RetryPolicy;

/// The `User-Agent` of every request.
pub const USER_AGENT: &str = concat!("ingot/", env!("CARGO_PKG_VERSION"));
