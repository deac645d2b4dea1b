//! The writer's local inputs read bounded (item 11 of "hostile input, second pass"): bootstrap
//! data or `--trust-key` that is `/dev/zero` or a FIFO, and a 1 GiB bootstrap data file, which
//! was read whole before the 64 MiB check. Each is refused before anything else happens, in
//! bounded memory and without hanging; peak RSS and wall time are printed.
//!
//! The writer never gets past its first step here, so no registry or disk is needed: the fixture
//! machine is only read.

use ingot_testkit::measure;

use std::path::Path;
use std::process::Command;
use std::time::Duration;

use ingot_testkit::machine::materialize;

const RSS_LIMIT_KIB: i64 = 96 << 10;

fn repo_root() -> std::path::PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR"))
        .parent()
        .unwrap()
        .to_owned()
}

fn mkfifo(path: &Path) {
    let c = std::ffi::CString::new(path.as_os_str().as_encoded_bytes()).unwrap();
    // SAFETY: a NUL-terminated path; mkfifo only reads it.
    #[allow(unsafe_code)]
    let rc = unsafe { libc::mkfifo(c.as_ptr(), 0o600) };
    assert_eq!(rc, 0, "mkfifo: {}", std::io::Error::last_os_error());
}

#[test]
fn bootstrap_data_and_trust_key_are_read_bounded() {
    let tmp = tempfile::tempdir().unwrap();
    let m = materialize(
        &repo_root().join("tests/fixtures/machines/cpu-worker"),
        &tmp.path().join("machine"),
    )
    .unwrap();
    let public = tmp.path().join("trust.pub");
    let key = ingot_artifact::sign::SecretKey::generate().public_key();
    std::fs::write(&public, key.to_minisign()).unwrap();
    let fifo = tmp.path().join("fifo");
    mkfifo(&fifo);
    let big = tmp.path().join("big.yaml");
    std::fs::File::create(&big)
        .unwrap()
        .set_len(1 << 30)
        .unwrap();
    let good = repo_root().join("bootstrap/tests/fixtures/cloud-config-worker-join.yaml");

    let run = |what: &str, bootstrap: &Path, trust: &Path| {
        let mut cmd = Command::new(env!("CARGO_BIN_EXE_ingot-writer"));
        cmd.env_remove("RUST_LOG")
            .arg("oci://127.0.0.1:9/stacks/none:1.0.0")
            .arg(bootstrap)
            .arg("machine-1")
            .arg("/dev/sda")
            .arg("--sysroot")
            .arg(&m.root)
            .arg("--output-json")
            .arg(tmp.path().join("output.json"))
            .arg("--trust-key")
            .arg(trust)
            .arg("--no-reboot");
        let r = measure::measured_with(cmd, Duration::from_secs(60), |_| {});
        r.print(what);
        assert_eq!(r.killed, None, "{what}: hung");
        assert!(!r.status.success(), "{what}: succeeded");
        assert!(
            r.max_rss_kib < RSS_LIMIT_KIB,
            "{what}: {} KiB",
            r.max_rss_kib
        );
        r
    };
    for (what, path, want) in [
        (
            "bootstrap data /dev/zero",
            Path::new("/dev/zero"),
            "not a regular file",
        ),
        (
            "bootstrap data FIFO",
            fifo.as_path(),
            "not a regular file: it is a FIFO",
        ),
        (
            "bootstrap data of 1 GiB",
            big.as_path(),
            "more than the 67108864 accepted",
        ),
    ] {
        let r = run(what, path, &public);
        assert!(
            r.stderr.contains("bootstrap data") && r.stderr.contains(want),
            "{what}: {}",
            r.stderr
        );
    }
    for (what, path, want) in [
        (
            "--trust-key /dev/zero",
            Path::new("/dev/zero"),
            "not a regular file",
        ),
        (
            "--trust-key FIFO",
            fifo.as_path(),
            "not a regular file: it is a FIFO",
        ),
    ] {
        let r = run(what, &good, path);
        assert!(
            r.stderr.contains("reading the public key") && r.stderr.contains(want),
            "{what}: {}",
            r.stderr
        );
    }
}
