//! LUKS2 headers: the two binary headers with their JSON areas, and the JSON metadata as
//! typed structs. Sans-IO: bytes in, [`Selected`] header out; header out, [`WritePlan`] of
//! writes and flushes for the caller (`volume`) to carry out.
//!
//! Spec: LUKS2 On-Disk Format Specification 1.1.x (cryptsetup `docs/on-disk-format-luks2.pdf`)
//! and cryptsetup `lib/luks2/` (`luks2.h`, `luks2_disk_metadata.c`, `luks2_json_metadata.c`).
//!
//! ```text
//!  device offset 0                hdr_size              2·hdr_size       2·hdr_size + keyslots_size
//!  ┌──────────┬───────────────────┬──────────┬───────────────────┬───────────────────┬──────────────
//!  │ binary   │ JSON area         │ binary   │ JSON area         │ keyslots area     │ data segment
//!  │ header   │ (hdr_size - 4096) │ header   │ (copy)            │ (AF-split keys)   │ (segment 0 ..)
//!  │ primary  │                   │ secondary│                   │                   │
//!  │ 4096 B   │                   │ 4096 B   │                   │                   │
//!  └──────────┴───────────────────┴──────────┴───────────────────┴───────────────────┴──────────────
//!   "LUKS\xba\xbe"                 "SKUL\xba\xbe"
//! ```
//!
//! `hdr_size` (one metadata copy: binary header + JSON area) is one of 16 KiB, 32 KiB, ...,
//! 4 MiB ([`METADATA_SIZES`]); the secondary copy starts at `hdr_size`. Each copy carries
//! a `seqid` (bumped on every update; the higher valid copy wins) and a checksum over its
//! binary header (checksum field zeroed) and its whole JSON area.
//!
//! Modules, named after cryptsetup's `lib/luks2/` files:
//!
//! ```text
//!  disk_metadata   binary header layout, checksum, decode one copy, choose between two,
//!        │         encode both copies, crash-safe WritePlan, repair plan
//!        ▼
//!  json            JSON area framing, Luks2Metadata, cross-object validation
//!        │
//!        ├── keyslot   keyslots (luks2: af, area, kdf pbkdf2/argon2i/argon2id)
//!        ├── digest    digests (pbkdf2)
//!        ├── segment   segments (crypt, linear, hw-opal*, flags, integrity)
//!        ├── token     tokens (opaque apart from type and keyslots)
//!        ├── config    json_size, keyslots_size, flags, requirements
//!        └── reencrypt reencrypt keyslot, backup segments, hotzone segment layout,
//!                      verification data (online-reencrypt-v2)
//! ```
//!
//! Loading, as the caller does it (see [`load`] for the same on an in-memory image):
//!
//! ```text
//!  primary   = decode_copy(read(0, hdr_size_of(read(0, 4096))), 0)
//!  for off in secondary_offsets(&primary):            // [hdr_size], or all nine if the
//!      secondary = decode_copy(read(off, ..), off)    // primary's binary header/checksum is bad
//!      if secondary is Ok or its error .failed_in_json() { break }
//!  selected  = choose(primary, secondary)?            // higher valid seqid wins
//!  if selected.repair.is_some() { write selected.repair_plan(fresh_salt) }
//! ```
//!
//! Not here: KDFs, the AF splitter, keyslot decryption (`sector-crypto`); I/O, locking and
//! the device-size check against [`Luks2Metadata::metadata_and_keyslots_size`] (`volume`).

mod config;
mod digest;
mod disk_metadata;
mod internal;
mod json;
mod keyslot;
mod pretty;
pub mod reencrypt;
mod segment;
mod token;

pub use config::{Config, Requirement, Requirements, KNOWN_FLAGS};
pub use digest::{Digest, DigestPbkdf2};
pub use disk_metadata::{
    choose, decode_copy, hdr_size_of, load, secondary_offsets, BinaryHeader, CopyKind, DecodedCopy,
    HeaderSalts, Luks2Error, Luks2Header, Selected, WritePlan, WriteStep, CHECKSUM_LEN, SALT_LEN,
};
pub use json::{Luks2Metadata, MetadataError, MAX_DEPTH};
pub use keyslot::{Af, Area, Kdf, Keyslot, KEYSLOT_LUKS2, KEYSLOT_REENCRYPT};
pub use pretty::json_c_pretty;
pub use segment::{CryptParams, OpalParams, Segment, SegmentIntegrity, SegmentSize};
pub use token::{Token, TokenJsonError, KEYRING};

/// Binary header size; the JSON area starts right after it.
pub const BINARY_HEADER_SIZE: u64 = 4096;
/// The nine valid metadata (binary header + JSON area) sizes. They are also the offsets
/// where a secondary header may be found (cryptsetup `LUKS2_HDR2_OFFSETS`).
pub const METADATA_SIZES: [u64; 9] = [
    0x4000,
    0x8000,
    0x10000,
    0x20000,
    0x40000,
    0x80000,
    0x100000,
    0x200000,
    crate::limits::LUKS2_MAX_METADATA_SIZE,
];
/// Largest keyslots area (cryptsetup `LUKS2_MAX_KEYSLOTS_SIZE`, 128 MiB;
/// [`crate::limits::LUKS2_MAX_KEYSLOTS_SIZE`]).
pub const MAX_KEYSLOTS_SIZE: u64 = crate::limits::LUKS2_MAX_KEYSLOTS_SIZE;
/// Primary header magic.
pub const MAGIC_PRIMARY: [u8; 6] = *b"LUKS\xba\xbe";
/// Secondary header magic.
pub const MAGIC_SECONDARY: [u8; 6] = *b"SKUL\xba\xbe";
