//! Quick in-process throughput figures for the integrity engine beside raw and crypt-only
//! stacks, and each engine knob on and off. Not a test: run by hand, in release mode:
//!
//! ```text
//! cargo test --release -p targets --test targets integrity_bench:: -- --ignored --nocapture
//! ```
//! Single-threaded sequential 1 MiB requests (and 4 KiB random writes) over memory, so the
//! figures are CPU cost per byte; the RMW and format figures use files (O_DIRECT for RMW).

use crate::integrity_common;

use std::sync::Arc;
use std::time::Instant;

use blockdev::{BlockDevice, FileDevice, FileOptions, MemDevice, WriteFlags};
use integrity_common::{pattern, xts4096 as crypt, Shape};
use targets::integrity::{HashMode, IntegrityTarget, Mode};

const VOL: u64 = 512 << 20;
const IO: u64 = 256 << 20;

fn mib_s(bytes: u64, secs: f64) -> f64 {
    bytes as f64 / secs / (1 << 20) as f64
}

/// Best of three runs of [`measure_once`], after a warm-up write over the range (first touch
/// of memory pages, metadata buffers).
fn measure(dev: &dyn BlockDevice) -> (f64, f64, f64) {
    let data = pattern(1 << 20, 9);
    let mut off = 0;
    while off < IO {
        dev.write_at(off, &data, WriteFlags::empty()).unwrap();
        off += data.len() as u64;
    }
    dev.flush().unwrap();
    let mut best = (0f64, 0f64, 0f64);
    for _ in 0..3 {
        let m = measure_once(dev);
        best = (best.0.max(m.0), best.1.max(m.1), best.2.max(m.2));
    }
    best
}

/// (seq write MiB/s, seq read MiB/s, 4k random write MiB/s)
fn measure_once(dev: &dyn BlockDevice) -> (f64, f64, f64) {
    let chunk = 1usize << 20;
    let data = pattern(chunk, 1);
    let t = Instant::now();
    let mut off = 0;
    while off < IO {
        dev.write_at(off, &data, WriteFlags::empty()).unwrap();
        off += chunk as u64;
    }
    dev.flush().unwrap();
    let w = mib_s(IO, t.elapsed().as_secs_f64());
    let mut buf = vec![0u8; chunk];
    let t = Instant::now();
    let mut off = 0;
    while off < IO {
        dev.read_at(off, &mut buf).unwrap();
        off += chunk as u64;
    }
    let r = mib_s(IO, t.elapsed().as_secs_f64());
    let blocks = IO / 4096;
    let small = pattern(4096, 2);
    let n = 20_000u64;
    let t = Instant::now();
    let mut x = 12345u64;
    for _ in 0..n {
        x = testkit::pattern::splitmix64(x);
        dev.write_at((x % blocks) * 4096, &small, WriteFlags::empty()).unwrap();
    }
    dev.flush().unwrap();
    let rw = mib_s(n * 4096, t.elapsed().as_secs_f64());
    (w, r, rw)
}

fn integrity(
    shape: &Shape,
    mode: Mode,
    f: impl FnOnce(&mut targets::IntegrityConfig),
) -> IntegrityTarget<Arc<MemDevice>> {
    let dev = shape.mem(VOL + (64 << 20));
    let mut cfg = shape.config(mode);
    f(&mut cfg);
    IntegrityTarget::open(dev, cfg).unwrap()
}

fn row(label: &str, (w, r, rw): (f64, f64, f64)) {
    println!("{label:<44} {w:>9.0} {r:>9.0} {rw:>9.0}");
}

#[test]
#[ignore = "benchmark: run by hand in release mode"]
fn throughput_by_stack_and_knob() {
    println!("\n{:<44} {:>9} {:>9} {:>9}", "stack (MiB/s, 1 thread)", "seq-wr", "seq-rd", "4k-rnd-wr");
    row("raw mem", measure(&MemDevice::new(VOL, 512)));
    row("crypt aes-xts-plain64/4096 over mem", measure(&crypt(MemDevice::new(VOL, 512))));
    let c4k = Shape::new("crc32c", 4096);
    for mode in [Mode::Direct, Mode::Bitmap, Mode::Journal] {
        row(&format!("integrity crc32c/4096 {mode:?}"), measure(&integrity(&c4k, mode, |_| {})));
    }
    row("integrity crc32c/512 Direct", measure(&integrity(&Shape::new("crc32c", 512), Mode::Direct, |_| {})));
    let s4k = Shape::new("sha256", 4096);
    for hm in [HashMode::Inline, HashMode::Pool, HashMode::Auto] {
        row(
            &format!("integrity sha256/4096 Direct hash={hm:?}"),
            measure(&integrity(&s4k, Mode::Direct, |c| c.hash_mode = hm)),
        );
    }
    row("integrity sha256/4096 Journal", measure(&integrity(&s4k, Mode::Journal, |_| {})));
    row("crypt over integrity crc32c/4096 Journal", measure(&crypt(integrity(&c4k, Mode::Journal, |_| {}))));
    row("crypt over integrity crc32c/4096 Bitmap", measure(&crypt(integrity(&c4k, Mode::Bitmap, |_| {}))));
}

#[test]
#[ignore = "benchmark: run by hand in release mode"]
fn rmw_avoidance_on_and_off_over_o_direct() {
    let dir = tempfile::tempdir_in(env!("CARGO_TARGET_TMPDIR")).unwrap();
    let mut shape = Shape::new("crc32c", 512);
    shape.interleave = 1 << 20;
    for skip in [true, false] {
        let path = dir.path().join(format!("rmw-{skip}.img"));
        let opts = FileOptions { direct: true, ..FileOptions::default() };
        let file = Arc::new(FileDevice::create(&path, 1 << 30, opts).unwrap());
        targets::integrity::format(&*file, &shape.format_options()).unwrap();
        let mut cfg = shape.config(Mode::Direct);
        cfg.skip_rmw = skip;
        cfg.buffer_sectors = 8; // 4 KiB buffers: the tags of 512 KiB of data
        let t = IntegrityTarget::open(file, cfg).unwrap();
        let data = pattern(1 << 20, 3);
        let total = 512u64 << 20;
        let start = Instant::now();
        let mut off = 0;
        while off < total {
            t.write_at(off, &data, WriteFlags::empty()).unwrap();
            off += data.len() as u64;
        }
        t.flush().unwrap();
        let s = t.status();
        println!(
            "\nO_DIRECT file, crc32c/512, 1 MiB sequential writes, skip_rmw={skip}: {:.0} MiB/s, {} metadata reads",
            mib_s(total, start.elapsed().as_secs_f64()),
            s.rmw_reads
        );
    }
}

#[test]
#[ignore = "benchmark: run by hand in release mode"]
fn format_speed_beside_raw_sequential_write() {
    let dir = tempfile::tempdir_in(env!("CARGO_TARGET_TMPDIR")).unwrap();
    let size = 2u64 << 30;
    // Raw: 1 MiB sequential writes of zeroes, then fsync.
    let path = dir.path().join("raw.img");
    let f = FileDevice::create(&path, size, FileOptions::default()).unwrap();
    let zero = vec![0u8; 1 << 20];
    let t = Instant::now();
    let mut off = 0;
    while off < size {
        f.write_at(off, &zero, WriteFlags::empty()).unwrap();
        off += zero.len() as u64;
    }
    f.flush().unwrap();
    println!(
        "\nraw sequential write of 2 GiB (1 MiB, fsync): {:.0} MiB/s",
        mib_s(size, t.elapsed().as_secs_f64())
    );
    drop(f);
    std::fs::remove_file(&path).unwrap();
    for (alg, block) in [("crc32c", 512), ("crc32c", 4096), ("sha256", 4096)] {
        let shape = Shape::new(alg, block);
        let path = dir.path().join(format!("fmt-{alg}-{block}.img"));
        let f = Arc::new(FileDevice::create(&path, size, FileOptions::default()).unwrap());
        let t = Instant::now();
        shape.format(f.clone());
        println!(
            "format + wipe of 2 GiB, {alg}/{block}: {:.0} MiB/s",
            mib_s(size, t.elapsed().as_secs_f64())
        );
        drop(f);
        std::fs::remove_file(&path).unwrap();
    }
}
