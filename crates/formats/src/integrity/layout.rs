//! Device layout: where the superblock, journal, tags and data live, reproduced literally
//! from the kernel (`calculate_journal_section_size`, `calculate_device_limits`,
//! `get_provided_data_sectors`, `initialize_superblock`, `get_area_and_offset`,
//! `get_data_sector`, `get_metadata_sector_and_offset`, and the sizing code of
//! `dm_integrity_ctr`), including its truncations.
//!
//! ```text
//!  without a meta device (all offsets in 512-byte sectors from the device start):
//!
//!  start                                         "initial_sectors" = 8 + section_sectors × sections
//!  │ SB (8) │ journal (or bitmap): journal_sections × journal_section_sectors │
//!  │ area 0: tags (metadata_run) │ data (interleave) │ area 1: tags │ data │ ... │ area n-1 │
//!
//!  metadata_run   = round_up(tag_size × (interleave / sectors_per_block), pad) / 512
//!                   pad = 4096 with FIXED_PADDING, 131072 (legacy) without
//!  data sector(L) = start + initial + a·interleave + (a+1)·metadata_run + o
//!                   a = L >> log2_interleave, o = L & (interleave-1)
//!  tag(L)         = bufio block  ms = (a·(interleave+metadata_run)) >> log2_buf
//!                                   + (b·tag_size) >> (9 + log2_buf),   b = o / sectors_per_block
//!                   offset in it mo = (b·tag_size) & (512·2^log2_buf − 1)
//!                   byte address    = (start + initial)·512 + ms·512·2^log2_buf + mo
//!
//!  with a meta device: data at sector L of the data device (no start, no areas); tags packed
//!  from (start + initial) on the meta device, which also holds SB and journal.
//! ```
//!
//! **The shift truncates.** `a·(interleave+metadata_run)` need not be a multiple of
//! `buffer_sectors` = 2^log2_buf. The kernel caps log2_buf to `ffs(metadata_run)`, which makes
//! it exact with FIXED_PADDING, but with legacy padding (metadata_run a multiple of 256) and
//! `interleave_sectors` below 128, area a's tags are addressed at
//! `floor(a·(interleave+metadata_run) / 128)·128`, i.e. inside an earlier area (for
//! interleave 8: area 1's tags land on area 0's data). The kernel really does this: the golden
//! image `crc32c-j-s512-legacy-il8` made by Linux 6.1 reads back with EIO. [`Layout`]
//! reproduces the kernel's addresses, not the intended ones.
use super::superblock::{SbFlags, Superblock, SB_SECTORS};
use super::{journal::JournalGeometry, MAX_TAG_SIZE};

/// `METADATA_PADDING_SECTORS`: the FIXED_PADDING unit (8 sectors = 4096 bytes); also the
/// legacy padding's shift (512 << 8 = 131072 bytes) and the slack demanded after the journal.
pub const METADATA_PADDING_SECTORS: u64 = 8;
/// `DEFAULT_INTERLEAVE_SECTORS`.
pub const DEFAULT_INTERLEAVE_SECTORS: u32 = 32768;
/// `DEFAULT_BUFFER_SECTORS`.
pub const DEFAULT_BUFFER_SECTORS: u32 = 128;
/// `DEFAULT_JOURNAL_SIZE_FACTOR`: default journal = device sectors >> 7.
pub const DEFAULT_JOURNAL_SIZE_FACTOR: u32 = 7;
/// `DEFAULT_MAX_JOURNAL_SECTORS` on 64-bit kernels.
pub const DEFAULT_MAX_JOURNAL_SECTORS: u64 = 131072;
/// `DEFAULT_SECTORS_PER_BITMAP_BIT`.
pub const DEFAULT_SECTORS_PER_BITMAP_BIT: u64 = 32768;
/// `BITMAP_BLOCK_SIZE`: the bitmap is kept in 4 KiB blocks.
pub const BITMAP_BLOCK_SIZE: u64 = 4096;

/// Why a layout cannot be built. The kernel reports most of these as "The device is too
/// small" / "Could not initialize superblock".
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[non_exhaustive]
pub enum LayoutError {
    /// No `provided_data_sectors` ≥ 8 fits (`get_provided_data_sectors` returned 0).
    #[error("device of {device_sectors} sectors is too small for any data")]
    TooSmall {
        /// Sectors of the device holding the metadata.
        device_sectors: u64,
    },
    /// The superblock's `provided_data_sectors` or journal does not fit the device
    /// (`calculate_device_limits` failed at open).
    #[error("layout does not fit the device of {device_sectors} sectors")]
    DoesNotFit {
        /// Sectors of the device holding the metadata.
        device_sectors: u64,
    },
    /// A device (data or meta) of more than 2^64 bytes: its byte addresses would not fit a
    /// u64 (only a caller-made `DeviceParams` can say so; a real device cannot be that big).
    #[error("device of {device_sectors} sectors is larger than 2^64 bytes")]
    TooLarge {
        /// The device's size in sectors.
        device_sectors: u64,
    },
    /// Tag size 0 or above 255.
    #[error("invalid tag size {0}")]
    BadTagSize(u32),
    /// Block size not one of 512, 1024, 2048, 4096.
    #[error("invalid block size {0}")]
    BadBlockSize(u32),
    /// `log2_interleave_sectors` below 3 without a meta device.
    #[error("log2_interleave_sectors {0} invalid without a meta device")]
    BadInterleave(u8),
    /// The superblock has no journal sections.
    #[error("journal_sections is 0")]
    NoJournal,
    /// The journal (`journal_sections` × section size) is larger than the engine holds in
    /// memory ([`crate::limits::INTEGRITY_MAX_JOURNAL_BYTES`]).
    #[error(
        "journal_sections = {sections} makes a journal of {bytes} bytes, more than the {} bytes sealdisk holds in memory",
        crate::limits::INTEGRITY_MAX_JOURNAL_BYTES
    )]
    JournalTooLarge {
        /// `journal_sections`.
        sections: u32,
        /// Journal bytes.
        bytes: u64,
    },
    /// The table maps more sectors than provided ("Not enough provided sectors for requested
    /// mapping size").
    #[error("table length {len} exceeds provided_data_sectors {provided}")]
    TooLong {
        /// Requested target length.
        len: u64,
        /// `provided_data_sectors`.
        provided: u64,
    },
}

/// The device-side inputs of the layout (what the kernel learns from the table and the
/// block devices, not from the superblock).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct DeviceParams {
    /// Size of the data device in 512-byte sectors (`bdev_nr_sectors`, the whole device: the
    /// kernel does not subtract `start`).
    pub data_device_sectors: u64,
    /// Size of the meta device, when there is one.
    pub meta_device_sectors: Option<u64>,
    /// Table `start` (`reserved_sectors`): where the superblock is.
    pub start: u64,
    /// Table `buffer_sectors:` (default 128; 0 means 1).
    pub buffer_sectors: u32,
    /// Table `sectors_per_bit:` (bitmap granularity; default 32768).
    pub sectors_per_bit: Option<u64>,
}

impl DeviceParams {
    /// Defaults for a device of `sectors` 512-byte sectors with no meta device.
    pub fn new(sectors: u64) -> Self {
        DeviceParams {
            data_device_sectors: sectors,
            meta_device_sectors: None,
            start: 0,
            buffer_sectors: DEFAULT_BUFFER_SECTORS,
            sectors_per_bit: None,
        }
    }
    fn meta_sectors(&self) -> u64 {
        self.meta_device_sectors.unwrap_or(self.data_device_sectors)
    }

    /// Every sector of both devices has a byte address that fits a u64, so the layout's
    /// `sector * 512` never overflows (everything it places lies inside a device).
    fn check_addressable(&self) -> Result<(), LayoutError> {
        for device_sectors in [self.data_device_sectors, self.meta_sectors()] {
            if device_sectors > u64::MAX >> 9 {
                return Err(LayoutError::TooLarge { device_sectors });
            }
        }
        Ok(())
    }
}

/// What `initialize_superblock` needs beyond the device: the table options that shape the
/// format.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct FormatParams {
    /// Tag bytes per block (1..=255).
    pub tag_size: u32,
    /// Block size in bytes: 512, 1024, 2048 or 4096.
    pub block_size: u32,
    /// Table `journal_sectors:` (0 → 1); `None` for the default
    /// `min(131072, data_device_sectors >> 7)`.
    pub journal_sectors: Option<u32>,
    /// Table `interleave_sectors:` (default 32768; 0 also means the default); rounded down to a
    /// power of two and clamped to 2^3..=2^31.
    pub interleave_sectors: u32,
    /// `fix_padding` (cryptsetup's default; off in the bare kernel).
    pub fix_padding: bool,
    /// `fix_hmac` *and* an internal_hash or journal_mac: sets FIXED_HMAC and stores `salt`.
    pub fix_hmac: bool,
    /// The random salt (used only when `fix_hmac`).
    pub salt: [u8; 16],
    /// A `journal_mac:` is configured (sets HAVE_JOURNAL_MAC).
    pub journal_mac: bool,
}

impl FormatParams {
    /// cryptsetup's defaults for `tag_size`/`block_size`: fix_padding and fix_hmac on, default
    /// interleave and journal size, no journal MAC, zero salt.
    pub fn new(tag_size: u32, block_size: u32) -> Self {
        FormatParams {
            tag_size,
            block_size,
            journal_sectors: None,
            interleave_sectors: DEFAULT_INTERLEAVE_SECTORS,
            fix_padding: true,
            fix_hmac: true,
            salt: [0; 16],
            journal_mac: false,
        }
    }
}

fn log2_block(block_size: u32) -> Result<u8, LayoutError> {
    match block_size {
        512 => Ok(0),
        1024 => Ok(1),
        2048 => Ok(2),
        4096 => Ok(3),
        b => Err(LayoutError::BadBlockSize(b)),
    }
}

/// The kernel's `__fls`: index of the highest set bit (`x` ≠ 0).
fn fls_index(x: u64) -> u32 {
    63 - x.leading_zeros()
}

/// Everything `calculate_device_limits` derives for one `provided_data_sectors`.
#[derive(Debug, Clone, Copy)]
struct Limits {
    initial_sectors: u32,
    metadata_run: u32,
    log2_metadata_run: i8,
}

/// Inputs of `calculate_device_limits` that the format-time searches vary.
#[derive(Debug, Clone, Copy)]
struct LimitInputs {
    journal: JournalGeometry,
    journal_sections: u32,
    log2_interleave: u8,
    log2_spb: u8,
    tag_size: u32,
    fixed_padding: bool,
    start: u64,
    meta_device: bool,
    meta_device_sectors: u64,
    log2_buffer_sectors: u8,
}

/// `calculate_device_limits` for a candidate `provided` (sectors). `Err(())` is the kernel's
/// `-EINVAL`.
fn device_limits(inp: &LimitInputs, provided: u64) -> Result<Limits, ()> {
    let initial = SB_SECTORS + inp.journal.section_sectors as u64 * inp.journal_sections as u64;
    if initial + METADATA_PADDING_SECTORS >= inp.meta_device_sectors || initial > u32::MAX as u64 {
        return Err(());
    }
    if !inp.meta_device {
        let padding: u64 = if inp.fixed_padding {
            METADATA_PADDING_SECTORS << 9
        } else {
            1u64 << 9 << METADATA_PADDING_SECTORS
        };
        let tags = (inp.tag_size as u64) << (inp.log2_interleave - inp.log2_spb);
        // `ic->metadata_run` is an unsigned int.
        let metadata_run = ((tags.div_ceil(padding) * padding) >> 9) as u32;
        let log2_metadata_run = if metadata_run & metadata_run.wrapping_sub(1) == 0 {
            metadata_run.trailing_zeros() as i8
        } else {
            -1
        };
        let limits = Limits { initial_sectors: initial as u32, metadata_run, log2_metadata_run };
        let last = provided.wrapping_sub(1);
        let (area, offset) = area_and_offset(inp.log2_interleave, false, last);
        let last_sector = data_sector_of(&limits, inp.log2_interleave, inp.start, false, area, offset);
        if last_sector < inp.start || last_sector >= inp.meta_device_sectors {
            return Err(());
        }
        Ok(limits)
    } else {
        let meta_size = (provided >> inp.log2_spb).wrapping_mul(inp.tag_size as u64);
        let buf_bytes_log2 = inp.log2_buffer_sectors as u32 + 9;
        let meta_size = (meta_size.wrapping_add((1u64 << buf_bytes_log2) - 1) >> buf_bytes_log2)
            << inp.log2_buffer_sectors;
        let end = initial.wrapping_add(meta_size);
        if end < initial || end > inp.meta_device_sectors {
            return Err(());
        }
        Ok(Limits { initial_sectors: initial as u32, metadata_run: 1, log2_metadata_run: 0 })
    }
}

/// The journal is allocated whole by the engine: refuse one above
/// [`crate::limits::INTEGRITY_MAX_JOURNAL_BYTES`] before anything is sized by it.
fn check_journal_size(journal: &JournalGeometry, sections: u32) -> Result<(), LayoutError> {
    let bytes = u64::from(sections) * journal.section_sectors as u64 * 512;
    if bytes > crate::limits::INTEGRITY_MAX_JOURNAL_BYTES {
        return Err(LayoutError::JournalTooLarge { sections, bytes });
    }
    Ok(())
}

/// `get_area_and_offset`.
fn area_and_offset(log2_interleave: u8, meta_device: bool, data_sector: u64) -> (u64, u64) {
    if meta_device {
        (0, data_sector)
    } else {
        let area = data_sector >> log2_interleave;
        // `(unsigned int)data_sector & ((1U << log2_interleave) - 1)`
        let mask = (1u32 << log2_interleave).wrapping_sub(1);
        (area, ((data_sector as u32) & mask) as u64)
    }
}

/// `get_data_sector` (wrapping, as `sector_t` arithmetic does).
fn data_sector_of(
    l: &Limits,
    log2_interleave: u8,
    start: u64,
    meta_device: bool,
    area: u64,
    offset: u64,
) -> u64 {
    if meta_device {
        return offset;
    }
    let mut r = area << log2_interleave;
    if l.log2_metadata_run >= 0 {
        r = r.wrapping_add((area.wrapping_add(1)) << l.log2_metadata_run);
    } else {
        r = r.wrapping_add((area.wrapping_add(1)).wrapping_mul(l.metadata_run as u64));
    }
    r.wrapping_add(l.initial_sectors as u64).wrapping_add(offset).wrapping_add(start)
}

/// `get_provided_data_sectors`: without a meta device, the greedy bit search from the top bit
/// of the device size down to bit 3, keeping each bit if `calculate_device_limits` still
/// passes (so the result is a multiple of 8 sectors, and not always the true maximum); with
/// one, the data device size rounded down to the block size.
fn provided_data_sectors(inp: &LimitInputs, data_device_sectors: u64) -> u64 {
    if inp.meta_device {
        return data_device_sectors & !((1u64 << inp.log2_spb) - 1);
    }
    let mut provided = 0u64;
    if inp.meta_device_sectors == 0 {
        return 0;
    }
    let top = fls_index(inp.meta_device_sectors);
    let mut bit = top as i32;
    while bit >= 3 {
        let prev = provided;
        provided |= 1u64 << bit;
        if device_limits(inp, provided).is_err() {
            provided = prev;
        }
        bit -= 1;
    }
    provided
}

/// The resolved layout of an opened (or just formatted) volume: the kernel's
/// `dm_integrity_c` geometry after `dm_integrity_ctr`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Layout {
    /// Table `start`.
    pub start: u64,
    /// Whether tags, journal and superblock are on a separate meta device.
    pub meta_device: bool,
    /// Tag bytes per block.
    pub tag_size: u32,
    /// log2(block / 512).
    pub log2_sectors_per_block: u8,
    /// log2(interleave_sectors); 0 with a meta device.
    pub log2_interleave_sectors: u8,
    /// Journal geometry (entry and section sizes).
    pub journal: JournalGeometry,
    /// Number of journal sections.
    pub journal_sections: u32,
    /// `ic->provided_data_sectors`: **recomputed from the device size at every open**
    /// (the superblock's copy is rewritten by `dm_integrity_resume` when it differs).
    pub provided_data_sectors: u64,
    /// `SB_SECTORS` + journal: sectors before area 0 (relative to `start`).
    pub initial_sectors: u32,
    /// Tag sectors at the head of each area (1 with a meta device).
    pub metadata_run: u32,
    /// log2(metadata_run) if it is a power of two, else -1.
    pub log2_metadata_run: i8,
    /// log2 of the dm-bufio block in sectors, after the cap to `ffs(metadata_run)`.
    pub log2_buffer_sectors: u8,
    /// log2 of blocks per dirty-bitmap bit, as computed at this open (mode B uses it; the
    /// superblock's copy is what the bitmap on disk was written with).
    pub log2_blocks_per_bitmap_bit: u8,
    /// Number of 4 KiB bitmap blocks (mode B).
    pub n_bitmap_blocks: u32,
}

/// A tag's place: the kernel's bufio block and offset, and the absolute byte address on the
/// metadata device (data device without a meta device).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct TagLocation {
    /// dm-bufio block index (blocks of `buffer_sectors`, counted from `start + initial_sectors`).
    pub buffer_index: u64,
    /// Byte offset in that block.
    pub offset_in_buffer: u32,
    /// `(start + initial_sectors)·512 + buffer_index·buffer_bytes + offset_in_buffer`. The tag
    /// occupies `tag_size` contiguous bytes from here (a tag crossing a bufio block continues
    /// at the next block's offset 0, which is the next byte).
    pub byte_address: u64,
}

impl Layout {
    /// The layout of an existing volume: `dm_integrity_ctr` from the superblock on.
    /// `sb` must have passed [`Superblock::check`].
    pub fn open(sb: &Superblock, dev: &DeviceParams) -> Result<Layout, LayoutError> {
        dev.check_addressable()?;
        let tag_size = sb.integrity_tag_size as u32;
        if tag_size == 0 || tag_size > MAX_TAG_SIZE {
            return Err(LayoutError::BadTagSize(tag_size));
        }
        if sb.log2_sectors_per_block > 3 {
            return Err(LayoutError::BadBlockSize(sb.block_size()));
        }
        if sb.journal_sections == 0 {
            return Err(LayoutError::NoJournal);
        }
        if !meta_device_of(dev) && sb.log2_interleave_sectors < super::superblock::MIN_LOG2_INTERLEAVE_SECTORS
        {
            return Err(LayoutError::BadInterleave(sb.log2_interleave_sectors));
        }
        let journal = JournalGeometry::new(
            tag_size,
            sb.log2_sectors_per_block,
            sb.flags.has(SbFlags::HAVE_JOURNAL_MAC),
        );
        check_journal_size(&journal, sb.journal_sections)?;
        let meta_device = dev.meta_device_sectors.is_some();
        let buffer_sectors = if dev.buffer_sectors == 0 { 1 } else { dev.buffer_sectors };
        let mut inp = LimitInputs {
            journal,
            journal_sections: sb.journal_sections,
            log2_interleave: sb.log2_interleave_sectors,
            log2_spb: sb.log2_sectors_per_block,
            tag_size,
            fixed_padding: sb.flags.has(SbFlags::FIXED_PADDING),
            start: dev.start,
            meta_device,
            meta_device_sectors: dev.meta_sectors(),
            log2_buffer_sectors: (fls_index(buffer_sectors as u64) as u8).min(31 - 9),
        };
        let provided = provided_data_sectors(&inp, dev.data_device_sectors);
        if provided == 0 {
            return Err(LayoutError::TooSmall { device_sectors: inp.meta_device_sectors });
        }
        let limits = loop {
            match device_limits(&inp, provided) {
                Ok(l) => break l,
                Err(()) if meta_device && inp.log2_buffer_sectors > 3 => inp.log2_buffer_sectors -= 1,
                Err(()) => return Err(LayoutError::DoesNotFit { device_sectors: inp.meta_device_sectors }),
            }
        };
        let (log2_bpbb, n_bitmap_blocks) = bitmap_geometry(
            &journal,
            sb.journal_sections,
            sb.log2_sectors_per_block,
            provided,
            dev.sectors_per_bit,
        );
        let mut log2_buffer_sectors = inp.log2_buffer_sectors;
        if !meta_device {
            log2_buffer_sectors = log2_buffer_sectors.min(limits.metadata_run.trailing_zeros() as u8);
        }
        Ok(Layout {
            start: dev.start,
            meta_device,
            tag_size,
            log2_sectors_per_block: sb.log2_sectors_per_block,
            log2_interleave_sectors: sb.log2_interleave_sectors,
            journal,
            journal_sections: sb.journal_sections,
            provided_data_sectors: provided,
            initial_sectors: limits.initial_sectors,
            metadata_run: limits.metadata_run,
            log2_metadata_run: limits.log2_metadata_run,
            log2_buffer_sectors,
            log2_blocks_per_bitmap_bit: log2_bpbb,
            n_bitmap_blocks,
        })
    }

    /// Formats: `initialize_superblock` followed by the rest of `dm_integrity_ctr` (which sets
    /// `log2_blocks_per_bitmap_bit` in the new superblock). The superblock's version is the one
    /// written by a format in mode `J` (what cryptsetup does); the caller zeroes the journal
    /// area (`init_journal` with commit seq 0, see [`super::journal::init_section`]) and writes
    /// the superblock.
    pub fn format(p: &FormatParams, dev: &DeviceParams) -> Result<(Superblock, Layout), LayoutError> {
        dev.check_addressable()?;
        if p.tag_size == 0 || p.tag_size > MAX_TAG_SIZE {
            return Err(LayoutError::BadTagSize(p.tag_size));
        }
        let log2_spb = log2_block(p.block_size)?;
        let meta_device = dev.meta_device_sectors.is_some();
        let journal = JournalGeometry::new(p.tag_size, log2_spb, p.journal_mac);
        let journal_sectors = match p.journal_sectors {
            Some(0) => 1,
            Some(n) => n,
            None => {
                DEFAULT_MAX_JOURNAL_SECTORS.min(dev.data_device_sectors >> DEFAULT_JOURNAL_SIZE_FACTOR) as u32
            }
        };
        let mut journal_sections = journal_sectors / journal.section_sectors;
        if journal_sections == 0 {
            journal_sections = 1;
        }
        let mut flags = SbFlags::default();
        flags.set(SbFlags::HAVE_JOURNAL_MAC, p.journal_mac);
        let mut salt = [0u8; 16];
        if p.fix_hmac {
            flags.set(SbFlags::FIXED_HMAC, true);
            salt = p.salt;
        }
        let buffer_sectors = if dev.buffer_sectors == 0 { 1 } else { dev.buffer_sectors };
        let mut inp = LimitInputs {
            journal,
            journal_sections,
            log2_interleave: 0,
            log2_spb,
            tag_size: p.tag_size,
            fixed_padding: false,
            start: dev.start,
            meta_device,
            meta_device_sectors: dev.meta_sectors(),
            log2_buffer_sectors: (fls_index(buffer_sectors as u64) as u8).min(31 - 9),
        };
        let provided;
        if !meta_device {
            if p.fix_padding {
                flags.set(SbFlags::FIXED_PADDING, true);
                inp.fixed_padding = true;
            }
            let interleave =
                if p.interleave_sectors == 0 { DEFAULT_INTERLEAVE_SECTORS } else { p.interleave_sectors };
            inp.log2_interleave = (fls_index(interleave as u64) as u8).clamp(3, 31);
            provided = provided_data_sectors(&inp, dev.data_device_sectors);
            if provided == 0 {
                return Err(LayoutError::TooSmall { device_sectors: inp.meta_device_sectors });
            }
        } else {
            provided = provided_data_sectors(&inp, dev.data_device_sectors);
            if provided == 0 {
                return Err(LayoutError::TooSmall { device_sectors: inp.meta_device_sectors });
            }
            // try_smaller_buffer: the largest journal_sections ≤ requested (bit search) that fits.
            loop {
                let mut sections = 0u32;
                let top = 31 - journal_sections.leading_zeros() as i32;
                let mut bit = top;
                while bit >= 0 {
                    let test = sections | (1u32 << bit);
                    if test <= journal_sections {
                        inp.journal_sections = test;
                        if device_limits(&inp, provided).is_ok() {
                            sections = test;
                        }
                    }
                    bit -= 1;
                }
                inp.journal_sections = sections;
                if sections != 0 {
                    break;
                }
                if inp.log2_buffer_sectors > 3 {
                    inp.log2_buffer_sectors -= 1;
                } else {
                    return Err(LayoutError::TooSmall { device_sectors: inp.meta_device_sectors });
                }
            }
            journal_sections = inp.journal_sections;
        }
        let mut sb = Superblock {
            version: 1,
            log2_interleave_sectors: inp.log2_interleave,
            integrity_tag_size: p.tag_size as u16,
            journal_sections,
            provided_data_sectors: provided,
            flags,
            log2_sectors_per_block: log2_spb,
            log2_blocks_per_bitmap_bit: 0,
            recalc_sector: 0,
            salt,
        };
        sb.set_version(super::superblock::Mode::Journal, meta_device);
        let layout = Layout::open(&sb, dev)?;
        sb.log2_blocks_per_bitmap_bit = layout.log2_blocks_per_bitmap_bit;
        Ok((sb, layout))
    }

    /// Sectors per block.
    pub fn sectors_per_block(&self) -> u64 {
        1 << self.log2_sectors_per_block
    }
    /// Block size in bytes.
    pub fn block_size(&self) -> usize {
        512 << self.log2_sectors_per_block
    }
    /// `interleave_sectors` (1 << log2; meaningless with a meta device).
    pub fn interleave_sectors(&self) -> u64 {
        1 << self.log2_interleave_sectors
    }
    /// Sectors of one dm-bufio block for tags (`buffer_sectors` as `dmsetup table` prints it).
    pub fn buffer_sectors(&self) -> u32 {
        1 << self.log2_buffer_sectors
    }
    /// Journal sectors as `dmsetup table` prints them (`initial_sectors - 8`).
    pub fn journal_sectors(&self) -> u32 {
        self.initial_sectors - SB_SECTORS as u32
    }
    /// Number of interleaved areas the provided sectors span (1 with a meta device).
    pub fn areas(&self) -> u64 {
        if self.meta_device {
            1
        } else {
            self.provided_data_sectors.div_ceil(self.interleave_sectors())
        }
    }

    fn limits(&self) -> Limits {
        Limits {
            initial_sectors: self.initial_sectors,
            metadata_run: self.metadata_run,
            log2_metadata_run: self.log2_metadata_run,
        }
    }

    /// `get_area_and_offset`: (area, sector offset within the area).
    pub fn area_and_offset(&self, logical_sector: u64) -> (u64, u64) {
        area_and_offset(self.log2_interleave_sectors, self.meta_device, logical_sector)
    }

    /// Absolute sector on the data device holding logical sector `logical_sector`
    /// (`get_data_sector` ∘ `get_area_and_offset`).
    pub fn data_sector(&self, logical_sector: u64) -> u64 {
        let (area, offset) = self.area_and_offset(logical_sector);
        data_sector_of(
            &self.limits(),
            self.log2_interleave_sectors,
            self.start,
            self.meta_device,
            area,
            offset,
        )
    }

    /// Where the tag of the block starting at `logical_sector` is (`get_metadata_sector_and_offset`,
    /// literally, including its truncation). `logical_sector` must be block-aligned (the
    /// kernel BUG()s otherwise; we round down).
    pub fn tag_location(&self, logical_sector: u64) -> TagLocation {
        let (area, offset) = self.area_and_offset(logical_sector);
        let mut ms: u64 = area << self.log2_interleave_sectors;
        if self.log2_metadata_run >= 0 {
            ms = ms.wrapping_add(area << self.log2_metadata_run);
        } else {
            ms = ms.wrapping_add(area.wrapping_mul(self.metadata_run as u64));
        }
        ms >>= self.log2_buffer_sectors;
        let block = offset >> self.log2_sectors_per_block;
        let buf_shift = 9 + self.log2_buffer_sectors as u32;
        let mask = (1u64 << buf_shift) - 1;
        // Both kernel branches (power-of-two tag shift or multiply) give the same numbers.
        let bytes = block.wrapping_mul(self.tag_size as u64);
        ms = ms.wrapping_add(bytes >> buf_shift);
        let mo = (bytes & mask) as u32;
        let base = (self.start + self.initial_sectors as u64) * 512;
        TagLocation {
            buffer_index: ms,
            offset_in_buffer: mo,
            byte_address: base + (ms << buf_shift) + mo as u64,
        }
    }

    /// Byte address of the intended (untruncated) tag run of `area`: where the tags *would*
    /// be if the kernel's shift did not truncate. Equal to `tag_location` of the area's first
    /// block whenever `area·(interleave+metadata_run)` is a multiple of `buffer_sectors`.
    pub fn area_metadata_sector(&self, area: u64) -> u64 {
        if self.meta_device {
            return self.start + self.initial_sectors as u64;
        }
        self.start
            + self.initial_sectors as u64
            + area * (self.interleave_sectors() + self.metadata_run as u64)
    }

    /// Whether [`Layout::tag_location`] departs from [`Layout::area_metadata_sector`] for some
    /// area (the legacy-padding + small-interleave kernel quirk described in the module docs).
    pub fn tag_addressing_truncates(&self) -> bool {
        !self.meta_device
            && self.areas() > 1
            && !(self.interleave_sectors() + self.metadata_run as u64)
                .is_multiple_of(self.buffer_sectors() as u64)
    }

    /// Sector (relative to the journal start, i.e. `start + 8` on the metadata device) of journal
    /// section `section`.
    pub fn journal_section_sector(&self, section: u32) -> u64 {
        section as u64 * self.journal.section_sectors as u64
    }

    /// Absolute byte offset of the journal area on the metadata device.
    pub fn journal_byte_offset(&self) -> u64 {
        (self.start + SB_SECTORS) * 512
    }

    /// Bytes of the journal area (`journal_sections × journal_section_sectors × 512`).
    pub fn journal_bytes(&self) -> u64 {
        self.journal_sections as u64 * self.journal.section_sectors as u64 * 512
    }

    /// `free_sectors_threshold` for a `journal_watermark:` percentage (default 50): the writer
    /// copies committed sections out when free journal entries drop to this.
    pub fn free_sectors_threshold(&self, journal_watermark: u32) -> u64 {
        let entries = self.journal.section_entries as u64 * self.journal_sections as u64;
        (entries * (100 - journal_watermark.min(100) as u64) + 50) / 100
    }
}

/// The bitmap sizing of `dm_integrity_ctr`: `log2_sectors_per_bitmap_bit` starts at
/// log2(`sectors_per_bit`) (default 15; `sectors_per_bit:0` gives 0), at least the block,
/// and grows until one journal area's worth of bits (capped to `UINT_MAX`) covers the
/// provided sectors. Returns (log2_blocks_per_bitmap_bit, n_bitmap_blocks).
fn bitmap_geometry(
    journal: &JournalGeometry,
    journal_sections: u32,
    log2_spb: u8,
    provided: u64,
    sectors_per_bit: Option<u64>,
) -> (u8, u32) {
    let mut l: u32 = match sectors_per_bit {
        None => fls_index(DEFAULT_SECTORS_PER_BITMAP_BIT),
        Some(0) => 0,
        Some(v) => fls_index(v),
    };
    if l < log2_spb as u32 {
        l = log2_spb as u32;
    }
    let bits_in_journal =
        ((journal.section_sectors as u64 * journal_sections as u64) << (9 + 3)).min(u32::MAX as u64);
    while l < 64 && bits_in_journal < (provided + ((1u64 << l) - 1)) >> l {
        l += 1;
    }
    let lbpb = l - log2_spb as u32;
    let n_bits = ((provided >> log2_spb) + ((1u64 << lbpb) - 1)) >> lbpb;
    let blocks = n_bits.div_ceil(BITMAP_BLOCK_SIZE * 8);
    (lbpb as u8, blocks as u32)
}

fn meta_device_of(dev: &DeviceParams) -> bool {
    dev.meta_device_sectors.is_some()
}
