//! Pull an artifact from a registry into an OCI image layout, the same bytes the publisher had:
//! every blob byte-identical, the manifest's exact bytes, and an `index.json` naming it by the
//! tag (as `ingot build` names it by the stack version).
//!
//! Every blob goes to its partial file (`blobs/sha256/.partial-<hex>`) and is renamed into place
//! only after its size and digest check. `index.json` is written last, so a layout without it is
//! incomplete; pulling into it again keeps the blobs already there (after re-checking them),
//! resumes the partial files an interruption left, and fetches the rest.

use std::collections::BTreeMap;
use std::path::Path;
use std::time::{Duration, Instant};

use futures_util::StreamExt;
use ingot_layers::descriptor::canonical_json;

use crate::client::Registry;
use crate::error::RegistryError;
use crate::oci_layout::{
    Descriptor, ImageIndex, ImageManifest, Layout, LayoutWriter, INDEX_MEDIA_TYPE,
    MANIFEST_MEDIA_TYPE, REF_NAME,
};
use crate::partial;
use crate::progress::{short, Progress};
use crate::reference::RegistryRef;

/// What `pull` did.
#[derive(Debug, Clone)]
pub struct PullReport {
    /// `sha256:…` of the manifest.
    pub digest: String,
    /// Blobs downloaded (digest, size).
    pub fetched: Vec<(String, u64)>,
    /// Blobs already in the layout (checked).
    pub reused: Vec<(String, u64)>,
    /// Bytes this run downloaded: less than the fetched blobs' sizes where an interrupted
    /// pull's partial file was resumed.
    pub downloaded: u64,
    /// Wall time.
    pub elapsed: Duration,
    /// What each source (mirrors, the origin) served.
    pub sources: Vec<crate::client::Served>,
}

impl PullReport {
    /// Bytes downloaded by this run.
    pub fn bytes_fetched(&self) -> u64 {
        self.downloaded
    }
}

/// Pull `source` (a tag or a digest) into the OCI image layout directory `out`.
pub fn pull(reg: &Registry, source: &RegistryRef, out: &Path) -> Result<PullReport, RegistryError> {
    let start = Instant::now();
    if source.tag.is_none() && source.digest.is_none() {
        return Err(RegistryError::Reference(format!(
            "{source}: give a tag (…:TAG) or a digest (…@sha256:…) to pull"
        )));
    }
    let (manifest_bytes, digest) = reg.fetch_manifest(source)?;
    let manifest: ImageManifest =
        serde_json::from_slice(&manifest_bytes).map_err(|e| RegistryError::Decode {
            what: format!("{source}: manifest {digest} is not an OCI image manifest"),
            source: e,
        })?;
    if let Some(mt) = &manifest.media_type {
        if mt != MANIFEST_MEDIA_TYPE {
            return Err(RegistryError::Protocol(format!(
                "{source}: manifest {digest} is a {mt}, not an OCI image manifest"
            )));
        }
    }

    if out.exists() {
        let empty = std::fs::read_dir(out)
            .map_err(RegistryError::io(out))?
            .next()
            .is_none();
        if !empty && Layout::open(out).is_err() {
            return Err(RegistryError::Reference(format!(
                "{}: exists and is not an OCI image layout; give a new or empty directory",
                out.display()
            )));
        }
    }
    let writer = LayoutWriter::create(out).map_err(RegistryError::io(out))?;
    let layout = Layout::open(out)?;

    let mut blobs: Vec<(String, u64)> = Vec::new();
    for d in std::iter::once(&manifest.config).chain(manifest.layers.iter()) {
        if !blobs.iter().any(|(x, _)| x == &d.digest) {
            blobs.push((d.digest.clone(), d.size));
        }
    }
    remove_stale_partials(&out.join("blobs/sha256"), &blobs)?;
    let progress = Progress::new(reg.options.progress);
    let concurrency = reg.options.concurrency.max(1);
    let layout_ref = &layout;
    // (digest, size, fetched by this run, bytes this run downloaded for it)
    let results: Vec<Result<(String, u64, bool, u64), RegistryError>> = reg.block_on(async {
        futures_util::stream::iter(blobs.iter().map(|(d, size)| {
            let progress = &progress;
            async move {
                let dest = layout_ref.blob_path(d)?;
                if dest.exists() {
                    match layout_ref.check_blob(d, *size) {
                        Ok(_) => return Ok((d.clone(), *size, false, 0)),
                        Err(e) => {
                            tracing::warn!("{e}: fetching it again");
                            std::fs::remove_file(&dest).map_err(RegistryError::io(&dest))?;
                        }
                    }
                }
                let bar = progress.bar(&format!("pull {}", short(d)), *size);
                let downloaded = reg
                    .pull_blob_to_file_async(source, d, *size, &dest, Some(&bar))
                    .await?;
                bar.finish();
                Ok((d.clone(), *size, true, downloaded))
            }
        }))
        .buffer_unordered(concurrency)
        .collect()
        .await
    });
    let mut report = PullReport {
        digest: digest.clone(),
        fetched: vec![],
        reused: vec![],
        downloaded: 0,
        elapsed: Duration::ZERO,
        sources: Vec::new(),
    };
    for r in results {
        let (d, size, fetched, downloaded) = r?;
        report.downloaded += downloaded;
        if fetched {
            report.fetched.push((d, size));
        } else {
            report.reused.push((d, size));
        }
    }

    // The manifest's exact bytes, then index.json (last).
    let mut desc = writer
        .write_blob(MANIFEST_MEDIA_TYPE, &manifest_bytes)
        .map_err(RegistryError::io(out))?;
    debug_assert_eq!(desc.digest, digest);
    desc.artifact_type = manifest.artifact_type.clone();
    if let Some(tag) = &source.tag {
        desc.annotations = Some(BTreeMap::from([(REF_NAME.to_owned(), tag.clone())]));
    }
    write_index(out, desc)?;
    report.elapsed = start.elapsed();
    report.sources = reg.served();
    Ok(report)
}

/// Partial files an interrupted pull (a killed process) left behind: those of `blobs` are kept
/// to resume from, the others (another manifest's blobs, an older ingot's random names) removed.
fn remove_stale_partials(dir: &Path, blobs: &[(String, u64)]) -> Result<(), RegistryError> {
    for entry in std::fs::read_dir(dir).map_err(RegistryError::io(dir))? {
        let entry = entry.map_err(RegistryError::io(dir))?;
        let name = entry.file_name().to_string_lossy().into_owned();
        if !name.starts_with(partial::PARTIAL_PREFIX) {
            continue;
        }
        let path = entry.path();
        let wanted = partial::digest_of(&name).is_some_and(|d| blobs.iter().any(|(b, _)| *b == d));
        if wanted {
            tracing::info!(
                "keeping {}, left by an interrupted pull, to resume from",
                path.display()
            );
        } else {
            tracing::info!("removing {}, left by an interrupted pull", path.display());
            std::fs::remove_file(&path).map_err(RegistryError::io(&path))?;
        }
    }
    Ok(())
}

fn write_index(out: &Path, desc: Descriptor) -> Result<(), RegistryError> {
    let index = ImageIndex {
        schema_version: 2,
        media_type: Some(INDEX_MEDIA_TYPE.to_owned()),
        manifests: vec![desc],
        annotations: None,
    };
    let bytes = canonical_json(&index).map_err(|e| RegistryError::Decode {
        what: "serializing index.json".to_owned(),
        source: e,
    })?;
    let path = out.join("index.json");
    let tmp = out.join(".index.json.tmp");
    std::fs::write(&tmp, &bytes).map_err(RegistryError::io(&tmp))?;
    std::fs::rename(&tmp, &path).map_err(RegistryError::io(&path))?;
    Ok(())
}
