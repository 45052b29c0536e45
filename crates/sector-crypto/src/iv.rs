//! IV generators, computed for a batch of sectors at once.
//!
//! Every generator is a function of `iv_sector` only (plus, for ESSIV and EBOIV, a key), as in
//! the kernel's `crypt_iv_*_gen` (drivers/md/dm-crypt.c). Batching lets ESSIV encrypt all
//! IVs of a request with one pipelined `encrypt_blocks` call.

use zeroize::Zeroizing;

use crate::provider::{self, Block, BlockEncrypt, SectorMode};
use crate::spec::IvMode;
use crate::CryptoError;

/// A keyed IV generator.
pub(crate) enum IvGen {
    /// The mode takes no IV (ECB).
    None,
    Plain,
    Plain64,
    Plain64Be,
    Benbi,
    Null,
    /// The IV cipher keyed with `hash(volume key)`.
    Essiv(Box<dyn BlockEncrypt>),
    /// Byte offset encrypted by the data mode itself (needs the sector size).
    Eboiv {
        sector_size: u64,
    },
}

impl IvGen {
    /// Keys the generator. `key` is the whole volume key, as the kernel's `essiv(...)`
    /// template hashes it.
    pub(crate) fn new(iv: Option<IvMode>, key: &[u8], sector_size: u32) -> Result<Self, CryptoError> {
        Ok(match iv {
            None => IvGen::None,
            Some(IvMode::Plain) => IvGen::Plain,
            Some(IvMode::Plain64) => IvGen::Plain64,
            Some(IvMode::Plain64Be) => IvGen::Plain64Be,
            Some(IvMode::Benbi) => IvGen::Benbi,
            Some(IvMode::Null) => IvGen::Null,
            Some(IvMode::Eboiv) => IvGen::Eboiv { sector_size: u64::from(sector_size) },
            Some(IvMode::Essiv(h)) => {
                let mut salt = Zeroizing::new([0u8; 64]);
                let salt = &mut salt[..h.digest_len()];
                h.hash().digest_into(&[key], salt);
                IvGen::Essiv(provider::aes_blocks(salt).ok_or_else(|| {
                    CryptoError::InvalidParams(format!(
                        "ESSIV hash {} gives a {}-byte key, which aes does not take",
                        h.name(),
                        h.digest_len()
                    ))
                })?)
            }
        })
    }

    /// Fills `out[i]` with the IV of `iv_sectors[i]`. `mode` is the data mode (for EBOIV).
    pub(crate) fn fill(
        &self,
        iv_sectors: &[u64],
        out: &mut [Block],
        mode: &dyn SectorMode,
    ) -> Result<(), CryptoError> {
        debug_assert_eq!(iv_sectors.len(), out.len());
        let pairs = out.iter_mut().zip(iv_sectors.iter().copied());
        match self {
            IvGen::None | IvGen::Null => out.fill([0; 16]),
            IvGen::Plain => {
                for (iv, s) in pairs {
                    *iv = [0; 16];
                    iv[..4].copy_from_slice(&(s as u32).to_le_bytes());
                }
            }
            IvGen::Plain64 => {
                for (iv, s) in pairs {
                    *iv = [0; 16];
                    iv[..8].copy_from_slice(&s.to_le_bytes());
                }
            }
            IvGen::Plain64Be => {
                for (iv, s) in pairs {
                    *iv = [0; 16];
                    iv[8..].copy_from_slice(&s.to_be_bytes());
                }
            }
            IvGen::Benbi => {
                // shift = 9 - log2(cipher block size 16) = 5.
                for (iv, s) in pairs {
                    *iv = [0; 16];
                    iv[8..].copy_from_slice(&(s << 5).wrapping_add(1).to_be_bytes());
                }
            }
            IvGen::Essiv(cipher) => {
                for (iv, s) in pairs {
                    *iv = [0; 16];
                    iv[..8].copy_from_slice(&s.to_le_bytes());
                }
                cipher.encrypt_blocks(out);
            }
            IvGen::Eboiv { sector_size } => {
                // The kernel encrypts a zero block with the data skcipher, IV = le64 of
                // `iv_sector * sector_size` (u64 arithmetic: wraps, and is a true byte offset
                // only with iv_large_sectors).
                let mut offsets = [[0u8; 16]; crate::IV_BATCH];
                let offsets = &mut offsets[..out.len()];
                for (o, s) in offsets.iter_mut().zip(iv_sectors) {
                    o[..8].copy_from_slice(&s.wrapping_mul(*sector_size).to_le_bytes());
                }
                out.fill([0; 16]);
                mode.encrypt(out.as_flattened_mut(), 16, offsets)?;
            }
        }
        Ok(())
    }
}
