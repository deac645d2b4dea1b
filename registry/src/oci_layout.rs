//! OCI image layouts on disk (image-spec v1.1 `image-layout.md`): `oci-layout`, `index.json`,
//! `blobs/sha256/<hex>`.
//!
//! Small structs of our own rather than `oci-spec`'s: their maps are `BTreeMap`s and everything
//! is written through [`canonical_json`], so a manifest's bytes (and digest) are stable.
//! Reading checks every blob against its digest and size before handing it out.

use std::collections::BTreeMap;
use std::fs::{self, File};
use std::io::{self, Read, Write};
use std::path::{Path, PathBuf};

use ingot_layers::descriptor::{canonical_json, is_sha256_digest};
use ingot_verity::input::{self, InputError, Symlinks};
use serde::{Deserialize, Serialize};
use sha2::{Digest, Sha256};

/// Media type of an OCI image manifest.
pub const MANIFEST_MEDIA_TYPE: &str = "application/vnd.oci.image.manifest.v1+json";
/// Media type of an OCI image index.
pub const INDEX_MEDIA_TYPE: &str = "application/vnd.oci.image.index.v1+json";
/// Media type of a Docker schema 2 manifest (accepted when reading preload images).
pub const DOCKER_MANIFEST_MEDIA_TYPE: &str = "application/vnd.docker.distribution.manifest.v2+json";
/// Media type of a Docker manifest list (accepted when reading preload images).
pub const DOCKER_LIST_MEDIA_TYPE: &str =
    "application/vnd.docker.distribution.manifest.list.v2+json";
/// The `oci-layout` file's content.
pub const LAYOUT_FILE: &str = r#"{"imageLayoutVersion":"1.0.0"}"#;
/// Annotation: a reference name in `index.json`.
pub const REF_NAME: &str = "org.opencontainers.image.ref.name";
/// Annotation: a layer's file name.
pub const TITLE: &str = "org.opencontainers.image.title";
/// Annotation: creation time.
pub const CREATED: &str = "org.opencontainers.image.created";
/// Annotation: version.
pub const VERSION: &str = "org.opencontainers.image.version";
/// Annotation: source control revision.
pub const REVISION: &str = "org.opencontainers.image.revision";
/// Annotation: source repository URL.
pub const SOURCE: &str = "org.opencontainers.image.source";
/// Annotation containerd reads for an image's full name on import.
pub const CONTAINERD_IMAGE_NAME: &str = "io.containerd.image.name";

/// An OCI content descriptor.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct Descriptor {
    /// Media type of the referenced content.
    pub media_type: String,
    /// `sha256:<hex>`.
    pub digest: String,
    /// Size in bytes.
    pub size: u64,
    /// Optional annotations.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub annotations: Option<BTreeMap<String, String>>,
    /// Artifact type of a referenced manifest.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub artifact_type: Option<String>,
    /// Platform of a referenced manifest (in an index).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub platform: Option<serde_json::Value>,
}

impl Descriptor {
    /// A descriptor without annotations.
    pub fn new(media_type: &str, digest: String, size: u64) -> Self {
        Descriptor {
            media_type: media_type.to_owned(),
            digest,
            size,
            annotations: None,
            artifact_type: None,
            platform: None,
        }
    }

    /// An annotation's value.
    pub fn annotation(&self, key: &str) -> Option<&str> {
        self.annotations.as_ref()?.get(key).map(String::as_str)
    }
}

/// An OCI image manifest.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct ImageManifest {
    /// Always 2.
    pub schema_version: u32,
    /// [`MANIFEST_MEDIA_TYPE`].
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub media_type: Option<String>,
    /// The artifact's type.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub artifact_type: Option<String>,
    /// The config blob.
    pub config: Descriptor,
    /// The layer blobs.
    pub layers: Vec<Descriptor>,
    /// Manifest annotations.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub annotations: Option<BTreeMap<String, String>>,
}

impl ImageManifest {
    /// An annotation's value.
    pub fn annotation(&self, key: &str) -> Option<&str> {
        self.annotations.as_ref()?.get(key).map(String::as_str)
    }
}

/// An OCI image index (`index.json`).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct ImageIndex {
    /// Always 2.
    pub schema_version: u32,
    /// [`INDEX_MEDIA_TYPE`].
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub media_type: Option<String>,
    /// The manifests.
    pub manifests: Vec<Descriptor>,
    /// Index annotations.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub annotations: Option<BTreeMap<String, String>>,
}

/// Why a layout could not be read, or a blob in it was refused.
#[derive(Debug, thiserror::Error)]
pub enum LayoutError {
    /// Reading failed.
    #[error("{path}")]
    Io {
        /// The file.
        path: PathBuf,
        /// The error.
        source: io::Error,
    },
    /// Not an OCI image layout, or its JSON is malformed.
    #[error("{path}: {reason}")]
    Format {
        /// The file.
        path: PathBuf,
        /// What is wrong.
        reason: String,
    },
    /// A blob is not there.
    #[error("blob {digest} is missing from the layout ({path})")]
    Missing {
        /// Its digest.
        digest: String,
        /// Where it should be.
        path: PathBuf,
    },
    /// A blob's bytes do not hash to its digest.
    #[error("blob {digest} is corrupt: its bytes hash to {actual}")]
    Digest {
        /// The digest it is stored under.
        digest: String,
        /// What its bytes hash to.
        actual: String,
    },
    /// A blob's size differs from the size its descriptor gives.
    #[error("blob {digest} is {actual} bytes, its descriptor says {expected}")]
    Size {
        /// Its digest.
        digest: String,
        /// The size the descriptor gives.
        expected: u64,
        /// Its real size.
        actual: u64,
    },
}

impl LayoutError {
    /// Whether this error means content does not match its digest or size.
    pub fn is_integrity(&self) -> bool {
        matches!(self, LayoutError::Digest { .. } | LayoutError::Size { .. })
    }
}

fn io_err(path: &Path) -> impl FnOnce(io::Error) -> LayoutError {
    let path = path.to_owned();
    move |source| LayoutError::Io { path, source }
}

/// `sha256:<hex>` of bytes.
pub fn sha256_digest(bytes: &[u8]) -> String {
    format!("sha256:{}", hex::encode(Sha256::digest(bytes)))
}

/// `sha256:<hex>` of a file, streamed.
pub fn sha256_file(path: &Path) -> io::Result<(String, u64)> {
    sha256_reader(File::open(path)?)
}

/// `sha256:<hex>` of everything `f` reads, and how many bytes that was.
fn sha256_reader(mut f: impl Read) -> io::Result<(String, u64)> {
    let mut h = Sha256::new();
    let mut buf = vec![0u8; 1 << 20];
    let mut n = 0u64;
    loop {
        let r = f.read(&mut buf)?;
        if r == 0 {
            break;
        }
        h.update(&buf[..r]);
        n += r as u64;
    }
    Ok((format!("sha256:{}", hex::encode(h.finalize())), n))
}

/// The largest manifest, index, `oci-layout` file or stack descriptor read into memory: 4 MiB,
/// the distribution spec's limit for a manifest. Larger ones are refused before they are read.
/// The same constant `ingot build` writes descriptors within.
pub const MAX_MANIFEST_SIZE: u64 = ingot_layers::descriptor::MAX_DESCRIPTOR_SIZE;

/// Reads a small JSON file whole, refusing one larger than [`MAX_MANIFEST_SIZE`] unread, and
/// anything but a regular file (a FIFO or `/dev/zero` in its place is refused, not read).
fn read_small(path: &Path) -> Result<Vec<u8>, LayoutError> {
    input::read_bounded(path, MAX_MANIFEST_SIZE, Symlinks::Follow).map_err(|e| {
        match input::input_error(&e) {
            Some(InputError::TooLarge { size, .. }) => LayoutError::Format {
                path: path.to_owned(),
                reason: format!(
                    "{size} bytes, more than the {MAX_MANIFEST_SIZE} bytes a manifest may have"
                ),
            },
            _ => io_err(path)(e),
        }
    })
}

/// An OCI image layout directory, for reading.
#[derive(Debug, Clone)]
pub struct Layout {
    root: PathBuf,
}

impl Layout {
    /// Open a layout: `oci-layout` must say version 1.0.0.
    pub fn open(root: &Path) -> Result<Self, LayoutError> {
        let marker = root.join("oci-layout");
        let text = read_small(&marker)?;
        let v: serde_json::Value =
            serde_json::from_slice(&text).map_err(|e| LayoutError::Format {
                path: marker.clone(),
                reason: e.to_string(),
            })?;
        if v.get("imageLayoutVersion").and_then(|v| v.as_str()) != Some("1.0.0") {
            return Err(LayoutError::Format {
                path: marker,
                reason: "imageLayoutVersion is not 1.0.0".into(),
            });
        }
        Ok(Layout {
            root: root.to_owned(),
        })
    }

    /// The layout's directory.
    pub fn root(&self) -> &Path {
        &self.root
    }

    /// `index.json`.
    pub fn index(&self) -> Result<ImageIndex, LayoutError> {
        let path = self.root.join("index.json");
        let bytes = read_small(&path)?;
        serde_json::from_slice(&bytes).map_err(|e| LayoutError::Format {
            path,
            reason: e.to_string(),
        })
    }

    /// Where a blob lives (the digest must be a valid sha256 digest).
    pub fn blob_path(&self, digest: &str) -> Result<PathBuf, LayoutError> {
        if !is_sha256_digest(digest) {
            return Err(LayoutError::Format {
                path: self.root.clone(),
                reason: format!("`{digest}` is not a sha256 digest"),
            });
        }
        Ok(self
            .root
            .join("blobs/sha256")
            .join(&digest["sha256:".len()..]))
    }

    /// A blob opened for reading: a regular file (a FIFO, a device or a symlink to one is
    /// refused before a byte is read) with the expected size.
    fn open_blob(&self, digest: &str, size: u64) -> Result<(PathBuf, File), LayoutError> {
        let path = self.blob_path(digest)?;
        let file = match input::open_regular(&path, Symlinks::Follow) {
            Ok(f) => f,
            Err(e) if e.kind() == io::ErrorKind::NotFound => {
                return Err(LayoutError::Missing {
                    digest: digest.to_owned(),
                    path,
                })
            }
            Err(e) => return Err(io_err(&path)(e)),
        };
        let len = file.metadata().map_err(io_err(&path))?.len();
        if len != size {
            return Err(LayoutError::Size {
                digest: digest.to_owned(),
                expected: size,
                actual: len,
            });
        }
        Ok((path, file))
    }

    /// The path of a blob that exists with the expected size (its digest is not checked yet).
    pub fn present_blob(&self, digest: &str, size: u64) -> Result<PathBuf, LayoutError> {
        Ok(self.open_blob(digest, size)?.0)
    }

    /// Read a blob whole and check its digest and size (at most `size + 1` bytes are read).
    pub fn read_blob(&self, digest: &str, size: u64) -> Result<Vec<u8>, LayoutError> {
        let (path, file) = self.open_blob(digest, size)?;
        let bytes =
            input::read_file_bounded(file, size).map_err(|e| match input::input_error(&e) {
                Some(InputError::TooLarge { size: actual, .. }) => LayoutError::Size {
                    digest: digest.to_owned(),
                    expected: size,
                    actual: *actual,
                },
                _ => io_err(&path)(e),
            })?;
        let actual = sha256_digest(&bytes);
        if actual != digest {
            return Err(LayoutError::Digest {
                digest: digest.to_owned(),
                actual,
            });
        }
        Ok(bytes)
    }

    /// Like [`Layout::read_blob`], for a manifest or descriptor: one larger than
    /// [`MAX_MANIFEST_SIZE`] is refused before it is read.
    pub fn read_small_blob(&self, digest: &str, size: u64) -> Result<Vec<u8>, LayoutError> {
        if size > MAX_MANIFEST_SIZE {
            return Err(LayoutError::Format {
                path: self.blob_path(digest)?,
                reason: format!(
                    "its descriptor gives {size} bytes, more than the {MAX_MANIFEST_SIZE} bytes \
                     a manifest may have (not read)"
                ),
            });
        }
        self.read_blob(digest, size)
    }

    /// Check a blob file's digest and size by streaming it (at most `size + 1` bytes); returns
    /// its path.
    pub fn check_blob(&self, digest: &str, size: u64) -> Result<PathBuf, LayoutError> {
        let (path, file) = self.open_blob(digest, size)?;
        let (actual, read) =
            sha256_reader(file.take(size.saturating_add(1))).map_err(io_err(&path))?;
        if read != size {
            return Err(LayoutError::Size {
                digest: digest.to_owned(),
                expected: size,
                actual: read,
            });
        }
        if actual != digest {
            return Err(LayoutError::Digest {
                digest: digest.to_owned(),
                actual,
            });
        }
        Ok(path)
    }

    /// The manifest `index.json` names `tag` (its `org.opencontainers.image.ref.name`), as
    /// skopeo's `oci:DIR:TAG` picks it.
    pub fn find_tagged(&self, tag: &str) -> Result<Descriptor, LayoutError> {
        let index = self.index()?;
        let mut named = index
            .manifests
            .into_iter()
            .filter(|m| m.annotation(REF_NAME) == Some(tag));
        match (named.next(), named.next()) {
            (Some(m), None) => Ok(m),
            (found, _) => Err(LayoutError::Format {
                path: self.root.join("index.json"),
                reason: if found.is_none() {
                    format!("no manifest is tagged `{tag}` ({REF_NAME})")
                } else {
                    format!("more than one manifest is tagged `{tag}`")
                },
            }),
        }
    }

    /// Find the manifest descriptor by digest, or the only one if `digest` is None.
    pub fn find_manifest(&self, digest: Option<&str>) -> Result<Descriptor, LayoutError> {
        let index = self.index()?;
        let path = self.root.join("index.json");
        match digest {
            Some(d) => index
                .manifests
                .into_iter()
                .find(|m| m.digest == d)
                .ok_or_else(|| LayoutError::Format {
                    path,
                    reason: format!("no manifest {d} in index.json"),
                }),
            None => {
                let mut it = index.manifests.into_iter();
                match (it.next(), it.next()) {
                    (Some(m), None) => Ok(m),
                    (None, _) => Err(LayoutError::Format {
                        path,
                        reason: "index.json lists no manifest".into(),
                    }),
                    (Some(_), Some(_)) => Err(LayoutError::Format {
                        path,
                        reason: "index.json lists more than one manifest".into(),
                    }),
                }
            }
        }
    }
}

/// Checks a tag for `oci:DIR:TAG` against the OCI image spec's grammar of
/// `org.opencontainers.image.ref.name`: components of letters and digits joined by `-`, `.`, `_`,
/// `+`, `:`, `@` or `/`, at most 128 characters here.
pub fn check_ref_name(tag: &str) -> Result<(), String> {
    let sep = |c: char| matches!(c, '-' | '.' | '_' | '+' | ':' | '@' | '/');
    let ok = !tag.is_empty()
        && tag.len() <= 128
        && tag.chars().all(|c| c.is_ascii_alphanumeric() || sep(c))
        && !tag.starts_with(sep)
        && !tag.ends_with(sep);
    if ok {
        Ok(())
    } else {
        Err(format!(
            "`{tag}` is not a tag (letters and digits, joined by - . _ + : @ /; at most 128)"
        ))
    }
}

/// Writes an OCI image layout into a directory.
#[derive(Debug)]
pub struct LayoutWriter {
    root: PathBuf,
}

impl LayoutWriter {
    /// Create the layout's skeleton in `root` (which must exist and be empty).
    pub fn create(root: &Path) -> io::Result<Self> {
        fs::create_dir_all(root.join("blobs/sha256"))?;
        fs::write(root.join("oci-layout"), LAYOUT_FILE)?;
        Ok(LayoutWriter {
            root: root.to_owned(),
        })
    }

    /// The layout's directory.
    pub fn root(&self) -> &Path {
        &self.root
    }

    /// Store bytes as a blob; returns a descriptor of `media_type`.
    pub fn write_blob(&self, media_type: &str, bytes: &[u8]) -> io::Result<Descriptor> {
        let digest = sha256_digest(bytes);
        let path = self.root.join("blobs/sha256").join(&digest[7..]);
        let mut f = File::create(&path)?;
        f.write_all(bytes)?;
        f.sync_all()?;
        Ok(Descriptor::new(media_type, digest, bytes.len() as u64))
    }

    /// Move a file whose digest is known into the blob store.
    pub fn adopt_blob(
        &self,
        media_type: &str,
        file: &Path,
        digest: &str,
        size: u64,
    ) -> io::Result<Descriptor> {
        let path = self.root.join("blobs/sha256").join(&digest[7..]);
        fs::rename(file, &path)?;
        // Blobs are public content; temporary files start out private.
        fs::set_permissions(&path, std::os::unix::fs::PermissionsExt::from_mode(0o644))?;
        Ok(Descriptor::new(media_type, digest.to_owned(), size))
    }

    /// Write `manifest` as a blob and `index.json` pointing at it. Returns the manifest's
    /// descriptor.
    pub fn finish(
        &self,
        manifest: &ImageManifest,
        ref_name: Option<&str>,
    ) -> io::Result<Descriptor> {
        let bytes = canonical_json(manifest).map_err(io::Error::other)?;
        let mut desc = self.write_blob(MANIFEST_MEDIA_TYPE, &bytes)?;
        desc.artifact_type = manifest.artifact_type.clone();
        if let Some(r) = ref_name {
            desc.annotations = Some(BTreeMap::from([(REF_NAME.to_owned(), r.to_owned())]));
        }
        let index = ImageIndex {
            schema_version: 2,
            media_type: Some(INDEX_MEDIA_TYPE.to_owned()),
            manifests: vec![desc.clone()],
            annotations: None,
        };
        let index_bytes = canonical_json(&index).map_err(io::Error::other)?;
        let mut f = File::create(self.root.join("index.json"))?;
        f.write_all(&index_bytes)?;
        f.sync_all()?;
        Ok(desc)
    }
}
