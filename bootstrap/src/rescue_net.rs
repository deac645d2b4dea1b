//! The rescue system's network settings, read from iproute2's JSON output, so the node comes up
//! with the addresses it had in the rescue system.
//!
//! Hetzner hands a dedicated server its addresses statically (a /26 or /27 with the gateway in
//! it, or a /32 with a point-to-point gateway) and a cloud VM its address by DHCP, which the
//! rescue system shows as a /32 with an on-link gateway such as `172.31.1.1`. Both must give the
//! node a default route; [`crate::Network`]'s networkd files mark a gateway outside every
//! address's prefix `GatewayOnLink=yes`.

use serde_json::Value;
use thiserror::Error;

use crate::{Interface, Network};

/// The output of `ip -json addr show` / `ip -json route show` could not be read.
#[derive(Debug, Error)]
#[error("`ip -json {command}` output: {reason}")]
pub struct IpJsonError {
    /// `addr`, `route` or `-6 route`.
    pub command: &'static str,
    pub reason: String,
}

/// The static settings of every Ethernet interface with a global address: its addresses, the
/// default gateways through it (IPv4 from `route4`, IPv6 from `route6`), and the name servers of
/// `resolv_conf` (a resolv.conf's text). Interfaces without a global address are left out.
pub fn network_from_ip_json(
    addr: &[u8],
    route4: &[u8],
    route6: Option<&[u8]>,
    resolv_conf: &str,
) -> Result<Network, IpJsonError> {
    let parse = |command: &'static str, bytes: &[u8]| -> Result<Vec<Value>, IpJsonError> {
        let v: Value = serde_json::from_slice(bytes).map_err(|e| IpJsonError {
            command,
            reason: e.to_string(),
        })?;
        match v {
            Value::Array(a) => Ok(a),
            _ => Err(IpJsonError {
                command,
                reason: "not a JSON array".into(),
            }),
        }
    };
    let links = parse("addr", addr)?;
    let route4 = parse("route", route4)?;
    let route6 = route6.map(|r| parse("-6 route", r)).transpose()?;
    let mut interfaces = Vec::new();
    for link in &links {
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
        interfaces.push(Interface {
            name: name.to_string(),
            mac: mac.to_string(),
            addresses,
            gateway4: default_gateway(&route4, name),
            gateway6: route6.as_deref().and_then(|r| default_gateway(r, name)),
        });
    }
    let dns = resolv_conf
        .lines()
        .filter_map(|l| l.trim().strip_prefix("nameserver"))
        .map(|s| s.trim().to_string())
        .filter(|s| !s.is_empty())
        .collect();
    Ok(Network { interfaces, dns })
}

/// The gateway of the default route through `dev`, if any.
fn default_gateway(routes: &[Value], dev: &str) -> Option<String> {
    routes.iter().find_map(|r| {
        let gw = r["gateway"].as_str()?;
        (r["dst"].as_str() == Some("default") && r["dev"].as_str() == Some(dev))
            .then(|| gw.to_string())
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn bad_output_names_the_command() {
        let e = network_from_ip_json(b"[]", b"{", None, "").unwrap_err();
        assert_eq!(e.command, "route");
        let e = network_from_ip_json(b"{}", b"[]", None, "").unwrap_err();
        assert!(e
            .to_string()
            .contains("`ip -json addr` output: not a JSON array"));
    }

    #[test]
    fn interfaces_without_global_addresses_are_left_out() {
        let addr = br#"[{"ifname":"lo","link_type":"loopback","address":"00:00:00:00:00:00",
            "addr_info":[{"family":"inet","local":"127.0.0.1","prefixlen":8,"scope":"host"}]},
            {"ifname":"eth1","link_type":"ether","address":"aa:bb:cc:dd:ee:ff",
            "addr_info":[{"family":"inet6","local":"fe80::1","prefixlen":64,"scope":"link"}]}]"#;
        let n = network_from_ip_json(addr, b"[]", None, "nameserver 1.1.1.1\n").unwrap();
        assert!(n.interfaces.is_empty());
        assert_eq!(n.dns, ["1.1.1.1"]);
    }
}
