//! LUKS2 reencryption metadata (cryptsetup `luks2_reencrypt.c`, `luks2_keyslot_reenc.c`,
//! `luks2_reencrypt_digest.c`): the `reencrypt` keyslot, the backup segments, the segment
//! layout while a hotzone is being rewritten, and the verification data whose digest binds
//! the reencryption metadata to the volume keys. Sans-IO: metadata in, metadata or bytes out.
//!
//! ```text
//!  config.requirements.mandatory = ["online-reencrypt-v2"]
//!  keyslots.N = {"type":"reencrypt", "key_size":1, "priority":0,
//!                "mode":"reencrypt"|"encrypt"|"decrypt", "direction":"forward"|"backward",
//!                "area":{"type":"none"|"checksum"|"journal"|"datashift"..., "offset", "size",
//!                        checksum: "hash", "sector_size"; datashift*: "shift_size"}}
//!  segments   = regular segments (forward, mid-run):
//!                 0: new data  [data_offset, +done)                    digest new
//!                 1: hotzone   [.., +len) flags ["in-reencryption"]    digests new and old
//!                 2: old data  [.., dynamic)                           digest old
//!               then "backup-previous" (old segment, digest old) and "backup-final"
//!               (new segment, digest new), and "backup-moved-segment" with a data shift
//!  digests    = old digest, new digest, and a pbkdf2 digest of the verification data
//!               assigned to the reencrypt keyslot (no segments)
//! ```
//!
//! Verification data (`reencrypt_assembly_verification_data`): `'v'`, `'0' + version`, the
//! old volume key, the new volume key (if its digest differs), the reencrypt keyslot's
//! mode, direction and area fields, then the backup-previous, backup-final (and
//! backup-moved) segments' fields. Strings as raw bytes (at most 64), 64-bit values
//! big-endian, `"dynamic"` sizes as the text, 32-bit ints big-endian.

use std::collections::BTreeMap;

use serde_json::{Map, Value};
use zeroize::Zeroizing;

use super::config::Requirement;
use super::json::Luks2Metadata;
use super::keyslot::{Area, Keyslot, KEYSLOT_REENCRYPT};
use super::segment::{CryptParams, Segment, SegmentSize};

/// The requirement cryptsetup 2.4+ writes while a reencryption is in progress.
pub const REQUIREMENT_V2: &str = "online-reencrypt-v2";
/// Segment flag of the hotzone being rewritten (present only after a crash).
pub const FLAG_IN_REENCRYPTION: &str = "in-reencryption";
/// Backup segment flag: the segment as it was before.
pub const FLAG_BACKUP_PREVIOUS: &str = "backup-previous";
/// Backup segment flag: the segment as it will be.
pub const FLAG_BACKUP_FINAL: &str = "backup-final";
/// Backup segment flag: the first segment's data moved away (encryption with data shift).
pub const FLAG_BACKUP_MOVED: &str = "backup-moved-segment";
/// cryptsetup `LUKS2_REENCRYPT_MAX_HOTZONE_LENGTH` (1 GiB).
pub const MAX_HOTZONE_LENGTH: u64 = 0x4000_0000;
/// cryptsetup `LUKS2_DEFAULT_NONE_REENCRYPTION_LENGTH` (20 MiB).
pub const DEFAULT_NONE_HOTZONE_LENGTH: u64 = 0x140_0000;
/// Longest string the verification data takes (cryptsetup `MAX_STR`).
const MAX_STR: usize = 64;

/// What the reencryption does (keyslot `mode`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ReencryptMode {
    /// Old key and cipher to new ones.
    Reencrypt,
    /// Plaintext to ciphertext.
    Encrypt,
    /// Ciphertext to plaintext.
    Decrypt,
}

impl ReencryptMode {
    /// The JSON word.
    pub fn as_str(self) -> &'static str {
        match self {
            Self::Reencrypt => "reencrypt",
            Self::Encrypt => "encrypt",
            Self::Decrypt => "decrypt",
        }
    }
}

/// Which end the hotzone starts from (keyslot `direction`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Direction {
    /// From the data offset up.
    Forward,
    /// From the end down.
    Backward,
}

impl Direction {
    /// The JSON word.
    pub fn as_str(self) -> &'static str {
        match self {
            Self::Forward => "forward",
            Self::Backward => "backward",
        }
    }
}

/// How a hotzone survives a crash (reencrypt keyslot `area.type`).
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Resilience {
    /// Nothing: the metadata is written only when the run stops.
    None,
    /// One hash per `block_size` block of the hotzone's old content, in the area.
    Checksum {
        /// Hash name (`sha256`).
        hash: String,
        /// Block size in bytes (the area's `sector_size`).
        block_size: u32,
    },
    /// The hotzone's old content itself, in the area.
    Journal,
    /// The data moves by `shift` bytes; the old copy is the protection.
    Datashift {
        /// `shift_size` in bytes.
        shift: u64,
    },
    /// Datashift, with checksums for the moved first segment.
    DatashiftChecksum {
        /// Hash name.
        hash: String,
        /// Block size.
        block_size: u32,
        /// `shift_size`.
        shift: u64,
    },
    /// Datashift, with a journal for the moved first segment.
    DatashiftJournal {
        /// `shift_size`.
        shift: u64,
    },
}

impl Resilience {
    /// The area `type` word.
    pub fn type_name(&self) -> &'static str {
        match self {
            Self::None => "none",
            Self::Checksum { .. } => "checksum",
            Self::Journal => "journal",
            Self::Datashift { .. } => "datashift",
            Self::DatashiftChecksum { .. } => "datashift-checksum",
            Self::DatashiftJournal { .. } => "datashift-journal",
        }
    }

    /// The data shift in bytes (0 without one).
    pub fn shift(&self) -> u64 {
        match self {
            Self::Datashift { shift }
            | Self::DatashiftChecksum { shift, .. }
            | Self::DatashiftJournal { shift } => *shift,
            _ => 0,
        }
    }

    /// The area object's fields after `offset` and `size` (cryptsetup
    /// `reencrypt_keyslot_area_jobj`).
    fn area_extra(&self) -> Map<String, Value> {
        let mut o = Map::new();
        match self {
            Self::Checksum { hash, block_size } => {
                o.insert("hash".into(), hash.as_str().into());
                o.insert("sector_size".into(), (*block_size).into());
            }
            Self::DatashiftChecksum { hash, block_size, shift } => {
                o.insert("hash".into(), hash.as_str().into());
                o.insert("sector_size".into(), (*block_size).into());
                o.insert("shift_size".into(), Value::String(shift.to_string()));
            }
            Self::Datashift { shift } | Self::DatashiftJournal { shift } => {
                o.insert("shift_size".into(), Value::String(shift.to_string()));
            }
            Self::None | Self::Journal => {}
        }
        o
    }
}

/// Why the reencryption metadata is refused (cryptsetup `reenc_keyslot_validate` and the
/// checks of `reencrypt_load`).
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[non_exhaustive]
pub enum ReencryptMetaError {
    /// A field of the reencrypt keyslot is missing or of the wrong type.
    #[error("reencrypt keyslot {keyslot}: {field} is missing or invalid")]
    BadField {
        /// Keyslot id.
        keyslot: u32,
        /// The field.
        field: &'static str,
    },
    /// The keyslot's `key_size` is not 1.
    #[error("reencrypt keyslot {0}: key_size must be 1")]
    BadKeySize(u32),
    /// Unknown `mode`, `direction` or area `type`.
    #[error("reencrypt keyslot {keyslot}: unknown {field} {value:?}")]
    UnknownValue {
        /// Keyslot id.
        keyslot: u32,
        /// `mode`, `direction` or `area type`.
        field: &'static str,
        /// The value.
        value: String,
    },
    /// The online reencryption requirement is there but no reencrypt keyslot.
    #[error("online reencryption requirement without a reencrypt keyslot")]
    NoKeyslot,
    /// A backup segment is missing.
    #[error("reencryption backup segment {0:?} is missing")]
    NoBackup(&'static str),
    /// A requirement version this implementation does not know.
    #[error("unsupported LUKS2 reencryption requirement {0:?}")]
    UnknownVersion(String),
    /// A segment or keyslot field cannot be serialized into the verification data.
    #[error("reencryption metadata cannot be serialized for verification ({0})")]
    Serialize(&'static str),
    /// Two segments are in reencryption, or the layout is not one reencryption makes.
    #[error("unexpected reencryption segment layout: {0}")]
    Layout(&'static str),
}

/// The reencrypt keyslot, decoded.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ReencryptKeyslot {
    /// Keyslot id.
    pub id: u32,
    /// `mode`.
    pub mode: ReencryptMode,
    /// `direction`.
    pub direction: Direction,
    /// `area.type` and its parameters.
    pub resilience: Resilience,
    /// `area.offset`.
    pub area_offset: u64,
    /// `area.size`.
    pub area_size: u64,
}

impl ReencryptKeyslot {
    /// The keyslot JSON object (cryptsetup `reenc_keyslot_alloc`: key_size 1, priority 0).
    pub fn to_keyslot(&self) -> Keyslot {
        let mut extra = Map::new();
        extra.insert("mode".into(), self.mode.as_str().into());
        extra.insert("direction".into(), self.direction.as_str().into());
        Keyslot {
            type_name: KEYSLOT_REENCRYPT.into(),
            key_size: 1,
            priority: Some(0),
            af: None,
            area: Area {
                type_name: self.resilience.type_name().into(),
                offset: self.area_offset,
                size: self.area_size,
                encryption: None,
                key_size: None,
                extra: self.resilience.area_extra(),
            },
            kdf: None,
            extra,
        }
    }

    fn decode(id: u32, ks: &Keyslot) -> Result<Self, ReencryptMetaError> {
        let bad = |field| ReencryptMetaError::BadField { keyslot: id, field };
        if ks.key_size != 1 {
            return Err(ReencryptMetaError::BadKeySize(id));
        }
        let s = |o: &Map<String, Value>, f: &'static str| -> Result<String, ReencryptMetaError> {
            o.get(f).and_then(Value::as_str).filter(|s| !s.is_empty()).map(str::to_owned).ok_or(bad(f))
        };
        let mode = match s(&ks.extra, "mode")?.as_str() {
            "reencrypt" => ReencryptMode::Reencrypt,
            "encrypt" => ReencryptMode::Encrypt,
            "decrypt" => ReencryptMode::Decrypt,
            v => {
                return Err(ReencryptMetaError::UnknownValue { keyslot: id, field: "mode", value: v.into() })
            }
        };
        let direction = match s(&ks.extra, "direction")?.as_str() {
            "forward" => Direction::Forward,
            "backward" => Direction::Backward,
            v => {
                return Err(ReencryptMetaError::UnknownValue {
                    keyslot: id,
                    field: "direction",
                    value: v.into(),
                })
            }
        };
        let a = &ks.area.extra;
        let checksum = || -> Result<(String, u32), ReencryptMetaError> {
            let hash = s(a, "hash")?;
            let bs = a
                .get("sector_size")
                .and_then(Value::as_u64)
                .and_then(|v| u32::try_from(v).ok())
                .filter(|v| *v >= 512 && v.is_power_of_two())
                .ok_or(bad("area sector_size"))?;
            Ok((hash, bs))
        };
        let shift = || -> Result<u64, ReencryptMetaError> {
            s(a, "shift_size")?
                .parse::<u64>()
                .ok()
                .filter(|v| *v != 0 && v % 512 == 0)
                .ok_or(bad("area shift_size"))
        };
        let resilience = match ks.area.type_name.as_str() {
            "none" => Resilience::None,
            "journal" => Resilience::Journal,
            "checksum" => {
                let (hash, block_size) = checksum()?;
                Resilience::Checksum { hash, block_size }
            }
            "datashift" => Resilience::Datashift { shift: shift()? },
            "datashift-checksum" => {
                let (hash, block_size) = checksum()?;
                Resilience::DatashiftChecksum { hash, block_size, shift: shift()? }
            }
            "datashift-journal" => Resilience::DatashiftJournal { shift: shift()? },
            v => {
                return Err(ReencryptMetaError::UnknownValue {
                    keyslot: id,
                    field: "area type",
                    value: v.into(),
                })
            }
        };
        Ok(Self { id, mode, direction, resilience, area_offset: ks.area.offset, area_size: ks.area.size })
    }
}

/// A reencryption in progress, as the metadata describes it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ReencryptState {
    /// Requirement version (2 for `online-reencrypt-v2`).
    pub version: u8,
    /// The reencrypt keyslot.
    pub keyslot: ReencryptKeyslot,
    /// Segment id flagged `backup-previous`.
    pub previous: u32,
    /// Segment id flagged `backup-final`.
    pub final_: u32,
    /// Segment id flagged `backup-moved-segment`.
    pub moved: Option<u32>,
    /// Digest of the old key (`None` when encrypting).
    pub digest_old: Option<u32>,
    /// Digest of the new key (`None` when decrypting).
    pub digest_new: Option<u32>,
    /// The verification digest (the one assigned to the reencrypt keyslot).
    pub digest_verify: Option<u32>,
    /// The segment flagged `in-reencryption`: a hotzone was being rewritten when the run
    /// stopped (cryptsetup's "crash" state, which needs recovery).
    pub hot: Option<u32>,
}

impl ReencryptState {
    /// The `backup-previous` segment in `m`.
    pub fn backup_previous<'m>(&self, m: &'m Luks2Metadata) -> Result<&'m Segment, ReencryptMetaError> {
        m.segments.get(&self.previous).ok_or(ReencryptMetaError::NoBackup(FLAG_BACKUP_PREVIOUS))
    }

    /// The `backup-final` segment in `m`.
    pub fn backup_final<'m>(&self, m: &'m Luks2Metadata) -> Result<&'m Segment, ReencryptMetaError> {
        m.segments.get(&self.final_).ok_or(ReencryptMetaError::NoBackup(FLAG_BACKUP_FINAL))
    }

    /// The `backup-moved-segment` segment in `m` (data shift).
    pub fn backup_moved<'m>(&self, m: &'m Luks2Metadata) -> Result<&'m Segment, ReencryptMetaError> {
        self.moved.and_then(|i| m.segments.get(&i)).ok_or(ReencryptMetaError::NoBackup(FLAG_BACKUP_MOVED))
    }

    /// Reads the reencryption state: `Ok(None)` without an online reencryption requirement.
    pub fn from_metadata(m: &Luks2Metadata) -> Result<Option<Self>, ReencryptMetaError> {
        let mut version = None;
        for r in m.config.requirements.iter().flat_map(|r| r.mandatory.iter().flatten()) {
            match Requirement::parse(r) {
                Requirement::OnlineReencrypt { version: v @ (2 | 3) } => version = Some(v),
                Requirement::OnlineReencrypt { .. } => {
                    return Err(ReencryptMetaError::UnknownVersion(r.clone()))
                }
                _ => {}
            }
        }
        let Some(version) = version else { return Ok(None) };
        let (&id, ks) = m
            .keyslots
            .iter()
            .find(|(_, k)| k.type_name == KEYSLOT_REENCRYPT)
            .ok_or(ReencryptMetaError::NoKeyslot)?;
        let keyslot = ReencryptKeyslot::decode(id, ks)?;
        let by_flag = |f: &str| m.segments.iter().find(|(_, s)| s.has_flag(f)).map(|(&i, _)| i);
        let previous =
            by_flag(FLAG_BACKUP_PREVIOUS).ok_or(ReencryptMetaError::NoBackup(FLAG_BACKUP_PREVIOUS))?;
        let final_ = by_flag(FLAG_BACKUP_FINAL).ok_or(ReencryptMetaError::NoBackup(FLAG_BACKUP_FINAL))?;
        let hots: Vec<u32> =
            m.segments.iter().filter(|(_, s)| s.has_flag(FLAG_IN_REENCRYPTION)).map(|(&i, _)| i).collect();
        if hots.len() > 1 {
            return Err(ReencryptMetaError::Layout("more than one segment is in reencryption"));
        }
        Ok(Some(Self {
            version,
            previous,
            final_,
            moved: by_flag(FLAG_BACKUP_MOVED),
            digest_old: m.segment_digest(previous),
            digest_new: m.segment_digest(final_),
            digest_verify: m.keyslot_digest(id),
            hot: hots.first().copied(),
            keyslot,
        }))
    }

    /// Regular (non-backup) segments, ascending.
    pub fn regular_segments(m: &Luks2Metadata) -> Vec<(u32, &Segment)> {
        m.segments.iter().filter(|(_, s)| !s.is_backup()).map(|(&i, s)| (i, s)).collect()
    }

    /// Data offset of the new layout (backup-final's offset).
    pub fn data_offset_new(&self, m: &Luks2Metadata) -> u64 {
        m.segments.get(&self.final_).map_or(0, |s| s.offset)
    }

    /// Where the next hotzone starts, relative to the new data offset, for a forward run
    /// without data shift (cryptsetup `reencrypt_offset` / `_offset_forward`).
    pub fn forward_offset(&self, m: &Luks2Metadata) -> Result<u64, ReencryptMetaError> {
        if let Some(h) = self.hot {
            let s = &m.segments[&h];
            return s
                .offset
                .checked_sub(self.data_offset_new(m))
                .ok_or(ReencryptMetaError::Layout("hotzone before the data offset"));
        }
        let regular = Self::regular_segments(m);
        match regular.len() {
            1 => Ok(0),
            2 => regular[0]
                .1
                .fixed_size()
                .ok_or(ReencryptMetaError::Layout("first of two segments is dynamic")),
            _ => Err(ReencryptMetaError::Layout("more than two segments outside a hotzone")),
        }
    }

    /// The verification data of `version` for these keys (cryptsetup
    /// `reencrypt_assembly_verification_data`). `vk_old` is needed unless encrypting,
    /// `vk_new` unless decrypting or the digests are the same.
    pub fn verification_data(
        &self,
        m: &Luks2Metadata,
        version: u8,
        vk_old: Option<&[u8]>,
        vk_new: Option<&[u8]>,
    ) -> Result<Zeroizing<Vec<u8>>, ReencryptMetaError> {
        let mut out = Zeroizing::new(vec![b'v', b'0'.wrapping_add(version)]);
        let mut any = false;
        if self.digest_old.is_some() {
            out.extend_from_slice(vk_old.ok_or(ReencryptMetaError::Serialize("old volume key"))?);
            any = true;
        }
        if self.digest_new.is_some() && self.digest_new != self.digest_old {
            out.extend_from_slice(vk_new.ok_or(ReencryptMetaError::Serialize("new volume key"))?);
            any = true;
        }
        if !any {
            return Err(ReencryptMetaError::Serialize("no volume key"));
        }
        let ks = &m.keyslots[&self.keyslot.id];
        let str_ = |out: &mut Vec<u8>, s: &str, what| {
            if s.is_empty() || s.len() > MAX_STR {
                return Err(ReencryptMetaError::Serialize(what));
            }
            out.extend_from_slice(s.as_bytes());
            Ok(())
        };
        let ks_str = |f: &'static str| ks.extra.get(f).and_then(Value::as_str).unwrap_or("");
        str_(&mut out, ks_str("mode"), "mode")?;
        str_(&mut out, ks_str("direction"), "direction")?;
        str_(&mut out, &ks.area.type_name, "area type")?;
        out.extend_from_slice(&ks.area.offset.to_be_bytes());
        out.extend_from_slice(&ks.area.size.to_be_bytes());
        let a = &ks.area.extra;
        let area_str = |f| a.get(f).and_then(Value::as_str).unwrap_or("");
        let checksum = |out: &mut Vec<u8>| -> Result<(), ReencryptMetaError> {
            str_(out, area_str("hash"), "area hash")?;
            let bs = a
                .get("sector_size")
                .and_then(Value::as_u64)
                .and_then(|v| u32::try_from(v).ok())
                .ok_or(ReencryptMetaError::Serialize("area sector_size"))?;
            out.extend_from_slice(&bs.to_be_bytes());
            Ok(())
        };
        let shift = |out: &mut Vec<u8>| -> Result<(), ReencryptMetaError> {
            let v = area_str("shift_size")
                .parse::<u64>()
                .map_err(|_| ReencryptMetaError::Serialize("shift_size"))?;
            out.extend_from_slice(&v.to_be_bytes());
            Ok(())
        };
        match ks.area.type_name.as_str() {
            "checksum" => checksum(&mut out)?,
            "datashift-checksum" => {
                checksum(&mut out)?;
                shift(&mut out)?;
            }
            "datashift" | "datashift-journal" => shift(&mut out)?,
            _ => {}
        }
        for id in [Some(self.previous), Some(self.final_), self.moved].into_iter().flatten() {
            serialize_segment(&m.segments[&id], &mut out)?;
        }
        Ok(out)
    }
}

fn serialize_segment(s: &Segment, out: &mut Vec<u8>) -> Result<(), ReencryptMetaError> {
    if s.type_name.is_empty() || s.type_name.len() > MAX_STR {
        return Err(ReencryptMetaError::Serialize("segment type"));
    }
    out.extend_from_slice(s.type_name.as_bytes());
    out.extend_from_slice(&s.offset.to_be_bytes());
    match s.size {
        SegmentSize::Dynamic => out.extend_from_slice(b"dynamic"),
        SegmentSize::Bytes(b) => out.extend_from_slice(&b.to_be_bytes()),
    }
    match (s.type_name.as_str(), &s.crypt) {
        ("crypt", Some(c)) => {
            out.extend_from_slice(&c.iv_tweak.to_be_bytes());
            if c.encryption.len() > MAX_STR {
                return Err(ReencryptMetaError::Serialize("segment encryption"));
            }
            out.extend_from_slice(c.encryption.as_bytes());
            out.extend_from_slice(&c.sector_size.to_be_bytes());
            Ok(())
        }
        ("linear", _) => Ok(()),
        _ => Err(ReencryptMetaError::Serialize("segment type")),
    }
}

/// A `crypt` segment at `offset` (cryptsetup `json_segment_create_crypt`): `iv_tweak` in
/// 512-byte sectors, `in-reencryption` flag when `hot`.
pub fn crypt_segment(
    offset: u64,
    iv_tweak: u64,
    size: Option<u64>,
    encryption: &str,
    sector_size: u32,
    hot: bool,
) -> Segment {
    Segment {
        type_name: "crypt".into(),
        offset,
        size: size.map_or(SegmentSize::Dynamic, SegmentSize::Bytes),
        crypt: Some(CryptParams { iv_tweak, encryption: encryption.into(), sector_size, integrity: None }),
        opal: None,
        flags: hot.then(|| vec![FLAG_IN_REENCRYPTION.to_owned()]),
        extra: Map::new(),
    }
}

/// A `linear` segment (cryptsetup `json_segment_create_linear`).
pub fn linear_segment(offset: u64, size: Option<u64>, hot: bool) -> Segment {
    Segment {
        type_name: "linear".into(),
        offset,
        size: size.map_or(SegmentSize::Dynamic, SegmentSize::Bytes),
        crypt: None,
        opal: None,
        flags: hot.then(|| vec![FLAG_IN_REENCRYPTION.to_owned()]),
        extra: Map::new(),
    }
}

/// A copy of `s` carrying only `flag` (a backup segment).
pub fn backup_of(s: &Segment, flag: &str) -> Segment {
    let mut b = s.clone();
    b.flags = Some(vec![flag.to_owned()]);
    b
}

/// Which part of a forward layout a regular segment is.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Part {
    /// Already rewritten (new key).
    New,
    /// The hotzone (both keys).
    Hot,
    /// Not reached yet (old key).
    Old,
}

/// The regular segments of a forward run without data shift (cryptsetup
/// `reencrypt_make_hot_segments_forward` / `reencrypt_make_post_segments_forward`):
/// `done` bytes rewritten, then (if `hot_len` is set) a hotzone of that length, then the
/// old data up to `device_size` (relative to `data_offset`). Sizes are fixed except the
/// last segment's, which is dynamic unless `fixed` (a `--device-size` run).
pub fn forward_layout(
    st: &ReencryptState,
    m: &Luks2Metadata,
    done: u64,
    hot_len: Option<u64>,
    device_size: u64,
    fixed: bool,
) -> Result<Vec<(Part, Segment)>, ReencryptMetaError> {
    let fin = &m.segments[&st.final_];
    let prev = &m.segments[&st.previous];
    let data_offset = fin.offset;
    let new_seg = |off: u64, size: Option<u64>, hot: bool| match (st.keyslot.mode, &fin.crypt) {
        (ReencryptMode::Decrypt, _) => Ok(linear_segment(data_offset + off, size, hot)),
        (_, Some(c)) => {
            Ok(crypt_segment(data_offset + off, off >> 9, size, &c.encryption, c.sector_size, hot))
        }
        (_, None) => Err(ReencryptMetaError::Layout("backup-final is not a crypt segment")),
    };
    let old_seg = |off: u64, size: Option<u64>| match (st.keyslot.mode, &prev.crypt) {
        (ReencryptMode::Encrypt, _) => Ok(linear_segment(data_offset + off, size, false)),
        (_, Some(c)) => {
            Ok(crypt_segment(data_offset + off, off >> 9, size, &c.encryption, c.sector_size, false))
        }
        (_, None) => Err(ReencryptMetaError::Layout("backup-previous is not a crypt segment")),
    };
    let mut out = Vec::new();
    let end = done + hot_len.unwrap_or(0);
    let tail = (end < device_size).then(|| if fixed { Some(device_size - end) } else { None });
    match hot_len {
        Some(len) => {
            if done > 0 {
                out.push((Part::New, new_seg(0, Some(done), false)?));
            }
            out.push((Part::Hot, new_seg(done, Some(len), true)?));
        }
        None => {
            if end > 0 {
                out.push((Part::New, new_seg(0, tail.is_some().then_some(end), false)?));
            }
        }
    }
    if let Some(size) = tail {
        out.push((Part::Old, old_seg(end, size)?));
    }
    Ok(out)
}

/// The regular segments of a backward run without data shift (cryptsetup
/// `reencrypt_make_hot_segments_backward` / `reencrypt_make_post_segments_backward`). The
/// run goes from the end down: `[0, boundary)` is still old and `[boundary, device_size)`
/// already new. With `hot_len` the hotzone is `[boundary - hot_len, boundary)`; without, it
/// is the layout once the hotzone below `boundary` is written. The new tail is dynamic
/// unless `fixed` (and the data starts at 0 then: an all-new layout is dynamic again).
pub fn backward_layout(
    st: &ReencryptState,
    m: &Luks2Metadata,
    boundary: u64,
    hot_len: Option<u64>,
    device_size: u64,
    fixed: bool,
) -> Result<Vec<(Part, Segment)>, ReencryptMetaError> {
    let (new_seg, old_seg) = layout_makers(st, m)?;
    let mut out = Vec::new();
    match hot_len {
        Some(len) => {
            let off = boundary
                .checked_sub(len)
                .ok_or(ReencryptMetaError::Layout("hotzone longer than the old data"))?;
            if off > 0 {
                out.push((Part::Old, old_seg(0, Some(off))?));
            }
            out.push((Part::Hot, new_seg(off, Some(len), true)?));
            if boundary < device_size {
                out.push((Part::New, new_seg(boundary, fixed.then(|| device_size - boundary), false)?));
            }
        }
        None => {
            if boundary > 0 {
                out.push((Part::Old, old_seg(0, Some(boundary))?));
            }
            let size = (fixed && boundary > 0).then(|| device_size - boundary);
            out.push((Part::New, new_seg(boundary, size, false)?));
        }
    }
    Ok(out)
}

type Maker<'a> = Box<dyn Fn(u64, Option<u64>, bool) -> Result<Segment, ReencryptMetaError> + 'a>;
type OldMaker<'a> = Box<dyn Fn(u64, Option<u64>) -> Result<Segment, ReencryptMetaError> + 'a>;

/// Segment makers of the new and old layouts (cryptsetup `reencrypt_make_segment_new`,
/// `_reencrypt` and `_old`): offsets relative to the data offset, `iv_tweak` the offset in
/// 512-byte sectors; linear for plaintext (old when encrypting, new when decrypting).
fn layout_makers<'a>(
    st: &'a ReencryptState,
    m: &'a Luks2Metadata,
) -> Result<(Maker<'a>, OldMaker<'a>), ReencryptMetaError> {
    let fin = st.backup_final(m)?;
    let prev = st.backup_previous(m)?;
    let data_offset = fin.offset;
    let mode = st.keyslot.mode;
    let new_seg = move |off: u64, size: Option<u64>, hot: bool| match (mode, &fin.crypt) {
        (ReencryptMode::Decrypt, _) => Ok(linear_segment(data_offset + off, size, hot)),
        (_, Some(c)) => {
            Ok(crypt_segment(data_offset + off, off >> 9, size, &c.encryption, c.sector_size, hot))
        }
        (_, None) => Err(ReencryptMetaError::Layout("backup-final is not a crypt segment")),
    };
    let old_seg = move |off: u64, size: Option<u64>| match (mode, &prev.crypt) {
        (ReencryptMode::Encrypt, _) => Ok(linear_segment(data_offset + off, size, false)),
        (_, Some(c)) => {
            Ok(crypt_segment(data_offset + off, off >> 9, size, &c.encryption, c.sector_size, false))
        }
        (_, None) => Err(ReencryptMetaError::Layout("backup-previous is not a crypt segment")),
    };
    Ok((Box::new(new_seg), Box::new(old_seg)))
}

/// `true` when the regular segments are exactly the final layout: one segment, of the new
/// kind (linear after a decryption, crypt bound to the new digest otherwise, and not to the
/// old one). A run that wrote every hotzone but stopped before finishing is in this state;
/// it must finish, not start over (starting over would decrypt plaintext or encrypt
/// ciphertext twice).
pub fn all_done(st: &ReencryptState, m: &Luks2Metadata) -> bool {
    if st.hot.is_some() {
        return false;
    }
    let regular = ReencryptState::regular_segments(m);
    let [(id, seg)] = regular.as_slice() else { return false };
    let fin = &m.segments[&st.final_];
    if seg.type_name != fin.type_name {
        return false;
    }
    match st.keyslot.mode {
        ReencryptMode::Decrypt => seg.type_name == "linear",
        ReencryptMode::Encrypt => seg.type_name == "crypt" && m.segment_digest(*id) == st.digest_new,
        ReencryptMode::Reencrypt => {
            st.digest_old != st.digest_new
                && m.segment_digest(*id) == st.digest_new
                && !st.digest_old.and_then(|d| m.digests.get(&d)).is_some_and(|d| d.segments.contains(id))
        }
    }
}

/// Where the boundary of a backward run is (cryptsetup `_offset_backward`): the size of the
/// old part, i.e. `device_size` with one (old) regular segment, the first segment's size
/// with two, or the hotzone's end when a hotzone was being rewritten.
pub fn backward_boundary(
    st: &ReencryptState,
    m: &Luks2Metadata,
    device_size: u64,
) -> Result<u64, ReencryptMetaError> {
    let data_offset = st.data_offset_new(m);
    if let Some(h) = st.hot {
        let s = &m.segments[&h];
        let len = s.fixed_size().ok_or(ReencryptMetaError::Layout("dynamic hotzone"))?;
        return s
            .offset
            .checked_sub(data_offset)
            .map(|o| o + len)
            .ok_or(ReencryptMetaError::Layout("hotzone before the data offset"));
    }
    let regular = ReencryptState::regular_segments(m);
    match regular.len() {
        1 => Ok(device_size),
        2 => regular[0].1.fixed_size().ok_or(ReencryptMetaError::Layout("first of two segments is dynamic")),
        _ => Err(ReencryptMetaError::Layout("more than two segments outside a hotzone")),
    }
}

/// Replaces the regular segments of `m` with `layout` and reattaches the backup segments
/// and digests as cryptsetup's `reencrypt_assign_segments` does: every digest loses its
/// segments; new parts go to the new digest, old parts to the old one, the hotzone to
/// both; then backup-previous (old digest) and backup-final (new digest) follow, and
/// backup-moved-segment (old digest) after them. Updates `st`'s segment ids.
pub fn assign_segments(
    st: &mut ReencryptState,
    m: &mut Luks2Metadata,
    layout: Vec<(Part, Segment)>,
) -> Result<(), ReencryptMetaError> {
    let prev = m.segments[&st.previous].clone();
    let fin = m.segments[&st.final_].clone();
    let moved = st.moved.map(|i| m.segments[&i].clone());
    for d in m.digests.values_mut() {
        d.segments.clear();
    }
    let mut segs = BTreeMap::new();
    let assign = |m: &mut Luks2Metadata, seg: u32, digest: Option<u32>| {
        if let Some(d) = digest.and_then(|d| m.digests.get_mut(&d)) {
            if !d.segments.contains(&seg) {
                d.segments.push(seg);
                d.segments.sort_unstable();
            }
        }
    };
    let mut hot = None;
    let mut id = 0u32;
    for (part, seg) in layout {
        let crypt = seg.type_name == "crypt";
        if crypt {
            match part {
                Part::New => assign(m, id, st.digest_new),
                Part::Old => assign(m, id, st.digest_old),
                Part::Hot => {
                    assign(m, id, st.digest_new);
                    assign(m, id, st.digest_old);
                }
            }
        }
        if part == Part::Hot {
            hot = Some(id);
        }
        segs.insert(id, seg);
        id += 1;
    }
    st.previous = id;
    if prev.type_name == "crypt" {
        assign(m, id, st.digest_old);
    }
    segs.insert(id, prev);
    id += 1;
    st.final_ = id;
    if fin.type_name == "crypt" {
        assign(m, id, st.digest_new);
    }
    segs.insert(id, fin);
    if let Some(mv) = moved {
        id += 1;
        st.moved = Some(id);
        if mv.type_name == "crypt" {
            assign(m, id, st.digest_old);
        }
        segs.insert(id, mv);
    }
    st.hot = hot;
    m.segments = segs;
    Ok(())
}

/// Sets (`Some(version)`) or clears the online reencryption requirement, keeping other
/// mandatory requirements (cryptsetup `reencrypt_update_flag`). An emptied `requirements`
/// object is dropped.
pub fn set_requirement(m: &mut Luks2Metadata, version: Option<u8>) {
    let reqs = m
        .config
        .requirements
        .get_or_insert_with(|| super::Requirements { mandatory: None, extra: Map::new() });
    let list = reqs.mandatory.get_or_insert_with(Vec::new);
    list.retain(|r| !super::config::is_reencrypt_candidate(r));
    if let Some(v) = version {
        list.push(format!("online-reencrypt-v{v}"));
    }
    if list.is_empty() {
        reqs.mandatory = None;
    }
    if reqs.mandatory.is_none() && reqs.extra.is_empty() {
        m.config.requirements = None;
    }
}

/// Where the data of an encryption with data shift (cryptsetup `reencrypt --encrypt
/// --reduce-device-size`, no detached header) lives. Positions `L` are in the plaintext's
/// own coordinates, `[0, data_size)`: the old copy of `L` is at `old_offset + L`, except for
/// `L < moved_size`, whose copy was moved to `moved_offset + L` before the header took its
/// place; the new (encrypted) copy goes to `new_offset + L` (`iv_tweak` `L / 512`).
///
/// ```text
///  device  [header (shift) | old L≥moved ... | gap (shift) | moved first segment (shift)]
///  after   [header (shift) | new, whole data (dynamic)                                 ]
///  hotzones go backward from data_size in shift-long steps, the one that reaches
///  moved_size stops there; the last hotzone is [0, moved_size), read from the moved copy
/// ```
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct ShiftGeometry {
    /// `shift_size`, also the new data offset.
    pub shift: u64,
    /// Bytes of plaintext (the size of backup-previous).
    pub data_size: u64,
    /// backup-previous's offset (0).
    pub old_offset: u64,
    /// backup-final's offset.
    pub new_offset: u64,
    /// The moved first segment's offset.
    pub moved_offset: u64,
    /// The moved first segment's size (the shift, or the whole data when smaller).
    pub moved_size: u64,
}

impl ShiftGeometry {
    /// The geometry of a data-shift encryption, from its backup segments.
    pub fn of(st: &ReencryptState, m: &Luks2Metadata) -> Result<Self, ReencryptMetaError> {
        let shift = st.keyslot.resilience.shift();
        let lay = ReencryptMetaError::Layout;
        if st.keyslot.mode != ReencryptMode::Encrypt
            || st.keyslot.direction != Direction::Backward
            || shift == 0
        {
            return Err(lay("not an encryption with data shift"));
        }
        let prev = st.backup_previous(m)?;
        let fin = st.backup_final(m)?;
        let moved = st.backup_moved(m)?;
        let data_size = prev.fixed_size().ok_or(lay("backup-previous of a data shift is dynamic"))?;
        let moved_size = moved.fixed_size().ok_or(lay("moved segment is dynamic"))?;
        if prev.type_name != "linear" || moved.type_name != "linear" || fin.type_name != "crypt" {
            return Err(lay("data shift segments of the wrong type"));
        }
        if fin.offset != shift || moved_size == 0 || moved_size > shift || moved_size > data_size {
            return Err(lay("data shift segments do not match the shift"));
        }
        if fin.crypt.as_ref().is_none_or(|c| c.iv_tweak != 0) {
            return Err(lay("backup-final has an IV tweak"));
        }
        Ok(Self {
            shift,
            data_size,
            old_offset: prev.offset,
            new_offset: fin.offset,
            moved_offset: moved.offset,
            moved_size,
        })
    }

    /// The hotzone below `boundary` (everything at and above it is new): `(start, len)`.
    pub fn next_hotzone(&self, boundary: u64) -> Option<(u64, u64)> {
        if boundary == 0 {
            None
        } else if boundary <= self.moved_size {
            Some((0, boundary))
        } else {
            let start = boundary.saturating_sub(self.shift).max(self.moved_size);
            Some((start, boundary - start))
        }
    }

    /// Where the old copy of `[start, start + len)` is on the device (a hotzone never
    /// straddles `moved_size`).
    pub fn source(&self, start: u64) -> u64 {
        if start < self.moved_size {
            self.moved_offset + start
        } else {
            self.old_offset + start
        }
    }

    /// The regular segments with everything from `boundary` up new and, with `hot_len`, the
    /// hotzone `[boundary - hot_len, boundary)` in reencryption (cryptsetup's
    /// `reencrypt_make_hot_segments_encrypt_shift` / `_post_segments_`): the moved first
    /// segment and the old part still in place (linear, no digest), the hotzone and the
    /// new part (crypt, fixed sizes); once all is new, one dynamic crypt segment.
    pub fn layout(
        &self,
        m: &Luks2Metadata,
        st: &ReencryptState,
        boundary: u64,
        hot_len: Option<u64>,
    ) -> Result<Vec<(Part, Segment)>, ReencryptMetaError> {
        let fin = st.backup_final(m)?;
        let c =
            fin.crypt.as_ref().ok_or(ReencryptMetaError::Layout("backup-final is not a crypt segment"))?;
        let new_seg = |l: u64, size: Option<u64>, hot: bool| {
            crypt_segment(self.new_offset + l, l >> 9, size, &c.encryption, c.sector_size, hot)
        };
        if boundary > self.data_size || hot_len.is_some_and(|h| h == 0 || h > boundary) {
            return Err(ReencryptMetaError::Layout("data shift boundary outside the data"));
        }
        let low = boundary - hot_len.unwrap_or(0);
        if low == 0 && hot_len.is_none() {
            return Ok(vec![(Part::New, new_seg(0, None, false))]);
        }
        let mut out = Vec::new();
        if low > 0 {
            out.push((Part::Old, linear_segment(self.moved_offset, Some(low.min(self.moved_size)), false)));
        }
        if low > self.moved_size {
            out.push((
                Part::Old,
                linear_segment(self.old_offset + self.moved_size, Some(low - self.moved_size), false),
            ));
        }
        if let Some(h) = hot_len {
            out.push((Part::Hot, new_seg(low, Some(h), true)));
        }
        if boundary < self.data_size {
            out.push((Part::New, new_seg(boundary, Some(self.data_size - boundary), false)));
        }
        Ok(out)
    }

    /// The boundary the metadata records: the start of the lowest crypt segment (of the
    /// hotzone's end when one is in reencryption), `data_size` when none is new yet.
    pub fn boundary(&self, m: &Luks2Metadata, st: &ReencryptState) -> Result<u64, ReencryptMetaError> {
        let rel = |s: &Segment| {
            s.offset
                .checked_sub(self.new_offset)
                .filter(|l| *l <= self.data_size)
                .ok_or(ReencryptMetaError::Layout("crypt segment outside the shifted data"))
        };
        if let Some(h) = st.hot {
            let s = &m.segments[&h];
            let len = s.fixed_size().ok_or(ReencryptMetaError::Layout("dynamic hotzone"))?;
            let end = rel(s)?.checked_add(len).filter(|e| *e <= self.data_size);
            return end.ok_or(ReencryptMetaError::Layout("hotzone outside the shifted data"));
        }
        let regular = ReencryptState::regular_segments(m);
        match regular.iter().find(|(_, s)| s.type_name == "crypt") {
            Some((_, s)) => rel(s),
            None => Ok(self.data_size),
        }
    }
}

/// Where the data of a decryption with data shift (cryptsetup 2.6 `reencrypt --decrypt
/// --header NEW` of a volume whose header is on the device) lives. Positions `L` are in the
/// data's own coordinates, `[0, data_size)` with `data_size` the device size less the
/// shift: the ciphertext of `L` is at `shift + L` (backup-previous, `crypt @shift`),
/// except for `L < moved_size`, whose ciphertext init copied to `L` (backup-moved-segment,
/// `crypt @0`); the plaintext of `L` goes to `L` (backup-final, `linear @0`).
///
/// ```text
///  device  [moved first segment (ct) | old ct of L >= moved ... (shift bytes up)       ]
///  after   [plaintext, whole data (dynamic)                           | wiped (shift) ]
///  hotzones go forward from moved_size in shift-long steps, reading shift bytes up
///  (never their own destination); the last is [0, moved_size), decrypted in place with
///  the checksums of its blocks in the reencrypt keyslot's area
/// ```
///
/// The run's progress `p` counts bytes done in hotzone order: `p <= data_size -
/// moved_size` in the forward part, `data_size` once the last hotzone is written.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct DecryptShiftGeometry {
    /// `shift_size`: the old data offset.
    pub shift: u64,
    /// Bytes of data (the device size less the shift).
    pub data_size: u64,
    /// The moved first segment's size (at most the shift and the data; cryptsetup's
    /// `--hotzone-size` at the start).
    pub moved_size: u64,
}

impl DecryptShiftGeometry {
    /// The geometry of a data-shift decryption on a device of `device_size` bytes, from its
    /// backup segments (checked to be cryptsetup's).
    pub fn of(st: &ReencryptState, m: &Luks2Metadata, device_size: u64) -> Result<Self, ReencryptMetaError> {
        let lay = ReencryptMetaError::Layout;
        let shift = st.keyslot.resilience.shift();
        if st.keyslot.mode != ReencryptMode::Decrypt
            || st.keyslot.direction != Direction::Forward
            || !matches!(st.keyslot.resilience, Resilience::DatashiftChecksum { .. })
            || shift == 0
        {
            return Err(lay("not a decryption with data shift"));
        }
        let prev = st.backup_previous(m)?;
        let fin = st.backup_final(m)?;
        let moved = st.backup_moved(m)?;
        let (Some(pc), Some(mc)) = (&prev.crypt, &moved.crypt) else {
            return Err(lay("data shift decryption segments of the wrong type"));
        };
        if prev.type_name != "crypt" || moved.type_name != "crypt" || fin.type_name != "linear" {
            return Err(lay("data shift decryption segments of the wrong type"));
        }
        let moved_size = moved.fixed_size().ok_or(lay("moved segment is dynamic"))?;
        if prev.offset != shift
            || prev.fixed_size().is_some()
            || fin.offset != 0
            || fin.fixed_size().is_some()
            || moved.offset != 0
            || pc.iv_tweak != 0
            || mc.iv_tweak != 0
            || pc.encryption != mc.encryption
            || pc.sector_size != mc.sector_size
            || mc.integrity.is_some()
            || pc.integrity.is_some()
        {
            return Err(lay("data shift decryption segments do not match the shift"));
        }
        let data_size = device_size
            .checked_sub(shift)
            .filter(|n| *n > 0)
            .ok_or(lay("device too small for its data shift"))?;
        if moved_size == 0 || moved_size > shift.min(data_size) {
            return Err(lay("moved segment longer than the shift (or the data)"));
        }
        Ok(Self { shift, data_size, moved_size })
    }

    /// Bytes done once every hotzone is written.
    pub fn total(&self) -> u64 {
        self.data_size
    }

    /// The hotzone at progress `p`: `(start, len)` in data coordinates.
    pub fn next_hotzone(&self, p: u64) -> Option<(u64, u64)> {
        let fwd = self.data_size - self.moved_size;
        if p < fwd {
            Some((self.moved_size + p, self.shift.min(fwd - p)))
        } else if p == fwd {
            Some((0, self.moved_size))
        } else {
            None
        }
    }

    /// Where the ciphertext of the hotzone starting at `start` is on the device.
    pub fn source(&self, start: u64) -> u64 {
        if start < self.moved_size {
            start
        } else {
            self.shift + start
        }
    }

    /// The regular segments at progress `p`, with the hotzone at `p` in reencryption when
    /// `hot` (cryptsetup 2.6.1's states, traced): the moved first segment (crypt @0), the
    /// plaintext done (linear, dynamic once the forward part is all done), the hotzone
    /// (linear, fixed), the ciphertext not reached (crypt `shift` bytes up, dynamic); for
    /// the last hotzone `linear @0` (hot) and the rest; at the end one `linear @0` dynamic.
    pub fn layout(
        &self,
        m: &Luks2Metadata,
        st: &ReencryptState,
        p: u64,
        hot: bool,
    ) -> Result<Vec<(Part, Segment)>, ReencryptMetaError> {
        let prev = st.backup_previous(m)?;
        let c = prev.crypt.as_ref().ok_or(ReencryptMetaError::Layout("backup-previous is not crypt"))?;
        let fwd = self.data_size - self.moved_size;
        if p > self.data_size || (p > fwd && p < self.data_size) || (hot && p == self.data_size) {
            return Err(ReencryptMetaError::Layout("data shift decryption progress outside the data"));
        }
        let m_ = self.moved_size;
        let mut out = Vec::new();
        if p == self.data_size {
            out.push((Part::New, linear_segment(0, None, false)));
        } else if p == fwd && hot {
            out.push((Part::Hot, linear_segment(0, Some(m_), true)));
            if m_ < self.data_size {
                out.push((Part::New, linear_segment(m_, None, false)));
            }
        } else {
            out.push((Part::Old, crypt_segment(0, 0, Some(m_), &c.encryption, c.sector_size, false)));
            let h = if hot { self.shift.min(fwd - p) } else { 0 };
            if p > 0 {
                let size = (p < fwd || hot).then_some(p);
                out.push((Part::New, linear_segment(m_, size, false)));
            }
            if hot {
                out.push((Part::Hot, linear_segment(m_ + p, Some(h), true)));
            }
            let e = m_ + p + h;
            if e < self.data_size {
                out.push((
                    Part::Old,
                    crypt_segment(self.shift + e, e >> 9, None, &c.encryption, c.sector_size, false),
                ));
            }
        }
        Ok(out)
    }

    /// The progress the metadata records (a hotzone in reencryption: its own progress,
    /// i.e. not done yet).
    pub fn progress(&self, m: &Luks2Metadata, st: &ReencryptState) -> Result<u64, ReencryptMetaError> {
        let lay = ReencryptMetaError::Layout;
        let fwd = self.data_size - self.moved_size;
        if let Some(h) = st.hot {
            let s = &m.segments[&h];
            let len = s.fixed_size().ok_or(lay("dynamic hotzone"))?;
            if s.offset == 0 {
                return if len == self.moved_size {
                    Ok(fwd)
                } else {
                    Err(lay("last hotzone of the wrong size"))
                };
            }
            let p = s.offset.checked_sub(self.moved_size).ok_or(lay("hotzone inside the moved segment"))?;
            return match self.next_hotzone(p) {
                Some((start, l)) if p < fwd && start == s.offset && l == len => Ok(p),
                _ => Err(lay("hotzone outside the data shift decryption's steps")),
            };
        }
        let regular = ReencryptState::regular_segments(m);
        let Some((_, first)) = regular.first() else { return Err(lay("no regular segment")) };
        if first.type_name == "linear" && first.offset == 0 {
            return if regular.len() == 1 && first.fixed_size().is_none() {
                Ok(self.data_size)
            } else {
                Err(lay("unexpected data shift decryption layout"))
            };
        }
        if first.type_name != "crypt" || first.offset != 0 || first.fixed_size() != Some(self.moved_size) {
            return Err(lay("unexpected data shift decryption layout"));
        }
        match regular.iter().find(|(_, s)| s.type_name == "linear") {
            None => Ok(0),
            Some((_, s)) if s.offset != self.moved_size => Err(lay("plaintext segment out of place")),
            Some((_, s)) => match s.fixed_size() {
                None => Ok(fwd),
                Some(p) if p < fwd => Ok(p),
                Some(_) => Err(lay("plaintext segment longer than the data")),
            },
        }
    }
}

/// `true` for an encryption with data shift and a detached header (cryptsetup 2.6.1
/// `reencrypt --encrypt --header FILE --reduce-device-size R`): mode encrypt, backward,
/// resilience `datashift` (`shift_size` R), no moved segment. The data is encrypted in
/// place, at its offset (`--offset`, 0 by default): backup-previous is `linear @off`
/// (fixed, the data's size), backup-final `crypt @off dynamic`; `R` is only the length of
/// cryptsetup's hotzones (its `datashift` protection keeps no copy of them: see
/// [`HotzoneRecord`]).
pub fn is_detached_shift_encryption(st: &ReencryptState) -> bool {
    st.keyslot.mode == ReencryptMode::Encrypt
        && st.keyslot.direction == Direction::Backward
        && matches!(st.keyslot.resilience, Resilience::Datashift { .. })
        && st.moved.is_none()
}

/// The next hotzone `(start, len)` below `boundary` of an encryption with data shift and a
/// detached header whose hotzones are `len` long (`data_size` bytes of data), as
/// cryptsetup 2.6.1 steps through it (`reencrypt_context_update`): the first is the top
/// `len` bytes; then, going down, `[b - len, b)`, except that a boundary between `len` and
/// `2 len` is followed by `[len, b)` so that the last hotzone is `[0, len)`.
pub fn detached_shift_hotzone(boundary: u64, data_size: u64, len: u64) -> Option<(u64, u64)> {
    if boundary == 0 || len == 0 {
        None
    } else if boundary <= len {
        Some((0, boundary))
    } else if boundary < 2 * len && boundary != data_size {
        Some((len, boundary - len))
    } else {
        Some((boundary - len, len))
    }
}

/// Magic of a [`HotzoneRecord`].
pub const HOTZONE_RECORD_MAGIC: &[u8; 16] = b"sealdisk-hzsums\0";
/// Bytes of a [`HotzoneRecord`] (its checksums follow it).
pub const HOTZONE_RECORD_SIZE: u64 = 4096;
/// Bytes of one checksum (SHA-256) in a [`HotzoneRecord`].
pub const HOTZONE_SUM_LEN: u64 = 32;

/// sealdisk's own protection of a hotzone that cryptsetup's metadata leaves unprotected
/// (the in-place `datashift` hotzones of [`is_detached_shift_encryption`]: cryptsetup 2.6.1
/// recovers such a hotzone by copying `shift_size` bytes below it over it, which destroys
/// it). Before the header flags a hotzone in reencryption, the SHA-256 of each of its
/// blocks (old content) is written to unused space of the keyslots area with this record
/// in front; a recovery rewrites exactly the blocks that still hash to their checksum.
/// The record names the volume (UUID) and the hotzone, and a SHA-256 over the record and
/// the checksums makes a stale or overwritten one be refused, never trusted.
///
/// ```text
///  0  magic "sealdisk-hzsums\0"    16  hotzone start (u64 BE, from the data offset)
///  24 hotzone length (u64 BE)      32  block size (u32 BE)      36 UUID (40 bytes, NUL-padded)
///  76 SHA-256 over bytes 0..76 and the checksums                108 zeroes to 4096
///  4096.. one SHA-256 per block (the last block may be short)
/// ```
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct HotzoneRecord {
    /// Hotzone start, relative to the data offset.
    pub start: u64,
    /// Hotzone length.
    pub len: u64,
    /// Bytes per checksum.
    pub block_size: u32,
    /// The volume's UUID.
    pub uuid: String,
}

impl HotzoneRecord {
    /// Bytes of checksums after the record.
    pub fn sums_len(&self) -> u64 {
        self.len.div_ceil(u64::from(self.block_size.max(1))) * HOTZONE_SUM_LEN
    }

    fn head(&self) -> Option<[u8; 76]> {
        if self.uuid.len() > 40 || self.block_size == 0 {
            return None;
        }
        let mut h = [0u8; 76];
        h[..16].copy_from_slice(HOTZONE_RECORD_MAGIC);
        h[16..24].copy_from_slice(&self.start.to_be_bytes());
        h[24..32].copy_from_slice(&self.len.to_be_bytes());
        h[32..36].copy_from_slice(&self.block_size.to_be_bytes());
        h[36..36 + self.uuid.len()].copy_from_slice(self.uuid.as_bytes());
        Some(h)
    }

    fn seal(head: &[u8], sums: &[u8]) -> [u8; 32] {
        use sha2::Digest as _;
        let mut d = sha2::Sha256::new();
        d.update(head);
        d.update(sums);
        d.finalize().into()
    }

    /// The record block (4096 bytes) for `sums` (which must be [`Self::sums_len`] long);
    /// `None` for a UUID over 40 bytes or a sums length that does not match.
    pub fn encode(&self, sums: &[u8]) -> Option<Vec<u8>> {
        let head = self.head()?;
        if sums.len() as u64 != self.sums_len() {
            return None;
        }
        let mut out = vec![0u8; HOTZONE_RECORD_SIZE as usize];
        out[..76].copy_from_slice(&head);
        out[76..108].copy_from_slice(&Self::seal(&head, sums));
        Some(out)
    }

    /// `true` when `block` is this record, sealed over `sums`.
    pub fn matches(&self, block: &[u8], sums: &[u8]) -> bool {
        let Some(head) = self.head() else { return false };
        block.len() >= 108
            && sums.len() as u64 == self.sums_len()
            && block[..76] == head
            && block[76..108] == Self::seal(&head, sums)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn detached_shift_hotzones_are_cryptsetups() {
        // 30 MiB of data, 8 MiB shift (traced: 22M+8M, 14M+8M, 8M+6M, 0+8M).
        let m = 1 << 20;
        let mut b = 30 * m;
        let mut seen = Vec::new();
        while let Some((s, l)) = detached_shift_hotzone(b, 30 * m, 8 * m) {
            seen.push((s / m, l / m));
            b = s;
        }
        assert_eq!(seen, [(22, 8), (14, 8), (8, 6), (0, 8)]);
        // Data between one and two shifts: the top shift, then the rest.
        assert_eq!(detached_shift_hotzone(12 * m, 12 * m, 8 * m), Some((4 * m, 8 * m)));
        assert_eq!(detached_shift_hotzone(4 * m, 12 * m, 8 * m), Some((0, 4 * m)));
        assert_eq!(detached_shift_hotzone(6 * m, 6 * m, 8 * m), Some((0, 6 * m)));
        assert_eq!(detached_shift_hotzone(0, 6 * m, 8 * m), None);
    }

    #[test]
    fn hotzone_record_refuses_what_it_does_not_seal() {
        let r = HotzoneRecord { start: 8192, len: 10000, block_size: 4096, uuid: "u-1".into() };
        let sums = vec![7u8; r.sums_len() as usize];
        assert_eq!(sums.len(), 3 * 32);
        let block = r.encode(&sums).unwrap();
        assert!(r.matches(&block, &sums));
        let mut bad = sums.clone();
        bad[5] ^= 1;
        assert!(!r.matches(&block, &bad));
        let other = HotzoneRecord { start: 0, ..r.clone() };
        assert!(!other.matches(&block, &sums));
        let other = HotzoneRecord { uuid: "u-2".into(), ..r.clone() };
        assert!(!other.matches(&block, &sums));
        assert!(r.encode(&sums[1..]).is_none());
        assert!(!r.matches(&[0u8; 4096], &sums));
    }

    #[test]
    fn resilience_area_fields_round_trip() {
        for r in [
            Resilience::None,
            Resilience::Journal,
            Resilience::Checksum { hash: "sha256".into(), block_size: 4096 },
            Resilience::Datashift { shift: 1 << 20 },
        ] {
            let k = ReencryptKeyslot {
                id: 3,
                mode: ReencryptMode::Reencrypt,
                direction: Direction::Forward,
                resilience: r.clone(),
                area_offset: 32768,
                area_size: 4096,
            };
            let back = ReencryptKeyslot::decode(3, &k.to_keyslot()).unwrap();
            assert_eq!(back, k);
        }
    }

    #[test]
    fn bad_reencrypt_keyslot_is_refused() {
        let k = ReencryptKeyslot {
            id: 1,
            mode: ReencryptMode::Reencrypt,
            direction: Direction::Forward,
            resilience: Resilience::Checksum { hash: "sha256".into(), block_size: 4096 },
            area_offset: 32768,
            area_size: 4096,
        };
        let mut ks = k.to_keyslot();
        ks.key_size = 64;
        assert_eq!(ReencryptKeyslot::decode(1, &ks), Err(ReencryptMetaError::BadKeySize(1)));
        let mut ks = k.to_keyslot();
        ks.extra.insert("mode".into(), "sideways".into());
        assert!(matches!(ReencryptKeyslot::decode(1, &ks), Err(ReencryptMetaError::UnknownValue { .. })));
        let mut ks = k.to_keyslot();
        ks.area.extra.insert("sector_size".into(), 1000.into());
        assert!(matches!(ReencryptKeyslot::decode(1, &ks), Err(ReencryptMetaError::BadField { .. })));
    }
}
