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
//! Done here: modes `reencrypt` (key and/or cipher change, forward), `encrypt` (detached
//! header, forward, from a linear segment: [`init_encrypt`]) and `decrypt` (detached header,
//! backward, to a linear segment: [`init_decrypt`]), in either direction for a run cryptsetup
//! started; resilience `checksum`, `journal` and `none`; and the encryption in place with
//! data shift (`--reduce-device-size`, header on the device: [`init_encrypt_shift`],
//! resilience `datashift`, backward; activated mid-run as [`ShiftActivation`] says) and the
//! decryption of a header on the device into a new header file ([`init_decrypt_shift`],
//! resilience `datashift-checksum`, forward; activated mid-run as
//! [`DecryptShiftActivation`] says, after [`recover_decrypt_shift`] when a crash hit its
//! last hotzone). Every mode also runs online, under the served
//! [`ReencryptingDevice`](super::reencrypting::ReencryptingDevice) ([`run_unlocked`] with
//! `online`): each hotzone held against the clients, the device's mapping following the
//! header after each one.

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
    /// The header layout of an encryption (`--encrypt`): cryptsetup's luksFormat options.
    pub layout: EncryptLayout,
}

/// The header layout options of `reencrypt --encrypt` (cryptsetup passes them to the
/// luksFormat it starts with), all in bytes.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct EncryptLayout {
    /// `--luks2-metadata-size`.
    pub metadata_size: Option<u64>,
    /// `--luks2-keyslots-size`.
    pub keyslots_size: Option<u64>,
    /// `--offset` (in bytes here): where the data starts on the data device.
    pub offset: Option<u64>,
    /// `--reduce-device-size` with a detached header: the data is encrypted in place with
    /// cryptsetup's `datashift` hotzones of this length (see
    /// [`re::is_detached_shift_encryption`]); the keyslots area defaults to it less the
    /// two metadata copies.
    pub reduce_device_size: Option<u64>,
    /// `--hotzone-size` at the start of a decryption with data shift: the size of the
    /// moved first segment (cryptsetup's default: the shift, at most 20 MiB).
    pub hotzone_size: Option<u64>,
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
            layout: EncryptLayout::default(),
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

/// The length of each piece when per-hotzone CPU work (checksums, crypto) on `len` bytes is
/// cut across the cores: a multiple of `align`, at least 1 MiB; `len` itself when one
/// piece it is.
fn piece_len(len: usize, align: usize) -> usize {
    let cores = std::thread::available_parallelism().map_or(1, |n| n.get());
    let n = cores.min(len >> 20).max(1);
    len.div_ceil(n).next_multiple_of(align.max(1))
}

/// Runs `f(offset, piece)` on each [`piece_len`] piece of `buf` (offsets in bytes from its
/// start), one scoped thread per piece; the first error in piece order is returned.
fn in_pieces<E: Send>(
    buf: &mut [u8],
    align: usize,
    f: impl Fn(usize, &mut [u8]) -> Result<(), E> + Sync,
) -> Result<(), E> {
    let per = piece_len(buf.len(), align);
    if per >= buf.len() {
        return f(0, buf);
    }
    let f = &f;
    std::thread::scope(|s| {
        let jobs: Vec<_> =
            buf.chunks_mut(per).enumerate().map(|(i, c)| s.spawn(move || f(i * per, c))).collect();
        jobs.into_iter().try_for_each(|j| j.join().unwrap_or_else(|p| std::panic::resume_unwind(p)))
    })
}

/// The `hash` of each `bs`-byte block of `data` into `sums` (one digest after the other),
/// the blocks cut across the cores.
fn block_sums(hash: HashAlg, data: &[u8], bs: usize, sums: &mut [u8]) {
    let hl = hash.output_len();
    let per = piece_len(data.len(), bs);
    let hash_all = |d: &[u8], out: &mut [u8]| {
        for (blk, sum) in d.chunks(bs).zip(out.chunks_mut(hl)) {
            hash.digest_into(&[blk], sum);
        }
    };
    if per >= data.len() {
        return hash_all(data, sums);
    }
    std::thread::scope(|s| {
        for (d, out) in data.chunks(per).zip(sums.chunks_mut(per / bs * hl)) {
            s.spawn(move || hash_all(d, out));
        }
    });
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
        other => return Err(LuksError::Params(format!("Unsupported resilience mode {other}"))),
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
    let st =
        ReencryptState::from_metadata(m).map_err(meta_err)?.ok_or(LuksError::Params("internal".into()))?;
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
) -> Result<(super::FormatParams, u64, u64, Option<u64>), LuksError> {
    let unsupported = || LuksError::Params("Unsupported LUKS2 metadata size options.".into());
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
            return Err(LuksError::Params("LUKS2 metadata size is larger than data shift value.".into()));
        }
    }
    if md.is_some_and(|m| !formats::luks2::METADATA_SIZES.contains(&m))
        || ks.is_some_and(|k| k == 0 || !k.is_multiple_of(4096) || k > formats::luks2::MAX_KEYSLOTS_SIZE)
    {
        return Err(unsupported());
    }
    if l.offset.is_some_and(|o| !o.is_multiple_of(512)) {
        return Err(LuksError::Params("Requested data offset is not a multiple of 512 bytes.".into()));
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
        return Err(LuksError::Params(format!(
            "Data device is not aligned to encryption sector size ({ss} bytes)."
        )));
    }
    if let Some(r) = shift {
        if r > data_size {
            return Err(LuksError::Params("Failed to initialize LUKS2 reencryption in metadata.".into()));
        }
        if !r.is_multiple_of(u64::from(ss)) {
            return Err(LuksError::Params(format!(
                "Data shift value is not aligned to encryption sector size ({ss} bytes)."
            )));
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
        return Err(LuksError::Params(format!("Unsupported resilience mode {resilience_name}")));
    }
    let rhash = parse_hash(&p.resilience_hash)
        .map_err(|_| LuksError::Params(format!("Hash algorithm {} is not available.", p.resilience_hash)))?;
    if super::probe(data)?.is_some() {
        return Err(LuksError::Params("Device is already LUKS device. Aborting operation.".into()));
    }
    let g = data.geometry();
    let alignment = u64::from(fp.sector_size.max(g.logical_block).max(512));
    if !data_size.is_multiple_of(alignment) {
        return Err(LuksError::Params(format!(
            "Data device is not aligned to encryption sector size ({alignment} bytes)."
        )));
    }
    // The header is built in memory and written once, keyslots area first: a crash leaves
    // the header file as it was, or a header whose segment says the data is plaintext.
    if header.geometry().size < need {
        return Err(LuksError::DeviceTooSmall { need, have: header.geometry().size });
    }
    let no_space = |e| match e {
        LuksError::NoKeyslotSpace { .. } => LuksError::Params("No space for new keyslot.".into()),
        e => e,
    };
    let image = blockdev::MemDevice::new(need, 512);
    let (mut luks, vk) = super::format(&image, &fp, passphrase).map_err(no_space)?;
    let s = v2(&mut luks)?;
    let mut next = s.clone();
    let m = &mut next.header.metadata;
    let seg0 = m.segments.get(&0).cloned().ok_or(LuksError::Params("internal: no segment".into()))?;
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
    if super::probe(dev)?.is_some() {
        return Err(LuksError::Params("Device is already LUKS device. Aborting operation.".into()));
    }
    if reduce == 0 || !reduce.is_multiple_of(512) {
        return Err(LuksError::Params("Reduce size must be multiple of 512 bytes sector.".into()));
    }
    let g = dev.geometry();
    if reduce > g.size {
        return Err(LuksError::DeviceTooSmall { need: reduce, have: g.size });
    }
    if reduce == g.size {
        return Err(LuksError::Params("Failed to initialize LUKS2 reencryption in metadata.".into()));
    }
    let shift = reduce / 2;
    if !shift.is_multiple_of(4096) {
        return Err(LuksError::Params(format!(
            "The header takes half of --reduce-device-size ({shift} bytes), which must be a multiple of 4096."
        )));
    }
    let (cipher_name, key_bytes, ss) = new_crypt(p)?;
    let data_size = g.size - reduce;
    let alignment = u64::from(ss.max(g.logical_block).max(512));
    if !data_size.is_multiple_of(alignment) || !g.size.is_multiple_of(alignment) {
        return Err(LuksError::Params(format!(
            "Data device is not aligned to encryption sector size ({alignment} bytes)."
        )));
    }
    let (md, ks) = shift_header_layout(&p.layout, shift)?;
    // The keyslot and the data shift's 4 KiB block must fit in the keyslots area.
    if ks < luks2::area_size(key_bytes) + 4096 {
        return Err(LuksError::Params("No space for new keyslot.".into()));
    }
    let fp =
        detached_format(p, (cipher_name, key_bytes, ss), Some(shift / 512), Some(md), Some(ks), data_size);
    let image = blockdev::MemDevice::new(shift, 512);
    let (mut luks, vk) = super::format(&image, &fp, passphrase)?;
    let moved_size = shift.min(data_size);
    let moved_offset = g.size - shift;
    let s = v2(&mut luks)?;
    let mut next = s.clone();
    let m = &mut next.header.metadata;
    let seg0 = m.segments.get(&0).cloned().ok_or(LuksError::Params("internal: no segment".into()))?;
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

/// The metadata and keyslots area sizes of an encryption with data shift whose header
/// takes `shift` bytes on the device (cryptsetup's luksFormat with `--offset shift`):
/// `--luks2-metadata-size` (16 KiB by default) and `--luks2-keyslots-size` (by default,
/// and at most, the rest of the shift: a larger one is cut down to it, as cryptsetup does
/// with its warning).
pub fn shift_header_layout(l: &EncryptLayout, shift: u64) -> Result<(u64, u64), LuksError> {
    let unsupported = || LuksError::Params("Unsupported LUKS2 metadata size options.".into());
    let md = l.metadata_size.unwrap_or(16 << 10);
    if !formats::luks2::METADATA_SIZES.contains(&md)
        || l.keyslots_size
            .is_some_and(|k| k == 0 || !k.is_multiple_of(4096) || k > formats::luks2::MAX_KEYSLOTS_SIZE)
    {
        return Err(unsupported());
    }
    let room = shift.checked_sub(2 * md).filter(|r| *r > 0).ok_or_else(unsupported)?;
    Ok((md, l.keyslots_size.map_or(room, |k| k.min(room))))
}

/// Copies `len` bytes from `from` on `src` to `to` on `dst` (ranges that do not overlap
/// when both are one device), 8 MiB at a time, through a buffer wiped after use.
fn copy_range(
    src: &dyn BlockDevice,
    from: u64,
    dst: &dyn BlockDevice,
    to: u64,
    len: u64,
    what: &'static str,
) -> Result<(), LuksError> {
    let mut buf = SecretBuf::zeroed(len.min(8 << 20) as usize);
    let mut done = 0;
    while done < len {
        let n = (len - done).min(buf.len() as u64) as usize;
        src.read_at(from + done, &mut buf[..n]).map_err(io_err(what))?;
        dst.write_at(to + done, &buf[..n], blockdev::WriteFlags::empty()).map_err(io_err(what))?;
        done += n as u64;
    }
    Ok(())
}

/// The state, geometry and final crypt parameters of a data-shift encryption in progress
/// on a device of `size` bytes, its segments checked to lie on it, sector-aligned.
fn shift_geometry(
    luks: &Luks,
    size: u64,
) -> Result<(ReencryptState, re::ShiftGeometry, formats::luks2::CryptParams), LuksError> {
    let st = status(luks)?.ok_or_else(|| LuksError::Params("Device reencryption not in progress.".into()))?;
    let LuksHeader::V2(s) = &luks.header else {
        return Err(LuksError::Params("Device reencryption not in progress.".into()));
    };
    let g = re::ShiftGeometry::of(&st, &s.header.metadata).map_err(meta_err)?;
    let fin = &s.header.metadata.segments[&st.final_];
    let c = fin.crypt.clone().ok_or(meta_err(re::ReencryptMetaError::Layout("backup-final")))?;
    let align = u64::from(c.sector_size.max(512));
    if g.new_offset.checked_add(g.data_size).is_none_or(|e| e > size)
        || g.moved_offset.checked_add(g.moved_size).is_none_or(|e| e > size)
        || g.old_offset.checked_add(g.data_size).is_none_or(|e| e > size)
        || !g.data_size.is_multiple_of(align)
        || !g.moved_size.is_multiple_of(align)
        || !g.shift.is_multiple_of(align)
        || !g.old_offset.is_multiple_of(align)
        || !g.moved_offset.is_multiple_of(align)
    {
        return Err(meta_err(re::ReencryptMetaError::Layout("data shift segments outside the device")));
    }
    // The moved copy is read until the last hotzone: no hotzone may write over it (the new
    // segment), and it holds no plaintext still read in place (cryptsetup puts it past the
    // new segment, at the end of the device).
    let apart = |a: u64, al: u64, b: u64, bl: u64| a + al <= b || b + bl <= a;
    if !apart(g.moved_offset, g.moved_size, g.new_offset, g.data_size)
        || !apart(g.moved_offset, g.moved_size, g.old_offset + g.moved_size, g.data_size - g.moved_size)
    {
        return Err(meta_err(re::ReencryptMetaError::Layout("the moved data segment overlaps the data")));
    }
    Ok((st, g, c))
}

/// Where a volume mid data-shift encryption stands, for its activation (cryptsetup maps
/// it from the regular segments): below the boundary the old plaintext, its first
/// `moved_size` bytes from the moved copy and the rest in place; from the boundary up the
/// new crypt segment, `shift` bytes up the device. A hotzone left in reencryption counts
/// as old: its source is intact and any run redoes it from there.
#[derive(Debug, Clone)]
pub struct ShiftActivation {
    /// The geometry (offsets and sizes in bytes).
    pub geometry: re::ShiftGeometry,
    /// Bytes of data below which it is still plaintext.
    pub boundary: u64,
    /// The new segment's cipher spec and sector size.
    pub new: (String, u32),
}

/// `Some` for a volume mid data-shift encryption (`--reduce-device-size`) on a device of
/// `size` bytes, which activates as [`ShiftActivation`] says; nothing is written.
pub fn shift_activation(luks: &Luks, size: u64) -> Result<Option<ShiftActivation>, LuksError> {
    match status(luks)? {
        Some(st) if is_shift_encryption(&st) => {}
        _ => return Ok(None),
    }
    let (st, g, c) = shift_geometry(luks, size)?;
    let LuksHeader::V2(s) = &luks.header else {
        return Ok(None);
    };
    let boundary = g.boundary(&s.header.metadata, &st).map_err(meta_err)?;
    Ok(Some(ShiftActivation { geometry: g, boundary, new: (c.encryption, c.sector_size) }))
}

/// Where a volume mid data-shift decryption stands, for its activation, in the data's
/// coordinates `[0, data_size)` (cryptsetup maps it from the regular segments): the first
/// `moved_size` bytes are the moved ciphertext at the start of the device, then the
/// plaintext already written in its final place up to the boundary, then the ciphertext
/// not reached yet, `shift` bytes up the device. All ciphertext keeps its IVs (sector `L`
/// of the data has IV `L`). A forward hotzone left in reencryption counts as ciphertext
/// not reached: its source is intact and any run redoes it from there, so nothing is
/// written.
#[derive(Debug, Clone)]
pub struct DecryptShiftActivation {
    /// The geometry (offsets and sizes in bytes).
    pub geometry: re::DecryptShiftGeometry,
    /// Bytes of data below which it is plaintext or the moved ciphertext.
    pub boundary: u64,
    /// Every hotzone is written, the moved part too (the run stopped before its end): the
    /// whole data is plaintext in place.
    pub moved_plain: bool,
    /// The old (crypt) segment's cipher spec and sector size.
    pub old: (String, u32),
}

/// `Some` for a volume mid data-shift decryption whose data device is `size` bytes long,
/// which activates as [`DecryptShiftActivation`] says; nothing is written. Refused while
/// the last hotzone (the moved ciphertext, decrypted in place) is flagged in reencryption:
/// its blocks are part old, part new until [`recover_decrypt_shift`] recovers them.
pub fn decrypt_shift_activation(luks: &Luks, size: u64) -> Result<Option<DecryptShiftActivation>, LuksError> {
    let st = match status(luks)? {
        Some(st) if is_shift_decryption(&st) => st,
        _ => return Ok(None),
    };
    let LuksHeader::V2(s) = &luks.header else {
        return Ok(None);
    };
    let m = &s.header.metadata;
    let g = re::DecryptShiftGeometry::of(&st, m, size).map_err(meta_err)?;
    let c = st.backup_previous(m).map_err(meta_err)?.crypt.clone();
    let c = c.ok_or(meta_err(re::ReencryptMetaError::Layout("backup-previous is not crypt")))?;
    let align = u64::from(c.sector_size.max(512));
    if !g.shift.is_multiple_of(align)
        || !g.data_size.is_multiple_of(align)
        || !g.moved_size.is_multiple_of(align)
    {
        return Err(meta_err(re::ReencryptMetaError::Layout("data shift not aligned to its blocks")));
    }
    let p = g.progress(m, &st).map_err(meta_err)?;
    let fwd = g.data_size - g.moved_size;
    if p >= fwd && st.hot.is_some() {
        return Err(LuksError::Params(
            "The decryption with data shift was interrupted while it decrypted its last hotzone in place, \
             which needs recovery, which writes: open it read-write (or resume it with `sealdisk reencrypt \
             --resume-only --header FILE DEVICE`)."
                .into(),
        ));
    }
    let boundary = if p >= fwd { g.data_size } else { g.moved_size + p };
    let moved_plain = p == g.total();
    Ok(Some(DecryptShiftActivation {
        geometry: g,
        boundary,
        moved_plain,
        old: (c.encryption, c.sector_size),
    }))
}

/// Recovers the last hotzone of a data-shift decryption (the moved ciphertext, decrypted
/// in place) if a crash left it in reencryption, as cryptsetup does at activation: a block
/// whose content still hashes to its stored checksum is old and is decrypted again. The
/// header then says every hotzone is done (the run still has to finish). Writes nothing
/// in any other state; `Ok` also when `luks` is not mid data-shift decryption.
pub fn recover_decrypt_shift(
    meta: &dyn BlockDevice,
    dev: &dyn BlockDevice,
    luks: &mut Luks,
    keys: &ReencryptKeys,
) -> Result<(), LuksError> {
    match status(luks)? {
        Some(st) if is_shift_decryption(&st) && st.hot.is_some() => {}
        _ => return Ok(()),
    }
    run_decrypt_shift(meta, dev, luks, keys, None, &mut |_, _| false, true).map(|_| ())
}

/// The new segment's cipher, key size in bytes and sector size an encryption asks for
/// (cryptsetup's defaults: aes-xts-plain64, its default key size, 512-byte sectors).
fn new_crypt(p: &ReencryptParams) -> Result<(String, usize, u32), LuksError> {
    let cipher = p.cipher.clone().unwrap_or_else(|| "aes-xts-plain64".into());
    let key_bytes = p.key_bytes.unwrap_or_else(|| super::default_key_bits(&cipher) / 8);
    let ss = p.sector_size.unwrap_or(512);
    if ![512, 1024, 2048, 4096].contains(&ss) {
        return Err(LuksError::Params("Unsupported encryption sector size.".into()));
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
) -> super::FormatParams {
    super::FormatParams {
        cipher,
        key_bytes,
        pbkdf: p.pbkdf,
        sector_size,
        detached: true,
        offset,
        metadata_size,
        keyslots_size,
        data_size: Some(data_size),
        ..super::FormatParams::default()
    }
}

/// `true` for a LUKS2 header mid data-shift encryption (`--reduce-device-size`).
pub fn is_data_shift(luks: &Luks) -> bool {
    matches!(status(luks), Ok(Some(st)) if is_shift_encryption(&st))
}

/// Runs an encryption with data shift ([`init_encrypt_shift`], or cryptsetup's
/// `--reduce-device-size`) on `dev` (header and data on one device): per hotzone
/// (backward, at most the shift long, so it never overlaps its own source), the hotzone
/// segment flagged in-reencryption is written, its plaintext is read from its old place
/// (or the moved copy), encrypted and written `shift` bytes up, flushed, and the header
/// moves past it. A hotzone left in reencryption is simply done again: its source is
/// intact. At the end the moved copy (plaintext) is wiped with random bytes before the
/// header is finished.
///
/// With `online` (see [`run_unlocked`]), each hotzone is held from before its header write
/// until the header past it is written and the device's boundary moved to its start. The
/// hotzone `H = [start, start + len)` (data coordinates, `len <= shift`) reads `H`'s old
/// copy (in place at `old_offset + start`, or the moved copy) and writes `H`'s new copy at
/// `new_offset + start`, which is the old place of `[start + shift, ...)`: data at or above
/// the boundary, served from the new segment already. So no physical byte the hotzone
/// touches is live for any position outside `H`, and holding `H` alone keeps every client
/// request whole (the moved copy lies past the new segment, and is wiped only once the
/// boundary is 0). The writes and their order are the offline run's (the crash harness
/// covers them): clients write only where the durable header maps their position.
fn run_datashift(
    dev: &dyn BlockDevice,
    luks: &mut Luks,
    keys: &ReencryptKeys,
    online: Option<&super::reencrypting::ReencryptingDevice>,
    progress: &mut dyn FnMut(u64, u64) -> bool,
) -> Result<RunEnd, LuksError> {
    let (mut st, g, c) = shift_geometry(luks, dev.geometry().size)?;
    let s = v2(luks)?;
    let vk = keys.new.as_ref().ok_or(LuksError::WrongPassphrase)?;
    let new = cipher(&c.encryption, vk, c.sector_size)?;
    let mut b = g.boundary(&s.header.metadata, &st).map_err(meta_err)?;
    let mut recovering = st.hot.is_some();
    let mut buf = SecretBuf::zeroed(g.shift.min(8 << 20) as usize);
    if !progress(g.data_size - b, g.data_size) && !recovering {
        return Ok(RunEnd::Interrupted);
    }
    while let Some((start, len)) = g.next_hotzone(b) {
        let guard = online.map(|d| d.hold(start, len));
        if recovering {
            // The header already says this hotzone is in reencryption.
            log::warn!(
                "reencrypt: redoing the data shift hotzone at {start} ({len} bytes) after an interrupted run"
            );
            recovering = false;
        } else {
            let mut next = s.clone();
            let layout = g.layout(&next.header.metadata, &st, b, Some(len)).map_err(meta_err)?;
            re::assign_segments(&mut st, &mut next.header.metadata, layout).map_err(meta_err)?;
            luks2::write_header(&mut next, dev)?;
            *s = next;
        }
        let src = g.source(start);
        let mut done = 0u64;
        while done < len {
            let n = (len - done).min(buf.len() as u64) as usize;
            let chunk = &mut buf[..n];
            dev.read_at(src + done, chunk).map_err(io_err("data shift hotzone"))?;
            new.encrypt((start + done) / 512, chunk).map_err(crypto_err(&c.encryption))?;
            dev.write_at(g.new_offset + start + done, chunk, blockdev::WriteFlags::empty())
                .map_err(io_err("data shift hotzone"))?;
            done += n as u64;
        }
        dev.flush().map_err(io_err("data device"))?;
        b = start;
        let mut next = s.clone();
        let layout = g.layout(&next.header.metadata, &st, b, None).map_err(meta_err)?;
        re::assign_segments(&mut st, &mut next.header.metadata, layout).map_err(meta_err)?;
        luks2::write_header(&mut next, dev)?;
        *s = next;
        if let Some(d) = online {
            d.set_boundary(b);
        }
        drop(guard);
        if b > 0 && !progress(g.data_size - b, g.data_size) {
            return Ok(RunEnd::Interrupted);
        }
    }
    progress(g.data_size, g.data_size);
    // The moved copy holds plaintext: wiped (random, as cryptsetup) before the header
    // forgets it. A crash here resumes to the same point.
    io::wipe(dev, g.moved_offset, g.moved_size, true, "moved data segment")?;
    io::flush(dev, "moved data segment")?;
    let d_new = st.digest_new;
    finish(s, dev, &st, None, d_new)?;
    Ok(RunEnd::Finished)
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
        return Err(LuksError::Params("LUKS2 reencryption already initialized. Aborting operation.".into()));
    }
    luks.check_supported()?;
    if luks.aead()?.is_some() {
        return Err(LuksError::Unsupported(
            "decryption of an authenticated (integrity) volume is not supported".into(),
        ));
    }
    let journal = matches!(p.resilience.as_str(), "journal" | "datashift-journal");
    if !journal && p.resilience != "checksum" && p.resilience != "datashift-checksum" {
        return Err(LuksError::Params(
            "Requested --resilience option cannot be applied to current reencryption operation.".into(),
        ));
    }
    let rhash = parse_hash(&p.resilience_hash)
        .map_err(|_| LuksError::Params(format!("Hash algorithm {} is not available.", p.resilience_hash)))?;
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
        return Err(LuksError::Params("Device is too small.".into()));
    }
    // The moved first segment: --hotzone-size (at most the shift, a multiple of the
    // checksum block), by default the shift up to 20 MiB; the whole data when shorter.
    let moved_size = match p.layout.hotzone_size.map(|h| h - h % 512).filter(|h| *h != 0) {
        Some(h) if h > shift => {
            return Err(LuksError::Params(
                "Moved segment size can not be greater than data shift value.\n\
                 Failed to initialize LUKS2 reencryption in metadata."
                    .into(),
            ))
        }
        Some(h) => h,
        None => shift.min(re::DEFAULT_NONE_HOTZONE_LENGTH),
    }
    .min(size - shift);
    if !moved_size.is_multiple_of(4096u64.max(ss)) && moved_size != size - shift {
        return Err(LuksError::Params("Failed to initialize LUKS2 reencryption in metadata.".into()));
    }
    if !size.is_multiple_of(ss) {
        return Err(LuksError::Params(format!(
            "Data device is not aligned to encryption sector size ({ss} bytes)."
        )));
    }
    if journal {
        // cryptsetup's datashift-journal keeps the whole moved segment in the largest free
        // gap of the keyslots area, which is always smaller than the header.
        let avail = max_gap(&s.header.metadata).map_or(0, |(_, l)| l);
        return Err(LuksError::Params(format!(
            "Moved segment too large. Requested size {shift}, available space for: {avail}.\n\
             Failed to initialize LUKS2 reencryption in metadata."
        )));
    }
    if new_hdr.geometry().size < hdr_len {
        return Err(LuksError::DeviceTooSmall { need: hdr_len, have: new_hdr.geometry().size });
    }
    let (slot, vk) = luks.unlock_with(dev, passphrase, p.key_slot, &p.kdf_limits)?;
    log::info!("decrypt: keyslot {slot} opened the volume key");
    let s = v2(&mut luks)?;
    let mut next = s.clone();
    let m = &mut next.header.metadata;
    let seg0 = m.segments.get(&0).cloned().ok_or(LuksError::Params("internal: no segment".into()))?;
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
    let st =
        ReencryptState::from_metadata(m).map_err(meta_err)?.ok_or(LuksError::Params("internal".into()))?;
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

/// `true` for a decryption with data shift (cryptsetup 2.6's `--decrypt --header NEW` of a
/// header on the device): mode decrypt, forward, resilience `datashift-checksum`, a moved
/// first segment.
fn is_shift_decryption(st: &ReencryptState) -> bool {
    st.keyslot.mode == ReencryptMode::Decrypt
        && st.keyslot.direction == Direction::Forward
        && matches!(st.keyslot.resilience, Resilience::DatashiftChecksum { .. })
        && st.moved.is_some()
}

/// `true` for a LUKS2 header mid data-shift decryption ([`init_decrypt_shift`]).
pub fn is_shift_decrypting(luks: &Luks) -> bool {
    matches!(status(luks), Ok(Some(st)) if is_shift_decryption(&st))
}

/// Runs a decryption with data shift ([`init_decrypt_shift`], or cryptsetup's) with the
/// header on `meta` and the data on `dev`: per hotzone of the forward part (at most the
/// shift long, read from `shift` bytes up, so never over its own source), the header
/// flagged in-reencryption, the ciphertext decrypted and written to its final place,
/// flushed, the header past it. A forward hotzone left in reencryption is done again from
/// its source. The last hotzone, `[0, S)` (the moved ciphertext), is decrypted in place:
/// the checksum of each 4096-byte block goes to the reencrypt keyslot's area (flushed)
/// before the header flags it, and a crash there is recovered as cryptsetup's `checksum`
/// resilience (a block that still hashes to its checksum is decrypted again). At the end
/// the last `S` bytes of the device (ciphertext given up) are wiped with random bytes, as
/// cryptsetup does, and the header finished: `linear @0 dynamic`, no keyslot left.
///
/// With `recover_only`, it stops after recovering the last hotzone if a crash left it in
/// reencryption, and otherwise writes nothing ([`recover_decrypt_shift`]).
///
/// With `online` (see [`run_unlocked`]), each hotzone is held from before it is read (for
/// the last one, before its checksums are taken) until the header past it is written and
/// the device follows: the boundary moves past it, and after the last one the part below
/// the boundary switches from the moved ciphertext to the plaintext in place
/// ([`ReencryptingDevice::set_moved_done`](super::reencrypting::ReencryptingDevice::set_moved_done)).
/// A forward hotzone `H = [start, start + len)` (`start >= moved_size`, `len <= shift`)
/// reads `H`'s ciphertext at `shift + start` and writes `H`'s plaintext at `start`, which
/// holds the ciphertext of `[start - shift, start + len - shift)`: positions below the
/// boundary, served from their plaintext (or the moved ciphertext at the device's start)
/// already. The last hotzone `[0, moved_size)` reads and writes its own place. So no
/// physical byte a hotzone touches is live for any position outside it, and holding the
/// hotzone alone keeps every client request whole; the tail wiped at the end is ciphertext
/// no position maps to any more. The writes and their order are the offline run's (the
/// crash harness covers them).
fn run_decrypt_shift(
    meta: &dyn BlockDevice,
    dev: &dyn BlockDevice,
    luks: &mut Luks,
    keys: &ReencryptKeys,
    online: Option<&super::reencrypting::ReencryptingDevice>,
    progress: &mut dyn FnMut(u64, u64) -> bool,
    recover_only: bool,
) -> Result<RunEnd, LuksError> {
    let size = dev.geometry().size;
    let mut st =
        status(luks)?.ok_or_else(|| LuksError::Params("Device reencryption not in progress.".into()))?;
    let s = v2(luks)?;
    let g = re::DecryptShiftGeometry::of(&st, &s.header.metadata, size).map_err(meta_err)?;
    let prev = s.header.metadata.segments[&st.previous].clone();
    let c = prev.crypt.clone().ok_or(meta_err(re::ReencryptMetaError::Layout("backup-previous")))?;
    let (Resilience::DatashiftChecksum { hash, block_size, .. }, area_offset, area_size) =
        (&st.keyslot.resilience, st.keyslot.area_offset, st.keyslot.area_size)
    else {
        return Err(meta_err(re::ReencryptMetaError::Layout("not a data shift decryption")));
    };
    let hash = parse_hash(hash)?;
    let bs = u64::from(*block_size);
    let align = u64::from(c.sector_size.max(512));
    if !g.shift.is_multiple_of(bs.max(align)) || !g.data_size.is_multiple_of(align) {
        return Err(meta_err(re::ReencryptMetaError::Layout("data shift not aligned to its blocks")));
    }
    let sums_len = g.moved_size.div_ceil(bs) * hash.output_len() as u64;
    let meta_size = meta.geometry().size;
    if sums_len > area_size || area_offset.checked_add(area_size).is_none_or(|e| e > meta_size) {
        return Err(meta_err(re::ReencryptMetaError::Layout(
            "checksum area too small for the moved segment",
        )));
    }
    let vk = keys.old.as_ref().ok_or(LuksError::WrongPassphrase)?;
    let old = cipher(&c.encryption, vk, c.sector_size)?;
    let mut p = g.progress(&s.header.metadata, &st).map_err(meta_err)?;
    let fwd = g.data_size - g.moved_size;
    let mut buf = SecretBuf::zeroed(g.shift.min(8 << 20) as usize);
    if st.hot.is_some() && p == fwd {
        // The last hotzone, decrypted in place: a block whose checksum still matches is old.
        // (An online run never gets here: the device's activation recovered it first.)
        let _guard = online.map(|d| d.hold(0, g.moved_size));
        log::warn!("reencrypt: recovering the data shift's last hotzone after an interrupted run");
        let sums = io::read_bytes(meta, area_offset, sums_len as usize, "reencryption checksums")?;
        let hl = hash.output_len();
        let mut sum = vec![0u8; hl];
        let mut off = 0u64;
        while off < g.moved_size {
            let n = (g.moved_size - off).min(buf.len() as u64) as usize;
            let chunk = &mut buf[..n];
            dev.read_at(off, chunk).map_err(io_err("data shift hotzone"))?;
            for (i, blk) in chunk.chunks_mut(bs as usize).enumerate() {
                let b = (off / bs) as usize + i;
                hash.digest_into(&[&*blk], &mut sum);
                if sum == sums[b * hl..(b + 1) * hl] {
                    let at = off + i as u64 * bs;
                    old.decrypt(at / 512, blk).map_err(crypto_err(&c.encryption))?;
                    dev.write_at(at, blk, blockdev::WriteFlags::empty())
                        .map_err(io_err("data shift hotzone"))?;
                }
            }
            off += n as u64;
        }
        dev.flush().map_err(io_err("data device"))?;
        p = g.total();
        let mut next = s.clone();
        let layout = g.layout(&next.header.metadata, &st, p, false).map_err(meta_err)?;
        re::assign_segments(&mut st, &mut next.header.metadata, layout).map_err(meta_err)?;
        luks2::write_header(&mut next, meta)?;
        *s = next;
        if let Some(d) = online {
            d.set_boundary(g.data_size);
            d.set_moved_done();
        }
    }
    if recover_only {
        return Ok(RunEnd::Interrupted);
    }
    let mut recovering = st.hot.is_some();
    if p < g.total() && !progress(p, g.total()) && !recovering {
        return Ok(RunEnd::Interrupted);
    }
    while let Some((start, len)) = g.next_hotzone(p) {
        let last = start == 0;
        let guard = online.map(|d| d.hold(start, len));
        if last {
            // Checksums of the old blocks, durable before the header that points at them.
            let mut sums = vec![0u8; sums_len as usize];
            let hl = hash.output_len();
            let mut off = 0u64;
            while off < len {
                let n = (len - off).min(buf.len() as u64) as usize;
                dev.read_at(off, &mut buf[..n]).map_err(io_err("data shift hotzone"))?;
                let first = (off / bs) as usize * hl;
                let count = (n as u64).div_ceil(bs) as usize;
                block_sums(hash, &buf[..n], bs as usize, &mut sums[first..first + count * hl]);
                off += n as u64;
            }
            io::write_bytes(meta, area_offset, &sums, "reencryption checksums")?;
            io::flush(meta, "reencryption checksums")?;
        }
        if recovering {
            log::warn!(
                "reencrypt: redoing the data shift hotzone at {start} ({len} bytes) after an interrupted run"
            );
            recovering = false;
        } else {
            let mut next = s.clone();
            let layout = g.layout(&next.header.metadata, &st, p, true).map_err(meta_err)?;
            re::assign_segments(&mut st, &mut next.header.metadata, layout).map_err(meta_err)?;
            luks2::write_header(&mut next, meta)?;
            *s = next;
        }
        let src = g.source(start);
        let mut done = 0u64;
        while done < len {
            let n = (len - done).min(buf.len() as u64) as usize;
            let chunk = &mut buf[..n];
            dev.read_at(src + done, chunk).map_err(io_err("data shift hotzone"))?;
            old.decrypt((start + done) / 512, chunk).map_err(crypto_err(&c.encryption))?;
            dev.write_at(start + done, chunk, blockdev::WriteFlags::empty())
                .map_err(io_err("data shift hotzone"))?;
            done += n as u64;
        }
        dev.flush().map_err(io_err("data device"))?;
        p = if last { g.total() } else { p + len };
        let mut next = s.clone();
        let layout = g.layout(&next.header.metadata, &st, p, false).map_err(meta_err)?;
        re::assign_segments(&mut st, &mut next.header.metadata, layout).map_err(meta_err)?;
        luks2::write_header(&mut next, meta)?;
        *s = next;
        if let Some(d) = online {
            // As `decrypt_shift_activation` maps the header just written.
            d.set_boundary(if p >= fwd { g.data_size } else { g.moved_size + p });
            if last {
                d.set_moved_done();
            }
        }
        drop(guard);
        if p < g.total() && !progress(p, g.total()) {
            return Ok(RunEnd::Interrupted);
        }
    }
    progress(g.total(), g.total());
    // The ciphertext given up past the data (cryptsetup wipes it with random bytes); a
    // crash here resumes to the same point.
    io::wipe(dev, g.data_size, size - g.data_size, true, "data past the decrypted data")?;
    io::flush(dev, "data past the decrypted data")?;
    let d_old = st.digest_old;
    finish(s, meta, &st, d_old, None)?;
    Ok(RunEnd::Finished)
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
        return Err(LuksError::Params("LUKS2 reencryption already initialized. Aborting operation.".into()));
    }
    luks.check_supported()?;
    if luks.aead()?.is_some() {
        return Err(LuksError::Unsupported(
            "decryption of an authenticated (integrity) volume is not supported".into(),
        ));
    }
    let resilience_name = p.resilience.as_str();
    if !matches!(resilience_name, "checksum" | "journal" | "none") {
        return Err(LuksError::Params(format!("Unsupported resilience mode {resilience_name}")));
    }
    let rhash = parse_hash(&p.resilience_hash)
        .map_err(|_| LuksError::Params(format!("Hash algorithm {} is not available.", p.resilience_hash)))?;
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
        return Err(LuksError::Params("Device is too small.".into()));
    }
    if !device_size.is_multiple_of(check_ss) {
        return Err(LuksError::Params(format!(
            "Data device is not aligned to encryption sector size ({check_ss} bytes)."
        )));
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

/// `true` for an encryption with data shift in place (`--reduce-device-size`): mode
/// encrypt, backward, resilience `datashift`, a moved first segment.
fn is_shift_encryption(st: &ReencryptState) -> bool {
    st.keyslot.mode == ReencryptMode::Encrypt
        && st.keyslot.direction == Direction::Backward
        && matches!(st.keyslot.resilience, Resilience::Datashift { .. })
        && st.moved.is_some()
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
        return Err(LuksError::Params("Device reencryption not in progress.".into()));
    };
    check_mode(&st)?;
    let LuksHeader::V2(s) = &luks.header else {
        return Err(LuksError::Params("Device reencryption not in progress.".into()));
    };
    let pass = passphrase.as_bytes();
    let (d_old, d_new) = (st.digest_old, st.digest_new);
    if let Some(n) = only {
        let m = &s.header.metadata;
        let d = m
            .keyslot_digest(n)
            .filter(|_| m.keyslots.get(&n).is_some_and(|ks| ks.is_luks2()))
            .filter(|d| Some(*d) == d_old || Some(*d) == d_new)
            .ok_or_else(|| LuksError::Params("No usable keyslot is available.".into()))?;
        let needed = [d_new, d_old.filter(|_| !teardown_state(&st, m))];
        if let Some(missing) = needed.into_iter().flatten().find(|x| *x != d) {
            luks2::check_slot_costs(&s.header, n, limits)?;
            return match luks2::try_slot(&s.header, meta, n, pass)? {
                None => Err(LuksError::WrongPassphrase),
                Some(_) => Err(LuksError::Params(format!(
                    "Key (digest id {missing}) required but not unlocked: keyslot {n} opens only one of the \
                     two volume keys of the reencryption in progress."
                ))),
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
        return Err(LuksError::Params("Reencryption metadata is invalid.".into()));
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
struct Side {
    cipher: Option<(SectorCipher, String)>,
    sector_size: u32,
}

impl Side {
    fn spec(&self) -> Option<(String, u32)> {
        self.cipher.as_ref().map(|(_, s)| (s.clone(), self.sector_size))
    }
}

/// The parameters of a run, from the metadata and the data device.
struct Plan {
    st: ReencryptState,
    d_old: Option<u32>,
    d_new: Option<u32>,
    old: Side,
    new: Side,
    backward: bool,
    data_offset: u64,
    device_size: u64,
    fixed: bool,
    alignment: u64,
    length: u64,
    hash: Option<HashAlg>,
    /// The boundary before any recovery (relative to the data offset): forward, the end of
    /// the new part (everything below is new); backward, the end of the old part
    /// (everything above is new).
    pos: u64,
    /// An encryption with data shift and a detached header: its hotzones follow
    /// cryptsetup's steps ([`re::detached_shift_hotzone`]) and are protected by
    /// sealdisk's checksums in this free range of the keyslots area.
    sums: Option<SumsArea>,
}

/// Where sealdisk keeps the [`re::HotzoneRecord`] of the hotzone in flight (the start of
/// the largest free range of the keyslots area, as it is during the run).
#[derive(Debug, Clone)]
struct SumsArea {
    offset: u64,
    block: u64,
    uuid: String,
}

impl SumsArea {
    fn record(&self, start: u64, len: u64) -> re::HotzoneRecord {
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
            .ok_or(LuksError::Params("internal: hotzone record".into()))?;
        io::write_bytes(meta, self.offset, &rec, "hotzone checksums")?;
        io::write_bytes(meta, self.offset + re::HOTZONE_RECORD_SIZE, &sums, "hotzone checksums")
    }
}

impl Plan {
    /// Old content to new content, in place (`sector` in 512-byte units from the data
    /// offset), cut across the cores in pieces of whole 4096-byte sectors (the largest
    /// encryption sector, so each piece starts on a sector of both ciphers).
    fn rewrite(&self, sector: u64, buf: &mut [u8]) -> Result<(), LuksError> {
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
    fn layout(
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
        return Err(LuksError::Params("Device reencryption not in progress.".into()));
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
        return Err(LuksError::Params("Device reencryption not in progress.".into()));
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
    let mut sums = None;
    if re::is_detached_shift_encryption(&st) {
        // cryptsetup's hotzones are the data shift long (--hotzone-size is ignored); here
        // at most 64 MiB, and no longer than the free keyslots area can hold checksums for.
        let (offset, gap) = max_gap(m).unwrap_or((0, 0));
        let cap = gap.saturating_sub(re::HOTZONE_RECORD_SIZE) / re::HOTZONE_SUM_LEN * alignment;
        length = rk.resilience.shift().min(cap).min(64 << 20);
        length -= length % alignment;
        if length == 0 {
            return Err(LuksError::Params(
                "No room left in the keyslots area for the hotzone checksums of the data shift encryption."
                    .into(),
            ));
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

fn io_err(what: &'static str) -> impl Fn(blockdev::BlockError) -> LuksError {
    move |source| LuksError::Io { what, source }
}

fn crypto_err(spec: &str) -> impl Fn(sector_crypto::CryptoError) -> LuksError + '_ {
    move |source| LuksError::Cipher { spec: spec.to_owned(), source }
}

/// Recovers the hotzone flagged `in-reencryption` (a run that stopped mid-hotzone) and
/// writes the header that moves past it; `p.pos` is then the boundary past it.
fn recover(
    meta: &dyn BlockDevice,
    data: &dyn BlockDevice,
    s: &mut Luks2State,
    p: &mut Plan,
) -> Result<(), LuksError> {
    let Some(h) = p.st.hot else { return Ok(()) };
    let rk = p.st.keyslot.clone();
    let data_offset = p.data_offset;
    let hs = s.header.metadata.segments[&h].clone();
    let len = hs.fixed_size().ok_or(meta_err(re::ReencryptMetaError::Layout("dynamic hotzone")))?;
    if !len.is_multiple_of(p.alignment) {
        return Err(meta_err(re::ReencryptMetaError::Layout("hotzone not aligned")));
    }
    let offset = hs
        .offset
        .checked_sub(data_offset)
        .filter(|o| o.checked_add(len).is_some_and(|e| e <= p.device_size))
        .ok_or(meta_err(re::ReencryptMetaError::Layout("hotzone outside the data")))?;
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
                    p.rewrite(sector, blk)?;
                    data.write_at(data_offset + offset + (b * bs) as u64, blk, blockdev::WriteFlags::empty())
                        .map_err(io_err("hotzone"))?;
                }
            }
        }
        (Resilience::Datashift { .. }, _) if p.sums.is_some() => {
            // cryptsetup's own recovery of this hotzone copies the data below it over it;
            // sealdisk's checksums (when they are this hotzone's) say which blocks are old.
            let a = p.sums.clone().ok_or(LuksError::Params("internal: no checksum area".into()))?;
            let want = a.record(offset, len);
            let rec = io::read_bytes(meta, a.offset, re::HOTZONE_RECORD_SIZE as usize, "hotzone checksums")?;
            let sums = io::read_bytes(
                meta,
                a.offset + re::HOTZONE_RECORD_SIZE,
                want.sums_len() as usize,
                "hotzone checksums",
            )?;
            if !want.matches(&rec, &sums) {
                return Err(LuksError::Params(format!(
                    "Cannot recover the interrupted hotzone at {offset} ({len} bytes): its datashift \
                     resilience keeps no copy of it with a detached header, and no sealdisk checksums of \
                     it were found (was it interrupted in cryptsetup?). Its blocks may be partly \
                     encrypted; restore the data from a backup."
                )));
            }
            let hash = HashAlg::Sha256;
            let hl = hash.output_len();
            let mut sum = vec![0u8; hl];
            let bs = a.block as usize;
            for (b, blk) in buf.chunks_mut(bs).enumerate() {
                hash.digest_into(&[&*blk], &mut sum);
                if sum == sums[b * hl..(b + 1) * hl] {
                    let at = offset + (b * bs) as u64;
                    p.rewrite(at / 512, blk)?;
                    data.write_at(data_offset + at, blk, blockdev::WriteFlags::empty())
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
            p.rewrite(offset / 512, &mut buf)?;
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
    p.pos = if p.backward { offset } else { offset + len };
    let mut next = s.clone();
    let layout = p.layout(&p.st, &next.header.metadata, p.pos, None)?;
    re::assign_segments(&mut p.st, &mut next.header.metadata, layout).map_err(meta_err)?;
    luks2::write_header(&mut next, meta)?;
    *s = next;
    Ok(())
}

/// [`run`] with the keys already unlocked. With `online`, the run rewrites the data under
/// a served [`ReencryptingDevice`](super::reencrypting::ReencryptingDevice): each hotzone's
/// range is held against the device's clients from the read of its old content until the
/// header past it is written, and the device's boundary moves with it.
pub fn run_unlocked(
    meta: &dyn BlockDevice,
    data: &dyn BlockDevice,
    luks: &mut Luks,
    keys: &ReencryptKeys,
    opts: &RunOptions,
    online: Option<&super::reencrypting::ReencryptingDevice>,
    progress: &mut dyn FnMut(u64, u64) -> bool,
) -> Result<RunEnd, LuksError> {
    {
        let st =
            status(luks)?.ok_or_else(|| LuksError::Params("Device reencryption not in progress.".into()))?;
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
                .ok_or(LuksError::Params("internal: no hotzone".into()))?,
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
            return Err(LuksError::Params(
                "The reencryption wrote every hotzone but was not finished (its old keyslots are gone): \
                 finish it with `sealdisk reencrypt --resume-only` first."
                    .into(),
            ));
        }
    }
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
fn finish(
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

/// cryptsetup `repair`'s reencryption recovery: when a crash left a hotzone flagged in
/// reencryption (cryptsetup's `CRYPT_REENCRYPT_CRASH`, which its `reencrypt` refuses to
/// resume: "Device requires reencryption recovery. Run repair first."), recovers that
/// hotzone the way the next run or writable open would, writes the header that moves past
/// it, and stops: the rest is left to `reencrypt --resume-only`, in either tool. The one
/// exception is a data shift whose interrupted hotzone was its last: what remains after it
/// is the end of the run (a wipe and the final header), which is then done too. Returns
/// `false`, with nothing written, when no hotzone needs recovery.
pub fn recover_interrupted(
    meta: &dyn BlockDevice,
    data: &dyn BlockDevice,
    luks: &mut Luks,
    keys: &ReencryptKeys,
) -> Result<bool, LuksError> {
    let hot =
        |luks: &Luks| -> Result<bool, LuksError> { Ok(status(luks)?.is_some_and(|st| st.hot.is_some())) };
    if !hot(luks)? {
        return Ok(false);
    }
    if is_shift_decrypting(luks) {
        // Its last hotzone (the moved ciphertext, decrypted in place) has its own recovery.
        recover_decrypt_shift(meta, data, luks, keys)?;
        if !hot(luks)? {
            return Ok(true);
        }
    }
    // A run that stops before its first new hotzone: what it does first is the recovery.
    run_unlocked(meta, data, luks, keys, &RunOptions::default(), None, &mut |_, _| false)?;
    if hot(luks)? {
        return Err(LuksError::Params(
            "internal: the interrupted hotzone is still flagged after its recovery".into(),
        ));
    }
    Ok(true)
}
