//! The tree operations on files and block devices: what `veritysetup format`, `verify` and
//! `dump` do with paths.

use std::fs::{File, OpenOptions};
use std::io::{Seek, SeekFrom};
use std::ops::Range;
use std::os::unix::fs::{FileExt, MetadataExt, OpenOptionsExt};
use std::path::Path;

use memmap2::{Advice, Mmap, MmapOptions};

use crate::error::{ParamError, VerityError};
use crate::params::SUPERBLOCK_SIZE;
use crate::params::{Geometry, VerityParams};
use crate::root_hash::RootHash;
use crate::superblock::Superblock;
use crate::tree::{build_tree_sparse, ZeroRanges};
use crate::verify::Verifier;

/// What `format` computed and wrote.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct FormatResult {
    /// The parameters used, with `data_blocks` resolved.
    pub params: VerityParams,
    pub geometry: Geometry,
    pub root_hash: RootHash,
}

fn io<'a>(path: &'a Path, what: &'static str) -> impl FnOnce(std::io::Error) -> VerityError + 'a {
    move |source| VerityError::Io {
        path: path.to_path_buf(),
        what,
        source,
    }
}

/// Size in bytes of a file or block device.
fn device_size(file: &mut File, path: &Path) -> Result<u64, VerityError> {
    file.seek(SeekFrom::End(0))
        .map_err(io(path, "measuring size"))
}

/// Opens the data device and checks it holds `data_blocks` blocks. `data_blocks == 0` means
/// every whole block of the device; a trailing partial block is ignored, as veritysetup does.
fn open_data(path: &Path, params: &mut VerityParams) -> Result<File, VerityError> {
    let mut file = File::open(path).map_err(io(path, "opening data device"))?;
    let size = device_size(&mut file, path)?;
    if size == 0 {
        return Err(VerityError::EmptyData {
            path: path.to_path_buf(),
        });
    }
    let dbs = params.data_block_size;
    if !crate::params::block_size_ok(dbs as u64) {
        return Err(ParamError::BlockSize {
            which: "data",
            size: dbs as u64,
        }
        .into());
    }
    if params.data_blocks == 0 {
        params.data_blocks = size / dbs as u64;
    }
    let need = params
        .data_blocks
        .checked_mul(dbs as u64)
        .ok_or(ParamError::Overflow)?;
    if size < need || params.data_blocks == 0 {
        return Err(VerityError::DataTooSmall {
            path: path.to_path_buf(),
            have: size,
            need: need.max(dbs as u64),
            blocks: params.data_blocks.max(1),
            block_size: dbs,
        });
    }
    Ok(file)
}

/// Opens the data device and maps its first `data_blocks` blocks (see [`open_data`]).
fn map_data(path: &Path, params: &mut VerityParams) -> Result<(File, Mmap), VerityError> {
    let file = open_data(path, params)?;
    let need = params.data_blocks * params.data_block_size as u64;
    let len = usize::try_from(need).map_err(|_| ParamError::Overflow)?;
    // SAFETY-free: memmap2's map is unsafe only because another process may change the file
    // underneath; the tree then describes whatever was read, and verify catches any change.
    #[allow(unsafe_code)] // mapping a file: see above
    let map = unsafe { MmapOptions::new().len(len).map(&file) }
        .map_err(io(path, "mapping data device"))?;
    let _ = map.advise(Advice::Sequential);
    Ok((file, map))
}

/// Holes of a regular file inside `[0, end)`, found with SEEK_DATA / SEEK_HOLE. Anything else
/// (block devices, filesystems without hole reporting) yields no ranges and is simply read.
fn holes(file: &File, end: u64) -> ZeroRanges {
    use rustix::fs::{seek, SeekFrom as RSeek};
    let regular = file
        .metadata()
        .map(|m| m.file_type().is_file())
        .unwrap_or(false);
    if !regular {
        return ZeroRanges::default();
    }
    let mut ranges: Vec<Range<u64>> = Vec::new();
    let mut pos = 0u64;
    while pos < end {
        let data = match seek(file, RSeek::Data(pos)) {
            Ok(d) => d,
            Err(rustix::io::Errno::NXIO) => end, // no data after pos: the rest is a hole
            Err(_) => return ZeroRanges::default(),
        };
        if data > pos {
            ranges.push(pos..data.min(end));
        }
        if data >= end {
            break;
        }
        pos = match seek(file, RSeek::Hole(data)) {
            Ok(h) => h,
            Err(_) => return ZeroRanges::default(),
        };
    }
    ZeroRanges::new(ranges)
}

fn same_file(a: &File, b: &File) -> bool {
    match (a.metadata(), b.metadata()) {
        (Ok(a), Ok(b)) => {
            if a.file_type().is_file() && b.file_type().is_file() {
                a.dev() == b.dev() && a.ino() == b.ino()
            } else {
                // Block device nodes: the same device number is the same disk.
                a.rdev() != 0 && a.rdev() == b.rdev()
            }
        }
        _ => false,
    }
}

/// `veritysetup format DATA HASH`: builds the tree of `data` and writes it (and the superblock,
/// unless `params.superblock` is false) to `hash` at `params.hash_offset`. `hash` is created
/// (mode 0600) when missing and never truncated, like veritysetup; bytes between the superblock
/// and the tree are not written, so a new file reads zeros there. `params.data_blocks == 0`
/// means the whole data device.
pub fn format_file(
    data: &Path,
    hash: &Path,
    params: &VerityParams,
) -> Result<FormatResult, VerityError> {
    let mut params = params.clone();
    let (data_file, map) = map_data(data, &mut params)?;
    let geometry = params.geometry()?;

    // Like veritysetup: create the hash file (0600) when missing, never truncate an existing one.
    // A file this call created is removed again if the format fails.
    let created = OpenOptions::new()
        .read(true)
        .write(true)
        .create_new(true)
        .mode(0o600)
        .open(hash);
    let (hash_file, created) = match created {
        Ok(f) => (f, true),
        Err(e) if e.kind() == std::io::ErrorKind::AlreadyExists => {
            let f = OpenOptions::new()
                .read(true)
                .write(true)
                .open(hash)
                .map_err(io(hash, "opening hash device"))?;
            (f, false)
        }
        Err(e) => return Err(io(hash, "creating hash file")(e)),
    };
    let written = write_tree(&params, &geometry, &data_file, &map, &hash_file, hash);
    if written.is_err() && created {
        let _ = std::fs::remove_file(hash);
    }
    Ok(FormatResult {
        root_hash: written?,
        params,
        geometry,
    })
}

fn write_tree(
    params: &VerityParams,
    geometry: &Geometry,
    data_file: &File,
    map: &Mmap,
    hash_file: &File,
    hash: &Path,
) -> Result<RootHash, VerityError> {
    let data_end = params.data_blocks * params.data_block_size as u64;
    if same_file(data_file, hash_file) && data_end > params.hash_offset {
        return Err(VerityError::Overlap {
            path: hash.to_path_buf(),
            data_end,
            hash_offset: params.hash_offset,
        });
    }
    let zeros = holes(data_file, data_end);
    let tree = build_tree_sparse(params, map, &zeros)?;
    hash_file
        .write_all_at(&tree.blocks, geometry.tree_offset())
        .map_err(io(hash, "writing hash tree"))?;
    if params.superblock {
        let sb = Superblock::from_params(params).to_bytes();
        hash_file
            .write_all_at(&sb, params.hash_offset)
            .map_err(io(hash, "writing superblock"))?;
        if geometry.hash_blocks == 0 {
            // With a single data block nothing but the superblock is written. veritysetup writes
            // it read-modify-write in blocks of min(hash block size, page size), so its file ends
            // at the end of that block; match it byte for byte.
            let bs = (params.hash_block_size as u64).min(4096);
            let end = params.hash_offset / bs * bs + bs;
            let meta = hash_file.metadata().map_err(io(hash, "reading metadata"))?;
            if meta.file_type().is_file() && meta.len() < end {
                hash_file
                    .set_len(end)
                    .map_err(io(hash, "extending hash file"))?;
            }
        }
    }
    hash_file
        .sync_data()
        .map_err(io(hash, "syncing hash device"))?;
    Ok(tree.root_hash)
}

/// Reads and checks the superblock at `hash_offset` of `hash`.
pub fn read_superblock(hash: &Path, hash_offset: u64) -> Result<Superblock, VerityError> {
    if hash_offset % 512 != 0 {
        return Err(ParamError::HashOffsetMisaligned(hash_offset).into());
    }
    let file = File::open(hash).map_err(io(hash, "opening hash device"))?;
    let mut buf = [0u8; SUPERBLOCK_SIZE];
    let mut read = 0;
    while read < SUPERBLOCK_SIZE {
        match file.read_at(&mut buf[read..], hash_offset + read as u64) {
            Ok(0) => break,
            Ok(n) => read += n,
            Err(e) if e.kind() == std::io::ErrorKind::Interrupted => {}
            Err(e) => return Err(io(hash, "reading superblock")(e)),
        }
    }
    Superblock::parse(&buf[..read]).map_err(|source| VerityError::Superblock {
        path: hash.to_path_buf(),
        source,
    })
}

/// `veritysetup verify DATA HASH ROOT`: with a superblock the parameters come from it (only
/// `hash_offset` is taken from `params`); without, from `params` (`data_blocks == 0` means the
/// whole data device). Returns the parameters used; fails naming the first bad hash or data block.
pub fn verify_files(
    data: &Path,
    hash: &Path,
    root_hash: &RootHash,
    params: &VerityParams,
) -> Result<VerityParams, VerityError> {
    let mut params = if params.superblock {
        read_superblock(hash, params.hash_offset)?.to_params(params.hash_offset)
    } else {
        params.clone()
    };
    let data_file = open_data(data, &mut params)?;
    let g = params.geometry()?;

    let mut hash_file = File::open(hash).map_err(io(hash, "opening hash device"))?;
    let have = device_size(&mut hash_file, hash)?.saturating_sub(params.hash_offset);
    if have < g.hash_device_size {
        return Err(VerityError::HashTooSmall {
            path: hash.to_path_buf(),
            have,
            need: g.hash_device_size,
        });
    }
    let mut tree = vec![0u8; g.tree_size() as usize];
    hash_file
        .read_exact_at(&mut tree, g.tree_offset())
        .map_err(io(hash, "reading hash tree"))?;
    let verifier = Verifier::new(&params, tree, root_hash)?;
    verify_data(&verifier, &data_file, data)?;
    Ok(params)
}

/// Bytes read per step of [`verify_data`]: a multiple of every data block size.
const VERIFY_CHUNK: usize = 16 << 20;

/// Checks every data block of `file` against `verifier`, read with `pread` (not mapped: a file
/// that shrinks underneath a map kills the process with SIGBUS; here it is a clean error). The
/// next chunk is read while the current one is hashed.
fn verify_data(verifier: &Verifier, file: &File, path: &Path) -> Result<(), VerityError> {
    let dbs = verifier.params().data_block_size as u64;
    let blocks = verifier.params().data_blocks;
    let per = (VERIFY_CHUNK as u64 / dbs).max(1);
    let read = |first: u64, buf: &mut Vec<u8>| -> Result<(), VerityError> {
        let n = per.min(blocks - first);
        buf.resize((n * dbs) as usize, 0);
        read_full_at(file, buf, first * dbs).map_err(|e| match e {
            ReadAt::Short(got) => VerityError::DataShrank {
                path: path.to_path_buf(),
                at: first * dbs + got,
                need: blocks * dbs,
            },
            ReadAt::Io(e) => io(path, "reading data device")(e),
        })
    };
    let (mut cur, mut next) = (Vec::new(), Vec::new());
    if blocks > 0 {
        read(0, &mut cur)?;
    }
    let mut first = 0u64;
    while first < blocks {
        let after = first + cur.len() as u64 / dbs;
        let (checked, fetched) = rayon::join(
            || verifier.verify_blocks(first, &cur),
            || (after < blocks).then(|| read(after, &mut next)),
        );
        checked?;
        fetched.transpose()?;
        std::mem::swap(&mut cur, &mut next);
        first = after;
    }
    Ok(())
}

enum ReadAt {
    /// The file ended after this many bytes.
    Short(u64),
    Io(std::io::Error),
}

fn read_full_at(file: &File, buf: &mut [u8], offset: u64) -> Result<(), ReadAt> {
    let mut got = 0usize;
    while got < buf.len() {
        match file.read_at(&mut buf[got..], offset + got as u64) {
            Ok(0) => return Err(ReadAt::Short(got as u64)),
            Ok(n) => got += n,
            Err(e) if e.kind() == std::io::ErrorKind::Interrupted => {}
            Err(e) => return Err(ReadAt::Io(e)),
        }
    }
    Ok(())
}
