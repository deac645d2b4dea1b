//! Test support shared by ingot's test suites (a dev-dependency only, never linked into a
//! binary): real tools and real services, started and checked the same way everywhere.

pub mod command;
/// A QEMU serial console as text: `ingot-vm`'s.
pub use ingot_vm::console;
pub mod cores;
pub mod digest;
pub mod error_rule;
/// The one HTTP test server ([`http::Server`]), of which the registry front ([`registry::Front`]),
/// the proxy (`ingot-testproxy`) and the builder's hostile registry are behaviours.
pub use ingot_testproxy::server as http;
pub mod layout;
pub mod loopdev;
pub mod machine;
pub mod measure;
pub mod modules;
pub mod noise;
pub mod partitions;
pub mod qemu;
pub mod registry;
pub mod rescue;
pub mod skip;
pub mod spdx;
