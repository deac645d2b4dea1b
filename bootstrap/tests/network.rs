//! Network staging from captured rescue-system output (`tests/fixtures/network/`): every machine
//! kind gets a default route in its networkd file.

mod common;

use std::path::PathBuf;

use common::*;
use ingot_bootstrap::{network_from_ip_json, parse, stage, EntryKind, Network};

fn capture(machine: &str) -> Network {
    let dir = PathBuf::from(env!("CARGO_MANIFEST_DIR"))
        .join("../tests/fixtures/network")
        .join(machine);
    let read = |f: &str| std::fs::read(dir.join(f)).unwrap_or_else(|e| panic!("{f}: {e}"));
    network_from_ip_json(
        &read("addr.json"),
        &read("route.json"),
        Some(&read("route6.json")),
        &String::from_utf8(read("resolv.conf")).unwrap(),
    )
    .unwrap()
}

/// The staged networkd files: (path, text).
fn staged_files(net: Network) -> Vec<(String, String)> {
    let mut input = input(
        parse(&fixture("cloud-config-worker-join.yaml")).unwrap(),
        false,
    );
    input.network = Some(net);
    let s = stage(&input, &mut rng(1)).unwrap();
    s.entries
        .iter()
        .filter(|e| e.path.parent() == Some(std::path::Path::new("/etc/systemd/network")))
        .map(|e| match &e.kind {
            EntryKind::File(c) => (
                e.path.display().to_string(),
                String::from_utf8(c.clone()).unwrap(),
            ),
            _ => panic!("{} is not a file", e.path.display()),
        })
        .collect()
}

/// The `[Section]` each `Key=value` line of `text` stands in.
fn sections(text: &str) -> Vec<(String, String)> {
    let mut section = String::new();
    let mut out = Vec::new();
    for line in text.lines() {
        if line.starts_with('[') {
            section = line.to_string();
        } else if line.contains('=') && !line.starts_with('#') {
            out.push((section.clone(), line.to_string()));
        }
    }
    out
}

#[test]
fn hcloud_vm_gets_an_on_link_default_route() {
    let net = capture("hcloud-vm");
    assert_eq!(net.interfaces.len(), 1);
    let i = &net.interfaces[0];
    assert_eq!(i.addresses, ["5.75.200.10/32", "2a01:4f8:c012:5e1d::1/64"]);
    assert_eq!(i.gateway4.as_deref(), Some("172.31.1.1"));
    assert_eq!(i.gateway6.as_deref(), Some("fe80::1"));
    let files = staged_files(net);
    assert_eq!(files.len(), 1, "{files:?}");
    assert_eq!(files[0].0, "/etc/systemd/network/10-ingot-eth0.network");
    let lines = sections(&files[0].1);
    let has = |s: &str, l: &str| lines.iter().any(|(a, b)| a == s && b == l);
    assert!(has("[Match]", "MACAddress=96:00:02:a1:b2:c3"), "{lines:?}");
    assert!(has("[Network]", "Address=5.75.200.10/32"), "{lines:?}");
    // The IPv4 gateway lies outside the /32: its own route, on-link.
    assert!(has("[Route]", "Gateway=172.31.1.1"), "{lines:?}");
    assert!(has("[Route]", "GatewayOnLink=yes"), "{lines:?}");
    assert!(!has("[Network]", "Gateway=172.31.1.1"), "{lines:?}");
    // IPv6 link-local gateways are on the link by definition.
    assert!(has("[Network]", "Gateway=fe80::1"), "{lines:?}");
    assert!(has("[Network]", "DNS=185.12.64.1"), "{lines:?}");
}

#[test]
fn dedicated_server_gets_its_gateway_in_the_subnet() {
    let net = capture("dedicated");
    // eth1 has no address: no file, so networkd leaves it alone.
    assert_eq!(net.interfaces.len(), 1);
    let files = staged_files(net);
    assert_eq!(files.len(), 1, "{files:?}");
    let lines = sections(&files[0].1);
    let has = |s: &str, l: &str| lines.iter().any(|(a, b)| a == s && b == l);
    assert!(has("[Match]", "MACAddress=a8:a1:59:0c:7e:21"), "{lines:?}");
    assert!(has("[Network]", "Address=148.251.84.20/27"), "{lines:?}");
    assert!(has("[Network]", "Gateway=148.251.84.1"), "{lines:?}");
    assert!(has("[Network]", "Gateway=fe80::1"), "{lines:?}");
    assert!(!files[0].1.contains("GatewayOnLink"), "{}", files[0].1);
    assert!(!files[0].1.contains("[Route]"), "{}", files[0].1);
}
