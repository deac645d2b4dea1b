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
use ingot_testkit::skip::{have_root, have_tool};
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
    let v: serde_json::Value =
        serde_json::from_slice(&fs::read(m.dir.path().join("output.json")).unwrap()).unwrap();
    v["details"]["sources"]
        .as_array()
        .unwrap_or_else(|| panic!("no details.sources in output.json: {v}"))
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

/// A first mirror whose port is closed: the writer warns naming it, goes on with the next
/// mirror, and output.json says who served what. CAPH's token goes to the origin only: the
/// mirror (another host) never sees it.
#[test]
fn a_stopped_first_mirror_falls_back_and_the_token_stays_with_the_origin() {
    if !usable(ingot_testkit::test_name!()) {
        return;
    }
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
