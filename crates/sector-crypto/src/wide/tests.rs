//! Known answers: the Linux kernel's testmgr vectors for `adiantum(xchacha12,aes)` (32-byte
//! tweak, as dm-crypt uses; kernel-made images in `tests/wide_golden.rs` add XChaCha20 and
//! 4096-byte sectors) and the HCTR2 authors' vectors (google/hctr2) for HCTR2-AES-256 with
//! empty and 47-byte tweaks. No kernel image for HCTR2: Debian's kernels lack it.

use super::*;

fn h(s: &str) -> Vec<u8> {
    hex::decode(s).unwrap()
}

/// (key, 32-byte tweak, plaintext, ciphertext), adiantum(xchacha12,aes).
const ADIANTUM12: &[(&str, &str, &str, &str)] = &[
    (
        "9eebb2493c1cf5f46a99c2c4dfb1f4dd752057ea2c4fcdb2a53d7b491eabfd0f",
        "df63d4abd249f3d8338137607dfa7308d8496d80e82f6254eb0ea9395b457f8a",
        "67c9f23084418e43fbf3b33e79367fe8",
        "6d32861867860f3f967c9d280d53ec9f",
    ),
    (
        "362b5797f85dcd995f1a5a441d920f27cc16d72b856399d3ba96a1dbd26068da",
        "ef5869b12c5e9a4724c1b169e112938f433d6d00db5ed8d9129afed9ff2daac4",
        "5ea868198598122326 0accdb0a04b9df4db3487bb0e3c819435a4606942df2",
        "c7c6f1738fc4ff4a39be78be8d28c8894663e70c7d87e84ec9187bbe186050",
    ),
    (
        "a52824341a3cd8f705918fee851f357f803dfc9b94f6fc9e190900a904314f11",
        "a1ba4995ff346db8cd875d5efdea85db8a7b5eb25d57dd62aca98c41429475b7",
        "69b4e88c37e86782f1ec5d04e5149113dff2871b69811d71709e9c3bde497011\
         a0a3db0d544f6669d7db80a7709268ce81042cc6abaee56015e96fefaa8fa7a7\
         638ff2f077f1a8eae1b71f9eab9e4b3f07875b6fcda8afb9fa700b52b8a8a79e\
         075fa60eb39b791379c33e8d1c2c68c8511d3c7b7d79772a5665c5542328b003",
        "9e16abed4ba7425ac6fb4e76ffbe03a00fe3adbae4982b0e2148a0b865482748\
         845454b29a947be64b29e9cf0591801a3af34196851d9f74515663fa7c288549\
         f72ff9f21846f53380a33cceb25793f5aebda9f57b30c49366e0307716e4a031\
         ba70bc6813f5b09ac1fc7efe55805c4874a6aaa3acdcc2f58dde34867860758d",
    ),
];

/// (key, plaintext, ciphertext), HCTR2-AES-256 with an empty tweak.
const HCTR2_AES256_EMPTY_TWEAK: &[(&str, &str, &str)] = &[
    (
        "7fc7152ae1f5fda4176769aec92bba82a314e7cfadfd8540da7b7d24bdf17d07",
        "9be382c65ac19fad4659b80bacc857a0",
        "596a76ff906fbe9b792767778fed2361",
    ),
    (
        "93ea527d3af227fc39a45851f4e0fda3d790112f8bd7ecaf583d93980800decd",
        "84ece276218ef95b39092271 07a9d89192",
        "8e6816ce7b66973882fcb55200bb784fdb",
    ),
    (
        "86e7adcea85a7cfd2d62dc74dab01a2f3ed2490c2db996d9bb70fc09e3ca128a",
        "8ebc5252f93bc057995c97a11fa2e9d466c819f524b64a196f76a798674e1d59",
        "ad08013a9a1a97732ad231b8d5d63112aa3b2522f5bb6ea3b3a27bc770d882de",
    ),
];

fn clean(s: &str) -> Vec<u8> {
    h(&s.replace([' ', '\n'], ""))
}

/// (key, 47-byte tweak, plaintext, ciphertext), HCTR2-AES-256: a tweak that is not a
/// whole number of blocks (zero-padded in POLYVAL) and a partial last message block.
const HCTR2_AES256_TWEAK47: &[(&str, &str, &str, &str)] = &[
    (
        "a498fb595401657 94a9c0f8538b3a63dabf676c9f63b80412bb05131031f149a",
        "73f00d18cd92f549c02cafb48802c0b706266541006da6ceb9abe2c1325368013c6ec13afefd84abcc9b3aece37eaf",
        "b6efae3ec6ee8164ae77a17411c4ac469c4d6c63407a1d29632aed73f868b89a",
        "7660d335cd25bc2c8fad8e73e84392d422a7fe78063fd17f6f857b753a632599",
    ),
    (
        "3ae221677e6496eca5fcd4c38f1efa2d9a25cd981d87309728a268753af0ffb4",
        "64f0430089c4ebfe2e0478756c5b943c2e7a1b1f6748fc4cfe0febac16d1a450c7339a74467ae27371e592f797ce65",
        "f0b5eb0aa4891d4ed7b56926d569fc97a0e7ae9c7fb46a68f0792f1c57768b4df8",
        "ffae222d1cc53af903db5d310394551b1666f50be79b65e12c40b9d7de5b423bcb",
    ),
];

#[test]
fn hctr2_with_long_tweaks_matches_the_reference_vectors() {
    for (key, tw, pt, ct) in HCTR2_AES256_TWEAK47 {
        let c = Hctr2::new(&clean(key)).unwrap();
        let (t, pt, ct) = (clean(tw), clean(pt), clean(ct));
        let mut buf = pt.clone();
        c.crypt_unit(&mut buf, &t, true);
        assert_eq!(hex::encode(&buf), hex::encode(&ct), "encrypt, {} bytes", pt.len());
        c.crypt_unit(&mut buf, &t, false);
        assert_eq!(buf, pt, "decrypt, {} bytes", pt.len());
    }
}

#[test]
fn adiantum_xchacha12_matches_the_kernel_vectors() {
    for (key, tw, pt, ct) in ADIANTUM12 {
        let a = Adiantum::new(XChaCha::R12, &clean(key)).unwrap();
        let t: [u8; 32] = clean(tw).try_into().unwrap();
        let (pt, ct) = (clean(pt), clean(ct));
        let mut buf = pt.clone();
        a.crypt_unit(&mut buf, &t, true);
        assert_eq!(hex::encode(&buf), hex::encode(&ct), "encrypt, {} bytes", pt.len());
        a.crypt_unit(&mut buf, &t, false);
        assert_eq!(buf, pt, "decrypt, {} bytes", pt.len());
    }
}

#[test]
fn hctr2_matches_the_reference_vectors() {
    for (key, pt, ct) in HCTR2_AES256_EMPTY_TWEAK {
        let c = Hctr2::new(&clean(key)).unwrap();
        let (pt, ct) = (clean(pt), clean(ct));
        let mut buf = pt.clone();
        c.crypt_unit(&mut buf, &[], true);
        assert_eq!(hex::encode(&buf), hex::encode(&ct), "encrypt, {} bytes", pt.len());
        c.crypt_unit(&mut buf, &[], false);
        assert_eq!(buf, pt, "decrypt, {} bytes", pt.len());
    }
}

/// Wide-block: one flipped plaintext bit anywhere changes every 16-byte block of the sector;
/// the tweak (sector number) changes the ciphertext; decryption inverts.
#[test]
fn sectors_are_one_block_and_round_trip() {
    let modes: Vec<Box<dyn SectorMode>> = vec![
        Box::new(Adiantum::new(XChaCha::R12, &[7; 32]).unwrap()),
        Box::new(Adiantum::new(XChaCha::R20, &[7; 32]).unwrap()),
        Box::new(Hctr2::new(&[7; 16]).unwrap()),
        Box::new(Hctr2::new(&[7; 24]).unwrap()),
        Box::new(Hctr2::new(&[7; 32]).unwrap()),
    ];
    for m in &modes {
        for unit in [512usize, 4096] {
            let pt: Vec<u8> = (0..2 * unit).map(|i| (i * 31 % 251) as u8).collect();
            let ivs = [[1u8; 16], [2u8; 16]];
            let mut a = pt.clone();
            m.encrypt(&mut a, unit, &ivs).unwrap();
            let mut b = pt.clone();
            b[unit / 2] ^= 1;
            m.encrypt(&mut b, unit, &ivs).unwrap();
            for (x, y) in a[..unit].chunks(16).zip(b[..unit].chunks(16)) {
                assert_ne!(x, y, "{}: a block unchanged after a one-bit change", m.name());
            }
            assert_eq!(a[unit..], b[unit..], "{}: the other sector changed", m.name());
            assert_ne!(a[..unit], a[unit..], "{}", m.name());
            m.decrypt(&mut a, unit, &ivs).unwrap();
            assert!(a == pt, "{}", m.name());
        }
        assert!(m.encrypt(&mut [0u8; 512], 512, &[]).is_err());
    }
    assert!(Adiantum::new(XChaCha::R12, &[0; 31]).is_err());
    assert!(Hctr2::new(&[0; 20]).is_err());
}

/// Our Poly1305 without the final addition against the `poly1305` crate with a zero `s`:
/// RFC 8439 §2.5.2's key and message (zero-padded, as Adiantum pads), keys and messages of
/// all-ones bytes (every limb and carry at its maximum), and random ones, 0–80 blocks.
mod poly {
    use super::super::{poly_key, Poly};
    use poly1305::universal_hash::{KeyInit, UniversalHash};
    use proptest::prelude::*;

    fn crate_poly(r: &[u8; 16], msg: &[u8]) -> u128 {
        let mut key = [0u8; 32];
        key[..16].copy_from_slice(r);
        let mut p = poly1305::Poly1305::new((&key).into());
        p.update_padded(msg);
        u128::from_le_bytes(p.finalize().into())
    }

    fn ours(r: &[u8; 16], msg: &[u8]) -> u128 {
        let mut p = Poly::new(&poly_key(r));
        p.update(msg);
        p.finish()
    }

    #[test]
    fn rfc8439_key_and_extremes() {
        let r: [u8; 16] = hex::decode("85d6be7857556d337f4452fe42d506a8").unwrap().try_into().unwrap();
        let msg = b"Cryptographic Forum Research Group";
        let mut padded = msg.to_vec();
        padded.resize(48, 0);
        assert_eq!(ours(&r, &padded), crate_poly(&r, msg));
        for n in 0..=80 {
            let msg = vec![0xff; 16 * n];
            assert_eq!(ours(&[0xff; 16], &msg), crate_poly(&[0xff; 16], &msg), "{n} blocks of ff");
            assert_eq!(ours(&[0; 16], &msg), 0);
        }
    }

    proptest! {
        #[test]
        fn same_as_poly1305_crate(r in any::<[u8; 16]>(), blocks in proptest::collection::vec(any::<[u8; 16]>(), 0..80)) {
            let msg = blocks.concat();
            prop_assert_eq!(ours(&r, &msg), crate_poly(&r, &msg));
        }
    }
}
