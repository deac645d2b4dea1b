//! `ingot pull` and `ingot resolve`: CLI glue for [`ingot_artifact::registry::pull`].

use std::path::PathBuf;
use std::process::ExitCode;

use clap::Args;
use ingot_artifact::registry::progress::throughput;
use ingot_artifact::registry::pull::pull;
use ingot_artifact::registry::{Registry, RegistryRef};

use super::publish::{fail, RegistryArgs};

/// Pull a stack from a registry into an OCI image layout directory: the same blobs, the
/// manifest's exact bytes, and an index.json naming it by the tag. Every blob is downloaded into
/// a temporary file, resumed with HTTP Range requests after a failure, and kept only if its
/// size and SHA-256 match; pulling into an interrupted pull's directory keeps the good blobs.
/// Prints the manifest digest on stdout. Does not check the signature: run `ingot verify`.
///
/// Exit codes: 0 pulled; 1 other error; 2 usage or bad reference; 4 a blob or the manifest does
/// not match its digest (nothing bad is kept); 6 authentication failed; 7 not found; 8 the
/// registry kept failing (retries exhausted).
#[derive(Args, Debug)]
pub struct PullArgs {
    /// What: oci://HOST[:PORT]/REPO:TAG or oci://HOST[:PORT]/REPO@sha256:DIGEST.
    pub source: String,
    /// The OCI image layout directory to write (new, empty, or an interrupted pull's).
    pub out: PathBuf,
    /// Print the result as one JSON object (camelCase keys) instead of the digest.
    #[arg(long)]
    pub json: bool,
    #[command(flatten)]
    pub registry: RegistryArgs,
}

pub fn run(args: PullArgs) -> anyhow::Result<ExitCode> {
    let source: RegistryRef = match args.source.parse() {
        Ok(r) => r,
        Err(e) => return Ok(fail("pull", &e)),
    };
    let options = args.registry.options()?;
    let what = format!("pull {source}");
    match Registry::connect(&source, options).and_then(|reg| pull(&reg, &source, &args.out)) {
        Ok(report) => {
            eprintln!(
                "ingot: pulled {source} into {}: {} blobs fetched ({}), {} already there",
                args.out.display(),
                report.fetched.len(),
                throughput(report.bytes_fetched(), report.elapsed),
                report.reused.len()
            );
            for s in &report.sources {
                eprintln!(
                    "ingot: served by {} {}: {} bytes, {} blobs",
                    if s.mirror { "mirror" } else { "origin" },
                    s.location,
                    s.bytes,
                    s.blobs
                );
            }
            if args.json {
                let v = serde_json::json!({
                    "reference": source.to_string(),
                    "digest": report.digest,
                    "layout": args.out,
                    "blobsFetched": report.fetched.len(),
                    "bytesFetched": report.bytes_fetched(),
                    "blobsReused": report.reused.len(),
                    "sources": report.sources,
                });
                println!("{}", serde_json::to_string_pretty(&v)?);
            } else {
                println!("{}", report.digest);
            }
            Ok(ExitCode::SUCCESS)
        }
        Err(e) => Ok(fail(&what, &e)),
    }
}

/// Print the manifest digest a registry reference names (the manifest is fetched, at most
/// 4 MiB, and hashed), through the mirrors the registries configuration gives (`--json` says
/// which source answered).
///
/// Exit codes: 0 found; 2 bad reference; 6 authentication failed; 7 no such tag or manifest;
/// 8 the registry kept failing.
#[derive(Args, Debug)]
pub struct ResolveArgs {
    /// oci://HOST[:PORT]/REPO:TAG (or …@sha256:DIGEST, checked to exist).
    pub reference: String,
    /// Print `{"reference": …, "digest": …, "source": {"location": …, "mirror": …}}` instead
    /// of the digest: `source` is where the manifest came from (a mirror or the origin).
    #[arg(long)]
    pub json: bool,
    #[command(flatten)]
    pub registry: RegistryArgs,
}

pub fn run_resolve(args: ResolveArgs) -> anyhow::Result<ExitCode> {
    let reference: RegistryRef = match args.reference.parse() {
        Ok(r) => r,
        Err(e) => return Ok(fail("resolve", &e)),
    };
    if reference.tag.is_none() && reference.digest.is_none() {
        eprintln!("ingot: resolve {reference}: give a tag or a digest");
        return Ok(ExitCode::from(2));
    }
    let options = args.registry.options()?;
    let result = Registry::connect(&reference, options).and_then(|reg| {
        // A digest is checked to exist by fetching the manifest.
        let digest = match &reference.digest {
            Some(_) => reg.fetch_manifest(&reference).map(|(_, d)| d),
            None => reg.resolve(&reference),
        }?;
        // The one source that sent the manifest (the others failed or lacked it).
        let source = reg.served().into_iter().find(|s| s.bytes > 0);
        Ok((digest, source))
    });
    match result {
        Ok((d, source)) if args.json => {
            let source =
                source.map(|s| serde_json::json!({"location": s.location, "mirror": s.mirror}));
            let v = serde_json::json!({"reference": reference.to_string(), "digest": d, "source": source});
            println!("{}", serde_json::to_string_pretty(&v)?);
            Ok(ExitCode::SUCCESS)
        }
        Ok((d, _)) => {
            println!("{d}");
            Ok(ExitCode::SUCCESS)
        }
        Err(e) => Ok(fail(&format!("resolve {reference}"), &e)),
    }
}
