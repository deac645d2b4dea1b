//! Secrets sealed at install time as TPM-bound credentials: encrypted by the machine's TPM 2.0
//! under the release's signed PCR 11 policy, so that only this TPM, with PCR 11 at a value the
//! release's PCR key signed (the release's UKI booting), opens them.
//!
//! The credential is systemd's own (`systemd-creds encrypt`, systemd 252 as in Debian 12 and
//! Hetzner's rescue system), so the node opens it with `LoadCredentialEncrypted=` and
//! `systemd-creds decrypt` and nothing of ingot's. Two facts of systemd 252 decide the flags,
//! both measured against swtpm:
//! - `--with-key=tpm2` ignores `--tpm2-public-key`: its credential opens whatever PCR 11 holds.
//!   Only `--with-key=tpm2-with-public-key` binds the signed policy.
//! - `--tpm2-pcrs=` (empty) binds no literal PCR value: the rescue system's PCRs are not the
//!   node's, so any literal binding (252's default is PCR 7) would never open on the node.
//!   systemd-creds then warns that the "PCR policy [is] effectively unenforced": that is about
//!   the literal PCRs only; the signed PCR 11 policy is enforced (the tests show it refused).
//!
//! The secret goes in on stdin and the credential comes out on stdout: the plaintext never
//! touches a file.

use std::io::Write;
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};

/// The program that seals.
pub const SYSTEMD_CREDS: &str = "systemd-creds";
/// The PCR the release's policy signs (systemd-stub's measurement of the UKI, then the boot
/// phases).
const PCR: &str = "11";
/// The longest credential name systemd takes (a file name).
const MAX_NAME: usize = 255;

/// Sealing failed.
#[derive(Debug, thiserror::Error)]
pub enum SealError {
    #[error("credential name {0:?}: 1 to 255 of [A-Za-z0-9_.-], not `.` or `..`")]
    Name(String),
    #[error("running {program}")]
    Run {
        program: String,
        source: std::io::Error,
    },
    #[error("{program} could not seal {name}: {stderr}")]
    Refused {
        program: String,
        name: String,
        stderr: String,
    },
    #[error("{program} sealed {name} into nothing")]
    Empty { program: String, name: String },
}

/// Seals secrets with one TPM under one release's PCR public key.
#[derive(Clone, Debug)]
pub struct Sealer {
    /// `systemd-creds`.
    pub program: PathBuf,
    /// `--tpm2-device`: `auto` on a machine, `swtpm:path=SOCKET` for a software TPM.
    pub device: String,
    /// The release's PCR public key (the UKI's `.pcrpkey`), PEM.
    pub public_key: PathBuf,
}

impl Sealer {
    /// A sealer with the machine's own TPM.
    pub fn new(public_key: &Path) -> Sealer {
        Sealer {
            program: SYSTEMD_CREDS.into(),
            device: "auto".into(),
            public_key: public_key.into(),
        }
    }

    /// `secret` sealed as the credential `name` (the name is bound into it: the node must ask
    /// for the same one); systemd's credential text (base64).
    pub fn seal(&self, name: &str, secret: &[u8]) -> Result<Vec<u8>, SealError> {
        check_name(name)?;
        let program = self.program.display().to_string();
        let run = |source| SealError::Run {
            program: program.clone(),
            source,
        };
        let mut child = Command::new(&self.program)
            .arg("encrypt")
            .arg("--with-key=tpm2-with-public-key")
            .arg(format!("--tpm2-device={}", self.device))
            .arg("--tpm2-pcrs=")
            .arg("--tpm2-public-key")
            .arg(&self.public_key)
            .arg(format!("--tpm2-public-key-pcrs={PCR}"))
            .arg(format!("--name={name}"))
            .args(["-", "-"])
            .stdin(Stdio::piped())
            .stdout(Stdio::piped())
            .stderr(Stdio::piped())
            .spawn()
            .map_err(run)?;
        let mut stdin = child.stdin.take().expect("piped");
        // A secret is small (keys, tokens): written whole before the output is read.
        let written = stdin.write_all(secret);
        drop(stdin);
        let out = child.wait_with_output().map_err(run)?;
        if !out.status.success() {
            return Err(SealError::Refused {
                program,
                name: name.into(),
                stderr: last_line(&out.stderr),
            });
        }
        written.map_err(run)?;
        if out.stdout.is_empty() {
            return Err(SealError::Empty {
                program,
                name: name.into(),
            });
        }
        Ok(out.stdout)
    }
}

/// systemd's credential names are file names.
fn check_name(name: &str) -> Result<(), SealError> {
    let ok = !name.is_empty()
        && name.len() <= MAX_NAME
        && name != "."
        && name != ".."
        && name
            .bytes()
            .all(|b| b.is_ascii_alphanumeric() || b"_.-".contains(&b));
    if ok {
        Ok(())
    } else {
        Err(SealError::Name(name.into()))
    }
}

/// The tool's last message (systemd-creds's warnings come first, the reason last).
fn last_line(stderr: &[u8]) -> String {
    String::from_utf8_lossy(stderr)
        .lines()
        .rev()
        .find(|l| !l.trim().is_empty())
        .unwrap_or("no message")
        .trim()
        .to_string()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn names_are_file_names() {
        for good in ["ssh_host_ed25519_key", "kubeadm.token", "a-b"] {
            assert!(check_name(good).is_ok(), "{good}");
        }
        for bad in ["", ".", "..", "a/b", "a b", &"x".repeat(256), "é"] {
            assert!(
                matches!(check_name(bad), Err(SealError::Name(_))),
                "{bad:?}"
            );
        }
    }

    #[test]
    fn a_missing_program_is_named() {
        let s = Sealer {
            program: "/nonexistent/systemd-creds".into(),
            ..Sealer::new(Path::new("/k.pem"))
        };
        let err = s.seal("x", b"secret").unwrap_err().to_string();
        assert!(err.contains("/nonexistent/systemd-creds"), "{err}");
    }

    #[test]
    fn the_reason_is_the_last_line() {
        assert_eq!(last_line(b"warning\nreason\n\n"), "reason");
        assert_eq!(last_line(b""), "no message");
    }
}
