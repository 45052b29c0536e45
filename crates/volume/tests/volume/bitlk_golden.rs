//! BitLocker volumes made by Windows 10 (testdata/bitlk, from dissect.fve's test suite; see
//! testdata/bitlk/README.md for origin and licence): every protector the images have
//! (password, recovery password, startup key .BEK files), every cipher (AES-XTS 128/256,
//! AES-CBC 128, AES-CBC + Elephant diffuser 128/256). Each opens to an NTFS volume: the
//! boot sector (moved by BitLocker and mapped back at sector 0) says `NTFS    `, and the
//! MFT record at 0x2000 starts with `FILE0`. The volume keys are those `cryptsetup
//! bitlkDump --dump-volume-key` (2.6.1) prints for the same images.
//! Bad input: wrong password, wrong recovery password, a foreign .BEK, damaged metadata,
//! truncated images.

use std::path::{Path, PathBuf};
use std::process::Command;
use std::sync::Arc;

use blockdev::{BlockDevice, MemDevice, WriteFlags};
use sector_crypto::kdf::Passphrase;
use volume::bitlk::{self, BitlkKey, BitlkVolumeError};
use volume::{ErrorKind, OpenOptions, Spec, Storage, VolumeError, VolumeKind};
use zeroize::Zeroizing;

const PASSWORD: &str = "password12!@";
const RECOVERY: &str = "284867-596541-514998-422114-660297-261613-215424-199408";

fn dir() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("../../testdata/bitlk")
}

fn image(name: &str) -> Option<Vec<u8>> {
    match Command::new("xz").arg("-dc").arg(dir().join(format!("{name}.img.xz"))).output() {
        Ok(o) if o.status.success() => Some(o.stdout),
        Ok(o) => panic!("xz -dc {name}: {}", String::from_utf8_lossy(&o.stderr)),
        Err(e) => {
            eprintln!("SKIPPED: cannot run xz ({e})");
            None
        }
    }
}

fn storage(bytes: Vec<u8>) -> Storage {
    let dev = MemDevice::from_vec(bytes, 512);
    Storage::new(Arc::new(dev), "bitlk.img")
}

fn open(bytes: Vec<u8>, key: BitlkKey, read_only: bool) -> Result<volume::Volume, VolumeError> {
    let opts = OpenOptions { read_only, ..OpenOptions::default() };
    volume::open_storage(storage(bytes), Spec::Bitlk, key.into(), &opts)
}

fn pass(p: &str) -> BitlkKey {
    BitlkKey::Passphrase(Passphrase::new(p.as_bytes().to_vec()))
}

fn assert_ntfs(v: &volume::Volume) {
    let mut s = vec![0u8; 512];
    v.device.read_at(0, &mut s).unwrap();
    assert_eq!(&s[3..11], b"NTFS    ", "boot sector");
    assert_eq!(&s[510..512], &[0x55, 0xaa]);
    v.device.read_at(0x2000, &mut s).unwrap();
    assert_eq!(&s[..8], b"FILE0\x00\x03\x00", "MFT record");
}

#[test]
fn windows_volumes_open_with_the_password_every_cipher() {
    // (image, dm cipher, key bits, the volume key cryptsetup dumps or its first bytes)
    let cases = [
        (
            "aes-xts_128",
            "aes-xts-plain64",
            256,
            "4eb949c473f0edfc379ad041670ddb9c4da0abdb4482a2c8bb47250493aa1ed5",
        ),
        ("aes-xts_256", "aes-xts-plain64", 512, "c74002df41f5eade"),
        ("aes_128", "aes-cbc-eboiv", 128, "84c3a3157e5f21dee140005220bc940e"),
        (
            "aes_128_diffuser",
            "aes-cbc-elephant",
            256,
            "10730f695df62a49cd3aa1b1c9ae3edf268af0e0613921085edc89e1b804de35",
        ),
        ("aes_256_diffuser", "aes-cbc-elephant", 512, "3a600625f8fd5cc5"),
    ];
    for (name, cipher, bits, key) in cases {
        let Some(bytes) = image(name) else { return };
        let v = open(bytes, pass(PASSWORD), true).unwrap_or_else(|e| panic!("{name}: {e:?}"));
        assert_eq!(v.kind, VolumeKind::Bitlk);
        let t = v.crypt_table().unwrap();
        assert_eq!(t.cipher, cipher, "{name}");
        assert_eq!(t.key.len() * 8, bits, "{name}");
        assert!(hex::encode(&t.key[..]).starts_with(key), "{name}: volume key");
        assert_ntfs(&v);
    }
}

#[test]
fn recovery_password_and_startup_keys_open() {
    let Some(bytes) = image("recovery_password") else { return };
    let v = open(bytes.clone(), pass(RECOVERY), true).unwrap();
    assert_ntfs(&v);
    // Without dashes too (cryptsetup takes it as the passphrase either way).
    let v = open(bytes, pass(&RECOVERY.replace('-', "")), true).unwrap();
    assert_ntfs(&v);

    for name in ["startup_key", "recovery_key"] {
        let Some(bytes) = image(name) else { return };
        let bek = std::fs::read(dir().join(format!("{name}.bek"))).unwrap();
        let v = open(bytes, BitlkKey::KeyFile(Zeroizing::new(bek)), true).unwrap();
        assert_ntfs(&v);
    }
    let Some(bytes) = image("startup_key") else { return };
    let v = open(bytes, pass(PASSWORD), true).unwrap();
    let t = v.crypt_table().unwrap();
    assert_eq!(hex::encode(&t.key[..]), "f6cca5e88e1a356b877103b8c7d96b9c2cffc2338e40d144aef48bd8081d26f7");
}

fn wrong_key(r: Result<volume::Volume, VolumeError>) {
    match r {
        Err(e @ VolumeError::Bitlk { source: BitlkVolumeError::WrongKey { .. }, .. }) => {
            assert_eq!(e.kind(), ErrorKind::WrongKey)
        }
        other => panic!("expected a wrong-key error, got {other:?}"),
    }
}

#[test]
fn wrong_password_recovery_password_and_bek_are_refused() {
    let Some(bytes) = image("recovery_password") else { return };
    wrong_key(open(bytes.clone(), pass("password12!"), true));
    // A well-formed recovery password that is not this volume's.
    wrong_key(open(bytes.clone(), pass("284867-596541-514998-422114-660297-261613-215424-199419"), true));
    let Some(sk) = image("startup_key") else { return };
    let other = std::fs::read(dir().join("recovery_key.bek")).unwrap();
    wrong_key(open(sk, BitlkKey::KeyFile(Zeroizing::new(other)), true));
}

#[test]
fn metadata_regions_read_as_zeroes_and_refuse_writes() {
    let Some(bytes) = image("aes-xts_128") else { return };
    let b = bitlk::load(&MemDevice::from_vec(bytes.clone(), 512)).unwrap();
    let m = &b.metadata;
    assert_eq!(m.metadata_offsets, [35586048, 43278336, 50966528]);
    assert_eq!((m.volume_header_offset, m.volume_header_size), (35651584, 8192));
    let v = open(bytes, pass(PASSWORD), false).unwrap();
    let mut s = vec![0xffu8; 4096];
    v.device.read_at(m.metadata_offsets[1], &mut s).unwrap();
    assert!(s.iter().all(|&x| x == 0));
    v.device.read_at(m.volume_header_offset, &mut s).unwrap();
    assert!(s.iter().all(|&x| x == 0));
    assert!(v.device.write_at(m.metadata_offsets[0], &s, WriteFlags::empty()).is_err());
    assert!(v.device.write_at(m.volume_header_offset - 512, &s, WriteFlags::empty()).is_err());
    // Elsewhere writes go through and read back.
    let data = vec![0x5au8; 4096];
    v.device.write_at(1 << 20, &data, WriteFlags::empty()).unwrap();
    v.device.read_at(1 << 20, &mut s).unwrap();
    assert_eq!(s, data);
    // And the boot sector, which lives at the volume header offset on the storage.
    let mut boot = vec![0u8; 512];
    v.device.read_at(0, &mut boot).unwrap();
    v.device.write_at(0, &boot, WriteFlags::empty()).unwrap();
    assert_ntfs(&v);
}

#[test]
fn damaged_metadata_falls_back_then_fails_clearly() {
    let Some(bytes) = image("aes-xts_128") else { return };
    let offs = [35586048usize, 43278336, 50966528];
    // One copy's signature broken: the next copy is used.
    let mut one = bytes.clone();
    one[offs[0]] ^= 0xff;
    assert_ntfs(&open(one, pass(PASSWORD), true).unwrap());
    // All three broken: no valid metadata.
    let mut all = bytes.clone();
    for o in offs {
        all[o + 64] = 0xff; // metadata size field
        all[o + 65] = 0xff;
    }
    let e = open(all, pass(PASSWORD), true).unwrap_err();
    assert!(matches!(e, VolumeError::Bitlk { source: BitlkVolumeError::NoValidMetadata(_), .. }), "{e:?}");
    assert_eq!(e.kind(), ErrorKind::Corrupt);
    // The encrypted FVEK damaged in every copy: the VMK opens, the FVEK fails its CCM tag.
    let b = bitlk::load(&MemDevice::from_vec(bytes.clone(), 512)).unwrap();
    let fvek = &b.metadata.fvek.data;
    let mut bad = bytes.clone();
    for o in offs {
        let block = &bad[o..o + 65536];
        let at = block.windows(fvek.len()).position(|w| w == &fvek[..]).unwrap();
        bad[o + at + 3] ^= 1;
    }
    let e = open(bad, pass(PASSWORD), true).unwrap_err();
    assert!(matches!(e, VolumeError::Bitlk { source: BitlkVolumeError::Fvek(_), .. }), "{e:?}");
    assert_eq!(e.kind(), ErrorKind::Corrupt);
    // A volume Windows is still encrypting (state 2 in the metadata): refused as unsupported.
    let mut partial = bytes.clone();
    for o in offs {
        partial[o + 12] = 2;
    }
    let e = open(partial, pass(PASSWORD), true).unwrap_err();
    assert_eq!(e.kind(), ErrorKind::Unsupported, "{e:?}");
    // Decrypted (encryption method 0): cryptsetup's "Unknown or unsupported encryption type."
    let mut clear = bytes.clone();
    for o in offs {
        clear[o + 64 + 36] = 0;
        clear[o + 64 + 37] = 0;
    }
    let e = open(clear, pass(PASSWORD), true).unwrap_err();
    assert_eq!(e.kind(), ErrorKind::Unsupported, "{e:?}");
    // Not BitLocker at all.
    let e = open(vec![0u8; 1 << 20], pass(PASSWORD), true).unwrap_err();
    assert_eq!(e.kind(), ErrorKind::Usage, "{e:?}");
}

#[test]
fn truncated_images_are_refused_without_panic() {
    let Some(bytes) = image("aes-xts_128") else { return };
    for len in [0usize, 512, 4096, 35586048 + 4096, 43278336 + 65536, bytes.len() - 512] {
        let r = open(bytes[..len].to_vec(), pass("x"), true);
        let e = r.err().unwrap_or_else(|| panic!("truncated to {len} opened"));
        assert!(
            matches!(e.kind(), ErrorKind::Corrupt | ErrorKind::WrongKey | ErrorKind::Usage),
            "{len}: {e:?}"
        );
    }
}
