//! An independent, deliberately naive reference for dm-crypt sector encryption: IVs computed
//! by hand from the kernel's definitions, one sector at a time, with RustCrypto's `xts-mode`
//! and `cbc` crates (not the code paths `SectorCipher` uses).

use aes::cipher::{Array, BlockCipherEncrypt, BlockModeDecrypt, BlockModeEncrypt, KeyInit, KeyIvInit};
use aes::{Aes128, Aes192, Aes256};
use sector_crypto::{ChainMode, IvMode, SectorParams};
use sha2::{Digest, Sha256};
use xts_mode::Xts128;

/// The kernel's `iv_sector` of the crypto sector starting at 512-byte sector `sector`.
pub fn iv_sector(sector: u64, p: &SectorParams) -> u64 {
    let cc = sector.wrapping_add(p.iv_offset);
    if p.iv_large_sectors {
        cc >> (p.sector_size / 512).trailing_zeros()
    } else {
        cc
    }
}

/// The IV of one crypto sector, straight from the kernel's `crypt_iv_*_gen` definitions.
pub fn iv(iv: IvMode, mode: ChainMode, key: &[u8], s: u64, sector_size: u32) -> [u8; 16] {
    let mut out = [0u8; 16];
    match iv {
        IvMode::Plain => out[..4].copy_from_slice(&((s & 0xffff_ffff) as u32).to_le_bytes()),
        IvMode::Plain64 => out[..8].copy_from_slice(&s.to_le_bytes()),
        IvMode::Plain64Be => out[8..].copy_from_slice(&s.to_be_bytes()),
        IvMode::Benbi => out[8..].copy_from_slice(&((s << 5).wrapping_add(1)).to_be_bytes()),
        IvMode::Null => {}
        IvMode::Essiv(_) => {
            let salt = Sha256::digest(key);
            let c = Aes256::new_from_slice(&salt).unwrap();
            let mut b = Array::from([0u8; 16]);
            b[..8].copy_from_slice(&s.to_le_bytes());
            c.encrypt_block(&mut b);
            out = b.into();
        }
        IvMode::Eboiv => {
            // Encrypt one zero block with the data cipher, IV = le64(iv_sector * sector_size).
            let mut off = [0u8; 16];
            off[..8].copy_from_slice(&s.wrapping_mul(u64::from(sector_size)).to_le_bytes());
            encrypt(mode, key, &off, &mut out);
        }
        other => panic!("reference has no IV generator {other:?}"),
    }
    out
}

fn xts<
    C: BlockCipherEncrypt
        + aes::cipher::BlockCipherDecrypt
        + KeyInit
        + aes::cipher::BlockSizeUser<BlockSize = aes::cipher::consts::U16>,
>(
    key: &[u8],
) -> Xts128<C> {
    let (a, b) = key.split_at(key.len() / 2);
    Xts128::new(C::new_from_slice(a).unwrap(), C::new_from_slice(b).unwrap())
}

macro_rules! by_key_len {
    ($len:expr, $f:ident, $($arg:expr),*) => {
        match $len {
            16 => $f::<Aes128>($($arg),*),
            24 => $f::<Aes192>($($arg),*),
            32 => $f::<Aes256>($($arg),*),
            n => panic!("bad AES key length {n}"),
        }
    };
}

fn cbc_enc<C>(key: &[u8], iv: &[u8; 16], data: &mut [u8])
where
    C: BlockCipherEncrypt + KeyInit + aes::cipher::BlockSizeUser<BlockSize = aes::cipher::consts::U16>,
{
    let mut e = cbc::Encryptor::<C>::new_from_slices(key, iv).unwrap();
    let (blocks, rest) = Array::slice_as_chunks_mut(data);
    assert!(rest.is_empty());
    e.encrypt_blocks(blocks);
}

fn cbc_dec<C>(key: &[u8], iv: &[u8; 16], data: &mut [u8])
where
    C: aes::cipher::BlockCipherDecrypt
        + KeyInit
        + aes::cipher::BlockSizeUser<BlockSize = aes::cipher::consts::U16>,
{
    let mut d = cbc::Decryptor::<C>::new_from_slices(key, iv).unwrap();
    let (blocks, rest) = Array::slice_as_chunks_mut(data);
    assert!(rest.is_empty());
    d.decrypt_blocks(blocks);
}

fn ecb_enc<
    C: BlockCipherEncrypt + KeyInit + aes::cipher::BlockSizeUser<BlockSize = aes::cipher::consts::U16>,
>(
    key: &[u8],
    data: &mut [u8],
) {
    let c = C::new_from_slice(key).unwrap();
    for b in data.chunks_exact_mut(16) {
        let mut a = Array::try_from(&*b).unwrap();
        c.encrypt_block(&mut a);
        b.copy_from_slice(&a);
    }
}

fn ecb_dec<
    C: aes::cipher::BlockCipherDecrypt
        + KeyInit
        + aes::cipher::BlockSizeUser<BlockSize = aes::cipher::consts::U16>,
>(
    key: &[u8],
    data: &mut [u8],
) {
    let c = C::new_from_slice(key).unwrap();
    for b in data.chunks_exact_mut(16) {
        let mut a = Array::try_from(&*b).unwrap();
        c.decrypt_block(&mut a);
        b.copy_from_slice(&a);
    }
}

/// Encrypts one crypto sector with AES in `mode` (`key` empty = cipher_null).
pub fn encrypt(mode: ChainMode, key: &[u8], iv: &[u8; 16], data: &mut [u8]) {
    if key.is_empty() {
        return;
    }
    match mode {
        ChainMode::Xts => match key.len() {
            32 => xts::<Aes128>(key).encrypt_sector(data, (*iv).into()),
            48 => xts::<Aes192>(key).encrypt_sector(data, (*iv).into()),
            64 => xts::<Aes256>(key).encrypt_sector(data, (*iv).into()),
            n => panic!("bad XTS key length {n}"),
        },
        ChainMode::Cbc => by_key_len!(key.len(), cbc_enc, key, iv, data),
        ChainMode::Ecb => by_key_len!(key.len(), ecb_enc, key, data),
        other => panic!("reference has no mode {other:?}"),
    }
}

/// Decrypts one crypto sector.
pub fn decrypt(mode: ChainMode, key: &[u8], iv: &[u8; 16], data: &mut [u8]) {
    if key.is_empty() {
        return;
    }
    match mode {
        ChainMode::Xts => match key.len() {
            32 => xts::<Aes128>(key).decrypt_sector(data, (*iv).into()),
            48 => xts::<Aes192>(key).decrypt_sector(data, (*iv).into()),
            64 => xts::<Aes256>(key).decrypt_sector(data, (*iv).into()),
            n => panic!("bad XTS key length {n}"),
        },
        ChainMode::Cbc => by_key_len!(key.len(), cbc_dec, key, iv, data),
        ChainMode::Ecb => by_key_len!(key.len(), ecb_dec, key, data),
        other => panic!("reference has no mode {other:?}"),
    }
}

/// Deterministic test bytes (xorshift64*), so failures reproduce.
pub fn pattern(len: usize, seed: u64) -> Vec<u8> {
    let mut x = seed | 1;
    (0..len)
        .map(|_| {
            x ^= x >> 12;
            x ^= x << 25;
            x ^= x >> 27;
            (x.wrapping_mul(0x2545_f491_4f6c_dd1d) >> 56) as u8
        })
        .collect()
}
