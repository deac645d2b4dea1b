//! An ingot stack as an artifact, between the build and the disk: the OCI image layout it is
//! stored in, the zstd frames its layers are compressed into, its signature, its verification,
//! and the registry client that publishes and fetches it (the `ingot-registry` crate, re-exported
//! as [`registry`], with [`oci_layout`] and [`error_chain`]). [`stack_format`] owns the format of
//! the artifact itself (media types, annotations, the image manifest). `ingot` (the builder) writes
//! artifacts with it; `ingot-writer` reads and checks them with it.

pub mod compress;
pub mod cosign;
pub use ingot_registry::error_chain;
pub mod image_file;
pub mod layerfs;
pub use ingot_registry::oci_layout;
pub mod pcr_policy;
pub mod registry;
pub mod sbom;
pub mod sign;
pub mod stack_format;
pub mod trust_key;
pub mod uki;
pub mod verify;
pub mod version;
