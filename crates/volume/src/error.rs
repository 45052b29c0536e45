//! Errors of volume operations, typed by cause.
//!
//! Every error type of this crate ([`VolumeError`], [`crate::luks::LuksError`],
//! [`crate::integrity::IntegrityVolumeError`]) answers [`kind()`](VolumeError::kind) with one
//! [`ErrorKind`]: what a caller (the CLI's exit codes, a server's retry policy) decides on.
//! Display says what failed at its level; the cause is always the `source`.
use blockdev::{BlockError, BlockErrorKind};
use formats::dm::TableError;
use sector_crypto::CryptoError;
use targets::integrity::IntegrityError;
use targets::CryptError;

use crate::integrity::IntegrityVolumeError;
use crate::luks::LuksError;
use crate::probe::Format;

/// The cause of a failure, as a caller decides on it.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
#[non_exhaustive]
pub enum ErrorKind {
    /// Bad bytes on disk: a header, superblock or journal that does not decode or check.
    Corrupt,
    /// The passphrase, key or keyed hash does not open the volume.
    WrongKey,
    /// A feature, cipher, format version or storage scheme this implementation does not have.
    Unsupported,
    /// The caller asked for something impossible or inconsistent (options, keyslot numbers,
    /// a device of another format than the one asked for).
    Usage,
    /// The storage is in use (its lock is held by another opener).
    Busy,
    /// The storage is read-only (or access to it is denied) and a write was needed.
    Permission,
    /// The storage is too small for the layout.
    TooSmall,
    /// Reading or writing the storage failed.
    Io,
    /// Anything else (e.g. the system's random source failed).
    Other,
    /// A broken internal invariant: a bug in this implementation, not the caller's fault
    /// nor the disk's (cryptsetup's internal errors; its tools exit 1 for them).
    Internal,
}

/// The kind of a storage error.
pub(crate) fn block_kind(e: &BlockError) -> ErrorKind {
    match e.kind() {
        BlockErrorKind::Busy => ErrorKind::Busy,
        BlockErrorKind::ReadOnly => ErrorKind::Permission,
        BlockErrorKind::Unsupported => ErrorKind::Unsupported,
        BlockErrorKind::OutOfRange | BlockErrorKind::NoSpace => ErrorKind::TooSmall,
        BlockErrorKind::InvalidArgument | BlockErrorKind::Misaligned => ErrorKind::Usage,
        BlockErrorKind::IntegrityMismatch { .. } => ErrorKind::Corrupt,
        _ => ErrorKind::Io,
    }
}

/// The kind of a dm-integrity target error.
pub(crate) fn integrity_kind(e: &IntegrityError) -> ErrorKind {
    match e {
        IntegrityError::Io { source, .. } => block_kind(source),
        IntegrityError::Superblock(_) | IntegrityError::Journal(_) => ErrorKind::Corrupt,
        IntegrityError::Layout(_) => ErrorKind::TooSmall,
        IntegrityError::ReplayTagMismatch { .. } => ErrorKind::WrongKey,
        _ => ErrorKind::Usage,
    }
}

/// Why a volume could not be opened, formatted or assembled. Display says what failed at
/// this level; the cause is the source.
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
    /// The storage could not be opened (or read while probing).
    #[error("cannot open device {path}")]
    Device {
        /// Path.
        path: String,
        /// Cause.
        #[source]
        source: BlockError,
    },
    /// A storage locator with a scheme no backend is built for.
    #[error("storage {locator:?}: the {scheme}:// backend is not supported by this build")]
    UnsupportedScheme {
        /// The scheme (`s3`).
        scheme: String,
        /// The locator as given.
        locator: String,
    },
    /// The storage cannot be grown by sealdisk: its size is its own (a block device, object
    /// storage, a device the caller built).
    #[error("{path} cannot be grown here: it is {what}, whose size is its own")]
    NotGrowable {
        /// The storage's name.
        path: String,
        /// What it is (`a block device`, `object storage`, `a device the caller built`).
        what: &'static str,
    },
    /// A storage file could not be created or grown.
    #[error("cannot create or grow {path}")]
    Create {
        /// Path.
        path: String,
        /// Cause.
        #[source]
        source: std::io::Error,
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
    /// Plain mode: the offset is at or past the end of the device.
    #[error("device {device} ({sectors} sectors) is smaller than the offset ({offset} sectors)")]
    OffsetBeyondDevice {
        /// Device name.
        device: String,
        /// Its size in 512-byte sectors.
        sectors: u64,
        /// `--offset` in 512-byte sectors.
        offset: u64,
    },
    /// Plain mode: not one whole encryption sector after the offset.
    #[error("device {device} leaves no whole {sector_size}-byte sector after the offset")]
    NoSectorAfterOffset {
        /// Device name.
        device: String,
        /// Encryption sector size.
        sector_size: u32,
    },
    /// A device name cannot go into a table line.
    #[error("device path {0:?} contains whitespace")]
    PathWhitespace(String),
    /// A LUKS volume was asked for and the storage holds something else.
    #[error("Device {path} is not a valid LUKS device{}", found.luks_refusal_note())]
    NotLuks {
        /// The storage.
        path: String,
        /// What it holds.
        found: Format,
    },
    /// A stack of layers with nothing in it, or a layer that cannot go where it was put.
    #[error("invalid layer stack: {0}")]
    Stack(&'static str),
    /// A LUKS header could not be read, unlocked or used.
    #[error("LUKS device {path}")]
    Luks {
        /// Metadata device path.
        path: String,
        /// Cause.
        #[source]
        source: LuksError,
    },
    /// A FileVault2 volume could not be read or unlocked.
    #[error("FVAULT2 device {path}")]
    Fvault2 {
        /// Device path.
        path: String,
        /// Cause.
        #[source]
        source: crate::fvault2::Fvault2VolumeError,
    },
    /// A BitLocker volume could not be loaded or unlocked.
    #[error("BITLK device {path}")]
    Bitlk {
        /// The storage.
        path: String,
        /// Cause.
        #[source]
        source: crate::bitlk::BitlkVolumeError,
    },
    /// A dm-integrity volume could not be formatted or opened.
    #[error(transparent)]
    Integrity(Box<IntegrityVolumeError>),
    /// A TrueCrypt/VeraCrypt volume could not be unlocked or mapped.
    #[error("TCRYPT device {path}")]
    Tcrypt {
        /// Metadata device path.
        path: String,
        /// Cause.
        #[source]
        source: crate::tcrypt::TcryptVolumeError,
    },
    /// The passphrase provider failed (a prompt or key file could not be read).
    #[error("reading the passphrase")]
    Passphrase(#[source] Box<dyn std::error::Error + Send + Sync + 'static>),
}

impl VolumeError {
    /// The cause, for a caller to decide on.
    pub fn kind(&self) -> ErrorKind {
        match self {
            VolumeError::Table(_) => ErrorKind::Usage,
            VolumeError::Cipher { .. }
            | VolumeError::UnsupportedScheme { .. }
            | VolumeError::NotGrowable { .. } => ErrorKind::Unsupported,
            VolumeError::Device { source, .. } => match block_kind(source) {
                k @ (ErrorKind::Busy | ErrorKind::Permission) => k,
                _ => ErrorKind::Io,
            },
            VolumeError::Create { source, .. } => match source.kind() {
                std::io::ErrorKind::PermissionDenied | std::io::ErrorKind::ReadOnlyFilesystem => {
                    ErrorKind::Permission
                }
                _ => ErrorKind::Io,
            },
            VolumeError::Layout { .. } => ErrorKind::TooSmall,
            VolumeError::OffsetBeyondDevice { .. }
            | VolumeError::NoSectorAfterOffset { .. }
            | VolumeError::PathWhitespace(_)
            | VolumeError::NotLuks { .. }
            | VolumeError::Stack(_)
            | VolumeError::Passphrase(_) => ErrorKind::Usage,
            VolumeError::Luks { source, .. } => source.kind(),
            VolumeError::Fvault2 { source, .. } => source.kind(),
            VolumeError::Integrity(e) => e.kind(),
            VolumeError::Tcrypt { source, .. } => source.kind(),
            VolumeError::Bitlk { source, .. } => source.kind(),
        }
    }
}

impl From<IntegrityVolumeError> for VolumeError {
    fn from(e: IntegrityVolumeError) -> Self {
        VolumeError::Integrity(Box::new(e))
    }
}
