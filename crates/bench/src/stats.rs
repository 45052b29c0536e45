//! Latency and throughput accounting.
//!
//! Every completed request adds its completion latency (submission to completion, fio's
//! `clat`; for this harness the same as `lat`, since submission is the call itself) to a
//! [`LatencyRecorder`]: an HdrHistogram in **nanoseconds** with 3 significant digits (every
//! percentile is within 0.1% of the true sample value) plus exact count, sum, sum of squares,
//! min and max, so mean and standard deviation are exact rather than bucketed. Reports show
//! microseconds, like fio's `clat (usec)`.
//!
//! Each worker thread records into its own recorder; they are merged when the job ends, so
//! the hot path takes no lock.

use hdrhistogram::Histogram;
use serde::Serialize;

/// The percentiles fio reports by default, plus 99.95 and the 1st–90th deciles.
pub const PERCENTILES: [f64; 17] =
    [1.0, 5.0, 10.0, 20.0, 30.0, 40.0, 50.0, 60.0, 70.0, 80.0, 90.0, 95.0, 99.0, 99.5, 99.9, 99.95, 99.99];

/// Highest latency the histogram tracks: one hour. Longer samples are clamped (and counted
/// exactly in max/mean).
const MAX_TRACKED_NS: u64 = 3_600_000_000_000;

/// Latencies of one direction of one job (or one worker).
#[derive(Debug, Clone)]
pub struct LatencyRecorder {
    hist: Histogram<u64>,
    count: u64,
    bytes: u64,
    sum_ns: u128,
    sum_sq_ns: f64,
    min_ns: u64,
    max_ns: u64,
}

impl Default for LatencyRecorder {
    fn default() -> Self {
        Self::new()
    }
}

impl LatencyRecorder {
    /// An empty recorder.
    pub fn new() -> Self {
        LatencyRecorder {
            hist: Histogram::new_with_bounds(1, MAX_TRACKED_NS, 3).expect("valid histogram bounds"),
            count: 0,
            bytes: 0,
            sum_ns: 0,
            sum_sq_ns: 0.0,
            min_ns: u64::MAX,
            max_ns: 0,
        }
    }

    /// Records one request of `bytes` that took `ns` nanoseconds.
    pub fn record(&mut self, ns: u64, bytes: u64) {
        let v = ns.max(1);
        self.hist.saturating_record(v);
        self.count += 1;
        self.bytes += bytes;
        self.sum_ns += u128::from(ns);
        self.sum_sq_ns += (ns as f64) * (ns as f64);
        self.min_ns = self.min_ns.min(ns);
        self.max_ns = self.max_ns.max(ns);
    }

    /// Adds everything `other` recorded.
    pub fn merge(&mut self, other: &LatencyRecorder) {
        if other.count == 0 {
            return;
        }
        self.hist.add(&other.hist).expect("histograms with equal bounds merge");
        self.count += other.count;
        self.bytes += other.bytes;
        self.sum_ns += other.sum_ns;
        self.sum_sq_ns += other.sum_sq_ns;
        self.min_ns = self.min_ns.min(other.min_ns);
        self.max_ns = self.max_ns.max(other.max_ns);
    }

    /// Requests recorded.
    pub fn count(&self) -> u64 {
        self.count
    }

    /// Bytes moved.
    pub fn bytes(&self) -> u64 {
        self.bytes
    }

    /// The latency at percentile `p` (0..=100) in nanoseconds: the highest value equivalent
    /// (within the histogram's precision) to the sample at that rank, as HdrHistogram defines
    /// it. 0 when nothing was recorded.
    pub fn percentile_ns(&self, p: f64) -> u64 {
        if self.count == 0 {
            return 0;
        }
        self.hist.value_at_quantile(p / 100.0)
    }

    /// Summary of the recorded latencies.
    pub fn summary(&self) -> LatencySummary {
        if self.count == 0 {
            return LatencySummary {
                percentiles: PERCENTILES.iter().map(|&p| (p, 0)).collect(),
                ..Default::default()
            };
        }
        let n = self.count as f64;
        let mean = self.sum_ns as f64 / n;
        // Sample standard deviation (n - 1), as fio reports it.
        let var =
            if self.count > 1 { ((self.sum_sq_ns - n * mean * mean) / (n - 1.0)).max(0.0) } else { 0.0 };
        LatencySummary {
            n: self.count,
            min: self.min_ns,
            max: self.max_ns,
            mean,
            stddev: var.sqrt(),
            percentiles: PERCENTILES.iter().map(|&p| (p, self.percentile_ns(p))).collect(),
        }
    }
}

/// Latency statistics in nanoseconds.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct LatencySummary {
    /// Samples.
    pub n: u64,
    /// Smallest sample (exact).
    pub min: u64,
    /// Largest sample (exact).
    pub max: u64,
    /// Mean (exact).
    pub mean: f64,
    /// Sample standard deviation (exact).
    pub stddev: f64,
    /// `(percentile, value)` for each of [`PERCENTILES`], from the histogram.
    pub percentiles: Vec<(f64, u64)>,
}

impl Serialize for LatencySummary {
    /// fio's `clat_ns` object: `min`, `max`, `mean`, `stddev`, `N`, and `percentile` keyed
    /// `"99.900000"`.
    fn serialize<S: serde::Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        use serde::ser::SerializeMap;
        let mut m = s.serialize_map(Some(6))?;
        m.serialize_entry("min", &self.min)?;
        m.serialize_entry("max", &self.max)?;
        m.serialize_entry("mean", &self.mean)?;
        m.serialize_entry("stddev", &self.stddev)?;
        m.serialize_entry("N", &self.n)?;
        let pct: serde_json::Map<String, serde_json::Value> =
            self.percentiles.iter().map(|(p, v)| (format!("{p:.6}"), (*v).into())).collect();
        m.serialize_entry("percentile", &pct)?;
        m.end()
    }
}

/// Results of one direction of a job over its measured window.
#[derive(Debug, Clone, Default, Serialize)]
pub struct DirResult {
    /// Bytes transferred.
    pub io_bytes: u64,
    /// Requests completed.
    pub total_ios: u64,
    /// Requests per second.
    pub iops: f64,
    /// Bytes per second.
    pub bw_bytes: f64,
    /// Completion latency.
    pub clat_ns: LatencySummary,
}

impl DirResult {
    /// Throughput of `rec` over `window_ns` nanoseconds.
    pub fn from_recorder(rec: &LatencyRecorder, window_ns: u64) -> Self {
        let secs = (window_ns as f64 / 1e9).max(1e-9);
        DirResult {
            io_bytes: rec.bytes(),
            total_ios: rec.count(),
            iops: rec.count() as f64 / secs,
            bw_bytes: rec.bytes() as f64 / secs,
            clat_ns: rec.summary(),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Histogram precision: 3 significant digits, i.e. within 1/1000 of the value (plus the
    /// one-unit floor).
    fn within_precision(got: u64, want: u64) -> bool {
        let tol = (want as f64 * 1e-3).ceil() as u64 + 1;
        got.abs_diff(want) <= tol
    }

    #[test]
    fn percentiles_of_a_uniform_ladder_match_their_rank() {
        // 10_000 samples: 1 µs, 2 µs, ..., 10_000 µs. The p-th percentile is p × 100 µs.
        let mut r = LatencyRecorder::new();
        for i in 1..=10_000u64 {
            r.record(i * 1000, 4096);
        }
        for &p in &PERCENTILES {
            let want = ((p / 100.0 * 10_000.0).ceil() as u64).max(1) * 1000;
            let got = r.percentile_ns(p);
            assert!(within_precision(got, want), "p{p}: got {got} ns, want {want} ns");
        }
        let s = r.summary();
        assert_eq!(s.n, 10_000);
        assert_eq!(s.min, 1000);
        assert_eq!(s.max, 10_000_000);
        assert!((s.mean - 5_000_500.0).abs() < 1e-6, "mean {}", s.mean);
        // stddev of 1..=n (sample) = sqrt(n(n+1)/12) µs.
        let sd = ((10_000.0f64 * 10_001.0) / 12.0).sqrt() * 1000.0;
        assert!((s.stddev - sd).abs() / sd < 1e-9, "stddev {} want {sd}", s.stddev);
        assert_eq!(r.bytes(), 10_000 * 4096);
    }

    #[test]
    fn merged_recorders_equal_one_recorder() {
        let mut a = LatencyRecorder::new();
        let mut b = LatencyRecorder::new();
        let mut all = LatencyRecorder::new();
        for i in 0..5000u64 {
            let v = 500 + (i * 7919) % 100_000;
            if i % 3 == 0 {
                a.record(v, 512)
            } else {
                b.record(v, 512)
            }
            all.record(v, 512);
        }
        a.merge(&b);
        assert_eq!(a.summary(), all.summary());
    }

    #[test]
    fn bimodal_latencies_split_at_the_right_percentile() {
        // 90% at 100 µs, 10% at 5 ms: p90 is still 100 µs, p95 and above are 5 ms.
        let mut r = LatencyRecorder::new();
        for i in 0..1000 {
            r.record(if i % 10 == 9 { 5_000_000 } else { 100_000 }, 4096);
        }
        assert!(within_precision(r.percentile_ns(50.0), 100_000));
        assert!(within_precision(r.percentile_ns(90.0), 100_000));
        assert!(within_precision(r.percentile_ns(95.0), 5_000_000));
        assert!(within_precision(r.percentile_ns(99.99), 5_000_000));
        assert!((r.summary().mean - 590_000.0).abs() < 1e-6);
    }

    #[test]
    fn empty_recorder_reports_zeroes() {
        let r = LatencyRecorder::new();
        let s = r.summary();
        assert_eq!(s.n, 0);
        assert_eq!(r.percentile_ns(50.0), 0);
        let d = DirResult::from_recorder(&r, 1_000_000_000);
        assert_eq!(d.iops, 0.0);
    }

    #[test]
    fn throughput_is_per_second_of_the_window() {
        let mut r = LatencyRecorder::new();
        for _ in 0..500 {
            r.record(10_000, 4096);
        }
        let d = DirResult::from_recorder(&r, 2_000_000_000);
        assert_eq!(d.iops, 250.0);
        assert_eq!(d.bw_bytes, 250.0 * 4096.0);
    }

    #[test]
    fn json_shape_is_fios_clat_ns() {
        let mut r = LatencyRecorder::new();
        r.record(2000, 512);
        let v = serde_json::to_value(r.summary()).unwrap();
        assert_eq!(v["N"], 1);
        assert_eq!(v["min"], 2000);
        assert!(v["percentile"]["99.990000"].is_u64());
        assert!(v["percentile"]["1.000000"].is_u64());
    }
}
