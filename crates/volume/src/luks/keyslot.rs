//! Keyslot key material, shared by LUKS1 and LUKS2:
//!
//! ```text
//!  store:   volume key ──AF split (stripes, hash)──► material ──encrypt(area cipher, area key,
//!           512-byte sectors, IVs from sector 0)──► keyslot area on the metadata device
//!  recover: keyslot area ──decrypt──► material ──AF merge──► candidate key ──digest check
//!  area key = KDF(passphrase, keyslot salt)
//! ```
//! (cryptsetup `LUKS_encrypt_to_storage` / `LUKS_decrypt_from_storage`: the key material is
//! dm-crypt sector encryption with the area's cipher, 512-byte sectors and `iv_offset` 0.)

use blockdev::BlockDevice;
use formats::limits::{self, KdfLimits, LimitError};
use sector_crypto::af;
use sector_crypto::kdf::{HashAlg, Kdf};
use sector_crypto::secure::SecretBuf;
use sector_crypto::{CipherSpec, SectorCipher, SectorParams, VolumeKey};

use super::io;
use super::LuksError;

/// Where and how one keyslot's material is stored.
#[derive(Debug, Clone)]
pub(crate) struct Material<'a> {
    /// Byte offset of the area on the metadata device.
    pub offset: u64,
    /// Area cipher, e.g. `aes-xts-plain64`.
    pub cipher: &'a str,
    /// AF hash.
    pub af_hash: HashAlg,
    /// AF stripes.
    pub stripes: u32,
    /// Volume key length in bytes.
    pub key_len: usize,
}

impl Material<'_> {
    /// Bytes the encrypted material occupies (whole 512-byte sectors).
    pub fn len(&self) -> usize {
        af::split_sectors(self.key_len, self.stripes) * 512
    }

    /// The hard bounds on what sizes the material read and the AF merge: the key size
    /// ([`limits::MAX_KEY_BYTES`]) and the stripe count ([`limits::AF_STRIPES`]). With both,
    /// [`len`](Self::len) is at most [`limits::MAX_AF_MATERIAL_BYTES`].
    pub fn check_bounds(&self, what: &str) -> Result<(), LuksError> {
        limits::check_key_size(format_args!("{what} key_size"), self.key_len as u64)
            .map_err(LuksError::Limit)?;
        if self.stripes != limits::AF_STRIPES {
            return Err(LuksError::Limit(LimitError::Stripes {
                what: what.to_owned(),
                stripes: self.stripes,
            }));
        }
        Ok(())
    }

    fn cipher(&self, area_key: &[u8]) -> Result<SectorCipher, LuksError> {
        let err = |source| LuksError::Cipher { spec: self.cipher.to_owned(), source };
        let spec: CipherSpec = self.cipher.parse().map_err(err)?;
        let params = SectorParams { sector_size: 512, iv_offset: 0, iv_large_sectors: false };
        SectorCipher::new(&spec, &VolumeKey::from_slice(area_key), params).map_err(err)
    }

    /// Reads, decrypts and merges the material with `area_key`: a candidate volume key.
    pub fn recover(&self, meta: &dyn BlockDevice, area_key: &[u8]) -> Result<VolumeKey, LuksError> {
        self.check_bounds("keyslot")?;
        let cipher = self.cipher(area_key)?;
        let mut buf = io::read_secret(meta, self.offset, self.len(), "keyslot area")?;
        cipher
            .decrypt(0, &mut buf)
            .map_err(|source| LuksError::Cipher { spec: self.cipher.to_owned(), source })?;
        let key = af::merge(&buf, self.key_len, self.stripes, self.af_hash).map_err(LuksError::Kdf)?;
        Ok(VolumeKey::from_secret(key))
    }

    /// Splits `vk`, encrypts it with `area_key` and writes it (no flush).
    pub fn store(&self, meta: &dyn BlockDevice, area_key: &[u8], vk: &VolumeKey) -> Result<(), LuksError> {
        let cipher = self.cipher(area_key)?;
        let split = af::split(vk.as_bytes(), self.stripes, self.af_hash).map_err(LuksError::Kdf)?;
        let mut buf = SecretBuf::zeroed(self.len());
        buf[..split.len()].copy_from_slice(&split);
        cipher
            .encrypt(0, &mut buf)
            .map_err(|source| LuksError::Cipher { spec: self.cipher.to_owned(), source })?;
        io::write_bytes(meta, self.offset, &buf, "keyslot area")
    }
}

/// Checks one derivation's costs against `limits` (and Argon2's 4 GiB hard bound, and half
/// of physical RAM unless lifted) before it runs. `what` names it in the error.
pub(crate) fn check_kdf(kdf: &Kdf, what: &str, limits: &KdfLimits) -> Result<(), LuksError> {
    match kdf {
        Kdf::Pbkdf2 { iterations, .. } => limits.check_pbkdf2(what, *iterations),
        Kdf::Argon2(p) => limits.check_argon2(what, p.time, p.memory_kib, p.parallel, physical_memory_kib()),
    }
    .map_err(LuksError::Limit)
}

/// MemTotal from /proc/meminfo, KiB (`None` if it cannot be read; the half-RAM check is
/// then skipped and the 4 GiB hard bound still holds).
fn physical_memory_kib() -> Option<u64> {
    let text = std::fs::read_to_string("/proc/meminfo").ok()?;
    let line = text.lines().find(|l| l.starts_with("MemTotal:"))?;
    line.split_whitespace().nth(1)?.parse().ok()
}

/// Constant-time-ish comparison of a computed digest with the stored one.
pub(crate) fn digest_eq(a: &[u8], b: &[u8]) -> bool {
    a.len() == b.len() && a.iter().zip(b).fold(0u8, |acc, (x, y)| acc | (x ^ y)) == 0
}
