//! Quoting for `sh`: a leaf both the parser (cloud-config's `runcmd` lists) and the stager (the
//! first-boot script) use.

/// Quotes a word for `sh`: as it is when it holds only characters no shell treats specially,
/// else in single quotes.
pub(crate) fn shell_quote(word: &str) -> String {
    let safe = !word.is_empty()
        && word
            .bytes()
            .all(|b| b.is_ascii_alphanumeric() || b"-_./=:,+@%".contains(&b));
    if safe {
        word.to_string()
    } else {
        format!("'{}'", word.replace('\'', r"'\''"))
    }
}

#[cfg(test)]
mod tests {
    use super::shell_quote;

    #[test]
    fn quotes_what_a_shell_would_read_otherwise() {
        assert_eq!(shell_quote("/etc/ingot"), "/etc/ingot");
        assert_eq!(shell_quote(""), "''");
        assert_eq!(shell_quote("a b"), "'a b'");
        assert_eq!(shell_quote("it's"), r"'it'\''s'");
    }
}
