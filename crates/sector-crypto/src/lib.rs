//! dm-crypt compatible sector encryption.
//!
//! ```text
//!   "aes-xts-plain64" ──FromStr──► CipherSpec ─┐
//!   VolumeKey (secret memory) ─────────────────┼──► SectorCipher::new ──► encrypt/decrypt(sector, data)
//!   SectorParams {sector_size, iv_offset, ...} ┘        │
//!                                                        ├─ IvGen      iv.rs      (plain, plain64, essiv, ...)
//!                                                        └─ SectorMode provider/  (aws-lc | RustCrypto)
//!
//!   "capi:gcm(aes)-random" ──► AeadSpec ──► AeadSectorCipher ──► encrypt/decrypt(sector, data, tuples)   aead.rs
//! ```
//!
//! Semantics are the Linux kernel's dm-crypt (`drivers/md/dm-crypt.c`, `crypt_convert` and
//! `crypt_convert_block_skcipher`): for the crypto sector at target-relative 512-byte sector
//! `s` (a multiple of `sector_size / 512`),
//!
//! ```text
//!   cc_sector = s + iv_offset                       (u64, wrapping)
//!   iv_sector = cc_sector >> log2(sector_size/512)  if iv_large_sectors, else cc_sector
//!   IV        = ivgen(iv_sector)                    see [`IvMode`]
//!   data      = mode(key, IV, sector_size bytes)    one cipher operation per crypto sector
//! ```
//!
//! `iv_offset` must be a multiple of `sector_size / 512` (the kernel's "Invalid iv_offset
//! sector"), so the shift is exact. A [`SectorCipher`] is `Send + Sync`; threads share it
//! without locks: aws-lc XTS contexts come from a lock-free pool, everything else is an
//! immutable key schedule. [`Provider`] picks the implementation (aws-lc by default, pure-Rust
//! RustCrypto where aws-lc lacks a primitive, or on request).
//!
//! Kernel details reproduced here (see [`IvMode`] for each generator):
//! * `plain` truncates `iv_sector` to 32 bits *after* adding `iv_offset`, so it repeats every
//!   2³² IV sectors; `plain64be` fills the last 8 bytes of the IV.
//! * `essiv:sha256` keys the IV cipher with SHA-256 of the whole volume key: AES-256 even for
//!   a 128-bit data key, and over both halves of an XTS key.
//! * `eboiv` encrypts `le64(iv_sector * sector_size)` with the data cipher and key: a byte
//!   offset only with `iv_large_sectors` (BitLocker's setup); without it the 512-byte sector
//!   number is multiplied by the sector size, as the kernel does.
//! * XTS keys with equal halves are accepted (the kernel refuses them only in FIPS mode).
//! * With ECB an IV generator is accepted and ignored, as the kernel does.
//! * `cipher:N` (keycount) splits the key into N subkeys; the crypto sector at `cc_sector`
//!   (512-byte units, `iv_offset` included, before the `iv_large_sectors` shift) uses subkey
//!   `cc_sector mod N` (`crypt_convert_block_skcipher`'s `key_index`).
//! * `lmk` and `tcw` read or change the data around the cipher (see `iv.rs`) and need
//!   512-byte sectors.
#![deny(unsafe_code)]
#![warn(missing_docs)]

use std::fmt;

/// A byte-string secret: its bytes in a [`secure::SecretBuf`] (locked, excluded from core
/// dumps, zeroed on drop), its `Debug` shows only the length. One macro so that every secret
/// type behaves the same while staying a distinct type.
macro_rules! secret_bytes {
    ($(#[$attr:meta])* $name:ident, $what:literal, $empty_doc:literal) => {
        $(#[$attr])*
        pub struct $name($crate::secure::SecretBuf);

        impl $name {
            #[doc = concat!("Moves ", $what, " bytes into secret memory; the vector is wiped.")]
            pub fn new(bytes: Vec<u8>) -> Self {
                $name($crate::secure::SecretBuf::from_vec(bytes))
            }
            #[doc = concat!("Copies ", $what, " bytes into secret memory.")]
            pub fn from_slice(bytes: &[u8]) -> Self {
                $name($crate::secure::SecretBuf::from_slice(bytes))
            }
            #[doc = concat!("Takes ", $what, " bytes already in secret memory.")]
            pub fn from_secret(bytes: $crate::secure::SecretBuf) -> Self {
                $name(bytes)
            }
            /// The bytes.
            pub fn as_bytes(&self) -> &[u8] {
                &self.0
            }
            /// Length in bytes.
            pub fn len(&self) -> usize {
                self.0.len()
            }
            #[doc = $empty_doc]
            pub fn is_empty(&self) -> bool {
                self.0.is_empty()
            }
        }

        impl std::fmt::Debug for $name {
            fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
                write!(f, concat!(stringify!($name), "({} bytes, redacted)"), self.0.len())
            }
        }
    };
}
pub(crate) use secret_bytes;

pub mod aead;
pub mod af;
pub mod bitlk;
mod elephant;
pub mod hash;
pub mod interrupt;
mod iv;
pub mod kdf;
pub mod keywrap;
mod provider;
#[allow(unsafe_code)]
pub mod secure;
mod spec;
pub mod tag;
mod twofish;
mod wide;

pub use aead::{AeadAlgorithm, AeadIv, AeadSectorCipher, AeadSpec, HmacHash};
pub use provider::Provider;
pub use spec::{ChainMode, Cipher, CipherSpec, EssivHash, IvMode, KeyLayout};

use iv::IvGen;
use provider::{Block, SectorMode};

/// Sectors whose IVs are computed per batch (16 + 8 bytes each, on the stack); also the most
/// units one provider call sees, so it bounds how many CBC lanes can run side by side.
const IV_BATCH: usize = 64;

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
    /// The specification is malformed: the kernel would refuse it too.
    #[error("invalid cipher specification {spec:?}: {reason}")]
    InvalidSpec {
        /// The whole specification.
        spec: String,
        /// What is wrong.
        reason: String,
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
    /// An encrypt/decrypt call whose start sector or length is not aligned to the sector size.
    #[error("misaligned request: sector {sector}, {len} bytes, sector size {sector_size}")]
    Misaligned {
        /// Start sector (512-byte units).
        sector: u64,
        /// Length in bytes.
        len: usize,
        /// The cipher's sector size in bytes.
        sector_size: u32,
    },
    /// An authenticated sector's tag did not verify (AEAD): the data or its tag was changed,
    /// or the key is wrong. Never carries key material or plaintext.
    #[error("authentication tag mismatch at sector {sector}")]
    AuthFailed {
        /// Target-relative 512-byte sector of the crypto sector that failed.
        sector: u64,
    },
    /// The crypto provider failed where it should not (an internal error).
    #[error("crypto provider failure: {op}")]
    Provider {
        /// What failed.
        op: &'static str,
    },
}

/// Decrypts `data` as consecutive AES-XTS data units of `unit` bytes (a multiple of 16),
/// the first with the tweak `first` (a little-endian 64-bit number, like `plain64`), the
/// next `first + 1`, and so on. For metadata that is XTS-encrypted in units dm-crypt's
/// sector sizes do not have (FileVault2's 8 KiB metadata blocks); `key` is two AES keys.
pub fn aes_xts_decrypt_units(
    key: &[u8],
    unit: usize,
    first: u64,
    data: &mut [u8],
) -> Result<(), CryptoError> {
    if unit == 0 || unit % 16 != 0 || data.len() % unit != 0 {
        return Err(CryptoError::InvalidParams(format!(
            "XTS units of {unit} bytes over {} bytes",
            data.len()
        )));
    }
    let mode = provider::aes_xts(Provider::Auto, key)?;
    for (i, chunk) in data.chunks_mut(unit * IV_BATCH).enumerate() {
        let base = first.wrapping_add((i * IV_BATCH) as u64);
        let ivs: Vec<Block> = (0..chunk.len() / unit)
            .map(|n| {
                let mut iv = [0u8; 16];
                iv[..8].copy_from_slice(&base.wrapping_add(n as u64).to_le_bytes());
                iv
            })
            .collect();
        mode.decrypt(chunk, unit, &ivs)?;
    }
    Ok(())
}

secret_bytes! {
    /// Key material: locked, kept out of core dumps, wiped on drop, never printed.
    #[derive(Clone)]
    VolumeKey, "key", "True for an empty key (cipher_null)."
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

impl SectorParams {
    /// log2(`sector_size` / 512), or an error naming the sizes dm-crypt accepts.
    pub fn sector_shift(&self) -> Result<u32, CryptoError> {
        match self.sector_size {
            512 => Ok(0),
            1024 => Ok(1),
            2048 => Ok(2),
            4096 => Ok(3),
            n => Err(CryptoError::InvalidParams(format!(
                "sector_size {n} is not one of 512, 1024, 2048, 4096"
            ))),
        }
    }
}

/// A keyed sector cipher. `Send + Sync`: use it from many threads at once.
pub struct SectorCipher {
    spec: CipherSpec,
    params: SectorParams,
    /// log2(sector_size / 512).
    sector_shift: u32,
    /// One keyed mode per subkey (the kernel's `tfms`); never empty.
    modes: Vec<Box<dyn SectorMode>>,
    iv: IvGen,
}

impl fmt::Debug for SectorCipher {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("SectorCipher")
            .field("spec", &self.spec.to_string())
            .field("params", &self.params)
            .field("implementation", &self.implementation())
            .finish_non_exhaustive()
    }
}

impl SectorCipher {
    /// Keys `spec` with `key`, using the fastest available provider.
    pub fn new(spec: &CipherSpec, key: &VolumeKey, params: SectorParams) -> Result<Self, CryptoError> {
        Self::with_provider(spec, key, params, Provider::Auto)
    }

    /// Keys `spec` with `key` using the given provider for the data path (ESSIV's IV cipher is
    /// always RustCrypto's). A provider lacking the primitive gives
    /// [`CryptoError::Unsupported`].
    pub fn with_provider(
        spec: &CipherSpec,
        key: &VolumeKey,
        params: SectorParams,
        provider: Provider,
    ) -> Result<Self, CryptoError> {
        let sector_shift = params.sector_shift()?;
        let step = 1u64 << sector_shift;
        if params.iv_offset % step != 0 {
            return Err(CryptoError::InvalidParams(format!(
                "iv_offset {} is not a multiple of sector_size/512 = {step}",
                params.iv_offset
            )));
        }
        let key_bytes = key.as_bytes();
        let layout = spec.key_layout(key_bytes.len()).map_err(|why| {
            let mut expected = spec.key_sizes_text();
            if spec.cipher() == Cipher::CipherNull {
                expected.push_str("; cipher_null takes no key (cryptsetup passes '-')");
            }
            if !why.is_empty() {
                expected = format!("{expected}; {why}");
            }
            CryptoError::InvalidKeySize { spec: spec.to_string(), bits: key_bytes.len() * 8, expected }
        })?;
        let mut modes = Vec::with_capacity(layout.keycount);
        for subkey in key_bytes[..layout.keycount * layout.subkey].chunks_exact(layout.subkey.max(1)) {
            let m = provider::mode(provider, spec.cipher(), spec.mode(), subkey).map_err(|e| match e {
                CryptoError::Unsupported { part, .. } => {
                    CryptoError::Unsupported { spec: spec.to_string(), part }
                }
                e => e,
            })?;
            modes.push(m);
        }
        if modes.is_empty() {
            // cipher_null: no key at all.
            modes.push(provider::mode(provider, spec.cipher(), spec.mode(), &[])?);
        }
        let iv = IvGen::for_spec(spec, key_bytes, layout, params.sector_size)?;
        Ok(SectorCipher { spec: spec.clone(), params, sector_shift, modes, iv })
    }

    /// The encryption sector size in bytes.
    pub fn sector_size(&self) -> u32 {
        self.params.sector_size
    }

    /// The parameters this cipher was built with.
    pub fn params(&self) -> SectorParams {
        self.params
    }

    /// The specification this cipher was built from.
    pub fn spec(&self) -> &CipherSpec {
        &self.spec
    }

    /// Which implementation runs the data path, e.g. `aws-lc xts(aes256)` (like the kernel's
    /// `cra_driver_name` debug line).
    pub fn implementation(&self) -> &str {
        self.modes[0].name()
    }

    /// Encrypts `data` in place. `sector` is the target-relative 512-byte sector of `data[0]`
    /// (a multiple of `sector_size / 512`); `data.len()` is a multiple of `sector_size`.
    pub fn encrypt(&self, sector: u64, data: &mut [u8]) -> Result<(), CryptoError> {
        self.convert(sector, None, data, true)
    }

    /// Encrypts `src` into `dst` (the same length), leaving `src` alone: the ciphertext
    /// [`Self::encrypt`] would leave in a copy of `src`, in one pass over the data where the
    /// provider reads one buffer and writes another (aws-lc's AES-XTS); otherwise each batch
    /// of sectors is copied, then encrypted in place while it is in cache.
    pub fn encrypt_to(&self, sector: u64, src: &[u8], dst: &mut [u8]) -> Result<(), CryptoError> {
        if src.len() != dst.len() {
            return Err(CryptoError::InvalidParams(format!(
                "encrypt_to: {} bytes of plaintext for a {}-byte buffer",
                src.len(),
                dst.len()
            )));
        }
        self.convert(sector, Some(src), dst, true)
    }

    /// Decrypts `data` in place; arguments as for `encrypt`.
    pub fn decrypt(&self, sector: u64, data: &mut [u8]) -> Result<(), CryptoError> {
        self.convert(sector, None, data, false)
    }

    /// The kernel's `crypt_convert`: one cipher operation per crypto sector, IV from
    /// `cc_sector`, which advances by `sector_size >> 9`.
    /// With `src` (encryption only, the same length as `data`), the plaintext is read from
    /// `src` and the ciphertext written to `data`.
    fn convert(
        &self,
        sector: u64,
        src: Option<&[u8]>,
        data: &mut [u8],
        encrypt: bool,
    ) -> Result<(), CryptoError> {
        let sector_size = self.params.sector_size as usize;
        let step = 1u64 << self.sector_shift;
        if data.len() % sector_size != 0 || sector % step != 0 {
            return Err(CryptoError::Misaligned {
                sector,
                len: data.len(),
                sector_size: self.params.sector_size,
            });
        }
        let mut cc_sector = sector.wrapping_add(self.params.iv_offset);
        let mut chunk_sector = cc_sector;
        let mut iv_sectors = [0u64; IV_BATCH];
        let mut ivs: [Block; IV_BATCH] = [[0; 16]; IV_BATCH];
        let mut key_idx = [0usize; IV_BATCH];
        // Elephant rewrites the plaintext before encrypting it: copy each batch first.
        let copy_first = self.iv.rewrites_plaintext();
        let batch = sector_size * IV_BATCH;
        for (b, chunk) in data.chunks_mut(batch).enumerate() {
            let n = chunk.len() / sector_size;
            let mut plain = src.map(|s| &s[b * batch..b * batch + chunk.len()]);
            if let (Some(p), true) = (plain, copy_first) {
                chunk.copy_from_slice(p);
                plain = None;
            }
            for s in &mut iv_sectors[..n] {
                *s = if self.params.iv_large_sectors { cc_sector >> self.sector_shift } else { cc_sector };
                cc_sector = cc_sector.wrapping_add(step);
            }
            let (iv_sectors, ivs) = (&iv_sectors[..n], &mut ivs[..n]);
            let first = self.modes[0].as_ref();
            let keys = if self.modes.len() > 1 {
                let mask = self.modes.len() as u64 - 1;
                for (i, k) in key_idx[..n].iter_mut().enumerate() {
                    *k = (chunk_sector.wrapping_add(i as u64 * step) & mask) as usize;
                }
                Some(&key_idx[..n])
            } else {
                None
            };
            if encrypt {
                match plain {
                    Some(p) => {
                        // Nothing rewrites the plaintext (checked above): IVs from `p`, then
                        // one pass from `p` into `chunk`.
                        self.iv.fill_for_encrypt(iv_sectors, keys, ivs, first, p, sector_size)?;
                        self.run_modes(chunk_sector, Some(p), chunk, ivs, true)?;
                    }
                    None => {
                        self.iv.before_encrypt(iv_sectors, chunk, sector_size);
                        self.iv.fill_for_encrypt(iv_sectors, keys, ivs, first, chunk, sector_size)?;
                        self.run_modes(chunk_sector, None, chunk, ivs, true)?;
                    }
                }
                self.iv.after_encrypt(iv_sectors, chunk, sector_size);
            } else {
                self.iv.before_decrypt(iv_sectors, chunk, sector_size);
                self.iv.fill_keyed(iv_sectors, keys, ivs, first)?;
                self.run_modes(chunk_sector, None, chunk, ivs, false)?;
                self.iv.after_decrypt(iv_sectors, chunk, sector_size);
            }
            chunk_sector = cc_sector;
        }
        Ok(())
    }

    /// Runs the mode over `chunk`, whose first crypto sector is at `cc_sector`: one call when
    /// there is one key, else one call per sector with key `cc_sector mod keycount`.
    /// With `src` (encryption only), reads the plaintext from it and writes `chunk`.
    fn run_modes(
        &self,
        cc_sector: u64,
        src: Option<&[u8]>,
        chunk: &mut [u8],
        ivs: &[Block],
        encrypt: bool,
    ) -> Result<(), CryptoError> {
        let sector_size = self.params.sector_size as usize;
        let run = |m: &dyn SectorMode, src: Option<&[u8]>, data: &mut [u8], ivs: &[Block]| match src {
            Some(src) => m.encrypt_to(src, data, sector_size, ivs),
            None if encrypt => m.encrypt(data, sector_size, ivs),
            None => m.decrypt(data, sector_size, ivs),
        };
        if self.modes.len() == 1 {
            return run(self.modes[0].as_ref(), src, chunk, ivs);
        }
        let step = 1u64 << self.sector_shift;
        let mask = self.modes.len() as u64 - 1;
        let mut s = cc_sector;
        for (i, (d, iv)) in chunk.chunks_exact_mut(sector_size).zip(ivs.chunks(1)).enumerate() {
            let p = src.map(|p| &p[i * sector_size..(i + 1) * sector_size]);
            run(self.modes[(s & mask) as usize].as_ref(), p, d, iv)?;
            s = s.wrapping_add(step);
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests;
