//! Plain dm-crypt, cryptsetup style: `cryptsetup open --type plain` options become a table.
//!
//! As cryptsetup does: `--offset` (sectors) is where ciphertext starts on the device, `--skip`
//! (sectors) is the IV offset, `--size` (sectors) limits the length, otherwise the volume runs
//! to the end of the device, rounded down to the sector size.

use formats::dm::{CryptOptions, CryptTable};
use sector_crypto::VolumeKey;
use zeroize::Zeroizing;

use crate::storage::Storage;
use crate::VolumeError;

/// Plain-mode parameters (cryptsetup's names).
#[derive(Debug, Clone)]
pub struct PlainParams {
    /// `--cipher`.
    pub cipher: String,
    /// The key (already read from the key file, exactly `--key-size` bits).
    pub key: VolumeKey,
    /// `--offset`, 512-byte sectors.
    pub offset: u64,
    /// `--skip`, 512-byte sectors (the IV offset).
    pub skip: u64,
    /// `--size`, 512-byte sectors.
    pub size: Option<u64>,
    /// Table options (`--sector-size`, `--iv-large-sectors`, `--allow-discards`, `--perf-*`).
    pub options: CryptOptions,
}

/// Builds the table line for a plain volume on opened `storage` (named in the line by its
/// name).
pub fn table_on(storage: &Storage, p: &PlainParams) -> Result<CryptTable, VolumeError> {
    table_for(&storage.name, storage.size(), p)
}

/// Builds the table line for a plain volume on `device` of `size` bytes.
pub fn table_for(device: &str, size: u64, p: &PlainParams) -> Result<CryptTable, VolumeError> {
    let dev_sectors = size / 512;
    let per = u64::from(p.options.sector_size() / 512);
    if p.offset >= dev_sectors {
        return Err(VolumeError::OffsetBeyondDevice {
            device: device.to_owned(),
            sectors: dev_sectors,
            offset: p.offset,
        });
    }
    let len = match p.size {
        Some(size) => size,
        None => (dev_sectors - p.offset) / per * per,
    };
    if len == 0 {
        return Err(VolumeError::NoSectorAfterOffset {
            device: device.to_owned(),
            sector_size: p.options.sector_size(),
        });
    }
    if device.contains(char::is_whitespace) {
        return Err(VolumeError::PathWhitespace(device.to_owned()));
    }
    let table = CryptTable {
        len,
        cipher: p.cipher.clone(),
        key: Zeroizing::new(p.key.as_bytes().to_vec()),
        iv_offset: p.skip,
        device: device.to_string(),
        offset: p.offset,
        options: p.options,
    };
    table.validate().map_err(VolumeError::Table)?;
    Ok(table)
}
