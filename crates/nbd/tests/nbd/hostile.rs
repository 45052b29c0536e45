//! Attacks by hostile clients and local users (issue 10, "Hostile clients" and "Who may
//! connect"). Each test is the attack, and fails on a server without the matching limit:
//!
//! * a client that pipelines maximum-size READs and never reads the replies used to pin
//!   `threads × max_request` (512 MiB) per connection;
//! * connections that never finish the handshake used to hold a thread forever;
//! * a 4 GiB WRITE_ZEROES/TRIM used to reach the device as one call, and held up shutdown;
//! * device errors (which can name the backing file) used to be sent to the client verbatim;
//! * the socket file's mode used to be left to the umask (0755 under umask 022), and two
//!   servers starting at once on a stale socket could remove each other's.
//!
//! Tests in this file run one at a time (`serial()`): one measures the process's RSS.

use crate::common;

use std::io::{self, Read, Write};
use std::os::unix::fs::{FileTypeExt, PermissionsExt};
use std::os::unix::net::{UnixListener, UnixStream};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Barrier, Mutex, MutexGuard};
use std::time::{Duration, Instant};

use blockdev::{BlockDevice, BlockError, BlockResult, Caps, Geometry, MemDevice, WriteFlags, ZeroFlags};
use common::*;
use nbd::{Export, ListenAddr, Server, ServerConfig};

const MIB: u64 = 1 << 20;
const GIB: u64 = 1 << 30;

fn serial() -> MutexGuard<'static, ()> {
    static LOCK: Mutex<()> = Mutex::new(());
    LOCK.lock().unwrap_or_else(|e| e.into_inner())
}

/// This process's resident set, in bytes.
fn rss() -> u64 {
    let status = std::fs::read_to_string("/proc/self/status").unwrap();
    let line = status.lines().find(|l| l.starts_with("VmRSS:")).unwrap();
    let kb: u64 = line.split_whitespace().nth(1).unwrap().parse().unwrap();
    kb * 1024
}

/// Polls `f` every 10 ms until it holds or `limit` passes; returns whether it held.
fn eventually(limit: Duration, mut f: impl FnMut() -> bool) -> bool {
    let end = Instant::now() + limit;
    loop {
        if f() {
            return true;
        }
        if Instant::now() >= end {
            return false;
        }
        std::thread::sleep(Duration::from_millis(10));
    }
}

// ---------------------------------------------------------------------------------------
// The client that never reads its replies

#[test]
fn non_reading_client_stays_within_its_budget_and_others_are_served() {
    let _s = serial();
    let cfg = ServerConfig {
        max_request: 32 << 20,
        memory_budget: 256 << 20,
        connection_budget: 64 << 20,
        threads_per_connection: 16,
        ..ServerConfig::default()
    };
    let dev = Arc::new(MemDevice::new(64 * MIB, 512));
    let srv = TestServer::start_with(vec![Export::new("disk", dev)], cfg);
    // Warm up: the server's threads and a fresh client's buffers exist before measuring.
    let mut warm = srv.connect();
    warm.go("disk", false);
    warm.read(0, 4096).unwrap();
    let before = rss();

    // 16 reads of 32 MiB (512 MiB of replies), and not one byte read back.
    let mut hostile = srv.connect();
    hostile.go("disk", false);
    for i in 0..16u64 {
        let c = hostile.cookie();
        hostile.send(0, NBD_CMD_READ, c, (i % 2) * 32 * MIB, 32 << 20, &[]);
    }
    // The connection fills its 64 MiB share, then stalls.
    assert!(eventually(Duration::from_secs(5), || srv.stats.bytes_in_flight() >= 64 << 20));
    std::thread::sleep(Duration::from_millis(300));
    assert!(
        srv.stats.peak_bytes_in_flight() <= 64 << 20,
        "one connection held {} bytes",
        srv.stats.peak_bytes_in_flight()
    );
    let grown = rss().saturating_sub(before);
    assert!(grown < 160 << 20, "RSS grew by {} MiB while a client did not read", grown >> 20);

    // Another client is served at once while the hostile one is still connected.
    let t = Instant::now();
    let mut fresh = srv.connect();
    fresh.go("disk", false);
    assert_eq!(fresh.read(MIB, 4096).unwrap(), vec![0u8; 4096]);
    fresh.write(MIB, &[7u8; 65536], 0).unwrap();
    assert!(t.elapsed() < Duration::from_secs(2), "a fresh client waited {:?}", t.elapsed());
    assert_eq!(srv.stats.connections(), 3);
    drop(hostile);
    // Its buffers come back to the budget once its connection is gone.
    assert!(eventually(Duration::from_secs(5), || srv.stats.bytes_in_flight() == 0));
    srv.stop().unwrap();
}

#[test]
fn the_server_budget_holds_across_connections() {
    let _s = serial();
    // Three non-reading clients with 8 MiB shares and a 16 MiB server budget: together they
    // never hold more than the budget.
    let cfg = ServerConfig {
        max_request: 4 << 20,
        memory_budget: 16 << 20,
        connection_budget: 8 << 20,
        ..ServerConfig::default()
    };
    let dev = Arc::new(MemDevice::new(16 * MIB, 512));
    let srv = TestServer::start_with(vec![Export::new("disk", dev)], cfg);
    let mut clients = Vec::new();
    for _ in 0..3 {
        let mut c = srv.connect();
        c.go("disk", false);
        for _ in 0..8 {
            let k = c.cookie();
            c.send(0, NBD_CMD_READ, k, 0, 4 << 20, &[]);
        }
        clients.push(c);
    }
    assert!(eventually(Duration::from_secs(5), || srv.stats.bytes_in_flight() >= 16 << 20));
    std::thread::sleep(Duration::from_millis(200));
    assert!(srv.stats.peak_bytes_in_flight() <= 16 << 20);
    // Once the clients read their replies, everything drains. (Read all at once: a client
    // that read alone could wait for budget the others hold.)
    let readers: Vec<_> = clients
        .into_iter()
        .map(|mut c| {
            std::thread::spawn(move || {
                for _ in 0..8 {
                    let r = c.read_reply();
                    assert_eq!((r.error, r.data.len()), (0, 4 << 20));
                }
            })
        })
        .collect();
    for r in readers {
        r.join().unwrap();
    }
    srv.stop().unwrap();
}

#[test]
fn idle_timeout_closes_a_silent_client_and_one_that_does_not_read() {
    let _s = serial();
    // The timeout is long against the busy client's 100 ms pauses, so a loaded machine that
    // deschedules this test for a few hundred milliseconds does not make the busy client idle;
    // the busy client keeps going past the timeout, so the other two close meanwhile.
    let cfg = ServerConfig { idle_timeout: Some(Duration::from_millis(1000)), ..ServerConfig::default() };
    let (e, _) = mem_export("disk", 64 * MIB, 512);
    let srv = TestServer::start_with(vec![e], cfg);
    // Silent after the handshake.
    let mut quiet = srv.connect();
    quiet.go("disk", false);
    // Reads 32 MiB of replies it never takes: the send makes no progress.
    let mut stuck = srv.connect();
    stuck.go("disk", false);
    // If the test is descheduled past the timeout, the server may already have closed it:
    // a failed send is that, not a failure.
    for _ in 0..4 {
        let b = RawClient::request_bytes(0, NBD_CMD_READ, stuck.cookie(), 0, 8 << 20);
        if stuck.s.write_all(&b).is_err() {
            break;
        }
    }
    // A busy client is not idle: a slow sequence of requests keeps it open.
    let mut busy = srv.connect();
    busy.go("disk", false);
    for _ in 0..15 {
        busy.read(0, 4096).unwrap();
        std::thread::sleep(Duration::from_millis(100));
    }
    assert!(eventually(Duration::from_secs(5), || srv.stats.connections() == 1));
    assert!(quiet.is_closed());
    busy.read(0, 4096).unwrap();
    assert!(eventually(Duration::from_secs(5), || srv.stats.bytes_in_flight() == 0));
    srv.stop().unwrap();
}

// ---------------------------------------------------------------------------------------
// Connections that never finish the handshake

/// Raises the soft open-file limit to what `n` idle connections need (a few descriptors on
/// each side).
fn ensure_fds(n: u64) {
    use rustix::process::{getrlimit, setrlimit, Resource};
    let mut l = getrlimit(Resource::Nofile);
    if l.current.is_some_and(|c| c < n) {
        l.current = l.maximum.map(|m| m.min(n)).or(Some(n));
        let _ = setrlimit(Resource::Nofile, l);
    }
}

#[test]
fn four_hundred_idle_connections_are_closed_by_the_handshake_timeout() {
    let _s = serial();
    ensure_fds(4096);
    let cfg = ServerConfig { handshake_timeout: Some(Duration::from_secs(1)), ..ServerConfig::default() };
    let (e, _) = mem_export("disk", MIB, 512);
    let srv = TestServer::start_with(vec![e], cfg);
    let path = srv.socket_path();
    let idle: Vec<UnixStream> = (0..400).map(|_| UnixStream::connect(&path).unwrap()).collect();
    assert!(eventually(Duration::from_secs(5), || srv.stats.connections() == 400));

    // A fresh client is served meanwhile.
    let mut fresh = srv.connect();
    fresh.go("disk", false);
    assert_eq!(fresh.read(0, 512).unwrap(), vec![0u8; 512]);

    // Every idle one gets the greeting, then is closed by the server.
    for mut s in idle {
        s.set_read_timeout(Some(Duration::from_secs(10))).unwrap();
        let mut got = Vec::new();
        match s.read_to_end(&mut got) {
            Ok(_) => assert_eq!(got.len(), 18, "greeting, then end of stream"),
            Err(e) => assert_eq!(e.kind(), io::ErrorKind::ConnectionReset, "{e}"),
        }
    }
    assert!(eventually(Duration::from_secs(5), || srv.stats.connections() == 1));
    // The client that finished its handshake in time is not affected.
    assert_eq!(fresh.read(0, 512).unwrap(), vec![0u8; 512]);
    srv.stop().unwrap();
}

#[test]
fn a_client_trickling_its_handshake_is_cut_at_the_deadline() {
    let _s = serial();
    let cfg = ServerConfig { handshake_timeout: Some(Duration::from_millis(500)), ..ServerConfig::default() };
    let (e, _) = mem_export("disk", MIB, 512);
    let srv = TestServer::start_with(vec![e], cfg);
    let mut c = srv.connect();
    c.greet(3);
    // Options that each arrive in time, but never one that selects an export.
    let t = Instant::now();
    let mut closed = false;
    let mut opt = b"IHAVEOPT".to_vec();
    opt.extend_from_slice(&NBD_OPT_STRUCTURED_REPLY.to_be_bytes());
    opt.extend_from_slice(&0u32.to_be_bytes());
    while t.elapsed() < Duration::from_secs(5) {
        let mut h = [0u8; 20];
        if c.s.write_all(&opt).is_err() || c.s.read_exact(&mut h).is_err() {
            closed = true;
            break;
        }
        std::thread::sleep(Duration::from_millis(100));
    }
    assert!(closed, "the handshake went on for {:?}", t.elapsed());
    srv.stop().unwrap();
}

#[test]
fn connections_beyond_the_limit_are_closed_until_idle_ones_time_out() {
    let _s = serial();
    let cfg = ServerConfig {
        max_connections: 4,
        handshake_timeout: Some(Duration::from_millis(500)),
        ..ServerConfig::default()
    };
    let (e, _) = mem_export("disk", MIB, 512);
    let srv = TestServer::start_with(vec![e], cfg);
    let path = srv.socket_path();
    let idle: Vec<UnixStream> = (0..4).map(|_| UnixStream::connect(&path).unwrap()).collect();
    assert!(eventually(Duration::from_secs(5), || srv.stats.connections() == 4));
    // The fifth is closed without a greeting.
    let mut extra = UnixStream::connect(&path).unwrap();
    extra.set_read_timeout(Some(Duration::from_secs(5))).unwrap();
    let mut got = Vec::new();
    let _ = extra.read_to_end(&mut got);
    assert!(got.is_empty(), "a connection over the limit was greeted");
    // Once the idle ones are timed out, clients get in again.
    assert!(eventually(Duration::from_secs(5), || srv.stats.connections() == 0));
    let mut c = srv.connect();
    c.go("disk", false);
    c.read(0, 512).unwrap();
    drop(idle);
    srv.stop().unwrap();
}

// ---------------------------------------------------------------------------------------
// TRIM and WRITE_ZEROES of 4 GiB

/// A large sparse device that keeps nothing: it checks that writes are zeroes, counts the
/// bytes zeroed and discarded, and records the largest single zero/discard call. Its own
/// `write_zeroes` writes zero buffers (no native zeroing), as the trait's default does.
#[derive(Debug, Default)]
struct Sparse {
    zeroed: AtomicU64,
    discarded: AtomicU64,
    largest_call: AtomicU64,
    /// Next byte a zero/discard call must start at (they must arrive in order, no gaps).
    next: AtomicU64,
    /// Sleep this many microseconds per MiB zeroed (to make shutdown matter).
    us_per_mib: u64,
}

impl Sparse {
    fn call(&self, off: u64, len: u64) {
        self.largest_call.fetch_max(len, Ordering::SeqCst);
        assert_eq!(self.next.swap(off + len, Ordering::SeqCst), off, "pieces in order, without gaps");
    }
}

impl BlockDevice for Sparse {
    fn geometry(&self) -> Geometry {
        Geometry::new(8 * GIB, 512)
    }
    fn caps(&self) -> Caps {
        Caps::DISCARD | Caps::FLUSH
    }
    fn read_at(&self, _off: u64, buf: &mut [u8]) -> BlockResult<()> {
        buf.fill(0);
        Ok(())
    }
    fn write_at(&self, _off: u64, buf: &[u8], _flags: WriteFlags) -> BlockResult<()> {
        assert!(buf.iter().all(|&b| b == 0), "only zeroes are written here");
        self.zeroed.fetch_add(buf.len() as u64, Ordering::SeqCst);
        Ok(())
    }
    fn flush(&self) -> BlockResult<()> {
        Ok(())
    }
    fn discard(&self, off: u64, len: u64) -> BlockResult<()> {
        self.call(off, len);
        self.discarded.fetch_add(len, Ordering::SeqCst);
        Ok(())
    }
    fn write_zeroes(&self, off: u64, len: u64, _flags: ZeroFlags) -> BlockResult<()> {
        self.call(off, len);
        static ZEROES: [u8; 1 << 20] = [0; 1 << 20];
        let mut pos = off;
        while pos < off + len {
            let n = (off + len - pos).min(MIB);
            self.write_at(pos, &ZEROES[..n as usize], WriteFlags::empty())?;
            if self.us_per_mib > 0 {
                std::thread::sleep(Duration::from_micros(self.us_per_mib * n / MIB));
            }
            pos += n;
        }
        Ok(())
    }
}

#[test]
fn four_gib_write_zeroes_and_trim_reach_the_device_in_bounded_pieces() {
    let _s = serial();
    let dev = Arc::new(Sparse::default());
    let srv = TestServer::start_with(vec![Export::new("big", dev.clone())], ServerConfig::default());
    let mut c = srv.connect();
    c.go("big", true);
    let len: u32 = u32::MAX - 4095; // the largest aligned NBD length, just under 4 GiB
    let before = rss();
    dev.next.store(GIB, Ordering::SeqCst);
    c.cmd(NBD_CMD_WRITE_ZEROES, NBD_CMD_FLAG_FUA, GIB, len).unwrap();
    assert_eq!(dev.zeroed.load(Ordering::SeqCst), u64::from(len), "every byte zeroed once");
    assert_eq!(dev.next.load(Ordering::SeqCst), GIB + u64::from(len));
    dev.next.store(2 * GIB, Ordering::SeqCst);
    c.cmd(NBD_CMD_TRIM, 0, 2 * GIB, len).unwrap();
    assert_eq!(dev.discarded.load(Ordering::SeqCst), u64::from(len));
    let largest = dev.largest_call.load(Ordering::SeqCst);
    assert!(largest <= 64 * MIB, "one device call of {largest} bytes");
    // The server itself allocated nothing in proportion to the request.
    assert!(rss().saturating_sub(before) < 64 * MIB);
    srv.stop().unwrap();
}

#[test]
fn shutdown_cuts_a_huge_write_zeroes_short() {
    let _s = serial();
    // 1 ms per MiB: the whole request would take over 4 s.
    let dev = Arc::new(Sparse { us_per_mib: 1000, ..Sparse::default() });
    let srv = TestServer::start_with(vec![Export::new("big", dev.clone())], ServerConfig::default());
    let mut c = srv.connect();
    c.go("big", true);
    let k = c.cookie();
    c.send(0, NBD_CMD_WRITE_ZEROES, k, 0, u32::MAX - 511, &[]);
    assert!(eventually(Duration::from_secs(5), || dev.zeroed.load(Ordering::SeqCst) > 0));
    let t = Instant::now();
    srv.handle.shutdown();
    let r = c.read_reply();
    assert_eq!(r.error, 108, "ESHUTDOWN");
    srv.stop().unwrap();
    assert!(t.elapsed() < Duration::from_secs(2), "shutdown waited {:?}", t.elapsed());
    assert!(dev.zeroed.load(Ordering::SeqCst) < u64::from(u32::MAX) / 2);
}

// ---------------------------------------------------------------------------------------
// What error replies say

/// Fails every read with an error naming a host path, as FileDevice's errors do.
#[derive(Debug)]
struct Leaky;

impl BlockDevice for Leaky {
    fn geometry(&self) -> Geometry {
        Geometry::new(MIB, 512)
    }
    fn read_at(&self, off: u64, _buf: &mut [u8]) -> BlockResult<()> {
        Err(BlockError::io(
            format!("reading /home/alice/secret-disk.img at {off}"),
            io::Error::from_raw_os_error(libc::EIO),
        ))
    }
    fn write_at(&self, off: u64, _buf: &[u8], _flags: WriteFlags) -> BlockResult<()> {
        Err(BlockError::integrity(off / 512))
    }
    fn flush(&self) -> BlockResult<()> {
        Ok(())
    }
}

#[test]
fn error_replies_do_not_name_host_paths() {
    let _s = serial();
    let srv = TestServer::start(vec![Export::new("leaky", Arc::new(Leaky))]);
    let mut c = srv.connect();
    c.go("leaky", true);
    let r = c.request(0, NBD_CMD_READ, 0, 4096, &[]);
    assert_eq!(r.error, NBD_EIO);
    assert!(!r.message.contains("/home") && !r.message.contains("secret"), "error reply {:?}", r.message);
    assert_eq!(r.message, "I/O error");
    let r = c.request(0, NBD_CMD_WRITE, 512, 512, &[1u8; 512]);
    assert_eq!((r.error, r.message.as_str()), (NBD_EIO, "integrity check failed"));
    srv.stop().unwrap();
}

// ---------------------------------------------------------------------------------------
// The Unix socket file

fn mode_of(p: &std::path::Path) -> u32 {
    std::fs::symlink_metadata(p).unwrap().permissions().mode() & 0o7777
}

fn bind_at(path: &std::path::Path, cfg: ServerConfig) -> io::Result<nbd::BoundServer> {
    let (e, _) = mem_export("disk", MIB, 512);
    Server::new(vec![e], cfg).bind(&ListenAddr::Unix(path.to_path_buf()))
}

#[test]
fn unix_socket_is_created_0600_or_with_the_mode_asked_for() {
    let _s = serial();
    let dir = temp_dir("mode");
    let path = dir.join("s.sock");
    // The test process's umask (usually 022) would give 0755.
    let b = bind_at(&path, ServerConfig::default()).unwrap();
    assert_eq!(mode_of(&path), 0o600);
    assert!(std::fs::symlink_metadata(&path).unwrap().file_type().is_socket());
    drop(b);
    assert!(!path.exists(), "socket removed with the server");
    assert!(!dir.join("s.sock.lock").exists(), "lock file removed with the server");

    // Wider on request, exactly as asked even where the umask would take group bits.
    let b = bind_at(&path, ServerConfig { socket_mode: 0o660, ..ServerConfig::default() }).unwrap();
    assert_eq!(mode_of(&path), 0o660);
    drop(b);
    // A mode without owner read/write is refused.
    let e = bind_at(&path, ServerConfig { socket_mode: 0o060, ..ServerConfig::default() }).unwrap_err();
    assert_eq!(e.kind(), io::ErrorKind::InvalidInput);
    let _ = std::fs::remove_dir_all(&dir);
}

#[test]
fn a_stale_socket_is_replaced_and_a_live_one_refused() {
    let _s = serial();
    let dir = temp_dir("stale");
    let path = dir.join("s.sock");
    // Stale: bound once, nobody accepting any more. A stale lock file too (a killed server).
    drop(UnixListener::bind(&path).unwrap());
    std::fs::write(dir.join("s.sock.lock"), b"").unwrap();
    let b = bind_at(&path, ServerConfig::default()).unwrap();
    assert_eq!(mode_of(&path), 0o600);
    // Our own live socket: a second server is refused and the first one keeps working.
    let e = bind_at(&path, ServerConfig::default()).unwrap_err();
    assert_eq!(e.kind(), io::ErrorKind::AddrInUse);
    let stop = b.shutdown_handle();
    let t = std::thread::spawn(move || b.serve());
    let mut c = RawClient::connect(&ListenAddr::Unix(path.clone()));
    c.go("disk", false);
    c.read(0, 512).unwrap();
    drop(c);
    stop.shutdown();
    t.join().unwrap().unwrap();

    // Someone else's live socket (no lock file) is refused, and left in place.
    let other = UnixListener::bind(&path).unwrap();
    let e = bind_at(&path, ServerConfig::default()).unwrap_err();
    assert_eq!(e.kind(), io::ErrorKind::AddrInUse);
    assert!(UnixStream::connect(&path).is_ok());
    drop(other);
    std::fs::remove_file(&path).unwrap();

    // A file that is not a socket is never removed.
    std::fs::write(&path, b"data").unwrap();
    let e = bind_at(&path, ServerConfig::default()).unwrap_err();
    assert_eq!(e.kind(), io::ErrorKind::AlreadyExists);
    assert_eq!(std::fs::read(&path).unwrap(), b"data");
    let _ = std::fs::remove_dir_all(&dir);
}

#[test]
fn servers_starting_together_on_a_stale_socket_never_both_bind() {
    let _s = serial();
    let dir = temp_dir("race");
    let path = dir.join("s.sock");
    for round in 0..50 {
        drop(UnixListener::bind(&path).unwrap());
        // Four at once: without the lock, one regularly removed another's fresh socket.
        let barrier = Arc::new(Barrier::new(4));
        let results: Vec<io::Result<nbd::BoundServer>> = std::thread::scope(|s| {
            let hs: Vec<_> = (0..4)
                .map(|_| {
                    let (barrier, path) = (barrier.clone(), path.clone());
                    s.spawn(move || {
                        barrier.wait();
                        bind_at(&path, ServerConfig::default())
                    })
                })
                .collect();
            hs.into_iter().map(|h| h.join().unwrap()).collect()
        });
        let ok = results.iter().filter(|r| r.is_ok()).count();
        assert_eq!(ok, 1, "round {round}: {ok} servers bound the same path");
        for r in &results {
            if let Err(e) = r {
                assert_eq!(e.kind(), io::ErrorKind::AddrInUse, "{e}");
            }
        }
        // The winner's socket is the one at the path, and it is live.
        assert!(UnixStream::connect(&path).is_ok(), "round {round}: the winner's socket was removed");
        drop(results);
        assert!(!path.exists());
    }
    let _ = std::fs::remove_dir_all(&dir);
}
