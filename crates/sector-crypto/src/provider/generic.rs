//! Chain modes over any RustCrypto block cipher, one block at a time: LRW, CTR and PCBC for
//! every cipher, CBC and ECB for the 64-bit block ciphers (cast5, blowfish, des3_ede). The
//! 128-bit ciphers' XTS, CBC and ECB are the batched ones in `rustcrypto.rs`.
//!
//! Each follows the kernel's crypto API template of the same name (`crypto/lrw.c`,
//! `crypto/ctr.c`, `crypto/pcbc.c`, `crypto/cbc.c`), whose IV is the first `block_size`
//! bytes of the dm-crypt IV:
//!
//! ```text
//!   cbc   Cᵢ = E(Pᵢ ⊕ Cᵢ₋₁)                 C₋₁ = IV
//!   pcbc  Cᵢ = E(Pᵢ ⊕ Pᵢ₋₁ ⊕ Cᵢ₋₁)          P₋₁ ⊕ C₋₁ = IV
//!   ctr   Cᵢ = Pᵢ ⊕ E(IV + i)               IV a big-endian integer of block_size bytes
//!   lrw   Cᵢ = E(Pᵢ ⊕ Tᵢ) ⊕ Tᵢ, Tᵢ = K₂ ⊗ (IV + i)   in GF(2¹²⁸), IV a big-endian index
//! ```

use aes::cipher::typenum::Unsigned;
use aes::cipher::Array;
use zeroize::Zeroize;

use super::rustcrypto::{by_cipher, key_of, AnyCipher};
use super::{Block, SectorMode};
use crate::spec::{ChainMode, LRW_TWEAK_KEY};
use crate::{Cipher, CryptoError};

/// Multiplication in GF(2¹²⁸) in the kernel's "bbe" convention (`gf128mul_64k_bbe`, the
/// one LRW uses): an element is a big-endian 128-bit integer whose bit `k` is the
/// coefficient of `xᵏ`, reduced by `x¹²⁸ + x⁷ + x² + x + 1`.
pub(crate) fn gf128_mul_bbe(a: u128, b: u128) -> u128 {
    let (mut a, mut b, mut r) = (a, b, 0u128);
    while b != 0 {
        if b & 1 == 1 {
            r ^= a;
        }
        a = (a << 1) ^ ((a >> 127).wrapping_neg() & 0x87);
        b >>= 1;
    }
    r
}

/// LRW's tweak key and its multiples used to step the tweak from block index `i` to `i + 1`:
/// `i ⊕ (i + 1) = 2ᵏ⁺¹ − 1` where `k` is the number of trailing one bits of `i`, so
/// `Tᵢ₊₁ = Tᵢ ⊕ K₂ ⊗ (2ᵏ⁺¹ − 1)` (the kernel's `mulinc` table).
struct LrwKey {
    k2: u128,
    mulinc: [u128; 128],
}

impl LrwKey {
    fn new(k2: &[u8]) -> Option<Box<Self>> {
        let k2 = u128::from_be_bytes(k2.try_into().ok()?);
        let mut mulinc = [0u128; 128];
        for (k, m) in mulinc.iter_mut().enumerate() {
            let ones = if k == 127 { u128::MAX } else { (1u128 << (k + 1)) - 1 };
            *m = gf128_mul_bbe(k2, ones);
        }
        Some(Box::new(LrwKey { k2, mulinc }))
    }
}

impl Drop for LrwKey {
    fn drop(&mut self) {
        self.k2.zeroize();
        self.mulinc.zeroize();
    }
}

/// One chain mode over cipher `C`, block by block.
pub(crate) struct Generic<C: AnyCipher> {
    cipher: C,
    mode: ChainMode,
    lrw: Option<Box<LrwKey>>,
    name: String,
}

fn xor(a: &mut [u8], b: &[u8]) {
    for (x, y) in a.iter_mut().zip(b) {
        *x ^= y;
    }
}

/// Adds one to a big-endian counter (the kernel's `crypto_inc`).
fn increment_be(ctr: &mut [u8]) {
    for b in ctr.iter_mut().rev() {
        *b = b.wrapping_add(1);
        if *b != 0 {
            break;
        }
    }
}

impl<C: AnyCipher> Generic<C> {
    fn run(&self, data: &mut [u8], unit: usize, ivs: &[Block], encrypt: bool) -> Result<(), CryptoError> {
        let bs = <C::BlockSize as Unsigned>::USIZE;
        if unit == 0 || unit % bs != 0 || data.len() % unit != 0 || ivs.len() < data.len() / unit {
            return Err(CryptoError::Provider { op: "mode called with a malformed unit layout" });
        }
        for (u, iv) in data.chunks_exact_mut(unit).zip(ivs) {
            let (blocks, _) = Array::<u8, C::BlockSize>::slice_as_chunks_mut(u);
            let mut prev = Array::<u8, C::BlockSize>::default();
            prev.copy_from_slice(&iv[..bs]);
            match (self.mode, encrypt) {
                (ChainMode::Ecb, true) => self.cipher.encrypt_blocks(blocks),
                (ChainMode::Ecb, false) => self.cipher.decrypt_blocks(blocks),
                (ChainMode::Cbc, true) => {
                    for b in blocks {
                        xor(b, &prev);
                        self.cipher.encrypt_block(b);
                        prev.copy_from_slice(b);
                    }
                }
                (ChainMode::Cbc, false) => {
                    for b in blocks {
                        let c = b.clone();
                        self.cipher.decrypt_block(b);
                        xor(b, &prev);
                        prev = c;
                    }
                }
                (ChainMode::Pcbc, true) => {
                    for b in blocks {
                        let p = b.clone();
                        xor(b, &prev);
                        self.cipher.encrypt_block(b);
                        prev.copy_from_slice(b);
                        xor(&mut prev, &p);
                    }
                }
                (ChainMode::Pcbc, false) => {
                    for b in blocks {
                        let c = b.clone();
                        self.cipher.decrypt_block(b);
                        xor(b, &prev);
                        prev = c;
                        xor(&mut prev, b);
                    }
                }
                (ChainMode::Ctr, _) => {
                    for b in blocks {
                        let mut ks = prev.clone();
                        self.cipher.encrypt_block(&mut ks);
                        xor(b, &ks);
                        increment_be(&mut prev);
                    }
                }
                (ChainMode::Lrw, _) => {
                    let lrw =
                        self.lrw.as_ref().ok_or(CryptoError::Provider { op: "lrw without a tweak key" })?;
                    let mut index = u128::from_be_bytes(*iv);
                    let mut t = gf128_mul_bbe(lrw.k2, index);
                    for b in blocks {
                        let tb = t.to_be_bytes();
                        xor(b, &tb);
                        if encrypt {
                            self.cipher.encrypt_block(b);
                        } else {
                            self.cipher.decrypt_block(b);
                        }
                        xor(b, &tb);
                        t ^= lrw.mulinc[(index.trailing_ones() as usize).min(127)];
                        index = index.wrapping_add(1);
                    }
                    t.zeroize();
                }
                (ChainMode::Xts | ChainMode::Adiantum | ChainMode::Hctr2, _) => {
                    return Err(CryptoError::Provider { op: "not a generic block-by-block mode" })
                }
            }
        }
        Ok(())
    }
}

impl<C: AnyCipher> SectorMode for Generic<C> {
    fn encrypt(&self, data: &mut [u8], unit: usize, ivs: &[Block]) -> Result<(), CryptoError> {
        self.run(data, unit, ivs, true)
    }
    fn decrypt(&self, data: &mut [u8], unit: usize, ivs: &[Block]) -> Result<(), CryptoError> {
        self.run(data, unit, ivs, false)
    }
    fn name(&self) -> &str {
        &self.name
    }
}

/// `mode` over `cipher` keyed with `key` (for LRW, cipher key ‖ 16-byte tweak key); `None`
/// for XTS and the wide-block modes, for LRW with a 64-bit block cipher, or a key the cipher does not take.
pub(crate) fn mode(cipher: Cipher, mode: ChainMode, key: &[u8]) -> Option<Box<dyn SectorMode>> {
    fn make<C: AnyCipher>(key: &[u8], mode: ChainMode) -> Option<Box<dyn SectorMode>> {
        let (ck, lrw) = if mode == ChainMode::Lrw {
            if <C::BlockSize as Unsigned>::USIZE != 16 {
                return None;
            }
            let (ck, k2) = key.split_at(key.len() - LRW_TWEAK_KEY);
            (ck, Some(LrwKey::new(k2)?))
        } else {
            (key, None)
        };
        let name = format!("rustcrypto {}({})", mode.name(), C::NAME);
        Some(Box::new(Generic::<C> { cipher: key_of(ck)?, mode, lrw, name }))
    }
    if matches!(mode, ChainMode::Xts | ChainMode::Adiantum | ChainMode::Hctr2) {
        return None;
    }
    let ck = if mode == ChainMode::Lrw { key.len().checked_sub(LRW_TWEAK_KEY)? } else { key.len() };
    if !cipher.accepts_key_len(ck) {
        return None;
    }
    by_cipher!(cipher, ck, make(key, mode))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn gf128_bbe_multiplies_by_x_with_reduction() {
        assert_eq!(gf128_mul_bbe(1, 1), 1);
        assert_eq!(gf128_mul_bbe(0x1234, 2), 0x2468);
        // x¹²⁷ · x = x¹²⁸ = x⁷ + x² + x + 1.
        assert_eq!(gf128_mul_bbe(1 << 127, 2), 0x87);
        // Commutative and distributive on arbitrary values.
        let (a, b, c) = (0x0123_4567_89ab_cdef_fedc_ba98_7654_3210u128, 0xdead_beefu128 << 77, 0x55u128);
        assert_eq!(gf128_mul_bbe(a, b), gf128_mul_bbe(b, a));
        assert_eq!(gf128_mul_bbe(a, b ^ c), gf128_mul_bbe(a, b) ^ gf128_mul_bbe(a, c));
    }

    /// The first LRW-AES vector of the IEEE P1619 draft (Guyot, also in the kernel's
    /// testmgr and LibTomCrypt's `lrw_test`): block index 1, so the tweak is `K₂` itself.
    #[test]
    fn lrw_aes_matches_the_p1619_draft_vector() {
        let key = hex::decode("4562ac25f828176d4c268414b5680185258e2a05e73e9d03ee5a830ccc094c87").unwrap();
        let m = mode(Cipher::Aes, ChainMode::Lrw, &key).unwrap();
        let mut iv = [0u8; 16];
        iv[15] = 1;
        let mut data = b"0123456789ABCDEF".to_vec();
        m.encrypt(&mut data, 16, &[iv]).unwrap();
        assert_eq!(hex::encode(&data), "f1b273cd65a3df5fe95d489254634eb8");
        m.decrypt(&mut data, 16, &[iv]).unwrap();
        assert_eq!(data, b"0123456789ABCDEF");
        // The tweak steps by the mulinc table as by a full multiplication.
        let lrw = LrwKey::new(&key[16..]).unwrap();
        let mut t = gf128_mul_bbe(lrw.k2, 5);
        for i in 5u128..300 {
            assert_eq!(t, gf128_mul_bbe(lrw.k2, i));
            t ^= lrw.mulinc[i.trailing_ones() as usize];
        }
    }

    #[test]
    fn counter_increments_big_endian_with_carry() {
        let mut c = [0u8, 0, 0xff, 0xff];
        increment_be(&mut c);
        assert_eq!(c, [0, 1, 0, 0]);
        let mut m = [0xffu8; 8];
        increment_be(&mut m);
        assert_eq!(m, [0; 8]);
    }
}
