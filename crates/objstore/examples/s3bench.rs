//! Sequential 1M write/read through the object-storage device next to uploading and
//! downloading the same bytes with OpenDAL directly, and 4k random I/O with a warm cache,
//! against a local S3 server this program starts and stops (BENCHMARKS.md, "Object storage").
//!
//! ```text
//! cargo build --profile test -p objstore --example s3bench
//! target/debug/examples/s3bench [MiB] [object sizes, e.g. 1M,4M,16M] [rounds]
//! ```
//!
//! The server is moto's server mode by default (`moto_server`, PyPI `moto[server]`, what the
//! tests use): single-process Python, so on a small machine it sets the pace. With
//! `S3BENCH_SERVER=s3s-fs` the bench runs the Rust `s3s-fs` server instead (objects in files
//! on the tmpfs `/dev/shm`), found on `PATH`, or at the path `S3BENCH_SERVER` names when it
//! ends in `s3s-fs`. Install it once with
//!
//! ```text
//! cargo install --locked s3s-fs@0.14.1 --features binary    # 0.15+ need rustc 1.96
//! ```
//!
//! Nothing else (no test, no CI step) uses s3s-fs. `S3BENCH_PARAMS=concurrency=4` (any
//! locator parameters, `&`-separated; `readahead=128M` gives 16 MiB objects the 8 GETs in
//! flight of before the byte cap) is appended to the device's locator in the sequential runs.

use std::future::IntoFuture;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use blockdev::{BlockDevice, WriteFlags};
use futures::StreamExt;
use objstore::opendal::{services::S3, Operator};
use objstore::parse_size;
use testkit::s3server::{S3Server, ACCESS_KEY, SECRET_KEY};

const CONC: usize = 8;

/// The bench's S3 server, with a bucket `bench`.
enum Server {
    Moto(S3Server),
    /// `s3s-fs` (a child process serving `root`, the objects' directory on tmpfs).
    S3sFs {
        child: Child,
        port: u16,
        _root: tempfile::TempDir,
    },
}

impl Server {
    /// Starts the server `S3BENCH_SERVER` names (moto when unset).
    fn start(dir: &Path) -> Server {
        let which = std::env::var("S3BENCH_SERVER").unwrap_or_default();
        if which.is_empty() || which == "moto" {
            let s = S3Server::start(dir).expect("moto_server (pip install 'moto[server]')");
            s.create_bucket("bench");
            return Server::Moto(s);
        }
        if !which.ends_with("s3s-fs") {
            panic!("S3BENCH_SERVER={which:?}: expected moto, s3s-fs or a path to an s3s-fs binary");
        }
        let root = tempfile::tempdir_in("/dev/shm").or_else(|_| tempfile::tempdir()).expect("tempdir");
        // s3s-fs serves each directory under its root as a bucket.
        std::fs::create_dir(root.path().join("bench")).expect("bucket directory");
        let port = std::net::TcpListener::bind("127.0.0.1:0")
            .and_then(|l| l.local_addr())
            .map(|a| a.port())
            .expect("free port");
        let child = Command::new(PathBuf::from(&which))
            .args(["--host", "127.0.0.1", "--port", &port.to_string()])
            .args(["--access-key", ACCESS_KEY, "--secret-key", SECRET_KEY])
            .arg(root.path())
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(Stdio::inherit())
            .spawn()
            .unwrap_or_else(|e| {
                panic!("starting {which}: {e} (cargo install --locked s3s-fs@0.14.1 --features binary)")
            });
        let t0 = Instant::now();
        while std::net::TcpStream::connect(("127.0.0.1", port)).is_err() {
            assert!(t0.elapsed() < Duration::from_secs(30), "{which} did not come up on port {port}");
            std::thread::sleep(Duration::from_millis(20));
        }
        Server::S3sFs { child, port, _root: root }
    }

    fn name(&self) -> &'static str {
        match self {
            Server::Moto(_) => "moto_server",
            Server::S3sFs { .. } => "s3s-fs (objects on tmpfs)",
        }
    }

    fn endpoint(&self) -> String {
        match self {
            Server::Moto(s) => s.endpoint(),
            Server::S3sFs { port, .. } => format!("http://127.0.0.1:{port}"),
        }
    }

    fn pid(&self) -> Option<u32> {
        match self {
            Server::Moto(s) => s.pid(),
            Server::S3sFs { child, .. } => Some(child.id()),
        }
    }
}

impl Drop for Server {
    fn drop(&mut self) {
        if let Server::S3sFs { child, .. } = self {
            let _ = child.kill();
            let _ = child.wait();
        }
    }
}

/// CPU seconds (user + system, all threads) process `pid` has used: what each side costs,
/// which wall-clock figures on a loaded machine blur.
fn cpu(pid: &str) -> f64 {
    let f = stat(pid);
    (f(11) + f(12)) / 100.0
}

/// Minor page faults of process `pid` so far (fresh memory touched for the first time).
fn faults(pid: &str) -> f64 {
    stat(pid)(7)
}

/// Field `i` (counted from the one after the command's name) of `/proc/PID/stat`.
fn stat(pid: &str) -> impl Fn(usize) -> f64 {
    let s = std::fs::read_to_string(format!("/proc/{pid}/stat")).unwrap_or_default();
    let f: Vec<f64> =
        s.rsplit(')').next().unwrap_or("").split_whitespace().map(|v| v.parse().unwrap_or(0.0)).collect();
    move |i| f.get(i).copied().unwrap_or(0.0)
}

fn mibs(bytes: u64, secs: f64) -> f64 {
    bytes as f64 / (1 << 20) as f64 / secs
}

fn main() {
    let args: Vec<String> = std::env::args().collect();
    let mib: u64 = args.get(1).and_then(|a| a.parse().ok()).unwrap_or(256);
    let sizes: Vec<u64> =
        args.get(2).map(|s| s.split(',').filter_map(parse_size).collect()).unwrap_or_else(|| vec![4 << 20]);
    let rounds: usize = args.get(3).and_then(|a| a.parse().ok()).unwrap_or(2);
    std::env::set_var("AWS_ACCESS_KEY_ID", ACCESS_KEY);
    std::env::set_var("AWS_SECRET_ACCESS_KEY", SECRET_KEY);
    let dir = tempfile::tempdir().expect("tempdir");
    let s = Server::start(dir.path());
    let server = s.pid().map(|p| p.to_string()).unwrap_or_else(|| "self".into());
    // CPU seconds of (server, this process) and this process's page faults since `from`.
    let cpu_since =
        |from: (f64, f64, f64)| (cpu(&server) - from.0, cpu("self") - from.1, faults("self") - from.2);
    let cpu_now = || (cpu(&server), cpu("self"), faults("self"));
    let rt = tokio::runtime::Builder::new_multi_thread().worker_threads(2).enable_all().build().expect("rt");
    objstore::install_transport();
    let op =
        Operator::new(S3::default().bucket("bench").root("/").endpoint(&s.endpoint()).region("us-east-1"))
            .expect("op");
    // More locator parameters for the device's sequential runs (e.g. `concurrency=4`).
    let extra = std::env::var("S3BENCH_PARAMS").map(|p| format!("&{p}")).unwrap_or_default();
    let total = mib << 20;
    let data: Vec<u8> = (0..total).map(|i| (i.wrapping_mul(2654435761) >> 13) as u8).collect();
    println!(
        "server {}, volume {mib} MiB, {CONC} requests in flight, cache 64 MiB (a quarter of the data) for the sequential runs",
        s.name()
    );
    println!("{:>8} {:>5} {:>28} {:>10}", "object", "round", "run", "MiB/s");
    let mut n = 0;
    for &osz in &sizes {
        for round in 0..rounds {
            n += 1;
            // Direct upload: the same bytes, object by object, CONC at once.
            let t = Instant::now();
            rt.block_on(async {
                let results: Vec<_> = futures::stream::iter(0..total.div_ceil(osz))
                    .map(|i| {
                        let op = op.clone();
                        let body = data[(i * osz) as usize..((i + 1) * osz).min(total) as usize].to_vec();
                        async move { op.write(&format!("direct{n}/data/{i:016x}"), body).await }
                    })
                    .buffer_unordered(CONC)
                    .collect()
                    .await;
                results.into_iter().collect::<Result<Vec<_>, _>>().expect("direct upload");
            });
            let direct_up = mibs(total, t.elapsed().as_secs_f64());
            // Through the device: 1M sequential writes, then flush.
            let uri = format!(
                "s3://bench/dev{n}?endpoint={}&size={total}&object_size={osz}&cache=64M{extra}",
                s.endpoint()
            );
            let t = Instant::now();
            {
                let d = objstore::open(&uri, objstore::OpenOptions::default()).expect("open");
                for off in (0..total).step_by(1 << 20) {
                    d.write_at(off, &data[off as usize..(off + (1 << 20)) as usize], WriteFlags::empty())
                        .expect("write");
                }
                d.flush().expect("flush");
            }
            let dev_write = mibs(total, t.elapsed().as_secs_f64());
            // Direct download, CONC at once; with `copy_out`, each object's bytes are also
            // copied 1 MiB at a time into a buffer, as the device's reads deliver them (the
            // plain download only counts them).
            let direct_download = |copy_out: bool| {
                let c = cpu_now();
                let t = Instant::now();
                let got: u64 = rt.block_on(async {
                    futures::stream::iter(0..total.div_ceil(osz))
                        .map(|i| {
                            let op = op.clone();
                            async move {
                                let b = op.read(&format!("direct{n}/data/{i:016x}")).await.expect("get");
                                if copy_out {
                                    let mut out = vec![0u8; 1 << 20];
                                    let mut at = 0;
                                    while at < b.len() {
                                        let k = out.len().min(b.len() - at);
                                        bytes::Buf::copy_to_slice(&mut b.slice(at..at + k), &mut out[..k]);
                                        at += k;
                                    }
                                    std::hint::black_box(&out);
                                }
                                b.len() as u64
                            }
                        })
                        .buffer_unordered(CONC)
                        .fold(0, |a, b| async move { a + b })
                        .await
                });
                assert_eq!(got, total);
                (mibs(total, t.elapsed().as_secs_f64()), cpu_since(c))
            };
            let (direct_down, cpu_direct) = direct_download(false);
            // Through the device, cold cache: 1M sequential reads.
            let read_all = |d: &objstore::ObjectDevice| {
                let mut buf = vec![0u8; 1 << 20];
                for off in (0..total).step_by(1 << 20) {
                    d.read_at(off, &mut buf).expect("read");
                    // A cheap spot check inside the timed loop (the direct download checks
                    // only lengths); the tests check contents.
                    assert_eq!(buf[..64], data[off as usize..off as usize + 64], "at {off}");
                }
            };
            let c = cpu_now();
            let t = Instant::now();
            let d =
                objstore::open(&uri, objstore::OpenOptions { read_only: true, create: false }).expect("open");
            let t_open = t.elapsed().as_secs_f64();
            read_all(&d);
            let t_read = t.elapsed().as_secs_f64() - t_open;
            let cpu_dev = cpu_since(c);
            // A second pass through the same device: the cache (a quarter of the volume) holds
            // the last objects, so every read misses again, but the memory the device
            // downloads into is what its first pass freed, not fresh pages.
            let c = cpu_now();
            let t = Instant::now();
            read_all(&d);
            let t_read2 = t.elapsed().as_secs_f64();
            let cpu_dev2 = cpu_since(c);
            let t = Instant::now();
            drop(d);
            let t_close = t.elapsed().as_secs_f64();
            let t_all = t_open + t_read + t_close;
            let dev_read = mibs(total, t_all);
            let dev_read2 = mibs(total, t_read2);
            // Again after the device's run: the server's speed drifts on a loaded machine, so
            // the read ratio is against the mean of the two.
            let (direct_down_after, cpu_direct_after) = direct_download(false);
            let (direct_copy, cpu_direct_copy) = direct_download(true);
            println!(
                "{:>8} {:>5} {:>28} {:>10}",
                osz >> 20,
                round,
                "read: open / reads / close",
                format!("{:.0} / {:.0} / {:.0} ms", t_open * 1e3, t_read * 1e3, t_close * 1e3)
            );
            println!(
                "{:>8} {:>5} {:>28} {:>10}",
                osz >> 20,
                round,
                "cpu s server/client: d/dev/d/dc",
                format!(
                    "{:.2}/{:.2} {:.2}/{:.2} {:.2}/{:.2} {:.2}/{:.2}",
                    cpu_direct.0,
                    cpu_direct.1,
                    cpu_dev.0,
                    cpu_dev.1,
                    cpu_direct_after.0,
                    cpu_direct_after.1,
                    cpu_direct_copy.0,
                    cpu_direct_copy.1
                )
            );
            println!(
                "{:>8} {:>5} {:>28} {:>10}",
                osz >> 20,
                round,
                "client page faults: d/dev/d/dc",
                format!(
                    "{:.0} {:.0} {:.0} {:.0}",
                    cpu_direct.2, cpu_dev.2, cpu_direct_after.2, cpu_direct_copy.2
                )
            );
            println!(
                "{:>8} {:>5} {:>28} {:>10}",
                osz >> 20,
                round,
                "2nd pass: cpu s srv/cli, faults",
                format!("{:.2}/{:.2} {:.0}", cpu_dev2.0, cpu_dev2.1, cpu_dev2.2)
            );
            for (name, v) in [
                ("direct upload (OpenDAL)", direct_up),
                ("device 1M seq write+flush", dev_write),
                ("direct download (OpenDAL)", direct_down),
                ("device 1M seq read (cold)", dev_read),
                ("direct download again", direct_down_after),
                ("direct download + copy out", direct_copy),
                ("device read, 2nd pass", dev_read2),
            ] {
                println!("{:>8} {:>5} {:>28} {:>10.1}", osz >> 20, round, name, v);
            }
            println!(
                "{:>8} {:>5} {:>28} {:>10}",
                osz >> 20,
                round,
                "ratios write/read/read-dc/2nd",
                format!(
                    "{:.2} / {:.2} / {:.2} / {:.2}",
                    dev_write / direct_up,
                    dev_read / ((direct_down + direct_down_after) / 2.0),
                    dev_read / direct_copy,
                    dev_read2 / ((direct_down + direct_down_after) / 2.0)
                )
            );
            // The round's objects go (untimed): the server's memory or tmpfs stays small.
            for prefix in [format!("direct{n}/"), format!("dev{n}/")] {
                if let Err(e) = rt.block_on(op.delete_with(&prefix).recursive(true).into_future()) {
                    eprintln!("removing {prefix}: {e} (left on the server)");
                }
            }
        }
    }
    // 4k random I/O with a warm cache (the whole volume cached): what the cache costs.
    let osz = sizes[0];
    let uri = format!(
        "s3://bench/rand?endpoint={}&size={total}&object_size={osz}&cache={}",
        s.endpoint(),
        total * 2
    );
    let d = objstore::open(&uri, objstore::OpenOptions::default()).expect("open");
    for off in (0..total).step_by(1 << 20) {
        d.write_at(off, &data[off as usize..(off + (1 << 20)) as usize], WriteFlags::empty()).expect("write");
    }
    d.flush().expect("flush");
    let mut x: u64 = 0x9e3779b97f4a7c15;
    let mut buf = vec![0u8; 4096];
    for (name, write) in [("4k random read, warm", false), ("4k random write, warm", true)] {
        let ops = 200_000u64;
        let t = Instant::now();
        for _ in 0..ops {
            x ^= x << 13;
            x ^= x >> 7;
            x ^= x << 17;
            let off = (x % (total / 4096)) * 4096;
            if write {
                d.write_at(off, &buf, WriteFlags::empty()).expect("write");
            } else {
                d.read_at(off, &mut buf).expect("read");
            }
        }
        let secs = t.elapsed().as_secs_f64();
        println!("{name}: {:.0} IOPS, {:.1} MiB/s (1 thread)", ops as f64 / secs, mibs(ops * 4096, secs));
    }
    let t = Instant::now();
    d.flush().expect("flush");
    println!("flush after the random writes: {:.2} s", t.elapsed().as_secs_f64());
}
