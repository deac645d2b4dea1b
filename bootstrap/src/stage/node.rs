//! Per-machine settings that do not come from the bootstrap data: hostname, network, labels,
//! SSH host keys.

use std::collections::BTreeMap;
use std::net::{IpAddr, Ipv4Addr, Ipv6Addr};

use rand::{CryptoRng, RngCore};
use ssh_key::private::{KeypairData, RsaKeypair};
use ssh_key::{Algorithm, LineEnding, PrivateKey};

use super::{Network, StageError};

fn host_err(value: &str, reason: &str) -> StageError {
    StageError::Hostname {
        value: value.to_string(),
        reason: reason.to_string(),
    }
}

/// Checks a host name (RFC 1123 labels); returns (short name, fqdn if it had dots).
pub(crate) fn hostname(value: &str) -> Result<(String, Option<String>), StageError> {
    if value.is_empty() || value.len() > 253 {
        return Err(host_err(value, "must be 1 to 253 characters"));
    }
    for label in value.split('.') {
        let b = label.as_bytes();
        if b.is_empty() || b.len() > 63 {
            return Err(host_err(
                value,
                "each dot-separated label must be 1 to 63 characters",
            ));
        }
        if !b.iter().all(|c| c.is_ascii_alphanumeric() || *c == b'-')
            || b[0] == b'-'
            || b[b.len() - 1] == b'-'
        {
            return Err(host_err(
                value,
                "labels may only hold letters, digits and inner `-`",
            ));
        }
    }
    let short = value.split('.').next().unwrap_or(value).to_string();
    Ok((short, value.contains('.').then(|| value.to_string())))
}

fn net_err(interface: &str, reason: String) -> StageError {
    StageError::Network {
        interface: interface.to_string(),
        reason,
    }
}

fn mac(iface: &str, raw: &str) -> Result<String, StageError> {
    let parts: Vec<&str> = raw.split([':', '-']).collect();
    if parts.len() != 6
        || !parts
            .iter()
            .all(|p| p.len() == 2 && p.bytes().all(|b| b.is_ascii_hexdigit()))
    {
        return Err(net_err(
            iface,
            format!("MAC address {raw:?} is not six hex octets"),
        ));
    }
    Ok(parts.join(":").to_ascii_lowercase())
}

fn cidr(iface: &str, raw: &str) -> Result<String, StageError> {
    let bad = || {
        net_err(
            iface,
            format!("address {raw:?} is not an IP address with a /prefix"),
        )
    };
    let (ip, prefix) = raw.split_once('/').ok_or_else(bad)?;
    let ip: IpAddr = ip.parse().map_err(|_| bad())?;
    let prefix: u8 = prefix.parse().map_err(|_| bad())?;
    let max = if ip.is_ipv4() { 32 } else { 128 };
    if prefix > max {
        return Err(bad());
    }
    Ok(format!("{ip}/{prefix}"))
}

/// systemd-networkd files, one per interface: `(file name, content)`.
pub(crate) fn network_files(net: &Network) -> Result<Vec<(String, String)>, StageError> {
    let mut dns = Vec::new();
    for d in &net.dns {
        let ip: IpAddr = d
            .parse()
            .map_err(|_| net_err("dns", format!("{d:?} is not an IP address")))?;
        dns.push(ip.to_string());
    }
    let mut out: Vec<(String, String)> = Vec::new();
    let mut macs = Vec::new();
    for i in &net.interfaces {
        let n = &i.name;
        if n.is_empty()
            || n.len() > 15
            || n == "."
            || n == ".."
            || !n
                .bytes()
                .all(|b| b.is_ascii_alphanumeric() || b"_.-".contains(&b))
        {
            return Err(net_err(
                n,
                "interface name must be 1 to 15 of [A-Za-z0-9_.-]".into(),
            ));
        }
        let mac = mac(n, &i.mac)?;
        if macs.contains(&mac) {
            return Err(net_err(n, format!("MAC address {mac} is given twice")));
        }
        macs.push(mac.clone());
        let file = format!("10-ingot-{n}.network");
        if out.iter().any(|(f, _)| *f == file) {
            return Err(net_err(n, "interface is given twice".into()));
        }
        let mut text = format!(
            "# Written by ingot for {n}; matched by MAC so renaming does not matter.\n[Match]\nMACAddress={mac}\n\n[Network]\n"
        );
        if i.addresses.is_empty() {
            text.push_str("DHCP=yes\n");
        }
        for a in &i.addresses {
            text.push_str(&format!("Address={}\n", cidr(n, a)?));
        }
        let mut on_link = Vec::new();
        if let Some(g) = &i.gateway4 {
            let g: Ipv4Addr = g
                .parse()
                .map_err(|_| net_err(n, format!("gateway4 {g:?} is not an IPv4 address")))?;
            gateway(&mut text, &mut on_link, IpAddr::V4(g), &i.addresses);
        }
        if let Some(g) = &i.gateway6 {
            let g: Ipv6Addr = g
                .parse()
                .map_err(|_| net_err(n, format!("gateway6 {g:?} is not an IPv6 address")))?;
            gateway(&mut text, &mut on_link, IpAddr::V6(g), &i.addresses);
        }
        for d in &dns {
            text.push_str(&format!("DNS={d}\n"));
        }
        for g in on_link {
            text.push_str(&format!("\n[Route]\nGateway={g}\nGatewayOnLink=yes\n"));
        }
        out.push((file, text));
    }
    Ok(out)
}

/// A gateway inside one of the interface's prefixes (or IPv6 link-local) goes on `[Network]`'s
/// `Gateway=`. One outside all of them (a /32 address with gateway 172.31.1.1 on a Hetzner cloud
/// VM, a point-to-point gateway on a dedicated server) needs its own `[Route]` with
/// `GatewayOnLink=yes`, or networkd's route is refused as unreachable and the node has no
/// default route.
fn gateway(text: &mut String, on_link: &mut Vec<IpAddr>, g: IpAddr, addresses: &[String]) {
    let link_local = matches!(g, IpAddr::V6(v6) if v6.segments()[0] & 0xffc0 == 0xfe80);
    if link_local || addresses.iter().any(|a| in_prefix(g, a)) {
        text.push_str(&format!("Gateway={g}\n"));
    } else {
        on_link.push(g);
    }
}

/// Whether `ip` lies in the network of `cidr` (an already checked `ADDR/PREFIX`).
fn in_prefix(ip: IpAddr, cidr: &str) -> bool {
    let Some((a, p)) = cidr.split_once('/') else {
        return false;
    };
    let (Ok(a), Ok(p)) = (a.parse::<IpAddr>(), p.parse::<u32>()) else {
        return false;
    };
    let mask = |bits: u32, p: u32| -> u128 {
        if p == 0 {
            0
        } else {
            (!0u128 << (bits - p.min(bits))) & (!0u128 >> (128 - bits))
        }
    };
    match (ip, a) {
        (IpAddr::V4(x), IpAddr::V4(y)) => {
            let m = mask(32, p);
            (u32::from(x) as u128) & m == (u32::from(y) as u128) & m
        }
        (IpAddr::V6(x), IpAddr::V6(y)) => {
            let m = mask(128, p);
            u128::from(x) & m == u128::from(y) & m
        }
        _ => false,
    }
}

fn label_err(key: &str, value: &str, reason: &str) -> StageError {
    StageError::Label {
        key: key.to_string(),
        value: value.to_string(),
        reason: reason.to_string(),
    }
}

/// Kubernetes' qualified-name part: `([A-Za-z0-9][-A-Za-z0-9_.]*)?[A-Za-z0-9]`, at most 63.
fn name_part(s: &str) -> bool {
    let b = s.as_bytes();
    !b.is_empty()
        && b.len() <= 63
        && b[0].is_ascii_alphanumeric()
        && b[b.len() - 1].is_ascii_alphanumeric()
        && b.iter()
            .all(|c| c.is_ascii_alphanumeric() || b"-_.".contains(c))
}

fn dns_subdomain(s: &str) -> bool {
    s.len() <= 253
        && s.split('.').all(|l| {
            let b = l.as_bytes();
            !b.is_empty()
                && b.len() <= 63
                && b.iter()
                    .all(|c| c.is_ascii_lowercase() || c.is_ascii_digit() || *c == b'-')
                && b[0] != b'-'
                && b[b.len() - 1] != b'-'
        })
}

/// Labels in the kubernetes.io / k8s.io namespaces that kubelet accepts in `--node-labels`.
const KUBELET_ALLOWED: &[&str] = &[
    "beta.kubernetes.io/arch",
    "beta.kubernetes.io/instance-type",
    "beta.kubernetes.io/os",
    "failure-domain.beta.kubernetes.io/region",
    "failure-domain.beta.kubernetes.io/zone",
    "kubernetes.io/arch",
    "kubernetes.io/hostname",
    "kubernetes.io/os",
    "node.kubernetes.io/instance-type",
    "topology.kubernetes.io/region",
    "topology.kubernetes.io/zone",
];

/// Checks node labels against Kubernetes' syntax and kubelet's `--node-labels` rules.
pub(crate) fn check_labels(labels: &BTreeMap<String, String>) -> Result<(), StageError> {
    for (k, v) in labels {
        let (prefix, name) = match k.split_once('/') {
            Some((p, n)) => (Some(p), n),
            None => (None, k.as_str()),
        };
        if !name_part(name) {
            return Err(label_err(k, v, "key name must be 1 to 63 characters of [A-Za-z0-9-_.], starting and ending alphanumeric"));
        }
        if let Some(p) = prefix {
            if !dns_subdomain(p) {
                return Err(label_err(
                    k,
                    v,
                    "key prefix must be a lowercase DNS subdomain",
                ));
            }
            let restricted = p == "kubernetes.io"
                || p.ends_with(".kubernetes.io")
                || p == "k8s.io"
                || p.ends_with(".k8s.io");
            let allowed_ns = ["kubelet.kubernetes.io", "node.kubernetes.io"]
                .iter()
                .any(|ns| p == *ns || p.ends_with(&format!(".{ns}")));
            if restricted && !allowed_ns && !KUBELET_ALLOWED.contains(&k.as_str()) {
                return Err(label_err(k, v, "kubelet refuses --node-labels in the kubernetes.io/k8s.io namespaces except node.kubernetes.io, kubelet.kubernetes.io and a few well-known keys"));
            }
        }
        if !v.is_empty() && !name_part(v) {
            return Err(label_err(k, v, "value must be empty or 1 to 63 characters of [A-Za-z0-9-_.], starting and ending alphanumeric"));
        }
    }
    Ok(())
}

/// A fresh SSH host key pair: (private key in OpenSSH format, public key line).
pub(crate) fn host_key<R: RngCore + CryptoRng>(
    rng: &mut R,
    rsa: bool,
    comment: &str,
) -> Result<(Vec<u8>, Vec<u8>), StageError> {
    let err = |e: ssh_key::Error| StageError::HostKey {
        reason: e.to_string(),
    };
    let mut key = if rsa {
        let pair = RsaKeypair::random(rng, 3072).map_err(err)?;
        PrivateKey::new(KeypairData::from(pair), comment).map_err(err)?
    } else {
        let mut k = PrivateKey::random(rng, Algorithm::Ed25519).map_err(err)?;
        k.set_comment(comment);
        k
    };
    key.set_comment(comment);
    let private = key.to_openssh(LineEnding::LF).map_err(err)?;
    let mut public = key.public_key().to_openssh().map_err(err)?;
    public.push('\n');
    Ok((private.as_bytes().to_vec(), public.into_bytes()))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn hostnames() {
        assert_eq!(hostname("node-1").unwrap(), ("node-1".into(), None));
        assert_eq!(
            hostname("node-1.example.com").unwrap(),
            ("node-1".into(), Some("node-1.example.com".into()))
        );
        for bad in ["", "-a", "a_b", "a..b", &"x".repeat(64)] {
            let e = hostname(bad).unwrap_err().to_string();
            assert!(e.contains("hostname"), "{e}");
        }
    }

    #[test]
    fn prefixes() {
        let v4 = |s: &str| IpAddr::V4(s.parse().unwrap());
        assert!(in_prefix(v4("203.0.113.1"), "203.0.113.20/26"));
        assert!(!in_prefix(v4("203.0.113.65"), "203.0.113.20/26"));
        assert!(!in_prefix(v4("172.31.1.1"), "5.75.1.2/32"));
        assert!(in_prefix(v4("5.75.1.2"), "5.75.1.2/32"));
        assert!(in_prefix(v4("8.8.8.8"), "0.0.0.0/0"));
        let v6 = IpAddr::V6("2001:db8:1:2::1".parse().unwrap());
        assert!(in_prefix(v6, "2001:db8:1:2::2/64"));
        assert!(!in_prefix(v6, "2001:db8:1:3::2/64"));
        assert!(!in_prefix(v6, "203.0.113.20/26"));
    }

    #[test]
    fn labels() {
        let ok: BTreeMap<String, String> = [
            ("node-role.kubernetes.io/worker", ""),
            (
                "node.kubernetes.io/exclude-from-external-load-balancers",
                "true",
            ),
            ("example.com/gpu", "nvidia-a100"),
            ("plain", "v1.2_3"),
        ]
        .into_iter()
        .map(|(k, v)| (k.to_string(), v.to_string()))
        .collect();
        // node-role.kubernetes.io is restricted by kubelet.
        assert!(check_labels(&ok).is_err());
        let mut ok = ok;
        ok.remove("node-role.kubernetes.io/worker");
        check_labels(&ok).unwrap();
        for (k, v) in [
            ("a/b/c", "x"),
            ("Ex.com/a", "x"),
            ("a", "-x"),
            ("a", &"v".repeat(64)),
            ("", "x"),
        ] {
            let m = BTreeMap::from([(k.to_string(), v.to_string())]);
            let e = check_labels(&m).unwrap_err().to_string();
            assert!(e.contains("label"), "{e}");
        }
    }
}
