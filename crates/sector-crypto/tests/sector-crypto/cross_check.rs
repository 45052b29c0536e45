//! Table-driven cross-check against an independent reference (tests/common/reference.rs):
//! spec × key size × sector size (512..4096) × iv_offset × iv_large_sectors × start sector,
//! including the 32-bit `plain` wrap and `u32::MAX - 7`, for every provider.

use crate::common;

use common::reference::{self, pattern};
use sector_crypto::{CipherSpec, Provider, SectorCipher, SectorParams, VolumeKey};

const SECTOR_SIZES: [u32; 4] = [512, 1024, 2048, 4096];
const IV_OFFSETS: [u64; 3] = [0, 8, u32::MAX as u64 - 7];
/// Start sectors (multiples of 8): 0, just below the 32-bit wrap, and far beyond it.
const STARTS: [u64; 3] = [0, 0xffff_fff0, 0x0123_4567_89ab_cde8];

fn specs() -> Vec<(&'static str, Vec<usize>)> {
    let mut v = Vec::new();
    for iv in ["plain", "plain64", "plain64be", "essiv:sha256", "benbi", "null", "eboiv"] {
        let xts: &'static str = Box::leak(format!("aes-xts-{iv}").into_boxed_str());
        let cbc: &'static str = Box::leak(format!("aes-cbc-{iv}").into_boxed_str());
        v.push((xts, vec![32, 48, 64]));
        v.push((cbc, vec![16, 24, 32]));
    }
    v.push(("aes-ecb", vec![16, 24, 32]));
    v.push(("cipher_null-ecb", vec![0]));
    v.push(("aes", vec![16, 32]));
    v.push(("capi:xts(aes)-plain64", vec![32, 64]));
    v.push(("capi:cbc(aes)-essiv:sha256", vec![16, 32]));
    v.push(("capi:cbc(aes)-eboiv", vec![32]));
    v.push(("capi:ecb(aes)", vec![16]));
    v
}

fn key_of(len: usize, seed: u64) -> Vec<u8> {
    pattern(len, seed)
}

/// Checks one configuration: encrypt `n` sectors with `SectorCipher`, then decrypt and
/// re-encrypt each sector with the reference using hand-computed IVs.
fn check(spec_s: &str, key: &[u8], params: SectorParams, start: u64, n: usize, provider: Provider) {
    let spec: CipherSpec = spec_s.parse().unwrap();
    let cipher = SectorCipher::with_provider(&spec, &VolumeKey::new(key.to_vec()), params, provider)
        .unwrap_or_else(|e| panic!("{spec_s} {params:?}: {e}"));
    let ss = params.sector_size as usize;
    let plain = pattern(ss * n, start ^ u64::from(params.sector_size) ^ params.iv_offset);
    let mut ct = plain.clone();
    cipher.encrypt(start, &mut ct).unwrap();
    let step = u64::from(params.sector_size / 512);
    for i in 0..n {
        let sector = start + i as u64 * step;
        let s = reference::iv_sector(sector, &params);
        let iv = match spec.effective_iv_mode() {
            Some(m) => reference::iv(m, spec.mode(), key, s, params.sector_size),
            None => [0; 16],
        };
        let range = i * ss..(i + 1) * ss;
        let mut mine = ct[range.clone()].to_vec();
        reference::decrypt(spec.mode(), key, &iv, &mut mine);
        assert!(
            mine == plain[range.clone()],
            "{spec_s} key {} bits {params:?} start {start} sector {sector} (iv_sector {s:#x}, {}): reference decrypt differs",
            key.len() * 8,
            cipher.implementation()
        );
        let mut theirs = plain[range.clone()].to_vec();
        reference::encrypt(spec.mode(), key, &iv, &mut theirs);
        assert!(theirs == ct[range], "{spec_s} {params:?} sector {sector}: reference encrypt differs");
    }
    let mut back = ct.clone();
    cipher.decrypt(start, &mut back).unwrap();
    assert!(back == plain, "{spec_s} {params:?} start {start}: round trip");
    if spec.cipher() != sector_crypto::Cipher::CipherNull {
        assert_ne!(ct, plain, "{spec_s}: ciphertext equals plaintext");
    }
}

#[test]
fn every_spec_matches_reference_over_geometry_table() {
    let mut configs = 0;
    for (spec, key_lens) in specs() {
        for &klen in &key_lens {
            let key = key_of(klen, klen as u64 * 31 + spec.len() as u64);
            for ss in SECTOR_SIZES {
                for iv_offset in IV_OFFSETS {
                    for iv_large_sectors in [false, true] {
                        for start in STARTS {
                            let p = SectorParams { sector_size: ss, iv_offset, iv_large_sectors };
                            check(spec, &key, p, start, 3, Provider::Auto);
                            configs += 1;
                        }
                    }
                }
            }
        }
    }
    assert!(configs > 3000, "table shrank: {configs}");
}

/// The pure-Rust provider against the same reference (smaller table: it is the fallback).
#[test]
fn rustcrypto_provider_matches_reference() {
    for (spec, key_lens) in specs() {
        for &klen in &key_lens {
            let key = key_of(klen, 7 + klen as u64);
            for ss in [512, 4096] {
                let p = SectorParams { sector_size: ss, iv_offset: 8, iv_large_sectors: ss == 4096 };
                check(spec, &key, p, 0xffff_fff0, 3, Provider::RustCrypto);
            }
        }
    }
}

/// IVs are computed in batches of 32 sectors: requests longer than a batch, starting at an
/// odd place, must still see one IV per sector.
#[test]
fn long_requests_cross_iv_batches() {
    for spec in ["aes-xts-plain64", "aes-cbc-essiv:sha256", "aes-cbc-eboiv", "aes-xts-plain"] {
        let key = key_of(if spec.contains("xts") { 64 } else { 32 }, 99);
        for ss in [512, 4096] {
            let p = SectorParams { sector_size: ss, iv_offset: 0, iv_large_sectors: false };
            check(spec, &key, p, 0xffff_ffe8, 70, Provider::Auto);
        }
    }
}

/// XTS with equal key halves: accepted (non-FIPS kernel behaviour) and served by the
/// RustCrypto path, matching the reference.
#[test]
fn xts_equal_key_halves_are_accepted() {
    for klen in [32, 48, 64] {
        let half = key_of(klen / 2, 5);
        let key = [half.clone(), half].concat();
        let spec: CipherSpec = "aes-xts-plain64".parse().unwrap();
        let p = SectorParams { sector_size: 4096, iv_offset: 0, iv_large_sectors: true };
        let c = SectorCipher::new(&spec, &VolumeKey::new(key.clone()), p).unwrap();
        assert!(c.implementation().starts_with("rustcrypto"), "{}", c.implementation());
        check("aes-xts-plain64", &key, p, 8, 4, Provider::Auto);
        assert!(SectorCipher::with_provider(&spec, &VolumeKey::new(key), p, Provider::AwsLc).is_err());
    }
}

/// Both providers produce identical bytes for the spec they share.
#[test]
fn providers_agree() {
    for (spec_s, klen) in [("aes-xts-plain64", 64), ("aes-cbc-essiv:sha256", 16), ("aes-cbc-plain64", 24)] {
        let spec: CipherSpec = spec_s.parse().unwrap();
        let key = VolumeKey::new(key_of(klen, 11));
        let p = SectorParams { sector_size: 4096, iv_offset: 0, iv_large_sectors: false };
        let a = SectorCipher::with_provider(&spec, &key, p, Provider::AwsLc).unwrap();
        let r = SectorCipher::with_provider(&spec, &key, p, Provider::RustCrypto).unwrap();
        assert!(a.implementation().starts_with("aws-lc"));
        assert!(r.implementation().starts_with("rustcrypto"));
        let data = pattern(4096 * 9, 3);
        let (mut x, mut y) = (data.clone(), data);
        a.encrypt(64, &mut x).unwrap();
        r.encrypt(64, &mut y).unwrap();
        assert_eq!(x, y, "{spec_s}");
    }
}

/// `encrypt_to` (plaintext in one buffer, ciphertext into another) gives exactly what
/// `encrypt` leaves in a copy, for every IV kind (lmk hashes the plaintext, elephant rewrites
/// it, tcw whitens the ciphertext), keycounts above one, sector sizes and both providers, and
/// leaves its source alone; a length mismatch is an error that writes nothing.
#[test]
fn encrypt_to_matches_encrypt_in_place() {
    let mut names: Vec<&str> = specs().iter().map(|(s, _)| *s).collect();
    names.extend(["aes:64-cbc-lmk", "aes-cbc-tcw", "aes-cbc-elephant", "aes:4-cbc-plain64"]);
    names.extend(["aes:2-xts-plain64", "twofish-xts-plain64", "serpent-cbc-essiv:sha256"]);
    let mut one_pass = 0;
    for name in names {
        let spec: CipherSpec = name.parse().unwrap_or_else(|e| panic!("{name}: {e}"));
        for provider in [Provider::Auto, Provider::RustCrypto] {
            for sector_size in [512u32, 4096] {
                let params = SectorParams { sector_size, iv_offset: 8, iv_large_sectors: false };
                // The first key length the spec takes, and 64 bytes where it takes them
                // (aws-lc runs AES-XTS with a 512-bit key only).
                let ciphers: Vec<SectorCipher> = (0..=4096usize)
                    .step_by(8)
                    .filter_map(|len| {
                        SectorCipher::with_provider(&spec, &VolumeKey::new(key_of(len, 9)), params, provider)
                            .ok()
                            .map(|c| (len, c))
                    })
                    .enumerate()
                    .filter(|(i, (len, _))| *i == 0 || *len == 64)
                    .map(|(_, (_, c))| c)
                    .collect();
                if ciphers.is_empty() {
                    // lmk, tcw and elephant take 512-byte sectors only.
                    assert!(sector_size != 512, "{name}: no key length accepted");
                }
                for cipher in ciphers {
                    one_pass += usize::from(cipher.implementation() == "aws-lc xts(aes256)");
                    // More than one IV batch, so batches are cut at the same places.
                    let len = (sector_size as usize * 300).max(256 * 1024);
                    let plain = pattern(len, u64::from(sector_size) ^ 0x55);
                    let mut expected = plain.clone();
                    cipher.encrypt(16, &mut expected).unwrap();
                    let src = plain.clone();
                    let mut dst = vec![0xa5u8; len];
                    cipher.encrypt_to(16, &src, &mut dst).unwrap();
                    assert!(
                        dst == expected,
                        "{name} {} {provider:?} {sector_size}: encrypt_to differs from encrypt",
                        cipher.implementation()
                    );
                    assert!(src == plain, "{name}: encrypt_to changed its source");
                    let mut short = vec![0xa5u8; len - sector_size as usize];
                    assert!(
                        cipher.encrypt_to(16, &src, &mut short).is_err(),
                        "{name}: length mismatch accepted"
                    );
                    assert!(short.iter().all(|&b| b == 0xa5), "{name}: a refused call wrote");
                }
            }
        }
    }
    assert!(one_pass > 0, "the one-pass aws-lc XTS path was not exercised");
}
