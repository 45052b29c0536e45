//! sealdisk-formatted LUKS2 authenticated-encryption volumes against the real kernel
//! (Linux 6.1 dm-crypt + dm-integrity and cryptsetup 2.6.1 under
//! /work/shared/oracle/kernel-run, one boot): `sealdisk luksFormat --integrity ...`, data
//! written through sealdisk, then the kernel opens each volume, reads sealdisk's data (and,
//! where sealdisk wiped, the whole device: the format wipe's tags must be valid for the
//! kernel), matches sealdisk's size, and writes; sealdisk reads the kernel's write back.
//!
//! The matrix: aes-xts-plain64 + hmac-sha256 with 512- and 4096-byte sectors (the latter
//! wiped with --integrity-no-journal), aes-gcm-random + aead with 512-byte sectors (wiped)
//! and 4096-byte sectors (--integrity-no-wipe), aes-xts-random + hmac-sha256 (the random IV
//! stored after the tag: 48 bytes), hmac-sha512 with a 256-bit XTS key, hmac-sha1,
//! chacha20-random + poly1305 with 512-byte sectors and with 4096-byte sectors
//! (--integrity-no-journal). Guest script:
//! testdata/luks-integrity/sealdisk-to-kernel.sh. The other direction (kernel-made images
//! opened by sealdisk) is the ordinary test crates/volume/tests/volume/luks2_integrity_golden.rs.
//!
//! Boots a kernel (~30–60 s under TCG):
//! `cargo test -p sealdisk --test cli luks_integrity_kernel:: -- --ignored`.

use crate::common;

use std::path::PathBuf;
use std::process::Command;

use blockdev::{BlockDevice, WriteFlags};
use common::{bin, pattern, sha_hex, FAST_PBKDF2};
use sector_crypto::kdf::Passphrase;
use volume::luks::OpenParams;

const SIZE: u64 = 8 << 20;

struct Case {
    name: &'static str,
    format: &'static [&'static str],
    wiped: bool,
}

const CASES: &[Case] = &[
    Case { name: "hmac-sha256-xts-s512", format: &["--integrity", "hmac-sha256"], wiped: true },
    Case {
        name: "hmac-sha256-xts-s4096-nojournal",
        format: &["--integrity", "hmac-sha256", "--sector-size", "4096", "--integrity-no-journal"],
        wiped: true,
    },
    Case {
        name: "aead-gcm-s512",
        format: &["--cipher", "aes-gcm-random", "--integrity", "aead"],
        wiped: true,
    },
    Case {
        name: "hmac-sha256-xts-random-s4096",
        format: &["--cipher", "aes-xts-random", "--integrity", "hmac-sha256", "--sector-size", "4096"],
        wiped: true,
    },
    Case {
        name: "hmac-sha512-xts-s4096-256bit",
        format: &["--integrity", "hmac-sha512", "--sector-size", "4096", "--key-size", "256"],
        wiped: true,
    },
    Case { name: "hmac-sha1-xts-s512", format: &["--integrity", "hmac-sha1"], wiped: true },
    Case {
        name: "aead-gcm-s4096-nowipe",
        format: &[
            "--cipher",
            "aes-gcm-random",
            "--integrity",
            "aead",
            "--sector-size",
            "4096",
            "--integrity-no-wipe",
        ],
        wiped: false,
    },
    Case {
        name: "chacha20-poly1305-s512",
        format: &["--cipher", "chacha20-random", "--integrity", "poly1305"],
        wiped: true,
    },
    Case {
        name: "chacha20-poly1305-s4096-nojournal",
        format: &[
            "--cipher",
            "chacha20-random",
            "--integrity",
            "poly1305",
            "--sector-size",
            "4096",
            "--integrity-no-journal",
        ],
        wiped: true,
    },
];

fn params(path: &str) -> OpenParams {
    OpenParams::new(path)
}

fn pass() -> Passphrase {
    Passphrase::new(b"kernel aead interop".to_vec())
}

#[test]
#[ignore = "boots Linux under qemu (kernel-run), ~1 min"]
fn sealdisk_aead_volumes_open_in_the_kernel_and_kernel_writes_read_back() {
    let Some(kr) = common::kernel_run() else { return };
    let dir = tempfile::tempdir().unwrap();
    let pass_file = dir.path().join("pass");
    std::fs::write(&pass_file, b"kernel aead interop").unwrap();
    let pattern_k = pattern(1 << 20, 0x4b);
    std::fs::write(dir.path().join("pattern-K"), &pattern_k).unwrap();
    let mut cases_txt = String::new();
    let mut disks = Vec::new();
    let mut expected = Vec::new();
    for (i, c) in CASES.iter().enumerate() {
        let img = dir.path().join(format!("{}.img", c.name));
        std::fs::File::create(&img).unwrap().set_len(SIZE).unwrap();
        let path = img.to_str().unwrap().to_owned();
        let mut args =
            vec!["luksFormat", "-q", "--key-file", pass_file.to_str().unwrap(), "--offset", "2048"];
        args.extend_from_slice(FAST_PBKDF2);
        args.extend_from_slice(c.format);
        args.push(&path);
        let out = Command::new(bin()).args(&args).output().unwrap();
        assert!(out.status.success(), "{}: {}", c.name, String::from_utf8_lossy(&out.stderr));
        let data = pattern(2 << 20, i as u32 + 1);
        let opened = volume::luks::open(&params(&path), &pass()).unwrap();
        let size = opened.volume.device.geometry().size;
        opened.volume.device.write_at(0, &data, WriteFlags::empty()).unwrap();
        opened.volume.device.flush().unwrap();
        drop(opened);
        let mut all = data.clone();
        all.resize(size as usize, 0);
        cases_txt += &format!(
            "{}|/dev/vd{}|{}\n",
            c.name,
            (b'a' + i as u8) as char,
            if c.wiped { "yes" } else { "no" }
        );
        disks.push(img);
        expected.push((c, path, size, sha_hex(&data), sha_hex(&all)));
    }
    std::fs::write(dir.path().join("cases.txt"), &cases_txt).unwrap();
    let script =
        PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../../testdata/luks-integrity/sealdisk-to-kernel.sh");
    let files: Vec<PathBuf> = ["cases.txt", "pattern-K", "pass"].iter().map(|f| dir.path().join(f)).collect();
    let log = common::boot_kernel(&kr, &files, &disks, &script);
    let lines = |key: &str| common::tagged_lines(&log, key);
    let (sha, shaall, sizes, tables) = (lines("SHA"), lines("SHAALL"), lines("SIZE"), lines("TABLE"));
    let wrote: Vec<&str> = log.lines().filter_map(|l| l.strip_prefix("WROTE ")).collect();
    for (c, path, size, want, want_all) in expected {
        let name = c.name;
        assert_eq!(sizes.get(name), Some(&size.to_string()), "{name}: the kernel's size differs");
        assert!(tables[name].contains(":aead"), "{name}: {}", tables[name]);
        if name.starts_with("chacha20") {
            assert!(
                tables[name].contains("capi:rfc7539(chacha20,poly1305)-random")
                    && tables[name].contains("integrity:28:aead"),
                "{name}: {}",
                tables[name]
            );
        }
        assert_eq!(sha.get(name), Some(&want), "{name}: the kernel reads different data");
        if c.wiped {
            assert_eq!(shaall.get(name), Some(&want_all), "{name}: the wiped area does not read as zeroes");
        }
        assert!(wrote.contains(&name), "{name}: the kernel did not write");
        let opened = volume::luks::open(&params(&path), &pass()).unwrap();
        let mut back = vec![0u8; 1 << 20];
        opened.volume.device.read_at(2 << 20, &mut back).unwrap();
        assert!(back == pattern_k, "{name}: sealdisk reads the kernel's write differently");
    }
}
