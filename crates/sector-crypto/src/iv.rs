//! IV generators, computed for a batch of sectors at once.
//!
//! Every generator is the kernel's `crypt_iv_*_gen` (drivers/md/dm-crypt.c) for an IV of
//! `iv_size` bytes (16 for 128-bit block ciphers and XTS/LRW, 8 for 64-bit block ciphers in
//! CBC/PCBC/CTR); a [`Block`] holds it in its first `iv_size` bytes. Most are a function of
//! `iv_sector` only (plus, for ESSIV and EBOIV, a key); batching lets ESSIV encrypt all IVs
//! of a request with one pipelined call. Two also touch the data, as their kernel `post`
//! hooks do:
//!
//! ```text
//!            encrypt                                    decrypt
//!   lmk      IV = lmk(plaintext) → encrypt              IV = 0 → decrypt → P[0..iv] ^= lmk(plaintext)
//!   tcw      IV = seed ⊕ sector → encrypt → whiten      unwhiten → IV = seed ⊕ sector → decrypt
//! ```

use zeroize::{Zeroize, Zeroizing};

use crate::provider::{self, Block, BlockEncrypt, SectorMode};
use crate::spec::{Cipher, CipherSpec, IvMode, KeyLayout, LMK_SEED, TCW_WHITENING};
use crate::CryptoError;

/// What an IV generator needs to know about the cipher it serves.
#[derive(Debug, Clone, Copy)]
pub(crate) struct IvSetup {
    /// The generator, `None` when the mode takes no IV.
    pub(crate) iv: Option<IvMode>,
    /// The kernel's `iv_size`.
    pub(crate) iv_size: usize,
    /// The mode's block size (`crypto_skcipher_blocksize`): benbi counts in it.
    pub(crate) mode_block: usize,
    /// The block cipher (ESSIV keys another instance of it).
    pub(crate) cipher: Cipher,
    /// Encryption sector size in bytes.
    pub(crate) sector_size: u32,
}

/// A keyed IV generator.
pub(crate) struct IvGen {
    kind: Kind,
    iv_size: usize,
}

enum Kind {
    /// The mode takes no IV (ECB).
    None,
    Plain,
    Plain64,
    Plain64Be,
    /// `shift` = 9 − log2(mode block size).
    Benbi {
        shift: u32,
    },
    Null,
    /// The IV cipher keyed with `hash(subkey)`, one per subkey: each of the kernel's tfms is
    /// its own `essiv(...)` instance keyed with its subkey.
    Essiv(Vec<Box<dyn BlockEncrypt>>),
    /// Byte offset encrypted by the data mode itself (needs the sector size).
    Eboiv {
        sector_size: u64,
    },
    /// BitLocker: eboiv IVs, and the sector-key cipher keyed with the key's second half.
    Elephant {
        sector_size: u64,
        tweak: Box<dyn BlockEncrypt>,
    },
    /// loop-AES: the seed (version 3), zero padded to 64 bytes.
    Lmk {
        seed: Option<Zeroizing<[u8; LMK_SEED]>>,
    },
    /// TrueCrypt: IV seed and whitening key.
    Tcw {
        seed: Zeroizing<[u8; 16]>,
        whitening: Zeroizing<[u8; TCW_WHITENING]>,
    },
}

impl IvGen {
    /// An AES generator over `key` (the whole volume key, as the kernel's `essiv(...)`
    /// template hashes it), with 16-byte IVs: what the authenc(xts(aes)) path needs.
    pub(crate) fn new(iv: Option<IvMode>, key: &[u8], sector_size: u32) -> Result<Self, CryptoError> {
        let setup = IvSetup { iv, iv_size: 16, mode_block: 16, cipher: Cipher::Aes, sector_size };
        Self::keyed(setup, key, None)
    }

    /// The generator of `spec` for volume key `key` split as `layout`.
    pub(crate) fn for_spec(
        spec: &CipherSpec,
        key: &[u8],
        layout: KeyLayout,
        sector_size: u32,
    ) -> Result<Self, CryptoError> {
        let setup = IvSetup {
            iv: spec.effective_iv_mode(),
            iv_size: spec.iv_size(),
            mode_block: spec.mode_block_size(),
            cipher: spec.cipher(),
            sector_size,
        };
        Self::keyed(setup, key, Some(layout))
    }

    fn keyed(s: IvSetup, key: &[u8], layout: Option<KeyLayout>) -> Result<Self, CryptoError> {
        let needs_512 = |what: &str| {
            if s.sector_size == 512 {
                Ok(())
            } else {
                Err(CryptoError::InvalidParams(format!(
                    "IV generator {what} needs 512-byte sectors (the kernel's \"Unsupported sector size for {}\")",
                    what.to_uppercase()
                )))
            }
        };
        let kind = match s.iv {
            None => Kind::None,
            Some(IvMode::Plain) => Kind::Plain,
            Some(IvMode::Plain64) => Kind::Plain64,
            Some(IvMode::Plain64Be) => Kind::Plain64Be,
            Some(IvMode::Benbi) => {
                let log = s.mode_block.trailing_zeros();
                if !s.mode_block.is_power_of_two() || log > 9 {
                    return Err(CryptoError::InvalidParams("benbi: cipher block size".into()));
                }
                Kind::Benbi { shift: 9 - log }
            }
            Some(IvMode::Null) => Kind::Null,
            Some(IvMode::Eboiv) => Kind::Eboiv { sector_size: u64::from(s.sector_size) },
            Some(IvMode::Elephant) => {
                let layout = layout.ok_or(CryptoError::Provider { op: "elephant without a key layout" })?;
                let at = layout.keycount * layout.subkey;
                let tweak_key =
                    key.get(at..at + layout.extra).ok_or(CryptoError::Provider { op: "elephant key" })?;
                let tweak = provider::block_encryptor(s.cipher, tweak_key)
                    .ok_or(CryptoError::InvalidParams("elephant: key size".into()))?;
                Kind::Elephant { sector_size: u64::from(s.sector_size), tweak }
            }
            Some(IvMode::Essiv(h)) => {
                let subkeys: Vec<&[u8]> = match layout {
                    Some(l) if l.keycount > 1 => {
                        key[..l.keycount * l.subkey].chunks_exact(l.subkey).collect()
                    }
                    _ => vec![key],
                };
                let mut encs = Vec::with_capacity(subkeys.len());
                for subkey in subkeys {
                    // The salt is hash(subkey) (at most 64 bytes), truncated for wp256/wp384 as
                    // the kernel's shash of that name is; it keys another instance of the
                    // data cipher.
                    let mut buf = Zeroizing::new([0u8; 64]);
                    let salt = &mut buf[..h.digest_len()];
                    h.hash().digest_into(&[subkey], salt);
                    encs.push(provider::block_encryptor(s.cipher, salt).ok_or_else(|| {
                        CryptoError::InvalidParams(format!(
                            "ESSIV: {} does not take a {}-bit key (the {} digest)",
                            s.cipher.name(),
                            h.digest_len() * 8,
                            h.name()
                        ))
                    })?);
                }
                Kind::Essiv(encs)
            }
            Some(IvMode::Lmk) => {
                needs_512("lmk")?;
                let layout = layout.ok_or(CryptoError::Provider { op: "lmk without a key layout" })?;
                let seed = if layout.extra == 0 {
                    None
                } else {
                    // crypt_iv_lmk_init: the seed is the part after the subkeys, of which only
                    // the MD5 digest size (16 bytes) is copied; the 64-byte buffer hashed
                    // before each sector is zero beyond that.
                    let at = layout.keycount * layout.subkey;
                    let part = key.get(at..at + layout.extra.min(LMK_SEED_COPIED));
                    let part = part.ok_or(CryptoError::Provider { op: "lmk seed outside the key" })?;
                    let mut seed = Zeroizing::new([0u8; LMK_SEED]);
                    seed[..part.len()].copy_from_slice(part);
                    Some(seed)
                };
                Kind::Lmk { seed }
            }
            Some(IvMode::Tcw) => {
                needs_512("tcw")?;
                // tcw_init: the key ends with the IV seed (iv_size bytes) and the whitening key.
                let at = key
                    .len()
                    .checked_sub(s.iv_size + TCW_WHITENING)
                    .ok_or(CryptoError::Provider { op: "tcw key too short" })?;
                let mut seed = Zeroizing::new([0u8; 16]);
                seed[..s.iv_size].copy_from_slice(&key[at..at + s.iv_size]);
                let mut whitening = Zeroizing::new([0u8; TCW_WHITENING]);
                whitening.copy_from_slice(&key[at + s.iv_size..]);
                Kind::Tcw { seed, whitening }
            }
        };
        Ok(IvGen { kind, iv_size: s.iv_size })
    }

    /// Fills `out[i]` with the IV of `iv_sectors[i]` for generators that depend on the sector
    /// only (for lmk: the zero IV of a read). `mode` is the data mode (for EBOIV).
    pub(crate) fn fill(
        &self,
        iv_sectors: &[u64],
        out: &mut [Block],
        mode: &dyn SectorMode,
    ) -> Result<(), CryptoError> {
        self.fill_keyed(iv_sectors, None, out, mode)
    }

    /// [`Self::fill`] for sector `i` using subkey `keys[i]` (ESSIV with a keycount); `None`:
    /// all use subkey 0.
    pub(crate) fn fill_keyed(
        &self,
        iv_sectors: &[u64],
        keys: Option<&[usize]>,
        out: &mut [Block],
        mode: &dyn SectorMode,
    ) -> Result<(), CryptoError> {
        debug_assert_eq!(iv_sectors.len(), out.len());
        let n = self.iv_size;
        let pairs = out.iter_mut().zip(iv_sectors.iter().copied());
        match &self.kind {
            Kind::None | Kind::Null | Kind::Lmk { .. } => out.fill([0; 16]),
            Kind::Plain => {
                for (iv, s) in pairs {
                    *iv = [0; 16];
                    iv[..4].copy_from_slice(&(s as u32).to_le_bytes());
                }
            }
            Kind::Plain64 => {
                for (iv, s) in pairs {
                    *iv = [0; 16];
                    iv[..8].copy_from_slice(&s.to_le_bytes());
                }
            }
            Kind::Plain64Be => {
                for (iv, s) in pairs {
                    *iv = [0; 16];
                    iv[n - 8..n].copy_from_slice(&s.to_be_bytes());
                }
            }
            Kind::Benbi { shift } => {
                // The narrow-block count from 1, big-endian in the IV's last 8 bytes.
                for (iv, s) in pairs {
                    *iv = [0; 16];
                    iv[n - 8..n].copy_from_slice(&(s << shift).wrapping_add(1).to_be_bytes());
                }
            }
            Kind::Essiv(encs) => {
                for (iv, s) in pairs {
                    *iv = [0; 16];
                    iv[..8].copy_from_slice(&s.to_le_bytes());
                }
                match keys {
                    Some(keys) if encs.len() > 1 => {
                        for (iv, k) in out.iter_mut().zip(keys) {
                            let enc = encs.get(*k).ok_or(CryptoError::Provider { op: "essiv key index" })?;
                            enc.encrypt_blocks(std::slice::from_mut(iv));
                        }
                    }
                    _ => encs[0].encrypt_blocks(out),
                }
            }
            Kind::Eboiv { sector_size } | Kind::Elephant { sector_size, .. } => {
                // The kernel encrypts a zero block (iv_size bytes) with the data skcipher, IV =
                // le64 of `iv_sector * sector_size` (u64 arithmetic: wraps, and is a true byte
                // offset only with iv_large_sectors).
                let mut offsets = [[0u8; 16]; crate::IV_BATCH];
                let offsets = &mut offsets[..out.len()];
                for (o, s) in offsets.iter_mut().zip(iv_sectors) {
                    o[..8].copy_from_slice(&s.wrapping_mul(*sector_size).to_le_bytes());
                }
                let mut zeros = [0u8; 16 * crate::IV_BATCH];
                let zeros = &mut zeros[..out.len() * n];
                mode.encrypt(zeros, n, offsets)?;
                for (iv, z) in out.iter_mut().zip(zeros.chunks_exact(n)) {
                    *iv = [0; 16];
                    iv[..n].copy_from_slice(z);
                }
            }
            Kind::Tcw { seed, .. } => {
                for (iv, s) in pairs {
                    *iv = [0; 16];
                    let le = s.to_le_bytes();
                    for i in 0..n {
                        iv[i] = seed[i] ^ le[i % 8];
                    }
                }
            }
        }
        Ok(())
    }

    /// The IVs for encrypting `plaintext` (one `unit` per sector): [`Self::fill`], except lmk,
    /// which hashes each sector's plaintext.
    pub(crate) fn fill_for_encrypt(
        &self,
        iv_sectors: &[u64],
        keys: Option<&[usize]>,
        out: &mut [Block],
        mode: &dyn SectorMode,
        plaintext: &[u8],
        unit: usize,
    ) -> Result<(), CryptoError> {
        match &self.kind {
            Kind::Lmk { seed } => {
                for ((iv, s), p) in out.iter_mut().zip(iv_sectors).zip(plaintext.chunks_exact(unit)) {
                    *iv = [0; 16];
                    let h = lmk_hash(seed.as_deref(), p, *s);
                    iv[..self.iv_size].copy_from_slice(&h[..self.iv_size]);
                }
                Ok(())
            }
            _ => self.fill_keyed(iv_sectors, keys, out, mode),
        }
    }

    /// Whether [`Self::before_encrypt`] rewrites the plaintext (elephant), so that encrypting
    /// from one buffer into another must first copy it.
    pub(crate) fn rewrites_plaintext(&self) -> bool {
        matches!(self.kind, Kind::Elephant { .. })
    }

    /// Before encryption: elephant XORs the sector key and runs diffusers A and B over the
    /// plaintext.
    pub(crate) fn before_encrypt(&self, iv_sectors: &[u64], data: &mut [u8], unit: usize) {
        if let Kind::Elephant { sector_size, tweak } = &self.kind {
            for (d, s) in data.chunks_exact_mut(unit).zip(iv_sectors) {
                let key = elephant_sector_key(tweak.as_ref(), s.wrapping_mul(*sector_size));
                crate::elephant::before_encrypt(d, &key);
            }
        }
    }

    /// After encryption: tcw whitens the ciphertext.
    pub(crate) fn after_encrypt(&self, iv_sectors: &[u64], data: &mut [u8], unit: usize) {
        if let Kind::Tcw { whitening, .. } = &self.kind {
            for (d, s) in data.chunks_exact_mut(unit).zip(iv_sectors) {
                tcw_whiten(whitening, *s, d);
            }
        }
    }

    /// Before decryption: tcw removes the whitening.
    pub(crate) fn before_decrypt(&self, iv_sectors: &[u64], data: &mut [u8], unit: usize) {
        // Whitening is an XOR: the same operation removes it.
        self.after_encrypt(iv_sectors, data, unit);
    }

    /// After decryption: lmk XORs the IV of the recovered plaintext into its first block.
    pub(crate) fn after_decrypt(&self, iv_sectors: &[u64], data: &mut [u8], unit: usize) {
        if let Kind::Elephant { sector_size, tweak } = &self.kind {
            for (d, s) in data.chunks_exact_mut(unit).zip(iv_sectors) {
                let key = elephant_sector_key(tweak.as_ref(), s.wrapping_mul(*sector_size));
                crate::elephant::after_decrypt(d, &key);
            }
        }
        if let Kind::Lmk { seed } = &self.kind {
            for (d, s) in data.chunks_exact_mut(unit).zip(iv_sectors) {
                let h = lmk_hash(seed.as_deref(), d, *s);
                for (x, y) in d[..self.iv_size].iter_mut().zip(&h[..self.iv_size]) {
                    *x ^= y;
                }
            }
        }
    }
}

/// The Elephant sector key for byte `offset`: `E(le64(offset) ‖ 0⁸) ‖ E(le64(offset) ‖ 0⁷ ‖ 0x80)`.
fn elephant_sector_key(tweak: &dyn BlockEncrypt, offset: u64) -> Zeroizing<[u8; 32]> {
    let mut blocks = Zeroizing::new([[0u8; 16]; 2]);
    blocks[0][..8].copy_from_slice(&offset.to_le_bytes());
    blocks[1][..8].copy_from_slice(&offset.to_le_bytes());
    blocks[1][15] = 0x80;
    tweak.encrypt_blocks(&mut blocks[..]);
    let mut key = Zeroizing::new([0u8; 32]);
    key[..16].copy_from_slice(&blocks[0]);
    key[16..].copy_from_slice(&blocks[1]);
    key
}

/// Bytes of the lmk seed key that reach the seed buffer (`crypto_shash_digestsize(md5)`).
const LMK_SEED_COPIED: usize = 16;

/// MD5's initial state (RFC 1321 §3.3).
const MD5_INIT: [u32; 4] = [0x6745_2301, 0xefcd_ab89, 0x98ba_dcfe, 0x1032_5476];

/// The kernel's `crypt_iv_lmk_one` for a 512-byte sector: MD5 compression, without padding
/// or length, over `seed` (if any), the sector's blocks 1..31 (bytes 16..512) and a 16-byte
/// trailer; the 16-byte result is the state words in little-endian order.
fn lmk_hash(seed: Option<&[u8; LMK_SEED]>, sector: &[u8], iv_sector: u64) -> [u8; 16] {
    let mut state = MD5_INIT;
    if let Some(seed) = seed {
        md5::block_api::compress(&mut state, std::slice::from_ref(seed));
    }
    let mut buf = Zeroizing::new([[0u8; 64]; 8]);
    let flat = buf.as_flattened_mut();
    flat[..496].copy_from_slice(&sector[16..512]);
    // The sector number is cropped to 56 bits.
    flat[496..500].copy_from_slice(&(iv_sector as u32).to_le_bytes());
    flat[500..504].copy_from_slice(&((((iv_sector >> 32) as u32) & 0x00ff_ffff) | 0x8000_0000).to_le_bytes());
    flat[504..508].copy_from_slice(&4024u32.to_le_bytes());
    md5::block_api::compress(&mut state, &buf[..]);
    let mut out = [0u8; 16];
    for (o, w) in out.chunks_exact_mut(4).zip(state) {
        o.copy_from_slice(&w.to_le_bytes());
    }
    state.zeroize();
    out
}

/// The kernel's `crc32` shash (`crc32_le` seeded with 0, no final inversion), which is the
/// complement of the usual CRC-32 run from the complemented seed.
fn crc32_kernel(data: &[u8]) -> u32 {
    let mut h = crc32fast::Hasher::new_with_initial(!0);
    h.update(data);
    !h.finalize()
}

/// The kernel's `crypt_iv_tcw_whitening`: XOR each 8 bytes of the 512-byte sector with a
/// value derived from the whitening key and the sector number by CRC32s.
fn tcw_whiten(whitening: &[u8; TCW_WHITENING], iv_sector: u64, data: &mut [u8]) {
    let s = iv_sector.to_le_bytes();
    let mut buf = Zeroizing::new([0u8; TCW_WHITENING]);
    for i in 0..8 {
        buf[i] = whitening[i] ^ s[i];
        buf[8 + i] = whitening[8 + i] ^ s[i];
    }
    for i in 0..4 {
        let c = crc32_kernel(&buf[4 * i..4 * i + 4]);
        buf[4 * i..4 * i + 4].copy_from_slice(&c.to_le_bytes());
    }
    for i in 0..4 {
        buf[i] ^= buf[12 + i];
        buf[4 + i] ^= buf[8 + i];
    }
    for chunk in data.chunks_exact_mut(8) {
        for (x, y) in chunk.iter_mut().zip(&buf[..8]) {
            *x ^= y;
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Bit-by-bit `crc32_le(seed, data)`, the kernel's lib/crc32.c definition (polynomial
    /// 0xedb88320, no inversions).
    fn crc32_le_bitwise(mut crc: u32, data: &[u8]) -> u32 {
        for &b in data {
            crc ^= u32::from(b);
            for _ in 0..8 {
                crc = (crc >> 1) ^ (0xedb8_8320 & (crc & 1).wrapping_neg());
            }
        }
        crc
    }

    #[test]
    fn kernel_crc32_is_crc32_le_from_zero() {
        for data in [&b""[..], b"\x01\x02\x03\x04", b"\xff\xff\xff\xff", b"123456789"] {
            assert_eq!(crc32_kernel(data), crc32_le_bitwise(0, data), "{data:?}");
        }
        // The usual CRC-32 of "123456789" is 0xcbf43926 = !crc32_le(!0, ...).
        assert_eq!(!crc32_le_bitwise(!0, b"123456789"), 0xcbf4_3926);
    }

    #[test]
    fn md5_compress_matches_md5_of_a_padded_message() {
        // MD5("") is the compression of one padding block: 0x80, zeros, length 0.
        let mut state = MD5_INIT;
        let mut block = [0u8; 64];
        block[0] = 0x80;
        md5::block_api::compress(&mut state, &[block]);
        let mut out = [0u8; 16];
        for (o, w) in out.chunks_exact_mut(4).zip(state) {
            o.copy_from_slice(&w.to_le_bytes());
        }
        assert_eq!(hex::encode(out), "d41d8cd98f00b204e9800998ecf8427e");
    }
}
