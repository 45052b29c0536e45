//! Where the engine gets its time from.
//!
//! Real runs use [`MonotonicClock`]. Tests use [`ManualClock`], which only moves when told
//! to: a synthetic device advances it by a known amount per request, so every latency the
//! engine records is known exactly and tests assert on the statistics, never on wall time.

use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Instant;

/// A monotonic clock in nanoseconds since an arbitrary origin.
pub trait Clock: Send + Sync + std::fmt::Debug {
    /// Nanoseconds since the clock's origin.
    fn now_ns(&self) -> u64;
}

/// `std::time::Instant`.
#[derive(Debug)]
pub struct MonotonicClock {
    origin: Instant,
}

impl MonotonicClock {
    /// A clock whose origin is now.
    pub fn new() -> Self {
        MonotonicClock { origin: Instant::now() }
    }
}

impl Default for MonotonicClock {
    fn default() -> Self {
        Self::new()
    }
}

impl Clock for MonotonicClock {
    fn now_ns(&self) -> u64 {
        self.origin.elapsed().as_nanos() as u64
    }
}

/// A clock that moves only by [`ManualClock::advance`] (for tests).
#[derive(Debug, Default)]
pub struct ManualClock {
    ns: AtomicU64,
}

impl ManualClock {
    /// A clock at 0.
    pub fn new() -> Self {
        Self::default()
    }
    /// Moves the clock forward.
    pub fn advance(&self, ns: u64) {
        self.ns.fetch_add(ns, Ordering::SeqCst);
    }
}

impl Clock for ManualClock {
    fn now_ns(&self) -> u64 {
        self.ns.load(Ordering::SeqCst)
    }
}
