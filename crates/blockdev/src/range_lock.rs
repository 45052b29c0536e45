//! Byte-range locks: requests to disjoint ranges never wait for each other; overlapping ones
//! are ordered first come, first served.
//!
//! ```text
//!   held:     [==== read A ====]        [== write C ==]
//!   arriving:        [== write B ==]                     [= read D =]
//!                     waits for A                         proceeds at once
//! ```
//!
//! Shared (read) ranges overlap freely; an exclusive (write) range excludes every overlapping
//! range. A request also waits for *earlier waiting* requests it conflicts with, so a stream of
//! readers cannot starve a writer. Each request holds one range at a time, so there is no
//! lock-order deadlock. The bookkeeping is a short critical section under one mutex; I/O runs
//! outside it.
//!
//! [`RangeLocked`] applies it to any device, which is how a buffered [`crate::FileDevice`] gets
//! the contract's "a read concurrent with an overlapping write sees, per block, old or new"
//! (Linux's page cache copies without locking the page for readers, so unlocked buffered reads
//! can see half of a concurrent write).

use std::sync::{Condvar, Mutex, MutexGuard};

use crate::{BlockDevice, BlockResult, Caps, Extent, Geometry, WriteFlags, ZeroFlags};

#[derive(Debug, Clone, Copy)]
struct Range {
    ticket: u64,
    start: u64,
    end: u64,
    exclusive: bool,
}

impl Range {
    fn conflicts(&self, other: &Range) -> bool {
        (self.exclusive || other.exclusive) && self.start < other.end && other.start < self.end
    }
}

#[derive(Debug, Default)]
struct State {
    next_ticket: u64,
    held: Vec<Range>,
    waiting: Vec<Range>,
}

/// Shared/exclusive locks over byte ranges (see the module docs).
#[derive(Debug, Default)]
pub struct RangeLock {
    state: Mutex<State>,
    released: Condvar,
}

/// Holds a range of a [`RangeLock`] until dropped.
#[derive(Debug)]
#[must_use = "the range is unlocked when the guard is dropped"]
pub struct RangeGuard<'a> {
    lock: &'a RangeLock,
    /// `None` for an empty range, which locks nothing.
    ticket: Option<u64>,
}

impl RangeLock {
    /// A lock with nothing held.
    pub fn new() -> Self {
        Self::default()
    }

    /// Locks `[off, off+len)` shared: waits only for overlapping exclusive holders (and
    /// overlapping exclusive requests that arrived first).
    pub fn read(&self, off: u64, len: u64) -> RangeGuard<'_> {
        self.acquire(off, len, false)
    }

    /// Locks `[off, off+len)` exclusively: waits for every overlapping holder (and overlapping
    /// request that arrived first).
    pub fn write(&self, off: u64, len: u64) -> RangeGuard<'_> {
        self.acquire(off, len, true)
    }

    fn lock(&self) -> MutexGuard<'_, State> {
        // The state is consistent after every critical section, so a panic elsewhere while
        // holding the mutex cannot leave it half-updated.
        self.state.lock().unwrap_or_else(|e| e.into_inner())
    }

    fn acquire(&self, off: u64, len: u64, exclusive: bool) -> RangeGuard<'_> {
        if len == 0 {
            return RangeGuard { lock: self, ticket: None };
        }
        let mut st = self.lock();
        let ticket = st.next_ticket;
        st.next_ticket += 1;
        let me = Range { ticket, start: off, end: off.saturating_add(len), exclusive };
        let blocked = |st: &State| {
            st.held.iter().any(|h| h.conflicts(&me))
                || st.waiting.iter().any(|w| w.ticket < ticket && w.conflicts(&me))
        };
        if blocked(&st) {
            st.waiting.push(me);
            while blocked(&st) {
                st = self.released.wait(st).unwrap_or_else(|e| e.into_inner());
            }
            st.waiting.retain(|w| w.ticket != ticket);
        }
        st.held.push(me);
        RangeGuard { lock: self, ticket: Some(ticket) }
    }

    fn release(&self, ticket: u64) {
        let mut st = self.lock();
        st.held.retain(|h| h.ticket != ticket);
        drop(st);
        self.released.notify_all();
    }
}

impl Drop for RangeGuard<'_> {
    fn drop(&mut self) {
        if let Some(ticket) = self.ticket {
            self.lock.release(ticket);
        }
    }
}

/// Wraps a device so that overlapping requests never run at the same time: reads share their
/// range, writes, discards and write-zeroes hold theirs exclusively; disjoint requests and
/// `flush` are not held up.
#[derive(Debug)]
pub struct RangeLocked<D> {
    inner: D,
    locks: RangeLock,
}

impl<D: BlockDevice> RangeLocked<D> {
    /// Wraps `inner`.
    pub fn new(inner: D) -> Self {
        RangeLocked { inner, locks: RangeLock::new() }
    }

    /// The wrapped device.
    pub fn inner(&self) -> &D {
        &self.inner
    }

    /// Gives back the wrapped device.
    pub fn into_inner(self) -> D {
        self.inner
    }
}

impl<D: BlockDevice> BlockDevice for RangeLocked<D> {
    fn geometry(&self) -> Geometry {
        self.inner.geometry()
    }

    fn caps(&self) -> Caps {
        self.inner.caps()
    }

    fn read_at(&self, off: u64, buf: &mut [u8]) -> BlockResult<()> {
        self.inner.geometry().check_range(off, buf.len() as u64)?;
        let _g = self.locks.read(off, buf.len() as u64);
        self.inner.read_at(off, buf)
    }

    fn write_at(&self, off: u64, buf: &[u8], flags: WriteFlags) -> BlockResult<()> {
        self.inner.geometry().check_range(off, buf.len() as u64)?;
        let _g = self.locks.write(off, buf.len() as u64);
        self.inner.write_at(off, buf, flags)
    }

    fn flush(&self) -> BlockResult<()> {
        self.inner.flush()
    }

    fn discard(&self, off: u64, len: u64) -> BlockResult<()> {
        self.inner.geometry().check_range(off, len)?;
        let _g = self.locks.write(off, len);
        self.inner.discard(off, len)
    }

    fn write_zeroes(&self, off: u64, len: u64, flags: ZeroFlags) -> BlockResult<()> {
        self.inner.geometry().check_range(off, len)?;
        let _g = self.locks.write(off, len);
        self.inner.write_zeroes(off, len, flags)
    }

    /// Not ordered against writes: an allocation answer describes one moment anyway.
    fn allocation(&self, off: u64, len: u64, max_extents: usize) -> BlockResult<Vec<Extent>> {
        self.inner.allocation(off, len, max_extents)
    }
}

#[cfg(test)]
mod tests {
    use std::sync::atomic::{AtomicBool, AtomicU32, Ordering};
    use std::sync::Arc;
    use std::thread;
    use std::time::Duration;

    use super::*;

    /// Spawns `f` and reports whether it finished within a short wait.
    fn finishes_soon(f: impl FnOnce() + Send + 'static) -> (thread::JoinHandle<()>, Arc<AtomicBool>) {
        let done = Arc::new(AtomicBool::new(false));
        let d = done.clone();
        let h = thread::spawn(move || {
            f();
            d.store(true, Ordering::SeqCst);
        });
        (h, done)
    }

    fn wait_a_bit() {
        thread::sleep(Duration::from_millis(50));
    }

    #[test]
    fn disjoint_writes_proceed_when_one_is_held() {
        let l = Arc::new(RangeLock::new());
        let _held = l.write(0, 4096);
        let l2 = l.clone();
        let (h, done) = finishes_soon(move || drop(l2.write(4096, 4096)));
        h.join().unwrap();
        assert!(done.load(Ordering::SeqCst));
    }

    #[test]
    fn overlapping_reads_share_when_no_writer() {
        let l = RangeLock::new();
        let _a = l.read(0, 8192);
        let _b = l.read(4096, 8192);
        let _c = l.write(0, 0); // empty: locks nothing
    }

    #[test]
    fn overlapping_write_waits_when_read_is_held() {
        let l = Arc::new(RangeLock::new());
        let held = l.read(0, 4096);
        let l2 = l.clone();
        let (h, done) = finishes_soon(move || drop(l2.write(4095, 2)));
        wait_a_bit();
        assert!(!done.load(Ordering::SeqCst), "writer ran while an overlapping read was held");
        drop(held);
        h.join().unwrap();
        assert!(done.load(Ordering::SeqCst));
    }

    #[test]
    fn later_reader_waits_when_earlier_writer_is_waiting() {
        let l = Arc::new(RangeLock::new());
        let held = l.read(0, 4096);
        let l2 = l.clone();
        let (writer, writer_done) = finishes_soon(move || {
            let _w = l2.write(0, 4096);
            wait_a_bit();
        });
        wait_a_bit();
        let l3 = l.clone();
        let (reader, reader_done) = finishes_soon(move || drop(l3.read(0, 512)));
        wait_a_bit();
        assert!(!reader_done.load(Ordering::SeqCst), "reader overtook a waiting writer");
        drop(held);
        writer.join().unwrap();
        reader.join().unwrap();
        assert!(writer_done.load(Ordering::SeqCst) && reader_done.load(Ordering::SeqCst));
    }

    #[test]
    fn exclusive_holders_never_overlap_when_contended() {
        let l = Arc::new(RangeLock::new());
        let inside: Arc<Vec<AtomicU32>> = Arc::new((0..16).map(|_| AtomicU32::new(0)).collect());
        let threads: Vec<_> = (0..4u64)
            .map(|t| {
                let (l, inside) = (l.clone(), inside.clone());
                thread::spawn(move || {
                    for i in 0..500u64 {
                        let start = (t * 7 + i * 3) % 12;
                        let len = 1 + (i + t) % 4;
                        let _g = l.write(start, len);
                        for s in start..start + len {
                            assert_eq!(
                                inside[s as usize].fetch_add(1, Ordering::SeqCst),
                                0,
                                "overlap at {s}"
                            );
                        }
                        for s in start..start + len {
                            inside[s as usize].fetch_sub(1, Ordering::SeqCst);
                        }
                    }
                })
            })
            .collect();
        for t in threads {
            t.join().unwrap();
        }
    }
}
