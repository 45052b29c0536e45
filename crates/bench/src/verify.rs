//! Data verification: every written unit carries a header naming where it belongs.
//!
//! A write fills each verify unit (the target's logical block, so a request that lands torn
//! at block granularity still verifies per unit) with:
//!
//! ```text
//!   0   u64 le  VERIFY_MAGIC ("SDBENCH1")
//!   8   u64 le  byte offset of this unit on the target
//!  16   u64 le  run seed (the job's randseed)
//!  24   u64 le  generation (a per-write counter that varies the content)
//!  32   u32 le  crc32c of bytes 0..32 and 36..unit
//!  36   ...     pseudo-random bytes derived from (seed, offset, generation)
//! ```
//!
//! During the job a read checks every unit that carries the magic and this run's seed: its
//! offset and checksum must match. (A unit without them may be one no write has reached yet,
//! or one overlapping a write still in flight, which the device contract leaves unspecified.)
//! After the job every block a write completed on is read back once more, with nothing else
//! in flight, and every unit must be exactly what was written last: magic, seed, offset and
//! checksum.

use crate::rng::SplitMix64;

/// `"SDBENCH1"`.
pub const VERIFY_MAGIC: u64 = u64::from_le_bytes(*b"SDBENCH1");
/// Bytes of the header.
pub const HEADER: usize = 36;

/// Why a unit failed verification.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[non_exhaustive]
pub enum VerifyError {
    /// No header at a unit a write completed on.
    #[error("unit at offset {offset} has no verify header (expected data written by this run)")]
    MissingHeader {
        /// Byte offset of the unit.
        offset: u64,
    },
    /// The header names another offset: a misdirected write or read.
    #[error("unit at offset {offset} holds the data written for offset {found}")]
    WrongOffset {
        /// Where it was read.
        offset: u64,
        /// Where the header says it belongs.
        found: u64,
    },
    /// The checksum does not match the content.
    #[error("unit at offset {offset}: checksum mismatch (stored {stored:#010x}, computed {computed:#010x})")]
    BadChecksum {
        /// Byte offset of the unit.
        offset: u64,
        /// Checksum in the header.
        stored: u32,
        /// Checksum of the content.
        computed: u32,
    },
}

fn checksum(unit: &[u8]) -> u32 {
    let c = crc32c::crc32c(&unit[..32]);
    crc32c::crc32c_append(c, &unit[HEADER..])
}

/// Fills `buf` (which will be written at `offset`) with one header per `unit` bytes.
pub fn fill(buf: &mut [u8], offset: u64, unit: usize, seed: u64, generation: u64) {
    debug_assert!(unit >= 64 && buf.len() % unit == 0);
    for (i, u) in buf.chunks_exact_mut(unit).enumerate() {
        let off = offset + (i * unit) as u64;
        u[0..8].copy_from_slice(&VERIFY_MAGIC.to_le_bytes());
        u[8..16].copy_from_slice(&off.to_le_bytes());
        u[16..24].copy_from_slice(&seed.to_le_bytes());
        u[24..32].copy_from_slice(&generation.to_le_bytes());
        let mut rng = SplitMix64::new(seed ^ off.rotate_left(17) ^ generation.rotate_left(41));
        for w in u[HEADER..].chunks_mut(8) {
            let x = rng.next_u64().to_le_bytes();
            w.copy_from_slice(&x[..w.len()]);
        }
        let c = checksum(u);
        u[32..36].copy_from_slice(&c.to_le_bytes());
    }
}

/// Checks `buf`, read at `offset`. `strict`: every unit must carry this run's header
/// (read-back after the job); otherwise units without it are skipped (during the job).
/// Returns the number of units checked.
pub fn check(buf: &[u8], offset: u64, unit: usize, seed: u64, strict: bool) -> Result<u64, VerifyError> {
    let mut checked = 0;
    for (i, u) in buf.chunks_exact(unit).enumerate() {
        let off = offset + (i * unit) as u64;
        let le = |r: std::ops::Range<usize>| u64::from_le_bytes(u[r].try_into().expect("8 bytes"));
        if le(0..8) != VERIFY_MAGIC || le(16..24) != seed {
            if strict {
                return Err(VerifyError::MissingHeader { offset: off });
            }
            continue;
        }
        let found = le(8..16);
        if found != off {
            return Err(VerifyError::WrongOffset { offset: off, found });
        }
        let stored = u32::from_le_bytes(u[32..36].try_into().expect("4 bytes"));
        let computed = checksum(u);
        if stored != computed {
            return Err(VerifyError::BadChecksum { offset: off, stored, computed });
        }
        checked += 1;
    }
    Ok(checked)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn filled_units_verify_and_any_flip_is_caught() {
        let mut b = vec![0u8; 4 * 512];
        fill(&mut b, 8192, 512, 77, 3);
        assert_eq!(check(&b, 8192, 512, 77, true), Ok(4));
        for pos in [0usize, 9, 20, 33, 100, 511, 1024 + 300] {
            let mut c = b.clone();
            c[pos] ^= 0x40;
            assert!(check(&c, 8192, 512, 77, true).is_err(), "flip at {pos} not caught");
        }
    }

    #[test]
    fn data_read_from_the_wrong_place_is_named() {
        let mut b = vec![0u8; 1024];
        fill(&mut b, 0, 512, 1, 0);
        assert_eq!(check(&b, 4096, 512, 1, false), Err(VerifyError::WrongOffset { offset: 4096, found: 0 }));
    }

    #[test]
    fn unwritten_units_are_skipped_only_when_lenient() {
        let b = vec![0u8; 1024];
        assert_eq!(check(&b, 0, 512, 1, false), Ok(0));
        assert_eq!(check(&b, 0, 512, 1, true), Err(VerifyError::MissingHeader { offset: 0 }));
        // Another run's data (another seed) is not this run's.
        let mut c = vec![0u8; 512];
        fill(&mut c, 0, 512, 2, 0);
        assert_eq!(check(&c, 0, 512, 1, false), Ok(0));
    }

    #[test]
    fn generations_differ_in_content() {
        let mut a = vec![0u8; 512];
        let mut b = vec![0u8; 512];
        fill(&mut a, 0, 512, 1, 0);
        fill(&mut b, 0, 512, 1, 1);
        assert_ne!(a[HEADER..], b[HEADER..]);
    }
}
