//! Tar archives (plain, gzip, zstd) as a layer source, and as the layers of an OCI image.
//!
//! A compressed archive is first decompressed into an unlinked temporary file beside the output;
//! then every regular file's bytes are referenced in place (offset into the plain archive), so a
//! file's data is read once, when the image is written. Member names are checked: absolute paths,
//! `..`, hard links leaving the root and NUL bytes in PAX names, link targets or attribute names
//! are refused with the member's name.

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

/// The largest PAX header or GNU long name/link member read into memory, as Go's
/// `archive/tar` caps them: real ones are a few hundred bytes.
pub const MAX_EXTENSION_SIZE: u64 = 1 << 20;

fn tar_err(path: &Path, reason: impl std::fmt::Display) -> LayerError {
    LayerError::Tar {
        path: path.to_path_buf(),
        reason: reason.to_string(),
    }
}

/// Opens `path` as a plain tar, decompressing into a scratch file when it is gzip or zstd.
fn open_plain(path: &Path, scratch: &Path) -> Result<File, LayerError> {
    // A regular file only: a FIFO would hang the open, a device would be read without end.
    let mut f = ingot_verity::input::open_regular(path, ingot_verity::input::Symlinks::Follow)
        .map_err(|e| LayerError::io("opening", path, e))?;
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
    spill
        .seek(SeekFrom::Start(0))
        .map_err(|e| LayerError::io("rewinding scratch file for", path, e))?;
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

/// One tar header block, decoded.
struct Header {
    name: Vec<u8>,
    mode: u64,
    uid: u64,
    gid: u64,
    size: u64,
    kind: u8,
    link: Vec<u8>,
    major: u64,
    minor: u64,
}

/// A NUL-terminated field.
fn cstr(f: &[u8]) -> &[u8] {
    let n = f.iter().position(|&b| b == 0).unwrap_or(f.len());
    &f[..n]
}

/// A numeric field: octal text, or base-256 when the top bit of the first byte is set.
fn number(f: &[u8]) -> Option<u64> {
    if f[0] & 0x80 != 0 {
        if f[0] & 0x40 != 0 {
            return None; // negative
        }
        let mut v: u64 = u64::from(f[0] & 0x3f);
        for &b in &f[1..] {
            v = v.checked_mul(256)?.checked_add(u64::from(b))?;
        }
        return Some(v);
    }
    let t: Vec<u8> = f.iter().copied().filter(|&b| b != 0 && b != b' ').collect();
    if t.is_empty() {
        return Some(0);
    }
    u64::from_str_radix(std::str::from_utf8(&t).ok()?, 8).ok()
}

fn parse_header(b: &[u8; 512]) -> Result<Header, String> {
    let sum: u64 = b
        .iter()
        .enumerate()
        .map(|(i, &x)| {
            if (148..156).contains(&i) {
                32
            } else {
                u64::from(x)
            }
        })
        .sum();
    if number(&b[148..156]) != Some(sum) {
        return Err("bad header checksum (not a tar archive, or corrupt)".into());
    }
    let num = |r: std::ops::Range<usize>, what: &str| {
        number(&b[r]).ok_or_else(|| format!("bad {what} field"))
    };
    let mut name = cstr(&b[0..100]).to_vec();
    // POSIX ustar: a prefix joined with '/'. (GNU's "ustar  " format uses those bytes otherwise.)
    if &b[257..263] == b"ustar\0" {
        let prefix = cstr(&b[345..500]);
        if !prefix.is_empty() {
            let mut p = prefix.to_vec();
            p.push(b'/');
            p.extend_from_slice(&name);
            name = p;
        }
    }
    Ok(Header {
        name,
        mode: num(100..108, "mode")?,
        uid: num(108..116, "uid")?,
        gid: num(116..124, "gid")?,
        size: num(124..136, "size")?,
        kind: b[156],
        link: cstr(&b[157..257]).to_vec(),
        major: num(329..337, "device major")?,
        minor: num(337..345, "device minor")?,
    })
}

/// PAX extended header records: "LEN KEY=VALUE\n", LEN counting the whole record, so values may
/// hold any byte (binary xattrs, newlines in names).
/// One PAX record: key and value bytes.
type PaxRecord = (Vec<u8>, Vec<u8>);

fn pax_records(data: &[u8]) -> Result<Vec<PaxRecord>, String> {
    let mut out = Vec::new();
    let mut rest = data;
    while !rest.is_empty() && rest[0] != 0 {
        let sp = rest
            .iter()
            .position(|&b| b == b' ')
            .ok_or("malformed pax record")?;
        let len: usize = std::str::from_utf8(&rest[..sp])
            .ok()
            .and_then(|s| s.parse().ok())
            .ok_or("malformed pax record length")?;
        if len <= sp + 1 || len > rest.len() || rest[len - 1] != b'\n' {
            return Err("malformed pax record".into());
        }
        let rec = &rest[sp + 1..len - 1];
        let eq = rec
            .iter()
            .position(|&b| b == b'=')
            .ok_or("malformed pax record")?;
        out.push((rec[..eq].to_vec(), rec[eq + 1..].to_vec()));
        rest = &rest[len..];
    }
    Ok(out)
}

/// PAX values may hold any byte, but a NUL inside a name cannot be stored: ext4 would keep a
/// directory entry `e2fsck` calls illegal, a symlink the kernel reads short, or two attributes
/// with one name. Such members are refused, named up to the NUL.
fn check_no_nul(
    raw: &[u8],
    link: &[u8],
    xattrs: &std::collections::BTreeMap<Vec<u8>, Vec<u8>>,
) -> Result<(), LayerError> {
    let shown = cstr(raw);
    if raw.contains(&0) {
        return Err(LayerError::bad(
            shown,
            format!(
                "the member's path {:?} holds a NUL byte",
                String::from_utf8_lossy(raw)
            ),
        ));
    }
    if link.contains(&0) {
        return Err(LayerError::bad(
            shown,
            format!(
                "the link target {:?} holds a NUL byte",
                String::from_utf8_lossy(link)
            ),
        ));
    }
    if let Some(name) = xattrs.keys().find(|k| k.contains(&0)) {
        return Err(LayerError::Xattr {
            entry: show(shown),
            name: String::from_utf8_lossy(name).into_owned(),
            reason: "the attribute name holds a NUL byte".into(),
        });
    }
    Ok(())
}

fn read_exact_at(
    f: &File,
    buf: &mut [u8],
    off: u64,
    path: &Path,
    what: &str,
) -> Result<(), LayerError> {
    f.read_exact_at(buf, off).map_err(|e| {
        if e.kind() == io::ErrorKind::UnexpectedEof {
            tar_err(
                path,
                format!("truncated: {what} at offset {off} runs past the end"),
            )
        } else {
            LayerError::io("reading", path, e)
        }
    })
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
    let members = read_members(path, scratch, whiteouts)?;
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
    let mut members = members;
    for i in 0..members.len() {
        let m = &mut members[i];
        match std::mem::replace(&mut m.action, Action::Whiteout) {
            Action::Put(node) => {
                tree.insert(&m.comps, node, &m.raw)?;
            }
            Action::HardLink(tcomps, target) => {
                let Some(id) = tree.lookup(&tcomps) else {
                    return Err(missing_link_target(&members, i, &tcomps, &target));
                };
                let m = &members[i];
                tree.link(&m.comps, id, &m.raw)?;
            }
            Action::Whiteout | Action::Opaque => {}
        }
    }
    Ok(())
}

/// The error for hard link member `i` whose target is not in the tree: tar extractors only
/// link to members already extracted, so a target that comes later is named as such.
fn missing_link_target(
    members: &[Member],
    i: usize,
    tcomps: &[Vec<u8>],
    target: &[u8],
) -> LayerError {
    let later = members[i + 1..]
        .iter()
        .any(|m| m.comps == tcomps && matches!(m.action, Action::Put(_) | Action::HardLink(..)));
    let reason = if later {
        format!(
            "hard link target {:?} points forward to a later member of the archive; a hard \
             link must come after the member it links to",
            show(target)
        )
    } else {
        format!("hard link target {:?} is not in the archive", show(target))
    };
    LayerError::bad(&members[i].raw, reason)
}

/// A member's name, link, size, owner and attributes once its extension records (GNU long
/// names, PAX) are applied.
struct Extended {
    raw: Vec<u8>,
    link: Vec<u8>,
    size: u64,
    uid: u64,
    gid: u64,
    xattrs: std::collections::BTreeMap<Vec<u8>, Vec<u8>>,
}

/// Every member of the archive, in order, with what it does to the tree.
fn read_members(path: &Path, scratch: &Path, whiteouts: bool) -> Result<Vec<Member>, LayerError> {
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
    let mut members = Vec::new();
    let mut pos = 0u64;
    let mut long_name: Option<Vec<u8>> = None;
    let mut long_link: Option<Vec<u8>> = None;
    let mut pax: Vec<PaxRecord> = Vec::new();
    let mut block = [0u8; 512];
    loop {
        read_exact_at(&plain, &mut block, pos, path, "a member header")?;
        if block.iter().all(|&b| b == 0) {
            // End-of-archive marker. An archive cut at a member boundary has none, and the read
            // above fails instead.
            break;
        }
        let h = parse_header(&block)
            .map_err(|r| tar_err(path, format!("header at offset {pos}: {r}")))?;
        let at = pos;
        let data_at = pos + 512;
        let stored = h.size;
        let next = data_at
            .checked_add(stored.next_multiple_of(512))
            .ok_or_else(|| tar_err(path, format!("member at offset {pos}: size overflow")))?;
        if next > len {
            let name = long_name.as_deref().unwrap_or(&h.name);
            return Err(tar_err(
                path,
                format!(
                    "truncated: member {:?} needs {next} bytes, the archive has {len}",
                    show(name)
                ),
            ));
        }
        let read_data = |what: &str| -> Result<Vec<u8>, LayerError> {
            // Extension records are read into memory: never at a hostile declared size.
            if stored > MAX_EXTENSION_SIZE {
                return Err(tar_err(
                    path,
                    format!(
                        "header at offset {at}: the {what} is {stored} bytes, more than the \
                         {MAX_EXTENSION_SIZE} bytes accepted"
                    ),
                ));
            }
            let mut d = vec![0u8; stored as usize];
            read_exact_at(&plain, &mut d, data_at, path, what)?;
            Ok(d)
        };
        pos = next;
        match h.kind {
            b'x' => {
                pax = pax_records(&read_data("pax header")?)
                    .map_err(|r| tar_err(path, format!("header at offset {at}: {r}")))?;
                continue;
            }
            b'g' => continue, // global records carry nothing ingot keeps (times are the epoch)
            b'L' => {
                long_name = Some(cstr(&read_data("long name")?).to_vec());
                continue;
            }
            b'K' => {
                long_link = Some(cstr(&read_data("long link name")?).to_vec());
                continue;
            }
            _ => {}
        }
        // A real member: apply the extension records that preceded it.
        let ext = Extended {
            raw: long_name.take().unwrap_or(h.name.clone()),
            link: long_link.take().unwrap_or(h.link.clone()),
            size: h.size,
            uid: h.uid,
            gid: h.gid,
            xattrs: Default::default(),
        };
        let ext = apply_pax(ext, std::mem::take(&mut pax), path, at)?;
        if ext.size != stored && !matches!(h.kind, b'1' | b'2' | b'5') {
            return Err(LayerError::bad(
                &ext.raw,
                "pax size differs from the stored size",
            ));
        }
        if h.kind == b'V' {
            continue; // volume label
        }
        let data = DataSource::Region {
            file: src.clone(),
            offset: data_at,
        };
        members.push(member(&h, ext, data, whiteouts)?);
    }
    Ok(members)
}

/// Applies a member's PAX records (path, linkpath, size, uid, gid, xattrs) and refuses NUL
/// bytes in what they name.
fn apply_pax(
    mut ext: Extended,
    pax: Vec<PaxRecord>,
    path: &Path,
    pos: u64,
) -> Result<Extended, LayerError> {
    for (k, v) in pax {
        let num = || -> Result<u64, LayerError> {
            std::str::from_utf8(&v)
                .ok()
                .and_then(|s| s.parse().ok())
                .ok_or_else(|| {
                    tar_err(
                        path,
                        format!(
                            "member at offset {pos}: bad pax {} value",
                            String::from_utf8_lossy(&k)
                        ),
                    )
                })
        };
        match k.as_slice() {
            b"path" => ext.raw = v,
            b"linkpath" => ext.link = v,
            b"size" => ext.size = num()?,
            b"uid" => ext.uid = num()?,
            b"gid" => ext.gid = num()?,
            _ if k.starts_with(b"SCHILY.xattr.") => {
                ext.xattrs.insert(k[b"SCHILY.xattr.".len()..].to_vec(), v);
            }
            _ if k.starts_with(b"GNU.sparse.") => {
                return Err(LayerError::bad(
                    &ext.raw,
                    "PAX sparse members are not supported; archive without --sparse",
                ));
            }
            _ => {}
        }
    }
    check_no_nul(&ext.raw, &ext.link, &ext.xattrs)?;
    Ok(ext)
}

/// What one member does to the tree. `data` is where a regular file's bytes are.
fn member(
    h: &Header,
    ext: Extended,
    data: DataSource,
    whiteouts: bool,
) -> Result<Member, LayerError> {
    let Extended {
        raw,
        link,
        size,
        uid,
        gid,
        xattrs,
    } = ext;
    super::check_path_len(&raw, &raw, "path")?;
    let comps = split_path(&raw, false)?;
    super::check_depth(&raw, comps.len())?;
    let (Ok(uid), Ok(gid)) = (u32::try_from(uid), u32::try_from(gid)) else {
        return Err(LayerError::bad(&raw, "uid or gid does not fit 32 bits"));
    };
    let mut meta = Meta::new(h.mode as u32, uid, gid);
    meta.xattrs = xattrs;
    let base = comps.last().map(|c| c.as_slice()).unwrap_or(b"");
    let action = if whiteouts && base == OPAQUE {
        Action::Opaque
    } else if whiteouts && base.starts_with(WHITEOUT) {
        Action::Whiteout
    } else if h.kind == b'1' {
        super::check_path_len(&raw, &link, "hard link target")?;
        let tcomps = split_path(&link, false).map_err(|e| match e {
            LayerError::EscapesRoot { .. } | LayerError::AbsolutePath { .. } => {
                LayerError::EscapesRoot {
                    entry: format!("{} (hard link to {})", show(&raw), show(&link)),
                }
            }
            other => other,
        })?;
        Action::HardLink(tcomps, link)
    } else {
        let kind = node_kind(h, &raw, link, size, data)?;
        Action::Put(Node { meta, kind })
    };
    Ok(Member { raw, comps, action })
}

/// The node a member that is not a hard link or whiteout makes.
fn node_kind(
    h: &Header,
    raw: &[u8],
    link: Vec<u8>,
    size: u64,
    data: DataSource,
) -> Result<NodeKind, LayerError> {
    Ok(match h.kind {
        b'0' | 0 | b'7' => {
            if size == 0 {
                NodeKind::File(FileData {
                    size,
                    source: DataSource::None,
                    data: Vec::new(),
                })
            } else {
                NodeKind::File(FileData {
                    size,
                    source: data,
                    data: std::iter::once(0..size).collect(),
                })
            }
        }
        b'5' => NodeKind::Dir(Default::default()),
        b'2' => NodeKind::Symlink(link),
        b'3' | b'4' => {
            let (Ok(major), Ok(minor)) = (u32::try_from(h.major), u32::try_from(h.minor)) else {
                return Err(LayerError::bad(raw, "device number out of range"));
            };
            if h.kind == b'3' {
                NodeKind::CharDev { major, minor }
            } else {
                NodeKind::BlockDev { major, minor }
            }
        }
        b'6' => NodeKind::Fifo,
        b'S' => {
            return Err(LayerError::bad(
                raw,
                "GNU sparse members are not supported; archive without --sparse",
            ))
        }
        other => {
            return Err(LayerError::bad(
                raw,
                format!("unsupported tar member type {:?}", other as char),
            ));
        }
    })
}
