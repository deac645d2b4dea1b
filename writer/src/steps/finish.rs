//! `finish`: the run's one-line summary, recorded as done.
//!
//! Reads what was written; returns the summary line (the caller prints it as its protocol says).

use std::path::Path;

use crate::report::Reporter;
use crate::request::{Outcome, Provisioned};

fn layer_list(outcome: &Outcome) -> String {
    let names: Vec<&str> = outcome.layers.iter().map(|(n, _)| n.as_str()).collect();
    names.join(", ")
}

/// A stack written to a named target.
pub fn written(outcome: &Outcome, target: &Path, reporter: &Reporter) -> String {
    let msg = format!(
        "wrote {} ({}) to {}: layers {}; {} bytes written, {} zero bytes skipped, {} rewrites",
        outcome.stack,
        outcome.manifest_digest,
        target.display(),
        layer_list(outcome),
        outcome.bytes_written,
        outcome.bytes_skipped,
        outcome.rewrites
    );
    reporter.done(&msg);
    msg
}

/// A machine provisioned.
pub fn provisioned(done: &Provisioned, reporter: &Reporter) -> String {
    let msg = format!(
        "wrote {} ({}) to {} for {} ({}): layers {}; {} bytes written, {} rewrites",
        done.outcome.stack,
        done.outcome.manifest_digest,
        done.disk,
        done.hostname,
        done.role.as_str(),
        layer_list(&done.outcome),
        done.outcome.bytes_written,
        done.outcome.rewrites
    );
    reporter.done(&msg);
    msg
}
