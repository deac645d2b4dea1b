//! Why a registries.conf cannot be used (`mirrors`): its own module, below `error` and
//! `reference`, so that `RegistryError` can carry it while `mirrors` uses references.

use std::path::PathBuf;

/// The most of a registries.conf read (real ones are a few KiB).
pub const MAX_FILE: u64 = 1 << 20;

/// The most mirrors one `[[registry]]` may list. Real files list one to three (a site cache, a
/// regional one, a pull-through cache); every mirror of a registry is asked before its origin,
/// so each one is a connection attempt (seconds when it is dead) that a request may pay: 16
/// bounds that to a small multiple of the origin's own retries while leaving room for a chain
/// of caches per site. A longer list is a generated or hostile file, refused rather than
/// truncated (which half of it was meant?).
pub const MAX_MIRRORS: usize = 16;

/// `s` with everything but printable ASCII escaped (`\u{1b}`, `\n`, `\u{202e}`): names in a
/// registries.conf are ASCII, and a control, bidi or zero-width character must not reach a
/// terminal or the status file as itself.
pub(crate) fn escaped(s: &str) -> String {
    s.chars()
        .map(|c| {
            if !(c.is_ascii_graphic() || c == ' ') {
                c.escape_default().to_string()
            } else {
                c.to_string()
            }
        })
        .collect()
}

/// The most characters of a value from the file quoted in a message.
const SHOWN_MAX: usize = 120;

/// `s` (from the file) as a message may quote it: [`escaped`] (so that no escape sequence
/// reaches a terminal and no newline forges a line), and at most
/// [`SHOWN_MAX`] characters, a longer value cut with `…` and its length said.
pub(crate) fn shown(s: &str) -> String {
    let count = s.chars().count();
    let cut = match s.char_indices().nth(SHOWN_MAX) {
        Some((i, _)) => &s[..i],
        None => s,
    };
    let mut out = escaped(cut);
    if count > SHOWN_MAX {
        out.push_str(&format!("… ({count} characters, cut)"));
    }
    out
}

/// Why a registries.conf cannot be used, or refuses a reference.
#[derive(Debug, thiserror::Error)]
pub enum MirrorsError {
    /// The file could not be read.
    #[error("reading the registries configuration {path}")]
    Read {
        /// The file.
        path: PathBuf,
        /// Why.
        #[source]
        source: std::io::Error,
    },
    /// The file is larger than any registries.conf.
    #[error("{path}: larger than {MAX_FILE} bytes; not a registries.conf (not read further)")]
    TooLarge {
        /// The file.
        path: PathBuf,
    },
    /// The file is not TOML. The parser's own message quotes the whole line, which may be a
    /// megabyte of anything: only an escaped excerpt around the column is kept.
    #[error("{path}: not a TOML registries.conf: {at}{message}{excerpt}")]
    Toml {
        /// The file.
        path: PathBuf,
        /// `line L, column C: ` (1-based, the column in characters), or empty.
        at: String,
        /// The parser's complaint, escaped and cut.
        message: String,
        /// `; the line reads `…``: around the column, escaped and cut (or empty).
        excerpt: String,
    },
    /// A `[[registry]]` lists more than [`MAX_MIRRORS`] mirrors.
    #[error(
        "{path}: `{key}` (prefix `{}`) lists {count} mirrors, more than the {MAX_MIRRORS} \
         accepted for one registry",
        shown(.prefix)
    )]
    TooManyMirrors {
        /// The file.
        path: PathBuf,
        /// The table, as a TOML path (`registry[2]`).
        key: String,
        /// Its prefix (shown escaped and cut).
        prefix: String,
        /// How many it lists.
        count: usize,
    },
    /// A key is unknown or its value wrong.
    #[error("{path}: `{key}`: {problem}")]
    Invalid {
        /// The file.
        path: PathBuf,
        /// The key, as a TOML path (`registry[2].mirror[0].location`).
        key: String,
        /// What is wrong.
        problem: String,
    },
    /// Version 1 tables beside version 2 keys.
    #[error(
        "{path}: mixes the version 1 format (`[registries.*]`) with version 2 (`{v2_key}`); \
         containers/image refuses this too: convert the file to version 2 (`[[registry]]`)"
    )]
    Mixed {
        /// The file.
        path: PathBuf,
        /// The first version 2 key found.
        v2_key: String,
    },
    /// One location (a wildcard's prefix) under two prefixes with different settings.
    #[error(
        "{path}: `{}` is configured more than once with different `{setting}` settings \
         (containers/image refuses this too)",
        shown(.location)
    )]
    Conflict {
        /// The file.
        path: PathBuf,
        /// The location.
        location: String,
        /// `insecure` or `blocked`.
        setting: &'static str,
    },
    /// A drop-in directory could not be listed.
    #[error("listing the registries.conf drop-in directory {path}")]
    Dir {
        /// The directory.
        path: PathBuf,
        /// Why.
        #[source]
        source: std::io::Error,
    },
    /// The location a reference is rewritten to is blocked by another entry, and no mirror is
    /// left to try.
    #[error(
        "{reference}: its location `{}` is blocked by `prefix = \"{}\"` (blocked = true) in \
         {path}",
        shown(.location),
        shown(.prefix)
    )]
    BlockedLocation {
        /// The reference.
        reference: String,
        /// Where it was rewritten to.
        location: String,
        /// The prefix that blocks it.
        prefix: String,
        /// The file.
        path: PathBuf,
    },
    /// The configuration blocks the reference.
    #[error("{reference}: blocked by `prefix = \"{}\"` (blocked = true) in {path}", shown(.prefix))]
    Blocked {
        /// The reference.
        reference: String,
        /// The matching prefix.
        prefix: String,
        /// The file.
        path: PathBuf,
    },
    /// A rewritten location does not make a valid reference.
    #[error(
        "{reference}: `{}` in {path} rewrites it to `{}`, not a reference",
        shown(.location),
        shown(.rewritten)
    )]
    Rewrite {
        /// The reference.
        reference: String,
        /// The location.
        location: String,
        /// The result.
        rewritten: String,
        /// The file.
        path: PathBuf,
    },
}
