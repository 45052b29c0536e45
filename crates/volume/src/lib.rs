//! Probe, unlock, assemble: turns what the user gave (a dm table line, or cryptsetup-style
//! plain options) into a stack of `BlockDevice` layers.
//!
//! ```text
//!   CLI options ──plain::table()──► CryptTable ──open_crypt_table()──► Volume
//!   table line ──CryptTable::parse──┘                                    │
//!                                          CryptTarget<FileDevice> ◄─────┘ (Arc<dyn BlockDevice>)
//! ```
//! Only this crate sees both `formats` and `targets`.
#![forbid(unsafe_code)]
#![warn(missing_docs)]

pub mod integrity;
pub mod luks;
pub mod plain;

use std::sync::Arc;

use blockdev::{BlockDevice, BlockError, FileDevice, FileLock, FileOptions};
use formats::dm::{CryptTable, TableError};
use sector_crypto::{CipherSpec, CryptoError, SectorCipher, SectorParams, VolumeKey};
pub use targets::CryptMode;
use targets::{CryptConfig, CryptError, CryptTarget};

/// Why a volume could not be opened. Display says what failed at this level; the cause
/// is the source.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum VolumeError {
    /// The table line is malformed.
    #[error("invalid dm-crypt table")]
    Table(#[source] TableError),
    /// The cipher specification or key is not usable.
    #[error("cannot set up cipher {cipher}")]
    Cipher {
        /// The cipher spec as given.
        cipher: String,
        /// Cause.
        #[source]
        source: CryptoError,
    },
    /// The backing device could not be opened.
    #[error("cannot open device {path}")]
    Device {
        /// Path.
        path: String,
        /// Cause.
        #[source]
        source: BlockError,
    },
    /// The layout does not fit the device.
    #[error("device {path} does not fit the requested layout")]
    Layout {
        /// Path.
        path: String,
        /// Cause.
        #[source]
        source: CryptError,
    },
    /// Bad plain-mode parameters.
    #[error("{0}")]
    Params(String),
    /// A LUKS header could not be read, unlocked or used.
    #[error("LUKS device {path}")]
    Luks {
        /// Metadata device path.
        path: String,
        /// Cause.
        #[source]
        source: luks::LuksError,
    },
}

/// How to open the backing device.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct OpenOptions {
    /// Open read-only and refuse writes.
    pub read_only: bool,
    /// Use O_DIRECT on the backing file.
    pub direct: bool,
    /// Where crypto runs for a direction whose `no_*_workqueue` flag is not set (the flag
    /// always means `Inline`). `Auto` by default: see `targets::CryptMode`.
    pub crypt_mode: CryptMode,
    /// Take the storage lock on every device opened (`blockdev::FileLock`), as cryptsetup
    /// keeps a device to one writer: exclusive read-write, shared with `read_only` or
    /// `shared`. A conflicting holder fails the open with `BlockErrorKind::Busy` before
    /// anything is read or written. Off by default (library users that coordinate
    /// themselves); the `sealdisk` CLI always sets it.
    pub lock: bool,
    /// cryptsetup's `--shared` (plain dm-crypt only there): with `lock`, a shared lock even
    /// read-write, so several openers may map non-overlapping parts (`--offset`/`--size`)
    /// of one device while an exclusive opener is still refused.
    pub shared: bool,
}

impl OpenOptions {
    /// The `blockdev` lock these options ask for.
    pub fn file_lock(&self) -> FileLock {
        match (self.lock, self.read_only || self.shared) {
            (false, _) => FileLock::None,
            (true, true) => FileLock::Shared,
            (true, false) => FileLock::Exclusive,
        }
    }
}

/// An opened volume: the top of the stack, and the table line that describes it.
#[derive(Debug)]
pub struct Volume {
    /// The device to serve.
    pub device: Arc<dyn BlockDevice>,
    /// The dm-crypt table line equivalent to this volume.
    pub table: CryptTable,
}

/// Opens the backing device of `table` and stacks a `CryptTarget` on it.
pub fn open_crypt_table(table: &CryptTable, opts: &OpenOptions) -> Result<Volume, VolumeError> {
    let backing = open_backing(&table.device, opts)?;
    let target = crypt_over(backing, table, opts)?;
    Ok(Volume { device: Arc::new(target), table: table.clone() })
}

/// Opens a backing file or block device (with the lock `opts` ask for).
pub fn open_backing(path: &str, opts: &OpenOptions) -> Result<FileDevice, VolumeError> {
    let fopts = FileOptions {
        read_only: opts.read_only,
        direct: opts.direct,
        lock: opts.file_lock(),
        ..FileOptions::default()
    };
    FileDevice::open(path, fopts).map_err(|source| VolumeError::Device { path: path.to_string(), source })
}

/// Stacks the crypt layer `table` describes over `next` (whose path is `table.device`).
pub fn crypt_over<D: BlockDevice>(
    next: D,
    table: &CryptTable,
    opts: &OpenOptions,
) -> Result<CryptTarget<D>, VolumeError> {
    let cipher_err = |source| VolumeError::Cipher { cipher: table.cipher.clone(), source };
    let spec: CipherSpec = table.cipher.parse().map_err(cipher_err)?;
    let key = VolumeKey::from_slice(&table.key);
    let o = &table.options;
    let params = SectorParams {
        sector_size: o.sector_size(),
        iv_offset: table.iv_offset,
        iv_large_sectors: o.iv_large_sectors,
    };
    let cipher = SectorCipher::new(&spec, &key, params).map_err(cipher_err)?;
    let mode = |inline: bool| if inline { CryptMode::Inline } else { opts.crypt_mode };
    let cfg = CryptConfig {
        offset: table.offset * 512,
        len: Some(table.len * 512),
        read_mode: mode(o.no_read_workqueue),
        write_mode: mode(o.no_write_workqueue),
        same_cpu_crypt: o.same_cpu_crypt,
        submit_from_crypt_cpus: o.submit_from_crypt_cpus,
        allow_discards: o.allow_discards,
        read_only: opts.read_only,
    };
    CryptTarget::new(next, cipher, cfg)
        .map_err(|source| VolumeError::Layout { path: table.device.clone(), source })
}
