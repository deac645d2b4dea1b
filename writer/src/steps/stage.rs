//! `stage`: the per-node files from the bootstrap data (hostname, kubeadm or Ignition config,
//! accounts, SSH host keys, static network settings, node labels).
//!
//! Reads the verified base layer's `/etc/passwd` and `/etc/group` (owners are staged as the base
//! layer knows them), the checked bootstrap data, the rescue system's network settings and the
//! request's labels; returns the [`Staged`] files, warnings reported.

use std::path::Path;

use ingot_bootstrap::{Network, StageInput, StageOptions, Staged};
use ingot_machine::Sysroot;
use rand::SeedableRng;

use crate::error::ProvisionError;
use crate::report::{Reporter, Stage};
use crate::request::ProvisionRequest;
use crate::steps::check::Checked;
use crate::steps::verify::OpenedStack;

pub fn run(
    opened: &OpenedStack,
    checked: Checked,
    sysroot: &Sysroot,
    req: &ProvisionRequest,
    reporter: &Reporter,
) -> Result<Staged, ProvisionError> {
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
    let network = read_network(sysroot, reporter);
    let Checked {
        facts,
        bootstrap,
        role,
        ..
    } = checked;
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
    Ok(staged)
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
