//! Provisioning as cluster-api-provider-hetzner (CAPH) runs it from the rescue system:
//! check the machine and the bootstrap data, gate the disks, guard other operating systems,
//! verify the stack, stage and seal the per-node layer, then write everything.
//!
//! CAPH runs none of its own disk checks on the `imageURLCommand` path, so every one of them
//! happens here, each a named stage with a named failure reason, all before the disk is touched.
//! Everything about the machine is read below a sysroot, so fixture machines test it all.

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::time::Duration;

use ingot_artifact::verify::{StackRef, Trust};
use ingot_bootstrap::{Network, StageInput, StageOptions};
use ingot_layers::select::{GpuVendor, Machine, Role};
use ingot_machine::{
    Facts, FixtureSmart, GateFailure, GateReport, GuardOptions, SmartSource, Smartctl, Sysroot,
};
use rand::SeedableRng;

use crate::report::{Reporter, Stage};
use crate::{NodeLayer, Outcome, WriteError, WriteSettings};

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
    pub settings: WriteSettings,
}

/// What a successful run did.
#[derive(Debug, Clone)]
pub struct Provisioned {
    pub outcome: Outcome,
    /// The disk written.
    pub disk: String,
    pub hostname: String,
    pub role: Role,
}

#[derive(Debug, thiserror::Error)]
pub enum ProvisionError {
    /// A gate or the guard stopped the run; the disks were not touched.
    #[error("{0}")]
    Gate(#[from] GateFailure),
    #[error("reading the machine: {0}")]
    Machine(#[from] ingot_machine::MachineError),
    #[error("{path}: {what}: {source}")]
    Io {
        path: PathBuf,
        what: &'static str,
        source: std::io::Error,
    },
    #[error("the bootstrap data {path}: {source}")]
    Bootstrap {
        path: PathBuf,
        source: ingot_bootstrap::ParseError,
    },
    #[error("staging the per-node files: {0}")]
    Stage(#[from] ingot_bootstrap::StageError),
    /// The base layer's accounts, needed to stage owners, could not be read.
    #[error("reading the base layer's accounts for staging: {0}")]
    BaseAccounts(String),
    #[error("sealing the per-node layer: {0}")]
    Seal(String),
    #[error(transparent)]
    Write(#[from] WriteError),
}

impl ProvisionError {
    /// A short, stable name for the failure: the gate reason, or the kind of error.
    pub fn reason(&self) -> String {
        match self {
            ProvisionError::Gate(g) => g.reason.as_str().to_string(),
            ProvisionError::Machine(_) => "machine-unreadable".into(),
            ProvisionError::Io { .. } => "io".into(),
            ProvisionError::Bootstrap { .. } => "bootstrap-invalid".into(),
            ProvisionError::Stage(_) | ProvisionError::BaseAccounts(_) => "stage-failed".into(),
            ProvisionError::Seal(_) => "seal-failed".into(),
            ProvisionError::Write(WriteError::Engine(crate::steps::write::EngineError::Deadline {
                ..
            })) => "deadline".into(),
            ProvisionError::Write(WriteError::Source(_)) => "image-invalid".into(),
            ProvisionError::Write(_) => "write-failed".into(),
        }
    }
}

fn gate_passed(reporter: &Reporter, stage: Stage, report: &GateReport) {
    for w in &report.warnings {
        reporter.warning(stage, format!("{}: {}", w.reason, w.message));
    }
}

/// Runs the whole provisioning sequence; see the module docs.
pub fn provision(
    req: &ProvisionRequest,
    reporter: &Reporter,
) -> Result<Provisioned, ProvisionError> {
    let sysroot = Sysroot::new(&req.sysroot);
    reporter.stage(
        Stage::Check,
        format!(
            "reading the machine ({}) and the bootstrap data",
            req.sysroot.display()
        ),
    );
    let facts = ingot_machine::detect(&sysroot)?;
    reporter.detail("machine", &facts);
    let raw = std::fs::read(&req.bootstrap).map_err(|source| ProvisionError::Io {
        path: req.bootstrap.clone(),
        what: "reading the bootstrap data",
        source,
    })?;
    let bootstrap = ingot_bootstrap::parse(&raw).map_err(|source| ProvisionError::Bootstrap {
        path: req.bootstrap.clone(),
        source,
    })?;
    drop(raw);
    let role = req.role.unwrap_or(match bootstrap.role() {
        ingot_bootstrap::Role::ControlPlane => Role::ControlPlane,
        ingot_bootstrap::Role::Worker => Role::Worker,
    });
    let machine = machine_of(&facts, role);
    reporter.detail("selection", &machine);
    reporter.stage(
        Stage::Check,
        format!(
            "{}: {} (bootstrap data: {}), GPU: {}, virtualization: {}, UEFI: {}",
            req.machine_name,
            role.as_str(),
            match bootstrap.format {
                ingot_bootstrap::Format::Ignition { .. } => "Ignition",
                _ => "cloud-config",
            },
            if facts.nvidia_gpu { "nvidia" } else { "none" },
            facts.virtualization,
            facts.uefi
        ),
    );

    reporter.stage(Stage::Gate, "checking tools, firmware and the target disks");
    let tools: Vec<&str> = req.required_tools.iter().map(String::as_str).collect();
    gate_passed(
        reporter,
        Stage::Gate,
        &ingot_machine::gate_tools(&tools, None)?,
    );
    gate_passed(reporter, Stage::Gate, &ingot_machine::gate_uefi(&facts)?);
    let targets = ingot_machine::resolve_targets(&sysroot, &facts, &req.root_devices)?;
    let disk = targets[0].clone();
    if targets.len() > 1 {
        let others: Vec<&str> = targets[1..].iter().map(|d| d.name.as_str()).collect();
        reporter.warning(
            Stage::Gate,
            format!(
                "ingot writes one disk: {} gets the node; {} left as they are (the guard still \
                 checks them)",
                disk.name,
                others.join(", ")
            ),
        );
    }
    let smart: Box<dyn SmartSource> = if req.sysroot == Path::new("/") {
        Box::new(Smartctl::default())
    } else {
        // A fixture machine carries smartctl's JSON output for each disk.
        Box::new(FixtureSmart)
    };
    let mut gates = Vec::new();
    reporter.stage(Stage::Gate, format!("{}: SMART health", disk.name));
    let r = ingot_machine::gate_smart(&sysroot, &disk, smart.as_ref())?;
    gate_passed(reporter, Stage::Gate, &r);
    gates.push(r);
    let min = req
        .min_read_kib_s
        .unwrap_or_else(|| ingot_machine::default_min_kib_s(&disk));
    reporter.stage(
        Stage::Gate,
        format!(
            "{}: read speed test ({} s, at least {min} KiB/s)",
            disk.name,
            req.read_test.as_secs_f64()
        ),
    );
    let r = ingot_machine::gate_read_speed(&disk, min, req.read_test)?;
    gate_passed(reporter, Stage::Gate, &r);
    gates.push(r);
    reporter.detail("gates", &gates);

    reporter.stage(
        Stage::Guard,
        "looking for other operating systems, LVM and md RAID on the disks",
    );
    let guard = ingot_machine::guard(
        &facts,
        &targets,
        &GuardOptions {
            allow_foreign_os: req.allow_foreign_os,
        },
    )?;
    for w in &guard.warnings {
        reporter.warning(Stage::Guard, format!("{}: {}", w.reason, w.message));
    }
    reporter.detail("guard", &guard);

    let opened = crate::open_stack(&req.image, &req.trust, &machine, reporter)?;

    reporter.stage(
        Stage::Staging,
        format!("staging the per-node files for {}", req.machine_name),
    );
    let base = opened
        .base_fs()
        .map_err(|e| ProvisionError::BaseAccounts(e.to_string()))?;
    let text = |path: &str| -> Result<String, ProvisionError> {
        let bytes = base
            .read(path)
            .map_err(|e| ProvisionError::BaseAccounts(e.to_string()))?;
        String::from_utf8(bytes)
            .map_err(|_| ProvisionError::BaseAccounts(format!("{path} is not UTF-8")))
    };
    let (base_passwd, base_group) = (text("/etc/passwd")?, text("/etc/group")?);
    let network = read_network(&sysroot, reporter);
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
    for w in &staged.warnings {
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

    reporter.stage(
        Stage::Seal,
        "sealing the per-node layer (ext4 image and dm-verity tree)",
    );
    let node = seal(&staged, &opened.describe(), &req.machine_name)?;
    reporter.stage(
        Stage::Seal,
        format!(
            "sealed the per-node layer: {} bytes, root hash {}",
            node.image.len(),
            hex::encode(&node.root_hash)
        ),
    );

    reporter.stage(Stage::Gate, format!("{}: size", disk.name));
    let need = crate::steps::plan::min_disk_size(req.settings.esp_size, &opened.plan_layers(Some(&node)));
    gate_passed(
        reporter,
        Stage::Gate,
        &ingot_machine::gate_size(&disk, need)?,
    );

    let outcome = crate::write_opened(&opened, Some(&node), &disk.node, &req.settings, reporter)?;
    Ok(Provisioned {
        outcome,
        disk: disk.name,
        hostname: staged.hostname,
        role,
    })
}

/// What the layer rules see of this machine.
fn machine_of(facts: &Facts, role: Role) -> Machine {
    let mut m = Machine::new(role);
    if facts.nvidia_gpu {
        m.gpus.push(GpuVendor::Nvidia);
    }
    m.virt = facts.virtualization;
    m.uefi = facts.uefi;
    m
}

/// Builds the node layer: the staged files as a tar, then a deterministic ext4 image and its
/// verity tree (ingot's layer builder, the same one the stack's layers come from).
fn seal(
    staged: &ingot_bootstrap::Staged,
    stack: &str,
    machine_name: &str,
) -> Result<NodeLayer, ProvisionError> {
    let err = |what: &str, e: &dyn std::fmt::Display| ProvisionError::Seal(format!("{what}: {e}"));
    let dir = tempfile::tempdir().map_err(|e| err("making a scratch directory", &e))?;
    let tar = dir.path().join("node.tar");
    let file = std::fs::File::create(&tar).map_err(|e| err("creating the tar", &e))?;
    let mut w = std::io::BufWriter::new(file);
    staged
        .write_tar(&mut w)
        .and_then(|_| std::io::Write::flush(&mut w))
        .map_err(|e| err("writing the tar", &e))?;
    drop(w);
    let img = dir.path().join("node.img");
    let hash = dir.path().join("node.hash");
    let opts = ingot_layers::Ext4Options {
        seed: format!("{stack}/node/{machine_name}").into_bytes(),
        source_date_epoch: 0,
        size: None,
        progress: None,
    };
    let built = ingot_layers::build_layer(
        &ingot_layers::Source::Tar(tar.clone()),
        &img,
        Some(&hash),
        &opts,
    )
    .map_err(|e| err("building the image", &e))?;
    let verity = built
        .verity
        .ok_or_else(|| ProvisionError::Seal("the layer builder made no hash tree".into()))?;
    Ok(NodeLayer {
        image: std::fs::read(&img).map_err(|e| err("reading the image", &e))?,
        hash: std::fs::read(&hash).map_err(|e| err("reading the hash tree", &e))?,
        root_hash: verity.root_hash,
    })
}

/// The rescue system's network settings, to give the node the same static addresses: from
/// `ip -json` (iproute2) on a real machine, from `<sysroot>/ip/{addr,route}.json` on a fixture;
/// DNS from `<sysroot>/etc/resolv.conf`. Missing pieces are a warning: the node then uses DHCP.
fn read_network(sysroot: &Sysroot, reporter: &Reporter) -> Option<Network> {
    // `file` names the fixture's copy of the command's output.
    let json = |args: &[&str], file: &str| -> Option<serde_json::Value> {
        let text = if sysroot.root() == Path::new("/") {
            let out = std::process::Command::new("ip").args(args).output().ok()?;
            out.status.success().then_some(out.stdout)?
        } else {
            std::fs::read(sysroot.path(format!("/ip/{file}.json"))).ok()?
        };
        serde_json::from_slice(&text).ok()
    };
    let addr = json(&["-json", "addr", "show"], "addr");
    let route4 = json(&["-json", "route", "show"], "route");
    let route6 = json(&["-6", "-json", "route", "show"], "route6");
    let (Some(addr), Some(route4)) = (addr, route4) else {
        reporter.warning(
            Stage::Staging,
            "the rescue system's addresses could not be read (ip -json addr/route): the node \
             gets no static network settings and relies on DHCP",
        );
        return None;
    };
    let mut interfaces = Vec::new();
    for link in addr.as_array().into_iter().flatten() {
        let name = link["ifname"].as_str().unwrap_or_default();
        let mac = link["address"].as_str().unwrap_or_default();
        if name == "lo" || link["link_type"].as_str() != Some("ether") || mac.is_empty() {
            continue;
        }
        let addresses: Vec<String> = link["addr_info"]
            .as_array()
            .into_iter()
            .flatten()
            .filter(|a| a["scope"].as_str() == Some("global"))
            .filter_map(|a| {
                Some(format!(
                    "{}/{}",
                    a["local"].as_str()?,
                    a["prefixlen"].as_u64()?
                ))
            })
            .collect();
        if addresses.is_empty() {
            continue;
        }
        let gateway = |routes: Option<&serde_json::Value>| {
            routes?.as_array()?.iter().find_map(|r| {
                let gw = r["gateway"].as_str()?;
                (r["dst"].as_str() == Some("default") && r["dev"].as_str() == Some(name))
                    .then(|| gw.to_string())
            })
        };
        interfaces.push(ingot_bootstrap::Interface {
            name: name.to_string(),
            mac: mac.to_string(),
            addresses,
            gateway4: gateway(Some(&route4)),
            gateway6: gateway(route6.as_ref()),
        });
    }
    let dns = std::fs::read_to_string(sysroot.path("/etc/resolv.conf"))
        .unwrap_or_default()
        .lines()
        .filter_map(|l| l.trim().strip_prefix("nameserver"))
        .map(|s| s.trim().to_string())
        .filter(|s| !s.is_empty())
        .collect();
    Some(Network { interfaces, dns })
}
