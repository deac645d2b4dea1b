//! Preloaded container images: pulled by digest, verified, and stored in the control-plane layer
//! as OCI image layout archives that `ctr images import` reads with no network.
//!
//! Boot contract: every image sits at `/usr/lib/ingot/preload/<name>.oci.tar` ([`PRELOAD_DIR`])
//! in the control-plane layer. The archive is an OCI image layout in a tar: `oci-layout`,
//! `index.json` (one entry, annotated with `io.containerd.image.name` = the full reference and
//! `org.opencontainers.image.ref.name` = its tag) and every blob the image needs. On first boot
//! the base's `ingot-preload.service` imports each into containerd's `k8s.io` namespace, unpacked
//! and pinned, and pulls nothing. The images live under `/usr`, not `/var`: the var partition is
//! mounted over `/var` (boot contract v2).
//!
//! The archive is deterministic: entries in a fixed order, every mtime = `source_date_epoch`,
//! owner 0:0, modes 0644/0755.

use std::collections::{BTreeMap, BTreeSet};
use std::io::{self, Write};
use std::path::Path;

use ingot_layers::descriptor::PreloadEntry;

use crate::manifest::{ImageSource, PreloadSpec};
use ingot_artifact::oci_layout::{
    Descriptor, ImageIndex, Layout, LayoutError, CONTAINERD_IMAGE_NAME, DOCKER_LIST_MEDIA_TYPE,
    DOCKER_MANIFEST_MEDIA_TYPE, INDEX_MEDIA_TYPE, LAYOUT_FILE, MANIFEST_MEDIA_TYPE, REF_NAME,
};

/// Where preloaded images live in the control-plane layer.
pub const PRELOAD_DIR: &str = "/usr/lib/ingot/preload";

/// Deepest index nesting followed (index → index → manifest).
const MAX_NESTING: usize = 4;

/// Why an image could not be preloaded.
#[derive(Debug, thiserror::Error)]
pub enum PreloadError {
    /// The layout or one of the image's blobs is missing or fails its digest.
    #[error("preload `{name}`")]
    Layout {
        /// The preload's name.
        name: String,
        /// What went wrong.
        source: LayoutError,
    },
    /// A manifest or index is malformed.
    #[error("preload `{name}`: {reason}")]
    Format {
        /// The preload's name.
        name: String,
        /// What is wrong.
        reason: String,
    },
    /// Writing the archive failed.
    #[error("preload `{name}`: writing the archive")]
    Io {
        /// The preload's name.
        name: String,
        /// The error.
        source: io::Error,
    },
}

/// The path of a preload archive inside the layer.
pub fn archive_path(name: &str) -> String {
    format!("{PRELOAD_DIR}/{name}.oci.tar")
}

/// The tag of a reference (`registry/repo:tag` → `tag`), or `latest`.
fn tag_of(reference: &str) -> &str {
    let last = reference.rsplit('/').next().unwrap_or(reference);
    match last.split_once('@') {
        Some((before, _)) => before.split_once(':').map_or("latest", |(_, t)| t),
        None => last.split_once(':').map_or("latest", |(_, t)| t),
    }
}

/// Every blob an image needs, with its verified bytes, by digest.
struct Collected {
    blobs: BTreeMap<String, Vec<u8>>,
    root: Descriptor,
}

fn collect(layout: &Layout, spec: &PreloadSpec) -> Result<Collected, PreloadError> {
    let name = &spec.name;
    let lerr = |source| PreloadError::Layout {
        name: name.clone(),
        source,
    };
    let ferr = |reason: String| PreloadError::Format {
        name: name.clone(),
        reason,
    };
    // The pinned manifest: its size comes from the file; its digest is the pin, so reading it
    // by digest checks it.
    let path = layout.blob_path(&spec.digest).map_err(lerr)?;
    let size = std::fs::metadata(&path)
        .map_err(|_| {
            lerr(LayoutError::Missing {
                digest: spec.digest.clone(),
                path: path.clone(),
            })
        })?
        .len();
    let mut blobs = BTreeMap::new();
    let root_bytes = layout.read_small_blob(&spec.digest, size).map_err(lerr)?;
    let root_type =
        media_type_of(&root_bytes).map_err(|e| ferr(format!("manifest {}: {e}", spec.digest)))?;
    let root = Descriptor::new(&root_type, spec.digest.clone(), size);
    let mut queue = vec![(root_type, spec.digest.clone(), root_bytes, 0usize)];
    while let Some((media_type, digest, bytes, depth)) = queue.pop() {
        let v: serde_json::Value = serde_json::from_slice(&bytes)
            .map_err(|e| ferr(format!("manifest {digest} is not JSON: {e}")))?;
        let mut children: Vec<(Descriptor, bool)> = Vec::new();
        let descs = |key: &str| -> Result<Vec<Descriptor>, PreloadError> {
            match v.get(key) {
                None => Ok(Vec::new()),
                Some(x) => serde_json::from_value(x.clone())
                    .map_err(|e| ferr(format!("manifest {digest}: `{key}`: {e}"))),
            }
        };
        if media_type == INDEX_MEDIA_TYPE || media_type == DOCKER_LIST_MEDIA_TYPE {
            if depth >= MAX_NESTING {
                return Err(ferr(format!("index {digest} nests too deeply")));
            }
            for d in descs("manifests")? {
                children.push((d, true));
            }
        } else {
            let config = v
                .get("config")
                .ok_or_else(|| ferr(format!("manifest {digest} has no config")))?;
            let config: Descriptor = serde_json::from_value(config.clone())
                .map_err(|e| ferr(format!("manifest {digest}: config: {e}")))?;
            children.push((config, false));
            for d in descs("layers")? {
                children.push((d, false));
            }
        }
        blobs.insert(digest, bytes);
        for (d, is_manifest) in children {
            if blobs.contains_key(&d.digest) {
                continue;
            }
            let bytes = if is_manifest {
                layout.read_small_blob(&d.digest, d.size)
            } else {
                layout.read_blob(&d.digest, d.size)
            }
            .map_err(lerr)?;
            if is_manifest {
                queue.push((d.media_type.clone(), d.digest.clone(), bytes, depth + 1));
            } else {
                blobs.insert(d.digest.clone(), bytes);
            }
        }
    }
    Ok(Collected { blobs, root })
}

/// The media type a manifest or index declares (or implies).
fn media_type_of(bytes: &[u8]) -> Result<String, String> {
    let v: serde_json::Value = serde_json::from_slice(bytes).map_err(|e| e.to_string())?;
    if let Some(mt) = v.get("mediaType").and_then(|m| m.as_str()) {
        return match mt {
            MANIFEST_MEDIA_TYPE
            | INDEX_MEDIA_TYPE
            | DOCKER_MANIFEST_MEDIA_TYPE
            | DOCKER_LIST_MEDIA_TYPE => Ok(mt.to_owned()),
            other => Err(format!("unsupported media type `{other}`")),
        };
    }
    if v.get("manifests").is_some() {
        Ok(INDEX_MEDIA_TYPE.to_owned())
    } else if v.get("config").is_some() {
        Ok(MANIFEST_MEDIA_TYPE.to_owned())
    } else {
        Err("neither an image manifest nor an index".to_owned())
    }
}

fn header(path: &str, size: u64, mode: u32, mtime: u64, dir: bool) -> tar::Header {
    let mut h = tar::Header::new_ustar();
    h.set_path(path).expect("short ASCII path");
    h.set_size(size);
    h.set_mode(mode);
    h.set_mtime(mtime);
    h.set_uid(0);
    h.set_gid(0);
    h.set_username("root").expect("short name");
    h.set_groupname("root").expect("short name");
    h.set_entry_type(if dir {
        tar::EntryType::Directory
    } else {
        tar::EntryType::Regular
    });
    h.set_cksum();
    h
}

/// Fetch, verify and archive one image into `out`. Returns what the descriptor records.
pub fn write_archive(
    spec: &PreloadSpec,
    mtime: u64,
    out: &mut dyn Write,
) -> Result<PreloadEntry, PreloadError> {
    let ImageSource::OciLayout(dir) = &spec.source;
    let layout = Layout::open(dir).map_err(|source| PreloadError::Layout {
        name: spec.name.clone(),
        source,
    })?;
    let collected = collect(&layout, spec)?;
    let ioerr = |source| PreloadError::Io {
        name: spec.name.clone(),
        source,
    };

    let mut root = collected.root.clone();
    root.annotations = Some(BTreeMap::from([
        (CONTAINERD_IMAGE_NAME.to_owned(), spec.reference.clone()),
        (REF_NAME.to_owned(), tag_of(&spec.reference).to_owned()),
    ]));
    let index = ImageIndex {
        schema_version: 2,
        media_type: Some(INDEX_MEDIA_TYPE.to_owned()),
        manifests: vec![root],
        annotations: None,
    };
    let index_bytes =
        ingot_layers::descriptor::canonical_json(&index).map_err(|e| ioerr(io::Error::other(e)))?;

    let mut tar = tar::Builder::new(out);
    for (path, bytes) in [
        ("oci-layout", LAYOUT_FILE.as_bytes()),
        ("index.json", &index_bytes[..]),
    ] {
        let h = header(path, bytes.len() as u64, 0o644, mtime, false);
        tar.append(&h, bytes).map_err(ioerr)?;
    }
    for dir in ["blobs/", "blobs/sha256/"] {
        tar.append(&header(dir, 0, 0o755, mtime, true), io::empty())
            .map_err(ioerr)?;
    }
    let mut seen = BTreeSet::new();
    for (digest, bytes) in &collected.blobs {
        if seen.insert(digest) {
            let path = format!("blobs/sha256/{}", &digest[7..]);
            tar.append(
                &header(&path, bytes.len() as u64, 0o644, mtime, false),
                &bytes[..],
            )
            .map_err(ioerr)?;
        }
    }
    tar.into_inner().map_err(ioerr)?.flush().map_err(ioerr)?;
    Ok(PreloadEntry {
        name: spec.name.clone(),
        reference: spec.reference.clone(),
        digest: spec.digest.clone(),
        path: archive_path(&spec.name),
    })
}

/// Write every preload of a layer under `root` (a staging tree that becomes part of the
/// layer): `root/usr/lib/ingot/preload/<name>.oci.tar`.
pub fn stage(
    specs: &[PreloadSpec],
    mtime: u64,
    root: &Path,
) -> Result<Vec<PreloadEntry>, PreloadError> {
    let mut entries = Vec::new();
    for spec in specs {
        let rel = archive_path(&spec.name);
        let path = root.join(rel.trim_start_matches('/'));
        let ioerr = |source| PreloadError::Io {
            name: spec.name.clone(),
            source,
        };
        std::fs::create_dir_all(path.parent().expect("has a parent")).map_err(ioerr)?;
        let mut file = io::BufWriter::new(std::fs::File::create(&path).map_err(ioerr)?);
        entries.push(write_archive(spec, mtime, &mut file)?);
        file.flush().map_err(ioerr)?;
    }
    Ok(entries)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn fixture() -> std::path::PathBuf {
        Path::new(env!("CARGO_MANIFEST_DIR")).join("../tests/fixtures/images/hello")
    }

    const HELLO: &str = "sha256:4f437677bf5b207bb0be5461a86d0c04f2a4cf5aa9ac04d0e42f6243df604f48";

    fn spec(dir: &Path) -> PreloadSpec {
        PreloadSpec {
            name: "hello".into(),
            reference: "example.invalid/ingot/hello:1.0".into(),
            digest: HELLO.into(),
            source: ImageSource::OciLayout(dir.to_owned()),
        }
    }

    #[test]
    fn archive_is_deterministic_and_complete() {
        let mut a = Vec::new();
        let mut b = Vec::new();
        let entry = write_archive(&spec(&fixture()), 1_700_000_000, &mut a).unwrap();
        write_archive(&spec(&fixture()), 1_700_000_000, &mut b).unwrap();
        assert_eq!(a, b);
        assert_eq!(entry.path, "/usr/lib/ingot/preload/hello.oci.tar");
        let mut names = Vec::new();
        let mut index = String::new();
        for e in tar::Archive::new(&a[..]).entries().unwrap() {
            let mut e = e.unwrap();
            assert_eq!(e.header().mtime().unwrap(), 1_700_000_000);
            let name = e.path().unwrap().to_string_lossy().into_owned();
            if name == "index.json" {
                std::io::Read::read_to_string(&mut e, &mut index).unwrap();
            }
            names.push(name);
        }
        // oci-layout, index.json, two directories, manifest + config + one layer.
        assert_eq!(names.len(), 7, "{names:?}");
        assert!(names.contains(&format!("blobs/sha256/{}", &HELLO[7..])));
        assert!(index.contains(r#""io.containerd.image.name":"example.invalid/ingot/hello:1.0""#));
        assert!(index.contains(r#""org.opencontainers.image.ref.name":"1.0""#));
    }

    #[test]
    fn a_damaged_blob_is_refused() {
        let tmp = tempfile::tempdir().unwrap();
        let dir = tmp.path().join("hello");
        std::fs::create_dir_all(dir.join("blobs/sha256")).unwrap();
        for f in ["oci-layout", "index.json"] {
            std::fs::copy(fixture().join(f), dir.join(f)).unwrap();
        }
        let layer = "27750c97d8be96c0b8f8c0c1e76b433cbac7db1fe1c6d915f8860877f2159858";
        for e in std::fs::read_dir(fixture().join("blobs/sha256")).unwrap() {
            let e = e.unwrap();
            let mut bytes = std::fs::read(e.path()).unwrap();
            if e.file_name().to_string_lossy() == layer {
                bytes[600] ^= 1;
            }
            std::fs::write(dir.join("blobs/sha256").join(e.file_name()), bytes).unwrap();
        }
        let err = write_archive(&spec(&dir), 0, &mut Vec::new()).unwrap_err();
        let err = ingot_artifact::error_chain::text(&err);
        assert!(err.contains(layer) && err.contains("corrupt"), "{err}");
    }

    #[test]
    fn tags() {
        assert_eq!(tag_of("registry.k8s.io/pause:3.10"), "3.10");
        assert_eq!(tag_of("localhost:5000/pause"), "latest");
        assert_eq!(tag_of("example.invalid/x:1@sha256:abc"), "1");
        assert_eq!(tag_of("hello"), "latest");
    }
}
