//! LUKS2 binary headers, checksums and the two metadata copies (cryptsetup
//! `luks2_disk_metadata.c`, `struct luks2_hdr_disk` in `luks2.h`). Big-endian.
//!
//! ```text
//!  off  size  field          notes
//!  ---  ----  -------------  ------------------------------------------------------------
//!    0     6  magic          "LUKS\xba\xbe" (primary) / "SKUL\xba\xbe" (secondary)
//!    6     2  version        2
//!    8     8  hdr_size       binary header + JSON area, in bytes: 16 KiB ..= 4 MiB
//!   16     8  seqid          bumped on every update; the higher valid copy wins
//!   24    48  label          NUL-terminated
//!   72    32  checksum_alg   NUL-terminated, "sha256"
//!  104    64  salt           random, different in each copy
//!  168    40  uuid           NUL-terminated (same offset as LUKS1)
//!  208    48  subsystem      NUL-terminated
//!  256     8  hdr_offset     this copy's offset on the device (0, or hdr_size)
//!  264   184  padding        zero
//!  448    64  csum           checksum_alg(binary header with csum zeroed ‖ whole JSON area),
//!                            zero-padded to 64 bytes
//!  512  3584  padding        zero
//! 4096     …  JSON area      hdr_size - 4096 bytes, see `json.rs`
//! ```
//!
//! ## Crash-safe write order (cryptsetup `LUKS2_disk_hdr_write` → `hdr_write_disk`)
//!
//! cryptsetup bumps `seqid`, then writes the **primary** copy and then the **secondary**,
//! each in three writes followed by a device sync:
//!
//! 1. the binary header with the new seqid and an all-zero checksum,
//! 2. the JSON area,
//! 3. the binary header again, now with the checksum; then `fsync`.
//!
//! While a copy is being rewritten its checksum does not match (step 1 zeroes it, and any
//! reordering of steps 2–3 leaves a checksum over the wrong bytes), so a crash leaves that
//! copy invalid and the other copy intact: before the first sync the secondary still holds
//! the old state; after it, the primary holds the new one. On the next load the valid copy
//! is used and the other is rewritten from it ([`Selected::repair_plan`]). [`WritePlan`]
//! reproduces this order, with a [`WriteStep::Flush`] after each copy.
//!
//! ## Choosing a copy (cryptsetup `LUKS2_disk_hdr_read`)
//!
//! The primary is read at 0. If its binary header or checksum is bad, the secondary is
//! searched at every offset in [`METADATA_SIZES`](super::METADATA_SIZES) (the first whose
//! binary header and checksum pass is taken); otherwise it is read at the primary's
//! `hdr_size`. A copy whose JSON fails validation counts as invalid. If both are valid the
//! higher seqid wins (the primary on a tie) and a copy with a lower seqid is repaired. The
//! repair rewrites the bad copy from the good one with a fresh salt and the same seqid.
//! Known deviation: cryptsetup copies the good JSON area byte for byte; the repair plan here
//! re-encodes the decoded metadata (same content, compact form).

use super::json::{Luks2Metadata, MetadataError};
use super::{BINARY_HEADER_SIZE, MAGIC_PRIMARY, MAGIC_SECONDARY, METADATA_SIZES};

/// Length of the per-copy salt.
pub const SALT_LEN: usize = 64;
/// Length of the checksum field (the digest is zero-padded to it).
pub const CHECKSUM_LEN: usize = 64;

const MAGIC_L: usize = 6;
const LABEL_L: usize = 48;
const CSUM_ALG_L: usize = 32;
const UUID_L: usize = 40;
const SUBSYSTEM_L: usize = 48;

// Offsets, derived from the table above.
const VERSION_OFF: usize = MAGIC_L;
const HDR_SIZE_OFF: usize = VERSION_OFF + 2;
const SEQID_OFF: usize = HDR_SIZE_OFF + 8;
const LABEL_OFF: usize = SEQID_OFF + 8;
const CSUM_ALG_OFF: usize = LABEL_OFF + LABEL_L;
const SALT_OFF: usize = CSUM_ALG_OFF + CSUM_ALG_L;
const UUID_OFF: usize = SALT_OFF + SALT_LEN;
const SUBSYSTEM_OFF: usize = UUID_OFF + UUID_L;
const HDR_OFFSET_OFF: usize = SUBSYSTEM_OFF + SUBSYSTEM_L;
const CSUM_OFF: usize = HDR_OFFSET_OFF + 8 + 184;
const BIN_L: usize = BINARY_HEADER_SIZE as usize;

const _: () = assert!(UUID_OFF == 168);
const _: () = assert!(CSUM_OFF == 448);

/// Smallest and largest `hdr_size` accepted in a binary header (cryptsetup
/// `hdr_disk_sanity_check_pre`); the exact set is enforced through `config.json_size`.
const HDR_SIZE_MIN: u64 = METADATA_SIZES[0];
const HDR_SIZE_MAX: u64 = METADATA_SIZES[8];

/// Why a LUKS2 header copy (or both) was refused.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[non_exhaustive]
pub enum Luks2Error {
    /// Fewer bytes than the copy needs.
    #[error("LUKS2 header at offset {offset} needs {need} bytes, got {got}")]
    Truncated {
        /// Offset of the copy.
        offset: u64,
        /// Bytes needed.
        need: u64,
        /// Bytes given.
        got: u64,
    },
    /// Wrong magic for this copy.
    #[error("no LUKS2 {kind} header magic at offset {offset}")]
    BadMagic {
        /// Which copy was expected.
        kind: CopyKind,
        /// Offset.
        offset: u64,
    },
    /// Version other than 2 (1 means LUKS1: see [`crate::luks1`]).
    #[error("unsupported LUKS2 header version {0}")]
    BadVersion(u16),
    /// `hdr_offset` differs from where the copy was found.
    #[error("LUKS2 header found at offset {actual} says it is at offset {recorded}")]
    OffsetMismatch {
        /// Where it was read.
        actual: u64,
        /// Its `hdr_offset`.
        recorded: u64,
    },
    /// `hdr_size` outside 16 KiB..=4 MiB.
    #[error("LUKS2 header has bogus size {0:#x}")]
    BadHdrSize(u64),
    /// A secondary copy's offset is not its `hdr_size`.
    #[error("secondary LUKS2 header at offset {offset} has size {hdr_size:#x}; it must sit at its size")]
    SecondaryOffsetNotHdrSize {
        /// Offset.
        offset: u64,
        /// Its hdr_size.
        hdr_size: u64,
    },
    /// `checksum_alg` is not one this implementation computes.
    #[error("LUKS2 header checksum algorithm {0:?} is not supported")]
    UnsupportedChecksum(String),
    /// The checksum does not match.
    #[error("LUKS2 header checksum mismatch at offset {0}")]
    ChecksumMismatch(u64),
    /// The binary header and checksum are fine but the JSON metadata is not.
    #[error("LUKS2 JSON metadata at offset {offset} is invalid")]
    Metadata {
        /// Offset of the copy.
        offset: u64,
        /// The copy's hdr_size (where its secondary would be).
        hdr_size: u64,
        /// What is wrong.
        #[source]
        source: MetadataError,
    },
    /// Neither copy is valid. The primary's reason is the source; the secondary's is kept
    /// in `secondary`.
    #[error("no valid LUKS2 header: both copies are damaged")]
    NoValidCopy {
        /// Why the primary failed.
        #[source]
        primary: Box<Luks2Error>,
        /// Why the secondary failed.
        secondary: Box<Luks2Error>,
    },
    /// On encode: a text value does not fit its field (with its NUL).
    #[error("LUKS2 header field {field} takes at most {max} bytes, got {len}")]
    FieldTooLong {
        /// Field name.
        field: &'static str,
        /// Maximum length without the NUL.
        max: usize,
        /// Given length.
        len: usize,
    },
}

impl Luks2Error {
    /// `true` if the copy's binary header and checksum were fine and only its JSON failed
    /// (cryptsetup's `HDR_OBSOLETE` rather than `HDR_FAIL`). Such a copy still tells where
    /// the secondary is, and stops the secondary-offset scan.
    pub fn failed_in_json(&self) -> bool {
        matches!(self, Self::Metadata { .. })
    }
}

/// Which copy.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum CopyKind {
    /// At offset 0, magic `LUKS\xba\xbe`.
    Primary,
    /// At offset `hdr_size`, magic `SKUL\xba\xbe`.
    Secondary,
}

impl std::fmt::Display for CopyKind {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(match self {
            Self::Primary => "primary",
            Self::Secondary => "secondary",
        })
    }
}

/// A decoded 4096-byte binary header (before the checksum is checked).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct BinaryHeader {
    /// Which magic it carries.
    pub kind: CopyKind,
    /// `version` (2).
    pub version: u16,
    /// `hdr_size`.
    pub hdr_size: u64,
    /// `seqid`.
    pub seqid: u64,
    /// `label`.
    pub label: String,
    /// `checksum_alg`.
    pub checksum_alg: String,
    /// `salt`.
    pub salt: [u8; SALT_LEN],
    /// `uuid`.
    pub uuid: String,
    /// `subsystem`.
    pub subsystem: String,
    /// `hdr_offset`.
    pub hdr_offset: u64,
    /// `csum` as stored.
    pub csum: [u8; CHECKSUM_LEN],
}

fn be64(b: &[u8], off: usize) -> u64 {
    let mut a = [0u8; 8];
    a.copy_from_slice(&b[off..off + 8]);
    u64::from_be_bytes(a)
}

/// A NUL-terminated field; like cryptsetup, its last byte is treated as NUL.
fn text(b: &[u8], off: usize, len: usize) -> String {
    let raw = &b[off..off + len - 1];
    let end = raw.iter().position(|&c| c == 0).unwrap_or(raw.len());
    String::from_utf8_lossy(&raw[..end]).into_owned()
}

fn put_text(out: &mut [u8], off: usize, len: usize, v: &str, field: &'static str) -> Result<(), Luks2Error> {
    let b = v.as_bytes();
    if b.len() > len - 1 || b.contains(&0) {
        return Err(Luks2Error::FieldTooLong { field, max: len - 1, len: b.len() });
    }
    out[off..off + b.len()].copy_from_slice(b);
    Ok(())
}

/// The `hdr_size` of a binary header, from its first 16 bytes, without any check (to
/// know how much to read). `None` if fewer than 16 bytes are given.
pub fn hdr_size_of(first_bytes: &[u8]) -> Option<u64> {
    (first_bytes.len() >= HDR_SIZE_OFF + 8).then(|| be64(first_bytes, HDR_SIZE_OFF))
}

impl BinaryHeader {
    /// Decode the binary header found at device offset `offset` (0 = primary, anything
    /// else = secondary) and run cryptsetup's checks before the checksum
    /// (`hdr_disk_sanity_check_pre`): magic, version, `hdr_offset`, `hdr_size` range, and a
    /// secondary sitting at its own `hdr_size`.
    pub fn decode(bytes: &[u8], offset: u64) -> Result<Self, Luks2Error> {
        if bytes.len() < BIN_L {
            return Err(Luks2Error::Truncated { offset, need: BINARY_HEADER_SIZE, got: bytes.len() as u64 });
        }
        let b = &bytes[..BIN_L];
        let kind = if offset == 0 { CopyKind::Primary } else { CopyKind::Secondary };
        let magic = match kind {
            CopyKind::Primary => MAGIC_PRIMARY,
            CopyKind::Secondary => MAGIC_SECONDARY,
        };
        if b[..MAGIC_L] != magic {
            return Err(Luks2Error::BadMagic { kind, offset });
        }
        let version = u16::from_be_bytes([b[VERSION_OFF], b[VERSION_OFF + 1]]);
        if version != 2 {
            return Err(Luks2Error::BadVersion(version));
        }
        let hdr_offset = be64(b, HDR_OFFSET_OFF);
        if hdr_offset != offset {
            return Err(Luks2Error::OffsetMismatch { actual: offset, recorded: hdr_offset });
        }
        let hdr_size = be64(b, HDR_SIZE_OFF);
        if !(HDR_SIZE_MIN..=HDR_SIZE_MAX).contains(&hdr_size) {
            return Err(Luks2Error::BadHdrSize(hdr_size));
        }
        if kind == CopyKind::Secondary && offset != hdr_size {
            return Err(Luks2Error::SecondaryOffsetNotHdrSize { offset, hdr_size });
        }
        let mut salt = [0u8; SALT_LEN];
        salt.copy_from_slice(&b[SALT_OFF..SALT_OFF + SALT_LEN]);
        let mut csum = [0u8; CHECKSUM_LEN];
        csum.copy_from_slice(&b[CSUM_OFF..CSUM_OFF + CHECKSUM_LEN]);
        Ok(Self {
            kind,
            version,
            hdr_size,
            seqid: be64(b, SEQID_OFF),
            label: text(b, LABEL_OFF, LABEL_L),
            checksum_alg: text(b, CSUM_ALG_OFF, CSUM_ALG_L),
            salt,
            uuid: text(b, UUID_OFF, UUID_L),
            subsystem: text(b, SUBSYSTEM_OFF, SUBSYSTEM_L),
            hdr_offset,
            csum,
        })
    }

    /// Encode to 4096 bytes (with `csum` as set in `self`).
    pub fn encode(&self) -> Result<Vec<u8>, Luks2Error> {
        let mut out = vec![0u8; BIN_L];
        out[..MAGIC_L].copy_from_slice(match self.kind {
            CopyKind::Primary => &MAGIC_PRIMARY,
            CopyKind::Secondary => &MAGIC_SECONDARY,
        });
        out[VERSION_OFF..VERSION_OFF + 2].copy_from_slice(&self.version.to_be_bytes());
        out[HDR_SIZE_OFF..HDR_SIZE_OFF + 8].copy_from_slice(&self.hdr_size.to_be_bytes());
        out[SEQID_OFF..SEQID_OFF + 8].copy_from_slice(&self.seqid.to_be_bytes());
        put_text(&mut out, LABEL_OFF, LABEL_L, &self.label, "label")?;
        put_text(&mut out, CSUM_ALG_OFF, CSUM_ALG_L, &self.checksum_alg, "checksum_alg")?;
        out[SALT_OFF..SALT_OFF + SALT_LEN].copy_from_slice(&self.salt);
        put_text(&mut out, UUID_OFF, UUID_L, &self.uuid, "uuid")?;
        put_text(&mut out, SUBSYSTEM_OFF, SUBSYSTEM_L, &self.subsystem, "subsystem")?;
        out[HDR_OFFSET_OFF..HDR_OFFSET_OFF + 8].copy_from_slice(&self.hdr_offset.to_be_bytes());
        out[CSUM_OFF..CSUM_OFF + CHECKSUM_LEN].copy_from_slice(&self.csum);
        Ok(out)
    }
}

/// Checksum of a copy: `alg(binary header with csum zeroed ‖ JSON area)`, zero-padded.
fn checksum(alg: &str, bin: &[u8], json_area: &[u8]) -> Result<[u8; CHECKSUM_LEN], Luks2Error> {
    let mut zeroed = bin[..BIN_L].to_vec();
    zeroed[CSUM_OFF..CSUM_OFF + CHECKSUM_LEN].fill(0);
    fn run<D: sha2::Digest>(a: &[u8], b: &[u8], out: &mut [u8; CHECKSUM_LEN]) {
        let mut h = D::new();
        h.update(a);
        h.update(b);
        let d = h.finalize();
        out[..d.len()].copy_from_slice(&d);
    }
    let mut out = [0u8; CHECKSUM_LEN];
    match alg {
        "sha256" => run::<sha2::Sha256>(&zeroed, json_area, &mut out),
        "sha512" => run::<sha2::Sha512>(&zeroed, json_area, &mut out),
        "sha384" => run::<sha2::Sha384>(&zeroed, json_area, &mut out),
        "sha224" => run::<sha2::Sha224>(&zeroed, json_area, &mut out),
        other => return Err(Luks2Error::UnsupportedChecksum(other.to_owned())),
    }
    Ok(out)
}

/// The copy-independent content of a LUKS2 header (cryptsetup `struct luks2_hdr`).
#[derive(Debug, Clone, PartialEq)]
pub struct Luks2Header {
    /// One metadata copy's size (binary header + JSON area).
    pub hdr_size: u64,
    /// Sequence id of the copy this was read from.
    pub seqid: u64,
    /// Label (at most 47 bytes).
    pub label: String,
    /// Subsystem (at most 47 bytes).
    pub subsystem: String,
    /// Checksum algorithm (`sha256`).
    pub checksum_alg: String,
    /// UUID text.
    pub uuid: String,
    /// The JSON metadata.
    pub metadata: Luks2Metadata,
}

/// The per-copy salts.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct HeaderSalts {
    /// Salt of the primary copy.
    pub primary: [u8; SALT_LEN],
    /// Salt of the secondary copy.
    pub secondary: [u8; SALT_LEN],
}

/// One copy, decoded and validated.
#[derive(Debug, Clone, PartialEq)]
pub struct DecodedCopy {
    /// The header content.
    pub header: Luks2Header,
    /// Which copy.
    pub kind: CopyKind,
    /// Its salt.
    pub salt: [u8; SALT_LEN],
    /// Length of its JSON text (the rest of the area is NUL).
    pub json_len: usize,
}

/// Decode and validate one copy from `bytes`, which start at device offset `offset` (0 for
/// the primary) and hold at least the copy's `hdr_size` bytes (more are ignored).
pub fn decode_copy(bytes: &[u8], offset: u64) -> Result<DecodedCopy, Luks2Error> {
    let bin = BinaryHeader::decode(bytes, offset)?;
    let hdr_size = bin.hdr_size;
    let end = usize::try_from(hdr_size).unwrap_or(usize::MAX);
    if bytes.len() < end {
        return Err(Luks2Error::Truncated { offset, need: hdr_size, got: bytes.len() as u64 });
    }
    let json_area = &bytes[BIN_L..end];
    let csum = checksum(&bin.checksum_alg, bytes, json_area)?;
    if csum != bin.csum {
        return Err(Luks2Error::ChecksumMismatch(offset));
    }
    let (metadata, json_len) = Luks2Metadata::decode_json_area(json_area)
        .map_err(|source| Luks2Error::Metadata { offset, hdr_size, source })?;
    Ok(DecodedCopy {
        header: Luks2Header {
            hdr_size,
            seqid: bin.seqid,
            label: bin.label,
            subsystem: bin.subsystem,
            checksum_alg: bin.checksum_alg,
            uuid: bin.uuid,
            metadata,
        },
        kind: bin.kind,
        salt: bin.salt,
        json_len,
    })
}

/// Where to look for the secondary copy, given how the primary fared: at its `hdr_size`
/// if its binary header and checksum were good, else at every offset in
/// [`METADATA_SIZES`], in order (take the first candidate for which
/// [`Luks2Error::failed_in_json`] is true or that decodes).
pub fn secondary_offsets(primary: &Result<DecodedCopy, Luks2Error>) -> Vec<u64> {
    match primary {
        Ok(c) => vec![c.header.hdr_size],
        Err(Luks2Error::Metadata { hdr_size, .. }) => vec![*hdr_size],
        Err(_) => METADATA_SIZES.to_vec(),
    }
}

/// The header to use, and what must be rewritten.
#[derive(Debug, Clone, PartialEq)]
pub struct Selected {
    /// The chosen header.
    pub header: Luks2Header,
    /// Which copy it came from.
    pub source: CopyKind,
    /// Salts to keep on the next write. For a copy that needs repair this is a
    /// placeholder until [`repair_plan`](Self::repair_plan) sets a fresh one.
    pub salts: HeaderSalts,
    /// The copy that is damaged or stale and should be rewritten from `header`.
    pub repair: Option<CopyKind>,
}

/// cryptsetup's choice between the two copies: the valid one; if both are valid, the higher
/// seqid (the primary on a tie); a copy that lost is marked for repair.
pub fn choose(
    primary: Result<DecodedCopy, Luks2Error>,
    secondary: Result<DecodedCopy, Luks2Error>,
) -> Result<Selected, Luks2Error> {
    let pick = |good: DecodedCopy, other_salt: Option<[u8; SALT_LEN]>, repair: Option<CopyKind>| {
        let own = good.salt;
        let other = other_salt.unwrap_or(own);
        let salts = match good.kind {
            CopyKind::Primary => HeaderSalts { primary: own, secondary: other },
            CopyKind::Secondary => HeaderSalts { primary: other, secondary: own },
        };
        Selected { source: good.kind, header: good.header, salts, repair }
    };
    match (primary, secondary) {
        (Ok(p), Ok(s)) => {
            if s.header.seqid > p.header.seqid {
                Ok(pick(s, Some(p.salt), Some(CopyKind::Primary)))
            } else {
                let repair = (p.header.seqid > s.header.seqid).then_some(CopyKind::Secondary);
                Ok(pick(p, Some(s.salt), repair))
            }
        }
        (Ok(p), Err(_)) => Ok(pick(p, None, Some(CopyKind::Secondary))),
        (Err(_), Ok(s)) => Ok(pick(s, None, Some(CopyKind::Primary))),
        (Err(p), Err(s)) => Err(Luks2Error::NoValidCopy { primary: Box::new(p), secondary: Box::new(s) }),
    }
}

/// Load from an in-memory image of the start of the device (or a header backup file):
/// the whole read procedure of the module docs, with `image` standing in for the device.
pub fn load(image: &[u8]) -> Result<Selected, Luks2Error> {
    let at = |off: u64| image.get(usize::try_from(off).unwrap_or(usize::MAX)..).unwrap_or(&[]);
    let primary = decode_copy(image, 0);
    let mut secondary = None;
    for off in secondary_offsets(&primary) {
        let candidate = decode_copy(at(off), off);
        let found = candidate.is_ok() || candidate.as_ref().is_err_and(Luks2Error::failed_in_json);
        // While scanning, report the most telling failure: a header that was there but bad
        // rather than an offset where there was nothing.
        let telling = |r: &Result<DecodedCopy, Luks2Error>| {
            !matches!(r, Err(Luks2Error::BadMagic { .. } | Luks2Error::Truncated { .. }))
        };
        if found || secondary.is_none() || (telling(&candidate) && !secondary.as_ref().is_some_and(telling)) {
            secondary = Some(candidate);
        }
        if found {
            break;
        }
    }
    let secondary =
        secondary.unwrap_or(Err(Luks2Error::Truncated { offset: 0, need: BINARY_HEADER_SIZE, got: 0 }));
    choose(primary, secondary)
}

/// One step of a [`WritePlan`].
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum WriteStep {
    /// Write `bytes` at byte `offset` of the metadata device.
    Write {
        /// Device offset.
        offset: u64,
        /// Data.
        bytes: Vec<u8>,
    },
    /// Make everything written so far durable (fsync / FLUSH) before going on.
    Flush,
}

/// Writes and flushes to carry out in order (see the module docs for why this order is
/// crash-safe). A failed step must stop the plan; the volume is then read-only until
/// reopened.
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct WritePlan {
    /// The steps.
    pub steps: Vec<WriteStep>,
}

impl Luks2Header {
    fn binary(&self, kind: CopyKind, seqid: u64, salt: [u8; SALT_LEN]) -> BinaryHeader {
        BinaryHeader {
            kind,
            version: 2,
            hdr_size: self.hdr_size,
            seqid,
            label: self.label.clone(),
            checksum_alg: self.checksum_alg.clone(),
            salt,
            uuid: self.uuid.clone(),
            subsystem: self.subsystem.clone(),
            hdr_offset: match kind {
                CopyKind::Primary => 0,
                CopyKind::Secondary => self.hdr_size,
            },
            csum: [0; CHECKSUM_LEN],
        }
    }

    /// The JSON area both copies share, validated.
    fn json_area(&self) -> Result<Vec<u8>, Luks2Error> {
        if !METADATA_SIZES.contains(&self.hdr_size) {
            return Err(Luks2Error::BadHdrSize(self.hdr_size));
        }
        self.metadata
            .encode_json_area(self.hdr_size - BINARY_HEADER_SIZE)
            .map_err(|source| Luks2Error::Metadata { offset: 0, hdr_size: self.hdr_size, source })
    }

    /// One copy: (binary header with zero checksum, JSON area, binary header with checksum).
    fn copy_parts(
        &self,
        kind: CopyKind,
        seqid: u64,
        salt: [u8; SALT_LEN],
        json: &[u8],
    ) -> Result<(Vec<u8>, Vec<u8>), Luks2Error> {
        let mut bin = self.binary(kind, seqid, salt);
        let unsummed = bin.encode()?;
        bin.csum = checksum(&self.checksum_alg, &unsummed, json)?;
        Ok((unsummed, bin.encode()?))
    }

    /// Encode both copies with sequence id `seqid`: `(primary, secondary)`, each
    /// `hdr_size` bytes (binary header with checksum, then JSON area).
    pub fn encode(&self, seqid: u64, salts: &HeaderSalts) -> Result<(Vec<u8>, Vec<u8>), Luks2Error> {
        let json = self.json_area()?;
        let mut out = Vec::with_capacity(2);
        for (kind, salt) in [(CopyKind::Primary, salts.primary), (CopyKind::Secondary, salts.secondary)] {
            let (_, bin) = self.copy_parts(kind, seqid, salt, &json)?;
            let mut copy = bin;
            copy.extend_from_slice(&json);
            out.push(copy);
        }
        let secondary = out.pop().unwrap_or_default();
        let primary = out.pop().unwrap_or_default();
        Ok((primary, secondary))
    }

    fn push_copy(
        &self,
        plan: &mut WritePlan,
        kind: CopyKind,
        seqid: u64,
        salt: [u8; SALT_LEN],
        json: &[u8],
    ) -> Result<(), Luks2Error> {
        let offset = match kind {
            CopyKind::Primary => 0,
            CopyKind::Secondary => self.hdr_size,
        };
        let (unsummed, summed) = self.copy_parts(kind, seqid, salt, json)?;
        plan.steps.push(WriteStep::Write { offset, bytes: unsummed });
        plan.steps.push(WriteStep::Write { offset: offset + BINARY_HEADER_SIZE, bytes: json.to_vec() });
        plan.steps.push(WriteStep::Write { offset, bytes: summed });
        plan.steps.push(WriteStep::Flush);
        Ok(())
    }

    /// The crash-safe update of both copies with sequence id `seqid` (the caller passes the
    /// on-disk seqid + 1, as cryptsetup bumps it before writing): primary, flush,
    /// secondary, flush. The whole JSON area is written, so a shorter JSON leaves no stale
    /// bytes behind.
    pub fn write_plan(&self, seqid: u64, salts: &HeaderSalts) -> Result<WritePlan, Luks2Error> {
        let json = self.json_area()?;
        let mut plan = WritePlan::default();
        self.push_copy(&mut plan, CopyKind::Primary, seqid, salts.primary, &json)?;
        self.push_copy(&mut plan, CopyKind::Secondary, seqid, salts.secondary, &json)?;
        Ok(plan)
    }
}

impl Selected {
    /// The plan that rewrites the copy marked in [`repair`](Self::repair) from the chosen
    /// header, with `fresh_salt` for it and the chosen copy's seqid (cryptsetup always
    /// regenerates the salt of a recovered copy). `None` if nothing needs repair. Updates
    /// `salts`.
    pub fn repair_plan(&mut self, fresh_salt: [u8; SALT_LEN]) -> Result<Option<WritePlan>, Luks2Error> {
        let Some(kind) = self.repair else {
            return Ok(None);
        };
        let json = self.header.json_area()?;
        let mut plan = WritePlan::default();
        self.header.push_copy(&mut plan, kind, self.header.seqid, fresh_salt, &json)?;
        match kind {
            CopyKind::Primary => self.salts.primary = fresh_salt,
            CopyKind::Secondary => self.salts.secondary = fresh_salt,
        }
        Ok(Some(plan))
    }
}

impl WritePlan {
    /// Apply the plan to an in-memory image (tests, header backup files). Grows the image
    /// as needed; `Flush` is a no-op.
    pub fn apply_to(&self, image: &mut Vec<u8>) {
        for step in &self.steps {
            if let WriteStep::Write { offset, bytes } = step {
                let start = usize::try_from(*offset).unwrap_or(usize::MAX);
                let end = start.saturating_add(bytes.len());
                if image.len() < end {
                    image.resize(end, 0);
                }
                image[start..end].copy_from_slice(bytes);
            }
        }
    }
}
