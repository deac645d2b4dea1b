//! Layers made from Debian packages: the manifest's `source.debian` ([`spec`]), the
//! content-addressed `.deb` cache ([`cache`]), `stack.lock` ([`lock`]) and the tree itself, made
//! by mmdebstrap and apt ([`tree`]). ingot only declares, pins and caches: mmdebstrap and apt
//! resolve, download, verify the archive's signatures and install.

pub mod cache;
pub mod deb;
pub mod integration;
pub mod lock;
pub mod tree;

use std::collections::BTreeSet;
use std::path::{Path, PathBuf};
use std::time::Instant;

use crate::manifest::{LayerSource, Manifest};
use cache::{CacheError, DebCache};
use lock::{Change, Lock, LockError};
use tree::{Resolve, TreeError};

/// How `ingot build` treats the Debian-made layers.
#[derive(Debug, Clone, Default)]
pub struct Options {
    /// The `.deb` cache directory ([`DebCache::default_dir`] when `None`).
    pub cache: Option<PathBuf>,
    /// `--locked`: exactly the lock, or fail.
    pub locked: bool,
    /// `--update [PACKAGE...]`: resolve again (all packages, or only these).
    pub update: Option<BTreeSet<String>>,
}

/// The Debian trees made for one build.
#[derive(Debug)]
pub struct Prepared {
    /// The manifest with every `debian` source replaced by its made tree (a `dir` source).
    pub manifest: Manifest,
    /// The lock that makes these trees again.
    pub lock: Lock,
    /// The lock as it was (`None`: there was none).
    pub old_lock: Option<Lock>,
    /// Where the lock goes (beside the manifest).
    pub lock_path: PathBuf,
    /// Per layer: what moved since the old lock.
    pub changes: Vec<(String, Vec<Change>)>,
    /// Per layer: one line on how its tree was made.
    pub report: Vec<String>,
    /// Holds the trees until the build has read them.
    _work: tempfile::TempDir,
}

impl Prepared {
    /// Whether the lock on disk must be (re)written.
    pub fn lock_changed(&self) -> bool {
        self.old_lock.as_ref() != Some(&self.lock)
    }
}

/// Why the Debian trees could not be made.
#[derive(Debug, thiserror::Error)]
pub enum PrepareError {
    /// The lock file is refused.
    #[error(transparent)]
    Lock(#[from] LockError),
    /// The cache could not be opened.
    #[error(transparent)]
    Cache(#[from] CacheError),
    /// A tree could not be made.
    #[error(transparent)]
    Tree(#[from] TreeError),
    /// `--update` named a package no layer has.
    #[error("--update {0}: stack.lock has no package `{0}` in any layer")]
    UnknownPackage(String),
    /// `--locked` without a lock file.
    #[error("--locked: there is no {} (build once without --locked to write it)", .0.display())]
    NoLock(PathBuf),
    /// The scratch directory could not be made.
    #[error("creating a directory for the Debian trees in {}", path.display())]
    Work {
        /// Where.
        path: PathBuf,
        /// Why.
        source: std::io::Error,
    },
}

/// How a layer's versions are chosen, given the options and its lock entry when that was made
/// for the layer's current declaration.
fn choose(opts: &Options, current: Option<&lock::LayerLock>) -> Resolve {
    match (&opts.update, opts.locked, current) {
        (_, true, _) => Resolve::Locked,
        (Some(names), _, Some(cur)) if !names.is_empty() => {
            let mine: BTreeSet<String> = names
                .iter()
                .filter(|n| cur.packages.iter().any(|p| &p.name == *n))
                .cloned()
                .collect();
            // A layer whose lock has none of the named packages stays as locked.
            if mine.is_empty() {
                Resolve::Locked
            } else {
                Resolve::Update(mine)
            }
        }
        (Some(_), _, _) => Resolve::Update(BTreeSet::new()),
        // A lock made for this declaration is used, as cargo uses Cargo.lock.
        (None, false, Some(_)) => Resolve::Locked,
        (None, false, None) => Resolve::Fresh,
    }
}

/// Makes the tree of every layer whose source is `debian` (in `work_parent`, removed when the
/// result is dropped). `Ok(None)`: the manifest has none.
pub fn prepare(
    manifest: &Manifest,
    opts: &Options,
    work_parent: &Path,
) -> Result<Option<Prepared>, PrepareError> {
    if !manifest
        .layers
        .iter()
        .any(|l| matches!(l.source, LayerSource::Debian(_)))
    {
        return Ok(None);
    }
    let lock_path = Lock::path_for(&manifest.path);
    let old_lock = Lock::load(&lock_path)?;
    if opts.locked && old_lock.is_none() {
        return Err(PrepareError::NoLock(lock_path));
    }
    if let (Some(names), Some(old)) = (&opts.update, &old_lock) {
        if let Some(n) = names.iter().find(|n| {
            !old.layers
                .values()
                .any(|l| l.packages.iter().any(|p| &p.name == *n))
        }) {
            return Err(PrepareError::UnknownPackage(n.clone()));
        }
    }
    let cache = DebCache::open(&opts.cache.clone().unwrap_or_else(DebCache::default_dir))?;
    let work = tempfile::Builder::new()
        .prefix(".ingot-debian-")
        .tempdir_in(work_parent)
        .map_err(|source| PrepareError::Work {
            path: work_parent.to_owned(),
            source,
        })?;
    let mut out = manifest.clone();
    let mut lock = Lock::default();
    let (mut changes, mut report) = (Vec::new(), Vec::new());
    for layer in &mut out.layers {
        let LayerSource::Debian(spec) = &layer.source else {
            continue;
        };
        let old = old_lock.as_ref().and_then(|l| l.layers.get(&layer.name));
        let current = old.filter(|l| l.inputs == spec.fingerprint());
        let resolve = choose(opts, current);
        let started = Instant::now();
        let job = tree::Job {
            layer: &layer.name,
            spec,
            source_date_epoch: manifest.source_date_epoch,
            cache: &cache,
            lock: old,
            resolve: resolve.clone(),
            work: &work.path().join(&layer.name),
        };
        let made = tree::make(&job)?;
        report.push(format!(
            "layer {}: {} packages ({}; {} .deb from the cache, {} downloaded) by mmdebstrap in {:.1?}",
            layer.name,
            made.lock.packages.len(),
            match resolve {
                Resolve::Locked => "locked",
                Resolve::Fresh => "resolved",
                Resolve::Update(_) => "updated",
            },
            made.from_cache,
            made.downloaded,
            started.elapsed()
        ));
        if let Some(o) = old {
            let moved = lock::diff(o, &made.lock);
            if !moved.is_empty() {
                changes.push((layer.name.clone(), moved));
            }
        }
        layer.source = LayerSource::Dir(made.tree);
        lock.layers.insert(layer.name.clone(), made.lock);
    }
    Ok(Some(Prepared {
        manifest: out,
        lock,
        old_lock,
        lock_path,
        changes,
        report,
        _work: work,
    }))
}

#[cfg(test)]
mod tests {
    use super::*;
    use lock::{LayerLock, LockedPackage};

    #[test]
    fn versions_are_chosen_as_cargo_chooses_them() {
        let cur = LayerLock {
            name: "base".into(),
            inputs: format!("sha256:{}", "0".repeat(64)),
            kernel: None,
            suites: Vec::new(),
            packages: vec![LockedPackage {
                name: "libc6".into(),
                architecture: "amd64".into(),
                version: "2.36-9+deb12u8".into(),
                sha256: "1".repeat(64),
                priority: None,
            }],
        };
        let opts = |locked, update: Option<&[&str]>| Options {
            cache: None,
            locked,
            update: update.map(|u| u.iter().map(|s| (*s).to_owned()).collect()),
        };
        let set = |names: &[&str]| names.iter().map(|s| (*s).to_owned()).collect();
        assert_eq!(choose(&opts(false, None), None), Resolve::Fresh);
        assert_eq!(choose(&opts(false, None), Some(&cur)), Resolve::Locked);
        assert_eq!(
            choose(&opts(true, None), None),
            Resolve::Locked,
            "make() then refuses it"
        );
        assert_eq!(
            choose(&opts(false, Some(&[])), Some(&cur)),
            Resolve::Update(set(&[]))
        );
        assert_eq!(
            choose(&opts(false, Some(&["libc6", "zlib1g"])), Some(&cur)),
            Resolve::Update(set(&["libc6"]))
        );
        assert_eq!(
            choose(&opts(false, Some(&["zlib1g"])), Some(&cur)),
            Resolve::Locked
        );
        assert_eq!(
            choose(&opts(false, Some(&["libc6"])), None),
            Resolve::Update(set(&[]))
        );
    }
}
