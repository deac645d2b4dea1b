//! The registry options as command-line arguments: one clap [`Args`] struct that every command
//! reaching a registry flattens (`ingot publish`, `pull`, `resolve`, `verify`, `inspect`, `diff`,
//! and `ingot-writer`), converted into the client's [`RegistryOptions`].

use std::io::Read;
use std::path::PathBuf;

use clap::Args;

use crate::auth::ExplicitAuth;
use crate::auth::Secret;
use crate::error::RegistryError;
use crate::limits::SpeedLimit;
use crate::mirrors::MirrorsFrom;
use crate::options::RegistryOptions;
use crate::retry::RetryPolicy;

/// How to reach a registry (shared by every command that reaches one). HTTPS_PROXY,
/// HTTP_PROXY and NO_PROXY are honoured.
#[derive(Args, Debug, Clone)]
pub struct RegistryArgs {
    /// Speak plain HTTP to this registry (127.0.0.1, ::1 and localhost do unless --ca-file or
    /// --insecure asks for TLS).
    #[arg(long, conflicts_with_all = ["insecure", "ca_file"])]
    pub plain_http: bool,
    /// Speak TLS without verifying the registry's certificate.
    #[arg(long)]
    pub insecure: bool,
    /// Trust the PEM certificate(s) in FILE as well as the system's (a registry with a
    /// self-signed or private CA).
    #[arg(long, value_name = "FILE")]
    pub ca_file: Option<PathBuf>,
    /// Credentials from this docker config.json (auths, credHelpers, credsStore) instead of
    /// OCI_REGISTRY_AUTH_TOKEN and DOCKER_CONFIG.
    #[arg(long, value_name = "FILE", conflicts_with = "username")]
    pub authfile: Option<PathBuf>,
    /// User name for the registry; the password is read from stdin (--password-stdin).
    /// Without it: --authfile, OCI_REGISTRY_AUTH_TOKEN, then docker's config.json
    /// (DOCKER_CONFIG; credential helpers run from PATH), then anonymous.
    #[arg(long, value_name = "USER", requires = "password_stdin")]
    pub username: Option<String>,
    /// Read the password (or token) for --username from stdin (one line).
    #[arg(long, requires = "username")]
    pub password_stdin: bool,
    /// Attempts in a row without progress before a transfer gives up (backoff 0.5 s doubling
    /// to 8 s between them).
    #[arg(long, default_value_t = 8, value_name = "N", value_parser = clap::value_parser!(u32).range(1..))]
    pub retries: u32,
    /// A download averaging fewer bytes per second than this over --speed-time is dropped and
    /// resumed (curl's --speed-limit); a slow attempt counts against --retries even if it moved
    /// some bytes, so a stalled registry is given up on after about retries × (speed-time + 8 s).
    #[arg(long, default_value_t = SpeedLimit::default().bytes_per_sec, value_name = "BYTES")]
    pub speed_limit: u64,
    /// The window --speed-limit is averaged over, in seconds.
    #[arg(long, default_value_t = SpeedLimit::default().window.as_secs(), value_name = "SECS", value_parser = clap::value_parser!(u64).range(1..))]
    pub speed_time: u64,
    /// Blobs transferred at once.
    #[arg(long, default_value_t = 4, value_name = "N", value_parser = clap::value_parser!(u32).range(1..=32))]
    pub concurrency: u32,
    /// Upload each blob as 4 MiB PATCH requests instead of one streamed PUT (for registries or
    /// proxies that cap the size of a request body).
    #[arg(long)]
    pub chunked: bool,
    /// No progress bars.
    #[arg(long, short)]
    pub quiet: bool,
    /// Mirrors and pull-through caches from this containers-registries.conf(5) file, with the
    /// drop-ins of /etc/containers/registries.conf.d/ and ~/.config/containers/registries.conf.d/
    /// applied (as skopeo reads it); `none` for no mirrors. Default: the file
    /// $CONTAINERS_REGISTRIES_CONF names, else ~/.config/containers/registries.conf, else
    /// /etc/containers/registries.conf, each with its drop-ins.
    #[arg(long, value_name = "FILE|none")]
    pub registries_conf: Option<String>,
}

impl RegistryArgs {
    /// Resolve into library options (reads the password from stdin if asked to).
    pub fn options(&self) -> Result<RegistryOptions, RegistryError> {
        self.options_or(MirrorsFrom::Default)
    }

    /// [`RegistryArgs::options`], with the registries configuration from `fallback` unless
    /// `--registries-conf` is given (the writer's settings file).
    pub fn options_or(&self, fallback: MirrorsFrom) -> Result<RegistryOptions, RegistryError> {
        let password = if self.password_stdin {
            let mut s = String::new();
            std::io::stdin()
                .read_to_string(&mut s)
                .map_err(RegistryError::io(std::path::Path::new("<stdin>")))?;
            let line = s.lines().next().unwrap_or("").to_owned();
            if line.is_empty() {
                return Err(RegistryError::Reference(
                    "--password-stdin: stdin is empty".to_owned(),
                ));
            }
            Some(Secret::new(line))
        } else {
            None
        };
        let from = match &self.registries_conf {
            Some(s) => MirrorsFrom::parse(s),
            None => fallback,
        };
        let mirrors = from.load()?.map(std::sync::Arc::new);
        Ok(RegistryOptions {
            plain_http: self.plain_http,
            insecure: self.insecure,
            ca_file: self.ca_file.clone(),
            auth: ExplicitAuth {
                username: self.username.clone(),
                password,
                authfile: self.authfile.clone(),
            },
            retry: RetryPolicy {
                attempts: self.retries,
                ..RetryPolicy::default()
            },
            concurrency: self.concurrency as usize,
            chunked: self.chunked,
            progress: !self.quiet,
            speed: SpeedLimit {
                bytes_per_sec: self.speed_limit,
                window: std::time::Duration::from_secs(self.speed_time),
            },
            mirrors,
            ..RegistryOptions::default()
        })
    }
}
