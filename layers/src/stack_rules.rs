//! Rules `ingot build` enforces for every stack, beside the tree code they walk. Layers are
//! stacked read-only (the base lowest), so a higher layer's entry hides a lower one's: these
//! rules refuse the cases that would hide the base's files unnoticed.
//!
//! - No source, of any kind, may bring overlayfs metadata into a layer: no whiteout (a 0/0
//!   character device) and no `trusted.overlay.*` or `user.overlay.*` attribute
//!   ([`check_overlay_metadata`], run by `Source::load` on every
//!   tree it returns). The node stacks the layers with overlayfs, which honours them: a whiteout
//!   deletes a lower file, `trusted.overlay.opaque` hides a lower directory. Refused, not
//!   stripped: the tree is the author's, and stripping would build a layer that no longer means
//!   what its author's tree did, silently. An OCI image's own `.wh.` entries are applied while it
//!   is flattened and never reach the tree.
//! - A layer may not put a real directory where a lower layer has a symlink (`/lib`, `/bin`,
//!   `/sbin`, `/lib64` over the merged-/usr links, or any other path): the directory would
//!   hide everything the link leads to. Nor anything but a directory (a file, a symlink, a
//!   device) where a lower layer has a directory: it would hide the whole directory.
//! - Besides the base's own, only one layer may carry a kernel's module index (the files
//!   `depmod` writes into `/usr/lib/modules/KVER`, [`MODULE_INDEX_FILES`]; the highest copy of
//!   each hides every other layer's modules), unless each of the higher layer's files lists
//!   everything the lower ones list. A layer carrying any of them carries both `modules.dep` and
//!   `modules.dep.bin` (what kmod reads), and the two must list the same modules with the same
//!   dependencies.

use std::collections::{BTreeMap, BTreeSet};

use crate::error::{show, LayerError};
use crate::kmod_index;
use crate::tree::{NodeId, NodeKind, Tree, ROOT};

/// The largest module index file read (a full Debian kernel's `modules.alias` is about 1.3 MiB).
pub const MAX_MODULES_DEP: u64 = 16 << 20;

/// The files `depmod` writes into a kernel's module directory. kmod (`modprobe`, `modinfo`,
/// udev's module loading) reads the `.bin` indexes, `modules.softdep`, `modules.weakdep` and
/// `modules.devname`; the text `modules.dep`, `modules.alias` and `modules.symbols` are read by
/// other tools (busybox, scripts).
pub const MODULE_INDEX_FILES: &[&str] = &[
    "modules.dep",
    "modules.dep.bin",
    "modules.alias",
    "modules.alias.bin",
    "modules.symbols",
    "modules.symbols.bin",
    "modules.builtin.bin",
    "modules.builtin.alias.bin",
    "modules.softdep",
    "modules.weakdep",
    "modules.devname",
];

/// The extended attribute prefixes overlayfs reads its metadata from: `trusted.overlay.` and,
/// with the `userxattr` mount option (unprivileged overlays, rootless container runtimes on the
/// node), `user.overlay.`. Either would mean the same if the layer were ever a lower directory
/// of such a mount, and neither has any other use.
pub const OVERLAY_XATTR_PREFIXES: &[&[u8]] = &[b"trusted.overlay.", b"user.overlay."];

/// What the stack rules need of one layer's tree.
#[derive(Debug, Clone, Default)]
pub struct LayerSummary {
    /// Every symlink: path → target.
    pub symlinks: BTreeMap<String, String>,
    /// Every real directory's path.
    pub dirs: BTreeSet<String>,
    /// Every other entry (regular file, device, FIFO, socket): path → what it is.
    pub others: BTreeMap<String, &'static str>,
    /// Per kernel module directory (`/usr/lib/modules/KVER`) that holds any of
    /// [`MODULE_INDEX_FILES`], each file this layer carries → what it lists (`modules.dep`: the
    /// module paths; a `.bin` index: `KEY VALUE` per entry; other text files: their lines).
    /// `modules.dep.bin` lists nothing here: it was checked equal to `modules.dep`.
    pub module_indexes: BTreeMap<String, BTreeMap<&'static str, BTreeSet<String>>>,
}

/// Why a stack breaks a rule.
#[derive(Debug, thiserror::Error)]
pub enum RuleError {
    /// A real directory over a lower layer's symlink.
    #[error(
        "layer `{layer}`: {path} is a directory, but layer `{lower}` has a symlink there (to \
         {target}): the directory would hide what the link leads to"
    )]
    DirOverSymlink {
        /// The higher layer.
        layer: String,
        /// The path.
        path: String,
        /// The layer with the symlink.
        lower: String,
        /// The link's target.
        target: String,
    },
    /// Anything but a directory over a lower layer's directory.
    #[error(
        "layer `{layer}`: {path} is {what}, but layer `{lower}` has a directory there: it would \
         hide the whole directory"
    )]
    NonDirOverDir {
        /// The higher layer.
        layer: String,
        /// The path.
        path: String,
        /// What the higher layer has there (`a regular file`, `a symlink (to usr)`).
        what: String,
        /// The layer with the directory.
        lower: String,
    },
    /// A second module index above the base that is not a superset of the lower ones.
    #[error(
        "layer `{layer}`: {path} hides the module index of layer `{lower}`, which lists \
         `{entry}` and this one does not (only one layer besides the base may carry a kernel's \
         module index, the files depmod writes, unless each lists everything the lower ones do)"
    )]
    ModuleIndex {
        /// The higher layer.
        layer: String,
        /// The index file.
        path: String,
        /// A lower layer with an index there.
        lower: String,
        /// An entry (module path, index entry, line) the lower lists and the higher does not.
        entry: String,
    },
    /// A module index that does not read, is incomplete, or disagrees with itself.
    #[error("layer `{layer}`: {path}: {reason}")]
    BadIndex {
        /// The layer.
        layer: String,
        /// The index.
        path: String,
        /// What is wrong.
        reason: String,
    },
}

/// Refuses overlayfs metadata in a layer's tree, from any source: a whiteout (character device
/// 0/0) or an attribute under [`OVERLAY_XATTR_PREFIXES`], naming `source` and the path.
pub fn check_overlay_metadata(tree: &Tree, source: &str) -> Result<(), LayerError> {
    let refused = |path: &str, what: String| LayerError::OverlayMetadata {
        origin: source.to_owned(),
        entry: show(path.as_bytes()),
        what,
    };
    let mut stack: Vec<(NodeId, String)> = vec![(ROOT, String::new())];
    while let Some((id, path)) = stack.pop() {
        let node = &tree.nodes[id];
        if let Some(name) = node
            .meta
            .xattrs
            .keys()
            .find(|k| OVERLAY_XATTR_PREFIXES.iter().any(|p| k.starts_with(p)))
        {
            return Err(refused(
                &path,
                format!(
                    "carries the overlayfs attribute {}",
                    String::from_utf8_lossy(name)
                ),
            ));
        }
        match &node.kind {
            NodeKind::CharDev { major: 0, minor: 0 } => {
                return Err(refused(
                    &path,
                    "is an overlayfs whiteout (character device 0/0)".into(),
                ))
            }
            NodeKind::Dir(children) => {
                for (name, child) in children {
                    stack.push((*child, format!("{path}/{}", String::from_utf8_lossy(name))));
                }
            }
            _ => {}
        }
    }
    Ok(())
}

/// The symlinks, directories, other entries and module indexes of a layer's tree.
pub fn summarize(tree: &Tree, layer: &str) -> Result<LayerSummary, RuleError> {
    let mut s = LayerSummary::default();
    let mut stack: Vec<(NodeId, String)> = vec![(ROOT, String::new())];
    while let Some((id, path)) = stack.pop() {
        let what = match &tree.nodes[id].kind {
            NodeKind::Dir(children) => {
                if !path.is_empty() {
                    s.dirs.insert(path.clone());
                }
                for (name, child) in children {
                    stack.push((*child, format!("{path}/{}", String::from_utf8_lossy(name))));
                }
                continue;
            }
            NodeKind::Symlink(target) => {
                s.symlinks
                    .insert(path, String::from_utf8_lossy(target).into_owned());
                continue;
            }
            NodeKind::File(_) => "a regular file",
            NodeKind::CharDev { .. } => "a character device",
            NodeKind::BlockDev { .. } => "a block device",
            NodeKind::Fifo => "a FIFO",
            NodeKind::Socket => "a socket",
        };
        s.others.insert(path, what);
    }
    let kernels = tree
        .lookup(&[b"usr".to_vec(), b"lib".to_vec(), b"modules".to_vec()])
        .and_then(|d| tree.children(d));
    for kver in kernels.into_iter().flat_map(|c| c.keys()) {
        let dir = format!("/usr/lib/modules/{}", String::from_utf8_lossy(kver));
        if let Some(files) = kernel_index(tree, &dir, layer)? {
            s.module_indexes.insert(dir, files);
        }
    }
    Ok(s)
}

/// The index files of one kernel's module directory, checked (see [`LayerSummary`]); `None`
/// when the layer carries none.
fn kernel_index(
    tree: &Tree,
    dir: &str,
    layer: &str,
) -> Result<Option<BTreeMap<&'static str, BTreeSet<String>>>, RuleError> {
    let bad = |file: &str, reason: String| RuleError::BadIndex {
        layer: layer.to_owned(),
        path: format!("{dir}/{file}"),
        reason,
    };
    let mut raw = BTreeMap::new();
    for &name in MODULE_INDEX_FILES {
        if let Some(bytes) = tree
            .read_file_bounded(&format!("{dir}/{name}"), MAX_MODULES_DEP)
            .map_err(|r| bad(name, r))?
        {
            raw.insert(name, bytes);
        }
    }
    if raw.is_empty() {
        return Ok(None);
    }
    let (Some(text), Some(bin)) = (raw.get("modules.dep"), raw.get("modules.dep.bin")) else {
        let missing = if raw.contains_key("modules.dep") {
            "modules.dep.bin"
        } else {
            "modules.dep"
        };
        let carried: Vec<&str> = raw.keys().copied().collect();
        return Err(bad(
            missing,
            format!(
                "is missing, but the layer carries {}: kmod resolves modules through \
                 modules.dep.bin and the stack rules check it against modules.dep, so a layer \
                 with a module index carries both, as depmod writes them",
                carried.join(", ")
            ),
        ));
    };
    let deps = text_deps(text).map_err(|r| bad("modules.dep", r))?;
    let bin_deps = bin_deps(bin).map_err(|r| bad("modules.dep.bin", r))?;
    if let Some(reason) = disagreement(&deps, &bin_deps) {
        return Err(bad("modules.dep.bin", reason));
    }
    let mut files = BTreeMap::new();
    for (name, bytes) in raw {
        let entries = if name == "modules.dep" {
            deps.keys().cloned().collect()
        } else if name == "modules.dep.bin" {
            BTreeSet::new()
        } else if name.ends_with(".bin") {
            kmod_index::entries(&bytes)
                .map_err(|r| bad(name, r))?
                .into_iter()
                .map(|(k, v)| format!("{k} {v}"))
                .collect()
        } else {
            String::from_utf8(bytes)
                .map_err(|_| bad(name, "is not UTF-8 text".into()))?
                .lines()
                .filter(|l| !l.trim().is_empty() && !l.starts_with('#'))
                .map(str::to_owned)
                .collect()
        };
        files.insert(name, entries);
    }
    Ok(Some(files))
}

/// Module path → its dependencies, as one `modules.dep` line or `modules.dep.bin` value says.
type Deps = BTreeMap<String, Vec<String>>;

fn dep_line(line: &str) -> Result<(String, Vec<String>), String> {
    let (module, deps) = line
        .split_once(':')
        .ok_or_else(|| format!("`{line}` is not a `module: deps` line"))?;
    let deps = deps.split_whitespace().map(str::to_owned).collect();
    Ok((module.trim().to_owned(), deps))
}

fn text_deps(bytes: &[u8]) -> Result<Deps, String> {
    let text = std::str::from_utf8(bytes).map_err(|_| "is not UTF-8 text".to_string())?;
    text.lines()
        .filter(|l| !l.trim().is_empty())
        .map(dep_line)
        .collect()
}

/// kmod's name for a module file: its file name up to the first `.`, `-` read as `_`.
fn module_name(path: &str) -> String {
    let file = path.rsplit('/').next().unwrap_or(path);
    let stem = file.split('.').next().unwrap_or(file);
    stem.replace('-', "_")
}

/// `modules.dep.bin`: one value per module name, the module's `modules.dep` line.
fn bin_deps(bytes: &[u8]) -> Result<Deps, String> {
    let mut out = Deps::new();
    let mut names = BTreeSet::new();
    for (key, value) in kmod_index::entries(bytes)? {
        if !names.insert(key.clone()) {
            return Err(format!("lists module `{key}` twice"));
        }
        let (module, deps) = dep_line(&value)?;
        if module_name(&module) != key {
            return Err(format!(
                "its key `{key}` leads to {module}, a module of another name"
            ));
        }
        out.insert(module, deps);
    }
    Ok(out)
}

/// The first way `modules.dep.bin` (`bin`) differs from `modules.dep` (`text`), if any.
fn disagreement(text: &Deps, bin: &Deps) -> Option<String> {
    if let Some(m) = bin.keys().find(|m| !text.contains_key(*m)) {
        return Some(format!(
            "disagrees with modules.dep: it lists {m}, which modules.dep does not"
        ));
    }
    if let Some(m) = text.keys().find(|m| !bin.contains_key(*m)) {
        return Some(format!(
            "disagrees with modules.dep: modules.dep lists {m}, which kmod's index does not"
        ));
    }
    let (m, deps) = text.iter().find(|(m, d)| bin[*m] != **d)?;
    Some(format!(
        "disagrees with modules.dep: for {m} it lists the dependencies `{}`, modules.dep `{}`",
        bin[m].join(" "),
        deps.join(" ")
    ))
}

/// The rules across layers, the base first in `layers` (name and summary each).
pub fn check_stack(layers: &[(&str, &LayerSummary)]) -> Result<(), RuleError> {
    for (j, (name, upper)) in layers.iter().enumerate() {
        for (lower, summary) in &layers[..j] {
            check_hiding(name, upper, lower, summary)?;
        }
        if j == 0 {
            continue;
        }
        for (dir, files) in &upper.module_indexes {
            // Layers above the base below this one that carry an index for the same kernel:
            // this one is a second, and each of its files must list everything each lower
            // index's file lists (the base's too).
            let above_base = layers[1..j]
                .iter()
                .any(|(_, s)| s.module_indexes.contains_key(dir));
            if !above_base {
                continue;
            }
            for (lower, summary) in &layers[..j] {
                let Some(theirs) = summary.module_indexes.get(dir) else {
                    continue;
                };
                for (file, entries) in theirs {
                    let Some(ours) = files.get(file) else {
                        continue;
                    };
                    if let Some(entry) = entries.difference(ours).next() {
                        return Err(RuleError::ModuleIndex {
                            layer: (*name).to_owned(),
                            path: format!("{dir}/{file}"),
                            lower: (*lower).to_owned(),
                            entry: entry.clone(),
                        });
                    }
                }
            }
        }
    }
    Ok(())
}

/// A directory of `upper` over a symlink of `lower`, or anything else over a directory.
fn check_hiding(
    name: &str,
    upper: &LayerSummary,
    lower: &str,
    summary: &LayerSummary,
) -> Result<(), RuleError> {
    if let Some(path) = upper
        .dirs
        .iter()
        .find(|d| summary.symlinks.contains_key(*d))
    {
        return Err(RuleError::DirOverSymlink {
            layer: name.to_owned(),
            path: path.clone(),
            lower: lower.to_owned(),
            target: summary.symlinks[path].clone(),
        });
    }
    let links = upper
        .symlinks
        .iter()
        .map(|(p, t)| (p, format!("a symlink (to {t})")));
    let others = upper.others.iter().map(|(p, w)| (p, (*w).to_owned()));
    if let Some((path, what)) = links.chain(others).find(|(p, _)| summary.dirs.contains(*p)) {
        return Err(RuleError::NonDirOverDir {
            layer: name.to_owned(),
            path: path.clone(),
            what,
            lower: lower.to_owned(),
        });
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::tree::{split_path, FileData, Meta, Node};

    fn add(t: &mut Tree, path: &str, kind: NodeKind) {
        let c = split_path(path.as_bytes(), true).unwrap();
        let (_, parents) = c.split_last().unwrap();
        t.ensure_dir(parents, path.as_bytes()).unwrap();
        t.insert(
            &c,
            Node {
                meta: Meta::new(0o644, 0, 0),
                kind,
            },
            path.as_bytes(),
        )
        .unwrap();
    }

    fn file(bytes: &str) -> NodeKind {
        NodeKind::File(FileData::from_bytes(bytes.as_bytes().into()))
    }

    fn summary(t: &Tree) -> LayerSummary {
        summarize(t, "x").unwrap()
    }

    #[test]
    fn directory_over_a_lower_symlink_is_refused() {
        let mut base = Tree::new();
        add(&mut base, "/lib", NodeKind::Symlink(b"usr/lib".to_vec()));
        add(&mut base, "/usr/lib/libc.so", file("c"));
        let mut upper = Tree::new();
        add(&mut upper, "/lib/firmware/x.bin", file("fw"));
        let (b, u) = (summary(&base), summary(&upper));
        let e = check_stack(&[("base", &b), ("gpu", &u)]).unwrap_err();
        let text = e.to_string();
        assert!(
            text.contains("layer `gpu`: /lib is a directory")
                && text.contains("layer `base` has a symlink there (to usr/lib)"),
            "{text}"
        );
        // The same files through the link's target are fine.
        let mut ok = Tree::new();
        add(&mut ok, "/usr/lib/firmware/x.bin", file("fw"));
        check_stack(&[("base", &b), ("gpu", &summary(&ok))]).unwrap();
    }

    #[test]
    fn a_non_directory_over_a_lower_directory_is_refused() {
        let mut base = Tree::new();
        add(&mut base, "/usr/bin/sh", file("sh"));
        for (path, kind, what) in [
            ("/usr/bin", file("x"), "a regular file"),
            (
                "/usr",
                NodeKind::Symlink(b"/opt".to_vec()),
                "a symlink (to /opt)",
            ),
            ("/usr/bin", NodeKind::Fifo, "a FIFO"),
        ] {
            let mut upper = Tree::new();
            add(&mut upper, path, kind);
            let e = check_stack(&[("base", &summary(&base)), ("gpu", &summary(&upper))])
                .unwrap_err()
                .to_string();
            assert_eq!(
                e,
                format!(
                    "layer `gpu`: {path} is {what}, but layer `base` has a directory there: it \
                     would hide the whole directory"
                )
            );
        }
        // A file over a lower file replaces it: allowed.
        let mut upper = Tree::new();
        add(&mut upper, "/usr/bin/sh", file("dash"));
        check_stack(&[("base", &summary(&base)), ("gpu", &summary(&upper))]).unwrap();
    }

    #[test]
    fn a_module_index_without_its_bin_file_is_refused() {
        let mut t = Tree::new();
        add(
            &mut t,
            "/usr/lib/modules/6.1.0/modules.dep",
            file("kernel/a.ko:\n"),
        );
        let e = summarize(&t, "kata").unwrap_err().to_string();
        assert!(
            e.starts_with("layer `kata`: /usr/lib/modules/6.1.0/modules.dep.bin: is missing"),
            "{e}"
        );
        let mut t = Tree::new();
        add(
            &mut t,
            "/usr/lib/modules/6.1.0/modules.alias.bin",
            file("x"),
        );
        let e = summarize(&t, "kata").unwrap_err().to_string();
        assert!(
            e.contains("/modules.dep: is missing, but the layer carries modules.alias.bin"),
            "{e}"
        );
    }

    #[test]
    fn overlay_metadata_in_a_tree_is_refused() {
        let mut t = Tree::new();
        add(
            &mut t,
            "/etc/gone",
            NodeKind::CharDev { major: 0, minor: 0 },
        );
        let e = check_overlay_metadata(&t, "directory /src")
            .unwrap_err()
            .to_string();
        assert!(e.contains("/etc/gone") && e.contains("whiteout"), "{e}");
        let mut t = Tree::new();
        add(&mut t, "/etc/x", file("x"));
        let id = t.lookup(&[b"etc".to_vec()]).unwrap();
        t.nodes[id]
            .meta
            .xattrs
            .insert(b"trusted.overlay.opaque".to_vec(), b"y".to_vec());
        let e = check_overlay_metadata(&t, "directory /src")
            .unwrap_err()
            .to_string();
        assert!(
            e.contains("/etc") && e.contains("trusted.overlay.opaque"),
            "{e}"
        );
        // Other devices and attributes are fine.
        let mut t = Tree::new();
        add(
            &mut t,
            "/dev/null",
            NodeKind::CharDev { major: 1, minor: 3 },
        );
        check_overlay_metadata(&t, "directory /src").unwrap();
        // user.overlay.* (overlayfs' `userxattr` option) is refused alike; user.other is not.
        let id = t.lookup(&[b"dev".to_vec()]).unwrap();
        let xattrs = |t: &mut Tree, k: &[u8]| t.nodes[id].meta.xattrs.insert(k.to_vec(), vec![]);
        xattrs(&mut t, b"user.overlayish");
        check_overlay_metadata(&t, "directory /src").unwrap();
        xattrs(&mut t, b"user.overlay.redirect");
        let e = check_overlay_metadata(&t, "tar archive /a.tar")
            .unwrap_err()
            .to_string();
        assert!(
            e.starts_with("tar archive /a.tar: entry \"/dev\" carries the overlayfs attribute user.overlay.redirect"),
            "{e}"
        );
    }
}
