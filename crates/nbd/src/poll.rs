//! Busy polling: a worker about to wait for a connection's next request watches the socket
//! for a short while first, instead of going to sleep at once.
//!
//! At queue depth 1 a client sends its next request a few microseconds after it got the
//! last reply. A worker that sleeps in `recv` in between has to be woken, and the scheduler
//! puts a woken thread on an idle CPU where it can (its previous one, usually): the wake-up
//! then costs an inter-processor interrupt and the idle CPU's exit from its sleep state,
//! which on a VM without guest halt-polling is a VM exit and tens of microseconds, more than
//! the request itself (BENCHMARKS.md, issue 16: 4 KiB QD1 requests ran at 14k/s with server
//! and client pinned to different CPUs and 100k/s pinned to one). A worker that keeps its
//! CPU busy with non-blocking peeks for up to `ServerConfig::busy_poll` sees the request
//! as soon as it lands, with no wake-up; only the client's side of the exchange still pays
//! one. It is the same trade as the kernel's `net.core.busy_read` and SPDK's pollers: CPU
//! time for latency.
//!
//! What keeps it from wasting CPU:
//! - **Only a queue-depth-1 connection polls**: one whose last 16 requests were each read
//!   with nothing else of it executing or replying and nothing more already received, and
//!   only while its reader's buffer is empty. A pipelining client (QD > 1) keeps CPUs
//!   busy, so its wake-ups are cheap, and a poll would take CPU from it (4k QD32 reads
//!   measured a few percent slower with polls between overlapping requests); over TLS the
//!   pump thread would lose the CPU, so TLS connections never poll.
//! - **It stops when it does not pay**: a connection polls only if its last wait for a
//!   request was short (at most twice the budget, polled or not). A client that pauses
//!   costs one poll of at most `busy_poll`, then its connection sleeps in `recv` again
//!   until its requests come close together once more.
//! - **Few at once**: at most half the CPUs poll at the same time, server wide (none on a
//!   one-CPU machine); a worker that finds them all taken sleeps as before.

use std::io::BufReader;
use std::os::fd::AsFd;
use std::sync::atomic::{AtomicU64, AtomicUsize, Ordering};
use std::time::{Duration, Instant};

use rustix::io::Errno;
use rustix::net::RecvFlags;

use crate::stream::Stream;

/// Server-wide busy-polling policy and counters.
#[derive(Debug)]
pub(crate) struct BusyPoll {
    /// Longest poll, in nanoseconds; 0: never poll.
    budget_ns: u64,
    /// Most workers polling at once.
    max_pollers: usize,
    pollers: AtomicUsize,
    /// Polls that saw a request arrive.
    hits: AtomicU64,
    /// Polls that gave up (the worker then slept in `recv`).
    misses: AtomicU64,
}

/// One connection's history: how long its last wait for a request took, in nanoseconds
/// (only the worker holding the reader touches it).
#[derive(Debug, Default)]
pub(crate) struct PollState {
    last_wait_ns: AtomicU64,
    /// Requests read in a row with nothing else of the connection in flight.
    idle_streak: AtomicU64,
}

/// Requests read in a row with nothing else in flight before a connection polls: a client
/// whose requests overlap even now and then is pipelining, and the CPU a poll would take is
/// better left to it.
const IDLE_STREAK: u64 = 16;

/// A wait the caller times: started when no request was buffered and polling did not see
/// one arrive, ended by `BusyPoll::waited` once the request header has been read.
#[must_use]
pub(crate) struct Wait(Option<Instant>);

impl BusyPoll {
    /// `budget`: the longest poll (`None` or zero: off).
    /// At most half the CPUs poll at once; none on a one-CPU machine, where the poll would
    /// take the only CPU from the client it waits for.
    pub(crate) fn new(budget: Option<Duration>) -> BusyPoll {
        let cpus = std::thread::available_parallelism().map_or(1, |n| n.get());
        BusyPoll::with_pollers(budget, cpus / 2)
    }

    fn with_pollers(budget: Option<Duration>, max_pollers: usize) -> BusyPoll {
        BusyPoll {
            budget_ns: budget.map_or(0, |d| u64::try_from(d.as_nanos()).unwrap_or(u64::MAX)),
            max_pollers,
            pollers: AtomicUsize::new(0),
            hits: AtomicU64::new(0),
            misses: AtomicU64::new(0),
        }
    }

    /// Whether polling can ever happen (a budget, and a CPU to spare for it).
    pub(crate) fn is_on(&self) -> bool {
        self.budget_ns > 0 && self.max_pollers > 0
    }

    /// Called by the worker holding the reader before it reads a request header: polls the
    /// socket if no request is buffered and the policy allows. Returns a `Wait` to hand to
    /// `waited` after the header has been read (a no-op when a request was already there).
    /// `busy`: other requests of the connection are executing or replying, so its CPUs are
    /// not about to go idle and a wake-up is cheap: no poll (it would take CPU from them).
    pub(crate) fn before_read(&self, state: &PollState, r: &BufReader<Stream>, busy: bool) -> Wait {
        if self.budget_ns == 0 {
            return Wait(None);
        }
        if !r.buffer().is_empty() {
            // The next request came before this one was answered: the client pipelines.
            state.idle_streak.store(0, Ordering::Relaxed);
            return Wait(None);
        }
        let streak = if busy { 0 } else { state.idle_streak.load(Ordering::Relaxed).saturating_add(1) };
        state.idle_streak.store(streak, Ordering::Relaxed);
        let start = Instant::now();
        if streak < IDLE_STREAK
            || state.last_wait_ns.load(Ordering::Relaxed) > self.budget_ns.saturating_mul(2)
        {
            return Wait(Some(start));
        }
        let Some(arrived) = self.poll(r.get_ref(), start) else {
            return Wait(Some(start));
        };
        if arrived {
            self.hits.fetch_add(1, Ordering::Relaxed);
            state.last_wait_ns.store(elapsed_ns(start), Ordering::Relaxed);
            Wait(None)
        } else {
            self.misses.fetch_add(1, Ordering::Relaxed);
            Wait(Some(start))
        }
    }

    /// Called before reading a WRITE's payload of `len` bytes: if less than that is
    /// buffered and the connection is not `busy` (see `before_read`), polls until more
    /// arrives (a client may send the header and the payload separately; the rest is due at
    /// once, so no history is asked). The read that follows may still sleep for the
    /// remainder of a large payload.
    pub(crate) fn before_payload(&self, r: &BufReader<Stream>, len: usize, busy: bool) {
        if self.budget_ns == 0 || busy || r.buffer().len() >= len {
            return;
        }
        let _ = self.poll(r.get_ref(), Instant::now());
    }

    /// Polls `s` (`poll_until`) in one of the server's polling slots: `None` if all are
    /// taken, else whether data arrived.
    fn poll(&self, s: &Stream, start: Instant) -> Option<bool> {
        let free = self.pollers.fetch_add(1, Ordering::AcqRel) < self.max_pollers;
        let arrived = free.then(|| poll_until(s, start, self.budget_ns));
        self.pollers.fetch_sub(1, Ordering::AcqRel);
        arrived
    }

    /// Records how long a wait that `before_read` did not end by polling took.
    pub(crate) fn waited(&self, state: &PollState, wait: Wait) {
        if let Wait(Some(start)) = wait {
            state.last_wait_ns.store(elapsed_ns(start), Ordering::Relaxed);
        }
    }

    /// Polls that saw a request arrive, and polls that gave up.
    pub(crate) fn counts(&self) -> (u64, u64) {
        (self.hits.load(Ordering::Relaxed), self.misses.load(Ordering::Relaxed))
    }
}

fn elapsed_ns(start: Instant) -> u64 {
    u64::try_from(start.elapsed().as_nanos()).unwrap_or(u64::MAX)
}

/// Peeks at the socket without blocking until a byte is there, the peer has closed or the
/// socket failed (`true`: the read that follows will not sleep), or `budget_ns` have passed
/// since `start` (`false`).
fn poll_until(s: &Stream, start: Instant, budget_ns: u64) -> bool {
    let mut byte = [0u8; 1];
    loop {
        match rustix::net::recv(s.as_fd(), &mut byte[..], RecvFlags::PEEK | RecvFlags::DONTWAIT) {
            Ok(_) => return true,
            Err(Errno::AGAIN | Errno::INTR) => {}
            Err(_) => return true,
        }
        if elapsed_ns(start) >= budget_ns {
            return false;
        }
        std::hint::spin_loop();
    }
}

#[cfg(test)]
mod tests {
    use std::io::Write;
    use std::os::unix::net::UnixStream;

    use super::*;

    /// A connection that has been at queue depth 1 for a while.
    fn qd1() -> PollState {
        PollState { idle_streak: AtomicU64::new(IDLE_STREAK), ..PollState::default() }
    }

    fn pair() -> (BufReader<Stream>, UnixStream) {
        let (a, b) = UnixStream::pair().unwrap();
        (BufReader::new(Stream::Unix(a)), b)
    }

    #[test]
    fn a_request_already_buffered_is_not_waited_for() {
        let bp = BusyPoll::with_pollers(Some(Duration::from_millis(1)), 1);
        let (mut r, mut w) = pair();
        w.write_all(&[1, 2, 3]).unwrap();
        let mut one = [0u8; 1];
        std::io::Read::read_exact(&mut r, &mut one).unwrap();
        let st = qd1();
        assert!(matches!(bp.before_read(&st, &r, false), Wait(None)));
        assert_eq!(bp.counts(), (0, 0));
        // A request received before the last was answered: the client pipelines.
        assert_eq!(st.idle_streak.load(Ordering::Relaxed), 0);
    }

    #[test]
    fn a_poll_sees_data_and_a_closed_peer_and_gives_up_on_silence() {
        let bp = BusyPoll::with_pollers(Some(Duration::from_millis(2)), 1);
        let st = qd1();
        let (r, mut w) = pair();
        // Nothing arrives: the poll gives up, and the caller times the wait.
        assert!(matches!(bp.before_read(&st, &r, false), Wait(Some(_))));
        assert_eq!(bp.counts(), (0, 1));
        // Data that is there: a hit.
        w.write_all(&[7]).unwrap();
        bp.waited(&st, Wait(Some(Instant::now())));
        assert!(matches!(bp.before_read(&st, &r, false), Wait(None)));
        assert_eq!(bp.counts(), (1, 1));
        // A closed peer ends the poll at once too (the read reports the end).
        let (r, w) = pair();
        drop(w);
        assert!(matches!(bp.before_read(&qd1(), &r, false), Wait(None)));
        assert_eq!(bp.counts(), (2, 1));
    }

    #[test]
    fn only_a_run_of_requests_with_nothing_else_in_flight_starts_polling() {
        let bp = BusyPoll::with_pollers(Some(Duration::from_micros(100)), 1);
        let st = PollState::default();
        let (r, _w) = pair();
        for _ in 1..IDLE_STREAK {
            let _ = bp.before_read(&st, &r, false);
        }
        assert_eq!(bp.counts(), (0, 0), "it polled before the streak was long enough");
        // One read with another request in flight starts the count again.
        let _ = bp.before_read(&st, &r, true);
        for _ in 1..IDLE_STREAK {
            let _ = bp.before_read(&st, &r, false);
        }
        assert_eq!(bp.counts(), (0, 0), "a pipelining connection polled");
        let _ = bp.before_read(&st, &r, false);
        assert_eq!(bp.counts(), (0, 1));
    }

    #[test]
    fn a_connection_whose_last_wait_was_long_does_not_poll() {
        let bp = BusyPoll::with_pollers(Some(Duration::from_micros(100)), 1);
        let st = qd1();
        let (r, _w) = pair();
        st.last_wait_ns.store(10_000_000, Ordering::Relaxed);
        let wait = bp.before_read(&st, &r, false);
        assert!(matches!(wait, Wait(Some(_))));
        assert_eq!(bp.counts(), (0, 0), "it polled after a 10 ms wait");
        // A short wait turns polling back on.
        st.last_wait_ns.store(50_000, Ordering::Relaxed);
        let _ = bp.before_read(&st, &r, false);
        assert_eq!(bp.counts(), (0, 1));
    }

    #[test]
    fn off_and_full_mean_no_poll() {
        let (r, _w) = pair();
        let off = BusyPoll::with_pollers(None, 1);
        let _ = off.before_read(&qd1(), &r, false);
        assert_eq!(off.counts(), (0, 0));
        let bp = BusyPoll::with_pollers(Some(Duration::from_millis(1)), 1);
        bp.pollers.store(1, Ordering::Relaxed);
        let _ = bp.before_read(&qd1(), &r, false);
        assert_eq!(bp.counts(), (0, 0), "it polled with every polling slot taken");
        let one_cpu = BusyPoll::with_pollers(Some(Duration::from_millis(1)), 0);
        let _ = one_cpu.before_read(&qd1(), &r, false);
        assert_eq!(one_cpu.counts(), (0, 0), "it polled with no polling slot at all");
        let _ = bp.before_read(&qd1(), &r, true);
        bp.pollers.store(0, Ordering::Relaxed);
        let _ = bp.before_read(&qd1(), &r, true);
        assert_eq!(bp.counts(), (0, 0), "it polled while other requests were in flight");
    }
}
