//! LUKS2 header maintenance that needs no data-area rewrite (cryptsetup `token`, `config`,
//! `luksAddKey --unbound`, `open --unbound --test-passphrase`): tokens, label and
//! subsystem, keyslot priority, persistent activation flags, unbound keyslots.
//!
//! Every change is one header rewrite through [`luks2::write_header`] (primary, flush,
//! secondary, flush, `seqid + 1`), so a crash leaves the old or the new header. A new
//! unbound keyslot's material is written and flushed before the header that references it,
//! as for any keyslot. LUKS1 has none of these: each refuses a LUKS1 header with
//! cryptsetup's wording.

use std::collections::BTreeMap;

use blockdev::BlockDevice;
use formats::luks2::{Digest, DigestPbkdf2, Token};
use sector_crypto::kdf::{self, Passphrase};
use sector_crypto::VolumeKey;
use serde_json::Map;

use super::{luks2, KdfLimits, Luks, Luks2State, LuksError, LuksHeader, PbkdfParams, LUKS2_KEYSLOTS};

/// cryptsetup's `LUKS2_TOKENS_MAX`: token ids are 0..32.
pub const LUKS2_TOKENS: u32 = 32;

/// A keyslot's priority (`config --priority`; LUKS2 `priority`: 0, 1, 2).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum KeyslotPriority {
    /// Never tried unless named (`--key-slot`).
    Ignore,
    /// Tried after the preferred ones.
    Normal,
    /// Tried first.
    Prefer,
}

impl std::str::FromStr for KeyslotPriority {
    type Err = LuksError;
    fn from_str(s: &str) -> Result<Self, LuksError> {
        match s {
            "ignore" => Ok(Self::Ignore),
            "normal" => Ok(Self::Normal),
            "prefer" => Ok(Self::Prefer),
            _ => Err(super::ParamError::Priority(s.to_owned()).into()),
        }
    }
}

impl Luks {
    fn v2(&self) -> Result<&Luks2State, LuksError> {
        match &self.header {
            LuksHeader::V2(s) => Ok(s),
            LuksHeader::V1(_) => Err(LuksError::WrongVersion { wanted: 2, found: 1 }),
        }
    }

    /// Applies `change` to a copy of the LUKS2 header and writes it; the loaded header
    /// changes only once the write succeeded.
    fn rewrite(
        &mut self,
        meta: &dyn BlockDevice,
        change: impl FnOnce(&mut Luks2State) -> Result<(), LuksError>,
    ) -> Result<(), LuksError> {
        let LuksHeader::V2(s) = &mut self.header else {
            return Err(LuksError::WrongVersion { wanted: 2, found: 1 });
        };
        let mut next = (**s).clone();
        change(&mut next)?;
        luks2::write_header(&mut next, meta)?;
        **s = next;
        Ok(())
    }

    /// The LUKS2 tokens by id (empty for LUKS1).
    pub fn tokens(&self) -> BTreeMap<u32, Token> {
        match &self.header {
            LuksHeader::V2(s) => s.header.metadata.tokens.clone(),
            LuksHeader::V1(_) => BTreeMap::new(),
        }
    }

    /// Adds `token` as `id` (or the first free id) and returns the id (cryptsetup
    /// `token add` / `token import`). With `replace`, an existing token `id` is replaced
    /// (`--token-replace`). Every keyslot the token names must be active.
    pub fn token_add(
        &mut self,
        meta: &dyn BlockDevice,
        id: Option<u32>,
        token: Token,
        replace: bool,
    ) -> Result<u32, LuksError> {
        let m = &self.v2()?.header.metadata;
        if let Some(i) = id {
            if i >= LUKS2_TOKENS {
                return Err(super::ParamError::TokenInvalid(i).into());
            }
            if m.tokens.contains_key(&i) && !replace {
                return Err(super::ParamError::TokenInUse(i).into());
            }
        }
        for k in &token.keyslots {
            if !m.keyslots.contains_key(k) {
                return Err(LuksError::KeyslotInactive(*k));
            }
        }
        let id = match id {
            Some(i) => i,
            None => {
                (0..LUKS2_TOKENS).find(|i| !m.tokens.contains_key(i)).ok_or(super::ParamError::NoFreeToken)?
            }
        };
        let mut token = token;
        token.keyslots.sort_unstable();
        token.keyslots.dedup();
        self.rewrite(meta, |s| {
            s.header.metadata.tokens.insert(id, token);
            Ok(())
        })?;
        Ok(id)
    }

    /// Removes token `id` (cryptsetup `token remove`).
    pub fn token_remove(&mut self, meta: &dyn BlockDevice, id: u32) -> Result<(), LuksError> {
        if id >= LUKS2_TOKENS {
            return Err(super::ParamError::TokenInvalid(id).into());
        }
        if !self.v2()?.header.metadata.tokens.contains_key(&id) {
            return Err(super::ParamError::TokenNotInUse(id).into());
        }
        self.rewrite(meta, |s| {
            s.header.metadata.tokens.remove(&id);
            Ok(())
        })
    }

    /// Token `id` as `cryptsetup token export` prints it (compact JSON, no newline).
    pub fn token_export(&self, id: u32) -> Result<String, LuksError> {
        self.v2()?
            .header
            .metadata
            .tokens
            .get(&id)
            .map(Token::to_json_string)
            .ok_or(super::ParamError::TokenMissing(id).into())
    }

    /// Sets the LUKS2 label and/or subsystem (`config --label`, `--subsystem`; an empty
    /// string clears it). Each is at most 47 bytes (the binary header field).
    pub fn set_label(
        &mut self,
        meta: &dyn BlockDevice,
        label: Option<&str>,
        subsystem: Option<&str>,
    ) -> Result<(), LuksError> {
        for (what, v) in [("label", label), ("subsystem", subsystem)] {
            if v.is_some_and(|v| v.len() > 47) {
                return Err(super::ParamError::LabelTooLong { what }.into());
            }
        }
        self.rewrite(meta, |s| {
            if let Some(l) = label {
                s.header.label = l.to_owned();
            }
            if let Some(u) = subsystem {
                s.header.subsystem = u.to_owned();
            }
            Ok(())
        })
    }

    /// Sets keyslot `slot`'s priority (`config --priority --key-slot`).
    pub fn set_priority(
        &mut self,
        meta: &dyn BlockDevice,
        slot: u32,
        priority: KeyslotPriority,
    ) -> Result<(), LuksError> {
        self.check_slot(slot)?;
        if !self.v2()?.header.metadata.keyslots.contains_key(&slot) {
            return Err(LuksError::KeyslotInactive(slot));
        }
        self.rewrite(meta, |s| {
            let ks = s.header.metadata.keyslots.get_mut(&slot).ok_or(LuksError::KeyslotInactive(slot))?;
            // cryptsetup drops the member for "normal" (its default).
            ks.priority = match priority {
                KeyslotPriority::Ignore => Some(0),
                KeyslotPriority::Normal => None,
                KeyslotPriority::Prefer => Some(2),
            };
            Ok(())
        })
    }

    /// Replaces the persistent activation flags (`open --persistent`; LUKS2
    /// `config.flags`). Only names cryptsetup knows ([`formats::luks2::KNOWN_FLAGS`]) are
    /// accepted; an empty list removes the member.
    pub fn set_persistent_flags(&mut self, meta: &dyn BlockDevice, flags: &[&str]) -> Result<(), LuksError> {
        self.v2()?;
        for f in flags {
            if !formats::luks2::KNOWN_FLAGS.contains(f) {
                return Err(super::ParamError::PersistentFlag((*f).to_owned()).into());
            }
        }
        let list: Vec<String> = flags.iter().map(|f| (*f).to_owned()).collect();
        self.rewrite(meta, |s| {
            s.header.metadata.config.flags = if list.is_empty() { None } else { Some(list) };
            Ok(())
        })
    }

    /// Whether `slot` is a LUKS2 keyslot whose key is not the data segment's volume key.
    pub fn is_unbound(&self, slot: u32) -> bool {
        let LuksHeader::V2(s) = &self.header else { return false };
        let m = &s.header.metadata;
        let seg = luks2::default_segment(&s.header).ok().and_then(|(id, _)| m.segment_digest(id));
        m.keyslots.get(&slot).is_some_and(|k| k.is_luks2()) && m.keyslot_digest(slot) != seg
    }

    /// Adds an unbound keyslot (`luksAddKey --unbound`): `key` (any length, not the volume
    /// key) protected by `passphrase`, with its own digest bound to no segment. The KDF
    /// runs before anything is written. Returns the slot.
    pub fn add_unbound_keyslot(
        &mut self,
        meta: &dyn BlockDevice,
        key: &VolumeKey,
        passphrase: &Passphrase,
        slot: Option<u32>,
        pbkdf: &PbkdfParams,
    ) -> Result<u32, LuksError> {
        self.check_supported()?;
        let vk_len = self.key_bytes().max(key.len());
        let s = self.v2()?;
        if let Some(n) = slot {
            self.check_slot(n)?;
            if s.header.metadata.keyslots.contains_key(&n) {
                return Err(LuksError::KeyslotActive(n));
            }
        }
        let slot = match slot {
            Some(n) => n,
            None => (0..LUKS2_KEYSLOTS)
                .find(|n| !s.header.metadata.keyslots.contains_key(n))
                .ok_or(LuksError::NoFreeKeyslot)?,
        };
        let len = luks2::area_size(key.len());
        let offset =
            luks2::find_area(&s.header.metadata, len, None).ok_or(LuksError::NoKeyslotSpace { need: len })?;
        // The slow parts first: the keyslot's KDF and the digest's PBKDF2.
        let slot_key = luks2::slot_key(&s.header, vk_len, passphrase.as_bytes(), pbkdf)?;
        let iterations = pbkdf.digest_iterations(key.len());
        let mut salt = vec![0u8; 32];
        kdf::random_bytes(&mut salt).map_err(LuksError::Kdf)?;
        let mut digest = vec![0u8; pbkdf.hash.output_len()];
        kdf::pbkdf2(pbkdf.hash, key.as_bytes(), &salt, iterations, &mut digest).map_err(LuksError::Kdf)?;
        let ks = luks2::new_keyslot_for(&s.header, meta, offset, len, key, &slot_key, pbkdf.hash, vk_len)?;
        let digest_id = (0..).find(|d| !s.header.metadata.digests.contains_key(d)).unwrap_or(0);
        self.rewrite(meta, |s| {
            s.header.metadata.keyslots.insert(slot, ks);
            s.header.metadata.digests.insert(
                digest_id,
                Digest {
                    type_name: "pbkdf2".into(),
                    keyslots: vec![slot],
                    segments: Vec::new(),
                    pbkdf2: Some(DigestPbkdf2 { hash: pbkdf.hash.name().into(), iterations, salt, digest }),
                    extra: Map::new(),
                },
            );
            Ok(())
        })?;
        Ok(slot)
    }

    /// Tries `passphrase` on `slot`, or on every `luks2` keyslot bound or not (priority
    /// order, `ignore` only when named), checking the key against the keyslot's own digest
    /// (cryptsetup's `CRYPT_ACTIVATE_ALLOW_UNBOUND_KEY`: `open --unbound --test-passphrase`,
    /// `luksDump --unbound`). Returns the keyslot and its key.
    pub fn unlock_any_keyslot(
        &self,
        meta: &dyn BlockDevice,
        passphrase: &Passphrase,
        slot: Option<u32>,
        limits: &KdfLimits,
    ) -> Result<(u32, VolumeKey), LuksError> {
        let s = self.v2()?;
        let m = &s.header.metadata;
        let slots: Vec<u32> = match slot {
            Some(n) => {
                self.check_slot(n)?;
                if !m.keyslots.contains_key(&n) {
                    return Err(LuksError::KeyslotInactive(n));
                }
                vec![n]
            }
            None => {
                let prio = |n: &u32| m.keyslots[n].priority.unwrap_or(1);
                let usable = |n: &&u32| m.keyslots[*n].is_luks2();
                let mut v: Vec<u32> =
                    m.keyslots.keys().filter(usable).filter(|n| prio(n) == 2).copied().collect();
                v.extend(m.keyslots.keys().filter(usable).filter(|n| prio(n) == 1).copied());
                v
            }
        };
        for &n in &slots {
            // The same cost checks as a bound unlock, before any derivation.
            let (kdf, _) = luks2::slot_kdf(&s.header, n)?;
            super::keyslot::check_kdf(&kdf, &format!("LUKS2 keyslot {n}"), limits)?;
        }
        for n in slots {
            if let Some(key) = luks2::try_slot(&s.header, meta, n, passphrase.as_bytes())? {
                return Ok((n, key));
            }
        }
        Err(LuksError::WrongPassphrase)
    }
}
