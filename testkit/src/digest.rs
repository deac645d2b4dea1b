//! SHA-256 of a whole file, streamed: how the tests show that a run left a disk as it was.

use std::fs::File;
use std::io;
use std::path::Path;

use sha2::{Digest, Sha256};

/// Lower-case hex SHA-256 of the file at `path`.
pub fn sha256_file(path: &Path) -> io::Result<String> {
    let mut h = Sha256::new();
    io::copy(&mut File::open(path)?, &mut h)?;
    Ok(hex::encode(h.finalize()))
}
