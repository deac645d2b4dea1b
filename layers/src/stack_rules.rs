//! Rules `ingot build` enforces for every stack, beside the tree code they walk. Layers are
//! stacked read-only (the base lowest), so a higher layer's entry hides a lower one's: these
//! rules refuse the cases that would hide the base's files unnoticed.
//!
//! - A `dir` source may hold no overlayfs metadata: no whiteout (a 0/0 character device) and no
//!   `trusted.overlay.*` attribute. Refused, not stripped: the tree is the author's, and either
//!   one means it was copied out of an overlay's upper directory, where a whiteout deletes a
//!   lower file and `trusted.overlay.opaque` hides a lower directory; stripping it would build
//!   a layer that no longer means what its author's tree did, silently.
//! - A layer may not put a real directory where a lower layer has a symlink (`/lib`, `/bin`,
//!   `/sbin`, `/lib64` over the merged-/usr links, or any other path): the directory would
//!   hide everything the link leads to.
//! - Besides the base's own, only one layer may carry a kernel's module index
//!   (`/usr/lib/modules/KVER/modules.dep`; the highest index hides every other layer's
//!   modules), unless the higher index lists every module the lower ones list.

use std::collections::{BTreeMap, BTreeSet};

use crate::error::LayerError;
use crate::tree::{NodeId, NodeKind, Tree, ROOT};

/// The largest `modules.dep` read (a full Debian kernel's is about 1 MiB).
pub const MAX_MODULES_DEP: u64 = 16 << 20;

/// What the stack rules need of one layer's tree.
#[derive(Debug, Clone, Default)]
pub struct LayerSummary {
    /// Every symlink: path → target.
    pub symlinks: BTreeMap<String, String>,
    /// Every real directory's path.
    pub dirs: BTreeSet<String>,
    /// Per kernel's index path (`/usr/lib/modules/KVER/modules.dep`), the module paths listed.
    pub module_indexes: BTreeMap<String, BTreeSet<String>>,
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
    /// A second module index above the base that is not a superset of the lower ones.
    #[error(
        "layer `{layer}`: {path} hides the module index of layer `{lower}`, which lists \
         {module} and this one does not (only one layer besides the base may carry a kernel's \
         modules.dep, unless it lists every module the lower ones do)"
    )]
    ModuleIndex {
        /// The higher layer.
        layer: String,
        /// The index.
        path: String,
        /// A lower layer with an index there.
        lower: String,
        /// A module the lower lists and the higher does not.
        module: String,
    },
    /// A module index that does not read.
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

/// Refuses overlayfs metadata in a `dir` source's tree: a whiteout (character device 0/0) or
/// any `trusted.overlay.*` extended attribute, naming the path.
pub fn check_dir_source(tree: &Tree) -> Result<(), LayerError> {
    let mut stack: Vec<(NodeId, String)> = vec![(ROOT, String::new())];
    while let Some((id, path)) = stack.pop() {
        let node = &tree.nodes[id];
        let shown = if path.is_empty() { "/" } else { path.as_str() };
        if let Some(name) = node
            .meta
            .xattrs
            .keys()
            .find(|k| k.starts_with(b"trusted.overlay."))
        {
            return Err(refused(
                shown,
                &format!(
                    "carries the overlayfs attribute {}: a `dir` source may hold no overlay \
                     metadata (refused, not stripped: copy the merged tree, not an upper directory)",
                    String::from_utf8_lossy(name)
                ),
            ));
        }
        match &node.kind {
            NodeKind::CharDev { major: 0, minor: 0 } => {
                return Err(refused(
                    shown,
                    "is an overlayfs whiteout (character device 0/0): a `dir` source may hold no \
                     overlay metadata (refused, not stripped: copy the merged tree, not an upper \
                     directory)",
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

fn refused(path: &str, reason: &str) -> LayerError {
    LayerError::BadEntry {
        entry: path.to_string(),
        reason: reason.to_string(),
    }
}

/// The symlinks, directories and module indexes of a layer's tree.
pub fn summarize(tree: &Tree, layer: &str) -> Result<LayerSummary, RuleError> {
    let mut s = LayerSummary::default();
    let mut stack: Vec<(NodeId, String)> = vec![(ROOT, String::new())];
    while let Some((id, path)) = stack.pop() {
        match &tree.nodes[id].kind {
            NodeKind::Dir(children) => {
                if !path.is_empty() {
                    s.dirs.insert(path.clone());
                }
                for (name, child) in children {
                    stack.push((*child, format!("{path}/{}", String::from_utf8_lossy(name))));
                }
            }
            NodeKind::Symlink(target) => {
                s.symlinks
                    .insert(path, String::from_utf8_lossy(target).into_owned());
            }
            _ => {}
        }
    }
    let kernels = tree
        .lookup(&[b"usr".to_vec(), b"lib".to_vec(), b"modules".to_vec()])
        .and_then(|d| tree.children(d));
    for kver in kernels.into_iter().flat_map(|c| c.keys()) {
        let path = format!(
            "/usr/lib/modules/{}/modules.dep",
            String::from_utf8_lossy(kver)
        );
        let bad = |reason: String| RuleError::BadIndex {
            layer: layer.to_owned(),
            path: path.clone(),
            reason,
        };
        let Some(bytes) = tree
            .read_file_bounded(&path, MAX_MODULES_DEP)
            .map_err(bad)?
        else {
            continue;
        };
        let text = String::from_utf8(bytes).map_err(|_| bad("is not UTF-8 text".into()))?;
        let modules = text
            .lines()
            .filter(|l| !l.trim().is_empty())
            .map(|l| {
                l.split_once(':')
                    .map(|(m, _)| m.trim().to_owned())
                    .ok_or_else(|| bad(format!("`{l}` is not a `module: deps` line")))
            })
            .collect::<Result<BTreeSet<_>, _>>()?;
        s.module_indexes.insert(path, modules);
    }
    Ok(s)
}

/// The rules across layers, the base first in `layers` (name and summary each).
pub fn check_stack(layers: &[(&str, &LayerSummary)]) -> Result<(), RuleError> {
    for (j, (name, upper)) in layers.iter().enumerate() {
        for (lower, summary) in &layers[..j] {
            if let Some(path) = upper
                .dirs
                .iter()
                .find(|d| summary.symlinks.contains_key(*d))
            {
                return Err(RuleError::DirOverSymlink {
                    layer: (*name).to_owned(),
                    path: path.clone(),
                    lower: (*lower).to_owned(),
                    target: summary.symlinks[path].clone(),
                });
            }
        }
        if j == 0 {
            continue;
        }
        for (path, modules) in &upper.module_indexes {
            // Layers above the base below this one that carry the same index: this one is a
            // second, and must list every module each lower index lists (the base's too).
            let above_base = layers[1..j]
                .iter()
                .any(|(_, s)| s.module_indexes.contains_key(path));
            if !above_base {
                continue;
            }
            for (lower, summary) in &layers[..j] {
                let Some(theirs) = summary.module_indexes.get(path) else {
                    continue;
                };
                if let Some(module) = theirs.difference(modules).next() {
                    return Err(RuleError::ModuleIndex {
                        layer: (*name).to_owned(),
                        path: path.clone(),
                        lower: (*lower).to_owned(),
                        module: module.clone(),
                    });
                }
            }
        }
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
    fn a_second_module_index_must_be_a_superset() {
        let dep = "/usr/lib/modules/6.1.0/modules.dep";
        let tree = |text: &str| {
            let mut t = Tree::new();
            add(&mut t, dep, file(text));
            summary(&t)
        };
        let base = tree("kernel/a.ko:\nkernel/b.ko: kernel/a.ko\n");
        let nvidia = tree("kernel/a.ko:\nkernel/b.ko: kernel/a.ko\nextra/nvidia.ko:\n");
        let kata = tree("kernel/a.ko:\nextra/kata.ko:\n");
        let superset = tree("kernel/a.ko:\nkernel/b.ko:\nextra/nvidia.ko:\nextra/kata.ko:\n");
        // Base plus one layer's index: allowed.
        check_stack(&[("base", &base), ("nvidia", &nvidia)]).unwrap();
        let e = check_stack(&[("base", &base), ("nvidia", &nvidia), ("kata", &kata)])
            .unwrap_err()
            .to_string();
        assert!(
            e.contains("layer `kata`: /usr/lib/modules/6.1.0/modules.dep hides the module index")
                && e.contains("kernel/b.ko"),
            "{e}"
        );
        check_stack(&[("base", &base), ("nvidia", &nvidia), ("kata", &superset)]).unwrap();
        let mut junk = Tree::new();
        add(&mut junk, dep, file("no colon here\n"));
        assert!(matches!(
            summarize(&junk, "kata"),
            Err(RuleError::BadIndex { .. })
        ));
    }

    #[test]
    fn overlay_metadata_in_a_dir_tree_is_refused() {
        let mut t = Tree::new();
        add(
            &mut t,
            "/etc/gone",
            NodeKind::CharDev { major: 0, minor: 0 },
        );
        let e = check_dir_source(&t).unwrap_err().to_string();
        assert!(e.contains("/etc/gone") && e.contains("whiteout"), "{e}");
        let mut t = Tree::new();
        add(&mut t, "/etc/x", file("x"));
        let id = t.lookup(&[b"etc".to_vec()]).unwrap();
        t.nodes[id]
            .meta
            .xattrs
            .insert(b"trusted.overlay.opaque".to_vec(), b"y".to_vec());
        let e = check_dir_source(&t).unwrap_err().to_string();
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
        check_dir_source(&t).unwrap();
    }
}
