//! The operator's tables in `docs/writer.md` and `docs/caph.md` (stages, failure reasons,
//! `output.json` fields) are what the writer's code says: this test fails, showing the diff,
//! when a generated block is stale (a stage or reason added, renamed or reworded without the
//! pages following). `INGOT_BLESS=1` rewrites the blocks, as for `docs/cli.md`.

use std::path::Path;

use ingot_docgen::tables;
use ingot_writer::report::{DiskState, Rewrite, Stage, Status};

/// A line diff of `have` against `want` (longest common subsequence), `-` and `+` lines only.
fn diff(have: &str, want: &str) -> String {
    let (a, b): (Vec<&str>, Vec<&str>) = (have.lines().collect(), want.lines().collect());
    let mut lcs = vec![vec![0usize; b.len() + 1]; a.len() + 1];
    for i in (0..a.len()).rev() {
        for j in (0..b.len()).rev() {
            lcs[i][j] = if a[i] == b[j] {
                lcs[i + 1][j + 1] + 1
            } else {
                lcs[i + 1][j].max(lcs[i][j + 1])
            };
        }
    }
    let (mut i, mut j, mut out) = (0, 0, String::new());
    while i < a.len() || j < b.len() {
        if i < a.len() && j < b.len() && a[i] == b[j] {
            (i, j) = (i + 1, j + 1);
        } else if j < b.len() && (i == a.len() || lcs[i][j + 1] >= lcs[i + 1][j]) {
            out.push_str(&format!("+ {}\n", b[j]));
            j += 1;
        } else {
            out.push_str(&format!("- {}\n", a[i]));
            i += 1;
        }
    }
    out
}

#[test]
fn generated_tables_match_the_code() {
    let root = Path::new(env!("CARGO_MANIFEST_DIR")).join("..");
    let mut stale = String::new();
    for page in tables::pages() {
        let (have, want) = tables::render_page(&root, page).unwrap();
        if have == want {
            continue;
        }
        if std::env::var_os("INGOT_BLESS").is_some() {
            std::fs::write(root.join(page), &want).unwrap();
        } else {
            stale.push_str(&format!("{page}:\n{}\n", diff(&have, &want)));
        }
    }
    assert!(
        stale.is_empty(),
        "generated tables are stale (run INGOT_BLESS=1 cargo test -p ingot-docgen --test \
         tables):\n{stale}"
    );
}

/// Every stage and reason the code has is in the rendered tables, by the name it is reported as.
#[test]
fn every_stage_and_reason_is_rendered() {
    let stages = tables::stages();
    for s in Stage::all() {
        assert!(stages.contains(&format!("| `{}` |", s.name())), "{s:?}");
    }
    let reasons = tables::reasons();
    for r in ingot_writer::reason::FailureReason::all() {
        assert!(reasons.contains(&format!("| `{r}` | 1 |")), "{r}");
    }
}

/// `Status::FIELDS` lists exactly the keys the status file has, with every optional field
/// present.
#[test]
fn output_json_fields_are_the_serialised_ones() {
    let mut details = serde_json::Map::new();
    details.insert("machine".into(), serde_json::json!({}));
    let status = Status {
        state: "failed",
        status: "Failed",
        stage: Stage::Write,
        message: "write: failed".into(),
        error: Some("write-failed: …".into()),
        layers: vec!["base".into()],
        rewrites: vec![Rewrite {
            layer: "base".into(),
            offset: 0,
            length: 4096,
            attempt: 1,
        }],
        bytes_written: 4096,
        disks: Some(DiskState::Cleared),
        warnings: Vec::new(),
        details,
        updated: 0.0,
    };
    let json = serde_json::to_value(&status).unwrap();
    let mut keys: Vec<&str> = json
        .as_object()
        .unwrap()
        .keys()
        .map(String::as_str)
        .collect();
    let mut listed: Vec<&str> = Status::FIELDS.iter().map(|f| f.name).collect();
    keys.sort_unstable();
    listed.sort_unstable();
    assert_eq!(keys, listed);
}
