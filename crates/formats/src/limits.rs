//! Every bound sealdisk puts on a size, count or cost read from an image it did not make.
//!
//! An image's bytes are untrusted (a disk found in a drawer, an image from a CI cache). Each
//! number below is checked **before** it drives an allocation, a loop or a key derivation,
//! so a crafted header ends in a clear error within milliseconds, never in an allocation
//! abort or an hours-long KDF, and nothing is written to the image first.
//!
//! ```text
//!  hard bounds (no legitimate image exceeds them; no option lifts them)
//!    LUKS:       key sizes, AF stripes, keyslot/token/segment ids, metadata and keyslots
//!                area sizes, Argon2 memory (cryptsetup's 4 GiB)
//!    integrity:  tag size, block size, interleave, journal size held in memory
//!    dm table:   line length, key length, option count, sector counts
//!    FileVault2: metadata offsets (cryptsetup's 1 GiB), block size, XML extents
//!  soft bounds (a paranoid but legitimate header may exceed them): KdfLimits
//!    PBKDF2 iterations       --max-pbkdf2-iterations N
//!    Argon2 memory × time    --max-argon2-cost KIB_PASSES
//!    Argon2 memory ≤ ½ RAM   --allow-expensive-kdf (which also lifts the two above)
//!    Argon2 lanes
//! ```
//!
//! Where cryptsetup or the kernel has its own limit, it is named beside ours; the format
//! modules (`luks1`, `luks2`, `integrity`, `dm`) use these constants rather than their own.
//! The soft KDF bounds are enforced by `volume` before each derivation (it knows the
//! physical memory and the options); the checks themselves are here, sans-IO.

use std::fmt;

// ---------------------------------------------------------------------------------------
// LUKS1 and LUKS2
// ---------------------------------------------------------------------------------------

/// Largest volume key or keyslot-area key, in bytes (LUKS1 `keyBytes`, LUKS2 keyslot
/// `key_size` and `area.key_size`, a dm table's hex key).
///
/// cryptsetup refuses plain volume keys over 1024 bytes (`lib/setup.c`, "Invalid key size");
/// LUKS1 keys are 16, 32 or 64 bytes in practice (`_keyslot_repair` knows only those) and
/// the largest LUKS2 key is an authenticated cipher's (64-byte XTS key + 64-byte HMAC-SHA512
/// key). Key material of a keyslot is `key × 4000` bytes, so this also caps what one
/// keyslot read allocates at [`MAX_AF_MATERIAL_BYTES`].
pub const MAX_KEY_BYTES: u32 = 1024;

/// The AF stripe count (cryptsetup `LUKS_STRIPES`). LUKS1 refuses any other value
/// (`LUKS_check_keyslots`); cryptsetup's LUKS2 unlock ignores the header's `stripes` and
/// always uses 4000, so sealdisk refuses a LUKS2 keyslot whose `stripes` is not 4000
/// rather than run an AF merge of a size the header chooses.
pub const AF_STRIPES: u32 = 4000;

/// Bytes of AF-split key material one keyslot read may allocate: [`MAX_KEY_BYTES`] ×
/// [`AF_STRIPES`], rounded up to 512-byte sectors (4 000 KiB).
pub const MAX_AF_MATERIAL_BYTES: u64 = (MAX_KEY_BYTES as u64 * AF_STRIPES as u64).div_ceil(512) * 512;

/// LUKS1 keyslots (fixed by the format; cryptsetup `LUKS_NUMKEYS`).
pub const LUKS1_KEYSLOTS: u32 = 8;

/// LUKS2 keyslot, token and segment ids are below this (cryptsetup `LUKS2_OBJECTS_MAX` =
/// `LUKS2_KEYSLOTS_MAX` = `LUKS2_TOKENS_MAX` = `LUKS2_SEGMENT_MAX` = 32). cryptsetup can
/// neither create nor address a higher id; refusing them bounds the number of keyslots an
/// unlock tries (and so of KDF runs) to 32.
pub const LUKS2_OBJECTS_MAX: u32 = 32;

/// Largest LUKS2 metadata copy (binary header + JSON area): 4 MiB, so the JSON area is at
/// most 4 MiB − 4 KiB (cryptsetup `LUKS2_HDR_OFFSET_MAX`, the last of `LUKS2_HDR2_OFFSETS`).
pub const LUKS2_MAX_METADATA_SIZE: u64 = 0x40_0000;

/// Largest LUKS2 keyslots area (cryptsetup `LUKS2_MAX_KEYSLOTS_SIZE`, 128 MiB). Keyslot
/// areas lie inside it, so a LUKS2 keyslot read is bounded by it even before
/// [`MAX_AF_MATERIAL_BYTES`].
pub const LUKS2_MAX_KEYSLOTS_SIZE: u64 = 0x800_0000;

/// Largest LUKS2 header with its keyslots area (cryptsetup `LUKS2_HDR_MAX_MDA_SIZE`: two
/// 4 MiB metadata copies and 128 MiB of keyslots), 136 MiB.
pub const LUKS2_MAX_HEADER_BYTES: u64 = 2 * LUKS2_MAX_METADATA_SIZE + LUKS2_MAX_KEYSLOTS_SIZE;

/// Largest LUKS1 header with its keyslot areas (the end of the last keyslot's key
/// material), 136 MiB: what a header backup reads whole, and where unlock looks for key
/// material. cryptsetup packs LUKS1 keyslots from 4 KiB on (`LUKS_generate_phdr`: at most
/// 8 × 4 000 KiB for [`MAX_KEY_BYTES`] keys); a header converted from LUKS2 keeps its areas,
/// so the bound is LUKS2's ([`LUKS2_MAX_HEADER_BYTES`]). cryptsetup's own `luksHeaderBackup`
/// allocates whatever the header says.
pub const LUKS1_MAX_HEADER_BYTES: u64 = LUKS2_MAX_HEADER_BYTES;

/// Nesting depth of the LUKS2 JSON (json-c's `JSON_TOKENER_DEFAULT_DEPTH`, which
/// cryptsetup uses): bounds the recursion of every walk over the parsed value.
pub const LUKS2_JSON_MAX_DEPTH: usize = 32;

// ---------------------------------------------------------------------------------------
// KDF costs
// ---------------------------------------------------------------------------------------

/// Argon2 memory, KiB: at most 4 GiB (cryptsetup `crypt_pbkdf_get_limits`:
/// `max_memory = 4*1024*1024`). cryptsetup never writes more; a hard bound.
pub const ARGON2_MAX_MEMORY_KIB: u32 = 4 * 1024 * 1024;

/// Default bound on PBKDF2 iterations of one derivation (a keyslot's, or a digest's):
/// 2^28 = 268 435 456.
///
/// cryptsetup's own limit is `UINT32_MAX`. Its benchmark gives a few million iterations
/// per second of `--iter-time` (2.8 M for the default 2 s on the reference machine, at most
/// about 15 M on the fastest CPUs); `--iter-time 10000` gives up to about 70 M. 2^28 is
/// four times that, and about 35 s of PBKDF2-SHA256 in sealdisk on the reference machine
/// (SHA-512: about three times longer). Lifted by `--max-pbkdf2-iterations N` or
/// `--allow-expensive-kdf`.
pub const DEFAULT_MAX_PBKDF2_ITERATIONS: u32 = 1 << 28;

/// Default bound on Argon2 work, memory (KiB) × time cost (passes): 2^27 KiB·passes, e.g.
/// 1 GiB × 128 passes or 4 GiB × 32.
///
/// The run time of Argon2 is proportional to memory × passes (a small-memory header may
/// legitimately have a time cost in the millions, so the time cost alone is no measure).
/// cryptsetup's benchmark for the default 2 s and 1 GiB gives 4 to about 12 passes, about
/// 10× less; cryptsetup itself has no bound (`max_iterations = UINT32_MAX`). Lifted by
/// `--max-argon2-cost N` or `--allow-expensive-kdf`.
pub const DEFAULT_MAX_ARGON2_COST: u64 = 1 << 27;

/// Default bound on Argon2 lanes (`cpus`). cryptsetup creates at most 4
/// (`max_parallel = 4`) but does not check the header when unlocking (and starts one
/// thread per lane). Lanes add no work here (they run on the fixed crypto pool), so the
/// bound is generous: 64. Lifted by `--allow-expensive-kdf`.
pub const DEFAULT_MAX_ARGON2_LANES: u32 = 64;

// ---------------------------------------------------------------------------------------
// dm-integrity
// ---------------------------------------------------------------------------------------

/// Largest `integrity_tag_size` (Linux 6.1 `MAX_TAG_SIZE`; newer kernels allow 424 in
/// inline mode, which sealdisk refuses).
pub const INTEGRITY_MAX_TAG_SIZE: u32 = 255;

/// Largest `log2_sectors_per_block`: 4096-byte blocks (kernel `MAX_SECTORS_PER_BLOCK` = 8).
pub const INTEGRITY_MAX_LOG2_SECTORS_PER_BLOCK: u8 = 3;

/// Largest journal (or bitmap-mode journal area), bytes: 512 MiB.
///
/// The engine holds the journal in memory (`targets::IntegrityTarget`), and
/// `journal_sections` in the superblock decides its size; a sparse image can claim a
/// terabyte of journal. The kernel formats at most 64 MiB unless asked
/// (`DEFAULT_MAX_JOURNAL_SECTORS` = 131072 sectors), integritysetup's `--journal-size` can ask
/// for more; the kernel itself allocates the whole journal in pages at activation. 512 MiB is
/// 8× the kernel's default ceiling.
pub const INTEGRITY_MAX_JOURNAL_BYTES: u64 = 512 << 20;

// ---------------------------------------------------------------------------------------
// FileVault2 (Core Storage)
// ---------------------------------------------------------------------------------------

/// No FileVault2 metadata (disk label, volume groups descriptor, encrypted metadata blocks)
/// is read beyond this byte offset: 1 GiB, cryptsetup's `FVAULT2_MAX_OFF`. Bounds the
/// reads a crafted block offset or block count can cause. The PBKDF2 iterations of the
/// passphrase are bounded by [`KdfLimits`] like a LUKS keyslot's.
pub const FVAULT2_MAX_METADATA_OFFSET: u64 = 1 << 30;

// ---------------------------------------------------------------------------------------
// dm table lines
// ---------------------------------------------------------------------------------------

/// Longest table line read (from a file or stdin), bytes: 64 KiB. A crypt line is at most a
/// 2048-hex-digit key ([`MAX_KEY_BYTES`]), a device path (`PATH_MAX` 4096), a cipher and
/// ten short options; reading stops after this many bytes so `--table-file /dev/zero` fails
/// instead of filling memory.
pub const DM_MAX_TABLE_BYTES: u64 = 64 << 10;

/// Largest sector count in a table line (`len`, `offset`, `iv_offset`): byte offsets
/// (`sectors × 512`) must fit 64 bits, as `sector_t` does in the kernel.
pub const DM_MAX_SECTORS: u64 = u64::MAX >> 9;

/// Most optional parameters on a crypt line (kernel `crypt_ctr_optional`: 9, counted
/// before the parameters are parsed).
pub const DM_MAX_OPTIONAL_PARAMS: usize = 9;

// ---------------------------------------------------------------------------------------
// The soft KDF bounds
// ---------------------------------------------------------------------------------------

/// The KDF costs an unlock accepts from a header (one derivation each; an unlock tries at
/// most [`LUKS1_KEYSLOTS`] or [`LUKS2_OBJECTS_MAX`] keyslots, and verifies one digest per
/// keyslot that opens).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct KdfLimits {
    /// Most PBKDF2 iterations (keyslots and digests).
    pub max_pbkdf2_iterations: u32,
    /// Most Argon2 memory (KiB) × time cost.
    pub max_argon2_cost: u64,
    /// Most Argon2 lanes.
    pub max_argon2_lanes: u32,
    /// Refuse Argon2 memory above half of physical RAM (cryptsetup never benchmarks above
    /// it, `pbkdf_adjusted_phys_memory_kb`).
    pub half_ram_check: bool,
}

impl Default for KdfLimits {
    fn default() -> Self {
        KdfLimits {
            max_pbkdf2_iterations: DEFAULT_MAX_PBKDF2_ITERATIONS,
            max_argon2_cost: DEFAULT_MAX_ARGON2_COST,
            max_argon2_lanes: DEFAULT_MAX_ARGON2_LANES,
            half_ram_check: true,
        }
    }
}

impl KdfLimits {
    /// `--allow-expensive-kdf`: every soft bound lifted. The hard ones
    /// ([`ARGON2_MAX_MEMORY_KIB`], key sizes) still hold.
    pub fn unbounded() -> Self {
        KdfLimits {
            max_pbkdf2_iterations: u32::MAX,
            max_argon2_cost: u64::MAX,
            max_argon2_lanes: u32::MAX,
            half_ram_check: false,
        }
    }

    /// Checks one PBKDF2 derivation. `what` names it (`"keyslot 3"`, `"digest 0"`).
    pub fn check_pbkdf2(&self, what: &str, iterations: u32) -> Result<(), LimitError> {
        if iterations > self.max_pbkdf2_iterations {
            return Err(LimitError::Pbkdf2Iterations {
                what: what.to_owned(),
                iterations,
                max: self.max_pbkdf2_iterations,
            });
        }
        Ok(())
    }

    /// Checks one Argon2 derivation; `physical_kib` is the machine's RAM (`None`: unknown,
    /// the half-RAM check is skipped).
    pub fn check_argon2(
        &self,
        what: &str,
        time: u32,
        memory_kib: u32,
        lanes: u32,
        physical_kib: Option<u64>,
    ) -> Result<(), LimitError> {
        let what = what.to_owned();
        if memory_kib > ARGON2_MAX_MEMORY_KIB {
            return Err(LimitError::Argon2Memory { what, memory_kib });
        }
        if lanes > self.max_argon2_lanes {
            return Err(LimitError::Argon2Lanes { what, lanes, max: self.max_argon2_lanes });
        }
        let cost = u64::from(memory_kib) * u64::from(time);
        if cost > self.max_argon2_cost {
            return Err(LimitError::Argon2Cost { what, time, memory_kib, cost, max: self.max_argon2_cost });
        }
        if let (true, Some(ram)) = (self.half_ram_check, physical_kib) {
            if u64::from(memory_kib) > ram / 2 {
                return Err(LimitError::Argon2OverHalfRam { what, memory_kib, half_ram_kib: ram / 2 });
            }
        }
        Ok(())
    }
}

/// A number from an image over its bound. The message names the field, the value, the
/// bound and, for a soft bound, the option that lifts it.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[non_exhaustive]
pub enum LimitError {
    /// PBKDF2 iterations over [`KdfLimits::max_pbkdf2_iterations`].
    #[error(
        "{what}: PBKDF2 iterations {iterations} exceed the bound of {max}; if you trust this image, \
         raise it with --max-pbkdf2-iterations {iterations} (or --allow-expensive-kdf)"
    )]
    Pbkdf2Iterations {
        /// Keyslot or digest.
        what: String,
        /// From the header.
        iterations: u32,
        /// The bound.
        max: u32,
    },
    /// Argon2 memory over cryptsetup's 4 GiB.
    #[error(
        "{what}: Argon2 memory {memory_kib} KiB exceeds {} KiB (4 GiB), the most cryptsetup \
         allows; no option lifts this bound",
        ARGON2_MAX_MEMORY_KIB
    )]
    Argon2Memory {
        /// Keyslot.
        what: String,
        /// From the header.
        memory_kib: u32,
    },
    /// Argon2 memory over half of physical RAM.
    #[error(
        "{what}: Argon2 memory {memory_kib} KiB exceeds half of this machine's RAM ({half_ram_kib} KiB); \
         if you trust this image and have swap, allow it with --allow-expensive-kdf"
    )]
    Argon2OverHalfRam {
        /// Keyslot.
        what: String,
        /// From the header.
        memory_kib: u32,
        /// Half of MemTotal.
        half_ram_kib: u64,
    },
    /// Argon2 memory × time over [`KdfLimits::max_argon2_cost`].
    #[error(
        "{what}: Argon2 cost {cost} KiB·passes (memory {memory_kib} KiB × time {time}) exceeds the \
         bound of {max}; if you trust this image, raise it with --max-argon2-cost {cost} \
         (or --allow-expensive-kdf)"
    )]
    Argon2Cost {
        /// Keyslot.
        what: String,
        /// Time cost.
        time: u32,
        /// Memory, KiB.
        memory_kib: u32,
        /// memory × time.
        cost: u64,
        /// The bound.
        max: u64,
    },
    /// Argon2 lanes over [`KdfLimits::max_argon2_lanes`].
    #[error(
        "{what}: Argon2 parallel lanes {lanes} exceed the bound of {max} (cryptsetup creates at most 4); \
         if you trust this image, allow it with --allow-expensive-kdf"
    )]
    Argon2Lanes {
        /// Keyslot.
        what: String,
        /// From the header.
        lanes: u32,
        /// The bound.
        max: u32,
    },
    /// A key size over [`MAX_KEY_BYTES`].
    #[error("{what}: key size {bytes} bytes exceeds {MAX_KEY_BYTES} bytes")]
    KeySize {
        /// Field.
        what: String,
        /// From the header.
        bytes: u64,
    },
    /// AF stripes other than [`AF_STRIPES`].
    #[error("{what}: AF stripes {stripes} unsupported (cryptsetup only uses {AF_STRIPES})")]
    Stripes {
        /// Keyslot.
        what: String,
        /// From the header.
        stripes: u32,
    },
}

/// Checks a key size against [`MAX_KEY_BYTES`].
pub fn check_key_size(what: impl fmt::Display, bytes: u64) -> Result<(), LimitError> {
    if bytes > u64::from(MAX_KEY_BYTES) {
        return Err(LimitError::KeySize { what: what.to_string(), bytes });
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn pbkdf2_bound_names_field_value_and_option() {
        let l = KdfLimits::default();
        l.check_pbkdf2("keyslot 0", DEFAULT_MAX_PBKDF2_ITERATIONS).unwrap();
        let e = l.check_pbkdf2("keyslot 0", u32::MAX).unwrap_err();
        let m = e.to_string();
        assert!(m.contains("keyslot 0") && m.contains("4294967295") && m.contains("268435456"), "{m}");
        assert!(m.contains("--max-pbkdf2-iterations"), "{m}");
        KdfLimits::unbounded().check_pbkdf2("keyslot 0", u32::MAX).unwrap();
    }

    #[test]
    fn argon2_bounds() {
        let l = KdfLimits::default();
        let ram = Some(16u64 << 20);
        // cryptsetup's default header: 1 GiB, a few passes, 4 lanes.
        l.check_argon2("keyslot 0", 10, 1 << 20, 4, ram).unwrap();
        // Small memory, huge time (legitimate shape) within the cost bound.
        l.check_argon2("keyslot 0", 1_000_000, 32, 1, ram).unwrap();
        assert!(matches!(
            l.check_argon2("keyslot 0", 4, u32::MAX, 1, ram),
            Err(LimitError::Argon2Memory { .. })
        ));
        assert!(matches!(
            KdfLimits::unbounded().check_argon2("k", 4, ARGON2_MAX_MEMORY_KIB + 1, 1, ram),
            Err(LimitError::Argon2Memory { .. })
        ));
        assert!(matches!(
            l.check_argon2("keyslot 0", u32::MAX, 1 << 20, 4, ram),
            Err(LimitError::Argon2Cost { .. })
        ));
        assert!(matches!(
            l.check_argon2("keyslot 0", 4, 1 << 20, 1 << 20, ram),
            Err(LimitError::Argon2Lanes { .. })
        ));
        // 4 GiB on a machine with 4 GiB of RAM.
        let e = l.check_argon2("keyslot 1", 4, 4 << 20, 4, Some(4 << 20)).unwrap_err();
        assert!(matches!(e, LimitError::Argon2OverHalfRam { .. }));
        assert!(e.to_string().contains("--allow-expensive-kdf"));
        KdfLimits::unbounded().check_argon2("keyslot 1", u32::MAX, 4 << 20, 1 << 20, Some(4 << 20)).unwrap();
    }

    #[test]
    fn af_material_bound_is_what_the_key_bound_implies() {
        assert_eq!(MAX_AF_MATERIAL_BYTES, 4_096_000);
        check_key_size("keyslot 0 key_size", 1024).unwrap();
        assert!(check_key_size("keyslot 0 key_size", 1025).is_err());
    }
}
