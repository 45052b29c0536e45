//! ext4 through the kernel's NBD client on every stack, in one boot of Linux 6.12 under
//! /work/shared/oracle/kernel-run (`--kernel 6.12`: nbd.ko and nbd-client inside).
//!
//! The host formats five 64 MiB images (plain dm-crypt, LUKS2, LUKS2 with hmac-sha256
//! authenticated encryption, dm-integrity in journal mode and in bitmap mode) with the
//! release `sealdisk`, and tars this workspace's crates/ in two halves. In the guest the same
//! binary serves each image from its virtio disk on a unix socket; `nbd-client -unix` (with
//! `-C 4` for the plain volume) attaches it; `mkfs.ext4`, mount, unpack, `sync`, umount,
//! `e2fsck -fn` must be clean and every file must read back. Then the crash case: half A
//! unpacked and synced, the server killed with SIGKILL while half B is being unpacked,
//! restarted, a fresh NBD device attached: ext4 replays its journal on mount, `e2fsck -fn`
//! is clean, and every file of half A is intact. Also: the NBD device is rotational exactly
//! when the virtio disk under the server is (`NBD_FLAG_ROTATIONAL`).
//!
//! Guest script: testdata/kernel/nbd-filesystems.sh. The guest runs the host's release
//! binary (a debug build is far too slow under TCG): build it first with
//! `cargo build --release -p sealdisk` (or point SEALDISK_RELEASE_BIN at one). Boots a
//! kernel (about 4–6 min under TCG):
//! `cargo test -p sealdisk --test nbd_kernel -- --ignored --nocapture`.

mod common;

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::{Duration, Instant};

use common::{sha_hex, FAST_PBKDF2};

const SIZE: u64 = 64 << 20;
/// Half A of the source tree (synced before the kill) and half B (unpacked during it).
const HALF_A: &[&str] = &["blockdev", "sector-crypto", "targets", "testkit", "volume"];
const HALF_B: &[&str] = &["bench", "cli", "formats", "nbd"];

/// The release binary the guest runs, if it exists (and a loud skip otherwise).
fn release_bin() -> Option<PathBuf> {
    let path = match std::env::var_os("SEALDISK_RELEASE_BIN") {
        Some(p) => PathBuf::from(p),
        None => {
            let target = std::env::var_os("CARGO_TARGET_DIR")
                .map(PathBuf::from)
                .unwrap_or_else(|| Path::new(env!("CARGO_MANIFEST_DIR")).join("../../target"));
            target.join("release/sealdisk")
        }
    };
    if !path.is_file() {
        eprintln!(
            "SKIPPED nbd_kernel: no release binary at {} (cargo build --release -p sealdisk, or set \
             SEALDISK_RELEASE_BIN)",
            path.display()
        );
        return None;
    }
    let age = std::fs::metadata(&path).and_then(|m| m.modified()).ok().and_then(|t| t.elapsed().ok());
    eprintln!("nbd_kernel: the guest runs {} (built {age:.0?} ago)", path.display());
    Some(path)
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
#[ignore = "boots Linux 6.12 under qemu (kernel-run), about 4-6 minutes"]
fn ext4_on_the_kernel_nbd_client_survives_use_and_a_killed_server_on_every_stack() {
    let Some(kr) = common::kernel_run() else { return };
    let Some(sealdisk) = release_bin() else { return };
    let dir = tempfile::tempdir().unwrap();
    let d = |name: &str| dir.path().join(name);
    let s = |p: &Path| p.to_str().unwrap().to_owned();
    std::fs::write(d("pass"), b"kernel nbd client").unwrap();
    std::fs::write(d("plain.key"), (0u8..64).map(|i| i.wrapping_mul(37) ^ 0x5c).collect::<Vec<u8>>())
        .unwrap();

    // The stacks: (name, format arguments or None, sealdisk serve arguments, connections).
    let luks = |extra: &[&str], img: &str| {
        let mut a = vec!["luksFormat", "-q", "--type", "luks2", "--key-file", &s(&d("pass"))]
            .into_iter()
            .map(str::to_owned)
            .collect::<Vec<_>>();
        a.extend(FAST_PBKDF2.iter().chain(extra).map(|x| x.to_string()));
        a.push(img.to_owned());
        a
    };
    struct Case {
        name: &'static str,
        format: Option<Vec<String>>,
        serve: String,
        conns: u32,
    }
    let mut cases = Vec::new();
    for (i, name) in ["plain", "luks2", "luks2-aead", "integrity-j", "integrity-b"].into_iter().enumerate() {
        let img = s(&d(&format!("{name}.img")));
        std::fs::File::create(&img).unwrap().set_len(SIZE).unwrap();
        let vd = format!("/dev/vd{}", (b'a' + i as u8) as char);
        let (format, serve, conns) = match name {
            "plain" => (
                None,
                format!("open -M plain -c aes-xts-plain64 -s 512 --key-file /kr/plain.key --allow-discards {vd} {name}"),
                4,
            ),
            "luks2" => (Some(luks(&[], &img)), format!("open --key-file /kr/pass {vd} {name}"), 1),
            "luks2-aead" => (
                Some(luks(&["--integrity", "hmac-sha256"], &img)),
                format!("open --key-file /kr/pass {vd} {name}"),
                1,
            ),
            "integrity-j" => (
                Some(["integrity", "format", "-q", "--no-progress", &img].map(str::to_owned).to_vec()),
                format!("integrity open {vd} {name}"),
                1,
            ),
            _ => (
                Some(["integrity", "format", "-q", "--no-progress", &img].map(str::to_owned).to_vec()),
                format!("integrity open -B {vd} {name}"),
                1,
            ),
        };
        cases.push((Case { name, format, serve, conns }, PathBuf::from(img)));
    }
    let t = Instant::now();
    for (c, _) in &cases {
        if let Some(args) = &c.format {
            run_ok(&sealdisk, &args.iter().map(String::as_str).collect::<Vec<_>>());
        }
    }
    eprintln!("formatted {} images on the host in {:.1?}", cases.len(), t.elapsed());

    let crates = Path::new(env!("CARGO_MANIFEST_DIR")).join("..");
    let list_a = tar_half(&crates, HALF_A, &d("a.tar"));
    let list_b = tar_half(&crates, HALF_B, &d("b.tar"));
    std::fs::write(d("a.sha"), &list_a).unwrap();
    std::fs::write(d("all.sha"), list_a.clone() + &list_b).unwrap();
    let (n_a, n_all) = (list_a.lines().count(), list_a.lines().count() + list_b.lines().count());
    let cases_txt: String = cases
        .iter()
        .enumerate()
        .map(|(i, (c, _))| {
            format!("{}|/dev/vd{}|{}|{}\n", c.name, (b'a' + i as u8) as char, c.conns, c.serve)
        })
        .collect();
    std::fs::write(d("cases.txt"), cases_txt).unwrap();

    let script = Path::new(env!("CARGO_MANIFEST_DIR")).join("../../testdata/kernel/nbd-filesystems.sh");
    let mut cmd = Command::new(&kr);
    cmd.args(["--kernel", "6.12", "--timeout", "600"]);
    for f in ["cases.txt", "a.tar", "b.tar", "a.sha", "all.sha", "pass", "plain.key"] {
        cmd.arg("--file").arg(d(f));
    }
    cmd.arg("--file").arg(&sealdisk);
    for (_, img) in &cases {
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
    assert!(wall < Duration::from_secs(600));

    // RESULT <name> <step> ok|FAIL [detail]
    let mut results: BTreeMap<(String, String), (String, String)> = BTreeMap::new();
    for l in log.lines().filter_map(|l| l.strip_prefix("RESULT ")) {
        let mut w = l.splitn(4, ' ');
        let (name, step, verdict) = (w.next().unwrap(), w.next().unwrap_or(""), w.next().unwrap_or(""));
        results.insert((name.into(), step.into()), (verdict.into(), w.next().unwrap_or("").into()));
    }
    let tagged = |key: &str| common::tagged_lines(&log, key);
    let (rotational, killed) = (tagged("ROTATIONAL"), tagged("KILLED"));
    assert_eq!(
        rotational.get("flat").map(String::as_str),
        Some("0 0"),
        "a RAM-backed export is not rotational"
    );
    for (c, _) in &cases {
        for step in ["connect", "unpack", "fsck", "verify", "synced", "crash-fsck", "crash-verify"] {
            let got = results.get(&(c.name.to_string(), step.to_string()));
            assert_eq!(got.map(|r| r.0.as_str()), Some("ok"), "{}: {step}: {got:?}", c.name);
        }
        let detail = |step: &str| results[&(c.name.to_string(), step.to_string())].1.clone();
        assert_eq!(detail("connect"), c.conns.to_string(), "{}: connections", c.name);
        assert_eq!(detail("verify"), n_all.to_string(), "{}: every file checked", c.name);
        assert_eq!(detail("crash-verify"), n_a.to_string(), "{}: every synced file checked", c.name);
        let rot = rotational.get(c.name).unwrap_or_else(|| panic!("{}: no ROTATIONAL line", c.name));
        let (nbd, vd) = rot.split_once(' ').unwrap();
        assert_eq!(nbd, vd, "{}: /dev/nbdX rotational {nbd}, its virtio disk {vd}", c.name);
        match killed.get(c.name).map(String::as_str) {
            Some("midway") => {}
            other => eprintln!("NOTE {}: the server was killed {other:?}, not mid-unpack", c.name),
        }
    }
}
