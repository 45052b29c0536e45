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
//! the stream stays in sync), then releases it and executes the request itself: at queue
//! depth 1 no request ever changes threads. When a worker releases the reader and no other
//! worker is waiting to read, it starts one more (up to `threads_per_connection`), so a
//! connection grows exactly as many threads as its clients' queue depth needs.
//!
//! Replies are combined: a worker whose small reply finds another worker sending appends it
//! to a bounded queue, which the sending worker writes out before it lets go of the socket.
//! Under load several replies leave in one system call; at queue depth 1 nothing changes.

use std::io::{self, BufReader, IoSlice, Read, Write};
use std::net::Shutdown;
use std::panic::{catch_unwind, AssertUnwindSafe};
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::{Mutex, MutexGuard, PoisonError};
use std::thread::{self, Scope};

use blockdev::{BlockDevice, BlockError, Caps, WriteFlags, ZeroFlags};
use log::{debug, info, warn};

use crate::handshake::Session;
use crate::server::{Export, ExportParams, ServerConfig};
use crate::stream::{write_all_vectored, Stream};
use crate::wire::{self, cmd, cmd_flag, errno, tflag, Request};

/// Worker buffers up to this size are kept for the next request; larger ones (rare, up to
/// the maximum request size) are freed after use.
const KEEP_BUFFER: usize = 4 << 20;

/// Serves requests until the client disconnects, breaks the protocol, or the socket is shut
/// down; returns after every request read has been answered (or the socket failed).
pub(crate) fn serve(
    reader: BufReader<Stream>,
    writer: Stream,
    export: &Export,
    config: &ServerConfig,
    session: Session,
    peer: &str,
) {
    let params = ExportParams::new(export, config);
    let conn = Conn {
        device: &*export.device,
        tflags: params.tflags(session.structured),
        params,
        structured: session.structured,
        reader: Mutex::new(reader),
        writer: Mutex::new(writer),
        pending: Mutex::new(Pending::default()),
        closing: AtomicBool::new(false),
        readers: AtomicUsize::new(0),
        workers: AtomicUsize::new(1),
        max_workers: config.threads_per_connection.max(1),
        peer,
    };
    thread::scope(|s| conn.worker(s));
}

/// One connection in transmission.
struct Conn<'a> {
    device: &'a dyn BlockDevice,
    params: ExportParams,
    tflags: u16,
    structured: bool,
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
/// Most bytes of replies queued behind the one being sent.
const MAX_PENDING: usize = 1 << 20;

/// What reading one request produced.
enum Next {
    /// A valid request; a WRITE's payload is in the worker's buffer.
    Run(Request),
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

/// Makes `buf` at least `len` bytes long. A fresh zeroed allocation (not `resize`) lets the
/// allocator hand out untouched zero pages for big buffers.
fn ensure_len(buf: &mut Vec<u8>, len: usize) {
    if buf.len() < len {
        *buf = vec![0u8; len];
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
        let mut buf: Vec<u8> = Vec::new();
        loop {
            if self.closing.load(Ordering::Acquire) {
                break;
            }
            self.readers.fetch_add(1, Ordering::SeqCst);
            let next = {
                let mut r = lock(&self.reader);
                if self.closing.load(Ordering::Acquire) {
                    drop(r);
                    self.readers.fetch_sub(1, Ordering::SeqCst);
                    break;
                }
                let next = self.read_next(&mut r, &mut buf);
                if matches!(next, Err(_) | Ok(Next::Disconnect)) {
                    // Still under the lock: waiting workers see it before they read.
                    self.closing.store(true, Ordering::Release);
                }
                next
            };
            let others_reading = self.readers.fetch_sub(1, Ordering::SeqCst) - 1;
            let req = match next {
                Ok(Next::Run(req)) => req,
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
            };
            if others_reading == 0 {
                self.spawn_worker(scope);
            }
            self.run(&req, &mut buf);
            if buf.len() > KEEP_BUFFER {
                buf = Vec::new();
            }
        }
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

    /// Reads one request and, for WRITE, its payload (into `buf`, or dropped if the request
    /// is rejected), so that the next request starts where the client put it.
    fn read_next(&self, r: &mut BufReader<Stream>, buf: &mut Vec<u8>) -> Result<Next, Stop> {
        let mut hb = [0u8; Request::SIZE];
        r.read_exact(&mut hb).map_err(|e| read_stop(e, "a request header"))?;
        let req = Request::decode(&hb).map_err(|e| Stop::Fatal(e.to_string()))?;
        if req.typ == cmd::DISC {
            return Ok(Next::Disconnect);
        }
        let check = self.validate(&req);
        if req.typ == cmd::WRITE {
            let len = req.length as usize;
            if check.is_ok() {
                ensure_len(buf, len);
                r.read_exact(&mut buf[..len]).map_err(|e| read_stop(e, "a write payload"))?;
            } else {
                let n = io::copy(&mut r.by_ref().take(u64::from(req.length)), &mut io::sink())
                    .map_err(|e| read_stop(e, "a rejected write payload"))?;
                if n < u64::from(req.length) {
                    return Err(Stop::Eof("a rejected write payload"));
                }
            }
        }
        Ok(match check {
            Ok(()) => Next::Run(req),
            Err((err, msg)) => Next::Reject(req, err, msg),
        })
    }

    /// Checks a request against the protocol and the export, as the NBD spec asks: EINVAL
    /// for bad flags, unknown commands, misalignment and reads/trims past the end; ENOSPC
    /// for writes past the end; EPERM for writes to a read-only export; EOVERFLOW for reads
    /// too big to send in one chunk (only when structured replies make DF meaningful).
    fn validate(&self, req: &Request) -> Result<(), (u32, &'static str)> {
        let p = &self.params;
        let (allowed_flags, writes) = match req.typ {
            cmd::READ => (if self.structured { cmd_flag::DF } else { 0 }, false),
            cmd::WRITE => (cmd_flag::FUA, true),
            cmd::FLUSH => (0, false),
            cmd::TRIM => (cmd_flag::FUA, true),
            cmd::WRITE_ZEROES => (cmd_flag::FUA | cmd_flag::NO_HOLE, true),
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

    /// Executes a valid request and answers it.
    fn run(&self, req: &Request, buf: &mut Vec<u8>) {
        let len = req.length as usize;
        if req.typ == cmd::READ {
            ensure_len(buf, len);
        }
        let result = match catch_unwind(AssertUnwindSafe(|| self.execute(req, buf))) {
            Ok(r) => r,
            Err(_) => {
                warn!("{}: the device panicked during {} at {}", self.peer, cmd_name(req.typ), req.offset);
                self.send_error(req, errno::EIO, "internal error in the device");
                return;
            }
        };
        match result {
            Ok(()) => {
                let data = if req.typ == cmd::READ { &buf[..len] } else { &[][..] };
                self.send_ok(req, data);
            }
            Err(e) => {
                warn!("{}: {} at {}+{} failed: {e}", self.peer, cmd_name(req.typ), req.offset, req.length);
                let msg = e.to_string();
                let msg = if msg.is_empty() { "I/O error" } else { msg.as_str() };
                self.send_error(req, wire::nbd_errno(e.kind().errno()), msg);
            }
        }
    }

    fn execute(&self, req: &Request, buf: &mut [u8]) -> Result<(), BlockError> {
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
            cmd::TRIM => {
                if len > 0 {
                    dev.discard(off, u64::from(len))?;
                }
                // `discard` has no FUA flag of its own.
                if fua {
                    dev.flush()?;
                }
                return Ok(());
            }
            cmd::WRITE_ZEROES => {
                if len > 0 {
                    let mut flags = ZeroFlags::empty();
                    if req.flags & cmd_flag::NO_HOLE == 0 {
                        flags |= ZeroFlags::MAY_UNMAP;
                    }
                    if fua && native_fua {
                        flags |= ZeroFlags::FUA;
                    }
                    dev.write_zeroes(off, u64::from(len), flags)?;
                }
            }
            // `validate` lets nothing else through.
            _ => return Err(BlockError::unsupported(cmd_name(req.typ))),
        }
        if flush_after && len > 0 {
            dev.flush()?;
        }
        Ok(())
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
        }
        if let Err(e) = result {
            if !self.closing.swap(true, Ordering::AcqRel) {
                debug!("{}: sending a reply failed: {e}; closing the connection", self.peer);
            }
            let _ = w.shutdown(Shutdown::Both);
        }
    }
}
