//! What reaches a terminal from a stack. Names, versions, paths, SBOM fields, signature
//! comments and error text quoting them come from a layout or a registry nobody has to have
//! signed: printed raw, an escape sequence retitles or clears the terminal and a newline forges
//! a line. Every human-readable printer (`inspect`, `diff`, `verify`, error lines) shows such a
//! string through [`safe`] or [`Safe`]; JSON output is escaped by `serde_json` already.

use std::borrow::Cow;
use std::fmt;

/// `s` as a terminal may show it: every character that is not printable (control characters,
/// so ESC and newlines; Unicode format characters such as bidi overrides; separators other than
/// the space; unassigned and private-use code points) and the backslash written as Rust escapes
/// (`\u{1b}`, `\n`, `\u{202e}`, `\\`), so what is shown cannot be mistaken for text that was
/// there. Everything else, non-ASCII letters included, is shown as it is.
pub fn safe(s: &str) -> Cow<'_, str> {
    escape(s, true)
}

/// Error text as a terminal may show it: as [`safe`], but a backslash stays one. Errors quote
/// what they name with `{:?}` already (a newline in a name is `\n` there, a backslash `\\`),
/// so escaping the backslash again would only double what the reader sees.
pub fn safe_text(s: &str) -> Cow<'_, str> {
    escape(s, false)
}

fn escape(s: &str, backslash: bool) -> Cow<'_, str> {
    let plain = |c: char| c == ' ' || c.is_ascii_graphic() && (c != '\\' || !backslash);
    if s.chars().all(plain) {
        return Cow::Borrowed(s);
    }
    let mut out = String::with_capacity(s.len() + 8);
    for c in s.chars() {
        match c {
            // escape_debug escapes quotes too, which are printable.
            c if plain(c) => out.push(c),
            c => out.extend(c.escape_debug()),
        }
    }
    Cow::Owned(out)
}

/// Error text shown through [`safe_text`] by `{}`.
pub struct SafeText<'a>(pub &'a str);

impl fmt::Display for SafeText<'_> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.pad(&safe_text(self.0))
    }
}

/// A string shown through [`safe`] by `{}` (width and alignment apply to the escaped text).
pub struct Safe<'a>(pub &'a str);

impl fmt::Display for Safe<'_> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.pad(&safe(self.0))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn what_a_terminal_would_act_on_is_escaped() {
        let cases = [
            ("zlib1g 1:1.2.13 amd64", "zlib1g 1:1.2.13 amd64"),
            ("\u{1b}]0;owned\u{7}", "\\u{1b}]0;owned\\u{7}"),
            ("a\nlayer `x` ok", "a\\nlayer `x` ok"),
            ("\r\t", "\\r\\t"),
            ("\u{9b}2J", "\\u{9b}2J"),
            ("evil\u{202e}txt.exe", "evil\\u{202e}txt.exe"),
            ("line\u{2028}sep", "line\\u{2028}sep"),
            ("back\\slash", "back\\\\slash"),
            ("\"quoted\" 'it'", "\"quoted\" 'it'"),
            ("café ünïcode 名前", "café ünïcode 名前"),
        ];
        for (raw, shown) in cases {
            assert_eq!(safe(raw), shown, "{raw:?}");
        }
        assert_eq!(format!("[{:<6}]", Safe("a\nb")), "[a\\nb  ]");
        assert_eq!(
            safe_text("name \"a\\nb\"\n\u{1b}"),
            "name \"a\\nb\"\\n\\u{1b}"
        );
    }
}
