//! Shared helpers for the CLI's end-to-end tests: run the real binary, wait for its socket,
//! find client tools (skipping loudly when one is missing).
#![allow(dead_code)]

use std::path::{Path, PathBuf};
use std::process::{Child, Command, Output, Stdio};
use std::time::{Duration, Instant};

pub fn bin() -> PathBuf {
    PathBuf::from(env!("CARGO_BIN_EXE_sealdisk"))
}

pub fn have(tool: &str) -> bool {
    let ok = Command::new(tool)
        .arg("--version")
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .status()
        .map(|s| s.success())
        .unwrap_or(false);
    if !ok {
        eprintln!("SKIPPED PART: {tool} is not installed (apt-get install qemu-utils libnbd-bin fio)");
    }
    ok
}

/// A running `sealdisk open` server; killed (SIGTERM) on drop.
pub struct Served {
    pub child: Option<Child>,
    pub sock: PathBuf,
    pub name: String,
}

impl Served {
    pub fn uri(&self) -> String {
        format!("nbd+unix:///{}?socket={}", self.name, self.sock.display())
    }

    /// SIGTERM, then wait; returns the output.
    pub fn stop(mut self) -> Output {
        let child = self.child.take().expect("running");
        terminate(&child);
        child.wait_with_output().expect("wait")
    }
}

impl Drop for Served {
    fn drop(&mut self) {
        if let Some(mut c) = self.child.take() {
            terminate(&c);
            let _ = c.wait();
        }
    }
}

fn terminate(c: &Child) {
    let _ = Command::new("kill").arg("-TERM").arg(c.id().to_string()).status();
}

/// Starts `sealdisk open ARGS... --listen unix:SOCK` and waits for the socket.
pub fn serve(dir: &Path, name: &str, args: &[&str], stdin: Option<&[u8]>) -> Served {
    let sock = dir.join(format!("{name}.sock"));
    let mut cmd = Command::new(bin());
    cmd.arg("open").args(args).arg("--listen").arg(format!("unix:{}", sock.display()));
    cmd.stdout(Stdio::piped()).stderr(Stdio::piped());
    cmd.stdin(if stdin.is_some() { Stdio::piped() } else { Stdio::null() });
    let mut child = cmd.spawn().expect("spawn sealdisk");
    if let Some(data) = stdin {
        use std::io::Write;
        let mut s = child.stdin.take().unwrap();
        s.write_all(data).unwrap();
    }
    let t0 = Instant::now();
    while !sock.exists() {
        if let Ok(Some(status)) = child.try_wait() {
            let out = child.wait_with_output().unwrap();
            panic!("sealdisk exited early ({status}): {}", String::from_utf8_lossy(&out.stderr));
        }
        assert!(t0.elapsed() < Duration::from_secs(20), "socket never appeared");
        std::thread::sleep(Duration::from_millis(20));
    }
    Served { child: Some(child), sock, name: name.to_string() }
}

/// Runs `sealdisk ARGS` to completion.
pub fn run(args: &[&str]) -> Output {
    Command::new(bin()).args(args).stdin(Stdio::null()).output().expect("run sealdisk")
}

pub fn run_tool(cmd: &mut Command) -> Output {
    let out = cmd.output().unwrap_or_else(|e| panic!("{cmd:?}: {e}"));
    assert!(
        out.status.success(),
        "{cmd:?} failed: {}\n{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
    out
}

pub fn pattern(len: usize, seed: u32) -> Vec<u8> {
    let mut x = seed.wrapping_mul(2654435761).wrapping_add(1);
    (0..len)
        .map(|_| {
            x ^= x << 13;
            x ^= x >> 17;
            x ^= x << 5;
            x as u8
        })
        .collect()
}

/// The kernel oracle: `$KERNEL_RUN`, else `shared/oracle/kernel-run` beside the checkout (as CI
/// lays it out), else /work/shared. `None` (with a loud message) when there is none.
pub fn kernel_run() -> Option<PathBuf> {
    let beside = PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../../../shared/oracle/kernel-run");
    let candidates = [
        std::env::var_os("KERNEL_RUN").map(PathBuf::from),
        Some(beside),
        Some("/work/shared/oracle/kernel-run".into()),
    ];
    let found = candidates.into_iter().flatten().find(|p| p.exists());
    if found.is_none() {
        eprintln!("SKIPPED: no kernel-run oracle (set KERNEL_RUN or put shared/ beside the checkout)");
    }
    found
}

/// Boots the kernel oracle `kr` on `disks` with `files` copied in, runs `script`, echoes its
/// output, asserts it succeeded and returns what the guest printed.
pub fn boot_kernel(kr: &Path, files: &[PathBuf], disks: &[PathBuf], script: &Path) -> String {
    let mut cmd = Command::new(kr);
    cmd.arg("--timeout").arg("900");
    for f in files {
        cmd.arg("--file").arg(f);
    }
    for d in disks {
        cmd.arg("--disk").arg(d);
    }
    cmd.arg(script);
    let out = cmd.output().unwrap();
    let log = String::from_utf8_lossy(&out.stdout).to_string();
    eprintln!("{log}");
    eprintln!("{}", String::from_utf8_lossy(&out.stderr));
    assert!(out.status.success(), "kernel-run failed");
    log
}

/// The guest's `KEY name value` lines as a map from name to value.
pub fn tagged_lines(log: &str, key: &str) -> std::collections::HashMap<String, String> {
    log.lines()
        .filter_map(|l| l.strip_prefix(key).and_then(|r| r.strip_prefix(' ')))
        .filter_map(|r| r.split_once(' ').map(|(n, v)| (n.to_string(), v.to_string())))
        .collect()
}
