//! Trying a reference's sources in order (`Registry::sources`: the mirrors a registries.conf
//! names, then the origin), and counting what each served.
//!
//! A source that fails (down, too slow by the speed rule, not holding the content, bytes that
//! fail a digest) is skipped with a warning naming it, and the next is tried; only when every
//! source fails does the operation fail, with an error naming each source and why. A blob a
//! source stopped serving partway is continued by the next from the byte reached (the running
//! SHA-256 carries over; the digest at the end covers every byte, whoever sent it). A blob
//! into a file whose bytes fail the digest is discarded and fetched whole from the next source.
//! A blob streamed into a sink the caller cannot take back (the writer) that fails its digest
//! at the end cannot be retried here: the error says so, and the sources that sent it are
//! refused for that blob from then on (a caller that starts the blob over gets other sources).
//! A caller that checks a streamed blob finer-grained itself (the writer, block by block against
//! the signed verity tree) learns which source sent which bytes ([`SourcedWrite`]), refuses the
//! one whose bytes failed ([`Registry::refuse`]) and streams the blob again from the sources
//! left ([`Registry::blob_sources_left`]).
//!
//! Here: the machinery (the failures of one operation, the sources of a blob and their
//! refusals) and manifests; the blob reads are `blobs`'.

mod blobs;

pub use blobs::SourcedWrite;

use tracing::{info, warn};

use crate::client::{Registry, Resolved, SourceName, Src};
use crate::error::RegistryError;
use crate::error_chain::text as chain;
use crate::limits::MAX_MANIFEST_SIZE;
use crate::manifest::FetchedStack;
use crate::oci_layout::ImageManifest;
use crate::reference::RegistryRef;

/// The sources that failed one operation so far.
#[derive(Default)]
struct Failures(Vec<(String, RegistryError)>);

impl Failures {
    /// Records a source's failure in the run's log; warns when another source is left to try.
    /// A mirror that could not be reached (or whose retries ran out) is marked down in `reg`.
    fn add(&mut self, reg: &Registry, what: &str, src: &Src, next: Option<&Src>, e: RegistryError) {
        let down = src.mirror && matches!(e, RegistryError::Transient { .. });
        if down {
            warn!(
                "mirror {}: unreachable or failing; skipped from now on",
                src.location
            );
            reg.mark_down(src);
        }
        reg.log.failed(&SourceName::of(src), what, &chain(&e), down);
        if let Some(next) = next {
            warn!(
                "{what}: {} {} failed, trying {} {} next: {}",
                kind(src),
                src.location,
                kind(next),
                next.location,
                chain(&e)
            );
        }
        self.0.push((format!("{} {}", kind(src), src.location), e));
    }

    /// The error when every source failed: with one source, its own error unchanged.
    fn into_error(mut self, what: &str) -> RegistryError {
        let (last_source, last) = self.0.pop().expect("at least one source was tried");
        if self.0.is_empty() {
            return last;
        }
        let tried = self
            .0
            .iter()
            .map(|(s, e)| format!("{s} ({})", chain(e)))
            .collect::<Vec<_>>()
            .join("; ");
        RegistryError::AllSources {
            what: what.to_owned(),
            tried,
            last_source,
            last: Box::new(last),
        }
    }
}

fn kind(src: &Src) -> &'static str {
    if src.mirror {
        "mirror"
    } else {
        "origin"
    }
}

impl Registry {
    /// Counts `bytes` (and a blob, when `blob`) for `src`.
    fn count(&self, src: &Src, bytes: u64, blob: bool) {
        self.log.count(&SourceName::of(src), bytes, blob);
    }

    /// `src` answered `reference`'s tag with `digest`: said in the log and recorded.
    fn tag_resolved(&self, reference: &RegistryRef, tag: &str, digest: &str, src: &Src) {
        info!(
            "{reference}: tag {tag} resolved to {digest} by {} {}",
            kind(src),
            src.location
        );
        self.log.resolved_by(Resolved {
            tag: tag.to_owned(),
            digest: digest.to_owned(),
            location: src.location.clone(),
            mirror: src.mirror,
        });
    }

    /// The sources of a blob (always fetched by digest), less those refused for it.
    fn blob_sources(
        &self,
        reference: &RegistryRef,
        digest: &str,
    ) -> Result<Vec<Src>, RegistryError> {
        let refused = self.refused.lock().expect("not poisoned").clone();
        let all = self.sources(reference, true)?;
        let kept: Vec<Src> = all
            .into_iter()
            .filter(|s| !refused.contains(&(digest.to_owned(), s.location.clone())))
            .collect();
        if kept.is_empty() {
            return Err(RegistryError::Protocol(format!(
                "blob {digest}: every source sent bytes that failed its digest before"
            )));
        }
        Ok(kept)
    }

    /// Refuses `source` for blob `digest` for the rest of the run: bytes it sent failed a check
    /// the caller made (the writer's, of every block against the signed verity tree), for the
    /// reason `why` (recorded in the run's [`SourceLog`](crate::client::SourceLog)). Returns
    /// whether it was not refused before.
    pub fn refuse(&self, digest: &str, source: &SourceName, why: &str) -> bool {
        let new = self
            .refused
            .lock()
            .expect("not poisoned")
            .insert((digest.to_owned(), source.location.clone()));
        if new {
            self.log.failed(
                source,
                &format!("blob {digest}"),
                &format!("refused for this blob: {why}"),
                false,
            );
        }
        new
    }

    /// The sources a blob would be fetched from now, in order: the mirrors not down and the
    /// origin, less those refused for it (empty when none is left).
    pub fn blob_sources_left(
        &self,
        reference: &RegistryRef,
        digest: &str,
    ) -> Result<Vec<SourceName>, RegistryError> {
        let refused = self.refused.lock().expect("not poisoned").clone();
        Ok(self
            .sources(reference, true)?
            .iter()
            .filter(|s| !refused.contains(&(digest.to_owned(), s.location.clone())))
            .map(SourceName::of)
            .collect())
    }

    /// The digest a reference names: its digest if it has one, else the tag's (the manifest
    /// fetched from the first source that has it, and hashed).
    pub fn resolve(&self, reference: &RegistryRef) -> Result<String, RegistryError> {
        if let Some(d) = &reference.digest {
            return Ok(d.clone());
        }
        self.fetch_manifest(reference).map(|(_, d)| d)
    }

    /// Like [`Registry::resolve`], but a missing tag is `None`.
    pub fn try_resolve(&self, reference: &RegistryRef) -> Result<Option<String>, RegistryError> {
        match self.resolve(reference) {
            Ok(d) => Ok(Some(d)),
            Err(RegistryError::NotFound(_)) => Ok(None),
            Err(e) => Err(e),
        }
    }

    /// [`Registry::try_resolve`] at the origin alone (what a publish compares against).
    pub(crate) fn try_resolve_at_origin(
        &self,
        reference: &RegistryRef,
    ) -> Result<Option<String>, RegistryError> {
        match self.block_on(self.origin.resolve_async(reference)) {
            Ok(d) => Ok(Some(d)),
            Err(RegistryError::NotFound(_)) => Ok(None),
            Err(e) => Err(e),
        }
    }

    /// The manifest a reference names: its exact bytes and their digest (checked), from the
    /// first source that serves it (by tag: the sources `pull-from-mirror` allows for tags).
    pub fn fetch_manifest(
        &self,
        reference: &RegistryRef,
    ) -> Result<(Vec<u8>, String), RegistryError> {
        let sources = self.sources(reference, reference.digest.is_some())?;
        let what = format!("manifest {reference}");
        let mut failures = Failures::default();
        for (i, src) in sources.iter().enumerate() {
            let got = self.block_on(async {
                let ep = self.endpoint(src).await?;
                ep.fetch_manifest_async(&src.reference).await
            });
            match got {
                Ok((bytes, digest)) => {
                    self.count(src, bytes.len() as u64, false);
                    if let (Some(tag), None) = (&reference.tag, &reference.digest) {
                        self.tag_resolved(reference, tag, &digest, src);
                    }
                    return Ok((bytes, digest));
                }
                Err(e) => failures.add(self, &what, src, sources.get(i + 1), e),
            }
        }
        Err(failures.into_error(&what))
    }

    /// A stack's manifest and the stack descriptor it names (its config blob), both fetched
    /// by digest and digest-checked. The descriptor's signature is not checked here: do that
    /// (with `verify::verify_metadata` or the signing key) before believing it.
    pub fn fetch_stack(&self, reference: &RegistryRef) -> Result<FetchedStack, RegistryError> {
        let (manifest_bytes, manifest_digest) = self.fetch_manifest(reference)?;
        let manifest: ImageManifest =
            serde_json::from_slice(&manifest_bytes).map_err(|e| RegistryError::Decode {
                what: format!(
                    "{reference}: manifest {manifest_digest} is not an OCI image manifest"
                ),
                source: e,
            })?;
        if manifest.config.size > MAX_MANIFEST_SIZE {
            return Err(RegistryError::Protocol(format!(
                "{reference}: the stack descriptor (config {}) is {} bytes; it may have at most \
                 {MAX_MANIFEST_SIZE}",
                manifest.config.digest, manifest.config.size
            )));
        }
        let descriptor_bytes = self.fetch_blob(
            &reference.with_digest(&manifest_digest),
            &manifest.config.digest,
            manifest.config.size,
        )?;
        Ok(FetchedStack {
            manifest_digest,
            manifest_bytes,
            manifest,
            descriptor_bytes,
        })
    }
}

#[cfg(test)]
mod tests {
    use std::path::Path;
    use std::sync::Arc;

    use super::*;
    use crate::mirrors::MirrorConfig;
    use crate::options::RegistryOptions;

    const DIGEST: &str = "sha256:0000000000000000000000000000000000000000000000000000000000000001";

    /// `origin.local:5000/stacks/demo` through two mirrors; no request is made.
    fn registry() -> (Registry, RegistryRef) {
        through(&["m1.local:5000", "m2.local:5000"])
    }

    /// `origin.local:5000/stacks/demo` through `mirrors`; no request is made.
    fn through(mirrors: &[&str]) -> (Registry, RegistryRef) {
        let mut text =
            "[[registry]]\nprefix = \"origin.local:5000\"\nlocation = \"origin.local:5000\"\n"
                .to_owned();
        for m in mirrors {
            text.push_str(&format!("[[registry.mirror]]\nlocation = \"{m}\"\n"));
        }
        let conf = MirrorConfig::parse(&text, Path::new("/t/registries.conf")).unwrap();
        let reference: RegistryRef = "oci://origin.local:5000/stacks/demo:1".parse().unwrap();
        let options = RegistryOptions {
            mirrors: Some(Arc::new(conf)),
            ..RegistryOptions::default()
        };
        (Registry::connect(&reference, options).unwrap(), reference)
    }

    /// Connecting makes the origin's connection alone: a mirror's is made when it is first
    /// tried (a registries.conf naming many mirrors cost a client each before the first
    /// request).
    #[test]
    fn mirrors_are_connected_when_first_tried() {
        let many: Vec<String> = (0..16).map(|i| format!("m{i}.local:5000")).collect();
        let (reg, reference) = through(&many.iter().map(String::as_str).collect::<Vec<_>>());
        assert_eq!(reg.connections(), 1);
        assert_eq!(reg.blob_sources_left(&reference, DIGEST).unwrap().len(), 17);
        assert_eq!(reg.connections(), 1, "listing the sources connects none");
    }

    /// A mirror listed twice is tried once, and one whose location is the origin's is the
    /// origin: labelled so, tried once, last.
    #[test]
    fn a_source_listed_twice_or_a_mirror_at_the_origin_is_tried_once_as_what_it_is() {
        let (reg, reference) = through(&[
            "origin.local:5000",
            "m1.local:5000",
            "m1.local:5000",
            "m2.local:5000",
        ]);
        assert_eq!(
            names(&reg.blob_sources_left(&reference, DIGEST).unwrap()),
            [
                "mirror m1.local:5000/stacks/demo",
                "mirror m2.local:5000/stacks/demo",
                "origin origin.local:5000/stacks/demo"
            ]
        );
    }

    /// A listener that accepts connections, counts them and hangs up at once: a mirror whose
    /// TLS handshake fails.
    fn hanging_up() -> (std::net::SocketAddr, Arc<std::sync::atomic::AtomicUsize>) {
        use std::sync::atomic::{AtomicUsize, Ordering};
        let listener = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
        let addr = listener.local_addr().unwrap();
        let count = Arc::new(AtomicUsize::new(0));
        let counted = Arc::clone(&count);
        std::thread::spawn(move || {
            for conn in listener.incoming() {
                counted.fetch_add(1, Ordering::SeqCst);
                drop(conn);
            }
        });
        (addr, count)
    }

    /// A port nothing listens on.
    fn refusing() -> std::net::SocketAddr {
        let listener = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
        listener.local_addr().unwrap()
    }

    /// A mirror that cannot be connected to (its TLS handshake fails; another refuses the
    /// connection) is tried once for the whole run, not retried and not asked again for the
    /// next request; the run's log says so, and why.
    #[test]
    fn a_mirror_that_cannot_be_connected_to_is_tried_once_for_the_whole_run() {
        use std::sync::atomic::Ordering;
        let (tls, handshakes) = hanging_up();
        let (refused, origin) = (refusing(), refusing());
        let text = format!(
            "[[registry]]\nprefix = \"{origin}\"\nlocation = \"{origin}\"\n\
             [[registry.mirror]]\nlocation = \"{tls}\"\ninsecure = true\n\
             [[registry.mirror]]\nlocation = \"{refused}\"\n"
        );
        let conf = MirrorConfig::parse(&text, Path::new("/t/registries.conf")).unwrap();
        let reference: RegistryRef = format!("oci://{origin}/stacks/demo@{DIGEST}")
            .parse()
            .unwrap();
        let options = RegistryOptions {
            mirrors: Some(Arc::new(conf)),
            retry: crate::RetryPolicy {
                attempts: 1,
                ..Default::default()
            },
            ..RegistryOptions::default()
        };
        let reg = Registry::connect(&reference, options).unwrap();
        for _ in 0..2 {
            let e = reg.fetch_manifest(&reference).unwrap_err();
            assert!(e.is_transport(), "{}", e.full_text());
        }
        // Two connections: TLS, then plain HTTP (the mirror is `insecure`, which allows plain
        // HTTP, as containers/image pings both), and never again.
        assert_eq!(
            handshakes.load(Ordering::SeqCst),
            2,
            "the mirror was retried"
        );
        let served = reg.served();
        for mirror in [tls, refused] {
            let s = served
                .iter()
                .find(|s| s.location == format!("{mirror}/stacks/demo"))
                .unwrap_or_else(|| panic!("{served:?}"));
            assert!(s.mirror && s.down && s.failures == 1, "{s:?}");
            assert!(s.errors[0].contains("no connection could be made"), "{s:?}");
        }
        let o = served.iter().find(|s| !s.mirror).unwrap();
        assert_eq!(o.failures, 2, "{o:?}");
    }

    fn names(v: &[SourceName]) -> Vec<String> {
        v.iter().map(ToString::to_string).collect()
    }

    #[test]
    fn a_refused_source_is_left_out_for_that_blob_only() {
        let (reg, reference) = registry();
        let all = reg.blob_sources_left(&reference, DIGEST).unwrap();
        assert_eq!(
            names(&all),
            [
                "mirror m1.local:5000/stacks/demo",
                "mirror m2.local:5000/stacks/demo",
                "origin origin.local:5000/stacks/demo"
            ]
        );
        assert!(reg.refuse(DIGEST, &all[0], "frame 1 fails"));
        assert!(
            !reg.refuse(DIGEST, &all[0], "frame 1 fails"),
            "refused once"
        );
        assert_eq!(
            names(&reg.blob_sources_left(&reference, DIGEST).unwrap()),
            [
                "mirror m2.local:5000/stacks/demo",
                "origin origin.local:5000/stacks/demo"
            ]
        );
        let other = DIGEST.replace("01", "02");
        assert_eq!(reg.blob_sources_left(&reference, &other).unwrap(), all);
        for s in &all[1..] {
            reg.refuse(DIGEST, s, "frame 1 fails");
        }
        assert!(reg
            .blob_sources_left(&reference, DIGEST)
            .unwrap()
            .is_empty());
        // The registry's own fallback agrees: nothing is left to fetch the blob from.
        let e = reg.blob_sources(&reference, DIGEST).err().unwrap();
        assert!(e.to_string().contains(DIGEST), "{e}");
    }
}
