//! Plans an image: inode numbers, block placement, and every metadata block's bytes.
//!
//! Layout, front to back: superblock and group descriptors; all block bitmaps, all inode
//! bitmaps and all inode tables (flex_bg lets them sit together at the start); then, in inode
//! order (= sorted path order), each inode's xattr block (when it starts a new one), its
//! directory blocks, file data or symlink block, and its extent tree blocks. Backup superblocks
//! (groups 0, 1 and powers of 3, 5, 7) are skipped over. Every block below the allocator's end
//! is in use; every block above it is free.

use std::collections::HashMap;

use super::dir::{self, Entry};
use super::extent::{self, Extent, MAX_EXTENT_LEN};
use super::group::{self, GroupDesc};
use super::inode::{self, InodeFields};
use super::superblock::{self, SuperblockFields, BLOCKS_PER_GROUP, FIRST_INO, INODE_SIZE};
use super::xattr::{self, Attr};
use super::{csum, Ext4Options, BLOCK_SIZE};
use crate::error::{show, LayerError};
use crate::tree::{DataSource, NodeId, NodeKind, Tree, ROOT};

const B: u64 = BLOCK_SIZE as u64;
const ROOT_INO: u32 = 2;
/// The kernel's limit on inodes sharing one xattr block (`EXT4_XATTR_REFCOUNT_MAX`).
const XATTR_REFCOUNT_MAX: u32 = 1024;
/// ext4's link count ceiling for non-directories (`EXT4_LINK_MAX`).
const LINK_MAX: u32 = 65000;
/// Bytes for in-inode attributes: inode size - 128 - i_extra_isize.
const INLINE_XATTR_SPACE: usize = INODE_SIZE as usize - 128 - superblock::EXTRA_ISIZE as usize;

/// One piece of the image, at a block.
pub(super) enum Segment<'t> {
    Meta {
        block: u64,
        bytes: Vec<u8>,
    },
    Data {
        block: u64,
        ino: u32,
        source: &'t DataSource,
        offset: u64,
        len: u64,
    },
}

impl Segment<'_> {
    fn block(&self) -> u64 {
        match self {
            Segment::Meta { block, .. } | Segment::Data { block, .. } => *block,
        }
    }
}

pub(super) struct Plan<'t> {
    pub blocks: u64,
    pub used_blocks: u64,
    pub inodes: u32,
    /// Bytes the segments carry (for progress).
    pub data_bytes: u64,
    pub segments: Vec<Segment<'t>>,
}

/// What one inode needs, before placement.
enum Body<'t> {
    Dir(dir::DirBlocks),
    File {
        size: u64,
        source: &'t DataSource,
        ranges: Vec<(u64, u64)>,
        blocks: u64,
    },
    FastLink(&'t [u8]),
    SlowLink(&'t [u8]),
    CharDev(u32, u32),
    BlockDev(u32, u32),
    Fifo,
    Socket,
}

struct Prep<'t> {
    ino: u32,
    node: NodeId,
    links: u32,
    body: Body<'t>,
    inline: Vec<Attr>,
    /// Index into the deduplicated xattr blocks.
    xblock: Option<usize>,
}

/// Where one inode's blocks went.
#[derive(Default, Clone)]
struct Placed {
    extents: Vec<Extent>,
    tree_blocks: Vec<u64>,
}

/// The bump allocator: hands out blocks in order, stepping over backup superblock areas.
struct Alloc<'a> {
    next: u64,
    reserved: &'a [(u64, u64)],
    ri: usize,
}

impl Alloc<'_> {
    fn skip_reserved(&mut self) {
        while let Some(&(s, e)) = self.reserved.get(self.ri) {
            if self.next >= e {
                self.ri += 1;
            } else if self.next >= s {
                self.next = e;
                self.ri += 1;
            } else {
                break;
            }
        }
    }

    /// `n` blocks as runs (start, len).
    fn take(&mut self, mut n: u64) -> Vec<(u64, u64)> {
        let mut runs = Vec::new();
        while n > 0 {
            self.skip_reserved();
            let limit = self.reserved.get(self.ri).map(|r| r.0).unwrap_or(u64::MAX);
            let k = n.min(limit - self.next);
            match runs.last_mut() {
                Some((s, l)) if *s + *l == self.next => *l += k,
                _ => runs.push((self.next, k)),
            }
            self.next += k;
            n -= k;
        }
        runs
    }

    /// `n` contiguous blocks (for bitmaps and inode tables).
    fn take_contig(&mut self, n: u64) -> u64 {
        loop {
            self.skip_reserved();
            let limit = self.reserved.get(self.ri).map(|r| r.0).unwrap_or(u64::MAX);
            if self.next + n <= limit {
                let s = self.next;
                self.next += n;
                return s;
            }
            self.next = limit;
        }
    }
}

/// Maps logical block ranges onto physical runs as extents of at most 32768 blocks.
fn map_extents(logical: &[(u64, u64)], runs: &[(u64, u64)]) -> Vec<Extent> {
    let mut out = Vec::new();
    let mut ri = 0;
    let mut run_used = 0u64;
    for &(lstart, llen) in logical {
        let mut done = 0u64;
        while done < llen {
            let (rs, rl) = runs[ri];
            let k = (llen - done).min(rl - run_used).min(MAX_EXTENT_LEN);
            out.push(Extent {
                logical: (lstart + done) as u32,
                physical: rs + run_used,
                len: k as u16,
            });
            done += k;
            run_used += k;
            if run_used == rl {
                ri += 1;
                run_used = 0;
            }
        }
    }
    out
}

struct Geometry {
    groups: u64,
    inodes_per_group: u32,
    want_64bit: bool,
    desc_size: usize,
    gdt_blocks: u64,
    reserved: Vec<(u64, u64)>,
}

impl Geometry {
    fn new(groups: u64, max_ino: u32, want_64bit: bool) -> Geometry {
        let ipg = (u64::from(max_ino).div_ceil(groups))
            .next_multiple_of(16)
            .max(16) as u32;
        let desc_size = if want_64bit { 64 } else { 32 };
        let gdt_blocks = (groups * desc_size as u64).div_ceil(B);
        let reserved = (1..groups)
            .filter(|&g| superblock::has_super(g))
            .map(|g| {
                (
                    g * u64::from(BLOCKS_PER_GROUP),
                    g * u64::from(BLOCKS_PER_GROUP) + 1 + gdt_blocks,
                )
            })
            .collect();
        Geometry {
            groups,
            inodes_per_group: ipg,
            want_64bit,
            desc_size,
            gdt_blocks,
            reserved,
        }
    }

    fn itable_blocks(&self) -> u64 {
        u64::from(self.inodes_per_group) * u64::from(INODE_SIZE) / B
    }
}

fn file_type(kind: &NodeKind) -> u8 {
    match kind {
        NodeKind::File(_) => 1,
        NodeKind::Dir(_) => 2,
        NodeKind::CharDev { .. } => 3,
        NodeKind::BlockDev { .. } => 4,
        NodeKind::Fifo => 5,
        NodeKind::Socket => 6,
        NodeKind::Symlink(_) => 7,
    }
}

pub(super) fn plan<'t>(
    tree: &'t Tree,
    opts: &Ext4Options,
    uuid: [u8; 16],
    hash_seed: [u8; 16],
) -> Result<Plan<'t>, LayerError> {
    let fs_seed = csum::fs_seed(&uuid);
    let hseed: [u32; 4] = std::array::from_fn(|i| {
        u32::from_le_bytes(hash_seed[i * 4..i * 4 + 4].try_into().expect("4 bytes"))
    });
    let numbers = number_inodes(tree)?;
    let (preps, xblocks) = prepare(tree, &numbers, fs_seed, &hseed)?;
    let fit = fit_geometry(&preps, xblocks.len(), numbers.max_ino, opts)?;

    let mut segs: Vec<Segment<'t>> = Vec::new();
    let mut tables = Tables::new(&fit.geo);
    let time = opts.source_date_epoch;
    let mut data_bytes = write_inodes(tree, &preps, &fit, time, fs_seed, &mut tables, &mut segs);
    for (i, (attrs, refs)) in xblocks.iter().enumerate() {
        let mut b = xattr::block_contents(attrs, *refs);
        xattr::seal_block(&mut b, fs_seed, fit.xblock_at[i]);
        segs.push(Segment::Meta {
            block: fit.xblock_at[i],
            bytes: b,
        });
    }
    let ids = FsIds {
        uuid,
        hash_seed,
        fs_seed,
        time,
    };
    write_group_metadata(&fit, numbers.max_ino, tables, &ids, &mut segs);

    segs.sort_by_key(|s| s.block());
    data_bytes += segs
        .iter()
        .map(|s| {
            if let Segment::Meta { bytes, .. } = s {
                bytes.len() as u64
            } else {
                0
            }
        })
        .sum::<u64>();
    Ok(Plan {
        blocks: fit.total,
        used_blocks: fit.end,
        inodes: numbers.max_ino,
        data_bytes,
        segments: segs,
    })
}

/// Inode numbers in depth-first, sorted-name order, with link counts and parents.
struct Numbering {
    /// Tree node id → inode number.
    node_ino: Vec<u32>,
    /// Every inode once, in number order, with its first path.
    order: Vec<(NodeId, Vec<u8>)>,
    /// Link counts, indexed like `order`.
    links: Vec<u32>,
    /// Directory inode → its parent's inode.
    parent_of: HashMap<u32, u32>,
    max_ino: u32,
}

/// Identical extended-attribute blocks, shared, each with its reference count.
type XattrBlocks = Vec<(Vec<Attr>, u32)>;

/// The geometry the image settled on and where everything was placed in it.
struct Fit {
    geo: Geometry,
    placed: Vec<Placed>,
    /// Block of each shared attribute block.
    xblock_at: Vec<u64>,
    /// The allocator's end: every block below it is in use.
    end: u64,
    /// The image's size in blocks.
    total: u64,
}

/// What seeds and stamps the file system's metadata.
struct FsIds {
    uuid: [u8; 16],
    hash_seed: [u8; 16],
    fs_seed: u32,
    time: u64,
}

fn number_inodes(tree: &Tree) -> Result<Numbering, LayerError> {
    let mut n = Numbering {
        node_ino: vec![0u32; tree.nodes.len()],
        order: vec![(ROOT, Vec::new())],
        links: vec![2],
        parent_of: HashMap::from([(ROOT_INO, ROOT_INO)]),
        max_ino: 0,
    };
    n.node_ino[ROOT] = ROOT_INO;
    let ino_index = |ino: u32| {
        if ino == ROOT_INO {
            0
        } else {
            (ino - FIRST_INO + 1) as usize
        }
    };
    let mut next_ino = FIRST_INO;
    type It<'a> = std::collections::btree_map::Iter<'a, Vec<u8>, NodeId>;
    let mut stack: Vec<(u32, usize, It<'_>)> = vec![(
        ROOT_INO,
        0,
        tree.children(ROOT).expect("root is a dir").iter(),
    )];
    let mut path: Vec<u8> = Vec::new();
    while let Some((dir_ino, plen, it)) = stack.last_mut() {
        let (dir_ino, plen) = (*dir_ino, *plen);
        let Some((name, &child)) = it.next() else {
            stack.pop();
            continue;
        };
        path.truncate(plen);
        if !path.is_empty() {
            path.push(b'/');
        }
        path.extend_from_slice(name);
        let is_dir = matches!(tree.nodes[child].kind, NodeKind::Dir(_));
        if n.node_ino[child] == 0 {
            n.node_ino[child] = next_ino;
            next_ino = next_ino
                .checked_add(1)
                .ok_or_else(|| LayerError::TooLarge("more than 2^32 inodes".into()))?;
            n.order.push((child, path.clone()));
            n.links.push(if is_dir { 2 } else { 0 });
        } else if is_dir {
            return Err(LayerError::bad(
                &path,
                "directory reached twice (a directory hard link)",
            ));
        }
        let ino = n.node_ino[child];
        if is_dir {
            n.links[ino_index(dir_ino)] += 1;
            n.parent_of.insert(ino, dir_ino);
            let l = path.len();
            stack.push((ino, l, tree.children(child).expect("dir").iter()));
        } else {
            n.links[ino_index(ino)] += 1;
            if n.links[ino_index(ino)] > LINK_MAX {
                return Err(LayerError::bad(
                    &path,
                    format!("more than {LINK_MAX} hard links"),
                ));
            }
        }
    }
    n.max_ino = next_ino - 1;
    Ok(n)
}

/// Per-inode needs, independent of where blocks go: bodies, inline attributes, shared
/// attribute blocks.
fn prepare<'t>(
    tree: &'t Tree,
    n: &Numbering,
    fs_seed: u32,
    hseed: &[u32; 4],
) -> Result<(Vec<Prep<'t>>, XattrBlocks), LayerError> {
    let mut xblocks: XattrBlocks = Vec::new();
    let mut xblock_ids: HashMap<Vec<Attr>, usize> = HashMap::new();
    let mut preps: Vec<Prep<'t>> = Vec::with_capacity(n.order.len());
    for (i, (node_id, path)) in n.order.iter().enumerate() {
        let node = &tree.nodes[*node_id];
        let ino = n.node_ino[*node_id];
        let body = body(tree, n, *node_id, ino, path, fs_seed, hseed)?;
        let (inline, rest) = split_xattrs(&node.meta.xattrs, path)?;
        let xblock = if rest.is_empty() {
            None
        } else {
            // Share identical blocks, at most XATTR_REFCOUNT_MAX inodes per block as the kernel
            // does, then start another copy.
            let id = match xblock_ids.get(&rest) {
                Some(&id) if xblocks[id].1 < XATTR_REFCOUNT_MAX => id,
                _ => {
                    xblocks.push((rest.clone(), 0));
                    xblock_ids.insert(rest, xblocks.len() - 1);
                    xblocks.len() - 1
                }
            };
            xblocks[id].1 += 1;
            Some(id)
        };
        preps.push(Prep {
            ino,
            node: *node_id,
            links: n.links[i],
            body,
            inline,
            xblock,
        });
    }
    Ok((preps, xblocks))
}

/// What one inode holds besides its attributes.
fn body<'t>(
    tree: &'t Tree,
    n: &Numbering,
    node_id: NodeId,
    ino: u32,
    path: &[u8],
    fs_seed: u32,
    hseed: &[u32; 4],
) -> Result<Body<'t>, LayerError> {
    Ok(match &tree.nodes[node_id].kind {
        NodeKind::Dir(children) => {
            let entries: Vec<Entry<'_>> = children
                .iter()
                .map(|(name, &c)| Entry {
                    name,
                    ino: n.node_ino[c],
                    file_type: file_type(&tree.nodes[c].kind),
                })
                .collect();
            let seed = csum::inode_seed(fs_seed, ino, 0);
            Body::Dir(dir::build(
                path,
                ino,
                n.parent_of[&ino],
                &entries,
                seed,
                hseed,
            )?)
        }
        NodeKind::File(fd) => {
            let mut ranges = Vec::new();
            let mut blocks = 0;
            for r in &fd.data {
                let s = r.start / B;
                let e = r.end.div_ceil(B);
                if e > s {
                    ranges.push((s, e - s));
                    blocks += e - s;
                }
            }
            if fd.size.div_ceil(B) > u64::from(u32::MAX) {
                return Err(LayerError::bad(path, "file larger than 16 TiB"));
            }
            Body::File {
                size: fd.size,
                source: &fd.source,
                ranges,
                blocks,
            }
        }
        NodeKind::Symlink(t) => match t.len() {
            0 => return Err(LayerError::bad(path, "symlink with an empty target")),
            1..=59 => Body::FastLink(t),
            60..=4095 => Body::SlowLink(t),
            n => {
                return Err(LayerError::bad(
                    path,
                    format!("symlink target of {n} bytes; at most 4095 fit"),
                ))
            }
        },
        NodeKind::CharDev { major, minor } => Body::CharDev(*major, *minor),
        NodeKind::BlockDev { major, minor } => Body::BlockDev(*major, *minor),
        NodeKind::Fifo => Body::Fifo,
        NodeKind::Socket => Body::Socket,
    })
}

/// Attributes go in the inode while they fit (in block order), the rest in one block.
fn split_xattrs(
    xattrs: &std::collections::BTreeMap<Vec<u8>, Vec<u8>>,
    path: &[u8],
) -> Result<(Vec<Attr>, Vec<Attr>), LayerError> {
    let mut attrs = Vec::new();
    for (name, value) in xattrs {
        let a = xattr::to_disk(name, value).map_err(|reason| LayerError::Xattr {
            entry: show(path),
            name: String::from_utf8_lossy(name).into_owned(),
            reason,
        })?;
        attrs.push(a);
    }
    xattr::sort_for_block(&mut attrs);
    let mut inline = Vec::new();
    let mut rest = Vec::new();
    for a in attrs {
        let mut trial = inline.clone();
        trial.push(a.clone());
        if rest.is_empty() && xattr::inline_size(&trial) <= INLINE_XATTR_SPACE {
            inline = trial;
        } else {
            rest.push(a);
        }
    }
    if !rest.is_empty() && xattr::block_size(&rest) > BLOCK_SIZE {
        return Err(LayerError::Xattr {
            entry: show(path),
            name: rest
                .iter()
                .map(|a| String::from_utf8_lossy(&a.name).into_owned())
                .collect::<Vec<_>>()
                .join(", "),
            reason: "attributes do not fit in one 4 KiB block".into(),
        });
    }
    Ok((inline, rest))
}

/// Grows the group count until everything fits.
fn fit_geometry(
    preps: &[Prep<'_>],
    nxblocks: usize,
    max_ino: u32,
    opts: &Ext4Options,
) -> Result<Fit, LayerError> {
    let size_blocks = opts.size.map(|s| s / B);
    let mut groups = 1u64;
    let mut want_64bit = false;
    loop {
        let geo = Geometry::new(groups, max_ino.max(FIRST_INO), want_64bit);
        if geo.inodes_per_group > 8 * BLOCK_SIZE as u32 {
            groups = u64::from(max_ino).div_ceil(8 * B);
            continue;
        }
        let meta_end = 1 + geo.gdt_blocks + 2 * groups + groups * geo.itable_blocks();
        if groups > 1 && meta_end > u64::from(BLOCKS_PER_GROUP) {
            return Err(LayerError::TooLarge(format!(
                "{max_ino} inodes need {meta_end} blocks of bitmaps and inode tables; ingot keeps them in the first block group (32768 blocks)"
            )));
        }
        let (placed, xblock_at, end) = place(&geo, preps, nxblocks);
        let last = groups - 1;
        let min_last = last * u64::from(BLOCKS_PER_GROUP)
            + if superblock::has_super(last) {
                1 + geo.gdt_blocks
            } else {
                0
            }
            + 16;
        let mut total = end.max(min_last);
        if let Some(s) = size_blocks {
            if s < end {
                return Err(LayerError::TooLarge(format!(
                    "the tree needs {} bytes; the requested size is {} bytes",
                    end * B,
                    s * B
                )));
            }
            total = total.max(s);
        }
        let need_groups = total.div_ceil(u64::from(BLOCKS_PER_GROUP));
        let need_64 = total > u64::from(u32::MAX);
        if need_groups == groups && need_64 == want_64bit {
            return Ok(Fit {
                geo,
                placed,
                xblock_at,
                end,
                total,
            });
        }
        groups = groups.max(need_groups);
        want_64bit |= need_64;
    }
}

/// The inode tables (a group's is allocated on first use) and each group's directory count.
struct Tables {
    ipg: u32,
    tables: Vec<Vec<u8>>,
    dirs_per_group: Vec<u32>,
}

impl Tables {
    fn new(geo: &Geometry) -> Tables {
        Tables {
            ipg: geo.inodes_per_group,
            tables: (0..geo.groups).map(|_| Vec::new()).collect(),
            dirs_per_group: vec![0u32; geo.groups as usize],
        }
    }

    /// The group of `ino`, and its slot's bytes.
    fn slot(&mut self, ino: u32) -> (usize, &mut [u8]) {
        let g = ((ino - 1) / self.ipg) as usize;
        if self.tables[g].is_empty() {
            self.tables[g] = vec![0u8; self.ipg as usize * INODE_SIZE as usize];
        }
        let off = ((ino - 1) % self.ipg) as usize * INODE_SIZE as usize;
        (g, &mut self.tables[g][off..off + INODE_SIZE as usize])
    }
}

/// Every inode into its table, its blocks as segments; returns the data bytes written.
fn write_inodes<'t>(
    tree: &Tree,
    preps: &[Prep<'t>],
    fit: &Fit,
    time: u64,
    fs_seed: u32,
    tables: &mut Tables,
    segs: &mut Vec<Segment<'t>>,
) -> u64 {
    for ino in (1..FIRST_INO).filter(|&i| i != ROOT_INO) {
        inode::write_reserved(tables.slot(ino).1, ino, fs_seed);
    }
    let mut data_bytes = 0u64;
    for (p, pl) in preps.iter().zip(&fit.placed) {
        let node = &tree.nodes[p.node];
        let mut f = InodeFields {
            uid: node.meta.uid,
            gid: node.meta.gid,
            links: p.links as u16,
            time,
            ..Default::default()
        };
        let seed = csum::inode_seed(fs_seed, p.ino, 0);
        let mut blocks = pl.tree_blocks.len() as u64;
        blocks += body_fields(p, pl, node.meta.perm, seed, &mut f, segs, &mut data_bytes);
        if let Some(x) = p.xblock {
            f.xattr_block = fit.xblock_at[x];
            blocks += 1;
        }
        f.sectors = blocks * (B / 512);
        let (g, raw) = tables.slot(p.ino);
        if !p.inline.is_empty() {
            xattr::write_inline(
                &mut raw[128 + superblock::EXTRA_ISIZE as usize..],
                &p.inline,
            );
        }
        inode::write(raw, &f, p.ino, fs_seed);
        if matches!(p.body, Body::Dir(_)) {
            tables.dirs_per_group[g] += 1;
        }
    }
    data_bytes
}

/// The extent tree of a placed inode, in its `i_block` and (when deeper) as segments.
fn set_extents<'t>(pl: &Placed, seed: u32, f: &mut InodeFields, segs: &mut Vec<Segment<'t>>) {
    let mut ib = [0u8; 60];
    for (blk, bytes) in extent::build(&pl.extents, &pl.tree_blocks, seed, &mut ib) {
        segs.push(Segment::Meta { block: blk, bytes });
    }
    f.i_block = ib;
    f.flags |= inode::FL_EXTENTS;
}

/// Mode, size and blocks of one inode's body; returns the blocks the body uses.
fn body_fields<'t>(
    p: &Prep<'t>,
    pl: &Placed,
    perm: u16,
    seed: u32,
    f: &mut InodeFields,
    segs: &mut Vec<Segment<'t>>,
    data_bytes: &mut u64,
) -> u64 {
    let mut blocks = 0;
    match &p.body {
        Body::Dir(d) => {
            f.mode = inode::S_IFDIR | perm;
            f.size = d.blocks.len() as u64 * B;
            if d.indexed {
                f.flags |= inode::FL_INDEX;
            }
            // dir_nlink: a directory with too many subdirectories counts 1.
            if p.links > LINK_MAX {
                f.links = 1;
            }
            blocks += d.blocks.len() as u64;
            let mut lblk = 0usize;
            for e in &pl.extents {
                let n = e.len as usize;
                let bytes = d.blocks[lblk..lblk + n].concat();
                segs.push(Segment::Meta {
                    block: e.physical,
                    bytes,
                });
                lblk += n;
            }
            set_extents(pl, seed, f, segs);
        }
        Body::File {
            size,
            source,
            blocks: b,
            ..
        } => {
            f.mode = inode::S_IFREG | perm;
            f.size = *size;
            blocks += b;
            for e in &pl.extents {
                let offset = u64::from(e.logical) * B;
                let len = (u64::from(e.len) * B).min(size - offset);
                *data_bytes += len;
                segs.push(Segment::Data {
                    block: e.physical,
                    ino: p.ino,
                    source,
                    offset,
                    len,
                });
            }
            set_extents(pl, seed, f, segs);
        }
        Body::FastLink(t) => {
            f.mode = inode::S_IFLNK | perm;
            f.size = t.len() as u64;
            f.i_block[..t.len()].copy_from_slice(t);
        }
        Body::SlowLink(t) => {
            f.mode = inode::S_IFLNK | perm;
            f.size = t.len() as u64;
            blocks += 1;
            let mut bytes = vec![0u8; BLOCK_SIZE];
            bytes[..t.len()].copy_from_slice(t);
            segs.push(Segment::Meta {
                block: pl.extents[0].physical,
                bytes,
            });
            set_extents(pl, seed, f, segs);
        }
        Body::CharDev(ma, mi) | Body::BlockDev(ma, mi) => {
            f.mode = if matches!(p.body, Body::CharDev(..)) {
                inode::S_IFCHR
            } else {
                inode::S_IFBLK
            } | perm;
            // Old 16-bit encoding when it fits, else the new one in the second word.
            if *ma < 256 && *mi < 256 {
                le_put(&mut f.i_block, 0, (ma << 8) | mi);
            } else {
                le_put(
                    &mut f.i_block,
                    4,
                    (mi & 0xff) | (ma << 8) | ((mi & !0xff) << 12),
                );
            }
        }
        Body::Fifo => f.mode = inode::S_IFIFO | perm,
        Body::Socket => f.mode = inode::S_IFSOCK | perm,
    }
    blocks
}

/// Group metadata: bitmaps, inode tables, descriptors, superblocks and their backups.
fn write_group_metadata(
    fit: &Fit,
    max_ino: u32,
    mut tables: Tables,
    ids: &FsIds,
    segs: &mut Vec<Segment<'_>>,
) {
    let geo = &fit.geo;
    let ipg = geo.inodes_per_group;
    let meta_start = 1 + geo.gdt_blocks;
    let bb_at = |g: u64| meta_start + g;
    let ib_at = |g: u64| meta_start + geo.groups + g;
    let it_at = |g: u64| meta_start + 2 * geo.groups + g * geo.itable_blocks();
    let mut descs = Vec::new();
    let mut free_blocks_total = 0u64;
    let mut free_inodes_total = 0u64;
    for g in 0..geo.groups {
        let bb = block_bitmap(fit, g);
        let free_blocks = bb.1;
        let first = g * u64::from(ipg) + 1;
        let used_inodes = (u64::from(max_ino) + 1)
            .saturating_sub(first)
            .min(u64::from(ipg)) as u32;
        let mut ib = vec![0xFFu8; BLOCK_SIZE];
        ib[..(ipg / 8) as usize].fill(0);
        for i in 0..used_inodes {
            ib[(i / 8) as usize] |= 1 << (i % 8);
        }
        descs.push(GroupDesc {
            block_bitmap: bb_at(g),
            inode_bitmap: ib_at(g),
            inode_table: it_at(g),
            free_blocks: free_blocks as u32,
            free_inodes: ipg - used_inodes,
            used_dirs: tables.dirs_per_group[g as usize],
            itable_unused: ipg - used_inodes,
            block_bitmap_csum: group::bitmap_csum(ids.fs_seed, &bb.0),
            inode_bitmap_csum: group::bitmap_csum(ids.fs_seed, &ib[..(ipg / 8) as usize]),
        });
        free_blocks_total += free_blocks;
        free_inodes_total += u64::from(ipg - used_inodes);
        segs.push(Segment::Meta {
            block: bb_at(g),
            bytes: bb.0,
        });
        segs.push(Segment::Meta {
            block: ib_at(g),
            bytes: ib,
        });
        let table = std::mem::take(&mut tables.tables[g as usize]);
        if !table.is_empty() {
            segs.push(Segment::Meta {
                block: it_at(g),
                bytes: table,
            });
        }
    }
    let mut gdt = vec![0u8; (geo.gdt_blocks * B) as usize];
    for (g, d) in descs.iter().enumerate() {
        group::write(
            &mut gdt[g * geo.desc_size..],
            d,
            g as u32,
            ids.fs_seed,
            geo.desc_size,
        );
    }
    let counts = (free_blocks_total, free_inodes_total);
    write_superblocks(fit, &gdt, counts, ids, segs);
}

/// Group `g`'s block bitmap and its free block count. In use: everything below the
/// allocator's end, the group's backup superblock and descriptors (also past the end), and the
/// padding past the last block.
fn block_bitmap(fit: &Fit, g: u64) -> (Vec<u8>, u64) {
    let bpg = u64::from(BLOCKS_PER_GROUP);
    let gstart = g * bpg;
    let gend = ((g + 1) * bpg).min(fit.total);
    let backup = if g > 0 && superblock::has_super(g) {
        gstart..gstart + 1 + fit.geo.gdt_blocks
    } else {
        0..0
    };
    let mut bb = vec![0u8; BLOCK_SIZE];
    let mut free_blocks = 0u64;
    for bit in 0..bpg {
        let blk = gstart + bit;
        if blk < fit.end || blk >= gend || backup.contains(&blk) {
            bb[(bit / 8) as usize] |= 1 << (bit % 8);
        } else {
            free_blocks += 1;
        }
    }
    (bb, free_blocks)
}

/// The primary superblock and its backups, each followed by the descriptor table.
fn write_superblocks(
    fit: &Fit,
    gdt: &[u8],
    (free_blocks, free_inodes): (u64, u64),
    ids: &FsIds,
    segs: &mut Vec<Segment<'_>>,
) {
    let geo = &fit.geo;
    let log_flex = 4u8;
    for g in (0..geo.groups).filter(|&g| superblock::has_super(g)) {
        let sb = superblock::to_bytes(&SuperblockFields {
            inodes_count: geo.inodes_per_group * geo.groups as u32,
            blocks_count: fit.total,
            free_blocks,
            free_inodes: free_inodes as u32,
            inodes_per_group: geo.inodes_per_group,
            time: ids.time,
            uuid: ids.uuid,
            hash_seed: ids.hash_seed,
            group_nr: g as u16,
            want_64bit: geo.want_64bit,
            log_groups_per_flex: log_flex,
        });
        let mut bytes = vec![0u8; BLOCK_SIZE];
        // The primary superblock sits 1024 bytes into block 0; backups start their block.
        let at = if g == 0 { 1024 } else { 0 };
        bytes[at..at + 1024].copy_from_slice(&sb);
        bytes.extend_from_slice(gdt);
        segs.push(Segment::Meta {
            block: g * u64::from(BLOCKS_PER_GROUP),
            bytes,
        });
    }
}

fn le_put(ib: &mut [u8; 60], off: usize, v: u32) {
    ib[off..off + 4].copy_from_slice(&v.to_le_bytes());
}

/// Places every inode's blocks; returns the placements, the xattr blocks' locations and the
/// allocator's end (the first free block).
fn place(geo: &Geometry, preps: &[Prep<'_>], nxblocks: usize) -> (Vec<Placed>, Vec<u64>, u64) {
    let mut a = Alloc {
        next: 0,
        reserved: &geo.reserved,
        ri: 0,
    };
    a.take_contig(1 + geo.gdt_blocks);
    a.take_contig(geo.groups); // block bitmaps
    a.take_contig(geo.groups); // inode bitmaps
    a.take_contig(geo.groups * geo.itable_blocks());
    let mut xat = vec![u64::MAX; nxblocks];
    let mut out = Vec::with_capacity(preps.len());
    for p in preps {
        if let Some(x) = p.xblock {
            if xat[x] == u64::MAX {
                xat[x] = a.take_contig(1);
            }
        }
        let (logical, n): (Vec<(u64, u64)>, u64) = match &p.body {
            Body::Dir(d) => (vec![(0, d.blocks.len() as u64)], d.blocks.len() as u64),
            Body::File { ranges, blocks, .. } => (ranges.clone(), *blocks),
            Body::SlowLink(_) => (vec![(0, 1)], 1),
            _ => {
                out.push(Placed::default());
                continue;
            }
        };
        let runs = a.take(n);
        let extents = map_extents(&logical, &runs);
        let tb = extent::tree_blocks(extents.len()) as u64;
        let tree_blocks = a.take(tb).into_iter().flat_map(|(s, l)| s..s + l).collect();
        out.push(Placed {
            extents,
            tree_blocks,
        });
    }
    (out, xat, a.next)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn allocator_steps_over_reserved_ranges() {
        let r = [(10, 12), (20, 25)];
        let mut a = Alloc {
            next: 8,
            reserved: &r,
            ri: 0,
        };
        assert_eq!(a.take(5), vec![(8, 2), (12, 3)]);
        assert_eq!(a.take_contig(6), 25);
        let e = map_extents(&[(0, 2), (100, 3)], &[(8, 2), (12, 3)]);
        assert_eq!(e.len(), 2);
        assert_eq!(
            e[1],
            Extent {
                logical: 100,
                physical: 12,
                len: 3
            }
        );
    }
}
