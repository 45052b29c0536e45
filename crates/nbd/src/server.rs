//! The public face: exports, configuration, binding, the accept loop and shutdown.

use std::collections::HashMap;
use std::io::{self, BufReader};
use std::net::{Shutdown, TcpListener, TcpStream, ToSocketAddrs};
use std::os::unix::fs::FileTypeExt;
use std::os::unix::net::{UnixListener, UnixStream};
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex, MutexGuard, PoisonError};
use std::thread::{self, JoinHandle};
use std::time::{Duration, Instant};

use blockdev::{BlockDevice, Caps};
use log::{debug, error, info, warn};

use crate::addr::{connectable_tcp, ListenAddr};
use crate::stream::Stream;
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
}

impl Export {
    /// A writable export without description.
    pub fn new(name: impl Into<String>, device: Arc<dyn BlockDevice>) -> Self {
        Export { name: name.into(), description: String::new(), device, read_only: false }
    }
}

/// Server tuning. `ServerConfig::default()` is what the measurements chose.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ServerConfig {
    /// Most worker threads per connection, i.e. the most requests of one connection executed
    /// at once. Workers are started on demand, so an idle or queue-depth-1 connection uses
    /// one or two threads. At least 1.
    pub threads_per_connection: usize,
    /// Largest READ or WRITE payload accepted, in bytes; advertised as the maximum block size.
    /// Clamped to 4 KiB..=1 GiB and to at least the export's preferred block size.
    pub max_request: u32,
    /// Further connections are closed right after `accept`.
    pub max_connections: usize,
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
}

impl Default for ServerConfig {
    fn default() -> Self {
        ServerConfig {
            threads_per_connection: 16,
            max_request: 32 << 20,
            max_connections: 1024,
            shutdown_grace: Duration::from_secs(10),
            unix_send_buffer: 1 << 20,
        }
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
        let max_request = config.max_request.clamp(4096, 1 << 30).max(preferred_block);
        let max_request = max_request - max_request % min_block;
        ExportParams {
            size: geometry.size,
            caps,
            read_only: export.read_only || caps.contains(Caps::READ_ONLY),
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
        // cache here) and the `BlockDevice::flush` contract is global: it makes durable
        // every write that completed before it, whichever thread issued it.
        let mut f = tflag::HAS_FLAGS | tflag::CAN_MULTI_CONN;
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
    /// A server offering `exports` (the first is the default export).
    pub fn new(exports: Vec<Export>, config: ServerConfig) -> Self {
        for e in &exports {
            let g = e.device.geometry();
            if g.logical_block == 0
                || !g.logical_block.is_power_of_two()
                || g.size % u64::from(g.logical_block.max(1)) != 0
            {
                warn!("export {:?}: unusual geometry {g:?}; clients may be unable to reach its end", e.name);
            }
        }
        Server { shared: Arc::new(Shared { exports, config }) }
    }

    /// The exports, in the order given.
    pub fn exports(&self) -> &[Export] {
        &self.shared.exports
    }

    /// Starts listening on `addr`. A stale Unix socket file (nobody accepting) is replaced;
    /// a live one is an `AddrInUse` error.
    pub fn bind(&self, addr: &ListenAddr) -> io::Result<BoundServer> {
        let (listener, local, guard) = match addr {
            ListenAddr::Unix(path) => {
                let l = bind_unix(path)?;
                (Listener::Unix(l), ListenAddr::Unix(path.clone()), Some(SocketFileGuard(path.clone())))
            }
            ListenAddr::Tcp(a) => {
                let l = TcpListener::bind(a.as_str())?;
                let local = ListenAddr::Tcp(l.local_addr()?.to_string());
                (Listener::Tcp(l), local, None)
            }
        };
        info!("NBD server listening on {local}");
        Ok(BoundServer {
            shared: self.shared.clone(),
            listener,
            state: Arc::new(ShutdownState {
                stopping: AtomicBool::new(false),
                registry: Mutex::new(Registry::default()),
                wake: local.clone(),
            }),
            local,
            guard,
        })
    }
}

fn bind_unix(path: &Path) -> io::Result<UnixListener> {
    match UnixListener::bind(path) {
        Err(e) if e.kind() == io::ErrorKind::AddrInUse => {
            let is_socket =
                std::fs::symlink_metadata(path).map(|m| m.file_type().is_socket()).unwrap_or(false);
            if is_socket && UnixStream::connect(path).is_err() {
                warn!("removing stale socket {}", path.display());
                std::fs::remove_file(path)?;
                UnixListener::bind(path)
            } else {
                Err(e)
            }
        }
        r => r,
    }
}

/// Removes the Unix socket file when the listener goes away.
#[derive(Debug)]
struct SocketFileGuard(PathBuf);

impl Drop for SocketFileGuard {
    fn drop(&mut self) {
        if let Err(e) = std::fs::remove_file(&self.0) {
            if e.kind() != io::ErrorKind::NotFound {
                warn!("could not remove socket {}: {e}", self.0.display());
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
    guard: Option<SocketFileGuard>,
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
    /// The listening address, to connect to once so that a blocked `accept` returns.
    wake: ListenAddr,
}

/// Live connections, by id: a handle on each socket so that shutdown can end its reads.
#[derive(Debug, Default)]
struct Registry {
    next_id: u64,
    conns: HashMap<u64, Stream>,
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
            for s in reg.conns.values() {
                let _ = s.shutdown(Shutdown::Read);
            }
        }
        // Wake the accept loop with a throwaway connection.
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

    /// Accepts and serves clients, one thread per connection plus its workers, until
    /// `ShutdownHandle::shutdown`. Returns the first error from the final flush of the
    /// exports' devices, if any.
    pub fn serve(self) -> io::Result<()> {
        let BoundServer { shared, listener, local, state, guard } = self;
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
        for s in lock(&state.registry).conns.values() {
            let _ = s.shutdown(Shutdown::Both);
        }
        for h in handles {
            if h.join().is_err() {
                error!("{local}: a connection thread panicked");
            }
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
        reg.conns.insert(id, ctl);
        id
    };
    let dereg = Deregister { state: state.clone(), id };
    let shared = shared.clone();
    let spawned = thread::Builder::new().name(format!("nbd-conn-{id}")).spawn(move || {
        let _dereg = dereg;
        run_connection(stream, &shared, &peer);
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
const READ_BUFFER: usize = 64 * 1024;

fn run_connection(stream: Stream, shared: &Shared, peer: &str) {
    debug!("{peer}: connected");
    let mut writer = match stream.try_clone() {
        Ok(w) => w,
        Err(e) => {
            warn!("{peer}: cannot clone socket: {e}");
            return;
        }
    };
    let mut reader = BufReader::with_capacity(READ_BUFFER, stream);
    match handshake::negotiate(&mut reader, &mut writer, shared, peer) {
        Ok(Some(session)) => {
            let export = &shared.exports[session.export];
            info!("{peer}: serving export {:?} (structured replies: {})", export.name, session.structured);
            transmission::serve(reader, writer, export, &shared.config, session, peer);
        }
        Ok(None) => {}
        Err(e) => debug!("{peer}: handshake ended: {e}"),
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
        run_connection(Stream::Unix(stream), &self.shared, "unix");
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
