//! Deterministic test data that depends on *where* it is written.
//!
//! `fill(buf, seed, off)` makes the bytes a function of `(seed, absolute byte offset)`, so data
//! that lands at the wrong offset, a stale block, a block from another writer and all-zero
//! blocks are all told apart by a plain comparison with `pattern(seed, off, len)`.

/// SplitMix64: a tiny, well-mixed, dependency-free generator step.
pub fn splitmix64(x: u64) -> u64 {
    let mut z = x.wrapping_add(0x9e37_79b9_7f4a_7c15);
    z = (z ^ (z >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
    z = (z ^ (z >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
    z ^ (z >> 31)
}

/// Fills `buf` with the content of stream `seed` at absolute byte offset `off`.
pub fn fill(buf: &mut [u8], seed: u64, off: u64) {
    let seed = splitmix64(seed);
    let mut i = 0usize;
    while i < buf.len() {
        let pos = off + i as u64;
        let word = splitmix64(seed ^ (pos / 8)).to_le_bytes();
        let start = (pos % 8) as usize;
        let n = (8 - start).min(buf.len() - i);
        buf[i..i + n].copy_from_slice(&word[start..start + n]);
        i += n;
    }
}

/// `len` bytes of stream `seed` at absolute byte offset `off`.
pub fn pattern(seed: u64, off: u64, len: usize) -> Vec<u8> {
    let mut v = vec![0u8; len];
    fill(&mut v, seed, off);
    v
}

/// FNV-1a 64-bit hash of `data`: a cheap fingerprint for traces and messages.
pub fn checksum(data: &[u8]) -> u64 {
    data.iter().fold(0xcbf2_9ce4_8422_2325u64, |h, &b| (h ^ u64::from(b)).wrapping_mul(0x0000_0100_0000_01b3))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn pattern_depends_only_on_seed_and_absolute_offset() {
        let whole = pattern(7, 1000, 4096);
        for (off, len) in [(1000u64, 13usize), (1003, 100), (2047, 3049)] {
            let part = pattern(7, off, len);
            let at = (off - 1000) as usize;
            assert_eq!(part, whole[at..at + len]);
        }
        assert_ne!(pattern(7, 0, 512), pattern(8, 0, 512));
        assert_ne!(pattern(7, 0, 512), pattern(7, 512, 512));
        assert!(pattern(0, 0, 512).iter().any(|&b| b != 0));
    }

    #[test]
    fn checksum_differs_when_one_byte_differs() {
        let mut a = pattern(1, 0, 512);
        let h = checksum(&a);
        a[100] ^= 1;
        assert_ne!(h, checksum(&a));
        assert_eq!(checksum(&[]), 0xcbf2_9ce4_8422_2325);
    }
}
