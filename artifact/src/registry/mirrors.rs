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

use std::io::Read;
use std::path::{Path, PathBuf};

pub use super::mirrors_error::{MirrorsError, MAX_FILE};
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
            key: key.to_owned(),
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

    /// A `location` or `prefix`: `host[:port][/path][:tag|@digest]`, no scheme, no trailing `/`.
    fn location(&self, key: &str, v: &toml::Value) -> Result<String, MirrorsError> {
        let s = self.string(key, v)?;
        let s = s.trim_end_matches('/').to_owned();
        if s.contains("://") {
            return Err(self.invalid(
                key,
                format!("`{s}` has a scheme; a location is host[:port][/path]"),
            ));
        }
        if s.chars().any(char::is_whitespace) {
            return Err(self.invalid(key, format!("`{s}` contains white space")));
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
                                    "`{other}` is not one of \"all\", \"digest-only\", \
                                     \"tag-only\""
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
        for (k, v) in t {
            let kp = key_path(key, k);
            match k.as_str() {
                "prefix" => entry.prefix = self.location(&kp, v)?,
                "location" => entry.location = self.location(&kp, v)?,
                "insecure" => entry.insecure = self.boolean(&kp, v)?,
                "blocked" => entry.blocked = self.boolean(&kp, v)?,
                "mirror-by-digest-only" => by_digest_only = self.boolean(&kp, v)?,
                "mirror" => {
                    for (i, m) in self.tables(&kp, v)?.into_iter().enumerate() {
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
        if entry.prefix.starts_with("*.") {
            if entry.prefix[2..].contains(['/', ':', '@', '*']) {
                return Err(self.invalid(
                    &key_path(key, "prefix"),
                    "a wildcard prefix is `*.host` only, with no port or path",
                ));
            }
            if !entry.location.is_empty() {
                return Err(self.invalid(
                    &key_path(key, "location"),
                    "must not be set with a wildcard prefix",
                ));
            }
        } else if entry.prefix.contains('*') {
            return Err(self.invalid(
                &key_path(key, "prefix"),
                "`*` is only allowed as a leading `*.`",
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

impl MirrorConfig {
    /// Reads and parses `path` (at most [`MAX_FILE`] bytes).
    pub fn load(path: &Path) -> Result<MirrorConfig, MirrorsError> {
        let read = |source| MirrorsError::Read {
            path: path.to_owned(),
            source,
        };
        let file = std::fs::File::open(path).map_err(read)?;
        if !file.metadata().map_err(read)?.is_file() {
            return Err(read(std::io::Error::other("not a regular file")));
        }
        let mut text = String::new();
        file.take(MAX_FILE + 1)
            .read_to_string(&mut text)
            .map_err(read)?;
        if text.len() as u64 > MAX_FILE {
            return Err(MirrorsError::TooLarge {
                path: path.to_owned(),
            });
        }
        MirrorConfig::parse(&text, path)
    }

    /// Parses registries.conf text; `path` names it in errors.
    pub fn parse(text: &str, path: &Path) -> Result<MirrorConfig, MirrorsError> {
        let table: toml::Table = toml::from_str(text).map_err(|source| MirrorsError::Toml {
            path: path.to_owned(),
            source,
        })?;
        let r = Reader { path };
        if table.contains_key("registries") {
            if let Some(k) = table.keys().find(|k| *k != "registries") {
                return Err(MirrorsError::Mixed {
                    path: path.to_owned(),
                    v2_key: k.clone(),
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
        for (k, v) in &table {
            match k.as_str() {
                "registry" => {
                    for (i, t) in r.tables(k, v)?.into_iter().enumerate() {
                        let key = format!("registry[{i}]");
                        let entry = r.entry(&key, t)?;
                        if entries.iter().any(|e| e.prefix == entry.prefix) {
                            return Err(r.invalid(
                                &key,
                                format!("prefix `{}` is configured twice", entry.prefix),
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
        // A FIFO or a device in its place is not read.
        let e = MirrorConfig::load(Path::new("/dev/zero")).unwrap_err();
        assert!(e.to_string().contains("/dev/zero"), "{e}");
        let e = MirrorsFrom::File(dir.path().join("none.conf"))
            .load()
            .unwrap_err();
        assert!(e.to_string().contains("none.conf"), "{e}");
        assert_eq!(MirrorsFrom::None.load().unwrap(), None);
    }
}
