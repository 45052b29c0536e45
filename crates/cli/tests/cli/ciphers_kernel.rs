//! sealdisk-written volumes of every cipher family against the real kernel (Linux 6.1
//! dm-crypt and its cryptsetup, under /work/shared/oracle/kernel-run, one boot):
//!
//! * plain dm-crypt: sealdisk's `SectorCipher` (the code `CryptTarget` runs) encrypts a
//!   pattern for each spec (serpent, twofish, camellia, cast5, cast6, blowfish, des3_ede in
//!   xts, cbc, ecb, lrw, ctr, pcbc, with essiv (several hashes), benbi, plain64be, eboiv, lmk, tcw and
//!   keycounts, legacy and capi forms); the kernel maps each with the same table and must
//!   read the pattern back;
//! * LUKS1/LUKS2 volumes `sealdisk luksFormat` made with those ciphers: the kernel's
//!   cryptsetup opens them and reads what sealdisk wrote, writes into them and adds a keyslot
//!   (encrypted by cryptsetup with the same cipher); sealdisk opens that keyslot and reads
//!   the kernel's write.
//!
//! The images sealdisk reads from the kernel's own writes are in
//! testdata/dm-crypt-ciphers (tests in sector-crypto's kernel_golden.rs). Guest script:
//! testdata/dm-crypt-ciphers/ciphers-to-kernel.sh.
//!
//! Boots a kernel (~1–2 min under TCG): `cargo test -p sealdisk --test cli ciphers_kernel:: -- --ignored`.

use crate::common;

use std::path::PathBuf;
use std::process::Command;

use blockdev::{BlockDevice, WriteFlags};
use common::{bin, pattern, sha_hex, FAST_ARGON2ID, FAST_PBKDF2};
use sector_crypto::kdf::Passphrase;
use sector_crypto::{CipherSpec, SectorCipher, SectorParams, VolumeKey};
use volume::luks::OpenParams;

/// Plain cases: (cipher spec, key bits, sector size, iv_large_sectors, iv_offset).
const PLAIN: &[(&str, usize, u32, bool, u64)] = &[
    ("serpent-xts-plain64", 512, 512, false, 0),
    ("twofish-xts-plain64", 256, 4096, true, 0),
    ("camellia-xts-plain64", 512, 512, false, 0),
    ("cast6-xts-plain64", 512, 512, false, 0),
    ("serpent-cbc-essiv:sha256", 256, 512, false, 8),
    ("twofish-lrw-benbi", 384, 512, false, 0),
    ("camellia-ctr-plain64", 256, 512, false, 0),
    ("cast6-pcbc-plain64", 256, 512, false, 0),
    ("aes-lrw-benbi", 384, 4096, true, 0),
    ("aes-ctr-plain64", 256, 512, false, 0),
    ("aes-pcbc-plain64", 128, 512, false, 0),
    ("aes-xts-plain64", 384, 512, false, 0),
    ("cast5-cbc-plain64", 128, 512, false, 0),
    ("cast5-ctr-plain64", 128, 512, false, 0),
    ("cast5-cbc-eboiv", 128, 4096, true, 0),
    ("blowfish-cbc-essiv:sha256", 256, 512, false, 0),
    ("blowfish-pcbc-plain64", 448, 512, false, 0),
    ("des3_ede-cbc-plain64", 192, 512, false, 0),
    ("des3_ede-ecb", 192, 512, false, 0),
    ("serpent-ecb", 256, 512, false, 0),
    ("twofish-cbc-benbi", 256, 512, false, 0),
    ("serpent-xts-plain64be", 512, 512, false, 0),
    ("aes-cbc-lmk", 256, 512, false, 0),
    ("aes:64-cbc-lmk", 65 * 128, 512, false, 0),
    ("capi:cbc(aes)-lmk", 64 * 256, 512, false, 0),
    ("blowfish-cbc-lmk", 256, 512, false, 0),
    ("aes-cbc-tcw", 512, 512, false, 0),
    ("serpent-cbc-tcw", 512, 512, false, 0),
    ("des3_ede-cbc-tcw", 384, 512, false, 0),
    ("serpent:2-xts-plain64", 1024, 512, false, 8),
    ("twofish:2-cbc-essiv:sha256", 512, 4096, false, 0),
    ("capi:xts(camellia)-plain64", 512, 512, false, 0),
    // ESSIV with other hashes: the salt hash(subkey) keys the data cipher at the digest size.
    ("twofish:2-cbc-essiv:md5", 256, 512, false, 0),
    ("serpent-xts-essiv:sha3-256", 512, 512, false, 0),
    ("cast5-cbc-essiv:md4", 128, 512, false, 0),
    ("blowfish-cbc-essiv:wp384", 256, 512, false, 0),
];

/// Bytes of each plain case.
const PLAIN_LEN: usize = 16 << 10;
/// Each plain case's region on the disk, in 512-byte sectors.
const REGION: u64 = 64;

/// LUKS cases: (name, luksFormat options).
const LUKS: &[(&str, &[&str])] = &[
    ("luks1-serpent-xts", &["--type", "luks1", "--cipher", "serpent-xts-plain64", "--key-size", "512"]),
    ("luks2-twofish-xts-4k", &["--cipher", "twofish-xts-plain64", "--sector-size", "4096"]),
    ("luks1-aes-lrw-benbi", &["--type", "luks1", "--cipher", "aes-lrw-benbi", "--key-size", "384"]),
    ("luks2-camellia-cbc-essiv", &["--cipher", "camellia-cbc-essiv:sha256", "--key-size", "256"]),
    ("luks1-cast5-cbc", &["--type", "luks1", "--cipher", "cast5-cbc-plain64", "--key-size", "128"]),
    ("luks2-blowfish-cbc", &["--cipher", "blowfish-cbc-plain64", "--key-size", "256"]),
    ("luks1-des3-cbc", &["--type", "luks1", "--cipher", "des3_ede-cbc-plain64", "--key-size", "192"]),
    ("luks2-cast6-xts", &["--cipher", "cast6-xts-plain64", "--key-size", "512"]),
];

const LUKS_SIZE: u64 = 24 << 20;

#[test]
#[ignore = "boots Linux under qemu (kernel-run), ~2 min"]
fn sealdisk_cipher_volumes_open_in_the_kernel() {
    let Some(kr) = common::kernel_run() else { return };
    let dir = tempfile::tempdir().unwrap();

    // Plain dm-crypt: every case in its own region of one disk.
    let plain_img = dir.path().join("plain.img");
    let mut disk = vec![0u8; (2048 + REGION * PLAIN.len() as u64) as usize * 512];
    let mut plain_txt = String::new();
    let mut plain_want = Vec::new();
    for (i, &(spec, bits, ss, ivl, ivo)) in PLAIN.iter().enumerate() {
        let key = pattern(bits / 8, 1000 + i as u32);
        let data = pattern(PLAIN_LEN, 2000 + i as u32);
        let parsed: CipherSpec = spec.parse().unwrap_or_else(|e| panic!("{spec}: {e}"));
        let params = SectorParams { sector_size: ss, iv_offset: ivo, iv_large_sectors: ivl };
        let c = SectorCipher::new(&parsed, &VolumeKey::new(key.clone()), params)
            .unwrap_or_else(|e| panic!("{spec}: {e}"));
        let mut ct = data.clone();
        c.encrypt(0, &mut ct).unwrap();
        let off = 2048 + REGION * i as u64;
        disk[off as usize * 512..][..PLAIN_LEN].copy_from_slice(&ct);
        let name = format!("p{i}");
        plain_txt += &format!(
            "{name}|{spec}|{}|{ivo}|{off}|{}|{ss}|{}\n",
            hex::encode(&key),
            PLAIN_LEN / 512,
            u8::from(ivl)
        );
        plain_want.push((name, spec, sha_hex(&data)));
    }
    std::fs::write(&plain_img, &disk).unwrap();
    std::fs::write(dir.path().join("plain.txt"), &plain_txt).unwrap();

    // LUKS: formatted and written by sealdisk.
    let pass = dir.path().join("pass");
    std::fs::write(&pass, b"kernel interop").unwrap();
    std::fs::write(dir.path().join("pass2"), b"added by the kernel").unwrap();
    let pattern_k = pattern(1 << 20, 0x4b);
    std::fs::write(dir.path().join("pattern-K"), &pattern_k).unwrap();
    let mut cases_txt = String::new();
    let mut disks = vec![plain_img];
    let mut luks_want = Vec::new();
    for (i, (name, opts)) in LUKS.iter().enumerate() {
        let img = dir.path().join(format!("{name}.img"));
        std::fs::File::create(&img).unwrap().set_len(LUKS_SIZE).unwrap();
        let path = img.to_str().unwrap().to_owned();
        let mut args = vec!["luksFormat", "-q", "--key-file", pass.to_str().unwrap()];
        args.extend_from_slice(if opts.contains(&"luks1") { FAST_PBKDF2 } else { FAST_ARGON2ID });
        args.extend_from_slice(opts);
        args.push(&path);
        let out = Command::new(bin()).args(&args).output().unwrap();
        assert!(out.status.success(), "{name}: {}", String::from_utf8_lossy(&out.stderr));
        let data = pattern(2 << 20, 3000 + i as u32);
        let opened =
            volume::luks::open(&OpenParams::new(&path), &Passphrase::new(b"kernel interop".to_vec()))
                .unwrap();
        opened.volume.device.write_at(0, &data, WriteFlags::empty()).unwrap();
        opened.volume.device.flush().unwrap();
        drop(opened);
        cases_txt += &format!("{name}|/dev/vd{}|/kr/pass\n", (b'b' + i as u8) as char);
        disks.push(img);
        luks_want.push((*name, path, sha_hex(&data)));
    }
    std::fs::write(dir.path().join("cases.txt"), &cases_txt).unwrap();

    let testdata = PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../../testdata");
    let script = testdata.join("dm-crypt-ciphers/ciphers-to-kernel.sh");
    let mut files: Vec<PathBuf> =
        ["plain.txt", "cases.txt", "pattern-K", "pass", "pass2"].iter().map(|f| dir.path().join(f)).collect();
    files.push(testdata.join("luks/sealdisk-to-kernel.sh"));
    let log = common::boot_kernel(&kr, &files, &disks, &script);
    let sha = common::tagged_lines(&log, "SHA");

    let mut failures = Vec::new();
    for (name, spec, want) in &plain_want {
        match sha.get(name.as_str()) {
            Some(got) if got == want => println!("PASS plain {spec}"),
            Some(_) => failures.push(format!("plain {spec}: the kernel reads different data")),
            None => failures.push(format!("plain {spec}: not read by the kernel (refused?)")),
        }
    }
    let flagged = |key: &str| -> Vec<&str> { log.lines().filter_map(|l| l.strip_prefix(key)).collect() };
    let (wrote, added) = (flagged("WROTE "), flagged("ADDED "));
    for (name, path, want) in luks_want {
        if sha.get(name) != Some(&want) {
            failures.push(format!("{name}: the kernel reads different data (or could not open)"));
            continue;
        }
        if !wrote.contains(&name) || !added.contains(&name) {
            failures.push(format!("{name}: the kernel did not write or add a keyslot"));
            continue;
        }
        // sealdisk opens the keyslot the kernel's cryptsetup made and reads the kernel's write.
        let opened =
            volume::luks::open(&OpenParams::new(&path), &Passphrase::new(b"added by the kernel".to_vec()));
        match opened {
            Err(e) => failures.push(format!("{name}: sealdisk cannot open the kernel-added keyslot: {e}")),
            Ok(opened) => {
                let mut back = vec![0u8; 1 << 20];
                opened.volume.device.read_at(2 << 20, &mut back).unwrap();
                if back == pattern_k {
                    println!("PASS {name}");
                } else {
                    failures.push(format!("{name}: sealdisk reads the kernel's write differently"));
                }
            }
        }
    }
    assert!(failures.is_empty(), "{}\n--- guest log ---\n{log}", failures.join("\n"));
}
