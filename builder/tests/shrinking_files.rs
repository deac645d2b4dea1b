//! Files that shrink while they are read (item 13 of "hostile input, second pass"): a data
//! device under `ingot verity verify`, a layer's data blob under `ingot verify` and `ingot
//! diff`. Each was mapped, and a page past the new end killed the process with SIGBUS, with no
//! message and (for `ingot verify`) its temporary directory left behind. Now each is read with
//! `pread` and the shrink is an error naming the file.
//!
//! The test truncates the file as soon as the command has it open (`/proc/PID/fd`), or, for
//! `ingot verify`, once it has started decompressing (its temporary image exists): the
//! command's own first steps (reading and checking the hash tree, hashing the blob) take far
//! longer than the test's 2 ms poll.

mod common;

use std::ffi::OsStr;
use std::fs;
use std::io::Write;
use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::Duration;

use common::{build, cp_a, demo_copy, keypair};
use ingot_testkit::measure::{measured_with, Run};
use rand::RngCore;

const DEADLINE: Duration = Duration::from_secs(120);

/// Whether process `pid` has `path` open.
fn has_open(pid: u32, path: &Path) -> bool {
    let Ok(fds) = fs::read_dir(format!("/proc/{pid}/fd")) else {
        return false;
    };
    fds.flatten()
        .any(|fd| fs::read_link(fd.path()).is_ok_and(|t| t == path))
}

/// Runs `ingot ARGS`, truncating `victim` to `keep` bytes once `ready(pid)` holds.
fn run_shrinking(
    what: &str,
    args: &[&OsStr],
    victim: &Path,
    keep: u64,
    ready: impl Fn(u32) -> bool,
) -> Run {
    let mut cmd = Command::new(env!("CARGO_BIN_EXE_ingot"));
    cmd.args(args).env_remove("RUST_LOG");
    let mut done = false;
    let r = measured_with(cmd, DEADLINE, |pid| {
        if !done && ready(pid) {
            let f = fs::OpenOptions::new().write(true).open(victim).unwrap();
            f.set_len(keep).unwrap();
            done = true;
        }
    });
    r.print(what);
    assert!(done, "{what}: the file was never truncated\n{}", r.stderr);
    r
}

fn assert_clean_error(what: &str, r: &Run, want: &[&str]) {
    use std::os::unix::process::ExitStatusExt;
    assert_eq!(
        r.status.signal(),
        None,
        "{what}: killed by a signal\n{}",
        r.stderr
    );
    assert_eq!(r.killed, None, "{what}: hung");
    assert!(!r.status.success(), "{what}: succeeded on a shrunk file");
    for w in want {
        assert!(
            r.stderr.contains(w),
            "{what}: stderr lacks {w:?}:\n{}",
            r.stderr
        );
    }
}

fn random_bytes(len: usize) -> Vec<u8> {
    let mut v = vec![0u8; len];
    rand::thread_rng().fill_bytes(&mut v);
    v
}

#[test]
fn verity_verify_of_a_data_file_that_shrinks_is_an_error() {
    let tmp = tempfile::tempdir().unwrap();
    let data = tmp.path().join("data.img");
    let hash = tmp.path().join("data.hash");
    // 2 GiB, sparse but for 8 MiB of random data at the start: verifying it takes a second.
    let mut f = fs::File::create(&data).unwrap();
    f.write_all(&random_bytes(8 << 20)).unwrap();
    f.set_len(2 << 30).unwrap();
    drop(f);
    let out = Command::new(env!("CARGO_BIN_EXE_ingot"))
        .args(["verity", "format", "--root-hash-file"])
        .arg(tmp.path().join("root"))
        .arg(&data)
        .arg(&hash)
        .output()
        .unwrap();
    assert!(out.status.success(), "{out:?}");
    let root = fs::read_to_string(tmp.path().join("root")).unwrap();
    let args = [
        OsStr::new("verity"),
        OsStr::new("verify"),
        data.as_os_str(),
        hash.as_os_str(),
        OsStr::new(root.trim()),
    ];
    let r = run_shrinking(
        "verity verify, data shrunk to 1 MiB",
        &args,
        &data,
        1 << 20,
        |pid| has_open(pid, &data),
    );
    assert_clean_error(
        "verity verify",
        &r,
        &["data.img", "data device ended at byte 1048576", "it shrank"],
    );
    assert_eq!(r.status.code(), Some(1));
}

/// The demo stack with a 96 MiB random file in its base layer (whose data blob is then about
/// as large), built and signed into `dir/NAME`. `flip` changes one byte of the file.
fn demo_with_big_file(dir: &Path, name: &str, big: &[u8], sk: &Path) -> PathBuf {
    let (manifest, base) = demo_copy(dir, name);
    fs::write(base.join("big.bin"), big).unwrap();
    let out = dir.join(name);
    build(&manifest, &out, Some(sk));
    out
}

/// The path of the base layer's data blob in a layout.
fn base_data_blob(layout: &Path) -> PathBuf {
    let l = common::read_layout(layout);
    let base = l.descriptor["layers"]
        .as_array()
        .unwrap()
        .iter()
        .find(|x| x["name"] == "base")
        .unwrap()
        .clone();
    let digest = base["data"]["digest"].as_str().unwrap();
    fs::canonicalize(common::blob_path(layout, digest)).unwrap()
}

fn copy_layout(from: &Path, to: &Path) {
    cp_a(from, to);
}

#[test]
fn verify_and_diff_of_a_data_blob_that_shrinks_are_errors() {
    let tmp = tempfile::tempdir().unwrap();
    let (sk, pk) = keypair(tmp.path(), "k");
    let mut big = random_bytes(96 << 20);
    let a = demo_with_big_file(tmp.path(), "a", &big, &sk);
    big[90 << 20] ^= 1;
    let b = demo_with_big_file(tmp.path(), "b", &big, &sk);
    drop(big);

    // ingot verify: truncate once the image is being decompressed.
    let a1 = tmp.path().join("a1");
    copy_layout(&a, &a1);
    let blob = base_data_blob(&a1);
    let work = tmp.path().join("work");
    fs::create_dir(&work).unwrap();
    let decompressing = |_pid: u32| {
        fs::read_dir(&work).unwrap().flatten().any(|d| {
            let image = d.path().join("image");
            fs::metadata(image).is_ok_and(|m| m.len() > 0)
        })
    };
    let args = [
        OsStr::new("verify"),
        a1.as_os_str(),
        OsStr::new("--trust-key"),
        pk.as_os_str(),
        OsStr::new("--work-dir"),
        work.as_os_str(),
    ];
    let r = run_shrinking(
        "verify, data blob shrunk to 4 MiB",
        &args,
        &blob,
        4 << 20,
        decompressing,
    );
    assert_clean_error("verify", &r, &["layer `base`", "it shrank"]);
    let left: Vec<_> = fs::read_dir(&work)
        .unwrap()
        .flatten()
        .map(|d| d.path())
        .collect();
    assert!(left.is_empty(), "verify left {left:?} behind");

    // ingot diff: truncate A's base blob once diff has it open.
    let a2 = tmp.path().join("a2");
    copy_layout(&a, &a2);
    let blob = base_data_blob(&a2);
    let args = [
        OsStr::new("diff"),
        a2.as_os_str(),
        b.as_os_str(),
        OsStr::new("--trust-key"),
        pk.as_os_str(),
    ];
    let r = run_shrinking(
        "diff, data blob shrunk to 4 MiB",
        &args,
        &blob,
        4 << 20,
        |pid| has_open(pid, &blob),
    );
    assert_clean_error("diff", &r, &["it shrank"]);

    // Intact, the same diff names the one changed file.
    let mut cmd = Command::new(env!("CARGO_BIN_EXE_ingot"));
    cmd.args([OsStr::new("diff"), a.as_os_str(), b.as_os_str()]);
    let r = measured_with(cmd, DEADLINE, |_| {});
    r.print("diff, intact");
    assert_eq!(r.status.code(), Some(1), "{}", r.stderr);
    assert!(r.stdout.contains("~ /big.bin (content)"), "{}", r.stdout);
}
