//! The build's identity: the crate version and the git commit it was built from (recorded by
//! `build.rs`), for `--version` of both binaries and the stack descriptor's `builder` field.

/// The git commit, 12 hex digits, `-dirty` if tracked files had uncommitted changes, or
/// `unknown` when built outside a git checkout without `INGOT_GIT_COMMIT`.
pub const COMMIT: &str = env!("INGOT_GIT_COMMIT");

/// `0.1.0 (commit 0123456789ab)`: what `--version` prints after the program name.
pub const VERSION: &str = concat!(
    env!("CARGO_PKG_VERSION"),
    " (commit ",
    env!("INGOT_GIT_COMMIT"),
    ")"
);

/// `ingot 0.1.0 (commit 0123456789ab)`: the descriptor's `builder` field.
pub fn builder_id() -> String {
    format!("ingot {VERSION}")
}
