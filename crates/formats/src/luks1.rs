//! LUKS1 partition header ("phdr"): decode, validate, encode. Sans-IO.
//!
//! Spec: LUKS On-Disk Format Specification 1.2.3 (cryptsetup `docs/on-disk-format.pdf`) and
//! cryptsetup `lib/luks1/luks.h` (`struct luks_phdr`). All integers are **big-endian**.
//!
//! ```text
//!  off  size  field                 notes
//!  ---  ----  --------------------  -------------------------------------------------------
//!    0     6  magic                 "LUKS\xba\xbe"
//!    6     2  version               1
//!    8    32  cipherName            NUL-terminated, e.g. "aes"
//!   40    32  cipherMode            NUL-terminated, e.g. "xts-plain64", "cbc-essiv:sha256"
//!   72    32  hashSpec              NUL-terminated, e.g. "sha256" (PBKDF2 and AF hash)
//!  104     4  payloadOffset         data start, in 512-byte sectors (0 = detached header)
//!  108     4  keyBytes              volume key length in bytes
//!  112    20  mkDigest              PBKDF2(hashSpec, volume key, mkDigestSalt, iter, 20)
//!  132    32  mkDigestSalt
//!  164     4  mkDigestIterations
//!  168    40  uuid                  NUL-terminated text UUID
//!  208   384  keyblock[8]           8 × 48 bytes, layout below
//!  592   432  padding               zero; cryptsetup reads and writes 1024 bytes
//!
//!  keyblock[i] at 208 + 48·i:
//!    +0    4  active                0x00AC71F3 enabled, 0x0000DEAD disabled
//!    +4    4  passwordIterations    PBKDF2 iterations for this keyslot
//!    +8   32  passwordSalt
//!   +40    4  keyMaterialOffset     AF-split key material start, in 512-byte sectors
//!   +44    4  stripes               AF stripes, always 4000
//! ```
//!
//! Key material of a keyslot occupies `ceil(keyBytes × stripes / 512)` sectors
//! (cryptsetup `AF_split_sectors`). Validation follows cryptsetup's
//! `_check_and_convert_hdr` and `LUKS_check_keyslots` (`lib/luks1/keymanage.c`): every keyslot
//! (active or not) has 4000 stripes, starts after the phdr, ends at or before the payload
//! (unless the header is detached, `payloadOffset == 0`), and no two keyslot areas overlap.
//! The device-size check (`LUKS_check_device_size`) needs the device size, so it is a
//! separate call: [`Luks1Header::check_device_size`].
//!
//! Not here: PBKDF2, the AF splitter and key-material decryption (`sector-crypto`), and
//! reading or writing the device (`volume`).

use std::fmt;

use crate::limits::{self, MAX_KEY_BYTES};

/// `"LUKS\xba\xbe"`, shared with the LUKS2 primary header.
pub const MAGIC: [u8; 6] = *b"LUKS\xba\xbe";
/// Sector unit of `payloadOffset` and `keyMaterialOffset`.
pub const SECTOR_SIZE: u64 = 512;
/// Number of keyslots ([`limits::LUKS1_KEYSLOTS`]).
pub const NUM_KEYSLOTS: usize = limits::LUKS1_KEYSLOTS as usize;
/// The only AF stripe count cryptsetup accepts ([`limits::AF_STRIPES`]).
pub const STRIPES: u32 = limits::AF_STRIPES;
/// `active` value of an enabled keyslot.
pub const KEY_ENABLED: u32 = 0x00AC_71F3;
/// `active` value of a disabled keyslot.
pub const KEY_DISABLED: u32 = 0x0000_DEAD;
/// Keyslot areas of a freshly formatted header are aligned to this many bytes.
pub const ALIGN_KEYSLOTS: u64 = 4096;

// Field lengths (cryptsetup luks.h).
const MAGIC_L: usize = 6;
const CIPHERNAME_L: usize = 32;
const CIPHERMODE_L: usize = 32;
const HASHSPEC_L: usize = 32;
const DIGEST_L: usize = 20;
const SALT_L: usize = 32;
const UUID_L: usize = 40;
const KEYBLOCK_L: usize = 4 + 4 + SALT_L + 4 + 4;

// Offsets, derived from the table above.
const VERSION_OFF: usize = MAGIC_L;
const CIPHERNAME_OFF: usize = VERSION_OFF + 2;
const CIPHERMODE_OFF: usize = CIPHERNAME_OFF + CIPHERNAME_L;
const HASHSPEC_OFF: usize = CIPHERMODE_OFF + CIPHERMODE_L;
const PAYLOAD_OFF: usize = HASHSPEC_OFF + HASHSPEC_L;
const KEYBYTES_OFF: usize = PAYLOAD_OFF + 4;
const MKDIGEST_OFF: usize = KEYBYTES_OFF + 4;
const MKSALT_OFF: usize = MKDIGEST_OFF + DIGEST_L;
const MKITER_OFF: usize = MKSALT_OFF + SALT_L;
const UUID_OFF: usize = MKITER_OFF + 4;
const KEYBLOCK_OFF: usize = UUID_OFF + UUID_L;

/// Size of the meaningful part of the phdr (everything before the padding).
pub const PHDR_SIZE: usize = KEYBLOCK_OFF + NUM_KEYSLOTS * KEYBLOCK_L;
/// Bytes cryptsetup reads and writes for the phdr (`sizeof(struct luks_phdr)`, padded).
pub const PHDR_DISK_SIZE: usize = 1024;

const _: () = assert!(PHDR_SIZE == 592);
const _: () = assert!(UUID_OFF == 168);

/// Why a LUKS1 header was refused. One variant per distinct malformation.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[non_exhaustive]
pub enum Luks1Error {
    /// Fewer bytes than the 592-byte phdr.
    #[error("LUKS1 header needs {PHDR_SIZE} bytes, got {0}")]
    Truncated(usize),
    /// The magic is not `LUKS\xba\xbe`.
    #[error("not a LUKS device (bad magic)")]
    BadMagic,
    /// Version other than 1 (2 is LUKS2, decoded by [`crate::luks2`]).
    #[error("unsupported LUKS version {0} (this decoder reads version 1)")]
    BadVersion(u16),
    /// A text field is not valid UTF-8.
    #[error("LUKS1 header field {0} is not valid text")]
    NotText(&'static str),
    /// A text field that must not be empty is empty.
    #[error("LUKS1 header field {0} is empty")]
    EmptyField(&'static str),
    /// `hashSpec` names a hash cryptsetup cannot use for LUKS1 (digest shorter than 20 bytes
    /// or unknown).
    #[error("LUKS1 hash {0:?} is not supported")]
    UnsupportedHash(String),
    /// `keyBytes` is zero.
    #[error("LUKS1 volume key size is 0")]
    ZeroKeyBytes,
    /// `keyBytes` is above [`MAX_KEY_BYTES`] (a crafted header: the key material read and
    /// the AF merge are sized by it).
    #[error("LUKS1 header field keyBytes = {0} exceeds the largest key size, {MAX_KEY_BYTES} bytes")]
    KeyBytesTooLarge(u32),
    /// A keyslot has a stripe count other than 4000.
    #[error("LUKS1 keyslot {slot} is invalid: {stripes} stripes (must be {STRIPES})")]
    BadStripes {
        /// Keyslot index.
        slot: usize,
        /// The stripe count found.
        stripes: u32,
    },
    /// A keyslot's key material starts inside the phdr.
    #[error("LUKS1 keyslot {slot} is invalid: key material at sector {offset} overlaps the header")]
    KeyslotInHeader {
        /// Keyslot index.
        slot: usize,
        /// keyMaterialOffset, in sectors.
        offset: u32,
    },
    /// A keyslot's key material starts at or after the payload.
    #[error("LUKS1 keyslot {slot} is invalid: key material at sector {offset} is beyond the data offset {payload}")]
    KeyslotBeyondPayload {
        /// Keyslot index.
        slot: usize,
        /// keyMaterialOffset, in sectors.
        offset: u32,
        /// payloadOffset, in sectors.
        payload: u32,
    },
    /// A keyslot's key material runs into the payload.
    #[error("LUKS1 keyslot {slot} is invalid: key material at sector {offset} ({sectors} sectors) runs into the data offset {payload}")]
    KeyslotOverlapsPayload {
        /// Keyslot index.
        slot: usize,
        /// keyMaterialOffset, in sectors.
        offset: u32,
        /// Key material length, in sectors.
        sectors: u64,
        /// payloadOffset, in sectors.
        payload: u32,
    },
    /// The keyslot areas end beyond [`limits::LUKS1_MAX_HEADER_BYTES`] (a header backup
    /// reads the header and keyslots whole).
    #[error("LUKS1 keyslot {slot} is invalid: its key material ends at byte {end}, beyond the {max} bytes a LUKS1 header may span", max = limits::LUKS1_MAX_HEADER_BYTES)]
    KeyslotsTooLarge {
        /// The keyslot ending last.
        slot: usize,
        /// End of its key material, bytes.
        end: u64,
    },
    /// Two keyslot areas overlap (`first` is the one that is too short for its neighbour).
    #[error("LUKS1 keyslot {first} is invalid: its key material overlaps keyslot {second}")]
    KeyslotsOverlap {
        /// Keyslot with the lower offset.
        first: usize,
        /// Keyslot it runs into.
        second: usize,
    },
    /// The device is smaller than the header and keyslot areas.
    #[error("device is too small: LUKS1 needs at least {need} bytes, the device has {have}")]
    DeviceTooSmall {
        /// Bytes needed.
        need: u64,
        /// Device size in bytes.
        have: u64,
    },
    /// On encode: a text value does not fit its field (with its terminating NUL).
    #[error("LUKS1 field {field} takes at most {max} bytes, got {len}")]
    FieldTooLong {
        /// Field name.
        field: &'static str,
        /// Maximum length without the NUL.
        max: usize,
        /// Given length.
        len: usize,
    },
}

/// Why [`Luks1Header::repair_keyslots`] could not repair a header (cryptsetup's words
/// where it has them).
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[non_exhaustive]
pub enum Luks1RepairError {
    /// A volume key size other than 16, 32 or 64 bytes.
    #[error("Non standard key size, manual repair required ({0} bytes).")]
    KeySize(u32),
    /// The first keyslot area starts before 4096 bytes (cryptsetup 1.0).
    #[error("Non standard keyslots alignment, manual repair required (first keyslot at sector {0}).")]
    Alignment(u32),
    /// What the repair can change was not enough (an enabled keyslot is damaged, or the
    /// keyslots overlap out of order).
    #[error("Repair failed: {0}")]
    StillInvalid(#[source] Luks1Error),
}

/// State of a LUKS1 keyslot, from its `active` word.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum KeyslotState {
    /// `0x00AC71F3`.
    Enabled,
    /// `0x0000DEAD`.
    Disabled,
    /// Anything else: cryptsetup reports such a slot as `CRYPT_SLOT_INVALID` and never
    /// opens it. Kept as found so a rewrite does not change it.
    Invalid(u32),
}

impl KeyslotState {
    /// The on-disk word.
    pub fn to_raw(self) -> u32 {
        match self {
            Self::Enabled => KEY_ENABLED,
            Self::Disabled => KEY_DISABLED,
            Self::Invalid(v) => v,
        }
    }

    /// Interpret an on-disk word.
    pub fn from_raw(v: u32) -> Self {
        match v {
            KEY_ENABLED => Self::Enabled,
            KEY_DISABLED => Self::Disabled,
            v => Self::Invalid(v),
        }
    }
}

/// One of the 8 LUKS1 keyslots (`keyblock[i]`).
#[derive(Clone, PartialEq, Eq)]
pub struct Keyslot {
    /// Enabled, disabled, or an unknown `active` word.
    pub state: KeyslotState,
    /// PBKDF2 iterations for the passphrase.
    pub iterations: u32,
    /// PBKDF2 salt for the passphrase.
    pub salt: [u8; SALT_L],
    /// Start of the AF-split key material, in 512-byte sectors.
    pub key_material_offset: u32,
    /// AF stripes (4000).
    pub stripes: u32,
}

impl fmt::Debug for Keyslot {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Keyslot")
            .field("state", &self.state)
            .field("iterations", &self.iterations)
            .field("salt", &hex::encode(self.salt))
            .field("key_material_offset", &self.key_material_offset)
            .field("stripes", &self.stripes)
            .finish()
    }
}

/// A decoded LUKS1 phdr. Text fields hold the bytes before the first NUL.
#[derive(Clone, PartialEq, Eq)]
pub struct Luks1Header {
    /// Cipher name, e.g. `aes`.
    pub cipher_name: String,
    /// Cipher mode, e.g. `xts-plain64`.
    pub cipher_mode: String,
    /// Hash for PBKDF2 and the AF splitter, e.g. `sha256`.
    pub hash_spec: String,
    /// Data start in 512-byte sectors; 0 for a detached header.
    pub payload_offset: u32,
    /// Volume key length in bytes.
    pub key_bytes: u32,
    /// PBKDF2 digest of the volume key (20 bytes).
    pub mk_digest: [u8; DIGEST_L],
    /// Salt of `mk_digest`.
    pub mk_digest_salt: [u8; SALT_L],
    /// Iterations of `mk_digest`.
    pub mk_digest_iterations: u32,
    /// Text UUID.
    pub uuid: String,
    /// The 8 keyslots.
    pub keyslots: [Keyslot; NUM_KEYSLOTS],
}

impl fmt::Debug for Luks1Header {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Luks1Header")
            .field("cipher_name", &self.cipher_name)
            .field("cipher_mode", &self.cipher_mode)
            .field("hash_spec", &self.hash_spec)
            .field("payload_offset", &self.payload_offset)
            .field("key_bytes", &self.key_bytes)
            .field("mk_digest", &hex::encode(self.mk_digest))
            .field("mk_digest_salt", &hex::encode(self.mk_digest_salt))
            .field("mk_digest_iterations", &self.mk_digest_iterations)
            .field("uuid", &self.uuid)
            .field("keyslots", &self.keyslots)
            .finish()
    }
}

/// Hash names cryptsetup's crypto backends accept for LUKS1 (digest of at least 20 bytes),
/// matched case-insensitively, as libgcrypt and OpenSSL do: the canonical names and the
/// aliases OpenSSL resolves (cryptsetup writes the name as given, lower-cased). The same set
/// as `sector_crypto::hash::HashAlg` minus its LUKS2-only hashes (a `volume` test checks).
pub const LUKS1_HASHES: &[&str] = &[
    "sha1",
    "sha-1",
    "ssl3-sha1",
    "sha224",
    "sha-224",
    "sha2-224",
    "sha256",
    "sha-256",
    "sha2-256",
    "sha384",
    "sha-384",
    "sha2-384",
    "sha512",
    "sha-512",
    "sha2-512",
    "sha512-224",
    "sha-512/224",
    "sha2-512/224",
    "sha512-256",
    "sha-512/256",
    "sha2-512/256",
    "sha3-224",
    "sha3-256",
    "sha3-384",
    "sha3-512",
    "ripemd160",
    "ripemd-160",
    "ripemd",
    "rmd160",
    "whirlpool",
    "sm3",
    "blake2b-160",
    "blake2b-256",
    "blake2b-384",
    "blake2b-512",
    "blake2b512",
    "blake2s-160",
    "blake2s-224",
    "blake2s-256",
    "blake2s256",
    "stribog256",
    "stribog512",
];

fn be16(b: &[u8], off: usize) -> u16 {
    u16::from_be_bytes([b[off], b[off + 1]])
}

fn be32(b: &[u8], off: usize) -> u32 {
    u32::from_be_bytes([b[off], b[off + 1], b[off + 2], b[off + 3]])
}

fn array<const N: usize>(b: &[u8], off: usize) -> [u8; N] {
    let mut a = [0u8; N];
    a.copy_from_slice(&b[off..off + N]);
    a
}

/// A NUL-terminated text field. Like cryptsetup, the last byte of the field is treated as
/// NUL even if it is not.
fn text(b: &[u8], off: usize, len: usize, field: &'static str) -> Result<String, Luks1Error> {
    let raw = &b[off..off + len - 1];
    let end = raw.iter().position(|&c| c == 0).unwrap_or(raw.len());
    std::str::from_utf8(&raw[..end]).map(str::to_owned).map_err(|_| Luks1Error::NotText(field))
}

fn put_text(
    out: &mut [u8],
    off: usize,
    len: usize,
    value: &str,
    field: &'static str,
) -> Result<(), Luks1Error> {
    let bytes = value.as_bytes();
    if bytes.len() > len - 1 || bytes.contains(&0) {
        return Err(Luks1Error::FieldTooLong { field, max: len - 1, len: bytes.len() });
    }
    out[off..off + bytes.len()].copy_from_slice(bytes);
    Ok(())
}

/// Sectors of AF-split key material for a key of `key_bytes` bytes and `stripes` stripes
/// (cryptsetup `AF_split_sectors`).
pub fn af_split_sectors(key_bytes: u32, stripes: u32) -> u64 {
    (u64::from(key_bytes) * u64::from(stripes)).div_ceil(SECTOR_SIZE)
}

/// Keyslot offsets (in sectors) of a freshly formatted header, as cryptsetup's
/// `LUKS_generate_phdr` lays them out: the first at 4096 bytes, each next one after the
/// previous key material, rounded up to 4096 bytes. Also returns the end of the last
/// keyslot area, in sectors (the smallest payload offset for an attached header).
pub fn standard_keyslot_layout(key_bytes: u32) -> ([u32; NUM_KEYSLOTS], u64) {
    let align = ALIGN_KEYSLOTS / SECTOR_SIZE;
    let per_slot = af_split_sectors(key_bytes, STRIPES);
    let mut offsets = [0u32; NUM_KEYSLOTS];
    let mut next = align;
    for o in &mut offsets {
        // At most 8 × ceil(u32::MAX × 4000 / 512) sectors: fits u64; clamp into u32.
        *o = u32::try_from(next).unwrap_or(u32::MAX);
        next = (next + per_slot).div_ceil(align) * align;
    }
    (offsets, next)
}

impl Luks1Header {
    /// Decode and validate a phdr from the first bytes of a device (at least 592; the
    /// 432 bytes of padding that follow on disk are ignored).
    pub fn decode(bytes: &[u8]) -> Result<Self, Luks1Error> {
        let hdr = Self::decode_unchecked(bytes)?;
        hdr.validate()?;
        Ok(hdr)
    }

    /// [`decode`](Self::decode) without the keyslot checks of [`validate`](Self::validate)
    /// (the magic, version, text fields and hash are still checked): what
    /// [`repair_keyslots`](Self::repair_keyslots) starts from.
    pub fn decode_unchecked(bytes: &[u8]) -> Result<Self, Luks1Error> {
        if bytes.len() < PHDR_SIZE {
            return Err(Luks1Error::Truncated(bytes.len()));
        }
        let b = &bytes[..PHDR_SIZE];
        if b[..MAGIC_L] != MAGIC {
            return Err(Luks1Error::BadMagic);
        }
        let version = be16(b, VERSION_OFF);
        if version != 1 {
            return Err(Luks1Error::BadVersion(version));
        }
        let hash_spec = text(b, HASHSPEC_OFF, HASHSPEC_L, "hashSpec")?;
        if !LUKS1_HASHES.iter().any(|h| h.eq_ignore_ascii_case(&hash_spec)) {
            return Err(Luks1Error::UnsupportedHash(hash_spec));
        }
        let keyslots = std::array::from_fn(|i| {
            let o = KEYBLOCK_OFF + i * KEYBLOCK_L;
            Keyslot {
                state: KeyslotState::from_raw(be32(b, o)),
                iterations: be32(b, o + 4),
                salt: array(b, o + 8),
                key_material_offset: be32(b, o + 8 + SALT_L),
                stripes: be32(b, o + 12 + SALT_L),
            }
        });
        let hdr = Self {
            cipher_name: text(b, CIPHERNAME_OFF, CIPHERNAME_L, "cipherName")?,
            cipher_mode: text(b, CIPHERMODE_OFF, CIPHERMODE_L, "cipherMode")?,
            hash_spec,
            payload_offset: be32(b, PAYLOAD_OFF),
            key_bytes: be32(b, KEYBYTES_OFF),
            mk_digest: array(b, MKDIGEST_OFF),
            mk_digest_salt: array(b, MKSALT_OFF),
            mk_digest_iterations: be32(b, MKITER_OFF),
            uuid: text(b, UUID_OFF, UUID_L, "uuid")?,
            keyslots,
        };
        Ok(hdr)
    }

    /// cryptsetup's LUKS1 `repair` (`_keyslot_repair`, lib/luks1/keymanage.c), for a header
    /// [`validate`](Self::validate) refuses: every keyslot that is not enabled gets the
    /// offset and stripes of a freshly formatted header ([`standard_keyslot_layout`]); one
    /// that needed it, or slot 6 when `phdr` (the header's first 512 bytes as read) ends
    /// in an MS-DOS partition signature, is disabled with its salt and iterations wiped.
    /// Enabled keyslots are never changed (their key material is where they say). The
    /// result must then pass [`validate`](Self::validate); on any error `self` is left as
    /// it was. Returns what was changed, in cryptsetup's words, in keyslot order (empty:
    /// nothing to write).
    pub fn repair_keyslots(&mut self, phdr: &[u8]) -> Result<Vec<String>, Luks1RepairError> {
        if ![16, 32, 64].contains(&self.key_bytes) {
            return Err(Luks1RepairError::KeySize(self.key_bytes));
        }
        // cryptsetup 1.0 did not align the keyslots to 4096 bytes: not repairable.
        let first = self.keyslots.iter().map(|k| k.key_material_offset).min().unwrap_or(0);
        if u64::from(first) < ALIGN_KEYSLOTS / SECTOR_SIZE {
            return Err(Luks1RepairError::Alignment(first));
        }
        let (offsets, _) = standard_keyslot_layout(self.key_bytes);
        let partition_signature = phdr.get(0x1fe..0x200) == Some(&[0x55, 0xaa][..]);
        let mut fixed = self.clone();
        let mut notes = Vec::new();
        for (i, ks) in fixed.keyslots.iter_mut().enumerate() {
            if ks.state == KeyslotState::Enabled {
                continue;
            }
            let mut bad = false;
            if ks.key_material_offset != offsets[i] {
                notes.push(format!(
                    "Keyslot {i}: offset repaired ({} -> {}).",
                    ks.key_material_offset, offsets[i]
                ));
                ks.key_material_offset = offsets[i];
                bad = true;
            }
            if ks.stripes != STRIPES {
                notes.push(format!("Keyslot {i}: stripes repaired ({} -> {STRIPES}).", ks.stripes));
                ks.stripes = STRIPES;
                bad = true;
            }
            if i == 6 && partition_signature {
                notes.push(format!("Keyslot {i}: bogus partition signature."));
                bad = true;
            }
            if bad {
                notes.push(format!("Keyslot {i}: salt wiped."));
                ks.state = KeyslotState::Disabled;
                ks.salt = [0; SALT_L];
                ks.iterations = 0;
            }
        }
        // The repair cannot reorder keyslots: a header still invalid is not written.
        fixed.validate().map_err(Luks1RepairError::StillInvalid)?;
        *self = fixed;
        Ok(notes)
    }

    /// cryptsetup's structural checks (`LUKS_check_keyslots`, plus non-empty cipher and a
    /// key size in 1..=[`MAX_KEY_BYTES`]). Run by [`decode`](Self::decode) and [`encode`](Self::encode).
    pub fn validate(&self) -> Result<(), Luks1Error> {
        if self.cipher_name.is_empty() {
            return Err(Luks1Error::EmptyField("cipherName"));
        }
        if self.cipher_mode.is_empty() {
            return Err(Luks1Error::EmptyField("cipherMode"));
        }
        if self.key_bytes == 0 {
            return Err(Luks1Error::ZeroKeyBytes);
        }
        if self.key_bytes > MAX_KEY_BYTES {
            return Err(Luks1Error::KeyBytesTooLarge(self.key_bytes));
        }
        let secs = af_split_sectors(self.key_bytes, STRIPES);
        for (slot, ks) in self.keyslots.iter().enumerate() {
            if ks.stripes != STRIPES {
                return Err(Luks1Error::BadStripes { slot, stripes: ks.stripes });
            }
            let off = ks.key_material_offset;
            if u64::from(off) * SECTOR_SIZE < PHDR_DISK_SIZE as u64 {
                return Err(Luks1Error::KeyslotInHeader { slot, offset: off });
            }
            // A detached header (payload offset 0) has no payload to run into.
            if self.payload_offset == 0 {
                continue;
            }
            if self.payload_offset <= off {
                return Err(Luks1Error::KeyslotBeyondPayload {
                    slot,
                    offset: off,
                    payload: self.payload_offset,
                });
            }
            if u64::from(self.payload_offset) < u64::from(off) + secs {
                return Err(Luks1Error::KeyslotOverlapsPayload {
                    slot,
                    offset: off,
                    sectors: secs,
                    payload: self.payload_offset,
                });
            }
        }
        let sorted = self.slots_by_offset();
        let end = self.required_device_size();
        if end > limits::LUKS1_MAX_HEADER_BYTES {
            return Err(Luks1Error::KeyslotsTooLarge { slot: sorted[NUM_KEYSLOTS - 1], end });
        }
        for w in sorted.windows(2) {
            let (prev, next) = (w[0], w[1]);
            if u64::from(self.keyslots[next].key_material_offset)
                < u64::from(self.keyslots[prev].key_material_offset) + secs
            {
                return Err(Luks1Error::KeyslotsOverlap { first: prev, second: next });
            }
        }
        Ok(())
    }

    /// Keyslot indices ordered by key-material offset (stable: ties keep index order, as
    /// cryptsetup's insertion sort does).
    fn slots_by_offset(&self) -> [usize; NUM_KEYSLOTS] {
        let mut idx: [usize; NUM_KEYSLOTS] = std::array::from_fn(|i| i);
        idx.sort_by_key(|&i| self.keyslots[i].key_material_offset);
        idx
    }

    /// Sectors of key material per keyslot.
    pub fn key_material_sectors(&self) -> u64 {
        af_split_sectors(self.key_bytes, STRIPES)
    }

    /// Byte range `(offset, length)` of a keyslot's key material on the metadata device.
    pub fn keyslot_area(&self, slot: usize) -> Option<(u64, u64)> {
        let ks = self.keyslots.get(slot)?;
        Some((u64::from(ks.key_material_offset) * SECTOR_SIZE, self.key_material_sectors() * SECTOR_SIZE))
    }

    /// Bytes the metadata device must have: the end of the last keyslot area
    /// (cryptsetup `LUKS_device_sectors`).
    pub fn required_device_size(&self) -> u64 {
        let last = self.slots_by_offset()[NUM_KEYSLOTS - 1];
        (u64::from(self.keyslots[last].key_material_offset) + self.key_material_sectors()) * SECTOR_SIZE
    }

    /// cryptsetup's `LUKS_check_device_size`: the metadata device must hold every keyslot.
    pub fn check_device_size(&self, device_bytes: u64) -> Result<(), Luks1Error> {
        let need = self.required_device_size();
        if need > device_bytes {
            return Err(Luks1Error::DeviceTooSmall { need, have: device_bytes });
        }
        Ok(())
    }

    /// Data start in bytes.
    pub fn payload_offset_bytes(&self) -> u64 {
        u64::from(self.payload_offset) * SECTOR_SIZE
    }

    /// The cipher spec in dm-crypt/cryptsetup form, `name-mode` (e.g. `aes-xts-plain64`).
    pub fn cipher_spec(&self) -> String {
        format!("{}-{}", self.cipher_name, self.cipher_mode)
    }

    /// Encode to the 1024 bytes cryptsetup writes at offset 0 (phdr plus zero padding).
    /// Validates first, so a header that would not load is never produced.
    pub fn encode(&self) -> Result<Vec<u8>, Luks1Error> {
        self.validate()?;
        let mut out = vec![0u8; PHDR_DISK_SIZE];
        out[..MAGIC_L].copy_from_slice(&MAGIC);
        out[VERSION_OFF..VERSION_OFF + 2].copy_from_slice(&1u16.to_be_bytes());
        put_text(&mut out, CIPHERNAME_OFF, CIPHERNAME_L, &self.cipher_name, "cipherName")?;
        put_text(&mut out, CIPHERMODE_OFF, CIPHERMODE_L, &self.cipher_mode, "cipherMode")?;
        put_text(&mut out, HASHSPEC_OFF, HASHSPEC_L, &self.hash_spec, "hashSpec")?;
        out[PAYLOAD_OFF..PAYLOAD_OFF + 4].copy_from_slice(&self.payload_offset.to_be_bytes());
        out[KEYBYTES_OFF..KEYBYTES_OFF + 4].copy_from_slice(&self.key_bytes.to_be_bytes());
        out[MKDIGEST_OFF..MKDIGEST_OFF + DIGEST_L].copy_from_slice(&self.mk_digest);
        out[MKSALT_OFF..MKSALT_OFF + SALT_L].copy_from_slice(&self.mk_digest_salt);
        out[MKITER_OFF..MKITER_OFF + 4].copy_from_slice(&self.mk_digest_iterations.to_be_bytes());
        put_text(&mut out, UUID_OFF, UUID_L, &self.uuid, "uuid")?;
        for (i, ks) in self.keyslots.iter().enumerate() {
            let o = KEYBLOCK_OFF + i * KEYBLOCK_L;
            out[o..o + 4].copy_from_slice(&ks.state.to_raw().to_be_bytes());
            out[o + 4..o + 8].copy_from_slice(&ks.iterations.to_be_bytes());
            out[o + 8..o + 8 + SALT_L].copy_from_slice(&ks.salt);
            out[o + 8 + SALT_L..o + 12 + SALT_L].copy_from_slice(&ks.key_material_offset.to_be_bytes());
            out[o + 12 + SALT_L..o + 16 + SALT_L].copy_from_slice(&ks.stripes.to_be_bytes());
        }
        Ok(out)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn sample() -> Luks1Header {
        let (offsets, end) = standard_keyslot_layout(64);
        Luks1Header {
            cipher_name: "aes".into(),
            cipher_mode: "xts-plain64".into(),
            hash_spec: "sha256".into(),
            payload_offset: u32::try_from(end).unwrap(),
            key_bytes: 64,
            mk_digest: [7; DIGEST_L],
            mk_digest_salt: [8; SALT_L],
            mk_digest_iterations: 1000,
            uuid: "0d1a6a5b-4f3c-4a8e-9f49-9a1b7d2d7e11".into(),
            keyslots: std::array::from_fn(|i| Keyslot {
                state: if i == 0 { KeyslotState::Enabled } else { KeyslotState::Disabled },
                iterations: if i == 0 { 1000 } else { 0 },
                salt: [i as u8; SALT_L],
                key_material_offset: offsets[i],
                stripes: STRIPES,
            }),
        }
    }

    #[test]
    fn layout_matches_cryptsetup_for_512_bit_keys() {
        // cryptsetup luksFormat --type luks1 -s 512: slots at 8, 512, 1016, ... and 4096
        // sectors of header (2 MiB payload offset).
        let (offsets, end) = standard_keyslot_layout(64);
        assert_eq!(offsets, [8, 512, 1016, 1520, 2024, 2528, 3032, 3536]);
        assert_eq!(end, 4040);
    }

    #[test]
    fn round_trip_sample() {
        let h = sample();
        let bytes = h.encode().unwrap();
        assert_eq!(bytes.len(), PHDR_DISK_SIZE);
        assert_eq!(Luks1Header::decode(&bytes).unwrap(), h);
    }

    #[test]
    fn repair_resets_disabled_keyslots_and_leaves_enabled_ones() {
        let good = sample();
        let mut h = good.clone();
        h.keyslots[7].key_material_offset = 9000;
        h.keyslots[3].stripes = 3999;
        h.keyslots[5].state = KeyslotState::Invalid(7);
        assert!(h.validate().is_err());
        let notes = h.repair_keyslots(&[0; 512]).unwrap();
        assert_eq!(
            notes,
            [
                "Keyslot 3: stripes repaired (3999 -> 4000).",
                "Keyslot 3: salt wiped.",
                "Keyslot 7: offset repaired (9000 -> 3536).",
                "Keyslot 7: salt wiped.",
            ]
        );
        h.validate().unwrap();
        assert_eq!(h.keyslots[0], good.keyslots[0], "the enabled keyslot is untouched");
        for i in [3, 7] {
            assert_eq!(h.keyslots[i].state, KeyslotState::Disabled);
            assert_eq!((h.keyslots[i].salt, h.keyslots[i].iterations), ([0; SALT_L], 0));
        }
        // Only offsets and stripes decide: an invalid `active` word alone is kept.
        let mut kept = good.keyslots[5].clone();
        kept.state = KeyslotState::Invalid(7);
        assert_eq!(h.keyslots[5], kept);
    }

    #[test]
    fn repair_refuses_what_it_cannot_fix_and_changes_nothing() {
        let mut h = sample();
        h.keyslots[0].key_material_offset = 9000;
        let before = h.clone();
        assert!(matches!(h.repair_keyslots(&[0; 512]), Err(Luks1RepairError::StillInvalid(_))));
        assert_eq!(h, before, "an enabled keyslot is never moved");
        let mut h = sample();
        h.key_bytes = 48;
        assert_eq!(h.repair_keyslots(&[0; 512]), Err(Luks1RepairError::KeySize(48)));
        let mut h = sample();
        h.keyslots[0].key_material_offset = 2;
        assert_eq!(h.repair_keyslots(&[0; 512]), Err(Luks1RepairError::Alignment(2)));
    }

    #[test]
    fn repair_wipes_keyslot_6_under_a_partition_signature() {
        let mut h = sample();
        let mut phdr = [0u8; 512];
        phdr[0x1fe..].copy_from_slice(&[0x55, 0xaa]);
        let notes = h.repair_keyslots(&phdr).unwrap();
        assert_eq!(notes, ["Keyslot 6: bogus partition signature.", "Keyslot 6: salt wiped."]);
        assert_eq!(h.keyslots[6].salt, [0; SALT_L]);
        assert!(sample().repair_keyslots(&[0; 512]).unwrap().is_empty(), "a sound header needs nothing");
    }

    #[test]
    fn decode_rejects_short_input() {
        assert_eq!(Luks1Header::decode(&[0; 100]), Err(Luks1Error::Truncated(100)));
    }

    #[test]
    fn decode_rejects_bad_magic_and_version() {
        let mut b = sample().encode().unwrap();
        b[0] = b'X';
        assert_eq!(Luks1Header::decode(&b), Err(Luks1Error::BadMagic));
        let mut b = sample().encode().unwrap();
        b[7] = 2;
        assert_eq!(Luks1Header::decode(&b), Err(Luks1Error::BadVersion(2)));
    }

    #[test]
    fn keyslot_checks_name_the_slot() {
        let mut h = sample();
        h.keyslots[3].stripes = 3999;
        assert_eq!(h.validate(), Err(Luks1Error::BadStripes { slot: 3, stripes: 3999 }));
        let mut h = sample();
        h.keyslots[0].key_material_offset = 1;
        assert_eq!(h.validate(), Err(Luks1Error::KeyslotInHeader { slot: 0, offset: 1 }));
        let mut h = sample();
        h.keyslots[5].key_material_offset = h.keyslots[4].key_material_offset + 1;
        assert_eq!(h.validate(), Err(Luks1Error::KeyslotsOverlap { first: 4, second: 5 }));
        let mut h = sample();
        h.keyslots[7].key_material_offset = h.payload_offset;
        assert!(matches!(h.validate(), Err(Luks1Error::KeyslotBeyondPayload { slot: 7, .. })));
        let mut h = sample();
        // Slot 7's key material ends at sector 3536 + 500 = 4036.
        h.payload_offset = 4035;
        assert!(matches!(h.validate(), Err(Luks1Error::KeyslotOverlapsPayload { slot: 7, .. })));
    }

    #[test]
    fn detached_header_skips_payload_checks() {
        let mut h = sample();
        h.payload_offset = 0;
        h.validate().unwrap();
        assert_eq!(h.required_device_size(), (3536 + 500) * 512);
        assert!(h.check_device_size(1 << 20).is_err());
        h.check_device_size(2 << 20).unwrap();
    }

    #[test]
    fn encode_refuses_overlong_text() {
        let mut h = sample();
        h.cipher_mode = "x".repeat(32);
        assert!(matches!(h.encode(), Err(Luks1Error::FieldTooLong { field: "cipherMode", .. })));
    }
}
