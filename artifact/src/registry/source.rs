//! [`RegistrySource`]: an artifact read straight from a registry, for `ingot verify` and
//! `ingot inspect` (the verifier's `ArtifactSource`, implemented there). The tag is resolved once; everything after is fetched by digest. Large blobs
//! are downloaded (resumably, digest-checked) into a private temporary directory, made only
//! when the first of them is needed: a run killed before that leaves nothing in `$TMPDIR`.

use std::cell::{OnceCell, RefCell};
use std::collections::HashMap;
use std::path::{Path, PathBuf};
use std::sync::Arc;

use super::client::{Registry, SourceLog};
use super::error::RegistryError;
use super::options::RegistryOptions;
use super::progress::{short, Progress};
use super::reference::RegistryRef;

/// An artifact in a registry.
#[derive(Debug)]
pub struct RegistrySource {
    registry: Arc<Registry>,
    reference: RegistryRef,
    digest: String,
    /// Made on the first [`ArtifactSource::blob_file`], removed on drop.
    tmp: OnceCell<tempfile::TempDir>,
    files: RefCell<HashMap<String, PathBuf>>,
    progress: Progress,
}

impl RegistrySource {
    /// Connect and resolve the reference to a manifest digest.
    pub fn open(reference: &RegistryRef, options: RegistryOptions) -> Result<Self, RegistryError> {
        Self::open_logged(reference, options, SourceLog::default())
    }

    /// [`RegistrySource::open`], recording into `log` what each source serves and why one
    /// fails, from the tag's resolution on (readable whether or not this succeeds).
    pub fn open_logged(
        reference: &RegistryRef,
        options: RegistryOptions,
        log: SourceLog,
    ) -> Result<Self, RegistryError> {
        if reference.tag.is_none() && reference.digest.is_none() {
            return Err(RegistryError::Reference(format!(
                "{reference}: give a tag (…:TAG) or a digest (…@sha256:…)"
            )));
        }
        let progress = Progress::new(options.progress);
        let registry = Registry::connect_logged(reference, options, log)?;
        let digest = registry.resolve(reference)?;
        Ok(RegistrySource {
            registry: Arc::new(registry),
            reference: reference.with_digest(&digest),
            digest,
            tmp: OnceCell::new(),
            files: RefCell::new(HashMap::new()),
            progress,
        })
    }

    /// The manifest digest the reference resolved to.
    pub fn digest(&self) -> &str {
        &self.digest
    }

    /// The reference, pinned to the manifest digest it resolved to.
    pub fn reference(&self) -> &RegistryRef {
        &self.reference
    }

    /// The connection (for callers that want more than the trait offers).
    pub fn registry(&self) -> &Registry {
        &self.registry
    }

    /// The connection, for a reader that outlives this borrow (a layer read frame by frame).
    pub fn shared_registry(&self) -> Arc<Registry> {
        Arc::clone(&self.registry)
    }

    /// The temporary directory for downloaded blobs, made on first use.
    fn tmp_dir(&self) -> Result<&Path, RegistryError> {
        if let Some(tmp) = self.tmp.get() {
            return Ok(tmp.path());
        }
        let tmp = tempfile::Builder::new()
            .prefix("ingot-registry-")
            .tempdir()
            .map_err(RegistryError::io(&std::env::temp_dir()))?;
        Ok(self.tmp.get_or_init(|| tmp).path())
    }
}

// The verifier implements its `ArtifactSource` for this type with the methods below: the
// verifier sits above the registry client, which does not know it.
impl RegistrySource {
    /// `oci://…` of the artifact.
    pub fn display_name(&self) -> String {
        self.reference.to_string()
    }

    /// The manifest's exact bytes and digest.
    pub fn fetch_manifest(&self) -> Result<(Vec<u8>, String), RegistryError> {
        self.registry.fetch_manifest(&self.reference)
    }

    /// A small blob, read into memory (digest checked).
    pub fn fetch_blob(&self, digest: &str, size: u64) -> Result<Vec<u8>, RegistryError> {
        self.registry.fetch_blob(&self.reference, digest, size)
    }

    /// A blob downloaded (once) into the temporary directory; its path.
    pub fn download_blob(&self, digest: &str, size: u64) -> Result<PathBuf, RegistryError> {
        if let Some(p) = self.files.borrow().get(digest) {
            return Ok(p.clone());
        }
        if !ingot_layers::descriptor::is_sha256_digest(digest) {
            return Err(RegistryError::Protocol(format!(
                "`{digest}` is not a sha256 digest"
            )));
        }
        let dest = self.tmp_dir()?.join(&digest["sha256:".len()..]);
        let bar = self.progress.bar(&format!("fetch {}", short(digest)), size);
        self.registry
            .pull_blob_to_file(&self.reference, digest, size, &dest, Some(&bar))?;
        bar.finish_and_clear();
        self.files
            .borrow_mut()
            .insert(digest.to_owned(), dest.clone());
        Ok(dest)
    }
}
