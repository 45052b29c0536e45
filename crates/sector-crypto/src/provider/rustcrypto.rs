//! Pure-Rust provider over RustCrypto's block ciphers: the `aes` crate (AES-NI / VAES detected
//! at run time) and the other 128-bit block ciphers (serpent, twofish, camellia, cast6, sm4,
//! kuznyechik)
//! in XTS, CBC and ECB (twofish is our own table-driven one, `crate::twofish`, with the same
//! traits). Other modes and the 64-bit block ciphers are in `generic.rs`.
//!
//! XTS is done here by hand rather than with `xts-mode`, which encrypts one block at a time:
//! inside the cipher backend (entered once per call, see [`XtsPass`]) the tweaks of a full
//! parallel batch are computed, XORed in, the batch is encrypted, and the tweaks are XORed out
//! again; batches span sector boundaries. CBC decryption is batched the same way. CBC
//! encryption is serial within a sector, so it runs many sectors side by side, one per lane of
//! the backend's batch ([`CbcEncPass`]). Key schedules are zeroized on drop (`aes` feature
//! `zeroize`).

use aes::cipher::array::ArraySize;
use aes::cipher::consts::U16;
use aes::cipher::typenum::Unsigned;
use aes::cipher::{
    Array, BlockCipherDecBackend, BlockCipherDecClosure, BlockCipherDecrypt, BlockCipherEncBackend,
    BlockCipherEncClosure, BlockCipherEncrypt, BlockSizeUser, KeyInit,
};
use aes::{Aes128, Aes192, Aes256};

use super::{Block, BlockEncrypt, SectorMode};
use crate::CryptoError;

/// A RustCrypto block cipher this provider instantiates its modes with.
pub(crate) trait AnyCipher:
    BlockCipherEncrypt + BlockCipherDecrypt + KeyInit + Send + Sync + 'static
{
    /// Name in implementation strings, e.g. `aes256` or `serpent`.
    const NAME: &'static str;
}

/// A 128-bit block cipher (XTS, and the batched CBC and ECB here).
pub(crate) trait Aes: AnyCipher + BlockSizeUser<BlockSize = U16> {}
impl<C: AnyCipher + BlockSizeUser<BlockSize = U16>> Aes for C {}

macro_rules! any_cipher {
    ($($t:ty => $name:literal),* $(,)?) => {
        $(impl AnyCipher for $t {
            const NAME: &'static str = $name;
        })*
    };
}
any_cipher! {
    Aes128 => "aes128", Aes192 => "aes192", Aes256 => "aes256",
    serpent::Serpent => "serpent", crate::twofish::Twofish => "twofish",
    camellia::Camellia128 => "camellia128", camellia::Camellia192 => "camellia192",
    camellia::Camellia256 => "camellia256", cast6::Cast6 => "cast6", sm4::Sm4 => "sm4",
    kuznyechik::Kuznyechik => "kuznyechik",
    cast5::Cast5 => "cast5", blowfish::Blowfish => "blowfish", des::TdesEde3 => "des3_ede",
}

/// Calls `$f::<C>($args...)` with `C` the implementation of `$cipher` for a key of `$len`
/// bytes (AES and Camellia have one type per key size). `by_cipher16!` knows the 128-bit
/// block ciphers, `by_cipher!` every cipher; both give `None` for any other.
macro_rules! by_cipher16 {
    ($cipher:expr, $len:expr, $f:ident ( $($arg:expr),* ) $(, $($extra:tt)*)?) => {{
        use crate::spec::Cipher as K;
        match ($cipher, $len) {
            (K::Aes, 16) => $f::<aes::Aes128>($($arg),*),
            (K::Aes, 24) => $f::<aes::Aes192>($($arg),*),
            (K::Aes, 32) => $f::<aes::Aes256>($($arg),*),
            (K::Camellia, 16) => $f::<camellia::Camellia128>($($arg),*),
            (K::Camellia, 24) => $f::<camellia::Camellia192>($($arg),*),
            (K::Camellia, 32) => $f::<camellia::Camellia256>($($arg),*),
            (K::Serpent, _) => $f::<serpent::Serpent>($($arg),*),
            (K::Twofish, _) => $f::<crate::twofish::Twofish>($($arg),*),
            (K::Cast6, _) => $f::<cast6::Cast6>($($arg),*),
            (K::Sm4, _) => $f::<sm4::Sm4>($($arg),*),
            (K::Kuznyechik, _) => $f::<kuznyechik::Kuznyechik>($($arg),*),
            $($($extra)*)?
            _ => None,
        }
    }};
}
pub(crate) use by_cipher16;

macro_rules! by_cipher {
    ($cipher:expr, $len:expr, $f:ident ( $($arg:expr),* )) => {
        crate::provider::rustcrypto::by_cipher16!($cipher, $len, $f($($arg),*),
            (K::Cast5, _) => $f::<cast5::Cast5>($($arg),*),
            (K::Blowfish, _) => $f::<blowfish::Blowfish>($($arg),*),
            (K::Des3Ede, _) => $f::<des::TdesEde3>($($arg),*),
        )
    };
}
pub(crate) use by_cipher;

type AesBlock = Array<u8, U16>;

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

pub(crate) fn key_of<C: KeyInit>(key: &[u8]) -> Option<C> {
    C::new_from_slice(key).ok()
}

/// XTS-AES with two independent key schedules.
pub(crate) struct Xts<C: Aes> {
    data: C,
    tweak: C,
    name: String,
}

/// Walks the XTS tweaks of consecutive units block by block: `T₀ = E_K2(iv)`, `Tⱼ₊₁ = Tⱼ·α`.
struct TweakWalk<'a> {
    /// Encrypted initial tweaks, one per unit.
    init: &'a [u128],
    blocks_per_unit: usize,
    unit: usize,
    j: usize,
    t: u128,
}

impl TweakWalk<'_> {
    #[inline(always)]
    fn next(&mut self) -> u128 {
        if self.j == 0 {
            self.t = self.init[self.unit];
        }
        let r = self.t;
        self.t = mul_alpha(self.t);
        self.j += 1;
        if self.j == self.blocks_per_unit {
            self.j = 0;
            self.unit += 1;
        }
        r
    }
}

/// One XTS pass over whole units, run inside the cipher backend so that the round keys are
/// loaded once per call and full parallel batches (64 blocks with VAES-512) span sector
/// boundaries: a 512-byte sector alone (32 blocks) would never fill one.
struct XtsPass<'a> {
    blocks: &'a mut [AesBlock],
    walk: TweakWalk<'a>,
}

impl BlockSizeUser for XtsPass<'_> {
    type BlockSize = U16;
}

impl XtsPass<'_> {
    #[inline(always)]
    fn run<P: ArraySize>(
        mut self,
        mut par: impl FnMut(&mut Array<AesBlock, P>),
        mut one: impl FnMut(&mut AesBlock),
    ) {
        let (pars, tail) = Array::<AesBlock, P>::slice_as_chunks_mut(self.blocks);
        let mut tweaks = Array::<u128, P>::default();
        for p in pars {
            for (b, t) in p.iter_mut().zip(tweaks.iter_mut()) {
                *t = self.walk.next();
                store(b, load(b) ^ *t);
            }
            par(p);
            for (b, t) in p.iter_mut().zip(tweaks.iter()) {
                store(b, load(b) ^ t);
            }
        }
        for b in tail {
            let t = self.walk.next();
            store(b, load(b) ^ t);
            one(b);
            store(b, load(b) ^ t);
        }
    }
}

impl BlockCipherEncClosure for XtsPass<'_> {
    fn call<B: BlockCipherEncBackend<BlockSize = U16>>(self, backend: &B) {
        self.run::<B::ParBlocksSize>(
            |p| backend.encrypt_par_blocks_inplace(p),
            |b| backend.encrypt_block_inplace(b),
        );
    }
}

impl BlockCipherDecClosure for XtsPass<'_> {
    fn call<B: BlockCipherDecBackend<BlockSize = U16>>(self, backend: &B) {
        self.run::<B::ParBlocksSize>(
            |p| backend.decrypt_par_blocks_inplace(p),
            |b| backend.decrypt_block_inplace(b),
        );
    }
}

/// Units per group whose initial tweaks are encrypted together.
const GROUP: usize = 32;

impl<C: Aes> Xts<C> {
    fn run(&self, data: &mut [u8], unit: usize, ivs: &[Block], encrypt: bool) -> Result<(), CryptoError> {
        check(data, unit, ivs)?;
        for (chunk, ivs) in data.chunks_mut(unit * GROUP).zip(ivs.chunks(GROUP)) {
            let n = chunk.len() / unit;
            let mut t0 = [AesBlock::default(); GROUP];
            for (t, iv) in t0.iter_mut().zip(&ivs[..n]) {
                *t = AesBlock::from(*iv);
            }
            self.tweak.encrypt_blocks(&mut t0[..n]);
            let mut init = [0u128; GROUP];
            for (i, t) in init.iter_mut().zip(&t0[..n]) {
                *i = load(t);
            }
            let pass = XtsPass {
                blocks: as_blocks(chunk),
                walk: TweakWalk { init: &init[..n], blocks_per_unit: unit / 16, unit: 0, j: 0, t: 0 },
            };
            if encrypt {
                self.data.encrypt_with_backend(pass);
            } else {
                self.data.decrypt_with_backend(pass);
            }
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
    fn name(&self) -> &str {
        &self.name
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
pub(crate) fn xts(cipher: crate::Cipher, key: &[u8]) -> Option<Box<dyn SectorMode>> {
    fn make<C: Aes>(key: &[u8]) -> Option<Box<dyn SectorMode>> {
        let (k1, k2) = key.split_at(key.len() / 2);
        Some(Box::new(Xts::<C> {
            data: key_of(k1)?,
            tweak: key_of(k2)?,
            name: format!("rustcrypto xts({})", C::NAME),
        }))
    }
    if key.len() % 2 != 0 {
        return None;
    }
    by_cipher16!(cipher, key.len() / 2, make(key))
}

/// CBC encryption of whole units. Serial within a unit, but units are independent: when
/// enough units are at hand to fill a quarter of the backend's parallel batch, block `j` of
/// up to a batch's worth of units goes through the cipher together ("multi-buffer"), one lane
/// per unit. Otherwise blocks go through one by one.
struct CbcEncPass<'a> {
    data: &'a mut [u8],
    unit: usize,
    ivs: &'a [Block],
}

impl BlockSizeUser for CbcEncPass<'_> {
    type BlockSize = U16;
}

impl BlockCipherEncClosure for CbcEncPass<'_> {
    fn call<B: BlockCipherEncBackend<BlockSize = U16>>(self, backend: &B) {
        let lanes_max = <B::ParBlocksSize as Unsigned>::USIZE;
        let bpu = self.unit / 16;
        let units_per_group = self.unit * lanes_max;
        for (group, ivs) in self.data.chunks_mut(units_per_group).zip(self.ivs.chunks(lanes_max)) {
            let lanes = group.len() / self.unit;
            if lanes < 2 || lanes * 4 < lanes_max {
                for (u, iv) in group.chunks_exact_mut(self.unit).zip(ivs) {
                    let mut prev = u128::from_le_bytes(*iv);
                    for b in as_blocks(u) {
                        store(b, load(b) ^ prev);
                        backend.encrypt_block_inplace(b);
                        prev = load(b);
                    }
                }
                continue;
            }
            let blocks = as_blocks(group);
            let mut par = Array::<AesBlock, B::ParBlocksSize>::default();
            for (k, iv) in ivs[..lanes].iter().enumerate() {
                store(&mut par[k], u128::from_le_bytes(*iv));
            }
            for j in 0..bpu {
                // par[k] holds the previous ciphertext block of lane k.
                for k in 0..lanes {
                    let b = &blocks[k * bpu + j];
                    let prev = load(&par[k]);
                    store(&mut par[k], load(b) ^ prev);
                }
                backend.encrypt_par_blocks_inplace(&mut par);
                for k in 0..lanes {
                    blocks[k * bpu + j] = par[k];
                }
            }
        }
    }
}

/// CBC decryption: `Pᵢ = D(Cᵢ) ⊕ Cᵢ₋₁` is parallel, so full backend batches span units; the
/// ciphertext of each batch is saved first to chain with.
struct CbcDecPass<'a> {
    blocks: &'a mut [AesBlock],
    blocks_per_unit: usize,
    ivs: &'a [Block],
}

impl BlockSizeUser for CbcDecPass<'_> {
    type BlockSize = U16;
}

impl BlockCipherDecClosure for CbcDecPass<'_> {
    fn call<B: BlockCipherDecBackend<BlockSize = U16>>(self, backend: &B) {
        let bpu = self.blocks_per_unit;
        let mut idx = 0usize; // flat block index
        let mut carry = 0u128; // ciphertext of the block before the current batch
        let (pars, tail) = Array::<AesBlock, B::ParBlocksSize>::slice_as_chunks_mut(self.blocks);
        let mut saved = Array::<u128, B::ParBlocksSize>::default();
        for p in pars {
            for (s, b) in saved.iter_mut().zip(p.iter()) {
                *s = load(b);
            }
            backend.decrypt_par_blocks_inplace(p);
            for (k, b) in p.iter_mut().enumerate() {
                let prev = if (idx + k) % bpu == 0 {
                    u128::from_le_bytes(self.ivs[(idx + k) / bpu])
                } else if k == 0 {
                    carry
                } else {
                    saved[k - 1]
                };
                store(b, load(b) ^ prev);
            }
            idx += saved.len();
            carry = saved[saved.len() - 1];
        }
        for b in tail {
            let c = load(b);
            backend.decrypt_block_inplace(b);
            let prev = if idx % bpu == 0 { u128::from_le_bytes(self.ivs[idx / bpu]) } else { carry };
            store(b, load(b) ^ prev);
            carry = c;
            idx += 1;
        }
    }
}

/// CBC with one key schedule per direction (the `aes` crate keeps both).
pub(crate) struct Cbc<C: Aes>(C, String);

impl<C: Aes> SectorMode for Cbc<C> {
    fn encrypt(&self, data: &mut [u8], unit: usize, ivs: &[Block]) -> Result<(), CryptoError> {
        check(data, unit, ivs)?;
        self.0.encrypt_with_backend(CbcEncPass { data, unit, ivs });
        Ok(())
    }

    fn decrypt(&self, data: &mut [u8], unit: usize, ivs: &[Block]) -> Result<(), CryptoError> {
        check(data, unit, ivs)?;
        self.0.decrypt_with_backend(CbcDecPass { blocks: as_blocks(data), blocks_per_unit: unit / 16, ivs });
        Ok(())
    }

    fn name(&self) -> &str {
        &self.1
    }
}

pub(crate) fn cbc(cipher: crate::Cipher, key: &[u8]) -> Option<Box<dyn SectorMode>> {
    fn make<C: Aes>(key: &[u8]) -> Option<Box<dyn SectorMode>> {
        Some(Box::new(Cbc::<C>(key_of(key)?, format!("rustcrypto cbc({})", C::NAME))))
    }
    by_cipher16!(cipher, key.len(), make(key))
}

/// ECB: no IV.
pub(crate) struct Ecb<C: Aes>(C, String);

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
    fn name(&self) -> &str {
        &self.1
    }
}

pub(crate) fn ecb(cipher: crate::Cipher, key: &[u8]) -> Option<Box<dyn SectorMode>> {
    fn make<C: Aes>(key: &[u8]) -> Option<Box<dyn SectorMode>> {
        Some(Box::new(Ecb::<C>(key_of(key)?, format!("rustcrypto ecb({})", C::NAME))))
    }
    by_cipher16!(cipher, key.len(), make(key))
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
    fn name(&self) -> &str {
        "ecb(cipher_null)"
    }
}

/// Independent block encryption of the first `block_size` bytes of each [`Block`], for ESSIV.
pub(crate) struct Blocks<C: AnyCipher>(C);

impl<C: AnyCipher> BlockEncrypt for Blocks<C> {
    fn encrypt_blocks(&self, blocks: &mut [Block]) {
        let bs = <C::BlockSize as Unsigned>::USIZE;
        if bs == 16 {
            // One cipher block per Block: all at once (pipelined with AES-NI).
            let (all, _) = Array::<u8, C::BlockSize>::slice_as_chunks_mut(blocks.as_flattened_mut());
            self.0.encrypt_blocks(all);
            return;
        }
        for b in blocks {
            let (one, _) = Array::<u8, C::BlockSize>::slice_as_chunks_mut(&mut b[..bs]);
            self.0.encrypt_blocks(one);
        }
    }
}

/// A block encryptor for `cipher` keyed with `key` (`None` if the cipher does not take it).
pub(crate) fn blocks(cipher: crate::Cipher, key: &[u8]) -> Option<Box<dyn BlockEncrypt>> {
    fn make<C: AnyCipher>(key: &[u8]) -> Option<Box<dyn BlockEncrypt>> {
        Some(Box::new(Blocks::<C>(key_of(key)?)))
    }
    if !cipher.accepts_key_len(key.len()) {
        return None;
    }
    by_cipher!(cipher, key.len(), make(key))
}
