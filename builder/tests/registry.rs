//! `ingot publish` / `pull` / `verify oci://` / `inspect oci://` against a real Debian
//! `docker-registry` (distribution 2.8) on 127.0.0.1: round trips, skopeo interop, basic auth
//! (htpasswd, docker config.json), a bearer token (OCI_REGISTRY_AUTH_TOKEN) demanded by a front
//! forwarding to the real registry, a registry killed and restarted mid-download (the pull
//! resumes with a Range request), an interrupted pull's partial file resumed by a rerun (bytes
//! counted by `ingot-testproxy`), and a corrupted blob in the registry's storage.

mod common;
use ingot_testkit::registry as registry_support;

use std::fs;
use std::io::Write;
use std::path::{Path, PathBuf};
use std::process::{Command, Output, Stdio};
use std::time::{Duration, Instant};

use common::{build, demo_manifest, have_tool, keypair, read_layout, repo};
use registry_support::{
    bulk_manifest, docker_config, htpasswd_line, tree_digests, Front, FrontOptions, Registry,
};

fn have_registry(test: &str) -> bool {
    have_tool(test, "docker-registry")
}

/// Run ingot with args, env and optional stdin; no inherited credentials.
fn ingot_with(args: &[&str], env: &[(&str, &str)], stdin: Option<&str>) -> Output {
    let mut cmd = Command::new(env!("CARGO_BIN_EXE_ingot"));
    cmd.args(args)
        .env_remove("RUST_LOG")
        .env_remove("OCI_REGISTRY_AUTH_TOKEN")
        // An empty DOCKER_CONFIG dir unless the test gives one: never the developer's own.
        .env("DOCKER_CONFIG", "/nonexistent-ingot-test")
        .stdin(if stdin.is_some() {
            Stdio::piped()
        } else {
            Stdio::null()
        })
        .stdout(Stdio::piped())
        .stderr(Stdio::piped());
    for (k, v) in env {
        cmd.env(k, v);
    }
    let mut child = cmd.spawn().expect("running ingot");
    if let Some(s) = stdin {
        child.stdin.take().unwrap().write_all(s.as_bytes()).unwrap();
    }
    child.wait_with_output().unwrap()
}

/// Exit code, stdout and stderr, for an assertion's message.
use ingot_testkit::command::describe as text;

fn ok(o: Output) -> String {
    assert!(o.status.success(), "ingot failed:\n{}", text(&o));
    String::from_utf8_lossy(&o.stdout).trim().to_owned()
}

fn p(path: &Path) -> &str {
    path.to_str().unwrap()
}

/// A signed demo build: (layout dir, public key).
fn demo_build(dir: &Path) -> (PathBuf, PathBuf) {
    let (sk, pk) = keypair(dir, "release");
    let out = dir.join("demo");
    build(&demo_manifest(), &out, Some(&sk));
    (out, pk)
}

#[test]
fn publish_pull_verify_and_skopeo_round_trip() {
    let test = ingot_testkit::test_name!();
    if !have_registry(test) || !have_tool(test, "skopeo") {
        return;
    }
    let tmp = tempfile::tempdir().unwrap();
    let (layout, pk) = demo_build(tmp.path());
    let built = read_layout(&layout);
    let reg = Registry::start(&tmp.path().join("reg"), None);
    let target = reg.url("stacks/demo:1.0.0");

    // Publish: prints the layout's manifest digest.
    let digest = ok(ingot_with(
        &["publish", p(&layout), &target, "-q"],
        &[],
        None,
    ));
    assert_eq!(digest, built.manifest_digest);
    // Again: nothing to push, says so.
    let again = ingot_with(&["publish", p(&layout), &target, "-q"], &[], None);
    assert!(again.status.success(), "{}", text(&again));
    assert!(
        String::from_utf8_lossy(&again.stderr).contains("unchanged"),
        "{}",
        text(&again)
    );
    // The access log shows no blob upload the second time: count uploads before/after.
    let uploads = |log: &str| log.matches("POST /v2/stacks/demo/blobs/uploads/").count();
    let log = reg.log_text();
    let n_blobs = 1 + built.manifest["layers"].as_array().unwrap().len();
    assert_eq!(
        uploads(&log),
        n_blobs,
        "each blob uploaded exactly once:\n{log}"
    );

    // resolve names the digest; a missing tag is exit 7.
    assert_eq!(ok(ingot_with(&["resolve", &target], &[], None)), digest);
    let missing = ingot_with(&["resolve", &reg.url("stacks/demo:9.9.9")], &[], None);
    assert_eq!(missing.status.code(), Some(7), "{}", text(&missing));

    // Pull by tag: the same layout, byte for byte (blobs, index.json, oci-layout).
    let pulled = tmp.path().join("pulled");
    assert_eq!(
        ok(ingot_with(&["pull", &target, p(&pulled), "-q"], &[], None)),
        digest
    );
    assert_eq!(tree_digests(&pulled), tree_digests(&layout));
    ok(ingot_with(
        &["verify", p(&pulled), "--trust-key", p(&pk)],
        &[],
        None,
    ));

    // Pull by digest: same blobs.
    let by_digest = tmp.path().join("by-digest");
    let digest_ref = reg.url(&format!("stacks/demo@{digest}"));
    ok(ingot_with(
        &["pull", &digest_ref, p(&by_digest), "-q"],
        &[],
        None,
    ));
    assert_eq!(blob_digests(&by_digest), blob_digests(&layout));

    // verify and inspect straight from the registry.
    let v = ok(ingot_with(
        &["verify", &target, "--trust-key", p(&pk)],
        &[],
        None,
    ));
    assert!(
        v.contains(&digest) && v.contains("verified demo 1.0.0"),
        "{v}"
    );
    let inspect = ok(ingot_with(&["inspect", &digest_ref, "--json"], &[], None));
    let report: serde_json::Value = serde_json::from_str(&inspect).unwrap();
    assert_eq!(report["manifestDigest"], digest.as_str());
    assert_eq!(report["layers"].as_array().unwrap().len(), 4);

    chunked_and_digest_publishes(&reg, &layout, &digest, tmp.path());
    skopeo_copies_what_ingot_published(&reg, &layout, &pk, tmp.path());
    a_moved_tag_needs_allow_overwrite(&reg, &layout, tmp.path());
}

/// The blobs of the layout at `d` with their digests.
fn blob_digests(d: &Path) -> Vec<(String, String)> {
    tree_digests(d)
        .into_iter()
        .filter(|(n, _)| n.starts_with("blobs/"))
        .collect()
}

/// Chunked uploads (4 MiB PATCHes) and a publish under a digest reference give `digest` too.
fn chunked_and_digest_publishes(reg: &Registry, layout: &Path, digest: &str, tmp: &Path) {
    let chunked = reg.url("stacks/chunked:1.0.0");
    assert_eq!(
        ok(ingot_with(
            &["publish", p(layout), &chunked, "-q", "--chunked"],
            &[],
            None
        )),
        digest
    );
    let chunked_pull = tmp.join("chunked");
    ok(ingot_with(
        &["pull", &chunked, p(&chunked_pull), "-q"],
        &[],
        None,
    ));
    assert_eq!(tree_digests(&chunked_pull), tree_digests(layout));
    assert!(reg
        .log_text()
        .contains("PATCH /v2/stacks/chunked/blobs/uploads/"));

    // Publishing under a digest reference works too (no tag).
    let other = reg.url(&format!("stacks/by-digest@{digest}"));
    assert_eq!(
        ok(ingot_with(&["publish", p(layout), &other, "-q"], &[], None)),
        digest
    );
}

/// skopeo copies what ingot published; the copy verifies.
fn skopeo_copies_what_ingot_published(reg: &Registry, layout: &Path, pk: &Path, tmp: &Path) {
    let sk_dir = tmp.join("skopeo");
    let src = format!("docker://{}/stacks/demo:1.0.0", reg.host());
    let dst = format!("oci:{}:1.0.0", sk_dir.display());
    let out = Command::new("skopeo")
        .args(["copy", "--src-tls-verify=false", &src, &dst])
        .output()
        .unwrap();
    assert!(
        out.status.success(),
        "skopeo copy: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    ok(ingot_with(
        &["verify", p(&sk_dir), "--trust-key", p(pk)],
        &[],
        None,
    ));
    assert_eq!(blob_digests(&sk_dir), blob_digests(layout));
}

/// A tag naming other content is not moved without --allow-overwrite (exit 9).
fn a_moved_tag_needs_allow_overwrite(reg: &Registry, layout: &Path, tmp: &Path) {
    let tag_other = reg.url("stacks/demo:moving");
    ok(ingot_with(
        &["publish", p(layout), &tag_other, "-q"],
        &[],
        None,
    ));
    let unsigned = tmp.join("unsigned");
    build(&demo_manifest(), &unsigned, None);
    let conflict = ingot_with(&["publish", p(&unsigned), &tag_other, "-q"], &[], None);
    assert_eq!(conflict.status.code(), Some(9), "{}", text(&conflict));
    ok(ingot_with(
        &[
            "publish",
            p(&unsigned),
            &tag_other,
            "-q",
            "--allow-overwrite",
        ],
        &[],
        None,
    ));
}

#[test]
fn basic_auth_flags_docker_config_and_token_env() {
    let test = ingot_testkit::test_name!();
    if !have_registry(test) {
        return;
    }
    let tmp = tempfile::tempdir().unwrap();
    let (layout, pk) = demo_build(tmp.path());
    let password = "Corr3ct-Horse-Battery";
    let reg = Registry::start(
        &tmp.path().join("reg"),
        Some(&htpasswd_line("releaser", password)),
    );
    let target = reg.url("stacks/demo:1.0.0");

    // No credentials: a clear authentication error, exit 6.
    let none = ingot_with(&["publish", p(&layout), &target, "-q"], &[], None);
    assert_eq!(none.status.code(), Some(6), "{}", text(&none));
    let err = String::from_utf8_lossy(&none.stderr);
    assert!(
        err.contains("authentication to") && err.contains("anonymous"),
        "{err}"
    );

    // Wrong password: exit 6, and the password is not echoed.
    let wrong = ingot_with(
        &[
            "publish",
            p(&layout),
            &target,
            "-q",
            "--username",
            "releaser",
            "--password-stdin",
        ],
        &[],
        Some("not-the-password\n"),
    );
    assert_eq!(wrong.status.code(), Some(6), "{}", text(&wrong));
    assert!(!text(&wrong).contains("not-the-password"));

    // Right password on stdin: published. Debug logs on, the password never printed.
    let good = ingot_with(
        &[
            "-vv",
            "publish",
            p(&layout),
            &target,
            "-q",
            "--username",
            "releaser",
            "--password-stdin",
        ],
        &[],
        Some(&format!("{password}\n")),
    );
    assert!(good.status.success(), "{}", text(&good));
    assert!(
        !text(&good).contains(password),
        "the password leaked:\n{}",
        text(&good)
    );

    // docker config.json (DOCKER_CONFIG) credentials pull it back; it verifies.
    let cfg = tmp.path().join("docker");
    docker_config(&cfg, &reg.host(), "releaser", password);
    let pulled = tmp.path().join("pulled");
    let out = ingot_with(
        &["-vv", "pull", &target, p(&pulled), "-q"],
        &[("DOCKER_CONFIG", p(&cfg))],
        None,
    );
    assert!(out.status.success(), "{}", text(&out));
    assert!(!text(&out).contains(password));
    ok(ingot_with(
        &["verify", p(&pulled), "--trust-key", p(&pk)],
        &[],
        None,
    ));
    // verify straight from the registry with the same config.
    ok(ingot_with(
        &["verify", &target, "--trust-key", p(&pk)],
        &[("DOCKER_CONFIG", p(&cfg))],
        None,
    ));

    // A config.json with a wrong password: exit 6.
    let bad_cfg = tmp.path().join("docker-bad");
    docker_config(&bad_cfg, &reg.host(), "releaser", "nope");
    let bad = ingot_with(
        &["pull", &target, p(&tmp.path().join("x")), "-q"],
        &[("DOCKER_CONFIG", p(&bad_cfg))],
        None,
    );
    assert_eq!(bad.status.code(), Some(6), "{}", text(&bad));

    // CAPH's user:password form of OCI_REGISTRY_AUTH_TOKEN logs in with those credentials.
    let caph = ingot_with(
        &["-vv", "resolve", &target],
        &[("OCI_REGISTRY_AUTH_TOKEN", &format!("releaser:{password}"))],
        None,
    );
    assert!(caph.status.success(), "{}", text(&caph));
    assert!(!text(&caph).contains(password));
}

#[test]
fn bearer_token_from_env_reaches_the_registry_and_never_the_output() {
    let test = ingot_testkit::test_name!();
    if !have_registry(test) {
        return;
    }
    use base64::Engine;
    let tmp = tempfile::tempdir().unwrap();
    let (layout, pk) = demo_build(tmp.path());
    let reg = Registry::start(&tmp.path().join("reg"), None);
    let token = "ghp_ingotTestToken0123456789abcdefXYZ";
    // CAPH's download script sends `Authorization: Bearer $(echo $TOKEN | base64)`-style: the
    // token base64-encoded.
    let wire = base64::engine::general_purpose::STANDARD.encode(token);
    let front = Front::start(
        reg.port,
        FrontOptions {
            bearer: Some(wire.clone()),
            rate: None,
        },
    );
    let target = front.url("stacks/demo:1.0.0");

    // Without the token: refused, exit 6.
    let none = ingot_with(&["publish", p(&layout), &target, "-q"], &[], None);
    assert_eq!(none.status.code(), Some(6), "{}", text(&none));
    // A wrong token: exit 6.
    let wrong = ingot_with(
        &["publish", p(&layout), &target, "-q"],
        &[("OCI_REGISTRY_AUTH_TOKEN", "ghp_wrong")],
        None,
    );
    assert_eq!(wrong.status.code(), Some(6), "{}", text(&wrong));

    // The token: publish, pull, verify from the registry; debug logs on.
    let env = [("OCI_REGISTRY_AUTH_TOKEN", token)];
    let outputs = [
        ingot_with(&["-vvv", "publish", p(&layout), &target, "-q"], &env, None),
        ingot_with(
            &["-vvv", "pull", &target, p(&tmp.path().join("pulled")), "-q"],
            &env,
            None,
        ),
        ingot_with(
            &["-vvv", "verify", &target, "--trust-key", p(&pk)],
            &env,
            None,
        ),
    ];
    for o in &outputs {
        assert!(o.status.success(), "{}", text(o));
        let t = text(o);
        assert!(
            !t.contains(token) && !t.contains(&wire),
            "the token leaked:\n{t}"
        );
    }
    let seen = front.auth_seen.lock().unwrap().clone();
    assert!(seen.iter().any(|a| a == &format!("Bearer {wire}")));
    assert_eq!(
        tree_digests(&tmp.path().join("pulled")),
        tree_digests(&layout)
    );
}

/// One authorization path: a `401` naming a token realm other than the one `/v2/` named (a token
/// that expired, a repository behind another token service) is answered the same way for a push
/// and a pull: a token from the realm the `401` names, for the access the request needs, and the
/// request once more. The front passes nothing without realm `b`'s token, which only that answer
/// obtains.
#[test]
fn a_401_naming_a_new_token_realm_is_answered_alike_for_a_push_and_a_pull() {
    let test = ingot_testkit::test_name!();
    if !have_registry(test) {
        return;
    }
    let tmp = tempfile::tempdir().unwrap();
    let (layout, pk) = demo_build(tmp.path());
    let reg = Registry::start(&tmp.path().join("reg"), None);
    let front = Front::start_with_realms(reg.port);
    let target = front.url("stacks/demo:1.0.0");
    let issued = || std::mem::take(&mut *front.tokens.lock().unwrap());

    ok(ingot_with(
        &["publish", p(&layout), &target, "-q"],
        &[],
        None,
    ));
    let pushed = issued();
    let pulled_dir = tmp.path().join("pulled");
    ok(ingot_with(
        &["pull", &target, p(&pulled_dir), "-q"],
        &[],
        None,
    ));
    let pulled = issued();
    ok(ingot_with(
        &["verify", &target, "--trust-key", p(&pk)],
        &[],
        None,
    ));

    let scope = "repository:stacks/demo";
    assert!(
        pushed.contains(&format!("b {scope}:pull,push")),
        "the push asked realm b for no push token: {pushed:?}"
    );
    assert!(
        pulled.contains(&format!("b {scope}:pull")),
        "the pull asked realm b for no pull token: {pulled:?}"
    );
    assert!(
        !pulled.iter().any(|t| t.ends_with("push")),
        "a pull asked for push access: {pulled:?}"
    );
    assert!(front.refused.load(std::sync::atomic::Ordering::Relaxed) > 0);
    assert_eq!(tree_digests(&pulled_dir), tree_digests(&layout));
}

/// A signed stack with a layer of `bytes` random bytes (`bulk_manifest`), built in `dir` and
/// published to a fresh registry as `stacks/bulk:1.0.0`: (layout, public key, registry).
fn published_bulk(dir: &Path, bytes: usize) -> (PathBuf, PathBuf, Registry) {
    let (sk, pk) = keypair(dir, "release");
    let manifest = bulk_manifest(&repo(), dir, bytes);
    let layout = dir.join("bulk");
    build(&manifest, &layout, Some(&sk));
    let reg = Registry::start(&dir.join("reg"), None);
    ok(ingot_with(
        &["publish", p(&layout), &reg.url("stacks/bulk:1.0.0"), "-q"],
        &[],
        None,
    ));
    (layout, pk, reg)
}

/// A blob larger than one chunk goes up in several 4 MiB `PATCH`es, each to the location the
/// answer before it named, and comes back whole.
#[test]
fn a_chunked_upload_of_a_large_blob_takes_several_patches() {
    let test = ingot_testkit::test_name!();
    if !have_registry(test) {
        return;
    }
    let tmp = tempfile::tempdir().unwrap();
    let (layout, _pk, reg) = published_bulk(tmp.path(), 9 << 20);
    let chunked = reg.url("stacks/chunked-bulk:1.0.0");
    ok(ingot_with(
        &["publish", p(&layout), &chunked, "-q", "--chunked"],
        &[],
        None,
    ));
    let patches = reg
        .log_text()
        .matches("PATCH /v2/stacks/chunked-bulk/blobs/uploads/")
        .count();
    assert!(patches >= 3, "{patches} PATCH requests for a 9 MiB blob");
    let pulled = tmp.path().join("pulled");
    ok(ingot_with(&["pull", &chunked, p(&pulled), "-q"], &[], None));
    assert_eq!(tree_digests(&pulled), tree_digests(&layout));
}

#[test]
fn pull_resumes_with_range_after_the_registry_restarts() {
    let test = ingot_testkit::test_name!();
    if !have_registry(test) {
        return;
    }
    let tmp = tempfile::tempdir().unwrap();
    let (layout, pk, mut reg) = published_bulk(tmp.path(), 48 << 20);
    let built = read_layout(&layout);
    let big = built.layer("bulk")["data"]["digest"]
        .as_str()
        .unwrap()
        .to_owned();
    let big_size = built.layer("bulk")["data"]["size"].as_u64().unwrap();
    assert!(big_size > 40 << 20, "the bulk blob is {big_size} bytes");

    // Pull through a front that slows responses to 12 MB/s, so the kill lands mid-blob.
    let front = Front::start(
        reg.port,
        FrontOptions {
            bearer: None,
            rate: Some(12_000_000),
        },
    );
    let out = tmp.path().join("pulled");
    let child = Command::new(env!("CARGO_BIN_EXE_ingot"))
        .args([
            "-v",
            "pull",
            &front.url("stacks/bulk:1.0.0"),
            p(&out),
            "-q",
            "--concurrency",
            "1",
        ])
        .env_remove("OCI_REGISTRY_AUTH_TOKEN")
        .env("DOCKER_CONFIG", "/nonexistent-ingot-test")
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    // Wait until a partial download of the big blob has 8 MiB, then kill the registry.
    let blobs_dir = out.join("blobs/sha256");
    let deadline = Instant::now() + Duration::from_secs(60);
    let partial_len = || -> u64 {
        fs::read_dir(&blobs_dir)
            .map(|rd| {
                rd.filter_map(|e| e.ok())
                    .filter(|e| e.file_name().to_string_lossy().starts_with(".partial-"))
                    .filter_map(|e| e.metadata().ok())
                    .map(|m| m.len())
                    .max()
                    .unwrap_or(0)
            })
            .unwrap_or(0)
    };
    while partial_len() < 8 << 20 {
        assert!(
            Instant::now() < deadline,
            "the download never reached 8 MiB"
        );
        std::thread::sleep(Duration::from_millis(10));
    }
    reg.stop();
    let stopped_at = partial_len();
    std::thread::sleep(Duration::from_millis(1500));
    reg.restart();
    let o = child.wait_with_output().unwrap();
    assert!(o.status.success(), "pull failed:\n{}", text(&o));
    assert!(stopped_at < big_size, "the kill came after the download");

    // The registry's access log: a 206 (a Range request) for the big blob after the restart.
    let log = reg.log_text();
    let hex = big.strip_prefix("sha256:").unwrap();
    let ranged: Vec<&str> = log
        .lines()
        .filter(|l| {
            l.contains(&format!("GET /v2/stacks/bulk/blobs/sha256:{hex}")) && l.contains("\" 206 ")
        })
        .collect();
    assert!(
        !ranged.is_empty(),
        "no Range request in the access log:\n{log}"
    );
    let stderr = String::from_utf8_lossy(&o.stderr);
    assert!(stderr.contains("resuming at byte"), "{stderr}");

    // The result is whole and verifies.
    assert_eq!(tree_digests(&out), tree_digests(&layout));
    ok(ingot_with(
        &["verify", p(&out), "--trust-key", p(&pk)],
        &[],
        None,
    ));
}

#[test]
fn a_corrupted_blob_in_the_registry_is_refused_and_not_kept() {
    let test = ingot_testkit::test_name!();
    if !have_registry(test) {
        return;
    }
    let tmp = tempfile::tempdir().unwrap();
    let (layout, pk) = demo_build(tmp.path());
    let reg = Registry::start(&tmp.path().join("reg"), None);
    let target = reg.url("stacks/demo:1.0.0");
    ok(ingot_with(
        &["publish", p(&layout), &target, "-q"],
        &[],
        None,
    ));

    // Flip one byte in the middle of the control-plane data blob in the registry's storage.
    let built = read_layout(&layout);
    let digest = built.layer("control-plane")["data"]["digest"]
        .as_str()
        .unwrap()
        .to_owned();
    let stored = reg.blob_data(&digest);
    let mut bytes = fs::read(&stored).unwrap();
    let mid = bytes.len() / 2;
    bytes[mid] ^= 0x40;
    fs::write(&stored, &bytes).unwrap();

    let out = tmp.path().join("pulled");
    let o = ingot_with(&["pull", &target, p(&out), "-q"], &[], None);
    assert_eq!(o.status.code(), Some(4), "{}", text(&o));
    let err = String::from_utf8_lossy(&o.stderr);
    assert!(err.contains(&digest) && err.contains("discarded"), "{err}");
    // Nothing of the bad blob is kept: not under its name, no partial file.
    let blobs_dir = out.join("blobs/sha256");
    assert!(!blobs_dir
        .join(digest.strip_prefix("sha256:").unwrap())
        .exists());
    for e in fs::read_dir(&blobs_dir).unwrap() {
        let name = e.unwrap().file_name().to_string_lossy().into_owned();
        assert!(!name.starts_with(".partial-"), "left behind: {name}");
    }
    assert!(
        !out.join("index.json").exists(),
        "an incomplete pull has no index.json"
    );

    // verify straight from the registry names the blob too (exit 4).
    let v = ingot_with(&["verify", &target, "--trust-key", p(&pk)], &[], None);
    assert_eq!(v.status.code(), Some(4), "{}", text(&v));
    assert!(
        String::from_utf8_lossy(&v.stderr).contains(&digest),
        "{}",
        text(&v)
    );
}

#[test]
fn bad_references_are_usage_errors() {
    for r in ["127.0.0.1:5000/demo:1", "oci://host/Upper:1", "oci://host"] {
        let o = ingot_with(&["resolve", r], &[], None);
        assert_eq!(o.status.code(), Some(2), "{r}: {}", text(&o));
    }
    let tmp = tempfile::tempdir().unwrap();
    let o = ingot_with(
        &["publish", p(tmp.path()), "oci://127.0.0.1:1/demo", "-q"],
        &[],
        None,
    );
    assert_eq!(o.status.code(), Some(2), "no tag: {}", text(&o));
}

#[test]
fn an_unreachable_registry_gives_up_after_the_retries() {
    // Nothing listens on this port: connection refused, retried, then exit 8.
    let port = registry_support::free_port();
    let start = Instant::now();
    let o = ingot_with(
        &[
            "resolve",
            &format!("oci://127.0.0.1:{port}/demo:1"),
            "--retries",
            "3",
        ],
        &[],
        None,
    );
    assert_eq!(o.status.code(), Some(8), "{}", text(&o));
    assert!(String::from_utf8_lossy(&o.stderr).contains("gave up after 3 attempts"));
    // Two backoffs: 0.5 s + 1 s.
    assert!(start.elapsed() >= Duration::from_millis(1400));
}

#[test]
fn release_script_publishes_once_and_a_rerun_changes_nothing() {
    let test = ingot_testkit::test_name!();
    if !have_registry(test) || !have_tool(test, "python3") {
        return;
    }
    let tmp = tempfile::tempdir().unwrap();
    let (sk, _pk) = keypair(tmp.path(), "release");
    let reg = Registry::start(&tmp.path().join("reg"), None);
    let notes = tmp.path().join("notes");
    let release = |label: &str| {
        let o = Command::new(repo().join("ci/release"))
            .arg(demo_manifest())
            .arg(reg.url("stacks/demo"))
            .env("INGOT", env!("CARGO_BIN_EXE_ingot"))
            .env("INGOT_RELEASE_KEY", &sk)
            .env("INGOT_RELEASE_NOTES", &notes)
            // The writer binary is a release build of its own: not in this test.
            .env("INGOT_RELEASE_WRITER", "0")
            .env_remove("OCI_REGISTRY_AUTH_TOKEN")
            .env("DOCKER_CONFIG", "/nonexistent-ingot-test")
            .output()
            .unwrap();
        assert!(o.status.success(), "{label}: {}", text(&o));
        String::from_utf8_lossy(&o.stdout).into_owned()
    };
    let first = release("first run");
    assert!(first.contains("release: published"), "{first}");
    let digest = ok(ingot_with(
        &["resolve", &reg.url("stacks/demo:1.0.0")],
        &[],
        None,
    ));
    let md = fs::read_to_string(notes.join("demo-1.0.0.md")).unwrap();
    let json: serde_json::Value =
        serde_json::from_slice(&fs::read(notes.join("demo-1.0.0.json")).unwrap()).unwrap();
    assert!(md.contains("# demo 1.0.0") && md.contains(&digest), "{md}");
    assert_eq!(json["manifestDigest"], digest.as_str());
    assert_eq!(json["version"], "1.0.0");
    let layers = json["layers"].as_array().unwrap();
    assert_eq!(layers.len(), 4);
    for l in layers {
        let root = l["rootHash"].as_str().unwrap();
        assert_eq!(root.len(), 64);
        assert!(md.contains(root) && md.contains(l["rule"].as_str().unwrap()));
    }
    let puts = |log: &str| log.matches("PUT /v2/stacks/demo/").count();
    let before = puts(&reg.log_text());

    let second = release("rerun");
    assert!(
        second.contains("already published") && second.contains(&digest),
        "{second}"
    );
    assert!(second.contains("unchanged"), "{second}");
    assert_eq!(puts(&reg.log_text()), before, "the rerun pushed something");
}

#[test]
fn library_api_resolves_fetches_the_descriptor_and_streams_a_blob() {
    let test = ingot_testkit::test_name!();
    if !have_registry(test) {
        return;
    }
    use ingot_artifact::registry::{
        Registry as Client, RegistryError, RegistryOptions, RegistryRef,
    };
    let tmp = tempfile::tempdir().unwrap();
    let (layout, _pk) = demo_build(tmp.path());
    let built = read_layout(&layout);
    let reg = Registry::start(&tmp.path().join("reg"), None);
    let target = reg.url("stacks/demo:1.0.0");
    ok(ingot_with(
        &["publish", p(&layout), &target, "-q"],
        &[],
        None,
    ));

    let reference: RegistryRef = target.parse().unwrap();
    let options = RegistryOptions {
        progress: false,
        ..RegistryOptions::default()
    };
    let client = Client::connect(&reference, options).unwrap();
    assert_eq!(client.resolve(&reference).unwrap(), built.manifest_digest);
    let stack = client.fetch_stack(&reference).unwrap();
    assert_eq!(stack.manifest_digest, built.manifest_digest);
    assert_eq!(stack.descriptor_bytes, built.descriptor_bytes);
    assert_eq!(
        stack.manifest_bytes,
        fs::read(common::blob_path(&layout, &built.manifest_digest)).unwrap()
    );

    // One blob to a sink, digest checked.
    let data = built.layer("control-plane")["data"].clone();
    let digest = data["digest"].as_str().unwrap();
    let size = data["size"].as_u64().unwrap();
    let mut sink = std::io::Cursor::new(Vec::new());
    client
        .stream_blob(&reference, digest, size, &mut sink, None)
        .unwrap();
    assert_eq!(
        sink.into_inner(),
        fs::read(built.data_blob("control-plane")).unwrap()
    );

    // A blob the registry does not have: NotFound, not retried.
    let missing = format!("sha256:{}", "0".repeat(64));
    let mut sink = std::io::Cursor::new(Vec::new());
    let err = client
        .stream_blob(&reference, &missing, 10, &mut sink, None)
        .unwrap_err();
    assert!(matches!(err, RegistryError::NotFound(_)), "{err:?}");
    // A tag that does not exist.
    let none: RegistryRef = reg.url("stacks/demo:0.0.0").parse().unwrap();
    assert_eq!(client.try_resolve(&none).unwrap(), None);
}

#[test]
fn a_killed_pull_rerun_keeps_the_finished_blobs_and_completes() {
    let test = ingot_testkit::test_name!();
    if !have_registry(test) {
        return;
    }
    let tmp = tempfile::tempdir().unwrap();
    let (layout, pk, reg) = published_bulk(tmp.path(), 32 << 20);
    let front = Front::start(
        reg.port,
        FrontOptions {
            bearer: None,
            rate: Some(8_000_000),
        },
    );
    let out = tmp.path().join("pulled");
    let mut child = Command::new(env!("CARGO_BIN_EXE_ingot"))
        .args(["pull", &front.url("stacks/bulk:1.0.0"), p(&out), "-q"])
        .env_remove("OCI_REGISTRY_AUTH_TOKEN")
        .env("DOCKER_CONFIG", "/nonexistent-ingot-test")
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .spawn()
        .unwrap();
    let blobs_dir = out.join("blobs/sha256");
    let names = || -> Vec<String> {
        fs::read_dir(&blobs_dir)
            .map(|rd| {
                rd.filter_map(|e| e.ok())
                    .map(|e| e.file_name().to_string_lossy().into_owned())
                    .collect()
            })
            .unwrap_or_default()
    };
    // Kill the pull once some blobs are complete and the big one is partly there.
    let deadline = Instant::now() + Duration::from_secs(60);
    loop {
        let n = names();
        let done = n.iter().filter(|x| !x.starts_with('.')).count();
        let partial_big = fs::read_dir(&blobs_dir).is_ok_and(|rd| {
            rd.filter_map(|e| e.ok()).any(|e| {
                e.file_name().to_string_lossy().starts_with(".partial-")
                    && e.metadata().is_ok_and(|m| m.len() > 4 << 20)
            })
        });
        if done >= 2 && partial_big {
            break;
        }
        assert!(Instant::now() < deadline, "the pull never got going: {n:?}");
        std::thread::sleep(Duration::from_millis(10));
    }
    child.kill().unwrap();
    child.wait().unwrap();
    assert!(!out.join("index.json").exists());

    // Again, straight from the registry: the finished blobs are kept, the partial file removed.
    let again = ingot_with(
        &["-v", "pull", &reg.url("stacks/bulk:1.0.0"), p(&out), "-q"],
        &[],
        None,
    );
    assert!(again.status.success(), "{}", text(&again));
    let err = String::from_utf8_lossy(&again.stderr);
    assert!(err.contains("left by an interrupted pull"), "{err}");
    let kept: usize = err
        .split(" already there")
        .next()
        .and_then(|s| s.rsplit(", ").next())
        .and_then(|s| s.trim().parse().ok())
        .unwrap_or_else(|| panic!("no count of kept blobs in: {err}"));
    assert!(kept >= 2, "{err}");
    assert!(names().iter().all(|n| !n.starts_with(".partial-")));
    assert_eq!(tree_digests(&out), tree_digests(&layout));
    ok(ingot_with(
        &["verify", p(&out), "--trust-key", p(&pk)],
        &[],
        None,
    ));
}

/// Issue 15, item 11: a rerun of an interrupted pull deleted its `.partial-*` files and fetched
/// those blobs again from their first byte. Now each partial file (named by its blob's digest)
/// is resumed with a Range request from its length; one with wrong bytes, or longer than its
/// blob, is discarded with a warning and the blob fetched again from the start. Bytes over the
/// wire are counted by `ingot-testproxy` between ingot and the real registry.
#[test]
fn a_rerun_resumes_a_partial_blob_with_a_range_request() {
    let test = ingot_testkit::test_name!();
    if !have_registry(test) {
        return;
    }
    let tmp = tempfile::tempdir().unwrap();
    let (layout, pk, reg) = published_bulk(tmp.path(), 8 << 20);
    let built = read_layout(&layout);
    let big = built.layer("bulk")["data"]["digest"]
        .as_str()
        .unwrap()
        .to_owned();
    let hex = big.strip_prefix("sha256:").unwrap();
    let blob = fs::read(common::blob_path(&layout, &big)).unwrap();
    let size = blob.len() as u64;
    let half = blob.len() / 2;
    let mut wrong = blob[..half].to_vec();
    wrong[half / 2] ^= 0x40;
    let longer = [blob.as_slice(), b"x"].concat();

    // (case, partial file's bytes, whether its bytes are kept, what stderr says)
    let cases: [(&str, &[u8], bool, &str); 3] = [
        ("prefix", &blob[..half], true, "resuming at byte"),
        (
            "wrong bytes",
            &wrong,
            false,
            "do not give its digest; discarded",
        ),
        ("longer", &longer, false, "more than the"),
    ];
    for (case, partial, kept, says) in cases {
        // What an interrupted pull leaves: the other blobs, no index.json, a partial file.
        let out = tmp.path().join(format!("pulled-{case}"));
        ok(ingot_with(
            &["pull", &reg.url("stacks/bulk:1.0.0"), p(&out), "-q"],
            &[],
            None,
        ));
        fs::remove_file(out.join("index.json")).unwrap();
        fs::remove_file(common::blob_path(&out, &big)).unwrap();
        let blobs_dir = out.join("blobs/sha256");
        fs::write(blobs_dir.join(format!(".partial-{hex}")), partial).unwrap();
        // A partial file of no blob this manifest names: removed.
        fs::write(blobs_dir.join(".partial-Ab12Cd"), b"stale").unwrap();

        let proxy = ingot_testproxy::Proxy::start(
            "127.0.0.1:0".parse().unwrap(),
            reg.host().parse().unwrap(),
            ingot_testproxy::Faults::default(),
        )
        .unwrap();
        let source = format!("oci://{}/stacks/bulk:1.0.0", proxy.host());
        let o = ingot_with(&["-v", "pull", &source, p(&out), "-q", "--json"], &[], None);
        assert!(o.status.success(), "{case}: {}", text(&o));
        let stderr = String::from_utf8_lossy(&o.stderr);
        assert!(stderr.contains(says), "{case}: {stderr}");
        // What this run downloaded: the blob less the part an earlier run left, if kept; the
        // rest after a bad partial, then the whole blob again; the whole blob after a partial
        // too long to be one.
        let report: serde_json::Value = serde_json::from_slice(&o.stdout).unwrap();
        let want = match case {
            "prefix" => size - partial.len() as u64,
            "wrong bytes" => size - partial.len() as u64 + size,
            _ => size,
        };
        assert_eq!(report["bytesFetched"], want, "{case}: {report}");
        let wire = proxy.stats.bytes.load(std::sync::atomic::Ordering::SeqCst);
        let ranged = proxy.stats.ranged.load(std::sync::atomic::Ordering::SeqCst);
        eprintln!("{case}: {wire} bytes over the wire for a {size}-byte blob, {ranged} ranged");
        if kept {
            // Headers and the manifest included, still less than the blob: the prefix was kept.
            assert!(wire < size, "{case}: {wire} bytes fetched for {size}");
            assert_eq!(ranged, 1, "{case}");
        } else {
            assert!(wire > size, "{case}: {wire} bytes fetched for {size}");
        }
        assert_eq!(tree_digests(&out), tree_digests(&layout), "{case}");
        for e in fs::read_dir(&blobs_dir).unwrap() {
            let name = e.unwrap().file_name().to_string_lossy().into_owned();
            assert!(
                !name.starts_with(".partial-"),
                "{case}: left behind: {name}"
            );
        }
        ok(ingot_with(
            &["verify", p(&out), "--trust-key", p(&pk)],
            &[],
            None,
        ));
    }
}
