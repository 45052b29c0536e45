//! LUKS2 segments (`"segments": {"0": {...}}`), cryptsetup `luks2_segment.c` and
//! `hdr_validate_segments` / `hdr_validate_crypt_segment` in `luks2_json_metadata.c`.
//!
//! ```text
//! "0": {
//!   "type": "crypt",                       every segment: non-empty string
//!   "offset": "16777216",                  every segment: u64 string, multiple of 512
//!   "size": "dynamic",                     every segment: "dynamic" (to the end of the device)
//!                                          or a non-zero u64 string, multiple of 512
//!   "iv_tweak": "0",                       crypt: u64 string (dm-crypt iv_offset, 512-B units)
//!   "encryption": "aes-xts-plain64",       crypt: non-empty string
//!   "sector_size": 512,                    crypt: int, non-zero multiple of 512
//!   "integrity": {"type": "hmac(sha256)",  crypt, optional: dm-integrity below dm-crypt
//!                 "journal_encryption": "none", "journal_integrity": "none"},
//!   "flags": ["backup-final"]              optional: array of strings
//! }
//! ```
//! `hw-opal` and `hw-opal-crypt` segments add `opal_segment_number`, `opal_key_size` (ints)
//! and `opal_segment_size` (u64 string); `hw-opal-crypt` also has the crypt fields. `linear`
//! segments (used during reencryption) and unknown types need only the common fields.
//! Segments flagged `backup-*` are reencryption bookkeeping and follow the regular ones.

use serde_json::Value;

use super::internal::{
    self, append_extra, take_i32, take_obj, take_opt_str_array, take_str, take_u32, take_u64_str, Obj,
};
use super::json::MetadataError;

/// Encryption sector size unit, and the alignment of segment offsets and sizes.
pub const SECTOR_SIZE: u64 = 512;

/// A segment's `size`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum SegmentSize {
    /// `"dynamic"`: up to the end of the device.
    Dynamic,
    /// A fixed size in bytes (non-zero).
    Bytes(u64),
}

/// One segment.
#[derive(Debug, Clone, PartialEq)]
pub struct Segment {
    /// `type`: `crypt`, `linear`, `hw-opal`, `hw-opal-crypt`, or unknown.
    pub type_name: String,
    /// `offset` in bytes from the device start.
    pub offset: u64,
    /// `size`.
    pub size: SegmentSize,
    /// Crypt parameters (`crypt` and `hw-opal-crypt`).
    pub crypt: Option<CryptParams>,
    /// OPAL parameters (`hw-opal`, `hw-opal-crypt`).
    pub opal: Option<OpalParams>,
    /// `flags`, if present.
    pub flags: Option<Vec<String>>,
    /// Unknown fields.
    pub extra: Obj,
}

/// Fields of a crypt segment.
#[derive(Debug, Clone, PartialEq)]
pub struct CryptParams {
    /// `iv_tweak`: dm-crypt `iv_offset`, in 512-byte sectors.
    pub iv_tweak: u64,
    /// `encryption`: cipher spec, e.g. `aes-xts-plain64`.
    pub encryption: String,
    /// `sector_size` in bytes.
    pub sector_size: u32,
    /// `integrity`: present when the segment sits on dm-integrity (authenticated
    /// encryption). Decoded so `volume` can refuse it clearly until that layer exists.
    pub integrity: Option<SegmentIntegrity>,
}

/// A crypt segment's `integrity` object.
#[derive(Debug, Clone, PartialEq)]
pub struct SegmentIntegrity {
    /// `type`, e.g. `hmac(sha256)`, `aead`, `poly1305`.
    pub type_name: String,
    /// `journal_encryption` (`none` in practice).
    pub journal_encryption: String,
    /// `journal_integrity` (`none` in practice).
    pub journal_integrity: String,
    /// `key_size`, if present (separate integrity key bytes).
    pub key_size: Option<u32>,
    /// Unknown fields.
    pub extra: Obj,
}

/// Fields of an OPAL segment.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct OpalParams {
    /// `opal_segment_number`: locking range.
    pub segment_number: i32,
    /// `opal_key_size` in bytes.
    pub key_size: i32,
    /// `opal_segment_size` in bytes.
    pub segment_size: u64,
}

impl Segment {
    /// Size in bytes, `None` for `dynamic`.
    pub fn fixed_size(&self) -> Option<u64> {
        match self.size {
            SegmentSize::Dynamic => None,
            SegmentSize::Bytes(b) => Some(b),
        }
    }

    /// `true` if a flag equals `flag`.
    pub fn has_flag(&self, flag: &str) -> bool {
        self.flags.iter().flatten().any(|f| f == flag)
    }

    /// Reencryption backup segment (a flag starting with `backup-`).
    pub fn is_backup(&self) -> bool {
        self.flags.iter().flatten().any(|f| f.starts_with("backup-"))
    }

    /// cryptsetup `json_segment_cmp`: same type, and for crypt the same sector size and
    /// cipher.
    pub(crate) fn same_kind(&self, other: &Segment) -> bool {
        if self.type_name != other.type_name {
            return false;
        }
        if self.type_name == "crypt" {
            let a = self.crypt.as_ref().map(|c| (c.sector_size, c.encryption.as_str()));
            let b = other.crypt.as_ref().map(|c| (c.sector_size, c.encryption.as_str()));
            return a == b;
        }
        true
    }

    /// Decode segment `id` and run the checks that need only this segment.
    pub(crate) fn decode(id: u32, mut o: Obj) -> Result<Self, MetadataError> {
        let what = format!("segment {id}");
        let type_name = take_str(&mut o, &what, "type")?;
        let offset_s = take_str(&mut o, &what, "offset")?;
        let size_s = take_str(&mut o, &what, "size")?;
        let offset = internal::parse_u64_str(&offset_s, &what, "offset")?;
        let size = if size_s == "dynamic" {
            SegmentSize::Dynamic
        } else {
            match internal::parse_u64_str(&size_s, &what, "size")? {
                0 => return Err(MetadataError::ZeroSegmentSize { segment: id }),
                n => SegmentSize::Bytes(n),
            }
        };
        if !offset.is_multiple_of(SECTOR_SIZE) {
            return Err(MetadataError::MisalignedSegment { segment: id, field: "offset", value: offset });
        }
        let size_bytes = match size {
            SegmentSize::Dynamic => 0,
            SegmentSize::Bytes(b) => b,
        };
        if !size_bytes.is_multiple_of(SECTOR_SIZE) {
            return Err(MetadataError::MisalignedSegment { segment: id, field: "size", value: size_bytes });
        }
        let flags = take_opt_str_array(&mut o, &what, "flags")?;

        let is_crypt = type_name == "crypt" || type_name == "hw-opal-crypt";
        let mut opal = None;
        if type_name.starts_with("hw-opal") {
            if size == SegmentSize::Dynamic {
                return Err(MetadataError::DynamicOpalSegment { segment: id });
            }
            let segment_number = take_i32(&mut o, &what, "opal_segment_number")?;
            let key_size = take_i32(&mut o, &what, "opal_key_size")?;
            let segment_size = take_u64_str(&mut o, &what, "opal_segment_size")?;
            if segment_size == 0 || size_bytes > segment_size {
                return Err(MetadataError::BadOpalSegmentSize {
                    segment: id,
                    opal_segment_size: segment_size,
                });
            }
            opal = Some(OpalParams { segment_number, key_size, segment_size });
        }
        let crypt = if is_crypt { Some(CryptParams::decode(id, &mut o, &what, size_bytes)?) } else { None };
        Ok(Self { type_name, offset, size, crypt, opal, flags, extra: o })
    }

    /// Encode in cryptsetup's order: type, offset, size, iv_tweak, encryption, sector_size,
    /// integrity, opal fields, flags, then unknown fields.
    pub(crate) fn encode(&self) -> Value {
        let mut o = Obj::new();
        o.insert("type".into(), self.type_name.as_str().into());
        o.insert("offset".into(), internal::u64_str(self.offset));
        o.insert(
            "size".into(),
            match self.size {
                SegmentSize::Dynamic => "dynamic".into(),
                SegmentSize::Bytes(b) => internal::u64_str(b),
            },
        );
        if let Some(c) = &self.crypt {
            o.insert("iv_tweak".into(), internal::u64_str(c.iv_tweak));
            o.insert("encryption".into(), c.encryption.as_str().into());
            o.insert("sector_size".into(), c.sector_size.into());
            if let Some(i) = &c.integrity {
                let mut io = Obj::new();
                io.insert("type".into(), i.type_name.as_str().into());
                io.insert("journal_encryption".into(), i.journal_encryption.as_str().into());
                io.insert("journal_integrity".into(), i.journal_integrity.as_str().into());
                if let Some(k) = i.key_size {
                    io.insert("key_size".into(), k.into());
                }
                append_extra(&mut io, &i.extra);
                o.insert("integrity".into(), Value::Object(io));
            }
        }
        if let Some(p) = &self.opal {
            o.insert("opal_segment_number".into(), p.segment_number.into());
            o.insert("opal_key_size".into(), p.key_size.into());
            o.insert("opal_segment_size".into(), internal::u64_str(p.segment_size));
        }
        if let Some(f) = &self.flags {
            o.insert("flags".into(), internal::str_array(f));
        }
        append_extra(&mut o, &self.extra);
        Value::Object(o)
    }
}

impl CryptParams {
    fn decode(id: u32, o: &mut Obj, what: &str, size_bytes: u64) -> Result<Self, MetadataError> {
        let iv_tweak_s = take_str(o, what, "iv_tweak")?;
        let encryption = take_str(o, what, "encryption")?;
        let sector_size = take_u32(o, what, "sector_size")?;
        let integrity = if o.contains_key("integrity") {
            let mut io = take_obj(o, what, "integrity")?;
            let iwhat = format!("{what} integrity");
            Some(SegmentIntegrity {
                type_name: take_str(&mut io, &iwhat, "type")?,
                journal_encryption: take_str(&mut io, &iwhat, "journal_encryption")?,
                journal_integrity: take_str(&mut io, &iwhat, "journal_integrity")?,
                key_size: if io.contains_key("key_size") {
                    Some(take_u32(&mut io, &iwhat, "key_size")?)
                } else {
                    None
                },
                extra: io,
            })
        } else {
            None
        };
        if sector_size == 0 || !u64::from(sector_size).is_multiple_of(SECTOR_SIZE) {
            return Err(MetadataError::BadSectorSize { segment: id, sector_size });
        }
        let iv_tweak = internal::parse_u64_str(&iv_tweak_s, what, "iv_tweak")?;
        if !size_bytes.is_multiple_of(u64::from(sector_size)) {
            return Err(MetadataError::SizeNotMultipleOfSectorSize {
                segment: id,
                size: size_bytes,
                sector_size,
            });
        }
        Ok(Self { iv_tweak, encryption, sector_size, integrity })
    }
}
