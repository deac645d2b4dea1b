//! The library behind `ingot`: manifests, layer builds, preloaded images and inspection. The
//! artifact side (OCI layouts, compression, signatures, verification, the registry client) is
//! `ingot-artifact`, re-exported here under its old paths. [`cli`] is the command line; the
//! binary only parses it and runs it.

pub mod build;
pub mod cli;
pub mod diff;
pub mod inspect;
pub mod manifest;
pub mod preload;

pub use ingot_artifact::{
    compress, layerfs, oci_layout, registry, sign, trust_key, verify, version,
};
