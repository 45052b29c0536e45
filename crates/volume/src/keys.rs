//! Key sources: the one seam through which key material reaches an unlock.
//!
//! ```text
//!   Keys ─┬─ passphrases  (a PassphraseSource: prompt with retries, key file, a constant,
//!         │                a token's passphrase naming its keyslots)   LUKS, FileVault2,
//!         │                                                           TrueCrypt, BitLocker
//!         ├─ keyfiles     (TrueCrypt/VeraCrypt keyfiles, mixed into each passphrase)
//!         ├─ key file     (raw bytes: a BitLocker .BEK startup key, else a passphrase)
//!         └─ volume key   (the key itself: BitLocker's FVEK)
//! ```
//! A [`crate::Spec`] says *what* to open and how; [`Keys`] says with what. Every unlock in
//! this crate takes its secrets from here, so a new key source (a token type) is one more
//! field or [`PassphraseSource`] here, not a change to each format.
use sector_crypto::kdf::Passphrase;
use sector_crypto::VolumeKey;
use zeroize::Zeroizing;

use crate::{PassphraseSource, VolumeError};

/// The key material an open may use. Secrets stay in zeroizing types; `Debug` shows only
/// which sources are present.
#[derive(Default)]
pub struct Keys<'a> {
    /// Passphrases owned here, tried first, each once.
    owned: std::collections::VecDeque<Passphrase>,
    passphrases: Option<&'a mut dyn PassphraseSource>,
    keyfiles: Vec<Passphrase>,
    key_file: Option<Zeroizing<Vec<u8>>>,
    volume_key: Option<VolumeKey>,
}

impl std::fmt::Debug for Keys<'_> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Keys")
            .field("passphrases", &(self.passphrases.is_some() || !self.owned.is_empty()))
            .field("keyfiles", &self.keyfiles.len())
            .field("key_file", &self.key_file.is_some())
            .field("volume_key", &self.volume_key.is_some())
            .finish()
    }
}

impl<'a> Keys<'a> {
    /// No key material: enough for formats without keys (dm-integrity without a keyed
    /// hash, or a plain table whose key is in its spec).
    pub fn none() -> Self {
        Keys::default()
    }

    /// Passphrases from `source`, tried in turn.
    pub fn passphrase(source: &'a mut dyn PassphraseSource) -> Self {
        Keys { passphrases: Some(source), ..Keys::default() }
    }

    /// Adds a passphrase to try once, before those of a source (a library caller's one
    /// passphrase, owned).
    pub fn with_passphrase(mut self, passphrase: Passphrase) -> Self {
        self.owned.push_back(passphrase);
        self
    }

    /// Adds TrueCrypt/VeraCrypt keyfiles (their contents, in order).
    pub fn with_keyfiles(mut self, keyfiles: Vec<Passphrase>) -> Self {
        self.keyfiles = keyfiles;
        self
    }

    /// Adds a key file's raw bytes: a BitLocker startup key (.BEK), or a passphrase file
    /// where the format takes one.
    pub fn with_key_file(mut self, bytes: Zeroizing<Vec<u8>>) -> Self {
        self.key_file = Some(bytes);
        self
    }

    /// Adds the volume key itself, for formats that open by it (BitLocker's FVEK).
    pub fn with_volume_key(mut self, key: VolumeKey) -> Self {
        self.volume_key = Some(key);
        self
    }

    /// The TrueCrypt/VeraCrypt keyfiles.
    pub(crate) fn keyfiles(&self) -> &[Passphrase] {
        &self.keyfiles
    }

    /// The raw key file, if one was given.
    pub(crate) fn key_file(&self) -> Option<&Zeroizing<Vec<u8>>> {
        self.key_file.as_ref()
    }

    /// The volume key, if one was given.
    pub(crate) fn volume_key(&self) -> Option<&VolumeKey> {
        self.volume_key.as_ref()
    }
}

/// The passphrases of the keys: none at all when no source was given (the unlock then
/// fails as a wrong passphrase would, having tried nothing).
impl PassphraseSource for Keys<'_> {
    fn next_passphrase(&mut self) -> Result<Option<Passphrase>, VolumeError> {
        if let Some(p) = self.owned.pop_front() {
            return Ok(Some(p));
        }
        match &mut self.passphrases {
            Some(p) => p.next_passphrase(),
            None => Ok(None),
        }
    }

    fn rejected(&mut self) {
        if let Some(p) = &mut self.passphrases {
            p.rejected();
        }
    }

    fn keyslots(&self) -> Option<Vec<u32>> {
        self.passphrases.as_ref().and_then(|p| p.keyslots())
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::OnePassphrase;

    #[test]
    fn debug_shows_no_secret() {
        let p = Passphrase::new(b"hunter2hunter2".to_vec());
        let mut one = OnePassphrase::new(&p);
        let keys = Keys::passphrase(&mut one)
            .with_key_file(Zeroizing::new(b"startup-key-bytes".to_vec()))
            .with_volume_key(VolumeKey::from_slice(&[0x5a; 32]));
        let shown = format!("{keys:?}");
        assert!(!shown.contains("hunter2") && !shown.contains("startup") && !shown.contains("5a"), "{shown}");
        assert!(shown.contains("passphrases: true"), "{shown}");
    }

    #[test]
    fn owned_passphrases_come_first_then_the_source() {
        let p = Passphrase::new(b"second".to_vec());
        let mut one = OnePassphrase::new(&p);
        let mut keys = Keys::passphrase(&mut one).with_passphrase(Passphrase::new(b"first".to_vec()));
        assert_eq!(keys.next_passphrase().unwrap().unwrap().as_bytes(), b"first");
        assert_eq!(keys.next_passphrase().unwrap().unwrap().as_bytes(), b"second");
        assert!(keys.next_passphrase().unwrap().is_none());
    }

    #[test]
    fn no_source_yields_nothing() {
        let mut keys = Keys::none();
        assert!(keys.next_passphrase().unwrap().is_none());
        keys.rejected();
        assert_eq!(keys.keyslots(), None);
    }
}
