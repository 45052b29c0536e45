//! sealdisk-formatted and -written LUKS volumes against the real kernel (Linux 6.1 dm-crypt
//! and its cryptsetup, under /work/shared/oracle/kernel-run, one boot): the kernel opens each
//! volume and reads the data sealdisk wrote; the kernel writes into it and adds a keyslot,
//! and sealdisk reads the kernel's write back through the new keyslot.
//!
//! The matrix: LUKS2 aes-xts-plain64 4096-byte sectors + argon2id, LUKS2
//! aes-cbc-essiv:sha256 512-byte sectors + pbkdf2, LUKS1 aes-xts-plain64 + sha1. Guest
//! script: testdata/luks/sealdisk-to-kernel.sh.
//!
//! Boots a kernel (~30–60 s under TCG): `cargo test -p sealdisk --test cli luks_kernel:: -- --ignored`.

use crate::common;

use std::path::PathBuf;
use std::process::Command;

use blockdev::{BlockDevice, WriteFlags};
use common::{bin, pattern, sha_hex, FAST_ARGON2ID, FAST_PBKDF2};
use sector_crypto::kdf::Passphrase;
use volume::luks::OpenParams;

const SIZE: u64 = 24 << 20;

struct Case {
    name: &'static str,
    /// Key-derivation options, then the rest of the luksFormat options.
    pbkdf: &'static [&'static str],
    format: &'static [&'static str],
}

const CASES: &[Case] = &[
    Case { name: "luks2-xts-4k-argon2id", pbkdf: FAST_ARGON2ID, format: &["--sector-size", "4096"] },
    Case {
        name: "luks2-cbc-essiv-pbkdf2",
        pbkdf: FAST_PBKDF2,
        format: &["--cipher", "aes-cbc-essiv:sha256", "--key-size", "256"],
    },
    Case {
        name: "luks1-xts-sha1",
        pbkdf: &["--pbkdf-force-iterations", "1000"],
        format: &["--type", "luks1", "--hash", "sha1"],
    },
];

fn params(path: &str) -> OpenParams {
    OpenParams::new(path)
}

#[test]
#[ignore = "boots Linux under qemu (kernel-run), ~1 min"]
fn sealdisk_luks_volumes_open_in_the_kernel_and_kernel_writes_read_back() {
    let Some(kr) = common::kernel_run() else { return };
    let dir = tempfile::tempdir().unwrap();
    let pass = dir.path().join("pass");
    std::fs::write(&pass, b"kernel interop").unwrap();
    std::fs::write(dir.path().join("pass2"), b"added by the kernel").unwrap();
    let pattern_k = pattern(1 << 20, 0x4b);
    std::fs::write(dir.path().join("pattern-K"), &pattern_k).unwrap();
    let mut cases_txt = String::new();
    let mut disks = Vec::new();
    let mut expected = Vec::new();
    for (i, c) in CASES.iter().enumerate() {
        let img = dir.path().join(format!("{}.img", c.name));
        std::fs::File::create(&img).unwrap().set_len(SIZE).unwrap();
        let path = img.to_str().unwrap().to_owned();
        let mut args = vec!["luksFormat", "-q", "--key-file", pass.to_str().unwrap()];
        args.extend_from_slice(c.pbkdf);
        args.extend_from_slice(c.format);
        args.push(&path);
        let out = Command::new(bin()).args(&args).output().unwrap();
        assert!(out.status.success(), "{}: {}", c.name, String::from_utf8_lossy(&out.stderr));
        let data = pattern(2 << 20, i as u32 + 1);
        let opened =
            volume::luks::open(&params(&path), &Passphrase::new(b"kernel interop".to_vec())).unwrap();
        opened.volume.device.write_at(0, &data, WriteFlags::empty()).unwrap();
        opened.volume.device.flush().unwrap();
        drop(opened);
        cases_txt += &format!("{}|/dev/vd{}|/kr/pass\n", c.name, (b'a' + i as u8) as char);
        disks.push(img);
        expected.push((c.name, path, sha_hex(&data)));
    }
    std::fs::write(dir.path().join("cases.txt"), &cases_txt).unwrap();
    let script = PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../../testdata/luks/sealdisk-to-kernel.sh");
    let files: Vec<PathBuf> =
        ["cases.txt", "pattern-K", "pass", "pass2"].iter().map(|f| dir.path().join(f)).collect();
    let log = common::boot_kernel(&kr, &files, &disks, &script);
    let lines = |key: &str| common::tagged_lines(&log, key);
    let sha = lines("SHA");
    let flagged = |key: &str| -> Vec<&str> { log.lines().filter_map(|l| l.strip_prefix(key)).collect() };
    let (wrote, added) = (flagged("WROTE "), flagged("ADDED "));
    for (name, path, want) in expected {
        assert_eq!(sha.get(name), Some(&want), "{name}: the kernel reads different data");
        assert!(wrote.contains(&name), "{name}: the kernel did not write");
        assert!(added.contains(&name), "{name}: the kernel's cryptsetup could not add a keyslot");
        // sealdisk opens with the kernel-added keyslot and reads the kernel's write.
        let opened =
            volume::luks::open(&params(&path), &Passphrase::new(b"added by the kernel".to_vec())).unwrap();
        let mut back = vec![0u8; 1 << 20];
        opened.volume.device.read_at(2 << 20, &mut back).unwrap();
        assert!(back == pattern_k, "{name}: sealdisk reads the kernel's write differently");
    }
}
