//! `--json` on every `ingot` command whose output a program reads: build, verify (a pass and a
//! failure), layer build, publish, pull and resolve (against a real `docker-registry`; skipped
//! without it). Each output is parsed and its keys checked: the set each command promises, all
//! camelCase (the convention of `inspect --json`, `diff --json` and the stack descriptor).
//! `verity … --json` is checked in verity_cli.rs.

mod common;

use std::path::Path;

use common::{demo_manifest, have_tool, ingot, keypair};
use ingot_testkit::registry::Registry;
use serde_json::Value;

fn p(path: &Path) -> &str {
    path.to_str().unwrap()
}

/// Runs ingot, expects `code`, parses stdout as one JSON object.
fn json(args: &[&str], code: i32) -> Value {
    let out = ingot(args);
    assert_eq!(
        out.status.code(),
        Some(code),
        "ingot {args:?}: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    serde_json::from_slice(&out.stdout).unwrap_or_else(|e| {
        panic!(
            "ingot {args:?} printed no JSON ({e}): {}",
            String::from_utf8_lossy(&out.stdout)
        )
    })
}

/// Every key of `v`, recursively, is camelCase (no `_`, no `-`, lower-case first letter).
fn assert_camel_case(v: &Value) {
    match v {
        Value::Object(map) => {
            for (k, v) in map {
                assert!(
                    !k.contains(['_', '-']) && k.starts_with(|c: char| c.is_ascii_lowercase()),
                    "key {k:?} is not camelCase"
                );
                assert_camel_case(v);
            }
        }
        Value::Array(items) => items.iter().for_each(assert_camel_case),
        _ => {}
    }
}

/// `v` is an object with exactly these keys, all camelCase.
fn assert_keys(v: &Value, keys: &[&str]) {
    let mut have: Vec<&str> = v.as_object().unwrap().keys().map(String::as_str).collect();
    let mut want = keys.to_vec();
    have.sort_unstable();
    want.sort_unstable();
    assert_eq!(have, want, "{v:#}");
    assert_camel_case(v);
}

fn is_digest(v: &Value) -> bool {
    v.as_str()
        .and_then(|s| s.strip_prefix("sha256:"))
        .is_some_and(|h| h.len() == 64)
}

#[test]
fn every_json_output_parses_with_camel_case_keys() {
    let tmp = tempfile::tempdir().unwrap();
    let (sk, pk) = keypair(tmp.path(), "release");
    let layout = tmp.path().join("demo");

    let built = json(
        &[
            "build",
            p(&demo_manifest()),
            "--out",
            p(&layout),
            "--sign-key",
            p(&sk),
            "-q",
            "--json",
        ],
        0,
    );
    assert_keys(
        &built,
        &[
            "name",
            "version",
            "layout",
            "manifestDigest",
            "descriptorDigest",
            "signed",
            "layers",
            "size",
            "compressedSize",
            "uki",
            "trees",
        ],
    );
    assert_eq!(built["signed"], true);
    // No layer made from Debian packages: no tree to reuse or build (debian_lock.rs checks a
    // reused one's `{"layer", "reused", "reason"}`).
    assert_eq!(built["trees"], serde_json::json!([]), "{built:#}");
    // Built without --secure-boot-key: no unified kernel image.
    assert_eq!(built["uki"], Value::Null, "{built:#}");
    assert!(is_digest(&built["manifestDigest"]), "{built:#}");

    let verified = json(&["verify", p(&layout), "--trust-key", p(&pk), "--json"], 0);
    assert_keys(
        &verified,
        &[
            "verified",
            "name",
            "version",
            "manifestDigest",
            "descriptorDigest",
            "signature",
            "layers",
        ],
    );
    assert_eq!(verified["verified"], true);
    assert_eq!(verified["manifestDigest"], built["manifestDigest"]);
    assert_eq!(verified["signature"]["status"], "verified");
    let layers = verified["layers"].as_array().unwrap();
    assert_eq!(Some(layers.len() as u64), built["layers"].as_u64());
    assert_keys(&layers[0], &["name", "rootHash"]);

    // A failure is JSON too, with the same exit code as without --json (3: wrong key).
    let (_, other) = keypair(tmp.path(), "other");
    let refused = json(
        &["verify", p(&layout), "--trust-key", p(&other), "--json"],
        3,
    );
    assert_keys(&refused, &["stack", "verified", "error", "exitCode"]);
    assert_eq!(refused["verified"], false);
    assert_eq!(refused["exitCode"], 3);

    layer_build(tmp.path());

    if have_tool(ingot_testkit::test_name!(), "docker-registry") {
        registry_commands(tmp.path(), &layout, &built["manifestDigest"]);
    }
}

/// layer build --json.
fn layer_build(dir: &Path) {
    let tree = dir.join("tree");
    std::fs::create_dir_all(tree.join("etc")).unwrap();
    std::fs::write(tree.join("etc/hostname"), "node\n").unwrap();
    let img = dir.join("layer.img");
    let hash = dir.join("layer.hash");
    let layer = json(
        &[
            "layer",
            "build",
            p(&tree),
            p(&img),
            "--verity",
            p(&hash),
            "--json",
        ],
        0,
    );
    assert_keys(
        &layer,
        &[
            "image",
            "imageSize",
            "dataBlocks",
            "usedBlocks",
            "inodes",
            "fsUuid",
            "hash",
            "rootHash",
            "salt",
            "verityUuid",
            "hashSize",
        ],
    );
    assert_eq!(
        layer["imageSize"].as_u64(),
        Some(std::fs::metadata(&img).unwrap().len())
    );
}

/// publish, pull and resolve --json against a real registry.
fn registry_commands(dir: &Path, layout: &Path, digest: &Value) {
    let registry = Registry::start(&dir.join("reg"), None);
    let target = registry.url("stacks/demo:1.0.0");
    let published = json(&["publish", p(layout), &target, "-q", "--json"], 0);
    let keys = [
        "reference",
        "digest",
        "unchanged",
        "blobsPushed",
        "bytesPushed",
        "blobsSkipped",
    ];
    assert_keys(&published, &keys);
    assert_eq!(&published["digest"], digest);
    assert_eq!(published["unchanged"], false);
    assert!(published["blobsPushed"].as_u64().unwrap() >= 2);
    let again = json(&["publish", p(layout), &target, "-q", "--json"], 0);
    assert_keys(&again, &keys);
    assert_eq!(again["unchanged"], true);
    assert_eq!(again["blobsPushed"], 0);

    let resolved = json(&["resolve", &target, "--json"], 0);
    assert_keys(&resolved, &["reference", "digest", "source"]);
    assert_eq!(&resolved["digest"], digest);
    assert_keys(&resolved["source"], &["location", "mirror"]);
    assert_eq!(resolved["source"]["mirror"], false);

    let out = dir.join("pulled");
    let pulled = json(&["pull", &target, p(&out), "-q", "--json"], 0);
    assert_keys(
        &pulled,
        &[
            "reference",
            "digest",
            "layout",
            "blobsFetched",
            "bytesFetched",
            "blobsReused",
            "sources",
        ],
    );
    assert_eq!(&pulled["digest"], digest);
    // No mirror is configured for this registry: the origin alone served it.
    let sources = pulled["sources"].as_array().unwrap();
    assert_eq!(sources.len(), 1, "{pulled:#}");
    assert_keys(
        &sources[0],
        &[
            "location", "mirror", "bytes", "blobs", "failures", "errors", "down",
        ],
    );
    assert_eq!(sources[0]["mirror"], false);
    assert_eq!(sources[0]["failures"], 0);
    assert_eq!(sources[0]["down"], false);
    assert_eq!(sources[0]["blobs"], pulled["blobsFetched"]);
    assert_eq!(pulled["blobsFetched"], published["blobsPushed"]);
    assert_eq!(pulled["bytesFetched"], published["bytesPushed"]);
}
