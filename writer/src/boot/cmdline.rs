//! `boot::cmdline`: the kernel command line of a stack, its node layer and `var`, built here
//! only: the loader entry and GRUB boot with it, and the `plan` step checks it before any disk
//! changes. Its form and limits are the boot contract's (`ingot_layers::boot::Cmdline`, which
//! `ingot build` checks too). A signed UKI's command line is the release's, not built here.

use ingot_layers::boot::{BootLimitError, Cmdline};

use crate::node::NodeLayer;
use crate::stack::OpenedStack;

/// The kernel command line for this stack, node layer and `var` (every member of its mirror),
/// the stack's `[boot] kernel_args` then `kernel_args` (the writer's) appended, refused when it
/// breaks a boot contract limit (see [`Cmdline::checked`]).
pub fn build(
    opened: &OpenedStack,
    node: Option<&NodeLayer>,
    var: Vec<uuid::Uuid>,
    kernel_args: &[String],
) -> Result<String, BootLimitError> {
    let d = opened.descriptor();
    let extra: Vec<String> = d
        .boot
        .kernel_args
        .iter()
        .chain(kernel_args)
        .cloned()
        .collect();
    Cmdline {
        stack: (&d.name, &d.version),
        layers: opened
            .layers()
            .iter()
            .map(|p| (p.entry.name.as_str(), p.verifier.root_hash()))
            .collect(),
        node: node.map(|n| &n.root_hash),
        var,
        extra: &extra,
    }
    .checked()
}
