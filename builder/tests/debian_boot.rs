//! A bootable Debian base from an installed `ingot` alone: `source.debian.boot_integration`
//! makes mmdebstrap's tree an ingot base with the boot files compiled into the binary. The
//! binary is copied to a directory that is not a checkout and run from another one; the layer it
//! builds holds the kernel and initrd links, an initrd with ingot's boot script (its bytes the
//! repository's), systemd-boot as BOOTX64.EFI, GRUB's boot.img and core.img, the units and their
//! links, no SSH host keys, an empty machine-id, and the operator's kubeadm and kubelet given with
//! `--input kubernetes=DIR`.
//!
//! Root (mmdebstrap's root mode) and Debian's archive: the full tier only (a few minutes: the
//! kernel, systemd and GRUB are downloaded and installed, and the initrd made).

use std::fs;
use std::os::unix::fs::PermissionsExt;
use std::path::{Path, PathBuf};
use std::process::{Command, Output};
use std::time::Instant;

use ingot_testkit::skip;

/// The fewest packages the integration needs: the kernel, initramfs-tools and what ingot's hook
/// copies into the initrd (busybox, veritysetup, e2fsprogs, mdadm), zstd (the initrd's
/// compression), systemd, systemd-boot's EFI binary and GRUB's BIOS images, and openssh-server,
/// whose host keys must not stay in the base. Over it, a layer installed by apt
/// (`source.debian.over`): nano (an alternative: the `editor` link) and dnsmasq-base (its postinst
/// adds the `dnsmasq` user), a declared file, the preloads of the `images` input, and an
/// operator's `.deb` (the `nvidia-toolkit` input's way in) that depends on nano.
const MANIFEST: &str = r##"
name = "boot-base"
version = "1.0.0"
source_date_epoch = 1700000000

[boot]
kernel = "/boot/vmlinuz"
initrd = "/boot/initrd.img"
efi = "/boot/efi/EFI/BOOT/BOOTX64.EFI"
bios = "/boot/grub/i386-pc"

[[layer]]
name = "base"
kind = "base"
inputs = ["kubernetes"]

[layer.source.debian]
variant = "minbase"
boot_integration = true
packages = ["linux-image-amd64", "initramfs-tools", "systemd", "systemd-sysv", "udev", "kmod",
            "busybox", "zstd", "cryptsetup-bin", "e2fsprogs", "mdadm", "systemd-boot-efi",
            "grub-pc-bin", "openssh-server"]
path_exclude = ["/usr/share/doc/*", "/usr/share/man/*", "/usr/share/locale/*", "/usr/share/info/*"]
path_include = ["/usr/share/doc/*/copyright"]

[[layer.source.debian.archive]]
mirror = "http://deb.debian.org/debian"
suites = ["bookworm", "bookworm-updates"]
components = ["main"]

[[layer.source.debian.archive]]
mirror = "http://deb.debian.org/debian-security"
suites = ["bookworm-security"]
components = ["main"]

[[layer]]
name = "tools"
kind = "control-plane"
when = "role == control-plane"
inputs = ["images", "nvidia-toolkit"]

[layer.source.debian]
over = "base"
packages = ["nano", "dnsmasq-base"]
path_exclude = ["/usr/share/doc/*", "/usr/share/man/*", "/usr/share/locale/*", "/usr/share/info/*"]
path_include = ["/usr/share/doc/*/copyright"]

[[layer.source.debian.archive]]
mirror = "http://deb.debian.org/debian"
suites = ["bookworm", "bookworm-updates"]
components = ["main"]

[[layer.source.debian.file]]
path = "/usr/lib/ingot/tools-check"
mode = "0750"
text = "#!/bin/sh\necho tools\n"
"##;

/// A copy of the built `ingot` in `dir/bin`, away from the checkout.
fn installed_ingot(dir: &Path) -> PathBuf {
    let bin = dir.join("bin");
    fs::create_dir_all(&bin).unwrap();
    let ingot = bin.join("ingot");
    ingot_testkit::command::copy_executable(env!("CARGO_BIN_EXE_ingot").as_ref(), &ingot);
    ingot
}

/// `ingot build` run from `dir/elsewhere`, with no cargo variable in its environment.
fn build(ingot: &Path, dir: &Path, args: &[&str]) -> Output {
    let cwd = dir.join("elsewhere");
    fs::create_dir_all(&cwd).unwrap();
    let mut cmd = Command::new(ingot);
    cmd.current_dir(&cwd).arg("build").args(args);
    for (k, _) in std::env::vars_os() {
        if k.to_string_lossy().starts_with("CARGO") {
            cmd.env_remove(k);
        }
    }
    cmd.env_remove("RUST_LOG").output().expect("running ingot")
}

/// The `images` input: the repository's hello image as an OCI layout named by its
/// `io.containerd.image.name` annotation, and `extra` files beside it (another input digest).
fn images_input(dir: &Path, name: &str, extra: &[&str]) -> PathBuf {
    let images = dir.join(name);
    let layout = images.join("hello");
    let fixture = Path::new(env!("CARGO_MANIFEST_DIR")).join("../tests/fixtures/images/hello");
    fs::create_dir_all(&images).unwrap();
    let st = Command::new("cp")
        .arg("-a")
        .arg(&fixture)
        .arg(&layout)
        .status()
        .unwrap();
    assert!(st.success());
    let mut index: serde_json::Value =
        serde_json::from_slice(&fs::read(layout.join("index.json")).unwrap()).unwrap();
    index["manifests"][0]["annotations"] =
        serde_json::json!({ "io.containerd.image.name": "example.invalid/ingot/hello:1.0" });
    fs::write(layout.join("index.json"), index.to_string()).unwrap();
    for f in extra {
        fs::write(images.join(f), "another file\n").unwrap();
    }
    images
}

/// An operator's `.deb` input: `ingot-test-tool` 1.0 (all), depending on nano, made by dpkg-deb.
fn deb_input(dir: &Path) -> PathBuf {
    let root = dir.join("deb-root");
    fs::create_dir_all(root.join("DEBIAN")).unwrap();
    fs::create_dir_all(root.join("usr/share/ingot-test-tool")).unwrap();
    fs::write(
        root.join("DEBIAN/control"),
        "Package: ingot-test-tool\nVersion: 1.0\nArchitecture: all\nMaintainer: ingot tests \
         <tests@ingot.invalid>\nDepends: nano\nDescription: an operator's package\n",
    )
    .unwrap();
    fs::write(root.join("usr/share/ingot-test-tool/hello"), "hello\n").unwrap();
    let out = dir.join("debs");
    fs::create_dir_all(&out).unwrap();
    let st = Command::new("dpkg-deb")
        .args(["--root-owner-group", "--build"])
        .arg(&root)
        .arg(out.join("ingot-test-tool_1.0_all.deb"))
        .output()
        .unwrap();
    assert!(st.status.success(), "{st:?}");
    out
}

fn write_input(dir: &Path) -> PathBuf {
    let k8s = dir.join("k8s");
    fs::create_dir_all(&k8s).unwrap();
    for name in ["kubeadm", "kubelet"] {
        let p = k8s.join(name);
        fs::write(&p, format!("#!/bin/sh\necho operator's {name}\n")).unwrap();
        fs::set_permissions(&p, fs::Permissions::from_mode(0o755)).unwrap();
    }
    k8s
}

/// Before anything is made: an input no layer declares is refused, naming it.
#[test]
fn an_input_no_layer_declares_is_refused() {
    let dir = tempfile::tempdir().unwrap();
    let d = dir.path();
    fs::create_dir(d.join("m")).unwrap();
    fs::write(d.join("m/stack.toml"), MANIFEST).unwrap();
    let ingot = installed_ingot(d);
    let k8s = write_input(d);
    let m = d.join("m/stack.toml");
    let out = build(
        &ingot,
        d,
        &[
            m.to_str().unwrap(),
            "--out",
            d.join("out").to_str().unwrap(),
            "--input",
            &format!("kubernetes={}", k8s.display()),
            "--input",
            &format!("kata={}", k8s.display()),
        ],
    );
    assert!(!out.status.success());
    let said = String::from_utf8_lossy(&out.stderr);
    assert!(
        said.contains("--input kata: no layer takes an input `kata`")
            && said.contains("take: images, kubernetes"),
        "{said}"
    );
    assert!(!d.join("out").exists());
    // A name without a path is refused by the command line.
    let out = build(
        &ingot,
        d,
        &[m.to_str().unwrap(), "--out", "o", "--input", "kubernetes"],
    );
    assert!(!out.status.success());
    assert!(String::from_utf8_lossy(&out.stderr).contains("is not NAME=PATH"));
}

/// The ext4 image of the layer whose title is `name` in the OCI layout `layout`, decompressed.
fn layer_image(layout: &Path, name: &str, to: &Path) {
    let json = |p: PathBuf| -> serde_json::Value {
        serde_json::from_slice(&fs::read(p).unwrap()).unwrap()
    };
    let blob = |d: &str| layout.join("blobs/sha256").join(&d["sha256:".len()..]);
    let index = json(layout.join("index.json"));
    let manifest = json(blob(index["manifests"][0]["digest"].as_str().unwrap()));
    let layer = manifest["layers"]
        .as_array()
        .unwrap()
        .iter()
        .find(|l| {
            l["annotations"]["org.opencontainers.image.title"]
                == format!("{name}.ext4.zst").as_str()
        })
        .unwrap_or_else(|| panic!("no {name}.ext4.zst in {manifest}"));
    let st = Command::new("zstd")
        .args(["-q", "-d", "-f", "-o"])
        .arg(to)
        .arg(blob(layer["digest"].as_str().unwrap()))
        .status()
        .unwrap();
    assert!(st.success());
}

/// Copies `paths` out of the ext4 image with debugfs's rdump (symlinks kept as symlinks).
fn dump(image: &Path, paths: &[&str], to: &Path) {
    for p in paths {
        let dest = to.join(p.trim_start_matches('/'));
        let parent = dest.parent().unwrap();
        fs::create_dir_all(parent).unwrap();
        let out = Command::new("debugfs")
            .arg("-R")
            .arg(format!("rdump {p} {}", parent.display()))
            .arg(image)
            .output()
            .unwrap();
        assert!(
            out.status.success(),
            "{}",
            String::from_utf8_lossy(&out.stderr)
        );
    }
}

/// The file names in a newc cpio archive (the initrd's format: `cpio -H newc`).
fn cpio_names(mut data: &[u8]) -> Vec<(String, Vec<u8>)> {
    let mut out = Vec::new();
    let pad = |n: usize| (4 - n % 4) % 4;
    while data.len() >= 110 && &data[..6] == b"070701" {
        let field = |i: usize| {
            usize::from_str_radix(
                std::str::from_utf8(&data[6 + 8 * i..14 + 8 * i]).unwrap(),
                16,
            )
            .unwrap()
        };
        let (size, namesize) = (field(6), field(11));
        let raw = String::from_utf8_lossy(&data[110..110 + namesize - 1]).into_owned();
        let name = raw.strip_prefix("./").unwrap_or(&raw).to_owned();
        let start = 110 + namesize + pad(110 + namesize);
        if name == "TRAILER!!!" {
            break;
        }
        out.push((name, data[start..start + size].to_vec()));
        data = &data[start + size + pad(size)..];
    }
    out
}

#[test]
fn a_base_with_boot_integration_boots_from_the_binary_alone() {
    let test = ingot_testkit::test_name!();
    if !skip::have_root(test) || !skip::have_tools(test, &["mmdebstrap", "debugfs", "zstd"]) {
        return;
    }
    let dir = tempfile::tempdir_in("/var/tmp").unwrap();
    let d = dir.path();
    fs::create_dir(d.join("m")).unwrap();
    fs::write(d.join("m/stack.toml"), MANIFEST).unwrap();
    let ingot = installed_ingot(d);
    let k8s = write_input(d);
    let images = images_input(d, "images", &[]);
    let debs = deb_input(d);
    let out_dir = d.join("out");
    let started = Instant::now();
    let out = build(
        &ingot,
        d,
        &[
            d.join("m/stack.toml").to_str().unwrap(),
            "--quiet",
            "--deb-cache",
            d.join("cache").to_str().unwrap(),
            "--out",
            out_dir.to_str().unwrap(),
            "--input",
            &format!("kubernetes={}", k8s.display()),
            "--input",
            &format!("images={}", images.display()),
            "--input",
            &format!("nvidia-toolkit={}", debs.display()),
        ],
    );
    let said = String::from_utf8_lossy(&out.stderr);
    eprintln!(
        "ingot build: {:.1} s\n{said}{}",
        started.elapsed().as_secs_f64(),
        String::from_utf8_lossy(&out.stdout)
    );
    assert!(out.status.success());
    assert!(said.contains("layer base: input kubernetes = "), "{said}");

    let image = d.join("base.ext4");
    layer_image(&out_dir, "base", &image);
    eprintln!(
        "base layer: {} MiB",
        fs::metadata(&image).unwrap().len() >> 20
    );
    let t = d.join("tree");
    dump(
        &image,
        &[
            "/boot",
            "/etc",
            "/usr/lib/systemd/system",
            "/usr/lib/ingot",
            "/usr/share/ingot",
            "/usr/bin/kubeadm",
            "/usr/bin/kubelet",
            "/opt/cni",
        ],
        &t,
    );
    files_are_installed(&t);
    initrd_has_ingot(&t);
    tools_layer_is_what_apt_added(&out_dir, d);
    one_input_rebuilds_one_layer(&ingot, d, &k8s, &debs);
    input_is_locked(&ingot, d, &k8s, &said);
}

/// The layer installed over the base holds what the install added, cleaned: nano and
/// dnsmasq-base, the `editor` alternative as a direct link, the `dnsmasq` user as a sysusers.d
/// line and no account file, the declared file with its mode, the preloaded image, nothing of the
/// base's and no `/var`. Its lock entry lists exactly the packages apt added, each with its
/// `.deb`'s SHA-256.
fn tools_layer_is_what_apt_added(out_dir: &Path, d: &Path) {
    let image = d.join("tools.ext4");
    layer_image(out_dir, "tools", &image);
    let t = d.join("tools-tree");
    dump(&image, &["/etc", "/usr"], &t);
    assert!(t.join("usr/bin/nano").is_file());
    assert!(
        t.join("usr/share/ingot-test-tool/hello").is_file(),
        "the operator's .deb is not installed"
    );
    assert!(t.join("usr/sbin/dnsmasq").is_file());
    assert_eq!(
        fs::read_link(t.join("usr/bin/editor")).unwrap(),
        Path::new("/usr/bin/nano"),
        "the alternative is not a direct link"
    );
    let sysusers = fs::read_to_string(t.join("usr/lib/sysusers.d/ingot-tools.conf")).unwrap();
    assert!(sysusers.contains("u dnsmasq - "), "{sysusers}");
    for f in [
        "etc/passwd",
        "etc/group",
        "etc/shadow",
        "usr/bin/kubeadm",
        "usr/bin/dpkg",
    ] {
        assert!(!t.join(f).exists(), "the tools layer carries {f}");
    }
    let check = t.join("usr/lib/ingot/tools-check");
    assert_eq!(
        fs::read_to_string(&check).unwrap(),
        "#!/bin/sh\necho tools\n"
    );
    assert_eq!(
        fs::metadata(&check).unwrap().permissions().mode() & 0o777,
        0o750
    );
    assert!(t.join("usr/lib/ingot/preload/hello.oci.tar").is_file());
    let status = fs::read_to_string(t.join("usr/lib/ingot/dpkg/status")).unwrap();
    assert!(
        status.contains("Package: nano\n"),
        "the layer's dpkg status"
    );
    let lock = ingot::debian::lock::Lock::load(&d.join("m/stack.lock"))
        .unwrap()
        .unwrap();
    let tools = &lock.layers["tools"];
    let names: Vec<&str> = tools.packages.iter().map(|p| p.name.as_str()).collect();
    for want in ["nano", "dnsmasq-base", "ingot-test-tool"] {
        assert!(names.contains(&want), "{want} is not locked: {names:?}");
    }
    let base = &lock.layers["base"];
    for p in &tools.packages {
        assert!(
            !base.packages.iter().any(|b| b.name == p.name),
            "{} is the base's, not the tools layer's",
            p.name
        );
        let file = d.join("cache").join(format!("{}.deb", p.sha256));
        assert_eq!(
            ingot::debian::cache::sha256_of(&file).unwrap(),
            p.sha256,
            "{}",
            file.display()
        );
    }
    eprintln!(
        "tools layer: {} packages over the base: {names:?}",
        names.len()
    );
    sbom_lists_the_lock(out_dir, d, tools);
}

/// The tools layer's SBOM lists exactly the packages its lock entry has, each with its `.deb`'s
/// SHA-256, and pyspdxtools and ntia-conformance-checker accept it.
fn sbom_lists_the_lock(layout: &Path, d: &Path, tools: &ingot::debian::lock::LayerLock) {
    let (path, sbom) = ingot_testkit::layout::read(layout).sbom("tools");
    let listed = ingot_testkit::spdx::packages(&sbom);
    assert_eq!(listed.len(), tools.packages.len(), "{sbom}");
    for p in &tools.packages {
        let s = listed
            .iter()
            .find(|s| s["name"] == p.name.as_str())
            .unwrap_or_else(|| panic!("{} is not in the tools layer's SBOM", p.name));
        assert_eq!(
            s["checksums"],
            serde_json::json!([{"algorithm": "SHA256", "checksumValue": p.sha256}]),
            "{}",
            p.name
        );
    }
    let file = d.join("tools.spdx.json");
    fs::copy(path, &file).unwrap();
    ingot_testkit::spdx::tools_accept(&file, "the tools layer's SBOM");
}

/// Another `images` input rebuilds the layer that takes it and no other: the base's tree is
/// reused, the tools layer made again from the cache (nothing downloaded) to the same lock entry.
/// Then `--update` finds nothing newer in the archive for either layer and reuses both.
fn one_input_rebuilds_one_layer(ingot: &Path, d: &Path, k8s: &Path, debs: &Path) {
    let before = fs::read_to_string(d.join("m/stack.lock")).unwrap();
    let images = images_input(d, "images-2", &["NOTES"]);
    let run = |out: &str, extra: &[&str]| {
        let mut args = vec![
            d.join("m/stack.toml").display().to_string(),
            "--deb-cache".into(),
            d.join("cache").display().to_string(),
            "--out".into(),
            d.join(out).display().to_string(),
            "--input".into(),
            format!("kubernetes={}", k8s.display()),
            "--input".into(),
            format!("images={}", images.display()),
            "--input".into(),
            format!("nvidia-toolkit={}", debs.display()),
        ];
        args.extend(extra.iter().map(|s| (*s).to_owned()));
        let args: Vec<&str> = args.iter().map(String::as_str).collect();
        let started = Instant::now();
        let out = build(ingot, d, &args);
        let said = String::from_utf8_lossy(&out.stderr).into_owned();
        eprintln!(
            "ingot build {extra:?}: {:.1} s\n{said}",
            started.elapsed().as_secs_f64()
        );
        assert!(out.status.success(), "{said}");
        said
    };
    let said = run("out-images", &[]);
    assert!(said.contains("layer base: reused (tree cache"), "{said}");
    let tools = said
        .lines()
        .find(|l| l.starts_with("layer tools: built: "))
        .unwrap_or_else(|| panic!("the tools layer was not built again:\n{said}"));
    assert!(tools.contains("the input images changed"), "{tools}");
    assert!(tools.contains(", 0 downloaded)"), "{tools}");
    let after = fs::read_to_string(d.join("m/stack.lock")).unwrap();
    let packages = |lock: &str| -> Vec<String> {
        lock.lines()
            .filter(|l| l.contains("sha256 = "))
            .map(str::to_owned)
            .collect()
    };
    assert_eq!(packages(&before), packages(&after), "the packages moved");
    let said = run("out-update", &["--update"]);
    for layer in ["base", "tools"] {
        let line = said
            .lines()
            .find(|l| l.starts_with(&format!("layer {layer}: reused")))
            .unwrap_or_else(|| panic!("layer {layer} was not reused:\n{said}"));
        assert!(
            line.contains("--update: the archive has nothing newer"),
            "{line}"
        );
    }
}

/// stack.lock records the input's digest, and `--locked` takes no other: a changed kubelet is
/// refused, naming the input, before anything is made or written.
fn input_is_locked(ingot: &Path, d: &Path, k8s: &Path, said: &str) {
    let digest = said
        .lines()
        .find_map(|l| l.strip_prefix("layer base: input kubernetes = "))
        .and_then(|rest| rest.rsplit_once(" (sha256:"))
        .map(|(_, d)| format!("sha256:{}", d.trim_end_matches(')')))
        .unwrap_or_else(|| panic!("no input digest in {said}"));
    let lock = fs::read_to_string(d.join("m/stack.lock")).unwrap();
    assert!(
        lock.contains(&format!(
            "given = [\n  {{ name = \"kubernetes\", digest = \"{digest}\" }},\n]"
        )),
        "{lock}"
    );
    fs::write(k8s.join("kubelet"), "#!/bin/sh\necho another kubelet\n").unwrap();
    let out = build(
        ingot,
        d,
        &[
            d.join("m/stack.toml").to_str().unwrap(),
            "--quiet",
            "--locked",
            "--deb-cache",
            d.join("cache").to_str().unwrap(),
            "--out",
            d.join("out2").to_str().unwrap(),
            "--input",
            &format!("kubernetes={}", k8s.display()),
        ],
    );
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(!out.status.success());
    assert!(
        err.contains("--locked: layer `base`: input `kubernetes` is sha256:")
            && err.contains(&format!("stack.lock has {digest}")),
        "{err}"
    );
    assert!(!d.join("out2").exists(), "--locked refused but wrote");
    assert_eq!(fs::read_to_string(d.join("m/stack.lock")).unwrap(), lock);
}

/// The boot files, units, links and settings the integration puts in the base.
fn files_are_installed(t: &Path) {
    let exists = |p: &str| fs::symlink_metadata(t.join(p)).is_ok();
    for p in [
        "boot/vmlinuz",
        "boot/initrd.img",
        "boot/efi/EFI/BOOT/BOOTX64.EFI",
        "boot/grub/i386-pc/boot.img",
        "boot/grub/i386-pc/core.img",
        "etc/kubernetes/manifests",
        "etc/cni/net.d",
        "opt/cni/bin",
        "usr/lib/systemd/system/ingot-preload.service",
        "usr/lib/systemd/system/ingot-bootstrap.service",
        "usr/lib/systemd/system/kubelet.service",
        "usr/lib/ingot/preload-images",
        "usr/share/ingot/packages.txt",
        "etc/containerd/config.toml",
        "etc/systemd/system/tmp.mount",
    ] {
        assert!(exists(p), "{p} is not in the base layer");
    }
    // The EFI binary is systemd-boot's (a PE image), core.img GRUB's (made by grub-mkimage).
    let efi = fs::read(t.join("boot/efi/EFI/BOOT/BOOTX64.EFI")).unwrap();
    assert_eq!(&efi[..2], b"MZ");
    let core = fs::read(t.join("boot/grub/i386-pc/core.img")).unwrap();
    // GRUB's core image (diskboot, the LZMA decompressor, the kernel and modules) must fit
    // the writer's BIOS boot partition (1 MiB); boot.img is the 512-byte MBR code.
    assert!(
        core.len() > 20_000 && core.len() < 1 << 20,
        "core.img {} bytes",
        core.len()
    );
    let boot_img = fs::read(t.join("boot/grub/i386-pc/boot.img")).unwrap();
    assert_eq!(boot_img.len(), 512);
    assert_eq!(&boot_img[510..], [0x55, 0xaa]);
    eprintln!(
        "core.img: {} bytes, BOOTX64.EFI: {} bytes",
        core.len(),
        efi.len()
    );
    for (wants, unit) in [
        (
            "multi-user.target.wants/ingot-preload.service",
            "/usr/lib/systemd/system/ingot-preload.service",
        ),
        (
            "multi-user.target.wants/ingot-bootstrap.service",
            "/usr/lib/systemd/system/ingot-bootstrap.service",
        ),
        (
            "multi-user.target.wants/kubelet.service",
            "/usr/lib/systemd/system/kubelet.service",
        ),
        (
            "multi-user.target.wants/systemd-networkd.service",
            "/usr/lib/systemd/system/systemd-networkd.service",
        ),
        (
            "local-fs.target.wants/tmp.mount",
            "/etc/systemd/system/tmp.mount",
        ),
    ] {
        let link = t.join("etc/systemd/system").join(wants);
        assert_eq!(fs::read_link(&link).unwrap(), Path::new(unit), "{wants}");
    }
    for timer in [
        "apt-daily.timer",
        "apt-daily-upgrade.timer",
        "dpkg-db-backup.timer",
    ] {
        assert!(
            !exists(&format!("etc/systemd/system/timers.target.wants/{timer}")),
            "{timer}"
        );
    }
    let keys: Vec<_> = fs::read_dir(t.join("etc/ssh"))
        .unwrap()
        .map(|e| e.unwrap().file_name().to_string_lossy().into_owned())
        .filter(|n| n.starts_with("ssh_host_"))
        .collect();
    assert!(keys.is_empty(), "SSH host keys stayed: {keys:?}");
    assert!(
        exists("etc/ssh/sshd_config"),
        "openssh-server is not installed"
    );
    assert_eq!(fs::read(t.join("etc/machine-id")).unwrap(), b"");
    assert_eq!(
        fs::read_to_string(t.join("etc/hostname")).unwrap(),
        "localhost\n"
    );
    let kubeadm = t.join("usr/bin/kubeadm");
    assert_eq!(
        fs::read_to_string(&kubeadm).unwrap(),
        "#!/bin/sh\necho operator's kubeadm\n"
    );
    assert_eq!(
        fs::metadata(&kubeadm).unwrap().permissions().mode() & 0o777,
        0o755
    );
    let packages = fs::read_to_string(t.join("usr/share/ingot/packages.txt")).unwrap();
    assert!(
        packages.lines().any(|l| l.starts_with("linux-image-6.1")),
        "{packages}"
    );
}

/// The initrd is the base's own update-initramfs's, with ingot's hook, script and settings.
fn initrd_has_ingot(t: &Path) {
    let initrd = fs::read(t.join("boot/initrd.img")).unwrap();
    let zstd_at = initrd
        .windows(4)
        .position(|w| w == [0x28, 0xb5, 0x2f, 0xfd])
        .expect("a zstd-compressed initrd");
    let unpacked = Command::new("zstd")
        .args(["-q", "-d", "-c"])
        .stdin(std::process::Stdio::piped())
        .stdout(std::process::Stdio::piped())
        .spawn()
        .and_then(|mut c| {
            use std::io::Write;
            let mut stdin = c.stdin.take().unwrap();
            let body = initrd[zstd_at..].to_vec();
            let writer = std::thread::spawn(move || stdin.write_all(&body));
            let out = c.wait_with_output();
            writer.join().unwrap().unwrap();
            out
        })
        .unwrap();
    assert!(unpacked.status.success());
    let files = cpio_names(&unpacked.stdout);
    let get = |name: &str| {
        files
            .iter()
            .find(|(n, _)| n == name)
            .map(|(_, b)| b.clone())
            .unwrap_or_else(|| panic!("{name} is not in the initrd ({} entries)", files.len()))
    };
    let repo_boot = Path::new(env!("CARGO_MANIFEST_DIR")).join("../boot");
    assert_eq!(
        get("scripts/ingot"),
        fs::read(repo_boot.join("initramfs-tools/scripts/ingot")).unwrap()
    );
    assert!(String::from_utf8_lossy(&get("conf/conf.d/ingot")).contains("BOOT=ingot"));
    for tool in ["veritysetup", "mdadm", "mke2fs", "e2fsck"] {
        // Under /sbin, or /usr/sbin where the initrd's /sbin is a link (merged /usr).
        assert!(
            files
                .iter()
                .any(|(n, _)| n == &format!("sbin/{tool}") || n == &format!("usr/sbin/{tool}")),
            "{tool} is not in the initrd"
        );
    }
    eprintln!("initrd: {} bytes, {} entries", initrd.len(), files.len());
}
