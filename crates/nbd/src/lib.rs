//! NBD server (fixed newstyle) over `Arc<dyn BlockDevice>`.
//!
//! Serves one or more [`Export`]s on a Unix or TCP socket to any NBD client (qemu, libnbd's
//! nbdcopy/nbdinfo/nbdsh, fio's nbd engine, the kernel's nbd-client). It knows nothing of
//! LUKS or dm-crypt: every request becomes one [`blockdev::BlockDevice`] call.
//!
//! # Use
//!
//! ```no_run
//! use std::sync::Arc;
//! use blockdev::MemDevice;
//! use nbd::{Export, ListenAddr, Server, ServerConfig};
//!
//! let dev = Arc::new(MemDevice::new(64 << 20, 512));
//! let server = Server::new(vec![Export::new("disk", dev)], ServerConfig::default());
//! let bound = server.bind(&"unix:/tmp/disk.sock".parse::<ListenAddr>()?)?;
//! println!("serving {}", bound.local_addr().uri("disk"));
//! let stop = bound.shutdown_handle(); // Clone + Send: call stop.shutdown() from anywhere
//! # stop.shutdown();
//! bound.serve()?; // returns after stop.shutdown()
//! # Ok::<(), Box<dyn std::error::Error>>(())
//! ```
//!
//! # Threads
//!
//! ```text
//!   BoundServer::serve (caller's thread): accept loop
//!     │ one thread per connection ("nbd-conn-N"): handshake, then becomes worker 1
//!     ▼
//!   ┌─────────────────────────── connection ───────────────────────────┐
//!   │  reader: Mutex<BufReader<socket>>      writer: Mutex<socket>     │
//!   │                                                                  │
//!   │  worker 1 ─ lock reader ─ read hdr+payload ─ unlock ─┐           │
//!   │  worker 2 ─ lock reader (waits) ...                  ▼           │
//!   │  worker k ─ ...                   execute on the device          │
//!   │                                   (in parallel, any order)       │
//!   │                                          │                       │
//!   │   lock writer ─ one writev(header, data) ─ unlock                │
//!   │   (writer busy? a small reply joins the queue the sender drains) │
//!   └──────────────────────────────────────────────────────────────────┘
//!        workers start on demand, up to ServerConfig::threads_per_connection
//! ```
//!
//! This is nbdkit's design. A worker reads a request and executes it itself, so a request
//! never changes threads and queue-depth-1 latency stays minimal; with a deeper queue the
//! next worker is already reading while others execute, so requests of one connection run
//! in parallel and replies go out in completion order. Payload buffers come from a
//! server-wide pool and go back to it once the reply has left, so steady-state requests
//! allocate nothing.
//!
//! `ShutdownHandle::shutdown` stops accepting, shuts down the read side of every socket
//! (requests already read still run and are answered), waits for the connections (at most
//! `ServerConfig::shutdown_grace`), flushes every export's device, removes the Unix socket
//! file and its lock file, and `serve` returns. A TRIM or WRITE_ZEROES in progress stops
//! at its next piece and is answered `ESHUTDOWN`.
//!
//! # Limits (hostile clients)
//!
//! ```text
//!   accept ─ over max_connections? ─ close at once
//!     │
//!   handshake ─ not done within handshake_timeout (10 s)? ─ the watchdog closes the socket
//!     │
//!   transmission: each READ/WRITE payload buffer is taken from the memory budget while the
//!     worker still holds the reader
//!       ├ this connection holds connection_budget (64 MiB)? ─ wait: it reads nothing more
//!       └ the server holds memory_budget (1 GiB, ≤ RAM/4)?  ─ free idle pooled buffers, else wait
//!     buffers go back after the reply has left; idle_timeout (off) closes a connection with
//!     nothing in flight that sends nothing, or whose reply makes no progress, that long
//!   TRIM / WRITE_ZEROES reach the device in pieces of at most 64 MiB; shutdown stops between
//!     pieces (ESHUTDOWN)
//! ```
//!
//! A client that does not read its replies therefore pins at most its connection's budget
//! and stalls only itself. Error replies carry a fixed text per error kind, never the device
//! error's own text (which can name the backing file). A Unix socket file is created with
//! `ServerConfig::socket_mode` (0600) from the start, and `PATH.lock` is held while serving
//! so that two servers never remove each other's socket (`Server::bind`).
//!
//! # Protocol
//!
//! Options: `EXPORT_NAME`, `GO`, `INFO` (export, name, description, block sizes: minimum =
//! logical block, preferred = max(physical block, 4096), maximum = `max_request`), `LIST`,
//! `ABORT`, `STRUCTURED_REPLY`, and `STARTTLS` when the server was built with a
//! [`TlsConfig`] ([`Server::new_with_tls`]: x509 or PSK, TLS offered or required; see the
//! [`tls`] module for the policy and the per-connection pump thread that carries a TLS
//! session), `LIST_META_CONTEXT` and `SET_META_CONTEXT` (after `STRUCTURED_REPLY`; the one
//! context is `base:allocation`); anything else gets `NBD_REP_ERR_UNSUP`. Commands: `READ`,
//! `WRITE` (FUA), `FLUSH`, `TRIM` (with `Caps::DISCARD`), `WRITE_ZEROES` (`NO_HOLE`, FUA),
//! `BLOCK_STATUS` (`REQ_ONE`; with `base:allocation` selected for the export), `DISC`.
//!
//! `BLOCK_STATUS` answers from [`blockdev::BlockDevice::allocation`], at most 1024 extents
//! per reply: `NBD_STATE_HOLE` and `NBD_STATE_ZERO` are exactly the device's `HOLE` and
//! `ZERO`. Only a raw file export (a `FileDevice` or a `Slice` of one) reports holes
//! (`HOLE | ZERO`, so nbdcopy and qemu-img skip them); an encrypting or integrity layer
//! reports all data, since a hole below it does not read as zeroes through it. Invalid requests are answered with the error the spec names and the connection
//! goes on; only a request that cannot be resynchronised (bad magic, a broken socket)
//! closes its own connection. See [`wire`] for the byte layouts.
//!
//! # Known gaps
//!
//! * No extended headers, no `NBD_CMD_CACHE`, no fast zero; `base:allocation` is the only
//!   metadata context.
//! * Not in the memory budget: per connection a 64 KiB read buffer, at most 64 KiB of
//!   handshake option data, at most 256 KiB of queued small replies, and its threads'
//!   stacks, and per worker a BLOCK_STATUS reply being built (at most 1024 extents, 8 KiB)
//!   — bounded by `max_connections` and `threads_per_connection`, not by the budget.
//!   Nor is what a device allocates for a TRIM/WRITE_ZEROES piece.
//! * Enough clients that do not read their replies (`memory_budget / connection_budget`,
//!   16 with the defaults) exhaust the budget and stall everyone else until `idle_timeout`
//!   (off by default) closes them. Likewise `max_connections` clients that never finish the
//!   handshake keep others out for up to `handshake_timeout`. Without authentication (TLS)
//!   a local user who may connect can always deny service; these limits keep the server's
//!   memory and threads bounded while that happens.
//! * The connection limit and the handshake watchdog are per listener (`BoundServer`); the
//!   memory budget is per `Server`.
//! * Replies a TLS client has not read yet sit in its pump and socket pair, where the
//!   transmission code counts them as sent: the budget sees them only once those (bounded)
//!   buffers are full.
#![forbid(unsafe_code)]
#![warn(missing_docs)]

mod addr;
mod budget;
#[doc(hidden)]
pub mod fuzzing;
mod handshake;
mod poll;
mod server;
mod stream;
pub mod tls;
mod transmission;
pub mod wire;

pub use addr::{AddrParseError, ListenAddr, DEFAULT_HOST};
pub use server::{
    default_memory_budget, BoundServer, Export, Listening, Server, ServerConfig, ServerStats, ShutdownHandle,
};
pub use tls::{TlsConfig, TlsError, CA_CERT, CA_CRL, SERVER_CERT, SERVER_KEY};
