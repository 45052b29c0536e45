//! LUKS2 digests (`"digests": {"0": {...}}`), cryptsetup `luks2_digest.c` and
//! `luks2_digest_pbkdf2.c`. A digest verifies a volume key and binds keyslots to segments.
//!
//! ```text
//! "0": {
//!   "type": "pbkdf2",                      non-empty string
//!   "keyslots": ["0", "1"],                ids of existing keyslots (strings)
//!   "segments": ["0"],                     ids of existing segments (strings)
//!   "hash": "sha256",                      pbkdf2 only
//!   "iterations": 1000,                    pbkdf2 only, int
//!   "salt": "<base64>",                    pbkdf2 only
//!   "digest": "<base64>"                   pbkdf2 only: PBKDF2(hash, volume key, salt, iterations)
//! }
//! ```
//! A digest type other than `pbkdf2` is kept with its fields in `extra`.

use std::fmt;

use serde_json::Value;

use super::internal::{self, append_extra, take_base64, take_str, take_u32, Obj};
use super::json::MetadataError;

/// One digest.
#[derive(Clone, PartialEq)]
pub struct Digest {
    /// `type` (`pbkdf2` is the only one cryptsetup defines).
    pub type_name: String,
    /// Keyslots whose key this digest verifies.
    pub keyslots: Vec<u32>,
    /// Segments encrypted with that key.
    pub segments: Vec<u32>,
    /// The `pbkdf2` parameters, when `type` is `pbkdf2`.
    pub pbkdf2: Option<DigestPbkdf2>,
    /// Unknown fields (all parameters of an unknown digest type).
    pub extra: Obj,
}

/// Parameters of a `pbkdf2` digest.
#[derive(Clone, PartialEq, Eq)]
pub struct DigestPbkdf2 {
    /// PRF hash.
    pub hash: String,
    /// Iterations.
    pub iterations: u32,
    /// Salt.
    pub salt: Vec<u8>,
    /// Expected PBKDF2 output (its length is the output length).
    pub digest: Vec<u8>,
}

impl fmt::Debug for Digest {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let mut d = f.debug_struct("Digest");
        d.field("type_name", &self.type_name)
            .field("keyslots", &self.keyslots)
            .field("segments", &self.segments);
        if let Some(p) = &self.pbkdf2 {
            d.field("hash", &p.hash)
                .field("iterations", &p.iterations)
                .field("salt", &hex::encode(&p.salt))
                .field("digest", &hex::encode(&p.digest));
        }
        d.field("extra", &self.extra).finish()
    }
}

impl fmt::Debug for DigestPbkdf2 {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("DigestPbkdf2")
            .field("hash", &self.hash)
            .field("iterations", &self.iterations)
            .field("salt", &hex::encode(&self.salt))
            .field("digest", &hex::encode(&self.digest))
            .finish()
    }
}

impl Digest {
    /// Decode digest `id`. `keyslots`/`segments` are the reference arrays, already checked
    /// and resolved by the caller (they refer across sections).
    pub(crate) fn decode(
        id: u32,
        mut o: Obj,
        keyslots: Vec<u32>,
        segments: Vec<u32>,
    ) -> Result<Self, MetadataError> {
        let what = format!("digest {id}");
        let type_name = take_str(&mut o, &what, "type")?;
        let pbkdf2 = if type_name == "pbkdf2" {
            Some(DigestPbkdf2 {
                hash: take_str(&mut o, &what, "hash")?,
                iterations: take_u32(&mut o, &what, "iterations")?,
                salt: take_base64(&mut o, &what, "salt")?,
                digest: take_base64(&mut o, &what, "digest")?,
            })
        } else {
            None
        };
        Ok(Self { type_name, keyslots, segments, pbkdf2, extra: o })
    }

    /// Encode in cryptsetup's order: type, keyslots, segments, hash, iterations, salt, digest.
    pub(crate) fn encode(&self) -> Value {
        let mut o = Obj::new();
        o.insert("type".into(), self.type_name.as_str().into());
        o.insert("keyslots".into(), internal::id_array(&self.keyslots));
        o.insert("segments".into(), internal::id_array(&self.segments));
        if let Some(p) = &self.pbkdf2 {
            o.insert("hash".into(), p.hash.as_str().into());
            o.insert("iterations".into(), p.iterations.into());
            o.insert("salt".into(), internal::b64(&p.salt));
            o.insert("digest".into(), internal::b64(&p.digest));
        }
        append_extra(&mut o, &self.extra);
        Value::Object(o)
    }
}
