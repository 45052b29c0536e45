//! dm-crypt compatible sector encryption.
//!
//! API CONTRACT (implemented by the sector-crypto work; signatures are fixed):
//! * `CipherSpec`: `FromStr`/`Display`, parsed once.
//! * `VolumeKey`: zeroizing key bytes with a redacted `Debug`.
//! * `SectorCipher::new(&spec, &key, SectorParams)`, `encrypt(sector, data)`, `decrypt(sector, data)`.
#![forbid(unsafe_code)]

use std::fmt;
use std::str::FromStr;

use zeroize::Zeroizing;

/// Errors of cipher setup and sector encryption.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum CryptoError {
    /// Part of a cipher specification is not supported.
    #[error("unsupported cipher specification {spec:?}: {part}")]
    Unsupported {
        /// The whole specification.
        spec: String,
        /// What is unsupported, naming the part.
        part: String,
    },
    /// The key length does not fit the cipher.
    #[error("invalid key size {bits} bits for {spec} (expected {expected})")]
    InvalidKeySize {
        /// Cipher spec.
        spec: String,
        /// Given size in bits.
        bits: usize,
        /// What sizes would be valid.
        expected: String,
    },
    /// Bad sector parameters.
    #[error("invalid sector parameters: {0}")]
    InvalidParams(String),
}

/// A parsed dm-crypt cipher specification such as `aes-xts-plain64`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct CipherSpec {
    text: String,
}

impl FromStr for CipherSpec {
    type Err = CryptoError;
    fn from_str(s: &str) -> Result<Self, CryptoError> {
        Ok(CipherSpec { text: s.to_string() })
    }
}

impl fmt::Display for CipherSpec {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.text)
    }
}

/// Key material, wiped on drop, never printed.
#[derive(Clone)]
pub struct VolumeKey(Zeroizing<Vec<u8>>);

impl VolumeKey {
    /// Wraps key bytes.
    pub fn new(bytes: Vec<u8>) -> Self {
        VolumeKey(Zeroizing::new(bytes))
    }
    /// The key bytes.
    pub fn as_bytes(&self) -> &[u8] {
        &self.0
    }
    /// Length in bytes.
    pub fn len(&self) -> usize {
        self.0.len()
    }
    /// True for an empty key (cipher_null).
    pub fn is_empty(&self) -> bool {
        self.0.is_empty()
    }
}

impl fmt::Debug for VolumeKey {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "VolumeKey({} bytes, redacted)", self.0.len())
    }
}

/// Where and how sectors are numbered for IV generation (dm-crypt table semantics).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct SectorParams {
    /// Encryption sector size: 512, 1024, 2048 or 4096.
    pub sector_size: u32,
    /// dm-crypt `iv_offset`, in 512-byte sectors, added before IV generation.
    pub iv_offset: u64,
    /// `iv_large_sectors`: IVs count in `sector_size` units instead of 512-byte units.
    pub iv_large_sectors: bool,
}

/// A keyed sector cipher. `Send + Sync`: use it from many threads at once.
#[derive(Debug)]
pub struct SectorCipher {
    params: SectorParams,
}

impl SectorCipher {
    /// Keys `spec` with `key`.
    pub fn new(spec: &CipherSpec, key: &VolumeKey, params: SectorParams) -> Result<Self, CryptoError> {
        let _ = (spec, key);
        Ok(SectorCipher { params })
    }

    /// The encryption sector size in bytes.
    pub fn sector_size(&self) -> u32 {
        self.params.sector_size
    }

    /// Encrypts `data` in place. `sector` is the target-relative 512-byte sector of `data[0]`
    /// (a multiple of `sector_size / 512`); `data.len()` is a multiple of `sector_size`.
    pub fn encrypt(&self, sector: u64, data: &mut [u8]) -> Result<(), CryptoError> {
        let _ = (sector, data);
        Ok(())
    }

    /// Decrypts `data` in place; arguments as for `encrypt`.
    pub fn decrypt(&self, sector: u64, data: &mut [u8]) -> Result<(), CryptoError> {
        let _ = (sector, data);
        Ok(())
    }
}
