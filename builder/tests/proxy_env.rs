//! The proxy environment variables, as reqwest (the one HTTP client of every registry request)
//! reads them: `ingot pull` and `ingot resolve` against a real `docker-registry` go through an
//! HTTP proxy (`ingot-testproxy`, which counts the requests and bytes it forwards) named by
//! `HTTP_PROXY` or `http_proxy`, and not when `NO_PROXY` names the registry host. reqwest has no
//! loopback exception of its own: a registry on 127.0.0.1 is proxied unless `NO_PROXY` says not.

mod common;

use std::path::Path;
use std::process::{Command, Output, Stdio};
use std::sync::atomic::Ordering;

use common::{build, demo_manifest, have_tool, keypair};
use ingot_testkit::registry::{tree_digests, Registry};

const PROXY_VARS: [&str; 8] = [
    "HTTP_PROXY",
    "http_proxy",
    "HTTPS_PROXY",
    "https_proxy",
    "ALL_PROXY",
    "all_proxy",
    "NO_PROXY",
    "no_proxy",
];

/// ingot with exactly the proxy variables in `env` (none inherited), no credentials.
fn ingot(args: &[&str], env: &[(&str, &str)]) -> Output {
    let mut cmd = Command::new(env!("CARGO_BIN_EXE_ingot"));
    cmd.args(args)
        .env_remove("OCI_REGISTRY_AUTH_TOKEN")
        .env_remove("REQUEST_METHOD")
        .env("DOCKER_CONFIG", "/nonexistent-ingot-test")
        .stdin(Stdio::null());
    for var in PROXY_VARS {
        cmd.env_remove(var);
    }
    cmd.envs(env.iter().copied());
    let out = cmd.output().unwrap();
    assert!(
        out.status.success(),
        "ingot {args:?} with {env:?}: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    out
}

fn p(path: &Path) -> &str {
    path.to_str().unwrap()
}

#[test]
fn http_proxy_is_used_and_no_proxy_bypasses_it() {
    if !have_tool(ingot_testkit::test_name!(), "docker-registry") {
        return;
    }
    let tmp = tempfile::tempdir().unwrap();
    let (sk, _pk) = keypair(tmp.path(), "release");
    let layout = tmp.path().join("demo");
    build(&demo_manifest(), &layout, Some(&sk));
    let registry = Registry::start(&tmp.path().join("reg"), None);
    let target = registry.url("stacks/demo:1.0.0");
    ingot(&["publish", p(&layout), &target, "-q"], &[]);

    let proxy = ingot_testproxy::Proxy::start(
        "127.0.0.1:0".parse().unwrap(),
        registry.host().parse().unwrap(),
        ingot_testproxy::Faults::default(),
    )
    .unwrap();
    let proxy_url = format!("http://{}", proxy.host());
    let requests = || proxy.stats.requests.load(Ordering::SeqCst);
    let bytes = || proxy.stats.bytes.load(Ordering::SeqCst);
    let layout_bytes: u64 = walk_size(&layout.join("blobs"));

    // HTTP_PROXY: the whole pull (manifest and every blob) goes through the proxy.
    let pulled = tmp.path().join("pulled");
    ingot(
        &["pull", &target, p(&pulled), "-q"],
        &[("HTTP_PROXY", &proxy_url)],
    );
    assert_eq!(tree_digests(&pulled), tree_digests(&layout));
    assert!(
        requests() >= 3,
        "manifest and blobs proxied: {}",
        requests()
    );
    assert!(
        bytes() >= layout_bytes,
        "every blob byte came through the proxy: {} < {layout_bytes}",
        bytes()
    );

    // The lower-case spelling is read too.
    let before = requests();
    ingot(&["resolve", &target], &[("http_proxy", &proxy_url)]);
    assert!(requests() > before, "http_proxy used");

    // HTTPS_PROXY is for https:// registries only: a plain-HTTP registry is reached directly.
    let before = requests();
    ingot(&["resolve", &target], &[("HTTPS_PROXY", &proxy_url)]);
    assert_eq!(requests(), before, "HTTPS_PROXY not used for http://");

    // NO_PROXY naming the registry host (an address or a network): not proxied.
    let before = (requests(), bytes());
    for no_proxy in ["127.0.0.1", "localhost,127.0.0.0/8"] {
        let again = tmp.path().join(format!("again-{}", no_proxy.len()));
        ingot(
            &["pull", &target, p(&again), "-q"],
            &[("HTTP_PROXY", &proxy_url), ("NO_PROXY", no_proxy)],
        );
        assert_eq!(tree_digests(&again), tree_digests(&layout));
    }
    assert_eq!((requests(), bytes()), before, "NO_PROXY bypassed the proxy");
}

fn walk_size(dir: &Path) -> u64 {
    std::fs::read_dir(dir)
        .unwrap()
        .map(|e| {
            let e = e.unwrap();
            let meta = e.metadata().unwrap();
            if meta.is_dir() {
                walk_size(&e.path())
            } else {
                meta.len()
            }
        })
        .sum()
}
