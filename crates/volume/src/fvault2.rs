//! FileVault2 volumes (cryptsetup's `--type fvault2`): read the Core Storage metadata,
//! unlock the volume key with a passphrase, map the logical volume read-only.
//!
//! ```text
//!  read_params(dev)                                         formats::fvault2 decodes, this reads
//!    volume header (512 B at 0) ─► metadata key, block size, disk label block
//!    disk label (8 KiB) ─► volume groups descriptor ─► encrypted metadata extent
//!    encrypted metadata, 8 KiB blocks, AES-XTS-128 (tweak = block index), until a zero block
//!      0x0019 wrapped keys, 0x001a LV size + family UUID, 0x0305 LV start   ─► Fvault2Params
//!  unlock(params, passphrase)
//!    PBKDF2-SHA256(passphrase, salt, iterations)[16] ─unwrap─► KEK ─unwrap─► volume key[16]
//!    XTS key = volume key ‖ SHA-256(volume key ‖ family UUID)[..16]
//!  table(params, key): 0 <lv size/512> crypt aes-xts-plain64 <key> 0 <dev> <lv offset/512>
//! ```
//! Every offset and size is bounded before it is read (`formats::fvault2`,
//! `formats::limits::FVAULT2_MAX_METADATA_OFFSET`), the PBKDF2 iterations are checked against
//! [`KdfLimits`] before the derivation, and the logical volume must lie inside the device.
//! The mapping is read-only whatever the caller asked: sealdisk, like cryptsetup, never
//! changes FileVault2 metadata, and refuses data writes too (see docs/book/src/fvault2.md).
use blockdev::{BlockDevice, BlockError};
use formats::dm::{CryptOptions, CryptTable};
use formats::fvault2::{
    self, EncryptedMetadataExtent, Fvault2Error, Fvault2Params, MetadataRecords, VolumeHeader,
    METADATA_BLOCK_SIZE, VOLUME_GROUPS_DESCRIPTOR_SIZE, VOLUME_HEADER_SIZE, XTS_KEY_SIZE,
};
use formats::limits::{KdfLimits, LimitError};
use sector_crypto::hash::HashAlg;
use sector_crypto::kdf::Passphrase;
use sector_crypto::keywrap::{aes_unwrap, KeyWrapError};
use sector_crypto::secure::SecretBuf;
use sector_crypto::{CryptoError, VolumeKey};

use crate::error::{block_kind, ErrorKind};

/// The data cipher of every FileVault2 volume.
pub const CIPHER: &str = "aes-xts-plain64";

/// What went wrong reading or unlocking a FileVault2 volume.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum Fvault2VolumeError {
    /// The device does not start with a Core Storage volume header.
    #[error("device is not a valid FVAULT2 device")]
    NotFvault2(#[source] Fvault2Error),
    /// A metadata structure is malformed or fails its checksum.
    #[error("invalid FVAULT2 metadata")]
    Metadata(#[source] Fvault2Error),
    /// Reading the device failed.
    #[error("I/O error reading the {what}")]
    Io {
        /// What was being read.
        what: &'static str,
        /// Cause.
        #[source]
        source: BlockError,
    },
    /// The metadata points past the end of the device.
    #[error("device is too small: the {what} ends at byte {end}, the device has {have}")]
    TooSmall {
        /// What does not fit.
        what: &'static str,
        /// Where it ends.
        end: u64,
        /// Device size.
        have: u64,
    },
    /// The logical volume is not a whole number of 512-byte sectors where it starts, or
    /// is smaller than one.
    #[error("logical volume at byte {offset}, {size} bytes: not a mappable extent")]
    Extent {
        /// Start in bytes.
        offset: u64,
        /// Size in bytes.
        size: u64,
    },
    /// The passphrase does not unwrap the key (cryptsetup's wording, exit code 2).
    #[error("No key available with this passphrase.")]
    WrongPassphrase,
    /// The header asks for more PBKDF2 iterations than allowed.
    #[error("passphrase derivation refused")]
    Limit(#[source] LimitError),
    /// A crypto primitive failed where it should not.
    #[error("FVAULT2 key derivation or metadata decryption failed")]
    Crypto(#[source] CryptoError),
    /// The key unwrap was given sizes it does not take (an internal error).
    #[error("FVAULT2 key unwrap failed")]
    KeyWrap(#[source] KeyWrapError),
}

impl Fvault2VolumeError {
    /// The cause, for a caller to decide on.
    pub fn kind(&self) -> ErrorKind {
        match self {
            Fvault2VolumeError::NotFvault2(_) => ErrorKind::Usage,
            Fvault2VolumeError::Metadata(_) => ErrorKind::Corrupt,
            Fvault2VolumeError::Io { source, .. } => block_kind(source),
            Fvault2VolumeError::TooSmall { .. } => ErrorKind::TooSmall,
            Fvault2VolumeError::Extent { .. } => ErrorKind::Corrupt,
            Fvault2VolumeError::WrongPassphrase => ErrorKind::WrongKey,
            Fvault2VolumeError::Limit(_) => ErrorKind::Unsupported,
            Fvault2VolumeError::Crypto(_) | Fvault2VolumeError::KeyWrap(_) => ErrorKind::Other,
        }
    }
}

type Result<T> = std::result::Result<T, Fvault2VolumeError>;

/// Reads `len` bytes at `off`, which must lie inside the device.
fn read(dev: &dyn BlockDevice, off: u64, len: usize, what: &'static str) -> Result<Vec<u8>> {
    let have = dev.geometry().size;
    let end = off.saturating_add(len as u64);
    if end > have {
        return Err(Fvault2VolumeError::TooSmall { what, end, have });
    }
    // Reads go through whole logical blocks (a 40-byte descriptor, a 4 KiB-sector device).
    let block = u64::from(dev.geometry().logical_block.max(1));
    let start = off / block * block;
    let stop = end.div_ceil(block).saturating_mul(block).min(have);
    let mut buf = vec![0u8; (stop - start) as usize];
    dev.read_at(start, &mut buf).map_err(|source| Fvault2VolumeError::Io { what, source })?;
    let at = (off - start) as usize;
    Ok(buf[at..at + len].to_vec())
}

/// Reads and decodes the metadata of the FileVault2 volume on `dev`, as cryptsetup's
/// `FVAULT2_read_metadata` does (and with its bounds).
pub fn read_params(dev: &dyn BlockDevice) -> Result<Fvault2Params> {
    let first = read(dev, 0, VOLUME_HEADER_SIZE, "volume header")?;
    let header = VolumeHeader::decode(&first).map_err(|e| match e {
        Fvault2Error::Checksum { .. } | Fvault2Error::Signature | Fvault2Error::TooShort { .. } => {
            Fvault2VolumeError::NotFvault2(e)
        }
        e => Fvault2VolumeError::Metadata(e),
    })?;
    let md = Fvault2VolumeError::Metadata;
    let label_off = header.disk_label_offset().map_err(md)?;
    let label = read(dev, label_off, METADATA_BLOCK_SIZE, "disk label")?;
    let vgd_off = fvault2::volume_groups_descriptor_offset(&label, label_off).map_err(md)?;
    let vgd = read(dev, vgd_off, VOLUME_GROUPS_DESCRIPTOR_SIZE, "volume groups descriptor")?;
    let extent = EncryptedMetadataExtent::decode(&vgd, header.block_size).map_err(md)?;
    log::debug!("FVAULT2 encrypted metadata: {} blocks at byte {}", extent.blocks, extent.offset);
    let mut records = MetadataRecords::default();
    let key = SecretBuf::from_slice(header.metadata_key());
    for i in 0..extent.blocks {
        let off = extent.block_offset(i).map_err(md)?;
        let mut block = read(dev, off, METADATA_BLOCK_SIZE, "encrypted metadata")?;
        if block.iter().all(|&b| b == 0) {
            break;
        }
        sector_crypto::aes_xts_decrypt_units(&key, METADATA_BLOCK_SIZE, i, &mut block)
            .map_err(Fvault2VolumeError::Crypto)?;
        let decoded = fvault2::decode_metadata_block(&block);
        zeroize::Zeroize::zeroize(&mut block);
        if let Some(r) = decoded.map_err(md)? {
            log::debug!("FVAULT2 metadata block {i}: {r:?}");
            records.add(r);
        }
    }
    let params = records.finish(&header).map_err(md)?;
    let have = dev.geometry().size;
    let lv_end = params.lv_offset.checked_add(params.lv_size);
    if !params.lv_offset.is_multiple_of(512) || params.lv_size < 512 {
        return Err(Fvault2VolumeError::Extent { offset: params.lv_offset, size: params.lv_size });
    }
    match lv_end {
        Some(end) if end <= have => Ok(params),
        _ => Err(Fvault2VolumeError::TooSmall {
            what: "logical volume",
            end: lv_end.unwrap_or(u64::MAX),
            have,
        }),
    }
}

/// Derives the data key of `params` from `passphrase` (cryptsetup's
/// `FVAULT2_get_volume_key`): 32 bytes, the volume key then its XTS tweak key.
pub fn unlock(params: &Fvault2Params, passphrase: &Passphrase, limits: &KdfLimits) -> Result<VolumeKey> {
    let keys = &params.keys;
    limits.check_pbkdf2("FVAULT2 passphrase", keys.pbkdf2_iterations).map_err(Fvault2VolumeError::Limit)?;
    let mut derived = SecretBuf::from_vec(vec![0u8; 16]);
    sector_crypto::kdf::pbkdf2(
        HashAlg::Sha256,
        passphrase.as_bytes(),
        &keys.pbkdf2_salt,
        keys.pbkdf2_iterations,
        &mut derived,
    )
    .map_err(|e| Fvault2VolumeError::Crypto(CryptoError::InvalidParams(e.to_string())))?;
    let unwrap = |kek: &[u8], wrapped: &[u8]| match aes_unwrap(kek, wrapped) {
        Ok(k) => Ok(k),
        Err(KeyWrapError::Integrity) => Err(Fvault2VolumeError::WrongPassphrase),
        Err(e) => Err(Fvault2VolumeError::KeyWrap(e)),
    };
    let kek = unwrap(&derived, &keys.wrapped_kek)?;
    // A KEK that unwraps is right: the volume key's check can only fail on changed metadata.
    let vk = unwrap(&kek, &keys.wrapped_volume_key).map_err(|e| match e {
        Fvault2VolumeError::WrongPassphrase => {
            Fvault2VolumeError::Metadata(Fvault2Error::Value("KEKWrappedVolumeKeyStruct"))
        }
        e => e,
    })?;
    let mut key = SecretBuf::from_vec(vec![0u8; XTS_KEY_SIZE]);
    key[..16].copy_from_slice(&vk);
    let mut tweak = SecretBuf::from_vec(vec![0u8; 32]);
    HashAlg::Sha256.digest_into(&[&vk, &params.family_uuid], &mut tweak);
    key[16..].copy_from_slice(&tweak[..16]);
    Ok(VolumeKey::from_secret(key))
}

/// The dm-crypt table of the unlocked volume on `device`: `aes-xts-plain64` from the
/// logical volume's start, IVs counted from it.
pub fn table(params: &Fvault2Params, device: &str, key: &VolumeKey) -> CryptTable {
    CryptTable {
        len: params.lv_size / 512,
        cipher: CIPHER.to_owned(),
        key: zeroize::Zeroizing::new(key.as_bytes().to_vec()),
        iv_offset: 0,
        device: device.to_owned(),
        offset: params.lv_offset / 512,
        options: CryptOptions::default(),
    }
}

/// `cryptsetup fvault2Dump` of the volume on `dev` (named `device`).
pub fn dump(dev: &dyn BlockDevice, device: &str) -> Result<String> {
    Ok(fvault2::dump_text(&read_params(dev)?, device))
}
