//! `convert --type luks1|luks2` (cryptsetup `crypt_convert`, `lib/luks2/luks2_luks1_convert.c`):
//! the header changes format in place; the keyslots keep their key material (moved
//! between the LUKS1 layout, first keyslot at 4 KiB, and the LUKS2 one, keyslots area at
//! 32 KiB) and the data is not touched.
//!
//! Refusals, with cryptsetup 2.6's messages (all exit 1):
//! * LUKS2 → LUKS1: a sector size other than 512, more than one digest or a digest that is
//!   not pbkdf2 (unbound keys), tokens, an active keyslot above 7, a keyslot LUKS1 cannot
//!   hold (not pbkdf2, other stripes, key or area size, cipher or hash than the volume's),
//!   and (sealdisk's own wording) authenticated encryption and persistent flags LUKS1
//!   has no place for are dropped only after that refusal list passes — flags are dropped,
//!   integrity is refused.
//! * LUKS1 → LUKS2: keyslot material not starting at 4 KiB, LUKSMETA metadata after the
//!   keyslots, not 28 KiB of room between the keyslots and the data.
//!
//! Crash safety (stronger than cryptsetup's, whose keyslot move is unprotected): every
//! intermediate state between flushes is a valid LUKS1 or LUKS2 header whose keyslots
//! point at intact key material.
//!
//! ```text
//!  LUKS1 → LUKS2                               LUKS2 → LUKS1
//!  1 keyslot material 4K.. copied to 32K..,    1 LUKS1 header at 0 whose keyslots point at
//!    LUKS1 header rewritten to point there;      the LUKS2 keyslot areas (32K..) as they
//!    flush (LUKS1, new offsets)                  are; flush (LUKS1 over LUKS2's areas)
//!  2 LUKS2 secondary copy at 16K; flush        2 material 32K.. copied to 4K.., LUKS1
//!    (still LUKS1: its magic is at 0)            header rewritten to point there; flush
//!  3 LUKS2 primary copy at 0; flush (LUKS2)      (LUKS1, cryptsetup's layout)
//! ```
//! A step's writes are atomic only up to its flush: with a volatile cache that writes back
//! some but not all of a step's blocks before power is lost, the step that moves key
//! material can leave neither layout intact, as cryptsetup's move can.

use blockdev::BlockDevice;
use formats::luks1::{KeyslotState, Luks1Header};
use formats::luks2::{
    self, Af, Area, CryptParams, Digest, DigestPbkdf2, HeaderSalts, Keyslot, Luks2Header, Luks2Metadata,
    Segment as JsonSegment, SegmentSize, BINARY_HEADER_SIZE, SALT_LEN,
};
use sector_crypto::af;
use serde_json::Map;

use super::luks2 as ops;
use super::{io, Luks, Luks2State, LuksError, LuksHeader, LuksVersion};

/// The LUKS2 metadata size a converted header has (cryptsetup `LUKS2_HDR_16K_LEN`).
const HDR_16K: u64 = 0x4000;
/// Where LUKS1 keyslot material starts (`LUKS_ALIGN_KEYSLOTS`).
const LUKS1_KEYSLOTS_START: u64 = 4096;
/// How far key material moves: from 4 KiB to the LUKS2 keyslots area at 32 KiB.
const SHIFT: u64 = 2 * HDR_16K - LUKS1_KEYSLOTS_START;
/// The LUKSMETA magic (foreign metadata right after the LUKS1 keyslots).
const LUKSMETA: &[u8; 8] = b"LUKSMETA";

fn refuse(msg: impl Into<String>) -> LuksError {
    LuksError::CannotConvert { reason: msg.into() }
}

impl Luks {
    /// Converts the header on `meta` to `to` in place (cryptsetup `convert --type`). The
    /// caller holds the device exclusively. `data_size` is the metadata device's size (the
    /// room a detached header has).
    pub fn convert(&mut self, meta: &dyn BlockDevice, to: LuksVersion) -> Result<(), LuksError> {
        match (self.version(), to) {
            (LuksVersion::V1, LuksVersion::V1) => Err(refuse("Device is already LUKS1 type.")),
            (LuksVersion::V2, LuksVersion::V2) => Err(refuse("Device is already LUKS2 type.")),
            (LuksVersion::V1, LuksVersion::V2) => {
                let LuksHeader::V1(h) = &self.header else { unreachable!("version checked") };
                let state = to_luks2(h, meta)?;
                *self = Luks { header: LuksHeader::V2(Box::new(state)), repaired: None, needs_repair: None };
                Ok(())
            }
            (LuksVersion::V2, LuksVersion::V1) => {
                self.check_supported()?;
                let LuksHeader::V2(s) = &self.header else { unreachable!("version checked") };
                let h = to_luks1(&s.header, meta)?;
                *self = Luks { header: LuksHeader::V1(Box::new(h)), repaired: None, needs_repair: None };
                Ok(())
            }
        }
    }
}

/// The key-material area length LUKS2 gives a `key_bytes` key (4 KiB aligned).
fn area_len(key_bytes: u32) -> u64 {
    (af::split_sectors(key_bytes as usize, formats::luks1::STRIPES) as u64 * 512).div_ceil(4096) * 4096
}

fn to_luks2(h: &Luks1Header, meta: &dyn BlockDevice) -> Result<Luks2State, LuksError> {
    let max_size = match h.payload_offset_bytes() {
        0 => meta.geometry().size,
        n => n,
    };
    let first = h.keyslots.iter().map(|k| u64::from(k.key_material_offset) * 512).min().unwrap_or(0);
    if first != LUKS1_KEYSLOTS_START {
        return Err(refuse(format!(
            "Unsupported LUKS1 keyslots material offset {} (sectors): it must be 8.",
            first / 512
        )));
    }
    let luks1_size = h.required_device_size().div_ceil(LUKS1_KEYSLOTS_START) * LUKS1_KEYSLOTS_START;
    if luks1_size + LUKSMETA.len() as u64 <= meta.geometry().size {
        let m = io::read_bytes(meta, luks1_size, LUKSMETA.len(), "LUKS1 keyslots end")?;
        if m == LUKSMETA {
            return Err(refuse("Unable to convert header with LUKSMETA additional metadata."));
        }
    }
    if max_size < luks1_size || max_size - luks1_size < SHIFT {
        return Err(refuse("Unable to move keyslot area. Not enough space."));
    }
    // The LUKS2 metadata (cryptsetup's json_luks1_object), keyslot areas already shifted.
    let cipher = if h.cipher_mode.is_empty() { h.cipher_name.clone() } else { h.cipher_spec() };
    // cryptsetup 2.6 gives every area the 4 KiB-aligned material size (what LUKS1's
    // standard layout spaces keyslots by; a converted-back header's inactive slots may lie
    // anywhere, so the distance between slots 0 and 1 is no measure).
    let stride = area_len(h.key_bytes);
    let mut keyslots = std::collections::BTreeMap::new();
    for (i, ks) in h.keyslots.iter().enumerate() {
        if ks.state != KeyslotState::Enabled {
            continue;
        }
        keyslots.insert(
            i as u32,
            Keyslot {
                type_name: luks2::KEYSLOT_LUKS2.into(),
                key_size: h.key_bytes,
                priority: None,
                af: Some(Af {
                    type_name: "luks1".into(),
                    stripes: formats::luks1::STRIPES,
                    hash: h.hash_spec.clone(),
                    extra: Map::new(),
                }),
                area: Area {
                    type_name: "raw".into(),
                    offset: u64::from(ks.key_material_offset) * 512 + SHIFT,
                    size: stride,
                    encryption: Some(cipher.clone()),
                    key_size: Some(h.key_bytes),
                    extra: Map::new(),
                },
                kdf: Some(luks2::Kdf::Pbkdf2 {
                    hash: h.hash_spec.clone(),
                    iterations: ks.iterations,
                    salt: ks.salt.to_vec(),
                }),
                extra: Map::new(),
            },
        );
    }
    let active: Vec<u32> = keyslots.keys().copied().collect();
    let mut segments = std::collections::BTreeMap::new();
    segments.insert(
        0,
        JsonSegment {
            type_name: "crypt".into(),
            offset: h.payload_offset_bytes(),
            size: SegmentSize::Dynamic,
            crypt: Some(CryptParams { iv_tweak: 0, encryption: cipher, sector_size: 512, integrity: None }),
            opal: None,
            flags: None,
            extra: Map::new(),
        },
    );
    let mut digests = std::collections::BTreeMap::new();
    digests.insert(
        0,
        Digest {
            type_name: "pbkdf2".into(),
            keyslots: active,
            segments: vec![0],
            pbkdf2: Some(DigestPbkdf2 {
                hash: h.hash_spec.clone(),
                iterations: h.mk_digest_iterations,
                salt: h.mk_digest_salt.to_vec(),
                digest: h.mk_digest.to_vec(),
            }),
            extra: Map::new(),
        },
    );
    let header = Luks2Header {
        hdr_size: HDR_16K,
        seqid: 1,
        label: String::new(),
        subsystem: String::new(),
        checksum_alg: "sha256".into(),
        uuid: h.uuid.clone(),
        metadata: Luks2Metadata {
            keyslots,
            tokens: std::collections::BTreeMap::new(),
            segments,
            digests,
            config: luks2::Config {
                json_size: HDR_16K - BINARY_HEADER_SIZE,
                keyslots_size: (max_size - 2 * HDR_16K) / 4096 * 4096,
                flags: None,
                requirements: None,
                extra: Map::new(),
            },
            extra: Map::new(),
        },
    };
    if max_size < header.metadata.metadata_and_keyslots_size() {
        return Err(refuse("Unable to move keyslot area. Not enough space."));
    }
    let mut salts = HeaderSalts { primary: [0; SALT_LEN], secondary: [0; SALT_LEN] };
    sector_crypto::kdf::random_bytes(&mut salts.primary).map_err(LuksError::Kdf)?;
    sector_crypto::kdf::random_bytes(&mut salts.secondary).map_err(LuksError::Kdf)?;
    // Encoded (and so validated) before the first write.
    let seqid = header.seqid + 1;
    let plan = header.write_plan(seqid, &salts).map_err(LuksError::Luks2)?;
    let mut moved = h.clone();
    for ks in &mut moved.keyslots {
        ks.key_material_offset += (SHIFT / 512) as u32;
    }
    let moved_bytes = moved.encode().map_err(LuksError::Luks1)?;

    // 1. Key material to 32 KiB and the LUKS1 header pointing there, one flush.
    let len = usize::try_from(luks1_size - LUKS1_KEYSLOTS_START).unwrap_or(usize::MAX);
    let material = io::read_bytes(meta, LUKS1_KEYSLOTS_START, len, "LUKS1 keyslots")?;
    io::write_bytes(meta, 2 * HDR_16K, &material, "keyslots area")?;
    io::write_bytes(meta, 0, &moved_bytes, "LUKS1 header")?;
    io::flush(meta, "keyslots area")?;
    // 2. and 3. The secondary LUKS2 copy (16 KiB..32 KiB, now free), then the primary
    // over the LUKS1 header.
    let (primary, secondary): (Vec<_>, Vec<_>) = plan
        .steps
        .iter()
        .filter_map(|s| match s {
            luks2::WriteStep::Write { offset, bytes } => Some((*offset, bytes)),
            luks2::WriteStep::Flush => None,
        })
        .partition(|(o, _)| *o < HDR_16K);
    for part in [secondary, primary] {
        for (offset, bytes) in part {
            io::write_bytes(meta, offset, bytes, "LUKS2 header")?;
        }
        io::flush(meta, "LUKS2 header")?;
    }
    let mut header = header;
    header.seqid = seqid;
    Ok(Luks2State { header, salts })
}

/// Whether keyslot `ks` can be a LUKS1 keyslot of a volume with `key_bytes`-byte keys,
/// `cipher` and `hash` (cryptsetup `keyslot_LUKS1_compatible`, plus: area cipher and key
/// size equal to the volume's, one hash for KDF, AF and digest, as LUKS1 has only one).
fn luks1_compatible(ks: &Keyslot, key_bytes: u32, cipher: &str, hash: &str) -> bool {
    let kdf_ok =
        matches!(&ks.kdf, Some(luks2::Kdf::Pbkdf2 { hash: h, salt, .. }) if h == hash && salt.len() == 32);
    let af_ok = ks.af.as_ref().is_some_and(|a| a.stripes == formats::luks1::STRIPES && a.hash == hash);
    ks.is_luks2()
        && kdf_ok
        && af_ok
        && ks.key_size == key_bytes
        && ks.area.size == area_len(key_bytes)
        && ks.area.encryption.as_deref() == Some(cipher)
        && ks.area.key_size == Some(key_bytes)
        && ks.area.offset >= 2 * HDR_16K
        && ks.area.offset.is_multiple_of(512)
}

fn to_luks1(h: &Luks2Header, meta: &dyn BlockDevice) -> Result<Luks1Header, LuksError> {
    let m = &h.metadata;
    let (_, seg) = ops::default_segment(h)?;
    let c = seg.crypt.as_ref().ok_or_else(|| refuse("LUKS2 data segment is not a crypt segment"))?;
    if c.sector_size != 512 {
        return Err(refuse(
            "Cannot convert to LUKS1 format - default segment encryption sector size is not 512 bytes.",
        ));
    }
    let digest = m.digests.get(&0).filter(|d| d.type_name == "pbkdf2" && m.digests.len() == 1);
    let Some(DigestPbkdf2 { hash, iterations, salt, digest }) = digest.and_then(|d| d.pbkdf2.as_ref()) else {
        return Err(refuse("Cannot convert to LUKS1 format - key slot digests are not LUKS1 compatible."));
    };
    if c.integrity.is_some() {
        return Err(refuse(
            "Cannot convert to LUKS1 format - LUKS2 authenticated encryption (integrity) has no LUKS1 form.",
        ));
    }
    if !m.tokens.is_empty() {
        return Err(refuse(format!(
            "Cannot convert to LUKS1 format - LUKS2 header contains {} token(s).",
            m.tokens.len()
        )));
    }
    let key_bytes = u32::try_from(ops::volume_key_size(h).unwrap_or(0)).unwrap_or(0);
    for (&i, ks) in &m.keyslots {
        if i >= 8 {
            return Err(refuse(format!(
                "Cannot convert to LUKS1 format - slot {i} (over maximum slots) is still active."
            )));
        }
        if !luks1_compatible(ks, key_bytes, &c.encryption, hash) {
            return Err(refuse(format!(
                "Cannot convert to LUKS1 format - keyslot {i} is not LUKS1 compatible."
            )));
        }
    }
    let (name, mode) = match c.encryption.split_once('-') {
        Some((n, md)) => (n.to_owned(), md.to_owned()),
        None => (c.encryption.clone(), String::new()),
    };
    let (Ok(salt32), Some(d20)) = (<[u8; 32]>::try_from(salt.as_slice()), digest.get(..20)) else {
        return Err(refuse("Cannot convert to LUKS1 format - key slot digests are not LUKS1 compatible."));
    };
    let payload = u32::try_from(seg.offset / 512).map_err(|_| refuse("data offset too large for LUKS1"))?;
    // Inactive keyslots get areas first-fit in the LUKS2 keyslots area (cryptsetup's
    // placeholders), so no two LUKS1 keyslots share one.
    let len = area_len(key_bytes);
    let start = 2 * m.metadata_size();
    let end = start + m.config.keyslots_size;
    let mut used: Vec<(u64, u64)> =
        m.keyslots.values().map(|k| (k.area.offset, k.area.offset + k.area.size)).collect();
    let mut offsets = [0u64; 8];
    for (i, off) in offsets.iter_mut().enumerate() {
        if let Some(ks) = m.keyslots.get(&(i as u32)) {
            *off = ks.area.offset;
            continue;
        }
        used.sort_unstable();
        let mut pos = start;
        for &(o, e) in &used {
            if o >= pos && o - pos >= len {
                break;
            }
            pos = pos.max(e);
        }
        if pos + len > end {
            return Err(refuse("Cannot convert to LUKS1 format - no room for the inactive keyslots."));
        }
        *off = pos;
        used.push((pos, pos + len));
    }
    let mut l1 = Luks1Header {
        cipher_name: name,
        cipher_mode: mode,
        hash_spec: hash.clone(),
        payload_offset: payload,
        key_bytes,
        mk_digest: d20.try_into().map_err(|_| refuse("digest"))?,
        mk_digest_salt: salt32,
        mk_digest_iterations: *iterations,
        uuid: h.uuid.clone(),
        keyslots: std::array::from_fn(|i| formats::luks1::Keyslot {
            state: if m.keyslots.contains_key(&(i as u32)) {
                KeyslotState::Enabled
            } else {
                KeyslotState::Disabled
            },
            iterations: match m.keyslots.get(&(i as u32)).and_then(|k| k.kdf.as_ref()) {
                Some(luks2::Kdf::Pbkdf2 { iterations, .. }) => *iterations,
                _ => 0,
            },
            salt: match m.keyslots.get(&(i as u32)).and_then(|k| k.kdf.as_ref()) {
                Some(luks2::Kdf::Pbkdf2 { salt, .. }) => salt.as_slice().try_into().unwrap_or([0; 32]),
                _ => [0; 32],
            },
            key_material_offset: u32::try_from(offsets[i] / 512).unwrap_or(u32::MAX),
            stripes: formats::luks1::STRIPES,
        }),
    };
    // Both LUKS1 headers are encoded (and validated) before the first write.
    let in_place = l1.encode().map_err(LuksError::Luks1)?;
    for ks in &mut l1.keyslots {
        ks.key_material_offset -= (SHIFT / 512) as u32;
    }
    let final_bytes = l1.encode().map_err(LuksError::Luks1)?;
    let move_end = offsets.iter().map(|o| o + len).max().unwrap_or(start).max(start);

    // 1. A LUKS1 header over the LUKS2 keyslot areas as they are (the LUKS2 binary header
    //    wiped with it).
    let mut first = vec![0u8; LUKS1_KEYSLOTS_START as usize];
    first[..in_place.len()].copy_from_slice(&in_place);
    io::write_bytes(meta, 0, &first, "LUKS1 header")?;
    io::flush(meta, "LUKS1 header")?;
    // 2. Key material to 4 KiB, with the header that points there.
    let material = io::read_bytes(meta, 2 * HDR_16K, (move_end - 2 * HDR_16K) as usize, "keyslots area")?;
    io::write_bytes(meta, LUKS1_KEYSLOTS_START, &material, "LUKS1 keyslots")?;
    io::write_bytes(meta, 0, &final_bytes, "LUKS1 header")?;
    io::flush(meta, "LUKS1 keyslots")?;
    Ok(l1)
}
