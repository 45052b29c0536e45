//! BitLocker (cryptsetup's `BITLK`): the volume header and the FVE metadata, sans-IO.
//!
//! Layout (libbde's "BitLocker Drive Encryption (BDE) format"; what cryptsetup's
//! `lib/bitlk` reads). All integers little-endian.
//!
//! ```text
//! volume header (sector 0)              FVE metadata block (3 copies, 64 KiB areas)
//! 0    3  boot code EB 58 90 (v2)       0    8  "-FVE-FS-"
//! 3    8  "-FVE-FS-" ("MSWIN4.1": To Go) 8    2  size   10  2  version (2)
//!                                       12   2  state  14  2  next state (4: encrypted)
//! 11   2  bytes per sector              16   8  encrypted volume size
//! 160 16  FVE GUID                      28   4  volume header sectors
//! 176 24  3 × metadata block offset     32  24  3 × metadata block offset
//!                                       56   8  volume header (relocated boot sectors) offset
//!                                       64 ── FVE metadata header (48 bytes) ──
//!                                       64   4  metadata size (header + entries)
//!                                       68   4  version (1)   72  4  header size (48)
//!                                       80  16  volume GUID   96  4  next nonce counter
//!                                       100  2  encryption method
//!                                       104  8  creation time (FILETIME)
//!                                       112 ── entries, to 64 + metadata size ──
//! entry: 0 2 size | 2 2 entry type | 4 2 value type | 6 2 version | 8.. value
//!   VMK (value 8):        16 GUID | 8 time | 2 ? | 2 protection | nested entries
//!   stretch key (3):      4 method | 16 salt | nested entries
//!   AES-CCM key (5):      12 nonce | 16 MAC | encrypted blob
//!   key (1):              4 method | key bytes
//!   external key (9):     16 GUID | 8 time | nested entries            (the .BEK file)
//!   offset and size (15): 8 offset | 8 size                            (volume header block)
//!   unicode string (2):   UTF-16LE
//! ```
//! Every length and offset is checked against the bytes given before use; a bad image is a
//! [`BitlkError`] naming the field.

use zeroize::Zeroizing;

/// Signature of the volume header and of each metadata block.
pub const SIGNATURE: &[u8; 8] = b"-FVE-FS-";
/// BitLocker To Go's FAT wrapper signature (refused, as cryptsetup 2.6 does for the wrapper
/// it cannot map).
pub const SIGNATURE_TOGO: &[u8; 8] = b"MSWIN4.1";
/// Bytes of each FVE metadata area cryptsetup maps out (reads as zeroes).
pub const METADATA_AREA: u64 = 64 * 1024;
/// Bytes of the volume header read to probe.
pub const VOLUME_HEADER_BYTES: usize = 512;
/// The block header before the metadata header.
const BLOCK_HEADER: usize = 64;
/// The FVE metadata header.
const METADATA_HEADER: usize = 48;
/// The metadata block's encryption state of a fully encrypted volume.
const STATE_ENCRYPTED: u16 = 4;
/// An entry's fixed part.
const ENTRY_HEADER: usize = 8;

/// Why a BitLocker image does not parse.
#[derive(Debug, thiserror::Error, Clone, PartialEq, Eq)]
#[non_exhaustive]
pub enum BitlkError {
    /// Not a BitLocker volume (no boot code / signature).
    #[error("not a BitLocker device")]
    NotBitlk,
    /// A variant cryptsetup does not support either.
    #[error("{0}")]
    Unsupported(String),
    /// The data ends before a field.
    #[error("truncated {0}")]
    Truncated(&'static str),
    /// A field holds an impossible value.
    #[error("invalid {field}: {value}")]
    Invalid {
        /// Which field.
        field: &'static str,
        /// Its value.
        value: u64,
    },
}

fn le16(b: &[u8], at: usize, what: &'static str) -> Result<u16, BitlkError> {
    b.get(at..at + 2).map(|s| u16::from_le_bytes([s[0], s[1]])).ok_or(BitlkError::Truncated(what))
}
fn le32(b: &[u8], at: usize, what: &'static str) -> Result<u32, BitlkError> {
    b.get(at..at + 4).map(|s| u32::from_le_bytes([s[0], s[1], s[2], s[3]])).ok_or(BitlkError::Truncated(what))
}
fn le64(b: &[u8], at: usize, what: &'static str) -> Result<u64, BitlkError> {
    let s = b.get(at..at + 8).ok_or(BitlkError::Truncated(what))?;
    let mut a = [0u8; 8];
    a.copy_from_slice(s);
    Ok(u64::from_le_bytes(a))
}
fn array<const N: usize>(b: &[u8], at: usize, what: &'static str) -> Result<[u8; N], BitlkError> {
    let s = b.get(at..at + N).ok_or(BitlkError::Truncated(what))?;
    let mut a = [0u8; N];
    a.copy_from_slice(s);
    Ok(a)
}

/// What sector 0 says.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct VolumeHeader {
    /// Bytes per sector.
    pub sector_size: u16,
    /// Byte offsets of the three FVE metadata blocks.
    pub metadata_offsets: [u64; 3],
}

/// Parses the volume header (the first 512 bytes of the device).
pub fn parse_volume_header(b: &[u8]) -> Result<VolumeHeader, BitlkError> {
    let head = b.get(..VOLUME_HEADER_BYTES).ok_or(BitlkError::Truncated("volume header"))?;
    if &head[3..11] == SIGNATURE_TOGO && head[..3] == [0xeb, 0x58, 0x90] {
        return Err(BitlkError::Unsupported(
            "BitLocker To Go (FAT wrapper) devices are not supported".into(),
        ));
    }
    if &head[3..11] != SIGNATURE {
        return Err(BitlkError::NotBitlk);
    }
    match head[..3] {
        [0xeb, 0x58, 0x90] => {}
        [0xeb, 0x52, 0x90] => {
            return Err(BitlkError::Unsupported("BITLK version 1 is currently not supported".into()))
        }
        _ => return Err(BitlkError::NotBitlk),
    }
    let sector_size = le16(head, 11, "bytes per sector")?;
    if !matches!(sector_size, 512 | 1024 | 2048 | 4096) {
        return Err(BitlkError::Invalid { field: "bytes per sector", value: sector_size.into() });
    }
    let mut metadata_offsets = [0u64; 3];
    for (i, o) in metadata_offsets.iter_mut().enumerate() {
        *o = le64(head, 176 + 8 * i, "metadata offset")?;
        if *o == 0 || *o % u64::from(sector_size) != 0 {
            return Err(BitlkError::Invalid { field: "metadata offset", value: *o });
        }
    }
    Ok(VolumeHeader { sector_size, metadata_offsets })
}

/// The FVEK's encryption method (metadata header field), with cryptsetup's cipher names.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum EncryptionMethod {
    /// AES-128-CBC with the Elephant diffuser (0x8000).
    Aes128CbcDiffuser,
    /// AES-256-CBC with the Elephant diffuser (0x8001).
    Aes256CbcDiffuser,
    /// AES-128-CBC (0x8002).
    Aes128Cbc,
    /// AES-256-CBC (0x8003).
    Aes256Cbc,
    /// AES-128-XTS (0x8004).
    Aes128Xts,
    /// AES-256-XTS (0x8005).
    Aes256Xts,
}

impl EncryptionMethod {
    /// From the metadata header's value.
    pub fn from_u16(v: u16) -> Result<Self, BitlkError> {
        Ok(match v {
            0x8000 => Self::Aes128CbcDiffuser,
            0x8001 => Self::Aes256CbcDiffuser,
            0x8002 => Self::Aes128Cbc,
            0x8003 => Self::Aes256Cbc,
            0x8004 => Self::Aes128Xts,
            0x8005 => Self::Aes256Xts,
            0 => return Err(BitlkError::Unsupported("Unknown or unsupported encryption type.".into())),
            other => {
                return Err(BitlkError::Unsupported(format!(
                    "Unsupported BITLK encryption method 0x{other:04x}"
                )))
            }
        })
    }

    /// cryptsetup's `Cipher mode`.
    pub fn mode(self) -> &'static str {
        match self {
            Self::Aes128CbcDiffuser | Self::Aes256CbcDiffuser => "cbc-elephant",
            Self::Aes128Cbc | Self::Aes256Cbc => "cbc-eboiv",
            Self::Aes128Xts | Self::Aes256Xts => "xts-plain64",
        }
    }

    /// The dm-crypt key size in bits (`Cipher key`): XTS and Elephant keys are two halves.
    pub fn key_bits(self) -> usize {
        match self {
            Self::Aes128Cbc => 128,
            Self::Aes256Cbc | Self::Aes128Xts | Self::Aes128CbcDiffuser => 256,
            Self::Aes256Xts | Self::Aes256CbcDiffuser => 512,
        }
    }

    /// Builds the dm-crypt key from the FVEK blob: XTS uses it whole, CBC its first 16/32
    /// bytes, Elephant the FVEK half then the tweak half (each 16/32 bytes of a 32-byte
    /// slot).
    pub fn dm_key(self, fvek: &[u8]) -> Result<Zeroizing<Vec<u8>>, BitlkError> {
        let need = self.key_bits() / 8;
        let bad = || BitlkError::Invalid { field: "FVEK size", value: fvek.len() as u64 };
        Ok(Zeroizing::new(match self {
            Self::Aes128Xts | Self::Aes256Xts | Self::Aes128Cbc | Self::Aes256Cbc => {
                fvek.get(..need).ok_or_else(bad)?.to_vec()
            }
            Self::Aes128CbcDiffuser | Self::Aes256CbcDiffuser => {
                let half = need / 2;
                if fvek.len() < 64 {
                    return Err(bad());
                }
                let mut k = fvek[..half].to_vec();
                k.extend_from_slice(&fvek[32..32 + half]);
                k
            }
        }))
    }
}

/// How a VMK is protected (`Protection:` in `bitlkDump`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Protection {
    /// Unprotected (BitLocker suspended): the key is in the metadata.
    ClearKey,
    /// TPM only.
    Tpm,
    /// A startup key (.BEK file).
    StartupKey,
    /// TPM and PIN.
    TpmPin,
    /// A 48-digit recovery password.
    RecoveryPassphrase,
    /// A password.
    Passphrase,
    /// Anything else (the raw value).
    Other(u16),
}

impl Protection {
    fn from_u16(v: u16) -> Self {
        match v {
            0x0000 => Self::ClearKey,
            0x0100 => Self::Tpm,
            0x0200 => Self::StartupKey,
            0x0500 => Self::TpmPin,
            0x0800 => Self::RecoveryPassphrase,
            0x2000 => Self::Passphrase,
            o => Self::Other(o),
        }
    }

    /// cryptsetup's wording.
    pub fn describe(self) -> String {
        match self {
            Self::ClearKey => "VMK protected with clear key".into(),
            Self::Tpm => "VMK protected with TPM".into(),
            Self::StartupKey => "VMK protected with startup key".into(),
            Self::TpmPin => "VMK protected with TPM and PIN".into(),
            Self::RecoveryPassphrase => "VMK protected with recovery passphrase".into(),
            Self::Passphrase => "VMK protected with passphrase".into(),
            Self::Other(v) => format!("unknown (0x{v:04x})"),
        }
    }
}

/// An AES-CCM encrypted key (value type 5).
#[derive(Clone, PartialEq, Eq)]
pub struct EncryptedKey {
    /// The 12-byte nonce (FILETIME + counter).
    pub nonce: [u8; 12],
    /// The CCM tag.
    pub mac: [u8; 16],
    /// The encrypted blob.
    pub data: Vec<u8>,
}

impl std::fmt::Debug for EncryptedKey {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "EncryptedKey({} bytes)", self.data.len())
    }
}

fn encrypted_key(v: &[u8]) -> Result<EncryptedKey, BitlkError> {
    if v.len() < 28 + 12 {
        return Err(BitlkError::Truncated("AES-CCM encrypted key"));
    }
    Ok(EncryptedKey { nonce: array(v, 0, "nonce")?, mac: array(v, 12, "MAC")?, data: v[28..].to_vec() })
}

/// One VMK entry (a keyslot in `bitlkDump`).
#[derive(Clone, PartialEq, Eq)]
pub struct Vmk {
    /// Its GUID (for a startup key: the .BEK file's GUID).
    pub guid: [u8; 16],
    /// How it is protected.
    pub protection: Protection,
    /// Its name string entry, if any ("DiskPassword", "ExternalKey").
    pub name: Option<String>,
    /// The stretch key's salt (password and recovery protectors; zero otherwise).
    pub salt: [u8; 16],
    /// The VMK, encrypted with the protector's key.
    pub key: Option<EncryptedKey>,
    /// A clear key protector's key (encrypts `key`).
    pub clear_key: Option<Zeroizing<Vec<u8>>>,
}

impl std::fmt::Debug for Vmk {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Vmk")
            .field("guid", &format_guid(&self.guid))
            .field("protection", &self.protection)
            .field("name", &self.name)
            .field("key", &self.key)
            .finish_non_exhaustive()
    }
}

/// The parsed FVE metadata block.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Metadata {
    /// Block version (2 from Windows 7 on).
    pub version: u16,
    /// Size of the encrypted volume in bytes.
    pub volume_size: u64,
    /// Byte offsets of the three metadata blocks.
    pub metadata_offsets: [u64; 3],
    /// Where the original boot sectors were moved (encrypted there, at their new sectors).
    pub volume_header_offset: u64,
    /// How many bytes were moved.
    pub volume_header_size: u64,
    /// The volume GUID.
    pub guid: [u8; 16],
    /// FVEK encryption method.
    pub method: EncryptionMethod,
    /// Creation time (FILETIME: 100 ns since 1601).
    pub created: u64,
    /// Description string.
    pub description: Option<String>,
    /// VMK entries, in metadata order.
    pub vmks: Vec<Vmk>,
    /// The FVEK encrypted with the VMK.
    pub fvek: EncryptedKey,
}

/// One raw entry.
struct Entry<'a> {
    entry_type: u16,
    value_type: u16,
    value: &'a [u8],
}

fn entries(mut b: &[u8]) -> Result<Vec<Entry<'_>>, BitlkError> {
    let mut out = Vec::new();
    while b.len() >= ENTRY_HEADER {
        let size = usize::from(le16(b, 0, "entry size")?);
        if size == 0 {
            break;
        }
        if size < ENTRY_HEADER || size > b.len() {
            return Err(BitlkError::Invalid { field: "metadata entry size", value: size as u64 });
        }
        out.push(Entry {
            entry_type: le16(b, 2, "entry type")?,
            value_type: le16(b, 4, "value type")?,
            value: &b[ENTRY_HEADER..size],
        });
        b = &b[size..];
    }
    Ok(out)
}

fn utf16(v: &[u8]) -> String {
    let units: Vec<u16> = v.chunks_exact(2).map(|c| u16::from_le_bytes([c[0], c[1]])).collect();
    String::from_utf16_lossy(&units).trim_end_matches('\0').to_owned()
}

/// Value types.
const VT_KEY: u16 = 1;
const VT_STRING: u16 = 2;
const VT_STRETCH: u16 = 3;
const VT_CCM: u16 = 5;
const VT_VMK: u16 = 8;
const VT_EXTERNAL: u16 = 9;
const VT_OFFSET_SIZE: u16 = 15;
/// Entry types.
const ET_VMK: u16 = 2;
const ET_FVEK: u16 = 3;
const ET_STARTUP_KEY: u16 = 6;
const ET_DESCRIPTION: u16 = 7;
const ET_VOLUME_HEADER: u16 = 15;

fn vmk(v: &[u8]) -> Result<Vmk, BitlkError> {
    if v.len() < 28 {
        return Err(BitlkError::Truncated("VMK entry"));
    }
    let mut out = Vmk {
        guid: array(v, 0, "VMK GUID")?,
        protection: Protection::from_u16(le16(v, 26, "VMK protection")?),
        name: None,
        salt: [0; 16],
        key: None,
        clear_key: None,
    };
    for e in entries(&v[28..])? {
        match e.value_type {
            VT_STRING => out.name = Some(utf16(e.value)),
            VT_STRETCH => {
                if e.value.len() < 20 {
                    return Err(BitlkError::Truncated("stretch key"));
                }
                out.salt = array(e.value, 4, "salt")?;
            }
            VT_CCM => out.key = Some(encrypted_key(e.value)?),
            VT_KEY => {
                if e.value.len() < 4 + 16 {
                    return Err(BitlkError::Truncated("clear key"));
                }
                out.clear_key = Some(Zeroizing::new(e.value[4..].to_vec()));
            }
            _ => {}
        }
    }
    Ok(out)
}

/// Parses one FVE metadata block (`b` starts at its signature; up to [`METADATA_AREA`]
/// bytes).
pub fn parse_metadata(b: &[u8]) -> Result<Metadata, BitlkError> {
    if b.get(..8) != Some(&SIGNATURE[..]) {
        return Err(BitlkError::Invalid { field: "metadata block signature", value: 0 });
    }
    let version = le16(b, 10, "metadata block version")?;
    if version != 2 {
        return Err(BitlkError::Unsupported(format!("BITLK metadata version {version} is not supported")));
    }
    // Encryption state, current and next (libbde: 1 decrypted, 2 switching, 4 encrypted,
    // 5 paused): only a volume that is wholly encrypted maps as one crypt target.
    let (state, next) = (le16(b, 12, "encryption state")?, le16(b, 14, "next encryption state")?);
    if state != STATE_ENCRYPTED || next != STATE_ENCRYPTED {
        return Err(BitlkError::Unsupported(format!(
            "BITLK device is not fully encrypted (state {state}, next {next}): activation of partially encrypted or decrypted devices is not supported."
        )));
    }
    let volume_size = le64(b, 16, "volume size")?;
    let vh_sectors = le32(b, 28, "volume header sectors")?;
    let mut metadata_offsets = [0u64; 3];
    for (i, o) in metadata_offsets.iter_mut().enumerate() {
        *o = le64(b, 32 + 8 * i, "metadata offset")?;
    }
    let volume_header_offset = le64(b, 56, "volume header offset")?;
    let h = b.get(BLOCK_HEADER..).ok_or(BitlkError::Truncated("metadata header"))?;
    let size = le32(h, 0, "metadata size")? as usize;
    let header_size = le32(h, 8, "metadata header size")? as usize;
    if header_size != METADATA_HEADER {
        return Err(BitlkError::Invalid { field: "metadata header size", value: header_size as u64 });
    }
    if size < METADATA_HEADER || size > h.len() {
        return Err(BitlkError::Invalid { field: "metadata size", value: size as u64 });
    }
    let guid = array(h, 16, "volume GUID")?;
    let method = EncryptionMethod::from_u16(le16(h, 36, "encryption method")?)?;
    let created = le64(h, 40, "creation time")?;
    let mut description = None;
    let mut vmks = Vec::new();
    let mut fvek = None;
    let mut volume_header_size = u64::from(vh_sectors) * 512;
    for e in entries(&h[METADATA_HEADER..size])? {
        match (e.entry_type, e.value_type) {
            (ET_VMK, VT_VMK) => vmks.push(vmk(e.value)?),
            (ET_FVEK, VT_CCM) => fvek = Some(encrypted_key(e.value)?),
            (ET_DESCRIPTION, VT_STRING) => description = Some(utf16(e.value)),
            (ET_VOLUME_HEADER, VT_OFFSET_SIZE) => {
                let off = le64(e.value, 0, "volume header block offset")?;
                let len = le64(e.value, 8, "volume header block size")?;
                if off != volume_header_offset {
                    return Err(BitlkError::Invalid { field: "volume header block offset", value: off });
                }
                volume_header_size = len;
            }
            _ => {}
        }
    }
    let fvek = fvek.ok_or(BitlkError::Truncated("FVEK entry"))?;
    if volume_header_size == 0 || volume_header_size % 512 != 0 || volume_header_size > (1 << 30) {
        return Err(BitlkError::Invalid { field: "volume header size", value: volume_header_size });
    }
    if volume_header_offset == 0 || volume_header_offset % 512 != 0 {
        return Err(BitlkError::Invalid { field: "volume header offset", value: volume_header_offset });
    }
    Ok(Metadata {
        version,
        volume_size,
        metadata_offsets,
        volume_header_offset,
        volume_header_size,
        guid,
        method,
        created,
        description,
        vmks,
        fvek,
    })
}

/// A startup key file (.BEK): its GUID (matches a startup-key VMK's) and the 32-byte key.
pub struct Bek {
    /// The key's GUID.
    pub guid: [u8; 16],
    /// The external key.
    pub key: Zeroizing<[u8; 32]>,
}

impl std::fmt::Debug for Bek {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "Bek({}, key redacted)", format_guid(&self.guid))
    }
}

/// Parses a .BEK file: an FVE metadata header (48 bytes) and a startup-key entry holding an
/// external key whose key entry is the 32-byte key.
pub fn parse_bek(b: &[u8]) -> Result<Bek, BitlkError> {
    let size = le32(b, 0, "BEK size")? as usize;
    let header_size = le32(b, 8, "BEK header size")? as usize;
    if header_size != METADATA_HEADER || size < METADATA_HEADER || size > b.len() {
        return Err(BitlkError::Invalid { field: "BEK size", value: size as u64 });
    }
    for e in entries(&b[METADATA_HEADER..size])? {
        if e.entry_type != ET_STARTUP_KEY || e.value_type != VT_EXTERNAL || e.value.len() < 24 {
            continue;
        }
        let guid = array(e.value, 0, "BEK GUID")?;
        for k in entries(&e.value[24..])? {
            if k.value_type == VT_KEY && k.value.len() == 4 + 32 {
                let mut key = Zeroizing::new([0u8; 32]);
                key.copy_from_slice(&k.value[4..]);
                return Ok(Bek { guid, key });
            }
        }
    }
    Err(BitlkError::Invalid { field: "BEK startup key entry", value: 0 })
}

/// A GUID as `bitlkDump` prints it (mixed-endian, as Windows).
pub fn format_guid(g: &[u8; 16]) -> String {
    format!(
        "{:08x}-{:04x}-{:04x}-{}-{}",
        u32::from_le_bytes([g[0], g[1], g[2], g[3]]),
        u16::from_le_bytes([g[4], g[5]]),
        u16::from_le_bytes([g[6], g[7]]),
        hex::encode(&g[8..10]),
        hex::encode(&g[10..16])
    )
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn guid_is_mixed_endian() {
        let g: [u8; 16] = hex::decode("3bd66749292ed84a8399f6a339e3d001").unwrap().try_into().unwrap();
        assert_eq!(format_guid(&g), "4967d63b-2e29-4ad8-8399-f6a339e3d001");
    }

    #[test]
    fn volume_header_refuses_other_signatures() {
        let mut s = vec![0u8; 512];
        assert_eq!(parse_volume_header(&s), Err(BitlkError::NotBitlk));
        s[..3].copy_from_slice(&[0xeb, 0x52, 0x90]);
        s[3..11].copy_from_slice(SIGNATURE);
        assert!(matches!(parse_volume_header(&s), Err(BitlkError::Unsupported(_))));
        assert_eq!(parse_volume_header(&s[..100]), Err(BitlkError::Truncated("volume header")));
    }

    #[test]
    fn entry_sizes_are_bounded() {
        // An entry claiming more bytes than there are.
        let mut b = vec![0u8; 16];
        b[0] = 200;
        assert!(matches!(entries(&b), Err(BitlkError::Invalid { .. })));
        b[0] = 4;
        assert!(matches!(entries(&b), Err(BitlkError::Invalid { .. })));
    }
}
