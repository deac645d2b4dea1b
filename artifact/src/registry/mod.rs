//! Stacks in OCI registries. The registry client itself (transport, credentials, mirrors,
//! publish and pull of a layout) is the `ingot-registry` crate, re-exported here whole so that
//! `ingot_artifact::registry::…` names it; what needs to know what a stack is stays here:
//!
//! - [`frames`]: [`frames::BlobFrames`], a layer's data blob one zstd frame at a time for
//!   `layerfs`, a source whose bytes fail the layer's check refused for the blob.
//! - [`source`]: [`source::RegistrySource`], the verifier's artifact source for a registry.

pub use ingot_registry::*;

pub mod frames;
pub mod source;
