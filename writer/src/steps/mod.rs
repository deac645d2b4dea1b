//! The writer's steps, one module each, named as the stages are reported, in the order
//! the pipeline runs them. Each module's summary says what it reads and returns.
//!
//! Provisioning only (they read the machine): [`check`], [`gate`], [`guard`], then, once the
//! stack is verified, [`stage`] and [`seal`], and [`teardown`], the first to change a disk.
//! Every run: [`resolve`], [`verify`], [`plan`]; from [`wipe`] on the disk changes: [`write`],
//! [`esp`], [`partition_table`]; then [`finish`]. Each step returns its own error type, which
//! the `error` module wraps; a step uses only the modules below the steps and the output types of
//! the steps before it.

pub mod check;
pub mod esp;
pub mod finish;
pub mod gate;
pub mod guard;
pub mod partition_table;
pub mod plan;
pub mod resolve;
pub mod seal;
pub mod stage;
pub mod teardown;
pub mod verify;
pub mod wipe;
pub mod write;
