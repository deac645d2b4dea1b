//! The boot contract's disk half: how the partitions a node boots from are named, typed and
//! sized. Which loader boots them is a boot chain (the `boot` module, above this one).
//!
//! GPT, 1 MiB aligned: the ESP, then a data and a verity partition for each selected layer in
//! stacking order, then a writable `var` partition. The partition UUIDs of a layer's pair are the
//! first and last 128 bits of its root hash (the Discoverable Partitions rule, so systemd's tools
//! and the initramfs find them from the kernel command line alone). The command line names the
//! stack, each layer with its root hash in stacking order, the node layer's root hash and the
//! `var` partition. The command line itself and its limits are `ingot_layers::boot` (`Cmdline`,
//! `BootLimitError`), where `ingot build` checks the same rules; the writer builds it in
//! `boot::cmdline`.

use ingot_verity::RootHash;
use uuid::Uuid;

/// Discoverable Partitions type GUIDs (x86-64) and ingot's own, stable across releases.
pub mod types {
    pub const ESP: &str = "c12a7328-f81f-11d2-ba4b-00a0c93ec93b";
    pub const ROOT_X86_64: &str = "4f68bce3-e8cd-4db1-96e7-fbcaf984b709";
    pub const ROOT_VERITY_X86_64: &str = "2c7357ed-ebd2-46d9-aec1-23d437ec2bf5";
    pub const VAR: &str = "4d21b016-b534-45c2-a9fb-5c16e091fd2d";
    /// A read-only ingot layer stacked over the root (not the base): data and its verity tree.
    pub const INGOT_LAYER: &str = "b8ea271f-ac26-4617-855b-c1f3aa710e7e";
    pub const INGOT_LAYER_VERITY: &str = "9b70b814-dfd5-4cc8-a412-556349155359";
    /// The sealed per-node layer and its verity tree.
    pub const INGOT_NODE: &str = "c001e177-74c2-4996-ada8-1815adcbb065";
    pub const INGOT_NODE_VERITY: &str = "8a9faee1-3fe6-4ab2-8dc2-b98d07c07ce3";
    /// GPT BIOS boot partition ("Hah!IdontNeedEFI"): GRUB's core image for legacy BIOS boot.
    pub const BIOS_BOOT: &str = "21686148-6449-6e6f-744e-656564454649";
}

/// GPT attribute bit 60: read-only (DPS recommends it for verity partitions and their data).
pub const ATTR_READ_ONLY: u64 = 1 << 60;

/// The ESP's partition name.
pub const ESP_LABEL: &str = "ESP";
/// The writable partition's name; it is left blank for first boot to format.
pub const VAR_LABEL: &str = "var";
/// The BIOS boot partition's size: GRUB's core images are 100-200 KiB.
pub const BIOS_BOOT_SIZE: u64 = 1 << 20;
/// The BIOS boot partition's name (last on the disk, when the stack has a BIOS loader).
pub const BIOS_BOOT_LABEL: &str = "bios-boot";
/// The node layer's name in the plan and on the command line.
pub const NODE_LAYER: &str = "node";

/// GPT names are 36 UTF-16 code units.
fn label(text: &str) -> String {
    text.chars().take(36).collect()
}

/// The partition name of a layer's data.
pub fn data_label(layer: &str) -> String {
    label(&format!("ingot-{layer}"))
}

/// The partition name of a layer's verity tree.
pub fn hash_label(layer: &str) -> String {
    label(&format!("ingot-{layer}-verity"))
}

/// The partition UUIDs of a layer's (data, verity) pair: the first and last 128 bits of its
/// root hash. `None` when the hash is shorter than 16 bytes.
pub fn partition_uuids(root_hash: &RootHash) -> Option<(Uuid, Uuid)> {
    let root_hash = root_hash.as_bytes();
    let first: [u8; 16] = root_hash.get(..16)?.try_into().ok()?;
    let last: [u8; 16] = root_hash.get(root_hash.len() - 16..)?.try_into().ok()?;
    Some((Uuid::from_bytes(first), Uuid::from_bytes(last)))
}
