//! `ingot-writer` takes the same registry options as `ingot`: against a real `docker-registry`
//! behind htpasswd, `--authfile` naming a docker config whose credential helper (a script on
//! PATH) gives the login writes the stack; a helper that fails stops the run before the target
//! is touched, naming the helper.

mod common;

use std::fs;
use std::os::unix::fs::PermissionsExt;
use std::path::Path;
use std::process::{Command, Output};

use common::{demo, registry_support};
use ingot_artifact::registry::auth::ExplicitAuth;
use ingot_artifact::registry::{push, Registry as Client, RegistryOptions, RegistryRef, Secret};

const USER: &str = "releaser";
const PASSWORD: &str = "Writer-Helper-Pw";

fn helper(bin: &Path, name: &str, body: &str) {
    let path = bin.join(format!("docker-credential-{name}"));
    fs::write(&path, body).unwrap();
    fs::set_permissions(&path, fs::Permissions::from_mode(0o755)).unwrap();
}

fn writer(url: &str, target: &Path, key: &Path, authfile: &Path, bin: &Path) -> Output {
    let path = format!(
        "{}:{}",
        bin.display(),
        std::env::var("PATH").unwrap_or_default()
    );
    Command::new(env!("CARGO_BIN_EXE_ingot-writer"))
        .arg(url)
        .arg("--target")
        .arg(target)
        .arg("--trust-key")
        .arg(key)
        .arg("--authfile")
        .arg(authfile)
        .env("PATH", path)
        .env("DOCKER_CONFIG", "/nonexistent-ingot-test")
        .env_remove("OCI_REGISTRY_AUTH_TOKEN")
        .output()
        .unwrap()
}

fn sha256(path: &Path) -> String {
    ingot_testkit::digest::sha256_file(path).unwrap()
}

#[test]
fn writer_uses_authfile_and_credential_helpers_and_a_failing_helper_stops_it() {
    if !ingot_testkit::skip::have_tool(ingot_testkit::test_name!(), "docker-registry") {
        return;
    }
    let stack = demo();
    let tmp = tempfile::tempdir().unwrap();
    let t = tmp.path();
    let registry = registry_support::Registry::start(
        &t.join("reg"),
        Some(&registry_support::htpasswd_line(USER, PASSWORD)),
    );
    let url = format!("oci://127.0.0.1:{}/stacks/demo:1.0.0", registry.port);
    let reference: RegistryRef = url.parse().unwrap();
    let options = RegistryOptions {
        auth: ExplicitAuth {
            username: Some(USER.into()),
            password: Some(Secret::new(PASSWORD)),
            authfile: None,
        },
        progress: false,
        ..RegistryOptions::default()
    };
    let client = Client::connect(&reference, options).unwrap();
    push::publish(&client, &stack.layout, &reference, false).unwrap();

    let bin = t.join("bin");
    fs::create_dir_all(&bin).unwrap();
    let calls = t.join("calls");
    helper(
        &bin,
        "good",
        &format!(
            "#!/bin/sh\nread server\necho \"$server\" >> {}\n\
             echo '{{\"Username\":\"{USER}\",\"Secret\":\"{PASSWORD}\"}}'\n",
            calls.display()
        ),
    );
    helper(
        &bin,
        "broken",
        "#!/bin/sh\nread server\necho 'error: the keyring is locked' >&2\nexit 1\n",
    );
    let host = format!("127.0.0.1:{}", registry.port);
    let good = t.join("good.json");
    fs::write(&good, format!(r#"{{"credHelpers":{{"{host}":"good"}}}}"#)).unwrap();
    let broken = t.join("broken.json");
    fs::write(
        &broken,
        format!(r#"{{"credHelpers":{{"{host}":"broken"}}}}"#),
    )
    .unwrap();

    // A failing helper: the run stops before the target, which keeps every byte.
    let img = t.join("disk.img");
    fs::File::create(&img).unwrap().set_len(1 << 30).unwrap();
    let before = sha256(&img);
    let out = writer(&url, &img, &stack.public, &broken, &bin);
    let err = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(1), "{out:?}");
    assert!(
        err.contains("docker-credential-broken") && err.contains("the keyring is locked"),
        "{err}"
    );
    assert!(err.contains("nothing was written"), "{err}");
    assert_eq!(sha256(&img), before);

    // The helper that answers: the stack is written.
    let out = writer(&url, &img, &stack.public, &good, &bin);
    assert!(out.status.success(), "{out:?}");
    let asked = fs::read_to_string(&calls).unwrap();
    assert!(
        !asked.is_empty() && asked.lines().all(|l| l == host),
        "{asked}"
    );
    assert_ne!(sha256(&img), before);
}
