//! One suite for the [`BlockDevice`] contract, run on every device and every stack.
//!
//! "The same logic exercises every backend with only the constructor differing"
//! (cloud-hypervisor `formats/raw/tests.rs`). A crate runs it over its own stack with:
//!
//! ```
//! # use std::sync::Arc;
//! # use blockdev::{BlockDevice, MemDevice};
//! // A #[test] in your crate's tests/:
//! fn mem_device_conforms() {
//!     testkit::conformance::run_all(|| Arc::new(MemDevice::new(8 << 20, 512)) as Arc<dyn BlockDevice>);
//! }
//! # mem_device_conforms();
//! ```
//!
//! or, to name the stack in messages and skip a case with a written reason:
//!
//! ```
//! # use std::sync::Arc;
//! # use blockdev::{BlockDevice, MemDevice};
//! # use testkit::conformance::Conformance;
//! Conformance::new(|| Arc::new(MemDevice::new(1 << 20, 4096)) as Arc<dyn BlockDevice>)
//!     .label("mem-4k")
//!     .skip("concurrent_reads_see_whole_blocks", "example: this stack does not promise it")
//!     .run();
//! ```
//!
//! `make` is called once per case and must return a fresh device (or at least one nobody
//! else is using) of at least 16 logical blocks; 4–16 MiB exercises the multi-megabyte cases
//! fully. The suite never relies on initial contents: it writes before it reads. A device
//! with `Caps::READ_ONLY` runs only the cases that do not write, plus
//! `read_only_device_refuses_writes`.
//!
//! Every case runs even after one fails; the run then panics with every failure listed.

use std::panic::{catch_unwind, AssertUnwindSafe};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::thread;

use blockdev::{BlockDevice, BlockErrorKind, BlockResult, Caps, WriteFlags, ZeroFlags};

use crate::model::DiscardModel;
use crate::pattern::{fill, pattern, splitmix64};

type Make<'a> = dyn Fn() -> Arc<dyn BlockDevice> + 'a;

/// What a case needs from the device.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Needs {
    /// Runs on any device.
    Any,
    /// Needs a writable device.
    Writable,
    /// Needs a `Caps::READ_ONLY` device.
    ReadOnly,
}

/// A conformance case: a name (`<behaviour>_<condition>`) and a body that panics on failure.
struct Case {
    name: &'static str,
    needs: Needs,
    run: fn(&Ctx<'_>) -> Outcome,
}

enum Outcome {
    Passed,
    Skipped(String),
}

struct Ctx<'a> {
    make: &'a Make<'a>,
    discard: DiscardModel,
}

impl Ctx<'_> {
    fn dev(&self) -> Arc<dyn BlockDevice> {
        (self.make)()
    }
}

const CASES: &[Case] = &[
    Case { name: "geometry_is_sane", needs: Needs::Any, run: geometry_is_sane },
    Case {
        name: "read_after_write_matches_at_start_middle_end",
        needs: Needs::Writable,
        run: read_after_write,
    },
    Case { name: "block_sized_writes_roundtrip", needs: Needs::Writable, run: block_sized_writes },
    Case { name: "multi_mb_writes_roundtrip", needs: Needs::Writable, run: multi_mb_writes },
    Case { name: "unaligned_memory_buffers_roundtrip", needs: Needs::Writable, run: unaligned_memory },
    Case { name: "misaligned_requests_fail_and_change_nothing", needs: Needs::Any, run: misaligned_requests },
    Case {
        name: "out_of_range_requests_fail_and_change_nothing",
        needs: Needs::Any,
        run: out_of_range_requests,
    },
    Case { name: "zero_length_ops_succeed_and_change_nothing", needs: Needs::Any, run: zero_length_ops },
    Case { name: "write_zeroes_reads_zero_with_every_flag", needs: Needs::Writable, run: write_zeroes },
    Case { name: "discard_then_rewrite_reads_new_data", needs: Needs::Writable, run: discard_then_rewrite },
    Case { name: "flush_succeeds_when_idle_and_after_writes", needs: Needs::Any, run: flush },
    Case { name: "fua_writes_roundtrip", needs: Needs::Writable, run: fua_writes },
    Case { name: "concurrent_disjoint_writers_all_land", needs: Needs::Writable, run: concurrent_disjoint },
    Case {
        name: "concurrent_overlapping_writes_are_not_torn",
        needs: Needs::Writable,
        run: overlapping_writes,
    },
    Case { name: "concurrent_reads_see_whole_blocks", needs: Needs::Writable, run: concurrent_reads },
    Case { name: "read_only_device_refuses_writes", needs: Needs::ReadOnly, run: read_only_refuses },
];

/// The names of every case, for [`Conformance::skip`] and [`Conformance::only`].
pub fn case_names() -> Vec<&'static str> {
    CASES.iter().map(|c| c.name).collect()
}

/// Runs every case on devices from `make`; panics listing each failed case.
pub fn run_all(make: impl Fn() -> Arc<dyn BlockDevice>) -> Report {
    Conformance::new(make).run()
}

/// What a run did.
#[derive(Debug, Clone, Default)]
pub struct Report {
    /// Cases that ran and passed.
    pub passed: Vec<&'static str>,
    /// Cases skipped, with the reason.
    pub skipped: Vec<(&'static str, String)>,
}

/// A configured conformance run (see the module docs).
pub struct Conformance<'a> {
    make: Box<Make<'a>>,
    label: String,
    skips: Vec<(&'static str, String)>,
    only: Option<Vec<&'static str>>,
    discard: DiscardModel,
}

impl<'a> Conformance<'a> {
    /// A run over devices from `make`.
    pub fn new(make: impl Fn() -> Arc<dyn BlockDevice> + 'a) -> Self {
        Conformance {
            make: Box::new(make),
            label: String::from("device"),
            skips: Vec::new(),
            only: None,
            discard: DiscardModel::default(),
        }
    }

    /// Names the stack in messages ("crypt∘file-direct").
    pub fn label(mut self, label: impl Into<String>) -> Self {
        self.label = label.into();
        self
    }

    /// Skips `case`, for `reason` (printed with the report). Panics on an unknown case name, so
    /// a renamed case cannot silently stop being skipped.
    pub fn skip(mut self, case: &str, reason: impl Into<String>) -> Self {
        let name = known(case);
        self.skips.push((name, reason.into()));
        self
    }

    /// Runs only the named cases (for debugging one of them).
    pub fn only(mut self, cases: &[&str]) -> Self {
        self.only = Some(cases.iter().map(|c| known(c)).collect());
        self
    }

    /// What discarded blocks may read as (default: zeroes or their old data, as the trait
    /// contract says). A crypt layer that passes discards down reads them back as garbage and
    /// would say `DiscardModel::Anything`.
    pub fn discard_model(mut self, discard: DiscardModel) -> Self {
        self.discard = discard;
        self
    }

    /// Runs the cases; panics after the last one if any failed, listing each failure.
    pub fn run(self) -> Report {
        let ctx = Ctx { make: &*self.make, discard: self.discard };
        let probe = ctx.dev();
        let read_only = probe.caps().contains(Caps::READ_ONLY);
        drop(probe);
        let mut report = Report::default();
        let mut failures = Vec::new();
        for case in CASES {
            if self.only.as_ref().is_some_and(|only| !only.contains(&case.name)) {
                continue;
            }
            if let Some((_, reason)) = self.skips.iter().find(|(n, _)| *n == case.name) {
                report.skipped.push((case.name, reason.clone()));
                continue;
            }
            match (case.needs, read_only) {
                (Needs::Writable, true) => {
                    report.skipped.push((case.name, "device is read-only".into()));
                    continue;
                }
                (Needs::ReadOnly, false) => {
                    report.skipped.push((case.name, "device is writable".into()));
                    continue;
                }
                _ => {}
            }
            match catch_unwind(AssertUnwindSafe(|| (case.run)(&ctx))) {
                Ok(Outcome::Passed) => report.passed.push(case.name),
                Ok(Outcome::Skipped(reason)) => report.skipped.push((case.name, reason)),
                Err(payload) => failures.push((case.name, panic_message(&*payload))),
            }
        }
        eprintln!(
            "conformance [{}]: {} cases ran and passed, {} skipped, {} failed",
            self.label,
            report.passed.len(),
            report.skipped.len(),
            failures.len()
        );
        for (name, reason) in &report.skipped {
            eprintln!("  skipped {name}: {reason}");
        }
        if !failures.is_empty() {
            let list: Vec<String> = failures.iter().map(|(n, m)| format!("  {n}: {m}")).collect();
            panic!("conformance [{}]: {} case(s) failed:\n{}", self.label, failures.len(), list.join("\n"));
        }
        report
    }
}

fn known(case: &str) -> &'static str {
    CASES
        .iter()
        .find(|c| c.name == case)
        .map(|c| c.name)
        .unwrap_or_else(|| panic!("unknown conformance case {case:?}; cases are {:?}", case_names()))
}

fn panic_message(payload: &(dyn std::any::Any + Send)) -> String {
    if let Some(s) = payload.downcast_ref::<&str>() {
        (*s).to_string()
    } else if let Some(s) = payload.downcast_ref::<String>() {
        s.clone()
    } else {
        "panic with a non-string payload".into()
    }
}

// ---------------------------------------------------------------------------------------------
// Helpers.

fn lb(dev: &dyn BlockDevice) -> u64 {
    u64::from(dev.geometry().logical_block)
}

fn write_pattern(dev: &dyn BlockDevice, off: u64, len: u64, seed: u64) {
    dev.write_at(off, &pattern(seed, off, len as usize), WriteFlags::empty())
        .unwrap_or_else(|e| panic!("write_at({off}, {len}) failed: {e} ({:?})", e.kind()));
}

fn read(dev: &dyn BlockDevice, off: u64, len: u64) -> Vec<u8> {
    let mut buf = vec![0u8; len as usize];
    dev.read_at(off, &mut buf)
        .unwrap_or_else(|e| panic!("read_at({off}, {len}) failed: {e} ({:?})", e.kind()));
    buf
}

/// Panics naming the first differing byte.
fn assert_bytes(got: &[u8], want: &[u8], what: &str) {
    assert_eq!(got.len(), want.len(), "{what}: length");
    if let Some(i) = got.iter().zip(want).position(|(a, b)| a != b) {
        panic!(
            "{what}: first difference at byte {i} of {}: got {:#04x}, want {:#04x}",
            got.len(),
            got[i],
            want[i]
        );
    }
}

fn assert_pattern(dev: &dyn BlockDevice, off: u64, len: u64, seed: u64, what: &str) {
    assert_bytes(
        &read(dev, off, len),
        &pattern(seed, off, len as usize),
        &format!("{what} at {off} length {len}"),
    );
}

fn assert_zero(dev: &dyn BlockDevice, off: u64, len: u64, what: &str) {
    let got = read(dev, off, len);
    if let Some(i) = got.iter().position(|&b| b != 0) {
        panic!("{what}: byte {} (offset {off} + {i}) is {:#04x}, not zero", off + i as u64, got[i]);
    }
}

/// Checks `res` failed with one of `kinds`.
fn assert_fails(res: BlockResult<()>, kinds: &[BlockErrorKind], what: &str) {
    match res {
        Ok(()) => panic!("{what} succeeded; expected one of {kinds:?}"),
        Err(e) if kinds.contains(&e.kind()) => {}
        Err(e) => panic!("{what} failed with {:?} ({e}); expected one of {kinds:?}", e.kind()),
    }
}

/// The kinds a bad request may fail with on `dev`, besides `primary`, for an operation that
/// writes (`writes`) or discards (`discard`).
fn bad_request_kinds(
    dev: &dyn BlockDevice,
    primary: BlockErrorKind,
    writes: bool,
    discard: bool,
) -> Vec<BlockErrorKind> {
    let mut k = vec![primary];
    if writes && dev.caps().contains(Caps::READ_ONLY) {
        k.push(BlockErrorKind::ReadOnly);
    }
    if discard && !dev.caps().contains(Caps::DISCARD) {
        k.push(BlockErrorKind::Unsupported);
    }
    k
}

/// Either fills `[off, off+len)` with `seed` (writable devices) or snapshots it (read-only
/// ones); returns what the range must read as afterwards.
fn prepare(dev: &dyn BlockDevice, off: u64, len: u64, seed: u64) -> Vec<u8> {
    if !dev.caps().contains(Caps::READ_ONLY) {
        write_pattern(dev, off, len, seed);
    }
    read(dev, off, len)
}

// ---------------------------------------------------------------------------------------------
// Cases.

fn geometry_is_sane(ctx: &Ctx<'_>) -> Outcome {
    let dev = ctx.dev();
    let g = dev.geometry();
    assert!(
        g.logical_block.is_power_of_two() && (512..=4096).contains(&g.logical_block),
        "logical block {} is not a power of two in 512..=4096",
        g.logical_block
    );
    assert!(
        g.physical_block >= g.logical_block && g.physical_block % g.logical_block == 0,
        "physical block {} is not a multiple of the logical block {}",
        g.physical_block,
        g.logical_block
    );
    assert_eq!(g.size % u64::from(g.logical_block), 0, "size {} is not a multiple of the block", g.size);
    assert!(
        g.size >= 16 * u64::from(g.logical_block),
        "the conformance suite needs at least 16 blocks; the device has {} bytes",
        g.size
    );
    let caps = dev.caps();
    for _ in 0..3 {
        assert_eq!(dev.geometry(), g, "geometry changed between calls");
        assert_eq!(dev.caps(), caps, "caps changed between calls");
    }
    assert!(
        !(caps.contains(Caps::READ_ONLY) && caps.intersects(Caps::DISCARD | Caps::WRITE_ZEROES | Caps::FUA)),
        "a READ_ONLY device advertises write capabilities: {caps:?}"
    );
    Outcome::Passed
}

fn read_after_write(ctx: &Ctx<'_>) -> Outcome {
    let dev = ctx.dev();
    let (bs, size) = (lb(&*dev), dev.geometry().size);
    let n = size / bs;
    for (i, block) in [0, n / 2, n - 1].into_iter().enumerate() {
        let p = block * bs;
        // Background around the block, then the block itself, then check both.
        let lo = p.saturating_sub(bs);
        let hi = (p + 2 * bs).min(size);
        write_pattern(&*dev, lo, hi - lo, 100 + i as u64);
        write_pattern(&*dev, p, bs, 200 + i as u64);
        let mut want = pattern(100 + i as u64, lo, (hi - lo) as usize);
        fill(&mut want[(p - lo) as usize..(p - lo + bs) as usize], 200 + i as u64, p);
        assert_bytes(&read(&*dev, lo, hi - lo), &want, &format!("block {block} and its neighbours"));
        assert_pattern(&*dev, p, bs, 200 + i as u64, "the written block alone");
    }
    // The last two blocks in one request, ending exactly at the device's end.
    write_pattern(&*dev, size - 2 * bs, 2 * bs, 300);
    assert_pattern(&*dev, size - 2 * bs, 2 * bs, 300, "the last two blocks");
    Outcome::Passed
}

fn block_sized_writes(ctx: &Ctx<'_>) -> Outcome {
    let dev = ctx.dev();
    let g = dev.geometry();
    let bs = lb(&*dev);
    let n = g.size / bs;
    let phys = u64::from(g.physical_block) / bs;
    let mut pos = 0u64;
    let mut written = Vec::new();
    for (i, blocks) in [1u64, phys, 3, 8, 1, 17, 2 * phys, 5].into_iter().enumerate() {
        let blocks = blocks.min(n - pos);
        if blocks == 0 {
            break;
        }
        write_pattern(&*dev, pos * bs, blocks * bs, 400 + i as u64);
        written.push((pos * bs, blocks * bs, 400 + i as u64));
        pos += blocks;
    }
    for &(off, len, seed) in &written {
        assert_pattern(&*dev, off, len, seed, "block-sized write");
    }
    // The same range read in one request.
    let mut want = Vec::new();
    for &(off, len, seed) in &written {
        want.extend(pattern(seed, off, len as usize));
    }
    assert_bytes(&read(&*dev, 0, pos * bs), &want, "all block-sized writes read at once");
    // Physical-block-aligned writes.
    let p = u64::from(g.physical_block);
    if g.size >= 4 * p {
        write_pattern(&*dev, 2 * p, p, 450);
        assert_pattern(&*dev, 2 * p, p, 450, "physical-block write");
    }
    Outcome::Passed
}

fn multi_mb_writes(ctx: &Ctx<'_>) -> Outcome {
    let dev = ctx.dev();
    let (bs, size) = (lb(&*dev), dev.geometry().size);
    let len = (4u64 << 20).min(size - bs) / bs * bs;
    let off = bs; // block- but not megabyte-aligned
    write_pattern(&*dev, off, len, 500);
    assert_pattern(&*dev, off, len, 500, "multi-MB write read back at once");
    let piece = (64 * 1024u64).max(bs);
    let mut p = off;
    while p < off + len {
        let n = piece.min(off + len - p);
        assert_pattern(&*dev, p, n, 500, "multi-MB write read back in pieces");
        p += n;
    }
    // Overwrite an inner part and check the seams.
    let inner_off = off + len / 4 / bs * bs;
    let inner_len = (len / 2 / bs * bs).max(bs);
    write_pattern(&*dev, inner_off, inner_len, 501);
    let mut want = pattern(500, off, len as usize);
    fill(&mut want[(inner_off - off) as usize..(inner_off - off + inner_len) as usize], 501, inner_off);
    assert_bytes(&read(&*dev, off, len), &want, "multi-MB write after an inner overwrite");
    Outcome::Passed
}

fn unaligned_memory(ctx: &Ctx<'_>) -> Outcome {
    let dev = ctx.dev();
    let (bs, size) = (lb(&*dev), dev.geometry().size);
    for (i, len) in [bs, 9 * bs, ((1u64 << 20) + bs).min(size / bs * bs / 2)].into_iter().enumerate() {
        let off = bs * (i as u64 + 1);
        let len = len.min(size - off) / bs * bs;
        let seed = 600 + i as u64;
        for shift in [1usize, 3] {
            let mut src = vec![0u8; len as usize + shift];
            fill(&mut src[shift..], seed, off);
            dev.write_at(off, &src[shift..], WriteFlags::empty()).expect("write from an unaligned buffer");
            let mut dst = vec![0u8; len as usize + shift + 2];
            dev.read_at(off, &mut dst[shift + 1..shift + 1 + len as usize])
                .expect("read into an unaligned buffer");
            assert_bytes(&dst[shift + 1..shift + 1 + len as usize], &src[shift..], "unaligned buffers");
            assert_eq!(dst[shift], 0, "read wrote before the buffer");
            assert_eq!(dst[shift + 1 + len as usize], 0, "read wrote after the buffer");
        }
    }
    Outcome::Passed
}

fn misaligned_requests(ctx: &Ctx<'_>) -> Outcome {
    let dev = ctx.dev();
    let bs = lb(&*dev);
    let region = 4 * bs;
    let before = prepare(&*dev, 0, region, 700);
    let mis = BlockErrorKind::Misaligned;
    // Sub-block offsets, including 512-aligned ones on a 4096-byte device.
    let mut offs = vec![1u64, bs / 2, bs + 7];
    if bs > 512 {
        offs.push(512);
    }
    let block = pattern(701, 0, bs as usize);
    for &off in &offs {
        let mut buf = vec![0u8; bs as usize];
        assert_fails(dev.read_at(off, &mut buf), &[mis], &format!("read_at({off}, {bs})"));
        let k = bad_request_kinds(&*dev, mis, true, false);
        assert_fails(dev.write_at(off, &block, WriteFlags::empty()), &k, &format!("write_at({off}, {bs})"));
        assert_fails(dev.write_at(off, &block, WriteFlags::FUA), &k, &format!("FUA write_at({off}, {bs})"));
        assert_fails(
            dev.write_zeroes(off, bs, ZeroFlags::empty()),
            &k,
            &format!("write_zeroes({off}, {bs})"),
        );
        let k = bad_request_kinds(&*dev, mis, true, true);
        assert_fails(dev.discard(off, bs), &k, &format!("discard({off}, {bs})"));
    }
    // Sub-block lengths at aligned offsets.
    for len in [1u64, bs - 1, bs + 1, bs + bs / 2] {
        let mut buf = vec![0u8; len as usize];
        assert_fails(dev.read_at(bs, &mut buf), &[mis], &format!("read_at({bs}, {len})"));
        let k = bad_request_kinds(&*dev, mis, true, false);
        let data = pattern(702, bs, len as usize);
        assert_fails(dev.write_at(bs, &data, WriteFlags::empty()), &k, &format!("write_at({bs}, {len})"));
        assert_fails(
            dev.write_zeroes(bs, len, ZeroFlags::MAY_UNMAP),
            &k,
            &format!("write_zeroes({bs}, {len})"),
        );
        let k = bad_request_kinds(&*dev, mis, true, true);
        assert_fails(dev.discard(bs, len), &k, &format!("discard({bs}, {len})"));
    }
    assert_bytes(&read(&*dev, 0, region), &before, "data after misaligned requests");
    Outcome::Passed
}

fn out_of_range_requests(ctx: &Ctx<'_>) -> Outcome {
    let dev = ctx.dev();
    let (bs, size) = (lb(&*dev), dev.geometry().size);
    let head = prepare(&*dev, 0, bs, 800);
    let tail = prepare(&*dev, size - 2 * bs, 2 * bs, 801);
    let oor = BlockErrorKind::OutOfRange;
    let top = u64::MAX / bs * bs; // aligned, and off + len overflows
    let requests =
        [(size, bs), (size - bs, 2 * bs), (size + 64 * bs, bs), (top, bs), (0, size + bs), (bs, top)];
    for (off, len) in requests {
        // Data buffers only for lengths that are cheap to allocate.
        if len <= 8 << 20 {
            let mut buf = vec![0u8; len as usize];
            assert_fails(dev.read_at(off, &mut buf), &[oor], &format!("read_at({off}, {len})"));
            let data = pattern(802, 0, len as usize);
            let k = bad_request_kinds(&*dev, oor, true, false);
            assert_fails(
                dev.write_at(off, &data, WriteFlags::empty()),
                &k,
                &format!("write_at({off}, {len})"),
            );
        }
        let k = bad_request_kinds(&*dev, oor, true, false);
        assert_fails(
            dev.write_zeroes(off, len, ZeroFlags::empty()),
            &k,
            &format!("write_zeroes({off}, {len})"),
        );
        assert_fails(
            dev.write_zeroes(off, len, ZeroFlags::MAY_UNMAP),
            &k,
            &format!("write_zeroes({off}, {len})"),
        );
        let k = bad_request_kinds(&*dev, oor, true, true);
        assert_fails(dev.discard(off, len), &k, &format!("discard({off}, {len})"));
    }
    assert_bytes(&read(&*dev, 0, bs), &head, "first block after out-of-range requests");
    assert_bytes(&read(&*dev, size - 2 * bs, 2 * bs), &tail, "last blocks after out-of-range requests");
    Outcome::Passed
}

fn zero_length_ops(ctx: &Ctx<'_>) -> Outcome {
    let dev = ctx.dev();
    let (bs, size) = (lb(&*dev), dev.geometry().size);
    let read_only = dev.caps().contains(Caps::READ_ONLY);
    let head = prepare(&*dev, 0, bs, 900);
    let tail = prepare(&*dev, size - bs, bs, 901);
    let ok_or = |res: BlockResult<()>, excuse: Option<BlockErrorKind>, what: String| match res {
        Ok(()) => {}
        Err(e) if Some(e.kind()) == excuse => {}
        Err(e) => panic!("zero-length {what} failed with {:?} ({e})", e.kind()),
    };
    let ro_excuse = read_only.then_some(BlockErrorKind::ReadOnly);
    for off in [0, size / bs / 2 * bs, size - bs, size] {
        ok_or(dev.read_at(off, &mut []), None, format!("read_at({off})"));
        ok_or(dev.write_at(off, &[], WriteFlags::empty()), ro_excuse, format!("write_at({off})"));
        ok_or(dev.write_at(off, &[], WriteFlags::FUA), ro_excuse, format!("FUA write_at({off})"));
        ok_or(dev.write_zeroes(off, 0, ZeroFlags::MAY_UNMAP), ro_excuse, format!("write_zeroes({off})"));
        let discard_excuse =
            if !dev.caps().contains(Caps::DISCARD) { Some(BlockErrorKind::Unsupported) } else { ro_excuse };
        ok_or(dev.discard(off, 0), discard_excuse, format!("discard({off})"));
    }
    assert_bytes(&read(&*dev, 0, bs), &head, "first block after zero-length ops");
    assert_bytes(&read(&*dev, size - bs, bs), &tail, "last block after zero-length ops");
    Outcome::Passed
}

fn write_zeroes(ctx: &Ctx<'_>) -> Outcome {
    let dev = ctx.dev();
    let (bs, size) = (lb(&*dev), dev.geometry().size);
    let k = (size / bs - 2).min(64);
    let flag_sets =
        [ZeroFlags::empty(), ZeroFlags::MAY_UNMAP, ZeroFlags::FUA, ZeroFlags::MAY_UNMAP | ZeroFlags::FUA];
    for (i, flags) in flag_sets.into_iter().enumerate() {
        let seed = 1000 + i as u64;
        write_pattern(&*dev, 0, (k + 2) * bs, seed);
        dev.write_zeroes(bs, k * bs, flags).unwrap_or_else(|e| panic!("write_zeroes({flags:?}) failed: {e}"));
        assert_zero(&*dev, bs, k * bs, &format!("range after write_zeroes({flags:?})"));
        assert_pattern(&*dev, 0, bs, seed, "block before the zeroed range");
        assert_pattern(&*dev, (k + 1) * bs, bs, seed, "block after the zeroed range");
        // The zeroed range takes new writes.
        write_pattern(&*dev, 2 * bs, bs, seed + 50);
        assert_pattern(&*dev, 2 * bs, bs, seed + 50, "write after write_zeroes");
    }
    // A multi-megabyte range (several chunks of the default implementation), to the end.
    let len = (3u64 << 20).min(size) / bs * bs;
    let off = size - len;
    write_pattern(&*dev, off, len, 1100);
    dev.write_zeroes(off, len, ZeroFlags::empty()).expect("multi-MB write_zeroes");
    assert_zero(&*dev, off, len, "multi-MB range after write_zeroes");
    Outcome::Passed
}

/// Checks that `got` (read back from `[off, off+len)` after a discard) is acceptable.
fn check_discarded(model: DiscardModel, got: &[u8], old: &[u8], off: u64, bs: u64) {
    for (i, (g, o)) in got.chunks(bs as usize).zip(old.chunks(bs as usize)).enumerate() {
        let zero = g.iter().all(|&b| b == 0);
        let ok = match model {
            DiscardModel::Zeroes => zero,
            DiscardModel::ZeroOrOld => zero || g == o,
            DiscardModel::Anything => true,
        };
        assert!(ok, "discarded block at {} reads as neither {model:?}", off + i as u64 * bs);
    }
}

fn discard_then_rewrite(ctx: &Ctx<'_>) -> Outcome {
    let dev = ctx.dev();
    if !dev.caps().contains(Caps::DISCARD) {
        return Outcome::Skipped("no Caps::DISCARD".into());
    }
    let (bs, size) = (lb(&*dev), dev.geometry().size);
    let k = (size / bs - 2).min(64);
    write_pattern(&*dev, 0, (k + 2) * bs, 1200);
    dev.discard(bs, k * bs).expect("discard");
    let got = read(&*dev, bs, k * bs);
    check_discarded(ctx.discard, &got, &pattern(1200, bs, (k * bs) as usize), bs, bs);
    assert_pattern(&*dev, 0, bs, 1200, "block before the discarded range");
    assert_pattern(&*dev, (k + 1) * bs, bs, 1200, "block after the discarded range");
    write_pattern(&*dev, bs, k * bs, 1201);
    assert_pattern(&*dev, bs, k * bs, 1201, "rewrite after discard");
    // The whole device at once, then both ends are writable again.
    dev.discard(0, size).expect("discard of the whole device");
    write_pattern(&*dev, 0, bs, 1202);
    write_pattern(&*dev, size - bs, bs, 1203);
    assert_pattern(&*dev, 0, bs, 1202, "first block rewritten after a whole-device discard");
    assert_pattern(&*dev, size - bs, bs, 1203, "last block rewritten after a whole-device discard");
    dev.flush().expect("flush after discard");
    Outcome::Passed
}

fn flush(ctx: &Ctx<'_>) -> Outcome {
    let dev = ctx.dev();
    dev.flush().expect("flush of an idle device");
    if !dev.caps().contains(Caps::READ_ONLY) {
        let bs = lb(&*dev);
        write_pattern(&*dev, bs, 4 * bs, 1300);
        dev.flush().expect("flush after writes");
        dev.flush().expect("second flush");
        assert_pattern(&*dev, bs, 4 * bs, 1300, "data after flush");
    }
    Outcome::Passed
}

fn fua_writes(ctx: &Ctx<'_>) -> Outcome {
    let dev = ctx.dev();
    let (bs, size) = (lb(&*dev), dev.geometry().size);
    let spots = [(0u64, bs), (3 * bs, 5 * bs), (size - bs, bs)];
    for (i, &(off, len)) in spots.iter().enumerate() {
        let flags = if i % 2 == 0 { WriteFlags::FUA } else { WriteFlags::empty() };
        dev.write_at(off, &pattern(1400 + i as u64, off, len as usize), flags).expect("write");
        dev.write_at(off, &pattern(1410 + i as u64, off, len as usize), WriteFlags::FUA).expect("FUA write");
    }
    for (i, &(off, len)) in spots.iter().enumerate() {
        assert_pattern(&*dev, off, len, 1410 + i as u64, "FUA write");
    }
    Outcome::Passed
}

/// Joins scoped threads, re-raising the first panic with its message.
fn join_all<'s>(handles: Vec<thread::ScopedJoinHandle<'s, ()>>) {
    let mut first = None;
    for h in handles {
        if let Err(p) = h.join() {
            first.get_or_insert(p);
        }
    }
    if let Some(p) = first {
        std::panic::resume_unwind(p);
    }
}

fn concurrent_disjoint(ctx: &Ctx<'_>) -> Outcome {
    let dev = ctx.dev();
    let (bs, size) = (lb(&*dev), dev.geometry().size);
    const THREADS: u64 = 4;
    let region = (size / THREADS / bs * bs).min(1 << 20);
    let blocks = region / bs;
    let done = AtomicBool::new(false);
    thread::scope(|s| {
        let mut writers = Vec::new();
        for t in 0..THREADS {
            let dev = &dev;
            writers.push(s.spawn(move || {
                let base = t * region;
                let seed = 1500 + t;
                // Chunks of 1..=8 blocks, visited in a scrambled order.
                let mut chunks = Vec::new();
                let mut b = 0;
                while b < blocks {
                    let n = (1 + splitmix64(seed ^ b) % 8).min(blocks - b);
                    chunks.push((b, n));
                    b += n;
                }
                chunks.sort_by_key(|&(b, _)| splitmix64(seed.wrapping_mul(31) ^ b));
                for (i, (b, n)) in chunks.into_iter().enumerate() {
                    let (off, len) = (base + b * bs, n * bs);
                    let flags = if i % 7 == 0 { WriteFlags::FUA } else { WriteFlags::empty() };
                    dev.write_at(off, &pattern(seed, off, len as usize), flags)
                        .unwrap_or_else(|e| panic!("thread {t}: write_at({off}, {len}): {e}"));
                    assert_pattern(&**dev, off, len, seed, &format!("thread {t}: read-after-write"));
                }
            }));
        }
        let flusher = {
            let (dev, done) = (&dev, &done);
            s.spawn(move || {
                for _ in 0..1000 {
                    if done.load(Ordering::Relaxed) {
                        break;
                    }
                    dev.flush().expect("flush concurrent with writers");
                    thread::yield_now();
                }
            })
        };
        let result = catch_unwind(AssertUnwindSafe(|| join_all(writers)));
        done.store(true, Ordering::Relaxed);
        join_all(vec![flusher]);
        if let Err(p) = result {
            std::panic::resume_unwind(p);
        }
    });
    for t in 0..THREADS {
        assert_pattern(
            &*dev,
            t * region,
            region,
            1500 + t,
            &format!("region of thread {t} after all joined"),
        );
    }
    Outcome::Passed
}

/// Which of `seeds` block `i` of `got` (read from `off`) matches, if any.
fn whole_block_source(got: &[u8], off: u64, bs: u64, seeds: &[u64]) -> Vec<Option<u64>> {
    got.chunks(bs as usize)
        .enumerate()
        .map(|(i, block)| {
            let at = off + i as u64 * bs;
            seeds.iter().copied().find(|&s| pattern(s, at, bs as usize) == block)
        })
        .collect()
}

fn overlapping_writes(ctx: &Ctx<'_>) -> Outcome {
    let dev = ctx.dev();
    let bs = lb(&*dev);
    let (off, len) = (bs, 8 * bs);
    let seeds: Vec<u64> = (0..4).map(|t| 1600 + t).collect();
    thread::scope(|s| {
        let handles = seeds
            .iter()
            .map(|&seed| {
                let dev = &dev;
                s.spawn(move || {
                    let data = pattern(seed, off, len as usize);
                    for _ in 0..50 {
                        dev.write_at(off, &data, WriteFlags::empty()).expect("overlapping write");
                    }
                })
            })
            .collect();
        join_all(handles);
    });
    let got = read(&*dev, off, len);
    for (i, src) in whole_block_source(&got, off, bs, &seeds).into_iter().enumerate() {
        assert!(
            src.is_some(),
            "block {} after overlapping writes is torn (matches no writer)",
            off / bs + i as u64
        );
    }
    Outcome::Passed
}

/// Sets the flag when dropped, so waiting threads stop even if the setter panics.
struct SetOnDrop<'a>(&'a AtomicBool);

impl Drop for SetOnDrop<'_> {
    fn drop(&mut self) {
        self.0.store(true, Ordering::Relaxed);
    }
}

fn concurrent_reads(ctx: &Ctx<'_>) -> Outcome {
    let dev = ctx.dev();
    let bs = lb(&*dev);
    let (off, len) = (2 * bs, 8 * bs);
    let seeds = [1700u64, 1701, 1702];
    write_pattern(&*dev, off, len, seeds[0]);
    let done = AtomicBool::new(false);
    thread::scope(|s| {
        let writer = {
            let (dev, done) = (&dev, &done);
            s.spawn(move || {
                let _stop_readers = SetOnDrop(done);
                for i in 0..200 {
                    let seed = seeds[1 + i % 2];
                    dev.write_at(off, &pattern(seed, off, len as usize), WriteFlags::empty()).expect("write");
                }
            })
        };
        let readers = (0..2)
            .map(|r| {
                let (dev, done) = (&dev, &done);
                s.spawn(move || {
                    let mut rounds = 0;
                    while !done.load(Ordering::Relaxed) || rounds < 10 {
                        let got = read(&**dev, off, len);
                        for (i, src) in whole_block_source(&got, off, bs, &seeds).into_iter().enumerate() {
                            assert!(
                                src.is_some(),
                                "reader {r}: block {} read during overlapping writes is torn",
                                off / bs + i as u64
                            );
                        }
                        rounds += 1;
                    }
                })
            })
            .collect();
        join_all(vec![writer]);
        join_all(readers);
    });
    Outcome::Passed
}

fn read_only_refuses(ctx: &Ctx<'_>) -> Outcome {
    let dev = ctx.dev();
    let (bs, size) = (lb(&*dev), dev.geometry().size);
    let head = read(&*dev, 0, 4 * bs);
    let tail = read(&*dev, size - bs, bs);
    let ro = [BlockErrorKind::ReadOnly];
    let data = pattern(1800, 0, 4 * bs as usize);
    assert_fails(dev.write_at(0, &data, WriteFlags::empty()), &ro, "write_at on a read-only device");
    assert_fails(
        dev.write_at(0, &data[..bs as usize], WriteFlags::FUA),
        &ro,
        "FUA write_at on a read-only device",
    );
    assert_fails(
        dev.write_at(size - bs, &data[..bs as usize], WriteFlags::empty()),
        &ro,
        "write_at of the last block",
    );
    assert_fails(dev.write_zeroes(0, 4 * bs, ZeroFlags::empty()), &ro, "write_zeroes on a read-only device");
    assert_fails(
        dev.write_zeroes(0, bs, ZeroFlags::MAY_UNMAP),
        &ro,
        "write_zeroes(MAY_UNMAP) on a read-only device",
    );
    assert_fails(
        dev.discard(0, 4 * bs),
        &[BlockErrorKind::ReadOnly, BlockErrorKind::Unsupported],
        "discard on a read-only device",
    );
    dev.flush().expect("flush of a read-only device");
    assert_bytes(&read(&*dev, 0, 4 * bs), &head, "first blocks after refused writes");
    assert_bytes(&read(&*dev, size - bs, bs), &tail, "last block after refused writes");
    Outcome::Passed
}
