//! LUKS1 operations on a [`Luks1Header`] and its metadata device (cryptsetup
//! `lib/luks1/keymanage.c`). The phdr has one copy; it is written in one 1024-byte write
//! followed by a flush, after any key material it references is durable.

use blockdev::BlockDevice;
use formats::luks1::{self, KeyslotState, Luks1Header, PHDR_DISK_SIZE, SECTOR_SIZE, STRIPES};
use sector_crypto::kdf::{self, Kdf};
use sector_crypto::VolumeKey;
use zeroize::Zeroizing;

use super::keyslot::{check_kdf, digest_eq, Material};
use super::KdfLimits;
use super::{
    io, parse_hash, FormatParams, Luks, LuksError, LuksHeader, PbkdfParams, SlotKey, LUKS1_KEYSLOTS,
};

/// Default data alignment: 1 MiB, in sectors (cryptsetup `DEFAULT_DISK_ALIGNMENT`).
const ALIGN_SECTORS: u64 = 2048;
/// Length of the LUKS1 volume-key digest.
const MK_DIGEST_LEN: usize = 20;

pub(super) fn load(meta: &dyn BlockDevice) -> Result<Luks, LuksError> {
    let size = meta.geometry().size;
    let bytes = io::read_bytes(meta, 0, PHDR_DISK_SIZE.min(size as usize), "LUKS1 header")?;
    let h = Luks1Header::decode(&bytes).map_err(LuksError::Luks1)?;
    h.check_device_size(size).map_err(LuksError::Luks1)?;
    Ok(Luks { header: LuksHeader::V1(Box::new(h)), repaired: None, needs_repair: None })
}

/// cryptsetup's LUKS1 `repair`: a header whose keyslots fail the checks of `load` is
/// repaired as [`Luks1Header::repair_keyslots`] says (the cipher must be one sealdisk can
/// run, as cryptsetup checks it can), checked against the device size, and written once.
/// Returns what was changed (empty: the header loads as it is, nothing written).
pub(super) fn repair(meta: &dyn BlockDevice) -> Result<Vec<String>, LuksError> {
    let size = meta.geometry().size;
    let bytes = io::read_bytes(meta, 0, PHDR_DISK_SIZE.min(size as usize), "LUKS1 header")?;
    let mut h = Luks1Header::decode_unchecked(&bytes).map_err(LuksError::Luks1)?;
    if h.validate().is_ok() {
        h.check_device_size(size).map_err(LuksError::Luks1)?;
        return Ok(Vec::new());
    }
    // First: it bounds the key size (16, 32 or 64 bytes) the cipher check below allocates.
    let notes = h.repair_keyslots(&bytes).map_err(LuksError::Luks1Repair)?;
    let spec = h.cipher_spec();
    let err = |source| LuksError::Cipher { spec: spec.clone(), source };
    // A throwaway key with distinct halves (XTS refuses equal ones).
    let probe: Vec<u8> = (0..h.key_bytes).map(|i| i as u8).collect();
    let params = sector_crypto::SectorParams { sector_size: 512, iv_offset: 0, iv_large_sectors: false };
    sector_crypto::SectorCipher::new(&spec.parse().map_err(err)?, &VolumeKey::from_slice(&probe), params)
        .map_err(err)?;
    h.check_device_size(size).map_err(LuksError::Luks1)?;
    if !notes.is_empty() {
        log::info!("Writing LUKS header to disk.");
        write_header(&h, meta)?;
    }
    Ok(notes)
}

pub(super) fn active(h: &Luks1Header) -> Vec<u32> {
    (0..LUKS1_KEYSLOTS).filter(|&i| h.keyslots[i as usize].state == KeyslotState::Enabled).collect()
}

pub(super) fn backup_size(h: &Luks1Header) -> u64 {
    h.required_device_size().div_ceil(4096) * 4096
}

fn material<'a>(h: &Luks1Header, slot: u32, spec: &'a str) -> Result<Material<'a>, LuksError> {
    let ks = &h.keyslots[slot as usize];
    Ok(Material {
        offset: u64::from(ks.key_material_offset) * SECTOR_SIZE,
        cipher: spec,
        af_hash: parse_hash(&h.hash_spec)?,
        stripes: ks.stripes,
        key_len: h.key_bytes as usize,
    })
}

pub(super) fn slot_kdf(h: &Luks1Header, slot: u32) -> Result<Kdf, LuksError> {
    let ks = h.keyslots.get(slot as usize).ok_or(LuksError::KeyslotInactive(slot))?;
    Ok(Kdf::Pbkdf2 { hash: parse_hash(&h.hash_spec)?, iterations: ks.iterations })
}

pub(super) fn verify_key(h: &Luks1Header, vk: &VolumeKey) -> Result<bool, LuksError> {
    if vk.len() != h.key_bytes as usize {
        return Ok(false);
    }
    let mut d = Zeroizing::new([0u8; MK_DIGEST_LEN]);
    kdf::pbkdf2(parse_hash(&h.hash_spec)?, vk.as_bytes(), &h.mk_digest_salt, h.mk_digest_iterations, &mut *d)
        .map_err(LuksError::Kdf)?;
    Ok(digest_eq(&*d, &h.mk_digest))
}

/// Tries one keyslot; `Ok(None)` if the passphrase does not open it.
fn try_slot(
    h: &Luks1Header,
    meta: &dyn BlockDevice,
    slot: u32,
    pass: &[u8],
) -> Result<Option<VolumeKey>, LuksError> {
    let ks = &h.keyslots[slot as usize];
    let kdf = slot_kdf(h, slot)?;
    let area_key = kdf.derive(pass, &ks.salt, h.key_bytes as usize).map_err(LuksError::Kdf)?;
    let spec = h.cipher_spec();
    let vk = material(h, slot, &spec)?.recover(meta, &area_key)?;
    Ok(verify_key(h, &vk)?.then_some(vk))
}
/// The volume-key digest's cost.
pub(super) fn check_digest(h: &Luks1Header, limits: &KdfLimits) -> Result<(), LuksError> {
    let digest = Kdf::Pbkdf2 { hash: parse_hash(&h.hash_spec)?, iterations: h.mk_digest_iterations };
    check_kdf(&digest, "LUKS1 volume key digest (mkDigestIterations)", limits)
}

pub(super) fn unlock(
    h: &Luks1Header,
    meta: &dyn BlockDevice,
    pass: &[u8],
    slot: Option<u32>,
    limits: &KdfLimits,
) -> Result<(u32, VolumeKey), LuksError> {
    let slots = match slot {
        Some(s) => {
            if h.keyslots[s as usize].state != KeyslotState::Enabled {
                return Err(LuksError::KeyslotInactive(s));
            }
            vec![s]
        }
        None => active(h),
    };
    // Every cost this unlock may pay, checked before the first derivation.
    check_digest(h, limits)?;
    for &s in &slots {
        check_kdf(&slot_kdf(h, s)?, &format!("LUKS1 keyslot {s}"), limits)?;
    }
    for s in slots {
        if let Some(vk) = try_slot(h, meta, s, pass)? {
            log::info!("LUKS1 keyslot {s} unlocked");
            return Ok((s, vk));
        }
    }
    Err(LuksError::WrongPassphrase)
}

pub(super) fn write_header(h: &Luks1Header, meta: &dyn BlockDevice) -> Result<(), LuksError> {
    let bytes = h.encode().map_err(LuksError::Luks1)?;
    io::write_bytes(meta, 0, &bytes, "LUKS1 header")?;
    io::flush(meta, "LUKS1 header")
}

/// Runs a new keyslot's KDF (before anything is written).
pub(super) fn slot_key(h: &Luks1Header, pass: &[u8], pbkdf: &PbkdfParams) -> Result<SlotKey, LuksError> {
    let kdf = pbkdf.resolve(true, h.key_bytes as usize)?;
    let Kdf::Pbkdf2 { iterations, .. } = kdf else {
        return Err(super::ParamError::Luks1KeyslotKdf.into());
    };
    // LUKS1 has one hash for the whole header: the keyslot KDF uses it, whatever --hash says.
    let kdf = Kdf::Pbkdf2 { hash: parse_hash(&h.hash_spec)?, iterations };
    SlotKey::derive(kdf, pass, h.key_bytes as usize)
}

pub(super) fn add_keyslot(
    h: &mut Luks1Header,
    meta: &dyn BlockDevice,
    slot: u32,
    vk: &VolumeKey,
    key: &SlotKey,
) -> Result<(), LuksError> {
    let Kdf::Pbkdf2 { iterations, .. } = key.kdf else {
        return Err(super::ParamError::Luks1KeyslotKdf.into());
    };
    let salt = key.salt;
    let spec = h.cipher_spec();
    material(h, slot, &spec)?.store(meta, &key.area_key, vk)?;
    io::flush(meta, "keyslot area")?;
    // Change a copy; the caller's header changes only once the new one is on disk.
    let mut next = h.clone();
    let ks = &mut next.keyslots[slot as usize];
    ks.state = KeyslotState::Enabled;
    ks.iterations = iterations;
    ks.salt = salt;
    ks.stripes = STRIPES;
    write_header(&next, meta)?;
    *h = next;
    Ok(())
}

pub(super) fn kill_keyslot(h: &mut Luks1Header, meta: &dyn BlockDevice, slot: u32) -> Result<(), LuksError> {
    let (off, len) = h.keyslot_area(slot as usize).ok_or(LuksError::KeyslotInactive(slot))?;
    io::wipe(meta, off, len, true, "keyslot area")?;
    io::flush(meta, "keyslot area")?;
    let mut next = h.clone();
    let ks = &mut next.keyslots[slot as usize];
    ks.state = KeyslotState::Disabled;
    ks.iterations = 0;
    ks.salt = [0; 32];
    write_header(&next, meta)?;
    *h = next;
    Ok(())
}

pub(super) fn backup(h: &Luks1Header, meta: &dyn BlockDevice) -> Result<Zeroizing<Vec<u8>>, LuksError> {
    let hdr = h.required_device_size() as usize;
    let mut buf = Zeroizing::new(io::read_bytes(meta, 0, hdr, "LUKS1 header and keyslots")?);
    buf.resize(backup_size(h) as usize, 0);
    // cryptsetup clears the gap between the phdr and the first keyslot.
    if u64::from(h.keyslots[0].key_material_offset) * SECTOR_SIZE == luks1::ALIGN_KEYSLOTS {
        buf[luks1::PHDR_SIZE..luks1::ALIGN_KEYSLOTS as usize].fill(0);
    }
    Ok(buf)
}

/// cryptsetup `LUKS_generate_phdr` + `LUKS_wipe_header_areas`; keyslot 0 is added by the caller.
pub(super) fn format(
    meta: &dyn BlockDevice,
    p: &FormatParams,
    vk: &VolumeKey,
    uuid: &str,
    pass: &[u8],
) -> Result<(Luks, SlotKey), LuksError> {
    if p.sector_size != 512 {
        return Err(super::ParamError::Luks1SectorSize.into());
    }
    if p.label.is_some() || p.subsystem.is_some() {
        return Err(super::ParamError::LabelNeedsLuks2.into());
    }
    if !p.pbkdf.hash.luks1_allowed() {
        // cryptsetup: "Requested LUKS hash md5 is not supported." (digest under 20 bytes).
        return Err(LuksError::Unsupported(format!(
            "Requested LUKS hash {} is not supported (LUKS1 needs a digest of at least {} bytes).",
            p.pbkdf.hash,
            sector_crypto::hash::LUKS1_MIN_DIGEST
        )));
    }
    let (cipher_name, cipher_mode) = p
        .cipher
        .split_once('-')
        .ok_or_else(|| super::ParamError::CipherNoMode { cipher: p.cipher.clone() })?;
    let key_bytes =
        u32::try_from(p.key_bytes).map_err(|_| super::ParamError::KeyTooLarge { bytes: p.key_bytes })?;
    let (offsets, end) = luks1::standard_keyslot_layout(key_bytes);
    let payload = match (p.offset, p.detached) {
        (Some(o), false) if o < end => {
            return Err(super::ParamError::Luks1DataOffsetTooSmall { offset: o, need: end }.into())
        }
        (Some(o), _) => o,
        (None, true) => 0,
        (None, false) => end.div_ceil(ALIGN_SECTORS) * ALIGN_SECTORS,
    };
    let payload_offset = u32::try_from(payload).map_err(|_| super::ParamError::DataOffsetTooLarge)?;
    let mkd_iterations = match p.pbkdf.force_iterations {
        Some(_) => kdf::PBKDF2_MIN_ITERATIONS,
        None => p.pbkdf.digest_iterations(p.key_bytes),
    };
    let mut salt = [0u8; 32];
    kdf::random_bytes(&mut salt).map_err(LuksError::Kdf)?;
    let hash_name = p.pbkdf.hash.name().to_owned();
    let mut h = Luks1Header {
        cipher_name: cipher_name.to_owned(),
        cipher_mode: cipher_mode.to_owned(),
        hash_spec: hash_name,
        payload_offset,
        key_bytes,
        mk_digest: [0; MK_DIGEST_LEN],
        mk_digest_salt: salt,
        mk_digest_iterations: mkd_iterations,
        uuid: uuid.to_owned(),
        keyslots: std::array::from_fn(|i| luks1::Keyslot {
            state: KeyslotState::Disabled,
            iterations: 0,
            salt: [0; 32],
            key_material_offset: offsets[i],
            stripes: STRIPES,
        }),
    };
    let mut d = Zeroizing::new([0u8; MK_DIGEST_LEN]);
    kdf::pbkdf2(p.pbkdf.hash, vk.as_bytes(), &h.mk_digest_salt, mkd_iterations, &mut *d)
        .map_err(LuksError::Kdf)?;
    h.mk_digest = *d;
    h.validate().map_err(LuksError::Luks1)?;
    h.check_device_size(meta.geometry().size).map_err(LuksError::Luks1)?;
    // The first keyslot's KDF runs before anything is written: an interrupted (or failed)
    // derivation leaves the device as it was.
    let key = slot_key(&h, pass, &p.pbkdf)?;
    // Zero the header area, fill the keyslot areas with noise, then write the phdr.
    io::wipe(meta, 0, luks1::ALIGN_KEYSLOTS, false, "LUKS1 header")?;
    for slot in 0..LUKS1_KEYSLOTS as usize {
        if let Some((off, len)) = h.keyslot_area(slot) {
            io::wipe(meta, off, len, true, "keyslot area")?;
        }
    }
    write_header(&h, meta)?;
    Ok((Luks { header: LuksHeader::V1(Box::new(h)), repaired: None, needs_repair: None }, key))
}
