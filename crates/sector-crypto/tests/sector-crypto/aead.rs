//! AEAD sector encryption (dm-crypt `integrity:<n>:aead`): known answers computed with an
//! independent implementation (Python `cryptography`: AES-XTS, HMAC, AES-GCM,
//! ChaCha20-Poly1305, over the AAD
//! layout of the kernel's `crypt_convert_block_aead`), tuple layout, and tamper detection.
//! The kernel's own output is checked against these ciphers in
//! `crates/volume/tests/volume/luks2_integrity_golden.rs`.

use sector_crypto::{
    AeadAlgorithm, AeadIv, AeadSectorCipher, AeadSpec, CryptoError, HmacHash, SectorParams, VolumeKey,
};
use sha2::{Digest, Sha256};

fn pat(n: usize, seed: u8) -> Vec<u8> {
    (0..n).map(|i| ((i as u32 * 31 + u32::from(seed)) ^ (i as u32 >> 9)) as u8).collect()
}

fn key(n: usize) -> VolumeKey {
    VolumeKey::new((0..n as u8).collect())
}

fn params(sector_size: u32, iv_offset: u64, iv_large_sectors: bool) -> SectorParams {
    SectorParams { sector_size, iv_offset, iv_large_sectors }
}

fn sha(b: &[u8]) -> String {
    hex::encode(Sha256::digest(b))
}

#[test]
fn specs_parse_print_and_map_from_luks2() {
    let hmac: AeadSpec = "capi:authenc(hmac(sha256),xts(aes))-plain64".parse().unwrap();
    assert_eq!(hmac.algorithm(), AeadAlgorithm::AuthencXts(HmacHash::Sha256));
    assert_eq!(hmac.to_string(), "capi:authenc(hmac(sha256),xts(aes))-plain64");
    assert_eq!((hmac.auth_tag_size(), hmac.stored_iv_size(), hmac.tuple_size()), (32, 0, 32));
    assert_eq!(hmac.valid_key_sizes(), vec![64, 80, 96]);
    assert_eq!(AeadSpec::from_luks2("aes-xts-plain64", "hmac(sha256)").unwrap(), hmac);
    assert_eq!(AeadSpec::from_luks2("aes-xts-plain64", "hmac-sha256").unwrap(), hmac);
    assert_eq!(hmac.luks2_names(), ("aes-xts-plain64".to_string(), "hmac(sha256)".to_string()));

    let gcm: AeadSpec = "capi:gcm(aes)-random".parse().unwrap();
    assert_eq!((gcm.algorithm(), gcm.iv()), (AeadAlgorithm::Gcm, AeadIv::Random));
    assert_eq!((gcm.auth_tag_size(), gcm.stored_iv_size(), gcm.tuple_size()), (16, 12, 28));
    assert_eq!(AeadSpec::from_luks2("aes-gcm-random", "aead").unwrap(), gcm);
    assert_eq!(gcm.luks2_names(), ("aes-gcm-random".to_string(), "aead".to_string()));

    let cp: AeadSpec = "capi:rfc7539(chacha20,poly1305)-random".parse().unwrap();
    assert_eq!((cp.algorithm(), cp.iv()), (AeadAlgorithm::ChaCha20Poly1305, AeadIv::Random));
    assert_eq!(cp.to_string(), "capi:rfc7539(chacha20,poly1305)-random");
    assert_eq!((cp.auth_tag_size(), cp.stored_iv_size(), cp.tuple_size()), (16, 12, 28));
    assert_eq!((cp.iv_size(), cp.mac_key_size(), cp.valid_key_sizes()), (12, 0, vec![32]));
    assert_eq!(AeadSpec::from_luks2("chacha20-random", "poly1305").unwrap(), cp);
    assert_eq!(cp.luks2_names(), ("chacha20-random".to_string(), "poly1305".to_string()));
    // The kernel accepts chacha20-plain64 (nonce = le64(sector) ‖ 0⁴, not stored); refused
    // here because every rewrite of a sector would reuse its nonce.
    let e = AeadSpec::from_luks2("chacha20-plain64", "poly1305").unwrap_err();
    assert!(e.to_string().contains("random IV generator"), "{e}");

    // cryptsetup's INTEGRITY_tag_size table: xts-random + hmac-sha256 = 48, hmac-sha512 = 64.
    assert_eq!(AeadSpec::from_luks2("aes-xts-random", "hmac(sha256)").unwrap().tuple_size(), 48);
    assert_eq!(AeadSpec::from_luks2("aes-xts-plain64", "hmac(sha512)").unwrap().tuple_size(), 64);
    assert_eq!(AeadSpec::from_luks2("aes-xts-plain64", "hmac(sha1)").unwrap().tuple_size(), 20);

    for (enc, int) in [
        ("aes-cbc-essiv:sha256", "hmac(sha256)"),
        ("aes-xts-plain64", "hmac(md5)"),
        ("aes-ccm-random", "aead"),
        ("chacha20-plain64", "poly1305"),
        ("aes-xts-random", "poly1305"),
        ("chacha20-random", "aead"),
        ("aes-xts-plain64", "none"),
        ("aes-xts-plain64", "crc32c"),
    ] {
        let e = AeadSpec::from_luks2(enc, int).unwrap_err();
        assert!(matches!(e, CryptoError::Unsupported { .. }), "{enc} {int}: {e}");
    }
    for bad in [
        "gcm(aes)-random",
        "capi:gcm(aes)",
        "capi:gcm(aes)-plain64",
        "capi:rfc7539(chacha20,poly1305)-plain64",
        "capi:rfc7539esp(chacha20,poly1305)-random",
        "capi:ccm(aes)-random",
        "capi:authenc(hmac(sha256),cbc(aes))-plain64",
    ] {
        assert!(bad.parse::<AeadSpec>().is_err(), "{bad}");
    }
}

/// (sector size, first sector, iv_offset, iv_large_sectors, sha256 of ciphertext, tags)
type AuthencRow = (u32, u64, u64, bool, &'static str, [&'static str; 2]);

/// authenc(hmac(sha256),xts(aes))-plain64, volume key 0..95: two sectors starting at
/// `sector`. Expected: sha256 of the ciphertext and the two tags (Python cryptography).
#[test]
fn authenc_hmac_sha256_xts_plain64_known_answers() {
    let rows: [AuthencRow; 3] = [
        (
            512,
            6,
            0,
            false,
            "b6c8ef24d3162dac0037ebd0328ae6407f869944fec354eb483b59b1f0d6c6c7",
            [
                "3b5e6ac1a65e00af65f9f2d39536ae0483556761a6d58b7d716a1168428dc0e3",
                "5a89a589d0c5cea861f2bb0fffe1f650f993e4d15803156c5e30c2d941e1e78c",
            ],
        ),
        // iv_offset 8: in the IV, not in the AAD's sector.
        (
            4096,
            16,
            8,
            false,
            "e2236bbbe48cb56fff9f1454c75d2c28ab80443f8b7828c22cebd30f512e7644",
            [
                "9988697cd9c4f73d576398b172119640e2bbaa134fa25f33fb1ffda4e6c12f00",
                "6b0c9a321f3d899c4a45a1272a03fff7bf98a985ca63e1e180188d692dcbc28b",
            ],
        ),
        // iv_large_sectors: the IV counts 4 KiB sectors, the AAD still 512-byte ones.
        (
            4096,
            16,
            0,
            true,
            "6b31b87fb61052ce679ba634d17618cf85baef1827c3ebaef93e521d984d5007",
            [
                "babcfd79bf2023d1c330667ff5f2a99bf59915fe2483d531ffa81006200878a5",
                "f6697312d1733b6e472c3a5aeccc19f03bc0cb23497370e464fb42453f136a6c",
            ],
        ),
    ];
    let spec: AeadSpec = "capi:authenc(hmac(sha256),xts(aes))-plain64".parse().unwrap();
    for (ss, sector, ivo, large, ct_sha, tags) in rows {
        let c = AeadSectorCipher::new(&spec, &key(96), params(ss, ivo, large), 32).unwrap();
        let plain = pat(2 * ss as usize, 7);
        let mut data = plain.clone();
        let mut tuples = vec![0u8; 64];
        c.encrypt(sector, &mut data, &mut tuples).unwrap();
        assert_eq!(sha(&data), ct_sha, "ciphertext ss={ss} sector={sector}");
        assert_eq!(hex::encode(&tuples[..32]), tags[0], "tag 0 ss={ss}");
        assert_eq!(hex::encode(&tuples[32..]), tags[1], "tag 1 ss={ss}");
        c.decrypt(sector, &mut data, &tuples).unwrap();
        assert_eq!(data, plain);
    }
}

const GCM_CT_512: &str = "e53a3d4d3a55bf63997fbe8b70ec750a83be6840fd39efa077040fce182dd0c5317466bff05cce8184661df05e0c164d94e957782dbe97d28ab40276e3160014775e844f0ffb997c4f380600b898b92e7ed95ab4ea8ff4f645bfd79296dc28102c46caab1c90d2e70561dfa892beb85cb7e2b05ed11bd650a465174cb373b72946b3719f2c5cbd4b4cc34753e55ca482fb4b1cbb51ded7c09647143d48c1116fa59abe7169945d2ad970b29ab824a3d524546c28cd88a312c9e8ff919b641a737754cd69df0f46f1c8073957fef2c7a161bb957890ad35b4c68b316dfa003f634b1353a126d304c3db861b27d5bd958b188f934f06fcbd6b6087e402e295ed76141d88e790521f3c9db96edd10add907cb033b00d4346ee6136d3f92853621e9784a67e27f7ce0713e975714a4d913ea0be5cf6544084e0fb94a6485d2eb30a7163c12f0c12b488b28029211a052a133c8117701b9005a7cf3d57dc24f7ca1c9e2d14350c90f7524617bda64649546ba5e5edfa18a134fac2fae84f8dac1968da96960da0a5cab5f03c21db0dcbb9d9f6c75ad483e35a83741640f008b675767e4c3e1889149efb67803ba4618a99d5e5ec95f31b853da5ca82d0c133b94218117cc374c430468f8e7cca7d45ee6f7cffa8d98d39cda6d7b07d78da9609b5df575bae8d404bbcf7c9606263e2fc4accf16eee7c8fe3710e7e96d5d887f79d4e8";

/// gcm(aes)-random, key 0..31, sector 6, nonce a0..ab: a tuple made by an independent
/// implementation (tag ‖ nonce) decrypts, so the AAD is le64(sector) ‖ nonce.
#[test]
fn gcm_random_known_answer_decrypts_and_binds_the_sector() {
    let spec: AeadSpec = "capi:gcm(aes)-random".parse().unwrap();
    let c = AeadSectorCipher::new(&spec, &key(32), params(512, 0, false), 28).unwrap();
    let ct = hex::decode(GCM_CT_512).unwrap();
    let mut tuple = hex::decode("57014ad658d80fb95e8e4cc9d8d4aca3").unwrap();
    tuple.extend(0xa0u8..0xac);
    let mut data = ct.clone();
    c.decrypt(6, &mut data, &tuple).unwrap();
    assert_eq!(data, pat(512, 3));
    // The same bytes at another sector do not authenticate.
    let mut data = ct.clone();
    assert!(matches!(c.decrypt(7 - 1 + 8, &mut data, &tuple), Err(CryptoError::AuthFailed { sector: 14 })));
    assert!(data.iter().all(|&b| b == 0), "a failed sector is zeroed");
    // A non-zero iv_offset changes nothing for random IVs (the AAD sector has no offset).
    let c = AeadSectorCipher::new(&spec, &key(32), params(512, 1024, false), 28).unwrap();
    let mut data = ct;
    c.decrypt(6, &mut data, &tuple).unwrap();
    assert_eq!(data, pat(512, 3));
}

const CHACHA_CT_512: &str = "0f89393f32787f715b15ca4c8b6c482f6e4ce2ef2ce4cd6f5fd2f2f916e466c88f8237caf1b762361d36ec854a27edf299365b084662e62decbe02680b4c206c7219666e07b7ef6c992a2b913ae6dceab34bfef333f2fb2cd0e2a388a98ac53f3f8586a09065308934fab99a83f64e81db7062a55a7ea7c9234669bbb5b6f55afc8f3d1e76b9c69f7e2f66e58da3224dea40b0399926271d95fd2e215e83c340fb38bf9287632057f6c115f84f477879a4cc73edcb71bcff7ff751cbdeac003d61e079a4af05f74a474ab7a8d6f90426b37a367e0d5d84e1567af6612dc72d9e89b9a5cf1907a8afa2a92508aae40867cf5951f5482b897ace87cab51425ea2168d675cb5d956bcae17d128328236e841993b5494bf22f061314c74fbc8b93f85285735b77846adf34719b6b0c1c743ecf151ad8a58aaf60137008890b9988f4065bc28d853eb1fdf6cd28ea41f0a676ed6cc81ee0119486df5203972051b8175648a208b848e1e90c07a5be287d0d4af64cd29a96fb05e43e1a5de0131ea87523abbbc1bd7bb5a71690c242291e306d5159a6b12804e828be087a1c512d06cd0e03120b3d3ddb49cb12aa718d56f49fb778e0073fcd776d495788f1ac70de8d8ae718c63f76d5609d2c9ca7c08db5dcb7961b7ceff4302614a02d09e02bc1170c374fb65dd35e009e34f853da1f0b1dc103a182aaac8418f98de1e42889fbb9";

/// rfc7539(chacha20,poly1305)-random, key 0..31, sector 6, nonce a0..ab: Python
/// `cryptography`'s ChaCha20Poly1305 sealed pattern 3 with AAD le64(6) ‖ nonce; the tuple
/// (tag ‖ nonce) and ciphertext decrypt here, so the AAD, nonce and tag placement are the
/// kernel's (checked against a kernel-made image in luks2_integrity_golden.rs).
#[test]
fn chacha20_poly1305_random_known_answer_decrypts_and_binds_the_sector() {
    let spec: AeadSpec = "capi:rfc7539(chacha20,poly1305)-random".parse().unwrap();
    let c = AeadSectorCipher::new(&spec, &key(32), params(512, 0, false), 28).unwrap();
    assert!(c.implementation().contains("chacha20"), "{}", c.implementation());
    let ct = hex::decode(CHACHA_CT_512).unwrap();
    let mut tuple = hex::decode("ed34c83e0e6c7d13557c9894beb35363").unwrap();
    tuple.extend(0xa0u8..0xac);
    let mut data = ct.clone();
    c.decrypt(6, &mut data, &tuple).unwrap();
    assert_eq!(data, pat(512, 3));
    // Another sector, or a nonce not covered by the AAD, does not authenticate.
    let mut data = ct.clone();
    assert!(matches!(c.decrypt(14, &mut data, &tuple), Err(CryptoError::AuthFailed { sector: 14 })));
    assert!(data.iter().all(|&b| b == 0), "a failed sector is zeroed");
    // Nor under another key.
    let other = VolumeKey::new((1..33).collect());
    let c2 = AeadSectorCipher::new(&spec, &other, params(512, 0, false), 28).unwrap();
    let mut data = ct.clone();
    assert!(c2.decrypt(6, &mut data, &tuple).is_err());
    // iv_offset does not enter the AAD for random IVs.
    let c = AeadSectorCipher::new(&spec, &key(32), params(512, 1024, false), 28).unwrap();
    let mut data = ct;
    c.decrypt(6, &mut data, &tuple).unwrap();
    assert_eq!(data, pat(512, 3));
}

#[test]
fn gcm_random_ivs_are_fresh_and_stored_after_the_tag_with_zero_padding() {
    let spec: AeadSpec = "capi:gcm(aes)-random".parse().unwrap();
    // A lower device with 32-byte tuples: 4 bytes of zero padding after tag ‖ IV.
    let c = AeadSectorCipher::new(&spec, &key(32), params(4096, 0, false), 32).unwrap();
    let plain = pat(3 * 4096, 9);
    let (mut a, mut b) = (plain.clone(), plain.clone());
    let (mut ta, mut tb) = (vec![0xffu8; 96], vec![0xffu8; 96]);
    c.encrypt(24, &mut a, &mut ta).unwrap();
    c.encrypt(24, &mut b, &mut tb).unwrap();
    assert_ne!(a, b, "a rewrite gets a new IV, so new ciphertext");
    for t in ta.chunks(32).chain(tb.chunks(32)) {
        assert_eq!(&t[28..], &[0; 4], "padding");
    }
    let nonces: Vec<&[u8]> = ta.chunks(32).chain(tb.chunks(32)).map(|t| &t[16..28]).collect();
    for (i, x) in nonces.iter().enumerate() {
        for y in &nonces[i + 1..] {
            assert_ne!(x, y);
        }
    }
    c.decrypt(24, &mut a, &ta).unwrap();
    c.decrypt(24, &mut b, &tb).unwrap();
    assert_eq!((a == plain, b == plain), (true, true));
}

#[test]
fn any_flipped_bit_fails_exactly_that_sector() {
    let specs = [
        ("capi:authenc(hmac(sha256),xts(aes))-plain64", 96),
        ("capi:authenc(hmac(sha256),xts(aes))-random", 96),
        ("capi:authenc(hmac(sha512),xts(aes))-plain64", 128),
        ("capi:gcm(aes)-random", 32),
        ("capi:rfc7539(chacha20,poly1305)-random", 32),
    ];
    for (s, klen) in specs {
        let spec: AeadSpec = s.parse().unwrap();
        let ts = spec.tuple_size();
        for ss in [512u32, 4096] {
            let c = AeadSectorCipher::new(&spec, &key(klen), params(ss, 0, false), ts).unwrap();
            let step = u64::from(ss / 512);
            let plain = pat(4 * ss as usize, 1);
            let mut ct = plain.clone();
            let mut tuples = vec![0u8; 4 * ts];
            c.encrypt(8 * step, &mut ct, &mut tuples).unwrap();
            // Byte positions: in sector 2's data, in its tag, in its stored IV.
            let mut cases = vec![(2 * ss as usize + 100, false), (2 * ts + 3, true)];
            if spec.stored_iv_size() > 0 {
                cases.push((2 * ts + spec.auth_tag_size() + 1, true));
            }
            for (pos, in_tuple) in cases {
                let (mut d, mut t) = (ct.clone(), tuples.clone());
                if in_tuple {
                    t[pos] ^= 0x01;
                } else {
                    d[pos] ^= 0x80;
                }
                let e = c.decrypt(8 * step, &mut d, &t).unwrap_err();
                assert!(
                    matches!(e, CryptoError::AuthFailed { sector } if sector == 10 * step),
                    "{s} {ss}: {e}"
                );
                assert_eq!(&d[..2 * ss as usize], &plain[..2 * ss as usize], "sectors before it decrypt");
                assert!(
                    d[2 * ss as usize..3 * ss as usize].iter().all(|&b| b == 0),
                    "the bad sector is zeroed"
                );
                // The other sectors alone still read.
                let mut last = ct[3 * ss as usize..].to_vec();
                c.decrypt(11 * step, &mut last, &t[3 * ts..]).unwrap();
                assert_eq!(last, &plain[3 * ss as usize..]);
            }
            // Swapping two sectors (ciphertext and tuple) is detected: the AAD binds the sector.
            let (mut d, mut t) = (ct.clone(), tuples.clone());
            let ssz = ss as usize;
            let (x, y) = d.split_at_mut(ssz);
            x.swap_with_slice(&mut y[..ssz]);
            let (x, y) = t.split_at_mut(ts);
            x.swap_with_slice(&mut y[..ts]);
            assert!(matches!(c.decrypt(8 * step, &mut d, &t), Err(CryptoError::AuthFailed { .. })), "{s}");
        }
    }
}

#[test]
fn bad_keys_tuples_and_alignment_are_refused() {
    let hmac: AeadSpec = "capi:authenc(hmac(sha256),xts(aes))-plain64".parse().unwrap();
    let gcm: AeadSpec = "capi:gcm(aes)-random".parse().unwrap();
    let p = params(512, 0, false);
    let cp: AeadSpec = "capi:rfc7539(chacha20,poly1305)-random".parse().unwrap();
    for (spec, bad) in [(&hmac, 48), (&hmac, 32), (&gcm, 64), (&gcm, 20), (&cp, 16), (&cp, 64)] {
        let e = AeadSectorCipher::new(spec, &key(bad), p, 64).unwrap_err();
        assert!(matches!(e, CryptoError::InvalidKeySize { .. }), "{spec} {bad}: {e}");
    }
    assert!(matches!(AeadSectorCipher::new(&gcm, &key(32), p, 27), Err(CryptoError::InvalidParams(_))));
    assert!(matches!(
        AeadSectorCipher::new(&gcm, &key(32), params(768, 0, false), 28),
        Err(CryptoError::InvalidParams(_))
    ));
    let c = AeadSectorCipher::new(&gcm, &key(32), params(4096, 0, false), 28).unwrap();
    let mut d = vec![0u8; 4096];
    assert!(matches!(c.encrypt(1, &mut d, &mut [0; 28]), Err(CryptoError::Misaligned { .. })));
    assert!(matches!(c.encrypt(0, &mut d, &mut [0; 27]), Err(CryptoError::InvalidParams(_))));
    assert!(matches!(c.encrypt(0, &mut d[..512], &mut []), Err(CryptoError::Misaligned { .. })));
    let dbg = format!("{c:?}");
    assert!(!dbg.contains("0, 1, 2, 3") && dbg.contains("gcm"), "{dbg}");
}

#[test]
fn random_ivs_of_a_large_request_are_all_distinct_and_authenticate() {
    // More sectors than one getrandom batch: every tuple still gets its own IV.
    for (s, klen) in [
        ("capi:gcm(aes)-random", 32),
        ("capi:rfc7539(chacha20,poly1305)-random", 32),
        ("capi:authenc(hmac(sha256),xts(aes))-random", 96),
    ] {
        let spec: AeadSpec = s.parse().unwrap();
        let ts = spec.tuple_size();
        let c = AeadSectorCipher::new(&spec, &key(klen), params(512, 0, false), ts).unwrap();
        let plain = pat(130 * 512, 5);
        let mut d = plain.clone();
        let mut t = vec![0u8; 130 * ts];
        c.encrypt(0, &mut d, &mut t).unwrap();
        let mut ivs: Vec<&[u8]> = t.chunks(ts).map(|x| &x[spec.auth_tag_size()..]).collect();
        ivs.sort();
        ivs.dedup();
        assert_eq!(ivs.len(), 130, "{s}");
        c.decrypt(0, &mut d, &t).unwrap();
        assert_eq!(d, plain);
    }
}
