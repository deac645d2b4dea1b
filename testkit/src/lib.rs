//! Test support shared by ingot's test suites (a dev-dependency only, never linked into a
//! binary): real tools and real services, started and checked the same way everywhere.

pub mod console;
pub mod digest;
pub mod layout;
pub mod machine;
pub mod partitions;
pub mod qemu;
pub mod registry;
pub mod rescue;
pub mod skip;
