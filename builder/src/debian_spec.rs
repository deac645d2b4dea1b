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
    #[serde(rename = "archive", default)]
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
    /// The Debian base layer this layer is installed over by apt (`debian::over`): the layer is
    /// what the install added. Every layer but the base names one; `variant` is not used then.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub over: Option<String>,
    /// Keep the `/etc/ld.so.cache` made over the base and this layer (a merged index). Only one
    /// layer a machine gets may carry it: it hides every other one's.
    #[serde(default, skip_serializing_if = "is_false")]
    pub ld_so_cache: bool,
    /// The DKMS source package whose modules are built for the base's kernel and put in the
    /// layer (`/usr/lib/modules/KVER/updates/dkms`), e.g. `nvidia-kernel-dkms`; its version is
    /// locked like a package's.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub dkms: Option<String>,
    /// Files the layer gets beyond its packages, written after the install. Not part of the
    /// fingerprint (a changed file does not make the locked packages stale); the tree cache's
    /// key has them.
    #[serde(default, rename = "file", skip_serializing)]
    pub files: Vec<InlineFile>,
    /// The operator inputs given for this layer (`ingot build --input NAME=PATH`), by name:
    /// filled by the build, never read from the manifest, and not part of the fingerprint (a
    /// new kubelet does not make the locked packages stale).
    #[serde(skip)]
    pub given_inputs: std::collections::BTreeMap<String, GivenInput>,
}

/// A file declared in the manifest, written into the layer.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct InlineFile {
    /// Absolute path in the layer, under `/usr` or `/etc`.
    pub path: String,
    /// Its contents.
    pub text: String,
    /// Octal mode (default `0644`).
    #[serde(default = "default_mode")]
    pub mode: String,
}

fn default_mode() -> String {
    "0644".to_owned()
}

impl InlineFile {
    /// The mode as a number (checked by [`DebianSpec::check`]).
    pub fn mode_bits(&self) -> u32 {
        u32::from_str_radix(&self.mode, 8).unwrap_or(0o644)
    }
}

/// The operator input that carries kubeadm, kubelet and kubectl.
pub const KUBERNETES_INPUT: &str = "kubernetes";

/// The operator input that carries NVIDIA's container toolkit `.deb` files.
pub const NVIDIA_TOOLKIT_INPUT: &str = "nvidia-toolkit";
/// The operator input that carries Kata Containers' static release.
pub const KATA_INPUT: &str = "kata";
/// The operator input that carries OCI image layouts to preload.
pub const IMAGES_INPUT: &str = "images";
/// The operator input that carries DKMS's module signing key and certificate.
pub const MODULE_SIGNING_INPUT: &str = "module-signing";

/// The operator inputs ingot knows how to put in a layer, and what each gives
/// (`debian::integration` for a base, `debian::inputs` for a layer installed over it).
pub const KNOWN_INPUTS: &[(&str, &str)] = &[
    (
        KUBERNETES_INPUT,
        "kubeadm and kubelet in a base, kubectl in a layer over it",
    ),
    (
        NVIDIA_TOOLKIT_INPUT,
        "NVIDIA's container toolkit (the `nvidia` runtime containerd names)",
    ),
    (
        KATA_INPUT,
        "Kata Containers (the shim, guest kernel and image the `kata` runtime needs)",
    ),
    (IMAGES_INPUT, "the preloaded container images"),
    (
        MODULE_SIGNING_INPUT,
        "signed kernel modules (unsigned ones do not load under Secure Boot's lockdown)",
    ),
];

/// What the input `name` gives a layer (`over`: one installed over the base), for "built
/// WITHOUT …".
pub fn input_gives(name: &str, over: bool) -> &'static str {
    match (name, over) {
        (KUBERNETES_INPUT, false) => "kubeadm and kubelet (with its unit, enabled)",
        (KUBERNETES_INPUT, true) => "kubectl",
        _ => KNOWN_INPUTS
            .iter()
            .find(|(k, _)| *k == name)
            .map_or("it", |(_, w)| *w),
    }
}

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
        // A layer over the base that installs no package reads no archive.
        let reads_archives = self.over.is_none() || !self.packages.is_empty();
        if self.archives.is_empty() && reads_archives {
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
        self.check_over()?;
        for (i, f) in self.files.iter().enumerate() {
            check_file(i, f)?;
            if self.files[..i].iter().any(|g| g.path == f.path) {
                return Err(bad(
                    format!("file[{i}].path"),
                    format!("`{}` is declared twice", f.path),
                ));
            }
        }
        Ok(())
    }

    /// A layer installed over another takes no mmdebstrap variant nor boot integration.
    fn check_over(&self) -> Result<(), SpecError> {
        if let Some(d) = &self.dkms {
            if !is_package_name(d) {
                return Err(bad("dkms", format!("`{d}` is not a Debian package name")));
            }
            if self.over.is_none() {
                return Err(bad(
                    "dkms",
                    "modules are built for the kernel of the base a layer is installed `over`",
                ));
            }
        }
        let Some(over) = &self.over else {
            if self.ld_so_cache {
                return Err(bad(
                    "ld_so_cache",
                    "only a layer installed `over` the base keeps a merged ld.so.cache",
                ));
            }
            return Ok(());
        };
        if over.is_empty() {
            return Err(bad("over", "names no layer"));
        }
        if self.boot_integration {
            return Err(bad(
                "boot_integration",
                "a layer installed `over` another is not a base",
            ));
        }
        if self.variant != DEFAULT_VARIANT {
            return Err(bad(
                "variant",
                format!(
                    "`{}`: a layer installed `over` another is installed by apt, not mmdebstrap",
                    self.variant
                ),
            ));
        }
        Ok(())
    }

    /// The suite mmdebstrap is given: the first archive's first suite (`stable` for a layer that
    /// reads no archive).
    pub fn main_suite(&self) -> &str {
        self.archives
            .first()
            .map_or("stable", |a| a.suites[0].as_str())
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

/// A declared file: an absolute, plain path under /usr or /etc, and an octal mode.
fn check_file(i: usize, f: &InlineFile) -> Result<(), SpecError> {
    let field = |k: &str| format!("file[{i}].{k}");
    let p = &f.path;
    let plain = p
        .split('/')
        .skip(1)
        .all(|c| !c.is_empty() && c != "." && c != "..");
    if !(p.starts_with("/usr/") || p.starts_with("/etc/"))
        || !plain
        || p.chars().any(|c| c.is_control())
    {
        return Err(bad(
            field("path"),
            format!("`{p}` must be an absolute path under /usr or /etc, without `.` or `..`"),
        ));
    }
    let mode_ok = !f.mode.is_empty()
        && f.mode.len() <= 4
        && f.mode.bytes().all(|b| (b'0'..=b'7').contains(&b))
        && f.mode_bits() & 0o7000 == 0;
    if !mode_ok {
        return Err(bad(
            field("mode"),
            format!(
                "`{}` must be an octal mode like \"0644\" or \"0755\"",
                f.mode
            ),
        ));
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
    fn a_layer_over_the_base_and_its_files_are_checked() {
        let mut s = good();
        s.over = Some("base".into());
        s.check().unwrap();
        s.archives.clear();
        assert_eq!(
            s.check().unwrap_err().field,
            "archive",
            "packages need an archive"
        );
        s.packages.clear();
        s.check().unwrap();
        assert_eq!(s.main_suite(), "stable");
        s.files.push(InlineFile {
            path: "/usr/lib/ingot/x".into(),
            text: "x".into(),
            mode: "0755".into(),
        });
        s.check().unwrap();
        assert_eq!(s.files[0].mode_bits(), 0o755);
        type Edit = fn(&mut DebianSpec);
        let cases: [(Edit, &str, &str); 8] = [
            (
                |s| s.files[0].path = "/var/lib/x".into(),
                "file[0].path",
                "under /usr or /etc",
            ),
            (
                |s| s.files[0].path = "/usr/../etc/x".into(),
                "file[0].path",
                "without `.` or `..`",
            ),
            (
                |s| s.files[0].mode = "4755".into(),
                "file[0].mode",
                "octal mode",
            ),
            (
                |s| s.files[0].mode = "rwx".into(),
                "file[0].mode",
                "octal mode",
            ),
            (
                |s| s.files.push(s.files[0].clone()),
                "file[1].path",
                "declared twice",
            ),
            (
                |s| s.boot_integration = true,
                "boot_integration",
                "not a base",
            ),
            (|s| s.variant = "apt".into(), "variant", "installed by apt"),
            (
                |s| s.dkms = Some("Bad".into()),
                "dkms",
                "not a Debian package name",
            ),
        ];
        for (edit, field, want) in cases {
            let mut t = s.clone();
            edit(&mut t);
            let e = t.check().unwrap_err();
            assert_eq!(e.field, field, "{e}");
            assert!(e.to_string().contains(want), "want `{want}` in {e}");
        }
        let mut base = good();
        base.dkms = Some("nvidia-kernel-dkms".into());
        assert_eq!(base.check().unwrap_err().field, "dkms");
        let mut base = good();
        base.ld_so_cache = true;
        assert_eq!(base.check().unwrap_err().field, "ld_so_cache");
        // The declared files are not in the fingerprint: a new file does not stale the lock.
        let mut f = good();
        f.over = Some("base".into());
        let before = f.fingerprint();
        f.files = s.files.clone();
        assert_eq!(before, f.fingerprint());
    }

    #[test]
    fn unknown_keys_are_refused() {
        let e = toml::from_str::<DebianSpec>("packges = []\n[[archive]]\nmirror = \"http://x\"\nsuites = [\"a\"]\ncomponents = [\"main\"]\n")
            .unwrap_err();
        assert!(e.to_string().contains("unknown field `packges`"), "{e}");
    }
}
