//! `verify`: the signature, the descriptor, this machine's selection, and every selected layer's
//! hash tree against its signed root hash.
//!
//! Reads the opened source, the trusted key and the machine; returns an [`OpenedStack`]: the
//! verified descriptor and, per selected layer, its checked tree and, from an image layout, the
//! path of its data blob (whose blocks are checked against the tree by whoever reads them). From
//! a registry the data blobs are not fetched here: the `write` step streams them.

use std::sync::{Arc, OnceLock};

use ingot_artifact::verify::{read_uki, verify_metadata, verity_params, Trust, VerifyError};
use ingot_layers::descriptor::LayerEntry;
use ingot_layers::select::Machine;
use ingot_verity::Verifier;

use crate::report::{Reporter, Stage};
use crate::stack::{OpenedStack, Source, VerifiedLayer};

/// Why the stack is not one to write.
#[derive(Debug, thiserror::Error)]
pub enum VerifyStepError {
    /// Boxed: a verification error carries its whole typed cause (registry, layout, frame).
    #[error(transparent)]
    Source(Box<VerifyError>),
    #[error("layer `{layer}`: the hash tree does not match the signed root hash")]
    Tree {
        layer: String,
        #[source]
        source: ingot_verity::VerityError,
    },
    #[error("the stack has no base layer to boot from")]
    NoBase,
}

impl From<VerifyError> for VerifyStepError {
    fn from(e: VerifyError) -> Self {
        VerifyStepError::Source(Box::new(e))
    }
}

/// The `verify` step; see the module docs.
pub fn run(
    source: Source,
    trust: &Trust,
    machine: &Machine,
    reporter: &Reporter,
) -> Result<OpenedStack, VerifyStepError> {
    reporter.stage(
        Stage::Verify,
        format!("checking the signature of {}", source.get().describe()),
    );
    let (report, _manifest) = verify_metadata(source.get(), trust)?;
    let d = &report.descriptor;
    if let Source::Registry(r) = &source {
        if let Some(resolved) = r.registry().log().resolved().first() {
            if tag_disagrees(&resolved.tag, &d.version) {
                let kind = if resolved.mirror { "mirror" } else { "origin" };
                reporter.warning(
                    Stage::Verify,
                    format!(
                        "tag {} looks like a version, but {kind} {} resolved it to stack {} \
                         version {} ({}): another release than the tag names, signed all the \
                         same (a mirror's stale tag?); pin the digest to write exactly one",
                        resolved.tag, resolved.location, d.name, d.version, resolved.digest
                    ),
                );
            }
        }
    }
    let selected: Vec<&LayerEntry> = d.select(machine).collect();
    if selected.first().map(|l| l.name.as_str()) != Some(d.base().name.as_str()) {
        return Err(VerifyStepError::NoBase);
    }
    let names: Vec<String> = selected.iter().map(|l| l.name.clone()).collect();
    reporter.stage(
        Stage::Verify,
        format!(
            "stack {} {}: this machine gets {}; checking hash trees",
            d.name,
            d.version,
            names.join(", ")
        ),
    );
    reporter.set_layers(names);
    let layers = selected
        .into_iter()
        .map(|entry| prepare(&source, entry))
        .collect::<Result<Vec<_>, _>>()?;
    // A UEFI machine boots the release's signed UKI when the stack has one: read and checked
    // (digest, signed command line) before any disk changes. BIOS machines boot as before.
    let uki = if machine.uefi {
        reporter.stage(Stage::Verify, "checking the release's signed UKI");
        read_uki(source.get(), &report.descriptor)?
    } else {
        None
    };
    let opened = OpenedStack::new(report, layers, source);
    Ok(match uki {
        Some(bytes) => opened.with_uki(bytes),
        None => opened,
    })
}

/// Whether `tag` looks like a version (`1.31`, `v1.2.3`, `12.0.0-rc.1`: digits and dots, at
/// least two parts, a leading `v`, a pre-release or build suffix) that the signed `version` is
/// not: neither the same nor a release within it (tag `1.31` names `1.31.2`).
fn tag_disagrees(tag: &str, version: &str) -> bool {
    let tag = tag.strip_prefix('v').unwrap_or(tag);
    let core = tag.split(['-', '+']).next().unwrap_or_default();
    let parts: Vec<&str> = core.split('.').collect();
    let numeric = |p: &&str| !p.is_empty() && p.bytes().all(|b| b.is_ascii_digit());
    if parts.len() < 2 || !parts.iter().all(numeric) {
        return false;
    }
    let version = version.strip_prefix('v').unwrap_or(version);
    let within = version
        .strip_prefix(tag)
        .is_some_and(|rest| rest.is_empty() || rest.starts_with(['.', '-', '+']));
    !within
}

/// Checks one layer's tree against its signed root hash and locates its data blob.
fn prepare(opened: &Source, entry: &LayerEntry) -> Result<VerifiedLayer, VerifyStepError> {
    let source = opened.get();
    let params = verity_params(entry)?;
    let hash_bytes = source.blob(&entry.hash.digest, entry.hash.size)?;
    let root = &entry.verity.root_hash;
    let verifier = Verifier::from_hash_device(&params, &hash_bytes, root).map_err(|source| {
        VerifyStepError::Tree {
            layer: entry.name.clone(),
            source,
        }
    })?;
    // Not hashed whole: every block is checked against the tree after it is written and read
    // back, which covers exactly the bytes on the disk. From a registry it is not fetched here
    // at all, but streamed while it is written.
    let data_path = OnceLock::new();
    if let Source::Layout(local) = opened {
        let _ = data_path.set(local.blob_file_unhashed(&entry.data.digest, entry.data.size)?);
    }
    Ok(VerifiedLayer {
        entry: entry.clone(),
        verifier: Arc::new(verifier),
        hash_bytes,
        data_path,
    })
}

#[cfg(test)]
mod tests {
    use super::tag_disagrees;

    /// A tag that names a version must name the signed one (or a release line holding it); a
    /// tag that is not a version (`latest`, `stable`, a date) says nothing about it.
    #[test]
    fn a_version_tag_must_match_the_signed_version() {
        for (tag, version) in [
            ("1.2.3", "1.2.3"),
            ("v1.2.3", "1.2.3"),
            ("1.2.3", "v1.2.3"),
            ("1.31", "1.31.2"),
            ("12.0", "12.0.0-rc.1"),
            ("1.2.3-rc.1", "1.2.3-rc.1"),
            ("latest", "0.1"),
            ("stable", "2.0.0"),
            ("20240101", "1.0.0"),
            ("1", "2.0.0"),
            ("1.x", "2.0.0"),
        ] {
            assert!(!tag_disagrees(tag, version), "{tag} vs {version}");
        }
        for (tag, version) in [
            ("1.2.3", "1.2.2"),
            ("v1.2.3", "1.2.30"),
            ("1.31", "1.30.9"),
            ("1.3", "1.31.0"),
            ("12.0.0", "11.9.0"),
            ("1.2.3-rc.2", "1.2.3-rc.1"),
        ] {
            assert!(tag_disagrees(tag, version), "{tag} vs {version}");
        }
    }
}
