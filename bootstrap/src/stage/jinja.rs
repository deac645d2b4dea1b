//! The jinja that CABPK/CAPH templates use: only the host name variables are rendered.

/// cloud-init's jinja variables for the host name that CABPK/CAPH templates use.
const JINJA_HOSTNAME_VARS: &[&str] = &[
    "ds.meta_data.hostname",
    "ds.meta_data.local_hostname",
    "v1.local_hostname",
    "v1.hostname",
    "local_hostname",
];

/// Substitutes the known hostname variables; `true` when other `{{ ... }}` remain.
pub(super) fn render_jinja(text: &str, host: &str) -> (String, bool) {
    let mut out = String::with_capacity(text.len());
    let mut rest = text;
    let mut unresolved = false;
    while let Some(start) = rest.find("{{") {
        let Some(len) = rest[start..].find("}}") else {
            break;
        };
        let inner = rest[start + 2..start + len].trim();
        out.push_str(&rest[..start]);
        if JINJA_HOSTNAME_VARS.contains(&inner) {
            out.push_str(host);
        } else {
            unresolved = true;
            out.push_str(&rest[start..start + len + 2]);
        }
        rest = &rest[start + len + 2..];
    }
    out.push_str(rest);
    (out, unresolved || rest.contains("{%"))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn jinja_hostname_vars() {
        let (t, u) = render_jinja(
            "name: '{{ ds.meta_data.hostname }}' x {{v1.local_hostname}}",
            "n1",
        );
        assert_eq!(t, "name: 'n1' x n1");
        assert!(!u);
        let (t, u) = render_jinja("a {{ ds.meta_data.other }} b", "n1");
        assert_eq!(t, "a {{ ds.meta_data.other }} b");
        assert!(u);
    }
}
