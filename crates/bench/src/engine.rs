//! Runs one job against one target and measures it.
//!
//! ```text
//!   run_job(target, spec)
//!     ├─ resolve the region and the clock limits (Plan)
//!     ├─ monitor thread: progress line, CPU snapshot at the end of ramp
//!     ├─ clone 0 ─ target.run_clone(ctx0) ─┐   each clone pulls requests from its own
//!     ├─ clone 1 ─ target.run_clone(ctx1) ─┤   WorkloadSource, keeps `iodepth` in flight,
//!     │   ...                              │   and records each completion in per-worker
//!     └─ clone N ─ ...                    ─┘   recorders (no shared lock on the hot path)
//!     ├─ verify: read back every written block through the same target (strict)
//!     └─ JobResult: per-direction IOPS, bandwidth, latency summary; CPU; verify counts
//! ```
//!
//! The measured window runs from the end of ramp to the last completion, so throughput is
//! what was completed in the time it took, as fio reports it.

use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use serde::Serialize;

use crate::clock::{Clock, MonotonicClock};
use crate::cpu::CpuSnapshot;
use crate::gen::{Dir, Op, OpSource, Plan, ReadBackSource, WorkloadSource, WrittenMap};
use crate::progress::Progress;
use crate::rng::SplitMix64;
use crate::spec::JobSpec;
use crate::stats::{DirResult, LatencyRecorder};
use crate::target::Target;
use crate::{verify, BenchError};

/// How to run (not what): clock and progress display.
#[derive(Debug, Clone)]
pub struct RunOptions {
    /// Time source (tests use a `ManualClock`).
    pub clock: Arc<dyn Clock>,
    /// Show a progress line on stderr.
    pub progress: bool,
    /// Prefix of the progress line (e.g. the variant's name).
    pub label: String,
    /// Set from outside (a signal handler) to stop at the next request; the job then fails
    /// with [`BenchError::Interrupted`] and temporary volumes are cleaned up as usual.
    pub stop: Option<Arc<AtomicBool>>,
}

impl Default for RunOptions {
    fn default() -> Self {
        RunOptions {
            clock: Arc::new(MonotonicClock::new()),
            progress: false,
            label: String::new(),
            stop: None,
        }
    }
}

/// Live counters the progress line reads.
#[derive(Debug, Default)]
pub struct LiveCounters {
    /// Reads completed.
    pub read_ios: AtomicU64,
    /// Writes completed.
    pub write_ios: AtomicU64,
    /// Bytes moved in both directions.
    pub bytes: AtomicU64,
}

/// One worker's private statistics.
#[derive(Debug, Default)]
pub struct WorkerStats {
    read: LatencyRecorder,
    write: LatencyRecorder,
    verified: u64,
    last_completion_ns: u64,
    /// Completions not yet added to the shared live counters: (reads, writes, bytes).
    /// Batched so that workers do not bounce the counters' cache line on every request.
    pending: (u64, u64, u64),
}

/// Completions a worker accumulates before updating the live counters.
const LIVE_BATCH: u64 = 64;

#[derive(Debug, Default)]
struct Merged {
    read: LatencyRecorder,
    write: LatencyRecorder,
    verified: u64,
    last_completion_ns: u64,
}

/// What a target's `run_clone` works with: the request stream, the clock, and where
/// completions go.
pub struct CloneCtx<'a> {
    source: Mutex<Box<dyn OpSource + 'a>>,
    clock: &'a dyn Clock,
    abort: &'a AtomicBool,
    stop: Option<&'a AtomicBool>,
    live: &'a LiveCounters,
    merged: Mutex<Merged>,
    written: Option<&'a WrittenMap>,
    iodepth: usize,
    sync: bool,
    end_fsync: bool,
    verify: bool,
    strict: bool,
    seed: u64,
    unit: usize,
    clone: u32,
}

impl std::fmt::Debug for CloneCtx<'_> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("CloneCtx")
            .field("clone", &self.clone)
            .field("iodepth", &self.iodepth)
            .finish_non_exhaustive()
    }
}

impl CloneCtx<'_> {
    /// Requests to keep in flight.
    pub fn iodepth(&self) -> usize {
        self.iodepth
    }
    /// Writes must be durable on completion (FUA).
    pub fn sync(&self) -> bool {
        self.sync
    }
    /// Flush once after the last request.
    pub fn end_fsync(&self) -> bool {
        self.end_fsync
    }
    /// Index of this clone (0..numjobs).
    pub fn clone_index(&self) -> u32 {
        self.clone
    }
    /// Clock time in ns.
    pub fn now(&self) -> u64 {
        self.clock.now_ns()
    }

    /// The next request, or `None` when the job is done or has failed.
    pub fn next_op(&self) -> Option<Op> {
        if self.abort.load(Ordering::Relaxed) || self.stop.is_some_and(|s| s.load(Ordering::Relaxed)) {
            return None;
        }
        let now = self.clock.now_ns();
        self.source.lock().expect("op source lock").next(now)
    }

    /// A buffer for requests of up to `len` bytes, aligned for O_DIRECT and filled with
    /// random bytes (what non-verify writes carry, as fio's default buffers).
    pub fn buffer(&self, len: usize, worker: u64) -> blockdev::AlignedBuf {
        let mut b = blockdev::AlignedBuf::for_direct_io(len);
        SplitMix64::new(self.seed ^ worker.wrapping_mul(0x9e37_79b9) ^ u64::from(self.clone) << 32)
            .fill(b.as_mut_slice());
        b
    }

    /// Prepares the payload of write `op` in `buf` (exactly `op.len` bytes): verify headers
    /// when verifying, otherwise the buffer's random content as it is.
    pub fn prepare_write(&self, op: &Op, buf: &mut [u8]) {
        if self.verify {
            verify::fill(buf, op.offset, self.unit, self.seed, op.generation);
        }
    }

    /// A fresh per-worker statistics block.
    pub fn worker(&self) -> WorkerStats {
        WorkerStats::default()
    }

    /// Accounts for a completed request that started at `start_ns` and completed at
    /// `end_ns`; `buf` is the data read (reads only). Verifies reads when verifying.
    pub fn complete(
        &self,
        w: &mut WorkerStats,
        op: &Op,
        start_ns: u64,
        end_ns: u64,
        buf: &[u8],
    ) -> Result<(), BenchError> {
        let ns = end_ns.saturating_sub(start_ns);
        match op.dir {
            Dir::Read => {
                if self.verify {
                    w.verified += verify::check(buf, op.offset, self.unit, self.seed, self.strict)
                        .map_err(BenchError::Verify)?;
                }
                if op.measured {
                    w.read.record(ns, op.len);
                }
                w.pending.0 += 1;
            }
            Dir::Write => {
                if let Some(m) = self.written {
                    m.mark(op.offset);
                }
                if op.measured {
                    w.write.record(ns, op.len);
                }
                w.pending.1 += 1;
            }
        }
        w.pending.2 += op.len;
        if w.pending.0 + w.pending.1 >= LIVE_BATCH {
            self.flush_live(w);
        }
        if op.measured {
            w.last_completion_ns = w.last_completion_ns.max(end_ns);
        }
        Ok(())
    }

    fn flush_live(&self, w: &mut WorkerStats) {
        let (r, wr, b) = std::mem::take(&mut w.pending);
        self.live.read_ios.fetch_add(r, Ordering::Relaxed);
        self.live.write_ios.fetch_add(wr, Ordering::Relaxed);
        self.live.bytes.fetch_add(b, Ordering::Relaxed);
    }

    /// Hands a worker's statistics back (call once per worker, also after an error).
    pub fn finish(&self, mut w: WorkerStats) {
        self.flush_live(&mut w);
        let mut m = self.merged.lock().expect("merge lock");
        m.read.merge(&w.read);
        m.write.merge(&w.write);
        m.verified += w.verified;
        m.last_completion_ns = m.last_completion_ns.max(w.last_completion_ns);
    }

    /// Whether the job has been stopped by an error.
    pub fn aborted(&self) -> bool {
        self.abort.load(Ordering::Relaxed)
    }

    /// Whether the job is stopping: an error, or a stop from outside (a signal).
    pub fn stopping(&self) -> bool {
        self.aborted() || self.stop.is_some_and(|s| s.load(Ordering::Relaxed))
    }

    /// Stops every clone of the job (after an error).
    pub fn abort(&self) {
        self.abort.store(true, Ordering::Relaxed);
    }
}

/// CPU use over the measured window (the whole process: in-process this is the stack and
/// the load generator together; against NBD it is the client only).
#[derive(Debug, Clone, Default, Serialize)]
pub struct CpuUsage {
    /// User time, % of one core.
    pub usr_cpu: f64,
    /// System time, % of one core.
    pub sys_cpu: f64,
    /// Context switches.
    pub ctx: u64,
}

/// The result of one job.
#[derive(Debug, Clone, Serialize)]
pub struct JobResult {
    /// Job name.
    pub jobname: String,
    /// What was measured.
    pub target: String,
    /// The job's options.
    pub options: JobSpec,
    /// Measured window in ms (end of ramp to last completion).
    pub runtime_ms: f64,
    /// Reads.
    pub read: DirResult,
    /// Writes.
    pub write: DirResult,
    /// CPU use.
    #[serde(flatten)]
    pub cpu: CpuUsage,
    /// Units checked by verify (during the job and in the read-back), if verifying.
    pub verified_units: Option<u64>,
}

/// Runs `spec` against `target`.
pub fn run_job(target: &dyn Target, spec: &JobSpec, opts: &RunOptions) -> Result<JobResult, BenchError> {
    spec.validate()?;
    let info = target.info();
    let block = u64::from(info.block);
    if spec.bs % block != 0 {
        return Err(BenchError::usage(format!(
            "bs={} is not a multiple of the target's block size {block} ({})",
            spec.bs, info.description
        )));
    }
    if spec.offset % block != 0 || spec.offset >= info.size {
        return Err(BenchError::usage(format!(
            "offset={} must be a multiple of {block} inside the target ({} bytes)",
            spec.offset, info.size
        )));
    }
    let avail = info.size - spec.offset;
    let len = spec.size.unwrap_or(avail);
    if len > avail {
        return Err(BenchError::usage(format!(
            "size={len} + offset={} exceeds the target's {} bytes",
            spec.offset, info.size
        )));
    }
    let len = len - len % spec.bs;
    if len == 0 {
        return Err(BenchError::usage(format!("the region holds no whole block of bs={}", spec.bs)));
    }
    if spec.sync && !info.fua {
        return Err(BenchError::usage(format!(
            "sync=1 needs FUA, which {} does not offer",
            info.description
        )));
    }

    let clock = &*opts.clock;
    let t0 = clock.now_ns();
    let ramp_end_ns = t0 + spec.ramp_time.as_nanos() as u64;
    let bounded = !spec.time_based;
    let plan = Plan {
        start: spec.offset,
        len,
        bs: spec.bs,
        ramp_end_ns,
        end_ns: spec.runtime.map(|r| ramp_end_ns + r.as_nanos() as u64),
        ops_per_clone: bounded.then(|| len / spec.bs * u64::from(spec.loops)),
    };
    let written = (spec.verify && spec.rw.writes()).then(|| WrittenMap::new(&plan));
    let abort = AtomicBool::new(false);
    let live = LiveCounters::default();
    let unit = info.block.max(512) as usize;
    let make_ctx = |clone: u32, source: Box<dyn OpSource>, strict: bool| CloneCtx {
        source: Mutex::new(source),
        clock,
        abort: &abort,
        stop: opts.stop.as_deref(),
        live: &live,
        merged: Mutex::new(Merged::default()),
        written: written.as_ref(),
        iodepth: spec.iodepth as usize,
        sync: spec.sync,
        end_fsync: spec.end_fsync && !strict,
        verify: spec.verify,
        strict,
        seed: spec.randseed,
        unit,
        clone,
    };
    let ctxs: Vec<CloneCtx<'_>> =
        (0..spec.numjobs).map(|c| make_ctx(c, Box::new(WorkloadSource::new(spec, plan, c)), false)).collect();

    let cpu_start = CpuSnapshot::now();
    let cpu_at_ramp = Mutex::new(None::<CpuSnapshot>);
    let done = AtomicBool::new(false);
    let total_ops = plan.ops_per_clone.map(|n| n * u64::from(spec.numjobs));
    let progress = Progress::new(opts.progress, &opts.label, spec, total_ops);

    let mut errors: Vec<BenchError> = Vec::new();
    std::thread::scope(|s| {
        s.spawn(|| {
            // Monitor: progress, and the CPU snapshot when ramp ends.
            let mut last = (0u64, 0u64);
            while !done.load(Ordering::Relaxed) {
                let now = clock.now_ns();
                let snapped = {
                    let mut at = cpu_at_ramp.lock().expect("cpu lock");
                    if at.is_none() && now >= ramp_end_ns {
                        *at = Some(CpuSnapshot::now());
                    }
                    at.is_some()
                };
                last = progress.tick(&live, now.saturating_sub(t0), last);
                // Wake up close to the end of ramp, so the CPU window starts with the
                // measured one (±1 ms); 100 ms ticks after that.
                let nap = if snapped {
                    100_000_000
                } else {
                    ramp_end_ns.saturating_sub(now).clamp(1_000_000, 100_000_000)
                };
                std::thread::sleep(Duration::from_nanos(nap));
            }
        });
        let handles: Vec<_> = ctxs
            .iter()
            .map(|ctx| {
                s.spawn(move || {
                    let r = target.run_clone(ctx);
                    if r.is_err() {
                        ctx.abort();
                    }
                    r
                })
            })
            .collect();
        for h in handles {
            match h.join() {
                Ok(Ok(())) => {}
                Ok(Err(e)) => errors.push(e),
                Err(_) => errors.push(BenchError::Internal("a job thread panicked".into())),
            }
        }
        done.store(true, Ordering::Relaxed);
    });
    progress.finish();
    let cpu_end = CpuSnapshot::now();
    if let Some(e) = errors.into_iter().next() {
        return Err(e);
    }
    if opts.stop.as_ref().is_some_and(|s| s.load(Ordering::Relaxed)) {
        return Err(BenchError::Interrupted);
    }

    let mut read = LatencyRecorder::new();
    let mut write = LatencyRecorder::new();
    let mut verified = 0;
    let mut last = 0;
    for ctx in &ctxs {
        let m = ctx.merged.lock().expect("merge lock");
        read.merge(&m.read);
        write.merge(&m.write);
        verified += m.verified;
        last = last.max(m.last_completion_ns);
    }
    let window_start = ramp_end_ns.max(t0);
    let window = last.saturating_sub(window_start);
    let cpu_from = cpu_at_ramp.into_inner().expect("cpu lock").unwrap_or(cpu_start);
    let (usr_cpu, sys_cpu, ctxsw) = cpu_end.usage_since(&cpu_from);

    if let Some(map) = &written {
        // Read back everything written, with nothing else in flight.
        let offsets = map.offsets();
        let ctx = make_ctx(0, Box::new(ReadBackSource::new(offsets, spec.bs)), true);
        target.run_clone(&ctx)?;
        verified += ctx.merged.lock().expect("merge lock").verified;
    }

    Ok(JobResult {
        jobname: spec.name.clone(),
        target: info.description.clone(),
        options: spec.clone(),
        runtime_ms: window as f64 / 1e6,
        read: DirResult::from_recorder(&read, window),
        write: DirResult::from_recorder(&write, window),
        cpu: CpuUsage { usr_cpu, sys_cpu, ctx: ctxsw },
        verified_units: spec.verify.then_some(verified),
    })
}
