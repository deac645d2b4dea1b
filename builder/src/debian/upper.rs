//! A layer made as the upper directory of an overlay over the layers below it (apt and dpkg ran
//! in the merged tree, so maintainer scripts saw the base they will be stacked on): the checks
//! and clean-up that turn that upper directory into a layer `ingot build` takes.
//!
//! - A whiteout (a character device 0:0) would delete a lower file: refused, a layer only adds.
//! - An opaque directory (`trusted.overlay.opaque`) hides the lower one's entries: refused unless
//!   the upper directory has every name the lower one has, so dropping the mark shows the same.
//! - Every `trusted.overlay.*` attribute is removed: overlayfs' own bookkeeping, which `ingot
//!   build` refuses in a directory source.
//! - `var/`, `run/`, `tmp/`, `root/` and `boot/` go (the var partition, mount points, the
//!   install's own leftovers), and so do the account files' backups and lock.
//! - Users and groups the install added to the lower `/etc/passwd` and `/etc/group` become
//!   `/usr/lib/sysusers.d/NAME.conf` and the layer keeps no account file: a layer's `/etc/passwd`
//!   would hide the base's (and any other layer's) for good; systemd-sysusers makes them at every
//!   boot. A change to an existing entry is refused.
//! - A symlink through `/etc/alternatives` is made to point at its final target: `/etc` is
//!   writable on a node, and a write there must not change which library or tool runs.
//! - A lower file the layer replaces must be one of the merged indexes ([`MERGED_INDEXES`]).

use std::collections::BTreeSet;
use std::fs;
use std::io;
use std::os::unix::fs::{FileTypeExt, MetadataExt};
use std::path::{Path, PathBuf};

/// overlayfs' attribute namespace.
const OVERLAY_XATTR: &str = "trusted.overlay.";
/// What the layer never keeps (relative to its root).
const DROPPED: &[&str] = &["var", "run", "tmp", "root", "boot"];
/// The account files' backups and lock, which shadow's tools leave in /etc.
const ACCOUNT_LEFTOVERS: &[&str] = &[
    "etc/.pwd.lock",
    "etc/passwd-",
    "etc/group-",
    "etc/shadow-",
    "etc/gshadow-",
    "etc/subuid-",
    "etc/subgid-",
];
/// The account files a layer may not carry.
const ACCOUNT_FILES: &[&str] = &["etc/passwd", "etc/group", "etc/shadow", "etc/gshadow"];

/// The lower files a layer may replace: indexes that must be made again over base + layer
/// (`docs/boot-contract.md`, "Layers that add kernel modules, libraries or a runtime").
pub fn is_merged_index(rel: &str) -> bool {
    if rel == "etc/ld.so.cache" || rel == "usr/lib/ingot/dpkg/status" {
        return true;
    }
    let Some(rest) = rel.strip_prefix("usr/lib/modules/") else {
        return false;
    };
    let Some((kver, file)) = rest.split_once('/') else {
        return false;
    };
    !kver.is_empty()
        && MODULE_INDEXES
            .iter()
            .any(|i| file == format!("modules.{i}"))
}

/// depmod's index files.
const MODULE_INDEXES: &[&str] = &[
    "alias",
    "alias.bin",
    "builtin.alias.bin",
    "builtin.bin",
    "dep",
    "dep.bin",
    "devname",
    "softdep",
    "symbols",
    "symbols.bin",
];

/// Why an upper directory is not a layer.
#[derive(Debug, thiserror::Error)]
pub enum UpperError {
    #[error("the install deleted lower files (overlay whiteouts): {}", list(.0))]
    Whiteouts(Vec<String>),
    #[error("/{dir} is opaque in the overlay and the lower /{dir}/{name} would show through")]
    Opaque { dir: String, name: String },
    #[error("the install changed the lower /etc/{file} entries: {}", .lines.join("; "))]
    Accounts { file: String, lines: Vec<String> },
    #[error("the layer would replace lower files other than the merged indexes: {}", list(.0))]
    ReplacesLower(Vec<String>),
    #[error("/{link} -> {target} leads nowhere in the merged tree")]
    Dangling { link: String, target: String },
    #[error("{what} {}", path.display())]
    Io {
        what: &'static str,
        path: PathBuf,
        #[source]
        source: io::Error,
    },
}

fn list(paths: &[String]) -> String {
    let shown: Vec<&str> = paths.iter().take(5).map(String::as_str).collect();
    let more = paths.len().saturating_sub(shown.len());
    if more == 0 {
        shown.join(" ")
    } else {
        format!("{} and {more} more", shown.join(" "))
    }
}

fn io_err(what: &'static str, path: &Path) -> impl FnOnce(io::Error) -> UpperError {
    let path = path.to_owned();
    move |source| UpperError::Io { what, path, source }
}

/// Every entry below `root` (not `root` itself), as paths relative to it, parents first.
fn walk(root: &Path) -> Result<Vec<PathBuf>, UpperError> {
    let mut out = Vec::new();
    let mut todo = vec![PathBuf::new()];
    while let Some(rel) = todo.pop() {
        let dir = root.join(&rel);
        let mut names: Vec<_> = fs::read_dir(&dir)
            .map_err(io_err("reading", &dir))?
            .map(|e| e.map(|e| e.file_name()))
            .collect::<Result<_, _>>()
            .map_err(io_err("reading", &dir))?;
        names.sort();
        for name in names {
            let child = rel.join(&name);
            let meta = fs::symlink_metadata(root.join(&child))
                .map_err(io_err("reading", &root.join(&child)))?;
            if meta.is_dir() {
                todo.push(child.clone());
            }
            out.push(child);
        }
    }
    Ok(out)
}

/// A removal's result, where "it was not there" is success.
pub fn absent(r: io::Result<()>) -> io::Result<()> {
    match r {
        Err(e) if e.kind() == io::ErrorKind::NotFound => Ok(()),
        other => other,
    }
}

fn rel_str(p: &Path) -> String {
    p.to_string_lossy().into_owned()
}

/// The whiteouts in `upper` (character devices 0:0), relative paths.
pub fn whiteouts(upper: &Path) -> Result<Vec<String>, UpperError> {
    let mut out = Vec::new();
    for rel in walk(upper)? {
        let path = upper.join(&rel);
        let meta = fs::symlink_metadata(&path).map_err(io_err("reading", &path))?;
        if meta.file_type().is_char_device() && meta.rdev() == 0 {
            out.push(rel_str(&rel));
        }
    }
    Ok(out)
}

/// Checks the opaque directories of `upper` against `lower` (the merged layers below) and
/// removes every `trusted.overlay.*` attribute.
pub fn strip_overlay_attributes(upper: &Path, lower: &Path) -> Result<(), UpperError> {
    for rel in std::iter::once(PathBuf::new()).chain(walk(upper)?) {
        let path = upper.join(&rel);
        let names: Vec<String> = xattr::list(&path)
            .map_err(io_err("listing the attributes of", &path))?
            .filter_map(|n| n.into_string().ok())
            .filter(|n| n.starts_with(OVERLAY_XATTR))
            .collect();
        if names.iter().any(|n| n == "trusted.overlay.opaque") {
            check_opaque(upper, lower, &rel)?;
        }
        for n in names {
            xattr::remove(&path, &n).map_err(io_err("removing an attribute of", &path))?;
        }
    }
    Ok(())
}

/// An opaque directory at `rel` must hold every name the lower directory holds.
fn check_opaque(upper: &Path, lower: &Path, rel: &Path) -> Result<(), UpperError> {
    let below = lower.join(rel);
    let Ok(entries) = fs::read_dir(&below) else {
        return Ok(());
    };
    for e in entries {
        let name = e.map_err(io_err("reading", &below))?.file_name();
        if fs::symlink_metadata(upper.join(rel).join(&name)).is_err() {
            return Err(UpperError::Opaque {
                dir: rel_str(rel),
                name: name.to_string_lossy().into_owned(),
            });
        }
    }
    Ok(())
}

/// Removes what a layer never keeps ([`DROPPED`], the account files' leftovers).
pub fn drop_transient(upper: &Path) -> Result<(), UpperError> {
    for d in DROPPED {
        let path = upper.join(d);
        absent(fs::remove_dir_all(&path)).map_err(io_err("removing", &path))?;
    }
    for f in ACCOUNT_LEFTOVERS {
        let path = upper.join(f);
        absent(fs::remove_file(&path)).map_err(io_err("removing", &path))?;
    }
    Ok(())
}

/// The lines of `upper`'s account file not in `lower`'s (added), and `lower`'s not in
/// `upper`'s (changed or removed).
fn account_diff(lower: &str, upper: &str) -> (Vec<String>, Vec<String>) {
    let low: BTreeSet<&str> = lower.lines().collect();
    let up: BTreeSet<&str> = upper.lines().collect();
    let added = upper
        .lines()
        .filter(|l| !low.contains(l))
        .map(str::to_owned)
        .collect();
    let gone = lower
        .lines()
        .filter(|l| !up.contains(l))
        .map(str::to_owned)
        .collect();
    (added, gone)
}

/// The sysusers.d lines for the accounts the install added: `u` per new user (which makes its
/// own group), `g` per new group that is not a new user's.
pub fn sysusers_lines(added_users: &[String], added_groups: &[String]) -> Vec<String> {
    let mut users = BTreeSet::new();
    let mut lines = Vec::new();
    for l in added_users {
        let f: Vec<&str> = l.split(':').collect();
        if f.len() < 7 {
            continue;
        }
        users.insert(f[0]);
        lines.push(format!("u {} - \"{}\" {} {}", f[0], f[4], f[5], f[6]));
    }
    for l in added_groups {
        let name = l.split(':').next().unwrap_or_default();
        if !name.is_empty() && !users.contains(name) {
            lines.push(format!("g {name} -"));
        }
    }
    lines
}

/// Moves the accounts the install added into `usr/lib/sysusers.d/NAME.conf` and removes the
/// account files from `upper`; `lower_etc` is the lower tree's `/etc`.
pub fn accounts_to_sysusers(upper: &Path, lower_etc: &Path, name: &str) -> Result<(), UpperError> {
    let read = |p: &Path| fs::read_to_string(p).map_err(io_err("reading", p));
    let mut added = Vec::new();
    for file in ["passwd", "group", "shadow", "gshadow"] {
        let up = upper.join("etc").join(file);
        if !up.exists() {
            added.push(Vec::new());
            continue;
        }
        let low = lower_etc.join(file);
        let lower = if low.exists() {
            read(&low)?
        } else {
            String::new()
        };
        let (new, gone) = account_diff(&lower, &read(&up)?);
        if !gone.is_empty() {
            return Err(UpperError::Accounts {
                file: file.to_owned(),
                lines: gone,
            });
        }
        added.push(new);
    }
    let lines = sysusers_lines(&added[0], &added[1]);
    if !lines.is_empty() {
        let dir = upper.join("usr/lib/sysusers.d");
        fs::create_dir_all(&dir).map_err(io_err("creating", &dir))?;
        let conf = dir.join(format!("{name}.conf"));
        let text = format!(
            "# Made by ingot from the accounts the packages' maintainer scripts added.\n{}\n",
            lines.join("\n")
        );
        fs::write(&conf, text).map_err(io_err("writing", &conf))?;
    }
    for f in ACCOUNT_FILES {
        let path = upper.join(f);
        absent(fs::remove_file(&path)).map_err(io_err("removing", &path))?;
    }
    Ok(())
}

/// `path` (absolute, inside the tree at `root`) with every symlink resolved inside `root`, as an
/// absolute path of the tree; None when it leads nowhere or loops.
pub fn resolve_in(root: &Path, path: &str) -> Option<String> {
    let mut parts: Vec<String> = Vec::new();
    let mut todo: Vec<String> = path.split('/').rev().map(str::to_owned).collect();
    let mut hops = 0;
    while let Some(c) = todo.pop() {
        match c.as_str() {
            "" | "." => continue,
            ".." => {
                parts.pop();
                continue;
            }
            _ => {}
        }
        let here = root.join(parts.join("/")).join(&c);
        let meta = fs::symlink_metadata(&here).ok()?;
        if meta.file_type().is_symlink() {
            hops += 1;
            if hops > 40 {
                return None;
            }
            let target = fs::read_link(&here).ok()?;
            let target = target.to_string_lossy();
            if target.starts_with('/') {
                parts.clear();
            }
            todo.extend(target.split('/').rev().map(str::to_owned));
        } else {
            parts.push(c);
        }
    }
    Some(format!("/{}", parts.join("/")))
}

/// Every symlink of `upper` (outside `/etc/alternatives`) whose target is in
/// `/etc/alternatives` is made to point at its final target, resolved in `merged` (the layer
/// over the layers below). Every link is resolved before any is changed: a link that leads
/// nowhere fails the whole, leaving `upper` as it was.
pub fn direct_links(upper: &Path, merged: &Path) -> Result<usize, UpperError> {
    let mut direct = Vec::new();
    for rel in walk(upper)? {
        let r = rel_str(&rel);
        if r.starts_with("etc/alternatives/") {
            continue;
        }
        let path = upper.join(&rel);
        let meta = fs::symlink_metadata(&path).map_err(io_err("reading", &path))?;
        if !meta.file_type().is_symlink() {
            continue;
        }
        let target = fs::read_link(&path).map_err(io_err("reading", &path))?;
        let target = target.to_string_lossy().into_owned();
        if !target.starts_with("/etc/alternatives/") {
            continue;
        }
        let fin = resolve_in(merged, &format!("/{r}")).ok_or_else(|| UpperError::Dangling {
            link: r.clone(),
            target: target.clone(),
        })?;
        direct.push((path, fin));
    }
    for (path, fin) in &direct {
        fs::remove_file(path).map_err(io_err("removing", path))?;
        std::os::unix::fs::symlink(fin, path).map_err(io_err("linking", path))?;
    }
    Ok(direct.len())
}

/// The lower files (below `lower`) the layer at `upper` replaces that are not merged indexes.
pub fn replaced_lower(upper: &Path, lower: &Path) -> Result<Vec<String>, UpperError> {
    let mut out = Vec::new();
    for rel in walk(upper)? {
        let path = upper.join(&rel);
        let meta = fs::symlink_metadata(&path).map_err(io_err("reading", &path))?;
        if meta.is_dir() {
            continue;
        }
        let r = rel_str(&rel);
        if fs::symlink_metadata(lower.join(&rel)).is_ok() && !is_merged_index(&r) {
            out.push(r);
        }
    }
    Ok(out)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn merged_indexes_are_the_module_index_the_linker_cache_and_dpkg_status() {
        for ok in [
            "etc/ld.so.cache",
            "usr/lib/ingot/dpkg/status",
            "usr/lib/modules/6.1.0-57-amd64/modules.dep.bin",
            "usr/lib/modules/6.1.0-57-amd64/modules.alias",
        ] {
            assert!(is_merged_index(ok), "{ok}");
        }
        for bad in [
            "etc/passwd",
            "usr/lib/modules/6.1.0-57-amd64/kernel/x.ko",
            "usr/lib/modules//modules.dep",
            "usr/lib/modules/k/modules.order",
            "usr/lib/modules/modules.dep",
        ] {
            assert!(!is_merged_index(bad), "{bad}");
        }
    }

    #[test]
    fn new_accounts_become_sysusers_lines_and_a_users_own_group_is_not_repeated() {
        let users = vec![
            "nvpd:x:101:102:NVIDIA Persistence Daemon,,,:/var/run/nvpd:/usr/sbin/nologin"
                .to_owned(),
        ];
        let groups = vec!["nvpd:x:102:".to_owned(), "rdma:x:103:".to_owned()];
        assert_eq!(
            sysusers_lines(&users, &groups),
            [
                "u nvpd - \"NVIDIA Persistence Daemon,,,\" /var/run/nvpd /usr/sbin/nologin",
                "g rdma -"
            ]
        );
    }

    #[test]
    fn a_changed_base_account_is_refused_and_added_ones_move_to_sysusers() {
        let dir = tempfile::tempdir().unwrap();
        let (upper, lower) = (dir.path().join("u"), dir.path().join("l/etc"));
        fs::create_dir_all(upper.join("etc")).unwrap();
        fs::create_dir_all(&lower).unwrap();
        fs::write(lower.join("passwd"), "root:x:0:0:root:/root:/bin/sh\n").unwrap();
        fs::write(lower.join("group"), "root:x:0:\n").unwrap();
        fs::write(
            upper.join("etc/passwd"),
            "root:x:0:0:root:/root:/bin/sh\nsvc:x:100:100::/nonexistent:/usr/sbin/nologin\n",
        )
        .unwrap();
        fs::write(
            upper.join("etc/group"),
            "root:x:0:\nsvc:x:100:\nextra:x:101:\n",
        )
        .unwrap();
        fs::write(upper.join("etc/passwd-"), "backup").unwrap();
        accounts_to_sysusers(&upper, &lower, "ingot-test").unwrap();
        drop_transient(&upper).unwrap();
        let conf = fs::read_to_string(upper.join("usr/lib/sysusers.d/ingot-test.conf")).unwrap();
        assert!(
            conf.ends_with("u svc - \"\" /nonexistent /usr/sbin/nologin\ng extra -\n"),
            "{conf}"
        );
        assert!(!upper.join("etc/passwd").exists() && !upper.join("etc/passwd-").exists());

        fs::write(
            upper.join("etc/passwd"),
            "root:x:0:0:root:/root:/bin/bash\n",
        )
        .unwrap();
        let err = accounts_to_sysusers(&upper, &lower, "ingot-test").unwrap_err();
        assert!(
            err.to_string().contains("root:x:0:0:root:/root:/bin/sh"),
            "{err}"
        );
    }

    #[test]
    fn alternatives_links_point_at_their_final_target_resolved_in_the_merged_tree() {
        let dir = tempfile::tempdir().unwrap();
        let merged = dir.path().join("m");
        let upper = dir.path().join("u");
        for t in [&merged, &upper] {
            fs::create_dir_all(t.join("usr/bin")).unwrap();
            fs::create_dir_all(t.join("etc/alternatives")).unwrap();
        }
        fs::create_dir_all(merged.join("usr/lib/nvidia")).unwrap();
        fs::write(merged.join("usr/lib/nvidia/nvidia-smi"), "x").unwrap();
        let link = |at: &Path, to: &str| std::os::unix::fs::symlink(to, at).unwrap();
        link(
            &merged.join("etc/alternatives/nvidia-smi"),
            "/usr/lib/nvidia/nvidia-smi",
        );
        link(
            &merged.join("usr/bin/nvidia-smi"),
            "/etc/alternatives/nvidia-smi",
        );
        link(
            &upper.join("usr/bin/nvidia-smi"),
            "/etc/alternatives/nvidia-smi",
        );
        link(
            &upper.join("etc/alternatives/nvidia-smi"),
            "/usr/lib/nvidia/nvidia-smi",
        );
        link(&upper.join("usr/bin/other"), "/etc/alternatives/missing");
        let err = direct_links(&upper, &merged).unwrap_err();
        assert!(err.to_string().contains("usr/bin/other"), "{err}");
        fs::remove_file(upper.join("usr/bin/other")).unwrap();
        assert_eq!(direct_links(&upper, &merged).unwrap(), 1);
        assert_eq!(
            fs::read_link(upper.join("usr/bin/nvidia-smi")).unwrap(),
            Path::new("/usr/lib/nvidia/nvidia-smi")
        );
    }

    #[test]
    fn relative_and_looping_links_resolve_inside_the_tree() {
        let dir = tempfile::tempdir().unwrap();
        let root = dir.path();
        fs::create_dir_all(root.join("usr/lib")).unwrap();
        fs::write(root.join("usr/lib/real"), "x").unwrap();
        std::os::unix::fs::symlink("../lib/real", root.join("usr/lib/rel")).unwrap();
        std::os::unix::fs::symlink("/../../usr/lib/rel", root.join("abs")).unwrap();
        std::os::unix::fs::symlink("loop", root.join("loop")).unwrap();
        assert_eq!(
            resolve_in(root, "/usr/lib/rel").as_deref(),
            Some("/usr/lib/real")
        );
        assert_eq!(resolve_in(root, "/abs").as_deref(), Some("/usr/lib/real"));
        assert_eq!(resolve_in(root, "/loop"), None);
        assert_eq!(resolve_in(root, "/nothing"), None);
    }

    /// Whiteouts and overlayfs' attributes as a real overlay leaves them (needs root: a device
    /// node and `trusted.*` attributes).
    #[test]
    fn whiteouts_are_found_and_an_opaque_directory_must_hide_nothing() {
        if fs::metadata("/proc/self").map(|m| m.uid()).unwrap_or(1) != 0 {
            eprintln!("skipped: needs root (mknod, trusted.* attributes)");
            return;
        }
        let dir = tempfile::tempdir().unwrap();
        let (upper, lower) = (dir.path().join("u"), dir.path().join("l"));
        fs::create_dir_all(upper.join("etc/conf.d")).unwrap();
        fs::create_dir_all(lower.join("etc/conf.d")).unwrap();
        fs::write(lower.join("etc/conf.d/base"), "x").unwrap();
        let made = std::process::Command::new("mknod")
            .arg(upper.join("etc/gone"))
            .args(["c", "0", "0"])
            .status()
            .unwrap();
        assert!(made.success());
        assert_eq!(whiteouts(&upper).unwrap(), ["etc/gone"]);
        fs::remove_file(upper.join("etc/gone")).unwrap();
        assert!(whiteouts(&upper).unwrap().is_empty());

        let opaque = upper.join("etc/conf.d");
        xattr::set(&opaque, "trusted.overlay.opaque", b"y").unwrap();
        let err = strip_overlay_attributes(&upper, &lower).unwrap_err();
        assert!(err.to_string().contains("etc/conf.d/base"), "{err}");
        fs::write(opaque.join("base"), "layer's").unwrap();
        xattr::set(&upper, "trusted.overlay.origin", b"o").unwrap();
        strip_overlay_attributes(&upper, &lower).unwrap();
        for p in [&upper, &opaque] {
            assert_eq!(xattr::list(p).unwrap().count(), 0, "{}", p.display());
        }
    }

    #[test]
    fn a_replaced_lower_file_is_refused_unless_it_is_a_merged_index() {
        let dir = tempfile::tempdir().unwrap();
        let (upper, lower) = (dir.path().join("u"), dir.path().join("l"));
        for t in [&upper, &lower] {
            fs::create_dir_all(t.join("etc")).unwrap();
            fs::write(t.join("etc/ld.so.cache"), "x").unwrap();
            fs::write(t.join("etc/hosts"), "x").unwrap();
        }
        fs::write(upper.join("etc/new"), "x").unwrap();
        assert_eq!(replaced_lower(&upper, &lower).unwrap(), ["etc/hosts"]);
    }
}
