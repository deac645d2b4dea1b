//! The data's own directories, files and links, owners resolved through the accounts; paths in
//! tmpfs directories are relocated under `/etc/ingot/`.

use std::collections::BTreeSet;
use std::path::{Path, PathBuf};

use super::accounts::Accounts;
use super::allowed::{check_path, OwnUnits};
use super::jinja::render_jinja;
use super::tree::Tree;
use super::{relocate, Entry, EntryKind, StageError, APPEND_DIR};
use crate::model::{Bootstrap, Format, IdOrName, Owner};

/// What the first-boot script must do for the data's files.
#[derive(Default)]
pub(super) struct Deferred {
    /// Relocated roots (`/etc/ingot/run`, ...) to copy back to their tmpfs.
    pub(super) restore: BTreeSet<&'static str>,
    /// (kept copy, target) of appends to files the layer does not hold.
    pub(super) appends: Vec<(PathBuf, PathBuf)>,
}

/// The numeric owner of `path`, names looked up in the accounts.
fn owner(acc: &Accounts, path: &Path, o: &Owner) -> Result<(u32, u32), StageError> {
    let p = path.display().to_string();
    let uid = match &o.user {
        None => 0,
        Some(IdOrName::Id(id)) => *id,
        Some(IdOrName::Name(n)) => acc.uid(n).ok_or_else(|| StageError::Owner {
            path: p.clone(),
            kind: "user",
            name: n.clone(),
            file: "/etc/passwd",
        })?,
    };
    let gid = match &o.group {
        None => 0,
        Some(IdOrName::Id(id)) => *id,
        Some(IdOrName::Name(n)) => acc.gid(n).ok_or_else(|| StageError::Owner {
            path: p,
            kind: "group",
            name: n.clone(),
            file: "/etc/group",
        })?,
    };
    Ok((uid, gid))
}

/// A path of the data as the node sees it: in a jinja template the host name variables are
/// rendered (cloud-init renders the whole document); any other jinja left in a path is refused,
/// as it would make a file or directory of that literal name.
fn render_path(path: &Path, jinja: bool, host: &str) -> Result<PathBuf, StageError> {
    let Some(text) = path
        .to_str()
        .filter(|t| jinja && (t.contains("{{") || t.contains("{%")))
    else {
        return Ok(path.to_path_buf());
    };
    let (rendered, unresolved) = render_jinja(text, host);
    if unresolved {
        return Err(Tree::conflict(
            path,
            "holds jinja other than the hostname variables, which ingot does not render",
        ));
    }
    Ok(PathBuf::from(rendered))
}

impl Deferred {
    /// Where `path` is staged, remembering relocated roots.
    fn staged_at(&mut self, path: &Path) -> PathBuf {
        match relocate(path) {
            Some((p, root)) => {
                self.restore.insert(root);
                p
            }
            None => path.to_path_buf(),
        }
    }
}

/// Stages the data's directories, files and links.
pub(super) fn stage_data(
    tree: &mut Tree,
    b: &Bootstrap,
    acc: &Accounts,
    host: &str,
    own_units: &OwnUnits,
) -> Result<Deferred, StageError> {
    let jinja = matches!(b.format, Format::CloudConfig { jinja: true });
    let files = match b.format {
        Format::CloudConfig { .. } => "write_files",
        Format::Ignition { .. } => "storage.files",
    };
    let mut deferred = Deferred::default();
    for d in &b.dirs {
        let (uid, gid) = owner(acc, &d.path, &d.owner)?;
        let path = render_path(&d.path, jinja, host)?;
        check_path(&path, "storage.directories", own_units)?;
        let at = deferred.staged_at(&path);
        tree.dir(&at, d.mode, uid, gid)?;
    }
    for f in &b.files {
        let (uid, gid) = owner(acc, &f.path, &f.owner)?;
        let path = render_path(&f.path, jinja, host)?;
        check_path(&path, files, own_units)?;
        let at = deferred.staged_at(&path);
        let mut content = f.content.clone();
        if f.jinja {
            if let Ok(text) = std::str::from_utf8(&content) {
                let (rendered, unresolved) = render_jinja(text, host);
                if unresolved {
                    tree.warnings.push(format!(
                        "{}: jinja expressions other than the hostname variables are left as they are",
                        f.path.display()
                    ));
                }
                content = rendered.into_bytes();
            }
        }
        if f.append {
            match tree.map.get(&at) {
                Some(Entry {
                    kind: EntryKind::File(old),
                    ..
                }) => {
                    let mut joined = old.clone();
                    joined.extend_from_slice(&content);
                    content = joined;
                }
                Some(_) => {
                    return Err(Tree::conflict(&path, "append to a path that is not a file"))
                }
                None => {
                    let keep = Path::new(APPEND_DIR).join(path.strip_prefix("/").unwrap_or(&path));
                    tree.warnings.push(format!(
                        "{}: appended on first boot (the base OS's file is not known when staging); \
                         /etc is volatile (boot contract v3), so outside /etc/kubernetes and the \
                         stack's persistent paths the append is gone after the next reboot",
                        path.display()
                    ));
                    tree.put(&keep, EntryKind::File(content), f.mode, uid, gid)?;
                    deferred.appends.push((keep, path));
                    continue;
                }
            }
        }
        tree.data_entry(&at, EntryKind::File(content), f.mode, uid, gid)?;
    }
    for l in &b.links {
        let (uid, gid) = owner(acc, &l.path, &l.owner)?;
        let path = render_path(&l.path, jinja, host)?;
        check_path(&path, "storage.links", own_units)?;
        let at = deferred.staged_at(&path);
        tree.data_entry(&at, EntryKind::Symlink(l.target.clone()), 0o777, uid, gid)?;
    }
    Ok(deferred)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn relocation() {
        assert_eq!(
            relocate(Path::new("/run/kubeadm/kubeadm.yaml")).unwrap().0,
            Path::new("/etc/ingot/run/kubeadm/kubeadm.yaml")
        );
        assert_eq!(
            relocate(Path::new("/var/run/x")).unwrap().0,
            Path::new("/etc/ingot/run/x")
        );
        assert!(relocate(Path::new("/running")).is_none());
        assert!(relocate(Path::new("/etc/x")).is_none());
    }
}
