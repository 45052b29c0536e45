//! Opening a target and closing it cleanly: the table options are checked against the
//! superblock, the layout is resolved, and `resume` does what the kernel's
//! `dm_integrity_resume` does — replay the journal (`replay_journal`), or after an unclean
//! stop in mode B recalculate the regions the dirty bitmap names — then the background
//! threads start (background.rs). `shutdown` is `dm_integrity_postsuspend`: drain the
//! journal, flush the tags, clear the bitmap, record the recalculation position.

use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use blockdev::{BlockDevice, BlockError, BlockErrorKind, BlockResult, Geometry, RangeLock, WriteFlags};
use formats::integrity::journal::{self as fj, CommitIds, JournalResume, JournalView};
use formats::integrity::superblock::{verify_sb_mac, write_sb_mac, SB_AREA_BYTES};
use formats::integrity::{BitmapGeometry, DeviceParams, Layout, LayoutError, SbCheck, SbFlags, Superblock};

use super::background::{bitmap_recalc_loop, committer_loop, recalc_loop, timer_loop, writer_loop};
use super::bitmap::BitmapState;
use super::config::io;
use super::journal::{Journal, JournalState};
use super::meta::MetaCache;
use super::{
    lock, Inner, IntegrityConfig, IntegrityError, IntegrityTarget, JournalCrypt, Mode, SbState, Stop,
    NOT_RECALCULATING,
};

impl<D: BlockDevice + 'static> IntegrityTarget<D> {
    /// Opens the dm-integrity volume on `next` (superblock at `cfg.start`): checks the
    /// superblock against `cfg`, computes the layout, replays the journal (or loads the
    /// bitmap and recalculates dirty regions), and starts the commit / bitmap / recalc timers.
    pub fn open(next: D, cfg: IntegrityConfig) -> Result<Self, IntegrityError> {
        let g = next.geometry();
        if !matches!(cfg.block_size, 512 | 1024 | 2048 | 4096) {
            return Err(IntegrityError::BlockSize { block_size: cfg.block_size });
        }
        let tag_size = match (cfg.tag_size, &cfg.internal_hash) {
            (Some(t), _) => t,
            (None, Some(h)) => h.digest_size() as u32,
            (None, None) => return Err(IntegrityError::TagSizeNeeded),
        };
        if cfg.mode == Mode::Bitmap && cfg.internal_hash.is_none() {
            return Err(IntegrityError::NeedsInternalHash { option: "bitmap mode" });
        }
        if cfg.journal_crypt.is_some() && cfg.mode == Mode::Bitmap {
            return Err(IntegrityError::JournalCryptInBitmapMode);
        }
        if cfg.allow_discards && cfg.internal_hash.is_none() {
            return Err(IntegrityError::NeedsInternalHash { option: "allow_discards" });
        }
        let mut area = vec![0u8; SB_AREA_BYTES];
        let sb_off = cfg.start * 512;
        if sb_off + SB_AREA_BYTES as u64 > g.size {
            return Err(IntegrityError::Layout(LayoutError::TooSmall { device_sectors: g.size / 512 }));
        }
        next.read_at(sb_off, &mut area).map_err(io("reading the superblock"))?;
        let sb = Superblock::decode(&area).map_err(IntegrityError::Superblock)?;
        sb.check(&SbCheck {
            tag_size,
            block_size: cfg.block_size,
            meta_device: false,
            journal_mac: cfg.journal_mac.is_some(),
        })
        .map_err(IntegrityError::Superblock)?;
        if let Some(mac) = &cfg.journal_mac {
            if sb.flags.has(SbFlags::FIXED_HMAC) && cfg.mode != Mode::Recovery {
                verify_sb_mac(&area, mac.digest_size(), |i| mac.mac(i))
                    .map_err(IntegrityError::Superblock)?;
            }
        }
        let dp = DeviceParams {
            data_device_sectors: g.size / 512,
            meta_device_sectors: None,
            start: cfg.start,
            buffer_sectors: cfg.buffer_sectors,
            sectors_per_bit: cfg.sectors_per_bit,
        };
        let layout = Layout::open(&sb, &dp).map_err(IntegrityError::Layout)?;
        let dev_block = g.logical_block as u64;
        if dev_block > 512
            && (!sb_off.is_multiple_of(dev_block)
                || !(layout.journal.section_bytes() as u64).is_multiple_of(dev_block)
                || !(layout.initial_sectors as u64 * 512).is_multiple_of(dev_block)
                || (layout.block_size() as u64) < dev_block)
        {
            return Err(IntegrityError::MisalignedLayout { device_block: dev_block });
        }
        let block_size = layout.block_size();
        let lb = (block_size as u32).max(g.logical_block);
        let geometry = Geometry {
            size: layout.provided_data_sectors * 512 / lb as u64 * lb as u64,
            logical_block: lb,
            physical_block: g.physical_block.max(lb),
        };
        let meta = MetaCache::new(
            (layout.start + layout.initial_sectors as u64) * 512,
            layout.buffer_sectors() as usize * 512,
            g.size,
            g.logical_block as usize,
            cfg.skip_rmw,
            cfg.metadata_cache_bytes,
        );
        let recalc = if sb.flags.has(SbFlags::RECALCULATING) { sb.recalc_sector } else { NOT_RECALCULATING };
        let salt = sb.hmac_salt().copied();
        let read_only = cfg.read_only || cfg.mode == Mode::Recovery;
        let ms = |v: u64| (v > 0).then(|| Duration::from_millis(v));
        let journal_crypt = match &cfg.journal_crypt {
            Some(spec) => Some(Arc::new(
                JournalCrypt::new(spec, &layout)
                    .ok_or(IntegrityError::JournalCryptKey { key_len: spec.key.len() })?,
            )),
            None => None,
        };
        let mut inner = Inner {
            mode: cfg.mode,
            hash: cfg.internal_hash.clone(),
            journal_mac: cfg.journal_mac.clone(),
            journal_crypt,
            hash_mode: cfg.hash_mode,
            allow_discards: cfg.allow_discards,
            read_only,
            layout,
            geometry,
            tag_size: tag_size as usize,
            block_size,
            salt,
            meta,
            locks: RangeLock::new(),
            recalc_locks: RangeLock::new(),
            sb: Mutex::new(SbState { sb, area }),
            journal: None,
            journal_blocks: AtomicU64::new(0),
            bitmap: None,
            bitmap_pending: AtomicU64::new(0),
            mismatches: AtomicU64::new(0),
            poisoned: AtomicBool::new(false),
            recalc_sector: AtomicU64::new(recalc),
            closed: AtomicBool::new(false),
            commit_time: ms(cfg.commit_time_ms),
            bitmap_flush_interval: ms(cfg.bitmap_flush_interval_ms),
            next,
        };
        inner.resume(&cfg)?;
        let inner = Arc::new(inner);
        let stop = Arc::new(Stop::default());
        // The target owns its threads from the first one on: if a later one cannot start, its
        // drop stops and joins those already running (the journal writer would otherwise
        // wait for a stop that never comes) and closes the volume as a close would.
        let mut t = IntegrityTarget { inner, stop, workers: Vec::new() };
        let (inner, stop) = (t.inner.clone(), t.stop.clone());
        let ro = inner.read_only;
        if !ro
            && ((inner.journal.is_some() && inner.commit_time.is_some())
                || (inner.bitmap.is_some() && inner.bitmap_flush_interval.is_some()))
        {
            let (w, s) = (Arc::downgrade(&inner), stop.clone());
            t.spawn("timer", "timer", move || timer_loop(w, s))?;
        }
        if !ro && inner.journal.is_some() {
            let w = Arc::downgrade(&inner);
            t.spawn("writer", "journal writer", move || writer_loop(w))?;
            let w = Arc::downgrade(&inner);
            t.spawn("commit", "journal committer", move || committer_loop(w))?;
        }
        if !ro && inner.bitmap_pending.load(Ordering::Relaxed) > 0 {
            let (w, s) = (Arc::downgrade(&inner), stop.clone());
            t.spawn("bitmap-recalc", "bitmap recalc", move || bitmap_recalc_loop(w, s))?;
        }
        if !ro
            && inner.hash.is_some()
            && inner.recalc_sector.load(Ordering::Relaxed) < inner.layout.provided_data_sectors
        {
            let (w, s) = (Arc::downgrade(&inner), stop.clone());
            t.spawn("recalc", "recalc", move || recalc_loop(w, s))?;
        }
        Ok(t)
    }

    /// Starts background thread `dm-integrity-{name}` (`what` names it in errors); the
    /// target joins it on close.
    fn spawn(
        &mut self,
        name: &str,
        what: &'static str,
        f: impl FnOnce() + Send + 'static,
    ) -> Result<(), IntegrityError> {
        let h = std::thread::Builder::new()
            .name(format!("dm-integrity-{name}"))
            .spawn(f)
            .map_err(|source| IntegrityError::Thread { thread: what, source })?;
        self.workers.push(h);
        Ok(())
    }
}

impl<D: BlockDevice> Inner<D> {
    /// Writes the superblock after `f` changed it (version recomputed, MAC if any), FUA.
    pub(super) fn write_sb_with(&self, f: impl FnOnce(&mut Superblock)) -> BlockResult<()> {
        let mut st = lock(&self.sb);
        f(&mut st.sb);
        let mode = if self.mode == Mode::Recovery { Mode::Journal } else { self.mode };
        st.sb.set_version(mode, false);
        let sb = st.sb.clone();
        sb.encode_into(&mut st.area);
        if let (Some(mac), true) = (&self.journal_mac, sb.flags.has(SbFlags::FIXED_HMAC)) {
            write_sb_mac(&mut st.area, mac.digest_size(), |i| mac.mac(i)).map_err(|e| {
                BlockError::new(BlockErrorKind::InvalidArgument, "cannot MAC the superblock").with_source(e)
            })?;
        }
        self.next.write_at(self.layout.start * 512, &st.area, WriteFlags::FUA)?;
        self.next.flush()
    }

    pub(super) fn journal_state(
        &self,
        bytes: Vec<u8>,
        section: u32,
        seq: u8,
        cfg: &IntegrityConfig,
    ) -> JournalState {
        JournalState::new(
            &bytes,
            self.layout.journal,
            self.layout.journal_sections,
            self.layout.journal_byte_offset(),
            section,
            seq,
            self.layout.free_sectors_threshold(cfg.journal_watermark),
            self.journal_crypt.clone(),
        )
    }

    /// `dm_integrity_resume`: replay / bitmap / recalc decisions at open.
    pub(super) fn resume(&mut self, cfg: &IntegrityConfig) -> Result<(), IntegrityError> {
        if self.mode == Mode::Recovery {
            return Ok(());
        }
        let l = self.layout;
        // Held whole in memory: `Layout::open` refused a superblock whose journal_sections
        // ask for more than formats::limits::INTEGRITY_MAX_JOURNAL_BYTES.
        let mut bytes = vec![0u8; l.journal_bytes() as usize];
        self.next.read_at(l.journal_byte_offset(), &mut bytes).map_err(io("reading the journal"))?;
        let sb = lock(&self.sb).sb.clone();
        let bgeom = BitmapGeometry::from_layout(&l);
        let mut sb_dirty = sb.provided_data_sectors != l.provided_data_sectors;
        let mut new_sb = sb.clone();
        new_sb.provided_data_sectors = l.provided_data_sectors;
        if sb.flags.has(SbFlags::DIRTY_BITMAP)
            && self.mode == Mode::Bitmap
            && self.hash.is_some()
            && !self.read_only
        {
            // An unclean stop in mode B, reopened in mode B: the dirty regions are
            // recalculated in the background (background.rs), their bits set on disk until
            // then; with another bitmap granularity, every region is dirty.
            let b = if sb.log2_blocks_per_bitmap_bit == l.log2_blocks_per_bitmap_bit {
                BitmapState::with_dirty(
                    bgeom,
                    l.journal_byte_offset(),
                    &bytes[..bgeom.bytes().min(bytes.len())],
                )
            } else {
                let b = BitmapState::with_dirty(bgeom, l.journal_byte_offset(), &vec![0xff; bgeom.bytes()]);
                // The bitmap before the superblock naming its granularity.
                b.write_all(&self.next).map_err(io("writing the bitmap"))?;
                self.next.flush().map_err(io("flushing"))?;
                b
            };
            if b.pending_count() > 0 {
                log::info!(
                    "dm-integrity: {} dirty regions to recalculate in the background",
                    b.pending_count()
                );
            }
            self.bitmap_pending.store(b.pending_count(), Ordering::Relaxed);
            self.bitmap = Some(Mutex::new(b));
            new_sb.log2_blocks_per_bitmap_bit = l.log2_blocks_per_bitmap_bit;
            sb_dirty = true;
        } else if sb.flags.has(SbFlags::DIRTY_BITMAP) {
            // An unclean stop in mode B: the dirty regions' tags may not match their data.
            let ranges = if sb.log2_blocks_per_bitmap_bit == l.log2_blocks_per_bitmap_bit {
                bgeom.dirty_ranges(&bytes[..bgeom.bytes().min(bytes.len())])
            } else {
                std::iter::once(0..l.provided_data_sectors).collect()
            };
            if self.hash.is_some() {
                for r in &ranges {
                    log::info!("dm-integrity: recalculating tags of dirty region {r:?}");
                    self.recalc_range(r.start, r.end).map_err(io("recalculating dirty regions"))?;
                }
                self.meta.flush_dirty(&self.next).map_err(io("writing tags"))?;
                self.next.flush().map_err(io("flushing"))?;
            } else if !ranges.is_empty() {
                log::warn!(
                    "dm-integrity: dirty bitmap regions cannot be recalculated without an internal hash"
                );
            }
            if self.mode == Mode::Bitmap {
                let b = BitmapState::new(bgeom, l.journal_byte_offset());
                b.write_all(&self.next).map_err(io("writing the bitmap"))?;
                self.next.flush().map_err(io("flushing"))?;
                new_sb.log2_blocks_per_bitmap_bit = l.log2_blocks_per_bitmap_bit;
                self.bitmap = Some(Mutex::new(b));
                sb_dirty = true;
            } else {
                let mut j = self.journal_state(bytes, 0, 1, cfg);
                j.init_all(&*self, 0);
                j.write_all(&self.next).map_err(io("initialising the journal"))?;
                self.next.flush().map_err(io("flushing"))?;
                new_sb.flags.set(SbFlags::DIRTY_BITMAP, false);
                sb_dirty = true;
                if self.mode == Mode::Journal {
                    self.journal = Some(Journal::new(j, cfg.journal_io_threads));
                }
            }
        } else {
            if let Some(c) = &self.journal_crypt {
                c.decrypt(0, &mut bytes);
            }
            let (section, seq) = self.replay(&mut bytes)?;
            let j = self.journal_state(bytes, section, seq, cfg);
            match self.mode {
                Mode::Journal => self.journal = Some(Journal::new(j, cfg.journal_io_threads)),
                Mode::Bitmap => {
                    new_sb.flags.set(SbFlags::DIRTY_BITMAP, true);
                    new_sb.log2_blocks_per_bitmap_bit = l.log2_blocks_per_bitmap_bit;
                    sb_dirty = true;
                    let b = BitmapState::new(bgeom, l.journal_byte_offset());
                    // The superblock first: a crash between the two leaves a clean journal
                    // area read as an all-clear bitmap.
                    self.write_sb_with(|s| *s = new_sb.clone()).map_err(io("writing the superblock"))?;
                    b.write_all(&self.next).map_err(io("writing the bitmap"))?;
                    self.next.flush().map_err(io("flushing"))?;
                    self.bitmap = Some(Mutex::new(b));
                }
                _ => {}
            }
        }
        if cfg.recalculate && self.hash.is_some() && !new_sb.flags.has(SbFlags::RECALCULATING) {
            new_sb.flags.set(SbFlags::RECALCULATING, true);
            new_sb.recalc_sector = 0;
            sb_dirty = true;
        }
        if new_sb.flags.has(SbFlags::RECALCULATING) {
            if new_sb.recalc_sector > l.provided_data_sectors {
                new_sb.recalc_sector = l.provided_data_sectors;
                sb_dirty = true;
            }
            self.recalc_sector.store(new_sb.recalc_sector, Ordering::Relaxed);
        }
        if sb_dirty && !self.read_only {
            self.write_sb_with(|s| *s = new_sb).map_err(io("writing the superblock"))?;
        }
        Ok(())
    }

    /// `replay_journal`: returns where commits continue (section, commit_seq).
    pub(super) fn replay(&self, bytes: &mut [u8]) -> Result<(u32, u8), IntegrityError> {
        let l = self.layout;
        let ids = self.journal_crypt.as_ref().map_or_else(CommitIds::plain, |c| c.commit_ids());
        let view = JournalView::new(l.journal, l.journal_sections, bytes).map_err(IntegrityError::Journal)?;
        let plan = fj::scan(&view, &ids, self.mode == Mode::Journal).map_err(IntegrityError::Journal)?;
        let mac_fn;
        let mac = match &self.journal_mac {
            Some(m) => {
                mac_fn = move |i: &[u8]| m.mac(i);
                Some((&mac_fn as &dyn Fn(&[u8]) -> Vec<u8>, self.salt.as_ref()))
            }
            None => None,
        };
        let entries = fj::replay_entries(&view, &plan, l.provided_data_sectors, mac)
            .map_err(IntegrityError::Journal)?;
        if !entries.is_empty() {
            log::info!(
                "dm-integrity: replaying {} journal blocks from {} sections at {}",
                entries.len(),
                plan.write_sections,
                plan.write_start
            );
            if self.hash.is_some() {
                let mut t = vec![0u8; self.tag_size];
                for e in &entries {
                    self.compute_tags(e.logical_sector, &e.data, &mut t, false);
                    if t != e.tag {
                        return Err(IntegrityError::ReplayTagMismatch { sector: e.logical_sector });
                    }
                }
            }
            for e in &entries {
                self.write_data_and_tags(e.logical_sector, &e.data, &e.tag)
                    .map_err(io("replaying the journal"))?;
            }
            self.meta.flush_dirty(&self.next).map_err(io("replaying the journal"))?;
            self.next.flush().map_err(io("replaying the journal"))?;
        }
        match plan.resume {
            JournalResume::Continue { section, commit_seq } => Ok((section, commit_seq)),
            JournalResume::Clear { commit_seq, .. } => {
                let list = fj::clear_sections(&plan.resume, l.journal_sections);
                let mut j = JournalState::new(
                    bytes,
                    l.journal,
                    l.journal_sections,
                    l.journal_byte_offset(),
                    0,
                    commit_seq,
                    0,
                    self.journal_crypt.clone(),
                );
                j.clear(self, &list).map_err(io("clearing the journal"))?;
                let plain = j.to_bytes();
                bytes[..plain.len()].copy_from_slice(&plain);
                Ok((0, commit_seq))
            }
        }
    }

    /// Clean close (`dm_integrity_postsuspend`).
    pub(super) fn shutdown(&self) -> BlockResult<()> {
        if self.closed.swap(true, Ordering::SeqCst) || self.read_only {
            return Ok(());
        }
        if self.poisoned.load(Ordering::SeqCst) {
            return Err(self.poisoned_err());
        }
        if let Some(j) = &self.journal {
            let n = j.drain(self)?;
            self.journal_blocks.store(n as u64, Ordering::Release);
        }
        self.meta.flush_dirty(&self.next)?;
        self.next.flush()?;
        if let Some(b) = &self.bitmap {
            let pending = {
                let mut b = lock(b);
                b.clear_all(&self.next)?;
                b.pending_count()
            };
            if pending > 0 {
                // Their bits stay set, and DIRTY_BITMAP: the next open recalculates them.
                log::info!("dm-integrity: {pending} dirty regions left for the next open to recalculate");
                return self.save_recalc_sector();
            }
            let l = self.layout;
            let mut j = JournalState::new(
                &vec![0u8; l.journal_bytes() as usize],
                l.journal,
                l.journal_sections,
                l.journal_byte_offset(),
                0,
                1,
                0,
                self.journal_crypt.clone(),
            );
            j.init_all(self, 0);
            j.write_all(&self.next)?;
            self.next.flush()?;
            self.write_sb_with(|sb| sb.flags.set(SbFlags::DIRTY_BITMAP, false))?;
        }
        self.save_recalc_sector()
    }

    fn save_recalc_sector(&self) -> BlockResult<()> {
        let r = self.recalc_sector.load(Ordering::Relaxed);
        if r != NOT_RECALCULATING && lock(&self.sb).sb.recalc_sector != r {
            self.write_sb_with(|sb| sb.recalc_sector = r)?;
        }
        Ok(())
    }
}
