//! The flattened filesystem of an image in an OCI image layout: the manifest's layers applied in
//! order, with whiteouts. Every blob read is checked against its digest first.

use std::io::Read;
use std::path::{Path, PathBuf};

use ingot_verity::input::{self, Symlinks};
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

/// Checks the blob at `path` hashes to `digest`, streaming it: a regular file only (a FIFO or
/// `/dev/zero` in its place is refused, not read forever), of the size its descriptor gives.
fn check_digest(layout: &Path, path: &Path, digest: &str, size: u64) -> Result<(), LayerError> {
    let f = input::open_regular(path, Symlinks::Follow)
        .map_err(|e| LayerError::io("opening", path, e))?;
    let len = f
        .metadata()
        .map_err(|e| LayerError::io("reading", path, e))?
        .len();
    if len != size {
        return Err(oci_err(
            layout,
            format!("blob {digest} is {len} bytes, its descriptor says {size}"),
        ));
    }
    let mut h = Sha256::new();
    let mut buf = vec![0u8; 1 << 20];
    // One byte more than the descriptor's size: a file that grows is caught, not read on.
    let mut f = f.take(size.saturating_add(1));
    let mut read = 0u64;
    loop {
        let n = f
            .read(&mut buf)
            .map_err(|e| LayerError::io("reading", path, e))?;
        if n == 0 {
            break;
        }
        read += n as u64;
        h.update(&buf[..n]);
    }
    if read != size {
        return Err(oci_err(
            layout,
            format!("blob {digest} changed size while being read ({read} bytes, not {size})"),
        ));
    }
    let got = format!("sha256:{}", hex::encode(h.finalize()));
    if got != digest {
        return Err(oci_err(layout, format!("blob {digest} has digest {got}")));
    }
    Ok(())
}

/// The largest `index.json` or manifest read: 4 MiB, the distribution spec's manifest limit.
const MAX_JSON_SIZE: u64 = 4 << 20;

fn read_small(path: &Path) -> Result<Vec<u8>, LayerError> {
    input::read_bounded(path, MAX_JSON_SIZE, Symlinks::Follow)
        .map_err(|e| LayerError::io("reading", path, e))
}

fn parse_json(layout: &Path, path: &Path, bytes: &[u8]) -> Result<serde_json::Value, LayerError> {
    serde_json::from_slice(bytes).map_err(|e| oci_err(layout, format!("{}: {e}", path.display())))
}

pub(super) fn load(
    layout: &Path,
    manifest_digest: &str,
    scratch: &Path,
) -> Result<Tree, LayerError> {
    let digest = if manifest_digest.is_empty() {
        let path = layout.join("index.json");
        let index = parse_json(layout, &path, &read_small(&path)?)?;
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
    let bytes = read_small(&mpath)?;
    let got = format!("sha256:{}", hex::encode(Sha256::digest(&bytes)));
    if got != digest {
        return Err(oci_err(layout, format!("blob {digest} has digest {got}")));
    }
    let manifest = parse_json(layout, &mpath, &bytes)?;
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
        let size = layer["size"]
            .as_u64()
            .ok_or_else(|| oci_err(layout, format!("layer {i} of {digest} has no size")))?;
        let lpath = blob_path(layout, ld)?;
        check_digest(layout, &lpath, ld, size)?;
        tracing::debug!(layer = i, digest = ld, "applying OCI layer");
        super::tar::apply(&mut tree, &lpath, scratch, true)?;
    }
    Ok(tree)
}
