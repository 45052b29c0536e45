//! Data sealdisk writes into TrueCrypt/VeraCrypt volumes, read by the real kernel (Linux 6.1
//! dm-crypt through cryptsetup 2.6.1 `open --type tcrypt`, under the kernel oracle, one
//! boot): a three-cipher TrueCrypt cascade (tcplay's header), a VeraCrypt hidden volume
//! opened with a keyfile and a PIM, and VeraCrypt system encryption of a whole-disk image
//! (make-veracrypt.py's headers); and old TrueCrypt's legacy chains, whose headers a helper
//! here writes (no tool makes them any more): `lrw-benbi` single and cascaded, `cbc-tcw`.
//! The other direction (the kernel writes, sealdisk reads,
//! and every layer's table equals the kernel's) is `volume`'s tcrypt_golden test.
//!
//! Guest script: testdata/tcrypt/sealdisk-to-kernel.sh. Boots a kernel (~1 min under TCG):
//! `cargo test -p sealdisk --test cli tcrypt_kernel:: -- --ignored`.

use crate::common;

use std::path::{Path, PathBuf};
use std::process::Command;

use blockdev::{BlockDevice, WriteFlags};
use common::{pattern, sha_hex};
use formats::tcrypt::{find_chain, ChainMode, HeaderFlags, Magic, TcryptHeader, KEYS_LEN};
use sector_crypto::kdf::{HashAlg, Passphrase};
use sector_crypto::{SectorCipher, SectorParams, VolumeKey};
use volume::tcrypt::TcryptSpec;
use volume::{OnePassphrase, OpenOptions, Spec, StorageOptions};

fn testdata() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("../../testdata/tcrypt")
}

struct Case {
    image: &'static str,
    pass: &'static str,
    keyfile: bool,
    flags: HeaderFlags,
    pim: Option<u32>,
    hash: &'static str,
    /// cryptsetup's options, commas for spaces.
    opts: &'static str,
}

const CASES: &[Case] = &[
    Case {
        image: "tc-serpent-twofish-aes",
        pass: "sealdisk-tc2",
        keyfile: false,
        flags: HeaderFlags { hidden: false, system: false, backup: false },
        pim: None,
        hash: "sha512",
        opts: "--hash,sha512",
    },
    Case {
        image: "vc-keyfile-hidden",
        pass: "sealdisk-vc2-hidden",
        keyfile: true,
        flags: HeaderFlags { hidden: true, system: false, backup: false },
        pim: Some(1),
        hash: "sha512",
        opts: "--hash,sha512,--veracrypt-pim,1,-d,/kr/keyfile1,--tcrypt-hidden",
    },
    Case {
        image: "vc-system",
        pass: "sealdisk-vc3",
        keyfile: false,
        flags: HeaderFlags { hidden: false, system: true, backup: false },
        pim: Some(2),
        hash: "sha256",
        opts: "--hash,sha256,--veracrypt-pim,2,--tcrypt-system",
    },
];

/// Where sealdisk writes in each volume, bytes.
const OFFSET: u64 = 128 << 10;
const LEN: usize = 256 << 10;

/// A legacy TrueCrypt volume: chain `name` in `mode`, header version 2 at 0, data from
/// sector 1 to the end, PBKDF2-RIPEMD160 2000 (the first KDF cryptsetup tries).
struct Legacy {
    image: &'static str,
    chain: &'static str,
    mode: ChainMode,
}

const LEGACY: &[Legacy] = &[
    Legacy { image: "legacy-aes-lrw", chain: "aes", mode: ChainMode::Lrw },
    Legacy { image: "legacy-serpent-twofish-aes-lrw", chain: "serpent-twofish-aes", mode: ChainMode::Lrw },
    Legacy { image: "legacy-aes-cbc-tcw", chain: "aes", mode: ChainMode::CbcTcw },
    Legacy { image: "legacy-cast5-cbc-tcw", chain: "cast5", mode: ChainMode::CbcTcw },
];

const LEGACY_PASS: &str = "sealdisk-legacy";
const LEGACY_SIZE: u64 = 2 << 20;

fn cipher(spec: &str, key: &[u8]) -> SectorCipher {
    let params = SectorParams { sector_size: 512, iv_offset: 0, iv_large_sectors: false };
    SectorCipher::new(&spec.parse().unwrap(), &VolumeKey::from_slice(key), params).unwrap()
}

/// Writes a legacy TrueCrypt header encrypted as old TrueCrypt did (the inverse of
/// cryptsetup's `TCRYPT_decrypt_hdr`): LRW with block index 1, first cipher first; CBC with
/// the IV from the key material, then the 8-byte whitening.
fn write_legacy(path: &Path, l: &Legacy, seed: u32) {
    let chain = find_chain(l.chain, l.mode).unwrap();
    let mut keys = zeroize::Zeroizing::new([0u8; KEYS_LEN]);
    keys.copy_from_slice(&pattern(KEYS_LEN, seed));
    let h = TcryptHeader {
        magic: Magic::TrueCrypt,
        version: 2,
        version_tc: 0x0410,
        keys_crc32: 0,
        hidden_volume_size: 0,
        volume_size: LEGACY_SIZE - 512,
        mk_offset: 512,
        mk_size: LEGACY_SIZE - 512,
        flags: 0,
        sector_size: 512,
        header_crc32: 0,
        keys,
    };
    let salt = pattern(64, seed + 1);
    let mut key = [0u8; 192];
    HashAlg::Ripemd160.pbkdf2(LEGACY_PASS.as_bytes(), &salt, 2000, &mut key).unwrap();
    let mut buf = [0u8; 512];
    buf[..448].copy_from_slice(&h.encode()[..]);
    match l.mode {
        ChainMode::Lrw => {
            for c in chain.ciphers {
                let k = c.layer_key(l.mode, &key).unwrap();
                cipher(&format!("{}-lrw-benbi", c.name), &k).encrypt(0, &mut buf).unwrap();
            }
        }
        ChainMode::CbcTcw => {
            let c = &chain.ciphers[0];
            for (b, iv) in buf.iter_mut().zip(&key[c.iv_offset..c.iv_offset + c.iv_size]) {
                *b ^= iv;
            }
            let ck = &key[c.key_offset..c.key_offset + c.key_size];
            cipher(&format!("{}-cbc-null", c.name), ck).encrypt(0, &mut buf).unwrap();
            for (i, b) in buf[..448].iter_mut().enumerate() {
                *b ^= key[8 + i % 8];
            }
        }
        other => panic!("{other:?}"),
    }
    let mut img = vec![0u8; LEGACY_SIZE as usize];
    img[..64].copy_from_slice(&salt);
    img[64..512].copy_from_slice(&buf[..448]);
    std::fs::write(path, img).unwrap();
}

#[test]
#[ignore = "boots Linux under qemu (kernel-run), ~1 min"]
fn sealdisk_writes_to_tcrypt_volumes_read_back_in_the_kernel() {
    let Some(kr) = common::kernel_run() else { return };
    let dir = tempfile::tempdir().unwrap();
    let mut disks = Vec::new();
    let mut cases = String::new();
    let mut expected = Vec::new();
    for (i, c) in CASES.iter().enumerate() {
        let img = dir.path().join(format!("{}.img", c.image));
        let xz = Command::new("xz").arg("-dc").arg(testdata().join(format!("{}.img.xz", c.image))).output();
        let Ok(xz) = xz.map_err(|e| eprintln!("SKIPPED: xz: {e}")) else { return };
        std::fs::write(&img, xz.stdout).unwrap();
        let p = Passphrase::new(c.pass.as_bytes().to_vec());
        let mut src = OnePassphrase::new(&p);
        let mut keyfiles = Vec::new();
        if c.keyfile {
            keyfiles = vec![Passphrase::new(std::fs::read(testdata().join("keyfile1")).unwrap())];
        }
        let spec =
            TcryptSpec { flags: c.flags, pim: c.pim, hash: Some(c.hash.to_owned()), ..TcryptSpec::default() };
        let keys = volume::Keys::passphrase(&mut src).with_keyfiles(keyfiles);
        let storage = volume::storage::open(img.to_str().unwrap(), &StorageOptions::default()).unwrap();
        let vol = volume::open_storage(storage, Spec::Tcrypt(spec), keys, &OpenOptions::default()).unwrap();
        let data = pattern(LEN, 0x7c + i as u32);
        vol.device.write_at(OFFSET, &data, WriteFlags::empty()).unwrap();
        vol.device.flush().unwrap();
        drop(vol);
        let dev = format!("/dev/vd{}", (b'a' + i as u8) as char);
        cases += &format!("{}|{dev}|{}|{}|{OFFSET}|{LEN}\n", c.image, c.pass, c.opts);
        disks.push(img);
        expected.push((c.image, sha_hex(&data)));
    }
    for (j, l) in LEGACY.iter().enumerate() {
        let i = CASES.len() + j;
        let img = dir.path().join(format!("{}.img", l.image));
        write_legacy(&img, l, 0x100 + j as u32);
        let p = Passphrase::new(LEGACY_PASS.as_bytes().to_vec());
        let mut src = OnePassphrase::new(&p);
        let spec = TcryptSpec { hash: Some("ripemd160".into()), ..TcryptSpec::default() };
        let storage = volume::storage::open(img.to_str().unwrap(), &StorageOptions::default()).unwrap();
        let keys = volume::Keys::passphrase(&mut src);
        let vol = volume::open_storage(storage, Spec::Tcrypt(spec), keys, &OpenOptions::default()).unwrap();
        assert_eq!(vol.layers.len(), find_chain(l.chain, l.mode).unwrap().ciphers.len());
        let data = pattern(LEN, 0x7c + i as u32);
        vol.device.write_at(OFFSET, &data, WriteFlags::empty()).unwrap();
        vol.device.flush().unwrap();
        drop(vol);
        let dev = format!("/dev/vd{}", (b'a' + i as u8) as char);
        cases += &format!("{}|{dev}|{LEGACY_PASS}|--hash,ripemd160|{OFFSET}|{LEN}\n", l.image);
        disks.push(img);
        expected.push((l.image, sha_hex(&data)));
    }
    std::fs::write(dir.path().join("cases.txt"), &cases).unwrap();
    let files = [dir.path().join("cases.txt"), testdata().join("keyfile1")];
    let log = common::boot_kernel(&kr, &files, &disks, &testdata().join("sealdisk-to-kernel.sh"));
    assert!(!log.contains("FAILED"), "{log}");
    let sha = common::tagged_lines(&log, "SHA");
    for (name, want) in expected {
        assert_eq!(sha.get(name), Some(&want), "{name}: the kernel reads different data\n{log}");
    }
}
