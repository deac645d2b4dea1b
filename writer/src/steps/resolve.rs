//! `resolve`: opens the stack's source, an OCI image layout directory or a registry reference.
//!
//! Reads the [`StackRef`]; returns the opened [`Source`], nothing of it trusted yet, and says
//! which source (a mirror, the origin) answered a tag. A registry source stays open as itself: the `write` step streams the layers' data blobs from it
//! ([`crate::stream`]); [`Source`] is in [`crate::stack`] instead of downloading them first.

use ingot_artifact::registry::source::RegistrySource;
use ingot_artifact::registry::RegistryOptions;
use ingot_artifact::verify::{LayoutSource, StackRef, VerifyError};

use crate::report::{Reporter, Stage};
use crate::stack::Source;

/// The `resolve` step; see the module docs.
pub fn run(
    stack: &StackRef,
    registry: &RegistryOptions,
    reporter: &Reporter,
) -> Result<Source, VerifyError> {
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
        StackRef::Registry(r) => {
            let opened = RegistrySource::open_logged(r, registry.clone(), reporter.source_log())
                .map_err(VerifyError::from)?;
            say_resolved(&opened, reporter);
            Source::Registry(Box::new(opened))
        }
    })
}

/// Which source answered the tag (a mirror's may be older than the origin's): said, and
/// recorded as the status file's `details.resolved`.
fn say_resolved(opened: &RegistrySource, reporter: &Reporter) {
    let log = opened.registry().log();
    let Some(r) = log.resolved().into_iter().next() else {
        return;
    };
    let kind = if r.mirror { "mirror" } else { "origin" };
    reporter.stage(
        Stage::Resolve,
        format!(
            "tag {} resolved to {} by {kind} {}",
            r.tag, r.digest, r.location
        ),
    );
    reporter.detail("resolved", &r);
}
