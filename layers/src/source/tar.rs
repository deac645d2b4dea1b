//! Tar archives (plain, gzip, zstd) as a layer source, and as the layers of an OCI image.
//!
//! A compressed archive is first decompressed into an unlinked temporary file beside the output;
//! then every regular file's bytes are referenced in place (offset into the plain archive), so a
//! file's data is read once, when the image is written. Member names are checked: absolute paths,
//! `..` and hard links leaving the root are refused with the member's name.

use std::fs::File;
use std::io::{self, BufReader, Read, Seek, SeekFrom, Write};
use std::os::unix::fs::FileExt;
use std::path::Path;
use std::sync::Arc;

use crate::error::{show, LayerError};
use crate::tree::{split_path, DataSource, FileData, Meta, Node, NodeKind, SourceFile, Tree};

const GZIP_MAGIC: &[u8] = &[0x1f, 0x8b];
const ZSTD_MAGIC: &[u8] = &[0x28, 0xb5, 0x2f, 0xfd];
const WHITEOUT: &[u8] = b".wh.";
const OPAQUE: &[u8] = b".wh..wh..opq";

fn tar_err(path: &Path, reason: impl std::fmt::Display) -> LayerError {
    LayerError::Tar {
        path: path.to_path_buf(),
        reason: reason.to_string(),
    }
}

/// Opens `path` as a plain tar, decompressing into a scratch file when it is gzip or zstd.
fn open_plain(path: &Path, scratch: &Path) -> Result<File, LayerError> {
    let mut f = File::open(path).map_err(|e| LayerError::io("opening", path, e))?;
    let mut magic = [0u8; 4];
    let n = f
        .read_at(&mut magic, 0)
        .map_err(|e| LayerError::io("reading", path, e))?;
    let magic = &magic[..n];
    let decoder: Box<dyn Read> = if magic.starts_with(GZIP_MAGIC) {
        Box::new(flate2::read::MultiGzDecoder::new(BufReader::with_capacity(
            1 << 20,
            f,
        )))
    } else if magic.starts_with(ZSTD_MAGIC) {
        Box::new(
            zstd::stream::read::Decoder::new(f).map_err(|e| tar_err(path, format!("zstd: {e}")))?,
        )
    } else {
        f.seek(SeekFrom::Start(0))
            .map_err(|e| LayerError::io("reading", path, e))?;
        return Ok(f);
    };
    let mut spill = tempfile::tempfile_in(scratch)
        .map_err(|e| LayerError::io("creating a scratch file in", scratch, e))?;
    copy_all(decoder, &mut spill).map_err(|e| tar_err(path, format!("decompressing: {e}")))?;
    Ok(spill)
}

fn copy_all(mut r: impl Read, w: &mut File) -> io::Result<()> {
    let mut buf = vec![0u8; 1 << 20];
    loop {
        let n = match r.read(&mut buf) {
            Ok(0) => return Ok(()),
            Ok(n) => n,
            Err(e) if e.kind() == io::ErrorKind::Interrupted => continue,
            Err(e) => return Err(e),
        };
        w.write_all(&buf[..n])?;
    }
}

/// What one member does to the tree.
enum Action {
    Put(Node),
    HardLink(Vec<Vec<u8>>, Vec<u8>),
    Whiteout,
    Opaque,
}

struct Member {
    raw: Vec<u8>,
    comps: Vec<Vec<u8>>,
    action: Action,
}

/// Reads the archive at `path` and applies its members to `tree`. With `whiteouts`, OCI
/// whiteout files (`.wh.NAME`) delete `NAME` and `.wh..wh..opq` empties its directory, both
/// before the archive's own entries are added.
pub(super) fn apply(
    tree: &mut Tree,
    path: &Path,
    scratch: &Path,
    whiteouts: bool,
) -> Result<(), LayerError> {
    let plain = open_plain(path, scratch)?;
    let len = plain
        .metadata()
        .map_err(|e| LayerError::io("reading", path, e))?
        .len();
    let src = Arc::new(SourceFile {
        file: plain
            .try_clone()
            .map_err(|e| LayerError::io("reading", path, e))?,
        name: path.to_path_buf(),
    });
    let mut spill: Option<(Arc<SourceFile>, u64)> = None;
    let mut archive = tar::Archive::new(&plain);
    let mut members = Vec::new();
    let mut end = 0u64;
    let entries = archive.entries_with_seek().map_err(|e| tar_err(path, e))?;
    for entry in entries {
        let mut entry = entry.map_err(|e| tar_err(path, e))?;
        let raw = entry.path_bytes().into_owned();
        let et = entry.header().entry_type();
        let pos = entry.raw_file_position();
        let stored = entry
            .header()
            .entry_size()
            .map_err(|e| tar_err(path, format!("{}: {e}", show(&raw))))?;
        let size = entry.size();
        let stored = if et.is_gnu_sparse() { stored } else { size };
        end = pos + stored.next_multiple_of(512);
        if end > len {
            return Err(tar_err(
                path,
                format!(
                    "truncated: member {:?} needs {} bytes, the archive has {}",
                    show(&raw),
                    end,
                    len
                ),
            ));
        }
        if et.is_pax_global_extensions()
            || et.is_pax_local_extensions()
            || et.is_gnu_longname()
            || et.is_gnu_longlink()
        {
            continue;
        }
        let comps = split_path(&raw, false)?;
        let h = entry.header().clone();
        let mode = h
            .mode()
            .map_err(|e| tar_err(path, format!("{}: {e}", show(&raw))))?;
        let uid = h
            .uid()
            .map_err(|e| tar_err(path, format!("{}: {e}", show(&raw))))?;
        let gid = h
            .gid()
            .map_err(|e| tar_err(path, format!("{}: {e}", show(&raw))))?;
        let (Ok(uid), Ok(gid)) = (u32::try_from(uid), u32::try_from(gid)) else {
            return Err(LayerError::bad(&raw, "uid or gid does not fit 32 bits"));
        };
        let mut meta = Meta::new(mode, uid, gid);
        if let Some(exts) = entry
            .pax_extensions()
            .map_err(|e| tar_err(path, format!("{}: {e}", show(&raw))))?
        {
            for ext in exts {
                let ext = ext.map_err(|e| tar_err(path, format!("{}: {e}", show(&raw))))?;
                if let Some(name) = ext.key_bytes().strip_prefix(b"SCHILY.xattr.") {
                    meta.xattrs
                        .insert(name.to_vec(), ext.value_bytes().to_vec());
                }
            }
        }
        let base = comps.last().map(|c| c.as_slice()).unwrap_or(b"");
        let action = if whiteouts && base == OPAQUE {
            Action::Opaque
        } else if whiteouts && base.starts_with(WHITEOUT) {
            Action::Whiteout
        } else {
            use tar::EntryType as T;
            let kind = match et {
                T::Regular | T::Continuous | T::GNUSparse => {
                    let source = if size == 0 {
                        DataSource::None
                    } else if et.is_gnu_sparse() {
                        // Sparse members are stored packed; expand them into a scratch file.
                        let (file, at) = match &mut spill {
                            Some(s) => (s.0.clone(), &mut s.1),
                            None => {
                                let f = tempfile::tempfile_in(scratch).map_err(|e| {
                                    LayerError::io("creating a scratch file in", scratch, e)
                                })?;
                                let sf = Arc::new(SourceFile {
                                    file: f,
                                    name: path.to_path_buf(),
                                });
                                let s = spill.insert((sf, 0));
                                (s.0.clone(), &mut s.1)
                            }
                        };
                        let offset = *at;
                        let mut w = &file.file;
                        w.seek(SeekFrom::Start(offset))
                            .map_err(|e| LayerError::io("writing scratch file for", path, e))?;
                        let copied = io::copy(&mut entry, &mut w)
                            .map_err(|e| tar_err(path, format!("{}: {e}", show(&raw))))?;
                        if copied != size {
                            return Err(tar_err(
                                path,
                                format!("truncated: member {:?}", show(&raw)),
                            ));
                        }
                        *at += size;
                        DataSource::Region { file, offset }
                    } else {
                        DataSource::Region {
                            file: src.clone(),
                            offset: pos,
                        }
                    };
                    let data = if size == 0 { Vec::new() } else { vec![0..size] };
                    NodeKind::File(FileData { size, source, data })
                }
                T::Directory => NodeKind::Dir(Default::default()),
                T::Symlink => NodeKind::Symlink(
                    entry
                        .link_name_bytes()
                        .map(|c| c.into_owned())
                        .unwrap_or_default(),
                ),
                T::Link => {
                    let target = entry
                        .link_name_bytes()
                        .map(|c| c.into_owned())
                        .unwrap_or_default();
                    let tcomps = split_path(&target, false).map_err(|e| match e {
                        LayerError::EscapesRoot { .. } | LayerError::AbsolutePath { .. } => {
                            LayerError::EscapesRoot {
                                entry: format!("{} (hard link to {})", show(&raw), show(&target)),
                            }
                        }
                        other => other,
                    })?;
                    members.push(Member {
                        raw,
                        comps,
                        action: Action::HardLink(tcomps, target),
                    });
                    continue;
                }
                T::Char | T::Block => {
                    let major = h.device_major().ok().flatten().unwrap_or(0);
                    let minor = h.device_minor().ok().flatten().unwrap_or(0);
                    if et == T::Char {
                        NodeKind::CharDev { major, minor }
                    } else {
                        NodeKind::BlockDev { major, minor }
                    }
                }
                T::Fifo => NodeKind::Fifo,
                other => {
                    return Err(LayerError::bad(
                        &raw,
                        format!("unsupported tar member type {:?}", other.as_byte() as char),
                    ));
                }
            };
            Action::Put(Node { meta, kind })
        };
        members.push(Member { raw, comps, action });
    }
    // The end-of-archive marker (a zero block) must follow the last member; without it the
    // archive was cut at a member boundary.
    let mut marker = [0u8; 512];
    let got = plain
        .read_at(&mut marker, end)
        .map_err(|e| LayerError::io("reading", path, e))?;
    if got < 512 || marker.iter().any(|&b| b != 0) {
        return Err(tar_err(
            path,
            "truncated: no end-of-archive marker after the last member",
        ));
    }

    if whiteouts {
        for m in &members {
            match m.action {
                Action::Opaque => tree.clear_dir(&m.comps[..m.comps.len() - 1]),
                Action::Whiteout => {
                    let mut target = m.comps.clone();
                    let last = target.pop().expect("whiteout has a name");
                    target.push(last[WHITEOUT.len()..].to_vec());
                    tree.remove(&target);
                }
                _ => {}
            }
        }
    }
    for m in members {
        match m.action {
            Action::Put(node) => {
                tree.insert(&m.comps, node, &m.raw)?;
            }
            Action::HardLink(tcomps, target) => {
                let Some(id) = tree.lookup(&tcomps) else {
                    return Err(LayerError::bad(
                        &m.raw,
                        format!("hard link target {:?} is not in the archive", show(&target)),
                    ));
                };
                tree.link(&m.comps, id, &m.raw)?;
            }
            Action::Whiteout | Action::Opaque => {}
        }
    }
    Ok(())
}
