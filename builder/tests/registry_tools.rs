//! The registry options every command shares, against a real Debian `docker-registry`
//! (distribution 2.8) behind htpasswd and a TLS certificate from a throwaway CA made by openssl:
//! `--ca-file`, `--insecure`, docker credential helpers (`credHelpers`, `credsStore`) run from
//! PATH by every command, and a failing helper as a clear error.

mod common;
use ingot_testkit::registry as registry_support;

use std::fs;
use std::net::TcpStream;
use std::os::unix::fs::PermissionsExt;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Output, Stdio};
use std::time::{Duration, Instant};

use common::{build, demo_manifest, have_tool, keypair};
use registry_support::{free_port, htpasswd_line};

const USER: &str = "releaser";
const PASSWORD: &str = "Tls-Registry-Pw";

fn p(path: &Path) -> &str {
    path.to_str().unwrap()
}

fn run_ok(cmd: &mut Command) {
    let out = cmd.output().unwrap();
    assert!(out.status.success(), "{cmd:?}: {out:?}");
}

/// A CA and a server certificate for 127.0.0.1 signed by it: (ca.crt, server.crt, server.key).
fn certificates(dir: &Path) -> (PathBuf, PathBuf, PathBuf) {
    let ec = [
        "-newkey",
        "ec",
        "-pkeyopt",
        "ec_paramgen_curve:prime256v1",
        "-nodes",
    ];
    run_ok(
        Command::new("openssl")
            .args(["req", "-x509", "-days", "2", "-subj", "/CN=ingot test CA"])
            .args(ec)
            .arg("-keyout")
            .arg(dir.join("ca.key"))
            .arg("-out")
            .arg(dir.join("ca.crt")),
    );
    run_ok(
        Command::new("openssl")
            .args(["req", "-subj", "/CN=127.0.0.1"])
            .args(ec)
            .arg("-keyout")
            .arg(dir.join("server.key"))
            .arg("-out")
            .arg(dir.join("server.csr")),
    );
    fs::write(
        dir.join("ext.cnf"),
        "subjectAltName=IP:127.0.0.1\nbasicConstraints=CA:FALSE\nextendedKeyUsage=serverAuth\n",
    )
    .unwrap();
    run_ok(
        Command::new("openssl")
            .args(["x509", "-req", "-days", "2", "-CAcreateserial"])
            .arg("-in")
            .arg(dir.join("server.csr"))
            .arg("-CA")
            .arg(dir.join("ca.crt"))
            .arg("-CAkey")
            .arg(dir.join("ca.key"))
            .arg("-extfile")
            .arg(dir.join("ext.cnf"))
            .arg("-out")
            .arg(dir.join("server.crt")),
    );
    (
        dir.join("ca.crt"),
        dir.join("server.crt"),
        dir.join("server.key"),
    )
}

/// `docker-registry serve` over TLS with htpasswd auth. Killed on drop.
struct TlsRegistry {
    port: u16,
    child: Child,
    log: PathBuf,
}

impl TlsRegistry {
    fn start(dir: &Path, cert: &Path, key: &Path) -> TlsRegistry {
        fs::create_dir_all(dir.join("data")).unwrap();
        fs::write(dir.join("htpasswd"), htpasswd_line(USER, PASSWORD)).unwrap();
        let port = free_port();
        let config = format!(
            "version: 0.1\nlog:\n  level: info\n\
             storage:\n  filesystem:\n    rootdirectory: {data}\n\
             http:\n  addr: 127.0.0.1:{port}\n  tls:\n    certificate: {cert}\n    key: {key}\n\
             auth:\n  htpasswd:\n    realm: ingot-test\n    path: {htpasswd}\n",
            data = dir.join("data").display(),
            cert = cert.display(),
            key = key.display(),
            htpasswd = dir.join("htpasswd").display(),
        );
        fs::write(dir.join("config.yml"), config).unwrap();
        let log = dir.join("registry.log");
        let out = fs::File::create(&log).unwrap();
        let child = Command::new("docker-registry")
            .arg("serve")
            .arg(dir.join("config.yml"))
            .stdin(Stdio::null())
            .stdout(out.try_clone().unwrap())
            .stderr(out)
            .spawn()
            .expect("starting docker-registry");
        let mut reg = TlsRegistry { port, child, log };
        let deadline = Instant::now() + Duration::from_secs(20);
        while TcpStream::connect(("127.0.0.1", port)).is_err() {
            if let Ok(Some(st)) = reg.child.try_wait() {
                panic!("docker-registry exited ({st}):\n{}", reg.log_text());
            }
            assert!(
                Instant::now() < deadline,
                "no registry:\n{}",
                reg.log_text()
            );
            std::thread::sleep(Duration::from_millis(50));
        }
        reg
    }

    fn host(&self) -> String {
        format!("127.0.0.1:{}", self.port)
    }

    fn url(&self, rest: &str) -> String {
        format!("oci://{}/{rest}", self.host())
    }

    fn log_text(&self) -> String {
        fs::read_to_string(&self.log).unwrap_or_default()
    }
}

impl Drop for TlsRegistry {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// A `bin/` with `docker-credential-NAME` scripts: `good` logs each call's registry (stdin) to
/// `calls` and answers with the registry's credentials; `broken` fails as a helper whose store is
/// locked does; `empty` says it holds nothing, as docker's helpers do.
fn helpers(dir: &Path) -> (PathBuf, PathBuf) {
    let bin = dir.join("bin");
    fs::create_dir_all(&bin).unwrap();
    let calls = dir.join("helper-calls");
    let scripts = [
        (
            "good",
            format!(
                "#!/bin/sh\n[ \"$1\" = get ] || exit 3\nread server\n\
                 echo \"$server\" >> {calls}\n\
                 printf '{{\"ServerURL\":\"%s\",\"Username\":\"{USER}\",\"Secret\":\"{PASSWORD}\"}}\\n' \"$server\"\n",
                calls = calls.display()
            ),
        ),
        (
            "broken",
            "#!/bin/sh\nread server\necho 'error: the keyring is locked' >&2\nexit 1\n".to_owned(),
        ),
        (
            "empty",
            "#!/bin/sh\nread server\necho 'credentials not found in native keychain'\nexit 1\n".to_owned(),
        ),
    ];
    for (name, body) in scripts {
        let path = bin.join(format!("docker-credential-{name}"));
        fs::write(&path, body).unwrap();
        fs::set_permissions(&path, fs::Permissions::from_mode(0o755)).unwrap();
    }
    (bin, calls)
}

/// A docker config dir whose config.json is `json`.
fn docker_dir(dir: &Path, name: &str, json: &str) -> PathBuf {
    let d = dir.join(name);
    fs::create_dir_all(&d).unwrap();
    fs::write(d.join("config.json"), json).unwrap();
    d
}

/// Run ingot with `DOCKER_CONFIG=config` and `bin` first on PATH; nothing else inherited that
/// carries credentials.
fn ingot(args: &[&str], config: &Path, bin: &Path) -> Output {
    let path = format!(
        "{}:{}",
        bin.display(),
        std::env::var("PATH").unwrap_or_default()
    );
    let mut child = Command::new(env!("CARGO_BIN_EXE_ingot"))
        .args(args)
        .env_remove("RUST_LOG")
        .env_remove("OCI_REGISTRY_AUTH_TOKEN")
        .env_remove("HTTPS_PROXY")
        .env_remove("https_proxy")
        .env("DOCKER_CONFIG", config)
        .env("PATH", path)
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    drop(child.stdin.take());
    child.wait_with_output().unwrap()
}

fn ingot_s(args: &[String], config: &Path, bin: &Path) -> Output {
    let args: Vec<&str> = args.iter().map(String::as_str).collect();
    ingot(&args, config, bin)
}

/// Exit code, stdout and stderr, for an assertion's message.
use ingot_testkit::command::describe as text;

fn calls(path: &Path) -> usize {
    fs::read_to_string(path).map_or(0, |s| s.lines().count())
}

/// A CA file that is no certificate, `--insecure` with `--plain-http`, and a leaf given as the
/// CA: each refused.
fn untrusted_tls_is_refused(layout: &Path, target: &str, cert: &Path, good: &Path, bin: &Path) {
    let out = ingot(&["resolve", target, "--ca-file", "/dev/null"], good, bin);
    assert_eq!(out.status.code(), Some(2), "{}", text(&out));
    assert!(
        text(&out).contains("not a PEM certificate"),
        "{}",
        text(&out)
    );
    let out = ingot(
        &[
            "publish",
            p(layout),
            target,
            "-q",
            "--insecure",
            "--plain-http",
        ],
        good,
        bin,
    );
    assert_eq!(out.status.code(), Some(2), "{}", text(&out));
    let out = ingot(
        &[
            "publish",
            p(layout),
            target,
            "-q",
            "--retries",
            "1",
            "--ca-file",
            p(cert),
        ],
        good,
        bin,
    );
    assert!(
        !out.status.success(),
        "a leaf as CA must not verify: {}",
        text(&out)
    );
}

/// `--insecure` reaches the TLS registry with credsStore as the helper, and `--authfile`
/// names the config instead of DOCKER_CONFIG: both resolve `target` (the first to `digest`).
fn insecure_and_authfile(t: &Path, target: &str, bin: &Path, digest: &str) {
    let store = docker_dir(t, "store", r#"{"credsStore":"good"}"#);
    let out = ingot(&["resolve", target, "--insecure"], &store, bin);
    assert!(out.status.success(), "{}", text(&out));
    assert_eq!(String::from_utf8_lossy(&out.stdout).trim(), digest);
    // --authfile names the config instead of DOCKER_CONFIG.
    let nowhere = t.join("no-docker-config");
    let out = ingot(
        &[
            "resolve",
            target,
            "--insecure",
            "--authfile",
            p(&store.join("config.json")),
        ],
        &nowhere,
        bin,
    );
    assert!(out.status.success(), "{}", text(&out));
}

/// A command stopped with exit `code` by the broken credential helper, which it names.
fn refused_by_helper(out: &Output, args: &[&str], code: i32) {
    assert_eq!(out.status.code(), Some(code), "{args:?}: {}", text(out));
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(
        err.contains("docker-credential-broken") && err.contains("the keyring is locked"),
        "{args:?}: {err}"
    );
}

#[test]
fn tls_registry_with_ca_file_insecure_and_credential_helpers_on_every_command() {
    let test = ingot_testkit::test_name!();
    if !have_tool(test, "docker-registry") || !have_tool(test, "openssl") {
        return;
    }
    let tmp = tempfile::tempdir().unwrap();
    let t = tmp.path();
    let (sk, pk) = keypair(t, "release");
    let layout = t.join("demo");
    build(&demo_manifest(), &layout, Some(&sk));
    let (ca, cert, key) = certificates(t);
    let reg = TlsRegistry::start(&t.join("reg"), &cert, &key);
    let target = reg.url("stacks/demo:1.0.0");
    let (bin, calls_file) = helpers(t);
    let host = reg.host();
    let good = docker_dir(
        t,
        "good",
        &format!(r#"{{"credHelpers":{{"{host}":"good"}}}}"#),
    );
    let ca = p(&ca).to_owned();
    let with_ca = |args: &[&str]| -> Vec<String> {
        args.iter()
            .map(|a| a.to_string())
            .chain(["--ca-file".to_owned(), ca.clone()])
            .collect()
    };

    // TLS with a certificate no one trusts: refused, and the message says why.
    untrusted_tls_is_refused(&layout, &target, &cert, &good, &bin);

    // --ca-file: every command reaches the registry, each running the helper once or more.
    let mut expected_calls = 0;
    let mut step = |args: &[&str], want: i32| {
        let out = ingot_s(&with_ca(args), &good, &bin);
        assert_eq!(out.status.code(), Some(want), "{args:?}: {}", text(&out));
        let now = calls(&calls_file);
        assert!(
            now > expected_calls,
            "{args:?} did not run the helper: {}",
            text(&out)
        );
        expected_calls = now;
        out
    };
    let digest = step(&["publish", p(&layout), &target, "-q"], 0);
    let digest = String::from_utf8_lossy(&digest.stdout).trim().to_owned();
    let out = step(&["resolve", &target], 0);
    assert_eq!(String::from_utf8_lossy(&out.stdout).trim(), digest);
    let pulled = t.join("pulled");
    step(&["pull", &target, p(&pulled), "-q"], 0);
    step(&["verify", &target, "--trust-key", p(&pk), "-q"], 0);
    let out = step(&["inspect", &target, "--json"], 0);
    assert!(String::from_utf8_lossy(&out.stdout).contains(&digest));
    let out = step(&["diff", &target, p(&layout), "--json"], 0);
    assert!(String::from_utf8_lossy(&out.stdout).contains("\"changed\": false"));
    // The helper was asked for exactly this registry.
    let asked = fs::read_to_string(&calls_file).unwrap();
    assert!(asked.lines().all(|l| l == host), "{asked}");

    // --insecure: TLS without verification works, also with credsStore as the helper.
    insecure_and_authfile(t, &target, &bin, &digest);

    // A helper that fails: every command stops with a clear authentication error (exit 6, or
    // verify/inspect/diff's input error) naming the helper, never an anonymous attempt.
    let broken = docker_dir(
        t,
        "broken",
        &format!(r#"{{"credHelpers":{{"{host}":"broken"}}}}"#),
    );
    let p2 = t.join("p2");
    let runs: [(&[&str], i32); 6] = [
        (
            &["publish", p(&layout), &target, "-q", "--allow-overwrite"],
            6,
        ),
        (&["pull", &target, p(&p2), "-q"], 6),
        (&["resolve", &target], 6),
        (&["verify", &target, "--trust-key", p(&pk)], 1),
        (&["inspect", &target], 1),
        (&["diff", &target, p(&layout)], 2),
    ];
    for (args, code) in runs {
        let out = ingot_s(&with_ca(args), &broken, &bin);
        refused_by_helper(&out, args, code);
    }
    // A helper that is not on PATH is as clear.
    let missing = docker_dir(t, "missing", r#"{"credsStore":"nosuch"}"#);
    let out = ingot_s(&with_ca(&["resolve", &target]), &missing, &bin);
    assert_eq!(out.status.code(), Some(6), "{}", text(&out));
    assert!(
        text(&out).contains("could not run docker-credential-nosuch"),
        "{}",
        text(&out)
    );
    // A helper that holds nothing for this registry: anonymous, which this registry refuses.
    let empty = docker_dir(t, "empty", r#"{"credsStore":"empty"}"#);
    let out = ingot_s(&with_ca(&["resolve", &target]), &empty, &bin);
    assert_eq!(out.status.code(), Some(6), "{}", text(&out));
    assert!(text(&out).contains("anonymous"), "{}", text(&out));
}
