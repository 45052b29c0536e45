//! FileVault2 (legacy, Core Storage) metadata: decode and validate. Sans-IO, read-only.
//!
//! What cryptsetup's `--type fvault2` reads (cryptsetup ≥ 2.6, `lib/fvault2/`), with the
//! structures as libfvde documents them ("FileVault Drive Encryption (FVDE)" format notes).
//! All integers are **little-endian**, except the `"CS"` signature. Every block starts with
//! a CRC32C (Castagnoli, reflected, no final inversion) over the rest of the block, seeded
//! with the value stored beside it, which must be `0xffffffff`.
//!
//! ```text
//!  physical volume header (512 bytes at offset 0 of the partition)
//!  off  size  field
//!    0     4  checksum              CRC32C of bytes 8..512
//!    4     4  seed                  0xffffffff
//!    8     2  version               1
//!   10     2  block type            0x0010
//!   64     8  physical volume size  bytes
//!   88     2  signature             "CS"
//!   90     4  checksum algorithm    1 (CRC32C)
//!   96     4  block size            bytes; the unit of every block offset below
//!  100     4  metadata size         bytes
//!  104     8  disk label block      block offset of the first metadata block
//!  112    24  other metadata blocks 3 × block offsets (copies)
//!  168     4  key data size         16 (AES-128)
//!  172     4  encryption method     2 (AES-XTS)
//!  176    16  key data              first half of the metadata key
//!  304    16  physical volume UUID  binary; second half of the metadata key
//!
//!  metadata block (8192 bytes; 64-byte header, then the type's body)
//!    0     8  checksum, seed        CRC32C of bytes 8..8192
//!    8     2  version
//!   10     2  block type
//!   32     8  block number
//!   48     4  block size
//!
//!  disk label (type 0x0011, plaintext, at `disk label block`)
//!  220     4  volume groups descriptor offset, bytes from the block's start
//!  volume groups descriptor (40 bytes)
//!    8     8  encrypted metadata size, in 8192-byte blocks
//!   32     8  encrypted metadata start, block offset
//!
//!  encrypted metadata: 8192-byte blocks, AES-XTS-128 with key = key data ‖ physical volume
//!  UUID and tweak = the block's index from the start (u64 LE), one XTS unit per block; an
//!  all-zero block ends them. Blocks of three types matter (a later one of a type replaces
//!  an earlier one, as in cryptsetup):
//!  0x0019  encryption context    112: XML offset (from the block's start), 116: XML size;
//!          plist keys PassphraseWrappedKEKStruct, KEKWrappedVolumeKeyStruct (base64 <data>)
//!  0x001a  logical volume        128: XML offset, 132: XML size; plist keys
//!          com.apple.corestorage.lv.size (<integer>, hex), ...lv.familyUUID (<string>)
//!  0x0305  segment map           104: logical volume start, block offset (u32)
//!
//!  PassphraseWrappedKEKStruct (284 bytes)     KEKWrappedVolumeKeyStruct (256 bytes)
//!    8    16  PBKDF2 salt                        8    24  wrapped volume key (RFC 3394)
//!   32    24  wrapped KEK (RFC 3394)
//!  168     4  PBKDF2-SHA256 iterations
//! ```
//!
//! The volume key: PBKDF2-HMAC-SHA256(passphrase, salt, iterations) → 16 bytes that unwrap
//! the KEK, which unwraps the 16-byte volume key; the data is `aes-xts-plain64` with the key
//! `volume key ‖ SHA-256(volume key ‖ family UUID)[..16]`, 512-byte sectors, from the
//! logical volume start (`volume::fvault2` does the crypto and the reads).
//!
//! Every offset is checked against [`MAX_METADATA_OFFSET`] (cryptsetup's bound) before it is
//! read, every XML extent against its block, every decoded structure against its size.

use std::fmt;

use base64::Engine;
use zeroize::{Zeroize, Zeroizing};

/// Size of the physical volume header.
pub const VOLUME_HEADER_SIZE: usize = 512;
/// Size of a metadata block (plaintext disk label and each encrypted metadata block).
pub const METADATA_BLOCK_SIZE: usize = 8192;
/// Size of the volume groups descriptor read after the disk label.
pub const VOLUME_GROUPS_DESCRIPTOR_SIZE: usize = 40;
/// No metadata is read beyond this byte offset (cryptsetup's `FVAULT2_MAX_OFF`).
pub const MAX_METADATA_OFFSET: u64 = crate::limits::FVAULT2_MAX_METADATA_OFFSET;
/// Largest block size accepted (Core Storage uses 4096).
pub const MAX_BLOCK_SIZE: u32 = 1 << 20;
/// Size of the PBKDF2 salt.
pub const SALT_SIZE: usize = 16;
/// Size of an RFC 3394-wrapped 128-bit key.
pub const WRAPPED_KEY_SIZE: usize = 24;
/// Size of the AES-XTS key of the data and of the encrypted metadata.
pub const XTS_KEY_SIZE: usize = 32;

const SEED: u32 = 0xffff_ffff;
const SIGNATURE: [u8; 2] = *b"CS";
const HDR_VERSION: usize = 8;
const HDR_BLOCK_TYPE: usize = 10;
const HDR_PV_SIZE: usize = 64;
const HDR_SIGNATURE: usize = 88;
const HDR_BLOCK_SIZE: usize = 96;
const HDR_METADATA_SIZE: usize = 100;
const HDR_DISK_LABEL: usize = 104;
const HDR_OTHER_METADATA: usize = 112;
const HDR_KEY_DATA_SIZE: usize = 168;
const HDR_ENCRYPTION: usize = 172;
const HDR_KEY_DATA: usize = 176;
const HDR_PV_UUID: usize = 304;
const MD_BLOCK_TYPE: usize = 10;
const DL_VGD_OFFSET: usize = 220;
const VGD_BLOCKS: usize = 8;
const VGD_START: usize = 32;
const CTX_XML_OFFSET: usize = 112;
const LV_XML_OFFSET: usize = 128;
const SEG_LV_BLOCK: usize = 104;
const PWK_SIZE: usize = 284;
const PWK_SALT: usize = 8;
const PWK_KEK: usize = 32;
const PWK_ITERATIONS: usize = 168;
const KWVK_SIZE: usize = 256;
const KWVK_KEY: usize = 8;

/// Block type of an encryption context (the wrapped keys).
pub const BLOCK_ENCRYPTION_CONTEXT: u16 = 0x0019;
/// Block type of a logical volume description (size, family UUID).
pub const BLOCK_LOGICAL_VOLUME: u16 = 0x001a;
/// Block type of a segment map (the logical volume's start).
pub const BLOCK_SEGMENT_MAP: u16 = 0x0305;

/// A malformed FileVault2 structure. Each variant names what was wrong.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[non_exhaustive]
pub enum Fvault2Error {
    /// Fewer bytes than the structure needs.
    #[error("{what}: {len} bytes, {need} needed")]
    TooShort {
        /// The structure.
        what: &'static str,
        /// Bytes given.
        len: usize,
        /// Bytes needed.
        need: usize,
    },
    /// The block's CRC32C (or its seed) does not match.
    #[error("{what}: checksum mismatch")]
    Checksum {
        /// The structure.
        what: &'static str,
    },
    /// No `"CS"` signature.
    #[error("no Core Storage signature")]
    Signature,
    /// A physical volume header version other than 1.
    #[error("unsupported FVAULT2 version {0}")]
    Version(u16),
    /// A metadata key size other than 16 bytes.
    #[error("unsupported AES key size: {0} bytes")]
    KeySize(u32),
    /// A block size of zero, not a multiple of 512, or over [`MAX_BLOCK_SIZE`].
    #[error("block size {0} is not supported")]
    BlockSize(u32),
    /// An offset overflows or lies beyond [`MAX_METADATA_OFFSET`].
    #[error("{what} at {value} lies beyond the metadata bound")]
    Offset {
        /// The field.
        what: &'static str,
        /// Its value (bytes, or blocks when it overflowed).
        value: u64,
    },
    /// An XML extent outside its block.
    #[error("block type {block_type:#06x}: XML extent {offset}+{size} outside the block")]
    XmlExtent {
        /// Block type.
        block_type: u16,
        /// XML offset.
        offset: u32,
        /// XML size.
        size: u32,
    },
    /// A plist property is missing (or not of the expected element).
    #[error("property {0} not found")]
    Property(&'static str),
    /// A plist property's value does not decode.
    #[error("property {0}: bad value")]
    Value(&'static str),
    /// A decoded key structure of the wrong size.
    #[error("{what}: {len} bytes, {need} expected")]
    StructSize {
        /// The structure.
        what: &'static str,
        /// Decoded size.
        len: usize,
        /// Expected size.
        need: usize,
    },
    /// The encrypted metadata lacks a block type.
    #[error("necessary FVAULT2 metadata blocks not found (no block of type {0:#06x})")]
    Missing(u16),
}

/// The CRC32C Core Storage uses: reflected Castagnoli from `seed`, without a final inversion.
pub fn crc32c(seed: u32, data: &[u8]) -> u32 {
    // The crc32c crate inverts on the way in and out.
    !crc32c::crc32c_append(!seed, data)
}

fn le16(b: &[u8], at: usize) -> u16 {
    u16::from_le_bytes([b[at], b[at + 1]])
}

fn le32(b: &[u8], at: usize) -> u32 {
    u32::from_le_bytes([b[at], b[at + 1], b[at + 2], b[at + 3]])
}

fn le64(b: &[u8], at: usize) -> u64 {
    let mut v = [0u8; 8];
    v.copy_from_slice(&b[at..at + 8]);
    u64::from_le_bytes(v)
}

/// Checks the length and the leading checksum of a block.
fn checked<'a>(b: &'a [u8], need: usize, what: &'static str) -> Result<&'a [u8], Fvault2Error> {
    let b = b.get(..need).ok_or(Fvault2Error::TooShort { what, len: b.len(), need })?;
    if le32(b, 4) != SEED || crc32c(SEED, &b[8..]) != le32(b, 0) {
        return Err(Fvault2Error::Checksum { what });
    }
    Ok(b)
}

/// `offset` in blocks times `block_size`, within [`MAX_METADATA_OFFSET`].
fn metadata_offset(what: &'static str, blocks: u64, block_size: u32) -> Result<u64, Fvault2Error> {
    match blocks.checked_mul(u64::from(block_size)) {
        Some(off) if off <= MAX_METADATA_OFFSET => Ok(off),
        Some(off) => Err(Fvault2Error::Offset { what, value: off }),
        None => Err(Fvault2Error::Offset { what, value: blocks }),
    }
}

/// Whether `b` starts with something that looks like a Core Storage physical volume header
/// (signature, version 1 and a valid checksum): the format probe.
pub fn is_volume_header(b: &[u8]) -> bool {
    b.len() >= VOLUME_HEADER_SIZE
        && b[HDR_SIGNATURE..HDR_SIGNATURE + 2] == SIGNATURE
        && le16(b, HDR_VERSION) == 1
        && checked(b, VOLUME_HEADER_SIZE, "volume header").is_ok()
}

/// The physical volume header.
#[derive(Clone, PartialEq, Eq)]
pub struct VolumeHeader {
    /// Block type (0x0010).
    pub block_type: u16,
    /// Physical volume size in bytes.
    pub physical_size: u64,
    /// Block size in bytes.
    pub block_size: u32,
    /// Metadata size in bytes.
    pub metadata_size: u32,
    /// Block offset of the disk label.
    pub disk_label_block: u64,
    /// Block offsets of the other metadata copies.
    pub other_metadata_blocks: [u64; 3],
    /// Encryption method (2: AES-XTS).
    pub encryption: u32,
    /// Physical volume UUID (binary).
    pub physical_volume_uuid: [u8; 16],
    /// The metadata key (key data ‖ physical volume UUID). It sits in plaintext on the
    /// disk, but is handled as a key all the same.
    metadata_key: Zeroizing<[u8; XTS_KEY_SIZE]>,
}

impl fmt::Debug for VolumeHeader {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("VolumeHeader")
            .field("block_type", &self.block_type)
            .field("physical_size", &self.physical_size)
            .field("block_size", &self.block_size)
            .field("metadata_size", &self.metadata_size)
            .field("disk_label_block", &self.disk_label_block)
            .field("other_metadata_blocks", &self.other_metadata_blocks)
            .field("encryption", &self.encryption)
            .field("physical_volume_uuid", &uuid_text(&self.physical_volume_uuid))
            .finish_non_exhaustive()
    }
}

impl VolumeHeader {
    /// Decodes and validates the first [`VOLUME_HEADER_SIZE`] bytes of `b` as cryptsetup
    /// does (checksum, version 1, signature, 16-byte key data), plus a sane block size.
    pub fn decode(b: &[u8]) -> Result<Self, Fvault2Error> {
        let b = checked(b, VOLUME_HEADER_SIZE, "volume header")?;
        let version = le16(b, HDR_VERSION);
        if version != 1 {
            return Err(Fvault2Error::Version(version));
        }
        if b[HDR_SIGNATURE..HDR_SIGNATURE + 2] != SIGNATURE {
            return Err(Fvault2Error::Signature);
        }
        let key_size = le32(b, HDR_KEY_DATA_SIZE);
        if key_size != 16 {
            return Err(Fvault2Error::KeySize(key_size));
        }
        let block_size = le32(b, HDR_BLOCK_SIZE);
        if block_size == 0 || !block_size.is_multiple_of(512) || block_size > MAX_BLOCK_SIZE {
            return Err(Fvault2Error::BlockSize(block_size));
        }
        let mut physical_volume_uuid = [0u8; 16];
        physical_volume_uuid.copy_from_slice(&b[HDR_PV_UUID..HDR_PV_UUID + 16]);
        let mut metadata_key = Zeroizing::new([0u8; XTS_KEY_SIZE]);
        metadata_key[..16].copy_from_slice(&b[HDR_KEY_DATA..HDR_KEY_DATA + 16]);
        metadata_key[16..].copy_from_slice(&physical_volume_uuid);
        Ok(VolumeHeader {
            block_type: le16(b, HDR_BLOCK_TYPE),
            physical_size: le64(b, HDR_PV_SIZE),
            block_size,
            metadata_size: le32(b, HDR_METADATA_SIZE),
            disk_label_block: le64(b, HDR_DISK_LABEL),
            other_metadata_blocks: [
                le64(b, HDR_OTHER_METADATA),
                le64(b, HDR_OTHER_METADATA + 8),
                le64(b, HDR_OTHER_METADATA + 16),
            ],
            encryption: le32(b, HDR_ENCRYPTION),
            physical_volume_uuid,
            metadata_key,
        })
    }

    /// The AES-XTS-128 key of the encrypted metadata.
    pub fn metadata_key(&self) -> &[u8; XTS_KEY_SIZE] {
        &self.metadata_key
    }

    /// Byte offset of the disk label, bounded.
    pub fn disk_label_offset(&self) -> Result<u64, Fvault2Error> {
        metadata_offset("disk label", self.disk_label_block, self.block_size)
    }
}

/// The offset of the volume groups descriptor in the disk label block at
/// `disk_label_offset` (absolute, bounded).
pub fn volume_groups_descriptor_offset(
    disk_label: &[u8],
    disk_label_offset: u64,
) -> Result<u64, Fvault2Error> {
    let b = checked(disk_label, METADATA_BLOCK_SIZE, "disk label")?;
    let off = disk_label_offset + u64::from(le32(b, DL_VGD_OFFSET));
    if off > MAX_METADATA_OFFSET {
        return Err(Fvault2Error::Offset { what: "volume groups descriptor", value: off });
    }
    Ok(off)
}

/// Where the encrypted metadata is.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct EncryptedMetadataExtent {
    /// Byte offset of the first block (bounded).
    pub offset: u64,
    /// Number of 8192-byte blocks (reads stop at [`MAX_METADATA_OFFSET`]).
    pub blocks: u64,
}

impl EncryptedMetadataExtent {
    /// Decodes a volume groups descriptor.
    pub fn decode(b: &[u8], block_size: u32) -> Result<Self, Fvault2Error> {
        let need = VOLUME_GROUPS_DESCRIPTOR_SIZE;
        let b = b.get(..need).ok_or(Fvault2Error::TooShort {
            what: "volume groups descriptor",
            len: b.len(),
            need,
        })?;
        let offset = metadata_offset("encrypted metadata", le64(b, VGD_START), block_size)?;
        Ok(EncryptedMetadataExtent { offset, blocks: le64(b, VGD_BLOCKS) })
    }

    /// Byte offset of block `i`, `None` past the bound (where reading stops with an error).
    pub fn block_offset(&self, i: u64) -> Result<u64, Fvault2Error> {
        let off = i.checked_mul(METADATA_BLOCK_SIZE as u64).and_then(|o| o.checked_add(self.offset));
        match off {
            Some(o) if o <= MAX_METADATA_OFFSET => Ok(o),
            _ => Err(Fvault2Error::Offset { what: "encrypted metadata block", value: i }),
        }
    }
}

/// The passphrase-protected keys of an encryption context.
#[derive(Clone, PartialEq, Eq)]
pub struct WrappedKeys {
    /// PBKDF2-SHA256 iterations.
    pub pbkdf2_iterations: u32,
    /// PBKDF2 salt.
    pub pbkdf2_salt: [u8; SALT_SIZE],
    /// The KEK, wrapped by the passphrase-derived key.
    pub wrapped_kek: [u8; WRAPPED_KEY_SIZE],
    /// The volume key, wrapped by the KEK.
    pub wrapped_volume_key: [u8; WRAPPED_KEY_SIZE],
}

impl fmt::Debug for WrappedKeys {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("WrappedKeys")
            .field("pbkdf2_iterations", &self.pbkdf2_iterations)
            .field("pbkdf2_salt", &hex::encode(self.pbkdf2_salt))
            .finish_non_exhaustive()
    }
}

/// One decrypted metadata block that matters.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum MetadataRecord {
    /// 0x0019: the wrapped keys.
    EncryptionContext(WrappedKeys),
    /// 0x001a: the logical volume.
    LogicalVolume {
        /// Size in bytes.
        size: u64,
        /// Family UUID (binary).
        family_uuid: [u8; 16],
    },
    /// 0x0305: the logical volume's start, in blocks.
    SegmentMap {
        /// Block offset.
        start_block: u32,
    },
}

/// Decodes a decrypted metadata block: checksum, then the types that matter (`None` for
/// the others).
pub fn decode_metadata_block(b: &[u8]) -> Result<Option<MetadataRecord>, Fvault2Error> {
    let b = checked(b, METADATA_BLOCK_SIZE, "encrypted metadata block")?;
    let block_type = le16(b, MD_BLOCK_TYPE);
    Ok(Some(match block_type {
        BLOCK_ENCRYPTION_CONTEXT => {
            MetadataRecord::EncryptionContext(wrapped_keys(xml(b, block_type, CTX_XML_OFFSET)?)?)
        }
        BLOCK_LOGICAL_VOLUME => {
            let x = xml(b, block_type, LV_XML_OFFSET)?;
            let size_text = plist_value(x, "com.apple.corestorage.lv.size", "integer")?;
            let size = parse_hex_u64(size_text)
                .filter(|&s| s != 0 && s != u64::MAX)
                .ok_or(Fvault2Error::Value("com.apple.corestorage.lv.size"))?;
            let uuid_text = plist_value(x, "com.apple.corestorage.lv.familyUUID", "string")?;
            let family_uuid =
                parse_uuid(uuid_text).ok_or(Fvault2Error::Value("com.apple.corestorage.lv.familyUUID"))?;
            MetadataRecord::LogicalVolume { size, family_uuid }
        }
        BLOCK_SEGMENT_MAP => MetadataRecord::SegmentMap { start_block: le32(b, SEG_LV_BLOCK) },
        _ => return Ok(None),
    }))
}

/// The XML of a block: `(offset, size)` at `at`, within the block, cut at a NUL.
fn xml(b: &[u8], block_type: u16, at: usize) -> Result<&[u8], Fvault2Error> {
    let (offset, size) = (le32(b, at), le32(b, at + 4));
    let end = u64::from(offset) + u64::from(size);
    if end > METADATA_BLOCK_SIZE as u64 {
        return Err(Fvault2Error::XmlExtent { block_type, offset, size });
    }
    let x = &b[offset as usize..end as usize];
    Ok(x.iter().position(|&c| c == 0).map_or(x, |n| &x[..n]))
}

fn find(hay: &[u8], needle: &[u8], from: usize) -> Option<usize> {
    hay.get(from..)?.windows(needle.len()).position(|w| w == needle).map(|p| p + from)
}

/// The text of the first `<key>KEY</key><TYPE ...>TEXT</TYPE>` in `xml` (cryptsetup's
/// pattern: the value element right after its key, non-empty text without `<`).
fn plist_value<'a>(xml: &'a [u8], key: &'static str, ty: &str) -> Result<&'a [u8], Fvault2Error> {
    let key_el = format!("<key>{key}</key><{ty}");
    let close = format!("</{ty}>");
    let mut from = 0;
    while let Some(at) = find(xml, key_el.as_bytes(), from) {
        from = at + 1;
        let rest = &xml[at + key_el.len()..];
        // `<data` must not match `<database`: the name ends at a space, `/` or `>`.
        if !matches!(rest.first(), Some(b'>' | b' ' | b'\t' | b'\r' | b'\n')) {
            continue;
        }
        let Some(gt) = rest.iter().position(|&c| c == b'>') else { continue };
        let text = &rest[gt + 1..];
        let Some(lt) = text.iter().position(|&c| c == b'<') else { continue };
        if lt > 0 && text[lt..].starts_with(close.as_bytes()) {
            return Ok(&text[..lt]);
        }
    }
    Err(Fvault2Error::Property(key))
}

fn base64_struct(xml: &[u8], key: &'static str, need: usize) -> Result<Zeroizing<Vec<u8>>, Fvault2Error> {
    let text: Zeroizing<Vec<u8>> = Zeroizing::new(
        plist_value(xml, key, "data")?.iter().copied().filter(|c| !c.is_ascii_whitespace()).collect(),
    );
    let bytes = Zeroizing::new(
        base64::engine::general_purpose::STANDARD.decode(&*text).map_err(|_| Fvault2Error::Value(key))?,
    );
    if bytes.len() != need {
        return Err(Fvault2Error::StructSize { what: key, len: bytes.len(), need });
    }
    Ok(bytes)
}

fn wrapped_keys(xml: &[u8]) -> Result<WrappedKeys, Fvault2Error> {
    let pwk = base64_struct(xml, "PassphraseWrappedKEKStruct", PWK_SIZE)?;
    let kwvk = base64_struct(xml, "KEKWrappedVolumeKeyStruct", KWVK_SIZE)?;
    let mut k = WrappedKeys {
        pbkdf2_iterations: le32(&pwk, PWK_ITERATIONS),
        pbkdf2_salt: [0; SALT_SIZE],
        wrapped_kek: [0; WRAPPED_KEY_SIZE],
        wrapped_volume_key: [0; WRAPPED_KEY_SIZE],
    };
    k.pbkdf2_salt.copy_from_slice(&pwk[PWK_SALT..PWK_SALT + SALT_SIZE]);
    k.wrapped_kek.copy_from_slice(&pwk[PWK_KEK..PWK_KEK + WRAPPED_KEY_SIZE]);
    k.wrapped_volume_key.copy_from_slice(&kwvk[KWVK_KEY..KWVK_KEY + WRAPPED_KEY_SIZE]);
    Ok(k)
}

/// A hexadecimal integer as `strtoull(s, NULL, 16)` reads it whole: optional blanks and
/// `0x`; `None` for anything else or an overflow.
fn parse_hex_u64(s: &[u8]) -> Option<u64> {
    let s = std::str::from_utf8(s).ok()?.trim();
    let s = s.strip_prefix("0x").or_else(|| s.strip_prefix("0X")).unwrap_or(s);
    if s.is_empty() || s.len() > 16 {
        return None;
    }
    u64::from_str_radix(s, 16).ok()
}

/// A textual UUID (`8-4-4-4-12` hex digits, either case) to its 16 bytes.
pub fn parse_uuid(s: &[u8]) -> Option<[u8; 16]> {
    if s.len() != 36 {
        return None;
    }
    let mut out = [0u8; 16];
    let mut n = 0;
    let mut i = 0;
    while i < 36 {
        if matches!(i, 8 | 13 | 18 | 23) {
            if s[i] != b'-' {
                return None;
            }
            i += 1;
            continue;
        }
        let hi = (s[i] as char).to_digit(16)?;
        let lo = (s[i + 1] as char).to_digit(16)?;
        out[n] = (hi * 16 + lo) as u8;
        n += 1;
        i += 2;
    }
    Some(out)
}

/// A binary UUID as lowercase text.
pub fn uuid_text(u: &[u8; 16]) -> String {
    let h = hex::encode(u);
    format!("{}-{}-{}-{}-{}", &h[..8], &h[8..12], &h[12..16], &h[16..20], &h[20..])
}

/// Everything needed to unlock and map a FileVault2 volume (cryptsetup's `fvault2_params`).
#[derive(Clone, PartialEq, Eq)]
pub struct Fvault2Params {
    /// Physical volume UUID.
    pub physical_volume_uuid: [u8; 16],
    /// Logical volume family UUID (mixed into the data tweak key).
    pub family_uuid: [u8; 16],
    /// Logical volume start, bytes from the start of the physical volume.
    pub lv_offset: u64,
    /// Logical volume size in bytes.
    pub lv_size: u64,
    /// The wrapped keys.
    pub keys: WrappedKeys,
}

impl fmt::Debug for Fvault2Params {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Fvault2Params")
            .field("physical_volume_uuid", &uuid_text(&self.physical_volume_uuid))
            .field("family_uuid", &uuid_text(&self.family_uuid))
            .field("lv_offset", &self.lv_offset)
            .field("lv_size", &self.lv_size)
            .field("keys", &self.keys)
            .finish()
    }
}

/// The records of the encrypted metadata, gathered block by block (a later block of a type
/// replaces an earlier one, as in cryptsetup).
#[derive(Debug, Default, Clone)]
pub struct MetadataRecords {
    keys: Option<WrappedKeys>,
    lv: Option<(u64, [u8; 16])>,
    start_block: Option<u32>,
}

impl MetadataRecords {
    /// Takes one record.
    pub fn add(&mut self, r: MetadataRecord) {
        match r {
            MetadataRecord::EncryptionContext(k) => self.keys = Some(k),
            MetadataRecord::LogicalVolume { size, family_uuid } => self.lv = Some((size, family_uuid)),
            MetadataRecord::SegmentMap { start_block } => self.start_block = Some(start_block),
        }
    }

    /// The parameters, once every needed type was seen.
    pub fn finish(self, header: &VolumeHeader) -> Result<Fvault2Params, Fvault2Error> {
        let keys = self.keys.ok_or(Fvault2Error::Missing(BLOCK_ENCRYPTION_CONTEXT))?;
        let (lv_size, family_uuid) = self.lv.ok_or(Fvault2Error::Missing(BLOCK_LOGICAL_VOLUME))?;
        let start = self.start_block.ok_or(Fvault2Error::Missing(BLOCK_SEGMENT_MAP))?;
        // u32 blocks × a block size of at most 1 MiB fits in u64.
        let lv_offset = u64::from(start) * u64::from(header.block_size);
        Ok(Fvault2Params {
            physical_volume_uuid: header.physical_volume_uuid,
            family_uuid,
            lv_offset,
            lv_size,
            keys,
        })
    }
}

impl Drop for WrappedKeys {
    fn drop(&mut self) {
        // Wrapped keys are safe at rest, but whoever has the passphrase opens them: wipe.
        self.wrapped_kek.zeroize();
        self.wrapped_volume_key.zeroize();
    }
}

/// `cryptsetup fvault2Dump` text for `params` of `device`.
pub fn dump_text(params: &Fvault2Params, device: &str) -> String {
    // cryptsetup prints each salt byte followed by a space (`crypt_log_hex`), the last too.
    let salt: String = params.keys.pbkdf2_salt.iter().map(|b| format!("{b:02x} ")).collect();
    format!(
        "Header information for FVAULT2 device {device}.\n\
         Physical volume UUID: \t{}\n\
         Family UUID:          \t{}\n\
         Logical volume offset:\t{} [bytes]\n\
         Logical volume size:  \t{} [bytes]\n\
         Cipher:               \taes\n\
         Cipher mode:          \txts-plain64\n\
         PBKDF2 iterations:    \t{}\n\
         PBKDF2 salt:          \t{}\n",
        uuid_text(&params.physical_volume_uuid),
        uuid_text(&params.family_uuid),
        params.lv_offset,
        params.lv_size,
        params.keys.pbkdf2_iterations,
        salt,
    )
}

#[cfg(test)]
mod tests {
    use super::*;

    fn seal(b: &mut [u8]) {
        b[4..8].copy_from_slice(&SEED.to_le_bytes());
        let c = crc32c(SEED, &b[8..]);
        b[..4].copy_from_slice(&c.to_le_bytes());
    }

    fn header() -> Vec<u8> {
        let mut b = vec![0u8; VOLUME_HEADER_SIZE];
        b[HDR_VERSION] = 1;
        b[HDR_BLOCK_TYPE] = 0x10;
        b[HDR_SIGNATURE..HDR_SIGNATURE + 2].copy_from_slice(b"CS");
        b[HDR_BLOCK_SIZE..HDR_BLOCK_SIZE + 4].copy_from_slice(&4096u32.to_le_bytes());
        b[HDR_DISK_LABEL] = 1;
        b[HDR_KEY_DATA_SIZE] = 16;
        b[HDR_PV_UUID] = 0xab;
        seal(&mut b);
        b
    }

    #[test]
    fn crc_is_castagnoli_without_final_inversion() {
        // CRC-32C("123456789") is 0xe3069283 with both inversions.
        assert_eq!(crc32c(SEED, b"123456789"), !0xe306_9283);
    }

    #[test]
    fn header_decodes_and_each_malformation_is_named() {
        let h = VolumeHeader::decode(&header()).unwrap();
        assert_eq!((h.block_size, h.disk_label_offset().unwrap()), (4096, 4096));
        assert_eq!(h.metadata_key()[16], 0xab, "the second half is the physical volume UUID");
        assert!(is_volume_header(&header()));
        assert!(!format!("{h:?}").contains("key"), "{h:?}");
        let bad = |at: usize, v: u8| {
            let mut b = header();
            b[at] = v;
            seal(&mut b);
            VolumeHeader::decode(&b).unwrap_err()
        };
        assert_eq!(bad(HDR_VERSION, 2), Fvault2Error::Version(2));
        assert_eq!(bad(HDR_SIGNATURE, b'X'), Fvault2Error::Signature);
        assert_eq!(bad(HDR_KEY_DATA_SIZE, 32), Fvault2Error::KeySize(32));
        assert_eq!(bad(HDR_BLOCK_SIZE + 1, 0), Fvault2Error::BlockSize(0));
        let mut b = header();
        b[300] ^= 1;
        assert_eq!(VolumeHeader::decode(&b).unwrap_err(), Fvault2Error::Checksum { what: "volume header" });
        assert!(!is_volume_header(&b));
        assert!(matches!(VolumeHeader::decode(&b[..100]), Err(Fvault2Error::TooShort { .. })));
        let mut far = header();
        far[HDR_DISK_LABEL..HDR_DISK_LABEL + 8].copy_from_slice(&u64::MAX.to_le_bytes());
        seal(&mut far);
        assert!(matches!(
            VolumeHeader::decode(&far).unwrap().disk_label_offset(),
            Err(Fvault2Error::Offset { .. })
        ));
    }

    fn block(block_type: u16, xml_at: usize, xml: &str) -> Vec<u8> {
        let mut b = vec![0u8; METADATA_BLOCK_SIZE];
        b[MD_BLOCK_TYPE..MD_BLOCK_TYPE + 2].copy_from_slice(&block_type.to_le_bytes());
        b[xml_at..xml_at + 4].copy_from_slice(&1024u32.to_le_bytes());
        b[xml_at + 4..xml_at + 8].copy_from_slice(&(xml.len() as u32).to_le_bytes());
        b[1024..1024 + xml.len()].copy_from_slice(xml.as_bytes());
        seal(&mut b);
        b
    }

    #[test]
    fn plist_values_are_found_as_cryptsetup_finds_them() {
        let x = b"<dict><key>a</key><database>1</database><key>a</key><data ID=\"2\">QUJD</data></dict>";
        assert_eq!(plist_value(x, "a", "data").unwrap(), b"QUJD");
        assert_eq!(plist_value(b"<key>a</key><data></data>", "a", "data"), Err(Fvault2Error::Property("a")));
        assert_eq!(plist_value(b"<key>a</key><data>x", "a", "data"), Err(Fvault2Error::Property("a")));
        assert_eq!(parse_hex_u64(b"0xa000000"), Some(0xa00_0000));
        assert_eq!(parse_hex_u64(b"0x1ffffffffffffffff"), None);
        assert_eq!(
            parse_uuid(b"33A76CAA-1481-4bc5-8d04-1ac1707c19c0").map(|u| uuid_text(&u)).unwrap(),
            "33a76caa-1481-4bc5-8d04-1ac1707c19c0"
        );
        assert_eq!(parse_uuid(b"33a76caa-1481-4bc5-8d04-1ac1707c19cg"), None);
    }

    #[test]
    fn metadata_blocks_decode_and_refuse_bad_extents() {
        let lv = "<dict><key>com.apple.corestorage.lv.size</key><integer size=\"64\">0xa000000</integer>\
                  <key>com.apple.corestorage.lv.familyUUID</key><string>33a76caa-1481-4bc5-8d04-1ac1707c19c0</string></dict>";
        let r = decode_metadata_block(&block(BLOCK_LOGICAL_VOLUME, LV_XML_OFFSET, lv)).unwrap().unwrap();
        assert!(matches!(r, MetadataRecord::LogicalVolume { size: 0xa00_0000, .. }));
        let mut b = block(BLOCK_LOGICAL_VOLUME, LV_XML_OFFSET, lv);
        b[LV_XML_OFFSET + 4..LV_XML_OFFSET + 8].copy_from_slice(&u32::MAX.to_le_bytes());
        seal(&mut b);
        assert!(matches!(decode_metadata_block(&b), Err(Fvault2Error::XmlExtent { .. })));
        let short = "<key>PassphraseWrappedKEKStruct</key><data>QUJD</data><key>KEKWrappedVolumeKeyStruct</key><data>QUJD</data>";
        assert!(matches!(
            decode_metadata_block(&block(BLOCK_ENCRYPTION_CONTEXT, CTX_XML_OFFSET, short)),
            Err(Fvault2Error::StructSize { len: 3, need: PWK_SIZE, .. })
        ));
        assert_eq!(decode_metadata_block(&block(0x77, 64, "")).unwrap(), None);
        let mut records = MetadataRecords::default();
        records.add(r);
        let h = VolumeHeader::decode(&header()).unwrap();
        assert_eq!(records.finish(&h).unwrap_err(), Fvault2Error::Missing(BLOCK_ENCRYPTION_CONTEXT));
    }
}
