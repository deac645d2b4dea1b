//! A stack as the writer holds it once `verify` has checked it: where it comes from
//! ([`Source`]), its verified descriptor and, per selected layer, the tree checked against the
//! signed root hash ([`VerifiedLayer`]). Nothing of it is written here; the steps read it.

use std::path::{Path, PathBuf};
use std::sync::{Arc, OnceLock};

use ingot_artifact::layerfs::{LayerFs, LayerFsError};
use ingot_artifact::registry::frames::{BlobFrames, Warnings};
use ingot_artifact::registry::source::RegistrySource;
use ingot_artifact::verify::{ArtifactSource, VerifyError, VerifyReport};
use ingot_layers::descriptor::{LayerEntry, StackDescriptor};
use ingot_verity::Verifier;

use crate::layout::{LayerKind, PlanLayer};
use crate::node::NodeLayer;
use crate::partitions::NODE_LAYER;

/// Where the stack comes from.
pub enum Source {
    /// An OCI image layout directory: every blob is a local file.
    Layout(Box<dyn ArtifactSource>),
    /// A registry, kept open: data blobs stream from it while they are written.
    Registry(Box<RegistrySource>),
}

impl Source {
    /// The source as the signature and descriptor checks read it.
    pub fn get(&self) -> &dyn ArtifactSource {
        match self {
            Source::Layout(s) => s.as_ref(),
            Source::Registry(r) => r.as_ref(),
        }
    }
}

/// Why a verified stack's blob could not be read.
#[derive(Debug, thiserror::Error)]
pub enum StackError {
    #[error(transparent)]
    Blob(#[from] VerifyError),
    #[error(transparent)]
    LayerFs(#[from] LayerFsError),
    #[error("{path}: {what}")]
    Map {
        path: PathBuf,
        what: &'static str,
        #[source]
        source: std::io::Error,
    },
}

/// A selected layer, its tree checked, its data blob located.
pub struct VerifiedLayer {
    pub entry: LayerEntry,
    pub verifier: Arc<Verifier>,
    pub hash_bytes: Vec<u8>,
    /// The data blob as a local file: in an image layout, or fetched from a registry for
    /// staging. Unset, it is streamed from the registry while it is written.
    pub data_path: OnceLock<PathBuf>,
}

/// A stack whose signature, descriptor and selected layers' trees are checked; nothing written.
pub struct OpenedStack {
    report: VerifyReport,
    layers: Vec<VerifiedLayer>,
    /// Kept open: data blobs stream from a registry source while they are written.
    source: Source,
    /// The release's signed UKI (digest and signed command line checked), when the stack has
    /// one and the machine boots with UEFI: the disk then boots it ([`OpenedStack::uki`]).
    uki: Option<Vec<u8>>,
    /// Sources refused while [`OpenedStack::base_fs`] read frames, not yet reported.
    frame_warnings: Warnings,
}

impl OpenedStack {
    /// The stack `verify` checked: its report, the selected layers (base first), its source.
    pub fn new(report: VerifyReport, layers: Vec<VerifiedLayer>, source: Source) -> OpenedStack {
        OpenedStack {
            report,
            layers,
            source,
            uki: None,
            frame_warnings: Warnings::default(),
        }
    }

    /// The warnings of sources refused while the base's frames were read (see
    /// [`OpenedStack::base_fs`]) since the last call: the step that read them reports them.
    pub fn take_frame_warnings(&self) -> Vec<String> {
        std::mem::take(&mut *self.frame_warnings.lock().expect("not poisoned"))
    }

    /// With the release's UKI, checked: the disks boot it (a UEFI machine).
    pub fn with_uki(mut self, uki: Vec<u8>) -> OpenedStack {
        self.uki = Some(uki);
        self
    }

    /// The signed UKI this machine boots, if any: the stack has one and the machine is UEFI.
    pub fn uki(&self) -> Option<&[u8]> {
        self.uki.as_deref()
    }

    /// `name version` of the stack.
    pub fn describe(&self) -> String {
        let d = &self.report.descriptor;
        format!("{} {}", d.name, d.version)
    }

    pub fn descriptor(&self) -> &StackDescriptor {
        &self.report.descriptor
    }

    pub fn manifest_digest(&self) -> &str {
        &self.report.manifest_digest
    }

    /// The selected layers, base first.
    pub fn layers(&self) -> &[VerifiedLayer] {
        &self.layers
    }

    /// Where the stack comes from (the `write` step streams from a registry source).
    pub fn source(&self) -> &Source {
        &self.source
    }

    /// The selected layers' names, in stacking order.
    pub fn layer_names(&self) -> Vec<String> {
        self.layers.iter().map(|p| p.entry.name.clone()).collect()
    }

    /// The base layer's file system, read from its blob with every block checked against the
    /// signed tree (for the plan's boot files and staging, before anything is written). From a
    /// registry, only the zstd frames holding the blocks read are fetched, each with a `Range`
    /// request found through the descriptor's frame index ([`BlobFrames`]: a source whose bytes
    /// fail is refused for the blob, and the frame fetched from the next, the warning kept for the
    /// step to report: [`OpenedStack::take_frame_warnings`]); the `write` step
    /// streams the whole blob later, from the sources not refused. A stack built
    /// before the frame index existed has its base blob fetched whole for this (and then
    /// written from that copy).
    pub fn base_fs(&self) -> Result<LayerFs, StackError> {
        let base = &self.layers[0];
        let data = &base.entry.data;
        if let (Source::Registry(r), None) = (&self.source, base.data_path.get()) {
            if !data.compression.frames.is_empty() {
                let frames = BlobFrames::new(
                    r.shared_registry(),
                    r.reference().clone(),
                    &data.digest,
                    data.size,
                    data.compression.frame_starts(),
                )
                .warnings_to(self.frame_warnings.clone());
                return Ok(LayerFs::fetched(
                    &base.entry.name,
                    Box::new(frames),
                    data.compression.frame_size,
                    base.verifier.clone(),
                )?);
            }
            tracing::warn!(
                "the stack's descriptor has no frame index: fetching the base layer's whole \
                 blob ({} bytes) to read its /etc/passwd",
                data.size
            );
        }
        let path = match base.data_path.get() {
            Some(p) => p.clone(),
            None => {
                let p = self
                    .source
                    .get()
                    .blob_file_unhashed(&data.digest, data.size)?;
                base.data_path.get_or_init(|| p).clone()
            }
        };
        let map = map_blob(&path)?;
        Ok(LayerFs::in_blob(
            &base.entry.name,
            Arc::new(map),
            data.compression.frame_size,
            base.verifier.clone(),
        )?)
    }

    /// The layers as the disk plan sees them, the node layer (if any) on top.
    pub fn plan_layers(&self, node: Option<&NodeLayer>) -> Vec<PlanLayer> {
        let mut out: Vec<PlanLayer> = self
            .layers
            .iter()
            .enumerate()
            .map(|(i, p)| PlanLayer {
                name: p.entry.name.clone(),
                kind: if i == 0 {
                    LayerKind::Base
                } else {
                    LayerKind::Extra
                },
                root_hash: p.verifier.root_hash().clone(),
                data_size: p.entry.size,
                hash_size: p.hash_bytes.len() as u64,
            })
            .collect();
        if let Some(n) = node {
            out.push(PlanLayer {
                name: NODE_LAYER.into(),
                kind: LayerKind::Node,
                root_hash: n.root_hash.clone(),
                data_size: n.image.len() as u64,
                hash_size: n.hash.len() as u64,
            });
        }
        out
    }
}

/// Maps a layer's data blob from the source store.
pub fn map_blob(path: &Path) -> Result<memmap2::Mmap, StackError> {
    let file = std::fs::File::open(path).map_err(|source| StackError::Map {
        path: path.to_path_buf(),
        what: "opening the data blob",
        source,
    })?;
    // SAFETY: the blob is a file in the source store, read-only here; every block decoded from
    // it is checked against the tree before it is used, or after it is written and read back.
    #[allow(unsafe_code)]
    unsafe { memmap2::Mmap::map(&file) }.map_err(|source| StackError::Map {
        path: path.to_path_buf(),
        what: "mapping the data blob",
        source,
    })
}
