//! `verify`: the signature, the descriptor, this machine's selection, and every selected layer's
//! hash tree against its signed root hash.
//!
//! Reads the opened source, the trusted key and the machine; returns an [`OpenedStack`]: the
//! verified descriptor and, per selected layer, its checked tree and, from an image layout, the
//! path of its data blob (whose blocks are checked against the tree by whoever reads them). From
//! a registry the data blobs are not fetched here: the `write` step streams them.

use std::path::{Path, PathBuf};
use std::sync::{Arc, OnceLock};

use ingot_artifact::registry::source::RegistrySource;
use ingot_artifact::verify::{verify_metadata, verity_params, Trust, VerifyReport};
use ingot_layers::descriptor::{DataBlob, LayerEntry, StackDescriptor};
use ingot_layers::select::Machine;
use ingot_verity::Verifier;

use crate::error::WriteError;
use crate::layerfs::{FetchFrame, LayerFs};
use crate::report::{Reporter, Stage};
use crate::steps::plan::{LayerKind, PlanLayer};
use crate::steps::resolve::Source;
use crate::steps::seal::NodeLayer;

/// A selected layer, its tree checked, its data blob located.
pub struct Prepared {
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
    layers: Vec<Prepared>,
    /// Kept open: data blobs stream from a registry source while they are written.
    source: Source,
}

impl OpenedStack {
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
    pub fn layers(&self) -> &[Prepared] {
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
    /// signed tree (for staging, before anything is written). From a registry, only the zstd
    /// frames holding the blocks read are fetched, each with a `Range` request found through the
    /// descriptor's frame index; the `write` step streams the whole blob later. A stack built
    /// before the frame index existed has its base blob fetched whole for this (and then
    /// written from that copy).
    pub fn base_fs(&self) -> Result<LayerFs, WriteError> {
        let base = &self.layers[0];
        let data = &base.entry.data;
        if let (Source::Registry(r), None) = (&self.source, base.data_path.get()) {
            if !data.compression.frames.is_empty() {
                return Ok(LayerFs::fetched(
                    &base.entry.name,
                    data.compression.frames.len(),
                    frame_fetcher(r, data),
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
                name: crate::boot::NODE_LAYER.into(),
                kind: LayerKind::Node,
                root_hash: n.root_hash.clone(),
                data_size: n.image.len() as u64,
                hash_size: n.hash.len() as u64,
            });
        }
        out
    }
}

/// Fetches frame `n` of a data blob from the registry: its byte range is the sum of the
/// frame index's sizes before it. What comes back is checked block by block by the reader.
fn frame_fetcher(r: &RegistrySource, data: &DataBlob) -> FetchFrame {
    let (registry, reference) = (r.shared_registry(), r.reference().clone());
    let (digest, size) = (data.digest.clone(), data.size);
    let mut starts = Vec::with_capacity(data.compression.frames.len() + 1);
    let mut at = 0u64;
    starts.push(0);
    for f in &data.compression.frames {
        at += f; // the descriptor's check: the sizes add up to the blob's
        starts.push(at);
    }
    Box::new(move |n| {
        let range = starts[n]..starts[n + 1];
        tracing::debug!("fetching zstd frame {n} (bytes {range:?}) of blob {digest}");
        registry
            .fetch_range(&reference, &digest, size, range)
            .map_err(|e| e.full_text())
    })
}

/// Maps a layer's data blob from the source store.
pub fn map_blob(path: &Path) -> Result<memmap2::Mmap, WriteError> {
    let file = std::fs::File::open(path).map_err(|source| WriteError::Io {
        path: path.to_path_buf(),
        what: "opening the data blob",
        source,
    })?;
    // SAFETY: the blob is a file in the source store, read-only here; every block decoded from
    // it is checked against the tree before it is used, or after it is written and read back.
    #[allow(unsafe_code)]
    unsafe { memmap2::Mmap::map(&file) }.map_err(|source| WriteError::Io {
        path: path.to_path_buf(),
        what: "mapping the data blob",
        source,
    })
}

/// The `verify` step; see the module docs.
pub fn run(
    source: Source,
    trust: &Trust,
    machine: &Machine,
    reporter: &Reporter,
) -> Result<OpenedStack, WriteError> {
    reporter.stage(
        Stage::Verify,
        format!("checking the signature of {}", source.get().describe()),
    );
    let (report, _manifest) = verify_metadata(source.get(), trust)?;
    let d = &report.descriptor;
    let selected: Vec<&LayerEntry> = d.select(machine).collect();
    if selected.first().map(|l| l.name.as_str()) != Some(d.base().name.as_str()) {
        return Err(WriteError::NoBase);
    }
    let names: Vec<String> = selected.iter().map(|l| l.name.clone()).collect();
    reporter.stage(
        Stage::Verify,
        format!(
            "stack {} {}: this machine gets {}; checking hash trees",
            d.name,
            d.version,
            names.join(", ")
        ),
    );
    reporter.set_layers(names);
    let layers = selected
        .into_iter()
        .map(|entry| prepare(&source, entry))
        .collect::<Result<Vec<_>, _>>()?;
    Ok(OpenedStack {
        report,
        layers,
        source,
    })
}

/// Checks one layer's tree against its signed root hash and locates its data blob.
fn prepare(opened: &Source, entry: &LayerEntry) -> Result<Prepared, WriteError> {
    let source = opened.get();
    let params = verity_params(entry)?;
    let hash_bytes = source.blob(&entry.hash.digest, entry.hash.size)?;
    let root = &entry.verity.root_hash;
    let verifier =
        Verifier::from_hash_device(&params, &hash_bytes, root).map_err(|e| WriteError::Tree {
            layer: entry.name.clone(),
            reason: e.to_string(),
        })?;
    // Not hashed whole: every block is checked against the tree after it is written and read
    // back, which covers exactly the bytes on the disk. From a registry it is not fetched here
    // at all, but streamed while it is written.
    let data_path = OnceLock::new();
    if let Source::Layout(local) = opened {
        let _ = data_path.set(local.blob_file_unhashed(&entry.data.digest, entry.data.size)?);
    }
    Ok(Prepared {
        entry: entry.clone(),
        verifier: Arc::new(verifier),
        hash_bytes,
        data_path,
    })
}
