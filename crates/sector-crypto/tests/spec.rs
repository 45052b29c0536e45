//! Parsing cipher specifications the way `crypt_ctr_cipher_old/new` do, and validation in
//! `SectorCipher::new` (key sizes, sector size, iv_offset, request alignment).

use sector_crypto::{
    ChainMode, Cipher, CipherSpec, CryptoError, EssivHash, IvMode, SectorCipher, SectorParams, VolumeKey,
};

const CANONICAL: &[&str] = &[
    "aes-xts-plain64",
    "aes-xts-plain",
    "aes-xts-plain64be",
    "aes-xts-essiv:sha256",
    "aes-xts-benbi",
    "aes-xts-null",
    "aes-xts-eboiv",
    "aes-cbc-essiv:sha256",
    "aes-cbc-plain64",
    "aes-cbc-plain",
    "aes-cbc-plain64be",
    "aes-cbc-null",
    "aes-cbc-eboiv",
    "aes-cbc-benbi",
    "aes-ecb",
    "aes-ecb-plain64",
    "cipher_null-ecb",
    "aes",
    "aes-plain",
    "aes:1-xts-plain64",
    "capi:xts(aes)-plain64",
    "capi:xts(aes)-plain",
    "capi:cbc(aes)-essiv:sha256",
    "capi:cbc(aes)-eboiv",
    "capi:cbc(aes)-plain64be",
    "capi:ecb(aes)",
    "capi:ecb(cipher_null)",
];

#[test]
fn supported_specs_round_trip() {
    for s in CANONICAL {
        let spec: CipherSpec = s.parse().unwrap_or_else(|e| panic!("{s}: {e}"));
        assert_eq!(spec.to_string(), *s);
        let again: CipherSpec = spec.to_string().parse().unwrap();
        assert_eq!(again, spec);
    }
}

#[test]
fn parsed_parts() {
    let p = |s: &str| s.parse::<CipherSpec>().unwrap();
    let x = p("aes-xts-plain64");
    assert_eq!((x.cipher(), x.mode(), x.iv_mode()), (Cipher::Aes, ChainMode::Xts, Some(IvMode::Plain64)));
    assert_eq!((x.iv_size(), x.default_key_bits(), x.valid_key_sizes()), (16, 512, &[32usize, 48, 64][..]));
    assert_eq!(x.crypto_api_name(), "xts(aes)");
    assert!(!x.is_capi());
    let e = p("capi:cbc(aes)-essiv:sha256");
    assert!(e.is_capi());
    assert_eq!(e.iv_mode(), Some(IvMode::Essiv(EssivHash::Sha256)));
    assert_eq!(e.crypto_api_name(), "essiv(cbc(aes),sha256)");
    assert_eq!(e.default_key_bits(), 256);
    // Legacy shorthands: the kernel's "use cbc-plain".
    for s in ["aes", "aes-plain", "aes:1"] {
        let a = p(s);
        assert_eq!((a.mode(), a.iv_mode()), (ChainMode::Cbc, Some(IvMode::Plain)), "{s}");
        assert_eq!(a.to_string(), s);
    }
    let n = p("cipher_null-ecb");
    assert_eq!(
        (n.cipher(), n.iv_size(), n.valid_key_sizes(), n.default_key_bits()),
        (Cipher::CipherNull, 0, &[0usize][..], 0)
    );
    // ECB ignores an IV generator, as the kernel does ("Selected cipher does not support IVs").
    let eiv = p("aes-ecb-plain64");
    assert_eq!((eiv.iv_mode(), eiv.effective_iv_mode(), eiv.iv_size()), (Some(IvMode::Plain64), None, 0));
}

fn part_of(s: &str) -> String {
    match s.parse::<CipherSpec>() {
        Err(CryptoError::Unsupported { spec, part }) => {
            assert_eq!(spec, s);
            part
        }
        other => panic!("{s}: expected Unsupported, got {other:?}"),
    }
}

#[test]
fn unsupported_specs_name_the_part() {
    let cases: &[(&str, &str)] = &[
        ("serpent-xts-plain64", "cipher 'serpent' is not supported"),
        ("twofish-cbc-essiv:sha256", "cipher 'twofish'"),
        ("aes-cbc-lmk", "IV generator 'lmk' is not supported"),
        ("aes:64-cbc-lmk", "multi-key (keycount) specs are not supported"),
        ("aes:2-xts-plain64", "multi-key (keycount) specs are not supported"),
        ("aes-cbc-tcw", "IV generator 'tcw' is not supported"),
        ("aes-xts-random", "IV generator 'random' is not supported"),
        ("aes-cbc-elephant", "IV generator 'elephant' is not supported"),
        ("aes-lrw-benbi", "chain mode 'lrw' is not supported"),
        ("aes-ctr-plain64", "chain mode 'ctr' is not supported"),
        ("aes-cbc-essiv:sha999", "ESSIV hash 'sha999' is not supported"),
        ("aes-cbc-plain64:foo", "IV options 'foo'"),
        ("cipher_null-cbc-plain", "chain mode 'cbc' with cipher_null"),
        ("capi:gcm(aes)-random", "authenticated (AEAD) crypto API algorithm 'gcm(aes)'"),
        ("capi:authenc(hmac(sha256),xts(aes))-random", "authenticated (AEAD)"),
        ("capi:rfc7539(chacha20,poly1305)-random", "authenticated (AEAD)"),
        ("capi:xts(serpent)-plain64", "cipher 'serpent' is not supported"),
        ("capi:lrw(aes)-benbi", "crypto API algorithm 'lrw(aes)'"),
        ("capi:essiv(cbc(aes),sha256)-plain64", "crypto API template"),
        ("capi:xts(aes)-lmk", "IV generator 'lmk' is not supported"),
        ("capi:aegis128-random", "crypto API algorithm 'aegis128' is not supported"),
    ];
    for (spec, expect) in cases {
        let part = part_of(spec);
        assert!(part.contains(expect), "{spec}: part {part:?} does not contain {expect:?}");
    }
}

#[test]
fn malformed_specs_are_invalid() {
    for s in [
        "",
        "aes-cbc",           // IV mechanism required
        "aes-xts",           // IV mechanism required
        "aes-cbc-",          // empty IV mode
        "aes-xts-plain64-x", // ivmode "plain64-x"
        "aes-cbc-essiv",     // digest missing
        "aes-xts-bogus",
        "xts(aes)-plain64", // crypto API name without capi:
        "aes:3-xts-plain64",
        "aes:x-xts-plain64",
        "-xts-plain64",
        "aes-ecb-essiv:sha256",
        "capi:xts(aes)", // no IV generator
        "aes xts",
        "aes-gcm-random",
        "aes-lrw", // the kernel asks for an IV before it looks up the mode
    ] {
        match s.parse::<CipherSpec>() {
            Err(CryptoError::InvalidSpec { spec, reason }) => {
                assert_eq!(spec, s);
                assert!(!reason.is_empty());
            }
            other => panic!("{s:?}: expected InvalidSpec, got {other:?}"),
        }
    }
}

fn params(sector_size: u32, iv_offset: u64) -> SectorParams {
    SectorParams { sector_size, iv_offset, iv_large_sectors: false }
}

fn new(spec: &str, key_len: usize, p: SectorParams) -> Result<SectorCipher, CryptoError> {
    SectorCipher::new(&spec.parse().unwrap(), &VolumeKey::new(vec![0x5a; key_len]), p)
}

#[test]
fn wrong_key_sizes_are_invalid_key_size() {
    let cases: &[(&str, &[usize], &[usize])] = &[
        ("aes-xts-plain64", &[32, 48, 64], &[0, 16, 24, 40, 63, 65, 128]),
        ("aes-cbc-essiv:sha256", &[16, 24, 32], &[0, 8, 15, 33, 64]),
        ("aes-ecb", &[16, 24, 32], &[0, 31]),
        ("cipher_null-ecb", &[0], &[1, 32]),
    ];
    for (spec, good, bad) in cases {
        for &k in *good {
            new(spec, k, params(512, 0)).unwrap_or_else(|e| panic!("{spec} {k}: {e}"));
        }
        for &k in *bad {
            match new(spec, k, params(512, 0)) {
                Err(CryptoError::InvalidKeySize { bits, .. }) => assert_eq!(bits, k * 8),
                other => panic!("{spec} with {k} bytes: {other:?}"),
            }
        }
    }
}

#[test]
fn sector_size_and_iv_offset_rules() {
    for ss in [0, 256, 768, 8192, 513] {
        assert!(
            matches!(new("aes-xts-plain64", 64, params(ss, 0)), Err(CryptoError::InvalidParams(_))),
            "{ss}"
        );
    }
    // iv_offset must be a multiple of sector_size / 512 (kernel: "Invalid iv_offset sector").
    for (ss, off, ok) in [
        (512, 1, true),
        (1024, 1, false),
        (1024, 2, true),
        (4096, 4, false),
        (4096, 8, true),
        (4096, 12, false),
    ] {
        assert_eq!(new("aes-xts-plain64", 64, params(ss, off)).is_ok(), ok, "{ss} {off}");
    }
}

#[test]
fn misaligned_requests_are_refused() {
    let c = new("aes-xts-plain64", 64, params(4096, 0)).unwrap();
    let mut buf = vec![0u8; 8192];
    assert!(matches!(c.encrypt(1, &mut buf), Err(CryptoError::Misaligned { sector: 1, .. })));
    assert!(matches!(c.encrypt(8, &mut buf[..4608]), Err(CryptoError::Misaligned { .. })));
    assert!(matches!(c.decrypt(4, &mut buf), Err(CryptoError::Misaligned { .. })));
    c.encrypt(8, &mut buf).unwrap();
    c.encrypt(8, &mut []).unwrap();
}

#[test]
fn key_material_is_never_printed() {
    let key = VolumeKey::new(vec![0xab; 64]);
    let c = SectorCipher::new(&"aes-xts-plain64".parse().unwrap(), &key, params(512, 0)).unwrap();
    for text in [format!("{key:?}"), format!("{c:?}")] {
        assert!(!text.to_lowercase().contains("abab"), "{text}");
        assert!(!text.contains("171, 171"), "{text}");
    }
    let err = new("aes-xts-plain64", 63, params(512, 0)).unwrap_err().to_string();
    assert!(!err.contains("5a5a"), "{err}");
    assert!(format!("{c:?}").contains("aes-xts-plain64"));
}
