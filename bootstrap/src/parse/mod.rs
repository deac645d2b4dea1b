//! Format detection, and the checks both formats share (paths, modes, sizes, kubeadm).

mod cloud_config;
mod entries;
mod ignition;
mod yaml_depth;

use std::io::Read;
use std::path::{Component, Path, PathBuf};

use thiserror::Error;

use crate::model::{Bootstrap, KubeadmAction};

pub use entries::MAX_ENTRIES;
pub(crate) use yaml_depth::scan as yaml_scan;
pub use yaml_depth::MAX_YAML_DEPTH;

/// Largest bootstrap data accepted (CABPK's data lives in a Kubernetes Secret, at most 1 MiB).
pub const MAX_INPUT_SIZE: usize = 64 << 20;
/// Largest decoded (decompressed) size of one file.
pub const MAX_FILE_SIZE: usize = 64 << 20;
/// Largest decoded size of all files together.
pub const MAX_TOTAL_SIZE: usize = 256 << 20;

/// Why bootstrap data was refused. Every variant names the place in the input (a key path such
/// as `write_files[2]`, a file path, or a line and column) and the problem.
#[derive(Debug, Error, Clone, PartialEq, Eq)]
pub enum ParseError {
    #[error("bootstrap data is empty")]
    Empty,
    #[error("bootstrap data is {size} bytes, more than the {limit} bytes accepted")]
    TooLarge { size: usize, limit: usize },
    #[error("bootstrap data is a shell script (starts with `#!`); only #cloud-config and Ignition JSON are supported")]
    ShellScript,
    #[error("bootstrap data is MIME multipart; this is not supported, only a single #cloud-config document or Ignition JSON")]
    MimeMultipart,
    #[error("bootstrap data is a cloud-init `{kind}` document; only #cloud-config and Ignition JSON are supported")]
    UnsupportedCloudInit { kind: String },
    #[error("bootstrap data format not recognised (first line {first_line:?}); expected `#cloud-config` YAML or Ignition JSON")]
    UnknownFormat { first_line: String },
    #[error("bootstrap data is not UTF-8 (invalid byte at offset {offset})")]
    NotUtf8 { offset: usize },
    #[error("gzip-compressed bootstrap data: {reason}")]
    Gzip { reason: String },
    #[error("cloud-config is not valid YAML at line {line}, column {column}: {message}")]
    Yaml {
        line: usize,
        column: usize,
        message: String,
    },
    #[error(
        "cloud-config nests collections deeper than {limit} levels at line {line}, column {column}"
    )]
    TooDeep {
        line: usize,
        column: usize,
        limit: usize,
    },
    #[error("Ignition config is not valid JSON at line {line}, column {column}: {message}")]
    Json {
        line: usize,
        column: usize,
        message: String,
    },
    #[error("{at}: expected {expected}")]
    Shape { at: String, expected: String },
    #[error("{at}: path {path:?} {reason}")]
    Path {
        at: String,
        path: String,
        reason: String,
    },
    #[error("{path}: cannot decode content with encoding {encoding:?}: {reason}")]
    Encoding {
        path: String,
        encoding: String,
        reason: String,
    },
    #[error("{path}: invalid permissions {value:?}: {reason}")]
    Permissions {
        path: String,
        value: String,
        reason: String,
    },
    #[error("{path}: decoded content is larger than {limit} bytes")]
    FileTooLarge { path: String, limit: usize },
    #[error(
        "bootstrap data has {count} entries (files, directories, links, units, drop-ins, users \
         and groups together), more than the {limit} accepted"
    )]
    TooManyEntries { count: usize, limit: usize },
    #[error("{path}: all files together decode to more than {limit} bytes")]
    TotalTooLarge { path: String, limit: usize },
    #[error("Ignition version {version:?} is not supported (2.x and 3.x are)")]
    IgnitionVersion { version: String },
    #[error("{at}: {what} is not supported")]
    Unsupported { at: String, what: String },
    #[error("{path}: content does not match {hash:?}")]
    Hash { path: String, hash: String },
}

/// Parses CABPK bootstrap data, detecting its format.
///
/// Accepted: `#cloud-config` YAML (optionally after CABPK's `## template: jinja` line) and
/// Ignition JSON 2.x/3.x, either also gzip-compressed. Refused with a [`ParseError`] naming the
/// problem: empty input, shell scripts, MIME multipart, other cloud-init document types,
/// invalid YAML/JSON (with line and column), bad encodings, permissions or paths, and contents
/// decoding to more than [`MAX_FILE_SIZE`] per file or [`MAX_TOTAL_SIZE`] in all, more than
/// [`MAX_ENTRIES`] files, directories, links, units, drop-ins, users and groups.
pub fn parse(bytes: &[u8]) -> Result<Bootstrap, ParseError> {
    let b = parse_inner(bytes, true)?;
    entries::check(entries::of(&b))?;
    Ok(b)
}

fn parse_inner(bytes: &[u8], allow_gzip: bool) -> Result<Bootstrap, ParseError> {
    if bytes.len() > MAX_INPUT_SIZE {
        return Err(ParseError::TooLarge {
            size: bytes.len(),
            limit: MAX_INPUT_SIZE,
        });
    }
    if allow_gzip && bytes.starts_with(&[0x1f, 0x8b]) {
        // cloud-init accepts gzipped user-data; so do we, once and bounded.
        let plain = gunzip(bytes, MAX_INPUT_SIZE).map_err(|reason| ParseError::Gzip { reason })?;
        return parse_inner(&plain, false);
    }
    let bytes = bytes.strip_prefix(b"\xef\xbb\xbf").unwrap_or(bytes);
    if bytes.iter().all(|b| b.is_ascii_whitespace()) {
        return Err(ParseError::Empty);
    }
    let text = std::str::from_utf8(bytes).map_err(|e| ParseError::NotUtf8 {
        offset: e.valid_up_to(),
    })?;
    let first = text.lines().next().unwrap_or("").trim_end();
    let lower = first.to_ascii_lowercase();
    if first.starts_with("#!") {
        return Err(ParseError::ShellScript);
    }
    if lower.starts_with("content-type:") || lower.starts_with("mime-version:") {
        return Err(ParseError::MimeMultipart);
    }
    if first == "#cloud-config" {
        return cloud_config::parse(text, false);
    }
    if first.trim().eq_ignore_ascii_case("## template: jinja") {
        let second = text.lines().nth(1).unwrap_or("").trim_end();
        if second == "#cloud-config" {
            return cloud_config::parse(text, true);
        }
        return Err(ParseError::UnknownFormat {
            first_line: short(second),
        });
    }
    for kind in [
        "#cloud-config-archive",
        "#cloud-boothook",
        "#include",
        "#part-handler",
        "#cloud-config-jsonp",
    ] {
        if first.starts_with(kind) {
            return Err(ParseError::UnsupportedCloudInit {
                kind: kind.to_string(),
            });
        }
    }
    if text.trim_start().starts_with('{') {
        return ignition::parse(text);
    }
    Err(ParseError::UnknownFormat {
        first_line: short(first),
    })
}

fn short(s: &str) -> String {
    s.chars().take(60).collect()
}

/// Decompresses gzip data, refusing more than `limit` bytes of output.
pub(crate) fn gunzip(data: &[u8], limit: usize) -> Result<Vec<u8>, String> {
    let mut out = Vec::new();
    let mut dec = flate2::read::MultiGzDecoder::new(data).take(limit as u64 + 1);
    dec.read_to_end(&mut out).map_err(|e| e.to_string())?;
    if out.len() > limit {
        return Err(format!("decompresses to more than {limit} bytes"));
    }
    Ok(out)
}

/// Base64 as Python's `b64decode` reads it: whitespace ignored, padding optional.
pub(crate) fn base64_decode(text: &str) -> Result<Vec<u8>, String> {
    use base64::engine::{general_purpose::GeneralPurpose, DecodePaddingMode};
    use base64::Engine;
    const ENGINE: GeneralPurpose = GeneralPurpose::new(
        &base64::alphabet::STANDARD,
        base64::engine::GeneralPurposeConfig::new()
            .with_decode_padding_mode(DecodePaddingMode::Indifferent)
            .with_decode_allow_trailing_bits(true),
    );
    let compact: String = text.chars().filter(|c| !c.is_ascii_whitespace()).collect();
    ENGINE.decode(compact).map_err(|e| e.to_string())
}

/// Tracks decoded sizes against the per-file and total limits.
pub(crate) struct Budget {
    used: usize,
}

impl Budget {
    pub(crate) fn new() -> Self {
        Budget { used: 0 }
    }

    /// The most a file may still decode to: the per-file limit or what is left of the total.
    pub(crate) fn room(&self) -> usize {
        MAX_FILE_SIZE.min(MAX_TOTAL_SIZE - self.used)
    }

    pub(crate) fn take(&mut self, path: &str, len: usize) -> Result<(), ParseError> {
        if len > MAX_FILE_SIZE {
            return Err(ParseError::FileTooLarge {
                path: path.to_string(),
                limit: MAX_FILE_SIZE,
            });
        }
        if self.used + len > MAX_TOTAL_SIZE {
            return Err(ParseError::TotalTooLarge {
                path: path.to_string(),
                limit: MAX_TOTAL_SIZE,
            });
        }
        self.used += len;
        Ok(())
    }

    /// Decompresses within the budget, naming `path` and `encoding` on failure.
    pub(crate) fn gunzip(
        &mut self,
        path: &str,
        encoding: &str,
        data: &[u8],
    ) -> Result<Vec<u8>, ParseError> {
        let room = self.room();
        let out = gunzip(data, room).map_err(|reason| {
            if reason.starts_with("decompresses to more than") {
                if room < MAX_FILE_SIZE {
                    ParseError::TotalTooLarge {
                        path: path.to_string(),
                        limit: MAX_TOTAL_SIZE,
                    }
                } else {
                    ParseError::FileTooLarge {
                        path: path.to_string(),
                        limit: MAX_FILE_SIZE,
                    }
                }
            } else {
                ParseError::Encoding {
                    path: path.to_string(),
                    encoding: encoding.to_string(),
                    reason,
                }
            }
        })?;
        Ok(out)
    }
}

/// Checks and normalises an absolute path from the data (`at` names where it came from).
pub(crate) fn check_path(at: &str, raw: &str) -> Result<PathBuf, ParseError> {
    let err = |reason: &str| ParseError::Path {
        at: at.to_string(),
        path: raw.to_string(),
        reason: reason.to_string(),
    };
    if raw.is_empty() {
        return Err(err("is empty"));
    }
    if raw.contains('\0') {
        return Err(err("contains a NUL byte"));
    }
    if raw.len() > 4096 {
        return Err(err("is longer than 4096 bytes"));
    }
    if !raw.starts_with('/') {
        return Err(err("is relative; it must be absolute"));
    }
    let mut out = PathBuf::from("/");
    for c in Path::new(raw).components() {
        match c {
            Component::RootDir => {}
            // ext4's limit: caught here, naming the data, not when the node layer is sealed.
            Component::Normal(n) if n.len() > ingot_layers::tree::MAX_NAME_LEN => {
                return Err(err("has a name longer than 255 bytes"))
            }
            Component::Normal(n) => out.push(n),
            Component::CurDir => {}
            Component::ParentDir => return Err(err("contains `..`")),
            Component::Prefix(_) => return Err(err("is not a Unix path")),
        }
    }
    if out == Path::new("/") {
        return Err(err("is the root directory"));
    }
    Ok(out)
}

/// Parses cloud-init style permissions: an octal string (`'0644'`, `644`, `0o644`).
pub(crate) fn octal_mode(path: &str, value: &str) -> Result<u32, ParseError> {
    let err = |reason: &str| ParseError::Permissions {
        path: path.to_string(),
        value: value.to_string(),
        reason: reason.to_string(),
    };
    let v = value.trim();
    let digits = v
        .strip_prefix("0o")
        .or_else(|| v.strip_prefix("0O"))
        .unwrap_or(v);
    if digits.is_empty() || !digits.bytes().all(|b| (b'0'..=b'7').contains(&b)) {
        return Err(err("not an octal number"));
    }
    let mode = u32::from_str_radix(digits, 8).map_err(|_| err("too large"))?;
    if mode > 0o7777 {
        return Err(err("more than 0o7777"));
    }
    Ok(mode)
}

/// Checks a numeric mode (Ignition's decimal `mode`, or a YAML integer).
pub(crate) fn numeric_mode(path: &str, value: i64) -> Result<u32, ParseError> {
    if !(0..=0o7777).contains(&value) {
        return Err(ParseError::Permissions {
            path: path.to_string(),
            value: value.to_string(),
            reason: "not between 0 and 0o7777".to_string(),
        });
    }
    Ok(value as u32)
}

/// Finds `kubeadm init` / `kubeadm join` in shell text; `config` is the JoinConfiguration
/// text when known, for the `controlPlane:` check.
pub(crate) fn kubeadm_action(
    shell: &str,
    config: impl Fn(&str) -> Option<String>,
) -> Option<KubeadmAction> {
    for line in shell.lines() {
        for part in line.split(['&', ';', '|']) {
            let words: Vec<&str> = part.split_whitespace().collect();
            let Some(pos) = words
                .iter()
                .position(|w| *w == "kubeadm" || w.ends_with("/kubeadm"))
            else {
                continue;
            };
            let rest = &words[pos + 1..];
            match rest.iter().find(|w| !w.starts_with('-')) {
                Some(&"init") => return Some(KubeadmAction::Init),
                Some(&"join") => {
                    let flag = rest
                        .iter()
                        .any(|w| *w == "--control-plane" || w.starts_with("--control-plane="));
                    let path = rest
                        .iter()
                        .position(|w| *w == "--config")
                        .and_then(|i| rest.get(i + 1).map(|s| s.to_string()))
                        .or_else(|| {
                            rest.iter()
                                .find_map(|w| w.strip_prefix("--config=").map(str::to_string))
                        });
                    let in_config = path
                        .and_then(|p| config(p.trim_matches(['\'', '"'])))
                        .map(|text| has_control_plane_section(&text))
                        .unwrap_or(false);
                    return Some(KubeadmAction::Join {
                        control_plane: flag || in_config,
                    });
                }
                _ => {}
            }
        }
    }
    None
}

/// Whether a JoinConfiguration has a top-level `controlPlane:` section that is not null/empty.
///
/// A line scan, not a YAML parse: kubeadm configs in jinja cloud-configs may hold `{{ }}`.
pub(crate) fn has_control_plane_section(config: &str) -> bool {
    config.lines().any(|l| {
        l.strip_prefix("controlPlane:")
            .map(|rest| {
                let rest = rest.trim();
                !matches!(rest, "null" | "~" | "{}")
            })
            .unwrap_or(false)
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn paths() {
        assert_eq!(
            check_path("x", "/etc//a/./b").unwrap(),
            Path::new("/etc/a/b")
        );
        assert!(check_path("x", "etc/a")
            .unwrap_err()
            .to_string()
            .contains("relative"));
        assert!(check_path("x", "/etc/../a")
            .unwrap_err()
            .to_string()
            .contains(".."));
        assert!(check_path("x", "/").is_err());
        assert!(check_path("x", "").is_err());
    }

    /// Found by the ignition fuzz target: a file path with a 533-byte name was staged and only
    /// failed when the node layer was sealed. ext4 holds names of at most 255 bytes.
    #[test]
    fn a_name_over_255_bytes_is_refused_when_parsed() {
        let long = format!("/etc/kubernetes/{}", "a".repeat(256));
        let e = check_path("storage.files[0].path", &long).unwrap_err();
        assert!(
            e.to_string().contains("longer than 255 bytes")
                && e.to_string().contains("storage.files[0].path"),
            "{e}"
        );
        let fits = format!("/etc/kubernetes/{}", "a".repeat(255));
        assert_eq!(check_path("x", &fits).unwrap(), Path::new(&fits));
    }

    #[test]
    fn modes() {
        assert_eq!(octal_mode("p", "0644").unwrap(), 0o644);
        assert_eq!(octal_mode("p", "600").unwrap(), 0o600);
        assert_eq!(octal_mode("p", "0o755").unwrap(), 0o755);
        assert!(octal_mode("p", "0899").is_err());
        assert!(octal_mode("p", "rw-r--r--").is_err());
        assert!(octal_mode("p", "17777").is_err());
        assert!(numeric_mode("p", -1).is_err());
        assert_eq!(numeric_mode("p", 420).unwrap(), 0o644);
    }

    #[test]
    fn kubeadm_commands() {
        let none = |_: &str| None;
        assert_eq!(
            kubeadm_action(
                "kubeadm init --config /run/kubeadm/kubeadm.yaml  && echo success",
                none
            ),
            Some(KubeadmAction::Init)
        );
        assert_eq!(
            kubeadm_action("kubeadm join --config /x.yaml --control-plane", none),
            Some(KubeadmAction::Join {
                control_plane: true
            })
        );
        let cp = |p: &str| {
            (p == "/x.yaml").then(|| {
                "kind: JoinConfiguration\ncontrolPlane:\n  localAPIEndpoint: {}\n".to_string()
            })
        };
        assert_eq!(
            kubeadm_action("kubeadm join --config /x.yaml", cp),
            Some(KubeadmAction::Join {
                control_plane: true
            })
        );
        assert_eq!(
            kubeadm_action("kubeadm join --config=/y.yaml", cp),
            Some(KubeadmAction::Join {
                control_plane: false
            })
        );
        assert_eq!(kubeadm_action("echo kubeadm", none), None);
    }
}
