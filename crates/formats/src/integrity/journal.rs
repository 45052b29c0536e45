//! The journal: sections, entries, commit ids, the section MAC and the replay rule, as pure
//! functions over journal bytes (kernel `struct journal_entry`, `struct journal_sector`,
//! `calculate_journal_section_size`, `access_journal_entry`, `access_journal_data`,
//! `dm_integrity_commit_id`, `section_mac`, `init_journal`, `integrity_commit`,
//! `replay_journal`, `do_journal_write`, `restore_last_bytes`).
//!
//! The journal area starts at sector `start + 8` of the metadata device and holds
//! `journal_sections` sections of `section_sectors` sectors each:
//!
//! ```text
//!  section i (section_sectors = 8 + section_entries · sectors_per_block):
//!  │ 8 metadata sectors: entries (round-robin) │ data: entry 0's block │ entry 1's block │ ... │
//!
//!  every 512-byte journal sector (metadata and data alike):
//!   off  size  field
//!     0   496  entries (metadata sector) / data bytes 0..496 (data sector)
//!   496     8  mac: 8 bytes of the section MAC (metadata sectors with journal_mac);
//!              otherwise entries / data bytes 496..504
//!   504     8  commit_id = commit_ids[seq] XOR le64((section << 32) XOR sector)
//!
//!  journal entry (entry_size = round_up(8 + 8·sectors_per_block + tag_size, 8)):
//!   off              size               field
//!     0                 4               sector_lo  ┐ le64 logical sector of the block;
//!     4                 4               sector_hi  ┘ sector_hi 0xFFFFFFFF = unused,
//!                                                    0xFFFFFFFE = in progress (being copied)
//!     8   8·sectors_per_block           last_bytes[s]: the original bytes 504..512 of the
//!                                       block's 512-byte sector s (displaced by commit_id)
//!     8+8·spb        tag_size           tag of the block
//!
//!  entries per metadata sector = (504, or 496 with journal_mac) / entry_size
//!  entry n of a section lives in metadata sector n % 8, slot n / 8
//!  entry n's block lives at data sectors 8 + n·spb .. 8 + (n+1)·spb of the section
//! ```
//!
//! # Commit ids and replay
//!
//! Four base ids `0x1111…11`, `0x2222…22`, `0x3333…33`, `0x4444…44` (made pairwise distinct by
//! incrementing; only matters when a stream `journal_crypt` encrypts them, see
//! [`CommitIds::from_bytes`]). A commit stamps every sector of the committed sections with
//! the id of the current `commit_seq`; `commit_seq` advances (mod 4) each time the commit
//! position wraps past the last section. [`scan`] reproduces `replay_journal`; the rule is
//! written out on [`ReplayPlan`].
//!
//! Not here: `journal_crypt` (encryption of the journal area: stream ciphers XOR a keystream
//! over the whole area and the base commit ids; block ciphers encrypt each section with
//! IV = E_K(le32(section)‖0…)). The caller decrypts the journal before handing it to these
//! functions; the keystream/IV layout and the ciphers (ctr(aes), cbc(aes)) are in
//! `targets::integrity::JournalCrypt` (crates/targets/src/integrity/jcrypt.rs), checked
//! against Linux 6.1 both ways (crates/cli/tests/integrity_journal_crypt.rs).
use super::superblock::SALT_SIZE;

/// `JOURNAL_BLOCK_SECTORS`: metadata sectors at the head of each section.
pub const JOURNAL_BLOCK_SECTORS: u32 = 8;
/// `JOURNAL_SECTOR_DATA`: bytes of a journal sector before its commit id.
pub const JOURNAL_SECTOR_DATA: usize = 504;
/// `JOURNAL_MAC_PER_SECTOR`.
pub const JOURNAL_MAC_PER_SECTOR: usize = 8;
/// `JOURNAL_MAC_SIZE`: the section MAC, spread 8 bytes per metadata sector.
pub const JOURNAL_MAC_SIZE: usize = JOURNAL_MAC_PER_SECTOR * JOURNAL_BLOCK_SECTORS as usize;
/// `N_COMMIT_IDS`.
pub const N_COMMIT_IDS: u8 = 4;
/// `JOURNAL_ENTRY_ROUNDUP`.
pub const JOURNAL_ENTRY_ROUNDUP: u32 = 8;
/// `sector_hi` of an unused entry.
pub const SECTOR_HI_UNUSED: u32 = 0xFFFF_FFFF;
/// `sector_hi` of an entry whose data is still being copied in.
pub const SECTOR_HI_INPROGRESS: u32 = 0xFFFF_FFFE;

/// `prev_commit_seq`.
pub fn prev_commit_seq(seq: u8) -> u8 {
    (seq + N_COMMIT_IDS - 1) % N_COMMIT_IDS
}
/// `next_commit_seq`.
pub fn next_commit_seq(seq: u8) -> u8 {
    (seq + 1) % N_COMMIT_IDS
}

/// Journal entry and section sizes (`calculate_journal_section_size`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct JournalGeometry {
    /// Tag bytes per entry.
    pub tag_size: u32,
    /// log2(sectors per block).
    pub log2_sectors_per_block: u8,
    /// HAVE_JOURNAL_MAC: 8 bytes of each metadata sector hold the section MAC.
    pub have_journal_mac: bool,
    /// `journal_entry_size`.
    pub entry_size: u32,
    /// `journal_entries_per_sector`.
    pub entries_per_sector: u32,
    /// `journal_section_entries` = 8 × entries_per_sector.
    pub section_entries: u32,
    /// `journal_section_sectors` = 8 + section_entries × sectors_per_block.
    pub section_sectors: u32,
}

impl JournalGeometry {
    /// `calculate_journal_section_size` for a tag size (1..=255), block size and MAC flag.
    pub fn new(tag_size: u32, log2_sectors_per_block: u8, have_journal_mac: bool) -> Self {
        let spb = 1u32 << log2_sectors_per_block;
        let entry_size = (8 + 8 * spb + tag_size).div_ceil(JOURNAL_ENTRY_ROUNDUP) * JOURNAL_ENTRY_ROUNDUP;
        let space =
            JOURNAL_SECTOR_DATA as u32 - if have_journal_mac { JOURNAL_MAC_PER_SECTOR as u32 } else { 0 };
        // `unsigned char` fields in the kernel; with tag_size ≤ 255 they never overflow.
        let entries_per_sector = (space / entry_size) & 0xff;
        let section_entries = (entries_per_sector * JOURNAL_BLOCK_SECTORS) & 0xff;
        let section_sectors = ((section_entries << log2_sectors_per_block) + JOURNAL_BLOCK_SECTORS) & 0xffff;
        JournalGeometry {
            tag_size,
            log2_sectors_per_block,
            have_journal_mac,
            entry_size,
            entries_per_sector,
            section_entries,
            section_sectors,
        }
    }
    /// Sectors per block.
    pub fn sectors_per_block(&self) -> u32 {
        1 << self.log2_sectors_per_block
    }
    /// Bytes of one section.
    pub fn section_bytes(&self) -> usize {
        self.section_sectors as usize * 512
    }
    /// Byte offset, within its section, of entry `n` (`access_journal_entry`).
    pub fn entry_offset(&self, n: u32) -> usize {
        let rel_sector = n % JOURNAL_BLOCK_SECTORS;
        let slot = n / JOURNAL_BLOCK_SECTORS;
        rel_sector as usize * 512 + (slot * self.entry_size) as usize
    }
    /// Byte offset, within an entry, of data sector `s`'s saved bytes 504..512 (`last_bytes`).
    fn entry_last_bytes(s: usize) -> usize {
        8 + 8 * s
    }
    /// Byte offset, within an entry, of the tag.
    fn entry_tag_offset(&self) -> usize {
        Self::entry_last_bytes(self.sectors_per_block() as usize)
    }
    /// Sector, within its section, of the first data sector of entry `n` (`access_journal_data`).
    pub fn data_sector(&self, n: u32) -> u32 {
        (n << self.log2_sectors_per_block) + JOURNAL_BLOCK_SECTORS
    }
}

/// The four base commit ids as stored on disk (little-endian u64 bytes).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct CommitIds(pub [[u8; 8]; N_COMMIT_IDS as usize]);

impl Default for CommitIds {
    fn default() -> Self {
        CommitIds::plain()
    }
}

impl CommitIds {
    /// The ids of an unencrypted journal (or one with a block-cipher journal_crypt).
    pub fn plain() -> Self {
        CommitIds::from_bytes([
            0x1111_1111_1111_1111u64.to_le_bytes(),
            0x2222_2222_2222_2222u64.to_le_bytes(),
            0x3333_3333_3333_3333u64.to_le_bytes(),
            0x4444_4444_4444_4444u64.to_le_bytes(),
        ])
    }
    /// Ids from raw bytes (a stream journal_crypt encrypts the plain ids with the keystream
    /// that follows the journal's), then made pairwise distinct as `create_journal` does:
    /// while id i equals an earlier id, add 1 to it (as a little-endian integer).
    pub fn from_bytes(mut ids: [[u8; 8]; N_COMMIT_IDS as usize]) -> Self {
        let n = N_COMMIT_IDS as usize;
        for i in 0..n {
            'retest: loop {
                for j in 0..i {
                    if ids[j] == ids[i] {
                        ids[i] = u64::from_le_bytes(ids[i]).wrapping_add(1).to_le_bytes();
                        continue 'retest;
                    }
                }
                break;
            }
        }
        CommitIds(ids)
    }
    /// `dm_integrity_commit_id`: the id of journal sector `sector` of section `section` under
    /// commit sequence `seq`.
    pub fn commit_id(&self, section: u32, sector: u32, seq: u8) -> [u8; 8] {
        let base = u64::from_le_bytes(self.0[(seq % N_COMMIT_IDS) as usize]);
        (base ^ (((section as u64) << 32) ^ sector as u64)).to_le_bytes()
    }
    /// `find_commit_seq`: which sequence produced `id` at this position, if any.
    pub fn find_commit_seq(&self, section: u32, sector: u32, id: &[u8; 8]) -> Option<u8> {
        (0..N_COMMIT_IDS).find(|&k| &self.commit_id(section, sector, k) == id)
    }
}

/// What an entry's sector field says.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum EntryState {
    /// `sector_hi == 0xFFFFFFFF`.
    Unused,
    /// `sector_hi == 0xFFFFFFFE`: being filled; never committed as such.
    InProgress,
    /// A logical 512-byte sector (block start).
    Sector(u64),
}

impl EntryState {
    /// What the raw le64 sector field says.
    pub fn of(raw_sector: u64) -> Self {
        match (raw_sector >> 32) as u32 {
            SECTOR_HI_UNUSED => EntryState::Unused,
            SECTOR_HI_INPROGRESS => EntryState::InProgress,
            _ => EntryState::Sector(raw_sector),
        }
    }
}

/// A decoded journal entry.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct JournalEntry {
    /// The raw le64 sector field.
    pub raw_sector: u64,
    /// `last_bytes[s]`, one per 512-byte sector of the block.
    pub last_bytes: Vec<[u8; 8]>,
    /// The tag (`tag_size` bytes).
    pub tag: Vec<u8>,
}

impl JournalEntry {
    /// Decodes an entry from `bytes` (at least `entry_size` long).
    pub fn decode(geom: &JournalGeometry, bytes: &[u8]) -> JournalEntry {
        let mut raw = [0u8; 8];
        raw.copy_from_slice(&bytes[0..8]);
        let spb = geom.sectors_per_block() as usize;
        let last_bytes = (0..spb)
            .map(|s| {
                let lb = JournalGeometry::entry_last_bytes(s);
                let mut a = [0u8; 8];
                a.copy_from_slice(&bytes[lb..lb + 8]);
                a
            })
            .collect();
        let t = geom.entry_tag_offset();
        JournalEntry {
            raw_sector: u64::from_le_bytes(raw),
            last_bytes,
            tag: bytes[t..t + geom.tag_size as usize].to_vec(),
        }
    }
    /// Encodes into `bytes` (`entry_size` long; padding bytes are left as they are).
    pub fn encode_into(&self, geom: &JournalGeometry, bytes: &mut [u8]) {
        bytes[0..8].copy_from_slice(&self.raw_sector.to_le_bytes());
        for (s, lb) in self.last_bytes.iter().enumerate() {
            let at = JournalGeometry::entry_last_bytes(s);
            bytes[at..at + 8].copy_from_slice(lb);
        }
        let t = geom.entry_tag_offset();
        bytes[t..t + geom.tag_size as usize].copy_from_slice(&self.tag);
    }
    /// `journal_entry_is_unused` / `journal_entry_is_inprogress` / the sector.
    pub fn state(&self) -> EntryState {
        EntryState::of(self.raw_sector)
    }
}

/// A read-only view of the whole (decrypted) journal area.
#[derive(Debug, Clone, Copy)]
pub struct JournalView<'a> {
    /// Geometry.
    pub geom: JournalGeometry,
    /// Number of sections.
    pub sections: u32,
    bytes: &'a [u8],
}

/// Why a journal cannot be scanned or replayed. The kernel turns the commit-id errors into
/// a failed device (`dm_integrity_io_error(-EIO)`): every later I/O fails until reloaded.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[non_exhaustive]
pub enum JournalError {
    /// Fewer bytes than `sections × section_sectors × 512`.
    #[error("journal truncated: {len} bytes, need {need}")]
    TooShort {
        /// Bytes given.
        len: usize,
        /// Bytes needed.
        need: usize,
    },
    /// A sector's commit id matches none of the four sequences ("journal commit id").
    #[error("journal sector {sector} of section {section} has an unknown commit id")]
    BadCommitId {
        /// Section.
        section: u32,
        /// Sector within the section.
        sector: u32,
    },
    /// All four commit sequences are in use ("journal commit ids").
    #[error("all journal commit ids are in use")]
    AllCommitIdsUsed,
    /// A replayed section's MAC does not verify ("journal mac", -EILSEQ).
    #[error("journal MAC mismatch in section {section}")]
    MacMismatch {
        /// Section.
        section: u32,
    },
    /// A replayed entry's sector is not block-aligned ("invalid sector in journal"; the kernel
    /// fails the device, then replays the entry at the rounded-down sector).
    #[error("journal entry {entry} of section {section} has unaligned sector {sector}")]
    UnalignedSector {
        /// Section.
        section: u32,
        /// Entry.
        entry: u32,
        /// The raw sector.
        sector: u64,
    },
}

impl<'a> JournalView<'a> {
    /// Views `bytes` (the journal area, at least `sections × section_sectors × 512` bytes).
    pub fn new(geom: JournalGeometry, sections: u32, bytes: &'a [u8]) -> Result<Self, JournalError> {
        let need = sections as usize * geom.section_bytes();
        if bytes.len() < need {
            return Err(JournalError::TooShort { len: bytes.len(), need });
        }
        Ok(JournalView { geom, sections, bytes: &bytes[..need] })
    }
    /// The bytes of section `i`.
    pub fn section(&self, i: u32) -> &'a [u8] {
        let n = self.geom.section_bytes();
        &self.bytes[i as usize * n..(i as usize + 1) * n]
    }
    /// The commit id stored in sector `j` of section `i`.
    pub fn commit_id(&self, i: u32, j: u32) -> [u8; 8] {
        let off = j as usize * 512 + JOURNAL_SECTOR_DATA;
        let mut a = [0u8; 8];
        a.copy_from_slice(&self.section(i)[off..off + 8]);
        a
    }
    /// Entry `n` of section `i`.
    pub fn entry(&self, i: u32, n: u32) -> JournalEntry {
        let off = self.geom.entry_offset(n);
        JournalEntry::decode(&self.geom, &self.section(i)[off..off + self.geom.entry_size as usize])
    }
    /// The block of entry `n` of section `i` with its last bytes restored
    /// (`restore_last_bytes`): what gets written to the data area.
    pub fn entry_data(&self, i: u32, n: u32) -> Vec<u8> {
        let e = self.entry(i, n);
        let start = self.geom.data_sector(n) as usize * 512;
        let len = (self.geom.sectors_per_block() as usize) * 512;
        let mut data = self.section(i)[start..start + len].to_vec();
        for (s, lb) in e.last_bytes.iter().enumerate() {
            data[s * 512 + JOURNAL_SECTOR_DATA..(s + 1) * 512].copy_from_slice(lb);
        }
        data
    }
    /// The bytes the section MAC covers (`section_mac`): with FIXED_HMAC the 16-byte salt and
    /// le64(section) first, then the 8-byte sector field of every entry in entry order.
    pub fn section_mac_input(&self, i: u32, salt: Option<&[u8; SALT_SIZE]>) -> Vec<u8> {
        section_mac_input(&self.geom, self.section(i), i, salt)
    }
}

/// See [`JournalView::section_mac_input`]; `section` is one section's bytes.
pub fn section_mac_input(
    geom: &JournalGeometry,
    section: &[u8],
    index: u32,
    salt: Option<&[u8; SALT_SIZE]>,
) -> Vec<u8> {
    let mut v = Vec::with_capacity(24 + 8 * geom.section_entries as usize);
    if let Some(s) = salt {
        v.extend_from_slice(s);
        v.extend_from_slice(&(index as u64).to_le_bytes());
    }
    for j in 0..geom.section_entries {
        let off = geom.entry_offset(j);
        v.extend_from_slice(&section[off..off + 8]);
    }
    v
}

/// The 64-byte section MAC from a digest: truncated, or zero-padded when shorter.
pub fn section_mac_bytes(digest: &[u8]) -> [u8; JOURNAL_MAC_SIZE] {
    let mut out = [0u8; JOURNAL_MAC_SIZE];
    let n = digest.len().min(JOURNAL_MAC_SIZE);
    out[..n].copy_from_slice(&digest[..n]);
    out
}

/// `rw_section_mac(.., true)`: stores the MAC, 8 bytes into each metadata sector at 496..504.
pub fn store_section_mac(section: &mut [u8], mac: &[u8; JOURNAL_MAC_SIZE]) {
    for j in 0..JOURNAL_BLOCK_SECTORS as usize {
        let off = j * 512 + JOURNAL_SECTOR_DATA - JOURNAL_MAC_PER_SECTOR;
        section[off..off + JOURNAL_MAC_PER_SECTOR].copy_from_slice(&mac[j * 8..j * 8 + 8]);
    }
}

/// `rw_section_mac(.., false)`: whether the stored MAC matches.
pub fn check_section_mac(section: &[u8], mac: &[u8; JOURNAL_MAC_SIZE]) -> bool {
    (0..JOURNAL_BLOCK_SECTORS as usize).all(|j| {
        let off = j * 512 + JOURNAL_SECTOR_DATA - JOURNAL_MAC_PER_SECTOR;
        section[off..off + JOURNAL_MAC_PER_SECTOR] == mac[j * 8..j * 8 + 8]
    })
}

/// `init_journal` for one section: zero bytes 0..504 of every sector, stamp the commit ids of
/// `seq`, mark every entry unused. (The kernel then computes the section MAC and writes it.)
pub fn init_section(geom: &JournalGeometry, ids: &CommitIds, section: &mut [u8], index: u32, seq: u8) {
    for j in 0..geom.section_sectors {
        let s = &mut section[j as usize * 512..(j as usize + 1) * 512];
        s[..JOURNAL_SECTOR_DATA].fill(0);
        s[JOURNAL_SECTOR_DATA..].copy_from_slice(&ids.commit_id(index, j, seq));
    }
    for n in 0..geom.section_entries {
        let off = geom.entry_offset(n);
        section[off + 4..off + 8].copy_from_slice(&SECTOR_HI_UNUSED.to_le_bytes());
    }
}

/// `integrity_commit` for one section: stamp every sector's commit id with `seq`.
pub fn commit_section(geom: &JournalGeometry, ids: &CommitIds, section: &mut [u8], index: u32, seq: u8) {
    for j in 0..geom.section_sectors {
        let off = j as usize * 512 + JOURNAL_SECTOR_DATA;
        section[off..off + 8].copy_from_slice(&ids.commit_id(index, j, seq));
    }
}

/// The write half of `__journal_read_write`: puts one block into entry `n` of a section —
/// copies the data into the entry's data sectors, saves each sector's bytes 504..512 into
/// `last_bytes`, stores the tag (`tag_size` bytes; the caller truncates or zero-pads the
/// digest) and finally the sector. `data` is one block.
pub fn write_entry(
    geom: &JournalGeometry,
    section: &mut [u8],
    n: u32,
    logical_sector: u64,
    data: &[u8],
    tag: &[u8],
) {
    // The layout of `JournalEntry::encode_into`, written in place (no allocation per block:
    // this runs for every block written in mode J).
    let spb = geom.sectors_per_block() as usize;
    let start = geom.data_sector(n) as usize * 512;
    section[start..start + spb * 512].copy_from_slice(&data[..spb * 512]);
    let off = geom.entry_offset(n);
    for s in 0..spb {
        let lb = off + JournalGeometry::entry_last_bytes(s);
        section[lb..lb + 8].copy_from_slice(&data[s * 512 + JOURNAL_SECTOR_DATA..(s + 1) * 512]);
    }
    let t = off + geom.entry_tag_offset();
    let ts = geom.tag_size as usize;
    section[t..t + ts].copy_from_slice(&tag[..ts]);
    section[off..off + 8].copy_from_slice(&logical_sector.to_le_bytes());
}

/// The kernel's `restore_last_bytes`, in place: puts entry `n`'s saved bytes 504..512 back
/// into each of its data sectors, so that the section holds the block as it was written (and
/// no longer the commit ids there). Only for a section whose commit is durable, which is
/// never written to the journal again until it is reused. Returns false for an entry that
/// is not in use (left alone).
pub fn restore_entry(geom: &JournalGeometry, section: &mut [u8], n: u32) -> bool {
    let off = geom.entry_offset(n);
    let mut raw = [0u8; 8];
    raw.copy_from_slice(&section[off..off + 8]);
    if !matches!(EntryState::of(u64::from_le_bytes(raw)), EntryState::Sector(_)) {
        return false;
    }
    let start = geom.data_sector(n) as usize * 512;
    for s in 0..geom.sectors_per_block() as usize {
        let lb = off + JournalGeometry::entry_last_bytes(s);
        let dst = start + s * 512 + JOURNAL_SECTOR_DATA;
        section.copy_within(lb..lb + 8, dst);
    }
    true
}

/// The tag of entry `n` (`tag_size` bytes), without decoding the rest of the entry.
pub fn entry_tag<'a>(geom: &JournalGeometry, section: &'a [u8], n: u32) -> &'a [u8] {
    let t = geom.entry_offset(n) + geom.entry_tag_offset();
    &section[t..t + geom.tag_size as usize]
}

/// How the kernel goes on after replay (what `replay_journal` leaves in `ic`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum JournalResume {
    /// The whole journal was consistent (and mode J, or empty): new commits start at `section`
    /// with `commit_seq`; the journal is not rewritten.
    Continue {
        /// `continue_section`.
        section: u32,
        /// `ic->commit_seq`.
        commit_seq: u8,
    },
    /// The journal is re-initialised (`init_journal`) with `erase_seq`, beginning at section
    /// `from` and wrapping around (first `from`, then the `sections - 2` after it, then the
    /// last one), and new commits start at section 0 with `commit_seq = next(erase_seq)`.
    Clear {
        /// First section re-initialised (`write_start`).
        from: u32,
        /// Sequence written into every re-initialised section.
        erase_seq: u8,
        /// `ic->commit_seq` afterwards.
        commit_seq: u8,
    },
}

/// The outcome of `replay_journal`'s scan: which sections replay and how the journal
/// continues.
///
/// The rule (Linux 6.1 `replay_journal`):
/// 1. For every sector of every section, find the sequence k (0..4) whose commit id it
///    carries (none → the device fails); `used[k] = true`; `max_section[k]` = the last section
///    holding an id of k. `journal_empty` = no entry anywhere is in use.
/// 2. `unused` = the first unused sequence: if seq 3 is unused, walk down from 3 while the
///    one below is also unused; otherwise the lowest unused one (all used → device fails).
///    `last_used = prev(unused)`, `want = prev(last_used)`.
/// 3. If `want` is unused but `prev(want)` is used, the journal counts as empty.
/// 4. `write_start = max_section[last_used] + 1`; if that passes the end, it wraps to 0 and
///    `want = next(want)`.
/// 5. From `write_start`, count sections whose every sector carries `want`'s id, advancing
///    `want` when wrapping past the last section; stop at the first mismatch (a torn commit)
///    or after all sections. That is `write_sections`.
/// 6. Unless empty, replay those `write_sections` sections from `write_start` in order; in
///    each, entries in index order; an entry replays if in use (in-progress markers read as
///    sectors ≥ provided and are dropped) and its sector is below `provided_data_sectors`:
///    its block (last bytes restored) goes to the data area and its tag to the tag area.
///    Later entries overwrite earlier ones.
/// 7. If `write_sections` covers the whole journal and (mode J or empty): continue at
///    `write_start` with `commit_seq = want` (as advanced in 5). Otherwise clear the journal
///    with `erase_seq = prev(prev(last_used))` starting at `write_start`, and continue at 0
///    with `next(erase_seq)`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ReplayPlan {
    /// Which commit sequences appear.
    pub used_commit_ids: [bool; N_COMMIT_IDS as usize],
    /// `last_used`.
    pub last_used: u8,
    /// `want_commit_seq` at the start of the scan (after steps 2–4).
    pub want_commit_seq: u8,
    /// No entry needs replaying.
    pub journal_empty: bool,
    /// First section to replay.
    pub write_start: u32,
    /// Number of consistent sections from `write_start`.
    pub write_sections: u32,
    /// How the journal continues.
    pub resume: JournalResume,
}

/// A journal MAC: the MAC function (input → digest) and the salt when FIXED_HMAC is set.
pub type SectionMac<'a> = (&'a dyn Fn(&[u8]) -> Vec<u8>, Option<&'a [u8; SALT_SIZE]>);

/// One block the replay writes: data at `Layout::data_sector(logical_sector)`, tag at
/// `Layout::tag_location(logical_sector)`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ReplayEntry {
    /// Journal section.
    pub section: u32,
    /// Entry index in the section.
    pub entry: u32,
    /// Block-aligned logical sector.
    pub logical_sector: u64,
    /// The block, last bytes restored.
    pub data: Vec<u8>,
    /// The tag from the entry (the kernel recomputes it with internal_hash and fails the
    /// device on mismatch — "tag mismatch when replaying journal" — but still writes it).
    pub tag: Vec<u8>,
}

/// Steps 1–5 and 7 of the replay rule (see [`ReplayPlan`]). `journal_mode` is true for mode
/// J (bitmap mode clears a consistent non-empty journal instead of continuing).
pub fn scan(view: &JournalView<'_>, ids: &CommitIds, journal_mode: bool) -> Result<ReplayPlan, JournalError> {
    let n = N_COMMIT_IDS as usize;
    let mut used = [false; 4];
    let mut max_section = [0u32; 4];
    let mut journal_empty = true;
    for i in 0..view.sections {
        for j in 0..view.geom.section_sectors {
            let id = view.commit_id(i, j);
            let k =
                ids.find_commit_seq(i, j, &id).ok_or(JournalError::BadCommitId { section: i, sector: j })?;
            used[k as usize] = true;
            max_section[k as usize] = i;
        }
        if journal_empty {
            for e in 0..view.geom.section_entries {
                let off = view.geom.entry_offset(e);
                let hi = u32::from_le_bytes(view.section(i)[off + 4..off + 8].try_into().unwrap_or([0; 4]));
                if hi != SECTOR_HI_UNUSED {
                    journal_empty = false;
                    break;
                }
            }
        }
    }
    let unused: u8 = if !used[n - 1] {
        let mut u = n - 1;
        while u > 0 && !used[u - 1] {
            u -= 1;
        }
        u as u8
    } else {
        match used.iter().position(|&u| !u) {
            Some(u) => u as u8,
            None => return Err(JournalError::AllCommitIdsUsed),
        }
    };
    let last_used = prev_commit_seq(unused);
    let mut want = prev_commit_seq(last_used);
    if !used[want as usize] && used[prev_commit_seq(want) as usize] {
        journal_empty = true;
    }
    let mut write_start = max_section[last_used as usize] + 1;
    if write_start >= view.sections {
        want = next_commit_seq(want);
        write_start -= view.sections;
    }
    let want_start = want;
    let mut i = write_start;
    let mut write_sections = 0u32;
    'outer: while write_sections < view.sections {
        for j in 0..view.geom.section_sectors {
            if view.commit_id(i, j) != ids.commit_id(i, j, want) {
                break 'outer;
            }
        }
        i += 1;
        if i >= view.sections {
            want = next_commit_seq(want);
            i -= view.sections;
        }
        write_sections += 1;
    }
    let resume = if write_sections == view.sections && (journal_mode || journal_empty) {
        JournalResume::Continue { section: write_start, commit_seq: want }
    } else {
        let erase_seq = prev_commit_seq(prev_commit_seq(last_used));
        JournalResume::Clear { from: write_start, erase_seq, commit_seq: next_commit_seq(erase_seq) }
    };
    Ok(ReplayPlan {
        used_commit_ids: used,
        last_used,
        want_commit_seq: want_start,
        journal_empty,
        write_start,
        write_sections,
        resume,
    })
}

/// The clear path the kernel takes when the scan itself fails (I/O error, unknown commit id,
/// all ids used): `last_used` and `write_start` still hold their initial 0, so the whole
/// journal is re-initialised with seq 2 from section 0 and commits continue with seq 3.
/// (After a commit-id error the kernel has also marked the device failed.)
pub const FAILED_SCAN_RESUME: JournalResume = JournalResume::Clear { from: 0, erase_seq: 2, commit_seq: 3 };

/// Step 6 of the replay rule: the blocks to write, in the kernel's order. `mac` verifies
/// each replayed section when the journal has a MAC (`Some(mac_fn)` mapping MAC input to
/// digest, salt per FIXED_HMAC). Unaligned sectors are reported as an error, like the
/// kernel's failed device; use [`replay_entries_lenient`] to get the kernel's rounded-down
/// replay anyway.
pub fn replay_entries(
    view: &JournalView<'_>,
    plan: &ReplayPlan,
    provided_data_sectors: u64,
    mac: Option<SectionMac<'_>>,
) -> Result<Vec<ReplayEntry>, JournalError> {
    let (entries, errors) = replay_entries_lenient(view, plan, provided_data_sectors, mac);
    match errors.into_iter().next() {
        Some(e) => Err(e),
        None => Ok(entries),
    }
}

/// Like [`replay_entries`], but returns every block the kernel would write together with
/// every failure it would record (each of which marks the kernel device failed).
pub fn replay_entries_lenient(
    view: &JournalView<'_>,
    plan: &ReplayPlan,
    provided_data_sectors: u64,
    mac: Option<SectionMac<'_>>,
) -> (Vec<ReplayEntry>, Vec<JournalError>) {
    let mut out = Vec::new();
    let mut errors = Vec::new();
    if plan.journal_empty {
        return (out, errors);
    }
    let spb = view.geom.sectors_per_block() as u64;
    let mut i = plan.write_start;
    for _ in 0..plan.write_sections {
        if let Some((f, salt)) = mac {
            let digest = f(&view.section_mac_input(i, salt));
            if !check_section_mac(view.section(i), &section_mac_bytes(&digest)) {
                errors.push(JournalError::MacMismatch { section: i });
            }
        }
        for j in 0..view.geom.section_entries {
            let e = view.entry(i, j);
            if e.state() == EntryState::Unused {
                continue;
            }
            let mut sec = e.raw_sector;
            if sec & (spb - 1) != 0 {
                errors.push(JournalError::UnalignedSector { section: i, entry: j, sector: sec });
                sec &= !(spb - 1);
            }
            if sec >= provided_data_sectors {
                continue;
            }
            out.push(ReplayEntry {
                section: i,
                entry: j,
                logical_sector: sec,
                data: view.entry_data(i, j),
                tag: e.tag,
            });
        }
        i += 1;
        if i >= view.sections {
            i -= view.sections;
        }
    }
    (out, errors)
}

/// The sections the kernel re-initialises for a [`JournalResume::Clear`], in order, as
/// `(section, seq)`.
pub fn clear_sections(resume: &JournalResume, sections: u32) -> Vec<(u32, u8)> {
    match *resume {
        JournalResume::Continue { .. } => Vec::new(),
        JournalResume::Clear { from, erase_seq, .. } => {
            (0..sections).map(|n| ((from + n) % sections, erase_seq)).collect()
        }
    }
}
