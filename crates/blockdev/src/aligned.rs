//! Heap buffers whose start address is aligned, for `O_DIRECT` I/O, without `unsafe`.
//!
//! `O_DIRECT` requires the user buffer's address to be aligned (as well as the file offset
//! and length). Rust's allocator API would need `unsafe` for an over-aligned allocation, so
//! instead the buffer over-allocates a plain `Box<[u8]>` by `align - 1` bytes and exposes the
//! window that starts at the first aligned address inside it:
//!
//! ```text
//!   storage: [ pad (0..align-1 bytes) | window: len bytes, starts aligned | rest of pad ]
//!              ^ heap pointer           ^ heap pointer + start, a multiple of `align`
//! ```
//!
//! The box is never reallocated, and moving an `AlignedBuf` moves only the box's pointer, so the
//! window stays aligned for the buffer's whole life.

use std::fmt;

/// The alignment used for `O_DIRECT` bounce buffers: a page, which satisfies every Linux
/// filesystem and block device (their `dio_mem_align` is at most the logical block size).
pub const DIRECT_IO_ALIGN: usize = 4096;

/// A zero-initialised heap buffer whose first byte sits at a multiple of `align`.
pub struct AlignedBuf {
    storage: Box<[u8]>,
    start: usize,
    len: usize,
    align: usize,
}

impl AlignedBuf {
    /// A zero-filled buffer of `len` bytes starting at a multiple of `align`.
    ///
    /// # Panics
    /// If `align` is not a power of two (a programming error, never input-derived).
    pub fn new(len: usize, align: usize) -> Self {
        assert!(align.is_power_of_two(), "alignment {align} is not a power of two");
        if len == 0 {
            return AlignedBuf { storage: Box::default(), start: 0, len: 0, align };
        }
        let storage = vec![0u8; len + align - 1].into_boxed_slice();
        let addr = storage.as_ptr() as usize;
        let start = (align - addr % align) % align;
        AlignedBuf { storage, start, len, align }
    }

    /// A zero-filled buffer aligned to [`DIRECT_IO_ALIGN`].
    pub fn for_direct_io(len: usize) -> Self {
        Self::new(len, DIRECT_IO_ALIGN)
    }

    /// Length in bytes.
    pub fn len(&self) -> usize {
        self.len
    }

    /// Whether the buffer is empty.
    pub fn is_empty(&self) -> bool {
        self.len == 0
    }

    /// The alignment of the first byte.
    pub fn align(&self) -> usize {
        self.align
    }

    /// The aligned bytes.
    pub fn as_slice(&self) -> &[u8] {
        &self.storage[self.start..self.start + self.len]
    }

    /// The aligned bytes, mutably.
    pub fn as_mut_slice(&mut self) -> &mut [u8] {
        &mut self.storage[self.start..self.start + self.len]
    }
}

impl fmt::Debug for AlignedBuf {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        // Never the contents: they may be plaintext sectors.
        f.debug_struct("AlignedBuf").field("len", &self.len).field("align", &self.align).finish()
    }
}

/// Whether `buf` starts at a multiple of `align` (a power of two).
pub fn is_aligned(buf: &[u8], align: usize) -> bool {
    buf.as_ptr() as usize % align == 0
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn window_is_aligned_for_every_power_of_two() {
        for shift in 0..=13 {
            let align = 1usize << shift;
            for len in [1usize, 7, 512, 4096, 65536] {
                let mut b = AlignedBuf::new(len, align);
                assert_eq!(b.len(), len);
                assert!(is_aligned(b.as_slice(), align), "len {len} align {align}");
                assert!(b.as_slice().iter().all(|&x| x == 0));
                b.as_mut_slice().fill(0xa5);
                assert!(b.as_slice().iter().all(|&x| x == 0xa5));
            }
        }
    }

    #[test]
    fn window_stays_aligned_when_moved() {
        let bufs: Vec<AlignedBuf> = (0..32).map(|i| AlignedBuf::for_direct_io(512 * (i + 1))).collect();
        let moved: Vec<AlignedBuf> = bufs.into_iter().rev().collect();
        for b in &moved {
            assert!(is_aligned(b.as_slice(), DIRECT_IO_ALIGN));
        }
    }

    #[test]
    fn buffer_is_empty_when_created_with_zero_length() {
        let mut b = AlignedBuf::for_direct_io(0);
        assert!(b.is_empty());
        assert!(b.as_mut_slice().is_empty());
    }

    #[test]
    #[should_panic(expected = "not a power of two")]
    fn new_panics_when_alignment_is_not_a_power_of_two() {
        let _ = AlignedBuf::new(16, 3);
    }

    #[test]
    fn debug_omits_contents_when_buffer_holds_data() {
        let mut b = AlignedBuf::new(4, 8);
        b.as_mut_slice().copy_from_slice(b"key!");
        let s = format!("{b:?}");
        assert!(!s.contains("107"), "{s}");
        assert!(s.contains("len: 4"), "{s}");
    }
}
