//! The in-memory model of a layer's file tree.
//!
//! Every source (directory, tar, OCI layout) is read into this model first; the ext4 writer then
//! works from the model alone. Children are kept in `BTreeMap`s keyed by the raw name bytes, so
//! iteration order is byte order whatever order the source listed them in. Hard links are two
//! directory entries holding the same `NodeId`.

use std::collections::BTreeMap;
use std::collections::VecDeque;
use std::fs::File;
use std::ops::Range;
use std::path::PathBuf;
use std::sync::Arc;

use crate::error::{show, LayerError};

/// Index of a node in [`Tree::nodes`].
pub type NodeId = usize;

/// The longest file name ext4 stores (the dirent's name_len is one byte).
pub const MAX_NAME_LEN: usize = 255;

/// A whole file tree: `nodes[ROOT]` is the root directory.
#[derive(Debug)]
pub struct Tree {
    pub nodes: Vec<Node>,
}

/// The root directory's id.
pub const ROOT: NodeId = 0;

#[derive(Debug, Clone)]
pub struct Node {
    pub meta: Meta,
    pub kind: NodeKind,
}

/// Ownership, permission bits and extended attributes of one inode.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Meta {
    /// Permission bits including setuid/setgid/sticky (`0o7777`); the type comes from the kind.
    pub perm: u16,
    pub uid: u32,
    pub gid: u32,
    /// Full attribute names (`security.capability`, `user.foo`) to raw values.
    pub xattrs: BTreeMap<Vec<u8>, Vec<u8>>,
}

impl Meta {
    pub fn new(perm: u32, uid: u32, gid: u32) -> Meta {
        Meta {
            perm: (perm & 0o7777) as u16,
            uid,
            gid,
            xattrs: BTreeMap::new(),
        }
    }
}

#[derive(Debug, Clone)]
pub enum NodeKind {
    Dir(BTreeMap<Vec<u8>, NodeId>),
    File(FileData),
    Symlink(Vec<u8>),
    CharDev { major: u32, minor: u32 },
    BlockDev { major: u32, minor: u32 },
    Fifo,
    Socket,
}

/// Where a regular file's bytes come from and which byte ranges hold data (the rest are holes).
#[derive(Debug, Clone)]
pub struct FileData {
    pub size: u64,
    pub source: DataSource,
    /// Sorted, disjoint ranges of the file that hold data, in file offsets. Starts are multiples
    /// of 4096; an end is a multiple of 4096 or the file size. Empty for an empty or all-hole file.
    pub data: Vec<Range<u64>>,
}

impl FileData {
    /// A file whose bytes are all in memory, stored without holes.
    pub fn from_bytes(bytes: Arc<[u8]>) -> FileData {
        let size = bytes.len() as u64;
        if size == 0 {
            return FileData {
                size,
                source: DataSource::None,
                data: Vec::new(),
            };
        }
        FileData {
            size,
            source: DataSource::Bytes(bytes),
            data: std::iter::once(0..size).collect(),
        }
    }
}

/// The bytes of a regular file.
#[derive(Debug, Clone)]
pub enum DataSource {
    /// No bytes (size 0 or all holes).
    None,
    /// A host file, opened again when the image is written.
    Path(PathBuf),
    /// A host file found by a directory scan, opened again when the image is written: the open
    /// refuses a symbolic link and checks it is still the inode scanned, at the size scanned.
    Scanned(ScannedFile),
    /// A region of an open file (a plain tar archive or a decompressed copy of one): the file's
    /// byte `i` is at `offset + i`.
    Region { file: Arc<SourceFile>, offset: u64 },
    /// Bytes already in memory (files made on the machine, such as the per-node layer's).
    Bytes(Arc<[u8]>),
}

/// A regular file as a directory scan saw it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ScannedFile {
    pub path: PathBuf,
    pub dev: u64,
    pub ino: u64,
    pub size: u64,
}

/// An open archive (or spill file) that file data is read from, with a name for messages.
#[derive(Debug)]
pub struct SourceFile {
    pub file: File,
    pub name: PathBuf,
}

impl Default for Tree {
    fn default() -> Self {
        Tree::new()
    }
}

impl Tree {
    /// A tree holding only an empty root directory (0755 root:root).
    pub fn new() -> Tree {
        Tree {
            nodes: vec![Node {
                meta: Meta::new(0o755, 0, 0),
                kind: NodeKind::Dir(BTreeMap::new()),
            }],
        }
    }

    pub fn add_node(&mut self, node: Node) -> NodeId {
        self.nodes.push(node);
        self.nodes.len() - 1
    }

    pub fn children(&self, dir: NodeId) -> Option<&BTreeMap<Vec<u8>, NodeId>> {
        match &self.nodes[dir].kind {
            NodeKind::Dir(c) => Some(c),
            _ => None,
        }
    }

    fn children_mut(&mut self, dir: NodeId) -> Option<&mut BTreeMap<Vec<u8>, NodeId>> {
        match &mut self.nodes[dir].kind {
            NodeKind::Dir(c) => Some(c),
            _ => None,
        }
    }

    /// Follows `components` from the root; `None` when a component is missing or not a directory.
    pub fn lookup(&self, components: &[Vec<u8>]) -> Option<NodeId> {
        let mut cur = ROOT;
        for c in components {
            cur = *self.children(cur)?.get(c)?;
        }
        Some(cur)
    }

    /// The directory at `components`, creating missing ones (0755 root:root, as tar extractors
    /// do). A non-directory in the way is an error naming `entry`.
    pub fn ensure_dir(
        &mut self,
        components: &[Vec<u8>],
        entry: &[u8],
    ) -> Result<NodeId, LayerError> {
        let mut cur = ROOT;
        for c in components {
            let next = self.children(cur).and_then(|m| m.get(c)).copied();
            cur = match next {
                Some(id) if matches!(self.nodes[id].kind, NodeKind::Dir(_)) => id,
                Some(_) => {
                    return Err(LayerError::bad(
                        entry,
                        format!("parent {:?} is not a directory", show(c)),
                    ))
                }
                None => {
                    let id = self.add_node(Node {
                        meta: Meta::new(0o755, 0, 0),
                        kind: NodeKind::Dir(BTreeMap::new()),
                    });
                    self.children_mut(cur)
                        .expect("cur is a directory")
                        .insert(c.clone(), id);
                    id
                }
            };
        }
        Ok(cur)
    }

    /// Puts `node` at `components` (creating parents). A later entry replaces an earlier one, as
    /// when extracting a tar; a directory replacing a directory keeps its children and takes the
    /// new metadata. The root itself only takes metadata.
    pub fn insert(
        &mut self,
        components: &[Vec<u8>],
        node: Node,
        entry: &[u8],
    ) -> Result<NodeId, LayerError> {
        let Some((name, parents)) = components.split_last() else {
            if !matches!(node.kind, NodeKind::Dir(_)) {
                return Err(LayerError::bad(
                    entry,
                    "the root of a layer must be a directory",
                ));
            }
            self.nodes[ROOT].meta = node.meta;
            return Ok(ROOT);
        };
        let parent = self.ensure_dir(parents, entry)?;
        let existing = self.children(parent).and_then(|m| m.get(name)).copied();
        if let Some(old) = existing {
            if matches!(self.nodes[old].kind, NodeKind::Dir(_))
                && matches!(node.kind, NodeKind::Dir(_))
            {
                self.nodes[old].meta = node.meta;
                return Ok(old);
            }
        }
        let id = self.add_node(node);
        self.children_mut(parent)
            .expect("parent is a directory")
            .insert(name.clone(), id);
        Ok(id)
    }

    /// Adds a directory entry for an existing node (a hard link).
    pub fn link(
        &mut self,
        components: &[Vec<u8>],
        target: NodeId,
        entry: &[u8],
    ) -> Result<(), LayerError> {
        let Some((name, parents)) = components.split_last() else {
            return Err(LayerError::bad(
                entry,
                "a hard link cannot replace the root",
            ));
        };
        if matches!(self.nodes[target].kind, NodeKind::Dir(_)) {
            return Err(LayerError::bad(entry, "hard link to a directory"));
        }
        let parent = self.ensure_dir(parents, entry)?;
        self.children_mut(parent)
            .expect("parent is a directory")
            .insert(name.clone(), target);
        Ok(())
    }

    /// Removes the entry at `components` if present (an OCI whiteout). Returns whether it existed.
    pub fn remove(&mut self, components: &[Vec<u8>]) -> bool {
        let Some((name, parents)) = components.split_last() else {
            return false;
        };
        match self.lookup(parents) {
            Some(p) => self
                .children_mut(p)
                .is_some_and(|m| m.remove(name).is_some()),
            None => false,
        }
    }

    /// Empties the directory at `components` (an OCI opaque directory marker).
    pub fn clear_dir(&mut self, components: &[Vec<u8>]) {
        if let Some(d) = self.lookup(components) {
            if let Some(m) = self.children_mut(d) {
                m.clear();
            }
        }
    }
}

/// Splits a source path (bytes, `/`-separated) into checked components.
///
/// `.` and empty components are dropped; `..` and absolute paths are refused, as are names longer
/// than ext4's limit and names holding a NUL byte. `entry` is what the error names.
pub fn split_path(path: &[u8], allow_absolute: bool) -> Result<Vec<Vec<u8>>, LayerError> {
    if path.first() == Some(&b'/') && !allow_absolute {
        return Err(LayerError::AbsolutePath { entry: show(path) });
    }
    let mut out = Vec::new();
    for c in path.split(|&b| b == b'/') {
        match c {
            b"" | b"." => {}
            b".." => return Err(LayerError::EscapesRoot { entry: show(path) }),
            _ => {
                if c.contains(&0) {
                    return Err(LayerError::BadEntry {
                        entry: show(path),
                        reason: "the name holds a NUL byte".into(),
                    });
                }
                if c.len() > MAX_NAME_LEN {
                    return Err(LayerError::NameTooLong {
                        entry: show(path),
                        len: c.len(),
                    });
                }
                out.push(c.to_vec());
            }
        }
    }
    Ok(out)
}

/// Symlinks followed when resolving a path (Linux's `MAXSYMLINKS`).
const MAX_SYMLINKS: usize = 40;

impl Tree {
    /// The size of the regular file at `path`, symlinks followed anywhere along it as the
    /// kernel follows them; why not, when it is missing or not a regular file.
    pub fn file_size(&self, path: &str) -> Result<u64, String> {
        let id = resolve(self, path)?;
        match &self.nodes[id].kind {
            NodeKind::File(f) => Ok(f.size),
            _ => Err("is not a regular file in the base layer".into()),
        }
    }
}

impl Tree {
    /// The bytes of the regular file at `path` (relative to the root, no symlink followed),
    /// `None` when nothing is there; at most `limit` bytes, a larger file is refused unread.
    /// For the small files a build reads from a layer's tree (its dpkg status).
    pub fn read_file_bounded(&self, path: &str, limit: u64) -> Result<Option<Vec<u8>>, String> {
        let components: Vec<Vec<u8>> = path
            .split('/')
            .filter(|c| !c.is_empty())
            .map(|c| c.as_bytes().to_vec())
            .collect();
        let Some(id) = self.lookup(&components) else {
            return Ok(None);
        };
        let NodeKind::File(f) = &self.nodes[id].kind else {
            return Err("is not a regular file".into());
        };
        if f.size > limit {
            return Err(format!(
                "{} bytes, more than the {limit} it may have",
                f.size
            ));
        }
        let mut buf = vec![0u8; f.size as usize];
        let read_at = |file: &File, offset: u64, buf: &mut [u8]| {
            std::os::unix::fs::FileExt::read_exact_at(file, buf, offset)
                .map_err(|e| format!("reading its bytes: {e}"))
        };
        match &f.source {
            DataSource::None => buf.fill(0),
            DataSource::Bytes(b) => {
                let n = buf.len();
                buf.copy_from_slice(&b[..n]);
            }
            DataSource::Region { file, offset } => read_at(&file.file, *offset, &mut buf)?,
            DataSource::Path(p) | DataSource::Scanned(ScannedFile { path: p, .. }) => {
                let file = File::open(p).map_err(|e| format!("opening {}: {e}", p.display()))?;
                read_at(&file, 0, &mut buf)?;
            }
        }
        Ok(Some(buf))
    }
}

/// The node at `path`, following symlinks (at most [`MAX_SYMLINKS`]) anywhere along it.
fn resolve(tree: &Tree, path: &str) -> Result<NodeId, String> {
    // `..` is kept (a symlink may hold it) and walked like the kernel walks it.
    let components = |p: &[u8]| -> Vec<Vec<u8>> {
        p.split(|&b| b == b'/')
            .filter(|c| !c.is_empty() && *c != b".")
            .map(<[u8]>::to_vec)
            .collect()
    };
    let mut pending: VecDeque<Vec<u8>> = components(path.as_bytes()).into();
    // The directories walked so far, the root first: `..` pops one.
    let mut walked = vec![ROOT];
    let mut hops = 0;
    while let Some(name) = pending.pop_front() {
        if name == b".." {
            if walked.len() > 1 {
                walked.pop();
            }
            continue;
        }
        let dir = *walked.last().expect("the root stays");
        let children = tree
            .children(dir)
            .ok_or_else(|| "a component on the way is not a directory".to_string())?;
        let id = *children
            .get(&name)
            .ok_or_else(|| "is missing from the base layer".to_string())?;
        match &tree.nodes[id].kind {
            NodeKind::Symlink(target) => {
                hops += 1;
                if hops > MAX_SYMLINKS {
                    return Err(format!("more than {MAX_SYMLINKS} symlinks on the way"));
                }
                if target.starts_with(b"/") {
                    walked.truncate(1);
                }
                for c in components(target).into_iter().rev() {
                    pending.push_front(c);
                }
            }
            _ => walked.push(id),
        }
    }
    Ok(*walked.last().expect("the root stays"))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn file() -> Node {
        Node {
            meta: Meta::new(0o644, 0, 0),
            kind: NodeKind::Fifo,
        }
    }

    #[test]
    fn split_path_refuses_escapes_and_long_names() {
        assert_eq!(
            split_path(b"./a//b/./c", false).unwrap(),
            vec![b"a".to_vec(), b"b".to_vec(), b"c".to_vec()]
        );
        assert!(matches!(
            split_path(b"a/../../etc", false),
            Err(LayerError::EscapesRoot { .. })
        ));
        assert!(matches!(
            split_path(b"/etc/passwd", false),
            Err(LayerError::AbsolutePath { .. })
        ));
        let long = vec![b'x'; 256];
        assert!(matches!(
            split_path(&long, false),
            Err(LayerError::NameTooLong { len: 256, .. })
        ));
        assert_eq!(split_path(&[b'y'; 255], false).unwrap().len(), 1);
    }

    #[test]
    fn insert_replaces_and_keeps_directory_children() {
        let mut t = Tree::new();
        let p = |s: &str| split_path(s.as_bytes(), false).unwrap();
        t.insert(&p("a/b/c"), file(), b"a/b/c").unwrap();
        let dir = Node {
            meta: Meta::new(0o700, 5, 6),
            kind: NodeKind::Dir(BTreeMap::new()),
        };
        let a = t.insert(&p("a"), dir, b"a").unwrap();
        assert_eq!(t.nodes[a].meta.uid, 5);
        assert!(t.lookup(&p("a/b/c")).is_some());
        t.insert(&p("a/b"), file(), b"a/b").unwrap();
        assert!(t.lookup(&p("a/b/c")).is_none());
        assert!(t.remove(&p("a/b")));
        assert!(t.lookup(&p("a/b")).is_none());
        assert!(t.insert(&p("x/y"), file(), b"x/y").is_ok());
        assert!(t.insert(&p("x/y/z"), file(), b"x/y/z").is_err());
    }
}
