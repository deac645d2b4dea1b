//! `resolve`: opens the stack's source, an OCI image layout directory or a registry reference.
//!
//! Reads the [`StackRef`]; returns the opened [`Source`], nothing of it trusted yet. A registry
//! source stays open as itself: the `write` step streams the layers' data blobs from it
//! ([`crate::stream`]) instead of downloading them first.

use ingot_artifact::registry::source::RegistrySource;
use ingot_artifact::registry::RegistryOptions;
use ingot_artifact::verify::{ArtifactSource, LayoutSource, StackRef, VerifyError};

use crate::error::WriteError;
use crate::report::{Reporter, Stage};

/// Where the stack comes from.
pub enum Source {
    /// An OCI image layout directory: every blob is a local file.
    Layout(Box<dyn ArtifactSource>),
    /// A registry, kept open: data blobs stream from it while they are written.
    Registry(Box<RegistrySource>),
}

impl Source {
    /// The source as the signature and descriptor checks read it.
    pub fn get(&self) -> &dyn ArtifactSource {
        match self {
            Source::Layout(s) => s.as_ref(),
            Source::Registry(r) => r.as_ref(),
        }
    }
}

/// The `resolve` step; see the module docs.
pub fn run(
    stack: &StackRef,
    registry: &RegistryOptions,
    reporter: &Reporter,
) -> Result<Source, WriteError> {
    let what = match stack {
        StackRef::Layout(p, None) => p.display().to_string(),
        StackRef::Layout(p, Some(tag)) => format!("oci:{}:{tag}", p.display()),
        StackRef::Registry(r) => r.to_string(),
    };
    reporter.stage(Stage::Resolve, format!("opening {what}"));
    Ok(match stack {
        StackRef::Layout(p, tag) => {
            Source::Layout(Box::new(LayoutSource::open_tagged(p, tag.as_deref())?))
        }
        StackRef::Registry(r) => Source::Registry(Box::new(
            RegistrySource::open(r, registry.clone()).map_err(VerifyError::from)?,
        )),
    })
}
