//! cosign's encrypted private key file (`cosign.key`): PEM `ENCRYPTED SIGSTORE PRIVATE KEY`
//! (older files: `ENCRYPTED COSIGN PRIVATE KEY`) around a JSON document,
//! `{"kdf":{"name":"scrypt","params":{"N":…,"r":8,"p":1},"salt":B64},
//! "cipher":{"name":"nacl/secretbox","nonce":B64},"ciphertext":B64}` (the format of
//! go-securesystemslib's `encrypted` package). The secretbox key is scrypt(password, salt, N, r,
//! p, 32 bytes); the plaintext is the PKCS#8 DER of the ECDSA P-256 private key.

use base64::engine::general_purpose::STANDARD as B64;
use base64::Engine;
use crypto_secretbox::aead::{Aead, KeyInit};
use crypto_secretbox::XSalsa20Poly1305;
use p256::ecdsa::signature::Signer;
use p256::ecdsa::Signature;
use p256::pkcs8::{DecodePrivateKey, EncodePrivateKey};
use rand::RngCore;
use serde::{Deserialize, Serialize};

use super::PublicKey;

/// The PEM label cosign writes.
pub const PEM_LABEL: &str = "ENCRYPTED SIGSTORE PRIVATE KEY";
/// The label of keys from cosign before 2.0, still read.
pub const OLD_PEM_LABEL: &str = "ENCRYPTED COSIGN PRIVATE KEY";
/// The largest key file read (cosign's is about 650 bytes).
pub const MAX_KEY_FILE_SIZE: usize = 16 << 10;

/// The scrypt parameters go-securesystemslib accepts (N as log2, r, p): its legacy set, which
/// cosign writes, and its standard and OWASP sets. Others are refused, so a tampered file
/// cannot make the key derivation take hours.
const ACCEPTED_PARAMS: [(u8, u32, u32); 3] = [(15, 8, 1), (16, 8, 1), (17, 8, 1)];
const SALT_SIZE: usize = 32;
const NONCE_SIZE: usize = 24;

#[derive(Debug, thiserror::Error)]
pub enum PrivateKeyError {
    #[error("{from}: not a PEM `{PEM_LABEL}` (cosign.key): {reason}")]
    Pem { from: String, reason: String },
    #[error("{from}: the encrypted key document is not valid: {reason}")]
    Document { from: String, reason: String },
    #[error("{from}: unsupported key derivation `{name}` (cosign uses scrypt)")]
    Kdf { from: String, name: String },
    #[error("{from}: unsupported cipher `{name}` (cosign uses nacl/secretbox)")]
    Cipher { from: String, name: String },
    #[error(
        "{from}: scrypt parameters N={n}, r={r}, p={p} are not one of the sets cosign accepts"
    )]
    Params {
        from: String,
        n: u64,
        r: u32,
        p: u32,
    },
    #[error("{from}: decryption failed: wrong password (COSIGN_PASSWORD or the password file)")]
    Password { from: String },
    #[error("{from}: the decrypted key is not a PKCS#8 ECDSA P-256 private key: {reason}")]
    Key { from: String, reason: String },
}

#[derive(Serialize, Deserialize)]
struct Document {
    kdf: Kdf,
    cipher: Cipher,
    ciphertext: String,
}

#[derive(Serialize, Deserialize)]
struct Kdf {
    name: String,
    params: ScryptParams,
    salt: String,
}

#[derive(Serialize, Deserialize)]
struct ScryptParams {
    #[serde(rename = "N")]
    n: u64,
    r: u32,
    p: u32,
}

#[derive(Serialize, Deserialize)]
struct Cipher {
    name: String,
    nonce: String,
}

/// A cosign signing key (ECDSA P-256).
pub struct SigningKey {
    key: p256::ecdsa::SigningKey,
}

impl std::fmt::Debug for SigningKey {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("SigningKey").finish_non_exhaustive()
    }
}

impl SigningKey {
    /// A new random key.
    pub fn generate() -> Self {
        SigningKey {
            key: p256::ecdsa::SigningKey::random(&mut rand::rngs::OsRng),
        }
    }

    /// Its public key.
    pub fn public_key(&self) -> PublicKey {
        PublicKey::new(*self.key.verifying_key(), "the signing key")
    }

    /// The base64 ASN.1 DER ECDSA signature over SHA-256 of `payload`.
    pub fn sign(&self, payload: &[u8]) -> String {
        let sig: Signature = self.key.sign(payload);
        B64.encode(sig.to_der().as_bytes())
    }

    /// The key encrypted with `password`, as the PEM text of `cosign.key`.
    pub fn to_encrypted_pem(&self, password: &[u8]) -> String {
        let der = self.key.to_pkcs8_der().expect("a P-256 key always encodes");
        let mut salt = [0u8; SALT_SIZE];
        let mut nonce = [0u8; NONCE_SIZE];
        rand::rngs::OsRng.fill_bytes(&mut salt);
        rand::rngs::OsRng.fill_bytes(&mut nonce);
        let (log_n, r, p) = ACCEPTED_PARAMS[0];
        let key = derive(password, &salt, log_n, r, p);
        let sealed = XSalsa20Poly1305::new(&key.into())
            .encrypt(&nonce.into(), der.as_bytes())
            .expect("sealing in memory cannot fail");
        let doc = Document {
            kdf: Kdf {
                name: "scrypt".into(),
                params: ScryptParams {
                    n: 1 << log_n,
                    r,
                    p,
                },
                salt: B64.encode(salt),
            },
            cipher: Cipher {
                name: "nacl/secretbox".into(),
                nonce: B64.encode(nonce),
            },
            ciphertext: B64.encode(sealed),
        };
        let json = serde_json::to_vec(&doc).expect("serialisable");
        pem_rfc7468::encode_string(PEM_LABEL, pem_rfc7468::LineEnding::LF, &json)
            .expect("PEM encoding in memory cannot fail")
    }

    /// Reads `cosign.key`'s text, decrypting it with `password`; `from` names the file.
    pub fn from_encrypted_pem(
        text: &str,
        password: &[u8],
        from: &str,
    ) -> Result<Self, PrivateKeyError> {
        let doc = document(text, from)?;
        let err = |reason: String| PrivateKeyError::Document {
            from: from.to_owned(),
            reason,
        };
        let (log_n, r, p) = check_kdf(&doc, from)?;
        let salt = B64
            .decode(&doc.kdf.salt)
            .map_err(|e| err(format!("salt: {e}")))?;
        let nonce = B64
            .decode(&doc.cipher.nonce)
            .map_err(|e| err(format!("nonce: {e}")))?;
        let nonce: [u8; NONCE_SIZE] = nonce
            .try_into()
            .map_err(|_| err(format!("the nonce is not {NONCE_SIZE} bytes")))?;
        let sealed = B64
            .decode(&doc.ciphertext)
            .map_err(|e| err(format!("ciphertext: {e}")))?;
        let key = derive(password, &salt, log_n, r, p);
        let der = XSalsa20Poly1305::new(&key.into())
            .decrypt(&nonce.into(), sealed.as_slice())
            .map_err(|_| PrivateKeyError::Password {
                from: from.to_owned(),
            })?;
        let key =
            p256::ecdsa::SigningKey::from_pkcs8_der(&der).map_err(|e| PrivateKeyError::Key {
                from: from.to_owned(),
                reason: e.to_string(),
            })?;
        Ok(SigningKey { key })
    }
}

/// The JSON document inside the PEM armour.
fn document(text: &str, from: &str) -> Result<Document, PrivateKeyError> {
    let pem_err = |reason: String| PrivateKeyError::Pem {
        from: from.to_owned(),
        reason,
    };
    if text.len() > MAX_KEY_FILE_SIZE {
        return Err(pem_err(format!("larger than {MAX_KEY_FILE_SIZE} bytes")));
    }
    let (label, json) =
        pem_rfc7468::decode_vec(text.trim().as_bytes()).map_err(|e| pem_err(e.to_string()))?;
    if label != PEM_LABEL && label != OLD_PEM_LABEL {
        return Err(pem_err(format!("its label is `{label}`")));
    }
    serde_json::from_slice(&json).map_err(|e| PrivateKeyError::Document {
        from: from.to_owned(),
        reason: e.to_string(),
    })
}

/// The scrypt parameters, if the document names scrypt, secretbox and an accepted set.
fn check_kdf(doc: &Document, from: &str) -> Result<(u8, u32, u32), PrivateKeyError> {
    if doc.kdf.name != "scrypt" {
        return Err(PrivateKeyError::Kdf {
            from: from.to_owned(),
            name: doc.kdf.name.clone(),
        });
    }
    if doc.cipher.name != "nacl/secretbox" {
        return Err(PrivateKeyError::Cipher {
            from: from.to_owned(),
            name: doc.cipher.name.clone(),
        });
    }
    let ScryptParams { n, r, p } = doc.kdf.params;
    ACCEPTED_PARAMS
        .into_iter()
        .find(|&(log_n, pr, pp)| 1u64 << log_n == n && pr == r && pp == p)
        .ok_or(PrivateKeyError::Params {
            from: from.to_owned(),
            n,
            r,
            p,
        })
}

fn derive(password: &[u8], salt: &[u8], log_n: u8, r: u32, p: u32) -> [u8; 32] {
    let params = scrypt::Params::new(log_n, r, p, 32).expect("accepted parameters are valid");
    let mut key = [0u8; 32];
    scrypt::scrypt(password, salt, &params, &mut key).expect("32 bytes is a valid length");
    key
}

#[cfg(test)]
mod tests {
    use super::*;

    fn refused(text: &str, password: &[u8]) -> String {
        SigningKey::from_encrypted_pem(text, password, "k.key")
            .unwrap_err()
            .to_string()
    }

    fn with_document(edit: impl FnOnce(&mut serde_json::Value)) -> String {
        let pem = SigningKey::generate().to_encrypted_pem(b"pw");
        let (_, json) = pem_rfc7468::decode_vec(pem.as_bytes()).unwrap();
        let mut v: serde_json::Value = serde_json::from_slice(&json).unwrap();
        edit(&mut v);
        let json = serde_json::to_vec(&v).unwrap();
        pem_rfc7468::encode_string(PEM_LABEL, pem_rfc7468::LineEnding::LF, &json).unwrap()
    }

    #[test]
    fn round_trip_and_signature() {
        let key = SigningKey::generate();
        let pem = key.to_encrypted_pem(b"secret");
        assert!(pem.starts_with("-----BEGIN ENCRYPTED SIGSTORE PRIVATE KEY-----\n"));
        let back = SigningKey::from_encrypted_pem(&pem, b"secret", "k.key").unwrap();
        let sig = back.sign(b"payload");
        key.public_key().verify(b"payload", &sig).unwrap();
        assert!(key.public_key().verify(b"payloaD", &sig).is_err());
        // cosign allows an empty password.
        let empty = key.to_encrypted_pem(b"");
        SigningKey::from_encrypted_pem(&empty, b"", "k.key").unwrap();
    }

    #[test]
    fn wrong_password_is_named() {
        let pem = SigningKey::generate().to_encrypted_pem(b"right");
        let e = refused(&pem, b"wrong");
        assert!(e.contains("k.key") && e.contains("wrong password"), "{e}");
    }

    #[test]
    fn truncated_json_is_refused() {
        let pem = SigningKey::generate().to_encrypted_pem(b"pw");
        let (_, json) = pem_rfc7468::decode_vec(pem.as_bytes()).unwrap();
        let cut = &json[..json.len() / 2];
        let pem = pem_rfc7468::encode_string(PEM_LABEL, pem_rfc7468::LineEnding::LF, cut).unwrap();
        let e = refused(&pem, b"pw");
        assert!(
            e.contains("k.key: the encrypted key document is not valid"),
            "{e}"
        );
    }

    #[test]
    fn unknown_kdf_cipher_and_params_are_refused() {
        let pem = with_document(|v| v["kdf"]["name"] = "argon2".into());
        assert!(refused(&pem, b"pw").contains("unsupported key derivation `argon2`"));
        let pem = with_document(|v| v["cipher"]["name"] = "aes-gcm".into());
        assert!(refused(&pem, b"pw").contains("unsupported cipher `aes-gcm`"));
        let pem = with_document(|v| v["kdf"]["params"]["N"] = (1u64 << 30).into());
        assert!(refused(&pem, b"pw").contains("N=1073741824"));
    }

    #[test]
    fn other_pem_is_refused() {
        let pem =
            pem_rfc7468::encode_string("PRIVATE KEY", pem_rfc7468::LineEnding::LF, b"x").unwrap();
        assert!(refused(&pem, b"pw").contains("its label is `PRIVATE KEY`"));
        assert!(refused("not pem", b"pw").contains("not a PEM"));
    }
}
