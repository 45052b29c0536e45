//! The quick suite: `sealdisk bench` with no arguments.
//!
//! On self-made temporary volumes (one per stack, same size, same filesystem), the workloads
//! everyone asks about first, then one table with each stack's figure and its ratio to raw
//! I/O on the same kind of file:
//!
//! ```text
//!   stacks:     raw file | crypt inline | crypt auto | luks2 | integrity (J, crc32c)
//!               | luks2-aead (LUKS2 authenticated encryption: aes-xts-plain64 + hmac-sha256, J)
//!   workloads:  4k randread/randwrite at QD1 and QD32, 1M sequential read/write at QD8
//!   each:       2 s measured after 0.5 s ramp, one repetition, interleaved per workload
//! ```
//! About 90 s of measuring on 2 cores, plus formatting and preconditioning the volumes
//! (about two minutes in all; the limit is three).

use std::fmt::Write as _;
use std::time::Duration;

use targets::CryptMode;

use crate::compare::{CellDir, Comparison, ComparisonResult, Point, Spread, Variant};
use crate::report::{fmt_bw, fmt_count};
use crate::spec::{JobSpec, RwMode};
use crate::stack::StackSpec;

/// Scaling of the suite.
#[derive(Debug, Clone)]
pub struct SuiteOptions {
    /// Measured time per job.
    pub runtime: Duration,
    /// Ramp per job.
    pub ramp: Duration,
    /// Volume size per stack.
    pub size: u64,
    /// Repetitions.
    pub repetitions: u32,
    /// O_DIRECT backing files.
    pub direct: bool,
}

impl Default for SuiteOptions {
    fn default() -> Self {
        SuiteOptions {
            runtime: Duration::from_millis(2000),
            ramp: Duration::from_millis(500),
            size: 256 << 20,
            repetitions: 1,
            direct: false,
        }
    }
}

/// The suite as a comparison (baseline: raw).
pub fn comparison(o: &SuiteOptions) -> Comparison {
    let with_direct = |mut s: StackSpec| {
        s.direct = o.direct;
        s
    };
    let set = |mut s: StackSpec, opts: &[(&str, &str)]| {
        for (k, v) in opts {
            s.set(k, v).expect("known stack option");
        }
        with_direct(s)
    };
    let variants = vec![
        Variant::new("raw", with_direct(StackSpec::raw())),
        Variant::new("crypt-inline", with_direct(StackSpec::crypt(CryptMode::Inline))),
        Variant::new("crypt-auto", with_direct(StackSpec::crypt(CryptMode::Auto))),
        Variant::new("luks2", set(StackSpec::crypt(CryptMode::Auto), &[("stack", "luks2")])),
        Variant::new(
            "integrity",
            set(StackSpec::default(), &[("stack", "integrity"), ("integrity-alg", "crc32c")]),
        ),
        Variant::new(
            "luks2-aead",
            set(StackSpec::default(), &[("stack", "luks2-integrity"), ("luks-integrity", "hmac-sha256")]),
        ),
    ];
    let job = |name: &str, rw, bs, qd| {
        Point::one(name, JobSpec::new(name, rw, bs).depth(qd).timed(o.runtime, o.ramp))
    };
    let points = vec![
        job("randread-4k-qd1", RwMode::RandRead, 4096, 1),
        job("randwrite-4k-qd1", RwMode::RandWrite, 4096, 1),
        job("randread-4k-qd32", RwMode::RandRead, 4096, 32),
        job("randwrite-4k-qd32", RwMode::RandWrite, 4096, 32),
        job("seqread-1m-qd8", RwMode::Read, 1 << 20, 8),
        job("seqwrite-1m-qd8", RwMode::Write, 1 << 20, 8),
    ];
    Comparison {
        title: "sealdisk bench: quick suite".into(),
        knob: "the stack: raw file vs plain dm-crypt (aes-xts-plain64, 512-bit key, 4096-byte sectors, crypto \
               inline or auto) vs LUKS2 (the same cipher) vs dm-integrity (journal mode, 4096-byte blocks, crc32c) vs \
               LUKS2 authenticated encryption (aes-xts-plain64 + hmac-sha256 over dm-integrity, journaled)"
            .into(),
        seed: None,
        note: Some(format!(
            "{} volumes, {} backing files, in-process (no transport); integrity and LUKS2 volumes formatted without \
             a wipe and written whole before anything reads",
            crate::spec::format_size(o.size),
            if o.direct { "O_DIRECT" } else { "buffered (page cache)" },
        )),
        variants,
        points,
        repetitions: o.repetitions,
        volume_size: o.size,
    }
}

/// The headline metric of a cell: IOPS below 128 KiB requests, bandwidth above.
fn headline(d: &CellDir, big: bool) -> (&Spread, String) {
    if big {
        (&d.bw_bytes, fmt_bw(d.bw_bytes.median))
    } else {
        (&d.iops, format!("{} IOPS", fmt_count(d.iops.median)))
    }
}

/// Whether a stack's figure against raw's is noise rather than a difference: above raw
/// (every stack does raw's I/O and more, so it cannot be faster; a ratio above 1 is the
/// machine's jitter), or within the repetitions' spread (the two min..max ranges overlap).
fn within_noise(cell: &Spread, base: &Spread) -> bool {
    let overlap =
        cell.samples.len() > 1 && base.samples.len() > 1 && cell.min <= base.max && base.min <= cell.max;
    cell.median > base.median || overlap
}

/// One table: workload × stack → headline figure and ratio to the first stack (raw); a
/// ratio that is noise (see [`within_noise`]) is marked `~` and explained below the table.
pub fn summary(r: &ComparisonResult) -> String {
    let mut out = String::new();
    let base = r.variants.first().map(|v| v.name.clone()).unwrap_or_default();
    let _ = writeln!(out, "== summary: each stack vs {base} (same file system, same workload) ==");
    let w = r.points.iter().map(|p| p.label.len()).max().unwrap_or(8).max(8);
    let mut hdr = format!("{:<w$}", "workload");
    for v in &r.variants {
        let _ = write!(hdr, "  {:>24}", v.name);
    }
    let _ = writeln!(out, "{hdr}");
    let _ = writeln!(out, "{}", "-".repeat(hdr.len()));
    let mut noisy = false;
    for p in &r.points {
        let big = p.label.contains("1m");
        let mut line = format!("{:<w$}", p.label);
        let mut base_v: Option<&Spread> = None;
        for (i, c) in p.cells.iter().enumerate() {
            let d = c.read.as_ref().or(c.write.as_ref());
            let cell = match d {
                Some(d) => {
                    let (v, s) = headline(d, big);
                    if i == 0 {
                        base_v = Some(v);
                        s
                    } else {
                        match base_v.filter(|b| b.median > 0.0) {
                            Some(b) if within_noise(v, b) => {
                                noisy = true;
                                format!("{s} ({:.2}x~)", v.median / b.median)
                            }
                            Some(b) => format!("{s} ({:.2}x)", v.median / b.median),
                            None => s,
                        }
                    }
                }
                None => "-".into(),
            };
            let _ = write!(line, "  {cell:>24}");
        }
        let _ = writeln!(out, "{line}");
    }
    if noisy {
        let _ = writeln!(
            out,
            "~ within noise, not a difference: above {base} (a stack does {base}'s I/O and more, so it cannot be \
             faster) or within the spread of the repetitions; more repetitions (--repeat N) narrow it"
        );
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::compare::{Cell, PointResult, VariantInfo};

    fn dir(iops: &[f64]) -> CellDir {
        CellDir {
            bw_bytes: Spread::of(&iops.iter().map(|v| v * 4096.0).collect::<Vec<_>>()),
            iops: Spread::of(iops),
            lat_mean_ns: Spread::of(&[1.0]),
            change_pct: None,
        }
    }

    #[test]
    fn a_stack_faster_than_raw_or_within_the_spread_is_marked_as_noise() {
        assert!(within_noise(&Spread::of(&[105.0]), &Spread::of(&[100.0])));
        assert!(!within_noise(&Spread::of(&[80.0]), &Spread::of(&[100.0])));
        assert!(within_noise(&Spread::of(&[90.0, 95.0, 101.0]), &Spread::of(&[99.0, 100.0, 104.0])));
        assert!(!within_noise(&Spread::of(&[60.0, 62.0, 64.0]), &Spread::of(&[99.0, 100.0, 104.0])));

        let cell = |variant: &str, iops: f64| Cell {
            variant: variant.into(),
            read: None,
            write: Some(dir(&[iops])),
        };
        let info =
            |name: &str| VariantInfo { name: name.into(), stack: String::new(), job_overrides: Vec::new() };
        let r = ComparisonResult {
            title: "t".into(),
            knob: "k".into(),
            seed: None,
            note: None,
            repetitions: 1,
            variants: vec![info("raw"), info("crypt"), info("luks2")],
            points: vec![PointResult {
                label: "randwrite-4k-qd1".into(),
                jobs: vec!["randwrite-4k-qd1".into()],
                cells: vec![cell("raw", 1000.0), cell("crypt", 1040.0), cell("luks2", 800.0)],
            }],
        };
        let text = summary(&r);
        assert!(text.contains("(1.04x~)"), "{text}");
        assert!(text.contains("(0.80x)") && !text.contains("(0.80x~)"), "{text}");
        assert!(text.contains("~ within noise"), "{text}");
    }
}
