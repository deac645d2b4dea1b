//! `ingot`'s command line: the release pipeline's and the developer's command. A library
//! module, so the CLI reference and man pages can be generated from [`Cli`].
//!
//! Glue only: every subcommand's module parses its arguments and calls a library
//! (`ingot-verity`, `ingot-layers`, `ingot-artifact`, this crate) to do the work.

use std::process::ExitCode;

use clap::{Parser, Subcommand};

mod build;
mod diff;
mod exit_status;
mod inspect;
mod key;
mod layer;
mod publish;
mod pull;
mod verify;
mod verity;
mod vm;

/// What `--version` prints after the program name (`ingot-docgen` prints it too).
pub const VERSION: &str = ingot_artifact::version::VERSION;

/// Build, seal, verify and inspect Kubernetes node-image stacks.
#[derive(Parser, Debug)]
#[command(name = "ingot", version = VERSION, about, long_about = None)]
pub struct Cli {
    /// Log verbosity (-v info, -vv debug, -vvv trace). RUST_LOG overrides it.
    #[arg(short, long, action = clap::ArgAction::Count, global = true)]
    pub verbose: u8,

    #[command(subcommand)]
    pub command: Command,
}

#[derive(Subcommand, Debug)]
pub enum Command {
    /// dm-verity tools with veritysetup's option names: format, verify, dump.
    #[command(subcommand)]
    Verity(verity::VerityCommand),
    /// Layer images: build a deterministic read-only ext4 image (and its dm-verity tree).
    #[command(subcommand)]
    Layer(layer::LayerCommand),
    /// Build a stack release from a manifest into a signed OCI image layout.
    #[command(after_help = exit_status::PLAIN)]
    Build(build::BuildArgs),
    /// Check a stack artifact: signature, every digest, every verity tree.
    #[command(after_help = exit_status::VERIFY)]
    Verify(verify::VerifyArgs),
    /// Show a stack's layers, and which layers a machine gets.
    #[command(after_help = exit_status::INSPECT)]
    Inspect(inspect::InspectArgs),
    /// Signing keys (minisign format).
    #[command(subcommand)]
    Key(key::KeyCommand),
    /// Publish a stack's OCI image layout to a registry (oci://HOST[:PORT]/REPO:TAG).
    #[command(after_help = exit_status::REGISTRY)]
    Publish(publish::PublishArgs),
    /// Pull a stack from a registry into an OCI image layout directory.
    #[command(after_help = exit_status::REGISTRY)]
    Pull(pull::PullArgs),
    /// Print the manifest digest a registry reference names.
    #[command(after_help = exit_status::REGISTRY)]
    Resolve(pull::ResolveArgs),
    /// Compare two stacks: which layers changed, and which files in them.
    #[command(after_help = exit_status::DIFF)]
    Diff(diff::DiffArgs),
    /// Boot a stack under QEMU: written onto disk images by the real writer, then booted.
    ///
    /// The writer (`ingot-writer`, beside `ingot` or on PATH) runs as CAPH runs it (detect,
    /// gate, guard, stage, seal, write, verify) against a fixture machine in STATE/machine whose
    /// disks are the VM's sparse images; QEMU then boots them as SCSI disks with the same WWNs,
    /// the serial console on this terminal (Ctrl-A X ends the VM). See docs/vm.md.
    #[command(after_help = exit_status::VM)]
    Vm(Box<vm::VmArgs>),
}

/// Runs a parsed command line; the exit status says how it went.
pub fn run(cli: Cli) -> ExitCode {
    // `build --json` writes its progress on stderr as JSON Lines: its logs and its error too.
    let events = matches!(&cli.command, Command::Build(a) if a.json);
    init_logging(cli.verbose, events);
    let result = match cli.command {
        Command::Verity(cmd) => verity::run(cmd),
        Command::Layer(cmd) => layer::run(cmd),
        Command::Build(args) => build::run(args),
        Command::Verify(args) => verify::run(args),
        Command::Inspect(args) => inspect::run(args),
        Command::Key(cmd) => key::run(cmd),
        Command::Publish(args) => publish::run(args),
        Command::Pull(args) => pull::run(args),
        Command::Resolve(args) => pull::run_resolve(args),
        Command::Diff(args) => diff::run(args),
        Command::Vm(args) => vm::run(*args),
    };
    match result {
        Ok(code) => code,
        Err(err) if events => {
            crate::events::Events::json().emit(
                "error",
                serde_json::json!({ "message": format!("{err:#}") }),
            );
            ExitCode::from(1)
        }
        Err(err) => {
            // Error text may quote a layout's or a registry's strings.
            eprintln!(
                "ingot: error: {}",
                crate::display::SafeText(&format!("{err:#}"))
            );
            ExitCode::from(1)
        }
    }
}

fn init_logging(verbose: u8, json: bool) {
    use tracing_subscriber::EnvFilter;
    let default = match verbose {
        0 => "warn",
        1 => "info",
        2 => "debug",
        _ => "trace",
    };
    let filter = EnvFilter::try_from_default_env().unwrap_or_else(|_| EnvFilter::new(default));
    let fmt = tracing_subscriber::fmt()
        .with_env_filter(filter)
        .with_writer(std::io::stderr);
    if json {
        fmt.json().init();
    } else {
        fmt.init();
    }
}
