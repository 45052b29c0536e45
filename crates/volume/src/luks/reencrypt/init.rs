//! The five ways a reencryption starts (cryptsetup `reencrypt --init-only` and its
//! `--encrypt`/`--decrypt` forms): [`init`] (key and/or cipher change), [`init_encrypt`]
//! (detached header), [`init_encrypt_shift`] (header on the device, data shift),
//! [`init_decrypt`] (detached header) and [`init_decrypt_shift`] (header on the device moved
//! to a new file, data shift). Each checks everything before its first write and leaves
//! cryptsetup's start state.

use blockdev::BlockDevice;
use formats::luks2::reencrypt::{
    self as re, backup_of, crypt_segment, Direction, ReencryptKeyslot, ReencryptMode, ReencryptState,
    Resilience,
};
use formats::luks2::{Digest, Luks2Metadata};
use sector_crypto::kdf::{self, HashAlg, Passphrase};
use sector_crypto::secure::SecretBuf;
use sector_crypto::VolumeKey;
use serde_json::Map;

use super::shift::{copy_range, shift_header_layout};
use super::{
    cipher, first_free_digest, first_free_keyslot, make_digest, max_gap, meta_err, status, v2,
    ReencryptParams,
};
use crate::luks::{io, luks2, parse_hash, Luks, LuksError, LuksHeader, PbkdfParams};
use crate::luks::{ParamError, ReencryptError};

/// Starts a reencryption (cryptsetup `reencrypt --init-only`): unlocks the current key with
/// `passphrase`, makes a new volume key with a keyslot for the same passphrase, and writes
/// the reencryption metadata. No data is touched. Returns the new keyslot.
pub fn init(
    meta: &dyn BlockDevice,
    data_size: u64,
    luks: &mut Luks,
    passphrase: &Passphrase,
    p: &ReencryptParams,
) -> Result<u32, LuksError> {
    if status(luks)?.is_some() {
        return Err(LuksError::Reencrypt(ReencryptError::AlreadyInitialized));
    }
    luks.check_supported()?;
    if luks.aead()?.is_some() {
        return Err(LuksError::Unsupported(
            "reencryption of an authenticated (integrity) volume is not supported".into(),
        ));
    }
    let resilience_name = p.resilience.as_str();
    if !matches!(resilience_name, "checksum" | "journal" | "none") {
        return Err(LuksError::Reencrypt(ReencryptError::Resilience(resilience_name.to_owned())));
    }
    let rhash = parse_hash(&p.resilience_hash)
        .map_err(|_| LuksError::Reencrypt(ReencryptError::ResilienceHash(p.resilience_hash.clone())))?;
    // Only the keyslot of the passphrase given gets a new-key keyslot; the others are
    // removed when the run finishes. With several, the caller must name the one to keep.
    if let LuksHeader::V2(s) = &luks.header {
        let m = &s.header.metadata;
        let bound: Vec<u32> = m
            .segment_digest(0)
            .and_then(|d| m.digests.get(&d))
            .map(|d| {
                d.keyslots
                    .iter()
                    .copied()
                    .filter(|k| m.keyslots.get(k).is_some_and(|ks| ks.is_luks2()))
                    .collect()
            })
            .unwrap_or_default();
        if bound.len() > 1 && p.key_slot.is_none() {
            return Err(LuksError::Reencrypt(ReencryptError::KeyslotNotNamed { keyslots: bound }));
        }
    }
    let (old_slot, vk_old) = luks.unlock_with(meta, passphrase, p.key_slot, &p.kdf_limits)?;
    log::info!("reencrypt: keyslot {old_slot} opened the current volume key");
    let seg = luks.segment()?;
    let new_cipher = p.cipher.clone().unwrap_or_else(|| seg.cipher.clone());
    let key_bytes = match (p.key_bytes, &p.cipher) {
        (Some(k), _) => k,
        (None, None) => vk_old.len(),
        (None, Some(c)) => crate::luks::default_key_bits(c) / 8,
    };
    let new_ss = p.sector_size.unwrap_or(seg.sector_size);
    if ![512, 1024, 2048, 4096].contains(&new_ss) {
        return Err(LuksError::Param(ParamError::SectorSize { size: new_ss }));
    }
    let mut vk_new = SecretBuf::zeroed(key_bytes);
    kdf::random_bytes(&mut vk_new).map_err(LuksError::Kdf)?;
    let vk_new = VolumeKey::from_secret(vk_new);
    cipher(&new_cipher, &vk_new, new_ss)?;
    let s = v2(luks)?;
    let old_ss = seg.sector_size;
    let check_ss = u64::from(old_ss.max(new_ss));
    let data_offset = seg.offset;
    let device_size = data_size.saturating_sub(data_offset);
    if device_size == 0 {
        return Err(LuksError::Param(ParamError::NoData));
    }
    if !device_size.is_multiple_of(check_ss) {
        return Err(LuksError::Param(ParamError::DataUnaligned { align: check_ss }));
    }
    if seg.size.is_some() || seg.iv_offset != 0 {
        return Err(LuksError::Unsupported(
            "reencryption of a fixed-size segment or one with an IV tweak is not supported".into(),
        ));
    }
    // The new keyslot's KDF runs before the first write.
    let key = luks2::slot_key(&s.header, vk_new.len(), passphrase.as_bytes(), &p.pbkdf)?;
    let new_slot = first_free_keyslot(&s.header.metadata)?;

    // Header #1: the new keyslot with its own (unbound) digest.
    let mut next = s.clone();
    {
        let m = &next.header.metadata;
        let len = luks2::area_size(vk_new.len());
        let offset = luks2::find_area(m, len, None).ok_or(LuksError::NoKeyslotSpace { need: len })?;
        let iterations = p.pbkdf.digest_iterations(vk_new.len());
        let digest = make_digest(vk_new.as_bytes(), p.pbkdf.hash, iterations)?;
        let ks = luks2::new_keyslot(&next.header, meta, offset, len, &vk_new, &key, p.pbkdf.hash)?;
        let m = &mut next.header.metadata;
        let did = first_free_digest(m);
        m.keyslots.insert(new_slot, ks);
        // Tokens that unlock the old keyslot unlock the new one too (cryptsetup copies the
        // assignment); the old keyslot leaves them when it is dropped at the end.
        for t in m.tokens.values_mut() {
            if t.keyslots.contains(&old_slot) && !t.keyslots.contains(&new_slot) {
                t.keyslots.push(new_slot);
                t.keyslots.sort_unstable();
            }
        }
        m.digests.insert(
            did,
            Digest {
                type_name: "pbkdf2".into(),
                keyslots: vec![new_slot],
                segments: Vec::new(),
                pbkdf2: Some(digest),
                extra: Map::new(),
            },
        );
    }
    luks2::write_header(&mut next, meta)?;
    *s = next;

    // Header #2: the reencryption metadata.
    let mut next = s.clone();
    let m = &mut next.header.metadata;
    let digest_new = m.keyslot_digest(new_slot).unwrap_or(0);
    let seg0 = m.segments[&0].clone();
    let mut fin = crypt_segment(data_offset, 0, None, &new_cipher, new_ss, false);
    fin.flags = Some(vec![re::FLAG_BACKUP_FINAL.to_owned()]);
    let alignment = check_ss.max(512) as u32;
    add_reencrypt_metadata(
        m,
        backup_of(&seg0, re::FLAG_BACKUP_PREVIOUS),
        fin,
        Some(digest_new),
        ReencryptMode::Reencrypt,
        Direction::Forward,
        resilience_name,
        rhash,
        alignment,
        (Some(vk_old.as_bytes()), Some(vk_new.as_bytes())),
        &p.pbkdf,
        None,
    )?;
    luks2::write_header(&mut next, meta)?;
    *s = next;
    Ok(new_slot)
}

/// Adds the reencryption metadata to `m` (cryptsetup `reencrypt_init`'s header): the
/// backup-previous and backup-final segments (bound to the old digest, which is the one of
/// segment 0, and to `digest_new`), the reencrypt keyslot in the largest free gap of the
/// keyslots area, the verification digest and the `online-reencrypt-v2` requirement.
#[allow(clippy::too_many_arguments)]
fn add_reencrypt_metadata(
    m: &mut Luks2Metadata,
    previous: formats::luks2::Segment,
    final_: formats::luks2::Segment,
    digest_new: Option<u32>,
    mode: ReencryptMode,
    direction: Direction,
    resilience_name: &str,
    rhash: HashAlg,
    alignment: u32,
    (vk_old, vk_new): (Option<&[u8]>, Option<&[u8]>),
    pbkdf: &PbkdfParams,
    shift: Option<u64>,
) -> Result<(), LuksError> {
    let digest_old = if previous.type_name == "crypt" {
        Some(m.segment_digest(0).ok_or_else(|| LuksError::Unsupported("data segment has no digest".into()))?)
    } else {
        None
    };
    let first = m.segments.keys().max().map_or(0, |k| k + 1);
    let final_offset = final_.offset;
    let prev_offset = previous.offset;
    m.segments.insert(first, previous);
    m.segments.insert(first + 1, final_);
    for (d, sg) in [(digest_old, first), (digest_new, first + 1)] {
        if let Some(d) = d.and_then(|d| m.digests.get_mut(&d)) {
            d.segments.push(sg);
        }
    }
    let resilience = match resilience_name {
        "checksum" => Resilience::Checksum { hash: rhash.name().into(), block_size: alignment },
        "journal" => Resilience::Journal,
        "none" => Resilience::None,
        // The data shift is the backup-final's offset (the header's size).
        // (a detached header's: the --reduce-device-size given).
        "datashift" => Resilience::Datashift { shift: shift.unwrap_or(final_offset) },
        // A decryption's shift is the old data offset (backup-previous's).
        "datashift-checksum" => Resilience::DatashiftChecksum {
            hash: rhash.name().into(),
            block_size: alignment,
            shift: prev_offset,
        },
        other => return Err(LuksError::Reencrypt(ReencryptError::Resilience(other.to_owned()))),
    };
    let rslot = first_free_keyslot(m)?;
    let (area_offset, area_size) = if matches!(resilience, Resilience::Datashift { .. }) {
        // cryptsetup gives a data shift's keyslot one 4 KiB block (it keeps nothing there).
        let o = luks2::find_area(m, 4096, None).ok_or(LuksError::NoKeyslotSpace { need: 4096 })?;
        (o, 4096)
    } else {
        max_gap(m).ok_or(LuksError::NoKeyslotSpace { need: 4096 })?
    };
    let rks = ReencryptKeyslot { id: rslot, mode, direction, resilience, area_offset, area_size };
    m.keyslots.insert(rslot, rks.to_keyslot());
    // cryptsetup 2.6 marks a decryption with data shift `online-reencrypt-v3`.
    let version = if mode == ReencryptMode::Decrypt && rks.resilience.shift() != 0 { 3 } else { 2 };
    re::set_requirement(m, Some(version));
    let st = ReencryptState::from_metadata(m)
        .map_err(meta_err)?
        .ok_or(LuksError::Internal("the reencryption metadata just added does not parse back"))?;
    let vdata = st.verification_data(m, version, vk_old, vk_new).map_err(meta_err)?;
    let iterations = pbkdf.digest_iterations(vdata.len());
    let vdigest = make_digest(&vdata, pbkdf.hash, iterations)?;
    let vid = first_free_digest(m);
    m.digests.insert(
        vid,
        Digest {
            type_name: "pbkdf2".into(),
            keyslots: vec![rslot],
            segments: Vec::new(),
            pbkdf2: Some(vdigest),
            extra: Map::new(),
        },
    );
    Ok(())
}

/// What `reencrypt --encrypt --header FILE` formats, checked against the data device
/// (`size` bytes) before anything is written, in cryptsetup 2.6.1's order and words:
/// `(format parameters, header length, data size, data shift)`. The header file is
/// created or grown to the header length (`2 × metadata + keyslots`).
///
/// With `--reduce-device-size R` (a data shift with a detached header) the metadata size
/// defaults to 16 KiB and the keyslots area to `R` less both metadata copies; more than
/// `R` is refused. The data (from `--offset`, 0 by default) stays where it is and is
/// encrypted in place: `R` is at most the data's size, a multiple of the encryption sector
/// size.
pub fn plan_encrypt(
    size: u64,
    p: &ReencryptParams,
) -> Result<(crate::luks::FormatParams, u64, u64, Option<u64>), LuksError> {
    let unsupported = || LuksError::Param(ParamError::MetadataSizeOptions);
    let l = &p.layout;
    let shift = l.reduce_device_size.filter(|&r| r != 0);
    let mut md = l.metadata_size;
    let mut ks = l.keyslots_size;
    if let Some(r) = shift {
        let m = *md.get_or_insert(16 << 10);
        if ks.is_none() {
            ks = Some(r.checked_sub(2 * m).filter(|k| *k > 0).ok_or_else(unsupported)?);
        }
        if ks.is_some_and(|k| 2 * m + k > r) {
            return Err(LuksError::Reencrypt(ReencryptError::MetadataLargerThanShift));
        }
    }
    if md.is_some_and(|m| !formats::luks2::METADATA_SIZES.contains(&m))
        || ks.is_some_and(|k| k == 0 || !k.is_multiple_of(4096) || k > formats::luks2::MAX_KEYSLOTS_SIZE)
    {
        return Err(unsupported());
    }
    if l.offset.is_some_and(|o| !o.is_multiple_of(512)) {
        return Err(LuksError::Param(ParamError::DataOffsetUnaligned));
    }
    let (cipher_name, key_bytes, ss) = new_crypt(p)?;
    let offset = l.offset.map(|o| o / 512).filter(|o| *o != 0);
    let fp = detached_format(p, (cipher_name, key_bytes, ss), offset, md, ks, size);
    let (md, ks, data_offset) = luks2::storage(&fp)?;
    let data_size = size
        .checked_sub(data_offset)
        .filter(|d| *d > 0)
        .ok_or(LuksError::DeviceTooSmall { need: data_offset + u64::from(ss), have: size })?;
    if !data_size.is_multiple_of(u64::from(ss)) {
        return Err(LuksError::Param(ParamError::DataUnaligned { align: u64::from(ss) }));
    }
    if let Some(r) = shift {
        if r > data_size {
            return Err(LuksError::Reencrypt(ReencryptError::ShiftLargerThanData));
        }
        if !r.is_multiple_of(u64::from(ss)) {
            return Err(LuksError::Reencrypt(ReencryptError::ShiftUnaligned { align: u64::from(ss) }));
        }
    }
    Ok((fp, 2 * md + ks, data_size, shift))
}

/// Starts the encryption of a plaintext data device in place with a detached header
/// (cryptsetup `reencrypt --encrypt --header FILE`): `header` (already sized, see
/// [`plan_encrypt`]) is formatted as LUKS2 with a new volume key in one keyslot for
/// `passphrase` and the data segment at the data offset, then the segments become
/// cryptsetup's encryption start state: a linear segment over the data, backup-previous
/// (linear) and backup-final (crypt), mode `encrypt`. Without a data shift the run goes
/// forward with the resilience asked for; with `--reduce-device-size R` it goes backward
/// with resilience `datashift` (`shift_size` R) and fixed-size linear segments
/// ([`re::is_detached_shift_encryption`]). No data is touched. A crash before the second
/// header write leaves the data as it was (the header file is then a LUKS2 header claiming
/// ciphertext: run the encryption again, which formats it anew).
pub fn init_encrypt(
    header: &dyn BlockDevice,
    data: &dyn BlockDevice,
    passphrase: &Passphrase,
    p: &ReencryptParams,
) -> Result<(Luks, u32), LuksError> {
    let (fp, need, data_size, shift) = plan_encrypt(data.geometry().size, p)?;
    let resilience_name = if shift.is_some() { "datashift" } else { p.resilience.as_str() };
    if !matches!(resilience_name, "checksum" | "journal" | "none" | "datashift") {
        return Err(LuksError::Reencrypt(ReencryptError::Resilience(resilience_name.to_owned())));
    }
    let rhash = parse_hash(&p.resilience_hash)
        .map_err(|_| LuksError::Reencrypt(ReencryptError::ResilienceHash(p.resilience_hash.clone())))?;
    if crate::luks::probe(data)?.is_some() {
        return Err(LuksError::Reencrypt(ReencryptError::AlreadyLuks));
    }
    let g = data.geometry();
    let alignment = u64::from(fp.sector_size.max(g.logical_block).max(512));
    if !data_size.is_multiple_of(alignment) {
        return Err(LuksError::Param(ParamError::DataUnaligned { align: alignment }));
    }
    // The header is built in memory and written once, keyslots area first: a crash leaves
    // the header file as it was, or a header whose segment says the data is plaintext.
    if header.geometry().size < need {
        return Err(LuksError::DeviceTooSmall { need, have: header.geometry().size });
    }
    let no_space = |e| match e {
        LuksError::NoKeyslotSpace { .. } => LuksError::Reencrypt(ReencryptError::KeyslotsAreaFull),
        e => e,
    };
    let image = blockdev::MemDevice::new(need, 512);
    let (mut luks, vk) = crate::luks::format(&image, &fp, passphrase).map_err(no_space)?;
    let s = v2(&mut luks)?;
    let mut next = s.clone();
    let m = &mut next.header.metadata;
    let seg0 = m.segments.get(&0).cloned().ok_or(LuksError::Internal("the new header has no segment 0"))?;
    let digest_new = m.segment_digest(0);
    let slot =
        digest_new.and_then(|d| m.digests.get(&d)).and_then(|d| d.keyslots.first().copied()).unwrap_or(0);
    let plain = re::linear_segment(seg0.offset, shift.map(|_| data_size), false);
    m.segments.insert(0, plain.clone());
    for d in m.digests.values_mut() {
        d.segments.clear();
    }
    add_reencrypt_metadata(
        m,
        backup_of(&plain, re::FLAG_BACKUP_PREVIOUS),
        backup_of(&seg0, re::FLAG_BACKUP_FINAL),
        digest_new,
        ReencryptMode::Encrypt,
        if shift.is_some() { Direction::Backward } else { Direction::Forward },
        resilience_name,
        rhash,
        alignment as u32,
        (None, Some(vk.as_bytes())),
        &p.pbkdf,
        shift,
    )
    .map_err(no_space)?;
    luks2::write_header(&mut next, &image)?;
    *s = next;
    let md2 = 2 * s.header.metadata.metadata_size();
    let bytes = image.to_vec();
    io::write_bytes(header, md2, &bytes[md2 as usize..], "keyslots area")?;
    io::flush(header, "keyslots area")?;
    io::write_bytes(header, 0, &bytes[..md2 as usize], "LUKS2 header")?;
    io::flush(header, "LUKS2 header")?;
    Ok((luks, slot))
}

/// Starts the encryption of a plaintext device in place with its header on the device
/// (cryptsetup `reencrypt --encrypt --reduce-device-size R`, data shift): the last `R`
/// bytes of `dev` are given up; the header takes the first `R / 2`, the data moves up by as
/// much. The first segment (`min(R / 2, data)` bytes) is copied to the end of the device
/// first, then the header, whose segments are cryptsetup 2.6's start state (resilience
/// `datashift`, direction backward, `backup-moved-segment`, see
/// [`formats::luks2::reencrypt::ShiftGeometry`]), is written over the first `R / 2` bytes,
/// keyslots area first. No other data is touched.
///
/// Like cryptsetup's, the header write is not atomic: power lost after the keyslots area
/// is partly written and before the header itself leaves a device that is not LUKS and
/// whose first `R / 2` bytes (minus the first 32 KiB) are only in the moved copy at
/// `size - R / 2`. Every later crash point resumes.
pub fn init_encrypt_shift(
    dev: &dyn BlockDevice,
    passphrase: &Passphrase,
    p: &ReencryptParams,
    reduce: u64,
) -> Result<(Luks, u32), LuksError> {
    if crate::luks::probe(dev)?.is_some() {
        return Err(LuksError::Reencrypt(ReencryptError::AlreadyLuks));
    }
    if reduce == 0 || !reduce.is_multiple_of(512) {
        return Err(LuksError::Reencrypt(ReencryptError::ReduceSize));
    }
    let g = dev.geometry();
    if reduce > g.size {
        return Err(LuksError::DeviceTooSmall { need: reduce, have: g.size });
    }
    if reduce == g.size {
        return Err(LuksError::Reencrypt(ReencryptError::ShiftLargerThanData));
    }
    let shift = reduce / 2;
    if !shift.is_multiple_of(4096) {
        return Err(LuksError::Reencrypt(ReencryptError::ShiftHeaderAlignment { shift }));
    }
    let (cipher_name, key_bytes, ss) = new_crypt(p)?;
    let data_size = g.size - reduce;
    let alignment = u64::from(ss.max(g.logical_block).max(512));
    if !data_size.is_multiple_of(alignment) || !g.size.is_multiple_of(alignment) {
        return Err(LuksError::Param(ParamError::DataUnaligned { align: alignment }));
    }
    let (md, ks) = shift_header_layout(&p.layout, shift)?;
    // The keyslot and the data shift's 4 KiB block must fit in the keyslots area.
    if ks < luks2::area_size(key_bytes) + 4096 {
        return Err(LuksError::Reencrypt(ReencryptError::KeyslotsAreaFull));
    }
    let fp =
        detached_format(p, (cipher_name, key_bytes, ss), Some(shift / 512), Some(md), Some(ks), data_size);
    let image = blockdev::MemDevice::new(shift, 512);
    let (mut luks, vk) = crate::luks::format(&image, &fp, passphrase)?;
    let moved_size = shift.min(data_size);
    let moved_offset = g.size - shift;
    let s = v2(&mut luks)?;
    let mut next = s.clone();
    let m = &mut next.header.metadata;
    let seg0 = m.segments.get(&0).cloned().ok_or(LuksError::Internal("the new header has no segment 0"))?;
    let digest_new = m.segment_digest(0);
    let slot =
        digest_new.and_then(|d| m.digests.get(&d)).and_then(|d| d.keyslots.first().copied()).unwrap_or(0);
    for d in m.digests.values_mut() {
        d.segments.clear();
    }
    m.segments.clear();
    let moved = re::linear_segment(moved_offset, Some(moved_size), false);
    m.segments.insert(0, moved.clone());
    if data_size > moved_size {
        m.segments.insert(1, re::linear_segment(moved_size, Some(data_size - moved_size), false));
    }
    let id = m.segments.len() as u32;
    m.segments.insert(id, backup_of(&moved, re::FLAG_BACKUP_MOVED));
    add_reencrypt_metadata(
        m,
        backup_of(&re::linear_segment(0, Some(data_size), false), re::FLAG_BACKUP_PREVIOUS),
        backup_of(&seg0, re::FLAG_BACKUP_FINAL),
        digest_new,
        ReencryptMode::Encrypt,
        Direction::Backward,
        "datashift",
        HashAlg::Sha256,
        alignment as u32,
        (None, Some(vk.as_bytes())),
        &p.pbkdf,
        None,
    )?;
    luks2::write_header(&mut next, &image)?;
    *s = next;
    // The first segment goes to the end of the device (in the given-up space) first.
    copy_range(dev, 0, dev, moved_offset, moved_size, "moving the first data segment")?;
    io::flush(dev, "moved data segment")?;
    let md2 = 2 * md;
    let bytes = zeroize::Zeroizing::new(image.to_vec());
    io::write_bytes(dev, md2, &bytes[md2 as usize..], "keyslots area")?;
    io::flush(dev, "keyslots area")?;
    io::write_bytes(dev, 0, &bytes[..md2 as usize], "LUKS2 header")?;
    io::flush(dev, "LUKS2 header")?;
    Ok((luks, slot))
}

/// The new segment's cipher, key size in bytes and sector size an encryption asks for
/// (cryptsetup's defaults: aes-xts-plain64, its default key size, 512-byte sectors).
fn new_crypt(p: &ReencryptParams) -> Result<(String, usize, u32), LuksError> {
    let cipher = p.cipher.clone().unwrap_or_else(|| "aes-xts-plain64".into());
    let key_bytes = p.key_bytes.unwrap_or_else(|| crate::luks::default_key_bits(&cipher) / 8);
    let ss = p.sector_size.unwrap_or(512);
    if ![512, 1024, 2048, 4096].contains(&ss) {
        return Err(LuksError::Param(ParamError::SectorSize { size: ss }));
    }
    Ok((cipher, key_bytes, ss))
}

/// The format parameters of the detached LUKS2 header an encryption starts from: the
/// [`new_crypt`] choice, `p`'s PBKDF, the header layout and the data's size.
fn detached_format(
    p: &ReencryptParams,
    (cipher, key_bytes, sector_size): (String, usize, u32),
    offset: Option<u64>,
    metadata_size: Option<u64>,
    keyslots_size: Option<u64>,
    data_size: u64,
) -> crate::luks::FormatParams {
    crate::luks::FormatParams {
        cipher,
        key_bytes,
        pbkdf: p.pbkdf,
        sector_size,
        detached: true,
        offset,
        metadata_size,
        keyslots_size,
        data_size: Some(data_size),
        ..crate::luks::FormatParams::default()
    }
}

/// Starts the decryption of a LUKS2 volume whose header is on the device into a new
/// detached header (cryptsetup 2.6 `reencrypt --decrypt --header NEW`, data shift; traced
/// with strace, header by header). The volume's header on `dev` is loaded and the
/// passphrase checked before any write; then, as cryptsetup:
///
/// 1. the header and its keyslots area (the first `S` bytes, `S` the data offset) are
///    copied to `new_hdr` (already at least that long), flushed;
/// 2. the magic of both header copies on `dev` is wiped (zeroes), flushed: `dev` is no
///    longer LUKS, so two headers never hold the key at once;
/// 3. the first data segment's ciphertext (`M` bytes from `S`: `--hotzone-size`, by
///    default the shift up to 20 MiB, and the whole data when it is shorter) is copied to
///    offset 0, flushed;
/// 4. the new header gets the start state: requirement `online-reencrypt-v3`, reencrypt
///    keyslot mode `decrypt`, direction forward, area `datashift-checksum` (the largest
///    free gap of the keyslots area, checksums of 4096-byte blocks, `shift_size` S);
///    segments `crypt @0 (M)` (the moved one), `crypt @S+M iv M/512 dynamic` (when the
///    data is longer than `S`), backup-moved `crypt @0 (M)`, backup-previous `crypt @S dynamic`, backup-final
///    `linear @0 dynamic` (see [`formats::luks2::reencrypt::DecryptShiftGeometry`]).
///
/// Power lost before 4 leaves `new_hdr` a plain detached copy of the volume's header
/// (after 2; a partial one before), whose segment is still right: the data is intact at
/// `S`. Running `reencrypt --decrypt --header NEW` again then decrypts it in place at `S`
/// (what cryptsetup does with that file too); before 2 `dev` is untouched.
pub fn init_decrypt_shift(
    new_hdr: &dyn BlockDevice,
    dev: &dyn BlockDevice,
    passphrase: &Passphrase,
    p: &ReencryptParams,
) -> Result<Luks, LuksError> {
    let mut luks = Luks::load(dev, false)?;
    if status(&luks)?.is_some() {
        return Err(LuksError::Reencrypt(ReencryptError::AlreadyInitialized));
    }
    luks.check_supported()?;
    if luks.aead()?.is_some() {
        return Err(LuksError::Unsupported(
            "decryption of an authenticated (integrity) volume is not supported".into(),
        ));
    }
    let journal = matches!(p.resilience.as_str(), "journal" | "datashift-journal");
    if !journal && p.resilience != "checksum" && p.resilience != "datashift-checksum" {
        return Err(LuksError::Reencrypt(ReencryptError::ResilienceNotApplicable(p.resilience.clone())));
    }
    let rhash = parse_hash(&p.resilience_hash)
        .map_err(|_| LuksError::Reencrypt(ReencryptError::ResilienceHash(p.resilience_hash.clone())))?;
    let seg = luks.segment()?;
    if seg.size.is_some() || seg.iv_offset != 0 {
        return Err(LuksError::Unsupported(
            "decryption of a fixed-size segment or one with an IV tweak is not supported".into(),
        ));
    }
    let s = v2(&mut luks)?;
    let hdr_len = s.header.metadata.metadata_and_keyslots_size();
    let shift = seg.offset;
    let size = dev.geometry().size;
    let ss = u64::from(seg.sector_size.max(512));
    if shift == 0 || shift < hdr_len || !shift.is_multiple_of(4096) {
        return Err(LuksError::Unsupported(format!(
            "decryption with data shift needs the data right after the header (data offset {shift}, \
             header {hdr_len} bytes)"
        )));
    }
    if size <= shift {
        return Err(LuksError::Param(ParamError::NoData));
    }
    // The moved first segment: --hotzone-size (at most the shift, a multiple of the
    // checksum block), by default the shift up to 20 MiB; the whole data when shorter.
    let moved_size = match p.layout.hotzone_size.map(|h| h - h % 512).filter(|h| *h != 0) {
        Some(h) if h > shift => return Err(LuksError::Reencrypt(ReencryptError::MovedSegmentTooLarge)),
        Some(h) => h,
        None => shift.min(re::DEFAULT_NONE_HOTZONE_LENGTH),
    }
    .min(size - shift);
    if !moved_size.is_multiple_of(4096u64.max(ss)) && moved_size != size - shift {
        return Err(LuksError::Reencrypt(ReencryptError::MovedSegmentUnaligned));
    }
    if !size.is_multiple_of(ss) {
        return Err(LuksError::Param(ParamError::DataUnaligned { align: ss }));
    }
    if journal {
        // cryptsetup's datashift-journal keeps the whole moved segment in the largest free
        // gap of the keyslots area, which is always smaller than the header.
        let avail = max_gap(&s.header.metadata).map_or(0, |(_, l)| l);
        return Err(LuksError::Reencrypt(ReencryptError::MovedSegmentNoRoom {
            requested: shift,
            available: avail,
        }));
    }
    if new_hdr.geometry().size < hdr_len {
        return Err(LuksError::DeviceTooSmall { need: hdr_len, have: new_hdr.geometry().size });
    }
    let (slot, vk) = luks.unlock_with(dev, passphrase, p.key_slot, &p.kdf_limits)?;
    log::info!("decrypt: keyslot {slot} opened the volume key");
    let s = v2(&mut luks)?;
    let mut next = s.clone();
    let m = &mut next.header.metadata;
    let seg0 = m.segments.get(&0).cloned().ok_or(LuksError::Internal("the new header has no segment 0"))?;
    let c = seg0.crypt.clone().ok_or(LuksError::Unsupported("data segment is not crypt".into()))?;
    let d_old =
        m.segment_digest(0).ok_or_else(|| LuksError::Unsupported("data segment has no digest".into()))?;
    let moved = crypt_segment(0, 0, Some(moved_size), &c.encryption, c.sector_size, false);
    m.segments.clear();
    m.segments.insert(0, moved.clone());
    if size - shift > moved_size {
        m.segments.insert(
            1,
            crypt_segment(shift + moved_size, moved_size >> 9, None, &c.encryption, c.sector_size, false),
        );
    }
    let id = m.segments.len() as u32;
    m.segments.insert(id, backup_of(&moved, re::FLAG_BACKUP_MOVED));
    for d in m.digests.values_mut() {
        d.segments.clear();
    }
    if let Some(d) = m.digests.get_mut(&d_old) {
        d.segments = (0..=id).collect();
    }
    add_reencrypt_metadata(
        m,
        backup_of(&seg0, re::FLAG_BACKUP_PREVIOUS),
        backup_of(&re::linear_segment(0, None, false), re::FLAG_BACKUP_FINAL),
        None,
        ReencryptMode::Decrypt,
        Direction::Forward,
        "datashift-checksum",
        rhash,
        4096u32.max(c.sector_size),
        (Some(vk.as_bytes()), None),
        &p.pbkdf,
        None,
    )?;
    // The metadata is complete before anything is written.
    let st = ReencryptState::from_metadata(m)
        .map_err(meta_err)?
        .ok_or(LuksError::Internal("the reencryption metadata just added does not parse back"))?;
    re::DecryptShiftGeometry::of(&st, m, size).map_err(meta_err)?;
    copy_range(dev, 0, new_hdr, 0, hdr_len, "copying the LUKS2 header")?;
    io::flush(new_hdr, "new LUKS2 header")?;
    let md = s.header.metadata.metadata_size();
    for off in [0, md] {
        io::write_bytes(dev, off, &[0u8; 6], "LUKS2 header magic")?;
        io::flush(dev, "LUKS2 header magic")?;
    }
    copy_range(dev, shift, dev, 0, moved_size, "moving the first data segment")?;
    io::flush(dev, "moved data segment")?;
    luks2::write_header(&mut next, new_hdr)?;
    *s = next;
    Ok(luks)
}

/// Starts the decryption of a LUKS2 volume with a detached header (cryptsetup
/// `reencrypt --decrypt --header FILE`): backup-previous (the crypt segment), backup-final
/// (linear), mode `decrypt`, direction backward, as cryptsetup 2.6 writes it. The
/// passphrase is checked first; no data is touched; one header write.
pub fn init_decrypt(
    meta: &dyn BlockDevice,
    data_size: u64,
    luks: &mut Luks,
    passphrase: &Passphrase,
    p: &ReencryptParams,
) -> Result<(), LuksError> {
    if status(luks)?.is_some() {
        return Err(LuksError::Reencrypt(ReencryptError::AlreadyInitialized));
    }
    luks.check_supported()?;
    if luks.aead()?.is_some() {
        return Err(LuksError::Unsupported(
            "decryption of an authenticated (integrity) volume is not supported".into(),
        ));
    }
    let resilience_name = p.resilience.as_str();
    if !matches!(resilience_name, "checksum" | "journal" | "none") {
        return Err(LuksError::Reencrypt(ReencryptError::Resilience(resilience_name.to_owned())));
    }
    let rhash = parse_hash(&p.resilience_hash)
        .map_err(|_| LuksError::Reencrypt(ReencryptError::ResilienceHash(p.resilience_hash.clone())))?;
    let (slot, vk_old) = luks.unlock_with(meta, passphrase, p.key_slot, &p.kdf_limits)?;
    log::info!("decrypt: keyslot {slot} opened the volume key");
    let seg = luks.segment()?;
    if seg.size.is_some() || seg.iv_offset != 0 {
        return Err(LuksError::Unsupported(
            "decryption of a fixed-size segment or one with an IV tweak is not supported".into(),
        ));
    }
    let check_ss = u64::from(seg.sector_size.max(512));
    let device_size = data_size.saturating_sub(seg.offset);
    if device_size == 0 {
        return Err(LuksError::Param(ParamError::NoData));
    }
    if !device_size.is_multiple_of(check_ss) {
        return Err(LuksError::Param(ParamError::DataUnaligned { align: check_ss }));
    }
    let s = v2(luks)?;
    let mut next = s.clone();
    let m = &mut next.header.metadata;
    let seg0 = m.segments[&0].clone();
    add_reencrypt_metadata(
        m,
        backup_of(&seg0, re::FLAG_BACKUP_PREVIOUS),
        backup_of(&re::linear_segment(seg.offset, None, false), re::FLAG_BACKUP_FINAL),
        None,
        ReencryptMode::Decrypt,
        Direction::Backward,
        resilience_name,
        rhash,
        check_ss as u32,
        (Some(vk_old.as_bytes()), None),
        &p.pbkdf,
        None,
    )?;
    luks2::write_header(&mut next, meta)?;
    *s = next;
    Ok(())
}
