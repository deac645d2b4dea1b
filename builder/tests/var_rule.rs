//! Boot contract v2: `ingot build` refuses a layer that ships anything under /var (the node's var
//! partition is mounted there and would hide it), naming the layer and the path; the base may
//! keep empty directories there as mount points.

mod common;

use std::fs;
use std::path::Path;

use common::{ingot, write_manifest, TestLayer};

/// Builds a two-layer stack whose trees hold `base_paths` and `extra_paths` (a trailing `/`
/// makes a directory); returns whether it built and what it printed.
fn build(base_paths: &[&str], extra_paths: &[&str]) -> (bool, String) {
    let dir = tempfile::tempdir().unwrap();
    for (layer, paths) in [("base", base_paths), ("extra", extra_paths)] {
        let root = dir.path().join(layer);
        fs::create_dir_all(&root).unwrap();
        for p in paths {
            let path = root.join(p.trim_start_matches('/'));
            if p.ends_with('/') {
                fs::create_dir_all(&path).unwrap();
            } else {
                fs::create_dir_all(path.parent().unwrap()).unwrap();
                fs::write(&path, "x").unwrap();
            }
        }
    }
    for f in [
        "boot/vmlinuz",
        "boot/initrd.img",
        "boot/efi/EFI/BOOT/BOOTX64.EFI",
    ] {
        let path = dir.path().join("base").join(f);
        fs::create_dir_all(path.parent().unwrap()).unwrap();
        fs::write(path, "boot").unwrap();
    }
    let (base, extra) = (dir.path().join("base"), dir.path().join("extra"));
    let manifest = write_manifest(
        dir.path(),
        "varcheck",
        &[
            TestLayer::new("base", "base", None, &base),
            TestLayer::new(
                "extra",
                "control-plane",
                Some("role == control-plane"),
                &extra,
            ),
        ],
    );
    let out = ingot([
        "build".as_ref(),
        manifest.as_os_str(),
        "--out".as_ref(),
        dir.path().join("out").as_os_str(),
    ]);
    let text = String::from_utf8_lossy(&out.stderr).into_owned();
    let built = out.status.success();
    assert_eq!(built, Path::new(&dir.path().join("out")).exists(), "{text}");
    (built, text)
}

#[test]
fn files_under_var_are_refused_with_layer_and_path() {
    let (ok, err) = build(&["/var/lib/dpkg/status"], &[]);
    assert!(!ok);
    assert!(
        err.contains("layer `base`")
            && err.contains("\"/var/lib/dpkg/status\"")
            && err.contains("under /var"),
        "{err}"
    );
    let (ok, err) = build(&["/var/"], &["/var/lib/ingot/preload/x.oci.tar"]);
    assert!(!ok);
    assert!(
        err.contains("layer `extra`") && err.contains("\"/var/lib\""),
        "{err}"
    );
    // Only the base may keep (empty) directories under /var.
    let (ok, err) = build(&["/var/"], &["/var/cache/"]);
    assert!(!ok, "{err}");
    assert!(
        err.contains("layer `extra`") && err.contains("\"/var/cache\""),
        "{err}"
    );
}

#[test]
fn mount_point_directories_under_var_are_allowed_in_the_base() {
    let (ok, err) = build(
        &["/var/", "/var/lib/", "/var/log/journal/"],
        &["/etc/x", "/var/"],
    );
    assert!(ok, "{err}");
}
