//! Probe, unlock, assemble: the one place where storage becomes a volume.
//!
//! ```text
//!   locator ──storage::open──► Storage (Arc<dyn BlockDevice>: file, block device; URIs later)
//!                                 │
//!   Spec (LUKS + passphrases,     ▼
//!         plain, table line, ──► open() ──probe──unlock──stack──► Volume (top device, tables)
//!         integrity, layers)                                          │
//!                                          NBD server, bench, tests ◄─┘
//!   FormatSpec (LUKS1/2, LUKS2+AEAD, integrity) ──► format() (one call per volume)
//! ```
//! Only this crate sees both `formats` and `targets`. Errors are typed by cause
//! ([`ErrorKind`]). See `assemble` for the path in detail.
#![forbid(unsafe_code)]
#![warn(missing_docs)]

mod assemble;
pub mod bitlk;
mod error;
pub mod fvault2;
pub mod integrity;
pub mod luks;
pub mod plain;
mod probe;
pub mod storage;
pub mod tcrypt;

use blockdev::{BlockDevice, FileDevice, FileLock, FileOptions};
use formats::dm::CryptTable;
use sector_crypto::{CipherSpec, SectorCipher, SectorParams, VolumeKey};
pub use targets::CryptMode;
use targets::{CryptConfig, CryptTarget};

pub use assemble::{
    describe, format, open, probe, unlock_fvault2, unlock_luks, FormatSpec, Formatted, Fvault2Spec,
    IntegrityLayer, Layer, LayerTable, LuksSpec, OnePassphrase, PassphraseSource, Spec, Unlocked, Volume,
    VolumeKind,
};
pub use error::{ErrorKind, VolumeError};
pub use probe::{Description, Format};
pub use storage::{Storage, StorageKind, StorageOptions};

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

    /// The storage options these options ask for.
    pub fn storage(&self) -> StorageOptions {
        StorageOptions { read_only: self.read_only, direct: self.direct, lock: self.file_lock() }
    }
}

/// Opens the storage `table.device` names and stacks the crypt layer of `table` on it:
/// [`storage::open`] then [`open`] with [`Spec::Table`].
pub fn open_crypt_table(table: &CryptTable, opts: &OpenOptions) -> Result<Volume, VolumeError> {
    let storage = storage::open(&table.device, &opts.storage())?;
    open(Spec::Table(table.clone()), storage, opts)
}

/// Opens a backing file or block device by path (with the lock `opts` ask for), for
/// callers that need the `FileDevice` itself (tests of header operations). Volumes are
/// assembled from [`storage::open`].
pub fn open_backing(path: &str, opts: &OpenOptions) -> Result<FileDevice, VolumeError> {
    let fopts = FileOptions {
        read_only: opts.read_only,
        direct: opts.direct,
        lock: opts.file_lock(),
        ..FileOptions::default()
    };
    FileDevice::open(path, fopts).map_err(|source| VolumeError::Device { path: path.to_string(), source })
}

/// Stacks the crypt layer `table` describes over `next` (whose name is `table.device`).
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
