//! How the commands print an error: its message, then each cause that adds something.
//!
//! Many of our error types name their cause in their own message (so `to_string()` alone says it
//! all, as the tests and the status file use it) and also expose it as `source()`. Printing every
//! cause of such a chain (anyhow's `{:#}`) says the same thing two or three times: "reading the
//! machine: cannot read …/device: No such file or directory: cannot read …/device: No such file or
//! directory: No such file or directory". This prints each text once.

use std::error::Error;

/// The message of `err` followed by every cause whose text it does not already hold.
pub fn chain(err: &(dyn Error + 'static)) -> String {
    let mut text = err.to_string();
    let mut cause = err.source();
    while let Some(c) = cause {
        let more = c.to_string();
        if !text.contains(&more) {
            text.push_str(": ");
            text.push_str(&more);
        }
        cause = c.source();
    }
    text
}

#[cfg(test)]
mod tests {
    use super::*;

    #[derive(Debug, thiserror::Error)]
    #[error("cannot read {path}: {source}")]
    struct Read {
        path: String,
        source: std::io::Error,
    }

    #[derive(Debug, thiserror::Error)]
    enum Outer {
        #[error("reading the machine: {0}")]
        Machine(#[from] Read),
        #[error("staging")]
        Stage(#[source] std::io::Error),
    }

    #[test]
    fn each_cause_is_said_once() {
        let io = || std::io::Error::new(std::io::ErrorKind::NotFound, "No such file or directory");
        let e = Outer::from(Read {
            path: "/sys/x/device".into(),
            source: io(),
        });
        assert_eq!(
            format!(
                "{:#}",
                anyhow::Error::from(Outer::from(Read {
                    path: "/sys/x/device".into(),
                    source: io(),
                }))
            )
            .matches("No such file")
            .count(),
            3,
            "anyhow's chain repeats it"
        );
        assert_eq!(
            chain(&e),
            "reading the machine: cannot read /sys/x/device: No such file or directory"
        );
        // A cause the message does not name is still printed.
        assert_eq!(
            chain(&Outer::Stage(io())),
            "staging: No such file or directory"
        );
    }
}
