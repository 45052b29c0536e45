//! What goes wrong in a LUKS operation, typed by cause.
use blockdev::BlockError;
use formats::luks1::{Luks1Error, Luks1RepairError};
use formats::luks2::Luks2Error;
use sector_crypto::kdf::KdfError;
use sector_crypto::CryptoError;

use super::LimitError;

/// The key size in bytes of `bits`, which must be whole bytes (cryptsetup's `--key-size`
/// rule, the one place it lives).
pub fn key_bytes(bits: usize) -> Result<usize, LuksError> {
    if bits.is_multiple_of(8) {
        Ok(bits / 8)
    } else {
        Err(ParamError::KeyBits { bits }.into())
    }
}

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
    /// A parameter of a format, keyslot, token or header operation the operation cannot use
    /// (the variant says which and why).
    #[error(transparent)]
    Param(#[from] ParamError),
    /// A reencryption that cannot start, run, resume or activate as asked (its state, its
    /// resilience, its data shift or its hotzones).
    #[error(transparent)]
    Reencrypt(#[from] ReencryptError),
    /// A conversion between LUKS1 and LUKS2 that cannot be done (cryptsetup's reason).
    #[error("{reason}")]
    CannotConvert {
        /// Why (cryptsetup's words).
        reason: String,
    },
    /// A broken internal invariant of this implementation (a bug, not the caller's fault).
    #[error("internal error: {0}")]
    Internal(&'static str),
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
            | LuksError::Param(_)
            | LuksError::CannotConvert { .. } => K::Usage,
            LuksError::Reencrypt(e) => e.kind(),
            LuksError::Internal(_) => K::Internal,
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

/// A parameter of a format, keyslot, token or header operation that cannot be used, typed by
/// what is wrong with it. Every one is the caller's to fix ([`crate::ErrorKind::Usage`]).
/// Display says what is wrong with the value, not which option of which tool set it.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[non_exhaustive]
pub enum ParamError {
    /// A key size that is not whole bytes.
    #[error("key size {bits} bits is not a multiple of 8")]
    KeyBits {
        /// The key size asked for, in bits.
        bits: usize,
    },
    /// A volume key given of another length than the key size asks for.
    #[error("the volume key given holds {have} bytes, the key size asks for {want}")]
    KeyLength {
        /// Bytes given.
        have: usize,
        /// Bytes the key size asks for.
        want: usize,
    },
    /// A key size too large for the format.
    #[error("key size of {bytes} bytes is too large")]
    KeyTooLarge {
        /// Bytes asked for.
        bytes: usize,
    },
    /// A cipher that cannot encrypt keyslot material (cryptsetup's words).
    #[error("Cannot use {cipher} cipher for keyslot encryption.")]
    KeyslotCipher {
        /// The cipher spec.
        cipher: String,
    },
    /// A cipher spec without a mode (LUKS1 stores cipher and mode apart).
    #[error("cipher {cipher:?} has no mode (expected e.g. aes-xts-plain64)")]
    CipherNoMode {
        /// The cipher spec.
        cipher: String,
    },
    /// The cipher asked for is not the one of the authenticated-encryption pair.
    #[error("cipher {cipher} does not match the authenticated cipher {aead}")]
    AeadCipherMismatch {
        /// The cipher asked for.
        cipher: String,
        /// The authenticated pair's cipher.
        aead: String,
    },
    /// An encryption sector size the format does not have.
    #[error("unsupported encryption sector size {size}")]
    SectorSize {
        /// The sector size asked for.
        size: u32,
    },
    /// LUKS1 has 512-byte sectors only.
    #[error("LUKS1 supports only 512-byte sectors")]
    Luks1SectorSize,
    /// Authenticated encryption (a dm-integrity layer) asked for on LUKS1.
    #[error("integrity needs LUKS2")]
    IntegrityNeedsLuks2,
    /// A label or subsystem asked for on LUKS1.
    #[error("labels and subsystems need LUKS2")]
    LabelNeedsLuks2,
    /// LUKS2 metadata or keyslots area sizes that cannot be laid out.
    #[error("Unsupported LUKS2 metadata size options.")]
    MetadataSizeOptions,
    /// A LUKS2 metadata size that is not one of the format's.
    #[error(
        "Unsupported LUKS2 metadata size options. (metadata size {size}: 16k, 32k, 64k, 128k, 256k, 512k, \
         1m, 2m or 4m)"
    )]
    MetadataSize {
        /// Bytes asked for.
        size: u64,
    },
    /// A LUKS2 keyslots area size that is not whole 4 KiB blocks or is over the bound.
    #[error(
        "Unsupported LUKS2 metadata size options. (keyslots size {size}: a multiple of 4096 bytes, at most \
         {max})"
    )]
    KeyslotsSize {
        /// Bytes asked for.
        size: u64,
        /// The largest keyslots area.
        max: u64,
    },
    /// A data offset below the header's end (LUKS2).
    #[error("Requested data offset is too small.")]
    DataOffsetTooSmall,
    /// A data offset below the LUKS1 header and keyslots.
    #[error(
        "requested data offset {offset} sectors is too small: the LUKS1 header and keyslots need {need}"
    )]
    Luks1DataOffsetTooSmall {
        /// The offset asked for, in 512-byte sectors.
        offset: u64,
        /// The header's end, in 512-byte sectors.
        need: u64,
    },
    /// A data offset the format cannot store.
    #[error("data offset too large")]
    DataOffsetTooLarge,
    /// A data offset that is not whole 512-byte sectors.
    #[error("Requested data offset is not a multiple of 512 bytes.")]
    DataOffsetUnaligned,
    /// A data offset that is not whole encryption sectors.
    #[error("data offset {offset} is not aligned to the encryption sector size {sector_size}")]
    DataOffsetSector {
        /// The data offset in bytes.
        offset: u64,
        /// The encryption sector size.
        sector_size: u32,
    },
    /// A data device whose size is not whole encryption sectors (cryptsetup's words).
    #[error("Data device is not aligned to encryption sector size ({align} bytes).")]
    DataUnaligned {
        /// The alignment needed, in bytes.
        align: u64,
    },
    /// No data after the data offset (cryptsetup's words).
    #[error("Device is too small.")]
    NoData,
    /// No data after the data offset of the device named.
    #[error("device {device} is too small: no data after the LUKS data offset ({offset} bytes)")]
    NoDataAfterOffset {
        /// The data device.
        device: String,
        /// The data offset in bytes.
        offset: u64,
    },
    /// A PBKDF name that is none of the format's.
    #[error("unknown PBKDF {0:?} (pbkdf2, argon2i, argon2id)")]
    UnknownPbkdf(String),
    /// A PBKDF other than pbkdf2 asked for on LUKS1.
    #[error("luks1 keyslots use pbkdf2 only, not {kdf}")]
    Luks1Pbkdf2Only {
        /// The PBKDF asked for (lower case).
        kdf: String,
    },
    /// A LUKS1 keyslot without pbkdf2.
    #[error("LUKS1 keyslots use pbkdf2 only")]
    Luks1KeyslotKdf,
    /// A forced iteration count below the KDF's minimum.
    #[error("forced iteration count is too low for {kdf} (minimum is {min})")]
    IterationsTooLow {
        /// The KDF.
        kdf: &'static str,
        /// Its minimum.
        min: u32,
    },
    /// A UUID that is not one (cryptsetup's words).
    #[error("Wrong LUKS UUID format provided: {0:?}")]
    Uuid(String),
    /// A LUKS2 label or subsystem over the header's 47 bytes.
    #[error("LUKS2 {what} is longer than 47 bytes.")]
    LabelTooLong {
        /// `label` or `subsystem`.
        what: &'static str,
    },
    /// A persistent activation flag LUKS2 does not have.
    #[error("unknown persistent activation flag {0:?}")]
    PersistentFlag(String),
    /// A keyslot priority that is none of `ignore`, `normal`, `prefer`.
    #[error("keyslot priority {0:?} is not one of ignore, normal, prefer")]
    Priority(String),
    /// A token number outside the format's range (cryptsetup's words).
    #[error("Token {0} is invalid.")]
    TokenInvalid(u32),
    /// A token number in use (cryptsetup's words).
    #[error("Token {0} in use.")]
    TokenInUse(u32),
    /// A token number not in use (cryptsetup's words).
    #[error("Token {0} is not in use.")]
    TokenNotInUse(u32),
    /// Every token number is in use (cryptsetup's words).
    #[error("No free token slot.")]
    NoFreeToken,
    /// A token to export that is not there (cryptsetup's words).
    #[error("Failed to get token {0} for export.")]
    TokenMissing(u32),
    /// A LUKS2 header backup with a damaged or stale copy.
    #[error("the LUKS2 header backup has a damaged or stale copy; refusing to restore it")]
    BackupStale,
    /// A header backup for another data offset than the device's.
    #[error("data offset of the backup ({backup} bytes) differs from the device's ({device} bytes)")]
    BackupOffset {
        /// The backup's data offset.
        backup: u64,
        /// The device's.
        device: u64,
    },
    /// An operation on the integrity segment of a header that has none.
    #[error("the LUKS2 header has no integrity segment")]
    NoIntegritySegment,
    /// Discards asked for on an authenticated volume.
    #[error("discards are not supported with authenticated encryption")]
    AeadDiscards,
    /// A journal watermark over 100%.
    #[error("journal watermark {0}% is above 100%")]
    JournalWatermark(u32),
    /// A journal larger than the dm-integrity superblock can describe.
    #[error("a journal of {0} bytes is too large")]
    JournalTooLarge(u64),
    /// Journal tuning asked for on a volume without a dm-integrity layer (the words name
    /// LUKS2's `--integrity` volumes, as the API's tests check).
    #[error("the journal watermark and commit time apply to LUKS2 volumes with --integrity only")]
    JournalTuningWithoutIntegrity,
    /// A wipe start that is not on a sector of the volume.
    #[error("wipe offset {offset} is not a multiple of the sector size {sector_size} within the volume's {total} bytes")]
    WipeOffset {
        /// The offset asked for.
        offset: u64,
        /// The volume's sector size.
        sector_size: u32,
        /// The volume's size in bytes.
        total: u64,
    },
}

/// Why a reencryption cannot start, run, resume or be activated as asked, typed by cause:
/// its state, its keys, its resilience, its data shift, its hotzones. Display keeps
/// cryptsetup's words where it has them.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[non_exhaustive]
pub enum ReencryptError {
    /// LUKS1: reencryption needs LUKS2.
    #[error("Reencryption is supported only for LUKS2 in this version of sealdisk.")]
    NeedsLuks2,
    /// A reencryption is already in progress.
    #[error("LUKS2 reencryption already initialized. Aborting operation.")]
    AlreadyInitialized,
    /// The device to encrypt is LUKS already.
    #[error("Device is already LUKS device.")]
    AlreadyLuks,
    /// No reencryption is in progress.
    #[error("Device reencryption not in progress.")]
    NotInProgress,
    /// The reencryption metadata does not match its verification digest.
    #[error("Reencryption metadata is invalid.")]
    MetadataInvalid,
    /// Every hotzone is written but the run was not finished: only a run can finish it.
    #[error(
        "The reencryption wrote every hotzone but was not finished (its old keyslots are gone): finish the \
         reencryption first."
    )]
    NotFinished,
    /// A hotzone left in reencryption needs recovery, which writes, and the open is read-only.
    #[error(
        "The reencryption was interrupted mid-hotzone and needs recovery, which writes: open it read-write \
         (or resume the reencryption)."
    )]
    NeedsRecovery,
    /// The last hotzone of a data-shift decryption needs recovery, which writes.
    #[error(
        "The decryption with data shift was interrupted while it decrypted its last hotzone in place, \
         which needs recovery, which writes: open it read-write (or resume the decryption with its header \
         file)."
    )]
    ShiftNeedsRecovery,
    /// The keyslot named holds neither key of the reencryption (cryptsetup's words).
    #[error("No usable keyslot is available.")]
    NoUsableKeyslot,
    /// The keyslot named opens only one of the two keys the reencryption needs.
    #[error(
        "Key (digest id {digest}) required but not unlocked: keyslot {keyslot} opens only one of the two \
         volume keys of the reencryption in progress."
    )]
    KeyslotOpensOneKey {
        /// The keyslot named.
        keyslot: u32,
        /// The digest of the key it does not open.
        digest: u32,
    },
    /// Several keyslots hold the volume key and none was named to keep.
    #[error(
        "The volume has {} keyslots ({}): reencryption keeps only one passphrase and removes the other \
         keyslots at the end.",
        keyslots.len(),
        keyslots.iter().map(u32::to_string).collect::<Vec<_>>().join(", ")
    )]
    KeyslotNotNamed {
        /// The keyslots of the volume key.
        keyslots: Vec<u32>,
    },
    /// A resilience mode that is none of cryptsetup's.
    #[error("Unsupported resilience mode {0}")]
    Resilience(String),
    /// A resilience mode this reencryption cannot use.
    #[error("Resilience mode {0} cannot be applied to current reencryption operation.")]
    ResilienceNotApplicable(String),
    /// A resilience hash that is not available.
    #[error("Hash algorithm {0} is not available.")]
    ResilienceHash(String),
    /// A device size reduction that is not whole 512-byte sectors (cryptsetup's words).
    #[error("Reduce size must be multiple of 512 bytes sector.")]
    ReduceSize,
    /// The header's half of the size reduction is not whole 4 KiB blocks.
    #[error("The header takes half of the device size reduction ({shift} bytes), which must be a multiple of 4096.")]
    ShiftHeaderAlignment {
        /// The header's size (half the reduction).
        shift: u64,
    },
    /// Header metadata larger than the data shift.
    #[error("LUKS2 metadata size is larger than data shift value.")]
    MetadataLargerThanShift,
    /// A data shift that is not whole encryption sectors.
    #[error("Data shift value is not aligned to encryption sector size ({align} bytes).")]
    ShiftUnaligned {
        /// The encryption sector size.
        align: u64,
    },
    /// A data shift as large as the data or larger (cryptsetup's words).
    #[error("Failed to initialize LUKS2 reencryption in metadata.")]
    ShiftLargerThanData,
    /// A moved first segment that is not whole checksum blocks (cryptsetup's words).
    #[error("Failed to initialize LUKS2 reencryption in metadata.")]
    MovedSegmentUnaligned,
    /// A moved first segment larger than the data shift (cryptsetup's words).
    #[error(
        "Moved segment size can not be greater than data shift value.\nFailed to initialize LUKS2 \
         reencryption in metadata."
    )]
    MovedSegmentTooLarge,
    /// A moved first segment too large for the journal (cryptsetup's words).
    #[error(
        "Moved segment too large. Requested size {requested}, available space for: {available}.\nFailed to \
         initialize LUKS2 reencryption in metadata."
    )]
    MovedSegmentNoRoom {
        /// Bytes to move.
        requested: u64,
        /// Bytes of room.
        available: u64,
    },
    /// No room in the keyslots area for the new keyslot (cryptsetup's words).
    #[error("No space for new keyslot.")]
    KeyslotsAreaFull,
    /// A data size that is not whole hotzone alignments (cryptsetup's words).
    #[error("Device size must be multiple of calculated zone alignment ({0} bytes).")]
    DeviceSizeAlignment(u64),
    /// A hotzone size that is not whole alignments (cryptsetup's words).
    #[error("Hotzone size must be multiple of calculated zone alignment ({0} bytes).")]
    HotzoneAlignment(u64),
    /// No hotzone length fits the resilience area (cryptsetup's words).
    #[error("Invalid reencryption length.")]
    InvalidLength,
    /// No room in the keyslots area for a detached data shift's hotzone checksums.
    #[error("No room left in the keyslots area for the hotzone checksums of the data shift encryption.")]
    NoRoomForChecksums,
    /// An interrupted datashift hotzone with a detached header and no checksums of it.
    #[error(
        "Cannot recover the interrupted hotzone at {offset} ({len} bytes): its datashift resilience keeps \
         no copy of it with a detached header, and no sealdisk checksums of it were found (was it \
         interrupted in cryptsetup?). Its blocks may be partly encrypted; restore the data from a backup."
    )]
    HotzoneNoChecksums {
        /// The hotzone's offset in the data.
        offset: u64,
        /// Its length.
        len: u64,
    },
    /// An interrupted hotzone of resilience `none`.
    #[error("Cannot recover the interrupted hotzone: resilience mode none keeps no copy.")]
    HotzoneNoCopy,
}

impl ReencryptError {
    /// The cause, for a caller to decide on.
    pub fn kind(&self) -> crate::ErrorKind {
        match self {
            // What is on the disk does not allow it (cryptsetup: -EINVAL, exit 1).
            ReencryptError::MetadataInvalid
            | ReencryptError::HotzoneNoChecksums { .. }
            | ReencryptError::HotzoneNoCopy => crate::ErrorKind::Corrupt,
            _ => crate::ErrorKind::Usage,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::ErrorKind;

    /// One of each library error this module builds without a device or a cause.
    fn samples() -> Vec<LuksError> {
        use ParamError as P;
        use ReencryptError as R;
        let p = [
            P::KeyBits { bits: 250 },
            P::KeyLength { have: 32, want: 64 },
            P::KeyTooLarge { bytes: usize::MAX },
            P::KeyslotCipher { cipher: "aes-xts-plain64".into() },
            P::CipherNoMode { cipher: "aes".into() },
            P::AeadCipherMismatch { cipher: "aes-xts-plain64".into(), aead: "aes-gcm-random".into() },
            P::SectorSize { size: 8192 },
            P::Luks1SectorSize,
            P::IntegrityNeedsLuks2,
            P::LabelNeedsLuks2,
            P::MetadataSizeOptions,
            P::MetadataSize { size: 1 },
            P::KeyslotsSize { size: 1, max: 2 },
            P::DataOffsetTooSmall,
            P::Luks1DataOffsetTooSmall { offset: 1, need: 4096 },
            P::DataOffsetTooLarge,
            P::DataOffsetUnaligned,
            P::DataOffsetSector { offset: 512, sector_size: 4096 },
            P::DataUnaligned { align: 4096 },
            P::NoData,
            P::NoDataAfterOffset { device: "disk.img".into(), offset: 16 << 20 },
            P::UnknownPbkdf("scrypt".into()),
            P::Luks1Pbkdf2Only { kdf: "argon2id".into() },
            P::Luks1KeyslotKdf,
            P::IterationsTooLow { kdf: "pbkdf2", min: 1000 },
            P::Uuid("x".into()),
            P::LabelTooLong { what: "label" },
            P::PersistentFlag("x".into()),
            P::Priority("x".into()),
            P::TokenInvalid(40),
            P::TokenInUse(0),
            P::TokenNotInUse(7),
            P::NoFreeToken,
            P::TokenMissing(7),
            P::BackupStale,
            P::BackupOffset { backup: 1, device: 2 },
            P::NoIntegritySegment,
            P::AeadDiscards,
            P::JournalWatermark(101),
            P::JournalTooLarge(1 << 40),
            P::WipeOffset { offset: 1, sector_size: 512, total: 4096 },
        ];
        let r = [
            R::NeedsLuks2,
            R::AlreadyInitialized,
            R::AlreadyLuks,
            R::NotInProgress,
            R::MetadataInvalid,
            R::NotFinished,
            R::NeedsRecovery,
            R::ShiftNeedsRecovery,
            R::NoUsableKeyslot,
            R::KeyslotOpensOneKey { keyslot: 0, digest: 1 },
            R::KeyslotNotNamed { keyslots: vec![0, 3] },
            R::Resilience("sideways".into()),
            R::ResilienceNotApplicable("none".into()),
            R::ResilienceHash("md4".into()),
            R::ReduceSize,
            R::ShiftHeaderAlignment { shift: 1000 },
            R::MetadataLargerThanShift,
            R::ShiftUnaligned { align: 4096 },
            R::ShiftLargerThanData,
            R::MovedSegmentUnaligned,
            R::MovedSegmentTooLarge,
            R::MovedSegmentNoRoom { requested: 1, available: 0 },
            R::KeyslotsAreaFull,
            R::DeviceSizeAlignment(4096),
            R::HotzoneAlignment(4096),
            R::InvalidLength,
            R::NoRoomForChecksums,
            R::HotzoneNoChecksums { offset: 0, len: 4096 },
            R::HotzoneNoCopy,
        ];
        let mut all: Vec<LuksError> = p.into_iter().map(LuksError::from).collect();
        all.extend(r.into_iter().map(LuksError::from));
        all.push(LuksError::CannotConvert { reason: "Device is already LUKS2 type.".into() });
        all.push(LuksError::Internal("a broken invariant"));
        all
    }

    #[test]
    fn kinds_follow_the_cause() {
        assert_eq!(LuksError::Internal("x").kind(), ErrorKind::Internal);
        assert_eq!(key_bytes(250).unwrap_err().kind(), ErrorKind::Usage);
        assert_eq!(LuksError::from(ReencryptError::NotInProgress).kind(), ErrorKind::Usage);
        assert_eq!(LuksError::from(ReencryptError::MetadataInvalid).kind(), ErrorKind::Corrupt);
        assert_eq!(LuksError::from(ParamError::SectorSize { size: 8192 }).kind(), ErrorKind::Usage);
        for e in samples() {
            let k = e.kind();
            match &e {
                LuksError::Internal(_) => assert_eq!(k, ErrorKind::Internal, "{e:?}"),
                _ => assert!(matches!(k, ErrorKind::Usage | ErrorKind::Corrupt), "{e:?}: {k:?}"),
            }
        }
    }

    #[test]
    fn key_bytes_is_whole_bytes_only() {
        assert_eq!(key_bytes(512).unwrap(), 64);
        assert_eq!(key_bytes(0).unwrap(), 0);
        assert!(matches!(key_bytes(250), Err(LuksError::Param(ParamError::KeyBits { bits: 250 }))));
        assert_eq!(key_bytes(250).unwrap_err().to_string(), "key size 250 bits is not a multiple of 8");
    }

    /// The library says what is wrong with a value, not which option of which tool set it:
    /// no `--flag` and no command line in any Display. (The one exception the API's tests pin
    /// is the journal tuning on a volume without `--integrity`.)
    #[test]
    fn library_wording_names_no_cli_flag() {
        for e in samples() {
            let text = e.to_string();
            assert!(!text.contains("--"), "{e:?}: {text}");
            assert!(!text.contains("`sealdisk"), "{e:?}: {text}");
            assert!(!text.is_empty(), "{e:?}");
        }
    }
}
