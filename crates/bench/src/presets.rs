//! Presets: one per seed experiment, each one command away (`sealdisk bench --preset NAME`).
//!
//! Each preset names the knob it turns and the seed thread it reproduces
//! (`shared/reference/seeds/`), makes its own temporary volumes, and runs the seed's workload
//! shape scaled to a 2-core machine (seconds per cell instead of minutes, volumes of tens or
//! hundreds of MiB instead of GiB). The output is the seed-shaped side-by-side table.
//!
//! | preset | seed | knob |
//! |---|---|---|
//! | `dm-crypt-workqueue` | 001 | crypto on the pool (kcryptd) vs inline (`no_*_workqueue`) |
//! | `iv-sector-size` | 003 | 512 vs 4096-byte sectors × plain64 vs essiv IVs |
//! | `ext4-parallel-dio` | 002 | lock granularity: none, range locks, one shared/exclusive lock |
//! | `integrity-ahash` | 000 | tag hashing inline vs in parallel (needs IntegrityTarget) |
//! | `integrity-rmw` | 004 | `buffer_sectors` 1 vs 128 in bitmap mode (needs IntegrityTarget) |
//!
//! The integrity presets have their workload shape defined already; they refuse to run,
//! saying what is missing, until the dm-integrity target exists (see `stack.rs`).

use std::time::Duration;

use targets::CryptMode;

use crate::compare::{Comparison, Point, Variant};
use crate::spec::{format_size, JobSpec, RwMode};
use crate::stack::StackSpec;

/// Scaling knobs a user may override (`--runtime`, `--ramp_time`, `--repeat`, `--size`).
#[derive(Debug, Clone, Default)]
pub struct PresetOptions {
    /// Measured time per job.
    pub runtime: Option<Duration>,
    /// Ramp per job.
    pub ramp: Option<Duration>,
    /// Repetitions per cell.
    pub repetitions: Option<u32>,
    /// Volume size.
    pub size: Option<u64>,
}

impl PresetOptions {
    fn runtime(&self, d: f64) -> Duration {
        self.runtime.unwrap_or(Duration::from_secs_f64(d))
    }
    fn ramp(&self, d: f64) -> Duration {
        self.ramp.unwrap_or(Duration::from_secs_f64(d))
    }
    fn reps(&self, d: u32) -> u32 {
        self.repetitions.unwrap_or(d)
    }
    fn size(&self, d: u64) -> u64 {
        self.size.unwrap_or(d)
    }
}

/// A preset.
#[derive(Debug, Clone, Copy)]
pub struct Preset {
    /// `--preset NAME`.
    pub name: &'static str,
    /// The seed thread and its experiment.
    pub seed: &'static str,
    /// The knob it turns.
    pub knob: &'static str,
    /// What it runs, scaled.
    pub runs: &'static str,
    /// What must land before it can run, if anything.
    pub needs: Option<&'static str>,
    build: fn(&PresetOptions) -> Vec<Comparison>,
}

impl Preset {
    /// The comparisons it runs.
    pub fn comparisons(&self, o: &PresetOptions) -> Vec<Comparison> {
        (self.build)(o)
    }
}

/// Every preset.
pub fn all() -> &'static [Preset] {
    &PRESETS
}

/// The preset called `name`.
pub fn find(name: &str) -> Option<&'static Preset> {
    PRESETS.iter().find(|p| p.name == name)
}

/// The `--list-presets` text.
pub fn list_text() -> String {
    let mut s = String::new();
    for p in all() {
        s.push_str(&format!("{}\n", p.name));
        s.push_str(&format!("  seed : {}\n", p.seed));
        s.push_str(&format!("  knob : {}\n", p.knob));
        s.push_str(&format!("  runs : {}\n", p.runs));
        match p.needs {
            Some(n) => {
                s.push_str(&format!("  state: needs {n}, not implemented yet (workload shape defined)\n"))
            }
            None => s.push_str("  state: ready\n"),
        }
    }
    s
}

const PRESETS: [Preset; 5] = [
    Preset {
        name: "dm-crypt-workqueue",
        seed: "001 osk-sdl MR \"disable read/write workqueues\": fio --readwrite=readwrite --bs=4k --direct=1 \
               on dm-crypt, +33% read / +35% write bandwidth with no_read_workqueue,no_write_workqueue",
        knob: "where crypto runs: crypt-mode=pool (every request handed to the crypto pool, dm-crypt's kcryptd) \
               vs crypt-mode=inline (on the request's thread, no_read/no_write_workqueue)",
        runs: "rw=readwrite bs=4k, O_DIRECT backing, 64M volume, 3 s per cell after 0.5 s ramp, 3 repetitions; \
               at QD1 (the seed) and QD32 (where a pool can use both cores)",
        needs: None,
        build: workqueue,
    },
    Preset {
        name: "iv-sector-size",
        seed: "003 dm-crypt IV generation RFC (Binoy Jayan, 2017): dd with 4k blocks and fio under qemu, \
               512 vs 4096-byte \"cluster\" sectors; +5.7% sequential, a few % either way for random",
        knob: "encryption sector size 512 vs 4096 × IV generator plain64 (aes-xts) vs essiv:sha256 (aes-cbc)",
        runs: "dd-like sequential 4k write then read (QD1) and fio-like random 4k write then read (QD1), \
               buffered backing, 128M volumes, 2 s per job, 2 repetitions",
        needs: None,
        build: iv_sector_size,
    },
    Preset {
        name: "ext4-parallel-dio",
        seed: "002 linux-ext4 \"performance regression with ext4: Allow parallel DIO reads\": fio randrw psync \
               direct numjobs=8, bs 4k..1M; the shared inode lock for reads made mixed I/O up to 4x slower",
        knob: "lock granularity under the crypt layer: lock=none, lock=range (blockdev::RangeLocked, only \
               overlapping requests wait) vs lock=rwlock (one shared/exclusive lock: the inode lock after the patch)",
        runs: "rw=randrw rwmixread=50 numjobs=8 iodepth=1, O_DIRECT backing, 256M volume, bs 4k 16k 64k 512k 1M, \
               2 s per cell after 0.5 s ramp, 2 repetitions",
        needs: None,
        build: ext4_parallel_dio,
    },
    Preset {
        name: "integrity-ahash",
        seed: "000 dm-integrity \"Implement asynch digest support\" (s390, 2025): integritysetup format speed and \
               dd 4k oflag=direct,sync write / iflag=direct read, sha256 and hmac-sha256, shash vs ahash",
        knob: "tag hashing inline on the request's thread vs in parallel (parallel-hash), sha256 and hmac-sha256",
        runs: "dd-like sequential 4k writes with sync=1 (O_DIRECT|O_SYNC) then 4k reads, O_DIRECT backing, \
               4096-byte sectors, 128M volume, 3 s per job, 3 repetitions",
        needs: Some("the dm-integrity target (IntegrityTarget)"),
        build: integrity_ahash,
    },
    Preset {
        name: "integrity-rmw",
        seed: "004 dm-integrity \"Prevent RMW for full metadata buffer writes\" (Lukas Straub, 2020): \
               dd 64K and 4M oflag=direct conv=fsync, bitmap mode, crc32c; 10.7 -> 104 MB/s with buffer_sectors=1",
        knob: "metadata buffer size buffer_sectors=1 vs 128 (bitmap mode, crc32c)",
        runs: "dd-like sequential writes bs=64k and bs=4M with end_fsync, O_DIRECT backing, 256M volume, \
               3 s per job, 3 repetitions",
        needs: Some("the dm-integrity target (IntegrityTarget)"),
        build: integrity_rmw,
    },
];

fn timed(name: &str, rw: RwMode, bs: u64, depth: u32, o: &PresetOptions, run: f64, ramp: f64) -> JobSpec {
    JobSpec::new(name, rw, bs).depth(depth).timed(o.runtime(run), o.ramp(ramp))
}

fn workqueue(o: &PresetOptions) -> Vec<Comparison> {
    let mut stack = StackSpec::crypt(CryptMode::Pool);
    stack.sector_size = 512; // the seed's table has no sector_size: 512-byte sectors
    stack.direct = true;
    let variants = vec![
        Variant::new("pool", stack.clone()),
        Variant::new("inline", StackSpec { crypt_mode: CryptMode::Inline, ..stack }),
    ];
    let job = |qd: u32| timed(&format!("readwrite-4k-qd{qd}"), RwMode::ReadWrite, 4096, qd, o, 3.0, 0.5);
    let (qd1, qd32) = (job(1), job(32));
    let size = o.size(64 << 20);
    vec![Comparison {
        title: "dm-crypt-workqueue: crypto on the pool vs inline (seed 001)".into(),
        knob: "crypt-mode=pool (kcryptd workqueue) vs crypt-mode=inline (no_read_workqueue,no_write_workqueue)".into(),
        seed: Some(PRESETS[0].seed.into()),
        note: Some(format!(
            "the seed ran fio on an eMMC phone (librem5) with loops=100 over a 10M file; here {} of a preallocated \
             file opened O_DIRECT, time-based. Seed result: inline +33% read, +35% write bandwidth at QD1.",
            format_size(size)
        )),
        variants,
        points: vec![Point::one("QD1", qd1), Point::one("QD32", qd32)],
        repetitions: o.reps(3),
        volume_size: size,
    }]
}

fn iv_sector_size(o: &PresetOptions) -> Vec<Comparison> {
    let v = |name: &str, cipher: &str, bits: u32, sector: u32| {
        Variant::new(
            name,
            StackSpec {
                cipher: cipher.into(),
                key_bits: bits,
                sector_size: sector,
                ..StackSpec::crypt(CryptMode::Auto)
            },
        )
    };
    let variants = vec![
        v("xts-512", "aes-xts-plain64", 512, 512),
        v("xts-4096", "aes-xts-plain64", 512, 4096),
        v("essiv-512", "aes-cbc-essiv:sha256", 256, 512),
        v("essiv-4096", "aes-cbc-essiv:sha256", 256, 4096),
    ];
    let size = o.size(128 << 20);
    let job = |name: &str, rw| timed(name, rw, 4096, 1, o, 2.0, 0.25);
    vec![Comparison {
        title: "iv-sector-size: 512 vs 4096-byte sectors, plain64 vs essiv (seed 003)".into(),
        knob: "sector_size 512/4096 × aes-xts-plain64 / aes-cbc-essiv:sha256".into(),
        seed: Some(PRESETS[1].seed.into()),
        note: Some(
            "the seed measured software AES under qemu and a CryptoCell accelerator; here AES-NI via aws-lc on a \
             buffered file, so per-sector IV and call overhead is what differs. Seed: +5.7% sequential with 4096."
                .into(),
        ),
        variants,
        points: vec![
            Point { label: "dd-seq-4k".into(), jobs: vec![job("dd-write-4k", RwMode::Write), job("dd-read-4k", RwMode::Read)] },
            Point {
                label: "fio-rand-4k".into(),
                jobs: vec![job("randwrite-4k", RwMode::RandWrite), job("randread-4k", RwMode::RandRead)],
            },
        ],
        repetitions: o.reps(2),
        volume_size: size,
    }]
}

fn ext4_parallel_dio(o: &PresetOptions) -> Vec<Comparison> {
    let mut stack = StackSpec::crypt(CryptMode::Auto);
    stack.direct = true;
    let with = |name: &str, lock: &str| {
        let mut s = stack.clone();
        s.set("lock", lock).expect("known lock kind");
        Variant::new(name, s)
    };
    let variants = vec![with("none", "none"), with("range", "range"), with("rwlock", "rwlock")];
    let points = [4u64 << 10, 16 << 10, 64 << 10, 512 << 10, 1 << 20]
        .into_iter()
        .map(|bs| {
            let mut j = timed(&format!("randrw-{}", format_size(bs)), RwMode::RandRw, bs, 1, o, 2.0, 0.5);
            j.numjobs = 8;
            Point::one(format_size(bs), j)
        })
        .collect();
    vec![Comparison {
        title: "ext4-parallel-dio: lock granularity under mixed random I/O (seed 002)".into(),
        knob: "lock=none / lock=range (RangeLocked) / lock=rwlock (reads shared, writes exclusive: the inode lock)".into(),
        seed: Some(PRESETS[2].seed.into()),
        note: Some(
            "the seed: ext4 on an Intel P3600 NVMe, size=20G, runtime=600; w/ parallel DIO reads (rwlock here) \
             READ 30.9 MB/s vs 117.9 MB/s w/o at 4k, the gap closing to 1.2x at 1M. Here crypt over a 256M \
             O_DIRECT file on a 2-core VM."
                .into(),
        ),
        variants,
        points,
        repetitions: o.reps(2),
        volume_size: o.size(256 << 20),
    }]
}

fn integrity_ahash(o: &PresetOptions) -> Vec<Comparison> {
    let v = |name: &str, hash: &str, parallel: bool| {
        let mut s = StackSpec::default();
        s.set("stack", "integrity").expect("known kind");
        s.direct = true;
        s.integrity.hash = hash.into();
        s.integrity.parallel_hash = parallel;
        Variant::new(name, s)
    };
    let mut write = timed("dd-write-4k-sync", RwMode::Write, 4096, 1, o, 3.0, 0.0);
    write.sync = true;
    let read = timed("dd-read-4k", RwMode::Read, 4096, 1, o, 3.0, 0.0);
    vec![Comparison {
        title: "integrity-ahash: inline vs parallel tag hashing (seed 000)".into(),
        knob: "parallel-hash=0 (shash) vs parallel-hash=1 (ahash), sha256 and hmac-sha256".into(),
        seed: Some(PRESETS[3].seed.into()),
        note: Some("format speed will be measured once the integrity format plan exists.".into()),
        variants: vec![
            v("sha256", "sha256", false),
            v("sha256-par", "sha256", true),
            v("hmac", "hmac-sha256", false),
            v("hmac-par", "hmac-sha256", true),
        ],
        points: vec![Point { label: "dd-4k".into(), jobs: vec![write, read] }],
        repetitions: o.reps(3),
        volume_size: o.size(128 << 20),
    }]
}

fn integrity_rmw(o: &PresetOptions) -> Vec<Comparison> {
    let v = |name: &str, buffer_sectors: u32| {
        let mut s = StackSpec::default();
        s.set("stack", "integrity").expect("known kind");
        s.direct = true;
        s.integrity.hash = "crc32c".into();
        s.integrity.mode = "bitmap".into();
        s.integrity.buffer_sectors = buffer_sectors;
        Variant::new(name, s)
    };
    let job = |bs: u64| {
        let mut j = timed(&format!("dd-write-{}", format_size(bs)), RwMode::Write, bs, 1, o, 3.0, 0.0);
        j.end_fsync = true;
        Point::one(format_size(bs), j)
    };
    vec![Comparison {
        title: "integrity-rmw: metadata buffer size in bitmap mode (seed 004)".into(),
        knob: "buffer_sectors=1 vs buffer_sectors=128 (bitmap mode, crc32c)".into(),
        seed: Some(PRESETS[4].seed.into()),
        note: None,
        variants: vec![v("buf-1", 1), v("buf-128", 128)],
        points: vec![job(64 << 10), job(4 << 20)],
        repetitions: o.reps(3),
        volume_size: o.size(256 << 20),
    }]
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::compare::check;
    use crate::BenchError;

    #[test]
    fn every_preset_is_well_formed_and_the_ready_ones_check() {
        for p in all() {
            let cs = p.comparisons(&PresetOptions::default());
            assert!(!cs.is_empty(), "{}", p.name);
            for c in &cs {
                assert!(c.variants.len() >= 2, "{}", p.name);
                match (p.needs, check(c)) {
                    (None, Ok(())) => {}
                    (Some(_), Err(BenchError::NotImplemented(m))) => {
                        assert!(m.contains("dm-integrity"), "{m}")
                    }
                    (n, r) => panic!("{}: needs {n:?} but check gave {r:?}", p.name),
                }
            }
        }
        assert!(find("dm-crypt-workqueue").is_some());
        assert!(find("nope").is_none());
        let l = list_text();
        assert!(l.contains("integrity-rmw") && l.contains("not implemented yet"));
    }

    #[test]
    fn overrides_scale_presets() {
        let o = PresetOptions {
            runtime: Some(Duration::from_millis(100)),
            repetitions: Some(1),
            ..Default::default()
        };
        let c = &find("ext4-parallel-dio").unwrap().comparisons(&o)[0];
        assert_eq!(c.repetitions, 1);
        assert_eq!(c.points.len(), 5);
        assert!(c
            .points
            .iter()
            .all(|p| p.jobs[0].runtime == Some(Duration::from_millis(100)) && p.jobs[0].numjobs == 8));
    }
}
