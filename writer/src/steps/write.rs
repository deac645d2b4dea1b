//! `write`: every selected layer's image and tree, and the sealed node layer, into their
//! partitions through the verified-write engine ([`crate::engine`]), so that no byte that fails
//! its hash can boot; with several disks this disk's `var` becomes a member of the mirror
//! ([`crate::mirror`]); otherwise `var` is left blank.
//!
//! Reads the opened target, the verified stack, the node layer and the plan; returns the bytes
//! written and skipped and the rewrites ([`WriteStats`]).

use crate::engine::bytes::write_bytes;
use crate::engine::frames::{copied_frames, mapped_frames};
use crate::engine::layer::write_layer;
use crate::engine::{EngineError, LayerData, WriteOptions, WriteStats};
use crate::layout::{Content, DiskPlan, MIB};
use crate::mirror::{Mirror, ARRAY_NAME, SUPERBLOCK_OFFSET, ZEROED};
use crate::node::NodeLayer;
use crate::report::{Reporter, Stage};
use crate::stack::{map_blob, OpenedStack, Source, StackError, VerifiedLayer};
use crate::stream;
use crate::target::{AlignedBuf, Target, TargetError};

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
                stream::start(s, r.registry(), r.reference(), jobs)
            }
            _ => Vec::new(),
        }
        .into_iter();
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
struct LayerSource<'s, I: Iterator<Item = stream::Stream>> {
    streams: &'s mut I,
    copy: Option<&'s CopyFrom>,
}

/// One layer of the stack: its image (from its local blob, a disk written before, or the next
/// registry stream), then its hash device, each read back and checked.
fn stack_layer<I: Iterator<Item = stream::Stream>>(
    target: &Target,
    index: usize,
    p: &VerifiedLayer,
    plan: &DiskPlan,
    source: LayerSource<'_, I>,
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
    let zero_blocks = p.verifier.zero_blocks();
    let blocks = p.verifier.params().data_blocks;
    let zeroed = zero_blocks * 8 >= blocks && target.zero_range(data.offset, data.size)?;
    tracing::debug!(
        "layer {}: {zero_blocks} of {blocks} blocks are zeros; zeroing first: {zeroed}",
        p.entry.name
    );
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
    let frames = match (p.data_path.get(), source.copy) {
        (Some(path), _) => {
            map = map_blob(path)?;
            mapped_frames(&layer, &map)?
        }
        (None, Some(copy)) => {
            let from = copy.plan.part(&Content::LayerData { index }).offset;
            copied_frames(&copy.target, from, &layer)
        }
        (None, None) => source
            .streams
            .next()
            .expect("one stream per layer not on this machine")
            .frames(),
    };
    let mut total = write_layer(target, &layer, frames, zeroed, opts, reporter)?;
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
