//! A host directory as a layer source: lstat, readlink, xattrs and the data/hole map of every
//! file. The directory listing order never matters: children land in a sorted map.

use std::collections::HashMap;
use std::fs::{self, File};
use std::os::unix::ffi::OsStrExt;
use std::os::unix::fs::{FileTypeExt, MetadataExt};
use std::path::Path;

use rustix::fs::SeekFrom;

use ingot_verity::input::{self, Symlinks};

use crate::error::LayerError;
use crate::tree::{
    DataSource, FileData, Meta, Node, NodeId, NodeKind, ScannedFile, Tree, MAX_NAME_LEN, ROOT,
};

pub(super) fn load(root: &Path) -> Result<Tree, LayerError> {
    // The root itself may be reached through a symlink; nothing below it is followed.
    let root = &fs::canonicalize(root).map_err(|e| LayerError::io("reading", root, e))?;
    let md = fs::symlink_metadata(root).map_err(|e| LayerError::io("reading", root, e))?;
    if !md.is_dir() {
        return Err(LayerError::bad(
            root.as_os_str().as_bytes(),
            "source is not a directory",
        ));
    }
    let mut tree = Tree::new();
    tree.nodes[ROOT].meta = meta_of(root, &md, b"")?;
    let mut links = HashMap::new();
    walk(&mut tree, root, ROOT, &mut Vec::new(), 0, &mut links)?;
    Ok(tree)
}

fn walk(
    tree: &mut Tree,
    dir: &Path,
    dir_id: NodeId,
    rel: &mut Vec<u8>,
    depth: usize,
    links: &mut HashMap<(u64, u64), NodeId>,
) -> Result<(), LayerError> {
    let rd = fs::read_dir(dir).map_err(|e| LayerError::io("listing", dir, e))?;
    for ent in rd {
        let ent = ent.map_err(|e| LayerError::io("listing", dir, e))?;
        let name = ent.file_name().as_bytes().to_vec();
        let saved = rel.len();
        if !rel.is_empty() {
            rel.push(b'/');
        }
        rel.extend_from_slice(&name);
        if name.len() > MAX_NAME_LEN {
            return Err(LayerError::NameTooLong {
                entry: crate::error::show(rel),
                len: name.len(),
            });
        }
        super::check_path_len(rel, rel, "path")?;
        super::check_depth(rel, depth + 1)?;
        let path = ent.path();
        let md = fs::symlink_metadata(&path).map_err(|e| LayerError::io("reading", &path, e))?;
        let ft = md.file_type();
        let key = (md.dev(), md.ino());
        if !ft.is_dir() && md.nlink() > 1 {
            if let Some(&id) = links.get(&key) {
                insert_child(tree, dir_id, name, id);
                rel.truncate(saved);
                continue;
            }
        }
        let meta = meta_of(&path, &md, rel)?;
        let kind = if ft.is_dir() {
            NodeKind::Dir(Default::default())
        } else if ft.is_file() {
            NodeKind::File(file_data(&path, &md)?)
        } else if ft.is_symlink() {
            let t = fs::read_link(&path).map_err(|e| LayerError::io("reading link", &path, e))?;
            NodeKind::Symlink(t.as_os_str().as_bytes().to_vec())
        } else if ft.is_char_device() || ft.is_block_device() {
            let rdev = md.rdev() as rustix::fs::Dev;
            let (major, minor) = (rustix::fs::major(rdev), rustix::fs::minor(rdev));
            if ft.is_char_device() {
                NodeKind::CharDev { major, minor }
            } else {
                NodeKind::BlockDev { major, minor }
            }
        } else if ft.is_fifo() {
            NodeKind::Fifo
        } else if ft.is_socket() {
            NodeKind::Socket
        } else {
            return Err(LayerError::bad(rel, "unknown file type"));
        };
        let is_dir = matches!(kind, NodeKind::Dir(_));
        let id = tree.add_node(Node { meta, kind });
        insert_child(tree, dir_id, name, id);
        if is_dir {
            walk(tree, &path, id, rel, depth + 1, links)?;
        } else if md.nlink() > 1 {
            links.insert(key, id);
        }
        rel.truncate(saved);
    }
    Ok(())
}

fn insert_child(tree: &mut Tree, dir: NodeId, name: Vec<u8>, id: NodeId) {
    if let NodeKind::Dir(m) = &mut tree.nodes[dir].kind {
        m.insert(name, id);
    }
}

fn meta_of(path: &Path, md: &fs::Metadata, rel: &[u8]) -> Result<Meta, LayerError> {
    let mut meta = Meta::new(md.mode(), md.uid(), md.gid());
    meta.xattrs = xattrs(path, rel)?;
    Ok(meta)
}

/// All extended attributes of `path` (not following symlinks).
fn xattrs(
    path: &Path,
    rel: &[u8],
) -> Result<std::collections::BTreeMap<Vec<u8>, Vec<u8>>, LayerError> {
    let mut out = std::collections::BTreeMap::new();
    let mut names = vec![0u8; 4096];
    let n = loop {
        match rustix::fs::llistxattr(path, &mut names[..]) {
            Ok(n) => break n,
            Err(rustix::io::Errno::RANGE) => names.resize(names.len() * 4, 0),
            Err(rustix::io::Errno::NOTSUP) => return Ok(out),
            Err(e) => return Err(LayerError::io("listing xattrs of", path, e.into())),
        }
    };
    for name in names[..n].split(|&b| b == 0).filter(|s| !s.is_empty()) {
        let cname = std::ffi::CString::new(name).expect("split on NUL");
        let mut val = vec![0u8; 256];
        let len = loop {
            match rustix::fs::lgetxattr(path, cname.as_c_str(), &mut val[..]) {
                Ok(n) => break n,
                Err(rustix::io::Errno::RANGE) => val.resize(val.len() * 4, 0),
                Err(e) => {
                    return Err(LayerError::Xattr {
                        entry: crate::error::show(rel),
                        name: String::from_utf8_lossy(name).into_owned(),
                        reason: format!("reading it failed: {e}"),
                    })
                }
            }
        };
        val.truncate(len);
        out.insert(name.to_vec(), val);
    }
    Ok(out)
}

/// Opens a file the scan found, for reading its bytes: a regular file only, not through a
/// symbolic link (`O_NOFOLLOW`), and the same device, inode and size the scan saw, so a file
/// swapped or changed since cannot bring other bytes into the image.
fn open_checked(path: &Path, dev: u64, ino: u64, size: u64) -> Result<File, LayerError> {
    let changed = || LayerError::FileChanged {
        path: path.to_path_buf(),
    };
    let f = match input::open_regular(path, Symlinks::Refuse) {
        Ok(f) => f,
        Err(e) if input::input_error(&e).is_some() => return Err(changed()),
        Err(e) => return Err(LayerError::io("opening", path, e)),
    };
    let md = f
        .metadata()
        .map_err(|e| LayerError::io("reading", path, e))?;
    if (md.dev(), md.ino(), md.len()) != (dev, ino, size) {
        return Err(changed());
    }
    Ok(f)
}

/// [`open_checked`] for a file of the tree, when the image is written.
pub(crate) fn open_scanned(f: &ScannedFile) -> Result<File, LayerError> {
    open_checked(&f.path, f.dev, f.ino, f.size)
}

/// The data ranges of a regular file from SEEK_DATA/SEEK_HOLE, widened to 4 KiB blocks. Opening
/// the file here also surfaces an unreadable file before any output is written.
fn file_data(path: &Path, md: &fs::Metadata) -> Result<FileData, LayerError> {
    let size = md.len();
    let f = open_checked(path, md.dev(), md.ino(), size)?;
    if size == 0 {
        return Ok(FileData {
            size,
            source: DataSource::None,
            data: Vec::new(),
        });
    }
    // A fully allocated file has no holes; skip the two lseeks.
    let data = if md.blocks() * 512 >= size.next_multiple_of(4096) {
        std::iter::once(0..size).collect()
    } else {
        data_ranges(&f, size).map_err(|e| LayerError::io("mapping holes of", path, e))?
    };
    let source = if data.is_empty() {
        DataSource::None
    } else {
        DataSource::Scanned(ScannedFile {
            path: path.to_path_buf(),
            dev: md.dev(),
            ino: md.ino(),
            size,
        })
    };
    Ok(FileData { size, source, data })
}

fn data_ranges(f: &File, size: u64) -> std::io::Result<Vec<std::ops::Range<u64>>> {
    const B: u64 = 4096;
    let mut out: Vec<std::ops::Range<u64>> = Vec::new();
    let mut pos = 0u64;
    while pos < size {
        let start = match rustix::fs::seek(f, SeekFrom::Data(pos)) {
            Ok(s) => s,
            Err(rustix::io::Errno::NXIO) => break,
            Err(rustix::io::Errno::INVAL) if pos == 0 => {
                return Ok(std::iter::once(0..size).collect())
            }
            Err(e) => return Err(e.into()),
        };
        let end = match rustix::fs::seek(f, SeekFrom::Hole(start)) {
            Ok(e) => e.min(size),
            Err(rustix::io::Errno::NXIO) => size,
            Err(e) => return Err(e.into()),
        };
        let s = start / B * B;
        let e = end.next_multiple_of(B).min(size);
        match out.last_mut() {
            Some(last) if last.end >= s => last.end = last.end.max(e),
            _ => out.push(s..e),
        }
        pos = end.max(start + 1);
    }
    Ok(out)
}
