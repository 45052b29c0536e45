//! Over NBD: a small client, enough to load any NBD server the way fio's nbd engine does.
//!
//! * URIs: `nbd+unix:///NAME?socket=PATH` and `nbd://HOST[:PORT]/NAME` (port 10809).
//! * Handshake: fixed newstyle, `NBD_OPT_STRUCTURED_REPLY` (libnbd asks for it by default,
//!   so the server does the same work as for fio), then `NBD_OPT_GO` asking for block sizes;
//!   `NBD_OPT_EXPORT_NAME` if the server does not know `GO`.
//! * Transmission, one connection per clone:
//!
//! ```text
//!   submitter (clone's thread)             reader thread
//!   ─ take a free slot (blocks when         ─ read a reply header, find its slot by cookie
//!     iodepth requests are in flight)       ─ read data into the slot's buffer (READ)
//!   ─ next op; slot.start = now             ─ end = now; ctx.complete(op, start, end)
//!   ─ write header (+ payload) at once      ─ give the slot back to the submitter
//! ```
//!   At the end: wait for every slot, `FLUSH` if `end_fsync`, `DISC`, close.
//!
//! Latency is from just before the request is written to the socket to just after its reply
//! is read: what fio's `clat` measures with libnbd, transport and server included.
//! Constants and codecs come from `nbd::wire`, the server's own, so client and server cannot
//! drift apart.

use std::io::{BufReader, Read, Write};
use std::net::{Shutdown, TcpStream};
use std::os::unix::net::UnixStream;
use std::path::PathBuf;
use std::sync::{mpsc, Mutex};

use nbd::wire::{
    self, cmd, cmd_flag, handshake_flag, info, opt, rep, reply, tflag, ChunkHeader, InfoRequest,
    OptionHeader, Request,
};

use super::{Target, TargetInfo};
use crate::engine::CloneCtx;
use crate::gen::{Dir, Op};
use crate::BenchError;

/// A parsed NBD URI.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum NbdUri {
    /// `nbd+unix:///NAME?socket=PATH`.
    Unix {
        /// Export name.
        name: String,
        /// Socket path.
        socket: PathBuf,
    },
    /// `nbd://HOST[:PORT]/NAME`.
    Tcp {
        /// `host:port`.
        addr: String,
        /// Export name.
        name: String,
    },
}

fn percent_decode(s: &str) -> Result<String, BenchError> {
    let b = s.as_bytes();
    let mut out = Vec::with_capacity(b.len());
    let mut i = 0;
    while i < b.len() {
        if b[i] == b'%' {
            let hex =
                s.get(i + 1..i + 3).ok_or_else(|| BenchError::usage(format!("bad %-escape in {s:?}")))?;
            out.push(
                u8::from_str_radix(hex, 16)
                    .map_err(|_| BenchError::usage(format!("bad %-escape in {s:?}")))?,
            );
            i += 3;
        } else {
            out.push(b[i]);
            i += 1;
        }
    }
    String::from_utf8(out).map_err(|_| BenchError::usage(format!("{s:?} is not UTF-8 once decoded")))
}

impl std::str::FromStr for NbdUri {
    type Err = BenchError;
    fn from_str(uri: &str) -> Result<Self, BenchError> {
        let bad = |why: &str| BenchError::usage(format!("NBD URI {uri:?}: {why}"));
        if let Some(rest) = uri.strip_prefix("nbd+unix://") {
            let (path, query) = rest.split_once('?').ok_or_else(|| bad("needs ?socket=PATH"))?;
            if !(path.is_empty() || path.starts_with('/')) {
                return Err(bad("nbd+unix URIs have no host: nbd+unix:///NAME?socket=PATH"));
            }
            let name = percent_decode(path.strip_prefix('/').unwrap_or(path))?;
            let socket = query
                .split('&')
                .find_map(|kv| kv.strip_prefix("socket="))
                .ok_or_else(|| bad("needs ?socket=PATH"))?;
            return Ok(NbdUri::Unix { name, socket: PathBuf::from(percent_decode(socket)?) });
        }
        if let Some(rest) = uri.strip_prefix("nbd://") {
            let (hostport, name) = rest.split_once('/').unwrap_or((rest, ""));
            if hostport.is_empty() {
                return Err(bad("needs a host"));
            }
            let has_port = match hostport.rfind(']') {
                Some(close) => hostport[close..].contains(':'),
                None => hostport.contains(':'),
            };
            let addr = if has_port { hostport.to_string() } else { format!("{hostport}:10809") };
            return Ok(NbdUri::Tcp { addr, name: percent_decode(name)? });
        }
        Err(bad("expected nbd+unix:///NAME?socket=PATH or nbd://HOST[:PORT]/NAME (TLS is not supported)"))
    }
}

impl std::fmt::Display for NbdUri {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            NbdUri::Unix { name, socket } => write!(f, "nbd+unix:///{name}?socket={}", socket.display()),
            NbdUri::Tcp { addr, name } => write!(f, "nbd://{addr}/{name}"),
        }
    }
}

#[derive(Debug)]
enum Stream {
    Unix(UnixStream),
    Tcp(TcpStream),
}

impl Stream {
    fn try_clone(&self) -> std::io::Result<Stream> {
        Ok(match self {
            Stream::Unix(s) => Stream::Unix(s.try_clone()?),
            Stream::Tcp(s) => Stream::Tcp(s.try_clone()?),
        })
    }
    fn shutdown(&self) {
        let _ = match self {
            Stream::Unix(s) => s.shutdown(Shutdown::Both),
            Stream::Tcp(s) => s.shutdown(Shutdown::Both),
        };
    }
}

impl Read for Stream {
    fn read(&mut self, buf: &mut [u8]) -> std::io::Result<usize> {
        match self {
            Stream::Unix(s) => s.read(buf),
            Stream::Tcp(s) => s.read(buf),
        }
    }
}

impl Write for Stream {
    fn write(&mut self, buf: &[u8]) -> std::io::Result<usize> {
        match self {
            Stream::Unix(s) => s.write(buf),
            Stream::Tcp(s) => s.write(buf),
        }
    }
    fn flush(&mut self) -> std::io::Result<()> {
        Ok(())
    }
}

/// An NBD connection in transmission phase.
#[derive(Debug)]
struct Conn {
    stream: Stream,
    size: u64,
    tflags: u16,
    min_block: u32,
    max_block: u32,
    structured: bool,
}

fn io_err(context: impl Into<String>) -> impl FnOnce(std::io::Error) -> BenchError {
    let context = context.into();
    move |source| BenchError::NbdIo { context, source }
}

fn proto(msg: impl Into<String>) -> BenchError {
    BenchError::NbdProtocol(msg.into())
}

fn read_u64(r: &mut impl Read, what: &str) -> Result<u64, BenchError> {
    let mut b = [0u8; 8];
    r.read_exact(&mut b).map_err(io_err(format!("reading {what}")))?;
    Ok(u64::from_be_bytes(b))
}

/// Reads one option reply: `(option, type, data)`.
fn read_option_reply(s: &mut Stream) -> Result<(u32, u32, Vec<u8>), BenchError> {
    let mut h = [0u8; 20];
    s.read_exact(&mut h).map_err(io_err("reading an option reply"))?;
    let magic = u64::from_be_bytes(h[0..8].try_into().expect("8 bytes"));
    if magic != wire::OPT_REPLY_MAGIC {
        return Err(proto(format!("bad option reply magic {magic:#x}")));
    }
    let option = u32::from_be_bytes(h[8..12].try_into().expect("4 bytes"));
    let typ = u32::from_be_bytes(h[12..16].try_into().expect("4 bytes"));
    let len = u32::from_be_bytes(h[16..20].try_into().expect("4 bytes")) as usize;
    if len > 1 << 20 {
        return Err(proto(format!("option reply of {len} bytes")));
    }
    let mut data = vec![0u8; len];
    s.read_exact(&mut data).map_err(io_err("reading option reply data"))?;
    Ok((option, typ, data))
}

fn send_option(s: &mut Stream, option: u32, data: &[u8]) -> Result<(), BenchError> {
    let mut msg = OptionHeader { option, length: data.len() as u32 }.encode().to_vec();
    msg.extend_from_slice(data);
    s.write_all(&msg).map_err(io_err("sending an option"))
}

fn connect(uri: &NbdUri) -> Result<Conn, BenchError> {
    let mut stream = match uri {
        NbdUri::Unix { socket, .. } => Stream::Unix(
            UnixStream::connect(socket).map_err(io_err(format!("connecting to {}", socket.display())))?,
        ),
        NbdUri::Tcp { addr, .. } => {
            let s = TcpStream::connect(addr).map_err(io_err(format!("connecting to {addr}")))?;
            s.set_nodelay(true).map_err(io_err("setting TCP_NODELAY"))?;
            Stream::Tcp(s)
        }
    };
    let name = match uri {
        NbdUri::Unix { name, .. } | NbdUri::Tcp { name, .. } => name.clone(),
    };
    let magic = read_u64(&mut stream, "the server greeting")?;
    if magic != wire::NBDMAGIC {
        return Err(proto(format!("not an NBD server (greeting {magic:#x})")));
    }
    let newstyle = read_u64(&mut stream, "the server greeting")?;
    if newstyle != wire::IHAVEOPT {
        return Err(proto("the server speaks oldstyle NBD; only fixed newstyle is supported"));
    }
    let mut f = [0u8; 2];
    stream.read_exact(&mut f).map_err(io_err("reading handshake flags"))?;
    let hflags = u16::from_be_bytes(f);
    if hflags & handshake_flag::FIXED_NEWSTYLE == 0 {
        return Err(proto("the server does not speak fixed newstyle"));
    }
    let no_zeroes = hflags & handshake_flag::NO_ZEROES != 0;
    let cflags = u32::from(handshake_flag::FIXED_NEWSTYLE)
        | if no_zeroes { u32::from(handshake_flag::NO_ZEROES) } else { 0 };
    stream.write_all(&cflags.to_be_bytes()).map_err(io_err("sending client flags"))?;

    send_option(&mut stream, opt::STRUCTURED_REPLY, &[])?;
    let (_, typ, _) = read_option_reply(&mut stream)?;
    let structured = typ == rep::ACK;

    let go = InfoRequest { name: name.as_bytes(), requests: vec![info::BLOCK_SIZE] }.encode();
    send_option(&mut stream, opt::GO, &go)?;
    let (mut size, mut tflags, mut min_block, mut max_block) = (None, 0u16, 1u32, 32u32 << 20);
    loop {
        let (option, typ, data) = read_option_reply(&mut stream)?;
        if option != opt::GO {
            return Err(proto(format!("reply to option {option} while waiting for GO")));
        }
        match typ {
            rep::ACK => break,
            rep::INFO if data.len() >= 2 => match u16::from_be_bytes([data[0], data[1]]) {
                info::EXPORT if data.len() >= 12 => {
                    size = Some(u64::from_be_bytes(data[2..10].try_into().expect("8 bytes")));
                    tflags = u16::from_be_bytes([data[10], data[11]]);
                }
                info::BLOCK_SIZE if data.len() >= 14 => {
                    min_block = u32::from_be_bytes(data[2..6].try_into().expect("4 bytes"));
                    max_block = u32::from_be_bytes(data[10..14].try_into().expect("4 bytes"));
                }
                _ => {}
            },
            rep::ERR_UNSUP => {
                // An old server: select the export the old way.
                send_option(&mut stream, opt::EXPORT_NAME, name.as_bytes())?;
                size = Some(read_u64(&mut stream, "the export size")?);
                stream.read_exact(&mut f).map_err(io_err("reading transmission flags"))?;
                tflags = u16::from_be_bytes(f);
                if !no_zeroes {
                    let mut z = [0u8; 124];
                    stream.read_exact(&mut z).map_err(io_err("reading the zero padding"))?;
                }
                break;
            }
            t if t & rep::ERR_BIT != 0 => {
                let msg = String::from_utf8_lossy(&data).into_owned();
                let what = match t {
                    rep::ERR_UNKNOWN => "no such export",
                    rep::ERR_TLS_REQD => "the server requires TLS (not supported here)",
                    rep::ERR_SHUTDOWN => "the server is shutting down",
                    _ => "the server refused the export",
                };
                return Err(proto(format!(
                    "{what} {name:?} (reply {t:#x}{}{msg})",
                    if msg.is_empty() { "" } else { ": " }
                )));
            }
            _ => {}
        }
    }
    let size = size.ok_or_else(|| proto("the server never sent the export size"))?;
    Ok(Conn { stream, size, tflags, min_block: min_block.max(1), max_block, structured })
}

/// An NBD export as a target.
#[derive(Debug)]
pub struct NbdTarget {
    uri: NbdUri,
    info: TargetInfo,
    max_block: u32,
    read_only: bool,
}

impl NbdTarget {
    /// Connects once to learn the export's size and flags.
    pub fn connect(uri: &NbdUri) -> Result<Self, BenchError> {
        let conn = connect(uri)?;
        let mut s = conn.stream.try_clone().map_err(io_err("cloning the socket"))?;
        let _ = s.write_all(&Request { flags: 0, typ: cmd::DISC, cookie: 0, offset: 0, length: 0 }.encode());
        conn.stream.shutdown();
        let block = conn.min_block.clamp(512, 65536).next_power_of_two();
        Ok(NbdTarget {
            info: TargetInfo {
                size: conn.size,
                block,
                fua: conn.tflags & tflag::SEND_FUA != 0,
                description: format!("nbd {uri}{}", if conn.structured { "" } else { " (simple replies)" }),
            },
            uri: uri.clone(),
            max_block: conn.max_block,
            read_only: conn.tflags & tflag::READ_ONLY != 0,
        })
    }
}

/// One request slot: what is in flight under a cookie.
#[derive(Debug)]
struct Slot {
    op: Option<Op>,
    flush: bool,
    start_ns: u64,
    buf: Vec<u8>,
    error: Option<u32>,
}

impl Target for NbdTarget {
    fn info(&self) -> &TargetInfo {
        &self.info
    }

    fn run_clone(&self, ctx: &CloneCtx<'_>) -> Result<(), BenchError> {
        let conn = connect(&self.uri)?;
        let depth = ctx.iodepth();
        let reader_stream = conn.stream.try_clone().map_err(io_err("cloning the socket"))?;
        let mut writer = conn.stream;
        let slots: Vec<Mutex<Slot>> = (0..depth)
            .map(|_| Mutex::new(Slot { op: None, flush: false, start_ns: 0, buf: Vec::new(), error: None }))
            .collect();
        let (free_tx, free_rx) = mpsc::channel::<usize>();
        for i in 0..depth {
            free_tx.send(i).expect("receiver alive");
        }
        let closing = std::sync::atomic::AtomicBool::new(false);
        let structured = conn.structured;
        let max_block = self.max_block;
        let read_only = self.read_only;

        std::thread::scope(|s| {
            let reader = s.spawn(|| {
                let mut w = ctx.worker();
                let r = read_replies(ctx, &mut w, reader_stream, &slots, free_tx, structured, &closing);
                ctx.finish(w);
                if r.is_err() {
                    ctx.abort();
                }
                r
            });
            let sent = submit(ctx, &mut writer, &slots, &free_rx, depth, max_block, read_only, &closing);
            if sent.is_err() {
                ctx.abort();
            }
            // Unblocks the reader whatever happened.
            writer.shutdown();
            let read = reader
                .join()
                .unwrap_or_else(|_| Err(BenchError::Internal("NBD reader thread panicked".into())));
            // The reader's error says more (an error reply, a broken stream) than the
            // submitter's "connection closed".
            match (sent, read) {
                (_, Err(e)) | (Err(e), Ok(())) => Err(e),
                (Ok(()), Ok(())) => Ok(()),
            }
        })
    }
}

/// The submitter: keeps `depth` requests in flight until the source runs dry, then drains,
/// flushes if asked, and disconnects.
#[allow(clippy::too_many_arguments)]
fn submit(
    ctx: &CloneCtx<'_>,
    w: &mut Stream,
    slots: &[Mutex<Slot>],
    free: &mpsc::Receiver<usize>,
    depth: usize,
    max_block: u32,
    read_only: bool,
    closing: &std::sync::atomic::AtomicBool,
) -> Result<(), BenchError> {
    let gone = || BenchError::NbdProtocol("the connection closed while requests were in flight".into());
    let mut msg: Vec<u8> = Vec::new();
    let mut random = ctx.buffer(0, 0);
    loop {
        let slot = free.recv().map_err(|_| gone())?;
        let Some(op) = ctx.next_op() else { break };
        if op.len > u64::from(max_block) {
            return Err(BenchError::usage(format!(
                "bs={} exceeds the server's maximum request of {max_block} bytes",
                op.len
            )));
        }
        if op.dir == Dir::Write && read_only {
            return Err(BenchError::usage("the export is read-only".to_string()));
        }
        let len = op.len as usize;
        let (typ, flags) = match op.dir {
            Dir::Read => (cmd::READ, 0),
            Dir::Write => (cmd::WRITE, if ctx.sync() { cmd_flag::FUA } else { 0 }),
        };
        let hdr = Request { flags, typ, cookie: slot as u64, offset: op.offset, length: len as u32 }.encode();
        msg.clear();
        msg.extend_from_slice(&hdr);
        if op.dir == Dir::Write {
            if random.len() < len {
                random = ctx.buffer(len, 0);
            }
            msg.extend_from_slice(&random.as_slice()[..len]);
            ctx.prepare_write(&op, &mut msg[Request::SIZE..]);
        }
        {
            let mut sl = slots[slot].lock().expect("slot lock");
            sl.op = Some(op);
            sl.flush = false;
            sl.error = None;
            if op.dir == Dir::Read && sl.buf.len() < len {
                sl.buf.resize(len, 0);
            }
            sl.start_ns = ctx.now();
        }
        w.write_all(&msg).map_err(io_err("sending a request"))?;
    }
    // Every free slot is a token in `free`; one is in hand. Holding all `depth` of them
    // means every request has completed.
    for _ in 1..depth {
        free.recv().map_err(|_| gone())?;
    }
    if ctx.end_fsync() {
        {
            let mut sl = slots[0].lock().expect("slot lock");
            sl.op = None;
            sl.flush = true;
            sl.error = None;
        }
        w.write_all(&Request { flags: 0, typ: cmd::FLUSH, cookie: 0, offset: 0, length: 0 }.encode())
            .map_err(io_err("sending FLUSH"))?;
        free.recv().map_err(|_| gone())?;
        let err = slots[0].lock().expect("slot lock").error;
        if let Some(e) = err {
            return Err(BenchError::NbdReply { what: "FLUSH".into(), errno: e });
        }
    }
    closing.store(true, std::sync::atomic::Ordering::SeqCst);
    let _ = w.write_all(&Request { flags: 0, typ: cmd::DISC, cookie: 0, offset: 0, length: 0 }.encode());
    Ok(())
}

fn read_replies(
    ctx: &CloneCtx<'_>,
    w: &mut crate::engine::WorkerStats,
    stream: Stream,
    slots: &[Mutex<Slot>],
    free: mpsc::Sender<usize>,
    structured: bool,
    closing: &std::sync::atomic::AtomicBool,
) -> Result<(), BenchError> {
    let mut r = BufReader::with_capacity(256 << 10, stream);
    let mut magic = [0u8; 4];
    loop {
        if let Err(e) = r.read_exact(&mut magic) {
            if closing.load(std::sync::atomic::Ordering::SeqCst) || ctx.aborted() {
                return Ok(());
            }
            return Err(io_err("reading a reply")(e));
        }
        let m = u32::from_be_bytes(magic);
        let (cookie, done, error) = if m == wire::SIMPLE_REPLY_MAGIC {
            let mut rest = [0u8; 12];
            r.read_exact(&mut rest).map_err(io_err("reading a reply"))?;
            let error = u32::from_be_bytes(rest[0..4].try_into().expect("4 bytes"));
            let cookie = u64::from_be_bytes(rest[4..12].try_into().expect("8 bytes"));
            let mut sl = lock_slot(slots, cookie)?;
            if error == 0 {
                if let Some(op) = sl.op.filter(|o| o.dir == Dir::Read) {
                    let len = op.len as usize;
                    r.read_exact(&mut sl.buf[..len]).map_err(io_err("reading READ data"))?;
                }
            }
            (cookie, true, (error != 0).then_some(error))
        } else if m == wire::STRUCTURED_REPLY_MAGIC && structured {
            let mut h = [0u8; ChunkHeader::SIZE];
            h[..4].copy_from_slice(&magic);
            r.read_exact(&mut h[4..]).map_err(io_err("reading a reply chunk"))?;
            let c = ChunkHeader::decode(&h).ok_or_else(|| proto("bad chunk magic"))?;
            let mut sl = lock_slot(slots, c.cookie)?;
            let mut error = None;
            match c.typ {
                reply::TYPE_OFFSET_DATA => {
                    let off = read_u64(&mut r, "a data chunk offset")?;
                    let n = c.length.checked_sub(8).ok_or_else(|| proto("short data chunk"))? as usize;
                    let op = sl.op.ok_or_else(|| proto("data for a request that is not a READ"))?;
                    let at =
                        off.checked_sub(op.offset).map(|a| a as usize).filter(|a| a + n <= op.len as usize);
                    let at = at.ok_or_else(|| proto("data chunk outside its request"))?;
                    r.read_exact(&mut sl.buf[at..at + n]).map_err(io_err("reading READ data"))?;
                }
                reply::TYPE_OFFSET_HOLE => {
                    let off = read_u64(&mut r, "a hole chunk offset")?;
                    let mut l = [0u8; 4];
                    r.read_exact(&mut l).map_err(io_err("reading a hole chunk"))?;
                    let n = u32::from_be_bytes(l) as usize;
                    let op = sl.op.ok_or_else(|| proto("hole for a request that is not a READ"))?;
                    let at =
                        off.checked_sub(op.offset).map(|a| a as usize).filter(|a| a + n <= op.len as usize);
                    let at = at.ok_or_else(|| proto("hole chunk outside its request"))?;
                    sl.buf[at..at + n].fill(0);
                }
                reply::TYPE_NONE => {}
                t => {
                    let mut payload = vec![0u8; c.length as usize];
                    r.read_exact(&mut payload).map_err(io_err("reading a reply chunk"))?;
                    if t & 0x8000 != 0 {
                        let e = payload.get(0..4).map(|b| u32::from_be_bytes(b.try_into().expect("4 bytes")));
                        error = Some(e.unwrap_or(wire::errno::EIO).max(1));
                    }
                }
            }
            if error.is_some() {
                sl.error = error;
            }
            let err = sl.error;
            (c.cookie, c.flags & reply::FLAG_DONE != 0, err)
        } else {
            return Err(proto(format!("bad reply magic {m:#010x}")));
        };
        if !done {
            continue;
        }
        let end = ctx.now();
        let slot = cookie as usize;
        {
            let mut sl = slots[slot].lock().expect("slot lock");
            if sl.flush {
                sl.error = error;
            } else {
                let op = sl.op.take().ok_or_else(|| proto(format!("reply for idle cookie {cookie}")))?;
                if let Some(errno) = error {
                    let what = format!("{:?} of {} bytes at offset {}", op.dir, op.len, op.offset);
                    return Err(BenchError::NbdReply { what, errno });
                }
                let start = sl.start_ns;
                let len = op.len as usize;
                let data = if op.dir == Dir::Read { &sl.buf[..len] } else { &[][..] };
                ctx.complete(w, &op, start, end, data)?;
            }
        }
        if free.send(slot).is_err() {
            return Ok(());
        }
    }
}

fn lock_slot(slots: &[Mutex<Slot>], cookie: u64) -> Result<std::sync::MutexGuard<'_, Slot>, BenchError> {
    let s = slots.get(cookie as usize).ok_or_else(|| proto(format!("reply with unknown cookie {cookie}")))?;
    Ok(s.lock().expect("slot lock"))
}
