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
    let export = Export { name: "disk".into(), description: String::new(), device: dev, read_only };
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
