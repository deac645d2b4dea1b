//! ingot-writer end to end on image files and loop devices, checked with the real tools:
//! `sgdisk -v`, `sfdisk --json`, `fsck.fat -n`, `mtype`, `veritysetup verify`, a kernel mount.

mod common;

use std::collections::BTreeMap;
use std::fs;
use std::io::Write;
use std::path::{Path, PathBuf};
use std::process::{Command, Output, Stdio};

use common::{build_stack, demo, resigned, with_extra_layers, Stack};
use ingot_artifact::sign::SecretKey;
use ingot_testkit::loopdev::{LoopDevice, LoopMount, LoopOptions};
use ingot_testkit::partitions::{self, Part};
use ingot_testkit::skip::{find_tool, have_loop_devices, have_tool};
use ingot_testkit::test_name;

const MIB: u64 = 1 << 20;

/// A tool from Debian's packages, or None (a skip) outside CI.
fn tool(name: &str) -> Option<PathBuf> {
    have_tool(&ingot_testkit::skip::current_test(), name)
        .then(|| find_tool(name).expect("installed"))
}

fn run(cmd: &mut Command) -> Output {
    let out = cmd
        .output()
        .unwrap_or_else(|e| panic!("running {cmd:?}: {e}"));
    out
}

fn text(b: &[u8]) -> String {
    String::from_utf8_lossy(b).into_owned()
}

fn sparse_file(path: &Path, size: u64) {
    let f = fs::File::create(path).unwrap();
    f.set_len(size).unwrap();
}

fn writer(stack: &Stack, target: &Path, extra: &[&str]) -> Output {
    let mut cmd = Command::new(env!("CARGO_BIN_EXE_ingot-writer"));
    cmd.arg(&stack.layout)
        .arg("--target")
        .arg(target)
        .arg("--trust-key")
        .arg(&stack.public)
        .args(extra);
    run(&mut cmd)
}

fn extract(image: &Path, part: &Part, to: &Path) {
    use std::os::unix::fs::FileExt;
    let f = fs::File::open(image).unwrap();
    let mut buf = vec![0u8; part.size as usize];
    f.read_exact_at(&mut buf, part.start).unwrap();
    fs::write(to, buf).unwrap();
}

fn has_partition_table(image: &Path) -> bool {
    use std::os::unix::fs::FileExt;
    let f = fs::File::open(image).unwrap();
    let mut lba = [0u8; 1024];
    f.read_exact_at(&mut lba, 0).unwrap();
    lba[510..512] == [0x55, 0xAA] || &lba[512..520] == b"EFI PART"
}

/// Everything a written disk must satisfy; returns the layer names on it, in order.
fn check_disk(image: &Path, work: &Path) -> Vec<String> {
    if let Some(sgdisk) = tool("sgdisk") {
        let out = run(Command::new(sgdisk).arg("-v").arg(image));
        assert!(
            text(&out.stdout).contains("No problems found"),
            "sgdisk -v: {}{}",
            text(&out.stdout),
            text(&out.stderr)
        );
    }
    let parts = partitions::read(image);
    if parts.is_empty() {
        return Vec::new();
    }
    assert_eq!(parts[0].name, "ESP");
    assert_eq!(parts[0].type_guid, "c12a7328-f81f-11d2-ba4b-00a0c93ec93b");
    assert_eq!(parts.last().unwrap().name, "var");
    for p in &parts {
        assert_eq!(p.start % MIB, 0, "{} is 1 MiB aligned", p.name);
    }
    let esp = work.join("esp.img");
    extract(image, &parts[0], &esp);
    if let Some(fsck) = tool("fsck.fat") {
        let out = run(Command::new(fsck).arg("-n").arg(&esp));
        assert!(
            out.status.success(),
            "fsck.fat -n: {}{}",
            text(&out.stdout),
            text(&out.stderr)
        );
        assert!(
            !text(&out.stdout).contains("Bad"),
            "fsck.fat: {}",
            text(&out.stdout)
        );
    }
    let Some(mtype) = tool("mtype") else {
        return Vec::new();
    };
    let out = run(Command::new(mtype)
        .arg("-i")
        .arg(&esp)
        .arg("::loader/entries/ingot.conf"));
    assert!(out.status.success(), "mtype: {}", text(&out.stderr));
    let entry = text(&out.stdout);
    let options = entry
        .lines()
        .find_map(|l| l.strip_prefix("options "))
        .expect("options line");
    let layers = options
        .split_whitespace()
        .find_map(|a| a.strip_prefix("ingot.layers="))
        .expect("ingot.layers= on the command line");
    let mut names = Vec::new();
    for item in layers.split(',') {
        let (name, root) = item.split_once(':').unwrap();
        names.push(name.to_string());
        let uuid = |hex: &str| {
            format!(
                "{}-{}-{}-{}-{}",
                &hex[0..8],
                &hex[8..12],
                &hex[12..16],
                &hex[16..20],
                &hex[20..32]
            )
        };
        let data = parts
            .iter()
            .find(|p| p.uuid == uuid(&root[..32]))
            .unwrap_or_else(|| panic!("data partition of {name}"));
        let hash = parts
            .iter()
            .find(|p| p.uuid == uuid(&root[root.len() - 32..]))
            .unwrap_or_else(|| panic!("verity partition of {name}"));
        assert_eq!(data.name, format!("ingot-{name}"));
        assert_eq!(hash.name, format!("ingot-{name}-verity"));
        if let Some(vs) = tool("veritysetup") {
            let (d, h) = (
                work.join(format!("{name}.data")),
                work.join(format!("{name}.hash")),
            );
            extract(image, data, &d);
            extract(image, hash, &h);
            let out = run(Command::new(vs).arg("verify").arg(&d).arg(&h).arg(root));
            assert!(
                out.status.success(),
                "veritysetup verify {name}: {}",
                text(&out.stderr)
            );
        }
    }
    names
}

#[test]
fn worker_and_gpu_control_plane_on_image_files() {
    let stack = demo();
    let work = stack.dir.path();
    let cases: [(&[&str], &[&str]); 3] = [
        (&["--role", "worker"], &["base"]),
        (
            &["--role", "worker", "--gpu", "nvidia"],
            &["base", "nvidia"],
        ),
        (
            &["--role", "control-plane", "--gpu", "nvidia", "--virt"],
            &["base", "control-plane", "nvidia", "kata"],
        ),
    ];
    for (args, want) in cases {
        let img = work.join("disk.img");
        sparse_file(&img, 1024 * MIB);
        let events = work.join("events.jsonl");
        let report = work.join("report.json");
        let mut all: Vec<&str> = args.to_vec();
        all.extend([
            "--events",
            events.to_str().unwrap(),
            "--report",
            report.to_str().unwrap(),
        ]);
        let out = writer(&stack, &img, &all);
        assert!(out.status.success(), "{args:?}: {}", text(&out.stderr));
        assert_eq!(check_disk(&img, work), want, "{args:?}");
        let status: serde_json::Value =
            serde_json::from_slice(&fs::read(&report).unwrap()).unwrap();
        assert_eq!(status["state"], "done");
        let lines = fs::read_to_string(&events).unwrap();
        let stages: Vec<String> = lines
            .lines()
            .map(|l| serde_json::from_str::<serde_json::Value>(l).unwrap())
            .filter(|e| e["event"] == "start")
            .map(|e| e["stage"].as_str().unwrap().to_string())
            .collect();
        for s in [
            "resolve",
            "verify",
            "plan",
            "wipe",
            "write",
            "esp",
            "partition-table",
        ] {
            assert!(
                stages.iter().any(|x| x == s),
                "stage {s} reported: {stages:?}"
            );
        }
        fs::remove_file(&img).unwrap();
    }
}

#[test]
fn a_small_target_is_refused_untouched() {
    let stack = demo();
    let img = stack.dir.path().join("small.img");
    sparse_file(&img, 200 * MIB);
    fs::OpenOptions::new()
        .write(true)
        .open(&img)
        .unwrap()
        .write_all(&[0xAB; 4096])
        .unwrap();
    let out = writer(&stack, &img, &[]);
    assert_eq!(out.status.code(), Some(1));
    assert!(
        text(&out.stderr).contains("too small"),
        "{}",
        text(&out.stderr)
    );
    assert!(
        text(&out.stderr).contains("nothing was written"),
        "{}",
        text(&out.stderr)
    );
    assert_eq!(
        &fs::read(&img).unwrap()[..4096],
        &[0xAB; 4096][..],
        "the disk was not touched"
    );
}

/// A flipped byte in a data blob or a hash blob, a descriptor edited without its signature, and
/// an untrusted key: each fails before the partition table is written. All but the data blob
/// fail before the disk is touched; the data blob is checked frame by frame as it is decoded
/// (against the signed tree, before each frame is written), so the frames before the bad one
/// may be on the disk, but never a partition table.
#[test]
fn tampered_stacks_are_refused() {
    let stack = demo();
    let work = stack.dir.path();
    let manifest_of = |layout: &Path| -> serde_json::Value {
        let index: serde_json::Value =
            serde_json::from_slice(&fs::read(layout.join("index.json")).unwrap()).unwrap();
        let digest = index["manifests"][0]["digest"]
            .as_str()
            .unwrap()
            .to_string();
        serde_json::from_slice(&fs::read(blob(layout, &digest)).unwrap()).unwrap()
    };
    let copy = |name: &str| {
        let to = work.join(name);
        let out = run(Command::new("cp").arg("-a").arg(&stack.layout).arg(&to));
        assert!(out.status.success());
        to
    };
    let m = manifest_of(&stack.layout);
    let flip = |path: &Path, at: usize| {
        let mut b = fs::read(path).unwrap();
        let at = at.min(b.len() - 1);
        b[at] ^= 0x01;
        fs::write(path, b).unwrap();
    };
    let mut cases: Vec<(PathBuf, PathBuf, &str, bool)> = Vec::new();
    let data_flip = copy("data-flip");
    flip(
        &blob(&data_flip, m["layers"][0]["digest"].as_str().unwrap()),
        1000,
    );
    // The flip sits in the frame holding the base's boot files, which the plan reads (every
    // block checked) before the wipe: the run stops there, the disk untouched.
    cases.push((
        data_flip,
        stack.public.clone(),
        "layer `base`'s file system: zstd frame 0",
        true,
    ));
    let hash_flip = copy("hash-flip");
    flip(
        &blob(&hash_flip, m["layers"][1]["digest"].as_str().unwrap()),
        5000,
    );
    cases.push((hash_flip, stack.public.clone(), "corrupt", true));
    // A descriptor claiming another root hash, with the manifest and index re-pointed at it so
    // every digest is consistent: only the signature can catch it.
    let desc_edit = copy("desc-edit");
    claim_another_root_hash(&desc_edit, &m);
    cases.push((desc_edit, stack.public.clone(), "signature", true));
    let other_key = work.join("other.pub");
    fs::write(&other_key, SecretKey::generate().public_key().to_minisign()).unwrap();
    cases.push((stack.layout.clone(), other_key, "signature", true));

    for (layout, key, expect, untouched) in cases {
        let img = work.join("disk.img");
        sparse_file(&img, 1024 * MIB);
        let mut cmd = Command::new(env!("CARGO_BIN_EXE_ingot-writer"));
        cmd.arg(&layout)
            .arg("--target")
            .arg(&img)
            .arg("--trust-key")
            .arg(&key);
        let out = run(&mut cmd);
        let err = text(&out.stderr);
        assert_eq!(out.status.code(), Some(1), "{}: {err}", layout.display());
        assert!(
            err.contains(expect),
            "{}: expected {expect:?} in {err}",
            layout.display()
        );
        assert!(
            !has_partition_table(&img),
            "{}: no partition table",
            layout.display()
        );
        if untouched {
            assert!(
                fs::read(&img).unwrap().iter().all(|b| *b == 0),
                "{}: the disk was not touched",
                layout.display()
            );
        } else {
            assert!(
                err.contains("data blob") || err.contains("does not match the signed hash tree"),
                "{}: {err}",
                layout.display()
            );
        }
    }
}

/// Changes one root hash in the descriptor of the layout at `layout` (whose image manifest is
/// `m`) and re-points the manifest and index.json at it, so every digest is consistent.
fn claim_another_root_hash(layout: &Path, m: &serde_json::Value) {
    let path = blob(layout, m["config"]["digest"].as_str().unwrap());
    let t = fs::read_to_string(&path).unwrap();
    let root = t.split("\"rootHash\":\"").nth(1).unwrap()[..64].to_string();
    let other = format!(
        "{}{}",
        &root[..63],
        if root.ends_with('0') { "1" } else { "0" }
    );
    let edited = t.replacen(&root, &other, 1);
    let put = |bytes: &[u8]| -> String {
        use sha2::Digest;
        let digest = format!("sha256:{}", hex::encode(sha2::Sha256::digest(bytes)));
        fs::write(blob(layout, &digest), bytes).unwrap();
        digest
    };
    let mut manifest = m.clone();
    manifest["config"]["digest"] = put(edited.as_bytes()).into();
    let manifest_bytes = serde_json::to_vec(&manifest).unwrap();
    let manifest_digest = put(&manifest_bytes);
    let index_path = layout.join("index.json");
    let mut index: serde_json::Value =
        serde_json::from_slice(&fs::read(&index_path).unwrap()).unwrap();
    index["manifests"][0]["digest"] = manifest_digest.into();
    index["manifests"][0]["size"] = manifest_bytes.len().into();
    fs::write(&index_path, serde_json::to_vec(&index).unwrap()).unwrap();
}

fn blob(layout: &Path, digest: &str) -> PathBuf {
    layout
        .join("blobs/sha256")
        .join(digest.strip_prefix("sha256:").unwrap())
}

/// A stack big enough to be caught mid-write: the demo's base tree plus 192 MiB of random data.
fn big_stack(work: &Path) -> Stack {
    let root = Path::new(env!("CARGO_MANIFEST_DIR")).join("..");
    let tree = work.join("big-base");
    let out = run(Command::new("cp")
        .arg("-a")
        .arg(root.join("tests/fixtures/demo/base"))
        .arg(&tree));
    assert!(out.status.success());
    let data = ingot_testkit::noise::noise(1, 192 * MIB as usize);
    fs::write(tree.join("usr/random.bin"), data).unwrap();
    let manifest = work.join("big.toml");
    fs::write(
        &manifest,
        format!(
            "name = \"big\"\nversion = \"1\"\nsource_date_epoch = 1700000000\n\n[boot]\nkernel = \"/boot/vmlinuz\"\n\
             initrd = \"/boot/initrd.img\"\nefi = \"/boot/efi/EFI/BOOT/BOOTX64.EFI\"\n\n[[layer]]\nname = \"base\"\n\
             kind = \"base\"\nsource = {{ dir = \"{}\" }}\n",
            tree.display()
        ),
    )
    .unwrap();
    build_stack(&manifest)
}

/// SIGKILL while layers are being written: no partition table; the next run completes.
#[test]
fn killed_mid_write_leaves_no_partition_table() {
    let work = tempfile::tempdir().unwrap();
    let stack = big_stack(work.path());
    let img = work.path().join("disk.img");
    sparse_file(&img, 1024 * MIB);
    // A previous install: the kill must not leave its table either.
    let out = writer(&stack, &img, &[]);
    assert!(out.status.success(), "{}", text(&out.stderr));
    assert!(has_partition_table(&img));

    let events = work.path().join("events.jsonl");
    let child = Command::new(env!("CARGO_BIN_EXE_ingot-writer"))
        .arg(&stack.layout)
        .args([
            "--target",
            img.to_str().unwrap(),
            "--trust-key",
            stack.public.to_str().unwrap(),
        ])
        .args(["--events", events.to_str().unwrap()])
        .stderr(Stdio::null())
        .spawn()
        .unwrap();
    let status = common::signal_at(child, &events, "KILL", "progress", None).status;
    assert!(!status.success());
    assert!(
        !has_partition_table(&img),
        "a killed write leaves no partition table"
    );

    let out = writer(&stack, &img, &[]);
    assert!(out.status.success(), "rerun: {}", text(&out.stderr));
    assert_eq!(check_disk(&img, work.path()), vec!["base"]);
}

/// SIGTERM while layers are being written (CAPH or an operator stopping the writer): the run
/// fails as a passed deadline does, with its reason in the report, and leaves no partition table.
#[test]
fn sigterm_mid_write_fails_cleanly() {
    let work = tempfile::tempdir().unwrap();
    let stack = big_stack(work.path());
    let img = work.path().join("disk.img");
    sparse_file(&img, 1024 * MIB);
    // A previous install: the interrupted run must not leave its table either.
    let out = writer(&stack, &img, &[]);
    assert!(out.status.success(), "{}", text(&out.stderr));
    assert!(has_partition_table(&img));

    let events = work.path().join("events.jsonl");
    let report = work.path().join("report.json");
    let child = Command::new(env!("CARGO_BIN_EXE_ingot-writer"))
        .arg(&stack.layout)
        .args([
            "--target",
            img.to_str().unwrap(),
            "--trust-key",
            stack.public.to_str().unwrap(),
        ])
        .args(["--events", events.to_str().unwrap()])
        .args(["--report", report.to_str().unwrap()])
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    let out = common::signal_at(child, &events, "TERM", "progress", None);
    let stderr = text(&out.stderr);
    assert_eq!(out.status.code(), Some(1), "{stderr}");
    assert!(stderr.contains("interrupted by a signal"), "{stderr}");
    assert!(
        stderr.contains("left without a partition table"),
        "{stderr}"
    );
    let status: serde_json::Value = serde_json::from_slice(&fs::read(&report).unwrap()).unwrap();
    assert_eq!(status["state"], "failed", "{status}");
    assert!(
        !has_partition_table(&img),
        "an interrupted write leaves no partition table"
    );
}

/// As root: a loop device as the target; the base partition mounts read-only and matches the
/// fixture tree file for file.
#[test]
fn loop_device_target_mounts_and_matches() {
    if !have_loop_devices(test_name!()) {
        return;
    }
    let stack = demo();
    let work = stack.dir.path();
    let img = work.join("disk.img");
    sparse_file(&img, 1024 * MIB);
    let dev = LoopDevice::attach(
        &img,
        &LoopOptions {
            partscan: true,
            ..LoopOptions::default()
        },
    );
    let out = writer(&stack, dev.path(), &["--role", "control-plane"]);
    assert!(out.status.success(), "{}", text(&out.stderr));
    drop(dev);
    assert_eq!(check_disk(&img, work), vec!["base", "control-plane"]);

    let parts = partitions::read(&img);
    let base = parts.iter().find(|p| p.name == "ingot-base").unwrap();
    let mnt = work.join("mnt");
    let _m = LoopMount::with(
        &img,
        &mnt,
        &LoopOptions::read_only_range(base.start, base.size),
        Some("ext4"),
    );
    let fixture = Path::new(env!("CARGO_MANIFEST_DIR")).join("../tests/fixtures/demo/base");
    let mut files = BTreeMap::new();
    collect(&fixture, &fixture, &mut files);
    assert!(!files.is_empty());
    for (rel, bytes) in files {
        assert_eq!(
            fs::read(mnt.join(&rel)).unwrap_or_else(|e| panic!("{rel}: {e}")),
            bytes,
            "{rel}"
        );
    }
}

fn collect(root: &Path, dir: &Path, out: &mut BTreeMap<String, Vec<u8>>) {
    for e in fs::read_dir(dir).unwrap() {
        let e = e.unwrap();
        let p = e.path();
        let t = e.file_type().unwrap();
        if t.is_dir() {
            collect(root, &p, out);
        } else if t.is_file() {
            out.insert(
                p.strip_prefix(root).unwrap().to_string_lossy().into_owned(),
                fs::read(&p).unwrap(),
            );
        }
    }
}

/// Issue 15, item 2: two writers on one image file both ran (once leaving a base partition that
/// fails `veritysetup verify`, once no partition table). The target is now locked for the whole
/// run: while another process holds it, the writer is refused with a clear error and writes
/// nothing; once it is free, the write succeeds and every layer passes `veritysetup verify`.
#[test]
fn a_second_writer_on_a_locked_target_is_refused() {
    let stack = demo();
    let work = stack.dir.path();
    let img = work.join("locked.img");
    sparse_file(&img, 1024 * MIB);
    fs::OpenOptions::new()
        .write(true)
        .open(&img)
        .unwrap()
        .write_all(&[0xAB; 4096])
        .unwrap();
    // The other writer: the same exclusive lock ingot-writer takes.
    let holder = fs::File::open(&img).unwrap();
    rustix::fs::flock(&holder, rustix::fs::FlockOperation::LockExclusive).unwrap();
    let out = writer(&stack, &img, &["--role", "worker"]);
    let stderr = text(&out.stderr);
    assert!(!out.status.success(), "{stderr}");
    assert!(
        stderr.contains("locked by another process") && stderr.contains("locked.img"),
        "{stderr}"
    );
    assert_eq!(
        &fs::read(&img).unwrap()[..4096],
        &[0xAB; 4096][..],
        "the disk was not touched"
    );
    drop(holder);
    let out = writer(&stack, &img, &["--role", "worker"]);
    assert!(out.status.success(), "{}", text(&out.stderr));
    assert_eq!(check_disk(&img, work), ["base"]);
}

/// `layout` in a fresh docker-registry as `stacks/s:1`, served through a test proxy with
/// `faults`; returns the registry, the proxy and the base layer's data blob (digest, size), or
/// None (a skip, see `ingot_testkit::skip`) when docker-registry is not installed.
fn serve_through_proxy(
    test: &str,
    layout: &Path,
    dir: &Path,
    faults: impl FnOnce(&str, u64) -> ingot_testproxy::Faults,
) -> Option<(
    common::registry_support::Registry,
    ingot_testproxy::Proxy,
    String,
    u64,
)> {
    use ingot_artifact::registry::{push, Registry as Client, RegistryOptions, RegistryRef};
    if !have_tool(test, "docker-registry") {
        return None;
    }
    let registry = common::registry_support::Registry::start(dir, None);
    let direct: RegistryRef = registry.url("stacks/s:1").parse().unwrap();
    let client = Client::connect(&direct, RegistryOptions::default()).unwrap();
    push::publish(&client, layout, &direct, false).unwrap();
    let data = ingot_testkit::layout::read(layout).layer("base")["data"].clone();
    let (digest, size) = (
        data["digest"].as_str().unwrap().to_string(),
        data["size"].as_u64().unwrap(),
    );
    let proxy = ingot_testproxy::Proxy::start(
        "127.0.0.1:0".parse().unwrap(),
        registry.host().parse().unwrap(),
        faults(&digest, size),
    )
    .unwrap();
    Some((registry, proxy, digest, size))
}

/// The writer streams a layer from the registry; the proxy drops the connection in the middle
/// of the base layer's blob (frames already written). The writer resumes with a Range request
/// from the last byte it received, and the disk verifies.
#[test]
fn a_connection_cut_mid_layer_resumes() {
    let work = tempfile::tempdir().unwrap();
    let stack = big_stack(work.path());
    let Some((_registry, proxy, _digest, size)) = serve_through_proxy(
        ingot_testkit::test_name!(),
        &stack.layout,
        &work.path().join("reg"),
        |digest, size| ingot_testproxy::Faults {
            cut: Some(ingot_testproxy::Rule {
                path_contains: digest.to_string(),
                offset: size * 2 / 5,
            }),
            ..Default::default()
        },
    ) else {
        return;
    };
    assert!(size > 16 * MIB, "a blob of many frames ({size} bytes)");
    let img = work.path().join("disk.img");
    sparse_file(&img, 1024 * MIB);
    let out = run(Command::new(env!("CARGO_BIN_EXE_ingot-writer"))
        .arg(format!("oci://{}/stacks/s:1", proxy.host()))
        .arg("--target")
        .arg(&img)
        .arg("--trust-key")
        .arg(&stack.public));
    assert!(out.status.success(), "{}", text(&out.stderr));
    use std::sync::atomic::Ordering::Relaxed;
    assert_eq!(
        proxy.stats.cuts.load(Relaxed),
        1,
        "the proxy cut one transfer"
    );
    assert!(
        proxy.stats.ranged.load(Relaxed) >= 1,
        "the writer resumed with a Range request"
    );
    assert_eq!(check_disk(&img, work.path()), ["base"]);
}

/// A registry that serves a flipped byte in a data blob: the run fails in `write`, naming the
/// layer and the blob, and the disk has no partition table.
#[test]
fn a_flipped_byte_from_the_registry_fails_in_write() {
    let stack = demo();
    let work = tempfile::tempdir().unwrap();
    let Some((_registry, proxy, digest, _size)) = serve_through_proxy(
        ingot_testkit::test_name!(),
        &stack.layout,
        &work.path().join("reg"),
        |digest, size| ingot_testproxy::Faults {
            flip: Some(ingot_testproxy::Rule {
                path_contains: digest.to_string(),
                offset: size / 2,
            }),
            ..Default::default()
        },
    ) else {
        return;
    };
    let img = work.path().join("disk.img");
    sparse_file(&img, 1024 * MIB);
    let report = work.path().join("report.json");
    let out = run(Command::new(env!("CARGO_BIN_EXE_ingot-writer"))
        .arg(format!("oci://{}/stacks/s:1", proxy.host()))
        .arg("--target")
        .arg(&img)
        .arg("--trust-key")
        .arg(&stack.public)
        .arg("--report")
        .arg(&report));
    let err = text(&out.stderr);
    assert_eq!(out.status.code(), Some(1), "{err}");
    assert!(
        proxy.stats.flips.load(std::sync::atomic::Ordering::Relaxed) >= 1,
        "the proxy flipped a byte"
    );
    assert!(
        err.contains("layer `base`") && err.contains(&digest),
        "{err}"
    );
    let status: serde_json::Value = serde_json::from_slice(&fs::read(&report).unwrap()).unwrap();
    assert_eq!(status["state"], "failed", "{status}");
    assert_eq!(status["stage"], "write", "{status}");
    assert!(!has_partition_table(&img), "no partition table");
}

/// An unsigned stack is refused, and the error does not suggest `--allow-unsigned`: the writer
/// has no such flag (only `ingot verify` does).
#[test]
fn an_unsigned_stack_is_refused_without_naming_a_flag_the_writer_lacks() {
    use ingot::build::{build, BuildOptions};
    use ingot::manifest::Manifest;
    let stack = demo();
    let unsigned = stack.dir.path().join("unsigned");
    let root = Path::new(env!("CARGO_MANIFEST_DIR")).join("..");
    build(
        &Manifest::load(&root.join("manifests/demo.toml")).unwrap(),
        &BuildOptions {
            out: unsigned.clone(),
            sign_key: None,
            frame_size: 4 << 20,
            zstd_level: 3,
            revision: None,
            force: false,
            progress: false,
            events: ingot::events::Events::off(),
            secure_boot: None,
            pcr_key: None,
        },
    )
    .unwrap();
    let img = stack.dir.path().join("disk.img");
    sparse_file(&img, 1024 * MIB);
    let out = run(Command::new(env!("CARGO_BIN_EXE_ingot-writer"))
        .arg(&unsigned)
        .arg("--target")
        .arg(&img)
        .arg("--trust-key")
        .arg(&stack.public));
    let stderr = text(&out.stderr);
    assert_eq!(out.status.code(), Some(1), "{stderr}");
    assert!(stderr.contains("unsigned"), "{stderr}");
    assert!(!stderr.contains("--allow-unsigned"), "{stderr}");
    let help = run(Command::new(env!("CARGO_BIN_EXE_ingot-writer")).arg("--help"));
    assert!(!text(&help.stdout).contains("allow-unsigned"));
}

/// Clears a file's immutable attribute even when the test fails.
struct Immutable(PathBuf);

impl Drop for Immutable {
    fn drop(&mut self) {
        let _ = Command::new("chattr").arg("-i").arg(&self.0).status();
    }
}

/// A read-only target (a loop device the kernel marks read-only, an immutable image file) is
/// refused when it is opened, before the wipe: the run says nothing was written, never that
/// the disk was left without a partition table, and the disk is unchanged. `--dry-run` refuses
/// it alike.
#[test]
fn a_read_only_target_is_refused_before_the_wipe() {
    if !have_loop_devices(test_name!()) {
        return;
    }
    let stack = demo();
    let img = stack.dir.path().join("ro.img");
    sparse_file(&img, 1024 * MIB);
    fs::OpenOptions::new()
        .write(true)
        .open(&img)
        .unwrap()
        .write_all(&[0xAB; 4096])
        .unwrap();
    let before = ingot_testkit::digest::sha256_file(&img).unwrap();
    let refused = |target: &Path, why: &str| {
        for extra in [&[][..], &["--dry-run"][..]] {
            let mut args = vec!["--role", "worker"];
            args.extend_from_slice(extra);
            let out = writer(&stack, target, &args);
            let stderr = text(&out.stderr);
            assert_eq!(out.status.code(), Some(1), "{extra:?}: {stderr}");
            assert!(
                stderr.contains("is read-only") && stderr.contains(why),
                "{extra:?}: {stderr}"
            );
            assert!(
                stderr.contains("nothing was written"),
                "{extra:?}: {stderr}"
            );
            assert!(!stderr.contains("without a partition table"), "{stderr}");
            assert!(
                !stderr.contains("[wipe]") && !stderr.contains("clearing"),
                "{stderr}"
            );
        }
    };

    let dev = LoopDevice::attach(&img, &LoopOptions::READ_ONLY);
    refused(dev.path(), "BLKROGET");
    drop(dev);

    let out = run(Command::new("chattr").arg("+i").arg(&img));
    assert!(out.status.success(), "chattr +i: {}", text(&out.stderr));
    let guard = Immutable(img.clone());
    refused(&img, "immutable");
    drop(guard);
    assert_eq!(ingot_testkit::digest::sha256_file(&img).unwrap(), before);
}

/// The image file is deleted while its layers are written: the run fails instead of reporting
/// the stack written to a file nobody can reach any more.
#[test]
fn a_target_deleted_mid_run_is_not_reported_written() {
    let work = tempfile::tempdir().unwrap();
    let stack = big_stack(work.path());
    let img = work.path().join("doomed.img");
    sparse_file(&img, 1024 * MIB);
    let events = work.path().join("events.jsonl");
    let child = Command::new(env!("CARGO_BIN_EXE_ingot-writer"))
        .arg(&stack.layout)
        .args(["--target", img.to_str().unwrap()])
        .args(["--trust-key", stack.public.to_str().unwrap()])
        .args(["--events", events.to_str().unwrap()])
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(120);
    while !fs::read_to_string(&events)
        .unwrap_or_default()
        .contains("\"event\":\"progress\"")
    {
        assert!(std::time::Instant::now() < deadline, "no progress event");
        std::thread::sleep(std::time::Duration::from_millis(5));
    }
    fs::remove_file(&img).unwrap();
    let out = child.wait_with_output().unwrap();
    let stderr = text(&out.stderr);
    assert_eq!(out.status.code(), Some(1), "{stderr}");
    assert!(stderr.contains("was deleted or replaced"), "{stderr}");
    assert!(!stderr.contains("wrote "), "{stderr}");
}

/// Runs the writer on a fresh 2 GiB image whose every sector holds a pattern, and checks it
/// fails with `want` in its message and leaves the image byte for byte as it was.
fn refused_untouched(layout: &Path, key: &Path, extra: &[&str], want: &[&str]) {
    use sha2::Digest;
    let img = layout.with_extension("img");
    sparse_file(&img, 2048 * MIB);
    {
        let mut f = fs::OpenOptions::new().write(true).open(&img).unwrap();
        f.write_all(&vec![0xAB; MIB as usize]).unwrap();
    }
    let before = hex::encode(sha2::Sha256::digest(fs::read(&img).unwrap()));
    let mut cmd = Command::new(env!("CARGO_BIN_EXE_ingot-writer"));
    cmd.arg(layout)
        .arg("--target")
        .arg(&img)
        .arg("--trust-key")
        .arg(key)
        .args(extra);
    let out = run(&mut cmd);
    let err = text(&out.stderr);
    assert_eq!(out.status.code(), Some(1), "{}: {err}", layout.display());
    for w in want {
        assert!(err.contains(w), "{}: want {w:?} in {err}", layout.display());
    }
    let after = hex::encode(sha2::Sha256::digest(fs::read(&img).unwrap()));
    assert_eq!(before, after, "{}: the disk changed", layout.display());
    fs::remove_file(&img).unwrap();
}

/// Issue "hostile input, second pass", item 15: 70 layers need 142 GPT entries and 40 layers
/// a 2,9xx-byte kernel command line; both stacks (signed, as a builder that did not check
/// could make them) are refused at `plan`, naming the limit, with the disk untouched.
#[test]
fn layouts_past_the_gpt_or_command_line_limit_are_refused_before_the_wipe() {
    let stack = demo();
    let seventy = resigned(&stack, |d| with_extra_layers(d, 69));
    refused_untouched(
        &seventy.layout,
        &seventy.public,
        &[],
        &[
            "142 partitions",
            "128 entries of a GPT",
            "nothing was written",
        ],
    );
    let forty = resigned(&stack, |d| with_extra_layers(d, 39));
    refused_untouched(
        &forty.layout,
        &forty.public,
        &[],
        &[
            "kernel command line is",
            "more than the 2047",
            "COMMAND_LINE_SIZE 2048",
        ],
    );
}

/// Item 14: a kernel the base layer lacks, and boot files larger than the ESP, are refused at
/// `plan` (the boot files' inodes read from the verified blob), before the wipe.
#[test]
fn missing_or_oversized_boot_files_are_refused_before_the_wipe() {
    let stack = demo();
    let no_kernel = resigned(&stack, |d| d.boot.kernel = "/boot/vmlinuz-missing".into());
    refused_untouched(
        &no_kernel.layout,
        &no_kernel.public,
        &[],
        &["/boot/vmlinuz-missing", "nothing was written"],
    );
    // A 60 MiB "kernel" (random, so it stays 60 MiB compressed) and a 64 MiB ESP.
    let work = stack.dir.path();
    let tree = work.join("fat-base");
    assert!(run(Command::new("cp")
        .arg("-a")
        .arg(Path::new(env!("CARGO_MANIFEST_DIR")).join("../tests/fixtures/demo/base"))
        .arg(&tree))
    .status
    .success());
    let data = ingot_testkit::noise::noise(2, 60 * MIB as usize);
    fs::write(tree.join("boot/vmlinuz"), data).unwrap();
    let manifest = work.join("fat.toml");
    fs::write(
        &manifest,
        format!(
            "name = \"fat\"\nversion = \"1\"\nsource_date_epoch = 1700000000\n\n[boot]\nkernel = \"/boot/vmlinuz\"\n\
             initrd = \"/boot/initrd.img\"\nefi = \"/boot/efi/EFI/BOOT/BOOTX64.EFI\"\n\n[[layer]]\nname = \"base\"\n\
             kind = \"base\"\nsource = {{ dir = \"{}\" }}\n",
            tree.display()
        ),
    )
    .unwrap();
    let fat = build_stack(&manifest);
    refused_untouched(
        &fat.layout,
        &fat.public,
        &["--esp-size", "64"],
        &[
            "boot files are",
            "an ESP of 67108864 bytes holds at most",
            "nothing was written",
        ],
    );
}

/// Item 19: a `--kernel-arg` with a newline (it would add lines to the loader entry) or one of
/// the writer's own `ingot.*` parameters is refused, naming the argument, before the wipe.
#[test]
fn hostile_kernel_args_are_refused_before_the_wipe() {
    let stack = demo();
    for (arg, want) in [
        ("quiet\ninitrd /EFI/evil.img", "control character"),
        (
            "ingot.var=PARTUUID=00000000-0000-0000-0000-000000000000",
            "ingot.*",
        ),
        ("quiet ingot.layers=base:00", "ingot.*"),
    ] {
        refused_untouched(
            &stack.layout,
            &stack.public,
            &["--kernel-arg", arg],
            &[
                &format!("kernel argument {arg:?}"),
                want,
                "nothing was written",
            ],
        );
    }
}
