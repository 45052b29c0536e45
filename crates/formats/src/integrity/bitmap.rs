//! Bitmap mode (`B`): the dirty-region bitmap kept in the journal area (kernel
//! `block_bitmap_op`, `sector_to_bitmap_block`, `bitmap_block_work`, `bitmap_flush_work`, and
//! the bitmap branches of `dm_integrity_ctr`, `dm_integrity_resume`, `dm_integrity_postsuspend`).
//!
//! ```text
//!  journal area (sector start + 8 of the metadata device) in mode B:
//!   off (bytes)        size    content
//!   4096·i             4096    bitmap block i, i < n_bitmap_blocks (journal sectors 8i..8i+8)
//!   4096·n_blocks      ...     unused
//!
//!  bit b covers logical sectors [b << s, (b+1) << s), s = log2_sectors_per_block
//!                                                      + log2_blocks_per_bitmap_bit
//!  bit b is byte b / 8, mask 1 << (b % 8)   (the kernel's unsigned long bitops on a
//!                                            little-endian machine)
//! ```
//!
//! Semantics (Linux 6.1):
//! * `log2_blocks_per_bitmap_bit` is computed at every open ([`super::Layout`]); the
//!   superblock keeps the value the on-disk bitmap was written with.
//! * Open in mode B of a clean volume (no DIRTY_BITMAP): replay the journal area as a
//!   journal first (it is all-unused after a clean B close), then set DIRTY_BITMAP, store the
//!   current `log2_blocks_per_bitmap_bit`, write the superblock, and write an all-clear
//!   bitmap (or all-set from `recalc_sector` on while RECALCULATING).
//! * A write sets the bits of its range (bitmap block written FUA) before the data and tag
//!   writes; `bitmap_flush_work` (every `bitmap_flush_interval`, default 10 s) flushes and
//!   clears bits of regions with no write in flight.
//! * Open with DIRTY_BITMAP set (an unclean stop), mode B: if the superblock's
//!   `log2_blocks_per_bitmap_bit` equals the current one, load the bitmap and, if any bit
//!   is set, set RECALCULATING with `recalc_sector` 0: the dirty regions' tags are
//!   recalculated from the data; otherwise mark everything dirty and recalculate all.
//!   In modes J/D/R the same test decides RECALCULATING, the area is re-initialised as a
//!   journal and DIRTY_BITMAP is cleared.
//! * Clean close in mode B: flush, re-initialise the area as an empty journal (commit seq 0),
//!   clear DIRTY_BITMAP, write the superblock.

use std::ops::Range;

use super::layout::{Layout, BITMAP_BLOCK_SIZE};

/// Bitmap geometry of an opened volume.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct BitmapGeometry {
    /// log2(sectors per block).
    pub log2_sectors_per_block: u8,
    /// log2(blocks per bit).
    pub log2_blocks_per_bitmap_bit: u8,
    /// Sectors the bitmap covers.
    pub provided_data_sectors: u64,
    /// 4 KiB bitmap blocks at the head of the journal area.
    pub n_bitmap_blocks: u32,
}

impl BitmapGeometry {
    /// From a layout (uses the layout's freshly computed `log2_blocks_per_bitmap_bit`).
    pub fn from_layout(l: &Layout) -> Self {
        BitmapGeometry {
            log2_sectors_per_block: l.log2_sectors_per_block,
            log2_blocks_per_bitmap_bit: l.log2_blocks_per_bitmap_bit,
            provided_data_sectors: l.provided_data_sectors,
            n_bitmap_blocks: l.n_bitmap_blocks,
        }
    }
    /// log2 of the sectors one bit covers.
    pub fn log2_sectors_per_bit(&self) -> u32 {
        self.log2_sectors_per_block as u32 + self.log2_blocks_per_bitmap_bit as u32
    }
    /// Sectors one bit covers (`sectors_per_bit` in `dmsetup table`).
    pub fn sectors_per_bit(&self) -> u64 {
        1u64 << self.log2_sectors_per_bit()
    }
    /// Bits in use.
    pub fn n_bits(&self) -> u64 {
        let lb = self.log2_blocks_per_bitmap_bit as u32;
        ((self.provided_data_sectors >> self.log2_sectors_per_block) + ((1u64 << lb) - 1)) >> lb
    }
    /// Bytes of the bitmap area (`n_bitmap_blocks × 4096`).
    pub fn bytes(&self) -> usize {
        self.n_bitmap_blocks as usize * BITMAP_BLOCK_SIZE as usize
    }
    /// The bit covering `sector`.
    pub fn bit_of_sector(&self, sector: u64) -> u64 {
        sector >> self.log2_sectors_per_bit()
    }
    /// The bitmap block holding the bit of `sector` (`sector_to_bitmap_block`).
    pub fn block_of_sector(&self, sector: u64) -> u64 {
        self.bit_of_sector(sector) / (BITMAP_BLOCK_SIZE * 8)
    }
    /// Sectors covered by bit `bit`, clipped to the provided sectors.
    pub fn sectors_of_bit(&self, bit: u64) -> Range<u64> {
        let s = self.log2_sectors_per_bit();
        let start = (bit << s).min(self.provided_data_sectors);
        let end = ((bit + 1) << s).min(self.provided_data_sectors);
        start..end
    }
    /// `test_bit` on the bitmap bytes (false beyond them).
    pub fn test(&self, bitmap: &[u8], bit: u64) -> bool {
        bitmap.get((bit / 8) as usize).is_some_and(|b| b & (1 << (bit % 8)) != 0)
    }
    /// `BITMAP_OP_SET` / `BITMAP_OP_CLEAR` over the bits covering `[sector, sector+n)`.
    /// Bits beyond `bitmap` are ignored.
    pub fn set_range(&self, bitmap: &mut [u8], sector: u64, n_sectors: u64, on: bool) {
        if n_sectors == 0 {
            return;
        }
        let first = self.bit_of_sector(sector);
        let last = self.bit_of_sector(sector + n_sectors - 1);
        for bit in first..=last {
            if let Some(b) = bitmap.get_mut((bit / 8) as usize) {
                if on {
                    *b |= 1 << (bit % 8);
                } else {
                    *b &= !(1 << (bit % 8));
                }
            }
        }
    }
    /// `BITMAP_OP_TEST_ALL_CLEAR` over `[sector, sector+n)`.
    pub fn all_clear(&self, bitmap: &[u8], sector: u64, n_sectors: u64) -> bool {
        if n_sectors == 0 {
            return true;
        }
        let first = self.bit_of_sector(sector);
        let last = self.bit_of_sector(sector + n_sectors - 1);
        (first..=last).all(|b| !self.test(bitmap, b))
    }
    /// `BITMAP_OP_TEST_ALL_SET` over `[sector, sector+n)`.
    pub fn all_set(&self, bitmap: &[u8], sector: u64, n_sectors: u64) -> bool {
        if n_sectors == 0 {
            return true;
        }
        let first = self.bit_of_sector(sector);
        let last = self.bit_of_sector(sector + n_sectors - 1);
        (first..=last).all(|b| self.test(bitmap, b))
    }
    /// The dirty sector ranges (merged runs of set bits), clipped to the provided sectors:
    /// what recalculation must cover after an unclean stop.
    pub fn dirty_ranges(&self, bitmap: &[u8]) -> Vec<Range<u64>> {
        let mut out: Vec<Range<u64>> = Vec::new();
        for bit in 0..self.n_bits() {
            if self.test(bitmap, bit) {
                let r = self.sectors_of_bit(bit);
                match out.last_mut() {
                    Some(last) if last.end == r.start => last.end = r.end,
                    _ => out.push(r),
                }
            }
        }
        out
    }
}
