//! The library behind `ingot`: manifests, layer builds, compression, OCI layouts, signatures,
//! verification and inspection. The binary (`main.rs` and `cmd_*.rs`) only parses arguments and
//! calls into these modules.

pub mod build;
pub mod compress;
pub mod inspect;
pub mod manifest;
pub mod oci_layout;
pub mod preload;
pub mod registry;
pub mod sign;
pub mod verify;
