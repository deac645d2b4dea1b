//! The library behind `ingot`: manifests, layer builds, compression, OCI layouts, signatures,
//! verification and inspection. The binary (`main.rs` and `cmd_*.rs`) only parses arguments and
//! calls into these modules.

pub mod compress;
pub mod manifest;
pub mod oci_layout;
pub mod sign;
