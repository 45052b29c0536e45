//! LUKS1 and LUKS2 volumes: probe, load, unlock and activate; format; keyslot, UUID and
//! header-backup operations. cryptsetup-compatible both ways.
//!
//! ```text
//!  metadata device (the data device, or a detached --header file)
//!      │ probe(): magic + version
//!      ▼
//!  Luks::load ── LUKS1: formats::luks1 phdr ─────────────────────────────┐
//!      │          LUKS2: primary + secondary (scan), choose, repair plan  │  (formats: sans-IO)
//!      ▼                                                                  │
//!  unlock(passphrase) ── per keyslot, in priority order:                  │
//!      KDF(pass, salt) → decrypt area (keyslot.rs) → AF merge → digest ───┘
//!      ▼
//!  table(volume key, data device) → formats::dm::CryptTable → CryptTarget (crate::crypt_over)
//! ```
//!
//! Writes to the metadata device follow cryptsetup's order so a crash leaves the old or the
//! new header, never neither:
//! * LUKS2 headers are rewritten through [`formats::luks2::Luks2Header::write_plan`]
//!   (primary, flush, secondary, flush, with a bumped seqid).
//! * A new keyslot's material is written and flushed *before* the header that references
//!   it; a killed keyslot's material is wiped and flushed before the header drops it.
//!
//! LUKS2 authenticated encryption (a segment with `integrity`) stacks an
//! [`targets::AeadCryptTarget`] over a dm-integrity target with external tags at the data
//! offset, as cryptsetup does (`aead.rs`).
//!
//! Not supported (refused with a clear error rather than opened wrongly): reencryption in progress, OPAL
//! segments, unknown mandatory requirements, tokens as unlock methods (tokens are kept
//! verbatim through every header rewrite).

mod aead;
mod dump;
mod io;
mod keyslot;
mod luks1;
mod luks2;
mod pbkdf;

use std::time::Duration;

use blockdev::{BlockDevice, BlockError};
use formats::dm::CryptTable;
use formats::luks1::{Luks1Error, Luks1Header};
use formats::luks2::{CopyKind, HeaderSalts, Luks2Error, Luks2Header};
use sector_crypto::kdf::Kdf;
use sector_crypto::kdf::{HashAlg, KdfError, Passphrase};
use sector_crypto::secure::SecretBuf;
use sector_crypto::{CryptoError, VolumeKey};
use zeroize::Zeroizing;

pub use aead::{format_integrity, format_integrity_until, wipe_integrity, LuksIntegrity, WipeEnd};
pub use dump::{dump, dump_volume_key};
/// Activation flags of [`OpenParams::flags`] (re-exported for callers that do not use `formats`).
pub use formats::dm::CryptOptions;
/// The soft KDF bounds an unlock applies ([`Luks::unlock_with`], [`OpenParams::kdf_limits`]).
pub use formats::limits::{KdfLimits, LimitError};
pub use pbkdf::{default_parallel, PbkdfParams, PbkdfType};

/// LUKS1 keyslots.
pub const LUKS1_KEYSLOTS: u32 = 8;
/// LUKS2 keyslots (cryptsetup `LUKS2_KEYSLOTS_MAX`).
pub const LUKS2_KEYSLOTS: u32 = 32;

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

/// LUKS version.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum LuksVersion {
    /// LUKS1.
    V1,
    /// LUKS2.
    V2,
}

impl LuksVersion {
    /// 1 or 2.
    pub fn number(self) -> u8 {
        match self {
            Self::V1 => 1,
            Self::V2 => 2,
        }
    }
}

/// Looks for a LUKS header at the start of `dev`: `Ok(None)` if there is no LUKS magic.
pub fn probe(dev: &dyn BlockDevice) -> Result<Option<LuksVersion>, LuksError> {
    if dev.geometry().size < 8 {
        return Ok(None);
    }
    let b = io::read_bytes(dev, 0, 8, "LUKS header")?;
    if b[..6] != formats::luks1::MAGIC {
        // A wiped primary LUKS2 header: look for a secondary copy where one may be
        // (cryptsetup `LUKS2_HDR2_OFFSETS`), which the load then repairs from.
        for off in formats::luks2::METADATA_SIZES {
            if off + 8 > dev.geometry().size {
                break;
            }
            let s = io::read_bytes(dev, off, 8, "LUKS header")?;
            if s[..6] == formats::luks2::MAGIC_SECONDARY && s[6..8] == [0, 2] {
                return Ok(Some(LuksVersion::V2));
            }
        }
        return Ok(None);
    }
    match u16::from_be_bytes([b[6], b[7]]) {
        1 => Ok(Some(LuksVersion::V1)),
        2 => Ok(Some(LuksVersion::V2)),
        v => Err(LuksError::UnsupportedVersion(v)),
    }
}

/// A loaded LUKS2 header with the per-copy salts to keep on the next write.
#[derive(Debug, Clone)]
pub struct Luks2State {
    /// The header (seqid = the on-disk one).
    pub header: Luks2Header,
    /// The salts of both copies.
    pub salts: HeaderSalts,
}

/// Either header.
#[derive(Debug, Clone)]
pub enum LuksHeader {
    /// LUKS1 phdr.
    V1(Box<Luks1Header>),
    /// LUKS2 metadata.
    V2(Box<Luks2State>),
}

/// A LUKS volume's header, loaded from its metadata device.
#[derive(Debug, Clone)]
pub struct Luks {
    /// The header.
    pub header: LuksHeader,
    /// A damaged or stale LUKS2 copy that was rewritten from the good one during load.
    pub repaired: Option<CopyKind>,
    /// A damaged or stale LUKS2 copy left alone (read-only load).
    pub needs_repair: Option<CopyKind>,
}

/// Where the data of an unlocked volume lives, and how it is encrypted.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Segment {
    /// Byte offset on the data device.
    pub offset: u64,
    /// Byte length, `None` = to the end of the data device.
    pub size: Option<u64>,
    /// Cipher spec.
    pub cipher: String,
    /// Encryption sector size.
    pub sector_size: u32,
    /// IV offset in 512-byte sectors.
    pub iv_offset: u64,
    /// Persistent activation flags (LUKS2 `config.flags`).
    pub flags: Vec<String>,
}

impl Luks {
    /// Reads and validates the header on `meta`. With `repair`, a damaged or stale LUKS2
    /// copy is rewritten from the good one (cryptsetup's auto-recovery on a writable load);
    /// without, it is only reported in [`needs_repair`](Self::needs_repair).
    pub fn load(meta: &dyn BlockDevice, repair: bool) -> Result<Self, LuksError> {
        match probe(meta)? {
            None => Err(LuksError::NotLuks),
            Some(LuksVersion::V1) => luks1::load(meta),
            Some(LuksVersion::V2) => luks2::load(meta, repair),
        }
    }

    /// Loads from an in-memory image (a header backup file).
    pub fn load_image(image: &[u8]) -> Result<Self, LuksError> {
        let block = if image.len().is_multiple_of(4096) { 4096 } else { 512 };
        let mut padded = image.to_vec();
        padded.resize(image.len().div_ceil(block) * block, 0);
        let dev = blockdev::MemDevice::from_vec(padded, block as u32);
        Self::load(&dev, false)
    }

    /// LUKS version.
    pub fn version(&self) -> LuksVersion {
        match self.header {
            LuksHeader::V1(_) => LuksVersion::V1,
            LuksHeader::V2(_) => LuksVersion::V2,
        }
    }

    /// UUID text.
    pub fn uuid(&self) -> &str {
        match &self.header {
            LuksHeader::V1(h) => &h.uuid,
            LuksHeader::V2(s) => &s.header.uuid,
        }
    }

    /// Volume key length in bytes.
    pub fn key_bytes(&self) -> usize {
        match &self.header {
            LuksHeader::V1(h) => h.key_bytes as usize,
            LuksHeader::V2(s) => luks2::volume_key_size(&s.header).unwrap_or(0),
        }
    }

    /// Number of keyslots of this format.
    pub fn max_keyslots(&self) -> u32 {
        match self.header {
            LuksHeader::V1(_) => LUKS1_KEYSLOTS,
            LuksHeader::V2(_) => LUKS2_KEYSLOTS,
        }
    }

    /// Active keyslots, ascending.
    pub fn active_keyslots(&self) -> Vec<u32> {
        match &self.header {
            LuksHeader::V1(h) => luks1::active(h),
            LuksHeader::V2(s) => s.header.metadata.keyslots.keys().copied().collect(),
        }
    }

    /// Bytes of header and keyslot areas (what a header backup holds).
    pub fn metadata_bytes(&self) -> u64 {
        match &self.header {
            LuksHeader::V1(h) => luks1::backup_size(h),
            LuksHeader::V2(s) => s.header.metadata.metadata_and_keyslots_size(),
        }
    }

    fn check_slot(&self, slot: u32) -> Result<(), LuksError> {
        if slot >= self.max_keyslots() {
            return Err(LuksError::BadKeyslot {
                slot,
                version: self.version().number(),
                max: self.max_keyslots() - 1,
            });
        }
        Ok(())
    }

    /// Refuses what cannot be opened correctly: unknown mandatory requirements,
    /// reencryption, integrity segments, non-crypt segments.
    pub fn check_supported(&self) -> Result<(), LuksError> {
        match &self.header {
            LuksHeader::V1(_) => Ok(()),
            LuksHeader::V2(s) => luks2::check_supported(&s.header),
        }
    }

    /// Tries the passphrase on `slot`, or on every usable keyslot in priority order
    /// (LUKS2: `prefer` first, then `normal`; `ignore` only when named). Returns the
    /// keyslot that opened and the volume key.
    ///
    /// The header's KDF costs are checked against the default [`KdfLimits`] first; see
    /// [`unlock_with`](Self::unlock_with).
    pub fn unlock(
        &self,
        meta: &dyn BlockDevice,
        passphrase: &Passphrase,
        slot: Option<u32>,
    ) -> Result<(u32, VolumeKey), LuksError> {
        self.unlock_with(meta, passphrase, slot, &KdfLimits::default())
    }

    /// [`unlock`](Self::unlock) with explicit KDF bounds. Every keyslot that would be tried
    /// (and the digest that checks it) is checked against `limits` and the format's hard
    /// bounds **before** any derivation runs, so a hostile header fails in milliseconds
    /// with [`LuksError::Limit`] naming the field, its value, the bound and the option that
    /// lifts it.
    pub fn unlock_with(
        &self,
        meta: &dyn BlockDevice,
        passphrase: &Passphrase,
        slot: Option<u32>,
        limits: &KdfLimits,
    ) -> Result<(u32, VolumeKey), LuksError> {
        if let Some(s) = slot {
            self.check_slot(s)?;
        }
        match &self.header {
            LuksHeader::V1(h) => luks1::unlock(h, meta, passphrase.as_bytes(), slot, limits),
            LuksHeader::V2(s) => luks2::unlock(&s.header, meta, passphrase.as_bytes(), slot, limits),
        }
    }

    /// Checks a volume key against the header's digest (whose PBKDF2 cost is checked
    /// against the default [`KdfLimits`] first).
    pub fn verify_volume_key(&self, vk: &VolumeKey) -> Result<(), LuksError> {
        let limits = KdfLimits::default();
        let ok = match &self.header {
            LuksHeader::V1(h) => {
                luks1::check_digest(h, &limits)?;
                luks1::verify_key(h, vk)?
            }
            LuksHeader::V2(s) => luks2::verify_segment_key(&s.header, vk, &limits)?,
        };
        if ok {
            Ok(())
        } else {
            Err(LuksError::VolumeKeyMismatch)
        }
    }

    /// The authenticated cipher of a LUKS2 segment with `integrity`, `None` for plain
    /// encryption (and LUKS1).
    pub fn aead(&self) -> Result<Option<sector_crypto::AeadSpec>, LuksError> {
        match &self.header {
            LuksHeader::V1(_) => Ok(None),
            LuksHeader::V2(s) => luks2::aead_spec(&s.header),
        }
    }

    /// The data segment to activate.
    pub fn segment(&self) -> Result<Segment, LuksError> {
        match &self.header {
            LuksHeader::V1(h) => Ok(Segment {
                offset: h.payload_offset_bytes(),
                size: None,
                cipher: h.cipher_spec(),
                sector_size: 512,
                iv_offset: 0,
                flags: Vec::new(),
            }),
            LuksHeader::V2(s) => luks2::segment(&s.header),
        }
    }

    /// The dm-crypt table that activates this volume on `data_device` (`data_size` bytes)
    /// with `vk`. `extra` holds flags from the command line; the header's persistent flags
    /// are added to them.
    pub fn table(
        &self,
        data_device: &str,
        data_size: u64,
        vk: &VolumeKey,
        extra: &CryptOptions,
    ) -> Result<CryptTable, LuksError> {
        self.check_supported()?;
        if self.aead()?.is_some() {
            return Err(LuksError::Unsupported(
                "an authenticated (integrity) segment has no plain dm-crypt table: open it with luks::open"
                    .into(),
            ));
        }
        let seg = self.segment()?;
        let per = u64::from(seg.sector_size);
        let len = match seg.size {
            Some(s) => {
                if seg.offset.saturating_add(s) > data_size {
                    return Err(LuksError::DeviceTooSmall { need: seg.offset + s, have: data_size });
                }
                s
            }
            None => data_size.saturating_sub(seg.offset) / per * per,
        };
        if len == 0 {
            return Err(LuksError::Params(format!(
                "device {data_device} is too small: no data after the LUKS data offset ({} bytes)",
                seg.offset
            )));
        }
        let has = |f: &str| seg.flags.iter().any(|x| x == f);
        let options = CryptOptions {
            allow_discards: extra.allow_discards || has("allow-discards"),
            same_cpu_crypt: extra.same_cpu_crypt || has("same-cpu-crypt"),
            submit_from_crypt_cpus: extra.submit_from_crypt_cpus || has("submit-from-crypt-cpus"),
            no_read_workqueue: extra.no_read_workqueue || has("no-read-workqueue"),
            no_write_workqueue: extra.no_write_workqueue || has("no-write-workqueue"),
            high_priority: extra.high_priority || has("high_priority"),
            sector_size: (seg.sector_size != 512).then_some(seg.sector_size),
            iv_large_sectors: false,
            integrity_aead: None,
        };
        Ok(CryptTable {
            len: len / 512,
            cipher: seg.cipher,
            key: Zeroizing::new(vk.as_bytes().to_vec()),
            iv_offset: seg.iv_offset,
            device: data_device.to_owned(),
            offset: seg.offset / 512,
            options,
        })
    }

    /// Adds a keyslot for `vk` (already verified) protected by `passphrase`, in `slot` or the
    /// first free one. Returns the slot.
    pub fn add_keyslot(
        &mut self,
        meta: &dyn BlockDevice,
        vk: &VolumeKey,
        passphrase: &Passphrase,
        slot: Option<u32>,
        pbkdf: &PbkdfParams,
    ) -> Result<u32, LuksError> {
        self.check_supported()?;
        if let Some(s) = slot {
            self.check_slot(s)?;
            if self.active_keyslots().contains(&s) {
                return Err(LuksError::KeyslotActive(s));
            }
        }
        let slot = match slot {
            Some(s) => s,
            None => (0..self.max_keyslots())
                .find(|s| !self.active_keyslots().contains(s))
                .ok_or(LuksError::NoFreeKeyslot)?,
        };
        let key = self.slot_key(vk, passphrase, pbkdf)?;
        self.store_keyslot(meta, slot, vk, &key, pbkdf.hash)?;
        Ok(slot)
    }

    /// Runs a new keyslot's KDF for `passphrase`: the slow part, done before any write.
    fn slot_key(
        &self,
        vk: &VolumeKey,
        passphrase: &Passphrase,
        pbkdf: &PbkdfParams,
    ) -> Result<SlotKey, LuksError> {
        match &self.header {
            LuksHeader::V1(h) => luks1::slot_key(h, passphrase.as_bytes(), pbkdf),
            LuksHeader::V2(s) => luks2::slot_key(&s.header, vk.len(), passphrase.as_bytes(), pbkdf),
        }
    }

    /// Writes a keyslot for `vk` with an already derived key into free slot `slot`.
    fn store_keyslot(
        &mut self,
        meta: &dyn BlockDevice,
        slot: u32,
        vk: &VolumeKey,
        key: &SlotKey,
        af_hash: HashAlg,
    ) -> Result<(), LuksError> {
        match &mut self.header {
            LuksHeader::V1(h) => luks1::add_keyslot(h, meta, slot, vk, key),
            LuksHeader::V2(s) => luks2::add_keyslot(s, meta, slot, vk, key, af_hash),
        }
    }

    /// Destroys `slot`: wipes its key material, then drops it from the header.
    pub fn kill_keyslot(&mut self, meta: &dyn BlockDevice, slot: u32) -> Result<(), LuksError> {
        self.check_slot(slot)?;
        if !self.active_keyslots().contains(&slot) {
            return Err(LuksError::KeyslotInactive(slot));
        }
        match &mut self.header {
            LuksHeader::V1(h) => luks1::kill_keyslot(h, meta, slot),
            LuksHeader::V2(s) => luks2::kill_keyslot(s, meta, slot),
        }
    }

    /// Replaces the passphrase of `slot` (cryptsetup `luksChangeKey`): a new keyslot with
    /// the new passphrase replaces the old one. The new keyslot takes the same number when
    /// the format allows writing it elsewhere first (LUKS2: a free area; LUKS1: a free slot
    /// whose number is then the new one, as cryptsetup does). Returns the new slot.
    pub fn change_keyslot(
        &mut self,
        meta: &dyn BlockDevice,
        slot: u32,
        vk: &VolumeKey,
        new_passphrase: &Passphrase,
        pbkdf: &PbkdfParams,
    ) -> Result<u32, LuksError> {
        self.check_slot(slot)?;
        // Derive first: nothing is written (or killed) until the new key exists.
        let key = self.slot_key(vk, new_passphrase, pbkdf)?;
        match &mut self.header {
            LuksHeader::V1(_) => {
                let free = (0..LUKS1_KEYSLOTS).find(|s| !self.active_keyslots().contains(s));
                match free {
                    Some(new) => {
                        self.store_keyslot(meta, new, vk, &key, pbkdf.hash)?;
                        self.kill_keyslot(meta, slot)?;
                        Ok(new)
                    }
                    None => {
                        // No free slot: overwrite in place (cryptsetup does the same).
                        self.kill_keyslot(meta, slot)?;
                        self.store_keyslot(meta, slot, vk, &key, pbkdf.hash)?;
                        Ok(slot)
                    }
                }
            }
            LuksHeader::V2(s) => {
                luks2::change_keyslot(s, meta, slot, vk, &key, pbkdf.hash)?;
                Ok(slot)
            }
        }
    }

    /// Sets the UUID (`None`: a fresh random one). Returns the new UUID.
    pub fn set_uuid(&mut self, meta: &dyn BlockDevice, uuid: Option<&str>) -> Result<String, LuksError> {
        let uuid = match uuid {
            Some(u) => {
                check_uuid(u)?;
                u.to_ascii_lowercase()
            }
            None => random_uuid()?,
        };
        match &mut self.header {
            LuksHeader::V1(h) => {
                let mut next = h.clone();
                next.uuid = uuid.clone();
                luks1::write_header(&next, meta)?;
                *h = next;
            }
            LuksHeader::V2(s) => {
                let mut next = s.clone();
                next.header.uuid = uuid.clone();
                luks2::write_header(&mut next, meta)?;
                *s = next;
            }
        }
        Ok(uuid)
    }

    /// Wipes every keyslot (cryptsetup `erase`): the volume can no longer be unlocked.
    pub fn erase(&mut self, meta: &dyn BlockDevice) -> Result<(), LuksError> {
        for slot in self.active_keyslots() {
            self.kill_keyslot(meta, slot)?;
        }
        Ok(())
    }

    /// The bytes of a header backup: exactly the header and keyslot areas (LUKS1: up to
    /// the end of the last keyslot, rounded up to 4096 bytes, as cryptsetup writes it).
    pub fn backup(&self, meta: &dyn BlockDevice) -> Result<Zeroizing<Vec<u8>>, LuksError> {
        match &self.header {
            LuksHeader::V1(h) => luks1::backup(h, meta),
            LuksHeader::V2(s) => {
                let len =
                    usize::try_from(s.header.metadata.metadata_and_keyslots_size()).unwrap_or(usize::MAX);
                io::read_bytes(meta, 0, len, "LUKS2 header and keyslots").map(Zeroizing::new)
            }
        }
    }

    /// Restores a header backup onto `meta` after validating it: it must load (a LUKS2
    /// backup needs both copies valid) and fit the device. If `meta` already holds a LUKS
    /// header its data offset must match (else cryptsetup would lose the data). Returns the
    /// restored header.
    pub fn restore(meta: &dyn BlockDevice, image: &[u8]) -> Result<Luks, LuksError> {
        let backup = Self::load_image(image)?;
        if let LuksHeader::V2(_) = backup.header {
            if backup.needs_repair.is_some() {
                return Err(LuksError::Params(
                    "the LUKS2 header backup has a damaged or stale copy; refusing to restore it".into(),
                ));
            }
        }
        let need = backup.metadata_bytes().min(image.len() as u64);
        let size = meta.geometry().size;
        if need > size {
            return Err(LuksError::DeviceTooSmall { need, have: size });
        }
        if let Ok(current) = Self::load(meta, false) {
            let (a, b) = (current.segment().map(|s| s.offset).ok(), backup.segment().map(|s| s.offset).ok());
            if a != b {
                return Err(LuksError::Params(format!(
                    "data offset of the backup ({} bytes) differs from the device's ({} bytes)",
                    b.unwrap_or(0),
                    a.unwrap_or(0)
                )));
            }
        }
        io::write_bytes(meta, 0, &image[..need as usize], "LUKS header")?;
        io::flush(meta, "LUKS header")?;
        Self::load(meta, false)
    }
}

/// Checks a UUID's text form (8-4-4-4-12 hex digits).
pub fn check_uuid(u: &str) -> Result<(), LuksError> {
    let parts: Vec<&str> = u.split('-').collect();
    let ok = parts.len() == 5
        && parts
            .iter()
            .zip([8, 4, 4, 4, 12])
            .all(|(p, n)| p.len() == n && p.bytes().all(|c| c.is_ascii_hexdigit()));
    if ok {
        Ok(())
    } else {
        Err(LuksError::Params(format!("Wrong LUKS UUID format provided: {u:?}")))
    }
}

/// A random (version 4) UUID.
pub fn random_uuid() -> Result<String, LuksError> {
    let mut b = [0u8; 16];
    sector_crypto::kdf::random_bytes(&mut b).map_err(LuksError::Kdf)?;
    b[6] = (b[6] & 0x0f) | 0x40;
    b[8] = (b[8] & 0x3f) | 0x80;
    let h = hex::encode(b);
    Ok(format!("{}-{}-{}-{}-{}", &h[..8], &h[8..12], &h[12..16], &h[16..20], &h[20..]))
}

/// Parameters of `luksFormat`, with cryptsetup's names and defaults.
#[derive(Debug, Clone)]
pub struct FormatParams {
    /// `--type`: LUKS1 or LUKS2 (default).
    pub version: LuksVersion,
    /// `--cipher` (default `aes-xts-plain64`).
    pub cipher: String,
    /// `--key-size` in bytes (default 64 for XTS, else 32).
    pub key_bytes: usize,
    /// KDF options for keyslot 0 (`--hash` is also the AF and digest hash).
    pub pbkdf: PbkdfParams,
    /// `--sector-size` (LUKS2 only; default 512).
    pub sector_size: u32,
    /// `--label` (LUKS2).
    pub label: Option<String>,
    /// `--subsystem` (LUKS2).
    pub subsystem: Option<String>,
    /// `--uuid`.
    pub uuid: Option<String>,
    /// `--offset`: data offset in 512-byte sectors.
    pub offset: Option<u64>,
    /// `--luks2-metadata-size` in bytes.
    pub metadata_size: Option<u64>,
    /// `--luks2-keyslots-size` in bytes.
    pub keyslots_size: Option<u64>,
    /// `--volume-key-file` contents, else a random key.
    pub volume_key: Option<VolumeKey>,
    /// `--key-slot` for the first keyslot (default 0).
    pub key_slot: Option<u32>,
    /// The header is detached (`--header`): the data starts at `offset` (default 0).
    pub detached: bool,
    /// Size of the data device (for the LUKS2 sector-size alignment check).
    pub data_size: Option<u64>,
    /// `--integrity` (LUKS2 authenticated encryption): `key_bytes` then includes the MAC
    /// key. The dm-integrity area is formatted afterwards by [`format_integrity`].
    pub integrity: Option<LuksIntegrity>,
}

impl Default for FormatParams {
    fn default() -> Self {
        FormatParams {
            version: LuksVersion::V2,
            cipher: "aes-xts-plain64".into(),
            key_bytes: 64,
            pbkdf: PbkdfParams::default(),
            sector_size: 512,
            label: None,
            subsystem: None,
            uuid: None,
            offset: None,
            metadata_size: None,
            keyslots_size: None,
            volume_key: None,
            key_slot: None,
            detached: false,
            data_size: None,
            integrity: None,
        }
    }
}

/// Formats `meta` (the whole device, or a detached header file) as LUKS with one keyslot
/// protected by `passphrase`. Returns the header and the volume key.
pub fn format(
    meta: &dyn BlockDevice,
    params: &FormatParams,
    passphrase: &Passphrase,
) -> Result<(Luks, VolumeKey), LuksError> {
    check_keyslot_cipher(params)?;
    let vk = match &params.volume_key {
        Some(k) => {
            if k.len() != params.key_bytes {
                return Err(LuksError::Params(format!(
                    "volume key file holds {} bytes, --key-size asks for {}",
                    k.len(),
                    params.key_bytes
                )));
            }
            k.clone()
        }
        None => {
            let mut k = SecretBuf::zeroed(params.key_bytes);
            sector_crypto::kdf::random_bytes(&mut k).map_err(LuksError::Kdf)?;
            VolumeKey::from_secret(k)
        }
    };
    let max_slots = if params.version == LuksVersion::V1 { LUKS1_KEYSLOTS } else { LUKS2_KEYSLOTS };
    let first_slot = params.key_slot.unwrap_or(0);
    if first_slot >= max_slots {
        return Err(LuksError::BadKeyslot {
            slot: first_slot,
            version: params.version.number(),
            max: max_slots - 1,
        });
    }
    // The data cipher must be usable with this key.
    let sp = sector_crypto::SectorParams {
        sector_size: if params.version == LuksVersion::V2 { params.sector_size } else { 512 },
        iv_offset: 0,
        iv_large_sectors: false,
    };
    if let Some(i) = &params.integrity {
        aead::check_format(params, i, &vk, sp)?;
    } else {
        let spec: sector_crypto::CipherSpec = params
            .cipher
            .parse()
            .map_err(|source| LuksError::Cipher { spec: params.cipher.clone(), source })?;
        sector_crypto::SectorCipher::new(&spec, &vk, sp)
            .map_err(|source| LuksError::Cipher { spec: params.cipher.clone(), source })?;
    }
    if let Some(u) = &params.uuid {
        check_uuid(u)?;
    }
    let uuid = match &params.uuid {
        Some(u) => u.to_ascii_lowercase(),
        None => random_uuid()?,
    };
    // Each format derives keyslot 0's key before its first write.
    let pass = passphrase.as_bytes();
    let (mut luks, key) = match params.version {
        LuksVersion::V1 => luks1::format(meta, params, &vk, &uuid, pass)?,
        LuksVersion::V2 => luks2::format(meta, params, &vk, &uuid, pass)?,
    };
    luks.store_keyslot(meta, first_slot, &vk, &key, params.pbkdf.hash)?;
    Ok((luks, vk))
}

/// Refuses a data cipher and key size that cryptsetup cannot use for keyslot encryption.
///
/// A new keyslot is encrypted with the data cipher and the volume key's size (LUKS1 always,
/// LUKS2 by default), and cryptsetup does that through its userspace crypto backend
/// (OpenSSL or libgcrypt), which has AES-XTS only with 128- and 256-bit AES keys. An
/// aes-xts volume key of 384 bits (AES-192-XTS) would make keyslots that cryptsetup cannot
/// open where it has no dm-crypt fallback, so it is refused with cryptsetup's words. Plain
/// dm-crypt keeps AES-192-XTS: the kernel accepts it and no keyslot is involved.
fn check_keyslot_cipher(params: &FormatParams) -> Result<(), LuksError> {
    // Authenticated encryption keeps its keyslots on aes-xts-plain64 with a 512-bit key.
    if params.integrity.is_some() {
        return Ok(());
    }
    let xts = params.cipher.to_ascii_lowercase().starts_with("aes-xts-");
    if xts && params.key_bytes != 32 && params.key_bytes != 64 {
        return Err(LuksError::Params(format!(
            "Cannot use {} cipher for keyslot encryption.",
            params.cipher
        )));
    }
    Ok(())
}

/// Measures the unlock cost the header asks for: the time of one KDF run of `slot`'s
/// parameters on this machine (no passphrase needed).
/// The default [`KdfLimits`] apply: a hostile header is refused rather than timed.
pub fn kdf_cost(luks: &Luks, slot: u32) -> Result<Duration, LuksError> {
    let kdf = match &luks.header {
        LuksHeader::V1(h) => luks1::slot_kdf(h, slot)?,
        LuksHeader::V2(s) => luks2::slot_kdf(&s.header, slot)?.0,
    };
    keyslot::check_kdf(&kdf, &format!("keyslot {slot}"), &KdfLimits::default())?;
    let start = std::time::Instant::now();
    kdf.derive(b"sealdisk-kdf-cost", &[0u8; 32], 32).map_err(LuksError::Kdf)?;
    Ok(start.elapsed())
}

/// A new keyslot's passphrase already through its KDF. Every operation that adds a keyslot
/// derives this before its first write, so a derivation that is interrupted (a signal ends
/// the process, see `sector_crypto::interrupt`) or fails leaves the device untouched.
pub(super) struct SlotKey {
    /// The KDF with its costs.
    pub kdf: Kdf,
    /// The keyslot's salt.
    pub salt: [u8; 32],
    /// KDF(passphrase, salt): the keyslot area's key.
    pub area_key: SecretBuf,
}

impl SlotKey {
    /// A fresh salt and the derivation of `key_len` bytes from `pass`.
    pub(super) fn derive(kdf: Kdf, pass: &[u8], key_len: usize) -> Result<Self, LuksError> {
        let mut salt = [0u8; 32];
        sector_crypto::kdf::random_bytes(&mut salt).map_err(LuksError::Kdf)?;
        let area_key = kdf.derive(pass, &salt, key_len).map_err(LuksError::Kdf)?;
        Ok(SlotKey { kdf, salt, area_key })
    }
}

pub(crate) fn parse_hash(name: &str) -> Result<HashAlg, LuksError> {
    // cryptsetup: "Requested hash X is not supported."
    name.parse().map_err(|_| LuksError::Unsupported(format!("Requested hash {name:?} is not supported.")))
}

/// What `open --type luks` needs besides the passphrase.
#[derive(Debug, Clone)]
pub struct OpenParams {
    /// The data device (and metadata device unless `header` is set).
    pub device: String,
    /// A detached header file (`--header`).
    pub header: Option<String>,
    /// `--type luks1` / `luks2` (`None`: either).
    pub version: Option<LuksVersion>,
    /// `--key-slot`.
    pub key_slot: Option<u32>,
    /// Activation flags from the command line (`--allow-discards`, `--perf-*`), added to the
    /// header's persistent flags.
    pub flags: CryptOptions,
    /// How to open the devices.
    pub open: crate::OpenOptions,
    /// `--integrity-no-journal`: open the dm-integrity layer of an authenticated volume in
    /// direct mode (D) instead of journaled (J). The header's `no-journal` flag does the same.
    pub integrity_no_journal: bool,
    /// Bounds on the header's KDF costs (`--max-pbkdf2-iterations`, `--max-argon2-cost`,
    /// `--allow-expensive-kdf`).
    pub kdf_limits: KdfLimits,
}

impl OpenParams {
    /// Opens `device` as cryptsetup would with no options: either LUKS version, any
    /// keyslot, the header's own flags, read-write, default crypto placement.
    pub fn new(device: impl Into<String>) -> Self {
        OpenParams {
            device: device.into(),
            header: None,
            version: None,
            key_slot: None,
            flags: CryptOptions::default(),
            open: crate::OpenOptions::default(),
            integrity_no_journal: false,
            kdf_limits: KdfLimits::default(),
        }
    }
}

/// An unlocked and assembled LUKS volume.
#[derive(Debug)]
pub struct Opened {
    /// The stack to serve, and its table line.
    pub volume: crate::Volume,
    /// The header.
    pub luks: Luks,
    /// The keyslot that opened.
    pub keyslot: u32,
}

/// Loads the header for `p`: the metadata device is opened read-write unless read-only was
/// asked (a damaged LUKS2 copy is then repaired, as cryptsetup does on a writable load).
pub fn load_for(p: &OpenParams) -> Result<(blockdev::FileDevice, Luks), crate::VolumeError> {
    let meta_path = p.header.as_deref().unwrap_or(&p.device);
    let meta = crate::open_backing(meta_path, &p.open)?;
    let wrap = |source| crate::VolumeError::Luks { path: meta_path.to_owned(), source };
    let luks = Luks::load(&meta, !p.open.read_only).map_err(wrap)?;
    if let Some(v) = p.version {
        if v != luks.version() {
            return Err(wrap(LuksError::WrongVersion { wanted: v.number(), found: luks.version().number() }));
        }
    }
    if let Some(k) = luks.repaired {
        log::warn!("{meta_path}: repaired the damaged {} LUKS2 header copy", luks2::copy_name(k));
    }
    if let Some(k) = luks.needs_repair {
        log::warn!(
            "{meta_path}: the {} LUKS2 header copy is damaged (read-only: not repaired)",
            luks2::copy_name(k)
        );
    }
    Ok((meta, luks))
}

/// Unlocks with `passphrase` and assembles the crypt stack (cryptsetup `open --type luks`).
pub fn open(p: &OpenParams, passphrase: &Passphrase) -> Result<Opened, crate::VolumeError> {
    let (meta, luks) = load_for(p)?;
    let meta_path = p.header.as_deref().unwrap_or(&p.device).to_owned();
    let wrap = |source| crate::VolumeError::Luks { path: meta_path.clone(), source };
    luks.check_supported().map_err(wrap)?;
    // With a detached header the data device is opened (and locked) before the KDF runs,
    // so a device in use is refused at once; without one, the metadata device is the data
    // device and is kept open (a second open would conflict with its own lock).
    let data = match &p.header {
        Some(_) => Some(crate::open_backing(&p.device, &p.open)?),
        None => None,
    };
    let (keyslot, vk) = luks.unlock_with(&meta, passphrase, p.key_slot, &p.kdf_limits).map_err(wrap)?;
    let data = match data {
        Some(d) => {
            drop(meta);
            d
        }
        None => meta,
    };
    if let Some(spec) = luks.aead().map_err(wrap)? {
        let volume = aead::open(&luks, &spec, data, &p.device, &vk, p).map_err(wrap)?;
        return Ok(Opened { volume, luks, keyslot });
    }
    let data_size = data.geometry().size;
    let table = luks.table(&p.device, data_size, &vk, &p.flags).map_err(wrap)?;
    let target = crate::crypt_over(data, &table, &p.open)?;
    let volume = crate::Volume { device: std::sync::Arc::new(target), table };
    Ok(Opened { volume, luks, keyslot })
}
