//! Filesystem workloads: ext4 made by the host kernel on the volume, served as a FUSE file
//! on a loop device, with the seeds' filesystem experiments run on it by the real tools.
//!
//! ```text
//!   for rep in 1..=R, for variant (interleaved, like compare):
//!     StackSpec::build ─► temporary volume (integrity/LUKS stacks preconditioned: every block
//!       written once, so nothing reads an unwritten tag)
//!     fuse::mount(DIR, device) ─► DIR/vol ─► losetup ─► /dev/loopN ─► mkfs.ext4, mount
//!     Untar (seed 004): mkfs.ext4 | tar -x TREE + sync | rm -rf + sync, each phase timed
//!     Fio (seed 002):   fio randrw numjobs=8 psync direct=1 on one file of the ext4, per bs
//!     umount, losetup -d, fusermount3 -u, the server thread joined, the volume deleted
//! ```
//! The result is an ordinary [`ComparisonResult`], so the table, the JSON report and the
//! chart treat it like any other comparison. A timed phase is one "request": IOPS = 1/time,
//! lat = its time, bandwidth = the bytes it handles (the volume for mkfs, the tree for untar
//! and rm) per second. Fio cells are fio's own read/write bandwidth, IOPS and mean latency.
//!
//! Needs root (loop devices, mount), `/dev/fuse`, `fusermount3`, `losetup`, `mkfs.ext4`,
//! `mount`, `tar` and, for fio workloads, `fio`: [`host_ready`] says what is missing, and
//! callers skip loudly.

use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use crate::compare::{
    Cell, CellDir, CompareEnv, ComparisonResult, PointResult, Spread, Variant, VariantInfo,
};
use crate::rng::SplitMix64;
use crate::spec::format_size;
use crate::stack::StackKind;
use crate::BenchError;

/// What runs on the filesystem.
#[derive(Debug, Clone)]
pub enum FsWorkload {
    /// Seed 004: `mkfs.ext4`, unpack a source tree (`tar -x` then `sync`), `rm -rf` it (then
    /// `sync`); each phase timed.
    Untar {
        /// The tree: a generated one of about this many bytes, or a tarball given.
        tree: TreeSource,
    },
    /// Seed 002: `fio --rw=randrw --ioengine=psync --direct=1 --iodepth=1` with `numjobs`
    /// jobs on one shared file of `file_size` bytes, once per block size.
    Fio {
        /// Block sizes (one point each).
        bs: Vec<u64>,
        /// fio's numjobs.
        numjobs: u32,
        /// The file's size.
        file_size: u64,
        /// Measured time per cell.
        runtime: Duration,
        /// Ramp per cell.
        ramp: Duration,
    },
}

/// Where the tree to unpack comes from.
#[derive(Debug, Clone)]
pub enum TreeSource {
    /// A generated tree of about this many bytes: directories four deep, files of a source
    /// tree's sizes (most a few KiB, a long tail to a few hundred KiB), random contents.
    Generated(u64),
    /// A tarball (`tar -xf` reads any compression it knows).
    Tarball(PathBuf),
}

/// A filesystem comparison.
#[derive(Debug, Clone)]
pub struct FsComparison {
    /// Title.
    pub title: String,
    /// The knob the variants turn.
    pub knob: String,
    /// The seed experiment this reproduces, if any.
    pub seed: Option<String>,
    /// Anything the reader must know.
    pub note: Option<String>,
    /// In-process stacks; the first is the baseline of the change column.
    pub variants: Vec<Variant>,
    /// What runs.
    pub workload: FsWorkload,
    /// Repetitions, interleaved.
    pub repetitions: u32,
    /// Volume size.
    pub volume_size: u64,
}

/// Checks a filesystem comparison before anything runs.
pub fn check(c: &FsComparison) -> Result<(), BenchError> {
    if c.variants.len() < 2 || c.repetitions == 0 {
        return Err(BenchError::usage(format!("{}: needs two variants and one repetition", c.title)));
    }
    if c.volume_size < 32 << 20 {
        return Err(BenchError::usage(format!("{}: ext4 needs a volume of 32M at least", c.title)));
    }
    if let FsWorkload::Fio { bs, numjobs, file_size, .. } = &c.workload {
        if bs.is_empty() || *numjobs == 0 || *file_size == 0 || *file_size > c.volume_size / 2 {
            return Err(BenchError::usage(format!(
                "{}: fio needs block sizes, jobs and a file of at most half the volume",
                c.title
            )));
        }
    }
    for v in &c.variants {
        if v.target.is_some() {
            return Err(BenchError::usage(format!(
                "{}: variant {}: in-process stacks only",
                c.title, v.name
            )));
        }
        v.stack.check()?;
    }
    Ok(())
}

/// What this host lacks for a filesystem workload (root, `/dev/fuse`, `fusermount3`, loop
/// devices, the tools), or `Ok` when it can run one. `fio` is needed only when `fio` is set.
pub fn host_ready(fio: bool) -> Result<(), String> {
    if !rustix::process::geteuid().is_root() {
        return Err("needs root (losetup and mount)".into());
    }
    let probe = tempfile::tempdir().map_err(|e| format!("a temporary directory: {e}"))?;
    fuse::check_mountpoint(probe.path()).map_err(|e| e.to_string())?;
    if !Path::new("/dev/loop-control").exists() {
        return Err("no loop devices (/dev/loop-control; modprobe loop)".into());
    }
    let mut tools = vec![("losetup", "-V"), ("mkfs.ext4", "-V"), ("mount", "-V"), ("tar", "--version")];
    if fio {
        tools.push(("fio", "--version"));
    }
    for (tool, arg) in tools {
        let ok = Command::new(tool)
            .arg(arg)
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .status()
            .is_ok_and(|s| s.success());
        if !ok {
            return Err(format!("{tool} is not installed"));
        }
    }
    Ok(())
}

/// Runs `cmd`, failing with its stderr; returns its stdout.
fn run_tool(cmd: &mut Command) -> Result<String, BenchError> {
    let what = format!("{cmd:?}");
    let out =
        cmd.stdin(Stdio::null()).output().map_err(|e| BenchError::setup(format!("running {what}"), e))?;
    if !out.status.success() {
        return Err(BenchError::setup(
            format!("{what} failed ({})", out.status),
            std::io::Error::other(String::from_utf8_lossy(&out.stderr).trim().to_string()),
        ));
    }
    Ok(String::from_utf8_lossy(&out.stdout).into_owned())
}

fn sync_fs(dir: &Path) -> Result<(), BenchError> {
    run_tool(Command::new("sync").arg("-f").arg(dir)).map(|_| ())
}

/// Writes a generated source-like tree of about `bytes` under `root/tree`; returns its size.
fn generate_tree(root: &Path, bytes: u64) -> Result<u64, BenchError> {
    let io = |e: std::io::Error| BenchError::setup(format!("generating a tree in {}", root.display()), e);
    let mut rng = SplitMix64::new(0x5eed_0004);
    let mut total = 0u64;
    let mut buf = vec![0u8; 512 << 10];
    let mut n = 0u64;
    while total < bytes {
        // 16 top directories, 16 below each, 8 below those: about a kernel tree's fan-out.
        let dir = root.join(format!("tree/d{:02}/s{:02}/t{}", n % 16, (n / 16) % 16, (n / 256) % 8));
        std::fs::create_dir_all(&dir).map_err(io)?;
        // Sizes: most between 1 and 16 KiB, one in sixteen up to 256 KiB.
        let len = if rng.below(16) == 0 { 4096 + rng.below(252 << 10) } else { 512 + rng.below(15 << 10) };
        let len = len.min(bytes - total).max(1) as usize;
        rng.fill(&mut buf[..len]);
        std::fs::write(dir.join(format!("f{n}.c")), &buf[..len]).map_err(io)?;
        total += len as u64;
        n += 1;
    }
    Ok(total)
}

/// The tarball to unpack and the bytes it unpacks to.
fn prepare_tree(src: &TreeSource, scratch: &Path) -> Result<(PathBuf, u64), BenchError> {
    match src {
        TreeSource::Tarball(p) => {
            let listing = run_tool(Command::new("tar").arg("-tvf").arg(p))?;
            // `tar -tv` columns: mode owner size date time name.
            let bytes =
                listing.lines().filter_map(|l| l.split_whitespace().nth(2)?.parse::<u64>().ok()).sum();
            Ok((p.clone(), bytes))
        }
        TreeSource::Generated(bytes) => {
            let bytes = generate_tree(scratch, *bytes)?;
            let tar = scratch.join("tree.tar");
            run_tool(Command::new("tar").arg("-cf").arg(&tar).arg("-C").arg(scratch).arg("tree"))?;
            std::fs::remove_dir_all(scratch.join("tree"))
                .map_err(|e| BenchError::setup("removing the generated tree", e))?;
            Ok((tar, bytes))
        }
    }
}

/// A volume served as a FUSE file on a loop device, with ext4 mounted (once `mkfs` ran);
/// dropping it unmounts everything, detaches the loop device and stops the server.
struct Ext4OnFuse {
    fuse_dir: tempfile::TempDir,
    fs_dir: tempfile::TempDir,
    loop_dev: Option<String>,
    fs_mounted: bool,
    unmounter: Option<fuse::Unmounter>,
    server: Option<std::thread::JoinHandle<Result<(), fuse::FuseError>>>,
}

impl Ext4OnFuse {
    fn serve(
        device: std::sync::Arc<dyn blockdev::BlockDevice>,
        dir: &Path,
    ) -> Result<Ext4OnFuse, BenchError> {
        let tmp = |what: &str| {
            tempfile::Builder::new()
                .prefix(&format!("sealdisk-bench-{what}-"))
                .tempdir_in(dir)
                .map_err(|e| BenchError::setup(format!("a mount directory in {}", dir.display()), e))
        };
        let (fuse_dir, fs_dir) = (tmp("fuse")?, tmp("ext4")?);
        let cfg = fuse::FuseConfig { name: "vol".into(), threads: 8, read_only: false };
        let m = fuse::mount(fuse_dir.path(), device, &cfg)
            .map_err(|e| BenchError::setup(format!("mounting FUSE on {}", fuse_dir.path().display()), e))?;
        let unmounter = m.unmounter();
        let server = std::thread::Builder::new()
            .name("bench-fuse".into())
            .spawn(move || m.run())
            .map_err(|e| BenchError::setup("starting the FUSE server thread", e))?;
        let mut me = Ext4OnFuse {
            fuse_dir,
            fs_dir,
            loop_dev: None,
            fs_mounted: false,
            unmounter: Some(unmounter),
            server: Some(server),
        };
        let file = me.fuse_dir.path().join("vol");
        let dev = run_tool(Command::new("losetup").args(["-f", "--show"]).arg(&file))?;
        me.loop_dev = Some(dev.trim().to_string());
        Ok(me)
    }

    fn dev(&self) -> &str {
        self.loop_dev.as_deref().unwrap_or_default()
    }

    /// `mkfs.ext4` (no discard: through the FUSE file a discard writes zeroes), timed.
    fn mkfs(&self) -> Result<f64, BenchError> {
        let t0 = Instant::now();
        run_tool(Command::new("mkfs.ext4").args(["-q", "-F", "-E", "nodiscard"]).arg(self.dev()))?;
        Ok(t0.elapsed().as_secs_f64())
    }

    fn mount(&mut self) -> Result<(), BenchError> {
        run_tool(Command::new("mount").args(["-t", "ext4"]).arg(self.dev()).arg(self.fs_dir.path()))?;
        self.fs_mounted = true;
        Ok(())
    }
}

impl Drop for Ext4OnFuse {
    fn drop(&mut self) {
        let quiet = |cmd: &mut Command| {
            if let Err(e) = run_tool(cmd) {
                log::warn!(
                    "cleaning up: {e}: {}",
                    std::error::Error::source(&e).map(|s| s.to_string()).unwrap_or_default()
                );
            }
        };
        if self.fs_mounted {
            quiet(Command::new("umount").arg(self.fs_dir.path()));
        }
        if let Some(dev) = self.loop_dev.take() {
            quiet(Command::new("losetup").arg("-d").arg(dev));
        }
        if let Some(mut u) = self.unmounter.take() {
            u.unmount();
        }
        if let Some(s) = self.server.take() {
            // The server returns once the loop device has let the file go; never wait forever
            // for a device that could not be detached.
            let t0 = Instant::now();
            while !s.is_finished() && t0.elapsed() < Duration::from_secs(30) {
                std::thread::sleep(Duration::from_millis(20));
            }
            if !s.is_finished() {
                log::warn!(
                    "the FUSE server on {} did not stop; left running",
                    self.fuse_dir.path().display()
                );
                return;
            }
            match s.join() {
                Ok(Ok(())) => {}
                Ok(Err(e)) => log::warn!("the FUSE server: {e}"),
                Err(_) => log::warn!("the FUSE server thread panicked"),
            }
        }
    }
}

/// One fio cell's (read, write) as (bytes/s, IOPS, mean latency ns).
type FioCell = [(f64, f64, f64); 2];

fn parse_fio(json: &str) -> Result<FioCell, BenchError> {
    let bad =
        |what: &str| BenchError::setup("reading fio's JSON output", std::io::Error::other(what.to_string()));
    let v: serde_json::Value =
        serde_json::from_str(json).map_err(|e| BenchError::setup("parsing fio's JSON", e))?;
    let job = v.get("jobs").and_then(|j| j.get(0)).ok_or_else(|| bad("no jobs"))?;
    let dir = |d: &str| -> Result<(f64, f64, f64), BenchError> {
        let x = job.get(d).ok_or_else(|| bad("no read/write section"))?;
        let num = |k: &str| x.get(k).and_then(serde_json::Value::as_f64);
        let lat = x.get("lat_ns").and_then(|l| l.get("mean")).and_then(serde_json::Value::as_f64);
        Ok((
            num("bw_bytes").ok_or_else(|| bad("no bw_bytes"))?,
            num("iops").unwrap_or(0.0),
            lat.unwrap_or(0.0),
        ))
    };
    Ok([dir("read")?, dir("write")?])
}

fn fio_cell(
    m: &Ext4OnFuse,
    bs: u64,
    numjobs: u32,
    file_size: u64,
    runtime: Duration,
    ramp: Duration,
) -> Result<FioCell, BenchError> {
    let file = m.fs_dir.path().join("fio.dat");
    let out = run_tool(
        Command::new("fio")
            .arg(format!("--name=randrw-{}", format_size(bs)))
            .arg(format!("--filename={}", file.display()))
            .args(["--ioengine=psync", "--direct=1", "--rw=randrw", "--rwmixread=50", "--iodepth=1"])
            .arg(format!("--numjobs={numjobs}"))
            .arg(format!("--size={file_size}"))
            .arg(format!("--bs={bs}"))
            .arg(format!("--runtime={}ms", runtime.as_millis().max(1)))
            .arg(format!("--ramp_time={}ms", ramp.as_millis()))
            .args(["--time_based", "--group_reporting", "--output-format=json"]),
    )?;
    // fio may print notes before the JSON object.
    let start = out.find('{').ok_or_else(|| {
        BenchError::setup("reading fio's output", std::io::Error::other("no JSON in fio's output"))
    })?;
    parse_fio(&out[start..])
}

/// Per point, per variant, per repetition: (read, write) samples.
type Samples = Vec<Vec<Vec<[Option<(f64, f64, f64)>; 2]>>>;

/// Runs a filesystem comparison. The caller checks [`host_ready`] first (and skips loudly).
pub fn run(c: &FsComparison, env: &CompareEnv) -> Result<ComparisonResult, BenchError> {
    check(c)?;
    let scratch = tempfile::Builder::new()
        .prefix("sealdisk-bench-tree-")
        .tempdir_in(&env.dir)
        .map_err(|e| BenchError::setup(format!("a scratch directory in {}", env.dir.display()), e))?;
    let (labels, jobs, tree) = match &c.workload {
        FsWorkload::Untar { tree } => {
            let (tar, bytes) = prepare_tree(tree, scratch.path())?;
            let labels = vec!["mkfs".to_string(), "untar+sync".into(), "rm+sync".into()];
            let jobs = vec![
                format!(
                    "mkfs.ext4 -E nodiscard on {} (bw = volume bytes / time)",
                    format_size(c.volume_size)
                ),
                format!(
                    "tar -xf {} ({} of files) then sync -f; bw = tree bytes / time",
                    tar.display(),
                    format_size(bytes)
                ),
                "rm -rf of the tree then sync -f; bw = tree bytes / time".into(),
            ];
            (labels, jobs, Some((tar, bytes)))
        }
        FsWorkload::Fio { bs, numjobs, file_size, runtime, ramp } => {
            let labels = bs.iter().map(|b| format_size(*b)).collect();
            let jobs = bs
                .iter()
                .map(|b| {
                    format!(
                        "fio rw=randrw rwmixread=50 ioengine=psync direct=1 iodepth=1 numjobs={numjobs} bs={} on one \
                         {} file, runtime={:.1}s ramp_time={:.1}s",
                        format_size(*b),
                        format_size(*file_size),
                        runtime.as_secs_f64(),
                        ramp.as_secs_f64()
                    )
                })
                .collect();
            (labels, jobs, None)
        }
    };
    let mut samples: Samples = vec![vec![Vec::new(); c.variants.len()]; labels.len()];
    for rep in 0..c.repetitions {
        for (vi, v) in c.variants.iter().enumerate() {
            if let Some(stop) = &env.run.stop {
                if stop.load(std::sync::atomic::Ordering::Relaxed) {
                    return Err(BenchError::Interrupted);
                }
            }
            let built = v.stack.build(&env.dir, c.volume_size)?;
            // Unwritten blocks of these fail to read (no tag yet), and mkfs probes: write
            // every block once first, untimed.
            if matches!(
                v.stack.kind,
                StackKind::Integrity | StackKind::CryptIntegrity | StackKind::Luks2Integrity
            ) {
                built.precondition()?;
            }
            let mut m = Ext4OnFuse::serve(built.device.clone(), &env.dir)?;
            let mkfs = m.mkfs()?;
            m.mount()?;
            let timed = |secs: f64, bytes: u64| {
                let secs = secs.max(1e-9);
                [None, Some((bytes as f64 / secs, 1.0 / secs, secs * 1e9))]
            };
            match (&c.workload, &tree) {
                (FsWorkload::Untar { .. }, Some((tar, bytes))) => {
                    let t0 = Instant::now();
                    run_tool(Command::new("tar").arg("-xf").arg(tar).arg("-C").arg(m.fs_dir.path()))?;
                    sync_fs(m.fs_dir.path())?;
                    let untar = t0.elapsed().as_secs_f64();
                    let t0 = Instant::now();
                    for e in std::fs::read_dir(m.fs_dir.path())
                        .map_err(|e| BenchError::setup("listing the tree", e))?
                    {
                        let p = e.map_err(|e| BenchError::setup("listing the tree", e))?.path();
                        if p.file_name().is_some_and(|n| n != "lost+found") {
                            run_tool(Command::new("rm").arg("-rf").arg(&p))?;
                        }
                    }
                    sync_fs(m.fs_dir.path())?;
                    let rm = t0.elapsed().as_secs_f64();
                    for (pi, (secs, b)) in
                        [(mkfs, c.volume_size), (untar, *bytes), (rm, *bytes)].into_iter().enumerate()
                    {
                        samples[pi][vi].push(timed(secs, b));
                    }
                    if env.chatty {
                        eprintln!(
                            "bench: rep {}/{} {:<12} mkfs {mkfs:.2} s, untar+sync {untar:.2} s, rm+sync {rm:.2} s",
                            rep + 1,
                            c.repetitions,
                            v.name
                        );
                    }
                }
                (FsWorkload::Fio { bs, numjobs, file_size, runtime, ramp }, _) => {
                    for (pi, b) in bs.iter().enumerate() {
                        let [r, w] = fio_cell(&m, *b, *numjobs, *file_size, *runtime, *ramp)?;
                        if env.chatty {
                            eprintln!(
                                "bench: rep {}/{} {:<12} randrw {:<5} read {} write {}",
                                rep + 1,
                                c.repetitions,
                                v.name,
                                format_size(*b),
                                crate::report::fmt_bw(r.0),
                                crate::report::fmt_bw(w.0)
                            );
                        }
                        samples[pi][vi].push([Some(r), Some(w)]);
                    }
                }
                _ => return Err(BenchError::Internal("untar workload without a tree".into())),
            }
            drop(m);
            drop(built);
        }
    }
    let points = labels
        .into_iter()
        .zip(jobs)
        .zip(&samples)
        .map(|((label, job), per_variant)| {
            let mut base: [Option<f64>; 2] = [None, None];
            let cells = c
                .variants
                .iter()
                .zip(per_variant)
                .map(|(v, s)| {
                    let mut dirs = [0, 1].map(|d| {
                        let xs: Vec<(f64, f64, f64)> = s.iter().filter_map(|x| x[d]).collect();
                        (!xs.is_empty()).then(|| {
                            let bw = Spread::of(&xs.iter().map(|x| x.0).collect::<Vec<_>>());
                            let change_pct =
                                base[d].filter(|b| *b > 0.0).map(|b| (bw.median / b - 1.0) * 100.0);
                            if base[d].is_none() {
                                base[d] = Some(bw.median);
                            }
                            CellDir {
                                iops: Spread::of(&xs.iter().map(|x| x.1).collect::<Vec<_>>()),
                                lat_mean_ns: Spread::of(&xs.iter().map(|x| x.2).collect::<Vec<_>>()),
                                bw_bytes: bw,
                                change_pct,
                            }
                        })
                    });
                    Cell { variant: v.name.clone(), read: dirs[0].take(), write: dirs[1].take() }
                })
                .collect();
            PointResult { label, jobs: vec![job], cells }
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
                stack: format!("ext4 on a loop device on the FUSE file of {}", v.stack.describe()),
                job_overrides: Vec::new(),
            })
            .collect(),
        points,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn fio_json_gives_read_and_write() {
        let j = r#"{"jobs":[{"read":{"bw_bytes":1000,"iops":10.5,"lat_ns":{"mean":2000.0}},
                    "write":{"bw_bytes":500,"iops":5.0,"lat_ns":{"mean":4000.0}}}]}"#;
        let [r, w] = parse_fio(j).unwrap();
        assert_eq!(r, (1000.0, 10.5, 2000.0));
        assert_eq!(w, (500.0, 5.0, 4000.0));
        assert!(parse_fio("{}").is_err());
        assert!(parse_fio(r#"{"jobs":[{"read":{}}]}"#).is_err());
        assert!(parse_fio("not json").is_err());
    }

    #[test]
    fn generated_trees_have_the_size_asked_and_many_files() {
        let t = tempfile::tempdir().unwrap();
        let bytes = generate_tree(t.path(), 2 << 20).unwrap();
        assert_eq!(bytes, 2 << 20);
        let (tar, b) =
            prepare_tree(&TreeSource::Generated(1 << 20), &t.path().join("x")).unwrap_or_else(|e| {
                panic!("{e}: {:?}", std::error::Error::source(&e));
            });
        assert_eq!(b, 1 << 20);
        assert!(tar.is_file());
        let listing = run_tool(Command::new("tar").arg("-tf").arg(&tar)).unwrap();
        assert!(listing.lines().filter(|l| l.ends_with(".c")).count() > 50);
        let (_, counted) = prepare_tree(&TreeSource::Tarball(tar), t.path()).unwrap();
        assert_eq!(counted, 1 << 20);
    }
}
