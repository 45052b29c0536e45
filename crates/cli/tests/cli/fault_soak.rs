//! Fault soak (issue 10, item 5): a verifying writer over NBD against each stack (plain,
//! LUKS2, integrity J/B/D, LUKS2 AEAD) while the server meets injected EIO, a backing file
//! that runs out of space, and SIGKILL at random points.
//!
//! ```text
//!   this test (writer + model) ──NBD/unix──► child process = this test binary re-executed
//!        │  SIGKILL at a random time           (soak_server_child): volume::…::open as the
//!        │  or after a failed FLUSH            CLI does → nbd::Server; blockdev::fault_hook
//!        ▼                                     fails 1 in N pread/pwrite/fdatasync with EIO
//!   restart without faults → read every block, check against the model, flush
//!
//!   backing file: sparse, on a small tmpfs mounted here (root) whose free space a filler
//!   file keeps to a few hundred KiB: writes into holes fail with ENOSPC until the harness
//!   frees a little more space at the next restart.
//! ```
//!
//! The model keeps, per 4 KiB block, the set of contents a read may return now (`live`) and
//! after a crash (`durable`): the block's initial content or a write's generation, whose data
//! is `testkit::pattern` of (generation, byte offset), so misplaced, stale or invented data
//! never matches. An acknowledged write narrows `live` to itself and joins `durable`; a
//! failed or interrupted one joins both (it may or may not have landed); a successful FLUSH
//! sets `durable = live`; a kill sets `live = durable`. Checks:
//! * every read returns one of `live` (otherwise: data never written there);
//! * a block whose `durable` set has one member (acknowledged and flushed, nothing since)
//!   reads back after a restart, never an error (otherwise: loss); integrity stacks may fail
//!   a block that had a write in flight (a torn data/tag pair), counted apart;
//! * after a failed FLUSH the retried FLUSH fails too (the write-back latch).
//!
//! CI runs about 36 s in all (fixed seed). `SOAK_SECONDS=600 SOAK_SEED=7 cargo test -p
//! sealdisk --test cli fault_soak:: -- --nocapture` runs longer; the table printed at the end is
//! what docs/TESTING.md records.

use crate::durable;

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use durable::{Client, Stack};
use nbd::{Export, ListenAddr, Server, ServerConfig};
use testkit::pattern::{checksum, pattern, splitmix64};

const BS: usize = 4096;
/// Blocks of the volume the writer uses (4 MiB).
const MAX_BLOCKS: u64 = 1024;
/// Free space left on the small filesystem after each restart.
const FREE_STEP: u64 = 192 << 10;

// ---------------------------------------------------------------- the server child

/// The server process: does nothing unless started by `fault_soak` with SOAK_CHILD_STACK.
#[test]
fn soak_server_child() {
    let Ok(stack) = std::env::var("SOAK_CHILD_STACK") else { return };
    let stack = Stack::parse(&stack).expect("stack name");
    let img = PathBuf::from(std::env::var("SOAK_CHILD_IMG").unwrap());
    let sock = PathBuf::from(std::env::var("SOAK_CHILD_SOCK").unwrap());
    let rates: Vec<u64> =
        std::env::var("SOAK_CHILD_FAULTS").unwrap().split(',').map(|v| v.parse().unwrap()).collect();
    let dev = match durable::open(stack, &img) {
        Ok(d) => d,
        Err(e) => {
            eprintln!("soak child: open failed: {e}");
            std::process::exit(3);
        }
    };
    durable::with_plan(&img, |p| {
        (p.read_one_in, p.write_one_in, p.sync_one_in, p.rng) = (rates[0], rates[1], rates[2], rates[3]);
    });
    let server = Server::new(vec![Export::new("vol", dev)], ServerConfig::default());
    let bound = server.bind(&ListenAddr::Unix(sock)).unwrap();
    // The parent kills this process; a parent that died leaves it to end by itself.
    std::thread::spawn(|| {
        std::thread::sleep(Duration::from_secs(300));
        std::process::exit(4);
    });
    let _ = bound.serve();
}

/// A running server child, killed on drop.
struct ServerProc {
    child: Arc<Mutex<Child>>,
}

impl ServerProc {
    fn start(stack: Stack, img: &Path, sock: &Path, faults: [u64; 4]) -> Option<ServerProc> {
        let _ = std::fs::remove_file(sock);
        let f = faults.map(|v| v.to_string()).join(",");
        let mut child = Command::new(std::env::current_exe().unwrap())
            // The test's full name in the crate's one test binary (tests/cli/main.rs).
            .args(["--exact", "fault_soak::soak_server_child", "--nocapture", "--test-threads=1"])
            .env("SOAK_CHILD_STACK", stack.name())
            .env("SOAK_CHILD_IMG", img)
            .env("SOAK_CHILD_SOCK", sock)
            .env("SOAK_CHILD_FAULTS", f)
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .spawn()
            .unwrap();
        let t0 = Instant::now();
        while !sock.exists() {
            if child.try_wait().unwrap().is_some() || t0.elapsed() > Duration::from_secs(60) {
                let _ = child.kill();
                let _ = child.wait();
                return None;
            }
            std::thread::sleep(Duration::from_millis(5));
        }
        Some(ServerProc { child: Arc::new(Mutex::new(child)) })
    }

    fn kill(&self) {
        let mut c = self.child.lock().unwrap();
        let _ = c.kill();
        let _ = c.wait();
    }
}

impl Drop for ServerProc {
    fn drop(&mut self) {
        self.kill();
    }
}

// ---------------------------------------------------------------- the small filesystem

/// A tmpfs mounted for the soak (root only), unmounted on drop; a filler file keeps its free
/// space small.
struct SmallFs {
    dir: tempfile::TempDir,
    mounted: bool,
}

impl SmallFs {
    fn new() -> SmallFs {
        let dir = tempfile::tempdir_in(env!("CARGO_TARGET_TMPDIR")).unwrap();
        let ok = Command::new("mount")
            .args(["-t", "tmpfs", "-o", "size=64m", "sealdisk-soak"])
            .arg(dir.path())
            .stderr(Stdio::null())
            .status()
            .is_ok_and(|s| s.success());
        if !ok {
            eprintln!(
                "SKIPPED PART: cannot mount a small tmpfs (needs root): the soak runs without \
                 ENOSPC from a filling filesystem"
            );
        }
        SmallFs { dir, mounted: ok }
    }

    fn filler(&self) -> PathBuf {
        self.dir.path().join("filler")
    }

    /// Fills the filesystem, then frees `free` bytes of the filler.
    fn fill_leaving(&self, free: u64) {
        if !self.mounted {
            return;
        }
        use std::io::Write;
        let mut f = std::fs::OpenOptions::new().create(true).append(true).open(self.filler()).unwrap();
        let chunk = vec![0x5au8; 64 << 10];
        while f.write_all(&chunk).is_ok() {}
        let _ = f.write_all(&chunk[..4096]);
        let len = f.metadata().unwrap().len();
        f.set_len(len.saturating_sub(free)).unwrap();
    }

    /// Frees `bytes` more of the filler.
    fn free(&self, bytes: u64) {
        if let Ok(f) = std::fs::OpenOptions::new().write(true).open(self.filler()) {
            let len = f.metadata().unwrap().len();
            f.set_len(len.saturating_sub(bytes)).unwrap();
        }
    }
}

impl Drop for SmallFs {
    fn drop(&mut self) {
        if self.mounted {
            let _ = Command::new("umount").arg(self.dir.path()).status();
        }
    }
}

// ---------------------------------------------------------------- the model

#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord)]
enum Content {
    /// What the block held when the soak began (its checksum, or a failed read).
    Initial,
    /// The data of write generation `g`.
    Gen(u64),
}

#[derive(Debug, Clone)]
struct Block {
    live: Vec<Content>,
    durable: Vec<Content>,
}

fn add(set: &mut Vec<Content>, c: Content) {
    if !set.contains(&c) {
        set.push(c);
    }
}

#[derive(Debug, Default, Clone)]
struct Stats {
    epochs: u64,
    ops: u64,
    writes_acked: u64,
    flushes_ok: u64,
    eio: u64,
    enospc: u64,
    other_errors: u64,
    flush_failures: u64,
    kills: u64,
    failed_starts: u64,
    verified_blocks: u64,
    integrity_errors_uncertain: u64,
    losses: u64,
    never_written: u64,
    latch_violations: u64,
}

struct Model {
    blocks: Vec<Block>,
    initial: Vec<Option<u64>>,
    generation: u64,
}

impl Model {
    /// Which content `data` at block `b` is, if any the model allows now.
    fn matches(&self, b: u64, data: &[u8]) -> Option<Content> {
        let off = b * BS as u64;
        self.blocks[b as usize].live.iter().copied().find(|c| match c {
            // A block that failed its check at the start (a no-wipe integrity volume) may
            // read back as its hole's zeroes once its tags are recalculated (mode B after
            // an unclean stop, as in the kernel).
            Content::Initial => match self.initial[b as usize] {
                Some(sum) => sum == checksum(data),
                None => data.iter().all(|&x| x == 0),
            },
            Content::Gen(g) => *data == pattern(*g, off, BS)[..],
        })
    }

    fn crash(&mut self) {
        for b in &mut self.blocks {
            b.live = b.durable.clone();
        }
    }

    fn flushed(&mut self) {
        for b in &mut self.blocks {
            b.durable = b.live.clone();
        }
    }
}

struct Rng(u64);
impl Rng {
    fn next(&mut self) -> u64 {
        self.0 = splitmix64(self.0);
        self.0
    }
    fn below(&mut self, n: u64) -> u64 {
        self.next() % n
    }
}

// ---------------------------------------------------------------- the writer

/// Reads every block with the server fault-free and checks it; records what was read.
fn verify(c: &mut Client, m: &mut Model, stack: Stack, st: &mut Stats, log: &mut Vec<String>) -> bool {
    let n = m.blocks.len() as u64;
    let mut unreadable = Vec::new();
    let mut b = 0;
    while b < n {
        let len = 16.min(n - b);
        let r = match c.read(b * BS as u64, (len as usize * BS) as u32) {
            Ok(r) => r,
            Err(_) => return false,
        };
        let per_block: Vec<Option<Vec<u8>>> = match r {
            Ok(d) => d.chunks(BS).map(|x| Some(x.to_vec())).collect(),
            Err(_) => {
                (b..b + len).map(|k| c.read(k * BS as u64, BS as u32).ok().and_then(|r| r.ok())).collect()
            }
        };
        for (k, data) in (b..b + len).zip(per_block) {
            st.verified_blocks += 1;
            let blk = &m.blocks[k as usize];
            match data {
                Some(d) => match m.matches(k, &d) {
                    Some(c) => m.blocks[k as usize].live = vec![c],
                    None => {
                        st.never_written += 1;
                        let what = describe(m, k, &d);
                        log.push(format!(
                            "{}: block {k} holds data never written there: {what} (allowed {:?})",
                            stack.name(),
                            blk.live
                        ));
                    }
                },
                None => {
                    let initial_bad = blk.live.contains(&Content::Initial) && m.initial[k as usize].is_none();
                    if stack.integrity() && (blk.live.len() > 1 || initial_bad) {
                        st.integrity_errors_uncertain += u64::from(!initial_bad);
                        unreadable.push(k);
                    } else {
                        st.losses += 1;
                        log.push(format!(
                            "{}: block {k} fails to read; it must hold {:?}",
                            stack.name(),
                            blk.live
                        ));
                    }
                }
            }
        }
        b += len;
    }
    // Blocks that failed their check after a torn write are rewritten so the model knows
    // them again (a failed rewrite may still have landed).
    for k in unreadable {
        if m.blocks[k as usize].live == [Content::Initial] {
            continue;
        }
        m.generation += 1;
        let g = m.generation;
        let r = c.write(k * BS as u64, &pattern(g, k * BS as u64, BS), false);
        let b = &mut m.blocks[k as usize];
        if let Ok(Ok(_)) = r {
            b.live = vec![Content::Gen(g)];
        } else {
            add(&mut b.live, Content::Gen(g));
        }
        add(&mut b.durable, Content::Gen(g));
    }
    if let Ok(Ok(_)) = c.flush() {
        m.flushed();
    }
    true
}

/// One epoch under faults: random writes, reads and flushes until the server is killed
/// (by a timer, after a failed FLUSH, or after an op budget).
fn faulty_epoch(
    c: &mut Client,
    m: &mut Model,
    rng: &mut Rng,
    stack: Stack,
    st: &mut Stats,
    log: &mut Vec<String>,
) {
    let n = m.blocks.len() as u64;
    let budget = 50 + rng.below(400);
    let mut errors_in_a_row = 0;
    for _ in 0..budget {
        st.ops += 1;
        let dice = rng.below(100);
        if dice < 60 {
            let start = rng.below(n);
            let len = (1 + rng.below(4)).min(n - start);
            m.generation += 1;
            let g = m.generation;
            let fua = rng.below(10) == 0;
            let off = start * BS as u64;
            let r = c.write(off, &pattern(g, off, len as usize * BS), fua);
            for k in start..start + len {
                let b = &mut m.blocks[k as usize];
                match &r {
                    Ok(Ok(_)) => {
                        b.live = vec![Content::Gen(g)];
                        if fua {
                            b.durable = vec![Content::Gen(g)];
                        } else {
                            add(&mut b.durable, Content::Gen(g));
                        }
                    }
                    _ => {
                        add(&mut b.live, Content::Gen(g));
                        add(&mut b.durable, Content::Gen(g));
                    }
                }
            }
            match r {
                Ok(Ok(_)) => {
                    st.writes_acked += 1;
                    errors_in_a_row = 0;
                }
                Ok(Err(e)) => {
                    count_error(st, e);
                    errors_in_a_row += 1;
                }
                Err(_) => return,
            }
        } else if dice < 85 {
            let start = rng.below(n);
            let len = (1 + rng.below(8)).min(n - start);
            match c.read(start * BS as u64, (len as usize * BS) as u32) {
                Ok(Ok(d)) => {
                    errors_in_a_row = 0;
                    for (k, blk) in (start..start + len).zip(d.chunks(BS)) {
                        match m.matches(k, blk) {
                            Some(cn) => m.blocks[k as usize].live = vec![cn],
                            None => {
                                st.never_written += 1;
                                log.push(format!(
                                    "{}: read of block {k} returned data never written there (allowed {:?})",
                                    stack.name(),
                                    m.blocks[k as usize].live
                                ));
                            }
                        }
                    }
                }
                Ok(Err(e)) => {
                    count_error(st, e);
                    errors_in_a_row += 1;
                }
                Err(_) => return,
            }
        } else {
            match c.flush() {
                Ok(Ok(_)) => {
                    st.flushes_ok += 1;
                    m.flushed();
                    errors_in_a_row = 0;
                }
                Ok(Err(e)) => {
                    count_error(st, e);
                    st.flush_failures += 1;
                    // Write-back may have lost anything not yet durable.
                    for b in &mut m.blocks {
                        for d in b.durable.clone() {
                            add(&mut b.live, d);
                        }
                    }
                    match c.flush() {
                        Ok(Ok(_)) => {
                            st.latch_violations += 1;
                            log.push(format!("{}: a FLUSH succeeded after a failed FLUSH", stack.name()));
                        }
                        Ok(Err(_)) => {}
                        Err(_) => return,
                    }
                    return;
                }
                Err(_) => return,
            }
        }
        if errors_in_a_row >= 20 {
            return;
        }
    }
}

/// What unexpected data is, for the report: zeroes, or an older generation of this block.
fn describe(m: &Model, k: u64, d: &[u8]) -> String {
    if d.iter().all(|&b| b == 0) {
        return "zeroes".into();
    }
    let off = k * BS as u64;
    let first = m.generation & !0xffff_ffff;
    let mut g = m.generation;
    while g > first && m.generation - g < 20_000 {
        if *d == pattern(g, off, BS)[..] {
            return format!("generation {g} (an older write of this block)");
        }
        g -= 1;
    }
    format!("unknown data {:02x?}…", &d[..8])
}

fn count_error(st: &mut Stats, e: u32) {
    match e {
        5 => st.eio += 1,
        28 => st.enospc += 1,
        _ => st.other_errors += 1,
    }
}

/// Soaks one stack for `secs` seconds; returns its figures and any problems found.
fn soak_stack(stack: Stack, secs: u64, seed: u64, fs: &SmallFs) -> (Stats, Vec<String>) {
    let mut st = Stats::default();
    let mut log = Vec::new();
    let img = fs.dir.path().join(format!("{}.img", stack.name()));
    let sock = fs.dir.path().join(format!("{}.sock", stack.name()));
    // The filesystem is reset for each stack.
    let _ = std::fs::remove_file(fs.filler());
    durable::format(stack, &img, true);
    let mut rng = Rng(seed ^ splitmix64(stack as u64 + 1));

    // The initial content, read without faults.
    let Some(srv) = ServerProc::start(stack, &img, &sock, [0, 0, 0, 0]) else {
        panic!("{}: first start", stack.name())
    };
    let mut c = Client::connect(&sock, "vol").unwrap();
    let n = (c.size / BS as u64).min(MAX_BLOCKS);
    let mut initial = Vec::new();
    for k in 0..n {
        initial.push(c.read(k * BS as u64, BS as u32).unwrap().ok().map(|d| checksum(&d)));
    }
    drop(c);
    srv.kill();
    let blocks = vec![Block { live: vec![Content::Initial], durable: vec![Content::Initial] }; n as usize];
    let mut m = Model { blocks, initial, generation: seed << 32 };
    fs.fill_leaving(FREE_STEP);

    let deadline = Instant::now() + Duration::from_secs(secs);
    while Instant::now() < deadline {
        st.epochs += 1;
        let faults = [150 + rng.below(300), 150 + rng.below(300), 20 + rng.below(40), rng.next()];
        let Some(srv) = ServerProc::start(stack, &img, &sock, faults) else {
            // E.g. the journal replay at open met ENOSPC: more room, and try again.
            st.failed_starts += 1;
            fs.free(FREE_STEP);
            continue;
        };
        let Ok(mut c) = Client::connect(&sock, "vol") else {
            st.failed_starts += 1;
            continue;
        };
        // SIGKILL at a random moment, requests in flight or not.
        let killer = {
            let child = srv.child.clone();
            let delay = Duration::from_millis(20 + rng.below(500));
            std::thread::spawn(move || {
                std::thread::sleep(delay);
                let _ = child.lock().unwrap().kill();
            })
        };
        faulty_epoch(&mut c, &mut m, &mut rng, stack, &mut st, &mut log);

        drop(c);
        srv.kill();
        let _ = killer.join();
        st.kills += 1;
        m.crash();

        // Restart without faults and check every block.
        fs.free(FREE_STEP / 2);
        let mut tries = 0;
        loop {
            tries += 1;
            let Some(srv) = ServerProc::start(stack, &img, &sock, [0, 0, 0, 0]) else {
                st.failed_starts += 1;
                fs.free(FREE_STEP);
                assert!(tries < 20, "{}: the volume no longer opens", stack.name());
                continue;
            };
            let ok = Client::connect(&sock, "vol")
                .is_ok_and(|mut c| verify(&mut c, &mut m, stack, &mut st, &mut log));
            srv.kill();
            if ok {
                break;
            }
            assert!(tries < 20, "{}: verification keeps failing", stack.name());
        }
    }
    // Room for the next stack.
    let _ = std::fs::remove_file(&img);
    let _ = std::fs::remove_file(fs.filler());
    (st, log)
}

#[test]
fn fault_soak() {
    let secs: u64 = std::env::var("SOAK_SECONDS").ok().and_then(|v| v.parse().ok()).unwrap_or(36);
    let seed: u64 = std::env::var("SOAK_SEED").ok().and_then(|v| v.parse().ok()).unwrap_or(1);
    let per_stack = (secs / Stack::ALL.len() as u64).max(2);
    let fs = SmallFs::new();
    let mut all: BTreeMap<&str, Stats> = BTreeMap::new();
    let mut problems = Vec::new();
    let only = std::env::var("SOAK_STACKS").unwrap_or_default();
    for stack in Stack::ALL {
        if !only.is_empty() && !only.split(',').any(|s| s == stack.name()) {
            continue;
        }
        let (st, log) = soak_stack(stack, per_stack, seed, &fs);
        problems.extend(log);
        all.insert(stack.name(), st);
    }
    eprintln!(
        "fault soak: seed {seed}, {per_stack} s per stack, ENOSPC from {}",
        if fs.mounted { "a 64 MiB tmpfs kept nearly full" } else { "nowhere (no tmpfs)" }
    );
    eprintln!(
        "| stack | epochs | ops | writes acked | flushes ok | EIO | ENOSPC | failed FLUSH (latched) | SIGKILLs | \
         failed restarts | blocks verified | integrity errors (in-flight blocks) | losses | never-written | latch violations |"
    );
    eprintln!("|---|---|---|---|---|---|---|---|---|---|---|---|---|---|---|");
    for (name, s) in &all {
        eprintln!(
            "| {name} | {} | {} | {} | {} | {} | {} | {} | {} | {} | {} | {} | {} | {} | {} |",
            s.epochs,
            s.ops,
            s.writes_acked,
            s.flushes_ok,
            s.eio,
            s.enospc,
            s.flush_failures,
            s.kills,
            s.failed_starts,
            s.verified_blocks,
            s.integrity_errors_uncertain,
            s.losses,
            s.never_written,
            s.latch_violations
        );
    }
    for p in problems.iter().take(50) {
        eprintln!("PROBLEM: {p}");
    }
    assert!(problems.is_empty(), "{} problems (see above)", problems.len());
    for (name, s) in &all {
        assert!(s.kills > 0 && s.verified_blocks > 0, "{name}: the soak did not run");
    }
}
