//! Known answers from the Twofish paper (appendix B) and its `ecb_tbl.txt`, and a randomized
//! differential test against the `twofish` crate (the slow but independent oracle).

use super::Twofish;
use aes::cipher::{Array, BlockCipherDecrypt, BlockCipherEncrypt, KeyInit};
use proptest::prelude::*;

fn unhex(s: &str) -> Vec<u8> {
    hex::decode(s).unwrap()
}

fn encrypt(key: &[u8], pt: &[u8]) -> [u8; 16] {
    let c = Twofish::new_from_slice(key).unwrap();
    let mut b = Array::try_from(pt).unwrap();
    c.encrypt_block(&mut b);
    let mut d = b;
    c.decrypt_block(&mut d);
    assert_eq!(&d[..], pt, "decrypt(encrypt(x)) != x");
    b.into()
}

/// Appendix B: one block of zeros under a zero 128-bit key and the two counting keys.
#[test]
fn paper_known_answers() {
    let cases = [
        ("00000000000000000000000000000000", "9F589F5CF6122C32B6BFEC2F2AE8C35A"),
        ("0123456789ABCDEFFEDCBA98765432100011223344556677", "CFD1D2E5A9BE9CDF501F13B892BD2248"),
        (
            "0123456789ABCDEFFEDCBA987654321000112233445566778899AABBCCDDEEFF",
            "37527BE0052334B89F0CFCCAE87CFA20",
        ),
    ];
    for (key, ct) in cases {
        assert_eq!(encrypt(&unhex(key), &[0; 16]).to_vec(), unhex(ct), "key {key}");
    }
}

/// `ecb_tbl.txt`: starting from a zero key and block, each step encrypts the previous
/// ciphertext under a key made of the previous plaintext followed by the previous key
/// (truncated to the key size); the 49th ciphertext of each key size is published.
#[test]
fn ecb_tbl_iterated() {
    let cases = [
        (16, "9F589F5CF6122C32B6BFEC2F2AE8C35A", "5D9D4EEFFA9151575524F115815A12E0"),
        (24, "EFA71F788965BD4453F860178FC19101", "E75449212BEEF9F4A390BD860A640941"),
        (32, "57FF739D4DC92C1BD7FC01700CC8216F", "37FE26FF1CF66175F5DDF4C33B97A205"),
    ];
    for (len, first, last) in cases {
        let mut key = vec![0u8; len];
        let mut pt = [0u8; 16];
        let mut ct = [0u8; 16];
        for i in 1..=49 {
            ct = encrypt(&key, &pt);
            if i == 1 {
                assert_eq!(ct.to_vec(), unhex(first), "I=1, {len}-byte key");
            }
            let next_key: Vec<u8> = pt.iter().chain(&key).copied().take(len).collect();
            key = next_key;
            pt = ct;
        }
        assert_eq!(ct.to_vec(), unhex(last), "I=49, {len}-byte key");
    }
}

/// The accepted key lengths are the `twofish` crate's (and the kernel's): 16, 24, 32.
#[test]
fn key_lengths_as_the_crate() {
    for n in 0..=64 {
        let key = vec![0x5A; n];
        assert_eq!(
            Twofish::new_from_slice(&key).is_ok(),
            ::twofish::Twofish::new_from_slice(&key).is_ok(),
            "key length {n}"
        );
    }
}

fn key_and_blocks() -> impl Strategy<Value = (Vec<u8>, Vec<u8>)> {
    (prop_oneof![Just(16usize), Just(24), Just(32)], 1usize..=11).prop_flat_map(|(len, n)| {
        (proptest::collection::vec(any::<u8>(), len), proptest::collection::vec(any::<u8>(), 16 * n))
    })
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(256))]

    /// Random keys of every size and 1–11 random blocks (single and parallel paths): the
    /// same ciphertext as the `twofish` crate, and decryption inverts both.
    #[test]
    fn same_as_twofish_crate((key, data) in key_and_blocks()) {
        let ours = Twofish::new_from_slice(&key).unwrap();
        let oracle = ::twofish::Twofish::new_from_slice(&key).unwrap();
        let (blocks, rest) = Array::slice_as_chunks(&data);
        prop_assert!(rest.is_empty());
        let mut a = blocks.to_vec();
        let mut b = blocks.to_vec();
        ours.encrypt_blocks(&mut a);
        oracle.encrypt_blocks(&mut b);
        prop_assert_eq!(&a, &b);
        // Decrypt the ciphertext of random data too (not only our own output).
        let mut c = blocks.to_vec();
        let mut d = blocks.to_vec();
        ours.decrypt_blocks(&mut c);
        oracle.decrypt_blocks(&mut d);
        prop_assert_eq!(&c, &d);
        ours.decrypt_blocks(&mut a);
        prop_assert_eq!(&a[..], blocks);
    }
}
