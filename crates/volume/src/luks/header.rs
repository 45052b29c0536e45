//! A loaded LUKS header: probe, load, unlock, keyslot, UUID and backup operations.
use std::time::Duration;

use blockdev::BlockDevice;
use formats::luks1::Luks1Header;
use formats::luks2::{CopyKind, HeaderSalts, Luks2Header};
use sector_crypto::kdf::{HashAlg, Passphrase};
use sector_crypto::VolumeKey;
use zeroize::Zeroizing;

use super::{
    io, keyslot, luks1, luks2, KdfLimits, LuksError, PbkdfParams, SlotKey, LUKS1_KEYSLOTS, LUKS2_KEYSLOTS,
};

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

    /// cryptsetup's `repair` of the header on `meta`: a damaged or stale LUKS2 copy is
    /// rewritten from the good one (as a writable [`load`](Self::load) does); a LUKS1
    /// header whose keyslots fail the checks has its disabled keyslots reset to a fresh
    /// header's layout (cryptsetup's rules: enabled keyslots are never touched, and a header
    /// that is still invalid after that is not written). Returns the header as loaded after
    /// the repair and what was changed, in cryptsetup's words (empty: nothing written).
    pub fn repair(meta: &dyn BlockDevice) -> Result<(Self, Vec<String>), LuksError> {
        match probe(meta)? {
            None => Err(LuksError::NotLuks),
            Some(LuksVersion::V1) => {
                let notes = luks1::repair(meta)?;
                Ok((luks1::load(meta)?, notes))
            }
            Some(LuksVersion::V2) => {
                let luks = luks2::load(meta, true)?;
                let notes = match luks.repaired {
                    Some(kind) => vec![format!("LUKS2 {kind} header repaired from the other copy.")],
                    None => Vec::new(),
                };
                Ok((luks, notes))
            }
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

    /// The LUKS2 label (`None` for LUKS1, which has none).
    pub fn label(&self) -> Option<&str> {
        match &self.header {
            LuksHeader::V1(_) => None,
            LuksHeader::V2(s) => Some(&s.header.label),
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

    pub(super) fn check_slot(&self, slot: u32) -> Result<(), LuksError> {
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
    pub(super) fn store_keyslot(
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
                return Err(super::ParamError::BackupStale.into());
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
                return Err(super::ParamError::BackupOffset {
                    backup: b.unwrap_or(0),
                    device: a.unwrap_or(0),
                }
                .into());
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
        Err(super::ParamError::Uuid(u.to_owned()).into())
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
