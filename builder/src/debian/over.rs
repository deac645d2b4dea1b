//! A layer installed by apt over a Debian base layer (`source.debian.over`): the base's tree is
//! the lower directory of an overlay ([`super::overlay`]), apt and dpkg install the layer's
//! packages in the merged tree (so maintainer scripts see the base they will be stacked on:
//! users, alternatives, triggers), and the upper directory, checked and cleaned
//! ([`super::upper`]), is the layer.
//!
//! Versions are chosen as for a base ([`super::tree`]): **locked**, apt sees only a local
//! repository holding the lock entry's files (from the cache, or fetched by `name=version` and
//! checked against their hashes); **fresh** or **update**, apt resolves against the archives with
//! the old entry's cached files beside them, `--update PKG...` pinning the others. The lock entry
//! lists the packages the install added to the base's dpkg status, each with its `.deb`'s hash.

use std::collections::{BTreeMap, BTreeSet};
use std::fs;
use std::path::Path;
use std::process::Output;

use tracing::info;

use super::lock::{LayerLock, LockedPackage};
use super::overlay::{Overlay, OverlayError, Spec, REPO_IN_OVERLAY};
use super::tree::{
    self, io_err, local_source, refused, stage_one, status_packages, suite_dates, write_repo, Job,
    Lower, Made, Resolve, Staged, TreeError,
};
use super::upper::{self, UpperError};
use super::{deb, dkms, inputs};

fn ov_err(layer: &str) -> impl FnOnce(OverlayError) -> TreeError + '_ {
    move |e| refused(layer, e)
}

/// Makes the layer of `job` over `lower`.
pub fn make(job: &Job<'_>, lower: &Lower<'_>) -> Result<Made, TreeError> {
    let ready = tree::prepared(job)?;
    let (lock, repo, fingerprint) = (ready.lock, ready.repo.as_path(), ready.fingerprint.as_str());
    let layer = job.layer;
    let locked_entry = lock.filter(|_| job.resolve == Resolve::Locked);
    // The kernel the modules are built for, checked before anything is installed.
    let kernel = job
        .spec
        .dkms
        .as_ref()
        .map(|_| lower.kernel.unwrap_or_default().to_owned());
    if let Some(old) = locked_entry.filter(|old| old.kernel != kernel) {
        return Err(refused(
            layer,
            format!(
                "stack.lock built its modules for kernel {:?}, layer {} has {:?} \
                 (`ingot build --update` builds them for it)",
                old.kernel, lower.name, kernel
            ),
        ));
    }
    let (staged, from_cache, downloaded) = match locked_entry {
        Some(old) => tree::stage_locked(job, old, repo)?,
        None => (cached_of_old(job, repo), 0, 0),
    };
    write_repo(repo, job.spec.main_suite(), &staged)?;
    let archives = job.work.join("archives");
    let partial = archives.join("partial");
    fs::create_dir_all(&partial).map_err(io_err("creating", &partial))?;
    let sources = overlay_sources(job, locked_entry.is_some(), !staged.is_empty());
    let filters = dpkg_filters(job);
    let pins = tree::pin_text(job);
    let ov = Overlay::mount(
        &Spec {
            lowers: &[lower.tree],
            dpkg: lower.dpkg,
            debs: &archives,
            sources: &sources,
            dpkg_filters: &filters,
            repo: Some(repo),
            preferences: pins.as_deref(),
        },
        &job.work.join("overlay"),
    )
    .map_err(ov_err(layer))?;
    let installed = install(job, &ov, lower, locked_entry)?;
    let up = ov.unmount().map_err(ov_err(layer))?;
    let tree = job.work.join("tree");
    to_layer(job, lower, &up, &tree)?;
    let mut lock = LayerLock {
        name: layer.to_owned(),
        inputs: fingerprint.to_owned(),
        kernel,
        suites: installed.suites.clone(),
        packages: Vec::new(),
        given: super::lock::given_of(job.spec),
        dkms: installed.dkms.clone().into_iter().collect(),
    };
    let (from_cache, downloaded) = match locked_entry {
        Some(old) => {
            check_as_locked(layer, old, &installed.added)?;
            lock.packages = old.packages.clone();
            (from_cache, downloaded)
        }
        None => {
            let (p, c, d) = lock_packages(job, &staged, &archives, &installed)?;
            lock.packages = p;
            (c, d)
        }
    };
    info!(
        "layer {layer}: {} packages over {}",
        lock.packages.len(),
        lower.name
    );
    Ok(Made {
        tree,
        dpkg: installed.dpkg,
        lock,
        from_cache,
        downloaded,
    })
}

/// apt's sources in the overlay: the local repository alone when locked, else the archives (with
/// the local repository of cached files beside them when it has any).
fn overlay_sources(job: &Job<'_>, locked: bool, staged: bool) -> Vec<String> {
    let repo_line = local_source(Path::new(REPO_IN_OVERLAY));
    let mut s = if locked {
        Vec::new()
    } else {
        job.spec.sources()
    };
    if locked || staged {
        s.push(repo_line);
    }
    s
}

/// What the install in the overlay left.
struct Installed {
    /// The packages it added to the lower's dpkg status (the operator's `.deb` files' too).
    added: BTreeSet<(String, String, String)>,
    /// The operator's `.deb` files, by package, with their SHA-256.
    operator_files: BTreeMap<PackageKey, String>,
    /// The suites' dates (from the lock when locked; none when apt read no archive).
    suites: Vec<super::lock::SuiteDate>,
    /// The DKMS source package the modules were built from.
    dkms: Option<LockedPackage>,
    /// dpkg's whole state after the install.
    dpkg: std::path::PathBuf,
}

/// Everything done in the mounted overlay: apt's install with the operator's `.deb` files, the
/// DKMS modules, the other inputs, the declared files, the merged indexes, the accounts and
/// alternatives links, dpkg's status kept for the SBOM.
fn install(
    job: &Job<'_>,
    ov: &Overlay,
    lower: &Lower<'_>,
    locked: Option<&LayerLock>,
) -> Result<Installed, TreeError> {
    let layer = job.layer;
    let merged = ov.merged();
    let (input_debs, operator_files) = input_debs(job, &merged)?;
    let reads_archives = !job.spec.packages.is_empty() || !input_debs.is_empty();
    if reads_archives {
        (job.phase.0)("apt: reading the archives' lists");
        run_ok(
            job,
            ov,
            &["apt-get", "-q", "update", "--error-on=any"],
            "apt-get update",
        )?;
        (job.phase.0)(&format!("apt: installing over layer {}", lower.name));
        let mut args = vec!["apt-get", "-q", "-y", "install"];
        args.extend(job.spec.packages.iter().map(String::as_str));
        args.extend(input_debs.iter().map(String::as_str));
        run_ok(job, ov, &args, "apt-get install")?;
    }
    let dkms = dkms_modules(job, ov, lower, locked)?;
    (job.phase.0)("the operator's inputs, the declared files, the merged indexes");
    operator_inputs(job, &merged)?;
    write_files(job, &merged)?;
    merged_indexes(job, ov, lower)?;
    let up = ov.upper();
    upper::accounts_to_sysusers(&up, &lower.tree.join("etc"), &format!("ingot-{layer}"))
        .map_err(|e| upper_err(layer, e))?;
    upper::direct_links(&up, &merged).map_err(|e| upper_err(layer, e))?;
    let status = merged.join("var/lib/dpkg/status");
    if reads_archives {
        // The merged status, where the SBOM reads it (it lists what this layer added).
        let kept = merged.join("usr/lib/ingot/dpkg");
        fs::create_dir_all(&kept).map_err(io_err("creating", &kept))?;
        fs::copy(&status, kept.join("status")).map_err(io_err("copying", &status))?;
    }
    let added = added_packages(layer, lower, &status)?;
    let suites = match (locked, reads_archives) {
        (Some(old), _) => old.suites.clone(),
        (None, true) => suite_dates(job.spec, &releases_of(&merged, &job.work.join("releases"))?)?,
        (None, false) => Vec::new(),
    };
    let dpkg = job.work.join("dpkg");
    super::overlay::copy_dir(&merged.join("var/lib/dpkg"), &dpkg).map_err(ov_err(layer))?;
    Ok(Installed {
        added,
        operator_files,
        suites,
        dkms,
        dpkg,
    })
}

/// (name, architecture, version) of a package.
type PackageKey = (String, String, String);

/// The `nvidia-toolkit` input's `.deb` files, copied into the overlay: their paths there, for
/// apt, and each one's package and SHA-256. They enter the `.deb` cache and the lock like the
/// archive's (a locked build stages them from the cache; `--locked` also checks the input's
/// digest).
fn input_debs(
    job: &Job<'_>,
    merged: &Path,
) -> Result<(Vec<String>, BTreeMap<PackageKey, String>), TreeError> {
    let (mut paths, mut files) = (Vec::new(), BTreeMap::new());
    let Some(given) = job.spec.given_inputs.get(inputs::NVIDIA_TOOLKIT_INPUT) else {
        return Ok((paths, files));
    };
    let dir = merged.join("tmp/ingot-inputs");
    fs::create_dir_all(&dir).map_err(io_err("creating", &dir))?;
    for deb in inputs::debs(&given.path)? {
        let name = deb.file_name().unwrap_or_default();
        fs::copy(&deb, dir.join(name)).map_err(io_err("copying", &deb))?;
        paths.push(format!("/tmp/ingot-inputs/{}", name.to_string_lossy()));
        let c = deb::read_control(&deb)?;
        files.insert((c.name, c.architecture, c.version), job.cache.insert(&deb)?);
    }
    Ok((paths, files))
}

/// kubectl (`kubernetes`) and Kata's release (`kata`) into the merged tree.
fn operator_inputs(job: &Job<'_>, merged: &Path) -> Result<(), TreeError> {
    let scratch = job.work.join("inputs");
    fs::create_dir_all(&scratch).map_err(io_err("creating", &scratch))?;
    let given = &job.spec.given_inputs;
    if let Some(k) = given.get(super::integration::KUBERNETES_INPUT) {
        inputs::kubectl(merged, &k.path, &scratch)?;
    }
    if let Some(k) = given.get(inputs::KATA_INPUT) {
        inputs::kata(merged, &k.path, &scratch)?;
    }
    Ok(())
}

/// The modules of `source.debian.dkms` built for the lower's kernel and put in the merged
/// tree's `/usr/lib/modules/KVER/updates/dkms`. Returns the source package's lock entry.
fn dkms_modules(
    job: &Job<'_>,
    ov: &Overlay,
    lower: &Lower<'_>,
    locked: Option<&LayerLock>,
) -> Result<Option<LockedPackage>, TreeError> {
    let Some(name) = &job.spec.dkms else {
        return Ok(None);
    };
    let Some(kernel) = lower.kernel else {
        return Err(refused(
            job.layer,
            format!(
                "source.debian.dkms: layer {} has no kernel to build for",
                lower.name
            ),
        ));
    };
    let package = match locked {
        Some(old) => {
            let p = old
                .dkms
                .first()
                .cloned()
                .ok_or_else(|| refused(job.layer, "stack.lock has no dkms entry for it"))?;
            let one = LayerLock {
                packages: vec![p.clone()],
                ..old.clone()
            };
            let repo = job.work.join("dkms-repo");
            fs::create_dir_all(&repo).map_err(io_err("creating", &repo))?;
            tree::stage_locked(job, &one, &repo)?;
            p
        }
        None => download_source(job, ov, name)?,
    };
    (job.phase.0)(&format!(
        "DKMS: {} {} for {kernel}",
        package.name, package.version
    ));
    let work = job.work.join("dkms");
    fs::create_dir_all(&work).map_err(io_err("creating", &work))?;
    let modules = dkms::default_dir(job.cache.dir());
    let signing = job
        .spec
        .given_inputs
        .get(inputs::MODULE_SIGNING_INPUT)
        .map(|g| {
            let [key, cert] = inputs::MODULE_SIGNING_FILES.map(|f| g.path.join(f));
            (key, cert)
        });
    let (dir, built) = dkms::modules(&dkms::Build {
        layer: job.layer,
        package: &package,
        kernel,
        sources: &job.spec.sources(),
        suite: job.spec.main_suite(),
        cache: job.cache,
        modules: &modules,
        work: &work,
        source_date_epoch: job.source_date_epoch,
        signing: signing.as_ref().map(|(k, c)| (k.as_path(), c.as_path())),
    })?;
    info!(
        "layer {}: DKMS modules {} ({})",
        job.layer,
        dir.display(),
        if built { "built now" } else { "cached" }
    );
    let dest = ov
        .merged()
        .join("usr/lib/modules")
        .join(kernel)
        .join(dkms::DKMS_DIR);
    fs::create_dir_all(&dest).map_err(io_err("creating", &dest))?;
    for ko in dkms::ko_files(&dir)? {
        let to = dest.join(ko.file_name().unwrap_or_default());
        fs::copy(&ko, &to).map_err(io_err("copying", &ko))?;
        fs::set_permissions(&to, std::os::unix::fs::PermissionsExt::from_mode(0o644))
            .map_err(io_err("setting the mode of", &to))?;
    }
    Ok(Some(package))
}

/// `apt-get download NAME` in the overlay (the candidate apt's lists and pins give), cached.
fn download_source(job: &Job<'_>, ov: &Overlay, name: &str) -> Result<LockedPackage, TreeError> {
    let dir = ov.merged().join("tmp/ingot-dkms");
    fs::create_dir_all(&dir).map_err(io_err("creating", &dir))?;
    let script = format!("cd /tmp/ingot-dkms && apt-get -q download {name}");
    run_ok(job, ov, &["sh", "-c", &script], "apt-get download")?;
    let debs: Vec<_> = fs::read_dir(&dir)
        .map_err(io_err("reading", &dir))?
        .filter_map(|e| e.ok().map(|e| e.path()))
        .filter(|p| p.extension().is_some_and(|x| x == "deb"))
        .collect();
    let [deb] = debs.as_slice() else {
        return Err(refused(
            job.layer,
            format!("apt-get download {name} gave {} files", debs.len()),
        ));
    };
    let c = deb::read_control(deb)?;
    let sha256 = job.cache.insert(deb)?;
    Ok(LockedPackage {
        name: c.name,
        architecture: c.architecture,
        version: c.version,
        sha256,
        priority: None,
    })
}

/// The old lock entry's files the cache still has, staged so apt need not download them again.
fn cached_of_old(job: &Job<'_>, repo: &Path) -> Vec<Staged> {
    job.lock
        .map(|old| {
            old.packages
                .iter()
                .filter_map(|p| stage_one(job.cache, p, repo).ok())
                .collect()
        })
        .unwrap_or_default()
}

/// dpkg's path filters, excludes first (an include takes back what an exclude left out).
fn dpkg_filters(job: &Job<'_>) -> Vec<String> {
    let s = job.spec;
    s.path_exclude
        .iter()
        .map(|g| format!("--path-exclude={g}"))
        .chain(s.path_include.iter().map(|g| format!("--path-include={g}")))
        .collect()
}

fn upper_err(layer: &str, e: UpperError) -> TreeError {
    refused(layer, e)
}

/// Runs `args` in the overlay; a failure carries the end of its output.
fn run_ok(job: &Job<'_>, ov: &Overlay, args: &[&str], what: &str) -> Result<Output, TreeError> {
    let out = ov.run(args).map_err(ov_err(job.layer))?;
    if out.status.success() {
        return Ok(out);
    }
    let text = format!(
        "{}{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
    let lines: Vec<&str> = text.lines().collect();
    let tail = lines[lines.len().saturating_sub(25)..].join("\n");
    tracing::error!("layer {}: {what} failed:\n{tail}", job.layer);
    let errors: Vec<&str> = lines
        .iter()
        .copied()
        .filter(|l| l.starts_with("E:"))
        .collect();
    let said = if errors.is_empty() {
        lines[lines.len().saturating_sub(3)..].join("; ")
    } else {
        errors.join("; ")
    };
    Err(refused(
        job.layer,
        format!("{what} in the overlay failed ({}): {said}", out.status),
    ))
}

/// The manifest's files, written into the merged tree (their parents made as needed).
fn write_files(job: &Job<'_>, merged: &Path) -> Result<(), TreeError> {
    use std::os::unix::fs::PermissionsExt;
    for f in &job.spec.files {
        let path = merged.join(f.path.trim_start_matches('/'));
        if let Some(parent) = path.parent() {
            fs::create_dir_all(parent).map_err(io_err("creating", parent))?;
        }
        if fs::symlink_metadata(&path).is_ok() {
            return Err(refused(
                job.layer,
                format!(
                    "source.debian.file {} is already in the tree (a package or the base has it)",
                    f.path
                ),
            ));
        }
        fs::write(&path, &f.text).map_err(io_err("writing", &path))?;
        fs::set_permissions(&path, fs::Permissions::from_mode(f.mode_bits()))
            .map_err(io_err("setting the mode of", &path))?;
    }
    Ok(())
}

/// The indexes made again over base and layer: depmod when the layer added kernel modules for the
/// base's kernel, ldconfig when the layer keeps `/etc/ld.so.cache`.
fn merged_indexes(job: &Job<'_>, ov: &Overlay, lower: &Lower<'_>) -> Result<(), TreeError> {
    if let Some(kver) = lower.kernel {
        let added = ov.upper().join("usr/lib/modules").join(kver);
        if added.is_dir() {
            run_ok(job, ov, &["depmod", "-a", kver], "depmod")?;
        }
    }
    if job.spec.ld_so_cache {
        run_ok(job, ov, &["ldconfig"], "ldconfig")?;
    }
    Ok(())
}

/// The packages in the merged status that the lower one lacks. A lower package whose version
/// the install changed is refused: the layer would replace the base's files.
fn added_packages(
    layer: &str,
    lower: &Lower<'_>,
    merged_status: &Path,
) -> Result<BTreeSet<(String, String, String)>, TreeError> {
    let below = status_packages(layer, &lower.dpkg.join("status"))?;
    let now = status_packages(layer, merged_status)?;
    let changed: Vec<String> = below
        .difference(&now)
        .map(|(n, a, v)| format!("{n}:{a} {v}"))
        .collect();
    if !changed.is_empty() {
        return Err(refused(
            layer,
            format!(
                "the install changed or removed packages of layer {}: {} (the archive has newer \
                 versions than its lock: `ingot build --update` moves both)",
                lower.name,
                changed.join(", ")
            ),
        ));
    }
    Ok(now.difference(&below).cloned().collect())
}

/// The archives' Release files apt fetched into the overlay's lists, copied to `to`.
fn releases_of(merged: &Path, to: &Path) -> Result<std::path::PathBuf, TreeError> {
    fs::create_dir_all(to).map_err(io_err("creating", to))?;
    let lists = merged.join("tmp/apt/lists");
    for e in fs::read_dir(&lists).map_err(io_err("reading", &lists))? {
        let p = e.map_err(io_err("reading", &lists))?.path();
        if p.to_string_lossy().ends_with("Release") {
            let dest = to.join(p.file_name().unwrap_or_default());
            fs::copy(&p, &dest).map_err(io_err("copying", &p))?;
        }
    }
    Ok(to.to_owned())
}

/// The unmounted upper directory made the layer at `tree`: no whiteouts, no overlay
/// attributes, nothing transient, no lower file replaced but the merged indexes.
fn to_layer(job: &Job<'_>, lower: &Lower<'_>, up: &Path, tree: &Path) -> Result<(), TreeError> {
    let layer = job.layer;
    let outs = upper::whiteouts(up).map_err(|e| upper_err(layer, e))?;
    if !outs.is_empty() {
        return Err(upper_err(layer, UpperError::Whiteouts(outs)));
    }
    upper::strip_overlay_attributes(up, lower.tree).map_err(|e| upper_err(layer, e))?;
    upper::drop_transient(up).map_err(|e| upper_err(layer, e))?;
    if !job.spec.ld_so_cache {
        // libc's trigger ran ldconfig: a layer that does not declare the cache leaves the
        // base's (or another layer's) in effect.
        let cache = up.join("etc/ld.so.cache");
        upper::absent(fs::remove_file(&cache)).map_err(io_err("removing", &cache))?;
    }
    let replaced = upper::replaced_lower(up, lower.tree).map_err(|e| upper_err(layer, e))?;
    if !replaced.is_empty() {
        return Err(upper_err(layer, UpperError::ReplacesLower(replaced)));
    }
    fs::rename(up, tree).map_err(io_err("moving the layer to", tree))
}

/// A locked install must add exactly the lock entry's packages.
fn check_as_locked(
    layer: &str,
    old: &LayerLock,
    added: &BTreeSet<(String, String, String)>,
) -> Result<(), TreeError> {
    let want: BTreeSet<_> = old
        .packages
        .iter()
        .map(|p| (p.name.clone(), p.architecture.clone(), p.version.clone()))
        .collect();
    if &want == added {
        return Ok(());
    }
    let show = |s: Vec<&(String, String, String)>| {
        s.iter()
            .map(|k| format!("{} {}", k.0, k.2))
            .collect::<Vec<_>>()
            .join(", ")
    };
    Err(refused(
        layer,
        format!(
            "the locked install differs from stack.lock: installed beyond it [{}], locked but not \
             installed [{}]",
            show(added.difference(&want).collect()),
            show(want.difference(added).collect())
        ),
    ))
}

/// The lock's packages for a resolved install: every added package with the hash of its file
/// (downloaded into `archives` now, or staged from the cache), the downloaded files cached.
/// Returns them with how many came from the cache and how many were downloaded.
fn lock_packages(
    job: &Job<'_>,
    staged: &[Staged],
    archives: &Path,
    installed: &Installed,
) -> Result<(Vec<LockedPackage>, usize, usize), TreeError> {
    let added = &installed.added;
    let mut files: BTreeMap<PackageKey, String> = staged
        .iter()
        .map(|s| {
            let p = &s.package;
            (
                (p.name.clone(), p.architecture.clone(), p.version.clone()),
                p.sha256.clone(),
            )
        })
        .collect();
    let mut downloaded = BTreeSet::new();
    files.extend(installed.operator_files.clone());
    for e in fs::read_dir(archives).map_err(io_err("reading", archives))? {
        let path = e.map_err(io_err("reading", archives))?.path();
        if path.extension().is_none_or(|x| x != "deb") {
            continue;
        }
        let c = deb::read_control(&path)?;
        let sha = job.cache.insert(&path)?;
        let key = (c.name, c.architecture, c.version);
        // apt may copy the local repository's files here too: those came from the cache.
        if !staged.iter().any(|s| s.package.sha256 == sha) {
            downloaded.insert(key.clone());
        }
        files.insert(key, sha);
    }
    let mut packages = Vec::new();
    let mut from_cache = 0;
    for key in added {
        let Some(sha) = files.get(key) else {
            return Err(refused(
                job.layer,
                format!(
                    "{} {} ({}) is installed, but apt left no .deb of it to cache",
                    key.0, key.2, key.1
                ),
            ));
        };
        if !downloaded.contains(key) {
            from_cache += 1;
        }
        packages.push(LockedPackage {
            name: key.0.clone(),
            architecture: key.1.clone(),
            version: key.2.clone(),
            sha256: sha.clone(),
            priority: None,
        });
    }
    let n = packages.len() - from_cache;
    Ok((packages, from_cache, n))
}
