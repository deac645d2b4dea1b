//! The image manifest under a `sha256-<HEX>.sig` tag: a config blob as cosign writes it (an
//! empty image's config whose `rootfs.diff_ids` list the layers) and one layer per signature,
//! of media type [`SIMPLESIGNING_MEDIA_TYPE`], whose blob is the payload and whose annotation
//! [`SIGNATURE_ANNOTATION`] holds the base64 signature.

use std::collections::BTreeMap;

use crate::oci_layout::{sha256_digest, Descriptor, ImageManifest, MANIFEST_MEDIA_TYPE};

/// A signature layer's media type.
pub const SIMPLESIGNING_MEDIA_TYPE: &str = "application/vnd.dev.cosign.simplesigning.v1+json";
/// The layer annotation holding the base64 signature.
pub const SIGNATURE_ANNOTATION: &str = "dev.cosignproject.cosign/signature";
/// The config blob's media type.
pub const CONFIG_MEDIA_TYPE: &str = "application/vnd.oci.image.config.v1+json";
/// The largest signature manifest read (one layer is about 300 bytes).
pub const MAX_SIG_MANIFEST_SIZE: u64 = 1 << 20;

#[derive(Debug, thiserror::Error)]
pub enum SigManifestError {
    #[error("the signature manifest is {size} bytes; at most {MAX_SIG_MANIFEST_SIZE} are read")]
    TooLarge { size: u64 },
    #[error("the signature manifest is not an OCI image manifest: {0}")]
    Json(String),
    #[error("the signature manifest has no `{SIMPLESIGNING_MEDIA_TYPE}` layer with a `{SIGNATURE_ANNOTATION}` annotation")]
    NoSignature,
}

/// One signature: the payload blob and the signature over it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct SigLayer {
    /// The payload blob's digest.
    pub digest: String,
    /// The payload blob's size.
    pub size: u64,
    /// The base64 signature.
    pub signature: String,
}

/// A signature manifest: its layers, as they are (to append to), and the signatures in them.
#[derive(Debug, Clone)]
pub struct SigManifest {
    /// Every layer descriptor, in order.
    pub layers: Vec<Descriptor>,
}

impl SigManifest {
    /// Parses a signature manifest (bounded; the layers' blobs are not read here).
    pub fn parse(bytes: &[u8]) -> Result<Self, SigManifestError> {
        if bytes.len() as u64 > MAX_SIG_MANIFEST_SIZE {
            return Err(SigManifestError::TooLarge {
                size: bytes.len() as u64,
            });
        }
        let m: ImageManifest =
            serde_json::from_slice(bytes).map_err(|e| SigManifestError::Json(e.to_string()))?;
        Ok(SigManifest { layers: m.layers })
    }

    /// The signature layers (simple-signing media type, signature annotation present).
    pub fn signatures(&self) -> Vec<SigLayer> {
        self.layers
            .iter()
            .filter(|d| d.media_type == SIMPLESIGNING_MEDIA_TYPE)
            .filter_map(|d| {
                Some(SigLayer {
                    digest: d.digest.clone(),
                    size: d.size,
                    signature: d.annotations.as_ref()?.get(SIGNATURE_ANNOTATION)?.clone(),
                })
            })
            .collect()
    }

    /// Adds `sig` as a new layer unless the same payload with the same signature is there.
    /// Returns whether it was added.
    pub fn add(&mut self, sig: &SigLayer) -> bool {
        if self.signatures().contains(sig) {
            return false;
        }
        let mut d = Descriptor::new(SIMPLESIGNING_MEDIA_TYPE, sig.digest.clone(), sig.size);
        d.annotations = Some(BTreeMap::from([(
            SIGNATURE_ANNOTATION.to_owned(),
            sig.signature.clone(),
        )]));
        self.layers.push(d);
        true
    }

    /// The config blob cosign writes for these layers: an empty image whose diff ids are the
    /// layers' digests, one history entry each.
    pub fn config(&self) -> Vec<u8> {
        let zero = "0001-01-01T00:00:00Z";
        let diff_ids: Vec<&str> = self.layers.iter().map(|d| d.digest.as_str()).collect();
        let history: Vec<_> = self
            .layers
            .iter()
            .map(|_| serde_json::json!({ "created": zero }))
            .collect();
        let config = serde_json::json!({
            "architecture": "",
            "created": zero,
            "history": history,
            "os": "",
            "rootfs": { "type": "layers", "diff_ids": diff_ids },
            "config": {},
        });
        serde_json::to_vec(&config).expect("serialisable")
    }

    /// The manifest bytes for `config` (from [`SigManifest::config`]).
    pub fn manifest(&self, config: &[u8]) -> Vec<u8> {
        let m = ImageManifest {
            schema_version: 2,
            media_type: Some(MANIFEST_MEDIA_TYPE.to_owned()),
            artifact_type: None,
            config: Descriptor::new(
                CONFIG_MEDIA_TYPE,
                sha256_digest(config),
                config.len() as u64,
            ),
            layers: self.layers.clone(),
            annotations: None,
        };
        serde_json::to_vec(&m).expect("serialisable")
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn sig(n: u8) -> SigLayer {
        SigLayer {
            digest: format!("sha256:{}", hex::encode([n; 32])),
            size: 10,
            signature: format!("sig{n}"),
        }
    }

    #[test]
    fn build_parse_and_append_once() {
        let mut m = SigManifest { layers: vec![] };
        assert!(m.add(&sig(1)));
        assert!(!m.add(&sig(1)));
        assert!(m.add(&sig(2)));
        let bytes = m.manifest(&m.config());
        let back = SigManifest::parse(&bytes).unwrap();
        assert_eq!(back.signatures(), vec![sig(1), sig(2)]);
        let v: serde_json::Value = serde_json::from_slice(&m.config()).unwrap();
        assert_eq!(v["rootfs"]["diff_ids"][1], sig(2).digest.as_str());
    }

    #[test]
    fn garbage_is_refused() {
        assert!(matches!(
            SigManifest::parse(b"{\"layers\":1}"),
            Err(SigManifestError::Json(_))
        ));
        let big = vec![b' '; MAX_SIG_MANIFEST_SIZE as usize + 1];
        assert!(matches!(
            SigManifest::parse(&big),
            Err(SigManifestError::TooLarge { .. })
        ));
    }
}
