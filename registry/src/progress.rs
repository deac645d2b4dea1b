//! Progress bars (bytes and throughput) on stderr, drawn only when stderr is a terminal.

use std::time::Duration;

use indicatif::{MultiProgress, ProgressBar, ProgressDrawTarget, ProgressStyle};

/// A set of per-blob progress bars.
#[derive(Debug, Clone)]
pub struct Progress {
    multi: Option<MultiProgress>,
}

impl Progress {
    /// Bars on stderr if `enabled` (indicatif draws nothing when stderr is not a terminal).
    pub fn new(enabled: bool) -> Self {
        Progress {
            multi: enabled.then(|| MultiProgress::with_draw_target(ProgressDrawTarget::stderr())),
        }
    }

    /// A bar for `total` bytes, labelled `label` (e.g. `push 3f2a…`).
    pub fn bar(&self, label: &str, total: u64) -> ProgressBar {
        let Some(multi) = &self.multi else {
            return ProgressBar::hidden();
        };
        let bar = multi.add(ProgressBar::new(total));
        bar.set_style(
            ProgressStyle::with_template(
                "{prefix:>18} [{bar:28}] {bytes:>10}/{total_bytes:<10} {binary_bytes_per_sec:>12} {eta:>4}",
            )
            .expect("the template is valid")
            .progress_chars("=> "),
        );
        bar.set_prefix(label.to_owned());
        bar
    }
}

/// `12 ab34cd56` style short form of a digest for labels.
pub fn short(digest: &str) -> &str {
    let hex = digest.strip_prefix("sha256:").unwrap_or(digest);
    &hex[..hex.len().min(12)]
}

/// `1.23 GiB in 4.5 s (274 MiB/s)`.
pub fn throughput(bytes: u64, elapsed: Duration) -> String {
    let secs = elapsed.as_secs_f64().max(1e-6);
    format!(
        "{} in {:.1} s ({}/s)",
        indicatif::BinaryBytes(bytes),
        secs,
        indicatif::BinaryBytes((bytes as f64 / secs) as u64)
    )
}
