//! cosign's public key: an ECDSA P-256 key as a PEM `PUBLIC KEY` (PKIX SubjectPublicKeyInfo).

use p256::ecdsa::signature::Verifier;
use p256::ecdsa::{Signature, VerifyingKey};
use p256::pkcs8::{DecodePublicKey, EncodePublicKey, LineEnding};

/// The PEM label of a cosign public key.
pub const PEM_LABEL: &str = "PUBLIC KEY";

#[derive(Debug, thiserror::Error)]
pub enum PublicKeyError {
    #[error("{from}: not a PEM `{PEM_LABEL}` holding an ECDSA P-256 key (cosign.pub): {reason}")]
    Parse { from: String, reason: String },
}

/// Why a signature was refused.
#[derive(Debug, thiserror::Error, PartialEq, Eq)]
pub enum SignatureCheckError {
    #[error("the signature is not base64")]
    Base64,
    #[error("the signature is not an ASN.1 DER ECDSA signature")]
    Der,
    #[error("the signature does not verify with the key")]
    Mismatch,
}

/// A trusted cosign key, with the name it was loaded from (for messages).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct PublicKey {
    key: VerifyingKey,
    from: String,
}

impl PublicKey {
    /// Parses `text`, a PEM public key; `from` names where it came from.
    pub fn from_pem(text: &str, from: &str) -> Result<Self, PublicKeyError> {
        let key =
            VerifyingKey::from_public_key_pem(text.trim()).map_err(|e| PublicKeyError::Parse {
                from: from.to_owned(),
                reason: e.to_string(),
            })?;
        Ok(PublicKey {
            key,
            from: from.to_owned(),
        })
    }

    pub(crate) fn new(key: VerifyingKey, from: &str) -> Self {
        PublicKey {
            key,
            from: from.to_owned(),
        }
    }

    /// Whether `text` looks like a PEM public key (not a minisign key).
    pub fn is_pem(text: &str) -> bool {
        text.trim_start()
            .starts_with(&format!("-----BEGIN {PEM_LABEL}-----"))
    }

    /// The PEM text, as cosign writes `cosign.pub`.
    pub fn to_pem(&self) -> String {
        self.key
            .to_public_key_pem(LineEnding::LF)
            .expect("a P-256 key always encodes")
    }

    /// Where the key was loaded from.
    pub fn from(&self) -> &str {
        &self.from
    }

    /// A short id: `sha256:` and the first 16 hex digits of the SPKI DER's SHA-256.
    pub fn key_id(&self) -> String {
        let der = self
            .key
            .to_public_key_der()
            .expect("a P-256 key always encodes");
        crate::oci_layout::sha256_digest(der.as_bytes())[..23].to_owned()
    }

    /// Checks `signature_b64` (base64 ASN.1 DER ECDSA over SHA-256) over `payload`.
    pub fn verify(&self, payload: &[u8], signature_b64: &str) -> Result<(), SignatureCheckError> {
        use base64::Engine;
        let der = base64::engine::general_purpose::STANDARD
            .decode(signature_b64.trim())
            .map_err(|_| SignatureCheckError::Base64)?;
        let sig = Signature::from_der(&der).map_err(|_| SignatureCheckError::Der)?;
        self.key
            .verify(payload, &sig)
            .map_err(|_| SignatureCheckError::Mismatch)
    }
}
