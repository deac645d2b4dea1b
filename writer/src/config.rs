//! Settings the provisioner cannot pass. CAPH runs the image-url-command with four arguments and
//! no options, so the trusted key, the deadline and the rest come from the binary itself
//! (`INGOT_WRITER_CONFIG_BUILTIN`, TOML text compiled in by `ci/release`) or from a TOML file
//! beside it (`/root/image-url-command.toml` for `/root/image-url-command`). Flags win over the
//! file, the file over the built-in settings (`docs/caph.md`).

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};

use serde::Deserialize;

/// The settings TOML text compiled into the binary, if any.
pub const BUILTIN: Option<&str> = option_env!("INGOT_WRITER_CONFIG_BUILTIN");

/// One settings source; every field is optional.
#[derive(Debug, Clone, Default, PartialEq, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Settings {
    /// The minisign public key the stack must be signed with (its text).
    pub trust_key: Option<String>,
    /// `90s`, `6m`, `1h`.
    pub deadline: Option<String>,
    /// Reboot after success (CAPH reboots by itself: default false).
    pub reboot: Option<bool>,
    /// Seconds between success and the reboot.
    pub reboot_delay: Option<u64>,
    /// Minimum sequential read speed of each target, KiB/s.
    pub min_read_speed: Option<u64>,
    /// Seconds the read speed test runs.
    pub read_test_seconds: Option<f64>,
    /// Extra kernel command-line arguments (before any given as flags).
    pub kernel_args: Option<Vec<String>>,
    /// Extra node labels.
    pub labels: Option<BTreeMap<String, String>>,
    /// Write even when another disk holds an OS.
    pub allow_foreign_os: Option<bool>,
    /// ESP size, MiB.
    pub esp_size: Option<u64>,
    /// The registries configuration (mirrors, pull-through caches): a containers-registries.conf
    /// file's path, or `none` (`--registries-conf` wins).
    pub registries_conf: Option<String>,
    /// The registries configuration itself, registries.conf (version 2) TOML text, for a binary
    /// that carries its mirrors in its built-in settings (`--registries-conf` and
    /// `registries_conf` win).
    pub registries: Option<String>,
    /// What to do with the node's secrets: `require` (seal them to the TPM or refuse the run),
    /// `prefer` (seal where the machine and the stack allow, else say they are in the clear),
    /// `off` (`--tpm` wins).
    pub tpm: Option<crate::tpm::TpmSetting>,
}

/// A settings source could not be read.
#[derive(Debug, thiserror::Error)]
pub enum ConfigError {
    #[error("{path}")]
    Read {
        path: PathBuf,
        source: std::io::Error,
    },
    #[error("{from}: {reason}")]
    Parse { from: String, reason: String },
}

impl Settings {
    /// Parses TOML settings; `from` names the source in errors.
    pub fn parse(text: &str, from: &str) -> Result<Settings, ConfigError> {
        toml::from_str(text).map_err(|e| ConfigError::Parse {
            from: from.to_string(),
            reason: e.to_string(),
        })
    }

    /// `self` where it says something, else `under`.
    pub fn over(self, under: Settings) -> Settings {
        Settings {
            trust_key: self.trust_key.or(under.trust_key),
            deadline: self.deadline.or(under.deadline),
            reboot: self.reboot.or(under.reboot),
            reboot_delay: self.reboot_delay.or(under.reboot_delay),
            min_read_speed: self.min_read_speed.or(under.min_read_speed),
            read_test_seconds: self.read_test_seconds.or(under.read_test_seconds),
            kernel_args: self.kernel_args.or(under.kernel_args),
            labels: self.labels.or(under.labels),
            allow_foreign_os: self.allow_foreign_os.or(under.allow_foreign_os),
            esp_size: self.esp_size.or(under.esp_size),
            registries_conf: self.registries_conf.or(under.registries_conf),
            registries: self.registries.or(under.registries),
            tpm: self.tpm.or(under.tpm),
        }
    }
}

/// Where a settings file beside `exe` may be: `<exe>.toml` (`/root/image-url-command.toml`),
/// then `image-url-command.toml` in the same directory.
pub fn beside(exe: &Path) -> Vec<PathBuf> {
    let mut out = vec![exe.with_extension("toml")];
    if let Some(dir) = exe.parent() {
        let named = dir.join("image-url-command.toml");
        if !out.contains(&named) {
            out.push(named);
        }
    }
    out
}

/// The settings from the first file beside `exe` that exists, over `builtin`; and the sources
/// used, for the report.
pub fn load(
    builtin: Option<&str>,
    exe: Option<&Path>,
) -> Result<(Settings, Vec<String>), ConfigError> {
    let mut sources = Vec::new();
    let mut settings = Settings::default();
    if let Some(text) = builtin.filter(|t| !t.trim().is_empty()) {
        settings = Settings::parse(text, "the built-in settings")?;
        sources.push("built in".to_string());
    }
    for path in exe.map(beside).unwrap_or_default() {
        let text = match std::fs::read_to_string(&path) {
            Ok(t) => t,
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => continue,
            Err(source) => return Err(ConfigError::Read { path, source }),
        };
        settings = Settings::parse(&text, &path.display().to_string())?.over(settings);
        sources.push(path.display().to_string());
        break;
    }
    Ok((settings, sources))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_file_beside_wins_over_the_built_in_settings() {
        let dir = tempfile::tempdir().unwrap();
        let exe = dir.path().join("image-url-command");
        let builtin = "deadline = \"6m\"\nreboot = false\nkernel_args = [\"console=ttyS0\"]\n\
                       tpm = \"require\"\n";
        let (s, from) = load(Some(builtin), Some(&exe)).unwrap();
        assert_eq!(s.deadline.as_deref(), Some("6m"));
        assert_eq!(from, ["built in"]);
        std::fs::write(
            dir.path().join("image-url-command.toml"),
            "deadline = \"18m\"\nmin_read_speed = 1000\n",
        )
        .unwrap();
        let (s, from) = load(Some(builtin), Some(&exe)).unwrap();
        assert_eq!(s.deadline.as_deref(), Some("18m"));
        assert_eq!(s.min_read_speed, Some(1000));
        assert_eq!(s.reboot, Some(false));
        assert_eq!(s.tpm, Some(crate::tpm::TpmSetting::Require));
        assert_eq!(s.kernel_args, Some(vec!["console=ttyS0".to_string()]));
        assert_eq!(from.len(), 2);
        assert!(from[1].ends_with("image-url-command.toml"));
    }

    #[test]
    fn unknown_keys_and_bad_toml_name_the_source() {
        let e = Settings::parse("dedline = \"6m\"\n", "x.toml").unwrap_err();
        assert!(e.to_string().starts_with("x.toml: "), "{e}");
        assert!(e.to_string().contains("dedline"), "{e}");
        let e = load(Some("reboot = maybe"), None).unwrap_err();
        assert!(e.to_string().starts_with("the built-in settings: "), "{e}");
    }

    #[test]
    fn files_beside_the_binary() {
        assert_eq!(
            beside(Path::new("/root/image-url-command")),
            [PathBuf::from("/root/image-url-command.toml")]
        );
        assert_eq!(
            beside(Path::new("/usr/bin/ingot-writer")),
            [
                PathBuf::from("/usr/bin/ingot-writer.toml"),
                PathBuf::from("/usr/bin/image-url-command.toml")
            ]
        );
    }
}
