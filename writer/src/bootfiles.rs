//! Reading the kernel, initrd and bootloader out of the base layer as written on the target,
//! through the `ext4-view` reader, with every 4 KiB block it touches checked against the base
//! layer's signed hash tree first. The ESP gets nothing that did not pass dm-verity.

use std::fs::File;
use std::os::unix::fs::FileExt;
use std::sync::Arc;

use ext4_view::{Ext4, Ext4Read};
use ingot_verity::Verifier;

/// An `Ext4Read` over one data partition that verifies each block it reads.
struct VerifiedPartition {
    file: File,
    offset: u64,
    verifier: Arc<Verifier>,
    block: Vec<u8>,
    cached: Option<u64>,
}

impl Ext4Read for VerifiedPartition {
    fn read(
        &mut self,
        start: u64,
        dst: &mut [u8],
    ) -> Result<(), Box<dyn std::error::Error + Send + Sync + 'static>> {
        let bs = self.verifier.params().data_block_size as u64;
        let blocks = self.verifier.params().data_blocks;
        let mut done = 0usize;
        while done < dst.len() {
            let pos = start + done as u64;
            let index = pos / bs;
            if index >= blocks {
                return Err(format!("read past the end of the layer image (byte {pos})").into());
            }
            if self.cached != Some(index) {
                self.cached = None;
                self.file
                    .read_exact_at(&mut self.block, self.offset + index * bs)?;
                self.verifier.verify_block(index, &self.block)?;
                self.cached = Some(index);
            }
            let within = (pos % bs) as usize;
            let n = (bs as usize - within).min(dst.len() - done);
            dst[done..done + n].copy_from_slice(&self.block[within..within + n]);
            done += n;
        }
        Ok(())
    }
}

pub struct BootFiles {
    pub kernel: Vec<u8>,
    pub initrd: Vec<u8>,
    pub bootloader: Vec<u8>,
}

#[derive(Debug, thiserror::Error)]
pub enum BootFilesError {
    #[error("reading the base layer's file system on the target: {0}")]
    Load(String),
    #[error("the stack's boot section names {path}, which the base layer cannot give: {reason}")]
    Missing { path: String, reason: String },
}

/// Reads the three boot files from the base layer's partition at `offset` of `file`.
pub fn read(
    file: File,
    offset: u64,
    verifier: Arc<Verifier>,
    kernel: &str,
    initrd: &str,
    bootloader: &str,
) -> Result<BootFiles, BootFilesError> {
    let bs = verifier.params().data_block_size as usize;
    let reader = VerifiedPartition {
        file,
        offset,
        verifier,
        block: vec![0; bs],
        cached: None,
    };
    let fs = Ext4::load(Box::new(reader)).map_err(|e| BootFilesError::Load(e.to_string()))?;
    let get = |path: &str| {
        fs.read(path).map_err(|e| BootFilesError::Missing {
            path: path.to_string(),
            reason: e.to_string(),
        })
    };
    Ok(BootFiles {
        kernel: get(kernel)?,
        initrd: get(initrd)?,
        bootloader: get(bootloader)?,
    })
}
