//! `ingot inspect`: CLI glue for [`crate::inspect`].

use std::process::ExitCode;

use crate::display::{Safe, SafeText};
use crate::inspect::{inspect, render_table};
use clap::Args;
use ingot_artifact::verify::{open_with, StackRef};
use ingot_layers::select::{GpuVendor, Machine, Role};

/// Show a stack artifact's layers (name, kind, selection rule, size, compressed size, verity
/// root hash) and, given a machine (--role, and --gpu/--virt/--uefi), which layers it gets.
///
/// Reads only the manifest and the descriptor; the signature is reported, not enforced
/// (use `ingot verify` for that).
#[derive(Args, Debug)]
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
    /// The machine's role: show which layers it gets.
    #[arg(long, value_parser = parse_role)]
    pub role: Option<Role>,
    /// A GPU vendor the machine has (repeatable).
    #[arg(long, value_parser = parse_gpu, requires = "role")]
    pub gpu: Vec<GpuVendor>,
    /// The machine has hardware virtualization.
    #[arg(long, requires = "role")]
    pub virt: bool,
    /// The machine boots with UEFI firmware.
    #[arg(long, requires = "role")]
    pub uefi: bool,
    #[command(flatten)]
    pub registry: crate::cli::publish::RegistryArgs,
}

fn parse_role(s: &str) -> Result<Role, String> {
    s.parse()
        .map_err(|e: ingot_layers::select::RuleError| e.to_string())
}

fn parse_gpu(s: &str) -> Result<GpuVendor, String> {
    s.parse()
        .map_err(|e: ingot_layers::select::RuleError| e.to_string())
}

pub fn run(args: InspectArgs) -> anyhow::Result<ExitCode> {
    let stack: StackRef = args.stack.parse().map_err(anyhow::Error::msg)?;
    let key = args
        .trust_key
        .as_deref()
        .map(ingot_artifact::trust_key::from_arg)
        .transpose()?;
    let machine = args.role.map(|role| Machine {
        role,
        gpus: args.gpu.clone(),
        virt: args.virt,
        uefi: args.uefi,
    });
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
