//! Loop devices and mounts for the root-only tests: a file attached to a loop device
//! (`losetup`), optionally mounted, and both undone on drop, also when the test panics. Every test
//! that attaches a loop device or mounts an image goes through here (check [`have_loop_devices`]
//! first).
//!
//! [`have_loop_devices`]: crate::skip::have_loop_devices

use std::fs;
use std::path::{Path, PathBuf};
use std::process::Command;

use crate::command::run_ok;
use crate::skip::find_tool;

/// How a file is attached.
#[derive(Debug, Clone, Copy, Default)]
pub struct LoopOptions {
    /// `--read-only`: the kernel refuses writes to the device.
    pub read_only: bool,
    /// `--partscan`: the kernel reads the partition table (`/dev/loopNpM`).
    pub partscan: bool,
    /// `--offset`: the device starts this many bytes into the file.
    pub offset: u64,
    /// `--sizelimit`: the device is at most this many bytes long.
    pub size: Option<u64>,
}

impl LoopOptions {
    /// The whole file, read-only.
    pub const READ_ONLY: LoopOptions = LoopOptions {
        read_only: true,
        partscan: false,
        offset: 0,
        size: None,
    };

    /// `size` bytes at `offset`, read-only.
    pub fn read_only_range(offset: u64, size: u64) -> LoopOptions {
        LoopOptions {
            read_only: true,
            offset,
            size: Some(size),
            ..LoopOptions::default()
        }
    }
}

/// A tool's path (sbin included), or its bare name for the error to name.
fn tool(name: &str) -> PathBuf {
    find_tool(name).unwrap_or_else(|| PathBuf::from(name))
}

/// A file attached to a loop device; detached on drop.
#[derive(Debug)]
pub struct LoopDevice {
    path: String,
}

impl LoopDevice {
    /// Attaches `file` (`losetup --find --show`); panics with losetup's words if it fails.
    pub fn attach(file: &Path, options: &LoopOptions) -> LoopDevice {
        let mut cmd = Command::new(tool("losetup"));
        cmd.args(["--find", "--show"]);
        if options.read_only {
            cmd.arg("--read-only");
        }
        if options.partscan {
            cmd.arg("--partscan");
        }
        if options.offset != 0 {
            cmd.arg("--offset").arg(options.offset.to_string());
        }
        if let Some(size) = options.size {
            cmd.arg("--sizelimit").arg(size.to_string());
        }
        let path = run_ok(cmd.arg(file)).trim().to_string();
        assert!(path.starts_with("/dev/loop"), "losetup printed {path:?}");
        LoopDevice { path }
    }

    /// `/dev/loopN`.
    pub fn path(&self) -> &Path {
        Path::new(&self.path)
    }

    /// `/dev/loopN`, as text.
    pub fn as_str(&self) -> &str {
        &self.path
    }

    /// `loopN`: the name in `/sys/block` and `/proc/partitions`.
    pub fn name(&self) -> &str {
        self.path.trim_start_matches("/dev/")
    }
}

impl Drop for LoopDevice {
    fn drop(&mut self) {
        let _ = Command::new(tool("losetup"))
            .arg("-d")
            .arg(&self.path)
            .status();
    }
}

/// A file system on a loop device over an image, mounted; on drop unmounted (lazily if busy),
/// then the device detached and a directory of its own removed.
#[derive(Debug)]
pub struct LoopMount {
    /// Where it is mounted.
    pub dir: PathBuf,
    device: Option<LoopDevice>,
    own_dir: Option<tempfile::TempDir>,
}

impl LoopMount {
    /// `image` whole and read-only at `dir` (made if missing), its file system type probed.
    pub fn new(image: &Path, dir: &Path) -> LoopMount {
        LoopMount::with(image, dir, &LoopOptions::READ_ONLY, None)
    }

    /// `image` attached as `options` say and mounted at `dir` (made if missing); read-only
    /// devices are mounted read-only. `fstype` is `mount -t`; None lets mount probe.
    pub fn with(
        image: &Path,
        dir: &Path,
        options: &LoopOptions,
        fstype: Option<&str>,
    ) -> LoopMount {
        fs::create_dir_all(dir).unwrap_or_else(|e| panic!("{}: {e}", dir.display()));
        let device = LoopDevice::attach(image, options);
        let mut cmd = Command::new(tool("mount"));
        if let Some(t) = fstype {
            cmd.args(["-t", t]);
        }
        if options.read_only {
            cmd.args(["-o", "ro"]);
        }
        // On failure `device` is dropped (detached) by the panic.
        run_ok(cmd.arg(device.path()).arg(dir));
        LoopMount {
            dir: dir.to_owned(),
            device: Some(device),
            own_dir: None,
        }
    }

    /// As [`LoopMount::with`], at a temporary directory of its own.
    pub fn temp(image: &Path, options: &LoopOptions, fstype: Option<&str>) -> LoopMount {
        let own = tempfile::tempdir().unwrap();
        let mut m = LoopMount::with(image, own.path(), options, fstype);
        m.own_dir = Some(own);
        m
    }

    /// Where it is mounted.
    pub fn path(&self) -> &Path {
        &self.dir
    }

    /// The loop device the file system is mounted from.
    pub fn device(&self) -> &LoopDevice {
        self.device.as_ref().expect("attached until dropped")
    }
}

impl Drop for LoopMount {
    fn drop(&mut self) {
        let ok = Command::new(tool("umount"))
            .arg(&self.dir)
            .status()
            .is_ok_and(|s| s.success());
        if !ok {
            let _ = Command::new(tool("umount"))
                .arg("-l")
                .arg(&self.dir)
                .status();
        }
        // Then the device (detached), then the directory of its own, in this order.
        drop(self.device.take());
        drop(self.own_dir.take());
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A real ext4 image, attached and mounted read-only, then undone: the device is gone from
    /// `losetup` and nothing is mounted at the directory after drop, also after a panic.
    #[test]
    fn mounts_and_cleans_up_even_on_panic() {
        let test = crate::test_name!();
        if !crate::skip::have_loop_devices(test) || !crate::skip::have_tool(test, "mkfs.ext4") {
            return;
        }
        let dir = tempfile::tempdir().unwrap();
        let img = dir.path().join("fs.img");
        fs::File::create(&img).unwrap().set_len(8 << 20).unwrap();
        let st = Command::new(tool("mkfs.ext4"))
            .args(["-q", "-F"])
            .arg(&img)
            .status()
            .unwrap();
        assert!(st.success());
        let mnt = dir.path().join("mnt");
        let attached = |dev: &str| {
            Command::new(tool("losetup"))
                .arg(dev)
                .output()
                .is_ok_and(|o| o.status.success())
        };
        let mounted = |d: &Path| {
            fs::read_to_string("/proc/self/mountinfo")
                .unwrap()
                .lines()
                .any(|l| l.split(' ').nth(4) == Some(d.to_str().unwrap()))
        };
        let m = LoopMount::new(&img, &mnt);
        let dev = m.device().as_str().to_owned();
        assert!(attached(&dev) && mounted(&mnt) && mnt.join("lost+found").is_dir());
        assert!(fs::write(mnt.join("x"), b"x").is_err(), "mounted read-only");
        drop(m);
        assert!(!attached(&dev), "{dev} still attached");
        assert!(!mounted(&mnt), "{} still mounted", mnt.display());

        let (img2, mnt2) = (img.clone(), mnt.clone());
        let dev = std::thread::spawn(move || {
            let m = LoopMount::with(&img2, &mnt2, &LoopOptions::default(), Some("ext4"));
            let dev = m.device().as_str().to_owned();
            fs::write(mnt2.join("y"), b"y").unwrap();
            std::panic::panic_any(dev);
        })
        .join()
        .unwrap_err()
        .downcast::<String>()
        .unwrap();
        assert!(!attached(&dev), "{dev} still attached after a panic");
        assert!(!mounted(&mnt), "still mounted after a panic");
    }
}
