//! What machine is this, may we write to its disks, and would an old OS still boot?
//!
//! CAPH runs none of its own disk checks when it starts `ingot-writer` as its `imageURLCommand`
//! (it calls them only on its `installimage` path; see `docs/machine-checks.md`), so the writer
//! does them itself, with this crate:
//!
//! * [`detect`]: UEFI, PCI devices (NVIDIA GPU), CPU virtualization flags and `/dev/kvm`, disks.
//! * [`resolve_targets`]: CAPH's fourth argument (short names or WWNs) to [`Disk`]s.
//! * gates, each `Result<GateReport, GateFailure>`: [`gate_tools`], [`gate_uefi`], [`gate_size`],
//!   [`gate_smart`], [`gate_read_speed`].
//! * [`guard()`]: refuses when another disk holds an OS, or an md array or LVM volume group
//!   spans target and non-target disks; lists the arrays and volume groups living only on
//!   targets ([`Teardown`]). It parses partition tables, filesystems and LVM metadata itself,
//!   read-only.
//! * [`teardown`]: the commands that stop and clear that storage before the writer writes.
//!
//! Everything is read below a [`Sysroot`] (`/` on a real machine), and every program is run
//! through a [`host::Host`] ([`host::Live`], or [`host::Fixture`] below a fixture machine's
//! sysroot), so every check runs against a fixture machine directory in tests
//! (`ingot_testkit::machine::materialize`).
//! The rules and the fixture layout are described in `docs/machine-checks.md`.

pub mod aligned;
mod detect;
mod disks;
mod error;
mod gate;
pub mod guard;
pub mod host;
mod smart;
mod speed;
mod sysroot;
pub mod teardown;

pub use detect::{detect, Facts, PciDevice};
pub use disks::{normalize_wwn, read_disk, resolve_targets, Disk};
pub use error::MachineError;
pub use gate::{
    gate_size, gate_tools, gate_tpm, gate_uefi, pcr_policy_missing, tpm_missing, tpm_unreachable,
    GateDetail, GateFailure, GateReport, Reason, Warning,
};
pub use guard::{guard, GuardOptions, GuardReport, Teardown};
pub use smart::gate_smart;
pub use speed::{default_min_kib_s, gate_read_speed, ReadSpeed};
pub use sysroot::Sysroot;
