//! `seal`: the per-node layer, built on this machine from the staged files: first the node's
//! secrets sealed to the TPM (or left in the clear, as the `gate` decided: [`crate::secrets`]),
//! then a deterministic ext4 image and its dm-verity tree, with the layer builder every stack
//! layer comes from.
//!
//! Reads the [`Staged`] files, the secrets decision, the stack's name and the machine name (they
//! seed the image); returns the [`NodeLayer`]: image, hash device and root hash, and what became
//! of the secrets ([`SecretsReport`], also the status file's `details.secrets`).

use std::io::Write;

use crate::node::NodeLayer;
use crate::seal::Sealer;
use crate::secrets::{SecretsReport, Treatment};
use crate::tpm::{Decision, TpmSetting};
use ingot_bootstrap::Staged;

/// Why the per-node layer could not be sealed.
#[derive(Debug, thiserror::Error)]
pub enum SealError {
    #[error("sealing the per-node layer: the staged files")]
    Tree(#[source] ingot_layers::LayerError),
    #[error("sealing the per-node layer: {what}")]
    Io {
        what: &'static str,
        #[source]
        source: std::io::Error,
    },
    #[error("sealing the per-node layer: building the image")]
    Build(#[source] ingot_layers::LayerError),
    #[error("sealing the per-node layer: the layer builder made no hash tree")]
    NoTree,
    #[error("sealing the per-node layer's secrets")]
    Secrets(#[from] crate::secrets::SecretsError),
}

/// What the `seal` step needs to know about the secrets.
pub struct SecretsPlan<'a> {
    pub setting: TpmSetting,
    /// The machine's TPM major version.
    pub tpm: Option<u8>,
    pub decision: &'a Decision,
    /// `systemd-creds --tpm2-device=`.
    pub device: &'a str,
}
use crate::report::{Reporter, Stage};

pub fn run(
    staged: Staged,
    secrets: &SecretsPlan,
    stack: &str,
    machine_name: &str,
    reporter: &Reporter,
) -> Result<(NodeLayer, SecretsReport), SealError> {
    let io = |what| move |source| SealError::Io { what, source };
    let (staged, report) = match secrets.decision {
        Decision::Seal { public_key } => {
            reporter.stage(
                Stage::Seal,
                format!(
                    "sealing {} secrets to this machine's TPM under the release's PCR policy",
                    staged.secrets.len()
                ),
            );
            // The PCR public key, for systemd-creds (public: a file is fine); kept until sealed.
            let mut key = tempfile::NamedTempFile::new().map_err(io("writing the PCR key"))?;
            key.write_all(public_key)
                .map_err(io("writing the PCR key"))?;
            let sealer = Sealer {
                device: secrets.device.to_string(),
                ..Sealer::new(key.path())
            };
            let treatment = Treatment::Seal { sealer: &sealer };
            crate::secrets::apply(staged, secrets.setting, secrets.tpm, treatment)?
        }
        Decision::Clear(why) => {
            crate::secrets::apply(staged, secrets.setting, secrets.tpm, Treatment::Clear(*why))?
        }
    };
    for s in &report.secrets {
        reporter.stage(
            Stage::Seal,
            format!(
                "secret {}: {}{}",
                s.path.display(),
                s.credential
                    .as_ref()
                    .map_or("in the clear".to_string(), |c| format!("sealed as {c}")),
                s.ssh_fingerprint
                    .as_ref()
                    .map_or(String::new(), |f| format!(", host key {f}"))
            ),
        );
    }
    if report.sealed {
        reporter.stage(Stage::Seal, report.message.clone());
    } else {
        reporter.warning(Stage::Seal, report.message.clone());
    }
    reporter.detail("secrets", &report);
    reporter.stage(
        Stage::Seal,
        "sealing the per-node layer (ext4 image and dm-verity tree)",
    );
    let node = seal(&staged, stack, machine_name)?;
    reporter.stage(
        Stage::Seal,
        format!(
            "sealed the per-node layer: {} bytes, root hash {}",
            node.image.len(),
            node.root_hash
        ),
    );
    Ok((node, report))
}

/// Builds the node layer: the staged files as a tree, sealed by the layer builder every stack
/// layer comes from ([`ingot_layers::seal_tree`]), in a scratch directory read back into memory.
fn seal(staged: &Staged, stack: &str, machine_name: &str) -> Result<NodeLayer, SealError> {
    let io = |what| move |source| SealError::Io { what, source };
    let tree = staged.to_tree().map_err(SealError::Tree)?;
    let dir = tempfile::tempdir().map_err(io("making a scratch directory"))?;
    let img = dir.path().join("node.img");
    let hash = dir.path().join("node.hash");
    let opts = ingot_layers::Ext4Options {
        seed: format!("{stack}/node/{machine_name}").into_bytes(),
        source_date_epoch: 0,
        size: None,
        progress: None,
    };
    let built = ingot_layers::seal_tree(&tree, &img, &hash, &opts).map_err(SealError::Build)?;
    let verity = built.verity.ok_or(SealError::NoTree)?;
    Ok(NodeLayer {
        image: std::fs::read(&img).map_err(io("reading the image"))?,
        hash: std::fs::read(&hash).map_err(io("reading the hash tree"))?,
        root_hash: verity.root_hash,
    })
}
