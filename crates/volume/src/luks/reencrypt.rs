//! LUKS2 reencryption (cryptsetup `reencrypt`), offline, compatible with cryptsetup's
//! on-disk state both ways: a run that either tool started, and that was interrupted or
//! killed at any point, resumes in the other.
//!
//! ```text
//!  init     unlock old key ── new key + KDF (before any write)
//!           ─► new keyslot material, flush ─► header #1: new keyslot + new digest (unbound)
//!           ─► header #2: backup-previous/backup-final segments, reencrypt keyslot (largest
//!              free gap of the keyslots area), verification digest, online-reencrypt-v2
//!  run      unlock both keys with one passphrase ─► check the verification digest
//!           ─► if a segment is "in-reencryption": recover that hotzone (checksum/journal)
//!           per hotzone [off, off+len):
//!             read old ciphertext
//!             checksum: hash of each block ─► area; journal: the ciphertext ─► area
//!             header: hotzone segment flagged in-reencryption (commit point; not for none)
//!             decrypt old, encrypt new, write, flush
//!             header: new segment grown, old segment shrunk (not for none)
//!           none: the header is written once, when the run stops
//!  finish   old keyslots wiped and dropped ─► header: backup segments, requirement,
//!           reencrypt keyslot and unused digests dropped
//! ```
//!
//! Recovery (cryptsetup `reencrypt_recover_segment`): with `checksum`, a block whose content
//! still hashes to the stored checksum is old and is rewritten; any other block was already
//! written new. With `journal`, the whole hotzone is rewritten from the old ciphertext in the
//! area. Either is idempotent, so a crash during recovery is recovered again.
//!
//! Done here: mode `reencrypt` (key and/or cipher change), direction forward, resilience
//! `checksum`, `journal` and `none`. Refused with a clear error: `encrypt`, `decrypt`,
//! backward runs and data shift (a run cryptsetup started in those modes is not resumed).

use std::collections::BTreeMap;

use blockdev::BlockDevice;
use formats::luks2::reencrypt::{
    self as re, backup_of, crypt_segment, Direction, ReencryptKeyslot, ReencryptMode, ReencryptState,
    Resilience,
};
use formats::luks2::{Digest, DigestPbkdf2, Luks2Metadata, SegmentSize};
use sector_crypto::kdf::{self, HashAlg, Passphrase};
use sector_crypto::secure::SecretBuf;
use sector_crypto::{CipherSpec, SectorCipher, SectorParams, VolumeKey};
use serde_json::Map;

use super::keyslot::digest_eq;
use super::{io, luks2, parse_hash, KdfLimits, Luks, Luks2State, LuksError, LuksHeader, PbkdfParams};

/// What `reencrypt` (init) is asked to do, with cryptsetup's option names.
#[derive(Debug, Clone)]
pub struct ReencryptParams {
    /// `--cipher` (default: keep the current one).
    pub cipher: Option<String>,
    /// `--key-size` in bytes (default: the current key size when the cipher is kept, else
    /// 64 for XTS and 32 otherwise).
    pub key_bytes: Option<usize>,
    /// `--sector-size` (default: keep).
    pub sector_size: Option<u32>,
    /// `--resilience`: `checksum` (default), `journal` or `none`.
    pub resilience: String,
    /// `--resilience-hash` (default sha256).
    pub resilience_hash: String,
    /// `--key-slot`: the keyslot whose passphrase is given (default: any that opens).
    pub key_slot: Option<u32>,
    /// KDF of the new keyslot.
    pub pbkdf: PbkdfParams,
    /// KDF cost bounds of the unlock.
    pub kdf_limits: KdfLimits,
}

impl Default for ReencryptParams {
    fn default() -> Self {
        Self {
            cipher: None,
            key_bytes: None,
            sector_size: None,
            resilience: "checksum".into(),
            resilience_hash: "sha256".into(),
            key_slot: None,
            pbkdf: PbkdfParams::default(),
            kdf_limits: KdfLimits::default(),
        }
    }
}

/// How a run ended.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum RunEnd {
    /// All data rewritten; the header is back to a plain one-segment LUKS2 header.
    Finished,
    /// Stopped by the progress callback; resume later.
    Interrupted,
}

fn v2(luks: &mut Luks) -> Result<&mut Luks2State, LuksError> {
    match &mut luks.header {
        LuksHeader::V2(s) => Ok(s),
        LuksHeader::V1(_) => Err(LuksError::Params(
            "Reencryption is supported only for LUKS2 in this version of sealdisk.".into(),
        )),
    }
}

fn meta_err(e: re::ReencryptMetaError) -> LuksError {
    LuksError::Unsupported(format!("LUKS2 reencryption metadata: {e}"))
}

/// The reencryption in progress on `luks`, if any.
pub fn status(luks: &Luks) -> Result<Option<ReencryptState>, LuksError> {
    match &luks.header {
        LuksHeader::V1(_) => Ok(None),
        LuksHeader::V2(s) => ReencryptState::from_metadata(&s.header.metadata).map_err(meta_err),
    }
}

fn first_free_keyslot(m: &Luks2Metadata) -> Result<u32, LuksError> {
    (0..super::LUKS2_KEYSLOTS).find(|k| !m.keyslots.contains_key(k)).ok_or(LuksError::NoFreeKeyslot)
}

fn first_free_digest(m: &Luks2Metadata) -> u32 {
    (0..).find(|d| !m.digests.contains_key(d)).unwrap_or(0)
}

/// cryptsetup `LUKS2_find_area_max_gap`: the largest free range of the keyslots area.
fn max_gap(m: &Luks2Metadata) -> Option<(u64, u64)> {
    let start = 2 * m.metadata_size();
    let end = start + m.config.keyslots_size;
    let mut used: Vec<(u64, u64)> =
        m.keyslots.values().map(|k| (k.area.offset, k.area.offset.saturating_add(k.area.size))).collect();
    used.sort_unstable();
    let mut best: Option<(u64, u64)> = None;
    let mut pos = start;
    for (o, e) in used.into_iter().chain(std::iter::once((end, end))) {
        if o > pos && best.is_none_or(|(_, l)| o - pos > l) {
            best = Some((pos, o - pos));
        }
        pos = pos.max(e);
    }
    best
}

/// A pbkdf2 digest of `data` (cryptsetup `PBKDF2_digest_store`: 32-byte salt, the hash's
/// full output).
fn make_digest(data: &[u8], hash: HashAlg, iterations: u32) -> Result<DigestPbkdf2, LuksError> {
    let mut salt = vec![0u8; 32];
    kdf::random_bytes(&mut salt).map_err(LuksError::Kdf)?;
    let mut digest = vec![0u8; hash.output_len()];
    kdf::pbkdf2(hash, data, &salt, iterations, &mut digest).map_err(LuksError::Kdf)?;
    Ok(DigestPbkdf2 { hash: hash.name().into(), iterations, salt, digest })
}

fn check_pbkdf2(p: &DigestPbkdf2, data: &[u8]) -> Result<bool, LuksError> {
    if p.digest.is_empty() || p.digest.len() > 64 {
        return Ok(false);
    }
    let mut out = zeroize::Zeroizing::new(vec![0u8; p.digest.len()]);
    kdf::pbkdf2(parse_hash(&p.hash)?, data, &p.salt, p.iterations, &mut out).map_err(LuksError::Kdf)?;
    Ok(digest_eq(&out, &p.digest))
}

fn cipher(spec: &str, vk: &VolumeKey, sector_size: u32) -> Result<SectorCipher, LuksError> {
    let err = |source| LuksError::Cipher { spec: spec.to_owned(), source };
    let s: CipherSpec = spec.parse().map_err(err)?;
    SectorCipher::new(&s, vk, SectorParams { sector_size, iv_offset: 0, iv_large_sectors: false })
        .map_err(err)
}

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
        return Err(LuksError::Params("LUKS2 reencryption already initialized. Aborting operation.".into()));
    }
    luks.check_supported()?;
    if luks.aead()?.is_some() {
        return Err(LuksError::Unsupported(
            "reencryption of an authenticated (integrity) volume is not supported".into(),
        ));
    }
    let resilience_name = p.resilience.as_str();
    if !matches!(resilience_name, "checksum" | "journal" | "none") {
        return Err(LuksError::Params(format!("Unsupported resilience mode {resilience_name}")));
    }
    let rhash = parse_hash(&p.resilience_hash)
        .map_err(|_| LuksError::Params(format!("Hash algorithm {} is not available.", p.resilience_hash)))?;
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
            return Err(LuksError::Params(format!(
                "The volume has {} keyslots ({}): reencryption keeps only one passphrase and removes the other \
                 keyslots at the end. Name the one to keep with --key-slot.",
                bound.len(),
                bound.iter().map(u32::to_string).collect::<Vec<_>>().join(", ")
            )));
        }
    }
    let (old_slot, vk_old) = luks.unlock_with(meta, passphrase, p.key_slot, &p.kdf_limits)?;
    log::info!("reencrypt: keyslot {old_slot} opened the current volume key");
    let seg = luks.segment()?;
    let new_cipher = p.cipher.clone().unwrap_or_else(|| seg.cipher.clone());
    let key_bytes = match (p.key_bytes, &p.cipher) {
        (Some(k), _) => k,
        (None, None) => vk_old.len(),
        (None, Some(c)) => super::default_key_bits(c) / 8,
    };
    let new_ss = p.sector_size.unwrap_or(seg.sector_size);
    if ![512, 1024, 2048, 4096].contains(&new_ss) {
        return Err(LuksError::Params("Unsupported encryption sector size.".into()));
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
        return Err(LuksError::Params("Device is too small.".into()));
    }
    if !device_size.is_multiple_of(check_ss) {
        return Err(LuksError::Params(format!(
            "Data device is not aligned to encryption sector size ({check_ss} bytes)."
        )));
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
    let digest_old =
        m.segment_digest(0).ok_or_else(|| LuksError::Unsupported("data segment has no digest".into()))?;
    let digest_new = m.keyslot_digest(new_slot).unwrap_or(0);
    let seg0 = m.segments[&0].clone();
    let first = m.segments.keys().max().map_or(0, |k| k + 1);
    m.segments.insert(first, backup_of(&seg0, re::FLAG_BACKUP_PREVIOUS));
    let mut fin = crypt_segment(data_offset, 0, None, &new_cipher, new_ss, false);
    fin.flags = Some(vec![re::FLAG_BACKUP_FINAL.to_owned()]);
    m.segments.insert(first + 1, fin);
    for (d, sg) in [(digest_old, first), (digest_new, first + 1)] {
        if let Some(d) = m.digests.get_mut(&d) {
            d.segments.push(sg);
        }
    }
    let alignment = check_ss.max(512) as u32;
    let resilience = match resilience_name {
        "checksum" => Resilience::Checksum { hash: rhash.name().into(), block_size: alignment },
        "journal" => Resilience::Journal,
        _ => Resilience::None,
    };
    let rslot = first_free_keyslot(m)?;
    let (area_offset, area_size) = max_gap(m).ok_or(LuksError::NoKeyslotSpace { need: 4096 })?;
    let rks = ReencryptKeyslot {
        id: rslot,
        mode: ReencryptMode::Reencrypt,
        direction: Direction::Forward,
        resilience,
        area_offset,
        area_size,
    };
    m.keyslots.insert(rslot, rks.to_keyslot());
    re::set_requirement(m, Some(2));
    let st =
        ReencryptState::from_metadata(m).map_err(meta_err)?.ok_or(LuksError::Params("internal".into()))?;
    let vdata =
        st.verification_data(m, 2, Some(vk_old.as_bytes()), Some(vk_new.as_bytes())).map_err(meta_err)?;
    let iterations = p.pbkdf.digest_iterations(vdata.len());
    let vdigest = make_digest(&vdata, p.pbkdf.hash, iterations)?;
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
    luks2::write_header(&mut next, meta)?;
    *s = next;
    Ok(new_slot)
}

/// Unlocks the key of `digest` with `pass` from any `luks2` keyslot bound to it.
fn unlock_digest(
    s: &Luks2State,
    meta: &dyn BlockDevice,
    pass: &[u8],
    digest: u32,
    limits: &KdfLimits,
) -> Result<VolumeKey, LuksError> {
    let h = &s.header;
    let slots: Vec<u32> = h
        .metadata
        .digests
        .get(&digest)
        .map(|d| {
            d.keyslots
                .iter()
                .copied()
                .filter(|k| h.metadata.keyslots.get(k).is_some_and(|ks| ks.is_luks2()))
                .collect()
        })
        .unwrap_or_default();
    for &k in &slots {
        luks2::check_slot_costs(h, k, limits)?;
    }
    for k in slots {
        if let Some(vk) = luks2::try_slot(h, meta, k, pass)? {
            log::info!("reencrypt: keyslot {k} opened the key of digest {digest}");
            return Ok(vk);
        }
    }
    Err(LuksError::WrongPassphrase)
}

/// Options of a run.
#[derive(Debug, Clone, Default)]
pub struct RunOptions {
    /// `--hotzone-size` in bytes (default: what the resilience area allows, at most 64 MiB).
    pub hotzone_size: Option<u64>,
    /// KDF cost bounds of the unlock.
    pub kdf_limits: KdfLimits,
}

/// Both volume keys of a reencryption in progress, checked against its verification
/// digest (cryptsetup unlocks "all segments" before a run or an activation).
pub struct ReencryptKeys {
    /// The key of the old segment (backup-previous).
    pub old: VolumeKey,
    /// The key of the new segment (backup-final).
    pub new: VolumeKey,
}

impl std::fmt::Debug for ReencryptKeys {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("ReencryptKeys").finish_non_exhaustive()
    }
}

/// Refuses a reencryption this implementation cannot run or activate.
fn check_mode(st: &ReencryptState) -> Result<(), LuksError> {
    if st.keyslot.mode != ReencryptMode::Reencrypt
        || st.keyslot.direction != Direction::Forward
        || st.moved.is_some()
        || st.keyslot.resilience.shift() != 0
    {
        return Err(LuksError::Unsupported(format!(
            "resuming LUKS2 reencryption mode {} direction {} resilience {} is not supported yet",
            st.keyslot.mode.as_str(),
            st.keyslot.direction.as_str(),
            st.keyslot.resilience.type_name()
        )));
    }
    Ok(())
}

/// Refuses what cannot be activated mid-reencryption: unknown mandatory requirements, a
/// reencryption mode not handled here, backup segments that are not plain crypt segments.
pub fn check_openable(luks: &Luks) -> Result<ReencryptState, LuksError> {
    let LuksHeader::V2(s) = &luks.header else {
        return Err(LuksError::Params("Device reencryption not in progress.".into()));
    };
    let m = &s.header.metadata;
    let unknown = m.unknown_requirements();
    if !unknown.is_empty() {
        return Err(LuksError::Unsupported(format!(
            "Unmet LUKS2 requirements detected: {} (this version of sealdisk does not know them)",
            unknown.join(", ")
        )));
    }
    let st = status(luks)?.ok_or_else(|| LuksError::Params("Device reencryption not in progress.".into()))?;
    check_mode(&st)?;
    for id in [st.previous, st.final_] {
        match m.segments.get(&id).and_then(|sg| sg.crypt.as_ref()) {
            Some(c) if c.integrity.is_none() => {}
            _ => {
                return Err(LuksError::Unsupported(format!(
                    "LUKS2 reencryption segment {id} is not a plain crypt segment"
                )))
            }
        }
    }
    Ok(st)
}

/// Unlocks both keys of the reencryption in progress on `luks` with `passphrase` and checks
/// them against the verification digest, which binds the metadata to them.
pub fn unlock_keys(
    meta: &dyn BlockDevice,
    luks: &Luks,
    passphrase: &Passphrase,
    limits: &KdfLimits,
) -> Result<ReencryptKeys, LuksError> {
    let Some(st) = status(luks)? else {
        return Err(LuksError::Params("Device reencryption not in progress.".into()));
    };
    check_mode(&st)?;
    let LuksHeader::V2(s) = &luks.header else {
        return Err(LuksError::Params("Device reencryption not in progress.".into()));
    };
    let pass = passphrase.as_bytes();
    let (Some(d_old), Some(d_new)) = (st.digest_old, st.digest_new) else {
        return Err(meta_err(re::ReencryptMetaError::Layout("reencryption without both digests")));
    };
    let vk_new = unlock_digest(s, meta, pass, d_new, limits)?;
    let vk_old = if d_old == d_new { vk_new.clone() } else { unlock_digest(s, meta, pass, d_old, limits)? };
    let m = &s.header.metadata;
    let vdata = st
        .verification_data(m, st.version, Some(vk_old.as_bytes()), Some(vk_new.as_bytes()))
        .map_err(meta_err)?;
    let ok = match st.digest_verify.and_then(|d| m.digests.get(&d)).and_then(|d| d.pbkdf2.as_ref()) {
        Some(p) => check_pbkdf2(p, &vdata)?,
        None => false,
    };
    if !ok {
        return Err(LuksError::Params("Reencryption metadata is invalid.".into()));
    }
    Ok(ReencryptKeys { old: vk_old, new: vk_new })
}

/// Runs (or resumes) the reencryption in progress on `luks` (metadata on `meta`, data on
/// `data`). `progress(done, total)` is called after every hotzone; returning `false` stops
/// the run cleanly (resumable). Crash recovery happens first when needed.
pub fn run(
    meta: &dyn BlockDevice,
    data: &dyn BlockDevice,
    luks: &mut Luks,
    passphrase: &Passphrase,
    opts: &RunOptions,
    progress: &mut dyn FnMut(u64, u64) -> bool,
) -> Result<RunEnd, LuksError> {
    let keys = unlock_keys(meta, luks, passphrase, &opts.kdf_limits)?;
    run_unlocked(meta, data, luks, &keys, opts, None, progress)
}

/// The parameters of a run, from the metadata and the data device.
struct Plan {
    st: ReencryptState,
    d_old: u32,
    d_new: u32,
    old: SectorCipher,
    new: SectorCipher,
    old_spec: String,
    new_spec: String,
    old_ss: u32,
    new_ss: u32,
    data_offset: u64,
    device_size: u64,
    fixed: bool,
    alignment: u64,
    length: u64,
    hash: Option<HashAlg>,
    /// Where the next hotzone starts (relative to the data offset), before any recovery.
    offset: u64,
}

fn plan(
    data: &dyn BlockDevice,
    luks: &Luks,
    keys: &ReencryptKeys,
    hotzone_size: Option<u64>,
) -> Result<Plan, LuksError> {
    let Some(st) = status(luks)? else {
        return Err(LuksError::Params("Device reencryption not in progress.".into()));
    };
    check_mode(&st)?;
    let LuksHeader::V2(s) = &luks.header else {
        return Err(LuksError::Params("Device reencryption not in progress.".into()));
    };
    let (Some(d_old), Some(d_new)) = (st.digest_old, st.digest_new) else {
        return Err(meta_err(re::ReencryptMetaError::Layout("reencryption without both digests")));
    };
    let m = &s.header.metadata;
    let prev = m.segments[&st.previous].clone();
    let fin = m.segments[&st.final_].clone();
    let (Some(pc), Some(fc)) = (prev.crypt.clone(), fin.crypt.clone()) else {
        return Err(meta_err(re::ReencryptMetaError::Layout("backup segments are not crypt segments")));
    };
    let old = cipher(&pc.encryption, &keys.old, pc.sector_size)?;
    let new = cipher(&fc.encryption, &keys.new, fc.sector_size)?;
    let data_offset = fin.offset;
    let (device_size, fixed) = match prev.size {
        SegmentSize::Bytes(b) => (b, true),
        SegmentSize::Dynamic => (data.geometry().size.saturating_sub(data_offset), false),
    };
    let alignment = match &st.keyslot.resilience {
        Resilience::Checksum { block_size, .. } => u64::from(*block_size),
        _ => u64::from(pc.sector_size.max(fc.sector_size).max(data.geometry().logical_block)),
    };
    if !device_size.is_multiple_of(alignment) {
        return Err(LuksError::Params(format!(
            "Device size must be multiple of calculated zone alignment ({alignment} bytes)."
        )));
    }
    if let Some(h) = hotzone_size {
        if h == 0 || !h.is_multiple_of(alignment) {
            return Err(LuksError::Params(format!(
                "Hotzone size must be multiple of calculated zone alignment ({alignment} bytes)."
            )));
        }
    }
    let rk = &st.keyslot;
    let hash = match &rk.resilience {
        Resilience::Checksum { hash, .. } => Some(parse_hash(hash)?),
        _ => None,
    };
    let mut length = match (&rk.resilience, hash) {
        (Resilience::Checksum { block_size, .. }, Some(h)) => {
            rk.area_size / h.output_len() as u64 * u64::from(*block_size)
        }
        (Resilience::Journal, _) => rk.area_size,
        _ => re::DEFAULT_NONE_HOTZONE_LENGTH,
    };
    length = length.min(re::MAX_HOTZONE_LENGTH).min(64 << 20);
    if let Some(h) = hotzone_size {
        length = length.min(h);
    }
    length -= length % alignment;
    if length == 0 {
        return Err(LuksError::Params("Invalid reencryption length.".into()));
    }
    let mut offset = st.forward_offset(m).map_err(meta_err)?;
    // One regular segment bound to the new key only: every hotzone was written and the run
    // stopped before finishing (cryptsetup would start over here).
    if st.hot.is_none()
        && d_old != d_new
        && ReencryptState::regular_segments(m).len() == 1
        && m.segment_digest(0) == Some(d_new)
        && !m.digests.get(&d_old).is_some_and(|d| d.segments.contains(&0))
    {
        offset = device_size;
    }
    Ok(Plan {
        st,
        d_old,
        d_new,
        old,
        new,
        old_spec: pc.encryption,
        new_spec: fc.encryption,
        old_ss: pc.sector_size,
        new_ss: fc.sector_size,
        data_offset,
        device_size,
        fixed,
        alignment,
        length,
        hash,
        offset,
    })
}

fn io_err(what: &'static str) -> impl Fn(blockdev::BlockError) -> LuksError {
    move |source| LuksError::Io { what, source }
}

fn crypto_err(spec: &str) -> impl Fn(sector_crypto::CryptoError) -> LuksError + '_ {
    move |source| LuksError::Cipher { spec: spec.to_owned(), source }
}

/// Recovers the hotzone flagged `in-reencryption` (a run that stopped mid-hotzone) and
/// writes the header that moves past it. Returns the new offset.
fn recover(
    meta: &dyn BlockDevice,
    data: &dyn BlockDevice,
    s: &mut Luks2State,
    p: &mut Plan,
) -> Result<(), LuksError> {
    let Some(h) = p.st.hot else { return Ok(()) };
    let rk = p.st.keyslot.clone();
    let (data_offset, offset) = (p.data_offset, p.offset);
    let hs = s.header.metadata.segments[&h].clone();
    let len = hs.fixed_size().ok_or(meta_err(re::ReencryptMetaError::Layout("dynamic hotzone")))?;
    if !len.is_multiple_of(p.alignment) {
        return Err(meta_err(re::ReencryptMetaError::Layout("hotzone not aligned")));
    }
    log::warn!("reencrypt: recovering the hotzone at {offset} ({len} bytes) after an interrupted run");
    let mut buf = SecretBuf::zeroed(len as usize);
    data.read_at(data_offset + offset, &mut buf).map_err(io_err("hotzone"))?;
    match (&rk.resilience, p.hash) {
        (Resilience::Checksum { block_size, .. }, Some(hash)) => {
            let bs = *block_size as usize;
            let hl = hash.output_len();
            let count = buf.len() / bs;
            if (count * hl) as u64 > rk.area_size {
                return Err(meta_err(re::ReencryptMetaError::Layout(
                    "hotzone larger than the checksum area",
                )));
            }
            let sums = io::read_bytes(meta, rk.area_offset, count * hl, "reencryption checksums")?;
            let mut sum = vec![0u8; hl];
            for b in 0..count {
                let blk = &mut buf[b * bs..(b + 1) * bs];
                hash.digest_into(&[&*blk], &mut sum);
                if sum == sums[b * hl..(b + 1) * hl] {
                    let sector = (offset + (b * bs) as u64) / 512;
                    p.old.decrypt(sector, blk).map_err(crypto_err(&p.old_spec))?;
                    p.new.encrypt(sector, blk).map_err(crypto_err(&p.new_spec))?;
                    data.write_at(data_offset + offset + (b * bs) as u64, blk, blockdev::WriteFlags::empty())
                        .map_err(io_err("hotzone"))?;
                }
            }
        }
        (Resilience::Journal, _) => {
            if len > rk.area_size {
                return Err(meta_err(re::ReencryptMetaError::Layout("hotzone larger than the journal")));
            }
            let j = io::read_secret(meta, rk.area_offset, len as usize, "reencryption journal")?;
            buf.copy_from_slice(&j);
            p.old.decrypt(offset / 512, &mut buf).map_err(crypto_err(&p.old_spec))?;
            p.new.encrypt(offset / 512, &mut buf).map_err(crypto_err(&p.new_spec))?;
            data.write_at(data_offset + offset, &buf, blockdev::WriteFlags::empty())
                .map_err(io_err("hotzone"))?;
        }
        _ => {
            return Err(LuksError::Params(
                "Cannot recover the interrupted hotzone: resilience mode none keeps no copy.".into(),
            ))
        }
    }
    data.flush().map_err(io_err("data device"))?;
    p.offset += len;
    let mut next = s.clone();
    let layout = re::forward_layout(&p.st, &next.header.metadata, p.offset, None, p.device_size, p.fixed)
        .map_err(meta_err)?;
    re::assign_segments(&mut p.st, &mut next.header.metadata, layout).map_err(meta_err)?;
    luks2::write_header(&mut next, meta)?;
    *s = next;
    Ok(())
}

/// [`run`] with both keys already unlocked. With `online`, the run rewrites the data under
/// a served [`ReencryptingDevice`]: each hotzone's range is held against the device's
/// clients from the read of its old content until the header past it is written, and the
/// device's boundary moves with it.
pub fn run_unlocked(
    meta: &dyn BlockDevice,
    data: &dyn BlockDevice,
    luks: &mut Luks,
    keys: &ReencryptKeys,
    opts: &RunOptions,
    online: Option<&super::reencrypting::ReencryptingDevice>,
    progress: &mut dyn FnMut(u64, u64) -> bool,
) -> Result<RunEnd, LuksError> {
    let mut p = plan(data, luks, keys, opts.hotzone_size)?;
    let s = v2(luks)?;
    if p.st.hot.is_some() {
        let _g = online.map(|d| d.hold(p.offset, p.device_size - p.offset));
        recover(meta, data, s, &mut p)?;
        if let Some(d) = online {
            d.set_boundary(p.offset);
        }
    }
    let rk = p.st.keyslot.clone();
    let (data_offset, device_size, fixed, length) = (p.data_offset, p.device_size, p.fixed, p.length);
    let mut offset = p.offset;
    let mut st = p.st.clone();
    let none = rk.resilience == Resilience::None;
    let mut buf = SecretBuf::zeroed(length.min(device_size.max(p.alignment)) as usize);
    let mut stopped = false;
    if !progress(offset, device_size) {
        stopped = true;
    }
    while !stopped && offset < device_size {
        let len = length.min(device_size - offset);
        let guard = online.map(|d| d.hold(offset, len));
        let chunk = &mut buf[..len as usize];
        let mut next = s.clone();
        let layout = re::forward_layout(&st, &next.header.metadata, offset, Some(len), device_size, fixed)
            .map_err(meta_err)?;
        let mut st_next = st.clone();
        re::assign_segments(&mut st_next, &mut next.header.metadata, layout).map_err(meta_err)?;
        data.read_at(data_offset + offset, chunk).map_err(io_err("hotzone"))?;
        match (&rk.resilience, p.hash) {
            (Resilience::Checksum { block_size, .. }, Some(hash)) => {
                let bs = *block_size as usize;
                let hl = hash.output_len();
                let mut sums = vec![0u8; chunk.len() / bs * hl];
                for (b, blk) in chunk.chunks(bs).enumerate() {
                    hash.digest_into(&[blk], &mut sums[b * hl..(b + 1) * hl]);
                }
                io::write_bytes(meta, rk.area_offset, &sums, "reencryption checksums")?;
            }
            (Resilience::Journal, _) => io::write_bytes(meta, rk.area_offset, chunk, "reencryption journal")?,
            _ => {}
        }
        if !none {
            // The checksums (or journal) are durable before the header that points at
            // them; cryptsetup relies on the header write's flush alone.
            io::flush(meta, "reencryption area")?;
            luks2::write_header(&mut next, meta)?;
        }
        p.old.decrypt(offset / 512, chunk).map_err(crypto_err(&p.old_spec))?;
        p.new.encrypt(offset / 512, chunk).map_err(crypto_err(&p.new_spec))?;
        data.write_at(data_offset + offset, chunk, blockdev::WriteFlags::empty())
            .map_err(io_err("hotzone"))?;
        if !none {
            data.flush().map_err(io_err("data device"))?;
        }
        offset += len;
        let layout = re::forward_layout(&st_next, &next.header.metadata, offset, None, device_size, fixed)
            .map_err(meta_err)?;
        re::assign_segments(&mut st_next, &mut next.header.metadata, layout).map_err(meta_err)?;
        if !none {
            luks2::write_header(&mut next, meta)?;
        }
        *s = next;
        st = st_next;
        if let Some(d) = online {
            d.set_boundary(offset);
        }
        drop(guard);
        if !progress(offset, device_size) {
            stopped = true;
        }
    }
    if none {
        data.flush().map_err(io_err("data device"))?;
        luks2::write_header(s, meta)?;
    }
    if offset < device_size {
        return Ok(RunEnd::Interrupted);
    }
    if let Some(d) = online {
        // Every sector is new: the clients' I/O no longer needs the old key.
        d.set_boundary(device_size);
    }
    finish(s, meta, &st, p.d_old, p.d_new)?;
    Ok(RunEnd::Finished)
}

/// Where a volume mid-reencryption stands, for its activation.
#[derive(Debug, Clone)]
pub struct Activation {
    /// Bytes from the data offset that use the new segment.
    pub boundary: u64,
    /// Bytes of data (both segments).
    pub size: u64,
    /// The data offset in bytes.
    pub data_offset: u64,
    /// Old segment: cipher spec and sector size.
    pub old: (String, u32),
    /// New segment: cipher spec and sector size.
    pub new: (String, u32),
}

/// Prepares the activation of a volume whose reencryption is in progress (cryptsetup
/// `LUKS2_activate` of a device in reencryption): recovers a hotzone left in reencryption
/// by a crash (which writes: refused when `read_only`), and says where the new segment
/// ends.
pub fn prepare_activation(
    meta: &dyn BlockDevice,
    data: &dyn BlockDevice,
    luks: &mut Luks,
    keys: &ReencryptKeys,
    read_only: bool,
) -> Result<Activation, LuksError> {
    let mut p = plan(data, luks, keys, None)?;
    if p.st.hot.is_some() {
        if read_only {
            return Err(LuksError::Params(
                "The reencryption was interrupted mid-hotzone and needs recovery, which writes: open it \
                 read-write (or resume it with `sealdisk reencrypt`)."
                    .into(),
            ));
        }
        let s = v2(luks)?;
        recover(meta, data, s, &mut p)?;
    }
    Ok(Activation {
        boundary: p.offset,
        size: p.device_size,
        data_offset: p.data_offset,
        old: (p.old_spec, p.old_ss),
        new: (p.new_spec, p.new_ss),
    })
}

/// Finishing (cryptsetup `reencrypt_teardown_ok`): the old keyslots, the backup segments,
/// the requirement, the reencrypt keyslot and the digests left without keyslots and
/// segments go in one header write (the commit point); then the old keyslots' material and
/// the resilience area (old ciphertext) are wiped. cryptsetup wipes each old keyslot first,
/// with a header write each, which leaves a window where a crash makes the run impossible to
/// resume (the verification digest needs the old key); here a crash at worst leaves
/// unreferenced old key material, and the header is already final.
fn finish(
    s: &mut Luks2State,
    meta: &dyn BlockDevice,
    st: &ReencryptState,
    d_old: u32,
    d_new: u32,
) -> Result<(), LuksError> {
    let mut next = s.clone();
    let m = &mut next.header.metadata;
    let mut wipe = Vec::new();
    let limit = m.metadata_and_keyslots_size();
    let floor = 2 * m.metadata_size();
    let area = |m: &Luks2Metadata, k: u32, wipe: &mut Vec<(u64, u64)>| {
        if let Some(ks) = m.keyslots.get(&k) {
            let (o, l) = (ks.area.offset, ks.area.size);
            if o >= floor && o.saturating_add(l) <= limit {
                wipe.push((o, l));
            }
        }
    };
    if d_old != d_new {
        let old_slots: Vec<u32> = m.digests.get(&d_old).map(|d| d.keyslots.clone()).unwrap_or_default();
        for k in old_slots {
            area(m, k, &mut wipe);
            luks2::drop_keyslot(m, k);
        }
    }
    let regular: BTreeMap<u32, _> =
        m.segments.iter().filter(|(_, sg)| !sg.is_backup()).map(|(&i, sg)| (i, sg.clone())).collect();
    let backups: Vec<u32> = m.segments.keys().copied().filter(|i| !regular.contains_key(i)).collect();
    for d in m.digests.values_mut() {
        d.segments.retain(|x| !backups.contains(x));
    }
    m.segments = regular;
    re::set_requirement(m, None);
    area(m, st.keyslot.id, &mut wipe);
    luks2::drop_keyslot(m, st.keyslot.id);
    m.digests.retain(|_, d| !d.keyslots.is_empty() || !d.segments.is_empty());
    luks2::write_header(&mut next, meta)?;
    *s = next;
    for (o, l) in wipe {
        io::wipe(meta, o, l, true, "old keyslot and reencryption area")?;
    }
    io::flush(meta, "old keyslot and reencryption area")?;
    Ok(())
}
