//! Mode B: the dirty-region bitmap in the journal area (kernel `block_bitmap_op`,
//! `bitmap_block_work`, `bitmap_flush_work`); bit layout in `formats::integrity::bitmap`.
//!
//! Protocol, per write: the bits covering the range are set and their 4 KiB bitmap blocks
//! written and flushed *before* the data and tags are written. Bits are cleared only after
//! data and tags were flushed, with no write in flight (the engine holds the whole device's
//! range lock), by the bitmap flush timer or a clean close. After an unclean stop the set
//! bits name every region whose tags may not match its data; they are recalculated in the
//! background after open (the kernel's `recalc_bitmap`): such a region's bit stays `pending`
//! and set on disk until its tags were recalculated and flushed, and a read of it
//! recalculates it first (background.rs), so every read is verified.
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
    /// Regions left dirty by an unclean stop whose tags are not recalculated yet: their bits
    /// stay set in `bits` (and on disk).
    pending: Vec<u8>,
    pending_bits: u64,
}

impl BitmapState {
    pub(crate) fn new(geom: BitmapGeometry, base: u64) -> Self {
        BitmapState {
            bits: vec![0; geom.bytes()],
            pending: vec![0; geom.bytes()],
            pending_bits: 0,
            geom,
            base,
        }
    }

    /// After an unclean stop: every bit set in `dirty` (the bitmap read from disk; bits past
    /// the volume ignored) is set and pending recalculation.
    pub(crate) fn with_dirty(geom: BitmapGeometry, base: u64, dirty: &[u8]) -> Self {
        let mut b = Self::new(geom, base);
        for bit in (0..geom.n_bits()).filter(|&bit| geom.test(dirty, bit)) {
            b.pending[(bit / 8) as usize] |= 1 << (bit % 8);
            b.pending_bits += 1;
        }
        b.bits.copy_from_slice(&b.pending);
        b
    }

    /// Regions still waiting for recalculation.
    pub(crate) fn pending_count(&self) -> u64 {
        self.pending_bits
    }

    /// Whether bit `bit`'s region waits for recalculation.
    pub(crate) fn is_pending(&self, bit: u64) -> bool {
        self.geom.test(&self.pending, bit)
    }

    /// The pending bits covering `[sector, sector+n)`.
    pub(crate) fn pending_in(&self, sector: u64, n: u64) -> Vec<u64> {
        if n == 0 || self.pending_bits == 0 {
            return Vec::new();
        }
        let first = self.geom.bit_of_sector(sector);
        let last = self.geom.bit_of_sector(sector + n - 1);
        (first..=last).filter(|&b| self.is_pending(b)).collect()
    }

    /// The first pending bit at or after `from`.
    pub(crate) fn next_pending(&self, from: u64) -> Option<u64> {
        if self.pending_bits == 0 {
            return None;
        }
        (from..self.geom.n_bits()).find(|&b| self.is_pending(b))
    }

    /// Bit `bit`'s region was recalculated (its bit stays set until the next clear, after
    /// the tags are flushed); true if it was pending.
    pub(crate) fn recalculated(&mut self, bit: u64) -> bool {
        if !self.is_pending(bit) {
            return false;
        }
        self.pending[(bit / 8) as usize] &= !(1 << (bit % 8));
        self.pending_bits -= 1;
        true
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

    /// Whether a clear would clear any bit (one set and not pending recalculation).
    pub(crate) fn clearable(&self) -> bool {
        self.bits != self.pending
    }

    /// Clears every bit but the pending ones and writes the bitmap (the caller flushed data
    /// and tags first).
    pub(crate) fn clear_all<D: BlockDevice>(&mut self, next: &D) -> BlockResult<()> {
        if !self.clearable() {
            return Ok(());
        }
        self.bits.copy_from_slice(&self.pending);
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
