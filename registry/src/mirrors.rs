//! Registry mirrors and pull-through caches, configured as skopeo and podman are: a
//! `containers-registries.conf(5)` file in its version 2 format, with the drop-in files of
//! `registries.conf.d/` applied (`locate`). This module owns answering "which sources, in which
//! order, for this reference"; reading one file is `file`'s job, trying the sources the
//! client's (`fallback`).
//!
//! The semantics are containers/image's (`sysregistriesv2`, v5.23), checked against skopeo
//! 1.9.3 with the same files by `builder/tests/registries_compat.rs`:
//! - a reference's name (`host/repository`, without its tag or digest) is matched against every
//!   `[[registry]]`'s `prefix`; the prefix must be followed by the end or `/`; the longest
//!   prefix wins, and between equally long ones the first in prefix order (`*.x` before `w.x`);
//!   `*.example.com` matches every host below `example.com`;
//! - `location` replaces the matched prefix (the primary source; default the reference itself);
//! - `[[registry.mirror]]` locations replace the prefix too and are tried first, in order;
//!   `pull-from-mirror` (`all`, default; `digest-only`; `tag-only`) or the registry's
//!   `mirror-by-digest-only` decide whether a mirror is used for a request by digest or by tag;
//! - every rewritten name is looked up again for `blocked`: a mirror whose name falls under a
//!   blocked entry is skipped, a primary location that does is blocked (a source's `insecure`
//!   is its own entry's alone);
//! - `insecure = true`: plain HTTP allowed, and TLS without certificate checks (the client
//!   tries TLS first, then plain HTTP); `blocked = true`: pulling a matching reference is
//!   refused.
//!
//! ingot departs from containers/image where it keeps a deliberate improvement, each listed
//! with its reason in `docs/registry.md` ("Departures from containers/image"): a host-only
//! prefix never matches another port, a wildcard's match covers the port, a prefix that could
//! never match and an unknown key are refused, mirrors are capped at [`MAX_MIRRORS`], and the
//! sources are tried per request rather than once per image.
//!
//! The stack's signature travels inside the artifact, so any copy is as good as the origin:
//! every byte a mirror serves is checked against the signed digests. ingot always fetches blobs
//! by digest, so blobs follow the digest rule, and a tag follows the tag rule.

mod file;
mod locate;
mod names;

use std::path::{Path, PathBuf};

pub use crate::mirrors_error::{MirrorsError, MAX_FILE, MAX_MIRRORS};
use crate::reference::{RegistryRef, SCHEME};
pub use locate::{DEFAULT_PATH, ENV};

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
    /// Plain HTTP allowed, and TLS without certificate checks.
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
    /// Plain HTTP allowed, and TLS without certificate checks.
    pub insecure: bool,
    /// Pulls refused.
    pub blocked: bool,
    /// Mirrors, in order.
    pub mirrors: Vec<Mirror>,
    /// The file it comes from (the main file or a drop-in).
    pub from: PathBuf,
}

/// A registries configuration: the main file with its drop-ins applied.
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct MirrorConfig {
    /// The main file (for messages).
    pub path: PathBuf,
    /// Every file read, the main file first, then the drop-ins in the order applied.
    pub files: Vec<PathBuf>,
    /// The `[[registry]]` tables, sorted by prefix, one per prefix.
    pub entries: Vec<Entry>,
}

/// One place to pull a reference from.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct PullSource {
    /// The reference as this source names it (location rewritten).
    pub reference: RegistryRef,
    /// Marked `insecure` by its own entry (the mirror's, or the registry's for the primary
    /// location): plain HTTP allowed, and TLS without certificate checks.
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

impl MirrorConfig {
    /// Reads and parses one file, without drop-ins (at most [`MAX_FILE`] bytes; only a regular
    /// file, opened without blocking).
    pub fn load(path: &Path) -> Result<MirrorConfig, MirrorsError> {
        MirrorConfig::parse(&file::read(path)?, path)
    }

    /// Parses registries.conf text; `path` names it in errors.
    pub fn parse(text: &str, path: &Path) -> Result<MirrorConfig, MirrorsError> {
        Ok(MirrorConfig {
            path: path.to_owned(),
            files: vec![path.to_owned()],
            entries: file::parse(text, path, false)?,
        })
    }

    /// Applies a drop-in file as containers/image does: each of its entries replaces the entry
    /// with the same prefix (whole, mirrors included), the others are added; the result stays
    /// sorted by prefix.
    fn apply(&mut self, path: &Path, entries: Vec<Entry>) {
        for e in entries {
            match self.entries.iter_mut().find(|o| o.prefix == e.prefix) {
                Some(old) => *old = e,
                None => self.entries.push(e),
            }
        }
        self.entries.sort_by(|a, b| a.prefix.cmp(&b.prefix));
        self.files.push(path.to_owned());
    }

    /// The `[[registry]]` a name (`host/repository`) falls under, and the length of the part
    /// of it the prefix matched. Ties go to the first entry in prefix order, as in
    /// containers/image (a later entry wins only when strictly longer).
    fn matching(&self, name: &str) -> Option<(&Entry, usize)> {
        let host_end = name.find('/').unwrap_or(name.len());
        let mut best: Option<(&Entry, usize)> = None;
        for e in &self.entries {
            let len = if let Some(domain) = e.prefix.strip_prefix("*.") {
                // The host without its port must end in `.domain`; the match covers the port
                // (containers/image stops before it and then rewrites to a name that does not
                // parse).
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
                // `/` or the end after the prefix: a host-only prefix never matches another
                // port (containers/image lets `example.com` match `example.com:5000`, marked
                // "DON'T RELY" in its code).
                match name.strip_prefix(e.prefix.as_str()) {
                    Some(rest) if rest.is_empty() || rest.starts_with('/') => e.prefix.len(),
                    _ => continue,
                }
            };
            if best.is_none_or(|(b, _)| e.prefix.len() > b.prefix.len()) {
                best = Some((e, len));
            }
        }
        best
    }

    /// The entry that blocks a rewritten (physical) name, if one does. Only `blocked` is
    /// looked up again: a source is `insecure` by its own entry alone (containers/image sets
    /// a pull source's TLS settings from its endpoint, over what the lookup found).
    fn blocking(&self, reference: &RegistryRef) -> Option<&Entry> {
        self.matching(&name_of(reference))
            .map(|(e, _)| e)
            .filter(|e| e.blocked)
    }

    /// The sources of `reference`, in the order to try them: the mirrors allowed for a
    /// request by digest (`by_digest`) or by tag, then the primary location. A mirror whose
    /// rewritten name is blocked is left out; a primary location that is blocked is left out
    /// too, and refused when no mirror is left.
    pub fn pull_sources(
        &self,
        reference: &RegistryRef,
        by_digest: bool,
    ) -> Result<Vec<PullSource>, MirrorsError> {
        let shown = reference.to_string();
        let Some((entry, matched)) = self.matching(&name_of(reference)) else {
            return Ok(vec![PullSource {
                reference: reference.clone(),
                insecure: false,
                mirror: false,
            }]);
        };
        if entry.blocked {
            return Err(MirrorsError::Blocked {
                reference: shown,
                prefix: entry.prefix.clone(),
                path: entry.from.clone(),
            });
        }
        let rest = &shown[SCHEME.len() + matched..];
        let rewrite = |location: &str| -> Result<RegistryRef, MirrorsError> {
            let rewritten = format!("{SCHEME}{location}{rest}");
            rewritten.parse().map_err(|_| MirrorsError::Rewrite {
                reference: shown.clone(),
                location: location.to_owned(),
                rewritten: rewritten.clone(),
                path: entry.from.clone(),
            })
        };
        let mut out = Vec::new();
        for m in entry
            .mirrors
            .iter()
            .filter(|m| m.pull_from_mirror.allows(by_digest))
        {
            let r = rewrite(&m.location)?;
            if let Some(p) = self.blocking(&r) {
                tracing::debug!("mirror {r}: blocked by prefix `{}`; skipped", p.prefix);
                continue;
            }
            out.push(PullSource {
                insecure: m.insecure,
                reference: r,
                mirror: true,
            });
        }
        let r = if entry.location.is_empty() {
            reference.clone()
        } else {
            rewrite(&entry.location)?
        };
        match self.blocking(&r) {
            Some(p) if out.is_empty() => {
                return Err(MirrorsError::BlockedLocation {
                    location: name_of(&r),
                    reference: shown.clone(),
                    prefix: p.prefix.clone(),
                    path: p.from.clone(),
                })
            }
            Some(p) => tracing::debug!("{r}: blocked by prefix `{}`; only mirrors", p.prefix),
            None => out.push(PullSource {
                insecure: entry.insecure,
                reference: r,
                mirror: false,
            }),
        }
        Ok(out)
    }
}

/// `host[:port]/repository`: what a prefix is matched against.
fn name_of(reference: &RegistryRef) -> String {
    format!("{}/{}", reference.registry, reference.repository)
}

/// Where the registries configuration comes from (`--registries-conf`).
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub enum MirrorsFrom {
    /// As containers/image finds it: the file `CONTAINERS_REGISTRIES_CONF` names, else
    /// `$HOME/.config/containers/registries.conf`, else [`DEFAULT_PATH`] if it exists; with the
    /// drop-ins (`locate`). None when no file exists.
    #[default]
    Default,
    /// No configuration: every reference from its own registry.
    None,
    /// This file (it must exist), with the drop-ins of the system's and the user's
    /// `registries.conf.d/`, as skopeo's `--registries-conf` reads it.
    File(PathBuf),
    /// This registries.conf text, alone; `from` names it in errors (the writer's settings).
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
        let files = match self {
            MirrorsFrom::None => return Ok(None),
            MirrorsFrom::Text { text, from } => return MirrorConfig::parse(text, from).map(Some),
            MirrorsFrom::File(p) => locate::Files::explicit(p, locate::home().as_deref()),
            MirrorsFrom::Default => match std::env::var_os(ENV).filter(|v| !v.is_empty()) {
                Some(p) => locate::Files::explicit(Path::new(&p), locate::home().as_deref()),
                None => locate::Files::default_for(locate::home().as_deref()),
            },
        };
        files.load()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// `text` parsed as `/t/registries.conf` (also for `file`'s tests).
    pub(super) fn conf(text: &str) -> MirrorConfig {
        MirrorConfig::parse(text, Path::new("/t/registries.conf")).unwrap()
    }

    /// Why `text` is refused, the file named (also for `file`'s tests).
    pub(super) fn err(text: &str) -> String {
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
        // A prefix naming a tag could never match: refused.
        let e =
            err("[[registry]]\nprefix = \"reg.example/app:v1\"\nlocation = \"old.example/app\"\n");
        assert!(e.contains("without its tag or digest"), "{e}");
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
        // A wildcard with a location (accepted by containers/image too): the host and its
        // port are replaced.
        let c = conf("[[registry]]\nprefix = \"*.example.com\"\nlocation = \"x.local\"\n");
        assert_eq!(
            locations(&c, "oci://a.example.com:443/x/y:1", false),
            ["oci://x.local/x/y:1"]
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

    /// containers/image's rules: ties by prefix order, the first of a repeated prefix, a
    /// conflict under one location refused, and every rewritten name looked up again for
    /// `blocked` and `insecure`.
    #[test]
    fn containers_image_rules_for_ties_repeats_conflicts_and_rewritten_names() {
        // `*.origin.invalid` sorts before `w.origin.invalid` (same length) and wins the tie.
        let c = conf(
            "[[registry]]\nprefix = \"w.origin.invalid\"\nlocation = \"exact.local\"\n\
             [[registry]]\nprefix = \"*.origin.invalid\"\nlocation = \"wild.local\"\n",
        );
        assert_eq!(
            locations(&c, "oci://w.origin.invalid/x:1", false),
            ["oci://wild.local/x:1"]
        );
        // A repeated prefix: the first entry is used.
        let c = conf(
            "[[registry]]\nprefix = \"a.invalid\"\nlocation = \"first.local\"\n\
             [[registry]]\nprefix = \"a.invalid\"\nlocation = \"second.local\"\n",
        );
        assert_eq!(
            locations(&c, "oci://a.invalid/x:1", false),
            ["oci://first.local/x:1"]
        );
        // One location, two `insecure` settings.
        let e = err(
            "[[registry]]\nprefix = \"a.invalid\"\nlocation = \"l.local\"\n\
             [[registry]]\nprefix = \"b.invalid\"\nlocation = \"l.local\"\ninsecure = true\n",
        );
        assert!(e.contains("`l.local`") && e.contains("`insecure`"), "{e}");
        // Rewritten names: a mirror under a blocked entry is skipped, an origin under one is
        // blocked once no mirror is left; an entry marking the location insecure does not
        // make the source insecure (its own entry does).
        let c = conf(
            r#"
[[registry]]
prefix = "origin.invalid"
location = "real.local/o"
[[registry.mirror]]
location = "bad.local/m"
[[registry.mirror]]
location = "lab.local/m"
[[registry]]
prefix = "bad.local"
location = "bad.local"
blocked = true
[[registry]]
prefix = "lab.local"
location = "lab.local"
insecure = true
[[registry]]
prefix = "gone.invalid"
location = "bad.local/g"
"#,
        );
        let s = c
            .pull_sources(&r("oci://origin.invalid/x:1"), false)
            .unwrap();
        let got: Vec<_> = s.iter().map(|s| (s.location(), s.insecure)).collect();
        assert_eq!(
            got,
            [
                ("lab.local/m/x".to_owned(), false),
                ("real.local/o/x".to_owned(), false)
            ]
        );
        let e = c
            .pull_sources(&r("oci://gone.invalid/x:1"), false)
            .unwrap_err();
        assert!(e.to_string().contains("`bad.local/g/x` is blocked"), "{e}");
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
}
