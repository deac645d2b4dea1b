//! `ingot build`: a manifest becomes a signed OCI image layout.
//!
//! Every layer is built in parallel (ext4 image + dm-verity tree), its image compressed in
//! independent zstd frames; then the stack descriptor is written, signed, and referenced from an
//! OCI image manifest. Everything happens in a temporary directory next to the output, renamed
//! into place at the end: a failed build leaves nothing behind.

use std::collections::BTreeMap;
use std::fs;
use std::io;
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::Instant;

use indicatif::{MultiProgress, ProgressBar, ProgressDrawTarget, ProgressStyle};
use ingot_artifact::sbom::{self, DebPackage, SbomError};
use ingot_artifact::stack_format::{
    self, DESCRIPTOR_MEDIA_TYPE, LAYER_MEDIA_TYPE, SBOM_MEDIA_TYPE, UKI_MEDIA_TYPE,
    VERITY_MEDIA_TYPE,
};
use ingot_layers::boot::{self as boot_limits, BootLimitError};
use ingot_layers::descriptor::{
    BlobRef, Compression, DataBlob, LayerEntry, PreloadEntry, StackDescriptor, UkiBlob, VerityInfo,
    MAX_DESCRIPTOR_SIZE, SCHEMA_VERSION, ZSTD,
};
use ingot_layers::ext4::Ext4Options;
use ingot_layers::stack_rules::{self, LayerSummary, RuleError};
use ingot_layers::tree::{split_path, DataSource, FileData, Meta, Node, NodeKind, Tree};
use ingot_layers::{LayerError, Source};
use rayon::prelude::*;
use tracing::{info, warn};

use crate::manifest::{LayerSource, LayerSpec, Manifest, BASE_KIND};
use crate::preload::{self, PreloadError};
use crate::uki::{self, BootParts, SecureBootKey, UkiError};
use ingot_artifact::compress;
use ingot_artifact::oci_layout::{sha256_file, LayoutWriter};
use ingot_artifact::pcr_policy::PcrKey;
use ingot_artifact::sign::SecretKey;

/// How to build.
#[derive(Debug)]
pub struct BuildOptions {
    /// The OCI image layout directory to write.
    pub out: PathBuf,
    /// Sign the descriptor with this key (unsigned without).
    pub sign_key: Option<SecretKey>,
    /// Uncompressed bytes per zstd frame.
    pub frame_size: usize,
    /// zstd level.
    pub zstd_level: i32,
    /// Source revision for the `org.opencontainers.image.revision` annotation.
    pub revision: Option<String>,
    /// Replace `out` if it exists.
    pub force: bool,
    /// Draw progress bars (on a terminal).
    pub progress: bool,
    /// Each layer's phases as `--json` events ([`crate::events`]; off: none).
    pub events: crate::events::Events,
    /// Make the release's signed UKI with this Secure Boot db key ([`crate::uki`]).
    pub secure_boot: Option<SecureBootKey>,
    /// Give that UKI a signed PCR 11 policy with this RSA key (PEM, [`ingot_artifact::pcr_policy`]).
    pub pcr_key: Option<PathBuf>,
}

/// What a build produced.
#[derive(Debug, Clone)]
pub struct BuildOutput {
    /// The layout directory.
    pub out: PathBuf,
    /// `sha256:…` of the image manifest.
    pub manifest_digest: String,
    /// `sha256:…` of the stack descriptor.
    pub descriptor_digest: String,
    /// The descriptor.
    pub descriptor: StackDescriptor,
    /// Whether the manifest carries a signature.
    pub signed: bool,
}

/// Why a build failed.
#[derive(Debug, thiserror::Error)]
pub enum BuildError {
    /// The output exists and `force` was not given.
    #[error("{} exists (use --force to replace it)", .0.display())]
    OutputExists(PathBuf),
    /// `force` was given but the output is not a layout a build wrote.
    #[error(
        "{}: --force only replaces a previous OCI image layout ({reason}); remove it yourself \
         if it is meant to go",
        path.display()
    )]
    NotALayout {
        /// The output.
        path: PathBuf,
        /// What makes it something else.
        reason: String,
    },
    /// A layer could not be built.
    #[error("layer `{layer}`")]
    Layer {
        /// The layer.
        layer: String,
        /// Why.
        source: LayerError,
    },
    /// An image could not be preloaded.
    #[error("layer `{layer}`")]
    Preload {
        /// The layer.
        layer: String,
        /// Why.
        source: PreloadError,
    },
    /// A layer made from Debian packages reached the build without its tree.
    #[error("layer `{0}`: its Debian tree was not made before the build (ingot::debian::tree)")]
    TreeNotMade(String),
    /// A file operation failed.
    #[error("{what} {}", path.display())]
    Io {
        /// What was being done.
        what: &'static str,
        /// On which path.
        path: PathBuf,
        /// The error.
        source: io::Error,
    },
    /// The stack breaks a limit of the boot contract (checked with every layer selected and a
    /// node layer on top: the most a machine can get).
    #[error("stack `{stack}` cannot boot as built")]
    Boot {
        /// The stack's name.
        stack: String,
        /// The limit.
        source: BootLimitError,
    },
    /// The layers break a stack rule (`ingot_layers::stack_rules`).
    #[error(transparent)]
    Rules(#[from] RuleError),
    /// The Secure Boot db key cannot sign a UKI firmware is required to accept.
    #[error(transparent)]
    SecureBootKey(#[from] crate::db_key::DbKeyError),
    #[error("the PCR key {}", path.display())]
    PcrKey {
        path: PathBuf,
        #[source]
        source: ingot_artifact::pcr_policy::PcrPolicyError,
    },
    /// The signed UKI could not be made.
    #[error("stack `{stack}`: the Secure Boot UKI")]
    Uki {
        /// The stack's name.
        stack: String,
        /// Why.
        source: UkiError,
    },
    /// A layer's dpkg status is refused.
    #[error(transparent)]
    Sbom(#[from] SbomError),
    /// The descriptor is larger than readers accept.
    #[error(
        "the stack descriptor is {size} bytes, more than the {MAX_DESCRIPTOR_SIZE} bytes every \
         reader accepts ({layers} layers)"
    )]
    DescriptorTooLarge {
        /// Its canonical size.
        size: usize,
        /// How many layers it names.
        layers: usize,
    },
}

fn io_err(what: &'static str, path: &Path) -> impl FnOnce(io::Error) -> BuildError {
    let path = path.to_owned();
    move |source| BuildError::Io { what, path, source }
}

/// RFC 3339 UTC time of a Unix timestamp (no leap seconds, as Unix time has none).
pub fn rfc3339(epoch: u64) -> String {
    let days = (epoch / 86_400) as i64;
    let secs = epoch % 86_400;
    // Howard Hinnant's days-to-civil.
    let z = days + 719_468;
    let era = z.div_euclid(146_097);
    let doe = z.rem_euclid(146_097);
    let yoe = (doe - doe / 1460 + doe / 36_524 - doe / 146_096) / 365;
    let doy = doe - (365 * yoe + yoe / 4 - yoe / 100);
    let mp = (5 * doy + 2) / 153;
    let day = doy - (153 * mp + 2) / 5 + 1;
    let month = if mp < 10 { mp + 3 } else { mp - 9 };
    let year = yoe + era * 400 + i64::from(month <= 2);
    format!(
        "{year:04}-{month:02}-{day:02}T{:02}:{:02}:{:02}Z",
        secs / 3600,
        secs % 3600 / 60,
        secs % 60
    )
}

/// The builder's name and version, recorded in the descriptor.
pub fn builder_id() -> String {
    ingot_artifact::version::builder_id()
}

/// The identity a layer's UUIDs and hash seed derive from.
fn layer_seed(manifest: &Manifest, layer: &str) -> Vec<u8> {
    format!("{}\0{}\0{}", manifest.name, manifest.version, layer).into_bytes()
}

/// A layer tree's dpkg status, as read while the tree was checked.
type TreeStatus = Result<Option<Vec<DebPackage>>, SbomError>;
/// What the stack rules need of a layer tree, as read while it was checked.
type TreeSummary = Result<LayerSummary, RuleError>;

/// One built layer, its blobs already in the layout.
struct BuiltLayer {
    entry: LayerEntry,
    /// Its tree's dpkg status (`None`: the tree has none).
    status: Option<Vec<DebPackage>>,
    /// Its tree's distribution, from its os-release (`None`: it has none).
    distro: Option<String>,
    /// What the stack rules need of its tree.
    summary: LayerSummary,
    /// The base layer's boot files for the UKI (a Secure Boot build only).
    boot_parts: Option<BootParts>,
}

fn bar_style() -> ProgressStyle {
    ProgressStyle::with_template("{prefix:>14} {msg:8} [{bar:30}] {bytes:>10}/{total_bytes:10}")
        .expect("valid template")
        .progress_chars("=> ")
}

/// Per layer, the SHA-256 of each package's `.deb` as the build knows it (stack.lock's, for the
/// layers made from `source.debian`): by (name, architecture), with the version it is for.
pub type DebDigests = BTreeMap<String, BTreeMap<(String, String), (String, String)>>;

/// The `.deb` digests `lock` gives, for [`build_with`].
pub fn deb_digests(lock: &crate::debian::lock::Lock) -> DebDigests {
    lock.layers
        .iter()
        .map(|(layer, l)| {
            let packages = l
                .packages
                .iter()
                .map(|p| (p.key(), (p.version.clone(), p.sha256.clone())))
                .collect();
            (layer.clone(), packages)
        })
        .collect()
}

/// Build every layer of `manifest` and write the signed layout at `opts.out`.
pub fn build(manifest: &Manifest, opts: &BuildOptions) -> Result<BuildOutput, BuildError> {
    build_with(manifest, opts, &DebDigests::new())
}

/// [`build`], the SBOMs giving each package's `.deb` SHA-256 where `digests` has it (for the
/// package's exact version; none rather than another version's).
pub fn build_with(
    manifest: &Manifest,
    opts: &BuildOptions,
    digests: &DebDigests,
) -> Result<BuildOutput, BuildError> {
    let started = Instant::now();
    // Before anything is written: a key firmware may refuse is found now, not at first boot.
    if let Some(sb) = &opts.secure_boot {
        let key = crate::db_key::check(&sb.key, &sb.cert)?;
        if let Some(w) = key.warning(&sb.key) {
            warn!("{w}");
        }
    }
    let pcr_key = opts.pcr_key.as_deref().map(read_pcr_key).transpose()?;
    let out = &opts.out;
    let staging = staging_dir(out, opts.force, &manifest.path)?;
    let layout_dir = staging.path().join("layout");
    let work = staging.path().join("work");
    fs::create_dir_all(&work).map_err(io_err("creating", &work))?;
    let writer = LayoutWriter::create(&layout_dir).map_err(io_err("creating", &layout_dir))?;

    let (_multi, bars) = progress_bars(manifest, opts.progress, &opts.events);
    check_boot_contract(manifest)?;
    let built: Vec<BuiltLayer> = manifest
        .layers
        .par_iter()
        .zip(bars.par_iter())
        .map(|(spec, bar)| build_layer(manifest, spec, &work, &writer, opts, bar))
        .collect::<Result<_, _>>()?;

    let mut built = built;
    let summaries: Vec<(&str, &LayerSummary)> = built
        .iter()
        .map(|b| (b.entry.name.as_str(), &b.summary))
        .collect();
    stack_rules::check_stack(&summaries)?;
    write_sboms(manifest, &writer, &mut built, digests)?;
    let mut descriptor = StackDescriptor {
        schema_version: SCHEMA_VERSION,
        name: manifest.name.clone(),
        version: manifest.version.clone(),
        builder: builder_id(),
        created: rfc3339(manifest.source_date_epoch),
        source_date_epoch: manifest.source_date_epoch,
        boot: manifest.boot.clone(),
        layers: built.iter().map(|b| b.entry.clone()).collect(),
        uki: None,
    };
    if let (Some(key), Some(parts)) = (&opts.secure_boot, built[0].boot_parts.take()) {
        let signer = uki::Signer {
            db: key,
            pcr: pcr_key.as_ref(),
        };
        descriptor.uki = Some(write_uki(&descriptor, &parts, &signer, &work, &writer)?);
    }
    let descriptor_bytes = canonical_descriptor(&descriptor)?;
    let config = writer
        .write_blob(DESCRIPTOR_MEDIA_TYPE, &descriptor_bytes)
        .map_err(io_err("writing the descriptor to", &layout_dir))?;

    let signature = opts.sign_key.as_ref().map(|key| {
        let comment =
            stack_format::signature_comment(&manifest.name, &manifest.version, &config.digest);
        key.sign(&descriptor_bytes, &comment)
    });
    let info = stack_format::ManifestInfo {
        revision: opts.revision.clone(),
        source: manifest.repository.clone(),
        signature,
    };
    let image_manifest = stack_format::assemble(&descriptor, &config, &info);
    let manifest_desc = writer
        .finish(&image_manifest, Some(&manifest.version))
        .map_err(io_err("writing the manifest to", &layout_dir))?;
    fs::remove_dir_all(&work).map_err(io_err("removing", &work))?;

    // Swap into place: the old output (with --force) goes into the staging dir, dropped below.
    if out.exists() {
        let old = staging.path().join("old");
        fs::rename(out, &old).map_err(io_err("moving aside", out))?;
    }
    fs::rename(&layout_dir, out).map_err(io_err("renaming the layout to", out))?;
    drop(staging);
    for bar in &bars {
        bar.finish();
    }
    info!(
        "built {} layers in {:.2?}: manifest {}",
        descriptor.layers.len(),
        started.elapsed(),
        manifest_desc.digest
    );
    Ok(BuildOutput {
        out: out.clone(),
        manifest_digest: manifest_desc.digest,
        descriptor_digest: config.digest,
        descriptor,
        signed: opts.sign_key.is_some(),
    })
}

/// A staging directory next to `out` (so that the finished layout is renamed into place),
/// after checking that `out` is free or, with `force`, a layout that may be replaced.
fn staging_dir(out: &Path, force: bool, manifest: &Path) -> Result<tempfile::TempDir, BuildError> {
    if out.symlink_metadata().is_ok() {
        if !force {
            return Err(BuildError::OutputExists(out.to_owned()));
        }
        check_replaceable(out, manifest)?;
    }
    let parent = match out.parent() {
        Some(p) if !p.as_os_str().is_empty() => p.to_owned(),
        _ => PathBuf::from("."),
    };
    fs::create_dir_all(&parent).map_err(io_err("creating", &parent))?;
    let stem = out
        .file_name()
        .map_or_else(|| "layout".into(), |n| n.to_string_lossy().into_owned());
    tempfile::Builder::new()
        .prefix(&format!(".{stem}.partial-"))
        .tempdir_in(&parent)
        .map_err(io_err("creating a temporary directory in", &parent))
}

/// A layer's progress bar and its phases as events.
struct LayerBar {
    bar: ProgressBar,
    log: crate::events::PhaseLog,
}

impl LayerBar {
    /// The layer's next phase: the bar's message, and an event.
    fn phase(&self, what: &'static str) {
        self.bar.set_message(what);
        self.log.start(what);
    }

    fn finish(&self) {
        self.bar.finish();
        self.log.done();
    }
}

/// One progress bar a layer, drawn on stderr when `progress` is set (hidden otherwise).
fn progress_bars(
    manifest: &Manifest,
    progress: bool,
    events: &crate::events::Events,
) -> (MultiProgress, Vec<LayerBar>) {
    let multi = MultiProgress::with_draw_target(if progress {
        ProgressDrawTarget::stderr()
    } else {
        ProgressDrawTarget::hidden()
    });
    let bars: Vec<LayerBar> = manifest
        .layers
        .iter()
        .map(|l| {
            let bar = multi.add(ProgressBar::new(0));
            bar.set_style(bar_style());
            bar.set_prefix(l.name.clone());
            bar.set_message("queued");
            LayerBar {
                bar,
                log: crate::events::PhaseLog::new(events, &l.name),
            }
        })
        .collect();
    (multi, bars)
}

/// The descriptor's canonical bytes, refused when over [`MAX_DESCRIPTOR_SIZE`].
fn canonical_descriptor(descriptor: &StackDescriptor) -> Result<Vec<u8>, BuildError> {
    let descriptor_bytes = descriptor.to_canonical_json();
    if descriptor_bytes.len() as u64 > MAX_DESCRIPTOR_SIZE {
        return Err(BuildError::DescriptorTooLarge {
            size: descriptor_bytes.len(),
            layers: descriptor.layers.len(),
        });
    }
    Ok(descriptor_bytes)
}

/// What a build leaves at `--out`: nothing else may be replaced by `--force`.
const LAYOUT_ENTRIES: &[&str] = &["oci-layout", "index.json", "blobs"];

/// Whether `--force` may replace `out`: a real directory holding an `oci-layout` file and
/// nothing but a layout's entries, and not holding the manifest being built.
fn check_replaceable(out: &Path, manifest: &Path) -> Result<(), BuildError> {
    let refuse = |reason: &str| BuildError::NotALayout {
        path: out.to_owned(),
        reason: reason.to_owned(),
    };
    let meta = fs::symlink_metadata(out).map_err(io_err("reading", out))?;
    if !meta.is_dir() {
        return Err(refuse("it is not a directory"));
    }
    if !out.join("oci-layout").is_file() {
        return Err(refuse("it has no `oci-layout` file"));
    }
    for entry in fs::read_dir(out).map_err(io_err("reading", out))? {
        let name = entry.map_err(io_err("reading", out))?.file_name();
        if !LAYOUT_ENTRIES.iter().any(|e| name == *e) {
            return Err(refuse(&format!(
                "it holds {:?}, which a layout does not",
                name.to_string_lossy()
            )));
        }
    }
    let inside = |p: &Path| {
        let (Ok(p), Ok(o)) = (p.canonicalize(), out.canonicalize()) else {
            return false;
        };
        p.starts_with(o)
    };
    if inside(manifest) {
        return Err(refuse("it holds the manifest being built"));
    }
    Ok(())
}

fn to_layers_source(spec: &LayerSpec) -> Result<Source, BuildError> {
    Ok(match &spec.source {
        // Made into a `dir` by [`crate::debian::tree`] before the build (`ingot build` does).
        LayerSource::Debian(_) => return Err(BuildError::TreeNotMade(spec.name.clone())),
        LayerSource::Dir(p) => Source::Dir(p.clone()),
        LayerSource::Tar { path, .. } => Source::Tar(path.clone()),
        LayerSource::OciLayout { path, digest } => Source::OciLayout {
            path: path.clone(),
            manifest_digest: digest.clone(),
        },
    })
}

/// The partition count and kernel command line of the largest layout the stack can take
/// ([`boot_limits::check_stack`]), refused before any layer is built.
fn check_boot_contract(manifest: &Manifest) -> Result<(), BuildError> {
    let layers: Vec<&str> = manifest.layers.iter().map(|l| l.name.as_str()).collect();
    boot_limits::check_stack(
        &manifest.name,
        &manifest.version,
        &layers,
        manifest.boot.bios.is_some(),
    )
    .map_err(|source| BuildError::Boot {
        stack: manifest.name.clone(),
        source,
    })
}

/// The checks on a layer's tree before its image is written (overlayfs metadata is refused
/// while any source is loaded, [`stack_rules::check_overlay_metadata`]): the `var` rule, and for the base
/// layer the boot files (present, regular files, and within the writer's default ESP).
fn check_tree(manifest: &Manifest, spec: &LayerSpec, tree: &Tree) -> Result<(), LayerError> {
    ingot_layers::var_rule::check(tree, spec.kind == BASE_KIND)?;
    if manifest.layers.first().is_some_and(|b| b.name == spec.name) {
        let boot = |source| LayerError::Boot { source };
        let (kernel, initrd, efi) =
            boot_limits::boot_file_sizes(|p| tree.file_size(p), &manifest.boot).map_err(boot)?;
        boot_limits::check_esp_room(kernel, initrd, efi, boot_limits::DEFAULT_ESP_SIZE)
            .map_err(boot)?;
    }
    Ok(())
}

fn build_layer(
    manifest: &Manifest,
    spec: &LayerSpec,
    work: &Path,
    writer: &LayoutWriter,
    opts: &BuildOptions,
    bar: &LayerBar,
) -> Result<BuiltLayer, BuildError> {
    let name = &spec.name;
    let dir = work.join(name);
    fs::create_dir_all(&dir).map_err(io_err("creating", &dir))?;
    let img = dir.join("image.ext4");
    let hash = dir.join("image.verity");

    let Sealed {
        image_size,
        verity,
        preload,
        status,
        distro,
        summary,
    } = seal_layer(manifest, spec, (&dir, &img, &hash), bar)?;

    bar.phase("zstd");
    bar.bar.set_length(image_size);
    bar.bar.set_position(0);
    let zst = dir.join("image.ext4.zst");
    let compressed =
        compress::compress_file(&img, &zst, opts.frame_size, opts.zstd_level, &|done| {
            bar.bar.set_position(done)
        })
        .map_err(io_err("compressing", &img))?;
    let boot_parts = match &opts.secure_boot {
        Some(_) if manifest.layers.first().is_some_and(|b| b.name == spec.name) => Some(
            uki::read_parts(&img, &manifest.boot).map_err(|source| BuildError::Uki {
                stack: manifest.name.clone(),
                source,
            })?,
        ),
        _ => None,
    };
    fs::remove_file(&img).map_err(io_err("removing", &img))?;
    writer
        .adopt_blob(LAYER_MEDIA_TYPE, &zst, &compressed.digest, compressed.size)
        .map_err(io_err("storing", &zst))?;
    let (hash_digest, hash_size) = sha256_file(&hash).map_err(io_err("hashing", &hash))?;
    writer
        .adopt_blob(VERITY_MEDIA_TYPE, &hash, &hash_digest, hash_size)
        .map_err(io_err("storing", &hash))?;
    bar.bar.set_message("done");
    bar.finish();

    let entry = LayerEntry {
        name: name.clone(),
        kind: spec.kind.clone(),
        when: spec.when.clone(),
        size: image_size,
        data: DataBlob {
            digest: compressed.digest.clone(),
            size: compressed.size,
            compression: Compression {
                algorithm: ZSTD.to_owned(),
                frame_size: opts.frame_size as u64,
                frames: compressed.frames.clone(),
            },
        },
        hash: BlobRef {
            digest: hash_digest,
            size: hash_size,
        },
        verity,
        preload,
        sbom: None,
    };
    Ok(BuiltLayer {
        entry,
        status,
        distro,
        summary,
        boot_parts,
    })
}

/// A layer's image and hash tree, written, with what its tree tells the SBOM and the stack rules.
struct Sealed {
    image_size: u64,
    verity: VerityInfo,
    preload: Vec<PreloadEntry>,
    status: Option<Vec<DebPackage>>,
    distro: Option<String>,
    summary: LayerSummary,
}

/// Writes the layer's ext4 image at `img` and its hash tree at `hash` (staging its preloaded
/// images first when it has some), checking and summarizing its tree on the way.
fn seal_layer(
    manifest: &Manifest,
    spec: &LayerSpec,
    (dir, img, hash): (&Path, &Path, &Path),
    bar: &LayerBar,
) -> Result<Sealed, BuildError> {
    let name = &spec.name;
    let lerr = |source| BuildError::Layer {
        layer: name.clone(),
        source,
    };
    let progress_bar = bar.bar.clone();
    let ext4_opts = Ext4Options {
        seed: layer_seed(manifest, name),
        source_date_epoch: manifest.source_date_epoch,
        size: None,
        progress: Some(Arc::new(move |done, total| {
            progress_bar.set_length(total);
            progress_bar.set_position(done);
        })),
    };
    let source = to_layers_source(spec)?;
    let mut status = Ok(None);
    let mut distro = None;
    let mut summary = Ok(LayerSummary::default());
    let (image_size, verity, preload) = if spec.preload.is_empty() {
        bar.phase("ext4");
        let b = ingot_layers::build_layer_checked(&source, img, Some(hash), &ext4_opts, |t| {
            check_tree(manifest, spec, t)?;
            status = sbom::status_of(t, name);
            distro = sbom::distro_of(t);
            summary = stack_rules::summarize(t, name);
            Ok(())
        })
        .map_err(lerr)?;
        let v = b.verity.expect("a hash path was given");
        (b.image_size, v, Vec::new())
    } else {
        build_with_preload(
            manifest,
            spec,
            &source,
            (dir, img, hash),
            &ext4_opts,
            bar,
            (&mut status, &mut distro, &mut summary),
        )?
    };
    let status = status?;
    Ok(Sealed {
        image_size,
        verity,
        preload,
        status,
        distro,
        summary: summary?,
    })
}

/// The PCR policy key at `path`, checked before anything is written.
fn read_pcr_key(path: &Path) -> Result<PcrKey, BuildError> {
    let pem = fs::read_to_string(path).map_err(io_err("reading the PCR key", path))?;
    PcrKey::from_pem(&pem).map_err(|source| BuildError::PcrKey {
        path: path.to_owned(),
        source,
    })
}

/// The release's UKI ([`uki::make`]) for `descriptor`'s layers, stored as a blob of the
/// layout; what the descriptor pins.
fn write_uki(
    descriptor: &StackDescriptor,
    parts: &BootParts,
    key: &uki::Signer,
    work: &Path,
    writer: &LayoutWriter,
) -> Result<UkiBlob, BuildError> {
    let started = Instant::now();
    let cmdline = boot_limits::signed_cmdline(descriptor);
    let bytes = uki::make(parts, &cmdline, &descriptor.created, key, &work.join("uki")).map_err(
        |source| BuildError::Uki {
            stack: descriptor.name.clone(),
            source,
        },
    )?;
    let desc = writer
        .write_blob(UKI_MEDIA_TYPE, &bytes)
        .map_err(io_err("writing the UKI to", writer.root()))?;
    info!(
        "signed UKI {} ({} bytes) in {:.2?}",
        desc.digest,
        desc.size,
        started.elapsed()
    );
    Ok(UkiBlob {
        digest: desc.digest,
        size: desc.size,
        cmdline,
    })
}

/// Every layer's SBOM blob ([`sbom::layer_packages`] of the layers' statuses), written to the
/// layout and pinned in its descriptor entry.
fn write_sboms(
    manifest: &Manifest,
    writer: &LayoutWriter,
    built: &mut [BuiltLayer],
    digests: &DebDigests,
) -> Result<(), BuildError> {
    let statuses: Vec<_> = built.iter_mut().map(|b| b.status.take()).collect();
    let created = rfc3339(manifest.source_date_epoch);
    // The stack's distribution is its base's (the lowest layer with an os-release): a layer
    // above it installs the base's distribution's packages.
    let distro = built.iter().find_map(|b| b.distro.clone());
    for (b, mut packages) in built.iter_mut().zip(sbom::layer_packages(&statuses)) {
        if let Some(known) = digests.get(&b.entry.name) {
            for p in &mut packages {
                p.sha256 = known
                    .get(&(p.name.clone(), p.arch.clone()))
                    .filter(|(version, _)| *version == p.version)
                    .map(|(_, sha)| sha.clone());
            }
        }
        let info = sbom::DocumentInfo {
            stack: &manifest.name,
            version: &manifest.version,
            layer: &b.entry.name,
            created: &created,
            distro: distro.as_deref(),
        };
        // Refused, naming the layer, when larger than what readers accept.
        let doc = sbom::spdx_document(&info, &packages)?;
        let desc = writer
            .write_blob(SBOM_MEDIA_TYPE, &doc)
            .map_err(io_err("writing an SBOM to", writer.root()))?;
        b.entry.sbom = Some(BlobRef {
            digest: desc.digest,
            size: desc.size,
        });
    }
    Ok(())
}

/// A layer with preloaded images: its source tree plus one archive per image under
/// [`preload::PRELOAD_DIR`], sealed by [`ingot_layers::seal_tree`] like every layer.
fn build_with_preload(
    manifest: &Manifest,
    spec: &LayerSpec,
    source: &Source,
    (dir, img, hash): (&Path, &Path, &Path),
    ext4_opts: &Ext4Options,
    bar: &LayerBar,
    (status, distro, summary): (&mut TreeStatus, &mut Option<String>, &mut TreeSummary),
) -> Result<(u64, VerityInfo, Vec<PreloadEntry>), BuildError> {
    let name = &spec.name;
    let lerr = |source| BuildError::Layer {
        layer: name.clone(),
        source,
    };
    bar.phase("preload");
    let staged = dir.join("preload");
    let entries =
        preload::stage(&spec.preload, manifest.source_date_epoch, &staged).map_err(|source| {
            BuildError::Preload {
                layer: name.clone(),
                source,
            }
        })?;
    bar.phase("ext4");
    let mut tree = source.load(dir).map_err(lerr)?;
    check_tree(manifest, spec, &tree).map_err(lerr)?;
    *status = sbom::status_of(&tree, name);
    *distro = sbom::distro_of(&tree);
    *summary = stack_rules::summarize(&tree, name);
    for e in &entries {
        let file = staged.join(e.path.trim_start_matches('/'));
        let size = fs::metadata(&file).map_err(io_err("reading", &file))?.len();
        let components = split_path(e.path.as_bytes(), true).map_err(lerr)?;
        let node = Node {
            meta: Meta::new(0o644, 0, 0),
            kind: NodeKind::File(FileData {
                size,
                source: DataSource::Path(file.clone()),
                data: std::iter::once(0..size).filter(|r| !r.is_empty()).collect(),
            }),
        };
        tree.insert(&components, node, e.path.as_bytes())
            .map_err(lerr)?;
    }
    bar.phase("ext4+verity");
    let built = ingot_layers::seal_tree(&tree, img, hash, ext4_opts).map_err(lerr)?;
    let verity = built.verity.expect("seal_tree always builds the hash tree");
    Ok((built.image_size, verity, entries))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn rfc3339_dates() {
        assert_eq!(rfc3339(0), "1970-01-01T00:00:00Z");
        assert_eq!(rfc3339(1_700_000_000), "2023-11-14T22:13:20Z");
        assert_eq!(rfc3339(951_782_400), "2000-02-29T00:00:00Z");
        assert_eq!(rfc3339(4_102_444_799), "2099-12-31T23:59:59Z");
    }
}
