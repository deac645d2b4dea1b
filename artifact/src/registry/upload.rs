//! Blobs and manifests up to a registry, through `oci-client` (its auth challenges, token cache
//! and upload sessions). Uploads are streamed from the file in large items, never the whole blob
//! in memory. An interrupted upload restarts that blob (`oci-client` cannot resume an upload
//! session); before a retry the registry is asked whether the blob arrived after all.

use std::io::Read;
use std::path::Path;

use bytes::Bytes;
use futures_util::StreamExt;
use indicatif::ProgressBar;
use oci_client::errors::OciDistributionError;

use super::client::Endpoint;
use super::error::RegistryError;
use super::reference::RegistryRef;
use super::retry::{classify_oci, retry};
use crate::oci_layout::sha256_digest;

impl Endpoint {
    async fn store_auth(&self, reference: &RegistryRef) {
        self.transport
            .oci
            .store_auth_if_needed(&reference.registry, &self.auth.credentials.to_oci())
            .await;
    }

    /// Run an `oci-client` request with retries.
    async fn retry_oci<T, F, Fut>(&self, what: &str, mut op: F) -> Result<T, RegistryError>
    where
        F: FnMut() -> Fut,
        Fut: std::future::Future<Output = Result<T, OciDistributionError>>,
    {
        let ctx = self.ctx();
        let ctx = &ctx;
        retry(self.options.retry, what, || {
            let fut = op();
            async move { fut.await.map_err(|e| classify_oci(ctx, what, e)) }
        })
        .await
    }

    pub(crate) async fn blob_exists_async(
        &self,
        reference: &RegistryRef,
        digest: &str,
    ) -> Result<bool, RegistryError> {
        self.store_auth(reference).await;
        let oref = reference.to_oci();
        self.retry_oci(&format!("blob {digest}"), || {
            self.transport.oci.blob_exists(&oref, digest)
        })
        .await
    }

    /// Upload a file as a blob, streamed in `push_item`-sized items. A failed upload is retried
    /// from its start (upload sessions cannot be resumed).
    pub(crate) async fn push_blob_file_async(
        &self,
        reference: &RegistryRef,
        path: &Path,
        digest: &str,
        size: u64,
        progress: Option<&ProgressBar>,
    ) -> Result<(), RegistryError> {
        self.store_auth(reference).await;
        let oref = reference.to_oci();
        let what = format!("uploading blob {digest}");
        let item = self.options.push_item.max(1 << 20);
        let mut first = true;
        self.retry_oci(&what, || {
            let path = path.to_owned();
            let progress = progress.cloned();
            let oref = oref.clone();
            let retried = !std::mem::replace(&mut first, false);
            async move {
                let client = &self.transport.oci;
                if retried && client.blob_exists(&oref, digest).await? {
                    return Ok(());
                }
                if let Some(p) = &progress {
                    p.set_position(0);
                }
                let stream = file_stream(path, item, progress);
                client
                    .push_blob_stream(&oref, stream, digest, Some(size))
                    .await
                    .map(|_| ())
            }
        })
        .await
    }

    /// Upload a small blob held in memory (a cosign payload or config), unless it is there.
    pub(crate) async fn push_blob_bytes_async(
        &self,
        reference: &RegistryRef,
        bytes: &[u8],
    ) -> Result<(), RegistryError> {
        let digest = sha256_digest(bytes);
        if self.blob_exists_async(reference, &digest).await? {
            return Ok(());
        }
        let oref = reference.to_oci();
        let body = Bytes::copy_from_slice(bytes);
        self.retry_oci(&format!("uploading blob {digest}"), || {
            self.transport.oci.push_blob(&oref, body.clone(), &digest)
        })
        .await
        .map(|_| ())
    }

    /// Push a manifest's exact bytes under `reference`'s tag (or its digest). Returns the
    /// digest the registry stored it under, checked against the bytes' digest.
    pub(crate) async fn push_manifest_async(
        &self,
        reference: &RegistryRef,
        bytes: &[u8],
        media_type: &str,
    ) -> Result<String, RegistryError> {
        self.store_auth(reference).await;
        let ours = sha256_digest(bytes);
        let target = match &reference.tag {
            Some(t) => reference.with_tag(t),
            None => reference.with_digest(&ours),
        };
        let oref = target.to_oci();
        let content_type = http::HeaderValue::from_str(media_type)
            .map_err(|_| RegistryError::Protocol(format!("bad media type `{media_type}`")))?;
        let body = Bytes::copy_from_slice(bytes);
        self.retry_oci(&format!("pushing manifest {target}"), || {
            self.transport
                .oci
                .push_manifest_raw(&oref, body.clone(), content_type.clone())
        })
        .await?;
        let stored = self.resolve_async(&target).await?;
        if stored != ours {
            return Err(RegistryError::Integrity {
                blob: ours,
                detail: format!("the registry stored the manifest as {stored}"),
            });
        }
        Ok(ours)
    }
}

/// A file as a stream of `item`-sized `Bytes`, read on a blocking thread; at most two items
/// are in flight, so memory stays bounded whatever the file's size.
fn file_stream(
    path: std::path::PathBuf,
    item: usize,
    progress: Option<ProgressBar>,
) -> impl futures_util::Stream<Item = oci_client::errors::Result<Bytes>> + Send + 'static {
    let (tx, rx) = tokio::sync::mpsc::channel::<std::io::Result<Bytes>>(2);
    tokio::task::spawn_blocking(move || {
        let mut file = match std::fs::File::open(&path) {
            Ok(f) => f,
            Err(e) => {
                let _ = tx.blocking_send(Err(e));
                return;
            }
        };
        loop {
            let mut buf = vec![0u8; item];
            let mut filled = 0;
            while filled < item {
                match file.read(&mut buf[filled..]) {
                    Ok(0) => break,
                    Ok(n) => filled += n,
                    Err(e) if e.kind() == std::io::ErrorKind::Interrupted => {}
                    Err(e) => {
                        let _ = tx.blocking_send(Err(e));
                        return;
                    }
                }
            }
            if filled == 0 {
                return;
            }
            buf.truncate(filled);
            if tx.blocking_send(Ok(Bytes::from(buf))).is_err() {
                return; // the upload stopped
            }
            if filled < item {
                return;
            }
        }
    });
    futures_util::stream::unfold(rx, |mut rx| async move {
        rx.recv().await.map(|item| (item, rx))
    })
    .map(move |r| {
        if let (Ok(b), Some(p)) = (&r, &progress) {
            p.inc(b.len() as u64);
        }
        r.map_err(OciDistributionError::IoError)
    })
}
