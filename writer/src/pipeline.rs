//! The writer's steps in order, and the one rule of whether a failed run touched the disk.
//!
//! Provisioning (as cluster-api-provider-hetzner runs it from the rescue system): check, gate,
//! guard, resolve, verify, stage, seal, the size gate, then the write. CAPH runs none of its own
//! disk checks on the `imageURLCommand` path, so every one of them happens here, each a named
//! stage with a named failure reason, all before the disk is touched. Writing a named target:
//! resolve, verify, then the write. The write: plan, wipe, write, esp, partition-table; any
//! failure after the wipe clears the partition-table areas again, so a half-written disk never
//! looks bootable.

use std::path::Path;

use ingot_artifact::verify::{StackRef, Trust};
use ingot_layers::select::Machine;
use ingot_machine::Sysroot;

use crate::error::{ProvisionError, WriteError};
use crate::report::{Reporter, Stage};
use crate::request::{Outcome, ProvisionRequest, Provisioned, WriteRequest, WriteSettings};
use crate::steps::seal::NodeLayer;
use crate::steps::verify::OpenedStack;
use crate::steps::{self, plan::DiskPlan};
use crate::target::Target;

/// Whether a run that failed in `stage` may have changed the disk: the disk changes from the
/// wipe on; every stage before it only reads.
pub fn touched_disk(stage: Stage) -> bool {
    matches!(
        stage,
        Stage::Wipe | Stage::Write | Stage::Esp | Stage::PartitionTable | Stage::Finish
    )
}

/// Provisions this machine; see the module docs.
pub fn provision(
    req: &ProvisionRequest,
    reporter: &Reporter,
) -> Result<Provisioned, ProvisionError> {
    let sysroot = Sysroot::new(&req.sysroot);
    let checked = steps::check::run(
        &sysroot,
        &req.bootstrap,
        &req.machine_name,
        req.role,
        reporter,
    )?;
    let targets = steps::gate::run(&sysroot, &checked.facts, req, reporter)?;
    steps::guard::run(&checked.facts, &targets, req.allow_foreign_os, reporter)?;
    let opened = open_stack(
        &req.image,
        &req.trust,
        &checked.machine,
        &req.settings.registry,
        reporter,
    )?;
    let role = checked.role;
    let staged = steps::stage::run(&opened, checked, &sysroot, req, reporter)?;
    let node = steps::seal::run(&staged, &opened.describe(), &req.machine_name, reporter)?;
    let disk = &targets[0];
    let need = steps::plan::min_disk_size(req.settings.esp_size, &opened.plan_layers(Some(&node)));
    steps::gate::size(disk, need, reporter)?;
    let outcome = write_opened(&opened, Some(&node), &disk.node, &req.settings, reporter)?;
    Ok(Provisioned {
        outcome,
        disk: disk.name.clone(),
        hostname: staged.hostname,
        role,
    })
}

/// Writes the stack `req` names onto `req.target`.
pub fn write_stack(req: &WriteRequest, reporter: &Reporter) -> Result<Outcome, WriteError> {
    let opened = open_stack(
        &req.source,
        &req.trust,
        &req.machine,
        &req.settings.registry,
        reporter,
    )?;
    write_opened(&opened, None, &req.target, &req.settings, reporter)
}

/// Everything up to (not including) touching the disk: resolve, then verify.
pub fn open_stack(
    stack: &StackRef,
    trust: &Trust,
    machine: &Machine,
    registry: &ingot_artifact::registry::RegistryOptions,
    reporter: &Reporter,
) -> Result<OpenedStack, WriteError> {
    let source = steps::resolve::run(stack, registry, reporter)?;
    steps::verify::run(source, trust, machine, reporter)
}

/// Writes an opened stack (and the node layer, if any) onto `target`: plan, wipe, then every
/// partition and the table last; a failure after the wipe clears the table areas again.
pub fn write_opened(
    opened: &OpenedStack,
    node: Option<&NodeLayer>,
    target: &Path,
    settings: &WriteSettings,
    reporter: &Reporter,
) -> Result<Outcome, WriteError> {
    let (target, plan) = steps::plan::run(target, opened, node, settings, reporter)?;
    steps::wipe::run(&target, reporter)?;
    write_planned(&target, opened, node, &plan, settings, reporter).inspect_err(|_| {
        steps::wipe::after_failure(&target);
    })
}

fn write_planned(
    target: &Target,
    opened: &OpenedStack,
    node: Option<&NodeLayer>,
    plan: &DiskPlan,
    settings: &WriteSettings,
    reporter: &Reporter,
) -> Result<Outcome, WriteError> {
    let mut stats = steps::write::run(target, opened, node, plan, settings.options, reporter)?;
    let (kernel_cmdline, esp) = steps::esp::run(target, opened, node, plan, settings, reporter)?;
    stats += esp;
    steps::partition_table::run(target, plan, reporter)?;

    let mut layers: Vec<(String, String)> = opened
        .layers()
        .iter()
        .map(|p| (p.entry.name.clone(), hex::encode(p.verifier.root_hash())))
        .collect();
    if let Some(n) = node {
        layers.push((crate::boot::NODE_LAYER.into(), hex::encode(&n.root_hash)));
    }
    Ok(Outcome {
        manifest_digest: opened.manifest_digest().to_string(),
        stack: opened.describe(),
        layers,
        plan: plan.clone(),
        kernel_cmdline,
        bytes_written: stats.written,
        bytes_skipped: stats.skipped,
        rewrites: stats.rewrites,
    })
}
