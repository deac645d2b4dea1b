//! [`RegistryOptions`]: how to talk to a registry (what the command line's registry flags, in
//! `args`, set).

use crate::auth::ExplicitAuth;
use crate::limits::SpeedLimit;
use crate::retry::RetryPolicy;

/// Default size of the items a streamed blob upload (one `PUT`) is read from its file in; with
/// `chunked`, each `PATCH` carries 4 MiB whatever this is.
pub const DEFAULT_PUSH_ITEM: usize = 8 << 20;

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
    /// Credentials from the command line (others come from the environment, see
    /// [`crate::auth`]).
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
    /// Mirrors and location rewrites (a registries.conf); `None`: every reference from its
    /// own registry.
    pub mirrors: Option<std::sync::Arc<crate::mirrors::MirrorConfig>>,
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
            mirrors: None,
        }
    }
}
