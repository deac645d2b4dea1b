//! `stage`: the per-node files from the bootstrap data (hostname, kubeadm or Ignition config,
//! accounts, SSH host keys, static network settings, node labels).
//!
//! Reads the verified base layer's `/etc/passwd` and `/etc/group` (owners are staged as the base
//! layer knows them), the checked bootstrap data, the rescue system's network settings and the
//! request's labels; returns the [`Staged`] files, warnings reported (also every preloaded image
//! of the machine's layers that is not the one the bootstrap data's kubeadm configuration makes
//! kubeadm use, `ingot_bootstrap::preload_warnings`).

use ingot_bootstrap::{Network, StageInput, StageOptions, Staged};
use ingot_machine::host::Host;
use ingot_machine::Sysroot;
use rand::SeedableRng;

use ingot_artifact::layerfs::LayerFsError;

use crate::report::{Reporter, Stage};
use crate::request::ProvisionRequest;
use crate::stack::{OpenedStack, StackError};
use crate::steps::check::Checked;

/// Why the per-node files could not be staged.
#[derive(Debug, thiserror::Error)]
pub enum StageStepError {
    #[error("reading the base layer for staging")]
    Base(#[from] StackError),
    /// The base layer's accounts, needed to stage owners, could not be read.
    #[error("reading the base layer's {path} for staging")]
    BaseFile {
        path: &'static str,
        #[source]
        source: LayerFsError,
    },
    #[error("the base layer's {path} is not UTF-8")]
    NotUtf8 { path: &'static str },
    #[error("staging the per-node files")]
    Stage(#[from] ingot_bootstrap::StageError),
}

pub fn run(
    opened: &OpenedStack,
    checked: Checked,
    sysroot: &Sysroot,
    req: &ProvisionRequest,
    reporter: &Reporter,
) -> Result<Staged, StageStepError> {
    reporter.stage(
        Stage::Staging,
        format!("staging the per-node files for {}", req.machine_name),
    );
    let base = opened.base_fs()?;
    let text = |path: &'static str| -> Result<String, StageStepError> {
        let bytes = base
            .read(path)
            .map_err(|source| StageStepError::BaseFile { path, source })?;
        String::from_utf8(bytes).map_err(|_| StageStepError::NotUtf8 { path })
    };
    let (passwd, group) = (text("/etc/passwd"), text("/etc/group"));
    for w in opened.take_frame_warnings() {
        reporter.warning(Stage::Staging, w);
    }
    let (base_passwd, base_group) = (passwd?, group?);
    let network = read_network(sysroot, req.host.as_ref(), reporter);
    let Checked {
        facts,
        bootstrap,
        role,
        ..
    } = checked;
    let preload_warnings = ingot_bootstrap::preload_warnings(&bootstrap, &preloads(opened));
    let mut labels = req.labels.clone();
    labels.insert("ingot.dev/role".into(), role.as_str().into());
    if facts.nvidia_gpu {
        labels.insert("ingot.dev/gpu".into(), "nvidia".into());
    }
    if facts.virtualization {
        labels.insert("ingot.dev/virtualization".into(), "true".into());
    }
    let input = StageInput {
        bootstrap,
        machine_name: req.machine_name.clone(),
        base_passwd,
        base_group,
        network,
        labels,
        options: StageOptions::default(),
    };
    let mut rng = rand::rngs::StdRng::from_entropy();
    let staged = ingot_bootstrap::stage(&input, &mut rng)?;
    for w in staged.warnings.iter().chain(&preload_warnings) {
        reporter.warning(Stage::Staging, w.clone());
    }
    reporter.detail(
        "staged",
        serde_json::json!({
            "hostname": staged.hostname,
            "role": staged.role.as_str(),
            "entries": staged.entries.len(),
            "secrets": staged.secrets.len(),
        }),
    );
    Ok(staged)
}

/// The references of the images preloaded in this machine's layers.
fn preloads(opened: &OpenedStack) -> Vec<String> {
    opened
        .layers()
        .iter()
        .flat_map(|l| l.entry.preload.iter().map(|p| p.reference.clone()))
        .collect()
}

/// The rescue system's network settings, to give the node the same static addresses
/// (`ingot_bootstrap::network_from_ip_json`): from `ip -json` (iproute2) through the run's host;
/// DNS from `<sysroot>/etc/resolv.conf`. Missing or unreadable pieces are a warning: the node
/// then uses DHCP.
fn read_network(sysroot: &Sysroot, host: &dyn Host, reporter: &Reporter) -> Option<Network> {
    let output = |args: &[&str]| -> Option<Vec<u8>> {
        let out = host.run("ip", args).ok()?;
        out.status.success().then_some(out.stdout)
    };
    let addr = output(&["-json", "addr", "show"]);
    let route4 = output(&["-json", "route", "show"]);
    let route6 = output(&["-6", "-json", "route", "show"]);
    let resolv = std::fs::read_to_string(sysroot.path("/etc/resolv.conf")).unwrap_or_default();
    let read = match (addr, route4) {
        (Some(addr), Some(route4)) => {
            ingot_bootstrap::network_from_ip_json(&addr, &route4, route6.as_deref(), &resolv)
                .map_err(|e| e.to_string())
        }
        _ => Err("ip -json addr/route gave nothing".to_string()),
    };
    match read {
        Ok(network) => Some(network),
        Err(why) => {
            reporter.warning(
                Stage::Staging,
                format!(
                    "the rescue system's addresses could not be read ({why}): the node gets no \
                     static network settings and relies on DHCP"
                ),
            );
            None
        }
    }
}
