//! The Secure Boot db key a build signs its UKI with, checked before anything is written.
//!
//! UEFI (2.10, 32.5.3.1) requires firmware to accept Authenticode signatures made with
//! RSA-2048 only; an EC, Ed25519 or RSA-PSS key makes a UKI that `sbsign` signs without a word
//! and a machine's firmware may refuse to start. So: a key that is not PKCS#1 RSA is refused,
//! an RSA key under 2048 bits is refused, and a larger one is accepted with a warning (OVMF and
//! most firmware verify RSA-3072/4096, but nothing requires it). A certificate that does not
//! hold the key's public half is refused here rather than by `sbsign` after the layers are built.
//!
//! openssl reads the files (every PEM or DER variant `sbsign`, itself built on OpenSSL,
//! accepts); the SubjectPublicKeyInfo it prints is parsed here.

use std::path::{Path, PathBuf};
use std::process::Command;

use base64::Engine;
use spki::ObjectIdentifier;

use crate::tool::{output, ToolError};

/// The size UEFI requires every firmware to verify.
pub const REQUIRED_RSA_BITS: usize = 2048;

const RSA: ObjectIdentifier = ObjectIdentifier::new_unwrap("1.2.840.113549.1.1.1");
/// Key algorithms a careless operator may hand us, by name for the error.
const NAMED: [(&str, &str); 5] = [
    ("1.2.840.10045.2.1", "an EC key"),
    ("1.3.101.112", "an Ed25519 key"),
    ("1.3.101.113", "an Ed448 key"),
    ("1.2.840.113549.1.1.10", "an RSA-PSS key"),
    ("1.2.840.10040.4.1", "a DSA key"),
];

/// Why a db key cannot sign a UKI.
#[derive(Debug, thiserror::Error)]
pub enum DbKeyError {
    #[error("reading the Secure Boot {what} {}", path.display())]
    Read {
        what: &'static str,
        path: PathBuf,
        #[source]
        source: ToolError,
    },
    #[error(
        "the Secure Boot db key {} is {algorithm}: UEFI firmware is only required to accept \
         RSA-2048 Authenticode signatures (make one with `ingot key secure-boot`)",
        path.display()
    )]
    NotRsa { path: PathBuf, algorithm: String },
    #[error(
        "the Secure Boot db key {} is RSA-{bits}: fewer than the {REQUIRED_RSA_BITS} bits UEFI \
         firmware verifies",
        path.display()
    )]
    TooSmall { path: PathBuf, bits: usize },
    #[error("the Secure Boot certificate {} does not hold the public half of the db key {}",
        cert.display(), key.display())]
    Mismatch { key: PathBuf, cert: PathBuf },
    #[error("the Secure Boot db key {}: openssl printed a public key that does not parse: {reason}",
        path.display())]
    Unparsable { path: PathBuf, reason: String },
}

/// What the check found of an accepted key.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct DbKey {
    /// The RSA modulus' size in bits.
    pub bits: usize,
}

impl DbKey {
    /// Why firmware might still refuse the signature, for the operator (none for RSA-2048).
    pub fn warning(&self, key: &Path) -> Option<String> {
        (self.bits != REQUIRED_RSA_BITS).then(|| {
            format!(
                "the Secure Boot db key {} is RSA-{}: UEFI requires firmware to verify RSA-{} \
                 only, and some firmware refuses larger keys",
                key.display(),
                self.bits,
                REQUIRED_RSA_BITS
            )
        })
    }
}

/// Checks that `key` is an RSA key of at least 2048 bits and that `cert` holds its public half.
pub fn check(key: &Path, cert: &Path) -> Result<DbKey, DbKeyError> {
    let key_pub = public_pem(
        "key",
        key,
        Command::new("openssl")
            .args(["pkey", "-pubout", "-passin", "pass:", "-in"])
            .arg(key),
    )?;
    let cert_pub = public_pem(
        "certificate",
        cert,
        Command::new("openssl")
            .args(["x509", "-noout", "-pubkey", "-in"])
            .arg(cert),
    )?;
    if key_pub != cert_pub {
        return Err(DbKeyError::Mismatch {
            key: key.to_owned(),
            cert: cert.to_owned(),
        });
    }
    let der = pem_body(&key_pub).ok_or_else(|| unparsable(key, "no PEM body".into()))?;
    rsa_bits(key, &der)
}

/// The PEM SubjectPublicKeyInfo openssl prints for `path`.
fn public_pem(what: &'static str, path: &Path, cmd: &mut Command) -> Result<String, DbKeyError> {
    let out = output("openssl", "openssl", cmd).map_err(|source| DbKeyError::Read {
        what,
        path: path.to_owned(),
        source,
    })?;
    Ok(String::from_utf8_lossy(&out).into_owned())
}

/// The DER between a PEM's armour lines.
fn pem_body(pem: &str) -> Option<Vec<u8>> {
    let body: String = pem
        .lines()
        .skip_while(|l| !l.starts_with("-----BEGIN "))
        .skip(1)
        .take_while(|l| !l.starts_with("-----END "))
        .collect();
    base64::engine::general_purpose::STANDARD.decode(body).ok()
}

fn unparsable(path: &Path, reason: String) -> DbKeyError {
    DbKeyError::Unparsable {
        path: path.to_owned(),
        reason,
    }
}

/// The RSA modulus' size in `der` (a SubjectPublicKeyInfo), or why it is no RSA key.
fn rsa_bits(path: &Path, der: &[u8]) -> Result<DbKey, DbKeyError> {
    let info = spki::SubjectPublicKeyInfoRef::try_from(der)
        .map_err(|e| unparsable(path, e.to_string()))?;
    let oid = info.algorithm.oid;
    if oid != RSA {
        let id = oid.to_string();
        let algorithm = NAMED
            .iter()
            .find(|(o, _)| *o == id)
            .map_or_else(|| format!("a key of algorithm {id}"), |(_, n)| (*n).into());
        return Err(DbKeyError::NotRsa {
            path: path.to_owned(),
            algorithm,
        });
    }
    let bits = info
        .subject_public_key
        .as_bytes()
        .ok_or_else(|| unparsable(path, "the key's bit string is not whole bytes".into()))?;
    let rsa = pkcs1::RsaPublicKey::try_from(bits).map_err(|e| unparsable(path, e.to_string()))?;
    let n = rsa.modulus.as_bytes();
    let bits = n
        .first()
        .map_or(0, |b| n.len() * 8 - b.leading_zeros() as usize);
    if bits < REQUIRED_RSA_BITS {
        return Err(DbKeyError::TooSmall {
            path: path.to_owned(),
            bits,
        });
    }
    Ok(DbKey { bits })
}
