//! `ingot verify`: check a stack artifact end to end, trusting nothing before the signature.
//!
//! Order: read the manifest and the descriptor bytes it points at → check the minisign signature
//! over those bytes with the trusted key (or, when the trusted key is a cosign key, a cosign
//! signature of the manifest digest under its `sha256-<HEX>.sig` tag: the manifest's config
//! digest pins the descriptor) → only then parse the descriptor → check the manifest
//! agrees with it → for every layer, fetch the hash, data and SBOM blobs by the digests the
//! signed descriptor gives (digest and size), decompress the data, recompute the dm-verity tree and root
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
use ingot_layers::descriptor::{BootFiles, DescriptorError, LayerEntry, StackDescriptor};
use ingot_verity::VerityParams;
use tracing::{info, warn};

use crate::compress::{self, FrameError};
use crate::cosign::check::CosignCheckError;
use crate::image_file::ImageFile;
use crate::oci_layout::{sha256_digest, ImageManifest, Layout, LayoutError};
use crate::sign::{signature_key_id, PublicKey, SignError};
use crate::stack_format::{self, FormatError, SIGNATURE_ANNOTATION};
use crate::trust_key::TrustedKey;

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
    /// The manifest a tag names beside the artifact (a cosign `sha256-<HEX>.sig` tag), if any:
    /// its bytes and digest. A source without tags has none.
    fn tagged_manifest(&self, _tag: &str) -> Result<Option<(Vec<u8>, String)>, VerifyError> {
        Ok(None)
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

    fn tagged_manifest(&self, tag: &str) -> Result<Option<(Vec<u8>, String)>, VerifyError> {
        match self
            .registry()
            .fetch_manifest(&self.reference().with_tag(tag))
        {
            Ok(found) => Ok(Some(found)),
            Err(crate::registry::RegistryError::NotFound(_)) => Ok(None),
            Err(e) => Err(e.into()),
        }
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
            layout: Layout::open(path).map_err(VerifyError::from)?,
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
        .map_err(VerifyError::from)?;
        let bytes = self
            .layout
            .read_small_blob(&desc.digest, desc.size)
            .map_err(|e| VerifyError::from(e).about("the image manifest"))?;
        Ok((bytes, desc.digest))
    }

    fn blob(&self, digest: &str, size: u64) -> Result<Vec<u8>, VerifyError> {
        self.layout
            .read_blob(digest, size)
            .map_err(VerifyError::from)
    }

    fn blob_file(&self, digest: &str, size: u64) -> Result<PathBuf, VerifyError> {
        self.layout
            .check_blob(digest, size)
            .map_err(VerifyError::from)
    }

    fn blob_file_unhashed(&self, digest: &str, size: u64) -> Result<PathBuf, VerifyError> {
        self.layout
            .present_blob(digest, size)
            .map_err(VerifyError::from)
    }

    /// The manifest `index.json` names by this tag (`org.opencontainers.image.ref.name`).
    fn tagged_manifest(&self, tag: &str) -> Result<Option<(Vec<u8>, String)>, VerifyError> {
        let index = self.layout.index().map_err(VerifyError::from)?;
        let Some(desc) = index
            .manifests
            .into_iter()
            .find(|m| m.annotation(crate::oci_layout::REF_NAME) == Some(tag))
        else {
            return Ok(None);
        };
        let bytes = self
            .layout
            .read_small_blob(&desc.digest, desc.size)
            .map_err(VerifyError::from)?;
        Ok(Some((bytes, desc.digest)))
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
    /// The public key signatures must verify with (minisign or cosign).
    pub key: Option<TrustedKey>,
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

/// Why the signature was refused.
#[derive(Debug, thiserror::Error)]
pub enum SignatureError {
    /// The manifest carries no signature.
    // No flag named here: only `ingot verify` has --allow-unsigned, the writer none.
    #[error(
        "the manifest has no `{SIGNATURE_ANNOTATION}` annotation: the artifact is unsigned \
         (refused)"
    )]
    Unsigned,
    /// A signature, but no key to check it with.
    #[error("no trusted key given (--trust-key PUB)")]
    NoKey,
    /// The signature does not verify with the trusted key.
    #[error("it does not verify with the trusted key (signature key id {key_id})")]
    Rejected {
        /// The key id the signature names (`?` when it names none).
        key_id: String,
        /// Why.
        #[source]
        source: SignError,
    },
    /// The trusted key is a cosign key and no cosign signature verifies with it.
    #[error(transparent)]
    Cosign(#[from] CosignCheckError),
}

/// The first thing found wrong. [`VerifyError::exit_code`] is computed from the variant and its
/// source, never from the text.
#[derive(Debug, thiserror::Error)]
pub enum VerifyError {
    /// Reading the layout failed, or a blob in it is missing or wrong.
    #[error(transparent)]
    Layout(#[from] LayoutError),
    /// The registry failed, or a blob from it is wrong.
    #[error(transparent)]
    Registry(#[from] crate::registry::RegistryError),
    /// The manifest is not a stack's, or disagrees with the signed descriptor.
    #[error(transparent)]
    Format(#[from] FormatError),
    /// The signed descriptor does not parse or breaks the schema.
    #[error(transparent)]
    Descriptor(#[from] DescriptorError),
    /// Missing, malformed or failing signature.
    #[error("signature")]
    Signature(#[source] SignatureError),
    /// A blob a source does not hold.
    #[error("no blob {digest} of {size} bytes")]
    Missing {
        /// Its digest.
        digest: String,
        /// Its size.
        size: u64,
    },
    /// A local file operation failed.
    #[error("{what} {}", path.display())]
    Io {
        /// What was being done.
        what: &'static str,
        /// On which file.
        path: PathBuf,
        /// The error.
        #[source]
        source: io::Error,
    },
    /// The descriptor's verity parameters for a layer are unusable.
    #[error("layer `{layer}`: {what}")]
    Params {
        /// The layer.
        layer: String,
        /// Which parameter.
        what: &'static str,
        /// Why, when a parser said.
        #[source]
        source: Option<ingot_verity::ParamError>,
    },
    /// A layer's data blob does not decompress to its signed image.
    #[error("layer `{layer}`: the data blob does not decompress to the signed image")]
    Decompress {
        /// The layer.
        layer: String,
        /// Why.
        #[source]
        source: FrameError,
    },
    /// The data blob holds no whole zstd frame where the frame index (or the last frame's end)
    /// says one starts.
    #[error("layer `{layer}`: the data blob holds no whole zstd frame at byte {at}: {reason}")]
    Frame {
        /// The layer.
        layer: String,
        /// Byte offset.
        at: u64,
        /// zstd's error name.
        reason: &'static str,
    },
    /// Computing a layer's verity tree failed.
    #[error("layer `{layer}`: computing the verity tree")]
    Tree {
        /// The layer.
        layer: String,
        /// Why.
        #[source]
        source: ingot_verity::VerityError,
    },
    /// A layer's hash blob does not hold the tree its signed root hash names.
    #[error("layer `{layer}`: hash tree")]
    HashBlob {
        /// The layer.
        layer: String,
        /// Why.
        #[source]
        source: ingot_verity::VerityError,
    },
    /// A layer's data gives another root hash than the signed one.
    #[error(
        "layer `{layer}`: verity root hash mismatch: the signed descriptor says {signed}, the \
         layer's data gives {actual}"
    )]
    RootHash {
        /// The layer.
        layer: String,
        /// The descriptor's.
        signed: ingot_verity::RootHash,
        /// The data's.
        actual: ingot_verity::RootHash,
    },
    /// The hash blob is not the tree the data gives (the root hash matches).
    #[error(
        "layer `{layer}`: the hash blob is not the verity tree of the layer's data (root hash \
         {root} matches, tree bytes differ)"
    )]
    TreeBytes {
        /// The layer.
        layer: String,
        /// The root hash both share.
        root: ingot_verity::RootHash,
    },
    /// A layer's SBOM is refused.
    #[error(transparent)]
    Sbom(#[from] crate::sbom::SbomError),
    /// A layer's image does not read as its signed tree says (`ingot diff`'s verifying reader).
    #[error(transparent)]
    LayerFs(#[from] crate::layerfs::LayerFsError),
    /// The stack breaks a limit of the boot contract: it would not boot as the writer lays it
    /// out (too many layers, a missing or oversized boot file).
    #[error("stack `{stack}` cannot boot")]
    Boot {
        /// The stack (name and version).
        stack: String,
        /// The limit.
        #[source]
        source: ingot_layers::boot::BootLimitError,
    },
    /// The UKI the descriptor pins is not one this stack's layers make.
    #[error("the UKI: {reason}")]
    Uki {
        /// What is wrong.
        reason: String,
    },
    /// The UKI the descriptor pins does not parse.
    #[error("the UKI blob")]
    UkiImage(#[source] crate::uki::UkiError),
    /// The UKI's signed PCR policy does not hold.
    #[error("the UKI's PCR policy")]
    PcrPolicy(#[source] crate::pcr_policy::PcrPolicyError),
    /// Which part of the artifact the inner error is about.
    #[error("{what}")]
    About {
        /// e.g. ``layer `base`: data blob``.
        what: String,
        /// The error.
        #[source]
        source: Box<VerifyError>,
    },
}

impl VerifyError {
    /// The documented exit code: 1 I/O or malformed input, 3 signature, 4 digest or size, 5
    /// layer content or verity.
    pub fn exit_code(&self) -> u8 {
        match self {
            VerifyError::Layout(e) => match e {
                LayoutError::Missing { .. }
                | LayoutError::Digest { .. }
                | LayoutError::Size { .. } => 4,
                LayoutError::Io { .. } | LayoutError::Format { .. } => 1,
            },
            VerifyError::Registry(e) => match e {
                crate::registry::RegistryError::Integrity { .. } => 4,
                _ => 1,
            },
            VerifyError::Format(e) if e.is_mismatch() => 4,
            VerifyError::Signature(_) => 3,
            VerifyError::Missing { .. } => 4,
            VerifyError::Decompress { source, .. } => match source {
                FrameError::Io(_) | FrameError::Read(_) | FrameError::Shrank { .. } => 1,
                _ => 5,
            },
            VerifyError::Frame { .. }
            | VerifyError::HashBlob { .. }
            | VerifyError::RootHash { .. }
            | VerifyError::TreeBytes { .. }
            | VerifyError::Uki { .. }
            | VerifyError::UkiImage(_)
            | VerifyError::PcrPolicy(_)
            | VerifyError::LayerFs(_) => 5,
            VerifyError::About { source, .. } => source.exit_code(),
            VerifyError::Format(_)
            | VerifyError::Descriptor(_)
            | VerifyError::Sbom(_)
            | VerifyError::Io { .. }
            | VerifyError::Params { .. }
            | VerifyError::Tree { .. }
            | VerifyError::Boot { .. } => 1,
        }
    }

    /// Whether the signature was refused (at any depth of [`VerifyError::About`]).
    pub fn is_signature(&self) -> bool {
        match self {
            VerifyError::Signature(_) => true,
            VerifyError::About { source, .. } => source.is_signature(),
            _ => false,
        }
    }

    /// The message and every cause, each once (what the commands print).
    pub fn full_text(&self) -> String {
        crate::error_chain::text(self)
    }

    fn about(self, what: impl Into<String>) -> Self {
        match self {
            boot @ VerifyError::Boot { .. } => boot,
            other => VerifyError::About {
                what: what.into(),
                source: Box::new(other),
            },
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
    let manifest = stack_format::parse(&manifest_bytes, &source.describe())?;
    let descriptor_bytes = source
        .blob(&manifest.config.digest, manifest.config.size)
        .map_err(|e| e.about("the stack descriptor"))?;
    let descriptor_digest = sha256_digest(&descriptor_bytes);

    // The signature, before anything in the descriptor is believed.
    let signature = match &trust.key {
        Some(TrustedKey::Cosign(key)) => {
            cosign_status(source, key, &manifest_digest, trust.allow_unsigned)?
        }
        Some(TrustedKey::Minisign(key)) => minisign_status(
            &manifest,
            Some(key),
            &descriptor_bytes,
            trust.allow_unsigned,
        )?,
        None => minisign_status(&manifest, None, &descriptor_bytes, trust.allow_unsigned)?,
    };

    let descriptor = StackDescriptor::from_json(&descriptor_bytes)?;
    stack_format::check_layers(&manifest, &descriptor)?;
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

/// The minisign signature annotation over the descriptor's bytes, checked with `key`.
fn minisign_status(
    manifest: &ImageManifest,
    key: Option<&PublicKey>,
    descriptor_bytes: &[u8],
    allow_unsigned: bool,
) -> Result<SignatureStatus, VerifyError> {
    let refuse = |e| Err(VerifyError::Signature(e));
    Ok(match (manifest.annotation(SIGNATURE_ANNOTATION), key) {
        (None, _) if allow_unsigned => {
            warn!("the artifact is not signed (accepted: unsigned artifacts allowed)");
            SignatureStatus::Unsigned
        }
        (None, _) => return refuse(SignatureError::Unsigned),
        (Some(_), None) if allow_unsigned => SignatureStatus::NotChecked,
        (Some(_), None) => return refuse(SignatureError::NoKey),
        (Some(sig), Some(key)) => match key.verify(descriptor_bytes, sig) {
            Ok(comment) => SignatureStatus::Verified {
                key_id: key.key_id(),
                trusted_comment: comment,
            },
            Err(source) => failed(
                SignatureError::Rejected {
                    key_id: signature_key_id(sig).unwrap_or_else(|| "?".to_owned()),
                    source,
                },
                allow_unsigned,
            )?,
        },
    })
}

/// A refused signature: the error, or with `--allow-unsigned` a warning and the status.
fn failed(e: SignatureError, allow_unsigned: bool) -> Result<SignatureStatus, VerifyError> {
    if !allow_unsigned {
        return Err(VerifyError::Signature(e));
    }
    let msg = crate::error_chain::text(&e);
    warn!("signature: {msg} (accepted: --allow-unsigned)");
    Ok(SignatureStatus::Failed(msg))
}

/// The cosign signature of `manifest_digest` under its `.sig` tag, checked with `key`. The
/// status names the key id and, as its "trusted comment", the tag and the signed repository.
fn cosign_status(
    source: &dyn ArtifactSource,
    key: &crate::cosign::PublicKey,
    manifest_digest: &str,
    allow_unsigned: bool,
) -> Result<SignatureStatus, VerifyError> {
    let tag = crate::cosign::signature_tag(manifest_digest);
    let sig_manifest = source
        .tagged_manifest(&tag)
        .map_err(|e| e.about(format!("the cosign signature manifest `{tag}`")))?;
    let blob = |l: &crate::cosign::sig_manifest::SigLayer| {
        source
            .blob(&l.digest, l.size)
            .map_err(|e| format!("its payload {}: {}", l.digest, e.full_text()))
    };
    let checked = crate::cosign::check::check(
        key,
        manifest_digest,
        &tag,
        &source.describe(),
        sig_manifest.as_ref().map(|(b, _)| b.as_slice()),
        &blob,
    );
    match checked {
        Ok(signed) => Ok(SignatureStatus::Verified {
            key_id: key.key_id(),
            trusted_comment: format!(
                "cosign signature `{tag}` (docker-reference {})",
                signed.docker_reference
            ),
        }),
        Err(e) => failed(SignatureError::Cosign(e), allow_unsigned),
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
    if read_uki(source, d)?.is_some() {
        info!("the UKI: digest and signed command line ok");
    }
    Ok(report)
}

/// The release's UKI, when the descriptor pins one: read by its digest and size (a blob that
/// is not those bytes is refused by the source), and its `.cmdline` section must be exactly the
/// command line the descriptor's layers make ([`ingot_layers::boot::signed_cmdline`]: every
/// layer's name, root hash and rule, the stack's kernel arguments), which the descriptor also
/// records. A PCR policy it carries must hold ([`crate::pcr_policy::of_uki`]). The Authenticode
/// signature is the firmware's to check (`sbverify` in the tests).
pub fn read_uki(
    source: &dyn ArtifactSource,
    d: &StackDescriptor,
) -> Result<Option<Vec<u8>>, VerifyError> {
    let Some(uki) = &d.uki else {
        return Ok(None);
    };
    let refuse = |reason: String| VerifyError::Uki { reason };
    if uki.size > crate::uki::MAX_UKI_SIZE {
        return Err(refuse(format!(
            "{} bytes, more than the {} an ESP holds",
            uki.size,
            crate::uki::MAX_UKI_SIZE
        )));
    }
    let bytes = source
        .blob(&uki.digest, uki.size)
        .map_err(|e| e.about("the UKI blob"))?;
    let inside = crate::uki::cmdline(&bytes).map_err(VerifyError::UkiImage)?;
    let want = ingot_layers::boot::signed_cmdline(d);
    if uki.cmdline != want {
        return Err(refuse(format!(
            "the descriptor records the command line {:?}, its layers make {want:?}",
            uki.cmdline
        )));
    }
    if inside != want {
        return Err(refuse(format!(
            "its .cmdline section is {inside:?}, the signed descriptor's layers make {want:?}"
        )));
    }
    crate::pcr_policy::of_uki(&bytes).map_err(VerifyError::PcrPolicy)?;
    Ok(Some(bytes))
}

/// The Debian packages a layer's SBOM lists (read by its digest and size, as the descriptor
/// pins it), sorted; `None` for a layer without an SBOM (schema version 1).
pub fn layer_packages(
    source: &dyn ArtifactSource,
    layer: &LayerEntry,
) -> Result<Option<Vec<crate::sbom::DebPackage>>, VerifyError> {
    let Some(sbom) = &layer.sbom else {
        return Ok(None);
    };
    if sbom.size > crate::sbom::MAX_SBOM_SIZE {
        return Err(crate::sbom::SbomError::TooLarge {
            layer: layer.name.clone(),
            size: sbom.size,
            limit: crate::sbom::MAX_SBOM_SIZE,
        }
        .into());
    }
    let bytes = source
        .blob(&sbom.digest, sbom.size)
        .map_err(|e| e.about(format!("layer `{}`: SBOM blob", layer.name)))?;
    Ok(Some(crate::sbom::packages_of(&bytes, &layer.name)?))
}

/// The verity parameters a layer entry of the signed descriptor names.
pub fn verity_params(layer: &LayerEntry) -> Result<VerityParams, VerifyError> {
    layer.verity.params().map_err(|e| VerifyError::Params {
        layer: layer.name.clone(),
        what: e.what,
        source: e.source,
    })
}

fn io_input(what: &'static str, path: &Path) -> impl FnOnce(io::Error) -> VerifyError {
    let path = path.to_owned();
    move |source| VerifyError::Io { what, path, source }
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
        .map_err(|e| e.about(format!("layer `{name}`: hash blob")))?;
    let data_blob = source
        .blob_file(&layer.data.digest, layer.data.size)
        .map_err(|e| e.about(format!("layer `{name}`: data blob")))?;
    if let Some(sbom) = &layer.sbom {
        // What the readers (`inspect --packages`, `diff`) would refuse is refused here too.
        if sbom.size > crate::sbom::MAX_SBOM_SIZE {
            return Err(crate::sbom::SbomError::TooLarge {
                layer: name.clone(),
                size: sbom.size,
                limit: crate::sbom::MAX_SBOM_SIZE,
            }
            .into());
        }
        source
            .blob_file(&sbom.digest, sbom.size)
            .map_err(|e| e.about(format!("layer `{name}`: SBOM blob")))?;
    }
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
        .map_err(|source| VerifyError::Decompress {
            layer: name.clone(),
            source,
        })?;
        out.flush().map_err(io_input("writing", &img))?;
    }
    let tree = dir.path().join("verity");
    let result =
        ingot_verity::format_file(&img, &tree, &params).map_err(|source| VerifyError::Tree {
            layer: name.clone(),
            source,
        })?;
    let root = result.root_hash;
    if root != layer.verity.root_hash {
        return Err(VerifyError::RootHash {
            layer: name.clone(),
            signed: layer.verity.root_hash.clone(),
            actual: root,
        });
    }
    if !same_bytes(&tree, &hash_blob)
        .map_err(io_input("comparing the verity tree with", &hash_blob))?
    {
        return Err(VerifyError::TreeBytes {
            layer: name.clone(),
            root,
        });
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
