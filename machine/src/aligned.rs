//! The aligned heap buffer O_DIRECT needs, one for every crate that reads or writes a disk
//! with it (the read-speed gate here, the writer's target): std has no safe constructor for an
//! aligned allocation, so this is the one place that makes one.

#![allow(unsafe_code)]

use std::alloc::{alloc_zeroed, dealloc, Layout};
use std::ops::{Deref, DerefMut};
use std::ptr::NonNull;

/// Alignment of every O_DIRECT buffer, offset and length: a 4 KiB page covers every logical
/// sector size in use (512 and 4096).
pub const ALIGN: usize = 4096;

/// A zeroed heap buffer aligned for O_DIRECT.
pub struct AlignedBuf {
    ptr: NonNull<u8>,
    len: usize,
}

// SAFETY: AlignedBuf owns its allocation exclusively, like a Box<[u8]>.
unsafe impl Send for AlignedBuf {}
// SAFETY: shared access only hands out `&[u8]`.
unsafe impl Sync for AlignedBuf {}

impl AlignedBuf {
    /// `len` rounded up to [`ALIGN`], zero-filled.
    pub fn new(len: usize) -> AlignedBuf {
        let len = len.div_ceil(ALIGN).max(1) * ALIGN;
        let layout = Layout::from_size_align(len, ALIGN).expect("valid layout");
        // SAFETY: layout has non-zero size.
        let ptr = unsafe { alloc_zeroed(layout) };
        let ptr = NonNull::new(ptr).unwrap_or_else(|| std::alloc::handle_alloc_error(layout));
        AlignedBuf { ptr, len }
    }
}

impl Drop for AlignedBuf {
    fn drop(&mut self) {
        // SAFETY: allocated in `new` with this exact layout.
        unsafe {
            dealloc(
                self.ptr.as_ptr(),
                Layout::from_size_align(self.len, ALIGN).expect("valid layout"),
            )
        }
    }
}

impl Deref for AlignedBuf {
    type Target = [u8];
    fn deref(&self) -> &[u8] {
        // SAFETY: ptr is valid for len initialised bytes for the buffer's lifetime.
        unsafe { std::slice::from_raw_parts(self.ptr.as_ptr(), self.len) }
    }
}

impl DerefMut for AlignedBuf {
    fn deref_mut(&mut self) -> &mut [u8] {
        // SAFETY: as above, and &mut self guarantees exclusive access.
        unsafe { std::slice::from_raw_parts_mut(self.ptr.as_ptr(), self.len) }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn rounded_up_aligned_and_zeroed() {
        let mut b = AlignedBuf::new(1);
        assert_eq!(b.len(), ALIGN);
        assert_eq!(b.as_ptr() as usize % ALIGN, 0);
        assert!(b.iter().all(|&x| x == 0));
        b[ALIGN - 1] = 7;
        assert_eq!(AlignedBuf::new(ALIGN + 1).len(), 2 * ALIGN);
    }
}
