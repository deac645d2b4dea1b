//! The library behind `ingot`: manifests, layer builds, preloaded images and inspection. The
//! artifact side (OCI layouts, compression, signatures, verification, the registry client) is
//! `ingot-artifact`, re-exported here under its old paths. The binary (`main.rs` and
//! `cmd_*.rs`) only parses arguments and calls into these modules.

pub mod build;
pub mod inspect;
pub mod manifest;
pub mod preload;

pub use ingot_artifact::{compress, oci_layout, registry, sign, verify};
