//! A/B comparisons: two or more stack variants on the same workloads.
//!
//! ```text
//!   for rep in 1..=R:                 repetitions interleaved, so drift (a neighbour's
//!     for point in points:            build, thermal, page-cache state) hits every
//!       for variant in variants:      variant alike: A B A B ..., never A A B B
//!         run the point's jobs
//!   cell (point × variant): median of the R samples, with min–max and IQR
//!   change % = median bandwidth vs the first variant's, per direction
//! ```
//!
//! A point is one or more jobs whose READ and WRITE columns are read together: a mixed job
//! fills both, a `dd`-like pair (sequential write, then sequential read) fills one each.
//! Every variant gets its own temporary volume, built and preconditioned before the first
//! measurement (or an NBD URI given with `target=`).

use std::fmt::Write as _;
use std::path::PathBuf;

use serde::Serialize;

use crate::engine::{run_job, JobResult, RunOptions};
use crate::report::{fmt_bw, fmt_count, fmt_us, ReportJob};
use crate::spec::JobSpec;
use crate::stack::{BuiltStack, StackSpec};
use crate::target::{DeviceTarget, NbdTarget, NbdUri, Target};
use crate::BenchError;

/// One side of a comparison.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Variant {
    /// Name in tables.
    pub name: String,
    /// The stack to build (ignored with `target`).
    pub stack: StackSpec,
    /// Run against this NBD export instead of building a stack.
    pub target: Option<NbdUri>,
    /// Job options this variant changes (`iodepth=32`), applied to every job.
    pub job_overrides: Vec<(String, String)>,
}

impl Variant {
    /// A variant on a stack.
    pub fn new(name: impl Into<String>, stack: StackSpec) -> Self {
        Variant { name: name.into(), stack, target: None, job_overrides: Vec::new() }
    }

    /// With a job option changed.
    pub fn with_job(mut self, key: &str, value: &str) -> Self {
        self.job_overrides.push((key.into(), value.into()));
        self
    }

    /// Parses `NAME:OPTIONS`. OPTIONS are `key=value` words separated by spaces or commas,
    /// with or without a leading `--` (`pool:--crypt-mode=pool --sector-size=512` or
    /// `pool:crypt-mode=pool,sector-size=512`); a bare word is `word=1`. Stack options apply
    /// to a copy of `base`; `target=URI` runs against an NBD export; job options (`iodepth`,
    /// `bs`, `numjobs`, ...) override the workload for this variant.
    pub fn parse(s: &str, base: &StackSpec) -> Result<Self, BenchError> {
        let (name, opts) = s.split_once(':').unwrap_or((s, ""));
        if name.is_empty() {
            return Err(BenchError::usage(format!("--variant {s:?}: expected NAME:OPTIONS")));
        }
        let mut v = Variant::new(name, base.clone());
        for word in opts.split(|c: char| c.is_whitespace() || c == ',').filter(|w| !w.is_empty()) {
            let word = word.trim_start_matches("--");
            let (k, val) = word.split_once('=').unwrap_or((word, "1"));
            if k == "target" {
                v.target = Some(val.parse()?);
            } else if !v.stack.set(k, val)? {
                let mut probe = JobSpec::default();
                if !probe.set(k, val)? {
                    return Err(BenchError::usage(format!("--variant {name}: unknown option {k:?}")));
                }
                v.job_overrides.push((k.to_string(), val.to_string()));
            }
        }
        Ok(v)
    }

    /// What this variant runs on.
    pub fn describe(&self) -> String {
        match &self.target {
            Some(uri) => format!("nbd {uri}"),
            None => self.stack.describe(),
        }
    }
}

/// One row group of the table: a label (`4k`, `QD32`) and the jobs that fill it.
#[derive(Debug, Clone)]
pub struct Point {
    /// Row label.
    pub label: String,
    /// Jobs run for this point, in order, for every variant.
    pub jobs: Vec<JobSpec>,
}

impl Point {
    /// A point of one job.
    pub fn one(label: impl Into<String>, job: JobSpec) -> Self {
        Point { label: label.into(), jobs: vec![job] }
    }
}

/// A comparison to run.
#[derive(Debug, Clone)]
pub struct Comparison {
    /// Title.
    pub title: String,
    /// The knob the variants turn, in words.
    pub knob: String,
    /// The seed experiment this reproduces, if any.
    pub seed: Option<String>,
    /// Anything the reader must know (scaling, caveats).
    pub note: Option<String>,
    /// Two or more variants; the first is the baseline of the change column.
    pub variants: Vec<Variant>,
    /// The points (rows).
    pub points: Vec<Point>,
    /// Repetitions per cell.
    pub repetitions: u32,
    /// Volume size for built stacks.
    pub volume_size: u64,
}

/// Where and how to run comparisons.
#[derive(Debug, Clone)]
pub struct CompareEnv {
    /// Directory for temporary volumes.
    pub dir: PathBuf,
    /// Clock and progress.
    pub run: RunOptions,
    /// Print a one-line note per job on stderr.
    pub chatty: bool,
}

/// Median and spread of one metric over the repetitions.
#[derive(Debug, Clone, Serialize, PartialEq)]
pub struct Spread {
    /// Median.
    pub median: f64,
    /// Smallest sample.
    pub min: f64,
    /// Largest sample.
    pub max: f64,
    /// First quartile.
    pub q1: f64,
    /// Third quartile.
    pub q3: f64,
    /// Every sample, in repetition order.
    pub samples: Vec<f64>,
}

impl Spread {
    /// Of `samples` (non-empty). Quartiles by linear interpolation between order statistics.
    pub fn of(samples: &[f64]) -> Self {
        let mut s = samples.to_vec();
        s.sort_by(|a, b| a.total_cmp(b));
        let q = |p: f64| -> f64 {
            if s.is_empty() {
                return 0.0;
            }
            let pos = p * (s.len() - 1) as f64;
            let lo = pos.floor() as usize;
            let hi = pos.ceil() as usize;
            s[lo] + (s[hi] - s[lo]) * (pos - lo as f64)
        };
        Spread {
            median: q(0.5),
            min: s.first().copied().unwrap_or(0.0),
            max: s.last().copied().unwrap_or(0.0),
            q1: q(0.25),
            q3: q(0.75),
            samples: samples.to_vec(),
        }
    }

    /// Half the min–max range as a percentage of the median.
    pub fn half_range_pct(&self) -> f64 {
        if self.median == 0.0 {
            0.0
        } else {
            (self.max - self.min) / 2.0 / self.median * 100.0
        }
    }
}

/// One direction of one cell.
#[derive(Debug, Clone, Serialize, PartialEq)]
pub struct CellDir {
    /// Bytes per second.
    pub bw_bytes: Spread,
    /// Requests per second.
    pub iops: Spread,
    /// Mean completion latency, ns.
    pub lat_mean_ns: Spread,
    /// Median bandwidth vs the first variant's, in % (`None` for the first variant).
    pub change_pct: Option<f64>,
}

/// One cell: a variant at a point.
#[derive(Debug, Clone, Serialize)]
pub struct Cell {
    /// Variant name.
    pub variant: String,
    /// Reads, if the point reads.
    pub read: Option<CellDir>,
    /// Writes, if the point writes.
    pub write: Option<CellDir>,
}

/// One point's results.
#[derive(Debug, Clone, Serialize)]
pub struct PointResult {
    /// Label.
    pub label: String,
    /// The jobs, in fio's words.
    pub jobs: Vec<String>,
    /// One cell per variant, in variant order.
    pub cells: Vec<Cell>,
}

/// A variant as reported.
#[derive(Debug, Clone, Serialize)]
pub struct VariantInfo {
    /// Name.
    pub name: String,
    /// What it ran on.
    pub stack: String,
    /// Job options it changed.
    pub job_overrides: Vec<String>,
}

/// A finished comparison.
#[derive(Debug, Clone, Serialize)]
pub struct ComparisonResult {
    /// Title.
    pub title: String,
    /// The knob.
    pub knob: String,
    /// Seed reproduced.
    pub seed: Option<String>,
    /// Note.
    pub note: Option<String>,
    /// Repetitions per cell.
    pub repetitions: u32,
    /// Variants, baseline first.
    pub variants: Vec<VariantInfo>,
    /// Points.
    pub points: Vec<PointResult>,
}

/// One repetition's sample of one direction: (bw, iops, mean latency ns).
type Sample = (f64, f64, f64);
/// One repetition of one cell: (read, write).
type CellSample = (Option<Sample>, Option<Sample>);
/// samples[point][variant][repetition].
type Samples = Vec<Vec<Vec<CellSample>>>;

fn merge_dir(results: &[JobResult], read: bool) -> Option<Sample> {
    let dirs: Vec<_> =
        results.iter().map(|r| if read { &r.read } else { &r.write }).filter(|d| d.total_ios > 0).collect();
    if dirs.is_empty() {
        return None;
    }
    let bw = dirs.iter().map(|d| d.bw_bytes).sum();
    let iops = dirs.iter().map(|d| d.iops).sum();
    let n: u64 = dirs.iter().map(|d| d.total_ios).sum();
    let lat = dirs.iter().map(|d| d.clat_ns.mean * d.total_ios as f64).sum::<f64>() / n as f64;
    Some((bw, iops, lat))
}

enum Built {
    /// The volume lives (and is deleted) with the target.
    Stack {
        volume: Box<BuiltStack>,
        target: DeviceTarget,
    },
    Nbd(NbdTarget),
}

impl Built {
    fn target(&self) -> &dyn Target {
        match self {
            Built::Stack { target, .. } => target,
            Built::Nbd(t) => t,
        }
    }

    /// Closes and reopens a built stack (`reopen=1`: cold caches for every job).
    fn reopen(&mut self) -> Result<(), BenchError> {
        if let Built::Stack { volume, target } = self {
            // The target holds a reference to the device: release it before the reopen.
            *target = DeviceTarget::new(std::sync::Arc::new(blockdev::MemDevice::new(0, 512)), "");
            volume.reopen()?;
            *target = DeviceTarget::new(volume.device.clone(), volume.description.clone());
        }
        Ok(())
    }
}

/// Applies a variant's job overrides to `job`.
pub fn job_for(variant: &Variant, job: &JobSpec) -> Result<JobSpec, BenchError> {
    let mut j = job.clone();
    for (k, v) in &variant.job_overrides {
        j.set(k, v)?;
    }
    j.validate()?;
    Ok(j)
}

/// Checks a comparison before anything runs: at least two variants, every stack buildable,
/// every job valid.
pub fn check(c: &Comparison) -> Result<(), BenchError> {
    if c.variants.len() < 2 {
        return Err(BenchError::usage(format!("{}: a comparison needs at least two variants", c.title)));
    }
    if c.points.is_empty() || c.repetitions == 0 {
        return Err(BenchError::usage(format!("{}: nothing to run", c.title)));
    }
    for v in &c.variants {
        if v.target.is_none() {
            v.stack.check().map_err(|e| match e {
                BenchError::NotImplemented(m) => {
                    BenchError::NotImplemented(format!("variant {}: {m}", v.name))
                }
                e => e,
            })?;
        }
        for p in &c.points {
            for j in &p.jobs {
                job_for(v, j)?;
            }
        }
    }
    Ok(())
}

/// Runs a comparison; `on_job` sees every job result as it completes (for the report).
pub fn run_comparison(
    c: &Comparison,
    env: &CompareEnv,
    on_job: &mut dyn FnMut(ReportJob),
) -> Result<ComparisonResult, BenchError> {
    check(c)?;
    let mut built: Vec<Built> = Vec::new();
    for v in &c.variants {
        built.push(match &v.target {
            Some(uri) => Built::Nbd(NbdTarget::connect(uri)?),
            None => {
                if env.chatty {
                    eprintln!(
                        "bench: preparing {} ({}) in {}",
                        v.name,
                        v.stack.describe(),
                        env.dir.display()
                    );
                }
                let b = v.stack.build(&env.dir, c.volume_size)?;
                b.precondition()?;
                let t = DeviceTarget::new(b.device.clone(), b.description.clone());
                Built::Stack { volume: Box::new(b), target: t }
            }
        });
    }
    let mut samples: Samples = vec![vec![Vec::new(); c.variants.len()]; c.points.len()];
    for rep in 0..c.repetitions {
        for (pi, p) in c.points.iter().enumerate() {
            for (vi, v) in c.variants.iter().enumerate() {
                let mut results = Vec::new();
                for j in &p.jobs {
                    let job = job_for(v, j)?;
                    if v.target.is_none() && v.stack.reopen {
                        built[vi].reopen()?;
                    }
                    let mut run = env.run.clone();
                    // The progress line adds the job's name after this label.
                    run.label = format!("[{}/{}] {}", rep + 1, c.repetitions, v.name);
                    if p.label != job.name {
                        run.label = format!("{} {}", run.label, p.label);
                    }
                    let r = run_job(built[vi].target(), &job, &run)?;
                    if env.chatty {
                        eprintln!(
                            "bench: rep {}/{} {:<10} {:<28} {}",
                            rep + 1,
                            c.repetitions,
                            v.name,
                            job_title(&p.label, &job.name),
                            one_line(&r)
                        );
                    }
                    on_job(ReportJob {
                        variant: Some(v.name.clone()),
                        repetition: Some(rep + 1),
                        result: r.clone(),
                    });
                    results.push(r);
                }
                samples[pi][vi].push((merge_dir(&results, true), merge_dir(&results, false)));
            }
        }
    }
    drop(built);
    Ok(summarize(c, &samples))
}

/// A job's name within its point: the name alone when the point is named after its only
/// job (the quick suite's), else `point job`.
fn job_title(point: &str, job: &str) -> String {
    if point == job {
        job.to_owned()
    } else {
        format!("{point} {job}")
    }
}

/// A short summary of one job: the figures that matter for its shape.
pub fn one_line(r: &JobResult) -> String {
    let mut parts = Vec::new();
    for (n, d) in [("read", &r.read), ("write", &r.write)] {
        if d.total_ios > 0 {
            parts.push(format!(
                "{n} {} {} IOPS {}us",
                fmt_bw(d.bw_bytes),
                fmt_count(d.iops),
                fmt_us(d.clat_ns.mean)
            ));
        }
    }
    parts.join(", ")
}

fn summarize(c: &Comparison, samples: &[Vec<Vec<CellSample>>]) -> ComparisonResult {
    let dir_cell = |s: &[Option<Sample>], base: Option<f64>| -> Option<CellDir> {
        let v: Vec<Sample> = s.iter().flatten().copied().collect();
        if v.is_empty() {
            return None;
        }
        let bw = Spread::of(&v.iter().map(|x| x.0).collect::<Vec<_>>());
        let change_pct = base.filter(|b| *b > 0.0).map(|b| (bw.median / b - 1.0) * 100.0);
        Some(CellDir {
            iops: Spread::of(&v.iter().map(|x| x.1).collect::<Vec<_>>()),
            lat_mean_ns: Spread::of(&v.iter().map(|x| x.2).collect::<Vec<_>>()),
            bw_bytes: bw,
            change_pct,
        })
    };
    let points = c
        .points
        .iter()
        .enumerate()
        .map(|(pi, p)| {
            let mut base: (Option<f64>, Option<f64>) = (None, None);
            let cells = c
                .variants
                .iter()
                .enumerate()
                .map(|(vi, v)| {
                    let reads: Vec<_> = samples[pi][vi].iter().map(|x| x.0).collect();
                    let writes: Vec<_> = samples[pi][vi].iter().map(|x| x.1).collect();
                    let (br, bw) = if vi == 0 { (None, None) } else { base };
                    let read = dir_cell(&reads, br);
                    let write = dir_cell(&writes, bw);
                    if vi == 0 {
                        base = (
                            read.as_ref().map(|d| d.bw_bytes.median),
                            write.as_ref().map(|d| d.bw_bytes.median),
                        );
                    }
                    Cell { variant: v.name.clone(), read, write }
                })
                .collect();
            PointResult {
                label: p.label.clone(),
                jobs: p.jobs.iter().map(|j| format!("{}: {}", j.name, j.describe())).collect(),
                cells,
            }
        })
        .collect();
    ComparisonResult {
        title: c.title.clone(),
        knob: c.knob.clone(),
        seed: c.seed.clone(),
        note: c.note.clone(),
        repetitions: c.repetitions,
        variants: c
            .variants
            .iter()
            .map(|v| VariantInfo {
                name: v.name.clone(),
                stack: v.describe(),
                job_overrides: v.job_overrides.iter().map(|(k, v)| format!("{k}={v}")).collect(),
            })
            .collect(),
        points,
    }
}

fn fmt_change(c: Option<f64>) -> String {
    match c {
        None => "-".into(),
        Some(p) => format!("{p:+.1}%"),
    }
}

/// The seed-shaped side-by-side table: point × variant → READ and WRITE bandwidth (with
/// spread), IOPS, mean latency and change vs the first variant.
pub fn table(r: &ComparisonResult) -> String {
    let mut out = String::new();
    let _ = writeln!(out, "== {} ==", r.title);
    let _ = writeln!(out, "knob: {}", r.knob);
    if let Some(s) = &r.seed {
        let _ = writeln!(out, "seed: {s}");
    }
    for v in &r.variants {
        let extra = if v.job_overrides.is_empty() {
            String::new()
        } else {
            format!(" [{}]", v.job_overrides.join(" "))
        };
        let _ = writeln!(out, "  {:<12} {}{extra}", v.name, v.stack);
    }
    if let Some(n) = &r.note {
        let _ = writeln!(out, "note: {n}");
    }
    let spread = if r.repetitions > 1 {
        format!("median of {} interleaved repetitions, ± half the min-max range", r.repetitions)
    } else {
        "1 repetition".to_string()
    };
    let _ = writeln!(
        out,
        "{spread}; change = bandwidth vs {}",
        r.variants.first().map(|v| v.name.as_str()).unwrap_or("-")
    );
    let pw = r.points.iter().map(|p| p.label.len()).max().unwrap_or(5).max(5);
    let vw = r.variants.iter().map(|v| v.name.len()).max().unwrap_or(7).max(7);
    let has_read = r.points.iter().any(|p| p.cells.iter().any(|c| c.read.is_some()));
    let has_write = r.points.iter().any(|p| p.cells.iter().any(|c| c.write.is_some()));
    let mut hdr = format!("{:<pw$}  {:<vw$}", "point", "variant");
    for (name, on) in [("READ", has_read), ("WRITE", has_write)] {
        if on {
            let _ = write!(hdr, " | {:<8} {:>18} {:>8} {:>9} {:>8}", name, "bw", "IOPS", "lat(us)", "change");
        }
    }
    let _ = writeln!(out, "{hdr}");
    let _ = writeln!(out, "{}", "-".repeat(hdr.len()));
    for p in &r.points {
        for (i, c) in p.cells.iter().enumerate() {
            let label = if i == 0 { p.label.as_str() } else { "" };
            let mut line = format!("{label:<pw$}  {:<vw$}", c.variant);
            for (d, on) in [(&c.read, has_read), (&c.write, has_write)] {
                if !on {
                    continue;
                }
                match d {
                    Some(d) => {
                        let bw = if r.repetitions > 1 {
                            format!("{} ±{:.0}%", fmt_bw(d.bw_bytes.median), d.bw_bytes.half_range_pct())
                        } else {
                            fmt_bw(d.bw_bytes.median)
                        };
                        let _ = write!(
                            line,
                            " | {:<8} {:>18} {:>8} {:>9} {:>8}",
                            "",
                            bw,
                            fmt_count(d.iops.median),
                            fmt_us(d.lat_mean_ns.median),
                            fmt_change(d.change_pct)
                        );
                    }
                    None => {
                        let _ = write!(line, " | {:<8} {:>18} {:>8} {:>9} {:>8}", "", "-", "-", "-", "");
                    }
                }
            }
            let _ = writeln!(out, "{}", line.trim_end());
        }
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_job_named_like_its_point_is_named_once() {
        assert_eq!(job_title("randread-4k-qd1", "randread-4k-qd1"), "randread-4k-qd1");
        assert_eq!(job_title("dd-seq-4k", "dd-write-4k"), "dd-seq-4k dd-write-4k");
    }

    #[test]
    fn spread_has_median_quartiles_and_range() {
        let s = Spread::of(&[5.0, 1.0, 3.0, 2.0, 4.0]);
        assert_eq!(s.median, 3.0);
        assert_eq!((s.min, s.max), (1.0, 5.0));
        assert_eq!((s.q1, s.q3), (2.0, 4.0));
        assert_eq!(s.samples, vec![5.0, 1.0, 3.0, 2.0, 4.0]);
        let e = Spread::of(&[10.0, 20.0]);
        assert_eq!(e.median, 15.0);
        assert!((e.half_range_pct() - 33.333).abs() < 0.01);
    }

    #[test]
    fn variants_parse_stack_job_and_target_options() {
        let base = StackSpec::default();
        let v = Variant::parse("pool:--crypt-mode=pool --sector-size=512,iodepth=32", &base).unwrap();
        assert_eq!(v.name, "pool");
        assert_eq!(v.stack.crypt_mode, targets::CryptMode::Pool);
        assert_eq!(v.stack.sector_size, 512);
        assert_eq!(v.job_overrides, vec![("iodepth".to_string(), "32".to_string())]);
        let n = Variant::parse("peer:target=nbd+unix:///x?socket=/tmp/s", &base).unwrap();
        assert!(n.target.is_some());
        assert!(Variant::parse("x:frobnicate=1", &base).is_err());
        assert!(Variant::parse(":crypt-mode=pool", &base).is_err());
        let bare = Variant::parse("raw:stack=raw", &base).unwrap();
        assert_eq!(bare.stack.kind, crate::StackKind::Raw);
    }

    #[test]
    fn comparisons_need_two_variants_and_buildable_stacks() {
        let job = JobSpec::new("j", crate::RwMode::Read, 4096);
        let mut c = Comparison {
            title: "t".into(),
            knob: "k".into(),
            seed: None,
            note: None,
            variants: vec![Variant::new("a", StackSpec::raw())],
            points: vec![Point::one("4k", job)],
            repetitions: 1,
            volume_size: 1 << 20,
        };
        assert!(check(&c).is_err());
        let mut integ = StackSpec::default();
        integ.set("stack", "integrity").unwrap();
        integ.set("integrity-alg", "no-such-hash").unwrap();
        c.variants.push(Variant::new("b", integ));
        assert!(
            matches!(check(&c), Err(BenchError::Setup { context, .. }) if context.contains("no-such-hash"))
        );
    }
}
