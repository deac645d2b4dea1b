//! The overlay a layer is installed in: the layers below as overlayfs' lower directories (with
//! dpkg's state of the base above them, since the base tree's `/var` is empty), an empty upper
//! directory that becomes the layer ([`super::upper`]), and in the merged tree `/proc`, `/sys`,
//! `/dev`, the `.deb` cache as apt's archive directory and an apt configuration of its own under
//! `/tmp`. Commands run chrooted in the merged tree.
//!
//! overlayfs is mounted with `metacopy=off,redirect_dir=off,index=off`: a copied-up file carries
//! its data, a renamed directory is copied, and nothing refers to the lower inodes, so the upper
//! directory alone is the layer's content. Every mount is undone in reverse order when the
//! overlay is dropped; nothing below the work directory is removed while anything is mounted
//! there.

use std::fs;
use std::io;
use std::path::{Path, PathBuf};
use std::process::{Command, Output, Stdio};

/// The base's initrd is the only one: a layer's package must not make another one.
const NO_INITRAMFS: &str = "update_initramfs=no\nbackup_initramfs=no\n";
/// apt inside the overlay: its own sources and lists under /tmp (dropped with the layer's tmp/),
/// no recommends, dpkg's path filters as the base's.
const APT_CONF: &str = r#"Dir::Etc::SourceList "/tmp/apt/sources.list";
Dir::Etc::SourceParts "/tmp/apt/parts";
Dir::Etc::PreferencesParts "/tmp/apt/preferences.d";
Acquire::Languages "none";
Dir::State::Lists "/tmp/apt/lists";
APT::Install-Recommends "false";
APT::Sandbox::User "root";
"#;

/// Why the overlay could not be made or used.
#[derive(Debug, thiserror::Error)]
pub enum OverlayError {
    #[error("mounting {what} at {}: {reason}", at.display())]
    Mount {
        what: String,
        at: PathBuf,
        reason: String,
    },
    #[error("running {command} in the overlay")]
    Run {
        command: String,
        #[source]
        source: io::Error,
    },
    #[error("{what} {}", path.display())]
    Io {
        what: &'static str,
        path: PathBuf,
        #[source]
        source: io::Error,
    },
}

fn io_err(what: &'static str, path: &Path) -> impl FnOnce(io::Error) -> OverlayError {
    let path = path.to_owned();
    move |source| OverlayError::Io { what, path, source }
}

/// What the overlay is made of.
#[derive(Debug)]
pub struct Spec<'a> {
    /// The layers below, highest first (the base last).
    pub lowers: &'a [&'a Path],
    /// dpkg's state of the layers below (their `/var/lib/dpkg`).
    pub dpkg: &'a Path,
    /// The `.deb` cache, apt's archive directory in the overlay.
    pub debs: &'a Path,
    /// apt's sources (`deb URL SUITE COMPONENTS` lines).
    pub sources: &'a [String],
    /// dpkg's `--path-exclude=` and `--path-include=` filters, in order.
    pub dpkg_filters: &'a [String],
    /// A local apt repository, bound read-only at [`REPO_IN_OVERLAY`] (sources name it there).
    pub repo: Option<&'a Path>,
    /// apt preferences for the install (pins), if any.
    pub preferences: Option<&'a str>,
}

/// Where [`Spec::repo`] is seen inside the overlay.
pub const REPO_IN_OVERLAY: &str = "/tmp/ingot-repo";

/// A mounted overlay; unmounted when dropped.
#[derive(Debug)]
pub struct Overlay {
    work: PathBuf,
    mounts: Vec<PathBuf>,
}

impl Overlay {
    /// Mounts the overlay of `spec` below `work` (created; it must be empty).
    pub fn mount(spec: &Spec<'_>, work: &Path) -> Result<Overlay, OverlayError> {
        let mut o = Overlay {
            work: work.to_owned(),
            mounts: Vec::new(),
        };
        let state = work.join("state");
        for d in ["upper", "work", "merged"] {
            let p = work.join(d);
            fs::create_dir_all(&p).map_err(io_err("creating", &p))?;
        }
        copy_dir(spec.dpkg, &state.join("var/lib/dpkg"))?;
        let mut lowers = vec![state.display().to_string()];
        lowers.extend(spec.lowers.iter().map(|l| l.display().to_string()));
        let options = format!(
            "lowerdir={},upperdir={},workdir={},metacopy=off,redirect_dir=off,index=off",
            lowers.join(":"),
            work.join("upper").display(),
            work.join("work").display()
        );
        let merged = o.merged();
        o.mount_one(
            &["-t", "overlay", "overlay", "-o", &options],
            &merged,
            "the overlay",
        )?;
        o.mount_one(&["-t", "proc", "proc"], &merged.join("proc"), "proc")?;
        o.mount_one(&["-t", "sysfs", "sysfs"], &merged.join("sys"), "sysfs")?;
        o.mount_one(&["--bind", "/dev"], &merged.join("dev"), "/dev")?;
        // The tree's resolver is empty (the node's is its own): apt resolves the archives'
        // names with the build host's, bound over it for the install only.
        let resolv = merged.join("etc/resolv.conf");
        if fs::symlink_metadata(&resolv).is_ok_and(|m| m.is_file()) {
            o.mount_one(
                &["--bind", "-o", "ro", "/etc/resolv.conf"],
                &resolv,
                "the host's resolv.conf",
            )?;
        }
        let archives = merged.join("var/cache/apt/archives");
        fs::create_dir_all(&archives).map_err(io_err("creating", &archives))?;
        let debs = spec.debs.display().to_string();
        o.mount_one(&["--bind", &debs], &archives, "the .deb cache")?;
        let conf = work.join("initramfs.conf");
        fs::write(&conf, NO_INITRAMFS).map_err(io_err("writing", &conf))?;
        let target = merged.join("etc/initramfs-tools/update-initramfs.conf");
        if target.exists() {
            let conf = conf.display().to_string();
            o.mount_one(&["--bind", &conf], &target, "update-initramfs.conf")?;
        }
        o.write_apt(spec)?;
        if let Some(repo) = spec.repo {
            let at = merged.join(REPO_IN_OVERLAY.trim_start_matches('/'));
            fs::create_dir_all(&at).map_err(io_err("creating", &at))?;
            let from = repo.display().to_string();
            o.mount_one(&["--bind", "-o", "ro", &from], &at, "the local repository")?;
        }
        Ok(o)
    }

    /// The merged tree.
    pub fn merged(&self) -> PathBuf {
        self.work.join("merged")
    }

    /// The upper directory (the layer, once unmounted).
    pub fn upper(&self) -> PathBuf {
        self.work.join("upper")
    }

    fn mount_one(&mut self, args: &[&str], at: &Path, what: &str) -> Result<(), OverlayError> {
        let out = Command::new("mount")
            .args(args)
            .arg(at)
            .stdin(Stdio::null())
            .output()
            .map_err(|e| OverlayError::Mount {
                what: what.to_owned(),
                at: at.to_owned(),
                reason: e.to_string(),
            })?;
        if !out.status.success() {
            return Err(OverlayError::Mount {
                what: what.to_owned(),
                at: at.to_owned(),
                reason: String::from_utf8_lossy(&out.stderr).trim().to_owned(),
            });
        }
        self.mounts.push(at.to_owned());
        Ok(())
    }

    /// apt's sources and configuration under the merged tree's /tmp.
    fn write_apt(&self, spec: &Spec<'_>) -> Result<(), OverlayError> {
        let apt = self.merged().join("tmp/apt");
        for d in ["lists/partial", "parts", "preferences.d"] {
            let p = apt.join(d);
            fs::create_dir_all(&p).map_err(io_err("creating", &p))?;
        }
        let m = self.merged();
        for d in ["var/log/apt", "var/cache/debconf", "var/lib/apt", "var/tmp"] {
            let p = m.join(d);
            fs::create_dir_all(&p).map_err(io_err("creating", &p))?;
        }
        let list = apt.join("sources.list");
        fs::write(&list, spec.sources.join("\n") + "\n").map_err(io_err("writing", &list))?;
        let filters: Vec<String> = spec
            .dpkg_filters
            .iter()
            .map(|f| format!("\"{f}\";"))
            .collect();
        let conf = format!("{APT_CONF}Dpkg::Options {{ {} }};\n", filters.join(" "));
        let path = apt.join("apt.conf");
        fs::write(&path, conf).map_err(io_err("writing", &path))?;
        if let Some(prefs) = spec.preferences {
            let path = apt.join("preferences.d/ingot-lock.pref");
            fs::write(&path, prefs).map_err(io_err("writing", &path))?;
        }
        Ok(())
    }

    /// Runs `args` chrooted in the merged tree, apt reading the overlay's configuration.
    pub fn run(&self, args: &[&str]) -> Result<Output, OverlayError> {
        Command::new("chroot")
            .arg(self.merged())
            .arg("env")
            .args([
                "APT_CONFIG=/tmp/apt/apt.conf",
                "DEBIAN_FRONTEND=noninteractive",
                "LC_ALL=C.UTF-8",
                "PATH=/usr/sbin:/usr/bin:/sbin:/bin",
            ])
            .args(args)
            .stdin(Stdio::null())
            .output()
            .map_err(|source| OverlayError::Run {
                command: args.join(" "),
                source,
            })
    }

    /// Unmounts everything (the last mount first); the upper directory stays.
    pub fn unmount(mut self) -> Result<PathBuf, OverlayError> {
        self.unmount_all()?;
        Ok(self.upper())
    }

    fn unmount_all(&mut self) -> Result<(), OverlayError> {
        while let Some(at) = self.mounts.pop() {
            let out = Command::new("umount").arg(&at).output();
            let ok = out.as_ref().is_ok_and(|o| o.status.success());
            if !ok {
                // Busy (a process the install started still runs): detached now, gone when it
                // ends; the work directory is not removed while it is still mounted.
                let lazy = Command::new("umount").arg("-l").arg(&at).status();
                if !lazy.is_ok_and(|s| s.success()) {
                    self.mounts.push(at.clone());
                    return Err(OverlayError::Mount {
                        what: "nothing (unmounting)".to_owned(),
                        at,
                        reason: "umount failed".to_owned(),
                    });
                }
            }
        }
        Ok(())
    }
}

impl Drop for Overlay {
    fn drop(&mut self) {
        if self.unmount_all().is_ok() {
            return;
        }
        // Something is still mounted below (the host's /dev among them): the scratch directory
        // around it is removed when the build ends, which must not reach into a mount. Moved
        // out of it, beside it, and left for a person to look at.
        let name = format!(
            ".mounted-{}-{}",
            std::process::id(),
            self.work.file_name().unwrap_or_default().to_string_lossy()
        );
        let aside = self
            .work
            .parent()
            .and_then(Path::parent)
            .map(|p| p.join(name));
        match aside.map(|to| fs::rename(&self.work, &to).map(|()| to)) {
            Some(Ok(to)) => tracing::error!(
                "{} is still mounted; moved to {} (unmount and remove it by hand)",
                self.work.display(),
                to.display()
            ),
            _ => tracing::error!(
                "{} is still mounted and could not be moved aside",
                self.work.display()
            ),
        }
    }
}

/// `cp -a FROM TO` (modes, owners, links and attributes as they are).
pub(super) fn copy_dir(from: &Path, to: &Path) -> Result<(), OverlayError> {
    if let Some(parent) = to.parent() {
        fs::create_dir_all(parent).map_err(io_err("creating", parent))?;
    }
    let status = Command::new("cp")
        .arg("-a")
        .arg(from)
        .arg(to)
        .status()
        .map_err(io_err("copying", from))?;
    if status.success() {
        Ok(())
    } else {
        Err(io_err("copying", from)(io::Error::other(format!(
            "cp -a ended with {status}"
        ))))
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::os::unix::fs::MetadataExt;

    /// A lower tree with busybox as its shell: a write in the merged tree lands in the upper
    /// directory only, the lower tree is untouched, dpkg's state is visible, and every mount is
    /// gone after [`Overlay::unmount`] (needs root and busybox-static).
    #[test]
    fn writes_land_in_the_upper_directory_and_every_mount_is_undone() {
        let busybox = Path::new("/bin/busybox");
        if fs::metadata("/proc/self").map(|m| m.uid()).unwrap_or(1) != 0 || !busybox.exists() {
            eprintln!("skipped: needs root and busybox");
            return;
        }
        let dir = tempfile::tempdir().unwrap();
        let lower = dir.path().join("lower");
        for d in ["bin", "proc", "sys", "dev", "tmp", "etc", "var"] {
            fs::create_dir_all(lower.join(d)).unwrap();
        }
        fs::copy(busybox, lower.join("bin/busybox")).unwrap();
        std::os::unix::fs::symlink("busybox", lower.join("bin/sh")).unwrap();
        fs::create_dir_all(lower.join("usr/bin")).unwrap();
        std::os::unix::fs::symlink("/bin/busybox", lower.join("usr/bin/env")).unwrap();
        fs::write(lower.join("etc/hosts"), "lower\n").unwrap();
        let dpkg = dir.path().join("dpkg");
        fs::create_dir_all(&dpkg).unwrap();
        fs::write(dpkg.join("status"), "Package: base-files\n").unwrap();
        let debs = dir.path().join("debs");
        fs::create_dir_all(&debs).unwrap();
        let work = dir.path().join("work");
        let spec = Spec {
            lowers: &[&lower],
            dpkg: &dpkg,
            debs: &debs,
            sources: &["deb http://deb.debian.org/debian bookworm main".to_owned()],
            dpkg_filters: &["--path-exclude=/usr/share/doc/*".to_owned()],
            repo: None,
            preferences: None,
        };
        let o = Overlay::mount(&spec, &work).unwrap();
        let out = o
            .run(&[
                "/bin/sh",
                "-c",
                "echo layer >/etc/hosts; /bin/busybox cat /var/lib/dpkg/status; \
                 /bin/busybox cat /tmp/apt/apt.conf",
            ])
            .unwrap();
        assert!(out.status.success(), "{out:?}");
        let text = String::from_utf8_lossy(&out.stdout);
        assert!(text.contains("Package: base-files"), "{text}");
        assert!(
            text.contains("\"--path-exclude=/usr/share/doc/*\";"),
            "{text}"
        );
        let upper = o.unmount().unwrap();
        assert_eq!(
            fs::read_to_string(upper.join("etc/hosts")).unwrap(),
            "layer\n"
        );
        assert_eq!(
            fs::read_to_string(lower.join("etc/hosts")).unwrap(),
            "lower\n"
        );
        let mounts = fs::read_to_string("/proc/self/mounts").unwrap();
        assert!(!mounts.contains(&work.display().to_string()), "{mounts}");
    }
}
