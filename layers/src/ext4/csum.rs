//! metadata_csum checksums (crc32c), as e2fsprogs' lib/ext2fs/csum.c and the kernel compute them.
//!
//! ext4 uses the raw CRC32C update (no pre- or post-inversion) seeded with a per-filesystem value:
//! `crc32c(~0, uuid)`. Per-inode structures (inode, extent blocks, directory blocks) chain the
//! inode number and generation onto that seed, so a block copied to another inode fails its check.

/// Raw CRC32C update of `crc` over `data`, matching the kernel's `crc32c(crc, p, len)`.
pub fn crc32c_raw(crc: u32, data: &[u8]) -> u32 {
    // The crate's append() inverts on the way in and out; undo both.
    !crc32c::crc32c_append(!crc, data)
}

/// The filesystem checksum seed: `crc32c(~0, uuid)`.
pub fn fs_seed(uuid: &[u8; 16]) -> u32 {
    crc32c_raw(!0, uuid)
}

/// The seed for structures owned by inode `ino` with generation `gen`.
pub fn inode_seed(fs_seed: u32, ino: u32, gen: u32) -> u32 {
    let c = crc32c_raw(fs_seed, &ino.to_le_bytes());
    crc32c_raw(c, &gen.to_le_bytes())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn raw_crc_matches_the_standard_check_value() {
        // Standard CRC32C("123456789") = 0xE3069283, i.e. raw update from ~0 then inverted.
        assert_eq!(!crc32c_raw(!0, b"123456789"), 0xE306_9283);
        // Chaining two updates equals one update over the concatenation.
        assert_eq!(
            crc32c_raw(crc32c_raw(7, b"abc"), b"def"),
            crc32c_raw(7, b"abcdef")
        );
    }
}
