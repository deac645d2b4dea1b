//! SPDX documents checked by the tools others check them with: pyspdxtools (the SPDX
//! project's validator) and sbomcheck (ntia-conformance-checker, the NTIA minimum elements).
//! `ci/test` installs both in /var/cache/ingot-ci/spdx-venv.

use std::path::{Path, PathBuf};
use std::process::Command;

use serde_json::Value;

/// The packages an ingot SBOM lists: the entries with a purl (`externalRefs`), not the
/// document's own entry for the layer.
pub fn packages(document: &Value) -> Vec<&Value> {
    document["packages"]
        .as_array()
        .map(|all| {
            all.iter()
                .filter(|p| p.get("externalRefs").is_some())
                .collect()
        })
        .unwrap_or_default()
}

/// pyspdxtools and sbomcheck accept the SPDX document `file`, when installed
/// (`INGOT_PYSPDXTOOLS` and `INGOT_SBOMCHECK` name others); a missing one is skipped with a
/// message (a failure in CI, as every skip). `what` names the document in a failure.
pub fn tools_accept(file: &Path, what: &str) {
    for (env, venv, args) in [
        ("INGOT_PYSPDXTOOLS", "pyspdxtools", &["-i"][..]),
        ("INGOT_SBOMCHECK", "sbomcheck", &["-r", "json"][..]),
    ] {
        let tool = std::env::var_os(env)
            .map(PathBuf::from)
            .or_else(|| Some(PathBuf::from("/var/cache/ingot-ci/spdx-venv/bin").join(venv)))
            .filter(|p| p.is_file());
        let Some(tool) = tool else {
            crate::skip::skip(
                &crate::skip::current_test(),
                &format!("{venv} is not installed"),
            );
            continue;
        };
        let out = Command::new(&tool).args(args).arg(file).output().unwrap();
        assert!(
            out.status.success(),
            "{venv} refuses {what}:\n{}{}",
            String::from_utf8_lossy(&out.stdout),
            String::from_utf8_lossy(&out.stderr)
        );
    }
}
