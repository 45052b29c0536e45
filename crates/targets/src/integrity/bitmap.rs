//! Mode B: the dirty-region bitmap in the journal area (kernel `block_bitmap_op`,
//! `bitmap_block_work`, `bitmap_flush_work`); bit layout in `formats::integrity::bitmap`.
//!
//! Protocol, per write: the bits covering the range are set and their 4 KiB bitmap blocks
//! written and flushed *before* the data and tags are written. Bits are cleared only after
//! data and tags were flushed, with no write in flight (the engine holds the whole device's
//! range lock), by the bitmap flush timer or a clean close. After an unclean stop the set
//! bits name every region whose tags may not match its data; they are recalculated at open.
use blockdev::{BlockDevice, BlockResult, WriteFlags};
use formats::integrity::layout::BITMAP_BLOCK_SIZE;
use formats::integrity::BitmapGeometry;

/// In-memory bitmap (what is on disk once each change is written).
#[derive(Debug)]
pub(crate) struct BitmapState {
    pub(crate) geom: BitmapGeometry,
    pub(crate) bits: Vec<u8>,
    /// Byte offset of the bitmap (journal area) on the device.
    pub(crate) base: u64,
}

impl BitmapState {
    pub(crate) fn new(geom: BitmapGeometry, base: u64) -> Self {
        BitmapState { bits: vec![0; geom.bytes()], geom, base }
    }

    /// Sets the bits of `[sector, sector+n)`; if any changed, writes their blocks and flushes.
    pub(crate) fn mark<D: BlockDevice>(&mut self, next: &D, sector: u64, n: u64) -> BlockResult<bool> {
        if n == 0 || self.geom.all_set(&self.bits, sector, n) {
            return Ok(false);
        }
        self.geom.set_range(&mut self.bits, sector, n, true);
        let first = self.geom.block_of_sector(sector);
        let last = self.geom.block_of_sector(sector + n - 1);
        self.write_blocks(next, first, last)?;
        next.flush()?;
        Ok(true)
    }

    /// Whether any bit is set.
    pub(crate) fn any_set(&self) -> bool {
        self.bits.iter().any(|&b| b != 0)
    }

    /// Clears every bit and writes the bitmap (the caller flushed data and tags first).
    pub(crate) fn clear_all<D: BlockDevice>(&mut self, next: &D) -> BlockResult<()> {
        if !self.any_set() {
            return Ok(());
        }
        self.bits.fill(0);
        self.write_all(next)?;
        next.flush()
    }

    /// Writes every bitmap block.
    pub(crate) fn write_all<D: BlockDevice>(&self, next: &D) -> BlockResult<()> {
        if self.geom.n_bitmap_blocks == 0 {
            return Ok(());
        }
        self.write_blocks(next, 0, self.geom.n_bitmap_blocks as u64 - 1)
    }

    fn write_blocks<D: BlockDevice>(&self, next: &D, first: u64, last: u64) -> BlockResult<()> {
        let bs = BITMAP_BLOCK_SIZE as usize;
        let lo = first as usize * bs;
        let hi = ((last as usize + 1) * bs).min(self.bits.len());
        if hi > lo {
            next.write_at(self.base + lo as u64, &self.bits[lo..hi], WriteFlags::empty())?;
        }
        Ok(())
    }
}
