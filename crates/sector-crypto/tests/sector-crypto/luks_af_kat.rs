//! AF splitter and PBKDF2 known answers from cryptsetup-made LUKS1 keyslots
//! (testdata/luks/make-af-kat.sh): PBKDF2(passphrase, keyslot salt) → decrypt keyslot 0's
//! material with the header cipher (512-byte sectors, IVs from 0) → AF merge must give the
//! volume key cryptsetup printed, and PBKDF2 of that key must give the header's digest.

use std::path::{Path, PathBuf};

use sector_crypto::af;
use sector_crypto::kdf::{pbkdf2, HashAlg};
use sector_crypto::{CipherSpec, SectorCipher, SectorParams, VolumeKey};

fn testdata(name: &str) -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("../../testdata/luks").join(name)
}

fn text(b: &[u8], off: usize, len: usize) -> String {
    let f = &b[off..off + len];
    String::from_utf8(f[..f.iter().position(|&c| c == 0).unwrap_or(len)].to_vec()).unwrap()
}

fn be32(b: &[u8], off: usize) -> u32 {
    u32::from_be_bytes(b[off..off + 4].try_into().unwrap())
}

/// Recovers keyslot 0's volume key by hand, from the LUKS1 phdr layout (FACTS.md §3.2).
fn recover(image: &str, pass: &[u8]) -> (Vec<u8>, bool) {
    let img = std::fs::read(testdata(image)).unwrap();
    let cipher = format!("{}-{}", text(&img, 8, 32), text(&img, 40, 32));
    let hash: HashAlg = text(&img, 72, 32).parse().unwrap();
    let key_bytes = be32(&img, 108) as usize;
    let (mk_digest, mk_salt, mk_iter) = (&img[112..132], &img[132..164], be32(&img, 164));
    let slot = 208;
    assert_eq!(be32(&img, slot), 0x00AC_71F3, "keyslot 0 enabled");
    let (iterations, salt) = (be32(&img, slot + 4), &img[slot + 8..slot + 40]);
    let (offset, stripes) = (be32(&img, slot + 40) as usize * 512, be32(&img, slot + 44));
    let mut area_key = vec![0u8; key_bytes];
    pbkdf2(hash, pass, salt, iterations, &mut area_key).unwrap();
    let spec: CipherSpec = cipher.parse().unwrap();
    let params = SectorParams { sector_size: 512, iv_offset: 0, iv_large_sectors: false };
    let c = SectorCipher::new(&spec, &VolumeKey::new(area_key), params).unwrap();
    let len = af::split_sectors(key_bytes, stripes) * 512;
    let mut material = img[offset..offset + len].to_vec();
    c.decrypt(0, &mut material).unwrap();
    let vk = af::merge(&material, key_bytes, stripes, hash).unwrap();
    let mut d = [0u8; 20];
    pbkdf2(hash, &vk, mk_salt, mk_iter, &mut d).unwrap();
    (vk.to_vec(), d == mk_digest)
}

fn expected(key_file: &str) -> Vec<u8> {
    hex::decode(std::fs::read_to_string(testdata(key_file)).unwrap().trim()).unwrap()
}

#[test]
fn af_merge_matches_cryptsetup_sha1_32_byte_key() {
    let (vk, digest_ok) = recover("af-sha1-cbc256.img", b"sealdisk-af");
    assert_eq!(vk, expected("af-sha1-cbc256.key"));
    assert!(digest_ok);
}

#[test]
fn af_merge_matches_cryptsetup_sha512_16_byte_key() {
    let (vk, digest_ok) = recover("af-sha512-cbc128.img", b"sealdisk-af");
    assert_eq!(vk, expected("af-sha512-cbc128.key"));
    assert!(digest_ok);
}

#[test]
fn af_merge_matches_cryptsetup_sha256_64_byte_key() {
    let (vk, digest_ok) = recover("af-sha256-xts512.img", b"sealdisk-af");
    assert_eq!(vk, expected("af-sha256-xts512.key"));
    assert!(digest_ok);
}

#[test]
fn wrong_passphrase_gives_a_key_that_fails_the_digest() {
    let (vk, digest_ok) = recover("af-sha1-cbc256.img", b"not-the-passphrase");
    assert_ne!(vk, expected("af-sha1-cbc256.key"));
    assert!(!digest_ok);
}
