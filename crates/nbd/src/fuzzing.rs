//! A whole NBD session from bytes: what the `nbd_session` fuzz target and the corpus replay
//! test (`tests/fuzz_corpus.rs`) run. Not part of the supported API.
//!
//! [`run_session`] serves a connected socket pair with the real server code (handshake,
//! then transmission) over two small in-memory exports, sends `input` as everything the
//! client ever says, closes the client's write side, and returns what the server answered.
//! The exports are small and the request size is capped, so no input can make the server
//! allocate or work much: a READ of 32 MiB of the 1 MiB export is refused by the server's
//! own checks (`max_request`, end of export), as it would be for a real client.

use std::io::{self, Read};
use std::net::Shutdown;
use std::os::unix::net::UnixStream;
use std::sync::Arc;
use std::thread;

use blockdev::MemDevice;
use rustix::net::{send, SendFlags};

use crate::server::{Export, Server, ServerConfig};

/// Size of the writable export `"disk"` (the default export).
pub const DISK_SIZE: u64 = 1 << 20;
/// Size of the read-only export `"ro"`.
pub const RO_SIZE: u64 = 64 << 10;
/// `ServerConfig::max_request` of the session (the largest READ/WRITE accepted).
pub const MAX_REQUEST: u32 = 64 << 10;
/// At most this many reply bytes are returned (the rest is read and dropped).
pub const MAX_REPLY_KEPT: usize = 1 << 20;

/// The server a session talks to: `"disk"` (1 MiB, 512-byte blocks, writable, trim) and
/// `"ro"` (64 KiB, 4096-byte blocks, read-only, with a description); one worker per
/// connection so that a run is deterministic.
pub fn server() -> Server {
    let disk = Export::new("disk", Arc::new(MemDevice::new(DISK_SIZE, 512)));
    let mut ro = Export::new("ro", Arc::new(MemDevice::new(RO_SIZE, 4096)));
    ro.read_only = true;
    ro.description = "read-only fuzz export".into();
    let config =
        ServerConfig { threads_per_connection: 1, max_request: MAX_REQUEST, ..ServerConfig::default() };
    Server::new(vec![disk, ro], config)
}

/// Runs one connection of [`server`] with `input` as the client's bytes; returns the
/// server's bytes (the first [`MAX_REPLY_KEPT`]). Errors only if the socket pair or its
/// threads cannot be set up.
pub fn run_session(input: &[u8]) -> io::Result<Vec<u8>> {
    run_session_with(&server(), input)
}

/// [`run_session`] against any server.
pub fn run_session_with(server: &Server, input: &[u8]) -> io::Result<Vec<u8>> {
    let (server_end, client) = UnixStream::pair()?;
    let client_w = client.try_clone()?;
    let mut client_r = client;
    thread::scope(|s| {
        let writer = thread::Builder::new().spawn_scoped(s, move || {
            // MSG_NOSIGNAL: the server may hang up first (a protocol error), which must
            // not raise SIGPIPE in a process that does not ignore it (a libFuzzer binary).
            let mut rest = input;
            while !rest.is_empty() {
                match send(&client_w, rest, SendFlags::NOSIGNAL) {
                    Ok(0) | Err(_) => break,
                    Ok(n) => rest = &rest[n..],
                }
            }
            let _ = client_w.shutdown(Shutdown::Write);
        })?;
        let reader = thread::Builder::new().spawn_scoped(s, move || {
            let mut kept = Vec::new();
            let mut buf = vec![0u8; 64 << 10];
            loop {
                match client_r.read(&mut buf) {
                    Ok(0) | Err(_) => break,
                    Ok(n) => {
                        let room = MAX_REPLY_KEPT - kept.len();
                        kept.extend_from_slice(&buf[..n.min(room)]);
                    }
                }
            }
            kept
        });
        let reader = match reader {
            Ok(r) => r,
            Err(e) => {
                // Unblock the writer (nobody will read what it sends) and give up.
                let _ = server_end.shutdown(Shutdown::Both);
                drop(server_end);
                let _ = writer.join();
                return Err(e);
            }
        };
        // Returns when the client's bytes run out or the server ends the connection; the
        // socket closes with `server_end`, which ends the reader.
        server.serve_unix_stream(server_end);
        let _ = writer.join();
        reader.join().map_err(|_| io::Error::other("the reply reader panicked"))
    })
}

/// The `nbd_wire` target: every decoder of [`crate::wire`] on `input` (the fixed-size ones
/// on its first bytes), each checked to re-encode to the bytes it decoded. Panics on a
/// mismatch, which is what a fuzz target reports.
pub fn decode_all(input: &[u8]) {
    use crate::wire::{ChunkHeader, InfoRequest, MetaContextRequest, OptionHeader, Request};

    if let Some(b) = input.first_chunk::<{ OptionHeader::SIZE }>() {
        if let Ok(h) = OptionHeader::decode(b) {
            assert_eq!(&h.encode(), b, "OptionHeader does not round-trip");
        }
    }
    if let Some(b) = input.first_chunk::<{ Request::SIZE }>() {
        if let Ok(r) = Request::decode(b) {
            assert_eq!(&r.encode(), b, "Request does not round-trip");
        }
    }
    if let Some(b) = input.first_chunk::<{ ChunkHeader::SIZE }>() {
        if let Some(c) = ChunkHeader::decode(b) {
            assert_eq!(&c.encode(), b, "ChunkHeader does not round-trip");
        }
    }
    // NBD_OPT_GO / NBD_OPT_INFO data: the whole input.
    if let Ok(req) = InfoRequest::decode(input) {
        assert_eq!(req.encode(), input, "InfoRequest does not round-trip");
    }
    // NBD_OPT_LIST_META_CONTEXT / NBD_OPT_SET_META_CONTEXT data: the whole input.
    if let Ok(req) = MetaContextRequest::decode(input) {
        assert_eq!(req.encode(), input, "MetaContextRequest does not round-trip");
    }
}
