//! LUKS1 and LUKS2 volumes: probe, load, unlock and activate; format; keyslot, UUID and
//! header-backup operations. cryptsetup-compatible both ways. Volumes are assembled by
//! [`crate::open`] (`Spec::Luks`); this module is the header side of it.
//!
//! ```text
//!  metadata device (the data device, or a detached --header file)
//!      │ probe(): magic + version                                         header.rs
//!      ▼
//!  Luks::load ── LUKS1: formats::luks1 phdr ─────────────────────────────┐ luks1.rs
//!      │          LUKS2: primary + secondary (scan), choose, repair plan  │ luks2.rs (formats: sans-IO)
//!      ▼                                                                  │
//!  unlock(passphrase) ── per keyslot, in priority order:                  │ header.rs, keyslot.rs
//!      KDF(pass, salt) → decrypt area (keyslot.rs) → AF merge → digest ───┘
//!      ▼
//!  table(volume key, data device) → formats::dm::CryptTable              activate.rs
//!      → crate::open stacks CryptTarget, or aead.rs's AEAD crypt over dm-integrity
//!
//!  format(FormatParams) ── header + keyslot 0                             format.rs
//!      (crate::format adds the dm-integrity area of --integrity: aead.rs)
//!  reencrypt: init / shift / run / recover (cryptsetup's on-disk state)  reencrypt/
//!  LuksError (typed by cause: LuksError::kind)                            error.rs
//! ```
//!
//! Writes to the metadata device follow cryptsetup's order so a crash leaves the old or the
//! new header, never neither:
//! * LUKS2 headers are rewritten through [`formats::luks2::Luks2Header::write_plan`]
//!   (primary, flush, secondary, flush, with a bumped seqid).
//! * A new keyslot's material is written and flushed *before* the header that references
//!   it; a killed keyslot's material is wiped and flushed before the header drops it.
//!
//! LUKS2 authenticated encryption (a segment with `integrity`) stacks an
//! [`targets::AeadCryptTarget`] over a dm-integrity target with external tags at the data
//! offset, as cryptsetup does (`aead.rs`).
//!
//! A volume whose reencryption is in progress opens as two segments split at the
//! reencryption offset (`reencrypting.rs`); other header changes on it are refused until
//! `reencrypt::run` finishes it.
//!
//! Not supported (refused with a clear error rather than opened wrongly): OPAL
//! segments, unknown mandatory requirements, tokens as unlock methods (tokens are kept
//! verbatim through every header rewrite).

pub(crate) mod aead;
mod convert;
mod dump;
mod io;
mod keyslot;
mod lifecycle;
mod luks1;
mod luks2;
mod pbkdf;
pub mod reencrypt;
pub mod reencrypting;

mod activate;
mod error;
mod format;
mod header;

pub use activate::{load_checked, open, OpenParams, Opened};
pub use aead::{
    format_integrity, format_integrity_until, wipe_integrity, AeadOpen, IntegrityJournalTuning,
    LuksIntegrity, WipeEnd,
};
pub use dump::{dump, dump_json_metadata, dump_unbound_key, dump_volume_key};
pub use error::{key_bytes, LuksError, ParamError, ReencryptError};
pub use format::{default_key_bits, format, header_size, luks2_layout, open_header_for_format, FormatParams};
pub(crate) use format::{parse_hash, SlotKey};
/// Activation flags of [`OpenParams::flags`] (re-exported for callers that do not use `formats`).
pub use formats::dm::CryptOptions;
/// The soft KDF bounds an unlock applies ([`Luks::unlock_with`], [`OpenParams::kdf_limits`]).
pub use formats::limits::{KdfLimits, LimitError};
pub use header::{
    check_uuid, kdf_cost, probe, random_uuid, Luks, Luks2State, LuksHeader, LuksVersion, Segment,
};
pub use lifecycle::{KeyslotPriority, LUKS2_TOKENS};
pub use pbkdf::{default_parallel, PbkdfParams, PbkdfType};

/// LUKS1 keyslots.
pub const LUKS1_KEYSLOTS: u32 = 8;
/// LUKS2 keyslots (cryptsetup `LUKS2_KEYSLOTS_MAX`).
pub const LUKS2_KEYSLOTS: u32 = 32;
