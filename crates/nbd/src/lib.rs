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
//! in parallel and replies go out in completion order. Each worker reuses its own buffer
//! (up to 4 MiB), so steady-state requests allocate nothing.
//!
//! `ShutdownHandle::shutdown` stops accepting, shuts down the read side of every socket
//! (requests already read still run and are answered), waits for the connections (at most
//! `ServerConfig::shutdown_grace`), flushes every export's device, removes the Unix socket
//! file, and `serve` returns.
//!
//! # Protocol
//!
//! Options: `EXPORT_NAME`, `GO`, `INFO` (export, name, description, block sizes: minimum =
//! logical block, preferred = max(physical block, 4096), maximum = `max_request`), `LIST`,
//! `ABORT`, `STRUCTURED_REPLY`; anything else gets `NBD_REP_ERR_UNSUP`. Commands: `READ`,
//! `WRITE` (FUA), `FLUSH`, `TRIM` (with `Caps::DISCARD`), `WRITE_ZEROES` (`NO_HOLE`, FUA),
//! `DISC`. Invalid requests are answered with the error the spec names and the connection
//! goes on; only a request that cannot be resynchronised (bad magic, a broken socket)
//! closes its own connection. See [`wire`] for the byte layouts.
//!
//! # Known gaps
//!
//! * No TLS (`NBD_OPT_STARTTLS` gets `NBD_REP_ERR_UNSUP`), no `NBD_CMD_BLOCK_STATUS` /
//!   meta contexts, no extended headers, no `NBD_CMD_CACHE`, no fast zero.
//! * Memory is bounded per connection (`threads_per_connection × max_request`, 512 MiB with
//!   the defaults, only when a client keeps that many maximum-size requests in flight) and
//!   by `max_connections`, but there is no server-wide budget. nbdkit has the same exposure.
//! * A connection that never finishes its handshake holds a thread until shutdown.
#![forbid(unsafe_code)]
#![warn(missing_docs)]

mod addr;
#[doc(hidden)]
pub mod fuzzing;
mod handshake;
mod server;
mod stream;
mod transmission;
pub mod wire;

pub use addr::{AddrParseError, ListenAddr, DEFAULT_HOST};
pub use server::{BoundServer, Export, Server, ServerConfig, ShutdownHandle};
