//! Reading files out of a layer's ext4 image through the `ext4-view` reader, with every 4 KiB
//! block it touches checked against the layer's signed hash tree first: either from the layer as
//! written on the target (the ESP's boot files) or straight from its compressed blob, one zstd
//! frame at a time (the base's `/etc/passwd` for staging, before anything is written). Nothing
//! read here has not passed dm-verity's check.

use std::fs::File;
use std::ops::Range;
use std::os::unix::fs::FileExt;
use std::sync::Arc;

use ext4_view::{Ext4, Ext4Read};
use ingot_verity::Verifier;

/// Fetches compressed zstd frame `n` of a layer's blob (with a registry's `Range` request).
pub type FetchFrame = Box<dyn FnMut(usize) -> Result<Vec<u8>, String>>;

/// Where a layer blob's compressed frames come from.
enum Frames {
    /// The whole blob, mapped; the byte range of each frame.
    Mapped {
        map: Arc<memmap2::Mmap>,
        frames: Vec<Range<usize>>,
    },
    /// One frame at a time, from the frame index's offsets.
    Fetched { count: usize, fetch: FetchFrame },
}

impl Frames {
    fn count(&self) -> usize {
        match self {
            Frames::Mapped { frames, .. } => frames.len(),
            Frames::Fetched { count, .. } => *count,
        }
    }

    /// Frame `n`, decompressed (at most `frame_size` bytes).
    fn decode(&mut self, n: usize, frame_size: u64) -> Result<Vec<u8>, String> {
        let fetched;
        let compressed: &[u8] = match self {
            Frames::Mapped { map, frames } => &map[frames[n].clone()],
            Frames::Fetched { fetch, .. } => {
                fetched = fetch(n).map_err(|e| format!("zstd frame {n}: {e}"))?;
                &fetched
            }
        };
        let mut frame = vec![0; frame_size as usize];
        let got = zstd::bulk::Decompressor::new()
            .and_then(|mut d| d.decompress_to_buffer(compressed, &mut frame))
            .map_err(|e| format!("zstd frame {n}: {e}"))?;
        frame.truncate(got);
        Ok(frame)
    }
}

/// Decompressed frames kept: reading a file goes back and forth between the inode tables
/// and the data, and a fetched frame costs a request.
const FRAME_CACHE: usize = 4;

/// Where the image's bytes come from.
enum Backing {
    /// A data partition on the target.
    Partition { file: File, offset: u64 },
    /// The layer's blob: independent zstd frames of `frame_size` image bytes each.
    Blob {
        frames: Frames,
        frame_size: u64,
        /// Recently decompressed frames and their indexes, the latest last.
        cache: Vec<(usize, Vec<u8>)>,
    },
}

impl Backing {
    fn read_block(&mut self, index: u64, bs: u64, out: &mut [u8]) -> Result<(), String> {
        match self {
            Backing::Partition { file, offset } => file
                .read_exact_at(out, *offset + index * bs)
                .map_err(|e| e.to_string()),
            Backing::Blob {
                frames,
                frame_size,
                cache,
            } => {
                let at = index * bs;
                let n = (at / *frame_size) as usize;
                if n >= frames.count() {
                    return Err(format!("block {index} lies past the last zstd frame"));
                }
                match cache.iter().position(|(i, _)| *i == n) {
                    Some(p) => {
                        let hit = cache.remove(p);
                        cache.push(hit);
                    }
                    None => {
                        let frame = frames.decode(n, *frame_size)?;
                        if cache.len() == FRAME_CACHE {
                            cache.remove(0);
                        }
                        cache.push((n, frame));
                    }
                }
                let frame = &cache.last().expect("just pushed").1;
                let within = (at % *frame_size) as usize;
                let src = frame
                    .get(within..within + out.len())
                    .ok_or_else(|| format!("zstd frame {n} is too short for block {index}"))?;
                out.copy_from_slice(src);
                Ok(())
            }
        }
    }
}

/// An `Ext4Read` that verifies each block before handing any of it out.
struct Verified {
    backing: Backing,
    verifier: Arc<Verifier>,
    block: Vec<u8>,
    cached: Option<u64>,
}

impl Ext4Read for Verified {
    fn read(
        &mut self,
        start: u64,
        dst: &mut [u8],
    ) -> Result<(), Box<dyn std::error::Error + Send + Sync + 'static>> {
        let bs = self.verifier.params().data_block_size as u64;
        let blocks = self.verifier.params().data_blocks;
        let mut done = 0usize;
        while done < dst.len() {
            let pos = start + done as u64;
            let index = pos / bs;
            if index >= blocks {
                return Err(format!("read past the end of the layer image (byte {pos})").into());
            }
            if self.cached != Some(index) {
                self.cached = None;
                self.backing.read_block(index, bs, &mut self.block)?;
                self.verifier.verify_block(index, &self.block)?;
                self.cached = Some(index);
            }
            let within = (pos % bs) as usize;
            let n = (bs as usize - within).min(dst.len() - done);
            dst[done..done + n].copy_from_slice(&self.block[within..within + n]);
            done += n;
        }
        Ok(())
    }
}

#[derive(Debug, thiserror::Error)]
pub enum LayerFsError {
    #[error("reading layer `{layer}`'s file system: {reason}")]
    Load { layer: String, reason: String },
    #[error("layer `{layer}` has no readable {path}: {reason}")]
    Missing {
        layer: String,
        path: String,
        reason: String,
    },
}

/// One inode in a layer's tree, as `ingot diff` compares it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Node {
    /// Absolute path, `/` first.
    pub path: String,
    /// `file`, `dir`, `symlink`, `char`, `block`, `fifo` or `socket`.
    pub kind: &'static str,
    /// Size in bytes (a symlink: its target's length).
    pub size: u64,
    /// Permission bits, setuid/setgid/sticky included (no type bits).
    pub mode: u16,
    /// Owner.
    pub uid: u32,
    /// Group.
    pub gid: u32,
}

fn kind_name(t: ext4_view::FileType) -> &'static str {
    if t.is_regular_file() {
        "file"
    } else if t.is_dir() {
        "dir"
    } else if t.is_symlink() {
        "symlink"
    } else if t.is_char_dev() {
        "char"
    } else if t.is_block_dev() {
        "block"
    } else if t.is_fifo() {
        "fifo"
    } else {
        "socket"
    }
}

/// A layer's file system, every block verified.
pub struct LayerFs {
    layer: String,
    fs: Ext4,
}

impl LayerFs {
    fn open(layer: &str, backing: Backing, verifier: Arc<Verifier>) -> Result<Self, LayerFsError> {
        let bs = verifier.params().data_block_size as usize;
        let reader = Verified {
            backing,
            verifier,
            block: vec![0; bs],
            cached: None,
        };
        let fs = Ext4::load(Box::new(reader)).map_err(|e| LayerFsError::Load {
            layer: layer.to_string(),
            reason: e.to_string(),
        })?;
        Ok(LayerFs {
            layer: layer.to_string(),
            fs,
        })
    }

    /// The layer as written at `offset` of `file` (the target).
    pub fn on_target(
        layer: &str,
        file: File,
        offset: u64,
        verifier: Arc<Verifier>,
    ) -> Result<Self, LayerFsError> {
        Self::open(layer, Backing::Partition { file, offset }, verifier)
    }

    /// The layer in its compressed blob (zstd frames of `frame_size` image bytes).
    pub fn in_blob(
        layer: &str,
        map: Arc<memmap2::Mmap>,
        frame_size: u64,
        verifier: Arc<Verifier>,
    ) -> Result<Self, LayerFsError> {
        let base = map.as_ptr() as usize;
        let frames = crate::compress::split_frames(&map)
            .map_err(|e| LayerFsError::Load {
                layer: layer.to_string(),
                reason: e.to_string(),
            })?
            .iter()
            .map(|f| {
                let start = f.as_ptr() as usize - base;
                start..start + f.len()
            })
            .collect();
        Self::in_frames(layer, Frames::Mapped { map, frames }, frame_size, verifier)
    }

    /// The layer in a blob read one frame at a time: `fetch(n)` returns compressed frame `n`
    /// of `count` (found with the descriptor's frame index). Only the frames holding the
    /// blocks a read touches are fetched.
    pub fn fetched(
        layer: &str,
        count: usize,
        fetch: FetchFrame,
        frame_size: u64,
        verifier: Arc<Verifier>,
    ) -> Result<Self, LayerFsError> {
        Self::in_frames(
            layer,
            Frames::Fetched { count, fetch },
            frame_size,
            verifier,
        )
    }

    fn in_frames(
        layer: &str,
        frames: Frames,
        frame_size: u64,
        verifier: Arc<Verifier>,
    ) -> Result<Self, LayerFsError> {
        if frame_size == 0 {
            return Err(LayerFsError::Load {
                layer: layer.to_string(),
                reason: "frame size 0".into(),
            });
        }
        let backing = Backing::Blob {
            frames,
            frame_size,
            cache: Vec::new(),
        };
        Self::open(layer, backing, verifier)
    }

    /// Every inode below `/` (not `/` itself, not `lost+found`), sorted by path.
    pub fn walk(&self) -> Result<Vec<Node>, LayerFsError> {
        let load = |reason: String| LayerFsError::Load {
            layer: self.layer.clone(),
            reason,
        };
        let mut out = Vec::new();
        let mut dirs = vec!["/".to_string()];
        while let Some(dir) = dirs.pop() {
            let entries = self
                .fs
                .read_dir(dir.as_str())
                .map_err(|e| load(format!("{dir}: {e}")))?;
            for entry in entries {
                let entry = entry.map_err(|e| load(format!("{dir}: {e}")))?;
                let name = entry.file_name();
                let name = name
                    .as_str()
                    .map_err(|_| load(format!("{dir}: a name that is not UTF-8")))?;
                if name == "." || name == ".." || (dir == "/" && name == "lost+found") {
                    continue;
                }
                let path = format!("{}/{name}", dir.trim_end_matches('/'));
                let meta = entry.metadata().map_err(|e| load(format!("{path}: {e}")))?;
                let kind = kind_name(meta.file_type());
                if kind == "dir" {
                    dirs.push(path.clone());
                }
                out.push(Node {
                    path,
                    kind,
                    size: meta.len(),
                    mode: meta.mode(),
                    uid: meta.uid(),
                    gid: meta.gid(),
                });
            }
        }
        out.sort_by(|a, b| a.path.cmp(&b.path));
        Ok(out)
    }

    /// A symlink's target.
    pub fn read_link(&self, path: &str) -> Result<String, LayerFsError> {
        self.fs
            .read_link(path)
            .map(|t| t.display().to_string())
            .map_err(|e| LayerFsError::Missing {
                layer: self.layer.clone(),
                path: path.to_string(),
                reason: e.to_string(),
            })
    }

    /// A regular file's size (symlinks followed, as [`LayerFs::read`] follows them), read from
    /// its inode alone.
    pub fn file_size(&self, path: &str) -> Result<u64, LayerFsError> {
        let missing = |reason: String| LayerFsError::Missing {
            layer: self.layer.clone(),
            path: path.to_string(),
            reason,
        };
        let meta = self.fs.metadata(path).map_err(|e| missing(e.to_string()))?;
        if !meta.file_type().is_regular_file() {
            return Err(missing("not a regular file".into()));
        }
        Ok(meta.len())
    }

    /// The SHA-256 of a file's bytes, read 1 MiB at a time: memory stays flat whatever the
    /// file's size (a sparse file of gigabytes is hashed, not held).
    pub fn sha256(&self, path: &str) -> Result<[u8; 32], LayerFsError> {
        use sha2::{Digest, Sha256};
        let missing = |e: ext4_view::Ext4Error| LayerFsError::Missing {
            layer: self.layer.clone(),
            path: path.to_string(),
            reason: e.to_string(),
        };
        let mut file = self.fs.open(path).map_err(missing)?;
        let mut hasher = Sha256::new();
        let mut buf = vec![0u8; 1 << 20];
        loop {
            let n = file.read_bytes(&mut buf).map_err(missing)?;
            if n == 0 {
                return Ok(hasher.finalize().into());
            }
            hasher.update(&buf[..n]);
        }
    }

    /// A whole file's bytes.
    pub fn read(&self, path: &str) -> Result<Vec<u8>, LayerFsError> {
        self.fs.read(path).map_err(|e| LayerFsError::Missing {
            layer: self.layer.clone(),
            path: path.to_string(),
            reason: e.to_string(),
        })
    }
}
