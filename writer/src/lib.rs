//! `ingot-writer`'s library: a signed stack onto one disk.
//!
//! One straight line, each step a named stage ([`report::Stage`]): resolve the source, verify
//! the signature and read the descriptor, select this machine's layers, check every selected
//! layer's hash tree against its signed root hash, plan the disk, clear the partition-table
//! areas, write each layer with both checks, write the ESP, write the partition table last and
//! confirm it. Any failure after the disk was touched clears the partition-table areas again,
//! so a half-written disk never looks bootable.

pub mod bootfiles;
pub mod engine;
pub mod esp;
pub mod plan;
pub mod report;
pub mod table;
pub mod target;

use std::path::PathBuf;
use std::sync::Arc;

use ingot::verify::{verify_metadata, verity_params, ArtifactSource, StackRef, Trust, VerifyError};
use ingot_layers::descriptor::LayerEntry;
use ingot_layers::select::Machine;
use ingot_verity::Verifier;
use sha2::{Digest, Sha256};

use crate::engine::{EngineError, LayerData, WriteOptions};
use crate::plan::{Content, DiskPlan, PlanError, PlanLayer, MIB};
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
    BootFiles(#[from] bootfiles::BootFilesError),
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
    data_path: PathBuf,
}

/// Everything up to (not including) touching the disk: signature, descriptor, selection, trees.
fn prepare(
    source: &dyn ArtifactSource,
    req: &WriteRequest,
    reporter: &Reporter,
) -> Result<(ingot::verify::VerifyReport, Vec<Prepared>), WriteError> {
    reporter.stage(
        Stage::Verify,
        format!("checking the signature of {}", source.describe()),
    );
    let (report, _manifest) = verify_metadata(source, &req.trust)?;
    let d = &report.descriptor;
    let selected: Vec<&LayerEntry> = d.select(&req.machine).collect();
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
    let mut prepared = Vec::new();
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
        // Not hashed whole: every decompressed block is checked against the tree before it is
        // written, which covers exactly the bytes that reach the disk.
        let data_path = source.blob_file_unhashed(&entry.data.digest, entry.data.size)?;
        prepared.push(Prepared {
            entry: entry.clone(),
            verifier: Arc::new(verifier),
            hash_bytes,
            data_path,
        });
    }
    Ok((report, prepared))
}

/// Writes the stack `req` names onto `req.target`.
pub fn write_stack(req: &WriteRequest, reporter: &Reporter) -> Result<Outcome, WriteError> {
    reporter.stage(Stage::Resolve, format!("opening {:?}", req.source));
    let source = ingot::verify::open(&req.source)?;
    let (report, layers) = prepare(source.as_ref(), req, reporter)?;

    reporter.stage(Stage::Plan, format!("planning {}", req.target.display()));
    let target = Target::open(&req.target)?;
    let plan_layers: Vec<PlanLayer> = layers
        .iter()
        .enumerate()
        .map(|(i, p)| PlanLayer {
            name: p.entry.name.clone(),
            base: i == 0,
            root_hash: p.verifier.root_hash().to_vec(),
            data_size: p.entry.size,
            hash_size: p.hash_bytes.len() as u64,
        })
        .collect();
    let identity = Sha256::new()
        .chain_update(report.manifest_digest.as_bytes())
        .finalize();
    let plan = plan::plan(
        target.size(),
        target.sector_size(),
        req.esp_size,
        &plan_layers,
        &identity,
    )?;

    // From here on the disk changes: on any failure, leave it without a partition table.
    reporter.stage(
        Stage::Wipe,
        "clearing the partition tables at both ends of the disk",
    );
    table::clear(&target).map_err(WriteError::from)?;
    match write_all(&target, req, &report, &layers, &plan, reporter) {
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
    req: &WriteRequest,
    report: &ingot::verify::VerifyReport,
    layers: &[Prepared],
    plan: &DiskPlan,
    reporter: &Reporter,
) -> Result<Outcome, WriteError> {
    let d = &report.descriptor;
    let mut written = 0u64;
    let mut skipped = 0u64;
    let mut rewrites = 0u32;
    for (index, p) in layers.iter().enumerate() {
        let data = plan.find(&Content::LayerData { index }).expect("planned");
        let hash = plan.find(&Content::LayerHash { index }).expect("planned");
        reporter.stage(
            Stage::Write,
            format!(
                "writing layer {} ({} bytes, root hash {})",
                p.entry.name, p.entry.size, p.entry.verity.root_hash
            ),
        );
        let file = std::fs::File::open(&p.data_path).map_err(|source| WriteError::Io {
            path: p.data_path.clone(),
            what: "opening the data blob",
            source,
        })?;
        // SAFETY: the blob is a file in the source store, read-only here; every block decoded
        // from it is checked against the tree before it is written.
        #[allow(unsafe_code)]
        let map = unsafe { memmap2::Mmap::map(&file) }.map_err(|source| WriteError::Io {
            path: p.data_path.clone(),
            what: "mapping the data blob",
            source,
        })?;
        // Zeroing first pays only when many blocks are zeros (the tree says which): on a thin
        // or file-backed disk it frees space that dense data must then allocate again.
        let zero_blocks = p.verifier.zero_blocks();
        let blocks = p.verifier.params().data_blocks;
        let zeroed = zero_blocks * 8 >= blocks && target.zero_range(data.offset, data.size)?;
        tracing::debug!(
            "layer {}: {zero_blocks} of {blocks} blocks are zeros; zeroing first: {zeroed}",
            p.entry.name
        );
        let stats = engine::write_layer(
            target,
            &LayerData {
                name: &p.entry.name,
                verifier: &p.verifier,
                blob: &map,
                frame_size: p.entry.data.compression.frame_size,
                image_size: p.entry.size,
                offset: data.offset,
                partition_size: data.size,
            },
            zeroed,
            req.options,
            reporter,
        )?;
        reporter.finish_bar();
        let zeroed = target.zero_range(hash.offset, hash.size)?;
        let hstats = engine::write_bytes(
            target,
            &format!("{}-verity", p.entry.name),
            &p.hash_bytes,
            hash.offset,
            zeroed,
            req.options,
            reporter,
        )?;
        written += stats.written + hstats.written;
        skipped += stats.skipped + hstats.skipped;
        rewrites += stats.rewrites + hstats.rewrites;
    }

    // var: left blank (no file system signature) for first boot to format, per the boot contract.
    let var = plan.find(&Content::Var).expect("planned");
    if !target.zero_range(var.offset, MIB)? {
        target.write_direct(&target::AlignedBuf::new(MIB as usize), var.offset)?;
    }

    reporter.stage(
        Stage::Esp,
        "reading the boot files from the verified base layer and writing the ESP",
    );
    let base = &layers[0];
    let base_part = plan
        .find(&Content::LayerData { index: 0 })
        .expect("planned");
    let file = target.clone_buffered()?;
    let boot = bootfiles::read(
        file,
        base_part.offset,
        base.verifier.clone(),
        &d.boot.kernel,
        &d.boot.initrd,
        &d.boot.efi,
    )?;
    let var_uuid = var.part_guid;
    let layer_list: Vec<String> = layers
        .iter()
        .map(|p| format!("{}:{}", p.entry.name, p.entry.verity.root_hash))
        .collect();
    let mut cmdline = format!(
        "ingot.stack={}:{} ingot.layers={} ingot.var=PARTUUID={} ro",
        d.name,
        d.version,
        layer_list.join(","),
        var_uuid
    );
    for arg in &req.kernel_args {
        cmdline.push(' ');
        cmdline.push_str(arg);
    }
    let esp_part = plan.find(&Content::Esp).expect("planned");
    let volume_id = u32::from_le_bytes(plan.disk_guid.as_bytes()[..4].try_into().expect("4 bytes"));
    let image = esp::build(
        esp_part.size,
        &esp::EspContents {
            bootloader: &boot.bootloader,
            kernel: &boot.kernel,
            initrd: &boot.initrd,
            entry: esp::loader_entry(&format!("ingot {} {}", d.name, d.version), &cmdline),
            volume_id,
        },
    )?;
    let zeroed = target.zero_range(esp_part.offset, esp_part.size)?;
    let estats = engine::write_bytes(
        target,
        "esp",
        &image,
        esp_part.offset,
        zeroed,
        req.options,
        reporter,
    )?;
    written += estats.written;
    skipped += estats.skipped;
    rewrites += estats.rewrites;

    reporter.stage(
        Stage::PartitionTable,
        "writing the partition table (last) and reading it back",
    );
    target.sync()?;
    table::write(target, plan)?;
    target.reread_partitions();

    Ok(Outcome {
        manifest_digest: report.manifest_digest.clone(),
        stack: format!("{} {}", d.name, d.version),
        layers: layers
            .iter()
            .map(|p| (p.entry.name.clone(), p.entry.verity.root_hash.clone()))
            .collect(),
        plan: plan.clone(),
        kernel_cmdline: cmdline,
        bytes_written: written,
        bytes_skipped: skipped,
        rewrites,
    })
}
