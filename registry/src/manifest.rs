//! Manifests, read with a cap, so that neither their size nor their pace is the registry's choice ([`crate::limits`]): at most
//! [`MAX_MANIFEST_SIZE`] bytes, within [`REQUEST_DEADLINE`], at the minimum speed. A tag is
//! resolved by fetching its manifest and hashing it.

use bytes::Bytes;
use reqwest::header::{HeaderValue, ACCEPT, CONTENT_LENGTH};

use crate::client::Endpoint;
use crate::error::{Cause, RegistryError};
use crate::http::error_answer;
use crate::limits::{SpeedLimit, Throughput, MAX_MANIFEST_SIZE, REQUEST_DEADLINE};
use crate::oci_layout::{sha256_digest, ImageManifest, INDEX_MEDIA_TYPE, MANIFEST_MEDIA_TYPE};
use crate::reference::RegistryRef;
use crate::retry::{classify_http, retry, Context, Failure};
use crate::token::Access;

/// The media types a tag may resolve to (the manifest and index types of OCI and docker).
const ANY_MANIFEST: &str = "application/vnd.oci.image.manifest.v1+json, \
     application/vnd.oci.image.index.v1+json, \
     application/vnd.docker.distribution.manifest.v2+json, \
     application/vnd.docker.distribution.manifest.list.v2+json";

/// What [`Registry::fetch_stack`] returns.
#[derive(Debug, Clone)]
pub struct FetchedStack {
    /// `sha256:…` of the manifest.
    pub manifest_digest: String,
    /// The manifest's exact bytes.
    pub manifest_bytes: Vec<u8>,
    /// The manifest, parsed.
    pub manifest: ImageManifest,
    /// The config blob's bytes: the stack descriptor (signature not yet checked).
    pub descriptor_bytes: Vec<u8>,
}

/// A manifest's body and its `Docker-Content-Digest` header.
struct Got {
    body: Bytes,
    digest_header: Option<String>,
}

/// One request for a manifest.
struct Get<'a> {
    ctx: Context<'a>,
    what: &'a str,
    url: &'a str,
    accept: &'a str,
    speed: SpeedLimit,
}

impl Get<'_> {
    /// `GET url`, reading at most [`MAX_MANIFEST_SIZE`] bytes of body, within
    /// [`REQUEST_DEADLINE`] and the minimum speed.
    async fn send(&self, endpoint: &Endpoint, reference: &RegistryRef) -> Result<Got, Failure> {
        match tokio::time::timeout(REQUEST_DEADLINE, self.send_inner(endpoint, reference)).await {
            Ok(r) => r,
            Err(_) => Err(Failure::TooSlow(Cause::TooSlow(format!(
                "no complete answer within {REQUEST_DEADLINE:?}"
            )))),
        }
    }

    fn too_large(&self, detail: String) -> Failure {
        Failure::Fatal(RegistryError::Protocol(format!("{}: {detail}", self.what)))
    }

    async fn send_inner(
        &self,
        endpoint: &Endpoint,
        reference: &RegistryRef,
    ) -> Result<Got, Failure> {
        let accept = HeaderValue::from_str(self.accept).expect("media types are header-safe");
        let http = &endpoint.transport.http;
        let (mut response, _) = endpoint
            .send(reference, Access::Pull, self.what, || {
                http.get(self.url).header(ACCEPT, accept.clone())
            })
            .await?;
        if !response.status().is_success() {
            return Err(error_answer(&self.ctx, self.what, response).await);
        }
        let declared = response
            .headers()
            .get(CONTENT_LENGTH)
            .and_then(|v| v.to_str().ok())
            .and_then(|v| v.parse::<u64>().ok());
        if let Some(n) = declared.filter(|&n| n > MAX_MANIFEST_SIZE) {
            return Err(self.too_large(format!(
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
        let mut pace = Throughput::start(self.speed);
        let slow = |e: crate::limits::TooSlow| Failure::TooSlow(Cause::TooSlow(e.0));
        loop {
            let chunk = match tokio::time::timeout_at(pace.window_end(), response.chunk()).await {
                Err(_) => {
                    pace.check().map_err(slow)?;
                    continue;
                }
                Ok(r) => r.map_err(|e| classify_http(&self.ctx, self.what, e))?,
            };
            let Some(chunk) = chunk else { break };
            if body.len() as u64 + chunk.len() as u64 > MAX_MANIFEST_SIZE {
                return Err(self.too_large(format!(
                    "the body passed {MAX_MANIFEST_SIZE} bytes, the most a manifest may have; \
                     stopped reading"
                )));
            }
            body.extend_from_slice(&chunk);
            pace.add(chunk.len() as u64);
            pace.check().map_err(slow)?;
        }
        Ok(Got {
            body: Bytes::from(body),
            digest_header,
        })
    }
}

impl Endpoint {
    pub(crate) async fn resolve_async(
        &self,
        reference: &RegistryRef,
    ) -> Result<String, RegistryError> {
        if let Some(d) = &reference.digest {
            return Ok(d.clone());
        }
        let (_, digest) = self.get_manifest(reference, ANY_MANIFEST).await?;
        Ok(digest)
    }

    /// The manifest `reference` names (by tag or digest): its exact bytes and their digest,
    /// checked against the reference's digest and the registry's `Docker-Content-Digest`.
    async fn get_manifest(
        &self,
        reference: &RegistryRef,
        accept: &str,
    ) -> Result<(Bytes, String), RegistryError> {
        let what = format!("manifest {reference}");
        let url = format!(
            "{}/manifests/{}",
            self.repo_url(reference),
            reference
                .digest
                .as_deref()
                .or(reference.tag.as_deref())
                .unwrap_or("latest")
        );
        let get = Get {
            ctx: self.ctx(),
            what: &what,
            url: &url,
            accept,
            speed: self.options.speed,
        };
        let got = retry(self.options.retry, &what, || get.send(self, reference)).await?;
        let actual = sha256_digest(&got.body);
        for (whose, claimed) in [
            ("the reference", reference.digest.as_ref()),
            (
                "the registry's Docker-Content-Digest",
                got.digest_header.as_ref(),
            ),
        ] {
            if let Some(claimed) = claimed.filter(|c| **c != actual) {
                return Err(RegistryError::Integrity {
                    blob: claimed.clone(),
                    detail: format!("{what}: the bytes hash to {actual}, not {whose}'s digest"),
                });
            }
        }
        Ok((got.body, actual))
    }

    pub(crate) async fn fetch_manifest_async(
        &self,
        reference: &RegistryRef,
    ) -> Result<(Vec<u8>, String), RegistryError> {
        let accept = format!("{MANIFEST_MEDIA_TYPE}, {INDEX_MEDIA_TYPE}");
        let (bytes, digest) = self.get_manifest(reference, &accept).await?;
        Ok((bytes.to_vec(), digest))
    }
}
