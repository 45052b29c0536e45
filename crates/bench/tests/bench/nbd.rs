//! The bench NBD client against sealdisk's own server, in-process, over a Unix socket and
//! over TCP on loopback: handshake, pipelined requests, structured replies, verify, errors.

use std::sync::Arc;

use bench::{run_job, JobSpec, NbdTarget, NbdUri, RunOptions, RwMode, Target};
use blockdev::{BlockDevice, MemDevice};
use nbd::{Export, ListenAddr, Server, ServerConfig};

struct Served {
    uri: String,
    stop: nbd::ShutdownHandle,
    thread: Option<std::thread::JoinHandle<std::io::Result<()>>>,
    _dir: tempfile::TempDir,
}

impl Drop for Served {
    fn drop(&mut self) {
        self.stop.shutdown();
        if let Some(t) = self.thread.take() {
            let _ = t.join();
        }
    }
}

fn serve(dev: Arc<dyn BlockDevice>, read_only: bool, tcp: bool) -> Served {
    let dir = tempfile::tempdir().unwrap();
    let export =
        Export { name: "disk".into(), description: String::new(), device: dev, read_only, rotational: false };
    let server = Server::new(vec![export], ServerConfig::default());
    let addr =
        if tcp { ListenAddr::Tcp("127.0.0.1:0".into()) } else { ListenAddr::Unix(dir.path().join("s")) };
    let bound = server.bind(&addr).unwrap();
    let uri = bound.local_addr().uri("disk");
    let stop = bound.shutdown_handle();
    let thread = Some(std::thread::spawn(move || bound.serve()));
    Served { uri, stop, thread, _dir: dir }
}

#[test]
fn uris_parse_in_both_forms() {
    let u: NbdUri = "nbd+unix:///vol%20a?socket=/tmp/x%2Fy.sock".parse().unwrap();
    assert_eq!(u, NbdUri::Unix { name: "vol a".into(), socket: "/tmp/x/y.sock".into() });
    let t: NbdUri = "nbd://127.0.0.1/bench".parse().unwrap();
    assert_eq!(t, NbdUri::Tcp { addr: "127.0.0.1:10809".into(), name: "bench".into() });
    let t: NbdUri = "nbd://[::1]:4000/".parse().unwrap();
    assert_eq!(t, NbdUri::Tcp { addr: "[::1]:4000".into(), name: String::new() });
    for bad in ["nbd+unix:///x", "nbds://h/x", "file:///x", "nbd:///x"] {
        assert!(bad.parse::<NbdUri>().is_err(), "{bad}");
    }
}

#[test]
fn pipelined_mixed_io_with_verify_over_unix_socket() {
    let s = serve(Arc::new(MemDevice::new(8 << 20, 512)), false, false);
    let t = NbdTarget::connect(&s.uri.parse().unwrap()).unwrap();
    assert_eq!(t.info().size, 8 << 20);
    assert!(t.info().fua);
    let mut spec = JobSpec::new("nbd-mix", RwMode::RandRw, 4096);
    spec.iodepth = 16;
    spec.numjobs = 2;
    spec.verify = true;
    spec.sync = true;
    spec.end_fsync = true;
    let r = run_job(&t, &spec, &RunOptions::default()).unwrap();
    assert_eq!(r.read.total_ios + r.write.total_ios, 2 * 2048);
    assert!(r.verified_units.unwrap() > 0);
    assert!(r.read.clat_ns.min > 0);
}

#[test]
fn large_sequential_requests_over_tcp() {
    let s = serve(Arc::new(MemDevice::new(16 << 20, 4096)), false, true);
    let t = NbdTarget::connect(&s.uri.parse().unwrap()).unwrap();
    assert_eq!(t.info().block, 4096);
    let mut w = JobSpec::new("w", RwMode::Write, 1 << 20);
    w.iodepth = 4;
    w.verify = true;
    let r = run_job(&t, &w, &RunOptions::default()).unwrap();
    assert_eq!(r.write.total_ios, 16);
    let rd = run_job(&t, &JobSpec::new("r", RwMode::Read, 1 << 20).depth(4), &RunOptions::default()).unwrap();
    assert_eq!(rd.read.io_bytes, 16 << 20);
}

#[test]
fn server_errors_and_unknown_exports_are_reported() {
    let s = serve(Arc::new(MemDevice::new(1 << 20, 512)), true, false);
    let uri: NbdUri = s.uri.parse().unwrap();
    let t = NbdTarget::connect(&uri).unwrap();
    let e = run_job(&t, &JobSpec::new("w", RwMode::Write, 4096), &RunOptions::default()).unwrap_err();
    assert!(e.to_string().contains("read-only"), "{e}");
    let missing = match uri {
        NbdUri::Unix { socket, .. } => NbdUri::Unix { name: "nope".into(), socket },
        other => other,
    };
    let e = NbdTarget::connect(&missing).unwrap_err();
    assert!(e.to_string().contains("no such export"), "{e}");
}

/// A minimal NBD server that answers READs with several structured chunks out of order
/// (data pieces in reverse, holes for never-written ranges, then a final NONE), answers
/// writes with simple replies, and sends everything in 5-byte pieces: the client must
/// reassemble replies from any fragmentation and place each chunk where it belongs.
type Disk = (Vec<u8>, Vec<bool>);

fn chunky_server(listener: &std::os::unix::net::UnixListener, disk: &mut Disk) {
    use nbd::wire::{self, cmd, reply, ChunkHeader, OptionHeader, Request};
    use std::io::{Read, Write};
    let (mut s, _) = listener.accept().unwrap();
    let size = disk.0.len() as u64;
    let (mem, written) = (&mut disk.0, &mut disk.1);
    let send = |s: &mut std::os::unix::net::UnixStream, b: &[u8]| {
        for piece in b.chunks(5) {
            // The client may have gone (end of a job): stop quietly.
            let _ = s.write_all(piece);
        }
    };
    send(&mut s, &wire::encode_greeting(1));
    let mut f = [0u8; 4];
    s.read_exact(&mut f).unwrap();
    loop {
        let mut h = [0u8; 16];
        s.read_exact(&mut h).unwrap();
        let o = OptionHeader::decode(&h).unwrap();
        let mut data = vec![0u8; o.length as usize];
        s.read_exact(&mut data).unwrap();
        let mut out = Vec::new();
        if o.option == wire::opt::GO {
            wire::encode_option_reply(
                &mut out,
                o.option,
                wire::rep::INFO,
                &wire::encode_info_export(size, 1 | 8),
            );
            wire::encode_option_reply(&mut out, o.option, wire::rep::ACK, &[]);
            send(&mut s, &out);
            break;
        }
        wire::encode_option_reply(&mut out, o.option, wire::rep::ACK, &[]);
        send(&mut s, &out);
    }
    loop {
        let mut h = [0u8; 28];
        if s.read_exact(&mut h).is_err() {
            return;
        }
        let r = Request::decode(&h).unwrap();
        let (off, len) = (r.offset as usize, r.length as usize);
        match r.typ {
            cmd::WRITE => {
                s.read_exact(&mut mem[off..off + len]).unwrap();
                written[off / 512..(off + len) / 512].iter_mut().for_each(|w| *w = true);
                send(&mut s, &wire::encode_simple_reply(r.cookie, 0));
            }
            cmd::READ => {
                let mut out = Vec::new();
                // 512-byte pieces, last first; unwritten ones as holes.
                for at in (off..off + len).step_by(512).rev() {
                    if written[at / 512] {
                        let ch = ChunkHeader {
                            flags: 0,
                            typ: reply::TYPE_OFFSET_DATA,
                            cookie: r.cookie,
                            length: 8 + 512,
                        };
                        out.extend_from_slice(&ch.encode());
                        out.extend_from_slice(&(at as u64).to_be_bytes());
                        out.extend_from_slice(&mem[at..at + 512]);
                    } else {
                        let ch = ChunkHeader {
                            flags: 0,
                            typ: reply::TYPE_OFFSET_HOLE,
                            cookie: r.cookie,
                            length: 12,
                        };
                        out.extend_from_slice(&ch.encode());
                        out.extend_from_slice(&(at as u64).to_be_bytes());
                        out.extend_from_slice(&512u32.to_be_bytes());
                    }
                }
                out.extend_from_slice(&wire::encode_none_chunk(r.cookie));
                send(&mut s, &out);
            }
            cmd::FLUSH => send(&mut s, &wire::encode_simple_reply(r.cookie, 0)),
            _ => return,
        }
    }
}

#[test]
fn fragmented_multi_chunk_replies_are_reassembled_in_place() {
    let dir = tempfile::tempdir().unwrap();
    let sock = dir.path().join("chunky");
    let size: u64 = 256 << 10;
    let uri: NbdUri = format!("nbd+unix:///x?socket={}", sock.display()).parse().unwrap();
    let listener = std::os::unix::net::UnixListener::bind(&sock).unwrap();
    let server = std::thread::spawn(move || {
        // Connections: the probe, the write job, its verify read-back, the read job. The
        // disk outlives them.
        let mut disk: Disk = (vec![0u8; size as usize], vec![false; (size / 512) as usize]);
        for _ in 0..4 {
            chunky_server(&listener, &mut disk);
        }
    });
    let t = NbdTarget::connect(&uri).unwrap();
    // Writes with verify headers; the read-back after the job checks that every
    // 512-byte chunk (sent last first) landed where its offset says.
    let mut w = JobSpec::new("w", RwMode::RandWrite, 16 << 10);
    w.size = Some(128 << 10);
    w.iodepth = 4;
    w.verify = true;
    w.end_fsync = true;
    let r = run_job(&t, &w, &RunOptions::default()).unwrap();
    assert!(r.verified_units.unwrap() > 0);
    // Reads of everything: written blocks as data chunks, the rest as holes.
    let rd =
        run_job(&t, &JobSpec::new("r", RwMode::Read, 16 << 10).depth(3), &RunOptions::default()).unwrap();
    assert_eq!(rd.read.io_bytes, size);
    server.join().unwrap();
}
