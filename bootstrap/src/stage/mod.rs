//! Staging: a [`Bootstrap`] plus the machine's facts become the per-node layer's files.

mod accounts;
mod node;

use std::collections::{BTreeMap, BTreeSet};
use std::fmt;
use std::path::{Path, PathBuf};

use rand::{CryptoRng, RngCore};
use thiserror::Error;

use crate::model::{Bootstrap, Format, IdOrName, Owner, Role};
use crate::secrets::{is_secret, secret_mode};
use accounts::Accounts;

/// Directories that are empty at boot (tmpfs), with where their files are staged instead. The
/// first-boot script copies them back (`cp -a`, keeping mode and owner) before any command runs.
pub const RELOCATED_DIRS: &[(&str, &str)] = &[
    ("/run", "/etc/ingot/run"),
    ("/var/run", "/etc/ingot/run"),
    ("/tmp", "/etc/ingot/tmp"),
];

/// Where appends to files the layer does not hold are kept until first boot.
const APPEND_DIR: &str = "/etc/ingot/append";
const SCRIPT: &str = "/etc/ingot/bootstrap.sh";
const UNIT: &str = "/etc/systemd/system/ingot-bootstrap.service";
const DONE: &str = "/var/lib/ingot/bootstrap.done";

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
}

/// Default mode of a directory created as a parent. Overlayfs takes a merged directory's
/// metadata from the upper layer, so these must match the base OS.
fn parent_mode(path: &Path) -> u32 {
    match path.to_str() {
        Some("/root") => 0o700,
        Some("/tmp") | Some("/var/tmp") => 0o1777,
        _ => 0o755,
    }
}

struct Tree {
    map: BTreeMap<PathBuf, Entry>,
    generated: BTreeSet<PathBuf>,
    warnings: Vec<String>,
}

impl Tree {
    fn conflict(path: &Path, reason: &str) -> StageError {
        StageError::Conflict {
            path: path.display().to_string(),
            reason: reason.to_string(),
        }
    }

    fn parents(&mut self, path: &Path) -> Result<(), StageError> {
        let mut ancestors: Vec<&Path> = path.ancestors().skip(1).collect();
        ancestors.reverse();
        for a in ancestors {
            if a == Path::new("/") {
                continue;
            }
            match self.map.get(a) {
                Some(e) if e.kind == EntryKind::Dir => {}
                Some(_) => {
                    return Err(Self::conflict(
                        a,
                        "is a file or symlink but needed as a directory",
                    ))
                }
                None => {
                    self.map.insert(
                        a.to_path_buf(),
                        Entry {
                            path: a.to_path_buf(),
                            kind: EntryKind::Dir,
                            mode: parent_mode(a),
                            uid: 0,
                            gid: 0,
                        },
                    );
                }
            }
        }
        Ok(())
    }

    /// A directory with explicit metadata (replaces a parent created with defaults).
    fn dir(&mut self, path: &Path, mode: u32, uid: u32, gid: u32) -> Result<(), StageError> {
        self.parents(path)?;
        if let Some(e) = self.map.get(path) {
            if e.kind != EntryKind::Dir {
                return Err(Self::conflict(
                    path,
                    "is a file or symlink but also a directory",
                ));
            }
        }
        self.map.insert(
            path.to_path_buf(),
            Entry {
                path: path.to_path_buf(),
                kind: EntryKind::Dir,
                mode,
                uid,
                gid,
            },
        );
        Ok(())
    }

    /// A file or symlink; a later one replaces an earlier one.
    fn put(
        &mut self,
        path: &Path,
        kind: EntryKind,
        mode: u32,
        uid: u32,
        gid: u32,
    ) -> Result<(), StageError> {
        self.parents(path)?;
        if let Some(e) = self.map.get(path) {
            if e.kind == EntryKind::Dir {
                return Err(Self::conflict(
                    path,
                    "is a directory but also a file or symlink",
                ));
            }
        }
        self.map.insert(
            path.to_path_buf(),
            Entry {
                path: path.to_path_buf(),
                kind,
                mode,
                uid,
                gid,
            },
        );
        Ok(())
    }

    /// A file ingot generates itself (the bootstrap data may replace it, with a warning).
    fn generated(
        &mut self,
        path: &str,
        content: impl Into<Vec<u8>>,
        mode: u32,
        uid: u32,
        gid: u32,
    ) -> Result<(), StageError> {
        let p = PathBuf::from(path);
        self.put(&p, EntryKind::File(content.into()), mode, uid, gid)?;
        self.generated.insert(p);
        Ok(())
    }

    fn data_entry(
        &mut self,
        path: &Path,
        kind: EntryKind,
        mode: u32,
        uid: u32,
        gid: u32,
    ) -> Result<(), StageError> {
        if self.generated.remove(path) {
            self.warnings.push(format!(
                "{}: the bootstrap data's file replaces the one ingot generates",
                path.display()
            ));
        }
        self.put(path, kind, mode, uid, gid)
    }
}

/// Where a path from the data is staged: tmpfs directories move under `/etc/ingot/`.
fn relocate(path: &Path) -> Option<(PathBuf, &'static str)> {
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

/// Quotes a word for `sh`.
pub(crate) fn shell_quote(word: &str) -> String {
    let safe = !word.is_empty()
        && word
            .bytes()
            .all(|b| b.is_ascii_alphanumeric() || b"-_./=:,+@%".contains(&b));
    if safe {
        word.to_string()
    } else {
        format!("'{}'", word.replace('\'', r"'\''"))
    }
}

/// cloud-init's jinja variables for the host name that CABPK/CAPH templates use.
const JINJA_HOSTNAME_VARS: &[&str] = &[
    "ds.meta_data.hostname",
    "ds.meta_data.local_hostname",
    "v1.local_hostname",
    "v1.hostname",
    "local_hostname",
];

/// Substitutes the known hostname variables; `true` when other `{{ ... }}` remain.
fn render_jinja(text: &str, host: &str) -> (String, bool) {
    let mut out = String::with_capacity(text.len());
    let mut rest = text;
    let mut unresolved = false;
    while let Some(start) = rest.find("{{") {
        let Some(len) = rest[start..].find("}}") else {
            break;
        };
        let inner = rest[start + 2..start + len].trim();
        out.push_str(&rest[..start]);
        if JINJA_HOSTNAME_VARS.contains(&inner) {
            out.push_str(host);
        } else {
            unresolved = true;
            out.push_str(&rest[start..start + len + 2]);
        }
        rest = &rest[start + len + 2..];
    }
    out.push_str(rest);
    (out, unresolved || rest.contains("{%"))
}

/// Targets that enable a unit, from its `[Install]` section: `(target, "wants"|"requires")`.
fn install_targets(contents: &str) -> Vec<(String, &'static str)> {
    let mut out = Vec::new();
    let mut in_install = false;
    for line in contents.lines() {
        let l = line.trim();
        if l.starts_with('[') {
            in_install = l == "[Install]";
            continue;
        }
        if !in_install {
            continue;
        }
        let Some((k, v)) = l.split_once('=') else {
            continue;
        };
        let kind = match k.trim() {
            "WantedBy" => "wants",
            "RequiredBy" => "requires",
            _ => continue,
        };
        for t in v.split_whitespace() {
            if !t.contains('/') && !t.is_empty() {
                out.push((t.to_string(), kind));
            }
        }
    }
    out
}

/// Stages the per-node layer's files.
///
/// `rng` provides the machine-id and the SSH host keys; it must be a cryptographic RNG (the
/// writer passes `OsRng`-seeded `StdRng`; tests pass a seeded one for byte-identical output).
///
/// See `docs/bootstrap.md` for every path staged; in short: the data's files (tmpfs paths under
/// `/etc/ingot/`), `/etc/hostname`, `/etc/hosts`, `/etc/machine-id`, SSH host keys, accounts,
/// authorized keys, sudoers, networkd files, `/etc/default/kubelet`, `/etc/ingot/node.json`,
/// Ignition units, and the first-boot `ingot-bootstrap.service` running `/etc/ingot/bootstrap.sh`.
pub fn stage<R: RngCore + CryptoRng>(
    input: &StageInput,
    rng: &mut R,
) -> Result<Staged, StageError> {
    let b = &input.bootstrap;
    let jinja = matches!(b.format, Format::CloudConfig { jinja: true });
    let mut tree = Tree {
        map: BTreeMap::new(),
        generated: BTreeSet::new(),
        warnings: b.warnings.clone(),
    };
    tree.warnings
        .extend(crate::kubelet::serving_cert_warnings(b));

    // Hostname: the data's (templated ones rendered with the machine name), else its fqdn's
    // first label, else the machine name.
    let data_host = b.hostname.as_deref().map(|h| {
        if jinja && h.contains("{{") {
            render_jinja(h, &input.machine_name).0
        } else {
            h.to_string()
        }
    });
    let chosen = data_host
        .or_else(|| b.fqdn.clone())
        .unwrap_or_else(|| input.machine_name.clone());
    let (host, fqdn_from_host) = node::hostname(&chosen)?;
    let fqdn = match &b.fqdn {
        Some(f) => Some(node::hostname(f)?.1.unwrap_or_else(|| f.clone())),
        None => fqdn_from_host,
    };
    tree.generated("/etc/hostname", format!("{host}\n"), 0o644, 0, 0)?;
    let names = match &fqdn {
        Some(f) if f != &host => format!("{f} {host}"),
        _ => host.clone(),
    };
    tree.generated(
        "/etc/hosts",
        format!(
            "127.0.0.1\tlocalhost\n127.0.1.1\t{names}\n::1\tlocalhost ip6-localhost ip6-loopback\nff02::1\tip6-allnodes\nff02::2\tip6-allrouters\n"
        ),
        0o644,
        0,
        0,
    )?;
    let mut id = [0u8; 16];
    rng.fill_bytes(&mut id);
    tree.generated(
        "/etc/machine-id",
        format!("{}\n", hex::encode(id)),
        0o444,
        0,
        0,
    )?;

    if input.options.host_keys {
        let comment = format!("root@{host}");
        for (name, rsa) in [("ed25519", false), ("rsa", true)] {
            let (private, public) = node::host_key(rng, rsa, &comment)?;
            tree.generated(
                &format!("/etc/ssh/ssh_host_{name}_key"),
                private,
                0o600,
                0,
                0,
            )?;
            tree.generated(
                &format!("/etc/ssh/ssh_host_{name}_key.pub"),
                public,
                0o644,
                0,
                0,
            )?;
        }
    }

    if let Some(net) = &input.network {
        for (file, text) in node::network_files(net)? {
            tree.generated(&format!("/etc/systemd/network/{file}"), text, 0o644, 0, 0)?;
        }
    }

    node::check_labels(&input.labels)?;
    if !input.labels.is_empty() {
        let list: Vec<String> = input
            .labels
            .iter()
            .map(|(k, v)| format!("{k}={v}"))
            .collect();
        tree.generated(
            "/etc/default/kubelet",
            format!("KUBELET_EXTRA_ARGS=--node-labels={}\n", list.join(",")),
            0o644,
            0,
            0,
        )?;
        if b.files
            .iter()
            .any(|f| f.content.windows(11).any(|w| w == b"node-labels"))
        {
            tree.warnings.push(
                "node labels: the bootstrap data also sets node-labels; kubelet takes the last --node-labels, which is /etc/default/kubelet's"
                    .to_string(),
            );
        }
    }
    let role = b.role();
    let node_json = serde_json::json!({
        "machine_name": input.machine_name,
        "hostname": host,
        "role": role.as_str(),
        "labels": input.labels,
    });
    let mut node_json = serde_json::to_vec_pretty(&node_json).expect("JSON of strings");
    node_json.push(b'\n');
    tree.generated("/etc/ingot/node.json", node_json, 0o644, 0, 0)?;

    // Accounts.
    let mut acc = Accounts::parse(&input.base_passwd, &input.base_group)?;
    acc.apply(b)?;
    tree.warnings.append(&mut acc.warnings);
    if acc.changed() {
        tree.generated("/etc/passwd", acc.passwd_file(), 0o644, 0, 0)?;
        tree.generated("/etc/group", acc.group_file(), 0o644, 0, 0)?;
    }
    let mut sudoers = String::new();
    for r in &acc.resolved {
        let home = PathBuf::from(&r.home);
        if r.create_home {
            tree.dir(&home, 0o700, r.uid, r.gid)?;
        }
        if !r.keys.is_empty() {
            let ssh = home.join(".ssh");
            tree.dir(&ssh, 0o700, r.uid, r.gid)?;
            let keys = ssh.join("authorized_keys");
            let mut text = match tree.map.get(&keys) {
                Some(Entry {
                    kind: EntryKind::File(c),
                    ..
                }) => c.clone(),
                _ => Vec::new(),
            };
            for k in &r.keys {
                text.extend_from_slice(k.as_bytes());
                text.push(b'\n');
            }
            tree.generated(&keys.display().to_string(), text, 0o600, r.uid, r.gid)?;
        }
        for rule in &r.sudo {
            sudoers.push_str(&format!("{} {}\n", r.name, rule.trim()));
        }
    }
    if !sudoers.is_empty() {
        tree.generated("/etc/sudoers.d/90-ingot-users", sudoers, 0o440, 0, 0)?;
    }

    let owner = |path: &Path, o: &Owner| -> Result<(u32, u32), StageError> {
        let p = path.display().to_string();
        let uid = match &o.user {
            None => 0,
            Some(IdOrName::Id(id)) => *id,
            Some(IdOrName::Name(n)) => acc.uid(n).ok_or_else(|| StageError::Owner {
                path: p.clone(),
                kind: "user",
                name: n.clone(),
                file: "/etc/passwd",
            })?,
        };
        let gid = match &o.group {
            None => 0,
            Some(IdOrName::Id(id)) => *id,
            Some(IdOrName::Name(n)) => acc.gid(n).ok_or_else(|| StageError::Owner {
                path: p,
                kind: "group",
                name: n.clone(),
                file: "/etc/group",
            })?,
        };
        Ok((uid, gid))
    };

    // The data's directories, files and links.
    let mut restore: BTreeSet<&'static str> = BTreeSet::new();
    let mut appends: Vec<(PathBuf, PathBuf)> = Vec::new();
    let staged_at = |path: &Path, restore: &mut BTreeSet<&'static str>| match relocate(path) {
        Some((p, root)) => {
            restore.insert(root);
            p
        }
        None => path.to_path_buf(),
    };
    for d in &b.dirs {
        let (uid, gid) = owner(&d.path, &d.owner)?;
        let at = staged_at(&d.path, &mut restore);
        tree.dir(&at, d.mode, uid, gid)?;
    }
    for f in &b.files {
        let (uid, gid) = owner(&f.path, &f.owner)?;
        let at = staged_at(&f.path, &mut restore);
        let mut content = f.content.clone();
        if f.jinja {
            if let Ok(text) = std::str::from_utf8(&content) {
                let (rendered, unresolved) = render_jinja(text, &host);
                if unresolved {
                    tree.warnings.push(format!(
                        "{}: jinja expressions other than the hostname variables are left as they are",
                        f.path.display()
                    ));
                }
                content = rendered.into_bytes();
            }
        }
        if f.append {
            match tree.map.get(&at) {
                Some(Entry {
                    kind: EntryKind::File(old),
                    ..
                }) => {
                    let mut joined = old.clone();
                    joined.extend_from_slice(&content);
                    content = joined;
                }
                Some(_) => {
                    return Err(Tree::conflict(
                        &f.path,
                        "append to a path that is not a file",
                    ))
                }
                None => {
                    let keep =
                        Path::new(APPEND_DIR).join(f.path.strip_prefix("/").unwrap_or(&f.path));
                    tree.warnings.push(format!(
                        "{}: appended on first boot (the base OS's file is not known when staging)",
                        f.path.display()
                    ));
                    tree.put(&keep, EntryKind::File(content), f.mode, uid, gid)?;
                    appends.push((keep, f.path.clone()));
                    continue;
                }
            }
        }
        tree.data_entry(&at, EntryKind::File(content), f.mode, uid, gid)?;
    }
    for l in &b.links {
        let (uid, gid) = owner(&l.path, &l.owner)?;
        let at = staged_at(&l.path, &mut restore);
        tree.data_entry(&at, EntryKind::Symlink(l.target.clone()), 0o777, uid, gid)?;
    }

    // Ignition units.
    let sysdir = Path::new("/etc/systemd/system");
    for u in &b.units {
        let unit_path = sysdir.join(&u.name);
        if let Some(c) = &u.contents {
            if !u.mask {
                tree.data_entry(
                    &unit_path,
                    EntryKind::File(c.clone().into_bytes()),
                    0o644,
                    0,
                    0,
                )?;
            }
        }
        for d in &u.dropins {
            let p = sysdir.join(format!("{}.d", u.name)).join(&d.name);
            tree.data_entry(
                &p,
                EntryKind::File(d.contents.clone().into_bytes()),
                0o644,
                0,
                0,
            )?;
        }
        if u.mask {
            if u.contents.is_some() {
                tree.warnings.push(format!(
                    "unit {}: masked, so its contents are not written",
                    u.name
                ));
            }
            tree.data_entry(
                &unit_path,
                EntryKind::Symlink("/dev/null".into()),
                0o777,
                0,
                0,
            )?;
            continue;
        }
        match u.enabled {
            Some(true) => {
                let (targets, link_to) = match &u.contents {
                    Some(c) => (install_targets(c), unit_path.clone()),
                    None => {
                        tree.warnings.push(format!(
                            "unit {}: enabled without contents; linked into multi-user.target.wants from /usr/lib/systemd/system",
                            u.name
                        ));
                        (
                            vec![("multi-user.target".to_string(), "wants")],
                            Path::new("/usr/lib/systemd/system").join(&u.name),
                        )
                    }
                };
                if targets.is_empty() {
                    tree.warnings.push(format!(
                        "unit {}: enabled but has no WantedBy=/RequiredBy=; not linked",
                        u.name
                    ));
                }
                if u.name.contains("@.") {
                    tree.warnings.push(format!(
                        "unit {}: a template unit cannot be enabled without an instance; not linked",
                        u.name
                    ));
                    continue;
                }
                for (t, kind) in targets {
                    let link = sysdir.join(format!("{t}.{kind}")).join(&u.name);
                    tree.put(&link, EntryKind::Symlink(link_to.clone()), 0o777, 0, 0)?;
                }
            }
            Some(false) => tree.warnings.push(format!(
                "unit {}: `enabled: false` cannot disable a unit the base OS enables; nothing done",
                u.name
            )),
            None => {}
        }
    }

    // The first-boot unit and script.
    let render = |c: &String| {
        if jinja {
            render_jinja(c, &host).0
        } else {
            c.clone()
        }
    };
    let boot: Vec<String> = b.boot_commands.iter().map(render).collect();
    let cmds: Vec<String> = b.commands.iter().map(render).collect();
    if !restore.is_empty() || !appends.is_empty() || !boot.is_empty() || !cmds.is_empty() {
        let mut sh = String::from(
            "#!/bin/sh\n# Written by ingot: the Cluster API bootstrap, run once on first boot by ingot-bootstrap.service.\nset -eu\nexport HOME=/root\n",
        );
        for root in &restore {
            let target = RELOCATED_DIRS
                .iter()
                .find(|(_, to)| to == root)
                .map(|(from, _)| *from)
                .unwrap_or("/run");
            // cp -a keeps modes and owners; /run and /tmp are empty tmpfs at this point.
            sh.push_str(&format!("cp -a {root}/. {target}/\n"));
        }
        for (keep, target) in &appends {
            let runtime = relocate(target)
                .map(|_| {
                    // Appends to tmpfs paths go to the live path, after the copy above.
                    target.clone()
                })
                .unwrap_or_else(|| target.clone());
            sh.push_str(&format!(
                "cat {} >> {}\n",
                shell_quote(&keep.display().to_string()),
                shell_quote(&runtime.display().to_string())
            ));
        }
        if !boot.is_empty() {
            sh.push_str("# bootcmd\n");
            for c in &boot {
                sh.push_str(c);
                sh.push('\n');
            }
        }
        if !cmds.is_empty() {
            sh.push_str("# runcmd\n");
            for c in &cmds {
                sh.push_str(c);
                sh.push('\n');
            }
        }
        sh.push_str(&format!(
            "mkdir -p {}\n: > {DONE}\n",
            Path::new(DONE).parent().unwrap().display()
        ));
        tree.generated(SCRIPT, sh, 0o700, 0, 0)?;
        let unit = format!(
            "[Unit]\nDescription=ingot first-boot bootstrap (Cluster API)\nWants=network-online.target\nAfter=network-online.target containerd.service\nBefore=kubeadm.service\nConditionPathExists=!{DONE}\n\n[Service]\nType=oneshot\nRemainAfterExit=yes\nExecStart={SCRIPT}\nStandardOutput=journal+console\n\n[Install]\nWantedBy=multi-user.target\n"
        );
        tree.generated(UNIT, unit, 0o644, 0, 0)?;
        tree.put(
            Path::new("/etc/systemd/system/multi-user.target.wants/ingot-bootstrap.service"),
            EntryKind::Symlink(PathBuf::from(UNIT)),
            0o777,
            0,
            0,
        )?;
        if !input
            .bootstrap
            .units
            .iter()
            .any(|u| u.name == "kubeadm.service")
            && b.kubeadm.is_some()
            && cmds.is_empty()
        {
            tree.warnings
                .push("kubeadm: found in files but not in runcmd; nothing runs it".to_string());
        }
    }

    // Secrets: tighten and list.
    let mut secrets = Vec::new();
    for e in tree.map.values_mut() {
        if let EntryKind::File(c) = &e.kind {
            if is_secret(&e.path, c) {
                e.mode = secret_mode(e.mode);
                secrets.push(e.path.clone());
            }
        }
    }
    Ok(Staged {
        entries: tree.map.into_values().collect(),
        secrets,
        warnings: tree.warnings,
        hostname: host,
        role,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn jinja_hostname_vars() {
        let (t, u) = render_jinja(
            "name: '{{ ds.meta_data.hostname }}' x {{v1.local_hostname}}",
            "n1",
        );
        assert_eq!(t, "name: 'n1' x n1");
        assert!(!u);
        let (t, u) = render_jinja("a {{ ds.meta_data.other }} b", "n1");
        assert_eq!(t, "a {{ ds.meta_data.other }} b");
        assert!(u);
    }

    #[test]
    fn relocation() {
        assert_eq!(
            relocate(Path::new("/run/kubeadm/kubeadm.yaml")).unwrap().0,
            Path::new("/etc/ingot/run/kubeadm/kubeadm.yaml")
        );
        assert_eq!(
            relocate(Path::new("/var/run/x")).unwrap().0,
            Path::new("/etc/ingot/run/x")
        );
        assert!(relocate(Path::new("/running")).is_none());
        assert!(relocate(Path::new("/etc/x")).is_none());
    }

    #[test]
    fn install_sections() {
        let t = install_targets("[Unit]\nWantedBy=no.target\n[Install]\nWantedBy=multi-user.target other.target\nRequiredBy=x.target\n");
        assert_eq!(
            t,
            vec![
                ("multi-user.target".to_string(), "wants"),
                ("other.target".to_string(), "wants"),
                ("x.target".to_string(), "requires")
            ]
        );
    }
}
