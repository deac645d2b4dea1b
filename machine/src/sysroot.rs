//! The root every machine fact is read from: `/` on a real machine, a fixture directory in tests.

use std::path::{Path, PathBuf};

/// A directory that stands for `/`: its `sys/`, `proc/`, `dev/`, `run/udev/data/` and (fixtures
/// only) `smartctl/` are read instead of the real ones.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Sysroot {
    root: PathBuf,
}

impl Sysroot {
    /// A sysroot at `path` (`/` for the real machine).
    pub fn new(path: impl Into<PathBuf>) -> Self {
        Sysroot { root: path.into() }
    }

    /// The root directory itself.
    pub fn root(&self) -> &Path {
        &self.root
    }

    /// `rel` (an absolute machine path such as `/sys/block`, or a relative one) below the root.
    pub fn path(&self, rel: impl AsRef<Path>) -> PathBuf {
        let rel = rel.as_ref();
        self.root.join(rel.strip_prefix("/").unwrap_or(rel))
    }

    /// The contents of a small text file below the root, trimmed; `None` when it is absent or
    /// unreadable (sysfs attributes are optional on many devices).
    pub fn read_trimmed(&self, rel: impl AsRef<Path>) -> Option<String> {
        let text = std::fs::read_to_string(self.path(rel)).ok()?;
        let text = text.trim();
        (!text.is_empty()).then(|| text.to_string())
    }
}

impl Default for Sysroot {
    /// The real machine: `/`.
    fn default() -> Self {
        Sysroot::new("/")
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn joins_absolute_paths_below_the_root() {
        let s = Sysroot::new("/tmp/m");
        assert_eq!(s.path("/sys/block"), PathBuf::from("/tmp/m/sys/block"));
        assert_eq!(s.path("proc/cpuinfo"), PathBuf::from("/tmp/m/proc/cpuinfo"));
        assert_eq!(
            Sysroot::default().path("/dev/sda"),
            PathBuf::from("/dev/sda")
        );
    }
}
