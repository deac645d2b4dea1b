//! Shared helpers for the ext4 image tests: building varied source trees, the real-tool oracles
//! (e2fsck, debugfs, the kernel's loop mount) and a tree comparison.
#![allow(dead_code)]

use std::collections::{BTreeMap, HashMap};
use std::ffi::{CString, OsStr};
use std::fs::{self, File};
use std::os::unix::ffi::OsStrExt;
use std::os::unix::fs::{FileExt, MetadataExt, PermissionsExt};
use std::path::{Path, PathBuf};
use std::process::Command;

use rustix::fs::{FileType, Mode, SeekFrom, CWD};

#[allow(unused_imports)] // not every test file uses every helper
pub use ingot_testkit::skip::{is_root, skip};

/// Whether to skip `test` for want of root (see `ingot_testkit::skip`).
pub fn skip_unless_root(test: &str) -> bool {
    !ingot_testkit::skip::have_root(test)
}

/// A tool's path (sbin included), or its bare name for the error to name.
pub fn tool(name: &str) -> PathBuf {
    ingot_testkit::skip::find_tool(name).unwrap_or_else(|| PathBuf::from(name))
}

/// `e2fsck -fn`: must exit 0 and report nothing to fix.
pub fn e2fsck_clean(img: &Path) {
    e2fsck_clean_with(img, &[]);
}

/// `e2fsck -fn` with extra environment (e.g. an E2FSCK_CONFIG).
pub fn e2fsck_clean_with(img: &Path, env: &[(&str, &Path)]) {
    let mut cmd = Command::new(tool("e2fsck"));
    cmd.arg("-fn").arg(img);
    for (k, v) in env {
        cmd.env(k, v);
    }
    let out = cmd.output().expect("running e2fsck");
    let text = format!(
        "{}{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
    assert!(
        out.status.success(),
        "e2fsck -fn {} failed ({}):\n{text}",
        img.display(),
        out.status
    );
    for bad in [
        "Fix?",
        "Clear?",
        "Salvage?",
        "Optimize?",
        "WARNING",
        "Relocate?",
    ] {
        assert!(
            !text.contains(bad),
            "e2fsck -fn {} reported a problem:\n{text}",
            img.display()
        );
    }
}

/// `debugfs -R stats`: the features line.
pub fn debugfs_features(img: &Path) -> Vec<String> {
    let out = Command::new(tool("debugfs"))
        .args(["-R", "stats"])
        .arg(img)
        .output()
        .expect("running debugfs");
    let text = String::from_utf8_lossy(&out.stdout);
    let line = text
        .lines()
        .find(|l| l.starts_with("Filesystem features:"))
        .unwrap_or_else(|| panic!("no features line in debugfs stats:\n{text}"));
    line["Filesystem features:".len()..]
        .split_whitespace()
        .map(str::to_string)
        .collect()
}

/// A read-only loop mount, undone on drop, also when the test panics.
pub use ingot_testkit::loopdev::LoopMount;

pub fn set_xattr(p: &Path, name: &str, value: &[u8]) {
    let n = CString::new(name).unwrap();
    rustix::fs::lsetxattr(p, n.as_c_str(), value, rustix::fs::XattrFlags::empty())
        .unwrap_or_else(|e| panic!("setting {name} on {}: {e}", p.display()));
}

pub fn xattrs(p: &Path) -> BTreeMap<Vec<u8>, Vec<u8>> {
    let mut names = vec![0u8; 65536];
    let n = rustix::fs::llistxattr(p, &mut names[..]).unwrap();
    let mut out = BTreeMap::new();
    for name in names[..n].split(|&b| b == 0).filter(|s| !s.is_empty()) {
        let c = CString::new(name).unwrap();
        let mut v = vec![0u8; 65536];
        let k = rustix::fs::lgetxattr(p, c.as_c_str(), &mut v[..]).unwrap();
        v.truncate(k);
        out.insert(name.to_vec(), v);
    }
    out
}

pub fn mknod(p: &Path, ft: FileType, perm: u32, major: u32, minor: u32) {
    rustix::fs::mknodat(
        CWD,
        p,
        ft,
        Mode::from_raw_mode(perm),
        rustix::fs::makedev(major, minor),
    )
    .unwrap_or_else(|e| panic!("mknod {}: {e}", p.display()));
}

fn write(p: &Path, data: &[u8]) {
    fs::write(p, data).unwrap();
}

fn chmod(p: &Path, mode: u32) {
    fs::set_permissions(p, fs::Permissions::from_mode(mode)).unwrap();
}

/// Deterministic pseudo-random bytes.
pub use ingot_testkit::noise::noise as bytes;

pub const SPARSE_SIZE: u64 = 5 << 30;

/// A tree with every kind of entry a root filesystem has. `big` adds the 20,000-entry directory
/// and the sparse 5 GiB file. Device nodes, owners and security.* / trusted.* attributes need
/// root; without it they are left out.
pub fn varied_tree(root: &Path, big: bool) {
    files_and_modes(root);
    links(root);
    specials_names_and_depth(root);
    user_xattrs(root);
    if is_root() {
        owners_devices_and_security(root);
    }
    if big {
        huge_directory_and_sparse_file(root);
    }
}

/// Files of sizes around the inline, block and extent limits, and odd modes.
fn files_and_modes(root: &Path) {
    fs::create_dir_all(root.join("etc/ssl")).unwrap();
    fs::create_dir_all(root.join("usr/bin")).unwrap();
    fs::create_dir_all(root.join("usr/lib")).unwrap();
    fs::create_dir_all(root.join("tmp")).unwrap();
    fs::create_dir_all(root.join("empty")).unwrap();
    for (i, n) in [
        0usize,
        1,
        59,
        60,
        4095,
        4096,
        4097,
        65536,
        1 << 20,
        3 * (1 << 20) + 17,
    ]
    .iter()
    .enumerate()
    {
        write(
            &root.join(format!("usr/lib/blob{i}")),
            &bytes(i as u64 + 1, *n),
        );
    }
    write(&root.join("etc/hostname"), b"node\n");
    write(&root.join("usr/bin/tool"), &bytes(99, 30_000));
    chmod(&root.join("usr/bin/tool"), 0o4755);
    write(&root.join("usr/bin/sgid"), b"#!/bin/sh\n");
    chmod(&root.join("usr/bin/sgid"), 0o2711);
    chmod(&root.join("tmp"), 0o1777);
    write(&root.join("etc/secret"), b"s3cret");
    chmod(&root.join("etc/secret"), 0o600);
}

/// Symlinks, fast (< 60 bytes, in the inode) and slow (a block), and hard links.
fn links(root: &Path) {
    // Absolute and dangling.
    std::os::unix::fs::symlink("../usr/bin/tool", root.join("etc/fast-link")).unwrap();
    let slow = format!("/{}", "very-long-component/".repeat(10));
    std::os::unix::fs::symlink(&slow, root.join("etc/slow-link")).unwrap();
    std::os::unix::fs::symlink("x".repeat(59), root.join("etc/link59")).unwrap();
    std::os::unix::fs::symlink("y".repeat(60), root.join("etc/link60")).unwrap();
    std::os::unix::fs::symlink("z".repeat(4000), root.join("etc/link4000")).unwrap();
    // Hard links across directories, and a file with many links.
    fs::hard_link(root.join("usr/bin/tool"), root.join("etc/tool-hardlink")).unwrap();
    fs::hard_link(root.join("usr/bin/tool"), root.join("tmp/tool-again")).unwrap();
    write(&root.join("usr/lib/many"), b"many links");
    for i in 0..50 {
        fs::hard_link(
            root.join("usr/lib/many"),
            root.join(format!("usr/lib/many.{i}")),
        )
        .unwrap();
    }
}

/// A fifo and a socket, names at the limits, deep nesting, a medium hashed directory.
fn specials_names_and_depth(root: &Path) {
    // Special files.
    mknod(&root.join("tmp/fifo"), FileType::Fifo, 0o644, 0, 0);
    let sock = std::os::unix::net::UnixListener::bind(root.join("tmp/sock")).unwrap();
    drop(sock);
    // Names: longest allowed, non-UTF-8, odd bytes.
    write(&root.join("n".repeat(255)), b"long name");
    let weird = OsStr::from_bytes(b"caf\xe9-\xff\xfe");
    write(&root.join(weird), b"latin-1 name");
    fs::create_dir(root.join(OsStr::from_bytes(b"dir-\x80\x81"))).unwrap();
    write(
        &root.join(OsStr::from_bytes(b"dir-\x80\x81/tab\there")),
        b"x",
    );
    write(
        &root.join(OsStr::from_bytes(b"dir-\x80\x81/new\nline")),
        b"y",
    );
    // Deep nesting.
    let mut deep = root.join("deep");
    for i in 0..64 {
        deep = deep.join(format!("level{i:02}"));
    }
    fs::create_dir_all(&deep).unwrap();
    write(&deep.join("bottom"), b"bottom");
    // A medium directory (hashed, one index level) with some hard links into it.
    fs::create_dir(root.join("medium")).unwrap();
    for i in 0..600 {
        write(
            &root.join(format!("medium/entry-{i:04}")),
            &bytes(i, (i % 7) as usize * 100),
        );
    }
}

/// user.* attributes everywhere, inline and in blocks, shared blocks.
fn user_xattrs(root: &Path) {
    set_xattr(&root.join("etc/hostname"), "user.small", b"1");
    set_xattr(&root.join("usr/lib/blob1"), "user.big", &bytes(5, 1500));
    set_xattr(&root.join("usr/lib/blob2"), "user.big", &bytes(5, 1500));
    set_xattr(&root.join("usr/lib/blob3"), "user.a", b"");
    set_xattr(&root.join("usr/lib/blob3"), "user.b", b"bee");
    set_xattr(&root.join("etc"), "user.on-dir", b"dir attr");
}

/// What needs root: device nodes, owners, security.* and trusted.* attributes.
fn owners_devices_and_security(root: &Path) {
    use std::os::unix::fs::lchown;
    mknod(
        &root.join("tmp/null"),
        FileType::CharacterDevice,
        0o666,
        1,
        3,
    );
    mknod(&root.join("tmp/sda"), FileType::BlockDevice, 0o660, 8, 0);
    mknod(
        &root.join("tmp/bigdev"),
        FileType::CharacterDevice,
        0o600,
        511,
        1_000_000,
    );
    lchown(root.join("etc/secret"), Some(1000), Some(1000)).unwrap();
    lchown(root.join("usr/lib"), Some(65534), Some(65533)).unwrap();
    lchown(root.join("etc/fast-link"), Some(7), Some(8)).unwrap();
    lchown(
        root.join("usr/lib/blob4"),
        Some(4_000_000_000),
        Some(3_000_000_000),
    )
    .unwrap();
    // chown clears setuid: set it again.
    chmod(&root.join("usr/bin/tool"), 0o4755);
    let cap = [
        1, 0, 0, 2, 0x20, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0,
    ];
    set_xattr(&root.join("usr/bin/tool"), "security.capability", &cap);
    set_xattr(
        &root.join("usr/bin/tool"),
        "security.selinux",
        b"system_u:object_r:bin_t:s0\0",
    );
    set_xattr(
        &root.join("usr/bin/sgid"),
        "security.selinux",
        b"system_u:object_r:bin_t:s0\0",
    );
    // trusted.* storage (not trusted.overlay.*: every source refuses overlay metadata).
    set_xattr(&root.join("etc/hostname"), "trusted.ingot-test", b"y");
    set_xattr(&root.join("usr/bin/sgid"), "security.capability", &cap);
    set_xattr(&root.join("usr/bin/sgid"), "user.extra", &bytes(9, 40));
    set_xattr(
        &root.join("etc/fast-link"),
        "security.selinux",
        b"system_u:object_r:etc_t:s0\0",
    );
}

/// Files in the hashed directory `/huge` whose names are not ASCII (each holds its name).
pub const NON_ASCII: [&str; 3] = [
    "NetLock_Arany_=Class_Gold=_Főtanúsítvány.pem",
    "Hellenic_Academic_and_Research_Institutions_ΕΛΛΗΝΙΚΑ.pem",
    "\u{fffd}\u{7ff}\u{80}",
];

/// The 20,000-entry directory and the sparse 5 GiB file.
fn huge_directory_and_sparse_file(root: &Path) {
    fs::create_dir(root.join("huge")).unwrap();
    for i in 0..20_000u32 {
        File::create(root.join(format!("huge/f{i:05}-{}", "p".repeat((i % 40) as usize)))).unwrap();
    }
    fs::hard_link(root.join("etc/hostname"), root.join("huge/hostname-link")).unwrap();
    // Names with bytes of 0x80 and more: they hash differently signed and unsigned.
    for name in NON_ASCII {
        fs::write(root.join("huge").join(name), name.as_bytes()).unwrap();
    }
    let f = File::create(root.join("usr/lib/sparse-5g")).unwrap();
    f.set_len(SPARSE_SIZE).unwrap();
    for (i, off) in [0u64, 3 << 30, (4 << 30) + 12345, SPARSE_SIZE - 5000]
        .iter()
        .enumerate()
    {
        f.write_all_at(&bytes(100 + i as u64, 5000), *off).unwrap();
    }
}

/// Data ranges of a file (SEEK_DATA / SEEK_HOLE), in 4 KiB blocks.
pub fn data_map(f: &File, size: u64) -> Vec<(u64, u64)> {
    let mut out = Vec::new();
    let mut pos = 0;
    while pos < size {
        let s = match rustix::fs::seek(f, SeekFrom::Data(pos)) {
            Ok(s) => s,
            Err(_) => break,
        };
        let e = rustix::fs::seek(f, SeekFrom::Hole(s)).unwrap().min(size);
        out.push((s / 4096, e.div_ceil(4096)));
        pos = e;
    }
    out
}

fn same_content(a: &Path, b: &Path, size: u64) {
    let (fa, fb) = (File::open(a).unwrap(), File::open(b).unwrap());
    let (ma, mb) = (data_map(&fa, size), data_map(&fb, size));
    assert_eq!(ma, mb, "hole map of {} differs", b.display());
    let mut ba = vec![0u8; 1 << 20];
    let mut bb = vec![0u8; 1 << 20];
    for (s, e) in ma {
        let mut off = s * 4096;
        let end = (e * 4096).min(size);
        while off < end {
            let n = ((end - off) as usize).min(ba.len());
            fa.read_exact_at(&mut ba[..n], off).unwrap();
            fb.read_exact_at(&mut bb[..n], off).unwrap();
            assert!(
                ba[..n] == bb[..n],
                "content of {} differs near offset {off}",
                b.display()
            );
            off += n as u64;
        }
    }
}

/// Walks `src` and checks that `img` (a mounted image) holds exactly the same tree: names, types,
/// modes, owners, sizes, contents, symlink targets, device numbers, xattrs and hard-link identity.
pub fn compare_trees(src: &Path, img: &Path) {
    let mut src_links: HashMap<u64, PathBuf> = HashMap::new();
    let mut img_links: HashMap<u64, PathBuf> = HashMap::new();
    let mut count = 0usize;
    compare_dir(
        src,
        img,
        Path::new(""),
        &mut src_links,
        &mut img_links,
        &mut count,
    );
    assert!(count > 0);
}

fn compare_dir(
    src: &Path,
    img: &Path,
    rel: &Path,
    sl: &mut HashMap<u64, PathBuf>,
    il: &mut HashMap<u64, PathBuf>,
    count: &mut usize,
) {
    let names = |d: &Path| -> Vec<Vec<u8>> {
        let mut v: Vec<Vec<u8>> = fs::read_dir(d)
            .unwrap()
            .map(|e| e.unwrap().file_name().as_bytes().to_vec())
            .collect();
        v.sort();
        v
    };
    let (sn, inames) = (names(&src.join(rel)), names(&img.join(rel)));
    assert_eq!(sn, inames, "listing of /{} differs", rel.display());
    compare_entry(src, img, rel, sl, il);
    for n in sn {
        let r = rel.join(OsStr::from_bytes(&n));
        *count += 1;
        let md = fs::symlink_metadata(src.join(&r)).unwrap();
        if md.is_dir() {
            compare_dir(src, img, &r, sl, il, count);
        } else {
            compare_entry(src, img, &r, sl, il);
        }
    }
}

fn compare_entry(
    src: &Path,
    img: &Path,
    rel: &Path,
    sl: &mut HashMap<u64, PathBuf>,
    il: &mut HashMap<u64, PathBuf>,
) {
    let (a, b) = (src.join(rel), img.join(rel));
    let (ma, mb) = (
        fs::symlink_metadata(&a).unwrap(),
        fs::symlink_metadata(&b).unwrap(),
    );
    let what = format!("/{}", rel.display());
    assert_eq!(ma.mode(), mb.mode(), "mode of {what}");
    assert_eq!(
        (ma.uid(), ma.gid()),
        (mb.uid(), mb.gid()),
        "owner of {what}"
    );
    assert_eq!(ma.nlink(), mb.nlink(), "link count of {what}");
    assert_eq!(xattrs(&a), xattrs(&b), "xattrs of {what}");
    let ft = ma.file_type();
    if ft.is_file() {
        assert_eq!(ma.len(), mb.len(), "size of {what}");
        same_content(&a, &b, ma.len());
    } else if ft.is_symlink() {
        assert_eq!(
            fs::read_link(&a).unwrap(),
            fs::read_link(&b).unwrap(),
            "target of {what}"
        );
    } else if !ft.is_dir() {
        assert_eq!(ma.rdev(), mb.rdev(), "device numbers of {what}");
    }
    if !ft.is_dir() && ma.nlink() > 1 {
        let first_src = sl
            .entry(ma.ino())
            .or_insert_with(|| rel.to_path_buf())
            .clone();
        let first_img = il
            .entry(mb.ino())
            .or_insert_with(|| rel.to_path_buf())
            .clone();
        assert_eq!(first_src, first_img, "hard-link identity of {what}");
    }
}

/// Recreates `src` at `dst` in a different creation order (non-directories in reverse), with
/// other timestamps, keeping everything the image records (holes too).
pub fn copy_tree_shuffled(src: &Path, dst: &Path) {
    let mut all = Vec::new();
    collect(src, Path::new(""), &mut all);
    fs::create_dir_all(dst).unwrap();
    for (rel, md) in &all {
        if md.is_dir() {
            fs::create_dir_all(dst.join(rel)).unwrap();
        }
    }
    let mut linked: HashMap<u64, PathBuf> = HashMap::new();
    for (rel, md) in all.iter().rev() {
        let (s, d) = (src.join(rel), dst.join(rel));
        let ft = md.file_type();
        if ft.is_dir() {
            continue;
        }
        if md.nlink() > 1 {
            if let Some(first) = linked.get(&md.ino()) {
                fs::hard_link(first, &d).unwrap();
                continue;
            }
            linked.insert(md.ino(), d.clone());
        }
        use std::os::unix::fs::FileTypeExt;
        if ft.is_file() {
            let (fi, fo) = (File::open(&s).unwrap(), File::create(&d).unwrap());
            let mut buf = vec![0u8; 1 << 20];
            for (bs, be) in data_map(&fi, md.len()) {
                let mut off = bs * 4096;
                let end = (be * 4096).min(md.len());
                while off < end {
                    let n = ((end - off) as usize).min(buf.len());
                    fi.read_exact_at(&mut buf[..n], off).unwrap();
                    fo.write_all_at(&buf[..n], off).unwrap();
                    off += n as u64;
                }
            }
            fo.set_len(md.len()).unwrap();
        } else if ft.is_symlink() {
            std::os::unix::fs::symlink(fs::read_link(&s).unwrap(), &d).unwrap();
        } else if ft.is_fifo() {
            mknod(&d, FileType::Fifo, 0o600, 0, 0);
        } else if ft.is_socket() {
            mknod(&d, FileType::Socket, 0o600, 0, 0);
        } else {
            let t = if ft.is_char_device() {
                FileType::CharacterDevice
            } else {
                FileType::BlockDevice
            };
            let r = md.rdev() as rustix::fs::Dev;
            mknod(&d, t, 0o600, rustix::fs::major(r), rustix::fs::minor(r));
        }
    }
    // Metadata last, deepest first, so directory mtimes and modes are not disturbed later.
    for (rel, md) in all.iter().rev() {
        let d = dst.join(rel);
        if is_root() {
            std::os::unix::fs::lchown(&d, Some(md.uid()), Some(md.gid())).unwrap();
        }
        if !md.file_type().is_symlink() {
            chmod(&d, md.mode() & 0o7777);
        }
        for (k, v) in xattrs(&src.join(rel)) {
            set_xattr(&d, std::str::from_utf8(&k).unwrap(), &v);
        }
        let t = rustix::fs::Timespec {
            tv_sec: 1_000_000 + (md.ino() % 1000) as i64,
            tv_nsec: 0,
        };
        let ts = rustix::fs::Timestamps {
            last_access: t,
            last_modification: t,
        };
        rustix::fs::utimensat(CWD, &d, &ts, rustix::fs::AtFlags::SYMLINK_NOFOLLOW).unwrap();
    }
}

fn collect(root: &Path, rel: &Path, out: &mut Vec<(PathBuf, fs::Metadata)>) {
    let mut names: Vec<_> = fs::read_dir(root.join(rel))
        .unwrap()
        .map(|e| e.unwrap().file_name())
        .collect();
    names.sort();
    for n in names {
        let r = rel.join(&n);
        let md = fs::symlink_metadata(root.join(&r)).unwrap();
        let is_dir = md.is_dir();
        out.push((r.clone(), md));
        if is_dir {
            collect(root, &r, out);
        }
    }
}

/// Files left in a directory (to check that failed builds leave nothing behind).
pub fn listing(dir: &Path) -> Vec<String> {
    let mut v: Vec<String> = fs::read_dir(dir)
        .unwrap()
        .map(|e| e.unwrap().file_name().to_string_lossy().into_owned())
        .collect();
    v.sort();
    v
}
