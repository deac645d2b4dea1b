//! Man pages and shell completions for `ingot` (one page per subcommand, `ingot-build.1`) and
//! `ingot-writer`, generated from the same clap definitions the binaries parse with, so they
//! cannot drift from `--help`; and the operator's tables of the docs ([`tables`]), rendered from
//! the writer's code.

pub mod tables;

use std::fs;
use std::path::Path;

use anyhow::{Context, Result};
use clap::CommandFactory;
use clap_complete::Shell;

/// The commands documented: `ingot` and `ingot-writer`.
pub fn commands() -> Vec<clap::Command> {
    vec![
        ingot::cli::Cli::command(),
        ingot_writer::cli::Cli::command(),
    ]
}

/// Writes `OUT/man1/*.1` and `OUT/completions/{NAME.bash, _NAME, NAME.fish}`; returns the files
/// written, relative to `out`.
pub fn generate(out: &Path) -> Result<Vec<String>> {
    let mut written = Vec::new();
    for cmd in commands() {
        written.extend(man_pages(cmd.clone(), &out.join("man1"))?);
        written.extend(completions(cmd, &out.join("completions"))?);
    }
    Ok(written
        .into_iter()
        .map(|p| {
            Path::new(&p)
                .strip_prefix(out)
                .map(|r| r.display().to_string())
                .unwrap_or(p)
        })
        .collect())
}

/// One page for the command and one for each visible subcommand, named as git names them
/// (`ingot-build.1`, `ingot-layer-build.1`), so `man ingot-build` finds it.
fn man_pages(cmd: clap::Command, dir: &Path) -> Result<Vec<String>> {
    fs::create_dir_all(dir).with_context(|| format!("creating {}", dir.display()))?;
    clap_mangen::generate_to(cmd, dir)
        .with_context(|| format!("writing into {}", dir.display()))?;
    let mut pages: Vec<String> = fs::read_dir(dir)?
        .filter_map(|e| e.ok())
        .map(|e| e.path().display().to_string())
        .collect();
    pages.sort();
    Ok(pages)
}

fn completions(mut cmd: clap::Command, dir: &Path) -> Result<Vec<String>> {
    fs::create_dir_all(dir).with_context(|| format!("creating {}", dir.display()))?;
    let name = cmd.get_name().to_string();
    let mut files = Vec::new();
    for shell in [Shell::Bash, Shell::Zsh, Shell::Fish] {
        let path = clap_complete::generate_to(shell, &mut cmd, &name, dir)
            .with_context(|| format!("writing the {shell} completion of {name}"))?;
        files.push(path.display().to_string());
    }
    Ok(files)
}
