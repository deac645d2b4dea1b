//! `ingot publish`: CLI glue for [`ingot_artifact::registry::push`], and the registry options every
//! registry command shares.

use std::process::ExitCode;

use clap::Args;
use ingot_artifact::cosign::attach::attach;
use ingot_artifact::cosign::SigningKey;
use ingot_artifact::registry::progress::throughput;
use ingot_artifact::registry::push::publish_tagged;
use ingot_artifact::registry::{Registry, RegistryError, RegistryRef};
use ingot_artifact::verify::StackRef;

/// The registry options, one struct for every command that reaches a registry (the writer's too).
pub use ingot_artifact::registry::args::RegistryArgs;

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
    /// The OCI image layout directory: `DIR`, `oci:DIR`, or `oci:DIR:TAG` (the manifest its
    /// index.json tags TAG, as skopeo spells it).
    pub layout: String,
    /// Where to: oci://HOST[:PORT]/REPO:TAG (or …@sha256:DIGEST, the layout's manifest digest).
    pub target: String,
    /// Move the tag even if it names other content.
    #[arg(long)]
    pub allow_overwrite: bool,
    /// Print the result as one JSON object (camelCase keys) instead of the digest.
    #[arg(long)]
    pub json: bool,
    /// After the manifest, push a cosign signature of its digest made with this cosign private
    /// key (`cosign.key`, from `ingot key generate --cosign` or `cosign generate-key-pair`) under
    /// the tag `sha256-<HEX>.sig` of the same repository, appended to the signatures there
    /// (what `cosign verify --key`, a `policy.json` `sigstoreSigned` requirement and `ingot
    /// verify --trust-key cosign.pub` check). The password is COSIGN_PASSWORD's, or see
    /// --cosign-password-file. With --json the result gains `cosignSignature` (`tag`, `digest`
    /// of the signature manifest, `unchanged`).
    #[arg(long, value_name = "KEY")]
    pub cosign_key: Option<std::path::PathBuf>,
    /// Read the cosign key's password from this file (its first line) instead of COSIGN_PASSWORD.
    #[arg(long, value_name = "FILE", requires = "cosign_key")]
    pub cosign_password_file: Option<std::path::PathBuf>,
    #[command(flatten)]
    pub registry: RegistryArgs,
}

/// Reads and decrypts a cosign private key, before anything is pushed.
fn read_cosign_key(
    path: &std::path::Path,
    password_file: Option<&std::path::Path>,
) -> anyhow::Result<SigningKey> {
    use anyhow::Context;
    let password = super::key::cosign_password(password_file, "--cosign-password-file")?;
    use ingot_artifact::cosign::private_key::MAX_KEY_FILE_SIZE;
    use ingot_verity::input::{read_text_bounded, Symlinks};
    let text = read_text_bounded(path, MAX_KEY_FILE_SIZE as u64, Symlinks::Follow)
        .with_context(|| format!("reading the cosign key {}", path.display()))?;
    Ok(SigningKey::from_encrypted_pem(
        &text,
        &password,
        &path.display().to_string(),
    )?)
}

/// Print a registry error and turn it into its exit code.
pub fn fail(what: &str, e: &RegistryError) -> ExitCode {
    eprintln!("ingot: {what}: {}", e.full_text());
    if let RegistryError::Auth { .. } = e {
        eprintln!(
            "ingot: hint: give --username USER --password-stdin or --authfile FILE, set \
             OCI_REGISTRY_AUTH_TOKEN, or add the registry to docker's config.json (DOCKER_CONFIG)"
        );
    }
    ExitCode::from(e.exit_code())
}

pub fn run(args: PublishArgs) -> anyhow::Result<ExitCode> {
    let (layout, tag) = match args.layout.parse::<StackRef>() {
        Ok(StackRef::Layout(dir, tag)) => (dir, tag),
        Ok(StackRef::Registry(_)) => {
            eprintln!(
                "ingot: publish: {} is a registry reference: give the layout to publish \
                 (DIR, oci:DIR or oci:DIR:TAG)",
                args.layout
            );
            return Ok(ExitCode::from(2));
        }
        Err(e) => {
            eprintln!("ingot: publish: {e}");
            return Ok(ExitCode::from(2));
        }
    };
    let target: RegistryRef = match args.target.parse() {
        Ok(r) => r,
        Err(e) => return Ok(fail("publish", &e)),
    };
    let cosign_key = args
        .cosign_key
        .as_deref()
        .map(|k| read_cosign_key(k, args.cosign_password_file.as_deref()))
        .transpose()?;
    let options = args.registry.options()?;
    let what = format!("publish {} to {target}", layout.display());
    let result = Registry::connect(&target, options).and_then(|reg| {
        let report = publish_tagged(&reg, &layout, tag.as_deref(), &target, args.allow_overwrite)?;
        // The manifest is up: a signature that cannot be pushed now must say so, not read as
        // if nothing was published.
        let signed = cosign_key
            .as_ref()
            .map(|key| attach(&reg, &target, &report.digest, key))
            .transpose()
            .inspect_err(|_| {
                eprintln!(
                    "ingot: {target} now names {}, but its cosign signature was not pushed \
                     (below); run the same publish again: nothing else is pushed, the signature \
                     is added",
                    report.digest
                )
            })?;
        Ok((report, signed))
    });
    match result {
        Ok((report, signed)) => {
            if let Some(s) = &signed {
                eprintln!(
                    "ingot: cosign signature {} {} ({} signature(s) under the tag)",
                    s.tag,
                    if s.unchanged {
                        "already there"
                    } else {
                        "pushed"
                    },
                    s.signatures
                );
            }
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
            if args.json {
                let mut v = serde_json::json!({
                    "reference": target.to_string(),
                    "digest": report.digest,
                    "unchanged": report.unchanged,
                    "blobsPushed": report.pushed.len(),
                    "bytesPushed": report.bytes_pushed(),
                    "blobsSkipped": report.skipped.len(),
                });
                if let Some(s) = &signed {
                    v["cosignSignature"] = serde_json::json!({
                        "tag": s.tag,
                        "digest": s.manifest_digest,
                        "unchanged": s.unchanged,
                    });
                }
                println!("{}", serde_json::to_string_pretty(&v)?);
            } else {
                println!("{}", report.digest);
            }
            Ok(ExitCode::SUCCESS)
        }
        Err(e) => Ok(fail(&what, &e)),
    }
}
