//! `ingot verify`: CLI glue for [`ingot_artifact::verify`].

use std::path::PathBuf;
use std::process::ExitCode;

use clap::Args;

use crate::display::{Safe, SafeText};
use ingot_artifact::verify::{open_with, verify, SignatureStatus, StackRef, Trust, VerifyReport};

/// Check a stack artifact end to end: the signature first (minisign's over the stack
/// descriptor, or with a cosign key cosign's over the manifest digest; nothing is trusted
/// before it), then every blob's digest and size, then every layer:
/// decompress it, recompute its dm-verity tree and root hash, compare with the signed
/// descriptor. The first thing wrong is named.
///
/// Exit codes: 0 verified; 1 I/O error or not an ingot artifact; 2 usage; 3 signature missing,
/// from another key or not matching; 4 a blob's digest or size is wrong, or the manifest
/// disagrees with the signed descriptor; 5 a layer's content or verity tree does not match its
/// signed root hash.
#[derive(Args, Debug)]
#[command(after_help = "\
Checks the signature first (minisign's over the stack descriptor, or cosign's over the manifest \
digest under its sha256-HEX.sig tag when --trust-key is a cosign.pub; nothing is trusted before it), \
then every blob's digest and size, then every layer: decompress, recompute the dm-verity tree \
and root hash, compare with the signed descriptor. The first thing wrong is named.

Exit codes:
  0  verified
  1  I/O error, not an ingot stack, malformed descriptor
  2  usage
  3  signature missing, from another key, or not matching the descriptor
  4  a blob's digest or size is wrong, or the manifest disagrees with the descriptor
  5  a layer's content or verity tree does not match its signed root hash")]
pub struct VerifyArgs {
    /// The artifact: an OCI image layout directory (`DIR` or `oci:DIR`), or a registry
    /// reference `oci://HOST[:PORT]/REPO:TAG` (or `…@sha256:DIGEST`; credentials from
    /// OCI_REGISTRY_AUTH_TOKEN or docker's config.json).
    pub stack: String,
    /// The public key to trust (a file, or the key itself): a minisign `.pub` checks the
    /// signature over the descriptor; a cosign PEM key (`cosign.pub`) checks the cosign
    /// signature of the manifest digest under the `sha256-<HEX>.sig` tag instead, and the
    /// descriptor is trusted through that digest.
    #[arg(long, value_name = "PUB")]
    pub trust_key: Option<String>,
    /// Accept an unsigned artifact, or one whose signature does not verify (reported, not
    /// fatal). Digests and verity trees are still checked.
    #[arg(long)]
    pub allow_unsigned: bool,
    /// Directory for the decompressed layer being checked (default: the system temp dir).
    #[arg(long, value_name = "DIR")]
    pub work_dir: Option<PathBuf>,
    /// Print the result as one JSON object (camelCase keys) on stdout, a failure too
    /// (`"verified": false`, the error, its exit code); the exit code is the same.
    #[arg(long)]
    pub json: bool,
    #[command(flatten)]
    pub registry: crate::cli::publish::RegistryArgs,
}

pub fn run(args: VerifyArgs) -> anyhow::Result<ExitCode> {
    let stack: StackRef = args.stack.parse().map_err(anyhow::Error::msg)?;
    let key = args
        .trust_key
        .as_deref()
        .map(ingot_artifact::trust_key::from_arg)
        .transpose()?;
    if key.is_none() && !args.allow_unsigned {
        eprintln!("ingot: error: give --trust-key PUB (or --allow-unsigned to skip the signature)");
        return Ok(ExitCode::from(2));
    }
    let trust = Trust {
        key,
        allow_unsigned: args.allow_unsigned,
    };
    let work = args.work_dir.clone().unwrap_or_else(std::env::temp_dir);
    let options = args.registry.options()?;
    let result =
        open_with(&stack, options).and_then(|source| verify(source.as_ref(), &trust, &work));
    match result {
        Ok(report) if args.json => {
            println!("{}", serde_json::to_string_pretty(&report_json(&report))?);
            Ok(ExitCode::SUCCESS)
        }
        Ok(report) => {
            print_text(&report);
            Ok(ExitCode::SUCCESS)
        }
        Err(e) => {
            let (stack, text) = (Safe(&args.stack), e.full_text());
            eprintln!("ingot: verify {stack}: {}", SafeText(&text));
            if e.is_signature() && !args.allow_unsigned {
                eprintln!("ingot: hint: --allow-unsigned checks everything but the signature");
            }
            if args.json {
                let v = serde_json::json!({
                    "stack": args.stack,
                    "verified": false,
                    "error": e.full_text(),
                    "exitCode": e.exit_code(),
                });
                println!("{}", serde_json::to_string_pretty(&v)?);
            }
            Ok(ExitCode::from(e.exit_code()))
        }
    }
}

/// `--json`: what was checked, and how the signature fared.
fn report_json(report: &VerifyReport) -> serde_json::Value {
    let (status, key_id, comment, error) = match &report.signature {
        SignatureStatus::Verified {
            key_id,
            trusted_comment,
        } => (
            "verified",
            Some(key_id.to_string()),
            Some(trusted_comment),
            None,
        ),
        SignatureStatus::Unsigned => ("unsigned", None, None, None),
        SignatureStatus::NotChecked => ("notChecked", None, None, None),
        SignatureStatus::Failed(m) => ("failed", None, None, Some(m)),
    };
    let layers: Vec<_> = report
        .descriptor
        .layers
        .iter()
        .map(|l| serde_json::json!({"name": l.name, "rootHash": l.verity.root_hash}))
        .collect();
    serde_json::json!({
        "verified": true,
        "name": report.descriptor.name,
        "version": report.descriptor.version,
        "manifestDigest": report.manifest_digest,
        "descriptorDigest": report.descriptor_digest,
        "signature": {
            "status": status,
            "keyId": key_id,
            "trustedComment": comment,
            "error": error,
        },
        "layers": layers,
    })
}

/// The text form. Every string from the artifact goes through [`Safe`].
fn print_text(report: &VerifyReport) {
    match &report.signature {
        SignatureStatus::Verified {
            key_id,
            trusted_comment,
        } => {
            println!("signature  ok: key {key_id} ({})", Safe(trusted_comment));
        }
        SignatureStatus::Unsigned => {
            println!("signature  NONE (accepted: --allow-unsigned)");
        }
        SignatureStatus::NotChecked => {
            println!("signature  present, not checked (no --trust-key)");
        }
        SignatureStatus::Failed(m) => {
            println!(
                "signature  FAILED: {} (accepted: --allow-unsigned)",
                Safe(m)
            );
        }
    }
    let d = &report.descriptor;
    println!("manifest   {}", Safe(&report.manifest_digest));
    println!("descriptor {}", Safe(&report.descriptor_digest));
    for l in &d.layers {
        let (name, root) = (Safe(&l.name), &l.verity.root_hash);
        println!("layer      {name:<16} ok  root hash {root}");
    }
    let (name, version) = (Safe(&d.name), Safe(&d.version));
    println!("verified {name} {version}: {} layers", d.layers.len());
}
