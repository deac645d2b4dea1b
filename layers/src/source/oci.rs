//! The flattened filesystem of an image in an OCI image layout: the manifest's layers applied in
//! order, with whiteouts. Every blob read is checked against its digest first.

use std::fs::File;
use std::io::Read;
use std::path::{Path, PathBuf};

use sha2::{Digest, Sha256};

use crate::error::LayerError;
use crate::tree::Tree;

fn oci_err(path: &Path, reason: impl Into<String>) -> LayerError {
    LayerError::Oci {
        path: path.to_path_buf(),
        reason: reason.into(),
    }
}

/// `blobs/<alg>/<hex>` for a digest, refusing anything but sha256 with 64 hex digits.
fn blob_path(layout: &Path, digest: &str) -> Result<PathBuf, LayerError> {
    let hex = digest
        .strip_prefix("sha256:")
        .filter(|h| {
            h.len() == 64
                && h.bytes()
                    .all(|b| b.is_ascii_hexdigit() && !b.is_ascii_uppercase())
        })
        .ok_or_else(|| {
            oci_err(
                layout,
                format!("unsupported or malformed digest {digest:?}"),
            )
        })?;
    Ok(layout.join("blobs").join("sha256").join(hex))
}

fn check_digest(layout: &Path, path: &Path, digest: &str) -> Result<(), LayerError> {
    let mut f = File::open(path).map_err(|e| LayerError::io("opening", path, e))?;
    let mut h = Sha256::new();
    let mut buf = vec![0u8; 1 << 20];
    loop {
        let n = f
            .read(&mut buf)
            .map_err(|e| LayerError::io("reading", path, e))?;
        if n == 0 {
            break;
        }
        h.update(&buf[..n]);
    }
    let got = format!("sha256:{}", hex::encode(h.finalize()));
    if got != digest {
        return Err(oci_err(layout, format!("blob {digest} has digest {got}")));
    }
    Ok(())
}

fn read_json(layout: &Path, path: &Path) -> Result<serde_json::Value, LayerError> {
    let text = std::fs::read(path).map_err(|e| LayerError::io("reading", path, e))?;
    serde_json::from_slice(&text).map_err(|e| oci_err(layout, format!("{}: {e}", path.display())))
}

pub(super) fn load(
    layout: &Path,
    manifest_digest: &str,
    scratch: &Path,
) -> Result<Tree, LayerError> {
    let digest = if manifest_digest.is_empty() {
        let index = read_json(layout, &layout.join("index.json"))?;
        let manifests = index["manifests"].as_array().cloned().unwrap_or_default();
        match manifests.as_slice() {
            [one] => one["digest"].as_str().unwrap_or_default().to_string(),
            _ => {
                return Err(oci_err(
                    layout,
                    format!(
                        "index.json lists {} manifests; name one by digest",
                        manifests.len()
                    ),
                ))
            }
        }
    } else {
        manifest_digest.to_string()
    };
    let mpath = blob_path(layout, &digest)?;
    check_digest(layout, &mpath, &digest)?;
    let manifest = read_json(layout, &mpath)?;
    let layers = manifest["layers"].as_array().ok_or_else(|| {
        oci_err(
            layout,
            format!("manifest {digest} has no layers (is it an image index?)"),
        )
    })?;
    let mut tree = Tree::new();
    for (i, layer) in layers.iter().enumerate() {
        let ld = layer["digest"]
            .as_str()
            .ok_or_else(|| oci_err(layout, format!("layer {i} of {digest} has no digest")))?;
        let media = layer["mediaType"].as_str().unwrap_or_default();
        if !(media.contains("layer") || media.contains("rootfs")) {
            return Err(oci_err(
                layout,
                format!("layer {i} has media type {media:?}, not a filesystem layer"),
            ));
        }
        let lpath = blob_path(layout, ld)?;
        check_digest(layout, &lpath, ld)?;
        tracing::debug!(layer = i, digest = ld, "applying OCI layer");
        super::tar::apply(&mut tree, &lpath, scratch, true)?;
    }
    Ok(tree)
}
