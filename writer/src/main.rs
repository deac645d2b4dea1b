//! `ingot-writer`: write a signed ingot stack to a disk, every block read back and verified.
//! Parses the command line ([`ingot_writer::cli`]) and runs it ([`ingot_writer::run`]).

use std::process::ExitCode;

use clap::Parser;
use ingot_writer::cli::Cli;

fn main() -> ExitCode {
    let cli = Cli::parse();
    let level = match cli.verbose {
        0 => "warn",
        1 => "info",
        _ => "debug",
    };
    let filter = tracing_subscriber::EnvFilter::try_from_default_env()
        .unwrap_or_else(|_| tracing_subscriber::EnvFilter::new(level));
    tracing_subscriber::fmt()
        .with_env_filter(filter)
        .with_writer(std::io::stderr)
        .init();
    match ingot_writer::run::run(cli) {
        Ok(code) => code,
        Err(e) => {
            eprintln!("ingot-writer: error: {e:#}");
            ExitCode::from(2)
        }
    }
}
