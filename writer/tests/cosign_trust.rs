//! `ingot-writer --trust-key cosign.pub` (and `INGOT_TRUST_KEY`): a cosign key makes the cosign
//! signature of the manifest, under its `sha256-<HEX>.sig` tag in the registry, the stack's trust
//! anchor. A dry run against a real `docker-registry` accepts the demo stack signed that way
//! and refuses it with another cosign key, naming the key and the tag.

mod common;

use std::fs;
use std::path::Path;
use std::process::{Command, Output};

use common::{demo, registry_support::Registry};
use ingot_artifact::cosign::{attach::attach, SigningKey};
use ingot_artifact::registry::{push, Registry as Client, RegistryOptions, RegistryRef};

fn dry_run(url: &str, work: &Path, key: Option<&Path>, env_key: Option<&Path>) -> Output {
    let img = work.join("disk.img");
    fs::File::create(&img).unwrap().set_len(1024 << 20).unwrap();
    let mut cmd = Command::new(env!("CARGO_BIN_EXE_ingot-writer"));
    cmd.arg(url)
        .arg("--target")
        .arg(&img)
        .arg("--report")
        .arg(work.join("report.json"))
        .arg("--dry-run")
        .env("DOCKER_CONFIG", "/nonexistent-ingot-test")
        .env_remove("INGOT_TRUST_KEY");
    if let Some(k) = key {
        cmd.arg("--trust-key").arg(k);
    }
    if let Some(k) = env_key {
        cmd.env("INGOT_TRUST_KEY", k);
    }
    cmd.output().unwrap()
}

#[test]
fn a_dry_run_trusts_a_cosign_key() {
    if !ingot_testkit::skip::have_tool(ingot_testkit::test_name!(), "docker-registry") {
        return;
    }
    let stack = demo();
    let work = tempfile::tempdir_in("/var/tmp").unwrap();
    let w = work.path();
    let reg = Registry::start(&w.join("reg"), None);
    let target: RegistryRef = reg.url("stacks/demo:1.0.0").parse().unwrap();
    let client = Client::connect(&target, RegistryOptions::default()).unwrap();
    let published = push::publish(&client, &stack.layout, &target, false).unwrap();
    let key = SigningKey::generate();
    let attached = attach(&client, &target, &published.digest, &key).unwrap();
    let (public, other) = (w.join("cosign.pub"), w.join("other.pub"));
    fs::write(&public, key.public_key().to_pem()).unwrap();
    fs::write(&other, SigningKey::generate().public_key().to_pem()).unwrap();
    let url = reg.url("stacks/demo:1.0.0");
    let show = |o: &Output| ingot_testkit::command::describe(o);

    let o = dry_run(&url, w, Some(&public), None);
    assert!(o.status.success(), "{}", show(&o));
    let report: serde_json::Value =
        serde_json::from_slice(&fs::read(w.join("report.json")).unwrap()).unwrap();
    assert_eq!(report["state"], "dry-run", "{report}");
    let o = dry_run(&url, w, None, Some(&public));
    assert!(o.status.success(), "INGOT_TRUST_KEY: {}", show(&o));

    let o = dry_run(&url, w, Some(&other), None);
    assert!(!o.status.success(), "{}", show(&o));
    let all = show(&o);
    assert!(
        all.contains(&attached.tag) && all.contains(other.to_str().unwrap()),
        "{all}"
    );
}
