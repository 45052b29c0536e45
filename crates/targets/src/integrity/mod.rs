//! `IntegrityTarget`: the dm-integrity target in userspace, on the kernel's on-disk format.
//!
//! ```text
//!                  read_at / write_at / flush / discard / write_zeroes      (+ TaggedDevice)
//!                                     │
//!        RangeLock: overlapping requests ordered, disjoint ones run in parallel
//!                                     │
//!     ┌───────────── mode J ──────────┼──────── modes D, B ──────────────────────┐
//!     │ journal entries (memory) ─────┤  B: set bitmap bits, write+flush them     │
//!     │ commit: flush/FUA/timer, one  │     first (bitmap.rs)                     │
//!     │   leader, grouped (journal.rs)│  data → data area (split per interleave   │
//!     │ writer thread: copy out at ───┼──►  area), tags → metadata buffers       │
//!     │   the watermark               │                                           │
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
//! | journal writes, commit, `integrity_writer`          | journal.rs: group commit, writer thread      |
//! | bitmap set before write, cleared by a timer          | bitmap.rs, timer thread, clean close        |
//! | dirty bitmap after a crash → `recalc_bitmap`, recalc | B: background, a read recalculates first    |
//! | `recalculate`: background recalc from recalc_sector | background thread, position in `status()`   |
//! | read mismatch: recheck, `-EILSEQ`, counter, log      | re-read once, `IntegrityMismatch`, counter  |
//! | dm-bufio metadata buffers                            | `MetaCache`, per-buffer locks, no RMW knob  |
//! | `crypto_shash` per block                             | inline or on the shared pool ([`HashMode`]) |
//! | a failed metadata/journal write fails the device    | poisoned: writes refused until reopened     |
//! | a failed flush below (`ic->failed` via bufio)       | poisoned too: later flushes/FUA fail         |
//!
//! `journal_crypt`: ctr(aes) and cbc(aes) (`jcrypt`); not chacha20.
//! Not implemented: `meta_device`, inline mode (`I`), shrinking. Growing: grow.rs.
//!
//! **Ownership of the device below.** The target assumes nobody else writes the device while
//! it is open. It keeps the journal (or bitmap) in memory and writes it back on
//! [`Drop`](#impl-Drop-for-IntegrityTarget<D>) (commit and copy-out in J, bitmap cleared and
//! area re-initialised in B), like the kernel's suspend.
//!
//! Files: `mod.rs` (the types and the public accessors), `config.rs` (table options, [`HashMode`], errors, status), `open.rs` (open, resume:
//! journal replay, bitmap recovery, and the clean close), `data.rs` (the request path: reads,
//! writes, tags, flush, discard, zeroes), `background.rs` (commit/bitmap timer,
//! recalculation), `format.rs` (format and wipe), `grow.rs` (growing a closed volume), and the engines: `journal.rs`,
//! `bitmap.rs`, `meta.rs`, `jcrypt.rs`, `tagged.rs`.
mod background;
mod bitmap;
mod config;
mod data;
mod format;
mod grow;
mod jcrypt;
mod journal;
mod meta;
mod open;
mod tagged;

use std::fmt;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Condvar, Mutex, MutexGuard};
use std::thread::JoinHandle;
use std::time::Duration;

use blockdev::{BlockDevice, BlockResult, Geometry, RangeLock};
pub use config::{HashMode, IntegrityConfig, IntegrityError, IntegrityStatus, Mode};
pub use format::{format, FormatOptions};
use formats::integrity::{Layout, Superblock};
pub use jcrypt::{JournalCipher, JournalCrypt, JournalCryptSpec};
use sector_crypto::tag::TagHash;
pub use tagged::TaggedDevice;

use self::bitmap::BitmapState;
use self::journal::Journal;
use self::meta::MetaCache;

/// The superblock as last written, and its encoded area (rewritten in place).
#[derive(Debug)]
struct SbState {
    sb: Superblock,
    area: Vec<u8>,
}

/// Tells the background threads (background.rs) to stop, and wakes them.
#[derive(Debug, Default)]
struct Stop {
    stopped: Mutex<bool>,
    wake: Condvar,
}

/// `Inner::recalc_sector` when the superblock is not RECALCULATING.
const NOT_RECALCULATING: u64 = u64::MAX;

/// The target's state, shared with the background threads (which hold a `Weak`). Its methods
/// live with their concern: open.rs, data.rs, background.rs.
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
    /// Orders background recalculation against journal copy-out (both write tags of blocks
    /// outside any request's range lock): held by the recalc thread per chunk, by copy-out
    /// per written run. Taken after `locks`, never the other way round.
    recalc_locks: RangeLock,
    sb: Mutex<SbState>,
    journal: Option<Journal>,
    /// Blocks in the journal index (read fast path: 0 = no lookup needed).
    journal_blocks: AtomicU64,
    bitmap: Option<Mutex<BitmapState>>,
    /// Dirty bitmap regions not recalculated yet (read fast path: 0 = nothing to settle).
    bitmap_pending: AtomicU64,
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
                let j = j.lock();
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
            bitmap_regions_pending: i.bitmap_pending.load(Ordering::Relaxed),
        }
    }

    /// Waits until background recalculation (`recalculate`, and the dirty regions of mode B
    /// after an unclean stop) finished (tests, `--integrity-recalculate`).
    pub fn wait_recalculated(&self) {
        while (self.inner.recalc_sector.load(Ordering::Relaxed) < self.inner.layout.provided_data_sectors
            || self.inner.bitmap_pending.load(Ordering::Relaxed) > 0)
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
        if let Some(j) = &self.inner.journal {
            j.stop();
        }
        for w in self.workers.drain(..) {
            let _ = w.join();
        }
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
