//! An error as one line: its message, then each cause, joined by `: ` (what anyhow's `{:#}`
//! prints, for code that holds the error by reference). No variant formats its own source (the
//! workspace's error rule, checked by `writer/tests/deps.rs`), so each cause appears once.

use std::error::Error;

/// `err`'s message followed by every cause.
pub fn text(err: &(dyn Error + 'static)) -> String {
    let mut line = err.to_string();
    let mut cause = err.source();
    while let Some(c) = cause {
        line.push_str(": ");
        line.push_str(&c.to_string());
        cause = c.source();
    }
    line
}

#[cfg(test)]
mod tests {
    #[derive(Debug, thiserror::Error)]
    #[error("reading {path}")]
    struct Read {
        path: String,
        source: std::io::Error,
    }

    #[derive(Debug, thiserror::Error)]
    #[error("reading the machine")]
    struct Outer(#[source] Read);

    #[test]
    fn every_cause_is_said_once_in_order() {
        let io = std::io::Error::new(std::io::ErrorKind::NotFound, "No such file or directory");
        let e = Outer(Read {
            path: "/sys/x/device".into(),
            source: io,
        });
        assert_eq!(
            super::text(&e),
            "reading the machine: reading /sys/x/device: No such file or directory"
        );
        assert_eq!(super::text(&e), format!("{:#}", anyhow::Error::new(e)));
    }
}
