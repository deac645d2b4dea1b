//! The grammar of a `prefix` or `location` in a registries.conf: what a reference could ever
//! start with (`host[:port][/path][:tag|@digest]`, or `*.domain`). containers/image checks only
//! the scheme and a wildcard's path, and silently keeps a prefix that can never match (`*.`,
//! upper case, a NUL, an empty label); here each is refused with the reason.

use crate::mirrors_error::shown;
use crate::reference::{RegistryRef, SCHEME};

/// Why `name` (a prefix when `wildcard` allows `*.domain`, else a location) can never match or
/// name a registry, if it cannot.
pub(super) fn problem(name: &str, wildcard: bool) -> Option<String> {
    if let Some(c) = name.chars().find(|c| c.is_control()) {
        return Some(format!(
            "it contains the control character U+{:04X}",
            c as u32
        ));
    }
    if let Some(c) = name.chars().find(|c| !c.is_ascii()) {
        return Some(format!(
            "it contains `{}`: a registry name is ASCII (an international host name is written \
             in punycode, `xn--…`)",
            c.escape_default()
        ));
    }
    if name.chars().any(char::is_whitespace) {
        return Some("it contains white space".to_owned());
    }
    if let Some(domain) = name.strip_prefix("*.") {
        if !wildcard {
            return Some("a location cannot have a wildcard".to_owned());
        }
        if domain.contains(['/', ':', '@']) {
            return Some("a wildcard prefix is `*.host` only, with no port or path".to_owned());
        }
        if domain.is_empty() {
            return Some("`*.` needs a domain after it (`*.example.com`)".to_owned());
        }
        return host_name(domain).map(|p| format!("after `*.`: {p}"));
    }
    if name.contains('*') {
        return Some("`*` is only allowed as a leading `*.` (`*.example.com`)".to_owned());
    }
    let (host, path) = match name.split_once('/') {
        Some((h, p)) => (h, Some(p)),
        None => (name, None),
    };
    if let Some(p) = host_port(host) {
        return Some(p);
    }
    path.and_then(|p| repository(name, p))
}

/// `host[:port]` or `[v6][:port]`.
fn host_port(host: &str) -> Option<String> {
    let (name, port) = if let Some(v6) = host.strip_prefix('[') {
        let Some((addr, rest)) = v6.split_once(']') else {
            return Some(format!("`[{}` has no closing `]`", shown(v6)));
        };
        if addr.is_empty()
            || !addr
                .chars()
                .all(|c| c.is_ascii_hexdigit() || c == ':' || c == '.')
        {
            return Some(format!("`[{}]` is not an IPv6 address", shown(addr)));
        }
        match rest {
            "" => return None,
            _ => match rest.strip_prefix(':') {
                Some(p) => (None, Some(p)),
                None => return Some(format!("`{}` after `[{addr}]`", shown(rest))),
            },
        }
    } else {
        match host.split_once(':') {
            Some((n, p)) => (Some(n), Some(p)),
            None => (Some(host), None),
        }
    };
    if let Some(n) = name {
        if let Some(p) = host_name(n) {
            return Some(p);
        }
    }
    match port {
        Some(p) if !matches!(p.parse::<u16>(), Ok(1..)) || p.starts_with('+') => Some(format!(
            "the port `{}` is not a number from 1 to 65535",
            shown(p)
        )),
        _ => None,
    }
}

/// A DNS name: dot-separated labels of lower-case letters, digits and inner hyphens.
fn host_name(name: &str) -> Option<String> {
    if name.is_empty() {
        return Some("the host is empty".to_owned());
    }
    if let Some(c) = name.chars().find(char::is_ascii_uppercase) {
        return Some(format!(
            "the host has the upper-case `{c}`: references are matched as written, in lower \
             case; write it in lower case"
        ));
    }
    let shown_name = shown(name);
    for label in name.split('.') {
        if label.is_empty() {
            return Some(format!(
                "the host `{shown_name}` has an empty label (`..`, or a leading or trailing `.`)"
            ));
        }
        if let Some(c) = label
            .chars()
            .find(|c| !(c.is_ascii_alphanumeric() || *c == '-'))
        {
            return Some(format!(
                "the host `{shown_name}` has `{c}`: a host name has letters, digits, `-` and `.`"
            ));
        }
        if label.starts_with('-') || label.ends_with('-') {
            return Some(format!(
                "the host label `{}` starts or ends with `-`",
                shown(label)
            ));
        }
    }
    None
}

/// The path after the host: repository components (lower case), then an optional `:tag` or
/// `@digest`, as a reference has them.
fn repository(name: &str, path: &str) -> Option<String> {
    let repo = path.split_once('@').map_or(path, |(r, _)| r);
    let last = repo.rfind('/').map_or(0, |i| i + 1);
    let repo = match repo[last..].find(':') {
        Some(i) => &repo[..last + i],
        None => repo,
    };
    for component in repo.split('/') {
        if component.is_empty() {
            return Some(
                "the path has an empty component (`//`, or nothing after the host's `/`)"
                    .to_owned(),
            );
        }
        if let Some(c) = component.chars().find(char::is_ascii_uppercase) {
            return Some(format!(
                "the repository path has the upper-case `{c}`: a repository is lower case"
            ));
        }
    }
    format!("{SCHEME}{name}")
        .parse::<RegistryRef>()
        .err()
        .map(|_| {
            "the path is not a repository (lower-case letters, digits and `._-` between them, \
         `/` between components) with an optional `:tag` or `@sha256:digest`"
                .to_owned()
        })
}

#[cfg(test)]
mod tests {
    use super::problem;

    #[test]
    fn names_that_can_match() {
        for ok in [
            "reg.example",
            "reg.example:5000",
            "localhost",
            "127.0.0.1:5000/stacks/demo",
            "[::1]:5000/s",
            "[fe80::1]",
            "reg.example/app:V1",
            "reg.example/a_b/c--d/e.f",
            "xn--bcher-kva.example",
        ] {
            assert_eq!(problem(ok, false), None, "{ok}");
        }
        assert_eq!(problem("*.example.com", true), None);
        assert_eq!(problem("*.com", true), None);
    }

    #[test]
    fn names_that_can_never_match_say_why() {
        for (bad, wildcard, why) in [
            ("*.", true, "needs a domain"),
            ("*.*.example.com", true, "after `*.`"),
            ("*example.com", true, "leading `*.`"),
            ("reg.*.example", true, "leading `*.`"),
            ("*.example.com:5000", true, "no port or path"),
            ("*.example.com", false, "cannot have a wildcard"),
            ("REG.example", true, "upper-case `R`"),
            ("*.Example.com", true, "upper-case `E`"),
            ("reg.example/Stacks", true, "upper-case `S`"),
            ("reg\0.example", true, "U+0000"),
            ("reg.example/x\u{1b}]0;t", true, "U+001B"),
            ("reg.exämple", true, "ASCII"),
            ("reg..example", true, "empty label"),
            (".reg.example", true, "empty label"),
            ("reg.example.", true, "empty label"),
            ("-reg.example", true, "starts or ends with `-`"),
            ("reg_x.example", true, "has `_`"),
            ("reg.example:0", true, "port"),
            ("reg.example:99999", true, "port"),
            ("reg.example:", true, "port"),
            (":5000", true, "host is empty"),
            ("[::1", true, "closing"),
            ("[zz]", true, "IPv6"),
            ("reg.example//x", true, "empty component"),
            ("reg.example/x..y", true, "not a repository"),
            ("reg.example/x:bad!tag", true, "not a repository"),
            ("reg.example/x@sha256:12", true, "not a repository"),
        ] {
            let p = problem(bad, wildcard).unwrap_or_else(|| panic!("{bad:?} passed"));
            assert!(p.contains(why), "{bad:?}: {p}");
        }
    }
}
