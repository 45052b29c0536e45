//! LUKS2 operations (cryptsetup `lib/luks2/`): loading both copies with repair, keyslot
//! unlock in priority order, keyslot add/kill/change with area allocation, and format.
//! Every header change goes through [`Luks2Header::write_plan`] with `seqid + 1`.

use std::collections::BTreeMap;

use blockdev::BlockDevice;
use formats::luks2::{
    self, Af, Area, CopyKind, CryptParams, Digest, DigestPbkdf2, HeaderSalts, Keyslot, Luks2Header,
    Luks2Metadata, Requirement, Segment as JsonSegment, SegmentIntegrity, SegmentSize, BINARY_HEADER_SIZE,
    MAX_KEYSLOTS_SIZE, METADATA_SIZES, SALT_LEN,
};
use sector_crypto::kdf::{self, Argon2Params, Argon2Variant, HashAlg, Kdf};
use sector_crypto::AeadSpec;
use sector_crypto::{af, VolumeKey};
use serde_json::Map;

use super::keyslot::{check_kdf, digest_eq, Material};
use super::KdfLimits;
use super::{
    io, parse_hash, FormatParams, Luks, Luks2State, LuksError, LuksHeader, PbkdfParams, Segment, SlotKey,
};

/// cryptsetup's default LUKS2 header + keyslots size, which is also the default data
/// offset (`LUKS2_DEFAULT_HDR_SIZE`, 16 MiB).
const DEFAULT_HDR_SIZE: u64 = 0x100_0000;
/// Data alignment (`DEFAULT_DISK_ALIGNMENT`, 1 MiB).
const ALIGNMENT: u64 = 0x10_0000;
/// Largest area wiped with zeroes at format (`LUKS2_HDR_MAX_MDA_SIZE`).
const MAX_MDA_SIZE: u64 = formats::limits::LUKS2_MAX_HEADER_BYTES;
/// AF stripes of new keyslots.
const STRIPES: u32 = 4000;

pub(super) fn load(meta: &dyn BlockDevice, repair: bool) -> Result<Luks, LuksError> {
    let size = meta.geometry().size;
    // Read one copy at `off`: its binary header first (for hdr_size), then the whole copy.
    let read_copy = |off: u64| -> Result<luks2::DecodedCopy, luks2::Luks2Error> {
        let trunc = |got: u64| luks2::Luks2Error::Truncated { offset: off, need: BINARY_HEADER_SIZE, got };
        if off.saturating_add(BINARY_HEADER_SIZE) > size {
            return Err(trunc(size.saturating_sub(off)));
        }
        let bin =
            io::read_bytes(meta, off, BINARY_HEADER_SIZE as usize, "LUKS2 header").map_err(|_| trunc(0))?;
        let hdr_size = luks2::hdr_size_of(&bin).unwrap_or(0);
        if !(METADATA_SIZES[0]..=METADATA_SIZES[8]).contains(&hdr_size) {
            // Let the decoder name the problem (magic, version, size...).
            return luks2::decode_copy(&bin, off);
        }
        let len = hdr_size.min(size - off);
        let bytes = io::read_bytes(meta, off, len as usize, "LUKS2 header").map_err(|_| trunc(0))?;
        luks2::decode_copy(&bytes, off)
    };
    let primary = read_copy(0);
    let mut secondary = None;
    for off in luks2::secondary_offsets(&primary) {
        let c = read_copy(off);
        let found = c.is_ok() || c.as_ref().is_err_and(luks2::Luks2Error::failed_in_json);
        if found || secondary.is_none() {
            secondary = Some(c);
        }
        if found {
            break;
        }
    }
    let secondary = secondary.unwrap_or(Err(luks2::Luks2Error::Truncated { offset: 0, need: 0, got: 0 }));
    if let Err(e) = &primary {
        log::debug!("LUKS2 primary header: {e}");
    }
    if let Err(e) = &secondary {
        log::debug!("LUKS2 secondary header: {e}");
    }
    let mut sel = luks2::choose(primary, secondary).map_err(LuksError::Luks2)?;
    let need = sel.header.metadata.metadata_and_keyslots_size();
    if need > size {
        return Err(LuksError::DeviceTooSmall { need, have: size });
    }
    let pending = sel.repair;
    let mut repaired = None;
    if let (Some(kind), true) = (pending, repair) {
        let mut salt = [0u8; SALT_LEN];
        kdf::random_bytes(&mut salt).map_err(LuksError::Kdf)?;
        if let Some(plan) = sel.repair_plan(salt).map_err(LuksError::Luks2)? {
            log::warn!("LUKS2 {kind} header is damaged or stale: rewriting it from the {} copy", sel.source);
            io::apply_plan(meta, &plan)?;
            repaired = Some(kind);
        }
    }
    let state = Luks2State { header: sel.header, salts: sel.salts };
    Ok(Luks {
        header: LuksHeader::V2(Box::new(state)),
        repaired,
        needs_repair: if repaired.is_some() { None } else { pending },
    })
}

/// Rewrites both copies with `seqid + 1` (cryptsetup `LUKS2_hdr_write`).
pub(super) fn write_header(s: &mut Luks2State, meta: &dyn BlockDevice) -> Result<(), LuksError> {
    let seqid = s.header.seqid + 1;
    let plan = s.header.write_plan(seqid, &s.salts).map_err(LuksError::Luks2)?;
    io::apply_plan(meta, &plan)?;
    s.header.seqid = seqid;
    Ok(())
}

pub(super) fn default_segment(h: &Luks2Header) -> Result<(u32, &JsonSegment), LuksError> {
    let id = h
        .metadata
        .default_segment()
        .ok_or_else(|| LuksError::Unsupported("LUKS2 header has no data segment".into()))?;
    let seg = h
        .metadata
        .segments
        .get(&id)
        .ok_or_else(|| LuksError::Unsupported("LUKS2 header has no data segment".into()))?;
    Ok((id, seg))
}

/// Volume key size: the `key_size` of a keyslot bound to the data segment's digest.
pub(super) fn volume_key_size(h: &Luks2Header) -> Option<usize> {
    let (seg, _) = default_segment(h).ok()?;
    let digest = h.metadata.segment_digest(seg)?;
    let bound = h.metadata.digests.get(&digest)?.keyslots.first().copied();
    let ks =
        bound.and_then(|k| h.metadata.keyslots.get(&k)).or_else(|| h.metadata.keyslots.values().next())?;
    Some(ks.key_size as usize)
}

pub(super) fn check_supported(h: &Luks2Header) -> Result<(), LuksError> {
    let unknown = h.metadata.unknown_requirements();
    if !unknown.is_empty() {
        return Err(LuksError::Unsupported(format!(
            "Unmet LUKS2 requirements detected: {} (this version of sealdisk does not know them)",
            unknown.join(", ")
        )));
    }
    for r in h.metadata.config.mandatory_requirements() {
        let what = match r {
            Requirement::OfflineReencrypt | Requirement::OnlineReencrypt { .. } => {
                "LUKS2 reencryption is in progress: finish it with `sealdisk reencrypt` first (the volume can be opened and served meanwhile)"
            }
            Requirement::InlineHwTags => "LUKS2 inline hardware integrity tags are not supported",
            Requirement::Opal { .. } => "LUKS2 OPAL hardware encryption is not supported",
            Requirement::Unknown(_) => continue,
        };
        return Err(LuksError::Unsupported(what.into()));
    }
    let (id, seg) = default_segment(h)?;
    for other in h.metadata.integrity_segments() {
        if other != id {
            return Err(LuksError::Unsupported(format!(
                "LUKS2 integrity on segment {other}, which is not the data segment, is not supported"
            )));
        }
    }
    aead_spec(h)?;
    if seg.type_name != "crypt" || seg.crypt.is_none() {
        return Err(LuksError::Unsupported(format!(
            "LUKS2 segment {id} of type {:?} is not supported (only crypt segments are)",
            seg.type_name
        )));
    }
    if h.metadata.segments.len() > 1 {
        return Err(LuksError::Unsupported(
            "LUKS2 headers with more than one data segment are not supported".into(),
        ));
    }
    Ok(())
}

/// The authenticated cipher of the data segment, `None` without an `integrity` section
/// (cryptsetup `LUKS2_get_integrity`). Refuses what cannot be activated as the kernel would:
/// an unsupported cipher/integrity pair, journal encryption or MAC (cryptsetup only ever
/// writes `none`), a separate integrity key size other than the digest size.
pub(super) fn aead_spec(h: &Luks2Header) -> Result<Option<AeadSpec>, LuksError> {
    let (_, seg) = default_segment(h)?;
    let Some(c) = &seg.crypt else { return Ok(None) };
    let Some(i) = &c.integrity else { return Ok(None) };
    let spec =
        AeadSpec::from_luks2(&c.encryption, &i.type_name).map_err(|source| LuksError::UnsupportedAead {
            encryption: c.encryption.clone(),
            integrity: i.type_name.clone(),
            source: Box::new(source),
        })?;
    for (what, v) in
        [("journal_encryption", &i.journal_encryption), ("journal_integrity", &i.journal_integrity)]
    {
        if v != "none" {
            return Err(LuksError::Unsupported(format!("LUKS2 integrity {what} {v:?} is not supported")));
        }
    }
    if let Some(k) = i.key_size {
        if k as usize != spec.mac_key_size() {
            return Err(LuksError::Unsupported(format!(
                "LUKS2 integrity key size {} bits is not supported (only the digest size, {} bits)",
                u64::from(k) * 8,
                spec.mac_key_size() * 8
            )));
        }
    }
    Ok(Some(spec))
}

pub(super) fn segment(h: &Luks2Header) -> Result<Segment, LuksError> {
    let (id, seg) = default_segment(h)?;
    let c = seg
        .crypt
        .as_ref()
        .ok_or_else(|| LuksError::Unsupported(format!("LUKS2 segment {id} is not a crypt segment")))?;
    Ok(Segment {
        offset: seg.offset,
        size: seg.fixed_size(),
        cipher: c.encryption.clone(),
        sector_size: c.sector_size,
        iv_offset: c.iv_tweak,
        flags: h.metadata.config.flags.clone().unwrap_or_default(),
    })
}

pub(super) fn verify_digest(d: &Digest, vk: &VolumeKey) -> Result<bool, LuksError> {
    let p = d.pbkdf2.as_ref().ok_or_else(|| {
        LuksError::Unsupported(format!("LUKS2 digest type {:?} is not supported", d.type_name))
    })?;
    if p.digest.is_empty() || p.digest.len() > 64 {
        return Ok(false);
    }
    let mut out = zeroize::Zeroizing::new(vec![0u8; p.digest.len()]);
    kdf::pbkdf2(parse_hash(&p.hash)?, vk.as_bytes(), &p.salt, p.iterations, &mut out)
        .map_err(LuksError::Kdf)?;
    Ok(digest_eq(&out, &p.digest))
}

pub(super) fn verify_segment_key(
    h: &Luks2Header,
    vk: &VolumeKey,
    limits: &KdfLimits,
) -> Result<bool, LuksError> {
    let (seg, _) = default_segment(h)?;
    let Some(d) = h.metadata.segment_digest(seg).and_then(|d| h.metadata.digests.get(&d)) else {
        return Ok(false);
    };
    if let Some(p) = &d.pbkdf2 {
        let digest = Kdf::Pbkdf2 { hash: parse_hash(&p.hash)?, iterations: p.iterations };
        check_kdf(&digest, &format!("LUKS2 digest of segment {seg}"), limits)?;
    }
    verify_digest(d, vk)
}

/// A keyslot's KDF and salt.
pub(super) fn slot_kdf(h: &Luks2Header, slot: u32) -> Result<(Kdf, Vec<u8>), LuksError> {
    let ks = h.metadata.keyslots.get(&slot).ok_or(LuksError::KeyslotInactive(slot))?;
    match &ks.kdf {
        Some(luks2::Kdf::Pbkdf2 { hash, iterations, salt }) => {
            Ok((Kdf::Pbkdf2 { hash: parse_hash(hash)?, iterations: *iterations }, salt.clone()))
        }
        Some(luks2::Kdf::Argon2 { id, time, memory, cpus, salt }) => Ok((
            Kdf::Argon2(Argon2Params {
                variant: if *id { Argon2Variant::Id } else { Argon2Variant::I },
                time: *time,
                memory_kib: *memory,
                parallel: *cpus,
            }),
            salt.clone(),
        )),
        Some(luks2::Kdf::Other(_)) | None => Err(LuksError::Unsupported(format!(
            "keyslot {slot}: KDF {:?} is not supported",
            ks.kdf.as_ref().map(|k| k.type_name().to_owned()).unwrap_or_default()
        ))),
    }
}

fn material(slot: u32, ks: &Keyslot) -> Result<Material<'_>, LuksError> {
    let bad = |what: &str| LuksError::Unsupported(format!("keyslot {slot}: {what}"));
    let af = ks.af.as_ref().ok_or_else(|| bad("no AF parameters"))?;
    let cipher = ks.area.encryption.as_deref().ok_or_else(|| bad("no area encryption"))?;
    let m = Material {
        offset: ks.area.offset,
        cipher,
        af_hash: parse_hash(&af.hash)?,
        stripes: af.stripes,
        key_len: ks.key_size as usize,
    };
    m.check_bounds(&format!("keyslot {slot}"))?;
    if m.len() as u64 > ks.area.size {
        return Err(bad("key material does not fit its area"));
    }
    Ok(m)
}

pub(super) fn try_slot(
    h: &Luks2Header,
    meta: &dyn BlockDevice,
    slot: u32,
    pass: &[u8],
) -> Result<Option<VolumeKey>, LuksError> {
    let ks = h.metadata.keyslots.get(&slot).ok_or(LuksError::KeyslotInactive(slot))?;
    if !ks.is_luks2() {
        return Err(LuksError::Unsupported(format!(
            "keyslot {slot} of type {:?} cannot be unlocked",
            ks.type_name
        )));
    }
    let (kdf, salt) = slot_kdf(h, slot)?;
    let area_key_len = ks.area.key_size.unwrap_or(0) as usize;
    let m = material(slot, ks)?;
    let area_key = kdf.derive(pass, &salt, area_key_len).map_err(LuksError::Kdf)?;
    let vk = m.recover(meta, &area_key)?;
    let digest = h.metadata.keyslot_digest(slot).and_then(|d| h.metadata.digests.get(&d));
    match digest {
        Some(d) if verify_digest(d, &vk)? => Ok(Some(vk)),
        _ => Ok(None),
    }
}

/// The costs of trying `slot`: its KDF, its key material's bounds and its digest's PBKDF2.
pub(super) fn check_slot_costs(h: &Luks2Header, slot: u32, limits: &KdfLimits) -> Result<(), LuksError> {
    let Some(ks) = h.metadata.keyslots.get(&slot) else { return Ok(()) };
    if !ks.is_luks2() {
        return Ok(());
    }
    let what = format!("LUKS2 keyslot {slot}");
    check_kdf(&slot_kdf(h, slot)?.0, &what, limits)?;
    material(slot, ks)?;
    if let Some(p) = h.metadata.keyslot_digest(slot).and_then(|d| h.metadata.digests.get(&d)?.pbkdf2.as_ref())
    {
        let digest = Kdf::Pbkdf2 { hash: parse_hash(&p.hash)?, iterations: p.iterations };
        check_kdf(&digest, &format!("LUKS2 digest of keyslot {slot}"), limits)?;
    }
    Ok(())
}

pub(super) fn unlock(
    h: &Luks2Header,
    meta: &dyn BlockDevice,
    pass: &[u8],
    slot: Option<u32>,
    limits: &KdfLimits,
) -> Result<(u32, VolumeKey), LuksError> {
    let seg_digest = default_segment(h).ok().and_then(|(s, _)| h.metadata.segment_digest(s));
    let bound = |s: u32| h.metadata.keyslot_digest(s).is_some() && h.metadata.keyslot_digest(s) == seg_digest;
    let slots: Vec<u32> = match slot {
        Some(s) => {
            if !h.metadata.keyslots.contains_key(&s) {
                return Err(LuksError::KeyslotInactive(s));
            }
            if !bound(s) {
                return Err(LuksError::Unsupported(format!(
                    "keyslot {s} holds an unbound key, not the volume key"
                )));
            }
            vec![s]
        }
        None => {
            let prio = |s: &u32| h.metadata.keyslots[s].priority.unwrap_or(1);
            let usable = |s: &&u32| h.metadata.keyslots[*s].is_luks2() && bound(**s);
            let mut v: Vec<u32> =
                h.metadata.keyslots.keys().filter(usable).filter(|s| prio(s) == 2).copied().collect();
            v.extend(h.metadata.keyslots.keys().filter(usable).filter(|s| prio(s) == 1).copied());
            v
        }
    };
    // Every cost this unlock may pay, checked before the first derivation.
    for &s in &slots {
        check_slot_costs(h, s, limits)?;
    }
    for s in slots {
        if let Some(vk) = try_slot(h, meta, s, pass)? {
            log::info!("LUKS2 keyslot {s} unlocked");
            return Ok((s, vk));
        }
    }
    Err(LuksError::WrongPassphrase)
}

/// First-fit free range of `len` bytes in the keyslots area, ignoring keyslot `except`.
pub(super) fn find_area(m: &Luks2Metadata, len: u64, except: Option<u32>) -> Option<u64> {
    let start = 2 * m.metadata_size();
    let end = start + m.config.keyslots_size;
    let mut used: Vec<(u64, u64)> = m
        .keyslots
        .iter()
        .filter(|(id, _)| Some(**id) != except)
        .map(|(_, k)| (k.area.offset, k.area.offset.saturating_add(k.area.size)))
        .collect();
    used.sort_unstable();
    let mut pos = start;
    for (o, e) in used {
        if o >= pos && o - pos >= len {
            break;
        }
        pos = pos.max(e);
    }
    (pos.checked_add(len)? <= end).then_some(pos)
}

/// Keyslot area cipher for new keyslots: the segment's, when it works as a keyslot cipher
/// (cryptsetup's default), else aes-xts-plain64 with a 512-bit key.
pub(super) fn keyslot_cipher(h: &Luks2Header, vk_len: usize) -> (String, usize) {
    if let Ok((_, seg)) = default_segment(h) {
        if let Some(c) = &seg.crypt {
            let ok = c.integrity.is_none()
                && c.encryption.parse::<sector_crypto::CipherSpec>().is_ok_and(|s| {
                    !s.is_capi()
                        && sector_crypto::SectorCipher::new(
                            &s,
                            &VolumeKey::new(vec![0x5a; vk_len]),
                            sector_crypto::SectorParams {
                                sector_size: 512,
                                iv_offset: 0,
                                iv_large_sectors: false,
                            },
                        )
                        .is_ok()
                });
            if ok {
                return (c.encryption.clone(), vk_len);
            }
        }
    }
    ("aes-xts-plain64".into(), 64)
}

/// Runs a new keyslot's KDF for a `vk_len`-byte volume key (before anything is written).
pub(super) fn slot_key(
    h: &Luks2Header,
    vk_len: usize,
    pass: &[u8],
    pbkdf: &PbkdfParams,
) -> Result<SlotKey, LuksError> {
    let (_, area_key_len) = keyslot_cipher(h, vk_len);
    let kdf = pbkdf.resolve(false, area_key_len)?;
    SlotKey::derive(kdf, pass, area_key_len)
}

/// Builds a keyslot for `vk` at `offset` with an already derived `key`, writes its
/// material, flushes.
pub(super) fn new_keyslot(
    h: &Luks2Header,
    meta: &dyn BlockDevice,
    offset: u64,
    area_size: u64,
    vk: &VolumeKey,
    key: &SlotKey,
    af_hash: HashAlg,
) -> Result<Keyslot, LuksError> {
    new_keyslot_for(h, meta, offset, area_size, vk, key, af_hash, vk.len())
}

/// [`new_keyslot`] with the area cipher chosen for a `cipher_key_len`-byte volume key (an
/// unbound key of another size keeps the volume's keyslot cipher, as cryptsetup does).
#[allow(clippy::too_many_arguments)]
pub(super) fn new_keyslot_for(
    h: &Luks2Header,
    meta: &dyn BlockDevice,
    offset: u64,
    area_size: u64,
    vk: &VolumeKey,
    key: &SlotKey,
    af_hash: HashAlg,
    cipher_key_len: usize,
) -> Result<Keyslot, LuksError> {
    let (cipher, area_key_len) = keyslot_cipher(h, cipher_key_len);
    if key.area_key.len() != area_key_len {
        return Err(LuksError::Internal("keyslot key derived for another cipher"));
    }
    let m = Material { offset, cipher: &cipher, af_hash, stripes: STRIPES, key_len: vk.len() };
    m.store(meta, &key.area_key, vk)?;
    io::flush(meta, "keyslot area")?;
    let salt = key.salt.to_vec();
    let kdf_json = match key.kdf {
        Kdf::Pbkdf2 { hash, iterations } => luks2::Kdf::Pbkdf2 { hash: hash.name().into(), iterations, salt },
        Kdf::Argon2(p) => luks2::Kdf::Argon2 {
            id: p.variant == Argon2Variant::Id,
            time: p.time,
            memory: p.memory_kib,
            cpus: p.parallel,
            salt,
        },
    };
    Ok(Keyslot {
        type_name: luks2::KEYSLOT_LUKS2.into(),
        key_size: u32::try_from(vk.len()).unwrap_or(u32::MAX),
        priority: None,
        af: Some(Af {
            type_name: "luks1".into(),
            stripes: STRIPES,
            hash: af_hash.name().into(),
            extra: Map::new(),
        }),
        area: Area {
            type_name: "raw".into(),
            offset,
            size: area_size,
            encryption: Some(cipher.clone()),
            key_size: Some(u32::try_from(area_key_len).unwrap_or(u32::MAX)),
            extra: Map::new(),
        },
        kdf: Some(kdf_json),
        extra: Map::new(),
    })
}

pub(super) fn area_size(key_len: usize) -> u64 {
    ((af::split_sectors(key_len, STRIPES) * 512) as u64).div_ceil(4096) * 4096
}

pub(super) fn add_keyslot(
    s: &mut Luks2State,
    meta: &dyn BlockDevice,
    slot: u32,
    vk: &VolumeKey,
    key: &SlotKey,
    af_hash: HashAlg,
) -> Result<(), LuksError> {
    let len = area_size(vk.len());
    let offset = find_area(&s.header.metadata, len, None).ok_or(LuksError::NoKeyslotSpace { need: len })?;
    let ks = new_keyslot(&s.header, meta, offset, len, vk, key, af_hash)?;
    let (seg, _) = default_segment(&s.header)?;
    let digest = s
        .header
        .metadata
        .segment_digest(seg)
        .ok_or_else(|| LuksError::Unsupported("LUKS2 data segment has no digest".into()))?;
    let mut next = s.clone();
    next.header.metadata.keyslots.insert(slot, ks);
    if let Some(d) = next.header.metadata.digests.get_mut(&digest) {
        d.keyslots.push(slot);
        d.keyslots.sort_unstable();
    }
    write_header(&mut next, meta)?;
    *s = next;
    Ok(())
}

pub(super) fn drop_keyslot(m: &mut Luks2Metadata, slot: u32) {
    m.keyslots.remove(&slot);
    for d in m.digests.values_mut() {
        d.keyslots.retain(|&k| k != slot);
    }
    for t in m.tokens.values_mut() {
        t.keyslots.retain(|&k| k != slot);
    }
}

pub(super) fn kill_keyslot(s: &mut Luks2State, meta: &dyn BlockDevice, slot: u32) -> Result<(), LuksError> {
    let ks = s.header.metadata.keyslots.get(&slot).ok_or(LuksError::KeyslotInactive(slot))?;
    let (off, len) = (ks.area.offset, ks.area.size);
    // Wipe only inside the keyslots area (a corrupt header must not make us wipe data).
    let m = &s.header.metadata;
    if off >= 2 * m.metadata_size() && off.saturating_add(len) <= m.metadata_and_keyslots_size() {
        io::wipe(meta, off, len, true, "keyslot area")?;
        io::flush(meta, "keyslot area")?;
    }
    let mut next = s.clone();
    drop_keyslot(&mut next.header.metadata, slot);
    write_header(&mut next, meta)?;
    *s = next;
    Ok(())
}

pub(super) fn change_keyslot(
    s: &mut Luks2State,
    meta: &dyn BlockDevice,
    slot: u32,
    vk: &VolumeKey,
    key: &SlotKey,
    af_hash: HashAlg,
) -> Result<(), LuksError> {
    let old = s.header.metadata.keyslots.get(&slot).ok_or(LuksError::KeyslotInactive(slot))?.clone();
    let len = area_size(vk.len());
    let Some(offset) = find_area(&s.header.metadata, len, None) else {
        // No room for a second copy: replace in place (not crash-safe, as in cryptsetup).
        log::warn!("no free keyslot area: keyslot {slot} is rewritten in place");
        kill_keyslot(s, meta, slot)?;
        return add_keyslot(s, meta, slot, vk, key, af_hash);
    };
    let mut ks = new_keyslot(&s.header, meta, offset, len, vk, key, af_hash)?;
    ks.priority = old.priority;
    let mut next = s.clone();
    next.header.metadata.keyslots.insert(slot, ks);
    write_header(&mut next, meta)?;
    *s = next;
    let m = &s.header.metadata;
    if old.area.offset >= 2 * m.metadata_size()
        && old.area.offset + old.area.size <= m.metadata_and_keyslots_size()
    {
        io::wipe(meta, old.area.offset, old.area.size, true, "keyslot area")?;
        io::flush(meta, "keyslot area")?;
    }
    Ok(())
}

/// Storage layout as cryptsetup's `LUKS2_hdr_get_storage_params`:
/// `(metadata_size, keyslots_size, data_offset)` in bytes.
pub(super) fn storage(p: &FormatParams) -> Result<(u64, u64, u64), LuksError> {
    let md = p.metadata_size.unwrap_or(METADATA_SIZES[0]);
    if !METADATA_SIZES.contains(&md) {
        return Err(super::ParamError::MetadataSize { size: md }.into());
    }
    // As cryptsetup's crypt_set_metadata_size: an asked keyslots area is refused, not rounded.
    if let Some(k) = p.keyslots_size.filter(|&k| k != 0 && (!k.is_multiple_of(4096) || k > MAX_KEYSLOTS_SIZE))
    {
        return Err(super::ParamError::KeyslotsSize { size: k, max: MAX_KEYSLOTS_SIZE }.into());
    }
    let mut data_offset = p.offset.map_or(0, |o| o * 512);
    if data_offset != 0 && data_offset < 2 * md {
        return Err(super::ParamError::DataOffsetTooSmall.into());
    }
    let mut ks = p.keyslots_size.unwrap_or(0);
    if ks == 0 && data_offset != 0 {
        ks = data_offset - 2 * md;
    }
    ks -= ks % 4096;
    ks = ks.min(MAX_KEYSLOTS_SIZE);
    if ks == 0 {
        ks = DEFAULT_HDR_SIZE - 2 * md;
    }
    if data_offset != 0 && ks + 2 * md > data_offset {
        ks = data_offset - 2 * md;
    }
    if data_offset == 0 && !p.detached {
        data_offset = (2 * md + ks).div_ceil(ALIGNMENT) * ALIGNMENT;
    }
    Ok((md, ks, data_offset))
}

/// cryptsetup `_crypt_format_luks2`: header with a digest and the data segment, areas
/// wiped, header written (epoch 2). Keyslot 0 is added by the caller (epoch 3).
pub(super) fn format(
    meta: &dyn BlockDevice,
    p: &FormatParams,
    vk: &VolumeKey,
    uuid: &str,
    pass: &[u8],
) -> Result<(Luks, SlotKey), LuksError> {
    if ![512, 1024, 2048, 4096].contains(&p.sector_size) {
        return Err(super::ParamError::SectorSize { size: p.sector_size }.into());
    }
    let (md, ks_size, data_offset) = storage(p)?;
    if data_offset % u64::from(p.sector_size) != 0 {
        return Err(
            super::ParamError::DataOffsetSector { offset: data_offset, sector_size: p.sector_size }.into()
        );
    }
    if let Some(size) = p.data_size {
        if !p.detached && size <= data_offset {
            return Err(LuksError::DeviceTooSmall {
                need: data_offset + u64::from(p.sector_size),
                have: size,
            });
        }
    }
    let iterations = p.pbkdf.digest_iterations(vk.len());
    let mut salt = vec![0u8; 32];
    kdf::random_bytes(&mut salt).map_err(LuksError::Kdf)?;
    let mut digest = vec![0u8; p.pbkdf.hash.output_len()];
    kdf::pbkdf2(p.pbkdf.hash, vk.as_bytes(), &salt, iterations, &mut digest).map_err(LuksError::Kdf)?;
    let mut segments = BTreeMap::new();
    segments.insert(
        0,
        JsonSegment {
            type_name: "crypt".into(),
            offset: data_offset,
            size: SegmentSize::Dynamic,
            crypt: Some(CryptParams {
                iv_tweak: 0,
                encryption: p.cipher.clone(),
                sector_size: p.sector_size,
                integrity: p.integrity.as_ref().map(|i| {
                    let (_, t) = i.spec.luks2_names();
                    SegmentIntegrity {
                        type_name: t,
                        journal_encryption: "none".into(),
                        journal_integrity: "none".into(),
                        key_size: None,
                        extra: Map::new(),
                    }
                }),
            }),
            opal: None,
            flags: None,
            extra: Map::new(),
        },
    );
    let mut digests = BTreeMap::new();
    digests.insert(
        0,
        Digest {
            type_name: "pbkdf2".into(),
            keyslots: Vec::new(),
            segments: vec![0],
            pbkdf2: Some(DigestPbkdf2 { hash: p.pbkdf.hash.name().into(), iterations, salt, digest }),
            extra: Map::new(),
        },
    );
    let metadata = Luks2Metadata {
        keyslots: BTreeMap::new(),
        tokens: BTreeMap::new(),
        segments,
        digests,
        config: luks2::Config {
            json_size: md - BINARY_HEADER_SIZE,
            keyslots_size: ks_size,
            flags: None,
            requirements: None,
            extra: Map::new(),
        },
        extra: Map::new(),
    };
    let header = Luks2Header {
        hdr_size: md,
        seqid: 1,
        label: p.label.clone().unwrap_or_default(),
        subsystem: p.subsystem.clone().unwrap_or_default(),
        checksum_alg: "sha256".into(),
        uuid: uuid.to_owned(),
        metadata,
    };
    let mut salts = HeaderSalts { primary: [0; SALT_LEN], secondary: [0; SALT_LEN] };
    kdf::random_bytes(&mut salts.primary).map_err(LuksError::Kdf)?;
    kdf::random_bytes(&mut salts.secondary).map_err(LuksError::Kdf)?;
    // Validate (and size-check) before touching the device.
    header.write_plan(2, &salts).map_err(LuksError::Luks2)?;
    let size = meta.geometry().size;
    let need = header.metadata.metadata_and_keyslots_size();
    if need > size {
        return Err(LuksError::DeviceTooSmall { need, have: size });
    }
    // The first keyslot's KDF runs before anything is written: an interrupted (or failed)
    // derivation leaves the device as it was.
    let key = slot_key(&header, vk.len(), pass, &p.pbkdf)?;
    let mut zero = if data_offset == 0 { MAX_MDA_SIZE } else { data_offset.min(MAX_MDA_SIZE) };
    zero = zero.min(size);
    io::wipe(meta, 0, zero, false, "LUKS2 header area")?;
    io::wipe(meta, 2 * md, ks_size, true, "keyslots area")?;
    let mut state = Luks2State { header, salts };
    write_header(&mut state, meta)?;
    Ok((Luks { header: LuksHeader::V2(Box::new(state)), repaired: None, needs_repair: None }, key))
}

/// The `CopyKind` of a repaired header, for messages.
pub(super) fn copy_name(k: CopyKind) -> &'static str {
    match k {
        CopyKind::Primary => "primary",
        CopyKind::Secondary => "secondary",
    }
}
