//! `ingot diff`: CLI glue for [`crate::diff`].

use std::process::ExitCode;

use crate::cli::publish::RegistryArgs;
use crate::diff::{diff, render};
use crate::display::{Safe, SafeText};
use clap::Args;
use ingot_artifact::verify::{open_with, StackRef, Trust};

/// Compare two stacks: per layer whether it changed (its verity root hash), its sizes and root
/// hashes, and for a changed layer the files added, removed and changed (path, kind, size, mode,
/// owner, content or symlink target), read through the reader that checks every block against
/// the layer's hash tree.
///
/// The signatures are checked when --trust-key is given; without it they are not.
#[derive(Args, Debug)]
#[command(after_help = "\
Exit codes (as diff(1)):
  0  no layer differs
  1  a layer differs
  2  usage, I/O error, not an ingot stack, registry error
  3  signature missing or not matching (--trust-key)
  4  a blob's digest or size is wrong
  5  a layer's content does not match its signed hash tree")]
pub struct DiffArgs {
    /// The first stack: an OCI image layout (`DIR`, `oci:DIR`, `oci:DIR:TAG`) or a registry
    /// reference `oci://HOST[:PORT]/REPO:TAG` (or `…@sha256:DIGEST`).
    pub a: String,
    /// The second stack, in the same forms.
    pub b: String,
    /// Print JSON instead of text.
    #[arg(long)]
    pub json: bool,
    /// Check both stacks' signatures with this public key (file or text): minisign, or a
    /// cosign PEM key (`cosign.pub`: the cosign signature under `sha256-<HEX>.sig`).
    #[arg(long, value_name = "PUB")]
    pub trust_key: Option<String>,
    #[command(flatten)]
    pub registry: RegistryArgs,
}

pub fn run(args: DiffArgs) -> anyhow::Result<ExitCode> {
    let key = args
        .trust_key
        .as_deref()
        .map(ingot_artifact::trust_key::from_arg)
        .transpose()?;
    let trust = Trust {
        allow_unsigned: key.is_none(),
        key,
    };
    let parse = |s: &str| s.parse::<StackRef>().map_err(anyhow::Error::msg);
    let (ra, rb) = (parse(&args.a)?, parse(&args.b)?);
    let options = args.registry.options()?;
    let result = open_with(&ra, options.clone()).and_then(|sa| {
        let sb = open_with(&rb, options)?;
        diff((&args.a, sa.as_ref()), (&args.b, sb.as_ref()), &trust)
    });
    let d = match result {
        Ok(d) => d,
        Err(e) => {
            let (a, b, text) = (Safe(&args.a), Safe(&args.b), e.full_text());
            eprintln!("ingot: diff {a} {b}: {}", SafeText(&text));
            return Ok(ExitCode::from(e.exit_code().max(2)));
        }
    };
    if args.json {
        println!("{}", serde_json::to_string_pretty(&d)?);
    } else {
        print!("{}", render(&d));
    }
    Ok(ExitCode::from(u8::from(d.changed)))
}
