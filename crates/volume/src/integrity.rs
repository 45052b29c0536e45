//! Standalone dm-integrity volumes (integritysetup's format / open / dump) on a file or
//! block device.
//!
//! ```text
//!   IntegrityParams ──format()──► superblock + journal (targets::integrity::format)
//!                                 └─ wipe: zeroes with valid tags through a mode-D target
//!   IntegrityParams ──open()────► IntegrityTarget<Arc<dyn BlockDevice>>   (crate::open, Spec::Integrity)
//!   device ──────────dump()─────► integritysetup dump text (formats::integrity)
//! ```
//! The internal hash is not stored in the superblock: open needs `-I` and the key again.
use std::sync::Arc;

use blockdev::{BlockDevice, BlockError, FileLock, WriteFlags};
use formats::integrity::layout::DEFAULT_INTERLEAVE_SECTORS;
use formats::integrity::superblock::{dump_text, SB_AREA_BYTES};
use formats::integrity::{FormatParams, Layout, Superblock};
use sector_crypto::secure::SecretBuf;
use sector_crypto::tag::TagHash;
use sector_crypto::CryptoError;
pub use targets::integrity::{HashMode, IntegrityStatus, IntegrityTarget, Mode};
use targets::integrity::{IntegrityConfig, IntegrityError, JournalCipher, JournalCryptSpec};

/// Why an integrity volume operation failed.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum IntegrityVolumeError {
    /// The device could not be opened or read.
    #[error("cannot access device {path}")]
    Device {
        /// Path.
        path: String,
        /// Cause.
        #[source]
        source: BlockError,
    },
    /// The internal hash or its key is not usable.
    #[error("cannot set up integrity algorithm {alg}")]
    Hash {
        /// Algorithm as given.
        alg: String,
        /// Cause.
        #[source]
        source: CryptoError,
    },
    /// Formatting, opening or wiping failed in the target.
    #[error("dm-integrity on {path}")]
    Target {
        /// Path.
        path: String,
        /// Cause.
        #[source]
        source: IntegrityError,
    },
    /// The wipe failed.
    #[error("wiping {path}")]
    Wipe {
        /// Path.
        path: String,
        /// Cause.
        #[source]
        source: BlockError,
    },
    /// A committed journal entry fails its tag check when the journal is replayed at open.
    /// The internal hash is not stored in the superblock, so this is almost always `-I` or
    /// its key not being the ones the volume was formatted with.
    #[error(
        "{path}: the journal's tags do not match {alg}: the integrity algorithm (-I) or its key \
         (--integrity-key-file) is probably not the one {path} was formatted with{size_note}"
    )]
    WrongHash {
        /// Path.
        path: String,
        /// `-I` as given, with `" with this key"` for a keyed hash.
        alg: String,
        /// What the superblock's tag size says about the algorithm, if anything.
        size_note: String,
        /// Cause.
        #[source]
        source: Box<IntegrityError>,
    },
    /// The journal encryption algorithm is not one the kernel's dm-integrity has.
    #[error("journal encryption {0} is not supported (ctr-aes and cbc-aes are)")]
    UnsupportedJournalCrypt(String),
    /// `--journal-crypt` without its key.
    #[error("--journal-crypt needs --journal-crypt-key-file")]
    JournalCryptKeyMissing,
    /// A journal encryption key of the wrong size.
    #[error("journal encryption key of {len} bytes: {alg} takes 16, 24 or 32")]
    JournalCryptKeySize {
        /// The algorithm.
        alg: String,
        /// Bytes given.
        len: usize,
    },
    /// Journal encryption asked for in bitmap mode.
    #[error("journal encryption is not supported in bitmap mode")]
    JournalCryptInBitmapMode,
    /// `-j` too large for the superblock.
    #[error("journal size {0} is too large")]
    JournalTooLarge(u64),
    /// The storage could not be opened.
    #[error(transparent)]
    Storage(Box<crate::VolumeError>),
}

impl IntegrityVolumeError {
    /// The cause, for a caller to decide on.
    pub fn kind(&self) -> crate::ErrorKind {
        use crate::ErrorKind as K;
        match self {
            IntegrityVolumeError::Device { source, .. } | IntegrityVolumeError::Wipe { source, .. } => {
                match crate::error::block_kind(source) {
                    k @ (K::Busy | K::Permission) => k,
                    _ => K::Io,
                }
            }
            IntegrityVolumeError::Hash { .. } | IntegrityVolumeError::UnsupportedJournalCrypt(_) => {
                K::Unsupported
            }
            IntegrityVolumeError::Target { source, .. } => crate::error::integrity_kind(source),
            IntegrityVolumeError::WrongHash { .. } => K::WrongKey,
            IntegrityVolumeError::JournalCryptKeyMissing
            | IntegrityVolumeError::JournalCryptKeySize { .. }
            | IntegrityVolumeError::JournalCryptInBitmapMode
            | IntegrityVolumeError::JournalTooLarge(_) => K::Usage,
            IntegrityVolumeError::Storage(e) => e.kind(),
        }
    }
}

/// A note when `alg`'s digest size differs from the superblock's tag size (integritysetup
/// formats with tag size = digest size unless `-t` is given), else empty.
fn tag_size_note(sb_tag: u32, h: &TagHash, explicit_tag: bool) -> String {
    let digest = h.digest_size() as u32;
    if explicit_tag || digest == sb_tag {
        return String::new();
    }
    format!(
        " (the superblock's tag size is {sb_tag} bytes, {} makes {digest}-byte digests: formatted with another -I, \
         or with -t {sb_tag})",
        h.algorithm().kernel_name()
    )
}

/// integritysetup's options (format and open).
#[derive(Debug, Clone)]
pub struct IntegrityParams {
    /// `-I`: internal hash (kernel or cryptsetup spelling); default crc32c.
    pub integrity: String,
    /// `--integrity-key-file` contents (already read, `--integrity-key-size` bytes).
    pub key: Option<SecretBuf>,
    /// `-t`: tag size (default: the digest size).
    pub tag_size: Option<u32>,
    /// `-s`: block size (default 512).
    pub sector_size: u32,
    /// `--interleave-sectors` (default 32768).
    pub interleave_sectors: u32,
    /// `-j`: journal size in bytes (default: the kernel's choice).
    pub journal_size: Option<u64>,
    /// Mode J (default), B (`-B`), D (`-D`) or R (`-R`).
    pub mode: Mode,
    /// `--integrity-legacy-padding`.
    pub legacy_padding: bool,
    /// `--integrity-legacy-hmac`: no FIXED_HMAC.
    pub legacy_hmac: bool,
    /// `--buffer-sectors` (default 128).
    pub buffer_sectors: u32,
    /// `--journal-watermark` percent (default 50).
    pub journal_watermark: u32,
    /// `--journal-commit-time` ms (default 10000).
    pub journal_commit_time: u64,
    /// `--allow-discards`.
    pub allow_discards: bool,
    /// `--bitmap-sectors-per-bit` (default 32768).
    pub bitmap_sectors_per_bit: Option<u64>,
    /// `--bitmap-flush-time` ms (default 10000).
    pub bitmap_flush_time: u64,
    /// `--integrity-recalculate`.
    pub recalculate: bool,
    /// Open read-only.
    pub read_only: bool,
    /// Use O_DIRECT on the backing file.
    pub direct: bool,
    /// Take the storage lock on the device (`crate::OpenOptions::lock`): exclusive for
    /// format and a writable open, shared for a read-only one. Off by default; the CLI
    /// sets it.
    pub lock: bool,
    /// Engine knob: whole-buffer tag writes skip the metadata read.
    pub skip_rmw: bool,
    /// Engine knob: where tags are computed.
    pub hash_mode: HashMode,
    /// `--journal-integrity` (`journal_mac:`), e.g. hmac-sha256.
    pub journal_integrity: Option<String>,
    /// `--journal-integrity-key-file` contents.
    pub journal_integrity_key: Option<SecretBuf>,
    /// `--journal-crypt` (`journal_crypt:`): ctr-aes / cbc-aes (or ctr(aes) / cbc(aes)).
    pub journal_crypt: Option<String>,
    /// `--journal-crypt-key-file` contents.
    pub journal_crypt_key: Option<SecretBuf>,
}

impl Default for IntegrityParams {
    fn default() -> Self {
        IntegrityParams {
            integrity: "crc32c".into(),
            key: None,
            tag_size: None,
            sector_size: 512,
            interleave_sectors: DEFAULT_INTERLEAVE_SECTORS,
            journal_size: None,
            mode: Mode::Journal,
            legacy_padding: false,
            legacy_hmac: false,
            buffer_sectors: 128,
            journal_watermark: 50,
            journal_commit_time: 10_000,
            allow_discards: false,
            bitmap_sectors_per_bit: None,
            bitmap_flush_time: 10_000,
            recalculate: false,
            read_only: false,
            direct: false,
            lock: false,
            skip_rmw: true,
            hash_mode: HashMode::Auto,
            journal_integrity: None,
            journal_integrity_key: None,
            journal_crypt: None,
            journal_crypt_key: None,
        }
    }
}

impl IntegrityParams {
    fn hash(&self) -> Result<TagHash, IntegrityVolumeError> {
        TagHash::new(&self.integrity, self.key.as_deref())
            .map_err(|source| IntegrityVolumeError::Hash { alg: self.integrity.clone(), source })
    }

    fn journal_mac(&self) -> Result<Option<TagHash>, IntegrityVolumeError> {
        match &self.journal_integrity {
            None => Ok(None),
            Some(alg) => TagHash::new(alg, self.journal_integrity_key.as_deref())
                .map(Some)
                .map_err(|source| IntegrityVolumeError::Hash { alg: alg.clone(), source }),
        }
    }

    fn journal_crypt(&self) -> Result<Option<JournalCryptSpec>, IntegrityVolumeError> {
        let Some(alg) = &self.journal_crypt else { return Ok(None) };
        let cipher = JournalCipher::parse(alg)
            .ok_or_else(|| IntegrityVolumeError::UnsupportedJournalCrypt(alg.clone()))?;
        let key = self.journal_crypt_key.as_ref().ok_or(IntegrityVolumeError::JournalCryptKeyMissing)?;
        if !matches!(key.len(), 16 | 24 | 32) {
            return Err(IntegrityVolumeError::JournalCryptKeySize { alg: alg.clone(), len: key.len() });
        }
        if self.mode == Mode::Bitmap {
            return Err(IntegrityVolumeError::JournalCryptInBitmapMode);
        }
        Ok(Some(JournalCryptSpec { cipher, key: key.clone() }))
    }

    /// The target configuration these options describe.
    pub fn config(&self) -> Result<IntegrityConfig, IntegrityVolumeError> {
        let mut c = IntegrityConfig::new(self.mode, Some(self.hash()?));
        c.tag_size = self.tag_size;
        c.block_size = self.sector_size;
        c.buffer_sectors = self.buffer_sectors;
        c.journal_watermark = self.journal_watermark;
        c.commit_time_ms = self.journal_commit_time;
        c.sectors_per_bit = self.bitmap_sectors_per_bit;
        c.bitmap_flush_interval_ms = self.bitmap_flush_time;
        c.allow_discards = self.allow_discards;
        c.recalculate = self.recalculate;
        c.read_only = self.read_only;
        c.skip_rmw = self.skip_rmw;
        c.hash_mode = self.hash_mode;
        c.journal_mac = self.journal_mac()?;
        c.journal_crypt = self.journal_crypt()?;
        Ok(c)
    }

    /// The format parameters (cryptsetup's defaults: fix_padding, fix_hmac, random salt).
    pub fn format_params(&self, salt: [u8; 16]) -> Result<FormatParams, IntegrityVolumeError> {
        let h = self.hash()?;
        let tag = self.tag_size.unwrap_or(h.digest_size() as u32);
        let mut p = FormatParams::new(tag, self.sector_size);
        p.interleave_sectors = self.interleave_sectors;
        p.journal_sectors = match self.journal_size {
            Some(b) => Some(u32::try_from(b / 512).map_err(|_| IntegrityVolumeError::JournalTooLarge(b))?),
            None => None,
        };
        p.fix_padding = !self.legacy_padding;
        p.fix_hmac = !self.legacy_hmac;
        p.salt = salt;
        Ok(p)
    }
}

/// The stored device type: every layer opens over `Arc<dyn BlockDevice>` (any storage).
type Dev = Arc<dyn BlockDevice>;

/// Opens `path` through [`crate::storage::open`] with the lock `lock` asks for.
fn open_file(path: &str, read_only: bool, direct: bool, lock: bool) -> Result<Dev, IntegrityVolumeError> {
    let lock = match (lock, read_only) {
        (false, _) => FileLock::None,
        (true, true) => FileLock::Shared,
        (true, false) => FileLock::Exclusive,
    };
    let so = crate::storage::StorageOptions { read_only, direct, lock };
    match crate::storage::open(path, &so) {
        Ok(s) => Ok(s.device),
        Err(crate::VolumeError::Device { path, source }) => {
            Err(IntegrityVolumeError::Device { path, source })
        }
        Err(e) => Err(IntegrityVolumeError::Storage(Box::new(e))),
    }
}

/// What a format did.
#[derive(Debug, Clone)]
pub struct FormatReport {
    /// The superblock written.
    pub superblock: Superblock,
    /// Its layout.
    pub layout: Layout,
    /// Bytes wiped (0 with `no_wipe`): the whole device, or the prefix wiped before
    /// `progress` asked [`format_until`] to stop.
    pub wiped_bytes: u64,
    /// Whether the wipe stopped before the end (bytes past `wiped_bytes` then read as
    /// integrity errors until written).
    pub wipe_stopped: bool,
}

/// Formats `path` (superblock + journal exactly as the kernel would), then, unless
/// `no_wipe`, writes zeroes with valid tags over every block, reporting progress as
/// `(done, total)` bytes.
pub fn format(
    path: &str,
    p: &IntegrityParams,
    salt: [u8; 16],
    no_wipe: bool,
    mut progress: impl FnMut(u64, u64),
) -> Result<FormatReport, IntegrityVolumeError> {
    format_until(path, p, salt, no_wipe, |done, total| {
        progress(done, total);
        std::ops::ControlFlow::Continue(())
    })
}

/// [`format`] whose wipe stops (flushed, the superblock and journal already written) when
/// `progress` returns `Break`; see [`FormatReport::wipe_stopped`].
pub fn format_until(
    path: &str,
    p: &IntegrityParams,
    salt: [u8; 16],
    no_wipe: bool,
    progress: impl FnMut(u64, u64) -> std::ops::ControlFlow<()>,
) -> Result<FormatReport, IntegrityVolumeError> {
    let dev = open_file(path, false, p.direct, p.lock)?;
    format_on(dev, path, p, salt, no_wipe, progress)
}

/// [`format_until`] on opened storage `dev` (named `path` in messages).
pub fn format_on(
    dev: Dev,
    path: &str,
    p: &IntegrityParams,
    salt: [u8; 16],
    no_wipe: bool,
    progress: impl FnMut(u64, u64) -> std::ops::ControlFlow<()>,
) -> Result<FormatReport, IntegrityVolumeError> {
    // Like integritysetup: wipe old signatures in the superblock area first.
    dev.write_at(0, &vec![0u8; SB_AREA_BYTES.min(dev.geometry().size as usize)], WriteFlags::empty())
        .map_err(|source| IntegrityVolumeError::Device { path: path.into(), source })?;
    let opts = targets::integrity::FormatOptions {
        params: p.format_params(salt)?,
        start: 0,
        buffer_sectors: p.buffer_sectors,
        sectors_per_bit: p.bitmap_sectors_per_bit,
        journal_mac: p.journal_mac()?,
        journal_crypt: p.journal_crypt()?,
    };
    let target_err = |source| IntegrityVolumeError::Target { path: path.into(), source };
    let (superblock, layout) = targets::integrity::format(&dev, &opts).map_err(target_err)?;
    let mut wiped = 0;
    let mut wipe_stopped = false;
    if !no_wipe {
        let mut cfg = p.config()?;
        cfg.mode = Mode::Direct;
        cfg.read_only = false;
        cfg.commit_time_ms = 0;
        cfg.bitmap_flush_interval_ms = 0;
        cfg.recalculate = false;
        let t = IntegrityTarget::open(dev, cfg).map_err(target_err)?;
        let stopped = t
            .wipe_until(progress)
            .map_err(|source| IntegrityVolumeError::Wipe { path: path.into(), source })?;
        wiped = stopped.unwrap_or(t.geometry().size);
        wipe_stopped = stopped.is_some();
        t.close().map_err(|source| IntegrityVolumeError::Wipe { path: path.into(), source })?;
    }
    Ok(FormatReport { superblock, layout, wiped_bytes: wiped, wipe_stopped })
}

/// Reads and decodes the superblock at the start of `dev` (the file `path`).
pub(crate) fn read_superblock(dev: &dyn BlockDevice, path: &str) -> Result<Superblock, IntegrityVolumeError> {
    let mut area = vec![0u8; SB_AREA_BYTES];
    dev.read_at(0, &mut area).map_err(|source| IntegrityVolumeError::Device { path: path.into(), source })?;
    Superblock::decode(&area).map_err(|e| IntegrityVolumeError::Target {
        path: path.into(),
        source: IntegrityError::Superblock(e),
    })
}

/// Opens `path` as a dm-integrity volume. As with `integritysetup open`, the block size and
/// (unless `-t` is given) the tag size come from the superblock; the hash and key do not.
pub fn open(path: &str, p: &IntegrityParams) -> Result<Arc<IntegrityTarget<Dev>>, IntegrityVolumeError> {
    let read_only = p.read_only || p.mode == Mode::Recovery;
    let dev = open_file(path, read_only, p.direct, p.lock)?;
    open_on(dev, path, p)
}

/// [`open`] on opened storage `dev` (named `path` in messages): what [`crate::open`] runs
/// for [`crate::Spec::Integrity`].
pub fn open_on(
    dev: Dev,
    path: &str,
    p: &IntegrityParams,
) -> Result<Arc<IntegrityTarget<Dev>>, IntegrityVolumeError> {
    let sb = read_superblock(&*dev, path)?;
    let mut cfg = p.config()?;
    cfg.block_size = sb.block_size();
    cfg.tag_size = Some(p.tag_size.unwrap_or(sb.integrity_tag_size as u32));
    let h = p.hash()?;
    let note = tag_size_note(sb.integrity_tag_size as u32, &h, p.tag_size.is_some());
    if !note.is_empty() {
        log::warn!("{path}: if reads fail their tag checks, -I {} may be wrong{note}", p.integrity);
    }
    let t = IntegrityTarget::open(dev, cfg).map_err(|source| match source {
        IntegrityError::ReplayTagMismatch { .. } => IntegrityVolumeError::WrongHash {
            path: path.into(),
            alg: format!("{}{}", p.integrity, if h.algorithm().is_keyed() { " with this key" } else { "" }),
            size_note: note.clone(),
            source: Box::new(source),
        },
        source => IntegrityVolumeError::Target { path: path.into(), source },
    })?;
    Ok(Arc::new(t))
}

/// Whether `dev` starts with a dm-integrity superblock (its magic `"integrt\0"`), as a
/// format probe: nothing else of the superblock is checked.
pub fn probe(dev: &dyn BlockDevice) -> Result<bool, BlockError> {
    let block = dev.geometry().logical_block as usize;
    if dev.geometry().size < block as u64 {
        return Ok(false);
    }
    let mut first = vec![0u8; block];
    dev.read_at(0, &mut first)?;
    Ok(first.starts_with(&formats::integrity::superblock::SB_MAGIC))
}

/// `integritysetup dump`: the superblock of `path` as integritysetup 2.6.1 prints it.
pub fn dump(path: &str) -> Result<String, IntegrityVolumeError> {
    let dev = open_file(path, true, false, false)?;
    let sb = read_superblock(&*dev, path)?;
    Ok(dump_text(&sb, path))
}

/// The table of an opened integrity layer on `device`.
pub(crate) fn layer_table(
    t: &IntegrityTarget<Dev>,
    device: &str,
    p: &IntegrityParams,
) -> crate::IntegrityLayer {
    let sb = t.superblock();
    crate::IntegrityLayer {
        device: device.to_owned(),
        offset: 0,
        len: t.geometry().size / 512,
        tag_size: p.tag_size.unwrap_or(sb.integrity_tag_size as u32),
        mode: t.status().mode.letter(),
        block_size: sb.block_size(),
        internal_hash: Some(p.integrity.clone()),
    }
}

/// What a grow did (`provided_data_sectors` before and after).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct GrowReport {
    /// The volume's size before, in 512-byte sectors.
    pub old_sectors: u64,
    /// Its size now.
    pub new_sectors: u64,
    /// The new area was wiped (zeroes with valid tags) rather than recalculated.
    pub wiped: bool,
}

/// Why a grow was refused before anything changed.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum GrowError {
    /// The volume or its storage failed.
    #[error(transparent)]
    Volume(#[from] IntegrityVolumeError),
    /// A smaller size than the volume has: dm-integrity cannot shrink the tag areas, and the
    /// data past the new end would be lost.
    #[error(
        "{path} provides {have} sectors: shrinking an integrity volume to {want} is not supported (its data \
         past the new end would be lost)"
    )]
    Shrink {
        /// The device.
        path: String,
        /// Its provided_data_sectors.
        have: u64,
        /// The size asked for.
        want: u64,
    },
    /// No device size provides that many sectors with this superblock.
    #[error("{path}: no device size provides {want} sectors")]
    TooLarge {
        /// The device.
        path: String,
        /// The size asked for.
        want: u64,
    },
}

impl GrowError {
    /// The cause, for a caller to decide on.
    pub fn kind(&self) -> crate::ErrorKind {
        match self {
            GrowError::Volume(e) => e.kind(),
            GrowError::Shrink { .. } | GrowError::TooLarge { .. } => crate::ErrorKind::Usage,
        }
    }
}

/// `provided_data_sectors` of a device of `device_sectors` with superblock `sb` (0: too
/// small), as `dm_integrity_ctr` computes it.
pub fn provided_on(sb: &Superblock, p: &IntegrityParams, device_sectors: u64) -> u64 {
    provided_for(sb, p, device_sectors)
}

/// Whether growing the volume with superblock `sb`, opened with `p`, needs a recalculation
/// the kernel refuses (`IntegrityError::RecalculateRefused`: wipe the new area instead).
pub fn recalculate_refused(sb: &Superblock, p: &IntegrityParams) -> Result<bool, IntegrityVolumeError> {
    let keyed_mac = p.journal_mac()?.is_some_and(|m| m.algorithm().is_keyed());
    Ok(sb.recalculate_refused(p.hash()?.algorithm().is_keyed(), keyed_mac, false))
}

fn provided_for(sb: &Superblock, p: &IntegrityParams, device_sectors: u64) -> u64 {
    let dp = formats::integrity::DeviceParams {
        data_device_sectors: device_sectors,
        meta_device_sectors: None,
        start: 0,
        buffer_sectors: p.buffer_sectors,
        sectors_per_bit: p.bitmap_sectors_per_bit,
    };
    Layout::open(sb, &dp).map_or(0, |l| l.provided_data_sectors)
}

/// The smallest device (512-byte sectors) on which a volume with superblock `sb` provides at
/// least `sectors` (provided_data_sectors grows with the device: a binary search).
pub fn device_sectors_for(sb: &Superblock, p: &IntegrityParams, sectors: u64) -> Option<u64> {
    let mut hi = sectors.max(64);
    while provided_for(sb, p, hi) < sectors {
        hi = hi.checked_mul(2)?;
        if hi > u64::MAX / 1024 {
            return None;
        }
    }
    let mut lo = 0;
    while lo + 1 < hi {
        let mid = lo + (hi - lo) / 2;
        if provided_for(sb, p, mid) >= sectors {
            hi = mid;
        } else {
            lo = mid;
        }
    }
    Some(hi)
}

/// The target configuration for the volume whose superblock is `sb` (block and tag size
/// from it, as [`open_on`] does).
fn grow_config(sb: &Superblock, p: &IntegrityParams) -> Result<IntegrityConfig, IntegrityVolumeError> {
    let mut cfg = p.config()?;
    cfg.block_size = sb.block_size();
    cfg.tag_size = Some(p.tag_size.unwrap_or(sb.integrity_tag_size as u32));
    Ok(cfg)
}

/// Grows the closed integrity volume on the image file `storage` so it provides at least
/// `sectors` 512-byte sectors (`sealdisk resize IMAGE --size`): the superblock is marked for
/// recalculation from the old end (unless `wipe`), the file grows, the volume is opened
/// (it writes its new size), the new area is recalculated — or wiped — and the volume
/// closed. A power loss at any point leaves the old data intact and a volume that opens;
/// one after the file grew leaves the recalculation for the next open (the kernel's too).
/// Refused before any change: shrinking, a recalculation the kernel refuses for a keyed
/// hash (use `wipe`), a superblock that does not match `p`.
pub fn grow_image(
    storage: crate::Storage,
    p: &IntegrityParams,
    sectors: u64,
    wipe: bool,
) -> Result<GrowReport, GrowError> {
    let path = storage.name.clone();
    let sb = read_superblock(&*storage.device, &path)?;
    let cfg = grow_config(&sb, p)?;
    let old = sb.provided_data_sectors;
    if sectors < old {
        return Err(GrowError::Shrink { path, have: old, want: sectors });
    }
    let dev_sectors = device_sectors_for(&sb, p, sectors)
        .ok_or_else(|| GrowError::TooLarge { path: path.clone(), want: sectors })?;
    let bytes = dev_sectors.max(storage.size() / 512) * 512;
    let target = |source| IntegrityVolumeError::Target { path: path.clone(), source };
    if !wipe {
        IntegrityTarget::prepare_grow(&storage.device, &cfg).map_err(target)?;
    }
    let grown = storage.grow(bytes).map_err(|e| IntegrityVolumeError::Storage(Box::new(e)))?;
    let t = open_on(grown.device, &path, p)?;
    let new = t.superblock().provided_data_sectors;
    if wipe {
        t.wipe_range(old, new).map_err(|source| IntegrityVolumeError::Wipe { path: path.clone(), source })?;
    }
    t.wait_recalculated();
    let t = Arc::try_unwrap(t).map_err(|_| IntegrityVolumeError::Wipe {
        path: path.clone(),
        source: BlockError::new(blockdev::BlockErrorKind::Io, "the volume is still in use"),
    })?;
    t.close().map_err(|source| IntegrityVolumeError::Device { path: path.clone(), source })?;
    Ok(GrowReport { old_sectors: old, new_sectors: new, wiped: wipe })
}

/// `resize NAME` of a running volume: closes `t` (the caller made it idle and holds the
/// only reference), measures `storage` again, marks the superblock for recalculation from
/// the old end (unless `wipe`; refused for a keyed hash the kernel would not recalculate),
/// and opens the volume again at the new size (then wipes the new area with `wipe`). The
/// new area's recalculation runs in the background; reads there succeed meanwhile.
///
/// On an error after `t` was closed the caller reopens the volume (`open_on`) to go on
/// serving it.
pub fn regrow(
    t: IntegrityTarget<Dev>,
    storage: &crate::Storage,
    p: &IntegrityParams,
    wipe: bool,
) -> Result<(Arc<IntegrityTarget<Dev>>, GrowReport), GrowError> {
    let path = storage.name.clone();
    let sb = t.superblock();
    let old = sb.provided_data_sectors;
    // The kernel's refusal, before anything is closed.
    if !wipe && recalculate_refused(&sb, p)? {
        return Err(IntegrityVolumeError::Target { path, source: IntegrityError::RecalculateRefused }.into());
    }
    t.close().map_err(|source| IntegrityVolumeError::Device { path: path.clone(), source })?;
    let grown = storage.remeasured().map_err(|e| IntegrityVolumeError::Storage(Box::new(e)))?;
    let sb = read_superblock(&*grown.device, &path)?;
    let cfg = grow_config(&sb, p)?;
    let target = |source| IntegrityVolumeError::Target { path: path.clone(), source };
    if !wipe && provided_for(&sb, p, grown.size() / 512) > old {
        IntegrityTarget::prepare_grow(&grown.device, &cfg).map_err(target)?;
    }
    let t = open_on(grown.device, &path, p)?;
    let new = t.superblock().provided_data_sectors;
    if wipe && new > old {
        t.wipe_range(old, new).map_err(|source| IntegrityVolumeError::Wipe { path: path.clone(), source })?;
    }
    Ok((t, GrowReport { old_sectors: old, new_sectors: new, wiped: wipe }))
}
