//! `esp`: the disk's boot files, written by the boot chain the `plan` step chose for it
//! ([`crate::boot`]): the EFI system partition, and for the BIOS chain GRUB's core image in the
//! BIOS boot partition.
//!
//! Reads the base layer as written on the target (the chain reads its boot files from there,
//! every block checked against its tree), the verified stack, the node layer, the plan (with
//! its chain) and the extra kernel arguments; returns the kernel command line, what writing
//! took and the MBR boot code, if any ([`Written`]).

pub use crate::boot::{EspError, Written};

use crate::boot::BootDisk;
use crate::layout::Content;
use crate::node::NodeLayer;
use crate::report::Reporter;
use crate::request::WriteSettings;
use crate::stack::OpenedStack;
use crate::steps::plan::Plan;
use crate::target::Target;

/// The `esp` step; see the module docs.
pub fn run(
    target: &Target,
    opened: &OpenedStack,
    node: Option<&NodeLayer>,
    plan: &Plan,
    settings: &WriteSettings,
    reporter: &Reporter,
) -> Result<Written, EspError> {
    let var = match &settings.mirror {
        Some(m) => m.members.clone(),
        None => vec![plan.layout.part(&Content::Var).part_guid],
    };
    plan.chain.write(&BootDisk {
        target,
        opened,
        node,
        plan: &plan.layout,
        var,
        kernel_args: &settings.kernel_args,
        options: settings.options,
        reporter,
    })
}
