//! The server-wide budget for payload bytes in flight, and the pool of idle payload buffers.
//!
//! ```text
//!   Budget (one per Server, shared by every listener and connection)
//!   ┌────────────────────────────────────────────────────────────────────────┐
//!   │ total = in use (held by workers) + pooled (idle, kept for reuse)  ≤ limit │
//!   │ pool: idle buffers, newest last; reclaimed first when a request      │
//!   │       needs room, and freed by the watchdog after POOL_IDLE unused   │
//!   └────────────────────────────────────────────────────────────────────────┘
//!       ▲ acquire(conn, n): waits while conn.used + n > conn.cap
//!       │                   or while total + n > limit after emptying the pool
//!   ConnBudget (one per connection): bytes its workers hold, at most `cap`
//! ```
//!
//! A worker acquires a buffer for a READ or WRITE payload while it still holds its
//! connection's reader, so a connection that cannot get budget stops reading requests: it
//! stalls itself and nobody else. The buffer is given back (to the pool) only after the reply
//! has left, so a client that does not read its replies keeps at most `cap` bytes of its own
//! connection pinned. The per-connection cap is well below the limit, so one connection can
//! never take the whole budget.

use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Condvar, Mutex, MutexGuard, PoisonError};
use std::time::{Duration, Instant};

/// A pooled buffer unused this long is freed (by the server's watchdog).
pub(crate) const POOL_IDLE: Duration = Duration::from_secs(2);
/// A request takes a pooled buffer of at most twice its size (or of `2 × SMALL` for small
/// ones), so a small request never pins a huge buffer.
const SMALL: usize = 64 * 1024;
/// How often a waiting worker checks whether it should give up (connection closing,
/// server stopping), in case no release wakes it.
const WAIT_TICK: Duration = Duration::from_millis(100);

fn lock<T>(m: &Mutex<T>) -> MutexGuard<'_, T> {
    m.lock().unwrap_or_else(PoisonError::into_inner)
}

/// Server-wide accounting of payload buffers.
#[derive(Debug)]
pub(crate) struct Budget {
    limit: usize,
    state: Mutex<State>,
    released: Condvar,
    /// Workers blocked in `acquire`; releases notify only when there are some.
    waiters: AtomicUsize,
    /// Bytes held by workers (not pooled): the "in flight" figure of `ServerStats`.
    in_use: AtomicUsize,
    /// Highest `in_use` seen.
    peak: AtomicUsize,
}

#[derive(Debug, Default)]
struct State {
    /// In use plus pooled.
    total: usize,
    pooled: usize,
    /// Idle buffers with the time they were returned, oldest first.
    pool: Vec<(Vec<u8>, Instant)>,
}

/// One connection's share: what its workers hold, and the most they may.
#[derive(Debug)]
pub(crate) struct ConnBudget {
    cap: usize,
    /// Only changed under the budget's lock.
    used: AtomicUsize,
}

impl ConnBudget {
    pub(crate) fn new(cap: usize) -> Self {
        ConnBudget { cap, used: AtomicUsize::new(0) }
    }
}

impl Budget {
    pub(crate) fn new(limit: usize) -> Self {
        Budget {
            limit,
            state: Mutex::new(State::default()),
            released: Condvar::new(),
            waiters: AtomicUsize::new(0),
            in_use: AtomicUsize::new(0),
            peak: AtomicUsize::new(0),
        }
    }

    /// A zero-filled buffer of at least `n` bytes, charged to `conn` and to the server;
    /// waits while either has no room. `None` if `give_up()` turned true while waiting.
    /// `n` must not exceed `conn`'s cap nor the limit (the server clamps `max_request`).
    pub(crate) fn acquire(&self, conn: &ConnBudget, n: usize, give_up: impl Fn() -> bool) -> Option<Vec<u8>> {
        if n > conn.cap || n > self.limit {
            // Never satisfiable; the server clamps `max_request` so that this cannot happen.
            debug_assert!(false, "request of {n} bytes over the budget");
            return None;
        }
        let mut st = lock(&self.state);
        let mut waiting = false;
        let got = loop {
            if let Some(buf) = self.try_take(&mut st, conn, n) {
                break Some(buf);
            }
            if give_up() {
                break None;
            }
            if !waiting {
                waiting = true;
                self.waiters.fetch_add(1, Ordering::SeqCst);
            }
            st = self.released.wait_timeout(st, WAIT_TICK).unwrap_or_else(PoisonError::into_inner).0;
        };
        if waiting {
            self.waiters.fetch_sub(1, Ordering::SeqCst);
        }
        drop(st);
        got.map(|b| if b.is_empty() { vec![0u8; n] } else { b })
    }

    /// Under the lock: a pooled buffer that fits, or room for a new one (an empty `Vec` the
    /// caller allocates outside the lock), charged to `conn`; `None` if there is no room.
    fn try_take(&self, st: &mut State, conn: &ConnBudget, n: usize) -> Option<Vec<u8>> {
        let conn_used = conn.used.load(Ordering::Relaxed);
        let max_fit = n.max(SMALL).saturating_mul(2);
        // The most recently returned buffer that fits (requests of a workload tend to have
        // one size, so this is usually the last one).
        let best = st
            .pool
            .iter()
            .rposition(|(b, _)| b.len() >= n && b.len() <= max_fit && conn_used + b.len() <= conn.cap);
        let (buf, charge) = if let Some(i) = best {
            let (b, _) = st.pool.remove(i);
            st.pooled -= b.len();
            let len = b.len();
            (b, len)
        } else {
            if conn_used + n > conn.cap {
                return None;
            }
            // Free idle buffers, oldest first, until the new one fits.
            while st.total + n > self.limit && !st.pool.is_empty() {
                let (b, _) = st.pool.remove(0);
                st.pooled -= b.len();
                st.total -= b.len();
            }
            if st.total + n > self.limit {
                return None;
            }
            st.total += n;
            (Vec::new(), n)
        };
        conn.used.fetch_add(charge, Ordering::Relaxed);
        let in_use = self.in_use.fetch_add(charge, Ordering::Relaxed) + charge;
        self.peak.fetch_max(in_use, Ordering::Relaxed);
        Some(buf)
    }

    /// Gives a buffer from `acquire` back: it goes to the pool (still counted against the
    /// limit) and wakes waiting workers.
    pub(crate) fn release(&self, conn: &ConnBudget, buf: Vec<u8>) {
        let len = buf.len();
        if len == 0 {
            return;
        }
        let mut st = lock(&self.state);
        conn.used.fetch_sub(len, Ordering::Relaxed);
        self.in_use.fetch_sub(len, Ordering::Relaxed);
        st.pooled += len;
        st.pool.push((buf, Instant::now()));
        drop(st);
        if self.waiters.load(Ordering::SeqCst) > 0 {
            self.released.notify_all();
        }
    }

    /// Frees pooled buffers unused for `POOL_IDLE` (called by the watchdog).
    pub(crate) fn reap_idle(&self) {
        let now = Instant::now();
        let freed: Vec<Vec<u8>> = {
            let mut st = lock(&self.state);
            let old = st.pool.iter().take_while(|(_, t)| now.duration_since(*t) >= POOL_IDLE).count();
            let freed: Vec<Vec<u8>> = st.pool.drain(..old).map(|(b, _)| b).collect();
            let bytes: usize = freed.iter().map(Vec::len).sum();
            st.pooled -= bytes;
            st.total -= bytes;
            freed
        };
        drop(freed);
    }

    /// Bytes held by workers now.
    pub(crate) fn in_use(&self) -> usize {
        self.in_use.load(Ordering::Relaxed)
    }

    /// The most bytes held by workers at once so far.
    pub(crate) fn peak(&self) -> usize {
        self.peak.load(Ordering::Relaxed)
    }

    /// Bytes in idle pooled buffers.
    pub(crate) fn pooled(&self) -> usize {
        lock(&self.state).pooled
    }

    /// The server-wide limit.
    pub(crate) fn limit(&self) -> usize {
        self.limit
    }
}

#[cfg(test)]
mod tests {
    use std::sync::Arc;
    use std::thread;

    use super::*;

    #[test]
    fn buffers_are_reused_and_counted_while_pooled() {
        let b = Budget::new(10 << 20);
        let c = ConnBudget::new(4 << 20);
        let buf = b.acquire(&c, 1 << 20, || false).unwrap();
        assert_eq!(buf.len(), 1 << 20);
        assert_eq!(b.in_use(), 1 << 20);
        b.release(&c, buf);
        assert_eq!((b.in_use(), b.pooled()), (0, 1 << 20));
        let again = b.acquire(&c, 1 << 20, || false).unwrap();
        assert_eq!((b.in_use(), b.pooled()), (1 << 20, 0));
        b.release(&c, again);
        assert_eq!(c.used.load(Ordering::Relaxed), 0);
    }

    #[test]
    fn a_small_request_does_not_take_a_huge_pooled_buffer() {
        let b = Budget::new(64 << 20);
        let c = ConnBudget::new(32 << 20);
        let big = b.acquire(&c, 16 << 20, || false).unwrap();
        b.release(&c, big);
        let small = b.acquire(&c, 4096, || false).unwrap();
        assert_eq!(small.len(), 4096);
        b.release(&c, small);
    }

    #[test]
    fn the_pool_is_reclaimed_when_a_request_needs_room() {
        let b = Budget::new(3 << 20);
        let c = ConnBudget::new(3 << 20);
        let x = b.acquire(&c, 2 << 20, || false).unwrap();
        b.release(&c, x);
        // 2 MiB pooled; a 3 MiB request frees it rather than waiting.
        let y = b.acquire(&c, 3 << 20, || false).unwrap();
        assert_eq!((b.in_use(), b.pooled()), (3 << 20, 0));
        b.release(&c, y);
    }

    #[test]
    fn a_connection_at_its_cap_waits_for_its_own_release() {
        let b = Arc::new(Budget::new(100 << 20));
        let c = Arc::new(ConnBudget::new(2 << 20));
        let other = ConnBudget::new(2 << 20);
        let held = b.acquire(&c, 2 << 20, || false).unwrap();
        // Another connection is not affected.
        let o = b.acquire(&other, 2 << 20, || false).unwrap();
        b.release(&other, o);
        // Give up at once: no room for this connection.
        assert!(b.acquire(&c, 4096, || true).is_none());
        let (b2, c2) = (b.clone(), c.clone());
        let t = thread::spawn(move || b2.acquire(&c2, 4096, || false).map(|v| v.len()));
        thread::sleep(Duration::from_millis(50));
        b.release(&c, held);
        assert_eq!(t.join().unwrap(), Some(4096));
    }

    #[test]
    fn the_server_limit_holds_across_connections() {
        let b = Budget::new(4 << 20);
        let c1 = ConnBudget::new(4 << 20);
        let c2 = ConnBudget::new(4 << 20);
        let x = b.acquire(&c1, 3 << 20, || false).unwrap();
        assert!(b.acquire(&c2, 2 << 20, || true).is_none());
        b.release(&c1, x);
        let y = b.acquire(&c2, 2 << 20, || false).unwrap();
        b.release(&c2, y);
    }

    #[test]
    fn idle_pooled_buffers_are_reaped() {
        let b = Budget::new(4 << 20);
        let c = ConnBudget::new(4 << 20);
        let x = b.acquire(&c, 1 << 20, || false).unwrap();
        b.release(&c, x);
        {
            let mut st = lock(&b.state);
            st.pool[0].1 -= POOL_IDLE;
        }
        b.reap_idle();
        assert_eq!(b.pooled(), 0);
        assert_eq!(lock(&b.state).total, 0);
    }
}
