//! What is on a device: the one place that tells formats apart.
//!
//! ```text
//!  first bytes of the device                          Format
//!  ───────────────────────────────────────────────    ───────────────────────────
//!  "LUKS\xba\xbe" (or "SKUL\xba\xbe"), version 1/2    Luks1 / Luks2 { aead }      (first: as blkid)
//!  "integrt\0" at 0                                   Integrity
//!  "-FVE-FS-" at 3                                    Bitlk          (BitLocker)
//!  "MSWIN4.1" at 3 and a BitLocker GUID at 424        Bitlk          (BitLocker To Go)
//!  "CS" at 88, version 1, valid CRC32C                Fvault2        (Core Storage)
//!  anything else                                      Unknown        (plain dm-crypt, TrueCrypt,
//!                                                                     VeraCrypt: no signature)
//! ```
//! Signatures only: opening a format is its `assemble::open` arm's job. Adding a format
//! is one variant of [`Format`] and one check in [`probe`], then one arm in
//! `assemble::open` that unlocks and stacks it. [`describe`] adds what the header says
//! in plaintext (UUID, label, cipher), for `sealdisk probe`.
use blockdev::BlockDevice;
use formats::fvault2;

use crate::luks::{self, LuksVersion};
use crate::VolumeError;

/// A format found on a device.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[non_exhaustive]
pub enum Format {
    /// A LUKS1 header.
    Luks1,
    /// A LUKS2 header (`aead`: its segment has authenticated encryption over dm-integrity;
    /// `false` too when the header does not load).
    Luks2 {
        /// Authenticated encryption (`luksFormat --integrity`).
        aead: bool,
    },
    /// A standalone dm-integrity superblock.
    Integrity,
    /// A BitLocker volume (also BitLocker To Go), cryptsetup's `--type bitlk`.
    Bitlk,
    /// A FileVault2 (Core Storage) physical volume, cryptsetup's `--type fvault2`.
    Fvault2,
    /// Nothing sealdisk knows (plain dm-crypt looks like this: it has no header).
    Unknown,
}

impl Format {
    /// Words for the refusal of a LUKS open: what the device holds instead.
    pub(crate) fn luks_refusal_note(&self) -> &'static str {
        match self {
            Format::Integrity => ": it holds a dm-integrity superblock.",
            Format::Bitlk => ": it holds a BitLocker volume.",
            Format::Fvault2 => ": it holds a FileVault2 volume.",
            _ => ".",
        }
    }

    /// A short name (`LUKS2 (authenticated)`, `dm-integrity`, `unknown`).
    pub fn name(&self) -> &'static str {
        match self {
            Format::Luks1 => "LUKS1",
            Format::Luks2 { aead: false } => "LUKS2",
            Format::Luks2 { aead: true } => "LUKS2 (authenticated encryption)",
            Format::Integrity => "dm-integrity",
            Format::Bitlk => "BitLocker",
            Format::Fvault2 => "FileVault2",
            Format::Unknown => "unknown",
        }
    }

    /// cryptsetup's `--type` for it (`luks1`, `luks2`, `bitlk`, `fvault2`; `integrity` for
    /// a standalone dm-integrity device, which integritysetup opens), `None` for unknown.
    pub fn type_name(&self) -> Option<&'static str> {
        Some(match self {
            Format::Luks1 => "luks1",
            Format::Luks2 { .. } => "luks2",
            Format::Integrity => "integrity",
            Format::Bitlk => "bitlk",
            Format::Fvault2 => "fvault2",
            Format::Unknown => return None,
        })
    }
}

/// BitLocker's signature at offset 3 of the volume header (the OEM name of its boot sector).
const BITLK_SIGNATURE: &[u8; 8] = b"-FVE-FS-";
/// BitLocker To Go's OEM name: a FAT one, so the GUID at [`BITLK_TOGO_GUID_AT`] decides.
const BITLK_TOGO_SIGNATURE: &[u8; 8] = b"MSWIN4.1";
/// Where a To Go volume keeps its BitLocker information GUID.
const BITLK_TOGO_GUID_AT: usize = 424;
/// The BitLocker information GUIDs (normal and "encrypt on write"), as stored.
const BITLK_GUIDS: [[u8; 16]; 2] = [
    [0x3b, 0xd6, 0x67, 0x49, 0x29, 0x2e, 0xd8, 0x4a, 0x83, 0x99, 0xf6, 0xa3, 0x39, 0xe3, 0xd0, 0x01],
    [0x3b, 0x4d, 0xa8, 0x92, 0x80, 0xdd, 0x0e, 0x4d, 0x9e, 0x4e, 0xb1, 0xe3, 0x28, 0x4e, 0xae, 0xd8],
];

/// How a BitLocker volume header is marked: `Some(false)` normal, `Some(true)` To Go.
fn bitlk_kind(first: &[u8]) -> Option<bool> {
    let sig = first.get(3..11)?;
    if sig == BITLK_SIGNATURE {
        return Some(false);
    }
    let guid = first.get(BITLK_TOGO_GUID_AT..BITLK_TOGO_GUID_AT + 16)?;
    (sig == BITLK_TOGO_SIGNATURE && BITLK_GUIDS.iter().any(|g| g == guid)).then_some(true)
}

/// The first 512 bytes (fewer on a shorter device), read in logical blocks.
fn first_sector(dev: &dyn BlockDevice, name: &str) -> Result<Vec<u8>, VolumeError> {
    let g = dev.geometry();
    let block = u64::from(g.logical_block.max(1));
    let want = 512u64.div_ceil(block) * block;
    let len = want.min(g.size / block * block);
    let mut buf = vec![0u8; len as usize];
    if len > 0 {
        dev.read_at(0, &mut buf).map_err(|source| VolumeError::Device { path: name.to_owned(), source })?;
    }
    buf.truncate(512);
    Ok(buf)
}

/// Says what is on `dev` (`name` for messages). Reads the first blocks only; a LUKS2
/// header is loaded (read-only, never repaired) to tell authenticated encryption apart.
/// LUKS is tried first, as blkid does.
pub fn probe(dev: &dyn BlockDevice, name: &str) -> Result<Format, VolumeError> {
    let luks_err = |source| VolumeError::Luks { path: name.to_owned(), source };
    match luks::probe(dev).map_err(luks_err)? {
        Some(LuksVersion::V1) => return Ok(Format::Luks1),
        Some(LuksVersion::V2) => {
            let aead = luks::Luks::load(dev, false).ok().and_then(|l| l.aead().ok().flatten()).is_some();
            return Ok(Format::Luks2 { aead });
        }
        None => {}
    }
    let integrity = crate::integrity::probe(dev)
        .map_err(|source| VolumeError::Device { path: name.to_owned(), source })?;
    if integrity {
        return Ok(Format::Integrity);
    }
    let first = first_sector(dev, name)?;
    if bitlk_kind(&first).is_some() {
        return Ok(Format::Bitlk);
    }
    if fvault2::is_volume_header(&first) {
        return Ok(Format::Fvault2);
    }
    Ok(Format::Unknown)
}

/// What `sealdisk probe` says about a device: the format and what its header tells in
/// plaintext (no key is needed or asked for).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Description {
    /// The format.
    pub format: Format,
    /// Format version or variant (`1`, `2`, `To Go`), when the format has one.
    pub version: Option<String>,
    /// The header's UUID (LUKS; FileVault2's physical volume UUID).
    pub uuid: Option<String>,
    /// The label (LUKS2), when set.
    pub label: Option<String>,
    /// Device size in bytes.
    pub size: u64,
    /// The data cipher (LUKS: the segment's; FileVault2: always `aes-xts-plain64`).
    pub cipher: Option<String>,
    /// Whether the data is authenticated (LUKS2 `--integrity`), for encrypted formats.
    pub authenticated: Option<bool>,
    /// A standalone dm-integrity superblock: tag size in bytes.
    pub tag_size: Option<u32>,
    /// A standalone dm-integrity superblock: `bitmap` while its dirty-bitmap flag is set
    /// (bitmap mode active, or left uncleanly). The mode (journal, bitmap, direct) is
    /// chosen at activation and not otherwise recorded in the superblock.
    pub integrity_mode: Option<&'static str>,
    /// A standalone dm-integrity superblock: its flags, as `integritysetup dump` names them.
    pub integrity_flags: Vec<&'static str>,
}

/// [`probe`], and what the format's header says (a header that fails to load still gives
/// the format, with the fields it could not read left out).
pub fn describe(dev: &dyn BlockDevice, name: &str) -> Result<Description, VolumeError> {
    let format = probe(dev, name)?;
    let mut d = Description {
        format,
        version: None,
        uuid: None,
        label: None,
        size: dev.geometry().size,
        cipher: None,
        authenticated: None,
        tag_size: None,
        integrity_mode: None,
        integrity_flags: Vec::new(),
    };
    match format {
        Format::Luks1 | Format::Luks2 { .. } => {
            d.version = Some(if format == Format::Luks1 { "1" } else { "2" }.to_owned());
            d.authenticated = Some(matches!(format, Format::Luks2 { aead: true }));
            if let Ok(l) = luks::Luks::load(dev, false) {
                d.uuid = Some(l.uuid().to_owned());
                d.label = l.label().filter(|s| !s.is_empty()).map(str::to_owned);
                d.cipher = l.segment().ok().map(|s| s.cipher);
            }
        }
        Format::Integrity => {
            if let Ok(sb) = crate::integrity::read_superblock(dev, name) {
                d.version = Some(sb.version.to_string());
                d.tag_size = Some(u32::from(sb.integrity_tag_size));
                let bitmap = sb.flags.has(formats::integrity::SbFlags::DIRTY_BITMAP);
                d.integrity_mode = bitmap.then_some("bitmap");
                d.integrity_flags = sb.flags.names();
            }
        }
        Format::Bitlk => {
            let first = first_sector(dev, name)?;
            d.version = bitlk_kind(&first).filter(|&togo| togo).map(|_| "To Go".to_owned());
            d.authenticated = Some(false);
        }
        Format::Fvault2 => {
            let first = first_sector(dev, name)?;
            if let Ok(h) = fvault2::VolumeHeader::decode(&first) {
                d.uuid = Some(fvault2::uuid_text(&h.physical_volume_uuid));
            }
            d.cipher = Some("aes-xts-plain64".to_owned());
            d.authenticated = Some(false);
        }
        Format::Unknown => {}
    }
    Ok(d)
}

#[cfg(test)]
mod tests {
    use blockdev::MemDevice;

    use super::*;

    fn dev_with(at: usize, bytes: &[u8], size: u64) -> MemDevice {
        let mut v = vec![0u8; size as usize];
        v[at..at + bytes.len()].copy_from_slice(bytes);
        MemDevice::from_vec(v, 512)
    }

    #[test]
    fn bitlocker_signatures_are_recognised_and_a_fat_volume_is_not() {
        let d = dev_with(3, BITLK_SIGNATURE, 4096);
        assert_eq!(probe(&d, "d").unwrap(), Format::Bitlk);
        assert_eq!(describe(&d, "d").unwrap().version, None);
        let mut v = vec![0u8; 4096];
        v[3..11].copy_from_slice(BITLK_TOGO_SIGNATURE);
        let fat = MemDevice::from_vec(v.clone(), 512);
        assert_eq!(probe(&fat, "d").unwrap(), Format::Unknown, "an ordinary FAT32 volume");
        v[BITLK_TOGO_GUID_AT..BITLK_TOGO_GUID_AT + 16].copy_from_slice(&BITLK_GUIDS[1]);
        let togo = MemDevice::from_vec(v, 512);
        assert_eq!(probe(&togo, "d").unwrap(), Format::Bitlk);
        assert_eq!(describe(&togo, "d").unwrap().version.as_deref(), Some("To Go"));
    }

    #[test]
    fn short_and_empty_devices_are_unknown() {
        for size in [0u64, 512] {
            let d = MemDevice::from_vec(vec![0xa5; size as usize], 512);
            assert_eq!(probe(&d, "d").unwrap(), Format::Unknown);
            assert_eq!(describe(&d, "d").unwrap().size, size);
        }
    }

    #[test]
    fn a_core_storage_signature_needs_its_checksum() {
        let mut v = vec![0u8; 4096];
        v[8] = 1;
        v[88..90].copy_from_slice(b"CS");
        let d = MemDevice::from_vec(v.clone(), 512);
        assert_eq!(probe(&d, "d").unwrap(), Format::Unknown, "signature without a valid CRC32C");
        v[4..8].copy_from_slice(&u32::MAX.to_le_bytes());
        let c = fvault2::crc32c(u32::MAX, &v[8..512]);
        v[..4].copy_from_slice(&c.to_le_bytes());
        let d = MemDevice::from_vec(v, 512);
        assert_eq!(probe(&d, "d").unwrap(), Format::Fvault2);
    }
}
