//! The disk layout for one machine: which partitions, where, with which GUIDs.
//!
//! GPT, 1 MiB aligned: the ESP, then a data and a verity partition for each selected layer in
//! stacking order, then a writable `var` partition filling the rest. Partition UUIDs of a
//! layer's pair are the first and last 128 bits of its root hash (the Discoverable Partitions
//! rule, so systemd's tools and our initramfs find them from the kernel command line alone).

use sha2::{Digest, Sha256};
use uuid::Uuid;

pub const MIB: u64 = 1 << 20;
/// The smallest ESP we make: FAT32 needs 65,525 clusters; 64 MiB of 512-byte clusters has twice that.
pub const MIN_ESP_SIZE: u64 = 64 * MIB;
/// The smallest `var` partition worth booting with.
pub const MIN_VAR_SIZE: u64 = 64 * MIB;
/// GPT's backup header and entry array at the end, rounded to the alignment.
const TAIL: u64 = MIB;

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
}

/// GPT attribute bit 60: read-only (DPS recommends it for verity partitions and their data).
pub const ATTR_READ_ONLY: u64 = 1 << 60;

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
    /// Root hash bytes (the UUIDs derive from it).
    pub root_hash: Vec<u8>,
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
pub enum PlanError {
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

fn align_up(v: u64) -> u64 {
    v.div_ceil(MIB) * MIB
}

fn guid(text: &str) -> Uuid {
    Uuid::parse_str(text).expect("constant GUID")
}

/// GPT names are 36 UTF-16 code units.
fn label(text: &str) -> String {
    text.chars().take(36).collect()
}

fn layer_bytes(layers: &[PlanLayer]) -> u64 {
    layers
        .iter()
        .map(|l| align_up(l.data_size) + align_up(l.hash_size))
        .sum()
}

/// The smallest disk [`plan`] accepts for these layers and ESP size.
pub fn min_disk_size(esp_size: u64, layers: &[PlanLayer]) -> u64 {
    MIB + align_up(esp_size) + layer_bytes(layers) + MIN_VAR_SIZE + TAIL
}

/// Lays out `layers` (in stacking order, base first) on a disk of `disk_size` bytes.
/// `identity` seeds the disk GUID (e.g. the manifest digest), so the same stack on the same
/// disk gives the same table.
pub fn plan(
    disk_size: u64,
    sector_size: u32,
    esp_size: u64,
    layers: &[PlanLayer],
    identity: &[u8],
) -> Result<DiskPlan, PlanError> {
    if esp_size < MIN_ESP_SIZE {
        return Err(PlanError::EspTooSmall(esp_size));
    }
    let esp_size = align_up(esp_size);
    let layer_bytes = layer_bytes(layers);
    let need = min_disk_size(esp_size, layers);
    if disk_size < need {
        return Err(PlanError::TooSmall {
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
        label: "ESP".into(),
        type_guid: guid(types::ESP),
        part_guid: esp_guid,
        offset: at,
        size: esp_size,
        attributes: 0,
    });
    at += esp_size;
    for (index, l) in layers.iter().enumerate() {
        if l.root_hash.len() < 16 {
            return Err(PlanError::ShortRootHash(l.name.clone(), l.root_hash.len()));
        }
        let first: [u8; 16] = l.root_hash[..16].try_into().expect("16 bytes");
        let last: [u8; 16] = l.root_hash[l.root_hash.len() - 16..]
            .try_into()
            .expect("16 bytes");
        let (data_type, hash_type) = match l.kind {
            LayerKind::Base => (types::ROOT_X86_64, types::ROOT_VERITY_X86_64),
            LayerKind::Extra => (types::INGOT_LAYER, types::INGOT_LAYER_VERITY),
            LayerKind::Node => (types::INGOT_NODE, types::INGOT_NODE_VERITY),
        };
        let data_size = align_up(l.data_size);
        parts.push(PlannedPartition {
            content: Content::LayerData { index },
            label: label(&format!("ingot-{}", l.name)),
            type_guid: guid(data_type),
            part_guid: Uuid::from_bytes(first),
            offset: at,
            size: data_size,
            attributes: ATTR_READ_ONLY,
        });
        at += data_size;
        let hash_size = align_up(l.hash_size);
        parts.push(PlannedPartition {
            content: Content::LayerHash { index },
            label: label(&format!("ingot-{}-verity", l.name)),
            type_guid: guid(hash_type),
            part_guid: Uuid::from_bytes(last),
            offset: at,
            size: hash_size,
            attributes: ATTR_READ_ONLY,
        });
        at += hash_size;
    }
    let var_end = (disk_size - TAIL) / MIB * MIB;
    parts.push(PlannedPartition {
        content: Content::Var,
        label: "var".into(),
        type_guid: guid(types::VAR),
        part_guid: derived_guid(identity, b"var"),
        offset: at,
        size: var_end - at,
        attributes: 0,
    });
    Ok(DiskPlan {
        disk_size,
        sector_size,
        disk_guid: derived_guid(identity, b"disk"),
        partitions: parts,
    })
}

/// A v4-shaped UUID derived from `identity` and a purpose, so plans are reproducible.
fn derived_guid(identity: &[u8], purpose: &[u8]) -> Uuid {
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
            root_hash: (0u8..32).collect(),
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
        let p = plan(2048 * MIB, 512, 256 * MIB, &layers, b"stack").unwrap();
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
            plan(2048 * MIB, 512, 256 * MIB, &layers, b"stack").unwrap(),
            "reproducible"
        );
    }

    #[test]
    fn refuses_a_small_disk() {
        let layers = [layer("base", true, 900 * MIB)];
        let err = plan(1024 * MIB, 512, 256 * MIB, &layers, b"x").unwrap_err();
        assert!(matches!(err, PlanError::TooSmall { .. }), "{err}");
        assert!(plan(1024 * MIB, 512, 32 * MIB, &[], b"x").is_err());
    }
}
