//! Probe, unlock, assemble: the one place where storage becomes a volume, and sealdisk's
//! library API.
//!
//! ```text
//!   locator ──storage::open──► Storage (Arc<dyn BlockDevice>: file, block device, s3://…)
//!                                 │
//!   Spec (Auto, LUKS, plain,      ▼
//!         table line, integrity, open(locator, Spec, Keys, opts) ──probe──unlock──stack──► Volume
//!         TrueCrypt, BitLocker,      ▲                                   (kind, top device, tables)
//!         FileVault2, layers)        │                                          │
//!   Keys (passphrases, keyfiles, ────┘                  serve (NBD, FUSE, ublk), bench, tests
//!         key file, volume key)
//!   FormatSpec (LUKS1/2, LUKS2+AEAD, integrity) ──► format() (one call per volume)
//! ```
//! Only this crate sees both `formats` and `targets`. Errors are typed by cause
//! ([`ErrorKind`]). See `assemble` for the path in detail.
//!
//! # Examples
//!
//! Format a LUKS2 volume, add a second passphrase, probe it, open it by probing (the way
//! `cryptsetup open` without `--type` does) and read a sector. A memory device stands in
//! for a file here; [`open`] takes a path or URI instead.
//!
//! ```
//! use std::sync::Arc;
//! use blockdev::{BlockDevice, MemDevice, WriteFlags};
//! use sector_crypto::kdf::Passphrase;
//! use volume::luks::{FormatParams, Luks, LuksVersion, PbkdfParams, PbkdfType};
//! use volume::{Format, FormatSpec, Keys, OnePassphrase, OpenOptions, Spec, Storage, VolumeKind};
//!
//! let storage = Storage::new(Arc::new(MemDevice::new(32 << 20, 512)), "example.img");
//! // LUKS2, aes-xts-plain64 with a 512-bit key; PBKDF2 with few iterations to keep the
//! // example fast (real volumes keep the benchmarked Argon2id default).
//! let mut params = FormatParams::for_cipher(LuksVersion::V2, "aes-xts-plain64", None, None)?;
//! params.pbkdf = PbkdfParams {
//!     kind: Some(PbkdfType::Pbkdf2),
//!     force_iterations: Some(1000),
//!     ..PbkdfParams::default()
//! };
//! let first = Passphrase::new(b"first passphrase".to_vec());
//! let fmt = FormatSpec::Luks { params: params.clone(), header: None, passphrase: &first };
//! volume::format(fmt, &storage, |_, _| std::ops::ControlFlow::Continue(()))?;
//!
//! // A second keyslot (`luksAddKey`): unlock with the first passphrase, store the key again.
//! let mut luks = Luks::load(&*storage.device, false)?;
//! let (_, key) = luks.unlock(&*storage.device, &first, None)?;
//! let second = Passphrase::new(b"second passphrase".to_vec());
//! let slot = luks.add_keyslot(&*storage.device, &key, &second, None, &params.pbkdf)?;
//! assert_eq!((slot, luks.active_keyslots()), (1, vec![0, 1]));
//!
//! assert_eq!(volume::probe(&storage)?, Format::Luks2 { aead: false });
//! let mut one = OnePassphrase::new(&second);
//! let vol = volume::open_storage(storage, Spec::auto(), Keys::passphrase(&mut one), &OpenOptions::default())?;
//! assert_eq!((vol.kind, vol.kind.type_name()), (VolumeKind::Luks2, "LUKS2"));
//! vol.device.write_at(0, &[0xab; 4096], WriteFlags::FUA)?;
//! let mut sector = [0u8; 512];
//! vol.device.read_at(0, &mut sector)?;
//! assert!(sector.iter().all(|&b| b == 0xab));
//! # Ok::<(), Box<dyn std::error::Error>>(())
//! ```
#![forbid(unsafe_code)]
#![deny(missing_docs)]

mod assemble;
pub mod bitlk;
mod error;
pub mod fvault2;
pub mod integrity;
mod keys;
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
    describe, format, open, open_storage, probe, unlock_fvault2, unlock_luks, AutoSpec, FormatSpec,
    Formatted, Fvault2Spec, IntegrityLayer, Layer, LayerTable, LuksSpec, OnePassphrase, PassphraseSource,
    Spec, Unlocked, Volume, VolumeKind,
};
pub use error::{ErrorKind, VolumeError};
pub use keys::Keys;
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
/// [`open`] with [`Spec::Table`].
pub fn open_crypt_table(table: &CryptTable, opts: &OpenOptions) -> Result<Volume, VolumeError> {
    open(&table.device, Spec::Table(table.clone()), Keys::none(), opts)
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
