//! The writer's steps in order, and what a failed run left on the disks ([`Failed`]).
//!
//! Provisioning (as cluster-api-provider-hetzner runs it from the rescue system): check, gate,
//! guard, resolve, verify, stage, seal, the size gate, then the write. CAPH runs none of its own
//! disk checks on the `imageURLCommand` path, so every one of them happens here, each a named
//! stage with a named failure reason, all before the disk is touched; then the teardown of old
//! md arrays and volume groups on the targets, the first step that changes a disk. Writing a
//! named target: resolve, verify, then the write. The write: plan, wipe, write, esp,
//! partition-table. Whether the disks changed is state carried from the first step that changes
//! one (the teardown, or a disk's wipe): any failure from there on clears the partition-table
//! areas of every disk changed, so a half-written disk never looks bootable, and the failure
//! says so ([`DiskState`]).
//!
//! A dry run (`--dry-run`) takes every step up to and including the plan of every target, the
//! targets opened read-only, and stops there: nothing is torn down, wiped or written.

use std::path::Path;

use ingot_artifact::verify::{StackRef, Trust};
use ingot_layers::select::{Machine, Role};
use ingot_machine::Sysroot;
use ingot_verity::RootHash;

use crate::error::{ProvisionError, WriteError};
use crate::layout::min_disk_size;
use crate::node::NodeLayer;
use crate::report::{DiskState, Reporter};
use crate::request::{
    Outcome, Planned, ProvisionRequest, Provisioned, WriteRequest, WriteSettings,
};
use crate::stack::OpenedStack;
use crate::steps;
use crate::steps::plan::Plan;
use crate::steps::write::CopyFrom;
use crate::target::Target;

/// A failed run: its error (boxed: the typed causes make it large, and it travels up every
/// step), and what it left on the disks.
#[derive(Debug)]
pub struct Failed<E> {
    pub error: Box<E>,
    pub disks: DiskState,
}

impl<E> Failed<E> {
    /// A failure before any disk changed.
    pub fn untouched(error: impl Into<E>) -> Self {
        Failed {
            error: Box::new(error.into()),
            disks: DiskState::Untouched,
        }
    }

    /// A failure after disks changed; `cleared`: every changed disk's tables were cleared again.
    fn changed(error: impl Into<E>, cleared: bool) -> Self {
        Failed {
            error: Box::new(error.into()),
            disks: if cleared {
                DiskState::Cleared
            } else {
                DiskState::ClearFailed
            },
        }
    }

    fn into<F: From<E>>(self) -> Failed<F> {
        Failed {
            error: Box::new((*self.error).into()),
            disks: self.disks,
        }
    }
}

/// Clears the partition-table areas of `disks` after a failure; whether every one was cleared.
fn clear_tables<'a>(disks: impl IntoIterator<Item = &'a Path>) -> bool {
    disks.into_iter().fold(true, |all, disk| {
        let cleared = match Target::open(disk) {
            Ok(t) => steps::wipe::after_failure(&t),
            Err(e) => {
                tracing::error!(
                    "{}: cannot open it to clear its partition tables: {e}",
                    disk.display()
                );
                false
            }
        };
        all && cleared
    })
}

/// Everything a provisioning run does before the disks change: the machine checked, the disks
/// gated and guarded, the stack verified, the node layer staged and sealed, every target big
/// enough, the teardown planned.
struct Ready {
    sysroot: Sysroot,
    opened: OpenedStack,
    node: NodeLayer,
    targets: Vec<ingot_machine::Disk>,
    teardown: Vec<ingot_machine::teardown::Step>,
    hostname: String,
    role: Role,
    secrets: crate::secrets::SecretsReport,
}

fn prepare(req: &ProvisionRequest, reporter: &Reporter) -> Result<Ready, ProvisionError> {
    let sysroot = Sysroot::new(&req.sysroot);
    let checked = steps::check::run(
        &sysroot,
        &req.bootstrap,
        &req.machine_name,
        req.role,
        reporter,
    )?;
    let targets = steps::gate::run(&sysroot, &checked.facts, req, reporter)?;
    let guard = steps::guard::run(&checked.facts, &targets, req.allow_foreign_os, reporter)?;
    let teardown = steps::teardown::plan(&sysroot, &targets, &guard, reporter)?;
    let opened = open_stack(
        &req.image,
        &req.trust,
        &checked.machine,
        &req.settings.registry,
        reporter,
    )?;
    let bios_loader = opened.descriptor().boot.bios.is_some();
    steps::gate::firmware(&checked.facts, bios_loader, reporter)?;
    let decision = steps::gate::secrets(
        req.tpm,
        &checked.facts,
        req.tpm_device.is_some(),
        opened.uki(),
        reporter,
    )?;
    let tpm = checked.facts.tpm;
    let role = checked.role;
    let staged = steps::stage::run(&opened, checked, &sysroot, req, reporter)?;
    let hostname = staged.hostname.clone();
    let plan = steps::seal::SecretsPlan {
        setting: req.tpm,
        tpm,
        decision: &decision,
        device: req.tpm_device.as_deref().unwrap_or("auto"),
    };
    let (node, secrets) = steps::seal::run(
        staged,
        &plan,
        &opened.describe(),
        &req.machine_name,
        reporter,
    )?;
    // Before the teardown: a stack that cannot boot here leaves every disk as it was.
    steps::plan::check_boot(&opened, Some(&node), &req.settings, targets.len())
        .map_err(WriteError::from)?;
    let need = min_disk_size(
        req.settings.esp_size,
        &opened.plan_layers(Some(&node)),
        bios_loader,
    );
    for disk in &targets {
        steps::gate::size(disk, need, reporter)?;
    }
    Ok(Ready {
        sysroot,
        opened,
        node,
        targets,
        teardown,
        hostname,
        role,
        secrets,
    })
}

/// Provisions this machine; see the module docs.
pub fn provision(
    req: &ProvisionRequest,
    reporter: &Reporter,
) -> Result<Provisioned, Failed<ProvisionError>> {
    let p = prepare(req, reporter).map_err(Failed::untouched)?;
    // A signal or the deadline during the checks stops the run here, the disks untouched.
    req.settings
        .options
        .check_stop("checking the machine and the stack")
        .map_err(Failed::untouched)?;
    // From here on the disks change, the teardown first.
    if let Err(e) = steps::teardown::run(
        req.host.as_ref(),
        &p.sysroot,
        &p.targets,
        &p.teardown,
        reporter,
    ) {
        let cleared = clear_tables(p.targets.iter().map(|d| d.node.as_path()));
        return Err(Failed::changed(e, cleared));
    }
    let torn_down = !p.teardown.is_empty();
    let outcome = write_every_target(&p.opened, &p.node, &p.targets, &req.settings, reporter)
        .map_err(|f| {
            let f = f.into::<ProvisionError>();
            if torn_down && f.disks == DiskState::Untouched {
                // The teardown changed the disks before this failure: clear them too.
                let cleared = clear_tables(p.targets.iter().map(|d| d.node.as_path()));
                return Failed::changed(*f.error, cleared);
            }
            f
        })?;
    Ok(Provisioned {
        outcome,
        disks: p.targets.iter().map(|d| d.name.clone()).collect(),
        hostname: p.hostname,
        role: p.role,
        secrets: p.secrets,
    })
}

/// A provisioning dry run: every step [`provision`] takes up to and including the plan of
/// every target, and nothing written.
pub fn provision_dry_run(
    req: &ProvisionRequest,
    reporter: &Reporter,
) -> Result<Planned, ProvisionError> {
    let p = prepare(req, reporter)?;
    let mut disks = Vec::new();
    let created = mirror_created();
    for (index, disk) in p.targets.iter().enumerate() {
        let settings = disk_settings(&p.opened, &req.settings, index, p.targets.len(), created);
        let plan = steps::plan::dry_run(&disk.node, &p.opened, Some(&p.node), &settings, reporter)
            .map_err(WriteError::from)?;
        disks.push((disk.node.clone(), plan.layout));
    }
    Ok(Planned {
        manifest_digest: p.opened.manifest_digest().to_string(),
        stack: p.opened.describe(),
        layers: layer_roots(&p.opened, Some(&p.node)),
        disks,
        teardown: p.teardown.iter().map(|s| s.command_line()).collect(),
        node: Some((p.hostname, p.role)),
    })
}

/// One creation time for the whole mirror: mdadm refuses members whose superblocks were
/// created at different times, and disks are written seconds apart.
fn mirror_created() -> u64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |d| d.as_secs())
}

/// The settings for target `index` of `count`: with more than one, `var` is mirrored.
fn disk_settings(
    opened: &OpenedStack,
    settings: &WriteSettings,
    index: usize,
    count: usize,
    created: u64,
) -> WriteSettings {
    let mut settings = settings.clone();
    if count > 1 {
        settings.mirror = Some(crate::mirror::Mirror::new(
            opened.manifest_digest(),
            index,
            count,
            created,
            |identity| crate::layout::derived_guid(identity, b"var"),
        ));
    }
    settings
}

/// Every target gets the whole layout, so the firmware can boot from either disk alone; with
/// more than one, `var` is mirrored across them ([`crate::mirror`]). A failure on one disk
/// clears the partition tables of those already written: no disk of a failed run can boot.
fn write_every_target(
    opened: &OpenedStack,
    node: &NodeLayer,
    targets: &[ingot_machine::Disk],
    settings: &WriteSettings,
    reporter: &Reporter,
) -> Result<Outcome, Failed<WriteError>> {
    // The first disk's outcome (plan, command line), with the bytes and rewrites of all.
    let mut first: Option<Outcome> = None;
    let created = mirror_created();
    // Disks after the first copy the stack's layers from the first (read back and checked
    // against the signed trees, as any source is) instead of downloading them again.
    let mut copy: Option<CopyFrom> = None;
    for (index, disk) in targets.iter().enumerate() {
        let settings = disk_settings(opened, settings, index, targets.len(), created);
        // `written`: the disks this run has written whole (each with its table).
        let mut written = index;
        let result = write_opened(
            opened,
            Some(node),
            &disk.node,
            &settings,
            copy.as_ref(),
            reporter,
        )
        .and_then(|outcome| {
            written = index + 1;
            if copy.is_none() && index + 1 < targets.len() {
                copy = Some(CopyFrom {
                    target: Target::probe(&disk.node).map_err(Failed::untouched)?,
                    plan: outcome.plan.clone(),
                });
            }
            Ok(outcome)
        });
        match result {
            Ok(outcome) => match &mut first {
                None => first = Some(outcome),
                Some(total) => {
                    total.bytes_written += outcome.bytes_written;
                    total.bytes_skipped += outcome.bytes_skipped;
                    total.rewrites += outcome.rewrites;
                }
            },
            Err(failed) => {
                // The copy source holds the first disk open (exclusively): let it go first.
                drop(copy.take());
                if written == 0 {
                    return Err(failed); // only this disk, which `write_opened` cleared if changed
                }
                let cleared = clear_tables(targets[..written].iter().map(|d| d.node.as_path()));
                let this = failed.disks != DiskState::ClearFailed;
                return Err(Failed::changed(*failed.error, cleared && this));
            }
        }
    }
    Ok(first.expect("at least one target"))
}

/// Writes the stack `req` names onto `req.target`.
pub fn write_stack(req: &WriteRequest, reporter: &Reporter) -> Result<Outcome, Failed<WriteError>> {
    let opened = open_stack(
        &req.source,
        &req.trust,
        &req.machine,
        &req.settings.registry,
        reporter,
    )
    .map_err(Failed::untouched)?;
    write_opened(&opened, None, &req.target, &req.settings, None, reporter)
}

/// A dry run of [`write_stack`]: resolve, verify and plan, and nothing written.
pub fn write_stack_dry_run(req: &WriteRequest, reporter: &Reporter) -> Result<Planned, WriteError> {
    let opened = open_stack(
        &req.source,
        &req.trust,
        &req.machine,
        &req.settings.registry,
        reporter,
    )?;
    let plan = steps::plan::dry_run(&req.target, &opened, None, &req.settings, reporter)?;
    Ok(Planned {
        manifest_digest: opened.manifest_digest().to_string(),
        stack: opened.describe(),
        layers: layer_roots(&opened, None),
        disks: vec![(req.target.clone(), plan.layout)],
        teardown: Vec::new(),
        node: None,
    })
}

/// Everything up to (not including) touching the disk: resolve, then verify.
pub fn open_stack(
    stack: &StackRef,
    trust: &Trust,
    machine: &Machine,
    registry: &ingot_artifact::registry::RegistryOptions,
    reporter: &Reporter,
) -> Result<OpenedStack, WriteError> {
    let source = steps::resolve::run(stack, registry, reporter)
        .map_err(|e| WriteError::Resolve(Box::new(e)))?;
    Ok(steps::verify::run(source, trust, machine, reporter)?)
}

/// Writes an opened stack (and the node layer, if any) onto `target`: plan, wipe, then every
/// partition and the table last; a failure after the wipe clears the table areas again.
pub fn write_opened(
    opened: &OpenedStack,
    node: Option<&NodeLayer>,
    target: &Path,
    settings: &WriteSettings,
    copy: Option<&CopyFrom>,
    reporter: &Reporter,
) -> Result<Outcome, Failed<WriteError>> {
    let (target, plan) =
        steps::plan::run(target, opened, node, settings, reporter).map_err(Failed::untouched)?;
    // A signal or the deadline before the wipe stops the run with this disk untouched.
    settings
        .options
        .check_stop("planning")
        .map_err(Failed::untouched)?;
    // From the wipe on this disk has changed.
    write_planned(&target, opened, node, &plan, settings, copy, reporter)
        .map_err(|e| Failed::changed(e, steps::wipe::after_failure(&target)))
}

fn write_planned(
    target: &Target,
    opened: &OpenedStack,
    node: Option<&NodeLayer>,
    plan: &Plan,
    settings: &WriteSettings,
    copy: Option<&CopyFrom>,
    reporter: &Reporter,
) -> Result<Outcome, WriteError> {
    steps::wipe::run(target, reporter).map_err(WriteError::Wipe)?;
    let layout = &plan.layout;
    let mut stats = steps::write::run(
        target,
        opened,
        node,
        layout,
        copy,
        settings.options,
        reporter,
    )?;
    if let Some(m) = &settings.mirror {
        stats += steps::write::write_member(target, layout, m, settings.options, reporter)?;
    }
    let esp = steps::esp::run(target, opened, node, plan, settings, reporter)?;
    stats += esp.stats;
    let (kernel_cmdline, mbr_code) = (esp.cmdline, esp.mbr_code);
    target.check_still_named()?;
    steps::partition_table::run(target, layout, mbr_code.as_deref(), reporter)
        .map_err(WriteError::Table)?;
    target.check_still_named()?;

    Ok(Outcome {
        manifest_digest: opened.manifest_digest().to_string(),
        stack: opened.describe(),
        layers: layer_roots(opened, node),
        plan: layout.clone(),
        kernel_cmdline,
        boot_chain: plan.chain,
        bytes_written: stats.written,
        bytes_skipped: stats.skipped,
        rewrites: stats.rewrites,
    })
}

/// (name, root hash) of every layer in stacking order, the node layer last.
fn layer_roots(opened: &OpenedStack, node: Option<&NodeLayer>) -> Vec<(String, RootHash)> {
    let mut layers: Vec<_> = opened
        .layers()
        .iter()
        .map(|p| (p.entry.name.clone(), p.verifier.root_hash().clone()))
        .collect();
    if let Some(n) = node {
        layers.push((crate::partitions::NODE_LAYER.into(), n.root_hash.clone()));
    }
    layers
}
