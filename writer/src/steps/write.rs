//! `write`: every selected layer's image and tree, and the sealed node layer, into their
//! partitions through the verified-write engine ([`crate::engine`]), so that no byte that fails
//! its hash can boot; with several disks this disk's `var` becomes a member of the mirror
//! ([`crate::mirror`]); otherwise `var` is left blank.
//!
//! A layer streamed from a registry whose bytes fail the engine's check (a block against the
//! signed tree, a zstd frame, the blob's digest) refuses the source that sent them for that
//! blob, with a warning naming both, and the layer is written again from the start from the
//! next source (the mirrors in order, then the origin), every block read back and checked as
//! the first time; only when every source fails does the step fail, naming each and why.
//!
//! Reads the opened target, the verified stack, the node layer and the plan; returns the bytes
//! written and skipped and the rewrites ([`WriteStats`]).

use crate::engine::bytes::write_bytes;
use crate::engine::frames::{copied_frames, mapped_frames};
use crate::engine::layer::{check_geometry, write_layer};
use crate::engine::{EngineError, LayerData, WriteOptions, WriteStats};
use crate::layout::{Content, DiskPlan, MIB};
use crate::mirror::{Mirror, ARRAY_NAME, SUPERBLOCK_OFFSET, ZEROED};
use crate::node::NodeLayer;
use crate::report::{Reporter, Stage};
use crate::stack::{map_blob, OpenedStack, Source, StackError, VerifiedLayer};
use crate::stream;
use crate::target::{AlignedBuf, Target, TargetError};
use ingot_artifact::registry::SourceName;

/// Why the layers could not be written.
#[derive(Debug, thiserror::Error)]
pub enum WriteStepError {
    #[error(transparent)]
    Engine(#[from] EngineError),
    #[error(transparent)]
    Target(#[from] TargetError),
    #[error(transparent)]
    Stack(#[from] StackError),
    #[error("the var partition ({size} bytes) is too small for an md array")]
    VarTooSmall { size: u64 },
    #[error(
        "layer `{layer}`: every source of the data blob {blob} sent bytes that fail it: {tried}"
    )]
    AllSources {
        layer: String,
        blob: String,
        /// Each source and why, `; `-separated.
        tried: String,
    },
}

/// A disk this run has already written: the layers of the next disk are copied from it
/// rather than downloaded again.
pub struct CopyFrom {
    pub target: Target,
    pub plan: DiskPlan,
}
/// The `write` step; see the module docs.
pub fn run(
    target: &Target,
    opened: &OpenedStack,
    node: Option<&NodeLayer>,
    plan: &DiskPlan,
    copy: Option<&CopyFrom>,
    opts: WriteOptions,
    reporter: &Reporter,
) -> Result<WriteStats, WriteStepError> {
    let mut total = WriteStats::default();
    // Blobs not on this machine stream from the registry, the next one downloading while
    // this one is written (unless they come from a disk written before).
    let jobs: Vec<stream::Job> = opened
        .layers()
        .iter()
        .filter(|p| p.data_path.get().is_none() && copy.is_none())
        .map(|p| stream::Job {
            layer: p.entry.name.clone(),
            digest: p.entry.data.digest.clone(),
            size: p.entry.data.size,
            frame_size: p.entry.data.compression.frame_size,
        })
        .collect();
    std::thread::scope(|s| -> Result<(), WriteStepError> {
        // Owned by this closure: dropped (so the download stops) before the scope ends.
        let mut streams = match opened.source() {
            Source::Registry(r) if !jobs.is_empty() => {
                Some(stream::Streams::start(s, r.registry(), r.reference(), jobs))
            }
            _ => None,
        };
        for (index, p) in opened.layers().iter().enumerate() {
            let source = LayerSource {
                streams: &mut streams,
                copy,
            };
            total += stack_layer(target, index, p, plan, source, opts, reporter)?;
        }
        Ok(())
    })?;
    if let Some(n) = node {
        let index = opened.layers().len();
        reporter.stage(
            Stage::Write,
            format!(
                "writing the sealed node layer ({} bytes, root hash {})",
                n.image.len(),
                n.root_hash
            ),
        );
        for (content, what, bytes) in [
            (Content::LayerData { index }, "node", &n.image),
            (Content::LayerHash { index }, "node-verity", &n.hash),
        ] {
            let part = plan.part(&content);
            let zeroed = target.zero_range(part.offset, part.size)?;
            total += write_bytes(target, what, bytes, part.offset, zeroed, opts, reporter)?;
        }
    }

    // var: left blank (no file system signature) for first boot to format, per the boot contract.
    let var = plan.part(&Content::Var);
    if !target.zero_range(var.offset, MIB)? {
        target.write_direct(&AlignedBuf::new(MIB as usize), var.offset)?;
    }
    opts.check_stop("writing the layers")
        .map_err(EngineError::from)?;
    Ok(total)
}
/// Where a layer not on this machine comes from: the next registry stream, or a disk written
/// before.
struct LayerSource<'s, 'scope, 'env> {
    streams: &'s mut Option<stream::Streams<'scope, 'env>>,
    copy: Option<&'s CopyFrom>,
}

/// One layer of the stack: its image (from its local blob, a disk written before, or the next
/// registry stream), then its hash device, each read back and checked.
fn stack_layer(
    target: &Target,
    index: usize,
    p: &VerifiedLayer,
    plan: &DiskPlan,
    source: LayerSource<'_, '_, '_>,
    opts: WriteOptions,
    reporter: &Reporter,
) -> Result<WriteStats, WriteStepError> {
    let data = plan.part(&Content::LayerData { index });
    let hash = plan.part(&Content::LayerHash { index });
    reporter.stage(
        Stage::Write,
        format!(
            "writing layer {} ({} bytes, root hash {})",
            p.entry.name,
            p.entry.size,
            p.verifier.root_hash()
        ),
    );
    // Zeroing first pays only when many blocks are zeros (the tree says which): on a thin
    // or file-backed disk it frees space that dense data must then allocate again.
    let zero_first = || -> Result<bool, TargetError> {
        let zero_blocks = p.verifier.zero_blocks();
        let blocks = p.verifier.params().data_blocks;
        let zeroed = zero_blocks * 8 >= blocks && target.zero_range(data.offset, data.size)?;
        tracing::debug!(
            "layer {}: {zero_blocks} of {blocks} blocks are zeros; zeroing first: {zeroed}",
            p.entry.name
        );
        Ok(zeroed)
    };
    let layer = LayerData {
        name: &p.entry.name,
        blob: &p.entry.data.digest,
        verifier: &p.verifier,
        frame_size: p.entry.data.compression.frame_size,
        image_size: p.entry.size,
        offset: data.offset,
        partition_size: data.size,
    };
    let map;
    let mut total = match (p.data_path.get(), source.copy) {
        (Some(path), _) => {
            map = map_blob(path)?;
            let frames = mapped_frames(&layer, &map)?;
            write_layer(target, &layer, frames, zero_first()?, opts, reporter)?
        }
        (None, Some(copy)) => {
            let from = copy.plan.part(&Content::LayerData { index }).offset;
            let frames = copied_frames(&copy.target, from, &layer);
            write_layer(target, &layer, frames, zero_first()?, opts, reporter)?
        }
        (None, None) => {
            let streams = source
                .streams
                .as_mut()
                .expect("one stream per layer not on this machine");
            streamed_layer(target, &layer, streams, zero_first, opts, reporter)?
        }
    };
    reporter.finish_bar();
    let zeroed = target.zero_range(hash.offset, hash.size)?;
    total += write_bytes(
        target,
        &format!("{}-verity", p.entry.name),
        &p.hash_bytes,
        hash.offset,
        zeroed,
        opts,
        reporter,
    )?;
    Ok(total)
}
/// A layer streamed from the registry, written again from the next source each time a
/// source's bytes fail (see the module docs).
fn streamed_layer(
    target: &Target,
    layer: &LayerData<'_>,
    streams: &mut stream::Streams<'_, '_>,
    zero_first: impl Fn() -> Result<bool, TargetError>,
    opts: WriteOptions,
    reporter: &Reporter,
) -> Result<WriteStats, WriteStepError> {
    // The descriptor's facts are checked before any source is blamed for a failure.
    check_geometry(layer)?;
    let (registry, reference) = (streams.registry(), streams.reference());
    let mut tried: Vec<(Vec<SourceName>, EngineError)> = Vec::new();
    let mut stream = streams.next_stream();
    loop {
        let (frames, senders) = stream.frames();
        // Zeroed again on a retry: the bad attempt's bytes are on the disk.
        let err = match write_layer(target, layer, frames, zero_first()?, opts, reporter) {
            Ok(stats) => return Ok(stats),
            Err(e) => e,
        };
        let blamed = match &err {
            EngineError::BadSource { frame, .. } => senders.of(Some(*frame)),
            EngineError::Blob { .. } => senders.of(senders.corrupt_frame()),
            EngineError::Download { .. } if senders.digest_failed() => senders.of(None),
            _ => Vec::new(),
        };
        if blamed.is_empty() {
            return Err(err.into());
        }
        let why = ingot_artifact::error_chain::text(&err);
        for s in &blamed {
            registry.refuse(layer.blob, s, &why);
        }
        let left = registry
            .blob_sources_left(reference, layer.blob)
            .map_err(|e| EngineError::Download {
                layer: layer.name.to_string(),
                blob: layer.blob.to_string(),
                reason: e.full_text(),
            })?;
        if left.is_empty() {
            if tried.is_empty() {
                return Err(err.into()); // one source: its own error, as it was
            }
            tried.push((blamed, err));
            return Err(WriteStepError::AllSources {
                layer: layer.name.to_string(),
                blob: layer.blob.to_string(),
                tried: tried
                    .iter()
                    .map(|(s, e)| format!("{} ({})", join(s), ingot_artifact::error_chain::text(e)))
                    .collect::<Vec<_>>()
                    .join("; "),
            });
        }
        let warning = format!(
            "layer {}: {} sent bytes of the data blob {} that fail it ({}); refused for this \
             blob, writing the layer again from {}",
            layer.name,
            join(&blamed),
            layer.blob,
            ingot_artifact::error_chain::text(&err),
            left[0]
        );
        reporter.warning(Stage::Write, warning);
        tried.push((blamed, err));
        stream = streams.again();
    }
}

fn join(sources: &[SourceName]) -> String {
    sources
        .iter()
        .map(ToString::to_string)
        .collect::<Vec<_>>()
        .join(" and ")
}

/// Makes `target`'s `var` partition (already planned and left blank) this disk's member of the
/// mirror: its first [`ZEROED`] bytes zeroed, then the superblock written and read back.
pub fn write_member(
    target: &Target,
    plan: &DiskPlan,
    mirror: &Mirror,
    opts: WriteOptions,
    reporter: &Reporter,
) -> Result<WriteStats, WriteStepError> {
    let var = plan.part(&Content::Var);
    reporter.stage(
        Stage::Write,
        format!(
            "making var a member ({} of {}) of the RAID1 mirror {ARRAY_NAME}",
            mirror.index + 1,
            mirror.members.len()
        ),
    );
    let block = mirror
        .superblock(var.size)
        .ok_or(WriteStepError::VarTooSmall { size: var.size })?;
    let zeroed = target.zero_range(var.offset, ZEROED)?;
    if !zeroed {
        target.write_direct(&AlignedBuf::new(ZEROED as usize), var.offset)?;
    }
    Ok(write_bytes(
        target,
        "var-mirror",
        &block,
        var.offset + SUPERBLOCK_OFFSET,
        true,
        opts,
        reporter,
    )?)
}
