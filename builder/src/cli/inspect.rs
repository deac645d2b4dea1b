//! `ingot inspect`: CLI glue for [`crate::inspect`].

use std::process::ExitCode;

use crate::display::{Safe, SafeText};
use crate::inspect::{inspect, render_table};
use clap::Args;
use ingot_artifact::verify::{open_with, StackRef};
use ingot_layers::machine_args::MachineArgs;

/// Show a stack artifact's layers (name, kind, selection rule, size, compressed size, verity
/// root hash) and, given a machine (--role, and --gpu/--virt/--uefi), which layers it gets.
///
/// Reads only the manifest and the descriptor; the signature is reported, not enforced
/// (use `ingot verify` for that).
#[derive(Args, Debug)]
#[command(
    mut_arg("role", |a| a.help("The machine's role: show which layers it gets")),
    mut_arg("gpu", |a| a.requires("role").help("A GPU vendor the machine has (repeatable)")),
    mut_arg("virt", |a| a.requires("role")),
    mut_arg("uefi", |a| a.requires("role"))
)]
pub struct InspectArgs {
    /// The artifact: an OCI image layout directory (`DIR` or `oci:DIR`), or a registry
    /// reference `oci://HOST[:PORT]/REPO:TAG` (or `…@sha256:DIGEST`).
    pub stack: String,
    /// Print JSON instead of a table.
    #[arg(long)]
    pub json: bool,
    /// Also list each layer's Debian packages (name, version, architecture), read from the
    /// SBOM blobs the descriptor pins (`packages` in the JSON).
    #[arg(long)]
    pub packages: bool,
    /// Check the signature with this public key (file or text): a minisign key checks the
    /// signature over the descriptor, a cosign PEM key (`cosign.pub`) the cosign signature of
    /// the manifest under its `sha256-<HEX>.sig` tag.
    #[arg(long, value_name = "PUB")]
    pub trust_key: Option<String>,
    // The machine whose layers to show: --role, and --gpu/--virt/--uefi with it.
    #[command(flatten)]
    pub machine: MachineArgs,
    #[command(flatten)]
    pub registry: crate::cli::publish::RegistryArgs,
}

pub fn run(args: InspectArgs) -> anyhow::Result<ExitCode> {
    let stack: StackRef = args.stack.parse().map_err(anyhow::Error::msg)?;
    let key = args
        .trust_key
        .as_deref()
        .map(ingot_artifact::trust_key::from_arg)
        .transpose()?;
    let machine = args.machine.given();
    let options = args.registry.options()?;
    let opened = open_with(&stack, options);
    let report =
        match opened.and_then(|s| inspect(s.as_ref(), key, machine.as_ref(), args.packages)) {
            Ok(r) => r,
            Err(e) => {
                let (stack, text) = (Safe(&args.stack), e.full_text());
                eprintln!("ingot: inspect {stack}: {}", SafeText(&text));
                return Ok(ExitCode::from(e.exit_code()));
            }
        };
    if args.json {
        println!("{}", serde_json::to_string_pretty(&report)?);
    } else {
        print!("{}", render_table(&report));
    }
    Ok(ExitCode::SUCCESS)
}
