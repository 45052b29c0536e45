//! The engine end to end over in-process devices: statistics from a device with known
//! latencies (on a manual clock, so no assertion depends on wall time), request accounting,
//! verify catching corruption, and errors stopping the job.

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::Duration;

use bench::clock::ManualClock;
use bench::{run_job, DeviceTarget, JobSpec, RunOptions, RwMode};
use blockdev::{BlockDevice, BlockError, BlockResult, Geometry, MemDevice, WriteFlags};

/// A device whose k-th request takes exactly `pattern(k)` ns of (manual) clock time.
#[derive(Debug)]
struct Timed {
    clock: Arc<ManualClock>,
    ops: AtomicU64,
    size: u64,
    pattern: fn(u64) -> u64,
}

impl BlockDevice for Timed {
    fn geometry(&self) -> Geometry {
        Geometry::new(self.size, 512)
    }
    fn read_at(&self, off: u64, buf: &mut [u8]) -> BlockResult<()> {
        self.geometry().check_range(off, buf.len() as u64)?;
        let k = self.ops.fetch_add(1, Ordering::SeqCst);
        self.clock.advance((self.pattern)(k));
        Ok(())
    }
    fn write_at(&self, off: u64, buf: &[u8], _: WriteFlags) -> BlockResult<()> {
        self.geometry().check_range(off, buf.len() as u64)?;
        let k = self.ops.fetch_add(1, Ordering::SeqCst);
        self.clock.advance((self.pattern)(k));
        Ok(())
    }
    fn flush(&self) -> BlockResult<()> {
        Ok(())
    }
}

fn manual(pattern: fn(u64) -> u64, size: u64) -> (DeviceTarget, RunOptions) {
    let clock = Arc::new(ManualClock::new());
    let dev = Arc::new(Timed { clock: clock.clone(), ops: AtomicU64::new(0), size, pattern });
    (DeviceTarget::new(dev, "timed"), RunOptions { clock, ..RunOptions::default() })
}

/// Within HdrHistogram's 3 significant digits.
fn close(got: u64, want: u64) -> bool {
    got.abs_diff(want) <= want / 1000 + 1
}

#[test]
fn percentiles_and_rates_of_a_known_latency_ladder() {
    // Request k takes ((k % 100) + 1) × 10 µs: 1000 requests, ten of each of 10, 20, ..., 1000 µs.
    let (t, opts) = manual(|k| ((k % 100) + 1) * 10_000, 1000 * 4096);
    let spec = JobSpec::new("ladder", RwMode::RandRead, 4096);
    let r = run_job(&t, &spec, &opts).unwrap();
    let l = &r.read.clat_ns;
    assert_eq!(r.read.total_ios, 1000);
    assert_eq!(r.write.total_ios, 0);
    assert_eq!(r.read.io_bytes, 1000 * 4096);
    assert_eq!((l.min, l.max), (10_000, 1_000_000));
    assert!((l.mean - 505_000.0).abs() < 1e-6, "mean {}", l.mean);
    // p-th percentile of the ladder: the value at rank ceil(p% × 1000), i.e. 10 µs × ceil(p × 10 / 10).
    for &(p, v) in &l.percentiles {
        let rank = ((p / 100.0 * 1000.0).ceil() as u64).max(1);
        let want = rank.div_ceil(10) * 10_000;
        assert!(close(v, want), "p{p}: {v} ns, want {want}");
    }
    // The clock moved only inside requests: the window is their sum, 505 ms.
    assert!((r.runtime_ms - 505.0).abs() < 1e-9, "runtime {}", r.runtime_ms);
    assert!((r.read.iops - 1000.0 / 0.505).abs() < 1e-6);
    assert!((r.read.bw_bytes - 1000.0 * 4096.0 / 0.505).abs() < 1e-3);
}

#[test]
fn time_based_jobs_stop_at_runtime_and_ramp_is_not_counted() {
    // Every request takes 1 ms; ramp 10 ms, runtime 50 ms: 10 unmeasured, then 50 measured.
    let (t, opts) = manual(|_| 1_000_000, 1 << 20);
    let spec = JobSpec::new("timed", RwMode::Write, 4096)
        .timed(Duration::from_millis(50), Duration::from_millis(10));
    let r = run_job(&t, &spec, &opts).unwrap();
    assert_eq!(r.write.total_ios, 50);
    assert!((r.runtime_ms - 50.0).abs() < 1e-9);
    assert!(close(r.write.clat_ns.percentile_at(50.0), 1_000_000));
}

trait At {
    fn percentile_at(&self, p: f64) -> u64;
}
impl At for bench::stats::LatencySummary {
    fn percentile_at(&self, p: f64) -> u64 {
        self.percentiles.iter().find(|(q, _)| *q == p).map(|x| x.1).unwrap()
    }
}

#[test]
fn loops_and_numjobs_multiply_the_requests() {
    let (t, opts) = manual(|_| 1000, 64 * 4096);
    let mut spec = JobSpec::new("multi", RwMode::Read, 4096);
    spec.loops = 3;
    spec.numjobs = 2;
    spec.iodepth = 4;
    let r = run_job(&t, &spec, &opts).unwrap();
    assert_eq!(r.read.total_ios, 64 * 3 * 2);
}

#[test]
fn mixed_jobs_fill_both_directions() {
    let dev = Arc::new(MemDevice::new(4 << 20, 512));
    let t = DeviceTarget::new(dev, "mem");
    let mut spec = JobSpec::new("mix", RwMode::RandRw, 4096);
    spec.rwmixread = 25;
    spec.iodepth = 4;
    spec.loops = 2;
    let r = run_job(&t, &spec, &RunOptions::default()).unwrap();
    assert_eq!(r.read.total_ios + r.write.total_ios, 2 * 1024);
    assert!(r.write.total_ios > r.read.total_ios);
}

#[test]
fn verify_checks_everything_written_on_a_good_device() {
    let dev = Arc::new(MemDevice::new(2 << 20, 512));
    let t = DeviceTarget::new(dev, "mem");
    let mut spec = JobSpec::new("v", RwMode::RandRw, 8192);
    spec.verify = true;
    spec.iodepth = 8;
    spec.numjobs = 2;
    spec.sync = true;
    spec.end_fsync = true;
    let r = run_job(&t, &spec, &RunOptions::default()).unwrap();
    // Read-back alone checks 16 units of 512 bytes per written 8 KiB block.
    assert!(r.verified_units.unwrap() >= 16 * 100, "{:?}", r.verified_units);
}

/// Returns the neighbouring block's data for reads of one block: a misdirected read.
#[derive(Debug)]
struct Misdirect {
    inner: MemDevice,
    victim: u64,
}

impl BlockDevice for Misdirect {
    fn geometry(&self) -> Geometry {
        self.inner.geometry()
    }
    fn read_at(&self, off: u64, buf: &mut [u8]) -> BlockResult<()> {
        if off == self.victim {
            return self.inner.read_at(off + buf.len() as u64, buf);
        }
        self.inner.read_at(off, buf)
    }
    fn write_at(&self, off: u64, buf: &[u8], f: WriteFlags) -> BlockResult<()> {
        self.inner.write_at(off, buf, f)
    }
    fn flush(&self) -> BlockResult<()> {
        Ok(())
    }
}

#[test]
fn verify_catches_a_misdirected_read() {
    let dev = Arc::new(Misdirect { inner: MemDevice::new(64 * 4096, 512), victim: 4096 });
    let t = DeviceTarget::new(dev, "misdirect");
    let mut spec = JobSpec::new("v", RwMode::Write, 4096);
    spec.verify = true;
    let e = run_job(&t, &spec, &RunOptions::default()).unwrap_err();
    let chain = format!("{e}: {}", std::error::Error::source(&e).map(|s| s.to_string()).unwrap_or_default());
    assert!(
        chain.contains("verify failed")
            && chain.contains("offset 4096 holds the data written for offset 8192"),
        "{chain}"
    );
}

/// Fails the 10th request.
#[derive(Debug)]
struct FailsOnce {
    inner: MemDevice,
    n: AtomicU64,
}

impl BlockDevice for FailsOnce {
    fn geometry(&self) -> Geometry {
        self.inner.geometry()
    }
    fn read_at(&self, off: u64, buf: &mut [u8]) -> BlockResult<()> {
        if self.n.fetch_add(1, Ordering::SeqCst) == 9 {
            return Err(BlockError::io("injected", std::io::Error::other("boom")));
        }
        self.inner.read_at(off, buf)
    }
    fn write_at(&self, off: u64, buf: &[u8], f: WriteFlags) -> BlockResult<()> {
        self.inner.write_at(off, buf, f)
    }
    fn flush(&self) -> BlockResult<()> {
        Ok(())
    }
}

#[test]
fn a_failed_request_stops_the_job_with_its_offset() {
    let dev = Arc::new(FailsOnce { inner: MemDevice::new(1 << 20, 512), n: AtomicU64::new(0) });
    let t = DeviceTarget::new(dev, "fails");
    let spec = JobSpec::new("f", RwMode::Read, 4096).depth(4);
    let e = run_job(&t, &spec, &RunOptions::default()).unwrap_err();
    assert!(matches!(e, bench::BenchError::Device { .. }), "{e}");
}

#[test]
fn impossible_jobs_are_refused_before_running() {
    let t = DeviceTarget::new(Arc::new(MemDevice::new(1 << 20, 4096)), "mem");
    for (k, v) in [("bs", "512"), ("offset", "2M"), ("size", "2M"), ("offset", "100")] {
        let mut spec = JobSpec::new("bad", RwMode::Read, 4096);
        spec.set(k, v).unwrap();
        assert!(run_job(&t, &spec, &RunOptions::default()).is_err(), "{k}={v}");
    }
}
