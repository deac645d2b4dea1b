//! `ingot verify`: check a stack artifact end to end, trusting nothing before the signature.
//!
//! Order: read the manifest and the descriptor bytes it points at → check the minisign signature
//! over those bytes with the trusted key → only then parse the descriptor → check the manifest
//! agrees with it → for every layer, fetch the hash and data blobs by the digests the signed
//! descriptor gives (digest and size), decompress the data, recompute the dm-verity tree and root
//! hash and compare both. The first thing that is wrong stops the run and is named.
//!
//! Exit codes ([`VerifyError::exit_code`]): 0 ok, 1 I/O or malformed input, 2 usage, 3 signature,
//! 4 digest or size mismatch (or the manifest disagrees with the descriptor), 5 layer content or
//! verity mismatch.

use std::fs::{self, File};
use std::io::{self, BufWriter, Read, Write};
use std::path::{Path, PathBuf};
use std::str::FromStr;

use ingot_layers::boot::BootLimitError;
use ingot_layers::descriptor::{
    BootFiles, DescriptorError, LayerEntry, StackDescriptor, ARTIFACT_TYPE, DESCRIPTOR_MEDIA_TYPE,
    LAYER_MEDIA_TYPE, SIGNATURE_ANNOTATION, VERITY_MEDIA_TYPE,
};
use ingot_verity::{HashAlgorithm, HashType, VerityParams};
use tracing::{info, warn};

use crate::compress::{self, FrameError};
use crate::oci_layout::{sha256_digest, ImageManifest, Layout, LayoutError, MAX_MANIFEST_SIZE};
use crate::sign::{signature_key_id, PublicKey, SignError};

/// Where a stack artifact is.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum StackRef {
    /// An OCI image layout directory, and the manifest its `index.json` names by this tag
    /// (`org.opencontainers.image.ref.name`), or the only manifest when none is given.
    Layout(PathBuf, Option<String>),
    /// An artifact in a registry (`oci://HOST[:PORT]/REPO:TAG` or `…@sha256:…`).
    Registry(crate::registry::RegistryRef),
}

impl FromStr for StackRef {
    type Err = String;
    fn from_str(s: &str) -> Result<Self, String> {
        if crate::registry::RegistryRef::is_registry_ref(s) {
            return s.parse().map(StackRef::Registry).map_err(|e| e.to_string());
        }
        // skopeo's spelling: `oci:DIR[:TAG]`, split at the first colon after `oci:` (a DIR
        // holding a colon is given without the prefix, as a plain path).
        let Some(rest) = s.strip_prefix("oci:") else {
            return Ok(StackRef::Layout(PathBuf::from(s), None));
        };
        let (dir, tag) = match rest.split_once(':') {
            Some((dir, tag)) => (dir, Some(tag)),
            None => (rest, None),
        };
        if dir.is_empty() {
            return Err(format!(
                "`{s}`: no directory (write oci:DIR or oci:DIR:TAG)"
            ));
        }
        if let Some(tag) = tag {
            crate::oci_layout::check_ref_name(tag).map_err(|e| format!("`{s}`: {e}"))?;
        }
        Ok(StackRef::Layout(PathBuf::from(dir), tag.map(str::to_owned)))
    }
}

/// The manifest and blobs of one artifact, wherever they are stored.
pub trait ArtifactSource {
    /// A name for messages.
    fn describe(&self) -> String;
    /// The image manifest's bytes and digest (checked against the digest the store gives).
    fn manifest(&self) -> Result<(Vec<u8>, String), VerifyError>;
    /// A small blob, checked against `digest` and `size`.
    fn blob(&self, digest: &str, size: u64) -> Result<Vec<u8>, VerifyError>;
    /// A large blob as a local file, checked against `digest` and `size`.
    fn blob_file(&self, digest: &str, size: u64) -> Result<PathBuf, VerifyError>;
    /// A large blob as a local file whose size is checked but whose digest need not be, for a
    /// caller that checks every byte it uses against something signed and finer-grained (the
    /// writer checks each decompressed block against the layer's verity tree, so hashing the
    /// compressed blob as well would only cost a second pass). Sources that download verify
    /// the digest anyway.
    fn blob_file_unhashed(&self, digest: &str, size: u64) -> Result<PathBuf, VerifyError> {
        self.blob_file(digest, size)
    }
}

impl From<crate::registry::RegistryError> for VerifyError {
    fn from(e: crate::registry::RegistryError) -> Self {
        match e {
            crate::registry::RegistryError::Integrity { .. } => VerifyError::Digest(e.full_text()),
            other => VerifyError::Input(other.full_text()),
        }
    }
}

impl ArtifactSource for crate::registry::source::RegistrySource {
    fn describe(&self) -> String {
        self.display_name()
    }

    fn manifest(&self) -> Result<(Vec<u8>, String), VerifyError> {
        Ok(self.fetch_manifest()?)
    }

    fn blob(&self, digest: &str, size: u64) -> Result<Vec<u8>, VerifyError> {
        Ok(self.fetch_blob(digest, size)?)
    }

    fn blob_file(&self, digest: &str, size: u64) -> Result<PathBuf, VerifyError> {
        Ok(self.download_blob(digest, size)?)
    }
}

/// An artifact in an OCI image layout directory.
#[derive(Debug)]
pub struct LayoutSource {
    layout: Layout,
    tag: Option<String>,
}

impl LayoutSource {
    /// Open a layout holding one manifest.
    pub fn open(path: &Path) -> Result<Self, VerifyError> {
        Self::open_tagged(path, None)
    }

    /// Open a layout, at the manifest `tag` names (`oci:DIR:TAG`), or its only one.
    pub fn open_tagged(path: &Path, tag: Option<&str>) -> Result<Self, VerifyError> {
        Ok(LayoutSource {
            layout: Layout::open(path).map_err(VerifyError::from_layout)?,
            tag: tag.map(str::to_owned),
        })
    }
}

impl ArtifactSource for LayoutSource {
    fn describe(&self) -> String {
        match &self.tag {
            Some(tag) => format!("oci:{}:{tag}", self.layout.root().display()),
            None => self.layout.root().display().to_string(),
        }
    }

    fn manifest(&self) -> Result<(Vec<u8>, String), VerifyError> {
        let desc = match &self.tag {
            Some(tag) => self.layout.find_tagged(tag),
            None => self.layout.find_manifest(None),
        }
        .map_err(VerifyError::from_layout)?;
        let bytes = self
            .layout
            .read_small_blob(&desc.digest, desc.size)
            .map_err(|e| VerifyError::from_layout(e).about("the image manifest"))?;
        Ok((bytes, desc.digest))
    }

    fn blob(&self, digest: &str, size: u64) -> Result<Vec<u8>, VerifyError> {
        self.layout
            .read_blob(digest, size)
            .map_err(VerifyError::from_layout)
    }

    fn blob_file(&self, digest: &str, size: u64) -> Result<PathBuf, VerifyError> {
        self.layout
            .check_blob(digest, size)
            .map_err(VerifyError::from_layout)
    }

    fn blob_file_unhashed(&self, digest: &str, size: u64) -> Result<PathBuf, VerifyError> {
        self.layout
            .present_blob(digest, size)
            .map_err(VerifyError::from_layout)
    }
}

/// Open the store a reference names (a registry with the default options).
pub fn open(stack: &StackRef) -> Result<Box<dyn ArtifactSource>, VerifyError> {
    open_with(stack, crate::registry::RegistryOptions::default())
}

/// Open the store a reference names; `options` say how to reach a registry.
pub fn open_with(
    stack: &StackRef,
    options: crate::registry::RegistryOptions,
) -> Result<Box<dyn ArtifactSource>, VerifyError> {
    match stack {
        StackRef::Layout(p, tag) => Ok(Box::new(LayoutSource::open_tagged(p, tag.as_deref())?)),
        StackRef::Registry(r) => Ok(Box::new(crate::registry::source::RegistrySource::open(
            r, options,
        )?)),
    }
}

/// What to trust.
#[derive(Debug, Clone)]
pub struct Trust {
    /// The public key signatures must verify with.
    pub key: Option<PublicKey>,
    /// Accept an unsigned artifact, or one whose signature fails (reported, not fatal).
    pub allow_unsigned: bool,
}

/// What the signature check found.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum SignatureStatus {
    /// Verified with the trusted key.
    Verified {
        /// The key's id.
        key_id: String,
        /// The signed trusted comment.
        trusted_comment: String,
    },
    /// No signature (accepted with `--allow-unsigned`).
    Unsigned,
    /// A signature, not checked (no key given, `--allow-unsigned`).
    NotChecked,
    /// A signature that failed (accepted with `--allow-unsigned`).
    Failed(String),
}

/// A successful verification.
#[derive(Debug, Clone)]
pub struct VerifyReport {
    /// `sha256:…` of the image manifest.
    pub manifest_digest: String,
    /// `sha256:…` of the descriptor.
    pub descriptor_digest: String,
    /// The signature's state.
    pub signature: SignatureStatus,
    /// The verified descriptor.
    pub descriptor: StackDescriptor,
}

/// The first thing found wrong.
#[derive(Debug, thiserror::Error)]
pub enum VerifyError {
    /// Reading failed, or the input is not an ingot artifact.
    #[error("{0}")]
    Input(String),
    /// Missing, malformed or failing signature.
    #[error("signature: {0}")]
    Signature(String),
    /// A blob's digest or size is wrong, or the manifest disagrees with the signed descriptor.
    #[error("{0}")]
    Digest(String),
    /// A layer's content does not match its signed verity root hash or tree.
    #[error("{0}")]
    Verity(String),
    /// The stack breaks a limit of the boot contract: it would not boot as the writer lays it
    /// out (too many layers, a missing or oversized boot file).
    #[error("stack `{stack}` cannot boot")]
    Boot {
        stack: String,
        #[source]
        source: ingot_layers::boot::BootLimitError,
    },
}

impl VerifyError {
    /// The documented exit code.
    pub fn exit_code(&self) -> u8 {
        match self {
            VerifyError::Input(_) => 1,
            VerifyError::Signature(_) => 3,
            VerifyError::Digest(_) => 4,
            VerifyError::Verity(_) => 5,
            VerifyError::Boot { .. } => 1,
        }
    }

    fn from_layout(e: LayoutError) -> Self {
        match e {
            LayoutError::Missing { .. } | LayoutError::Digest { .. } | LayoutError::Size { .. } => {
                VerifyError::Digest(e.to_string())
            }
            other => VerifyError::Input(other.to_string()),
        }
    }

    fn about(self, what: &str) -> Self {
        match self {
            VerifyError::Input(m) => VerifyError::Input(format!("{what}: {m}")),
            VerifyError::Signature(m) => VerifyError::Signature(format!("{what}: {m}")),
            VerifyError::Digest(m) => VerifyError::Digest(format!("{what}: {m}")),
            VerifyError::Verity(m) => VerifyError::Verity(format!("{what}: {m}")),
            boot @ VerifyError::Boot { .. } => boot,
        }
    }
}

/// Read the manifest and the descriptor, check the signature, parse the descriptor, check the
/// manifest agrees with it. Blobs are not read.
pub fn verify_metadata(
    source: &dyn ArtifactSource,
    trust: &Trust,
) -> Result<(VerifyReport, ImageManifest), VerifyError> {
    let (manifest_bytes, manifest_digest) = source.manifest()?;
    let manifest: ImageManifest = serde_json::from_slice(&manifest_bytes)
        .map_err(|e| VerifyError::Input(format!("the image manifest is not valid: {e}")))?;
    if manifest.artifact_type.as_deref() != Some(ARTIFACT_TYPE)
        || manifest.config.media_type != DESCRIPTOR_MEDIA_TYPE
    {
        return Err(VerifyError::Input(format!(
            "{} is not an ingot stack (artifactType {:?}, config {})",
            source.describe(),
            manifest.artifact_type,
            manifest.config.media_type
        )));
    }
    if manifest.config.size > MAX_MANIFEST_SIZE {
        return Err(VerifyError::Input(format!(
            "the stack descriptor {} is {} bytes, more than the {MAX_MANIFEST_SIZE} bytes it may \
             have (not read)",
            manifest.config.digest, manifest.config.size
        )));
    }
    let descriptor_bytes = source
        .blob(&manifest.config.digest, manifest.config.size)
        .map_err(|e| e.about("the stack descriptor"))?;
    let descriptor_digest = sha256_digest(&descriptor_bytes);

    // The signature, before anything in the descriptor is believed.
    let signature = match (manifest.annotation(SIGNATURE_ANNOTATION), &trust.key) {
        (None, _) if trust.allow_unsigned => {
            warn!("the artifact is not signed (accepted: unsigned artifacts allowed)");
            SignatureStatus::Unsigned
        }
        (None, _) => {
            // No flag named here: only `ingot verify` has --allow-unsigned, the writer none.
            return Err(VerifyError::Signature(format!(
                "the manifest has no `{SIGNATURE_ANNOTATION}` annotation: the artifact is \
                 unsigned (refused)"
            )));
        }
        (Some(_), None) if trust.allow_unsigned => SignatureStatus::NotChecked,
        (Some(_), None) => {
            return Err(VerifyError::Signature(
                "no trusted key given (--trust-key PUB)".to_owned(),
            ))
        }
        (Some(sig), Some(key)) => match key.verify(&descriptor_bytes, sig) {
            Ok(comment) => SignatureStatus::Verified {
                key_id: key.key_id(),
                trusted_comment: comment,
            },
            Err(e) => {
                let msg = describe_sig_error(&e, sig);
                if trust.allow_unsigned {
                    warn!("signature: {msg} (accepted: --allow-unsigned)");
                    SignatureStatus::Failed(msg)
                } else {
                    return Err(VerifyError::Signature(msg));
                }
            }
        },
    };

    let descriptor = StackDescriptor::from_json(&descriptor_bytes).map_err(|e| match e {
        DescriptorError::Json(_) | DescriptorError::Invalid(_) => VerifyError::Input(e.to_string()),
    })?;

    // The manifest must list exactly the blobs the descriptor names, in order.
    let want = descriptor.layers.len() * 2;
    if manifest.layers.len() != want {
        return Err(VerifyError::Digest(format!(
            "the manifest lists {} layer blobs, the signed descriptor names {want}",
            manifest.layers.len()
        )));
    }
    for (i, layer) in descriptor.layers.iter().enumerate() {
        let pairs = [
            (
                &manifest.layers[2 * i],
                LAYER_MEDIA_TYPE,
                &layer.data.digest,
                layer.data.size,
                "data",
            ),
            (
                &manifest.layers[2 * i + 1],
                VERITY_MEDIA_TYPE,
                &layer.hash.digest,
                layer.hash.size,
                "hash",
            ),
        ];
        for (desc, media_type, digest, size, what) in pairs {
            if desc.media_type != media_type || &desc.digest != digest || desc.size != size {
                return Err(VerifyError::Digest(format!(
                    "layer `{}`: the manifest's {what} blob ({} {} bytes) is not the one the \
                     signed descriptor names ({digest} {size} bytes)",
                    layer.name, desc.digest, desc.size
                )));
            }
        }
    }
    Ok((
        VerifyReport {
            manifest_digest,
            descriptor_digest,
            signature,
            descriptor,
        },
        manifest,
    ))
}

fn describe_sig_error(e: &SignError, sig: &str) -> String {
    match e {
        SignError::Invalid(m) => m.clone(),
        other => format!(
            "{other} (signature key id {})",
            signature_key_id(sig).unwrap_or_else(|| "?".to_owned())
        ),
    }
}

/// Verify everything: signature, digests, and every layer's verity tree. `work` holds the
/// decompressed images while they are checked (one at a time).
pub fn verify(
    source: &dyn ArtifactSource,
    trust: &Trust,
    work: &Path,
) -> Result<VerifyReport, VerifyError> {
    let (report, _) = verify_metadata(source, trust)?;
    let d = &report.descriptor;
    let refuse = |source| VerifyError::Boot {
        stack: format!("{} {}", d.name, d.version),
        source,
    };
    let names: Vec<&str> = d.layers.iter().map(|l| l.name.as_str()).collect();
    ingot_layers::boot::check_stack(&d.name, &d.version, &names, d.boot.bios.is_some())
        .map_err(refuse)?;
    for (i, layer) in d.layers.iter().enumerate() {
        let boot = (i == 0).then_some(&d.boot);
        verify_layer(source, layer, boot, work).map_err(|e| match e {
            VerifyError::Boot { source, .. } => refuse(source),
            other => other,
        })?;
        info!(
            "layer `{}`: root hash {} ok",
            layer.name, layer.verity.root_hash
        );
    }
    Ok(report)
}

/// The verity parameters a layer entry of the signed descriptor names.
pub fn verity_params(layer: &LayerEntry) -> Result<VerityParams, VerifyError> {
    let v = &layer.verity;
    let bad = |what: &str| VerifyError::Input(format!("layer `{}`: {what}", layer.name));
    Ok(VerityParams {
        hash_type: HashType::from_u32(v.hash_type).map_err(|e| bad(&e.to_string()))?,
        algorithm: HashAlgorithm::from_name(&v.algorithm).map_err(|e| bad(&e.to_string()))?,
        data_block_size: v.data_block_size,
        hash_block_size: v.hash_block_size,
        data_blocks: v.data_blocks,
        salt: hex::decode(&v.salt).map_err(|_| bad("salt is not hex"))?,
        uuid: match &v.uuid {
            None => None,
            Some(u) => Some(ingot_verity::parse_uuid(u).ok_or_else(|| bad("bad verity uuid"))?),
        },
        hash_offset: v.hash_offset,
        superblock: v.superblock,
    })
}

fn io_input(what: &str, path: &Path) -> impl FnOnce(io::Error) -> VerifyError {
    let what = format!("{what} {}", path.display());
    move |e| VerifyError::Input(format!("{what}: {e}"))
}

/// The boot files in the base layer's verified image: regular files (symlinks followed, as the
/// writer reads them) that fit the writer's default ESP.
fn check_boot_files(img: &Path, boot: &BootFiles) -> Result<(), BootLimitError> {
    let unopened = |reason: String| BootLimitError::BootFile {
        what: "kernel",
        path: boot.kernel.clone(),
        reason: format!("the base layer's image does not open: {reason}"),
    };
    let file = File::open(img).map_err(|e| unopened(e.to_string()))?;
    let fs =
        ext4_view::Ext4::load(Box::new(ImageFile(file))).map_err(|e| unopened(e.to_string()))?;
    let size = |what: &'static str, path: &str| {
        let refuse = |reason: String| BootLimitError::BootFile {
            what,
            path: path.to_string(),
            reason,
        };
        let meta = fs.metadata(path).map_err(|e| refuse(e.to_string()))?;
        if !meta.file_type().is_regular_file() {
            return Err(refuse("is not a regular file in the base layer".into()));
        }
        Ok(meta.len())
    };
    let (kernel, initrd, efi) = (
        size("kernel", &boot.kernel)?,
        size("initrd", &boot.initrd)?,
        size("efi", &boot.efi)?,
    );
    ingot_layers::boot::check_esp_room(kernel, initrd, efi, ingot_layers::boot::DEFAULT_ESP_SIZE)
}

/// The decompressed, verified image, read by position (ext4-view's own file reader needs its
/// `std` feature, which this workspace leaves off).
struct ImageFile(File);

impl ext4_view::Ext4Read for ImageFile {
    fn read(
        &mut self,
        start: u64,
        dst: &mut [u8],
    ) -> Result<(), Box<dyn std::error::Error + Send + Sync + 'static>> {
        use std::os::unix::fs::FileExt;
        Ok(self.0.read_exact_at(dst, start)?)
    }
}

/// Checks one layer's blobs against the signed descriptor; `boot`, for the base layer: the
/// boot files its image must hold.
fn verify_layer(
    source: &dyn ArtifactSource,
    layer: &LayerEntry,
    boot: Option<&BootFiles>,
    work: &Path,
) -> Result<(), VerifyError> {
    let name = &layer.name;
    let hash_blob = source
        .blob_file(&layer.hash.digest, layer.hash.size)
        .map_err(|e| e.about(&format!("layer `{name}`: hash blob")))?;
    let data_blob = source
        .blob_file(&layer.data.digest, layer.data.size)
        .map_err(|e| e.about(&format!("layer `{name}`: data blob")))?;
    let params = verity_params(layer)?;

    let dir = tempfile::Builder::new()
        .prefix(".ingot-verify-")
        .tempdir_in(work)
        .map_err(io_input("creating a temporary directory in", work))?;
    let img = dir.path().join("image");
    {
        // Read, not mapped: a blob that shrinks under a map kills the process with SIGBUS
        // (and leaves the temporary directory); read, it is an error naming the layer.
        let blob = File::open(&data_blob).map_err(io_input("opening", &data_blob))?;
        let file = File::create(&img).map_err(io_input("creating", &img))?;
        let mut out = BufWriter::with_capacity(1 << 20, file);
        compress::decompress_frames_file(
            &blob,
            layer.data.size,
            layer.data.compression.frame_size,
            layer.size,
            &mut out,
        )
        .map_err(|e| match e {
            FrameError::Io(e) => VerifyError::Input(format!("writing {}: {e}", img.display())),
            FrameError::Read(e) => VerifyError::Input(format!(
                "layer `{name}`: reading {}: {e}",
                data_blob.display()
            )),
            FrameError::Shrank { .. } => VerifyError::Input(format!(
                "layer `{name}`: data blob {}: {e}",
                data_blob.display()
            )),
            other => VerifyError::Verity(format!(
                "layer `{name}`: the data blob does not decompress to the signed image: {other}"
            )),
        })?;
        out.flush().map_err(io_input("writing", &img))?;
    }
    let tree = dir.path().join("verity");
    let result = ingot_verity::format_file(&img, &tree, &params).map_err(|e| {
        VerifyError::Input(format!("layer `{name}`: computing the verity tree: {e}"))
    })?;
    let root = result.root_hash;
    if root != layer.verity.root_hash {
        return Err(VerifyError::Verity(format!(
            "layer `{name}`: verity root hash mismatch: the signed descriptor says {}, the \
             layer's data gives {root}",
            layer.verity.root_hash
        )));
    }
    if !same_bytes(&tree, &hash_blob).map_err(|e| VerifyError::Input(e.to_string()))? {
        return Err(VerifyError::Verity(format!(
            "layer `{name}`: the hash blob is not the verity tree of the layer's data \
             (root hash {root} matches, tree bytes differ)"
        )));
    }
    if let Some(boot) = boot {
        check_boot_files(&img, boot).map_err(|source| VerifyError::Boot {
            stack: String::new(),
            source,
        })?;
    }
    fs::remove_file(&img).map_err(io_input("removing", &img))?;
    Ok(())
}

fn same_bytes(a: &Path, b: &Path) -> io::Result<bool> {
    let (fa, fb) = (File::open(a)?, File::open(b)?);
    if fa.metadata()?.len() != fb.metadata()?.len() {
        return Ok(false);
    }
    let (mut ra, mut rb) = (io::BufReader::new(fa), io::BufReader::new(fb));
    let (mut ba, mut bb) = (vec![0u8; 1 << 20], vec![0u8; 1 << 20]);
    loop {
        let n = read_full(&mut ra, &mut ba)?;
        let m = read_full(&mut rb, &mut bb)?;
        if n != m || ba[..n] != bb[..m] {
            return Ok(false);
        }
        if n == 0 {
            return Ok(true);
        }
    }
}

fn read_full(r: &mut impl Read, buf: &mut [u8]) -> io::Result<usize> {
    let mut n = 0;
    while n < buf.len() {
        match r.read(&mut buf[n..])? {
            0 => break,
            k => n += k,
        }
    }
    Ok(n)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn stack_refs() {
        assert_eq!(
            "out/demo".parse::<StackRef>().unwrap(),
            StackRef::Layout("out/demo".into(), None)
        );
        assert_eq!(
            "oci:out/demo".parse::<StackRef>().unwrap(),
            StackRef::Layout("out/demo".into(), None)
        );
        assert_eq!(
            "oci:out/demo:1.0.0".parse::<StackRef>().unwrap(),
            StackRef::Layout("out/demo".into(), Some("1.0.0".into()))
        );
        for bad in ["oci:", "oci::1.0", "oci:out/demo:", "oci:out/demo:a b"] {
            assert!(bad.parse::<StackRef>().is_err(), "{bad}");
        }
        assert!(matches!(
            "oci://registry.example/stack:1".parse::<StackRef>().unwrap(),
            StackRef::Registry(r) if r.registry == "registry.example" && r.repository == "stack"
        ));
        let err = "oci://registry.example/Stack:1"
            .parse::<StackRef>()
            .unwrap_err();
        assert!(err.contains("not a registry reference"), "{err}");
    }
}
