//! Test machinery: a server on a temporary socket, a raw NBD client written from the spec
//! (independently of the crate's codecs, so a codec bug cannot cancel itself out), and
//! devices with knobs (slow ranges, integrity failures, panics, a call log).
#![allow(dead_code)]

pub mod certs;

use std::collections::HashMap;
use std::io::{self, Read, Write};
use std::net::TcpStream;
use std::os::unix::net::UnixStream;
use std::path::PathBuf;
use std::process::{Command, Output, Stdio};
use std::sync::atomic::{AtomicU64, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

use blockdev::{BlockDevice, BlockError, BlockResult, Caps, Geometry, MemDevice, WriteFlags, ZeroFlags};
use nbd::{Export, ListenAddr, Server, ServerConfig, ServerStats, ShutdownHandle, TlsConfig};
use openssl::ssl::{SslConnector, SslStream};

// Protocol numbers, spelled out here rather than imported from the crate under test.
pub const NBD_OPT_EXPORT_NAME: u32 = 1;
pub const NBD_OPT_ABORT: u32 = 2;
pub const NBD_OPT_LIST: u32 = 3;
pub const NBD_OPT_STARTTLS: u32 = 5;
pub const NBD_OPT_INFO: u32 = 6;
pub const NBD_OPT_GO: u32 = 7;
pub const NBD_OPT_STRUCTURED_REPLY: u32 = 8;
pub const NBD_OPT_SET_META_CONTEXT: u32 = 10;
pub const NBD_REP_ACK: u32 = 1;
pub const NBD_REP_SERVER: u32 = 2;
pub const NBD_REP_INFO: u32 = 3;
pub const NBD_REP_ERR_UNSUP: u32 = 0x8000_0001;
pub const NBD_REP_ERR_TLS_REQD: u32 = 0x8000_0005;
pub const NBD_REP_ERR_INVALID: u32 = 0x8000_0003;
pub const NBD_REP_ERR_UNKNOWN: u32 = 0x8000_0006;
pub const NBD_REP_ERR_TOO_BIG: u32 = 0x8000_0009;
pub const NBD_INFO_EXPORT: u16 = 0;
pub const NBD_INFO_NAME: u16 = 1;
pub const NBD_INFO_DESCRIPTION: u16 = 2;
pub const NBD_INFO_BLOCK_SIZE: u16 = 3;

pub const NBD_FLAG_HAS_FLAGS: u16 = 1;
pub const NBD_FLAG_READ_ONLY: u16 = 2;
pub const NBD_FLAG_SEND_FLUSH: u16 = 4;
pub const NBD_FLAG_SEND_FUA: u16 = 8;
pub const NBD_FLAG_SEND_TRIM: u16 = 32;
pub const NBD_FLAG_SEND_WRITE_ZEROES: u16 = 64;
pub const NBD_FLAG_SEND_DF: u16 = 128;
pub const NBD_FLAG_CAN_MULTI_CONN: u16 = 256;

pub const NBD_CMD_READ: u16 = 0;
pub const NBD_CMD_WRITE: u16 = 1;
pub const NBD_CMD_DISC: u16 = 2;
pub const NBD_CMD_FLUSH: u16 = 3;
pub const NBD_CMD_TRIM: u16 = 4;
pub const NBD_CMD_CACHE: u16 = 5;
pub const NBD_CMD_WRITE_ZEROES: u16 = 6;
pub const NBD_CMD_BLOCK_STATUS: u16 = 7;
pub const NBD_CMD_FLAG_FUA: u16 = 1;
pub const NBD_CMD_FLAG_NO_HOLE: u16 = 2;
pub const NBD_CMD_FLAG_DF: u16 = 4;

pub const NBD_EPERM: u32 = 1;
pub const NBD_EIO: u32 = 5;
pub const NBD_EINVAL: u32 = 22;
pub const NBD_ENOSPC: u32 = 28;
pub const NBD_EOVERFLOW: u32 = 75;

static COUNTER: AtomicU64 = AtomicU64::new(0);

/// A fresh empty directory under the system temp dir.
pub fn temp_dir(tag: &str) -> PathBuf {
    let n = COUNTER.fetch_add(1, Ordering::SeqCst);
    let d = std::env::temp_dir().join(format!("sealdisk-nbd-{}-{tag}-{n}", std::process::id()));
    let _ = std::fs::remove_dir_all(&d);
    std::fs::create_dir_all(&d).unwrap();
    d
}

/// A server running `serve` on a background thread.
pub struct TestServer {
    pub addr: ListenAddr,
    pub handle: ShutdownHandle,
    pub stats: ServerStats,
    thread: Option<JoinHandle<io::Result<()>>>,
    pub dir: PathBuf,
}

impl TestServer {
    pub fn start(exports: Vec<Export>) -> Self {
        Self::start_with(exports, ServerConfig::default())
    }

    pub fn start_with(exports: Vec<Export>, config: ServerConfig) -> Self {
        let dir = temp_dir("srv");
        let addr = ListenAddr::Unix(dir.join("nbd.sock"));
        Self::start_at(exports, config, addr, dir)
    }

    pub fn start_tcp(exports: Vec<Export>, config: ServerConfig) -> Self {
        let dir = temp_dir("tcp");
        Self::start_at(exports, config, "tcp:127.0.0.1:0".parse().unwrap(), dir)
    }

    /// A server with TLS on a unix socket, or on 127.0.0.1 with `tcp`.
    pub fn start_tls(exports: Vec<Export>, tls: TlsConfig, tcp: bool) -> Self {
        let dir = temp_dir("tls");
        let addr =
            if tcp { "tcp:127.0.0.1:0".parse().unwrap() } else { ListenAddr::Unix(dir.join("nbd.sock")) };
        Self::start_server(Server::new_with_tls(exports, ServerConfig::default(), tls), addr, dir)
    }

    fn start_at(exports: Vec<Export>, config: ServerConfig, addr: ListenAddr, dir: PathBuf) -> Self {
        Self::start_server(Server::new(exports, config), addr, dir)
    }

    fn start_server(server: Server, addr: ListenAddr, dir: PathBuf) -> Self {
        let bound = server.bind(&addr).unwrap();
        let addr = bound.local_addr().clone();
        let handle = bound.shutdown_handle();
        let stats = bound.stats();
        let thread = std::thread::spawn(move || bound.serve());
        TestServer { addr, handle, stats, thread: Some(thread), dir }
    }

    pub fn socket_path(&self) -> PathBuf {
        match &self.addr {
            ListenAddr::Unix(p) => p.clone(),
            ListenAddr::Tcp(_) => panic!("not a unix socket"),
        }
    }

    pub fn uri(&self, export: &str) -> String {
        self.addr.uri(export)
    }

    pub fn connect(&self) -> RawClient {
        RawClient::connect(&self.addr)
    }

    /// Shuts down and returns `serve`'s result.
    pub fn stop(mut self) -> io::Result<()> {
        self.handle.shutdown();
        self.thread.take().unwrap().join().expect("serve panicked")
    }
}

impl Drop for TestServer {
    fn drop(&mut self) {
        if let Some(t) = self.thread.take() {
            self.handle.shutdown();
            let _ = t.join();
        }
        let _ = std::fs::remove_dir_all(&self.dir);
    }
}

/// A memory export named `name` of `size` bytes with `block`-byte sectors.
pub fn mem_export(name: &str, size: u64, block: u32) -> (Export, Arc<MemDevice>) {
    let dev = Arc::new(MemDevice::new(size, block));
    (Export::new(name, dev.clone()), dev)
}

pub enum Sock {
    Unix(UnixStream),
    Tcp(TcpStream),
    Tls(Box<SslStream<Sock>>),
}

impl std::fmt::Debug for Sock {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("Sock")
    }
}

impl Sock {
    pub fn try_clone(&self) -> Sock {
        match self {
            Sock::Unix(s) => Sock::Unix(s.try_clone().unwrap()),
            Sock::Tcp(s) => Sock::Tcp(s.try_clone().unwrap()),
            Sock::Tls(_) => panic!("a TLS session cannot be cloned"),
        }
    }
    fn set_read_timeout(&self, d: Option<Duration>) {
        match self {
            Sock::Unix(s) => s.set_read_timeout(d).unwrap(),
            Sock::Tcp(s) => s.set_read_timeout(d).unwrap(),
            Sock::Tls(s) => s.get_ref().set_read_timeout(d),
        }
    }
}

impl Read for Sock {
    fn read(&mut self, b: &mut [u8]) -> io::Result<usize> {
        match self {
            Sock::Unix(s) => s.read(b),
            Sock::Tcp(s) => s.read(b),
            Sock::Tls(s) => s.read(b),
        }
    }
}

impl Write for Sock {
    fn write(&mut self, b: &[u8]) -> io::Result<usize> {
        match self {
            Sock::Unix(s) => s.write(b),
            Sock::Tcp(s) => s.write(b),
            Sock::Tls(s) => s.write(b),
        }
    }
    fn flush(&mut self) -> io::Result<()> {
        Ok(())
    }
}

/// What `NBD_OPT_GO`/`INFO` told about an export.
#[derive(Debug, Default, Clone, PartialEq, Eq)]
pub struct ExportInfo {
    pub size: u64,
    pub flags: u16,
    pub block_sizes: Option<(u32, u32, u32)>,
    pub name: Option<String>,
    pub description: Option<String>,
}

/// One complete reply.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Reply {
    pub cookie: u64,
    pub error: u32,
    pub data: Vec<u8>,
    pub structured: bool,
    pub message: String,
}

/// A raw NBD client. It remembers which cookies are reads (and their offset and length) to
/// parse simple replies and check structured ones.
pub struct RawClient {
    pub s: Sock,
    pub structured: bool,
    pending: HashMap<u64, (u16, u64, u32)>,
    next_cookie: u64,
}

fn be16(b: &[u8]) -> u16 {
    u16::from_be_bytes(b[..2].try_into().unwrap())
}
fn be32(b: &[u8]) -> u32 {
    u32::from_be_bytes(b[..4].try_into().unwrap())
}
fn be64(b: &[u8]) -> u64 {
    u64::from_be_bytes(b[..8].try_into().unwrap())
}

impl RawClient {
    pub fn connect(addr: &ListenAddr) -> Self {
        let s = match addr {
            ListenAddr::Unix(p) => Sock::Unix(UnixStream::connect(p).unwrap()),
            ListenAddr::Tcp(a) => Sock::Tcp(TcpStream::connect(a.as_str()).unwrap()),
        };
        s.set_read_timeout(Some(Duration::from_secs(20)));
        RawClient { s, structured: false, pending: HashMap::new(), next_cookie: 1000 }
    }

    /// Sends `NBD_OPT_STARTTLS`, expects the ACK and runs the TLS handshake with
    /// `connector`; `Err` carries the handshake's error text.
    pub fn starttls(&mut self, connector: &SslConnector) -> Result<(), String> {
        self.send_option(NBD_OPT_STARTTLS, &[]);
        let (opt, typ, data) = self.read_option_reply();
        assert_eq!(
            (opt, typ, data.len()),
            (NBD_OPT_STARTTLS, NBD_REP_ACK, 0),
            "{}",
            String::from_utf8_lossy(&data)
        );
        let plain = std::mem::replace(&mut self.s, Sock::Unix(UnixStream::pair().unwrap().0));
        let mut cfg = connector.configure().unwrap();
        cfg.set_verify_hostname(false);
        // With TLS 1.3 the client finishes before the server has checked its certificate:
        // a refusal shows on the next read.
        let tls = cfg.connect("localhost", plain).map_err(|e| e.to_string())?;
        self.s = Sock::Tls(Box::new(tls));
        Ok(())
    }

    pub fn read_exact(&mut self, n: usize) -> Vec<u8> {
        let mut b = vec![0u8; n];
        self.s.read_exact(&mut b).unwrap();
        b
    }

    /// Reads the greeting, checks it, answers with `client_flags`; returns the server's flags.
    pub fn greet(&mut self, client_flags: u32) -> u16 {
        let g = self.read_exact(18);
        assert_eq!(&g[..8], b"NBDMAGIC");
        assert_eq!(&g[8..16], b"IHAVEOPT");
        self.s.write_all(&client_flags.to_be_bytes()).unwrap();
        be16(&g[16..])
    }

    pub fn send_option(&mut self, option: u32, data: &[u8]) {
        let mut b = Vec::new();
        b.extend_from_slice(b"IHAVEOPT");
        b.extend_from_slice(&option.to_be_bytes());
        b.extend_from_slice(&(data.len() as u32).to_be_bytes());
        b.extend_from_slice(data);
        self.s.write_all(&b).unwrap();
    }

    /// (option, reply type, data)
    pub fn read_option_reply(&mut self) -> (u32, u32, Vec<u8>) {
        let h = self.read_exact(20);
        assert_eq!(be64(&h), 0x0003_e889_0455_65a9, "option reply magic");
        let len = be32(&h[16..]) as usize;
        let data = self.read_exact(len);
        (be32(&h[8..]), be32(&h[12..]), data)
    }

    pub fn info_data(name: &str, requests: &[u16]) -> Vec<u8> {
        let mut d = Vec::new();
        d.extend_from_slice(&(name.len() as u32).to_be_bytes());
        d.extend_from_slice(name.as_bytes());
        d.extend_from_slice(&(requests.len() as u16).to_be_bytes());
        for r in requests {
            d.extend_from_slice(&r.to_be_bytes());
        }
        d
    }

    /// Sends INFO or GO and collects the replies up to the ACK, or the error reply type.
    pub fn info_or_go(&mut self, option: u32, name: &str, requests: &[u16]) -> Result<ExportInfo, u32> {
        self.send_option(option, &Self::info_data(name, requests));
        let mut info = ExportInfo::default();
        let mut saw_export = false;
        loop {
            let (opt, typ, data) = self.read_option_reply();
            assert_eq!(opt, option);
            match typ {
                NBD_REP_ACK => break,
                NBD_REP_INFO => match be16(&data) {
                    NBD_INFO_EXPORT => {
                        assert_eq!(data.len(), 12);
                        info.size = be64(&data[2..]);
                        info.flags = be16(&data[10..]);
                        saw_export = true;
                    }
                    NBD_INFO_NAME => info.name = Some(String::from_utf8(data[2..].to_vec()).unwrap()),
                    NBD_INFO_DESCRIPTION => {
                        info.description = Some(String::from_utf8(data[2..].to_vec()).unwrap())
                    }
                    NBD_INFO_BLOCK_SIZE => {
                        assert_eq!(data.len(), 14);
                        info.block_sizes = Some((be32(&data[2..]), be32(&data[6..]), be32(&data[10..])));
                    }
                    t => panic!("unexpected info type {t}"),
                },
                t if t & 0x8000_0000 != 0 => return Err(t),
                t => panic!("unexpected reply type {t:#x}"),
            }
        }
        assert!(saw_export, "NBD_INFO_EXPORT is mandatory");
        Ok(info)
    }

    pub fn negotiate_structured(&mut self) {
        self.send_option(NBD_OPT_STRUCTURED_REPLY, &[]);
        let (opt, typ, data) = self.read_option_reply();
        assert_eq!((opt, typ, data.len()), (NBD_OPT_STRUCTURED_REPLY, NBD_REP_ACK, 0));
        self.structured = true;
    }

    /// Full handshake to transmission with `NBD_OPT_GO`.
    pub fn go(&mut self, name: &str, structured: bool) -> ExportInfo {
        self.greet(3);
        if structured {
            self.negotiate_structured();
        }
        self.info_or_go(NBD_OPT_GO, name, &[NBD_INFO_NAME, NBD_INFO_DESCRIPTION, NBD_INFO_BLOCK_SIZE])
            .expect("GO succeeds")
    }

    pub fn cookie(&mut self) -> u64 {
        self.next_cookie += 1;
        self.next_cookie
    }

    pub fn request_bytes(flags: u16, typ: u16, cookie: u64, offset: u64, len: u32) -> Vec<u8> {
        let mut b = Vec::with_capacity(28);
        b.extend_from_slice(&0x2560_9513u32.to_be_bytes());
        b.extend_from_slice(&flags.to_be_bytes());
        b.extend_from_slice(&typ.to_be_bytes());
        b.extend_from_slice(&cookie.to_be_bytes());
        b.extend_from_slice(&offset.to_be_bytes());
        b.extend_from_slice(&len.to_be_bytes());
        b
    }

    /// Sends a request (and payload); remembers it for reply parsing.
    pub fn send(&mut self, flags: u16, typ: u16, cookie: u64, offset: u64, len: u32, payload: &[u8]) {
        let mut b = Self::request_bytes(flags, typ, cookie, offset, len);
        b.extend_from_slice(payload);
        self.s.write_all(&b).unwrap();
        self.pending.insert(cookie, (typ, offset, len));
    }

    /// Reads one complete reply (all chunks of one structured reply).
    pub fn read_reply(&mut self) -> Reply {
        read_reply(&mut self.s, &mut self.pending)
    }

    pub fn request(&mut self, flags: u16, typ: u16, offset: u64, len: u32, payload: &[u8]) -> Reply {
        let c = self.cookie();
        self.send(flags, typ, c, offset, len, payload);
        let r = self.read_reply();
        assert_eq!(r.cookie, c);
        r
    }

    pub fn read(&mut self, offset: u64, len: u32) -> Result<Vec<u8>, u32> {
        let r = self.request(0, NBD_CMD_READ, offset, len, &[]);
        if r.error == 0 {
            assert_eq!(r.data.len(), len as usize);
            Ok(r.data)
        } else {
            Err(r.error)
        }
    }

    pub fn write(&mut self, offset: u64, data: &[u8], flags: u16) -> Result<(), u32> {
        let r = self.request(flags, NBD_CMD_WRITE, offset, data.len() as u32, data);
        if r.error == 0 {
            Ok(())
        } else {
            Err(r.error)
        }
    }

    pub fn cmd(&mut self, typ: u16, flags: u16, offset: u64, len: u32) -> Result<(), u32> {
        let r = self.request(flags, typ, offset, len, &[]);
        assert!(r.data.is_empty());
        if r.error == 0 {
            Ok(())
        } else {
            Err(r.error)
        }
    }

    /// True when the server closed the connection (EOF or reset) within a few seconds.
    pub fn is_closed(&mut self) -> bool {
        self.s.set_read_timeout(Some(Duration::from_secs(5)));
        let mut b = [0u8; 1];
        match self.s.read(&mut b) {
            Ok(0) => true,
            Ok(_) => false,
            Err(e) => !matches!(e.kind(), io::ErrorKind::WouldBlock | io::ErrorKind::TimedOut),
        }
    }

    /// Sends every request from a second thread while this one reads the replies (so
    /// neither side can stall on a full socket buffer); returns the replies in arrival order.
    pub fn pipeline(&mut self, reqs: Vec<PipelinedRequest>) -> Vec<Reply> {
        let mut bytes = Vec::new();
        for r in &reqs {
            bytes.extend_from_slice(&Self::request_bytes(r.flags, r.typ, r.cookie, r.offset, r.len));
            bytes.extend_from_slice(&r.payload);
            self.pending.insert(r.cookie, (r.typ, r.offset, r.len));
        }
        let mut w = self.s.try_clone();
        let writer = std::thread::spawn(move || w.write_all(&bytes).unwrap());
        let replies = (0..reqs.len()).map(|_| self.read_reply()).collect();
        writer.join().unwrap();
        replies
    }
}

/// One request for `RawClient::pipeline`.
pub struct PipelinedRequest {
    pub flags: u16,
    pub typ: u16,
    pub cookie: u64,
    pub offset: u64,
    pub len: u32,
    pub payload: Vec<u8>,
}

fn read_n(s: &mut Sock, n: usize) -> Vec<u8> {
    let mut b = vec![0u8; n];
    s.read_exact(&mut b).unwrap();
    b
}

fn read_reply(s: &mut Sock, pending: &mut HashMap<u64, (u16, u64, u32)>) -> Reply {
    let magic = be32(&read_n(s, 4));
    match magic {
        0x6744_6698 => {
            let h = read_n(s, 12);
            let (error, cookie) = (be32(&h), be64(&h[4..]));
            let (typ, _, len) = pending.remove(&cookie).expect("reply to a pending cookie");
            let data = if typ == NBD_CMD_READ && error == 0 { read_n(s, len as usize) } else { Vec::new() };
            Reply { cookie, error, data, structured: false, message: String::new() }
        }
        0x668e_33ef => {
            let mut first = true;
            let mut magic_read = true;
            let mut reply =
                Reply { cookie: 0, error: 0, data: Vec::new(), structured: true, message: String::new() };
            loop {
                if !magic_read {
                    assert_eq!(be32(&read_n(s, 4)), 0x668e_33ef);
                }
                magic_read = false;
                let h = read_n(s, 16);
                let (flags, typ, cookie, len) = (be16(&h), be16(&h[2..]), be64(&h[4..]), be32(&h[12..]));
                if first {
                    reply.cookie = cookie;
                    first = false;
                } else {
                    assert_eq!(cookie, reply.cookie, "chunks of one reply interleaved in this test");
                }
                let (rtyp, roff, rlen) = *pending.get(&cookie).expect("reply to a pending cookie");
                let payload = read_n(s, len as usize);
                match typ {
                    0 => assert_eq!(len, 0),
                    1 => {
                        assert_eq!(rtyp, NBD_CMD_READ);
                        let off = be64(&payload);
                        assert_eq!(off, roff, "one chunk covering the whole read");
                        assert_eq!(payload.len() - 8, rlen as usize);
                        reply.data = payload[8..].to_vec();
                    }
                    5 => {
                        // BLOCK_STATUS: the payload (context id, descriptors) as the data.
                        assert_eq!(rtyp, NBD_CMD_BLOCK_STATUS);
                        assert!(len >= 12 && (len - 4) % 8 == 0, "block status chunk of {len} bytes");
                        reply.data = payload;
                    }
                    0x8001 | 0x8002 => {
                        reply.error = be32(&payload);
                        let mlen = usize::from(be16(&payload[4..]));
                        reply.message = String::from_utf8(payload[6..6 + mlen].to_vec()).unwrap();
                        assert_ne!(reply.error, 0);
                    }
                    t => panic!("unexpected chunk type {t:#x}"),
                }
                if flags & 1 != 0 {
                    break;
                }
            }
            pending.remove(&reply.cookie);
            reply
        }
        m => panic!("bad reply magic {m:#x}"),
    }
}

/// A deterministic pattern for block `i`.
pub fn pattern(seed: u64, len: usize) -> Vec<u8> {
    let mut x = seed.wrapping_mul(0x9e37_79b9_7f4a_7c15) | 1;
    (0..len)
        .map(|_| {
            x ^= x << 13;
            x ^= x >> 7;
            x ^= x << 17;
            x as u8
        })
        .collect()
}

/// A call the server made on a `TestDevice`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Call {
    Read(u64, usize),
    Write(u64, usize, WriteFlags),
    Flush,
    Discard(u64, u64),
    Zeroes(u64, u64, ZeroFlags),
}

/// A MemDevice with knobs.
#[derive(Debug)]
pub struct TestDevice {
    pub mem: MemDevice,
    pub caps: Caps,
    /// Reads starting at this offset sleep this long first.
    pub slow_read: Option<(u64, Duration)>,
    /// Writes starting at this offset sleep this long first.
    pub slow_write: Option<(u64, Duration)>,
    /// Reads overlapping `[off, off+len)` fail with an integrity mismatch.
    pub corrupt: Option<(u64, u64)>,
    /// Reads starting at this offset panic.
    pub panic_at: Option<u64>,
    pub log: Mutex<Vec<Call>>,
    pub flushes: AtomicUsize,
    /// The threads that executed reads.
    pub read_threads: Mutex<std::collections::HashSet<std::thread::ThreadId>>,
}

impl TestDevice {
    pub fn new(size: u64, block: u32) -> Self {
        TestDevice {
            mem: MemDevice::new(size, block),
            caps: Caps::FLUSH | Caps::FUA | Caps::DISCARD | Caps::WRITE_ZEROES,
            slow_read: None,
            slow_write: None,
            corrupt: None,
            panic_at: None,
            log: Mutex::new(Vec::new()),
            flushes: AtomicUsize::new(0),
            read_threads: Mutex::new(Default::default()),
        }
    }

    pub fn calls(&self) -> Vec<Call> {
        std::mem::take(&mut *self.log.lock().unwrap())
    }

    fn record(&self, c: Call) {
        self.log.lock().unwrap().push(c);
    }
}

impl BlockDevice for TestDevice {
    fn geometry(&self) -> Geometry {
        self.mem.geometry()
    }

    fn caps(&self) -> Caps {
        self.caps
    }

    fn read_at(&self, off: u64, buf: &mut [u8]) -> BlockResult<()> {
        self.record(Call::Read(off, buf.len()));
        self.read_threads.lock().unwrap().insert(std::thread::current().id());
        if let Some((o, d)) = self.slow_read {
            if o == off {
                std::thread::sleep(d);
            }
        }
        if self.panic_at == Some(off) {
            panic!("TestDevice: deliberate panic at {off}");
        }
        if let Some((c, clen)) = self.corrupt {
            if off < c + clen && c < off + buf.len() as u64 {
                return Err(BlockError::integrity(c.max(off) / 512));
            }
        }
        self.mem.read_at(off, buf)
    }

    fn write_at(&self, off: u64, buf: &[u8], flags: WriteFlags) -> BlockResult<()> {
        self.record(Call::Write(off, buf.len(), flags));
        if let Some((o, d)) = self.slow_write {
            if o == off {
                std::thread::sleep(d);
            }
        }
        self.mem.write_at(off, buf, flags)
    }

    fn flush(&self) -> BlockResult<()> {
        self.record(Call::Flush);
        self.flushes.fetch_add(1, Ordering::SeqCst);
        Ok(())
    }

    fn discard(&self, off: u64, len: u64) -> BlockResult<()> {
        self.record(Call::Discard(off, len));
        self.mem.discard(off, len)
    }

    fn write_zeroes(&self, off: u64, len: u64, flags: ZeroFlags) -> BlockResult<()> {
        self.record(Call::Zeroes(off, len, flags));
        self.mem.write_zeroes(off, len, flags)
    }
}

// ---- External client tools (nbdinfo, nbdcopy, qemu-io, ...). ----

/// The tool's path, or `None` after printing why the test is skipped.
pub fn require(tool: &str, test: &str) -> Option<PathBuf> {
    let found = std::env::var_os("PATH")
        .iter()
        .flat_map(std::env::split_paths)
        .map(|d| d.join(tool))
        .find(|p| p.is_file());
    if found.is_none() {
        eprintln!("SKIPPED {test}: `{tool}` is not installed");
        println!("SKIPPED {test}: `{tool}` is not installed");
    }
    found
}

/// Runs `cmd` to completion (killing it after `limit`), and returns its output.
pub fn run(cmd: &mut Command, limit: Duration) -> Output {
    let mut child = cmd
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap_or_else(|e| panic!("spawning {cmd:?}: {e}"));
    let mut stdout = child.stdout.take().unwrap();
    let mut stderr = child.stderr.take().unwrap();
    let out_t = std::thread::spawn(move || {
        let mut v = Vec::new();
        let _ = stdout.read_to_end(&mut v);
        v
    });
    let err_t = std::thread::spawn(move || {
        let mut v = Vec::new();
        let _ = stderr.read_to_end(&mut v);
        v
    });
    let deadline = Instant::now() + limit;
    let status = loop {
        if let Some(s) = child.try_wait().unwrap() {
            break s;
        }
        if Instant::now() > deadline {
            let _ = child.kill();
            let _ = child.wait();
            panic!("{cmd:?} did not finish within {limit:?}");
        }
        std::thread::sleep(Duration::from_millis(10));
    };
    Output { status, stdout: out_t.join().unwrap(), stderr: err_t.join().unwrap() }
}

/// Runs `cmd` (see [`run`]), asserts it succeeded, and returns its stdout.
pub fn check(cmd: &mut Command, limit: Duration) -> String {
    let out = run(cmd, limit);
    let stdout = String::from_utf8_lossy(&out.stdout).into_owned();
    assert!(
        out.status.success(),
        "{cmd:?} failed: {}\nstdout:\n{stdout}\nstderr:\n{}",
        out.status,
        String::from_utf8_lossy(&out.stderr)
    );
    stdout
}
