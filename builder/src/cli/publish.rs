//! `ingot publish`: CLI glue for [`crate::registry::push`], and the registry options every
//! registry command shares.

use std::io::Read;
use std::path::PathBuf;
use std::process::ExitCode;

use crate::registry::auth::ExplicitAuth;
use crate::registry::progress::throughput;
use crate::registry::push::publish;
use crate::registry::{Registry, RegistryError, RegistryOptions, RegistryRef, RetryPolicy, Secret};
use anyhow::Context;
use clap::Args;

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
            "ingot: hint: give --username USER --password-stdin or --authfile FILE, set \
             OCI_REGISTRY_AUTH_TOKEN, or add the registry to docker's config.json (DOCKER_CONFIG)"
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
