//! ext4 in a real kernel on every transport the guest has × every stack, in one boot of
//! Linux 6.12 under /work/shared/oracle/kernel-run (`--kernel 6.12`: nbd.ko, fuse, loop and
//! nbd-client inside; the host's fusermount3 is copied in).
//!
//! The host formats five 64 MiB images (plain dm-crypt, LUKS2, LUKS2 with hmac-sha256
//! authenticated encryption, dm-integrity in journal mode J and in bitmap mode B) with the
//! host's `sealdisk`, and tars this workspace's crates/ (the real source tree, about 250 files)
//! in two halves. In the guest the same binary serves each image from its virtio disk, over
//! one of three transports: the kernel NBD client on a unix socket, the kernel NBD client
//! over TCP on 127.0.0.1, or the FUSE file (`--fuse DIR`) on a loop device (`losetup`).
//! Each case: `mkfs.ext4`, mount, unpack the tree, `sync`, umount, `e2fsck -fn` clean, mount
//! again and compare every file's SHA-256. The crash cases then unpack half A and sync, fsync
//! every file of a first copy of half B, SIGKILL the server while more copies are unpacked
//! (the guest reports which files were fsync'ed and how many existed at the kill),
//! restart it and attach again: ext4 replays its journal on mount, `e2fsck -fn` is clean,
//! and every file synced or fsync'ed before the kill is intact. Also: an NBD device is
//! rotational exactly when the virtio disk under the server is (`NBD_FLAG_ROTATIONAL`).
//!
//! The matrix ([`matrix`]) is chosen to keep one boot at about five minutes under TCG (a
//! case costs 5–15 s there, 20–30 s with the crash part; 250 s in all on an idle host):
//! - unix socket: every stack, the full unpack and the crash case; `-C 4` on plain (several
//!   connections in flight when the server dies); on integrity J the volume's journal
//!   replays under ext4's, on B the bitmap's dirty regions are recalculated;
//! - TCP: the same server code past the socket, so two stacks and no crash: plain with
//!   `-C 4` (multi-connection over TCP) and LUKS2 AEAD;
//! - FUSE file: a different transport end to end, so every stack gets the full unpack, and
//!   the crash case runs on LUKS2 and integrity J (a dead FUSE server fails the loop
//!   device's I/O, fusermount3 unmounts, a new server mounts the same DIR).
//!
//! Guest script: testdata/kernel/filesystems.sh. The guest runs the sealdisk binary built for
//! the suite (or SEALDISK_RELEASE_BIN; see `common::guest_bin`). Boots a kernel (about 5 min
//! under TCG): `scripts/kernel-tests.py fs_kernel`.

use crate::common;

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::{Duration, Instant};

use common::{sha_hex, FAST_PBKDF2};

const SIZE: u64 = 64 << 20;
/// Half A of the source tree (synced before the kill) and half B (unpacked during it; its
/// first copy fsync'ed file by file before the kill).
const HALF_A: &[&str] = &["blockdev", "sector-crypto", "targets", "testkit", "volume"];
const HALF_B: &[&str] = &["bench", "cli", "formats", "fuse", "nbd"];
/// The stacks, one image each (/dev/vda, /dev/vdb, ... in this order).
const STACKS: [&str; 5] = ["plain", "luks2", "luks2-aead", "integrity-j", "integrity-b"];

/// One case: a stack on a transport.
struct Case {
    stack: &'static str,
    /// `unix`, `tcp` or `fuse` (testdata/kernel/filesystems.sh).
    transport: &'static str,
    /// NBD connections (`nbd-client -C`); 1 for FUSE.
    conns: u32,
    /// Also the crash part.
    crash: bool,
}

impl Case {
    fn name(&self) -> String {
        format!("{}@{}", self.stack, self.transport)
    }
}

/// What runs (see the module comment for why).
fn matrix() -> Vec<Case> {
    let mut m = Vec::new();
    for stack in STACKS {
        m.push(Case { stack, transport: "unix", conns: if stack == "plain" { 4 } else { 1 }, crash: true });
    }
    m.push(Case { stack: "plain", transport: "tcp", conns: 4, crash: false });
    m.push(Case { stack: "luks2-aead", transport: "tcp", conns: 1, crash: false });
    for stack in STACKS {
        let crash = matches!(stack, "luks2" | "integrity-j");
        m.push(Case { stack, transport: "fuse", conns: 1, crash });
    }
    m
}

/// The host's fusermount3 (copied into the guest, which has none), or a loud skip.
fn fusermount3() -> Option<PathBuf> {
    let found =
        ["/usr/bin/fusermount3", "/bin/fusermount3"].into_iter().map(PathBuf::from).find(|p| p.is_file());
    if found.is_none() {
        eprintln!(
            "SKIPPED fs_kernel: no fusermount3 on the host to copy into the guest (apt-get install fuse3)"
        );
    }
    found
}

/// Every file under `root/dir` for each dir, as paths relative to `root`, sorted.
fn files_under(root: &Path, dirs: &[&str]) -> Vec<String> {
    fn walk(root: &Path, rel: &Path, out: &mut Vec<String>) {
        for e in std::fs::read_dir(root.join(rel)).unwrap() {
            let e = e.unwrap();
            let rel = rel.join(e.file_name());
            let t = e.file_type().unwrap();
            if t.is_dir() {
                walk(root, &rel, out);
            } else if t.is_file() {
                out.push(rel.to_str().unwrap().to_owned());
            }
        }
    }
    let mut out = Vec::new();
    for d in dirs {
        walk(root, Path::new(d), &mut out);
    }
    out.sort();
    out
}

/// `tar -cf TAR -C root dirs...`, and the `sha256sum -c` list of what it holds.
fn tar_half(root: &Path, dirs: &[&str], tar: &Path) -> String {
    let st = Command::new("tar").arg("-cf").arg(tar).arg("-C").arg(root).args(dirs).status().unwrap();
    assert!(st.success(), "tar failed");
    let mut list = String::new();
    for f in files_under(root, dirs) {
        list += &format!("{}  {f}\n", sha_hex(&std::fs::read(root.join(&f)).unwrap()));
    }
    list
}

fn run_ok(bin: &Path, args: &[&str]) {
    let out = Command::new(bin).args(args).output().unwrap();
    assert!(out.status.success(), "sealdisk {args:?}: {}", String::from_utf8_lossy(&out.stderr));
}

#[test]
#[ignore = "boots Linux 6.12 under qemu (kernel-run), about 5 minutes"]
fn ext4_on_every_transport_and_stack_survives_use_and_a_killed_server() {
    let Some(kr) = common::kernel_run() else { return };
    let Some(sealdisk) = common::guest_bin("fs_kernel") else { return };
    let Some(fusermount) = fusermount3() else { return };
    let dir = tempfile::tempdir().unwrap();
    let d = |name: &str| dir.path().join(name);
    let s = |p: &Path| p.to_str().unwrap().to_owned();
    std::fs::write(d("pass"), b"kernel filesystems").unwrap();
    std::fs::write(d("plain.key"), (0u8..64).map(|i| i.wrapping_mul(37) ^ 0x5c).collect::<Vec<u8>>())
        .unwrap();

    let luks = |extra: &[&str], img: &str| {
        let mut a = vec!["luksFormat", "-q", "--type", "luks2", "--key-file", &s(&d("pass"))]
            .into_iter()
            .map(str::to_owned)
            .collect::<Vec<_>>();
        a.extend(FAST_PBKDF2.iter().chain(extra).map(|x| x.to_string()));
        a.push(img.to_owned());
        a
    };
    // Per stack: its image, the host's format arguments (None: nothing to format) and the
    // guest's sealdisk arguments (device, then the export/file name last).
    let mut images = Vec::new();
    let mut serve_args = BTreeMap::new();
    let t = Instant::now();
    for (i, stack) in STACKS.into_iter().enumerate() {
        let img = s(&d(&format!("{stack}.img")));
        std::fs::File::create(&img).unwrap().set_len(SIZE).unwrap();
        let vd = format!("/dev/vd{}", (b'a' + i as u8) as char);
        let integrity_format =
            ["integrity", "format", "-q", "--no-progress", &img].map(str::to_owned).to_vec();
        let (format, serve) = match stack {
            "plain" => (
                None,
                format!("open -M plain -c aes-xts-plain64 -s 512 --key-file /kr/plain.key --allow-discards {vd} vol"),
            ),
            "luks2" => (Some(luks(&[], &img)), format!("open --key-file /kr/pass {vd} vol")),
            "luks2-aead" => (
                Some(luks(&["--integrity", "hmac-sha256"], &img)),
                format!("open --key-file /kr/pass {vd} vol"),
            ),
            "integrity-j" => (Some(integrity_format), format!("integrity open {vd} vol")),
            _ => (Some(integrity_format), format!("integrity open -B {vd} vol")),
        };
        if let Some(args) = format {
            run_ok(&sealdisk, &args.iter().map(String::as_str).collect::<Vec<_>>());
        }
        images.push(PathBuf::from(img));
        serve_args.insert(stack, (vd, serve));
    }
    eprintln!("formatted {} images on the host in {:.1?}", images.len(), t.elapsed());

    let crates = Path::new(env!("CARGO_MANIFEST_DIR")).join("..");
    let list_a = tar_half(&crates, HALF_A, &d("a.tar"));
    let list_b = tar_half(&crates, HALF_B, &d("b.tar"));
    let b1: String = list_b.lines().map(|l| l.replacen("  ", "  b1/", 1) + "\n").collect();
    std::fs::write(d("all.sha"), list_a.clone() + &list_b).unwrap();
    std::fs::write(d("crash.sha"), list_a.clone() + &b1).unwrap();
    let (n_a, n_b) = (list_a.lines().count(), list_b.lines().count());
    eprintln!("source tree: {n_a} files in half A, {n_b} in half B");

    let cases = matrix();
    let cases_txt: String = cases
        .iter()
        .map(|c| {
            let (vd, serve) = &serve_args[c.stack];
            format!("{}|{}|{vd}|{}|{}|{serve}\n", c.name(), c.transport, c.conns, u8::from(c.crash))
        })
        .collect();
    std::fs::write(d("cases.txt"), cases_txt).unwrap();

    let script = Path::new(env!("CARGO_MANIFEST_DIR")).join("../../testdata/kernel/filesystems.sh");
    let mut cmd = Command::new(&kr);
    cmd.args(["--kernel", "6.12", "--timeout", "900"]);
    for f in ["cases.txt", "a.tar", "b.tar", "all.sha", "crash.sha", "pass", "plain.key"] {
        cmd.arg("--file").arg(d(f));
    }
    cmd.arg("--file").arg(&sealdisk).arg("--file").arg(&fusermount);
    for img in &images {
        cmd.arg("--disk").arg(img);
    }
    cmd.arg(&script);
    let t = Instant::now();
    let out = cmd.output().unwrap();
    let wall = t.elapsed();
    let log = String::from_utf8_lossy(&out.stdout).to_string();
    eprintln!("{log}");
    eprintln!("{}", String::from_utf8_lossy(&out.stderr));
    eprintln!("kernel-run took {wall:.1?} in all");
    assert!(out.status.success(), "kernel-run failed ({})", out.status);
    assert!(log.contains("### done"), "the guest script did not finish");
    assert!(wall < Duration::from_secs(900));

    // RESULT <name> <step> ok|FAIL [detail]
    let mut results: BTreeMap<(String, String), (String, String)> = BTreeMap::new();
    for l in log.lines().filter_map(|l| l.strip_prefix("RESULT ")) {
        let mut w = l.splitn(4, ' ');
        let (name, step, verdict) = (w.next().unwrap(), w.next().unwrap_or(""), w.next().unwrap_or(""));
        results.insert((name.into(), step.into()), (verdict.into(), w.next().unwrap_or("").into()));
    }
    let failed: Vec<_> = results.iter().filter(|(_, (v, _))| v != "ok").collect();
    assert!(failed.is_empty(), "failed steps: {failed:?}");
    let tagged = |key: &str| common::tagged_lines(&log, key);
    let (rotational, killed, fsynced) = (tagged("ROTATIONAL"), tagged("KILLED"), tagged("FSYNCED"));
    assert_eq!(
        rotational.get("flat").map(String::as_str),
        Some("0 0"),
        "a RAM-backed export is not rotational"
    );
    for c in &cases {
        let name = c.name();
        let mut steps = vec!["connect", "unpack", "fsck", "verify"];
        if c.crash {
            steps.extend(["synced", "crash-fsck", "crash-verify"]);
        }
        for step in steps {
            let got = results.get(&(name.clone(), step.to_string()));
            assert_eq!(got.map(|r| r.0.as_str()), Some("ok"), "{name}: {step}: {got:?}");
        }
        let detail = |step: &str| results[&(name.clone(), step.to_string())].1.clone();
        assert_eq!(detail("connect"), c.conns.to_string(), "{name}: connections");
        assert_eq!(detail("verify"), (n_a + n_b).to_string(), "{name}: every file checked");
        if c.transport != "fuse" {
            let rot = rotational.get(&name).unwrap_or_else(|| panic!("{name}: no ROTATIONAL line"));
            let (nbd, vd) = rot.split_once(' ').unwrap();
            assert_eq!(nbd, vd, "{name}: /dev/nbdX rotational {nbd}, its virtio disk {vd}");
        }
        if c.crash {
            assert_eq!(detail("crash-verify"), (n_a + n_b).to_string(), "{name}: every synced file checked");
            assert_eq!(fsynced.get(&name), Some(&n_b.to_string()), "{name}: every file of c/b1 fsync'ed");
            let kill = killed.get(&name).map(String::as_str).unwrap_or("");
            assert!(kill.starts_with("midway "), "{name}: the server was not killed mid-unpack: {kill:?}");
        }
    }
}
