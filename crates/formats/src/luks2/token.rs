//! LUKS2 tokens (`"tokens": {"0": {...}}`), cryptsetup `luks2_token.c`. Tokens are opaque
//! to sealdisk: only `type` and `keyslots` are checked (cryptsetup `LUKS2_token_validate`);
//! every other field (systemd-tpm2 blobs, fido2 credentials, `key_description` of
//! `luks2-keyring`...) is kept verbatim and written back unchanged.
//!
//! ```text
//! "0": { "type": "luks2-keyring", "keyslots": ["0"], "key_description": "..." }
//! ```

use serde_json::Value;

use super::internal::{self, append_extra, Obj};

/// One token.
#[derive(Debug, Clone, PartialEq)]
pub struct Token {
    /// `type`, e.g. `luks2-keyring`, `systemd-tpm2`.
    pub type_name: String,
    /// Keyslots the token unlocks.
    pub keyslots: Vec<u32>,
    /// All other fields, as found.
    pub extra: Obj,
}

impl Token {
    /// Encode: type, keyslots, then the token's own fields in their original order.
    pub(crate) fn encode(&self) -> Value {
        let mut o = Obj::new();
        o.insert("type".into(), self.type_name.as_str().into());
        o.insert("keyslots".into(), internal::id_array(&self.keyslots));
        append_extra(&mut o, &self.extra);
        Value::Object(o)
    }
}

/// Why a token's JSON (`token import --json-file`) was refused.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum TokenJsonError {
    /// Not one JSON object, or one nested deeper than json-c accepts.
    #[error("token JSON is not valid: {0}")]
    Syntax(String),
    /// A malformed member (`type`, `keyslots`), as the metadata codec names it.
    #[error("{0}")]
    Field(#[from] super::json::MetadataError),
    /// A `luks2-keyring` token without a string `key_description` (cryptsetup
    /// `keyring_validate`).
    #[error("luks2-keyring token has no string \"key_description\"")]
    KeyringDescription,
}

impl Token {
    /// Parses a token as `cryptsetup token import` takes it: one JSON object with a
    /// non-empty string `type` and a `keyslots` array of decimal id strings; every other
    /// member is kept verbatim, in its order. The caller checks the keyslot ids against the
    /// header. A `luks2-keyring` token must have a string `key_description`.
    pub fn from_json(text: &str) -> Result<Self, TokenJsonError> {
        let v: Value = serde_json::from_str(text.trim_end_matches(['\n', '\0']))
            .map_err(|e| TokenJsonError::Syntax(e.to_string()))?;
        if super::json::depth_of(&v) > super::json::MAX_DEPTH {
            return Err(TokenJsonError::Syntax("nested too deeply".into()));
        }
        let Value::Object(mut o) = v else {
            return Err(TokenJsonError::Syntax("not a JSON object".into()));
        };
        let type_name = internal::take_str(&mut o, "token", "type")?;
        let refs = internal::take_str_array(&mut o, "token", "keyslots")?;
        let keyslots =
            refs.iter().map(|r| internal::parse_id("keyslots", r)).collect::<Result<Vec<u32>, _>>()?;
        if type_name == KEYRING && !matches!(o.get("key_description"), Some(Value::String(_))) {
            return Err(TokenJsonError::KeyringDescription);
        }
        Ok(Token { type_name, keyslots, extra: o })
    }

    /// A `luks2-keyring` token for `key_description` bound to `keyslots`
    /// (`cryptsetup token add --key-description`).
    pub fn keyring(key_description: &str, keyslots: Vec<u32>) -> Self {
        let mut extra = Obj::new();
        extra.insert("key_description".into(), Value::String(key_description.to_owned()));
        Token { type_name: KEYRING.into(), keyslots, extra }
    }

    /// The `key_description` of a `luks2-keyring` token.
    pub fn key_description(&self) -> Option<&str> {
        (self.type_name == KEYRING).then(|| self.extra.get("key_description")?.as_str())?
    }

    /// Compact JSON, as `cryptsetup token export` prints it.
    pub fn to_json_string(&self) -> String {
        // Serializing a Value to a String cannot fail.
        serde_json::to_string(&self.encode()).unwrap_or_default()
    }
}

/// The token type cryptsetup handles itself, without a plugin: a passphrase in the kernel
/// keyring (a `user` key named by `key_description`).
pub const KEYRING: &str = "luks2-keyring";

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn import_keeps_members_in_order_and_checks_type_and_keyslots() {
        let t = Token::from_json(r#"{"zeta":1,"type":"x","keyslots":["3","0"],"alpha":[null]}"#).unwrap();
        assert_eq!(t.type_name, "x");
        assert_eq!(t.keyslots, vec![3, 0]);
        assert_eq!(t.to_json_string(), r#"{"type":"x","keyslots":["3","0"],"zeta":1,"alpha":[null]}"#);
        for bad in [
            r#"{"keyslots":[]}"#,
            r#"{"type":"","keyslots":[]}"#,
            r#"{"type":"x"}"#,
            r#"{"type":"x","keyslots":[0]}"#,
            r#"{"type":"x","keyslots":["a"]}"#,
            r#"{"type":"luks2-keyring","keyslots":[]}"#,
            r#"{"type":"luks2-keyring","keyslots":[],"key_description":7}"#,
            r#"["type"]"#,
            "nonsense",
        ] {
            assert!(Token::from_json(bad).is_err(), "{bad}");
        }
        let deep = format!(r#"{{"type":"x","keyslots":[],"d":{}{}}}"#, "[".repeat(100), "]".repeat(100));
        assert!(Token::from_json(&deep).is_err());
        let k =
            Token::from_json(r#"{"type":"luks2-keyring","keyslots":["1"],"key_description":"d"}"#).unwrap();
        assert_eq!(k.key_description(), Some("d"));
        assert_eq!(k, Token::keyring("d", vec![1]));
    }
}
