//! The dm-integrity superblock: decode, validate, encode, the version rule and the MAC range.
//!
//! Kernel: `drivers/md/dm-integrity.c` (`struct superblock`, `sync_rw_sb`, `sb_set_version`,
//! `sb_mac`, the checks in `dm_integrity_ctr`); cryptsetup `lib/integrity/integrity.h`.
//! All integers are **little-endian**. The superblock sits at `start` (the table's
//! `reserved_sectors`; on the meta device when there is one) and owns `SB_SECTORS` = 8
//! sectors (4 KiB); the kernel reads and writes all 8 sectors, the struct is the first 64
//! bytes, the rest is zero when formatted.
//!
//! ```text
//!  off  size  field                       notes
//!  ---  ----  --------------------------  ---------------------------------------------------
//!    0     8  magic                       "integrt\0"
//!    8     1  version                     1..=5 (6 = inline mode, newer kernels only)
//!    9     1  log2_interleave_sectors     3..=31; 0 with a meta device
//!   10     2  integrity_tag_size          bytes per block (le16), 1..=255 on Linux 6.1
//!   12     4  journal_sections            le32, never 0 (0 only in inline mode, V6)
//!   16     8  provided_data_sectors       le64, 512-byte units; "userspace uses this value"
//!   24     4  flags                       le32, see [`SbFlags`]
//!   28     1  log2_sectors_per_block      0..=3 (512..4096-byte blocks)
//!   29     1  log2_blocks_per_bitmap_bit  V3 (bitmap mode); written at format in every mode
//!   30     2  pad
//!   32     8  recalc_sector               le64, V2 (meaningful while RECALCULATING)
//!   40     8  pad2
//!   48    16  salt                        V5 (FIXED_HMAC): random at format
//!   64   ...  zero
//!  512-m   m  superblock MAC              only with FIXED_HMAC and a journal_mac of m bytes:
//!                                         journal_mac(bytes [0, 512-m)), see [`sb_mac_ranges`]
//! ```
//!
//! What the kernel checks when it opens a superblock (`dm_integrity_ctr`), and where we
//! check it:
//!
//! | kernel check (error string)                                   | here                         |
//! |---------------------------------------------------------------|------------------------------|
//! | magic (else formats if the 4 KiB are zero: "not initialized") | [`Superblock::decode`]       |
//! | `!version \|\| version > 5` ("Unknown version")                | decode (0, ≥7), check (6)    |
//! | tag size ≠ table tag size                                     | [`Superblock::check`]        |
//! | log2_sectors_per_block ≠ table block size                     | check (decode: ≤ 3)          |
//! | journal_sections == 0 ("Corrupted superblock")                | decode                       |
//! | interleave out of 3..=31 (no meta dev) / ≠ 0 (meta dev)        | decode (0 or 3..=31), check  |
//! | HAVE_JOURNAL_MAC ≠ journal_mac given ("Journal mac mismatch") | check                        |
//! | superblock MAC (FIXED_HMAC + journal_mac, not in mode R)      | [`sb_mac_ranges`] (caller)   |
//!
//! `decode` refuses only what no table could ever accept; `check` compares against the
//! table the caller is about to use.
use std::ops::Range;

use super::{MAX_SECTORS_PER_BLOCK_LOG2, MAX_TAG_SIZE};

/// `"integrt\0"`.
pub const SB_MAGIC: [u8; 8] = *b"integrt\0";
/// The superblock area: 8 sectors.
pub const SB_SECTORS: u64 = 8;
/// Bytes of the superblock area.
pub const SB_AREA_BYTES: usize = SB_SECTORS as usize * 512;
/// Size of `struct superblock`.
pub const SB_STRUCT_BYTES: usize = 64;
/// `SALT_SIZE`.
pub const SALT_SIZE: usize = 16;
/// Newest version Linux 6.1 accepts.
pub const SB_VERSION_MAX_SUPPORTED: u8 = 5;
/// Inline mode (Linux 6.11+); decoded, never supported here.
pub const SB_VERSION_INLINE: u8 = 6;
/// Smallest `log2_interleave_sectors` without a meta device (`MIN_LOG2_INTERLEAVE_SECTORS`).
pub const MIN_LOG2_INTERLEAVE_SECTORS: u8 = 3;
/// Largest `log2_interleave_sectors` (`MAX_LOG2_INTERLEAVE_SECTORS`).
pub const MAX_LOG2_INTERLEAVE_SECTORS: u8 = 31;

// Offsets, derived from the table above.
const MAGIC_OFF: usize = 0;
const VERSION_OFF: usize = MAGIC_OFF + 8;
const LOG2_INTERLEAVE_OFF: usize = VERSION_OFF + 1;
const TAG_SIZE_OFF: usize = LOG2_INTERLEAVE_OFF + 1;
const JOURNAL_SECTIONS_OFF: usize = TAG_SIZE_OFF + 2;
const PROVIDED_OFF: usize = JOURNAL_SECTIONS_OFF + 4;
const FLAGS_OFF: usize = PROVIDED_OFF + 8;
const LOG2_SPB_OFF: usize = FLAGS_OFF + 4;
const LOG2_BPBB_OFF: usize = LOG2_SPB_OFF + 1;
const PAD_OFF: usize = LOG2_BPBB_OFF + 1;
const RECALC_OFF: usize = PAD_OFF + 2;
const PAD2_OFF: usize = RECALC_OFF + 8;
const SALT_OFF: usize = PAD2_OFF + 8;
const _: () = assert!(SALT_OFF + SALT_SIZE == SB_STRUCT_BYTES);

/// Superblock flags (`SB_FLAG_*`). Unknown bits are kept as they are.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Default)]
pub struct SbFlags(pub u32);

impl SbFlags {
    /// `SB_FLAG_HAVE_JOURNAL_MAC`: the table has `journal_mac`; journal sectors hold 8 MAC bytes.
    pub const HAVE_JOURNAL_MAC: u32 = 0x1;
    /// `SB_FLAG_RECALCULATING` (V2): tags from `recalc_sector` on are being recomputed.
    pub const RECALCULATING: u32 = 0x2;
    /// `SB_FLAG_DIRTY_BITMAP` (V3): bitmap mode is (or was, uncleanly) active; the journal area
    /// holds the dirty bitmap, not a journal.
    pub const DIRTY_BITMAP: u32 = 0x4;
    /// `SB_FLAG_FIXED_PADDING` (V4): tag runs padded to 4 KiB instead of 128 KiB.
    pub const FIXED_PADDING: u32 = 0x8;
    /// `SB_FLAG_FIXED_HMAC` (V5): the salt is mixed into tags and journal MACs; the superblock
    /// carries a MAC when there is a journal_mac.
    pub const FIXED_HMAC: u32 = 0x10;
    /// `SB_FLAG_INLINE` (V6, Linux 6.11+): tags in the device's PI metadata. Unsupported here.
    pub const INLINE: u32 = 0x20;
    /// Every flag this module knows.
    pub const KNOWN: u32 = 0x3f;

    /// True when every bit of `bit` is set.
    pub fn has(self, bit: u32) -> bool {
        self.0 & bit == bit
    }
    /// Sets or clears `bit`.
    pub fn set(&mut self, bit: u32, on: bool) {
        if on {
            self.0 |= bit;
        } else {
            self.0 &= !bit;
        }
    }
    /// The names integritysetup prints (`flags ...` line), in bit order.
    pub fn names(self) -> Vec<&'static str> {
        const NAMES: [(u32, &str); 6] = [
            (SbFlags::HAVE_JOURNAL_MAC, "have_journal_mac"),
            (SbFlags::RECALCULATING, "recalculating"),
            (SbFlags::DIRTY_BITMAP, "dirty_bitmap"),
            (SbFlags::FIXED_PADDING, "fix_padding"),
            (SbFlags::FIXED_HMAC, "fix_hmac"),
            (SbFlags::INLINE, "inline"),
        ];
        NAMES.iter().filter(|(b, _)| self.has(*b)).map(|(_, n)| *n).collect()
    }
}

/// The decoded superblock, with the kernel's field names.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub struct Superblock {
    /// 1..=6; recomputed by the kernel on every write, see [`sb_set_version`].
    pub version: u8,
    /// log2 of the sectors per interleaved data area; 0 with a meta device.
    pub log2_interleave_sectors: u8,
    /// Tag bytes per block.
    pub integrity_tag_size: u16,
    /// Number of journal sections (also sizes the bitmap area in mode B).
    pub journal_sections: u32,
    /// Logical size in 512-byte sectors, as last written by the kernel.
    pub provided_data_sectors: u64,
    /// `SB_FLAG_*`.
    pub flags: SbFlags,
    /// log2(block size / 512), 0..=3.
    pub log2_sectors_per_block: u8,
    /// V3: log2 of the blocks one dirty-bitmap bit covers.
    pub log2_blocks_per_bitmap_bit: u8,
    /// V2: first sector not yet recalculated (meaningful with RECALCULATING).
    pub recalc_sector: u64,
    /// V5: salt mixed into tags and journal MACs when FIXED_HMAC is set.
    pub salt: [u8; SALT_SIZE],
}

/// Why a superblock is refused. One variant per malformation; `Display` names the field.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[non_exhaustive]
pub enum SuperblockError {
    /// Fewer than 64 bytes given.
    #[error("superblock truncated: {len} bytes, need {SB_STRUCT_BYTES}")]
    TooShort {
        /// Bytes given.
        len: usize,
    },
    /// The 4 KiB area is all zero: a device the kernel would format on first open.
    #[error("no superblock: the superblock area is all zero (device not formatted)")]
    Unformatted,
    /// Magic is not `"integrt\0"` and the area is not zero ("The device is not initialized").
    #[error("bad superblock magic")]
    BadMagic,
    /// Version 0 or above 6 ("Unknown version").
    #[error("unknown superblock version {version}")]
    UnknownVersion {
        /// The version byte.
        version: u8,
    },
    /// Version 6 or the INLINE flag: inline mode (Linux 6.11+), which we do not implement and
    /// which Linux 6.1 refuses.
    #[error("inline-mode superblock (version {version}) is not supported")]
    InlineUnsupported {
        /// The version byte.
        version: u8,
    },
    /// `integrity_tag_size` is 0 (the kernel refuses a table tag size of 0).
    #[error("integrity_tag_size is 0")]
    ZeroTagSize,
    /// `integrity_tag_size` above `MAX_TAG_SIZE` (255 on Linux 6.1).
    #[error("integrity_tag_size {tag_size} exceeds {MAX_TAG_SIZE}")]
    TagSizeTooLarge {
        /// The field.
        tag_size: u16,
    },
    /// `log2_sectors_per_block` above 3 (block size above 4096).
    #[error("log2_sectors_per_block {value} out of range 0..=3")]
    BadLog2SectorsPerBlock {
        /// The field.
        value: u8,
    },
    /// `journal_sections` is 0 ("Corrupted superblock, journal_sections is 0").
    #[error("journal_sections is 0")]
    ZeroJournalSections,
    /// `log2_interleave_sectors` neither 0 (meta device) nor 3..=31.
    #[error("log2_interleave_sectors {value} out of range")]
    BadLog2Interleave {
        /// The field.
        value: u8,
    },
    /// `log2_blocks_per_bitmap_bit + log2_sectors_per_block` does not fit a 64-bit shift.
    #[error("log2_blocks_per_bitmap_bit {value} out of range")]
    BadLog2BlocksPerBitmapBit {
        /// The field.
        value: u8,
    },
    /// Table tag size differs ("Tag size doesn't match the information in superblock").
    #[error("tag size {table} does not match the superblock's {superblock}")]
    TagSizeMismatch {
        /// From the table / options.
        table: u32,
        /// From the superblock.
        superblock: u16,
    },
    /// Table block size differs ("Block size doesn't match the information in superblock").
    #[error("block size {table} does not match the superblock's {superblock}")]
    BlockSizeMismatch {
        /// From the table / options, bytes.
        table: u32,
        /// From the superblock, bytes.
        superblock: u32,
    },
    /// Interleave must be 0 with a meta device and 3..=31 without.
    #[error("log2_interleave_sectors {value} invalid {}", if *meta_device { "with a meta device" } else { "without a meta device" })]
    InterleaveMismatch {
        /// The field.
        value: u8,
        /// Whether the table has a meta device.
        meta_device: bool,
    },
    /// HAVE_JOURNAL_MAC set without a journal_mac, or clear with one ("Journal mac mismatch").
    #[error("journal MAC mismatch: superblock flag {flag}, table journal_mac {table}")]
    JournalMacMismatch {
        /// The superblock flag.
        flag: bool,
        /// Whether the table has journal_mac.
        table: bool,
    },
    /// The journal_mac digest does not fit beside the struct in sector 0 ("digest is too long").
    #[error("journal_mac digest of {size} bytes is too long for the superblock MAC")]
    MacTooLong {
        /// Digest size.
        size: usize,
    },
    /// The superblock MAC does not verify ("superblock mac", -EILSEQ).
    #[error("superblock MAC mismatch")]
    MacMismatch,
}

/// What the caller is about to open the superblock with (the parts of a table line the
/// kernel compares).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct SbCheck {
    /// Tag size the table uses (`tag_size`, or the internal hash's digest size for `-`).
    pub tag_size: u32,
    /// Block size in bytes (`block_size:`, default 512).
    pub block_size: u32,
    /// Whether a `meta_device:` is given.
    pub meta_device: bool,
    /// Whether a `journal_mac:` is given.
    pub journal_mac: bool,
}

fn le16(b: &[u8], off: usize) -> u16 {
    u16::from_le_bytes([b[off], b[off + 1]])
}
fn le32(b: &[u8], off: usize) -> u32 {
    let mut a = [0u8; 4];
    a.copy_from_slice(&b[off..off + 4]);
    u32::from_le_bytes(a)
}
fn le64(b: &[u8], off: usize) -> u64 {
    let mut a = [0u8; 8];
    a.copy_from_slice(&b[off..off + 8]);
    u64::from_le_bytes(a)
}

impl Superblock {
    /// Decodes and validates what no table could accept. `bytes` is the superblock area
    /// (at least the 64-byte struct; pass the whole 4 KiB to tell "unformatted" from
    /// "bad magic"). Never panics.
    pub fn decode(bytes: &[u8]) -> Result<Self, SuperblockError> {
        if bytes.len() < SB_STRUCT_BYTES {
            return Err(SuperblockError::TooShort { len: bytes.len() });
        }
        if bytes[MAGIC_OFF..MAGIC_OFF + 8] != SB_MAGIC {
            if bytes.iter().all(|&b| b == 0) {
                return Err(SuperblockError::Unformatted);
            }
            return Err(SuperblockError::BadMagic);
        }
        let version = bytes[VERSION_OFF];
        if version == 0 || version > SB_VERSION_INLINE {
            return Err(SuperblockError::UnknownVersion { version });
        }
        let log2_sectors_per_block = bytes[LOG2_SPB_OFF];
        let integrity_tag_size = le16(bytes, TAG_SIZE_OFF);
        let journal_sections = le32(bytes, JOURNAL_SECTIONS_OFF);
        let flags = SbFlags(le32(bytes, FLAGS_OFF));
        let log2_interleave_sectors = bytes[LOG2_INTERLEAVE_OFF];
        let log2_blocks_per_bitmap_bit = bytes[LOG2_BPBB_OFF];
        let inline = version == SB_VERSION_INLINE || flags.has(SbFlags::INLINE);
        if integrity_tag_size == 0 {
            return Err(SuperblockError::ZeroTagSize);
        }
        if integrity_tag_size as u32 > MAX_TAG_SIZE && !inline {
            return Err(SuperblockError::TagSizeTooLarge { tag_size: integrity_tag_size });
        }
        if log2_sectors_per_block > MAX_SECTORS_PER_BLOCK_LOG2 {
            return Err(SuperblockError::BadLog2SectorsPerBlock { value: log2_sectors_per_block });
        }
        if journal_sections == 0 && !inline {
            return Err(SuperblockError::ZeroJournalSections);
        }
        if log2_interleave_sectors != 0
            && !(MIN_LOG2_INTERLEAVE_SECTORS..=MAX_LOG2_INTERLEAVE_SECTORS).contains(&log2_interleave_sectors)
        {
            return Err(SuperblockError::BadLog2Interleave { value: log2_interleave_sectors });
        }
        if log2_blocks_per_bitmap_bit as u32 + log2_sectors_per_block as u32 >= 64 {
            return Err(SuperblockError::BadLog2BlocksPerBitmapBit { value: log2_blocks_per_bitmap_bit });
        }
        let mut salt = [0u8; SALT_SIZE];
        salt.copy_from_slice(&bytes[SALT_OFF..SALT_OFF + SALT_SIZE]);
        Ok(Superblock {
            version,
            log2_interleave_sectors,
            integrity_tag_size,
            journal_sections,
            provided_data_sectors: le64(bytes, PROVIDED_OFF),
            flags,
            log2_sectors_per_block,
            log2_blocks_per_bitmap_bit,
            recalc_sector: le64(bytes, RECALC_OFF),
            salt,
        })
    }

    /// The kernel's open-time checks against the table it is opened with
    /// (`dm_integrity_ctr`), plus "inline is unsupported".
    pub fn check(&self, table: &SbCheck) -> Result<(), SuperblockError> {
        if self.is_inline() {
            return Err(SuperblockError::InlineUnsupported { version: self.version });
        }
        if self.integrity_tag_size as u32 != table.tag_size {
            return Err(SuperblockError::TagSizeMismatch {
                table: table.tag_size,
                superblock: self.integrity_tag_size,
            });
        }
        if self.block_size() != table.block_size {
            return Err(SuperblockError::BlockSizeMismatch {
                table: table.block_size,
                superblock: self.block_size(),
            });
        }
        let interleave_ok = if table.meta_device {
            self.log2_interleave_sectors == 0
        } else {
            (MIN_LOG2_INTERLEAVE_SECTORS..=MAX_LOG2_INTERLEAVE_SECTORS)
                .contains(&self.log2_interleave_sectors)
        };
        if !interleave_ok {
            return Err(SuperblockError::InterleaveMismatch {
                value: self.log2_interleave_sectors,
                meta_device: table.meta_device,
            });
        }
        let flag = self.flags.has(SbFlags::HAVE_JOURNAL_MAC);
        if flag != table.journal_mac {
            return Err(SuperblockError::JournalMacMismatch { flag, table: table.journal_mac });
        }
        Ok(())
    }

    /// Encodes into a full 4 KiB superblock area (struct, then zeros). The MAC, if any, is
    /// the caller's to fill in (see [`sb_mac_ranges`]).
    pub fn encode(&self) -> [u8; SB_AREA_BYTES] {
        let mut b = [0u8; SB_AREA_BYTES];
        self.encode_into(&mut b);
        b
    }

    /// Writes the 64-byte struct into `area[..64]`, leaving the rest of `area` untouched
    /// (the kernel keeps the other bytes of its 4 KiB buffer, including a MAC, across
    /// rewrites). Panics if `area` is shorter than 64 bytes.
    pub fn encode_into(&self, area: &mut [u8]) {
        let b = &mut area[..SB_STRUCT_BYTES];
        b[MAGIC_OFF..MAGIC_OFF + 8].copy_from_slice(&SB_MAGIC);
        b[VERSION_OFF] = self.version;
        b[LOG2_INTERLEAVE_OFF] = self.log2_interleave_sectors;
        b[TAG_SIZE_OFF..TAG_SIZE_OFF + 2].copy_from_slice(&self.integrity_tag_size.to_le_bytes());
        b[JOURNAL_SECTIONS_OFF..JOURNAL_SECTIONS_OFF + 4]
            .copy_from_slice(&self.journal_sections.to_le_bytes());
        b[PROVIDED_OFF..PROVIDED_OFF + 8].copy_from_slice(&self.provided_data_sectors.to_le_bytes());
        b[FLAGS_OFF..FLAGS_OFF + 4].copy_from_slice(&self.flags.0.to_le_bytes());
        b[LOG2_SPB_OFF] = self.log2_sectors_per_block;
        b[LOG2_BPBB_OFF] = self.log2_blocks_per_bitmap_bit;
        b[PAD_OFF..PAD_OFF + 2].fill(0);
        b[RECALC_OFF..RECALC_OFF + 8].copy_from_slice(&self.recalc_sector.to_le_bytes());
        b[PAD2_OFF..PAD2_OFF + 8].fill(0);
        b[SALT_OFF..SALT_OFF + SALT_SIZE].copy_from_slice(&self.salt);
    }

    /// Block size in bytes.
    pub fn block_size(&self) -> u32 {
        512u32 << self.log2_sectors_per_block.min(MAX_SECTORS_PER_BLOCK_LOG2)
    }

    /// Sectors per block.
    pub fn sectors_per_block(&self) -> u32 {
        1u32 << self.log2_sectors_per_block.min(MAX_SECTORS_PER_BLOCK_LOG2)
    }

    /// Inline mode (V6 or the INLINE flag): decoded but not supported.
    pub fn is_inline(&self) -> bool {
        self.version == SB_VERSION_INLINE || self.flags.has(SbFlags::INLINE)
    }

    /// The salt, when FIXED_HMAC says tags and journal MACs use it.
    pub fn hmac_salt(&self) -> Option<&[u8; SALT_SIZE]> {
        self.flags.has(SbFlags::FIXED_HMAC).then_some(&self.salt)
    }

    /// Recomputes `version` as the kernel does before every superblock write
    /// ([`sb_set_version`]).
    pub fn set_version(&mut self, mode: Mode, meta_device: bool) {
        self.version = sb_set_version(self.flags, mode, meta_device);
    }

    /// Marks the sectors from `from` on (the old `provided_data_sectors` of a device about
    /// to grow) for recalculation: RECALCULATING set, `recalc_sector` moved back to `from`
    /// unless a recalculation already stands before it. What the kernel does at the next
    /// resume with such a superblock (`dm_integrity_resume`): recalculation is queued from
    /// `recalc_sector`, reads at or past it skip the tag check, and in mode B the bits from
    /// there to the end are set. Returns whether anything changed.
    ///
    /// integritysetup 2.6.1's `resize` without `--wipe` reloads the table with `recalculate`
    /// after the kernel grew the device: the kernel then sets RECALCULATING with
    /// `recalc_sector` 0 (`dm_integrity_ctr`) and recalculates the whole device. Starting at
    /// the old end instead leaves the old data's tags as they are (a corrupted old block
    /// still reads as an error) and writes the same superblock fields the kernel reads.
    pub fn mark_grow(&mut self, from: u64) -> bool {
        let recalculating = self.flags.has(SbFlags::RECALCULATING);
        if recalculating && self.recalc_sector <= from {
            return false;
        }
        self.flags.set(SbFlags::RECALCULATING, true);
        self.recalc_sector = from;
        true
    }

    /// The kernel's `dm_integrity_disable_recalculate`: whether a recalculation (RECALCULATING
    /// with `recalc_sector` before the end) is refused at open ("Recalculating with HMAC is
    /// disabled for security reasons"), given whether the table's internal hash and journal
    /// MAC are keyed, and `legacy_recalculate`. Without FIXED_HMAC any key refuses it; with
    /// FIXED_HMAC a keyed internal hash without a keyed journal MAC does.
    pub fn recalculate_refused(&self, keyed_hash: bool, keyed_journal_mac: bool, legacy: bool) -> bool {
        if legacy {
            return false;
        }
        if self.flags.has(SbFlags::FIXED_HMAC) {
            keyed_hash && !keyed_journal_mac
        } else {
            keyed_hash || keyed_journal_mac
        }
    }
}

/// The dm-integrity mode letter of the table line.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Mode {
    /// `J`: journaled writes.
    Journal,
    /// `B`: bitmap of dirty regions in the journal area.
    Bitmap,
    /// `D`: direct writes, no journal.
    Direct,
    /// `R`: recovery, read-only, no checks, no journal replay.
    Recovery,
}

impl Mode {
    /// The table letter.
    pub fn letter(self) -> char {
        match self {
            Mode::Journal => 'J',
            Mode::Bitmap => 'B',
            Mode::Direct => 'D',
            Mode::Recovery => 'R',
        }
    }
    /// Parses a table letter (`J`, `B`, `D`, `R`; Linux 6.1 has no `I`).
    pub fn from_letter(c: char) -> Option<Mode> {
        match c {
            'J' => Some(Mode::Journal),
            'B' => Some(Mode::Bitmap),
            'D' => Some(Mode::Direct),
            'R' => Some(Mode::Recovery),
            _ => None,
        }
    }
}

/// `sb_set_version`: the version the kernel writes, from the flags and the mode.
/// 6 if INLINE (newer kernels), else 5 if FIXED_HMAC, else 4 if FIXED_PADDING, else 3 in mode
/// B or with DIRTY_BITMAP, else 2 with a meta device or RECALCULATING, else 1.
///
/// Note that cryptsetup formats through a temporary device in mode `J`, so a legacy-padding
/// bitmap volume is version 1 until first opened in mode B.
pub fn sb_set_version(flags: SbFlags, mode: Mode, meta_device: bool) -> u8 {
    if flags.has(SbFlags::INLINE) {
        6
    } else if flags.has(SbFlags::FIXED_HMAC) {
        5
    } else if flags.has(SbFlags::FIXED_PADDING) {
        4
    } else if mode == Mode::Bitmap || flags.has(SbFlags::DIRTY_BITMAP) {
        3
    } else if meta_device || flags.has(SbFlags::RECALCULATING) {
        2
    } else {
        1
    }
}

/// The superblock MAC (`sb_mac`): with FIXED_HMAC and a journal_mac whose digest is
/// `mac_size` bytes, `mac = journal_mac(area[input])` is stored at `area[mac]`, where
/// `input = 0..512-mac_size` and `mac = 512-mac_size..512`. Fails when the digest would
/// overlap the struct (`sizeof(struct superblock) + size > 512`).
pub fn sb_mac_ranges(mac_size: usize) -> Result<(Range<usize>, Range<usize>), SuperblockError> {
    if SB_STRUCT_BYTES + mac_size > 512 {
        return Err(SuperblockError::MacTooLong { size: mac_size });
    }
    Ok((0..512 - mac_size, 512 - mac_size..512))
}

/// Verifies the superblock MAC with a caller-supplied MAC function (`mac(input) -> digest`).
/// The kernel skips this in mode R and when FIXED_HMAC or journal_mac is absent; so does the
/// caller.
pub fn verify_sb_mac(
    area: &[u8],
    mac_size: usize,
    mac: impl FnOnce(&[u8]) -> Vec<u8>,
) -> Result<(), SuperblockError> {
    let (input, stored) = sb_mac_ranges(mac_size)?;
    if area.len() < 512 {
        return Err(SuperblockError::TooShort { len: area.len() });
    }
    let digest = mac(&area[input]);
    if digest.len() < mac_size || digest[..mac_size] != area[stored] {
        return Err(SuperblockError::MacMismatch);
    }
    Ok(())
}

/// Writes the superblock MAC into `area` (the kernel's `sb_mac(ic, true)`).
pub fn write_sb_mac(
    area: &mut [u8],
    mac_size: usize,
    mac: impl FnOnce(&[u8]) -> Vec<u8>,
) -> Result<(), SuperblockError> {
    let (input, stored) = sb_mac_ranges(mac_size)?;
    if area.len() < 512 {
        return Err(SuperblockError::TooShort { len: area.len() });
    }
    let digest = mac(&area[input]);
    if digest.len() < mac_size {
        return Err(SuperblockError::MacTooLong { size: mac_size });
    }
    area[stored].copy_from_slice(&digest[..mac_size]);
    Ok(())
}

/// `integritysetup dump` (cryptsetup 2.6.1) text for this superblock, line for line:
///
/// ```text
/// Info for integrity device <name>.
/// superblock_version 5
/// log2_interleave_sectors 15
/// integrity_tag_size 4
/// journal_sections 5
/// provided_data_sectors 129160
/// sector_size 512
/// log2_blocks_per_bitmap 15
/// flags fix_padding fix_hmac
/// ```
/// (each flag name is followed by a space; `recalc_sector N` follows `provided_data_sectors`
/// when RECALCULATING is set — not yet checked against a real dump.)
pub fn dump_text(sb: &Superblock, device_name: &str) -> String {
    let mut s = format!("Info for integrity device {device_name}.\n");
    s += &format!("superblock_version {}\n", sb.version);
    s += &format!("log2_interleave_sectors {}\n", sb.log2_interleave_sectors);
    s += &format!("integrity_tag_size {}\n", sb.integrity_tag_size);
    s += &format!("journal_sections {}\n", sb.journal_sections);
    s += &format!("provided_data_sectors {}\n", sb.provided_data_sectors);
    if sb.version >= 2 && sb.flags.has(SbFlags::RECALCULATING) {
        s += &format!("recalc_sector {}\n", sb.recalc_sector);
    }
    s += &format!("sector_size {}\n", sb.block_size());
    s += &format!("log2_blocks_per_bitmap {}\n", sb.log2_blocks_per_bitmap_bit);
    s += "flags ";
    for n in sb.flags.names() {
        s += n;
        s.push(' ');
    }
    s.push('\n');
    s
}

#[cfg(test)]
mod grow_tests {
    use super::*;

    fn sb(flags: u32, recalc: u64) -> Superblock {
        Superblock {
            version: 5,
            log2_interleave_sectors: 15,
            integrity_tag_size: 4,
            journal_sections: 1,
            provided_data_sectors: 1000,
            flags: SbFlags(flags),
            log2_sectors_per_block: 0,
            log2_blocks_per_bitmap_bit: 0,
            recalc_sector: recalc,
            salt: [0; SALT_SIZE],
        }
    }

    #[test]
    fn mark_grow_sets_recalculating_at_the_old_end() {
        let mut s = sb(SbFlags::FIXED_PADDING, 0);
        assert!(s.mark_grow(1000));
        assert!(s.flags.has(SbFlags::RECALCULATING));
        assert_eq!(s.recalc_sector, 1000);
        // Already marked: nothing changes.
        assert!(!s.mark_grow(1000));
    }

    #[test]
    fn mark_grow_keeps_an_earlier_recalculation() {
        let mut s = sb(SbFlags::RECALCULATING, 200);
        assert!(!s.mark_grow(1000));
        assert_eq!(s.recalc_sector, 200);
        // A finished recalculation (at the old end or past it) moves back.
        let mut s = sb(SbFlags::RECALCULATING, 1000);
        assert!(!s.mark_grow(1000));
        let mut s = sb(SbFlags::RECALCULATING, 1200);
        assert!(s.mark_grow(1000));
        assert_eq!(s.recalc_sector, 1000);
    }

    #[test]
    fn recalculate_refused_is_the_kernels_rule() {
        let fixed = sb(SbFlags::FIXED_HMAC, 0);
        let legacy = sb(0, 0);
        assert!(!fixed.recalculate_refused(false, false, false));
        assert!(fixed.recalculate_refused(true, false, false));
        assert!(!fixed.recalculate_refused(true, true, false));
        assert!(!fixed.recalculate_refused(false, true, false));
        assert!(legacy.recalculate_refused(true, false, false));
        assert!(legacy.recalculate_refused(false, true, false));
        assert!(!legacy.recalculate_refused(false, false, false));
        assert!(!legacy.recalculate_refused(true, true, true));
    }
}
