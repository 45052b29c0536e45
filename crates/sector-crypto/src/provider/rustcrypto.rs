//! Pure-Rust provider over the RustCrypto `aes` crate (AES-NI / VAES detected at run time).
//!
//! XTS is done here by hand rather than with `xts-mode`, which encrypts one block at a time:
//! tweaks for a batch of blocks are computed first, XORed in, the batch goes through the
//! cipher's parallel `encrypt_blocks`, and the tweaks are XORed out again. Key schedules are
//! zeroized on drop (`aes` feature `zeroize`).

use aes::cipher::{Array, BlockCipherDecrypt, BlockCipherEncrypt, BlockSizeUser, KeyInit};
use aes::{Aes128, Aes192, Aes256};

use super::{Block, BlockEncrypt, SectorMode};
use crate::CryptoError;

/// Blocks per batch: tweaks for 32 blocks (512 bytes) stay in registers/L1.
const BATCH: usize = 32;

/// The AES implementations this provider instantiates its modes with.
pub(crate) trait Aes:
    BlockCipherEncrypt
    + BlockCipherDecrypt
    + BlockSizeUser<BlockSize = aes::cipher::consts::U16>
    + KeyInit
    + Send
    + Sync
    + 'static
{
    const NAME_XTS: &'static str;
    const NAME_CBC: &'static str;
    const NAME_ECB: &'static str;
}

impl Aes for Aes128 {
    const NAME_XTS: &'static str = "rustcrypto xts(aes128)";
    const NAME_CBC: &'static str = "rustcrypto cbc(aes128)";
    const NAME_ECB: &'static str = "rustcrypto ecb(aes128)";
}

impl Aes for Aes192 {
    const NAME_XTS: &'static str = "rustcrypto xts(aes192)";
    const NAME_CBC: &'static str = "rustcrypto cbc(aes192)";
    const NAME_ECB: &'static str = "rustcrypto ecb(aes192)";
}

impl Aes for Aes256 {
    const NAME_XTS: &'static str = "rustcrypto xts(aes256)";
    const NAME_CBC: &'static str = "rustcrypto cbc(aes256)";
    const NAME_ECB: &'static str = "rustcrypto ecb(aes256)";
}

type AesBlock = Array<u8, aes::cipher::consts::U16>;

/// Views a byte slice whose length is a multiple of 16 as cipher blocks.
fn as_blocks(data: &mut [u8]) -> &mut [AesBlock] {
    let (blocks, rest) = Array::slice_as_chunks_mut(data);
    debug_assert!(rest.is_empty(), "data not a multiple of the block size");
    blocks
}

#[inline(always)]
fn load(b: &AesBlock) -> u128 {
    let a: [u8; 16] = (*b).into();
    u128::from_le_bytes(a)
}

#[inline(always)]
fn store(b: &mut AesBlock, v: u128) {
    *b = v.to_le_bytes().into();
}

/// Multiplies an XTS tweak by α in GF(2¹²⁸) (IEEE 1619 §5.2: little-endian byte order,
/// reduction polynomial x¹²⁸ + x⁷ + x² + x + 1).
#[inline(always)]
fn mul_alpha(t: u128) -> u128 {
    (t << 1) ^ ((t >> 127).wrapping_neg() & 0x87)
}

fn key_of<C: Aes>(key: &[u8]) -> Option<C> {
    C::new_from_slice(key).ok()
}

/// XTS-AES with two independent key schedules.
pub(crate) struct Xts<C: Aes> {
    data: C,
    tweak: C,
}

impl<C: Aes> Xts<C> {
    fn unit(&self, iv: &Block, unit: &mut [u8], encrypt: bool) {
        let mut t = AesBlock::from(*iv);
        self.tweak.encrypt_block(&mut t);
        let mut t = load(&t);
        let mut tweaks = [0u128; BATCH];
        for chunk in as_blocks(unit).chunks_mut(BATCH) {
            for (b, tw) in chunk.iter_mut().zip(tweaks.iter_mut()) {
                *tw = t;
                store(b, load(b) ^ t);
                t = mul_alpha(t);
            }
            if encrypt {
                self.data.encrypt_blocks(chunk);
            } else {
                self.data.decrypt_blocks(chunk);
            }
            for (b, tw) in chunk.iter_mut().zip(tweaks.iter()) {
                store(b, load(b) ^ tw);
            }
        }
    }

    fn run(&self, data: &mut [u8], unit: usize, ivs: &[Block], encrypt: bool) -> Result<(), CryptoError> {
        check(data, unit, ivs)?;
        for (u, iv) in data.chunks_exact_mut(unit).zip(ivs) {
            self.unit(iv, u, encrypt);
        }
        Ok(())
    }
}

impl<C: Aes> SectorMode for Xts<C> {
    fn encrypt(&self, data: &mut [u8], unit: usize, ivs: &[Block]) -> Result<(), CryptoError> {
        self.run(data, unit, ivs, true)
    }
    fn decrypt(&self, data: &mut [u8], unit: usize, ivs: &[Block]) -> Result<(), CryptoError> {
        self.run(data, unit, ivs, false)
    }
    fn name(&self) -> &'static str {
        C::NAME_XTS
    }
}

fn check(data: &[u8], unit: usize, ivs: &[Block]) -> Result<(), CryptoError> {
    if unit == 0 || unit % 16 != 0 || data.len() % unit != 0 || ivs.len() < data.len() / unit {
        return Err(CryptoError::Provider { op: "mode called with a malformed unit layout" });
    }
    Ok(())
}

fn check_blocks(data: &[u8]) -> Result<(), CryptoError> {
    if data.len() % 16 != 0 {
        return Err(CryptoError::Provider { op: "ecb called with a partial block" });
    }
    Ok(())
}

/// XTS with `key = data key ‖ tweak key` (the kernel's and IEEE 1619's order). Equal halves are
/// accepted, as by the non-FIPS kernel.
pub(crate) fn xts(key: &[u8]) -> Option<Box<dyn SectorMode>> {
    let (k1, k2) = key.split_at(key.len() / 2);
    match key.len() {
        32 => Some(Box::new(Xts::<Aes128> { data: key_of(k1)?, tweak: key_of(k2)? })),
        48 => Some(Box::new(Xts::<Aes192> { data: key_of(k1)?, tweak: key_of(k2)? })),
        64 => Some(Box::new(Xts::<Aes256> { data: key_of(k1)?, tweak: key_of(k2)? })),
        _ => None,
    }
}

/// CBC: encryption is inherently serial; decryption runs in parallel batches.
pub(crate) struct Cbc<C: Aes>(C);

impl<C: Aes> SectorMode for Cbc<C> {
    fn encrypt(&self, data: &mut [u8], unit: usize, ivs: &[Block]) -> Result<(), CryptoError> {
        check(data, unit, ivs)?;
        for (u, iv) in data.chunks_exact_mut(unit).zip(ivs) {
            let mut prev = u128::from_le_bytes(*iv);
            for b in as_blocks(u) {
                store(b, load(b) ^ prev);
                self.0.encrypt_block(b);
                prev = load(b);
            }
        }
        Ok(())
    }

    fn decrypt(&self, data: &mut [u8], unit: usize, ivs: &[Block]) -> Result<(), CryptoError> {
        check(data, unit, ivs)?;
        let mut saved = [0u128; BATCH];
        for (u, iv) in data.chunks_exact_mut(unit).zip(ivs) {
            let mut prev = u128::from_le_bytes(*iv);
            for chunk in as_blocks(u).chunks_mut(BATCH) {
                for (s, b) in saved.iter_mut().zip(chunk.iter()) {
                    *s = load(b);
                }
                self.0.decrypt_blocks(chunk);
                for (b, c) in chunk.iter_mut().zip(saved.iter()) {
                    store(b, load(b) ^ prev);
                    prev = *c;
                }
            }
        }
        Ok(())
    }

    fn name(&self) -> &'static str {
        C::NAME_CBC
    }
}

pub(crate) fn cbc(key: &[u8]) -> Option<Box<dyn SectorMode>> {
    match key.len() {
        16 => Some(Box::new(Cbc::<Aes128>(key_of(key)?))),
        24 => Some(Box::new(Cbc::<Aes192>(key_of(key)?))),
        32 => Some(Box::new(Cbc::<Aes256>(key_of(key)?))),
        _ => None,
    }
}

/// ECB: no IV.
pub(crate) struct Ecb<C: Aes>(C);

impl<C: Aes> SectorMode for Ecb<C> {
    fn encrypt(&self, data: &mut [u8], unit: usize, _ivs: &[Block]) -> Result<(), CryptoError> {
        let _ = unit;
        check_blocks(data)?;
        self.0.encrypt_blocks(as_blocks(data));
        Ok(())
    }
    fn decrypt(&self, data: &mut [u8], unit: usize, _ivs: &[Block]) -> Result<(), CryptoError> {
        let _ = unit;
        check_blocks(data)?;
        self.0.decrypt_blocks(as_blocks(data));
        Ok(())
    }
    fn name(&self) -> &'static str {
        C::NAME_ECB
    }
}

pub(crate) fn ecb(key: &[u8]) -> Option<Box<dyn SectorMode>> {
    match key.len() {
        16 => Some(Box::new(Ecb::<Aes128>(key_of(key)?))),
        24 => Some(Box::new(Ecb::<Aes192>(key_of(key)?))),
        32 => Some(Box::new(Ecb::<Aes256>(key_of(key)?))),
        _ => None,
    }
}

/// The kernel's `ecb(cipher_null)`: leaves data as it is.
pub(crate) struct Null;

impl SectorMode for Null {
    fn encrypt(&self, _data: &mut [u8], _unit: usize, _ivs: &[Block]) -> Result<(), CryptoError> {
        Ok(())
    }
    fn decrypt(&self, _data: &mut [u8], _unit: usize, _ivs: &[Block]) -> Result<(), CryptoError> {
        Ok(())
    }
    fn name(&self) -> &'static str {
        "ecb(cipher_null)"
    }
}

/// Independent block encryption, for ESSIV.
pub(crate) struct AesBlocks<C: Aes>(C);

impl<C: Aes> BlockEncrypt for AesBlocks<C> {
    fn encrypt_blocks(&self, blocks: &mut [Block]) {
        self.0.encrypt_blocks(Array::cast_slice_from_core_mut(blocks));
    }
}

pub(crate) fn aes_blocks(key: &[u8]) -> Option<Box<dyn BlockEncrypt>> {
    match key.len() {
        16 => Some(Box::new(AesBlocks::<Aes128>(key_of(key)?))),
        24 => Some(Box::new(AesBlocks::<Aes192>(key_of(key)?))),
        32 => Some(Box::new(AesBlocks::<Aes256>(key_of(key)?))),
        _ => None,
    }
}
