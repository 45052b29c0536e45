//! dm-integrity internal hashes: the per-block tag exactly as Linux computes it
//! (`drivers/md/dm-integrity.c`, `integrity_sector_checksum`).
//!
//! ```text
//!   tag = H( salt[16]          if the superblock has FIXED_HMAC (fix_hmac)
//!          ‖ le64(sector)      logical 512-byte sector of the block's start on the
//!                              dm-integrity device (a multiple of block/512)
//!          ‖ data[block_size] )
//!   stored: the first tag_size bytes of the digest; if the digest is shorter than
//!           tag_size, the rest is zero.
//! ```
//!
//! `H` is the kernel crypto API `shash` named in `internal_hash:<alg>[:<hexkey>]`; the names
//! and the exact byte output of each are:
//!
//! | kernel name     | digest | output bytes                                                   |
//! |-----------------|-------:|----------------------------------------------------------------|
//! | `crc32c`        | 4      | le32 of standard CRC-32C (init ~0, final ~); key = le32 seed    |
//! | `crc32`         | 4      | le32 of raw CRC-32 (IEEE, reflected), init 0, **no** final xor; key = le32 seed |
//! | `xxhash64`      | 8      | le64 of XXH64 with seed 0; key = le64 seed                      |
//! | `sha1`          | 20     | SHA-1                                                           |
//! | `sha256`        | 32     | SHA-256                                                         |
//! | `sha512`        | 64     | SHA-512                                                         |
//! | `blake2b-256`   | 32     | BLAKE2b with digest length 32 (unkeyed)                          |
//! | `hmac(sha1)`    | 20     | HMAC-SHA-1 (key required)                                       |
//! | `hmac(sha256)`  | 32     | HMAC-SHA-256 (key required)                                     |
//! | `hmac(sha512)`  | 64     | HMAC-SHA-512 (key required)                                     |
//!
//! cryptsetup's spellings (`hmac-sha256`, …) are accepted too. HMACs are keyed once in
//! [`TagHash::new`]; each tag clones the keyed state. [`TagHash`] is `Send + Sync`.
use std::fmt;

use hmac::{Hmac, KeyInit, Mac};
use sha1::Sha1;
use sha2::{Digest, Sha256, Sha512};

use crate::CryptoError;

/// Largest digest of any supported algorithm (SHA-512).
pub const MAX_DIGEST_SIZE: usize = 64;
/// Size of the FIXED_HMAC salt.
pub const SALT_SIZE: usize = 16;

/// A supported internal hash.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
#[non_exhaustive]
pub enum TagAlgorithm {
    /// `crc32c` (dm-integrity's default).
    Crc32c,
    /// `crc32`.
    Crc32,
    /// `xxhash64`.
    Xxhash64,
    /// `sha1`.
    Sha1,
    /// `sha256`.
    Sha256,
    /// `sha512`.
    Sha512,
    /// `blake2b-256`.
    Blake2b256,
    /// `hmac(sha1)`.
    HmacSha1,
    /// `hmac(sha256)`.
    HmacSha256,
    /// `hmac(sha512)`.
    HmacSha512,
}

impl TagAlgorithm {
    /// Parses a kernel crypto API name (`hmac(sha256)`) or cryptsetup's (`hmac-sha256`).
    pub fn from_name(name: &str) -> Option<Self> {
        Some(match name {
            "crc32c" => TagAlgorithm::Crc32c,
            "crc32" => TagAlgorithm::Crc32,
            "xxhash64" => TagAlgorithm::Xxhash64,
            "sha1" => TagAlgorithm::Sha1,
            "sha256" => TagAlgorithm::Sha256,
            "sha512" => TagAlgorithm::Sha512,
            "blake2b-256" => TagAlgorithm::Blake2b256,
            "hmac(sha1)" | "hmac-sha1" => TagAlgorithm::HmacSha1,
            "hmac(sha256)" | "hmac-sha256" => TagAlgorithm::HmacSha256,
            "hmac(sha512)" | "hmac-sha512" => TagAlgorithm::HmacSha512,
            _ => return None,
        })
    }
    /// The kernel crypto API name, as in the `internal_hash:` table argument.
    pub fn kernel_name(self) -> &'static str {
        match self {
            TagAlgorithm::Crc32c => "crc32c",
            TagAlgorithm::Crc32 => "crc32",
            TagAlgorithm::Xxhash64 => "xxhash64",
            TagAlgorithm::Sha1 => "sha1",
            TagAlgorithm::Sha256 => "sha256",
            TagAlgorithm::Sha512 => "sha512",
            TagAlgorithm::Blake2b256 => "blake2b-256",
            TagAlgorithm::HmacSha1 => "hmac(sha1)",
            TagAlgorithm::HmacSha256 => "hmac(sha256)",
            TagAlgorithm::HmacSha512 => "hmac(sha512)",
        }
    }
    /// `crypto_shash_digestsize`: also the default tag size.
    pub fn digest_size(self) -> usize {
        match self {
            TagAlgorithm::Crc32c | TagAlgorithm::Crc32 => 4,
            TagAlgorithm::Xxhash64 => 8,
            TagAlgorithm::Sha1 | TagAlgorithm::HmacSha1 => 20,
            TagAlgorithm::Sha256 | TagAlgorithm::HmacSha256 | TagAlgorithm::Blake2b256 => 32,
            TagAlgorithm::Sha512 | TagAlgorithm::HmacSha512 => 64,
        }
    }
    /// Whether the algorithm needs a key (the kernel's `CRYPTO_TFM_NEED_KEY`).
    pub fn is_keyed(self) -> bool {
        matches!(self, TagAlgorithm::HmacSha1 | TagAlgorithm::HmacSha256 | TagAlgorithm::HmacSha512)
    }
}

impl fmt::Display for TagAlgorithm {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.kernel_name())
    }
}

#[derive(Clone)]
enum Inner {
    /// Initial CRC register for `crc32c_append` (the kernel key's complement).
    Crc32c(u32),
    /// Kernel seed (initial raw register).
    Crc32(u32),
    Xxh64(u64),
    Sha1,
    Sha256,
    Sha512,
    Blake2b256,
    HmacSha1(Box<Hmac<Sha1>>),
    HmacSha256(Box<Hmac<Sha256>>),
    HmacSha512(Box<Hmac<Sha512>>),
}

/// A ready-to-use internal hash (keyed once).
#[derive(Clone)]
pub struct TagHash {
    alg: TagAlgorithm,
    inner: Inner,
    /// Key length, for `Debug` (the key itself is not kept: only the keyed state, which is
    /// wiped on drop).
    key_len: usize,
}

impl fmt::Debug for TagHash {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("TagHash")
            .field("alg", &self.alg)
            .field("key", &format_args!("{} bytes, redacted", self.key_len))
            .finish()
    }
}

fn le_seed<const N: usize>(alg: &str, key: &[u8]) -> Result<[u8; N], CryptoError> {
    key.try_into().map_err(|_| CryptoError::InvalidKeySize {
        spec: alg.to_string(),
        bits: key.len() * 8,
        expected: format!("{} bits (the seed)", N * 8),
    })
}

impl TagHash {
    /// `internal_hash:<alg>[:<key>]`. `alg` is a kernel name (`crc32c`, `hmac(sha256)`) or
    /// cryptsetup's (`hmac-sha256`). HMACs need a key (any length); crc32c/crc32 accept a
    /// 4-byte and xxhash64 an 8-byte little-endian seed, as the kernel's `setkey` does; the
    /// plain digests take no key.
    pub fn new<'a>(alg: &str, key: Option<&'a [u8]>) -> Result<Self, CryptoError> {
        let a = TagAlgorithm::from_name(alg).ok_or_else(|| CryptoError::Unsupported {
            spec: alg.to_string(),
            part: "internal hash".to_string(),
        })?;
        let no_key = |k: Option<&[u8]>| -> Result<(), CryptoError> {
            match k {
                Some(k) => Err(CryptoError::InvalidKeySize {
                    spec: alg.to_string(),
                    bits: k.len() * 8,
                    expected: "no key".to_string(),
                }),
                None => Ok(()),
            }
        };
        let need_key = |k: Option<&'a [u8]>| -> Result<&'a [u8], CryptoError> {
            k.ok_or_else(|| CryptoError::InvalidKeySize {
                spec: alg.to_string(),
                bits: 0,
                expected: "a key (the kernel refuses an unkeyed hmac: ENOKEY)".to_string(),
            })
        };
        let inner = match a {
            TagAlgorithm::Crc32c => {
                let seed = match key {
                    Some(k) => u32::from_le_bytes(le_seed::<4>(alg, k)?),
                    None => !0,
                };
                Inner::Crc32c(!seed)
            }
            TagAlgorithm::Crc32 => Inner::Crc32(match key {
                Some(k) => u32::from_le_bytes(le_seed::<4>(alg, k)?),
                None => 0,
            }),
            TagAlgorithm::Xxhash64 => Inner::Xxh64(match key {
                Some(k) => u64::from_le_bytes(le_seed::<8>(alg, k)?),
                None => 0,
            }),
            TagAlgorithm::Sha1 => no_key(key).map(|_| Inner::Sha1)?,
            TagAlgorithm::Sha256 => no_key(key).map(|_| Inner::Sha256)?,
            TagAlgorithm::Sha512 => no_key(key).map(|_| Inner::Sha512)?,
            TagAlgorithm::Blake2b256 => no_key(key).map(|_| Inner::Blake2b256)?,
            TagAlgorithm::HmacSha1 => Inner::HmacSha1(Box::new(hmac_key(alg, need_key(key)?)?)),
            TagAlgorithm::HmacSha256 => Inner::HmacSha256(Box::new(hmac_key(alg, need_key(key)?)?)),
            TagAlgorithm::HmacSha512 => Inner::HmacSha512(Box::new(hmac_key(alg, need_key(key)?)?)),
        };
        Ok(TagHash { alg: a, inner, key_len: key.map_or(0, <[u8]>::len) })
    }

    /// The algorithm.
    pub fn algorithm(&self) -> TagAlgorithm {
        self.alg
    }

    /// Digest size in bytes (the default tag size).
    pub fn digest_size(&self) -> usize {
        self.alg.digest_size()
    }

    /// The full digest of `salt ‖ le64(sector) ‖ data` into `digest` (first
    /// `digest_size()` bytes are written); returns the digest length.
    pub fn digest(
        &self,
        salt: Option<&[u8; SALT_SIZE]>,
        sector: u64,
        data: &[u8],
        digest: &mut [u8; MAX_DIGEST_SIZE],
    ) -> usize {
        let sec = sector.to_le_bytes();
        let salt: &[u8] = salt.map(|s| &s[..]).unwrap_or(&[]);
        match &self.inner {
            Inner::Crc32c(init) => {
                let c = crc32c::crc32c_append(*init, salt);
                let c = crc32c::crc32c_append(c, &sec);
                let c = crc32c::crc32c_append(c, data);
                digest[..4].copy_from_slice(&c.to_le_bytes());
                4
            }
            Inner::Crc32(seed) => {
                // crc32fast computes !raw(!init, ..); the kernel's crc32 is raw(seed, ..).
                let mut h = crc32fast::Hasher::new_with_initial(!*seed);
                h.update(salt);
                h.update(&sec);
                h.update(data);
                digest[..4].copy_from_slice(&(!h.finalize()).to_le_bytes());
                4
            }
            Inner::Xxh64(seed) => {
                let mut h = xxhash_rust::xxh64::Xxh64::new(*seed);
                h.update(salt);
                h.update(&sec);
                h.update(data);
                digest[..8].copy_from_slice(&h.digest().to_le_bytes());
                8
            }
            Inner::Sha1 => put(
                digest,
                Sha1::new().chain_update(salt).chain_update(sec).chain_update(data).finalize().as_slice(),
            ),
            Inner::Sha256 => put(
                digest,
                Sha256::new().chain_update(salt).chain_update(sec).chain_update(data).finalize().as_slice(),
            ),
            Inner::Sha512 => put(
                digest,
                Sha512::new().chain_update(salt).chain_update(sec).chain_update(data).finalize().as_slice(),
            ),
            Inner::Blake2b256 => put(
                digest,
                blake2::Blake2b256::new()
                    .chain_update(salt)
                    .chain_update(sec)
                    .chain_update(data)
                    .finalize()
                    .as_slice(),
            ),
            Inner::HmacSha1(m) => put(
                digest,
                m.as_ref()
                    .clone()
                    .chain_update(salt)
                    .chain_update(sec)
                    .chain_update(data)
                    .finalize()
                    .into_bytes()
                    .as_slice(),
            ),
            Inner::HmacSha256(m) => put(
                digest,
                m.as_ref()
                    .clone()
                    .chain_update(salt)
                    .chain_update(sec)
                    .chain_update(data)
                    .finalize()
                    .into_bytes()
                    .as_slice(),
            ),
            Inner::HmacSha512(m) => put(
                digest,
                m.as_ref()
                    .clone()
                    .chain_update(salt)
                    .chain_update(sec)
                    .chain_update(data)
                    .finalize()
                    .into_bytes()
                    .as_slice(),
            ),
        }
    }

    /// `integrity_sector_checksum` into `out` (`out.len()` = tag_size): the digest truncated
    /// to `out.len()`, or zero-padded when the digest is shorter.
    pub fn compute(&self, salt: Option<&[u8; SALT_SIZE]>, sector: u64, data: &[u8], out: &mut [u8]) {
        let mut d = [0u8; MAX_DIGEST_SIZE];
        let n = self.digest(salt, sector, data, &mut d);
        let k = n.min(out.len());
        out[..k].copy_from_slice(&d[..k]);
        out[k..].fill(0);
    }

    /// The digest of `data` alone (no salt, no sector): the journal MAC (`journal_mac:`),
    /// which the kernel applies to the section MAC input and to the superblock.
    pub fn mac(&self, data: &[u8]) -> Vec<u8> {
        let mut d = [0u8; MAX_DIGEST_SIZE];
        let n = self.digest_raw(data, &mut d);
        d[..n].to_vec()
    }

    fn digest_raw(&self, data: &[u8], digest: &mut [u8; MAX_DIGEST_SIZE]) -> usize {
        match &self.inner {
            Inner::Crc32c(init) => {
                digest[..4].copy_from_slice(&crc32c::crc32c_append(*init, data).to_le_bytes());
                4
            }
            Inner::Crc32(seed) => {
                let mut h = crc32fast::Hasher::new_with_initial(!*seed);
                h.update(data);
                digest[..4].copy_from_slice(&(!h.finalize()).to_le_bytes());
                4
            }
            Inner::Xxh64(seed) => {
                digest[..8].copy_from_slice(&xxhash_rust::xxh64::xxh64(data, *seed).to_le_bytes());
                8
            }
            Inner::Sha1 => put(digest, Sha1::digest(data).as_slice()),
            Inner::Sha256 => put(digest, Sha256::digest(data).as_slice()),
            Inner::Sha512 => put(digest, Sha512::digest(data).as_slice()),
            Inner::Blake2b256 => put(digest, blake2::Blake2b256::digest(data).as_slice()),
            Inner::HmacSha1(m) => {
                put(digest, m.as_ref().clone().chain_update(data).finalize().into_bytes().as_slice())
            }
            Inner::HmacSha256(m) => {
                put(digest, m.as_ref().clone().chain_update(data).finalize().into_bytes().as_slice())
            }
            Inner::HmacSha512(m) => {
                put(digest, m.as_ref().clone().chain_update(data).finalize().into_bytes().as_slice())
            }
        }
    }

    /// Tags of consecutive blocks: `data` is whole blocks of `block_size` bytes starting at
    /// logical sector `first_sector`; tag i goes to `tags[i·tag_size..(i+1)·tag_size]`.
    pub fn compute_blocks(
        &self,
        salt: Option<&[u8; SALT_SIZE]>,
        first_sector: u64,
        block_size: usize,
        data: &[u8],
        tag_size: usize,
        tags: &mut [u8],
    ) -> Result<(), CryptoError> {
        if block_size == 0 || data.len() % block_size != 0 || tags.len() != data.len() / block_size * tag_size
        {
            return Err(CryptoError::InvalidParams(format!(
                "compute_blocks: {} data bytes, block {block_size}, {} tag bytes of {tag_size}",
                data.len(),
                tags.len()
            )));
        }
        let step = (block_size / 512) as u64;
        for (i, (block, tag)) in
            data.chunks_exact(block_size).zip(tags.chunks_exact_mut(tag_size)).enumerate()
        {
            self.compute(salt, first_sector + i as u64 * step, block, tag);
        }
        Ok(())
    }
}

fn put(digest: &mut [u8; MAX_DIGEST_SIZE], d: &[u8]) -> usize {
    digest[..d.len()].copy_from_slice(d);
    d.len()
}

fn hmac_key<M: KeyInit>(alg: &str, key: &[u8]) -> Result<M, CryptoError> {
    <M as KeyInit>::new_from_slice(key).map_err(|_| CryptoError::InvalidKeySize {
        spec: alg.to_string(),
        bits: key.len() * 8,
        expected: "any length".to_string(),
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    fn hex(b: &[u8]) -> String {
        b.iter().map(|x| format!("{x:02x}")).collect()
    }

    /// Digest of the raw message (no sector prefix) through the same primitives, for
    /// standard test vectors: we feed the message as "salt"-less data by computing over the
    /// primitives directly.
    fn raw(alg: &str, key: Option<&[u8]>, msg: &[u8]) -> String {
        let t = TagHash::new(alg, key).unwrap();
        let mut d = [0u8; MAX_DIGEST_SIZE];
        // A 16-byte "salt" + 8-byte sector + data is just a concatenation: put the message in
        // whichever parts fit. Messages here are ≥ 24 bytes.
        let salt: [u8; 16] = msg[..16].try_into().unwrap();
        let sec = u64::from_le_bytes(msg[16..24].try_into().unwrap());
        let n = t.digest(Some(&salt), sec, &msg[24..], &mut d);
        hex(&d[..n])
    }

    const MSG: &[u8] = b"The quick brown fox jumps over the lazy dog";

    #[test]
    fn tag_primitives_match_standard_vectors() {
        // CRC-32C("The quick brown fox jumps over the lazy dog") = 0x22620404
        assert_eq!(raw("crc32c", None, MSG), hex(&0x2262_0404u32.to_le_bytes()));
        // standard CRC-32 of it = 0x414FA339; the kernel's raw crc32 (init 0, no final xor) is
        // a different value: check the relation raw(0, m) = !crc32_std_with_init(!0 → ...) below.
        let std = crc32fast::hash(MSG);
        assert_eq!(std, 0x414F_A339);
        // SHA-256 / SHA-1 / SHA-512 / BLAKE2b-256 / HMAC-SHA256 (RFC 4231-style known values).
        assert_eq!(raw("sha1", None, MSG), "2fd4e1c67a2d28fced849ee1bb76e7391b93eb12");
        assert_eq!(
            raw("sha256", None, MSG),
            "d7a8fbb307d7809469ca9abcb0082e4f8d5651e46d3cdb762d02d0bf37c9e592"
        );
        assert_eq!(
            raw("sha512", None, MSG),
            "07e547d9586f6a73f73fbac0435ed76951218fb7d0c8d788a309d785436bbb642e93a252a954f23912547d1e8a3b5ed6e1bfd7097821233fa0538f3db854fee6"
        );
        assert_eq!(
            raw("blake2b-256", None, MSG),
            "01718cec35cd3d796dd00020e0bfecb473ad23457d063b75eff29c0ffa2e58a9"
        );
        assert_eq!(
            raw("hmac(sha256)", Some(b"key"), MSG),
            "f7bc83f430538424b13298e6aa6fb143ef4d59a14946175997479dbc2d1a3cd8"
        );
        assert_eq!(
            raw("hmac-sha256", Some(b"key"), MSG),
            "f7bc83f430538424b13298e6aa6fb143ef4d59a14946175997479dbc2d1a3cd8"
        );
        assert_eq!(
            raw("hmac(sha512)", Some(b"key"), MSG),
            "b42af09057bac1e2d41708e48a902e09b5ff7f12ab428a4fe86653c73dd248fb82f948a549f7b791a5b41915ee4d1ec3935357e4e2317250d0372afa2ebeeb3a"
        );
        assert_eq!(raw("hmac(sha1)", Some(b"key"), MSG), "de7c9b85b8b78aa6bc8a7a36f70a90701c9db4d9");
        // XXH64("The quick brown fox jumps over the lazy dog", seed 0) = 0x0b242d361fda71bc
        assert_eq!(raw("xxhash64", None, MSG), hex(&0x0b24_2d36_1fda_71bcu64.to_le_bytes()));
    }

    /// The kernel's crc32 shash: crc32_le(seed 0, data) with no inversions. Check against a
    /// bitwise reference implementation.
    #[test]
    fn crc32_is_kernel_raw_crc32_le() {
        fn crc32_le_raw(mut crc: u32, data: &[u8]) -> u32 {
            for &b in data {
                crc ^= b as u32;
                for _ in 0..8 {
                    crc = if crc & 1 != 0 { (crc >> 1) ^ 0xEDB8_8320 } else { crc >> 1 };
                }
            }
            crc
        }
        let t = TagHash::new("crc32", None).unwrap();
        let data: Vec<u8> = (0..512u32).map(|i| (i * 7 + 3) as u8).collect();
        let mut out = [0u8; 4];
        t.compute(None, 8, &data, &mut out);
        let mut m = 8u64.to_le_bytes().to_vec();
        m.extend_from_slice(&data);
        assert_eq!(out, crc32_le_raw(0, &m).to_le_bytes());
        let seeded = TagHash::new("crc32", Some(&0x1234_5678u32.to_le_bytes())).unwrap();
        seeded.compute(None, 8, &data, &mut out);
        assert_eq!(out, crc32_le_raw(0x1234_5678, &m).to_le_bytes());
    }

    #[test]
    fn tag_is_truncated_or_zero_padded_to_tag_size() {
        let t = TagHash::new("sha256", None).unwrap();
        let data = [0x5au8; 4096];
        let mut full = [0u8; 32];
        t.compute(None, 80, &data, &mut full);
        let mut short = [0u8; 12];
        t.compute(None, 80, &data, &mut short);
        assert_eq!(short, full[..12]);
        let c = TagHash::new("crc32c", None).unwrap();
        let mut long = [0xffu8; 8];
        c.compute(None, 80, &data, &mut long);
        let mut four = [0u8; 4];
        c.compute(None, 80, &data, &mut four);
        assert_eq!(long[..4], four);
        assert_eq!(long[4..], [0; 4]);
    }

    #[test]
    fn salt_and_sector_are_hashed_in_kernel_order() {
        // salt ‖ le64(sector) ‖ data, fed as one stream.
        let t = TagHash::new("sha256", None).unwrap();
        let salt = [7u8; 16];
        let data = [1u8; 512];
        let mut out = [0u8; 32];
        t.compute(Some(&salt), 0x0102_0304_0506_0708, &data, &mut out);
        let mut m = salt.to_vec();
        m.extend_from_slice(&0x0102_0304_0506_0708u64.to_le_bytes());
        m.extend_from_slice(&data);
        assert_eq!(out.as_slice(), Sha256::digest(&m).as_slice());
    }

    #[test]
    fn tag_hash_refuses_bad_names_and_keys() {
        assert!(TagHash::new("md5", None).is_err());
        assert!(TagHash::new("hmac(sha256)", None).is_err());
        assert!(TagHash::new("sha256", Some(b"k")).is_err());
        assert!(TagHash::new("crc32c", Some(b"abc")).is_err());
        assert!(TagHash::new("crc32c", Some(&[0xff; 4])).is_ok());
        assert_eq!(TagHash::new("hmac-sha512", Some(b"k")).unwrap().digest_size(), 64);
    }

    #[test]
    fn mac_is_the_plain_digest_of_the_message() {
        let t = TagHash::new("hmac(sha256)", Some(b"key")).unwrap();
        assert_eq!(hex(&t.mac(MSG)), "f7bc83f430538424b13298e6aa6fb143ef4d59a14946175997479dbc2d1a3cd8");
        let c = TagHash::new("crc32c", None).unwrap();
        assert_eq!(c.mac(MSG), 0x2262_0404u32.to_le_bytes());
        assert_eq!(
            hex(&TagHash::new("sha1", None).unwrap().mac(MSG)),
            "2fd4e1c67a2d28fced849ee1bb76e7391b93eb12"
        );
    }

    #[test]
    fn compute_blocks_advances_sector_by_block() {
        let t = TagHash::new("crc32c", None).unwrap();
        let data: Vec<u8> = (0..3 * 4096).map(|i| (i % 251) as u8).collect();
        let mut tags = vec![0u8; 3 * 4];
        t.compute_blocks(None, 16, 4096, &data, 4, &mut tags).unwrap();
        for i in 0..3 {
            let mut one = [0u8; 4];
            t.compute(None, 16 + 8 * i as u64, &data[i * 4096..(i + 1) * 4096], &mut one);
            assert_eq!(tags[i * 4..i * 4 + 4], one);
        }
        assert!(t.compute_blocks(None, 0, 4096, &data[..100], 4, &mut tags).is_err());
    }
}
