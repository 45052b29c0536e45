//! The hashes cryptsetup accepts for `--hash`: one enum, one dispatch point for one-shot
//! digests, HMAC and PBKDF2-HMAC.
//!
//! ```text
//!   "sha256" / "SHA2-256" / "rmd160" ──FromStr──► HashAlg ─┬─ digest_into(parts, out)   AF diffuse, ESSIV salt
//!                                                          ├─ hmac(key, parts, out)
//!                                                          └─ pbkdf2(pw, salt, iter, out) LUKS keyslots, digests
//! ```
//!
//! Which names exist is decided by cryptsetup's crypto backend. Debian's cryptsetup 2.6 is
//! built with OpenSSL 3 (default and legacy providers): it maps `blake2b-512` and
//! `blake2s-256` to OpenSSL's names and passes every other name to
//! `EVP_get_digestbyname`, which matches case-insensitively and knows aliases
//! (`SHA2-256`, `rmd160`, ...). That is the set marked [`HashAlg::openssl_backend`]. The
//! libgcrypt backend (other distributions' builds) adds BLAKE2 at other digest lengths
//! (`blake2b-160/256/384`, `blake2s-128/160/224`) and GOST R 34.11-2012 (`stribog256`,
//! `stribog512`); volumes made there open here too. LUKS1 further needs a digest of at
//! least 20 bytes ([`LUKS1_MIN_DIGEST`]), so `md4`, `md5` and `blake2s-128` are LUKS2-only.
//!
//! Refused, as Debian's cryptsetup refuses them: `shake128`/`shake256` (XOFs), `mdc2`,
//! `crc32`, unknown names. OpenSSL's composite `md5-sha1` and its signature-algorithm
//! aliases (`sha256WithRSAEncryption`, OIDs) are accepted by that cryptsetup but not here.
//!
//! Implementations are RustCrypto's, with hash states wiped on drop (their `zeroize`
//! features). HMAC is RFC 2104 over the hash's block length; PBKDF2 is RFC 8018. For SHA-1
//! and SHA-2 PBKDF2 runs through the `pbkdf2` crate's HMAC; for the rest through
//! [`Hmac`] here, which keeps the keyed inner and outer states and clones them per
//! iteration, so every iteration costs exactly two compressions after the key setup.

use std::fmt;
use std::str::FromStr;

use sha2::digest::common::BlockSizeUser;
use sha2::digest::Digest;
use zeroize::Zeroize;

use crate::kdf::KdfError;

/// LUKS1's minimum digest length in bytes (`LUKS_DIGESTSIZE`): cryptsetup refuses LUKS1
/// hashes with a shorter output ("Requested LUKS hash ... is not supported").
pub const LUKS1_MIN_DIGEST: usize = 20;

/// A hash usable for PBKDF2, the AF splitter, LUKS digests and ESSIV.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
#[non_exhaustive]
pub enum HashAlg {
    /// `sha1`.
    Sha1,
    /// `sha224`.
    Sha224,
    /// `sha256` (cryptsetup's default).
    Sha256,
    /// `sha384`.
    Sha384,
    /// `sha512`.
    Sha512,
    /// `sha512-224` (SHA-512/224).
    Sha512_224,
    /// `sha512-256` (SHA-512/256).
    Sha512_256,
    /// `sha3-224`.
    Sha3_224,
    /// `sha3-256`.
    Sha3_256,
    /// `sha3-384`.
    Sha3_384,
    /// `sha3-512`.
    Sha3_512,
    /// `ripemd160`.
    Ripemd160,
    /// `whirlpool`.
    Whirlpool,
    /// `sm3` (GB/T 32905).
    Sm3,
    /// `md5` (LUKS2 only: too short for LUKS1).
    Md5,
    /// `md4` (LUKS2 only: too short for LUKS1).
    Md4,
    /// `blake2b-160` (libgcrypt builds).
    Blake2b160,
    /// `blake2b-256` (libgcrypt builds).
    Blake2b256,
    /// `blake2b-384` (libgcrypt builds).
    Blake2b384,
    /// `blake2b-512`.
    Blake2b512,
    /// `blake2s-128` (libgcrypt builds; LUKS2 only).
    Blake2s128,
    /// `blake2s-160` (libgcrypt builds).
    Blake2s160,
    /// `blake2s-224` (libgcrypt builds).
    Blake2s224,
    /// `blake2s-256`.
    Blake2s256,
    /// `stribog256` (GOST R 34.11-2012, 256-bit; libgcrypt builds).
    Stribog256,
    /// `stribog512` (GOST R 34.11-2012, 512-bit; libgcrypt builds).
    Stribog512,
}

/// Runs `$body` with `$D` bound to the RustCrypto type of `$alg`.
macro_rules! with_hash {
    ($alg:expr, $D:ident => $body:expr) => {{
        use blake2::digest::consts::{U20, U28, U48};
        match $alg {
            HashAlg::Sha1 => {
                type $D = sha1::Sha1;
                $body
            }
            HashAlg::Sha224 => {
                type $D = sha2::Sha224;
                $body
            }
            HashAlg::Sha256 => {
                type $D = sha2::Sha256;
                $body
            }
            HashAlg::Sha384 => {
                type $D = sha2::Sha384;
                $body
            }
            HashAlg::Sha512 => {
                type $D = sha2::Sha512;
                $body
            }
            HashAlg::Sha512_224 => {
                type $D = sha2::Sha512_224;
                $body
            }
            HashAlg::Sha512_256 => {
                type $D = sha2::Sha512_256;
                $body
            }
            HashAlg::Sha3_224 => {
                type $D = sha3::Sha3_224;
                $body
            }
            HashAlg::Sha3_256 => {
                type $D = sha3::Sha3_256;
                $body
            }
            HashAlg::Sha3_384 => {
                type $D = sha3::Sha3_384;
                $body
            }
            HashAlg::Sha3_512 => {
                type $D = sha3::Sha3_512;
                $body
            }
            HashAlg::Ripemd160 => {
                type $D = ripemd::Ripemd160;
                $body
            }
            HashAlg::Whirlpool => {
                type $D = whirlpool::Whirlpool;
                $body
            }
            HashAlg::Sm3 => {
                type $D = sm3::Sm3;
                $body
            }
            HashAlg::Md5 => {
                type $D = md5::Md5;
                $body
            }
            HashAlg::Md4 => {
                type $D = md4::Md4;
                $body
            }
            HashAlg::Blake2b160 => {
                type $D = blake2::Blake2b<U20>;
                $body
            }
            HashAlg::Blake2b256 => {
                type $D = blake2::Blake2b256;
                $body
            }
            HashAlg::Blake2b384 => {
                type $D = blake2::Blake2b<U48>;
                $body
            }
            HashAlg::Blake2b512 => {
                type $D = blake2::Blake2b512;
                $body
            }
            HashAlg::Blake2s128 => {
                type $D = blake2::Blake2s128;
                $body
            }
            HashAlg::Blake2s160 => {
                type $D = blake2::Blake2s<U20>;
                $body
            }
            HashAlg::Blake2s224 => {
                type $D = blake2::Blake2s<U28>;
                $body
            }
            HashAlg::Blake2s256 => {
                type $D = blake2::Blake2s256;
                $body
            }
            HashAlg::Stribog256 => {
                type $D = streebog::Streebog256;
                $body
            }
            HashAlg::Stribog512 => {
                type $D = streebog::Streebog512;
                $body
            }
        }
    }};
}

impl HashAlg {
    /// Every hash, in the order of the table in docs/book/src/ciphers.md.
    pub const ALL: &'static [HashAlg] = &[
        Self::Sha1,
        Self::Sha224,
        Self::Sha256,
        Self::Sha384,
        Self::Sha512,
        Self::Sha512_224,
        Self::Sha512_256,
        Self::Sha3_224,
        Self::Sha3_256,
        Self::Sha3_384,
        Self::Sha3_512,
        Self::Ripemd160,
        Self::Whirlpool,
        Self::Sm3,
        Self::Md5,
        Self::Md4,
        Self::Blake2b160,
        Self::Blake2b256,
        Self::Blake2b384,
        Self::Blake2b512,
        Self::Blake2s128,
        Self::Blake2s160,
        Self::Blake2s224,
        Self::Blake2s256,
        Self::Stribog256,
        Self::Stribog512,
    ];

    /// cryptsetup's name (what sealdisk writes into new headers).
    pub fn name(self) -> &'static str {
        self.names()[0]
    }

    /// Every name accepted for this hash, case-insensitively; the first is [`name`](Self::name).
    /// The others are the aliases OpenSSL's `EVP_get_digestbyname` resolves (and so
    /// cryptsetup accepts and may have written into a header).
    pub fn names(self) -> &'static [&'static str] {
        match self {
            Self::Sha1 => &["sha1", "sha-1", "ssl3-sha1"],
            Self::Sha224 => &["sha224", "sha-224", "sha2-224"],
            Self::Sha256 => &["sha256", "sha-256", "sha2-256"],
            Self::Sha384 => &["sha384", "sha-384", "sha2-384"],
            Self::Sha512 => &["sha512", "sha-512", "sha2-512"],
            Self::Sha512_224 => &["sha512-224", "sha-512/224", "sha2-512/224"],
            Self::Sha512_256 => &["sha512-256", "sha-512/256", "sha2-512/256"],
            Self::Sha3_224 => &["sha3-224"],
            Self::Sha3_256 => &["sha3-256"],
            Self::Sha3_384 => &["sha3-384"],
            Self::Sha3_512 => &["sha3-512"],
            Self::Ripemd160 => &["ripemd160", "ripemd-160", "ripemd", "rmd160"],
            Self::Whirlpool => &["whirlpool"],
            Self::Sm3 => &["sm3"],
            Self::Md5 => &["md5", "ssl3-md5"],
            Self::Md4 => &["md4"],
            Self::Blake2b160 => &["blake2b-160"],
            Self::Blake2b256 => &["blake2b-256"],
            Self::Blake2b384 => &["blake2b-384"],
            Self::Blake2b512 => &["blake2b-512", "blake2b512"],
            Self::Blake2s128 => &["blake2s-128"],
            Self::Blake2s160 => &["blake2s-160"],
            Self::Blake2s224 => &["blake2s-224"],
            Self::Blake2s256 => &["blake2s-256", "blake2s256"],
            Self::Stribog256 => &["stribog256"],
            Self::Stribog512 => &["stribog512"],
        }
    }

    /// True if Debian's cryptsetup (OpenSSL backend) accepts it; the others are known to
    /// cryptsetup builds with the libgcrypt backend only.
    pub fn openssl_backend(self) -> bool {
        !matches!(
            self,
            Self::Blake2b160
                | Self::Blake2b256
                | Self::Blake2b384
                | Self::Blake2s128
                | Self::Blake2s160
                | Self::Blake2s224
                | Self::Stribog256
                | Self::Stribog512
        )
    }

    /// True if LUKS1 can use it (digest of at least [`LUKS1_MIN_DIGEST`] bytes).
    pub fn luks1_allowed(self) -> bool {
        self.output_len() >= LUKS1_MIN_DIGEST
    }

    /// Digest length in bytes (at most 64).
    pub fn output_len(self) -> usize {
        with_hash!(self, D => <D as Digest>::output_size())
    }

    /// Block length in bytes: the HMAC pad length.
    pub fn block_len(self) -> usize {
        with_hash!(self, D => <D as BlockSizeUser>::block_size())
    }

    /// `H(parts[0] ‖ parts[1] ‖ ...)`, truncated to `out.len()` (at most
    /// [`output_len`](Self::output_len)).
    pub fn digest_into(self, parts: &[&[u8]], out: &mut [u8]) {
        fn run<D: Digest>(parts: &[&[u8]], out: &mut [u8]) {
            let mut h = D::new();
            for p in parts {
                h.update(p);
            }
            let mut d = h.finalize();
            let n = out.len().min(d.len());
            out[..n].copy_from_slice(&d[..n]);
            d.as_mut_slice().zeroize();
        }
        with_hash!(self, D => run::<D>(parts, out))
    }

    /// HMAC-`self`(`key`, `parts[0] ‖ parts[1] ‖ ...`), truncated to `out.len()` (at most
    /// [`output_len`](Self::output_len)).
    pub fn hmac(self, key: &[u8], parts: &[&[u8]], out: &mut [u8]) {
        fn run<D: Digest + BlockSizeUser + Clone>(key: &[u8], parts: &[&[u8]], out: &mut [u8]) {
            let mut m = Hmac::<D>::new(key);
            for p in parts {
                m.update(p);
            }
            m.finalize_into(out);
        }
        with_hash!(self, D => run::<D>(key, parts, out))
    }

    /// PBKDF2-HMAC-`self` (RFC 8018) of `password` and `salt` with `iterations`, filling `out`.
    pub fn pbkdf2(
        self,
        password: &[u8],
        salt: &[u8],
        iterations: u32,
        out: &mut [u8],
    ) -> Result<(), KdfError> {
        if iterations == 0 {
            return Err(KdfError::InvalidParams {
                kdf: "pbkdf2",
                reason: "iterations must be at least 1".into(),
            });
        }
        if out.is_empty() {
            return Err(KdfError::InvalidParams { kdf: "pbkdf2", reason: "empty output".into() });
        }
        use pbkdf2::pbkdf2_hmac;
        let _deriving = crate::interrupt::Deriving::enter();
        match self {
            Self::Sha1 => pbkdf2_hmac::<sha1::Sha1>(password, salt, iterations, out),
            Self::Sha224 => pbkdf2_hmac::<sha2::Sha224>(password, salt, iterations, out),
            Self::Sha256 => pbkdf2_hmac::<sha2::Sha256>(password, salt, iterations, out),
            Self::Sha384 => pbkdf2_hmac::<sha2::Sha384>(password, salt, iterations, out),
            Self::Sha512 => pbkdf2_hmac::<sha2::Sha512>(password, salt, iterations, out),
            other => with_hash!(other, D => pbkdf2_generic::<D>(password, salt, iterations, out)),
        }
        Ok(())
    }
}

/// HMAC with both keyed states precomputed; every state is wiped on drop (the hashes'
/// `zeroize` features), as are the pads.
#[derive(Clone)]
struct Hmac<D: Digest + BlockSizeUser + Clone> {
    inner: D,
    outer: D,
}

impl<D: Digest + BlockSizeUser + Clone> Hmac<D> {
    fn new(key: &[u8]) -> Self {
        let b = D::block_size();
        let mut pad = zeroize::Zeroizing::new(vec![0u8; b]);
        if key.len() > b {
            let mut k = D::digest(key);
            pad[..k.len()].copy_from_slice(&k);
            k.as_mut_slice().zeroize();
        } else {
            pad[..key.len()].copy_from_slice(key);
        }
        pad.iter_mut().for_each(|x| *x ^= 0x36);
        let mut inner = D::new();
        inner.update(&pad[..]);
        pad.iter_mut().for_each(|x| *x ^= 0x36 ^ 0x5c);
        let mut outer = D::new();
        outer.update(&pad[..]);
        Hmac { inner, outer }
    }

    fn update(&mut self, data: &[u8]) {
        self.inner.update(data);
    }

    /// Writes the first `out.len()` bytes of the MAC.
    fn finalize_into(self, out: &mut [u8]) {
        let Hmac { inner, mut outer } = self;
        let mut ih = inner.finalize();
        outer.update(&ih);
        ih.as_mut_slice().zeroize();
        let mut t = outer.finalize();
        let n = out.len().min(t.len());
        out[..n].copy_from_slice(&t[..n]);
        t.as_mut_slice().zeroize();
    }
}

/// RFC 8018 §5.2 over [`Hmac`].
fn pbkdf2_generic<D: Digest + BlockSizeUser + Clone>(
    password: &[u8],
    salt: &[u8],
    iterations: u32,
    out: &mut [u8],
) {
    let prf = Hmac::<D>::new(password);
    let h = <D as Digest>::output_size();
    let mut u = zeroize::Zeroizing::new(vec![0u8; h]);
    let mut t = zeroize::Zeroizing::new(vec![0u8; h]);
    for (i, chunk) in out.chunks_mut(h).enumerate() {
        let mut m = prf.clone();
        m.update(salt);
        // The block index is 1-based; outputs longer than 2^32 blocks are not reachable
        // here (LUKS asks for at most a few hundred bytes).
        m.update(&(i as u32).wrapping_add(1).to_be_bytes());
        m.finalize_into(&mut u);
        t.copy_from_slice(&u);
        for _ in 1..iterations {
            let mut m = prf.clone();
            m.update(&u);
            m.finalize_into(&mut u);
            t.iter_mut().zip(u.iter()).for_each(|(a, b)| *a ^= b);
        }
        chunk.copy_from_slice(&t[..chunk.len()]);
    }
}

impl FromStr for HashAlg {
    type Err = KdfError;
    fn from_str(s: &str) -> Result<Self, KdfError> {
        Self::ALL
            .iter()
            .copied()
            .find(|h| h.names().iter().any(|n| n.eq_ignore_ascii_case(s)))
            .ok_or_else(|| KdfError::UnsupportedHash(s.to_owned()))
    }
}

impl fmt::Display for HashAlg {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.name())
    }
}

#[cfg(test)]
mod tests;
