//! Cluster API bootstrap data for ingot's per-node layer.
//!
//! Cluster API's kubeadm bootstrap provider (CABPK) hands every machine a blob of bootstrap data:
//! a cloud-config document (`#cloud-config`, the default) or an Ignition config (JSON, CABPK's
//! `format: ignition`). ingot has no cloud-init and no Ignition on the node, so `ingot-writer`
//! turns that blob into files of the sealed per-node layer before the first boot:
//!
//! 1. [`parse`] reads the bytes into a [`Bootstrap`]: the files to write, users, commands, units,
//!    the kubeadm action (and from it the node's [`Role`]), and a list of warnings naming every key
//!    that was not understood or not applied. Nothing is dropped silently.
//! 2. [`stage()`] turns a [`Bootstrap`] plus the machine's facts ([`StageInput`]: machine name, the
//!    base OS's `/etc/passwd` and `/etc/group`, network, node labels) into a [`Staged`] tree:
//!    an ordered, deterministic list of directories, files and symlinks with numeric owners, and
//!    the list of secret paths. [`Staged::to_tree`] hands it to the layer builder as a file tree,
//!    which the writer seals into the per-node layer.
//!
//! Nothing here touches the running system: all input comes in as bytes and text, all output is
//! returned, and randomness (machine-id, SSH host keys) comes from the caller's RNG, so the same
//! input and seed give the same tree and, sealed, a byte-identical layer.
//!
//! File contents never appear in `Debug` output, in error messages or in warnings; see
//! [`secrets`] for what counts as a secret and [`redact`] for scrubbing free text.
//!
//! `docs/bootstrap.md` describes what is accepted, where each file is staged and the secret rules.

mod kubelet;
mod layer;
mod model;
mod parse;
mod preload;
mod rescue_net;
pub mod secrets;
mod shell;
mod stage;

pub use kubelet::serving_cert_warnings;
pub use model::{
    Bootstrap, DirSpec, DropIn, FileSpec, Format, GroupSpec, IdOrName, KubeadmAction, LinkSpec,
    Owner, Role, UnitSpec, UserSpec,
};
pub use parse::{
    parse, ParseError, MAX_ENTRIES, MAX_FILE_SIZE, MAX_INPUT_SIZE, MAX_TOTAL_SIZE, MAX_YAML_DEPTH,
};
pub use preload::preload_warnings;
pub use rescue_net::{network_from_ip_json, IpJsonError};
pub use secrets::redact;
pub use stage::{
    stage, Entry, EntryKind, Interface, Network, StageError, StageInput, StageOptions, Staged,
    RELOCATED_DIRS,
};
