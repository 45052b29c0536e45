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

use formats::luks2::reencrypt::{self as re, ReencryptState};
use formats::luks2::{DigestPbkdf2, Luks2Metadata};
use sector_crypto::kdf::{self, HashAlg};
use sector_crypto::{CipherSpec, SectorCipher, SectorParams, VolumeKey};

use super::keyslot::digest_eq;
use super::{parse_hash, KdfLimits, Luks, Luks2State, LuksError, LuksHeader, PbkdfParams, ReencryptError};

mod init;
mod recover;
mod run;
mod shift;

pub use init::{init, init_decrypt, init_decrypt_shift, init_encrypt, init_encrypt_shift, plan_encrypt};
pub use recover::{recover_decrypt_shift, recover_interrupted};
pub use run::{
    check_openable, prepare_activation, run, run_unlocked, unlock_keys, unlock_keys_with, Activation,
    ReencryptKeys, RunOptions,
};
pub use shift::{
    decrypt_shift_activation, is_data_shift, is_shift_decrypting, shift_activation, shift_header_layout,
    DecryptShiftActivation, ShiftActivation,
};

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
        LuksHeader::V1(_) => Err(LuksError::Reencrypt(ReencryptError::NeedsLuks2)),
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

fn io_err(what: &'static str) -> impl Fn(blockdev::BlockError) -> LuksError {
    move |source| LuksError::Io { what, source }
}

fn crypto_err(spec: &str) -> impl Fn(sector_crypto::CryptoError) -> LuksError + '_ {
    move |source| LuksError::Cipher { spec: spec.to_owned(), source }
}
