//! dm-integrity on-disk format, sans-IO: the superblock, the device layout, the journal and
//! the bitmap, byte-compatible with Linux's `drivers/md/dm-integrity.c` (checked against
//! images written by Linux 6.1 in `testdata/integrity/`).
//!
//! ```text
//!                 ┌──────────────┐  decode/check/encode, version rule, MAC byte ranges
//!   sb bytes ────►│ superblock   │────────────────────────────────┐
//!                 └──────────────┘                                │
//!   DeviceParams ─────────────────►┌──────────┐                   ▼
//!   (device size, start, buffer…)  │ layout   │ provided_data_sectors, data_sector(L),
//!                                  └────┬─────┘ tag_location(L), journal/bitmap placement
//!                                       │
//!   journal bytes ─►┌─────────┐◄────────┘      ┌────────┐
//!                   │ journal │ entries,       │ bitmap │ bit ↔ region, dirty ranges
//!                   └─────────┘ commit ids,    └────────┘
//!                               replay plan
//! ```
//!
//! Nothing here reads a device or computes a hash: MACs (superblock, journal sections) are
//! computed by the caller from the byte ranges these functions return, or through a closure
//! they take; tags come from `sector_crypto::tag`. The engine (`targets::IntegrityTarget`)
//! does the I/O.
//!
//! Linux 6.1 is the reference. Newer kernels add inline mode (superblock version 6, flag
//! INLINE, `MAX_TAG_SIZE` 424): decoded here, refused by [`Superblock::check`].

pub mod bitmap;
pub mod journal;
pub mod layout;
pub mod superblock;

pub use bitmap::BitmapGeometry;
pub use journal::{
    CommitIds, EntryState, JournalEntry, JournalError, JournalGeometry, JournalResume, JournalView,
    ReplayEntry, ReplayPlan,
};
pub use layout::{DeviceParams, FormatParams, Layout, LayoutError, TagLocation};
pub use superblock::{sb_set_version, Mode, SbCheck, SbFlags, Superblock, SuperblockError};

/// `MAX_TAG_SIZE` in Linux 6.1 (newer kernels: 424); [`crate::limits::INTEGRITY_MAX_TAG_SIZE`].
pub const MAX_TAG_SIZE: u32 = crate::limits::INTEGRITY_MAX_TAG_SIZE;
/// log2(`MAX_SECTORS_PER_BLOCK`): blocks of at most 4096 bytes
/// ([`crate::limits::INTEGRITY_MAX_LOG2_SECTORS_PER_BLOCK`]).
pub const MAX_SECTORS_PER_BLOCK_LOG2: u8 = crate::limits::INTEGRITY_MAX_LOG2_SECTORS_PER_BLOCK;
/// `DISCARD_FILLER`: discarded blocks' tags are filled with this byte.
pub const DISCARD_FILLER: u8 = 0xf6;
