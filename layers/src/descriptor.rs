//! The stack descriptor: the signed document that names every layer of a stack release.
//!
//! It is the OCI config blob of the stack artifact. A minisign signature over its exact bytes
//! travels in a manifest annotation; everything a verifier trusts comes from here: the digest
//! and size of every blob, and the verity root hash of every layer. The artifact around it (its
//! media types, annotations and image manifest) is `ingot_artifact::stack_format`'s: this crate
//! needs none of it.
//!
//! It is serialized canonically ([`StackDescriptor::to_canonical_json`]): keys sorted, no
//! insignificant whitespace, so the same stack gives the same bytes and the same digest. Parsing
//! ([`StackDescriptor::from_json`]) is strict: unknown fields, a wrong schema version, malformed
//! digests or hashes and duplicate layer names are refused.

use std::collections::BTreeSet;

use ingot_verity::{HashAlgorithm, HashType, ParamError, RootHash, VerityParams};
use serde::{Deserialize, Serialize};

use crate::names;
use crate::select::{self, Rule};

/// The schema version this code writes: 2 adds each layer's SBOM (`sbom`).
pub const SCHEMA_VERSION: u32 = 2;
/// The schema versions this code reads: 1 (no SBOMs) and 2.
pub const READ_SCHEMA_VERSIONS: [u32; 2] = [1, 2];
/// The largest descriptor (and manifest) any ingot reader accepts: 4 MiB, the distribution
/// spec's limit for a manifest. `ingot build` refuses to write a larger one.
pub const MAX_DESCRIPTOR_SIZE: u64 = 4 << 20;
/// The compression named in [`Compression::algorithm`].
pub const ZSTD: &str = "zstd";

/// The stack descriptor.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct StackDescriptor {
    /// Always [`SCHEMA_VERSION`].
    pub schema_version: u32,
    /// Stack name, e.g. `demo`.
    pub name: String,
    /// Stack release version, e.g. `1.2.3`.
    pub version: String,
    /// The builder that made it, e.g. `ingot 0.1.0`.
    pub builder: String,
    /// Creation time, RFC 3339 UTC, derived from `source_date_epoch` (never the wall clock).
    pub created: String,
    /// The `source_date_epoch` of the manifest: every timestamp in every layer.
    pub source_date_epoch: u64,
    /// Files the ESP needs from the base layer.
    pub boot: BootFiles,
    /// Layers in manifest order; the first one is the base layer.
    pub layers: Vec<LayerEntry>,
    /// The release's signed unified kernel image (`ingot build --secure-boot-key`): absent in
    /// stacks built without one (and in every descriptor written before it existed).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub uki: Option<UkiBlob>,
}

/// A unified kernel image (systemd-stub, the base's kernel and initrd, `.osrel`, `.cmdline`),
/// Authenticode-signed with the release's Secure Boot db key, stored as a blob of the stack.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct UkiBlob {
    /// `sha256:<64 lowercase hex>` of the signed image.
    pub digest: String,
    /// Its size in bytes.
    pub size: u64,
    /// Its `.cmdline` section: what the stub hands the kernel, the same for every machine
    /// (`ingot_layers::boot::signed_cmdline` of this descriptor).
    pub cmdline: String,
}

/// The files the writer copies from the base layer to the ESP (absolute paths in that layer).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct BootFiles {
    /// The kernel image.
    pub kernel: String,
    /// The initrd.
    pub initrd: String,
    /// The bootloader EFI binary.
    pub efi: String,
    /// The legacy BIOS loader: a directory holding GRUB's i386-pc `boot.img` and `core.img`
    /// (`docs/boot-contract.md`). Absent: the stack boots from UEFI only.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub bios: Option<String>,
    /// The stack's own kernel arguments (`[boot] kernel_args`, e.g. the serial console): on
    /// every command line the writer makes, and in the signed UKI's.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub kernel_args: Vec<String>,
}

/// One layer of the stack.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct LayerEntry {
    /// Unique name within the stack.
    pub name: String,
    /// `base`, `control-plane`, `nvidia`, `kata` or another kind.
    pub kind: String,
    /// Selection rule; absent for the base layer (every machine gets it).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub when: Option<Rule>,
    /// Size of the uncompressed ext4 image in bytes.
    pub size: u64,
    /// The compressed image blob.
    pub data: DataBlob,
    /// The verity hash blob (superblock + tree).
    pub hash: BlobRef,
    /// The dm-verity parameters and root hash.
    pub verity: VerityInfo,
    /// Container images stored in the layer for containerd to import at first boot.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub preload: Vec<PreloadEntry>,
    /// The layer's SBOM blob: an SPDX 2.3 JSON document of the Debian packages the layer adds
    /// or changes. Every layer has one from schema version 2 on; none before.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub sbom: Option<BlobRef>,
}

/// A blob by digest and size.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct BlobRef {
    /// `sha256:<64 lowercase hex>`.
    pub digest: String,
    /// Size in bytes.
    pub size: u64,
}

/// The data blob: a blob plus how it is compressed.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct DataBlob {
    /// `sha256:<64 lowercase hex>` of the compressed blob.
    pub digest: String,
    /// Size of the compressed blob in bytes.
    pub size: u64,
    /// How it is compressed.
    pub compression: Compression,
}

/// Compression of a data blob: independent zstd frames, each of `frameSize` input bytes (the
/// last one may be shorter), so frames decompress in parallel and a download resumes by range.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct Compression {
    /// Always [`ZSTD`].
    pub algorithm: String,
    /// Uncompressed bytes per frame.
    pub frame_size: u64,
    /// The frame index: the compressed size of each frame, in order, so that a reader can fetch
    /// one frame with a `Range` request (the writer reads the base layer's `/etc/passwd` this
    /// way without downloading the blob). Empty in stacks built before it existed.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub frames: Vec<u64>,
}

impl Compression {
    /// Where each frame of the frame index starts in the blob, then the blob's end (the sum of
    /// the sizes; the descriptor's check makes it the blob's size). `[0]` without an index.
    pub fn frame_starts(&self) -> Vec<u64> {
        std::iter::once(0)
            .chain(self.frames.iter().scan(0u64, |at, f| {
                *at += f;
                Some(*at)
            }))
            .collect()
    }
}

/// dm-verity parameters of a layer (format 1, veritysetup's meaning for every field): the one
/// type from the tree builder ([`crate::build_layer`]) through the descriptor to the reader
/// ([`VerityInfo::params`]). Salt and UUID are text here as veritysetup takes and prints them.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct VerityInfo {
    /// Root hash; lowercase hex in the JSON, checked when the descriptor is read.
    pub root_hash: RootHash,
    /// Salt, lowercase hex (may be empty).
    pub salt: String,
    /// Superblock UUID, `xxxxxxxx-xxxx-xxxx-xxxx-xxxxxxxxxxxx`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub uuid: Option<String>,
    /// Hash algorithm, e.g. `sha256`.
    pub algorithm: String,
    /// Hash format type (1 = the normal one).
    pub hash_type: u32,
    /// Data block size in bytes.
    pub data_block_size: u32,
    /// Hash block size in bytes.
    pub hash_block_size: u32,
    /// Number of data blocks covered.
    pub data_blocks: u64,
    /// Where the superblock (or, without one, the tree) starts in the hash blob: veritysetup's
    /// `--hash-offset`.
    pub hash_offset: u64,
    /// The hash blob starts with a verity superblock.
    pub superblock: bool,
}

impl VerityInfo {
    /// The descriptor's form of a tree built with `params`, whose root hash is `root_hash`.
    pub fn new(root_hash: RootHash, params: &VerityParams) -> Self {
        VerityInfo {
            root_hash,
            salt: hex::encode(&params.salt),
            uuid: params.uuid.as_ref().map(ingot_verity::uuid_to_string),
            algorithm: params.algorithm.name().to_owned(),
            hash_type: params.hash_type.as_u32(),
            data_block_size: params.data_block_size,
            hash_block_size: params.hash_block_size,
            data_blocks: params.data_blocks,
            hash_offset: params.hash_offset,
            superblock: params.superblock,
        }
    }

    /// The parameters back, as the tree builder and verifier take them.
    pub fn params(&self) -> Result<VerityParams, VerityParamsError> {
        let bad = |what, source| VerityParamsError { what, source };
        Ok(VerityParams {
            hash_type: HashType::from_u32(self.hash_type).map_err(|e| bad("hash type", Some(e)))?,
            algorithm: HashAlgorithm::from_name(&self.algorithm)
                .map_err(|e| bad("hash algorithm", Some(e)))?,
            data_block_size: self.data_block_size,
            hash_block_size: self.hash_block_size,
            data_blocks: self.data_blocks,
            salt: hex::decode(&self.salt).map_err(|_| bad("salt is not hex", None))?,
            uuid: match &self.uuid {
                None => None,
                Some(u) => {
                    Some(ingot_verity::parse_uuid(u).ok_or_else(|| bad("bad verity uuid", None))?)
                }
            },
            hash_offset: self.hash_offset,
            superblock: self.superblock,
        })
    }
}

/// Why a descriptor's verity parameters are unusable ([`VerityInfo::params`]).
#[derive(Debug, thiserror::Error)]
#[error("{what}")]
pub struct VerityParamsError {
    /// Which parameter.
    pub what: &'static str,
    /// Why, when a parser said.
    #[source]
    pub source: Option<ParamError>,
}

/// A container image stored inside a layer.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct PreloadEntry {
    /// Name used for the file and as the image's reference, e.g. `registry.k8s.io/pause:3.10`.
    pub name: String,
    /// The image's reference as containerd will list it.
    pub reference: String,
    /// Digest of the image manifest, `sha256:…`.
    pub digest: String,
    /// Absolute path of the OCI archive inside the layer.
    pub path: String,
}

/// Why a descriptor was refused.
#[derive(Debug, thiserror::Error)]
pub enum DescriptorError {
    /// Not JSON, or not the schema (unknown field, wrong type, missing field).
    #[error("stack descriptor is not valid")]
    Json(#[from] serde_json::Error),
    /// A value that parses but breaks a rule of the schema.
    #[error("stack descriptor is not valid: {0}")]
    Invalid(String),
}

fn invalid(msg: impl Into<String>) -> DescriptorError {
    DescriptorError::Invalid(msg.into())
}

/// Whether `s` is `sha256:` followed by 64 lowercase hex digits.
pub fn is_sha256_digest(s: &str) -> bool {
    s.strip_prefix("sha256:")
        .is_some_and(|hex| hex.len() == 64 && is_lower_hex(hex))
}

/// A layer's dm-verity parameters: hex salt, block sizes, a hash offset inside the hash blob,
/// a well-formed UUID, and a size of dataBlocks × dataBlockSize.
fn check_verity(at: &str, layer: &LayerEntry) -> Result<(), DescriptorError> {
    let v = &layer.verity;
    if !is_lower_hex(&v.salt) || v.salt.len() % 2 != 0 {
        return Err(invalid(format!("{at}: salt is not lowercase hex")));
    }
    for (what, size) in [
        ("dataBlockSize", v.data_block_size),
        ("hashBlockSize", v.hash_block_size),
    ] {
        if !(512..=65536).contains(&size) || !size.is_power_of_two() {
            return Err(invalid(format!(
                "{at}: {what} {size} is not a power of two in 512..65536"
            )));
        }
    }
    if v.data_blocks == 0 {
        return Err(invalid(format!("{at}: dataBlocks is 0")));
    }
    if v.hash_offset % 512 != 0 || v.hash_offset >= layer.hash.size {
        return Err(invalid(format!(
            "{at}: hashOffset {} is not a multiple of 512 inside the {}-byte hash blob",
            v.hash_offset, layer.hash.size
        )));
    }
    if let Some(uuid) = &v.uuid {
        if !is_uuid(uuid) {
            return Err(invalid(format!("{at}: verity uuid `{uuid}` is malformed")));
        }
    }
    if v.data_blocks.checked_mul(u64::from(v.data_block_size)) != Some(layer.size) {
        return Err(invalid(format!(
            "{at}: size {} is not dataBlocks × dataBlockSize",
            layer.size
        )));
    }
    Ok(())
}

/// A frame index, when present, has one non-zero entry per frame and adds up to the blob.
fn check_frame_index(layer: &LayerEntry) -> Result<(), String> {
    let c = &layer.data.compression;
    if c.frames.is_empty() {
        return Ok(());
    }
    let want = layer.size.div_ceil(c.frame_size);
    if c.frames.len() as u64 != want {
        return Err(format!(
            "the frame index has {} entries, a {}-byte image in {}-byte frames has {want}",
            c.frames.len(),
            layer.size,
            c.frame_size
        ));
    }
    if c.frames.contains(&0) {
        return Err("the frame index holds a 0-byte frame".into());
    }
    let sum = c.frames.iter().try_fold(0u64, |a, &f| a.checked_add(f));
    if sum != Some(layer.data.size) {
        return Err(format!(
            "the frame index adds up to {} bytes, the data blob is {}",
            sum.map_or("more than 2^64".to_string(), |s| s.to_string()),
            layer.data.size
        ));
    }
    Ok(())
}

/// `xxxxxxxx-xxxx-xxxx-xxxx-xxxxxxxxxxxx`, hex digits.
fn is_uuid(s: &str) -> bool {
    s.len() == 36
        && s.bytes().enumerate().all(|(i, b)| match i {
            8 | 13 | 18 | 23 => b == b'-',
            _ => b.is_ascii_hexdigit(),
        })
}

fn is_lower_hex(s: &str) -> bool {
    s.bytes()
        .all(|b| b.is_ascii_digit() || (b'a'..=b'f').contains(&b))
}

/// Serialize any value as canonical JSON: object keys sorted, no insignificant whitespace.
pub fn canonical_json<T: Serialize>(value: &T) -> Result<Vec<u8>, serde_json::Error> {
    // serde_json::Value's map is a BTreeMap (the `preserve_order` feature is not enabled in
    // this workspace), so going through Value sorts every object's keys.
    let value = serde_json::to_value(value)?;
    serde_json::to_vec(&value)
}

impl StackDescriptor {
    /// The canonical bytes: what is stored as the config blob and what is signed.
    pub fn to_canonical_json(&self) -> Vec<u8> {
        canonical_json(self).expect("a descriptor always serializes")
    }

    /// Parse and validate a descriptor.
    pub fn from_json(bytes: &[u8]) -> Result<Self, DescriptorError> {
        let d: StackDescriptor = serde_json::from_slice(bytes)?;
        d.validate()?;
        Ok(d)
    }

    /// Check the rules serde cannot express.
    pub fn validate(&self) -> Result<(), DescriptorError> {
        if !READ_SCHEMA_VERSIONS.contains(&self.schema_version) {
            return Err(invalid(format!(
                "schemaVersion {} is not supported (this ingot reads {READ_SCHEMA_VERSIONS:?})",
                self.schema_version
            )));
        }
        self.validate_strings()?;
        self.validate_boot()?;
        if self.layers.is_empty() {
            return Err(invalid("a stack has at least one layer"));
        }
        let mut names = BTreeSet::new();
        for (i, layer) in self.layers.iter().enumerate() {
            if !names.insert(layer.name.as_str()) {
                return Err(invalid(format!("layer `{}` appears twice", layer.name)));
            }
            self.validate_layer(i, layer)?;
        }
        Ok(())
    }

    /// The UKI's digest and command line, and the extra kernel arguments.
    fn validate_boot(&self) -> Result<(), DescriptorError> {
        if let Some(uki) = &self.uki {
            if !is_sha256_digest(&uki.digest) {
                return Err(invalid(format!(
                    "uki digest `{}` is not sha256:<64 hex>",
                    uki.digest
                )));
            }
            if uki.cmdline.chars().any(char::is_control) || uki.cmdline.len() > 4096 {
                return Err(invalid(
                    "uki cmdline holds control characters or is too long",
                ));
            }
        }
        for arg in &self.boot.kernel_args {
            if arg.trim().is_empty()
                || arg.chars().any(char::is_control)
                || arg
                    .split_whitespace()
                    .any(|w| w.trim_start_matches('"').starts_with("ingot."))
            {
                return Err(invalid(format!(
                    "boot.kernelArgs {arg:?} is empty, holds a control character or sets an \
                     ingot.* parameter"
                )));
            }
        }
        Ok(())
    }

    /// One layer's rules; `i` is its place in the stack (0 = the base).
    fn validate_layer(&self, i: usize, layer: &LayerEntry) -> Result<(), DescriptorError> {
        let at = format!("layer `{}`", layer.name);
        if i == 0 && layer.when.is_some() {
            return Err(invalid(format!(
                "{at} is the base layer and must not have a rule"
            )));
        }
        if let Some(rule) = &layer.when {
            select::check_depth(rule).map_err(|e| invalid(format!("{at}: {e}")))?;
        }
        match (&layer.sbom, self.schema_version) {
            (None, v) if v >= 2 => {
                return Err(invalid(format!("{at}: schemaVersion {v} needs its `sbom`")))
            }
            (Some(_), 1) => return Err(invalid(format!("{at}: schemaVersion 1 has no `sbom`"))),
            (Some(b), _) if !is_sha256_digest(&b.digest) => {
                return Err(invalid(format!(
                    "{at}: sbom digest `{}` is not sha256:<64 hex>",
                    b.digest
                )))
            }
            _ => {}
        }
        for (what, digest) in [("data", &layer.data.digest), ("hash", &layer.hash.digest)] {
            if !is_sha256_digest(digest) {
                return Err(invalid(format!(
                    "{at}: {what} digest `{digest}` is not sha256:<64 hex>"
                )));
            }
        }
        if layer.data.compression.algorithm != ZSTD {
            return Err(invalid(format!(
                "{at}: compression `{}` is not supported",
                layer.data.compression.algorithm
            )));
        }
        if layer.data.compression.frame_size == 0 {
            return Err(invalid(format!("{at}: frameSize is 0")));
        }
        check_frame_index(layer).map_err(|e| invalid(format!("{at}: {e}")))?;
        check_verity(&at, layer)?;
        for p in &layer.preload {
            if !is_sha256_digest(&p.digest) {
                return Err(invalid(format!(
                    "{at}: preload `{}` digest is not sha256:<64 hex>",
                    p.name
                )));
            }
        }
        Ok(())
    }

    /// The manifest's rules for names, versions, references and paths (see [`names`]): these
    /// strings reach GPT labels, the boot loader's entry and file names, so a signature alone
    /// does not make them safe.
    fn validate_strings(&self) -> Result<(), DescriptorError> {
        let show = |s: &str| format!("{s:?}");
        if !names::is_plain_name(&self.name) {
            return Err(invalid(format!(
                "name {} must be {}",
                show(&self.name),
                names::PLAIN_NAME_RULE
            )));
        }
        if !names::is_version(&self.version) {
            return Err(invalid(format!(
                "version {} must be {}",
                show(&self.version),
                names::VERSION_RULE
            )));
        }
        for (what, text) in [("builder", &self.builder), ("created", &self.created)] {
            if !names::is_label(text) {
                return Err(invalid(format!(
                    "{what} {} holds control characters or is too long",
                    show(text)
                )));
            }
        }
        for (what, path) in [
            ("kernel", &self.boot.kernel),
            ("initrd", &self.boot.initrd),
            ("efi", &self.boot.efi),
        ] {
            if !names::is_layer_path(path) {
                return Err(invalid(format!(
                    "boot.{what} {} must be {}",
                    show(path),
                    names::LAYER_PATH_RULE
                )));
            }
        }
        for (i, layer) in self.layers.iter().enumerate() {
            for (what, text) in [("name", &layer.name), ("kind", &layer.kind)] {
                if !names::is_plain_name(text) {
                    return Err(invalid(format!(
                        "layer {i}: {what} {} must be {}",
                        show(text),
                        names::PLAIN_NAME_RULE
                    )));
                }
            }
            for p in &layer.preload {
                let at = format!("layer `{}`: preload {}", layer.name, show(&p.name));
                if !names::is_plain_name(&p.name) {
                    return Err(invalid(format!(
                        "{at}: the name must be {}",
                        names::PLAIN_NAME_RULE
                    )));
                }
                if !names::is_reference(&p.reference) {
                    return Err(invalid(format!(
                        "{at}: reference {} is not an image reference",
                        show(&p.reference)
                    )));
                }
                if !names::is_layer_path(&p.path) {
                    return Err(invalid(format!(
                        "{at}: path {} must be {}",
                        show(&p.path),
                        names::LAYER_PATH_RULE
                    )));
                }
            }
        }
        Ok(())
    }

    /// The base layer (every machine gets it).
    pub fn base(&self) -> &LayerEntry {
        &self.layers[0]
    }

    /// The layers `machine` gets, in stack order.
    pub fn select<'a>(
        &'a self,
        machine: &'a select::Machine,
    ) -> impl Iterator<Item = &'a LayerEntry> + 'a {
        self.layers
            .iter()
            .filter(move |l| select::selects(l.when.as_ref(), machine))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    pub(crate) fn sample() -> StackDescriptor {
        let layer = |name: &str, kind: &str, when: Option<&str>| LayerEntry {
            name: name.into(),
            kind: kind.into(),
            when: when.map(|w| w.parse().unwrap()),
            size: 8 * 4096,
            data: DataBlob {
                digest: format!("sha256:{}", "a".repeat(64)),
                size: 100,
                compression: Compression {
                    algorithm: ZSTD.into(),
                    frame_size: 4 << 20,
                    frames: vec![100],
                },
            },
            hash: BlobRef {
                digest: format!("sha256:{}", "b".repeat(64)),
                size: 8192,
            },
            verity: VerityInfo {
                root_hash: "c".repeat(64).parse().unwrap(),
                salt: "d".repeat(64),
                uuid: Some("01234567-89ab-cdef-0123-456789abcdef".into()),
                algorithm: "sha256".into(),
                hash_type: 1,
                data_block_size: 4096,
                hash_block_size: 4096,
                data_blocks: 8,
                hash_offset: 0,
                superblock: true,
            },
            preload: vec![],
            sbom: None,
        };
        StackDescriptor {
            schema_version: 1,
            name: "demo".into(),
            version: "1.0.0".into(),
            builder: "ingot 0.1.0".into(),
            created: "2024-01-01T00:00:00Z".into(),
            source_date_epoch: 1_704_067_200,
            boot: BootFiles {
                kernel: "/boot/vmlinuz".into(),
                initrd: "/boot/initrd.img".into(),
                efi: "/usr/lib/systemd/boot/efi/systemd-bootx64.efi".into(),
                bios: None,
                kernel_args: vec![],
            },
            uki: None,
            layers: vec![
                layer("base", "base", None),
                layer("cp", "control-plane", Some("role == control-plane")),
                layer("gpu", "nvidia", Some("gpu == nvidia")),
            ],
        }
    }

    #[test]
    fn a_uki_and_kernel_args_round_trip_and_older_descriptors_stay_the_same() {
        let plain = sample();
        let text = String::from_utf8(plain.to_canonical_json()).unwrap();
        assert!(
            !text.contains("uki") && !text.contains("kernelArgs"),
            "{text}"
        );
        let mut d = sample();
        d.boot.kernel_args = vec!["console=ttyS0".into()];
        d.uki = Some(UkiBlob {
            digest: format!("sha256:{}", "e".repeat(64)),
            size: 9_000_000,
            cmdline: "ingot.stack=demo:1.0.0 ro".into(),
        });
        let back = StackDescriptor::from_json(&d.to_canonical_json()).unwrap();
        assert_eq!(back, d);
        let mut bad = d.clone();
        bad.uki.as_mut().unwrap().digest = "sha256:x".into();
        let e = StackDescriptor::from_json(&bad.to_canonical_json()).unwrap_err();
        assert!(e.to_string().contains("uki digest"), "{e}");
        let mut bad = d;
        bad.boot.kernel_args = vec!["ingot.node=x".into()];
        let e = StackDescriptor::from_json(&bad.to_canonical_json()).unwrap_err();
        assert!(e.to_string().contains("kernelArgs"), "{e}");
    }

    #[test]
    fn verity_parameters_round_trip_through_the_descriptor_text() {
        let params = VerityParams {
            data_blocks: 25,
            salt: (0u8..32).collect(),
            uuid: Some(*b"\x12\x34\x56\x78\x9a\xbc\xde\xf0\x01\x23\x45\x67\x89\xab\xcd\xef"),
            ..VerityParams::default()
        };
        let root: RootHash = "ab".repeat(32).parse().unwrap();
        let info = VerityInfo::new(root, &params);
        let json = serde_json::to_string(&info).unwrap();
        assert!(
            json.contains(
                r#""salt":"000102030405060708090a0b0c0d0e0f101112131415161718191a1b1c1d1e1f""#
            ) && json.contains(r#""uuid":"12345678-9abc-def0-0123-456789abcdef""#)
                && json.contains(r#""algorithm":"sha256""#),
            "{json}"
        );
        let back: VerityInfo = serde_json::from_str(&json).unwrap();
        assert_eq!(back, info);
        assert_eq!(back.params().unwrap(), params);
        // Without a UUID (no superblock UUID in the tree) and with an empty salt.
        let bare = VerityParams {
            salt: Vec::new(),
            uuid: None,
            ..params
        };
        let info = VerityInfo::new(info.root_hash, &bare);
        assert!(!serde_json::to_string(&info).unwrap().contains("uuid"));
        assert_eq!(info.params().unwrap(), bare);
        let mut bad = info;
        bad.salt = "xyz".into();
        assert_eq!(bad.params().unwrap_err().what, "salt is not hex");
    }

    #[test]
    fn canonical_and_round_trip() {
        let d = sample();
        let bytes = d.to_canonical_json();
        let text = std::str::from_utf8(&bytes).unwrap();
        assert!(text.starts_with(r#"{"boot":{"efi":"#), "{text}");
        assert!(!text.contains(": ") && !text.contains(", ") && !text.contains('\n'));
        assert!(text.contains(r#""when":{"role":"control-plane"}"#));
        let back = StackDescriptor::from_json(&bytes).unwrap();
        assert_eq!(back, d);
        assert_eq!(back.to_canonical_json(), bytes);
    }

    #[test]
    #[allow(clippy::too_many_lines)] // one table of bad descriptors, read as a list
    fn strict_parsing() {
        let good: serde_json::Value =
            serde_json::from_slice(&sample().to_canonical_json()).unwrap();
        type Edit = Box<dyn Fn(&mut serde_json::Value)>;
        let cases: Vec<(&str, Edit)> = vec![
            ("unknown field", Box::new(|v| v["extra"] = 1.into())),
            (
                "unknown field",
                Box::new(|v| v["layers"][0]["verity"]["extra"] = 1.into()),
            ),
            (
                "schemaVersion 3",
                Box::new(|v| v["schemaVersion"] = 3.into()),
            ),
            (
                "schemaVersion 2 needs its `sbom`",
                Box::new(|v| v["schemaVersion"] = 2.into()),
            ),
            (
                "schemaVersion 1 has no `sbom`",
                Box::new(|v| {
                    v["layers"][1]["sbom"] = serde_json::json!({"digest": format!("sha256:{}", "e".repeat(64)), "size": 1})
                }),
            ),
            (
                "appears twice",
                Box::new(|v| v["layers"][1]["name"] = "base".into()),
            ),
            (
                "must not have a rule",
                Box::new(|v| v["layers"][0]["when"] = "virt".into()),
            ),
            (
                "is not sha256",
                Box::new(|v| v["layers"][1]["data"]["digest"] = "sha256:xyz".into()),
            ),
            (
                "root hash \"ABCD\": not lower-case hex",
                Box::new(|v| v["layers"][2]["verity"]["rootHash"] = "ABCD".into()),
            ),
            (
                "not dataBlocks",
                Box::new(|v| v["layers"][2]["size"] = 1.into()),
            ),
            (
                "compression `gzip`",
                Box::new(|v| v["layers"][0]["data"]["compression"]["algorithm"] = "gzip".into()),
            ),
            // Issue 15, item 5: what the trusted key signs must still follow the manifest's
            // rules: these strings reach the boot loader's entry and GPT labels.
            (
                "name \"cp init=/bin/sh rd.break\"",
                Box::new(|v| v["layers"][1]["name"] = "cp init=/bin/sh rd.break".into()),
            ),
            (
                "name \"cp\\noptions",
                Box::new(|v| v["layers"][1]["name"] = "cp\noptions init=/bin/sh".into()),
            ),
            (
                "version \"1.0 ingot.x=1\"",
                Box::new(|v| v["version"] = "1.0 ingot.x=1".into()),
            ),
            ("name \"Demo\"", Box::new(|v| v["name"] = "Demo".into())),
            (
                "kind \"x y\"",
                Box::new(|v| v["layers"][2]["kind"] = "x y".into()),
            ),
            (
                "boot.kernel \"/boot/vmlinuz init=/bin/sh\"",
                Box::new(|v| v["boot"]["kernel"] = "/boot/vmlinuz init=/bin/sh".into()),
            ),
            (
                "hashOffset 9223372036854775808",
                Box::new(|v| v["layers"][0]["verity"]["hashOffset"] = (1u64 << 63).into()),
            ),
            (
                "hashOffset 100",
                Box::new(|v| v["layers"][0]["verity"]["hashOffset"] = 100.into()),
            ),
            (
                "uuid `nope`",
                Box::new(|v| v["layers"][0]["verity"]["uuid"] = "nope".into()),
            ),
            (
                "the frame index has 2 entries",
                Box::new(|v| v["layers"][0]["data"]["compression"]["frames"] = vec![50, 50].into()),
            ),
            (
                "adds up to 99 bytes, the data blob is 100",
                Box::new(|v| v["layers"][0]["data"]["compression"]["frames"] = vec![99].into()),
            ),
            (
                "a 0-byte frame",
                Box::new(|v| {
                    v["layers"][0]["data"]["size"] = 0.into();
                    v["layers"][0]["data"]["compression"]["frames"] = vec![0].into();
                }),
            ),
            (
                "missing field `root",
                Box::new(|v| {
                    v["layers"][0]["verity"]
                        .as_object_mut()
                        .unwrap()
                        .remove("rootHash");
                }),
            ),
        ];
        for (want, edit) in cases {
            let mut v = good.clone();
            edit(&mut v);
            let err = StackDescriptor::from_json(&serde_json::to_vec(&v).unwrap())
                .err()
                .unwrap_or_else(|| panic!("accepted: {want}"));
            let cause = std::error::Error::source(&err).map(ToString::to_string);
            let text = format!("{err}: {}", cause.unwrap_or_default());
            assert!(text.contains(want), "{want}: {text}");
        }
    }

    #[test]
    fn frame_index_is_optional() {
        let mut d = sample();
        for l in &mut d.layers {
            l.data.compression.frames.clear();
        }
        let json = d.to_canonical_json();
        assert!(!String::from_utf8_lossy(&json).contains("frames"));
        assert_eq!(StackDescriptor::from_json(&json).unwrap(), d);
    }

    #[test]
    fn select_layers() {
        let d = sample();
        let m = select::Machine {
            role: select::Role::Worker,
            gpus: vec![select::GpuVendor::Nvidia],
            virt: false,
            uefi: true,
        };
        let names: Vec<_> = d.select(&m).map(|l| l.name.as_str()).collect();
        assert_eq!(names, ["base", "gpu"]);
    }
}
