//! The one OCI image layout reader of the tests: `index.json` → manifest → stack descriptor, as
//! plain JSON, so a test sees the bytes the writer and the registry see.

use std::path::{Path, PathBuf};

use serde_json::Value;

/// A layout, read back.
pub struct Layout {
    pub dir: PathBuf,
    pub manifest_digest: String,
    pub manifest: Value,
    pub descriptor: Value,
    pub descriptor_bytes: Vec<u8>,
}

/// Where blob `digest` (`sha256:…`) of the layout at `dir` is stored.
pub fn blob_path(dir: &Path, digest: &str) -> PathBuf {
    dir.join("blobs/sha256")
        .join(digest.strip_prefix("sha256:").expect("sha256 digest"))
}

fn json(path: &Path) -> Value {
    let bytes = std::fs::read(path).unwrap_or_else(|e| panic!("{}: {e}", path.display()));
    serde_json::from_slice(&bytes).unwrap_or_else(|e| panic!("{}: {e}", path.display()))
}

/// The manifest `index.json` names first, and its digest.
pub fn manifest(dir: &Path) -> (String, Value) {
    let index = json(&dir.join("index.json"));
    let digest = index["manifests"][0]["digest"]
        .as_str()
        .expect("index.json names a manifest")
        .to_owned();
    let manifest = json(&blob_path(dir, &digest));
    (digest, manifest)
}

/// Reads the layout at `dir`.
pub fn read(dir: &Path) -> Layout {
    let (manifest_digest, manifest) = manifest(dir);
    let config = manifest["config"]["digest"].as_str().expect("a config");
    let descriptor_bytes = std::fs::read(blob_path(dir, config)).expect("the descriptor blob");
    let descriptor = serde_json::from_slice(&descriptor_bytes).expect("the descriptor's JSON");
    Layout {
        dir: dir.to_owned(),
        manifest_digest,
        manifest,
        descriptor,
        descriptor_bytes,
    }
}

impl Layout {
    /// The data blob's path of layer `name`.
    pub fn data_blob(&self, name: &str) -> PathBuf {
        blob_path(
            &self.dir,
            self.layer(name)["data"]["digest"].as_str().unwrap(),
        )
    }

    /// Layer `name` of the descriptor.
    pub fn layer(&self, name: &str) -> &Value {
        self.descriptor["layers"]
            .as_array()
            .unwrap()
            .iter()
            .find(|l| l["name"] == name)
            .unwrap_or_else(|| panic!("no layer {name}"))
    }

    /// The SPDX document (SBOM) of layer `name`: its blob's path and its JSON.
    pub fn sbom(&self, name: &str) -> (PathBuf, Value) {
        let digest = self.layer(name)["sbom"]["digest"]
            .as_str()
            .unwrap_or_else(|| panic!("layer {name} has no SBOM"));
        let path = blob_path(&self.dir, digest);
        let value = json(&path);
        (path, value)
    }

    /// Every layer's name and root hash, in stacking order.
    pub fn root_hashes(&self) -> Vec<(String, String)> {
        self.descriptor["layers"]
            .as_array()
            .unwrap()
            .iter()
            .map(|l| {
                (
                    l["name"].as_str().unwrap().to_owned(),
                    l["verity"]["rootHash"].as_str().unwrap().to_owned(),
                )
            })
            .collect()
    }
}
