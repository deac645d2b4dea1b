//! docs/cli.md is generated from the clap definitions of `ingot` (every subcommand) and
//! `ingot-writer`; this test fails when the committed copy differs. `INGOT_BLESS=1` rewrites it.

use std::path::Path;

use clap::CommandFactory;

/// One section per command, its long help as `--help` prints it, subcommands below it.
fn section(out: &mut String, cmd: &mut clap::Command, path: &str, depth: usize) {
    out.push_str(&format!("{} `{path}`\n\n```text\n", "#".repeat(depth)));
    out.push_str(cmd.render_long_help().to_string().trim_end());
    out.push_str("\n```\n\n");
    for sub in cmd.get_subcommands_mut() {
        if sub.get_name() == "help" || sub.is_hide_set() {
            continue;
        }
        let name = format!("{path} {}", sub.get_name());
        section(out, sub, &name, depth + 1);
    }
}

fn reference() -> String {
    let mut out = String::from(
        "# Command-line reference\n\n\
         Generated from the clap definitions (`builder/src/cli/`, `writer/src/cli.rs`) by\n\
         `writer/tests/cli_reference.rs`; run it with `INGOT_BLESS=1` to rewrite this file.\n\n\
         `--json`: every `ingot` command whose output a program reads (build, verify, inspect,\n\
         diff, publish, pull, resolve, layer build, verity format/verify/dump) prints one JSON\n\
         object on stdout with `--json`. Keys are camelCase everywhere (as in the stack\n\
         descriptor and the OCI manifest); digests are `sha256:HEX` strings, sizes are bytes.\n\
         Exit codes are the same with and without `--json`; `verify --json` prints a failure as\n\
         `{\"verified\": false, \"error\": …, \"exitCode\": N}` as well as on stderr.\n\n",
    );
    for mut cmd in [
        ingot::cli::Cli::command(),
        ingot_writer::cli::Cli::command(),
    ] {
        // A fixed width, so the text does not depend on the terminal that generates it.
        cmd = cmd.term_width(100);
        cmd.build();
        let name = cmd.get_name().to_string();
        section(&mut out, &mut cmd, &name, 2);
    }
    out.trim_end().to_string() + "\n"
}

#[test]
fn docs_cli_md_matches_the_clap_definitions() {
    let path = Path::new(env!("CARGO_MANIFEST_DIR")).join("../docs/cli.md");
    let want = reference();
    if std::env::var_os("INGOT_BLESS").is_some() {
        std::fs::write(&path, &want).unwrap();
        return;
    }
    let have = std::fs::read_to_string(&path).unwrap_or_default();
    assert!(
        have == want,
        "docs/cli.md is stale: run INGOT_BLESS=1 cargo test -p ingot-writer --test cli_reference"
    );
}
