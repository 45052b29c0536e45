//! Reports: fio-shaped text per job, and one JSON document per run.
//!
//! The JSON follows `schemas/bench-report.schema.json` (checked in this crate's tests). Its
//! job objects use fio's key names where fio has one (`jobname`, `read.io_bytes`,
//! `read.bw_bytes`, `read.iops`, `read.clat_ns.percentile."99.000000"`, `usr_cpu`,
//! `sys_cpu`, `ctx`), so scripts written for `fio --output-format=json` read it too.

use std::fmt::Write as _;

use serde::Serialize;

use crate::compare::ComparisonResult;
use crate::engine::JobResult;
use crate::stats::{DirResult, LatencySummary};

/// The schema identifier in every report.
pub const SCHEMA_ID: &str = "sealdisk-bench-report/1";

/// The machine a report was made on.
#[derive(Debug, Clone, Serialize)]
pub struct Machine {
    /// Online CPUs.
    pub nproc: usize,
    /// CPU model name.
    pub cpu: String,
    /// `uname -srm`-like kernel string.
    pub kernel: String,
    /// 1-minute load average at the start.
    pub loadavg: Option<f64>,
}

impl Machine {
    /// Looks at /proc.
    pub fn probe() -> Self {
        let cpu = std::fs::read_to_string("/proc/cpuinfo")
            .ok()
            .and_then(|s| {
                s.lines()
                    .find(|l| l.starts_with("model name"))
                    .and_then(|l| l.split_once(':'))
                    .map(|(_, v)| v.trim().to_string())
            })
            .unwrap_or_default();
        let kernel = std::fs::read_to_string("/proc/sys/kernel/osrelease")
            .map(|s| format!("Linux {}", s.trim()))
            .unwrap_or_default();
        let loadavg = std::fs::read_to_string("/proc/loadavg")
            .ok()
            .and_then(|s| s.split_whitespace().next()?.parse().ok());
        Machine {
            nproc: std::thread::available_parallelism().map(|n| n.get()).unwrap_or(1),
            cpu,
            kernel,
            loadavg,
        }
    }
}

/// One run's report.
#[derive(Debug, Clone, Serialize)]
pub struct Report {
    /// [`SCHEMA_ID`].
    pub schema: &'static str,
    /// The sealdisk version.
    pub sealdisk_version: &'static str,
    /// `git describe --always --dirty` of the source tree, when it can be found.
    pub git: Option<String>,
    /// The commit (`git rev-parse HEAD`), when it can be found.
    pub commit: Option<String>,
    /// Seconds since the Unix epoch at the start.
    pub time_unix: u64,
    /// The command line.
    pub command: String,
    /// The machine.
    pub machine: Machine,
    /// Every job run, in order (for a comparison, every repetition of every cell).
    pub jobs: Vec<ReportJob>,
    /// Comparisons (compare mode, presets, the suite).
    pub comparisons: Vec<ComparisonResult>,
    /// In-memory primitive throughput (`sealdisk benchmark`).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub micro: Option<crate::micro::MicroReport>,
}

/// A job in the report, with the variant it belongs to (comparisons).
#[derive(Debug, Clone, Serialize)]
pub struct ReportJob {
    /// Variant name, for comparison runs.
    pub variant: Option<String>,
    /// Repetition index, for comparison runs.
    pub repetition: Option<u32>,
    /// The result.
    #[serde(flatten)]
    pub result: JobResult,
}

impl Report {
    /// An empty report stamped now.
    pub fn new(command: String) -> Self {
        let time_unix = std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .map(|d| d.as_secs())
            .unwrap_or(0);
        Report {
            schema: SCHEMA_ID,
            sealdisk_version: env!("CARGO_PKG_VERSION"),
            git: git(&["describe", "--always", "--dirty", "--tags"]),
            commit: git(&["rev-parse", "HEAD"]),
            time_unix,
            command,
            machine: Machine::probe(),
            jobs: Vec::new(),
            comparisons: Vec::new(),
            micro: None,
        }
    }

    /// Pretty JSON.
    pub fn to_json(&self) -> String {
        serde_json::to_string_pretty(self).expect("reports serialize")
    }
}

/// A `git` query about the tree this crate was built from, if it is still there.
fn git(args: &[&str]) -> Option<String> {
    let dir = env!("CARGO_MANIFEST_DIR");
    let out = std::process::Command::new("git")
        .arg("-C")
        .arg(dir)
        .args(args)
        .stderr(std::process::Stdio::null())
        .output()
        .ok()?;
    out.status
        .success()
        .then(|| String::from_utf8_lossy(&out.stdout).trim().to_string())
        .filter(|s| !s.is_empty())
}

/// `48.0MiB/s`: binary units as fio prints first.
pub fn fmt_bw(bytes_per_s: f64) -> String {
    format!("{}/s", fmt_bytes(bytes_per_s))
}

/// `480MiB`, `3.5GiB`, `512KiB`, `100B`.
pub fn fmt_bytes(b: f64) -> String {
    const UNITS: [&str; 5] = ["B", "KiB", "MiB", "GiB", "TiB"];
    let mut v = b;
    let mut i = 0;
    while v >= 1024.0 && i < UNITS.len() - 1 {
        v /= 1024.0;
        i += 1;
    }
    if i == 0 || v >= 100.0 {
        format!("{v:.0}{}", UNITS[i])
    } else {
        format!("{v:.1}{}", UNITS[i])
    }
}

/// `12.3k`, `950`, `1.2M` (decimal, as fio's IOPS).
pub fn fmt_count(n: f64) -> String {
    if n >= 1e6 {
        format!("{:.1}M", n / 1e6)
    } else if n >= 1e4 {
        format!("{:.1}k", n / 1e3)
    } else if n >= 1e3 {
        format!("{:.2}k", n / 1e3)
    } else {
        format!("{n:.0}")
    }
}

/// Latency in µs with a precision that suits its size: `3.42`, `81.2`, `1234`.
pub fn fmt_us(ns: f64) -> String {
    let us = ns / 1e3;
    if us < 10.0 {
        format!("{us:.2}")
    } else if us < 100.0 {
        format!("{us:.1}")
    } else {
        format!("{us:.0}")
    }
}

fn dir_text(out: &mut String, name: &str, d: &DirResult, runtime_ms: f64) {
    if d.total_ios == 0 {
        return;
    }
    let _ = writeln!(
        out,
        "  {name}: IOPS={}, BW={} ({:.1}MB/s)({}/{:.0}msec)",
        fmt_count(d.iops),
        fmt_bw(d.bw_bytes),
        d.bw_bytes / 1e6,
        fmt_bytes(d.io_bytes as f64),
        runtime_ms
    );
    lat_text(out, &d.clat_ns);
}

fn lat_text(out: &mut String, l: &LatencySummary) {
    // fio's choice of unit, by the median: nsec for very fast, usec usually, msec for slow.
    let p50 = l.percentiles.iter().find(|(p, _)| *p == 50.0).map(|x| x.1).unwrap_or(l.max);
    let (unit, div) = if p50 < 10_000 {
        ("nsec", 1.0)
    } else if p50 >= 10_000_000 {
        ("msec", 1e6)
    } else {
        ("usec", 1e3)
    };
    let _ = writeln!(
        out,
        "    clat ({unit}): min={:.0}, max={:.0}, avg={:.2}, stdev={:.2}",
        l.min as f64 / div,
        l.max as f64 / div,
        l.mean / div,
        l.stddev / div
    );
    let _ = writeln!(out, "    clat percentiles ({unit}):");
    let cells: Vec<String> = l
        .percentiles
        .iter()
        .map(|(p, v)| format!("{:>5}th=[{:>6}]", format!("{p:.2}"), format!("{:.0}", *v as f64 / div)))
        .collect();
    for row in cells.chunks(4) {
        let _ = writeln!(out, "     | {}", row.join(", "));
    }
}

/// fio-shaped text for one job.
pub fn job_text(r: &JobResult, variant: Option<&str>) -> String {
    let mut out = String::new();
    let name = match variant {
        Some(v) => format!("{} [{v}]", r.jobname),
        None => r.jobname.clone(),
    };
    let _ = writeln!(out, "{name}: (jobs={}): {}", r.options.numjobs, r.options.describe());
    let _ = writeln!(out, "  target: {}", r.target);
    dir_text(&mut out, "read", &r.read, r.runtime_ms);
    dir_text(&mut out, "write", &r.write, r.runtime_ms);
    let _ = writeln!(
        out,
        "  cpu          : usr={:.2}%, sys={:.2}%, ctx={}",
        r.cpu.usr_cpu, r.cpu.sys_cpu, r.cpu.ctx
    );
    if let Some(v) = r.verified_units {
        let _ = writeln!(out, "  verify       : {v} units checked, 0 errors");
    }
    out
}

/// fio's closing "Run status" lines for one job.
pub fn run_status(r: &JobResult) -> String {
    let mut out = String::new();
    for (name, d) in [("READ", &r.read), ("WRITE", &r.write)] {
        if d.total_ios > 0 {
            let _ = writeln!(
                out,
                "  {name}: bw={} ({:.1}MB/s), io={} ({:.1}MB), run={:.0}msec",
                fmt_bw(d.bw_bytes),
                d.bw_bytes / 1e6,
                fmt_bytes(d.io_bytes as f64),
                d.io_bytes as f64 / 1e6,
                r.runtime_ms
            );
        }
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn units_format_like_fio() {
        assert_eq!(fmt_bw(48.0 * 1048576.0), "48.0MiB/s");
        assert_eq!(fmt_bw(500.0 * 1048576.0), "500MiB/s");
        assert_eq!(fmt_bytes(4096.0), "4.0KiB");
        assert_eq!(fmt_count(12_345.0), "12.3k");
        assert_eq!(fmt_count(1943.0), "1.94k");
        assert_eq!(fmt_count(950.0), "950");
        assert_eq!(fmt_us(3420.0), "3.42");
        assert_eq!(fmt_us(81_234.0), "81.2");
    }
}
