//! What the operator's inputs (`ingot build --input NAME=DIR`) put into a layer installed over
//! the base (`debian::over`); the base's own (`kubernetes`: kubeadm and kubelet) is
//! [`super::integration`]'s.
//!
//! - `kubernetes`: kubectl, as `/usr/bin/kubectl` (a binary `kubectl` or one `kubectl_*.deb`).
//! - `nvidia-toolkit`: NVIDIA's container toolkit, `.deb` files (nvidia-container-toolkit, -base,
//!   libnvidia-container1, libnvidia-container-tools) apt installs with the layer's packages;
//!   they are locked by the input's digest, not listed as archive packages.
//! - `kata`: Kata Containers' static release (a directory with `opt/kata/`, or holding one
//!   `kata-static-*.tar.*`), installed under `/usr`, never `/opt` (partly writable on a node):
//!   the shim as `/usr/bin/containerd-shim-kata-v2` (where the base's containerd looks), the
//!   guest kernel and image in `/usr/share/kata-containers`, virtiofsd as
//!   `/usr/lib/kata/virtiofsd`, and the release's QEMU configuration with its paths moved to
//!   those and its hypervisor Debian's `/usr/bin/qemu-system-x86_64`.
//! - `module-signing`: the key (`mok.key`) and certificate (`mok.pub`) dkms signs the layer's
//!   kernel modules with: Debian's kernel refuses unsigned modules under Secure Boot's lockdown,
//!   and signed ones unless the key is trusted (a MOK enrolled through shim).
//! - `images`: container images to preload, every subdirectory that is an OCI image layout
//!   (its index.json's first manifest, named by its `io.containerd.image.name` annotation).

use std::fs;
use std::os::unix::fs::PermissionsExt;
use std::path::{Path, PathBuf};
use std::process::Command;

use super::integration::IntegrationError;
use crate::manifest::{ImageSource, PreloadSpec};

pub use crate::debian_spec::{
    IMAGES_INPUT, KATA_INPUT, KUBERNETES_INPUT, MODULE_SIGNING_INPUT, NVIDIA_TOOLKIT_INPUT,
};
/// The files of [`MODULE_SIGNING_INPUT`], by the names dkms 3.0 reads.
pub const MODULE_SIGNING_FILES: [&str; 2] = ["mok.key", "mok.pub"];

/// The release files the layer needs, below `opt/kata/`.
const KATA_FILES: &[&str] = &[
    "bin/containerd-shim-kata-v2",
    "share/kata-containers/vmlinux.container",
    "share/kata-containers/kata-containers.img",
    "libexec/virtiofsd",
    "share/defaults/kata-containers/configuration-qemu.toml",
];

fn bad(name: &str, dir: &Path, reason: impl Into<String>) -> IntegrationError {
    IntegrationError::Input {
        name: name.to_owned(),
        path: dir.to_owned(),
        reason: reason.into(),
    }
}

fn io_err(what: &'static str, path: &Path) -> impl FnOnce(std::io::Error) -> IntegrationError {
    let path = path.to_owned();
    move |source| IntegrationError::Io { what, path, source }
}

/// The files directly in `dir` whose names end with `suffix` (sorted).
fn files_ending(dir: &Path, prefix: &str, suffix: &str) -> Result<Vec<PathBuf>, IntegrationError> {
    let mut out: Vec<PathBuf> = fs::read_dir(dir)
        .map_err(io_err("reading", dir))?
        .filter_map(|e| e.ok().map(|e| e.path()))
        .filter(|p| {
            p.is_file()
                && p.file_name().is_some_and(|n| {
                    let n = n.to_string_lossy();
                    n.starts_with(prefix) && n.ends_with(suffix)
                })
        })
        .collect();
    out.sort();
    Ok(out)
}

/// Checks the operator input `name` at `dir` before anything is built and returns its digest
/// ([`super::integration::input_digest`]): the `kubernetes` input must hold a kubeadm (binary
/// or one `.deb`).
pub fn take_input(name: &str, dir: &Path) -> Result<String, IntegrationError> {
    let digest = super::integration::input_digest(name, dir)?;
    check(name, dir)?;
    if name == KUBERNETES_INPUT {
        let debs = fs::read_dir(dir)
            .map_err(io_err("reading", dir))?
            .filter_map(Result::ok)
            .filter(|e| {
                let n = e.file_name().to_string_lossy().into_owned();
                n.starts_with("kubeadm_") && n.ends_with(".deb")
            })
            .count();
        if !dir.join("kubeadm").is_file() && debs != 1 {
            return Err(IntegrationError::Input {
                name: name.to_owned(),
                path: dir.to_owned(),
                reason: format!(
                    "no kubeadm: a binary `kubeadm` or one kubeadm_*.deb is needed (found {debs} \
                     .deb files)"
                ),
            });
        }
    }
    Ok(digest)
}

/// Checks what the inputs of this module must hold (before anything is built).
pub fn check(name: &str, dir: &Path) -> Result<(), IntegrationError> {
    let tarball = || -> Result<bool, IntegrationError> {
        Ok(files_ending(dir, "kata-static-", "")?
            .iter()
            .any(|p| p.to_string_lossy().contains(".tar")))
    };
    match name {
        NVIDIA_TOOLKIT_INPUT if files_ending(dir, "", ".deb")?.is_empty() => {
            Err(bad(name, dir, "no .deb files in it"))
        }
        KATA_INPUT if !dir.join("opt/kata").is_dir() && !tarball()? => Err(bad(
            name,
            dir,
            "neither opt/kata/ nor a kata-static-*.tar.* in it",
        )),
        IMAGES_INPUT => preloads(dir).map(drop),
        MODULE_SIGNING_INPUT => {
            match MODULE_SIGNING_FILES.iter().find(|f| !dir.join(f).is_file()) {
                Some(f) => Err(bad(
                    name,
                    dir,
                    format!("no {f} (the signing key is mok.key, its certificate mok.pub)"),
                )),
                None => Ok(()),
            }
        }
        _ => Ok(()),
    }
}

/// The toolkit's `.deb` files of the `nvidia-toolkit` input.
pub fn debs(dir: &Path) -> Result<Vec<PathBuf>, IntegrationError> {
    files_ending(dir, "", ".deb")
}

/// The package names of the `nvidia-toolkit` input's `.deb` files (the archive has none of them).
pub fn deb_packages(dir: &Path) -> Result<std::collections::BTreeSet<String>, IntegrationError> {
    debs(dir)?
        .iter()
        .map(|d| {
            super::deb::read_control(d)
                .map(|c| c.name)
                .map_err(|e| bad(NVIDIA_TOOLKIT_INPUT, dir, e.to_string()))
        })
        .collect()
}

/// kubectl from the `kubernetes` input into the merged tree.
pub fn kubectl(merged: &Path, dir: &Path, scratch: &Path) -> Result<bool, IntegrationError> {
    let Some(src) = super::integration::kube_program(dir, "kubectl", scratch)? else {
        tracing::warn!(
            "input `kubernetes` ({}) has no kubectl: the layer has none",
            dir.display()
        );
        return Ok(false);
    };
    let dest = merged.join("usr/bin/kubectl");
    fs::copy(&src, &dest).map_err(io_err("copying", &src))?;
    fs::set_permissions(&dest, fs::Permissions::from_mode(0o755))
        .map_err(io_err("setting the mode of", &dest))?;
    Ok(true)
}

/// The release's `opt/kata` directory: `dir/opt/kata`, or the one tarball unpacked in `scratch`.
fn kata_release(dir: &Path, scratch: &Path) -> Result<PathBuf, IntegrationError> {
    let plain = dir.join("opt/kata");
    if plain.is_dir() {
        return Ok(plain);
    }
    let tarballs: Vec<PathBuf> = files_ending(dir, "kata-static-", "")?
        .into_iter()
        .filter(|p| p.to_string_lossy().contains(".tar"))
        .collect();
    let [tarball] = tarballs.as_slice() else {
        return Err(bad(
            KATA_INPUT,
            dir,
            format!("{} kata-static-*.tar.* files: give one", tarballs.len()),
        ));
    };
    let out = scratch.join("kata-release");
    fs::create_dir_all(&out).map_err(io_err("creating", &out))?;
    let st = Command::new("tar")
        .arg("-xf")
        .arg(tarball)
        .arg("-C")
        .arg(&out)
        .status()
        .map_err(io_err("unpacking", tarball))?;
    if !st.success() {
        return Err(bad(
            KATA_INPUT,
            dir,
            format!("tar -xf {} failed ({st})", tarball.display()),
        ));
    }
    Ok(out.join("opt/kata"))
}

/// The release's QEMU configuration with its paths moved under /usr and Debian's QEMU as the
/// hypervisor; a path left under /opt is refused.
pub fn kata_configuration(text: &str) -> Result<String, String> {
    let moved = text
        .replace(
            "/opt/kata/share/kata-containers/",
            "/usr/share/kata-containers/",
        )
        .replace(
            "/opt/kata/bin/qemu-system-x86_64",
            "/usr/bin/qemu-system-x86_64",
        )
        .replace("/opt/kata/libexec/virtiofsd", "/usr/lib/kata/virtiofsd");
    let left: Vec<&str> = moved
        .lines()
        .filter(|l| {
            let code = l.split('#').next().unwrap_or("");
            code.contains("/opt/")
        })
        .collect();
    if left.is_empty() {
        Ok(moved)
    } else {
        Err(format!(
            "configuration-qemu.toml still names /opt after moving its paths: {}",
            left.join("; ")
        ))
    }
}

/// The absolute paths the configuration's `path`, `kernel`, `image` and `virtio_fs_daemon` keys
/// name.
fn configured_paths(conf: &str) -> Vec<String> {
    conf.lines()
        .filter_map(|l| {
            let (k, v) = l.split_once('=')?;
            let k = k.trim();
            if !["path", "kernel", "image", "virtio_fs_daemon"].contains(&k) {
                return None;
            }
            let v = v.trim().strip_prefix('"')?;
            let v = &v[..v.find('"')?];
            v.starts_with('/').then(|| v.to_owned())
        })
        .collect()
}

fn install_file(from: &Path, to: &Path, mode: u32) -> Result<(), IntegrationError> {
    if let Some(p) = to.parent() {
        fs::create_dir_all(p).map_err(io_err("creating", p))?;
    }
    fs::copy(from, to).map_err(io_err("copying", from))?;
    fs::set_permissions(to, fs::Permissions::from_mode(mode))
        .map_err(io_err("setting the mode of", to))
}

/// The Kata release from the `kata` input into the merged tree (after QEMU is installed).
pub fn kata(merged: &Path, dir: &Path, scratch: &Path) -> Result<(), IntegrationError> {
    let k = kata_release(dir, scratch)?;
    for f in KATA_FILES {
        if !k.join(f).exists() {
            return Err(bad(
                KATA_INPUT,
                dir,
                format!("the release has no opt/kata/{f}"),
            ));
        }
    }
    let usr = merged.join("usr");
    install_file(
        &k.join("bin/containerd-shim-kata-v2"),
        &usr.join("bin/containerd-shim-kata-v2"),
        0o755,
    )?;
    if k.join("bin/kata-runtime").is_file() {
        install_file(
            &k.join("bin/kata-runtime"),
            &usr.join("bin/kata-runtime"),
            0o755,
        )?;
    }
    install_file(
        &k.join("libexec/virtiofsd"),
        &usr.join("lib/kata/virtiofsd"),
        0o755,
    )?;
    let share = usr.join("share/kata-containers");
    fs::create_dir_all(&share).map_err(io_err("creating", &share))?;
    let st = Command::new("cp")
        .arg("-a")
        .arg(k.join("share/kata-containers/."))
        .arg(&share)
        .status()
        .map_err(io_err("copying", &k))?;
    if !st.success() {
        return Err(bad(
            KATA_INPUT,
            dir,
            format!("copying its guest files: {st}"),
        ));
    }
    let src = k.join("share/defaults/kata-containers/configuration-qemu.toml");
    let text = fs::read_to_string(&src).map_err(io_err("reading", &src))?;
    let conf = kata_configuration(&text).map_err(|e| bad(KATA_INPUT, dir, e))?;
    for p in configured_paths(&conf) {
        if fs::symlink_metadata(merged.join(p.trim_start_matches('/'))).is_err() {
            return Err(bad(
                KATA_INPUT,
                dir,
                format!("the configuration names {p}, which the layer does not have"),
            ));
        }
    }
    let dest = share.join("configuration.toml");
    fs::write(&dest, conf).map_err(io_err("writing", &dest))
}

/// The images of the `images` input: one preload per OCI image layout below `dir`.
pub fn preloads(dir: &Path) -> Result<Vec<PreloadSpec>, IntegrationError> {
    let mut layouts: Vec<PathBuf> = fs::read_dir(dir)
        .map_err(io_err("reading", dir))?
        .filter_map(|e| e.ok().map(|e| e.path()))
        .filter(|p| p.join("index.json").is_file())
        .collect();
    layouts.sort();
    if layouts.is_empty() {
        return Err(bad(
            IMAGES_INPUT,
            dir,
            "no OCI image layout (a subdirectory with index.json) in it",
        ));
    }
    let out: Vec<PreloadSpec> = layouts
        .iter()
        .map(|l| preload_of(dir, l))
        .collect::<Result<_, _>>()?;
    for (i, p) in out.iter().enumerate() {
        if !ingot_layers::names::is_plain_name(&p.name) || out[..i].iter().any(|q| q.name == p.name)
        {
            return Err(bad(
                IMAGES_INPUT,
                dir,
                format!(
                    "layout {:?} does not make a plain, unique image name",
                    p.name
                ),
            ));
        }
    }
    Ok(out)
}

fn preload_of(dir: &Path, layout: &Path) -> Result<PreloadSpec, IntegrationError> {
    let path = layout.join("index.json");
    let json: serde_json::Value =
        serde_json::from_slice(&fs::read(&path).map_err(io_err("reading", &path))?)
            .map_err(|e| bad(IMAGES_INPUT, dir, format!("{}: {e}", path.display())))?;
    let first = &json["manifests"][0];
    let digest = first["digest"].as_str().unwrap_or_default();
    let reference = first["annotations"]["io.containerd.image.name"]
        .as_str()
        .unwrap_or_default();
    if !ingot_layers::descriptor::is_sha256_digest(digest) || reference.is_empty() {
        return Err(bad(
            IMAGES_INPUT,
            dir,
            format!(
                "{}: its first manifest needs a sha256 digest and an io.containerd.image.name \
                 annotation",
                path.display()
            ),
        ));
    }
    let stem = layout
        .file_name()
        .unwrap_or_default()
        .to_string_lossy()
        .to_ascii_lowercase();
    let name: String = stem
        .chars()
        .map(|c| if c == '.' { '-' } else { c })
        .filter(|c| c.is_ascii_alphanumeric() || *c == '-' || *c == '_')
        .collect();
    Ok(PreloadSpec {
        name,
        reference: reference.to_owned(),
        digest: digest.to_owned(),
        source: ImageSource::OciLayout(layout.to_owned()),
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_kata_configuration_is_moved_under_usr_and_a_left_opt_path_refused() {
        let text = "[hypervisor.qemu]\npath = \"/opt/kata/bin/qemu-system-x86_64\"\n\
                    kernel = \"/opt/kata/share/kata-containers/vmlinux.container\"\n\
                    # a comment about /opt/kata\n\
                    virtio_fs_daemon = \"/opt/kata/libexec/virtiofsd\"\n";
        let conf = kata_configuration(text).unwrap();
        assert_eq!(
            configured_paths(&conf),
            [
                "/usr/bin/qemu-system-x86_64",
                "/usr/share/kata-containers/vmlinux.container",
                "/usr/lib/kata/virtiofsd"
            ]
        );
        let e = kata_configuration("firmware = \"/opt/kata/share/ovmf/OVMF.fd\"\n").unwrap_err();
        assert!(e.contains("still names /opt"), "{e}");
    }

    #[test]
    fn preloads_are_every_layout_named_by_its_annotation() {
        let dir = tempfile::tempdir().unwrap();
        let l = dir.path().join("Busy.Box");
        fs::create_dir_all(&l).unwrap();
        fs::write(
            l.join("index.json"),
            r#"{"manifests":[{"digest":"sha256:abababababababababababababababababababababababababababababababab","annotations":{"io.containerd.image.name":"docker.io/library/busybox:1"}}]}"#,
        )
        .unwrap();
        fs::create_dir_all(dir.path().join("not-a-layout")).unwrap();
        let p = preloads(dir.path()).unwrap();
        assert_eq!(p.len(), 1);
        assert_eq!(p[0].name, "busy-box");
        assert_eq!(p[0].reference, "docker.io/library/busybox:1");
        assert_eq!(p[0].digest, format!("sha256:{}", "ab".repeat(32)));
        fs::write(
            l.join("index.json"),
            r#"{"manifests":[{"digest":"sha256:ab"}]}"#,
        )
        .unwrap();
        let e = preloads(dir.path()).unwrap_err().to_string();
        assert!(e.contains("io.containerd.image.name"), "{e}");
        let empty = tempfile::tempdir().unwrap();
        assert!(check(IMAGES_INPUT, empty.path()).is_err());
        assert!(check(NVIDIA_TOOLKIT_INPUT, empty.path()).is_err());
        assert!(check(KATA_INPUT, empty.path()).is_err());
    }
}
