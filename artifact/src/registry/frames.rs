//! A layer's data blob from a registry one zstd frame at a time, as a
//! [`FrameSource`](crate::layerfs::FrameSource) for [`LayerFs`](crate::layerfs::LayerFs): each
//! frame a `Range` request at the offsets of the descriptor's frame index, from the first of
//! the blob's sources (the mirrors, then the origin) not refused for it
//! ([`Registry::fetch_range`]). A source whose bytes fail the layer's check is refused for the
//! whole blob ([`Registry::refuse`]: the same refusal the writer's stream of the blob honours),
//! with a warning naming it and the frame, and the frame comes from the next source left.

use std::collections::HashMap;
use std::sync::{Arc, Mutex};

use tracing::warn;

use super::client::{Registry, SourceName};
use super::reference::RegistryRef;
use crate::error_chain::text as chain;
use crate::layerfs::{BlockError, FetchError, FrameSource, Refused};

/// One data blob's frames, fetched from a registry's sources (see the module docs).
pub struct BlobFrames {
    registry: Arc<Registry>,
    reference: RegistryRef,
    digest: String,
    size: u64,
    /// Where each frame starts in the blob, then the blob's end.
    starts: Vec<u64>,
    /// The source of the latest fetch of each frame.
    served: HashMap<usize, SourceName>,
    /// Where refusal warnings go instead of the log ([`BlobFrames::warnings_to`]).
    warnings: Option<Warnings>,
}

/// Warnings collected for a caller to report its own way (a writer's status file and events).
pub type Warnings = Arc<Mutex<Vec<String>>>;

impl BlobFrames {
    /// Blob `digest` (`size` bytes) of `reference`, cut into frames at `starts` (the
    /// descriptor's frame index: [`Compression::frame_starts`], whose end is `size`: `verify`
    /// checked).
    ///
    /// [`Compression::frame_starts`]: ingot_layers::descriptor::Compression::frame_starts
    pub fn new(
        registry: Arc<Registry>,
        reference: RegistryRef,
        digest: &str,
        size: u64,
        starts: Vec<u64>,
    ) -> Self {
        BlobFrames {
            registry,
            reference,
            digest: digest.to_owned(),
            size,
            starts,
            served: HashMap::new(),
            warnings: None,
        }
    }

    /// Refusal warnings go to `warnings` rather than to the log.
    pub fn warnings_to(mut self, warnings: Warnings) -> Self {
        self.warnings = Some(warnings);
        self
    }
}

impl FrameSource for BlobFrames {
    fn count(&self) -> usize {
        self.starts.len() - 1
    }

    fn fetch(&mut self, n: usize) -> Result<Vec<u8>, FetchError> {
        let range = self.starts[n]..self.starts[n + 1];
        tracing::debug!(
            "fetching zstd frame {n} (bytes {range:?}) of blob {}",
            self.digest
        );
        let (bytes, source) =
            self.registry
                .fetch_range(&self.reference, &self.digest, self.size, range)?;
        self.served.insert(n, source);
        Ok(bytes)
    }

    fn refuse(&mut self, n: usize, why: &BlockError) -> Result<Option<Refused>, FetchError> {
        let source = self
            .served
            .remove(&n)
            .expect("a frame is refused only after it was fetched");
        self.registry.refuse(
            &self.digest,
            &source,
            &format!("zstd frame {n} fails the layer's check ({})", chain(why)),
        );
        let next = self
            .registry
            .blob_sources_left(&self.reference, &self.digest)?
            .first()
            .map(ToString::to_string);
        let then = match &next {
            Some(s) => format!("fetching the frame again from {s}"),
            None => "no source is left".to_owned(),
        };
        let warning = format!(
            "blob {}: {source} sent zstd frame {n} (bytes {:?}) that fails the layer's check \
             ({}); refused for this blob, {then}",
            self.digest,
            self.starts[n]..self.starts[n + 1],
            chain(why)
        );
        match &self.warnings {
            Some(w) => w.lock().expect("not poisoned").push(warning),
            None => warn!("{warning}"),
        }
        Ok(Some(Refused {
            source: source.to_string(),
            next,
        }))
    }
}
