//! The sealed per-node layer, built on this machine by the `seal` step: an ext4 image and its
//! verity hash device, held in memory until `write` puts them on the disk.

use ingot_verity::RootHash;

/// The sealed per-node layer, built on this machine: an ext4 image and its verity hash device.
#[derive(Debug, Clone)]
pub struct NodeLayer {
    pub image: Vec<u8>,
    pub hash: Vec<u8>,
    pub root_hash: RootHash,
}
