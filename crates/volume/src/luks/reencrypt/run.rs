//! The run engine: the keys of a reencryption in progress unlocked and checked, the plan of
//! a run from the metadata, the hotzone loop (offline or under a served device), the
//! activation of a volume mid-reencryption, and the finish.

use std::collections::BTreeMap;

use blockdev::BlockDevice;
use formats::luks2::reencrypt::{self as re, Direction, ReencryptMode, ReencryptState, Resilience};
use formats::luks2::{Luks2Metadata, SegmentSize};
use sector_crypto::kdf::{HashAlg, Passphrase};
use sector_crypto::secure::SecretBuf;
use sector_crypto::{SectorCipher, VolumeKey};

use super::recover::recover;
use super::shift::{is_shift_decryption, is_shift_encryption, run_datashift, run_decrypt_shift};
use super::{
    block_sums, check_pbkdf2, cipher, crypto_err, in_pieces, io_err, max_gap, meta_err, status, v2, RunEnd,
};
use crate::luks::ReencryptError;
use crate::luks::{io, luks2, parse_hash, KdfLimits, Luks, Luks2State, LuksError, LuksHeader};

/// Unlocks the key of `digest` with `pass` from any `luks2` keyslot bound to it.
fn unlock_digest(
    s: &Luks2State,
    meta: &dyn BlockDevice,
    pass: &[u8],
    digest: u32,
    only: Option<u32>,
    limits: &KdfLimits,
) -> Result<(u32, VolumeKey), LuksError> {
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
                .filter(|k| only.is_none_or(|n| n == *k))
                .collect()
        })
        .unwrap_or_default();
    for &k in &slots {
        luks2::check_slot_costs(h, k, limits)?;
    }
    for k in slots {
        if let Some(vk) = luks2::try_slot(h, meta, k, pass)? {
            log::info!("reencrypt: keyslot {k} opened the key of digest {digest}");
            return Ok((k, vk));
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

/// The volume keys of a reencryption in progress, checked against its verification digest
/// (cryptsetup unlocks "all segments" before a run or an activation). A side that is
/// plaintext (the old one of an encryption, the new one of a decryption) has no key.
pub struct ReencryptKeys {
    /// The key of the old segment (backup-previous); `None` when it is linear, or in
    /// cryptsetup's teardown state (see [`unlock_keys`]).
    pub old: Option<VolumeKey>,
    /// The key of the new segment (backup-final); `None` when it is linear.
    pub new: Option<VolumeKey>,
    /// The keyslot that opened [`Self::volume_key`].
    pub keyslot: u32,
}

impl ReencryptKeys {
    /// The key of the volume as a whole: the new one, or the old one while decrypting.
    pub fn volume_key(&self) -> Option<&VolumeKey> {
        self.new.as_ref().or(self.old.as_ref())
    }
}

impl std::fmt::Debug for ReencryptKeys {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("ReencryptKeys").finish_non_exhaustive()
    }
}

/// Refuses a reencryption this implementation cannot run or activate (data shift), and
/// backup-segment digests that do not match the mode.
fn check_mode(st: &ReencryptState) -> Result<(), LuksError> {
    if (st.moved.is_some() || st.keyslot.resilience.shift() != 0)
        && !is_shift_encryption(st)
        && !is_shift_decryption(st)
        && !re::is_detached_shift_encryption(st)
    {
        return Err(LuksError::Unsupported(format!(
            "resuming LUKS2 reencryption mode {} direction {} resilience {} is not supported yet",
            st.keyslot.mode.as_str(),
            st.keyslot.direction.as_str(),
            st.keyslot.resilience.type_name()
        )));
    }
    let (d_old, d_new) = (st.digest_old, st.digest_new);
    let digests_ok = match st.keyslot.mode {
        ReencryptMode::Reencrypt => d_old.is_some() && d_new.is_some(),
        ReencryptMode::Encrypt => d_old.is_none() && d_new.is_some(),
        ReencryptMode::Decrypt => d_old.is_some() && d_new.is_none(),
    };
    if !digests_ok {
        return Err(meta_err(re::ReencryptMetaError::Layout("backup segment digests do not match the mode")));
    }
    Ok(())
}

/// `true` in cryptsetup's teardown state: its teardown wipes the old keyslots (a header
/// write each) before it drops the reencryption metadata; killed in between, every hotzone
/// is written and the old key is gone (cryptsetup itself cannot resume: "No usable token is
/// available"). No data is left to rewrite: the run only has to finish.
fn teardown_state(st: &ReencryptState, m: &Luks2Metadata) -> bool {
    st.keyslot.mode == ReencryptMode::Reencrypt
        && st.digest_old != st.digest_new
        && re::all_done(st, m)
        && st
            .digest_old
            .and_then(|d| m.digests.get(&d))
            .is_some_and(|d| !d.keyslots.iter().any(|k| m.keyslots.get(k).is_some_and(|ks| ks.is_luks2())))
}

/// Refuses what cannot be activated mid-reencryption: unknown mandatory requirements, a
/// reencryption mode not handled here, backup segments that are neither plain crypt
/// segments nor the linear (plaintext) side of an encryption or decryption.
pub fn check_openable(luks: &Luks) -> Result<ReencryptState, LuksError> {
    let LuksHeader::V2(s) = &luks.header else {
        return Err(LuksError::Reencrypt(ReencryptError::NotInProgress));
    };
    let m = &s.header.metadata;
    let unknown = m.unknown_requirements();
    if !unknown.is_empty() {
        return Err(LuksError::Unsupported(format!(
            "Unmet LUKS2 requirements detected: {} (this version of sealdisk does not know them)",
            unknown.join(", ")
        )));
    }
    let st = status(luks)?.ok_or_else(|| LuksError::Reencrypt(ReencryptError::NotInProgress))?;
    check_mode(&st)?;
    if is_shift_encryption(&st) {
        // Its segments are checked against the device by [`shift_activation`].
        return Ok(st);
    }
    if is_shift_decryption(&st) {
        // It unlocks (`--test-passphrase`); its activation is refused by
        // [`prepare_activation`].
        return Ok(st);
    }
    for (id, linear_ok) in [
        (st.previous, st.keyslot.mode == ReencryptMode::Encrypt),
        (st.final_, st.keyslot.mode == ReencryptMode::Decrypt),
    ] {
        match m.segments.get(&id) {
            Some(sg) if sg.type_name == "linear" && linear_ok => {}
            Some(sg)
                if sg.type_name == "crypt" && sg.crypt.as_ref().is_some_and(|c| c.integrity.is_none()) => {}
            _ => {
                return Err(LuksError::Unsupported(format!(
                    "LUKS2 reencryption segment {id} is not a plain crypt segment"
                )))
            }
        }
    }
    Ok(st)
}

/// The refusal of an activation mid data-shift decryption.
fn shift_decryption_not_openable() -> LuksError {
    LuksError::Unsupported(
        "activating a LUKS2 device in the middle of a decryption with data shift (--decrypt with its \
         header moved to a new file) is not supported: finish it with `sealdisk reencrypt --resume-only \
         --header FILE DEVICE` first"
            .into(),
    )
}

/// Unlocks the keys of the reencryption in progress on `luks` with `passphrase` and checks
/// them against the verification digest, which binds the metadata to them. In cryptsetup's
/// teardown state (every hotzone written, old keyslots wiped) only the new key is unlocked
/// (checked against its digest); such a run can only be finished ([`run_unlocked`]).
pub fn unlock_keys(
    meta: &dyn BlockDevice,
    luks: &Luks,
    passphrase: &Passphrase,
    limits: &KdfLimits,
) -> Result<ReencryptKeys, LuksError> {
    unlock_keys_with(meta, luks, passphrase, None, limits)
}

/// [`unlock_keys`] with `--key-slot`: with `Some(n)` only keyslot `n` is tried, as in
/// cryptsetup, so it must open every key the reencryption needs. A keyslot of only the
/// old (or only the new) key of a reencryption is refused once the passphrase has opened
/// it, with cryptsetup's (debug) words and its exit code 1; a wrong passphrase for it is
/// [`LuksError::WrongPassphrase`]; a keyslot that holds neither key (empty, the reencrypt
/// keyslot, an unbound one) is "No usable keyslot is available."
pub fn unlock_keys_with(
    meta: &dyn BlockDevice,
    luks: &Luks,
    passphrase: &Passphrase,
    only: Option<u32>,
    limits: &KdfLimits,
) -> Result<ReencryptKeys, LuksError> {
    let Some(st) = status(luks)? else {
        return Err(LuksError::Reencrypt(ReencryptError::NotInProgress));
    };
    check_mode(&st)?;
    let LuksHeader::V2(s) = &luks.header else {
        return Err(LuksError::Reencrypt(ReencryptError::NotInProgress));
    };
    let pass = passphrase.as_bytes();
    let (d_old, d_new) = (st.digest_old, st.digest_new);
    if let Some(n) = only {
        let m = &s.header.metadata;
        let d = m
            .keyslot_digest(n)
            .filter(|_| m.keyslots.get(&n).is_some_and(|ks| ks.is_luks2()))
            .filter(|d| Some(*d) == d_old || Some(*d) == d_new)
            .ok_or_else(|| LuksError::Reencrypt(ReencryptError::NoUsableKeyslot))?;
        let needed = [d_new, d_old.filter(|_| !teardown_state(&st, m))];
        if let Some(missing) = needed.into_iter().flatten().find(|x| *x != d) {
            luks2::check_slot_costs(&s.header, n, limits)?;
            return match luks2::try_slot(&s.header, meta, n, pass)? {
                None => Err(LuksError::WrongPassphrase),
                Some(_) => Err(LuksError::Reencrypt(ReencryptError::KeyslotOpensOneKey {
                    keyslot: n,
                    digest: missing,
                })),
            };
        }
    }
    let mut keyslot = None;
    let vk_new = match d_new {
        Some(d) => {
            let (k, vk) = unlock_digest(s, meta, pass, d, only, limits)?;
            keyslot = Some(k);
            Some(vk)
        }
        None => None,
    };
    let m = &s.header.metadata;
    if teardown_state(&st, m) {
        let keyslot = keyslot.ok_or(LuksError::WrongPassphrase)?;
        return Ok(ReencryptKeys { old: None, new: vk_new, keyslot });
    }
    let vk_old = match d_old {
        Some(_) if d_old == d_new => vk_new.clone(),
        Some(d) => {
            let (k, vk) = unlock_digest(s, meta, pass, d, only, limits)?;
            keyslot.get_or_insert(k);
            Some(vk)
        }
        None => None,
    };
    let keyslot = keyslot.ok_or(LuksError::WrongPassphrase)?;
    let vdata = st
        .verification_data(
            m,
            st.version,
            vk_old.as_ref().map(VolumeKey::as_bytes),
            vk_new.as_ref().map(VolumeKey::as_bytes),
        )
        .map_err(meta_err)?;
    let ok = match st.digest_verify.and_then(|d| m.digests.get(&d)).and_then(|d| d.pbkdf2.as_ref()) {
        Some(p) => check_pbkdf2(p, &vdata)?,
        None => false,
    };
    if !ok {
        return Err(LuksError::Reencrypt(ReencryptError::MetadataInvalid));
    }
    Ok(ReencryptKeys { old: vk_old, new: vk_new, keyslot })
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

/// One side of a reencryption: a cipher, or plaintext (a linear segment) when `None`.
pub(super) struct Side {
    cipher: Option<(SectorCipher, String)>,
    sector_size: u32,
}

impl Side {
    fn spec(&self) -> Option<(String, u32)> {
        self.cipher.as_ref().map(|(_, s)| (s.clone(), self.sector_size))
    }
}

/// The parameters of a run, from the metadata and the data device.
pub(super) struct Plan {
    pub(super) st: ReencryptState,
    pub(super) d_old: Option<u32>,
    pub(super) d_new: Option<u32>,
    pub(super) old: Side,
    pub(super) new: Side,
    pub(super) backward: bool,
    pub(super) data_offset: u64,
    pub(super) device_size: u64,
    pub(super) fixed: bool,
    pub(super) alignment: u64,
    pub(super) length: u64,
    pub(super) hash: Option<HashAlg>,
    /// The boundary before any recovery (relative to the data offset): forward, the end of
    /// the new part (everything below is new); backward, the end of the old part
    /// (everything above is new).
    pub(super) pos: u64,
    /// An encryption with data shift and a detached header: its hotzones follow
    /// cryptsetup's steps ([`re::detached_shift_hotzone`]) and are protected by
    /// sealdisk's checksums in this free range of the keyslots area.
    pub(super) sums: Option<SumsArea>,
}

/// Where sealdisk keeps the [`re::HotzoneRecord`] of the hotzone in flight (the start of
/// the largest free range of the keyslots area, as it is during the run).
#[derive(Debug, Clone)]
pub(super) struct SumsArea {
    pub(super) offset: u64,
    pub(super) block: u64,
    pub(super) uuid: String,
}

impl SumsArea {
    pub(super) fn record(&self, start: u64, len: u64) -> re::HotzoneRecord {
        re::HotzoneRecord { start, len, block_size: self.block as u32, uuid: self.uuid.clone() }
    }

    /// Writes the record and checksums of `chunk` (the old content of the hotzone at
    /// `start`) to `meta`, unflushed.
    fn write(&self, meta: &dyn BlockDevice, start: u64, chunk: &[u8]) -> Result<(), LuksError> {
        let hash = HashAlg::Sha256;
        let hl = hash.output_len();
        let mut sums = vec![0u8; chunk.len().div_ceil(self.block as usize) * hl];
        block_sums(hash, chunk, self.block as usize, &mut sums);
        let rec = self
            .record(start, chunk.len() as u64)
            .encode(&sums)
            .ok_or(LuksError::Internal("a hotzone record that does not encode"))?;
        io::write_bytes(meta, self.offset, &rec, "hotzone checksums")?;
        io::write_bytes(meta, self.offset + re::HOTZONE_RECORD_SIZE, &sums, "hotzone checksums")
    }
}

impl Plan {
    /// Old content to new content, in place (`sector` in 512-byte units from the data
    /// offset), cut across the cores in pieces of whole 4096-byte sectors (the largest
    /// encryption sector, so each piece starts on a sector of both ciphers).
    pub(super) fn rewrite(&self, sector: u64, buf: &mut [u8]) -> Result<(), LuksError> {
        in_pieces(buf, 4096, |at, piece| {
            let sector = sector + (at / 512) as u64;
            if let Some((c, spec)) = &self.old.cipher {
                c.decrypt(sector, piece).map_err(crypto_err(spec))?;
            }
            if let Some((c, spec)) = &self.new.cipher {
                c.encrypt(sector, piece).map_err(crypto_err(spec))?;
            }
            Ok(())
        })
    }

    /// The regular segments with the boundary at `pos` and, with `hot`, the hotzone of
    /// that length next to it (above when forward, below when backward).
    pub(super) fn layout(
        &self,
        st: &ReencryptState,
        m: &Luks2Metadata,
        pos: u64,
        hot: Option<u64>,
    ) -> Result<Vec<(re::Part, formats::luks2::Segment)>, LuksError> {
        if self.backward {
            re::backward_layout(st, m, pos, hot, self.device_size, self.fixed)
        } else {
            re::forward_layout(st, m, pos, hot, self.device_size, self.fixed)
        }
        .map_err(meta_err)
    }

    /// Bytes already in the new segment with the boundary at `pos`.
    fn done(&self, pos: u64) -> u64 {
        if self.backward {
            self.device_size - pos
        } else {
            pos
        }
    }
}

fn plan(
    data: &dyn BlockDevice,
    luks: &Luks,
    keys: &ReencryptKeys,
    hotzone_size: Option<u64>,
) -> Result<Plan, LuksError> {
    let Some(st) = status(luks)? else {
        return Err(LuksError::Reencrypt(ReencryptError::NotInProgress));
    };
    check_mode(&st)?;
    if is_shift_encryption(&st) {
        return Err(LuksError::Unsupported(
            "activating a LUKS2 device in the middle of an encryption with data shift (--reduce-device-size) \
             is not supported: finish it with `sealdisk reencrypt` first"
                .into(),
        ));
    }
    if is_shift_decryption(&st) {
        return Err(shift_decryption_not_openable());
    }
    let LuksHeader::V2(s) = &luks.header else {
        return Err(LuksError::Reencrypt(ReencryptError::NotInProgress));
    };
    let (d_old, d_new) = (st.digest_old, st.digest_new);
    let backward = st.keyslot.direction == Direction::Backward;
    let m = &s.header.metadata;
    let prev = m.segments[&st.previous].clone();
    let fin = m.segments[&st.final_].clone();
    let side = |seg: &formats::luks2::Segment, vk: &Option<VolumeKey>, what: &'static str| match (
        seg.type_name.as_str(),
        &seg.crypt,
        vk,
    ) {
        ("crypt", Some(c), Some(vk)) => Ok(Side {
            cipher: Some((cipher(&c.encryption, vk, c.sector_size)?, c.encryption.clone())),
            sector_size: c.sector_size,
        }),
        ("linear", _, None) => Ok(Side { cipher: None, sector_size: 512 }),
        _ => Err(meta_err(re::ReencryptMetaError::Layout(what))),
    };
    let old = side(&prev, &keys.old, "backup-previous does not match the mode or its key")?;
    let new = side(&fin, &keys.new, "backup-final does not match the mode or its key")?;
    let data_offset = fin.offset;
    let (device_size, fixed) = match prev.size {
        SegmentSize::Bytes(b) => (b, true),
        SegmentSize::Dynamic => (data.geometry().size.saturating_sub(data_offset), false),
    };
    // cryptsetup runs a detached data-shift encryption with a dynamic new segment.
    let fixed = fixed && !re::is_detached_shift_encryption(&st);
    let alignment = match &st.keyslot.resilience {
        Resilience::Checksum { block_size, .. } => u64::from(*block_size),
        _ => u64::from(old.sector_size.max(new.sector_size).max(data.geometry().logical_block)),
    };
    if !device_size.is_multiple_of(alignment) {
        return Err(LuksError::Reencrypt(ReencryptError::DeviceSizeAlignment(alignment)));
    }
    if let Some(h) = hotzone_size {
        if h == 0 || !h.is_multiple_of(alignment) {
            return Err(LuksError::Reencrypt(ReencryptError::HotzoneAlignment(alignment)));
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
        return Err(LuksError::Reencrypt(ReencryptError::InvalidLength));
    }
    let mut sums = None;
    if re::is_detached_shift_encryption(&st) {
        // cryptsetup's hotzones are the data shift long (--hotzone-size is ignored); here
        // at most 64 MiB, and no longer than the free keyslots area can hold checksums for.
        let (offset, gap) = max_gap(m).unwrap_or((0, 0));
        let cap = gap.saturating_sub(re::HOTZONE_RECORD_SIZE) / re::HOTZONE_SUM_LEN * alignment;
        length = rk.resilience.shift().min(cap).min(64 << 20);
        length -= length % alignment;
        if length == 0 {
            return Err(LuksError::Reencrypt(ReencryptError::NoRoomForChecksums));
        }
        sums = Some(SumsArea { offset, block: alignment, uuid: luks.uuid().to_owned() });
    }
    let pos = if re::all_done(&st, m) {
        // Every hotzone was written and the run stopped before finishing (cryptsetup would
        // start over here, rewriting new data as if it were old).
        if backward {
            0
        } else {
            device_size
        }
    } else if backward {
        re::backward_boundary(&st, m, device_size).map_err(meta_err)?
    } else {
        st.forward_offset(m).map_err(meta_err)?
    };
    Ok(Plan {
        st,
        d_old,
        d_new,
        old,
        new,
        backward,
        data_offset,
        device_size,
        fixed,
        alignment,
        length,
        hash,
        pos,
        sums,
    })
}

/// [`run`] with the keys already unlocked. With `online`, the run rewrites the data under
/// a served [`ReencryptingDevice`](crate::luks::reencrypting::ReencryptingDevice): each hotzone's
/// range is held against the device's clients from the read of its old content until the
/// header past it is written, and the device's boundary moves with it.
pub fn run_unlocked(
    meta: &dyn BlockDevice,
    data: &dyn BlockDevice,
    luks: &mut Luks,
    keys: &ReencryptKeys,
    opts: &RunOptions,
    online: Option<&crate::luks::reencrypting::ReencryptingDevice>,
    progress: &mut dyn FnMut(u64, u64) -> bool,
) -> Result<RunEnd, LuksError> {
    {
        let st = status(luks)?.ok_or_else(|| LuksError::Reencrypt(ReencryptError::NotInProgress))?;
        let s = v2(luks)?;
        if teardown_state(&st, &s.header.metadata) {
            // The new key was checked against its digest by the unlock; it is what the
            // finished header keeps. No data is rewritten.
            log::warn!("reencrypt: every hotzone was written and the old keyslots are gone; finishing");
            finish(s, meta, &st, st.digest_old, st.digest_new)?;
            return Ok(RunEnd::Finished);
        }
        if is_shift_encryption(&st) {
            // Its header is on the data device, and the run rewrites it there.
            if !std::ptr::addr_eq(meta as *const dyn BlockDevice, data as *const dyn BlockDevice) {
                return Err(LuksError::Unsupported(
                    "an encryption with data shift runs with its header on the data device, not a \
                     detached copy"
                        .into(),
                ));
            }
            return run_datashift(data, luks, keys, online, progress);
        }
        if is_shift_decryption(&st) {
            return run_decrypt_shift(meta, data, luks, keys, online, progress, false);
        }
    }
    let mut p = plan(data, luks, keys, opts.hotzone_size)?;
    let s = v2(luks)?;
    let device_size = p.device_size;
    if p.st.hot.is_some() {
        let _g = online.map(|d| d.hold(0, device_size));
        recover(meta, data, s, &mut p)?;
        if let Some(d) = online {
            d.set_boundary(p.pos);
        }
    }
    let rk = p.st.keyslot.clone();
    let (data_offset, length, backward) = (p.data_offset, p.length, p.backward);
    let mut pos = p.pos;
    let mut st = p.st.clone();
    let none = rk.resilience == Resilience::None;
    let mut buf = SecretBuf::zeroed(length.min(device_size.max(p.alignment)) as usize);
    let mut stopped = false;
    if !progress(p.done(pos), device_size) {
        stopped = true;
    }
    let left = |pos: u64| if backward { pos } else { device_size - pos };
    while !stopped && left(pos) > 0 {
        let (offset, len) = match &p.sums {
            Some(_) => re::detached_shift_hotzone(pos, device_size, length)
                .ok_or(LuksError::Internal("no hotzone left before the end of a detached data shift"))?,
            None => {
                let len = length.min(left(pos));
                (if backward { pos - len } else { pos }, len)
            }
        };
        let guard = online.map(|d| d.hold(offset, len));
        let chunk = &mut buf[..len as usize];
        let mut next = s.clone();
        let layout = p.layout(&st, &next.header.metadata, pos, Some(len))?;
        let mut st_next = st.clone();
        re::assign_segments(&mut st_next, &mut next.header.metadata, layout).map_err(meta_err)?;
        data.read_at(data_offset + offset, chunk).map_err(io_err("hotzone"))?;
        match (&rk.resilience, p.hash) {
            (Resilience::Checksum { block_size, .. }, Some(hash)) => {
                let bs = *block_size as usize;
                let mut sums = vec![0u8; chunk.len() / bs * hash.output_len()];
                block_sums(hash, chunk, bs, &mut sums);
                io::write_bytes(meta, rk.area_offset, &sums, "reencryption checksums")?;
            }
            (Resilience::Journal, _) => io::write_bytes(meta, rk.area_offset, chunk, "reencryption journal")?,
            (Resilience::Datashift { .. }, _) => {
                if let Some(a) = &p.sums {
                    a.write(meta, offset, chunk)?;
                }
            }
            _ => {}
        }
        if !none {
            // The checksums (or journal) are durable before the header that points at
            // them; cryptsetup relies on the header write's flush alone.
            io::flush(meta, "reencryption area")?;
            luks2::write_header(&mut next, meta)?;
        }
        p.rewrite(offset / 512, chunk)?;
        data.write_at(data_offset + offset, chunk, blockdev::WriteFlags::empty())
            .map_err(io_err("hotzone"))?;
        if !none {
            data.flush().map_err(io_err("data device"))?;
        }
        pos = if backward { offset } else { offset + len };
        let layout = p.layout(&st_next, &next.header.metadata, pos, None)?;
        re::assign_segments(&mut st_next, &mut next.header.metadata, layout).map_err(meta_err)?;
        if !none {
            luks2::write_header(&mut next, meta)?;
        }
        *s = next;
        st = st_next;
        if let Some(d) = online {
            d.set_boundary(pos);
        }
        drop(guard);
        if !progress(p.done(pos), device_size) {
            stopped = true;
        }
    }
    if none {
        data.flush().map_err(io_err("data device"))?;
        luks2::write_header(s, meta)?;
    }
    if left(pos) > 0 {
        return Ok(RunEnd::Interrupted);
    }
    if let Some(d) = online {
        // Every sector is new: the clients' I/O no longer needs the old key.
        d.set_boundary(if backward { 0 } else { device_size });
    }
    if let Some(a) = &p.sums {
        // The checksums are of plaintext blocks: wiped (random, as the rest of the free
        // keyslots area) before the header forgets them.
        let n = re::HOTZONE_RECORD_SIZE + a.record(0, length).sums_len();
        io::wipe(meta, a.offset, n, true, "hotzone checksums")?;
        io::flush(meta, "hotzone checksums")?;
    }
    finish(s, meta, &st, p.d_old, p.d_new)?;
    Ok(RunEnd::Finished)
}

/// Where a volume mid-reencryption stands, for its activation.
#[derive(Debug, Clone)]
pub struct Activation {
    /// The boundary between the segments, in bytes from the data offset: forward runs have
    /// the new segment below it, backward runs (decryption) the old one.
    pub boundary: u64,
    /// `true` for a backward run.
    pub backward: bool,
    /// Bytes of data (both segments).
    pub size: u64,
    /// The data offset in bytes.
    pub data_offset: u64,
    /// Old segment: cipher spec and sector size, `None` when plaintext (linear).
    pub old: Option<(String, u32)>,
    /// New segment: cipher spec and sector size, `None` when plaintext (linear).
    pub new: Option<(String, u32)>,
}

/// Prepares the activation of a volume whose reencryption is in progress (cryptsetup
/// `LUKS2_activate` of a device in reencryption): recovers a hotzone left in reencryption
/// by a crash (which writes: refused when `read_only`), and says where the segments meet.
pub fn prepare_activation(
    meta: &dyn BlockDevice,
    data: &dyn BlockDevice,
    luks: &mut Luks,
    keys: &ReencryptKeys,
    read_only: bool,
) -> Result<Activation, LuksError> {
    if let (Some(st), LuksHeader::V2(s)) = (status(luks)?, &luks.header) {
        if teardown_state(&st, &s.header.metadata) {
            return Err(LuksError::Reencrypt(ReencryptError::NotFinished));
        }
    }
    let mut p = plan(data, luks, keys, None)?;
    if p.st.hot.is_some() {
        if read_only {
            return Err(LuksError::Reencrypt(ReencryptError::NeedsRecovery));
        }
        let s = v2(luks)?;
        recover(meta, data, s, &mut p)?;
    }
    Ok(Activation {
        boundary: p.pos,
        backward: p.backward,
        size: p.device_size,
        data_offset: p.data_offset,
        old: p.old.spec(),
        new: p.new.spec(),
    })
}

/// Finishing (cryptsetup `reencrypt_teardown_ok`): the old keyslots, the backup segments,
/// the requirement, the reencrypt keyslot and the digests left without keyslots and
/// segments go in one header write (the commit point); then the old keyslots' material and
/// the resilience area (old ciphertext) are wiped. cryptsetup wipes each old keyslot first,
/// with a header write each, which leaves a window where a crash makes the run impossible to
/// resume (the verification digest needs the old key); here a crash at worst leaves
/// unreferenced old key material, and the header is already final.
pub(super) fn finish(
    s: &mut Luks2State,
    meta: &dyn BlockDevice,
    st: &ReencryptState,
    d_old: Option<u32>,
    d_new: Option<u32>,
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
    if let Some(d_old) = d_old.filter(|&d| Some(d) != d_new) {
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
