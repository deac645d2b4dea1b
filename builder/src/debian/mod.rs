//! Layers made from Debian packages: the manifest's `source.debian` ([`spec`]), the
//! content-addressed `.deb` cache ([`cache`]), `stack.lock` ([`lock`]) and the tree itself, made
//! by mmdebstrap and apt ([`tree`]), kept in the tree cache ([`tree_cache`]) so an unchanged
//! layer is not made again. ingot only declares, pins and caches: mmdebstrap and apt resolve,
//! download, verify the archive's signatures and install.

pub mod cache;
pub mod deb;
pub mod dkms;
pub mod inputs;
pub mod integration;
pub mod lock;
pub mod over;
pub mod overlay;
pub mod tree;
pub mod tree_cache;
pub mod upper;

use std::collections::{BTreeMap, BTreeSet};
use std::path::PathBuf;
use std::time::{Duration, Instant};

use indicatif::{ProgressBar, ProgressDrawTarget, ProgressStyle};

use crate::manifest::{LayerSource, Manifest};
use cache::{CacheError, DebCache};
use lock::{Change, LayerLock, Lock, LockError};
use tree::{Resolve, TreeError};
use tree_cache::{Key, KeyInputs, TreeCache, TreeCacheError};

/// How `ingot build` treats the Debian-made layers.
#[derive(Debug, Clone, Default)]
pub struct Options {
    /// The `.deb` cache directory ([`DebCache::default_dir`] when `None`).
    pub cache: Option<PathBuf>,
    /// `--locked`: exactly the lock, or fail.
    pub locked: bool,
    /// `--update [PACKAGE...]`: resolve again (all packages, or only these).
    pub update: Option<BTreeSet<String>>,
    /// The tree cache directory ([`TreeCache::default_dir`] of the `.deb` cache when `None`).
    pub tree_cache: Option<PathBuf>,
    /// `--rebuild`: make every tree again (the new one replaces the cached one).
    pub rebuild: bool,
    /// A spinner line per phase on stderr (indicatif hides it when stderr is no terminal).
    pub progress: bool,
    /// Each layer's phases as `--json` events.
    pub events: crate::events::Events,
}

/// How one layer's tree was had.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct TreeOutcome {
    /// The layer.
    pub layer: String,
    /// Taken from the tree cache (no mmdebstrap run).
    pub reused: bool,
    /// Why it was reused or built.
    pub reason: String,
    /// Its tree cache key.
    pub key: String,
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
    /// Per layer: one line on how its tree was had.
    pub report: Vec<String>,
    /// Per layer: reused or built, and why.
    pub trees: Vec<TreeOutcome>,
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
    /// The tree cache failed.
    #[error(transparent)]
    TreeCache(#[from] TreeCacheError),
    /// `source.debian.over` names no Debian layer made before this one.
    #[error("layer `{0}`: source.debian.over = \"{1}\" is not a Debian layer below it")]
    Over(String, String),
    /// `--locked`, and an operator input is not the one the lock names.
    #[error(
        "--locked: layer `{layer}`: input `{input}` is {}, stack.lock has {} (build without \
         --locked to take it into the lock)",
        .given.as_deref().unwrap_or("not given"),
        .locked.as_deref().unwrap_or("none")
    )]
    InputNotLocked {
        /// The layer.
        layer: String,
        /// The input.
        input: String,
        /// Its digest as given (`None`: not given).
        given: Option<String>,
        /// Its digest in the lock (`None`: the lock has none).
        locked: Option<String>,
    },
}

/// Under `--locked`: the operator inputs given for `layer` must be the ones its lock entry
/// names, by digest, as its packages must be.
fn check_given_locked(
    layer: &str,
    locked: &LayerLock,
    given: &[lock::LockedInput],
) -> Result<(), PrepareError> {
    match lock::diff_given(&locked.given, given).into_iter().next() {
        None => Ok(()),
        Some(c) => Err(PrepareError::InputNotLocked {
            layer: layer.to_owned(),
            input: c.name,
            given: c.new,
            locked: c.old,
        }),
    }
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

/// A spinner line per phase of one layer's tree, each left showing how long it took.
struct Phases {
    layer: String,
    draw: bool,
    current: std::cell::RefCell<Option<ProgressBar>>,
    log: crate::events::PhaseLog,
}

impl Phases {
    fn new(layer: &str, draw: bool, events: &crate::events::Events) -> Self {
        Self {
            layer: layer.to_owned(),
            draw,
            current: std::cell::RefCell::new(None),
            log: crate::events::PhaseLog::new(events, layer),
        }
    }

    fn start(&self, what: &str) {
        self.done();
        self.log.start(what);
        let style = ProgressStyle::with_template("{spinner} layer {prefix}: {msg} [{elapsed}]")
            .expect("a valid template")
            .tick_strings(&["⠋", "⠙", "⠹", "⠸", "⠼", "⠴", "⠦", "⠧", "⠇", "⠏", "✓"]);
        let target = if self.draw {
            ProgressDrawTarget::stderr()
        } else {
            ProgressDrawTarget::hidden()
        };
        // Styled and named before it is first drawn.
        let bar = ProgressBar::with_draw_target(None, target)
            .with_style(style)
            .with_prefix(self.layer.clone())
            .with_message(what.to_owned());
        bar.enable_steady_tick(Duration::from_millis(120));
        *self.current.borrow_mut() = Some(bar);
    }

    fn done(&self) {
        if let Some(bar) = self.current.borrow_mut().take() {
            bar.finish();
        }
        self.log.done();
    }
}

impl Drop for Phases {
    fn drop(&mut self) {
        self.done();
    }
}

/// Why a layer that was not reused is built (before it is: `--update`'s moves are added after).
fn why_built(
    opts: &Options,
    layer: &str,
    old: Option<&LayerLock>,
    current: Option<&LayerLock>,
    trees: &TreeCache,
    key: Option<&Key>,
) -> String {
    if opts.rebuild {
        return "--rebuild".into();
    }
    if opts.update.is_some() && current.is_some() && key.is_none() {
        return "--update".into();
    }
    let (Some(cur), Some(key)) = (current, key) else {
        return if old.is_some() {
            "the declaration changed since stack.lock (resolved again)".into()
        } else {
            "no lock entry (resolved against the archive)".into()
        };
    };
    let Some(cached) = trees.newest(layer) else {
        return "no cached tree for this lock entry".into();
    };
    let short = &cached.key[..12.min(cached.key.len())];
    let changed = cached.changed(key);
    if changed.iter().any(|c| c == "the lock entry") {
        if let Some(prev) = cached.layer_lock(layer) {
            let n = lock::diff(&prev, cur)
                .iter()
                .filter(|c| c.is_package())
                .count();
            if n > 0 {
                return format!("the lock moved ({n} packages) since the cached tree {short}");
            }
        }
    }
    if changed.is_empty() {
        return "no cached tree for this lock entry".into();
    }
    format!(
        "no cached tree for this lock entry: {} changed since the cached tree {short}",
        changed.join(", ")
    )
}

/// What every layer of one [`prepare`] shares.
struct Caches<'a> {
    opts: &'a Options,
    debs: DebCache,
    trees: TreeCache,
    source_date_epoch: u64,
}

/// One layer's tree, reused or made.
struct LayerTree {
    outcome: TreeOutcome,
    report: String,
    tree: PathBuf,
    dpkg: PathBuf,
    lock: LayerLock,
    moved: Vec<Change>,
}

/// The cached tree of `current` under `key`, unless `--rebuild`.
fn reuse(
    c: &Caches<'_>,
    name: &str,
    current: &LayerLock,
    given: &[lock::LockedInput],
    key: &Key,
) -> Option<LayerTree> {
    if c.opts.rebuild {
        return None;
    }
    let hit = c.trees.get(name, key)?;
    let reason = format!(
        "tree cache {}: same lock entry, inputs and ingot version",
        key.short()
    );
    // The key holds the inputs' digests: these are the ones the cached tree was made with.
    let lock = LayerLock {
        given: given.to_vec(),
        ..current.clone()
    };
    Some(LayerTree {
        report: format!("layer {name}: reused ({reason})"),
        outcome: TreeOutcome {
            layer: name.to_owned(),
            reused: true,
            reason,
            key: key.hex().to_owned(),
        },
        tree: hit.tree,
        dpkg: hit.dpkg,
        lock,
        moved: Vec::new(),
    })
}

/// What makes a tree beyond its lock entry and declaration, for the tree cache's key: the boot
/// integration compiled into this binary (when the layer asks for it) and each operator input
/// given for the layer (by its digest). The lock's fingerprint leaves them out on purpose: new
/// operator files do not make the locked packages stale, but they do make another tree.
fn extra_inputs(spec: &crate::debian_spec::DebianSpec) -> Vec<(String, Vec<u8>)> {
    let mut extra = Vec::new();
    if spec.boot_integration {
        extra.push((
            "boot-integration".to_owned(),
            integration::digest().to_vec(),
        ));
    }
    for (name, given) in &spec.given_inputs {
        extra.push((format!("input:{name}"), given.digest.clone().into_bytes()));
    }
    if !spec.files.is_empty() {
        let json = serde_json::to_vec(&spec.files).expect("plain data serializes");
        extra.push(("files".to_owned(), json));
    }
    extra
}

/// `--update` on a layer whose locked packages all are still the archive's candidates changes
/// nothing: it stays locked (its cached tree is reused), as `cargo update` leaves a lock alone
/// when nothing is newer. Returns how to resolve and a note for the report.
fn nothing_newer(
    c: &Caches<'_>,
    name: &str,
    spec: &crate::debian_spec::DebianSpec,
    current: Option<&LayerLock>,
    lower_kernel: Option<&str>,
    mut resolve: Resolve,
) -> Result<(Resolve, String), PrepareError> {
    let kernel_moved =
        spec.dkms.is_some() && current.is_some_and(|cur| cur.kernel.as_deref() != lower_kernel);
    if let (true, true, Resolve::Locked, Some(d)) =
        (kernel_moved, c.opts.update.is_some(), &resolve, &spec.dkms)
    {
        // `--update` moved the base's kernel: the modules are built again for it.
        resolve = Resolve::Update(BTreeSet::from([d.clone()]));
    }
    let (Resolve::Update(names), Some(cur)) = (&resolve, current) else {
        return Ok((resolve, String::new()));
    };
    let scratch = c.trees.scratch(name)?;
    let operators = match spec.given_inputs.get(inputs::NVIDIA_TOOLKIT_INPUT) {
        Some(g) => inputs::deb_packages(&g.path).map_err(TreeError::from)?,
        None => BTreeSet::new(),
    };
    let mut moved = tree::moved_in_archive(spec, cur, names, &operators, scratch.path())?;
    // Modules built for the base's old kernel are built again for its new one.
    if kernel_moved {
        moved.push(format!("kernel {:?} → {lower_kernel:?}", cur.kernel));
    }
    if moved.is_empty() {
        let n = (cur.packages.iter().chain(&cur.dkms))
            .filter(|p| !operators.contains(&p.name))
            .count();
        return Ok((
            Resolve::Locked,
            format!("; --update: the archive has nothing newer for its {n} locked packages"),
        ));
    }
    tracing::info!("layer {name}: --update: {}", moved.join(", "));
    Ok((resolve, String::new()))
}

/// Takes the layer's tree from the tree cache, or makes it and puts it there. `below`: the
/// keys of the Debian layers its tree depends on; `over`: the layer apt installs it over.
fn layer_tree(
    c: &Caches<'_>,
    name: &str,
    spec: &crate::debian_spec::DebianSpec,
    old: Option<&LayerLock>,
    below: &[String],
    over: Option<tree::Lower<'_>>,
) -> Result<LayerTree, PrepareError> {
    let fingerprint = spec.fingerprint();
    let current = old.filter(|l| l.inputs == fingerprint);
    let given = lock::given_of(spec);
    if let (true, Some(cur)) = (c.opts.locked, current) {
        check_given_locked(name, cur, &given)?;
    }
    let lower_kernel = over.as_ref().and_then(|l| l.kernel);
    let chosen = choose(c.opts, current);
    let (resolve, note) = nothing_newer(c, name, spec, current, lower_kernel, chosen)?;
    let extras = extra_inputs(spec);
    let extra: Vec<(&str, &[u8])> = extras
        .iter()
        .map(|(n, v)| (n.as_str(), v.as_slice()))
        .collect();
    let key_of = |l: &LayerLock| {
        let b: Vec<&str> = below.iter().map(String::as_str).collect();
        Key::new(&KeyInputs {
            lock: l,
            spec: &fingerprint,
            below: &b,
            source_date_epoch: c.source_date_epoch,
            extra: &extra,
        })
    };
    let locked_key = current.filter(|_| resolve == Resolve::Locked).map(key_of);
    if let (Some(cur), Some(key)) = (current, &locked_key) {
        if let Some(mut hit) = reuse(c, name, cur, &given, key) {
            hit.report.push_str(&note);
            return Ok(hit);
        }
    }
    let mut reason = why_built(c.opts, name, old, current, &c.trees, locked_key.as_ref());
    reason.push_str(&note);
    let started = Instant::now();
    let work = c.trees.scratch(name)?;
    let phases = Phases::new(name, c.opts.progress, &c.opts.events);
    let tell = |p: &str| phases.start(p);
    let job = tree::Job {
        layer: name,
        spec,
        source_date_epoch: c.source_date_epoch,
        cache: &c.debs,
        lock: old,
        resolve: resolve.clone(),
        work: work.path(),
        phase: tree::Phase(&tell),
    };
    let made = match &over {
        Some(lower) => over::make(&job, lower)?,
        None => tree::make(&job)?,
    };
    let key = key_of(&made.lock);
    phases.start(&format!("tree cache: storing {}", key.short()));
    let hit = c
        .trees
        .insert(name, &key, &made.lock, &made.tree, &made.dpkg)?;
    phases.done();
    drop(work);
    let moved = old.map(|o| lock::diff(o, &made.lock)).unwrap_or_default();
    if matches!(resolve, Resolve::Update(_)) && !c.opts.rebuild {
        let n = moved.iter().filter(|m| m.is_package()).count();
        reason = format!("--update: the lock moved ({n} packages)");
    }
    let how = match resolve {
        Resolve::Locked => "locked",
        Resolve::Fresh => "resolved",
        Resolve::Update(_) => "updated",
    };
    let by = match over {
        Some(l) => format!("apt over layer {}", l.name),
        None => "mmdebstrap".to_owned(),
    };
    Ok(LayerTree {
        report: format!(
            "layer {name}: built: {reason}; {} packages ({how}; {} .deb from the cache, {} \
             downloaded) by {by} in {:.1?}, tree cache {}",
            made.lock.packages.len(),
            made.from_cache,
            made.downloaded,
            started.elapsed(),
            key.short(),
        ),
        outcome: TreeOutcome {
            layer: name.to_owned(),
            reused: false,
            reason,
            key: key.hex().to_owned(),
        },
        tree: hit.tree,
        dpkg: hit.dpkg,
        lock: made.lock,
        moved,
    })
}

/// The lock beside the manifest, checked against the options.
fn old_lock(manifest: &Manifest, opts: &Options) -> Result<(PathBuf, Option<Lock>), PrepareError> {
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
    Ok((lock_path, old_lock))
}

/// Makes the tree of every layer whose source is `debian`, or takes it from the tree cache when
/// its lock entry and every other input are those of a cached tree. A made tree enters the tree
/// cache (it is made in a scratch directory there and renamed in) and the build reads it there.
/// `Ok(None)`: the manifest has none.
pub fn prepare(manifest: &Manifest, opts: &Options) -> Result<Option<Prepared>, PrepareError> {
    if !manifest
        .layers
        .iter()
        .any(|l| matches!(l.source, LayerSource::Debian(_)))
    {
        return Ok(None);
    }
    let (lock_path, old_lock) = old_lock(manifest, opts)?;
    let deb_dir = opts.cache.clone().unwrap_or_else(DebCache::default_dir);
    let caches = Caches {
        opts,
        debs: DebCache::open(&deb_dir)?,
        trees: TreeCache::open(
            &opts
                .tree_cache
                .clone()
                .unwrap_or_else(|| TreeCache::default_dir(&deb_dir)),
        )?,
        source_date_epoch: manifest.source_date_epoch,
    };
    let mut out = manifest.clone();
    let mut lock = Lock::default();
    let (mut changes, mut report, mut trees) = (Vec::new(), Vec::new(), Vec::new());
    // The keys of the Debian layers below the next one: a layer's tree depends on them.
    let mut below: Vec<String> = Vec::new();
    // Each made layer, for the layers installed over it.
    let mut made_layers: BTreeMap<String, LayerTree> = BTreeMap::new();
    for layer in &mut out.layers {
        let LayerSource::Debian(spec) = &layer.source else {
            continue;
        };
        let old = old_lock.as_ref().and_then(|l| l.layers.get(&layer.name));
        let made = match &spec.over {
            None => layer_tree(&caches, &layer.name, spec, old, &below, None)?,
            Some(over) => {
                // The manifest checked that `over` is an earlier Debian base layer.
                let lower = made_layers
                    .get(over)
                    .ok_or_else(|| PrepareError::Over(layer.name.clone(), over.clone()))?;
                let lower_ref = tree::Lower {
                    name: over,
                    tree: &lower.tree,
                    dpkg: &lower.dpkg,
                    kernel: lower.lock.kernel.as_deref(),
                };
                let below = [lower.outcome.key.clone()];
                layer_tree(&caches, &layer.name, spec, old, &below, Some(lower_ref))?
            }
        };
        report.push(made.report.clone());
        below.push(made.outcome.key.clone());
        trees.push(made.outcome.clone());
        if !made.moved.is_empty() {
            changes.push((layer.name.clone(), made.moved.clone()));
        }
        if let Some(images) = spec.given_inputs.get(inputs::IMAGES_INPUT) {
            let preloads = inputs::preloads(&images.path).map_err(TreeError::from)?;
            layer.preload.extend(preloads);
        }
        layer.source = LayerSource::Dir(made.tree.clone());
        lock.layers.insert(layer.name.clone(), made.lock.clone());
        made_layers.insert(layer.name.clone(), made);
    }
    Ok(Some(Prepared {
        manifest: out,
        lock,
        old_lock,
        lock_path,
        changes,
        report,
        trees,
    }))
}

#[cfg(test)]
mod tests {

    #[test]
    fn the_boot_integration_and_each_given_input_enter_the_tree_key_only() {
        let mut spec: crate::debian_spec::DebianSpec = toml::from_str(
            "archive = [{ mirror = \"http://deb.debian.org/debian\", suites = [\"bookworm\"], components = [\"main\"] }]",
        )
        .unwrap();
        assert!(extra_inputs(&spec).is_empty());
        let fingerprint = spec.fingerprint();
        spec.boot_integration = true;
        let with_boot = extra_inputs(&spec);
        assert_eq!(with_boot.len(), 1);
        assert_eq!(with_boot[0].1, integration::digest().to_vec());
        spec.given_inputs.insert(
            "kubernetes".into(),
            crate::debian_spec::GivenInput {
                path: "/k8s".into(),
                digest: format!("sha256:{}", "a".repeat(64)),
            },
        );
        let fingerprint_with_input = spec.fingerprint();
        let one = extra_inputs(&spec);
        spec.given_inputs.get_mut("kubernetes").unwrap().digest =
            format!("sha256:{}", "b".repeat(64));
        let other = extra_inputs(&spec);
        assert_ne!(one, other, "another kubelet makes another tree");
        assert_eq!(one[0], other[0]);
        // The lock's fingerprint does not move with the operator's files.
        assert_eq!(fingerprint_with_input, spec.fingerprint());
        assert_ne!(
            fingerprint, fingerprint_with_input,
            "boot_integration is declared"
        );
    }

    use super::*;
    use lock::LayerLock;

    #[test]
    fn locked_takes_only_the_inputs_the_lock_names() {
        let given = |d: Option<char>| -> Vec<lock::LockedInput> {
            d.map(|c| lock::LockedInput {
                name: "kubernetes".into(),
                digest: format!("sha256:{}", c.to_string().repeat(64)),
            })
            .into_iter()
            .collect()
        };
        let locked = LayerLock {
            name: "base".into(),
            inputs: format!("sha256:{}", "0".repeat(64)),
            kernel: None,
            suites: Vec::new(),
            packages: Vec::new(),
            given: given(Some('a')),
            dkms: Vec::new(),
        };
        assert!(check_given_locked("base", &locked, &given(Some('a'))).is_ok());
        let moved = check_given_locked("base", &locked, &given(Some('b')))
            .unwrap_err()
            .to_string();
        assert!(
            moved.starts_with(&format!(
                "--locked: layer `base`: input `kubernetes` is sha256:{}, stack.lock has sha256:{}",
                "b".repeat(64),
                "a".repeat(64)
            )),
            "{moved}"
        );
        let left_out = check_given_locked("base", &locked, &given(None)).unwrap_err();
        assert!(left_out
            .to_string()
            .contains("is not given, stack.lock has sha256:aaaa"));
        let unlocked = LayerLock {
            given: Vec::new(),
            ..locked
        };
        let new = check_given_locked("base", &unlocked, &given(Some('a'))).unwrap_err();
        assert!(new.to_string().contains("stack.lock has none"), "{new}");
    }

    #[test]
    fn versions_are_chosen_as_cargo_chooses_them() {
        let cur = lock::sample();
        let opts = |locked, update: Option<&[&str]>| Options {
            locked,
            update: update.map(|u| u.iter().map(|s| (*s).to_owned()).collect()),
            ..Options::default()
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
