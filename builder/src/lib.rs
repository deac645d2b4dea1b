//! The library behind `ingot`: manifests, layer builds, preloaded images and inspection. The
//! artifact side (OCI layouts, compression, signatures, verification, the registry client) is
//! `ingot-artifact`, which the modules here import by its own name. [`cli`] is the command line;
//! the binary only parses it and runs it.

pub mod build;
pub mod cli;
pub mod db_key;
pub mod debian;
pub mod debian_spec;
pub mod diff;
pub mod display;
pub mod events;
pub mod inspect;
pub mod manifest;
pub mod preload;
pub mod sb_keys;
pub mod tool;
pub mod uki;
