//! Background work: the timer thread (journal commit after `commit_time`, bitmap clearing
//! after `bitmap_flush_interval`), the journal writer thread (copy-out at the watermark, the
//! engine in journal.rs) and the recalculation thread (`recalculate`: tags
//! recomputed from `recalc_sector` on, its position saved in the superblock every 64
//! chunks and at the end), and the bitmap recalculation thread (mode B after an unclean stop:
//! the dirty regions, one bitmap bit at a time; a read of a region not done yet does it
//! first, [`Inner::settle`]). Each is given a `Weak` to the target and stops when it closes;
//! the journal writer upgrades it once and holds it while it waits, so the target's close
//! and drop stop it explicitly ([`super::journal::Journal::stop`]) before they join it.

use std::sync::atomic::Ordering;
use std::sync::{Arc, Weak};
use std::time::Instant;

use blockdev::{BlockDevice, BlockResult};

use super::{lock, Inner, Stop};

/// Recalculation and wipe chunk.
const RECALC_CHUNK_SECTORS: u64 = 2048;

pub(super) fn timer_loop<D: BlockDevice>(weak: Weak<Inner<D>>, stop: Arc<Stop>) {
    let period = {
        let Some(i) = weak.upgrade() else { return };
        let p = [i.commit_time, i.bitmap_flush_interval].into_iter().flatten().min();
        match p {
            Some(p) => p,
            None => return,
        }
    };
    let mut last_bitmap = Instant::now();
    loop {
        {
            let g = lock(&stop.stopped);
            if *g {
                return;
            }
            let (g, _) = stop.wake.wait_timeout(g, period).unwrap_or_else(|e| e.into_inner());
            if *g {
                return;
            }
        }
        let Some(i) = weak.upgrade() else { return };
        if i.poisoned.load(Ordering::Relaxed) {
            continue;
        }
        if let (Some(j), Some(_)) = (&i.journal, i.commit_time) {
            // A failed commit poisons the device (journal.rs).
            let g = j.lock();
            if g.has_uncommitted() {
                let target = g.filled();
                if let Ok(g) = j.commit_upto(&*i, g, target) {
                    drop(g);
                }
            }
        }
        if let (Some(_), Some(iv)) = (&i.bitmap, i.bitmap_flush_interval) {
            if last_bitmap.elapsed() >= iv {
                last_bitmap = Instant::now();
                if let Err(e) = i.bitmap_flush() {
                    i.poison("clearing the bitmap", &e);
                }
            }
        }
    }
}

/// The journal writer (`integrity_writer`): copies committed sections out when the journal
/// is filled to its watermark (journal.rs), until the target closes or fails.
pub(super) fn writer_loop<D: BlockDevice>(weak: Weak<Inner<D>>) {
    let Some(i) = weak.upgrade() else { return };
    if let Some(j) = &i.journal {
        j.writer_loop(&*i);
    }
}

/// The journal committer (journal.rs): commits sections as they fill.
pub(super) fn committer_loop<D: BlockDevice>(weak: Weak<Inner<D>>) {
    let Some(i) = weak.upgrade() else { return };
    if let Some(j) = &i.journal {
        j.committer_loop(&*i);
    }
}

pub(super) fn recalc_loop<D: BlockDevice>(weak: Weak<Inner<D>>, stop: Arc<Stop>) {
    let mut chunks = 0u32;
    loop {
        if *lock(&stop.stopped) {
            return;
        }
        let Some(i) = weak.upgrade() else { return };
        let pos = i.recalc_sector.load(Ordering::Relaxed);
        let end = i.layout.provided_data_sectors;
        if pos >= end {
            // The tags first (the kernel's `recalc_write_super` flushes its buffers before
            // the superblock): a superblock saying "done" over tags a crash lost would make
            // the recalculated area read as integrity errors.
            let r = i.meta.flush_dirty(&i.next).and_then(|_| i.next.flush());
            if let Err(e) = r.and_then(|_| i.write_sb_with(|sb| sb.recalc_sector = end)) {
                i.poison("writing the superblock after recalculation", &e);
            }
            return;
        }
        let n = RECALC_CHUNK_SECTORS.min(end - pos);
        let r = {
            // Requests' writes, and journal copy-outs (which hold no request lock).
            let _g = i.locks.write(pos * 512, n * 512);
            let _c = i.recalc_locks.write(pos * 512, n * 512);
            i.recalc_range(pos, pos + n)
        };
        if let Err(e) = r {
            i.poison("recalculating tags", &e);
            return;
        }
        i.recalc_sector.store(pos + n, Ordering::Relaxed);
        chunks += 1;
        if chunks.is_multiple_of(64) {
            let r = i.meta.flush_dirty(&i.next).and_then(|_| i.next.flush());
            let r = r.and_then(|_| i.write_sb_with(|sb| sb.recalc_sector = pos + n));
            if let Err(e) = r {
                i.poison("writing the superblock during recalculation", &e);
                return;
            }
        }
    }
}

/// Recalculates the regions an unclean stop in mode B left dirty, lowest first, until none is
/// left or the target closes or fails (the kernel's recalculation over `recalc_bitmap`).
pub(super) fn bitmap_recalc_loop<D: BlockDevice>(weak: Weak<Inner<D>>, stop: Arc<Stop>) {
    let mut from = 0;
    loop {
        if *lock(&stop.stopped) {
            return;
        }
        let Some(i) = weak.upgrade() else { return };
        let Some(b) = &i.bitmap else { return };
        let Some(bit) = lock(b).next_pending(from) else { return };
        if let Err(e) = i.recalc_region(bit) {
            i.poison("recalculating a dirty region", &e);
            return;
        }
        from = bit + 1;
    }
}

impl<D: BlockDevice> Inner<D> {
    /// Recalculates the tags of bitmap bit `bit`'s region if it is still pending, holding the
    /// region's range lock (no request reads or writes it meanwhile).
    pub(super) fn recalc_region(&self, bit: u64) -> BlockResult<()> {
        let Some(b) = &self.bitmap else { return Ok(()) };
        let r = lock(b).geom.sectors_of_bit(bit);
        let len = (r.end - r.start) * 512;
        let _g = self.locks.write(r.start * 512, len);
        let _c = self.recalc_locks.write(r.start * 512, len);
        if !lock(b).is_pending(bit) {
            return Ok(());
        }
        self.recalc_range(r.start, r.end)?;
        if lock(b).recalculated(bit) {
            self.bitmap_pending.fetch_sub(1, Ordering::AcqRel);
        }
        Ok(())
    }

    /// Before a read of `[sector, sector+n)`: recalculates the dirty regions it touches that
    /// the background has not reached yet, so that the read verifies against valid tags.
    pub(super) fn settle(&self, sector: u64, n: u64) -> BlockResult<()> {
        if self.bitmap_pending.load(Ordering::Acquire) == 0 {
            return Ok(());
        }
        let Some(b) = &self.bitmap else { return Ok(()) };
        let bits = lock(b).pending_in(sector, n);
        for bit in bits {
            self.meta_io("recalculating a dirty region", || self.recalc_region(bit))?;
        }
        Ok(())
    }

    /// Recomputes the tags of `[from, to)` from the data (whole blocks).
    pub(super) fn recalc_range(&self, from: u64, to: u64) -> BlockResult<()> {
        let mut s = from;
        while s < to {
            let n = RECALC_CHUNK_SECTORS.min(to - s);
            for (rs, cnt) in self.runs(s, n) {
                let mut data = vec![0u8; cnt as usize * 512];
                self.next.read_at(self.layout.data_sector(rs) * 512, &mut data)?;
                let mut tags = vec![0u8; data.len() / self.block_size * self.tag_size];
                self.compute_tags(rs, &data, &mut tags, true);
                self.meta.write(&self.next, self.tag_addr(rs), &tags)?;
            }
            s += n;
        }
        Ok(())
    }

    /// Clears the bitmap: waits for every write in flight, flushes, clears, writes.
    pub(super) fn bitmap_flush(&self) -> BlockResult<()> {
        let Some(b) = &self.bitmap else { return Ok(()) };
        let _g = self.locks.write(0, self.geometry.size);
        if !lock(b).clearable() {
            return Ok(());
        }
        self.meta.flush_dirty(&self.next)?;
        self.next.flush()?;
        lock(b).clear_all(&self.next)
    }
}
