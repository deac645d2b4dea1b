//! `resolve`: opens the stack's source, an OCI image layout directory or a registry reference.
//!
//! Reads the [`StackRef`]; returns the opened [`ArtifactSource`], nothing of it trusted yet.

use ingot_artifact::registry::RegistryOptions;
use ingot_artifact::verify::{ArtifactSource, StackRef};

use crate::error::WriteError;
use crate::report::{Reporter, Stage};

pub fn run(
    stack: &StackRef,
    registry: &RegistryOptions,
    reporter: &Reporter,
) -> Result<Box<dyn ArtifactSource>, WriteError> {
    let what = match stack {
        StackRef::Layout(p) => p.display().to_string(),
        StackRef::Registry(r) => r.to_string(),
    };
    reporter.stage(Stage::Resolve, format!("opening {what}"));
    Ok(ingot_artifact::verify::open_with(stack, registry.clone())?)
}
