//! `sealdisk bench`: fio-style workloads against a stack it builds itself or an NBD URI;
//! A/B comparisons, seed presets, and (with no arguments) the quick suite.
//!
//! Thin: options become a `bench::JobSpec` / `StackSpec` / `Comparison`, the bench crate
//! runs them, this prints.

use std::path::PathBuf;
use std::sync::atomic::AtomicBool;
use std::sync::Arc;
use std::time::Duration;

use anyhow::{bail, Context, Result};
use bench::compare::{self, CompareEnv, Comparison, ComparisonResult, Point, Variant};
use bench::format_speed::{self, FormatComparison};
use bench::fs_workload::{self, FsComparison, FsWorkload};
use bench::presets::{self, PresetOptions};
use bench::report::{self, Report, ReportJob};
use bench::spec::{format_size, parse_duration, parse_size};
use bench::suite::{self, SuiteOptions};
use bench::{DeviceTarget, JobSpec, NbdTarget, NbdUri, RunOptions, StackSpec};
use clap::Args;

use super::UsageError;

/// Arguments of `sealdisk bench` (fio's option names, `--name=value`).
#[derive(Debug, Args)]
#[command(after_help = "\
With no arguments: the quick suite (raw file vs plain dm-crypt inline and auto, LUKS2, \
dm-integrity, and LUKS2 authenticated encryption; 4k random QD1/QD32 and 1M sequential), about two \
minutes, ending in one summary table.

Examples:
  sealdisk bench
  sealdisk bench --rw=randread --bs=4k --size=256M --iodepth=32 --runtime=5 --time_based
  sealdisk bench --stack=crypt --crypt-mode=inline --sector-size=512 --rw=randrw --direct=1
  sealdisk bench --stack=integrity --integrity-alg=sha256 --integrity-mode=B --hash-mode=pool \
      --rw=write --bs=1M --runtime=5 --time_based
  sealdisk bench --target='nbd+unix:///vol?socket=/tmp/vol.sock' --rw=randread --iodepth=32 --runtime=5
  sealdisk bench --compare --variant pool:crypt-mode=pool --variant inline:crypt-mode=inline \\
      --rw=readwrite --bs=4k --runtime=3 --time_based --repeat=3 --svg=wq.svg
  sealdisk bench --list-presets
  sealdisk bench --preset dm-crypt-workqueue")]
pub struct BenchArgs {
    // ---- workload (fio) ----
    /// Job name.
    #[arg(long)]
    pub name: Option<String>,
    /// read, write, randread, randwrite, rw|readwrite, randrw.
    #[arg(long, alias = "readwrite")]
    pub rw: Option<String>,
    /// Percentage of reads in a mixed job (default 50).
    #[arg(long)]
    pub rwmixread: Option<u8>,
    /// Block size (4k, 64k, 1M).
    #[arg(long, alias = "blocksize")]
    pub bs: Option<String>,
    /// Region size from --offset; also the size of a temporary volume (default 256M).
    #[arg(long)]
    pub size: Option<String>,
    /// Start of the region.
    #[arg(long)]
    pub offset: Option<String>,
    /// Requests in flight per job: worker threads in-process, pipelined requests over NBD.
    #[arg(long)]
    pub iodepth: Option<u32>,
    /// Independent clones of the job (one NBD connection each).
    #[arg(long)]
    pub numjobs: Option<u32>,
    /// Measured time (5, 500ms, 2m).
    #[arg(long)]
    pub runtime: Option<String>,
    /// Run for --runtime whatever --size says.
    #[arg(long = "time_based", alias = "time-based", num_args = 0..=1, require_equals = true, default_missing_value = "1")]
    pub time_based: Option<String>,
    /// Run this long before measuring.
    #[arg(long = "ramp_time", alias = "ramp-time")]
    pub ramp_time: Option<String>,
    /// Passes over the region.
    #[arg(long)]
    pub loops: Option<u32>,
    /// O_DIRECT on the temporary volume's backing file.
    #[arg(long, num_args = 0..=1, require_equals = true, default_missing_value = "1")]
    pub direct: Option<String>,
    /// Every write durable on completion (FUA).
    #[arg(long, num_args = 0..=1, require_equals = true, default_missing_value = "1")]
    pub sync: Option<String>,
    /// Flush at the end of the job.
    #[arg(long = "end_fsync", alias = "end-fsync", num_args = 0..=1, require_equals = true, default_missing_value = "1")]
    pub end_fsync: Option<String>,
    /// Write verify headers, check reads, read everything back at the end.
    #[arg(long, num_args = 0..=1, require_equals = true, default_missing_value = "1")]
    pub verify: Option<String>,
    /// Seed of the random offsets.
    #[arg(long)]
    pub randseed: Option<u64>,

    // ---- what to run against ----
    /// An NBD URI (nbd+unix:///NAME?socket=PATH, nbd://HOST:PORT/NAME) instead of a temporary volume.
    #[arg(long, conflicts_with = "stack")]
    pub target: Option<String>,
    /// Build the stack on this existing file or block device instead of a temporary volume
    /// (fio's filename). A crypt layer gets a random key: writes destroy the content.
    #[arg(long, conflicts_with = "target", value_name = "PATH")]
    pub filename: Option<PathBuf>,
    /// Stack on the temporary volume: raw, crypt, integrity, crypt-integrity (plain crypt
    /// over integrity with an internal hash), luks2 (PBKDF2 with 1000 iterations),
    /// luks2-integrity (LUKS2 authenticated encryption; see --luks-integrity, J or D mode).
    /// Integrity and LUKS2 volumes are formatted without a wipe and written whole before the
    /// job.
    #[arg(long)]
    pub stack: Option<String>,
    /// Cipher of the crypt layer.
    #[arg(long)]
    pub cipher: Option<String>,
    /// Key size in bits (random key).
    #[arg(long)]
    pub key_size: Option<u32>,
    /// Encryption sector size, 512..4096.
    #[arg(long)]
    pub sector_size: Option<u32>,
    /// Where crypto runs: auto, pool, inline.
    #[arg(long)]
    pub crypt_mode: Option<String>,
    /// Lock under the layers: none, range, rwlock, mutex.
    #[arg(long)]
    pub lock: Option<String>,
    /// dm-integrity internal hash: crc32c (default), sha256, hmac-sha256 (random key), ...
    #[arg(long, value_name = "ALG")]
    pub integrity_alg: Option<String>,
    /// dm-integrity mode: J (journal, default), B (bitmap), D (direct).
    #[arg(long, value_name = "J|B|D")]
    pub integrity_mode: Option<String>,
    /// The luks2-integrity stack's `luksFormat --integrity`: hmac-sha256 (default),
    /// hmac-sha1, hmac-sha512, or aead (with --cipher aes-gcm-random --key-size 256).
    #[arg(long, value_name = "ALG")]
    pub luks_integrity: Option<String>,
    /// dm-integrity block size: 512..4096 (default 4096).
    #[arg(long)]
    pub block_size: Option<u32>,
    /// dm-integrity metadata buffer size in 512-byte sectors (default 128).
    #[arg(long)]
    pub buffer_sectors: Option<u32>,
    /// dm-integrity interleave sectors (default 32768).
    #[arg(long)]
    pub interleave_sectors: Option<u32>,
    /// dm-integrity journal size (default: 1/128 of the device, at most 64M).
    #[arg(long)]
    pub journal_size: Option<String>,
    /// dm-integrity journal_watermark percent: copy-out starts at this fill (default 50).
    #[arg(long)]
    pub journal_watermark: Option<u32>,
    /// dm-integrity tag hashing: inline, pool, auto (default: inline up to 64 KiB).
    #[arg(long, value_name = "inline|pool|auto")]
    pub hash_mode: Option<String>,
    /// dm-integrity: read every metadata buffer before writing it (skip_rmw off).
    #[arg(long, num_args = 0..=1, require_equals = true, default_missing_value = "1")]
    pub rmw: Option<String>,
    /// Directory for temporary volumes (default: $SEALDISK_BENCH_DIR, else the temp dir unless tmpfs).
    #[arg(long)]
    pub dir: Option<PathBuf>,

    // ---- comparisons and presets ----
    /// Compare two or more --variant NAME:OPTIONS on the same workload.
    #[arg(long)]
    pub compare: bool,
    /// A variant: NAME:key=value,... (stack options, job options, or target=URI).
    #[arg(long = "variant", value_name = "NAME:OPTIONS")]
    pub variants: Vec<String>,
    /// With --compare: one table row per block size (4k,16k,64k).
    #[arg(long, value_name = "BS,BS,...")]
    pub sweep_bs: Option<String>,
    /// Repetitions per cell, interleaved (compare, presets, suite).
    #[arg(long)]
    pub repeat: Option<u32>,
    /// Write an SVG bar chart of the comparison(s) here.
    #[arg(long, value_name = "PATH")]
    pub svg: Option<PathBuf>,
    /// Run a preset (see --list-presets).
    #[arg(long)]
    pub preset: Option<String>,
    /// List the presets.
    #[arg(long)]
    pub list_presets: bool,
    /// The tree `--preset fs-untar` unpacks: a tarball (default: a generated source-like tree).
    #[arg(long, value_name = "TARBALL")]
    pub tree: Option<PathBuf>,

    // ---- output ----
    /// normal (fio-like text) or json (schemas/bench-report.schema.json).
    #[arg(long = "output-format", default_value = "normal", value_parser = ["normal", "json"])]
    pub output_format: String,
    /// Also write the JSON report to this file.
    #[arg(long, value_name = "PATH")]
    pub output: Option<PathBuf>,
    /// No progress line (it is off anyway when stderr is not a terminal).
    #[arg(long)]
    pub no_progress: bool,
}

impl BenchArgs {
    fn any_job_option(&self) -> bool {
        self.rw.is_some()
            || self.bs.is_some()
            || self.iodepth.is_some()
            || self.numjobs.is_some()
            || self.verify.is_some()
    }
    fn any_stack_option(&self) -> bool {
        self.stack.is_some()
            || self.cipher.is_some()
            || self.key_size.is_some()
            || self.sector_size.is_some()
            || self.crypt_mode.is_some()
            || self.lock.is_some()
            || self.integrity_alg.is_some()
            || self.integrity_mode.is_some()
            || self.luks_integrity.is_some()
            || self.block_size.is_some()
            || self.buffer_sectors.is_some()
            || self.interleave_sectors.is_some()
            || self.journal_size.is_some()
            || self.journal_watermark.is_some()
            || self.hash_mode.is_some()
            || self.rmw.is_some()
    }
}

fn usage(e: bench::BenchError) -> anyhow::Error {
    match e {
        bench::BenchError::Usage(m) => UsageError(m).into(),
        e => e.into(),
    }
}

/// The job the options describe (fio defaults elsewhere).
fn job(a: &BenchArgs) -> Result<JobSpec> {
    let mut j = JobSpec::default();
    let s = |v: &Option<String>| v.clone();
    let n = |v: Option<u32>| v.map(|x| x.to_string());
    let pairs = [
        ("name", s(&a.name)),
        ("rw", s(&a.rw)),
        ("rwmixread", a.rwmixread.map(|x| x.to_string())),
        ("bs", s(&a.bs)),
        ("offset", s(&a.offset)),
        ("iodepth", n(a.iodepth)),
        ("numjobs", n(a.numjobs)),
        ("runtime", s(&a.runtime)),
        ("time_based", s(&a.time_based)),
        ("ramp_time", s(&a.ramp_time)),
        ("loops", n(a.loops)),
        ("sync", s(&a.sync)),
        ("end_fsync", s(&a.end_fsync)),
        ("verify", s(&a.verify)),
        ("randseed", a.randseed.map(|x| x.to_string())),
    ];
    for (k, v) in pairs {
        if let Some(v) = v {
            j.set(k, &v).map_err(usage)?;
        }
    }
    if a.name.is_none() {
        j.name = format!("{}-{}", j.rw, format_size(j.bs));
    }
    // fio: --size is the region. With a target or a file, the region; with a temporary
    // volume, its size (and the region is all of it).
    if a.target.is_some() || a.filename.is_some() {
        if let Some(sz) = &a.size {
            j.size = Some(parse_size(sz).map_err(usage)?);
        }
    }
    j.validate().map_err(usage)?;
    Ok(j)
}

fn stack(a: &BenchArgs) -> Result<StackSpec> {
    let mut st = StackSpec::default();
    let pairs = [
        ("stack", a.stack.clone()),
        ("cipher", a.cipher.clone()),
        ("key-size", a.key_size.map(|x| x.to_string())),
        ("sector-size", a.sector_size.map(|x| x.to_string())),
        ("crypt-mode", a.crypt_mode.clone()),
        ("lock", a.lock.clone()),
        ("direct", a.direct.clone()),
        ("integrity-alg", a.integrity_alg.clone()),
        ("integrity-mode", a.integrity_mode.clone()),
        ("luks-integrity", a.luks_integrity.clone()),
        ("block-size", a.block_size.map(|x| x.to_string())),
        ("buffer-sectors", a.buffer_sectors.map(|x| x.to_string())),
        ("interleave-sectors", a.interleave_sectors.map(|x| x.to_string())),
        ("journal-size", a.journal_size.clone()),
        ("journal-watermark", a.journal_watermark.map(|x| x.to_string())),
        ("hash-mode", a.hash_mode.clone()),
        ("rmw", a.rmw.clone()),
    ];
    for (k, v) in pairs {
        if let Some(v) = v {
            st.set(k, &v).map_err(usage)?;
        }
    }
    Ok(st)
}

fn volume_size(a: &BenchArgs, default: u64) -> Result<u64> {
    match &a.size {
        Some(s) => Ok(parse_size(s).map_err(usage)?),
        None => Ok(default),
    }
}

fn dir(a: &BenchArgs) -> Result<PathBuf> {
    let d = a.dir.clone().unwrap_or_else(bench::stack::default_dir);
    if !d.is_dir() {
        bail!(UsageError(format!("--dir {}: not a directory", d.display())));
    }
    if bench::stack::is_tmpfs(&d) {
        eprintln!("bench: warning: {} is a tmpfs; the backing files live in memory", d.display());
    }
    Ok(d)
}

fn stop_flag() -> Result<Arc<AtomicBool>> {
    let stop = Arc::new(AtomicBool::new(false));
    for sig in [signal_hook::consts::SIGINT, signal_hook::consts::SIGTERM] {
        signal_hook::flag::register(sig, Arc::clone(&stop)).context("installing signal handlers")?;
    }
    Ok(stop)
}

/// Runs `sealdisk bench`.
pub fn run(a: BenchArgs) -> Result<()> {
    if a.list_presets {
        print!("{}", presets::list_text());
        return Ok(());
    }
    if a.tree.is_some() && a.preset.as_deref() != Some("fs-untar") {
        bail!(UsageError("--tree is the tree of --preset fs-untar only".into()));
    }
    let json = a.output_format == "json";
    let run_opts = RunOptions { progress: !a.no_progress, stop: Some(stop_flag()?), ..RunOptions::default() };
    let mut rep = Report::new(std::env::args().collect::<Vec<_>>().join(" "));

    if let Some(name) = &a.preset {
        let p = presets::find(name).ok_or_else(|| {
            let names: Vec<_> = presets::all().iter().map(|p| p.name).collect();
            UsageError(format!("no preset {name:?}; presets: {}", names.join(", ")))
        })?;
        if a.any_job_option()
            || a.any_stack_option()
            || a.target.is_some()
            || a.filename.is_some()
            || a.compare
        {
            bail!(UsageError(format!(
                "preset {name} defines its own workload and stacks; only --runtime, --ramp_time, --repeat and --size scale it"
            )));
        }
        if let Some(needs) = p.needs {
            bail!(bench::BenchError::NotImplemented(format!(
                "preset {name} needs {needs}, which is not implemented yet (its workload is defined: {})",
                p.runs
            )));
        }
        let o = PresetOptions {
            runtime: a.runtime.as_deref().map(parse_duration).transpose().map_err(usage)?,
            ramp: a.ramp_time.as_deref().map(parse_duration).transpose().map_err(usage)?,
            repetitions: a.repeat,
            size: a.size.as_deref().map(parse_size).transpose().map_err(usage)?,
            tree: a.tree.clone(),
        };
        let comps = p.comparisons(&o);
        let formats: Vec<_> = p.format_comparison(&o).into_iter().collect();
        let fs: Vec<_> = p.fs_comparison(&o).into_iter().collect();
        for f in &fs {
            fs_workload::check(f).map_err(usage)?;
            if let Err(why) = fs_workload::host_ready(matches!(f.workload, FsWorkload::Fio { .. })) {
                eprintln!(
                    "bench: SKIPPED preset {name}: {why} (it serves each volume as a FUSE file on a loop device \
                     and runs mkfs.ext4 and mount on it)"
                );
                return Ok(());
            }
        }
        return run_comparisons(&a, Special { formats, fs }, comps, run_opts, rep, json, None);
    }

    if a.compare {
        let base_stack = stack(&a)?;
        let variants = a
            .variants
            .iter()
            .map(|v| Variant::parse(v, &base_stack))
            .collect::<Result<Vec<_>, _>>()
            .map_err(usage)?;
        if variants.len() < 2 {
            bail!(UsageError("--compare needs at least two --variant NAME:OPTIONS".into()));
        }
        let base_job = job(&a)?;
        let points = match &a.sweep_bs {
            Some(list) => list
                .split(',')
                .map(|bs| {
                    let mut j = base_job.clone();
                    j.set("bs", bs.trim())?;
                    j.name = format!("{}-{}", j.rw, format_size(j.bs));
                    Ok(Point::one(format_size(j.bs), j))
                })
                .collect::<Result<Vec<_>, bench::BenchError>>()
                .map_err(usage)?,
            None => vec![Point::one(format_size(base_job.bs), base_job.clone())],
        };
        let c = Comparison {
            title: format!("compare: {}", base_job.describe()),
            knob: a.variants.join("  vs  "),
            seed: None,
            note: None,
            variants,
            points,
            repetitions: a.repeat.unwrap_or(3),
            volume_size: volume_size(&a, 256 << 20)?,
        };
        return run_comparisons(&a, Special::default(), vec![c], run_opts, rep, json, None);
    }

    if a.target.is_some() || a.filename.is_some() || a.any_job_option() || a.any_stack_option() {
        let spec = job(&a)?;
        let (result, _volume) = match (&a.target, &a.filename) {
            (Some(uri), _) => {
                let uri: NbdUri = uri.parse().map_err(usage)?;
                let t = NbdTarget::connect(&uri).with_context(|| format!("connecting to {uri}"))?;
                (bench::run_job(&t, &spec, &run_opts)?, None)
            }
            (None, Some(path)) => {
                let built = stack(&a)?.open_existing(path).map_err(usage)?;
                if !json {
                    eprintln!("bench: {}", built.description);
                }
                let t = DeviceTarget::new(built.device.clone(), built.description.clone());
                (bench::run_job(&t, &spec, &run_opts)?, Some(built))
            }
            (None, None) => {
                let st = stack(&a)?;
                let size = volume_size(&a, 256 << 20)?;
                let d = dir(&a)?;
                if !json {
                    eprintln!(
                        "bench: {} on a {} temporary volume in {}",
                        st.describe(),
                        format_size(size),
                        d.display()
                    );
                }
                let built = st.build(&d, size).map_err(usage)?;
                built.precondition().context("preconditioning the temporary volume")?;
                let t = DeviceTarget::new(built.device.clone(), built.description.clone());
                (bench::run_job(&t, &spec, &run_opts)?, Some(built))
            }
        };
        if !json {
            print!("{}", report::job_text(&result, None));
            println!("\nRun status:");
            print!("{}", report::run_status(&result));
        }
        rep.jobs.push(ReportJob { variant: None, repetition: None, result });
        return finish(&a, &rep, json);
    }

    // No workload, no target, no preset: the quick suite.
    let o = SuiteOptions {
        runtime: a
            .runtime
            .as_deref()
            .map(parse_duration)
            .transpose()
            .map_err(usage)?
            .unwrap_or(SuiteOptions::default().runtime),
        ramp: a
            .ramp_time
            .as_deref()
            .map(parse_duration)
            .transpose()
            .map_err(usage)?
            .unwrap_or(SuiteOptions::default().ramp),
        size: volume_size(&a, SuiteOptions::default().size)?,
        repetitions: a.repeat.unwrap_or(1),
        direct: a
            .direct
            .as_deref()
            .map(|v| bench::spec::parse_bool("direct", v))
            .transpose()
            .map_err(usage)?
            .unwrap_or(false),
    };
    let c = suite::comparison(&o);
    run_comparisons(&a, Special::default(), vec![c], run_opts, rep, json, Some(suite::summary))
}

/// Comparisons that are not of jobs, run before them: format speed, filesystem workloads.
#[derive(Default)]
struct Special {
    formats: Vec<FormatComparison>,
    fs: Vec<FsComparison>,
}

/// Runs the format-speed comparisons, the filesystem comparisons, then the comparisons of
/// jobs, printing each table.
fn run_comparisons(
    a: &BenchArgs,
    special: Special,
    comps: Vec<Comparison>,
    run: RunOptions,
    mut rep: Report,
    json: bool,
    summary: Option<fn(&ComparisonResult) -> String>,
) -> Result<()> {
    for f in &special.formats {
        format_speed::check(f).map_err(usage)?;
    }
    for c in &comps {
        compare::check(c).map_err(usage)?;
    }
    let env = CompareEnv { dir: dir(a)?, run, chatty: !json };
    let started = std::time::Instant::now();
    for f in &special.formats {
        if !json {
            eprintln!(
                "bench: {} — {} variants × {} repetitions, {} each",
                f.title,
                f.variants.len(),
                f.repetitions,
                format_size(f.volume_size)
            );
        }
        let r = format_speed::run(f, &env)?;
        if !json {
            println!("\n{}", compare::table(&r));
        }
        rep.comparisons.push(r);
    }
    for f in &special.fs {
        if !json {
            eprintln!(
                "bench: {} — {} variants × {} repetitions, {} volumes as FUSE files on loop devices",
                f.title,
                f.variants.len(),
                f.repetitions,
                format_size(f.volume_size)
            );
        }
        let r = fs_workload::run(f, &env)?;
        if !json {
            println!("\n{}", compare::table(&r));
        }
        rep.comparisons.push(r);
    }
    for c in &comps {
        if !json {
            let cells = c.points.len() * c.variants.len() * c.repetitions as usize;
            let per: Duration = c
                .points
                .iter()
                .flat_map(|p| p.jobs.iter())
                .map(|j| j.runtime.unwrap_or_default() + j.ramp_time)
                .sum();
            eprintln!(
                "bench: {} — {} variants × {} points × {} repetitions = {cells} cells, about {:.0} s of measuring",
                c.title,
                c.variants.len(),
                c.points.len(),
                c.repetitions,
                per.as_secs_f64() * (c.variants.len() * c.repetitions as usize) as f64
            );
        }
        let r = compare::run_comparison(c, &env, &mut |j| rep.jobs.push(j))?;
        if !json {
            println!("\n{}", compare::table(&r));
            if let Some(s) = &summary {
                println!("{}", s(&r));
            }
        }
        rep.comparisons.push(r);
    }
    if !json {
        eprintln!("bench: done in {:.0} s", started.elapsed().as_secs_f64());
    }
    if let Some(path) = &a.svg {
        let svgs: Vec<String> = rep.comparisons.iter().map(bench::svg::chart).collect();
        let doc =
            if svgs.len() == 1 { svgs.into_iter().next().unwrap_or_default() } else { stack_svgs(&svgs) };
        std::fs::write(path, doc).with_context(|| format!("writing {}", path.display()))?;
        if !json {
            eprintln!("bench: chart written to {}", path.display());
        }
    }
    finish(a, &rep, json)
}

/// Several charts one under another in one SVG document.
fn stack_svgs(svgs: &[String]) -> String {
    let mut y = 0.0;
    let mut body = String::new();
    let mut width: f64 = 0.0;
    for s in svgs {
        let dim = |attr: &str| -> f64 {
            s.split(&format!(" {attr}=\""))
                .nth(1)
                .and_then(|r| r.split('"').next())
                .and_then(|v| v.parse().ok())
                .unwrap_or(0.0)
        };
        let (w, h) = (dim("width"), dim("height"));
        width = width.max(w);
        body.push_str(&format!("<g transform=\"translate(0,{y})\">{s}</g>\n"));
        y += h;
    }
    format!(
        "<svg xmlns=\"http://www.w3.org/2000/svg\" width=\"{width:.0}\" height=\"{y:.0}\" viewBox=\"0 0 {width:.0} {y:.0}\">\n{body}</svg>\n"
    )
}

fn finish(a: &BenchArgs, rep: &Report, json: bool) -> Result<()> {
    let doc = rep.to_json();
    if json {
        println!("{doc}");
    }
    if let Some(path) = &a.output {
        std::fs::write(path, &doc).with_context(|| format!("writing {}", path.display()))?;
    }
    Ok(())
}
