//! What a registry may make ingot spend: bytes of memory for a manifest, and time for a blob.
//!
//! - **size**: a manifest or index is read into memory, so its body is capped at
//!   [`MAX_MANIFEST_SIZE`] (the distribution spec's limit): a `Content-Length` above it is
//!   refused before the body is read, and a body that grows past it (chunked, or lying about its
//!   length) is cut off at the cap.
//! - **time**: a transfer must average at least [`SpeedLimit::bytes_per_sec`] over every
//!   [`SpeedLimit::window`] (curl's `--speed-limit`/`--speed-time`). A slower one is dropped and
//!   retried from the last good byte; slow attempts count against the retry budget even when they
//!   moved a few bytes, so a server that trickles is given up on after about
//!   `attempts × (window + the backoff)`. A request for a manifest also has to finish within
//!   [`REQUEST_DEADLINE`], headers included.

use std::time::Duration;

use bytes::Bytes;
use reqwest::header::{HeaderMap, HeaderValue, ACCEPT, AUTHORIZATION, CONTENT_LENGTH};
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

/// Why a capped manifest request failed.
#[derive(Debug)]
pub(crate) enum GetError {
    /// The registry answered with an error status (and this body, cut to the cap).
    Status(u16, String),
    /// The body is larger than [`MAX_MANIFEST_SIZE`].
    TooLarge(String),
    /// Too slow, or past [`REQUEST_DEADLINE`].
    TooSlow(String),
    /// The connection or the HTTP exchange failed.
    Http(reqwest::Error),
}

/// A manifest's body and its `Docker-Content-Digest` header.
pub(crate) struct Got {
    pub body: Bytes,
    pub digest_header: Option<String>,
}

/// `GET url`, reading at most [`MAX_MANIFEST_SIZE`] bytes of body, within [`REQUEST_DEADLINE`]
/// and `speed`.
pub(crate) async fn get_capped(
    http: &reqwest::Client,
    url: &str,
    accept: &str,
    authorization: Option<HeaderValue>,
    speed: SpeedLimit,
) -> Result<Got, GetError> {
    match tokio::time::timeout(
        REQUEST_DEADLINE,
        get_capped_inner(http, url, accept, authorization, speed),
    )
    .await
    {
        Ok(r) => r,
        Err(_) => Err(GetError::TooSlow(format!(
            "no complete answer within {REQUEST_DEADLINE:?}"
        ))),
    }
}

async fn get_capped_inner(
    http: &reqwest::Client,
    url: &str,
    accept: &str,
    authorization: Option<HeaderValue>,
    speed: SpeedLimit,
) -> Result<Got, GetError> {
    let mut headers = HeaderMap::new();
    headers.insert(
        ACCEPT,
        HeaderValue::from_str(accept).expect("media types are header-safe"),
    );
    if let Some(a) = authorization {
        headers.insert(AUTHORIZATION, a);
    }
    let mut response = http
        .get(url)
        .headers(headers)
        .send()
        .await
        .map_err(GetError::Http)?;
    let status = response.status();
    let declared = response
        .headers()
        .get(CONTENT_LENGTH)
        .and_then(|v| v.to_str().ok())
        .and_then(|v| v.parse::<u64>().ok());
    if let Some(n) = declared.filter(|&n| n > MAX_MANIFEST_SIZE) {
        return Err(GetError::TooLarge(format!(
            "the registry announced a {n}-byte body; a manifest may have at most \
             {MAX_MANIFEST_SIZE} bytes (not read)"
        )));
    }
    let digest_header = response
        .headers()
        .get("docker-content-digest")
        .and_then(|v| v.to_str().ok())
        .map(str::to_owned);
    let mut body = Vec::new();
    let mut pace = Throughput::start(speed);
    loop {
        let chunk = match tokio::time::timeout_at(pace.window_end(), response.chunk()).await {
            Err(_) => {
                pace.check().map_err(|e| GetError::TooSlow(e.0))?;
                continue;
            }
            Ok(r) => r.map_err(GetError::Http)?,
        };
        let Some(chunk) = chunk else { break };
        if body.len() as u64 + chunk.len() as u64 > MAX_MANIFEST_SIZE {
            return Err(GetError::TooLarge(format!(
                "the body passed {MAX_MANIFEST_SIZE} bytes, the most a manifest may have; \
                 stopped reading"
            )));
        }
        body.extend_from_slice(&chunk);
        pace.add(chunk.len() as u64);
        pace.check().map_err(|e| GetError::TooSlow(e.0))?;
    }
    if !status.is_success() {
        return Err(GetError::Status(
            status.as_u16(),
            String::from_utf8_lossy(&body).into_owned(),
        ));
    }
    Ok(Got {
        body: Bytes::from(body),
        digest_header,
    })
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
}
