//! What the bootstrap data asks for, independent of its format.

use std::fmt;
use std::path::PathBuf;

use crate::secrets::redact;

/// The format the bootstrap data came in.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Format {
    /// `#cloud-config` YAML. `jinja` is true when it starts with `## template: jinja` (CABPK
    /// always writes that header), so `{{ ... }}` hostname variables get substituted at stage.
    CloudConfig { jinja: bool },
    /// Ignition JSON; `version` is `ignition.version` (CABPK emits `2.3.0`; 3.x is accepted too).
    Ignition { version: String },
}

/// A user or group reference: a name to look up in the base OS's files, or a numeric id.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum IdOrName {
    Id(u32),
    Name(String),
}

/// The owner of a file; `None` means root (uid/gid 0), as cloud-init and Ignition default to.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Owner {
    pub user: Option<IdOrName>,
    pub group: Option<IdOrName>,
}

/// One file to write.
#[derive(Clone, PartialEq, Eq)]
pub struct FileSpec {
    /// Absolute, normalised path on the node (no `.`/`..`, no repeated `/`).
    pub path: PathBuf,
    /// The decoded (base64, gzip, data URL) bytes.
    pub content: Vec<u8>,
    /// Permission bits (at most `0o7777`); 0o644 when the data gives none.
    pub mode: u32,
    pub owner: Owner,
    /// Append to an earlier file of the same path instead of replacing it.
    pub append: bool,
    /// The content was written as text in a jinja cloud-config, so hostname variables in it are
    /// substituted at stage time.
    pub jinja: bool,
}

impl fmt::Debug for FileSpec {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        // Contents may be keys or bootstrap tokens: only their size is shown.
        f.debug_struct("FileSpec")
            .field("path", &self.path)
            .field("content", &format_args!("<{} bytes>", self.content.len()))
            .field("mode", &format_args!("{:#o}", self.mode))
            .field("owner", &self.owner)
            .field("append", &self.append)
            .field("jinja", &self.jinja)
            .finish()
    }
}

/// A directory to create (Ignition `storage.directories`).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct DirSpec {
    pub path: PathBuf,
    pub mode: u32,
    pub owner: Owner,
}

/// A symbolic link to create (Ignition `storage.links`).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct LinkSpec {
    pub path: PathBuf,
    pub target: PathBuf,
    pub owner: Owner,
}

/// A user account to create or extend.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct UserSpec {
    pub name: String,
    pub gecos: Option<String>,
    pub home: Option<String>,
    pub shell: Option<String>,
    pub primary_group: Option<String>,
    /// Supplementary groups (created when missing, as cloud-init does).
    pub groups: Vec<String>,
    /// sudoers rules, e.g. `ALL=(ALL) NOPASSWD:ALL`.
    pub sudo: Vec<String>,
    pub ssh_authorized_keys: Vec<String>,
    pub uid: Option<u32>,
    pub system: bool,
    pub no_create_home: bool,
}

/// A group to create (cloud-config `groups`, Ignition `passwd.groups`).
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct GroupSpec {
    pub name: String,
    pub gid: Option<u32>,
    /// Members to add (cloud-config `groups: [{name: [members]}]`).
    pub members: Vec<String>,
}

/// A systemd drop-in of an Ignition unit.
#[derive(Clone, PartialEq, Eq)]
pub struct DropIn {
    pub name: String,
    pub contents: String,
}

impl fmt::Debug for DropIn {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("DropIn")
            .field("name", &self.name)
            .field("contents", &format_args!("<{} bytes>", self.contents.len()))
            .finish()
    }
}

/// A systemd unit from Ignition's `systemd.units`.
#[derive(Clone, PartialEq, Eq)]
pub struct UnitSpec {
    pub name: String,
    /// `Some(true)`: enable (symlinks from its `[Install]` targets); `Some(false)`/`None`: leave.
    pub enabled: Option<bool>,
    pub mask: bool,
    /// The unit file; `None` for a unit the base OS ships (only enabled or masked here).
    pub contents: Option<String>,
    pub dropins: Vec<DropIn>,
}

impl fmt::Debug for UnitSpec {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("UnitSpec")
            .field("name", &self.name)
            .field("enabled", &self.enabled)
            .field("mask", &self.mask)
            .field(
                "contents",
                &self
                    .contents
                    .as_ref()
                    .map(|c| format!("<{} bytes>", c.len())),
            )
            .field("dropins", &self.dropins)
            .finish()
    }
}

/// What kubeadm does on first boot.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum KubeadmAction {
    /// `kubeadm init`: the first control-plane node.
    Init,
    /// `kubeadm join`; `control_plane` when the JoinConfiguration has a `controlPlane:` section
    /// or the command says `--control-plane`.
    Join { control_plane: bool },
}

/// The node's role: the one type the layer rules select by (`control-plane`, `worker`).
pub use ingot_layers::select::Role;

/// Parsed bootstrap data: everything the node should get, in the order the data gives it.
#[derive(Clone, PartialEq, Eq)]
pub struct Bootstrap {
    pub format: Format,
    /// `hostname` (cloud-config); Ignition has none (the file `/etc/hostname` may be among files).
    pub hostname: Option<String>,
    /// `fqdn` (cloud-config).
    pub fqdn: Option<String>,
    pub files: Vec<FileSpec>,
    pub dirs: Vec<DirSpec>,
    pub links: Vec<LinkSpec>,
    pub users: Vec<UserSpec>,
    pub groups: Vec<GroupSpec>,
    /// `ssh_authorized_keys` at the top of a cloud-config (the distro's default user; ingot has
    /// none, so they go to root and a warning says so).
    pub root_authorized_keys: Vec<String>,
    /// cloud-config `bootcmd`, as shell lines (run once, before `commands`).
    pub boot_commands: Vec<String>,
    /// cloud-config `runcmd`, as shell lines in order (argv lists are shell-quoted).
    pub commands: Vec<String>,
    /// Ignition `systemd.units`.
    pub units: Vec<UnitSpec>,
    pub kubeadm: Option<KubeadmAction>,
    /// Every key or value that was not understood or not applied, naming it.
    pub warnings: Vec<String>,
}

impl Bootstrap {
    /// Nothing yet, in `format`: what each parser starts from.
    pub(crate) fn empty(format: Format) -> Bootstrap {
        Bootstrap {
            format,
            hostname: None,
            fqdn: None,
            files: Vec::new(),
            dirs: Vec::new(),
            links: Vec::new(),
            users: Vec::new(),
            groups: Vec::new(),
            root_authorized_keys: Vec::new(),
            boot_commands: Vec::new(),
            commands: Vec::new(),
            units: Vec::new(),
            kubeadm: None,
            warnings: Vec::new(),
        }
    }

    /// ControlPlane for `kubeadm init` and for a control-plane join; Worker otherwise (including
    /// data without any kubeadm command).
    pub fn role(&self) -> Role {
        match self.kubeadm {
            Some(KubeadmAction::Init)
            | Some(KubeadmAction::Join {
                control_plane: true,
            }) => Role::ControlPlane,
            _ => Role::Worker,
        }
    }
}

impl fmt::Debug for Bootstrap {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        // Commands can carry bootstrap tokens (`kubeadm join --token ...`): redacted.
        let redacted = |v: &[String]| v.iter().map(|c| redact(c)).collect::<Vec<_>>();
        f.debug_struct("Bootstrap")
            .field("format", &self.format)
            .field("hostname", &self.hostname)
            .field("fqdn", &self.fqdn)
            .field("files", &self.files)
            .field("dirs", &self.dirs)
            .field("links", &self.links)
            .field("users", &self.users)
            .field("groups", &self.groups)
            .field("root_authorized_keys", &self.root_authorized_keys)
            .field("boot_commands", &redacted(&self.boot_commands))
            .field("commands", &redacted(&self.commands))
            .field("units", &self.units)
            .field("kubeadm", &self.kubeadm)
            .field("warnings", &self.warnings)
            .finish()
    }
}
