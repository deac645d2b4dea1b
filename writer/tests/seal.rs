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

fn contains(haystack: &[u8], needle: &[u8]) -> bool {
    haystack.windows(needle.len()).any(|w| w == needle)
}

#[test]
fn a_sealed_secret_opens_only_under_the_releases_signed_pcr_11() {
    if !usable(ingot_testkit::test_name!()) {
        return;
    }
    let dir = tempfile::tempdir().unwrap();
    let tpm = Tpm::start(dir.path());
    let (key, _private) = PcrKey::generate().unwrap();
    let pem = dir.path().join("pcr.pub");
    std::fs::write(&pem, key.public_pem()).unwrap();
    // PCR 11 as a boot chain left it: one measurement.
    tpm.extend_pcr11(b"ingot seal test: the release's UKI");
    let value = extend([0; 32], b"ingot seal test: the release's UKI");

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
