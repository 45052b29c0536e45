//! The LUKS2 `config` object: metadata sizes, persistent activation flags, and
//! requirements (cryptsetup `hdr_validate_config`, `hdr_validate_requirements`,
//! `LUKS2_config_get_flags`, `requirements_flags[]` in `luks2_json_metadata.c`).
//!
//! ```text
//! "config": {
//!   "json_size": "12288",                  u64 string: JSON area bytes = hdr_size - 4096
//!   "keyslots_size": "16744448",           u64 string: keyslots area bytes, 4 KiB aligned, <= 128 MiB
//!   "flags": ["allow-discards"],           optional: persistent activation flags (strings)
//!   "requirements": {                      optional
//!     "mandatory": ["online-reencrypt-v2"] optional: features a reader must understand
//!   }
//! }
//! ```

use serde_json::Value;

use super::internal::{self, append_extra, take_obj, take_opt_str_array, take_u64_str, Obj};
use super::json::MetadataError;

/// Persistent flag names cryptsetup knows (`persistent_flags[]`).
pub const KNOWN_FLAGS: &[&str] = &[
    "allow-discards",
    "same-cpu-crypt",
    "submit-from-crypt-cpus",
    "no-journal",
    "no-read-workqueue",
    "no-write-workqueue",
    "high_priority",
];

/// The `config` object.
#[derive(Debug, Clone, PartialEq)]
pub struct Config {
    /// `json_size`: bytes of the JSON area (header size minus the 4096-byte binary header).
    pub json_size: u64,
    /// `keyslots_size`: bytes of the keyslots area that follows both metadata copies.
    pub keyslots_size: u64,
    /// `flags`, if present (persistent activation flags, see [`KNOWN_FLAGS`]).
    pub flags: Option<Vec<String>>,
    /// `requirements`, if present.
    pub requirements: Option<Requirements>,
    /// Unknown fields.
    pub extra: Obj,
}

/// The `requirements` object.
#[derive(Debug, Clone, PartialEq)]
pub struct Requirements {
    /// `mandatory`: features a reader must understand to use the device at all.
    pub mandatory: Option<Vec<String>>,
    /// Other fields (the spec reserves room for optional requirement lists).
    pub extra: Obj,
}

/// A `requirements.mandatory` entry, interpreted.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Requirement {
    /// `offline-reencrypt`: legacy offline reencryption in progress.
    OfflineReencrypt,
    /// `online-reencrypt` (v1), `online-reencrypt-v2`, `online-reencrypt-v3`.
    OnlineReencrypt {
        /// Version (1, 2 or 3).
        version: u8,
    },
    /// `inline-hw-tags`: integrity tags stored inline by the hardware.
    InlineHwTags,
    /// `opal` (v1) or `opal-v2`: OPAL self-encrypting drive segments.
    Opal {
        /// Version (1 or 2).
        version: u8,
    },
    /// Anything else. cryptsetup refuses any operation on such a device ("Unmet LUKS2
    /// requirements detected").
    Unknown(String),
}

impl Requirement {
    /// Interpret a mandatory requirement name as cryptsetup 2.8 does.
    pub fn parse(name: &str) -> Self {
        match name {
            "offline-reencrypt" => Self::OfflineReencrypt,
            "online-reencrypt" => Self::OnlineReencrypt { version: 1 },
            "online-reencrypt-v2" => Self::OnlineReencrypt { version: 2 },
            "online-reencrypt-v3" => Self::OnlineReencrypt { version: 3 },
            "inline-hw-tags" => Self::InlineHwTags,
            "opal" => Self::Opal { version: 1 },
            "opal-v2" => Self::Opal { version: 2 },
            other => Self::Unknown(other.to_owned()),
        }
    }
}

/// cryptsetup `reencrypt_candidate_flag`: `online-reencrypt` or `online-reencrypt-v<digits>`.
pub(crate) fn is_reencrypt_candidate(flag: &str) -> bool {
    if flag == "online-reencrypt" {
        return true;
    }
    match flag.strip_prefix("online-reencrypt-v") {
        Some(rest) => !rest.is_empty() && rest.bytes().all(|c| c.is_ascii_digit()),
        None => false,
    }
}

impl Config {
    /// Mandatory requirements, interpreted (empty if there are none).
    pub fn mandatory_requirements(&self) -> Vec<Requirement> {
        self.requirements
            .iter()
            .flat_map(|r| r.mandatory.iter().flatten())
            .map(|s| Requirement::parse(s))
            .collect()
    }

    /// Decode `requirements` (cryptsetup validates it before anything else).
    pub(crate) fn decode_requirements(o: &mut Obj) -> Result<Option<Requirements>, MetadataError> {
        if !o.contains_key("requirements") {
            return Ok(None);
        }
        let mut r = take_obj(o, "config", "requirements")?;
        let mandatory = take_opt_str_array(&mut r, "config requirements", "mandatory")?;
        let online = mandatory.iter().flatten().filter(|m| is_reencrypt_candidate(m)).count();
        if online > 1 {
            return Err(MetadataError::MultipleReencryptRequirements);
        }
        Ok(Some(Requirements { mandatory, extra: r }))
    }

    /// Decode the rest of `config` (sizes and flags); the cross-checks against the header
    /// size and segments are in `json.rs`.
    pub(crate) fn decode(mut o: Obj, requirements: Option<Requirements>) -> Result<Self, MetadataError> {
        let json_size = take_u64_str(&mut o, "config", "json_size")?;
        let keyslots_size = take_u64_str(&mut o, "config", "keyslots_size")?;
        let flags = take_opt_str_array(&mut o, "config", "flags")?;
        Ok(Self { json_size, keyslots_size, flags, requirements, extra: o })
    }

    /// Encode: json_size, keyslots_size, flags, requirements, then unknown fields.
    pub(crate) fn encode(&self) -> Value {
        let mut o = Obj::new();
        o.insert("json_size".into(), internal::u64_str(self.json_size));
        o.insert("keyslots_size".into(), internal::u64_str(self.keyslots_size));
        if let Some(f) = &self.flags {
            o.insert("flags".into(), internal::str_array(f));
        }
        if let Some(r) = &self.requirements {
            let mut ro = Obj::new();
            if let Some(m) = &r.mandatory {
                ro.insert("mandatory".into(), internal::str_array(m));
            }
            append_extra(&mut ro, &r.extra);
            o.insert("requirements".into(), Value::Object(ro));
        }
        append_extra(&mut o, &self.extra);
        Value::Object(o)
    }
}
