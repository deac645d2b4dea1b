//! Many machines at once through registry mirrors and pull-through caches (a
//! containers-registries.conf given with `--registries-conf`), against real registries: a
//! Debian `docker-registry` as the origin behind `ingot-testproxy` (which limits the link and
//! counts its bytes), and another `docker-registry` as a pull-through cache (`proxy.remoteurl`)
//! in front of it. The stack's signature travels inside the artifact, so whatever a mirror
//! serves is checked against the signed digests.

mod common;

use std::fs;
use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::process::{Command, Output};
use std::sync::atomic::Ordering;
use std::time::Instant;

use common::registry_support::{free_port, Front, FrontOptions, Registry};
use common::repo_root;
use ingot_artifact::registry::mirrors::MirrorConfig;
use ingot_artifact::registry::{pull, push, Registry as Client, RegistryOptions, RegistryRef};
use ingot_testkit::machine::{materialize, Materialized};
use ingot_testkit::skip::{find_tool, have_root, have_tool, have_tools};
use ingot_testproxy::{Faults, Proxy, Rule};

const TOKEN: &str = "ghp_ingotFleetToken0123456789abcdef";

fn usable(test: &str) -> bool {
    have_root(test) && have_tool(test, "docker-registry")
}

fn addr(port: u16) -> SocketAddr {
    SocketAddr::from(([127, 0, 0, 1], port))
}

/// Publishes `layout` straight to `reg` as `stacks/demo:1.0.0`.
fn publish(layout: &Path, reg: &Registry) {
    let direct: RegistryRef = reg.url("stacks/demo:1.0.0").parse().unwrap();
    let client = Client::connect(&direct, RegistryOptions::default()).unwrap();
    push::publish(&client, layout, &direct, false).unwrap();
}

/// The bytes of every blob in a layout (one stack's download).
fn blob_bytes(layout: &Path) -> u64 {
    fs::read_dir(layout.join("blobs/sha256"))
        .unwrap()
        .map(|e| e.unwrap().metadata().unwrap().len())
        .sum()
}

/// A registries.conf: `prefix` pulled through `mirrors`, in order, then itself.
fn registries_conf(dir: &Path, prefix: &str, mirrors: &[String]) -> PathBuf {
    let mut text = format!("[[registry]]\nprefix = \"{prefix}\"\nlocation = \"{prefix}\"\n");
    for m in mirrors {
        text.push_str(&format!("\n[[registry.mirror]]\nlocation = \"{m}\"\n"));
    }
    let path = dir.join("registries.conf");
    fs::write(&path, text).unwrap();
    path
}

struct Machine {
    dir: tempfile::TempDir,
    m: Materialized,
}

fn machine() -> Machine {
    let dir = tempfile::tempdir_in("/var/tmp").unwrap();
    let m = materialize(
        &repo_root().join("tests/fixtures/machines/cpu-worker"),
        &dir.path().join("machine"),
    )
    .unwrap_or_else(|e| panic!("materializing cpu-worker: {e}"));
    Machine { dir, m }
}

/// The writer as CAPH runs it on `m` (the same machine name for every machine, so that every
/// disk, node layer included, is the same), mirrors from `conf`.
fn caph(url: &str, m: &Machine, public: &Path, conf: &Path) -> Command {
    let mut cmd = common::caph_command(
        url,
        TOKEN,
        &repo_root().join("bootstrap/tests/fixtures/cloud-config-worker-join.yaml"),
        "node-7",
        "sda",
        &m.m.root,
        &m.dir.path().join("output.json"),
        &m.dir.path().join("events.jsonl"),
        public,
    );
    cmd.arg("--no-reboot")
        .arg("--registries-conf")
        .arg(conf)
        .arg("-v");
    cmd
}

fn show(out: &Output) -> String {
    format!(
        "exit {:?}\n--- stdout\n{}\n--- stderr\n{}",
        out.status.code(),
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    )
}

fn assert_done(out: &Output) {
    common::assert_caph_done(out, "fleet writer");
}

/// SHA-256 of `size` bytes at `offset` of `image`.
fn sha256_range(image: &Path, offset: u64, size: u64) -> String {
    use sha2::{Digest, Sha256};
    use std::io::{Read, Seek, SeekFrom};
    let mut f = fs::File::open(image).unwrap();
    f.seek(SeekFrom::Start(offset)).unwrap();
    let mut h = Sha256::new();
    std::io::copy(&mut f.take(size), &mut h).unwrap();
    hex::encode(h.finalize())
}

/// output.json's `details.sources`: (location, mirror, bytes, blobs).
fn sources(m: &Machine) -> Vec<(String, bool, u64, u64)> {
    report_sources(&m.dir.path().join("output.json"))
}

/// Ten writers started at once, CAPH-style, on ten fixture machines, through a pull-through
/// cache warmed by one pull: every disk the same, and the origin serves each blob about once
/// (distribution fetches a cold blob from its upstream twice while it serves it).
#[test]
fn ten_writers_at_once_through_a_pull_through_cache() {
    if !usable(ingot_testkit::test_name!()) {
        return;
    }
    let stack = common::demo();
    let work = tempfile::tempdir().unwrap();
    let origin = Registry::start(&work.path().join("origin"), None);
    publish(&stack.layout, &origin);
    // The origin as the world sees it: over a limited link that counts its bytes.
    let link = Proxy::start(
        addr(0),
        addr(origin.port),
        Faults {
            rate: Some(40 << 20),
            ..Faults::default()
        },
    )
    .unwrap();
    let cache = Registry::start_cache(
        &work.path().join("cache"),
        &format!("http://{}", link.host()),
    );
    let conf = registries_conf(work.path(), &link.host(), &[cache.host()]);
    let url = format!("oci://{}/stacks/demo:1.0.0", link.host());
    let blobs = blob_bytes(&stack.layout);

    // Warm the cache: one pull through it (what `ingot pull --registries-conf` does).
    let options = RegistryOptions {
        mirrors: Some(std::sync::Arc::new(MirrorConfig::load(&conf).unwrap())),
        progress: false,
        ..RegistryOptions::default()
    };
    let reference: RegistryRef = url.parse().unwrap();
    let client = Client::connect(&reference, options).unwrap();
    pull::pull(&client, &reference, &work.path().join("warm")).unwrap();
    let served = client.served();
    assert_eq!(served.len(), 1, "{served:?}");
    assert!(served[0].mirror && served[0].location == format!("{}/stacks/demo", cache.host()));
    let warm = link.stats.bytes.load(Ordering::Relaxed);
    println!("warming the cache: the origin sent {warm} bytes for {blobs} bytes of blobs");

    // One writer alone, then ten at once.
    let alone = machine();
    let t = Instant::now();
    let out = caph(&url, &alone, &stack.public, &conf).output().unwrap();
    let one = t.elapsed();
    assert_done(&out);
    let machines: Vec<Machine> = (0..10).map(|_| machine()).collect();
    let t = Instant::now();
    let children: Vec<_> = machines
        .iter()
        .map(|m| caph(&url, m, &stack.public, &conf).spawn().unwrap())
        .collect();
    let outs: Vec<Output> = children
        .into_iter()
        .map(|c| c.wait_with_output().unwrap())
        .collect();
    let ten = t.elapsed();
    for out in &outs {
        assert_done(out);
    }
    // Every stack partition the same on every disk (the node layer, with its fresh machine-id
    // and host keys, and the ESP, whose command line names the node layer's root hash, differ).
    let stack_parts = |m: &Machine| -> Vec<(String, String)> {
        let image = &m.m.images["sda"];
        common::partitions(image)
            .into_iter()
            .filter(|(name, _, _)| name.starts_with("ingot-") && !name.starts_with("ingot-node"))
            .map(|(name, start, size)| (name, sha256_range(image, start, size)))
            .collect()
    };
    let first = stack_parts(&alone);
    assert!(first.len() >= 2, "{first:?}");
    for m in &machines {
        assert_eq!(stack_parts(m), first, "{}", m.m.images["sda"].display());
        let s = sources(m);
        let cached = s.iter().find(|s| s.1).expect("the cache served");
        assert!(cached.3 > 0, "{s:?}");
        assert!(
            s.iter().all(|s| s.1 || s.3 == 0),
            "the origin served blobs: {s:?}"
        );
    }
    let total = link.stats.bytes.load(Ordering::Relaxed);
    println!(
        "the origin sent {total} bytes in all ({warm} warming, {} for eleven writers) for one \
         stack's {blobs} bytes of blobs ({:.2}x)",
        total - warm,
        total as f64 / blobs as f64
    );
    println!(
        "wall time: one writer {:.2} s, ten at once {:.2} s ({:.2}x)",
        one.as_secs_f64(),
        ten.as_secs_f64(),
        ten.as_secs_f64() / one.as_secs_f64()
    );
    // Warming: the documented double fetch of a cold blob, plus manifests and headers.
    assert!(warm < 3 * blobs, "warming: {warm} bytes for {blobs}");
    // Eleven writers through the warm cache: less than one more copy of the blobs in all
    // (straight to the origin it would be eleven).
    assert!(
        total - warm < blobs,
        "{} bytes for eleven writers",
        total - warm
    );
}

/// The demo stack published to an origin registry, and a front on it that demands CAPH's token
/// (as bearer `base64(TOKEN)`, returned): (stack, work dir, origin, front, bearer).
fn origin_behind_token() -> (common::Stack, tempfile::TempDir, Registry, Front, String) {
    let stack = common::demo();
    let work = tempfile::tempdir().unwrap();
    let reg = Registry::start(&work.path().join("origin"), None);
    publish(&stack.layout, &reg);
    use base64::Engine;
    let bearer = base64::engine::general_purpose::STANDARD.encode(TOKEN);
    let front = Front::start(
        reg.port,
        FrontOptions {
            bearer: Some(bearer.clone()),
            rate: None,
        },
    );
    (stack, work, reg, front, bearer)
}

/// A first mirror whose port is closed: the writer warns naming it, goes on with the next
/// mirror, and output.json says who served what. CAPH's token goes to the origin only: the
/// mirror (another host) never sees it.
#[test]
fn a_stopped_first_mirror_falls_back_and_the_token_stays_with_the_origin() {
    if !usable(ingot_testkit::test_name!()) {
        return;
    }
    let (stack, work, reg, front, bearer) = origin_behind_token();
    // The second mirror: the same content, anonymous, recording every Authorization header.
    let mirror = Proxy::start(addr(0), addr(reg.port), Faults::default()).unwrap();
    let dead = format!("127.0.0.1:{}", free_port());
    let origin_host = format!("127.0.0.1:{}", front.port);
    let conf = registries_conf(work.path(), &origin_host, &[dead.clone(), mirror.host()]);
    let m = machine();
    let out = caph(&front.url("stacks/demo:1.0.0"), &m, &stack.public, &conf)
        .output()
        .unwrap();
    assert_done(&out);
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(
        stderr.contains(&format!("mirror {dead}/stacks/demo")) && stderr.contains("failed"),
        "no warning naming the stopped mirror:\n{}",
        show(&out)
    );
    let s = sources(&m);
    println!("sources: {s:?}");
    let by_mirror = s
        .iter()
        .find(|s| s.0 == format!("{}/stacks/demo", mirror.host()))
        .unwrap_or_else(|| panic!("{s:?}"));
    assert!(by_mirror.1 && by_mirror.3 > 0, "{s:?}");
    assert!(
        !s.iter().any(|s| s.0.starts_with(&dead) && s.2 > 0),
        "{s:?}"
    );
    let seen = mirror.stats.authorization.lock().unwrap().clone();
    assert!(
        !seen
            .iter()
            .any(|a| a.contains(&bearer) || a.contains(TOKEN)),
        "the origin's token reached the mirror: {seen:?}"
    );
    assert!(mirror.stats.requests.load(Ordering::Relaxed) > 0);
}

/// This machine's first IPv4 address that is not loopback (`ip -4 -o addr show scope global`).
fn own_address() -> Option<std::net::Ipv4Addr> {
    let out = Command::new("ip")
        .args(["-4", "-o", "addr", "show", "scope", "global"])
        .output()
        .ok()?;
    String::from_utf8_lossy(&out.stdout)
        .split_whitespace()
        .skip_while(|w| *w != "inet")
        .nth(1)?
        .split('/')
        .next()?
        .parse()
        .ok()
}

/// Issue 33: the usual pull-through cache in a data centre, a plain-HTTP `docker-registry` on a
/// private address marked `insecure = true` as podman and skopeo read it, serves a CAPH writer
/// run (ingot used to take `insecure` as "TLS, unchecked", so the cache failed and the origin
/// served everything). The address is this machine's own non-loopback one, where ingot does
/// not speak plain HTTP by itself; CAPH's token for the origin never reaches the cache.
#[test]
fn a_plain_http_cache_marked_insecure_serves_the_writer_without_the_origins_token() {
    let test = ingot_testkit::test_name!();
    if !usable(test) {
        return;
    }
    let Some(ip) = own_address() else {
        ingot_testkit::skip::skip(test, "this machine has no non-loopback IPv4 address");
        return;
    };
    let (stack, work, reg, front, bearer) = origin_behind_token();
    // The cache has its own way to the origin; the writer reaches it on `ip`, recorded.
    let cache = Registry::start_cache(
        &work.path().join("cache"),
        &format!("http://{}", reg.host()),
    );
    let at = SocketAddr::from((ip, 0));
    let cache_link = Proxy::start(at, addr(cache.port), Faults::default()).unwrap();
    let origin_host = format!("127.0.0.1:{}", front.port);
    let conf = work.path().join("registries.conf");
    fs::write(
        &conf,
        format!(
            "[[registry]]\nprefix = \"{origin_host}\"\nlocation = \"{origin_host}\"\n\
             [[registry.mirror]]\nlocation = \"{}\"\ninsecure = true\n",
            cache_link.host()
        ),
    )
    .unwrap();
    let m = machine();
    let out = caph(&front.url("stacks/demo:1.0.0"), &m, &stack.public, &conf)
        .output()
        .unwrap();
    assert_done(&out);
    let s = sources(&m);
    println!("sources: {s:?}");
    let by_cache = s
        .iter()
        .find(|s| s.0 == format!("{}/stacks/demo", cache_link.host()))
        .unwrap_or_else(|| panic!("the cache is not among the sources: {s:?}\n{}", show(&out)));
    assert!(
        by_cache.1 && by_cache.3 > 0,
        "the cache served no blob: {s:?}\n{}",
        show(&out)
    );
    let seen = cache_link.stats.authorization.lock().unwrap().clone();
    assert!(
        !seen
            .iter()
            .any(|a| a.contains(&bearer) || a.contains(TOKEN)),
        "the origin's token reached the cache: {seen:?}"
    );
    assert!(cache_link.stats.requests.load(Ordering::Relaxed) > 0);
}

/// A mirror that flips one byte of the data blob: its copy is refused for that blob, the origin
/// serves it, and the pulled layout is the signed one, byte for byte.
#[test]
fn a_mirror_flipping_a_byte_is_refused_for_the_blob_and_the_origin_serves_it() {
    if !have_tool(ingot_testkit::test_name!(), "docker-registry") {
        return;
    }
    let stack = common::demo();
    let work = tempfile::tempdir().unwrap();
    let reg = Registry::start(&work.path().join("origin"), None);
    publish(&stack.layout, &reg);
    // The largest blob: a layer's data.
    let (big, _) = fs::read_dir(stack.layout.join("blobs/sha256"))
        .unwrap()
        .map(|e| {
            let e = e.unwrap();
            (
                e.file_name().into_string().unwrap(),
                e.metadata().unwrap().len(),
            )
        })
        .max_by_key(|(_, len)| *len)
        .unwrap();
    let bad = Proxy::start(
        addr(0),
        addr(reg.port),
        Faults {
            flip: Some(Rule {
                path_contains: big.clone(),
                offset: 1000,
            }),
            ..Faults::default()
        },
    )
    .unwrap();
    let conf = registries_conf(work.path(), &reg.host(), &[bad.host()]);
    let options = RegistryOptions {
        mirrors: Some(std::sync::Arc::new(MirrorConfig::load(&conf).unwrap())),
        progress: false,
        ..RegistryOptions::default()
    };
    let reference: RegistryRef = reg.url("stacks/demo:1.0.0").parse().unwrap();
    let client = Client::connect(&reference, options).unwrap();
    let out = work.path().join("pulled");
    pull::pull(&client, &reference, &out).unwrap();
    assert!(
        bad.stats.flips.load(Ordering::Relaxed) > 0,
        "the mirror flipped nothing"
    );
    for e in fs::read_dir(stack.layout.join("blobs/sha256")).unwrap() {
        let e = e.unwrap();
        let theirs = fs::read(out.join("blobs/sha256").join(e.file_name())).unwrap();
        assert!(
            theirs == fs::read(e.path()).unwrap(),
            "{:?} differs",
            e.file_name()
        );
    }
    let served = client.served();
    println!("served: {served:?}");
    let origin = served
        .iter()
        .find(|s| !s.mirror)
        .expect("the origin served");
    assert_eq!(origin.blobs, 1, "{served:?}");
    let mirror = served.iter().find(|s| s.mirror).unwrap();
    assert!(mirror.blobs >= 1, "{served:?}");
}

/// A writer with `--target` (a disk image file) against `url`, mirrors from `conf` (none when
/// `None`), reporting to `report`.
fn target_writer(
    url: &str,
    stack: &common::Stack,
    img: &Path,
    report: &Path,
    conf: Option<&Path>,
) -> Output {
    target_writer_with(url, stack, img, report, conf, &[])
}

/// [`target_writer`] with more arguments.
fn target_writer_with(
    url: &str,
    stack: &common::Stack,
    img: &Path,
    report: &Path,
    conf: Option<&Path>,
    args: &[&str],
) -> Output {
    fs::File::create(img).unwrap().set_len(1024 << 20).unwrap();
    let mut cmd = Command::new(env!("CARGO_BIN_EXE_ingot-writer"));
    cmd.arg(url)
        .arg("--target")
        .arg(img)
        .arg("--trust-key")
        .arg(&stack.public)
        .arg("--report")
        .arg(report);
    if let Some(conf) = conf {
        cmd.arg("--registries-conf").arg(conf);
    }
    cmd.args(args).output().unwrap()
}

/// Each stack partition of `img` (`ingot-…`), with the SHA-256 of its bytes.
fn stack_partitions(img: &Path) -> Vec<(String, String)> {
    common::partitions(img)
        .into_iter()
        .filter(|(name, _, _)| name.starts_with("ingot-"))
        .map(|(name, start, size)| (name.clone(), sha256_range(img, start, size)))
        .collect()
}

/// `veritysetup verify` of every layer of `stack` on `img` against its signed root hash.
fn veritysetup_verify(img: &Path, stack: &common::Stack, work: &Path) {
    let parts = common::partitions(img);
    let extract = |name: &str| -> PathBuf {
        let (_, start, size) = parts
            .iter()
            .find(|p| p.0 == name)
            .unwrap_or_else(|| panic!("no partition {name} in {parts:?}"));
        let out = work.join(name);
        let mut from = fs::File::open(img).unwrap();
        use std::io::{Read, Seek, SeekFrom};
        from.seek(SeekFrom::Start(*start)).unwrap();
        std::io::copy(&mut from.take(*size), &mut fs::File::create(&out).unwrap()).unwrap();
        out
    };
    let on_disk = stack
        .layers
        .iter()
        .filter(|(name, _)| parts.iter().any(|p| p.0 == format!("ingot-{name}")));
    for (name, root) in on_disk {
        let data = extract(&format!("ingot-{name}"));
        let hash = extract(&format!("ingot-{name}-verity"));
        let v = Command::new(find_tool("veritysetup").expect("veritysetup"))
            .arg("verify")
            .arg(&data)
            .arg(&hash)
            .arg(root)
            .output()
            .unwrap();
        assert!(
            v.status.success(),
            "veritysetup verify {name}: {}",
            show(&v)
        );
        fs::remove_file(data).unwrap();
        fs::remove_file(hash).unwrap();
    }
}

/// A writer report's (output.json, report.json) `details.sources`: (location, mirror, bytes,
/// blobs).
fn report_sources(report: &Path) -> Vec<(String, bool, u64, u64)> {
    let v: serde_json::Value = serde_json::from_slice(&fs::read(report).unwrap()).unwrap();
    v["details"]["sources"]
        .as_array()
        .unwrap_or_else(|| panic!("no details.sources in the report: {v}"))
        .iter()
        .map(|s| {
            (
                s["location"].as_str().unwrap().to_owned(),
                s["mirror"].as_bool().unwrap(),
                s["bytes"].as_u64().unwrap(),
                s["blobs"].as_u64().unwrap(),
            )
        })
        .collect()
}

/// A one-layer stack of the demo's base tree plus 4 MiB of random bytes, in 16 KiB zstd
/// frames (some 260 of them), built in `dir`.
fn many_frames(dir: &Path) -> common::Stack {
    let tree = dir.join("tree");
    let out = Command::new("cp")
        .arg("-a")
        .arg(repo_root().join("tests/fixtures/demo/base"))
        .arg(&tree)
        .output()
        .unwrap();
    assert!(out.status.success(), "{}", show(&out));
    let data = ingot_testkit::noise::noise(1, 4 << 20);
    fs::write(tree.join("usr/random.bin"), data).unwrap();
    let manifest = dir.join("frames.toml");
    fs::write(
        &manifest,
        format!(
            "name = \"frames\"\nversion = \"1\"\nsource_date_epoch = 1700000000\n\n[boot]\n\
             kernel = \"/boot/vmlinuz\"\ninitrd = \"/boot/initrd.img\"\n\
             efi = \"/boot/efi/EFI/BOOT/BOOTX64.EFI\"\n\n[[layer]]\nname = \"base\"\n\
             kind = \"base\"\nsource = {{ dir = \"{}\" }}\n",
            tree.display()
        ),
    )
    .unwrap();
    common::build_stack_framed(&manifest, 16 << 10)
}

/// The base layer's data blob: (digest, size, the blob offset where each zstd frame starts).
fn base_blob(stack: &common::Stack) -> (String, u64, Vec<u64>) {
    let data = ingot_testkit::layout::read(&stack.layout).layer("base")["data"].clone();
    let mut starts = vec![0];
    for f in data["compression"]["frames"].as_array().unwrap() {
        let next = starts.last().unwrap() + f.as_u64().unwrap();
        starts.push(next);
    }
    starts.pop();
    (
        data["digest"].as_str().unwrap().to_owned(),
        data["size"].as_u64().unwrap(),
        starts,
    )
}

/// A writer streaming the base layer through a mirror that flips a byte of its data blob: the
/// engine's block check refuses the mirror's bytes, the writer warns naming the mirror and the
/// blob, and writes the layer again from the origin. The disk is the one a writer streaming
/// from the origin alone writes, byte for byte, and veritysetup verifies it; the report counts
/// what each source served. Once with the flip in the blob's first (only) frame, once in a
/// later frame of a stack cut into small frames.
#[test]
fn a_writer_through_a_mirror_flipping_a_byte_writes_the_layer_again_from_the_origin() {
    if !have_tools(
        ingot_testkit::test_name!(),
        &["docker-registry", "veritysetup"],
    ) {
        return;
    }
    let scratch = tempfile::tempdir_in("/var/tmp").unwrap();
    let framed = many_frames(scratch.path());
    for (what, stack) in [
        ("the first frame", common::demo()),
        ("a later frame", framed),
    ] {
        let work = tempfile::tempdir_in("/var/tmp").unwrap();
        let reg = Registry::start(&work.path().join("origin"), None);
        publish(&stack.layout, &reg);
        let (digest, size, starts) = base_blob(&stack);
        // The demo's base blob is one small frame: it has arrived whole, and failed its
        // digest, before the engine checks it. The other stack's flip is in a frame with far
        // more frames after it than the pipeline holds: the engine's block check finds it.
        let offset = if starts.len() == 1 {
            size / 2
        } else {
            let i = starts.len() / 4;
            starts[i] + (starts[i + 1] - starts[i]) / 2
        };
        println!(
            "{what}: {} frames, the flip at byte {offset} of {size}",
            starts.len()
        );
        assert_eq!(
            what == "a later frame",
            starts.len() > 1 && offset >= starts[1],
            "{what}: frames at {starts:?}, the flip at {offset}"
        );
        let bad = Proxy::start(
            addr(0),
            addr(reg.port),
            Faults {
                flip: Some(Rule {
                    path_contains: digest.clone(),
                    offset,
                }),
                ..Faults::default()
            },
        )
        .unwrap();
        let conf = registries_conf(work.path(), &reg.host(), &[bad.host()]);
        let url = reg.url("stacks/demo:1.0.0");

        let alone = work.path().join("alone.img");
        let out = target_writer(&url, &stack, &alone, &work.path().join("alone.json"), None);
        assert!(out.status.success(), "{what}: {}", show(&out));

        let img = work.path().join("disk.img");
        let report = work.path().join("report.json");
        let out = target_writer(&url, &stack, &img, &report, Some(&conf));
        assert!(out.status.success(), "{what}: {}", show(&out));
        assert!(
            bad.stats.flips.load(Ordering::Relaxed) > 0,
            "{what}: no flip"
        );
        let stderr = String::from_utf8_lossy(&out.stderr);
        let mirror = format!("{}/stacks/demo", bad.host());
        let warning = stderr.lines().find(|l| {
            l.contains(&format!("mirror {mirror}"))
                && l.contains(&digest)
                && l.contains("writing the layer again from origin")
        });
        let warning = warning.unwrap_or_else(|| {
            panic!(
                "{what}: no warning naming the mirror and the blob:\n{}",
                show(&out)
            )
        });
        println!("{what}: {warning}");
        if what == "a later frame" {
            assert!(
                warning.contains("does not match the signed hash tree")
                    || warning.contains("zstd frame"),
                "{what}: not refused by the engine's check: {warning}"
            );
        }
        let parts = stack_partitions(&img);
        assert!(parts.len() >= 2, "{what}: {parts:?}");
        assert_eq!(
            parts,
            stack_partitions(&alone),
            "{what}: not the signed image"
        );
        veritysetup_verify(&img, &stack, work.path());
        // The origin served the refused blob alone, whole; the mirror the rest.
        let s = report_sources(&report);
        println!("{what}: sources {s:?}");
        let origin = s.iter().find(|s| !s.1).unwrap_or_else(|| panic!("{s:?}"));
        assert_eq!((origin.2, origin.3), (size, 1), "{what}: {s:?}");
        let by_mirror = s
            .iter()
            .find(|s| s.0 == mirror)
            .unwrap_or_else(|| panic!("{s:?}"));
        assert!(
            by_mirror.1 && by_mirror.3 >= 1 && by_mirror.2 > 0,
            "{what}: {s:?}"
        );
    }
}

/// The blob byte to flip so that the base layer's block holding `path`'s inode is bad: in the
/// frame that holds the block (found by `debugfs imap` in the layer's image), a byte whose flip
/// leaves the frame decodable but changes that block (so the block fails the signed tree), else
/// one that makes the frame undecodable. Returns (frame, blob offset, whether it decodes).
fn inode_flip(stack: &common::Stack, path: &str, work: &Path) -> (usize, u64, bool) {
    let (digest, _, starts) = base_blob(stack);
    let data = ingot_testkit::layout::read(&stack.layout).layer("base")["data"].clone();
    let frame_size = data["compression"]["frameSize"].as_u64().unwrap() as usize;
    let blob = fs::read(
        stack
            .layout
            .join("blobs/sha256")
            .join(digest.trim_start_matches("sha256:")),
    )
    .unwrap();
    let image = zstd::stream::decode_all(&blob[..]).unwrap();
    let img = work.join("base.img");
    fs::write(&img, &image).unwrap();
    let out = Command::new(find_tool("debugfs").expect("debugfs"))
        .arg("-R")
        .arg(format!("imap {path}"))
        .arg(&img)
        .output()
        .unwrap();
    assert!(out.status.success(), "debugfs: {}", show(&out));
    fs::remove_file(&img).unwrap();
    // `located at block 35, offset 0x0b00`
    let text = String::from_utf8_lossy(&out.stdout);
    let block: usize = text
        .split("located at block ")
        .nth(1)
        .and_then(|t| t.split(',').next())
        .and_then(|b| b.trim().parse().ok())
        .unwrap_or_else(|| panic!("debugfs imap {path}: {}", show(&out)));
    let frame = block * 4096 / frame_size;
    let within = block * 4096 - frame * frame_size;
    let good = &image[block * 4096..(block + 1) * 4096];
    let start = starts[frame] as usize;
    let end = starts.get(frame + 1).map_or(blob.len(), |e| *e as usize);
    // Some(true): the frame decodes and the block differs; Some(false): it does not decode.
    let spoils = |at: usize| -> Option<bool> {
        let mut compressed = blob[start..end].to_vec();
        compressed[at - start] ^= 0x01;
        let mut out = vec![0u8; frame_size];
        match zstd::bulk::Decompressor::new()
            .unwrap()
            .decompress_to_buffer(&compressed[..], &mut out)
        {
            Err(_) => Some(false),
            Ok(n) if n < within + 4096 || out[within..within + 4096] != *good => Some(true),
            Ok(_) => None,
        }
    };
    let at = (start..end)
        .find(|at| spoils(*at) == Some(true))
        .or_else(|| (start..end).find(|at| spoils(*at).is_some()))
        .unwrap_or_else(|| panic!("no byte of frame {frame} spoils block {block}"));
    let decodes = spoils(at) == Some(true);
    println!(
        "{path}: inode in block {block}, zstd frame {frame} (bytes {start}..{end}), flip at {at} \
         (the frame then decodes: {decodes})"
    );
    (frame, at as u64, decodes)
}

/// A writer through a mirror that flips a byte of the base's data blob in the zstd frame that
/// holds the kernel's inode, which the `plan` step reads (ranged, before anything is written)
/// for the boot files' sizes: the plan refuses the mirror for the blob, warning naming it and
/// the frame, fetches the frame again from the origin, and `write` streams the blob from the
/// origin alone (the mirror is not asked for it again). The disk is the signed image
/// (veritysetup verifies it); the report counts the refused frame's bytes for the mirror.
#[test]
fn a_mirror_flipping_a_byte_of_a_boot_file_frame_is_refused_in_the_plan() {
    if !have_tools(
        ingot_testkit::test_name!(),
        &["docker-registry", "veritysetup", "debugfs"],
    ) {
        return;
    }
    let work = tempfile::tempdir_in("/var/tmp").unwrap();
    let stack = many_frames(work.path());
    let (digest, size, starts) = base_blob(&stack);
    let (frame, offset, decodes) = inode_flip(&stack, "/boot/vmlinuz", work.path());
    let frame_len = starts.get(frame + 1).map_or(size, |e| *e) - starts[frame];
    let reg = Registry::start(&work.path().join("origin"), None);
    publish(&stack.layout, &reg);
    let bad = Proxy::start(
        addr(0),
        addr(reg.port),
        Faults {
            flip: Some(Rule {
                path_contains: digest.clone(),
                offset,
            }),
            ..Faults::default()
        },
    )
    .unwrap();
    let conf = registries_conf(work.path(), &reg.host(), &[bad.host()]);
    let url = reg.url("stacks/demo:1.0.0");

    let alone = work.path().join("alone.img");
    let out = target_writer(&url, &stack, &alone, &work.path().join("alone.json"), None);
    assert!(out.status.success(), "{}", show(&out));

    let img = work.path().join("disk.img");
    let report = work.path().join("report.json");
    let out = target_writer(&url, &stack, &img, &report, Some(&conf));
    assert!(out.status.success(), "{}", show(&out));
    assert!(bad.stats.flips.load(Ordering::Relaxed) > 0, "no flip");
    assert!(
        bad.stats.ranged.load(Ordering::Relaxed) > 0,
        "the mirror served no frame"
    );
    let stderr = String::from_utf8_lossy(&out.stderr);
    let mirror = format!("{}/stacks/demo", bad.host());
    let warning = stderr
        .lines()
        .find(|l| {
            l.contains(&format!("mirror {mirror} sent zstd frame {frame} "))
                && l.contains(&digest)
                && l.contains("refused for this blob, fetching the frame again from origin")
        })
        .unwrap_or_else(|| {
            panic!(
                "no warning naming the mirror and the frame:\n{}",
                show(&out)
            )
        });
    println!("{warning}");
    // The same warning in the status file, as the write step's refusals are.
    let status: serde_json::Value =
        serde_json::from_str(&fs::read_to_string(&report).unwrap()).unwrap();
    let in_status = status["warnings"].as_array().is_some_and(|ws| {
        ws.iter().any(|w| {
            w.as_str()
                .is_some_and(|w| w.contains(&format!("mirror {mirror} sent zstd frame {frame} ")))
        })
    });
    assert!(in_status, "not in the status file's warnings: {status}");
    // The block the plan reads fails the signed tree (or the frame does not decode at all).
    let check = if decodes {
        "against the layer's signed hash tree: data block"
    } else {
        "does not decode"
    };
    assert!(warning.contains(check), "not `{check}`: {warning}");
    assert!(
        !stderr.contains("writing the layer again"),
        "write went back to the mirror: {}",
        show(&out)
    );
    let parts = stack_partitions(&img);
    assert!(parts.len() >= 2, "{parts:?}");
    assert_eq!(parts, stack_partitions(&alone), "not the signed image");
    veritysetup_verify(&img, &stack, work.path());
    // The origin: the frames the plan read after the refusal (the refused one among them) and
    // the whole blob, once; the mirror: the frames it sent before, the refused one included.
    let s = report_sources(&report);
    println!("sources {s:?}");
    let origin = s.iter().find(|s| !s.1).unwrap_or_else(|| panic!("{s:?}"));
    assert!(
        origin.3 == 1 && origin.2 >= size + frame_len,
        "{s:?} (blob {size} bytes, frame {frame_len})"
    );
    let by_mirror = s
        .iter()
        .find(|s| s.0 == mirror)
        .unwrap_or_else(|| panic!("{s:?}"));
    assert!(
        by_mirror.1 && by_mirror.2 >= frame_len && by_mirror.3 >= 1,
        "{s:?}"
    );
}

/// Every source serves the blob with a flipped byte (the mirror and the origin both): the run
/// fails in `write`, naming each source and why, and the disk has no partition table.
#[test]
fn when_every_source_flips_a_byte_the_write_fails_naming_each() {
    if !have_tool(ingot_testkit::test_name!(), "docker-registry") {
        return;
    }
    let (stack, work, reg) = published_demo();
    let (digest, size, _) = base_blob(&stack);
    let flipping = || {
        Proxy::start(
            addr(0),
            addr(reg.port),
            Faults {
                flip: Some(Rule {
                    path_contains: digest.clone(),
                    offset: size / 2,
                }),
                ..Faults::default()
            },
        )
        .unwrap()
    };
    let (origin, bad) = (flipping(), flipping());
    let conf = registries_conf(work.path(), &origin.host(), &[bad.host()]);
    let img = work.path().join("disk.img");
    let report = work.path().join("report.json");
    let out = target_writer(
        &format!("oci://{}/stacks/demo:1.0.0", origin.host()),
        &stack,
        &img,
        &report,
        Some(&conf),
    );
    assert_eq!(out.status.code(), Some(1), "{}", show(&out));
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(
        stderr.contains("every source of the data blob")
            && stderr.contains(&digest)
            && stderr.contains(&format!("mirror {}/stacks/demo (", bad.host()))
            && stderr.contains(&format!("origin {}/stacks/demo (", origin.host())),
        "{}",
        show(&out)
    );
    let status: serde_json::Value = serde_json::from_slice(&fs::read(&report).unwrap()).unwrap();
    assert_eq!(status["stage"], "write", "{status}");
    // Neither an MBR signature nor a GPT header, primary or backup.
    use std::os::unix::fs::FileExt;
    let f = fs::File::open(&img).unwrap();
    let (mut head, mut last) = ([0u8; 1024], [0u8; 8]);
    f.read_exact_at(&mut head, 0).unwrap();
    f.read_exact_at(&mut last, f.metadata().unwrap().len() - 512)
        .unwrap();
    assert!(
        head[510..512] != [0x55, 0xAA] && &head[512..520] != b"EFI PART" && &last != b"EFI PART",
        "the disk has a partition table"
    );
}

/// Every source flips a byte of the frame with the kernel's inode (the mirror and the origin
/// both): the plan refuses each in turn and fails, naming both and why, before anything is
/// written: the disk is still all zeros.
#[test]
fn when_every_source_flips_a_boot_file_frame_the_plan_fails_naming_each() {
    if !have_tools(ingot_testkit::test_name!(), &["docker-registry", "debugfs"]) {
        return;
    }
    let stack = common::demo();
    let work = tempfile::tempdir_in("/var/tmp").unwrap();
    let (digest, _, _) = base_blob(&stack);
    let (frame, offset, _) = inode_flip(&stack, "/boot/vmlinuz", work.path());
    let reg = Registry::start(&work.path().join("origin"), None);
    publish(&stack.layout, &reg);
    let flipping = || {
        Proxy::start(
            addr(0),
            addr(reg.port),
            Faults {
                flip: Some(Rule {
                    path_contains: digest.clone(),
                    offset,
                }),
                ..Faults::default()
            },
        )
        .unwrap()
    };
    let (origin, bad) = (flipping(), flipping());
    let conf = registries_conf(work.path(), &origin.host(), &[bad.host()]);
    let img = work.path().join("disk.img");
    let report = work.path().join("report.json");
    let out = target_writer(
        &format!("oci://{}/stacks/demo:1.0.0", origin.host()),
        &stack,
        &img,
        &report,
        Some(&conf),
    );
    assert_eq!(out.status.code(), Some(1), "{}", show(&out));
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(
        stderr.contains(&format!(
            "zstd frame {frame}: every source sent bytes that fail the layer's check: "
        )) && stderr.contains(&format!("mirror {}/stacks/demo (", bad.host()))
            && stderr.contains(&format!("origin {}/stacks/demo (", origin.host())),
        "{}",
        show(&out)
    );
    let status: serde_json::Value = serde_json::from_slice(&fs::read(&report).unwrap()).unwrap();
    assert_eq!(status["stage"], "plan", "{status}");
    assert!(
        fs::read(&img).unwrap().iter().all(|b| *b == 0),
        "the disk was written"
    );
}

/// A dry run of the demo from `reg` through `conf`, which must succeed; its report's path.
fn dry_run(reg: &Registry, stack: &common::Stack, work: &Path, conf: &Path) -> PathBuf {
    let report = work.join("report.json");
    let out = target_writer_with(
        &reg.url("stacks/demo:1.0.0"),
        stack,
        &work.join("disk.img"),
        &report,
        Some(conf),
        &["--dry-run"],
    );
    assert!(out.status.success(), "{}", show(&out));
    report
}

/// The demo stack published to a new origin registry, in a new work directory in /var/tmp
/// (the writer's disk images are large for /tmp).
fn published_demo() -> (common::Stack, tempfile::TempDir, Registry) {
    let stack = common::demo();
    let work = tempfile::tempdir_in("/var/tmp").unwrap();
    let reg = Registry::start(&work.path().join("origin"), None);
    publish(&stack.layout, &reg);
    (stack, work, reg)
}

/// A writer report's `details.sources` as JSON, one object per source.
fn report_sources_json(report: &Path) -> Vec<serde_json::Value> {
    let v: serde_json::Value = serde_json::from_slice(&fs::read(report).unwrap()).unwrap();
    v["details"]["sources"]
        .as_array()
        .unwrap_or_else(|| panic!("no details.sources in the report: {v}"))
        .clone()
}

/// The source at `location` in `sources`.
fn source_at<'a>(sources: &'a [serde_json::Value], location: &str) -> &'a serde_json::Value {
    sources
        .iter()
        .find(|s| s["location"] == location)
        .unwrap_or_else(|| panic!("no source {location} in {sources:#?}"))
}

/// A proxy in front of `reg` that closes the connection of every request for a path containing
/// `dead` (a registry that died for that content).
fn dead_for(reg: &Registry, dead: &str) -> Proxy {
    Proxy::start(
        addr(0),
        addr(reg.port),
        Faults {
            dead: Some(dead.to_owned()),
            ..Faults::default()
        },
    )
    .unwrap()
}

/// A run that fails names every source it tried and why, as a run that succeeds names what
/// each served: a mirror refused for bad bytes of the base layer's data blob, then an origin
/// that drops every request for that blob. `details.sources` has both, each with its failures.
#[test]
fn a_failed_run_names_every_source_it_tried_and_why() {
    if !have_tool(ingot_testkit::test_name!(), "docker-registry") {
        return;
    }
    let (stack, work, reg) = published_demo();
    let (digest, size, _) = base_blob(&stack);
    let bad = Proxy::start(
        addr(0),
        addr(reg.port),
        Faults {
            flip: Some(Rule {
                path_contains: digest.clone(),
                offset: size / 2,
            }),
            ..Faults::default()
        },
    )
    .unwrap();
    let origin = dead_for(&reg, &digest);
    let conf = registries_conf(work.path(), &origin.host(), &[bad.host()]);
    let report = work.path().join("report.json");
    let out = target_writer_with(
        &format!("oci://{}/stacks/demo:1.0.0", origin.host()),
        &stack,
        &work.path().join("disk.img"),
        &report,
        Some(&conf),
        &["--retries", "2", "-v"],
    );
    assert_eq!(out.status.code(), Some(1), "{}", show(&out));
    assert!(
        origin.stats.dropped.load(Ordering::Relaxed) > 0,
        "{}",
        show(&out)
    );
    let sources = report_sources_json(&report);
    println!("{sources:#?}");
    let mirror = source_at(&sources, &format!("{}/stacks/demo", bad.host()));
    let errors = mirror["errors"].to_string();
    assert!(
        mirror["mirror"] == true
            && mirror["failures"].as_u64() >= Some(1)
            && errors.contains(&digest)
            && errors.contains("refused for this blob"),
        "{mirror}"
    );
    let o = source_at(&sources, &format!("{}/stacks/demo", origin.host()));
    let errors = o["errors"].to_string();
    assert!(
        o["mirror"] == false
            && o["failures"].as_u64() >= Some(1)
            && errors.contains(&digest)
            && errors.contains("gave up after 2 attempts"),
        "{o}"
    );
    // The log says it too.
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(
        stderr.contains(&format!("origin {}/stacks/demo failed: ", origin.host())),
        "{}",
        show(&out)
    );
}

/// A dry run through a mirror records what each source served, as a real run does.
#[test]
fn a_dry_run_through_a_mirror_names_its_sources() {
    if !have_tool(ingot_testkit::test_name!(), "docker-registry") {
        return;
    }
    let (stack, work, reg) = published_demo();
    let mirror = Proxy::start(addr(0), addr(reg.port), Faults::default()).unwrap();
    let conf = registries_conf(work.path(), &reg.host(), &[mirror.host()]);
    let report = dry_run(&reg, &stack, work.path(), &conf);
    let sources = report_sources_json(&report);
    let m = source_at(&sources, &format!("{}/stacks/demo", mirror.host()));
    assert!(
        m["mirror"] == true && m["bytes"].as_u64() > Some(0) && m["failures"] == 0,
        "{sources:#?}"
    );
    let status: serde_json::Value = serde_json::from_slice(&fs::read(&report).unwrap()).unwrap();
    assert_eq!(status["state"], "dry-run", "{status}");
    assert_eq!(
        status["details"]["resolved"]["location"],
        format!("{}/stacks/demo", mirror.host()),
        "{status}"
    );
}

/// A mirror whose location is the origin's is the origin: the report has one line for it,
/// labelled the origin, with what it served (not a mirror line in place of the origin's).
#[test]
fn a_mirror_at_the_origins_location_is_reported_as_the_origin() {
    if !have_tool(ingot_testkit::test_name!(), "docker-registry") {
        return;
    }
    let (stack, work, reg) = published_demo();
    let conf = registries_conf(work.path(), &reg.host(), &[reg.host()]);
    let report = dry_run(&reg, &stack, work.path(), &conf);
    let sources = report_sources(&report);
    assert_eq!(sources.len(), 1, "{sources:?}");
    let (location, mirror, bytes, _) = &sources[0];
    assert_eq!(location, &format!("{}/stacks/demo", reg.host()));
    assert!(!mirror && *bytes > 0, "{sources:?}");
}

/// The demo manifest as release `version` (its paths made absolute), in `dir`.
fn demo_version(dir: &Path, version: &str) -> PathBuf {
    let text = fs::read_to_string(repo_root().join("manifests/demo.toml")).unwrap();
    let root = repo_root().join("manifests");
    let text = text
        .replace("version = \"1.0.0\"", &format!("version = \"{version}\""))
        .replace("\"../", &format!("\"{}/../", root.display()));
    let path = dir.join(format!("demo-{version}.toml"));
    fs::write(&path, text).unwrap();
    path
}

/// A mirror whose tag names an older signed release than the origin's: the writer says which
/// source resolved the tag (log and `details.resolved`) and warns that the tag, a version,
/// is not the release it got.
#[test]
fn a_mirror_answering_a_version_tag_with_another_release_is_named_and_warned_about() {
    if !have_tool(ingot_testkit::test_name!(), "docker-registry") {
        return;
    }
    let work = tempfile::tempdir_in("/var/tmp").unwrap();
    let key = ingot_artifact::sign::SecretKey::generate().to_minisign();
    let signed = || ingot_artifact::sign::SecretKey::from_minisign(&key).unwrap();
    let old =
        common::build_stack_keyed(&demo_version(work.path(), "1.9.0"), 4 << 20, None, signed());
    let new =
        common::build_stack_keyed(&demo_version(work.path(), "2.0.0"), 4 << 20, None, signed());
    let origin = Registry::start(&work.path().join("origin"), None);
    let stale = Registry::start(&work.path().join("stale"), None);
    let push_as = |layout: &Path, reg: &Registry| {
        let r: RegistryRef = reg.url("stacks/demo:2.0.0").parse().unwrap();
        let client = Client::connect(&r, RegistryOptions::default()).unwrap();
        push::publish(&client, layout, &r, false).unwrap();
    };
    push_as(&new.layout, &origin);
    push_as(&old.layout, &stale);
    let conf = registries_conf(work.path(), &origin.host(), &[stale.host()]);
    let report = work.path().join("report.json");
    let out = target_writer_with(
        &origin.url("stacks/demo:2.0.0"),
        &new,
        &work.path().join("disk.img"),
        &report,
        Some(&conf),
        &["--dry-run", "-v"],
    );
    assert!(out.status.success(), "{}", show(&out));
    let stale_at = format!("{}/stacks/demo", stale.host());
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(
        stderr.contains("tag 2.0.0 resolved to sha256:")
            && stderr.contains(&format!("by mirror {stale_at}")),
        "{}",
        show(&out)
    );
    let status: serde_json::Value = serde_json::from_slice(&fs::read(&report).unwrap()).unwrap();
    assert_eq!(
        status["details"]["resolved"]["location"], stale_at,
        "{status}"
    );
    assert_eq!(status["details"]["resolved"]["mirror"], true, "{status}");
    let warned = status["warnings"].as_array().is_some_and(|ws| {
        ws.iter().any(|w| {
            w.as_str().is_some_and(|w| {
                w.contains("tag 2.0.0 looks like a version")
                    && w.contains(&format!("mirror {stale_at}"))
                    && w.contains("version 1.9.0")
            })
        })
    });
    assert!(warned, "no warning about the release: {status}");
}

/// A registry that dies while the writer reads from it is `download-failed` whichever step was
/// reading: `verify` (the base layer's hash blob) and `stage` (the base layer's frames holding
/// /etc/passwd), not `image-invalid` or `stage-failed`; no disk changed.
#[test]
fn a_registry_dying_during_verify_or_stage_is_a_download_failure() {
    if !usable(ingot_testkit::test_name!()) {
        return;
    }
    let (stack, _work, reg) = published_demo();
    let hash = ingot_testkit::layout::read(&stack.layout).layer("base")["hash"]["digest"]
        .as_str()
        .unwrap()
        .to_owned();
    let (data, _, _) = base_blob(&stack);
    for (step, dead) in [("verify", hash), ("stage", data)] {
        let proxy = dead_for(&reg, &dead);
        let m = machine();
        let out = caph(
            &format!("oci://{}/stacks/demo:1.0.0", proxy.host()),
            &m,
            &stack.public,
            Path::new("none"),
        )
        .args(["--retries", "2"])
        .output()
        .unwrap();
        assert_eq!(out.status.code(), Some(1), "{step}: {}", show(&out));
        assert!(
            proxy.stats.dropped.load(Ordering::Relaxed) > 0,
            "{step}: {}",
            show(&out)
        );
        let stdout = String::from_utf8_lossy(&out.stdout);
        let last = stdout.lines().last().unwrap_or("");
        assert!(
            last.starts_with("ingot-writer: FAILED (download-failed): ")
                && last.ends_with("no disk was changed"),
            "{step}: {}",
            show(&out)
        );
        let status: serde_json::Value =
            serde_json::from_slice(&fs::read(m.dir.path().join("output.json")).unwrap()).unwrap();
        assert_eq!(status["stage"], step, "{status}");
    }
}
