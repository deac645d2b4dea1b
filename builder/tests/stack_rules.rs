//! The rules `ingot build` enforces for every stack, on small trees through the real command:
//! a directory over a lower layer's symlink, a second module index that hides modules, and
//! overlayfs metadata (a real whiteout made by `mknod c 0 0`, a `trusted.overlay.opaque`
//! directory made by `setfattr`, both as root) in a `dir` source.

mod common;

use std::fs;
use std::path::{Path, PathBuf};
use std::process::Command;

use common::{copy_tree, ingot, repo, write_manifest, TestLayer};
use ingot_testkit::skip::{current_test, have_tool, is_root, skip};

/// A stack of the demo's base tree (changed by `base`) and one `upper` layer.
fn stack(dir: &Path, base: impl FnOnce(&Path), upper: impl FnOnce(&Path)) -> PathBuf {
    let b = dir.join("base");
    copy_tree(&repo().join("tests/fixtures/demo/base"), &b);
    base(&b);
    let u = dir.join("upper");
    fs::create_dir_all(&u).unwrap();
    upper(&u);
    write_manifest(
        dir,
        "rules",
        &[
            TestLayer::new("base", "base", None, &b),
            TestLayer::new("upper", "extra", Some("virt"), &u),
        ],
    )
}

/// `ingot build`'s exit code and stderr; the output must not exist after a failure.
fn build(manifest: &Path) -> (Option<i32>, String) {
    let out = manifest.with_file_name("out");
    let run = ingot([
        "build".as_ref(),
        manifest.as_os_str(),
        "--out".as_ref(),
        out.as_os_str(),
        "--quiet".as_ref(),
    ]);
    let code = run.status.code();
    if code != Some(0) {
        assert!(!out.exists(), "a failed build left {}", out.display());
    }
    (code, String::from_utf8_lossy(&run.stderr).into_owned())
}

fn write(path: &Path, text: &str) {
    fs::create_dir_all(path.parent().unwrap()).unwrap();
    fs::write(path, text).unwrap();
}

#[test]
fn a_directory_over_the_bases_lib_symlink_is_refused() {
    let tmp = tempfile::tempdir().unwrap();
    let link = |b: &Path| {
        fs::create_dir_all(b.join("usr/lib")).unwrap();
        std::os::unix::fs::symlink("usr/lib", b.join("lib")).unwrap();
    };
    let m = stack(tmp.path(), link, |u| {
        write(&u.join("lib/firmware/x.bin"), "fw")
    });
    let (code, err) = build(&m);
    assert_eq!(code, Some(1), "{err}");
    assert!(
        err.contains("layer `upper`: /lib is a directory, but layer `base` has a symlink there"),
        "{err}"
    );
    // Through the link's target it builds.
    let tmp = tempfile::tempdir().unwrap();
    let m = stack(tmp.path(), link, |u| {
        write(&u.join("usr/lib/firmware/x.bin"), "fw")
    });
    let (code, err) = build(&m);
    assert_eq!(code, Some(0), "{err}");
}

#[test]
fn a_second_module_index_must_list_every_lower_module() {
    let dep = "usr/lib/modules/6.1.0-test/modules.dep";
    // Besides the base's index, `nvidia` carries one (allowed: the one); `kata` carries a
    // second, which must list every module the base's and nvidia's list.
    let tmp = tempfile::tempdir().unwrap();
    let base = tmp.path().join("base");
    copy_tree(&repo().join("tests/fixtures/demo/base"), &base);
    write(&base.join(dep), "kernel/a.ko:\nkernel/b.ko: kernel/a.ko\n");
    let mid = tmp.path().join("nvidia");
    write(
        &mid.join(dep),
        "kernel/a.ko:\nkernel/b.ko:\nextra/nvidia.ko:\n",
    );
    let top = tmp.path().join("kata");
    write(&top.join(dep), "kernel/a.ko:\nextra/kata.ko:\n");
    let manifest = |top: &Path| {
        write_manifest(
            tmp.path(),
            "rules",
            &[
                TestLayer::new("base", "base", None, &base),
                TestLayer::new("nvidia", "nvidia", Some("gpu == nvidia"), &mid),
                TestLayer::new("kata", "kata", Some("virt"), top),
            ],
        )
    };
    let (code, err) = build(&manifest(&top));
    assert_eq!(code, Some(1), "{err}");
    assert!(
        err.contains(
            "layer `kata`: /usr/lib/modules/6.1.0-test/modules.dep hides the module index of layer"
        ) && err.contains("kernel/b.ko"),
        "{err}"
    );
    // A superset builds.
    write(
        &top.join(dep),
        "kernel/a.ko:\nkernel/b.ko:\nextra/nvidia.ko:\nextra/kata.ko:\n",
    );
    let _ = fs::remove_dir_all(tmp.path().join("out"));
    let (code, err) = build(&manifest(&top));
    assert_eq!(code, Some(0), "{err}");
}

#[test]
fn a_real_whiteout_and_an_opaque_directory_in_a_dir_source_are_refused() {
    let test = current_test();
    if !is_root() {
        return skip(
            &test,
            "mknod of a 0/0 character device and trusted.* attributes need root",
        );
    }
    if !have_tool(&test, "setfattr") {
        return;
    }
    let tmp = tempfile::tempdir().unwrap();
    let m = stack(
        tmp.path(),
        |_| {},
        |u| {
            fs::create_dir_all(u.join("etc")).unwrap();
            let ok = Command::new("mknod")
                .arg(u.join("etc/motd"))
                .args(["c", "0", "0"])
                .status()
                .unwrap();
            assert!(ok.success());
        },
    );
    let (code, err) = build(&m);
    assert_eq!(code, Some(1), "{err}");
    assert!(
        err.contains("layer `upper`") && err.contains("/etc/motd") && err.contains("whiteout"),
        "{err}"
    );

    let tmp = tempfile::tempdir().unwrap();
    let m = stack(
        tmp.path(),
        |_| {},
        |u| {
            write(&u.join("usr/share/doc/x"), "x");
            let ok = Command::new("setfattr")
                .args(["-n", "trusted.overlay.opaque", "-v", "y"])
                .arg(u.join("usr/share/doc"))
                .status()
                .unwrap();
            assert!(ok.success());
        },
    );
    let (code, err) = build(&m);
    assert_eq!(code, Some(1), "{err}");
    assert!(
        err.contains("layer `upper`")
            && err.contains("/usr/share/doc")
            && err.contains("trusted.overlay.opaque"),
        "{err}"
    );
}
