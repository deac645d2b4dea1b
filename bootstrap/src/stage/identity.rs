//! The files that make the node itself: host name, hosts, machine-id, SSH host keys, networkd
//! files, kubelet's node labels and `/etc/ingot/node.json`.

use rand::{CryptoRng, RngCore};

use super::jinja::render_jinja;
use super::node;
use super::tree::Tree;
use super::{StageError, StageInput};
use crate::model::{Format, Role};

/// `/etc/hostname`, `/etc/hosts`, `/etc/machine-id` and the SSH host keys. Returns the host name.
pub(super) fn stage_identity<R: RngCore + CryptoRng>(
    tree: &mut Tree,
    input: &StageInput,
    rng: &mut R,
) -> Result<String, StageError> {
    let b = &input.bootstrap;
    let jinja = matches!(b.format, Format::CloudConfig { jinja: true });
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
        stage_host_keys(tree, &host, rng)?;
    }
    Ok(host)
}

fn stage_host_keys<R: RngCore + CryptoRng>(
    tree: &mut Tree,
    host: &str,
    rng: &mut R,
) -> Result<(), StageError> {
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
    Ok(())
}

/// The networkd files, `/etc/default/kubelet` with the node labels, and `/etc/ingot/node.json`.
pub(super) fn stage_node_facts(
    tree: &mut Tree,
    input: &StageInput,
    host: &str,
    role: Role,
) -> Result<(), StageError> {
    let b = &input.bootstrap;
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
    let node_json = serde_json::json!({
        "machine_name": input.machine_name,
        "hostname": host,
        "role": role.as_str(),
        "labels": input.labels,
    });
    let mut node_json = serde_json::to_vec_pretty(&node_json).expect("JSON of strings");
    node_json.push(b'\n');
    tree.generated("/etc/ingot/node.json", node_json, 0o644, 0, 0)
}
