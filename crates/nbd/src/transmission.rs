//! The transmission phase: a pool of workers per connection that take turns reading one
//! request, execute it against the device in parallel, and send replies as they finish.
//!
//! ```text
//!            reader (Mutex<BufReader>)                 writer (Mutex<Stream>)
//!   socket ──► worker 1: read hdr+payload ─┐                  ┌─► writev(reply hdr, data)
//!              worker 2: waits for reader  │  execute on      │
//!              worker 3: executing ────────┴─ the device ─────┘   (any order)
//! ```
//!
//! A worker holds the reader lock only while it reads one request (header and payload, so
//! the stream stays in sync), then releases it and executes the request itself: no request
//! ever changes threads. When a worker releases the reader and no other worker is waiting
//! to read, it starts one more (up to `threads_per_connection`), so a connection grows
//! exactly as many threads as its clients' queue depth needs.
//!
//! The queue-depth-1 fast path (`ServerConfig::inline_qd1`, on by default): when nothing
//! else of the connection is in flight and no further request is buffered, the worker runs
//! a small READ or WRITE while keeping the reader (`Conn::run_holding_reader`), so a QD1
//! client is served by one thread with no hand-off per request (a futex wake and a thread
//! switch: 25-30% of the server's CPU per 4 KiB request). A request slower than 200 µs
//! turns it off for the next 256 requests, so a slow device keeps its parallel workers.
//! Before it reads the next request header, the worker busy-polls the socket for a short
//! while (`crate::poll`), so that the client's next request needs no wake-up of an idle CPU.
//!
//! A READ or WRITE takes its payload buffer from the server's budget (`crate::budget`)
//! before the worker lets go of the reader, and gives it back after the reply has left: a
//! connection over its share reads no further requests, so a client that does not take its
//! replies holds at most `connection_budget` bytes and stalls only itself. With an idle
//! timeout the socket has read and write timeouts (see `Conn::wait_for_request`).
//!
//! Replies are combined: a worker whose small reply finds another worker sending appends it
//! to a bounded queue, which the sending worker writes out before it lets go of the socket.
//! Under load several replies leave in one system call; at queue depth 1 nothing changes.
//!
//! Batches of writes (`ServerConfig::inline_batch`, on by default): one `recv` of the
//! reader's 64 KiB buffer brings several pipelined requests at once (about 11 4 KiB writes
//! at queue depth 32). While the whole next request is already in that buffer, the worker
//! holding the reader runs a small WRITE itself instead of handing the reader to another
//! worker, and holds its replies back ("corks" the reply queue) until the batch ends, so
//! the batch costs one thread and about one `write` of replies instead of a futex wake, a
//! thread switch and a share of a `writev` per request (`Conn::batch_next`). Only writes:
//! their replies are 16–20 bytes, while a READ's reply would be copied into the queue (4
//! KiB reads are already well ahead of the peers; see BENCHMARKS.md). The last request of a
//! batch (nothing more buffered) takes the ordinary path, so another worker is reading the
//! socket while it runs. A batch never waits for the socket, since it only runs requests
//! already received. A batch runs its requests one after another, so a slow one delays the
//! rest: batching starts only after the connection's first `BATCH_WARMUP` small writes,
//! and any small write slower than 200 µs (in a batch or not) turns it off for the next
//! `INLINE_BACKOFF` requests, so a slow device keeps its parallel workers and a fast one
//! that sometimes stalls loses at most one batch to each stall. Reads are not timed.

use std::io::{self, BufRead, BufReader, IoSlice, Read, Write};
use std::net::Shutdown;
use std::panic::{catch_unwind, AssertUnwindSafe};
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::{Mutex, MutexGuard, PoisonError};
use std::thread::{self, Scope};
use std::time::{Duration, Instant};

use blockdev::{BlockDevice, BlockError, BlockErrorKind, Caps, ExtentFlags, WriteFlags, ZeroFlags};
use log::{debug, info, warn};

use crate::budget::{Budget, ConnBudget};
use crate::handshake::{Session, BASE_ALLOCATION_ID};
use crate::poll::{BusyPoll, PollState};
use crate::server::{Export, ExportParams, ServerConfig};
use crate::stream::{write_all_vectored, Stream};
use crate::wire::{self, cmd, cmd_flag, errno, state, tflag, Request};

/// TRIM and WRITE_ZEROES are passed to the device in pieces of at most this many bytes, so
/// that a 4 GiB request neither makes a device allocate in proportion nor holds up shutdown
/// for its whole length.
pub(crate) const ZERO_CHUNK: u64 = 64 << 20;

/// Most extents in one `NBD_REPLY_TYPE_BLOCK_STATUS` chunk (8 KiB of descriptors; the spec
/// asks for at most 2^20). A client asks again from where a shorter answer ended.
pub(crate) const MAX_EXTENTS: usize = 1024;

/// What the server imposes on every connection.
pub(crate) struct Limits<'a> {
    pub(crate) config: &'a ServerConfig,
    /// The server-wide payload budget.
    pub(crate) budget: &'a Budget,
    /// Set when the server shuts down.
    pub(crate) stopping: &'a AtomicBool,
    /// Busy polling for the next request.
    pub(crate) poll: &'a BusyPoll,
}

/// Serves requests until the client disconnects, breaks the protocol, or the socket is shut
/// down; returns after every request read has been answered (or the socket failed).
pub(crate) fn serve(
    reader: BufReader<Stream>,
    writer: Stream,
    export: &Export,
    limits: Limits<'_>,
    session: Session,
    peer: &str,
) {
    let config = limits.config;
    let params = ExportParams::new(export, config);
    let conn = Conn {
        budget: limits.budget,
        conn_budget: ConnBudget::new(config.effective_connection_budget()),
        stopping: limits.stopping,
        // Not over TLS: there the requests come from the pump thread, which needs the CPU a
        // poll would take (4k QD32 writes lost 12–19%), and the client's wake-up of the pump
        // stays anyway.
        poll: (!session.tls && limits.poll.is_on()).then_some(limits.poll),
        poll_state: PollState::default(),
        idle_timeout: config.idle_timeout.is_some(),
        device: &*export.device,
        tflags: params.tflags(session.structured),
        params,
        structured: session.structured,
        base_allocation: session.base_allocation,
        reader: Mutex::new(reader),
        writer: Mutex::new(writer),
        pending: Mutex::new(Pending::default()),
        closing: AtomicBool::new(false),
        readers: AtomicUsize::new(0),
        workers: AtomicUsize::new(1),
        max_workers: config.threads_per_connection.max(1),
        inline_qd1: config.inline_qd1,
        inline_batch: config.inline_batch,
        slow_skip: AtomicUsize::new(0),
        batch_skip: AtomicUsize::new(BATCH_WARMUP),
        peer,
    };
    thread::scope(|s| conn.worker(s));
}

/// One connection in transmission.
struct Conn<'a> {
    /// Payload buffers come from here, and go back after the reply has left.
    budget: &'a Budget,
    /// This connection's share of `budget`.
    conn_budget: ConnBudget,
    /// The server is shutting down.
    stopping: &'a AtomicBool,
    /// Busy polling for the next request (`crate::poll`), and this connection's history.
    poll: Option<&'a BusyPoll>,
    poll_state: PollState,
    /// The socket has read and write timeouts (`ServerConfig::idle_timeout`).
    idle_timeout: bool,
    device: &'a dyn BlockDevice,
    params: ExportParams,
    tflags: u16,
    structured: bool,
    /// `base:allocation` was selected: BLOCK_STATUS is allowed.
    base_allocation: bool,
    reader: Mutex<BufReader<Stream>>,
    writer: Mutex<Stream>,
    /// Replies waiting for the worker that is sending (see `send`).
    pending: Mutex<Pending>,
    /// Set when no further request will be read: the client disconnected or broke the
    /// protocol, the socket failed, or the server is shutting down.
    closing: AtomicBool,
    /// Workers waiting for or holding the reader lock.
    readers: AtomicUsize,
    /// Workers started.
    workers: AtomicUsize,
    max_workers: usize,
    /// `ServerConfig::inline_qd1`: the fast path of `run_holding_reader` is on.
    inline_qd1: bool,
    /// `ServerConfig::inline_batch`: buffered requests run in batches (`batch_next`).
    inline_batch: bool,
    /// Requests left before the fast path (`run_holding_reader`) may be tried again after a
    /// slow one; racy updates are harmless (it is a hint).
    slow_skip: AtomicUsize,
    /// The same for batches (`batch_next`): starts at `BATCH_WARMUP`.
    batch_skip: AtomicUsize,
    peer: &'a str,
}

/// Replies queued behind the one being sent.
#[derive(Default)]
struct Pending {
    /// A worker is sending and will send `buf` too before it stops.
    sending: bool,
    buf: Vec<u8>,
}

/// Replies up to this size are combined with others (see `Conn::send`).
const COMBINE_MAX: usize = 64 * 1024;
/// Most bytes of replies queued behind the one being sent. Not part of the memory budget:
/// a fixed cost per connection, like the 64 KiB read buffer.
const MAX_PENDING: usize = 256 * 1024;

/// Largest READ or WRITE the fast path runs while holding the reader.
const INLINE_MAX: usize = 64 * 1024;
/// A fast-path request slower than this turns the fast path off for a while.
const INLINE_SLOW: Duration = Duration::from_micros(200);
/// Requests handed off the ordinary way after a slow fast-path request.
const INLINE_BACKOFF: usize = 256;
/// Most requests run in one batch before its replies are let out (see `Conn::batch_next`).
const BATCH_MAX: usize = 32;
/// Requests a connection runs the ordinary way before its first batch, so that requests
/// sent together to a device not yet seen to be fast still run in parallel.
const BATCH_WARMUP: usize = 64;

/// What reading one request produced.
enum Next {
    /// A valid request, with its payload buffer (charged to the budget) for a READ or WRITE
    /// of nonzero length; a WRITE's payload is in it.
    Run(Request, Option<Vec<u8>>),
    /// An invalid request, answered with this error (its payload was consumed and dropped).
    Reject(Request, u32, &'static str),
    /// `NBD_CMD_DISC`.
    Disconnect,
}

/// Why no request could be read.
enum Stop {
    /// End of stream (clean, or a client that vanished mid-request).
    Eof(&'static str),
    /// Anything else: a socket error or a request that cannot be resynchronised.
    Fatal(String),
    /// The connection was idle for `ServerConfig::idle_timeout`.
    Idle,
    /// The connection or the server closed while waiting for budget.
    Cancelled,
}

/// Why executing a request failed.
enum Failure {
    Device(BlockError),
    /// The server began shutting down between two pieces of a TRIM or WRITE_ZEROES.
    Shutdown,
}

impl From<BlockError> for Failure {
    fn from(e: BlockError) -> Self {
        Failure::Device(e)
    }
}

/// What an error reply tells the client about a device error: the kind only. The error's
/// own text (which can name host paths, e.g. the backing file's) goes to the log.
fn client_message(kind: BlockErrorKind) -> &'static str {
    match kind {
        BlockErrorKind::Misaligned => "request not aligned to the device's block size",
        BlockErrorKind::OutOfRange => "request beyond the end of the device",
        BlockErrorKind::Unsupported => "operation not supported by the device",
        BlockErrorKind::ReadOnly => "device is read-only",
        BlockErrorKind::IntegrityMismatch { .. } => "integrity check failed",
        BlockErrorKind::Poisoned => "device refuses writes after a failed metadata write",
        BlockErrorKind::NoSpace => "no space left on the backing device",
        BlockErrorKind::InvalidArgument => "invalid argument",
        _ => "I/O error",
    }
}

/// The requests that run in batches: small WRITEs (see the module's documentation).
fn batchable(req: &Request) -> bool {
    req.typ == cmd::WRITE && req.length as usize <= INLINE_MAX
}

/// Whether `buffered` (the reader's buffer) holds a whole request: its header and, for a
/// WRITE, its payload. Anything that does not decode counts as not there: reading it the
/// ordinary way reports the error.
fn next_request_buffered(buffered: &[u8]) -> bool {
    let Some(hdr) = buffered.first_chunk::<{ Request::SIZE }>() else {
        return false;
    };
    match Request::decode(hdr) {
        Ok(next) if next.typ == cmd::WRITE => buffered.len() - Request::SIZE >= next.length as usize,
        Ok(_) => true,
        Err(_) => false,
    }
}

fn lock<T>(m: &Mutex<T>) -> MutexGuard<'_, T> {
    m.lock().unwrap_or_else(PoisonError::into_inner)
}

fn cmd_name(typ: u16) -> &'static str {
    match typ {
        cmd::READ => "READ",
        cmd::WRITE => "WRITE",
        cmd::DISC => "DISC",
        cmd::FLUSH => "FLUSH",
        cmd::TRIM => "TRIM",
        cmd::CACHE => "CACHE",
        cmd::WRITE_ZEROES => "WRITE_ZEROES",
        cmd::BLOCK_STATUS => "BLOCK_STATUS",
        _ => "unknown command",
    }
}

fn read_stop(e: io::Error, what: &'static str) -> Stop {
    // A client killed mid-request resets the connection: as unremarkable as a plain EOF.
    if matches!(
        e.kind(),
        io::ErrorKind::UnexpectedEof | io::ErrorKind::ConnectionReset | io::ErrorKind::ConnectionAborted
    ) {
        Stop::Eof(what)
    } else {
        Stop::Fatal(format!("reading {what}: {e}"))
    }
}

impl<'a> Conn<'a> {
    fn worker<'s>(&'s self, scope: &'s Scope<'s, '_>) {
        loop {
            if self.closing.load(Ordering::Acquire) {
                break;
            }
            self.readers.fetch_add(1, Ordering::SeqCst);
            let next = {
                let mut r = lock(&self.reader);
                // Whether this worker holds the reply queue for a batch, how many requests
                // the batch has run, and when its last request ended (one clock read per
                // batched request: the end of one is the start of the next).
                let (mut corked, mut batched, mut clock) = (false, 0, None::<Instant>);
                let next = loop {
                    if self.closing.load(Ordering::Acquire) {
                        break None;
                    }
                    let next = self.read_next(&mut r);
                    if matches!(next, Err(_) | Ok(Next::Disconnect)) {
                        // Still under the lock: waiting workers see it before they read.
                        self.closing.store(true, Ordering::Release);
                    }
                    match next {
                        Ok(Next::Run(req, buf)) if self.run_holding_reader(&req, r.buffer()) => {
                            // A quick one here shows the device fast, as on the ordinary
                            // path: it counts towards the batches' warm-up.
                            self.count_down_batch_skip(&req);
                            self.run_timed(&req, buf);
                            // The next read may wait for the client, which may be waiting
                            // for the replies a batch held back: let them out first.
                            if corked {
                                self.uncork();
                                corked = false;
                            }
                            (batched, clock) = (0, None);
                        }
                        Ok(Next::Run(req, buf)) if self.batch_next(&req, r.buffer()) => {
                            if !corked {
                                corked = self.cork();
                            }
                            let start = clock.unwrap_or_else(Instant::now);
                            self.run(&req, buf);
                            let end = Instant::now();
                            if end.duration_since(start) > INLINE_SLOW {
                                self.slowed();
                            }
                            clock = Some(end);
                            batched += 1;
                            if batched == BATCH_MAX {
                                if corked {
                                    self.uncork();
                                    corked = false;
                                }
                                (batched, clock) = (0, None);
                            }
                        }
                        next => break Some(next),
                    }
                };
                if corked {
                    self.uncork();
                }
                next
            };
            let Some(next) = next else {
                self.readers.fetch_sub(1, Ordering::SeqCst);
                break;
            };
            let others_reading = self.readers.fetch_sub(1, Ordering::SeqCst) - 1;
            let (req, buf) = match next {
                Ok(Next::Run(req, buf)) => (req, buf),
                Ok(Next::Reject(req, err, msg)) => {
                    debug!(
                        "{}: {} at {}+{} rejected: {msg}",
                        self.peer,
                        cmd_name(req.typ),
                        req.offset,
                        req.length
                    );
                    self.send_error(&req, err, msg);
                    continue;
                }
                Ok(Next::Disconnect) => {
                    debug!("{}: client sent NBD_CMD_DISC", self.peer);
                    break;
                }
                Err(Stop::Eof(what)) => {
                    debug!("{}: end of stream while reading {what}", self.peer);
                    break;
                }
                Err(Stop::Fatal(msg)) => {
                    warn!("{}: {msg}; closing the connection", self.peer);
                    break;
                }
                Err(Stop::Idle) => {
                    info!("{}: idle for the idle timeout; closing the connection", self.peer);
                    break;
                }
                Err(Stop::Cancelled) => {
                    debug!("{}: closing while waiting for memory budget", self.peer);
                    break;
                }
            };
            if others_reading == 0 {
                self.spawn_worker(scope);
            }
            if self.inline_qd1 {
                let skip = self.slow_skip.load(Ordering::Relaxed);
                if skip > 0 {
                    self.slow_skip.store(skip - 1, Ordering::Relaxed);
                }
            }
            if self.count_down_batch_skip(&req) {
                // Timed: a slow one here turns batches off too.
                self.run_timed(&req, buf);
            } else {
                self.run(&req, buf);
            }
        }
    }

    /// The queue-depth-1 fast path: whether the worker that has just read `req` should run
    /// it while still holding the reader, instead of handing the reader to another worker
    /// (a futex wake and a thread switch per request: 25-30% of the server's CPU for a
    /// 4 KiB request). Only when nothing else of this connection is in flight
    /// (every worker is waiting for the reader), no further request is already buffered
    /// (`buffered`), the request is a small READ or WRITE, and the device has been quick
    /// lately: then the client is waiting for this reply before it sends more, and nobody
    /// is delayed. A client that sends its next request meanwhile waits at most one small,
    /// fast request; once requests overlap, the ordinary hand-off takes over again.
    fn run_holding_reader(&self, req: &Request, buffered: &[u8]) -> bool {
        self.inline_qd1
            && matches!(req.typ, cmd::READ | cmd::WRITE)
            && req.length as usize <= INLINE_MAX
            && buffered.is_empty()
            && self.slow_skip.load(Ordering::Relaxed) == 0
            && self.workers.load(Ordering::SeqCst) == self.readers.load(Ordering::SeqCst)
    }

    /// Whether the worker that has just read `req` should run it in a batch while keeping
    /// the reader (see the module's documentation): batching is on and has not been turned
    /// off by a slow request, `req` is a small WRITE, and the whole next request
    /// (its header and, for a WRITE, its payload) is already in the reader's buffer
    /// (`buffered`), so reading it will not wait for the socket while replies are held back.
    fn batch_next(&self, req: &Request, buffered: &[u8]) -> bool {
        self.inline_batch
            && batchable(req)
            && self.batch_skip.load(Ordering::Relaxed) == 0
            && next_request_buffered(buffered)
    }

    /// Holds the reply queue for a batch: replies (this worker's and others') queue up
    /// instead of being sent until `uncork`. `false` if another worker is sending right now:
    /// replies then queue behind it anyway.
    fn cork(&self) -> bool {
        let mut q = lock(&self.pending);
        if q.sending {
            false
        } else {
            q.sending = true;
            true
        }
    }

    /// Ends a batch: sends the queued replies and lets go of the reply queue.
    fn uncork(&self) {
        let mut w = lock(&self.writer);
        let result = self.drain_pending(&mut w, Ok(()));
        self.sent(&mut w, result);
    }

    /// For a request that may run in a batch (batches on, a small WRITE): one request
    /// fewer before batches may run again (`batch_skip`); returns whether it was one.
    fn count_down_batch_skip(&self, req: &Request) -> bool {
        if !(self.inline_batch && batchable(req)) {
            return false;
        }
        let skip = self.batch_skip.load(Ordering::Relaxed);
        if skip > 0 {
            self.batch_skip.store(skip - 1, Ordering::Relaxed);
        }
        true
    }

    /// `run` for the fast path and batches: a request slower than `INLINE_SLOW` (a device
    /// that sleeps, e.g. O_DIRECT on a disk) turns both off for the next `INLINE_BACKOFF`
    /// requests, so that a slow device keeps its parallel workers.
    fn run_timed(&self, req: &Request, buf: Option<Vec<u8>>) {
        let t = Instant::now();
        self.run(req, buf);
        if t.elapsed() > INLINE_SLOW {
            self.slowed();
        }
    }

    /// A request was slow: the fast path and batches are off for the next `INLINE_BACKOFF`
    /// requests.
    fn slowed(&self) {
        self.slow_skip.store(INLINE_BACKOFF, Ordering::Relaxed);
        self.batch_skip.store(INLINE_BACKOFF, Ordering::Relaxed);
    }

    /// Starts another worker if the limit allows: called when nobody is left to read the
    /// next request while this one executes.
    fn spawn_worker<'s>(&'s self, scope: &'s Scope<'s, '_>) {
        let n = self.workers.load(Ordering::SeqCst);
        if n >= self.max_workers || self.closing.load(Ordering::Acquire) {
            return;
        }
        if self.workers.compare_exchange(n, n + 1, Ordering::SeqCst, Ordering::SeqCst).is_err() {
            return; // another worker is spawning right now
        }
        let spawned =
            thread::Builder::new().name("nbd-worker".into()).spawn_scoped(scope, move || self.worker(scope));
        if let Err(e) = spawned {
            self.workers.fetch_sub(1, Ordering::SeqCst);
            info!("{}: cannot start another worker ({e}); continuing with {n}", self.peer);
        }
    }

    /// Reads one request and, for WRITE, its payload (into a buffer from the budget, or
    /// dropped if the request is rejected), so that the next request starts where the client
    /// put it. A valid READ or WRITE waits here, holding the reader, until the budget has
    /// room for its payload: a connection over its share reads nothing more.
    fn read_next(&self, r: &mut BufReader<Stream>) -> Result<Next, Stop> {
        // Busy: a worker that is neither reading nor waiting to read executes or replies.
        let busy = || self.workers.load(Ordering::SeqCst) > self.readers.load(Ordering::SeqCst);
        let wait = self.poll.map(|p| p.before_read(&self.poll_state, r, busy()));
        if self.idle_timeout {
            self.wait_for_request(r)?;
        }
        let mut hb = [0u8; Request::SIZE];
        r.read_exact(&mut hb).map_err(|e| read_stop(e, "a request header"))?;
        if let (Some(p), Some(wait)) = (self.poll, wait) {
            p.waited(&self.poll_state, wait);
        }
        let req = Request::decode(&hb).map_err(|e| Stop::Fatal(e.to_string()))?;
        if req.typ == cmd::DISC {
            return Ok(Next::Disconnect);
        }
        let check = self.validate(&req);
        let len = req.length as usize;
        let mut buf = None;
        if check.is_ok() && matches!(req.typ, cmd::READ | cmd::WRITE) && len > 0 {
            let give_up = || self.closing.load(Ordering::Acquire) || self.stopping.load(Ordering::SeqCst);
            buf = Some(self.budget.acquire(&self.conn_budget, len, give_up).ok_or(Stop::Cancelled)?);
        }
        if req.typ == cmd::WRITE {
            if let Some(b) = buf.as_mut() {
                if let Some(p) = self.poll {
                    p.before_payload(r, len, busy());
                }
                if let Err(e) = r.read_exact(&mut b[..len]) {
                    self.budget.release(&self.conn_budget, std::mem::take(b));
                    return Err(read_stop(e, "a write payload"));
                }
            } else if check.is_err() {
                let n = io::copy(&mut r.by_ref().take(u64::from(req.length)), &mut io::sink())
                    .map_err(|e| read_stop(e, "a rejected write payload"))?;
                if n < u64::from(req.length) {
                    return Err(Stop::Eof("a rejected write payload"));
                }
            }
        }
        Ok(match check {
            Ok(()) => Next::Run(req, buf),
            Err((err, msg)) => Next::Reject(req, err, msg),
        })
    }

    /// With an idle timeout: waits until the next request starts arriving. A read timeout
    /// while other requests of this connection are still in flight is not idleness (the
    /// client is waiting for them); otherwise the connection is idle and closes.
    fn wait_for_request(&self, r: &mut BufReader<Stream>) -> Result<(), Stop> {
        loop {
            match r.fill_buf() {
                Ok(_) => return Ok(()),
                Err(e) if e.kind() == io::ErrorKind::Interrupted => {}
                Err(e) if matches!(e.kind(), io::ErrorKind::WouldBlock | io::ErrorKind::TimedOut) => {
                    // Workers not waiting for the reader are executing or replying.
                    let busy = self.workers.load(Ordering::SeqCst) > self.readers.load(Ordering::SeqCst);
                    if !busy {
                        return Err(Stop::Idle);
                    }
                }
                Err(e) => return Err(read_stop(e, "a request header")),
            }
        }
    }

    /// Checks a request against the protocol and the export, as the NBD spec asks: EINVAL
    /// for bad flags, unknown commands, misalignment and reads/trims past the end; ENOSPC
    /// for writes past the end; EPERM for writes to a read-only export; EOVERFLOW for reads
    /// too big to send in one chunk (only when structured replies make DF meaningful);
    /// EINVAL for BLOCK_STATUS without a selected metadata context or of length 0.
    fn validate(&self, req: &Request) -> Result<(), (u32, &'static str)> {
        let p = &self.params;
        let (allowed_flags, writes) = match req.typ {
            cmd::READ => (if self.structured { cmd_flag::DF } else { 0 }, false),
            cmd::WRITE => (cmd_flag::FUA, true),
            cmd::FLUSH => (0, false),
            cmd::TRIM => (cmd_flag::FUA, true),
            cmd::WRITE_ZEROES => (cmd_flag::FUA | cmd_flag::NO_HOLE, true),
            cmd::BLOCK_STATUS => (cmd_flag::REQ_ONE, false),
            _ => return Err((errno::EINVAL, "unknown or unsupported command")),
        };
        if req.flags & !allowed_flags != 0 {
            return Err((errno::EINVAL, "command flag not valid for this command"));
        }
        if writes && p.read_only {
            return Err((errno::EPERM, "export is read-only"));
        }
        if req.flags & cmd_flag::FUA != 0 && self.tflags & tflag::SEND_FUA == 0 {
            return Err((errno::EINVAL, "FUA not supported by this export"));
        }
        match req.typ {
            cmd::FLUSH => {
                if self.tflags & tflag::SEND_FLUSH == 0 {
                    return Err((errno::EINVAL, "flush not supported by this export"));
                }
                if req.offset != 0 || req.length != 0 {
                    return Err((errno::EINVAL, "flush with an offset or length"));
                }
                return Ok(());
            }
            cmd::TRIM if self.tflags & tflag::SEND_TRIM == 0 => {
                return Err((errno::EINVAL, "trim not supported by this export"));
            }
            cmd::READ if req.length > p.max_request => {
                let e = if self.structured { errno::EOVERFLOW } else { errno::EINVAL };
                return Err((e, "read larger than the maximum block size"));
            }
            cmd::WRITE if req.length > p.max_request => {
                return Err((errno::EINVAL, "write larger than the maximum block size"));
            }
            cmd::BLOCK_STATUS if !self.base_allocation => {
                return Err((errno::EINVAL, "no metadata context was selected"));
            }
            cmd::BLOCK_STATUS if req.length == 0 => {
                return Err((errno::EINVAL, "block status of length zero"));
            }
            _ => {}
        }
        let in_range = req.offset.checked_add(u64::from(req.length)).is_some_and(|end| end <= p.size);
        if !in_range {
            let e =
                if matches!(req.typ, cmd::WRITE | cmd::WRITE_ZEROES) { errno::ENOSPC } else { errno::EINVAL };
            return Err((e, "request beyond the end of the export"));
        }
        let bs = u64::from(p.min_block);
        if req.offset % bs != 0 || u64::from(req.length) % bs != 0 {
            return Err((errno::EINVAL, "request not aligned to the minimum block size"));
        }
        Ok(())
    }

    /// Executes a valid request, answers it, and gives its buffer back to the budget once
    /// the reply has left.
    fn run(&self, req: &Request, mut buf: Option<Vec<u8>>) {
        let len = req.length as usize;
        let payload: &mut [u8] = match buf.as_mut() {
            Some(b) => &mut b[..len],
            None => &mut [],
        };
        match catch_unwind(AssertUnwindSafe(|| self.execute(req, payload))) {
            Ok(Ok(Some(chunk))) => self.send(&mut [IoSlice::new(&chunk)]),
            Ok(Ok(None)) => {
                let data = if req.typ == cmd::READ { &payload[..] } else { &[][..] };
                self.send_ok(req, data);
            }
            Ok(Err(Failure::Device(e))) => {
                warn!("{}: {} at {}+{} failed: {e}", self.peer, cmd_name(req.typ), req.offset, req.length);
                self.send_error(req, wire::nbd_errno(e.kind().errno()), client_message(e.kind()));
            }
            Ok(Err(Failure::Shutdown)) => {
                info!(
                    "{}: {} at {}+{} cut short by shutdown",
                    self.peer,
                    cmd_name(req.typ),
                    req.offset,
                    req.length
                );
                self.send_error(req, errno::ESHUTDOWN, "server is shutting down");
            }
            Err(_) => {
                warn!("{}: the device panicked during {} at {}", self.peer, cmd_name(req.typ), req.offset);
                self.send_error(req, errno::EIO, "internal error in the device");
            }
        }
        if let Some(b) = buf {
            self.budget.release(&self.conn_budget, b);
        }
    }

    /// Executes a request; `Some` is a reply of its own (a block status chunk), `None` asks
    /// for the ordinary success reply.
    fn execute(&self, req: &Request, buf: &mut [u8]) -> Result<Option<Vec<u8>>, Failure> {
        let dev = self.device;
        let (off, len) = (req.offset, req.length);
        let fua = req.flags & cmd_flag::FUA != 0;
        let native_fua = self.params.caps.contains(Caps::FUA);
        // FUA without native support is emulated with a flush after the operation.
        let flush_after = fua && !native_fua;
        match req.typ {
            cmd::READ => {
                if len > 0 {
                    dev.read_at(off, &mut buf[..len as usize])?;
                }
            }
            cmd::WRITE => {
                if len > 0 {
                    let flags = if fua && native_fua { WriteFlags::FUA } else { WriteFlags::empty() };
                    // The payload buffer is ours and is refilled by the next request, so
                    // the device may use it as scratch (crypt encrypts in place).
                    dev.write_at_scratch(off, &mut buf[..len as usize], flags)?;
                }
            }
            cmd::FLUSH => dev.flush()?,
            cmd::TRIM | cmd::WRITE_ZEROES => {
                let mut flags = ZeroFlags::empty();
                if req.flags & cmd_flag::NO_HOLE == 0 {
                    flags |= ZeroFlags::MAY_UNMAP;
                }
                // In pieces (see ZERO_CHUNK). FUA must cover the whole range: native FUA on
                // a request of one piece, otherwise one flush at the end (`discard` has no
                // FUA flag of its own anyway).
                let one_piece = u64::from(len) <= ZERO_CHUNK;
                let fua_native_zero = req.typ == cmd::WRITE_ZEROES && fua && native_fua && one_piece;
                if fua_native_zero {
                    flags |= ZeroFlags::FUA;
                }
                let end = off + u64::from(len);
                let mut pos = off;
                while pos < end {
                    if self.stopping.load(Ordering::SeqCst) {
                        return Err(Failure::Shutdown);
                    }
                    let n = ZERO_CHUNK.min(end - pos);
                    if req.typ == cmd::TRIM {
                        dev.discard(pos, n)?;
                    } else {
                        dev.write_zeroes(pos, n, flags)?;
                    }
                    pos += n;
                }
                if fua && !fua_native_zero {
                    dev.flush()?;
                }
                return Ok(None);
            }
            cmd::BLOCK_STATUS => return Ok(Some(self.block_status(req)?)),
            // `validate` lets nothing else through.
            _ => return Err(BlockError::unsupported(cmd_name(req.typ)).into()),
        }
        if flush_after && len > 0 {
            dev.flush()?;
        }
        Ok(None)
    }

    /// The `base:allocation` chunk for a valid BLOCK_STATUS: the device's extents (one with
    /// `REQ_ONE`), as a complete final chunk. The device's answer is held to what the spec
    /// lets a server send: nonzero lengths adding up to at most the request's, at least one.
    fn block_status(&self, req: &Request) -> Result<Vec<u8>, Failure> {
        let max = if req.flags & cmd_flag::REQ_ONE != 0 { 1 } else { MAX_EXTENTS };
        let len = u64::from(req.length);
        let extents = self.device.allocation(req.offset, len, max)?;
        let mut descriptors = Vec::with_capacity(extents.len().min(max));
        let mut covered = 0u64;
        for e in extents.iter().take(max) {
            let n = e.len.min(len - covered);
            if n == 0 {
                break;
            }
            let mut flags = 0;
            if e.flags.contains(ExtentFlags::HOLE) {
                flags |= state::HOLE;
            }
            if e.flags.contains(ExtentFlags::ZERO) {
                flags |= state::ZERO;
            }
            // n <= len, which came from a u32.
            descriptors.push((n as u32, flags));
            covered += n;
        }
        if descriptors.is_empty() {
            return Err(BlockError::new(BlockErrorKind::Io, "the device reported no extent").into());
        }
        let mut chunk = Vec::new();
        wire::encode_block_status_chunk(&mut chunk, req.cookie, BASE_ALLOCATION_ID, &descriptors);
        Ok(chunk)
    }

    /// Answers success; `data` is a READ's payload.
    fn send_ok(&self, req: &Request, data: &[u8]) {
        let mut hdr = [0u8; 28];
        let hdr_len = if !self.structured {
            hdr[..16].copy_from_slice(&wire::encode_simple_reply(req.cookie, 0));
            16
        } else if req.typ == cmd::READ && !data.is_empty() {
            // `validate` bounds reads by max_request (at most 1 GiB), so this fits in u32.
            hdr.copy_from_slice(&wire::encode_offset_data_header(req.cookie, req.offset, data.len() as u32));
            28
        } else {
            hdr[..20].copy_from_slice(&wire::encode_none_chunk(req.cookie));
            20
        };
        self.send(&mut [IoSlice::new(&hdr[..hdr_len]), IoSlice::new(data)]);
    }

    /// Answers an error: a simple reply without data, or a structured ERROR chunk with a
    /// human-readable message.
    fn send_error(&self, req: &Request, err: u32, msg: &str) {
        if self.structured {
            let mut out = Vec::with_capacity(32 + msg.len());
            wire::encode_error_chunk(&mut out, req.cookie, err, msg);
            self.send(&mut [IoSlice::new(&out)]);
        } else {
            self.send(&mut [IoSlice::new(&wire::encode_simple_reply(req.cookie, err))]);
        }
    }

    /// Sends one whole reply. Replies are never interleaved: each is written under the
    /// writer lock, or appended whole to the pending queue (at most `MAX_PENDING` bytes, so
    /// a client that stops reading still stops its workers).
    ///
    /// Small replies are combined: if another worker is already sending, this reply is
    /// copied into the pending queue and that worker sends it with the others in one
    /// `write` (a copy of a few KiB is far cheaper than a system call and a lock handoff).
    /// At queue depth 1 there is never a queue and every reply is one `writev` without copy.
    fn send(&self, bufs: &mut [IoSlice<'_>]) {
        let total: usize = bufs.iter().map(|b| b.len()).sum();
        let combining = total <= COMBINE_MAX && {
            let mut q = lock(&self.pending);
            if !q.sending {
                q.sending = true;
                true
            } else if q.buf.len() + total <= MAX_PENDING {
                for b in bufs.iter() {
                    q.buf.extend_from_slice(b);
                }
                return;
            } else {
                // The queue is full (a client that does not read its replies): wait for the
                // writer like a large reply does, which pushes back on this worker.
                false
            }
        };
        let mut w = lock(&self.writer);
        let mut result = write_all_vectored(&mut *w, bufs);
        if combining {
            // Drain what others queued meanwhile; our `sending` flag makes them queue.
            result = self.drain_pending(&mut w, result);
        }
        self.sent(&mut w, result);
    }

    /// For the worker that holds the reply queue (`Pending::sending`), under the writer
    /// lock: sends what was queued until the queue is empty (or a write failed, `result`),
    /// then lets go of the queue.
    fn drain_pending(&self, w: &mut Stream, mut result: io::Result<()>) -> io::Result<()> {
        let mut batch = Vec::new();
        loop {
            {
                let mut q = lock(&self.pending);
                if q.buf.is_empty() || result.is_err() {
                    q.buf.clear();
                    q.sending = false;
                    if q.buf.capacity() < batch.capacity() {
                        q.buf = batch;
                        q.buf.clear();
                    }
                    break;
                }
                std::mem::swap(&mut q.buf, &mut batch);
            }
            result = w.write_all(&batch);
            batch.clear();
        }
        result
    }

    /// After a reply was written: a failed write closes the connection.
    fn sent(&self, w: &mut Stream, result: io::Result<()>) {
        if let Err(e) = result {
            if !self.closing.swap(true, Ordering::AcqRel) {
                debug!("{}: sending a reply failed: {e}; closing the connection", self.peer);
            }
            let _ = w.shutdown(Shutdown::Both);
        }
    }
}
