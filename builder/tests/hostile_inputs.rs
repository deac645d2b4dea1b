//! Hostile local inputs (issue "hostile input, second pass"): tar extension records declaring
//! gigabytes, member paths thousands of directories deep, hard links pointing forward, layout
//! files that are `/dev/zero` or a FIFO, a secret key given as the trusted key. Each run of
//! `ingot` is measured (peak RSS, wall time, printed) and killed at a deadline, so a hang or an
//! unbounded read fails the test instead of hanging it or taking the machine's memory.

mod common;

use std::ffi::OsStr;
use std::fs;
use std::io::Write;
use std::os::unix::fs::symlink;
use std::path::{Path, PathBuf};
use std::time::Duration;

use common::ingot_measured;
use common::{build, demo_manifest, keypair};
use ingot_testkit::measure::Run;

/// Peak RSS a refused input may cost: the process itself, a few buffers.
const RSS_LIMIT_KIB: i64 = 96 << 10;

const DEADLINE: Duration = Duration::from_secs(60);

fn run(what: &str, args: &[&OsStr]) -> Run {
    let r = ingot_measured(args, DEADLINE);
    r.print(what);
    r
}

/// Asserts `r` failed cleanly (exit 1, not killed, no signal), naming `want`, within the RSS limit.
fn assert_refused(what: &str, r: &Run, want: &[&str]) {
    assert_eq!(r.killed, None, "{what}: hung until killed\n{}", r.stderr);
    assert_eq!(r.status.code(), Some(1), "{what}: {r:?}");
    for w in want {
        assert!(
            r.stderr.contains(w),
            "{what}: stderr lacks {w:?}:\n{}",
            r.stderr
        );
    }
    assert!(
        r.max_rss_kib < RSS_LIMIT_KIB,
        "{what}: peak RSS {} KiB",
        r.max_rss_kib
    );
}

/// One ustar header block.
fn header(name: &[u8], kind: u8, size: u64, link: &[u8]) -> [u8; 512] {
    let mut b = [0u8; 512];
    b[..name.len()].copy_from_slice(name);
    b[100..107].copy_from_slice(b"0000644");
    b[108..115].copy_from_slice(b"0000000");
    b[116..123].copy_from_slice(b"0000000");
    b[124..136].copy_from_slice(format!("{size:011o}\0").as_bytes());
    b[136..147].copy_from_slice(b"00000000000");
    b[156] = kind;
    b[157..157 + link.len()].copy_from_slice(link);
    b[257..263].copy_from_slice(b"ustar\0");
    b[263..265].copy_from_slice(b"00");
    b[148..156].fill(b' ');
    let sum: u32 = b.iter().map(|&x| u32::from(x)).sum();
    b[148..156].copy_from_slice(format!("{sum:06o}\0 ").as_bytes());
    b
}

/// A PAX record "LEN KEY=VALUE\n".
fn pax_record(key: &str, value: &[u8]) -> Vec<u8> {
    let body = 1 + key.len() + 1 + value.len() + 1;
    let mut len = body + body.to_string().len();
    if len.to_string().len() + body != len {
        len += 1;
    }
    let mut r = format!("{len} {key}=").into_bytes();
    r.extend_from_slice(value);
    r.push(b'\n');
    assert_eq!(r.len(), len);
    r
}

fn padded(data: &[u8]) -> Vec<u8> {
    let mut d = data.to_vec();
    d.resize(data.len().next_multiple_of(512), 0);
    d
}

/// A tar of `members` (header, data) and the end-of-archive blocks.
fn write_tar(path: &Path, members: &[([u8; 512], Vec<u8>)]) {
    let mut f = fs::File::create(path).unwrap();
    for (h, d) in members {
        f.write_all(h).unwrap();
        f.write_all(&padded(d)).unwrap();
    }
    f.write_all(&[0u8; 1024]).unwrap();
}

fn layer_build(what: &str, src: &OsStr, dir: &Path) -> Run {
    let out = dir.join(format!("{what}.img"));
    run(
        what,
        &[
            OsStr::new("layer"),
            OsStr::new("build"),
            src,
            out.as_os_str(),
        ],
    )
}

/// Item 7: an extension record (PAX header, GNU long name or long link) declaring 512 MiB is
/// refused before it is allocated. The archive is sparse: 512 MiB long, a few KiB on disk.
#[test]
fn tar_extension_records_are_capped_not_allocated_at_their_declared_size() {
    let tmp = tempfile::tempdir().unwrap();
    let declared: u64 = 512 << 20;
    for (kind, what) in [
        (b'x', "pax header"),
        (b'L', "long name"),
        (b'K', "long link name"),
    ] {
        let path = tmp.path().join(format!("ext-{}.tar", kind as char));
        let mut f = fs::File::create(&path).unwrap();
        f.write_all(&header(b"././@LongLink", kind, declared, b""))
            .unwrap();
        // The declared data (zeros, a hole), then a member and the end of the archive.
        f.set_len(512 + declared).unwrap();
        drop(f);
        let mut f = fs::OpenOptions::new().append(true).open(&path).unwrap();
        f.write_all(&header(b"file", b'0', 0, b"")).unwrap();
        f.write_all(&[0u8; 1024]).unwrap();
        let r = layer_build(
            &format!("extension-{}", kind as char),
            path.as_os_str(),
            tmp.path(),
        );
        assert_refused(
            what,
            &r,
            &[
                what,
                &format!("{declared} bytes"),
                "more than the 1048576 bytes",
            ],
        );
    }
    // A real PAX path of 3000 bytes (under the caps) still builds.
    let long: Vec<u8> = (0..30)
        .flat_map(|i| format!("d{i:02}-{}/", "x".repeat(95)).into_bytes())
        .chain(*b"f")
        .collect();
    let ok = tmp.path().join("long-ok.tar");
    let rec = pax_record("path", &long);
    write_tar(
        &ok,
        &[
            (header(b"PaxHeader", b'x', rec.len() as u64, b""), rec),
            (header(b"short", b'0', 3, b""), b"hi\n".to_vec()),
        ],
    );
    let r = layer_build("long-ok", ok.as_os_str(), tmp.path());
    assert!(r.status.success(), "{}", r.stderr);
}

/// Item 8: a member 45,000 directories deep (a 92 KB archive) is refused by its path length,
/// one 300 deep by its depth, naming the limits, in bounded memory.
#[test]
fn deep_member_paths_are_refused_by_length_and_depth() {
    let tmp = tempfile::tempdir().unwrap();
    let cases: [(&str, Vec<u8>, &[&str]); 2] = [
        (
            "deep-long",
            b"a/".repeat(45_000).into_iter().chain(*b"f").collect(),
            &["90001 bytes", "4096 bytes (PATH_MAX)"],
        ),
        (
            "deep-300",
            b"a/".repeat(300).into_iter().chain(*b"f").collect(),
            &["301 components deep", "more than the 256 accepted"],
        ),
    ];
    for (what, path, want) in cases {
        let rec = pax_record("path", &path);
        let tar = tmp.path().join(format!("{what}.tar"));
        write_tar(
            &tar,
            &[
                (header(b"PaxHeader", b'x', rec.len() as u64, b""), rec),
                (header(b"f", b'0', 0, b""), Vec::new()),
            ],
        );
        eprintln!(
            "{what}: archive of {} bytes",
            fs::metadata(&tar).unwrap().len()
        );
        let r = layer_build(what, tar.as_os_str(), tmp.path());
        assert_refused(what, &r, want);
    }
    // A directory source 300 deep is refused the same way.
    let mut deep = tmp.path().join("tree");
    for _ in 0..300 {
        deep.push("a");
    }
    fs::create_dir_all(&deep).unwrap();
    let r = layer_build("deep-dir", tmp.path().join("tree").as_os_str(), tmp.path());
    assert_refused(
        "deep-dir",
        &r,
        &["components deep", "more than the 256 accepted"],
    );
    // 256 deep is fine.
    let mut ok = tmp.path().join("ok");
    for _ in 0..255 {
        ok.push("a");
    }
    fs::create_dir_all(&ok).unwrap();
    fs::write(ok.join("f"), b"x").unwrap();
    let r = layer_build("dir-256", tmp.path().join("ok").as_os_str(), tmp.path());
    assert!(r.status.success(), "{}", r.stderr);
}

/// Item 20: a hard link to a member that comes later says so; one to a missing member says
/// it is not in the archive.
#[test]
fn hard_link_to_a_later_member_says_it_points_forward() {
    let tmp = tempfile::tempdir().unwrap();
    let forward = tmp.path().join("forward.tar");
    write_tar(
        &forward,
        &[
            (header(b"link", b'1', 0, b"target"), Vec::new()),
            (header(b"target", b'0', 3, b""), b"hi\n".to_vec()),
        ],
    );
    let r = layer_build("forward", forward.as_os_str(), tmp.path());
    assert_refused(
        "forward",
        &r,
        &["\"link\"", "\"target\"", "points forward to a later member"],
    );
    let missing = tmp.path().join("missing.tar");
    write_tar(
        &missing,
        &[(header(b"link", b'1', 0, b"nowhere"), Vec::new())],
    );
    let r = layer_build("missing", missing.as_os_str(), tmp.path());
    assert_refused("missing", &r, &["\"nowhere\" is not in the archive"]);
    assert!(!r.stderr.contains("forward"), "{}", r.stderr);
}

/// The demo stack, built and signed: (layout, public key, secret key).
fn demo(dir: &Path) -> (PathBuf, PathBuf, PathBuf) {
    let (sk, pk) = keypair(dir, "k");
    let layout = dir.join("layout");
    build(&demo_manifest(), &layout, Some(&sk));
    (layout, pk, sk)
}

fn mkfifo(path: &Path) {
    let c = std::ffi::CString::new(path.as_os_str().as_encoded_bytes()).unwrap();
    // SAFETY: a NUL-terminated path; mkfifo only reads it.
    #[allow(unsafe_code)]
    let rc = unsafe { libc::mkfifo(c.as_ptr(), 0o600) };
    assert_eq!(rc, 0, "mkfifo: {}", std::io::Error::last_os_error());
}

/// Replaces `path` with a symlink to /dev/zero or a FIFO, runs `check`, restores it.
fn with_hostile(path: &Path, check: impl Fn(&str)) {
    let saved = path.with_extension("saved");
    fs::rename(path, &saved).unwrap();
    symlink("/dev/zero", path).unwrap();
    check("a symlink to /dev/zero");
    fs::remove_file(path).unwrap();
    mkfifo(path);
    check("a FIFO");
    fs::remove_file(path).unwrap();
    fs::rename(&saved, path).unwrap();
}

/// Item 11: `index.json`, a manifest blob or a layer blob that is /dev/zero or a FIFO is
/// refused at once by `ingot inspect`, `ingot verify` and `ingot layer build oci:` (before,
/// a FIFO hung the open and /dev/zero was read until memory ran out).
#[test]
fn layout_files_that_are_devices_or_fifos_are_refused_not_read() {
    let tmp = tempfile::tempdir().unwrap();
    let (layout, pk, _) = demo(tmp.path());
    let l = layout.as_os_str();
    let index = layout.join("index.json");
    let manifest = common::read_layout(&layout).manifest_digest.clone();
    let manifest_blob = common::blob_path(&layout, &manifest);
    for (name, path) in [
        ("index.json", &index),
        ("the manifest blob", &manifest_blob),
    ] {
        with_hostile(path, |as_what| {
            for (cmd, args) in [
                ("inspect", vec![OsStr::new("inspect"), l]),
                (
                    "verify",
                    vec![
                        OsStr::new("verify"),
                        l,
                        OsStr::new("--trust-key"),
                        pk.as_os_str(),
                    ],
                ),
            ] {
                let what = format!("{cmd} with {name} as {as_what}");
                let r = run(&what, &args);
                assert_eq!(r.killed, None, "{what}: hung");
                assert!(!r.status.success(), "{what}: {}", r.stderr);
                assert!(
                    r.stderr.contains("not a regular file"),
                    "{what}: {}",
                    r.stderr
                );
                assert!(
                    r.max_rss_kib < RSS_LIMIT_KIB,
                    "{what}: {} KiB",
                    r.max_rss_kib
                );
            }
        });
    }

    // `ingot layer build oci:` on a small OCI image layout.
    let image = tmp.path().join("image");
    common::cp_a(
        &common::repo().join("tests/fixtures/images/kata-rootfs"),
        &image,
    );
    let src = format!("oci:{}", image.display());
    let r = layer_build("oci-intact", OsStr::new(&src), tmp.path());
    assert!(r.status.success(), "{}", r.stderr);
    let idx: serde_json::Value =
        serde_json::from_slice(&fs::read(image.join("index.json")).unwrap()).unwrap();
    let mdigest = idx["manifests"][0]["digest"].as_str().unwrap().to_owned();
    let mpath = common::blob_path(&image, &mdigest);
    let m: serde_json::Value = serde_json::from_slice(&fs::read(&mpath).unwrap()).unwrap();
    let ldigest = m["layers"][0]["digest"].as_str().unwrap().to_owned();
    let lpath = common::blob_path(&image, &ldigest);
    for (name, path) in [
        ("index.json", image.join("index.json")),
        ("the manifest blob", mpath),
        ("a layer blob", lpath),
    ] {
        with_hostile(&path, |as_what| {
            let what = format!("layer build oci: with {name} as {as_what}");
            let r = layer_build("oci", OsStr::new(&src), tmp.path());
            r.print(&what);
            assert_refused(&what, &r, &["not a regular file"]);
        });
    }
}

/// Item 11 and 20: `--trust-key` from /dev/zero, a FIFO or a huge file is refused unread; a
/// minisign secret key given as the trusted key is named as such.
#[test]
fn trust_key_is_read_bounded_and_a_secret_key_is_named() {
    let tmp = tempfile::tempdir().unwrap();
    let (layout, _, sk) = demo(tmp.path());
    let l = layout.as_os_str();
    let fifo = tmp.path().join("key.fifo");
    mkfifo(&fifo);
    let big = tmp.path().join("big.pub");
    fs::File::create(&big).unwrap().set_len(1 << 30).unwrap();
    for (what, key, want) in [
        ("/dev/zero", Path::new("/dev/zero"), "not a regular file"),
        ("a FIFO", fifo.as_path(), "not a regular file"),
        (
            "a 1 GiB file",
            big.as_path(),
            "more than the 16384 accepted",
        ),
    ] {
        let what = format!("verify --trust-key {what}");
        let r = run(
            &what,
            &[
                OsStr::new("verify"),
                l,
                OsStr::new("--trust-key"),
                key.as_os_str(),
            ],
        );
        assert_refused(&what, &r, &["reading the public key", want]);
    }
    let r = run(
        "verify --trust-key SECRET",
        &[
            OsStr::new("verify"),
            l,
            OsStr::new("--trust-key"),
            sk.as_os_str(),
        ],
    );
    assert!(!r.status.success());
    assert!(
        r.stderr.contains("it is a minisign secret key")
            && r.stderr.contains("give its public key"),
        "{}",
        r.stderr
    );
}
