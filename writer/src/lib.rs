//! `ingot-writer`'s library: a signed stack onto one disk.
//!
//! One straight line, each step a named stage ([`report::Stage`]): resolve the source, verify
//! the signature and read the descriptor, select this machine's layers, check every selected
//! layer's hash tree against its signed root hash, plan the disk, clear the partition-table
//! areas, write each layer (streamed from a registry source) and check every block after it is
//! read back, write the ESP, write the partition table last and confirm it. Any failure after the disk was touched clears the partition-table areas again,
//! so a half-written disk never looks bootable.

pub mod engine;
pub mod esp;
pub mod layerfs;
pub mod plan;
pub mod provision;
pub mod report;
pub mod stream;
pub mod table;
pub mod target;

use std::path::PathBuf;
use std::sync::{Arc, OnceLock};

use ingot::verify::{verify_metadata, verity_params, StackRef, Trust, VerifyError};
use ingot_layers::descriptor::LayerEntry;
use ingot_layers::select::Machine;
use ingot_verity::Verifier;
use sha2::{Digest, Sha256};

use crate::engine::{EngineError, LayerData, WriteOptions};
use crate::layerfs::{LayerFs, LayerFsError};
use crate::plan::{Content, DiskPlan, LayerKind, PlanError, PlanLayer, MIB};
use crate::report::{Reporter, Stage};
use crate::target::{Target, TargetError};

/// What to write where.
#[derive(Debug, Clone)]
pub struct WriteRequest {
    pub source: StackRef,
    pub trust: Trust,
    pub machine: Machine,
    pub target: PathBuf,
    pub esp_size: u64,
    /// Appended to the kernel command line after ingot's own parameters.
    pub kernel_args: Vec<String>,
    pub options: WriteOptions,
}

/// What was written.
#[derive(Debug, Clone)]
pub struct Outcome {
    pub manifest_digest: String,
    pub stack: String,
    /// (layer name, root hash hex), in stacking order.
    pub layers: Vec<(String, String)>,
    pub plan: DiskPlan,
    pub kernel_cmdline: String,
    pub bytes_written: u64,
    pub bytes_skipped: u64,
    pub rewrites: u32,
}

#[derive(Debug, thiserror::Error)]
pub enum WriteError {
    #[error(transparent)]
    Source(#[from] VerifyError),
    #[error("layer `{layer}`: the hash tree does not match the signed root hash: {reason}")]
    Tree { layer: String, reason: String },
    #[error(transparent)]
    Target(#[from] TargetError),
    #[error(transparent)]
    Plan(#[from] PlanError),
    #[error(transparent)]
    Engine(#[from] EngineError),
    #[error(transparent)]
    Table(#[from] table::TableError),
    #[error(transparent)]
    LayerFs(#[from] LayerFsError),
    #[error(transparent)]
    Esp(#[from] esp::EspError),
    #[error("{path}: {what}: {source}")]
    Io {
        path: PathBuf,
        what: &'static str,
        source: std::io::Error,
    },
    #[error("the stack has no base layer to boot from")]
    NoBase,
}

/// A selected layer, its tree checked, its data blob located.
struct Prepared {
    entry: LayerEntry,
    verifier: Arc<Verifier>,
    hash_bytes: Vec<u8>,
    /// The data blob as a local file: in an image layout, or fetched from a registry for
    /// staging. Unset, it is streamed from the registry while it is written.
    data_path: OnceLock<PathBuf>,
}

/// Where the stack comes from.
enum Source {
    Local(Box<dyn ingot::verify::ArtifactSource>),
    /// Kept open: data blobs stream from it while they are written.
    Registry(Box<ingot::registry::source::RegistrySource>),
}

impl Source {
    fn get(&self) -> &dyn ingot::verify::ArtifactSource {
        match self {
            Source::Local(s) => s.as_ref(),
            Source::Registry(r) => r.as_ref(),
        }
    }
}

/// The sealed per-node layer, built on this machine: an ext4 image and its verity hash device.
#[derive(Debug, Clone)]
pub struct NodeLayer {
    pub image: Vec<u8>,
    pub hash: Vec<u8>,
    pub root_hash: Vec<u8>,
}

/// A stack whose signature, descriptor and selected layers' trees are checked; nothing written.
pub struct OpenedStack {
    report: ingot::verify::VerifyReport,
    layers: Vec<Prepared>,
    source: Source,
}

impl OpenedStack {
    /// `name version` of the stack.
    pub fn describe(&self) -> String {
        let d = &self.report.descriptor;
        format!("{} {}", d.name, d.version)
    }

    /// The selected layers' names, in stacking order.
    pub fn layer_names(&self) -> Vec<String> {
        self.layers.iter().map(|p| p.entry.name.clone()).collect()
    }

    /// The base layer's file system, read from its blob with every block checked against the
    /// signed tree (for staging, before anything is written). From a registry, the base
    /// layer's blob is fetched whole for this (and then written from that copy): staging needs
    /// files from it before the disk plan exists, and a blob has no index of its frames.
    pub fn base_fs(&self) -> Result<LayerFs, WriteError> {
        let base = &self.layers[0];
        let path = match base.data_path.get() {
            Some(p) => p.clone(),
            None => {
                let p = self
                    .source
                    .get()
                    .blob_file_unhashed(&base.entry.data.digest, base.entry.data.size)?;
                base.data_path.get_or_init(|| p).clone()
            }
        };
        let map = map_blob(&path)?;
        Ok(LayerFs::in_blob(
            &base.entry.name,
            Arc::new(map),
            base.entry.data.compression.frame_size,
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
                root_hash: p.verifier.root_hash().to_vec(),
                data_size: p.entry.size,
                hash_size: p.hash_bytes.len() as u64,
            })
            .collect();
        if let Some(n) = node {
            out.push(PlanLayer {
                name: "node".into(),
                kind: LayerKind::Node,
                root_hash: n.root_hash.clone(),
                data_size: n.image.len() as u64,
                hash_size: n.hash.len() as u64,
            });
        }
        out
    }
}

fn map_blob(path: &std::path::Path) -> Result<memmap2::Mmap, WriteError> {
    let file = std::fs::File::open(path).map_err(|source| WriteError::Io {
        path: path.to_path_buf(),
        what: "opening the data blob",
        source,
    })?;
    // SAFETY: the blob is a file in the source store, read-only here; every block decoded from
    // it is checked against the tree before it is used or written.
    #[allow(unsafe_code)]
    unsafe { memmap2::Mmap::map(&file) }.map_err(|source| WriteError::Io {
        path: path.to_path_buf(),
        what: "mapping the data blob",
        source,
    })
}

/// Everything up to (not including) touching the disk: signature, descriptor, selection, trees.
pub fn open_stack(
    stack: &StackRef,
    trust: &Trust,
    machine: &Machine,
    reporter: &Reporter,
) -> Result<OpenedStack, WriteError> {
    let what = match stack {
        StackRef::Layout(p) => p.display().to_string(),
        StackRef::Registry(r) => r.to_string(),
    };
    reporter.stage(Stage::Resolve, format!("opening {what}"));
    let opened_source = match stack {
        StackRef::Registry(r) => Source::Registry(Box::new(
            ingot::registry::source::RegistrySource::open(
                r,
                ingot::registry::RegistryOptions::default(),
            )
            .map_err(VerifyError::from)?,
        )),
        StackRef::Layout(_) => Source::Local(ingot::verify::open(stack)?),
    };
    let source = opened_source.get();
    reporter.stage(
        Stage::Verify,
        format!("checking the signature of {}", source.describe()),
    );
    let (report, _manifest) = verify_metadata(source, trust)?;
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
    let mut layers = Vec::new();
    for entry in selected {
        let params = verity_params(entry)?;
        let hash_bytes = source.blob(&entry.hash.digest, entry.hash.size)?;
        let root = hex::decode(&entry.verity.root_hash).map_err(|_| WriteError::Tree {
            layer: entry.name.clone(),
            reason: "root hash is not hex".into(),
        })?;
        let verifier = Verifier::from_hash_device(&params, &hash_bytes, &root).map_err(|e| {
            WriteError::Tree {
                layer: entry.name.clone(),
                reason: e.to_string(),
            }
        })?;
        // Not hashed whole: every block is checked against the tree after it is written and read
        // back, which covers exactly the bytes on the disk. From a registry it is not fetched
        // here at all, but streamed while it is written.
        let data_path = OnceLock::new();
        if let Source::Local(local) = &opened_source {
            let _ = data_path.set(local.blob_file_unhashed(&entry.data.digest, entry.data.size)?);
        }
        layers.push(Prepared {
            entry: entry.clone(),
            verifier: Arc::new(verifier),
            hash_bytes,
            data_path,
        });
    }
    Ok(OpenedStack {
        report,
        layers,
        source: opened_source,
    })
}

/// How to write an opened stack.
#[derive(Debug, Clone)]
pub struct WriteSettings {
    pub esp_size: u64,
    /// Appended to the kernel command line after ingot's own parameters.
    pub kernel_args: Vec<String>,
    pub options: WriteOptions,
}

/// Writes the stack `req` names onto `req.target`.
pub fn write_stack(req: &WriteRequest, reporter: &Reporter) -> Result<Outcome, WriteError> {
    let opened = open_stack(&req.source, &req.trust, &req.machine, reporter)?;
    let settings = WriteSettings {
        esp_size: req.esp_size,
        kernel_args: req.kernel_args.clone(),
        options: req.options,
    };
    write_opened(&opened, None, &req.target, &settings, reporter)
}

/// Writes an opened stack (and the node layer, if any) onto `target`: plan, clear the table
/// areas, write and check every partition, write the table last. Any failure after the disk
/// was touched clears the table areas again.
pub fn write_opened(
    opened: &OpenedStack,
    node: Option<&NodeLayer>,
    target: &std::path::Path,
    settings: &WriteSettings,
    reporter: &Reporter,
) -> Result<Outcome, WriteError> {
    reporter.stage(Stage::Plan, format!("planning {}", target.display()));
    let target = Target::open(target)?;
    let identity = Sha256::new()
        .chain_update(opened.report.manifest_digest.as_bytes())
        .finalize();
    let plan = plan::plan(
        target.size(),
        target.sector_size(),
        settings.esp_size,
        &opened.plan_layers(node),
        &identity,
    )?;
    settings.options.check_deadline("plan")?;

    // From here on the disk changes: on any failure, leave it without a partition table.
    reporter.stage(
        Stage::Wipe,
        "clearing the partition tables at both ends of the disk",
    );
    table::clear(&target).map_err(WriteError::from)?;
    match write_all(&target, settings, opened, node, &plan, reporter) {
        Ok(outcome) => Ok(outcome),
        Err(e) => {
            if let Err(clear) = table::clear(&target) {
                tracing::error!(
                    "clearing the partition tables after a failure also failed: {clear}"
                );
            }
            Err(e)
        }
    }
}

fn write_all(
    target: &Target,
    settings: &WriteSettings,
    opened: &OpenedStack,
    node: Option<&NodeLayer>,
    plan: &DiskPlan,
    reporter: &Reporter,
) -> Result<Outcome, WriteError> {
    let d = &opened.report.descriptor;
    let layers = &opened.layers;
    let opts = settings.options;
    let mut total = engine::WriteStats::default();
    let mut add = |s: engine::WriteStats| {
        total.written += s.written;
        total.skipped += s.skipped;
        total.rewrites += s.rewrites;
    };
    // Blobs not on this machine stream from the registry, the next one downloading while
    // this one is written.
    let jobs: Vec<stream::Job> = layers
        .iter()
        .filter(|p| p.data_path.get().is_none())
        .map(|p| stream::Job {
            layer: p.entry.name.clone(),
            digest: p.entry.data.digest.clone(),
            size: p.entry.data.size,
            frame_size: p.entry.data.compression.frame_size,
        })
        .collect();
    std::thread::scope(|s| -> Result<(), WriteError> {
        // Owned by this closure: dropped (so the download stops) before the scope ends.
        let mut streams = match &opened.source {
            Source::Registry(r) if !jobs.is_empty() => {
                stream::start(s, r.registry(), r.reference(), jobs)
            }
            _ => Vec::new(),
        }
        .into_iter();
        for (index, p) in layers.iter().enumerate() {
            let stats = write_layer_and_tree(target, opts, plan, reporter, index, p, &mut streams)?;
            add(stats);
        }
        Ok(())
    })?;
    if let Some(n) = node {
        let index = layers.len();
        let root = hex::encode(&n.root_hash);
        reporter.stage(
            Stage::Write,
            format!(
                "writing the sealed node layer ({} bytes, root hash {root})",
                n.image.len()
            ),
        );
        for (content, what, bytes) in [
            (Content::LayerData { index }, "node", &n.image),
            (Content::LayerHash { index }, "node-verity", &n.hash),
        ] {
            let part = plan.find(&content).expect("planned");
            let zeroed = target.zero_range(part.offset, part.size)?;
            add(engine::write_bytes(
                target,
                what,
                bytes,
                part.offset,
                zeroed,
                opts,
                reporter,
            )?);
        }
    }

    // var: left blank (no file system signature) for first boot to format, per the boot contract.
    let var = plan.find(&Content::Var).expect("planned");
    if !target.zero_range(var.offset, MIB)? {
        target.write_direct(&target::AlignedBuf::new(MIB as usize), var.offset)?;
    }
    opts.check_deadline("write")?;

    reporter.stage(
        Stage::Esp,
        "reading the boot files from the verified base layer and writing the ESP",
    );
    let base = &layers[0];
    let base_part = plan
        .find(&Content::LayerData { index: 0 })
        .expect("planned");
    let fs = LayerFs::on_target(
        &base.entry.name,
        target.clone_buffered()?,
        base_part.offset,
        base.verifier.clone(),
    )?;
    let (kernel, initrd, bootloader) = (
        fs.read(&d.boot.kernel)?,
        fs.read(&d.boot.initrd)?,
        fs.read(&d.boot.efi)?,
    );
    let cmdline = kernel_cmdline(opened, node, plan, &settings.kernel_args);
    let esp_part = plan.find(&Content::Esp).expect("planned");
    let volume_id = u32::from_le_bytes(plan.disk_guid.as_bytes()[..4].try_into().expect("4 bytes"));
    let image = esp::build(
        esp_part.size,
        &esp::EspContents {
            bootloader: &bootloader,
            kernel: &kernel,
            initrd: &initrd,
            entry: esp::loader_entry(&format!("ingot {} {}", d.name, d.version), &cmdline),
            volume_id,
        },
    )?;
    let zeroed = target.zero_range(esp_part.offset, esp_part.size)?;
    add(engine::write_bytes(
        target,
        "esp",
        &image,
        esp_part.offset,
        zeroed,
        opts,
        reporter,
    )?);
    opts.check_deadline("esp")?;

    reporter.stage(
        Stage::PartitionTable,
        "writing the partition table (last) and reading it back",
    );
    target.sync()?;
    table::write(target, plan)?;
    target.reread_partitions();

    let mut written_layers: Vec<(String, String)> = layers
        .iter()
        .map(|p| (p.entry.name.clone(), p.entry.verity.root_hash.clone()))
        .collect();
    if let Some(n) = node {
        written_layers.push(("node".into(), hex::encode(&n.root_hash)));
    }
    Ok(Outcome {
        manifest_digest: opened.report.manifest_digest.clone(),
        stack: format!("{} {}", d.name, d.version),
        layers: written_layers,
        plan: plan.clone(),
        kernel_cmdline: cmdline,
        bytes_written: total.written,
        bytes_skipped: total.skipped,
        rewrites: total.rewrites,
    })
}

/// Writes one layer's data (from its local blob, or the next registry stream) and its hash
/// device, each read back and checked.
fn write_layer_and_tree(
    target: &Target,
    opts: WriteOptions,
    plan: &DiskPlan,
    reporter: &Reporter,
    index: usize,
    p: &Prepared,
    streams: &mut impl Iterator<Item = stream::Stream>,
) -> Result<engine::WriteStats, WriteError> {
    let data = plan.find(&Content::LayerData { index }).expect("planned");
    let hash = plan.find(&Content::LayerHash { index }).expect("planned");
    reporter.stage(
        Stage::Write,
        format!(
            "writing layer {} ({} bytes, root hash {})",
            p.entry.name, p.entry.size, p.entry.verity.root_hash
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
    let frames = match p.data_path.get() {
        Some(path) => {
            map = map_blob(path)?;
            engine::mapped_frames(&layer, &map)?
        }
        None => streams
            .next()
            .expect("one stream per layer not on this machine")
            .frames(),
    };
    let mut stats = engine::write_layer(target, &layer, frames, zeroed, opts, reporter)?;
    reporter.finish_bar();
    let zeroed = target.zero_range(hash.offset, hash.size)?;
    let tree = engine::write_bytes(
        target,
        &format!("{}-verity", p.entry.name),
        &p.hash_bytes,
        hash.offset,
        zeroed,
        opts,
        reporter,
    )?;
    stats.written += tree.written;
    stats.skipped += tree.skipped;
    stats.rewrites += tree.rewrites;
    Ok(stats)
}

/// The boot contract's kernel command line: the stack, its selected layers with their root
/// hashes in stacking order, the node layer's root hash, the var partition, then extra args.
fn kernel_cmdline(
    opened: &OpenedStack,
    node: Option<&NodeLayer>,
    plan: &DiskPlan,
    extra: &[String],
) -> String {
    let d = &opened.report.descriptor;
    let layer_list: Vec<String> = opened
        .layers
        .iter()
        .map(|p| format!("{}:{}", p.entry.name, p.entry.verity.root_hash))
        .collect();
    let var = plan.find(&Content::Var).expect("planned");
    let mut cmdline = format!(
        "ingot.stack={}:{} ingot.layers={}",
        d.name,
        d.version,
        layer_list.join(",")
    );
    if let Some(n) = node {
        cmdline.push_str(&format!(" ingot.node={}", hex::encode(&n.root_hash)));
    }
    cmdline.push_str(&format!(" ingot.var=PARTUUID={} ro", var.part_guid));
    for arg in extra {
        cmdline.push(' ');
        cmdline.push_str(arg);
    }
    cmdline
}
