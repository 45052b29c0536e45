//! Format speed: how fast a volume is made, beside a raw sequential write of the same size.
//!
//! ```text
//!   for rep in 1..=R, for variant (interleaved, like compare):
//!     raw stack        temp file ─► sequential 1 MiB writes of zeroes + flush (dd bs=1M conv=fsync)
//!     integrity stack  temp file ─► volume::integrity::format (with the wipe) — integritysetup format
//!   cell = bytes written / wall time; one "request" is the whole format, so IOPS = formats/s
//!   and lat = the format's time
//! ```
//! The result is an ordinary [`ComparisonResult`] (one point, `format`, WRITE column), so the
//! table, the JSON report and the chart treat it like any other comparison.

use std::path::Path;
use std::time::Instant;

use blockdev::{BlockDevice, WriteFlags};

use crate::compare::{
    Cell, CellDir, CompareEnv, ComparisonResult, PointResult, Spread, Variant, VariantInfo,
};
use crate::spec::format_size;
use crate::stack::StackKind;
use crate::BenchError;

/// A format-speed comparison.
#[derive(Debug, Clone)]
pub struct FormatComparison {
    /// Title.
    pub title: String,
    /// The knob the variants turn.
    pub knob: String,
    /// The seed experiment this reproduces, if any.
    pub seed: Option<String>,
    /// Anything the reader must know.
    pub note: Option<String>,
    /// Raw stacks (sequential write of the same size) and integrity stacks (format + wipe);
    /// the first is the baseline of the change column.
    pub variants: Vec<Variant>,
    /// Repetitions, interleaved.
    pub repetitions: u32,
    /// Bytes a raw variant writes and an integrity variant provides (and wipes).
    pub volume_size: u64,
}

/// Checks a format comparison before anything runs.
pub fn check(c: &FormatComparison) -> Result<(), BenchError> {
    if c.variants.len() < 2 || c.repetitions == 0 {
        return Err(BenchError::usage(format!("{}: needs two variants and one repetition", c.title)));
    }
    for v in &c.variants {
        if v.target.is_some() || !matches!(v.stack.kind, StackKind::Raw | StackKind::Integrity) {
            return Err(BenchError::usage(format!(
                "{}: variant {}: format speed is measured on raw and integrity stacks only",
                c.title, v.name
            )));
        }
        v.stack.check()?;
    }
    Ok(())
}

/// Bytes written and seconds taken by one format (or one raw write).
fn one(v: &Variant, dir: &Path, size: u64) -> Result<(u64, f64), BenchError> {
    let st = &v.stack;
    let file = tempfile::Builder::new()
        .prefix("sealdisk-bench-format-")
        .suffix(".img")
        .tempfile_in(dir)
        .map_err(|e| BenchError::setup(format!("creating a temporary volume in {}", dir.display()), e))?;
    let bytes = match st.kind {
        StackKind::Raw => size,
        _ => st.integrity_file_size(size),
    };
    file.as_file().set_len(bytes).map_err(|e| BenchError::setup("sizing the temporary volume", e))?;
    let _ = rustix::fs::fallocate(file.as_file(), rustix::fs::FallocateFlags::empty(), 0, bytes);
    let path = file.into_temp_path();
    if st.kind == StackKind::Raw {
        let so = volume::StorageOptions { direct: st.direct, ..volume::StorageOptions::default() };
        let dev = path
            .to_str()
            .ok_or_else(|| BenchError::usage(format!("{}: not a UTF-8 path", path.display())))
            .and_then(|p| {
                volume::storage::open(p, &so).map_err(|e| BenchError::setup(format!("opening {p}"), e))
            })?
            .device;
        let chunk = 1usize << 20;
        let buf = blockdev::AlignedBuf::for_direct_io(chunk);
        let t0 = Instant::now();
        let mut off = 0;
        while off < size {
            let n = (chunk as u64).min(size - off) as usize;
            dev.write_at(off, &buf.as_slice()[..n], WriteFlags::empty()).map_err(|source| {
                BenchError::Device { op: crate::gen::Dir::Write, offset: off, len: n as u64, source }
            })?;
            off += n as u64;
        }
        dev.flush().map_err(|source| BenchError::Flush { source })?;
        return Ok((size, t0.elapsed().as_secs_f64()));
    }
    let p =
        path.to_str().ok_or_else(|| BenchError::usage(format!("{}: not a UTF-8 path", path.display())))?;
    let mut key = vec![0u8; 32];
    rand::RngCore::fill_bytes(&mut rand::rng(), &mut key);
    let mut salt = [0u8; 16];
    rand::RngCore::fill_bytes(&mut rand::rng(), &mut salt);
    let params = st.integrity_params(&key);
    let t0 = Instant::now();
    let r = volume::integrity::format(p, &params, salt, false, |_, _| {})
        .map_err(|e| BenchError::setup(format!("formatting {p}"), e))?;
    Ok((r.wiped_bytes, t0.elapsed().as_secs_f64()))
}

/// Runs a format comparison.
pub fn run(c: &FormatComparison, env: &CompareEnv) -> Result<ComparisonResult, BenchError> {
    check(c)?;
    // samples[variant] = (bytes/s, formats/s, ns)
    let mut samples: Vec<Vec<(f64, f64, f64)>> = vec![Vec::new(); c.variants.len()];
    for rep in 0..c.repetitions {
        for (vi, v) in c.variants.iter().enumerate() {
            if let Some(stop) = &env.run.stop {
                if stop.load(std::sync::atomic::Ordering::Relaxed) {
                    return Err(BenchError::Interrupted);
                }
            }
            let (bytes, secs) = one(v, &env.dir, c.volume_size)?;
            let secs = secs.max(1e-9);
            if env.chatty {
                eprintln!(
                    "bench: rep {}/{} {:<14} format  {} in {:.2} s = {}",
                    rep + 1,
                    c.repetitions,
                    v.name,
                    format_size(bytes),
                    secs,
                    crate::report::fmt_bw(bytes as f64 / secs)
                );
            }
            samples[vi].push((bytes as f64 / secs, 1.0 / secs, secs * 1e9));
        }
    }
    let mut base = None;
    let cells = c
        .variants
        .iter()
        .zip(&samples)
        .map(|(v, s)| {
            let bw = Spread::of(&s.iter().map(|x| x.0).collect::<Vec<_>>());
            let change_pct = base.filter(|b: &f64| *b > 0.0).map(|b| (bw.median / b - 1.0) * 100.0);
            if base.is_none() {
                base = Some(bw.median);
            }
            Cell {
                variant: v.name.clone(),
                read: None,
                write: Some(CellDir {
                    iops: Spread::of(&s.iter().map(|x| x.1).collect::<Vec<_>>()),
                    lat_mean_ns: Spread::of(&s.iter().map(|x| x.2).collect::<Vec<_>>()),
                    bw_bytes: bw,
                    change_pct,
                }),
            }
        })
        .collect();
    Ok(ComparisonResult {
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
                stack: match v.stack.kind {
                    StackKind::Raw => {
                        format!("raw sequential write, 1M requests + flush ({})", v.stack.describe())
                    }
                    _ => format!("integritysetup format with wipe: {}", v.stack.describe()),
                },
                job_overrides: Vec::new(),
            })
            .collect(),
        points: vec![PointResult {
            label: "format".into(),
            jobs: vec![format!(
                "format: {} provided (integrity: superblock, journal, then zeroes with valid tags over every \
                 block) or written (raw); one request = one whole format, lat = its time",
                format_size(c.volume_size)
            )],
            cells,
        }],
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::stack::StackSpec;

    #[test]
    fn formats_and_raw_writes_are_timed() {
        let dir = tempfile::tempdir().unwrap();
        let mut integ = StackSpec::default();
        integ.set("stack", "integrity").unwrap();
        integ.set("integrity-alg", "hmac-sha256").unwrap();
        integ.set("hash-mode", "inline").unwrap();
        let c = FormatComparison {
            title: "t".into(),
            knob: "k".into(),
            seed: None,
            note: None,
            variants: vec![Variant::new("raw", StackSpec::raw()), Variant::new("hmac", integ)],
            repetitions: 2,
            volume_size: 4 << 20,
        };
        let env = CompareEnv { dir: dir.path().to_path_buf(), run: Default::default(), chatty: false };
        let r = run(&c, &env).unwrap();
        assert_eq!(r.points.len(), 1);
        let cells = &r.points[0].cells;
        assert_eq!(cells.len(), 2);
        for cell in cells {
            let w = cell.write.as_ref().unwrap();
            assert_eq!(w.bw_bytes.samples.len(), 2);
            assert!(w.bw_bytes.median > 0.0);
        }
        assert!(cells[1].write.as_ref().unwrap().change_pct.is_some());
        assert!(crate::compare::table(&r).contains("format"));
        // Temporary files are gone.
        assert_eq!(std::fs::read_dir(dir.path()).unwrap().count(), 0);
        let mut bad = c.clone();
        bad.variants[1].stack.set("stack", "crypt").unwrap();
        assert!(check(&bad).is_err());
    }
}
