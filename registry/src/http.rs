//! The one HTTP client every request uses (manifests, blobs, tokens, uploads, HEAD requests):
//! timeouts, user agent, TLS trust (`--ca-file`, `--insecure`), plain HTTP or HTTPS. Proxies come
//! from the environment (`HTTP_PROXY`, `HTTPS_PROXY`, `NO_PROXY`, …), read by `reqwest`.
//!
//! ingot speaks the distribution API itself rather than through `oci-client`: a pull must cap
//! every body it reads (a manifest, an error, a token answer) and resume a blob from its last good
//! byte, which `oci-client` does not do, and one client means one authorization path
//! (`token`) and one failure classification (`retry`) for pulls and pushes alike.
//!
//! Every body ingot reads into memory goes through [`read_capped`]: a registry decides neither
//! how much memory an error body, a token answer or a manifest takes, nor how long it takes.

use std::path::Path;
use std::time::Duration;

use tokio::time::Instant;

use crate::error::{Cause, RegistryError};
use crate::options::RegistryOptions;
use crate::reference::RegistryRef;
use crate::retry::{classify_http, classify_status, Context, Failure};

/// How long a connection may take to open.
pub const CONNECT_TIMEOUT: Duration = Duration::from_secs(15);
/// How long a connection to a mirror may take to open: a mirror is a shortcut with the origin
/// behind it, and one that does not answer (a dropped SYN) is skipped for the rest of the run.
pub const MIRROR_CONNECT_TIMEOUT: Duration = Duration::from_secs(5);
/// How long a read may wait for the next bytes.
pub const READ_TIMEOUT: Duration = Duration::from_secs(60);
/// The most of an error answer's body read (it only goes into a message).
pub const ERROR_BODY_CAP: u64 = 64 << 10;
/// The most of a token service's answer read (a token, as JSON).
pub const TOKEN_BODY_CAP: u64 = 1 << 20;
/// How long reading an error body or a token answer may take.
pub const SMALL_BODY_DEADLINE: Duration = Duration::from_secs(30);

/// The client and the scheme it speaks; cloning shares the client (and its connection pool).
#[derive(Clone)]
pub(crate) struct Transport {
    /// `http` or `https`.
    pub scheme: &'static str,
    /// Every request.
    pub http: reqwest::Client,
}

/// A `--ca-file`: PEM, checked here so a wrong file is named rather than failing every request.
fn read_ca_file(path: &Path) -> Result<Vec<u8>, RegistryError> {
    let data = std::fs::read(path).map_err(RegistryError::io(path))?;
    if !String::from_utf8_lossy(&data).contains("-----BEGIN CERTIFICATE-----") {
        return Err(RegistryError::Reference(format!(
            "--ca-file {}: not a PEM certificate (no BEGIN CERTIFICATE line)",
            path.display()
        )));
    }
    Ok(data)
}

/// Whether the registry `reference` names is spoken to in plain HTTP.
pub(crate) fn is_plain(reference: &RegistryRef, options: &RegistryOptions) -> bool {
    let tls_asked = options.insecure || options.ca_file.is_some();
    options.plain_http || (reference.is_loopback() && !tls_asked)
}

/// The client for the registry `reference` names (`mirror`: a mirror's, which waits less for
/// a connection).
pub(crate) fn transport(
    reference: &RegistryRef,
    options: &RegistryOptions,
    mirror: bool,
) -> Result<Transport, RegistryError> {
    let plain = is_plain(reference, options);
    let connect_timeout = if mirror {
        MIRROR_CONNECT_TIMEOUT
    } else {
        CONNECT_TIMEOUT
    };
    let ca = match &options.ca_file {
        Some(path) => Some((path, read_ca_file(path)?)),
        None => None,
    };

    let mut http = reqwest::Client::builder()
        .read_timeout(READ_TIMEOUT)
        .connect_timeout(connect_timeout)
        .user_agent(crate::USER_AGENT)
        .danger_accept_invalid_certs(options.insecure);
    if let Some((path, pem)) = &ca {
        let cert =
            reqwest::Certificate::from_pem(pem).map_err(|source| RegistryError::Certificate {
                path: path.to_path_buf(),
                source,
            })?;
        http = http.add_root_certificate(cert);
    }
    let http = http.build().map_err(|e| RegistryError::Setup {
        what: "the HTTP client",
        source: Box::new(e),
    })?;

    Ok(Transport {
        scheme: if plain { "http" } else { "https" },
        http,
    })
}

/// Why [`read_capped`] stopped.
#[derive(Debug)]
pub(crate) enum Capped {
    /// The body passed the cap.
    TooLarge,
    /// The body did not end by the deadline.
    TooSlow,
    /// The connection failed.
    Http(reqwest::Error),
}

/// A response's body, at most `cap` bytes of it, by `deadline`.
pub(crate) async fn read_capped(
    response: &mut reqwest::Response,
    cap: u64,
    deadline: Instant,
) -> Result<Vec<u8>, Capped> {
    if response.content_length().is_some_and(|n| n > cap) {
        return Err(Capped::TooLarge);
    }
    let mut body = Vec::new();
    loop {
        let chunk = match tokio::time::timeout_at(deadline, response.chunk()).await {
            Err(_) => return Err(Capped::TooSlow),
            Ok(r) => r.map_err(Capped::Http)?,
        };
        let Some(chunk) = chunk else {
            return Ok(body);
        };
        if body.len() as u64 + chunk.len() as u64 > cap {
            return Err(Capped::TooLarge);
        }
        body.extend_from_slice(&chunk);
    }
}

/// An answer with an error status, as a failure: its body read (at most [`ERROR_BODY_CAP`]
/// bytes, within [`SMALL_BODY_DEADLINE`]) for the message. A body past the cap, or too slow, is a
/// failed attempt whatever the status says.
pub(crate) async fn error_answer(
    ctx: &Context<'_>,
    what: &str,
    mut response: reqwest::Response,
) -> Failure {
    let status = response.status().as_u16();
    let deadline = Instant::now() + SMALL_BODY_DEADLINE;
    match read_capped(&mut response, ERROR_BODY_CAP, deadline).await {
        Ok(body) => classify_status(ctx, what, status, &body),
        Err(Capped::TooLarge) => Failure::Transient(Cause::BodyTooLarge {
            what: format!("error body (HTTP {status})"),
            cap: ERROR_BODY_CAP,
        }),
        Err(Capped::TooSlow) => Failure::Transient(Cause::TooSlow(format!(
            "the error body (HTTP {status}) did not end within {SMALL_BODY_DEADLINE:?}"
        ))),
        Err(Capped::Http(e)) => classify_http(ctx, what, e),
    }
}
