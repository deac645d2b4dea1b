//! The machinery that boots stacks under QEMU, shared by `ingot vm` and the test suite, so the
//! product and the tests cannot drift: the accelerator choice ([`accel`]: KVM only when a guest
//! really runs under it, else TCG and why), the firmware and programs found or refused naming
//! their Debian package ([`firmware`]), a machine described as a type and rendered into QEMU's
//! command line ([`machine`]), a software TPM ([`swtpm`]), and a run watched on its serial
//! console ([`run`], [`console`]); for `ingot vm`, the fixture machine the writer reads
//! ([`fixture`]), the bootstrap data it is given ([`bootstrap`]), the state directory ([`state`]), provisioning it as CAPH provisions a server ([`provision`]) and Secure Boot key enrollment
//! ([`secure_boot`]).

pub mod accel;
pub mod bootstrap;
pub mod console;
pub mod firmware;
pub mod fixture;
pub mod machine;
pub mod provision;
pub mod run;
pub mod secure_boot;
pub mod state;
pub mod swtpm;
