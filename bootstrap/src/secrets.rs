//! What counts as a secret, and scrubbing secrets out of free text.
//!
//! A staged file is a secret when any of these hold:
//! - its name ends in `.key`, or it is an SSH host private key (`ssh_host_*_key`);
//! - its content contains `PRIVATE KEY-----` (any PEM or OpenSSH private key);
//! - its content contains a kubeadm bootstrap token (`[a-z0-9]{6}.[a-z0-9]{16}` standing alone);
//! - it is a kubeadm configuration carrying credentials (`kind: InitConfiguration` or
//!   `kind: JoinConfiguration`; CABPK writes them to `/run/kubeadm/` or `/etc/kubeadm.yml`).
//!
//! Secrets are staged with their group and other permission bits cleared (never looser than
//! given; owner bits kept, so a secret script stays executable) and are listed in
//! [`Staged::secrets`](crate::Staged::secrets).

use std::path::Path;

/// The text put in place of a secret by [`redact`].
pub const REDACTED: &str = "[REDACTED]";

/// Whether a file at `path` with `content` is a secret (see the module docs).
pub fn is_secret(path: &Path, content: &[u8]) -> bool {
    let name = path
        .file_name()
        .map(|n| n.to_string_lossy())
        .unwrap_or_default();
    if name.ends_with(".key") || (name.starts_with("ssh_host_") && name.ends_with("_key")) {
        return true;
    }
    contains(content, b"PRIVATE KEY-----")
        || find_token(content).is_some()
        || contains(content, b"kind: InitConfiguration")
        || contains(content, b"kind: JoinConfiguration")
}

/// Clears group/other and special bits: a secret is readable by its owner only.
pub fn secret_mode(mode: u32) -> u32 {
    mode & 0o700
}

fn contains(hay: &[u8], needle: &[u8]) -> bool {
    hay.windows(needle.len()).any(|w| w == needle)
}

fn token_char(b: u8) -> bool {
    b.is_ascii_lowercase() || b.is_ascii_digit()
}

/// The byte range of the first bootstrap token in `text`: 6 + `.` + 16 characters of
/// `[a-z0-9]`, not part of a longer run of such characters.
fn find_token(text: &[u8]) -> Option<(usize, usize)> {
    let mut i = 0;
    while let Some(off) = text[i..].iter().position(|&b| b == b'.') {
        let dot = i + off;
        i = dot + 1;
        if dot < 6 || dot + 17 > text.len() {
            continue;
        }
        let start = dot - 6;
        let end = dot + 17;
        let ok = text[start..dot].iter().all(|&b| token_char(b))
            && text[dot + 1..end].iter().all(|&b| token_char(b))
            && (start == 0 || !token_char(text[start - 1]))
            && (end == text.len() || !token_char(text[end]));
        if ok {
            return Some((start, end));
        }
    }
    None
}

/// `text` with bootstrap tokens and PEM/OpenSSH private key blocks replaced by `[REDACTED]`.
///
/// For log lines and reports that might quote bootstrap data (commands, error context).
pub fn redact(text: &str) -> String {
    let mut out = String::with_capacity(text.len());
    let mut rest = text;
    // Private key blocks first: everything from the BEGIN line to its END line.
    while let Some(begin) = rest.find("-----BEGIN ") {
        let header_end = rest[begin..].find("-----\n").map(|e| begin + e);
        let is_private = header_end
            .map(|e| rest[begin..e].ends_with("PRIVATE KEY"))
            .unwrap_or(false);
        if !is_private {
            out.push_str(&rest[..begin + 11]);
            rest = &rest[begin + 11..];
            continue;
        }
        out.push_str(&rest[..begin]);
        out.push_str(REDACTED);
        let after = &rest[begin..];
        match after.find("-----END ") {
            Some(end) => {
                let tail = &after[end + 9..];
                let close = tail.find("-----").map(|c| c + 5).unwrap_or(tail.len());
                rest = &tail[close..];
            }
            None => rest = "",
        }
    }
    out.push_str(rest);
    // Then tokens (ASCII only, so byte offsets are char boundaries).
    let mut result = String::with_capacity(out.len());
    let mut s = out.as_str();
    while let Some((a, b)) = find_token(s.as_bytes()) {
        result.push_str(&s[..a]);
        result.push_str(REDACTED);
        s = &s[b..];
    }
    result.push_str(s);
    result
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn tokens_found_only_standing_alone() {
        assert!(find_token(b"token: abcdef.0123456789abcdef\n").is_some());
        assert!(find_token(b"--token=abcdef.0123456789abcdef").is_some());
        assert!(find_token(b"xabcdef.0123456789abcdef").is_none());
        assert!(find_token(b"abcdef.0123456789abcdefg").is_none());
        assert!(find_token(b"ABCDEF.0123456789ABCDEF").is_none());
        assert!(find_token(b"abcde.0123456789abcdef").is_none());
        assert!(find_token(b"...").is_none());
    }

    #[test]
    fn redacts_tokens_and_private_keys() {
        let text = "kubeadm join --token abcdef.0123456789abcdef x\n\
                    -----BEGIN RSA PRIVATE KEY-----\nMIIEsecret\n-----END RSA PRIVATE KEY-----\n\
                    -----BEGIN CERTIFICATE-----\nMIIBpublic\n-----END CERTIFICATE-----\n";
        let r = redact(text);
        assert!(!r.contains("abcdef.0123456789abcdef"), "{r}");
        assert!(!r.contains("MIIEsecret"), "{r}");
        assert!(r.contains("MIIBpublic"), "{r}");
        assert_eq!(r.matches(REDACTED).count(), 2, "{r}");
    }

    #[test]
    fn secret_rules() {
        assert!(is_secret(Path::new("/etc/kubernetes/pki/ca.key"), b"x"));
        assert!(is_secret(Path::new("/etc/ssh/ssh_host_rsa_key"), b"x"));
        assert!(!is_secret(Path::new("/etc/ssh/ssh_host_rsa_key.pub"), b"x"));
        assert!(is_secret(
            Path::new("/x"),
            b"-----BEGIN EC PRIVATE KEY-----\n"
        ));
        assert!(is_secret(
            Path::new("/run/kubeadm/kubeadm.yaml"),
            b"kind: InitConfiguration\n"
        ));
        assert!(!is_secret(Path::new("/etc/kubernetes/pki/ca.crt"), b"cert"));
        assert_eq!(secret_mode(0o640), 0o600);
        assert_eq!(secret_mode(0o400), 0o400);
        assert_eq!(secret_mode(0o4755), 0o700);
    }
}
