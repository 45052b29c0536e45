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
//! | `integrity-ahash` | 000 | tag hashing inline vs on the pool (hash-mode), sha256 / hmac-sha256 |
//! | `integrity-rmw` | 004 | `buffer_sectors` 1 vs 128 × read-modify-write forced on / off, bitmap mode |
//! | `integrity-modes` | (issue 4) | journal vs bitmap vs direct mode, beside crypt-only and raw |
//! | `fs-untar` | 004 | ext4 on the FUSE file: mkfs, untar, rm; bitmap vs journal × `buffer_sectors` 1 vs 128 |
//! | `fs-randrw` | 002 | ext4 on the FUSE file: fio randrw numjobs=8 on one file; raw, crypt, integrity, AEAD |
//!
//! A preset is a list of comparisons of jobs, and optionally a format-speed comparison
//! ([`crate::format_speed`]) run first; the `fs-*` presets are a filesystem comparison
//! ([`crate::fs_workload`]) instead, which needs root, FUSE, loop devices and the tools
//! ([`crate::fs_workload::host_ready`]).

use std::path::PathBuf;
use std::time::Duration;

use targets::CryptMode;

use crate::compare::{Comparison, Point, Variant};
use crate::format_speed::FormatComparison;
use crate::fs_workload::{FsComparison, FsWorkload, TreeSource};
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
    /// The tree the `fs-untar` preset unpacks (a tarball; default: a generated one).
    pub tree: Option<PathBuf>,
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
    format: Option<fn(&PresetOptions) -> FormatComparison>,
    fs: Option<fn(&PresetOptions) -> FsComparison>,
}

impl Preset {
    /// The comparisons it runs.
    pub fn comparisons(&self, o: &PresetOptions) -> Vec<Comparison> {
        (self.build)(o)
    }

    /// The format-speed comparison it runs before them, if any.
    pub fn format_comparison(&self, o: &PresetOptions) -> Option<FormatComparison> {
        self.format.map(|f| f(o))
    }

    /// The filesystem comparison it runs (instead of job comparisons), if any.
    pub fn fs_comparison(&self, o: &PresetOptions) -> Option<FsComparison> {
        self.fs.map(|f| f(o))
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

const PRESETS: [Preset; 8] = [
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
        format: None,
        fs: None,
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
        format: None,
        fs: None,
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
        format: None,
        fs: None,
    },
    Preset {
        name: "integrity-ahash",
        seed: "000 dm-integrity \"Implement asynch digest support\" (s390, 2025): integritysetup format speed and \
               dd 4k oflag=direct,sync write / iflag=direct read, sha256 and hmac-sha256, shash vs ahash",
        knob: "where tags are computed: hash-mode=inline (on the request's thread: shash) vs hash-mode=pool \
               (handed to the hashing pool, split across its threads: the ahash offload) vs hash-mode=auto \
               (inline up to 64 KiB); sha256 and hmac-sha256",
        runs: "format speed (integritysetup format with its wipe, 1G, 3 repetitions) beside a raw sequential \
               write; then journal mode, 4096-byte blocks, buffered backing (the seed's was tmpfs: reads come \
               from memory; --dir /dev/shm makes flushes free too), 128M volume: dd-like sequential writes with \
               sync=1 (O_SYNC: FUA per write) then reads, QD1, bs=4k (the seed) and bs=1M, 2 s per job, \
               3 repetitions",
        needs: None,
        build: integrity_ahash,
        format: Some(integrity_ahash_format),
        fs: None,
    },
    Preset {
        name: "integrity-rmw",
        seed: "004 dm-integrity \"Prevent RMW for full metadata buffer writes\" (Lukas Straub, 2020): \
               integritysetup format --no-wipe --interleave-sectors 65536 -t 4 -s 512 -I crc32c -B, open \
               --buffer-sectors=1, dd 64K and 4M oflag=direct conv=fsync; 10.7 -> 104 MB/s on a 5400 rpm HDD",
        knob: "metadata buffer size buffer_sectors=1 vs 128 × rmw=1 (every metadata buffer read before it is \
               written: the kernel before the patch) vs rmw=0 (a buffer a write covers whole is not read)",
        runs: "bitmap mode, crc32c, tag size 4, 512-byte blocks, interleave_sectors=65536, O_DIRECT backing, \
               512M volume reopened before every job (cold metadata cache, like a fresh open); one dd-like pass \
               of sequential writes over the whole volume, bs=64k and bs=4M, QD1, end_fsync, 3 repetitions",
        needs: None,
        build: integrity_rmw,
        format: None,
        fs: None,
    },
    Preset {
        name: "integrity-modes",
        seed: "none (issue 4's BENCHMARKS.md point): journal, bitmap and direct mode beside crypt-only and raw",
        knob: "the stack: raw file, crypt (aes-xts-plain64, 4096-byte sectors), dm-integrity (crc32c, 4096-byte \
               blocks) in mode J (data written twice: journal, then copy-out), B (bitmap of dirty regions) and D \
               (no crash consistency)",
        runs: "buffered backing, 256M volumes, in-process: 1M sequential write then read at QD8, 4k random write \
               then read at QD1 and at QD32, 2 s per job after 0.5 s ramp, 3 repetitions",
        needs: None,
        build: integrity_modes,
        format: None,
        fs: None,
    },
    Preset {
        name: "fs-untar",
        seed: "004 dm-integrity \"Prevent RMW for full metadata buffer writes\" (Lukas Straub, 2020), the SSD \
               follow-up: integritysetup format --no-wipe -I crc32c -B, mkfs.ext4, tar -xJf linux-5.5.4.tar.xz, \
               rm -rf, each timed; 18.7 / 18.4 s untar and 3.2 / 3.2 s rm without / with the patch",
        knob: "dm-integrity mode B (bitmap) vs J (journal) × buffer_sectors=1 vs 128, under a real ext4",
        runs: "crc32c, 512-byte blocks, O_DIRECT backing, 512M volume served as a FUSE file on a loop device \
               (in-process server); mkfs.ext4 -E nodiscard, then a generated 96M source-like tree (or --tree \
               TARBALL) unpacked then sync, then rm -rf then sync; 3 repetitions; needs root, /dev/fuse, \
               fusermount3, losetup, mkfs.ext4, tar",
        needs: None,
        build: no_jobs,
        format: None,
        fs: Some(fs_untar),
    },
    Preset {
        name: "fs-randrw",
        seed: "002 linux-ext4 \"performance regression with ext4: Allow parallel DIO reads\": fio randrw psync \
               direct numjobs=8 on ext4, bs 4k..1M",
        knob: "the stack under a real ext4: raw file, crypt (aes-xts-plain64), dm-integrity J (crc32c), LUKS2 \
               AEAD (aes-xts-plain64 + hmac-sha256)",
        runs: "O_DIRECT backing, 512M volume served as a FUSE file on a loop device (in-process server), \
               mkfs.ext4, fio rw=randrw rwmixread=50 ioengine=psync direct=1 numjobs=8 on one 128M file, bs 4k \
               64k 1M, 2 s per cell after 0.5 s ramp, 2 repetitions; needs root, /dev/fuse, fusermount3, \
               losetup, mkfs.ext4, fio",
        needs: None,
        build: no_jobs,
        format: None,
        fs: Some(fs_randrw),
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

fn integrity(hash: &str, mode: &str, block: &str) -> StackSpec {
    let mut s = StackSpec::default();
    for (k, v) in
        [("stack", "integrity"), ("integrity-alg", hash), ("integrity-mode", mode), ("block-size", block)]
    {
        s.set(k, v).expect("known integrity option");
    }
    s
}

fn with(mut s: StackSpec, key: &str, value: &str) -> StackSpec {
    s.set(key, value).expect("known stack option");
    s
}

const AHASH_HASHES: [(&str, &str); 2] = [("sha256", "sha256"), ("hmac", "hmac-sha256")];

fn integrity_ahash_format(o: &PresetOptions) -> FormatComparison {
    let mut variants = vec![Variant::new("raw", StackSpec::raw())];
    for (short, hash) in AHASH_HASHES {
        for mode in ["inline", "pool"] {
            variants.push(Variant::new(
                format!("{short}-{mode}"),
                with(integrity(hash, "J", "4096"), "hash-mode", mode),
            ));
        }
    }
    let size = o.size(1 << 30);
    FormatComparison {
        title: "integrity-ahash: format speed, tags inline vs on the pool (seed 000)".into(),
        knob: "hash-mode=inline vs hash-mode=pool while the format wipes (zeroes with valid tags), sha256 and \
               hmac-sha256; raw = sequential 1M writes of the same size"
            .into(),
        seed: Some(PRESETS[3].seed.into()),
        note: Some(format!(
            "{} volumes on buffered files (both flushed at the end). The wipe zeroes the data area with \
             fallocate(ZERO_RANGE) (extent flags, no data written) and writes every tag, so it measures hashing \
             and tag writes; raw writes every byte. Seed (z16, tmpfs loop, 15 GiB): shash 1.8 / 1.7 GiB/s, \
             ahash 1.7 / 1.6 GiB/s (sha256 / hmac-sha256).",
            format_size(size)
        )),
        variants,
        repetitions: o.reps(3),
        volume_size: size,
    }
}

fn integrity_ahash(o: &PresetOptions) -> Vec<Comparison> {
    let mut variants = Vec::new();
    for (short, hash) in AHASH_HASHES {
        for mode in ["inline", "pool", "auto"] {
            let s = with(integrity(hash, "J", "4096"), "hash-mode", mode);
            variants.push(Variant::new(format!("{short}-{mode}"), s));
        }
    }
    let dd = |bs: u64| {
        let mut write =
            timed(&format!("dd-write-{}-sync", format_size(bs)), RwMode::Write, bs, 1, o, 2.0, 0.0);
        write.sync = true;
        let read = timed(&format!("dd-read-{}", format_size(bs)), RwMode::Read, bs, 1, o, 2.0, 0.0);
        Point { label: format!("dd-{}", format_size(bs)), jobs: vec![write, read] }
    };
    vec![Comparison {
        title: "integrity-ahash: tags inline vs on the pool (seed 000)".into(),
        knob: "hash-mode=inline (shash) vs pool (ahash-like offload) vs auto, sha256 and hmac-sha256".into(),
        seed: Some(PRESETS[3].seed.into()),
        note: Some(
            "the seed: 8G tmpfs-backed loop device, dd count=1M (4 GiB); shash WRITE 94.4 / 95.0 MB/s, READ \
             224 / 224 MB/s; ahash WRITE 103 / 97.5 MB/s, READ 264 / 260 MB/s (sha256 / hmac-sha256). Here \
             journal mode, 4096-byte blocks, a buffered backing file (reads from the page cache, as the seed's \
             from tmpfs; every sync write commits the journal and flushes the file, which on a disk costs a \
             device flush: run with --dir /dev/shm for the seed's free flushes), time-based. A 4k request is \
             one block: one tag, nothing to split, so pool only adds a hand-off; at 1M there are 256 tags to \
             split across the pool's threads."
                .into(),
        ),
        variants,
        points: vec![dd(4096), dd(1 << 20)],
        repetitions: o.reps(3),
        volume_size: o.size(128 << 20),
    }]
}

fn integrity_rmw(o: &PresetOptions) -> Vec<Comparison> {
    let v = |name: &str, buffer_sectors: &str, rmw: &str| {
        let mut s = integrity("crc32c", "B", "512");
        for (k, val) in [
            ("tag-size", "4"),
            ("interleave-sectors", "65536"),
            ("buffer-sectors", buffer_sectors),
            ("rmw", rmw),
            ("direct", "1"),
            ("reopen", "1"),
        ] {
            s.set(k, val).expect("known stack option");
        }
        Variant::new(name, s)
    };
    let job = |bs: u64| {
        // One pass over the volume, as dd count=: the first write to each metadata buffer is
        // the one that may read it. A runtime cap only.
        let mut j = JobSpec::new(format!("dd-write-{}", format_size(bs)), RwMode::Write, bs);
        j.runtime = Some(o.runtime(60.0));
        j.end_fsync = true;
        Point::one(format_size(bs), j)
    };
    let size = o.size(512 << 20);
    vec![Comparison {
        title: "integrity-rmw: metadata buffer size and read-modify-write in bitmap mode (seed 004)".into(),
        knob: "buffer_sectors=1 vs 128 × rmw=1 (read every buffer before writing it) vs rmw=0 (skip the read \
               when a write covers the buffer whole)"
            .into(),
        seed: Some(PRESETS[4].seed.into()),
        note: Some(format!(
            "the seed: 4 GiB dd onto a 5400 rpm HDD, where each metadata read between data writes costs a seek \
             (10.7 MB/s without the patch, 104 MB/s with); on an SSD with buffer_sectors=128, 149 vs 154 MB/s \
             (64K) and 190 vs 187 MB/s (4M). Here one pass over a {} volume on a virtual disk, O_DIRECT backing; \
             with 512-byte blocks and 4-byte tags one 512-byte buffer (buffer_sectors=1) holds the tags of 64 KiB \
             of data, so every 64k write covers one buffer whole. Bandwidth excludes the end_fsync (the \
             write-back tags are written there).",
            format_size(size)
        )),
        variants: vec![v("buf1", "1", "0"), v("buf1-rmw", "1", "1"), v("buf128", "128", "0"), v("buf128-rmw", "128", "1")],
        points: vec![job(64 << 10), job(4 << 20)],
        repetitions: o.reps(3),
        volume_size: size,
    }]
}

fn integrity_modes(o: &PresetOptions) -> Vec<Comparison> {
    let variants = vec![
        Variant::new("raw", StackSpec::raw()),
        Variant::new("crypt", StackSpec::crypt(CryptMode::Auto)),
        Variant::new("integ-J", integrity("crc32c", "J", "4096")),
        Variant::new("integ-B", integrity("crc32c", "B", "4096")),
        Variant::new("integ-D", integrity("crc32c", "D", "4096")),
    ];
    let pair = |label: &str, w: RwMode, r: RwMode, bs: u64, qd: u32| {
        let job = |rw: RwMode| timed(&format!("{rw}-{}-qd{qd}", format_size(bs)), rw, bs, qd, o, 2.0, 0.5);
        Point { label: label.into(), jobs: vec![job(w), job(r)] }
    };
    vec![Comparison {
        title: "integrity-modes: journal vs bitmap vs direct, beside crypt and raw".into(),
        knob: "stack=raw / crypt / integrity with integrity-mode=J, B, D (crc32c, 4096-byte blocks)".into(),
        seed: None,
        note: Some(format!(
            "{} volumes on buffered files, in-process (no transport). Journal mode writes every block twice \
             (journal, then its place) and commits the journal on flush/FUA, at the watermark and on a timer; \
             bitmap mode sets a bit (written and flushed) before the first write to a 16 MiB region.",
            format_size(o.size(256 << 20))
        )),
        variants,
        points: vec![
            pair("seq-1m-qd8", RwMode::Write, RwMode::Read, 1 << 20, 8),
            pair("rand-4k-qd1", RwMode::RandWrite, RwMode::RandRead, 4096, 1),
            pair("rand-4k-qd32", RwMode::RandWrite, RwMode::RandRead, 4096, 32),
        ],
        repetitions: o.reps(3),
        volume_size: o.size(256 << 20),
    }]
}

/// A preset that runs no job comparisons (only its filesystem comparison).
fn no_jobs(_: &PresetOptions) -> Vec<Comparison> {
    Vec::new()
}

fn fs_untar(o: &PresetOptions) -> FsComparison {
    let v = |name: &str, mode: &str, buffer_sectors: &str| {
        let mut s = with(integrity("crc32c", mode, "512"), "buffer-sectors", buffer_sectors);
        s.direct = true;
        Variant::new(name, s)
    };
    let size = o.size(512 << 20);
    let tree = match &o.tree {
        Some(p) => TreeSource::Tarball(p.clone()),
        None => TreeSource::Generated(size / 16 * 3),
    };
    FsComparison {
        title: "fs-untar: mkfs.ext4, untar, rm -rf on dm-integrity, bitmap vs journal (seed 004)".into(),
        knob: "integrity-mode=B / J × buffer-sectors=128 / 1 (crc32c, 512-byte blocks)".into(),
        seed: Some(PRESETS[6].seed.into()),
        note: Some(format!(
            "the seed: a 4 GiB dm-integrity (bitmap, crc32c, 512-byte sectors) on a Samsung 850 EVO, a Linux \
             5.5.4 tree (about 1 GiB unpacked). Here a {} volume on an O_DIRECT file, served in-process as a \
             FUSE file under a loop device, ext4 made by the host kernel; the host's page cache absorbs the \
             unpack, so each phase ends with sync -f (flushes reach the volume through the loop device and \
             FUSE). Integrity volumes are written once before mkfs (untimed): unwritten blocks have no tag.",
            format_size(size)
        )),
        variants: vec![
            v("B-buf128", "B", "128"),
            v("B-buf1", "B", "1"),
            v("J-buf128", "J", "128"),
            v("J-buf1", "J", "1"),
        ],
        workload: FsWorkload::Untar { tree },
        repetitions: o.reps(3),
        volume_size: size,
    }
}

fn fs_randrw(o: &PresetOptions) -> FsComparison {
    let direct = |mut s: StackSpec| {
        s.direct = true;
        s
    };
    let size = o.size(512 << 20);
    FsComparison {
        title: "fs-randrw: fio randrw numjobs=8 on one ext4 file, by stack (seed 002)".into(),
        knob: "stack=raw / crypt / integrity (J, crc32c, 4096-byte blocks) / luks2-integrity (hmac-sha256)"
            .into(),
        seed: Some(PRESETS[7].seed.into()),
        note: Some(format!(
            "the seed: ext4 on an Intel P3600 NVMe, 8 jobs with their own 20G files, runtime=600, kernel 5.2 \
             with and without parallel DIO reads: READ 30.9 vs 117.9 MB/s at 4k. Here the 8 jobs share one \
             file of a {} ext4 (the inode lock is the kernel's), on a loop device over the FUSE file of each \
             stack (in-process server, O_DIRECT backing): what each layer costs under mixed direct I/O.",
            format_size(size)
        )),
        variants: vec![
            Variant::new("raw", direct(StackSpec::raw())),
            Variant::new("crypt", direct(StackSpec::crypt(CryptMode::Auto))),
            Variant::new("integ-J", direct(integrity("crc32c", "J", "4096"))),
            Variant::new("aead", direct(with(StackSpec::default(), "stack", "luks2-integrity"))),
        ],
        workload: FsWorkload::Fio {
            bs: vec![4 << 10, 64 << 10, 1 << 20],
            numjobs: 8,
            file_size: (size / 4).max(8 << 20),
            runtime: o.runtime(2.0),
            ramp: o.ramp(0.5),
        },
        repetitions: o.reps(2),
        volume_size: size,
    }
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
            match p.fs_comparison(&PresetOptions::default()) {
                Some(f) => crate::fs_workload::check(&f).unwrap(),
                None => assert!(!cs.is_empty(), "{}", p.name),
            }
            for c in &cs {
                assert!(c.variants.len() >= 2, "{}", p.name);
                match (p.needs, check(c)) {
                    (None, Ok(())) => {}
                    (Some(_), Err(BenchError::NotImplemented(_))) => {}
                    (n, r) => panic!("{}: needs {n:?} but check gave {r:?}", p.name),
                }
            }
            if let Some(f) = p.format_comparison(&PresetOptions::default()) {
                crate::format_speed::check(&f).unwrap();
            }
        }
        assert!(find("dm-crypt-workqueue").is_some());
        assert!(find("nope").is_none());
        let l = list_text();
        assert!(l.contains("integrity-rmw") && !l.contains("not implemented yet"));
        assert!(find("integrity-ahash").unwrap().format_comparison(&PresetOptions::default()).is_some());
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
