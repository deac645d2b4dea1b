//! The stack artifact format, in one place: the media types and annotations of a stack's OCI
//! image manifest, the one function that assembles that manifest ([`assemble`], used by `ingot
//! build`), and the one that parses and checks it ([`parse`] and [`check_layers`], used by
//! `ingot verify`, `inspect`, `diff` and the writer).
//!
//! The manifest's layer list is a function of the signed descriptor alone ([`layer_blobs`]):
//! per stack layer its data blob, its hash blob and (schema 2) its SBOM, in stack order. So the builder writes, and
//! every reader expects, the same list, derived the same way.

use std::collections::BTreeMap;

use ingot_layers::descriptor::{LayerEntry, StackDescriptor};

pub use crate::sbom::SBOM_MEDIA_TYPE;

use crate::oci_layout::{
    Descriptor, ImageManifest, CREATED, MANIFEST_MEDIA_TYPE, MAX_MANIFEST_SIZE, REVISION, SOURCE,
    TITLE, VERSION,
};

/// Media type of the stack descriptor (the artifact's config blob).
pub const DESCRIPTOR_MEDIA_TYPE: &str = "application/vnd.ingot.stack.v1+json";
/// `artifactType` of the stack's OCI image manifest.
pub const ARTIFACT_TYPE: &str = "application/vnd.ingot.stack.v1";
/// Media type of a layer's data blob: an ext4 image compressed with zstd in independent frames.
pub const LAYER_MEDIA_TYPE: &str = "application/vnd.ingot.layer.v1.ext4+zstd";
/// Media type of a layer's hash blob: the dm-verity superblock and hash tree, uncompressed.
pub const VERITY_MEDIA_TYPE: &str = "application/vnd.ingot.verity.v1";
/// Media type of the release's signed unified kernel image (a PE/COFF EFI application).
pub const UKI_MEDIA_TYPE: &str = "application/vnd.ingot.uki.v1+efi";
/// Manifest annotation that carries the minisign signature (the whole `.minisig` text).
pub const SIGNATURE_ANNOTATION: &str = "dev.ingot.signature";

/// What a stack's manifest says besides its blobs.
#[derive(Debug, Clone, Default)]
pub struct ManifestInfo {
    /// `org.opencontainers.image.revision`, when known.
    pub revision: Option<String>,
    /// `org.opencontainers.image.source`: the stack's repository, when set.
    pub source: Option<String>,
    /// The minisign signature over the descriptor bytes (absent: unsigned).
    pub signature: Option<String>,
}

/// The trusted comment a stack's signature carries.
pub fn signature_comment(name: &str, version: &str, descriptor_digest: &str) -> String {
    format!("ingot stack={name} version={version} descriptor={descriptor_digest}")
}

/// The blobs one layer entry names, in manifest order: data, hash, then its SBOM (schema 2).
fn entry_blobs(layer: &LayerEntry) -> Vec<Descriptor> {
    let titled = |media_type: &str, digest: &str, size: u64, title: String| {
        let mut d = Descriptor::new(media_type, digest.to_owned(), size);
        d.annotations = Some(BTreeMap::from([(TITLE.to_owned(), title)]));
        d
    };
    let mut blobs = vec![
        titled(
            LAYER_MEDIA_TYPE,
            &layer.data.digest,
            layer.data.size,
            format!("{}.ext4.zst", layer.name),
        ),
        titled(
            VERITY_MEDIA_TYPE,
            &layer.hash.digest,
            layer.hash.size,
            format!("{}.verity", layer.name),
        ),
    ];
    if let Some(sbom) = &layer.sbom {
        blobs.push(titled(
            SBOM_MEDIA_TYPE,
            &sbom.digest,
            sbom.size,
            format!("{}.spdx.json", layer.name),
        ));
    }
    blobs
}

/// The UKI's blob, when the descriptor pins one.
fn uki_blob(descriptor: &StackDescriptor) -> Option<Descriptor> {
    descriptor.uki.as_ref().map(|u| {
        let mut d = Descriptor::new(UKI_MEDIA_TYPE, u.digest.clone(), u.size);
        let title = format!("{}-{}.efi", descriptor.name, descriptor.version);
        d.annotations = Some(BTreeMap::from([(TITLE.to_owned(), title)]));
        d
    })
}

/// The manifest's `layers`: every blob the descriptor names, in stack order, then the UKI.
pub fn layer_blobs(descriptor: &StackDescriptor) -> Vec<Descriptor> {
    descriptor
        .layers
        .iter()
        .flat_map(entry_blobs)
        .chain(uki_blob(descriptor))
        .collect()
}

/// The stack's OCI image manifest: `config` is the descriptor blob (`config`, whose bytes are
/// `descriptor`'s canonical JSON), `layers` are [`layer_blobs`].
pub fn assemble(
    descriptor: &StackDescriptor,
    config: &Descriptor,
    info: &ManifestInfo,
) -> ImageManifest {
    let mut annotations = BTreeMap::from([
        (CREATED.to_owned(), descriptor.created.clone()),
        (VERSION.to_owned(), descriptor.version.clone()),
        (
            TITLE.to_owned(),
            format!("{} {}", descriptor.name, descriptor.version),
        ),
    ]);
    if let Some(rev) = &info.revision {
        annotations.insert(REVISION.to_owned(), rev.clone());
    }
    if let Some(src) = &info.source {
        annotations.insert(SOURCE.to_owned(), src.clone());
    }
    if let Some(sig) = &info.signature {
        annotations.insert(SIGNATURE_ANNOTATION.to_owned(), sig.clone());
    }
    let mut config = config.clone();
    config.media_type = DESCRIPTOR_MEDIA_TYPE.to_owned();
    ImageManifest {
        schema_version: 2,
        media_type: Some(MANIFEST_MEDIA_TYPE.to_owned()),
        artifact_type: Some(ARTIFACT_TYPE.to_owned()),
        config,
        layers: layer_blobs(descriptor),
        annotations: Some(annotations),
    }
}

/// Why a manifest is not a stack's, or disagrees with its signed descriptor.
#[derive(Debug, thiserror::Error)]
pub enum FormatError {
    /// Not an OCI image manifest.
    #[error("the image manifest is not valid")]
    Json(#[source] serde_json::Error),
    /// An image manifest, of something other than an ingot stack.
    #[error("{what} is not an ingot stack (artifactType {artifact_type:?}, config {config})")]
    NotAStack {
        /// Where it was read.
        what: String,
        /// Its `artifactType`.
        artifact_type: Option<String>,
        /// Its config's media type.
        config: String,
    },
    /// The config blob is larger than any descriptor may be.
    #[error(
        "the stack descriptor {digest} is {size} bytes, more than the {MAX_MANIFEST_SIZE} bytes \
         it may have (not read)"
    )]
    DescriptorTooLarge {
        /// Its digest.
        digest: String,
        /// The size the manifest gives.
        size: u64,
    },
    /// The manifest lists more or fewer blobs than the descriptor names.
    #[error("the manifest lists {listed} layer blobs, the signed descriptor names {want}")]
    BlobCount {
        /// In the manifest.
        listed: usize,
        /// In the descriptor.
        want: usize,
    },
    /// A blob of the manifest is not the one the descriptor names at its place.
    #[error(
        "layer `{layer}`: the manifest's {what} blob ({listed_digest} {listed_size} bytes) is not \
         the one the signed descriptor names ({digest} {size} bytes)"
    )]
    Blob {
        /// The layer.
        layer: String,
        /// `data`, `hash` or `SBOM`.
        what: &'static str,
        /// The manifest's digest there.
        listed_digest: String,
        /// The manifest's size there.
        listed_size: u64,
        /// The descriptor's digest.
        digest: String,
        /// The descriptor's size.
        size: u64,
    },
}

impl FormatError {
    /// Whether the manifest disagrees with the signed descriptor (`ingot verify` exit 4), rather
    /// than not being a stack's manifest at all (exit 1).
    pub fn is_mismatch(&self) -> bool {
        matches!(
            self,
            FormatError::BlobCount { .. } | FormatError::Blob { .. }
        )
    }
}

/// Parse a stack's image manifest (`what` names where it was read): an OCI image manifest of
/// artifact type [`ARTIFACT_TYPE`] whose config is a descriptor of at most [`MAX_MANIFEST_SIZE`]
/// bytes. Its layers are checked against the descriptor once that is trusted
/// ([`check_layers`]).
pub fn parse(bytes: &[u8], what: &str) -> Result<ImageManifest, FormatError> {
    let manifest: ImageManifest = serde_json::from_slice(bytes).map_err(FormatError::Json)?;
    if manifest.artifact_type.as_deref() != Some(ARTIFACT_TYPE)
        || manifest.config.media_type != DESCRIPTOR_MEDIA_TYPE
    {
        return Err(FormatError::NotAStack {
            what: what.to_owned(),
            artifact_type: manifest.artifact_type,
            config: manifest.config.media_type,
        });
    }
    if manifest.config.size > MAX_MANIFEST_SIZE {
        return Err(FormatError::DescriptorTooLarge {
            digest: manifest.config.digest,
            size: manifest.config.size,
        });
    }
    Ok(manifest)
}

/// The manifest must list exactly the blobs the signed descriptor names, in order (media type,
/// digest and size; annotations are not trusted and not compared).
pub fn check_layers(
    manifest: &ImageManifest,
    descriptor: &StackDescriptor,
) -> Result<(), FormatError> {
    let want = layer_blobs(descriptor);
    if manifest.layers.len() != want.len() {
        return Err(FormatError::BlobCount {
            listed: manifest.layers.len(),
            want: want.len(),
        });
    }
    let owners = descriptor
        .layers
        .iter()
        .flat_map(|l| std::iter::repeat_n(l.name.as_str(), entry_blobs(l).len()))
        .chain(descriptor.uki.as_ref().map(|_| "(the UKI)"));
    for ((listed, want), layer) in manifest.layers.iter().zip(&want).zip(owners) {
        if listed.media_type != want.media_type
            || listed.digest != want.digest
            || listed.size != want.size
        {
            return Err(FormatError::Blob {
                layer: layer.to_owned(),
                what: blob_role(&want.media_type),
                listed_digest: listed.digest.clone(),
                listed_size: listed.size,
                digest: want.digest.clone(),
                size: want.size,
            });
        }
    }
    Ok(())
}

fn blob_role(media_type: &str) -> &'static str {
    match media_type {
        LAYER_MEDIA_TYPE => "data",
        VERITY_MEDIA_TYPE => "hash",
        SBOM_MEDIA_TYPE => "SBOM",
        UKI_MEDIA_TYPE => "UKI",
        _ => "other",
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::oci_layout::sha256_digest;
    use ingot_layers::descriptor::canonical_json;

    fn descriptor(schema: u32) -> StackDescriptor {
        let layer = |name: &str, fill: char| {
            let (a, b) = (fill.to_string().repeat(64), "b".repeat(64));
            serde_json::json!({
                "name": name, "kind": if name == "base" { "base" } else { "extra" },
                "size": 32768,
                "data": {"digest": format!("sha256:{a}"), "size": 100,
                         "compression": {"algorithm": "zstd", "frameSize": 4194304}},
                "hash": {"digest": format!("sha256:{b}"), "size": 8192},
                "verity": {"rootHash": "c".repeat(64), "salt": "d".repeat(64),
                           "algorithm": "sha256", "hashType": 1, "dataBlockSize": 4096,
                           "hashBlockSize": 4096, "dataBlocks": 8, "hashOffset": 0,
                           "superblock": true},
            })
        };
        let mut extra = layer("extra", 'e');
        extra["when"] = "virt".into();
        let mut d = serde_json::json!({
            "schemaVersion": 1, "name": "demo", "version": "1.0.0", "builder": "ingot",
            "created": "2024-01-01T00:00:00Z", "sourceDateEpoch": 1_704_067_200,
            "boot": {"kernel": "/k", "initrd": "/i", "efi": "/e"},
            "layers": [layer("base", 'a'), extra],
        });
        if schema == 2 {
            d["schemaVersion"] = 2.into();
            for (i, l) in d["layers"].as_array_mut().unwrap().iter_mut().enumerate() {
                l["sbom"] = serde_json::json!({"digest": format!("sha256:{}", i.to_string().repeat(64)), "size": 7});
            }
        }
        StackDescriptor::from_json(&serde_json::to_vec(&d).unwrap()).unwrap()
    }

    fn assembled(d: &StackDescriptor) -> Vec<u8> {
        let bytes = d.to_canonical_json();
        let config = Descriptor::new(
            DESCRIPTOR_MEDIA_TYPE,
            sha256_digest(&bytes),
            bytes.len() as u64,
        );
        let info = ManifestInfo {
            revision: Some("abc".into()),
            source: None,
            signature: Some("sig".into()),
        };
        canonical_json(&assemble(d, &config, &info)).unwrap()
    }

    #[test]
    fn round_trip_with_sboms() {
        let d = descriptor(2);
        let bytes = assembled(&d);
        let mut m = parse(&bytes, "test").unwrap();
        check_layers(&m, &d).unwrap();
        assert_eq!(m.layers.len(), 3 * d.layers.len());
        assert_eq!(m.layers[2].media_type, SBOM_MEDIA_TYPE);
        assert_eq!(m.layers[5].annotation(TITLE), Some("extra.spdx.json"));
        // An SBOM swapped for another layer's is named as that layer's SBOM.
        m.layers.swap(2, 5);
        let e = check_layers(&m, &d).unwrap_err();
        assert!(
            matches!(&e, FormatError::Blob { what: "SBOM", layer, .. } if layer == "base"),
            "{e}"
        );
    }

    #[test]
    fn a_uki_is_the_last_blob_and_checked() {
        let mut d = descriptor(2);
        d.uki = Some(ingot_layers::descriptor::UkiBlob {
            digest: format!("sha256:{}", "9".repeat(64)),
            size: 1234,
            cmdline: "ro".into(),
        });
        let bytes = assembled(&d);
        let mut m = parse(&bytes, "test").unwrap();
        check_layers(&m, &d).unwrap();
        let last = m.layers.last().unwrap();
        assert_eq!(last.media_type, UKI_MEDIA_TYPE);
        assert_eq!(last.annotation(TITLE), Some("demo-1.0.0.efi"));
        m.layers.last_mut().unwrap().size = 1235;
        let e = check_layers(&m, &d).unwrap_err();
        assert!(matches!(&e, FormatError::Blob { what: "UKI", .. }), "{e}");
        m.layers.pop();
        let e = check_layers(&m, &d).unwrap_err();
        assert!(matches!(e, FormatError::BlobCount { .. }), "{e}");
    }

    #[test]
    fn round_trip() {
        let d = descriptor(1);
        let bytes = assembled(&d);
        let m = parse(&bytes, "test").unwrap();
        check_layers(&m, &d).unwrap();
        assert_eq!(m.layers.len(), 2 * d.layers.len());
        assert_eq!(m.annotation(SIGNATURE_ANNOTATION), Some("sig"));
        assert_eq!(m.annotation(REVISION), Some("abc"));
        assert_eq!(
            m.layers[0].annotation(TITLE).unwrap(),
            format!("{}.ext4.zst", d.layers[0].name)
        );
        // Canonical: assembling again gives the same bytes.
        assert_eq!(canonical_json(&m).unwrap(), bytes);
    }

    #[test]
    fn refusals() {
        let d = descriptor(1);
        let bytes = assembled(&d);
        let mut v: serde_json::Value = serde_json::from_slice(&bytes).unwrap();
        v["artifactType"] = "application/vnd.other".into();
        let e = parse(&serde_json::to_vec(&v).unwrap(), "x").unwrap_err();
        assert!(matches!(e, FormatError::NotAStack { .. }), "{e}");
        assert!(!e.is_mismatch());

        let mut m = parse(&bytes, "x").unwrap();
        m.layers.swap(0, 1);
        let e = check_layers(&m, &d).unwrap_err();
        assert!(matches!(&e, FormatError::Blob { what: "data", .. }), "{e}");
        assert!(e.is_mismatch());
        m.layers.pop();
        let e = check_layers(&m, &d).unwrap_err();
        assert!(matches!(e, FormatError::BlobCount { .. }), "{e}");

        let mut v: serde_json::Value = serde_json::from_slice(&bytes).unwrap();
        v["config"]["size"] = (MAX_MANIFEST_SIZE + 1).into();
        let e = parse(&serde_json::to_vec(&v).unwrap(), "x").unwrap_err();
        assert!(matches!(e, FormatError::DescriptorTooLarge { .. }), "{e}");
        assert!(matches!(parse(b"{", "x"), Err(FormatError::Json(_))));
    }
}
