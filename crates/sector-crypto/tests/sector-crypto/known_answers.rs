//! Known-answer tests through the public API: IEEE P1619 XTS vectors as dm-crypt sectors, and
//! the kernel's IV definitions pinned on hand-picked sectors.

use crate::common;

use common::reference::{self, pattern};
use common::vectors::*;
use sector_crypto::{CipherSpec, IvMode, Provider, SectorCipher, SectorParams, VolumeKey};

fn h(s: &str) -> Vec<u8> {
    hex::decode(s).unwrap()
}

fn cipher(spec: &str, key: &[u8], sector_size: u32, iv_offset: u64, large: bool) -> SectorCipher {
    let spec: CipherSpec = spec.parse().unwrap();
    let p = SectorParams { sector_size, iv_offset, iv_large_sectors: large };
    SectorCipher::new(&spec, &VolumeKey::new(key.to_vec()), p).unwrap()
}

fn pt512() -> Vec<u8> {
    (0..512).map(|i| i as u8).collect()
}

/// IEEE P1619 vector 4 is dm-crypt `aes-xts-plain64` (256-bit key) at sector 0.
#[test]
fn ieee1619_vector4_is_aes_xts_plain64_sector_0() {
    for spec in ["aes-xts-plain64", "aes-xts-plain", "capi:xts(aes)-plain64", "aes-xts-null"] {
        let c = cipher(spec, &h(IEEE1619_V4_KEY), 512, 0, false);
        let mut buf = pt512();
        c.encrypt(0, &mut buf).unwrap();
        assert_eq!(hex::encode(&buf), IEEE1619_V4_CT.replace('\n', ""), "{spec}");
        c.decrypt(0, &mut buf).unwrap();
        assert_eq!(buf, pt512());
    }
}

/// IEEE P1619 vector 10 (AES-256-XTS, data unit 0xff), reached four ways: sector 0xff;
/// sector 0 with iv_offset 0xff; with 4096-byte sectors in the first 512 bytes it is not
/// reachable, so only 512; and through both providers.
#[test]
fn ieee1619_vector10_via_sector_and_iv_offset() {
    let key = h(IEEE1619_V10_KEY);
    let expect = IEEE1619_V10_CT;
    for provider in [Provider::AwsLc, Provider::RustCrypto] {
        for (sector, iv_offset) in [(0xff, 0), (0, 0xff), (0x7f, 0x80)] {
            let spec: CipherSpec = "aes-xts-plain64".parse().unwrap();
            let p = SectorParams { sector_size: 512, iv_offset, iv_large_sectors: false };
            let c = SectorCipher::with_provider(&spec, &VolumeKey::new(key.clone()), p, provider).unwrap();
            let mut buf = pt512();
            c.encrypt(sector, &mut buf).unwrap();
            assert_eq!(hex::encode(&buf), expect, "{provider:?} sector {sector} iv_offset {iv_offset}");
        }
    }
    // With 1024-byte sectors and iv_large_sectors, the IV of sector 0x1fe is 0xff.
    let c = cipher("aes-xts-plain64", &key, 1024, 0, true);
    let mut buf = [pt512(), pt512()].concat();
    c.encrypt(0x1fe, &mut buf).unwrap();
    // One XTS operation over 1024 bytes: the first 512 bytes are vector 10's.
    assert_eq!(hex::encode(&buf[..512]), expect);
}

/// `plain` is the low 32 bits: sector 2^32 has the IV of sector 0; `plain64` does not.
#[test]
fn plain_wraps_at_32_bits_and_plain64_does_not() {
    let key = pattern(32, 1);
    let data = pattern(512, 2);
    let enc = |spec: &str, sector: u64| {
        let mut b = data.clone();
        cipher(spec, &key, 512, 0, false).encrypt(sector, &mut b).unwrap();
        b
    };
    assert_eq!(enc("aes-cbc-plain", 1 << 32), enc("aes-cbc-plain", 0));
    assert_eq!(enc("aes-cbc-plain", (1 << 32) + 5), enc("aes-cbc-plain", 5));
    assert_ne!(enc("aes-cbc-plain64", 1 << 32), enc("aes-cbc-plain64", 0));
    // Below the wrap plain and plain64 agree.
    assert_eq!(enc("aes-cbc-plain", 0xffff_ffff), enc("aes-cbc-plain64", 0xffff_ffff));
    // iv_offset is added before truncation: sector 0 + iv_offset 2^32 wraps to IV 0.
    let mut b = data.clone();
    cipher("aes-cbc-plain", &key, 512, 1 << 32, false).encrypt(0, &mut b).unwrap();
    assert_eq!(b, enc("aes-cbc-plain", 0));
}

/// `plain64be` puts be64(iv_sector) in the last 8 bytes: for AES-CBC with a zero first
/// plaintext block, C0 = E_K(IV), so decrypting C0 with ECB yields the IV.
#[test]
fn iv_layouts_are_visible_through_cbc() {
    let key = pattern(16, 3);
    let ecb = cipher("aes-ecb", &key, 512, 0, false);
    let first_iv = |spec: &str, sector: u64, ss: u32, large: bool| {
        let mut b = vec![0u8; ss as usize];
        cipher(spec, &key, ss, 0, large).encrypt(sector, &mut b).unwrap();
        let mut blk = b[..512].to_vec();
        ecb.decrypt(0, &mut blk).unwrap();
        hex::encode(&blk[..16])
    };
    let s = 0x0102_0304_0506_0708u64;
    assert_eq!(first_iv("aes-cbc-plain64", s, 512, false), "08070605040302010000000000000000");
    assert_eq!(first_iv("aes-cbc-plain64be", s, 512, false), "00000000000000000102030405060708");
    assert_eq!(first_iv("aes-cbc-plain", s, 512, false), "08070605000000000000000000000000");
    assert_eq!(first_iv("aes-cbc-null", s, 512, false), "00000000000000000000000000000000");
    // benbi: be64((iv_sector << 5) + 1), the 16-byte block count from 1.
    assert_eq!(first_iv("aes-cbc-benbi", 2, 512, false), "00000000000000000000000000000041");
    // iv_large_sectors: 4096-byte sectors count in 4096-byte units.
    assert_eq!(first_iv("aes-cbc-plain64", 8 * 5, 4096, true), "05000000000000000000000000000000");
    assert_eq!(first_iv("aes-cbc-plain64", 8 * 5, 4096, false), "28000000000000000000000000000000");
}

/// EBOIV is E_K(le64(iv_sector * sector_size)): a byte offset only with iv_large_sectors
/// (the kernel multiplies the 512-byte-unit sector by sector_size otherwise).
#[test]
fn eboiv_is_encrypted_iv_sector_times_sector_size() {
    let key = pattern(32, 4);
    let ecb = cipher("aes-ecb", &key, 512, 0, false);
    let iv_of = |sector: u64, ss: u32, large: bool| {
        let mut b = vec![0u8; ss as usize];
        cipher("aes-cbc-eboiv", &key, ss, 0, large).encrypt(sector, &mut b).unwrap();
        // C0 = E(IV), IV = E(offset): two ECB decryptions give the offset.
        let mut blk = b[..512].to_vec();
        ecb.decrypt(0, &mut blk).unwrap();
        ecb.decrypt(0, &mut blk).unwrap();
        u64::from_le_bytes(blk[..8].try_into().unwrap())
    };
    assert_eq!(iv_of(3, 512, false), 3 * 512);
    assert_eq!(iv_of(16, 4096, true), 2 * 4096, "byte offset of 4 KiB sector 2");
    assert_eq!(iv_of(16, 4096, false), 16 * 4096, "kernel quirk: 512-byte units times 4096");
}

/// ESSIV with a 128-bit data key still uses AES-256 keyed by SHA-256(key) for the IV.
#[test]
fn essiv_uses_aes256_salt_for_any_data_key_size() {
    for klen in [16, 24, 32] {
        let key = pattern(klen, 5);
        let c = cipher("aes-cbc-essiv:sha256", &key, 512, 0, false);
        let mut b = vec![0u8; 512];
        c.encrypt(77, &mut b).unwrap();
        let ecb = cipher("aes-ecb", &key, 512, 0, false);
        let mut blk = b.clone();
        ecb.decrypt(0, &mut blk).unwrap();
        let expect = reference::iv(
            IvMode::Essiv(sector_crypto::EssivHash::Sha256),
            sector_crypto::ChainMode::Cbc,
            &key,
            77,
            512,
        );
        assert_eq!(hex::encode(&blk[..16]), hex::encode(expect), "{klen}-byte key");
    }
}

/// cipher_null-ecb is the identity with an empty key (cryptsetup writes the key as "-").
#[test]
fn cipher_null_is_identity() {
    let c = cipher("cipher_null-ecb", &[], 4096, 8, true);
    let data = pattern(8192, 6);
    let mut b = data.clone();
    c.encrypt(16, &mut b).unwrap();
    assert_eq!(b, data);
    c.decrypt(16, &mut b).unwrap();
    assert_eq!(b, data);
}

/// One XTS operation per crypto sector: a 4096-byte sector is not eight 512-byte ones.
#[test]
fn large_sectors_are_one_cipher_operation() {
    let key = pattern(64, 7);
    let data = pattern(4096, 8);
    let mut big = data.clone();
    cipher("aes-xts-plain64", &key, 4096, 0, false).encrypt(8, &mut big).unwrap();
    let mut small = data.clone();
    cipher("aes-xts-plain64", &key, 512, 0, false).encrypt(8, &mut small).unwrap();
    assert_eq!(big[..512], small[..512], "first 512 bytes share tweak and block offsets");
    assert_ne!(big[512..], small[512..]);
}

/// Published single-block vectors, through dm-crypt ECB specs (the first block of a sector):
/// each cipher's own specification's example, so a cipher wired to the wrong implementation
/// or key schedule fails here before any image is involved.
#[test]
fn published_block_cipher_vectors_through_ecb() {
    let cases: &[(&str, &str, &str, &str, &str)] = &[
        // (spec, key, plaintext block, ciphertext block, source)
        (
            "sm4-ecb",
            "0123456789abcdeffedcba9876543210",
            "0123456789abcdeffedcba9876543210",
            "681edf34d206965e86b3e94f536e4246",
            "GB/T 32907-2016 example 1",
        ),
        (
            "camellia-ecb",
            "0123456789abcdeffedcba9876543210",
            "0123456789abcdeffedcba9876543210",
            "67673138549669730857065648eabe43",
            "RFC 3713 appendix A, 128-bit key",
        ),
        (
            "twofish-ecb",
            "00000000000000000000000000000000",
            "00000000000000000000000000000000",
            "9f589f5cf6122c32b6bfec2f2ae8c35a",
            "Twofish ECB_TBL, 128-bit key, I=1",
        ),
        (
            "cast5-ecb",
            "0123456712345678234567893456789a",
            "0123456789abcdef",
            "238b4fe5847e44b2",
            "RFC 2144 B.1, 128-bit key",
        ),
        (
            "blowfish-ecb",
            "0000000000000000",
            "0000000000000000",
            "4ef997456198dd78",
            "Schneier/Young test vectors, first entry",
        ),
        (
            "cast6-ecb",
            "2342bb9efa38542c0af75647f29f615d",
            "00000000000000000000000000000000",
            "c842a08972b43d20836c91d1b7530f6b",
            "RFC 2612 appendix, 128-bit key",
        ),
        (
            "kuznyechik-ecb",
            "8899aabbccddeeff0011223344556677fedcba98765432100123456789abcdef",
            "1122334455667700ffeeddccbbaa998800112233445566778899aabbcceeff0a\
             112233445566778899aabbcceeff0a002233445566778899aabbcceeff0a0011",
            "7f679d90bebc24305a468d42b9d4edcdb429912c6e0032f9285452d76718d08b\
             f0ca33549d247ceef3f5a5313bd4b157d0b09ccde830b9eb3a02c4c5aa8ada98",
            "GOST R 34.12-2015 A.1 / RFC 7801 5.5; GOST R 34.13-2015 A.1.1 (ECB, four blocks)",
        ),
    ];
    for (spec, key, pt, ct, source) in cases {
        let c = cipher(spec, &h(key), 512, 0, false);
        let mut buf = vec![0u8; 512];
        buf[..pt.len() / 2].copy_from_slice(&h(pt));
        c.encrypt(0, &mut buf).unwrap();
        assert_eq!(hex::encode(&buf[..ct.len() / 2]), *ct, "{spec}: {source}");
        c.decrypt(0, &mut buf).unwrap();
        assert_eq!(hex::encode(&buf[..pt.len() / 2]), *pt, "{spec}: {source}");
    }
}
