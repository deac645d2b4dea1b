//! `ingot diff` between real demo builds: two builds that differ in one file of one layer, and a
//! build against itself.

mod common;

use std::fs;
use std::path::{Path, PathBuf};
use std::process::Output;

use common::{build, demo_copy, demo_manifest, ingot, keypair};
use serde_json::Value;

/// The demo manifest with its base layer read from a copy of the fixture tree, in which
/// `/etc/os-release` has one byte changed (same size, so only the content differs).
fn demo_with_changed_os_release(dir: &Path) -> PathBuf {
    let (manifest, base) = demo_copy(dir, "demo");
    let os_release = base.join("etc/os-release");
    let mut bytes = fs::read(&os_release).unwrap();
    let i = bytes.iter().position(|b| b.is_ascii_lowercase()).unwrap();
    bytes[i] = if bytes[i] == b'z' { b'y' } else { bytes[i] + 1 };
    fs::write(&os_release, bytes).unwrap();
    manifest
}

fn json(out: &Output) -> Value {
    serde_json::from_slice(&out.stdout).unwrap_or_else(|e| {
        panic!(
            "not JSON ({e}):\nstdout: {}\nstderr: {}",
            String::from_utf8_lossy(&out.stdout),
            String::from_utf8_lossy(&out.stderr)
        )
    })
}

#[test]
fn diff_names_the_one_changed_file_and_layer_and_nothing_for_a_build_against_itself() {
    let tmp = tempfile::tempdir().unwrap();
    let (sk, pk) = keypair(tmp.path(), "release");
    let a = tmp.path().join("a");
    build(&demo_manifest(), &a, Some(&sk));
    let b = tmp.path().join("b");
    build(&demo_with_changed_os_release(tmp.path()), &b, Some(&sk));
    let (a, b, pk) = (
        a.to_str().unwrap(),
        b.to_str().unwrap(),
        pk.to_str().unwrap(),
    );

    // A against B: exit 1, exactly the base layer, exactly /etc/os-release, by content.
    let out = ingot(["diff", a, b, "--json", "--trust-key", pk]);
    assert_eq!(out.status.code(), Some(1), "{out:?}");
    let d = json(&out);
    assert_eq!(d["changed"], true);
    let changed: Vec<&Value> = d["layers"]
        .as_array()
        .unwrap()
        .iter()
        .filter(|l| l["status"] != "unchanged")
        .collect();
    assert_eq!(changed.len(), 1, "{d:#}");
    let layer = changed[0];
    assert_eq!(layer["name"], "base");
    assert_eq!(layer["status"], "changed");
    assert_ne!(layer["a"]["rootHash"], layer["b"]["rootHash"]);
    assert_eq!(layer["added"].as_array().unwrap().len(), 0, "{layer:#}");
    assert_eq!(layer["removed"].as_array().unwrap().len(), 0, "{layer:#}");
    let files = layer["changed"].as_array().unwrap();
    assert_eq!(files.len(), 1, "{layer:#}");
    assert_eq!(files[0]["path"], "/etc/os-release");
    assert_eq!(files[0]["what"], serde_json::json!(["content"]));
    assert_eq!(files[0]["a"]["size"], files[0]["b"]["size"]);
    assert_eq!(files[0]["a"]["mode"], "0644");
    // Every other layer is listed as unchanged, with the same root hash on both sides.
    for l in d["layers"].as_array().unwrap() {
        if l["name"] != "base" {
            assert_eq!(l["a"]["rootHash"], l["b"]["rootHash"], "{l:#}");
        }
    }

    // The text form names the same layer and file.
    let out = ingot(["diff", a, b]);
    assert_eq!(out.status.code(), Some(1));
    let text = String::from_utf8_lossy(&out.stdout);
    assert!(
        text.contains("layer base") && text.contains("~ /etc/os-release (content)"),
        "{text}"
    );
    assert!(text.contains("1 of 4 layers differ"), "{text}");

    // A build against itself (and its skopeo spelling): no change, exit 0.
    let out = ingot(["diff", a, &format!("oci:{a}"), "--json"]);
    assert_eq!(out.status.code(), Some(0), "{out:?}");
    let d = json(&out);
    assert_eq!(d["changed"], false);
    assert!(d["layers"]
        .as_array()
        .unwrap()
        .iter()
        .all(|l| l["status"] == "unchanged" && l["changed"].as_array().unwrap().is_empty()));
    let out = ingot(["diff", a, a]);
    assert!(String::from_utf8_lossy(&out.stdout).ends_with("no change\n"));

    // Not a stack: a clear error and exit 2, not "no change".
    let out = ingot(["diff", a, tmp.path().to_str().unwrap()]);
    assert_eq!(out.status.code(), Some(2), "{out:?}");
}

/// Item 9 of "hostile input, second pass": a changed 1.5 GiB sparse file is hashed in chunks,
/// not read whole (it took 1.58 GB of RSS). Both sides have it, differing in the last byte.
#[test]
fn diff_hashes_a_large_changed_file_in_bounded_memory() {
    let tmp = tempfile::tempdir().unwrap();
    let (sk, pk) = keypair(tmp.path(), "release");
    let size: u64 = 3 << 29; // 1.5 GiB
    let mut layouts = Vec::new();
    for (name, last) in [("a", b'a'), ("b", b'b')] {
        let (manifest, base) = demo_copy(tmp.path(), name);
        let f = fs::File::create(base.join("sparse.bin")).unwrap();
        f.set_len(size).unwrap();
        std::os::unix::fs::FileExt::write_all_at(&f, &[last], size - 1).unwrap();
        let out = tmp.path().join(name);
        build(&manifest, &out, Some(&sk));
        layouts.push(out);
    }
    let args = [
        "diff".as_ref(),
        layouts[0].as_os_str(),
        layouts[1].as_os_str(),
        "--json".as_ref(),
        "--trust-key".as_ref(),
        pk.as_os_str(),
    ];
    let r = common::ingot_measured(args, std::time::Duration::from_secs(300));
    r.print("diff of a changed 1.5 GiB sparse file");
    assert_eq!(r.status.code(), Some(1), "{}", r.stderr);
    let d: Value = serde_json::from_str(&r.stdout).unwrap();
    let base = d["layers"]
        .as_array()
        .unwrap()
        .iter()
        .find(|l| l["name"] == "base")
        .unwrap();
    let files = base["changed"].as_array().unwrap();
    assert_eq!(files.len(), 1, "{base:#}");
    assert_eq!(files[0]["path"], "/sparse.bin");
    assert_eq!(files[0]["what"], serde_json::json!(["content"]));
    assert!(
        r.max_rss_kib < 256 << 10,
        "peak RSS {} KiB: the file was read whole",
        r.max_rss_kib
    );
}
