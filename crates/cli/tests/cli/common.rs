//! Shared helpers for the CLI's end-to-end tests: run the real binary, wait for its socket,
//! find client tools (skipping loudly when one is missing).
#![allow(dead_code)]

use std::path::{Path, PathBuf};
use std::process::{Child, Command, Output, Stdio};
use std::time::{Duration, Instant};

#[path = "common/cryptsetup.rs"]
pub mod cryptsetup;

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

/// A private control-plane runtime directory for servers a test starts in `dir`: volume
/// names are per runtime directory (a second server under a running name is refused), and
/// tests running in parallel reuse names such as "vol".
pub fn runtime_dir(dir: &Path) -> PathBuf {
    dir.join(".sealdisk-run")
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

    /// Stops the server and asserts it exited successfully (its stderr in the message).
    pub fn stop_ok(self) -> Output {
        let out = self.stop();
        assert!(out.status.success(), "server exit {}: {}", out.status, String::from_utf8_lossy(&out.stderr));
        out
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
    cmd.env("SEALDISK_RUNTIME_DIR", runtime_dir(dir));
    cmd.stdout(Stdio::piped()).stderr(Stdio::piped());
    cmd.stdin(if stdin.is_some() { Stdio::piped() } else { Stdio::null() });
    let mut child = cmd.spawn().expect("spawn sealdisk");
    if let Some(data) = stdin {
        use std::io::Write;
        let mut s = child.stdin.take().unwrap();
        s.write_all(data).unwrap();
    }
    let child = wait_for_socket(child, &sock);
    Served { child: Some(child), sock, name: name.to_string() }
}

/// Waits (up to 20 s) until a server `child` serves on its socket `sock`; panics with its
/// stderr if it exits first. The socket exists before the volume is unlocked (it is bound
/// first, so that an address in use is reported before the key derivation), so readiness
/// is the NBD greeting: a probe connection reads it and hangs up (the server logs that at
/// debug level only).
pub fn wait_for_socket(mut child: Child, sock: &Path) -> Child {
    use std::io::Read;
    use std::os::unix::net::UnixStream;
    let t0 = Instant::now();
    loop {
        if let Ok(Some(status)) = child.try_wait() {
            let out = child.wait_with_output().unwrap();
            panic!("sealdisk exited early ({status}): {}", String::from_utf8_lossy(&out.stderr));
        }
        assert!(t0.elapsed() < Duration::from_secs(20), "the server never greeted on {}", sock.display());
        if let Ok(mut probe) = UnixStream::connect(sock) {
            probe.set_read_timeout(Some(Duration::from_millis(200))).unwrap();
            let mut magic = [0u8; 8];
            if probe.read_exact(&mut magic).is_ok() && &magic == b"NBDMAGIC" {
                return child;
            }
        }
        std::thread::sleep(Duration::from_millis(20));
    }
}

/// `sealdisk status NAME` of a volume [`serve`] started in `dir`: its text, after checking
/// that it names `kind` as its type and `device` (a path, shown canonical) as its device.
pub fn status_names(dir: &Path, name: &str, kind: &str, device: &Path) -> String {
    let o = Command::new(bin())
        .args(["status", name])
        .env("SEALDISK_RUNTIME_DIR", runtime_dir(dir))
        .stdin(Stdio::null())
        .output()
        .expect("run sealdisk status");
    let text = String::from_utf8_lossy(&o.stdout).into_owned();
    assert!(o.status.success(), "status {name}: {}", String::from_utf8_lossy(&o.stderr));
    assert!(text.contains(&format!("  type:    {kind}\n")), "status {name} should say type {kind}:\n{text}");
    let dev = std::fs::canonicalize(device).unwrap();
    assert!(text.contains(&format!("  device:  {}\n", dev.display())), "status {name}: device:\n{text}");
    text
}

/// Runs `sealdisk ARGS` to completion.
pub fn run(args: &[&str]) -> Output {
    Command::new(bin()).args(args).stdin(Stdio::null()).output().expect("run sealdisk")
}

/// Runs `sealdisk ARGS` to completion with `stdin` piped in.
pub fn run_stdin(args: &[&str], stdin: &[u8]) -> Output {
    use std::io::Write;
    let mut child = Command::new(bin())
        .args(args)
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .expect("spawn sealdisk");
    // A command may refuse before it reads stdin at all: a broken pipe is its answer, not ours.
    if let Err(e) = child.stdin.take().unwrap().write_all(stdin) {
        assert_eq!(e.kind(), std::io::ErrorKind::BrokenPipe, "writing sealdisk's stdin: {e}");
    }
    child.wait_with_output().expect("wait for sealdisk")
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

/// Fast key-derivation options for LUKS tests: PBKDF2 with 1000 iterations.
pub const FAST_PBKDF2: &[&str] = &["--pbkdf", "pbkdf2", "--pbkdf-force-iterations", "1000"];

/// Fast key-derivation options for LUKS2 tests: Argon2id, 4 iterations, 32 MiB.
pub const FAST_ARGON2ID: &[&str] =
    &["--pbkdf", "argon2id", "--pbkdf-force-iterations", "4", "--pbkdf-memory", "32768"];

/// Runs `qemu-io -f raw -c CMD... URI` (one `-c` per command) and asserts it succeeded.
pub fn qemu_io(uri: &str, cmds: &[&str]) -> Output {
    let mut cmd = Command::new("qemu-io");
    cmd.args(["-f", "raw"]);
    for c in cmds {
        cmd.arg("-c").arg(c);
    }
    run_tool(cmd.arg(uri))
}

/// The sha256 of `b` as lowercase hex.
pub fn sha_hex(b: &[u8]) -> String {
    use sha2::{Digest, Sha256};
    Sha256::digest(b).iter().map(|x| format!("{x:02x}")).collect()
}

/// `len` bytes of a 64-bit LCG stream started at `seed` (the integrity kernel tests' data).
pub fn lcg_pattern(seed: u64, len: usize) -> Vec<u8> {
    let mut v = Vec::with_capacity(len);
    let mut x = seed;
    while v.len() < len {
        x = x.wrapping_mul(6364136223846793005).wrapping_add(1442695040888963407);
        v.extend_from_slice(&x.to_le_bytes());
    }
    v.truncate(len);
    v
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

/// The sealdisk binary a kernel-oracle test runs in its guest: `$SEALDISK_RELEASE_BIN`, else
/// the one cargo built for this suite. Its dependencies (the crypto among them) are built
/// optimized (Cargo.toml, `profile.dev.package."*"`), and under emulation the guest's kernel
/// sets the pace: side by side, fs_kernel took 331 s with it and 351 s with a release
/// build, ublk_kernel 85 s with either. `None` (with a loud message naming `test`) when the
/// binary named is missing.
pub fn guest_bin(test: &str) -> Option<PathBuf> {
    let path = match std::env::var_os("SEALDISK_RELEASE_BIN") {
        Some(p) => PathBuf::from(p),
        None => bin(),
    };
    if !path.is_file() {
        eprintln!("SKIPPED {test}: no sealdisk binary at {} (SEALDISK_RELEASE_BIN)", path.display());
        return None;
    }
    let age = std::fs::metadata(&path).and_then(|m| m.modified()).ok().and_then(|t| t.elapsed().ok());
    eprintln!("{test}: the guest runs {} (built {age:.0?} ago)", path.display());
    Some(path)
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
    boot_kernel_within(kr, 900, files, disks, script)
}

/// [`boot_kernel`] with a kernel-run `--timeout` of `timeout_secs`.
pub fn boot_kernel_within(
    kr: &Path,
    timeout_secs: u32,
    files: &[PathBuf],
    disks: &[PathBuf],
    script: &Path,
) -> String {
    let mut cmd = Command::new(kr);
    cmd.arg("--timeout").arg(timeout_secs.to_string());
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

// ---- Object storage and cryptsetup (issue 15; s3_cli.rs, emulators_cli.rs) ----

/// `cryptsetup ARGS` (batch mode, stdin closed); asserts success.
fn cryptsetup(args: &[&str]) -> Output {
    run_tool(Command::new("cryptsetup").args(args).stdin(Stdio::null()))
}

/// `sealdisk ARGS`; asserts success, returns stdout.
fn sealdisk_ok(args: &[&str], what: &str) -> String {
    let out = run(args);
    assert!(
        out.status.success(),
        "{what}: exit {}\nstdout: {}\nstderr: {}",
        out.status,
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
    String::from_utf8_lossy(&out.stdout).into_owned()
}

fn luks_uuid(dump: &str) -> Option<String> {
    dump.lines().find(|l| l.starts_with("UUID")).map(|l| l.split_whitespace().last().unwrap_or("").to_owned())
}

/// The plaintext of the LUKS2 image `img`, decrypted by cryptsetup alone, without
/// device-mapper (this machine has none): the volume key dumped, the data area copied out,
/// a detached header with data offset 0 made for that key, then `reencrypt --decrypt`.
fn cryptsetup_plaintext(dir: &Path, img: &Path, keyfile: &str) -> Vec<u8> {
    let img_s = img.to_str().unwrap();
    let vk = dir.join("cs-vk.bin");
    let _ = std::fs::remove_file(&vk);
    cryptsetup(&[
        "luksDump",
        "-q",
        "--dump-volume-key",
        "--volume-key-file",
        vk.to_str().unwrap(),
        "--key-file",
        keyfile,
        img_s,
    ]);
    let dump = String::from_utf8_lossy(&cryptsetup(&["luksDump", img_s]).stdout).into_owned();
    let seg = &dump[dump.find("Data segments:").expect("segments")..];
    let field = |name: &str| -> String {
        let l = seg
            .lines()
            .find(|l| l.trim_start().starts_with(name))
            .unwrap_or_else(|| panic!("{name} in {seg}"));
        l.split_whitespace().nth(1).unwrap().to_owned()
    };
    let (offset, cipher, sector): (usize, String, String) =
        (field("offset:").parse().unwrap(), field("cipher:"), field("sector:"));
    let key_bits = std::fs::metadata(&vk).unwrap().len() * 8;
    let data = dir.join("cs-data.bin");
    std::fs::write(&data, &std::fs::read(img).unwrap()[offset..]).unwrap();
    let hdr = dir.join("cs-hdr.bin");
    std::fs::File::create(&hdr).unwrap().set_len(16 << 20).unwrap();
    let (hdr_s, data_s) = (hdr.to_str().unwrap(), data.to_str().unwrap());
    let kb = key_bits.to_string();
    let mut f =
        vec!["luksFormat", "-q", "--type", "luks2", "--header", hdr_s, "--offset", "0", "--volume-key-file"];
    f.extend([
        vk.to_str().unwrap(),
        "--key-size",
        &kb,
        "--cipher",
        &cipher,
        "--sector-size",
        &sector,
        "--key-file",
        keyfile,
    ]);
    f.extend_from_slice(FAST_PBKDF2);
    f.push(data_s);
    cryptsetup(&f);
    cryptsetup(&[
        "reencrypt",
        "--decrypt",
        "-q",
        "--force-offline-reencrypt",
        "--key-file",
        keyfile,
        "--header",
        hdr_s,
        data_s,
    ]);
    let plain = std::fs::read(&data).unwrap();
    for p in [&vk, &data, &hdr] {
        let _ = std::fs::remove_file(p);
    }
    plain
}

/// LUKS2 between object storage and cryptsetup, both ways. `locator(name)` gives a fresh
/// locator (with a `?` query) for volume `name`.
///
/// 1. `sealdisk luksFormat` on the store, data written over NBD and flushed, `export` to a
///    file: cryptsetup dumps the same header, accepts the passphrase, and decrypts the data
///    area to what was written.
/// 2. A file cryptsetup encrypted in place (`reencrypt --encrypt`, no device-mapper needed),
///    `import`ed: sealdisk opens it on the store and reads the original plaintext.
pub fn luks2_object_store_round_trip(dir: &Path, locator: &dyn Fn(&str) -> String) {
    if !have("cryptsetup") || !have("qemu-io") {
        return;
    }
    let pass = dir.join("rt-pass");
    std::fs::write(&pass, b"object store round trip").unwrap();
    let pass = pass.to_str().unwrap();

    let uri = format!("{}&size=24M&object_size=1M", locator("made"));
    let mut f = vec!["luksFormat", "-q", "--type", "luks2", "--key-file", pass];
    f.extend_from_slice(FAST_PBKDF2);
    f.push(&uri);
    sealdisk_ok(&f, "luksFormat on the store");
    let srv = serve(dir, "rt-made", &["--key-file", pass, &uri, "rt-made"], None);
    qemu_io(&srv.uri(), &["write -P 0x42 1M 3M", "write -P 0x17 6M 64k", "flush"]);
    srv.stop_ok();
    let ours = sealdisk_ok(&["luksDump", &uri], "luksDump on the store");
    let img = dir.join("rt-made.img");
    sealdisk_ok(&["export", &uri, img.to_str().unwrap()], "export");
    let theirs =
        String::from_utf8_lossy(&cryptsetup(&["luksDump", img.to_str().unwrap()]).stdout).into_owned();
    assert!(
        luks_uuid(&ours).is_some() && luks_uuid(&ours) == luks_uuid(&theirs),
        "same header:\n{ours}\n{theirs}"
    );
    cryptsetup(&["open", "--test-passphrase", "--key-file", pass, img.to_str().unwrap()]);
    let plain = cryptsetup_plaintext(dir, &img, pass);
    assert!(plain[1 << 20..4 << 20].iter().all(|b| *b == 0x42), "cryptsetup decrypts what was written at 1M");
    assert!(
        plain[6 << 20..(6 << 20) + 65536].iter().all(|b| *b == 0x17),
        "cryptsetup decrypts what was written at 6M"
    );
    let _ = std::fs::remove_file(&img);

    // Encrypted by cryptsetup, imported, read by sealdisk on the store.
    let src = dir.join("rt-theirs.img");
    let mut plain = vec![0x6bu8; 4 << 20];
    plain.extend(std::iter::repeat_n(0x3cu8, 4 << 20));
    plain.resize(16 << 20, 0);
    std::fs::write(&src, &plain).unwrap();
    let src_s = src.to_str().unwrap();
    let mut e = vec![
        "reencrypt",
        "--encrypt",
        "-q",
        "--type",
        "luks2",
        "--reduce-device-size",
        "8M",
        "--key-file",
        pass,
    ];
    e.extend_from_slice(FAST_PBKDF2);
    e.push(src_s);
    cryptsetup(&e);
    let uri = locator("theirs");
    sealdisk_ok(&["import", src_s, &uri], "import of cryptsetup's volume");
    let ours = sealdisk_ok(&["luksDump", &uri], "luksDump of the imported volume");
    let theirs = String::from_utf8_lossy(&cryptsetup(&["luksDump", src_s]).stdout).into_owned();
    assert!(luks_uuid(&ours).is_some() && luks_uuid(&ours) == luks_uuid(&theirs), "same header");
    let srv = serve(dir, "rt-theirs", &["--key-file", pass, &uri, "rt-theirs"], None);
    let out = qemu_io(&srv.uri(), &["read -P 0x6b 0 4M", "read -P 0x3c 4M 4M"]);
    assert!(
        !String::from_utf8_lossy(&out.stdout).contains("verification failed"),
        "{}",
        String::from_utf8_lossy(&out.stdout)
    );
    srv.stop_ok();
    let _ = std::fs::remove_file(&src);
}
