//! Crash consistency of the journal (J) and bitmap (B) modes.
//!
//! A `CrashDevice` loses power at the N-th flush, for every N a workload reaches (pass 1
//! counts them, pass 2 crashes at each). After reopening, every block must read without
//! error and hold either the content it had at the last flush the workload saw complete
//! before the power loss, or one written after it (old or new, never neither); in mode J the
//! journal replay gives each block a valid tag, in mode B the dirty regions' tags are
//! recalculated. The disk's cache may also have written back any subset of the unflushed
//! blocks (`crash_keeping_some`).

use crate::integrity_common;

use std::collections::HashSet;
use std::sync::Arc;

use blockdev::{BlockDevice, MemDevice, WriteFlags};
use integrity_common::Shape;
use targets::integrity::{IntegrityTarget, Mode};
use testkit::pattern::splitmix64;
use testkit::CrashDevice;

const BLOCKS: u64 = 64;

#[derive(Debug, Clone, Copy)]
enum Op {
    Write { block: u64, n: u64, seed: u64, fua: bool },
    Flush,
}

fn workload(seed: u64) -> Vec<Op> {
    let mut ops = Vec::new();
    let mut x = seed;
    for i in 0..40 {
        x = splitmix64(x);
        if i % 5 == 4 {
            ops.push(Op::Flush);
        } else {
            let n = 1 + x % 24;
            let block = (x >> 8) % (BLOCKS - n + 1);
            ops.push(Op::Write { block, n, seed: x, fua: (x >> 40).is_multiple_of(7) });
        }
    }
    ops
}

fn block_data(seed: u64, block: u64, bs: usize) -> Vec<u8> {
    testkit::pattern::pattern(seed ^ block.wrapping_mul(0x9e37), 0, bs)
}

/// Runs `ops` on a target over `dev`; returns, per block, the content at the last flush that
/// completed before the crash and every content written after it.
fn run(shape: &Shape, mode: Mode, dev: Arc<CrashDevice>, ops: &[Op]) -> Vec<HashSet<Vec<u8>>> {
    let bs = shape.block as usize;
    let t = shape.open(dev.clone(), mode);
    let mut cur: Vec<Vec<u8>> = (0..BLOCKS).map(|_| vec![0u8; bs]).collect();
    let mut allowed: Vec<HashSet<Vec<u8>>> = cur.iter().map(|c| HashSet::from([c.clone()])).collect();
    for op in ops {
        match *op {
            Op::Write { block, n, seed, fua } => {
                let data: Vec<u8> = (block..block + n).flat_map(|b| block_data(seed, b, bs)).collect();
                let flags = if fua { WriteFlags::FUA } else { WriteFlags::empty() };
                t.write_at(block * bs as u64, &data, flags).unwrap();
                for b in block..block + n {
                    cur[b as usize] = block_data(seed, b, bs);
                    allowed[b as usize].insert(cur[b as usize].clone());
                }
                if fua && !dev.has_crashed() {
                    for b in block..block + n {
                        allowed[b as usize] = HashSet::from([cur[b as usize].clone()]);
                    }
                }
            }
            Op::Flush => {
                t.flush().unwrap();
                if !dev.has_crashed() {
                    allowed = cur.iter().map(|c| HashSet::from([c.clone()])).collect();
                }
            }
        }
    }
    t.abandon();
    allowed
}

fn check_after_crash(shape: &Shape, mode: Mode, image: MemDevice, allowed: &[HashSet<Vec<u8>>], what: &str) {
    let bs = shape.block as usize;
    let image = MemDevice::from_vec(image.to_vec(), 512);
    let t =
        IntegrityTarget::open(image, shape.config(mode)).unwrap_or_else(|e| panic!("{what}: reopen: {e}"));
    let mut buf = vec![0u8; bs];
    for (b, ok) in allowed.iter().enumerate() {
        t.read_at((b * bs) as u64, &mut buf).unwrap_or_else(|e| panic!("{what}: block {b}: {e}"));
        assert!(ok.contains(&buf), "{what}: block {b} is neither the flushed nor a later content");
    }
    assert_eq!(t.status().mismatches, 0);
}

fn crash_at_every_flush(shape: Shape, mode: Mode) {
    let base = shape.mem(1 << 20).to_vec();
    // In mode B a block torn by the disk (half of a 4 KiB block written) is recalculated as
    // it is: "old or new" holds per atomically written unit, so the disk writes whole blocks.
    // The journal (mode J) survives torn blocks: its disk has 512-byte units.
    let unit = if mode == Mode::Bitmap { shape.block } else { 512 };
    for seed in [1u64, 2] {
        let ops = workload(seed);
        let probe = Arc::new(CrashDevice::from_vec(base.clone(), unit));
        run(&shape, mode, probe.clone(), &ops);
        let flushes = probe.flushes();
        assert!(flushes > 5, "the workload reached only {flushes} flushes");
        for n in 1..=flushes {
            let dev = Arc::new(CrashDevice::from_vec(base.clone(), unit).crash_at_flush(n));
            let allowed = run(&shape, mode, dev.clone(), &ops);
            let what = format!("{} {mode:?} seed {seed} crash at flush {n}/{flushes}", shape.alg);
            check_after_crash(&shape, mode, dev.crash(), &allowed, &what);
            check_after_crash(&shape, mode, dev.crash_keeping_some(n), &allowed, &format!("{what} (+cache)"));
        }
    }
}

fn small_journal(alg: &'static str, block: u32) -> Shape {
    let mut s = Shape::new(alg, block);
    // Three sections: the workload wraps the journal and copies it out many times.
    s.journal_sectors = Some(3 * 200);
    s.interleave = 64;
    s
}

#[test]
fn journal_mode_survives_a_crash_at_every_flush() {
    crash_at_every_flush(small_journal("crc32c", 512), Mode::Journal);
    crash_at_every_flush(small_journal("sha256", 4096), Mode::Journal);
}

#[test]
fn bitmap_mode_recalculates_after_a_crash_at_every_flush() {
    let mut s = small_journal("crc32c", 512);
    s.journal_sectors = None;
    crash_at_every_flush(s, Mode::Bitmap);
    crash_at_every_flush(Shape::new("hmac-sha256", 4096), Mode::Bitmap);
}
