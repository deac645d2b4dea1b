//! What a registry may make ingot spend: bytes of memory for a manifest, and time for a blob.
//!
//! - **size**: a manifest or index is read into memory, so its body is capped at
//!   [`MAX_MANIFEST_SIZE`] (the distribution spec's limit): a `Content-Length` above it is
//!   refused before the body is read, and a body that grows past it (chunked, or lying about its
//!   length) is cut off at the cap.
//!   Every other body read into memory is capped too (`http`: error bodies 64 KiB, token
//!   answers 1 MiB); a body past its cap is a failed attempt.
//! - **time**: a transfer must average at least [`SpeedLimit::bytes_per_sec`] over every
//!   [`SpeedLimit::window`] (curl's `--speed-limit`/`--speed-time`). For a blob the window runs
//!   across all its responses (a resumed blob is one transfer). A slower one is dropped and
//!   retried from the last good byte; slow attempts count against the retry budget even when they
//!   moved a few bytes, and so does a response that ended early while the blob is behind the
//!   pace, so a server that trickles, or sends a few bytes per connection, is given up on after
//!   about `attempts × (window + the backoff)`. A request for a manifest also has to finish
//!   within [`REQUEST_DEADLINE`], headers included.

use std::time::Duration;

use tokio::time::Instant;

/// The largest manifest or index body read (4 MiB, the distribution spec's limit).
pub use crate::oci_layout::MAX_MANIFEST_SIZE;

/// How long one manifest request may take, from sending it to the body's last byte.
pub const REQUEST_DEADLINE: Duration = Duration::from_secs(60);

/// The minimum throughput of a transfer.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct SpeedLimit {
    /// Bytes per second a transfer must average over each window.
    pub bytes_per_sec: u64,
    /// The window.
    pub window: Duration,
}

impl Default for SpeedLimit {
    /// 10 KiB/s over 30 s: a registry that cannot keep that up is stalled, not slow.
    fn default() -> Self {
        SpeedLimit {
            bytes_per_sec: 10 << 10,
            window: Duration::from_secs(30),
        }
    }
}

impl SpeedLimit {
    /// The fewest bytes a full window must bring.
    fn window_bytes(&self) -> u64 {
        (self.bytes_per_sec as f64 * self.window.as_secs_f64()) as u64
    }
}

/// Keeps a transfer's throughput against a [`SpeedLimit`], window by window.
#[derive(Debug)]
pub(crate) struct Throughput {
    limit: SpeedLimit,
    window_end: Instant,
    bytes: u64,
}

/// Why a transfer was dropped.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct TooSlow(pub String);

impl Throughput {
    pub(crate) fn start(limit: SpeedLimit) -> Self {
        Throughput {
            limit,
            window_end: Instant::now() + limit.window,
            bytes: 0,
        }
    }

    /// Starts a new window now (after a window that was too slow).
    pub(crate) fn restart(&mut self) {
        self.window_end = Instant::now() + self.limit.window;
        self.bytes = 0;
    }

    /// Whether the current window, so far, keeps up the pace.
    pub(crate) fn on_pace(&self) -> bool {
        let started = self.window_end - self.limit.window;
        let elapsed = Instant::now().saturating_duration_since(started);
        self.bytes as f64 >= self.limit.bytes_per_sec as f64 * elapsed.as_secs_f64()
    }

    /// When the current window ends: wait for data no longer than this.
    pub(crate) fn window_end(&self) -> Instant {
        self.window_end
    }

    /// Counts `n` bytes that arrived.
    pub(crate) fn add(&mut self, n: u64) {
        self.bytes += n;
    }

    /// At or after the window's end: a window that brought too little ends the transfer; a good
    /// one starts the next.
    pub(crate) fn check(&mut self) -> Result<(), TooSlow> {
        let now = Instant::now();
        if now < self.window_end {
            return Ok(());
        }
        if self.bytes < self.limit.window_bytes() {
            return Err(TooSlow(format!(
                "{} bytes in {:?}, below the minimum of {} bytes/s over {:?}",
                self.bytes, self.limit.window, self.limit.bytes_per_sec, self.limit.window
            )));
        }
        self.window_end = now + self.limit.window;
        self.bytes = 0;
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_window_below_the_limit_ends_the_transfer() {
        let limit = SpeedLimit {
            bytes_per_sec: 1000,
            window: Duration::from_millis(100),
        };
        let mut t = Throughput::start(limit);
        t.add(100);
        std::thread::sleep(limit.window);
        assert_eq!(t.check(), Ok(()), "100 bytes in 100 ms is enough");
        t.add(99);
        std::thread::sleep(limit.window);
        let e = t.check().unwrap_err();
        assert!(e.0.contains("99 bytes"), "{e:?}");
    }

    #[test]
    fn on_pace_compares_the_bytes_with_the_time_the_window_has_run() {
        let limit = SpeedLimit {
            bytes_per_sec: 1000,
            window: Duration::from_secs(60),
        };
        let mut t = Throughput::start(limit);
        t.add(1000);
        assert!(t.on_pace(), "1000 bytes at once");
        std::thread::sleep(Duration::from_millis(1200));
        assert!(!t.on_pace(), "1000 bytes in 1.2 s is behind 1000 bytes/s");
        t.add(10_000);
        assert!(t.on_pace());
        t.restart();
        t.add(1);
        assert!(t.on_pace(), "a new window starts at zero");
    }
}
