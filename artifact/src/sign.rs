//! Minisign signatures over the stack descriptor.
//!
//! Keys and signatures use the format of the `minisign` CLI, so `minisign -G -W` makes a key
//! `ingot build --sign-key` takes, `ingot key generate` makes keys `minisign -S` takes, and
//! `minisign -V` checks what ingot signs:
//!
//! - public key: `untrusted comment: …` line, then base64(`Ed` ‖ key id\[8\] ‖ Ed25519 pk\[32\]);
//! - secret key: comment line, then base64(`Ed` ‖ kdf\[2\] ‖ `B2` ‖ salt\[32\] ‖ ops\[8\] ‖ mem\[8\]
//!   ‖ key id\[8\] ‖ sk\[64\] ‖ BLAKE2b-256 checksum\[32\]); kdf `\0\0` means unencrypted;
//! - signature: comment line, base64(`ED` ‖ key id ‖ Ed25519(BLAKE2b-512(data))), `trusted
//!   comment: …` line, base64(Ed25519(signature ‖ trusted comment)).
//!
//! Signing is done here rather than with the `minisign` crate because that crate adds random
//! noise to every Ed25519 signature; plain RFC 8032 Ed25519 is deterministic, so two builds of
//! one manifest give the same signed manifest, byte for byte. Verifying uses `minisign-verify`,
//! an implementation independent of this one.

use base64::engine::general_purpose::STANDARD as B64;
use base64::Engine;
use blake2::digest::consts::{U32, U64};
use blake2::{Blake2b, Digest};
use ed25519_dalek::{Signer, SigningKey};
use rand::RngCore;

const SIGALG: &[u8; 2] = b"Ed";
const SIGALG_PREHASHED: &[u8; 2] = b"ED";
const KDF_NONE: [u8; 2] = [0, 0];
const KDF_SCRYPT: &[u8; 2] = b"Sc";
const CHK_ALG: &[u8; 2] = b"B2";
const SECRET_KEY_LEN: usize = 2 + 2 + 2 + 32 + 8 + 8 + 8 + 64 + 32;
const COMMENT_PREFIX: &str = "untrusted comment: ";
const TRUSTED_PREFIX: &str = "trusted comment: ";

/// Why a key or signature was refused.
#[derive(Debug, thiserror::Error)]
pub enum SignError {
    /// The key file is not in minisign's format.
    #[error("not a minisign {what}: {reason}")]
    Format {
        /// `secret key`, `public key` or `signature`.
        what: &'static str,
        /// What is wrong.
        reason: String,
    },
    /// The secret key is password-protected.
    #[error(
        "the secret key is encrypted with a password; ingot needs an unencrypted key \
         (make one with `ingot key generate` or `minisign -G -W`)"
    )]
    Encrypted,
    /// The secret key's checksum does not match its bytes.
    #[error("the secret key is corrupt (checksum mismatch)")]
    Checksum,
    /// The signature does not verify with the trusted key.
    #[error("{0}")]
    Invalid(String),
}

fn format_err(what: &'static str, reason: impl Into<String>) -> SignError {
    SignError::Format {
        what,
        reason: reason.into(),
    }
}

/// The base64 line of a minisign file (the line after the untrusted comment).
fn payload_line<'a>(text: &'a str, what: &'static str) -> Result<&'a str, SignError> {
    let mut lines = text.lines().map(str::trim).filter(|l| !l.is_empty());
    let first = lines
        .next()
        .ok_or_else(|| format_err(what, "the file is empty"))?;
    if !first.starts_with(COMMENT_PREFIX) {
        return Err(format_err(
            what,
            "the first line is not `untrusted comment: …`",
        ));
    }
    lines
        .next()
        .ok_or_else(|| format_err(what, "the key line is missing"))
}

/// An unencrypted minisign secret key.
pub struct SecretKey {
    key_id: [u8; 8],
    signing: SigningKey,
}

impl std::fmt::Debug for SecretKey {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "SecretKey({})", key_id_hex(&self.key_id))
    }
}

/// A minisign public key.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct PublicKey {
    key_id: [u8; 8],
    key: [u8; 32],
}

fn key_id_hex(id: &[u8; 8]) -> String {
    // minisign prints the little-endian u64 in upper-case hex.
    format!("{:016X}", u64::from_le_bytes(*id))
}

impl SecretKey {
    /// Parse a secret key file's text.
    pub fn from_minisign(text: &str) -> Result<Self, SignError> {
        const WHAT: &str = "secret key";
        let bytes = B64
            .decode(payload_line(text, WHAT)?)
            .map_err(|e| format_err(WHAT, format!("bad base64: {e}")))?;
        if bytes.len() != SECRET_KEY_LEN {
            return Err(format_err(
                WHAT,
                format!("{} bytes instead of {SECRET_KEY_LEN}", bytes.len()),
            ));
        }
        if &bytes[0..2] != SIGALG {
            return Err(format_err(WHAT, "the algorithm is not Ed25519"));
        }
        if &bytes[2..4] == KDF_SCRYPT {
            return Err(SignError::Encrypted);
        }
        if bytes[2..4] != KDF_NONE {
            return Err(format_err(WHAT, "unknown key derivation algorithm"));
        }
        if &bytes[4..6] != CHK_ALG {
            return Err(format_err(WHAT, "unknown checksum algorithm"));
        }
        let keynum_at = 6 + 32 + 8 + 8;
        let key_id: [u8; 8] = bytes[keynum_at..keynum_at + 8].try_into().expect("8 bytes");
        let sk: [u8; 64] = bytes[keynum_at + 8..keynum_at + 72]
            .try_into()
            .expect("64 bytes");
        let chk = &bytes[keynum_at + 72..];
        // `minisign -G -W` (0.11) leaves the checksum of an unencrypted key all zero; the
        // public-half check below still catches a damaged key.
        if chk.iter().any(|&b| b != 0) && checksum(&key_id, &sk)[..] != chk[..] {
            return Err(SignError::Checksum);
        }
        let seed: [u8; 32] = sk[..32].try_into().expect("32 bytes");
        let signing = SigningKey::from_bytes(&seed);
        if signing.verifying_key().as_bytes()[..] != sk[32..] {
            return Err(format_err(
                WHAT,
                "its public half does not match its secret half",
            ));
        }
        Ok(SecretKey { key_id, signing })
    }

    /// A new random key.
    pub fn generate() -> Self {
        let mut seed = [0u8; 32];
        let mut key_id = [0u8; 8];
        rand::rngs::OsRng.fill_bytes(&mut seed);
        rand::rngs::OsRng.fill_bytes(&mut key_id);
        SecretKey {
            key_id,
            signing: SigningKey::from_bytes(&seed),
        }
    }

    /// The matching public key.
    pub fn public_key(&self) -> PublicKey {
        PublicKey {
            key_id: self.key_id,
            key: self.signing.verifying_key().to_bytes(),
        }
    }

    /// The key id as minisign prints it.
    pub fn key_id(&self) -> String {
        key_id_hex(&self.key_id)
    }

    /// The secret key file's text (unencrypted, as `minisign -G -W` writes it).
    pub fn to_minisign(&self) -> String {
        let mut bytes = Vec::with_capacity(SECRET_KEY_LEN);
        bytes.extend_from_slice(SIGALG);
        bytes.extend_from_slice(&KDF_NONE);
        bytes.extend_from_slice(CHK_ALG);
        bytes.extend_from_slice(&[0u8; 32 + 8 + 8]);
        bytes.extend_from_slice(&self.key_id);
        let sk = self.signing.to_keypair_bytes();
        bytes.extend_from_slice(&sk);
        bytes.extend_from_slice(&checksum(&self.key_id, &sk));
        format!(
            "{COMMENT_PREFIX}minisign secret key {}\n{}\n",
            self.key_id(),
            B64.encode(bytes)
        )
    }

    /// Sign `data` (prehashed mode, what `minisign -S` does by default) and return the whole
    /// `.minisig` text. Deterministic: the same key, data and comment give the same bytes.
    pub fn sign(&self, data: &[u8], trusted_comment: &str) -> String {
        let prehash = Blake2b::<U64>::digest(data);
        let sig = self.signing.sign(&prehash);
        let mut sig_line = Vec::with_capacity(74);
        sig_line.extend_from_slice(SIGALG_PREHASHED);
        sig_line.extend_from_slice(&self.key_id);
        sig_line.extend_from_slice(&sig.to_bytes());
        let mut global = sig.to_bytes().to_vec();
        global.extend_from_slice(trusted_comment.as_bytes());
        let global_sig = self.signing.sign(&global);
        format!(
            "{COMMENT_PREFIX}signature from ingot secret key {}\n{}\n{TRUSTED_PREFIX}{}\n{}\n",
            self.key_id(),
            B64.encode(sig_line),
            trusted_comment,
            B64.encode(global_sig.to_bytes())
        )
    }
}

fn checksum(key_id: &[u8; 8], sk: &[u8; 64]) -> [u8; 32] {
    let mut h = Blake2b::<U32>::new();
    h.update(SIGALG);
    h.update(key_id);
    h.update(sk);
    h.finalize().into()
}

impl PublicKey {
    /// Parse a public key file's text, or a bare base64 key (as `minisign -P` takes).
    pub fn from_minisign(text: &str) -> Result<Self, SignError> {
        const WHAT: &str = "public key";
        let trimmed = text.trim();
        let line = if trimmed.starts_with(COMMENT_PREFIX) {
            payload_line(trimmed, WHAT)?
        } else {
            trimmed
        };
        let bytes = B64
            .decode(line)
            .map_err(|e| format_err(WHAT, format!("bad base64: {e}")))?;
        if bytes.len() == SECRET_KEY_LEN {
            return Err(format_err(
                WHAT,
                "it is a minisign secret key; give its public key (the .pub file) instead",
            ));
        }
        if bytes.len() != 42 || &bytes[0..2] != SIGALG {
            return Err(format_err(WHAT, "not an Ed25519 minisign key"));
        }
        Ok(PublicKey {
            key_id: bytes[2..10].try_into().expect("8 bytes"),
            key: bytes[10..].try_into().expect("32 bytes"),
        })
    }

    /// The key id as minisign prints it.
    pub fn key_id(&self) -> String {
        key_id_hex(&self.key_id)
    }

    /// The base64 key line.
    pub fn to_base64(&self) -> String {
        let mut bytes = Vec::with_capacity(42);
        bytes.extend_from_slice(SIGALG);
        bytes.extend_from_slice(&self.key_id);
        bytes.extend_from_slice(&self.key);
        B64.encode(bytes)
    }

    /// The public key file's text.
    pub fn to_minisign(&self) -> String {
        format!(
            "{COMMENT_PREFIX}minisign public key {}\n{}\n",
            self.key_id(),
            self.to_base64()
        )
    }

    /// Check a `.minisig` text over `data` with this key (via `minisign-verify`), and return
    /// its trusted comment. Legacy (non-prehashed) signatures are refused.
    pub fn verify(&self, data: &[u8], signature: &str) -> Result<String, SignError> {
        let pk = minisign_verify::PublicKey::from_base64(&self.to_base64())
            .map_err(|e| format_err("public key", e.to_string()))?;
        let sig = minisign_verify::Signature::decode(signature)
            .map_err(|e| format_err("signature", e.to_string()))?;
        let sig_key_id = signature_key_id(signature);
        pk.verify(data, &sig, false).map_err(|e| match e {
            minisign_verify::Error::UnexpectedKeyId => SignError::Invalid(format!(
                "signed by another key (key id {}), not the trusted key {}",
                sig_key_id.as_deref().unwrap_or("?"),
                self.key_id()
            )),
            minisign_verify::Error::InvalidSignature => SignError::Invalid(
                "the signature does not match the signed bytes (descriptor or trusted comment \
                 altered)"
                    .to_owned(),
            ),
            other => SignError::Invalid(format!("signature refused: {other}")),
        })?;
        Ok(sig.trusted_comment().to_owned())
    }
}

/// The key id a `.minisig` text claims, if it parses that far.
pub fn signature_key_id(signature: &str) -> Option<String> {
    let line = signature.lines().nth(1)?;
    let bytes = B64.decode(line.trim()).ok()?;
    let id: [u8; 8] = bytes.get(2..10)?.try_into().ok()?;
    Some(key_id_hex(&id))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn round_trip_and_determinism() {
        let sk = SecretKey::generate();
        let sk2 = SecretKey::from_minisign(&sk.to_minisign()).unwrap();
        let pk = PublicKey::from_minisign(&sk2.public_key().to_minisign()).unwrap();
        assert_eq!(pk, sk.public_key());
        let a = sk.sign(b"hello", "stack=demo");
        let b = sk2.sign(b"hello", "stack=demo");
        assert_eq!(a, b, "Ed25519 signatures are deterministic");
        assert_eq!(pk.verify(b"hello", &a).unwrap(), "stack=demo");
        let err = pk.verify(b"hellO", &a).unwrap_err().to_string();
        assert!(err.contains("does not match"), "{err}");
        let other = SecretKey::generate().public_key();
        let err = other.verify(b"hello", &a).unwrap_err().to_string();
        assert!(err.contains("signed by another key"), "{err}");
        // A bare base64 line is a public key too.
        assert_eq!(PublicKey::from_minisign(&pk.to_base64()).unwrap(), pk);
    }

    #[test]
    fn corrupt_and_encrypted_keys() {
        let sk = SecretKey::generate();
        let text = sk.to_minisign();
        let line = text.lines().nth(1).unwrap();
        let mut bytes = B64.decode(line).unwrap();
        bytes[100] ^= 1;
        let bad = format!("untrusted comment: x\n{}\n", B64.encode(&bytes));
        assert!(matches!(
            SecretKey::from_minisign(&bad),
            Err(SignError::Checksum)
        ));
        // A zero checksum (what `minisign -G -W` writes) is accepted...
        let mut zero = B64.decode(line).unwrap();
        zero[126..].fill(0);
        let zero_text = format!("untrusted comment: x\n{}\n", B64.encode(&zero));
        assert_eq!(
            SecretKey::from_minisign(&zero_text).unwrap().public_key(),
            sk.public_key()
        );
        // ...but a damaged key with it is still refused.
        zero[100] ^= 1;
        let zero_bad = format!("untrusted comment: x\n{}\n", B64.encode(&zero));
        assert!(SecretKey::from_minisign(&zero_bad).is_err());
        let mut enc = B64.decode(line).unwrap();
        enc[2..4].copy_from_slice(b"Sc");
        let enc = format!("untrusted comment: x\n{}\n", B64.encode(&enc));
        assert!(matches!(
            SecretKey::from_minisign(&enc),
            Err(SignError::Encrypted)
        ));
        assert!(SecretKey::from_minisign("hello").is_err());
    }
}
