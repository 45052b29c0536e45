//! The LUKS anti-forensic (AF) splitter: a key of `n` bytes is stored as `stripes × n`
//! bytes that all must survive to recover it, so wiping any part of a keyslot destroys it.
//!
//! Semantics are cryptsetup's `lib/luks1/af.c` (LUKS1 spec §2.4, also LUKS2 `"af":
//! {"type":"luks1"}`):
//!
//! ```text
//!  split(key):                               merge(s_0 .. s_{k-1}):
//!    d = 0^n                                   d = 0^n
//!    for i in 0 .. k-1:                        for i in 0 .. k-1:
//!      s_i = random(n)                           d = diffuse(d XOR s_i)
//!      d   = diffuse(d XOR s_i)                key = d XOR s_{k-1}
//!    s_{k-1} = d XOR key
//!
//!  diffuse(d), H with digest size h:         chunk j of d (h bytes; the last one may be shorter)
//!    chunk_j' = H(be32(j) ‖ chunk_j)[..len(chunk_j)]
//! ```
//!
//! The split material is what gets encrypted into a keyslot area (padded to whole
//! 512-byte sectors with zeroes, see [`split_sectors`]). Split material and merged keys are
//! [`SecretBuf`]s: locked, kept out of core dumps, wiped on drop.

use crate::kdf::{random_bytes, HashAlg, KdfError};
use crate::secure::SecretBuf;

/// Sector unit of keyslot key material.
const SECTOR: usize = 512;

/// The 512-byte sectors that `stripes` stripes of a `key_len`-byte key occupy
/// (cryptsetup `AF_split_sectors`).
pub fn split_sectors(key_len: usize, stripes: u32) -> usize {
    (key_len * stripes as usize).div_ceil(SECTOR)
}

fn xor_into(dst: &mut [u8], src: &[u8]) {
    for (d, s) in dst.iter_mut().zip(src) {
        *d ^= s;
    }
}

/// cryptsetup's `diffuse`: hash each digest-sized chunk of `block` with its big-endian index.
fn diffuse(hash: HashAlg, block: &mut [u8]) {
    let h = hash.output_len();
    for (j, chunk) in block.chunks_mut(h).enumerate() {
        let index = (j as u32).to_be_bytes();
        let mut out = [0u8; 64];
        hash.digest_into(&[&index, chunk], &mut out[..h]);
        let n = chunk.len();
        chunk.copy_from_slice(&out[..n]);
        zeroize::Zeroize::zeroize(&mut out);
    }
}

/// Splits `key` into `stripes` stripes with random bytes from `fill`, returning
/// `stripes × key.len()` bytes. `fill` is the randomness source (the OS's in [`split`];
/// tests pass a deterministic one).
pub fn split_with(
    key: &[u8],
    stripes: u32,
    hash: HashAlg,
    mut fill: impl FnMut(&mut [u8]) -> Result<(), KdfError>,
) -> Result<SecretBuf, KdfError> {
    if stripes == 0 {
        return Err(KdfError::InvalidParams { kdf: "af", reason: "stripes must be at least 1".into() });
    }
    let n = key.len();
    let k = stripes as usize;
    let mut out = SecretBuf::zeroed(n * k);
    let mut d = SecretBuf::zeroed(n);
    for i in 0..k - 1 {
        let s = &mut out[i * n..(i + 1) * n];
        fill(s)?;
        xor_into(&mut d, s);
        diffuse(hash, &mut d);
    }
    let last = &mut out[(k - 1) * n..];
    last.copy_from_slice(&d);
    xor_into(last, key);
    Ok(out)
}

/// Splits `key` into `stripes` stripes using the OS random source.
pub fn split(key: &[u8], stripes: u32, hash: HashAlg) -> Result<SecretBuf, KdfError> {
    split_with(key, stripes, hash, random_bytes)
}

/// Recovers a `key_len`-byte key from split material (at least `stripes × key_len` bytes;
/// trailing sector padding is ignored).
pub fn merge(material: &[u8], key_len: usize, stripes: u32, hash: HashAlg) -> Result<SecretBuf, KdfError> {
    let k = stripes as usize;
    if k == 0 || material.len() < key_len * k {
        return Err(KdfError::InvalidParams {
            kdf: "af",
            reason: format!(
                "{} bytes of key material cannot hold {stripes} stripes of {key_len} bytes",
                material.len()
            ),
        });
    }
    let mut d = SecretBuf::zeroed(key_len);
    for i in 0..k - 1 {
        xor_into(&mut d, &material[i * key_len..(i + 1) * key_len]);
        diffuse(hash, &mut d);
    }
    xor_into(&mut d, &material[(k - 1) * key_len..k * key_len]);
    Ok(d)
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A deterministic "random" source for known-answer tests.
    fn counter() -> impl FnMut(&mut [u8]) -> Result<(), KdfError> {
        let mut c = 0u8;
        move |b: &mut [u8]| {
            for x in b {
                *x = c;
                c = c.wrapping_add(1);
            }
            Ok(())
        }
    }

    #[test]
    fn merge_inverts_split_for_every_hash_and_odd_sizes() {
        for hash in [HashAlg::Sha1, HashAlg::Sha256, HashAlg::Sha512] {
            for key_len in [16usize, 20, 32, 33, 64, 65] {
                let key: Vec<u8> = (0..key_len as u8).map(|b| b.wrapping_mul(7)).collect();
                let m = split(&key, 4000, hash).unwrap();
                assert_eq!(m.len(), key_len * 4000);
                assert_eq!(&merge(&m, key_len, 4000, hash).unwrap()[..], &key[..], "{hash} {key_len}");
            }
        }
    }

    #[test]
    fn split_with_fixed_randomness_is_deterministic() {
        let key = [0xa5u8; 32];
        let a = split_with(&key, 7, HashAlg::Sha256, counter()).unwrap();
        let b = split_with(&key, 7, HashAlg::Sha256, counter()).unwrap();
        assert_eq!(a, b);
        // The first six stripes are the random source's bytes, verbatim.
        assert_eq!(a[..32], (0u8..32).collect::<Vec<_>>()[..]);
    }

    /// Two stripes by hand: d = diffuse(s0); s1 = d ^ key. With SHA-1 and a 32-byte key,
    /// diffuse hashes a 20-byte chunk and a 12-byte (truncated) chunk.
    #[test]
    fn diffuse_truncates_the_last_chunk() {
        let key = [0x11u8; 32];
        let m = split_with(&key, 2, HashAlg::Sha1, counter()).unwrap();
        let s0: Vec<u8> = (0u8..32).collect();
        let mut d = s0.clone();
        let mut h0 = [0u8; 20];
        HashAlg::Sha1.digest_into(&[&0u32.to_be_bytes(), &s0[..20]], &mut h0);
        let mut h1 = [0u8; 20];
        HashAlg::Sha1.digest_into(&[&1u32.to_be_bytes(), &s0[20..]], &mut h1);
        d[..20].copy_from_slice(&h0);
        d[20..].copy_from_slice(&h1[..12]);
        let s1: Vec<u8> = d.iter().zip(key).map(|(a, b)| a ^ b).collect();
        assert_eq!(&m[32..], &s1[..]);
    }

    #[test]
    fn merge_refuses_short_material() {
        assert!(merge(&[0u8; 100], 32, 4000, HashAlg::Sha256).is_err());
        assert!(split(&[0u8; 32], 0, HashAlg::Sha256).is_err());
    }

    #[test]
    fn sectors_match_cryptsetup() {
        // 512-bit key: 4000 × 64 = 256000 bytes = 500 sectors; 256-bit: 250.
        assert_eq!(split_sectors(64, 4000), 500);
        assert_eq!(split_sectors(32, 4000), 250);
        assert_eq!(split_sectors(20, 4000), 157);
    }
}
