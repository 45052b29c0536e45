//! Parsing cipher specifications the way `crypt_ctr_cipher_old/new` do, and validation in
//! `SectorCipher::new` (key sizes, sector size, iv_offset, request alignment).

use sector_crypto::{
    ChainMode, Cipher, CipherSpec, CryptoError, EssivHash, IvMode, KeyLayout, SectorCipher, SectorParams,
    VolumeKey,
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
    "serpent-xts-plain64",
    "twofish-cbc-essiv:sha256",
    "camellia-lrw-benbi",
    "cast6-ctr-plain64",
    "sm4-pcbc-plain64",
    "cast5-cbc-plain64be",
    "blowfish-ecb",
    "des3_ede-cbc-benbi",
    "aes-cbc-lmk",
    "aes:64-cbc-lmk",
    "aes:2-xts-plain64",
    "aes-cbc-tcw",
    "serpent:4-cbc-tcw",
    "capi:lrw(aes)-benbi",
    "capi:pcbc(blowfish)-plain64",
    "capi:ctr(twofish)-plain64",
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
    assert_eq!((x.iv_size(), x.default_key_bits(), x.valid_key_sizes()), (16, 512, vec![32usize, 48, 64]));
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
        (Cipher::CipherNull, 0, vec![0usize], 0)
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
        ("anubis-xts-plain64", "cipher 'anubis' is not supported"),
        ("aes:128-cbc-lmk", "keycount 128"),
        ("aes-xts-lmk", "IV generator 'lmk' with chain mode 'xts'"),
        ("aes-xts-random", "IV generator 'random' is not supported"),
        ("aes-xts-elephant", "IV generator 'elephant' goes only with aes-cbc"),
        ("serpent-cbc-elephant", "IV generator 'elephant' goes only with aes-cbc"),
        ("aes-cfb-plain64", "chain mode 'cfb' is not supported"),
        ("aes-cbc-essiv:sha999", "ESSIV hash 'sha999' is not supported"),
        ("xchacha12,aes:2-adiantum-plain64", "a keycount with adiantum"),
        ("aes:4-hctr2-plain64", "a keycount with hctr2"),
        ("aes-cbc-plain64:foo", "IV options 'foo'"),
        ("cipher_null-cbc-plain", "chain mode 'cbc' with cipher_null"),
        ("capi:gcm(aes)-random", "authenticated (AEAD) crypto API algorithm 'gcm(aes)'"),
        ("capi:authenc(hmac(sha256),xts(aes))-random", "authenticated (AEAD)"),
        ("capi:rfc7539(chacha20,poly1305)-random", "authenticated (AEAD)"),
        ("capi:xts(aria)-plain64", "cipher 'aria' is not supported"),
        ("capi:ofb(aes)-plain64", "crypto API algorithm 'ofb(aes)'"),
        ("capi:essiv(cbc(aes),sha256)-plain64", "crypto API template"),
        ("capi:xts(aes)-lmk", "IV generator 'lmk' with chain mode 'xts'"),
        ("capi:aegis128-random", "crypto API algorithm 'aegis128' is not supported"),
    ];
    for (spec, expect) in cases {
        let part = part_of(spec);
        assert!(part.contains(expect), "{spec}: part {part:?} does not contain {expect:?}");
    }
}

#[test]
fn key_layouts_follow_the_kernel() {
    let p = |s: &str| s.parse::<CipherSpec>().unwrap();
    // xts: two cipher keys; lrw: cipher key + 16-byte tweak key.
    assert_eq!(p("serpent-xts-plain64").valid_key_sizes(), (16..=32).map(|k| 2 * k).collect::<Vec<_>>());
    assert_eq!(p("aes-lrw-benbi").valid_key_sizes(), vec![32, 40, 48]);
    assert_eq!(p("aes-lrw-benbi").default_key_bits(), 384);
    assert_eq!(p("cast5-cbc-plain64").valid_key_sizes(), (5..=16).collect::<Vec<_>>());
    assert_eq!(p("cast5-cbc-plain64").default_key_bits(), 128);
    assert_eq!(
        (p("des3_ede-cbc-plain64").iv_size(), p("des3_ede-cbc-plain64").valid_key_sizes()),
        (8, vec![24])
    );
    assert_eq!((p("aes-ctr-benbi").iv_size(), p("aes-ctr-benbi").mode_block_size()), (16, 1));
    // tcw: subkeys, then an IV seed of iv_size bytes and 16 bytes of whitening key.
    assert_eq!(p("aes-cbc-tcw").valid_key_sizes(), vec![48, 56, 64]);
    assert_eq!(p("blowfish-cbc-tcw").key_layout(56), Ok(KeyLayout { keycount: 1, subkey: 32, extra: 24 }));
    assert!(p("aes-cbc-tcw").key_layout(32).unwrap_err().contains("tcw needs more than 256"));
    // lmk: keycount keys (v2) or keycount + 1 (v3, the last one the seed).
    let lmk = p("aes:64-cbc-lmk");
    assert_eq!(lmk.key_layout(64 * 16), Ok(KeyLayout { keycount: 64, subkey: 16, extra: 0 }));
    assert_eq!(lmk.key_layout(65 * 32), Ok(KeyLayout { keycount: 64, subkey: 32, extra: 32 }));
    assert!(lmk.key_layout(64 * 16 + 1).is_err());
    // capi with lmk means 64 keys, as crypt_ctr_cipher_new does.
    assert_eq!(p("capi:cbc(aes)-lmk").keycount(), 64);
    assert_eq!(p("aes:4-cbc-plain64").key_layout(128), Ok(KeyLayout { keycount: 4, subkey: 32, extra: 0 }));
    assert!(p("aes:4-cbc-plain64").key_layout(100).is_err());
}

#[test]
fn unsupported_key_sizes_name_the_valid_ones() {
    let spec: CipherSpec = "des3_ede-cbc-plain64".parse().unwrap();
    let params = SectorParams { sector_size: 512, iv_offset: 0, iv_large_sectors: false };
    let e = SectorCipher::new(&spec, &VolumeKey::new(vec![1; 16]), params).unwrap_err();
    assert!(e.to_string().contains("expected 192 bits"), "{e}");
    // ESSIV keys the data cipher with the digest: cast5 takes at most 128 bits (the kernel
    // fails the table load in setkey; the spec is refused when parsed).
    let e = "cast5-cbc-essiv:sha256".parse::<CipherSpec>().unwrap_err();
    assert!(
        e.to_string().contains("ESSIV hash 'sha256' gives a 256-bit key, which cast5 does not take"),
        "{e}"
    );
    assert!("cast5-cbc-essiv:md5".parse::<CipherSpec>().is_ok());
    let e = "aes-cbc-essiv:sha512".parse::<CipherSpec>().unwrap_err();
    assert!(e.to_string().contains("512-bit key, which aes does not take"), "{e}");
    let e = "des3_ede-cbc-essiv:sha256".parse::<CipherSpec>().unwrap_err();
    assert!(e.to_string().contains("des3_ede does not take"), "{e}");
    // Any hash whose digest the cipher takes: sha512 keys blowfish (up to 448 bits: no), sha384 yes.
    assert!("blowfish-cbc-essiv:sha512".parse::<CipherSpec>().is_err());
    assert!("blowfish-cbc-essiv:sha384".parse::<CipherSpec>().is_ok());
    assert!("serpent-xts-essiv:sha1".parse::<CipherSpec>().is_ok());
    // lmk and tcw need 512-byte sectors.
    let spec: CipherSpec = "aes-cbc-lmk".parse().unwrap();
    let big = SectorParams { sector_size: 4096, ..params };
    let e = SectorCipher::new(&spec, &VolumeKey::new(vec![1; 32]), big).unwrap_err();
    assert!(e.to_string().contains("Unsupported sector size for LMK"), "{e}");
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
        // xts and lrw need 128-bit blocks ("Error allocating crypto tfm" in the kernel)
        "blowfish-xts-plain64",
        "cast5-lrw-benbi",
        "capi:xts(des3_ede)-plain64",
        "aes:0-cbc-plain64",
        "aes-ctr-eboiv", // the kernel's "Block size of EBOIV cipher does not match IV size"
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

/// ESSIV with a keycount keys one IV cipher per subkey, each with `hash(subkey)`, for any
/// hash whose digest the cipher takes: sector `s` of `twofish:2-cbc-essiv:md5` under
/// `K0 ‖ K1` equals sector `s` of `twofish-cbc-essiv:md5` under `K(s mod 2)`.
#[test]
fn essiv_any_hash_keys_each_subkey() {
    let params = SectorParams { sector_size: 512, iv_offset: 0, iv_large_sectors: false };
    let k0: Vec<u8> = (0..16).collect();
    let k1: Vec<u8> = (100..116).collect();
    let both = [k0.clone(), k1.clone()].concat();
    let two: CipherSpec = "twofish:2-cbc-essiv:md5".parse().unwrap();
    let one: CipherSpec = "twofish-cbc-essiv:md5".parse().unwrap();
    let multi = SectorCipher::new(&two, &VolumeKey::new(both), params).unwrap();
    let singles = [
        SectorCipher::new(&one, &VolumeKey::new(k0), params).unwrap(),
        SectorCipher::new(&one, &VolumeKey::new(k1), params).unwrap(),
    ];
    let plain: Vec<u8> = (0..4 * 512).map(|i| (i * 7 % 251) as u8).collect();
    let mut all = plain.clone();
    multi.encrypt(10, &mut all).unwrap();
    for (i, (c, p)) in all.chunks_exact(512).zip(plain.chunks_exact(512)).enumerate() {
        let s = 10 + i as u64;
        let mut one = p.to_vec();
        singles[(s % 2) as usize].encrypt(s, &mut one).unwrap();
        assert_eq!(c, &one[..], "sector {s}");
    }
    // The hash matters: sha256 (a 256-bit twofish key) gives other ciphertext.
    let sha: CipherSpec = "twofish:2-cbc-essiv:sha256".parse().unwrap();
    let other = SectorCipher::new(&sha, &VolumeKey::new((0..16).chain(100..116).collect()), params).unwrap();
    let mut again = plain.clone();
    other.encrypt(10, &mut again).unwrap();
    assert_ne!(again, all);
}

/// BitLocker's `aes-cbc-elephant`: the key is two equal AES keys (data ‖ sector key), as the
/// kernel's `key_extra_size = key_size / 2`; encryption and decryption invert each other at
/// every sector size (the Windows-made images in volume's bitlk_golden test pin the data).
#[test]
fn elephant_keys_are_two_halves_and_round_trip() {
    let spec: CipherSpec = "aes-cbc-elephant".parse().unwrap();
    assert_eq!(spec.to_string(), "aes-cbc-elephant");
    assert_eq!(spec.valid_key_sizes(), vec![32, 48, 64]);
    assert_eq!(spec.default_key_bits(), 512);
    for ss in [512u32, 4096] {
        let params = SectorParams { sector_size: ss, iv_offset: 0, iv_large_sectors: ss != 512 };
        let c = SectorCipher::new(&spec, &VolumeKey::new((0..64).collect()), params).unwrap();
        let plain: Vec<u8> = (0..4 * ss as usize).map(|i| (i % 251) as u8).collect();
        let mut data = plain.clone();
        c.encrypt(8, &mut data).unwrap();
        assert_ne!(data, plain);
        // Each sector depends on its position (sector key and IV).
        assert_ne!(data[..ss as usize], data[ss as usize..2 * ss as usize]);
        c.decrypt(8, &mut data).unwrap();
        assert_eq!(data, plain, "sector size {ss}");
    }
    let params = SectorParams { sector_size: 512, iv_offset: 0, iv_large_sectors: false };
    assert!(SectorCipher::new(&spec, &VolumeKey::new(vec![0; 40]), params).is_err());
}
