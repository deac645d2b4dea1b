//! Staging: a [`Bootstrap`] plus the machine's facts become the per-node layer's files.

mod accounts;
mod allowed;
mod data;
mod first_boot;
mod identity;
mod jinja;
mod node;
mod tree;
mod unit_dirs;
mod units;
mod users;

use std::collections::BTreeMap;
use std::fmt;
use std::path::{Path, PathBuf};

use rand::{CryptoRng, RngCore};
use thiserror::Error;

use crate::model::{Bootstrap, Role};
use crate::secrets::{is_secret, secret_mode};
use tree::Tree;

/// Directories that are empty at boot (tmpfs), with where their files are staged instead. The
/// first-boot script copies them back (`cp -a`, keeping mode and owner) before any command runs.
pub const RELOCATED_DIRS: &[(&str, &str)] = &[
    ("/run", "/etc/ingot/run"),
    ("/var/run", "/etc/ingot/run"),
    ("/tmp", "/etc/ingot/tmp"),
];

/// Where a path from the data is staged: tmpfs directories move under `/etc/ingot/`.
pub(crate) fn relocate(path: &Path) -> Option<(PathBuf, &'static str)> {
    for (from, to) in RELOCATED_DIRS {
        if let Ok(rest) = path.strip_prefix(from) {
            if rest.as_os_str().is_empty() {
                return Some((PathBuf::from(to), to));
            }
            return Some((Path::new(to).join(rest), to));
        }
    }
    None
}

/// Directories the kernel's own filesystems (proc, sysfs, devtmpfs) cover at boot: nothing is
/// staged under them.
pub const HIDDEN_DIRS: &[&str] = &["/proc", "/sys", "/dev"];

/// Where appends to files the layer does not hold are kept until first boot.
const APPEND_DIR: &str = "/etc/ingot/append";

/// One network interface of the machine (from the rescue system's view).
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Interface {
    /// Used for the file name only; the file matches by MAC, which survives renaming.
    pub name: String,
    pub mac: String,
    /// Addresses in CIDR notation (`192.0.2.10/26`, `2001:db8::2/64`); none means DHCP.
    pub addresses: Vec<String>,
    pub gateway4: Option<String>,
    pub gateway6: Option<String>,
}

/// The machine's static network settings.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Network {
    pub interfaces: Vec<Interface>,
    /// Name servers (IP addresses), written as `DNS=` into every interface's file.
    pub dns: Vec<String>,
}

/// Switches for [`stage()`].
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct StageOptions {
    /// Generate SSH host keys (RSA 3072 takes a moment; fuzzing turns this off).
    pub host_keys: bool,
}

impl Default for StageOptions {
    fn default() -> Self {
        StageOptions { host_keys: true }
    }
}

/// Everything [`stage()`] needs besides randomness.
#[derive(Debug, Clone)]
pub struct StageInput {
    pub bootstrap: Bootstrap,
    /// CAPH's third argument; the hostname when the data sets none.
    pub machine_name: String,
    /// The base OS's `/etc/passwd` text (owner names map to ids through it).
    pub base_passwd: String,
    /// The base OS's `/etc/group` text.
    pub base_group: String,
    pub network: Option<Network>,
    /// Node labels, passed to kubelet as `--node-labels`.
    pub labels: BTreeMap<String, String>,
    pub options: StageOptions,
}

/// What a staged path is.
#[derive(Clone, PartialEq, Eq)]
pub enum EntryKind {
    Dir,
    File(Vec<u8>),
    Symlink(PathBuf),
}

/// One staged directory, file or symlink, with numeric owner.
#[derive(Clone, PartialEq, Eq)]
pub struct Entry {
    /// Absolute path on the node.
    pub path: PathBuf,
    pub kind: EntryKind,
    pub mode: u32,
    pub uid: u32,
    pub gid: u32,
}

impl fmt::Debug for EntryKind {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        // File contents (keys, tokens) are never printed, only their size.
        match self {
            EntryKind::Dir => write!(f, "dir"),
            EntryKind::File(c) => write!(f, "file <{} bytes>", c.len()),
            EntryKind::Symlink(t) => write!(f, "symlink -> {}", t.display()),
        }
    }
}

impl fmt::Debug for Entry {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(
            f,
            "{} {:?} {:04o} {}:{}",
            self.path.display(),
            self.kind,
            self.mode,
            self.uid,
            self.gid
        )
    }
}

/// The staged per-node files: sorted by path (parents before children), deterministic.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Staged {
    pub entries: Vec<Entry>,
    /// Staged paths holding secrets (mode tightened; keep them out of logs).
    pub secrets: Vec<PathBuf>,
    /// The parse warnings plus what staging could not apply.
    pub warnings: Vec<String>,
    pub hostname: String,
    pub role: Role,
}

impl Staged {
    /// The entry at `path`, if staged.
    pub fn get(&self, path: impl AsRef<Path>) -> Option<&Entry> {
        let p = path.as_ref();
        self.entries
            .binary_search_by(|e| e.path.as_path().cmp(p))
            .ok()
            .map(|i| &self.entries[i])
    }
}

/// Why staging failed; every variant names the offending input.
#[derive(Debug, Error, Clone, PartialEq, Eq)]
pub enum StageError {
    #[error("hostname {value:?}: {reason}")]
    Hostname { value: String, reason: String },
    #[error("{path}: owner {kind} {name:?} is not in {file}")]
    Owner {
        path: String,
        kind: &'static str,
        name: String,
        file: &'static str,
    },
    #[error("{file} line {line}: {reason}")]
    Accounts {
        file: String,
        line: usize,
        reason: String,
    },
    #[error("user {name:?}: {reason}")]
    User { name: String, reason: String },
    #[error("node label {key:?}={value:?}: {reason}")]
    Label {
        key: String,
        value: String,
        reason: String,
    },
    #[error("network interface {interface:?}: {reason}")]
    Network { interface: String, reason: String },
    #[error("{path}: {reason}")]
    Conflict { path: String, reason: String },
    #[error("generating SSH host key: {reason}")]
    HostKey { reason: String },
    /// A path the per-node layer may not carry (`docs/bootstrap.md`, the allow-list); `origin`
    /// says where in the bootstrap data it came from.
    #[error("{origin}: {path}: {reason}")]
    NotAllowed {
        path: String,
        origin: String,
        reason: String,
    },
}

/// Stages the per-node layer's files.
///
/// `rng` provides the machine-id and the SSH host keys; it must be a cryptographic RNG (the
/// writer passes `OsRng`-seeded `StdRng`; tests pass a seeded one for byte-identical output).
///
/// See `docs/bootstrap.md` for every path staged; in short: the data's files (tmpfs paths under
/// `/etc/ingot/`), `/etc/hostname`, `/etc/hosts`, `/etc/machine-id`, SSH host keys, accounts,
/// authorized keys, sudoers, networkd files, `/etc/default/kubelet`, `/etc/ingot/node.json`,
/// Ignition units, and the first-boot script `/etc/ingot/bootstrap.sh` that the base's
/// `ingot-bootstrap.service` runs once.
pub fn stage<R: RngCore + CryptoRng>(
    input: &StageInput,
    rng: &mut R,
) -> Result<Staged, StageError> {
    let b = &input.bootstrap;
    let own_units = own_units(b);
    let mut tree = Tree::new(b.warnings.clone());
    tree.warnings
        .extend(crate::kubelet::serving_cert_warnings(b));
    let host = identity::stage_identity(&mut tree, input, rng)?;
    let role = b.role();
    identity::stage_node_facts(&mut tree, input, &host, role)?;
    let accounts = users::stage_accounts(&mut tree, input)?;
    let deferred = data::stage_data(&mut tree, b, &accounts, &host, &own_units)?;
    units::stage_units(&mut tree, &b.units, &own_units)?;
    first_boot::stage_first_boot(&mut tree, input, &deferred, &host)?;
    check_tree(&tree, &own_units)?;
    let secrets = tighten_secrets(&mut tree);
    Ok(Staged {
        entries: tree.map.into_values().collect(),
        secrets,
        warnings: tree.warnings,
        hostname: host,
        role,
    })
}

/// The units the bootstrap data brings itself: its files directly in a unit directory under a
/// valid unit name (not links: a link is an alias, and an alias's drop-ins apply to its target),
/// and its Ignition units with contents.
fn own_units(b: &Bootstrap) -> allowed::OwnUnits {
    let files = b.files.iter().filter_map(|f| {
        let (manager, _, rest) = unit_dirs::unit_dir(&f.path)?;
        let name = rest
            .to_str()
            .filter(|n| !n.is_empty() && !n.contains('/'))?;
        unit_dirs::unit_name_invalid(name)
            .is_none()
            .then(|| (manager, name.to_string()))
    });
    let units = b
        .units
        .iter()
        .filter(|u| u.contents.is_some() && !u.mask)
        .map(|u| (unit_dirs::Manager::System, u.name.clone()));
    files.chain(units).collect()
}

/// The last word on the allow-list: every staged entry, whatever made it. `/etc`, `/root` and
/// `/home` themselves only as the plain parents the tree makes (the base's modes, root's).
fn check_tree(tree: &Tree, own_units: &allowed::OwnUnits) -> Result<(), StageError> {
    for e in tree.map.values() {
        if ["/etc", "/root", "/home"]
            .iter()
            .any(|d| e.path == Path::new(d))
        {
            if e.kind == EntryKind::Dir
                && e.mode == tree::parent_mode(&e.path)
                && e.uid == 0
                && e.gid == 0
            {
                continue;
            }
            return Err(StageError::NotAllowed {
                path: e.path.display().to_string(),
                origin: "the staged per-node files".to_string(),
                reason:
                    "the per-node layer may not change this system directory's type, mode or owner"
                        .to_string(),
            });
        }
        allowed::check_path(&e.path, "the staged per-node files", own_units)?;
    }
    Ok(())
}

/// Tightens the mode of every staged secret and lists them.
fn tighten_secrets(tree: &mut Tree) -> Vec<PathBuf> {
    let mut secrets = Vec::new();
    for e in tree.map.values_mut() {
        if let EntryKind::File(c) = &e.kind {
            if is_secret(&e.path, c) {
                e.mode = secret_mode(e.mode);
                secrets.push(e.path.clone());
            }
        }
    }
    secrets
}
