//! `--ublk` in one boot of Linux 6.12 under /work/shared/oracle/kernel-run (`--kernel 6.12`:
//! ublk_drv, io_uring, fio inside).
//!
//! The host formats four 32 MiB images (plain dm-crypt, LUKS2, LUKS2 with hmac-sha256
//! authenticated encryption, dm-integrity in journal mode) with the host's `sealdisk` and
//! tars this workspace's crates/blockdev and crates/targets. In the guest the same binary
//! serves each image as /dev/ublkbN: the queue limits match the stack (block sizes, one hw
//! queue per CPU, write-back cache, rotational), `mkfs.ext4`, mount, unpack, `sync`,
//! umount, `e2fsck -fn` clean, SIGTERM stops and removes the device, a second server
//! reads every file back, and a fio write+verify job on the raw device passes. Then, on a
//! plain volume over a sparse file: fstrim gives the file's blocks back (DISCARD reaches
//! the backing file), read-only serving, SIGKILL under fio load (I/O fails within
//! seconds, nothing hangs, the id can be served again) and user recovery (a mounted ext4
//! survives the server's SIGKILL and a `--ublk-recover` restart).
//!
//! Guest script: testdata/kernel/ublk-filesystems.sh. The guest runs the sealdisk binary
//! built for the suite (with `--features sealdisk/ublk`, as scripts/test.sh builds it; or
//! SEALDISK_RELEASE_BIN, see `common::guest_bin`): `scripts/kernel-tests.py ublk_kernel`.

use crate::common;

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::Instant;

use common::{sha_hex, FAST_PBKDF2};

const SIZE: u64 = 32 << 20;
const TREE: &[&str] = &["blockdev", "targets"];

fn files_under(root: &Path, rel: &Path, out: &mut Vec<String>) {
    for e in std::fs::read_dir(root.join(rel)).unwrap() {
        let e = e.unwrap();
        let rel = rel.join(e.file_name());
        let t = e.file_type().unwrap();
        if t.is_dir() {
            files_under(root, &rel, out);
        } else if t.is_file() {
            out.push(rel.to_str().unwrap().to_owned());
        }
    }
}

fn run_ok(bin: &Path, args: &[String]) {
    let out = Command::new(bin).args(args).output().unwrap();
    assert!(out.status.success(), "sealdisk {args:?}: {}", String::from_utf8_lossy(&out.stderr));
}

#[test]
#[ignore = "boots Linux 6.12 under qemu (kernel-run)"]
fn ublk_serves_every_stack_to_ext4_and_fio_and_survives_kill_and_recovery() {
    let Some(kr) = common::kernel_run() else { return };
    let Some(sealdisk) = common::guest_bin("ublk_kernel") else { return };
    let dir = tempfile::tempdir().unwrap();
    let d = |name: &str| dir.path().join(name);
    let s = |p: &Path| p.to_str().unwrap().to_owned();
    std::fs::write(d("pass"), b"kernel ublk").unwrap();
    std::fs::write(d("plain.key"), (0u8..64).map(|i| i.wrapping_mul(29) ^ 0xa5).collect::<Vec<u8>>())
        .unwrap();
    let luks = |extra: &[&str], img: &str| {
        let mut a: Vec<String> =
            ["luksFormat", "-q", "--type", "luks2", "--key-file", &s(&d("pass"))].map(str::to_owned).to_vec();
        a.extend(FAST_PBKDF2.iter().chain(extra).map(|x| x.to_string()));
        a.push(img.to_owned());
        a
    };
    let names = ["plain", "luks2", "luks2-aead", "integrity-j"];
    let mut cases = String::new();
    let mut images = Vec::new();
    for (i, name) in names.into_iter().enumerate() {
        let img = s(&d(&format!("{name}.img")));
        std::fs::File::create(&img).unwrap().set_len(SIZE).unwrap();
        let vd = format!("/dev/vd{}", (b'a' + i as u8) as char);
        let serve = match name {
            "plain" => {
                format!("open -M plain -c aes-xts-plain64 -s 512 --key-file /kr/plain.key {vd} {name}")
            }
            "luks2" => {
                run_ok(&sealdisk, &luks(&[], &img));
                format!("open --key-file /kr/pass {vd} {name}")
            }
            "luks2-aead" => {
                run_ok(&sealdisk, &luks(&["--integrity", "hmac-sha256"], &img));
                format!("open --key-file /kr/pass {vd} {name}")
            }
            _ => {
                run_ok(&sealdisk, &["integrity", "format", "-q", "--no-progress", &img].map(str::to_owned));
                format!("integrity open {vd} {name}")
            }
        };
        cases += &format!("{name}|{serve}\n");
        images.push(PathBuf::from(img));
    }
    std::fs::write(d("cases.txt"), cases).unwrap();

    let crates = Path::new(env!("CARGO_MANIFEST_DIR")).join("..");
    let st =
        Command::new("tar").arg("-cf").arg(d("a.tar")).arg("-C").arg(&crates).args(TREE).status().unwrap();
    assert!(st.success());
    let mut files = Vec::new();
    for t in TREE {
        files_under(&crates, Path::new(t), &mut files);
    }
    files.sort();
    let list: String = files
        .iter()
        .map(|f| format!("{}  {f}\n", sha_hex(&std::fs::read(crates.join(f)).unwrap())))
        .collect();
    std::fs::write(d("a.sha"), &list).unwrap();

    let script = Path::new(env!("CARGO_MANIFEST_DIR")).join("../../testdata/kernel/ublk-filesystems.sh");
    let mut cmd = Command::new(&kr);
    cmd.args(["--kernel", "6.12", "--timeout", "500", "--mem", "1G"]);
    for f in ["cases.txt", "a.tar", "a.sha", "pass", "plain.key"] {
        cmd.arg("--file").arg(d(f));
    }
    cmd.arg("--file").arg(&sealdisk);
    for img in &images {
        cmd.arg("--disk").arg(img);
    }
    cmd.arg(&script);
    let t = Instant::now();
    let out = cmd.output().unwrap();
    let log = String::from_utf8_lossy(&out.stdout).to_string();
    eprintln!("{log}");
    eprintln!("{}", String::from_utf8_lossy(&out.stderr));
    eprintln!("kernel-run took {:.1?}", t.elapsed());
    assert!(out.status.success(), "kernel-run failed ({})", out.status);
    assert!(log.contains("### done"), "the guest script did not finish");
    assert!(!log.contains("TIMEOUT"), "a guest step timed out");

    // RESULT <name> <step> ok|FAIL [detail]
    let mut results: BTreeMap<(String, String), (String, String)> = BTreeMap::new();
    for l in log.lines().filter_map(|l| l.strip_prefix("RESULT ")) {
        let mut w = l.splitn(4, ' ');
        let (name, step, verdict) = (w.next().unwrap(), w.next().unwrap_or(""), w.next().unwrap_or(""));
        let e = results.entry((name.into(), step.into())).or_insert((verdict.into(), String::new()));
        // A later FAIL for the same step wins over an earlier ok.
        if verdict != "ok" {
            *e = (verdict.into(), w.next().unwrap_or("").into());
        } else if e.0 == "ok" {
            e.1 = w.next().unwrap_or("").into();
        }
    }
    let n_files = list.lines().count().to_string();
    let mut expect: Vec<(&str, &str)> = Vec::new();
    for name in names {
        for step in ["serve", "limits", "unpack", "fsck", "stop", "verify", "fio"] {
            expect.push((name, step));
        }
    }
    expect.extend([
        ("sparse", "discard-limit"),
        ("sparse", "fstrim"),
        ("ro", "readonly"),
        ("kill", "io-fails"),
        ("kill", "reuse-id"),
        ("rec", "recovered-read"),
        ("rec", "recovered-write"),
        ("rec", "fsck"),
    ]);
    let mut failed = Vec::new();
    for (name, step) in &expect {
        match results.get(&(name.to_string(), step.to_string())) {
            Some((v, _)) if v == "ok" => {}
            other => failed.push(format!("{name} {step}: {other:?}")),
        }
    }
    assert!(failed.is_empty(), "failed steps:\n{}", failed.join("\n"));
    for name in names.iter().copied().chain(["rec"]) {
        let step = if name == "rec" { "recovered-read" } else { "verify" };
        assert_eq!(results[&(name.to_string(), step.to_string())].1, n_files, "{name}: every file checked");
    }
}
