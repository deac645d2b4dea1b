//! Every directory systemd reads units, drop-ins and dependency links from (systemd.unit(5),
//! "Unit File Load Path", for the system and the user managers), and systemd's unit name rules.
//!
//! In any of them the per-node layer may carry a unit under a valid name, a drop-in directory
//! only for a unit the data brings itself, and `.wants/`, `.requires/`, `.upholds/` links for a
//! named unit; never a type-level drop-in (`service.d/`: every service) or a prefix drop-in
//! (`systemd-.service.d/`: every unit whose name starts with `systemd-`). systemd reads the
//! type-level and prefix names for the dependency directories too.

use std::collections::BTreeSet;
use std::path::{Component, Path, PathBuf};

/// systemd's unit types: the suffix after a unit name's last `.` (`unit_type_from_string`).
const UNIT_TYPES: &[&str] = &[
    "service",
    "socket",
    "target",
    "device",
    "mount",
    "automount",
    "swap",
    "timer",
    "path",
    "slice",
    "scope",
];

/// systemd's `UNIT_NAME_MAX` less its NUL.
const MAX_UNIT_NAME: usize = 255;

/// The system manager's unit directories the per-node layer could reach (`/etc`, and `/run`
/// through the first-boot copy); `systemd-analyze unit-paths`.
const SYSTEM_DIRS: &[&str] = &[
    "/etc/systemd/system.control",
    "/run/systemd/system.control",
    "/run/systemd/transient",
    "/run/systemd/generator.early",
    "/etc/systemd/system",
    "/etc/systemd/system.attached",
    "/run/systemd/system",
    "/run/systemd/system.attached",
    "/run/systemd/generator",
    "/run/systemd/generator.late",
];

/// Every user manager's: `systemd-analyze --global unit-paths` and `$XDG_CONFIG_DIRS`.
const GLOBAL_USER_DIRS: &[&str] = &[
    "/etc/systemd/user",
    "/etc/xdg/systemd/user",
    "/run/systemd/user",
];

/// One user's, below the home directory (`~/.config`, `~/.local/share`).
const HOME_USER_DIRS: &[&str] = &[
    ".config/systemd/user.control",
    ".config/systemd/user",
    ".local/share/systemd/user",
];

/// One user's, below `$XDG_RUNTIME_DIR` (`/run/user/UID`).
const RUNTIME_USER_DIRS: &[&str] = &[
    "systemd/user.control",
    "systemd/transient",
    "systemd/generator.early",
    "systemd/user",
    "systemd/generator",
    "systemd/generator.late",
];

/// Directories beside a unit that systemd reads for it: drop-ins, then dependency links.
const UNIT_DIR_SUFFIXES: &[&str] = &[".d", ".wants", ".requires", ".upholds"];

/// Which manager reads a unit directory: units and drop-ins of one do not apply to another.
#[derive(Debug, Clone, PartialEq, Eq, PartialOrd, Ord)]
pub(super) enum Manager {
    System,
    /// Every user's (`/etc/systemd/user`, ...).
    AllUsers,
    /// One user's: the home or runtime directory its unit directory is in.
    User(PathBuf),
}

impl Manager {
    /// Whether a unit in `self`'s directories is seen by the manager reading `dir`.
    fn seen_by(&self, dir: &Manager) -> bool {
        self == dir || (*self == Manager::AllUsers && matches!(dir, Manager::User(_)))
    }
}

/// The units the bootstrap data brings itself (unit files, not links), by manager.
pub(super) type OwnUnits = BTreeSet<(Manager, String)>;

/// Where `path` is on the running node: the first-boot script copies `/etc/ingot/run` to
/// `/run`, and `/var/run` is `/run`.
pub(super) fn on_node(path: &Path) -> PathBuf {
    for (from, to) in [("/etc/ingot/run", "/run"), ("/var/run", "/run")] {
        if let Ok(rest) = path.strip_prefix(from) {
            return Path::new(to).join(rest);
        }
    }
    path.to_path_buf()
}

/// The unit directory `path` is in (as the node sees it): its manager, the directory, and the
/// rest of the path below it.
pub(super) fn unit_dir(path: &Path) -> Option<(Manager, PathBuf, PathBuf)> {
    let path = on_node(path);
    let found = |m: Manager, dir: PathBuf| {
        let rest = path.strip_prefix(&dir).ok()?.to_path_buf();
        Some((m, dir, rest))
    };
    for d in SYSTEM_DIRS {
        if let Some(f) = found(Manager::System, PathBuf::from(d)) {
            return Some(f);
        }
    }
    for d in GLOBAL_USER_DIRS {
        if let Some(f) = found(Manager::AllUsers, PathBuf::from(d)) {
            return Some(f);
        }
    }
    let parts: Vec<Component> = path.components().collect();
    // /run/user/UID/systemd/...
    if parts.len() >= 4 && path.starts_with("/run/user") {
        let runtime: PathBuf = parts[..4].iter().collect();
        for d in RUNTIME_USER_DIRS {
            if let Some(f) = found(Manager::User(runtime.clone()), runtime.join(d)) {
                return Some(f);
            }
        }
    }
    // A home: /root or anything below /home, holding .config/systemd/user or the like.
    if path.starts_with("/root") || path.starts_with("/home") {
        for i in 2..parts.len() {
            let home: PathBuf = parts[..i].iter().collect();
            for d in HOME_USER_DIRS {
                if let Some(f) = found(Manager::User(home.clone()), home.join(d)) {
                    return Some(f);
                }
            }
        }
    }
    None
}

/// Why `name` is not a unit name systemd accepts (`unit_name_is_valid`: a name, `.`, a unit
/// type; letters, digits, `:-_.\` and `@`, at most 255 bytes; a template `foo@.service` or
/// an instance `foo@bar.service`, never a leading `@`), or `None`.
pub(super) fn unit_name_invalid(name: &str) -> Option<String> {
    if name.is_empty() || name.len() > MAX_UNIT_NAME {
        return Some(format!(
            "a unit name has 1 to {MAX_UNIT_NAME} bytes; {name:?} has {}",
            name.len()
        ));
    }
    let Some((stem, kind)) = name.rsplit_once('.').filter(|(s, _)| !s.is_empty()) else {
        return Some(format!(
            "{name:?} is not a unit name: a unit name is NAME.TYPE ({})",
            UNIT_TYPES.join(", ")
        ));
    };
    if !UNIT_TYPES.contains(&kind) {
        return Some(format!(
            "{name:?} is not a unit name: .{kind} is not a unit type ({})",
            UNIT_TYPES.join(", ")
        ));
    }
    if let Some(c) = stem
        .chars()
        .find(|c| !(c.is_ascii_alphanumeric() || ":-_.\\@".contains(*c)))
    {
        return Some(format!(
            "{name:?} is not a unit name: {c:?} is not allowed (letters, digits, `:-_.\\` and `@`)"
        ));
    }
    if stem.starts_with('@') {
        return Some(format!("{name:?} is not a unit name: it starts with `@`"));
    }
    None
}

/// A prefix name (`foo-.service`): systemd reads its drop-ins and links for every unit whose
/// name starts with `foo-` (the root slice and mount, `-.slice`, are units of their own).
fn is_prefix(name: &str) -> bool {
    let stem = name.rsplit_once('.').map_or(name, |(s, _)| s);
    !stem.contains('@') && stem.len() > 1 && stem.ends_with('-')
}

/// Whether the data brings `name` for the manager reading `dir`: the unit itself, or for an
/// instance (`foo@bar.service`) its template.
fn owned(own: &OwnUnits, dir: &Manager, name: &str) -> bool {
    let template = name.split_once('@').and_then(|(head, tail)| {
        let (_, kind) = tail.rsplit_once('.')?;
        Some(format!("{head}@.{kind}"))
    });
    own.iter()
        .any(|(m, n)| m.seen_by(dir) && (n == name || Some(n) == template.as_ref()))
}

/// Why the node layer may not carry `path`, or `None`: only what systemd reads as units, drop-ins
/// the data owns and dependency links, under valid names, in any unit directory.
pub(super) fn refusal(path: &Path, own: &OwnUnits) -> Option<String> {
    let (manager, dir, rest) = unit_dir(path)?;
    let mut parts = rest.components().map(|c| c.as_os_str().to_string_lossy());
    let first = parts.next()?;
    let second = parts.next();
    let deeper = parts.next().is_some();
    let dir = dir.display();
    let Some((unit, suffix)) = UNIT_DIR_SUFFIXES
        .iter()
        .find_map(|s| first.strip_suffix(s).map(|u| (u, *s)))
    else {
        return match second {
            None => unit_name_invalid(&first)
                .map(|why| format!("in {dir}, systemd's unit directory: {why}")),
            Some(_) => Some(format!(
                "{first}/ in {dir}, systemd's unit directory, is not a drop-in (NAME.d/) or \
                 dependency (NAME.wants/, .requires/, .upholds/) directory"
            )),
        };
    };
    if UNIT_TYPES.contains(&unit) {
        return Some(format!(
            "{first}/ in {dir} is a type-level {suffix} directory: systemd applies it to every \
             {unit} unit, the release's too"
        ));
    }
    if let Some(why) = unit_name_invalid(unit) {
        return Some(format!("{first}/ in {dir}: {why}"));
    }
    if is_prefix(unit) {
        let prefix = unit.rsplit_once('.').map_or(unit, |(s, _)| s);
        return Some(format!(
            "{first}/ in {dir} is a prefix {suffix} directory: systemd applies it to every unit \
             whose name starts with {prefix:?}, the release's too"
        ));
    }
    if suffix == ".d" {
        if !owned(own, &manager, unit) {
            return Some(format!(
                "a drop-in for {unit}, which the bootstrap data does not bring itself: the \
                 per-node layer may not change the release's units"
            ));
        }
        return None;
    }
    // A dependency directory holds links named after units, nothing deeper.
    match second {
        Some(link) if deeper => Some(format!(
            "{first}/{link}/ in {dir}: a {suffix} directory holds only links to units"
        )),
        Some(link) => unit_name_invalid(&link).map(|why| format!("{first}/ in {dir}: {why}")),
        None => None,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn names() {
        for ok in [
            "a.service",
            "foo@.service",
            "foo@bar.service",
            "a@b@c.service",
            "-.slice",
            "dev-sda1.device",
            "a\\x2db.mount",
            ".x.service",
        ] {
            assert_eq!(unit_name_invalid(ok), None, "{ok}");
        }
        let long = format!("{}.service", "a".repeat(MAX_UNIT_NAME - 8));
        assert_eq!(unit_name_invalid(&long), None);
        for bad in [
            "",
            "service",
            ".service",
            "x.bogus",
            "a b.service",
            "@a.service",
            "ä.service",
            "a/b.service",
        ] {
            assert!(unit_name_invalid(bad).is_some(), "{bad}");
        }
        assert!(unit_name_invalid(&format!("a{long}")).is_some());
        assert!(is_prefix("foo-.service") && is_prefix("systemd-.service"));
        assert!(!is_prefix("-.slice") && !is_prefix("foo-@.service") && !is_prefix("a-b.service"));
    }

    #[test]
    fn directories() {
        let sys = |p: &str| unit_dir(Path::new(p));
        assert_eq!(
            sys("/etc/systemd/system.control/x").unwrap().0,
            Manager::System
        );
        assert_eq!(
            sys("/etc/ingot/run/systemd/system/x").unwrap().1,
            Path::new("/run/systemd/system")
        );
        assert_eq!(
            sys("/var/run/systemd/transient/x").unwrap().1,
            Path::new("/run/systemd/transient")
        );
        assert_eq!(
            sys("/home/capi/.config/systemd/user/x.service").unwrap().0,
            Manager::User("/home/capi".into())
        );
        assert_eq!(
            sys("/root/.local/share/systemd/user/x.service").unwrap().0,
            Manager::User("/root".into())
        );
        assert_eq!(
            sys("/run/user/1000/systemd/user.control/x").unwrap().0,
            Manager::User("/run/user/1000".into())
        );
        assert_eq!(sys("/etc/xdg/systemd/user/x").unwrap().0, Manager::AllUsers);
        assert!(sys("/etc/systemd/systemd.conf").is_none());
        assert!(sys("/etc/systemd/network/x").is_none());
        assert!(sys("/home/capi/.config/x").is_none());
    }
}
