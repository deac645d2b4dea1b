//! `ingot`: the release pipeline's and the developer's command. Parses the command line
//! ([`ingot::cli::Cli`]) and runs it.

use std::process::ExitCode;

use clap::Parser;
use ingot::cli::Cli;

fn main() -> ExitCode {
    ingot::cli::run(Cli::parse())
}
