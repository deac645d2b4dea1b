//! Shared test helpers: fixtures, a seeded RNG, a default stage input.
#![allow(dead_code)]

use std::collections::BTreeMap;
use std::path::PathBuf;

use ingot_bootstrap::{Bootstrap, Interface, Network, StageInput, StageOptions};
use rand::rngs::StdRng;
use rand::SeedableRng;

pub fn fixture_path(name: &str) -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR"))
        .join("tests/fixtures")
        .join(name)
}

pub fn fixture(name: &str) -> Vec<u8> {
    std::fs::read(fixture_path(name)).unwrap_or_else(|e| panic!("{name}: {e}"))
}

pub fn fixture_text(name: &str) -> String {
    String::from_utf8(fixture(name)).unwrap()
}

pub fn rng(seed: u64) -> StdRng {
    StdRng::seed_from_u64(seed)
}

pub fn input(b: Bootstrap, host_keys: bool) -> StageInput {
    StageInput {
        bootstrap: b,
        machine_name: "hetzner-prod-cp-0".to_string(),
        base_passwd: fixture_text("base-passwd"),
        base_group: fixture_text("base-group"),
        network: Some(Network {
            interfaces: vec![Interface {
                name: "enp7s0".to_string(),
                mac: "A8:A1:59:0C:12:34".to_string(),
                addresses: vec![
                    "203.0.113.20/26".to_string(),
                    "2001:db8:1:2::2/64".to_string(),
                ],
                gateway4: Some("203.0.113.1".to_string()),
                gateway6: Some("fe80::1".to_string()),
            }],
            dns: vec![
                "185.12.64.1".to_string(),
                "2a01:4ff:ff00::add:1".to_string(),
            ],
        }),
        labels: BTreeMap::from([
            (
                "node.kubernetes.io/exclude-from-external-load-balancers".to_string(),
                "true".to_string(),
            ),
            ("example.com/rack".to_string(), "r12".to_string()),
        ]),
        options: StageOptions { host_keys },
    }
}

pub const TOKEN: &str = "6h4ylc.5x2jgkf0q8t7mw1d";
pub const CLOUD_CONFIGS: &[&str] = &[
    "cloud-config-controlplane-init.yaml",
    "cloud-config-controlplane-join.yaml",
    "cloud-config-worker-join.yaml",
];
pub const IGNITIONS: &[&str] = &[
    "ignition-v2-controlplane-init.json",
    "ignition-v2-worker-join.json",
    "ignition-v3-controlplane-join.json",
];
