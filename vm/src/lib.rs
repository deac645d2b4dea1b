//! The machinery that boots stacks under QEMU, shared by `ingot vm` and the test suite, so the
//! product and the tests cannot drift. Today it holds the accelerator choice ([`accel`]): KVM
//! only when a guest really runs under it, else TCG and why.

pub mod accel;
