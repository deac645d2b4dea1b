//! What can stop a run: [`WriteError`] from the steps that open, verify and write a stack,
//! [`ProvisionError`] from a whole provisioning run, with its short failure reason.

use std::path::PathBuf;

use ingot_artifact::verify::VerifyError;
use ingot_machine::GateFailure;

use crate::layerfs::LayerFsError;
use crate::steps::esp::EspError;
use crate::steps::partition_table::TableError;
use crate::steps::plan::PlanError;
use crate::steps::write::EngineError;
use crate::target::TargetError;

#[derive(Debug, thiserror::Error)]
pub enum WriteError {
    #[error(transparent)]
    Source(#[from] VerifyError),
    #[error("layer `{layer}`: the hash tree does not match the signed root hash: {reason}")]
    Tree { layer: String, reason: String },
    #[error(transparent)]
    Target(#[from] TargetError),
    #[error(transparent)]
    Plan(#[from] PlanError),
    #[error(transparent)]
    Engine(#[from] EngineError),
    #[error(transparent)]
    Table(#[from] TableError),
    #[error(transparent)]
    LayerFs(#[from] LayerFsError),
    #[error(transparent)]
    Esp(#[from] EspError),
    #[error("{path}: {what}: {source}")]
    Io {
        path: PathBuf,
        what: &'static str,
        source: std::io::Error,
    },
    #[error("the stack has no base layer to boot from")]
    NoBase,
}

#[derive(Debug, thiserror::Error)]
pub enum ProvisionError {
    /// A gate or the guard stopped the run; the disks were not touched.
    #[error("{0}")]
    Gate(#[from] GateFailure),
    #[error("reading the machine: {0}")]
    Machine(#[from] ingot_machine::MachineError),
    #[error("{path}: {what}: {source}")]
    Io {
        path: PathBuf,
        what: &'static str,
        source: std::io::Error,
    },
    #[error("the bootstrap data {path}: {source}")]
    Bootstrap {
        path: PathBuf,
        source: ingot_bootstrap::ParseError,
    },
    #[error("staging the per-node files: {0}")]
    Stage(#[from] ingot_bootstrap::StageError),
    /// The base layer's accounts, needed to stage owners, could not be read.
    #[error("reading the base layer's accounts for staging: {0}")]
    BaseAccounts(String),
    #[error("sealing the per-node layer: {0}")]
    Seal(String),
    #[error(transparent)]
    Write(#[from] WriteError),
}

impl ProvisionError {
    /// A short, stable name for the failure: the gate reason, or the kind of error.
    pub fn reason(&self) -> String {
        match self {
            ProvisionError::Gate(g) => g.reason.as_str().to_string(),
            ProvisionError::Machine(_) => "machine-unreadable".into(),
            ProvisionError::Io { .. } => "io".into(),
            ProvisionError::Bootstrap { .. } => "bootstrap-invalid".into(),
            // The data asks for a path the per-node layer may not carry: the data is wrong.
            ProvisionError::Stage(ingot_bootstrap::StageError::NotAllowed { .. }) => {
                "bootstrap-invalid".into()
            }
            ProvisionError::Stage(_) | ProvisionError::BaseAccounts(_) => "stage-failed".into(),
            ProvisionError::Seal(_) => "seal-failed".into(),
            ProvisionError::Write(WriteError::Engine(EngineError::Deadline { .. })) => {
                "deadline".into()
            }
            ProvisionError::Write(WriteError::Engine(EngineError::Interrupted { .. })) => {
                "interrupted".into()
            }
            ProvisionError::Write(WriteError::Source(_))
            | ProvisionError::Write(WriteError::Engine(
                EngineError::Blob { .. } | EngineError::BadSource { .. },
            )) => "image-invalid".into(),
            ProvisionError::Write(WriteError::Engine(EngineError::Download { .. })) => {
                "download-failed".into()
            }
            ProvisionError::Write(_) => "write-failed".into(),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// What the operator reads in CAPH: a registry or network problem in `write` is not a disk
    /// problem.
    #[test]
    fn write_failures_name_their_cause() {
        let engine = |e: EngineError| ProvisionError::Write(WriteError::Engine(e)).reason();
        let (layer, blob) = ("base".to_string(), "sha256:00".to_string());
        assert_eq!(
            engine(EngineError::Download {
                layer: layer.clone(),
                blob: blob.clone(),
                reason: "the response ended".into(),
            }),
            "download-failed"
        );
        assert_eq!(
            engine(EngineError::BadSource {
                layer: layer.clone(),
                blob: blob.clone(),
                frame: 3,
                block: 7,
            }),
            "image-invalid"
        );
        assert_eq!(
            engine(EngineError::Blob {
                layer: layer.clone(),
                blob,
                reason: "zstd frame 3: corrupt".into(),
            }),
            "image-invalid"
        );
        assert_eq!(
            engine(EngineError::TooLarge {
                layer,
                need: 2,
                have: 1,
            }),
            "write-failed"
        );
    }
}
