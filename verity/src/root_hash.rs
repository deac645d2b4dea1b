//! A tree's root hash, the one value that ties a signed descriptor to the bytes on a disk.
//!
//! It keeps this one type from the tree builder to the kernel command line; it becomes text only
//! at the edges (the descriptor, the command line, messages), always as veritysetup prints it:
//! lower-case hex.

use std::fmt;
use std::str::FromStr;

/// The largest digest of a supported algorithm (SHA-512).
pub const MAX_ROOT_HASH_SIZE: usize = 64;

/// A root hash: the digest of a tree's top block (as many bytes as the algorithm's digest).
#[derive(Clone, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct RootHash(Box<[u8]>);

/// Why a text is not a root hash; names the text.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("root hash {text:?}: {reason}")]
pub struct RootHashError {
    pub text: String,
    pub reason: &'static str,
}

impl RootHash {
    /// The digest bytes as the tree builder computed them.
    pub fn from_bytes(bytes: impl Into<Box<[u8]>>) -> RootHash {
        RootHash(bytes.into())
    }

    pub fn as_bytes(&self) -> &[u8] {
        &self.0
    }

    pub fn len(&self) -> usize {
        self.0.len()
    }

    pub fn is_empty(&self) -> bool {
        self.0.is_empty()
    }
}

impl AsRef<[u8]> for RootHash {
    fn as_ref(&self) -> &[u8] {
        &self.0
    }
}

impl fmt::Display for RootHash {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&hex::encode(&self.0))
    }
}

impl fmt::Debug for RootHash {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "RootHash({self})")
    }
}

impl FromStr for RootHash {
    type Err = RootHashError;

    /// Lower-case hex only (what veritysetup prints and ingot signs), one to 64 bytes.
    fn from_str(text: &str) -> Result<RootHash, RootHashError> {
        let bad = |reason| RootHashError {
            text: text.chars().take(2 * MAX_ROOT_HASH_SIZE + 8).collect(),
            reason,
        };
        if text.is_empty() {
            return Err(bad("empty"));
        }
        if !text
            .bytes()
            .all(|b| b.is_ascii_digit() || (b'a'..=b'f').contains(&b))
        {
            return Err(bad("not lower-case hex"));
        }
        if text.len() % 2 != 0 {
            return Err(bad("an odd number of hex digits"));
        }
        if text.len() > 2 * MAX_ROOT_HASH_SIZE {
            return Err(bad("longer than any supported digest (64 bytes)"));
        }
        let bytes = hex::decode(text).map_err(|_| bad("not hex"))?;
        Ok(RootHash(bytes.into()))
    }
}

impl serde::Serialize for RootHash {
    fn serialize<S: serde::Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        s.collect_str(self)
    }
}

impl<'de> serde::Deserialize<'de> for RootHash {
    fn deserialize<D: serde::Deserializer<'de>>(d: D) -> Result<RootHash, D::Error> {
        let text = <std::borrow::Cow<'de, str>>::deserialize(d)?;
        text.parse().map_err(serde::de::Error::custom)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn text_round_trip() {
        let h: RootHash = "00ff10".parse().unwrap();
        assert_eq!(h.as_bytes(), &[0, 0xff, 0x10]);
        assert_eq!(h.to_string(), "00ff10");
        assert_eq!(serde_json::to_string(&h).unwrap(), "\"00ff10\"");
        let back: RootHash = serde_json::from_str("\"00ff10\"").unwrap();
        assert_eq!(back, h);
    }

    #[test]
    fn bad_text_is_named() {
        for (text, why) in [
            ("", "empty"),
            ("00FF", "not lower-case hex"),
            ("abc", "an odd number of hex digits"),
            ("0g", "not lower-case hex"),
            ("ab cd", "not lower-case hex"),
        ] {
            let e = text.parse::<RootHash>().unwrap_err();
            assert_eq!(e.reason, why, "{text:?}");
            assert!(e.to_string().contains(&format!("{text:?}")), "{e}");
        }
        assert!("00".repeat(65).parse::<RootHash>().is_err());
        assert!(serde_json::from_str::<RootHash>("\"XY\"").is_err());
    }
}
