//! `ingot diff`: what changed between two stacks, layer by layer and file by file.
//!
//! Layers are matched by name. A layer whose verity root hash is the same on both sides is
//! unchanged (the root hash covers every byte of the image). For a layer that changed, both
//! images are read through [`ingot_artifact::layerfs`], the reader that checks every block against the
//! layer's hash tree (so nothing compared is unverified), and their trees compared: files added,
//! removed, and changed (kind, size, mode, owner, content or symlink target). Each layer's
//! Debian packages, from the SBOMs the descriptors pin, are compared by name and architecture:
//! added, removed, and changed versions.

use std::collections::BTreeMap;
use std::fs::File;
use std::os::unix::fs::FileExt;
use std::path::{Path, PathBuf};
use std::sync::Arc;

use ingot_layers::descriptor::{LayerEntry, StackDescriptor};
use ingot_verity::input::{self, Symlinks};
use ingot_verity::{RootHash, Verifier};
use serde::Serialize;

use crate::display::Safe;
use ingot_artifact::layerfs::{BlockError, FetchError, FrameSource, LayerFs, Node, Refused};
use ingot_artifact::sbom::DebPackage;
use ingot_artifact::verify::{
    layer_packages, verify_metadata, verity_params, ArtifactSource, Trust, VerifyError,
};

/// One side of a comparison.
#[derive(Debug, Clone, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct Side {
    /// What the user named (a layout directory or a registry reference).
    pub reference: String,
    /// `sha256:…` of the image manifest.
    pub manifest_digest: String,
    /// The stack's name.
    pub name: String,
    /// The stack's version.
    pub version: String,
    /// The builder that made it.
    pub builder: String,
}

/// A layer as one side has it.
#[derive(Debug, Clone, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct LayerSide {
    /// The image's size in bytes.
    pub size: u64,
    /// The compressed blob's size.
    pub compressed_size: u64,
    /// The dm-verity root hash.
    pub root_hash: RootHash,
}

/// One inode as [`LayerFs::walk`] saw it, for output.
#[derive(Debug, Clone, Serialize, PartialEq, Eq)]
#[serde(rename_all = "camelCase")]
pub struct FileInfo {
    /// Absolute path in the layer.
    pub path: String,
    /// `file`, `dir`, `symlink`, ...
    pub kind: &'static str,
    /// Size in bytes.
    pub size: u64,
    /// Permission bits in octal, e.g. `0644`.
    pub mode: String,
    /// Owner uid.
    pub uid: u32,
    /// Owner gid.
    pub gid: u32,
}

impl From<&Node> for FileInfo {
    fn from(n: &Node) -> Self {
        FileInfo {
            path: n.path.clone(),
            kind: n.kind,
            size: n.size,
            mode: format!("{:04o}", n.mode),
            uid: n.uid,
            gid: n.gid,
        }
    }
}

/// A path both sides have, that differs.
#[derive(Debug, Clone, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct FileChange {
    /// The path.
    pub path: String,
    /// What differs: `kind`, `size`, `mode`, `owner`, `content`, `target`.
    pub what: Vec<&'static str>,
    /// The first stack's inode.
    pub a: FileInfo,
    /// The second stack's inode.
    pub b: FileInfo,
}

/// What happened to one layer.
#[derive(Debug, Clone, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct LayerDiff {
    /// The layer's name.
    pub name: String,
    /// `unchanged`, `changed`, `added` (only in B) or `removed` (only in A).
    pub status: &'static str,
    /// The layer in A.
    pub a: Option<LayerSide>,
    /// The layer in B.
    pub b: Option<LayerSide>,
    /// Paths only in B (every path of an added layer).
    pub added: Vec<FileInfo>,
    /// Paths only in A (every path of a removed layer).
    pub removed: Vec<FileInfo>,
    /// Paths in both that differ.
    pub changed: Vec<FileChange>,
    /// The Debian packages its SBOMs list that differ.
    pub packages: PackageDiff,
}

/// A package as one side lists it.
#[derive(Debug, Clone, Serialize, PartialEq, Eq)]
pub struct PackageInfo {
    /// Package name.
    pub name: String,
    /// Architecture.
    pub arch: String,
    /// Version.
    pub version: String,
}

/// A package both sides list, at different versions.
#[derive(Debug, Clone, Serialize, PartialEq, Eq)]
pub struct PackageChange {
    /// Package name.
    pub name: String,
    /// Architecture.
    pub arch: String,
    /// Version in A.
    pub a: String,
    /// Version in B.
    pub b: String,
}

/// What changed in one layer's package list (a side without an SBOM lists none).
#[derive(Debug, Clone, Default, Serialize)]
pub struct PackageDiff {
    /// Listed only in B.
    pub added: Vec<PackageInfo>,
    /// Listed only in A.
    pub removed: Vec<PackageInfo>,
    /// Listed in both at other versions.
    pub changed: Vec<PackageChange>,
}

impl PackageDiff {
    fn is_empty(&self) -> bool {
        self.added.is_empty() && self.removed.is_empty() && self.changed.is_empty()
    }
}

/// Compare two package lists, by (name, architecture).
pub fn diff_packages(a: &[DebPackage], b: &[DebPackage]) -> PackageDiff {
    let key = |p: &DebPackage| (p.name.clone(), p.arch.clone());
    let ma: BTreeMap<_, _> = a.iter().map(|p| (key(p), p)).collect();
    let mb: BTreeMap<_, _> = b.iter().map(|p| (key(p), p)).collect();
    let info = |p: &DebPackage| PackageInfo {
        name: p.name.clone(),
        arch: p.arch.clone(),
        version: p.version.clone(),
    };
    let mut out = PackageDiff::default();
    for (k, pa) in &ma {
        match mb.get(k) {
            None => out.removed.push(info(pa)),
            Some(pb) if pb.version != pa.version => out.changed.push(PackageChange {
                name: pa.name.clone(),
                arch: pa.arch.clone(),
                a: pa.version.clone(),
                b: pb.version.clone(),
            }),
            Some(_) => {}
        }
    }
    out.added = mb
        .iter()
        .filter(|(k, _)| !ma.contains_key(*k))
        .map(|(_, p)| info(p))
        .collect();
    out
}

fn packages(
    source: &dyn ArtifactSource,
    entry: Option<&LayerEntry>,
) -> Result<Vec<DebPackage>, VerifyError> {
    Ok(match entry {
        Some(e) => layer_packages(source, e)?.unwrap_or_default(),
        None => Vec::new(),
    })
}

/// The whole comparison.
#[derive(Debug, Clone, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct StackDiff {
    /// The first stack.
    pub a: Side,
    /// The second stack.
    pub b: Side,
    /// Whether any layer differs (the descriptors' other fields, e.g. `builder` or `created`,
    /// are shown in `a`/`b` but do not count).
    pub changed: bool,
    /// Every layer of either side: A's order, then layers only B has.
    pub layers: Vec<LayerDiff>,
}

/// One opened side: its descriptor and the source its blobs come from.
struct Opened<'a> {
    source: &'a dyn ArtifactSource,
    descriptor: StackDescriptor,
    side: Side,
}

fn open_side<'a>(
    reference: &str,
    source: &'a dyn ArtifactSource,
    trust: &Trust,
) -> Result<Opened<'a>, VerifyError> {
    let (report, _) = verify_metadata(source, trust)?;
    let d = report.descriptor;
    Ok(Opened {
        source,
        side: Side {
            reference: reference.to_owned(),
            manifest_digest: report.manifest_digest,
            name: d.name.clone(),
            version: d.version.clone(),
            builder: d.builder.clone(),
        },
        descriptor: d,
    })
}

fn layer_side(e: &LayerEntry) -> LayerSide {
    LayerSide {
        size: e.size,
        compressed_size: e.data.size,
        root_hash: e.verity.root_hash.clone(),
    }
}

/// A layer's file system from its blob, every block checked against its hash tree. The blob is
/// read with `pread`, one zstd frame at a time, not mapped: a blob that shrinks underneath a
/// map kills the process with SIGBUS; here it is an error naming the blob.
fn layer_fs(source: &dyn ArtifactSource, entry: &LayerEntry) -> Result<LayerFs, VerifyError> {
    let params = verity_params(entry)?;
    let hash = source.blob(&entry.hash.digest, entry.hash.size)?;
    let verifier =
        Verifier::from_hash_device(&params, &hash, &entry.verity.root_hash).map_err(|source| {
            VerifyError::HashBlob {
                layer: entry.name.clone(),
                source,
            }
        })?;
    let path = source.blob_file_unhashed(&entry.data.digest, entry.data.size)?;
    let file = input::open_regular(&path, Symlinks::Follow).map_err(|source| VerifyError::Io {
        what: "opening",
        path: path.clone(),
        source,
    })?;
    let frame_size = entry.data.compression.frame_size;
    let starts = frame_starts(&file, &path, entry)?;
    let frames = FileFrames { file, path, starts };
    Ok(LayerFs::fetched(
        &entry.name,
        Box::new(frames),
        frame_size,
        Arc::new(verifier),
    )?)
}

/// A data blob's frames read from its file, one at a time: a single source, so bytes that
/// fail the check are not fetched again (there is nothing to refuse).
struct FileFrames {
    file: File,
    path: PathBuf,
    /// Where each frame starts, then the blob's end.
    starts: Vec<u64>,
}

/// A frame that could not be read from the blob's file.
#[derive(Debug, thiserror::Error)]
#[error("reading {}", path.display())]
struct ReadFrame {
    path: PathBuf,
    #[source]
    source: std::io::Error,
}

impl FrameSource for FileFrames {
    fn count(&self) -> usize {
        self.starts.len() - 1
    }

    fn fetch(&mut self, n: usize) -> Result<Vec<u8>, FetchError> {
        let mut frame = vec![0u8; (self.starts[n + 1] - self.starts[n]) as usize];
        read_full_at(&self.file, &mut frame, self.starts[n]).map_err(|source| ReadFrame {
            path: self.path.clone(),
            source,
        })?;
        Ok(frame)
    }

    fn refuse(&mut self, _: usize, _: &BlockError) -> Result<Option<Refused>, FetchError> {
        Ok(None)
    }
}

/// Fills `buf` from `offset` of the blob, or says where it ended.
fn read_full_at(file: &File, buf: &mut [u8], offset: u64) -> std::io::Result<()> {
    let mut got = 0usize;
    while got < buf.len() {
        match file.read_at(&mut buf[got..], offset + got as u64) {
            Ok(0) => {
                return Err(std::io::Error::new(
                    std::io::ErrorKind::UnexpectedEof,
                    format!(
                        "the data blob ended at byte {} while being read (it shrank)",
                        offset + got as u64
                    ),
                ))
            }
            Ok(n) => got += n,
            Err(e) if e.kind() == std::io::ErrorKind::Interrupted => {}
            Err(e) => return Err(e),
        }
    }
    Ok(())
}

/// Where each zstd frame of the data blob starts, and its end: from the descriptor's frame
/// index, or (stacks built before it) by reading each frame's header in turn.
fn frame_starts(file: &File, path: &Path, entry: &LayerEntry) -> Result<Vec<u64>, VerifyError> {
    if !entry.data.compression.frames.is_empty() {
        return Ok(entry.data.compression.frame_starts());
    }
    let mut starts = vec![0u64];
    let size = entry.data.size;
    // A zstd frame of `frame_size` input bytes is never larger than ZSTD_compressBound of it.
    let fs = entry.data.compression.frame_size;
    let bound = fs
        + fs / 255
        + 64
        + if fs < (128 << 10) {
            ((128 << 10) - fs) >> 11
        } else {
            0
        };
    let mut buf = Vec::new();
    let mut at = 0u64;
    while at < size {
        buf.resize(bound.min(size - at) as usize, 0);
        read_full_at(file, &mut buf, at).map_err(|source| VerifyError::Io {
            what: "reading",
            path: path.to_owned(),
            source,
        })?;
        let len = zstd::zstd_safe::find_frame_compressed_size(&buf).map_err(|code| {
            VerifyError::Frame {
                layer: entry.name.clone(),
                at,
                reason: zstd::zstd_safe::get_error_name(code),
            }
        })?;
        at += len as u64;
        starts.push(at);
    }
    Ok(starts)
}

fn walk(source: &dyn ArtifactSource, entry: &LayerEntry) -> Result<Vec<FileInfo>, VerifyError> {
    let fs = layer_fs(source, entry)?;
    let nodes = fs.walk()?;
    Ok(nodes.iter().map(FileInfo::from).collect())
}

/// What differs between two inodes at the same path; content only when nothing cheaper did.
fn compare(
    a: &Node,
    fa: &LayerFs,
    b: &Node,
    fb: &LayerFs,
) -> Result<Vec<&'static str>, VerifyError> {
    let mut what = Vec::new();
    if a.kind != b.kind {
        what.push("kind");
    }
    if a.size != b.size {
        what.push("size");
    }
    if a.mode != b.mode {
        what.push("mode");
    }
    if (a.uid, a.gid) != (b.uid, b.gid) {
        what.push("owner");
    }
    if a.kind == b.kind && a.size == b.size {
        match a.kind {
            // Hashed in chunks: a changed file may be gigabytes.
            "file" if fa.sha256(&a.path)? != fb.sha256(&b.path)? => {
                what.push("content");
            }
            "symlink" if fa.read_link(&a.path)? != fb.read_link(&b.path)? => {
                what.push("target");
            }
            _ => {}
        }
    }
    Ok(what)
}

fn diff_trees(
    a: (&dyn ArtifactSource, &LayerEntry),
    b: (&dyn ArtifactSource, &LayerEntry),
    out: &mut LayerDiff,
) -> Result<(), VerifyError> {
    let (fa, fb) = (layer_fs(a.0, a.1)?, layer_fs(b.0, b.1)?);
    let na: BTreeMap<String, Node> = fa
        .walk()?
        .into_iter()
        .map(|n| (n.path.clone(), n))
        .collect();
    let nb: BTreeMap<String, Node> = fb
        .walk()?
        .into_iter()
        .map(|n| (n.path.clone(), n))
        .collect();
    for (path, node) in &na {
        match nb.get(path) {
            None => out.removed.push(node.into()),
            Some(other) => {
                let what = compare(node, &fa, other, &fb)?;
                if !what.is_empty() {
                    out.changed.push(FileChange {
                        path: path.clone(),
                        what,
                        a: node.into(),
                        b: other.into(),
                    });
                }
            }
        }
    }
    out.added = nb
        .iter()
        .filter(|(p, _)| !na.contains_key(*p))
        .map(|(_, n)| n.into())
        .collect();
    Ok(())
}

/// Compare stack `a` with stack `b` (named `ref_a`, `ref_b` in the result).
pub fn diff(
    (ref_a, a): (&str, &dyn ArtifactSource),
    (ref_b, b): (&str, &dyn ArtifactSource),
    trust: &Trust,
) -> Result<StackDiff, VerifyError> {
    let a = open_side(ref_a, a, trust)?;
    let b = open_side(ref_b, b, trust)?;
    let find = |d: &StackDescriptor, name: &str| d.layers.iter().find(|l| l.name == name).cloned();
    let mut layers = Vec::new();
    for la in &a.descriptor.layers {
        let lb = find(&b.descriptor, &la.name);
        let mut out = LayerDiff {
            name: la.name.clone(),
            status: "unchanged",
            a: Some(layer_side(la)),
            b: lb.as_ref().map(layer_side),
            added: Vec::new(),
            removed: Vec::new(),
            changed: Vec::new(),
            packages: diff_packages(
                &packages(a.source, Some(la))?,
                &packages(b.source, lb.as_ref())?,
            ),
        };
        match &lb {
            None => {
                out.status = "removed";
                out.removed = walk(a.source, la)?;
            }
            Some(lb) if lb.verity.root_hash != la.verity.root_hash => {
                out.status = "changed";
                diff_trees((a.source, la), (b.source, lb), &mut out)?;
            }
            Some(_) => {}
        }
        layers.push(out);
    }
    for lb in &b.descriptor.layers {
        if find(&a.descriptor, &lb.name).is_none() {
            layers.push(LayerDiff {
                name: lb.name.clone(),
                status: "added",
                a: None,
                b: Some(layer_side(lb)),
                added: walk(b.source, lb)?,
                removed: Vec::new(),
                changed: Vec::new(),
                packages: diff_packages(&[], &packages(b.source, Some(lb))?),
            });
        }
    }
    Ok(StackDiff {
        // Packages live in the SBOM, not the image: a layer whose image is the same but whose
        // SBOM differs (another status below it) counts as a change too.
        changed: layers
            .iter()
            .any(|l| l.status != "unchanged" || !l.packages.is_empty()),
        a: a.side,
        b: b.side,
        layers,
    })
}

/// The human-readable form: one line per layer, then one per file that differs. Every string
/// from the stacks (names, paths, package fields) goes through [`Safe`].
pub fn render(d: &StackDiff) -> String {
    use std::fmt::Write;
    let mut s = String::new();
    for (tag, side) in [("a", &d.a), ("b", &d.b)] {
        let _ = writeln!(
            s,
            "{tag}: {} {} {} ({}; {})",
            Safe(&side.reference),
            Safe(&side.name),
            Safe(&side.version),
            Safe(&side.manifest_digest),
            Safe(&side.builder)
        );
    }
    for l in &d.layers {
        let sizes = |x: &Option<LayerSide>| {
            x.as_ref().map_or("-".to_owned(), |x| {
                format!(
                    "{} B ({} B zstd) root {}",
                    x.size,
                    x.compressed_size,
                    short(&x.root_hash.to_string())
                )
            })
        };
        let _ = writeln!(
            s,
            "layer {:<16} {:<9}  a: {}  b: {}",
            Safe(&l.name),
            l.status,
            sizes(&l.a),
            sizes(&l.b)
        );
        for f in &l.added {
            let _ = writeln!(s, "  + {}", file_line(f));
        }
        for f in &l.removed {
            let _ = writeln!(s, "  - {}", file_line(f));
        }
        for c in &l.changed {
            let _ = writeln!(
                s,
                "  ~ {} ({}): {} -> {}",
                Safe(&c.path),
                c.what.join(", "),
                file_attrs(&c.a),
                file_attrs(&c.b)
            );
        }
        let p = &l.packages;
        for a in &p.added {
            let (name, version, arch) = (Safe(&a.name), Safe(&a.version), Safe(&a.arch));
            let _ = writeln!(s, "  package + {name} {version} {arch}");
        }
        for r in &p.removed {
            let (name, version, arch) = (Safe(&r.name), Safe(&r.version), Safe(&r.arch));
            let _ = writeln!(s, "  package - {name} {version} {arch}");
        }
        for c in &p.changed {
            let (name, arch) = (Safe(&c.name), Safe(&c.arch));
            let (va, vb) = (Safe(&c.a), Safe(&c.b));
            let _ = writeln!(s, "  package ~ {name} {arch}: {va} -> {vb}");
        }
    }
    let _ = writeln!(
        s,
        "{}",
        if d.changed {
            let n = d
                .layers
                .iter()
                .filter(|l| l.status != "unchanged" || !l.packages.is_empty())
                .count();
            format!("{n} of {} layers differ", d.layers.len())
        } else {
            "no change".to_owned()
        }
    );
    s
}

fn short(h: &str) -> &str {
    &h[..h.len().min(16)]
}

fn file_attrs(f: &FileInfo) -> String {
    format!("{} {} B {} {}:{}", f.kind, f.size, f.mode, f.uid, f.gid)
}

fn file_line(f: &FileInfo) -> String {
    format!("{} ({})", Safe(&f.path), file_attrs(f))
}
