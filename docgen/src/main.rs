//! `ingot-docgen --out DIR`: writes the man pages (`DIR/man1`) and shell completions
//! (`DIR/completions`) of `ingot` and `ingot-writer`. See README, "Man pages and completions".

use std::path::PathBuf;
use std::process::ExitCode;

use clap::Parser;

/// Generate the man pages and shell completions (bash, zsh, fish) of ingot and ingot-writer
/// from their command-line definitions.
#[derive(Parser, Debug)]
#[command(name = "ingot-docgen", version = ingot::cli::VERSION)]
struct Args {
    /// Directory to write `man1/` and `completions/` into (created if missing).
    #[arg(long, value_name = "DIR")]
    out: PathBuf,
}

fn main() -> ExitCode {
    let args = Args::parse();
    match ingot_docgen::generate(&args.out) {
        Ok(files) => {
            for f in files {
                println!("{}", args.out.join(f).display());
            }
            ExitCode::SUCCESS
        }
        Err(e) => {
            eprintln!("ingot-docgen: error: {e:#}");
            ExitCode::from(1)
        }
    }
}
