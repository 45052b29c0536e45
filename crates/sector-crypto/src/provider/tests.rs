//! Provider known-answer tests at the mode level, where IVs and unit sizes are free
//! (IEEE 1619 vectors with 32-byte data units, NIST SP 800-38A with its own IV).

use super::*;

fn h(s: &str) -> Vec<u8> {
    hex::decode(s).unwrap()
}

fn block(s: &str) -> Block {
    h(s).try_into().unwrap()
}

/// Every provider's implementation of a mode, for one key.
fn all_xts(key: &[u8]) -> Vec<Box<dyn SectorMode>> {
    let mut v = vec![rustcrypto::xts(crate::Cipher::Aes, key).unwrap()];
    if let Some(m) = awslc::Xts256::new(key) {
        v.push(Box::new(m));
    }
    v
}

fn all_cbc(key: &[u8]) -> Vec<Box<dyn SectorMode>> {
    vec![rustcrypto::cbc(crate::Cipher::Aes, key).unwrap(), Box::new(awslc::Cbc::new(key).unwrap())]
}

fn check(modes: Vec<Box<dyn SectorMode>>, unit: usize, ivs: &[Block], pt: &[u8], ct: &[u8]) {
    assert!(!modes.is_empty());
    for m in modes {
        let mut buf = pt.to_vec();
        m.encrypt(&mut buf, unit, ivs).unwrap();
        assert_eq!(hex::encode(&buf), hex::encode(ct), "{} encrypt", m.name());
        m.decrypt(&mut buf, unit, ivs).unwrap();
        assert_eq!(hex::encode(&buf), hex::encode(pt), "{} decrypt", m.name());
    }
}

/// IEEE P1619 vector 1: both AES-128 keys zero (equal halves: aws-lc refuses, the non-FIPS
/// kernel and the RustCrypto path accept).
#[test]
fn xts_ieee1619_vector1_equal_halves() {
    let key = [0u8; 32];
    assert!(awslc::Xts256::new(&[0u8; 64]).is_none(), "aws-lc should refuse equal XTS halves");
    check(
        all_xts(&key),
        32,
        &[[0; 16]],
        &[0; 32],
        &h("917cf69ebd68b2ec9b9fe9a3eadda692cd43d2f59598ed858c02c2652fbf922e"),
    );
}

/// IEEE P1619 vector 2: data unit sequence number 0x3333333333.
#[test]
fn xts_ieee1619_vector2() {
    let key = h("1111111111111111111111111111111122222222222222222222222222222222");
    check(
        all_xts(&key),
        32,
        &[block("33333333330000000000000000000000")],
        &[0x44; 32],
        &h("c454185e6a16936e39334038acef838bfb186fff7480adc4289382ecd6d394f0"),
    );
}

/// 512-byte IEEE vectors 4 (AES-128) and 10 (AES-256, both providers), two units at once.
#[test]
fn xts_ieee1619_vectors_4_and_10_multi_unit() {
    let pt: Vec<u8> = (0..512).map(|i| i as u8).collect();
    let v4 = h(crate::tests::IEEE1619_V4_CT);
    let v10 = h(crate::tests::IEEE1619_V10_CT);
    let k4 = h(crate::tests::IEEE1619_V4_KEY);
    let k10 = h(crate::tests::IEEE1619_V10_KEY);
    let mut tweak_ff = [0u8; 16];
    tweak_ff[0] = 0xff;
    check(all_xts(&k4), 512, &[[0; 16]], &pt, &v4);
    let modes = all_xts(&k10);
    assert_eq!(modes.len(), 2, "aws-lc must take 512-bit XTS keys");
    check(modes, 512, &[tweak_ff], &pt, &v10);
    // Two units with different tweaks in one call.
    let mut two = pt.clone();
    two.extend_from_slice(&pt);
    let mut expect = v10.clone();
    expect.extend_from_slice(&v10);
    check(all_xts(&k10), 512, &[tweak_ff, tweak_ff], &two, &expect);
}

const NIST_PT: &str = "6bc1bee22e409f96e93d7e117393172aae2d8a571e03ac9c9eb76fac45af8e51\
                       30c81c46a35ce411e5fbc1191a0a52eff69f2445df4f9b17ad2b417be66c3710";
const NIST_IV: &str = "000102030405060708090a0b0c0d0e0f";

/// NIST SP 800-38A F.2.1, F.2.3, F.2.5 (CBC-AES128/192/256), both providers.
#[test]
fn cbc_nist_sp800_38a() {
    let cases = [
        (
            "2b7e151628aed2a6abf7158809cf4f3c",
            "7649abac8119b246cee98e9b12e9197d5086cb9b507219ee95db113a917678b2\
             73bed6b8e3c1743b7116e69e222295163ff1caa1681fac09120eca307586e1a7",
        ),
        (
            "8e73b0f7da0e6452c810f32b809079e562f8ead2522c6b7b",
            "4f021db243bc633d7178183a9fa071e8b4d9ada9ad7dedf4e5e738763f69145a\
             571b242012fb7ae07fa9baac3df102e008b0e27988598881d920a9e64f5615cd",
        ),
        (
            "603deb1015ca71be2b73aef0857d77811f352c073b6108d72d9810a30914dff4",
            "f58c4c04d6e5f1ba779eabfb5f7bfbd69cfc4e967edb808d679f777bc6702c7d\
             39f23369a9d9bacfa530e26304231461b2eb05e2c39be9fcda6c19078c6a9d1b",
        ),
    ];
    for (key, ct) in cases {
        check(all_cbc(&h(key)), 64, &[block(NIST_IV)], &h(NIST_PT), &h(ct));
    }
}

/// CBC decryption is batched 32 blocks at a time: a unit longer than a batch must chain
/// across batch boundaries (4096 bytes = 8 batches), identically in both providers.
#[test]
fn cbc_providers_agree_across_batches() {
    let key = h("603deb1015ca71be2b73aef0857d77811f352c073b6108d72d9810a30914dff4");
    let pt: Vec<u8> = (0..8192u32).map(|i| (i.wrapping_mul(2654435761) >> 13) as u8).collect();
    let ivs = [block(NIST_IV), block("ffeeddccbbaa99887766554433221100")];
    let mut outs = Vec::new();
    for m in all_cbc(&key) {
        let mut buf = pt.clone();
        m.encrypt(&mut buf, 4096, &ivs).unwrap();
        outs.push(buf.clone());
        m.decrypt(&mut buf, 4096, &ivs).unwrap();
        assert_eq!(buf, pt, "{}", m.name());
    }
    assert_eq!(outs[0], outs[1]);
}

/// ECB is CBC with a zero IV, one block at a time.
#[test]
fn ecb_matches_single_block_cbc() {
    let key = h("2b7e151628aed2a6abf7158809cf4f3c");
    let pt = h(NIST_PT);
    let mut ecb = pt.clone();
    rustcrypto::ecb(crate::Cipher::Aes, &key).unwrap().encrypt(&mut ecb, 16, &[]).unwrap();
    for (i, chunk) in pt.chunks(16).enumerate() {
        let mut one = chunk.to_vec();
        awslc::Cbc::new(&key).unwrap().encrypt(&mut one, 16, &[[0; 16]]).unwrap();
        assert_eq!(one, ecb[i * 16..i * 16 + 16]);
    }
    // NIST SP 800-38A F.1.1 first block.
    assert_eq!(hex::encode(&ecb[..16]), "3ad77bb40d7a3660a89ecaf32466ef97");
}

#[test]
fn malformed_unit_layout_is_an_error() {
    let m = rustcrypto::xts(crate::Cipher::Aes, &[1u8; 64]).unwrap();
    let mut buf = [0u8; 512];
    assert!(m.encrypt(&mut buf, 500, &[[0; 16]; 2]).is_err());
    assert!(m.encrypt(&mut buf, 512, &[]).is_err());
    let m = awslc::Xts256::new(&(0..64).collect::<Vec<u8>>()).unwrap();
    assert!(m.encrypt(&mut buf, 0, &[]).is_err());
    assert!(m.encrypt(&mut buf, 512, &[]).is_err());
}

#[test]
fn provider_selection() {
    let k64: Vec<u8> = (0..64).collect();
    assert_eq!(aes_xts(Provider::Auto, &k64).unwrap().name(), "aws-lc xts(aes256)");
    assert_eq!(aes_xts(Provider::RustCrypto, &k64).unwrap().name(), "rustcrypto xts(aes256)");
    assert_eq!(aes_xts(Provider::Auto, &[7u8; 64]).unwrap().name(), "rustcrypto xts(aes256)");
    assert!(aes_xts(Provider::AwsLc, &[7u8; 64]).is_err());
    assert_eq!(aes_xts(Provider::Auto, &k64[..32]).unwrap().name(), "rustcrypto xts(aes128)");
    assert_eq!(aes_xts(Provider::Auto, &k64[..48]).unwrap().name(), "rustcrypto xts(aes192)");
    assert_eq!(aes_cbc(Provider::AwsLc, &k64[..24]).unwrap().name(), "aws-lc cbc(aes192)");
    assert_eq!(
        aes_cbc(Provider::Auto, &k64[..24]).unwrap().name(),
        "cbc(aes192): rustcrypto multi-lane enc, aws-lc dec"
    );
    assert_eq!(aes_cbc(Provider::RustCrypto, &k64[..32]).unwrap().name(), "rustcrypto cbc(aes256)");
    assert!(aes_ecb(Provider::AwsLc, &k64[..16]).is_err());
}

/// The RustCrypto CBC encryptor runs many units side by side (one lane each) when a request
/// has enough of them: every lane count and unit size must match aws-lc's serial CBC.
#[test]
fn cbc_multi_lane_encryption_matches_serial() {
    let key = h("603deb1015ca71be2b73aef0857d77811f352c073b6108d72d9810a30914dff4");
    let rc = rustcrypto::cbc(crate::Cipher::Aes, &key).unwrap();
    let al = awslc::Cbc::new(&key).unwrap();
    for unit in [16, 512, 4096] {
        for units in [1, 2, 3, 15, 16, 17, 31, 32, 33, 63, 64, 65, 100, 130] {
            if unit * units > 1 << 20 {
                continue;
            }
            let pt: Vec<u8> =
                (0..unit * units).map(|i| (i as u32).wrapping_mul(2246822519).rotate_left(7) as u8).collect();
            let ivs: Vec<Block> = (0..units).map(|i| [(i * 3) as u8; 16]).collect();
            let (mut a, mut b) = (pt.clone(), pt.clone());
            rc.encrypt(&mut a, unit, &ivs).unwrap();
            al.encrypt(&mut b, unit, &ivs).unwrap();
            assert!(a == b, "unit {unit} units {units}");
            rc.decrypt(&mut a, unit, &ivs).unwrap();
            assert!(a == pt, "unit {unit} units {units} round trip");
        }
    }
}
