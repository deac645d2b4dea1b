//! The disk layout for one machine: which partitions, where, with which GUIDs. Pure data and
//! arithmetic; the `plan` step opens the target and calls [`plan`].
//!
//! GPT, 1 MiB aligned, named and typed as the boot contract ([`crate::partitions`]) says: the ESP,
//! then a data and a verity partition for each selected layer in stacking order, then a writable
//! `var` partition filling the rest (and GRUB's BIOS boot partition last, for a BIOS loader).

use ingot_verity::RootHash;
use sha2::{Digest, Sha256};
use uuid::Uuid;

use crate::partitions::{
    data_label, hash_label, partition_uuids, types, ATTR_READ_ONLY, BIOS_BOOT_LABEL,
    BIOS_BOOT_SIZE, ESP_LABEL, VAR_LABEL,
};

pub const MIB: u64 = 1 << 20;
/// The smallest ESP we make: FAT32 needs 65,525 clusters; 64 MiB of 512-byte clusters has twice that.
pub const MIN_ESP_SIZE: u64 = 64 * MIB;
/// The smallest `var` partition worth booting with.
pub const MIN_VAR_SIZE: u64 = 64 * MIB;
/// GPT's backup header and entry array at the end, rounded to the alignment.
const TAIL: u64 = MIB;

/// What a partition holds.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Content {
    Esp,
    /// Layer `index` of the selection: its ext4 image.
    LayerData {
        index: usize,
    },
    /// Layer `index` of the selection: its verity hash device (superblock + tree).
    LayerHash {
        index: usize,
    },
    Var,
    /// GRUB's core image for legacy BIOS boot (the last 1 MiB before the backup GPT).
    BiosBoot,
}

#[derive(Debug, Clone, PartialEq, Eq)]
pub struct PlannedPartition {
    pub content: Content,
    pub label: String,
    pub type_guid: Uuid,
    pub part_guid: Uuid,
    /// Byte offset on the disk (1 MiB aligned).
    pub offset: u64,
    /// Byte size (a multiple of 1 MiB).
    pub size: u64,
    pub attributes: u64,
}

/// Where a layer sits in the stack; it decides the partition types.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum LayerKind {
    /// The root: Discoverable Partitions root / root-verity types.
    Base,
    /// A read-only layer of the stack over the base.
    Extra,
    /// The sealed per-node layer, topmost.
    Node,
}

/// One layer as the plan sees it.
#[derive(Debug, Clone)]
pub struct PlanLayer {
    pub name: String,
    pub kind: LayerKind,
    /// The root hash the layer's tree was checked against (the UUIDs derive from it).
    pub root_hash: RootHash,
    /// Uncompressed image size in bytes.
    pub data_size: u64,
    /// Hash device size in bytes.
    pub hash_size: u64,
}

#[derive(Debug, Clone, PartialEq, Eq)]
pub struct DiskPlan {
    pub disk_size: u64,
    pub sector_size: u32,
    pub disk_guid: Uuid,
    pub partitions: Vec<PlannedPartition>,
}

#[derive(Debug, thiserror::Error)]
pub enum LayoutError {
    #[error(
        "the target is too small: {have} bytes, the plan needs at least {need} \
         (ESP {esp}, layers {layers}, var at least {var}, partition tables {tables})"
    )]
    TooSmall {
        have: u64,
        need: u64,
        esp: u64,
        layers: u64,
        var: u64,
        tables: u64,
    },
    #[error(
        "layer `{0}`: root hash is {1} bytes, at least 16 are needed to derive partition UUIDs"
    )]
    ShortRootHash(String, usize),
    #[error("the ESP size {0} is below the minimum of {MIN_ESP_SIZE} bytes")]
    EspTooSmall(u64),
}

pub fn align_up(v: u64) -> u64 {
    v.div_ceil(MIB) * MIB
}

fn guid(text: &str) -> Uuid {
    Uuid::parse_str(text).expect("constant GUID")
}

fn layer_bytes(layers: &[PlanLayer]) -> u64 {
    layers
        .iter()
        .map(|l| align_up(l.data_size) + align_up(l.hash_size))
        .sum()
}

/// The smallest disk [`plan`] accepts for these layers and ESP size (and a BIOS boot partition).
pub fn min_disk_size(esp_size: u64, layers: &[PlanLayer], bios: bool) -> u64 {
    let bios = if bios { BIOS_BOOT_SIZE } else { 0 };
    MIB + align_up(esp_size) + layer_bytes(layers) + MIN_VAR_SIZE + bios + TAIL
}

/// Lays out `layers` (in stacking order, base first) on a disk of `disk_size` bytes.
/// `identity` seeds the disk GUID (e.g. the manifest digest), so the same stack on the same
/// disk gives the same table. With `bios` (the stack carries a BIOS loader) and 512-byte
/// sectors (GRUB's i386-pc boot code reads 512-byte LBAs), a BIOS boot partition comes last,
/// so every other partition keeps its number and place.
pub fn plan(
    disk_size: u64,
    sector_size: u32,
    esp_size: u64,
    layers: &[PlanLayer],
    identity: &[u8],
    bios: bool,
) -> Result<DiskPlan, LayoutError> {
    if esp_size < MIN_ESP_SIZE {
        return Err(LayoutError::EspTooSmall(esp_size));
    }
    let esp_size = align_up(esp_size);
    let layer_bytes = layer_bytes(layers);
    let bios = bios && sector_size == 512;
    let need = min_disk_size(esp_size, layers, bios);
    if disk_size < need {
        return Err(LayoutError::TooSmall {
            have: disk_size,
            need,
            esp: esp_size,
            layers: layer_bytes,
            var: MIN_VAR_SIZE,
            tables: MIB + TAIL,
        });
    }
    let mut parts = Vec::new();
    let mut at = MIB;
    let esp_guid = derived_guid(identity, b"esp");
    parts.push(PlannedPartition {
        content: Content::Esp,
        label: ESP_LABEL.into(),
        type_guid: guid(types::ESP),
        part_guid: esp_guid,
        offset: at,
        size: esp_size,
        attributes: 0,
    });
    at += esp_size;
    for (index, l) in layers.iter().enumerate() {
        let (data_guid, hash_guid) = partition_uuids(&l.root_hash)
            .ok_or_else(|| LayoutError::ShortRootHash(l.name.clone(), l.root_hash.len()))?;
        let (data_type, hash_type) = match l.kind {
            LayerKind::Base => (types::ROOT_X86_64, types::ROOT_VERITY_X86_64),
            LayerKind::Extra => (types::INGOT_LAYER, types::INGOT_LAYER_VERITY),
            LayerKind::Node => (types::INGOT_NODE, types::INGOT_NODE_VERITY),
        };
        let data_size = align_up(l.data_size);
        parts.push(PlannedPartition {
            content: Content::LayerData { index },
            label: data_label(&l.name),
            type_guid: guid(data_type),
            part_guid: data_guid,
            offset: at,
            size: data_size,
            attributes: ATTR_READ_ONLY,
        });
        at += data_size;
        let hash_size = align_up(l.hash_size);
        parts.push(PlannedPartition {
            content: Content::LayerHash { index },
            label: hash_label(&l.name),
            type_guid: guid(hash_type),
            part_guid: hash_guid,
            offset: at,
            size: hash_size,
            attributes: ATTR_READ_ONLY,
        });
        at += hash_size;
    }
    let end = (disk_size - TAIL) / MIB * MIB;
    let var_end = if bios { end - BIOS_BOOT_SIZE } else { end };
    parts.push(PlannedPartition {
        content: Content::Var,
        label: VAR_LABEL.into(),
        type_guid: guid(types::VAR),
        part_guid: derived_guid(identity, b"var"),
        offset: at,
        size: var_end - at,
        attributes: 0,
    });
    if bios {
        parts.push(PlannedPartition {
            content: Content::BiosBoot,
            label: BIOS_BOOT_LABEL.into(),
            type_guid: guid(types::BIOS_BOOT),
            part_guid: derived_guid(identity, b"bios-boot"),
            offset: var_end,
            size: BIOS_BOOT_SIZE,
            attributes: 0,
        });
    }
    Ok(DiskPlan {
        disk_size,
        sector_size,
        disk_guid: derived_guid(identity, b"disk"),
        partitions: parts,
    })
}

/// A v4-shaped UUID derived from `identity` and a purpose, so plans are reproducible.
pub fn derived_guid(identity: &[u8], purpose: &[u8]) -> Uuid {
    let digest = Sha256::new()
        .chain_update(b"ingot-writer partition guid\0")
        .chain_update(purpose)
        .chain_update(identity)
        .finalize();
    let bytes: [u8; 16] = digest[..16].try_into().expect("16 bytes");
    uuid::Builder::from_random_bytes(bytes).into_uuid()
}

impl DiskPlan {
    pub fn find(&self, content: &Content) -> Option<&PlannedPartition> {
        self.partitions.iter().find(|p| &p.content == content)
    }

    /// The partition planned for `content`; every caller asks for one the plan always has.
    pub fn part(&self, content: &Content) -> &PlannedPartition {
        self.find(content).expect("planned")
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn layer(name: &str, base: bool, data: u64) -> PlanLayer {
        PlanLayer {
            name: name.into(),
            kind: if base {
                LayerKind::Base
            } else {
                LayerKind::Extra
            },
            root_hash: RootHash::from_bytes((0u8..32).collect::<Vec<u8>>()),
            data_size: data,
            hash_size: data / 100 + 4096,
        }
    }

    #[test]
    fn lays_out_aligned_partitions_in_order() {
        let layers = [
            layer("base", true, 300 * MIB + 5),
            layer("nvidia", false, 10 * MIB),
        ];
        let p = plan(2048 * MIB, 512, 256 * MIB, &layers, b"stack", false).unwrap();
        let kinds: Vec<_> = p.partitions.iter().map(|p| p.content.clone()).collect();
        assert_eq!(
            kinds,
            vec![
                Content::Esp,
                Content::LayerData { index: 0 },
                Content::LayerHash { index: 0 },
                Content::LayerData { index: 1 },
                Content::LayerHash { index: 1 },
                Content::Var
            ]
        );
        let mut end = MIB;
        for part in &p.partitions {
            assert_eq!(part.offset % MIB, 0);
            assert_eq!(part.size % MIB, 0);
            assert_eq!(part.offset, end, "no gaps");
            end = part.offset + part.size;
        }
        assert!(end <= 2047 * MIB);
        let base = &p.partitions[1];
        assert_eq!(
            base.part_guid.to_string(),
            "00010203-0405-0607-0809-0a0b0c0d0e0f"
        );
        assert_eq!(
            p.partitions[2].part_guid.to_string(),
            "10111213-1415-1617-1819-1a1b1c1d1e1f"
        );
        assert_eq!(base.type_guid.to_string(), types::ROOT_X86_64);
        assert_eq!(p.partitions[3].type_guid.to_string(), types::INGOT_LAYER);
        assert_eq!(
            p,
            plan(2048 * MIB, 512, 256 * MIB, &layers, b"stack", false).unwrap(),
            "reproducible"
        );
    }

    #[test]
    fn refuses_a_small_disk() {
        let layers = [layer("base", true, 900 * MIB)];
        let err = plan(1024 * MIB, 512, 256 * MIB, &layers, b"x", false).unwrap_err();
        assert!(matches!(err, LayoutError::TooSmall { .. }), "{err}");
        assert!(plan(1024 * MIB, 512, 32 * MIB, &[], b"x", false).is_err());
    }

    #[test]
    fn a_bios_loader_gets_the_last_mib_before_the_backup_table() {
        let layers = [layer("base", true, 300 * MIB)];
        let uefi = plan(2048 * MIB, 512, 256 * MIB, &layers, b"s", false).unwrap();
        let both = plan(2048 * MIB, 512, 256 * MIB, &layers, b"s", true).unwrap();
        let n = uefi.partitions.len();
        assert_eq!(both.partitions.len(), n + 1);
        assert_eq!(
            both.partitions[..n - 1],
            uefi.partitions[..n - 1],
            "same places"
        );
        let (var, bios) = (&both.partitions[n - 1], &both.partitions[n]);
        assert_eq!(var.size + MIB, uefi.partitions[n - 1].size);
        assert_eq!((bios.content.clone(), bios.size), (Content::BiosBoot, MIB));
        assert_eq!(bios.offset, var.offset + var.size);
        assert_eq!(bios.type_guid.to_string(), types::BIOS_BOOT);
        // 4096-byte sectors: no BIOS boot partition (GRUB's boot code reads 512-byte LBAs).
        let big = plan(2048 * MIB, 4096, 256 * MIB, &layers, b"s", true).unwrap();
        assert!(big.find(&Content::BiosBoot).is_none());
    }
}
