//! Publish an OCI image layout to a registry: blobs the registry lacks (a HEAD first), each
//! streamed from its file, several at once; the manifest last, as the exact bytes in the layout,
//! so its digest (the one signed consumers pin) is unchanged.

use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

use futures_util::StreamExt;
use tracing::info;

use crate::client::Registry;
use crate::error::RegistryError;
use crate::oci_layout::{ImageManifest, Layout, MANIFEST_MEDIA_TYPE};
use crate::progress::{short, Progress};
use crate::reference::RegistryRef;

/// What `publish` did.
#[derive(Debug, Clone)]
pub struct PublishReport {
    /// The reference published to (with its tag, if any).
    pub reference: RegistryRef,
    /// `sha256:…` of the manifest.
    pub digest: String,
    /// The tag already named this manifest: nothing was pushed.
    pub unchanged: bool,
    /// Blobs uploaded (digest, size).
    pub pushed: Vec<(String, u64)>,
    /// Blobs the registry already had.
    pub skipped: Vec<(String, u64)>,
    /// Wall time.
    pub elapsed: Duration,
}

impl PublishReport {
    /// Bytes uploaded.
    pub fn bytes_pushed(&self) -> u64 {
        self.pushed.iter().map(|(_, s)| s).sum()
    }
}

impl Registry {
    /// Uploads a small blob held in memory (a signature payload, a config) to the origin,
    /// unless it is there.
    pub fn push_blob_bytes(
        &self,
        reference: &RegistryRef,
        bytes: &[u8],
    ) -> Result<(), RegistryError> {
        self.block_on(self.origin.push_blob_bytes_async(reference, bytes))
    }

    /// Pushes a manifest's exact bytes to the origin under `reference`'s tag (or its digest);
    /// returns the digest the registry stored it under, checked against the bytes'.
    pub fn push_manifest(
        &self,
        reference: &RegistryRef,
        bytes: &[u8],
        media_type: &str,
    ) -> Result<String, RegistryError> {
        self.block_on(
            self.origin
                .push_manifest_async(reference, bytes, media_type),
        )
    }

    /// The manifest `reference` names at the origin (never a mirror: what a publish replaces is
    /// the origin's): its exact bytes and digest.
    pub fn fetch_manifest_at_origin(
        &self,
        reference: &RegistryRef,
    ) -> Result<(Vec<u8>, String), RegistryError> {
        self.block_on(self.origin.fetch_manifest_async(reference))
    }
}

/// Read the layout's only manifest (or the one `tag` names, `oci:DIR:TAG`): its exact bytes,
/// digest and parsed form.
pub fn layout_manifest(
    layout_dir: &Path,
    tag: Option<&str>,
) -> Result<(Layout, Vec<u8>, String, ImageManifest), RegistryError> {
    let layout = Layout::open(layout_dir)?;
    let desc = match tag {
        Some(tag) => layout.find_tagged(tag)?,
        None => layout.find_manifest(None)?,
    };
    let bytes = layout.read_small_blob(&desc.digest, desc.size)?;
    let manifest: ImageManifest =
        serde_json::from_slice(&bytes).map_err(|e| RegistryError::Decode {
            what: format!(
                "{}: manifest {} is not an OCI image manifest",
                layout_dir.display(),
                desc.digest
            ),
            source: e,
        })?;
    Ok((layout, bytes, desc.digest, manifest))
}

/// Publish the layout at `layout_dir` to `target` (which needs a tag or a digest).
pub fn publish(
    reg: &Registry,
    layout_dir: &Path,
    target: &RegistryRef,
    allow_overwrite: bool,
) -> Result<PublishReport, RegistryError> {
    publish_tagged(reg, layout_dir, None, target, allow_overwrite)
}

/// [`publish`] the manifest the layout's `index.json` tags `tag` (`oci:DIR:TAG`), or its only
/// one.
pub fn publish_tagged(
    reg: &Registry,
    layout_dir: &Path,
    tag: Option<&str>,
    target: &RegistryRef,
    allow_overwrite: bool,
) -> Result<PublishReport, RegistryError> {
    let start = Instant::now();
    if target.tag.is_none() && target.digest.is_none() {
        return Err(RegistryError::Reference(format!(
            "{target}: give a tag (…:TAG) or the manifest's digest (…@sha256:…) to publish under"
        )));
    }
    let (layout, manifest_bytes, digest, manifest) = layout_manifest(layout_dir, tag)?;
    if let Some(d) = &target.digest {
        if d != &digest {
            return Err(RegistryError::Reference(format!(
                "{target}: the layout's manifest is {digest}, not {d}"
            )));
        }
    }
    let mut report = PublishReport {
        reference: target.clone(),
        digest: digest.clone(),
        unchanged: false,
        pushed: vec![],
        skipped: vec![],
        elapsed: Duration::ZERO,
    };
    if tag_names_it_already(reg, target, &digest, allow_overwrite)? {
        report.unchanged = true;
        report.elapsed = start.elapsed();
        return Ok(report);
    }
    let blobs = layout_blobs(&layout, &manifest)?;
    push_blobs(reg, target, &blobs, &mut report)?;
    let media_type = manifest
        .media_type
        .clone()
        .unwrap_or_else(|| MANIFEST_MEDIA_TYPE.to_owned());
    let stored = reg.block_on(reg.origin.push_manifest_async(
        target,
        &manifest_bytes,
        &media_type,
    ))?;
    debug_assert_eq!(stored, digest);
    report.elapsed = start.elapsed();
    Ok(report)
}

/// Whether `target`'s tag already names `digest` (nothing to push). A tag naming other content
/// is refused unless `allow_overwrite`.
fn tag_names_it_already(
    reg: &Registry,
    target: &RegistryRef,
    digest: &str,
    allow_overwrite: bool,
) -> Result<bool, RegistryError> {
    if target.tag.is_none() {
        return Ok(false);
    }
    let tag_ref = RegistryRef {
        digest: None,
        ..target.clone()
    };
    match reg.try_resolve_at_origin(&tag_ref)? {
        Some(existing) if existing == digest => {
            info!("{tag_ref} already names {digest}: nothing to push");
            Ok(true)
        }
        Some(existing) if !allow_overwrite => Err(RegistryError::Conflict {
            reference: tag_ref.to_string(),
            existing,
            ours: digest.to_owned(),
        }),
        _ => Ok(false),
    }
}

/// The manifest's blobs in the layout, config first, then layers, each digest once, each
/// present with its size: (digest, size, path).
fn layout_blobs(
    layout: &Layout,
    manifest: &ImageManifest,
) -> Result<Vec<(String, u64, PathBuf)>, RegistryError> {
    let mut blobs: Vec<(String, u64, PathBuf)> = Vec::new();
    for d in std::iter::once(&manifest.config).chain(manifest.layers.iter()) {
        if blobs.iter().any(|(x, _, _)| x == &d.digest) {
            continue;
        }
        let path = layout.blob_path(&d.digest)?;
        let meta =
            std::fs::metadata(&path).map_err(|_| crate::oci_layout::LayoutError::Missing {
                digest: d.digest.clone(),
                path: path.clone(),
            })?;
        if meta.len() != d.size {
            return Err(crate::oci_layout::LayoutError::Size {
                digest: d.digest.clone(),
                expected: d.size,
                actual: meta.len(),
            }
            .into());
        }
        blobs.push((d.digest.clone(), d.size, path));
    }
    Ok(blobs)
}

/// Pushes the blobs the registry lacks (a HEAD request first, several at once), recording in
/// `report` which were pushed and which were already there.
fn push_blobs(
    reg: &Registry,
    target: &RegistryRef,
    blobs: &[(String, u64, PathBuf)],
    report: &mut PublishReport,
) -> Result<(), RegistryError> {
    let progress = Progress::new(reg.options.progress);
    let concurrency = reg.options.concurrency.max(1);
    let results: Vec<Result<(String, u64, bool), RegistryError>> = reg.block_on(async {
        futures_util::stream::iter(blobs.iter().map(|(d, size, path)| {
            let progress = &progress;
            async move {
                if reg.origin.blob_exists_async(target, d).await? {
                    return Ok((d.clone(), *size, false));
                }
                let bar = progress.bar(&format!("push {}", short(d)), *size);
                reg.origin
                    .push_blob_file_async(target, path, d, *size, Some(&bar))
                    .await?;
                bar.finish();
                Ok((d.clone(), *size, true))
            }
        }))
        .buffer_unordered(concurrency)
        .collect()
        .await
    });
    for r in results {
        let (d, size, pushed) = r?;
        if pushed {
            report.pushed.push((d, size));
        } else {
            report.skipped.push((d, size));
        }
    }
    Ok(())
}
