//! A target that silently corrupts writes: a FUSE file over a real image file that flips one
//! bit in the first N writes touching a chosen range. The writer's O_DIRECT read-back must catch
//! it, rewrite the range, and report it; when the corruption persists, fail and leave the disk
//! without a partition table.

mod common;

use std::ffi::OsStr;
use std::fs::{self, File};
use std::os::unix::fs::FileExt;
use std::path::{Path, PathBuf};
use std::process::Command;
use std::sync::{Arc, Mutex};
use std::time::{Duration, UNIX_EPOCH};

use common::{demo, Stack};
use fuser::{
    FileAttr, FileType, Filesystem, MountOption, ReplyAttr, ReplyData, ReplyDirectory, ReplyEmpty,
    ReplyEntry, ReplyOpen, ReplyWrite, Request,
};

const MIB: u64 = 1 << 20;
const DISK_INO: u64 = 2;

struct Shared {
    /// Writes touching [start, end) that are still to be corrupted.
    remaining: u32,
    corrupted: u32,
}

struct FlakyDisk {
    backing: File,
    size: u64,
    start: u64,
    end: u64,
    shared: Arc<Mutex<Shared>>,
    /// Every write takes at least this long: a slow disk.
    delay: Duration,
}

fn attr(ino: u64, size: u64) -> FileAttr {
    let dir = ino == 1;
    FileAttr {
        ino,
        size: if dir { 0 } else { size },
        blocks: size / 512,
        atime: UNIX_EPOCH,
        mtime: UNIX_EPOCH,
        ctime: UNIX_EPOCH,
        crtime: UNIX_EPOCH,
        kind: if dir {
            FileType::Directory
        } else {
            FileType::RegularFile
        },
        perm: if dir { 0o755 } else { 0o600 },
        nlink: if dir { 2 } else { 1 },
        uid: 0,
        gid: 0,
        rdev: 0,
        blksize: 4096,
        flags: 0,
    }
}

const TTL: Duration = Duration::from_secs(60);

impl Filesystem for FlakyDisk {
    fn lookup(&mut self, _req: &Request<'_>, parent: u64, name: &OsStr, reply: ReplyEntry) {
        if parent == 1 && name == "disk.img" {
            reply.entry(&TTL, &attr(DISK_INO, self.size), 0);
        } else {
            reply.error(libc::ENOENT);
        }
    }

    fn getattr(&mut self, _req: &Request<'_>, ino: u64, _fh: Option<u64>, reply: ReplyAttr) {
        match ino {
            1 | DISK_INO => reply.attr(&TTL, &attr(ino, self.size)),
            _ => reply.error(libc::ENOENT),
        }
    }

    fn open(&mut self, _req: &Request<'_>, _ino: u64, _flags: i32, reply: ReplyOpen) {
        // Direct I/O: every read reaches us, so the writer's read-back sees what we stored.
        reply.opened(0, fuser::consts::FOPEN_DIRECT_IO);
    }

    fn read(
        &mut self,
        _req: &Request<'_>,
        _ino: u64,
        _fh: u64,
        offset: i64,
        size: u32,
        _flags: i32,
        _lock: Option<u64>,
        reply: ReplyData,
    ) {
        let offset = offset as u64;
        let len = (size as u64).min(self.size.saturating_sub(offset)) as usize;
        let mut buf = vec![0u8; len];
        match self.backing.read_exact_at(&mut buf, offset) {
            Ok(()) => reply.data(&buf),
            Err(e) => reply.error(e.raw_os_error().unwrap_or(libc::EIO)),
        }
    }

    fn write(
        &mut self,
        _req: &Request<'_>,
        _ino: u64,
        _fh: u64,
        offset: i64,
        data: &[u8],
        _wf: u32,
        _flags: i32,
        _lock: Option<u64>,
        reply: ReplyWrite,
    ) {
        let offset = offset as u64;
        let end = offset + data.len() as u64;
        let mut data = data.to_vec();
        std::thread::sleep(self.delay);
        if offset < self.end && end > self.start {
            let mut s = self.shared.lock().unwrap();
            if s.remaining > 0 {
                s.remaining -= 1;
                s.corrupted += 1;
                let at = (self.start.max(offset) - offset) as usize;
                data[at] ^= 0x10;
            }
        }
        match self.backing.write_all_at(&data, offset) {
            Ok(()) => reply.written(data.len() as u32),
            Err(e) => reply.error(e.raw_os_error().unwrap_or(libc::EIO)),
        }
    }

    fn flush(&mut self, _req: &Request<'_>, _ino: u64, _fh: u64, _lock: u64, reply: ReplyEmpty) {
        reply.ok();
    }

    fn fsync(
        &mut self,
        _req: &Request<'_>,
        _ino: u64,
        _fh: u64,
        _datasync: bool,
        reply: ReplyEmpty,
    ) {
        match self.backing.sync_data() {
            Ok(()) => reply.ok(),
            Err(_) => reply.error(libc::EIO),
        }
    }

    fn readdir(
        &mut self,
        _req: &Request<'_>,
        ino: u64,
        _fh: u64,
        offset: i64,
        mut reply: ReplyDirectory,
    ) {
        if ino != 1 {
            reply.error(libc::ENOTDIR);
            return;
        }
        let entries = [
            (1, FileType::Directory, "."),
            (1, FileType::Directory, ".."),
            (DISK_INO, FileType::RegularFile, "disk.img"),
        ];
        for (i, (ino, kind, name)) in entries.iter().enumerate().skip(offset as usize) {
            if reply.add(*ino, (i + 1) as i64, *kind, name) {
                break;
            }
        }
        reply.ok();
    }
}

fn usable() -> bool {
    let test = &ingot_testkit::skip::current_test();
    ingot_testkit::skip::have_file(test, Path::new("/dev/fuse"))
        && ingot_testkit::skip::have_tool(test, "fusermount3")
}

/// Mounts a flaky disk of `size` bytes corrupting the first `writes` writes to [start, end).
fn flaky(
    dir: &Path,
    size: u64,
    start: u64,
    end: u64,
    writes: u32,
) -> (
    fuser::BackgroundSession,
    PathBuf,
    PathBuf,
    Arc<Mutex<Shared>>,
) {
    slow_flaky(dir, size, start, end, writes, Duration::ZERO)
}

/// [`flaky`], with every write taking `delay`.
fn slow_flaky(
    dir: &Path,
    size: u64,
    start: u64,
    end: u64,
    writes: u32,
    delay: Duration,
) -> (
    fuser::BackgroundSession,
    PathBuf,
    PathBuf,
    Arc<Mutex<Shared>>,
) {
    let backing_path = dir.join("backing.img");
    let backing = fs::OpenOptions::new()
        .read(true)
        .write(true)
        .create(true)
        .truncate(true)
        .open(&backing_path)
        .unwrap();
    backing.set_len(size).unwrap();
    let shared = Arc::new(Mutex::new(Shared {
        remaining: writes,
        corrupted: 0,
    }));
    let mnt = dir.join("mnt");
    fs::create_dir_all(&mnt).unwrap();
    let fs = FlakyDisk {
        backing,
        size,
        start,
        end,
        shared: shared.clone(),
        delay,
    };
    let session = fuser::spawn_mount2(fs, &mnt, &[MountOption::FSName("ingot-flaky".into())])
        .expect("mounting the FUSE disk");
    (session, mnt.join("disk.img"), backing_path, shared)
}

fn run_writer(
    stack: &Stack,
    target: &Path,
    report: &Path,
    events: &Path,
    extra: &[&str],
) -> std::process::Output {
    Command::new(env!("CARGO_BIN_EXE_ingot-writer"))
        .arg(&stack.layout)
        .arg("--target")
        .arg(target)
        .arg("--trust-key")
        .arg(&stack.public)
        .arg("--report")
        .arg(report)
        .arg("--events")
        .arg(events)
        .args(extra)
        .output()
        .unwrap()
}

/// The base layer's data partition starts right after the 256 MiB ESP at 1 MiB.
const BASE_START: u64 = 257 * MIB;

#[test]
fn a_corrupted_write_is_caught_and_rewritten() {
    if !usable() {
        return;
    }
    let stack = demo();
    let work = tempfile::tempdir().unwrap();
    // The ext4 superblock of the base layer: certainly non-zero, certainly written.
    let (session, target, backing, shared) = flaky(
        work.path(),
        1024 * MIB,
        BASE_START + 1024,
        BASE_START + 2048,
        1,
    );
    let (report, events) = (
        work.path().join("report.json"),
        work.path().join("events.jsonl"),
    );
    let out = run_writer(&stack, &target, &report, &events, &[]);
    drop(session);
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    assert_eq!(
        shared.lock().unwrap().corrupted,
        1,
        "the disk corrupted one write"
    );
    let status: serde_json::Value = serde_json::from_slice(&fs::read(&report).unwrap()).unwrap();
    let rewrites = status["rewrites"].as_array().unwrap();
    assert_eq!(rewrites.len(), 1, "{status}");
    assert_eq!(rewrites[0]["layer"], "base");
    assert_eq!(rewrites[0]["offset"], BASE_START);
    assert!(fs::read_to_string(&events)
        .unwrap()
        .contains("\"event\":\"rewrite\""));
    // What is on the disk now is the layer, byte for byte: veritysetup agrees.
    let sgdisk = Command::new("sgdisk")
        .arg("-v")
        .arg(&backing)
        .output()
        .unwrap();
    assert!(String::from_utf8_lossy(&sgdisk.stdout).contains("No problems found"));
    let data = File::open(&backing).unwrap();
    let mut sb = [0u8; 2];
    data.read_exact_at(&mut sb, BASE_START + 1024 + 0x38)
        .unwrap();
    assert_eq!(
        sb,
        [0x53, 0xEF],
        "the ext4 superblock magic is intact after the rewrite"
    );
}

#[test]
fn a_disk_that_keeps_corrupting_fails_the_run() {
    if !usable() {
        return;
    }
    let stack = demo();
    let work = tempfile::tempdir().unwrap();
    let (session, target, backing, shared) = flaky(
        work.path(),
        1024 * MIB,
        BASE_START + 1024,
        BASE_START + 2048,
        u32::MAX,
    );
    let (report, events) = (
        work.path().join("report.json"),
        work.path().join("events.jsonl"),
    );
    let out = run_writer(&stack, &target, &report, &events, &[]);
    drop(session);
    let err = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(1), "{err}");
    assert!(
        err.contains("layer `base`")
            && err.contains(&format!("offset {BASE_START}"))
            && err.contains("after 3 attempts"),
        "{err}"
    );
    assert!(err.contains("left without a partition table"), "{err}");
    assert_eq!(
        shared.lock().unwrap().corrupted,
        3,
        "written three times, corrupted three times"
    );
    let status: serde_json::Value = serde_json::from_slice(&fs::read(&report).unwrap()).unwrap();
    assert_eq!(status["state"], "failed");
    let head = {
        let f = File::open(&backing).unwrap();
        let mut b = vec![0u8; 1024];
        f.read_exact_at(&mut b, 0).unwrap();
        b
    };
    assert!(
        head.iter().all(|b| *b == 0),
        "no protective MBR or GPT header"
    );
}

/// A deadline that passes in the middle of writing a slow disk: the run stops, says why, and
/// leaves the disk without a partition table.
#[test]
fn a_deadline_that_passes_mid_write_leaves_no_partition_table() {
    if !usable() {
        return;
    }
    let stack = demo();
    let work = tempfile::tempdir().unwrap();
    // 150 ms per FUSE write (at most 128 KiB each): the wipe (1 MiB at each end) takes about
    // 2.4 s, the base layer's 2 MB as long again, so the 4 s deadline passes while the layer is
    // written, with a margin of more than a second either side.
    let (session, target, backing, _shared) =
        slow_flaky(work.path(), 1024 * MIB, 0, 0, 0, Duration::from_millis(150));
    let report = work.path().join("report.json");
    let started = std::time::Instant::now();
    let events = work.path().join("events.jsonl");
    let out = run_writer(&stack, &target, &report, &events, &["--deadline", "4s"]);
    let took = started.elapsed();
    drop(session);
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(1), "{stderr}");
    assert!(
        stderr.contains("the deadline passed while writing"),
        "{stderr}"
    );
    assert!(
        stderr.contains("left without a partition table"),
        "{stderr}"
    );
    assert!(
        took < Duration::from_secs(30),
        "stopped soon after the deadline: {took:?}"
    );
    let status: serde_json::Value = serde_json::from_slice(&fs::read(&report).unwrap()).unwrap();
    assert_eq!(status["state"], "failed");
    assert!(
        status["error"].as_str().unwrap().contains("deadline"),
        "{status}"
    );
    // Something was written (the deadline passed mid-write), but no partition table.
    let disk = fs::read(&backing).unwrap();
    assert!(disk.iter().any(|b| *b != 0), "the write had started");
    assert!(
        disk[..MIB as usize].iter().all(|b| *b == 0),
        "no MBR or GPT at the start"
    );
    assert!(
        disk[disk.len() - MIB as usize..].iter().all(|b| *b == 0),
        "no backup GPT at the end"
    );
    let sgdisk = Command::new("sgdisk")
        .arg("-p")
        .arg(&backing)
        .output()
        .unwrap();
    // sgdisk finds no table and would make a new one.
    assert!(
        String::from_utf8_lossy(&sgdisk.stdout).contains("Creating new GPT entries"),
        "{sgdisk:?}"
    );
}
