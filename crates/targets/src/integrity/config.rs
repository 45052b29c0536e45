//! The target's table options ([`IntegrityConfig`], the `dm_integrity_ctr` arguments), where
//! tags are computed ([`HashMode`]), why an open or format fails ([`IntegrityError`]), and
//! what `status()` reports ([`IntegrityStatus`]).

use std::fmt;

use blockdev::BlockError;
use formats::integrity::journal::JournalError;
pub use formats::integrity::Mode;
use formats::integrity::{LayoutError, SuperblockError};
use sector_crypto::tag::TagHash;

use super::JournalCryptSpec;

/// Where the tags of a multi-block request are computed (the kernel's synchronous `shash`
/// versus an offloaded `ahash`): the crate's one [`Placement`](crate::Placement) policy, on
/// the pool crypt uses.
pub type HashMode = crate::placement::Placement;

/// Table options of an integrity target (`dm_integrity_ctr` arguments).
#[derive(Debug, Clone)]
pub struct IntegrityConfig {
    /// `J`, `B`, `D` or `R`.
    pub mode: Mode,
    /// `internal_hash:` (keyed already); `None` = tags come from the layer above
    /// ([`TaggedDevice`](super::TaggedDevice)).
    pub internal_hash: Option<TagHash>,
    /// Tag bytes per block; `None` = the internal hash's digest size.
    pub tag_size: Option<u32>,
    /// `block_size:` (512..=4096).
    pub block_size: u32,
    /// Table `start` (`reserved_sectors`): where the superblock is, in 512-byte sectors.
    pub start: u64,
    /// `buffer_sectors:` (default 128).
    pub buffer_sectors: u32,
    /// `journal_watermark:` percent (default 50).
    pub journal_watermark: u32,
    /// `commit_time:` in ms (default 10000; 0 = no timer, commit only on flush/FUA/watermark).
    pub commit_time_ms: u64,
    /// `sectors_per_bit:` (mode B granularity; `None` = 32768).
    pub sectors_per_bit: Option<u64>,
    /// `bitmap_flush_interval:` in ms (default 10000; 0 = only at close).
    pub bitmap_flush_interval_ms: u64,
    /// `allow_discards`: discarded blocks' tags are filled with 0xF6 and accepted on read.
    pub allow_discards: bool,
    /// `recalculate`: (re)compute tags from `recalc_sector` on, in the background.
    pub recalculate: bool,
    /// `journal_mac:` (keyed already).
    pub journal_mac: Option<TagHash>,
    /// `journal_crypt:` (ctr(aes) or cbc(aes); not in mode B).
    pub journal_crypt: Option<JournalCryptSpec>,
    /// Refuse writes.
    pub read_only: bool,
    /// A write covering whole metadata buffers does not read them first. Off: always
    /// read-modify-write (to measure what it costs).
    pub skip_rmw: bool,
    /// Where tags are computed.
    pub hash_mode: HashMode,
    /// Metadata buffer cache size in bytes.
    pub metadata_cache_bytes: usize,
    /// Most threads a journal commit or copy-out writes on (0: sized by the pieces, up to
    /// 32; 1: every write from the thread that commits or copies out, no I/O threads).
    pub journal_io_threads: usize,
}

impl IntegrityConfig {
    /// integritysetup's defaults for `mode` with `internal_hash` (crc32c if you pass
    /// `TagHash::new("crc32c", None)`).
    pub fn new(mode: Mode, internal_hash: Option<TagHash>) -> Self {
        IntegrityConfig {
            mode,
            internal_hash,
            tag_size: None,
            block_size: 512,
            start: 0,
            buffer_sectors: formats::integrity::layout::DEFAULT_BUFFER_SECTORS,
            journal_watermark: 50,
            commit_time_ms: 10_000,
            sectors_per_bit: None,
            bitmap_flush_interval_ms: 10_000,
            allow_discards: false,
            recalculate: false,
            journal_mac: None,
            journal_crypt: None,
            read_only: false,
            skip_rmw: true,
            hash_mode: HashMode::Auto,
            metadata_cache_bytes: 32 << 20,
            journal_io_threads: 0,
        }
    }
}

/// Why a target could not be opened or formatted.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum IntegrityError {
    /// I/O on the device below failed.
    #[error("I/O error while {what}")]
    Io {
        /// What was being done.
        what: &'static str,
        /// Cause.
        #[source]
        source: BlockError,
    },
    /// The superblock is missing, malformed, or does not match the options.
    #[error("invalid dm-integrity superblock")]
    Superblock(#[source] SuperblockError),
    /// The layout does not fit the device.
    #[error("dm-integrity layout does not fit the device")]
    Layout(#[source] LayoutError),
    /// The journal cannot be replayed (the kernel fails the device).
    #[error("dm-integrity journal is corrupt")]
    Journal(#[source] JournalError),
    /// A committed journal entry's tag does not match its data ("tag mismatch when replaying
    /// journal").
    #[error("tag mismatch when replaying the journal entry for sector {sector}")]
    ReplayTagMismatch {
        /// Logical sector of the entry.
        sector: u64,
    },
    /// `block_size` is not 512, 1024, 2048 or 4096.
    #[error("invalid dm-integrity options: block size {block_size} is not 512..4096")]
    BlockSize {
        /// The block size asked for.
        block_size: u32,
    },
    /// Neither a tag size nor an internal hash (whose digest size would be it) was given.
    #[error("invalid dm-integrity options: a tag size is needed without an internal hash")]
    TagSizeNeeded,
    /// An option that only works with an internal hash was given without one.
    #[error("invalid dm-integrity options: {option} needs an internal hash")]
    NeedsInternalHash {
        /// The option (`bitmap mode`, `allow_discards`).
        option: &'static str,
    },
    /// `journal_crypt` with mode B (the bitmap mode has no journal to encrypt).
    #[error("invalid dm-integrity options: journal_crypt is not supported in bitmap mode")]
    JournalCryptInBitmapMode,
    /// The `journal_crypt` key is not an AES key.
    #[error("invalid dm-integrity options: journal_crypt key of {key_len} bytes (16, 24 or 32)")]
    JournalCryptKey {
        /// Its length in bytes.
        key_len: usize,
    },
    /// The superblock, journal sections or metadata are not aligned to the device's logical
    /// block (a 4K-sector device needs 4K-aligned structures).
    #[error(
        "invalid dm-integrity options: the layout is not aligned to the device's {device_block}-byte blocks"
    )]
    MisalignedLayout {
        /// The device's logical block size.
        device_block: u64,
    },
    /// A grow would need a recalculation the kernel refuses for a keyed internal hash
    /// (`dm_integrity_disable_recalculate`): the new area must be wiped instead.
    #[error("Setting recalculate flag is not supported, you may consider using --wipe instead.")]
    RecalculateRefused,
    /// A background thread (commit timer, recalculation) could not be started.
    #[error("cannot start the dm-integrity {thread} thread")]
    Thread {
        /// Which thread.
        thread: &'static str,
        /// Cause.
        #[source]
        source: std::io::Error,
    },
}

pub(super) fn io(what: &'static str) -> impl FnOnce(BlockError) -> IntegrityError {
    move |source| IntegrityError::Io { what, source }
}

/// A snapshot of a target's state (`dmsetup status` plus engine counters).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct IntegrityStatus {
    /// Mode letter.
    pub mode: Mode,
    /// Reads that failed their tag check (after the re-read).
    pub mismatches: u64,
    /// Logical size in 512-byte sectors.
    pub provided_data_sectors: u64,
    /// `recalc_sector` while RECALCULATING.
    pub recalc_sector: Option<u64>,
    /// A metadata write failed: writes are refused until reopened.
    pub poisoned: bool,
    /// Tag buffers read to check tags.
    pub metadata_reads: u64,
    /// Tag buffers read only to modify part of them.
    pub rmw_reads: u64,
    /// Tag buffer (dirty range) writes.
    pub metadata_writes: u64,
    /// Journal commits (mode J).
    pub journal_commits: u64,
    /// Journal copy-out writes (mode J).
    pub journal_copyouts: u64,
    /// Blocks in the journal not yet copied out (mode J).
    pub journal_pending_blocks: u64,
    /// Regions an unclean stop left dirty, not recalculated yet (mode B, background).
    pub bitmap_regions_pending: u64,
}

impl fmt::Display for IntegrityStatus {
    /// `dmsetup status` INFO: `<mismatches> <provided_data_sectors> <recalc_sector|->`.
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{} {} ", self.mismatches, self.provided_data_sectors)?;
        match self.recalc_sector {
            Some(s) => write!(f, "{s}"),
            None => f.write_str("-"),
        }
    }
}
