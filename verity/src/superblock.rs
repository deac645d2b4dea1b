//! The 512-byte verity superblock veritysetup writes at the hash offset (`struct verity_sb` in
//! cryptsetup's `lib/verity/verity.c`). The kernel never reads it; veritysetup and ingot do.

use crate::error::SuperblockError;
use crate::hash::HashAlgorithm;
use crate::hash::HashType;
use crate::params::{VerityParams, SUPERBLOCK_SIZE};

const SIGNATURE: [u8; 8] = *b"verity\0\0";
const VERSION: u32 = 1;

/// The superblock's fields. All padding is zero on write and ignored on read, like veritysetup.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Superblock {
    pub hash_type: HashType,
    /// Raw RFC 4122 bytes in string order (not GPT's mixed-endian form).
    pub uuid: [u8; 16],
    pub algorithm: HashAlgorithm,
    pub data_block_size: u32,
    pub hash_block_size: u32,
    pub data_blocks: u64,
    pub salt: Vec<u8>,
}

impl Superblock {
    /// The superblock veritysetup would write for `params`.
    pub fn from_params(params: &VerityParams) -> Superblock {
        Superblock {
            hash_type: params.hash_type,
            uuid: params.uuid.unwrap_or([0; 16]),
            algorithm: params.algorithm,
            data_block_size: params.data_block_size,
            hash_block_size: params.hash_block_size,
            data_blocks: params.data_blocks,
            salt: params.salt.clone(),
        }
    }

    /// Parameters for a tree described by this superblock at `hash_offset`.
    pub fn to_params(&self, hash_offset: u64) -> VerityParams {
        VerityParams {
            hash_type: self.hash_type,
            algorithm: self.algorithm,
            data_block_size: self.data_block_size,
            hash_block_size: self.hash_block_size,
            data_blocks: self.data_blocks,
            salt: self.salt.clone(),
            uuid: Some(self.uuid),
            hash_offset,
            superblock: true,
        }
    }

    /// Serializes little-endian, zero-padded.
    pub fn to_bytes(&self) -> [u8; SUPERBLOCK_SIZE] {
        let mut b = [0u8; SUPERBLOCK_SIZE];
        b[0..8].copy_from_slice(&SIGNATURE);
        b[8..12].copy_from_slice(&VERSION.to_le_bytes());
        b[12..16].copy_from_slice(&self.hash_type.as_u32().to_le_bytes());
        b[16..32].copy_from_slice(&self.uuid);
        let name = self.algorithm.name().as_bytes();
        b[32..32 + name.len()].copy_from_slice(name);
        b[64..68].copy_from_slice(&self.data_block_size.to_le_bytes());
        b[68..72].copy_from_slice(&self.hash_block_size.to_le_bytes());
        b[72..80].copy_from_slice(&self.data_blocks.to_le_bytes());
        // Salts longer than 256 bytes are refused by validation before anything is written.
        let salt_len = self.salt.len().min(256);
        b[80..82].copy_from_slice(&(salt_len as u16).to_le_bytes());
        b[88..88 + salt_len].copy_from_slice(&self.salt[..salt_len]);
        b
    }

    /// Parses and checks a superblock the way veritysetup's `VERITY_read_sb` does: signature,
    /// version 1, hash type at most 1, both block sizes, a known algorithm, salt at most 256
    /// bytes. The data block count must be non-zero and the whole parameter set valid.
    pub fn parse(bytes: &[u8]) -> Result<Superblock, SuperblockError> {
        if bytes.len() < SUPERBLOCK_SIZE {
            return Err(SuperblockError::Truncated(bytes.len()));
        }
        let u32_at = |o: usize| u32::from_le_bytes(bytes[o..o + 4].try_into().expect("4 bytes"));
        let signature: [u8; 8] = bytes[0..8].try_into().expect("8 bytes");
        if signature != SIGNATURE {
            return Err(SuperblockError::Signature(signature));
        }
        let version = u32_at(8);
        if version != VERSION {
            return Err(SuperblockError::Version(version));
        }
        let hash_type = HashType::from_u32(u32_at(12))?;
        let uuid: [u8; 16] = bytes[16..32].try_into().expect("16 bytes");
        let name_field = &bytes[32..64];
        // veritysetup copies at most 31 characters and a NUL.
        let nul = name_field
            .iter()
            .position(|b| *b == 0)
            .ok_or(SuperblockError::AlgorithmName)?;
        let name =
            std::str::from_utf8(&name_field[..nul]).map_err(|_| SuperblockError::AlgorithmName)?;
        let algorithm = HashAlgorithm::from_name(name)?;
        let data_block_size = u32_at(64);
        let hash_block_size = u32_at(68);
        let data_blocks = u64::from_le_bytes(bytes[72..80].try_into().expect("8 bytes"));
        let salt_size = u16::from_le_bytes(bytes[80..82].try_into().expect("2 bytes")) as usize;
        if salt_size > crate::params::MAX_SALT_SIZE {
            return Err(crate::error::ParamError::SaltTooLong(salt_size).into());
        }
        let sb = Superblock {
            hash_type,
            uuid,
            algorithm,
            data_block_size,
            hash_block_size,
            data_blocks,
            salt: bytes[88..88 + salt_size].to_vec(),
        };
        sb.to_params(0).validate()?;
        Ok(sb)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::error::ParamError;

    fn sample() -> Superblock {
        Superblock {
            hash_type: HashType::Normal,
            uuid: *b"\x12\x34\x56\x78\x12\x34\x12\x34\x12\x34\x12\x34\x56\x78\x9a\xbc",
            algorithm: HashAlgorithm::Sha256,
            data_block_size: 4096,
            hash_block_size: 4096,
            data_blocks: 129,
            salt: (0u8..32).collect(),
        }
    }

    #[test]
    fn layout_matches_cryptsetup() {
        let b = sample().to_bytes();
        assert_eq!(&b[0..8], b"verity\0\0");
        assert_eq!(&b[8..16], &[1, 0, 0, 0, 1, 0, 0, 0]);
        assert_eq!(&b[32..39], b"sha256\0");
        assert_eq!(&b[64..72], &[0, 16, 0, 0, 0, 16, 0, 0]);
        assert_eq!(&b[72..80], &129u64.to_le_bytes());
        assert_eq!(&b[80..82], &[32, 0]);
        assert_eq!(b[88], 0);
        assert_eq!(b[88 + 31], 31);
        assert!(b[82..88].iter().chain(&b[120..]).all(|x| *x == 0));
        assert_eq!(Superblock::parse(&b).unwrap(), sample());
    }

    #[test]
    fn rejects_what_veritysetup_rejects() {
        let good = sample().to_bytes();
        let mut b = good;
        b[0] = b'V';
        assert!(matches!(
            Superblock::parse(&b),
            Err(SuperblockError::Signature(_))
        ));
        let mut b = good;
        b[8] = 2;
        assert_eq!(Superblock::parse(&b), Err(SuperblockError::Version(2)));
        let mut b = good;
        b[12] = 2;
        assert_eq!(Superblock::parse(&b), Err(ParamError::HashType(2).into()));
        let mut b = good;
        b[32..64].copy_from_slice(&[b'x'; 32]);
        assert_eq!(Superblock::parse(&b), Err(SuperblockError::AlgorithmName));
        let mut b = good;
        b[32..39].copy_from_slice(b"md5\0\0\0\0");
        assert!(matches!(
            Superblock::parse(&b),
            Err(SuperblockError::Param(ParamError::UnknownAlgorithm(_)))
        ));
        let mut b = good;
        b[64..68].copy_from_slice(&3000u32.to_le_bytes());
        assert!(matches!(
            Superblock::parse(&b),
            Err(SuperblockError::Param(ParamError::BlockSize { .. }))
        ));
        let mut b = good;
        b[80..82].copy_from_slice(&257u16.to_le_bytes());
        assert_eq!(
            Superblock::parse(&b),
            Err(ParamError::SaltTooLong(257).into())
        );
        let mut b = good;
        b[72..80].copy_from_slice(&0u64.to_le_bytes());
        assert_eq!(Superblock::parse(&b), Err(ParamError::NoDataBlocks.into()));
        assert_eq!(
            Superblock::parse(&good[..100]),
            Err(SuperblockError::Truncated(100))
        );
    }
}
