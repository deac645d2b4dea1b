//! ingot's boot integration of a Debian base (`source.debian.boot_integration = true`): what
//! makes an mmdebstrap tree a bootable ingot base. The files of the repository's `boot/`
//! directory are compiled into the binary ([`FILES`]), so an installed `ingot` needs no checkout.
//!
//! Two steps, both with the base's own tools:
//! - [`customize_hooks`]: mmdebstrap's customize hooks copy the initramfs-tools hook, script and
//!   settings and mdadm.conf into the tree and run its `update-initramfs -u -k all` (mmdebstrap
//!   has /proc, /sys and /dev mounted in the chroot then);
//! - [`apply`], after mmdebstrap: the kernel and initrd links, systemd-boot's EFI binary, GRUB's
//!   boot.img and a core.img from the tree's `grub-mkimage`, the systemd units and settings, the
//!   node settings (tmp.mount, no apt timers, systemd-networkd, the Kubernetes mount points, no
//!   SSH host keys, an empty machine-id), the package list, and the operator's `kubernetes`
//!   input (kubeadm, kubelet and its unit).

use std::fs;
use std::io;
use std::os::unix::fs::PermissionsExt;
use std::path::{Path, PathBuf};
use std::process::Command;

use sha2::{Digest, Sha256};

/// When a boot file is installed.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Stage {
    /// By mmdebstrap's customize hook, before the tree's `update-initramfs` runs.
    Initramfs,
    /// After mmdebstrap.
    Tree,
    /// With the `kubernetes` input's kubelet only.
    Kubelet,
}

/// One file of `boot/`, compiled in.
#[derive(Debug)]
pub struct BootFile {
    /// Its path under the repository's `boot/`.
    pub source: &'static str,
    /// Where it goes in the tree (absolute).
    pub dest: &'static str,
    /// Its mode.
    pub mode: u32,
    /// When it is installed.
    pub stage: Stage,
    /// Its bytes.
    pub bytes: &'static [u8],
}

macro_rules! boot_file {
    ($source:literal, $dest:literal, $mode:literal, $stage:ident) => {
        BootFile {
            source: $source,
            dest: $dest,
            mode: $mode,
            stage: Stage::$stage,
            bytes: include_bytes!(concat!("../../../boot/", $source)),
        }
    };
}

/// Every file of the repository's `boot/` and where it goes (a test checks that none is left
/// out and that the modes are the repository's).
pub const FILES: &[BootFile] = &[
    boot_file!(
        "initramfs-tools/hooks/ingot",
        "/etc/initramfs-tools/hooks/ingot",
        0o755,
        Initramfs
    ),
    boot_file!(
        "initramfs-tools/scripts/ingot",
        "/etc/initramfs-tools/scripts/ingot",
        0o644,
        Initramfs
    ),
    boot_file!(
        "initramfs-tools/conf.d/ingot",
        "/etc/initramfs-tools/conf.d/ingot",
        0o644,
        Initramfs
    ),
    boot_file!(
        "mdadm/mdadm.conf",
        "/etc/mdadm/mdadm.conf",
        0o644,
        Initramfs
    ),
    boot_file!(
        "systemd/ingot-preload.service",
        "/usr/lib/systemd/system/ingot-preload.service",
        0o644,
        Tree
    ),
    boot_file!(
        "systemd/ingot-bootstrap.service",
        "/usr/lib/systemd/system/ingot-bootstrap.service",
        0o644,
        Tree
    ),
    boot_file!(
        "systemd/preload-images",
        "/usr/lib/ingot/preload-images",
        0o755,
        Tree
    ),
    boot_file!(
        "systemd/ingot-unseal.service",
        "/usr/lib/systemd/system/ingot-unseal.service",
        0o644,
        Tree
    ),
    boot_file!(
        "systemd/unseal-secrets",
        "/usr/lib/ingot/unseal-secrets",
        0o755,
        Tree
    ),
    boot_file!(
        "systemd/ssh-ingot.conf",
        "/usr/lib/systemd/system/ssh.service.d/ingot.conf",
        0o644,
        Tree
    ),
    boot_file!(
        "systemd/wait-online-ingot.conf",
        "/usr/lib/systemd/system/systemd-networkd-wait-online.service.d/ingot.conf",
        0o644,
        Tree
    ),
    boot_file!(
        "systemd/journald-ingot.conf",
        "/usr/lib/systemd/journald.conf.d/ingot.conf",
        0o644,
        Tree
    ),
    boot_file!(
        "systemd/containerd-config.toml",
        "/etc/containerd/config.toml",
        0o644,
        Tree
    ),
    boot_file!(
        "systemd/runtimeclasses.yaml",
        "/usr/share/ingot/runtimeclasses.yaml",
        0o644,
        Tree
    ),
    boot_file!(
        "systemd/k8s-modules.conf",
        "/usr/lib/modules-load.d/ingot-kubernetes.conf",
        0o644,
        Tree
    ),
    boot_file!(
        "systemd/k8s-sysctl.conf",
        "/usr/lib/sysctl.d/90-ingot-kubernetes.conf",
        0o644,
        Tree
    ),
    boot_file!(
        "systemd/kubelet.service",
        "/usr/lib/systemd/system/kubelet.service",
        0o644,
        Kubelet
    ),
];

/// GRUB's modules built into core.img (docs/boot-contract.md, `[boot] bios`): it reads nothing
/// from the ESP but grub/grub.cfg (set, linux, initrd, boot).
pub const GRUB_MODULES: &[&str] = &[
    "biosdisk", "part_gpt", "fat", "normal", "linux", "echo", "test",
];
/// core.img's prefix: the boot disk's first GPT partition (the ESP), where the writer puts
/// grub/grub.cfg.
pub const GRUB_PREFIX: &str = "(,gpt1)/grub";

/// Units enabled by a link in `/etc/systemd/system/TARGET.wants/`.
const WANTS: &[(&str, &str)] = &[
    (
        "multi-user.target",
        "/usr/lib/systemd/system/ingot-preload.service",
    ),
    (
        "multi-user.target",
        "/usr/lib/systemd/system/ingot-bootstrap.service",
    ),
    // Opens the node's sealed secrets (a node layer without any skips it).
    (
        "multi-user.target",
        "/usr/lib/systemd/system/ingot-unseal.service",
    ),
    // The writer stages systemd-networkd files per machine.
    (
        "multi-user.target",
        "/usr/lib/systemd/system/systemd-networkd.service",
    ),
    (
        "sockets.target",
        "/usr/lib/systemd/system/systemd-networkd.socket",
    ),
    (
        "network-online.target",
        "/usr/lib/systemd/system/systemd-networkd-wait-online.service",
    ),
    // / is read-only: /tmp is a tmpfs (Debian ships the unit, disabled; copied to /etc below).
    ("local-fs.target", "/etc/systemd/system/tmp.mount"),
];

/// apt's and dpkg's timers: they cannot change a read-only root, they would only fail.
const DROPPED_TIMERS: &[&str] = &[
    "apt-daily.timer",
    "apt-daily-upgrade.timer",
    "dpkg-db-backup.timer",
];

/// Where kubeadm and a CNI installer write (boot contract v3): / is read-only, so the mount
/// points must be in the base.
const MOUNT_POINTS: &[&str] = &["etc/kubernetes/manifests", "etc/cni/net.d", "opt/cni/bin"];

/// The Kubernetes programs the `kubernetes` input gives the base.
pub const KUBERNETES_BASE: &[&str] = &["kubeadm", "kubelet"];

/// The operator input the base takes its Kubernetes programs from.
pub use crate::debian_spec::KUBERNETES_INPUT;

/// Why the integration failed.
#[derive(Debug, thiserror::Error)]
pub enum IntegrationError {
    /// The tree lacks what the integration needs, or holds something it cannot take.
    #[error("boot integration: {0}")]
    Tree(String),
    /// One of the tree's own tools failed.
    #[error("boot integration: `{command}` in the tree failed: {detail}")]
    Tool {
        /// The command line.
        command: String,
        /// Its status and the end of its output.
        detail: String,
    },
    /// An operator input is unusable.
    #[error("input `{name}` ({}): {reason}", path.display())]
    Input {
        /// The input's name.
        name: String,
        /// Where it was given.
        path: PathBuf,
        /// What is wrong.
        reason: String,
    },
    /// A file operation failed.
    #[error("boot integration: {what} {}", path.display())]
    Io {
        /// What was being done.
        what: &'static str,
        /// On which path.
        path: PathBuf,
        /// The error.
        source: io::Error,
    },
}

fn io_err(what: &'static str, path: &Path) -> impl FnOnce(io::Error) -> IntegrationError {
    let path = path.to_owned();
    move |source| IntegrationError::Io { what, path, source }
}

fn missing(what: impl Into<String>) -> IntegrationError {
    IntegrationError::Tree(what.into())
}

/// SHA-256 of everything the integration puts in a tree from the binary: each file's source
/// name, destination, mode and bytes, and the GRUB modules and prefix. A tree cache keys on it.
pub fn digest() -> [u8; 32] {
    digest_of(FILES)
}

fn digest_of(files: &[BootFile]) -> [u8; 32] {
    let mut h = Sha256::new();
    for f in files {
        for part in [f.source.as_bytes(), f.dest.as_bytes()] {
            h.update((part.len() as u64).to_le_bytes());
            h.update(part);
        }
        h.update(f.mode.to_le_bytes());
        h.update((f.bytes.len() as u64).to_le_bytes());
        h.update(f.bytes);
    }
    h.update(GRUB_MODULES.join(" ").as_bytes());
    h.update([0]);
    h.update(GRUB_PREFIX.as_bytes());
    h.finalize().into()
}

/// [`digest`] as `sha256:<hex>`.
pub fn digest_string() -> String {
    format!("sha256:{}", hex::encode(digest()))
}

/// Writes `f` at `root` + its destination, with its mode.
fn install(root: &Path, f: &BootFile) -> Result<(), IntegrationError> {
    let path = root.join(f.dest.trim_start_matches('/'));
    if let Some(dir) = path.parent() {
        fs::create_dir_all(dir).map_err(io_err("creating", dir))?;
    }
    // Replaced, not written through: a package may have put a symlink there.
    remove_if_present(&path)?;
    fs::write(&path, f.bytes).map_err(io_err("writing", &path))?;
    fs::set_permissions(&path, fs::Permissions::from_mode(f.mode))
        .map_err(io_err("setting the mode of", &path))
}

fn remove_if_present(path: &Path) -> Result<(), IntegrationError> {
    match fs::remove_file(path) {
        Err(e) if e.kind() != io::ErrorKind::NotFound => Err(io_err("removing", path)(e)),
        _ => Ok(()),
    }
}

/// mmdebstrap's `--customize-hook` arguments that put the initramfs files in the tree and run
/// its `update-initramfs -u -k all`. The files are written under `stage` (a scratch directory)
/// for mmdebstrap's `copy-in`.
pub fn customize_hooks(stage: &Path) -> Result<Vec<String>, IntegrationError> {
    let mut args = Vec::new();
    for f in FILES.iter().filter(|f| f.stage == Stage::Initramfs) {
        install(stage, f)?;
        let dir = Path::new(f.dest).parent().expect("absolute").display();
        args.push(format!("--customize-hook=mkdir -p \"$1\"{dir}"));
        args.push(format!(
            "--customize-hook=copy-in {} {dir}/",
            stage.join(f.dest.trim_start_matches('/')).display()
        ));
    }
    args.push(
        "--customize-hook=if ! chroot \"$1\" sh -c 'command -v update-initramfs' >/dev/null; \
         then echo 'ingot boot integration: the tree has no update-initramfs (the layer needs \
         the package initramfs-tools)' >&2; exit 1; fi; chroot \"$1\" update-initramfs -u -k all"
            .to_owned(),
    );
    Ok(args)
}

/// Runs `args` chrooted in `tree`; its standard output.
fn chroot(tree: &Path, args: &[&str]) -> Result<Vec<u8>, IntegrationError> {
    let command = args.join(" ");
    let out = Command::new("chroot")
        .arg(tree)
        .args(args)
        .env("LC_ALL", "C.UTF-8")
        .output()
        .map_err(|e| IntegrationError::Tool {
            command: command.clone(),
            detail: format!("running chroot: {e}"),
        })?;
    if !out.status.success() {
        let err = String::from_utf8_lossy(&out.stderr);
        let lines: Vec<&str> = err.lines().collect();
        return Err(IntegrationError::Tool {
            command,
            detail: format!(
                "{}: {}",
                out.status,
                lines[lines.len().saturating_sub(10)..].join("\n")
            ),
        });
    }
    Ok(out.stdout)
}

/// The tree's only kernel release (`/usr/lib/modules/KVER`, with its image and initrd in /boot).
pub fn kernel(tree: &Path) -> Result<String, IntegrationError> {
    let dir = tree.join("usr/lib/modules");
    let mut names = Vec::new();
    if let Ok(rd) = fs::read_dir(&dir) {
        for e in rd {
            let e = e.map_err(io_err("reading", &dir))?;
            names.push(e.file_name().to_string_lossy().into_owned());
        }
    }
    names.sort();
    let kver = match names.as_slice() {
        [] => {
            return Err(missing(
                "the tree has no kernel (no /usr/lib/modules/*; the layer needs a kernel \
                 package such as linux-image-amd64)",
            ))
        }
        [one] => one.clone(),
        more => {
            return Err(missing(format!(
                "the tree has more than one kernel ({}): the initrd and boot files are made for \
                 exactly one",
                more.join(", ")
            )))
        }
    };
    for file in [format!("vmlinuz-{kver}"), format!("initrd.img-{kver}")] {
        if !tree.join("boot").join(&file).is_file() {
            return Err(missing(format!("kernel {kver} has no /boot/{file}")));
        }
    }
    Ok(kver)
}

/// Everything after mmdebstrap that makes the tree an ingot base. `kubernetes`: the operator's
/// `kubernetes` input (a directory), when given.
pub fn apply(tree: &Path, kubernetes: Option<&Path>) -> Result<(), IntegrationError> {
    let kver = kernel(tree)?;
    tracing::info!("boot integration: kernel {kver}");
    boot_files(tree, &kver)?;
    grub(tree)?;
    for f in FILES.iter().filter(|f| f.stage == Stage::Tree) {
        install(tree, f)?;
    }
    node_settings(tree)?;
    if let Some(dir) = kubernetes {
        kubernetes_base(tree, dir)?;
    }
    package_list(tree)
}

/// `/boot/vmlinuz` and `/boot/initrd.img` (hard links to the kernel's), no links in `/`, and
/// systemd-boot's EFI binary as the ESP's default loader.
fn boot_files(tree: &Path, kver: &str) -> Result<(), IntegrationError> {
    let boot = tree.join("boot");
    for (link, file) in [
        ("vmlinuz", format!("vmlinuz-{kver}")),
        ("initrd.img", format!("initrd.img-{kver}")),
    ] {
        let link = boot.join(link);
        remove_if_present(&link)?;
        fs::hard_link(boot.join(&file), &link).map_err(io_err("linking", &link))?;
    }
    // The kernel package's links in / (and their .old twins) point at the versioned files.
    for name in ["vmlinuz", "vmlinuz.old", "initrd.img", "initrd.img.old"] {
        remove_if_present(&tree.join(name))?;
    }
    let efi = tree.join("usr/lib/systemd/boot/efi/systemd-bootx64.efi");
    if !efi.is_file() {
        return Err(missing(
            "the tree has no systemd-boot EFI binary (/usr/lib/systemd/boot/efi/\
             systemd-bootx64.efi; the layer needs the package systemd-boot-efi)",
        ));
    }
    let dest = boot.join("efi/EFI/BOOT");
    fs::create_dir_all(&dest).map_err(io_err("creating", &dest))?;
    fs::copy(&efi, dest.join("BOOTX64.EFI")).map_err(io_err("copying", &efi))?;
    Ok(())
}

/// GRUB's boot.img and a core.img made by the tree's own grub-mkimage (`[boot] bios`).
fn grub(tree: &Path) -> Result<(), IntegrationError> {
    let src = tree.join("usr/lib/grub/i386-pc/boot.img");
    if !src.is_file() {
        return Err(missing(
            "the tree has no GRUB BIOS loader (/usr/lib/grub/i386-pc/boot.img; the layer needs \
             the package grub-pc-bin)",
        ));
    }
    let dir = tree.join("boot/grub/i386-pc");
    fs::create_dir_all(&dir).map_err(io_err("creating", &dir))?;
    fs::copy(&src, dir.join("boot.img")).map_err(io_err("copying", &src))?;
    let mut args = vec![
        "grub-mkimage",
        "-O",
        "i386-pc",
        "-o",
        "/boot/grub/i386-pc/core.img",
        "-p",
        GRUB_PREFIX,
    ];
    args.extend_from_slice(GRUB_MODULES);
    chroot(tree, &args)?;
    Ok(())
}

/// The unit links, tmp.mount, no apt timers, the mount points, no SSH host keys, an empty
/// machine-id (the node layer carries the machine's identity).
fn node_settings(tree: &Path) -> Result<(), IntegrationError> {
    let etc = tree.join("etc/systemd/system");
    let tmp = tree.join("usr/share/systemd/tmp.mount");
    if !tmp.is_file() {
        return Err(missing(
            "the tree has no /usr/share/systemd/tmp.mount (the layer needs systemd)",
        ));
    }
    fs::create_dir_all(&etc).map_err(io_err("creating", &etc))?;
    let dest = etc.join("tmp.mount");
    remove_if_present(&dest)?;
    fs::copy(&tmp, &dest).map_err(io_err("copying", &tmp))?;
    for (target, unit) in WANTS {
        link_wanted(tree, target, unit)?;
    }
    for timer in DROPPED_TIMERS {
        remove_if_present(&etc.join("timers.target.wants").join(timer))?;
    }
    for d in MOUNT_POINTS {
        let p = tree.join(d);
        fs::create_dir_all(&p).map_err(io_err("creating", &p))?;
    }
    let ssh = tree.join("etc/ssh");
    if let Ok(rd) = fs::read_dir(&ssh) {
        for e in rd {
            let e = e.map_err(io_err("reading", &ssh))?;
            if e.file_name().to_string_lossy().starts_with("ssh_host_") {
                remove_if_present(&e.path())?;
            }
        }
    }
    let id = tree.join("etc/machine-id");
    remove_if_present(&id)?;
    fs::write(&id, "").map_err(io_err("writing", &id))?;
    fs::set_permissions(&id, fs::Permissions::from_mode(0o444))
        .map_err(io_err("setting the mode of", &id))
}

/// `/etc/systemd/system/TARGET.wants/UNIT` → `unit` (absolute, as systemctl enable makes it).
fn link_wanted(tree: &Path, target: &str, unit: &str) -> Result<(), IntegrationError> {
    let dir = tree.join(format!("etc/systemd/system/{target}.wants"));
    fs::create_dir_all(&dir).map_err(io_err("creating", &dir))?;
    let name = Path::new(unit).file_name().expect("a unit file");
    if !tree.join(unit.trim_start_matches('/')).is_file() {
        return Err(missing(format!("the unit {unit} is not in the tree")));
    }
    let link = dir.join(name);
    remove_if_present(&link)?;
    std::os::unix::fs::symlink(unit, &link).map_err(io_err("linking", &link))
}

/// `/usr/share/ingot/packages.txt`: every installed package and version (the tree's dpkg-query).
fn package_list(tree: &Path) -> Result<(), IntegrationError> {
    let list = chroot(tree, &["dpkg-query", "-W", "-f", "${Package} ${Version}\n"])?;
    let dir = tree.join("usr/share/ingot");
    fs::create_dir_all(&dir).map_err(io_err("creating", &dir))?;
    let path = dir.join("packages.txt");
    fs::write(&path, list).map_err(io_err("writing", &path))
}

/// Where `name` is in the `kubernetes` input `dir`: the binary `dir/NAME`, or `usr/bin/NAME`
/// unpacked from `dir/NAME_*.deb` under `scratch`. `None`: neither is there.
pub(super) fn kube_program(
    dir: &Path,
    name: &str,
    scratch: &Path,
) -> Result<Option<PathBuf>, IntegrationError> {
    let bad = |reason: String| IntegrationError::Input {
        name: KUBERNETES_INPUT.into(),
        path: dir.to_owned(),
        reason,
    };
    let plain = dir.join(name);
    if plain.is_file() {
        return Ok(Some(plain));
    }
    let mut debs: Vec<PathBuf> = fs::read_dir(dir)
        .map_err(|e| bad(format!("reading it: {e}")))?
        .filter_map(|e| e.ok().map(|e| e.path()))
        .filter(|p| {
            p.file_name().is_some_and(|n| {
                let n = n.to_string_lossy();
                n.starts_with(&format!("{name}_")) && n.ends_with(".deb")
            })
        })
        .collect();
    debs.sort();
    let deb = match debs.as_slice() {
        [] => return Ok(None),
        [one] => one,
        more => {
            return Err(bad(format!(
                "{} .deb files of {name} ({}): give one",
                more.len(),
                more.iter()
                    .map(|p| p.display().to_string())
                    .collect::<Vec<_>>()
                    .join(", ")
            )))
        }
    };
    let out = scratch.join(name);
    fs::create_dir_all(&out).map_err(io_err("creating", &out))?;
    let status = Command::new("dpkg-deb")
        .arg("-x")
        .arg(deb)
        .arg(&out)
        .status()
        .map_err(|e| bad(format!("running dpkg-deb: {e}")))?;
    if !status.success() {
        return Err(bad(format!(
            "dpkg-deb -x {} failed ({status})",
            deb.display()
        )));
    }
    let bin = out.join("usr/bin").join(name);
    if !bin.is_file() {
        return Err(bad(format!("{} has no /usr/bin/{name}", deb.display())));
    }
    Ok(Some(bin))
}

/// kubeadm (required) and kubelet (with its unit, enabled) from the `kubernetes` input into the
/// base. A missing kubelet is said and skipped, as the script did.
fn kubernetes_base(tree: &Path, dir: &Path) -> Result<(), IntegrationError> {
    let scratch = tempfile::tempdir().map_err(io_err(
        "creating a scratch directory in",
        &std::env::temp_dir(),
    ))?;
    for name in KUBERNETES_BASE {
        let Some(src) = kube_program(dir, name, scratch.path())? else {
            if *name == "kubeadm" {
                return Err(IntegrationError::Input {
                    name: KUBERNETES_INPUT.into(),
                    path: dir.to_owned(),
                    reason: "no kubeadm (a binary `kubeadm` or a kubeadm_*.deb)".into(),
                });
            }
            tracing::warn!(
                "input `{KUBERNETES_INPUT}` ({}) has no {name}: the stack has none",
                dir.display()
            );
            continue;
        };
        let dest = tree.join("usr/bin").join(name);
        remove_if_present(&dest)?;
        fs::copy(&src, &dest).map_err(io_err("copying", &src))?;
        fs::set_permissions(&dest, fs::Permissions::from_mode(0o755))
            .map_err(io_err("setting the mode of", &dest))?;
        if *name == "kubelet" {
            for f in FILES.iter().filter(|f| f.stage == Stage::Kubelet) {
                install(tree, f)?;
                link_wanted(tree, "multi-user.target", f.dest)?;
            }
        }
    }
    Ok(())
}

/// `sha256:<hex>` of an input directory: every regular file under it, by relative path (sorted),
/// with its mode's executable bit and bytes. Symlinks and special files are refused.
pub fn input_digest(name: &str, dir: &Path) -> Result<String, IntegrationError> {
    let bad = |reason: String| IntegrationError::Input {
        name: name.to_owned(),
        path: dir.to_owned(),
        reason,
    };
    if !dir.is_dir() {
        return Err(bad("not a directory".into()));
    }
    let mut files = Vec::new();
    let mut stack = vec![PathBuf::new()];
    while let Some(rel) = stack.pop() {
        let here = dir.join(&rel);
        for e in fs::read_dir(&here).map_err(|e| bad(format!("reading {}: {e}", here.display())))? {
            let e = e.map_err(|e| bad(format!("reading {}: {e}", here.display())))?;
            let r = rel.join(e.file_name());
            let t = e
                .file_type()
                .map_err(|err| bad(format!("{}: {err}", r.display())))?;
            if t.is_dir() {
                stack.push(r);
            } else if t.is_file() {
                files.push(r);
            } else {
                return Err(bad(format!(
                    "{} is neither a file nor a directory",
                    r.display()
                )));
            }
        }
    }
    files.sort();
    let mut h = Sha256::new();
    for r in &files {
        let p = dir.join(r);
        let bytes = fs::read(&p).map_err(|e| bad(format!("reading {}: {e}", p.display())))?;
        let exec = fs::metadata(&p)
            .map(|m| m.permissions().mode() & 0o111 != 0)
            .unwrap_or(false);
        let name = r.to_string_lossy();
        h.update((name.len() as u64).to_le_bytes());
        h.update(name.as_bytes());
        h.update([u8::from(exec)]);
        h.update((bytes.len() as u64).to_le_bytes());
        h.update(&bytes);
    }
    Ok(format!("sha256:{}", hex::encode(h.finalize())))
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Every file of the repository's boot/ is compiled in, with the repository's executable bit.
    #[test]
    fn every_boot_file_is_embedded_with_its_mode() {
        let root = Path::new(env!("CARGO_MANIFEST_DIR")).join("../boot");
        let mut on_disk = Vec::new();
        let mut stack = vec![root.clone()];
        while let Some(d) = stack.pop() {
            for e in fs::read_dir(&d).unwrap() {
                let p = e.unwrap().path();
                if p.is_dir() {
                    stack.push(p);
                } else {
                    on_disk.push(p);
                }
            }
        }
        on_disk.sort();
        let mut embedded: Vec<PathBuf> = FILES.iter().map(|f| root.join(f.source)).collect();
        embedded.sort();
        assert_eq!(on_disk, embedded, "boot/ and FILES differ");
        for f in FILES {
            let p = root.join(f.source);
            assert_eq!(fs::read(&p).unwrap(), f.bytes, "{}", f.source);
            let exec = fs::metadata(&p).unwrap().permissions().mode() & 0o111 != 0;
            assert_eq!(exec, f.mode & 0o111 != 0, "{}: executable bit", f.source);
            assert!(f.dest.starts_with('/'), "{}", f.dest);
        }
    }

    #[test]
    fn the_digest_follows_the_files() {
        assert_eq!(digest(), digest_of(FILES));
        assert_eq!(digest_string(), format!("sha256:{}", hex::encode(digest())));
        let file = |dest, mode, bytes| BootFile {
            source: "systemd/x",
            dest,
            mode,
            stage: Stage::Tree,
            bytes,
        };
        let one = digest_of(&[file("/a", 0o644, b"x")]);
        assert_eq!(one, digest_of(&[file("/a", 0o644, b"x")]));
        assert_ne!(one, digest_of(&[file("/a", 0o755, b"x")]), "the mode");
        assert_ne!(one, digest_of(&[file("/a", 0o644, b"y")]), "the bytes");
        assert_ne!(
            one,
            digest_of(&[file("/b", 0o644, b"x")]),
            "the destination"
        );
    }

    #[test]
    fn hooks_stage_the_initramfs_files_with_their_modes() {
        let dir = tempfile::tempdir().unwrap();
        let args = customize_hooks(dir.path()).unwrap();
        let hook = dir.path().join("etc/initramfs-tools/hooks/ingot");
        assert_eq!(
            fs::metadata(&hook).unwrap().permissions().mode() & 0o777,
            0o755
        );
        let script = dir.path().join("etc/initramfs-tools/scripts/ingot");
        assert_eq!(
            fs::metadata(&script).unwrap().permissions().mode() & 0o777,
            0o644
        );
        assert!(args
            .iter()
            .any(|a| a.ends_with(" /etc/mdadm/") && a.contains("copy-in ")));
        assert!(args.last().unwrap().ends_with("update-initramfs -u -k all"));
    }

    #[test]
    fn a_tree_without_one_kernel_is_named() {
        let dir = tempfile::tempdir().unwrap();
        let t = dir.path();
        let e = kernel(t).unwrap_err().to_string();
        assert!(e.contains("no kernel"), "{e}");
        for k in ["6.1.0-1-amd64", "6.1.0-2-amd64"] {
            fs::create_dir_all(t.join("usr/lib/modules").join(k)).unwrap();
        }
        let e = kernel(t).unwrap_err().to_string();
        assert!(
            e.contains("more than one kernel (6.1.0-1-amd64, 6.1.0-2-amd64)"),
            "{e}"
        );
        fs::remove_dir(t.join("usr/lib/modules/6.1.0-2-amd64")).unwrap();
        let e = kernel(t).unwrap_err().to_string();
        assert!(e.contains("no /boot/vmlinuz-6.1.0-1-amd64"), "{e}");
        fs::create_dir_all(t.join("boot")).unwrap();
        fs::write(t.join("boot/vmlinuz-6.1.0-1-amd64"), "k").unwrap();
        fs::write(t.join("boot/initrd.img-6.1.0-1-amd64"), "i").unwrap();
        assert_eq!(kernel(t).unwrap(), "6.1.0-1-amd64");
        // Without systemd-boot's EFI binary the boot files stop, naming it.
        let e = boot_files(t, "6.1.0-1-amd64").unwrap_err().to_string();
        assert!(e.contains("systemd-boot-efi"), "{e}");
        assert_eq!(fs::read(t.join("boot/vmlinuz")).unwrap(), b"k");
    }

    /// kubeadm as a binary, kubelet from a .deb made by dpkg-deb: both in /usr/bin, kubelet's unit
    /// installed and enabled.
    #[test]
    fn the_kubernetes_input_takes_binaries_and_debs() {
        let dir = tempfile::tempdir().unwrap();
        let (input, tree) = (dir.path().join("k8s"), dir.path().join("tree"));
        let pkg = dir.path().join("pkg");
        fs::create_dir_all(pkg.join("DEBIAN")).unwrap();
        fs::create_dir_all(pkg.join("usr/bin")).unwrap();
        fs::create_dir_all(&input).unwrap();
        fs::create_dir_all(tree.join("usr/bin")).unwrap();
        fs::write(
            pkg.join("DEBIAN/control"),
            "Package: kubelet\nVersion: 1.31.0\nArchitecture: amd64\nMaintainer: x <x@example.org>\nDescription: kubelet\n",
        )
        .unwrap();
        fs::write(pkg.join("usr/bin/kubelet"), "kubelet from a deb").unwrap();
        let built = Command::new("dpkg-deb")
            .args(["--root-owner-group", "-b"])
            .arg(&pkg)
            .arg(input.join("kubelet_1.31.0_amd64.deb"))
            .output();
        let Ok(built) = built else {
            eprintln!("skipped: no dpkg-deb");
            return;
        };
        assert!(built.status.success(), "{built:?}");
        let e = super::super::inputs::take_input(KUBERNETES_INPUT, &input)
            .unwrap_err()
            .to_string();
        assert!(e.contains("no kubeadm"), "{e}");
        fs::write(input.join("kubeadm"), "kubeadm binary").unwrap();
        super::super::inputs::take_input(KUBERNETES_INPUT, &input).unwrap();
        kubernetes_base(&tree, &input).unwrap();
        assert_eq!(
            fs::read(tree.join("usr/bin/kubeadm")).unwrap(),
            b"kubeadm binary"
        );
        assert_eq!(
            fs::read(tree.join("usr/bin/kubelet")).unwrap(),
            b"kubelet from a deb"
        );
        let mode = fs::metadata(tree.join("usr/bin/kubelet"))
            .unwrap()
            .permissions()
            .mode();
        assert_eq!(mode & 0o777, 0o755);
        assert_eq!(
            fs::read_link(tree.join("etc/systemd/system/multi-user.target.wants/kubelet.service"))
                .unwrap(),
            Path::new("/usr/lib/systemd/system/kubelet.service")
        );
        // Two kubelet packages: which one is meant is not guessed.
        fs::copy(
            input.join("kubelet_1.31.0_amd64.deb"),
            input.join("kubelet_1.31.1_amd64.deb"),
        )
        .unwrap();
        let e = kubernetes_base(&tree, &input).unwrap_err().to_string();
        assert!(e.contains("2 .deb files of kubelet"), "{e}");
    }

    #[test]
    fn input_digests_follow_names_bytes_and_the_executable_bit() {
        let dir = tempfile::tempdir().unwrap();
        let d = dir.path();
        fs::write(d.join("kubeadm"), "a").unwrap();
        let one = input_digest("kubernetes", d).unwrap();
        assert_eq!(one, input_digest("kubernetes", d).unwrap());
        fs::set_permissions(d.join("kubeadm"), fs::Permissions::from_mode(0o755)).unwrap();
        let two = input_digest("kubernetes", d).unwrap();
        assert_ne!(one, two);
        fs::write(d.join("kubeadm"), "b").unwrap();
        assert_ne!(two, input_digest("kubernetes", d).unwrap());
        let e = input_digest("kubernetes", &d.join("nope"))
            .unwrap_err()
            .to_string();
        assert!(
            e.starts_with("input `kubernetes` (") && e.ends_with("not a directory"),
            "{e}"
        );
    }
}
