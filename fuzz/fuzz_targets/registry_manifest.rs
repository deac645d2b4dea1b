//! What a registry can answer for a manifest or an index: the OCI types parse it or refuse it
//! without panicking, and `verify_metadata` over an artifact whose manifest is these bytes (its
//! blobs: the demo's descriptor, or the bytes themselves) refuses or accepts without panicking.
//! An input may carry a descriptor after a NUL byte: `MANIFEST\0DESCRIPTOR`.
#![no_main]

use std::collections::BTreeMap;
use std::path::PathBuf;

use ingot_artifact::oci_layout::{sha256_digest, ImageIndex, ImageManifest};
use ingot_artifact::verify::{verify_metadata, ArtifactSource, Trust, VerifyError};
use libfuzzer_sys::fuzz_target;

/// An artifact held in memory: one manifest and blobs by digest.
struct Memory {
    manifest: Vec<u8>,
    blobs: BTreeMap<String, Vec<u8>>,
}

impl ArtifactSource for Memory {
    fn describe(&self) -> String {
        "fuzz input".into()
    }

    fn manifest(&self) -> Result<(Vec<u8>, String), VerifyError> {
        Ok((self.manifest.clone(), sha256_digest(&self.manifest)))
    }

    fn blob(&self, digest: &str, size: u64) -> Result<Vec<u8>, VerifyError> {
        match self.blobs.get(digest) {
            Some(b) if b.len() as u64 == size => Ok(b.clone()),
            _ => Err(VerifyError::Missing {
                digest: digest.to_owned(),
                size,
            }),
        }
    }

    fn blob_file(&self, digest: &str, size: u64) -> Result<PathBuf, VerifyError> {
        Err(VerifyError::Missing {
            digest: digest.to_owned(),
            size,
        })
    }
}

fuzz_target!(|data: &[u8]| {
    let _ = serde_json::from_slice::<ImageManifest>(data);
    let _ = serde_json::from_slice::<ImageIndex>(data);
    let (manifest, descriptor) = match data.iter().position(|&b| b == 0) {
        Some(i) => (&data[..i], &data[i + 1..]),
        None => (data, data),
    };
    let blobs = BTreeMap::from([(sha256_digest(descriptor), descriptor.to_vec())]);
    let source = Memory {
        manifest: manifest.to_vec(),
        blobs,
    };
    let trust = Trust {
        key: None,
        allow_unsigned: true,
    };
    if let Ok((report, parsed)) = verify_metadata(&source, &trust) {
        // Whatever is accepted names only well-formed layers.
        assert!(!report.descriptor.layers.is_empty());
        assert!(parsed.layers.len() >= report.descriptor.layers.len());
    }
});
