//! The tree cache: each Debian-made layer's finished tree, kept under a key that hashes
//! everything that made it ([`Key`]), so a build with nothing changed reuses the tree instead of
//! running mmdebstrap again.
//!
//! An entry is a directory `<layer>-<key>/` holding the tree (`tree/`, as mmdebstrap and
//! [`super::tree`] left it: owners, modes, symlinks, hard links and xattrs untouched, because it
//! is renamed in, never copied), its dpkg state (`dpkg/`: the layers installed over it by apt
//! read it) and `entry.json` (what the key was made of, and the layer's lock
//! entry, to say why a later build could not reuse it). The tree is made in a scratch directory
//! inside the cache directory ([`TreeCache::scratch`]), so entering the cache is a rename on one
//! file system: the entry is assembled under a `.new-` name, the file system synced, the marker
//! written and synced last, and the directory renamed into place. A directory without its marker
//! is never taken. At most [`KEEP_PER_LAYER`] entries per layer name are kept: after an insert,
//! older ones (by the marker's mtime, which a reuse refreshes) are removed.

use std::collections::BTreeMap;
use std::fs;
use std::io::{self, Write as _};
use std::path::{Path, PathBuf};
use std::time::{Duration, SystemTime};

use serde::{Deserialize, Serialize};
use sha2::{Digest, Sha256};

use super::lock::{LayerLock, Lock};

/// The layout of a cached tree as [`super::tree`] finishes it. Raise it when `finish_tree` or the
/// way a tree is made changes what a tree holds, so older entries are not taken.
pub const TREE_FORMAT: u32 = 2;
/// Entries kept per layer name (the newest by the marker's mtime).
pub const KEEP_PER_LAYER: usize = 2;
/// The marker, written last: an entry without it is half-made.
const MARKER: &str = "entry.json";
/// The tree inside an entry.
const TREE: &str = "tree";
/// The tree's dpkg state beside it (layers installed over it need it; the tree's /var is empty).
const DPKG: &str = "dpkg";
/// Scratch and half-made entries older than this are removed by [`TreeCache::prune`] (a killed
/// build leaves them; a running one is never this old).
const STALE: Duration = Duration::from_secs(24 * 3600);

/// Why the tree cache failed.
#[derive(Debug, thiserror::Error)]
#[error("the tree cache: {what} {}", path.display())]
pub struct TreeCacheError {
    /// What was being done.
    pub what: &'static str,
    /// On which path.
    pub path: PathBuf,
    /// The error.
    pub source: io::Error,
}

fn io_err(what: &'static str, path: &Path) -> impl FnOnce(io::Error) -> TreeCacheError {
    let path = path.to_owned();
    move |source| TreeCacheError { what, path, source }
}

/// What a layer's tree is made of: every input of its key.
#[derive(Debug, Clone)]
pub struct KeyInputs<'a> {
    /// The layer's lock entry (packages with versions and `.deb` hashes, suites, kernel).
    pub lock: &'a LayerLock,
    /// [`crate::debian_spec::DebianSpec::fingerprint`] of its declaration.
    pub spec: &'a str,
    /// The keys of the layers below it, bottom first.
    pub below: &'a [&'a str],
    /// The manifest's `source_date_epoch`.
    pub source_date_epoch: u64,
    /// Further named inputs (files the tree gets beyond its packages); their order does not
    /// matter.
    pub extra: &'a [(&'a str, &'a [u8])],
}

/// A tree's cache key: SHA-256 over its inputs, and one digest per input to say which changed.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Key {
    hex: String,
    parts: BTreeMap<String, String>,
}

fn sha256_hex(bytes: &[u8]) -> String {
    hex::encode(Sha256::digest(bytes))
}

impl Key {
    /// The key of a tree made of `inputs`, by this ingot and [`TREE_FORMAT`].
    pub fn new(inputs: &KeyInputs<'_>) -> Self {
        Self::with_version(inputs, env!("CARGO_PKG_VERSION"))
    }

    fn with_version(inputs: &KeyInputs<'_>, ingot: &str) -> Self {
        let mut layers = BTreeMap::new();
        // The operator inputs enter as `extra` parts, by their digests: the lock entry's record
        // of them may be an older build's.
        let lock = LayerLock {
            given: Vec::new(),
            ..inputs.lock.clone()
        };
        layers.insert(lock.name.clone(), lock);
        let lock = Lock { layers }.to_toml();
        let mut parts = BTreeMap::new();
        parts.insert("lock".to_owned(), sha256_hex(lock.as_bytes()));
        parts.insert("spec".to_owned(), sha256_hex(inputs.spec.as_bytes()));
        parts.insert(
            "below".to_owned(),
            sha256_hex(inputs.below.join("\n").as_bytes()),
        );
        parts.insert(
            "sourceDateEpoch".to_owned(),
            inputs.source_date_epoch.to_string(),
        );
        parts.insert("treeFormat".to_owned(), TREE_FORMAT.to_string());
        parts.insert("ingot".to_owned(), ingot.to_owned());
        for (name, bytes) in inputs.extra {
            parts.insert(format!("extra:{name}"), sha256_hex(bytes));
        }
        // Length-prefixed name and value of each part, in the map's (sorted) order: canonical,
        // and no two lists of parts encode alike.
        let mut h = Sha256::new();
        for (name, value) in &parts {
            for s in [name, value] {
                h.update((s.len() as u64).to_le_bytes());
                h.update(s.as_bytes());
            }
        }
        Self {
            hex: hex::encode(h.finalize()),
            parts,
        }
    }

    /// The key (64 lowercase hex digits).
    pub fn hex(&self) -> &str {
        &self.hex
    }

    /// Its first 12 digits, as the build prints it.
    pub fn short(&self) -> &str {
        &self.hex[..12]
    }
}

/// What `entry.json` holds.
#[derive(Debug, Clone, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct Marker {
    /// The key.
    pub key: String,
    /// One digest (or value) per input.
    pub parts: BTreeMap<String, String>,
    /// The layer's lock entry, as stack.lock writes it.
    pub lock: String,
}

impl Marker {
    /// The lock entry the tree was made from (`None`: unreadable).
    pub fn layer_lock(&self, layer: &str) -> Option<LayerLock> {
        Lock::parse(&self.lock, Path::new(MARKER))
            .ok()?
            .layers
            .remove(layer)
    }

    /// Which inputs of `key` differ from this entry's, named as a reader knows them.
    pub fn changed(&self, key: &Key) -> Vec<String> {
        let words = [
            ("lock", "the lock entry"),
            ("spec", "the declaration"),
            ("below", "the layers below"),
            ("sourceDateEpoch", "source_date_epoch"),
            ("treeFormat", "the tree format"),
            ("ingot", "the ingot version"),
        ];
        let mut out: Vec<String> = words
            .iter()
            .filter(|(k, _)| self.parts.get(*k) != key.parts.get(*k))
            .map(|(_, w)| (*w).to_owned())
            .collect();
        // The extras by name: each that was added, removed or changed.
        let names: std::collections::BTreeSet<&String> = self
            .parts
            .keys()
            .chain(key.parts.keys())
            .filter(|k| k.starts_with("extra:"))
            .collect();
        for k in names {
            if self.parts.get(k) != key.parts.get(k) {
                let name = &k["extra:".len()..];
                out.push(match name.strip_prefix("input:") {
                    Some(input) => format!("the input {input}"),
                    None if name == "files" => "the declared files".to_owned(),
                    None => format!("the {}", name.replace('-', " ")),
                });
            }
        }
        out
    }
}

/// A tree cache directory.
#[derive(Debug, Clone)]
pub struct TreeCache {
    dir: PathBuf,
}

/// A cached tree found for a key.
#[derive(Debug, Clone)]
pub struct Hit {
    /// The tree (read it; never write into it).
    pub tree: PathBuf,
    /// Its dpkg state.
    pub dpkg: PathBuf,
}

impl TreeCache {
    /// The cache at `dir`, created if missing.
    pub fn open(dir: &Path) -> Result<Self, TreeCacheError> {
        fs::create_dir_all(dir).map_err(io_err("creating", dir))?;
        Ok(Self {
            dir: dir.to_owned(),
        })
    }

    /// Where the tree cache is when `--tree-cache` is not given: `trees` beside the `.deb`
    /// cache directory (`/var/cache/ingot/debs` → `/var/cache/ingot/trees`).
    pub fn default_dir(deb_cache: &Path) -> PathBuf {
        match deb_cache.parent() {
            Some(p) if !p.as_os_str().is_empty() => p.join("trees"),
            _ => PathBuf::from("trees"),
        }
    }

    /// The directory.
    pub fn dir(&self) -> &Path {
        &self.dir
    }

    fn entry(&self, layer: &str, key: &Key) -> PathBuf {
        self.dir.join(format!("{layer}-{}", key.hex()))
    }

    /// The complete entry for this layer and key, its marker's mtime refreshed (it was used).
    pub fn get(&self, layer: &str, key: &Key) -> Option<Hit> {
        let entry = self.entry(layer, key);
        let marker = read_marker(&entry)?;
        if marker.key != key.hex() || !entry.join(TREE).is_dir() || !entry.join(DPKG).is_dir() {
            return None;
        }
        if let Ok(f) = fs::OpenOptions::new().write(true).open(entry.join(MARKER)) {
            let _ = f.set_modified(SystemTime::now());
        }
        Some(Hit {
            tree: entry.join(TREE),
            dpkg: entry.join(DPKG),
        })
    }

    /// The newest complete entry of `layer` (to say why it could not be reused).
    pub fn newest(&self, layer: &str) -> Option<Marker> {
        let mut all = self.entries(layer);
        all.sort_by_key(|e| std::cmp::Reverse(e.1));
        all.into_iter().find_map(|(p, _)| read_marker(&p))
    }

    /// A scratch directory in the cache directory for making `layer`'s tree (removed when
    /// dropped), so [`Self::insert`] renames on one file system.
    pub fn scratch(&self, layer: &str) -> Result<tempfile::TempDir, TreeCacheError> {
        tempfile::Builder::new()
            .prefix(&format!(".work-{layer}-"))
            .tempdir_in(&self.dir)
            .map_err(io_err("creating a scratch directory in", &self.dir))
    }

    /// Moves the finished `tree` and its `dpkg` state (in this cache's file system: made in a
    /// [`Self::scratch`]) into the cache under `key`, replacing an entry of that key, and prunes
    /// the layer's older entries. Returns where they now are.
    pub fn insert(
        &self,
        layer: &str,
        key: &Key,
        lock: &LayerLock,
        tree: &Path,
        dpkg: &Path,
    ) -> Result<Hit, TreeCacheError> {
        let tmp = tempfile::Builder::new()
            .prefix(&format!(".new-{layer}-"))
            .tempdir_in(&self.dir)
            .map_err(io_err("creating a directory in", &self.dir))?;
        let moved = tmp.path().join(TREE);
        fs::rename(tree, &moved).map_err(io_err("moving the tree into", tmp.path()))?;
        let dpkg_to = tmp.path().join(DPKG);
        fs::rename(dpkg, &dpkg_to).map_err(io_err("moving dpkg's state into", tmp.path()))?;
        // What dpkg wrote without fsync reaches the disk before the marker says it is there.
        syncfs(&moved)?;
        let mut layers = BTreeMap::new();
        layers.insert(layer.to_owned(), lock.clone());
        let marker = Marker {
            key: key.hex().to_owned(),
            parts: key.parts.clone(),
            lock: Lock { layers }.to_toml(),
        };
        let marker_path = tmp.path().join(MARKER);
        let mut f = fs::File::create_new(&marker_path).map_err(io_err("creating", &marker_path))?;
        f.write_all(&serde_json::to_vec_pretty(&marker).expect("a marker serializes"))
            .and_then(|()| f.sync_all())
            .map_err(io_err("writing", &marker_path))?;
        sync_dir(tmp.path())?;
        let entry = self.entry(layer, key);
        // A directory cannot be renamed over a non-empty one: the old entry (a --rebuild's) is
        // moved aside first. A reader in between finds no entry and builds.
        let old = if entry.exists() {
            let aside = tempfile::Builder::new()
                .prefix(&format!(".old-{layer}-"))
                .tempdir_in(&self.dir)
                .map_err(io_err("creating a directory in", &self.dir))?;
            let to = aside.path().join("entry");
            fs::rename(&entry, &to).map_err(io_err("moving aside", &entry))?;
            Some(aside)
        } else {
            None
        };
        if let Err(e) = fs::rename(tmp.path(), &entry) {
            // Another build put the same key in between: its tree is as good as ours.
            if let Some(hit) = self.get(layer, key) {
                return Ok(hit);
            }
            return Err(io_err("renaming into place", &entry)(e));
        }
        let _ = tmp.keep();
        sync_dir(&self.dir)?;
        drop(old);
        self.prune(layer, &entry);
        Ok(Hit {
            tree: entry.join(TREE),
            dpkg: entry.join(DPKG),
        })
    }

    /// `(entry, marker mtime)` of every complete entry of `layer`.
    fn entries(&self, layer: &str) -> Vec<(PathBuf, SystemTime)> {
        let prefix = format!("{layer}-");
        let Ok(rd) = fs::read_dir(&self.dir) else {
            return Vec::new();
        };
        rd.filter_map(Result::ok)
            .filter_map(|e| {
                let name = e.file_name().to_string_lossy().into_owned();
                let hex = name.strip_prefix(&prefix)?;
                if !super::cache::is_sha256_hex(hex) {
                    return None;
                }
                let mtime = fs::metadata(e.path().join(MARKER)).ok()?.modified().ok()?;
                Some((e.path(), mtime))
            })
            .collect()
    }

    /// Keeps the newest [`KEEP_PER_LAYER`] entries of `layer` (always `keep`), and removes
    /// half-made entries and scratch directories a killed build left more than a day ago.
    /// Failures only leave more on disk.
    pub fn prune(&self, layer: &str, keep: &Path) {
        let mut all = self.entries(layer);
        all.sort_by_key(|e| std::cmp::Reverse(e.1));
        let mut kept = 1;
        for (path, _) in all {
            if path == keep {
                continue;
            }
            if kept < KEEP_PER_LAYER {
                kept += 1;
                continue;
            }
            tracing::info!("tree cache: removing {}", path.display());
            let _ = fs::remove_dir_all(&path);
        }
        let Ok(rd) = fs::read_dir(&self.dir) else {
            return;
        };
        let now = SystemTime::now();
        for e in rd.filter_map(Result::ok) {
            let name = e.file_name().to_string_lossy().into_owned();
            let leftover = [".new-", ".old-", ".work-"]
                .iter()
                .any(|p| name.starts_with(p))
                || (name.starts_with(&format!("{layer}-")) && read_marker(&e.path()).is_none());
            let old = e
                .metadata()
                .and_then(|m| m.modified())
                .is_ok_and(|t| now.duration_since(t).unwrap_or_default() > STALE);
            if leftover && old {
                let _ = fs::remove_dir_all(e.path());
            }
        }
    }
}

fn read_marker(entry: &Path) -> Option<Marker> {
    serde_json::from_slice(&fs::read(entry.join(MARKER)).ok()?).ok()
}

/// Flushes the file system holding `path` (`sync --file-system`, syncfs(2)).
fn syncfs(path: &Path) -> Result<(), TreeCacheError> {
    let status = std::process::Command::new("sync")
        .arg("--file-system")
        .arg(path)
        .status()
        .map_err(io_err("running sync --file-system on", path))?;
    if status.success() {
        Ok(())
    } else {
        Err(io_err("syncing the file system of", path)(
            io::Error::other(format!("sync --file-system: {status}")),
        ))
    }
}

fn sync_dir(dir: &Path) -> Result<(), TreeCacheError> {
    fs::File::open(dir)
        .and_then(|f| f.sync_all())
        .map_err(io_err("syncing", dir))
}

#[cfg(test)]
mod tests {
    use super::super::lock::LockedPackage;
    use super::*;

    fn lock() -> LayerLock {
        super::super::lock::sample()
    }

    #[test]
    fn every_input_changes_the_key_and_the_order_of_extras_does_not() {
        let l = lock();
        let below = ["a".repeat(64)];
        let below: Vec<&str> = below.iter().map(String::as_str).collect();
        let extra: &[(&str, &[u8])] = &[("hook", b"x"), ("unit", b"y")];
        let base = KeyInputs {
            lock: &l,
            spec: "sha256:spec",
            below: &below,
            source_date_epoch: 1,
            extra,
        };
        let k = Key::new(&base);
        assert_eq!(k, Key::new(&base.clone()), "the key is a function");
        assert_eq!(k.hex().len(), 64);
        assert_eq!(k.short(), &k.hex()[..12]);

        let mut l2 = lock();
        l2.packages[0].sha256 = "2".repeat(64);
        let mut l3 = lock();
        l3.packages[0].version = "2.36-9+deb12u9".into();
        let mut l4 = lock();
        l4.kernel = Some("6.1.0-28-amd64".into());
        let swapped: &[(&str, &[u8])] = &[("unit", b"y"), ("hook", b"x")];
        let changed_extra: &[(&str, &[u8])] = &[("hook", b"x"), ("unit", b"z")];
        let renamed_extra: &[(&str, &[u8])] = &[("hook", b"x"), ("units", b"y")];
        let more_below = [below[0], "b"];
        let variants = [
            KeyInputs {
                lock: &l2,
                ..base.clone()
            },
            KeyInputs {
                lock: &l3,
                ..base.clone()
            },
            KeyInputs {
                lock: &l4,
                ..base.clone()
            },
            KeyInputs {
                spec: "sha256:other",
                ..base.clone()
            },
            KeyInputs {
                below: &[],
                ..base.clone()
            },
            KeyInputs {
                below: &more_below,
                ..base.clone()
            },
            KeyInputs {
                source_date_epoch: 2,
                ..base.clone()
            },
            KeyInputs {
                extra: changed_extra,
                ..base.clone()
            },
            KeyInputs {
                extra: renamed_extra,
                ..base.clone()
            },
            KeyInputs {
                extra: &[],
                ..base.clone()
            },
        ];
        let mut seen = vec![k.hex().to_owned()];
        for v in &variants {
            let kv = Key::new(v);
            assert!(!seen.contains(&kv.hex().to_owned()), "{v:?}");
            seen.push(kv.hex().to_owned());
        }
        assert_ne!(Key::with_version(&base, "0.0.0-other"), k, "ingot version");
        // The lock's package order and the extras' order are not inputs.
        let mut two = lock();
        two.packages.push(LockedPackage {
            name: "zlib1g".into(),
            ..two.packages[0].clone()
        });
        let mut two_rev = two.clone();
        two_rev.packages.reverse();
        assert_eq!(
            Key::new(&KeyInputs {
                lock: &two,
                ..base.clone()
            }),
            Key::new(&KeyInputs {
                lock: &two_rev,
                ..base.clone()
            })
        );
        assert_eq!(
            Key::new(&KeyInputs {
                extra: swapped,
                ..base.clone()
            }),
            k
        );
    }

    #[test]
    fn the_locks_record_of_the_inputs_is_not_in_the_key() {
        // The operator inputs enter as extras, by the digests given now.
        let plain = lock();
        let mut recorded = lock();
        recorded.given.push(super::super::lock::LockedInput {
            name: "kubernetes".into(),
            digest: format!("sha256:{}", "3".repeat(64)),
        });
        let key = |l| {
            Key::new(&KeyInputs {
                lock: l,
                spec: "sha256:spec",
                below: &[],
                source_date_epoch: 1,
                extra: &[("input:kubernetes", b"sha256:4444")],
            })
        };
        assert_eq!(key(&recorded), key(&plain));
    }

    #[test]
    fn a_marker_names_the_inputs_that_changed() {
        let l = lock();
        let base = KeyInputs {
            lock: &l,
            spec: "sha256:spec",
            below: &[],
            source_date_epoch: 1,
            extra: &[("hook", b"x")],
        };
        let k = Key::new(&base);
        let marker = Marker {
            key: k.hex().into(),
            parts: k.parts.clone(),
            lock: String::new(),
        };
        assert!(marker.changed(&k).is_empty());
        let spec = Key::new(&KeyInputs {
            spec: "sha256:other",
            ..base.clone()
        });
        assert_eq!(marker.changed(&spec), ["the declaration"]);
        let both = Key::new(&KeyInputs {
            source_date_epoch: 2,
            extra: &[("hook", b"y")],
            ..base.clone()
        });
        assert_eq!(marker.changed(&both), ["source_date_epoch", "the hook"]);
        assert_eq!(
            marker.changed(&Key::with_version(&base, "0.0.0-other")),
            ["the ingot version"]
        );
    }

    fn key(n: u64) -> Key {
        let l = lock();
        Key::new(&KeyInputs {
            lock: &l,
            spec: "s",
            below: &[],
            source_date_epoch: n,
            extra: &[],
        })
    }

    /// A finished tree in a scratch directory of `cache`, with a file, a symlink and a hard link.
    fn made(cache: &TreeCache, text: &str) -> (tempfile::TempDir, PathBuf) {
        let work = cache.scratch("base").unwrap();
        let tree = work.path().join("tree");
        fs::create_dir_all(tree.join("etc")).unwrap();
        fs::write(tree.join("etc/os-release"), text).unwrap();
        std::os::unix::fs::symlink("os-release", tree.join("etc/link")).unwrap();
        fs::hard_link(tree.join("etc/os-release"), tree.join("etc/hard")).unwrap();
        fs::create_dir_all(work.path().join("dpkg/info")).unwrap();
        fs::write(work.path().join("dpkg/status"), text).unwrap();
        (work, tree)
    }

    #[test]
    fn an_inserted_tree_is_renamed_in_whole_and_found_by_its_key() {
        let dir = tempfile::tempdir().unwrap();
        let cache = TreeCache::open(&dir.path().join("trees")).unwrap();
        let k = key(1);
        assert!(cache.get("base", &k).is_none());
        let (work, tree) = made(&cache, "one");
        let ino = std::os::unix::fs::MetadataExt::ino(&fs::metadata(&tree).unwrap());
        let at = cache
            .insert("base", &k, &lock(), &tree, &tree.with_file_name("dpkg"))
            .unwrap()
            .tree;
        drop(work);
        assert!(!tree.exists());
        let hit = cache.get("base", &k).unwrap();
        assert_eq!(hit.tree, at);
        assert_eq!(fs::read_to_string(hit.dpkg.join("status")).unwrap(), "one");
        use std::os::unix::fs::MetadataExt;
        assert_eq!(fs::metadata(&at).unwrap().ino(), ino, "renamed, not copied");
        let (a, b) = (
            fs::metadata(at.join("etc/os-release")).unwrap(),
            fs::metadata(at.join("etc/hard")).unwrap(),
        );
        assert_eq!((a.ino(), a.nlink()), (b.ino(), 2));
        assert_eq!(
            fs::read_link(at.join("etc/link")).unwrap(),
            Path::new("os-release")
        );
        assert!(cache.get("base", &key(2)).is_none());
        assert!(cache.get("other", &k).is_none());
        let m = cache.newest("base").unwrap();
        assert_eq!(m.key, k.hex());
        assert_eq!(m.layer_lock("base").unwrap(), lock());
        // Only the entry is left: no .new-, .old- or .work- directory.
        let names: Vec<_> = fs::read_dir(cache.dir())
            .unwrap()
            .map(|e| e.unwrap().file_name().into_string().unwrap())
            .collect();
        assert_eq!(names, [format!("base-{}", k.hex())]);

        // The same key again (--rebuild): the new tree replaces the old.
        let (_work, tree) = made(&cache, "two");
        let at2 = cache
            .insert("base", &k, &lock(), &tree, &tree.with_file_name("dpkg"))
            .unwrap();
        assert_eq!(at2.tree, at);
        assert_eq!(
            fs::read_to_string(at.join("etc/os-release")).unwrap(),
            "two"
        );
        let entries = fs::read_dir(cache.dir())
            .unwrap()
            .filter(|e| {
                !e.as_ref()
                    .unwrap()
                    .file_name()
                    .to_string_lossy()
                    .starts_with('.')
            })
            .count();
        assert_eq!(entries, 1, "the replaced entry is gone");
    }

    #[test]
    fn a_half_made_entry_is_never_taken() {
        let dir = tempfile::tempdir().unwrap();
        let cache = TreeCache::open(dir.path()).unwrap();
        let k = key(1);
        // Renamed into place but its marker never written (or written for another key).
        let entry = cache.entry("base", &k);
        fs::create_dir_all(entry.join("tree/etc")).unwrap();
        assert!(cache.get("base", &k).is_none());
        // A marker but no dpkg state (an entry of tree format 1): not taken either.
        let marker = Marker {
            key: k.hex().into(),
            parts: BTreeMap::new(),
            lock: String::new(),
        };
        fs::write(entry.join(MARKER), serde_json::to_vec(&marker).unwrap()).unwrap();
        assert!(cache.get("base", &k).is_none());
        fs::write(entry.join(MARKER), b"{\"key\": \"trunc").unwrap();
        assert!(cache.get("base", &k).is_none());
        let other = Marker {
            key: key(2).hex().into(),
            parts: BTreeMap::new(),
            lock: String::new(),
        };
        fs::write(entry.join(MARKER), serde_json::to_vec(&other).unwrap()).unwrap();
        assert!(cache.get("base", &k).is_none());
        assert!(cache.newest("base").is_some_and(|m| m.key != k.hex()));
        // An insert of that key replaces it.
        let (_w, tree) = made(&cache, "ok");
        cache
            .insert("base", &k, &lock(), &tree, &tree.with_file_name("dpkg"))
            .unwrap();
        assert!(cache.get("base", &k).is_some());
    }

    #[test]
    fn two_entries_per_layer_are_kept_the_newest_by_use() {
        let dir = tempfile::tempdir().unwrap();
        let cache = TreeCache::open(dir.path()).unwrap();
        let mut works = Vec::new();
        let age = |k: &Key, secs: u64| {
            let f = fs::OpenOptions::new()
                .write(true)
                .open(cache.entry("base", k).join(MARKER))
                .unwrap();
            f.set_modified(SystemTime::now() - Duration::from_secs(secs))
                .unwrap();
        };
        for n in 1..=2 {
            let (w, tree) = made(&cache, "x");
            cache
                .insert(
                    "base",
                    &key(n),
                    &lock(),
                    &tree,
                    &tree.with_file_name("dpkg"),
                )
                .unwrap();
            works.push(w);
        }
        age(&key(1), 300);
        age(&key(2), 200);
        // Key 1 is used again: it is now the newer one.
        assert!(cache.get("base", &key(1)).is_some());
        // Another layer's entries are not counted or pruned.
        let (w, tree) = made(&cache, "x");
        cache
            .insert(
                "kata",
                &key(9),
                &lock(),
                &tree,
                &tree.with_file_name("dpkg"),
            )
            .unwrap();
        works.push(w);
        let (w, tree) = made(&cache, "x");
        cache
            .insert(
                "base",
                &key(3),
                &lock(),
                &tree,
                &tree.with_file_name("dpkg"),
            )
            .unwrap();
        works.push(w);
        assert!(cache.get("base", &key(3)).is_some());
        assert!(cache.get("base", &key(1)).is_some());
        assert!(
            cache.get("base", &key(2)).is_none(),
            "the least recently used entry is pruned"
        );
        assert!(!cache.entry("base", &key(2)).exists());
        assert!(cache.get("kata", &key(9)).is_some());
    }

    #[test]
    fn the_default_is_beside_the_deb_cache() {
        assert_eq!(
            TreeCache::default_dir(Path::new("/var/cache/ingot/debs")),
            Path::new("/var/cache/ingot/trees")
        );
        assert_eq!(
            TreeCache::default_dir(Path::new("cache")),
            Path::new("trees")
        );
    }
}
