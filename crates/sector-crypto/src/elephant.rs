//! BitLocker's Elephant diffuser (AES-CBC + diffuser, Windows Vista/7 volumes), as the
//! kernel's `elephant` IV generator runs it around CBC (N. Ferguson, "AES-CBC + Elephant
//! diffuser: A Disk Encryption Algorithm for Windows Vista", Microsoft, 2006):
//!
//! ```text
//!   encrypt:  P ⊕ sector key → diffuser A → diffuser B → AES-CBC (IV: eboiv)
//!   decrypt:  AES-CBC⁻¹ → diffuser B⁻¹ → diffuser A⁻¹ → ⊕ sector key
//! ```
//! The sector key is 32 bytes, `E_tweak(le64(offset) ‖ 0⁸) ‖ E_tweak(le64(offset) ‖ 0⁷ ‖
//! 0x80)` for the sector's byte offset, repeated over the sector. The diffusers work on
//! the sector as little-endian 32-bit words `d[0..n]`, indices mod n:
//!
//! ```text
//!   A (5 cycles, R = 9 0 13 0):   d[i] ±= d[i−2] ⊕ rotl(d[i−5], R[i mod 4])
//!   B (3 cycles, R = 0 10 0 25):  d[i] ±= d[i+2] ⊕ rotl(d[i+5], R[i mod 4])
//! ```
//! The decryption direction runs i upwards adding; encryption runs i downwards subtracting.

const A_ROT: [u32; 4] = [9, 0, 13, 0];
const B_ROT: [u32; 4] = [0, 10, 0, 25];
const A_CYCLES: usize = 5;
const B_CYCLES: usize = 3;

fn words(sector: &[u8]) -> Vec<u32> {
    sector.chunks_exact(4).map(|c| u32::from_le_bytes([c[0], c[1], c[2], c[3]])).collect()
}

fn store(sector: &mut [u8], d: &[u32]) {
    for (c, w) in sector.chunks_exact_mut(4).zip(d) {
        c.copy_from_slice(&w.to_le_bytes());
    }
}

/// Diffuser A or B over `d`: `near`/`far` are the offsets (−2/−5 for A, +2/+5 for B).
fn diffuse(d: &mut [u32], cycles: usize, rot: &[u32; 4], near: usize, far: usize, encrypt: bool) {
    let n = d.len();
    if n < 8 {
        return;
    }
    let step = |d: &mut [u32], i: usize| {
        let k = i % n;
        let v = d[(k + near) % n] ^ d[(k + far) % n].rotate_left(rot[i % 4]);
        d[k] = if encrypt { d[k].wrapping_sub(v) } else { d[k].wrapping_add(v) };
    };
    if encrypt {
        for i in (0..cycles * n).rev() {
            step(d, i);
        }
    } else {
        for i in 0..cycles * n {
            step(d, i);
        }
    }
}

/// Diffuser A in the encryption direction over one sector (a multiple of 4 bytes).
pub(crate) fn diffuser_a_encrypt(sector: &mut [u8]) {
    let mut d = words(sector);
    let n = d.len();
    diffuse(&mut d, A_CYCLES, &A_ROT, n.wrapping_sub(2) % n.max(1), n.wrapping_sub(5) % n.max(1), true);
    store(sector, &d);
}

/// Diffuser A in the decryption direction.
pub(crate) fn diffuser_a_decrypt(sector: &mut [u8]) {
    let mut d = words(sector);
    let n = d.len();
    diffuse(&mut d, A_CYCLES, &A_ROT, n.wrapping_sub(2) % n.max(1), n.wrapping_sub(5) % n.max(1), false);
    store(sector, &d);
}

/// Diffuser B in the encryption direction.
pub(crate) fn diffuser_b_encrypt(sector: &mut [u8]) {
    let mut d = words(sector);
    diffuse(&mut d, B_CYCLES, &B_ROT, 2, 5, true);
    store(sector, &d);
}

/// Diffuser B in the decryption direction.
pub(crate) fn diffuser_b_decrypt(sector: &mut [u8]) {
    let mut d = words(sector);
    diffuse(&mut d, B_CYCLES, &B_ROT, 2, 5, false);
    store(sector, &d);
}

/// XORs the 32-byte sector key over the sector.
pub(crate) fn xor_sector_key(sector: &mut [u8], key: &[u8; 32]) {
    for c in sector.chunks_mut(32) {
        for (x, k) in c.iter_mut().zip(key) {
            *x ^= k;
        }
    }
}

/// The plaintext side before CBC encryption.
pub(crate) fn before_encrypt(sector: &mut [u8], key: &[u8; 32]) {
    xor_sector_key(sector, key);
    diffuser_a_encrypt(sector);
    diffuser_b_encrypt(sector);
}

/// The plaintext side after CBC decryption.
pub(crate) fn after_decrypt(sector: &mut [u8], key: &[u8; 32]) {
    diffuser_b_decrypt(sector);
    diffuser_a_decrypt(sector);
    xor_sector_key(sector, key);
}

#[cfg(test)]
mod tests {
    use sha2::{Digest, Sha256};

    use super::*;

    // Known answers published with dissect.fve's test suite (tests/crypto/test_elephant.py,
    // AGPL-3; only the hashes are used): SHA-256 of 512 bytes of 'a' after each diffuser.
    const A_VECTOR: &str = "f58aa15c1219f893c4ed355d363d8f831bcc0c4a82c6bbffcca321aada9e86ec";
    const B_VECTOR: &str = "1d5a51ae0d0b6309f1f8661376af9ebd880b1274601f6841f5aaeb5273580133";

    #[test]
    fn diffusers_match_known_answers_and_invert() {
        let mut s = vec![b'a'; 512];
        diffuser_a_encrypt(&mut s);
        assert_eq!(hex::encode(Sha256::digest(&s)), A_VECTOR);
        diffuser_a_decrypt(&mut s);
        assert_eq!(s, vec![b'a'; 512]);
        diffuser_b_encrypt(&mut s);
        assert_eq!(hex::encode(Sha256::digest(&s)), B_VECTOR);
        diffuser_b_decrypt(&mut s);
        assert_eq!(s, vec![b'a'; 512]);
    }

    #[test]
    fn whole_transform_inverts_on_4k() {
        let orig: Vec<u8> = (0..4096u32).map(|i| (i * 7 + 3) as u8).collect();
        let key = [0x5a; 32];
        let mut s = orig.clone();
        before_encrypt(&mut s, &key);
        assert_ne!(s, orig);
        after_decrypt(&mut s, &key);
        assert_eq!(s, orig);
    }
}
