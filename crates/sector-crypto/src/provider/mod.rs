//! Crypto providers behind one small trait.
//!
//! ```text
//!   SectorCipher ──(ivs per sector)──► dyn SectorMode ─┬─ awslc::Xts256   EVP_aes_256_xts, pooled ctxs
//!        │                                             ├─ awslc::Cbc      AES_cbc_encrypt, immutable AES_KEYs
//!        │                                             ├─ rustcrypto::Xts  any 128-bit block cipher, batched tweaks
//!        │                                             ├─ rustcrypto::Cbc (multi-lane enc) / Ecb   (128-bit blocks)
//!        │                                             ├─ generic::Generic lrw, ctr, pcbc; cbc/ecb of 64-bit blocks
//!        │                                             ├─ Split: one implementation per direction
//!        │                                             └─ rustcrypto::Null (cipher_null)
//!        └──(ESSIV salt cipher)──► dyn BlockEncrypt ─── rustcrypto::Blocks (the data cipher)
//! ```
//!
//! A [`SectorMode`] is keyed once and then immutable from the caller's point of view: it is
//! `Send + Sync` and any number of threads may call it at once. Providers that need mutable
//! native state (an `EVP_CIPHER_CTX` holds the IV) keep a lock-free pool of contexts.
//!
//! [`Provider::Auto`] prefers aws-lc and falls back to RustCrypto where aws-lc lacks the
//! primitive: AES-128/192-XTS (aws-lc only has `EVP_aes_256_xts`), XTS keys whose two halves
//! are equal (aws-lc refuses them as FIPS requires; the non-FIPS kernel accepts them), and
//! ECB. For CBC it uses RustCrypto to encrypt and aws-lc to decrypt (see [`aes_cbc`]). Every
//! cipher but AES, and AES in LRW, CTR and PCBC, is RustCrypto's ([`mode`]).

use crate::CryptoError;

#[allow(unsafe_code)]
mod awslc;
mod generic;
mod rustcrypto;

use crate::spec::{ChainMode, Cipher};

pub(crate) use awslc::{EvpAead, AEAD_NONCE, AEAD_TAG};

/// One 16-byte cipher block (also an AES IV or XTS tweak).
pub(crate) type Block = [u8; 16];

/// A keyed length-preserving mode over whole data units (dm-crypt sectors).
///
/// Contract: `data.len()` is a non-zero multiple of `unit`, `unit` is a non-zero multiple of
/// 16, and `ivs` has one IV per unit (ignored by modes without an IV, which accept an empty
/// slice). Unit `i` is processed independently with `ivs[i]`, in place.
pub(crate) trait SectorMode: Send + Sync {
    /// Encrypts every unit of `data` in place.
    fn encrypt(&self, data: &mut [u8], unit: usize, ivs: &[Block]) -> Result<(), CryptoError>;
    /// Decrypts every unit of `data` in place.
    fn decrypt(&self, data: &mut [u8], unit: usize, ivs: &[Block]) -> Result<(), CryptoError>;
    /// Encrypts every unit of `src` into `dst` (same length): the ciphertext of
    /// [`Self::encrypt`] without touching `src`. The default copies, then encrypts in place;
    /// a provider that can read one buffer and write another in one pass overrides it.
    fn encrypt_to(&self, src: &[u8], dst: &mut [u8], unit: usize, ivs: &[Block]) -> Result<(), CryptoError> {
        dst.copy_from_slice(src);
        self.encrypt(dst, unit, ivs)
    }
    /// Implementation name, e.g. `aws-lc xts(aes256)`, for logs and benchmarks.
    fn name(&self) -> &str;
}

/// A keyed block cipher encrypting independent blocks (ECB), used for IV generation.
pub(crate) trait BlockEncrypt: Send + Sync {
    /// Encrypts the first `block_size` bytes of each block in place (all 16 for a 128-bit
    /// block cipher; the rest is left alone).
    fn encrypt_blocks(&self, blocks: &mut [Block]);
}

/// Which implementation of the primitives to use.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
#[non_exhaustive]
pub enum Provider {
    /// aws-lc where it has the primitive, RustCrypto otherwise (the default).
    #[default]
    Auto,
    /// aws-lc only: fails with [`CryptoError::Unsupported`] where it lacks the primitive.
    AwsLc,
    /// RustCrypto only (pure Rust).
    RustCrypto,
}

/// Unsupported-by-provider error.
fn lacks(provider: &str, what: &str) -> CryptoError {
    CryptoError::Unsupported {
        spec: what.to_string(),
        part: format!("provider {provider} does not implement {what} for this key"),
    }
}

/// AES in XTS mode with a 32, 48 or 64-byte key (two AES keys).
pub(crate) fn aes_xts(provider: Provider, key: &[u8]) -> Result<Box<dyn SectorMode>, CryptoError> {
    if provider != Provider::RustCrypto {
        if let Some(m) = awslc::Xts256::new(key) {
            return Ok(Box::new(m));
        }
        if provider == Provider::AwsLc {
            return Err(lacks("aws-lc", "xts(aes)"));
        }
    }
    rustcrypto::xts(Cipher::Aes, key).ok_or_else(|| lacks("rustcrypto", "xts(aes)"))
}

/// AES in CBC mode with a 16, 24 or 32-byte key.
///
/// `Auto` splits the directions: encryption by RustCrypto, which runs up to a backend batch
/// of sectors side by side (CBC is serial within a sector; aws-lc's `AES_cbc_encrypt` does one
/// sector at a time), decryption by aws-lc, whose parallel CBC decryption is faster.
pub(crate) fn aes_cbc(provider: Provider, key: &[u8]) -> Result<Box<dyn SectorMode>, CryptoError> {
    let aws = match provider {
        Provider::RustCrypto => None,
        _ => awslc::Cbc::new(key),
    };
    match (provider, aws) {
        (Provider::AwsLc, Some(m)) => Ok(Box::new(m)),
        (Provider::AwsLc, None) => Err(lacks("aws-lc", "cbc(aes)")),
        (_, Some(dec)) => {
            let enc = rustcrypto::cbc(Cipher::Aes, key).ok_or_else(|| lacks("rustcrypto", "cbc(aes)"))?;
            let name = match key.len() {
                16 => "cbc(aes128): rustcrypto multi-lane enc, aws-lc dec",
                24 => "cbc(aes192): rustcrypto multi-lane enc, aws-lc dec",
                _ => "cbc(aes256): rustcrypto multi-lane enc, aws-lc dec",
            };
            Ok(Box::new(Split { enc, dec: Box::new(dec), name }))
        }
        (_, None) => rustcrypto::cbc(Cipher::Aes, key).ok_or_else(|| lacks("rustcrypto", "cbc(aes)")),
    }
}

/// One implementation per direction (both keyed with the same key, so interchangeable).
struct Split {
    enc: Box<dyn SectorMode>,
    dec: Box<dyn SectorMode>,
    name: &'static str,
}

impl SectorMode for Split {
    fn encrypt(&self, data: &mut [u8], unit: usize, ivs: &[Block]) -> Result<(), CryptoError> {
        self.enc.encrypt(data, unit, ivs)
    }
    fn decrypt(&self, data: &mut [u8], unit: usize, ivs: &[Block]) -> Result<(), CryptoError> {
        self.dec.decrypt(data, unit, ivs)
    }
    fn name(&self) -> &str {
        self.name
    }
}

/// AES in ECB mode with a 16, 24 or 32-byte key.
pub(crate) fn aes_ecb(provider: Provider, key: &[u8]) -> Result<Box<dyn SectorMode>, CryptoError> {
    if provider == Provider::AwsLc {
        return Err(lacks("aws-lc", "ecb(aes)"));
    }
    rustcrypto::ecb(Cipher::Aes, key).ok_or_else(|| lacks("rustcrypto", "ecb(aes)"))
}

/// The kernel's `ecb(cipher_null)`: identity.
pub(crate) fn null_mode() -> Box<dyn SectorMode> {
    Box::new(rustcrypto::Null)
}

/// `chain` over `cipher` with one subkey `key` (a whole mode key: both XTS keys, LRW's
/// cipher and tweak key). AES in XTS, CBC and ECB goes through [`aes_xts`], [`aes_cbc`] and
/// [`aes_ecb`]; Adiantum and HCTR2 through `crate::wide`; everything else is RustCrypto's.
pub(crate) fn mode(
    provider: Provider,
    cipher: Cipher,
    chain: ChainMode,
    key: &[u8],
) -> Result<Box<dyn SectorMode>, CryptoError> {
    let what = format!("{}({})", chain.name(), cipher.name());
    match (cipher, chain) {
        (Cipher::CipherNull, _) => return Ok(null_mode()),
        (Cipher::Aes, ChainMode::Xts) => return aes_xts(provider, key),
        (Cipher::Aes, ChainMode::Cbc) => return aes_cbc(provider, key),
        (Cipher::Aes, ChainMode::Ecb) => return aes_ecb(provider, key),
        (Cipher::XChaCha12Aes, ChainMode::Adiantum) => {
            return crate::wide::adiantum(provider, crate::wide::XChaCha::R12, key)
        }
        (Cipher::XChaCha20Aes, ChainMode::Adiantum) => {
            return crate::wide::adiantum(provider, crate::wide::XChaCha::R20, key)
        }
        (Cipher::Aes, ChainMode::Hctr2) => return crate::wide::hctr2(provider, key),
        _ => {}
    }
    if provider == Provider::AwsLc {
        return Err(lacks("aws-lc", &what));
    }
    let m = match chain {
        ChainMode::Xts => rustcrypto::xts(cipher, key),
        ChainMode::Cbc | ChainMode::Ecb if cipher.block_size() == 16 => {
            if chain == ChainMode::Cbc {
                rustcrypto::cbc(cipher, key)
            } else {
                rustcrypto::ecb(cipher, key)
            }
        }
        _ => generic::mode(cipher, chain, key),
    };
    m.ok_or_else(|| lacks("rustcrypto", &what))
}

/// A block encryptor of `cipher` (for ESSIV); `None` if the cipher does not take the key.
pub(crate) fn block_encryptor(cipher: Cipher, key: &[u8]) -> Option<Box<dyn BlockEncrypt>> {
    rustcrypto::blocks(cipher, key)
}

#[cfg(test)]
mod tests;
