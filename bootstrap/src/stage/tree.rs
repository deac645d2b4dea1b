//! The staged tree being built: entries by path, parents created on the way, conflicts refused.

use std::collections::{BTreeMap, BTreeSet};
use std::path::{Path, PathBuf};

use super::{Entry, EntryKind, StageError, HIDDEN_DIRS};

/// Default mode of a directory created as a parent. Overlayfs takes a merged directory's
/// metadata from the upper layer, so these must match the base OS.
pub(super) fn parent_mode(path: &Path) -> u32 {
    match path.to_str() {
        Some("/root") => 0o700,
        Some("/tmp") | Some("/var/tmp") => 0o1777,
        _ => 0o755,
    }
}

/// The staged entries by path, which of them ingot generated, and the warnings so far.
pub(super) struct Tree {
    pub(super) map: BTreeMap<PathBuf, Entry>,
    generated: BTreeSet<PathBuf>,
    pub(super) warnings: Vec<String>,
}

impl Tree {
    /// An empty tree starting with `warnings` (the parser's).
    pub(super) fn new(warnings: Vec<String>) -> Tree {
        Tree {
            map: BTreeMap::new(),
            generated: BTreeSet::new(),
            warnings,
        }
    }

    pub(super) fn conflict(path: &Path, reason: &str) -> StageError {
        StageError::Conflict {
            path: path.display().to_string(),
            reason: reason.to_string(),
        }
    }

    /// Paths under the kernel's mounts cannot be staged: the mount hides them at boot.
    pub(super) fn check_visible(path: &Path) -> Result<(), StageError> {
        match HIDDEN_DIRS.iter().find(|d| path.starts_with(d)) {
            Some(dir) => Err(Self::conflict(
                path,
                &format!(
                    "is under {dir}, which the kernel mounts over at boot: a staged file there \
                     would never be seen"
                ),
            )),
            None => Ok(()),
        }
    }

    fn parents(&mut self, path: &Path) -> Result<(), StageError> {
        Self::check_visible(path)?;
        let mut ancestors: Vec<&Path> = path.ancestors().skip(1).collect();
        ancestors.reverse();
        for a in ancestors {
            if a == Path::new("/") {
                continue;
            }
            match self.map.get(a) {
                Some(e) if e.kind == EntryKind::Dir => {}
                Some(_) => {
                    return Err(Self::conflict(
                        a,
                        "is a file or symlink but needed as a directory",
                    ))
                }
                None => {
                    self.map.insert(
                        a.to_path_buf(),
                        Entry {
                            path: a.to_path_buf(),
                            kind: EntryKind::Dir,
                            mode: parent_mode(a),
                            uid: 0,
                            gid: 0,
                        },
                    );
                }
            }
        }
        Ok(())
    }

    /// A directory with explicit metadata (replaces a parent created with defaults).
    pub(super) fn dir(
        &mut self,
        path: &Path,
        mode: u32,
        uid: u32,
        gid: u32,
    ) -> Result<(), StageError> {
        self.parents(path)?;
        if let Some(e) = self.map.get(path) {
            if e.kind != EntryKind::Dir {
                return Err(Self::conflict(
                    path,
                    "is a file or symlink but also a directory",
                ));
            }
        }
        self.map.insert(
            path.to_path_buf(),
            Entry {
                path: path.to_path_buf(),
                kind: EntryKind::Dir,
                mode,
                uid,
                gid,
            },
        );
        Ok(())
    }

    /// A file or symlink; a later one replaces an earlier one.
    pub(super) fn put(
        &mut self,
        path: &Path,
        kind: EntryKind,
        mode: u32,
        uid: u32,
        gid: u32,
    ) -> Result<(), StageError> {
        self.parents(path)?;
        if let Some(e) = self.map.get(path) {
            if e.kind == EntryKind::Dir {
                return Err(Self::conflict(
                    path,
                    "is a directory but also a file or symlink",
                ));
            }
        }
        self.map.insert(
            path.to_path_buf(),
            Entry {
                path: path.to_path_buf(),
                kind,
                mode,
                uid,
                gid,
            },
        );
        Ok(())
    }

    /// A file ingot generates itself (the bootstrap data may replace it, with a warning).
    pub(super) fn generated(
        &mut self,
        path: &str,
        content: impl Into<Vec<u8>>,
        mode: u32,
        uid: u32,
        gid: u32,
    ) -> Result<(), StageError> {
        let p = PathBuf::from(path);
        self.put(&p, EntryKind::File(content.into()), mode, uid, gid)?;
        self.generated.insert(p);
        Ok(())
    }

    pub(super) fn data_entry(
        &mut self,
        path: &Path,
        kind: EntryKind,
        mode: u32,
        uid: u32,
        gid: u32,
    ) -> Result<(), StageError> {
        if self.generated.remove(path) {
            self.warnings.push(format!(
                "{}: the bootstrap data's file replaces the one ingot generates",
                path.display()
            ));
        }
        self.put(path, kind, mode, uid, gid)
    }
}
