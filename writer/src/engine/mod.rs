//! The verified-write engine: a layer's image onto a disk so that no byte that fails its hash
//! can boot, and bytes without a tree of their own written and compared.
//!
//! A layer's zstd frames arrive in order ([`frames`]: from a mapped blob, a disk written before,
//! or straight from a registry download by the `stream` module); in [`layer`] batches of them are
//! decompressed in parallel, written with large aligned O_DIRECT writes, then read back with
//! O_DIRECT, bypassing the page cache, and checked against the layer's signed hash tree, the
//! three phases overlapping. Each block is hashed once, after the read-back: the partition table
//! is written last, so a block that reaches the disk unchecked cannot boot. Only when a read-back
//! fails is the in-memory copy hashed too, to tell a bad source (the run fails, naming the frame
//! and the blob) from a bad write (the frame is written again, a bounded number of times, and
//! counted). All-zero blocks are skipped when the partition was first made to read zeros (a hole
//! punched in an image file, BLKZEROOUT on a device that offloads it), and still read back and
//! checked. [`bytes`] writes what has no tree (a verity hash device, the ESP, an md superblock)
//! and compares it after reading it back, with the same bounded rewrites.
//!
//! The engine knows disks ([`crate::target`]) and progress ([`crate::report`]), nothing of steps.

use std::time::Instant;

use ingot_verity::Verifier;

use crate::target::TargetError;

pub mod bytes;
pub mod frames;
pub mod layer;

#[derive(Debug, thiserror::Error)]
pub enum EngineError {
    #[error(transparent)]
    Target(#[from] TargetError),
    #[error("layer `{layer}`: the data blob {blob} is not the signed image: {reason}")]
    Blob {
        layer: String,
        blob: String,
        reason: String,
    },
    #[error(
        "layer `{layer}`: data block {block} (zstd frame {frame} of the data blob {blob}) does not \
         match the signed hash tree: the blob is corrupt"
    )]
    BadSource {
        layer: String,
        blob: String,
        frame: u64,
        block: u64,
    },
    #[error("layer `{layer}`: downloading the data blob {blob}: {reason}")]
    Download {
        layer: String,
        blob: String,
        reason: String,
    },
    #[error(
        "layer `{layer}`: {length} bytes at target offset {offset} still read back wrong after {attempts} \
         attempts ({reason})"
    )]
    ReadBack {
        layer: String,
        offset: u64,
        length: u64,
        attempts: u32,
        reason: String,
    },
    #[error("layer `{layer}` needs {need} bytes, its partition has {have}")]
    TooLarge { layer: String, need: u64, have: u64 },
    #[error(transparent)]
    Stopped(#[from] Stopped),
}

/// Why a run stopped before its end on its own: the deadline passed, or SIGTERM/SIGINT came.
#[derive(Debug, Clone, thiserror::Error)]
pub enum Stopped {
    #[error("the deadline passed while {during}")]
    Deadline { during: String },
    #[error("interrupted by a signal while {during}")]
    Interrupted { during: String },
}

#[derive(Debug, Clone, Copy)]
pub struct WriteOptions {
    /// Writes of one range before giving up (the first write included).
    pub max_attempts: u32,
    /// The run fails (and the disk is left without a partition table) once this passes.
    pub deadline: Option<Instant>,
}

impl Default for WriteOptions {
    fn default() -> Self {
        WriteOptions {
            max_attempts: 3,
            deadline: None,
        }
    }
}

impl WriteOptions {
    /// Fails once the deadline has passed or SIGTERM/SIGINT arrived; `during` says what was
    /// going on.
    pub fn check_stop(&self, during: &str) -> Result<(), Stopped> {
        if crate::interrupt::requested() {
            return Err(Stopped::Interrupted {
                during: during.to_string(),
            });
        }
        match self.deadline {
            Some(d) if Instant::now() >= d => Err(Stopped::Deadline {
                during: during.to_string(),
            }),
            _ => Ok(()),
        }
    }
}

#[derive(Debug, Clone, Copy, Default)]
pub struct WriteStats {
    /// Bytes sent to the disk.
    pub written: u64,
    /// All-zero bytes not sent because the partition already reads zeros.
    pub skipped: u64,
    pub rewrites: u32,
}

impl std::ops::AddAssign for WriteStats {
    fn add_assign(&mut self, s: WriteStats) {
        self.written += s.written;
        self.skipped += s.skipped;
        self.rewrites += s.rewrites;
    }
}

/// One layer's data to put on the disk.
pub struct LayerData<'a> {
    pub name: &'a str,
    /// The data blob's digest, for messages.
    pub blob: &'a str,
    /// The tree, already checked against the signed root hash.
    pub verifier: &'a Verifier,
    /// Uncompressed bytes per zstd frame of the blob.
    pub frame_size: u64,
    pub image_size: u64,
    /// Partition on the target.
    pub offset: u64,
    pub partition_size: u64,
}

impl LayerData<'_> {
    pub(crate) fn blob_err(&self, reason: String) -> EngineError {
        EngineError::Blob {
            layer: self.name.to_string(),
            blob: self.blob.to_string(),
            reason,
        }
    }
}
