//! The staged tree as a deterministic POSIX (ustar) tar.
//!
//! Headers are filled field by field through the `tar` crate's `Builder`: ustar format, numeric
//! ids only (empty user/group names), one fixed mtime, no device numbers, entries in the staged
//! order (sorted, parents first). Member names are relative (`etc/hostname`), as ingot's layer
//! builder requires. Paths longer than ustar's name+prefix fields fall back to the `tar` crate's
//! GNU long-name entry.

use std::io::{self, Write};

use crate::stage::{EntryKind, Staged};

impl Staged {
    /// Writes the tree as a tar with every mtime 0.
    pub fn write_tar(&self, w: impl Write) -> io::Result<()> {
        self.write_tar_at(w, 0)
    }

    /// Writes the tree as a tar with every mtime `mtime` (seconds since the epoch), e.g.
    /// `SOURCE_DATE_EPOCH`.
    pub fn write_tar_at(&self, w: impl Write, mtime: u64) -> io::Result<()> {
        let mut b = tar::Builder::new(w);
        for e in &self.entries {
            let rel = e.path.strip_prefix("/").unwrap_or(&e.path);
            let mut h = tar::Header::new_ustar();
            h.set_mode(e.mode);
            h.set_uid(e.uid.into());
            h.set_gid(e.gid.into());
            h.set_mtime(mtime);
            match &e.kind {
                EntryKind::Dir => {
                    h.set_entry_type(tar::EntryType::Directory);
                    h.set_size(0);
                    b.append_data(&mut h, rel, io::empty())?;
                }
                EntryKind::File(c) => {
                    h.set_entry_type(tar::EntryType::Regular);
                    h.set_size(c.len() as u64);
                    b.append_data(&mut h, rel, c.as_slice())?;
                }
                EntryKind::Symlink(t) => {
                    h.set_entry_type(tar::EntryType::Symlink);
                    h.set_size(0);
                    b.append_link(&mut h, rel, t)?;
                }
            }
        }
        b.into_inner()?.flush()
    }
}
