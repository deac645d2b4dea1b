//! The tables an operator reads, rendered from the writer's code into marked blocks of the
//! docs: the stages ([`ingot_writer::report::Stage`]), the failure reasons with their exit
//! status and what to do ([`ingot_writer::reason::FailureReason`]), and the status file's
//! fields ([`ingot_writer::report::Status::FIELDS`]). A block is the text between
//! `<!-- BEGIN generated: NAME -->` and `<!-- END generated: NAME -->`; everything else in the
//! page is written by hand. `docgen/tests/tables.rs` checks the pages (`INGOT_BLESS=1` rewrites
//! them).

use std::path::Path;

use anyhow::{bail, Context, Result};
use ingot_writer::reason::FailureReason;
use ingot_writer::report::{Runs, Stage, Status};

/// Which block of which page (relative to the workspace root) holds which table.
pub const BLOCKS: &[(&str, &str)] = &[
    ("docs/writer.md", "stages"),
    ("docs/writer.md", "reasons"),
    ("docs/writer.md", "output-json"),
    ("docs/caph.md", "stages"),
    ("docs/caph.md", "reasons"),
];

/// The table of the block named `name`.
pub fn table(name: &str) -> Result<String> {
    Ok(match name {
        "stages" => stages(),
        "reasons" => reasons(),
        "output-json" => output_json(),
        _ => bail!("no generated table is named `{name}`"),
    })
}

/// Every stage in order: name as reported, which runs report it, whether it changes a disk,
/// what it does.
pub fn stages() -> String {
    let mut out =
        String::from("| stage | runs in | changes a disk | what happens |\n|---|---|---|---|\n");
    for stage in Stage::all() {
        let t = stage.text();
        let runs = match t.runs {
            Runs::Provisioning => "provisioning",
            Runs::Always => "every run",
        };
        let disk = if t.changes_disk { "yes" } else { "no" };
        out.push_str(&format!(
            "| `{}` | {runs} | {disk} | {} |\n",
            stage.name(),
            t.what
        ));
    }
    out
}

/// Every failure reason: its name, exit status, meaning and what to do.
pub fn reasons() -> String {
    let mut out =
        String::from("| reason | exit | what it means | what to do |\n|---|---|---|---|\n");
    for reason in FailureReason::all() {
        let t = reason.text();
        out.push_str(&format!(
            "| `{reason}` | {} | {} | {} |\n",
            reason.exit_code(),
            t.means,
            t.action
        ));
    }
    out
}

/// The status file's fields: name, JSON type, meaning.
pub fn output_json() -> String {
    let mut out = String::from("| field | type | meaning |\n|---|---|---|\n");
    for f in Status::FIELDS {
        out.push_str(&format!("| `{}` | {} | {} |\n", f.name, f.kind, f.means));
    }
    out
}

fn markers(name: &str) -> (String, String) {
    (
        format!("<!-- BEGIN generated: {name} -->\n"),
        format!("<!-- END generated: {name} -->"),
    )
}

/// `page` with the block `name` holding `body`; an error when the page lacks its markers.
pub fn replace_block(page: &str, name: &str, body: &str) -> Result<String> {
    let (begin, end) = markers(name);
    let start = page
        .find(&begin)
        .with_context(|| format!("no `{}` line", begin.trim_end()))?
        + begin.len();
    let stop = page[start..]
        .find(&end)
        .with_context(|| format!("no `{end}` line after its BEGIN"))?
        + start;
    Ok(format!("{}{body}{}", &page[..start], &page[stop..]))
}

/// The page at `root/path` with every block [`BLOCKS`] puts in it rendered: (as it is, as it
/// should be).
pub fn render_page(root: &Path, path: &str) -> Result<(String, String)> {
    let file = root.join(path);
    let have =
        std::fs::read_to_string(&file).with_context(|| format!("reading {}", file.display()))?;
    let mut want = have.clone();
    for (_, name) in BLOCKS.iter().filter(|(p, _)| *p == path) {
        want = replace_block(&want, name, &table(name)?)
            .with_context(|| format!("{path}: block `{name}`"))?;
    }
    Ok((have, want))
}

/// The pages that hold generated blocks, each once.
pub fn pages() -> Vec<&'static str> {
    let mut pages: Vec<&str> = BLOCKS.iter().map(|(p, _)| *p).collect();
    pages.dedup();
    pages
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_block_is_replaced_between_its_markers_only() {
        let page = "a\n<!-- BEGIN generated: x -->\nold\n<!-- END generated: x -->\nb\n";
        let new = replace_block(page, "x", "new\n").unwrap();
        assert_eq!(
            new,
            "a\n<!-- BEGIN generated: x -->\nnew\n<!-- END generated: x -->\nb\n"
        );
        assert!(replace_block(page, "y", "new\n").is_err());
        assert!(replace_block("<!-- BEGIN generated: x -->\n", "x", "").is_err());
    }
}
