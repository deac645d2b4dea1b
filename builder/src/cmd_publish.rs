//! `ingot publish`: CLI glue for [`ingot::registry::push`], and the registry options every
//! registry command shares.

use std::io::Read;
use std::path::PathBuf;
use std::process::ExitCode;

use anyhow::Context;
use clap::Args;
use ingot::registry::auth::ExplicitAuth;
use ingot::registry::progress::throughput;
use ingot::registry::push::publish;
use ingot::registry::{
    Registry, RegistryError, RegistryOptions, RegistryRef, RetryPolicy, Secret, SpeedLimit,
};

/// How to reach a registry (shared by publish, pull and resolve).
#[derive(Args, Debug, Clone)]
pub struct RegistryArgs {
    /// Speak plain HTTP to this registry (127.0.0.1, ::1 and localhost always do).
    #[arg(long)]
    pub plain_http: bool,
    /// User name for the registry; the password is read from stdin (--password-stdin).
    /// Without it: OCI_REGISTRY_AUTH_TOKEN, then docker's config.json (DOCKER_CONFIG), then
    /// anonymous.
    #[arg(long, value_name = "USER", requires = "password_stdin")]
    pub username: Option<String>,
    /// Read the password (or token) for --username from stdin (one line).
    #[arg(long, requires = "username")]
    pub password_stdin: bool,
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
    #[command(flatten)]
    pub transfer: TransferArgs,
}

/// How patient a transfer is: retries, and the minimum throughput of a download (curl's
/// --speed-limit/--speed-time).
#[derive(Args, Debug, Clone)]
pub struct TransferArgs {
    /// Attempts in a row without progress before a transfer gives up (backoff 0.5 s doubling
    /// to 8 s between them).
    #[arg(long, default_value_t = 8, value_name = "N", value_parser = clap::value_parser!(u32).range(1..))]
    pub retries: u32,
    /// A download averaging fewer bytes per second than this over --speed-time is dropped and
    /// resumed; a slow attempt counts against --retries even if it moved some bytes, so a
    /// stalled registry is given up on after about retries × (speed-time + 8 s).
    #[arg(long, default_value_t = SpeedLimit::default().bytes_per_sec, value_name = "BYTES")]
    pub speed_limit: u64,
    /// The window --speed-limit is averaged over, in seconds.
    #[arg(long, default_value_t = SpeedLimit::default().window.as_secs(), value_name = "SECS", value_parser = clap::value_parser!(u64).range(1..))]
    pub speed_time: u64,
}

impl TransferArgs {
    /// The retry policy.
    pub fn retry(&self) -> RetryPolicy {
        RetryPolicy {
            attempts: self.retries,
            ..RetryPolicy::default()
        }
    }

    /// The minimum throughput.
    pub fn speed(&self) -> SpeedLimit {
        SpeedLimit {
            bytes_per_sec: self.speed_limit,
            window: std::time::Duration::from_secs(self.speed_time),
        }
    }
}

impl RegistryArgs {
    /// Resolve into library options (reads the password from stdin if asked to).
    pub fn options(&self) -> anyhow::Result<RegistryOptions> {
        let password = if self.password_stdin {
            let mut s = String::new();
            std::io::stdin()
                .read_to_string(&mut s)
                .context("reading the password from stdin")?;
            let line = s.lines().next().unwrap_or("").to_owned();
            anyhow::ensure!(!line.is_empty(), "--password-stdin: stdin is empty");
            Some(Secret::new(line))
        } else {
            None
        };
        Ok(RegistryOptions {
            plain_http: self.plain_http,
            auth: ExplicitAuth {
                username: self.username.clone(),
                password,
            },
            retry: self.transfer.retry(),
            concurrency: self.concurrency as usize,
            chunked: self.chunked,
            progress: !self.quiet,
            speed: self.transfer.speed(),
            ..RegistryOptions::default()
        })
    }
}

/// Publish a stack's OCI image layout (from `ingot build`) to a registry: the blobs the registry
/// lacks are streamed up (a HEAD request first, several blobs at once, retried with backoff),
/// then the manifest, byte for byte as in the layout, so its digest does not change. Prints the
/// manifest digest on stdout.
///
/// A tag that already names this manifest is left alone ("unchanged"); a tag that names other
/// content is refused unless --allow-overwrite.
///
/// Exit codes: 0 published (or unchanged); 1 other error; 2 usage or bad reference; 4 the
/// registry stored other bytes than ours; 6 authentication failed; 8 the registry kept failing
/// (retries exhausted); 9 the tag names other content.
#[derive(Args, Debug)]
pub struct PublishArgs {
    /// The OCI image layout directory (`DIR` or `oci:DIR`).
    pub layout: String,
    /// Where to: oci://HOST[:PORT]/REPO:TAG (or …@sha256:DIGEST, the layout's manifest digest).
    pub target: String,
    /// Move the tag even if it names other content.
    #[arg(long)]
    pub allow_overwrite: bool,
    #[command(flatten)]
    pub registry: RegistryArgs,
}

/// Print a registry error and turn it into its exit code.
pub fn fail(what: &str, e: &RegistryError) -> ExitCode {
    eprintln!("ingot: {what}: {e}");
    if let RegistryError::Auth { .. } = e {
        eprintln!(
            "ingot: hint: give --username USER --password-stdin, set OCI_REGISTRY_AUTH_TOKEN, \
             or add the registry to docker's config.json (DOCKER_CONFIG)"
        );
    }
    ExitCode::from(e.exit_code())
}

pub fn run(args: PublishArgs) -> anyhow::Result<ExitCode> {
    let layout = PathBuf::from(args.layout.strip_prefix("oci:").unwrap_or(&args.layout));
    let target: RegistryRef = match args.target.parse() {
        Ok(r) => r,
        Err(e) => return Ok(fail("publish", &e)),
    };
    let options = args.registry.options()?;
    let what = format!("publish {} to {target}", layout.display());
    let result = Registry::connect(&target, options)
        .and_then(|reg| publish(&reg, &layout, &target, args.allow_overwrite));
    match result {
        Ok(report) => {
            if report.unchanged {
                eprintln!(
                    "ingot: {target} already names {}: unchanged, nothing pushed",
                    report.digest
                );
            } else {
                eprintln!(
                    "ingot: published {target}: {} blobs pushed ({}), {} already there",
                    report.pushed.len(),
                    throughput(report.bytes_pushed(), report.elapsed),
                    report.skipped.len()
                );
            }
            println!("{}", report.digest);
            Ok(ExitCode::SUCCESS)
        }
        Err(e) => Ok(fail(&what, &e)),
    }
}
