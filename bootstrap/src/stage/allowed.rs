//! The per-node layer's allow-list (boot contract version 3, `docs/bootstrap.md`): what a
//! node's identity and bootstrap need, nothing that could shadow or alter the release.
//!
//! The node layer is the highest layer of `/`, sealed for the machine's life: whatever it holds
//! hides the same path of every verified stack layer. So it may only carry paths under `/etc`,
//! `/root` and `/home` (and files for the tmpfs directories `/run` and `/tmp`, which are staged
//! under `/etc/ingot/` and copied back on first boot), and not even all of `/etc`: not the
//! dynamic loader's configuration (`/etc/ld.so.preload` loads a library into every program), not
//! systemd's manager configuration or generators (they change every unit), and in systemd's unit
//! directories (`unit_dirs`: `/etc/systemd/system`, `system.control`, `user`, `/run/systemd/...`,
//! ...) only valid unit names, and no drop-in for a unit the bootstrap data does not bring itself.
//! Paths under `/run` are checked too: the first-boot script copies them there.

use std::path::{Component, Path};

use super::unit_dirs;
pub(super) use super::unit_dirs::OwnUnits;
use super::StageError;

/// Paths under `/etc` (and `/run`, through the first-boot copy) that change how every program or
/// service runs, with why they are refused.
const DENIED: &[(&str, &str)] = &[
    (
        "/etc/ld.so.preload",
        "the dynamic loader would load it into every program",
    ),
    (
        "/etc/ld.so.conf",
        "the dynamic loader's search path decides which libraries every program runs",
    ),
    (
        "/etc/ld.so.conf.d",
        "the dynamic loader's search path decides which libraries every program runs",
    ),
    (
        "/etc/ld.so.cache",
        "the dynamic loader's cache decides which libraries every program runs",
    ),
    ("/etc/systemd/system.conf", MANAGER),
    ("/etc/systemd/system.conf.d", MANAGER),
    ("/run/systemd/system.conf.d", MANAGER),
    ("/etc/systemd/user.conf", USER_MANAGER),
    ("/etc/systemd/user.conf.d", USER_MANAGER),
    ("/run/systemd/user.conf.d", USER_MANAGER),
    ("/etc/systemd/system-generators", GENERATOR),
    ("/run/systemd/system-generators", GENERATOR),
    ("/etc/systemd/user-generators", GENERATOR),
    ("/run/systemd/user-generators", GENERATOR),
    ("/etc/systemd/system-environment-generators", ENV_GENERATOR),
    ("/run/systemd/system-environment-generators", ENV_GENERATOR),
    ("/etc/systemd/user-environment-generators", ENV_GENERATOR),
    ("/run/systemd/user-environment-generators", ENV_GENERATOR),
];

const MANAGER: &str =
    "systemd's manager settings (DefaultEnvironment=, ...) change every unit of the release";
const USER_MANAGER: &str =
    "the user manager's settings (DefaultEnvironment=, ...) change every user unit";
const GENERATOR: &str = "a generator runs at every boot and daemon-reload and may rewrite any unit";
const ENV_GENERATOR: &str = "an environment generator changes the environment of every unit";

/// Whether `path` is absolute and plain: no `.`, `..` or empty components.
fn plain(path: &Path) -> bool {
    let text = path.to_string_lossy();
    path.is_absolute()
        && !text.contains("//")
        && path
            .components()
            .all(|c| matches!(c, Component::RootDir | Component::Normal(_)))
}

/// `path` strictly below `dir`.
fn below(path: &Path, dir: &str) -> bool {
    path.starts_with(dir) && path != Path::new(dir)
}

fn refused(path: &Path, origin: &str, reason: impl Into<String>) -> StageError {
    StageError::NotAllowed {
        path: path.display().to_string(),
        origin: origin.to_string(),
        reason: reason.into(),
    }
}

/// Checks one path the bootstrap data (`origin`: where in it) would put into the node layer.
/// Paths under `/run`, `/var/run` and `/tmp` are staged under `/etc/ingot/` instead and checked
/// where the first-boot copy puts them.
pub(super) fn check_path(
    path: &Path,
    origin: &str,
    own_units: &OwnUnits,
) -> Result<(), StageError> {
    if !plain(path) {
        return Err(refused(
            path,
            origin,
            "is not a plain absolute path (no `.`, `..` or `//`)",
        ));
    }
    // Under the kernel's own mounts: the tree's own, more precise refusal.
    super::tree::Tree::check_visible(path)?;
    let relocated = super::relocate(path).is_some();
    if !relocated && !["/etc", "/root", "/home"].iter().any(|d| below(path, d)) {
        let shadows = if path.starts_with("/var") {
            "/var is the var partition, mounted over the layers at boot: it would never be seen"
        } else {
            "it would shadow the release's own files on every boot"
        };
        return Err(refused(
            path,
            origin,
            format!(
                "the per-node layer may only carry paths under /etc, /root and /home \
                 (docs/bootstrap.md): {shadows}"
            ),
        ));
    }
    // A relocated path is checked where the first-boot copy puts it.
    let node = unit_dirs::on_node(path);
    if let Some((_, why)) = DENIED.iter().find(|(d, _)| node.starts_with(d)) {
        return Err(refused(
            path,
            origin,
            format!("the per-node layer may not carry it: {why}"),
        ));
    }
    match unit_dirs::refusal(path, own_units) {
        Some(why) => Err(refused(path, origin, why)),
        None => Ok(()),
    }
}

/// A home directory the stage makes (or puts `.ssh/authorized_keys` into) for `user`: `/root`
/// for uid 0, otherwise strictly below `/home`. Anything else would make an existing system
/// directory (`/`, `/usr`, `/etc`, `/home` itself) the user's, mode 0700, in the sealed layer.
pub(super) fn check_home(user: &str, uid: u32, home: &str) -> Result<(), StageError> {
    let path = Path::new(home);
    let origin = format!("users {user:?} homedir");
    if !plain(path) {
        return Err(refused(
            path,
            &origin,
            "is not a plain absolute path (no `.`, `..` or `//`)",
        ));
    }
    let ok = if uid == 0 {
        path == Path::new("/root") || below(path, "/home")
    } else {
        below(path, "/home")
    };
    if ok {
        return Ok(());
    }
    Err(refused(
        path,
        &origin,
        "a home directory the stage makes must be strictly below /home (/root for root): \
         this is an existing system directory or outside what the per-node layer may carry, \
         and would become the user's (mode 0700) in the sealed layer",
    ))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn paths() {
        let own: OwnUnits = [(
            unit_dirs::Manager::System,
            "ingot-check.service".to_string(),
        )]
        .into();
        let ok = |p: &str| check_path(Path::new(p), "t", &own);
        for p in [
            "/etc/kubernetes/pki/ca.crt",
            "/etc/systemd/system/ingot-check.service",
            "/etc/systemd/system/ingot-check.service.d/10.conf",
            "/etc/systemd/system/multi-user.target.wants/ingot-check.service",
            "/root/.ssh/authorized_keys",
            "/home/capi/x",
            "/run/kubeadm/kubeadm.yaml",
            "/tmp/x",
        ] {
            ok(p).unwrap_or_else(|e| panic!("{p}: {e}"));
        }
        for (p, why) in [
            ("/usr/bin/kubelet", "only carry paths under /etc"),
            ("/usr", "only carry paths under /etc"),
            ("/etc", "only carry paths under /etc"),
            ("/opt/cni/bin/x", "only carry paths under /etc"),
            ("/var/lib/kubelet/config.yaml", "var partition"),
            ("/etc/ld.so.preload", "every program"),
            ("/etc/ld.so.conf.d/x.conf", "search path"),
            ("/etc/systemd/system.conf.d/env.conf", "DefaultEnvironment"),
            (
                "/etc/systemd/system/containerd.service.d/x.conf",
                "containerd.service",
            ),
            ("/etc/x/../../usr/bin/kubelet", "plain"),
            ("/etc//x", "plain"),
        ] {
            let e = ok(p).unwrap_err().to_string();
            assert!(e.contains(why) && e.contains(p), "{p}: {e}");
        }
    }

    #[test]
    fn homes() {
        check_home("capi", 1001, "/home/capi").unwrap();
        check_home("root", 0, "/root").unwrap();
        for h in [
            "/usr",
            "/",
            "/etc",
            "/home",
            "/root",
            "/var/lib/x",
            "/home/../usr",
        ] {
            let e = check_home("capi", 1001, h).unwrap_err().to_string();
            assert!(e.contains("users \"capi\" homedir"), "{h}: {e}");
        }
    }
}
