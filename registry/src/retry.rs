//! Whether a failure is worth another attempt ([`classify_status`], [`classify_http`]: pure
//! functions of the failure, the one classification of every request), and how many attempts to make
//! ([`RetryPolicy`], [`Budget`], [`retry`]).
//!
//! Transient: connection refused or reset, timeouts, a body cut short, an error body too long to
//! read, HTTP 408, 429 and 5xx. Permanent: authentication, not found, other 4xx, digest
//! mismatches, redirect loops, a request that cannot even be built (a token realm that is not an
//! http(s) URL): no retry can change those.

use std::future::Future;
use std::time::Duration;

use serde::Deserialize;
use tracing::warn;

use crate::error::{Cause, RegistryError};
use crate::scrub::Scrubber;

/// How often and how patiently to retry.
#[derive(Debug, Clone, Copy)]
pub struct RetryPolicy {
    /// Attempts in a row without progress before giving up (at least 1).
    pub attempts: u32,
    /// The first backoff.
    pub initial: Duration,
    /// The longest backoff.
    pub max: Duration,
}

impl Default for RetryPolicy {
    fn default() -> Self {
        RetryPolicy {
            attempts: 8,
            initial: Duration::from_millis(500),
            max: Duration::from_secs(8),
        }
    }
}

impl RetryPolicy {
    /// The wait after the `failures`-th failure in a row: doubling from `initial`, at most `max`.
    pub fn backoff(&self, failures: u32) -> Duration {
        let factor = 1u32 << failures.saturating_sub(1).min(16);
        self.initial.saturating_mul(factor).min(self.max)
    }
}

/// What one failed attempt means.
#[derive(Debug)]
pub(crate) enum Failure {
    /// Worth another attempt.
    Transient(Cause),
    /// Transient, but no progress however many bytes came: the retry budget is not renewed.
    TooSlow(Cause),
    /// No retry can fix it.
    Fatal(RegistryError),
}

/// The attempts left for one operation.
#[derive(Debug)]
pub(crate) struct Budget {
    policy: RetryPolicy,
    failures: u32,
}

impl Budget {
    pub(crate) fn new(policy: RetryPolicy) -> Self {
        Budget {
            policy,
            failures: 0,
        }
    }

    /// One more failed attempt; `renewed`: it moved forward well enough to start the count over.
    /// Returns the wait before the next attempt, or `None` when the attempts are used up.
    pub(crate) fn failed(&mut self, renewed: bool) -> Option<Duration> {
        if renewed {
            self.failures = 0;
        }
        self.failures += 1;
        (self.failures < self.policy.attempts.max(1)).then(|| self.policy.backoff(self.failures))
    }

    /// Failed attempts in a row so far.
    pub(crate) fn failures(&self) -> u32 {
        self.failures
    }

    /// The policy's attempts (for messages).
    pub(crate) fn attempts(&self) -> u32 {
        self.policy.attempts
    }
}

/// Run `op` until it succeeds, fails for good, or the attempts are used up.
pub(crate) async fn retry<T, F, Fut>(
    policy: RetryPolicy,
    what: &str,
    mut op: F,
) -> Result<T, RegistryError>
where
    F: FnMut() -> Fut,
    Fut: Future<Output = Result<T, Failure>>,
{
    let mut budget = Budget::new(policy);
    loop {
        let cause = match op().await {
            Ok(v) => return Ok(v),
            Err(Failure::Fatal(e)) => return Err(e),
            Err(Failure::Transient(c) | Failure::TooSlow(c)) => c,
        };
        let Some(wait) = budget.failed(false) else {
            return Err(RegistryError::Transient {
                op: what.to_owned(),
                attempts: budget.failures(),
                last: cause,
            });
        };
        warn!(
            "{what}: {}; retrying in {wait:?} ({}/{})",
            crate::error_chain::text(&cause),
            budget.failures(),
            budget.attempts()
        );
        tokio::time::sleep(wait).await;
    }
}

/// Who is asking: for authentication errors and scrubbing.
pub(crate) struct Context<'a> {
    /// `host[:port]`.
    pub registry: &'a str,
    /// Where the credentials came from.
    pub auth_source: &'a str,
    /// The credentials to keep out of messages.
    pub scrubber: &'a Scrubber,
    /// A mirror is asking: a connection that cannot be made is not retried.
    pub mirror: bool,
}

/// The most of a registry's text that goes into a message.
const MESSAGE_TEXT: usize = 2000;

impl Context<'_> {
    /// Registry text made safe for a message: credentials out (before cutting, so no piece of
    /// one is left), at most [`MESSAGE_TEXT`] characters.
    pub(crate) fn text(&self, raw: &[u8]) -> String {
        let text = self.scrubber.scrub(&String::from_utf8_lossy(raw));
        match text.char_indices().nth(MESSAGE_TEXT) {
            Some((i, _)) => format!("{}…", &text[..i]),
            None => text,
        }
    }

    pub(crate) fn auth_failed(&self, detail: String) -> Failure {
        Failure::Fatal(RegistryError::Auth {
            registry: self.registry.to_owned(),
            source_desc: format!("credentials: {}", self.auth_source),
            detail: self.scrubber.scrub(&detail),
        })
    }
}

/// An answer with a non-success HTTP status and (the start of) its body.
pub(crate) fn classify_status(ctx: &Context<'_>, what: &str, code: u16, body: &[u8]) -> Failure {
    if code == 401 {
        return ctx.auth_failed(format!("HTTP 401 Unauthorized for {what}"));
    }
    if (400..500).contains(&code) {
        if let Ok(envelope) = serde_json::from_slice::<Envelope>(body) {
            if let Some(f) = classify_envelope(ctx, what, code, &envelope) {
                return f;
            }
        }
    }
    let text = ctx.text(body);
    match code {
        403 => ctx.auth_failed(format!("HTTP 403 for {what}")),
        404 => Failure::Fatal(RegistryError::NotFound(what.to_owned())),
        408 | 429 | 500..=599 => Failure::Transient(Cause::Status {
            status: code,
            body: text,
        }),
        _ => Failure::Fatal(RegistryError::Refused {
            what: what.to_owned(),
            cause: Cause::Status {
                status: code,
                body: text,
            },
        }),
    }
}

/// The distribution spec's error body: `{"errors":[{"code","message","detail"}]}`.
#[derive(Deserialize)]
struct Envelope {
    errors: Vec<EnvelopeError>,
}

#[derive(Deserialize)]
struct EnvelopeError {
    code: String,
    #[serde(default)]
    message: String,
}

impl Envelope {
    /// `CODE: message; …`, for a message.
    fn text(&self) -> String {
        let each: Vec<String> = self
            .errors
            .iter()
            .map(|e| format!("{}: {}", e.code, e.message))
            .collect();
        each.join("; ")
    }
}

/// The distribution spec's error codes; `None` when they say nothing the status does not.
fn classify_envelope(
    ctx: &Context<'_>,
    what: &str,
    code: u16,
    envelope: &Envelope,
) -> Option<Failure> {
    let text = ctx.text(envelope.text().as_bytes());
    let any = |names: &[&str]| {
        envelope
            .errors
            .iter()
            .any(|e| names.contains(&e.code.as_str()))
    };
    if any(&["UNAUTHORIZED", "DENIED"]) {
        Some(ctx.auth_failed(format!("{what}: {text}")))
    } else if any(&[
        "BLOB_UNKNOWN",
        "MANIFEST_UNKNOWN",
        "NAME_UNKNOWN",
        "NOT_FOUND",
    ]) {
        Some(Failure::Fatal(RegistryError::NotFound(what.to_owned())))
    } else if any(&["TOOMANYREQUESTS"]) {
        Some(Failure::Transient(Cause::Status {
            status: code,
            body: text,
        }))
    } else if envelope.errors.is_empty() {
        None
    } else {
        Some(Failure::Fatal(RegistryError::Refused {
            what: what.to_owned(),
            cause: Cause::Status {
                status: code,
                body: text,
            },
        }))
    }
}

/// A request that failed in `reqwest`: no connection, a timeout, a redirect loop, …
pub(crate) fn classify_http(ctx: &Context<'_>, what: &str, e: reqwest::Error) -> Failure {
    if e.is_redirect() {
        return Failure::Fatal(RegistryError::Refused {
            what: format!("{what}: the registry's redirects go in a circle or never end"),
            cause: Cause::Redirects(e),
        });
    }
    if e.is_builder() {
        // The URL or a header is unusable: the same request fails the same way every time.
        return Failure::Fatal(RegistryError::Refused {
            what: format!("{what}: the request cannot be made"),
            cause: Cause::Http(e),
        });
    }
    match e.status() {
        Some(st) => classify_status(ctx, what, st.as_u16(), b""),
        // A mirror that cannot be connected to (refused, no answer in time, a TLS handshake
        // that fails) is given up on at once: the next source is tried, and the mirror is
        // skipped for the rest of the run.
        None if ctx.mirror && e.is_connect() => Failure::Fatal(RegistryError::Transient {
            op: what.to_owned(),
            attempts: 1,
            last: Cause::Connect(e),
        }),
        None => Failure::Transient(Cause::Http(e)),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::auth::{Credentials, Secret};

    fn scrubber() -> Scrubber {
        Scrubber::new(&Credentials::Basic {
            username: "alice".into(),
            password: Secret::new("hunter22"),
        })
    }

    /// What a failure is, in one word, for the table.
    fn kind(f: &Failure) -> &'static str {
        match f {
            Failure::Transient(_) | Failure::TooSlow(_) => "retry",
            Failure::Fatal(RegistryError::Auth { .. }) => "auth",
            Failure::Fatal(RegistryError::NotFound(_)) => "not-found",
            Failure::Fatal(RegistryError::Integrity { .. }) => "integrity",
            Failure::Fatal(_) => "fatal",
        }
    }

    #[test]
    fn every_status_is_retried_or_fatal() {
        let s = scrubber();
        let ctx = Context {
            registry: "r.example",
            auth_source: "--username alice",
            scrubber: &s,
            mirror: false,
        };
        let envelope = |code: &str| format!(r#"{{"errors":[{{"code":"{code}","message":"m"}}]}}"#);
        let table: &[(u16, String, &str)] = &[
            (400, String::new(), "fatal"),
            (401, String::new(), "auth"),
            (403, String::new(), "auth"),
            (404, String::new(), "not-found"),
            (405, String::new(), "fatal"),
            (408, String::new(), "retry"),
            (409, String::new(), "fatal"),
            (416, String::new(), "fatal"),
            (429, String::new(), "retry"),
            (500, String::new(), "retry"),
            (502, "bad gateway".into(), "retry"),
            (503, String::new(), "retry"),
            (599, String::new(), "retry"),
            (300, String::new(), "fatal"),
            (400, envelope("DENIED"), "auth"),
            (400, envelope("UNAUTHORIZED"), "auth"),
            (404, envelope("BLOB_UNKNOWN"), "not-found"),
            (400, envelope("MANIFEST_UNKNOWN"), "not-found"),
            (400, envelope("NAME_UNKNOWN"), "not-found"),
            (429, envelope("TOOMANYREQUESTS"), "retry"),
            (400, envelope("TOOMANYREQUESTS"), "retry"),
            (400, envelope("DIGEST_INVALID"), "fatal"),
            (403, r#"{"errors":[]}"#.into(), "auth"),
            // A 5xx's body is not an envelope to believe: a 500 saying DENIED is a 500.
            (500, envelope("DENIED"), "retry"),
        ];
        for (code, body, want) in table {
            let f = classify_status(&ctx, "blob x", *code, body.as_bytes());
            assert_eq!(kind(&f), *want, "HTTP {code} {body}: {f:?}");
        }
        // A code the spec does not list still decides over the status.
        let f = classify_status(&ctx, "blob x", 404, envelope("SOMETHING_NEW").as_bytes());
        assert_eq!(kind(&f), "fatal", "{f:?}");
    }

    #[test]
    fn registry_text_in_a_failure_is_scrubbed() {
        let s = scrubber();
        let ctx = Context {
            registry: "r.example",
            auth_source: "--username alice",
            scrubber: &s,
            mirror: false,
        };
        for code in [400, 500] {
            let f = classify_status(&ctx, "blob x", code, b"echo: Basic YWxpY2U6aHVudGVyMjI=");
            let text = match f {
                Failure::Transient(c) => crate::error_chain::text(&c),
                Failure::Fatal(e) => crate::error_chain::text(&e),
                Failure::TooSlow(c) => c.to_string(),
            };
            assert!(!text.contains("YWxpY2U6aHVudGVyMjI="), "{text}");
            assert!(text.contains("<redacted>"), "{text}");
        }
    }

    #[test]
    fn the_budget_counts_attempts_backs_off_bounded_and_gives_up() {
        let policy = RetryPolicy {
            attempts: 5,
            initial: Duration::from_millis(500),
            max: Duration::from_secs(2),
        };
        let mut b = Budget::new(policy);
        let waits: Vec<_> = (0..4).map(|_| b.failed(false)).collect();
        let ms = |n| Some(Duration::from_millis(n));
        assert_eq!(waits, [ms(500), ms(1000), ms(2000), ms(2000)]);
        assert_eq!(b.failed(false), None, "the fifth failure in a row gives up");
        assert_eq!(b.failures(), 5);
        // Progress starts the count over.
        let mut b = Budget::new(policy);
        for _ in 0..10 {
            assert_eq!(b.failed(true), ms(500));
        }
        // A huge count does not overflow the backoff.
        assert_eq!(policy.backoff(u32::MAX), Duration::from_secs(2));
        let once = RetryPolicy {
            attempts: 0,
            ..policy
        };
        assert_eq!(
            Budget::new(once).failed(false),
            None,
            "at least one attempt"
        );
    }

    #[test]
    fn the_retry_loop_stops_at_success_at_a_fatal_failure_and_after_the_attempts() {
        let rt = tokio::runtime::Builder::new_current_thread()
            .enable_time()
            .build()
            .unwrap();
        let policy = RetryPolicy {
            attempts: 4,
            initial: Duration::from_millis(1),
            max: Duration::from_millis(2),
        };
        let calls = std::cell::Cell::new(0u32);
        let transient = || Failure::Transient(Cause::Answer("flaky".into()));
        // Two failures, then success: three calls.
        let r = rt.block_on(retry(policy, "op", || {
            calls.set(calls.get() + 1);
            let n = calls.get();
            async move {
                if n < 3 {
                    Err(transient())
                } else {
                    Ok(n)
                }
            }
        }));
        assert_eq!(r.unwrap(), 3);
        // Always failing: exactly `attempts` calls, then the last cause.
        calls.set(0);
        let r: Result<(), _> = rt.block_on(retry(policy, "op", || {
            calls.set(calls.get() + 1);
            async { Err(transient()) }
        }));
        assert_eq!(calls.get(), 4);
        match r {
            Err(RegistryError::Transient {
                attempts: 4, last, ..
            }) => {
                assert_eq!(last.to_string(), "flaky")
            }
            other => panic!("{other:?}"),
        }
        // A fatal failure: one call.
        calls.set(0);
        let r: Result<(), _> = rt.block_on(retry(policy, "op", || {
            calls.set(calls.get() + 1);
            async { Err(Failure::Fatal(RegistryError::NotFound("x".into()))) }
        }));
        assert_eq!(calls.get(), 1);
        assert!(matches!(r, Err(RegistryError::NotFound(_))));
    }
}
