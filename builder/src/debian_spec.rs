//! A layer's `source.debian` in the manifest: which archives, which packages, how mmdebstrap
//! installs them. Checked here; the manifest module points errors at the file and line.

use serde::{Deserialize, Serialize};
use sha2::{Digest, Sha256};

/// mmdebstrap's variants that make a tree apt and dpkg installed into (`extract`, `custom` and
/// `-` install nothing but what is named, without maintainer scripts or with none at all).
pub const VARIANTS: &[&str] = &[
    "essential",
    "apt",
    "required",
    "minbase",
    "buildd",
    "important",
    "debootstrap",
    "standard",
];

/// The variant when the manifest names none (the Debian node base's).
pub const DEFAULT_VARIANT: &str = "minbase";

/// One archive apt reads: a mirror, its suites and components (one `deb` line per suite).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Archive {
    /// `http://`, `https://` or `file://` URL of the archive's root.
    pub mirror: String,
    /// e.g. `bookworm`, `bookworm-updates`.
    pub suites: Vec<String>,
    /// e.g. `main`, `non-free-firmware`.
    pub components: Vec<String>,
}

/// How a layer's tree is made from Debian packages.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct DebianSpec {
    /// mmdebstrap's `--variant` (one of [`VARIANTS`]; default [`DEFAULT_VARIANT`]).
    #[serde(default = "default_variant")]
    pub variant: String,
    /// The archives, in order; the first suite of the first archive is mmdebstrap's SUITE.
    #[serde(rename = "archive")]
    pub archives: Vec<Archive>,
    /// Packages installed beside the variant's (names only: the versions are in stack.lock).
    #[serde(default)]
    pub packages: Vec<String>,
    /// dpkg `--path-exclude` globs (files packages ship that the layer leaves out).
    #[serde(default)]
    pub path_exclude: Vec<String>,
    /// dpkg `--path-include` globs (taken back from what `path_exclude` left out).
    #[serde(default)]
    pub path_include: Vec<String>,
    /// Make the tree a bootable ingot base after mmdebstrap (the initrd with ingot's boot
    /// contract, the boot loaders, the systemd units: `debian::integration`). Base
    /// layers only. Left out of the fingerprint when false, so locks made before it stay valid.
    #[serde(default, skip_serializing_if = "is_false")]
    pub boot_integration: bool,
    /// The operator inputs given for this layer (`ingot build --input NAME=PATH`), by name:
    /// filled by the build, never read from the manifest, and not part of the fingerprint (a
    /// new kubelet does not make the locked packages stale).
    #[serde(skip)]
    pub given_inputs: std::collections::BTreeMap<String, GivenInput>,
}

/// The operator input that carries kubeadm, kubelet and kubectl.
pub const KUBERNETES_INPUT: &str = "kubernetes";

/// The operator inputs ingot knows how to put in a layer, and what each gives.
pub const KNOWN_INPUTS: &[(&str, &str)] = &[(
    KUBERNETES_INPUT,
    "kubeadm and kubelet (with its unit, enabled)",
)];

/// An operator input given on the command line for a layer.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct GivenInput {
    /// Where it is.
    pub path: std::path::PathBuf,
    /// `sha256:…` of its files (`debian::integration::input_digest`).
    pub digest: String,
}

fn is_false(b: &bool) -> bool {
    !*b
}

fn default_variant() -> String {
    DEFAULT_VARIANT.to_owned()
}

/// What is wrong with a `source.debian`: the field (its TOML key path below `debian`) and why.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("source.debian.{field}: {reason}")]
pub struct SpecError {
    /// e.g. `archive[1].suites[0]`, `packages[3]`.
    pub field: String,
    /// What is wrong.
    pub reason: String,
}

fn bad(field: impl Into<String>, reason: impl Into<String>) -> SpecError {
    SpecError {
        field: field.into(),
        reason: reason.into(),
    }
}

/// A Debian package name (Debian Policy 5.6.1): lowercase letters, digits, `+`, `-`, `.`, at
/// least two characters, starting with a letter or digit.
pub fn is_package_name(s: &str) -> bool {
    s.len() >= 2
        && s.len() <= 128
        && s.bytes()
            .next()
            .is_some_and(|b| b.is_ascii_lowercase() || b.is_ascii_digit())
        && s.bytes()
            .all(|b| b.is_ascii_lowercase() || b.is_ascii_digit() || b"+-.".contains(&b))
}

/// A suite or component name: letters, digits, `-`, `.`, `_`, `/` (as in `bookworm/updates`).
fn is_archive_word(s: &str) -> bool {
    !s.is_empty()
        && s.len() <= 64
        && s.bytes()
            .all(|b| b.is_ascii_alphanumeric() || b"-._/".contains(&b))
        && !s.starts_with(['-', '/'])
}

impl DebianSpec {
    /// Checks every field; the first problem is returned, naming its field.
    pub fn check(&self) -> Result<(), SpecError> {
        if !VARIANTS.contains(&self.variant.as_str()) {
            return Err(bad(
                "variant",
                format!(
                    "`{}` is not one of mmdebstrap's variants {}",
                    self.variant,
                    VARIANTS.join(", ")
                ),
            ));
        }
        if self.archives.is_empty() {
            return Err(bad(
                "archive",
                "at least one [[...debian.archive]] (mirror, suites, components) is needed",
            ));
        }
        for (i, a) in self.archives.iter().enumerate() {
            check_archive(i, a)?;
        }
        let mut seen = std::collections::BTreeSet::new();
        for (i, p) in self.packages.iter().enumerate() {
            let field = format!("packages[{i}]");
            if p.contains('=') {
                return Err(bad(
                    field,
                    format!(
                        "`{p}`: name the package only; its version is pinned in stack.lock \
                         (`ingot build --update {}` moves it)",
                        p.split('=').next().unwrap_or(p)
                    ),
                ));
            }
            if !is_package_name(p) {
                return Err(bad(
                    field,
                    format!(
                        "`{p}` is not a Debian package name (a-z, 0-9, `+`, `-`, `.`, at least \
                         two characters)"
                    ),
                ));
            }
            if !seen.insert(p) {
                return Err(bad(field, format!("`{p}` is listed twice")));
            }
        }
        for (key, globs) in [
            ("path_exclude", &self.path_exclude),
            ("path_include", &self.path_include),
        ] {
            for (i, g) in globs.iter().enumerate() {
                if !g.starts_with('/') || g.chars().any(|c| c.is_control() || c.is_whitespace()) {
                    return Err(bad(
                        format!("{key}[{i}]"),
                        format!(
                            "`{g}` must be an absolute glob without spaces (like /usr/share/doc/*)"
                        ),
                    ));
                }
            }
        }
        Ok(())
    }

    /// The suite mmdebstrap is given: the first archive's first suite.
    pub fn main_suite(&self) -> &str {
        &self.archives[0].suites[0]
    }

    /// `sha256:…` of everything here: stack.lock records it, and a lock made for other inputs is
    /// not used by `--locked`.
    pub fn fingerprint(&self) -> String {
        let json = serde_json::to_vec(self).expect("plain data serializes");
        format!("sha256:{}", hex::encode(Sha256::digest(json)))
    }

    /// apt's sources: one `deb` line per archive and suite.
    pub fn sources(&self) -> Vec<String> {
        self.archives
            .iter()
            .flat_map(|a| {
                a.suites
                    .iter()
                    .map(move |s| format!("deb {} {s} {}", a.mirror, a.components.join(" ")))
            })
            .collect()
    }
}

fn check_archive(i: usize, a: &Archive) -> Result<(), SpecError> {
    let field = |f: &str| format!("archive[{i}].{f}");
    let m = &a.mirror;
    let scheme_ok = ["http://", "https://", "file:///"]
        .iter()
        .any(|s| m.starts_with(s) && m.len() > s.len());
    if !scheme_ok
        || m.chars()
            .any(|c| c.is_control() || c.is_whitespace() || c == ']')
    {
        return Err(bad(
            field("mirror"),
            format!("`{m}` must be an http://, https:// or file:/// URL without spaces"),
        ));
    }
    if a.suites.is_empty() {
        return Err(bad(field("suites"), "names no suite (e.g. \"bookworm\")"));
    }
    if a.components.is_empty() {
        return Err(bad(
            field("components"),
            "names no component (e.g. \"main\")",
        ));
    }
    for (key, words) in [("suites", &a.suites), ("components", &a.components)] {
        for (j, w) in words.iter().enumerate() {
            if !is_archive_word(w) {
                return Err(bad(
                    format!("archive[{i}].{key}[{j}]"),
                    format!("`{w}` must be letters, digits, `-`, `.`, `_` or `/`"),
                ));
            }
        }
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn good() -> DebianSpec {
        toml::from_str(
            r#"
packages = ["systemd", "linux-image-amd64"]
path_exclude = ["/usr/share/doc/*"]
[[archive]]
mirror = "http://deb.debian.org/debian"
suites = ["bookworm", "bookworm-updates"]
components = ["main"]
[[archive]]
mirror = "http://deb.debian.org/debian-security"
suites = ["bookworm-security"]
components = ["main", "non-free-firmware"]
"#,
        )
        .unwrap()
    }

    #[test]
    fn the_good_one_passes_with_defaults() {
        let s = good();
        s.check().unwrap();
        assert_eq!(s.variant, "minbase");
        assert_eq!(s.main_suite(), "bookworm");
        assert_eq!(
            s.sources(),
            [
                "deb http://deb.debian.org/debian bookworm main",
                "deb http://deb.debian.org/debian bookworm-updates main",
                "deb http://deb.debian.org/debian-security bookworm-security main non-free-firmware",
            ]
        );
    }

    #[test]
    fn fingerprint_follows_every_field() {
        let a = good();
        let mut b = good();
        assert_eq!(a.fingerprint(), b.fingerprint());
        b.packages.push("mdadm".into());
        assert_ne!(a.fingerprint(), b.fingerprint());
        let mut c = good();
        c.archives[1].components.pop();
        assert_ne!(a.fingerprint(), c.fingerprint());
        // boot_integration counts when set, and is absent when not (locks made before it stay
        // valid); the operator's inputs never count.
        let json = serde_json::to_string(&a).unwrap();
        assert!(!json.contains("boot_integration"), "{json}");
        let mut d = good();
        d.boot_integration = true;
        assert_ne!(a.fingerprint(), d.fingerprint());
        let mut e = good();
        e.given_inputs.insert(
            "kubernetes".into(),
            GivenInput {
                path: "/srv/k8s".into(),
                digest: format!("sha256:{}", "1".repeat(64)),
            },
        );
        assert_eq!(a.fingerprint(), e.fingerprint());
    }

    #[test]
    fn bad_fields_are_named() {
        type Edit = fn(&mut DebianSpec);
        let cases: [(Edit, &str, &str); 10] = [
            (
                |s| s.variant = "tiny".into(),
                "variant",
                "not one of mmdebstrap's variants",
            ),
            (|s| s.archives.clear(), "archive", "at least one"),
            (
                |s| s.archives[0].mirror = "ftp://x".into(),
                "archive[0].mirror",
                "http://",
            ),
            (
                |s| s.archives[1].mirror = "http://a b".into(),
                "archive[1].mirror",
                "without spaces",
            ),
            (
                |s| s.archives[0].suites.clear(),
                "archive[0].suites",
                "names no suite",
            ),
            (
                |s| s.archives[1].components.clear(),
                "archive[1].components",
                "names no component",
            ),
            (
                |s| s.archives[0].suites[1] = "-x".into(),
                "archive[0].suites[1]",
                "letters, digits",
            ),
            (
                |s| s.packages[1] = "systemd=252".into(),
                "packages[1]",
                "pinned in stack.lock",
            ),
            (
                |s| s.packages.push("Bad_Name".into()),
                "packages[2]",
                "not a Debian package name",
            ),
            (
                |s| s.packages.push("systemd".into()),
                "packages[2]",
                "listed twice",
            ),
        ];
        for (edit, field, want) in cases {
            let mut s = good();
            edit(&mut s);
            let e = s.check().unwrap_err();
            assert_eq!(e.field, field, "{e}");
            assert!(e.to_string().contains(want), "want `{want}` in {e}");
            assert!(
                e.to_string()
                    .starts_with(&format!("source.debian.{field}: ")),
                "{e}"
            );
        }
        let mut s = good();
        s.path_include.push("usr/share".into());
        assert_eq!(s.check().unwrap_err().field, "path_include[0]");
    }

    #[test]
    fn unknown_keys_are_refused() {
        let e = toml::from_str::<DebianSpec>("packges = []\n[[archive]]\nmirror = \"http://x\"\nsuites = [\"a\"]\ncomponents = [\"main\"]\n")
            .unwrap_err();
        assert!(e.to_string().contains("unknown field `packges`"), "{e}");
    }
}
