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

/// Where Debian's systemd package puts the network daemon.
const NETWORKD: &str = "/lib/systemd/systemd-networkd";

/// In private network and mount namespaces: a veth `eth0` with the captured MAC, the staged
/// files in `$NET` as the only `/etc/systemd/network`, a fresh `/run` (no host bus, journal or
/// udev), and the host's own systemd-networkd run until it has configured the link (or given
/// up: a link it cannot finish stays "configuring", so after 15 s); then the routes and the
/// link's state. networkd waits for udev to have seen a link, so
/// the udev database entries are written by hand.
const NETWORKD_SCRIPT: &str = r#"set -e
mount -t tmpfs tmpfs /run
mount -t sysfs sysfs /sys
mount --bind "$NET" /etc/systemd/network
for d in /usr/lib/systemd/network /lib/systemd/network; do [ -d $d ] && mount -t tmpfs tmpfs $d; done
ip link set lo up
ip link add eth0 address "$MAC" type veth peer name peer0
ip link set peer0 up
mkdir -p /run/udev/data /run/systemd/netif/links /run/systemd/netif/leases /run/systemd/netif/lldp
chown -R systemd-network: /run/systemd/netif
for i in /sys/class/net/*; do echo I:1 >/run/udev/data/n$(cat $i/ifindex); done
SYSTEMD_LOG_TARGET=console "$NETWORKD" >"$LOG" 2>&1 &
pid=$!
state=/run/systemd/netif/links/$(cat /sys/class/net/eth0/ifindex)
i=0
until grep -qE '^ADMIN_STATE=(configured|failed)' $state 2>/dev/null; do
  # A link networkd cannot finish (a route it refuses) stays "configuring": give up after 15 s.
  i=$((i + 1)); [ $i -le 75 ] && kill -0 $pid || break
  sleep 0.2
done
grep ^ADMIN_STATE= $state || true
ip -4 route; ip -6 route
kill $pid
"#;

/// The real systemd-networkd applies `files` on a link with `mac`; returns what the script
/// printed (state and routes) and networkd's log.
fn networkd(files: &[(String, String)], mac: &str) -> (String, String) {
    let dir = tempfile::tempdir().unwrap();
    let net = dir.path().join("network");
    std::fs::create_dir(&net).unwrap();
    for (path, text) in files {
        let name = std::path::Path::new(path).file_name().unwrap();
        std::fs::write(net.join(name), text).unwrap();
    }
    let log = dir.path().join("networkd.log");
    let out = std::process::Command::new("unshare")
        .args([
            "-m",
            "-n",
            "--propagation",
            "private",
            "sh",
            "-c",
            NETWORKD_SCRIPT,
        ])
        .env("NET", &net)
        .env("MAC", mac)
        .env("LOG", &log)
        .env("NETWORKD", NETWORKD)
        .output()
        .unwrap();
    let log = std::fs::read_to_string(&log).unwrap_or_default();
    assert!(out.status.success(), "{out:?}\n{log}");
    (String::from_utf8_lossy(&out.stdout).into_owned(), log)
}

/// The staged files as the host's real systemd-networkd reads and applies them: the hcloud VM's
/// /32 gets its default route through the on-link gateway (and, without `GatewayOnLink=`, the
/// same file gets none: the check can tell), the dedicated server's through its subnet's
/// gateway; networkd reports no line of either file it could not parse.
#[test]
fn systemd_networkd_applies_the_staged_default_route() {
    use ingot_testkit::skip::{have_file, have_root, have_tools};
    let test = ingot_testkit::test_name!();
    if !(have_root(test)
        && have_tools(test, &["unshare", "ip"])
        && have_file(test, std::path::Path::new(NETWORKD)))
    {
        return;
    }
    for (machine, mac, route) in [
        (
            "hcloud-vm",
            "96:00:02:a1:b2:c3",
            "default via 172.31.1.1 dev eth0 proto static onlink",
        ),
        (
            "dedicated",
            "a8:a1:59:0c:7e:21",
            "default via 148.251.84.1 dev eth0 proto static",
        ),
    ] {
        let files = staged_files(capture(machine));
        let (out, log) = networkd(&files, mac);
        assert!(
            out.contains("ADMIN_STATE=configured"),
            "{machine}: {out}\n{log}"
        );
        assert!(
            out.lines().any(|l| l.trim() == route),
            "{machine}: {out}\n{log}"
        );
        assert!(
            out.contains("default via fe80::1 dev eth0 proto static"),
            "{machine}: {out}\n{log}"
        );
        // networkd's parse diagnostics name the file and line: "…/10-ingot-eth0.network:5: …".
        assert!(!log.contains(".network:"), "{machine}: {log}");
        if machine == "hcloud-vm" {
            let without: Vec<(String, String)> = files
                .iter()
                .map(|(p, t)| (p.clone(), t.replace("GatewayOnLink=yes\n", "")))
                .collect();
            let (out, log) = networkd(&without, mac);
            assert!(!out.contains("ADMIN_STATE=configured"), "{out}\n{log}");
            assert!(!out.contains("default via 172.31.1.1"), "{out}\n{log}");
        }
    }
}
