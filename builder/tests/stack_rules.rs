//! The rules `ingot build` enforces for every stack, on small trees through the real command:
//! a directory over a lower layer's symlink and anything else over a lower directory, module
//! indexes made by the real `depmod` (a second that hides modules, a `.bin` alone or disagreeing
//! with its text, checked against what `modprobe` reads), and overlayfs metadata (a real whiteout
//! made by `mknod c 0 0`, `trusted.overlay.*` / `user.overlay.*` attributes made by `setfattr`,
//! as root) in a `dir` source, a `tar` source made by GNU tar (`--xattrs`: PAX
//! `SCHILY.xattr.*` records) and an `oci_layout` source made by `skopeo copy tarball:`.

mod common;

use std::fs;
use std::path::{Path, PathBuf};
use std::process::Command;

use common::{copy_tree, ingot, repo, write_manifest, TestLayer};
use ingot_testkit::skip::{current_test, have_tool, have_tools, is_root, skip};

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

#[test]
fn a_file_or_symlink_over_a_lower_directory_is_refused() {
    for (what, upper, expect) in [
        (
            "symlink",
            (|u: &Path| {
                fs::create_dir_all(u.join("usr")).unwrap();
                std::os::unix::fs::symlink("/opt/bin", u.join("usr/bin")).unwrap();
            }) as fn(&Path),
            "layer `upper`: /usr/bin is a symlink (to /opt/bin), but layer `base` has a \
             directory there: it would hide the whole directory",
        ),
        (
            "file",
            |u: &Path| write(&u.join("usr"), "not a directory"),
            "layer `upper`: /usr is a regular file, but layer `base` has a directory there",
        ),
    ] {
        let tmp = tempfile::tempdir().unwrap();
        let (code, err) = build(&stack(tmp.path(), |_| {}, upper));
        assert_eq!(code, Some(1), "{what}: {err}");
        assert!(err.contains(expect), "{what}: {err}");
    }
    // A file over a lower file replaces it: builds.
    let tmp = tempfile::tempdir().unwrap();
    let m = stack(
        tmp.path(),
        |_| {},
        |u| write(&u.join("etc/hostname"), "gpu\n"),
    );
    let (code, err) = build(&m);
    assert_eq!(code, Some(0), "{err}");
}

/// The kernel version of the module trees below.
const KVER: &str = "6.1.0-test";

/// A kernel module object (`gcc -c`) with its `.modinfo` strings, exporting `exports` (through
/// `__ksymtab_strings`, as depmod reads them) and calling `calls`.
fn module(dir: &Path, name: &str, alias: &str, exports: &str, calls: &str) {
    let mut c = format!(
        "__attribute__((section(\".modinfo\"), used)) static const char l[] = \"license=GPL\";\n\
         __attribute__((section(\".modinfo\"), used)) static const char a[] = \"alias={alias}\";\n"
    );
    if !exports.is_empty() {
        c += &format!(
            "__attribute__((section(\"__ksymtab_strings\"), used)) static const char s[] = \
             \"{exports}\";\nvoid {exports}(void) {{}}\n"
        );
    }
    if !calls.is_empty() {
        c += &format!("extern void {calls}(void);\nvoid {name}_init(void) {{ {calls}(); }}\n");
    }
    let src = dir.join(format!("{name}.c"));
    fs::write(&src, c).unwrap();
    let ko = dir.join(format!("lib/modules/{KVER}/kernel/{name}.ko"));
    fs::create_dir_all(ko.parent().unwrap()).unwrap();
    let ok = Command::new("gcc")
        .args(["-c", "-o"])
        .arg(&ko)
        .arg(&src)
        .status()
        .unwrap();
    assert!(ok.success());
}

/// `depmod -b` over modules `(name, alias, exports, calls)` in a scratch root; returns the
/// kernel's module directory with the indexes depmod wrote.
fn depmod(scratch: &Path, modules: &[(&str, &str, &str, &str)]) -> PathBuf {
    fs::create_dir_all(scratch).unwrap();
    for (name, alias, exports, calls) in modules {
        module(scratch, name, alias, exports, calls);
    }
    let out = Command::new(tool("depmod"))
        .arg("-b")
        .arg(scratch)
        .arg(KVER)
        .output()
        .unwrap();
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    scratch.join("lib/modules").join(KVER)
}

/// What `modprobe --show-depends` reads for `module` in the root `root` (`None`: not found).
fn show_depends(root: &Path, module: &str) -> Option<String> {
    let out = Command::new(tool("modprobe"))
        .arg("-d")
        .arg(root)
        .args(["-S", KVER, "--show-depends", module])
        .output()
        .unwrap();
    out.status
        .success()
        .then(|| String::from_utf8_lossy(&out.stdout).into_owned())
}

fn tool(name: &str) -> PathBuf {
    ["/usr/sbin", "/sbin", "/usr/bin"]
        .iter()
        .map(|d| Path::new(d).join(name))
        .find(|p| p.exists())
        .unwrap_or_else(|| PathBuf::from(name))
}

/// Copies the files named `files` of a kernel module directory `from` into a layer tree.
fn carry(from: &Path, layer: &Path, files: &[&str]) {
    let to = layer.join("usr/lib/modules").join(KVER);
    fs::create_dir_all(&to).unwrap();
    for f in files {
        fs::copy(from.join(f), to.join(f)).unwrap();
    }
}

/// Everything depmod wrote, and the module objects.
fn index_files(dir: &Path) -> Vec<String> {
    let mut names: Vec<String> = fs::read_dir(dir)
        .unwrap()
        .map(|e| e.unwrap().file_name().to_string_lossy().into_owned())
        .filter(|n| n.starts_with("modules."))
        .collect();
    names.sort();
    names
}

fn carry_all(from: &Path, layer: &Path) {
    let files = index_files(from);
    carry(
        from,
        layer,
        &files.iter().map(String::as_str).collect::<Vec<_>>(),
    );
    copy_tree(
        &from.join("kernel"),
        &layer.join("usr/lib/modules").join(KVER).join("kernel"),
    );
}

const A: (&str, &str, &str, &str) = ("a", "pci:v00001AF4d*", "a_func", "");
const B: (&str, &str, &str, &str) = ("b", "b-thing", "", "a_func");
const NVIDIA: (&str, &str, &str, &str) = ("nvidia", "pci:v000010DEd*", "", "a_func");
const KATA: (&str, &str, &str, &str) = ("kata", "kata-thing", "", "");

#[test]
fn module_indexes_are_checked_as_kmod_reads_them() {
    let test = current_test();
    if !have_tools(&test, &["gcc", "depmod", "modprobe"]) {
        return;
    }
    let tmp = tempfile::tempdir().unwrap();
    let t = tmp.path();
    let base_idx = depmod(&t.join("k-base"), &[A, B]);
    // The index is real: kmod resolves b through a.
    let deps = show_depends(&t.join("k-base"), "b").expect("modprobe finds b");
    assert!(deps.contains("a.ko") && deps.contains("b.ko"), "{deps}");
    let nvidia_idx = depmod(&t.join("k-nvidia"), &[A, B, NVIDIA]);
    let merged_idx = depmod(&t.join("k-all"), &[A, B, NVIDIA, KATA]);
    let kata_idx = depmod(&t.join("k-kata"), &[A, KATA]);

    let base = t.join("base");
    copy_tree(&repo().join("tests/fixtures/demo/base"), &base);
    carry_all(&base_idx, &base);
    let nvidia = t.join("nvidia");
    carry_all(&nvidia_idx, &nvidia);
    let build3 = |kata: &Path| {
        let _ = fs::remove_dir_all(t.join("out"));
        build(&write_manifest(
            t,
            "rules",
            &[
                TestLayer::new("base", "base", None, &base),
                TestLayer::new("nvidia", "nvidia", Some("gpu == nvidia"), &nvidia),
                TestLayer::new("kata", "kata", Some("virt"), kata),
            ],
        ))
    };
    let dir = format!("/usr/lib/modules/{KVER}");

    // A second index (kata's, over base + kata) hides nvidia's and b: refused.
    let kata = t.join("kata");
    carry_all(&kata_idx, &kata);
    let (code, err) = build3(&kata);
    assert_eq!(code, Some(1), "{err}");
    assert!(
        err.contains(&format!(
            "layer `kata`: {dir}/modules.alias hides the module index of layer `base`"
        )) || err.contains(&format!(
            "layer `kata`: {dir}/modules.dep hides the module index of layer `base`, which lists \
             `kernel/b.ko`"
        )),
        "{err}"
    );

    // Only the binary index, which kmod reads: refused (it would hide every lower module from
    // modprobe while no text index is there to check).
    let kata = t.join("kata-bin");
    carry(&kata_idx, &kata, &["modules.dep.bin"]);
    let (code, err) = build3(&kata);
    assert_eq!(code, Some(1), "{err}");
    assert!(
        err.contains(&format!(
            "layer `kata`: {dir}/modules.dep: is missing, but the layer carries modules.dep.bin"
        )),
        "{err}"
    );

    // The merged text index beside kata's own binary one: the text lists every lower module,
    // but kmod reads the .bin, which does not (modprobe finds no b through it). Refused.
    let mixed = t.join("k-mixed");
    copy_tree(&t.join("k-kata"), &mixed);
    let mixed_idx = mixed.join("lib/modules").join(KVER);
    fs::copy(
        merged_idx.join("modules.dep"),
        mixed_idx.join("modules.dep"),
    )
    .unwrap();
    assert!(show_depends(&mixed, "b").is_none(), "kmod reads the .bin");
    assert!(fs::read_to_string(mixed_idx.join("modules.dep"))
        .unwrap()
        .contains("kernel/b.ko"));
    let kata = t.join("kata-mixed");
    carry(&mixed_idx, &kata, &["modules.dep", "modules.dep.bin"]);
    let (code, err) = build3(&kata);
    assert_eq!(code, Some(1), "{err}");
    assert!(
        err.contains(&format!(
            "layer `kata`: {dir}/modules.dep.bin: disagrees with modules.dep: modules.dep lists \
             kernel/b.ko, which kmod's index does not"
        )),
        "{err}"
    );

    // The merged index (depmod over every layer's modules) lists everything: builds, and kmod
    // resolves every module through it.
    let kata = t.join("kata-merged");
    carry_all(&merged_idx, &kata);
    let (code, err) = build3(&kata);
    assert_eq!(code, Some(0), "{err}");
    for m in ["a", "b", "nvidia", "kata"] {
        assert!(show_depends(&t.join("k-all"), m).is_some(), "{m}");
    }

    // A merged index whose nvidia module lost its alias: modules.dep is a superset, the binary
    // alias index is not. Refused, naming the .bin.
    let nvidia_plain = ("nvidia", "nvidia-other", "", "a_func");
    let short_idx = depmod(&t.join("k-short"), &[A, B, nvidia_plain, KATA]);
    let kata = t.join("kata-short");
    carry(
        &short_idx,
        &kata,
        &["modules.dep", "modules.dep.bin", "modules.alias.bin"],
    );
    let (code, err) = build3(&kata);
    assert_eq!(code, Some(1), "{err}");
    assert!(
        err.contains(&format!(
            "layer `kata`: {dir}/modules.alias.bin hides the module index of layer `nvidia`, \
             which lists `pci:v000010DEd* nvidia`"
        )),
        "{err}"
    );
}

/// Makes `dir` into a tar with GNU tar (`--xattrs`: PAX `SCHILY.xattr.*` records).
fn gnu_tar(dir: &Path, out: &Path) {
    let ok = Command::new("tar")
        .args(["--xattrs", "--xattrs-include=*", "--numeric-owner", "-cf"])
        .arg(out)
        .arg("-C")
        .arg(dir)
        .arg(".")
        .status()
        .unwrap();
    assert!(ok.success());
}

fn sha256_hex(path: &Path) -> String {
    use sha2::Digest;
    hex::encode(sha2::Sha256::digest(fs::read(path).unwrap()))
}

/// Rewrites `manifest` from its original `text`, the `upper` layer read from `source` instead
/// of its directory.
fn with_source(manifest: &Path, text: &str, upper: &Path, source: &str) {
    let dir = format!("source = {{ dir = \"{}\" }}", upper.display());
    assert!(text.contains(&dir));
    fs::write(manifest, text.replace(&dir, &format!("source = {source}"))).unwrap();
}

#[test]
fn overlay_metadata_from_tar_and_oci_layout_sources_is_refused() {
    let test = current_test();
    if !is_root() {
        return skip(
            &test,
            "mknod of a 0/0 character device and trusted.* attributes need root",
        );
    }
    if !have_tools(&test, &["setfattr", "tar", "skopeo"]) {
        return;
    }
    let whiteout = |u: &Path| {
        fs::create_dir_all(u.join("etc")).unwrap();
        let ok = Command::new("mknod")
            .arg(u.join("etc/motd"))
            .args(["c", "0", "0"])
            .status()
            .unwrap();
        assert!(ok.success());
    };
    let attr = |name: &'static str| {
        move |u: &Path| {
            write(&u.join("usr/share/doc/x"), "x");
            let ok = Command::new("setfattr")
                .args(["-n", name, "-v", "y"])
                .arg(u.join("usr/share/doc"))
                .status()
                .unwrap();
            assert!(ok.success());
        }
    };
    type Upper = Box<dyn Fn(&Path)>;
    let cases: [(&str, Upper, &str); 3] = [
        (
            "whiteout",
            Box::new(whiteout),
            "entry \"/etc/motd\" is an overlayfs whiteout",
        ),
        (
            "opaque",
            Box::new(attr("trusted.overlay.opaque")),
            "entry \"/usr/share/doc\" carries the overlayfs attribute trusted.overlay.opaque",
        ),
        (
            "user opaque",
            Box::new(attr("user.overlay.opaque")),
            "entry \"/usr/share/doc\" carries the overlayfs attribute user.overlay.opaque",
        ),
    ];
    for (what, upper, expect) in &cases {
        let tmp = tempfile::tempdir().unwrap();
        let m = stack(tmp.path(), |_| {}, |u| upper(u));
        let original = fs::read_to_string(&m).unwrap();
        let u = tmp.path().join("upper");
        let tar = tmp.path().join("upper.tar");
        gnu_tar(&u, &tar);
        if what.contains("opaque") {
            let bytes = fs::read(&tar).unwrap();
            let record = format!("SCHILY.xattr.{}", &expect[expect.rfind(' ').unwrap() + 1..]);
            assert!(
                bytes.windows(record.len()).any(|w| w == record.as_bytes()),
                "GNU tar wrote no {record} record"
            );
        }
        // The tar source.
        with_source(
            &m,
            &original,
            &u,
            &format!(
                "{{ tar = \"{}\", sha256 = \"{}\" }}",
                tar.display(),
                sha256_hex(&tar)
            ),
        );
        refused_upper(&m, what, &format!("tar archive {}", tar.display()), expect);
        // The same archive as the one layer of an OCI image, written by skopeo.
        let oci = tmp.path().join("oci");
        let digest = skopeo_oci_layout(&tar, &oci);
        with_source(
            &m,
            &original,
            &u,
            &format!(
                "{{ oci_layout = \"{}\", digest = \"{digest}\" }}",
                oci.display()
            ),
        );
        refused_upper(&m, what, &format!("OCI layout {}", oci.display()), expect);
    }
}

/// `tar` as the one layer of an OCI image at `oci`, written by skopeo; its manifest digest.
fn skopeo_oci_layout(tar: &Path, oci: &Path) -> String {
    ingot_testkit::command::run_ok(
        Command::new("skopeo")
            .arg("copy")
            .arg(format!("tarball:{}", tar.display()))
            .arg(format!("oci:{}:latest", oci.display())),
    );
    let index: serde_json::Value =
        serde_json::from_slice(&fs::read(oci.join("index.json")).unwrap()).unwrap();
    index["manifests"][0]["digest"].as_str().unwrap().to_owned()
}

/// The build of `m` fails naming the layer `upper`, its source `source` and `expect`.
fn refused_upper(m: &Path, what: &str, source: &str, expect: &str) {
    let (code, err) = build(m);
    assert_eq!(code, Some(1), "{what}: {err}");
    assert!(
        err.contains("layer `upper`") && err.contains(source) && err.contains(expect),
        "{what}: {err}"
    );
}
