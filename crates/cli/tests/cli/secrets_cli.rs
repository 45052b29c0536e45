//! Secrets at the process level (issue 10, "Secrets in memory"): a signal ends a key
//! derivation promptly with a message and status 128+N and nothing written (cryptsetup
//! defers signals while deriving and hangs on a huge cost); the serving process has no core
//! limit and still shuts down gracefully; key memory that cannot be locked (RLIMIT_MEMLOCK)
//! degrades without failing; no key or passphrase bytes reach error output.

use crate::common;

use std::io::{BufRead, BufReader};
use std::path::Path;
use std::process::{Child, Command, Stdio};
use std::sync::mpsc;
use std::time::{Duration, Instant};

use common::bin;

const DERIVING: &str = "key derivation running";
const INTERRUPTED: &str = "Interrupted by signal, nothing was written.";

/// Spawns `sealdisk -vv ARGS` with stderr piped; returns the child and a channel of its
/// stderr lines (read on a thread).
fn spawn_logged(args: &[&str]) -> (Child, mpsc::Receiver<String>) {
    let mut child = Command::new(bin())
        .arg("-vv")
        .args(args)
        .stdin(Stdio::null())
        .stdout(Stdio::null())
        .stderr(Stdio::piped())
        .spawn()
        .expect("spawn sealdisk");
    let err = child.stderr.take().expect("stderr");
    let (tx, rx) = mpsc::channel();
    std::thread::spawn(move || {
        for line in BufReader::new(err).lines().map_while(Result::ok) {
            if tx.send(line).is_err() {
                break;
            }
        }
    });
    (child, rx)
}

/// Waits (up to a minute, the machine is shared) for a stderr line containing `needle`.
fn wait_for_line(rx: &mpsc::Receiver<String>, needle: &str, seen: &mut Vec<String>) {
    let deadline = Instant::now() + Duration::from_secs(60);
    while Instant::now() < deadline {
        match rx.recv_timeout(Duration::from_millis(100)) {
            Ok(l) => {
                let hit = l.contains(needle);
                seen.push(l);
                if hit {
                    return;
                }
            }
            Err(mpsc::RecvTimeoutError::Timeout) => {}
            Err(mpsc::RecvTimeoutError::Disconnected) => break,
        }
    }
    panic!("no {needle:?} on stderr; got:\n{}", seen.join("\n"));
}

/// Sends `sig` to the child, then waits up to `limit` for it to exit; returns its exit code
/// and all of stderr. A child still running after `limit` is killed and the test fails.
fn signal_and_wait(
    mut child: Child,
    rx: &mpsc::Receiver<String>,
    sig: &str,
    limit: Duration,
    mut seen: Vec<String>,
) -> (Option<i32>, String) {
    let ok = Command::new("kill").arg(format!("-{sig}")).arg(child.id().to_string()).status().unwrap();
    assert!(ok.success());
    let start = Instant::now();
    let status = loop {
        if let Some(s) = child.try_wait().unwrap() {
            break s;
        }
        if start.elapsed() > limit {
            let _ = child.kill();
            let _ = child.wait();
            panic!("still deriving {limit:?} after SIG{sig}");
        }
        std::thread::sleep(Duration::from_millis(20));
    };
    while let Ok(l) = rx.recv_timeout(Duration::from_secs(2)) {
        seen.push(l);
    }
    (status.code(), seen.join("\n"))
}

fn write_pattern(path: &Path, len: usize) -> Vec<u8> {
    let data: Vec<u8> = (0..len).map(|i| (i * 7 % 253) as u8).collect();
    std::fs::write(path, &data).unwrap();
    data
}

/// luksFormat with a PBKDF2 cost of minutes: SIGTERM during the derivation ends it at once,
/// with the message and status 143, and the target is byte-for-byte unchanged (the keyslot
/// is derived before the header area is wiped).
#[test]
fn sigterm_ends_a_slow_luks_format_and_writes_nothing() {
    let dir = tempfile::tempdir().unwrap();
    let img = dir.path().join("disk.img");
    let before = write_pattern(&img, 4 << 20);
    let pass = dir.path().join("pass");
    std::fs::write(&pass, b"format-passphrase").unwrap();
    let (child, rx) = spawn_logged(&[
        "luksFormat",
        "-q",
        "--type",
        "luks1",
        "--pbkdf-force-iterations",
        "2000000000",
        "--key-file",
        pass.to_str().unwrap(),
        img.to_str().unwrap(),
    ]);
    let mut seen = Vec::new();
    wait_for_line(&rx, DERIVING, &mut seen);
    std::thread::sleep(Duration::from_millis(300));
    let (code, stderr) = signal_and_wait(child, &rx, "TERM", Duration::from_secs(10), seen);
    assert_eq!(code, Some(143), "stderr:\n{stderr}");
    assert!(stderr.contains(INTERRUPTED), "stderr:\n{stderr}");
    assert!(std::fs::read(&img).unwrap() == before, "luksFormat wrote to the device before deriving");
}

/// The same for LUKS2 (argon2id with a time cost far beyond a second), with SIGINT.
#[test]
fn sigint_ends_a_slow_luks2_format_and_writes_nothing() {
    let dir = tempfile::tempdir().unwrap();
    let img = dir.path().join("disk.img");
    let before = write_pattern(&img, 20 << 20);
    let pass = dir.path().join("pass");
    std::fs::write(&pass, b"format-passphrase").unwrap();
    let (child, rx) = spawn_logged(&[
        "luksFormat",
        "-q",
        "--pbkdf",
        "argon2id",
        "--pbkdf-force-iterations",
        "100000",
        "--pbkdf-memory",
        "32768",
        "--pbkdf-parallel",
        "1",
        "--key-file",
        pass.to_str().unwrap(),
        img.to_str().unwrap(),
    ]);
    let mut seen = Vec::new();
    wait_for_line(&rx, DERIVING, &mut seen);
    std::thread::sleep(Duration::from_millis(300));
    let (code, stderr) = signal_and_wait(child, &rx, "INT", Duration::from_secs(10), seen);
    assert_eq!(code, Some(130), "stderr:\n{stderr}");
    assert!(stderr.contains(INTERRUPTED), "stderr:\n{stderr}");
    assert!(std::fs::read(&img).unwrap() == before, "luksFormat wrote to the device before deriving");
}

/// Byte offset of LUKS1 keyslot 0's big-endian iteration count (phdr: 208 bytes of fields,
/// then 48-byte keyslots: active, iterations, ...).
const LUKS1_SLOT0_ITERATIONS: usize = 212;

/// A header whose keyslot asks for 100 million PBKDF2 iterations (a legitimate count: a
/// long `--iter-time` on a fast machine): `open --test-passphrase` ends on SIGTERM.
#[test]
fn sigterm_ends_a_slow_test_passphrase() {
    let dir = tempfile::tempdir().unwrap();
    let img = dir.path().join("disk.img");
    std::fs::write(&img, vec![0u8; 4 << 20]).unwrap();
    let pass = dir.path().join("pass");
    std::fs::write(&pass, b"slow-passphrase").unwrap();
    let out = Command::new(bin())
        .args(["luksFormat", "-q", "--type", "luks1", "--pbkdf-force-iterations", "1000", "--key-file"])
        .arg(&pass)
        .arg(&img)
        .output()
        .unwrap();
    assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
    let mut bytes = std::fs::read(&img).unwrap();
    bytes[LUKS1_SLOT0_ITERATIONS..LUKS1_SLOT0_ITERATIONS + 4].copy_from_slice(&100_000_000u32.to_be_bytes());
    std::fs::write(&img, &bytes).unwrap();
    let (child, rx) = spawn_logged(&[
        "open",
        "--test-passphrase",
        "--key-file",
        pass.to_str().unwrap(),
        img.to_str().unwrap(),
    ]);
    let mut seen = Vec::new();
    wait_for_line(&rx, DERIVING, &mut seen);
    std::thread::sleep(Duration::from_millis(300));
    let (code, stderr) = signal_and_wait(child, &rx, "TERM", Duration::from_secs(10), seen);
    assert_eq!(code, Some(143), "stderr:\n{stderr}");
    assert!(stderr.contains(INTERRUPTED), "stderr:\n{stderr}");
}

/// The serving process has RLIMIT_CORE 0 (set with PR_SET_DUMPABLE 0 at startup; the
/// dumpable flag itself is checked in-process by sector-crypto's tests, since /proc shows it
/// only as file ownership, which is root either way when the tests run as root), and
/// SIGTERM still shuts the server down gracefully (exit 0, "flushed and closed").
#[test]
fn serving_process_has_no_core_dumps_and_still_stops_gracefully() {
    let dir = tempfile::tempdir().unwrap();
    let img = dir.path().join("disk.img");
    std::fs::write(&img, vec![0u8; 1 << 20]).unwrap();
    let key = dir.path().join("key");
    std::fs::write(&key, [0xa5u8; 64]).unwrap();
    let served = common::serve(
        dir.path(),
        "vol",
        &[
            "--type",
            "plain",
            "--cipher",
            "aes-xts-plain64",
            "--key-size",
            "512",
            "--key-file",
            key.to_str().unwrap(),
            img.to_str().unwrap(),
            "vol",
        ],
        None,
    );
    let pid = served.child.as_ref().unwrap().id();
    let limits = std::fs::read_to_string(format!("/proc/{pid}/limits")).unwrap();
    let core = limits.lines().find(|l| l.starts_with("Max core file size")).expect("core limit line");
    let fields: Vec<&str> = core.split_whitespace().collect();
    assert_eq!(&fields[4..6], ["0", "0"], "{core}");
    let out = served.stop_ok();
    assert!(String::from_utf8_lossy(&out.stderr).contains("flushed and closed"));
}

/// With RLIMIT_MEMLOCK 0 and no CAP_IPC_LOCK, every mlock fails: the passphrase still
/// unlocks (the failure is logged once, at debug level).
#[test]
fn unlockable_memory_limit_degrades_gracefully() {
    for tool in ["prlimit", "setpriv"] {
        if Command::new(tool).arg("--version").output().map(|o| !o.status.success()).unwrap_or(true) {
            eprintln!("SKIPPED: {tool} (util-linux) is not installed");
            return;
        }
    }
    let dir = tempfile::tempdir().unwrap();
    let img = dir.path().join("disk.img");
    std::fs::write(&img, vec![0u8; 4 << 20]).unwrap();
    let pass = dir.path().join("pass");
    std::fs::write(&pass, b"memlock-passphrase").unwrap();
    let out = Command::new(bin())
        .args(["luksFormat", "-q", "--type", "luks1", "--pbkdf-force-iterations", "1000", "--key-file"])
        .arg(&pass)
        .arg(&img)
        .output()
        .unwrap();
    assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
    // Root bypasses RLIMIT_MEMLOCK with CAP_IPC_LOCK: drop it from the bounding set.
    let out = Command::new("prlimit")
        .args(["--memlock=0:0", "--", "setpriv", "--bounding-set=-ipc_lock", "--"])
        .arg(bin())
        .args(["-vv", "open", "--test-passphrase", "--key-file"])
        .arg(&pass)
        .arg(&img)
        .output()
        .unwrap();
    let stderr = String::from_utf8_lossy(&out.stderr);
    if stderr.starts_with("setpriv:") || stderr.starts_with("prlimit:") {
        eprintln!("SKIPPED: cannot drop CAP_IPC_LOCK / lower RLIMIT_MEMLOCK here: {stderr}");
        return;
    }
    assert!(out.status.success(), "exit {}: {stderr}", out.status);
    assert_eq!(stderr.matches("cannot lock").count(), 1, "{stderr}");
}

/// Error output never carries the passphrase or the key: a wrong passphrase, and a table
/// line the parser refuses after reading its key.
#[test]
fn errors_carry_no_key_bytes() {
    let dir = tempfile::tempdir().unwrap();
    let img = dir.path().join("disk.img");
    std::fs::write(&img, vec![0u8; 4 << 20]).unwrap();
    let (right, wrong) = ("right-passphrase-5f1e", "wrong-passphrase-9c2d");
    let pass = dir.path().join("pass");
    std::fs::write(&pass, right).unwrap();
    let out = Command::new(bin())
        .args(["luksFormat", "-q", "--type", "luks1", "--pbkdf-force-iterations", "1000", "--key-file"])
        .arg(&pass)
        .arg(&img)
        .output()
        .unwrap();
    assert!(out.status.success());
    std::fs::write(&pass, wrong).unwrap();
    let out = Command::new(bin())
        .args(["-vvv", "open", "--test-passphrase", "--key-file"])
        .arg(&pass)
        .arg(&img)
        .output()
        .unwrap();
    assert_eq!(out.status.code(), Some(2));
    let all = format!("{}{}", String::from_utf8_lossy(&out.stdout), String::from_utf8_lossy(&out.stderr));
    assert!(all.contains("No key available with this passphrase."), "{all}");
    for secret in [right, wrong] {
        assert!(!all.contains(secret), "{secret} in output:\n{all}");
        assert!(!all.contains(&hex_of(secret.as_bytes())), "hex of {secret} in output:\n{all}");
    }
    let key_hex = "a5".repeat(64);
    let line = format!("0 2048 crypt aes-xts-plain64 {key_hex} 0 {} 0 1 no_such_option\n", img.display());
    let table = dir.path().join("table");
    std::fs::write(&table, &line).unwrap();
    let out = Command::new(bin())
        .args(["-vvv", "open", "--table-file"])
        .arg(&table)
        .arg("vol")
        .args(["--listen", &format!("unix:{}", dir.path().join("s").display())])
        .output()
        .unwrap();
    assert!(!out.status.success());
    let all = format!("{}{}", String::from_utf8_lossy(&out.stdout), String::from_utf8_lossy(&out.stderr));
    assert!(all.contains("no_such_option"), "{all}");
    assert!(!all.to_lowercase().contains("a5a5a5a5"), "key in output:\n{all}");
}

fn hex_of(b: &[u8]) -> String {
    b.iter().map(|x| format!("{x:02x}")).collect()
}
