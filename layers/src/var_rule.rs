//! Boot contract version 2: the `var` partition is mounted over `/var`, so whatever a layer ships
//! below `/var` would be hidden on every node. Such files are refused at build time instead of
//! silently vanishing; only the base may keep (empty) directories there, as mount points.

use crate::error::LayerError;
use crate::tree::{NodeId, NodeKind, Tree, ROOT};

/// Why an entry below `/var` is refused (the error names the layer and the path).
const REASON: &str = "layers may not ship anything under /var: the node mounts its var partition \
                      there, which hides it (docs/boot-contract.md); put read-only data under /usr";

/// Refuses any entry below `/var` of `tree`; directories are allowed in the base layer
/// (`base == true`) as long as they hold nothing but directories. `/var` itself may exist.
pub fn check(tree: &Tree, base: bool) -> Result<(), LayerError> {
    let Some(var) = tree.children(ROOT).and_then(|c| c.get(b"var".as_slice())) else {
        return Ok(());
    };
    match &tree.nodes[*var].kind {
        NodeKind::Dir(_) => walk(tree, *var, "/var", base),
        _ => Err(refused(
            "/var",
            "/var must be a directory (the var partition's mount point)",
        )),
    }
}

fn walk(tree: &Tree, dir: NodeId, path: &str, base: bool) -> Result<(), LayerError> {
    let Some(children) = tree.children(dir) else {
        return Ok(());
    };
    for (name, id) in children {
        let child = format!("{path}/{}", String::from_utf8_lossy(name));
        match &tree.nodes[*id].kind {
            NodeKind::Dir(_) if base => walk(tree, *id, &child, base)?,
            _ => return Err(refused(&child, REASON)),
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

#[cfg(test)]
mod tests {
    use super::*;
    use crate::tree::{split_path, Meta, Node};

    fn tree(paths: &[(&str, bool)]) -> Tree {
        let mut t = Tree::new();
        for (p, dir) in paths {
            let c = split_path(p.as_bytes(), true).unwrap();
            let kind = if *dir {
                NodeKind::Dir(Default::default())
            } else {
                NodeKind::Symlink(b"/run".to_vec())
            };
            let node = Node {
                meta: Meta::new(0o755, 0, 0),
                kind,
            };
            t.insert(&c, node, p.as_bytes()).unwrap();
        }
        t
    }

    #[test]
    fn var_is_a_mount_point_only() {
        check(&tree(&[("/usr", true)]), false).unwrap();
        check(&tree(&[("/var", true)]), false).unwrap();
        check(&tree(&[("/var", true), ("/var/lib", true)]), true).unwrap();
        let e = check(&tree(&[("/var", true), ("/var/lib", true)]), false).unwrap_err();
        assert!(e.to_string().contains("\"/var/lib\""), "{e}");
        let e = check(
            &tree(&[("/var", true), ("/var/lib", true), ("/var/lib/x", false)]),
            true,
        )
        .unwrap_err();
        assert!(
            e.to_string()
                .contains("\"/var/lib/x\": layers may not ship"),
            "{e}"
        );
        let e = check(&tree(&[("/var", false)]), true).unwrap_err();
        assert!(e.to_string().contains("mount point"), "{e}");
    }
}
