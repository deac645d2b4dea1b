//! A release's signed PCR 11 policy: the `.pcrsig` and `.pcrpkey` sections of its UKI, in the
//! format systemd 252 reads (`systemd-measure sign`, `systemd-creds --tpm2-public-key`,
//! `systemd-cryptenroll --tpm2-public-key`).
//!
//! A TPM opens a secret sealed under such a policy only when PCR 11 holds a value the holder of
//! the PCR key signed for. systemd-stub measures the UKI's sections into PCR 11 (see
//! [`crate::uki::pcr11`]); on the booted system `systemd-pcrphase` extends it once per boot
//! phase, so one signature per phase the node needs its secrets in. Each signature is
//! `{"pcrs":[11],"pkfp":HEX,"pol":HEX,"sig":BASE64}` under the bank's name:
//! - `pol`: the TPM2 policy digest of `TPM2_PolicyPCR` over PCR 11 (sha256 bank) holding the
//!   phase's value: `SHA256(0^32 || TPM_CC_PolicyPCR || TPML_PCR_SELECTION || SHA256(value))`;
//! - `sig`: RSA PKCS#1 v1.5 with SHA-256 over `pol` (what `TPM2_PolicyAuthorize` checks, with an
//!   empty policyRef);
//! - `pkfp`: SHA-256 of the public key's PKCS#1 `RSAPublicKey` DER.
//!
//! systemd-measure computes `pol` with a TPM trial session (it needs a TPM, even a software one,
//! at build time); ingot computes the same bytes itself so a build needs none. The tests compare
//! both against systemd-measure run on swtpm.

use rsa::pkcs1::EncodeRsaPublicKey;
use rsa::pkcs8::{DecodePublicKey, EncodePublicKey, LineEnding};
use rsa::traits::PublicKeyParts;
use rsa::{Pkcs1v15Sign, RsaPrivateKey, RsaPublicKey};
use serde::{Deserialize, Serialize};
use sha2::{Digest, Sha256};

/// The PCR systemd-stub and systemd-pcrphase extend.
pub const PCR: u32 = 11;
/// `TPM_CC_PolicyPCR` (TPM 2.0 part 2, 6.5.2).
const TPM_CC_POLICY_PCR: u32 = 0x0000_017f;
/// `TPM_ALG_SHA256`.
const TPM_ALG_SHA256: u16 = 0x000b;
/// The smallest RSA key ingot signs a policy with.
pub const MIN_RSA_BITS: usize = 2048;

/// The boot phases of ingot's boot chain, as `systemd-measure --phase=` names them. The base's
/// initrd is initramfs-tools (no `systemd-pcrphase-initrd`), so PCR 11 holds the stub's value
/// alone until `sysinit.target` (var's unlock happens there), then `sysinit` (sshd may start),
/// then `ready` (the first-boot bootstrap runs). The shutdown phases (`final`, `shutdown`) are
/// left out: a secret cannot be opened once the node is going down.
pub const PHASES: [&str; 3] = ["", "sysinit", "sysinit:ready"];

/// Every phase path systemd 252 can reach, for naming what a policy signs (systemd-measure's
/// defaults for a systemd initrd, ingot's [`PHASES`], and the shutdown phases).
pub const KNOWN_PHASES: [&str; 11] = [
    "",
    "enter-initrd",
    "enter-initrd:leave-initrd",
    "enter-initrd:leave-initrd:sysinit",
    "enter-initrd:leave-initrd:sysinit:ready",
    "enter-initrd:leave-initrd:sysinit:ready:shutdown",
    "enter-initrd:leave-initrd:sysinit:ready:shutdown:final",
    "sysinit",
    "sysinit:ready",
    "sysinit:ready:shutdown",
    "sysinit:ready:shutdown:final",
];

/// The `.pcrsig` section: one list of signatures per PCR bank (ingot signs sha256 only).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct PcrSig {
    pub sha256: Vec<Signature>,
}

/// One signed policy: PCR 11 holding one phase's value.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Signature {
    pub pcrs: Vec<u32>,
    pub pkfp: String,
    pub pol: String,
    pub sig: String,
}

/// What a UKI's policy says, checked.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct Policy {
    /// The PCR key's fingerprint (`pkfp`, hex).
    pub key: String,
    /// The phase each signature is for, in the section's order (`""`: the stub's value alone).
    pub phases: Vec<String>,
}

/// Why a PCR key or a UKI's policy is refused.
#[derive(Debug, thiserror::Error)]
pub enum PcrPolicyError {
    #[error("the PCR key is not an RSA private key in PEM (PKCS#8 or PKCS#1): {0}")]
    Key(String),
    #[error("the PCR key is RSA-{bits}: systemd and TPMs need at least RSA-{MIN_RSA_BITS}")]
    KeyTooSmall { bits: usize },
    #[error("signing the PCR policy: {0}")]
    Sign(String),
    #[error("the UKI's .pcrpkey is not an RSA public key in PEM: {0}")]
    PublicKey(String),
    #[error("the UKI's .pcrsig is not systemd's PCR signature JSON: {0}")]
    Json(String),
    #[error("the UKI's .pcrsig has no sha256 signature")]
    Empty,
    #[error("the UKI's .pcrsig signature {index} {problem}")]
    Bad { index: usize, problem: String },
    #[error("the UKI has {0} but no {1}")]
    Half(&'static str, &'static str),
    #[error(transparent)]
    Uki(crate::uki::UkiError),
}

/// The value PCR 11 holds in `phase` (colon-separated words, each extended as systemd-pcrphase
/// does: SHA-256 of the word's bytes) after the stub left `stub`.
pub fn phase_value(stub: [u8; 32], phase: &str) -> [u8; 32] {
    phase
        .split(':')
        .filter(|w| !w.is_empty())
        .fold(stub, |pcr, word| crate::uki::extend(pcr, word.as_bytes()))
}

/// The TPM2 policy digest of `TPM2_PolicyPCR` with PCR 11 (sha256) holding `value`.
pub fn policy_digest(value: [u8; 32]) -> [u8; 32] {
    let mut selection = Vec::with_capacity(10);
    selection.extend(1u32.to_be_bytes()); // one bank
    selection.extend(TPM_ALG_SHA256.to_be_bytes());
    let mut bitmap = [0u8; 3];
    bitmap[(PCR / 8) as usize] |= 1 << (PCR % 8);
    selection.push(bitmap.len() as u8);
    selection.extend(bitmap);
    let mut h = Sha256::new();
    h.update([0u8; 32]);
    h.update(TPM_CC_POLICY_PCR.to_be_bytes());
    h.update(&selection);
    h.update(Sha256::digest(value));
    h.finalize().into()
}

/// A PCR signing key: its private half and the `.pcrpkey` PEM of its public half.
pub struct PcrKey {
    key: RsaPrivateKey,
    public_pem: String,
}

impl PcrKey {
    /// Reads an RSA private key in PEM (`openssl genpkey -algorithm RSA` writes PKCS#8;
    /// `openssl genrsa -traditional` PKCS#1), at least [`MIN_RSA_BITS`].
    pub fn from_pem(pem: &str) -> Result<Self, PcrPolicyError> {
        use rsa::pkcs1::DecodeRsaPrivateKey;
        use rsa::pkcs8::DecodePrivateKey;
        let key = RsaPrivateKey::from_pkcs8_pem(pem)
            .or_else(|e8| {
                RsaPrivateKey::from_pkcs1_pem(pem)
                    .map_err(|e1| format!("PKCS#8: {e8}; PKCS#1: {e1}"))
            })
            .map_err(PcrPolicyError::Key)?;
        let bits = key.size() * 8;
        if bits < MIN_RSA_BITS {
            return Err(PcrPolicyError::KeyTooSmall { bits });
        }
        let public_pem = key
            .to_public_key()
            .to_public_key_pem(LineEnding::LF)
            .map_err(|e| PcrPolicyError::Key(e.to_string()))?;
        Ok(Self { key, public_pem })
    }

    /// A new RSA-2048 key, with its private half as PKCS#8 PEM (what `openssl genpkey
    /// -algorithm RSA` writes).
    pub fn generate() -> Result<(Self, String), PcrPolicyError> {
        use rsa::pkcs8::EncodePrivateKey;
        let key = RsaPrivateKey::new(&mut rand::rngs::OsRng, MIN_RSA_BITS)
            .map_err(|e| PcrPolicyError::Key(e.to_string()))?;
        let pem = key
            .to_pkcs8_pem(LineEnding::LF)
            .map_err(|e| PcrPolicyError::Key(e.to_string()))?;
        Ok((Self::from_pem(&pem)?, pem.to_string()))
    }

    /// The key's `pkfp` (hex), as `.pcrsig` names it.
    pub fn fingerprint_hex(&self) -> String {
        fingerprint(&self.key.to_public_key()).map_or_else(|e| e.to_string(), hex::encode)
    }

    /// The `.pcrpkey` section: the public key as PEM SubjectPublicKeyInfo.
    pub fn public_pem(&self) -> &str {
        &self.public_pem
    }

    /// The `.pcrsig` section for a UKI whose sections leave `stub` in PCR 11 (the UKI with this
    /// key's `.pcrpkey` in it): one signature per phase of `phases`.
    pub fn sign(&self, stub: [u8; 32], phases: &[&str]) -> Result<PcrSig, PcrPolicyError> {
        let public = self.key.to_public_key();
        let pkfp = hex::encode(fingerprint(&public)?);
        let mut sha256 = Vec::with_capacity(phases.len());
        for phase in phases {
            let pol = policy_digest(phase_value(stub, phase));
            let sig = self
                .key
                .sign(Pkcs1v15Sign::new::<Sha256>(), &Sha256::digest(pol))
                .map_err(|e| PcrPolicyError::Sign(e.to_string()))?;
            sha256.push(Signature {
                pcrs: vec![PCR],
                pkfp: pkfp.clone(),
                pol: hex::encode(pol),
                sig: base64::Engine::encode(&base64::engine::general_purpose::STANDARD, sig),
            });
        }
        Ok(PcrSig { sha256 })
    }
}

/// `pkfp`: SHA-256 of the key's PKCS#1 `RSAPublicKey` DER.
fn fingerprint(key: &RsaPublicKey) -> Result<[u8; 32], PcrPolicyError> {
    let der = key
        .to_pkcs1_der()
        .map_err(|e| PcrPolicyError::PublicKey(e.to_string()))?;
    Ok(Sha256::digest(der.as_bytes()).into())
}

/// Checks a UKI's `.pcrpkey` (`pkey`) and `.pcrsig` (`sig`) against the PCR 11 value its
/// sections leave (`stub`): every signature is by that key, over PCR 11 alone, and for one of
/// `phases`. Returns which phase each signature is for.
pub fn check(
    pkey: &[u8],
    sig: &[u8],
    stub: [u8; 32],
    phases: &[&str],
) -> Result<Policy, PcrPolicyError> {
    let pem = std::str::from_utf8(pkey).map_err(|e| PcrPolicyError::PublicKey(e.to_string()))?;
    let public = RsaPublicKey::from_public_key_pem(pem.trim_end_matches('\0'))
        .map_err(|e| PcrPolicyError::PublicKey(e.to_string()))?;
    let pkfp = hex::encode(fingerprint(&public)?);
    let text = std::str::from_utf8(sig).map_err(|e| PcrPolicyError::Json(e.to_string()))?;
    let parsed: PcrSig = serde_json::from_str(text.trim_end_matches(['\0', '\n']))
        .map_err(|e| PcrPolicyError::Json(e.to_string()))?;
    if parsed.sha256.is_empty() {
        return Err(PcrPolicyError::Empty);
    }
    let known: Vec<([u8; 32], &str)> = phases
        .iter()
        .map(|p| (policy_digest(phase_value(stub, p)), *p))
        .collect();
    let mut found = Vec::with_capacity(parsed.sha256.len());
    for (index, s) in parsed.sha256.iter().enumerate() {
        let bad = |problem: String| PcrPolicyError::Bad { index, problem };
        if s.pcrs != [PCR] {
            return Err(bad(format!(
                "covers PCRs {:?}, not PCR {PCR} alone",
                s.pcrs
            )));
        }
        if s.pkfp != pkfp {
            return Err(bad(format!("names key {} but .pcrpkey is {pkfp}", s.pkfp)));
        }
        let pol =
            hex::decode(&s.pol).map_err(|e| bad(format!("has a pol that is not hex: {e}")))?;
        let raw = base64::Engine::decode(&base64::engine::general_purpose::STANDARD, &s.sig)
            .map_err(|e| bad(format!("has a sig that is not base64: {e}")))?;
        public
            .verify(Pkcs1v15Sign::new::<Sha256>(), &Sha256::digest(&pol), &raw)
            .map_err(|_| bad("does not verify under .pcrpkey".into()))?;
        let phase = known
            .iter()
            .find(|(digest, _)| digest[..] == pol[..])
            .map(|(_, p)| p.to_string())
            .ok_or_else(|| {
                bad("signs a PCR 11 value this UKI never leaves in any boot phase".into())
            })?;
        found.push(phase);
    }
    Ok(Policy {
        key: pkfp,
        phases: found,
    })
}

/// The PCR policy a UKI carries, checked ([`check`] against [`KNOWN_PHASES`]); `None` for a UKI
/// with neither `.pcrpkey` nor `.pcrsig`. One without the other is refused: systemd would find
/// no policy, or a policy it cannot check.
pub fn of_uki(image: &[u8]) -> Result<Option<Policy>, PcrPolicyError> {
    let part = |name| match crate::uki::section(image, name) {
        Ok(b) => Ok(Some(b)),
        Err(crate::uki::UkiError::Missing(_)) => Ok(None),
        Err(e) => Err(PcrPolicyError::Uki(e)),
    };
    match (part(".pcrpkey")?, part(".pcrsig")?) {
        (None, None) => Ok(None),
        (Some(_), None) => Err(PcrPolicyError::Half(".pcrpkey", ".pcrsig")),
        (None, Some(_)) => Err(PcrPolicyError::Half(".pcrsig", ".pcrpkey")),
        (Some(pkey), Some(sig)) => {
            let stub = crate::uki::pcr11(image).map_err(PcrPolicyError::Uki)?;
            check(pkey, sig, stub, &KNOWN_PHASES).map(Some)
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_selection_is_pcr_11_of_the_sha256_bank() {
        // TPML_PCR_SELECTION {count 1, {TPM_ALG_SHA256, 3, {0x00, 0x08, 0x00}}}: the digest
        // systemd-measure computed for this value on swtpm (builder/tests/secure_boot.rs
        // compares whole UKIs).
        let value = [0u8; 32];
        let mut h = Sha256::new();
        h.update([0u8; 32]);
        h.update([0, 0, 1, 0x7f, 0, 0, 0, 1, 0, 0x0b, 3, 0, 8, 0]);
        h.update(Sha256::digest(value));
        let want: [u8; 32] = h.finalize().into();
        assert_eq!(policy_digest(value), want);
    }

    #[test]
    fn phases_extend_word_by_word() {
        let stub = [7u8; 32];
        assert_eq!(phase_value(stub, ""), stub);
        let sysinit = crate::uki::extend(stub, b"sysinit");
        assert_eq!(phase_value(stub, "sysinit"), sysinit);
        assert_eq!(
            phase_value(stub, "sysinit:ready"),
            crate::uki::extend(sysinit, b"ready")
        );
    }

    #[test]
    fn a_policy_is_checked_and_a_changed_one_refused() {
        let key = test_key();
        let stub = [3u8; 32];
        let sig = key.sign(stub, &PHASES).unwrap();
        let json = serde_json::to_vec(&sig).unwrap();
        let pkey = key.public_pem().as_bytes();
        let got = check(pkey, &json, stub, &KNOWN_PHASES).unwrap();
        assert_eq!(got.phases, ["", "sysinit", "sysinit:ready"]);
        // Another UKI (another stub value): the signatures are for values it never leaves.
        let err = check(pkey, &json, [4u8; 32], &KNOWN_PHASES).unwrap_err();
        assert!(err.to_string().contains("never leaves"), "{err}");
        // A signature moved to another policy digest does not verify.
        let mut moved = sig.clone();
        moved.sha256[1].pol = moved.sha256[0].pol.clone();
        let err = check(
            pkey,
            &serde_json::to_vec(&moved).unwrap(),
            stub,
            &KNOWN_PHASES,
        );
        assert!(err.unwrap_err().to_string().contains("does not verify"));
        // Another key's public half.
        let other = test_key();
        let err = check(other.public_pem().as_bytes(), &json, stub, &KNOWN_PHASES);
        assert!(err.unwrap_err().to_string().contains("names key"));
        assert!(matches!(
            check(pkey, b"{\"sha256\":[]}", stub, &KNOWN_PHASES),
            Err(PcrPolicyError::Empty)
        ));
    }

    #[test]
    fn a_small_or_foreign_key_is_refused() {
        use rsa::pkcs8::EncodePrivateKey;
        let small = RsaPrivateKey::new(&mut rand::rngs::OsRng, 1024).unwrap();
        let pem = small.to_pkcs8_pem(LineEnding::LF).unwrap();
        assert!(matches!(
            PcrKey::from_pem(&pem),
            Err(PcrPolicyError::KeyTooSmall { bits: 1024 })
        ));
        let ed = "-----BEGIN PRIVATE KEY-----\nMC4CAQAwBQYDK2VwBCIEIE5ZQ1pRcCVyRm2cMY3kQ3YwIHyTq7QdgWvY1jAGn5kG\n-----END PRIVATE KEY-----\n";
        assert!(matches!(PcrKey::from_pem(ed), Err(PcrPolicyError::Key(_))));
    }

    fn test_key() -> PcrKey {
        use rsa::pkcs8::EncodePrivateKey;
        let key = RsaPrivateKey::new(&mut rand::rngs::OsRng, 2048).unwrap();
        PcrKey::from_pem(&key.to_pkcs8_pem(LineEnding::LF).unwrap()).unwrap()
    }
}
