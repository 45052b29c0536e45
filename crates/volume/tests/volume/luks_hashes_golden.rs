//! LUKS1 and LUKS2 volumes made by the real cryptsetup (2.6.1, OpenSSL 3 backend) with every
//! `--hash` it accepts (`testdata/luks-hashes/make.sh`): the hash drives the keyslot's
//! PBKDF2, the AF splitter and the volume-key digest. sealdisk opens each with the
//! passphrase, recovers exactly the volume key given to cryptsetup, and reads the pattern
//! that was encrypted under it; a wrong passphrase is refused. The hash-name lists of
//! `formats` (LUKS1 header check) and `sector_crypto` agree.

use std::path::{Path, PathBuf};
use std::process::Command;

use blockdev::BlockDevice;
use sector_crypto::hash::HashAlg;
use sector_crypto::kdf::Passphrase;
use volume::luks::{self, OpenParams};

fn dir() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("../../testdata/luks-hashes")
}

/// The hashes of the committed images; LUKS1 images exist for those with 20+ byte digests.
const HASHES: &[&str] = &[
    "sha1",
    "sha224",
    "sha256",
    "sha384",
    "sha512",
    "sha512-224",
    "sha512-256",
    "sha3-224",
    "sha3-256",
    "sha3-384",
    "sha3-512",
    "ripemd160",
    "whirlpool",
    "sm3",
    "blake2b-512",
    "blake2s-256",
    "md5",
    "md4",
];

/// The image decompressed into `tmp`, or `None` (skipped loudly) without xz.
fn image(tmp: &Path, name: &str) -> Option<PathBuf> {
    let out = match Command::new("xz").arg("-dc").arg(dir().join(format!("{name}.img.xz"))).output() {
        Ok(o) if o.status.success() => o.stdout,
        Ok(o) => panic!("xz -dc {name}: {}", String::from_utf8_lossy(&o.stderr)),
        Err(e) => {
            eprintln!("SKIPPED: cannot run xz ({e})");
            return None;
        }
    };
    let p = tmp.join(format!("{name}.img"));
    std::fs::write(&p, out).unwrap();
    Some(p)
}

#[test]
fn cryptsetup_made_volumes_open_with_every_hash() {
    let tmp = tempfile::tempdir().unwrap();
    let pass = Passphrase::new(std::fs::read(dir().join("pass.txt")).unwrap());
    let vk = std::fs::read(dir().join("vk16.bin")).unwrap();
    let pattern = std::fs::read(dir().join("pattern.bin")).unwrap();
    let mut opened_count = 0;
    for &h in HASHES {
        let alg: HashAlg = h.parse().unwrap();
        for version in ["luks1", "luks2"] {
            let name = format!("{version}-{h}");
            if version == "luks1" && !alg.luks1_allowed() {
                assert!(!dir().join(format!("{name}.img.xz")).exists(), "{name}: cryptsetup refuses it");
                continue;
            }
            let Some(img) = image(tmp.path(), &name) else { return };
            let p = OpenParams::new(img.to_str().unwrap());
            let opened = luks::open(&p, &pass).unwrap_or_else(|e| panic!("{name}: {e:?}"));
            assert_eq!(&opened.volume.crypt_table().unwrap().key[..], &vk[..], "{name}: volume key");
            let mut back = vec![0u8; pattern.len()];
            opened.volume.device.read_at(0, &mut back).unwrap_or_else(|e| panic!("{name}: {e}"));
            assert!(back == pattern, "{name}: the pattern cryptsetup's key encrypted differs");
            drop(opened);
            let wrong = Passphrase::new(b"not the passphrase".to_vec());
            assert!(luks::open(&p, &wrong).is_err(), "{name}: a wrong passphrase opened it");
            opened_count += 1;
        }
    }
    assert_eq!(opened_count, 2 * HASHES.len() - 2);
}

#[test]
fn luks1_hash_names_agree_with_the_hash_enum() {
    let mut ours: Vec<&str> =
        HashAlg::ALL.iter().filter(|h| h.luks1_allowed()).flat_map(|h| h.names().iter().copied()).collect();
    let mut formats: Vec<&str> = formats::luks1::LUKS1_HASHES.to_vec();
    ours.sort_unstable();
    formats.sort_unstable();
    assert_eq!(ours, formats);
}
