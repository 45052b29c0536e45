//! What goes wrong in a LUKS operation, typed by cause.
use blockdev::BlockError;
use formats::luks1::{Luks1Error, Luks1RepairError};
use formats::luks2::Luks2Error;
use sector_crypto::kdf::KdfError;
use sector_crypto::CryptoError;

use super::LimitError;

/// What went wrong in a LUKS operation. Display describes this level; causes are sources.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum LuksError {
    /// No LUKS magic.
    #[error("device is not a valid LUKS device")]
    NotLuks,
    /// LUKS magic with a version other than 1 or 2.
    #[error("unsupported LUKS version {0}")]
    UnsupportedVersion(u16),
    /// A different LUKS version than the one asked for (`--type luks1` on LUKS2...).
    #[error("device is LUKS{found}, not LUKS{wanted}")]
    WrongVersion {
        /// Version asked for.
        wanted: u8,
        /// Version found.
        found: u8,
    },
    /// The LUKS1 header is invalid.
    #[error("invalid LUKS1 header")]
    Luks1(#[source] Luks1Error),
    /// `repair` could not repair the LUKS1 header (nothing was written).
    #[error("cannot repair the LUKS1 header")]
    Luks1Repair(#[source] Luks1RepairError),
    /// No valid LUKS2 header.
    #[error("invalid LUKS2 header")]
    Luks2(#[source] Luks2Error),
    /// I/O on the metadata device.
    #[error("I/O error on the {what}")]
    Io {
        /// What was being accessed.
        what: &'static str,
        /// Cause.
        #[source]
        source: BlockError,
    },
    /// The device is smaller than the header says it must be.
    #[error("device is too small: LUKS metadata needs {need} bytes, the device has {have}")]
    DeviceTooSmall {
        /// Bytes needed.
        need: u64,
        /// Bytes available.
        have: u64,
    },
    /// No keyslot opens with this passphrase (cryptsetup's wording, exit code 2).
    #[error("No key available with this passphrase.")]
    WrongPassphrase,
    /// The volume key given does not match the header's digest.
    #[error("Volume key does not match the volume.")]
    VolumeKeyMismatch,
    /// A keyslot number outside the format's range.
    #[error("keyslot {slot} is invalid (LUKS{version} has keyslots 0..{max})")]
    BadKeyslot {
        /// Requested slot.
        slot: u32,
        /// LUKS version.
        version: u8,
        /// Number of keyslots.
        max: u32,
    },
    /// The keyslot is not in use.
    #[error("Keyslot {0} is not active.")]
    KeyslotInactive(u32),
    /// The keyslot is in use.
    #[error("Keyslot {0} is already in use.")]
    KeyslotActive(u32),
    /// Every keyslot is in use.
    #[error("All key slots full.")]
    NoFreeKeyslot,
    /// The keyslots area has no room for another keyslot of this size.
    #[error("not enough free space in the keyslots area for a new keyslot ({need} bytes)")]
    NoKeyslotSpace {
        /// Bytes needed.
        need: u64,
    },
    /// A feature this implementation does not have (the message says which).
    #[error("{0}")]
    Unsupported(String),
    /// The LUKS2 segment's authenticated-encryption pair is not one this implementation has.
    #[error(
        "LUKS2 authenticated encryption {encryption} with integrity {integrity} is not supported ({source})"
    )]
    UnsupportedAead {
        /// The segment's `encryption`.
        encryption: String,
        /// The segment's integrity `type`.
        integrity: String,
        /// Why the pair was refused.
        #[source]
        source: Box<sector_crypto::CryptoError>,
    },
    /// The keyslot-area or data cipher cannot be set up.
    #[error("cannot set up cipher {spec}")]
    Cipher {
        /// Cipher spec.
        spec: String,
        /// Cause.
        #[source]
        source: CryptoError,
    },
    /// Key derivation (or randomness) failed.
    #[error("key derivation failed")]
    Kdf(#[source] KdfError),
    /// A size, count or cost in the header is over its bound (`formats::limits`); nothing
    /// was derived or written.
    #[error("refusing the LUKS header: a value is over sealdisk's bound")]
    Limit(#[source] LimitError),
    /// Bad parameters for format or a keyslot operation.
    #[error("{0}")]
    Params(String),
    /// The dm-integrity layer of an authenticated volume cannot be opened or formatted.
    #[error("dm-integrity layer of the authenticated volume")]
    Integrity(#[source] targets::integrity::IntegrityError),
    /// The authenticated crypt layer does not fit the dm-integrity layer below.
    #[error("authenticated encryption layer")]
    AeadLayer(#[source] targets::CryptError),
}

impl LuksError {
    /// The cause, for a caller to decide on.
    pub fn kind(&self) -> crate::ErrorKind {
        use crate::ErrorKind as K;
        match self {
            LuksError::NotLuks
            | LuksError::WrongVersion { .. }
            | LuksError::BadKeyslot { .. }
            | LuksError::KeyslotInactive(_)
            | LuksError::KeyslotActive(_)
            | LuksError::NoFreeKeyslot
            | LuksError::NoKeyslotSpace { .. }
            | LuksError::Params(_) => K::Usage,
            LuksError::UnsupportedVersion(_)
            | LuksError::Unsupported(_)
            | LuksError::UnsupportedAead { .. }
            | LuksError::Cipher { .. }
            | LuksError::Limit(_) => K::Unsupported,
            LuksError::Luks1(_) | LuksError::Luks1Repair(_) | LuksError::Luks2(_) => K::Corrupt,
            LuksError::Io { source, .. } => match crate::error::block_kind(source) {
                k @ (K::Busy | K::Permission) => k,
                _ => K::Io,
            },
            // The header (or the format asked for) does not fit the device given: the
            // device is the wrong one for it (cryptsetup: -EINVAL, exit 1).
            LuksError::DeviceTooSmall { .. } | LuksError::AeadLayer(_) => K::Usage,
            LuksError::WrongPassphrase | LuksError::VolumeKeyMismatch => K::WrongKey,
            LuksError::Kdf(_) => K::Other,
            LuksError::Integrity(e) => crate::error::integrity_kind(e),
        }
    }
}
