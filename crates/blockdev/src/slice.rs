//! A window of a device: `[offset, offset + len)` of the device below, seen as a whole device.
//!
//! ```text
//!   Slice (size = len)           0 ─────────────── len
//!                                │                  │
//!   inner device   0 ─── offset ─┴──────────────────┴─── inner size
//! ```
//!
//! Used for a LUKS payload area, a partition inside an image, or a dm table line's
//! `start length` pair. Every request is checked against the window first, so a request past
//! the slice's end fails with `OutOfRange` even when the device below could serve it.

use crate::{
    BlockDevice, BlockError, BlockErrorKind, BlockResult, Caps, Extent, Geometry, WriteFlags, ZeroFlags,
};

/// An offset/length window over a device, forwarding every operation with translated offsets.
///
/// Capabilities are those of the device below. The logical block size is the device's; the
/// physical block size too when `offset` is a multiple of it, otherwise the logical one (a
/// physical block of the window would straddle two of the device's).
#[derive(Debug)]
pub struct Slice<D> {
    inner: D,
    offset: u64,
    geometry: Geometry,
}

impl<D: BlockDevice> Slice<D> {
    /// The window `[offset, offset + len)` of `inner`.
    ///
    /// Fails with `Misaligned` when `offset` or `len` is not a multiple of the device's logical
    /// block size, and with `OutOfRange` when the window reaches past the device's end.
    /// A zero-length window is allowed (an empty device).
    pub fn new(inner: D, offset: u64, len: u64) -> BlockResult<Self> {
        let below = inner.geometry();
        let bs = u64::from(below.logical_block);
        if offset % bs != 0 || len % bs != 0 {
            return Err(BlockError::new(
                BlockErrorKind::Misaligned,
                format!(
                    "slice at {offset} length {len} is not aligned to the {bs}-byte blocks of the device below"
                ),
            ));
        }
        if offset.checked_add(len).is_none_or(|end| end > below.size) {
            return Err(BlockError::new(
                BlockErrorKind::OutOfRange,
                format!(
                    "slice at {offset} length {len} reaches past the end of the device below ({} bytes)",
                    below.size
                ),
            ));
        }
        let physical_block = if offset % u64::from(below.physical_block) == 0 {
            below.physical_block
        } else {
            below.logical_block
        };
        let geometry = Geometry { size: len, logical_block: below.logical_block, physical_block };
        Ok(Slice { inner, offset, geometry })
    }

    /// The window from `offset` to the end of `inner`.
    pub fn from_offset(inner: D, offset: u64) -> BlockResult<Self> {
        let size = inner.geometry().size;
        let len = size.checked_sub(offset).ok_or_else(|| {
            BlockError::new(
                BlockErrorKind::OutOfRange,
                format!("slice at {offset} starts past the end of the device below ({size} bytes)"),
            )
        })?;
        Self::new(inner, offset, len)
    }

    /// Where the window starts on the device below.
    pub fn offset(&self) -> u64 {
        self.offset
    }

    /// The device below.
    pub fn inner(&self) -> &D {
        &self.inner
    }

    /// Gives back the device below.
    pub fn into_inner(self) -> D {
        self.inner
    }
}

impl<D: BlockDevice> BlockDevice for Slice<D> {
    fn geometry(&self) -> Geometry {
        self.geometry
    }

    fn caps(&self) -> Caps {
        self.inner.caps()
    }

    fn read_at(&self, off: u64, buf: &mut [u8]) -> BlockResult<()> {
        self.geometry.check_range(off, buf.len() as u64)?;
        self.inner.read_at(self.offset + off, buf)
    }

    fn write_at(&self, off: u64, buf: &[u8], flags: WriteFlags) -> BlockResult<()> {
        self.geometry.check_range(off, buf.len() as u64)?;
        self.inner.write_at(self.offset + off, buf, flags)
    }

    fn flush(&self) -> BlockResult<()> {
        self.inner.flush()
    }

    fn discard(&self, off: u64, len: u64) -> BlockResult<()> {
        self.geometry.check_range(off, len)?;
        self.inner.discard(self.offset + off, len)
    }

    fn write_zeroes(&self, off: u64, len: u64, flags: ZeroFlags) -> BlockResult<()> {
        self.geometry.check_range(off, len)?;
        self.inner.write_zeroes(self.offset + off, len, flags)
    }

    fn allocation(&self, off: u64, len: u64, max_extents: usize) -> BlockResult<Vec<Extent>> {
        self.geometry.check_range(off, len)?;
        self.inner.allocation(self.offset + off, len, max_extents)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::MemDevice;

    fn mem() -> MemDevice {
        MemDevice::new(64 * 1024, 512)
    }

    #[test]
    fn new_fails_when_offset_is_misaligned() {
        let e = Slice::new(mem(), 100, 4096).unwrap_err();
        assert_eq!(e.kind(), BlockErrorKind::Misaligned);
        assert!(e.to_string().contains("slice at 100 length 4096"), "{e}");
    }

    #[test]
    fn new_fails_when_length_is_misaligned() {
        assert_eq!(Slice::new(mem(), 512, 1000).unwrap_err().kind(), BlockErrorKind::Misaligned);
    }

    #[test]
    fn new_fails_when_window_passes_device_end() {
        let e = Slice::new(mem(), 32 * 1024, 33 * 1024).unwrap_err();
        assert_eq!(e.kind(), BlockErrorKind::OutOfRange);
        assert!(e.to_string().contains("65536 bytes"), "{e}");
        assert_eq!(Slice::new(mem(), u64::MAX - 511, 1024).unwrap_err().kind(), BlockErrorKind::OutOfRange);
        assert_eq!(Slice::from_offset(mem(), 65536 + 512).unwrap_err().kind(), BlockErrorKind::OutOfRange);
    }

    #[test]
    fn new_accepts_whole_and_empty_windows() {
        assert_eq!(Slice::new(mem(), 0, 65536).unwrap().geometry().size, 65536);
        assert_eq!(Slice::new(mem(), 65536, 0).unwrap().geometry().size, 0);
        assert_eq!(Slice::from_offset(mem(), 4096).unwrap().geometry().size, 65536 - 4096);
    }

    #[test]
    fn io_lands_at_translated_offsets_when_window_is_inside() {
        let s = Slice::new(mem(), 4096, 8192).unwrap();
        s.write_at(512, &[7u8; 1024], WriteFlags::empty()).unwrap();
        s.write_zeroes(0, 512, ZeroFlags::empty()).unwrap();
        let all = s.inner().to_vec();
        assert!(all[..4096 + 512].iter().all(|&b| b == 0));
        assert!(all[4096 + 512..4096 + 1536].iter().all(|&b| b == 7));
        assert!(all[4096 + 1536..].iter().all(|&b| b == 0));
        let mut back = [0u8; 1024];
        s.read_at(512, &mut back).unwrap();
        assert_eq!(back, [7u8; 1024]);
        s.discard(512, 512).unwrap();
        s.inner().read_at(4096 + 512, &mut back[..512]).unwrap();
        assert_eq!(back[..512], [0u8; 512]);
    }

    #[test]
    fn requests_past_slice_end_fail_when_device_below_could_serve_them() {
        let s = Slice::new(mem(), 4096, 8192).unwrap();
        let mut buf = [0u8; 512];
        assert_eq!(s.read_at(8192, &mut buf).unwrap_err().kind(), BlockErrorKind::OutOfRange);
        assert_eq!(
            s.write_at(8192, &buf, WriteFlags::empty()).unwrap_err().kind(),
            BlockErrorKind::OutOfRange
        );
        assert_eq!(s.discard(7680, 1024).unwrap_err().kind(), BlockErrorKind::OutOfRange);
        assert_eq!(
            s.write_zeroes(0, 8704, ZeroFlags::empty()).unwrap_err().kind(),
            BlockErrorKind::OutOfRange
        );
        assert_eq!(s.read_at(100, &mut buf).unwrap_err().kind(), BlockErrorKind::Misaligned);
        assert!(s.inner().to_vec().iter().all(|&b| b == 0));
    }

    #[test]
    fn caps_and_block_size_come_from_device_below_when_offset_is_aligned() {
        let s = Slice::new(MemDevice::new(1 << 20, 4096), 8192, 4096).unwrap();
        assert_eq!(s.caps(), MemDevice::new(4096, 4096).caps());
        assert_eq!(s.geometry(), Geometry::new(4096, 4096));
    }

    #[test]
    fn physical_block_drops_to_logical_when_offset_straddles_it() {
        #[derive(Debug)]
        struct Phys4k(MemDevice);
        impl BlockDevice for Phys4k {
            fn geometry(&self) -> Geometry {
                Geometry { physical_block: 4096, ..self.0.geometry() }
            }
            fn read_at(&self, off: u64, buf: &mut [u8]) -> BlockResult<()> {
                self.0.read_at(off, buf)
            }
            fn write_at(&self, off: u64, buf: &[u8], flags: WriteFlags) -> BlockResult<()> {
                self.0.write_at(off, buf, flags)
            }
            fn flush(&self) -> BlockResult<()> {
                self.0.flush()
            }
        }
        assert_eq!(Slice::new(Phys4k(mem()), 8192, 4096).unwrap().geometry().physical_block, 4096);
        assert_eq!(Slice::new(Phys4k(mem()), 512, 4096).unwrap().geometry().physical_block, 512);
    }
}
