//! An ext4 image file read by position, for `ext4-view` (its own file reader needs its `std`
//! feature, which this workspace leaves off). For images already checked or made here: it
//! verifies nothing itself (`layerfs` is the reader that checks every block).

use std::fs::File;
use std::os::unix::fs::FileExt;

pub struct ImageFile(pub File);

impl ext4_view::Ext4Read for ImageFile {
    fn read(
        &mut self,
        start: u64,
        dst: &mut [u8],
    ) -> Result<(), Box<dyn std::error::Error + Send + Sync + 'static>> {
        Ok(self.0.read_exact_at(dst, start)?)
    }
}
