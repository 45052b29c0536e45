//! `IntegrityTarget`: the dm-integrity target in userspace, on the kernel's on-disk format.
//!
//! ```text
//!                  read_at / write_at / flush / discard / write_zeroes      (+ TaggedDevice)
//!                                     │
//!        RangeLock: overlapping requests ordered, disjoint ones run in parallel
//!                                     │
//!     ┌───────────── mode J ──────────┼──────── modes D, B ──────────────────────┐
//!     │ journal entries (memory) ─────┤  B: set bitmap bits, write+flush them     │
//!     │ commit: flush/FUA/timer/      │     first (bitmap.rs)                     │
//!     │   watermark (journal.rs)      │  data → data area (split per interleave   │
//!     │ writer: copy out ─────────────┼──►  area), tags → metadata buffers       │
//!     └───────────────────────────────┼───────────────────────────────────────────┘
//!                                     │
//!       MetaCache: tag buffers of buffer_sectors, locked per buffer, write-back (meta.rs)
//!                                     │
//!                        D: BlockDevice (superblock, journal/bitmap, areas)
//! ```
//!
//! Layout, superblock, journal and bitmap formats come from `formats::integrity`; tags from
//! `sector_crypto::tag::TagHash`. What the kernel does and what we do:
//!
//! | kernel (Linux 6.1)                                  | here                                         |
//! |-----------------------------------------------------|----------------------------------------------|
//! | `replay_journal` at resume (all modes but R)        | [`IntegrityTarget::open`], same rule          |
//! | journal writes, commit, `integrity_writer`          | journal.rs, on the request thread + a timer  |
//! | bitmap set before write, cleared by a timer          | bitmap.rs, timer thread, clean close        |
//! | dirty bitmap after a crash → RECALCULATING, recalc  | recalculated synchronously at open          |
//! | `recalculate`: background recalc from recalc_sector | background thread, position in `status()`   |
//! | read mismatch: recheck, `-EILSEQ`, counter, log      | re-read once, `IntegrityMismatch`, counter  |
//! | dm-bufio metadata buffers                            | `MetaCache`, per-buffer locks, no RMW knob  |
//! | `crypto_shash` per block                             | inline or on the rayon pool ([`HashMode`])  |
//! | a failed metadata/journal write fails the device    | poisoned: writes refused until reopened     |
//! | a failed flush below (`ic->failed` via bufio)       | poisoned too: later flushes/FUA fail         |
//!
//! `journal_crypt`: ctr(aes) and cbc(aes) (`jcrypt`); not chacha20.
//! Not implemented: `meta_device`, inline mode (`I`), resize.
//!
//! **Ownership of the device below.** The target assumes nobody else writes the device while
//! it is open. It keeps the journal (or bitmap) in memory and writes it back on
//! [`Drop`](#impl-Drop-for-IntegrityTarget<D>) (commit and copy-out in J, bitmap cleared and
//! area re-initialised in B), like the kernel's suspend.
mod bitmap;
mod format;
mod jcrypt;
mod journal;
mod meta;
mod tagged;

use std::convert::Infallible;
use std::fmt;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Condvar, Mutex, MutexGuard, Weak};
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

use blockdev::{
    BlockDevice, BlockError, BlockErrorKind, BlockResult, Caps, Geometry, RangeLock, WriteFlags, ZeroFlags,
};
pub use format::{format, FormatOptions};
use formats::integrity::journal::{self as fj, CommitIds, JournalError, JournalResume, JournalView};
use formats::integrity::superblock::{verify_sb_mac, write_sb_mac, SB_AREA_BYTES};
pub use formats::integrity::Mode;
use formats::integrity::{
    BitmapGeometry, DeviceParams, Layout, LayoutError, SbCheck, SbFlags, Superblock, SuperblockError,
    DISCARD_FILLER,
};
pub use jcrypt::{JournalCipher, JournalCrypt, JournalCryptSpec};
use sector_crypto::tag::TagHash;
pub use tagged::TaggedDevice;

use self::bitmap::BitmapState;
use self::journal::{JournalSink, JournalState};
use self::meta::MetaCache;
use crate::placement::{self, Policy};

/// Where the tags of a multi-block request are computed (the kernel's synchronous `shash`
/// versus an offloaded `ahash`): the crate's one [`Placement`](crate::Placement) policy, on
/// the pool crypt uses.
pub type HashMode = crate::placement::Placement;
/// Recalculation and wipe chunk.
const RECALC_CHUNK_SECTORS: u64 = 2048;

/// Table options of an integrity target (`dm_integrity_ctr` arguments).
#[derive(Debug, Clone)]
pub struct IntegrityConfig {
    /// `J`, `B`, `D` or `R`.
    pub mode: Mode,
    /// `internal_hash:` (keyed already); `None` = tags come from the layer above
    /// ([`TaggedDevice`]).
    pub internal_hash: Option<TagHash>,
    /// Tag bytes per block; `None` = the internal hash's digest size.
    pub tag_size: Option<u32>,
    /// `block_size:` (512..=4096).
    pub block_size: u32,
    /// Table `start` (`reserved_sectors`): where the superblock is, in 512-byte sectors.
    pub start: u64,
    /// `buffer_sectors:` (default 128).
    pub buffer_sectors: u32,
    /// `journal_watermark:` percent (default 50).
    pub journal_watermark: u32,
    /// `commit_time:` in ms (default 10000; 0 = no timer, commit only on flush/FUA/watermark).
    pub commit_time_ms: u64,
    /// `sectors_per_bit:` (mode B granularity; `None` = 32768).
    pub sectors_per_bit: Option<u64>,
    /// `bitmap_flush_interval:` in ms (default 10000; 0 = only at close).
    pub bitmap_flush_interval_ms: u64,
    /// `allow_discards`: discarded blocks' tags are filled with 0xF6 and accepted on read.
    pub allow_discards: bool,
    /// `recalculate`: (re)compute tags from `recalc_sector` on, in the background.
    pub recalculate: bool,
    /// `journal_mac:` (keyed already).
    pub journal_mac: Option<TagHash>,
    /// `journal_crypt:` (ctr(aes) or cbc(aes); not in mode B).
    pub journal_crypt: Option<JournalCryptSpec>,
    /// Refuse writes.
    pub read_only: bool,
    /// A write covering whole metadata buffers does not read them first. Off: always
    /// read-modify-write (to measure what it costs).
    pub skip_rmw: bool,
    /// Where tags are computed.
    pub hash_mode: HashMode,
    /// Metadata buffer cache size in bytes.
    pub metadata_cache_bytes: usize,
}

impl IntegrityConfig {
    /// integritysetup's defaults for `mode` with `internal_hash` (crc32c if you pass
    /// `TagHash::new("crc32c", None)`).
    pub fn new(mode: Mode, internal_hash: Option<TagHash>) -> Self {
        IntegrityConfig {
            mode,
            internal_hash,
            tag_size: None,
            block_size: 512,
            start: 0,
            buffer_sectors: formats::integrity::layout::DEFAULT_BUFFER_SECTORS,
            journal_watermark: 50,
            commit_time_ms: 10_000,
            sectors_per_bit: None,
            bitmap_flush_interval_ms: 10_000,
            allow_discards: false,
            recalculate: false,
            journal_mac: None,
            journal_crypt: None,
            read_only: false,
            skip_rmw: true,
            hash_mode: HashMode::Auto,
            metadata_cache_bytes: 32 << 20,
        }
    }
}

/// Why a target could not be opened or formatted.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum IntegrityError {
    /// I/O on the device below failed.
    #[error("I/O error while {what}")]
    Io {
        /// What was being done.
        what: &'static str,
        /// Cause.
        #[source]
        source: BlockError,
    },
    /// The superblock is missing, malformed, or does not match the options.
    #[error("invalid dm-integrity superblock")]
    Superblock(#[source] SuperblockError),
    /// The layout does not fit the device.
    #[error("dm-integrity layout does not fit the device")]
    Layout(#[source] LayoutError),
    /// The journal cannot be replayed (the kernel fails the device).
    #[error("dm-integrity journal is corrupt")]
    Journal(#[source] JournalError),
    /// A committed journal entry's tag does not match its data ("tag mismatch when replaying
    /// journal").
    #[error("tag mismatch when replaying the journal entry for sector {sector}")]
    ReplayTagMismatch {
        /// Logical sector of the entry.
        sector: u64,
    },
    /// Options that cannot work together.
    #[error("invalid dm-integrity options: {0}")]
    Params(String),
}

fn io(what: &'static str) -> impl FnOnce(BlockError) -> IntegrityError {
    move |source| IntegrityError::Io { what, source }
}

/// A snapshot of a target's state (`dmsetup status` plus engine counters).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct IntegrityStatus {
    /// Mode letter.
    pub mode: Mode,
    /// Reads that failed their tag check (after the re-read).
    pub mismatches: u64,
    /// Logical size in 512-byte sectors.
    pub provided_data_sectors: u64,
    /// `recalc_sector` while RECALCULATING.
    pub recalc_sector: Option<u64>,
    /// A metadata write failed: writes are refused until reopened.
    pub poisoned: bool,
    /// Tag buffers read to check tags.
    pub metadata_reads: u64,
    /// Tag buffers read only to modify part of them.
    pub rmw_reads: u64,
    /// Tag buffer (dirty range) writes.
    pub metadata_writes: u64,
    /// Journal commits (mode J).
    pub journal_commits: u64,
    /// Journal copy-out writes (mode J).
    pub journal_copyouts: u64,
    /// Blocks in the journal not yet copied out (mode J).
    pub journal_pending_blocks: u64,
}

impl fmt::Display for IntegrityStatus {
    /// `dmsetup status` INFO: `<mismatches> <provided_data_sectors> <recalc_sector|->`.
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{} {} ", self.mismatches, self.provided_data_sectors)?;
        match self.recalc_sector {
            Some(s) => write!(f, "{s}"),
            None => f.write_str("-"),
        }
    }
}

#[derive(Debug)]
struct SbState {
    sb: Superblock,
    area: Vec<u8>,
}

#[derive(Debug, Default)]
struct Stop {
    stopped: Mutex<bool>,
    wake: Condvar,
}

const NOT_RECALCULATING: u64 = u64::MAX;

struct Inner<D> {
    next: D,
    mode: Mode,
    hash: Option<TagHash>,
    journal_mac: Option<TagHash>,
    journal_crypt: Option<Arc<JournalCrypt>>,
    hash_mode: HashMode,
    allow_discards: bool,
    read_only: bool,
    layout: Layout,
    geometry: Geometry,
    tag_size: usize,
    block_size: usize,
    salt: Option<[u8; 16]>,
    meta: MetaCache,
    locks: RangeLock,
    sb: Mutex<SbState>,
    journal: Option<Mutex<JournalState>>,
    /// Blocks in the journal index (read fast path: 0 = no lookup needed).
    journal_blocks: AtomicU64,
    bitmap: Option<Mutex<BitmapState>>,
    mismatches: AtomicU64,
    poisoned: AtomicBool,
    recalc_sector: AtomicU64,
    closed: AtomicBool,
    commit_time: Option<Duration>,
    bitmap_flush_interval: Option<Duration>,
}

impl<D: BlockDevice> fmt::Debug for Inner<D> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("IntegrityTarget")
            .field("mode", &self.mode)
            .field("hash", &self.hash)
            .field("geometry", &self.geometry)
            .field("tag_size", &self.tag_size)
            .field("next", &self.next)
            .finish()
    }
}

fn lock<T>(m: &Mutex<T>) -> MutexGuard<'_, T> {
    m.lock().unwrap_or_else(|e| e.into_inner())
}

/// The dm-integrity target over `next` (see the module docs).
pub struct IntegrityTarget<D: BlockDevice + 'static> {
    inner: Arc<Inner<D>>,
    stop: Arc<Stop>,
    workers: Vec<JoinHandle<()>>,
}

impl<D: BlockDevice + 'static> fmt::Debug for IntegrityTarget<D> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        self.inner.fmt(f)
    }
}

impl<D: BlockDevice + 'static> IntegrityTarget<D> {
    /// Opens the dm-integrity volume on `next` (superblock at `cfg.start`): checks the
    /// superblock against `cfg`, computes the layout, replays the journal (or loads the
    /// bitmap and recalculates dirty regions), and starts the commit / bitmap / recalc timers.
    pub fn open(next: D, cfg: IntegrityConfig) -> Result<Self, IntegrityError> {
        let g = next.geometry();
        if !matches!(cfg.block_size, 512 | 1024 | 2048 | 4096) {
            return Err(IntegrityError::Params(format!("block size {} is not 512..4096", cfg.block_size)));
        }
        let tag_size = match (cfg.tag_size, &cfg.internal_hash) {
            (Some(t), _) => t,
            (None, Some(h)) => h.digest_size() as u32,
            (None, None) => {
                return Err(IntegrityError::Params("a tag size is needed without an internal hash".into()))
            }
        };
        if cfg.mode == Mode::Bitmap && cfg.internal_hash.is_none() {
            return Err(IntegrityError::Params("bitmap mode needs an internal hash".into()));
        }
        if cfg.journal_crypt.is_some() && cfg.mode == Mode::Bitmap {
            return Err(IntegrityError::Params("journal_crypt is not supported in bitmap mode".into()));
        }
        if cfg.allow_discards && cfg.internal_hash.is_none() {
            return Err(IntegrityError::Params("allow_discards needs an internal hash".into()));
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
            return Err(IntegrityError::Params(format!(
                "the layout is not aligned to the device's {dev_block}-byte blocks"
            )));
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
            Some(spec) => Some(Arc::new(JournalCrypt::new(spec, &layout).ok_or_else(|| {
                IntegrityError::Params(format!(
                    "journal_crypt key of {} bytes (16, 24 or 32)",
                    spec.key.len()
                ))
            })?)),
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
            sb: Mutex::new(SbState { sb, area }),
            journal: None,
            journal_blocks: AtomicU64::new(0),
            bitmap: None,
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
        let mut workers = Vec::new();
        if !inner.read_only
            && ((inner.journal.is_some() && inner.commit_time.is_some())
                || (inner.bitmap.is_some() && inner.bitmap_flush_interval.is_some()))
        {
            let (w, s) = (Arc::downgrade(&inner), stop.clone());
            workers.push(
                std::thread::Builder::new()
                    .name("dm-integrity-timer".into())
                    .spawn(move || timer_loop(w, s))
                    .map_err(|e| IntegrityError::Params(format!("cannot start the timer thread: {e}")))?,
            );
        }
        if !inner.read_only
            && inner.hash.is_some()
            && inner.recalc_sector.load(Ordering::Relaxed) < inner.layout.provided_data_sectors
        {
            let (w, s) = (Arc::downgrade(&inner), stop.clone());
            workers.push(
                std::thread::Builder::new()
                    .name("dm-integrity-recalc".into())
                    .spawn(move || recalc_loop(w, s))
                    .map_err(|e| IntegrityError::Params(format!("cannot start the recalc thread: {e}")))?,
            );
        }
        Ok(IntegrityTarget { inner, stop, workers })
    }

    /// The device below.
    pub fn inner(&self) -> &D {
        &self.inner.next
    }

    /// The resolved layout.
    pub fn layout(&self) -> &Layout {
        &self.inner.layout
    }

    /// The superblock as last written.
    pub fn superblock(&self) -> Superblock {
        lock(&self.inner.sb).sb.clone()
    }

    /// Mismatch count, provided sectors, recalc position and engine counters.
    pub fn status(&self) -> IntegrityStatus {
        let i = &self.inner;
        let (commits, copyouts, pending) = match &i.journal {
            Some(j) => {
                let j = lock(j);
                (j.commits, j.copyouts, j.pending_entries() as u64)
            }
            None => (0, 0, 0),
        };
        let r = i.recalc_sector.load(Ordering::Relaxed);
        IntegrityStatus {
            mode: i.mode,
            mismatches: i.mismatches.load(Ordering::Relaxed),
            provided_data_sectors: i.layout.provided_data_sectors,
            recalc_sector: (r != NOT_RECALCULATING).then_some(r),
            poisoned: i.poisoned.load(Ordering::Relaxed),
            metadata_reads: i.meta.meta_reads(),
            rmw_reads: i.meta.rmw_reads(),
            metadata_writes: i.meta.buffer_writes(),
            journal_commits: commits,
            journal_copyouts: copyouts,
            journal_pending_blocks: pending,
        }
    }

    /// Waits until background recalculation finished (tests, `--integrity-recalculate`).
    pub fn wait_recalculated(&self) {
        while self.inner.recalc_sector.load(Ordering::Relaxed) < self.inner.layout.provided_data_sectors
            && !self.inner.poisoned.load(Ordering::Relaxed)
            && !self.workers.iter().all(|w| w.is_finished())
        {
            std::thread::sleep(Duration::from_millis(2));
        }
    }

    /// Loses power: stops the timers and drops the in-memory state without committing or
    /// closing anything (what a crash leaves on disk). For tests.
    #[doc(hidden)]
    pub fn abandon(mut self) {
        self.inner.closed.store(true, Ordering::SeqCst);
        self.stop_workers();
    }

    /// Closes cleanly now (what `Drop` does), reporting errors.
    pub fn close(mut self) -> BlockResult<()> {
        self.stop_workers();
        self.inner.shutdown()
    }

    fn stop_workers(&mut self) {
        *lock(&self.stop.stopped) = true;
        self.stop.wake.notify_all();
        for w in self.workers.drain(..) {
            let _ = w.join();
        }
    }

    /// Writes zeroes with valid tags over the whole device in 64 MiB chunks (the format wipe),
    /// calling `progress(bytes_done, bytes_total)` on the calling thread as chunks finish.
    ///
    /// One chunk per core is in flight at once: a chunk is a zero-range request below, then
    /// hashing its tags (CPU), then writing them, so with one chunk at a time a core idles
    /// while the other waits on I/O. Chunks never share a tag buffer of another chunk's areas
    /// and each takes its range lock, as concurrent `write_zeroes` requests would.
    pub fn wipe(&self, mut progress: impl FnMut(u64, u64)) -> BlockResult<()> {
        self.wipe_until(|done, total| {
            progress(done, total);
            std::ops::ControlFlow::Continue(())
        })
        .map(|_| ())
    }

    /// [`wipe`](Self::wipe) that stops when `progress` returns `Break`: no new chunk starts,
    /// the chunks in flight finish, and the device is flushed. Chunks are handed out in
    /// order, so what was wiped is a prefix: returns `Some(bytes)` of it when stopped before
    /// the end, `None` when the whole device was wiped.
    pub fn wipe_until(
        &self,
        mut progress: impl FnMut(u64, u64) -> std::ops::ControlFlow<()>,
    ) -> BlockResult<Option<u64>> {
        let total = self.inner.geometry.size;
        let chunk = 64u64 << 20;
        let chunks = total.div_ceil(chunk);
        let workers = std::thread::available_parallelism().map_or(1, |n| n.get()).min(chunks as usize).max(1);
        let next = AtomicU64::new(0);
        let failed = AtomicBool::new(false);
        let stop = AtomicBool::new(false);
        let (tx, rx) = std::sync::mpsc::channel::<BlockResult<u64>>();
        std::thread::scope(|scope| {
            for _ in 0..workers {
                let tx = tx.clone();
                let (next, failed, stop) = (&next, &failed, &stop);
                scope.spawn(move || {
                    while !failed.load(Ordering::Relaxed) && !stop.load(Ordering::SeqCst) {
                        let i = next.fetch_add(1, Ordering::Relaxed);
                        if i >= chunks {
                            break;
                        }
                        let off = i * chunk;
                        let n = chunk.min(total - off);
                        let r = self.inner.write_zeroes_direct(off, n, ZeroFlags::empty(), true).map(|()| n);
                        if r.is_err() {
                            failed.store(true, Ordering::Relaxed);
                        }
                        if tx.send(r).is_err() {
                            break;
                        }
                    }
                });
            }
            drop(tx);
            let mut done = 0;
            let mut first_err = None;
            for r in rx {
                match r {
                    Ok(n) => {
                        done += n;
                        if progress(done, total).is_break() {
                            stop.store(true, Ordering::SeqCst);
                        }
                    }
                    Err(e) => {
                        first_err.get_or_insert(e);
                    }
                }
            }
            match first_err {
                Some(e) => Err(e),
                None => Ok(()),
            }
        })?;
        self.inner.flush()?;
        // Every chunk below `next` was handed out and written before its worker looked again.
        let wiped = (next.load(Ordering::SeqCst).min(chunks) * chunk).min(total);
        Ok((wiped < total).then_some(wiped))
    }
}

impl<D: BlockDevice + 'static> Drop for IntegrityTarget<D> {
    fn drop(&mut self) {
        self.stop_workers();
        if let Err(e) = self.inner.shutdown() {
            log::error!("dm-integrity: closing failed: {e}");
        }
    }
}

fn timer_loop<D: BlockDevice>(weak: Weak<Inner<D>>, stop: Arc<Stop>) {
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
            let mut j = lock(j);
            if j.has_uncommitted() {
                if let Err(e) = j.commit(&*i) {
                    i.poison("committing the journal (timer)", &e);
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

fn recalc_loop<D: BlockDevice>(weak: Weak<Inner<D>>, stop: Arc<Stop>) {
    let mut chunks = 0u32;
    loop {
        if *lock(&stop.stopped) {
            return;
        }
        let Some(i) = weak.upgrade() else { return };
        let pos = i.recalc_sector.load(Ordering::Relaxed);
        let end = i.layout.provided_data_sectors;
        if pos >= end {
            if let Err(e) = i.write_sb_with(|sb| sb.recalc_sector = end) {
                i.poison("writing the superblock after recalculation", &e);
            }
            return;
        }
        let n = RECALC_CHUNK_SECTORS.min(end - pos);
        let r = {
            let _g = i.locks.write(pos * 512, n * 512);
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

impl<D: BlockDevice> JournalSink for Inner<D> {
    type Dev = D;
    fn dev(&self) -> &D {
        &self.next
    }
    fn write_blocks(&self, sector: u64, data: &[u8], tags: &[u8]) -> BlockResult<()> {
        self.write_data_and_tags(sector, data, tags)
    }
    fn flush_all(&self) -> BlockResult<()> {
        self.meta.flush_dirty(&self.next)?;
        self.next.flush()
    }
    fn journal_mac(&self) -> Option<(&TagHash, Option<&[u8; 16]>)> {
        self.journal_mac.as_ref().map(|m| (m, self.salt.as_ref()))
    }
}

impl<D: BlockDevice> Inner<D> {
    fn spb(&self) -> u64 {
        self.layout.sectors_per_block()
    }

    fn poison(&self, what: &str, e: &BlockError) {
        if !self.poisoned.swap(true, Ordering::SeqCst) {
            log::error!("dm-integrity: {what} failed: {e}; refusing writes until reopened");
        }
    }

    fn poisoned_err(&self) -> BlockError {
        BlockError::new(
            BlockErrorKind::Poisoned,
            "an earlier metadata write failed; the volume refuses writes until reopened",
        )
    }

    /// Runs `f`; a failure poisons the device (metadata I/O).
    fn meta_io<T>(&self, what: &str, f: impl FnOnce() -> BlockResult<T>) -> BlockResult<T> {
        f().inspect_err(|e| self.poison(what, e))
    }

    fn check_writable(&self) -> BlockResult<()> {
        if self.read_only {
            return Err(BlockError::read_only());
        }
        if self.poisoned.load(Ordering::SeqCst) {
            return Err(self.poisoned_err());
        }
        Ok(())
    }

    /// Splits `[sector, sector+n)` at interleave-area boundaries: (logical sector, sectors).
    fn runs(&self, sector: u64, n: u64) -> Vec<(u64, u64)> {
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
    fn hash_policy(&self, held: bool) -> Policy {
        Policy::new(self.hash_mode).holding_lock(held)
    }

    /// Tags of whole blocks `data` starting at logical `sector` into `tags`, placed by the
    /// hash mode; `held`: the caller holds a range lock.
    fn compute_tags(&self, sector: u64, data: &[u8], tags: &mut [u8], held: bool) {
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
    fn zero_tags(&self, sector: u64, n: usize, held: bool) -> Vec<u8> {
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

    fn tag_addr(&self, sector: u64) -> u64 {
        self.layout.tag_location(sector).byte_address
    }

    /// Writes data and tags for whole blocks from `sector` (any number of areas).
    fn write_data_and_tags(&self, sector: u64, data: &[u8], tags: &[u8]) -> BlockResult<()> {
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
    fn read_from_disk(
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

    fn verify(&self, sector: u64, data: &mut [u8], stored: &[u8], skip: &[bool]) -> BlockResult<()> {
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

    fn read_impl(&self, off: u64, buf: &mut [u8], mut tags: Option<&mut [u8]>) -> BlockResult<()> {
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
        let _g = self.locks.read(off, buf.len() as u64);
        // Journal copies first (see journal.rs: the lookup and copy are atomic with copy-out).
        let mut skip = vec![false; nblocks];
        let mut overlay: Vec<(usize, Vec<u8>, Vec<u8>)> = Vec::new();
        if let Some(j) = &self.journal {
            if self.journal_blocks.load(Ordering::Acquire) > 0 {
                let j = lock(j);
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

    fn write_impl(&self, off: u64, buf: &[u8], tags: Option<&[u8]>, flags: WriteFlags) -> BlockResult<()> {
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
            let mut j = lock(j);
            let r = j.add(self, sector, buf, tags).and_then(|_| j.after_write(self, fua));
            self.journal_blocks.store(j.pending_entries() as u64, Ordering::Release);
            return r.inspect_err(|e| self.poison("writing the journal", e));
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
    fn write_zeroes_direct(&self, off: u64, len: u64, flags: ZeroFlags, lock_range: bool) -> BlockResult<()> {
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

    fn flush(&self) -> BlockResult<()> {
        if self.read_only {
            return Ok(());
        }
        if self.poisoned.load(Ordering::SeqCst) {
            return Err(self.poisoned_err());
        }
        if let Some(j) = &self.journal {
            let mut j = lock(j);
            return j.commit(self).inspect_err(|e| self.poison("committing the journal", e));
        }
        self.meta_io("writing tags", || self.meta.flush_dirty(&self.next))?;
        // A failed flush below may have lost tag buffers written back just before it (and
        // data the client was told is written): latch it like any metadata failure, so no
        // later flush reports success (the kernel's dm-integrity sets `ic->failed`).
        self.meta_io("flushing the device", || self.next.flush())
    }

    fn discard(&self, off: u64, len: u64) -> BlockResult<()> {
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
            let mut j = lock(j);
            let r = j.drain(self);
            self.journal_blocks.store(j.pending_entries() as u64, Ordering::Release);
            r.inspect_err(|e| self.poison("writing the journal", e))?;
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

    /// Recomputes the tags of `[from, to)` from the data (whole blocks).
    fn recalc_range(&self, from: u64, to: u64) -> BlockResult<()> {
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
    fn bitmap_flush(&self) -> BlockResult<()> {
        let Some(b) = &self.bitmap else { return Ok(()) };
        let _g = self.locks.write(0, self.geometry.size);
        if !lock(b).any_set() {
            return Ok(());
        }
        self.meta.flush_dirty(&self.next)?;
        self.next.flush()?;
        lock(b).clear_all(&self.next)
    }

    /// Writes the superblock after `f` changed it (version recomputed, MAC if any), FUA.
    fn write_sb_with(&self, f: impl FnOnce(&mut Superblock)) -> BlockResult<()> {
        let mut st = lock(&self.sb);
        f(&mut st.sb);
        let mode = if self.mode == Mode::Recovery { Mode::Journal } else { self.mode };
        st.sb.set_version(mode, false);
        let sb = st.sb.clone();
        sb.encode_into(&mut st.area);
        if let (Some(mac), true) = (&self.journal_mac, sb.flags.has(SbFlags::FIXED_HMAC)) {
            write_sb_mac(&mut st.area, mac.digest_size(), |i| mac.mac(i))
                .map_err(|e| BlockError::new(BlockErrorKind::InvalidArgument, e.to_string()))?;
        }
        self.next.write_at(self.layout.start * 512, &st.area, WriteFlags::FUA)?;
        self.next.flush()
    }

    fn journal_state(&self, bytes: Vec<u8>, section: u32, seq: u8, cfg: &IntegrityConfig) -> JournalState {
        JournalState::new(
            bytes,
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
    fn resume(&mut self, cfg: &IntegrityConfig) -> Result<(), IntegrityError> {
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
        if sb.flags.has(SbFlags::DIRTY_BITMAP) {
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
                    self.journal = Some(Mutex::new(j));
                }
            }
        } else {
            if let Some(c) = &self.journal_crypt {
                c.decrypt(0, &mut bytes);
            }
            let (section, seq) = self.replay(&mut bytes)?;
            let j = self.journal_state(bytes, section, seq, cfg);
            match self.mode {
                Mode::Journal => self.journal = Some(Mutex::new(j)),
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
    fn replay(&self, bytes: &mut [u8]) -> Result<(u32, u8), IntegrityError> {
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
            JournalResume::Clear { erase_seq, commit_seq, .. } => {
                let list = fj::clear_sections(&plan.resume, l.journal_sections);
                let mut j = JournalState::new(
                    bytes.to_vec(),
                    l.journal,
                    l.journal_sections,
                    l.journal_byte_offset(),
                    0,
                    commit_seq,
                    0,
                    self.journal_crypt.clone(),
                );
                j.clear(self, &list).map_err(io("clearing the journal"))?;
                bytes.copy_from_slice(&j.bytes);
                let _ = erase_seq;
                Ok((0, commit_seq))
            }
        }
    }

    /// Clean close (`dm_integrity_postsuspend`).
    fn shutdown(&self) -> BlockResult<()> {
        if self.closed.swap(true, Ordering::SeqCst) || self.read_only {
            return Ok(());
        }
        if self.poisoned.load(Ordering::SeqCst) {
            return Err(self.poisoned_err());
        }
        if let Some(j) = &self.journal {
            let mut j = lock(j);
            j.drain(self)?;
            self.journal_blocks.store(0, Ordering::Release);
        }
        self.meta.flush_dirty(&self.next)?;
        self.next.flush()?;
        if let Some(b) = &self.bitmap {
            lock(b).clear_all(&self.next)?;
            let l = self.layout;
            let mut j = JournalState::new(
                vec![0u8; l.journal_bytes() as usize],
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
        let r = self.recalc_sector.load(Ordering::Relaxed);
        if r != NOT_RECALCULATING && lock(&self.sb).sb.recalc_sector != r {
            self.write_sb_with(|sb| sb.recalc_sector = r)?;
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
