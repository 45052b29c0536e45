//! The LUKS2 JSON area: framing (NUL-terminated, zero-padded), the five top-level objects
//! as typed structs, and cryptsetup's validation (`LUKS2_hdr_validate` and friends in
//! `luks2_json_metadata.c`, `validate_json_area` in `luks2_disk_metadata.c`).
//!
//! ```text
//!  JSON area (hdr_size - 4096 bytes, right after each binary header)
//!  ┌──────────────────────────────────────────┬──────┬───────────────────────┐
//!  │ {"keyslots":{..},"tokens":{..},          │ 0x00 │ 0x00 ... 0x00         │
//!  │  "segments":{..},"digests":{..},         │      │ (all zero to the end) │
//!  │  "config":{..}}                          │      │                       │
//!  └──────────────────────────────────────────┴──────┴───────────────────────┘
//!   first byte must be '{'                     at least one NUL
//! ```
//!
//! Rules carried over from cryptsetup (each has its own [`MetadataError`] variant):
//! * 64-bit quantities (`offset`, `size`, `iv_tweak`, `json_size`, `keyslots_size`,
//!   `opal_segment_size`) are decimal strings; negative, non-decimal or > `u64::MAX` values
//!   are refused. Small quantities (`key_size`, `sector_size`, `stripes`, ...) are JSON ints.
//! * Object ids (keys of `keyslots`, `tokens`, `segments`, `digests`) are decimal strings.
//! * References (`digests.*.keyslots`, `digests.*.segments`, `tokens.*.keyslots`) must name
//!   existing objects; every `luks2` keyslot belongs to exactly one digest; every crypt
//!   segment to at least one.
//! * Keyslot areas lie between the end of the second metadata copy and the end of the
//!   keyslots area, and do not overlap. Segments do not overlap; only the last regular one
//!   may be `dynamic`; backup segments follow the regular ones without gaps.
//! * `config.json_size` equals the binary header's JSON area size, which is one of the nine
//!   allowed metadata sizes minus 4096.
//!
//! Unknown fields at any level, unknown keyslot/segment/digest types and all token contents
//! are preserved on re-encode. Known deviation: objects are written back in cryptsetup's
//! field order with unknown fields after the known ones, not in their original order.

use std::collections::BTreeMap;

use serde_json::Value;

use super::config::{Config, Requirement};
use super::digest::Digest;
use super::internal::{self, take, take_obj, take_str, take_str_array, Obj};
use super::keyslot::{Keyslot, KEYSLOT_LUKS2, KEYSLOT_REENCRYPT};
use super::segment::Segment;
use super::token::Token;
use super::{BINARY_HEADER_SIZE, MAX_KEYSLOTS_SIZE, METADATA_SIZES};

/// json-c's default nesting limit (`JSON_TOKENER_DEFAULT_DEPTH`), which cryptsetup uses
/// ([`crate::limits::LUKS2_JSON_MAX_DEPTH`]).
pub const MAX_DEPTH: usize = crate::limits::LUKS2_JSON_MAX_DEPTH;

/// Why the JSON metadata was refused. One variant per distinct malformation; `what` names
/// the object (`"segment 0"`, `"keyslot 3 area"`, `"config"`, `"JSON area"`) and `field`
/// the member.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[non_exhaustive]
pub enum MetadataError {
    /// The JSON text fills the whole area: no terminating NUL.
    #[error("JSON area has no terminating NUL byte")]
    MissingTrailingNul,
    /// The area does not start with `{`.
    #[error("JSON area must start with '{{' (found byte {0:#04x})")]
    InvalidOpeningChar(u8),
    /// Not valid JSON.
    #[error("JSON area is not valid JSON: {0}")]
    Syntax(String),
    /// Non-NUL bytes after the JSON text.
    #[error("non-zero byte at offset {0} of the JSON area, after the JSON text")]
    DataAfterJson(usize),
    /// The top-level value is not an object.
    #[error("JSON metadata is not an object")]
    NotAnObject,
    /// Nesting deeper than json-c accepts.
    #[error("JSON metadata nests deeper than {MAX_DEPTH} levels")]
    TooDeep,
    /// A mandatory member is missing.
    #[error("{what} is missing \"{field}\"")]
    MissingField {
        /// Object.
        what: String,
        /// Member.
        field: &'static str,
    },
    /// A member has the wrong JSON type.
    #[error("{what} \"{field}\" must be of type {expected}, found {found}")]
    WrongType {
        /// Object.
        what: String,
        /// Member.
        field: &'static str,
        /// Expected JSON type.
        expected: &'static str,
        /// JSON type found.
        found: &'static str,
    },
    /// A string member is empty.
    #[error("{what} \"{field}\" is an empty string")]
    EmptyString {
        /// Object.
        what: String,
        /// Member.
        field: &'static str,
    },
    /// An array member holds a non-string element.
    #[error("{what} \"{field}\"[{index}] must be a string, found {found}")]
    WrongElementType {
        /// Object.
        what: String,
        /// Member.
        field: &'static str,
        /// Element index.
        index: usize,
        /// JSON type found.
        found: &'static str,
    },
    /// A 64-bit value string is not a plain decimal number (e.g. negative).
    #[error("{what} \"{field}\" = {value:?} is not an unsigned decimal number")]
    NotDecimal {
        /// Object.
        what: String,
        /// Member.
        field: &'static str,
        /// Value found.
        value: String,
    },
    /// A 64-bit value string exceeds `u64::MAX`.
    #[error("{what} \"{field}\" = {value:?} overflows 64 bits")]
    Uint64Overflow {
        /// Object.
        what: String,
        /// Member.
        field: &'static str,
        /// Value found.
        value: String,
    },
    /// An integer member is out of its range (negative, or too large).
    #[error("{what} \"{field}\" = {value} is out of range")]
    OutOfRange {
        /// Object.
        what: String,
        /// Member.
        field: &'static str,
        /// Value found.
        value: String,
    },
    /// A salt or digest is not valid base64.
    #[error("{what} \"{field}\" is not valid base64")]
    BadBase64 {
        /// Object.
        what: String,
        /// Member.
        field: &'static str,
    },
    /// An object key is not a decimal id.
    #[error("{section} id {id:?} is not a decimal number")]
    BadId {
        /// `keyslots`, `tokens`, `segments` or `digests`.
        section: &'static str,
        /// The key.
        id: String,
    },
    /// A keyslot, token or segment id at or above cryptsetup's `LUKS2_OBJECTS_MAX`
    /// ([`crate::limits::LUKS2_OBJECTS_MAX`]): it bounds how many keyslots an unlock tries.
    #[error(
        "{section} id {id} is out of range (cryptsetup allows ids 0..{})",
        crate::limits::LUKS2_OBJECTS_MAX
    )]
    IdTooLarge {
        /// `keyslots`, `tokens` or `segments`.
        section: &'static str,
        /// The id.
        id: u32,
    },
    /// A key size above [`crate::limits::MAX_KEY_BYTES`] (the keyslot read, the KDF output
    /// and the AF merge are sized by it).
    #[error(
        "{what} \"{field}\" = {value} exceeds the largest key size, {} bytes",
        crate::limits::MAX_KEY_BYTES
    )]
    KeySizeTooLarge {
        /// Object.
        what: String,
        /// Member (`key_size`).
        field: &'static str,
        /// Value found.
        value: u32,
    },
    /// A `type` this implementation requires to be known is unknown (keyslot `af`, raw
    /// `area` of a `luks2` keyslot).
    #[error("{what} has unknown type {type_name:?}")]
    UnknownType {
        /// Object.
        what: String,
        /// The type found.
        type_name: String,
    },
    /// A digest or token references a keyslot that does not exist.
    #[error("{referrer} references keyslot {keyslot:?}, which does not exist")]
    MissingKeyslot {
        /// `"digest 0"` or `"token 1"`.
        referrer: String,
        /// The reference.
        keyslot: String,
    },
    /// A digest references a segment that does not exist.
    #[error("{referrer} references segment {segment:?}, which does not exist")]
    MissingSegment {
        /// `"digest 0"`.
        referrer: String,
        /// The reference.
        segment: String,
    },
    /// `segments` is empty.
    #[error("no segments")]
    NoSegments,
    /// A segment's `size` is `"0"`.
    #[error("segment {segment} has size 0")]
    ZeroSegmentSize {
        /// Segment id.
        segment: u32,
    },
    /// A segment's `offset` or `size` is not a multiple of 512.
    #[error("segment {segment} {field} {value} is not a multiple of 512")]
    MisalignedSegment {
        /// Segment id.
        segment: u32,
        /// `offset` or `size`.
        field: &'static str,
        /// Value.
        value: u64,
    },
    /// A crypt segment's `sector_size` is 0 or not a multiple of 512.
    #[error("segment {segment} sector_size {sector_size} is not a positive multiple of 512")]
    BadSectorSize {
        /// Segment id.
        segment: u32,
        /// Value.
        sector_size: u32,
    },
    /// A crypt segment's size is not a multiple of its sector size.
    #[error("segment {segment} size {size} is not a multiple of its sector size {sector_size}")]
    SizeNotMultipleOfSectorSize {
        /// Segment id.
        segment: u32,
        /// Size in bytes.
        size: u64,
        /// Sector size.
        sector_size: u32,
    },
    /// An OPAL segment has `dynamic` size.
    #[error("OPAL segment {segment} cannot have dynamic size")]
    DynamicOpalSegment {
        /// Segment id.
        segment: u32,
    },
    /// An OPAL segment's `opal_segment_size` is 0 or smaller than the segment.
    #[error("OPAL segment {segment} has invalid opal_segment_size {opal_segment_size}")]
    BadOpalSegmentSize {
        /// Segment id.
        segment: u32,
        /// Value.
        opal_segment_size: u64,
    },
    /// A crypt segment is not listed by any digest.
    #[error("crypt segment {segment} is not assigned to any digest")]
    SegmentWithoutDigest {
        /// Segment id.
        segment: u32,
    },
    /// A regular segment has a higher id than a backup segment.
    #[error("regular segment {segment} comes after backup segment {backup}")]
    RegularAfterBackup {
        /// Regular segment id.
        segment: u32,
        /// First backup segment id.
        backup: u32,
    },
    /// Only backup segments.
    #[error("no regular segment (segment 0 is a backup segment)")]
    NoRegularSegment,
    /// Segment ids are not contiguous from 0.
    #[error("segment ids have a gap: segment {0} is missing")]
    SegmentGap(u64),
    /// A `dynamic` segment is not the last regular one.
    #[error("segment {segment} has dynamic size but is not the last regular segment")]
    DynamicNotLast {
        /// Segment id.
        segment: u32,
    },
    /// `offset + size` of a segment overflows 64 bits.
    #[error("segment {segment} offset + size overflows 64 bits")]
    SegmentOverflow {
        /// Segment id.
        segment: u32,
    },
    /// Two regular segments overlap.
    #[error("segments {first} and {second} overlap")]
    OverlappingSegments {
        /// Segment id.
        first: u32,
        /// Segment id.
        second: u32,
    },
    /// Online reencryption requirement without its `backup-final`/`backup-previous` segment.
    #[error("reencryption backup segment with flag {0:?} is missing")]
    MissingBackupSegment(&'static str),
    /// During online reencryption a regular segment matches neither backup segment.
    #[error("segment {0} does not match the reencryption backup segments")]
    SegmentDoesNotMatchBackup(u32),
    /// `json_size + 4096` is not one of the nine LUKS2 metadata sizes.
    #[error("config json_size {0} does not give a valid LUKS2 metadata size (16 KiB..4 MiB, power of two)")]
    BadJsonSize(u64),
    /// `keyslots_size` is not a multiple of 4096.
    #[error("config keyslots_size {0} is not a multiple of 4096")]
    KeyslotsSizeMisaligned(u64),
    /// `keyslots_size` exceeds 128 MiB.
    #[error("config keyslots_size {0} exceeds 128 MiB")]
    KeyslotsSizeTooLarge(u64),
    /// The keyslots area runs into the data segment.
    #[error("config keyslots_size {keyslots_size} does not fit between the metadata ({metadata_end} bytes) and the data offset {data_offset}")]
    KeyslotsSizeOverlapsData {
        /// keyslots_size.
        keyslots_size: u64,
        /// End of both metadata copies.
        metadata_end: u64,
        /// Lowest regular segment offset.
        data_offset: u64,
    },
    /// More than one `online-reencrypt*` requirement.
    #[error("more than one online reencryption requirement")]
    MultipleReencryptRequirements,
    /// `config.json_size` differs from the binary header's JSON area size.
    #[error("config json_size {config} does not match the binary header's JSON area size {header}")]
    JsonSizeMismatch {
        /// From `config`.
        config: u64,
        /// `hdr_size - 4096`.
        header: u64,
    },
    /// The JSON text (plus its NUL) does not fit the JSON area.
    #[error("JSON metadata is {len} bytes; the JSON area holds {area} including the terminating NUL")]
    JsonTooLarge {
        /// Compact JSON length.
        len: usize,
        /// Area size.
        area: u64,
    },
    /// A keyslot area starts inside the two metadata copies.
    #[error(
        "keyslot {keyslot} area offset {offset} lies inside the LUKS2 metadata (first {metadata_end} bytes)"
    )]
    AreaInMetadata {
        /// Keyslot id.
        keyslot: u32,
        /// Area offset.
        offset: u64,
        /// End of both metadata copies.
        metadata_end: u64,
    },
    /// A keyslot area has size 0.
    #[error("keyslot {0} area has size 0")]
    ZeroAreaSize(u32),
    /// A keyslot area's `offset + size` overflows 64 bits.
    #[error("keyslot {0} area offset + size overflows 64 bits")]
    AreaOverflow(u32),
    /// A keyslot area ends after the keyslots area.
    #[error("keyslot {keyslot} area ends at {end}, beyond the keyslots area end {limit}")]
    AreaBeyondKeyslots {
        /// Keyslot id.
        keyslot: u32,
        /// Area end.
        end: u64,
        /// Keyslots area end.
        limit: u64,
    },
    /// Two keyslot areas overlap.
    #[error("keyslot {first} and keyslot {second} areas overlap")]
    OverlappingAreas {
        /// Keyslot id.
        first: u32,
        /// Keyslot id.
        second: u32,
    },
    /// A `luks2` keyslot is listed by no digest or by several.
    #[error("keyslot {keyslot} is assigned to {count} digests (must be exactly 1)")]
    KeyslotDigestCount {
        /// Keyslot id.
        keyslot: u32,
        /// Digests listing it.
        count: usize,
    },
    /// Online reencryption requirement without a `reencrypt` keyslot.
    #[error("online reencryption requirement without a reencrypt keyslot")]
    MissingReencryptKeyslot,
    /// A `reencrypt` keyslot without the online reencryption requirement.
    #[error("reencrypt keyslot without an online reencryption requirement")]
    ReencryptWithoutRequirement,
    /// More than one `reencrypt` keyslot.
    #[error("more than one reencrypt keyslot")]
    TooManyReencryptKeyslots,
}

/// The decoded JSON metadata.
#[derive(Debug, Clone, PartialEq)]
pub struct Luks2Metadata {
    /// `keyslots`, by id.
    pub keyslots: BTreeMap<u32, Keyslot>,
    /// `tokens`, by id.
    pub tokens: BTreeMap<u32, Token>,
    /// `segments`, by id.
    pub segments: BTreeMap<u32, Segment>,
    /// `digests`, by id.
    pub digests: BTreeMap<u32, Digest>,
    /// `config`.
    pub config: Config,
    /// Unknown top-level members.
    pub extra: Obj,
}

/// Nesting depth of a JSON value (objects and arrays count one level each).
pub(crate) fn depth_of(v: &Value) -> usize {
    depth(v)
}

fn depth(v: &Value) -> usize {
    match v {
        Value::Array(a) => 1 + a.iter().map(depth).max().unwrap_or(0),
        Value::Object(o) => 1 + o.values().map(depth).max().unwrap_or(0),
        _ => 0,
    }
}

/// Take a top-level section, which must be an object, and split it into (id, member) pairs.
fn section(top: &mut Obj, name: &'static str) -> Result<Obj, MetadataError> {
    take_obj(top, "JSON area", name)
}

fn ids(section_name: &'static str, o: Obj) -> Result<Vec<(u32, Value)>, MetadataError> {
    // cryptsetup addresses keyslots, tokens and segments by an index below
    // LUKS2_OBJECTS_MAX; digests have no such index.
    let bounded = section_name != "digests";
    o.into_iter()
        .map(|(k, v)| {
            let id = internal::parse_id(section_name, &k)?;
            if bounded && id >= crate::limits::LUKS2_OBJECTS_MAX {
                return Err(MetadataError::IdTooLarge { section: section_name, id });
            }
            Ok((id, v))
        })
        .collect()
}

fn member_obj(section_name: &'static str, id: u32, v: Value) -> Result<Obj, MetadataError> {
    match v {
        Value::Object(o) => Ok(o),
        v => Err(MetadataError::WrongType {
            what: format!("{section_name} {id}"),
            field: "<object>",
            expected: "object",
            found: internal::type_name(&v),
        }),
    }
}

/// Resolve reference strings against a section's keys (cryptsetup compares the strings).
fn resolve(
    refs: Vec<String>,
    keys: &BTreeMap<String, u32>,
    missing: impl Fn(String) -> MetadataError,
) -> Result<Vec<u32>, MetadataError> {
    refs.into_iter().map(|r| keys.get(&r).copied().ok_or_else(|| missing(r))).collect()
}

fn key_ids(o: &Obj) -> BTreeMap<String, u32> {
    o.keys().filter_map(|k| internal::parse_id("", k).ok().map(|id| (k.clone(), id))).collect()
}

impl Luks2Metadata {
    /// Decode and validate a JSON area (the `hdr_size - 4096` bytes after a binary header).
    /// Returns the metadata and the length of the JSON text.
    pub fn decode_json_area(area: &[u8]) -> Result<(Self, usize), MetadataError> {
        let first = area.first().copied().unwrap_or(0);
        if first != b'{' {
            return Err(MetadataError::InvalidOpeningChar(first));
        }
        // JSON text cannot contain a raw NUL, so the first NUL ends it.
        let Some(nul) = area.iter().position(|&b| b == 0) else {
            return Err(MetadataError::MissingTrailingNul);
        };
        let mut stream = serde_json::Deserializer::from_slice(&area[..nul]).into_iter::<Value>();
        let value = match stream.next() {
            Some(Ok(v)) => v,
            Some(Err(e)) => return Err(MetadataError::Syntax(e.to_string())),
            None => return Err(MetadataError::Syntax("empty".into())),
        };
        let json_len = stream.byte_offset();
        if json_len < nul {
            return Err(MetadataError::DataAfterJson(json_len));
        }
        if let Some(p) = area[nul..].iter().position(|&b| b != 0) {
            return Err(MetadataError::DataAfterJson(nul + p));
        }
        let meta = Self::from_value(value, area.len() as u64)?;
        Ok((meta, json_len))
    }

    /// Decode and validate the parsed JSON (cryptsetup `LUKS2_hdr_validate`, with
    /// `LUKS2_hdr_repair`'s removal of leftover KDF parameters). `json_area_size` is the
    /// binary header's `hdr_size - 4096`.
    pub fn from_value(v: Value, json_area_size: u64) -> Result<Self, MetadataError> {
        if depth(&v) > MAX_DEPTH {
            return Err(MetadataError::TooDeep);
        }
        let Value::Object(mut top) = v else {
            return Err(MetadataError::NotAnObject);
        };
        // Presence and types of the top-level objects, in the order cryptsetup meets them.
        let mut config_o = section(&mut top, "config")?;
        let requirements = Config::decode_requirements(&mut config_o)?;
        let tokens_o = section(&mut top, "tokens")?;
        let keyslots_v = take(&mut top, "JSON area", "keyslots")?;
        let digests_o = section(&mut top, "digests")?;
        let keyslots_o = match keyslots_v {
            Value::Object(o) => o,
            v => return Err(internal::wrong_type("JSON area", "keyslots", "object", &v)),
        };
        let segments_o = section(&mut top, "segments")?;
        let keyslot_keys = key_ids(&keyslots_o);
        let segment_keys = key_ids(&segments_o);

        // Tokens: type, keyslots referencing existing keyslots.
        let mut tokens = BTreeMap::new();
        for (id, v) in ids("tokens", tokens_o)? {
            let what = format!("token {id}");
            let mut o = member_obj("token", id, v)?;
            let type_name = take_str(&mut o, &what, "type")?;
            let refs = take_str_array(&mut o, &what, "keyslots")?;
            let keyslots = resolve(refs, &keyslot_keys, |k| MetadataError::MissingKeyslot {
                referrer: what.clone(),
                keyslot: k,
            })?;
            tokens.insert(id, Token { type_name, keyslots, extra: o });
        }

        // Digests: type, keyslots and segments referencing existing objects.
        let mut digests = BTreeMap::new();
        for (id, v) in ids("digests", digests_o)? {
            let what = format!("digest {id}");
            let mut o = member_obj("digest", id, v)?;
            // cryptsetup checks `type` before the reference arrays.
            if !matches!(o.get("type"), Some(Value::String(s)) if !s.is_empty()) {
                take_str(&mut o, &what, "type")?;
            }
            let ks = take_str_array(&mut o, &what, "keyslots")?;
            let segs = take_str_array(&mut o, &what, "segments")?;
            let ks = resolve(ks, &keyslot_keys, |k| MetadataError::MissingKeyslot {
                referrer: what.clone(),
                keyslot: k,
            })?;
            let segs = resolve(segs, &segment_keys, |s| MetadataError::MissingSegment {
                referrer: what.clone(),
                segment: s,
            })?;
            digests.insert(id, Digest::decode(id, o, ks, segs)?);
        }

        // Segments: per-segment fields, then the cross-segment rules.
        let mut segments = BTreeMap::new();
        for (id, v) in ids("segments", segments_o)? {
            let o = member_obj("segment", id, v)?;
            segments.insert(id, Segment::decode(id, o)?);
        }

        let mut keyslots = BTreeMap::new();
        for (id, v) in ids("keyslots", keyslots_o)? {
            keyslots.insert(id, Keyslot::decode(id, v)?);
        }

        let config = Config::decode(config_o, requirements)?;
        let meta = Self { keyslots, tokens, segments, digests, config, extra: top };
        meta.validate(json_area_size)?;
        Ok(meta)
    }

    /// The cross-object rules of `LUKS2_hdr_validate` on an already typed header.
    fn validate(&self, json_area_size: u64) -> Result<(), MetadataError> {
        self.validate_segments()?;
        self.validate_config()?;
        self.validate_areas()?;
        if self.config.json_size != json_area_size {
            return Err(MetadataError::JsonSizeMismatch {
                config: self.config.json_size,
                header: json_area_size,
            });
        }
        let len = self.to_json_string().len();
        if len as u64 > json_area_size {
            return Err(MetadataError::JsonTooLarge { len, area: json_area_size });
        }
        self.validate_keyslot_digests()
    }

    fn online_reencrypt(&self) -> bool {
        self.config.mandatory_requirements().iter().any(|r| matches!(r, Requirement::OnlineReencrypt { .. }))
    }

    fn validate_segments(&self) -> Result<(), MetadataError> {
        let count = self.segments.len() as u64;
        if count == 0 {
            return Err(MetadataError::NoSegments);
        }
        let mut first_backup: Option<u32> = None;
        for (&id, seg) in &self.segments {
            if seg.is_backup() {
                first_backup = Some(first_backup.map_or(id, |b| b.min(id)));
            } else if let Some(b) = first_backup {
                return Err(MetadataError::RegularAfterBackup { segment: id, backup: b });
            }
            if seg.crypt.is_some() && !self.digests.values().any(|d| d.segments.contains(&id)) {
                return Err(MetadataError::SegmentWithoutDigest { segment: id });
            }
        }
        if first_backup == Some(0) {
            return Err(MetadataError::NoRegularSegment);
        }
        let regular = first_backup.map_or(count, u64::from);
        if regular >= count && first_backup.is_some() {
            return Err(MetadataError::SegmentGap(count - 1));
        }
        // Regular segments are 0..regular, backups regular..count, without gaps.
        for i in 0..count {
            if u32::try_from(i).ok().and_then(|i| self.segments.get(&i)).is_none() {
                return Err(MetadataError::SegmentGap(i));
            }
        }
        let regular: Vec<(u32, u64, Option<u64>)> = self
            .segments
            .iter()
            .filter(|(&id, _)| u64::from(id) < regular)
            .map(|(&id, s)| (id, s.offset, s.fixed_size()))
            .collect();
        for (n, &(id, off, len)) in regular.iter().enumerate() {
            if len.is_none() && n != regular.len() - 1 {
                return Err(MetadataError::DynamicNotLast { segment: id });
            }
            for &(jd, joff, jlen) in &regular {
                if jd == id {
                    continue;
                }
                let jend = match jlen {
                    Some(l) => {
                        Some(joff.checked_add(l).ok_or(MetadataError::SegmentOverflow { segment: jd })?)
                    }
                    None => None,
                };
                if off >= joff && jend.is_none_or(|e| off < e) {
                    return Err(MetadataError::OverlappingSegments { first: id, second: jd });
                }
            }
        }
        if self.online_reencrypt() {
            let backups = self.segments.values().filter(|s| s.is_backup());
            let mut fin = None;
            let mut prev = None;
            for s in backups {
                if s.has_flag("backup-final") {
                    fin = Some(s);
                } else if s.has_flag("backup-previous") {
                    prev = Some(s);
                }
            }
            let fin = fin.ok_or(MetadataError::MissingBackupSegment("backup-final"))?;
            let prev = prev.ok_or(MetadataError::MissingBackupSegment("backup-previous"))?;
            for &(id, _, _) in &regular {
                let seg = &self.segments[&id];
                let ok = if seg.has_flag("in-reencryption") {
                    seg.same_kind(fin)
                } else {
                    seg.same_kind(fin) || seg.same_kind(prev)
                };
                if !ok {
                    return Err(MetadataError::SegmentDoesNotMatchBackup(id));
                }
            }
        }
        Ok(())
    }

    fn validate_config(&self) -> Result<(), MetadataError> {
        let c = &self.config;
        let metadata_size = c
            .json_size
            .checked_add(BINARY_HEADER_SIZE)
            .filter(|m| METADATA_SIZES.contains(m))
            .ok_or(MetadataError::BadJsonSize(c.json_size))?;
        if !c.keyslots_size.is_multiple_of(4096) {
            return Err(MetadataError::KeyslotsSizeMisaligned(c.keyslots_size));
        }
        if c.keyslots_size > MAX_KEYSLOTS_SIZE {
            return Err(MetadataError::KeyslotsSizeTooLarge(c.keyslots_size));
        }
        let data_offset = self.data_offset();
        if data_offset != 0
            && (data_offset < c.keyslots_size || data_offset - c.keyslots_size < 2 * metadata_size)
        {
            return Err(MetadataError::KeyslotsSizeOverlapsData {
                keyslots_size: c.keyslots_size,
                metadata_end: 2 * metadata_size,
                data_offset,
            });
        }
        Ok(())
    }

    fn validate_areas(&self) -> Result<(), MetadataError> {
        let metadata_end = 2 * self.metadata_size();
        let limit = self.metadata_and_keyslots_size();
        let areas: Vec<(u32, u64, u64)> =
            self.keyslots.iter().map(|(&id, k)| (id, k.area.offset, k.area.size)).collect();
        for &(id, off, len) in &areas {
            if off < metadata_end {
                return Err(MetadataError::AreaInMetadata { keyslot: id, offset: off, metadata_end });
            }
            if len == 0 {
                return Err(MetadataError::ZeroAreaSize(id));
            }
            let end = off.checked_add(len).ok_or(MetadataError::AreaOverflow(id))?;
            if end > limit {
                return Err(MetadataError::AreaBeyondKeyslots { keyslot: id, end, limit });
            }
            for &(jd, joff, jlen) in &areas {
                if jd == id {
                    continue;
                }
                let jend = joff.checked_add(jlen).ok_or(MetadataError::AreaOverflow(jd))?;
                if off >= joff && off < jend {
                    return Err(MetadataError::OverlappingAreas { first: id, second: jd });
                }
            }
        }
        Ok(())
    }

    fn validate_keyslot_digests(&self) -> Result<(), MetadataError> {
        let mut reencrypt = 0usize;
        for (&id, k) in &self.keyslots {
            if k.type_name == KEYSLOT_LUKS2 {
                let count = self.digests.values().filter(|d| d.keyslots.contains(&id)).count();
                if count != 1 {
                    return Err(MetadataError::KeyslotDigestCount { keyslot: id, count });
                }
            } else if k.type_name == KEYSLOT_REENCRYPT {
                reencrypt += 1;
            }
        }
        if self.online_reencrypt() && reencrypt == 0 {
            return Err(MetadataError::MissingReencryptKeyslot);
        }
        let candidate = self
            .config
            .requirements
            .iter()
            .flat_map(|r| r.mandatory.iter().flatten())
            .any(|m| super::config::is_reencrypt_candidate(m));
        if reencrypt > 0 && !candidate {
            return Err(MetadataError::ReencryptWithoutRequirement);
        }
        if reencrypt > 1 {
            return Err(MetadataError::TooManyReencryptKeyslots);
        }
        Ok(())
    }

    /// One metadata copy's size: `json_size + 4096` (saturating on nonsense values).
    pub fn metadata_size(&self) -> u64 {
        self.config.json_size.saturating_add(BINARY_HEADER_SIZE)
    }

    /// Bytes the metadata device must have for both copies and the keyslots area
    /// (cryptsetup `LUKS2_hdr_and_areas_size`).
    pub fn metadata_and_keyslots_size(&self) -> u64 {
        self.metadata_size().saturating_mul(2).saturating_add(self.config.keyslots_size)
    }

    /// Lowest offset of a regular (non-backup) segment, or 0 if one starts at 0 (detached
    /// header) (cryptsetup `json_segments_get_minimal_offset`).
    pub fn data_offset(&self) -> u64 {
        let offs = self.segments.values().filter(|s| !s.is_backup()).map(|s| s.offset);
        if offs.clone().any(|o| o == 0) {
            return 0;
        }
        offs.min().unwrap_or(0)
    }

    /// The segment used for activation: the one flagged `backup-final` during
    /// reencryption, else segment 0 (cryptsetup `LUKS2_get_default_segment`).
    pub fn default_segment(&self) -> Option<u32> {
        self.segments
            .iter()
            .find(|(_, s)| s.has_flag("backup-final"))
            .map(|(&id, _)| id)
            .or_else(|| self.segments.contains_key(&0).then_some(0))
    }

    /// The digest that lists `keyslot` (exactly one for a valid `luks2` keyslot).
    pub fn keyslot_digest(&self, keyslot: u32) -> Option<u32> {
        self.digests.iter().find(|(_, d)| d.keyslots.contains(&keyslot)).map(|(&id, _)| id)
    }

    /// The digest that lists `segment`.
    pub fn segment_digest(&self, segment: u32) -> Option<u32> {
        self.digests.iter().find(|(_, d)| d.segments.contains(&segment)).map(|(&id, _)| id)
    }

    /// Mandatory requirements this implementation does not know: an open must refuse the
    /// device, naming them (cryptsetup: "Unmet LUKS2 requirements detected").
    pub fn unknown_requirements(&self) -> Vec<String> {
        self.config
            .mandatory_requirements()
            .into_iter()
            .filter_map(|r| match r {
                Requirement::Unknown(s) => Some(s),
                _ => None,
            })
            .collect()
    }

    /// Segments with an `integrity` section (dm-integrity below dm-crypt).
    pub fn integrity_segments(&self) -> Vec<u32> {
        self.segments
            .iter()
            .filter(|(_, s)| s.crypt.as_ref().is_some_and(|c| c.integrity.is_some()))
            .map(|(&id, _)| id)
            .collect()
    }

    /// The JSON value, in cryptsetup's member order.
    pub fn to_value(&self) -> Value {
        fn map<T>(m: &BTreeMap<u32, T>, f: impl Fn(&T) -> Value) -> Value {
            Value::Object(m.iter().map(|(k, v)| (k.to_string(), f(v))).collect())
        }
        let mut o = Obj::new();
        o.insert("keyslots".into(), map(&self.keyslots, Keyslot::encode));
        o.insert("tokens".into(), map(&self.tokens, Token::encode));
        o.insert("segments".into(), map(&self.segments, Segment::encode));
        o.insert("digests".into(), map(&self.digests, Digest::encode));
        o.insert("config".into(), self.config.encode());
        internal::append_extra(&mut o, &self.extra);
        Value::Object(o)
    }

    /// The JSON as `cryptsetup luksDump --dump-json-metadata` prints it (json-c's pretty
    /// layout, [`super::pretty::json_c_pretty`]).
    pub fn to_json_pretty(&self) -> String {
        super::pretty::json_c_pretty(&self.to_value())
    }

    /// Compact JSON text, as cryptsetup writes it (`JSON_C_TO_STRING_PLAIN`).
    pub fn to_json_string(&self) -> String {
        // Serializing a Value to a String cannot fail (no non-string keys, no I/O).
        serde_json::to_string(&self.to_value()).unwrap_or_default()
    }

    /// Encode a JSON area of `json_area_size` bytes: compact JSON, NUL, zero padding.
    /// The result is decoded again and must validate, so nothing invalid is ever written.
    pub fn encode_json_area(&self, json_area_size: u64) -> Result<Vec<u8>, MetadataError> {
        if !METADATA_SIZES.contains(&json_area_size.saturating_add(BINARY_HEADER_SIZE)) {
            return Err(MetadataError::BadJsonSize(json_area_size));
        }
        let text = self.to_json_string();
        let area = usize::try_from(json_area_size).unwrap_or(usize::MAX);
        if text.len() >= area {
            return Err(MetadataError::JsonTooLarge { len: text.len(), area: json_area_size });
        }
        let mut out = vec![0u8; area];
        out[..text.len()].copy_from_slice(text.as_bytes());
        Self::decode_json_area(&out)?;
        Ok(out)
    }
}
