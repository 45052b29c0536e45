//! The public face: exports, configuration, binding, the accept loop and shutdown.

use std::collections::HashMap;
use std::io::{self, BufReader};
use std::net::{Shutdown, TcpListener, TcpStream, ToSocketAddrs};
use std::os::fd::OwnedFd;
use std::os::unix::fs::{FileTypeExt, OpenOptionsExt};
use std::os::unix::net::{UnixListener, UnixStream};
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Condvar, Mutex, MutexGuard, PoisonError};
use std::thread::{self, JoinHandle};
use std::time::{Duration, Instant};

use blockdev::{BlockDevice, Caps};
use log::{debug, error, info, warn};
use rustix::fs::{FlockOperation, Mode};
use rustix::net::{bind, listen, socket_with, AddressFamily, SocketAddrUnix, SocketFlags, SocketType};

use crate::addr::{connectable_tcp, ListenAddr};
use crate::budget::Budget;
use crate::poll::BusyPoll;
use crate::stream::Stream;
use crate::tls::TlsConfig;
use crate::wire::tflag;
use crate::{handshake, transmission};

/// One device offered to clients under a name.
#[derive(Debug, Clone)]
pub struct Export {
    /// The name clients ask for (`NBD_OPT_GO`, URIs). The first export is also the default,
    /// selected by the empty name.
    pub name: String,
    /// Free text shown by `nbdinfo` and `NBD_OPT_LIST`.
    pub description: String,
    /// The device served.
    pub device: Arc<dyn BlockDevice>,
    /// Refuse writes, trims and zeroing with `EPERM` (also implied by `Caps::READ_ONLY`).
    pub read_only: bool,
    /// The storage is rotational media: advertised as `NBD_FLAG_ROTATIONAL`, so that the
    /// kernel client marks its queue rotational and its I/O scheduler sorts requests (see
    /// `blockdev::is_rotational`).
    pub rotational: bool,
}

impl Export {
    /// A writable export without description.
    pub fn new(name: impl Into<String>, device: Arc<dyn BlockDevice>) -> Self {
        Export { name: name.into(), description: String::new(), device, read_only: false, rotational: false }
    }
}

/// Server tuning and the limits that protect it from hostile clients.
/// `ServerConfig::default()` is what the measurements chose.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ServerConfig {
    /// Most worker threads per connection, i.e. the most requests of one connection executed
    /// at once. Workers are started on demand, so an idle or queue-depth-1 connection uses
    /// one or two threads. At least 1.
    pub threads_per_connection: usize,
    /// Largest READ or WRITE payload accepted, in bytes; advertised as the maximum block size.
    /// Clamped to 4 KiB..=1 GiB, to at least the export's preferred block size, and to at
    /// most `connection_budget`.
    pub max_request: u32,
    /// Server-wide budget, in bytes, for READ/WRITE payload buffers: requests being read,
    /// executed, or whose replies the client has not taken yet, plus idle buffers kept for
    /// reuse. A connection that cannot get budget for its next request stops reading
    /// requests until some is released. At least 1 MiB.
    pub memory_budget: usize,
    /// The most payload bytes one connection may hold at once (clamped to 1 MiB..=
    /// `memory_budget`). Well below `memory_budget`, so that a client that never reads its
    /// replies stalls only itself. 64 MiB keeps 32 requests of 1 MiB (fio/nbdcopy at QD32)
    /// and two maximum-size requests in flight.
    pub connection_budget: usize,
    /// Further connections are closed right after `accept`.
    pub max_connections: usize,
    /// A connection that has not finished the handshake (selected an export) this long after
    /// `accept` is closed. `None`: no limit.
    pub handshake_timeout: Option<Duration>,
    /// A connection in transmission with no request in flight that sends nothing this long
    /// is closed; so is one whose reply makes no progress (the client does not read) this
    /// long. `None` (the default): connections may stay idle forever.
    pub idle_timeout: Option<Duration>,
    /// Permission bits of a Unix socket file (default 0600: only the server's user may
    /// connect). Must include owner read and write. The file never has more bits than this
    /// at any moment, whatever the umask.
    pub socket_mode: u32,
    /// After `shutdown`, how long in-flight requests may take before the remaining
    /// connections are cut (a client that stops reading could otherwise block shutdown).
    pub shutdown_grace: Duration,
    /// Send buffer asked for on Unix-socket connections (`SO_SNDBUF`; the kernel doubles it and
    /// caps it at `net.core.wmem_max`); 0 keeps the kernel's default (about 208 KiB). A unix
    /// stream socket's sender blocks once that much is queued, so with the default a 1 MiB
    /// read reply leaves in several pieces, each waiting for the client to drain the last:
    /// 1 MiB here measured +12–15% on 1M sequential reads over fio's libnbd engine
    /// (BENCHMARKS.md). TCP connections keep the kernel's autotuning.
    pub unix_send_buffer: usize,
    /// The queue-depth-1 fast path (on by default): when nothing else of a connection is
    /// in flight and no further request is buffered, the worker that read a small READ or
    /// WRITE runs it while keeping the reader, instead of waking another worker to read the
    /// next one: 25–30% less server CPU per 4 KiB QD1 request (BENCHMARKS.md, issue 16).
    /// Best with `busy_poll`: without it the worker sleeps in `recv` between requests and
    /// an idle CPU wakes slowly (on the 2-vCPU VM QD1 reads then took twice as long as with
    /// the hand-off, which kept the other vCPU awake).
    pub inline_qd1: bool,
    /// Batches (on by default): while the whole next request has already arrived with the
    /// one just read (one `recv` brings many pipelined requests), the worker that read a
    /// small READ or WRITE runs it itself and holds the connection's replies back until
    /// the batch ends, so a batch costs one thread and about one `writev` of replies
    /// instead of a hand-off to another worker per request. A request slower than 200 µs
    /// turns batching off for a while, so a slow device keeps its parallel workers.
    pub inline_batch: bool,
    /// Busy polling (default 50 µs): a worker about to wait for a connection's next
    /// request first peeks at the socket without sleeping for up to this long, so a
    /// queue-depth-1 client's next request is seen without a wake-up of an idle CPU
    /// (`crate::poll`). Only a queue-depth-1 connection whose last wait was short polls,
    /// never one over TLS, and at most half the CPUs poll at once (none on one CPU). `None`
    /// or zero: workers sleep in `recv` at once.
    pub busy_poll: Option<Duration>,
}

/// The default server-wide memory budget: 1 GiB, but at most a quarter of physical memory
/// (and at least 128 MiB).
pub fn default_memory_budget() -> usize {
    let info = rustix::system::sysinfo();
    let ram = u64::from(info.mem_unit.max(1)).saturating_mul(info.totalram as u64);
    let quarter = usize::try_from(ram / 4).unwrap_or(usize::MAX);
    quarter.clamp(128 << 20, 1 << 30)
}

impl Default for ServerConfig {
    fn default() -> Self {
        ServerConfig {
            threads_per_connection: 16,
            max_request: 32 << 20,
            memory_budget: default_memory_budget(),
            connection_budget: 64 << 20,
            max_connections: 1024,
            handshake_timeout: Some(Duration::from_secs(10)),
            idle_timeout: None,
            socket_mode: 0o600,
            shutdown_grace: Duration::from_secs(10),
            unix_send_buffer: 1 << 20,
            inline_qd1: true,
            inline_batch: true,
            busy_poll: Some(Duration::from_micros(50)),
        }
    }
}

impl ServerConfig {
    /// `memory_budget` as enforced.
    pub(crate) fn effective_budget(&self) -> usize {
        self.memory_budget.max(1 << 20)
    }

    /// `connection_budget` as enforced.
    pub(crate) fn effective_connection_budget(&self) -> usize {
        self.connection_budget.clamp(1 << 20, self.effective_budget())
    }
}

/// An NBD server for a fixed list of exports; bind it to one or more addresses.
#[derive(Debug, Clone)]
pub struct Server {
    shared: Arc<Shared>,
}

/// What every connection of a server reads.
#[derive(Debug)]
pub(crate) struct Shared {
    pub(crate) exports: Vec<Export>,
    pub(crate) config: ServerConfig,
    /// Payload buffers of every connection of every listener.
    pub(crate) budget: Budget,
    /// `NBD_OPT_STARTTLS` credentials and policy; `None`: TLS is off.
    pub(crate) tls: Option<TlsConfig>,
    /// Busy polling for the next request (`ServerConfig::busy_poll`).
    pub(crate) poll: BusyPoll,
}

impl Shared {
    /// The export a client names: an exact match, else the first one for the empty name.
    pub(crate) fn find_export(&self, name: &[u8]) -> Option<usize> {
        self.exports
            .iter()
            .position(|e| e.name.as_bytes() == name)
            .or_else(|| (name.is_empty() && !self.exports.is_empty()).then_some(0))
    }
}

/// What a connection to one export advertises and enforces, derived once from the device.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct ExportParams {
    pub(crate) size: u64,
    pub(crate) caps: Caps,
    pub(crate) read_only: bool,
    pub(crate) rotational: bool,
    /// Every offset and length must be a multiple of this (the device's logical block).
    pub(crate) min_block: u32,
    pub(crate) preferred_block: u32,
    /// Largest READ/WRITE payload.
    pub(crate) max_request: u32,
}

impl ExportParams {
    pub(crate) fn new(export: &Export, config: &ServerConfig) -> Self {
        let geometry = export.device.geometry();
        let caps = export.device.caps();
        let min_block = geometry.logical_block.max(1);
        let preferred_block = geometry.physical_block.max(4096).max(min_block).next_power_of_two();
        // A request must fit in one connection's budget, or it could never be served.
        let cap = u32::try_from(config.effective_connection_budget()).unwrap_or(u32::MAX);
        let max_request = config.max_request.clamp(4096, 1 << 30).min(cap).max(preferred_block);
        let max_request = max_request - max_request % min_block;
        ExportParams {
            size: geometry.size,
            caps,
            read_only: export.read_only || caps.contains(Caps::READ_ONLY),
            rotational: export.rotational,
            min_block,
            preferred_block,
            max_request,
        }
    }

    /// Transmission flags for a connection that did (or did not) negotiate structured
    /// replies.
    pub(crate) fn tflags(&self, structured: bool) -> u16 {
        // CAN_MULTI_CONN promises that a FLUSH on one connection covers writes completed on
        // every connection, and that all connections see one consistent device. That holds
        // because all connections share one `Arc<dyn BlockDevice>` (no per-connection
        // cache here), a write is answered only after it returned (visible to every later
        // read, by the trait's contract), and the `BlockDevice::flush` contract is global:
        // it makes durable every write that completed before it, whichever thread issued it
        // (an integrity journal commits all of it; FileDevice's group commit covers every
        // write numbered before the fdatasync).
        let mut f = tflag::HAS_FLAGS | tflag::CAN_MULTI_CONN;
        if self.rotational {
            f |= tflag::ROTATIONAL;
        }
        if self.caps.contains(Caps::FLUSH) {
            f |= tflag::SEND_FLUSH;
        }
        if self.read_only {
            f |= tflag::READ_ONLY;
        } else {
            // FUA is native with Caps::FUA and emulated by a flush with Caps::FLUSH; a device
            // with neither has no volatile cache, so clients need neither.
            if self.caps.intersects(Caps::FUA | Caps::FLUSH) {
                f |= tflag::SEND_FUA;
            }
            if self.caps.contains(Caps::DISCARD) {
                f |= tflag::SEND_TRIM;
            }
            // Every device can zero: the trait's default `write_zeroes` writes zero buffers.
            f |= tflag::SEND_WRITE_ZEROES;
        }
        if structured {
            // Reads are always answered with one data chunk, so "don't fragment" is free.
            f |= tflag::SEND_DF;
        }
        f
    }
}

impl Server {
    /// A server offering `exports` (the first is the default export), without TLS.
    pub fn new(exports: Vec<Export>, config: ServerConfig) -> Self {
        Self::build(exports, config, None)
    }

    /// A server offering `exports` that offers (or, with [`TlsConfig::required`], requires)
    /// TLS through `NBD_OPT_STARTTLS`.
    pub fn new_with_tls(exports: Vec<Export>, config: ServerConfig, tls: TlsConfig) -> Self {
        Self::build(exports, config, Some(tls))
    }

    fn build(exports: Vec<Export>, config: ServerConfig, tls: Option<TlsConfig>) -> Self {
        for e in &exports {
            let g = e.device.geometry();
            if g.logical_block == 0
                || !g.logical_block.is_power_of_two()
                || g.size % u64::from(g.logical_block.max(1)) != 0
            {
                warn!("export {:?}: unusual geometry {g:?}; clients may be unable to reach its end", e.name);
            }
        }
        if config.max_request as usize > config.effective_connection_budget() {
            warn!(
                "maximum request {} exceeds the per-connection budget {}; advertising the budget",
                config.max_request,
                config.effective_connection_budget()
            );
        }
        let budget = Budget::new(config.effective_budget());
        let poll = BusyPoll::new(config.busy_poll);
        Server { shared: Arc::new(Shared { exports, config, budget, tls, poll }) }
    }

    /// The exports, in the order given.
    pub fn exports(&self) -> &[Export] {
        &self.shared.exports
    }

    /// Starts listening on `addr`: [`Listening::bind`] with this server's socket mode, then
    /// [`Server::attach`].
    pub fn bind(&self, addr: &ListenAddr) -> io::Result<BoundServer> {
        Ok(self.attach(Listening::bind(addr, self.shared.config.socket_mode)?))
    }

    /// Serves on a socket bound earlier, e.g. before a slow step (a key derivation) that
    /// produces the exports, so that an address in use is reported first. Connections that
    /// arrive in between wait in the kernel's backlog until `serve` accepts them.
    pub fn attach(&self, socket: Listening) -> BoundServer {
        let Listening { listener, local, guard } = socket;
        info!("NBD server listening on {local}");
        let listen_fd = listener.try_clone_fd().ok();
        BoundServer {
            shared: self.shared.clone(),
            listener,
            state: Arc::new(ShutdownState {
                stopping: AtomicBool::new(false),
                registry: Mutex::new(Registry::default()),
                tick: Condvar::new(),
                wake: local.clone(),
                listen_fd,
            }),
            local,
            guard,
        }
    }
}

/// A listening socket that no server serves yet ([`Server::attach`]). Dropping it closes the
/// socket and, for a Unix socket, removes its file and lock.
#[derive(Debug)]
pub struct Listening {
    listener: Listener,
    local: ListenAddr,
    guard: Option<UnixGuard>,
}

impl Listening {
    /// Binds and listens on `addr`.
    ///
    /// A Unix socket is created with permission bits `socket_mode` (as
    /// `ServerConfig::socket_mode`) from the start, and `PATH.lock` is created beside it and
    /// locked (`flock`) while the socket lives: a second server for the same path fails with
    /// `AddrInUse` instead of racing this one. Under that lock a stale socket file (nobody
    /// accepting) is replaced; a live one (a server that does not use the lock) is an
    /// `AddrInUse` error, and anything that is not a socket is left alone (`AlreadyExists`).
    pub fn bind(addr: &ListenAddr, socket_mode: u32) -> io::Result<Listening> {
        let (listener, local, guard) = match addr {
            ListenAddr::Unix(path) => {
                let (l, guard) = bind_unix(path, socket_mode)?;
                (Listener::Unix(l), ListenAddr::Unix(path.clone()), Some(guard))
            }
            ListenAddr::Tcp(a) => {
                let l = TcpListener::bind(a.as_str())?;
                let local = ListenAddr::Tcp(l.local_addr()?.to_string());
                (Listener::Tcp(l), local, None)
            }
        };
        Ok(Listening { listener, local, guard })
    }

    /// The address bound (a TCP port 0 resolved to the port chosen).
    pub fn local_addr(&self) -> &ListenAddr {
        &self.local
    }
}

/// Most connections waiting in the kernel for `accept`.
const BACKLOG: i32 = 1024;

/// Binds a listening Unix socket at `path` whose file has permission bits `mode` from the
/// moment it exists, holding `PATH.lock` (see `Server::bind`).
fn bind_unix(path: &Path, mode: u32) -> io::Result<(UnixListener, UnixGuard)> {
    if mode & !0o777 != 0 || mode & 0o600 != 0o600 {
        return Err(io::Error::new(
            io::ErrorKind::InvalidInput,
            format!("socket mode {mode:#o} must be at most 0777 and include owner read and write (0600)"),
        ));
    }
    let lock = SocketLock::acquire(path)?;
    // Under the lock no other sealdisk server binds or removes `path`.
    match std::fs::symlink_metadata(path) {
        Ok(m) if m.file_type().is_socket() => match UnixStream::connect(path) {
            Ok(_) => {
                return Err(io::Error::new(
                    io::ErrorKind::AddrInUse,
                    format!("{} is in use by another server", path.display()),
                ))
            }
            Err(e) if e.kind() == io::ErrorKind::ConnectionRefused => {
                warn!("removing stale socket {}", path.display());
                std::fs::remove_file(path)?;
            }
            // Permission denied and the like: not ours to judge, let alone remove.
            Err(e) => return Err(e),
        },
        Ok(_) => {
            return Err(io::Error::new(
                io::ErrorKind::AlreadyExists,
                format!("{} exists and is not a socket", path.display()),
            ))
        }
        Err(e) if e.kind() == io::ErrorKind::NotFound => {}
        Err(e) => return Err(e),
    }
    let fd = socket_with(AddressFamily::UNIX, SocketType::STREAM, SocketFlags::CLOEXEC, None)?;
    // Linux creates the socket file with the socket inode's mode minus the umask
    // (net/unix/af_unix.c, unix_bind_bsd), so after this fchmod the file never has more than
    // `mode`, whatever the umask and without touching the process-wide umask.
    rustix::fs::fchmod(&fd, Mode::from_raw_mode(mode))?;
    bind(&fd, &SocketAddrUnix::new(path)?)?;
    let guard = UnixGuard { socket: path.to_path_buf(), _lock: lock };
    // Listen at once: a client that sees the file may connect right away.
    listen(&fd, BACKLOG)?;
    // The umask may have taken bits the caller asked for (0660 under umask 022): give them
    // back (widening only: until then fewer users can connect, never more).
    let got = rustix::fs::stat(path)?.st_mode & 0o7777;
    if got & !mode != 0 {
        // Only on a kernel that ignores the socket inode's mode at bind; nothing has been
        // accepted, and the guard removes the file.
        return Err(io::Error::other(format!(
            "{} was created with mode {got:#o}, wider than {mode:#o}; refusing to serve",
            path.display()
        )));
    }
    if got != mode {
        rustix::fs::chmod(path, Mode::from_raw_mode(mode))?;
    }
    Ok((UnixListener::from(fd), guard))
}

/// `PATH.lock`, locked with `flock` for as long as a server uses the socket `PATH`.
#[derive(Debug)]
struct SocketLock {
    path: PathBuf,
    _file: std::fs::File,
}

impl SocketLock {
    fn acquire(socket: &Path) -> io::Result<SocketLock> {
        let mut name = socket.as_os_str().to_owned();
        name.push(".lock");
        let path = PathBuf::from(name);
        loop {
            let file = std::fs::OpenOptions::new()
                .read(true)
                .write(true)
                .create(true)
                .mode(0o600)
                .custom_flags(libc::O_NOFOLLOW | libc::O_CLOEXEC)
                .open(&path)?;
            match rustix::fs::flock(&file, FlockOperation::NonBlockingLockExclusive) {
                Ok(()) => {}
                Err(e) if e == rustix::io::Errno::WOULDBLOCK => {
                    return Err(io::Error::new(
                        io::ErrorKind::AddrInUse,
                        format!("{} is locked by another server", path.display()),
                    ))
                }
                Err(e) => return Err(e.into()),
            }
            // The previous holder removes the file before unlocking it: if what we locked is
            // no longer what the path names, lock the new file instead.
            let ours = rustix::fs::fstat(&file)?;
            match rustix::fs::stat(&path) {
                Ok(now) if now.st_dev == ours.st_dev && now.st_ino == ours.st_ino => {
                    return Ok(SocketLock { path, _file: file })
                }
                Ok(_) => continue,
                Err(e) if e == rustix::io::Errno::NOENT => continue,
                Err(e) => return Err(e.into()),
            }
        }
    }
}

impl Drop for SocketLock {
    fn drop(&mut self) {
        // Removed while still locked (the file closes after this), see `acquire`.
        if let Err(e) = std::fs::remove_file(&self.path) {
            warn!("could not remove lock file {}: {e}", self.path.display());
        }
    }
}

/// Removes the Unix socket file when the listener goes away, then releases the lock.
#[derive(Debug)]
struct UnixGuard {
    socket: PathBuf,
    _lock: SocketLock,
}

impl Drop for UnixGuard {
    fn drop(&mut self) {
        if let Err(e) = std::fs::remove_file(&self.socket) {
            if e.kind() != io::ErrorKind::NotFound {
                warn!("could not remove socket {}: {e}", self.socket.display());
            }
        }
    }
}

#[derive(Debug)]
enum Listener {
    Tcp(TcpListener),
    Unix(UnixListener),
}

impl Listener {
    /// A duplicate descriptor of the listening socket.
    fn try_clone_fd(&self) -> io::Result<OwnedFd> {
        match self {
            Listener::Tcp(l) => Ok(l.try_clone()?.into()),
            Listener::Unix(l) => Ok(l.try_clone()?.into()),
        }
    }

    /// Accepts one connection; a Unix one gets `unix_send_buffer` bytes of send buffer (0:
    /// the kernel's default).
    fn accept(&self, unix_send_buffer: usize) -> io::Result<Stream> {
        match self {
            Listener::Tcp(l) => {
                let (s, _) = l.accept()?;
                // Replies are written whole with one writev; never wait for an ACK to send.
                s.set_nodelay(true)?;
                Ok(Stream::Tcp(s))
            }
            Listener::Unix(l) => {
                let s = l.accept()?.0;
                if unix_send_buffer > 0 {
                    // The kernel caps the size at net.core.wmem_max: best effort, as asked.
                    if let Err(e) = rustix::net::sockopt::set_socket_send_buffer_size(&s, unix_send_buffer) {
                        debug!("cannot set SO_SNDBUF to {unix_send_buffer}: {e}");
                    }
                }
                Ok(Stream::Unix(s))
            }
        }
    }
}

/// A server listening on one address. Call `serve` (it blocks) and stop it from elsewhere
/// with a `ShutdownHandle`.
#[derive(Debug)]
pub struct BoundServer {
    shared: Arc<Shared>,
    listener: Listener,
    local: ListenAddr,
    state: Arc<ShutdownState>,
    guard: Option<UnixGuard>,
}

/// Stops a `BoundServer`: see `shutdown`.
#[derive(Debug, Clone)]
pub struct ShutdownHandle {
    state: Arc<ShutdownState>,
}

#[derive(Debug)]
struct ShutdownState {
    stopping: AtomicBool,
    registry: Mutex<Registry>,
    /// Wakes the watchdog (with the registry's lock) when the server stops.
    tick: Condvar,
    /// The listening address, to connect to once so that a blocked `accept` returns.
    wake: ListenAddr,
    /// A duplicate of the listening socket: `shutdown(2)` on it wakes a blocked `accept` on
    /// Linux even when the address cannot be reached (a Unix socket file removed from
    /// under the server).
    listen_fd: Option<OwnedFd>,
}

/// Live connections, by id: a handle on each socket so that shutdown and the watchdog can
/// end its reads.
#[derive(Debug, Default)]
struct Registry {
    next_id: u64,
    conns: HashMap<u64, Entry>,
}

#[derive(Debug)]
struct Entry {
    stream: Stream,
    /// While the connection is in its handshake: when the watchdog cuts it.
    handshake_deadline: Option<Instant>,
}

fn lock<T>(m: &Mutex<T>) -> MutexGuard<'_, T> {
    m.lock().unwrap_or_else(PoisonError::into_inner)
}

impl ShutdownHandle {
    /// Stops accepting, stops reading new requests (requests already read finish and are
    /// answered), closes every connection, flushes every export's device, removes the Unix
    /// socket file; then `serve` returns. Idempotent; returns without waiting.
    pub fn shutdown(&self) {
        {
            let reg = lock(&self.state.registry);
            if self.state.stopping.swap(true, Ordering::SeqCst) {
                return;
            }
            for e in reg.conns.values() {
                let _ = e.stream.shutdown(Shutdown::Read);
            }
            self.state.tick.notify_all();
        }
        // Wake the accept loop: shutting the listening socket down makes a blocked `accept`
        // fail at once (Linux); a throwaway connection does it elsewhere.
        if let Some(fd) = &self.state.listen_fd {
            let _ = rustix::net::shutdown(fd, rustix::net::Shutdown::Read);
        }
        match &self.state.wake {
            ListenAddr::Unix(p) => drop(UnixStream::connect(p)),
            ListenAddr::Tcp(a) => {
                if let Some(sa) = connectable_tcp(a).to_socket_addrs().ok().and_then(|mut i| i.next()) {
                    drop(TcpStream::connect_timeout(&sa, Duration::from_secs(1)));
                }
            }
        }
    }

    /// Whether `shutdown` was called.
    pub fn is_shutdown(&self) -> bool {
        self.state.stopping.load(Ordering::SeqCst)
    }
}

/// Deregisters a connection when its thread ends.
struct Deregister {
    state: Arc<ShutdownState>,
    id: u64,
}

impl Drop for Deregister {
    fn drop(&mut self) {
        lock(&self.state.registry).conns.remove(&self.id);
    }
}

impl BoundServer {
    /// The address actually bound (with the real port when port 0 was asked for).
    pub fn local_addr(&self) -> &ListenAddr {
        &self.local
    }

    /// A handle that stops `serve` from another thread.
    pub fn shutdown_handle(&self) -> ShutdownHandle {
        ShutdownHandle { state: self.state.clone() }
    }

    /// A handle on the server's live figures (memory held for payloads, connections).
    pub fn stats(&self) -> ServerStats {
        ServerStats { shared: self.shared.clone(), state: self.state.clone() }
    }

    /// Accepts and serves clients, one thread per connection plus its workers, until
    /// `ShutdownHandle::shutdown`. Returns the first error from the final flush of the
    /// exports' devices, if any.
    pub fn serve(self) -> io::Result<()> {
        let BoundServer { shared, listener, local, state, guard } = self;
        let watchdog = {
            let (shared, state) = (shared.clone(), state.clone());
            thread::Builder::new().name("nbd-watchdog".into()).spawn(move || watchdog(&shared, &state))?
        };
        let mut handles: Vec<JoinHandle<()>> = Vec::new();
        while !state.stopping.load(Ordering::SeqCst) {
            let accepted = listener.accept(shared.config.unix_send_buffer);
            if state.stopping.load(Ordering::SeqCst) {
                break;
            }
            match accepted {
                Ok(stream) => {
                    handles.retain(|h| !h.is_finished());
                    if let Some(h) = start_connection(stream, &shared, &state) {
                        handles.push(h);
                    }
                }
                Err(e) => {
                    warn!("{local}: accept failed: {e}");
                    // Out of descriptors or memory: back off instead of spinning.
                    if matches!(
                        e.raw_os_error(),
                        Some(libc::EMFILE | libc::ENFILE | libc::ENOBUFS | libc::ENOMEM)
                    ) {
                        thread::sleep(Duration::from_millis(50));
                    }
                }
            }
        }
        drop(listener);
        drop(guard);
        info!("{local}: shutting down, waiting for {} connection(s)", handles.len());

        let deadline = Instant::now() + shared.config.shutdown_grace;
        while handles.iter().any(|h| !h.is_finished()) && Instant::now() < deadline {
            thread::sleep(Duration::from_millis(5));
        }
        for e in lock(&state.registry).conns.values() {
            let _ = e.stream.shutdown(Shutdown::Both);
        }
        for h in handles {
            if h.join().is_err() {
                error!("{local}: a connection thread panicked");
            }
        }
        if watchdog.join().is_err() {
            error!("{local}: the watchdog thread panicked");
        }

        let mut result = Ok(());
        for e in &shared.exports {
            if let Err(err) = e.device.flush() {
                error!("flushing export {:?} at shutdown: {err}", e.name);
                if result.is_ok() {
                    result = Err(io::Error::other(format!("flushing export {:?}: {err}", e.name)));
                }
            }
        }
        info!("{local}: stopped");
        result
    }
}

/// Closes connections whose handshake took too long and frees pooled buffers left idle,
/// until the server stops.
fn watchdog(shared: &Shared, state: &ShutdownState) {
    let tick = shared
        .config
        .handshake_timeout
        .map_or(Duration::from_millis(500), |t| t / 4)
        .clamp(Duration::from_millis(10), Duration::from_millis(500));
    let mut reg = lock(&state.registry);
    while !state.stopping.load(Ordering::SeqCst) {
        let now = Instant::now();
        for (id, e) in reg.conns.iter_mut() {
            if e.handshake_deadline.is_some_and(|d| d <= now) {
                info!("connection {id}: no export selected within the handshake timeout; closing it");
                e.handshake_deadline = None;
                let _ = e.stream.shutdown(Shutdown::Both);
            }
        }
        drop(reg);
        shared.budget.reap_idle();
        reg = lock(&state.registry);
        if state.stopping.load(Ordering::SeqCst) {
            break;
        }
        reg = state.tick.wait_timeout(reg, tick).unwrap_or_else(PoisonError::into_inner).0;
    }
}

/// Live figures of a running server; `Clone + Send`.
#[derive(Debug, Clone)]
pub struct ServerStats {
    shared: Arc<Shared>,
    state: Arc<ShutdownState>,
}

impl ServerStats {
    /// Bytes of READ/WRITE payload buffers held for requests now (being read, executed, or
    /// waiting for the client to take the reply), over every connection of the server.
    pub fn bytes_in_flight(&self) -> usize {
        self.shared.budget.in_use()
    }

    /// The most `bytes_in_flight` seen at once.
    pub fn peak_bytes_in_flight(&self) -> usize {
        self.shared.budget.peak()
    }

    /// Bytes of idle payload buffers kept for reuse (they count against the budget too).
    pub fn bytes_pooled(&self) -> usize {
        self.shared.budget.pooled()
    }

    /// The server-wide memory budget in force.
    pub fn memory_budget(&self) -> usize {
        self.shared.budget.limit()
    }

    /// Busy polls (`ServerConfig::busy_poll`) that saw the next request arrive, and those
    /// that gave up and slept, over every connection of the server.
    pub fn busy_polls(&self) -> (u64, u64) {
        self.shared.poll.counts()
    }

    /// Connections of this listener, in handshake or transmission.
    pub fn connections(&self) -> usize {
        lock(&self.state.registry).conns.len()
    }
}

fn start_connection(
    stream: Stream,
    shared: &Arc<Shared>,
    state: &Arc<ShutdownState>,
) -> Option<JoinHandle<()>> {
    let peer = stream.peer();
    let ctl = match stream.try_clone() {
        Ok(c) => c,
        Err(e) => {
            warn!("{peer}: cannot clone socket: {e}");
            return None;
        }
    };
    let id = {
        let mut reg = lock(&state.registry);
        if state.stopping.load(Ordering::SeqCst) {
            return None;
        }
        if reg.conns.len() >= shared.config.max_connections {
            warn!("{peer}: refused, already {} connections", reg.conns.len());
            return None;
        }
        reg.next_id += 1;
        let id = reg.next_id;
        let handshake_deadline = shared.config.handshake_timeout.map(|t| Instant::now() + t);
        reg.conns.insert(id, Entry { stream: ctl, handshake_deadline });
        id
    };
    let dereg = Deregister { state: state.clone(), id };
    let shared = shared.clone();
    let state = state.clone();
    let spawned = thread::Builder::new().name(format!("nbd-conn-{id}")).spawn(move || {
        let _dereg = dereg;
        run_connection(stream, &shared, &state, id, &peer);
    });
    match spawned {
        Ok(h) => Some(h),
        Err(e) => {
            // The closure (and with it the Deregister guard) was dropped: the registry is
            // already clean.
            warn!("cannot start a connection thread: {e}");
            None
        }
    }
}

/// Capacity of the per-connection read buffer: a 4 KiB request with its header, or many
/// pipelined headers, arrive with one `read`.
pub(crate) const READ_BUFFER: usize = 64 * 1024;

fn run_connection(stream: Stream, shared: &Shared, state: &ShutdownState, id: u64, peer: &str) {
    debug!("{peer}: connected");
    let mut writer = match stream.try_clone() {
        Ok(w) => w,
        Err(e) => {
            warn!("{peer}: cannot clone socket: {e}");
            return;
        }
    };
    let mut reader = BufReader::with_capacity(READ_BUFFER, stream);
    // After STARTTLS, `reader` and `writer` are the plain end of the TLS pump.
    let mut tls = None;
    match handshake::negotiate(&mut reader, &mut writer, shared, peer, &mut tls) {
        Ok(Some(session)) => {
            // The handshake is over: the watchdog no longer times this connection out.
            let timed_out = match lock(&state.registry).conns.get_mut(&id) {
                Some(e) => e.handshake_deadline.take().is_none() && shared.config.handshake_timeout.is_some(),
                None => true,
            };
            if timed_out {
                debug!("{peer}: handshake finished after the timeout");
                return;
            }
            let export = &shared.exports[session.export];
            info!("{peer}: serving export {:?} (structured replies: {})", export.name, session.structured);
            if let Some(t) = shared.config.idle_timeout {
                if let Err(e) = writer.set_timeouts(Some(t)) {
                    warn!("{peer}: cannot set the idle timeout: {e}");
                    return;
                }
            }
            let limits = transmission::Limits {
                config: &shared.config,
                budget: &shared.budget,
                stopping: &state.stopping,
                poll: &shared.poll,
            };
            transmission::serve(reader, writer, export, limits, session, peer);
        }
        Ok(None) => drop((reader, writer)),
        Err(e) => {
            debug!("{peer}: handshake ended: {e}");
            drop((reader, writer));
        }
    }
    // The pump sends the last replies once the plain end is closed (above).
    if let Some(pump) = tls {
        pump.join(peer);
    }
    debug!("{peer}: disconnected");
}

impl Server {
    /// Serves one already-connected Unix socket on the calling thread (handshake, then
    /// transmission) until the client disconnects. A seam for the fuzz targets and tests
    /// (see [`crate::fuzzing`]): no `BoundServer` knows of this connection, so neither its
    /// shutdown nor its connection limit applies.
    #[doc(hidden)]
    pub fn serve_unix_stream(&self, stream: UnixStream) {
        let stream = Stream::Unix(stream);
        let Ok(ctl) = stream.try_clone() else { return };
        // A registry of its own with this one connection, so that the handshake's end is
        // recorded as for an accepted connection (no watchdog runs: the deadline never fires).
        let deadline = self.shared.config.handshake_timeout.map(|t| Instant::now() + t);
        let state = ShutdownState {
            stopping: AtomicBool::new(false),
            registry: Mutex::new(Registry::default()),
            tick: Condvar::new(),
            wake: ListenAddr::Unix(PathBuf::new()),
            listen_fd: None,
        };
        lock(&state.registry).conns.insert(1, Entry { stream: ctl, handshake_deadline: deadline });
        run_connection(stream, &self.shared, &state, 1, "unix");
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// What the kernel makes of `SO_SNDBUF = n` on this machine: doubled, capped at wmem_max.
    fn kernel_sndbuf(n: usize) -> Option<usize> {
        let max: usize = std::fs::read_to_string("/proc/sys/net/core/wmem_max").ok()?.trim().parse().ok()?;
        Some(2 * n.min(max))
    }

    fn accepted_sndbuf(unix_send_buffer: usize) -> usize {
        let dir = std::env::temp_dir().join(format!("nbd-sndbuf-{}-{unix_send_buffer}", std::process::id()));
        let _ = std::fs::remove_file(&dir);
        let listener = Listener::Unix(UnixListener::bind(&dir).unwrap());
        let _client = std::os::unix::net::UnixStream::connect(&dir).unwrap();
        let Stream::Unix(s) = listener.accept(unix_send_buffer).unwrap() else { unreachable!() };
        let _ = std::fs::remove_file(&dir);
        rustix::net::sockopt::socket_send_buffer_size(&s).unwrap()
    }

    #[test]
    fn unix_connections_get_the_configured_send_buffer() {
        let default = accepted_sndbuf(0);
        let asked = ServerConfig::default().unix_send_buffer;
        let got = accepted_sndbuf(asked);
        if let Some(expected) = kernel_sndbuf(asked) {
            assert_eq!(got, expected);
        }
        assert!(got > default, "asked for {asked}, got {got}, default {default}");
    }
}
