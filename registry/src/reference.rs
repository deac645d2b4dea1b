//! Registry references: `oci://HOST[:PORT]/REPO[:TAG][@DIGEST]`.
//!
//! The `oci://` prefix makes the first path segment the registry host, always (no docker.io
//! default, no guessing from dots). Repository components follow the distribution spec's grammar
//! (`[a-z0-9]+([._-][a-z0-9]+)*`), tags `[A-Za-z0-9_][A-Za-z0-9._-]{0,127}`, digests
//! `sha256:<64 hex>`.

use std::fmt;
use std::str::FromStr;

use ingot_layers::descriptor::is_sha256_digest;

use crate::error::RegistryError;

/// The scheme prefix of a registry reference.
pub const SCHEME: &str = "oci://";

/// A parsed registry reference.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct RegistryRef {
    /// `host[:port]`.
    pub registry: String,
    /// `a/b/c`.
    pub repository: String,
    /// The tag, if given.
    pub tag: Option<String>,
    /// The digest, if given (`sha256:…`).
    pub digest: Option<String>,
}

fn valid_component(c: &str) -> bool {
    // [a-z0-9]+([._-][a-z0-9]+)* ; "__" is allowed as a separator too.
    let alnum = |b: u8| b.is_ascii_lowercase() || b.is_ascii_digit();
    let bytes = c.as_bytes();
    if bytes.is_empty() || !alnum(bytes[0]) || !alnum(bytes[bytes.len() - 1]) {
        return false;
    }
    let mut prev_sep = false;
    for (i, &b) in bytes.iter().enumerate() {
        if alnum(b) {
            prev_sep = false;
        } else if matches!(b, b'.' | b'_' | b'-') {
            let double_underscore = b == b'_' && i > 0 && bytes[i - 1] == b'_';
            if prev_sep && !double_underscore && b != b'-' {
                return false;
            }
            prev_sep = true;
        } else {
            return false;
        }
    }
    true
}

fn valid_tag(t: &str) -> bool {
    let b = t.as_bytes();
    !b.is_empty()
        && b.len() <= 128
        && (b[0].is_ascii_alphanumeric() || b[0] == b'_')
        && b.iter()
            .all(|&c| c.is_ascii_alphanumeric() || matches!(c, b'_' | b'.' | b'-'))
}

fn valid_host(h: &str) -> bool {
    let (host, port) = match h.rsplit_once(':') {
        Some((host, port)) if !host.ends_with(']') || h.starts_with('[') => (host, Some(port)),
        _ => (h, None),
    };
    if let Some(p) = port {
        if p.parse::<u16>().is_err() {
            return false;
        }
    }
    !host.is_empty()
        && host
            .bytes()
            .all(|c| c.is_ascii_alphanumeric() || matches!(c, b'.' | b'-' | b'[' | b']' | b':'))
}

impl FromStr for RegistryRef {
    type Err = RegistryError;

    fn from_str(s: &str) -> Result<Self, RegistryError> {
        let bad = |why: &str| {
            RegistryError::Reference(format!(
                "`{s}` is not a registry reference ({why}); the form is \
                 oci://HOST[:PORT]/REPO[:TAG][@sha256:DIGEST]"
            ))
        };
        let rest = s
            .strip_prefix(SCHEME)
            .ok_or_else(|| bad("it must start with oci://"))?;
        let (registry, path) = rest
            .split_once('/')
            .ok_or_else(|| bad("no repository after the host"))?;
        if !valid_host(registry) {
            return Err(bad("bad host or port"));
        }
        let (path, digest) = match path.split_once('@') {
            Some((p, d)) => {
                if !is_sha256_digest(d) {
                    return Err(bad("the digest must be sha256:<64 lowercase hex>"));
                }
                (p, Some(d.to_owned()))
            }
            None => (path, None),
        };
        let last_slash = path.rfind('/').map_or(0, |i| i + 1);
        let (repository, tag) = match path[last_slash..].find(':') {
            Some(i) => {
                let tag = &path[last_slash + i + 1..];
                if !valid_tag(tag) {
                    return Err(bad("bad tag"));
                }
                (&path[..last_slash + i], Some(tag.to_owned()))
            }
            None => (path, None),
        };
        if repository.is_empty() || !repository.split('/').all(valid_component) {
            return Err(bad(
                "bad repository name: lowercase letters, digits, . _ - and /",
            ));
        }
        Ok(RegistryRef {
            registry: registry.to_owned(),
            repository: repository.to_owned(),
            tag,
            digest,
        })
    }
}

impl fmt::Display for RegistryRef {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{SCHEME}{}/{}", self.registry, self.repository)?;
        if let Some(t) = &self.tag {
            write!(f, ":{t}")?;
        }
        if let Some(d) = &self.digest {
            write!(f, "@{d}")?;
        }
        Ok(())
    }
}

impl RegistryRef {
    /// Whether a string is meant as a registry reference.
    pub fn is_registry_ref(s: &str) -> bool {
        s.starts_with(SCHEME)
    }

    /// The same repository, pointing at `digest`.
    pub fn with_digest(&self, digest: &str) -> RegistryRef {
        RegistryRef {
            registry: self.registry.clone(),
            repository: self.repository.clone(),
            tag: None,
            digest: Some(digest.to_owned()),
        }
    }

    /// The same repository, with another tag and no digest.
    pub fn with_tag(&self, tag: &str) -> RegistryRef {
        RegistryRef {
            registry: self.registry.clone(),
            repository: self.repository.clone(),
            tag: Some(tag.to_owned()),
            digest: None,
        }
    }

    /// Whether the host is a loopback name (plain HTTP by default).
    pub fn is_loopback(&self) -> bool {
        let host = match self.registry.rsplit_once(':') {
            Some((h, p)) if p.parse::<u16>().is_ok() && !h.is_empty() => h,
            _ => self.registry.as_str(),
        };
        matches!(host, "localhost" | "[::1]") || host.starts_with("127.")
    }

    /// The host the registry API is asked at: `docker.io` answers at `index.docker.io`, as
    /// docker's clients have it; every other host at itself.
    pub(crate) fn api_host(&self) -> &str {
        match self.registry.as_str() {
            "docker.io" => "index.docker.io",
            host => host,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn parses_the_forms() {
        let cases = [
            ("oci://127.0.0.1:5000/stack/demo:1.0.0", "127.0.0.1:5000", "stack/demo", Some("1.0.0"), None),
            ("oci://ghcr.io/acme/stacks/k8s", "ghcr.io", "acme/stacks/k8s", None, None),
            (
                "oci://localhost/demo@sha256:44136fa355b3678a1146ad16f7e8649e94fb4fc21fe77e8310c060f61caaff8a",
                "localhost",
                "demo",
                None,
                Some("sha256:44136fa355b3678a1146ad16f7e8649e94fb4fc21fe77e8310c060f61caaff8a"),
            ),
            (
                "oci://r.example:443/a_b/c-d.e:v1@sha256:44136fa355b3678a1146ad16f7e8649e94fb4fc21fe77e8310c060f61caaff8a",
                "r.example:443",
                "a_b/c-d.e",
                Some("v1"),
                Some("sha256:44136fa355b3678a1146ad16f7e8649e94fb4fc21fe77e8310c060f61caaff8a"),
            ),
        ];
        for (s, reg, repo, tag, digest) in cases {
            let r: RegistryRef = s.parse().unwrap();
            assert_eq!(r.registry, reg, "{s}");
            assert_eq!(r.repository, repo, "{s}");
            assert_eq!(r.tag.as_deref(), tag, "{s}");
            assert_eq!(r.digest.as_deref(), digest, "{s}");
            assert_eq!(r.to_string(), s);
        }
    }

    #[test]
    fn rejects_malformed() {
        for s in [
            "127.0.0.1:5000/demo:1",
            "oci://host",
            "oci://host/",
            "oci://host/Upper:1",
            "oci://host/demo:",
            "oci://host/demo:-x",
            "oci://host/demo@sha256:abc",
            "oci://host:99999/demo",
            "oci://host/a//b",
        ] {
            assert!(s.parse::<RegistryRef>().is_err(), "{s} should be refused");
        }
    }

    #[test]
    fn loopback_hosts() {
        for (s, want) in [
            ("oci://127.0.0.1:5000/a", true),
            ("oci://localhost/a", true),
            ("oci://localhost:80/a", true),
            ("oci://127.1.2.3/a", true),
            ("oci://[::1]:5000/a", true),
            ("oci://ghcr.io/a", false),
            ("oci://10.0.0.1:5000/a", false),
        ] {
            let r: RegistryRef = s.parse().unwrap();
            assert_eq!(r.is_loopback(), want, "{s}");
        }
    }
}
