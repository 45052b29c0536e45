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
