//! LUKS2 authenticated encryption: the stack cryptsetup activates for a segment with
//! `integrity`, and the data-area format of `luksFormat --integrity`.
//!
//! ```text
//!   AeadCryptTarget   capi:authenc(hmac(sha256),xts(aes))-plain64 | capi:gcm(aes)-random
//!         │           | capi:rfc7539(chacha20,poly1305)-random,
//!         │           key = volume key, offset 0, integrity:<tuple>:aead, sector_size
//!   IntegrityTarget   "<name>_dif": superblock at the segment offset on the DATA device
//!         │           (even with a detached header), tag size = tuple size, block size =
//!         │           sector size, no internal hash; mode J, or D with --integrity-no-journal
//!   data device
//! ```
//!
//! What cryptsetup 2.6 + Linux 6.1 do (testdata/luks-integrity/boot.log): the dm-integrity
//! table is `<dev> <offset> <tuple> J ... fix_padding` with the kernel's default journal,
//! interleave and buffer sizes (no `fix_hmac`: there is no keyed hash); dm-crypt's length is
//! the integrity device's provided size. `luksFormat --integrity` formats that layout
//! (cryptsetup does it through a temporary dm-integrity device) and then writes zeroes over
//! the whole volume through the AEAD layer, because a sector never written has no valid
//! tag and reads as an I/O error; `--integrity-no-wipe` skips that,
//! `--integrity-no-journal` runs the wipe in direct mode.

use std::ops::ControlFlow;

use std::sync::Arc;

use blockdev::{BlockDevice, WriteFlags};
use formats::dm::{CryptOptions, CryptTable};
use formats::integrity::FormatParams as IntegrityFormatParams;
use sector_crypto::{AeadSectorCipher, AeadSpec, SectorParams, VolumeKey};
use targets::integrity::{self, FormatOptions, IntegrityConfig, IntegrityTarget, Mode};
use targets::{AeadCryptTarget, CryptConfig, CryptMode};
use zeroize::Zeroizing;

use super::{FormatParams, Luks, LuksError, LuksVersion};
use crate::{IntegrityLayer, LayerTable};

/// `luksFormat --integrity` choices.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct LuksIntegrity {
    /// The authenticated cipher (from `--cipher` and `--integrity`).
    pub spec: AeadSpec,
    /// `--integrity-no-wipe`: leave the data area unwritten (reads of unwritten sectors fail).
    pub no_wipe: bool,
    /// `--integrity-no-journal`: wipe in direct mode (no journal double write).
    pub no_journal: bool,
    /// Journal size in bytes (`None`: the kernel's default, 1/128 of the device, at most
    /// 64 MiB; cryptsetup's `luksFormat --integrity` always leaves it to that default, the
    /// golden images in testdata/luks-integrity show it). Rounded down to 512-byte sectors;
    /// the bench's `journal-size` knob.
    pub journal_size: Option<u64>,
}

/// The stack's built type over data device `D`.
pub type AeadStack<D> = AeadCryptTarget<IntegrityTarget<D>>;

/// Journal options of the dm-integrity layer under an authenticated volume, for its open
/// (integritysetup's `--journal-watermark` and `--journal-commit-time`; cryptsetup itself
/// always opens with the kernel's defaults, 50% and 10000 ms, which `None` keeps).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct IntegrityJournalTuning {
    /// `journal_watermark:` percent (0..=100): the writer copies out when the journal is this
    /// full.
    pub watermark: Option<u32>,
    /// `commit_time:` ms: uncommitted journal entries are committed after this long (0: only
    /// on flush, FUA and the watermark).
    pub commit_time_ms: Option<u64>,
}

impl IntegrityJournalTuning {
    /// Whether any option was given.
    pub fn is_set(&self) -> bool {
        self.watermark.is_some() || self.commit_time_ms.is_some()
    }
}

/// How to open an authenticated volume (the LUKS part of [`crate::LuksSpec`]).
#[derive(Debug, Clone, Copy)]
pub struct AeadOpen<'a> {
    /// Activation flags from the command line.
    pub flags: &'a CryptOptions,
    /// `--integrity-no-journal`.
    pub no_journal: bool,
    /// `--journal-watermark`, `--journal-commit-time` (mode J only).
    pub journal: IntegrityJournalTuning,
    /// Read-only and crypto placement.
    pub open: &'a crate::OpenOptions,
}

fn cipher_err(spec: &AeadSpec) -> impl FnOnce(sector_crypto::CryptoError) -> LuksError + '_ {
    move |source| LuksError::Cipher { spec: spec.to_string(), source }
}

/// The format-time checks of an authenticated LUKS2 volume: LUKS2 only, the cipher string
/// matches the integrity spec, and the key fits it.
pub(super) fn check_format(
    p: &FormatParams,
    i: &LuksIntegrity,
    vk: &VolumeKey,
    sp: SectorParams,
) -> Result<(), LuksError> {
    if p.version != LuksVersion::V2 {
        return Err(super::ParamError::IntegrityNeedsLuks2.into());
    }
    let (enc, _) = i.spec.luks2_names();
    if enc != p.cipher {
        return Err(super::ParamError::AeadCipherMismatch {
            cipher: p.cipher.clone(),
            aead: enc.to_string(),
        }
        .into());
    }
    AeadSectorCipher::new(&i.spec, vk, sp, i.spec.tuple_size()).map_err(cipher_err(&i.spec))?;
    Ok(())
}

/// The dm-integrity table options for `spec` at a segment of `sector_size`.
fn integrity_config(
    spec: &AeadSpec,
    sector_size: u32,
    start: u64,
    mode: Mode,
    read_only: bool,
) -> IntegrityConfig {
    let mut c = IntegrityConfig::new(mode, None);
    c.tag_size = Some(spec.tuple_size() as u32);
    c.block_size = sector_size;
    c.start = start;
    c.read_only = read_only;
    c
}

/// The AEAD crypt layer over an opened integrity layer; `cfg` carries the placement modes
/// and read-only (offset and length are set here).
fn aead_over<D: BlockDevice + 'static>(
    below: IntegrityTarget<D>,
    spec: &AeadSpec,
    vk: &VolumeKey,
    sector_size: u32,
    iv_offset: u64,
    len: Option<u64>,
    cfg: CryptConfig,
) -> Result<AeadStack<D>, LuksError> {
    let sp = SectorParams { sector_size, iv_offset, iv_large_sectors: false };
    let cipher = AeadSectorCipher::new(spec, vk, sp, spec.tuple_size()).map_err(cipher_err(spec))?;
    let cfg = CryptConfig { offset: 0, len, ..cfg };
    AeadCryptTarget::new(below, cipher, cfg).map_err(LuksError::AeadLayer)
}

fn integrity_err(e: integrity::IntegrityError) -> LuksError {
    LuksError::Integrity(e)
}

/// Assembles the stack of an unlocked authenticated volume on `data` (named `device`):
/// the top device and the tables of its two layers.
pub(crate) fn open(
    luks: &Luks,
    spec: &AeadSpec,
    data: Arc<dyn BlockDevice>,
    device: &str,
    vk: &VolumeKey,
    p: &AeadOpen<'_>,
) -> Result<(Arc<dyn BlockDevice>, Vec<LayerTable>), LuksError> {
    let seg = luks.segment()?;
    if p.flags.allow_discards || seg.flags.iter().any(|f| f == "allow-discards") {
        return Err(super::ParamError::AeadDiscards.into());
    }
    let no_journal = p.no_journal || seg.flags.iter().any(|f| f == "no-journal");
    let mode = if no_journal { Mode::Direct } else { Mode::Journal };
    let read_only = p.open.read_only;
    let mut cfg = integrity_config(spec, seg.sector_size, seg.offset / 512, mode, read_only);
    if let Some(w) = p.journal.watermark {
        if w > 100 {
            return Err(super::ParamError::JournalWatermark(w).into());
        }
        cfg.journal_watermark = w;
    }
    if let Some(t) = p.journal.commit_time_ms {
        cfg.commit_time_ms = t;
    }
    if no_journal && p.journal.is_set() {
        log::warn!("journal watermark and commit time do not apply without the journal (mode D)");
    }
    let below = IntegrityTarget::open(data, cfg).map_err(integrity_err)?;
    // Crypto placement as for plain LUKS: the perf flags (given now or stored in the header)
    // keep a direction inline, otherwise the opener's mode (auto by default).
    let flags = p.flags.with_persistent(&seg.flags);
    let place = |inline: bool| if inline { CryptMode::Inline } else { p.open.crypt_mode };
    let crypt = CryptConfig {
        read_mode: place(flags.no_read_workqueue),
        write_mode: place(flags.no_write_workqueue),
        read_only,
        ..CryptConfig::default()
    };
    let target = aead_over(below, spec, vk, seg.sector_size, seg.iv_offset, seg.size, crypt)?;
    let len = target.geometry().size;
    let options = CryptOptions {
        sector_size: (seg.sector_size != 512).then_some(seg.sector_size),
        integrity_aead: Some(spec.tuple_size() as u32),
        ..CryptOptions::default()
    };
    log::info!(
        "authenticated encryption {spec} over dm-integrity (mode {}, tag {} bytes) at sector {}",
        if no_journal { 'D' } else { 'J' },
        spec.tuple_size(),
        seg.offset / 512
    );
    let below = target.inner();
    let integrity = IntegrityLayer {
        device: device.to_owned(),
        offset: seg.offset / 512,
        len: below.geometry().size / 512,
        tag_size: spec.tuple_size() as u32,
        mode: if no_journal { 'D' } else { 'J' },
        block_size: seg.sector_size,
        internal_hash: None,
    };
    let table = CryptTable {
        len: len / 512,
        cipher: spec.to_string(),
        key: Zeroizing::new(vk.as_bytes().to_vec()),
        iv_offset: seg.iv_offset,
        device: format!("{device}@dm-integrity:{}", seg.offset / 512),
        offset: 0,
        options,
    };
    Ok((Arc::new(target), vec![LayerTable::Integrity(integrity), LayerTable::Crypt(table)]))
}

/// How a data-area wipe ended.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum WipeEnd {
    /// The whole volume holds zeroes with valid tags (or `no_wipe` asked for no wipe).
    Done,
    /// The progress callback asked to stop. Bytes `0..wiped` of the volume hold zeroes with
    /// valid tags and are flushed; bytes `wiped..total` read as integrity errors until
    /// written. [`wipe_integrity`] from `wiped` finishes the wipe.
    Stopped {
        /// Bytes of the volume wiped (and flushed), from its start.
        wiped: u64,
        /// The volume's size in bytes.
        total: u64,
    },
}

/// Formats the dm-integrity area of a freshly formatted authenticated LUKS2 volume on
/// `data` (the data device, even with a detached header) and, unless `i.no_wipe`, writes
/// zeroes with valid tags over the whole volume through the AEAD layer. `progress(done,
/// total)` is called as the wipe goes. Refuses a header without integrity.
pub fn format_integrity<D: BlockDevice + 'static>(
    data: D,
    luks: &Luks,
    vk: &VolumeKey,
    i: &LuksIntegrity,
    mut progress: impl FnMut(u64, u64),
) -> Result<(), LuksError> {
    format_integrity_until(data, luks, vk, i, |done, total| {
        progress(done, total);
        ControlFlow::Continue(())
    })
    .map(|_| ())
}

/// [`format_integrity`] whose wipe stops, flushed, when `progress(done, total)` returns
/// `Break` (it is asked before each 1 MiB chunk and once at the end). The dm-integrity
/// area is formatted whole before the wipe starts, so a stopped volume opens; see
/// [`WipeEnd::Stopped`].
pub fn format_integrity_until<D: BlockDevice + 'static>(
    data: D,
    luks: &Luks,
    vk: &VolumeKey,
    i: &LuksIntegrity,
    progress: impl FnMut(u64, u64) -> ControlFlow<()>,
) -> Result<WipeEnd, LuksError> {
    let spec = luks.aead()?.ok_or(super::ParamError::NoIntegritySegment)?;
    let seg = luks.segment()?;
    let mut params = IntegrityFormatParams::new(spec.tuple_size() as u32, seg.sector_size);
    // cryptsetup passes fix_padding; fix_hmac only matters with a keyed internal hash or a
    // journal MAC, neither of which authenticated encryption uses.
    params.fix_hmac = false;
    if let Some(b) = i.journal_size {
        params.journal_sectors =
            Some(u32::try_from(b / 512).map_err(|_| super::ParamError::JournalTooLarge(b))?);
    }
    let opts = FormatOptions {
        params,
        start: seg.offset / 512,
        buffer_sectors: formats::integrity::layout::DEFAULT_BUFFER_SECTORS,
        sectors_per_bit: None,
        journal_mac: None,
        journal_crypt: None,
    };
    integrity::format(&data, &opts).map_err(integrity_err)?;
    if i.no_wipe {
        data.flush().map_err(|source| LuksError::Io { what: "data device", source })?;
        return Ok(WipeEnd::Done);
    }
    wipe_integrity(data, luks, vk, i.no_journal, 0, progress)
}

/// Writes zeroes with valid tags over bytes `from..` of the unlocked authenticated volume
/// on `data` (whose dm-integrity area is already formatted): the wipe of `luksFormat
/// --integrity`, or the rest of one that was stopped (`from` = [`WipeEnd::Stopped`]'s
/// `wiped`). `no_journal` (or the segment's `no-journal` flag) wipes in direct mode.
/// `progress(done, total)` is asked before each 1 MiB chunk and once at the end; `Break`
/// stops the wipe, flushed. `from` must be a multiple of the segment's sector size and at
/// most the volume's size.
pub fn wipe_integrity<D: BlockDevice + 'static>(
    data: D,
    luks: &Luks,
    vk: &VolumeKey,
    no_journal: bool,
    from: u64,
    mut progress: impl FnMut(u64, u64) -> ControlFlow<()>,
) -> Result<WipeEnd, LuksError> {
    let spec = luks.aead()?.ok_or(super::ParamError::NoIntegritySegment)?;
    let seg = luks.segment()?;
    let no_journal = no_journal || seg.flags.iter().any(|f| f == "no-journal");
    let mode = if no_journal { Mode::Direct } else { Mode::Journal };
    let cfg = integrity_config(&spec, seg.sector_size, seg.offset / 512, mode, false);
    let below = IntegrityTarget::open(data, cfg).map_err(integrity_err)?;
    let target =
        aead_over(below, &spec, vk, seg.sector_size, seg.iv_offset, seg.size, CryptConfig::default())?;
    let total = target.geometry().size;
    if from > total || !from.is_multiple_of(u64::from(seg.sector_size)) {
        return Err(
            super::ParamError::WipeOffset { offset: from, sector_size: seg.sector_size, total }.into()
        );
    }
    let io_err = |source| LuksError::Io { what: "authenticated volume (format wipe)", source };
    let chunk = 1u64 << 20;
    let mut buf = vec![0u8; chunk as usize];
    let mut off = from;
    while off < total {
        if progress(off, total).is_break() {
            target.flush().map_err(io_err)?;
            return Ok(WipeEnd::Stopped { wiped: off, total });
        }
        let n = chunk.min(total - off) as usize;
        buf[..n].fill(0);
        target.write_at_scratch(off, &mut buf[..n], WriteFlags::empty()).map_err(io_err)?;
        off += n as u64;
    }
    target.flush().map_err(io_err)?;
    let _ = progress(total, total);
    Ok(WipeEnd::Done)
}
