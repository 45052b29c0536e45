//! Mode J: writes go to journal entries in memory, commits stamp and write whole sections, and
//! a writer copies committed sections to the data and tag areas in the background (kernel
//! `dm_integrity_map_continue` journal path, `integrity_commit`, `pad_uncommitted`,
//! `integrity_writer`, `do_journal_write`). Byte formats and the replay rule are in
//! `formats::integrity::journal`; this is the engine around them.
//!
//! ```text
//!  positions are absolute section numbers (slot = n % sections), never decreasing:
//!    copied ≤ durable ≤ stamped ≤ head,   head − copied ≤ sections
//!  │ copied: free │ durable, being copied out │ stamped, commit in flight │ full │ head (partly) │ free │
//!  write:    entries allocated at head in ring order; data, last_bytes and tag copied in
//!            (memory); a full journal makes the writer copy out (or commit) itself
//!  commit:   one leader at a time (group commit): the committer thread as soon as a section
//!            is full, FLUSH/FUA/timer (padding the head section if a waiter needs it); stamps
//!            [stamped, head) with commit_ids[commit_seq] (seq advances on wrap) and section
//!            MACs, then writes them and flushes WITHOUT the lock, then restores the blocks'
//!            last bytes in place; every request waiting for a position below the new
//!            `durable` is released at once
//!  copy-out: one at a time (the writer thread at the watermark, or a writer finding the
//!            journal full, or drain): for durable sections, every entry whose block has no
//!            newer *durable* copy is written to data + tag areas straight from the section
//!            (runs of consecutive entries), flush, then the index forgets the copies still
//!            newest, and the sections are free
//!  reads:    blocks with an entry in `index` are served from the journal
//! ```
//!
//! The lock guards memory only; journal and data-area I/O runs without it. A section is
//! reused only after its copy-out was flushed, and until then it is durable on disk, so a
//! FLUSH needs only the commit (the kernel's rule). Commits are written and flushed strictly
//! in ring order (one leader), so a crash leaves the ring as the replay rule expects. A reader
//! that finds a block in `index` copies it from the journal; a block not in `index` is not
//! being copied out (the index forgets a copy only after its write).
use std::collections::HashMap;
use std::sync::{Arc, Condvar, Mutex, MutexGuard, OnceLock, RwLock, RwLockReadGuard, RwLockWriteGuard};

use blockdev::{AlignedBuf, BlockDevice, BlockError, BlockErrorKind, BlockResult, WriteFlags};
use formats::integrity::journal::{
    self as fj, commit_section, init_section, next_commit_seq, section_mac_bytes, section_mac_input,
    store_section_mac, CommitIds, JournalGeometry, JournalView, SECTOR_HI_UNUSED,
};
use sector_crypto::tag::TagHash;

use super::jcrypt::JournalCrypt;

/// One section of the journal in memory, in an O_DIRECT-aligned buffer of its own. A commit
/// writes stamped sections straight from here, holding only their read locks, while writers
/// fill the head section under its write lock (always another section: the ring never lets
/// the head reach a section not yet copied out). No image copy per commit: copying (and
/// zeroing) a whole section per 4 KiB commit was most of its cost.
type Section = Arc<RwLock<AlignedBuf>>;

fn rd(s: &Section) -> RwLockReadGuard<'_, AlignedBuf> {
    s.read().unwrap_or_else(|e| e.into_inner())
}

fn wr(s: &Section) -> RwLockWriteGuard<'_, AlignedBuf> {
    s.write().unwrap_or_else(|e| e.into_inner())
}

/// The in-memory journal and its positions.
#[derive(Debug)]
pub(crate) struct JournalState {
    /// The sections (plaintext), `sections` of them.
    secs: Vec<Section>,
    pub(crate) geom: JournalGeometry,
    pub(crate) sections: u32,
    pub(crate) ids: CommitIds,
    /// Sequence the section at `stamped` gets.
    pub(crate) commit_seq: u8,
    /// Byte offset of the journal area on the device.
    pub(crate) base: u64,
    /// Section being filled (absolute), and its next free entry.
    head: u64,
    free_entry: u32,
    /// Sections below are stamped (their commit written or being written).
    stamped: u64,
    /// Sections below are committed and durable.
    durable: u64,
    /// Sections below are copied out and free.
    copied: u64,
    /// A commit leader is writing `[durable, stamped)`.
    committing: bool,
    /// A copy-out is running.
    copying: bool,
    /// The writer thread should stop.
    pub(crate) stop: bool,
    /// Newest journal copy of each block (block-aligned logical sector → (absolute section,
    /// entry)).
    index: HashMap<u64, (u64, u32)>,
    /// Copy out when free entries drop to this (`free_sectors_threshold`).
    pub(crate) threshold: u64,
    pub(crate) commits: u64,
    pub(crate) copyouts: u64,
    /// `journal_crypt`: sections are encrypted on their way to the device.
    crypt: Option<Arc<JournalCrypt>>,
}

/// Journal and copy-out writes are cut into pieces of at most this many bytes, written on
/// several threads ([`io_threads`]): the device below takes requests in parallel (the kernel
/// submits many bios at once; one synchronous stream would leave an O_DIRECT file or disk
/// idle).
const IO_PIECE: usize = 256 << 10;
/// Bytes a commit or copy-out keeps in flight, in as many synchronous writes as that takes
/// (at least [`MIN_IO_THREADS`], at most [`MAX_IO_THREADS`]): a copy-out of scattered 4 KiB
/// blocks needs many writes in flight to keep the disk busy (4 threads held 4 KiB random
/// copy-outs to 40k blocks/s where 32 reached 80k), large pieces need few (more threads
/// only contended).
const IO_IN_FLIGHT: usize = 1 << 20;
const MIN_IO_THREADS: usize = 4;
const MAX_IO_THREADS: usize = 32;

/// How many threads write `items` pieces of `bytes` in all, at most `cap` (0: no cap).
fn io_threads(items: usize, bytes: usize, cap: usize) -> usize {
    let avg = (bytes / items.max(1)).max(1);
    let cap = if cap == 0 { MAX_IO_THREADS } else { cap.min(MAX_IO_THREADS) };
    (IO_IN_FLIGHT / avg).clamp(MIN_IO_THREADS, MAX_IO_THREADS).min(items).min(cap)
}

/// I/O threads (`dm-integrity-io-N` for commits, `dm-integrity-co-N` for copy-outs), one
/// pool per kind and journal, started on first use: a thread spawned per commit cost more
/// than a small commit itself, and separate pools keep a slow copy-out from holding up a
/// commit (one commit and one copy-out run at a time per journal).
#[derive(Debug, Default)]
struct IoPool(OnceLock<Option<rayon::ThreadPool>>);

impl IoPool {
    /// The pool, started on the first call that needs more than one thread.
    fn get(&self, prefix: &'static str, threads: usize) -> Option<&rayon::ThreadPool> {
        if threads <= 1 {
            return None;
        }
        self.0
            .get_or_init(|| {
                rayon::ThreadPoolBuilder::new()
                    .num_threads(MAX_IO_THREADS)
                    .thread_name(move |i| format!("{prefix}-{i}"))
                    .build()
                    .map_err(|e| log::warn!("dm-integrity: no journal I/O threads ({e}); writing serially"))
                    .ok()
            })
            .as_ref()
    }
}

/// Runs `f` on every item, spread over `threads` threads of `pool` (serially for one item, or
/// without a pool); the first error.
fn parallel<T: Sync>(
    pool: Option<&rayon::ThreadPool>,
    items: &[T],
    threads: usize,
    f: impl Fn(&T) -> BlockResult<()> + Sync,
) -> BlockResult<()> {
    let pool = match pool {
        Some(p) if threads > 1 => p,
        _ => return items.iter().try_for_each(&f),
    };
    let n = items.len().min(threads);
    let first: Mutex<Option<BlockError>> = Mutex::new(None);
    let run = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| {
        pool.scope(|s| {
            for t in 0..n {
                let (f, first) = (&f, &first);
                s.spawn(move |_| {
                    if let Err(e) = items.iter().skip(t).step_by(n).try_for_each(f) {
                        first.lock().unwrap_or_else(|e| e.into_inner()).get_or_insert(e);
                    }
                });
            }
        })
    }));
    if run.is_err() {
        return Err(BlockError::new(BlockErrorKind::Io, "a journal I/O thread panicked"));
    }
    match first.into_inner().unwrap_or_else(|e| e.into_inner()) {
        Some(e) => Err(e),
        None => Ok(()),
    }
}

/// What the journal needs from the engine to copy entries out and to MAC sections.
pub(crate) trait JournalSink: Sync {
    /// The device below.
    type Dev: BlockDevice;
    /// The device below.
    fn dev(&self) -> &Self::Dev;
    /// Writes `data` (whole blocks from logical sector `sector`, one area) and `tags`.
    fn write_blocks(&self, sector: u64, data: &[u8], tags: &[u8]) -> BlockResult<()>;
    /// Writes dirty tag buffers and flushes the device below.
    fn flush_all(&self) -> BlockResult<()>;
    /// The journal MAC and the FIXED_HMAC salt, if any.
    fn journal_mac(&self) -> Option<(&TagHash, Option<&[u8; 16]>)>;
    /// An earlier failure fails every later journal operation.
    fn failed(&self) -> Option<BlockError>;
    /// Records a failure (the device refuses writes until reopened).
    fn fail(&self, what: &str, e: &BlockError);
}

/// One run a copy-out writes: consecutive entries of one section holding consecutive
/// blocks, so that their data lies contiguous in the section buffer.
#[derive(Debug, Clone, Copy)]
struct Run {
    /// Logical sector of the first block.
    sector: u64,
    /// Absolute section.
    sec: u64,
    /// First entry, and the number of entries.
    first: u32,
    n: u32,
}

/// The copy-out runs cut into pieces of at most [`IO_PIECE`] bytes.
fn copy_pieces(runs: &[Run], bs: usize) -> Vec<Run> {
    let per = (IO_PIECE / bs).max(1) as u32;
    let spb = bs as u64 / 512;
    runs.iter()
        .flat_map(|r| {
            (0..r.n).step_by(per as usize).map(move |k| Run {
                sector: r.sector + u64::from(k) * spb,
                sec: r.sec,
                first: r.first + k,
                n: per.min(r.n - k),
            })
        })
        .collect()
}

/// Writes one copy-out piece straight from its section buffer: the commit that made the
/// section durable restored the blocks' last bytes in place (`restore_section`), so the
/// entries' data sectors hold the blocks as written. Runs on the copy-out threads without
/// the journal lock: durable sections do not change until their copy-out has finished.
fn write_piece<S: JournalSink>(
    sink: &S,
    geom: &JournalGeometry,
    secs: &[Section],
    p: &Run,
) -> BlockResult<()> {
    let bs = geom.sectors_per_block() as usize * 512;
    let g = rd(&secs[(p.sec % secs.len() as u64) as usize]);
    let b = g.as_slice();
    let mut tags = Vec::with_capacity(p.n as usize * geom.tag_size as usize);
    for e in p.first..p.first + p.n {
        tags.extend_from_slice(fj::entry_tag(geom, b, e));
    }
    let start = geom.data_sector(p.first) as usize * 512;
    sink.write_blocks(p.sector, &b[start..start + p.n as usize * bs], &tags)
}

/// Restores the last bytes of every entry in use in section `s`, in place, once its commit
/// is durable (what `do_journal_write` does before it writes the blocks out).
fn restore_section(geom: &JournalGeometry, s: &Section) {
    let mut g = wr(s);
    let b = g.as_mut_slice();
    for e in 0..geom.section_entries {
        fj::restore_entry(geom, b, e);
    }
}

impl JournalState {
    /// A journal continuing at `section` with `commit_seq` (after replay), every entry unused
    /// in memory.
    #[allow(clippy::too_many_arguments)]
    pub(crate) fn new(
        bytes: &[u8],
        geom: JournalGeometry,
        sections: u32,
        base: u64,
        section: u32,
        commit_seq: u8,
        threshold: u64,
        crypt: Option<Arc<JournalCrypt>>,
    ) -> Self {
        let s = section as u64;
        let sb = geom.section_bytes();
        let secs = (0..sections as usize)
            .map(|i| {
                let mut b = AlignedBuf::for_direct_io(sb);
                b.as_mut_slice().copy_from_slice(&bytes[i * sb..(i + 1) * sb]);
                Arc::new(RwLock::new(b))
            })
            .collect();
        let mut j = JournalState {
            secs,
            geom,
            sections,
            ids: crypt.as_ref().map_or_else(CommitIds::plain, |c| c.commit_ids()),
            commit_seq,
            base,
            head: s,
            free_entry: 0,
            stamped: s,
            durable: s,
            copied: s,
            committing: false,
            copying: false,
            stop: false,
            index: HashMap::new(),
            threshold,
            commits: 0,
            copyouts: 0,
            crypt,
        };
        for i in 0..sections {
            j.set_all_unused(i);
        }
        j
    }

    /// The whole journal (plaintext), as on the device unencrypted.
    pub(crate) fn to_bytes(&self) -> Vec<u8> {
        let mut v = Vec::with_capacity(self.sections as usize * self.geom.section_bytes());
        for s in &self.secs {
            v.extend_from_slice(rd(s).as_slice());
        }
        v
    }

    fn slot(&self, abs: u64) -> u32 {
        (abs % self.sections as u64) as u32
    }

    /// Marks every entry of section `i` unused.
    fn set_all_unused(&mut self, i: u32) {
        let mut g = wr(&self.secs[i as usize]);
        let b = g.as_mut_slice();
        for e in 0..self.geom.section_entries {
            let off = self.geom.entry_offset(e);
            b[off + 4..off + 8].copy_from_slice(&SECTOR_HI_UNUSED.to_le_bytes());
        }
    }

    /// Sections that hold entries (the partly filled head included): what a FLUSH must make
    /// durable.
    pub(crate) fn filled(&self) -> u64 {
        self.head + u64::from(self.free_entry > 0)
    }

    /// Whether anything is waiting to be committed.
    pub(crate) fn has_uncommitted(&self) -> bool {
        self.filled() > self.durable
    }

    /// Blocks whose newest copy is in the journal (not yet copied out).
    pub(crate) fn pending_entries(&self) -> usize {
        self.index.len()
    }

    /// Entries still free for writes.
    pub(crate) fn free_entries(&self) -> u64 {
        let used = self.head - self.copied;
        (self.sections as u64 - used) * self.geom.section_entries as u64 - self.free_entry as u64
    }

    /// Whether the writer should commit and copy out (the watermark).
    pub(crate) fn wants_copy_out(&self) -> bool {
        self.free_entries() <= self.threshold && self.filled() > self.copied
    }

    fn alloc(&mut self) -> Option<(u64, u32)> {
        if self.head - self.copied >= self.sections as u64 {
            return None;
        }
        let pos = (self.head, self.free_entry);
        self.free_entry += 1;
        if self.free_entry == self.geom.section_entries {
            self.free_entry = 0;
            self.head += 1;
        }
        Some(pos)
    }

    /// Copies the newest journal copy of block `sector` into `out` (one block) and its tag
    /// into `tag`; false if the block is not in the journal.
    pub(crate) fn read_block(&self, sector: u64, out: &mut [u8], tag: Option<&mut [u8]>) -> bool {
        let Some(&(a, e)) = self.index.get(&sector) else { return false };
        let g = rd(&self.secs[self.slot(a) as usize]);
        let Ok(view) = JournalView::new(self.geom, 1, g.as_slice()) else { return false };
        out.copy_from_slice(&view.entry_data(0, e));
        if let Some(t) = tag {
            t.copy_from_slice(&view.entry(0, e).tag);
        }
        true
    }

    /// Computes and stores section `i`'s MAC, when the journal has one.
    fn mac_section<S: JournalSink>(&mut self, sink: &S, i: u32) {
        if let Some((mac, salt)) = sink.journal_mac() {
            let mut g = wr(&self.secs[i as usize]);
            let input = section_mac_input(&self.geom, g.as_slice(), i, salt);
            let m = section_mac_bytes(&mac.mac(&input));
            store_section_mac(g.as_mut_slice(), &m);
        }
    }

    /// What goes to the device for `n` sections from slot `start` (wrapping): (byte offset on
    /// the device, section). The sections themselves, or with journal_crypt their encrypted
    /// copies.
    fn images(&self, start: u32, n: u32) -> Vec<(u64, Section)> {
        let sb = self.geom.section_bytes() as u64;
        (0..n)
            .map(|k| {
                let i = (start + k) % self.sections;
                let s = &self.secs[i as usize];
                let img = match &self.crypt {
                    None => s.clone(),
                    Some(c) => {
                        let mut v = AlignedBuf::for_direct_io(sb as usize);
                        v.as_mut_slice().copy_from_slice(rd(s).as_slice());
                        c.encrypt(i, v.as_mut_slice());
                        Arc::new(RwLock::new(v))
                    }
                };
                (self.base + i as u64 * sb, img)
            })
            .collect()
    }

    /// Writes `n` sections from slot `start` (wrapping) to the device.
    fn write_sections<D: BlockDevice>(&self, dev: &D, start: u32, n: u32) -> BlockResult<()> {
        for (off, s) in self.images(start, n) {
            dev.write_at(off, rd(&s).as_slice(), WriteFlags::empty())?;
        }
        Ok(())
    }

    /// Pads the head section (its unused entries stay unused) and stamps every full section
    /// not stamped yet (commit ids with the current sequence, MACs); returns the device images
    /// and the new `stamped`.
    fn stamp<S: JournalSink>(&mut self, sink: &S, pad: bool) -> (Vec<(u64, Section)>, u64) {
        if pad && self.free_entry != 0 {
            self.free_entry = 0;
            self.head += 1;
        }
        let start = self.stamped;
        let n = (self.head - start) as u32;
        if n == 0 {
            return (Vec::new(), start);
        }
        let first = self.slot(start);
        let mut i = first;
        for _ in 0..n {
            commit_section(
                &self.geom,
                &self.ids,
                wr(&self.secs[i as usize]).as_mut_slice(),
                i,
                self.commit_seq,
            );
            self.mac_section(sink, i);
            i += 1;
            if i >= self.sections {
                self.commit_seq = next_commit_seq(self.commit_seq);
                i = 0;
            }
        }
        self.stamped = self.head;
        (self.images(first, n), self.head)
    }

    /// Plans a copy-out of `[copied, durable)`: the runs to write, and the new `copied`.
    fn plan_copy_out(&self) -> BlockResult<(Vec<Run>, u64)> {
        let spb = self.geom.sectors_per_block() as u64;
        let entries = self.geom.section_entries;
        let guards: Vec<_> = self.secs.iter().map(rd).collect();
        // (Only the sections to copy out are read below.)
        let views = guards
            .iter()
            .map(|g| JournalView::new(self.geom, 1, g.as_slice()))
            .collect::<Result<Vec<_>, _>>()
            .map_err(|e| {
                BlockError::new(BlockErrorKind::Io, "the journal does not fit its geometry").with_source(e)
            })?;
        let view = |i: u32| &views[i as usize];
        // Write this copy unless a newer copy of the block is durable too (it is then written
        // later in this copy-out, or replayed after it by a crash): the kernel's
        // `find_newer_committed_node`. A newer copy not yet durable does not count.
        let wanted = |sec: u64, a: u64, e: u32| match self.index.get(&sec) {
            Some(&(na, ne)) => (na, ne) == (a, e) || na >= self.durable,
            None => false,
        };
        // Runs of consecutive blocks in consecutive entries of one section; the copy-out
        // threads write them from the section buffers (`write_piece`).
        let mut runs: Vec<Run> = Vec::new();
        for a in self.copied..self.durable {
            let i = self.slot(a);
            for j in 0..entries {
                let fj::EntryState::Sector(sec) = view(i).entry(0, j).state() else { continue };
                if !wanted(sec, a, j) {
                    continue;
                }
                // The sink splits a merged write at interleave-area boundaries.
                match runs.last_mut() {
                    Some(r) if r.sec == a && r.first + r.n == j && r.sector + u64::from(r.n) * spb == sec => {
                        r.n += 1
                    }
                    _ => runs.push(Run { sector: sec, sec: a, first: j, n: 1 }),
                }
            }
        }
        Ok((runs, self.durable))
    }

    /// After a copy-out up to `upto` was written and flushed: the index forgets the copies
    /// still newest, the sections' entries become unused, the sections free.
    fn finish_copy_out(&mut self, runs: &[Run], upto: u64) {
        let spb = self.geom.sectors_per_block() as u64;
        for r in runs {
            for k in 0..r.n {
                let sec = r.sector + u64::from(k) * spb;
                if self.index.get(&sec) == Some(&(r.sec, r.first + k)) {
                    self.index.remove(&sec);
                }
            }
        }
        for a in self.copied..upto {
            self.set_all_unused(self.slot(a));
        }
        self.copyouts += runs.len() as u64;
        self.copied = upto;
    }

    /// `init_journal` of every section with `seq` (in memory; the caller writes it).
    pub(crate) fn init_all<S: JournalSink>(&mut self, sink: &S, seq: u8) {
        for i in 0..self.sections {
            init_section(&self.geom, &self.ids, wr(&self.secs[i as usize]).as_mut_slice(), i, seq);
            self.mac_section(sink, i);
        }
    }

    /// Writes the whole journal area.
    pub(crate) fn write_all<D: BlockDevice>(&self, dev: &D) -> BlockResult<()> {
        self.write_sections(dev, 0, self.sections)
    }

    /// Re-initialises the listed sections (a replay's `Clear`), in memory and on disk.
    pub(crate) fn clear<S: JournalSink>(&mut self, sink: &S, list: &[(u32, u8)]) -> BlockResult<()> {
        for &(i, seq) in list {
            init_section(&self.geom, &self.ids, wr(&self.secs[i as usize]).as_mut_slice(), i, seq);
            self.mac_section(sink, i);
            self.write_sections(sink.dev(), i, 1)?;
        }
        if !list.is_empty() {
            sink.dev().flush()?;
        }
        Ok(())
    }
}

/// The journal shared by request threads, the timer and the writer thread: the state, and
/// one condition variable for every wait (durable advanced, sections freed, work for the
/// writer, stop).
#[derive(Debug)]
pub(crate) struct Journal {
    state: Mutex<JournalState>,
    cv: Condvar,
    commit_io: IoPool,
    copy_io: IoPool,
    /// `IntegrityConfig::journal_io_threads`.
    io_cap: usize,
}

fn lock(m: &Mutex<JournalState>) -> MutexGuard<'_, JournalState> {
    m.lock().unwrap_or_else(|e| e.into_inner())
}

type Guard<'a> = MutexGuard<'a, JournalState>;

impl Journal {
    pub(crate) fn new(state: JournalState, io_cap: usize) -> Self {
        Journal {
            state: Mutex::new(state),
            cv: Condvar::new(),
            commit_io: IoPool::default(),
            copy_io: IoPool::default(),
            io_cap,
        }
    }

    /// The state (counters, reads).
    pub(crate) fn lock(&self) -> Guard<'_> {
        lock(&self.state)
    }

    fn wait<'a>(&self, g: Guard<'a>) -> Guard<'a> {
        self.cv.wait(g).unwrap_or_else(|e| e.into_inner())
    }

    /// Puts `data` (whole blocks from `sector`) with `tags` into journal entries; when the
    /// journal is full, commits and copies out (or waits for the writer doing it). With `fua`,
    /// returns once the entries are durable. Returns the number of blocks in the index.
    pub(crate) fn write<S: JournalSink>(
        &self,
        sink: &S,
        sector: u64,
        data: &[u8],
        tags: &[u8],
        fua: bool,
    ) -> BlockResult<usize> {
        let mut j = self.lock();
        let head = j.head;
        let spb = j.geom.sectors_per_block() as u64;
        let bs = spb as usize * 512;
        let ts = j.geom.tag_size as usize;
        for (b, block) in data.chunks_exact(bs).enumerate() {
            let (a, e) = loop {
                if let Some(p) = j.alloc() {
                    break p;
                }
                j = self.make_room(sink, j)?;
            };
            let s = sector + b as u64 * spb;
            let i = j.slot(a);
            fj::write_entry(
                &j.geom,
                wr(&j.secs[i as usize]).as_mut_slice(),
                e,
                s,
                block,
                &tags[b * ts..(b + 1) * ts],
            );
            j.index.insert(s, (a, e));
        }
        if fua {
            let target = j.filled();
            j = self.commit_upto(sink, j, target)?;
        }
        if j.wants_copy_out() || (j.head > head && !j.committing) {
            // Work for the writer, or full sections for the committer.
            self.cv.notify_all();
        }
        Ok(j.pending_entries())
    }

    /// The journal is full: one step towards room, here or by whoever is already at it (the
    /// caller tries again): wait for a copy-out or commit running, copy out what is durable,
    /// or commit.
    fn make_room<'a, S: JournalSink>(&'a self, sink: &S, j: Guard<'a>) -> BlockResult<Guard<'a>> {
        if let Some(e) = sink.failed() {
            return Err(e);
        }
        if j.copying || (j.durable == j.copied && j.committing) {
            return Ok(self.wait(j));
        }
        if j.durable > j.copied {
            return self.copy_out(sink, j);
        }
        let target = j.filled();
        self.commit_upto(sink, j, target)
    }

    /// Returns once sections below `target` are durable: either a commit in flight covers
    /// them, or this thread becomes the leader and commits everything stamped by then (group
    /// commit). `target` above `head` pads the head section.
    pub(crate) fn commit_upto<'a, S: JournalSink>(
        &'a self,
        sink: &S,
        mut j: Guard<'a>,
        target: u64,
    ) -> BlockResult<Guard<'a>> {
        loop {
            if let Some(e) = sink.failed() {
                return Err(e);
            }
            if j.durable >= target {
                return Ok(j);
            }
            if j.committing {
                j = self.wait(j);
                continue;
            }
            let pad = target > j.head;
            let from = j.stamped;
            let (images, upto) = j.stamp(sink, pad);
            let written: Vec<Section> = (from..upto).map(|a| j.secs[j.slot(a) as usize].clone()).collect();
            let geom = j.geom;
            if upto < target {
                // Cannot happen: `target` never passes what stamping can reach.
                return Err(BlockError::new(BlockErrorKind::Io, "journal commit target beyond the journal"));
            }
            j.committing = true;
            drop(j);
            // One write per section, straight from its buffer (a torn commit is caught by
            // the replay's commit-id check whatever the pieces are).
            let threads = io_threads(images.len(), images.len() * geom.section_bytes(), self.io_cap);
            let pool = self.commit_io.get("dm-integrity-io", threads);
            let r = parallel(pool, &images, threads, |(off, s)| {
                sink.dev().write_at(*off, rd(s).as_slice(), WriteFlags::empty())
            })
            .and_then(|_| sink.dev().flush());
            if r.is_ok() {
                // Durable: the blocks' last bytes go back in place for the copy-out to write
                // them straight from the sections. Still outside [copied, durable), so no
                // copy-out reads them meanwhile; readers restore from the entries either way.
                for s in &written {
                    restore_section(&geom, s);
                }
            }
            j = self.lock();
            j.committing = false;
            self.cv.notify_all();
            if let Err(e) = r {
                sink.fail("committing the journal", &e);
                return Err(e);
            }
            j.durable = upto;
            j.commits += 1;
        }
    }

    /// Copies every durable section out (one copy-out at a time; if one is running, waits for
    /// it instead), flushes, frees the sections.
    pub(crate) fn copy_out<'a, S: JournalSink>(
        &'a self,
        sink: &S,
        mut j: Guard<'a>,
    ) -> BlockResult<Guard<'a>> {
        loop {
            if let Some(e) = sink.failed() {
                return Err(e);
            }
            if !j.copying {
                break;
            }
            j = self.wait(j);
            // The copy-out that was running freed what it could.
            if j.free_entries() > 0 {
                return Ok(j);
            }
        }
        if j.durable == j.copied {
            return Ok(j);
        }
        let (runs, upto) = j.plan_copy_out()?;
        let (geom, secs) = (j.geom, j.secs.clone());
        j.copying = true;
        drop(j);
        let pieces = copy_pieces(&runs, geom.sectors_per_block() as usize * 512);
        let bytes =
            pieces.iter().map(|p| p.n as usize).sum::<usize>() * geom.sectors_per_block() as usize * 512;
        let threads = io_threads(pieces.len(), bytes, self.io_cap);
        let pool = self.copy_io.get("dm-integrity-co", threads);
        let r = parallel(pool, &pieces, threads, |p| write_piece(sink, &geom, &secs, p))
            .and_then(|_| sink.flush_all());
        let mut j = self.lock();
        j.copying = false;
        if let Err(e) = r {
            self.cv.notify_all();
            sink.fail("copying the journal out", &e);
            return Err(e);
        }
        j.finish_copy_out(&runs, upto);
        self.cv.notify_all();
        Ok(j)
    }

    /// FLUSH: every entry written so far is durable when this returns.
    pub(crate) fn flush<S: JournalSink>(&self, sink: &S) -> BlockResult<()> {
        let j = self.lock();
        let target = j.filled();
        self.commit_upto(sink, j, target).map(drop)
    }

    /// Commits and copies out everything written before the call (discard, close). Returns
    /// the number of blocks left in the index.
    pub(crate) fn drain<S: JournalSink>(&self, sink: &S) -> BlockResult<usize> {
        let mut j = self.lock();
        let target = j.filled();
        while j.copied < target {
            j = self.commit_upto(sink, j, target)?;
            j = self.copy_out(sink, j)?;
        }
        Ok(j.pending_entries())
    }

    /// The writer thread's loop: at the watermark, copy out what is durable; when nothing is
    /// and no commit is running (every entry in the head section), commit, padding the head.
    /// Until [`stop`](Self::stop).
    pub(crate) fn writer_loop<S: JournalSink>(&self, sink: &S) {
        let mut j = self.lock();
        loop {
            if j.stop || sink.failed().is_some() {
                return;
            }
            if !j.wants_copy_out() || (j.durable == j.copied && j.committing) {
                j = self.wait(j);
                continue;
            }
            let r = if j.durable > j.copied {
                self.copy_out(sink, j)
            } else {
                let target = j.filled();
                self.commit_upto(sink, j, target)
            };
            j = match r {
                Ok(j) => j,
                Err(_) => return,
            };
        }
    }

    /// The committer thread's loop: commits full sections as soon as they are full and no
    /// commit is running (grouping whatever filled meanwhile), so that the writer finds them
    /// durable at the watermark and copies out while the next ones commit: the journal and
    /// the data area are written side by side instead of one after the other. Never pads the
    /// head (FLUSH, FUA and the timer do). Until [`stop`](Self::stop).
    pub(crate) fn committer_loop<S: JournalSink>(&self, sink: &S) {
        let mut j = self.lock();
        loop {
            if j.stop || sink.failed().is_some() {
                return;
            }
            if j.committing || j.head <= j.stamped {
                j = self.wait(j);
                continue;
            }
            let target = j.head;
            j = match self.commit_upto(sink, j, target) {
                Ok(j) => j,
                Err(_) => return,
            };
        }
    }

    /// Stops the writer thread.
    pub(crate) fn stop(&self) {
        self.lock().stop = true;
        self.cv.notify_all();
    }
}
