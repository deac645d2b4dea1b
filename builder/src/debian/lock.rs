//! `stack.lock`: what every Debian-made layer was built from, so `ingot build --locked` installs
//! exactly that again. Per layer: the fingerprint of its manifest declaration, its kernel, each
//! archive suite's Release `Date`, and every installed package with its version, architecture
//! and the SHA-256 of its `.deb`. Written sorted, one package a line, so a lock diffs well.

use std::collections::BTreeMap;
use std::fmt::{self, Write as _};
use std::path::{Path, PathBuf};

use serde::Deserialize;

use super::cache::is_sha256_hex;
use crate::debian_spec::is_package_name;

/// The lock format's version (`version = 1`).
pub const LOCK_VERSION: u32 = 1;
/// The lock's file name, beside the manifest.
pub const LOCK_FILE: &str = "stack.lock";

/// One installed package as built.
#[derive(Debug, Clone, PartialEq, Eq, PartialOrd, Ord, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct LockedPackage {
    /// `Package`.
    pub name: String,
    /// `Architecture` (`amd64`, `all`, ...).
    pub architecture: String,
    /// `Version`, epoch included.
    pub version: String,
    /// SHA-256 of its `.deb` (lowercase hex).
    pub sha256: String,
    /// The archive's `Priority` when it overrides the `.deb`'s own (the archive's override file
    /// does that): mmdebstrap's variants select packages by it, so a locked build's repository
    /// must say the same.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub priority: Option<String>,
}

impl LockedPackage {
    /// `name:arch`, how apt and the lock's diff name it.
    pub fn key(&self) -> (String, String) {
        (self.name.clone(), self.architecture.clone())
    }
}

/// An archive suite's Release file `Date` when the layer was resolved.
#[derive(Debug, Clone, PartialEq, Eq, PartialOrd, Ord, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct SuiteDate {
    /// The suite as the manifest names it.
    pub suite: String,
    /// Its Release file's `Date` field, verbatim.
    pub date: String,
}

/// An operator input (`ingot build --input NAME=PATH`) a layer was built with.
#[derive(Debug, Clone, PartialEq, Eq, PartialOrd, Ord, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct LockedInput {
    /// The input's name, as the manifest's `inputs` names it.
    pub name: String,
    /// `sha256:…` of its files (`debian::integration::input_digest`).
    pub digest: String,
}

/// The operator inputs given for `spec`'s layer, as its lock entry records them.
pub fn given_of(spec: &crate::debian_spec::DebianSpec) -> Vec<LockedInput> {
    spec.given_inputs
        .iter()
        .map(|(name, g)| LockedInput {
            name: name.clone(),
            digest: g.digest.clone(),
        })
        .collect()
}

/// A lock entry for unit tests: layer `base`, libc6 alone.
#[cfg(test)]
pub(crate) fn sample() -> LayerLock {
    LayerLock {
        name: "base".into(),
        inputs: format!("sha256:{}", "0".repeat(64)),
        kernel: None,
        suites: Vec::new(),
        packages: vec![LockedPackage {
            name: "libc6".into(),
            architecture: "amd64".into(),
            version: "2.36-9+deb12u8".into(),
            sha256: "1".repeat(64),
            priority: None,
        }],
        given: Vec::new(),
        dkms: Vec::new(),
    }
}

/// One layer's pins.
#[derive(Debug, Clone, PartialEq, Eq, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct LayerLock {
    /// The layer's name.
    pub name: String,
    /// [`crate::debian_spec::DebianSpec::fingerprint`] of the declaration it was resolved for.
    pub inputs: String,
    /// The kernel release in `/usr/lib/modules` (none in a tree without a kernel).
    #[serde(default)]
    pub kernel: Option<String>,
    /// The suites' Release dates.
    #[serde(default)]
    pub suites: Vec<SuiteDate>,
    /// Every installed package.
    #[serde(default)]
    pub packages: Vec<LockedPackage>,
    /// The operator inputs it was built with, by digest (`--locked` takes no other).
    #[serde(default)]
    pub given: Vec<LockedInput>,
    /// The DKMS source packages its kernel modules were built from (not installed in the
    /// layer: built in a throw-away chroot for the kernel above).
    #[serde(default)]
    pub dkms: Vec<LockedPackage>,
}

/// A whole `stack.lock`.
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct Lock {
    /// The Debian-made layers, by name.
    pub layers: BTreeMap<String, LayerLock>,
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct RawLock {
    version: u32,
    #[serde(default, rename = "layer")]
    layers: Vec<LayerLock>,
}

/// Why a lock file was refused.
#[derive(Debug, thiserror::Error)]
#[error("{}: {reason}", file.display())]
pub struct LockError {
    /// The lock file.
    pub file: PathBuf,
    /// What is wrong.
    pub reason: String,
}

impl Lock {
    /// The lock beside `manifest`.
    pub fn path_for(manifest: &Path) -> PathBuf {
        manifest.with_file_name(LOCK_FILE)
    }

    /// Reads the lock at `path`; `Ok(None)` when there is none.
    pub fn load(path: &Path) -> Result<Option<Self>, LockError> {
        match std::fs::read_to_string(path) {
            Ok(text) => Self::parse(&text, path).map(Some),
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => Ok(None),
            Err(e) => Err(LockError {
                file: path.to_owned(),
                reason: format!("reading it: {e}"),
            }),
        }
    }

    /// Parses and checks a lock's text (`file` names it in errors).
    pub fn parse(text: &str, file: &Path) -> Result<Self, LockError> {
        let refuse = |reason: String| LockError {
            file: file.to_owned(),
            reason,
        };
        let raw: RawLock = toml::from_str(text).map_err(|e| refuse(e.to_string()))?;
        if raw.version != LOCK_VERSION {
            return Err(refuse(format!(
                "lock format version {} is not {LOCK_VERSION}, the one this ingot reads",
                raw.version
            )));
        }
        let mut layers = BTreeMap::new();
        for mut l in raw.layers {
            check_layer(&l).map_err(|r| refuse(format!("layer `{}`: {r}", l.name)))?;
            l.packages.sort();
            l.suites.sort();
            l.given.sort();
            l.dkms.sort();
            if let Some(old) = layers.insert(l.name.clone(), l) {
                return Err(refuse(format!("layer `{}` is locked twice", old.name)));
            }
        }
        Ok(Self { layers })
    }

    /// The lock's text: stable (layers, suites and packages sorted), one package a line.
    pub fn to_toml(&self) -> String {
        let q = |s: &str| toml::Value::String(s.to_owned()).to_string();
        let mut out = String::from(
            "# stack.lock: written by `ingot build`, read by `ingot build --locked`.\n\
             # Moved forward by `ingot build --update [PACKAGE...]`; not edited by hand.\n",
        );
        let _ = writeln!(out, "version = {LOCK_VERSION}");
        for l in self.layers.values() {
            let _ = writeln!(
                out,
                "\n[[layer]]\nname = {}\ninputs = {}",
                q(&l.name),
                q(&l.inputs)
            );
            if let Some(k) = &l.kernel {
                let _ = writeln!(out, "kernel = {}", q(k));
            }
            if !l.given.is_empty() {
                let mut given = l.given.clone();
                given.sort();
                out.push_str("given = [\n");
                for g in &given {
                    let _ = writeln!(
                        out,
                        "  {{ name = {}, digest = {} }},",
                        q(&g.name),
                        q(&g.digest)
                    );
                }
                out.push_str("]\n");
            }
            if !l.dkms.is_empty() {
                out.push_str("dkms = [\n");
                write_packages(&mut out, &l.dkms);
                out.push_str("]\n");
            }
            let mut suites = l.suites.clone();
            suites.sort();
            out.push_str("suites = [\n");
            for s in &suites {
                let _ = writeln!(
                    out,
                    "  {{ suite = {}, date = {} }},",
                    q(&s.suite),
                    q(&s.date)
                );
            }
            out.push_str("]\n");
            out.push_str("packages = [\n");
            write_packages(&mut out, &l.packages);
            out.push_str("]\n");
        }
        out
    }

    /// Writes the lock at `path` atomically (a temporary file beside it, renamed).
    pub fn write(&self, path: &Path) -> std::io::Result<()> {
        let dir = match path.parent() {
            Some(p) if !p.as_os_str().is_empty() => p,
            _ => Path::new("."),
        };
        let mut tmp = tempfile::Builder::new()
            .prefix(".stack.lock.")
            .tempfile_in(dir)?;
        std::io::Write::write_all(&mut tmp, self.to_toml().as_bytes())?;
        tmp.as_file().sync_all()?;
        tmp.persist(path).map_err(|e| e.error)?;
        Ok(())
    }
}

/// One line per package, sorted.
fn write_packages(out: &mut String, packages: &[LockedPackage]) {
    let q = |s: &str| toml::Value::String(s.to_owned()).to_string();
    let mut packages = packages.to_vec();
    packages.sort();
    for p in &packages {
        let priority = p
            .priority
            .as_ref()
            .map_or(String::new(), |v| format!(", priority = {}", q(v)));
        let _ = writeln!(
            out,
            "  {{ name = {}, architecture = {}, version = {}, sha256 = {}{priority} }},",
            q(&p.name),
            q(&p.architecture),
            q(&p.version),
            q(&p.sha256)
        );
    }
}

fn check_layer(l: &LayerLock) -> Result<(), String> {
    let fp = l.inputs.strip_prefix("sha256:").unwrap_or("");
    if !is_sha256_hex(fp) {
        return Err(format!(
            "`inputs` {:?} is not sha256:<64 lowercase hex>",
            l.inputs
        ));
    }
    let mut names = std::collections::BTreeSet::new();
    for g in &l.given {
        let who = format!("input `{}`", g.name);
        if !is_package_name(&g.name) {
            return Err(format!("{who}: not an input name"));
        }
        if !g.digest.strip_prefix("sha256:").is_some_and(is_sha256_hex) {
            return Err(format!(
                "{who}: digest {:?} is not sha256:<64 lowercase hex>",
                g.digest
            ));
        }
        if !names.insert(&g.name) {
            return Err(format!("{who} is listed twice"));
        }
    }
    check_packages(&l.packages)?;
    check_packages(&l.dkms)
}

fn check_packages(packages: &[LockedPackage]) -> Result<(), String> {
    let mut seen = std::collections::BTreeSet::new();
    for p in packages {
        let who = format!("package `{}`", p.name);
        if !is_package_name(&p.name) {
            return Err(format!("{who}: not a Debian package name"));
        }
        if p.version.is_empty()
            || p.version
                .chars()
                .any(|c| c.is_whitespace() || c.is_control())
        {
            return Err(format!(
                "{who}: version {:?} is not a Debian version",
                p.version
            ));
        }
        if p.architecture.is_empty()
            || !p
                .architecture
                .bytes()
                .all(|b| b.is_ascii_alphanumeric() || b == b'-')
        {
            return Err(format!(
                "{who}: architecture {:?} is not one",
                p.architecture
            ));
        }
        if !is_sha256_hex(&p.sha256) {
            return Err(format!(
                "{who}: sha256 {:?} is not 64 lowercase hex digits",
                p.sha256
            ));
        }
        if p.priority.as_ref().is_some_and(|v| {
            !v.bytes().all(|b| b.is_ascii_lowercase() || b == b'-') || v.is_empty()
        }) {
            return Err(format!("{who}: priority {:?} is not one", p.priority));
        }
        if !seen.insert(p.key()) {
            return Err(format!("{who} ({}) is listed twice", p.architecture));
        }
    }
    Ok(())
}

/// One package's or operator input's move between two locks of a layer.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Change {
    /// The package or input.
    pub name: String,
    /// The package's architecture; `None` for an operator input, whose versions are digests.
    pub architecture: Option<String>,
    /// Its version before (`None`: added).
    pub old: Option<String>,
    /// Its version after (`None`: removed).
    pub new: Option<String>,
}

impl Change {
    /// Whether it is a package's (not an input's).
    pub fn is_package(&self) -> bool {
        self.architecture.is_some()
    }
}

impl fmt::Display for Change {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let what = match &self.architecture {
            Some(arch) => format!("{}:{arch}", self.name),
            None => format!("input {}", self.name),
        };
        match (&self.old, &self.new) {
            (Some(o), Some(n)) if o == n => {
                write!(f, "Rebuilt  {what} {o} (new .deb bytes)")
            }
            (Some(o), Some(n)) => write!(f, "Updating {what} {o} -> {n}"),
            (None, Some(n)) => write!(f, "Adding   {what} {n}"),
            (Some(o), None) => write!(f, "Removing {what} {o}"),
            (None, None) => Ok(()),
        }
    }
}

/// What changed from `old` to `new` (packages by name and architecture, sorted, then the
/// operator inputs by name), as `ingot build --update` prints it. A package whose version stays
/// but whose `.deb` hash changed (a rebuilt file) is listed too.
pub fn diff(old: &LayerLock, new: &LayerLock) -> Vec<Change> {
    let mut out = diff_packages(old, new);
    out.extend(diff_given(&old.given, &new.given));
    out
}

/// The operator inputs that differ between `old` and `new`, by name.
pub fn diff_given(old: &[LockedInput], new: &[LockedInput]) -> Vec<Change> {
    let index = |g: &[LockedInput]| -> BTreeMap<String, String> {
        g.iter()
            .map(|i| (i.name.clone(), i.digest.clone()))
            .collect()
    };
    let (o, n) = (index(old), index(new));
    let names: std::collections::BTreeSet<&String> = o.keys().chain(n.keys()).collect();
    names
        .into_iter()
        .filter(|k| o.get(*k) != n.get(*k))
        .map(|k| Change {
            name: k.clone(),
            architecture: None,
            old: o.get(k).cloned(),
            new: n.get(k).cloned(),
        })
        .collect()
}

fn diff_packages(old: &LayerLock, new: &LayerLock) -> Vec<Change> {
    let index = |l: &LayerLock| -> BTreeMap<(String, String), (String, String)> {
        l.packages
            .iter()
            .map(|p| (p.key(), (p.version.clone(), p.sha256.clone())))
            .collect()
    };
    let (o, n) = (index(old), index(new));
    let mut keys: Vec<_> = o.keys().chain(n.keys()).cloned().collect();
    keys.sort();
    keys.dedup();
    keys.into_iter()
        .filter(|k| o.get(k) != n.get(k))
        .map(|k| Change {
            old: o.get(&k).map(|v| v.0.clone()),
            new: n.get(&k).map(|v| v.0.clone()),
            name: k.0,
            architecture: Some(k.1),
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    fn pkg(name: &str, version: &str, fill: char) -> LockedPackage {
        LockedPackage {
            name: name.into(),
            architecture: "amd64".into(),
            version: version.into(),
            sha256: fill.to_string().repeat(64),
            priority: None,
        }
    }

    fn layer(packages: Vec<LockedPackage>) -> LayerLock {
        LayerLock {
            name: "base".into(),
            inputs: format!("sha256:{}", "e".repeat(64)),
            kernel: Some("6.1.0-28-amd64".into()),
            suites: vec![
                SuiteDate {
                    suite: "bookworm-security".into(),
                    date: "Sat, 09 Nov 2024 10:45:46 UTC".into(),
                },
                SuiteDate {
                    suite: "bookworm".into(),
                    date: "Sat, 09 Nov 2024 10:24:17 UTC".into(),
                },
            ],
            packages,
            given: Vec::new(),
            dkms: Vec::new(),
        }
    }

    #[test]
    fn round_trip_is_sorted_and_stable() {
        let mut lock = Lock::default();
        let mut apt = pkg("apt", "2.6.1", 'c');
        apt.priority = Some("required".into());
        let l = layer(vec![
            pkg("zlib1g", "1:1.2.13.dfsg-1", 'a'),
            pkg("base-files", "12.4+deb12u8", 'b'),
            apt,
        ]);
        lock.layers.insert(l.name.clone(), l);
        let text = lock.to_toml();
        let base = text.find("\"base-files\"").unwrap();
        let zlib = text.find("\"zlib1g\"").unwrap();
        assert!(base < zlib, "packages sorted by name:\n{text}");
        assert!(text.find("\"bookworm\"").unwrap() < text.find("\"bookworm-security\"").unwrap());
        let back = Lock::parse(&text, Path::new("stack.lock")).unwrap();
        assert_eq!(
            back.to_toml(),
            text,
            "written, read and written again: the same bytes"
        );
        assert_eq!(back.layers["base"].packages[2].version, "1:1.2.13.dfsg-1");
        assert_eq!(
            back.layers["base"].packages[0].priority.as_deref(),
            Some("required")
        );
        assert!(text.contains("sha256 = \"cccccccccccccccccccccccccccccccccccccccccccccccccccccccccccccccc\", priority = \"required\" },"), "{text}");
        assert_eq!(
            back.layers["base"].kernel.as_deref(),
            Some("6.1.0-28-amd64")
        );
        assert!(text.contains(
            "  { name = \"zlib1g\", architecture = \"amd64\", version = \"1:1.2.13.dfsg-1\", sha256 = \"aaaa"
        ), "{text}");
    }

    #[test]
    fn bad_locks_are_refused_naming_the_problem() {
        let mut lock = Lock::default();
        let l = layer(vec![pkg("libc6", "2.36-9+deb12u8", 'c')]);
        lock.layers.insert(l.name.clone(), l);
        let good = lock.to_toml();
        let cases = [
            ("version = 1", "version = 2", "lock format version 2"),
            (
                "cccccccccccccccc",
                "CCCCCCCCCCCCCCCC",
                "package `libc6`: sha256",
            ),
            (
                "name = \"libc6\"",
                "name = \"Libc6\"",
                "not a Debian package name",
            ),
            (
                "version = \"2.36-9+deb12u8\"",
                "version = \"2.36 9\"",
                "not a Debian version",
            ),
            ("inputs = \"sha256:", "inputs = \"md5:", "`inputs`"),
            (
                "kernel =",
                "colour = \"red\"\nkernel =",
                "unknown field `colour`",
            ),
        ];
        for (from, to, want) in cases {
            assert!(good.contains(from), "{from}");
            let err =
                Lock::parse(&good.replacen(from, to, 1), Path::new("/x/stack.lock")).unwrap_err();
            let shown = err.to_string();
            assert!(shown.starts_with("/x/stack.lock: "), "{shown}");
            assert!(shown.contains(want), "want `{want}` in {shown}");
        }
        let twice = good.replace(
            "packages = [\n",
            &format!("packages = [\n  {{ name = \"libc6\", architecture = \"amd64\", version = \"1\", sha256 = \"{}\" }},\n", "d".repeat(64)),
        );
        let err = Lock::parse(&twice, Path::new("stack.lock")).unwrap_err();
        assert!(err.to_string().contains("listed twice"), "{err}");
    }

    #[test]
    fn diff_lists_updates_additions_removals_and_rebuilds() {
        let old = layer(vec![
            pkg("libc6", "2.36-9+deb12u8", 'a'),
            pkg("gone", "1", 'b'),
            pkg("same", "1", 'c'),
            pkg("rebuilt", "2", 'd'),
        ]);
        let new = layer(vec![
            pkg("libc6", "2.36-9+deb12u9", 'e'),
            pkg("added", "3", 'f'),
            pkg("same", "1", 'c'),
            pkg("rebuilt", "2", '9'),
        ]);
        let shown: Vec<String> = diff(&old, &new).iter().map(ToString::to_string).collect();
        assert_eq!(
            shown,
            [
                "Adding   added:amd64 3",
                "Removing gone:amd64 1",
                "Updating libc6:amd64 2.36-9+deb12u8 -> 2.36-9+deb12u9",
                "Rebuilt  rebuilt:amd64 2 (new .deb bytes)",
            ]
        );
        assert!(diff(&old, &old).is_empty());
    }

    fn input(name: &str, fill: char) -> LockedInput {
        LockedInput {
            name: name.into(),
            digest: format!("sha256:{}", fill.to_string().repeat(64)),
        }
    }

    #[test]
    fn operator_inputs_are_locked_by_digest_and_their_moves_listed() {
        let mut l = layer(vec![pkg("libc6", "2.36-9+deb12u8", 'c')]);
        l.given = vec![input("kubernetes", 'a'), input("images", 'b')];
        let mut lock = Lock::default();
        lock.layers.insert(l.name.clone(), l.clone());
        let text = lock.to_toml();
        assert!(
            text.contains(&format!(
                "given = [\n  {{ name = \"images\", digest = \"sha256:{}\" }},\n",
                "b".repeat(64)
            )),
            "{text}"
        );
        let back = Lock::parse(&text, Path::new("stack.lock")).unwrap();
        assert_eq!(back.to_toml(), text);
        assert_eq!(back.layers["base"].given.len(), 2);

        // A layer with no inputs writes no `given` line: locks made before it read the same.
        let mut none = lock.clone();
        none.layers.get_mut("base").unwrap().given.clear();
        assert!(!none.to_toml().contains("given"));

        let bad = [
            (
                format!("sha256:{}", "b".repeat(64)),
                "sha256:B".to_owned(),
                "input `images`: digest",
            ),
            (
                "name = \"images\"".to_owned(),
                "name = \"kubernetes\"".to_owned(),
                "input `kubernetes` is listed twice",
            ),
            (
                "name = \"images\"".to_owned(),
                "name = \"Images\"".to_owned(),
                "not an input name",
            ),
        ];
        for (from, to, want) in bad {
            let err = Lock::parse(&text.replacen(&from, &to, 1), Path::new("stack.lock"))
                .unwrap_err()
                .to_string();
            assert!(err.contains(want), "want `{want}` in {err}");
        }

        let mut new = l.clone();
        new.given = vec![input("kubernetes", 'd'), input("toolkit", 'e')];
        let shown: Vec<String> = diff(&l, &new).iter().map(ToString::to_string).collect();
        let [a, b, d, e] = ["a", "b", "d", "e"].map(|c| format!("sha256:{}", c.repeat(64)));
        assert_eq!(
            shown,
            [
                format!("Removing input images {b}"),
                format!("Updating input kubernetes {a} -> {d}"),
                format!("Adding   input toolkit {e}"),
            ]
        );
        assert!(diff(&l, &new).iter().all(|c| !c.is_package()));
    }
}
