//! dm-integrity `journal_crypt` (ctr(aes), cbc(aes)) and `journal_mac` against Linux 6.1.
//!
//! * `kernel_encrypted_journals_replay` (runs always): images the kernel formatted with
//!   `integritysetup format --journal-crypt …`, wrote, and left open with the journal committed
//!   but not copied out (testdata/integrity/journal-crypt/, made by the ignored test below with
//!   `SEALDISK_REGEN_JOURNAL_CRYPT=1`) are replayed by sealdisk to exactly what the kernel
//!   served (sha256 in journal-crypt/manifest.tsv), with zero mismatches.
//! * `journal_crypt_interop_with_the_kernel` (#[ignore], one boot): sealdisk formats and writes
//!   volumes with an encrypted journal left committed but not copied out, and the kernel
//!   replays them to the same data with zero mismatches; in the same boot the kernel makes
//!   the left-open images above and sealdisk replays them.
//!
//! Guest script: testdata/integrity/journal-crypt.sh.
//! Boots a kernel: `cargo test -p sealdisk --test cli integrity_journal_crypt:: -- --ignored`.

use crate::common;

use std::path::{Path, PathBuf};
use std::process::Command;

use blockdev::{BlockDevice, WriteFlags};
use common::{lcg_pattern as pattern, sha_hex};
use volume::integrity::{IntegrityParams, Mode};

const SIZE: u64 = 4 << 20;

/// (name, --journal-crypt, --journal-integrity)
const CASES: &[(&str, &str, Option<&str>)] = &[
    ("jc-ctr-aes", "ctr-aes", None),
    ("jc-cbc-aes", "cbc-aes", None),
    ("jc-ctr-aes-hmac", "ctr-aes", Some("hmac-sha256")),
    ("jc-cbc-aes-hmac", "cbc-aes", Some("hmac-sha256")),
];

fn testdata() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../../testdata/integrity")
}

fn key() -> Vec<u8> {
    (0..32u8).map(|i| i.wrapping_mul(7).wrapping_add(3)).collect()
}

fn mac_key() -> Vec<u8> {
    (0..32u8).map(|i| i.wrapping_mul(13).wrapping_add(101)).collect()
}

fn params(crypt: &str, mac: Option<&str>) -> IntegrityParams {
    IntegrityParams {
        journal_size: Some(256 << 10),
        mode: Mode::Journal,
        journal_commit_time: 0,
        journal_crypt: Some(crypt.into()),
        journal_crypt_key: Some(sector_crypto::secure::SecretBuf::from_vec(key())),
        journal_integrity: mac.map(str::to_string),
        journal_integrity_key: mac.map(|_| sector_crypto::secure::SecretBuf::from_vec(mac_key())),
        ..IntegrityParams::default()
    }
}

fn opts(crypt: &str, mac: Option<&str>) -> String {
    let mut o =
        format!("--journal-crypt {crypt} --journal-crypt-key-file /kr/jkey --journal-crypt-key-size 32");
    if let Some(m) = mac {
        o += &format!(
            " --journal-integrity {m} --journal-integrity-key-file /kr/mkey --journal-integrity-key-size 32"
        );
    }
    o
}

/// Opens (replays) the image at `path` with sealdisk; returns the sha256 of the whole volume.
fn sealdisk_replay(path: &Path, p: &IntegrityParams) -> String {
    let t = volume::integrity::open(path.to_str().unwrap(), p).unwrap();
    let mut back = vec![0u8; t.geometry().size as usize];
    t.read_at(0, &mut back).unwrap();
    assert_eq!(t.status().mismatches, 0);
    sha_hex(&back)
}

#[test]
fn kernel_encrypted_journals_replay() {
    let dir = testdata().join("journal-crypt");
    let Ok(manifest) = std::fs::read_to_string(dir.join("manifest.tsv")) else {
        panic!("missing testdata/integrity/journal-crypt/manifest.tsv");
    };
    let tmp = tempfile::tempdir().unwrap();
    let mut n = 0;
    for line in manifest.lines().skip(1) {
        let f: Vec<&str> = line.split('\t').collect();
        let (name, sha) = (f[0], f[1]);
        let &(_, crypt, mac) = CASES.iter().find(|c| c.0 == name).expect("case");
        let xz = dir.join(format!("{name}.img.xz"));
        let out = match Command::new("xz").arg("-dc").arg(&xz).output() {
            Ok(o) if o.status.success() => o.stdout,
            Ok(o) => panic!("xz -dc {}: {}", xz.display(), String::from_utf8_lossy(&o.stderr)),
            Err(e) => {
                eprintln!("SKIPPED: cannot run xz ({e})");
                return;
            }
        };
        // The data is in the journal only: with a wrong journal key the commit ids do not
        // match, the journal is cleared instead of replayed, and the data is not there.
        let wrong = tmp.path().join(format!("{name}-wrong.img"));
        std::fs::write(&wrong, &out).unwrap();
        let mut p = params(crypt, mac);
        p.journal_crypt_key =
            Some(sector_crypto::secure::SecretBuf::from_vec(key().into_iter().rev().collect()));
        if let Ok(t) = volume::integrity::open(wrong.to_str().unwrap(), &p) {
            let mut back = vec![0u8; t.geometry().size as usize];
            assert!(t.read_at(0, &mut back).is_err() || sha_hex(&back) != sha, "{name}: wrong key");
        }
        let img = tmp.path().join(format!("{name}.img"));
        std::fs::write(&img, &out).unwrap();
        assert_eq!(sealdisk_replay(&img, &params(crypt, mac)), sha, "{name}: sealdisk replays differently");
        // Replayed once, it opens again to the same data; a wrong key fails to open or
        // cannot be the same volume.
        assert_eq!(sealdisk_replay(&img, &params(crypt, mac)), sha, "{name}: second open");
        n += 1;
    }
    assert!(n > 0);
}

#[test]
#[ignore = "boots Linux under qemu (kernel-run), ~30 s"]
fn journal_crypt_interop_with_the_kernel() {
    let Some(kr) = common::kernel_run() else { return };
    let dir = tempfile::tempdir().unwrap();
    std::fs::write(dir.path().join("jkey"), key()).unwrap();
    std::fs::write(dir.path().join("mkey"), mac_key()).unwrap();
    let pat = pattern(0x5eed, 64 * 1024);
    std::fs::write(dir.path().join("pattern-A"), &pat).unwrap();
    let mut cases_txt = String::new();
    let mut disks = Vec::new();
    let mut expected = Vec::new();
    let mut disk = 0u8;
    // sealdisk → kernel
    for (i, &(name, crypt, mac)) in CASES.iter().enumerate() {
        let name = format!("sd-{name}");
        let img = dir.path().join(format!("{name}.img"));
        std::fs::File::create(&img).unwrap().set_len(SIZE).unwrap();
        let path = img.to_str().unwrap();
        let p = params(crypt, mac);
        volume::integrity::format(path, &p, [i as u8 + 9; 16], false, |_, _| {}).unwrap();
        let t = volume::integrity::open(path, &p).unwrap();
        let size = t.geometry().size as usize;
        let mut content = vec![0u8; size];
        let a = pattern(i as u64 + 1, 48 * 1024);
        t.write_at(64 * 1024, &a, WriteFlags::empty()).unwrap();
        content[64 * 1024..64 * 1024 + a.len()].copy_from_slice(&a);
        t.flush().unwrap();
        let b = pattern(i as u64 + 50, 8 * 1024);
        t.write_at(size as u64 / 2, &b, WriteFlags::FUA).unwrap();
        content[size / 2..size / 2 + b.len()].copy_from_slice(&b);
        let t = std::sync::Arc::into_inner(t).unwrap();
        t.abandon();
        expected.push((name.clone(), sha_hex(&content)));
        cases_txt += &format!("sealdisk|{name}|/dev/vd{}|{}\n", (b'a' + disk) as char, opts(crypt, mac));
        disk += 1;
        disks.push(img);
    }
    // kernel → sealdisk
    let mut kernel_imgs = Vec::new();
    for &(name, crypt, mac) in CASES {
        let img = dir.path().join(format!("{name}.img"));
        std::fs::File::create(&img).unwrap().set_len(SIZE).unwrap();
        cases_txt += &format!("kernel|{name}|/dev/vd{}|{}\n", (b'a' + disk) as char, opts(crypt, mac));
        disk += 1;
        disks.push(img.clone());
        kernel_imgs.push((name, crypt, mac, img));
    }
    std::fs::write(dir.path().join("jc-cases.txt"), &cases_txt).unwrap();
    let files: Vec<PathBuf> =
        ["jc-cases.txt", "pattern-A", "jkey", "mkey"].iter().map(|f| dir.path().join(f)).collect();
    let log = common::boot_kernel_within(&kr, 600, &files, &disks, &testdata().join("journal-crypt.sh"));
    let lines = |key: &str| common::tagged_lines(&log, key);
    let (sha, status) = (lines("SHA"), lines("STATUS"));
    let mut failures = Vec::new();
    for (name, want) in &expected {
        if sha.get(name) != Some(want) {
            failures.push(format!("{name}: the kernel replays sealdisk's journal to different data"));
        } else {
            let st: Vec<&str> = status[name].split_whitespace().collect();
            assert_eq!(st[3], "0", "{name}: kernel counted mismatches: {st:?}");
            eprintln!("{name}: kernel replay ok");
        }
    }
    let regen = std::env::var_os("SEALDISK_REGEN_JOURNAL_CRYPT").is_some();
    let mut manifest = String::from("name\tsha256\n");
    for (name, crypt, mac, img) in kernel_imgs {
        let Some(kernel_sha) = sha.get(name) else {
            failures.push(format!("{name}: the kernel did not make the image"));
            continue;
        };
        manifest += &format!("{name}\t{kernel_sha}\n");
        if regen {
            let o = Command::new("xz").arg("-9e").arg("-k").arg("-c").arg(&img).output().unwrap();
            std::fs::write(testdata().join("journal-crypt").join(format!("{name}.img.xz")), o.stdout)
                .unwrap();
        }
        let ours = sealdisk_replay(&img, &params(crypt, mac));
        if &ours != kernel_sha {
            failures.push(format!("{name}: sealdisk replays the kernel's journal to different data"));
        } else {
            eprintln!("{name}: sealdisk replay ok");
        }
    }
    if regen {
        std::fs::write(testdata().join("journal-crypt/manifest.tsv"), manifest).unwrap();
        std::fs::write(testdata().join("journal-crypt/kernel-run.log"), &log).unwrap();
    }
    assert!(failures.is_empty(), "{failures:#?}");
}
