//! Where the requests come from: the job's pattern over its region, in order.
//!
//! One [`OpSource`] per clone, shared by that clone's workers (in-process) or its submitter
//! (NBD) behind a mutex: the critical section is a few arithmetic operations.

use std::sync::atomic::{AtomicU64, Ordering};

use crate::rng::SplitMix64;
use crate::spec::{JobSpec, RwMode};

/// Direction of a request.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Dir {
    /// A read.
    Read,
    /// A write.
    Write,
}

/// One request.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Op {
    /// Direction.
    pub dir: Dir,
    /// Byte offset on the target.
    pub offset: u64,
    /// Length in bytes.
    pub len: u64,
    /// Counted in the statistics (false during ramp and for the read-back pass).
    pub measured: bool,
    /// Write generation (varies verify content).
    pub generation: u64,
}

/// The job's region and clock limits, resolved against a target.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Plan {
    /// First byte of the region.
    pub start: u64,
    /// Length of the region (a multiple of `bs`).
    pub len: u64,
    /// Request size.
    pub bs: u64,
    /// Clock time at which measuring starts (after ramp).
    pub ramp_end_ns: u64,
    /// Clock time after which no request is issued (`None`: bounded by bytes only).
    pub end_ns: Option<u64>,
    /// Requests per clone (`None`: time-based).
    pub ops_per_clone: Option<u64>,
}

impl Plan {
    /// Blocks of `bs` in the region.
    pub fn blocks(&self) -> u64 {
        self.len / self.bs
    }
}

/// A stream of requests.
pub trait OpSource: Send {
    /// The next request at clock time `now_ns`, or `None` when the job is done.
    fn next(&mut self, now_ns: u64) -> Option<Op>;
    /// Requests this source will issue in total, if known (for progress).
    fn total(&self) -> Option<u64> {
        None
    }
}

/// The job's pattern (fio semantics, see `spec`).
#[derive(Debug)]
pub struct WorkloadSource {
    rw: RwMode,
    rwmixread: u8,
    plan: Plan,
    rng: SplitMix64,
    /// Next sequential block per direction (fio keeps one position per direction).
    seq: [u64; 2],
    left: Option<u64>,
    generation: u64,
}

impl WorkloadSource {
    /// The source of clone `clone` of `spec` under `plan`. Clones get different random
    /// sequences (seed + clone); sequential clones all start at the region's start, as fio's
    /// clones of one job on one file do.
    pub fn new(spec: &JobSpec, plan: Plan, clone: u32) -> Self {
        WorkloadSource {
            rw: spec.rw,
            rwmixread: spec.rwmixread,
            plan,
            rng: SplitMix64::new(spec.randseed.wrapping_add(u64::from(clone).wrapping_mul(0x1000_0000_01b3))),
            seq: [0, 0],
            left: plan.ops_per_clone,
            generation: u64::from(clone) << 48,
        }
    }
}

impl OpSource for WorkloadSource {
    fn next(&mut self, now_ns: u64) -> Option<Op> {
        if self.plan.end_ns.is_some_and(|end| now_ns >= end) {
            return None;
        }
        let measured = now_ns >= self.plan.ramp_end_ns;
        if measured {
            match &mut self.left {
                Some(0) => return None,
                Some(n) => *n -= 1,
                None => {}
            }
        }
        let dir = match self.rw {
            RwMode::Read | RwMode::RandRead => Dir::Read,
            RwMode::Write | RwMode::RandWrite => Dir::Write,
            RwMode::ReadWrite | RwMode::RandRw => {
                if self.rng.below(100) < u64::from(self.rwmixread) {
                    Dir::Read
                } else {
                    Dir::Write
                }
            }
        };
        let blocks = self.plan.blocks();
        let block = if self.rw.is_random() {
            self.rng.below(blocks)
        } else {
            let pos = &mut self.seq[dir as usize];
            let b = *pos;
            *pos = (*pos + 1) % blocks;
            b
        };
        self.generation += 1;
        Some(Op {
            dir,
            offset: self.plan.start + block * self.plan.bs,
            len: self.plan.bs,
            measured,
            generation: self.generation,
        })
    }

    fn total(&self) -> Option<u64> {
        self.plan.ops_per_clone
    }
}

/// Which blocks of the region a write has completed on (for the verify read-back).
#[derive(Debug)]
pub struct WrittenMap {
    start: u64,
    bs: u64,
    bits: Vec<AtomicU64>,
}

impl WrittenMap {
    /// An empty map of `plan`'s region.
    pub fn new(plan: &Plan) -> Self {
        let words = plan.blocks().div_ceil(64) as usize;
        WrittenMap { start: plan.start, bs: plan.bs, bits: (0..words).map(|_| AtomicU64::new(0)).collect() }
    }

    /// Marks the block a write at `offset` covered.
    pub fn mark(&self, offset: u64) {
        let b = (offset - self.start) / self.bs;
        self.bits[(b / 64) as usize].fetch_or(1 << (b % 64), Ordering::Relaxed);
    }

    /// Offsets of every marked block, ascending.
    pub fn offsets(&self) -> Vec<u64> {
        let mut out = Vec::new();
        for (w, word) in self.bits.iter().enumerate() {
            let mut x = word.load(Ordering::Relaxed);
            while x != 0 {
                let bit = x.trailing_zeros() as u64;
                out.push(self.start + (w as u64 * 64 + bit) * self.bs);
                x &= x - 1;
            }
        }
        out
    }
}

/// Reads back each of a list of blocks once (the verify pass); never measured.
#[derive(Debug)]
pub struct ReadBackSource {
    offsets: Vec<u64>,
    bs: u64,
    pos: usize,
}

impl ReadBackSource {
    /// Reads of `bs` bytes at each of `offsets`.
    pub fn new(offsets: Vec<u64>, bs: u64) -> Self {
        ReadBackSource { offsets, bs, pos: 0 }
    }
}

impl OpSource for ReadBackSource {
    fn next(&mut self, _now_ns: u64) -> Option<Op> {
        let offset = *self.offsets.get(self.pos)?;
        self.pos += 1;
        Some(Op { dir: Dir::Read, offset, len: self.bs, measured: false, generation: 0 })
    }
    fn total(&self) -> Option<u64> {
        Some(self.offsets.len() as u64)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn plan(ops: Option<u64>) -> Plan {
        Plan { start: 4096, len: 16 * 4096, bs: 4096, ramp_end_ns: 0, end_ns: None, ops_per_clone: ops }
    }

    #[test]
    fn sequential_reads_walk_the_region_and_wrap() {
        let spec = JobSpec::new("s", RwMode::Read, 4096);
        let mut s = WorkloadSource::new(&spec, plan(Some(20)), 0);
        let offs: Vec<u64> = std::iter::from_fn(|| s.next(0)).map(|o| o.offset).collect();
        assert_eq!(offs.len(), 20);
        assert_eq!(offs[0], 4096);
        assert_eq!(offs[15], 4096 + 15 * 4096);
        assert_eq!(offs[16], 4096);
    }

    #[test]
    fn random_offsets_stay_aligned_in_the_region_and_repeat_per_seed() {
        let spec = JobSpec::new("r", RwMode::RandWrite, 4096);
        let mut a = WorkloadSource::new(&spec, plan(Some(1000)), 0);
        let mut b = WorkloadSource::new(&spec, plan(Some(1000)), 0);
        let mut c = WorkloadSource::new(&spec, plan(Some(1000)), 1);
        let mut differs = false;
        while let Some(x) = a.next(0) {
            assert_eq!(x.dir, Dir::Write);
            assert_eq!(x.offset % 4096, 0);
            assert!(x.offset >= 4096 && x.offset < 4096 + 16 * 4096);
            assert_eq!(Some(x.offset), b.next(0).map(|o| o.offset));
            differs |= Some(x.offset) != c.next(0).map(|o| o.offset);
        }
        assert!(differs, "clones must not repeat each other's offsets");
    }

    #[test]
    fn rwmixread_sets_the_read_share() {
        let mut spec = JobSpec::new("m", RwMode::RandRw, 4096);
        spec.rwmixread = 70;
        let mut s = WorkloadSource::new(&spec, plan(Some(10_000)), 0);
        let reads = std::iter::from_fn(|| s.next(0)).filter(|o| o.dir == Dir::Read).count();
        assert!((6500..7500).contains(&reads), "{reads} reads of 10000");
    }

    #[test]
    fn ramp_ops_are_unmeasured_and_free_and_the_end_time_stops() {
        let spec = JobSpec::new("t", RwMode::Read, 4096);
        let p = Plan { ramp_end_ns: 100, end_ns: Some(200), ops_per_clone: Some(2), ..plan(None) };
        let mut s = WorkloadSource::new(&spec, p, 0);
        for _ in 0..5 {
            assert!(!s.next(50).unwrap().measured);
        }
        assert!(s.next(150).unwrap().measured);
        assert!(s.next(150).unwrap().measured);
        assert_eq!(s.next(150), None, "budget of 2 measured ops");
        let mut t = WorkloadSource::new(&spec, Plan { ops_per_clone: None, ..p }, 0);
        assert!(t.next(199).is_some());
        assert_eq!(t.next(200), None);
    }

    #[test]
    fn written_map_lists_marked_blocks() {
        let p = Plan { start: 0, len: 200 * 512, bs: 512, ramp_end_ns: 0, end_ns: None, ops_per_clone: None };
        let m = WrittenMap::new(&p);
        for off in [0u64, 63 * 512, 64 * 512, 199 * 512, 64 * 512] {
            m.mark(off);
        }
        assert_eq!(m.offsets(), vec![0, 63 * 512, 64 * 512, 199 * 512]);
        let mut r = ReadBackSource::new(m.offsets(), 512);
        assert_eq!(r.total(), Some(4));
        assert_eq!(std::iter::from_fn(|| r.next(0)).count(), 4);
    }
}
