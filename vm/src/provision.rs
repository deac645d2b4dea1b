//! Provisioning a VM as CAPH provisions a server: what to write (a new VM, a kept one booted
//! again, or a kept one re-provisioned), and the writer run against the VM's fixture machine
//! with its disks (the `ingot-writer` binary with `--sysroot`, as cluster-api-provider-hetzner
//! runs it in the rescue system), with the Secure Boot keys enrolled into the VM's store.

use std::ffi::OsString;
use std::path::{Path, PathBuf};
use std::process::{Command, ExitStatus};

use crate::accel::Accel;
use crate::firmware::{Images, Lookup};
use crate::secure_boot::{self, EnrollError};
use crate::state::{Spec, State, StateError};

/// The writer binary's name.
pub const WRITER: &str = "ingot-writer";

/// Provisioning could not run.
#[derive(Debug, thiserror::Error)]
pub enum ProvisionError {
    #[error(
        "{dir} already holds a VM: boot it again without SOURCE, or add --rewrite to write \
         SOURCE over its disks"
    )]
    AlreadyWritten { dir: String },
    #[error("no stack to write: give SOURCE ({dir} holds no VM yet)")]
    NothingToWrite { dir: String },
    #[error("--rewrite needs SOURCE, the stack to write")]
    RewriteNeedsSource,
    #[error("ingot-writer is not installed: not beside ingot, not on PATH, no INGOT_WRITER")]
    NoWriter,
    #[error("running {}", program.display())]
    Run {
        program: PathBuf,
        source: std::io::Error,
    },
    #[error("the Secure Boot firmware has no variable store template")]
    NoVarsTemplate,
    #[error(transparent)]
    State(#[from] StateError),
    #[error(transparent)]
    Enroll(#[from] EnrollError),
}

/// What to write before the boot: `source` onto a new VM, or over a kept one with `rewrite`;
/// nothing (None) when a kept VM boots again.
pub fn plan<'a>(
    source: Option<&'a str>,
    state: &State,
    rewrite: bool,
) -> Result<Option<&'a str>, ProvisionError> {
    let dir = state.dir().display().to_string();
    match (source, state.written(), rewrite) {
        (Some(_), true, false) => Err(ProvisionError::AlreadyWritten { dir }),
        (None, false, _) => Err(ProvisionError::NothingToWrite { dir }),
        (None, true, true) => Err(ProvisionError::RewriteNeedsSource),
        (Some(source), _, _) => Ok(Some(source)),
        (None, true, false) => Ok(None),
    }
}

/// How the writer is told which TPM a fixture machine has (the writer's `INGOT_TPM2_DEVICE`).
pub const TPM2_DEVICE_ENV: &str = "INGOT_TPM2_DEVICE";

/// The writer: `INGOT_WRITER`, else `ingot-writer` beside the running binary, else on `PATH`.
pub fn writer_binary() -> Result<PathBuf, ProvisionError> {
    if let Some(path) = std::env::var_os("INGOT_WRITER") {
        return Ok(path.into());
    }
    let beside = std::env::current_exe()
        .ok()
        .and_then(|exe| exe.parent().map(|d| d.join(WRITER)));
    if let Some(path) = beside.filter(|p| p.is_file()) {
        return Ok(path);
    }
    let path = std::env::var_os("PATH").unwrap_or_default();
    std::env::split_paths(&path)
        .map(|d| d.join(WRITER))
        .find(|p| p.is_file())
        .ok_or(ProvisionError::NoWriter)
}

/// What the writer is asked to write, beyond the VM itself.
#[derive(Clone, Debug)]
pub struct Write<'a> {
    /// The stack, as the writer takes it.
    pub source: &'a str,
    /// The bootstrap data.
    pub data: &'a [u8],
    /// `--trust-key`.
    pub trust_key: Option<&'a Path>,
    /// `--role`.
    pub role: Option<&'a str>,
    /// `--kernel-arg`s beyond `console=ttyS0`, which every VM gets (its console is serial).
    pub kernel_args: &'a [String],
    /// Further flags (the registry options, which the writer takes as `ingot` does).
    pub flags: Vec<OsString>,
    /// The TSS2 TCTI of the VM's own TPM, reached from the host while the writer runs
    /// ([`crate::swtpm::Swtpm::tcti`]): the writer seals the node's secrets with it, as it
    /// would with the machine's TPM in the rescue system (`INGOT_TPM2_DEVICE`).
    pub tpm2_device: Option<String>,
}

/// Prepares `state` for the machine `spec` (disks, fixture, bootstrap data) and runs `writer`
/// on it as CAPH does; the writer's status (its own messages go to this process's terminal).
pub fn write(
    writer: &Path,
    w: &Write<'_>,
    state: &State,
    spec: &Spec,
) -> Result<ExitStatus, ProvisionError> {
    let node = state.prepare(spec)?;
    let bootstrap = state.bootstrap();
    std::fs::write(&bootstrap, w.data).map_err(|source| StateError::Io {
        path: bootstrap.clone(),
        source,
    })?;
    let mut cmd = Command::new(writer);
    cmd.arg(w.source)
        .arg(&bootstrap)
        .arg(&spec.name)
        .arg(State::root_devices(&node))
        .arg("--sysroot")
        .arg(state.machine())
        .arg("--report")
        .arg(state.report())
        .args(["--kernel-arg", "console=ttyS0"]);
    for arg in w.kernel_args {
        cmd.arg("--kernel-arg").arg(arg);
    }
    if let Some(key) = w.trust_key {
        cmd.arg("--trust-key").arg(key);
    }
    if let Some(role) = w.role {
        cmd.arg("--role").arg(role);
    }
    cmd.args(&w.flags);
    if let Some(device) = &w.tpm2_device {
        cmd.env(TPM2_DEVICE_ENV, device);
    }
    tracing::info!(
        source = w.source,
        disks = node.disks.len(),
        writer = %writer.display(),
        "writing"
    );
    cmd.status().map_err(|source| ProvisionError::Run {
        program: writer.into(),
        source,
    })
}

/// Enrolls the key set `keys` into a fresh copy of the VM's variable store (its first boot),
/// with the Secure Boot firmware `images`. A failed enrollment leaves no store: a half-enrolled
/// one must not pass for an enrolled one at the next boot.
pub fn enroll(
    lookup: &Lookup,
    keys: &Path,
    state: &State,
    images: &Images,
    accel: Accel,
) -> Result<(), ProvisionError> {
    let template = images
        .vars_template
        .as_ref()
        .ok_or(ProvisionError::NoVarsTemplate)?;
    let vars = state.vars();
    std::fs::copy(template, &vars).map_err(|source| StateError::Io {
        path: vars.clone(),
        source,
    })?;
    let work = state.dir().join("enroll");
    let result = secure_boot::enroll(lookup, keys, &images.code, &vars, accel, &work);
    if result.is_err() {
        let _ = std::fs::remove_file(&vars);
    }
    let _ = std::fs::remove_dir_all(&work);
    Ok(result?)
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A new VM needs a stack; a kept one is booted again, or written over only with --rewrite.
    #[test]
    fn what_is_written_depends_on_the_state_and_rewrite() {
        let dir = tempfile::tempdir().unwrap();
        let state = State::new(dir.path());
        assert_eq!(
            plan(Some("oci://r/x:1"), &state, false).unwrap(),
            Some("oci://r/x:1")
        );
        assert!(matches!(
            plan(None, &state, false),
            Err(ProvisionError::NothingToWrite { .. })
        ));
        std::fs::write(state.disk(0), b"").unwrap();
        assert_eq!(plan(None, &state, false).unwrap(), None);
        assert!(matches!(
            plan(Some("l"), &state, false),
            Err(ProvisionError::AlreadyWritten { .. })
        ));
        assert_eq!(plan(Some("l"), &state, true).unwrap(), Some("l"));
        assert!(matches!(
            plan(None, &state, true),
            Err(ProvisionError::RewriteNeedsSource)
        ));
    }
}
