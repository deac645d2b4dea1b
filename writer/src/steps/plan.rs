//! `plan`: opens the target and lays the stack out on it ([`crate::layout`]).
//!
//! Reads the target's size and sector size, the ESP size and the layers (the verified stack's,
//! and the sealed node layer on top); returns the opened [`Target`] and its [`DiskPlan`].
//! Nothing is written.

use std::path::Path;

use crate::engine::Stopped;
use crate::layout::{plan, DiskPlan, LayoutError};
use crate::node::NodeLayer;
use crate::report::{Reporter, Stage};
use crate::request::WriteSettings;
use crate::stack::OpenedStack;
use crate::target::{Target, TargetError};

/// Why the plan could not be made.
#[derive(Debug, thiserror::Error)]
pub enum PlanError {
    #[error(transparent)]
    Target(#[from] TargetError),
    #[error(transparent)]
    Layout(#[from] LayoutError),
    #[error(transparent)]
    Stopped(#[from] Stopped),
}

/// The `plan` step: opens `target` and lays out the opened stack (and the node layer) on it.
pub fn run(
    target: &Path,
    opened: &OpenedStack,
    node: Option<&NodeLayer>,
    settings: &WriteSettings,
    reporter: &Reporter,
) -> Result<(Target, DiskPlan), PlanError> {
    reporter.stage(Stage::Plan, format!("planning {}", target.display()));
    let target = Target::open(target)?;
    let plan = lay_out(&target, opened, node, settings)?;
    Ok((target, plan))
}

/// The `plan` step of a dry run: `target` opened read-only, with every check a write makes
/// (not mounted or held, not locked by another writer, not read-only), and laid out.
pub fn dry_run(
    target: &Path,
    opened: &OpenedStack,
    node: Option<&NodeLayer>,
    settings: &WriteSettings,
    reporter: &Reporter,
) -> Result<DiskPlan, PlanError> {
    reporter.stage(
        Stage::Plan,
        format!(
            "planning {} (dry run: nothing is written)",
            target.display()
        ),
    );
    let target = Target::probe(target)?;
    lay_out(&target, opened, node, settings)
}

fn lay_out(
    target: &Target,
    opened: &OpenedStack,
    node: Option<&NodeLayer>,
    settings: &WriteSettings,
) -> Result<DiskPlan, PlanError> {
    // Disk 0 (and a single disk) as always; further disks of a mirror their own GUIDs.
    let index = settings.mirror.as_ref().map_or(0, |m| m.index);
    let identity = crate::mirror::disk_identity(opened.manifest_digest(), index);
    let plan = plan(
        target.size(),
        target.sector_size(),
        settings.esp_size,
        &opened.plan_layers(node),
        &identity,
        opened.descriptor().boot.bios.is_some(),
    )?;
    settings.options.check_stop("plan")?;
    Ok(plan)
}
