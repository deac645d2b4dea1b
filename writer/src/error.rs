//! What can stop a run: each step's own error, wrapped. [`WriteError`] from the steps that open,
//! verify and write a stack, [`ProvisionError`] from a whole provisioning run, whose short
//! failure reason ([`ProvisionError::reason`]) is computed from the types. A registry or network
//! that failed to deliver (unreachable, dropped, too slow: retries used up) is
//! `download-failed` whichever step was reading: `resolve`, `verify`, `stage`, `plan`, `write`.

use ingot_artifact::layerfs::{BlockError, LayerFsError};
use ingot_artifact::verify::VerifyError;
use ingot_machine::GateFailure;

use crate::engine::{EngineError, Stopped};
use crate::reason::FailureReason;
use crate::stack::StackError;
use crate::steps::check::CheckError;
use crate::steps::esp::EspError;
use crate::steps::plan::PlanError;
use crate::steps::seal::SealError;
use crate::steps::stage::StageStepError;
use crate::steps::verify::VerifyStepError;
use crate::steps::write::WriteStepError;
use crate::table::TableError;
use crate::target::TargetError;

/// A step of writing a stack failed (`resolve` to `partition-table`).
#[derive(Debug, thiserror::Error)]
pub enum WriteError {
    /// Boxed, as below: a verification error carries its whole typed cause.
    #[error(transparent)]
    Resolve(Box<VerifyError>),
    #[error(transparent)]
    Verify(#[from] VerifyStepError),
    /// Boxed: the plan's boot checks carry a whole layer-read error.
    #[error(transparent)]
    Plan(Box<PlanError>),
    #[error(transparent)]
    Wipe(TableError),
    #[error(transparent)]
    Write(#[from] WriteStepError),
    #[error(transparent)]
    Esp(#[from] EspError),
    #[error(transparent)]
    Table(TableError),
    /// The target stopped being the disk it was (renamed, replaced), or a disk already written
    /// could not be opened again as the next one's copy source.
    #[error(transparent)]
    Target(#[from] TargetError),
    #[error(transparent)]
    Stopped(#[from] Stopped),
}

/// A provisioning run failed.
#[derive(Debug, thiserror::Error)]
pub enum ProvisionError {
    #[error(transparent)]
    Check(#[from] CheckError),
    /// A gate, the guard or the teardown stopped the run.
    #[error(transparent)]
    Gate(#[from] GateFailure),
    #[error(transparent)]
    Stage(#[from] StageStepError),
    #[error(transparent)]
    Seal(#[from] SealError),
    #[error(transparent)]
    Write(#[from] WriteError),
}

impl From<Stopped> for ProvisionError {
    fn from(s: Stopped) -> Self {
        ProvisionError::Write(WriteError::Stopped(s))
    }
}

impl ProvisionError {
    /// The failure reason: the gate's, or the kind of error.
    pub fn reason(&self) -> FailureReason {
        match self {
            ProvisionError::Check(CheckError::Machine(_)) => FailureReason::MachineUnreadable,
            ProvisionError::Check(CheckError::Read { .. }) => FailureReason::Io,
            ProvisionError::Check(CheckError::Bootstrap { .. }) => FailureReason::BootstrapInvalid,
            ProvisionError::Gate(g) => FailureReason::from_gate(g.reason),
            ProvisionError::Stage(StageStepError::Base(s)) if stack_download(s) => {
                FailureReason::DownloadFailed
            }
            ProvisionError::Stage(StageStepError::BaseFile { source, .. })
                if layerfs_download(source) =>
            {
                FailureReason::DownloadFailed
            }
            // The data asks for a path the per-node layer may not carry: the data is wrong.
            ProvisionError::Stage(StageStepError::Stage(
                ingot_bootstrap::StageError::NotAllowed { .. },
            )) => FailureReason::BootstrapInvalid,
            ProvisionError::Stage(_) => FailureReason::StageFailed,
            ProvisionError::Seal(_) => FailureReason::SealFailed,
            ProvisionError::Write(w) => w.reason(),
        }
    }
}

/// Whether reading from the registry failed in transport (unreachable, dropped, too slow, with
/// every source), not for what it delivered.
fn verify_download(e: &VerifyError) -> bool {
    matches!(e, VerifyError::Registry(r) if r.is_transport())
}

/// Whether a zstd frame of a layer could not be fetched.
fn layerfs_download(e: &LayerFsError) -> bool {
    e.block()
        .is_some_and(|b| matches!(b, BlockError::Fetch { .. }))
}

/// Whether a blob of the verified stack could not be fetched.
fn stack_download(e: &StackError) -> bool {
    match e {
        StackError::Blob(v) => verify_download(v),
        StackError::LayerFs(l) => layerfs_download(l),
        StackError::Map { .. } => false,
    }
}

/// The base layer's block the plan could not read, when that is why it failed.
fn plan_block(p: &PlanError) -> Option<&BlockError> {
    match p {
        PlanError::BootFile { source, .. } => source.block(),
        PlanError::Stack(StackError::LayerFs(e)) => e.block(),
        _ => None,
    }
}

impl WriteError {
    /// The failure reason of a write: a stop, a bad image, a download, or the disk.
    pub fn reason(&self) -> FailureReason {
        if let Some(stopped) = self.stopped() {
            return match stopped {
                Stopped::Deadline { .. } => FailureReason::Deadline,
                Stopped::Interrupted { .. } => FailureReason::Interrupted,
            };
        }
        match self {
            WriteError::Resolve(v) | WriteError::Verify(VerifyStepError::Source(v))
                if verify_download(v) =>
            {
                FailureReason::DownloadFailed
            }
            WriteError::Write(WriteStepError::Stack(s)) if stack_download(s) => {
                FailureReason::DownloadFailed
            }
            WriteError::Plan(p) if matches!(&**p, PlanError::Stack(s) if stack_download(s)) => {
                FailureReason::DownloadFailed
            }
            WriteError::Esp(EspError::BootFiles(l)) if layerfs_download(l) => {
                FailureReason::DownloadFailed
            }
            WriteError::Resolve(_)
            | WriteError::Verify(VerifyStepError::Source(_))
            | WriteError::Write(WriteStepError::Engine(
                EngineError::Blob { .. } | EngineError::BadSource { .. },
            ))
            | WriteError::Write(WriteStepError::AllSources { .. }) => FailureReason::ImageInvalid,
            WriteError::Write(WriteStepError::Engine(EngineError::Download { .. })) => {
                FailureReason::DownloadFailed
            }
            // The base layer's frames the plan reads (before any disk changed): bytes that are
            // not the signed image from every source, or not fetched at all.
            WriteError::Plan(p) if plan_block(p).is_some_and(BlockError::is_bad_bytes) => {
                FailureReason::ImageInvalid
            }
            WriteError::Plan(p)
                if plan_block(p).is_some_and(|b| matches!(b, BlockError::Fetch { .. })) =>
            {
                FailureReason::DownloadFailed
            }
            // Found before any disk changed: the stack (or a --kernel-arg) cannot boot here.
            WriteError::Plan(p)
                if matches!(**p, PlanError::Boot { .. } | PlanError::BootFile { .. }) =>
            {
                FailureReason::CannotBoot
            }
            _ => FailureReason::WriteFailed,
        }
    }

    /// The stop (deadline or signal) behind this error, from whichever step noticed it.
    fn stopped(&self) -> Option<&Stopped> {
        match self {
            WriteError::Plan(p) => match &**p {
                PlanError::Stopped(s) => Some(s),
                _ => None,
            },
            WriteError::Stopped(s)
            | WriteError::Esp(EspError::Stopped(s))
            | WriteError::Write(WriteStepError::Engine(EngineError::Stopped(s)))
            | WriteError::Esp(EspError::Engine(EngineError::Stopped(s))) => Some(s),
            _ => None,
        }
    }
}

impl From<PlanError> for WriteError {
    fn from(e: PlanError) -> Self {
        WriteError::Plan(Box::new(e))
    }
}

impl From<StackError> for WriteError {
    fn from(e: StackError) -> Self {
        WriteError::Write(WriteStepError::Stack(e))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn engine(e: EngineError) -> &'static str {
        ProvisionError::Write(WriteError::Write(WriteStepError::Engine(e)))
            .reason()
            .name()
    }

    /// What the operator reads in CAPH: a registry or network problem in `write` is not a disk
    /// problem, and a stop is a stop whichever step noticed it.
    #[test]
    fn write_failures_name_their_cause() {
        let (layer, blob) = ("base".to_string(), "sha256:00".to_string());
        let download = EngineError::Download {
            layer: layer.clone(),
            blob: blob.clone(),
            reason: "the response ended".into(),
        };
        assert_eq!(engine(download), "download-failed");
        let bad = EngineError::BadSource {
            layer: layer.clone(),
            blob: blob.clone(),
            frame: 3,
            block: 7,
        };
        assert_eq!(engine(bad), "image-invalid");
        let corrupt = EngineError::Blob {
            layer: layer.clone(),
            blob,
            reason: "zstd frame 3: corrupt".into(),
        };
        assert_eq!(engine(corrupt), "image-invalid");
        let large = EngineError::TooLarge {
            layer,
            need: 2,
            have: 1,
        };
        assert_eq!(engine(large), "write-failed");
        let deadline = || Stopped::Deadline {
            during: "plan".into(),
        };
        assert_eq!(engine(EngineError::Stopped(deadline())), "deadline");
        let stops = [
            WriteError::Stopped(deadline()),
            WriteError::from(PlanError::Stopped(deadline())),
            WriteError::Esp(EspError::Stopped(deadline())),
        ];
        for e in stops {
            assert_eq!(ProvisionError::Write(e).reason().name(), "deadline");
        }
        let signal = Stopped::Interrupted {
            during: "checking the machine and the stack".into(),
        };
        assert_eq!(ProvisionError::from(signal).reason().name(), "interrupted");
    }

    /// The plan reads the base layer's boot files from its blob: bytes that fail the signed tree
    /// (from every source) are a bad image, a frame that could not be fetched a download, and
    /// only a boot file that is not there (or not a file) a stack that cannot boot.
    #[test]
    fn a_boot_file_read_fails_by_its_cause() {
        use ingot_artifact::layerfs::{LayerFsError, ReadError};
        let plan = |source: ReadError| {
            ProvisionError::Write(WriteError::from(PlanError::BootFile {
                stack: "demo 1".into(),
                what: "kernel",
                path: "/boot/vmlinuz".into(),
                source: Box::new(LayerFsError::Missing {
                    layer: "base".into(),
                    path: "/boot/vmlinuz".into(),
                    source,
                }),
            }))
            .reason()
            .name()
        };
        let verify = || BlockError::Verify {
            block: 4,
            source: ingot_verity::VerifyError::DataBlock {
                block: 4,
                offset: 16384,
            },
        };
        assert_eq!(plan(ReadError::Block(verify())), "image-invalid");
        let every = BlockError::AllSources {
            frame: 1,
            tried: vec![("mirror a".into(), verify()), ("origin b".into(), verify())],
        };
        assert_eq!(plan(ReadError::Block(every)), "image-invalid");
        let fetch = BlockError::Fetch {
            frame: 1,
            source: "the response ended".into(),
        };
        assert_eq!(plan(ReadError::Block(fetch)), "download-failed");
        assert_eq!(plan(ReadError::NotRegular), "cannot-boot");
    }

    /// A registry that stops delivering (unreachable, dropped connections, too slow: retries
    /// used up) is `download-failed` in whichever step reads from it, and what it delivered
    /// being wrong stays `image-invalid`.
    #[test]
    fn a_registry_that_stops_delivering_is_a_download_failure_in_every_step() {
        use ingot_artifact::layerfs::ReadError;
        use ingot_artifact::registry::{Cause, RegistryError};
        let transient = || {
            VerifyError::Registry(RegistryError::Transient {
                op: "blob sha256:00".into(),
                attempts: 2,
                last: Cause::TooSlow("1 byte in 2 s".into()),
            })
        };
        let every = || {
            VerifyError::Registry(RegistryError::AllSources {
                what: "blob sha256:00".into(),
                tried: "mirror a (bad bytes)".into(),
                last_source: "origin b".into(),
                last: Box::new(RegistryError::Transient {
                    op: "blob sha256:00".into(),
                    attempts: 2,
                    last: Cause::Answer("dropped".into()),
                }),
            })
        };
        let integrity = || {
            VerifyError::Registry(RegistryError::Integrity {
                blob: "sha256:00".into(),
                detail: "digest mismatch".into(),
            })
        };
        let fetch = || LayerFsError::Missing {
            layer: "base".into(),
            path: "/etc/passwd".into(),
            source: ReadError::Block(BlockError::Fetch {
                frame: 0,
                source: "the response ended".into(),
            }),
        };
        let write = |e: WriteError| ProvisionError::Write(e).reason().name();
        for e in [transient(), every()] {
            assert_eq!(write(WriteError::Resolve(Box::new(e))), "download-failed");
        }
        for e in [transient(), every()] {
            assert_eq!(write(WriteError::Verify(e.into())), "download-failed");
        }
        assert_eq!(
            write(WriteError::Verify(integrity().into())),
            "image-invalid"
        );
        assert_eq!(
            write(WriteError::Resolve(Box::new(integrity()))),
            "image-invalid"
        );
        let stage = |e: StageStepError| ProvisionError::Stage(e).reason().name();
        assert_eq!(
            stage(StageStepError::Base(StackError::Blob(transient()))),
            "download-failed"
        );
        assert_eq!(
            stage(StageStepError::Base(StackError::LayerFs(fetch()))),
            "download-failed"
        );
        assert_eq!(
            stage(StageStepError::BaseFile {
                path: "/etc/passwd",
                source: fetch(),
            }),
            "download-failed"
        );
        assert_eq!(
            stage(StageStepError::Base(StackError::Blob(integrity()))),
            "stage-failed"
        );
        assert_eq!(
            write(WriteError::from(PlanError::Stack(
                StackError::Blob(every())
            ))),
            "download-failed"
        );
        assert_eq!(
            write(WriteError::Esp(EspError::BootFiles(fetch()))),
            "download-failed"
        );
    }
}
