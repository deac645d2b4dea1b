//! ext4 layer images checked against the real tools: e2fsck, debugfs, the kernel (loop mount),
//! veritysetup. A Rust-only round trip would prove nothing, so every test asks one of them.

mod common;

use std::fs;
use std::path::Path;
use std::process::Command;

use common::*;
use ingot_layers::{build_image, build_layer, Ext4Options, LayerError, Source};

fn opts(seed: &str) -> Ext4Options {
    Ext4Options {
        seed: seed.as_bytes().to_vec(),
        source_date_epoch: 1_700_000_000,
        ..Default::default()
    }
}

const FEATURES: &[&str] = &[
    "ext_attr",
    "dir_index",
    "filetype",
    "extent",
    "flex_bg",
    "sparse_super",
    "large_file",
    "huge_file",
    "dir_nlink",
    "extra_isize",
    "metadata_csum",
];

#[test]
fn varied_tree_passes_e2fsck_and_mounts_identically() {
    let t = tempfile::tempdir().unwrap();
    let src = t.path().join("src");
    varied_tree(&src, true);
    let img = t.path().join("layer.img");
    let info = build_image(&Source::Dir(src.clone()), &img, &opts("stack 1.0 base")).unwrap();
    assert_eq!(fs::metadata(&img).unwrap().len(), info.size);
    e2fsck_clean(&img);
    let feats = debugfs_features(&img);
    for f in FEATURES {
        assert!(
            feats.iter().any(|x| x == f),
            "feature {f} missing from {feats:?}"
        );
    }
    assert!(
        !feats.iter().any(|x| x == "has_journal"),
        "image has a journal: {feats:?}"
    );
    // The 20,000-entry directory is hashed.
    let out = Command::new(tool("debugfs"))
        .args(["-R", "htree /huge"])
        .arg(&img)
        .output()
        .unwrap();
    let text = String::from_utf8_lossy(&out.stdout);
    assert!(
        text.contains("Root node dump"),
        "/huge is not an htree directory:\n{}",
        &text[..text.len().min(2000)]
    );
    // ext4-view (ingot's own reader) finds names that hash differently signed and unsigned.
    let fs4 = ext4_view::Ext4::load(Box::new(fs::read(&img).unwrap())).unwrap();
    for name in NON_ASCII {
        let path = format!("/huge/{name}");
        assert_eq!(fs4.read(path.as_str()).unwrap(), name.as_bytes(), "{path}");
    }
    // The 5 GiB sparse file keeps its holes: the image is far smaller than the file.
    assert!(
        info.size < 512 << 20,
        "image of {} bytes: holes were filled",
        info.size
    );

    if skip_unless_root(ingot_testkit::test_name!()) {
        return;
    }
    let m = LoopMount::new(&img, &t.path().join("mnt"));
    compare_trees(&src, &m.dir);
}

#[test]
fn every_timestamp_is_the_epoch() {
    if skip_unless_root(ingot_testkit::test_name!()) {
        return;
    }
    let t = tempfile::tempdir().unwrap();
    let src = t.path().join("src");
    varied_tree(&src, false);
    let img = t.path().join("l.img");
    // Past 2038: the *_extra epoch bits carry it.
    let epoch = 4_102_444_800; // 2100-01-01
    build_image(
        &Source::Dir(src),
        &img,
        &Ext4Options {
            source_date_epoch: epoch,
            ..opts("t")
        },
    )
    .unwrap();
    // A superblock written "in the future" is e2fsck's only objection to a 2100 epoch; tell it
    // the clock is not to be trusted, as a build host's may not be.
    let conf = t.path().join("e2fsck.conf");
    fs::write(&conf, "[options]\n\tbroken_system_clock = 1\n").unwrap();
    e2fsck_clean_with(&img, &[("E2FSCK_CONFIG", &conf)]);
    let m = LoopMount::new(&img, &t.path().join("mnt"));
    let out = Command::new("find")
        .arg(&m.dir)
        .args(["-printf", "%T@ %A@ %C@\n"])
        .output()
        .unwrap();
    let text = String::from_utf8_lossy(&out.stdout);
    let want = format!("{epoch}.0000000000");
    for line in text.lines() {
        for field in line.split(' ') {
            assert_eq!(field, want, "timestamp {field} is not the epoch");
        }
    }
    assert!(text.lines().count() > 100);
}

#[test]
fn shuffled_copy_with_other_mtimes_builds_the_same_bytes() {
    let t = tempfile::tempdir().unwrap();
    let (a, b) = (t.path().join("a"), t.path().join("b"));
    varied_tree(&a, false);
    // One more 20,000-entry directory makes the hashed-directory path part of the comparison.
    fs::create_dir(a.join("many")).unwrap();
    for i in 0..20_000 {
        fs::write(a.join(format!("many/{i}")), i.to_string()).unwrap();
    }
    copy_tree_shuffled(&a, &b);
    let (ia, ib) = (t.path().join("a.img"), t.path().join("b.img"));
    build_image(&Source::Dir(a.clone()), &ia, &opts("stack 1.0 base")).unwrap();
    build_image(&Source::Dir(b), &ib, &opts("stack 1.0 base")).unwrap();
    let (x, y) = (fs::read(&ia).unwrap(), fs::read(&ib).unwrap());
    assert!(x == y, "images of the same tree differ");
    e2fsck_clean(&ia);
    // Another seed: another UUID and hash seed, so other bytes.
    let ic = t.path().join("c.img");
    build_image(&Source::Dir(a), &ic, &opts("stack 1.1 base")).unwrap();
    assert!(
        fs::read(&ic).unwrap() != x,
        "the seed does not reach the image"
    );
}

#[test]
fn tar_sources_match_the_directory_source() {
    let t = tempfile::tempdir().unwrap();
    let src = t.path().join("src");
    varied_tree(&src, false);
    // GNU tar does not archive sockets.
    fs::remove_file(src.join("tmp/sock")).unwrap();
    let dir_img = t.path().join("dir.img");
    build_image(&Source::Dir(src.clone()), &dir_img, &opts("x")).unwrap();
    // GNU tar with xattrs (PAX SCHILY.xattr.*), numeric owners, then gzip and zstd copies.
    let tarball = t.path().join("src.tar");
    let st = Command::new("tar")
        .args([
            "--xattrs",
            "--xattrs-include=*",
            "--numeric-owner",
            "--sort=name",
            "-cf",
        ])
        .arg(&tarball)
        .arg("-C")
        .arg(&src)
        .arg(".")
        .status()
        .unwrap();
    assert!(st.success());
    let plain = fs::read(&tarball).unwrap();
    let gz = t.path().join("src.tar.gz");
    let mut enc =
        flate2::write::GzEncoder::new(fs::File::create(&gz).unwrap(), flate2::Compression::fast());
    std::io::Write::write_all(&mut enc, &plain).unwrap();
    enc.finish().unwrap();
    let zst = t.path().join("src.tar.zst");
    fs::write(&zst, zstd::encode_all(&plain[..], 3).unwrap()).unwrap();
    let want = fs::read(&dir_img).unwrap();
    for (name, archive) in [("plain", &tarball), ("gzip", &gz), ("zstd", &zst)] {
        let img = t.path().join(format!("{name}.img"));
        build_image(&Source::Tar(archive.clone()), &img, &opts("x")).unwrap();
        e2fsck_clean(&img);
        assert!(
            fs::read(&img).unwrap() == want,
            "{name} tar image differs from the directory image"
        );
        if is_root() {
            let m = LoopMount::new(&img, &t.path().join(format!("mnt-{name}")));
            compare_trees(&src, &m.dir);
        }
    }
    assert!(
        listing(t.path()).iter().all(|n| !n.starts_with(".ingot")),
        "temporary files left: {:?}",
        listing(t.path())
    );
}

/// A tar archive written header by header, so names the `tar` crate's builder would refuse can
/// be tested.
/// (name, type flag, link target, data) of one raw tar member.
type RawMember<'a> = (&'a [u8], u8, &'a [u8], &'a [u8]);
/// The owned form of [`RawMember`].
type OwnedMember = (Vec<u8>, u8, Vec<u8>, Vec<u8>);

fn raw_tar(members: &[RawMember<'_>]) -> Vec<u8> {
    let mut out = Vec::new();
    let mut push = |name: &[u8], kind: u8, link: &[u8], data: &[u8]| {
        let mut h = tar::Header::new_gnu();
        if name.len() > 99 {
            let mut long = tar::Header::new_gnu();
            long.as_gnu_mut().unwrap().name[..13].copy_from_slice(b"././@LongLink");
            long.set_entry_type(tar::EntryType::GNULongName);
            long.set_size(name.len() as u64 + 1);
            long.set_mode(0o644);
            long.set_cksum();
            out.extend_from_slice(long.as_bytes());
            let mut n = name.to_vec();
            n.push(0);
            n.resize(n.len().next_multiple_of(512), 0);
            out.extend_from_slice(&n);
        } else {
            h.as_gnu_mut().unwrap().name[..name.len()].copy_from_slice(name);
        }
        h.set_entry_type(tar::EntryType::new(kind));
        h.as_gnu_mut().unwrap().linkname[..link.len()].copy_from_slice(link);
        h.set_size(data.len() as u64);
        h.set_mode(if kind == b'5' { 0o755 } else { 0o644 });
        h.set_uid(0);
        h.set_gid(0);
        h.set_mtime(0);
        h.set_cksum();
        out.extend_from_slice(h.as_bytes());
        let mut d = data.to_vec();
        d.resize(d.len().next_multiple_of(512), 0);
        out.extend_from_slice(&d);
    };
    for (name, kind, link, data) in members {
        push(name, *kind, link, data);
    }
    out.extend_from_slice(&[0u8; 1024]);
    out
}

fn expect_failure(src: Source, dir: &Path, what: &str) -> LayerError {
    let before = listing(dir);
    let out = dir.join("out.img");
    let hash = dir.join("out.hash");
    let err = build_layer(&src, &out, Some(&hash), &opts("bad")).expect_err(what);
    assert_eq!(listing(dir), before, "{what}: files left behind");
    err
}

#[test]
fn bad_inputs_fail_cleanly_naming_the_entry() {
    let t = tempfile::tempdir().unwrap();
    let d = t.path();
    let cases: Vec<(&str, Vec<u8>, &str)> = vec![
        (
            "dotdot",
            raw_tar(&[
                (b"ok", b'0', b"", b"x"),
                (b"a/../../etc/passwd", b'0', b"", b"x"),
            ]),
            "a/../../etc/passwd",
        ),
        (
            "absolute",
            raw_tar(&[(b"/etc/shadow", b'0', b"", b"x")]),
            "/etc/shadow",
        ),
        (
            "hardlink-out",
            raw_tar(&[
                (b"ok", b'0', b"", b"x"),
                (b"link", b'1', b"../outside", b""),
            ]),
            "link",
        ),
        (
            "hardlink-missing",
            raw_tar(&[(b"link", b'1', b"nothing", b"")]),
            "link",
        ),
        (
            "long-name",
            raw_tar(&[(&[b'n'; 256], b'0', b"", b"x")]),
            "nnnn",
        ),
    ];
    for (what, bytes, needle) in cases {
        let p = d.join(format!("{what}.tar"));
        fs::write(&p, bytes).unwrap();
        let err = expect_failure(Source::Tar(p.clone()), d, what);
        let msg = err.to_string();
        assert!(
            msg.contains(needle),
            "{what}: error {msg:?} does not name {needle:?}"
        );
        fs::remove_file(p).unwrap();
    }
    // Truncated archives: inside a member's data, at a member boundary (no end marker), and a
    // truncated gzip stream.
    let good = raw_tar(&[
        (b"a", b'0', b"", &bytes(1, 5000)),
        (b"b", b'0', b"", &bytes(2, 3000)),
    ]);
    for (what, cut) in [
        ("mid-data", 1024),
        ("boundary", 512 + 5120),
        ("mid-header", 512 + 5120 + 100),
    ] {
        let p = d.join("trunc.tar");
        fs::write(&p, &good[..cut]).unwrap();
        let msg = expect_failure(Source::Tar(p.clone()), d, what).to_string();
        assert!(msg.contains("trunc.tar"), "{what}: {msg}");
        fs::remove_file(p).unwrap();
    }
    let mut enc = flate2::write::GzEncoder::new(Vec::new(), flate2::Compression::fast());
    std::io::Write::write_all(&mut enc, &good).unwrap();
    let gz = enc.finish().unwrap();
    let p = d.join("trunc.tar.gz");
    fs::write(&p, &gz[..gz.len() / 2]).unwrap();
    let msg = expect_failure(Source::Tar(p.clone()), d, "gzip").to_string();
    assert!(msg.contains("trunc.tar.gz"), "{msg}");
    fs::remove_file(p).unwrap();
    // The good archive builds (so the failures above are about the damage).
    let p = d.join("good.tar");
    fs::write(&p, &good).unwrap();
    build_image(&Source::Tar(p), &d.join("good.img"), &opts("x")).unwrap();
    e2fsck_clean(&d.join("good.img"));
}

#[test]
fn unreadable_file_fails_cleanly() {
    let t = tempfile::tempdir().unwrap();
    let src = t.path().join("src");
    fs::create_dir_all(src.join("etc")).unwrap();
    fs::write(src.join("etc/ok"), b"fine").unwrap();
    fs::write(src.join("etc/locked"), b"secret").unwrap();
    use std::os::unix::fs::PermissionsExt;
    fs::set_permissions(src.join("etc/locked"), fs::Permissions::from_mode(0o000)).unwrap();
    let out_dir = t.path().join("out");
    fs::create_dir(&out_dir).unwrap();
    fs::set_permissions(&out_dir, fs::Permissions::from_mode(0o777)).unwrap();
    fs::set_permissions(t.path(), fs::Permissions::from_mode(0o755)).unwrap();
    let run = {
        let (src, out_dir) = (src.clone(), out_dir.clone());
        move || {
            if is_root() {
                // Root reads anything; drop to an unprivileged filesystem identity on this
                // thread only (setfsuid also drops CAP_DAC_OVERRIDE for it).
                // SAFETY: setfsgid/setfsuid take plain integers and affect only this thread.
                #[allow(unsafe_code)] // no safe wrapper for a per-thread filesystem identity
                unsafe {
                    libc::setfsgid(65534);
                    libc::setfsuid(65534);
                }
            }
            build_layer(
                &Source::Dir(src),
                &out_dir.join("o.img"),
                Some(&out_dir.join("o.hash")),
                &opts("x"),
            )
        }
    };
    let err = std::thread::spawn(run)
        .join()
        .unwrap()
        .expect_err("unreadable file must fail");
    let msg = err.to_string();
    assert!(
        msg.contains("etc/locked"),
        "error does not name the file: {msg}"
    );
    assert!(
        listing(&out_dir).is_empty(),
        "left behind: {:?}",
        listing(&out_dir)
    );
}

#[test]
fn verity_tree_matches_veritysetup() {
    let t = tempfile::tempdir().unwrap();
    let src = t.path().join("src");
    varied_tree(&src, false);
    let (img, hash) = (t.path().join("l.img"), t.path().join("l.hash"));
    let built = build_layer(&Source::Dir(src), &img, Some(&hash), &opts("stack 2 base")).unwrap();
    let v = built.verity.expect("verity requested");
    use sha2::Digest;
    assert_eq!(
        v.salt,
        hex::encode(sha2::Sha256::digest(fs::read(&img).unwrap())),
        "salt is the image digest"
    );
    let root = v.root_hash.to_string();
    let st = Command::new(tool("veritysetup"))
        .arg("verify")
        .arg(&img)
        .arg(&hash)
        .arg(&root)
        .status()
        .unwrap();
    assert!(st.success(), "veritysetup verify rejected the tree");
    // veritysetup format with the same salt and UUID writes the same hash file.
    let theirs = t.path().join("theirs.hash");
    // The descriptor's text form is what veritysetup takes and prints back.
    let uuid = v.uuid.clone().expect("a superblock UUID");
    let out = Command::new(tool("veritysetup"))
        .arg("format")
        .arg(&img)
        .arg(&theirs)
        .arg(format!("--salt={}", v.salt))
        .arg(format!("--uuid={uuid}"))
        .arg(format!("--hash={}", v.algorithm))
        .arg(format!("--format={}", v.hash_type))
        .arg(format!("--data-block-size={}", v.data_block_size))
        .arg(format!("--hash-block-size={}", v.hash_block_size))
        .arg(format!("--data-blocks={}", v.data_blocks))
        .output()
        .unwrap();
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let printed = String::from_utf8_lossy(&out.stdout);
    let field = |name: &str| {
        printed
            .lines()
            .find_map(|l| l.strip_prefix(name)?.strip_prefix(':'))
            .map(|v| v.trim().to_owned())
            .unwrap_or_else(|| panic!("veritysetup printed no {name}: {printed}"))
    };
    assert_eq!(
        field("Root hash"),
        root,
        "root hash differs from veritysetup's"
    );
    assert_eq!(field("Salt"), v.salt);
    assert_eq!(field("UUID"), uuid);
    assert_eq!(field("Hash algorithm"), v.algorithm);
    assert_eq!(field("Hash type"), v.hash_type.to_string());
    assert_eq!(field("Data blocks"), v.data_blocks.to_string());
    assert_eq!(field("Data block size"), v.data_block_size.to_string());
    assert_eq!(field("Hash block size"), v.hash_block_size.to_string());
    let params = v.params().unwrap();
    assert_eq!(
        ingot_layers::descriptor::VerityInfo::new(v.root_hash.clone(), &params),
        v
    );
    assert!(
        fs::read(&theirs).unwrap() == fs::read(&hash).unwrap(),
        "hash file differs from veritysetup's"
    );
    assert_eq!(built.data_blocks * 4096, built.image_size);
}

#[test]
fn requested_size_adds_free_space() {
    let t = tempfile::tempdir().unwrap();
    let src = t.path().join("src");
    varied_tree(&src, false);
    let img = t.path().join("l.img");
    let size = 1u64 << 30; // eight block groups, with backup superblocks in groups 1, 3, 5, 7
    let info = build_image(
        &Source::Dir(src.clone()),
        &img,
        &Ext4Options {
            size: Some(size),
            ..opts("s")
        },
    )
    .unwrap();
    assert_eq!(info.size, size);
    assert!(info.used_blocks < info.blocks);
    e2fsck_clean(&img);
    let small = build_image(
        &Source::Dir(src),
        &t.path().join("tiny.img"),
        &Ext4Options {
            size: Some(1 << 20),
            ..opts("s")
        },
    );
    assert!(matches!(small, Err(LayerError::TooLarge(_))), "{small:?}");
    assert!(!t.path().join("tiny.img").exists());
}

#[test]
fn file_data_crossing_backup_superblocks() {
    // Files large enough to span several block groups: their extents must step over the backup
    // superblocks and group descriptor copies in groups 1 and 3.
    let t = tempfile::tempdir().unwrap();
    let src = t.path().join("src");
    fs::create_dir(&src).unwrap();
    fs::write(src.join("a"), bytes(1, 150 << 20)).unwrap();
    fs::write(src.join("b"), bytes(2, 200_000)).unwrap();
    fs::write(src.join("c"), bytes(3, 250 << 20)).unwrap();
    let img = t.path().join("l.img");
    build_image(&Source::Dir(src.clone()), &img, &opts("big")).unwrap();
    e2fsck_clean(&img);
    if skip_unless_root(ingot_testkit::test_name!()) {
        return;
    }
    let m = LoopMount::new(&img, &t.path().join("mnt"));
    compare_trees(&src, &m.dir);
}

#[test]
fn oci_layout_is_flattened_with_whiteouts() {
    let t = tempfile::tempdir().unwrap();
    let lay = t.path().join("oci");
    let (dm, d2) = two_layer_oci_layout(&lay);
    // The same filesystem as a directory: the oracle.
    let want = t.path().join("want");
    flattened_tree(&want);
    let img = t.path().join("oci.img");
    let src = Source::OciLayout {
        path: lay.clone(),
        manifest_digest: dm.clone(),
    };
    build_image(&src, &img, &opts("o")).unwrap();
    e2fsck_clean(&img);
    let img2 = t.path().join("want.img");
    if is_root() {
        build_image(&Source::Dir(want.clone()), &img2, &opts("o")).unwrap();
        assert!(
            fs::read(&img).unwrap() == fs::read(&img2).unwrap(),
            "flattened OCI image differs from the expected tree's image"
        );
        let m = LoopMount::new(&img, &t.path().join("mnt"));
        compare_trees(&want, &m.dir);
    } else {
        skip(
            "oci mount comparison and equality with a directory build",
            "needs root",
        );
    }
    // The empty digest takes index.json's only manifest; a wrong digest is refused.
    build_image(
        &Source::OciLayout {
            path: lay.clone(),
            manifest_digest: String::new(),
        },
        &t.path().join("idx.img"),
        &opts("o"),
    )
    .unwrap();
    assert!(fs::read(t.path().join("idx.img")).unwrap() == fs::read(&img).unwrap());
    fs::write(lay.join("blobs/sha256").join(&d2[7..]), b"tampered").unwrap();
    let err = build_image(&src, &t.path().join("bad.img"), &opts("o")).unwrap_err();
    assert!(err.to_string().contains(&d2), "{err}");
}

/// An OCI layout at `lay` with two layers (gzip, then zstd) whose second deletes a file,
/// makes a directory opaque and replaces a file; returns the manifest's and the second
/// layer's digests.
fn two_layer_oci_layout(lay: &Path) -> (String, String) {
    fs::create_dir_all(lay.join("blobs/sha256")).unwrap();
    let put = |data: &[u8]| -> (String, u64) {
        use sha2::Digest;
        let hex = hex::encode(sha2::Sha256::digest(data));
        fs::write(lay.join("blobs/sha256").join(&hex), data).unwrap();
        (format!("sha256:{hex}"), data.len() as u64)
    };
    let dir = |name: &[u8]| (name.to_vec(), b'5', Vec::new(), Vec::new());
    let file = |name: &[u8], data: &[u8]| (name.to_vec(), b'0', Vec::new(), data.to_vec());
    let mk = |m: Vec<OwnedMember>| {
        let v: Vec<RawMember<'_>> = m
            .iter()
            .map(|(a, k, l, d)| (a.as_slice(), *k, l.as_slice(), d.as_slice()))
            .collect();
        raw_tar(&v)
    };
    let l1 = mk(vec![
        dir(b"etc"),
        file(b"etc/keep", b"keep"),
        file(b"etc/gone", b"gone"),
        dir(b"opaque"),
        file(b"opaque/old", b"old"),
        file(b"bin", b"v1"),
    ]);
    let l2 = mk(vec![
        file(b"etc/.wh.gone", b""),
        dir(b"opaque"),
        file(b"opaque/.wh..wh..opq", b""),
        file(b"opaque/new", b"new"),
        file(b"bin", b"v2"),
        (b"bin-link".to_vec(), b'1', b"bin".to_vec(), Vec::new()),
    ]);
    let mut gz = flate2::write::GzEncoder::new(Vec::new(), flate2::Compression::fast());
    std::io::Write::write_all(&mut gz, &l1).unwrap();
    let (d1, s1) = put(&gz.finish().unwrap());
    let (d2, s2) = put(&zstd::encode_all(&l2[..], 3).unwrap());
    let (dc, sc) = put(b"{}");
    let manifest = serde_json::json!({
        "schemaVersion": 2,
        "mediaType": "application/vnd.oci.image.manifest.v1+json",
        "config": {"mediaType": "application/vnd.oci.image.config.v1+json", "digest": dc, "size": sc},
        "layers": [
            {"mediaType": "application/vnd.oci.image.layer.v1.tar+gzip", "digest": d1, "size": s1},
            {"mediaType": "application/vnd.oci.image.layer.v1.tar+zstd", "digest": d2, "size": s2},
        ],
    });
    let (dm, sm) = put(serde_json::to_string(&manifest).unwrap().as_bytes());
    let index = serde_json::json!({"schemaVersion": 2, "manifests": [{"mediaType": "application/vnd.oci.image.manifest.v1+json", "digest": dm, "size": sm}]});
    fs::write(
        lay.join("index.json"),
        serde_json::to_string(&index).unwrap(),
    )
    .unwrap();
    fs::write(lay.join("oci-layout"), br#"{"imageLayoutVersion":"1.0.0"}"#).unwrap();
    (dm, d2)
}

/// What `two_layer_oci_layout` flattens to, as a directory at `want`.
fn flattened_tree(want: &Path) {
    for p in ["etc", "opaque"] {
        fs::create_dir_all(want.join(p)).unwrap();
    }
    fs::write(want.join("etc/keep"), b"keep").unwrap();
    fs::write(want.join("opaque/new"), b"new").unwrap();
    fs::write(want.join("bin"), b"v2").unwrap();
    fs::hard_link(want.join("bin"), want.join("bin-link")).unwrap();
    use std::os::unix::fs::PermissionsExt;
    for p in ["", "etc", "opaque"] {
        fs::set_permissions(want.join(p), fs::Permissions::from_mode(0o755)).unwrap();
    }
    for p in ["etc/keep", "opaque/new", "bin"] {
        fs::set_permissions(want.join(p), fs::Permissions::from_mode(0o644)).unwrap();
    }
}

#[test]
fn dir_nlink_past_65000_subdirectories() {
    // 65,001 subdirectories: the parent's link count would pass ext4's 65,000 limit, so it is
    // stored as 1 (dir_nlink); e2fsck checks that, and the directory is hashed.
    let t = tempfile::tempdir().unwrap();
    let names: Vec<Vec<u8>> = (0..65_001)
        .map(|i| format!("top/d{i:05}/").into_bytes())
        .collect();
    let mut members: Vec<RawMember<'_>> = vec![(b"top/", b'5', b"", b"")];
    members.extend(
        names
            .iter()
            .map(|n| (n.as_slice(), b'5', &b""[..], &b""[..])),
    );
    let tarball = t.path().join("dirs.tar");
    fs::write(&tarball, raw_tar(&members)).unwrap();
    let img = t.path().join("dirs.img");
    build_image(&Source::Tar(tarball), &img, &opts("nlink")).unwrap();
    e2fsck_clean(&img);
    let out = Command::new(tool("debugfs"))
        .args(["-R", "stat /top"])
        .arg(&img)
        .output()
        .unwrap();
    let text = String::from_utf8_lossy(&out.stdout);
    assert!(
        text.contains("Links: 1 "),
        "/top link count is not 1:\n{text}"
    );
    if skip_unless_root(ingot_testkit::test_name!()) {
        return;
    }
    let m = LoopMount::new(&img, &t.path().join("mnt"));
    assert_eq!(fs::read_dir(m.dir.join("top")).unwrap().count(), 65_001);
}

#[test]
fn shared_xattr_blocks_hold_at_most_1024_inodes() {
    // 2,500 files with one identical set of attributes too big for the inode: three shared
    // blocks (1024 + 1024 + 452 references), each refcount checked by e2fsck.
    let t = tempfile::tempdir().unwrap();
    let src = t.path().join("src");
    fs::create_dir(&src).unwrap();
    for i in 0..2500 {
        let p = src.join(format!("f{i:04}"));
        fs::write(&p, b"").unwrap();
        set_xattr(&p, "user.label", &[b'L'; 200]);
    }
    let img = t.path().join("x.img");
    build_image(&Source::Dir(src.clone()), &img, &opts("xattr")).unwrap();
    e2fsck_clean(&img);
    let acl = |name: &str| {
        let out = Command::new(tool("debugfs"))
            .args(["-R", &format!("stat /{name}")])
            .arg(&img)
            .output()
            .unwrap();
        let text = String::from_utf8_lossy(&out.stdout).into_owned();
        let line = text
            .lines()
            .find(|l| l.contains("File ACL:"))
            .unwrap_or_default()
            .to_string();
        line.split("File ACL:")
            .nth(1)
            .unwrap_or_default()
            .split_whitespace()
            .next()
            .unwrap_or_default()
            .to_string()
    };
    let (a, b, c) = (acl("f0000"), acl("f1023"), acl("f1024"));
    assert!(a != "0" && !a.is_empty(), "f0000 has no xattr block");
    assert_eq!(a, b, "the first 1024 inodes share one block");
    assert_ne!(a, c, "the 1025th inode shares a full block");
    if skip_unless_root(ingot_testkit::test_name!()) {
        return;
    }
    let m = LoopMount::new(&img, &t.path().join("mnt"));
    compare_trees(&src, &m.dir);
}

/// A PAX extended header (`x`) carrying `records`, then a plain ustar member header.
fn pax_member(records: &[(&[u8], &[u8])], name: &[u8], kind: u8, data: &[u8]) -> Vec<u8> {
    let mut body = Vec::new();
    for (k, v) in records {
        // "LEN KEY=VALUE\n", LEN counting itself.
        let rest = k.len() + v.len() + 3;
        let mut len = rest + 1;
        while len.to_string().len() + rest != len {
            len += 1;
        }
        body.extend_from_slice(format!("{len} ").as_bytes());
        body.extend_from_slice(k);
        body.push(b'=');
        body.extend_from_slice(v);
        body.push(b'\n');
    }
    let header = |name: &[u8], kind: u8, size: usize| {
        let mut h = tar::Header::new_ustar();
        h.as_ustar_mut().unwrap().name[..name.len()].copy_from_slice(name);
        h.set_entry_type(tar::EntryType::new(kind));
        h.set_size(size as u64);
        h.set_mode(if kind == b'5' { 0o755 } else { 0o644 });
        h.set_uid(0);
        h.set_gid(0);
        h.set_mtime(0);
        h.set_cksum();
        h.as_bytes().to_vec()
    };
    let pad = |d: &[u8]| {
        let mut d = d.to_vec();
        d.resize(d.len().next_multiple_of(512), 0);
        d
    };
    let mut out = header(b"PaxHeaders/x", b'x', body.len());
    out.extend(pad(&body));
    out.extend(header(name, kind, data.len()));
    out.extend(pad(data));
    out
}

/// Issue 15, item 3: a NUL byte inside a PAX path, link target or xattr name would become a
/// directory entry e2fsck calls illegal, a symlink the kernel reads short, or two attributes of
/// one name on one inode. Each such member is refused, naming it; the same archive without the
/// NULs builds an image e2fsck and the kernel accept.
#[test]
fn nul_bytes_in_pax_records_are_refused_naming_the_member() {
    let t = tempfile::tempdir().unwrap();
    let d = t.path();
    let end = [0u8; 1024];
    let archive = |members: &[Vec<u8>]| {
        let mut a: Vec<u8> = members.concat();
        a.extend_from_slice(&end);
        a
    };
    let cases: Vec<(&str, Vec<u8>, &str)> = vec![
        (
            "path",
            archive(&[pax_member(&[(b"path", b"ab\0cd")], b"plain", b'0', b"x")]),
            "ab",
        ),
        (
            "linkpath",
            archive(&[pax_member(
                &[(b"linkpath", b"target\0/etc/shadow")],
                b"sym",
                b'2',
                b"",
            )]),
            "sym",
        ),
        (
            "xattr",
            archive(&[pax_member(
                &[
                    (b"SCHILY.xattr.user.a\0b", b"1"),
                    (b"SCHILY.xattr.user.a\0c", b"2"),
                ],
                b"attrs",
                b'0',
                b"x",
            )]),
            "attrs",
        ),
    ];
    for (what, bytes, member) in cases {
        let p = d.join(format!("{what}.tar"));
        fs::write(&p, bytes).unwrap();
        let msg = expect_failure(Source::Tar(p.clone()), d, what).to_string();
        assert!(
            msg.contains(member) && msg.contains("NUL"),
            "{what}: error {msg:?} does not name {member:?} and the NUL byte"
        );
        fs::remove_file(p).unwrap();
    }

    // The same records without the NULs: a clean image with exactly these entries.
    let good = archive(&[
        pax_member(&[(b"path", b"abcd")], b"plain", b'0', b"x"),
        pax_member(&[(b"linkpath", b"target")], b"sym", b'2', b""),
        pax_member(
            &[
                (b"SCHILY.xattr.user.ab", b"1"),
                (b"SCHILY.xattr.user.ac", b"2"),
            ],
            b"attrs",
            b'0',
            b"x",
        ),
    ]);
    let p = d.join("good.tar");
    fs::write(&p, good).unwrap();
    let img = d.join("good.img");
    build_image(&Source::Tar(p), &img, &opts("pax")).unwrap();
    e2fsck_clean(&img);
    if skip_unless_root(ingot_testkit::test_name!()) {
        return;
    }
    let m = LoopMount::new(&img, &d.join("mnt"));
    let mut names: Vec<String> = fs::read_dir(&m.dir)
        .unwrap()
        .map(|e| e.unwrap().file_name().to_string_lossy().into_owned())
        .collect();
    names.sort();
    assert_eq!(names, ["abcd", "attrs", "sym"]);
    assert_eq!(
        fs::read_link(m.dir.join("sym")).unwrap(),
        Path::new("target")
    );
    let attrs = xattrs(&m.dir.join("attrs"));
    assert_eq!(
        attrs.get(b"user.ab".as_slice()).map(Vec::as_slice),
        Some(b"1".as_slice())
    );
    assert_eq!(
        attrs.get(b"user.ac".as_slice()).map(Vec::as_slice),
        Some(b"2".as_slice())
    );
}
