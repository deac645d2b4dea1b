//! Two or more target disks: each gets the whole layout, and `var` is an md RAID1 mirror across
//! them (`docs/boot-contract.md`). This module is the mirror's format; the `write` step
//! writes each member (`steps::write::write_member`).
//!
//! The writer makes the mirror itself, before any partition table exists, so the rescue system
//! needs no md driver: every `var` partition gets an md superblock (metadata 1.2 at 4 KiB, data
//! from 1 MiB, resync offset 0 so the kernel copies member 0 to the others on first assembly).
//! Disk 0 keeps the identity a single-disk run has; disk *i* > 0 gets its own, so its disk GUID,
//! ESP and `var` partition UUIDs differ while the layer partitions (from root hashes) are the same.

use sha2::{Digest, Sha256};
use uuid::Uuid;

/// Where each member's superblock sits in its `var` partition (metadata 1.2).
pub const SUPERBLOCK_OFFSET: u64 = 4096;
/// How much of each `var` partition is zeroed before the superblock is written: the superblock
/// area and the first MiB of the array's data, so the array starts without a file system.
pub const ZEROED: u64 = 2 << 20;
/// The array's name, as `mdadm --examine` shows it.
pub const ARRAY_NAME: &str = "ingot:var";

/// One disk's place in the mirror.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Mirror {
    /// This disk's slot, 0-based, in the order of the root devices.
    pub index: usize,
    /// Every member's `var` partition UUID, in slot order (the command line lists them all).
    pub members: Vec<Uuid>,
    /// The array UUID (the same on every member).
    pub array_uuid: [u8; 16],
    /// The array's creation time, seconds since the epoch: one value for every member of a
    /// run, since mdadm refuses to assemble members whose superblocks' ctime differ.
    pub created: u64,
}

/// The identity that seeds disk `index`'s GUIDs: disk 0 as a single-disk run, the others their
/// own.
pub fn disk_identity(manifest_digest: &str, index: usize) -> Vec<u8> {
    let mut h = Sha256::new().chain_update(manifest_digest.as_bytes());
    if index > 0 {
        h = h.chain_update(format!("/disk/{index}").as_bytes());
    }
    h.finalize().to_vec()
}

impl Mirror {
    /// The mirror for disk `index` of `disks`, made at `created` (once per run, for every
    /// disk); `var_guid` derives a disk's `var` partition UUID from its identity (the plan's rule).
    pub fn new(
        manifest_digest: &str,
        index: usize,
        disks: usize,
        created: u64,
        var_guid: impl Fn(&[u8]) -> Uuid,
    ) -> Mirror {
        let members = (0..disks)
            .map(|i| var_guid(&disk_identity(manifest_digest, i)))
            .collect();
        let digest = Sha256::new()
            .chain_update(b"ingot var mirror\0")
            .chain_update(manifest_digest.as_bytes())
            .finalize();
        Mirror {
            index,
            members,
            array_uuid: digest[..16].try_into().expect("16 bytes"),
            created,
        }
    }

    /// This member's superblock for a `var` partition of `var_bytes`, to be written at
    /// [`SUPERBLOCK_OFFSET`]; `None` when the partition is too small to hold an array.
    pub fn superblock(&self, var_bytes: u64) -> Option<Vec<u8>> {
        if var_bytes <= ZEROED {
            return None;
        }
        let mut device_uuid = [0u8; 16];
        let d = Sha256::new()
            .chain_update(self.array_uuid)
            .chain_update((self.index as u64).to_le_bytes())
            .finalize();
        device_uuid.copy_from_slice(&d[..16]);
        let (at, sb) = ingot_machine::guard::write_md_v1(
            &ingot_machine::guard::MdV1Params {
                metadata: "1.2".into(),
                array_uuid: self.array_uuid,
                device_uuid,
                name: ARRAY_NAME.into(),
                level: 1,
                raid_disks: self.members.len() as u32,
                dev_number: self.index as u32,
                time: self.created,
                // Member 0 is copied to the others on first assembly, as after mdadm --create.
                clean: false,
            },
            var_bytes,
        )?;
        debug_assert_eq!(at, SUPERBLOCK_OFFSET);
        // Padded to a 4 KiB block for the direct write and its read-back.
        let mut block = vec![0u8; 4096];
        block[..sb.len()].copy_from_slice(&sb);
        Some(block)
    }

    /// `PARTUUID=A,PARTUUID=B,...` for `ingot.var=`.
    pub fn cmdline_value(&self) -> String {
        self.members
            .iter()
            .map(|u| format!("PARTUUID={u}"))
            .collect::<Vec<_>>()
            .join(",")
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn guid(identity: &[u8]) -> Uuid {
        Uuid::from_bytes(identity[..16].try_into().unwrap())
    }

    #[test]
    fn disk_zero_keeps_the_single_disk_identity() {
        let single = Sha256::digest(b"sha256:abc").to_vec();
        assert_eq!(disk_identity("sha256:abc", 0), single);
        assert_ne!(disk_identity("sha256:abc", 1), single);
        let m = Mirror::new("sha256:abc", 1, 2, 1_700_000_000, guid);
        assert_eq!(m.members[0], guid(&single));
        assert_ne!(m.members[0], m.members[1]);
        assert_eq!(
            m.cmdline_value(),
            format!("PARTUUID={},PARTUUID={}", m.members[0], m.members[1])
        );
        assert_eq!(
            m.array_uuid,
            Mirror::new("sha256:abc", 0, 2, 1_700_000_000, guid).array_uuid
        );
    }

    #[test]
    fn superblock_fits_a_block_and_needs_room() {
        let m = Mirror::new("sha256:abc", 0, 2, 1_700_000_000, guid);
        let sb = m.superblock(64 << 20).unwrap();
        assert_eq!(sb.len(), 4096);
        assert_eq!(&sb[..4], &0xa92b_4efcu32.to_le_bytes());
        assert!(m.superblock(1 << 20).is_none());
    }

    /// mdadm assembles only members whose superblocks agree on the creation time.
    #[test]
    fn every_member_has_the_runs_creation_time() {
        let ctime = |index| {
            let sb = Mirror::new("sha256:abc", index, 2, 1_700_000_123, guid)
                .superblock(64 << 20)
                .unwrap();
            u64::from_le_bytes(sb[64..72].try_into().unwrap())
        };
        assert_eq!(ctime(0), 1_700_000_123);
        assert_eq!(ctime(1), 1_700_000_123);
    }
}
