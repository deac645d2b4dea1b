//! A cosign signature as the trust anchor: some layer of the `sha256-<HEX>.sig` manifest must
//! verify with the trusted key, and its payload must name exactly the manifest digest checked.
//! The manifest's bytes hash to that digest and its config digest pins the stack descriptor, so
//! the descriptor is trusted through it.

use super::payload::{self, Signed, MAX_PAYLOAD_SIZE};
use super::sig_manifest::{SigLayer, SigManifest, SigManifestError};
use super::PublicKey;

#[derive(Debug, thiserror::Error)]
pub enum CosignCheckError {
    #[error(
        "the trusted key is a cosign key ({key}), and {source_name} has no cosign signature: no \
         manifest tagged `{tag}`"
    )]
    NoSignature {
        key: String,
        source_name: String,
        tag: String,
    },
    #[error("the cosign signature manifest `{tag}` of {source_name}")]
    Manifest {
        tag: String,
        source_name: String,
        #[source]
        source: SigManifestError,
    },
    #[error(
        "no cosign signature under `{tag}` verifies with the trusted key {key} (key id \
         {key_id}): {}",
        reasons.join("; ")
    )]
    Rejected {
        tag: String,
        key: String,
        key_id: String,
        reasons: Vec<String>,
    },
}

/// Checks the signature manifest `sig_manifest` (the bytes under `tag`, if any) against `key`
/// and `manifest_digest`. `blob` fetches a payload by digest and size (checked by the caller's
/// store). Returns what the signature that verified says.
pub fn check(
    key: &PublicKey,
    manifest_digest: &str,
    tag: &str,
    source_name: &str,
    sig_manifest: Option<&[u8]>,
    blob: &dyn Fn(&SigLayer) -> Result<Vec<u8>, String>,
) -> Result<Signed, CosignCheckError> {
    let Some(bytes) = sig_manifest else {
        return Err(CosignCheckError::NoSignature {
            key: key.from().to_owned(),
            source_name: source_name.to_owned(),
            tag: tag.to_owned(),
        });
    };
    let m = SigManifest::parse(bytes).map_err(|source| CosignCheckError::Manifest {
        tag: tag.to_owned(),
        source_name: source_name.to_owned(),
        source,
    })?;
    let mut reasons = Vec::new();
    for (i, layer) in m.signatures().iter().enumerate() {
        match check_layer(key, manifest_digest, layer, blob) {
            Ok(signed) => return Ok(signed),
            Err(why) => reasons.push(format!("signature {i}: {why}")),
        }
    }
    if reasons.is_empty() {
        reasons.push(SigManifestError::NoSignature.to_string());
    }
    Err(CosignCheckError::Rejected {
        tag: tag.to_owned(),
        key: key.from().to_owned(),
        key_id: key.key_id(),
        reasons,
    })
}

fn check_layer(
    key: &PublicKey,
    manifest_digest: &str,
    layer: &SigLayer,
    blob: &dyn Fn(&SigLayer) -> Result<Vec<u8>, String>,
) -> Result<Signed, String> {
    if layer.size > MAX_PAYLOAD_SIZE {
        return Err(format!(
            "its payload is {} bytes (at most {MAX_PAYLOAD_SIZE})",
            layer.size
        ));
    }
    let payload = blob(layer)?;
    key.verify(&payload, &layer.signature)
        .map_err(|e| e.to_string())?;
    let signed = payload::parse(&payload).map_err(|e| e.to_string())?;
    if signed.manifest_digest != manifest_digest {
        return Err(format!(
            "it signs the manifest {}, not {manifest_digest}",
            signed.manifest_digest
        ));
    }
    Ok(signed)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::cosign::SigningKey;
    use crate::oci_layout::sha256_digest;

    fn signed_by(key: &SigningKey, digest: &str) -> (Vec<u8>, Vec<u8>) {
        let payload = payload::build("r/a", digest);
        let mut m = SigManifest { layers: vec![] };
        m.add(&SigLayer {
            digest: sha256_digest(&payload),
            size: payload.len() as u64,
            signature: key.sign(&payload),
        });
        (m.manifest(&m.config()), payload)
    }

    #[test]
    fn verifies_only_the_right_key_and_digest() {
        let key = SigningKey::generate();
        let digest = format!("sha256:{}", "12".repeat(32));
        let (m, payload) = signed_by(&key, &digest);
        let blob = |_: &SigLayer| Ok(payload.clone());
        let pk = key.public_key();
        let ok = check(&pk, &digest, "t.sig", "s", Some(&m), &blob).unwrap();
        assert_eq!(ok.manifest_digest, digest);
        let other = SigningKey::generate().public_key();
        let e = check(&other, &digest, "t.sig", "s", Some(&m), &blob).unwrap_err();
        assert!(
            e.to_string().contains("does not verify with the key"),
            "{e}"
        );
        let wrong = format!("sha256:{}", "34".repeat(32));
        let e = check(&pk, &wrong, "t.sig", "s", Some(&m), &blob).unwrap_err();
        assert!(e.to_string().contains("not sha256:3434"), "{e}");
        let e = check(&pk, &digest, "t.sig", "s", None, &blob).unwrap_err();
        assert!(e.to_string().contains("no manifest tagged `t.sig`"), "{e}");
    }
}
