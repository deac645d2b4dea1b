//! The node's secrets in the node layer: sealed to the TPM (each staged secret replaced by its
//! credential in `/etc/credstore.encrypted/`, a symlink into `/run/ingot/secrets/` where it was,
//! and a line in [`TABLE`]), or left in the clear; and what the status file says about them
//! (`details.secrets`, [`SecretsReport`]).
//!
//! The node's `ingot-unseal.service` (`boot/systemd/unseal-secrets`) reads the table early in
//! boot and decrypts each credential into `/run/ingot/secrets/NAME` (tmpfs), with the table's
//! mode and owner; `docs/boot-contract.md` describes the table.

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};

use ingot_bootstrap::{Entry, EntryKind, Staged};
use serde::Serialize;
use sha2::{Digest, Sha256};

use crate::seal::{SealError, Sealer};
use crate::tpm::{Clear, TpmSetting};

/// The table of sealed secrets in the node layer.
pub const TABLE: &str = "/etc/ingot/sealed-secrets";
/// Where the credentials lie in the node layer (systemd's own encrypted credential store).
pub const CREDSTORE: &str = "/etc/credstore.encrypted";
/// Where the node opens them (tmpfs); each secret's path is a symlink to `RUN/NAME`.
pub const RUN: &str = "/run/ingot/secrets";
/// var's LUKS2 key, sealed like the secrets into [`CREDSTORE`] but not listed in [`TABLE`]: the
/// node's initramfs opens it (`boot/initramfs-tools/scripts/ingot`, `ingot_var_luks`), formats
/// var with it on the first boot and opens var with it at every boot.
pub const VAR_KEY: &str = "ingot-var.key";
/// Random bytes in var's key (written as hex: cryptsetup reads the key file whole).
const VAR_KEY_BYTES: usize = 32;
/// The longest credential name systemd takes.
const MAX_NAME: usize = 255;

/// Why the secrets could not be sealed into the node layer.
#[derive(Debug, thiserror::Error)]
pub enum SecretsError {
    #[error("the secret {path}: no credential name from its path ({reason})")]
    Name { path: PathBuf, reason: &'static str },
    #[error("the secrets {first} and {second} get the same credential name {name}")]
    Collision {
        name: String,
        first: PathBuf,
        second: PathBuf,
    },
    #[error("sealing the secret {path} with the TPM")]
    Seal {
        path: PathBuf,
        #[source]
        source: SealError,
    },
    #[error("the secret {0} is not a staged file")]
    NotAFile(PathBuf),
}

/// The credential name of a secret staged at `path`: `ingot` and the path's components joined
/// by `.` (`/etc/ssh/ssh_host_ed25519_key` is `ingot.etc.ssh.ssh_host_ed25519_key`), every byte
/// outside `[A-Za-z0-9_.-]` made `_`.
pub fn credential_name(path: &Path) -> Result<String, SecretsError> {
    let bad = |reason| SecretsError::Name {
        path: path.to_path_buf(),
        reason,
    };
    let text = path.to_str().ok_or_else(|| bad("not UTF-8"))?;
    let rest = text.strip_prefix('/').ok_or_else(|| bad("not absolute"))?;
    if rest.is_empty()
        || rest
            .split('/')
            .any(|c| c.is_empty() || c == "." || c == "..")
    {
        return Err(bad("an empty, `.` or `..` component"));
    }
    let mut name = String::from("ingot");
    for c in rest.split('/') {
        name.push('.');
        name.extend(c.chars().map(|ch| {
            if ch.is_ascii_alphanumeric() || "_.-".contains(ch) {
                ch
            } else {
                '_'
            }
        }));
    }
    if name.len() > MAX_NAME {
        return Err(bad("longer than systemd's 255 bytes"));
    }
    Ok(name)
}

/// Every secret's credential name, in the order given; two paths with one name are refused.
pub fn credential_names(paths: &[PathBuf]) -> Result<Vec<String>, SecretsError> {
    let mut seen: BTreeMap<String, &PathBuf> = BTreeMap::new();
    let mut names = Vec::new();
    for path in paths {
        let name = credential_name(path)?;
        if let Some(first) = seen.insert(name.clone(), path) {
            return Err(SecretsError::Collision {
                name,
                first: first.clone(),
                second: path.clone(),
            });
        }
        names.push(name);
    }
    Ok(names)
}

/// One secret, as the status file names it (never its content).
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct SecretEntry {
    /// Where the node finds it.
    pub path: PathBuf,
    /// Its credential name, when sealed.
    pub credential: Option<String>,
    /// For an SSH host private key: the fingerprint of its public key (`SHA256:...`, as
    /// `ssh-keygen -l` prints it).
    pub ssh_fingerprint: Option<String>,
}

/// What the status file says about the node's secrets (`details.secrets`).
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct SecretsReport {
    /// Sealed to this machine's TPM under the release's PCR policy.
    pub sealed: bool,
    /// The machine's TPM (`2.0`), or null.
    pub tpm: Option<String>,
    /// The setting in force: `require`, `prefer` or `off`.
    pub policy: TpmSetting,
    /// Why they are in the clear (`setting-off`, `no-tpm`, `tpm-unreachable`, `no-signed-uki`,
    /// `no-pcr-policy`);
    /// null when sealed.
    pub reason: Option<&'static str>,
    /// One sentence for a human.
    pub message: String,
    /// var is LUKS2, its key sealed with the secrets ([`VAR_KEY`]); false: var is plain ext4.
    pub var_encrypted: bool,
    /// How many secrets the node layer carries.
    pub count: usize,
    pub secrets: Vec<SecretEntry>,
}

/// What [`apply`] does with the secrets.
pub enum Treatment<'a> {
    /// Seal each with `sealer`. The node opens them with the `.pcrsig` of the UKI it booted,
    /// which its initramfs hands to systemd (docs/boot-contract.md).
    Seal { sealer: &'a Sealer },
    /// Leave them in the clear, for this reason.
    Clear(Clear),
}

/// The node's secrets sealed (or left) in `staged`, as `treatment` says; `tpm` is the machine's
/// TPM major version, for the report. When sealing, the plaintext of every secret is gone from
/// the returned files: the node layer is built from them.
pub fn apply(
    mut staged: Staged,
    setting: TpmSetting,
    tpm: Option<u8>,
    treatment: Treatment,
) -> Result<(Staged, SecretsReport), SecretsError> {
    let paths = staged.secrets.clone();
    let fingerprints: Vec<Option<String>> =
        paths.iter().map(|p| ssh_fingerprint(&staged, p)).collect();
    let tpm_text = tpm.map(|v| format!("{v}.0"));
    let count = paths.len();
    let (sealed, reason, message, names) = match treatment {
        Treatment::Seal { sealer } => {
            let names = credential_names(&paths)?;
            seal_all(&mut staged, &paths, &names, sealer)?;
            let message = format!(
                "{count} secrets and var's LUKS2 key sealed to this machine's TPM under the \
                 release's PCR policy (var has no recovery key: only this TPM opens it)"
            );
            (true, None, message, names.into_iter().map(Some).collect())
        }
        Treatment::Clear(why) => {
            let message = format!(
                "this node's {count} secrets are in the clear on its disks, and var is not \
                 encrypted: {}",
                why.why()
            );
            (false, Some(why.name()), message, vec![None; count])
        }
    };
    let secrets = paths
        .into_iter()
        .zip(names)
        .zip(fingerprints)
        .map(|((path, credential), ssh_fingerprint)| SecretEntry {
            path,
            credential,
            ssh_fingerprint,
        })
        .collect();
    let report = SecretsReport {
        sealed,
        tpm: tpm_text,
        policy: setting,
        reason,
        message,
        var_encrypted: sealed,
        count,
        secrets,
    };
    Ok((staged, report))
}

/// Seals each secret and puts its credential, its symlink and its table line in its place.
fn seal_all(
    staged: &mut Staged,
    paths: &[PathBuf],
    names: &[String],
    sealer: &Sealer,
) -> Result<(), SecretsError> {
    let mut table =
        String::from("# ingot sealed secrets: NAME MODE UID GID PATH (docs/boot-contract.md)\n");
    let mut added = Vec::new();
    for (path, name) in paths.iter().zip(names) {
        let i = staged
            .entries
            .iter()
            .position(|e| &e.path == path)
            .ok_or_else(|| SecretsError::NotAFile(path.clone()))?;
        let entry = &mut staged.entries[i];
        let EntryKind::File(content) = &mut entry.kind else {
            return Err(SecretsError::NotAFile(path.clone()));
        };
        let credential = sealer
            .seal(name, content)
            .map_err(|source| SecretsError::Seal {
                path: path.clone(),
                source,
            })?;
        // The plaintext leaves the staged files here: overwritten, then replaced.
        content.fill(0);
        entry.kind = EntryKind::Symlink(Path::new(RUN).join(name));
        table.push_str(&format!(
            "{name} {:04o} {} {} {}\n",
            entry.mode,
            entry.uid,
            entry.gid,
            path.display()
        ));
        entry.mode = 0o777;
        added.push(Entry {
            path: Path::new(CREDSTORE).join(name),
            kind: EntryKind::File(credential),
            mode: 0o400,
            uid: 0,
            gid: 0,
        });
    }
    let var_key = sealer
        .seal(VAR_KEY, &var_key())
        .map_err(|source| SecretsError::Seal {
            path: Path::new(CREDSTORE).join(VAR_KEY),
            source,
        })?;
    for (path, kind, mode) in [
        (CREDSTORE, EntryKind::Dir, 0o700),
        (
            &*format!("{CREDSTORE}/{VAR_KEY}"),
            EntryKind::File(var_key),
            0o400,
        ),
        (TABLE, EntryKind::File(table.into_bytes()), 0o644),
    ] {
        added.push(Entry {
            path: path.into(),
            kind,
            mode,
            uid: 0,
            gid: 0,
        });
    }
    for e in added {
        match staged.entries.iter_mut().find(|x| x.path == e.path) {
            Some(existing) => *existing = e,
            None => staged.entries.push(e),
        }
    }
    staged.entries.sort_by(|a, b| a.path.cmp(&b.path));
    Ok(())
}

/// A fresh key for var: [`VAR_KEY_BYTES`] from the operating system's generator, as hex.
fn var_key() -> Vec<u8> {
    use rand::RngCore;
    let mut bytes = [0u8; VAR_KEY_BYTES];
    rand::rngs::OsRng.fill_bytes(&mut bytes);
    let hex: String = bytes.iter().map(|b| format!("{b:02x}")).collect();
    bytes.fill(0);
    hex.into_bytes()
}

/// The fingerprint of the public half of an SSH host private key staged at `path`
/// (`path.pub`), as `ssh-keygen -l` prints it.
fn ssh_fingerprint(staged: &Staged, path: &Path) -> Option<String> {
    let name = path.file_name()?.to_str()?;
    if !(name.starts_with("ssh_host_") && name.ends_with("_key")) {
        return None;
    }
    let mut public = path.as_os_str().to_owned();
    public.push(".pub");
    let EntryKind::File(text) = &staged.get(PathBuf::from(public))?.kind else {
        return None;
    };
    let blob = std::str::from_utf8(text).ok()?.split_whitespace().nth(1)?;
    let bytes = base64_decode(blob)?;
    Some(format!(
        "SHA256:{}",
        base64_encode(&Sha256::digest(bytes)).trim_end_matches('=')
    ))
}

fn base64_encode(data: &[u8]) -> String {
    use base64::Engine;
    base64::engine::general_purpose::STANDARD.encode(data)
}

fn base64_decode(text: &str) -> Option<Vec<u8>> {
    use base64::Engine;
    base64::engine::general_purpose::STANDARD.decode(text).ok()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn names_follow_the_path_and_are_valid_for_systemd() {
        let name = |p: &str| credential_name(Path::new(p)).unwrap();
        assert_eq!(
            name("/etc/ssh/ssh_host_ed25519_key"),
            "ingot.etc.ssh.ssh_host_ed25519_key"
        );
        assert_eq!(
            name("/etc/kubernetes/pki/etcd/ca.key"),
            "ingot.etc.kubernetes.pki.etcd.ca.key"
        );
        assert_eq!(name("/etc/ingot/run/a b:c"), "ingot.etc.ingot.run.a_b_c");
        assert_eq!(name("/etc/ü"), "ingot.etc._");
        for bad in ["relative/x", "/", "/etc//x", "/etc/../x"] {
            assert!(credential_name(Path::new(bad)).is_err(), "{bad}");
        }
        let long = format!("/etc/{}", "x".repeat(250));
        assert!(credential_name(Path::new(&long)).is_err());
        let fits = format!("/etc/{}", "x".repeat(245));
        assert_eq!(name(&fits).len(), 255);
    }

    #[test]
    fn two_paths_with_one_name_are_refused() {
        let paths = |v: &[&str]| v.iter().map(PathBuf::from).collect::<Vec<_>>();
        assert_eq!(
            credential_names(&paths(&["/etc/a/b", "/etc/c"])).unwrap(),
            ["ingot.etc.a.b", "ingot.etc.c"]
        );
        for clash in [["/etc/a/b", "/etc/a.b"], ["/etc/a b", "/etc/a_b"]] {
            let err = credential_names(&paths(&clash)).unwrap_err().to_string();
            assert!(err.contains(clash[0]) && err.contains(clash[1]), "{err}");
        }
    }
}
