//! `ingot publish --cosign-key`: attach a cosign signature of a pushed manifest, under the
//! `sha256-<HEX>.sig` tag of the same repository. A signature manifest already there is kept and
//! the new signature appended as one more layer, unless the same one is there (as cosign does).

use super::payload;
use super::sig_manifest::{SigLayer, SigManifest};
use super::{signature_tag, SigningKey};
use crate::oci_layout::{sha256_digest, MANIFEST_MEDIA_TYPE};
use crate::registry::{Registry, RegistryError, RegistryRef};

/// What [`attach`] did.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Attached {
    /// The tag written (`sha256-HEX.sig`).
    pub tag: String,
    /// The signature manifest's digest after the push.
    pub manifest_digest: String,
    /// The same signature was there already: nothing pushed.
    pub unchanged: bool,
    /// Signatures in the manifest now.
    pub signatures: usize,
}

/// The `docker-reference` a payload names for `target`: `HOST[:PORT]/PATH`, no tag or digest.
pub fn docker_reference(target: &RegistryRef) -> String {
    format!("{}/{}", target.registry, target.repository)
}

/// Signs the manifest `digest` in `target`'s repository with `key` and pushes the signature to
/// the origin (never a mirror).
pub fn attach(
    reg: &Registry,
    target: &RegistryRef,
    digest: &str,
    key: &SigningKey,
) -> Result<Attached, RegistryError> {
    let tag = signature_tag(digest);
    let sig_ref = target.with_tag(&tag);
    let mut sigs = existing(reg, &sig_ref)?;
    let payload = payload::build(&docker_reference(target), digest);
    let layer = SigLayer {
        digest: sha256_digest(&payload),
        size: payload.len() as u64,
        signature: key.sign(&payload),
    };
    let added = sigs.add(&layer);
    let config = sigs.config();
    let manifest = sigs.manifest(&config);
    let mut done = Attached {
        tag,
        manifest_digest: sha256_digest(&manifest),
        unchanged: !added,
        signatures: sigs.signatures().len(),
    };
    if added {
        reg.push_blob_bytes(&sig_ref, &payload)?;
        reg.push_blob_bytes(&sig_ref, &config)?;
        done.manifest_digest = reg.push_manifest(&sig_ref, &manifest, MANIFEST_MEDIA_TYPE)?;
    }
    Ok(done)
}

/// The signature manifest at the origin under `sig_ref`'s tag, or an empty one.
fn existing(reg: &Registry, sig_ref: &RegistryRef) -> Result<SigManifest, RegistryError> {
    match reg.fetch_manifest_at_origin(sig_ref) {
        Ok((bytes, _)) => SigManifest::parse(&bytes).map_err(|e| {
            RegistryError::Protocol(format!(
                "{sig_ref} holds no cosign signature manifest ({e}): refusing to replace it"
            ))
        }),
        Err(RegistryError::NotFound(_)) => Ok(SigManifest { layers: vec![] }),
        Err(e) => Err(e),
    }
}
