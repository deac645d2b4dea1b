//! `ingot-writer`'s library: a signed stack onto one disk.
//!
//! One straight line ([`pipeline`]), each step a module of [`steps`] named as its stage is
//! reported ([`report::Stage`]): check the machine, gate the disks, guard other systems, resolve
//! the source, verify the signature, the descriptor and every selected layer's hash tree, stage
//! and seal the per-node layer, tear down old md arrays on the targets, plan the disk, wipe the
//! partition-table areas, write each layer (streamed from a registry source, [`stream`]) and
//! check every block after it is read back ([`engine`]), write the ESP, write the partition table
//! last and confirm it. Any failure once a disk has changed clears the partition-table areas
//! again, so a half-written disk never looks bootable ([`pipeline::Failed`]).
//!
//! The modules form a line; each uses only those above it in this list:
//! - the leaves: [`report`] (stages, progress, the status file), [`target`] (O_DIRECT disk
//!   access), [`interrupt`], [`partitions`] (the boot contract's partition names and types),
//!   [`mirror`] (`var`'s md superblocks), [`seal`] (secrets sealed to the TPM under the
//!   release's signed PCR policy);
//! - [`engine`]: the verified-write engine, its errors, stats and options; [`stream`] feeds it
//!   from a registry;
//! - plain data: [`layout`] (the disk plan), [`node`] (the sealed node layer), [`stack`] (the
//!   opened, verified stack);
//! - [`boot`]: the boot chains (loader entry, signed UKI, GRUB on BIOS), the kernel command
//!   line and the ESP's FAT32 image;
//! - [`request`] (what a run is asked and answers), [`table`] (the partition table on disk);
//! - [`steps`], each with its own error type; [`reason`] (the failure reasons, their exit
//!   status and what to do about each); [`error`] wraps the steps' errors and maps each to its
//!   reason;
//! - [`pipeline`]; then the binary's edges: [`cli`], [`config`], [`run`], [`caph`],
//!   [`watchdog`], [`reboot`].

pub mod boot;
pub mod caph;
pub mod cli;
pub mod config;
pub mod engine;
pub mod error;
pub mod interrupt;
pub mod layout;
pub mod mirror;
pub mod node;
pub mod partitions;
pub mod pipeline;
pub mod reason;
pub mod reboot;
pub mod report;
pub mod request;
pub mod run;
pub mod seal;
pub mod secrets;
pub mod stack;
pub mod steps;
pub mod stream;
pub mod table;
pub mod target;
pub mod tpm;
pub mod watchdog;
