//! Where per-request crypto runs: one engine for plain dm-crypt, AEAD dm-crypt and
//! dm-integrity's tag hashing, over one process-wide pool.
//!
//! A request's buffer (and, for AEAD and integrity, its tag buffer beside it) is cut into
//! chunks of [`CHUNK`] bytes (never less than one sector or block), and a [`Placement`] says
//! who works on them:
//!
//! ```text
//!  Placement::Inline   request thread: every chunk, in order      (no handoff, best latency)
//!  Placement::Pool     the pool: one chunk is handed to one pool thread; more are spread over
//!                      every pool thread (one pool thread with same_cpu: dm-crypt's
//!                      same_cpu_crypt) — dm-crypt's kcryptd: every request pays a handoff
//!  Placement::Auto     one chunk: inline. More: the request thread takes the first chunk, the
//!                      pool the rest — only while fewer Auto requests are in their crypto
//!                      phase than the pool has threads (this one included); when every core
//!                      already has a request, splitting only adds handoffs, so inline
//! ```
//!
//! The busy count is process-wide (every target shares the pool), and counts every Auto
//! request whatever its size, from the moment it enters the engine until its chunks are done.
//! Work is fallible: the error of the lowest-numbered failing chunk is returned (so an
//! authentication or tag failure names the first bad sector of the request). A request that
//! runs in order stops at that chunk; a split one lets the chunks already handed out finish.
//!
//! **Blocking on the pool.** A pool thread that blocks starves every request waiting for it.
//! Crypto and hashing never block; the one pool job that does is a write submitted from the
//! pool ([`submit_on_pool`], dm-crypt's `submit_from_crypt_cpus`): it writes to the device
//! below, which may wait on that device's range locks. A layer that hands chunks to the pool
//! *while holding* such a lock (dm-integrity verifies a read under its range lock) could then
//! wait forever on chunks queued behind pool threads that wait for its lock. So the two
//! exclude each other ([`Policy::holding_lock`]): a lock holder works inline while a
//! submission is queued or running on the pool, and a submission runs on its own thread while
//! a lock holder has chunks on the pool (a Dekker-style pair of counters, so at least one of
//! two racing parties sees the other).

use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Mutex, OnceLock};

/// Where the crypto (or tag hashing) of a request runs. `targets::CryptMode` and
/// `targets::integrity::HashMode` are this type.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum Placement {
    /// On the thread that submitted the request (dm-crypt `no_*_workqueue`).
    Inline,
    /// On the shared pool, a request of more than one chunk split across its threads
    /// (dm-crypt's default kcryptd workqueue).
    Pool,
    /// Inline for a request of at most one chunk; above that, split across the request thread
    /// and the pool while a core is free: no handoff where parallelism cannot pay for it.
    #[default]
    Auto,
}

impl Placement {
    /// Its name on command lines, in bench stack specs and in `status`: `inline`, `pool`,
    /// `auto`.
    pub const fn name(self) -> &'static str {
        match self {
            Placement::Inline => "inline",
            Placement::Pool => "pool",
            Placement::Auto => "auto",
        }
    }
}

impl std::fmt::Display for Placement {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(self.name())
    }
}

/// A name that is not one of [`Placement`]'s.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("{0:?}: expected auto, pool or inline")]
pub struct UnknownPlacement(pub String);

impl std::str::FromStr for Placement {
    type Err = UnknownPlacement;

    fn from_str(s: &str) -> Result<Self, Self::Err> {
        match s {
            "inline" => Ok(Placement::Inline),
            "pool" => Ok(Placement::Pool),
            "auto" => Ok(Placement::Auto),
            _ => Err(UnknownPlacement(s.to_owned())),
        }
    }
}

/// Bytes per chunk: requests are cut into chunks of this size (never below one sector or
/// block, see [`chunk_len`]).
pub(crate) const CHUNK: usize = 64 * 1024;

/// The chunk length for work in units of `unit` bytes (a sector or block, a power of two):
/// [`CHUNK`], or one unit if that is larger.
pub(crate) fn chunk_len(unit: usize) -> usize {
    let unit = unit.max(1);
    let c = CHUNK.max(unit);
    c - c % unit
}

/// The shared pool: one thread per core, created on first use.
pub(crate) fn pool() -> &'static rayon::ThreadPool {
    static POOL: OnceLock<rayon::ThreadPool> = OnceLock::new();
    POOL.get_or_init(|| {
        rayon::ThreadPoolBuilder::new()
            .thread_name(|i| format!("kcryptd-{i}"))
            .build()
            .expect("cannot start the crypto thread pool")
    })
}

/// How much of a thread's stack [`scrub_stack`] overwrites: far more than the deepest
/// crypto call chain (cipher backends keep expanded round keys in stack temporaries: the
/// AVX-512 ones broadcast each round key to a 64-byte register image).
const STACK_SCRUB: usize = 256 * 1024;

/// Overwrites the [`STACK_SCRUB`] bytes of the calling thread's stack below this frame with
/// zeroes, wiping what finished calls left there (key schedule temporaries the cipher
/// crates do not clear). Call it from a shallow frame.
#[inline(never)]
pub fn scrub_stack() {
    let buf = [0u8; STACK_SCRUB];
    // The zeroes must really be written: the optimiser has to assume `buf` is read.
    std::hint::black_box(&buf);
}

/// Scrubs the stacks of the crypto pool's threads (each runs [`scrub_stack`] from its idle
/// loop) and the caller's: after a volume's key is dropped (`luksSuspend`), so that no
/// stack temporary of its key schedule survives on them.
pub fn scrub_crypto_stacks() {
    pool().broadcast(|_| scrub_stack());
    scrub_stack();
}

/// Auto requests in their crypto phase right now, across every target: Auto's signal that
/// the cores are already busy.
static AUTO_BUSY: AtomicUsize = AtomicUsize::new(0);
/// Submissions ([`submit_on_pool`]) queued or running on the pool.
static BLOCKING: AtomicUsize = AtomicUsize::new(0);
/// Lock holders ([`Policy::holding_lock`]) with chunks handed to the pool.
static LOCK_HOLDERS: AtomicUsize = AtomicUsize::new(0);

/// Counts one party in a counter while it lives; `.1` is the count with it.
pub(crate) struct Counted(&'static AtomicUsize, usize);

impl Counted {
    fn enter(c: &'static AtomicUsize) -> Self {
        Counted(c, c.fetch_add(1, Ordering::SeqCst) + 1)
    }

    /// Counts one Auto request in its crypto phase (tests: make every core look busy).
    #[cfg(test)]
    pub(crate) fn auto_request() -> Self {
        Counted::enter(&AUTO_BUSY)
    }
}

/// Auto requests in their crypto phase right now (tests).
#[cfg(test)]
pub(crate) fn auto_busy() -> usize {
    AUTO_BUSY.load(Ordering::SeqCst)
}

impl Drop for Counted {
    fn drop(&mut self) {
        self.0.fetch_sub(1, Ordering::SeqCst);
    }
}

/// How one request's work may be placed: the direction's [`Placement`] plus options.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct Policy {
    mode: Placement,
    same_cpu: bool,
    holds_lock: bool,
}

impl Policy {
    /// `mode`, split when it allows, no lock held.
    pub(crate) const fn new(mode: Placement) -> Self {
        Policy { mode, same_cpu: false, holds_lock: false }
    }

    /// With `on`, [`Placement::Pool`] keeps the request on one pool thread (dm-crypt's
    /// `same_cpu_crypt`). Inline and Auto are unchanged.
    pub(crate) const fn same_cpu(self, on: bool) -> Self {
        Policy { same_cpu: on, ..self }
    }

    /// With `on`, the caller holds a lock that a submission on the pool may wait for: see the
    /// module docs.
    pub(crate) const fn holding_lock(self, on: bool) -> Self {
        Policy { holds_lock: on, ..self }
    }
}

/// Who runs a request's chunks.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Route {
    /// The calling thread, in order.
    Here,
    /// One pool thread, in order.
    OnePoolThread,
    /// The first chunk here, the rest on the pool.
    Helped,
    /// Every chunk on the pool.
    Spread,
}

/// The placement rule. `auto_busy`: Auto requests in their crypto phase, this one included
/// (`None` unless Auto); `threads`: the pool's size.
fn route(policy: Policy, parts: usize, auto_busy: Option<usize>, threads: usize) -> Route {
    let split = parts > 1;
    match policy.mode {
        Placement::Inline => Route::Here,
        Placement::Auto if !split => Route::Here,
        // Every pool thread's core already has an Auto request (this one included).
        Placement::Auto if auto_busy.is_some_and(|b| b >= threads) => Route::Here,
        Placement::Auto => Route::Helped,
        Placement::Pool if policy.same_cpu || !split => Route::OnePoolThread,
        Placement::Pool => Route::Spread,
    }
}

/// A buffer the engine can cut into chunks: `&[u8]` or `&mut [u8]`.
pub(crate) trait Chunks: Send {
    /// One chunk.
    type Part: Send;
    /// The chunks, in order.
    type Iter: ExactSizeIterator<Item = Self::Part> + Send;
    /// Cuts into chunks of `len` bytes (the last may be shorter).
    fn chunks_of(self, len: usize) -> Self::Iter;
}

impl<'a> Chunks for &'a [u8] {
    type Part = &'a [u8];
    type Iter = std::slice::Chunks<'a, u8>;
    fn chunks_of(self, len: usize) -> Self::Iter {
        self.chunks(len)
    }
}

impl<'a> Chunks for &'a mut [u8] {
    type Part = &'a mut [u8];
    type Iter = std::slice::ChunksMut<'a, u8>;
    fn chunks_of(self, len: usize) -> Self::Iter {
        self.chunks_mut(len)
    }
}

/// Runs `work(offset, chunk)` over `data` cut into chunks of `chunk` bytes, where `policy`
/// says; `offset` is the chunk's first byte in `data`. Every byte is in exactly one chunk.
pub(crate) fn run<B: Chunks, E: Send>(
    policy: Policy,
    data: B,
    chunk: usize,
    work: impl Fn(usize, B::Part) -> Result<(), E> + Sync,
) -> Result<(), E> {
    let chunk = chunk.max(1);
    run_parts(policy, data.chunks_of(chunk), |i, p| work(i * chunk, p))
}

/// [`run`] over a data buffer and its tag buffer: chunk `i` is `data`'s bytes
/// `[i*chunk, (i+1)*chunk)` and `tags`' bytes `[i*tag_chunk, (i+1)*tag_chunk)`; `work` gets
/// the data offset and both parts.
pub(crate) fn run_paired<B: Chunks, T: Chunks, E: Send>(
    policy: Policy,
    data: B,
    chunk: usize,
    tags: T,
    tag_chunk: usize,
    work: impl Fn(usize, B::Part, T::Part) -> Result<(), E> + Sync,
) -> Result<(), E> {
    let chunk = chunk.max(1);
    let parts = data.chunks_of(chunk).zip(tags.chunks_of(tag_chunk.max(1)));
    run_parts(policy, parts, |i, (d, t)| work(i * chunk, d, t))
}

/// Runs `work(i, part)` over `parts` where `policy` says (see the module docs).
fn run_parts<P: Send, E: Send>(
    policy: Policy,
    parts: impl ExactSizeIterator<Item = P> + Send,
    work: impl Fn(usize, P) -> Result<(), E> + Sync,
) -> Result<(), E> {
    let busy = (policy.mode == Placement::Auto).then(|| Counted::enter(&AUTO_BUSY));
    let threads = pool().current_num_threads();
    let mut route = route(policy, parts.len(), busy.as_ref().map(|b| b.1), threads);
    // Announce first, then look: of a lock holder and a racing submission, one sees the other.
    let holder = (policy.holds_lock && route != Route::Here).then(|| Counted::enter(&LOCK_HOLDERS));
    if holder.is_some() && BLOCKING.load(Ordering::SeqCst) > 0 {
        route = Route::Here;
    }
    let serial = |parts: &mut dyn Iterator<Item = P>| parts.enumerate().try_for_each(|(i, p)| work(i, p));
    match route {
        Route::Here => serial(&mut { parts }),
        Route::OnePoolThread => pool().install(|| serial(&mut { parts })),
        Route::Helped | Route::Spread => {
            let failed: Mutex<Option<(usize, E)>> = Mutex::new(None);
            let record = |i: usize, r: Result<(), E>| {
                if let Err(e) = r {
                    let mut f = failed.lock().unwrap_or_else(|p| p.into_inner());
                    if f.as_ref().is_none_or(|(j, _)| i < *j) {
                        *f = Some((i, e));
                    }
                }
            };
            let (work, record) = (&work, &record);
            if route == Route::Helped {
                pool().in_place_scope(|scope| {
                    let mut parts = parts.enumerate();
                    let first = parts.next();
                    for (i, p) in parts {
                        scope.spawn(move |_| record(i, work(i, p)));
                    }
                    if let Some((i, p)) = first {
                        record(i, work(i, p));
                    }
                });
            } else {
                pool().scope(|scope| {
                    for (i, p) in parts.enumerate() {
                        scope.spawn(move |_| record(i, work(i, p)));
                    }
                });
            }
            match failed.into_inner().unwrap_or_else(|p| p.into_inner()) {
                Some((_, e)) => Err(e),
                None => Ok(()),
            }
        }
    }
}

/// Runs `f` on a pool thread (dm-crypt's `submit_from_crypt_cpus`: the thread that encrypts
/// also writes below), or on this thread while a lock holder has chunks on the pool (see the
/// module docs). `f` gets whether it runs on the pool.
pub(crate) fn submit_on_pool<R: Send>(f: impl FnOnce(bool) -> R + Send) -> R {
    let _queued = Counted::enter(&BLOCKING);
    if LOCK_HOLDERS.load(Ordering::SeqCst) > 0 {
        return f(false);
    }
    pool().install(|| f(true))
}

#[cfg(test)]
mod tests {
    use std::sync::atomic::AtomicBool;

    use proptest::prelude::*;

    use super::*;

    const ALL: [Placement; 3] = [Placement::Inline, Placement::Pool, Placement::Auto];

    #[test]
    fn names_round_trip() {
        for p in ALL {
            assert_eq!(p.to_string().parse::<Placement>(), Ok(p));
        }
        assert_eq!("fast".parse::<Placement>(), Err(UnknownPlacement("fast".into())));
    }

    #[test]
    fn route_follows_the_policy() {
        let p = Policy::new;
        // Inline: always here.
        assert_eq!(route(p(Placement::Inline), 1, None, 2), Route::Here);
        assert_eq!(route(p(Placement::Inline), 9, None, 2), Route::Here);
        // Auto: one chunk inline; more split while a core is free, inline once every pool
        // thread has an Auto request.
        assert_eq!(route(p(Placement::Auto), 1, Some(1), 2), Route::Here);
        assert_eq!(route(p(Placement::Auto), 9, Some(1), 2), Route::Helped);
        assert_eq!(route(p(Placement::Auto), 9, Some(2), 2), Route::Here);
        assert_eq!(route(p(Placement::Auto), 9, Some(3), 2), Route::Here);
        assert_eq!(route(p(Placement::Auto).same_cpu(true), 9, Some(1), 2), Route::Helped);
        // Pool: always handed off; split unless same-cpu.
        assert_eq!(route(p(Placement::Pool), 1, None, 2), Route::OnePoolThread);
        assert_eq!(route(p(Placement::Pool), 9, None, 2), Route::Spread);
        assert_eq!(route(p(Placement::Pool).same_cpu(true), 9, None, 2), Route::OnePoolThread);
    }

    #[test]
    fn chunks_are_64k_and_never_below_one_unit() {
        assert_eq!(chunk_len(512), 65536);
        assert_eq!(chunk_len(4096), 65536);
        assert_eq!(chunk_len(1 << 20), 1 << 20);
        assert_eq!(chunk_len(0), 65536);
    }

    /// Which threads ran the chunks of a 16-chunk request: (chunks run on the calling thread,
    /// chunks run on a pool thread).
    fn threads_used(policy: Policy) -> (usize, usize) {
        let me = std::thread::current().id();
        let here = AtomicUsize::new(0);
        let pooled = AtomicUsize::new(0);
        let mut data = vec![0u8; 16 * CHUNK];
        run(policy, &mut data[..], CHUNK, |_, _| {
            if std::thread::current().id() == me {
                here.fetch_add(1, Ordering::Relaxed);
            }
            if pool().current_thread_index().is_some() {
                pooled.fetch_add(1, Ordering::Relaxed);
            }
            Ok::<(), ()>(())
        })
        .unwrap();
        (here.into_inner(), pooled.into_inner())
    }

    #[test]
    fn auto_runs_inline_when_every_pool_thread_is_busy() {
        let _others: Vec<Counted> =
            (0..pool().current_num_threads()).map(|_| Counted::auto_request()).collect();
        assert_eq!(threads_used(Policy::new(Placement::Auto)), (16, 0));
    }

    #[test]
    fn auto_splits_between_this_thread_and_the_pool_when_a_core_is_free() {
        // Other tests may have Auto requests in flight; retry until a run saw a free core.
        for _ in 0..200 {
            let (here, pooled) = threads_used(Policy::new(Placement::Auto));
            assert_eq!(here + pooled, 16);
            if pooled > 0 {
                assert!(here >= 1, "the request thread takes the first chunk");
                return;
            }
            std::thread::sleep(std::time::Duration::from_millis(5));
        }
        panic!("Auto never handed a chunk to the pool");
    }

    #[test]
    fn pool_hands_everything_to_the_pool_and_same_cpu_keeps_one_thread() {
        assert_eq!(threads_used(Policy::new(Placement::Pool)), (0, 16));
        assert_eq!(threads_used(Policy::new(Placement::Inline)), (16, 0));
        let ids = Mutex::new(std::collections::HashSet::new());
        let mut data = vec![0u8; 16 * CHUNK];
        run(Policy::new(Placement::Pool).same_cpu(true), &mut data[..], CHUNK, |_, _| {
            ids.lock().unwrap().insert(std::thread::current().id());
            std::thread::sleep(std::time::Duration::from_millis(1));
            Ok::<(), ()>(())
        })
        .unwrap();
        assert_eq!(ids.into_inner().unwrap().len(), 1, "same_cpu split the request");
    }

    #[test]
    fn a_lock_holder_works_inline_while_a_submission_is_on_the_pool() {
        let _submission = Counted::enter(&BLOCKING);
        for mode in [Placement::Pool, Placement::Auto] {
            let held = Policy::new(mode).holding_lock(true);
            assert_eq!(threads_used(held), (16, 0), "{mode:?}");
        }
        // Without the lock the submission does not matter.
        assert_eq!(threads_used(Policy::new(Placement::Pool)), (0, 16));
    }

    #[test]
    fn a_submission_runs_here_while_a_lock_holder_has_chunks_on_the_pool() {
        let _holder = Counted::enter(&LOCK_HOLDERS);
        let me = std::thread::current().id();
        assert!(submit_on_pool(|pooled| !pooled && std::thread::current().id() == me));
    }

    #[test]
    fn a_lock_holder_and_a_submission_never_deadlock() {
        // A lock holder hands chunks to the pool while submissions that wait for its lock
        // keep every pool thread busy: the exclusion must let the holder finish. A deadlock
        // fails the test after a minute instead of hanging it.
        let (tx, rx) = std::sync::mpsc::channel();
        std::thread::spawn(move || {
            let lock = Mutex::new(());
            let done = AtomicBool::new(false);
            std::thread::scope(|s| {
                for _ in 0..pool().current_num_threads() + 1 {
                    s.spawn(|| {
                        while !done.load(Ordering::SeqCst) {
                            submit_on_pool(|_| drop(lock.lock().unwrap_or_else(|p| p.into_inner())));
                        }
                    });
                }
                for _ in 0..50 {
                    let _g = lock.lock().unwrap_or_else(|p| p.into_inner());
                    let mut data = vec![0u8; 8 * CHUNK];
                    let held = Policy::new(Placement::Pool).holding_lock(true);
                    run(held, &mut data[..], CHUNK, |_, p| {
                        p.fill(1);
                        Ok::<(), ()>(())
                    })
                    .unwrap();
                    assert!(data.iter().all(|&b| b == 1));
                }
                done.store(true, Ordering::SeqCst);
            });
            let _ = tx.send(());
        });
        rx.recv_timeout(std::time::Duration::from_secs(60))
            .expect("deadlock: the lock holder never finished");
    }

    proptest! {
        #![proptest_config(ProptestConfig::with_cases(64))]

        #[test]
        fn every_byte_is_processed_exactly_once_and_the_first_error_wins(
            len in 0usize..(5 * CHUNK),
            unit_log in 9u32..13,
            mode in 0usize..3,
            same_cpu: bool,
            fail in proptest::collection::vec(any::<bool>(), 8),
        ) {
            let unit = 1usize << unit_log;
            let len = len - len % unit;
            let chunk = chunk_len(unit);
            let policy = Policy::new(ALL[mode]).same_cpu(same_cpu);
            // Each byte of `data` is incremented once; each chunk's tag bytes record its offset.
            let mut data = vec![0u8; len];
            let tag_per_unit = 4;
            let mut tags = vec![0u8; len / unit * tag_per_unit];
            let r = run_paired(policy, &mut data[..], chunk, &mut tags[..], chunk / unit * tag_per_unit, |off, d, t| {
                prop_assert_eq!(t.len(), d.len() / unit * tag_per_unit);
                d.iter_mut().for_each(|b| *b += 1);
                t.fill((off / chunk) as u8);
                Ok(())
            });
            prop_assert!(r.is_ok(), "{:?}", r);
            prop_assert!(data.iter().all(|&b| b == 1));
            for (i, t) in tags.chunks(chunk / unit * tag_per_unit).enumerate() {
                prop_assert!(t.iter().all(|&b| b == i as u8));
            }
            // Failing chunks: the lowest-numbered failure is returned; without one every chunk
            // ran, and with one at least every chunk up to it.
            let ran = AtomicUsize::new(0);
            let r = run(policy, &data[..], chunk, |off, _| {
                ran.fetch_add(1, Ordering::Relaxed);
                let i = off / chunk;
                if fail.get(i).copied().unwrap_or(false) { Err(i) } else { Ok(()) }
            });
            let parts = len.div_ceil(chunk);
            let first = (0..parts).find(|&i| fail.get(i).copied().unwrap_or(false));
            let ran = ran.into_inner();
            prop_assert!(ran <= parts && ran >= first.map_or(parts, |i| i + 1), "{} of {}", ran, parts);
            prop_assert_eq!(r.err(), first);
        }
    }
}
