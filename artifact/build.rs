//! Records the git commit the binary is built from, so `--version` and the stack descriptor's
//! `builder` field tell two builds apart. `INGOT_GIT_COMMIT` overrides it (a release built from
//! a source tarball, where there is no `.git`); without either it says `unknown`.

use std::path::PathBuf;
use std::process::Command;

fn git(args: &[&str]) -> Option<String> {
    let out = Command::new("git").args(args).output().ok()?;
    out.status
        .success()
        .then(|| String::from_utf8_lossy(&out.stdout).trim().to_owned())
        .filter(|s| !s.is_empty())
}

fn main() {
    println!("cargo:rerun-if-env-changed=INGOT_GIT_COMMIT");
    let commit = std::env::var("INGOT_GIT_COMMIT")
        .ok()
        .filter(|c| !c.is_empty())
        .or_else(|| {
            let head = git(&["rev-parse", "--short=12", "HEAD"])?;
            // Uncommitted changes to tracked files make it a different build.
            // `--no-optional-locks`: no index refresh written back, which would rerun this script.
            let dirty = git(&[
                "--no-optional-locks",
                "status",
                "--porcelain",
                "--untracked-files=no",
            ])
            .is_some();
            Some(if dirty { format!("{head}-dirty") } else { head })
        })
        .unwrap_or_else(|| "unknown".to_owned());
    println!("cargo:rustc-env=INGOT_GIT_COMMIT={commit}");
    // Rerun when HEAD moves (a commit, a checkout) or the index changes (staging, committing).
    // Edits that are not staged do not rerun this script: `-dirty` reflects the last rerun.
    // Only files that exist are named: cargo takes a missing one as changed and would rerun the
    // script, and rebuild every crate that depends on this one, at every build (a fresh clone
    // has no packed-refs; a branch only in packed-refs has no loose ref file).
    for path in watched() {
        println!("cargo:rerun-if-changed={}", path.display());
    }
}

/// The git files whose change means another commit or index: HEAD and the index of this
/// worktree, and the branch HEAD names (its loose ref, or the directory a new one would appear
/// in, and packed-refs), each only if it exists.
fn watched() -> Vec<PathBuf> {
    let mut paths = Vec::new();
    let Some(dir) = git(&["rev-parse", "--git-dir"]).map(PathBuf::from) else {
        return paths;
    };
    paths.extend(["HEAD", "index"].map(|f| dir.join(f)));
    if let Some(common) = git(&["rev-parse", "--git-common-dir"]).map(PathBuf::from) {
        paths.push(common.join("packed-refs"));
        if let Some(head_ref) = git(&["symbolic-ref", "-q", "HEAD"]) {
            let loose = common.join(head_ref);
            match loose.exists() {
                true => paths.push(loose),
                false => paths.extend(loose.parent().map(PathBuf::from)),
            }
        }
    }
    paths.retain(|p| p.exists());
    paths
}
