//! What a run is asked to do and what it reports back: [`WriteRequest`] writes a stack to a
//! named target, [`ProvisionRequest`] provisions a machine as CAPH runs the writer.

use std::collections::BTreeMap;
use std::path::PathBuf;
use std::sync::Arc;
use std::time::Duration;

use ingot_artifact::verify::{StackRef, Trust};
use ingot_layers::select::{Machine, Role};
use ingot_machine::host::Host;

use crate::engine::WriteOptions;
use crate::layout::DiskPlan;

/// What to write where.
#[derive(Debug, Clone)]
pub struct WriteRequest {
    pub source: StackRef,
    pub trust: Trust,
    pub machine: Machine,
    pub target: PathBuf,
    pub settings: WriteSettings,
}

/// How to write an opened stack.
#[derive(Debug, Clone)]
pub struct WriteSettings {
    pub esp_size: u64,
    /// Appended to the kernel command line after ingot's own parameters.
    pub kernel_args: Vec<String>,
    pub options: WriteOptions,
    /// This disk's place in `var`'s mirror when the node is written to several disks.
    pub mirror: Option<crate::mirror::Mirror>,
    /// How to reach a registry source (`--plain-http`, `--ca-file`, credentials, ...).
    pub registry: ingot_artifact::registry::RegistryOptions,
}

/// What was written.
#[derive(Debug, Clone)]
pub struct Outcome {
    pub manifest_digest: String,
    pub stack: String,
    /// (layer name, the root hash its tree was checked against), in stacking order.
    pub layers: Vec<(String, ingot_verity::RootHash)>,
    pub plan: DiskPlan,
    pub kernel_cmdline: String,
    /// Which boot chain the disk got.
    pub boot_chain: crate::boot::BootChain,
    pub bytes_written: u64,
    pub bytes_skipped: u64,
    pub rewrites: u32,
}

/// What a dry run found a real run would write: every step up to the plan passed, and nothing
/// was written.
#[derive(Debug, Clone)]
pub struct Planned {
    pub manifest_digest: String,
    pub stack: String,
    /// (layer name, the root hash its tree was checked against), in stacking order (the
    /// sealed node layer last).
    pub layers: Vec<(String, ingot_verity::RootHash)>,
    /// Each target and its plan, in the order a real run writes them.
    pub disks: Vec<(PathBuf, DiskPlan)>,
    /// The commands a real run would run first to release the targets (md arrays, LVM).
    pub teardown: Vec<String>,
    /// Provisioning: the hostname and role the node would get.
    pub node: Option<(String, Role)>,
}

/// One provisioning run.
#[derive(Debug, Clone)]
pub struct ProvisionRequest {
    pub image: StackRef,
    pub trust: Trust,
    /// CAPH's `/root/bootstrap.data`: cloud-config or Ignition.
    pub bootstrap: PathBuf,
    /// CAPH's machine name (the hostname unless the bootstrap data sets one).
    pub machine_name: String,
    /// CAPH's root device string: short names or WWNs, space-separated.
    pub root_devices: String,
    /// Where /sys, /proc and /dev are read from (`/` on a real machine).
    pub sysroot: PathBuf,
    /// Where every program the run needs is run ([`ingot_machine::host::Live`] on a real
    /// machine, [`ingot_machine::host::Fixture`] for a fixture's sysroot): chosen once.
    pub host: Arc<dyn Host>,
    /// The role, when not taken from the bootstrap data.
    pub role: Option<Role>,
    pub allow_foreign_os: bool,
    /// Minimum sequential read speed of the target in KiB/s (default: CAPH's, by disk kind).
    pub min_read_kib_s: Option<u64>,
    /// How long the read test runs.
    pub read_test: Duration,
    /// Programs that must be on PATH.
    pub required_tools: Vec<String>,
    /// Extra node labels (`key=value`).
    pub labels: BTreeMap<String, String>,
    /// What to do with the node's secrets (`--tpm`, the settings' `tpm`).
    pub tpm: crate::tpm::TpmSetting,
    /// The TPM `systemd-creds` seals with (`--tpm2-device=`): `INGOT_TPM2_DEVICE`
    /// (`swtpm:path=SOCKET` for a software TPM), else `auto` on a real machine; None on a
    /// fixture machine without it (its TPM is not reachable: nothing is sealed with the TPM of
    /// the computer the writer runs on).
    pub tpm_device: Option<String>,
    pub settings: WriteSettings,
}

/// What a successful run did.
#[derive(Debug, Clone)]
pub struct Provisioned {
    pub outcome: Outcome,
    /// The disks written, in order.
    pub disks: Vec<String>,
    pub hostname: String,
    pub role: Role,
    /// The node's secrets: sealed, or in the clear and why.
    pub secrets: crate::secrets::SecretsReport,
}
