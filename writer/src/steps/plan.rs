//! `plan`: opens the target, lays the stack out on it ([`crate::layout`]) and chooses its boot
//! chain ([`BootChain::choose`]), once: the later steps read the chain from the [`Plan`].
//!
//! Reads the target's size and sector size, the ESP size and the layers (the verified stack's,
//! and the sealed node layer on top); returns the opened [`Target`] and its [`Plan`].
//! Nothing is written.

use std::path::Path;

use ingot_artifact::layerfs::LayerFsError;
use uuid::Uuid;

use crate::boot::BootChain;
use crate::engine::Stopped;
use crate::layout::{align_up, plan, DiskPlan, LayoutError};
use crate::node::NodeLayer;
use crate::report::{Reporter, Stage};
use crate::request::WriteSettings;
use crate::stack::{OpenedStack, StackError};
use crate::target::{Target, TargetError};
use ingot_layers::boot::BootLimitError;

/// One disk's plan: its layout and the boot chain it gets.
#[derive(Debug, Clone)]
pub struct Plan {
    pub layout: DiskPlan,
    pub chain: BootChain,
}

/// Why the plan could not be made.
#[derive(Debug, thiserror::Error)]
pub enum PlanError {
    #[error(transparent)]
    Target(#[from] TargetError),
    #[error(transparent)]
    Layout(#[from] LayoutError),
    #[error(transparent)]
    Stopped(#[from] Stopped),
    /// The stack, on this machine, breaks a limit of the boot contract; no disk was changed.
    #[error("stack `{stack}` cannot boot as it would be written")]
    Boot {
        stack: String,
        #[source]
        source: BootLimitError,
    },
    /// A boot file the descriptor names is not in the base layer; no disk was changed.
    #[error("stack `{stack}`: boot.{what} {path:?} cannot be read from the base layer")]
    BootFile {
        stack: String,
        what: &'static str,
        path: String,
        #[source]
        source: Box<LayerFsError>,
    },
    #[error(transparent)]
    Stack(#[from] StackError),
}

/// The `plan` step: opens `target` and lays out the opened stack (and the node layer) on it.
pub fn run(
    target: &Path,
    opened: &OpenedStack,
    node: Option<&NodeLayer>,
    settings: &WriteSettings,
    reporter: &Reporter,
) -> Result<(Target, Plan), PlanError> {
    reporter.stage(Stage::Plan, format!("planning {}", target.display()));
    let target = Target::open(target)?;
    let plan = lay_out(&target, opened, node, settings);
    // Sources refused while the boot files were read: reported whether or not a next served.
    for w in opened.take_frame_warnings() {
        reporter.warning(Stage::Plan, w);
    }
    Ok((target, plan?))
}

/// The `plan` step of a dry run: `target` opened read-only, with every check a write makes
/// (not mounted or held, not locked by another writer, not read-only), and laid out.
pub fn dry_run(
    target: &Path,
    opened: &OpenedStack,
    node: Option<&NodeLayer>,
    settings: &WriteSettings,
    reporter: &Reporter,
) -> Result<Plan, PlanError> {
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

/// The boot contract's limits for this stack and node layer written to `disks` disks, checked
/// before any disk changes: the partition count against the GPT's entries, the kernel command
/// line (length, and the extra arguments) and the boot files: present in the base layer
/// (read from its blob, only the blocks of their inodes) and within the ESP.
pub fn check_boot(
    opened: &OpenedStack,
    node: Option<&NodeLayer>,
    settings: &WriteSettings,
    disks: usize,
) -> Result<(), PlanError> {
    let d = opened.descriptor();
    let refuse = |source| PlanError::Boot {
        stack: opened.describe(),
        source,
    };
    let layers = opened.plan_layers(node).len();
    ingot_layers::boot::check_partition_count(layers, d.boot.bios.is_some()).map_err(refuse)?;
    // The UUIDs are not known yet; every one has the same length.
    let var = vec![Uuid::nil(); disks.max(1)];
    crate::boot::cmdline::build(opened, node, var, &settings.kernel_args).map_err(refuse)?;
    let fs = opened.base_fs()?;
    let size = |what: &'static str, path: &str| {
        fs.file_size(path).map_err(|source| PlanError::BootFile {
            stack: opened.describe(),
            what,
            path: path.to_string(),
            source: Box::new(source),
        })
    };
    let (kernel, initrd, efi) = (
        size("kernel", &d.boot.kernel)?,
        size("initrd", &d.boot.initrd)?,
        size("efi", &d.boot.efi)?,
    );
    ingot_layers::boot::check_esp_room(kernel, initrd, efi, align_up(settings.esp_size))
        .map_err(refuse)?;
    Ok(())
}

fn lay_out(
    target: &Target,
    opened: &OpenedStack,
    node: Option<&NodeLayer>,
    settings: &WriteSettings,
) -> Result<Plan, PlanError> {
    let disks = settings.mirror.as_ref().map_or(1, |m| m.members.len());
    check_boot(opened, node, settings, disks)?;
    // Disk 0 (and a single disk) as always; further disks of a mirror their own GUIDs.
    let index = settings.mirror.as_ref().map_or(0, |m| m.index);
    let identity = crate::mirror::disk_identity(opened.manifest_digest(), index);
    let layout = plan(
        target.size(),
        target.sector_size(),
        settings.esp_size,
        &opened.plan_layers(node),
        &identity,
        opened.descriptor().boot.bios.is_some(),
    )?;
    settings.options.check_stop("plan")?;
    Ok(Plan {
        layout,
        chain: BootChain::choose(opened),
    })
}
