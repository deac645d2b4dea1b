//! Sealing against a real TPM (swtpm) with systemd 252's own tools: a secret sealed by
//! `ingot_writer::seal` under a release's PCR public key opens with `systemd-creds decrypt` only
//! while PCR 11 holds a value that key signed (the `.pcrsig` JSON ingot's builder makes), under
//! the name it was sealed as; a policy for another value, one signed by another key (even under
//! the release key's fingerprint, which the TPM itself refuses), and the same policy after PCR 11
//! moved on are all refused. The credential holds no byte run of the secret.
//!
//! Needs swtpm, systemd-creds, tpm2-tools (tpm2_pcrextend, tpm2_flushcontext: swtpm has no
//! resource manager, so each tool's sessions are flushed after it) and the TSS2 libraries
//! systemd loads; skipped with a message without them, except in CI.

use std::io::Write;
use std::path::{Path, PathBuf};
use std::process::{Command, Output, Stdio};

use ingot_artifact::pcr_policy::{PcrKey, PcrSig};
use ingot_artifact::uki::extend;
use ingot_testkit::skip::{have_file, have_tools};
use ingot_vm::swtpm::Swtpm;
use ingot_writer::seal::Sealer;
use sha2::{Digest, Sha256};

const ESYS: &str = "/usr/lib/x86_64-linux-gnu/libtss2-esys.so.0";
const TCTI_SWTPM: &str = "/usr/lib/x86_64-linux-gnu/libtss2-tcti-swtpm.so.0";
const SECRET: &[u8] = b"-----BEGIN OPENSSH PRIVATE KEY-----\nb3BlbnNzaC1rZXktdjEAAAAAtestsecret\n-----END OPENSSH PRIVATE KEY-----\n";
const NAME: &str = "ssh_host_ed25519_key";

fn usable(test: &str) -> bool {
    have_tools(
        test,
        &[
            "swtpm",
            "systemd-creds",
            "tpm2_pcrextend",
            "tpm2_flushcontext",
        ],
    ) && have_file(test, Path::new(ESYS))
        && have_file(test, Path::new(TCTI_SWTPM))
}

/// A software TPM 2.0 reached from the host (`ingot_vm::swtpm`), and how to reach it.
struct Tpm {
    _swtpm: Swtpm,
    device: String,
}

impl Tpm {
    fn start(dir: &Path) -> Tpm {
        let swtpm = Swtpm::start_for_host(Path::new("swtpm"), dir).expect("swtpm");
        let device = swtpm.tcti().unwrap();
        Tpm {
            _swtpm: swtpm,
            device,
        }
    }

    /// Runs a tpm2-tools program on this TPM.
    fn tool(&self, program: &str, args: &[&str]) -> Output {
        Command::new(program)
            .args(args)
            .env("TPM2TOOLS_TCTI", &self.device)
            .output()
            .unwrap()
    }

    /// Flushes what the last client left loaded (swtpm has no resource manager).
    fn flush(&self) {
        for what in ["-t", "-l", "-s"] {
            self.tool("tpm2_flushcontext", &[what]);
        }
    }

    /// Extends PCR 11 by `data` (as systemd does: by its SHA-256).
    fn extend_pcr11(&self, data: &[u8]) {
        let digest = hex::encode(Sha256::digest(data));
        let out = self.tool("tpm2_pcrextend", &[&format!("11:sha256={digest}")]);
        assert!(out.status.success(), "{out:?}");
        self.flush();
    }

    /// `systemd-creds decrypt` of `sealed` as `name` with the policy signatures `sig`: the
    /// secret, or the tool's message.
    fn open(&self, sealed: &[u8], name: &str, sig: &Path) -> Result<Vec<u8>, String> {
        let mut child = Command::new("systemd-creds")
            .arg("decrypt")
            .arg(format!("--tpm2-device={}", self.device))
            .arg(format!("--tpm2-signature={}", sig.display()))
            .arg(format!("--name={name}"))
            .args(["-", "-"])
            .stdin(Stdio::piped())
            .stdout(Stdio::piped())
            .stderr(Stdio::piped())
            .spawn()
            .unwrap();
        child.stdin.take().unwrap().write_all(sealed).unwrap();
        let out = child.wait_with_output().unwrap();
        self.flush();
        if out.status.success() {
            Ok(out.stdout)
        } else {
            Err(String::from_utf8_lossy(&out.stderr).into_owned())
        }
    }
}

/// The policy JSON for PCR 11 at `value`, signed by `key`, written to `dir/name`.
fn policy(dir: &Path, name: &str, key: &PcrKey, value: [u8; 32]) -> PathBuf {
    let sig: PcrSig = key.sign(value, &[""]).unwrap();
    let path = dir.join(name);
    std::fs::write(&path, serde_json::to_vec(&sig).unwrap()).unwrap();
    path
}

/// A release's PCR key (its public PEM at `pem`) and a TPM booted through it: PCR 11 as the
/// boot chain left it, one measurement, whose value is `value`.
struct Release {
    tpm: Tpm,
    key: PcrKey,
    pem: PathBuf,
    value: [u8; 32],
}

impl Release {
    fn booted(dir: &Path, uki: &[u8]) -> Self {
        let tpm = Tpm::start(dir);
        let (key, _private) = PcrKey::generate().unwrap();
        let pem = dir.join("pcr.pub");
        std::fs::write(&pem, key.public_pem()).unwrap();
        tpm.extend_pcr11(uki);
        Self {
            tpm,
            key,
            pem,
            value: extend([0; 32], uki),
        }
    }
}

fn contains(haystack: &[u8], needle: &[u8]) -> bool {
    haystack.windows(needle.len()).any(|w| w == needle)
}

#[test]
fn a_sealed_secret_opens_only_under_the_releases_signed_pcr_11() {
    if !usable(ingot_testkit::test_name!()) {
        return;
    }
    let dir = tempfile::tempdir().unwrap();
    let Release {
        tpm,
        key,
        pem,
        value,
    } = Release::booted(dir.path(), b"ingot seal test: the release's UKI");

    let sealer = Sealer {
        device: tpm.device.clone(),
        ..Sealer::new(&pem)
    };
    let sealed = sealer.seal(NAME, SECRET).unwrap();
    tpm.flush();
    let decoded = base64::Engine::decode(
        &base64::engine::general_purpose::STANDARD,
        sealed
            .iter()
            .filter(|b| !b.is_ascii_whitespace())
            .copied()
            .collect::<Vec<_>>(),
    )
    .expect("systemd's credential text is base64");
    // The key's body (its armor lines are no secret: the credential carries the PCR public
    // key's PEM, whose armor ends alike), in every run of 12 bytes.
    let body = SECRET.split(|&b| b == b'\n').nth(1).unwrap();
    for run in body.windows(12) {
        assert!(
            !contains(&sealed, run),
            "{run:?} in the credential:\n{}",
            String::from_utf8_lossy(&sealed)
        );
        assert!(
            !contains(&decoded, run),
            "{run:?} in the decoded credential"
        );
    }

    let signed = policy(dir.path(), "signed.json", &key, value);
    assert_eq!(tpm.open(&sealed, NAME, &signed).as_deref(), Ok(SECRET));
    // The name is bound into the credential.
    let err = tpm.open(&sealed, "other", &signed).unwrap_err();
    assert!(!err.is_empty());
    // A policy for another PCR 11 value (another boot chain).
    let other_value = policy(dir.path(), "other-value.json", &key, extend(value, b"x"));
    assert!(tpm.open(&sealed, NAME, &other_value).is_err());
    // A policy for the right value signed by another key, under the release key's fingerprint:
    // systemd finds it, the TPM refuses its signature.
    let (other_key, _) = PcrKey::generate().unwrap();
    let mut forged = other_key.sign(value, &[""]).unwrap();
    forged.sha256[0].pkfp = key.fingerprint_hex();
    let forged_path = dir.path().join("forged.json");
    std::fs::write(&forged_path, serde_json::to_vec(&forged).unwrap()).unwrap();
    let err = tpm.open(&sealed, NAME, &forged_path).unwrap_err();
    assert!(
        !err.contains("Couldn't find signature"),
        "refused before the TPM: {err}"
    );
    // PCR 11 moved on (another boot phase, another chain): the signed policy no longer holds.
    tpm.extend_pcr11(b"something else ran");
    assert!(tpm.open(&sealed, NAME, &signed).is_err());
}

/// A staged file.
fn file(path: &str, content: &[u8], mode: u32) -> ingot_bootstrap::Entry {
    ingot_bootstrap::Entry {
        path: path.into(),
        kind: ingot_bootstrap::EntryKind::File(content.to_vec()),
        mode,
        uid: 0,
        gid: 0,
    }
}

/// Runs the node's `unseal-secrets` against the tree at `root` with this TPM and the policy
/// `sig`.
fn unseal(tpm: &Tpm, root: &Path, sig: &Path) -> Output {
    let script = Path::new(env!("CARGO_MANIFEST_DIR")).join("../boot/systemd/unseal-secrets");
    let out = Command::new("sh")
        .arg(script)
        .env("INGOT_ROOT", root)
        .env("INGOT_TPM2_DEVICE", &tpm.device)
        .env("INGOT_PCR_SIGNATURE", sig)
        .output()
        .unwrap();
    tpm.flush();
    out
}

const CA_KEY: &[u8] =
    b"-----BEGIN RSA PRIVATE KEY-----\nMIIEpAIBAAKCAQEAcakeybodyforthetest\n-----END RSA PRIVATE KEY-----\n";

/// Staged files with two secrets: an SSH host key (with its public half) and a CA key.
fn staged_fixture() -> ingot_bootstrap::Staged {
    let host_pub = b"ssh-ed25519 AAAAC3NzaC1lZDI1NTE5AAAAIHwJ3x0sqk7Bv5Fj8w3bQ9l2mJr0m1ZQ4mS2cQ9b3xYz root@node\n";
    let mut entries = vec![
        file("/etc/hostname", b"node-1\n", 0o644),
        file("/etc/ssh/ssh_host_ed25519_key", SECRET, 0o600),
        file("/etc/ssh/ssh_host_ed25519_key.pub", host_pub, 0o644),
        file("/etc/kubernetes/pki/ca.key", CA_KEY, 0o600),
    ];
    entries.sort_by(|a, b| a.path.cmp(&b.path));
    ingot_bootstrap::Staged {
        entries,
        secrets: vec![
            "/etc/kubernetes/pki/ca.key".into(),
            "/etc/ssh/ssh_host_ed25519_key".into(),
        ],
        warnings: vec![],
        hostname: "node-1".into(),
        role: ingot_bootstrap::Role::Worker,
    }
}

/// No staged file holds a 12-byte run of either secret's body.
fn assert_no_plaintext(staged: &ingot_bootstrap::Staged) {
    let body = |s: &'static [u8]| s.split(|&b| b == b'\n').nth(1).unwrap();
    for e in &staged.entries {
        if let ingot_bootstrap::EntryKind::File(c) = &e.kind {
            for secret in [CA_KEY, SECRET] {
                for run in body(secret).windows(12) {
                    assert!(!contains(c, run), "{} holds {run:?}", e.path.display());
                }
            }
        }
    }
}

/// The node's tree below `root`: the credentials and the table, as the node layer carries them.
fn write_node_tree(staged: &ingot_bootstrap::Staged, root: &Path) {
    use ingot_writer::secrets::{CREDSTORE, TABLE};
    for e in &staged.entries {
        let on_disk = root.join(e.path.strip_prefix("/").unwrap());
        if let ingot_bootstrap::EntryKind::File(c) = &e.kind {
            if e.path.starts_with(CREDSTORE) || e.path == Path::new(TABLE) {
                std::fs::create_dir_all(on_disk.parent().unwrap()).unwrap();
                std::fs::write(&on_disk, c).unwrap();
            }
        }
    }
}

/// The report names each secret's credential (`names`, in path order) and the host key's
/// fingerprint, never a content.
fn assert_sealed_report(report: &ingot_writer::secrets::SecretsReport, names: &[&str]) {
    assert!(report.sealed && report.reason.is_none() && report.count == names.len());
    let reported: Vec<_> = report
        .secrets
        .iter()
        .map(|s| s.credential.as_deref())
        .collect();
    assert_eq!(reported, names.iter().map(|n| Some(*n)).collect::<Vec<_>>());
    assert!(report.secrets[1]
        .ssh_fingerprint
        .as_deref()
        .unwrap()
        .starts_with("SHA256:"));
}

/// The writer's `seal` step as it treats staged files (`ingot_writer::secrets::apply`): every
/// secret's plaintext leaves the staged files, its credential, symlink and table line take its
/// place; the node's `unseal-secrets` script (boot/systemd) opens every credential into
/// `/run/ingot/secrets` with the table's mode while PCR 11 holds the signed value, and once it
/// moved on (another boot chain) refuses with the console line and a failure, leaving nothing.
#[test]
fn staged_secrets_are_sealed_and_the_node_script_opens_them_only_under_the_policy() {
    use ingot_bootstrap::EntryKind;
    use ingot_writer::secrets::{self, TABLE};
    use ingot_writer::tpm::TpmSetting;
    if !usable(ingot_testkit::test_name!()) {
        return;
    }
    let dir = tempfile::tempdir().unwrap();
    let Release {
        tpm,
        key,
        pem,
        value,
    } = Release::booted(dir.path(), b"ingot unseal test: the release's UKI");
    let signed = policy(dir.path(), "signed.json", &key, value);

    let staged = staged_fixture();
    let sealer = Sealer {
        device: tpm.device.clone(),
        ..Sealer::new(&pem)
    };
    let treatment = secrets::Treatment::Seal { sealer: &sealer };
    let (staged, report) = secrets::apply(staged, TpmSetting::Require, Some(2), treatment).unwrap();
    tpm.flush();
    let names = [
        "ingot.etc.kubernetes.pki.ca.key",
        "ingot.etc.ssh.ssh_host_ed25519_key",
    ];
    assert_sealed_report(&report, &names);

    // No staged file holds a byte run of either secret; each path is a symlink into /run.
    assert_no_plaintext(&staged);
    for (path, name) in [
        ("/etc/kubernetes/pki/ca.key", names[0]),
        ("/etc/ssh/ssh_host_ed25519_key", names[1]),
    ] {
        assert_eq!(
            staged.get(path).unwrap().kind,
            EntryKind::Symlink(format!("/run/ingot/secrets/{name}").into())
        );
    }
    let EntryKind::File(table) = &staged.get(TABLE).unwrap().kind else {
        panic!("no table");
    };
    let table = String::from_utf8(table.clone()).unwrap();
    assert!(
        table.contains(
            "ingot.etc.ssh.ssh_host_ed25519_key 0600 0 0 /etc/ssh/ssh_host_ed25519_key\n"
        ),
        "{table}"
    );

    let root = dir.path().join("root");
    write_node_tree(&staged, &root);
    // The signatures are the booted UKI's, where its initramfs put them (boot_secure).
    let carried = root.join("run/systemd/tpm2-pcr-signature.json");
    std::fs::create_dir_all(carried.parent().unwrap()).unwrap();
    std::fs::copy(&signed, &carried).unwrap();
    let out = unseal(&tpm, &root, &carried);
    assert!(out.status.success(), "{out:?}");
    let run = root.join("run/ingot/secrets");
    assert_eq!(std::fs::read(run.join(names[1])).unwrap(), SECRET);
    assert_eq!(std::fs::read(run.join(names[0])).unwrap(), CA_KEY);
    use std::os::unix::fs::PermissionsExt;
    let mode = std::fs::metadata(run.join(names[1]))
        .unwrap()
        .permissions()
        .mode();
    assert_eq!(mode & 0o7777, 0o600);

    // Another boot chain: PCR 11 moved on. The script refuses, says why, and opens nothing.
    std::fs::remove_dir_all(root.join("run")).unwrap();
    tpm.extend_pcr11(b"another UKI");
    let out = unseal(&tpm, &root, &carried);
    let stdout = String::from_utf8_lossy(&out.stdout);
    assert_eq!(out.status.code(), Some(1), "{out:?}");
    assert!(
        stdout.contains(&format!(
            "INGOT-SECRETS-SEALED: {}: the TPM refused (another boot chain, another machine or a \
             cleared TPM); nothing joins",
            names[0]
        )),
        "{stdout}"
    );
    let left: Vec<_> = std::fs::read_dir(&run).unwrap().collect();
    assert!(left.is_empty(), "{left:?}");
}
