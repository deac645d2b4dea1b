//! A Debian-made layer's tree: mmdebstrap and apt install the packages, ingot pins and caches.
//!
//! - **Locked** (the lock has the layer, made for the same declaration): every locked `.deb` is
//!   taken from the cache (its hash checked) or, failing that, fetched from the archive by apt
//!   (`apt-get download name=version`, its hash checked against the lock), and put in a local
//!   file repository holding exactly those files. mmdebstrap installs from that repository alone:
//!   apt cannot pick another version, and no network is used when the cache holds everything.
//!   A file neither can give fails the build naming the package, before mmdebstrap runs.
//! - **Fresh** (no lock, or made for another declaration) and **update**: mmdebstrap resolves
//!   against the archives (with the cached files of the old lock as a local repository beside
//!   them, so unchanged packages are not downloaded again); `--update PKG...` pins every other
//!   package to its locked version with apt preferences. The downloaded files enter the cache and
//!   the new lock lists every installed package.

use std::collections::{BTreeMap, BTreeSet};
use std::fs;
use std::io;
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};

use ingot_artifact::sbom;
use tracing::info;

use super::cache::{self, CacheError, DebCache};
use super::deb::{self, Control, DebError};
use super::lock::{LayerLock, LockedPackage, SuiteDate};
use crate::debian_spec::DebianSpec;

/// mmdebstrap's hook that makes `file://` mirrors visible inside the chroot (apt runs there for
/// the packages past the essential set).
const FILE_MIRROR_HOOKS: &str = "/usr/share/mmdebstrap/hooks/file-mirror-automount";
/// The local repository's `Origin`, so its Release is not taken for an archive's.
const LOCAL_ORIGIN: &str = "ingot-deb-cache";

/// How the layer's versions are chosen.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Resolve {
    /// Exactly the lock's packages.
    Locked,
    /// Whatever the archives hold now.
    Fresh,
    /// Move these packages forward, keep the others (empty: move everything forward).
    Update(BTreeSet<String>),
}

/// One layer to make.
#[derive(Debug)]
pub struct Job<'a> {
    /// The layer's name.
    pub layer: &'a str,
    /// Its declaration.
    pub spec: &'a DebianSpec,
    /// The manifest's `source_date_epoch` (mmdebstrap's SOURCE_DATE_EPOCH).
    pub source_date_epoch: u64,
    /// The `.deb` cache.
    pub cache: &'a DebCache,
    /// The layer's entry in the existing lock.
    pub lock: Option<&'a LayerLock>,
    /// How to choose versions.
    pub resolve: Resolve,
    /// A scratch directory for this layer (created; the tree is made in it).
    pub work: &'a Path,
    /// Told when each phase starts (for a progress display).
    pub phase: Phase<'a>,
}

/// The made layer a layer is installed over.
#[derive(Debug, Clone, Copy)]
pub struct Lower<'a> {
    /// Its name.
    pub name: &'a str,
    /// Its finished tree.
    pub tree: &'a Path,
    /// Its dpkg state (`/var/lib/dpkg` as the install left it; the tree's `/var` is empty).
    pub dpkg: &'a Path,
    /// Its kernel release, if it has one.
    pub kernel: Option<&'a str>,
}

/// What [`make`] tells about its phases: a short description of each as it starts.
#[derive(Clone, Copy)]
pub struct Phase<'a>(pub &'a dyn Fn(&str));

impl std::fmt::Debug for Phase<'_> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("Phase")
    }
}

/// A made tree and the lock entry that makes it again.
#[derive(Debug)]
pub struct Made {
    /// The tree (ready for `ingot build` as a `dir` source).
    pub tree: PathBuf,
    /// Its whole dpkg state, for the layers installed over it.
    pub dpkg: PathBuf,
    /// Its lock entry.
    pub lock: LayerLock,
    /// `.deb` files taken from the cache.
    pub from_cache: usize,
    /// `.deb` files apt downloaded.
    pub downloaded: usize,
}

/// Why a tree could not be made.
#[derive(Debug, thiserror::Error)]
pub enum TreeError {
    /// mmdebstrap's root mode needs root.
    #[error("layer `{0}`: making a Debian tree needs root (mmdebstrap --mode=root, chroot)")]
    NotRoot(String),
    /// `--locked` without a lock entry for the layer.
    #[error(
        "layer `{0}`: stack.lock has no entry for it; build once without --locked to write one"
    )]
    NotLocked(String),
    /// `--locked` with a lock made for another declaration.
    #[error(
        "layer `{0}`: stack.lock was written for another source.debian (its packages, archives or \
         options changed since); build without --locked to resolve it again"
    )]
    Stale(String),
    /// `--update` names a package the lock does not have.
    #[error("layer `{layer}`: --update {package}: stack.lock has no package `{package}`")]
    UnknownPackage {
        /// The layer.
        layer: String,
        /// The name given.
        package: String,
    },
    /// Locked files neither the cache nor the archive can give.
    #[error(
        "layer `{layer}`: stack.lock names {} package file(s) that neither the .deb cache ({}) \
         nor the archive can give: {} (a cache or mirror that has them, or `ingot build --update`, \
         which moves the lock to what the archive has now)",
        missing.len(), cache.display(), missing.join("; ")
    )]
    Unavailable {
        /// The layer.
        layer: String,
        /// The cache directory.
        cache: PathBuf,
        /// One line per package: name, version, architecture, hash, why.
        missing: Vec<String>,
    },
    /// mmdebstrap failed.
    #[error("layer `{layer}`: mmdebstrap failed ({status}); the end of its log is above")]
    Mmdebstrap {
        /// The layer.
        layer: String,
        /// Its exit status.
        status: String,
        /// The log's last lines (also logged when it failed).
        tail: String,
    },
    /// The tree does not hold what it should.
    #[error("layer `{layer}`: {reason}")]
    Tree {
        /// The layer.
        layer: String,
        /// What is wrong.
        reason: String,
    },
    /// The cache refused a file or failed.
    #[error(transparent)]
    Cache(#[from] CacheError),
    /// The boot integration failed.
    #[error(transparent)]
    Integration(#[from] super::integration::IntegrationError),
    /// A `.deb` could not be read.
    #[error(transparent)]
    Deb(#[from] DebError),
    /// The tree's dpkg status was refused.
    #[error(transparent)]
    Status(#[from] sbom::SbomError),
    /// A file operation failed.
    #[error("{what} {}", path.display())]
    Io {
        /// What was being done.
        what: &'static str,
        /// On which path.
        path: PathBuf,
        /// The error.
        source: io::Error,
    },
}

pub(super) fn io_err(what: &'static str, path: &Path) -> impl FnOnce(io::Error) -> TreeError {
    let path = path.to_owned();
    move |source| TreeError::Io { what, path, source }
}

/// A layer's tree refused, and why.
pub(super) fn refused(layer: &str, reason: impl std::fmt::Display) -> TreeError {
    TreeError::Tree {
        layer: layer.to_owned(),
        reason: reason.to_string(),
    }
}

/// What [`prepared`] found: the lock entry made for the job's declaration, the scratch
/// repository and the declaration's fingerprint.
pub struct Ready<'a> {
    /// The lock entry, when made for this declaration.
    pub lock: Option<&'a LayerLock>,
    /// The local repository directory (created).
    pub repo: PathBuf,
    /// [`DebianSpec::fingerprint`] of the declaration.
    pub fingerprint: String,
}

/// Makes the base's tree under `job.work` by mmdebstrap, as `job.resolve` says.
pub fn make(job: &Job<'_>) -> Result<Made, TreeError> {
    let ready = prepared(job)?;
    if job.resolve == Resolve::Locked {
        let old = ready.lock.expect("checked by prepared");
        locked(job, old, &ready.repo)
    } else {
        unlocked(job, &ready.repo, &ready.fingerprint)
    }
}

/// The checks every Debian tree starts with (root; a lock for `--locked`; `--update`'s names
/// in it) and its scratch directories.
pub fn prepared<'a>(job: &Job<'a>) -> Result<Ready<'a>, TreeError> {
    let layer = job.layer.to_owned();
    let is_root =
        fs::metadata("/proc/self").is_ok_and(|m| std::os::unix::fs::MetadataExt::uid(&m) == 0);
    if !is_root {
        return Err(TreeError::NotRoot(layer));
    }
    let fingerprint = job.spec.fingerprint();
    let lock = job.lock.filter(|l| l.inputs == fingerprint);
    match (&job.resolve, job.lock, lock) {
        (Resolve::Locked, None, _) => return Err(TreeError::NotLocked(layer)),
        (Resolve::Locked, Some(_), None) => return Err(TreeError::Stale(layer)),
        (Resolve::Update(names), Some(old), _) => {
            if let Some(p) = names
                .iter()
                .find(|n| !old.packages.iter().chain(&old.dkms).any(|p| &p.name == *n))
            {
                return Err(TreeError::UnknownPackage {
                    layer,
                    package: p.clone(),
                });
            }
        }
        _ => {}
    }
    fs::create_dir_all(job.work).map_err(io_err("creating", job.work))?;
    let repo = job.work.join("repo");
    fs::create_dir_all(&repo).map_err(io_err("creating", &repo))?;
    Ok(Ready {
        lock,
        repo,
        fingerprint,
    })
}

/// A locked file staged in the local repository.
pub(super) struct Staged {
    pub(super) package: LockedPackage,
    pub(super) control: Control,
    pub(super) file: String,
}

/// Puts the cached file of `p` in `repo`, checked: its hash (by the cache) and its control's
/// name, version and architecture. `Err(why)`: not usable from the cache.
pub(super) fn stage_one(
    cache: &DebCache,
    p: &LockedPackage,
    repo: &Path,
) -> Result<Staged, String> {
    let file = deb::file_name(&p.name, &p.version, &p.architecture);
    let dest = repo.join(&file);
    let _ = fs::remove_file(&dest);
    match cache.place(&p.sha256, &dest) {
        Ok(true) => {}
        Ok(false) => return Err("not in the cache".into()),
        Err(e) => return Err(e.to_string()),
    }
    let control = deb::read_control(&dest).map_err(|e| e.to_string())?;
    if (&control.name, &control.version, &control.architecture)
        != (&p.name, &p.version, &p.architecture)
    {
        let _ = fs::remove_file(&dest);
        return Err(format!(
            "the cached file with that hash is {} {} ({})",
            control.name, control.version, control.architecture
        ));
    }
    Ok(Staged {
        package: p.clone(),
        control,
        file,
    })
}

/// Every file of the lock entry `old` staged in `repo`, from the cache or else the archive;
/// fails naming each one neither can give. Returns them with how many came from the cache and
/// how many were downloaded.
pub(super) fn stage_locked(
    job: &Job<'_>,
    old: &LayerLock,
    repo: &Path,
) -> Result<(Vec<Staged>, usize, usize), TreeError> {
    (job.phase.0)(&format!("staging {} locked .debs", old.packages.len()));
    let mut staged = Vec::new();
    let mut missing = Vec::new();
    for p in &old.packages {
        match stage_one(job.cache, p, repo) {
            Ok(s) => staged.push(s),
            Err(why) => missing.push((p.clone(), why)),
        }
    }
    let from_cache = staged.len();
    let downloaded = missing.len();
    if !missing.is_empty() {
        info!(
            "layer {}: {} locked files not cached; asking the archive",
            job.layer,
            missing.len()
        );
        let unavailable = fetch_missing(job, &missing, repo, &mut staged)?;
        if !unavailable.is_empty() {
            return Err(TreeError::Unavailable {
                layer: job.layer.to_owned(),
                cache: job.cache.dir().to_owned(),
                missing: unavailable,
            });
        }
    }
    Ok((staged, from_cache, downloaded))
}

/// The lock's files, from the cache or the archive, installed by mmdebstrap from a repository
/// holding nothing else.
fn locked(job: &Job<'_>, old: &LayerLock, repo: &Path) -> Result<Made, TreeError> {
    let (staged, from_cache, downloaded) = stage_locked(job, old, repo)?;
    write_repo(repo, job.spec.main_suite(), &staged)?;
    let tree = job.work.join("tree");
    let sources = vec![local_source(repo)];
    (job.phase.0)("mmdebstrap: installing the locked packages");
    mmdebstrap(job, &tree, &sources, &MmdebstrapExtras::default())?;
    let installed = installed(job.layer, &tree)?;
    let want: BTreeSet<_> = old
        .packages
        .iter()
        .map(|p| (p.name.clone(), p.architecture.clone(), p.version.clone()))
        .collect();
    if installed != want {
        let extra: Vec<_> = installed
            .difference(&want)
            .map(|k| format!("{} {}", k.0, k.2))
            .collect();
        let lacking: Vec<_> = want
            .difference(&installed)
            .map(|k| format!("{} {}", k.0, k.2))
            .collect();
        return Err(TreeError::Tree {
            layer: job.layer.to_owned(),
            reason: format!(
                "the locked install differs from stack.lock: installed beyond it [{}], locked but \
                 not installed [{}]",
                extra.join(", "),
                lacking.join(", ")
            ),
        });
    }
    let kernel = kernel_of(job.layer, &tree)?;
    if kernel != old.kernel {
        return Err(TreeError::Tree {
            layer: job.layer.to_owned(),
            reason: format!("kernel {kernel:?}, stack.lock says {:?}", old.kernel),
        });
    }
    (job.phase.0)("finishing the tree");
    let dpkg = job.work.join("dpkg");
    finish_tree(&tree, job.spec, &dpkg)?;
    Ok(Made {
        tree,
        dpkg,
        lock: old.clone(),
        from_cache,
        downloaded,
    })
}

/// apt's options for a private state under `dir`: the manifest's archives, no host package list,
/// no host status.
fn private_apt(spec: &DebianSpec, dir: &Path) -> Result<Vec<String>, TreeError> {
    for d in ["lists/partial", "cache/archives/partial", "parts", "prefs"] {
        let p = dir.join(d);
        fs::create_dir_all(&p).map_err(io_err("creating", &p))?;
    }
    let list = dir.join("sources.list");
    fs::write(&list, spec.sources().join("\n") + "\n").map_err(io_err("writing", &list))?;
    let status = dir.join("status");
    fs::write(&status, "").map_err(io_err("writing", &status))?;
    let d = |p: &str| dir.join(p).display().to_string();
    Ok([
        format!("Dir::Etc::SourceList={}", list.display()),
        format!("Dir::Etc::SourceParts={}", d("parts")),
        format!("Dir::Etc::PreferencesParts={}", d("prefs")),
        format!("Dir::State::Lists={}", d("lists")),
        format!("Dir::State::status={}", status.display()),
        format!("Dir::Cache={}", d("cache")),
        "Debug::NoLocking=true".into(),
        "APT::Sandbox::User=root".into(),
        "Acquire::Languages=none".into(),
    ]
    .into_iter()
    .flat_map(|o| ["-o".to_owned(), o])
    .collect())
}

fn apt(opts: &[String], args: &[&str], cwd: &Path) -> Result<(), String> {
    let out = Command::new("apt-get")
        .args(opts)
        .args(["-q", "-y"])
        .args(args)
        .current_dir(cwd)
        .env("DEBIAN_FRONTEND", "noninteractive")
        .stdin(Stdio::null())
        .output()
        .map_err(|e| format!("running apt-get: {e}"))?;
    if out.status.success() {
        return Ok(());
    }
    let err = String::from_utf8_lossy(&out.stderr);
    let lines: Vec<&str> = err.lines().filter(|l| l.starts_with("E:")).collect();
    Err(if lines.is_empty() {
        err.trim().to_owned()
    } else {
        lines.join(" ")
    })
}

/// Fetches the `missing` locked files from the archive (`apt-get download name=version`), checks
/// each against its locked hash, caches and stages it. Returns one line per file that could not
/// be had.
pub(super) fn fetch_missing(
    job: &Job<'_>,
    missing: &[(LockedPackage, String)],
    repo: &Path,
    staged: &mut Vec<Staged>,
) -> Result<Vec<String>, TreeError> {
    let dir = job.work.join("apt");
    let opts = private_apt(job.spec, &dir)?;
    let fetched = job.work.join("fetched");
    fs::create_dir_all(&fetched).map_err(io_err("creating", &fetched))?;
    let line = |p: &LockedPackage, why: &str, archive: &str| {
        format!(
            "{} {} ({}) sha256 {}: cache: {why}; archive: {archive}",
            p.name, p.version, p.architecture, p.sha256
        )
    };
    if let Err(e) = apt(&opts, &["update"], &fetched) {
        let why = format!("apt-get update failed: {e}");
        return Ok(missing.iter().map(|(p, c)| line(p, c, &why)).collect());
    }
    let native = dpkg_architecture();
    let mut unavailable = Vec::new();
    for (p, why) in missing {
        let spec = if p.architecture == "all" || Some(&p.architecture) == native.as_ref() {
            format!("{}={}", p.name, p.version)
        } else {
            format!("{}:{}={}", p.name, p.architecture, p.version)
        };
        if let Err(e) = apt(&opts, &["download", &spec], &fetched) {
            unavailable.push(line(p, why, &e));
            continue;
        }
        let file = fetched.join(deb::file_name(&p.name, &p.version, &p.architecture));
        let sha = cache::sha256_of(&file)?;
        if sha != p.sha256 {
            unavailable.push(line(
                p,
                why,
                &format!("its file has sha256 {sha}, not the locked one"),
            ));
            continue;
        }
        job.cache.insert(&file)?;
        match stage_one(job.cache, p, repo) {
            Ok(s) => staged.push(s),
            Err(e) => unavailable.push(line(p, why, &e)),
        }
    }
    Ok(unavailable)
}

/// For `--update`: the locked packages (all, or those `names`; never the `operators`' own .debs)
/// whose candidate in the archives now is not their locked version, as "name old → new" lines. Empty: resolving again would
/// change nothing, so the locked tree stands. apt reads the archives' lists into `dir`.
pub fn moved_in_archive(
    spec: &DebianSpec,
    old: &LayerLock,
    names: &BTreeSet<String>,
    operators: &BTreeSet<String>,
    dir: &Path,
) -> Result<Vec<String>, TreeError> {
    let opts = private_apt(spec, dir)?;
    apt(&opts, &["update"], dir).map_err(|e| TreeError::Tree {
        layer: old.name.clone(),
        reason: format!("--update: apt-get update failed: {e}"),
    })?;
    let native = dpkg_architecture();
    let wanted: Vec<&LockedPackage> = old
        .packages
        .iter()
        .chain(&old.dkms)
        .filter(|p| names.is_empty() || names.contains(&p.name))
        // The operator's own .debs are not the archive's to move.
        .filter(|p| !operators.contains(&p.name))
        .collect();
    let query = |p: &LockedPackage| {
        if p.architecture == "all" || Some(&p.architecture) == native.as_ref() {
            p.name.clone()
        } else {
            format!("{}:{}", p.name, p.architecture)
        }
    };
    let mut out = Command::new("apt-cache");
    out.args(&opts).arg("policy");
    for p in &wanted {
        out.arg(query(p));
    }
    let out = out
        .stdin(Stdio::null())
        .output()
        .map_err(io_err("running apt-cache", dir))?;
    let candidates = policy_candidates(&String::from_utf8_lossy(&out.stdout));
    Ok(wanted
        .iter()
        .filter_map(|p| {
            let now = candidates.get(&query(p)).map_or("(none)", String::as_str);
            (now != p.version).then(|| format!("{} {} → {now}", p.name, p.version))
        })
        .collect())
}

/// Each package's `Candidate:` in `apt-cache policy` output, by the name it was asked as.
fn policy_candidates(text: &str) -> BTreeMap<String, String> {
    let mut out = BTreeMap::new();
    let mut current: Option<String> = None;
    for line in text.lines() {
        if !line.starts_with(' ') {
            current = line.strip_suffix(':').map(str::to_owned);
        } else if let (Some(c), Some(v)) = (&current, line.trim().strip_prefix("Candidate:")) {
            out.insert(c.clone(), v.trim().to_owned());
        }
    }
    out
}

fn dpkg_architecture() -> Option<String> {
    let out = Command::new("dpkg")
        .arg("--print-architecture")
        .output()
        .ok()?;
    Some(String::from_utf8_lossy(&out.stdout).trim().to_owned()).filter(|s| !s.is_empty())
}

/// The `deb` line of the local repository.
pub(super) fn local_source(repo: &Path) -> String {
    format!("deb [trusted=yes] file://{} ./", repo.display())
}

/// A flat apt repository in `repo`: `Packages` (each staged file's control, name, size and
/// hash) and an unsigned `Release` naming `suite` (mmdebstrap takes the essential set from the
/// suite it is given). apt trusts it through `[trusted=yes]`; ingot checked every hash.
pub(super) fn write_repo(repo: &Path, suite: &str, staged: &[Staged]) -> Result<(), TreeError> {
    let mut packages = String::new();
    for s in staged {
        let size = fs::metadata(repo.join(&s.file))
            .map_err(io_err("reading", &repo.join(&s.file)))?
            .len();
        packages.push_str(&with_priority(
            &s.control.text,
            s.package.priority.as_deref(),
        ));
        packages.push_str(&format!(
            "\nFilename: ./{}\nSize: {size}\nSHA256: {}\n\n",
            s.file, s.package.sha256
        ));
    }
    let path = repo.join("Packages");
    fs::write(&path, &packages).map_err(io_err("writing", &path))?;
    let sha = cache::sha256_of(&path)?;
    let release = format!(
        "Origin: {LOCAL_ORIGIN}\nLabel: {LOCAL_ORIGIN}\nSuite: {suite}\nCodename: {suite}\n\
         SHA256:\n {sha} {} Packages\n",
        packages.len()
    );
    let path = repo.join("Release");
    fs::write(&path, release).map_err(io_err("writing", &path))
}

/// A control paragraph with its `Priority` replaced by the archive's override, when there is one.
fn with_priority(control: &str, priority: Option<&str>) -> String {
    let text = control.trim_end();
    let Some(p) = priority else {
        return text.to_owned();
    };
    let mut out: Vec<String> = text
        .lines()
        .filter(|l| !l.to_ascii_lowercase().starts_with("priority:"))
        .map(str::to_owned)
        .collect();
    out.push(format!("Priority: {p}"));
    out.join("\n")
}

/// The archives' `Priority` of every package version in apt's lists under `tree` (kept by
/// `--skip=cleanup/apt/lists`), keyed by (name, architecture, version).
fn archive_priorities(
    tree: &Path,
) -> Result<BTreeMap<(String, String, String), String>, TreeError> {
    let lists = tree.join("var/lib/apt/lists");
    let mut out = BTreeMap::new();
    let mut read_any = false;
    for entry in fs::read_dir(&lists).map_err(io_err("reading", &lists))? {
        let path = entry.map_err(io_err("reading", &lists))?.path();
        if !path.to_string_lossy().ends_with("_Packages") {
            continue;
        }
        read_any = true;
        let text = fs::read_to_string(&path).map_err(io_err("reading", &path))?;
        for stanza in text.split("\n\n") {
            let f = |k| deb::field(stanza, k).map(str::to_owned);
            if let (Some(n), Some(a), Some(v), Some(p)) =
                (f("Package"), f("Architecture"), f("Version"), f("Priority"))
            {
                out.entry((n, a, v)).or_insert(p);
            }
        }
    }
    if !read_any {
        return Err(TreeError::Tree {
            layer: String::new(),
            reason: format!("apt left no *_Packages list in {}", lists.display()),
        });
    }
    Ok(out)
}

/// What mmdebstrap gets beyond the common options.
#[derive(Default)]
struct MmdebstrapExtras {
    /// An apt preferences file put in the chroot for the run (and removed after).
    preferences: Option<PathBuf>,
    /// Where the downloaded `.deb`s and the archives' Release files are copied before cleanup.
    collect: Option<PathBuf>,
}

fn mmdebstrap(
    job: &Job<'_>,
    tree: &Path,
    sources: &[String],
    extras: &MmdebstrapExtras,
) -> Result<(), TreeError> {
    let spec = job.spec;
    let mut cmd = Command::new("mmdebstrap");
    cmd.args(["--mode=root", "--format=directory"])
        .arg(format!("--variant={}", spec.variant))
        // Keep what apt downloaded until the customize hook copied it out.
        .args(["--skip=download/empty", "--skip=essential/unlink"])
        .arg(format!("--hook-dir={FILE_MIRROR_HOOKS}"));
    if !spec.packages.is_empty() {
        cmd.arg(format!("--include={}", spec.packages.join(",")));
    }
    for g in &spec.path_exclude {
        cmd.arg(format!("--dpkgopt=path-exclude={g}"));
    }
    for g in &spec.path_include {
        cmd.arg(format!("--dpkgopt=path-include={g}"));
    }
    if spec.boot_integration {
        cmd.args(super::integration::customize_hooks(&job.work.join("boot"))?);
    }
    if let Some(prefs) = &extras.preferences {
        cmd.arg("--setup-hook=mkdir -p \"$1\"/etc/apt/preferences.d")
            .arg(format!(
                "--setup-hook=copy-in {} /etc/apt/preferences.d/",
                prefs.display()
            ))
            .arg(format!(
                "--customize-hook=rm -f \"$1\"/etc/apt/preferences.d/{}",
                prefs.file_name().unwrap_or_default().to_string_lossy()
            ));
    }
    if let Some(out) = &extras.collect {
        // The lists give the archives' priorities (read before the tree's /var is emptied).
        cmd.arg("--skip=cleanup/apt/lists");
        let (debs, releases) = (out.join("debs"), out.join("releases"));
        for d in [&debs, &releases] {
            fs::create_dir_all(d).map_err(io_err("creating", d))?;
        }
        cmd.arg(format!(
            "--customize-hook=find \"$1\"/var/cache/apt/archives -maxdepth 1 -name '*.deb' \
             -exec cp -t '{}' {{}} +",
            debs.display()
        ))
        .arg(format!(
            "--customize-hook=find \"$1\"/var/lib/apt/lists -maxdepth 1 -name '*Release' \
             -exec cp -t '{}' {{}} +",
            releases.display()
        ));
    }
    cmd.arg(spec.main_suite()).arg(tree).args(sources);
    cmd.env("SOURCE_DATE_EPOCH", job.source_date_epoch.to_string())
        .env("LC_ALL", "C.UTF-8")
        .stdin(Stdio::null());
    let log = job.work.join("mmdebstrap.log");
    let file = fs::File::create(&log).map_err(io_err("creating", &log))?;
    let file2 = file.try_clone().map_err(io_err("opening", &log))?;
    cmd.stdout(file).stderr(file2);
    info!("layer {}: {:?}", job.layer, cmd);
    let status = cmd.status().map_err(io_err(
        "running mmdebstrap (is it installed? apt-get install mmdebstrap)",
        Path::new("mmdebstrap"),
    ))?;
    if status.success() {
        return Ok(());
    }
    let text = fs::read_to_string(&log).unwrap_or_default();
    let lines: Vec<&str> = text.lines().collect();
    let tail = lines[lines.len().saturating_sub(30)..].join("\n");
    // The log goes with the scratch directory: its end is shown now.
    tracing::error!("layer {}: mmdebstrap's log ends:\n{tail}", job.layer);
    Err(TreeError::Mmdebstrap {
        layer: job.layer.to_owned(),
        status: status.to_string(),
        tail,
    })
}

/// Resolve against the archives (the old lock's cached files beside them), pinning what
/// `--update PKG...` leaves alone; the downloaded files enter the cache.
fn unlocked(job: &Job<'_>, repo: &Path, fingerprint: &str) -> Result<Made, TreeError> {
    let mut staged = Vec::new();
    if let Some(old) = job.lock {
        for p in &old.packages {
            if let Ok(s) = stage_one(job.cache, p, repo) {
                staged.push(s);
            }
        }
    }
    let mut sources = job.spec.sources();
    if !staged.is_empty() {
        write_repo(repo, job.spec.main_suite(), &staged)?;
        sources.push(local_source(repo));
    }
    let extras = MmdebstrapExtras {
        collect: Some(job.work.join("collected")),
        preferences: pins(job)?,
    };
    let tree = job.work.join("tree");
    (job.phase.0)("mmdebstrap: resolving, downloading and installing");
    mmdebstrap(job, &tree, &sources, &extras)?;
    (job.phase.0)("caching the downloaded .debs");
    let collected = job.work.join("collected");

    // Every installed package's file (downloaded now, or one of the cached ones) and the
    // priority its control file gives.
    type Key = (String, String, String);
    let mut files: BTreeMap<Key, (String, Option<String>)> = staged
        .iter()
        .map(|s| {
            let p = &s.package;
            let priority = deb::field(&s.control.text, "Priority").map(str::to_owned);
            (
                (p.name.clone(), p.architecture.clone(), p.version.clone()),
                (p.sha256.clone(), priority),
            )
        })
        .collect();
    let mut downloaded = 0;
    let debs = collected.join("debs");
    for entry in fs::read_dir(&debs).map_err(io_err("reading", &debs))? {
        let path = entry.map_err(io_err("reading", &debs))?.path();
        let c = deb::read_control(&path)?;
        let sha = job.cache.insert(&path)?;
        // apt copies the local repository's files into its archives too: those were cached.
        if !staged.iter().any(|s| s.package.sha256 == sha) {
            downloaded += 1;
        }
        let priority = deb::field(&c.text, "Priority").map(str::to_owned);
        files.insert((c.name, c.architecture, c.version), (sha, priority));
    }
    let archive = archive_priorities(&tree)?;
    let mut packages = Vec::new();
    let mut from_cache = 0;
    for key in installed(job.layer, &tree)? {
        let Some((sha, own)) = files.get(&key) else {
            return Err(TreeError::Tree {
                layer: job.layer.to_owned(),
                reason: format!(
                    "{} {} ({}) is installed, but apt left no .deb of it to cache",
                    key.0, key.2, key.1
                ),
            });
        };
        if staged.iter().any(|s| &s.package.sha256 == sha) {
            from_cache += 1;
        }
        let priority = archive
            .get(&key)
            .filter(|a| Some(*a) != own.as_ref())
            .cloned();
        packages.push(LockedPackage {
            name: key.0,
            architecture: key.1,
            version: key.2,
            sha256: sha.clone(),
            priority,
        });
    }
    let suites = suite_dates(job.spec, &collected.join("releases"))?;
    let kernel = kernel_of(job.layer, &tree)?;
    (job.phase.0)("finishing the tree");
    let dpkg = job.work.join("dpkg");
    finish_tree(&tree, job.spec, &dpkg)?;
    Ok(Made {
        tree,
        dpkg,
        lock: LayerLock {
            name: job.layer.to_owned(),
            inputs: fingerprint.to_owned(),
            kernel,
            suites,
            packages,
            given: super::lock::given_of(job.spec),
            dkms: Vec::new(),
        },
        from_cache,
        downloaded,
    })
}

/// For `--update PKG...`: an apt preferences file pinning every other locked package to its
/// locked version.
fn pins(job: &Job<'_>) -> Result<Option<PathBuf>, TreeError> {
    let Some(text) = pin_text(job) else {
        return Ok(None);
    };
    let prefs = job.work.join("ingot-lock.pref");
    fs::write(&prefs, text).map_err(io_err("writing", &prefs))?;
    Ok(Some(prefs))
}

/// The apt preferences that pin every locked package `--update PKG...` does not name.
pub(super) fn pin_text(job: &Job<'_>) -> Option<String> {
    let (Resolve::Update(names), Some(old)) = (&job.resolve, job.lock) else {
        return None;
    };
    if names.is_empty() {
        return None;
    }
    let text: String = old
        .packages
        .iter()
        .filter(|p| !names.contains(&p.name))
        .map(|p| {
            format!(
                "Package: {}:{}\nPin: version {}\nPin-Priority: 1001\n\n",
                p.name, p.architecture, p.version
            )
        })
        .collect();
    Some(text)
}

/// (name, architecture, version) of every installed package of the tree.
fn installed(layer: &str, tree: &Path) -> Result<BTreeSet<(String, String, String)>, TreeError> {
    status_packages(layer, &tree.join("var/lib/dpkg/status"))
}

/// (name, architecture, version) of every installed package in dpkg's status file `path`.
pub(super) fn status_packages(
    layer: &str,
    path: &Path,
) -> Result<BTreeSet<(String, String, String)>, TreeError> {
    let bytes = fs::read(path).map_err(io_err("reading", path))?;
    Ok(sbom::parse_status(&bytes, layer, "var/lib/dpkg/status")?
        .into_iter()
        .map(|p| (p.name, p.arch, p.version))
        .collect())
}

/// The kernel releases in the tree's `/usr/lib/modules` (space-separated; `None` without).
fn kernel_of(layer: &str, tree: &Path) -> Result<Option<String>, TreeError> {
    let dir = tree.join("usr/lib/modules");
    let mut names = Vec::new();
    match fs::read_dir(&dir) {
        Ok(rd) => {
            for e in rd {
                let e = e.map_err(io_err("reading", &dir))?;
                if e.path().join("kernel").is_dir() || e.path().join("modules.order").is_file() {
                    names.push(e.file_name().to_string_lossy().into_owned());
                }
            }
        }
        Err(e) if e.kind() == io::ErrorKind::NotFound => {}
        Err(e) => return Err(io_err("reading", &dir)(e)),
    }
    names.sort();
    if names.len() > 1 {
        return Err(TreeError::Tree {
            layer: layer.to_owned(),
            reason: format!("more than one kernel: {}", names.join(", ")),
        });
    }
    Ok(names.pop())
}

/// Each manifest suite's Release `Date`, from the Release files apt fetched.
pub(super) fn suite_dates(spec: &DebianSpec, releases: &Path) -> Result<Vec<SuiteDate>, TreeError> {
    let mut found: BTreeMap<String, String> = BTreeMap::new();
    for entry in fs::read_dir(releases).map_err(io_err("reading", releases))? {
        let path = entry.map_err(io_err("reading", releases))?.path();
        let text = fs::read_to_string(&path).map_err(io_err("reading", &path))?;
        if deb::field(&text, "Origin") == Some(LOCAL_ORIGIN) {
            continue;
        }
        let Some(date) = deb::field(&text, "Date") else {
            continue;
        };
        for key in ["Suite", "Codename"] {
            if let Some(s) = deb::field(&text, key) {
                found.insert(s.to_owned(), date.to_owned());
            }
        }
    }
    let mut out = Vec::new();
    for s in spec.archives.iter().flat_map(|a| &a.suites) {
        let date = found.get(s).cloned().ok_or_else(|| TreeError::Tree {
            layer: String::new(),
            reason: format!("apt fetched no Release file for suite `{s}`"),
        })?;
        out.push(SuiteDate {
            suite: s.clone(),
            date,
        });
    }
    out.sort();
    out.dedup();
    Ok(out)
}

/// What every layer tree gets before `ingot build` reads it: apt's sources as the manifest
/// declares them (mmdebstrap wrote the ones it was given, which may name the build's local
/// repository), `/etc/hostname` `localhost` and an empty `/etc/resolv.conf` (not the build
/// host's), dpkg's status kept where the SBOM reads it (`/usr/lib/ingot/dpkg/status`), and
/// `/dev`, `/run`, `/tmp` and `/var` emptied (mount points; the var partition is mounted over
/// `/var`), dpkg's whole state moved to `keep_dpkg` first (layers installed over this one need
/// it). A base with `boot_integration` first gets the integration's steps after mmdebstrap
/// ([`super::integration::apply`]).
fn finish_tree(tree: &Path, spec: &DebianSpec, keep_dpkg: &Path) -> Result<(), TreeError> {
    if spec.boot_integration {
        let k8s = spec.given_inputs.get(super::integration::KUBERNETES_INPUT);
        super::integration::apply(tree, k8s.map(|i| i.path.as_path()))?;
    }
    let list = tree.join("etc/apt/sources.list");
    fs::write(&list, spec.sources().join("\n") + "\n").map_err(io_err("writing", &list))?;
    // mmdebstrap copies the build host's name and resolver into the tree: no host's bytes may
    // stay in a layer. The node's own name and resolver are the node's (its network setup).
    for (file, text) in [("etc/hostname", "localhost\n"), ("etc/resolv.conf", "")] {
        let path = tree.join(file);
        // Replaced, not written through: it may be a symlink.
        match fs::remove_file(&path) {
            Err(e) if e.kind() != io::ErrorKind::NotFound => {
                return Err(io_err("removing", &path)(e))
            }
            _ => {}
        }
        fs::write(&path, text).map_err(io_err("writing", &path))?;
        fs::set_permissions(&path, std::os::unix::fs::PermissionsExt::from_mode(0o644))
            .map_err(io_err("setting the mode of", &path))?;
    }
    let status = tree.join("var/lib/dpkg/status");
    let kept = tree.join("usr/lib/ingot/dpkg");
    fs::create_dir_all(&kept).map_err(io_err("creating", &kept))?;
    fs::copy(&status, kept.join("status")).map_err(io_err("copying", &status))?;
    let dpkg = tree.join("var/lib/dpkg");
    fs::rename(&dpkg, keep_dpkg).map_err(io_err("moving dpkg's state out of", &dpkg))?;
    for d in ["dev", "run", "tmp", "var"] {
        let dir = tree.join(d);
        let Ok(rd) = fs::read_dir(&dir) else { continue };
        for e in rd {
            let p = e.map_err(io_err("reading", &dir))?.path();
            let meta = fs::symlink_metadata(&p).map_err(io_err("reading", &p))?;
            if meta.is_dir() {
                fs::remove_dir_all(&p).map_err(io_err("removing", &p))?;
            } else {
                fs::remove_file(&p).map_err(io_err("removing", &p))?;
            }
        }
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn policy_candidates_are_read_per_package() {
        let text = "libc6:\n  Installed: (none)\n  Candidate: 2.36-9+deb12u9\n  Version table:\n     \
                    2.36-9+deb12u9 500\n        500 http://deb.debian.org/debian bookworm/main amd64 \
                    Packages\nlibfoo:i386:\n  Installed: (none)\n  Candidate: (none)\n";
        let c = policy_candidates(text);
        assert_eq!(c["libc6"], "2.36-9+deb12u9");
        assert_eq!(c["libfoo:i386"], "(none)");
        assert_eq!(c.len(), 2);
    }

    #[test]
    fn the_archive_priority_replaces_the_control_files() {
        let control = "Package: apt\nVersion: 2.6.1\nPriority: important\nDescription: x\n y\n";
        let out = with_priority(control, Some("required"));
        assert_eq!(deb::field(&out, "Priority"), Some("required"));
        assert_eq!(out.matches("Priority").count(), 1, "{out}");
        assert_eq!(with_priority(control, None), control.trim_end());
    }

    #[test]
    fn a_finished_tree_keeps_no_host_bytes_and_nothing_under_var() {
        let dir = tempfile::tempdir().unwrap();
        let t = dir.path();
        for d in [
            "etc/apt",
            "var/lib/dpkg",
            "var/log/apt",
            "run/lock",
            "tmp",
            "dev",
        ] {
            fs::create_dir_all(t.join(d)).unwrap();
        }
        fs::write(t.join("var/lib/dpkg/status"), "Package: dpkg\n").unwrap();
        fs::write(t.join("var/log/apt/history.log"), "x").unwrap();
        fs::write(t.join("etc/hostname"), "buildhost\n").unwrap();
        std::os::unix::fs::symlink("../run/resolv.conf", t.join("etc/resolv.conf")).unwrap();
        fs::write(
            t.join("etc/apt/sources.list"),
            "deb [trusted=yes] file:///x ./\n",
        )
        .unwrap();
        let spec: DebianSpec = toml::from_str(
            "[[archive]]\nmirror = \"http://deb.debian.org/debian\"\nsuites = [\"bookworm\"]\ncomponents = [\"main\"]\n",
        )
        .unwrap();
        finish_tree(t, &spec, &dir.path().join("dpkg")).unwrap();
        let read = |p: &str| fs::read_to_string(t.join(p)).unwrap();
        assert_eq!(read("etc/hostname"), "localhost\n");
        assert_eq!(read("etc/resolv.conf"), "");
        assert!(!fs::symlink_metadata(t.join("etc/resolv.conf"))
            .unwrap()
            .is_symlink());
        assert!(
            !t.join("run/resolv.conf").exists(),
            "written through the symlink"
        );
        assert_eq!(
            read("etc/apt/sources.list"),
            "deb http://deb.debian.org/debian bookworm main\n"
        );
        assert_eq!(read("usr/lib/ingot/dpkg/status"), "Package: dpkg\n");
        assert_eq!(
            fs::read_to_string(dir.path().join("dpkg/status")).unwrap(),
            "Package: dpkg\n"
        );
        for d in ["var", "run", "tmp", "dev"] {
            assert_eq!(
                fs::read_dir(t.join(d)).unwrap().count(),
                0,
                "{d} not emptied"
            );
        }
    }
}
