//! `ingot`: the release pipeline's and the developer's command.
//!
//! Binaries glue: every subcommand parses its arguments here and calls a library
//! (`ingot-verity`, `ingot-layers`) to do the work.

use std::process::ExitCode;

use clap::{Parser, Subcommand};

mod cmd_build;
mod cmd_inspect;
mod cmd_key;
mod cmd_layer;
mod cmd_publish;
mod cmd_pull;
mod cmd_verify;
mod cmd_verity;

/// Build, seal, verify and inspect Kubernetes node-image stacks.
#[derive(Parser, Debug)]
#[command(name = "ingot", version, about, long_about = None)]
struct Cli {
    /// Log verbosity (-v info, -vv debug, -vvv trace). RUST_LOG overrides it.
    #[arg(short, long, action = clap::ArgAction::Count, global = true)]
    verbose: u8,

    #[command(subcommand)]
    command: Command,
}

#[derive(Subcommand, Debug)]
enum Command {
    /// dm-verity tools with veritysetup's option names: format, verify, dump.
    #[command(subcommand)]
    Verity(cmd_verity::VerityCommand),
    /// Layer images: build a deterministic read-only ext4 image (and its dm-verity tree).
    #[command(subcommand)]
    Layer(cmd_layer::LayerCommand),
    /// Build a stack release from a manifest into a signed OCI image layout.
    Build(cmd_build::BuildArgs),
    /// Check a stack artifact: signature, every digest, every verity tree.
    Verify(cmd_verify::VerifyArgs),
    /// Show a stack's layers, and which layers a machine gets.
    Inspect(cmd_inspect::InspectArgs),
    /// Signing keys (minisign format).
    #[command(subcommand)]
    Key(cmd_key::KeyCommand),
    /// Publish a stack's OCI image layout to a registry (oci://HOST[:PORT]/REPO:TAG).
    Publish(cmd_publish::PublishArgs),
    /// Pull a stack from a registry into an OCI image layout directory.
    Pull(cmd_pull::PullArgs),
    /// Print the manifest digest a registry reference names.
    Resolve(cmd_pull::ResolveArgs),
}

fn main() -> ExitCode {
    let cli = Cli::parse();
    init_logging(cli.verbose);
    let result = match cli.command {
        Command::Verity(cmd) => cmd_verity::run(cmd),
        Command::Layer(cmd) => cmd_layer::run(cmd),
        Command::Build(args) => cmd_build::run(args),
        Command::Verify(args) => cmd_verify::run(args),
        Command::Inspect(args) => cmd_inspect::run(args),
        Command::Key(cmd) => cmd_key::run(cmd),
        Command::Publish(args) => cmd_publish::run(args),
        Command::Pull(args) => cmd_pull::run(args),
        Command::Resolve(args) => cmd_pull::run_resolve(args),
    };
    match result {
        Ok(code) => code,
        Err(err) => {
            eprintln!("ingot: error: {err:#}");
            ExitCode::from(1)
        }
    }
}

fn init_logging(verbose: u8) {
    use tracing_subscriber::EnvFilter;
    let default = match verbose {
        0 => "warn",
        1 => "info",
        2 => "debug",
        _ => "trace",
    };
    let filter = EnvFilter::try_from_default_env().unwrap_or_else(|_| EnvFilter::new(default));
    tracing_subscriber::fmt()
        .with_env_filter(filter)
        .with_writer(std::io::stderr)
        .init();
}
