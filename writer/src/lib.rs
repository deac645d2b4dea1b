//! `ingot-writer`'s library: a signed stack onto one disk.
//!
//! One straight line ([`pipeline`]), each step a module of [`steps`] named as its stage is
//! reported ([`report::Stage`]): check the machine, gate the disks, guard other systems, resolve
//! the source, verify the signature, the descriptor and every selected layer's hash tree, stage
//! and seal the per-node layer, plan the disk, wipe the partition-table areas, write each layer
//! (streamed from a registry source, [`stream`]) and check every block after it is read back,
//! write the ESP, write the partition table last and confirm it. Any failure after the wipe
//! clears the partition-table areas again, so a half-written disk never looks bootable.
//! [`boot`] holds the boot contract (partition names, kernel command line), [`bios`] the legacy
//! BIOS loader's on-disk format; [`cli`], [`run`], [`caph`], [`watchdog`], [`interrupt`] and
//! [`reboot`] are the binary's edges.

pub mod bios;
pub mod boot;
pub mod caph;
pub mod cli;
pub mod config;
pub mod error;
pub mod interrupt;
// The verifying ext4 reader is in ingot-artifact, which `ingot diff` shares.
pub use ingot_artifact::layerfs;
pub mod mirror;
pub mod pipeline;
pub mod reboot;
pub mod report;
pub mod request;
pub mod run;
pub mod steps;
pub mod stream;
pub mod target;
pub mod watchdog;

pub use error::{ProvisionError, WriteError};
pub use request::{Outcome, ProvisionRequest, Provisioned, WriteRequest, WriteSettings};
