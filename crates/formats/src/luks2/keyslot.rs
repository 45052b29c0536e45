//! LUKS2 keyslots (`"keyslots": {"0": {...}}`), cryptsetup `luks2_keyslot.c` and
//! `luks2_keyslot_luks2.c`.
//!
//! ```text
//! "0": {
//!   "type": "luks2",                       every keyslot: non-empty string
//!   "key_size": 64,                        every keyslot: int, 0..=u32::MAX (volume key bytes);
//!                                          luks2 keyslots: at most limits::MAX_KEY_BYTES
//!   "priority": 1,                         optional int: 0 ignore, 1 normal, 2 prefer
//!   "af":   {"type": "luks1", "stripes": 4000, "hash": "sha256"},
//!   "area": {"type": "raw", "offset": "32768", "size": "258048",     offset/size: u64 strings
//!            "encryption": "aes-xts-plain64", "key_size": 64},
//!   "kdf":  {"type": "pbkdf2", "hash": "sha256", "iterations": 1000, "salt": "<base64>"}
//!        or {"type": "argon2id"|"argon2i", "time": 4, "memory": 32, "cpus": 2, "salt": "<base64>"}
//! }
//! ```
//!
//! Every keyslot has `type`, `key_size` and an `area` with `type`, `offset` and `size`
//! (cryptsetup `hdr_validate_keyslots` / `hdr_validate_areas`). `af`, `kdf` and the raw
//! area's `encryption` and `key_size` are required only for `luks2` keyslots
//! (`luks2_keyslot_validate`); other types (`reencrypt`, or unknown ones) are kept with their
//! extra fields as found. A known KDF carries exactly its own parameters: leftovers from
//! another KDF type are dropped on decode, which is cryptsetup's `luks2_keyslot_repair`.

use std::fmt;

use serde_json::Value;

use super::internal::{
    self, append_extra, take_base64, take_i32, take_obj, take_str, take_u32, take_u64_str, Obj,
};
use super::json::MetadataError;

/// Type name of the ordinary passphrase keyslot.
pub const KEYSLOT_LUKS2: &str = "luks2";
/// Type name of the reencryption bookkeeping keyslot.
pub const KEYSLOT_REENCRYPT: &str = "reencrypt";

/// One keyslot.
#[derive(Debug, Clone, PartialEq)]
pub struct Keyslot {
    /// `type`: `luks2`, `reencrypt`, or something this version does not know.
    pub type_name: String,
    /// `key_size`: bytes of the key this keyslot stores.
    pub key_size: u32,
    /// `priority`, if present (0 ignore, 1 normal, 2 prefer).
    pub priority: Option<i32>,
    /// `af`: anti-forensic splitter (present for `luks2` keyslots).
    pub af: Option<Af>,
    /// `area`: where the encrypted key material lives.
    pub area: Area,
    /// `kdf`: passphrase to area key (present for `luks2` keyslots).
    pub kdf: Option<Kdf>,
    /// Unknown fields, kept as found.
    pub extra: Obj,
}

/// `af` object.
#[derive(Debug, Clone, PartialEq)]
pub struct Af {
    /// `type` (only `luks1` is defined).
    pub type_name: String,
    /// `stripes` (4000 in practice).
    pub stripes: u32,
    /// `hash` of the AF diffuser.
    pub hash: String,
    /// Unknown fields.
    pub extra: Obj,
}

/// `area` object.
#[derive(Debug, Clone, PartialEq)]
pub struct Area {
    /// `type` (`raw` for `luks2` keyslots; reencryption uses `none`, `checksum`, `journal`,
    /// `datashift`...).
    pub type_name: String,
    /// `offset` in bytes from the device start.
    pub offset: u64,
    /// `size` in bytes.
    pub size: u64,
    /// `encryption` of a raw area, e.g. `aes-xts-plain64`.
    pub encryption: Option<String>,
    /// `key_size` of a raw area in bytes.
    pub key_size: Option<u32>,
    /// Unknown fields (also the parameters of non-raw areas).
    pub extra: Obj,
}

/// `kdf` object.
#[derive(Clone, PartialEq)]
pub enum Kdf {
    /// `{"type":"pbkdf2","hash","iterations","salt"}`.
    Pbkdf2 {
        /// PRF hash.
        hash: String,
        /// Iteration count.
        iterations: u32,
        /// Salt (base64 on disk).
        salt: Vec<u8>,
    },
    /// `{"type":"argon2i"|"argon2id","time","memory","cpus","salt"}`.
    Argon2 {
        /// `true` for argon2id, `false` for argon2i.
        id: bool,
        /// Time cost (iterations).
        time: u32,
        /// Memory cost in KiB.
        memory: u32,
        /// Parallelism.
        cpus: u32,
        /// Salt (base64 on disk).
        salt: Vec<u8>,
    },
    /// A KDF type this version does not know: its whole object, as found.
    Other(Obj),
}

impl fmt::Debug for Kdf {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Self::Pbkdf2 { hash, iterations, salt } => f
                .debug_struct("Pbkdf2")
                .field("hash", hash)
                .field("iterations", iterations)
                .field("salt", &hex::encode(salt))
                .finish(),
            Self::Argon2 { id, time, memory, cpus, salt } => f
                .debug_struct(if *id { "Argon2id" } else { "Argon2i" })
                .field("time", time)
                .field("memory", memory)
                .field("cpus", cpus)
                .field("salt", &hex::encode(salt))
                .finish(),
            Self::Other(o) => f.debug_tuple("Other").field(o).finish(),
        }
    }
}

impl Kdf {
    /// The `type` string.
    pub fn type_name(&self) -> &str {
        match self {
            Self::Pbkdf2 { .. } => "pbkdf2",
            Self::Argon2 { id: true, .. } => "argon2id",
            Self::Argon2 { id: false, .. } => "argon2i",
            Self::Other(o) => o.get("type").and_then(Value::as_str).unwrap_or(""),
        }
    }

    fn decode(mut o: Obj, what: &str) -> Result<Self, MetadataError> {
        let t = take_str(&mut o, what, "type")?;
        match t.as_str() {
            "pbkdf2" => Ok(Self::Pbkdf2 {
                hash: take_str(&mut o, what, "hash")?,
                iterations: take_u32(&mut o, what, "iterations")?,
                salt: take_base64(&mut o, what, "salt")?,
            }),
            "argon2i" | "argon2id" => Ok(Self::Argon2 {
                id: t == "argon2id",
                time: take_u32(&mut o, what, "time")?,
                memory: take_u32(&mut o, what, "memory")?,
                cpus: take_u32(&mut o, what, "cpus")?,
                salt: take_base64(&mut o, what, "salt")?,
            }),
            _ => {
                let mut full = Obj::new();
                full.insert("type".into(), Value::String(t));
                append_extra(&mut full, &o);
                Ok(Self::Other(full))
            }
        }
    }

    fn encode(&self) -> Value {
        let mut o = Obj::new();
        match self {
            Self::Pbkdf2 { hash, iterations, salt } => {
                o.insert("type".into(), "pbkdf2".into());
                o.insert("hash".into(), hash.as_str().into());
                o.insert("iterations".into(), (*iterations).into());
                o.insert("salt".into(), internal::b64(salt));
            }
            Self::Argon2 { id, time, memory, cpus, salt } => {
                o.insert("type".into(), if *id { "argon2id" } else { "argon2i" }.into());
                o.insert("time".into(), (*time).into());
                o.insert("memory".into(), (*memory).into());
                o.insert("cpus".into(), (*cpus).into());
                o.insert("salt".into(), internal::b64(salt));
            }
            Self::Other(extra) => return Value::Object(extra.clone()),
        }
        Value::Object(o)
    }
}

/// A `luks2` keyslot's `key_size` or raw area `key_size` is at most
/// [`crate::limits::MAX_KEY_BYTES`]: the key derivation's output, the key-material read and
/// the AF merge are all sized by it.
fn check_key_size(what: &str, field: &'static str, value: u32) -> Result<(), MetadataError> {
    if value > crate::limits::MAX_KEY_BYTES {
        return Err(MetadataError::KeySizeTooLarge { what: what.to_owned(), field, value });
    }
    Ok(())
}

impl Area {
    fn decode(mut o: Obj, what: &str, luks2: bool) -> Result<Self, MetadataError> {
        let type_name = take_str(&mut o, what, "type")?;
        let offset = take_u64_str(&mut o, what, "offset")?;
        let size = take_u64_str(&mut o, what, "size")?;
        let (mut encryption, mut key_size) = (None, None);
        if luks2 {
            if type_name != "raw" {
                return Err(MetadataError::UnknownType { what: what.to_owned(), type_name });
            }
            encryption = Some(take_str(&mut o, what, "encryption")?);
            let k = take_i32(&mut o, what, "key_size").and_then(|k| {
                u32::try_from(k).map_err(|_| MetadataError::OutOfRange {
                    what: what.to_owned(),
                    field: "key_size",
                    value: k.to_string(),
                })
            })?;
            check_key_size(what, "key_size", k)?;
            key_size = Some(k);
        }
        Ok(Self { type_name, offset, size, encryption, key_size, extra: o })
    }

    fn encode(&self) -> Value {
        let mut o = Obj::new();
        o.insert("type".into(), self.type_name.as_str().into());
        o.insert("offset".into(), internal::u64_str(self.offset));
        o.insert("size".into(), internal::u64_str(self.size));
        if let Some(e) = &self.encryption {
            o.insert("encryption".into(), e.as_str().into());
        }
        if let Some(k) = self.key_size {
            o.insert("key_size".into(), k.into());
        }
        append_extra(&mut o, &self.extra);
        Value::Object(o)
    }
}

impl Af {
    fn decode(mut o: Obj, what: &str) -> Result<Self, MetadataError> {
        let type_name = take_str(&mut o, what, "type")?;
        if type_name != "luks1" {
            return Err(MetadataError::UnknownType { what: what.to_owned(), type_name });
        }
        Ok(Self {
            type_name,
            hash: take_str(&mut o, what, "hash")?,
            stripes: take_u32(&mut o, what, "stripes")?,
            extra: o,
        })
    }

    fn encode(&self) -> Value {
        let mut o = Obj::new();
        o.insert("type".into(), self.type_name.as_str().into());
        o.insert("stripes".into(), self.stripes.into());
        o.insert("hash".into(), self.hash.as_str().into());
        append_extra(&mut o, &self.extra);
        Value::Object(o)
    }
}

impl Keyslot {
    /// `true` for an ordinary passphrase keyslot.
    pub fn is_luks2(&self) -> bool {
        self.type_name == KEYSLOT_LUKS2
    }

    /// Decode keyslot `id` from its JSON object.
    pub(crate) fn decode(id: u32, v: Value) -> Result<Self, MetadataError> {
        let what = format!("keyslot {id}");
        let Value::Object(mut o) = v else {
            return Err(MetadataError::WrongType {
                what: "keyslots".into(),
                field: "<keyslot>",
                expected: "object",
                found: internal::type_name(&v),
            });
        };
        let type_name = take_str(&mut o, &what, "type")?;
        let key_size = take_u32(&mut o, &what, "key_size")?;
        let luks2 = type_name == KEYSLOT_LUKS2;
        if luks2 {
            check_key_size(&what, "key_size", key_size)?;
        }
        let area = take_obj(&mut o, &what, "area")?;
        let area = Area::decode(area, &format!("{what} area"), luks2)?;
        let priority =
            if o.contains_key("priority") { Some(take_i32(&mut o, &what, "priority")?) } else { None };
        let (mut af, mut kdf) = (None, None);
        if luks2 {
            let k = take_obj(&mut o, &what, "kdf")?;
            let a = take_obj(&mut o, &what, "af")?;
            kdf = Some(Kdf::decode(k, &format!("{what} kdf"))?);
            af = Some(Af::decode(a, &format!("{what} af"))?);
        }
        Ok(Self { type_name, key_size, priority, af, area, kdf, extra: o })
    }

    /// Encode in cryptsetup's field order (type, key_size, af, area, kdf, priority), then
    /// unknown fields.
    pub(crate) fn encode(&self) -> Value {
        let mut o = Obj::new();
        o.insert("type".into(), self.type_name.as_str().into());
        o.insert("key_size".into(), self.key_size.into());
        if let Some(af) = &self.af {
            o.insert("af".into(), af.encode());
        }
        o.insert("area".into(), self.area.encode());
        if let Some(kdf) = &self.kdf {
            o.insert("kdf".into(), kdf.encode());
        }
        if let Some(p) = self.priority {
            o.insert("priority".into(), p.into());
        }
        append_extra(&mut o, &self.extra);
        Value::Object(o)
    }
}
