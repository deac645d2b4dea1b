//! Reading files out of a layer's ext4 image through the `ext4-view` reader, with every 4 KiB
//! block it touches checked against the layer's signed hash tree first: either from the layer as
//! written on the target (the ESP's boot files) or straight from its compressed blob, one zstd
//! frame at a time (the base's boot files and `/etc/passwd`, before anything is written). Nothing
//! read here has not passed dm-verity's check.
//!
//! A blob read frame by frame comes from a [`FrameSource`], which may have several sources in
//! turn (a registry's mirrors, then the origin). When a fetched frame does not decode, or a
//! block decoded from it fails the tree, the source that served it is refused
//! ([`FrameSource::refuse`]) and the frame fetched again from the next; only when no source is
//! left does the read fail, naming each source tried and why.

use std::fs::File;
use std::ops::Range;
use std::os::unix::fs::FileExt;
use std::sync::Arc;

use ext4_view::{Ext4, Ext4Error, Ext4Read};
use ingot_verity::Verifier;

/// Why a frame could not be fetched (the source's own error: a registry's, a file's).
pub type FetchError = Box<dyn std::error::Error + Send + Sync + 'static>;

/// A source refused for bytes it served that failed the layer's check.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Refused {
    /// The source refused, as messages name it.
    pub source: String,
    /// The source the frame is fetched from next; `None` when none is left.
    pub next: Option<String>,
}

/// A layer blob's compressed zstd frames, fetched one at a time (with a registry's `Range`
/// requests at the offsets of the descriptor's frame index, or read from a file).
pub trait FrameSource {
    /// How many frames the blob has.
    fn count(&self) -> usize;

    /// Compressed frame `n`, from the first source left that serves it.
    fn fetch(&mut self, n: usize) -> Result<Vec<u8>, FetchError>;

    /// The bytes the latest [`FrameSource::fetch`] of frame `n` returned fail the layer's check
    /// (`why`): refuses the source that served them, for the whole blob, and warns naming it.
    /// `None` when there is nothing to fall back to (one source, a file): the read then fails
    /// with `why`.
    fn refuse(&mut self, n: usize, why: &BlockError) -> Result<Option<Refused>, FetchError>;
}

/// Why a block of the layer image could not be read, or was refused.
#[derive(Debug, thiserror::Error)]
pub enum BlockError {
    #[error("reading block {block} of the layer on the target")]
    Partition {
        block: u64,
        #[source]
        source: std::io::Error,
    },
    #[error("block {block} lies past the last zstd frame")]
    PastFrames { block: u64 },
    #[error("read past the end of the layer image (byte {byte})")]
    PastEnd { byte: u64 },
    #[error("fetching zstd frame {frame}")]
    Fetch {
        frame: usize,
        #[source]
        source: FetchError,
    },
    #[error("zstd frame {frame} does not decode")]
    Decode {
        frame: usize,
        #[source]
        source: std::io::Error,
    },
    #[error("zstd frame {frame} is too short for block {block}")]
    Short { frame: usize, block: u64 },
    #[error("block {block} against the layer's signed hash tree")]
    Verify {
        block: u64,
        #[source]
        source: ingot_verity::VerifyError,
    },
    #[error("refusing the source of zstd frame {frame}")]
    Refuse {
        frame: usize,
        #[source]
        source: FetchError,
    },
    #[error(
        "zstd frame {frame}: every source sent bytes that fail the layer's check: {}",
        tried_text(tried)
    )]
    AllSources {
        frame: usize,
        /// Each source refused, and why, in order.
        tried: Vec<(String, BlockError)>,
    },
}

impl BlockError {
    /// Whether the blob's bytes themselves failed (a frame that does not decode or is short, a
    /// block against the signed tree; from every source, when several), not reading them.
    pub fn is_bad_bytes(&self) -> bool {
        matches!(
            self,
            BlockError::Decode { .. }
                | BlockError::Short { .. }
                | BlockError::Verify { .. }
                | BlockError::AllSources { .. }
        )
    }
}

fn tried_text(tried: &[(String, BlockError)]) -> String {
    tried
        .iter()
        .map(|(s, e)| format!("{s} ({})", crate::error_chain::text(e)))
        .collect::<Vec<_>>()
        .join("; ")
}

/// Where a layer blob's compressed frames come from.
enum Frames {
    /// The whole blob, mapped; the byte range of each frame.
    Mapped {
        map: Arc<memmap2::Mmap>,
        frames: Vec<Range<usize>>,
    },
    /// One frame at a time.
    Fetched(Box<dyn FrameSource>),
}

impl Frames {
    fn count(&self) -> usize {
        match self {
            Frames::Mapped { frames, .. } => frames.len(),
            Frames::Fetched(source) => source.count(),
        }
    }

    /// Frame `n`, decompressed (at most `frame_size` bytes).
    fn decode(&mut self, n: usize, frame_size: u64) -> Result<Vec<u8>, BlockError> {
        let fetched;
        let compressed: &[u8] = match self {
            Frames::Mapped { map, frames } => &map[frames[n].clone()],
            Frames::Fetched(source) => {
                fetched = source
                    .fetch(n)
                    .map_err(|source| BlockError::Fetch { frame: n, source })?;
                &fetched
            }
        };
        let mut frame = vec![0; frame_size as usize];
        let got = zstd::bulk::Decompressor::new()
            .and_then(|mut d| d.decompress_to_buffer(compressed, &mut frame))
            .map_err(|source| BlockError::Decode { frame: n, source })?;
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
    fn read_block(&mut self, index: u64, bs: u64, out: &mut [u8]) -> Result<(), BlockError> {
        match self {
            Backing::Partition { file, offset } => file
                .read_exact_at(out, *offset + index * bs)
                .map_err(|source| BlockError::Partition {
                    block: index,
                    source,
                }),
            Backing::Blob {
                frames,
                frame_size,
                cache,
            } => {
                let at = index * bs;
                let n = (at / *frame_size) as usize;
                if n >= frames.count() {
                    return Err(BlockError::PastFrames { block: index });
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
                    .ok_or(BlockError::Short {
                        frame: n,
                        block: index,
                    })?;
                out.copy_from_slice(src);
                Ok(())
            }
        }
    }

    /// Refuses the source of the fetched frame that block `index` came from, its bytes having
    /// failed (`why`), and forgets the frame. `None`: nothing to refuse (a partition, a mapped
    /// blob, a failure that is not the bytes', a frame source with one source).
    fn refuse(
        &mut self,
        index: u64,
        bs: u64,
        why: &BlockError,
    ) -> Result<Option<(usize, Refused)>, BlockError> {
        let Backing::Blob {
            frames: Frames::Fetched(source),
            frame_size,
            cache,
        } = self
        else {
            return Ok(None);
        };
        if !matches!(
            why,
            BlockError::Decode { .. } | BlockError::Short { .. } | BlockError::Verify { .. }
        ) {
            return Ok(None);
        }
        let n = (index * bs / *frame_size) as usize;
        cache.retain(|(i, _)| *i != n);
        let refused = source
            .refuse(n, why)
            .map_err(|source| BlockError::Refuse { frame: n, source })?;
        Ok(refused.map(|r| (n, r)))
    }
}

/// An `Ext4Read` that verifies each block before handing any of it out.
struct Verified {
    backing: Backing,
    verifier: Arc<Verifier>,
    block: Vec<u8>,
    cached: Option<u64>,
}

impl Verified {
    /// Block `index` into `self.block`, checked against the tree. Bytes of a fetched frame that
    /// fail are refused and the frame fetched again from the next source, until one serves
    /// good bytes or none is left (see the module docs).
    fn load_block(&mut self, index: u64) -> Result<(), BlockError> {
        let bs = self.verifier.params().data_block_size as u64;
        let mut tried: Vec<(String, BlockError)> = Vec::new();
        loop {
            let err = match self
                .backing
                .read_block(index, bs, &mut self.block)
                .and_then(|()| {
                    self.verifier
                        .verify_block(index, &self.block)
                        .map_err(|source| BlockError::Verify {
                            block: index,
                            source,
                        })
                }) {
                Ok(()) => return Ok(()),
                Err(e) => e,
            };
            let Some((frame, refused)) = self.backing.refuse(index, bs, &err)? else {
                return Err(err);
            };
            tried.push((refused.source, err));
            if refused.next.is_none() {
                return Err(if tried.len() == 1 {
                    tried.pop().expect("one").1 // one source: its own error, as it was
                } else {
                    BlockError::AllSources { frame, tried }
                });
            }
        }
    }
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
                return Err(BlockError::PastEnd { byte: pos }.into());
            }
            if self.cached != Some(index) {
                self.cached = None;
                self.load_block(index)?;
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
    #[error("reading layer `{layer}`'s file system")]
    Load {
        layer: String,
        #[source]
        source: ReadError,
    },
    #[error("layer `{layer}` has no readable {path}")]
    Missing {
        layer: String,
        path: String,
        #[source]
        source: ReadError,
    },
}

impl LayerFsError {
    /// The block a read could not have, when that is what failed (not the file system's shape:
    /// a path not found, not a regular file).
    pub fn block(&self) -> Option<&BlockError> {
        match self {
            LayerFsError::Load {
                source: ReadError::Block(b),
                ..
            }
            | LayerFsError::Missing {
                source: ReadError::Block(b),
                ..
            } => Some(b),
            _ => None,
        }
    }
}

/// What failed below a [`LayerFsError`].
#[derive(Debug, thiserror::Error)]
pub enum ReadError {
    /// A block could not be read or failed the tree (every source's bytes, if several).
    #[error(transparent)]
    Block(#[from] BlockError),
    /// The file system as `ext4-view` reads it (not found, corrupt, not a directory, ...).
    #[error("{0}")]
    Ext4(Ext4Error),
    /// A read's own error that is not a [`BlockError`] (none is made here).
    #[error("reading the image")]
    Io(#[source] Box<dyn std::error::Error + Send + Sync + 'static>),
    #[error("not a regular file")]
    NotRegular,
    #[error("a name that is not UTF-8")]
    NotUtf8,
    #[error("frame size 0")]
    FrameSizeZero,
    #[error(transparent)]
    Frames(#[from] crate::compress::FrameError),
}

impl From<Ext4Error> for ReadError {
    /// A read's error comes back out of `ext4-view` as itself, not as its text.
    fn from(e: Ext4Error) -> Self {
        match e {
            Ext4Error::Io(inner) => match inner.downcast::<BlockError>() {
                Ok(b) => ReadError::Block(*b),
                Err(other) => ReadError::Io(other),
            },
            e => ReadError::Ext4(e),
        }
    }
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
            source: e.into(),
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
                source: e.into(),
            })?
            .iter()
            .map(|f| {
                let start = f.as_ptr() as usize - base;
                start..start + f.len()
            })
            .collect();
        Self::in_frames(layer, Frames::Mapped { map, frames }, frame_size, verifier)
    }

    /// The layer in a blob read one frame at a time from `frames`. Only the frames holding the
    /// blocks a read touches are fetched; bytes that fail are refused and fetched again from
    /// the next source (see the module docs).
    pub fn fetched(
        layer: &str,
        frames: Box<dyn FrameSource>,
        frame_size: u64,
        verifier: Arc<Verifier>,
    ) -> Result<Self, LayerFsError> {
        Self::in_frames(layer, Frames::Fetched(frames), frame_size, verifier)
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
                source: ReadError::FrameSizeZero,
            });
        }
        let backing = Backing::Blob {
            frames,
            frame_size,
            cache: Vec::new(),
        };
        Self::open(layer, backing, verifier)
    }

    /// `path` of this layer could not be read, and why.
    fn missing(&self, path: &str, source: impl Into<ReadError>) -> LayerFsError {
        LayerFsError::Missing {
            layer: self.layer.clone(),
            path: path.to_string(),
            source: source.into(),
        }
    }

    /// Every inode below `/` (not `/` itself, not `lost+found`), sorted by path.
    pub fn walk(&self) -> Result<Vec<Node>, LayerFsError> {
        let mut out = Vec::new();
        let mut dirs = vec!["/".to_string()];
        while let Some(dir) = dirs.pop() {
            let entries = self
                .fs
                .read_dir(dir.as_str())
                .map_err(|e| self.missing(&dir, e))?;
            for entry in entries {
                let entry = entry.map_err(|e| self.missing(&dir, e))?;
                let name = entry.file_name();
                let name = name
                    .as_str()
                    .map_err(|_| self.missing(&dir, ReadError::NotUtf8))?;
                if name == "." || name == ".." || (dir == "/" && name == "lost+found") {
                    continue;
                }
                let path = format!("{}/{name}", dir.trim_end_matches('/'));
                let meta = entry.metadata().map_err(|e| self.missing(&path, e))?;
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
            .map_err(|e| self.missing(path, e))
    }

    /// A regular file's size (symlinks followed, as [`LayerFs::read`] follows them), read from
    /// its inode alone.
    pub fn file_size(&self, path: &str) -> Result<u64, LayerFsError> {
        let meta = self.fs.metadata(path).map_err(|e| self.missing(path, e))?;
        if !meta.file_type().is_regular_file() {
            return Err(self.missing(path, ReadError::NotRegular));
        }
        Ok(meta.len())
    }

    /// The SHA-256 of a file's bytes, read 1 MiB at a time: memory stays flat whatever the
    /// file's size (a sparse file of gigabytes is hashed, not held).
    pub fn sha256(&self, path: &str) -> Result<[u8; 32], LayerFsError> {
        use sha2::{Digest, Sha256};
        let mut file = self.fs.open(path).map_err(|e| self.missing(path, e))?;
        let mut hasher = Sha256::new();
        let mut buf = vec![0u8; 1 << 20];
        loop {
            let n = file
                .read_bytes(&mut buf)
                .map_err(|e| self.missing(path, e))?;
            if n == 0 {
                return Ok(hasher.finalize().into());
            }
            hasher.update(&buf[..n]);
        }
    }

    /// A whole file's bytes.
    pub fn read(&self, path: &str) -> Result<Vec<u8>, LayerFsError> {
        self.fs.read(path).map_err(|e| self.missing(path, e))
    }
}

#[cfg(test)]
mod tests {
    use std::cell::RefCell;
    use std::collections::HashMap;
    use std::rc::Rc;

    use super::*;

    /// Image bytes per zstd frame (what `many_frames` in the fleet test uses).
    const FRAME: usize = 16 << 10;

    /// A layer as `ingot build` makes one (a real ext4 image and its verity tree), its image cut
    /// into 16 KiB zstd frames, and the bytes of its `/boot/vmlinuz`.
    struct Layer {
        frames: Vec<Vec<u8>>,
        verifier: Arc<Verifier>,
        kernel: Vec<u8>,
    }

    fn layer() -> Layer {
        let dir = tempfile::tempdir().unwrap();
        let tree = dir.path().join("tree");
        std::fs::create_dir_all(tree.join("boot")).unwrap();
        let kernel = ingot_testkit::noise::noise(1, 96 << 10);
        std::fs::write(tree.join("boot/vmlinuz"), &kernel).unwrap();
        let (img, hash) = (dir.path().join("layer.img"), dir.path().join("layer.hash"));
        let opts = ingot_layers::Ext4Options {
            seed: b"layerfs frames".to_vec(),
            source_date_epoch: 1_700_000_000,
            ..Default::default()
        };
        let built =
            ingot_layers::build_layer(&ingot_layers::Source::Dir(tree), &img, Some(&hash), &opts)
                .unwrap();
        let v = built.verity.unwrap();
        let params = v.params().unwrap();
        let verifier =
            Verifier::from_hash_device(&params, &std::fs::read(&hash).unwrap(), &v.root_hash)
                .unwrap();
        let frames = std::fs::read(&img)
            .unwrap()
            .chunks(FRAME)
            .map(|c| zstd::bulk::compress(c, 3).unwrap())
            .collect();
        Layer {
            frames,
            verifier: Arc::new(verifier),
            kernel,
        }
    }

    /// How a source spoils every frame it serves.
    #[derive(Clone, Copy, Debug)]
    enum Spoil {
        Not,
        /// Half the frame: it does not decode.
        Cut,
        /// A good zstd frame of other bytes: it decodes, and its blocks fail the tree.
        Other,
        /// One byte flipped in its middle.
        Flip,
    }

    /// What the sources did: each fetch (source, frame) and each refusal, in order.
    #[derive(Default)]
    struct Log {
        fetched: Vec<(&'static str, usize)>,
        refused: Vec<&'static str>,
    }

    /// The layer's frames from named sources in turn, as a registry's mirrors and origin.
    struct Sources {
        frames: Vec<Vec<u8>>,
        sources: Vec<(&'static str, Spoil)>,
        served: HashMap<usize, &'static str>,
        log: Rc<RefCell<Log>>,
    }

    impl Sources {
        fn left(&self) -> Option<(&'static str, Spoil)> {
            let log = self.log.borrow();
            self.sources
                .iter()
                .find(|(name, _)| !log.refused.contains(name))
                .copied()
        }
    }

    impl FrameSource for Sources {
        fn count(&self) -> usize {
            self.frames.len()
        }

        fn fetch(&mut self, n: usize) -> Result<Vec<u8>, FetchError> {
            let (name, spoil) = self.left().ok_or("no source left")?;
            let mut bytes = self.frames[n].clone();
            match spoil {
                Spoil::Not => {}
                Spoil::Cut => bytes.truncate(bytes.len() / 2),
                Spoil::Other => bytes = zstd::bulk::compress(&[0x5a; FRAME], 3).unwrap(),
                Spoil::Flip => {
                    let m = bytes.len() / 2;
                    bytes[m] ^= 0x01;
                }
            }
            self.served.insert(n, name);
            self.log.borrow_mut().fetched.push((name, n));
            Ok(bytes)
        }

        fn refuse(&mut self, n: usize, _: &BlockError) -> Result<Option<Refused>, FetchError> {
            let name = self.served.remove(&n).expect("fetched before");
            self.log.borrow_mut().refused.push(name);
            Ok(Some(Refused {
                source: name.to_owned(),
                next: self.left().map(|(s, _)| s.to_owned()),
            }))
        }
    }

    fn open(
        layer: &Layer,
        sources: &[(&'static str, Spoil)],
    ) -> (Result<LayerFs, LayerFsError>, Rc<RefCell<Log>>) {
        let log = Rc::new(RefCell::new(Log::default()));
        let frames = Sources {
            frames: layer.frames.clone(),
            sources: sources.to_vec(),
            served: HashMap::new(),
            log: Rc::clone(&log),
        };
        let fs = LayerFs::fetched(
            "base",
            Box::new(frames),
            FRAME as u64,
            Arc::clone(&layer.verifier),
        );
        (fs, log)
    }

    #[test]
    fn a_source_whose_frames_fail_is_refused_and_the_next_serves_them() {
        let layer = layer();
        assert!(layer.frames.len() > 4, "{} frames", layer.frames.len());
        for spoil in [Spoil::Cut, Spoil::Other, Spoil::Flip] {
            let (fs, log) = open(&layer, &[("mirror a", spoil), ("origin b", Spoil::Not)]);
            let fs = fs.unwrap_or_else(|e| panic!("{spoil:?}: {}", crate::error_chain::text(&e)));
            assert_eq!(fs.read("/boot/vmlinuz").unwrap(), layer.kernel, "{spoil:?}");
            let log = log.borrow();
            assert_eq!(log.refused, ["mirror a"], "{spoil:?}: refused once");
            // Once refused, the mirror is not asked again.
            let first = log
                .fetched
                .iter()
                .position(|(s, _)| *s == "origin b")
                .expect("the origin served");
            assert!(
                log.fetched[first..].iter().all(|(s, _)| *s == "origin b"),
                "{spoil:?}: {:?}",
                log.fetched
            );
            // A frame that cannot decode, or whose first block fails, is refused at once: the
            // first frame read (the superblock's) is fetched again from the origin. (A flipped
            // byte may spoil a later block of the frame only, found later.)
            if !matches!(spoil, Spoil::Flip) {
                assert_eq!(
                    log.fetched[..2],
                    [("mirror a", 0), ("origin b", 0)],
                    "{spoil:?}"
                );
            }
        }
    }

    #[test]
    fn when_every_source_fails_the_read_names_each() {
        let layer = layer();
        let (fs, log) = open(
            &layer,
            &[("mirror a", Spoil::Other), ("origin b", Spoil::Cut)],
        );
        let e = fs.err().expect("no source serves good bytes");
        assert!(
            matches!(
                &e,
                LayerFsError::Load {
                    source: ReadError::Block(BlockError::AllSources { frame: 0, tried }),
                    ..
                } if tried.len() == 2
            ),
            "{e:?}"
        );
        let text = crate::error_chain::text(&e);
        assert!(
            text.contains("every source sent bytes that fail the layer's check")
                && text.contains("mirror a (block 0 against the layer's signed hash tree: ")
                && text.contains("origin b (zstd frame 0 does not decode: "),
            "{text}"
        );
        assert_eq!(log.borrow().refused, ["mirror a", "origin b"]);
    }

    #[test]
    fn with_one_source_its_own_error_stands() {
        let layer = layer();
        let (fs, log) = open(&layer, &[("origin b", Spoil::Other)]);
        let e = fs.err().expect("bad bytes");
        assert!(
            matches!(
                &e,
                LayerFsError::Load {
                    source: ReadError::Block(BlockError::Verify { block: 0, .. }),
                    ..
                }
            ),
            "{e:?}"
        );
        assert_eq!(log.borrow().fetched, [("origin b", 0)]);
    }
}
