//! Mode J with the background writer: commits are durable before copy-out, copy-out runs on
//! its own thread without the journal lock, group commit serves concurrent FUA writes.
//!
//! - A crash while a copy-out is stuck (its data-area writes held back by a gate) replays the
//!   committed journal, and reads during the stuck copy-out return the journal's newest copy.
//! - Concurrent writers with FUA and FLUSH, crashing at the n-th flush below: every write
//!   acknowledged as durable before the crash reads back (or a later version of its block).
//! - Background recalculation and copy-out of the same blocks are ordered (a recalculation
//!   chunk that read old data does not overwrite the copy-out's tag).
//! - Mode B after an unclean stop: open does not wait for the dirty regions' recalculation,
//!   and reads meanwhile are verified (a dirty region is recalculated before it is read).

use crate::integrity_common;

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Condvar, Mutex};
use std::time::{Duration, Instant};

use blockdev::{BlockDevice, BlockErrorKind, BlockResult, Caps, Geometry, MemDevice, WriteFlags, ZeroFlags};
use integrity_common::Shape;
use targets::integrity::{IntegrityTarget, Mode};
use testkit::CrashDevice;

/// Holds back writes at or above `from` while closed (the data and tag areas, when `from` is
/// the end of the journal): a copy-out stuck between its commit and its data writes.
#[derive(Debug)]
struct Gate {
    dev: Arc<CrashDevice>,
    from: AtomicU64,
    closed: Mutex<bool>,
    cv: Condvar,
    held: AtomicU64,
}

impl Gate {
    fn new(dev: Arc<CrashDevice>) -> Self {
        Gate {
            dev,
            from: AtomicU64::new(u64::MAX),
            closed: Mutex::new(false),
            cv: Condvar::new(),
            held: AtomicU64::new(0),
        }
    }
    fn close(&self, from: u64) {
        self.from.store(from, Ordering::SeqCst);
        *self.closed.lock().unwrap() = true;
    }
    fn open(&self) {
        *self.closed.lock().unwrap() = false;
        self.cv.notify_all();
    }
    fn pass(&self, off: u64) {
        if off < self.from.load(Ordering::SeqCst) {
            return;
        }
        let mut g = self.closed.lock().unwrap();
        if *g {
            self.held.fetch_add(1, Ordering::SeqCst);
        }
        while *g {
            g = self.cv.wait(g).unwrap();
        }
    }
}

impl BlockDevice for Gate {
    fn geometry(&self) -> Geometry {
        self.dev.geometry()
    }
    fn caps(&self) -> Caps {
        self.dev.caps()
    }
    fn read_at(&self, off: u64, buf: &mut [u8]) -> BlockResult<()> {
        self.dev.read_at(off, buf)
    }
    fn write_at(&self, off: u64, buf: &[u8], flags: WriteFlags) -> BlockResult<()> {
        self.pass(off);
        self.dev.write_at(off, buf, flags)
    }
    fn flush(&self) -> BlockResult<()> {
        self.dev.flush()
    }
    fn discard(&self, off: u64, len: u64) -> BlockResult<()> {
        self.pass(off);
        self.dev.discard(off, len)
    }
    fn write_zeroes(&self, off: u64, len: u64, flags: ZeroFlags) -> BlockResult<()> {
        self.pass(off);
        self.dev.write_zeroes(off, len, flags)
    }
}

fn block(seed: u64, bs: usize) -> Vec<u8> {
    testkit::pattern::pattern(seed, 0, bs)
}

fn wait_until(what: &str, f: impl Fn() -> bool) {
    let t0 = Instant::now();
    while !f() {
        assert!(t0.elapsed() < Duration::from_secs(20), "timed out waiting for {what}");
        std::thread::sleep(Duration::from_millis(1));
    }
}

fn shape(alg: &'static str, bs: u32) -> Shape {
    let mut s = Shape::new(alg, bs);
    s.journal_sectors = Some(2048);
    s.interleave = 256;
    s
}

/// A crash while the writer's copy-out is stuck after its commit: the journal replays; reads
/// meanwhile come from the journal, including a newer copy written during the copy-out.
fn crash_during_copy_out(s: Shape) {
    let bs = s.block as usize;
    let base = s.mem(4 << 20).to_vec();
    let dev = Arc::new(CrashDevice::from_vec(base, 512));
    let gate = Arc::new(Gate::new(dev.clone()));
    let t = IntegrityTarget::open(gate.clone(), s.config(Mode::Journal)).unwrap();
    let l = *t.layout();
    gate.close(l.journal_byte_offset() + l.journal_bytes());
    let (e, sections) = (l.journal.section_entries as u64, l.journal_sections as u64);
    assert!(sections >= 4, "journal too small for the test ({sections} sections)");
    // Just past the watermark (50%): the writer commits (padding the head section) and
    // starts copying out; a free section is left for the FUA write below.
    let n = e * sections - l.free_sectors_threshold(50);
    assert!(n.div_ceil(e) < sections);
    for b in 0..n {
        t.write_at(b * bs as u64, &block(b, bs), WriteFlags::empty()).unwrap();
    }
    wait_until("the copy-out to reach the data area", || gate.held.load(Ordering::SeqCst) > 0);
    let st = t.status();
    assert!(st.journal_commits >= 1, "{st:?}");
    assert_eq!(st.journal_copyouts, 0, "{st:?}");
    // Block 1 is being copied out; its newer copy goes to the journal, durable (FUA).
    t.write_at(bs as u64, &block(1000, bs), WriteFlags::FUA).unwrap();
    let mut buf = vec![0u8; bs];
    for b in 0..n {
        t.read_at(b * bs as u64, &mut buf).unwrap();
        let want = if b == 1 { block(1000, bs) } else { block(b, bs) };
        assert!(buf == want, "block {b} read during the copy-out");
    }
    // Nothing of it reached the data area yet.
    let mut raw = vec![0u8; bs];
    gate.read_at(l.data_sector(0) * 512, &mut raw).unwrap();
    assert!(raw != block(0, bs), "block 0 is in the data area already");
    // Power lost now: the commit made by the writer and the FUA write replay.
    let image = dev.crash();
    gate.open();
    t.close().unwrap();
    let image = MemDevice::from_vec(image.to_vec(), 512);
    let t = IntegrityTarget::open(image, s.config(Mode::Journal)).unwrap();
    for b in 0..n {
        t.read_at(b * bs as u64, &mut buf).unwrap();
        let want = if b == 1 { block(1000, bs) } else { block(b, bs) };
        assert!(buf == want, "block {b} after the crash");
    }
    assert_eq!(t.status().mismatches, 0);
    // And the clean close copied everything out.
    let t =
        IntegrityTarget::open(MemDevice::from_vec(dev.live_image(), 512), s.config(Mode::Direct)).unwrap();
    for b in 0..n {
        t.read_at(b * bs as u64, &mut buf).unwrap();
        let want = if b == 1 { block(1000, bs) } else { block(b, bs) };
        assert!(buf == want, "block {b} after the clean close (mode D: data area only)");
    }
}

#[test]
fn a_crash_between_commit_and_copy_out_replays_and_reads_see_the_journal() {
    crash_during_copy_out(shape("crc32c", 4096));
    crash_during_copy_out(shape("hmac-sha256", 512));
}

const THREADS: u64 = 4;
const PER_THREAD: u64 = 24;

fn version_block(blk: u64, v: u64, bs: usize) -> Vec<u8> {
    let mut d = block(blk.wrapping_mul(0x1_0000_0001) ^ v, bs);
    d[..8].copy_from_slice(&v.to_le_bytes());
    d[8..16].copy_from_slice(&blk.to_le_bytes());
    d
}

/// Concurrent writers over a journal that wraps many times, on `dev` (which may crash). Returns, per block, the newest version acknowledged durable before the crash
/// and the newest version written at all.
fn concurrent_run(s: &Shape, dev: Arc<CrashDevice>, stop_after: u64) -> Vec<(u64, u64)> {
    let bs = s.block as usize;
    let t = Arc::new(s.open(dev.clone(), Mode::Journal));
    let mut hs = Vec::new();
    for th in 0..THREADS {
        let (t, dev) = (t.clone(), dev.clone());
        hs.push(std::thread::spawn(move || {
            let mut x = th + 1;
            let mut written = vec![0u64; PER_THREAD as usize];
            let mut durable = vec![0u64; PER_THREAD as usize];
            for v in 1..=stop_after {
                x = testkit::pattern::splitmix64(x);
                let i = x % PER_THREAD;
                let blk = th * PER_THREAD + i;
                let fua = (x >> 20) % 3 == 0;
                let flags = if fua { WriteFlags::FUA } else { WriteFlags::empty() };
                t.write_at(blk * bs as u64, &version_block(blk, v, bs), flags).unwrap();
                written[i as usize] = v;
                if fua && !dev.has_crashed() {
                    durable[i as usize] = v;
                }
                // Read back own block: the newest copy, wherever it is.
                let mut buf = vec![0u8; bs];
                t.read_at(blk * bs as u64, &mut buf).unwrap();
                assert!(buf == version_block(blk, v, bs), "block {blk} v{v} read back");
                if (x >> 30) % 7 == 0 {
                    t.flush().unwrap();
                    if !dev.has_crashed() {
                        durable.copy_from_slice(&written);
                    }
                }
            }
            (durable, written)
        }));
    }
    let mut out = vec![(0u64, 0u64); (THREADS * PER_THREAD) as usize];
    for (th, h) in hs.into_iter().enumerate() {
        let (d, w) = h.join().unwrap();
        for i in 0..PER_THREAD as usize {
            out[th * PER_THREAD as usize + i] = (d[i], w[i]);
        }
    }
    match Arc::try_unwrap(t) {
        Ok(t) => t.abandon(),
        Err(_) => panic!("target still shared"),
    }
    out
}

fn check(s: &Shape, image: MemDevice, want: &[(u64, u64)], what: &str) {
    let bs = s.block as usize;
    let image = MemDevice::from_vec(image.to_vec(), 512);
    let t = IntegrityTarget::open(image, s.config(Mode::Journal)).unwrap_or_else(|e| panic!("{what}: {e}"));
    let mut buf = vec![0u8; bs];
    for (blk, &(durable, written)) in want.iter().enumerate() {
        let blk = blk as u64;
        t.read_at(blk * bs as u64, &mut buf).unwrap_or_else(|e| panic!("{what}: block {blk}: {e}"));
        let v = u64::from_le_bytes(buf[..8].try_into().unwrap());
        if buf.iter().all(|&b| b == 0) {
            assert_eq!(durable, 0, "{what}: block {blk} lost v{durable} (acknowledged durable)");
            continue;
        }
        assert!(buf == version_block(blk, v, bs), "{what}: block {blk} holds no version written");
        assert!(
            v >= durable && v <= written,
            "{what}: block {blk} has v{v}, durable v{durable}, last v{written}"
        );
    }
    assert_eq!(t.status().mismatches, 0, "{what}");
}

#[test]
fn concurrent_fua_and_flush_are_durable_across_a_crash() {
    let s = shape("crc32c", 4096);
    let base = s.mem(4 << 20).to_vec();
    let probe = Arc::new(CrashDevice::from_vec(base.clone(), 512));
    let want = concurrent_run(&s, probe.clone(), 150);
    check(&s, probe.crash(), &want, "no crash");
    let flushes = probe.flushes();
    assert!(flushes > 20, "only {flushes} flushes");
    for n in (1..flushes).step_by((flushes / 12).max(1) as usize) {
        let dev = Arc::new(CrashDevice::from_vec(base.clone(), 512).crash_at_flush(n));
        let want = concurrent_run(&s, dev.clone(), 150);
        let what = format!("crash at flush {n}/{flushes}");
        check(&s, dev.crash(), &want, &what);
        check(&s, dev.crash_keeping_some(n), &want, &format!("{what} (+cache)"));
    }
}

/// Holds back the recalculation thread (named `thread`) right after its read of a gated offset
/// (old data read, tags not written yet); other reads and all writes pass.
#[derive(Debug)]
struct RecalcGate {
    dev: Arc<MemDevice>,
    thread: &'static str,
    /// (offset, released) per gated read; `arrived` counts reads held.
    gates: Mutex<Vec<(u64, bool)>>,
    cv: Condvar,
    arrived: AtomicU64,
}

impl RecalcGate {
    fn release(&self, off: u64) {
        for g in self.gates.lock().unwrap().iter_mut().filter(|g| g.0 == off) {
            g.1 = true;
        }
        self.cv.notify_all();
    }
}

/// Releases every gate when dropped (a failed assertion must not leave a thread held).
struct ReleaseOnDrop(Arc<RecalcGate>);

impl Drop for ReleaseOnDrop {
    fn drop(&mut self) {
        for g in self.0.gates.lock().unwrap_or_else(|e| e.into_inner()).iter_mut() {
            g.1 = true;
        }
        self.0.cv.notify_all();
    }
}

impl BlockDevice for RecalcGate {
    fn geometry(&self) -> Geometry {
        self.dev.geometry()
    }
    fn caps(&self) -> Caps {
        self.dev.caps()
    }
    fn read_at(&self, off: u64, buf: &mut [u8]) -> BlockResult<()> {
        self.dev.read_at(off, buf)?;
        if std::thread::current().name() == Some(self.thread) {
            let mut g = self.gates.lock().unwrap();
            if g.iter().any(|x| x.0 == off && !x.1) {
                self.arrived.fetch_add(1, Ordering::SeqCst);
                while g.iter().any(|x| x.0 == off && !x.1) {
                    g = self.cv.wait(g).unwrap();
                }
            }
        }
        Ok(())
    }
    fn write_at(&self, off: u64, buf: &[u8], flags: WriteFlags) -> BlockResult<()> {
        self.dev.write_at(off, buf, flags)
    }
    fn flush(&self) -> BlockResult<()> {
        self.dev.flush()
    }
    fn discard(&self, off: u64, len: u64) -> BlockResult<()> {
        self.dev.discard(off, len)
    }
    fn write_zeroes(&self, off: u64, len: u64, flags: ZeroFlags) -> BlockResult<()> {
        self.dev.write_zeroes(off, len, flags)
    }
}

/// Background `recalculate` and journal copy-out write tags of the same blocks outside any
/// request's lock. A recalculation chunk that read a block's old data before a copy-out
/// wrote the block must not write its (old) tag after the copy-out's: the copy-out waits for
/// the chunk, or the block reads back as a mismatch.
#[test]
fn recalculation_and_copy_out_of_the_same_blocks_do_not_interleave() {
    let s = shape("crc32c", 4096);
    let bs = s.block as usize;
    let mem = s.mem(8 << 20);
    let l = *s.open(mem.clone(), Mode::Journal).layout();
    // Recalculation works in chunks of 2048 sectors; hold its first read of chunks 0 and 1.
    let (c0, c1) = (l.data_sector(0) * 512, l.data_sector(2048) * 512);
    let gate = Arc::new(RecalcGate {
        dev: mem,
        thread: "dm-integrity-recalc",
        gates: Mutex::new(vec![(c0, false), (c1, false)]),
        cv: Condvar::new(),
        arrived: AtomicU64::new(0),
    });
    let mut cfg = s.config(Mode::Journal);
    cfg.recalculate = true;
    cfg.allow_discards = true;
    let t = Arc::new(IntegrityTarget::open(gate.clone(), cfg).unwrap());
    wait_until("recalculation to read chunk 0", || gate.arrived.load(Ordering::SeqCst) == 1);
    // A block of chunk 1, durable in the journal, not copied out.
    let at = 2048 * 512 + bs as u64;
    t.write_at(at, &block(7, bs), WriteFlags::FUA).unwrap();
    gate.release(c0);
    // Recalculation now holds chunk 1 and has read its old data.
    wait_until("recalculation to read chunk 1", || gate.arrived.load(Ordering::SeqCst) == 2);
    // A discard elsewhere drains the journal: the copy-out writes the block and its tag.
    let last = t.geometry().size - bs as u64;
    let t2 = t.clone();
    let d = std::thread::spawn(move || t2.discard(last, bs as u64));
    let t0 = Instant::now();
    while !d.is_finished() && t0.elapsed() < Duration::from_millis(500) {
        std::thread::sleep(Duration::from_millis(5));
    }
    gate.release(c1);
    d.join().unwrap().unwrap();
    t.wait_recalculated();
    let mut buf = vec![0u8; bs];
    t.read_at(at, &mut buf).expect("the copied-out block reads back with its own tag");
    assert!(buf == block(7, bs));
    assert_eq!(t.status().mismatches, 0);
}

/// Mode B, reopened after an unclean stop: the dirty regions are recalculated by a background
/// thread (open returns while it is held at its first region), and every read meanwhile is
/// verified: a dirty region not reached yet is recalculated first (a block whose data reached
/// the disk without its tag reads back as that data, not as a mismatch), and a clean region
/// is checked as always (a corrupted block fails). The recalculated tags reach the disk.
#[test]
fn bitmap_recalculation_runs_in_the_background_and_reads_still_verify() {
    let s = shape("crc32c", 4096);
    let bs = s.block as usize;
    let mem = s.mem(8 << 20);
    let mut cfg = s.config(Mode::Bitmap);
    // Regions of 8 blocks.
    cfg.sectors_per_bit = Some(64);
    let region = 64 * 512u64;
    // Region 5: written, then closed cleanly (its bit cleared).
    let clean_at = 5 * region;
    let t = IntegrityTarget::open(mem.clone(), cfg.clone()).unwrap();
    t.write_at(clean_at, &block(1, bs), WriteFlags::empty()).unwrap();
    t.close().unwrap();
    // Regions 1, 2 and 3: written, then a crash (their bits stay set).
    let t = IntegrityTarget::open(mem.clone(), cfg.clone()).unwrap();
    for r in 1..=3 {
        t.write_at(r * region, &block(10 + r, bs), WriteFlags::empty()).unwrap();
    }
    t.flush().unwrap();
    let l = *t.layout();
    t.abandon();
    let raw = move |off: u64| l.data_sector(off / 512) * 512;
    // Below the engine: region 2's block gets new data without its tag (the crash tore the
    // write between data and tag), region 5's block is corrupted.
    mem.write_at(raw(2 * region), &block(99, bs), WriteFlags::empty()).unwrap();
    let mut bad = block(1, bs);
    bad[100] ^= 1;
    mem.write_at(raw(clean_at), &bad, WriteFlags::empty()).unwrap();

    // Reopen with the background thread held at its first read (region 1).
    let gate = Arc::new(RecalcGate {
        dev: mem.clone(),
        thread: "dm-integrity-bitmap-recalc",
        gates: Mutex::new(vec![(raw(region), false)]),
        cv: Condvar::new(),
        arrived: AtomicU64::new(0),
    });
    let t = IntegrityTarget::open(gate.clone(), cfg.clone()).unwrap();
    // Dropped first: a failing assertion releases the thread instead of hanging the close.
    let _release = ReleaseOnDrop(gate.clone());
    wait_until("the background recalculation to reach region 1", || gate.arrived.load(Ordering::SeqCst) == 1);
    assert_eq!(t.status().bitmap_regions_pending, 3, "open recalculated regions itself");
    let mut buf = vec![0u8; bs];
    t.read_at(2 * region, &mut buf).expect("a dirty region not recalculated yet reads back");
    assert!(buf == block(99, bs), "region 2 did not read back as its data");
    assert_eq!(t.status().bitmap_regions_pending, 2, "the read did not recalculate region 2");
    let e = t.read_at(clean_at, &mut buf).expect_err("a corrupted block in a clean region read back");
    assert!(matches!(e.kind(), BlockErrorKind::IntegrityMismatch { .. }), "{e}");
    t.read_at(3 * region, &mut buf).unwrap();
    assert!(buf == block(13, bs));
    assert_eq!(t.status().bitmap_regions_pending, 1);
    gate.release(raw(region));
    t.wait_recalculated();
    assert_eq!(t.status().bitmap_regions_pending, 0);
    t.read_at(region, &mut buf).unwrap();
    assert!(buf == block(11, bs));
    assert_eq!(t.status().mismatches, 1);
    t.close().unwrap();

    // A fresh open: no dirty region left; the recalculated tag of region 2 is on disk.
    let t = IntegrityTarget::open(mem, cfg).unwrap();
    assert_eq!(t.status().bitmap_regions_pending, 0);
    t.read_at(2 * region, &mut buf).unwrap();
    assert!(buf == block(99, bs));
    assert!(t.read_at(clean_at, &mut buf).is_err());
}

/// A clean close with dirty regions not recalculated yet leaves their bits set, and
/// DIRTY_BITMAP: the next open recalculates them (here the read does, verified).
#[test]
fn a_close_before_bitmap_recalculation_leaves_the_regions_dirty() {
    let s = shape("crc32c", 4096);
    let bs = s.block as usize;
    let mem = s.mem(8 << 20);
    let mut cfg = s.config(Mode::Bitmap);
    cfg.sectors_per_bit = Some(64);
    let region = 64 * 512u64;
    let t = IntegrityTarget::open(mem.clone(), cfg.clone()).unwrap();
    t.write_at(region, &block(3, bs), WriteFlags::empty()).unwrap();
    t.write_at(2 * region, &block(5, bs), WriteFlags::empty()).unwrap();
    t.flush().unwrap();
    let l = *t.layout();
    t.abandon();
    let raw = move |off: u64| l.data_sector(off / 512) * 512;
    // Region 2's data changed below without its tag.
    mem.write_at(raw(2 * region), &block(4, bs), WriteFlags::empty()).unwrap();
    let gate = Arc::new(RecalcGate {
        dev: mem.clone(),
        thread: "dm-integrity-bitmap-recalc",
        gates: Mutex::new(vec![(raw(region), false)]),
        cv: Condvar::new(),
        arrived: AtomicU64::new(0),
    });
    let t = IntegrityTarget::open(gate.clone(), cfg.clone()).unwrap();
    wait_until("the background recalculation to reach region 1", || gate.arrived.load(Ordering::SeqCst) == 1);
    // Close while the thread is held in region 1: released once the close asked it to stop,
    // it finishes region 1 and stops before region 2.
    let g2 = gate.clone();
    let releaser = std::thread::spawn(move || {
        std::thread::sleep(Duration::from_millis(300));
        g2.release(raw(region));
    });
    t.close().unwrap();
    releaser.join().unwrap();
    let sb = formats::integrity::Superblock::decode(&mem.to_vec()[..4096]).unwrap();
    assert!(sb.flags.has(formats::integrity::SbFlags::DIRTY_BITMAP), "region 2 was not left dirty");
    let t = IntegrityTarget::open(mem, cfg).unwrap();
    let mut buf = vec![0u8; bs];
    t.read_at(2 * region, &mut buf).expect("the region left dirty reads back");
    assert!(buf == block(4, bs));
    t.read_at(region, &mut buf).unwrap();
    assert!(buf == block(3, bs));
    t.wait_recalculated();
    assert_eq!(t.status().bitmap_regions_pending, 0);
    assert_eq!(t.status().mismatches, 0);
}
