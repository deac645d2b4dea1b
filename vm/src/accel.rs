//! Which accelerator a VM runs under: KVM only when a guest really runs under it, otherwise TCG
//! with the reason, for a one-line warning. `/dev/kvm` that exists and opens is not enough: a
//! KVM without hardware virtualization (PVM's `kvm_pvm` on a nested host) creates VMs whose
//! guests crawl, each instruction emulated (a Debian kernel was still decompressing itself after
//! 25 s), so the choice boots a probe guest under `-accel kvm` ([`probe`]) and takes KVM only
//! if it finishes within [`PROBE_TIMEOUT`].

mod probe;

use std::time::Duration;

pub use crate::firmware::QEMU;
pub use probe::{image as probe_image, ProbeError, EXIT_STATUS};

/// How long the probe guest may take under KVM: it needs milliseconds where guests run on the
/// CPU (and under a tenth of a second under TCG); QEMU's start is in this too.
pub const PROBE_TIMEOUT: Duration = Duration::from_secs(3);

/// A QEMU accelerator.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Accel {
    /// The kernel's hardware virtualization.
    Kvm,
    /// QEMU's own translator: runs anywhere, many times slower.
    Tcg,
}

impl Accel {
    /// The name QEMU's `-accel` takes.
    pub fn name(self) -> &'static str {
        match self {
            Accel::Kvm => "kvm",
            Accel::Tcg => "tcg",
        }
    }
}

/// Why KVM is not used.
#[derive(Debug, thiserror::Error)]
pub enum Unusable {
    #[error("there is no /dev/kvm (no kvm module loaded, or no hardware virtualization)")]
    NoDevice,
    #[error("permission denied on /dev/kvm (the user is not in its group, kvm)")]
    PermissionDenied,
    #[error("opening /dev/kvm")]
    Open { source: std::io::Error },
    #[error(transparent)]
    Probe(#[from] ProbeError),
}

/// The accelerator chosen, and why not KVM when it is TCG.
#[derive(Debug)]
pub struct Choice {
    pub accel: Accel,
    pub why: Option<Unusable>,
}

impl Choice {
    /// The one-line warning for a fall back to TCG: the reason with its causes.
    pub fn warning(&self) -> Option<String> {
        let why = self.why.as_ref()?;
        let mut text = why.to_string();
        let mut cause = std::error::Error::source(why);
        while let Some(c) = cause {
            text = format!("{text}: {c}");
            cause = c.source();
        }
        Some(format!(
            "KVM is not usable, using TCG (much slower): {text}"
        ))
    }
}

/// The accelerator for a VM. `forced` is the user's `--accel`: TCG is taken as it is; KVM needs
/// a `/dev/kvm` that opens (the error otherwise) but skips the probe. Without it, KVM when
/// `/dev/kvm` opens and the probe guest finishes under it, else TCG and why.
pub fn choose(forced: Option<Accel>) -> Result<Choice, Unusable> {
    let accel = match forced {
        Some(Accel::Tcg) => Accel::Tcg,
        Some(Accel::Kvm) => open_kvm().map(|()| Accel::Kvm)?,
        None => match open_kvm().and_then(|()| Ok(probe(Accel::Kvm)?)) {
            Ok(_) => Accel::Kvm,
            Err(why) => {
                return Ok(Choice {
                    accel: Accel::Tcg,
                    why: Some(why),
                })
            }
        },
    };
    Ok(Choice { accel, why: None })
}

/// Boots the probe guest under `accel` (up to [`PROBE_TIMEOUT`]); how long QEMU ran. Under
/// TCG it shows the guest itself is sound, so a KVM failure is KVM's.
pub fn probe(accel: Accel) -> Result<Duration, ProbeError> {
    probe::run(accel.name(), PROBE_TIMEOUT)
}

/// Opens `/dev/kvm` read-write, as QEMU does.
fn open_kvm() -> Result<(), Unusable> {
    match std::fs::OpenOptions::new()
        .read(true)
        .write(true)
        .open("/dev/kvm")
    {
        Ok(_) => Ok(()),
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => Err(Unusable::NoDevice),
        Err(e) if e.kind() == std::io::ErrorKind::PermissionDenied => {
            Err(Unusable::PermissionDenied)
        }
        Err(source) => Err(Unusable::Open { source }),
    }
}
