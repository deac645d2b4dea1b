//! A QEMU serial console as text, for markers to be read from it.

/// The serial log without CRs and ANSI escape sequences (OVMF draws with them).
pub fn clean(raw: &[u8]) -> String {
    let text = String::from_utf8_lossy(raw);
    let mut out = String::with_capacity(text.len());
    let mut chars = text.chars().peekable();
    while let Some(c) = chars.next() {
        match c {
            '\r' => {}
            '\u{1b}' => {
                if chars.peek() == Some(&'[') {
                    chars.next();
                    for c in chars.by_ref() {
                        if c.is_ascii_alphabetic() {
                            break;
                        }
                    }
                }
            }
            c => out.push(c),
        }
    }
    out
}

/// The last `n` lines of `console`, after a line saying how many were left out.
pub fn tail(console: &str, n: usize) -> String {
    let lines: Vec<&str> = console.lines().collect();
    let skip = lines.len().saturating_sub(n);
    let mut out = if skip > 0 {
        format!("[… {skip} lines before …]\n")
    } else {
        String::new()
    };
    out.push_str(&lines[skip..].join("\n"));
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn tail_keeps_the_end_and_says_what_it_left_out() {
        let console: String = (1..=5).map(|i| format!("line {i}\n")).collect();
        assert_eq!(tail(&console, 2), "[… 3 lines before …]\nline 4\nline 5");
        assert_eq!(tail(&console, 9), console.trim_end());
    }
}
