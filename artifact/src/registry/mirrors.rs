//! Registry mirrors and pull-through caches, configured as skopeo and podman are: a
//! `containers-registries.conf(5)` file in its version 2 format. This module owns reading that
//! file and answering "which sources, in which order, for this reference"; trying them is the
//! client's job (`fallback`).
//!
//! The semantics are containers/image's (`sysregistriesv2`):
//! - a reference is matched against every `[[registry]]`'s `prefix` (default: its `location`);
//!   the prefix must be followed by the end, `/`, or (for a prefix with a path) `:` or `@`; the
//!   longest match wins; `*.example.com` matches every subdomain's host;
//! - `location` replaces the matched prefix (the primary source; default the reference itself);
//! - `[[registry.mirror]]` locations replace the prefix too and are tried first, in order;
//!   `pull-from-mirror` (`all`, default; `digest-only`; `tag-only`) or the registry's
//!   `mirror-by-digest-only` decide whether a mirror is used for a request by digest or by tag;
//! - `insecure = true`: TLS without checking the certificate (loopback hosts speak plain HTTP
//!   anyway); `blocked = true`: pulling a matching reference is refused.
//!
//! The stack's signature travels inside the artifact, so any copy is as good as the origin:
//! every byte a mirror serves is checked against the signed digests. ingot always fetches blobs
//! by digest, so blobs follow the digest rule, and a tag follows the tag rule.
//!
//! The version 1 format (`[registries.search]`, `[registries.insecure]`, `[registries.block]`)
//! alone is read for its `insecure` and `block` lists (no mirrors exist in it); mixed with
//! version 2 keys it is refused, as containers/image refuses it. Keys about short names
//! (`unqualified-search-registries`, `aliases`, `short-name-mode`) and credential helpers are
//! ignored: an `oci://` reference is always fully qualified, and credentials come from docker's
//! files (`auth`). Any other key is an error naming the file and the key, so a misspelt
//! `pull-from-mirror` cannot silently disable a mirror.
//!
//! Stricter than containers/image, which keeps them silently: a `prefix` that could never match
//! a reference (`*.`, upper case, a control character, an empty label; `names`) is refused, and
//! so is a `[[registry]]` with more than [`MAX_MIRRORS`] mirrors. Whatever the file holds is
//! quoted escaped and cut (`mirrors_error::shown`), TOML errors included.

mod names;

use std::collections::HashSet;
use std::path::{Path, PathBuf};

use ingot_verity::input::{self, InputError, Symlinks};

use super::mirrors_error::{escaped, shown};
pub use super::mirrors_error::{MirrorsError, MAX_FILE, MAX_MIRRORS};
use super::reference::{RegistryRef, SCHEME};

/// The file skopeo and podman read, used when it exists and nothing else is asked for.
pub const DEFAULT_PATH: &str = "/etc/containers/registries.conf";

/// Top-level keys containers/image knows that say nothing about where an `oci://` reference is
/// pulled from; ignored.
const IGNORED_TOP: &[&str] = &[
    "unqualified-search-registries",
    "short-name-mode",
    "aliases",
    "credential-helpers",
    "additional-layer-store-auth-helper",
];

/// When a mirror is used (`pull-from-mirror`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum PullFromMirror {
    /// For every request (the default).
    All,
    /// Only for requests by digest.
    DigestOnly,
    /// Only for requests by tag.
    TagOnly,
}

impl PullFromMirror {
    fn allows(self, by_digest: bool) -> bool {
        match self {
            PullFromMirror::All => true,
            PullFromMirror::DigestOnly => by_digest,
            PullFromMirror::TagOnly => !by_digest,
        }
    }
}

/// One `[[registry.mirror]]`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Mirror {
    /// `host[:port][/path]`.
    pub location: String,
    /// TLS without certificate checks.
    pub insecure: bool,
    /// When it is used.
    pub pull_from_mirror: PullFromMirror,
}

/// One `[[registry]]`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Entry {
    /// What a reference must start with; `*.host` for a wildcard.
    pub prefix: String,
    /// Where the prefix really lives (empty: the reference itself).
    pub location: String,
    /// TLS without certificate checks.
    pub insecure: bool,
    /// Pulls refused.
    pub blocked: bool,
    /// Mirrors, in order.
    pub mirrors: Vec<Mirror>,
}

/// A parsed registries.conf.
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct MirrorConfig {
    /// The file (for messages).
    pub path: PathBuf,
    /// The `[[registry]]` tables.
    pub entries: Vec<Entry>,
}

/// One place to pull a reference from.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct PullSource {
    /// The reference as this source names it (location rewritten).
    pub reference: RegistryRef,
    /// TLS without certificate checks.
    pub insecure: bool,
    /// A mirror (else the primary location, the origin).
    pub mirror: bool,
}

impl PullSource {
    /// `host[:port]/repo` of this source, for messages and the per-source report.
    pub fn location(&self) -> String {
        format!("{}/{}", self.reference.registry, self.reference.repository)
    }
}

/// The TOML path of a key, for messages.
fn key_path(parent: &str, key: &str) -> String {
    if parent.is_empty() {
        key.to_owned()
    } else {
        format!("{parent}.{key}")
    }
}

struct Reader<'a> {
    path: &'a Path,
}

impl Reader<'_> {
    fn invalid(&self, key: &str, problem: impl Into<String>) -> MirrorsError {
        MirrorsError::Invalid {
            path: self.path.to_owned(),
            key: shown(key),
            problem: problem.into(),
        }
    }

    fn string(&self, key: &str, v: &toml::Value) -> Result<String, MirrorsError> {
        v.as_str()
            .map(str::to_owned)
            .ok_or_else(|| self.invalid(key, format!("must be a string, not {}", v.type_str())))
    }

    fn boolean(&self, key: &str, v: &toml::Value) -> Result<bool, MirrorsError> {
        v.as_bool().ok_or_else(|| {
            self.invalid(key, format!("must be true or false, not {}", v.type_str()))
        })
    }

    fn tables<'v>(
        &self,
        key: &str,
        v: &'v toml::Value,
    ) -> Result<Vec<&'v toml::Table>, MirrorsError> {
        let array = v
            .as_array()
            .ok_or_else(|| self.invalid(key, format!("must be an array of tables ([[{key}]])")))?;
        array
            .iter()
            .enumerate()
            .map(|(i, t)| {
                t.as_table()
                    .ok_or_else(|| self.invalid(&format!("{key}[{i}]"), "must be a table"))
            })
            .collect()
    }

    /// A `location`: `host[:port][/path][:tag|@digest]`, no scheme, no trailing `/`.
    fn location(&self, key: &str, v: &toml::Value) -> Result<String, MirrorsError> {
        self.name(key, v, false)
    }

    /// A `prefix`: a location, or `*.domain`.
    fn prefix(&self, key: &str, v: &toml::Value) -> Result<String, MirrorsError> {
        self.name(key, v, true)
    }

    fn name(&self, key: &str, v: &toml::Value, wildcard: bool) -> Result<String, MirrorsError> {
        let s = self.string(key, v)?;
        let s = s.trim_end_matches('/').to_owned();
        if s.contains("://") {
            return Err(self.invalid(
                key,
                format!(
                    "`{}` has a scheme; a location is host[:port][/path]",
                    shown(&s)
                ),
            ));
        }
        if let Some(why) = names::problem(&s, wildcard) {
            let what = if wildcard {
                "can never match a reference"
            } else {
                "is not a registry location"
            };
            return Err(self.invalid(key, format!("`{}` {what}: {why}", shown(&s))));
        }
        Ok(s)
    }

    fn mirror(&self, key: &str, t: &toml::Table) -> Result<Mirror, MirrorsError> {
        let mut mirror = Mirror {
            location: String::new(),
            insecure: false,
            pull_from_mirror: PullFromMirror::All,
        };
        for (k, v) in t {
            let kp = key_path(key, k);
            match k.as_str() {
                "location" => mirror.location = self.location(&kp, v)?,
                "insecure" => mirror.insecure = self.boolean(&kp, v)?,
                "pull-from-mirror" => {
                    mirror.pull_from_mirror = match self.string(&kp, v)?.as_str() {
                        "" | "all" => PullFromMirror::All,
                        "digest-only" => PullFromMirror::DigestOnly,
                        "tag-only" => PullFromMirror::TagOnly,
                        other => {
                            return Err(self.invalid(
                                &kp,
                                format!(
                                    "`{}` is not one of \"all\", \"digest-only\", \
                                     \"tag-only\"",
                                    shown(other)
                                ),
                            ))
                        }
                    }
                }
                _ => return Err(self.invalid(&kp, "unknown key in a [[registry.mirror]]")),
            }
        }
        if mirror.location.is_empty() {
            return Err(self.invalid(key, "a mirror needs a `location`"));
        }
        Ok(mirror)
    }

    fn entry(&self, key: &str, t: &toml::Table) -> Result<Entry, MirrorsError> {
        let mut entry = Entry {
            prefix: String::new(),
            location: String::new(),
            insecure: false,
            blocked: false,
            mirrors: Vec::new(),
        };
        let mut by_digest_only = false;
        let mut pull_from_mirror_set = None;
        let mut too_many = None;
        for (k, v) in t {
            let kp = key_path(key, k);
            match k.as_str() {
                "prefix" => entry.prefix = self.prefix(&kp, v)?,
                "location" => entry.location = self.location(&kp, v)?,
                "insecure" => entry.insecure = self.boolean(&kp, v)?,
                "blocked" => entry.blocked = self.boolean(&kp, v)?,
                "mirror-by-digest-only" => by_digest_only = self.boolean(&kp, v)?,
                "mirror" => {
                    let mirrors = self.tables(&kp, v)?;
                    if mirrors.len() > MAX_MIRRORS {
                        // Refused below, once the prefix (which names the registry) is known.
                        too_many = Some(mirrors.len());
                        continue;
                    }
                    for (i, m) in mirrors.into_iter().enumerate() {
                        let mkey = format!("{kp}[{i}]");
                        if m.contains_key("pull-from-mirror") {
                            pull_from_mirror_set = Some(format!("{mkey}.pull-from-mirror"));
                        }
                        entry.mirrors.push(self.mirror(&mkey, m)?);
                    }
                }
                _ => return Err(self.invalid(&kp, "unknown key in a [[registry]]")),
            }
        }
        if entry.prefix.is_empty() {
            entry.prefix = entry.location.clone();
        }
        if entry.prefix.is_empty() {
            return Err(self.invalid(key, "a [[registry]] needs a `prefix` or a `location`"));
        }
        if let Some(count) = too_many {
            return Err(MirrorsError::TooManyMirrors {
                path: self.path.to_owned(),
                key: key.to_owned(),
                prefix: entry.prefix,
                count,
            });
        }
        if entry.prefix.starts_with("*.") && !entry.location.is_empty() {
            return Err(self.invalid(
                &key_path(key, "location"),
                "must not be set with a wildcard prefix",
            ));
        }
        if by_digest_only {
            if let Some(k) = pull_from_mirror_set {
                return Err(self.invalid(
                    &k,
                    "cannot be set together with the registry's mirror-by-digest-only",
                ));
            }
            for m in &mut entry.mirrors {
                m.pull_from_mirror = PullFromMirror::DigestOnly;
            }
        }
        Ok(entry)
    }

    /// Version 1: `[registries.insecure]` and `[registries.block]` (`registries = [...]`).
    fn v1(&self, t: &toml::Table) -> Result<Vec<Entry>, MirrorsError> {
        let mut entries: Vec<Entry> = Vec::new();
        for (k, v) in t {
            let kp = key_path("registries", k);
            let (insecure, blocked) = match k.as_str() {
                "search" => (false, false),
                "insecure" => (true, false),
                "block" => (false, true),
                _ => return Err(self.invalid(&kp, "unknown key in the version 1 format")),
            };
            let table = v
                .as_table()
                .ok_or_else(|| self.invalid(&kp, "must be a table"))?;
            for (k2, list) in table {
                let kp2 = key_path(&kp, k2);
                if k2 != "registries" {
                    return Err(self.invalid(&kp2, "unknown key in the version 1 format"));
                }
                let list = list
                    .as_array()
                    .ok_or_else(|| self.invalid(&kp2, "must be an array of strings"))?;
                for (i, host) in list.iter().enumerate() {
                    let host = self.location(&format!("{kp2}[{i}]"), host)?;
                    if !(insecure || blocked) {
                        continue; // search: short names only
                    }
                    match entries.iter_mut().find(|e| e.prefix == host) {
                        Some(e) => {
                            e.insecure |= insecure;
                            e.blocked |= blocked;
                        }
                        None => entries.push(Entry {
                            prefix: host.clone(),
                            location: host,
                            insecure,
                            blocked,
                            mirrors: Vec::new(),
                        }),
                    }
                }
            }
        }
        Ok(entries)
    }
}

/// Characters of the offending line quoted on each side of a TOML error's column.
const EXCERPT_HALF: usize = 100;

/// A TOML error as a [`MirrorsError::Toml`]: the line and column, the parser's message, and
/// the line around the column, escaped and cut (toml's own message quotes the line whole).
fn toml_error(path: &Path, text: &str, e: &toml::de::Error) -> MirrorsError {
    let message = shown(&e.message().trim().replace('\n', "; "));
    let Some(span) = e.span() else {
        return MirrorsError::Toml {
            path: path.to_owned(),
            at: String::new(),
            message,
            excerpt: String::new(),
        };
    };
    let mut at = span.start.min(text.len());
    while !text.is_char_boundary(at) {
        at -= 1;
    }
    let start = text[..at].rfind('\n').map_or(0, |i| i + 1);
    let end = text[at..].find('\n').map_or(text.len(), |i| at + i);
    let before: Vec<char> = text[start..at].chars().collect();
    let from = before.len().saturating_sub(EXCERPT_HALF);
    let head: String = before[from..].iter().collect();
    let rest = &text[at..end];
    let tail: String = rest.chars().take(EXCERPT_HALF).collect();
    let cut_after = tail.len() < rest.len();
    let excerpt = if from > 0 || cut_after {
        let chars = before.len() + rest.chars().count();
        format!(
            "; the line ({chars} characters, cut to {} around the column) reads `{}{}{}{}`",
            2 * EXCERPT_HALF,
            if from > 0 { "…" } else { "" },
            escaped(&head),
            escaped(&tail),
            if cut_after { "…" } else { "" },
        )
    } else {
        format!("; the line reads `{}{}`", escaped(&head), escaped(&tail))
    };
    MirrorsError::Toml {
        path: path.to_owned(),
        at: format!(
            "line {}, column {}: ",
            text[..start].matches('\n').count() + 1,
            before.len() + 1
        ),
        message,
        excerpt,
    }
}

impl MirrorConfig {
    /// Reads and parses `path` (at most [`MAX_FILE`] bytes). Only a regular file is read, opened
    /// without blocking: a FIFO or a device in its place is refused, naming it, instead of
    /// hanging the run or reading forever.
    pub fn load(path: &Path) -> Result<MirrorConfig, MirrorsError> {
        let read = |source| MirrorsError::Read {
            path: path.to_owned(),
            source,
        };
        let bytes = input::read_bounded(path, MAX_FILE, Symlinks::Follow).map_err(|e| {
            match input::input_error(&e) {
                Some(InputError::TooLarge { .. }) => MirrorsError::TooLarge {
                    path: path.to_owned(),
                },
                _ => read(e),
            }
        })?;
        let text = String::from_utf8(bytes).map_err(|e| {
            read(std::io::Error::new(
                std::io::ErrorKind::InvalidData,
                format!("not UTF-8 text (byte {})", e.utf8_error().valid_up_to()),
            ))
        })?;
        MirrorConfig::parse(&text, path)
    }

    /// Parses registries.conf text; `path` names it in errors.
    pub fn parse(text: &str, path: &Path) -> Result<MirrorConfig, MirrorsError> {
        let table: toml::Table = toml::from_str(text).map_err(|e| toml_error(path, text, &e))?;
        let r = Reader { path };
        if table.contains_key("registries") {
            if let Some(k) = table.keys().find(|k| *k != "registries") {
                return Err(MirrorsError::Mixed {
                    path: path.to_owned(),
                    v2_key: shown(k),
                });
            }
            let v1 = table["registries"]
                .as_table()
                .ok_or_else(|| r.invalid("registries", "must be a table"))?;
            return Ok(MirrorConfig {
                path: path.to_owned(),
                entries: r.v1(v1)?,
            });
        }
        let mut entries: Vec<Entry> = Vec::new();
        let mut prefixes = HashSet::new();
        for (k, v) in &table {
            match k.as_str() {
                "registry" => {
                    for (i, t) in r.tables(k, v)?.into_iter().enumerate() {
                        let key = format!("registry[{i}]");
                        let entry = r.entry(&key, t)?;
                        if !prefixes.insert(entry.prefix.clone()) {
                            return Err(r.invalid(
                                &key,
                                format!("prefix `{}` is configured twice", shown(&entry.prefix)),
                            ));
                        }
                        entries.push(entry);
                    }
                }
                k if IGNORED_TOP.contains(&k) => {
                    tracing::debug!("{}: `{k}` is about short names; ignored", path.display());
                }
                _ => return Err(r.invalid(k, "unknown key in a registries.conf")),
            }
        }
        Ok(MirrorConfig {
            path: path.to_owned(),
            entries,
        })
    }

    /// The `[[registry]]` a reference (`host/repo[:tag][@digest]`) falls under, and the length
    /// of the part of it the prefix matched.
    fn matching(&self, name: &str) -> Option<(&Entry, usize)> {
        let host_end = name.find('/').unwrap_or(name.len());
        let mut best: Option<(&Entry, usize)> = None;
        for e in &self.entries {
            let len = if let Some(domain) = e.prefix.strip_prefix("*.") {
                // The host without its port must end in `.domain`.
                let host = &name[..host_end];
                let bare = host.rsplit_once(':').map_or(host, |(h, _)| h);
                let hit = bare.len() > domain.len() + 1
                    && bare.ends_with(domain)
                    && bare.as_bytes()[bare.len() - domain.len() - 1] == b'.';
                if !hit {
                    continue;
                }
                host_end
            } else {
                let Some(rest) = name.strip_prefix(e.prefix.as_str()) else {
                    continue;
                };
                // A host-only prefix must end the host (`example.com` is not `example.com:5000`).
                let separators: &[char] = if e.prefix.contains('/') {
                    &['/', ':', '@']
                } else {
                    &['/']
                };
                if !(rest.is_empty() || rest.starts_with(separators)) {
                    continue;
                }
                e.prefix.len()
            };
            // The longest match wins; a wildcard's counts as its pattern's length, as
            // containers/image compares the prefixes themselves.
            let weight = e.prefix.len();
            if best.is_none_or(|(b, _)| weight > b.prefix.len()) {
                best = Some((e, len));
            }
        }
        best
    }

    /// The sources of `reference`, in the order to try them: the mirrors allowed for a
    /// request by digest (`by_digest`) or by tag, then the primary location.
    pub fn pull_sources(
        &self,
        reference: &RegistryRef,
        by_digest: bool,
    ) -> Result<Vec<PullSource>, MirrorsError> {
        let shown = reference.to_string();
        let name = &shown[SCHEME.len()..];
        let Some((entry, matched)) = self.matching(name) else {
            return Ok(vec![PullSource {
                reference: reference.clone(),
                insecure: false,
                mirror: false,
            }]);
        };
        if entry.blocked {
            return Err(MirrorsError::Blocked {
                reference: shown.clone(),
                prefix: entry.prefix.clone(),
                path: self.path.clone(),
            });
        }
        let rest = &name[matched..];
        let rewrite = |location: &str| -> Result<RegistryRef, MirrorsError> {
            let rewritten = format!("{SCHEME}{location}{rest}");
            rewritten.parse().map_err(|_| MirrorsError::Rewrite {
                reference: shown.clone(),
                location: location.to_owned(),
                rewritten: rewritten.clone(),
                path: self.path.clone(),
            })
        };
        let mut out = Vec::new();
        for m in &entry.mirrors {
            if m.pull_from_mirror.allows(by_digest) {
                out.push(PullSource {
                    reference: rewrite(&m.location)?,
                    insecure: m.insecure,
                    mirror: true,
                });
            }
        }
        out.push(PullSource {
            reference: if entry.location.is_empty() {
                reference.clone()
            } else {
                rewrite(&entry.location)?
            },
            insecure: entry.insecure,
            mirror: false,
        });
        Ok(out)
    }
}

/// Where the registries configuration comes from (`--registries-conf`).
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub enum MirrorsFrom {
    /// [`DEFAULT_PATH`] if it exists, else none.
    #[default]
    Default,
    /// No configuration: every reference from its own registry.
    None,
    /// This file (it must exist).
    File(PathBuf),
    /// This registries.conf text; `from` names it in errors (the writer's settings).
    Text {
        /// The TOML.
        text: String,
        /// Where it came from.
        from: PathBuf,
    },
}

impl MirrorsFrom {
    /// `none` or a path.
    pub fn parse(s: &str) -> MirrorsFrom {
        if s == "none" {
            MirrorsFrom::None
        } else {
            MirrorsFrom::File(PathBuf::from(s))
        }
    }

    /// The configuration, if there is one.
    pub fn load(&self) -> Result<Option<MirrorConfig>, MirrorsError> {
        match self {
            MirrorsFrom::None => Ok(None),
            MirrorsFrom::File(p) => MirrorConfig::load(p).map(Some),
            MirrorsFrom::Text { text, from } => MirrorConfig::parse(text, from).map(Some),
            MirrorsFrom::Default => {
                let p = Path::new(DEFAULT_PATH);
                if p.exists() {
                    MirrorConfig::load(p).map(Some)
                } else {
                    Ok(None)
                }
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn conf(text: &str) -> MirrorConfig {
        MirrorConfig::parse(text, Path::new("/t/registries.conf")).unwrap()
    }

    fn err(text: &str) -> String {
        let e = MirrorConfig::parse(text, Path::new("/t/registries.conf")).unwrap_err();
        let s = crate::error_chain::text(&e);
        assert!(s.contains("/t/registries.conf"), "{s}");
        s
    }

    fn r(s: &str) -> RegistryRef {
        s.parse().unwrap()
    }

    fn locations(c: &MirrorConfig, reference: &str, by_digest: bool) -> Vec<String> {
        c.pull_sources(&r(reference), by_digest)
            .unwrap()
            .iter()
            .map(|s| s.reference.to_string())
            .collect()
    }

    const EXAMPLE: &str = r#"
unqualified-search-registries = ["example.com"]

[[registry]]
prefix = "example.com/foo"
insecure = false
blocked = false
location = "internal.example.net/bar"

[[registry.mirror]]
location = "mirror-0.local/mirror-for-foo"

[[registry.mirror]]
location = "mirror-1.local:5000/mirrors/foo"
insecure = true
"#;

    #[test]
    fn mirrors_then_the_rewritten_location() {
        let c = conf(EXAMPLE);
        assert_eq!(
            locations(&c, "oci://example.com/foo/image:latest", false),
            [
                "oci://mirror-0.local/mirror-for-foo/image:latest",
                "oci://mirror-1.local:5000/mirrors/foo/image:latest",
                "oci://internal.example.net/bar/image:latest",
            ]
        );
        let s = c
            .pull_sources(&r("oci://example.com/foo/image:latest"), false)
            .unwrap();
        assert_eq!(
            s.iter().map(|s| (s.insecure, s.mirror)).collect::<Vec<_>>(),
            [(false, true), (true, true), (false, false)]
        );
        assert_eq!(s[1].location(), "mirror-1.local:5000/mirrors/foo/image");
        // Outside the prefix: the reference alone.
        assert_eq!(
            locations(&c, "oci://example.com/foobar/x:1", false),
            ["oci://example.com/foobar/x:1"]
        );
        assert_eq!(
            locations(&c, "oci://other.example/foo/x:1", false),
            ["oci://other.example/foo/x:1"]
        );
    }

    #[test]
    fn the_longest_prefix_wins_and_a_host_prefix_ends_the_host() {
        let c = conf(
            r#"
[[registry]]
location = "reg.example"
[[registry.mirror]]
location = "cache.local/reg"

[[registry]]
prefix = "reg.example/stacks/demo"
location = "reg.example/stacks/demo"
[[registry.mirror]]
location = "demo-cache.local/d"
"#,
        );
        assert_eq!(
            locations(&c, "oci://reg.example/stacks/demo:1", false),
            [
                "oci://demo-cache.local/d:1",
                "oci://reg.example/stacks/demo:1"
            ]
        );
        assert_eq!(
            locations(&c, "oci://reg.example/stacks/other:1", false),
            [
                "oci://cache.local/reg/stacks/other:1",
                "oci://reg.example/stacks/other:1"
            ]
        );
        // `reg.example` does not cover `reg.example:5000`.
        assert_eq!(
            locations(&c, "oci://reg.example:5000/stacks/x:1", false),
            ["oci://reg.example:5000/stacks/x:1"]
        );
        // A prefix naming a tag.
        let c = conf(
            r#"
[[registry]]
prefix = "reg.example/app:v1"
location = "old.example/app:v1"
"#,
        );
        assert_eq!(
            locations(&c, "oci://reg.example/app:v1", false),
            ["oci://old.example/app:v1"]
        );
        assert_eq!(
            locations(&c, "oci://reg.example/app:v2", false),
            ["oci://reg.example/app:v2"]
        );
    }

    #[test]
    fn a_wildcard_prefix_matches_subdomains() {
        let c = conf(
            r#"
[[registry]]
prefix = "*.example.com"
[[registry.mirror]]
location = "cache.local:5000"
"#,
        );
        assert_eq!(
            locations(&c, "oci://a.example.com:443/x/y:1", false),
            [
                "oci://cache.local:5000/x/y:1",
                "oci://a.example.com:443/x/y:1"
            ]
        );
        assert_eq!(
            locations(&c, "oci://example.com/x:1", false),
            ["oci://example.com/x:1"]
        );
        assert_eq!(
            locations(&c, "oci://badexample.com/x:1", false),
            ["oci://badexample.com/x:1"]
        );
        assert!(
            err("[[registry]]\nprefix = \"*.example.com\"\nlocation = \"x\"\n")
                .contains("wildcard")
        );
    }

    #[test]
    fn pull_from_mirror_decides_by_digest_or_by_tag() {
        let c = conf(
            r#"
[[registry]]
location = "reg.example"
[[registry.mirror]]
location = "all.local"
[[registry.mirror]]
location = "digest.local"
pull-from-mirror = "digest-only"
[[registry.mirror]]
location = "tag.local"
pull-from-mirror = "tag-only"
"#,
        );
        let hosts = |by_digest| {
            c.pull_sources(&r("oci://reg.example/s:1"), by_digest)
                .unwrap()
                .into_iter()
                .map(|s| s.reference.registry)
                .collect::<Vec<_>>()
        };
        assert_eq!(hosts(false), ["all.local", "tag.local", "reg.example"]);
        assert_eq!(hosts(true), ["all.local", "digest.local", "reg.example"]);
        let c = conf(
            r#"
[[registry]]
location = "reg.example"
mirror-by-digest-only = true
[[registry.mirror]]
location = "m.local"
"#,
        );
        assert_eq!(
            locations(&c, "oci://reg.example/s:1", false),
            ["oci://reg.example/s:1"]
        );
        assert_eq!(locations(&c, "oci://reg.example/s:1", true).len(), 2);
        let e = err(r#"
[[registry]]
location = "reg.example"
mirror-by-digest-only = true
[[registry.mirror]]
location = "m.local"
pull-from-mirror = "all"
"#);
        assert!(e.contains("registry[0].mirror[0].pull-from-mirror"), "{e}");
        let e = err("[[registry]]\nlocation = \"r\"\n[[registry.mirror]]\nlocation = \"m\"\npull-from-mirror = \"sometimes\"\n");
        assert!(e.contains("sometimes") && e.contains("digest-only"), "{e}");
    }

    #[test]
    fn blocked_and_insecure() {
        let c = conf(
            r#"
[[registry]]
prefix = "evil.example"
blocked = true
[[registry]]
location = "lab.example"
insecure = true
"#,
        );
        let e = c
            .pull_sources(&r("oci://evil.example/x:1"), false)
            .unwrap_err();
        assert!(
            e.to_string().contains("blocked") && e.to_string().contains("/t/registries.conf"),
            "{e}"
        );
        let s = c.pull_sources(&r("oci://lab.example/x:1"), true).unwrap();
        assert!(s[0].insecure && !s[0].mirror);
    }

    #[test]
    fn version_1_alone_is_read_and_mixed_is_refused() {
        let c = conf(
            r#"
[registries.search]
registries = ['registry1.com']
[registries.insecure]
registries = ['registry3.com']
[registries.block]
registries = ['registry.untrusted.com']
"#,
        );
        assert!(c
            .pull_sources(&r("oci://registry.untrusted.com/x:1"), false)
            .is_err());
        assert!(
            c.pull_sources(&r("oci://registry3.com/x:1"), false)
                .unwrap()[0]
                .insecure
        );
        assert!(
            !c.pull_sources(&r("oci://registry1.com/x:1"), false)
                .unwrap()[0]
                .insecure
        );
        let e = err("[registries.search]\nregistries = ['a']\n[[registry]]\nlocation = \"b\"\n");
        assert!(
            e.contains("mixes the version 1") && e.contains("`registry`"),
            "{e}"
        );
    }

    #[test]
    fn hostile_files_are_named_errors() {
        let e = err("[[registry]\nlocation = \"x\"");
        assert!(e.contains("not a TOML"), "{e}");
        let e = err("[[registry]]\nlocation = \"x\"\npul-from-mirror = \"all\"\n");
        assert!(
            e.contains("registry[0].pul-from-mirror") && e.contains("unknown"),
            "{e}"
        );
        let e = err("[[registry]]\nlocation = \"x\"\n[[registry.mirror]]\ninsecure = true\n");
        assert!(e.contains("needs a `location`"), "{e}");
        let e = err("[[registry]]\nlocation = \"https://x\"\n");
        assert!(e.contains("scheme"), "{e}");
        let e = err("[[registry]]\ninsecure = true\n");
        assert!(e.contains("`prefix` or a `location`"), "{e}");
        let e = err("[[registry]]\nlocation = \"x\"\nblocked = \"yes\"\n");
        assert!(
            e.contains("registry[0].blocked") && e.contains("true or false"),
            "{e}"
        );
        let e = err("[[registry]]\nlocation = \"x\"\n[[registry]]\nprefix = \"x\"\n");
        assert!(e.contains("twice"), "{e}");
        let e = err("mirror = 1\n");
        assert!(e.contains("`mirror`"), "{e}");
        // Ignored keys about short names.
        conf("short-name-mode = \"enforcing\"\n[aliases]\nfoo = \"example.com/foo\"\n");
    }

    /// Issue 32, item 8: a FIFO hung `load` in its open (waiting for a writer). The load runs
    /// in a thread with a deadline, so a regression fails here instead of hanging; opening the
    /// writer end afterwards lets a hung open go.
    #[test]
    fn a_fifo_is_refused_without_waiting_for_a_writer() {
        let dir = tempfile::tempdir().unwrap();
        let fifo = dir.path().join("registries.conf");
        let made = std::process::Command::new("mkfifo").arg(&fifo).status();
        assert!(made.unwrap().success());
        let (tx, rx) = std::sync::mpsc::channel();
        let path = fifo.clone();
        std::thread::spawn(move || tx.send(MirrorsFrom::File(path).load().map(|_| ())));
        let got = rx.recv_timeout(std::time::Duration::from_secs(20));
        if got.is_err() {
            drop(std::fs::OpenOptions::new().write(true).open(&fifo));
            panic!("loading a FIFO as registries.conf still blocks after 20 s");
        }
        let e = got.unwrap().unwrap_err();
        let s = crate::error_chain::text(&e);
        assert!(
            s.contains(&fifo.display().to_string()) && s.contains("a FIFO"),
            "{s}"
        );
    }

    /// Issue 32, item 9: 2,000 mirrors cost 37 s of setup, 20,000 never finished. One registry
    /// lists at most [`MAX_MIRRORS`]; more is refused naming the registry, the count, the cap.
    #[test]
    fn mirrors_per_registry_are_capped() {
        let file = |n: usize| {
            let mut t = String::from("[[registry]]\nprefix = \"reg.example/stacks\"\n");
            for i in 0..n {
                t.push_str(&format!("[[registry.mirror]]\nlocation = \"m{i}.local\"\n"));
            }
            t
        };
        assert_eq!(
            conf(&file(MAX_MIRRORS)).entries[0].mirrors.len(),
            MAX_MIRRORS
        );
        for n in [MAX_MIRRORS + 1, 20_000] {
            let e = err(&file(n));
            assert!(
                e.contains(&format!(
                    "`registry[0]` (prefix `reg.example/stacks`) lists {n} mirrors, more than \
                     the {MAX_MIRRORS} accepted"
                )),
                "{e}"
            );
        }
    }

    /// Issue 32, item 11: prefixes that can never match were kept silently. Each is refused,
    /// naming the key, the prefix (escaped) and why; a location is held to the same grammar.
    #[test]
    fn prefixes_that_can_never_match_are_refused() {
        for (prefix, why) in [
            (
                "*.",
                "`*.` can never match a reference: `*.` needs a domain",
            ),
            ("REG.example", "upper-case `R`"),
            ("reg.example/Stacks", "upper-case `S`"),
            ("reg.example\\u0000", "`reg.example\\u{0}` can never match"),
            (
                "reg\\u001b[2J.example",
                "`reg\\u{1b}[2J.example` can never match",
            ),
            ("reg..example", "empty label"),
            ("reg.ex*ample", "leading `*.`"),
            ("*.*.example", "after `*.`"),
        ] {
            let e = err(&format!(
                "[[registry]]\nprefix = \"{prefix}\"\nlocation = \"x\"\n"
            ));
            assert!(
                e.contains("`registry[0].prefix`") && e.contains(why),
                "{prefix}: {e}"
            );
            assert!(!e.contains('\u{1b}') && !e.contains('\0'), "{e:?}");
        }
        let e =
            err("[[registry]]\nlocation = \"r\"\n[[registry.mirror]]\nlocation = \"M.local\"\n");
        assert!(
            e.contains("registry[0].mirror[0].location") && e.contains("not a registry location"),
            "{e}"
        );
        let e = err("[[registry]]\nprefix = \"r\"\nlocation = \"*.x\"\n");
        assert!(e.contains("cannot have a wildcard"), "{e}");
    }

    /// Issue 32, item 11: a TOML error quoted its whole line (a megabyte, escape sequences and
    /// all). Now 200 characters around the column, escaped, the cut said; an unknown key or a
    /// bad value from the file is cut and escaped the same way.
    #[test]
    fn a_toml_error_quotes_a_short_escaped_excerpt() {
        let mut text = String::from("[[registry]]\nlocation = \"x\"\nk = \"");
        text.push_str(&"A".repeat(1 << 19));
        text.push_str("\u{1b}]0;pwned\u{7}");
        text.push_str(&"B".repeat(1 << 19));
        text.push_str("\"\n");
        let e = err(&text);
        assert!(
            e.len() < 1000,
            "{} bytes: {}",
            e.len(),
            e.chars().take(1000).collect::<String>()
        );
        assert!(
            e.contains(&format!("line 3, column {}", 6 + (1 << 19))),
            "{e}"
        );
        assert!(e.contains("cut to 200 around the column"), "{e}");
        assert!(e.contains("AAAA\\u{1b}]0;pwned\\u{7}BBBB"), "{e}");
        assert!(!e.chars().any(|c| c.is_control() && c != '\n'), "{e:?}");
        // A short line is quoted whole.
        let e = err("[[registry]\nlocation = \"x\"");
        assert!(
            e.contains("line 1, column") && e.contains("reads `[[registry]`"),
            "{e}"
        );
        // A megabyte-long key, or value, named in a refusal.
        let key = format!("\"{}\\u001b\"", "k".repeat(1 << 19));
        let e = err(&format!("[[registry]]\nlocation = \"x\"\n{key} = 1\n"));
        assert!(e.len() < 1000 && e.contains("characters, cut"), "{e}");
        let value = "p".repeat(1 << 19);
        let e = err(&format!("[[registry]]\nlocation = \"x\"\n[[registry.mirror]]\nlocation = \"m\"\npull-from-mirror = \"{value}\"\n"));
        assert!(e.len() < 1000 && e.contains("characters, cut"), "{e}");
    }

    #[test]
    fn a_huge_file_is_refused_after_a_bounded_read() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("registries.conf");
        let mut text = String::from("# ");
        text.push_str(&"x".repeat(MAX_FILE as usize + 10));
        std::fs::write(&path, text).unwrap();
        let e = MirrorConfig::load(&path).unwrap_err();
        assert!(matches!(e, MirrorsError::TooLarge { .. }), "{e}");
        assert!(e.to_string().contains(&path.display().to_string()));
        // A device in its place is not read.
        let e = MirrorConfig::load(Path::new("/dev/zero")).unwrap_err();
        assert!(e.to_string().contains("/dev/zero"), "{e}");
        let e = MirrorsFrom::File(dir.path().join("none.conf"))
            .load()
            .unwrap_err();
        assert!(e.to_string().contains("none.conf"), "{e}");
        assert_eq!(MirrorsFrom::None.load().unwrap(), None);
    }
}
