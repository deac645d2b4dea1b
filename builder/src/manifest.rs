//! Stack manifests (`manifests/*.toml`): what a stack release is made of.
//!
//! The format is documented field by field in `docs/manifest.md`. Every error names the file,
//! the line and column, and the reason: [`Manifest::parse`] checks the text (TOML syntax, unknown
//! and missing fields, rules, names, digests), [`Manifest::load`] also checks the inputs on disk
//! (every source exists; tarball and image digests match).

use std::collections::BTreeSet;
use std::fmt;
use std::fs;
use std::ops::Range;
use std::path::{Path, PathBuf};

use ingot_layers::descriptor::{is_sha256_digest, BootFiles};
use ingot_layers::names::{self, is_plain_name};
use ingot_layers::select::{Rule, TextRule};
use ingot_layers::MAX_SOURCE_DATE_EPOCH;
use serde::Deserialize;
use toml::Spanned;

use ingot_artifact::oci_layout::{sha256_file, Layout};

use crate::debian_spec::DebianSpec;

/// The kind of the base layer.
pub const BASE_KIND: &str = "base";
/// The kind of the layer that may carry preloaded images.
pub const CONTROL_PLANE_KIND: &str = "control-plane";

/// A manifest error: where and why.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub struct ManifestError {
    /// The manifest file.
    pub file: PathBuf,
    /// 1-based line and column, when the error points at a place in the file.
    pub position: Option<(usize, usize)>,
    /// What is wrong.
    pub reason: String,
}

impl fmt::Display for ManifestError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self.position {
            Some((line, col)) => write!(f, "{}:{line}:{col}: {}", self.file.display(), self.reason),
            None => write!(f, "{}: {}", self.file.display(), self.reason),
        }
    }
}

/// 1-based line and column of a byte offset.
fn line_col(text: &str, offset: usize) -> (usize, usize) {
    let offset = offset.min(text.len());
    let before = &text.as_bytes()[..offset];
    let line = before.iter().filter(|&&b| b == b'\n').count() + 1;
    let line_start = before
        .iter()
        .rposition(|&b| b == b'\n')
        .map_or(0, |i| i + 1);
    let col = String::from_utf8_lossy(&before[line_start..])
        .chars()
        .count()
        + 1;
    (line, col)
}

/// Where a layer's files come from.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum LayerSource {
    /// A directory tree.
    Dir(PathBuf),
    /// A tarball pinned by its sha256 (lowercase hex).
    Tar {
        /// The tarball.
        path: PathBuf,
        /// Its sha256.
        sha256: String,
    },
    /// An OCI image in an image layout, pinned by manifest digest; flattened, whiteouts applied.
    OciLayout {
        /// The layout directory.
        path: PathBuf,
        /// `sha256:…` of the image manifest.
        digest: String,
    },
    /// A tree made from Debian packages by mmdebstrap and apt, pinned by `stack.lock`
    /// (made by the `debian` module before the layers are built).
    Debian(DebianSpec),
}

/// Where a preloaded image comes from. Registries come in a later release.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum ImageSource {
    /// An OCI image layout directory.
    OciLayout(PathBuf),
}

/// A container image stored in the control-plane layer.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct PreloadSpec {
    /// File name stem and identifier.
    pub name: String,
    /// The reference containerd lists it under, e.g. `registry.k8s.io/pause:3.10`.
    pub reference: String,
    /// `sha256:…` of its manifest (the pin).
    pub digest: String,
    /// Where to get it.
    pub source: ImageSource,
}

/// One layer of the stack.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct LayerSpec {
    /// Unique name.
    pub name: String,
    /// `base`, `control-plane`, `nvidia`, `kata` or another kind.
    pub kind: String,
    /// Selection rule (None only for the base layer).
    pub when: Option<Rule>,
    /// Where its files come from.
    pub source: LayerSource,
    /// Images to preload (control-plane layer only).
    pub preload: Vec<PreloadSpec>,
    /// The operator inputs the layer takes (`ingot build --input NAME=PATH`), by name.
    pub inputs: Vec<String>,
}

pub use crate::debian_spec::KNOWN_INPUTS;

/// A parsed, checked manifest.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Manifest {
    /// The file it came from (paths in it are relative to its directory).
    pub path: PathBuf,
    /// Stack name.
    pub name: String,
    /// Stack release version.
    pub version: String,
    /// Every timestamp in every layer; also the artifact's creation time.
    pub source_date_epoch: u64,
    /// URL of the stack's source repository (the `org.opencontainers.image.source` annotation).
    pub repository: Option<String>,
    /// Files the ESP needs from the base layer.
    pub boot: BootFiles,
    /// Layers, base first.
    pub layers: Vec<LayerSpec>,
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct RawManifest {
    name: Spanned<String>,
    version: Spanned<String>,
    source_date_epoch: Spanned<u64>,
    #[serde(default)]
    repository: Option<String>,
    boot: RawBoot,
    #[serde(rename = "layer", default)]
    layers: Vec<Spanned<RawLayer>>,
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct RawBoot {
    kernel: Spanned<String>,
    initrd: Spanned<String>,
    efi: Spanned<String>,
    #[serde(default)]
    bios: Option<Spanned<String>>,
    #[serde(default)]
    kernel_args: Vec<Spanned<String>>,
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct RawLayer {
    name: Spanned<String>,
    kind: Spanned<String>,
    #[serde(default)]
    when: Option<Spanned<TextRule>>,
    source: Spanned<RawSource>,
    #[serde(default)]
    preload: Vec<Spanned<RawPreload>>,
    #[serde(default)]
    inputs: Vec<Spanned<String>>,
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct RawSource {
    dir: Option<Spanned<String>>,
    tar: Option<Spanned<String>>,
    sha256: Option<Spanned<String>>,
    oci_layout: Option<Spanned<String>>,
    digest: Option<Spanned<String>>,
    debian: Option<Spanned<DebianSpec>>,
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct RawPreload {
    name: Spanned<String>,
    reference: Spanned<String>,
    digest: Spanned<String>,
    oci_layout: Spanned<String>,
}

/// Where a layer's source is written in the manifest.
#[derive(Debug)]
struct SourceSpans {
    path: Range<usize>,
    digest: Option<Range<usize>>,
}

/// Spans of every input the manifest names, kept so [`Manifest::load`] can point at them.
#[derive(Debug, Default)]
struct InputSpans {
    /// per layer
    sources: Vec<SourceSpans>,
    /// per layer: (span of the path, span of the digest) of each preload
    preloads: Vec<Vec<(Range<usize>, Range<usize>)>>,
}

struct Ctx<'a> {
    file: &'a Path,
    text: &'a str,
}

impl Ctx<'_> {
    fn err(&self, span: Option<Range<usize>>, reason: impl Into<String>) -> ManifestError {
        ManifestError {
            file: self.file.to_owned(),
            position: span.map(|s| line_col(self.text, s.start)),
            reason: reason.into(),
        }
    }
}

impl Manifest {
    /// Parse and check a manifest's text; `path` names it in errors and anchors relative paths.
    /// Touches no file.
    pub fn parse(text: &str, path: &Path) -> Result<Self, ManifestError> {
        Self::parse_with_spans(text, path).map(|(m, _)| m)
    }

    /// Read, parse and check a manifest, and check every input it names: directories, tarballs
    /// and layouts exist, tarball and image digests match.
    pub fn load(path: &Path) -> Result<Self, ManifestError> {
        let text = fs::read_to_string(path).map_err(|e| ManifestError {
            file: path.to_owned(),
            position: None,
            reason: format!("reading the manifest: {e}"),
        })?;
        let (manifest, spans) = Self::parse_with_spans(&text, path)?;
        let ctx = Ctx {
            file: path,
            text: &text,
        };
        manifest.check_inputs(&ctx, &spans)?;
        Ok(manifest)
    }

    fn parse_with_spans(text: &str, path: &Path) -> Result<(Self, InputSpans), ManifestError> {
        let ctx = Ctx { file: path, text };
        let raw: RawManifest = toml::from_str(text).map_err(|e| ctx.err(e.span(), e.message()))?;
        let base_dir = path.parent().unwrap_or(Path::new(".")).to_owned();
        let resolve = |p: &str| -> PathBuf {
            let p = Path::new(p);
            if p.is_absolute() {
                p.to_owned()
            } else {
                base_dir.join(p)
            }
        };
        check_top(&ctx, &raw)?;
        if raw.layers.is_empty() {
            return Err(ctx.err(None, "the manifest has no [[layer]]"));
        }

        let mut names = BTreeSet::new();
        let mut layers = Vec::with_capacity(raw.layers.len());
        let mut spans = InputSpans::default();
        for (i, spanned) in raw.layers.iter().enumerate() {
            let (layer, source_spans, preload_spans) =
                parse_layer(&ctx, i, spanned, &mut names, &resolve)?;
            check_over(&ctx, &layer, &layers, &source_spans)?;
            spans.sources.push(source_spans);
            spans.preloads.push(preload_spans);
            layers.push(layer);
        }

        let manifest = Manifest {
            path: path.to_owned(),
            name: raw.name.into_inner(),
            version: raw.version.into_inner(),
            source_date_epoch: raw.source_date_epoch.into_inner(),
            repository: raw.repository,
            boot: BootFiles {
                kernel: raw.boot.kernel.into_inner(),
                initrd: raw.boot.initrd.into_inner(),
                efi: raw.boot.efi.into_inner(),
                bios: raw.boot.bios.map(Spanned::into_inner),
                kernel_args: raw
                    .boot
                    .kernel_args
                    .into_iter()
                    .map(Spanned::into_inner)
                    .collect(),
            },
            layers,
        };
        Ok((manifest, spans))
    }

    /// Hands the operator inputs given on the command line (`--input NAME=PATH`) to the layers
    /// that declare them, each digested. An input no layer declares, or given twice, is an
    /// error; one declared but not given is left out, and the returned lines say what the stack
    /// then lacks (with the digest of each one given). `take` checks one input and gives its
    /// digest (`debian::inputs::take_input`, which knows what each input must hold).
    pub fn give_inputs<E: std::fmt::Display>(
        &mut self,
        given: &[(String, PathBuf)],
        take: impl Fn(&str, &Path) -> Result<String, E>,
    ) -> Result<Vec<String>, ManifestError> {
        let refuse = |reason: String| ManifestError {
            file: self.path.clone(),
            position: None,
            reason,
        };
        let mut seen = BTreeSet::new();
        for (name, _) in given {
            if !seen.insert(name) {
                return Err(refuse(format!("--input {name} is given twice")));
            }
            if !self.layers.iter().any(|l| l.inputs.contains(name)) {
                let declared: BTreeSet<&str> = self
                    .layers
                    .iter()
                    .flat_map(|l| l.inputs.iter().map(String::as_str))
                    .collect();
                return Err(refuse(format!(
                    "--input {name}: no layer takes an input `{name}` (the manifest's layers take: {})",
                    if declared.is_empty() {
                        "none".to_owned()
                    } else {
                        declared.into_iter().collect::<Vec<_>>().join(", ")
                    }
                )));
            }
        }
        let mut said = Vec::new();
        for layer in &mut self.layers {
            for name in &layer.inputs {
                let over = matches!(&layer.source, LayerSource::Debian(d) if d.over.is_some());
                let what = crate::debian_spec::input_gives(name, over);
                let Some((_, path)) = given.iter().find(|(n, _)| n == name) else {
                    said.push(format!(
                        "layer {}: no --input {name}: built WITHOUT {what}",
                        layer.name
                    ));
                    continue;
                };
                let digest =
                    take(name, path).map_err(|e| refuse(format!("--input {name}: {e}")))?;
                said.push(format!(
                    "layer {}: input {name} = {} ({digest})",
                    layer.name,
                    path.display()
                ));
                if let LayerSource::Debian(spec) = &mut layer.source {
                    spec.given_inputs.insert(
                        name.clone(),
                        crate::debian_spec::GivenInput {
                            path: path.clone(),
                            digest,
                        },
                    );
                }
            }
        }
        Ok(said)
    }

    fn check_inputs(&self, ctx: &Ctx<'_>, spans: &InputSpans) -> Result<(), ManifestError> {
        for (i, layer) in self.layers.iter().enumerate() {
            let SourceSpans {
                path: path_span,
                digest: digest_span,
            } = &spans.sources[i];
            let name = &layer.name;
            match &layer.source {
                LayerSource::Dir(dir) => {
                    if !dir.is_dir() {
                        return Err(ctx.err(
                            Some(path_span.clone()),
                            format!(
                                "layer `{name}`: source directory {} does not exist",
                                dir.display()
                            ),
                        ));
                    }
                }
                LayerSource::Tar { path, sha256 } => {
                    if !path.is_file() {
                        return Err(ctx.err(
                            Some(path_span.clone()),
                            format!("layer `{name}`: tarball {} does not exist", path.display()),
                        ));
                    }
                    let (actual, _) = sha256_file(path).map_err(|e| {
                        ctx.err(
                            Some(path_span.clone()),
                            format!("layer `{name}`: reading {}: {e}", path.display()),
                        )
                    })?;
                    if actual[7..] != sha256[..] {
                        return Err(ctx.err(
                            digest_span.clone(),
                            format!(
                                "layer `{name}`: tarball {} has sha256 {}, the manifest pins {sha256}",
                                path.display(),
                                &actual[7..]
                            ),
                        ));
                    }
                }
                // Made by the build (mmdebstrap); nothing on disk to check yet.
                LayerSource::Debian(_) => {}
                LayerSource::OciLayout { path, digest } => {
                    check_image(path, digest).map_err(|(on_digest, reason)| {
                        let span = if on_digest {
                            digest_span.clone()
                        } else {
                            Some(path_span.clone())
                        };
                        ctx.err(span, format!("layer `{name}`: {reason}"))
                    })?;
                }
            }
            for (p, (path_span, digest_span)) in layer.preload.iter().zip(&spans.preloads[i]) {
                let ImageSource::OciLayout(path) = &p.source;
                check_image(path, &p.digest).map_err(|(on_digest, reason)| {
                    let span = if on_digest { digest_span } else { path_span };
                    ctx.err(
                        Some(span.clone()),
                        format!("preload `{}`: {reason}", p.name),
                    )
                })?;
            }
        }
        Ok(())
    }
}

/// The stack's name, version, epoch and boot paths.
fn check_top(ctx: &Ctx<'_>, raw: &RawManifest) -> Result<(), ManifestError> {
    if raw.name.get_ref().is_empty() || !is_plain_name(raw.name.get_ref()) {
        return Err(ctx.err(
            Some(raw.name.span()),
            "`name` must be 1-64 characters of a-z, 0-9, `-`, `_`",
        ));
    }
    if !names::is_version(raw.version.get_ref()) {
        return Err(ctx.err(
            Some(raw.version.span()),
            format!("`version` must be {}", names::VERSION_RULE),
        ));
    }
    if *raw.source_date_epoch.get_ref() > MAX_SOURCE_DATE_EPOCH {
        return Err(ctx.err(
            Some(raw.source_date_epoch.span()),
            format!(
                "`source_date_epoch` {} is past ext4's last timestamp {MAX_SOURCE_DATE_EPOCH} \
                 (2446-05-10T22:38:55Z)",
                raw.source_date_epoch.get_ref()
            ),
        ));
    }
    for (key, value) in [
        ("kernel", &raw.boot.kernel),
        ("initrd", &raw.boot.initrd),
        ("efi", &raw.boot.efi),
    ]
    .into_iter()
    .chain(raw.boot.bios.as_ref().map(|b| ("bios", b)))
    {
        if !names::is_layer_path(value.get_ref()) {
            return Err(ctx.err(
                Some(value.span()),
                format!(
                    "boot.{key} must be an absolute path in the base layer, without spaces, \
                     control characters, `.` or `..`"
                ),
            ));
        }
    }
    for arg in &raw.boot.kernel_args {
        if let Err(e) = ingot_layers::boot::check_kernel_arg(arg.get_ref()) {
            return Err(ctx.err(Some(arg.span()), format!("boot.kernel_args: {e}")));
        }
    }
    Ok(())
}

/// A `(path span, digest span)` pair per preload of a layer.
type PreloadSpans = Vec<(Range<usize>, Range<usize>)>;

/// One `[[layer]]`: its name, kind, rule, source and preloads, checked.
fn parse_layer(
    ctx: &Ctx<'_>,
    i: usize,
    spanned: &Spanned<RawLayer>,
    names: &mut BTreeSet<String>,
    resolve: &dyn Fn(&str) -> PathBuf,
) -> Result<(LayerSpec, SourceSpans, PreloadSpans), ManifestError> {
    let layer_span = spanned.span();
    let l = spanned.get_ref();
    let name = l.name.get_ref();
    if !is_plain_name(name) {
        return Err(ctx.err(
            Some(l.name.span()),
            format!("layer name `{name}` must be 1-64 characters of a-z, 0-9, `-`, `_`"),
        ));
    }
    if !names.insert(name.clone()) {
        return Err(ctx.err(
            Some(l.name.span()),
            format!("duplicate layer name `{name}`"),
        ));
    }
    let kind = l.kind.get_ref();
    if !is_plain_name(kind) {
        return Err(ctx.err(
            Some(l.kind.span()),
            format!("layer kind `{kind}` must be 1-64 characters of a-z, 0-9, `-`, `_`"),
        ));
    }
    let is_base = kind == BASE_KIND;
    match (i, is_base) {
        (0, false) => {
            return Err(ctx.err(
                Some(l.kind.span()),
                "the first layer must be the base layer (kind = \"base\")",
            ))
        }
        (1.., true) => {
            return Err(ctx.err(
                Some(l.kind.span()),
                "only the first layer may be of kind \"base\"",
            ))
        }
        _ => {}
    }
    let when = match (&l.when, is_base) {
        (Some(w), true) => {
            return Err(ctx.err(
                Some(w.span()),
                format!(
                    "layer `{name}` is the base layer: it has no `when` rule (every \
                     machine gets it)"
                ),
            ))
        }
        (None, false) => {
            return Err(ctx.err(
                Some(layer_span),
                format!("layer `{name}` needs a `when` rule"),
            ))
        }
        (Some(w), false) => Some(w.get_ref().0.clone()),
        (None, true) => None,
    };

    let (source, source_spans) = parse_source(ctx, name, &l.source, resolve)?;
    if matches!(&source, LayerSource::Debian(d) if d.boot_integration) && !is_base {
        return Err(ctx.err(
            Some(source_spans.path.clone()),
            format!(
                "layer `{name}`: source.debian.boot_integration makes a bootable base: only a \
                 layer of kind \"base\" takes it (this one is `{kind}`)"
            ),
        ));
    }
    if let LayerSource::Debian(d) = &source {
        let why = match (is_base, &d.over) {
            (false, None) => Some(
                "a layer above the base is installed by apt over a Debian base: name it with \
                 source.debian.over"
                    .to_owned(),
            ),
            (true, Some(o)) => Some(format!(
                "source.debian.over = \"{o}\": the base layer is made by mmdebstrap, over nothing"
            )),
            _ => None,
        };
        if let Some(why) = why {
            return Err(ctx.err(
                Some(source_spans.path.clone()),
                format!("layer `{name}`: {why}"),
            ));
        }
    }
    let (preload, preload_spans) = parse_preloads(ctx, l, name, kind, resolve)?;
    let inputs = parse_inputs(ctx, l, name, &source)?;
    let layer = LayerSpec {
        name: name.clone(),
        kind: kind.clone(),
        when,
        source,
        preload,
        inputs,
    };
    Ok((layer, source_spans, preload_spans))
}

/// A layer installed `over` another names an earlier layer made from Debian packages by
/// mmdebstrap (a base).
fn check_over(
    ctx: &Ctx<'_>,
    layer: &LayerSpec,
    below: &[LayerSpec],
    spans: &SourceSpans,
) -> Result<(), ManifestError> {
    let LayerSource::Debian(DebianSpec { over: Some(o), .. }) = &layer.source else {
        return Ok(());
    };
    let ok = below
        .iter()
        .any(|l| &l.name == o && matches!(&l.source, LayerSource::Debian(d) if d.over.is_none()));
    if ok {
        return Ok(());
    }
    Err(ctx.err(
        Some(spans.path.clone()),
        format!(
            "layer `{}`: source.debian.over = \"{o}\" names no layer below it made from Debian \
             packages by mmdebstrap",
            layer.name
        ),
    ))
}

/// A layer's source: exactly one of `dir`, `tar` (pinned by `sha256`), `oci_layout` (pinned by
/// `digest`) or `debian` (pinned by stack.lock).
fn parse_source(
    ctx: &Ctx<'_>,
    name: &str,
    source: &Spanned<RawSource>,
    resolve: &dyn Fn(&str) -> PathBuf,
) -> Result<(LayerSource, SourceSpans), ManifestError> {
    let src = source.get_ref();
    let src_span = source.span();
    let given = [
        src.dir.is_some(),
        src.tar.is_some(),
        src.oci_layout.is_some(),
        src.debian.is_some(),
    ]
    .iter()
    .filter(|&&b| b)
    .count();
    if given != 1 {
        return Err(ctx.err(
            Some(src_span),
            format!(
                "layer `{name}`: the source needs exactly one of `dir`, `tar`, \
                 `oci_layout` or `debian`"
            ),
        ));
    }
    let (source, path_span, digest_span) = if let Some(debian) = &src.debian {
        parse_debian(ctx, name, src, debian)?
    } else if let Some(dir) = &src.dir {
        if let Some(x) = src.sha256.as_ref().or(src.digest.as_ref()) {
            return Err(ctx.err(
                Some(x.span()),
                "a `dir` source takes no digest (a directory cannot be pinned)",
            ));
        }
        (LayerSource::Dir(resolve(dir.get_ref())), dir.span(), None)
    } else if let Some(tar) = &src.tar {
        if let Some(d) = &src.digest {
            return Err(ctx.err(
                Some(d.span()),
                "a `tar` source is pinned by `sha256`, not `digest`",
            ));
        }
        let Some(sha) = &src.sha256 else {
            return Err(ctx.err(
                Some(src_span),
                format!("layer `{name}`: a `tar` source needs its `sha256` (missing digest)"),
            ));
        };
        let hex = sha.get_ref();
        if hex.len() != 64 || !hex.bytes().all(|b| b.is_ascii_hexdigit()) {
            return Err(ctx.err(Some(sha.span()), "`sha256` must be 64 hex digits"));
        }
        (
            LayerSource::Tar {
                path: resolve(tar.get_ref()),
                sha256: hex.to_ascii_lowercase(),
            },
            tar.span(),
            Some(sha.span()),
        )
    } else {
        let layout = src.oci_layout.as_ref().expect("counted above");
        if let Some(s) = &src.sha256 {
            return Err(ctx.err(
                Some(s.span()),
                "an `oci_layout` source is pinned by `digest`, not `sha256`",
            ));
        }
        let Some(d) = &src.digest else {
            return Err(ctx.err(
                Some(src_span),
                format!(
                    "layer `{name}`: an `oci_layout` source needs the image's `digest` \
                     (missing digest)"
                ),
            ));
        };
        if !is_sha256_digest(d.get_ref()) {
            return Err(ctx.err(Some(d.span()), "`digest` must be sha256:<64 lowercase hex>"));
        }
        (
            LayerSource::OciLayout {
                path: resolve(layout.get_ref()),
                digest: d.get_ref().clone(),
            },
            layout.span(),
            Some(d.span()),
        )
    };
    Ok((
        source,
        SourceSpans {
            path: path_span,
            digest: digest_span,
        },
    ))
}

/// A source, the span of its path (or declaration) and of its digest.
type ParsedSource = (LayerSource, Range<usize>, Option<Range<usize>>);

/// A `debian` source: its declaration checked ([`DebianSpec::check`]), no digest beside it.
fn parse_debian(
    ctx: &Ctx<'_>,
    name: &str,
    src: &RawSource,
    debian: &Spanned<DebianSpec>,
) -> Result<ParsedSource, ManifestError> {
    if let Some(x) = src.sha256.as_ref().or(src.digest.as_ref()) {
        return Err(ctx.err(
            Some(x.span()),
            "a `debian` source takes no digest (stack.lock pins its packages)",
        ));
    }
    debian
        .get_ref()
        .check()
        .map_err(|e| ctx.err(Some(debian.span()), format!("layer `{name}`: {e}")))?;
    Ok((
        LayerSource::Debian(debian.get_ref().clone()),
        debian.span(),
        None,
    ))
}

/// A layer's `inputs`: names ingot knows, each once; the `kubernetes` input goes into a base made
/// with `source.debian.boot_integration` (its kubelet unit is part of the integration).
fn parse_inputs(
    ctx: &Ctx<'_>,
    l: &RawLayer,
    name: &str,
    source: &LayerSource,
) -> Result<Vec<String>, ManifestError> {
    let mut out: Vec<String> = Vec::new();
    for input in &l.inputs {
        let n = input.get_ref();
        let err = |reason: String| ctx.err(Some(input.span()), format!("layer `{name}`: {reason}"));
        if !KNOWN_INPUTS.iter().any(|(k, _)| k == n) {
            return Err(err(format!(
                "inputs: unknown input `{n}` (ingot knows: {})",
                KNOWN_INPUTS
                    .iter()
                    .map(|(k, _)| *k)
                    .collect::<Vec<_>>()
                    .join(", ")
            )));
        }
        if out.contains(n) {
            return Err(err(format!("inputs: `{n}` is listed twice")));
        }
        if let Some(why) = input_refused(n, l.kind.get_ref(), source) {
            return Err(err(format!("inputs: `{n}` {why}")));
        }
        out.push(n.clone());
    }
    Ok(out)
}

/// Why the input `n` cannot go into a layer of this kind and source (`None`: it can). The
/// `kubernetes` input goes into a base made with the boot integration (kubeadm, kubelet and its
/// unit) or a layer installed over it (kubectl); `images` into a control-plane layer made from
/// Debian packages; the others into a layer installed over the base.
fn input_refused(n: &str, kind: &str, source: &LayerSource) -> Option<&'static str> {
    use crate::debian_spec::{
        IMAGES_INPUT, KATA_INPUT, MODULE_SIGNING_INPUT, NVIDIA_TOOLKIT_INPUT,
    };
    let LayerSource::Debian(d) = source else {
        return Some("goes into a layer made from Debian packages (source.debian)");
    };
    let over = d.over.is_some();
    match n {
        crate::debian_spec::KUBERNETES_INPUT if !over && !d.boot_integration => Some(
            "goes into a base made with source.debian.boot_integration = true, or a layer over it",
        ),
        IMAGES_INPUT if kind != CONTROL_PLANE_KIND => {
            Some("goes into a control-plane layer (only it preloads images)")
        }
        NVIDIA_TOOLKIT_INPUT | KATA_INPUT if !over => {
            Some("goes into a layer installed over the base (source.debian.over)")
        }
        MODULE_SIGNING_INPUT if d.dkms.is_none() => {
            Some("signs DKMS modules: it goes into a layer with source.debian.dkms")
        }
        _ => None,
    }
}

/// Parses `NAME=PATH`, the value of `ingot build --input`.
pub fn parse_input_arg(s: &str) -> Result<(String, PathBuf), String> {
    match s.split_once('=') {
        Some((n, p)) if !n.is_empty() && !p.is_empty() => Ok((n.to_owned(), PathBuf::from(p))),
        _ => Err(format!(
            "`{s}` is not NAME=PATH (e.g. kubernetes=/srv/k8s/v1.31)"
        )),
    }
}

/// A layer's preloaded images (control-plane layers only).
fn parse_preloads(
    ctx: &Ctx<'_>,
    l: &RawLayer,
    name: &str,
    kind: &str,
    resolve: &dyn Fn(&str) -> PathBuf,
) -> Result<(Vec<PreloadSpec>, PreloadSpans), ManifestError> {
    if !l.preload.is_empty() && kind != CONTROL_PLANE_KIND {
        return Err(ctx.err(
            Some(l.preload[0].span()),
            format!("layer `{name}`: only a control-plane layer preloads images"),
        ));
    }
    let mut preload = Vec::new();
    let mut preload_spans = Vec::new();
    let mut preload_names = BTreeSet::new();
    for p in &l.preload {
        let p = p.get_ref();
        let pname = p.name.get_ref();
        if !is_plain_name(pname) {
            return Err(ctx.err(
                Some(p.name.span()),
                format!("preload name `{pname}` must be 1-64 characters of a-z, 0-9, `-`, `_`"),
            ));
        }
        if !preload_names.insert(pname.clone()) {
            return Err(ctx.err(
                Some(p.name.span()),
                format!("duplicate preload name `{pname}`"),
            ));
        }
        let reference = p.reference.get_ref();
        if !names::is_reference(reference) {
            return Err(ctx.err(
                Some(p.reference.span()),
                "`reference` must be an image reference like registry/name:tag",
            ));
        }
        if !is_sha256_digest(p.digest.get_ref()) {
            return Err(ctx.err(
                Some(p.digest.span()),
                "`digest` must be sha256:<64 lowercase hex>",
            ));
        }
        preload.push(PreloadSpec {
            name: pname.clone(),
            reference: reference.clone(),
            digest: p.digest.get_ref().clone(),
            source: ImageSource::OciLayout(resolve(p.oci_layout.get_ref())),
        });
        preload_spans.push((p.oci_layout.span(), p.digest.span()));
    }
    Ok((preload, preload_spans))
}

/// Check that the layout at `path` holds a manifest blob with `digest`. On failure: (whether
/// the digest is to blame, reason).
fn check_image(path: &Path, digest: &str) -> Result<(), (bool, String)> {
    if !path.is_dir() {
        return Err((
            false,
            format!("OCI image layout {} does not exist", path.display()),
        ));
    }
    let layout = Layout::open(path).map_err(|e| (false, e.to_string()))?;
    let blob = layout
        .blob_path(digest)
        .map_err(|e| (true, e.to_string()))?;
    if !blob.is_file() {
        return Err((
            true,
            format!(
                "no image with digest {digest} in {} (digest does not match)",
                path.display()
            ),
        ));
    }
    let (actual, _) = sha256_file(&blob).map_err(|e| (false, e.to_string()))?;
    if actual != digest {
        return Err((
            true,
            format!(
                "blob {digest} in {} is corrupt (hashes to {actual})",
                path.display()
            ),
        ));
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    const GOOD: &str = r#"
name = "demo"
version = "1.0.0"
source_date_epoch = 1700000000

[boot]
kernel = "/boot/vmlinuz"
initrd = "/boot/initrd.img"
efi = "/boot/efi/EFI/BOOT/BOOTX64.EFI"

[[layer]]
name = "base"
kind = "base"
source = { dir = "base" }

[[layer]]
name = "cp"
kind = "control-plane"
when = "role == control-plane"
source = { tar = "cp.tar", sha256 = "0000000000000000000000000000000000000000000000000000000000000000" }

[[layer.preload]]
name = "hello"
reference = "example.invalid/hello:1"
digest = "sha256:1111111111111111111111111111111111111111111111111111111111111111"
oci_layout = "images/hello"

[[layer]]
name = "gpu"
kind = "nvidia"
when = "all(gpu == nvidia, uefi)"
source = { oci_layout = "images/gpu", digest = "sha256:2222222222222222222222222222222222222222222222222222222222222222" }
"#;

    fn parse(text: &str) -> Result<Manifest, ManifestError> {
        Manifest::parse(text, Path::new("/m/demo.toml"))
    }

    #[test]
    fn parses_the_good_one() {
        let m = parse(GOOD).unwrap();
        assert_eq!(m.layers.len(), 3);
        assert_eq!(m.layers[0].source, LayerSource::Dir("/m/base".into()));
        assert!(m.layers[0].when.is_none());
        assert_eq!(m.layers[1].preload[0].reference, "example.invalid/hello:1");
        assert_eq!(
            m.layers[2].when.as_ref().unwrap().to_string(),
            "all(gpu == nvidia, uefi)"
        );
    }

    /// Each case: an edit of GOOD, the line the error must point at, words it must contain.
    #[test]
    fn errors_name_file_line_and_reason() {
        let cases: [(&str, &str, usize, &str); 11] = [
            ("name = \"base\"\nkind = \"base\"", "name = \"base\"\nkind = \"base\"\ncolour = \"red\"", 14, "unknown field `colour`"),
            ("digest = \"sha256:1111111111111111111111111111111111111111111111111111111111111111\"\n", "", 22, "missing field `digest`"),
            ("name = \"gpu\"", "name = \"cp\"", 29, "duplicate layer name `cp`"),
            ("kind = \"base\"\n", "kind = \"base\"\nwhen = \"virt\"\n", 14, "has no `when` rule"),
            ("role == control-plane", "role == boss", 19, "unknown role `boss`"),
            (", digest = \"sha256:2222222222222222222222222222222222222222222222222222222222222222\"", "", 32, "missing digest"),
            ("sha256 = \"0000000000000000000000000000000000000000000000000000000000000000\"", "sha256 = \"00\"", 20, "64 hex digits"),
            ("when = \"all(gpu == nvidia, uefi)\"\n", "", 28, "needs a `when` rule"),
            ("source_date_epoch = 1700000000", "source_date_epoch = \"soon\"", 4, "invalid type"),
            // Issue 15, item 7: inode times would wrap to 1901, `created` would say year 292277026596.
            ("source_date_epoch = 1700000000", "source_date_epoch = 15032385536", 4, "past ext4's last timestamp 15032385535"),
            ("source_date_epoch = 1700000000", "source_date_epoch = 9223372036854775807", 4, "past ext4's last timestamp 15032385535"),
        ];
        for (from, to, line, want) in cases {
            assert!(GOOD.contains(from), "{from}");
            let text = GOOD.replacen(from, to, 1);
            let err = parse(&text).unwrap_err();
            let shown = err.to_string();
            assert!(shown.starts_with("/m/demo.toml:"), "{shown}");
            assert!(shown.contains(want), "want `{want}` in: {shown}");
            assert_eq!(err.position.map(|p| p.0), Some(line), "{shown}");
        }
    }

    const DEBIAN: &str = r#"
name = "node"
version = "1.0.0"
source_date_epoch = 1700000000

[boot]
kernel = "/boot/vmlinuz"
initrd = "/boot/initrd.img"
efi = "/boot/efi/EFI/BOOT/BOOTX64.EFI"

[[layer]]
name = "base"
kind = "base"

[layer.source.debian]
variant = "minbase"
packages = ["systemd", "linux-image-amd64"]

[[layer.source.debian.archive]]
mirror = "http://deb.debian.org/debian"
suites = ["bookworm", "bookworm-updates"]
components = ["main"]
"#;

    #[test]
    fn debian_sources_parse_and_are_checked() {
        let m = parse(DEBIAN).unwrap();
        let LayerSource::Debian(d) = &m.layers[0].source else {
            panic!("{:?}", m.layers[0].source)
        };
        assert_eq!(d.packages, ["systemd", "linux-image-amd64"]);
        assert_eq!(d.archives[0].suites, ["bookworm", "bookworm-updates"]);

        let cases: [(&str, &str, usize, &str); 5] = [
            (
                r#""systemd""#,
                r#""systemd=252""#,
                15,
                "source.debian.packages[0]: `systemd=252`",
            ),
            (
                r#""bookworm-updates""#,
                r#""""#,
                15,
                "source.debian.archive[0].suites[1]",
            ),
            (
                r#"variant = "minbase""#,
                "variant = \"minbase\"\nrelease = \"12\"",
                17,
                "unknown field `release`",
            ),
            (
                r#""http://deb.debian.org/debian""#,
                r#""deb.debian.org""#,
                15,
                "source.debian.archive[0].mirror",
            ),
            (
                "kind = \"base\"\n",
                "kind = \"base\"\n[layer.source]\nsha256 = \"00\"\n",
                15,
                "a `debian` source takes no digest",
            ),
        ];
        for (from, to, line, want) in cases {
            assert!(DEBIAN.contains(from), "{from}");
            let err = parse(&DEBIAN.replacen(from, to, 1)).unwrap_err();
            let shown = err.to_string();
            assert!(shown.contains(want), "want `{want}` in: {shown}");
            assert_eq!(err.position.map(|p| p.0), Some(line), "{shown}");
        }
        // A layer above the base is installed `over` a Debian base.
        let gpu = "[[layer]]\nname = \"gpu\"\nkind = \"nvidia\"\nwhen = \"gpu == nvidia\"\n[layer.source.debian]";
        let mut two = DEBIAN.replace(
            "name = \"base\"\nkind = \"base\"",
            "name = \"base\"\nkind = \"base\"\nsource = { dir = \"b\" }",
        );
        two = two.replace("[layer.source.debian]", gpu);
        let err = parse(&two).unwrap_err().to_string();
        assert!(err.contains("layer `gpu`: a layer above the base"), "{err}");
        let over = two.replace(gpu, &format!("{gpu}\nover = \"base\""));
        let err = parse(&over).unwrap_err().to_string();
        assert!(
            err.contains("over = \"base\" names no layer below it made from Debian"),
            "{err}"
        );
        let archive = &DEBIAN[DEBIAN.find("[[layer.source.debian.archive]]").unwrap()..];
        let good = format!(
            "{DEBIAN}\n{gpu}\nover = \"base\"\npackages = [\"nvidia-smi\"]\n{}",
            archive
        );
        let m = parse(&good).unwrap();
        let LayerSource::Debian(d) = &m.layers[1].source else {
            panic!()
        };
        assert_eq!(d.over.as_deref(), Some("base"));
        let base_over = DEBIAN.replace("variant = \"minbase\"", "over = \"base\"");
        let err = parse(&base_over).unwrap_err().to_string();
        assert!(
            err.contains("the base layer is made by mmdebstrap"),
            "{err}"
        );
    }

    #[test]
    fn boot_integration_and_inputs_are_checked() {
        let with = DEBIAN.replace(
            "variant = \"minbase\"",
            "variant = \"minbase\"\nboot_integration = true",
        );
        let with_inputs = with.replace(
            "kind = \"base\"\n",
            "kind = \"base\"\ninputs = [\"kubernetes\"]\n",
        );
        let m = parse(&with_inputs).unwrap();
        assert_eq!(m.layers[0].inputs, ["kubernetes"]);
        let LayerSource::Debian(d) = &m.layers[0].source else {
            panic!()
        };
        assert!(d.boot_integration);

        // On a layer that is not the base: refused, naming the field.
        let not_base = with.replace(
            "name = \"base\"\nkind = \"base\"\n",
            "name = \"base\"\nkind = \"base\"\nsource = { dir = \"b\" }\n[[layer]]\nname = \"gpu\"\nkind = \"nvidia\"\nwhen = \"gpu == nvidia\"\n",
        );
        let err = parse(&not_base).unwrap_err().to_string();
        assert!(
            err.contains("layer `gpu`: source.debian.boot_integration makes a bootable base"),
            "{err}"
        );
        for (inputs, want) in [
            (
                "[\"image\"]",
                "unknown input `image` (ingot knows: kubernetes, nvidia-toolkit, kata, images, module-signing)",
            ),
            ("[\"images\"]", "`images` goes into a control-plane layer"),
            (
                "[\"kata\"]",
                "`kata` goes into a layer installed over the base",
            ),
            (
                "[\"kubernetes\", \"kubernetes\"]",
                "`kubernetes` is listed twice",
            ),
        ] {
            let text = with.replace(
                "kind = \"base\"\n",
                &format!("kind = \"base\"\ninputs = {inputs}\n"),
            );
            let err = parse(&text).unwrap_err();
            assert!(err.to_string().contains(want), "{err}");
            assert_eq!(err.position.map(|p| p.0), Some(14), "{err}");
        }
        // Without boot_integration there is nothing to put kubelet's unit in.
        let text = DEBIAN.replace(
            "kind = \"base\"\n",
            "kind = \"base\"\ninputs = [\"kubernetes\"]\n",
        );
        let err = parse(&text).unwrap_err().to_string();
        assert!(err.contains("boot_integration = true"), "{err}");
    }

    #[test]
    fn given_inputs_reach_their_layer_and_missing_ones_are_said() {
        let take = crate::debian::inputs::take_input;
        let text = DEBIAN
            .replace(
                "variant = \"minbase\"",
                "variant = \"minbase\"\nboot_integration = true",
            )
            .replace(
                "kind = \"base\"\n",
                "kind = \"base\"\ninputs = [\"kubernetes\"]\n",
            );
        let mut m = parse(&text).unwrap();
        let said = m.clone().give_inputs(&[], take).unwrap();
        assert_eq!(
            said,
            ["layer base: no --input kubernetes: built WITHOUT kubeadm and kubelet (with its unit, enabled)"]
        );
        let dir = tempfile::tempdir().unwrap();
        std::fs::write(dir.path().join("kubeadm"), "x").unwrap();
        let given = [("kubernetes".to_owned(), dir.path().to_owned())];
        let said = m.give_inputs(&given, take).unwrap();
        assert!(
            said[0].starts_with("layer base: input kubernetes = "),
            "{said:?}"
        );
        let LayerSource::Debian(d) = &m.layers[0].source else {
            panic!()
        };
        assert_eq!(d.given_inputs["kubernetes"].path, dir.path());
        assert!(said[0].ends_with(&format!("({})", d.given_inputs["kubernetes"].digest)));

        let err = m
            .clone()
            .give_inputs(&[("images".to_owned(), dir.path().to_owned())], take)
            .unwrap_err()
            .to_string();
        assert!(
            err.contains("--input images: no layer takes an input `images` (the manifest's layers take: kubernetes)"),
            "{err}"
        );
        let twice = [given[0].clone(), given[0].clone()];
        let err = m.clone().give_inputs(&twice, take).unwrap_err().to_string();
        assert!(err.contains("--input kubernetes is given twice"), "{err}");
        let err = m
            .give_inputs(&[("kubernetes".to_owned(), dir.path().join("nope"))], take)
            .unwrap_err()
            .to_string();
        assert!(err.contains("not a directory"), "{err}");
        assert!(parse_input_arg("kubernetes").is_err());
        assert_eq!(
            parse_input_arg("kubernetes=/a=b").unwrap(),
            ("kubernetes".to_owned(), PathBuf::from("/a=b"))
        );
    }

    /// The node stack's manifest (manifests/debian/stack.toml) declares every layer: a base
    /// with boot_integration that takes the kubernetes input, and the nvidia (with its DKMS
    /// modules and the linker cache), kata and control-plane layers installed over it.
    #[test]
    fn the_node_manifest_declares_every_layer() {
        let text = include_str!("../../manifests/debian/stack.toml");
        let m = Manifest::parse(text, Path::new("/m/stack.toml")).unwrap();
        let debian = |i: usize| match &m.layers[i].source {
            LayerSource::Debian(d) => d.clone(),
            other => panic!("{other:?}"),
        };
        let base = debian(0);
        assert!(base.boot_integration);
        assert_eq!(m.layers[0].inputs, ["kubernetes"]);
        for p in [
            "linux-image-amd64",
            "initramfs-tools",
            "systemd-boot-efi",
            "grub-pc-bin",
        ] {
            assert!(base.packages.iter().any(|x| x == p), "{p}");
        }
        let names: Vec<&str> = m.layers.iter().map(|l| l.name.as_str()).collect();
        assert_eq!(names, ["base", "nvidia", "kata", "control-plane"]);
        for i in 1..4 {
            assert_eq!(debian(i).over.as_deref(), Some("base"));
        }
        let nvidia = debian(1);
        assert_eq!(nvidia.dkms.as_deref(), Some("nvidia-kernel-dkms"));
        assert!(nvidia.ld_so_cache && !debian(2).ld_so_cache);
        assert_eq!(m.layers[3].inputs, ["kubernetes", "images"]);
        let files = debian(3).files;
        assert_eq!(files[0].path, "/usr/lib/ingot/control-plane-health");
        assert_eq!(files[0].mode_bits(), 0o755);
    }

    #[test]
    fn line_col_counts_characters() {
        assert_eq!(line_col("ab\ncd", 0), (1, 1));
        assert_eq!(line_col("ab\ncd", 4), (2, 2));
        assert_eq!(line_col("é\nx", 3), (2, 1));
    }
}
