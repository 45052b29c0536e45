//! The request path: reads (journal copies first, then data and tags from disk, verified,
//! a failing block re-read once), writes (tags computed before the range lock; into the
//! journal in mode J, else bitmap bits first in mode B, then data and tags), zeroes, discard
//! and flush, and the `BlockDevice` / `TaggedDevice` faces of [`IntegrityTarget`].
//!
//! Tags are hashed where the hash mode says, by the crate's placement engine
//! (placement.rs); hashing done while holding a range lock says so (`held`), so that it never
//! waits for pool threads that wait for that lock.

use std::convert::Infallible;
use std::sync::atomic::Ordering;

use blockdev::{BlockDevice, BlockError, BlockErrorKind, BlockResult, Caps, Geometry, WriteFlags, ZeroFlags};
use formats::integrity::DISCARD_FILLER;
use sector_crypto::tag::TagHash;

use super::journal::JournalSink;
use super::{lock, Inner, IntegrityTarget, Mode, TaggedDevice, NOT_RECALCULATING};
use crate::placement::{self, Policy};

impl<D: BlockDevice> JournalSink for Inner<D> {
    type Dev = D;
    fn dev(&self) -> &D {
        &self.next
    }
    fn write_blocks(&self, sector: u64, data: &[u8], tags: &[u8]) -> BlockResult<()> {
        // Copy-out holds no request range lock: a recalculation chunk reading these blocks'
        // old data must not write its tags after ours.
        let _g = self.recalc_locks.write(sector * 512, data.len() as u64);
        self.write_data_and_tags(sector, data, tags)
    }
    fn flush_all(&self) -> BlockResult<()> {
        self.meta.flush_dirty(&self.next)?;
        self.next.flush()
    }
    fn journal_mac(&self) -> Option<(&TagHash, Option<&[u8; 16]>)> {
        self.journal_mac.as_ref().map(|m| (m, self.salt.as_ref()))
    }
    fn failed(&self) -> Option<BlockError> {
        self.poisoned.load(Ordering::SeqCst).then(|| self.poisoned_err())
    }
    fn fail(&self, what: &str, e: &BlockError) {
        self.poison(what, e);
    }
}
impl<D: BlockDevice> Inner<D> {
    pub(super) fn spb(&self) -> u64 {
        self.layout.sectors_per_block()
    }

    pub(super) fn poison(&self, what: &str, e: &BlockError) {
        if !self.poisoned.swap(true, Ordering::SeqCst) {
            log::error!("dm-integrity: {what} failed: {e}; refusing writes until reopened");
        }
    }

    pub(super) fn poisoned_err(&self) -> BlockError {
        BlockError::new(
            BlockErrorKind::Poisoned,
            "an earlier metadata write failed; the volume refuses writes until reopened",
        )
    }

    /// Runs `f`; a failure poisons the device (metadata I/O).
    pub(super) fn meta_io<T>(&self, what: &str, f: impl FnOnce() -> BlockResult<T>) -> BlockResult<T> {
        f().inspect_err(|e| self.poison(what, e))
    }

    pub(super) fn check_writable(&self) -> BlockResult<()> {
        if self.read_only {
            return Err(BlockError::read_only());
        }
        if self.poisoned.load(Ordering::SeqCst) {
            return Err(self.poisoned_err());
        }
        Ok(())
    }

    /// Splits `[sector, sector+n)` at interleave-area boundaries: (logical sector, sectors).
    pub(super) fn runs(&self, sector: u64, n: u64) -> Vec<(u64, u64)> {
        let il = self.layout.interleave_sectors();
        let mut v = Vec::new();
        let mut s = sector;
        let end = sector + n;
        while s < end {
            let area_end = (s / il + 1) * il;
            let e = end.min(area_end);
            v.push((s, e - s));
            s = e;
        }
        v
    }

    /// How tag hashing is placed; `held`: the caller holds a range lock (see placement.rs).
    pub(super) fn hash_policy(&self, held: bool) -> Policy {
        Policy::new(self.hash_mode).holding_lock(held)
    }

    /// Tags of whole blocks `data` starting at logical `sector` into `tags`, placed by the
    /// hash mode; `held`: the caller holds a range lock.
    pub(super) fn compute_tags(&self, sector: u64, data: &[u8], tags: &mut [u8], held: bool) {
        let Some(h) = &self.hash else {
            tags.fill(0);
            return;
        };
        let bs = self.block_size;
        let ts = self.tag_size;
        let spb = self.spb();
        let salt = self.salt.as_ref();
        let chunk = placement::chunk_len(bs);
        let r =
            placement::run_paired(self.hash_policy(held), data, chunk, tags, chunk / bs * ts, |o, d, t| {
                let first = sector + (o / bs) as u64 * spb;
                for (k, (b, tag)) in d.chunks_exact(bs).zip(t.chunks_exact_mut(ts)).enumerate() {
                    h.compute(salt, first + k as u64 * spb, b, tag);
                }
                Ok::<(), Infallible>(())
            });
        let Ok(()) = r;
    }

    /// Tags of zero blocks from `sector`, `n` blocks; `held`: the caller holds a range lock.
    pub(super) fn zero_tags(&self, sector: u64, n: usize, held: bool) -> Vec<u8> {
        let mut tags = vec![0u8; n * self.tag_size];
        let Some(h) = &self.hash else { return tags };
        let zero = vec![0u8; self.block_size];
        let ts = self.tag_size;
        let spb = self.spb();
        let salt = self.salt.as_ref();
        // Chunked as if the zero blocks were data: the same rule as compute_tags.
        let tag_chunk = placement::chunk_len(self.block_size) / self.block_size * ts;
        let r = placement::run(self.hash_policy(held), &mut tags[..], tag_chunk, |o, t| {
            let first = sector + (o / ts) as u64 * spb;
            for (k, tag) in t.chunks_exact_mut(ts).enumerate() {
                h.compute(salt, first + k as u64 * spb, &zero, tag);
            }
            Ok::<(), Infallible>(())
        });
        let Ok(()) = r;
        tags
    }

    pub(super) fn tag_addr(&self, sector: u64) -> u64 {
        self.layout.tag_location(sector).byte_address
    }

    /// Writes data and tags for whole blocks from `sector` (any number of areas).
    pub(super) fn write_data_and_tags(&self, sector: u64, data: &[u8], tags: &[u8]) -> BlockResult<()> {
        let spb = self.spb();
        let ts = self.tag_size;
        let mut pos = 0usize;
        for (s, n) in self.runs(sector, data.len() as u64 / 512) {
            let bytes = n as usize * 512;
            let blocks = (n / spb) as usize;
            let t0 = pos / self.block_size * ts;
            self.next.write_at(
                self.layout.data_sector(s) * 512,
                &data[pos..pos + bytes],
                WriteFlags::empty(),
            )?;
            self.meta_io("writing tags", || {
                self.meta.write(&self.next, self.tag_addr(s), &tags[t0..t0 + blocks * ts])
            })?;
            pos += bytes;
        }
        Ok(())
    }

    /// Reads and (with an internal hash) verifies blocks from disk into `buf`; blocks with
    /// `skip[b]` set are not verified. Stored tags go to `tags_out` if given.
    pub(super) fn read_from_disk(
        &self,
        sector: u64,
        buf: &mut [u8],
        skip: &[bool],
        mut tags_out: Option<&mut [u8]>,
    ) -> BlockResult<()> {
        let spb = self.spb();
        let ts = self.tag_size;
        let bs = self.block_size;
        let mut pos = 0usize;
        for (s, n) in self.runs(sector, buf.len() as u64 / 512) {
            let bytes = n as usize * 512;
            let blocks = (n / spb) as usize;
            let b0 = pos / bs;
            let data = &mut buf[pos..pos + bytes];
            self.next.read_at(self.layout.data_sector(s) * 512, data)?;
            if self.mode != Mode::Recovery {
                let mut stored = vec![0u8; blocks * ts];
                self.meta.read(&self.next, self.tag_addr(s), &mut stored)?;
                if let Some(t) = tags_out.as_deref_mut() {
                    t[b0 * ts..(b0 + blocks) * ts].copy_from_slice(&stored);
                }
                if self.hash.is_some() {
                    self.verify(s, data, &stored, &skip[b0..b0 + blocks])?;
                }
            }
            pos += bytes;
        }
        Ok(())
    }

    pub(super) fn verify(
        &self,
        sector: u64,
        data: &mut [u8],
        stored: &[u8],
        skip: &[bool],
    ) -> BlockResult<()> {
        let ts = self.tag_size;
        let bs = self.block_size;
        let spb = self.spb();
        let mut computed = vec![0u8; stored.len()];
        self.compute_tags(sector, data, &mut computed, true);
        if computed == stored {
            return Ok(());
        }
        let recalc = self.recalc_sector.load(Ordering::Relaxed);
        for b in 0..stored.len() / ts {
            let st = &stored[b * ts..(b + 1) * ts];
            if skip[b] || st == &computed[b * ts..(b + 1) * ts] {
                continue;
            }
            let s = sector + b as u64 * spb;
            if self.allow_discards && st.iter().all(|&x| x == DISCARD_FILLER) {
                continue;
            }
            if recalc != NOT_RECALCULATING && s + spb > recalc {
                continue;
            }
            // Recheck: read the block again (a transient error below, or a racing writer).
            let block = &mut data[b * bs..(b + 1) * bs];
            let mut again = vec![0u8; ts];
            if self.next.read_at(self.layout.data_sector(s) * 512, block).is_ok() {
                self.compute_tags(s, block, &mut again, true);
                if again == st {
                    continue;
                }
            }
            let n = self.mismatches.fetch_add(1, Ordering::Relaxed) + 1;
            log::error!("dm-integrity: checksum failed at sector {s} (mismatch #{n})");
            data.fill(0);
            return Err(BlockError::integrity(s));
        }
        Ok(())
    }

    pub(super) fn read_impl(&self, off: u64, buf: &mut [u8], mut tags: Option<&mut [u8]>) -> BlockResult<()> {
        self.geometry.check_range(off, buf.len() as u64)?;
        if buf.is_empty() {
            return Ok(());
        }
        let bs = self.block_size;
        let ts = self.tag_size;
        if let Some(t) = &tags {
            if t.len() != buf.len() / bs * ts {
                return Err(BlockError::new(
                    BlockErrorKind::InvalidArgument,
                    "tag buffer has the wrong size",
                ));
            }
        }
        let sector = off / 512;
        let nblocks = buf.len() / bs;
        self.settle(sector, buf.len() as u64 / 512)?;
        let _g = self.locks.read(off, buf.len() as u64);
        // Journal copies first (see journal.rs: the lookup and copy are atomic with copy-out).
        let mut skip = vec![false; nblocks];
        let mut overlay: Vec<(usize, Vec<u8>, Vec<u8>)> = Vec::new();
        if let Some(j) = &self.journal {
            if self.journal_blocks.load(Ordering::Acquire) > 0 {
                let j = j.lock();
                for (b, s) in skip.iter_mut().enumerate() {
                    let mut d = vec![0u8; bs];
                    let mut t = vec![0u8; ts];
                    if j.read_block(sector + b as u64 * self.spb(), &mut d, Some(&mut t)) {
                        *s = true;
                        overlay.push((b, d, t));
                    }
                }
            }
        }
        self.read_from_disk(sector, buf, &skip, tags.as_deref_mut())?;
        for (b, d, t) in overlay {
            buf[b * bs..(b + 1) * bs].copy_from_slice(&d);
            if let Some(tt) = tags.as_deref_mut() {
                tt[b * ts..(b + 1) * ts].copy_from_slice(&t);
            }
        }
        Ok(())
    }

    pub(super) fn write_impl(
        &self,
        off: u64,
        buf: &[u8],
        tags: Option<&[u8]>,
        flags: WriteFlags,
    ) -> BlockResult<()> {
        self.check_writable()?;
        self.geometry.check_range(off, buf.len() as u64)?;
        if buf.is_empty() {
            return Ok(());
        }
        let bs = self.block_size;
        let ts = self.tag_size;
        let sector = off / 512;
        let n = buf.len() as u64 / 512;
        let owned;
        let tags: &[u8] = match tags {
            Some(t) => {
                if self.hash.is_some() {
                    return Err(BlockError::new(
                        BlockErrorKind::InvalidArgument,
                        "this volume computes its tags (internal_hash); external tags are refused",
                    ));
                }
                if t.len() != buf.len() / bs * ts {
                    return Err(BlockError::new(
                        BlockErrorKind::InvalidArgument,
                        "tag buffer has the wrong size",
                    ));
                }
                t
            }
            None => {
                let mut t = vec![0u8; buf.len() / bs * ts];
                self.compute_tags(sector, buf, &mut t, false);
                owned = t;
                &owned
            }
        };
        let _g = self.locks.write(off, buf.len() as u64);
        let fua = flags.contains(WriteFlags::FUA);
        if let Some(j) = &self.journal {
            // The journal poisons the device itself when its I/O fails.
            let n = j.write(self, sector, buf, tags, fua)?;
            self.journal_blocks.store(n as u64, Ordering::Release);
            return Ok(());
        }
        if let Some(b) = &self.bitmap {
            let mut b = lock(b);
            self.meta_io("writing the bitmap", || b.mark(&self.next, sector, n))?;
        }
        self.write_data_and_tags(sector, buf, tags)?;
        if fua {
            self.flush()?;
        }
        Ok(())
    }

    /// Zeroes with valid tags, without the journal (modes D, B; and the wipe).
    pub(super) fn write_zeroes_direct(
        &self,
        off: u64,
        len: u64,
        flags: ZeroFlags,
        lock_range: bool,
    ) -> BlockResult<()> {
        self.check_writable()?;
        self.geometry.check_range(off, len)?;
        if len == 0 {
            return Ok(());
        }
        let _g = lock_range.then(|| self.locks.write(off, len));
        let sector = off / 512;
        let n = len / 512;
        if let Some(b) = &self.bitmap {
            let mut b = lock(b);
            self.meta_io("writing the bitmap", || b.mark(&self.next, sector, n))?;
        }
        let spb = self.spb();
        let below = flags - ZeroFlags::FUA;
        for (s, cnt) in self.runs(sector, n) {
            self.next.write_zeroes(self.layout.data_sector(s) * 512, cnt * 512, below)?;
            let tags = self.zero_tags(s, (cnt / spb) as usize, lock_range);
            self.meta_io("writing tags", || self.meta.write(&self.next, self.tag_addr(s), &tags))?;
        }
        if flags.contains(ZeroFlags::FUA) {
            self.flush()?;
        }
        Ok(())
    }

    pub(super) fn flush(&self) -> BlockResult<()> {
        if self.read_only {
            return Ok(());
        }
        if self.poisoned.load(Ordering::SeqCst) {
            return Err(self.poisoned_err());
        }
        if let Some(j) = &self.journal {
            return j.flush(self);
        }
        self.meta_io("writing tags", || self.meta.flush_dirty(&self.next))?;
        // A failed flush below may have lost tag buffers written back just before it (and
        // data the client was told is written): latch it like any metadata failure, so no
        // later flush reports success (the kernel's dm-integrity sets `ic->failed`).
        self.meta_io("flushing the device", || self.next.flush())
    }

    pub(super) fn discard(&self, off: u64, len: u64) -> BlockResult<()> {
        if !self.allow_discards {
            return Err(BlockError::unsupported("discard (the volume was opened without allow_discards)"));
        }
        self.check_writable()?;
        self.geometry.check_range(off, len)?;
        if len == 0 {
            return Ok(());
        }
        let _g = self.locks.write(off, len);
        if let Some(j) = &self.journal {
            // Older journal copies of these blocks must not be copied out over the discard.
            let n = j.drain(self)?;
            self.journal_blocks.store(n as u64, Ordering::Release);
        }
        let sector = off / 512;
        let n = len / 512;
        if let Some(b) = &self.bitmap {
            let mut b = lock(b);
            self.meta_io("writing the bitmap", || b.mark(&self.next, sector, n))?;
        }
        let spb = self.spb();
        for (s, cnt) in self.runs(sector, n) {
            let bytes = (cnt / spb) as usize * self.tag_size;
            self.meta_io("writing tags", || {
                self.meta.fill(&self.next, self.tag_addr(s), bytes, DISCARD_FILLER)
            })?;
            if self.next.caps().contains(Caps::DISCARD) {
                self.next.discard(self.layout.data_sector(s) * 512, cnt * 512)?;
            }
        }
        Ok(())
    }
}

impl<D: BlockDevice + 'static> BlockDevice for IntegrityTarget<D> {
    fn geometry(&self) -> Geometry {
        self.inner.geometry
    }

    fn caps(&self) -> Caps {
        let i = &self.inner;
        let mut caps = Caps::FLUSH | Caps::FUA;
        if i.read_only {
            caps |= Caps::READ_ONLY;
        }
        if i.allow_discards {
            caps |= Caps::DISCARD;
        }
        if i.journal.is_none() {
            caps |= Caps::WRITE_ZEROES;
        }
        caps
    }

    fn read_at(&self, off: u64, buf: &mut [u8]) -> BlockResult<()> {
        self.inner.read_impl(off, buf, None)
    }

    fn write_at(&self, off: u64, buf: &[u8], flags: WriteFlags) -> BlockResult<()> {
        self.inner.write_impl(off, buf, None, flags)
    }

    fn flush(&self) -> BlockResult<()> {
        self.inner.flush()
    }

    fn discard(&self, off: u64, len: u64) -> BlockResult<()> {
        self.inner.discard(off, len)
    }

    fn write_zeroes(&self, off: u64, len: u64, flags: ZeroFlags) -> BlockResult<()> {
        if self.inner.journal.is_some() {
            // Journal mode: zero blocks go through the journal like any write.
            self.inner.check_writable()?;
            self.inner.geometry.check_range(off, len)?;
            const CHUNK: u64 = 1 << 20;
            let zeroes = vec![0u8; CHUNK.min(len) as usize];
            let wflags = if flags.contains(ZeroFlags::FUA) { WriteFlags::FUA } else { WriteFlags::empty() };
            let mut pos = off;
            while pos < off + len {
                let n = CHUNK.min(off + len - pos);
                self.inner.write_impl(pos, &zeroes[..n as usize], None, wflags)?;
                pos += n;
            }
            return Ok(());
        }
        self.inner.write_zeroes_direct(off, len, flags, true)
    }
}

impl<D: BlockDevice + 'static> TaggedDevice for IntegrityTarget<D> {
    fn tag_size(&self) -> usize {
        self.inner.tag_size
    }

    fn tag_block_size(&self) -> usize {
        self.inner.block_size
    }

    fn read_tagged(&self, off: u64, buf: &mut [u8], tags: &mut [u8]) -> BlockResult<()> {
        self.inner.read_impl(off, buf, Some(tags))
    }

    fn write_tagged(&self, off: u64, buf: &[u8], tags: &[u8], flags: WriteFlags) -> BlockResult<()> {
        self.inner.write_impl(off, buf, Some(tags), flags)
    }
}
