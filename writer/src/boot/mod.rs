//! Boot chains: which loader a disk boots with, and the files that make it so. The `plan` step
//! chooses a disk's chain once ([`BootChain::choose`]) and carries it in its plan; the `esp`
//! step runs it ([`BootChain::write`]); the summary and `output.json` name it
//! ([`BootChain::describe`]).
//!
//! The contract is one enum with one method set, not a trait: the chains are a closed set
//! known when the writer is built, and the choice is plain data that the plan carries and the
//! summary names (copied, compared, no box). Each method is one exhaustive `match` that only
//! dispatches, so a new variant makes the compiler list every answer it owes; the work of a
//! chain is in its own module:
//!
//! - [`loader_entry`]: the base layer's systemd-boot, kernel and initrd and a loader entry (UEFI).
//! - [`uki`]: the release's signed UKI and this machine's credentials beside it (Secure Boot).
//! - [`bios`]: GRUB's boot code and core image for BIOS firmware, beside the loader entry.
//!
//! What the chains share: [`cmdline`] (the kernel command line, built there only; `plan`
//! checks it with the same function), [`esp`] (a chain's files written as the ESP) and
//! [`fat`] (the FAT32 image, a leaf). The partitions a chain writes into are the boot
//! contract's ([`crate::partitions`]), laid out by [`crate::layout`].

pub mod bios;
pub mod cmdline;
pub mod esp;
pub mod fat;
pub mod loader_entry;
pub mod uki;

use ingot_artifact::layerfs::LayerFsError;
use ingot_layers::boot::BootLimitError;

use crate::engine::{EngineError, Stopped, WriteOptions, WriteStats};
use crate::layout::DiskPlan;
use crate::node::NodeLayer;
use crate::report::Reporter;
use crate::stack::OpenedStack;
use crate::target::{Target, TargetError};

/// Which boot chain a disk gets.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum BootChain {
    /// The release's signed UKI as `EFI/BOOT/BOOTX64.EFI` (its command line signed), the node's
    /// values in systemd-stub credentials beside it: Secure Boot checks everything it runs.
    SignedUki,
    /// The base's boot loader (systemd-boot), kernel and initrd, and a loader entry.
    LoaderEntry,
    /// As [`BootChain::LoaderEntry`], and GRUB in the BIOS boot partition for BIOS firmware.
    LoaderEntryAndBios,
}

impl BootChain {
    /// The chain for this stack on this machine: its signed UKI when `verify` kept one (the
    /// machine boots with UEFI), else the loader entry, with GRUB beside it when the stack
    /// carries a BIOS loader (the layout then has a BIOS boot partition).
    pub fn choose(opened: &OpenedStack) -> BootChain {
        if opened.uki().is_some() {
            BootChain::SignedUki
        } else if opened.descriptor().boot.bios.is_some() {
            BootChain::LoaderEntryAndBios
        } else {
            BootChain::LoaderEntry
        }
    }

    /// How the summary and `output.json` name it.
    pub fn describe(self) -> &'static str {
        match self {
            BootChain::SignedUki => "signed UKI (Secure Boot)",
            BootChain::LoaderEntry => "boot loader entry (UEFI)",
            BootChain::LoaderEntryAndBios => "boot loader entry (UEFI) and GRUB (BIOS)",
        }
    }

    /// Writes this chain's boot files onto `disk`: the ESP, and whatever else the chain owns.
    pub fn write(self, disk: &BootDisk) -> Result<Written, EspError> {
        match self {
            BootChain::SignedUki => uki::write(disk),
            BootChain::LoaderEntry => loader_entry::write(disk),
            BootChain::LoaderEntryAndBios => bios::write(disk),
        }
    }
}

/// What a chain writes from and onto: one planned disk, the stack on it and this machine's
/// values.
pub struct BootDisk<'a> {
    pub target: &'a Target,
    pub opened: &'a OpenedStack,
    pub node: Option<&'a NodeLayer>,
    pub plan: &'a DiskPlan,
    /// `var`'s members: this disk's `var` partition, or every member of its mirror.
    pub var: Vec<uuid::Uuid>,
    /// The writer's extra kernel arguments (`--kernel-arg`), after the stack's own.
    pub kernel_args: &'a [String],
    pub options: WriteOptions,
    pub reporter: &'a Reporter,
}

/// What a chain wrote.
pub struct Written {
    /// The kernel command line the disk boots with.
    pub cmdline: String,
    pub stats: WriteStats,
    /// Boot code for the protective MBR (GRUB's), which the `partition-table` step writes.
    pub mbr_code: Option<Vec<u8>>,
}

/// Why a chain's boot files could not be written.
#[derive(Debug, thiserror::Error)]
pub enum EspError {
    #[error(transparent)]
    Fat(#[from] fat::FatError),
    #[error("the stack's BIOS loader")]
    Bios(#[from] bios::BiosError),
    #[error("reading the boot files from the base layer")]
    BootFiles(#[from] LayerFsError),
    #[error(transparent)]
    Target(#[from] TargetError),
    #[error(transparent)]
    Engine(#[from] EngineError),
    #[error(transparent)]
    Stopped(#[from] Stopped),
    #[error("the kernel command line")]
    Cmdline(#[from] BootLimitError),
}
