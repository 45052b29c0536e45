//! A job, in fio's vocabulary: what to do to the target, how much, how concurrently.
//!
//! The option names are fio's (`rw`, `rwmixread`, `bs`, `size`, `offset`, `iodepth`,
//! `numjobs`, `runtime`, `time_based`, `ramp_time`, `loops`, `sync`, `end_fsync`, `verify`,
//! `randseed`) so a fio command line translates word for word. Sizes take fio's suffixes
//! (`4k`, `1M`, `2g`: powers of two), durations take `500ms`, `5s`, `2m` (a bare number is
//! seconds, as in fio).
//!
//! How much a job does (fio's rules):
//! ```text
//!   time_based      loop over the region until ramp_time + runtime has passed
//!   runtime only    stop after size × loops bytes or at runtime, whichever comes first
//!   neither         size × loops bytes
//! ```
//! `direct` is not a job option here: it is how a volume is opened, so it belongs to the stack
//! (`StackSpec::direct`); an NBD server decides it for itself.

use std::fmt;
use std::str::FromStr;
use std::time::Duration;

use serde::Serialize;

use crate::BenchError;

/// The I/O pattern (`rw=`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize)]
#[serde(rename_all = "lowercase")]
pub enum RwMode {
    /// Sequential reads.
    Read,
    /// Sequential writes.
    Write,
    /// Random reads.
    RandRead,
    /// Random writes.
    RandWrite,
    /// Sequential mixed reads and writes (`rw` or `readwrite`).
    ReadWrite,
    /// Random mixed reads and writes.
    RandRw,
}

impl RwMode {
    /// Whether offsets are random.
    pub fn is_random(self) -> bool {
        matches!(self, RwMode::RandRead | RwMode::RandWrite | RwMode::RandRw)
    }
    /// Whether reads and writes are mixed (`rwmixread` applies).
    pub fn is_mixed(self) -> bool {
        matches!(self, RwMode::ReadWrite | RwMode::RandRw)
    }
    /// Whether the job writes at all.
    pub fn writes(self) -> bool {
        !matches!(self, RwMode::Read | RwMode::RandRead)
    }
    /// Whether the job reads at all.
    pub fn reads(self) -> bool {
        !matches!(self, RwMode::Write | RwMode::RandWrite)
    }
}

impl FromStr for RwMode {
    type Err = BenchError;
    fn from_str(s: &str) -> Result<Self, BenchError> {
        Ok(match s {
            "read" => RwMode::Read,
            "write" => RwMode::Write,
            "randread" => RwMode::RandRead,
            "randwrite" => RwMode::RandWrite,
            "rw" | "readwrite" => RwMode::ReadWrite,
            "randrw" => RwMode::RandRw,
            _ => {
                return Err(BenchError::usage(format!(
                    "rw={s}: expected read, write, randread, randwrite, rw, readwrite or randrw"
                )))
            }
        })
    }
}

impl fmt::Display for RwMode {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(match self {
            RwMode::Read => "read",
            RwMode::Write => "write",
            RwMode::RandRead => "randread",
            RwMode::RandWrite => "randwrite",
            RwMode::ReadWrite => "rw",
            RwMode::RandRw => "randrw",
        })
    }
}

/// One job (fio's `[job]` section); `numjobs` clones of it run side by side and are reported
/// together (fio's `group_reporting`).
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct JobSpec {
    /// Job name in reports.
    pub name: String,
    /// I/O pattern.
    pub rw: RwMode,
    /// Percentage of reads in a mixed job (fio default 50).
    pub rwmixread: u8,
    /// Block size in bytes: every request is this long and aligned to it within the region.
    pub bs: u64,
    /// Length of the region, from `offset`; `None` = to the end of the target.
    pub size: Option<u64>,
    /// Start of the region in bytes.
    pub offset: u64,
    /// Requests in flight per clone. In-process this is the number of worker threads each
    /// making synchronous calls (fio's psync engine with `numjobs`); over NBD it is the number
    /// of requests pipelined on the clone's one connection (fio's nbd engine).
    pub iodepth: u32,
    /// Independent clones of the job, each with its own offsets (seed + clone index) and,
    /// over NBD, its own connection.
    pub numjobs: u32,
    /// Measured duration (after `ramp_time`).
    #[serde(serialize_with = "ser_opt_ms", rename = "runtime_ms")]
    pub runtime: Option<Duration>,
    /// Keep going until `runtime` has passed, whatever `size` says.
    pub time_based: bool,
    /// Run this long before measuring anything.
    #[serde(serialize_with = "ser_ms", rename = "ramp_time_ms")]
    pub ramp_time: Duration,
    /// Passes over the region (not time-based).
    pub loops: u32,
    /// Every write is durable on completion: `WriteFlags::FUA` in-process (devices emulate it
    /// with a flush where they must), `NBD_CMD_FLAG_FUA` over NBD.
    pub sync: bool,
    /// Flush once at the end of the job (not counted as a request).
    pub end_fsync: bool,
    /// Write a header in every block (offset, seed, checksum), check reads against it during
    /// the job, and read back every written block after it.
    pub verify: bool,
    /// Seed of the random offsets and the read/write mix (fio's `randrepeat` behaviour: the
    /// same seed gives every target the same sequence).
    pub randseed: u64,
}

fn ser_ms<S: serde::Serializer>(d: &Duration, s: S) -> Result<S::Ok, S::Error> {
    s.serialize_u64(d.as_millis() as u64)
}
fn ser_opt_ms<S: serde::Serializer>(d: &Option<Duration>, s: S) -> Result<S::Ok, S::Error> {
    match d {
        Some(d) => s.serialize_u64(d.as_millis() as u64),
        None => s.serialize_none(),
    }
}

impl Default for JobSpec {
    fn default() -> Self {
        JobSpec {
            name: "job".into(),
            rw: RwMode::Read,
            rwmixread: 50,
            bs: 4096,
            size: None,
            offset: 0,
            iodepth: 1,
            numjobs: 1,
            runtime: None,
            time_based: false,
            ramp_time: Duration::ZERO,
            loops: 1,
            sync: false,
            end_fsync: false,
            verify: false,
            randseed: 0x5ea1_d15c,
        }
    }
}

impl JobSpec {
    /// A job with the given pattern and block size, fio defaults otherwise.
    pub fn new(name: impl Into<String>, rw: RwMode, bs: u64) -> Self {
        JobSpec { name: name.into(), rw, bs, ..JobSpec::default() }
    }

    /// Time-based for `runtime` after `ramp`.
    pub fn timed(mut self, runtime: Duration, ramp: Duration) -> Self {
        self.runtime = Some(runtime);
        self.time_based = true;
        self.ramp_time = ramp;
        self
    }

    /// Sets the queue depth.
    pub fn depth(mut self, iodepth: u32) -> Self {
        self.iodepth = iodepth;
        self
    }

    /// Checks the options that do not depend on the target.
    pub fn validate(&self) -> Result<(), BenchError> {
        let bad = |m: String| Err(BenchError::usage(m));
        if self.bs == 0 || self.bs > 64 << 20 {
            return bad(format!("bs={} must be between 1 and 64 MiB", self.bs));
        }
        if self.iodepth == 0 || self.iodepth > 1024 {
            return bad(format!("iodepth={} must be between 1 and 1024", self.iodepth));
        }
        if self.numjobs == 0 || self.numjobs > 256 {
            return bad(format!("numjobs={} must be between 1 and 256", self.numjobs));
        }
        if self.rwmixread > 100 {
            return bad(format!("rwmixread={} is a percentage", self.rwmixread));
        }
        if self.loops == 0 {
            return bad("loops must be at least 1".into());
        }
        if self.time_based && self.runtime.is_none() {
            return bad("time_based needs a runtime".into());
        }
        if matches!(self.size, Some(0)) {
            return bad("size must not be 0".into());
        }
        Ok(())
    }

    /// A one-line description in fio's words.
    pub fn describe(&self) -> String {
        let mut s = format!("rw={}", self.rw);
        if self.rw.is_mixed() {
            s.push_str(&format!(" rwmixread={}", self.rwmixread));
        }
        s.push_str(&format!(" bs={} iodepth={}", format_size(self.bs), self.iodepth));
        if self.numjobs > 1 {
            s.push_str(&format!(" numjobs={}", self.numjobs));
        }
        if let Some(size) = self.size {
            s.push_str(&format!(" size={}", format_size(size)));
        }
        if self.offset > 0 {
            s.push_str(&format!(" offset={}", format_size(self.offset)));
        }
        if let Some(r) = self.runtime {
            s.push_str(&format!(" runtime={}", format_duration(r)));
        }
        if self.time_based {
            s.push_str(" time_based");
        }
        if !self.ramp_time.is_zero() {
            s.push_str(&format!(" ramp_time={}", format_duration(self.ramp_time)));
        }
        if self.loops > 1 {
            s.push_str(&format!(" loops={}", self.loops));
        }
        if self.sync {
            s.push_str(" sync=1");
        }
        if self.end_fsync {
            s.push_str(" end_fsync=1");
        }
        if self.verify {
            s.push_str(" verify=1");
        }
        s
    }

    /// Applies one `key=value` option in fio's spelling (`-` and `_` are the same).
    /// Returns `Ok(false)` for a key that is not a job option.
    pub fn set(&mut self, key: &str, value: &str) -> Result<bool, BenchError> {
        let key = key.replace('-', "_");
        match key.as_str() {
            "name" => self.name = value.to_string(),
            "rw" | "readwrite" => self.rw = value.parse()?,
            "rwmixread" => self.rwmixread = parse_num(&key, value)?,
            "rwmixwrite" => self.rwmixread = 100u8.saturating_sub(parse_num(&key, value)?),
            "bs" | "blocksize" => self.bs = parse_size(value)?,
            "size" => self.size = Some(parse_size(value)?),
            "offset" => self.offset = parse_size(value)?,
            "iodepth" => self.iodepth = parse_num(&key, value)?,
            "numjobs" => self.numjobs = parse_num(&key, value)?,
            "runtime" => self.runtime = Some(parse_duration(value)?),
            "time_based" => self.time_based = parse_bool(&key, value)?,
            "ramp_time" => self.ramp_time = parse_duration(value)?,
            "loops" => self.loops = parse_num(&key, value)?,
            "sync" => self.sync = parse_bool(&key, value)?,
            "end_fsync" => self.end_fsync = parse_bool(&key, value)?,
            "verify" => self.verify = parse_verify(value)?,
            "randseed" => self.randseed = parse_num(&key, value)?,
            _ => return Ok(false),
        }
        Ok(true)
    }
}

fn parse_num<T: FromStr>(key: &str, v: &str) -> Result<T, BenchError> {
    v.trim().parse().map_err(|_| BenchError::usage(format!("{key}={v}: not a valid number")))
}

/// fio booleans: `1`/`0`, `true`/`false`, `yes`/`no`, and a bare flag (empty value) is true.
pub fn parse_bool(key: &str, v: &str) -> Result<bool, BenchError> {
    match v.trim() {
        "" | "1" | "true" | "yes" | "on" => Ok(true),
        "0" | "false" | "no" | "off" => Ok(false),
        _ => Err(BenchError::usage(format!("{key}={v}: expected 0 or 1"))),
    }
}

/// `verify=`: on/off, or a fio verify method name (all mean this harness's header check).
pub fn parse_verify(v: &str) -> Result<bool, BenchError> {
    match v.trim() {
        "" | "1" | "true" | "yes" | "on" | "crc32c" | "meta" | "header" | "md5" | "sha256" => Ok(true),
        "0" | "false" | "no" | "off" | "null" => Ok(false),
        _ => Err(BenchError::usage(format!("verify={v}: expected 0, 1 or a method name (crc32c)"))),
    }
}

/// Parses a size with fio's suffixes: `k`, `m`, `g`, `t` (also `KiB`, `MB`, ...), all powers
/// of 1024 as in fio's default `kb_base=1024`.
pub fn parse_size(s: &str) -> Result<u64, BenchError> {
    let t = s.trim();
    let split = t.find(|c: char| !c.is_ascii_digit()).unwrap_or(t.len());
    let (num, suffix) = t.split_at(split);
    let n: u64 = num.parse().map_err(|_| {
        BenchError::usage(format!("size {s:?}: expected a number with an optional k/M/G suffix"))
    })?;
    let mult: u64 = match suffix.to_ascii_lowercase().as_str() {
        "" | "b" => 1,
        "k" | "kb" | "kib" => 1 << 10,
        "m" | "mb" | "mib" => 1 << 20,
        "g" | "gb" | "gib" => 1 << 30,
        "t" | "tb" | "tib" => 1 << 40,
        _ => return Err(BenchError::usage(format!("size {s:?}: unknown suffix {suffix:?}"))),
    };
    n.checked_mul(mult).ok_or_else(|| BenchError::usage(format!("size {s:?} is too large")))
}

/// Parses a duration: a bare number is seconds (fio), or `us`, `ms`, `s`, `m`, `h` suffixes.
pub fn parse_duration(s: &str) -> Result<Duration, BenchError> {
    let t = s.trim();
    let split = t.find(|c: char| !(c.is_ascii_digit() || c == '.')).unwrap_or(t.len());
    let (num, suffix) = t.split_at(split);
    let n: f64 =
        num.parse().map_err(|_| BenchError::usage(format!("duration {s:?}: expected e.g. 5, 500ms, 2m")))?;
    let secs = match suffix {
        "" | "s" | "sec" => n,
        "ms" | "msec" => n / 1e3,
        "us" | "usec" => n / 1e6,
        "m" | "min" => n * 60.0,
        "h" => n * 3600.0,
        _ => return Err(BenchError::usage(format!("duration {s:?}: unknown unit {suffix:?}"))),
    };
    if !(0.0..=1e7).contains(&secs) {
        return Err(BenchError::usage(format!("duration {s:?} is out of range")));
    }
    Ok(Duration::from_secs_f64(secs))
}

/// `4096` → `4k`, `1048576` → `1M`: the largest binary suffix that divides exactly.
pub fn format_size(n: u64) -> String {
    for (shift, suf) in [(40, "T"), (30, "G"), (20, "M"), (10, "k")] {
        if n >= 1 << shift && n % (1 << shift) == 0 {
            return format!("{}{suf}", n >> shift);
        }
    }
    n.to_string()
}

/// `5s`, `500ms`.
pub fn format_duration(d: Duration) -> String {
    let ms = d.as_millis();
    if ms % 1000 == 0 {
        format!("{}s", ms / 1000)
    } else {
        format!("{ms}ms")
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn sizes_parse_with_fio_suffixes() {
        assert_eq!(parse_size("4k").unwrap(), 4096);
        assert_eq!(parse_size("4K").unwrap(), 4096);
        assert_eq!(parse_size("1M").unwrap(), 1 << 20);
        assert_eq!(parse_size("64MiB").unwrap(), 64 << 20);
        assert_eq!(parse_size("2g").unwrap(), 2 << 30);
        assert_eq!(parse_size("512").unwrap(), 512);
        assert!(parse_size("4q").is_err());
        assert!(parse_size("").is_err());
        assert!(parse_size("99999999999T").is_err());
        assert_eq!(format_size(4096), "4k");
        assert_eq!(format_size(1 << 20), "1M");
        assert_eq!(format_size(1536), "1536");
    }

    #[test]
    fn durations_parse_bare_seconds_and_units() {
        assert_eq!(parse_duration("5").unwrap(), Duration::from_secs(5));
        assert_eq!(parse_duration("500ms").unwrap(), Duration::from_millis(500));
        assert_eq!(parse_duration("1.5s").unwrap(), Duration::from_millis(1500));
        assert_eq!(parse_duration("2m").unwrap(), Duration::from_secs(120));
        assert!(parse_duration("5x").is_err());
        assert_eq!(format_duration(Duration::from_millis(2500)), "2500ms");
    }

    #[test]
    fn options_apply_in_fio_spelling() {
        let mut j = JobSpec::default();
        assert!(j.set("rw", "randrw").unwrap());
        assert!(j.set("rwmixread", "70").unwrap());
        assert!(j.set("ramp-time", "1").unwrap());
        assert!(j.set("time_based", "").unwrap());
        assert!(j.set("runtime", "3").unwrap());
        assert!(j.set("verify", "crc32c").unwrap());
        assert!(!j.set("crypt-mode", "pool").unwrap());
        assert_eq!(j.rw, RwMode::RandRw);
        assert_eq!(j.rwmixread, 70);
        assert!(j.time_based && j.verify);
        j.validate().unwrap();
        assert_eq!(
            j.describe(),
            "rw=randrw rwmixread=70 bs=4k iodepth=1 runtime=3s time_based ramp_time=1s verify=1"
        );
        assert!(j.set("rw", "sideways").is_err());
        j.iodepth = 0;
        assert!(j.validate().is_err());
    }
}
