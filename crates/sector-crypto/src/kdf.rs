//! Password-based key derivation for LUKS keyslots and digests: PBKDF2-HMAC and Argon2.
//!
//! ```text
//!   passphrase ──► Kdf::derive(salt, len) ──► area key (decrypts a keyslot's key material)
//!                   ├─ Pbkdf2 { hash, iterations }            LUKS1 keyslots, LUKS1/LUKS2 digests
//!                   └─ Argon2 { i|id, time, memory KiB, lanes } LUKS2 keyslots (default argon2id)
//! ```
//!
//! Semantics are cryptsetup's (`lib/crypto_backend/pbkdf_check.c`, `argon2_generic.c`):
//! PBKDF2 is RFC 8018 with HMAC over the named hash; Argon2 is RFC 9106 version 0x13 with no
//! secret and no associated data, `memory` in KiB and `cpus` lanes. The hash names are
//! cryptsetup's (`sha1`, `sha256`, `whirlpool`, ...), matched case-insensitively; the hashes
//! themselves are [`crate::hash`]'s.
//!
//! Implementations: RustCrypto `pbkdf2`/`hmac`/`sha1`/`sha2` (runtime CPU feature detection
//! only; `target-cpu=native` makes SHA-NI PBKDF2 many times slower, llvm#142368) and
//! RustCrypto `argon2` with its lanes on rayon. Outputs are [`SecretBuf`]s; a [`Passphrase`]
//! is kept in secret memory, wiped on drop and never printed. HMAC states are wiped on drop
//! (the `hmac`/`sha1`/`sha2` `zeroize` features); Argon2's working memory is ours and wiped
//! after each run. Every derivation is registered with [`crate::interrupt`], so a signal
//! can end the process while one runs.
//!
//! [`benchmark_pbkdf2`] and [`benchmark_argon2`] turn cryptsetup's `--iter-time` into
//! parameters the way `crypt_benchmark_pbkdf` does: time a run, scale to the target.

use std::time::{Duration, Instant};

use zeroize::Zeroizing;

pub use crate::hash::HashAlg;
use crate::secure::SecretBuf;

/// Why a key derivation could not run.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[non_exhaustive]
pub enum KdfError {
    /// A hash name this build does not implement.
    #[error("hash {0:?} is not supported")]
    UnsupportedHash(String),
    /// A KDF type this build does not implement.
    #[error("KDF {0:?} is not supported")]
    UnsupportedKdf(String),
    /// Parameters outside what the algorithm accepts.
    #[error("invalid {kdf} parameters: {reason}")]
    InvalidParams {
        /// `pbkdf2`, `argon2i` or `argon2id`.
        kdf: &'static str,
        /// What is wrong.
        reason: String,
    },
}

crate::secret_bytes! {
    /// A passphrase (or key-file contents): wiped on drop, redacted in `Debug`.
    #[derive(Clone, PartialEq, Eq)]
    Passphrase, "passphrase", "True if empty."
}

/// PBKDF2-HMAC-`hash` of `password` and `salt` with `iterations`, filling `out`.
pub fn pbkdf2(
    hash: HashAlg,
    password: &[u8],
    salt: &[u8],
    iterations: u32,
    out: &mut [u8],
) -> Result<(), KdfError> {
    hash.pbkdf2(password, salt, iterations, out)
}

/// Argon2 variant.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Argon2Variant {
    /// `argon2i` (data-independent memory access).
    I,
    /// `argon2id` (hybrid; cryptsetup's LUKS2 default).
    Id,
}

impl Argon2Variant {
    /// cryptsetup's name.
    pub fn name(self) -> &'static str {
        match self {
            Self::I => "argon2i",
            Self::Id => "argon2id",
        }
    }
}

/// Argon2 cost parameters, in cryptsetup's units.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct Argon2Params {
    /// Variant.
    pub variant: Argon2Variant,
    /// Time cost (passes over memory), at least 1 (cryptsetup forces at least 4).
    pub time: u32,
    /// Memory cost in KiB, at least 8 × `parallel`.
    pub memory_kib: u32,
    /// Lanes (cryptsetup `cpus` / `--pbkdf-parallel`).
    pub parallel: u32,
}

/// Argon2 (version 0x13) with optional secret and associated data, as RFC 9106 defines it.
/// LUKS uses neither; they exist here for the RFC's known-answer vectors.
pub fn argon2_with(
    p: &Argon2Params,
    password: &[u8],
    salt: &[u8],
    secret: &[u8],
    ad: &[u8],
    out: &mut [u8],
) -> Result<(), KdfError> {
    let kdf = p.variant.name();
    let invalid = |e: argon2::Error| KdfError::InvalidParams { kdf, reason: e.to_string() };
    let params = argon2::ParamsBuilder::new()
        .m_cost(p.memory_kib)
        .t_cost(p.time)
        .p_cost(p.parallel)
        .data(argon2::AssociatedData::new(ad).map_err(invalid)?)
        .output_len(out.len())
        .build()
        .map_err(invalid)?;
    let alg = match p.variant {
        Argon2Variant::I => argon2::Algorithm::Argon2i,
        Argon2Variant::Id => argon2::Algorithm::Argon2id,
    };
    let blocks = params.block_count();
    let a = if secret.is_empty() {
        argon2::Argon2::new(alg, argon2::Version::V0x13, params)
    } else {
        argon2::Argon2::new_with_secret(secret, alg, argon2::Version::V0x13, params).map_err(invalid)?
    };
    // Our own working memory, wiped afterwards: the crate's `hash_password_into` frees its
    // blocks without zeroing them (argon2 0.6 zeroizes only the initial and final hashes),
    // and they hold values derived from the passphrase.
    let mut memory: Vec<argon2::Block> = Vec::new();
    memory.try_reserve_exact(blocks).map_err(|_| KdfError::InvalidParams {
        kdf,
        reason: format!("cannot allocate {} KiB of Argon2 memory", p.memory_kib),
    })?;
    memory.resize(blocks, argon2::Block::default());
    let _deriving = crate::interrupt::Deriving::enter();
    let r = a.hash_password_into_with_memory(password, salt, out, &mut memory[..]).map_err(invalid);
    zeroize::Zeroize::zeroize(&mut memory);
    r
}

/// Argon2 as LUKS2 uses it: no secret, no associated data.
pub fn argon2(p: &Argon2Params, password: &[u8], salt: &[u8], out: &mut [u8]) -> Result<(), KdfError> {
    argon2_with(p, password, salt, &[], &[], out)
}

/// A keyslot KDF with its costs (the salt is kept beside it, per keyslot).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Kdf {
    /// PBKDF2-HMAC.
    Pbkdf2 {
        /// PRF hash.
        hash: HashAlg,
        /// Iterations.
        iterations: u32,
    },
    /// Argon2i / Argon2id.
    Argon2(Argon2Params),
}

impl Kdf {
    /// Derives `len` bytes from `password` and `salt`, into secret memory.
    pub fn derive(&self, password: &[u8], salt: &[u8], len: usize) -> Result<SecretBuf, KdfError> {
        let mut out = SecretBuf::zeroed(len);
        match self {
            Self::Pbkdf2 { hash, iterations } => pbkdf2(*hash, password, salt, *iterations, &mut out)?,
            Self::Argon2(p) => argon2(p, password, salt, &mut out)?,
        }
        Ok(out)
    }

    /// `pbkdf2`, `argon2i` or `argon2id`.
    pub fn type_name(&self) -> &'static str {
        match self {
            Self::Pbkdf2 { .. } => "pbkdf2",
            Self::Argon2(p) => p.variant.name(),
        }
    }
}

/// cryptsetup's floor on PBKDF2 iterations (`LUKS_MKD_ITERATIONS_MIN`, and the minimum
/// `crypt_benchmark_pbkdf` returns).
pub const PBKDF2_MIN_ITERATIONS: u32 = 1000;
/// cryptsetup's floor on the Argon2 time cost from a benchmark (`PBKDF2_..._MIN` for argon).
pub const ARGON2_MIN_TIME: u32 = 4;
/// cryptsetup's floor on Argon2 memory, KiB.
pub const ARGON2_MIN_MEMORY_KIB: u32 = 32;
/// cryptsetup's default ceiling on Argon2 memory, KiB (1 GiB).
pub const ARGON2_DEFAULT_MAX_MEMORY_KIB: u32 = 1024 * 1024;

/// PBKDF2 iterations that take about `target` on this machine for an output of `key_len`
/// bytes (at least [`PBKDF2_MIN_ITERATIONS`]). Like cryptsetup, the run is repeated with
/// more iterations until it lasts long enough to measure.
pub fn benchmark_pbkdf2(hash: HashAlg, key_len: usize, target: Duration) -> u32 {
    let mut iterations = 1000u32;
    let mut out = Zeroizing::new(vec![0u8; key_len.max(1)]);
    let salt = [0x5au8; 32];
    loop {
        let start = Instant::now();
        if pbkdf2(hash, b"sealdisk-benchmark", &salt, iterations, &mut out).is_err() {
            return PBKDF2_MIN_ITERATIONS;
        }
        let spent = start.elapsed();
        if spent >= Duration::from_millis(50) || iterations >= u32::MAX / 2 {
            let per_sec = f64::from(iterations) / spent.as_secs_f64().max(1e-9);
            let want = per_sec * target.as_secs_f64();
            return (want.min(f64::from(u32::MAX)) as u32).max(PBKDF2_MIN_ITERATIONS);
        }
        iterations = iterations.saturating_mul(4);
    }
}

/// Argon2 costs for about `target` (cryptsetup's `--iter-time`): memory up to
/// `max_memory_kib` (capped to half the physical memory), `parallel` lanes, and a time
/// cost of at least [`ARGON2_MIN_TIME`]; if even that is too slow, memory is reduced
/// (down to [`ARGON2_MIN_MEMORY_KIB`]).
pub fn benchmark_argon2(
    variant: Argon2Variant,
    target: Duration,
    max_memory_kib: u32,
    parallel: u32,
) -> Result<Argon2Params, KdfError> {
    let parallel = parallel.max(1);
    let floor = ARGON2_MIN_MEMORY_KIB.max(8 * parallel);
    let mut memory = max_memory_kib.min(physical_memory_kib() / 2).max(floor);
    let mut out = [0u8; 32];
    let salt = [0x5au8; 32];
    // Time a small run first, so a slow machine never pays for a huge one.
    let probe = Argon2Params { variant, time: 1, memory_kib: memory.min(64 * 1024).max(floor), parallel };
    let start = Instant::now();
    argon2(&probe, b"sealdisk-benchmark", &salt, &mut out)?;
    let per_kib_pass = start.elapsed().as_secs_f64() / f64::from(probe.memory_kib);
    let estimate = |m: u32, t: u32| per_kib_pass * f64::from(m) * f64::from(t);
    let target_s = target.as_secs_f64();
    while memory > floor && estimate(memory, ARGON2_MIN_TIME) > target_s {
        memory = (memory / 2).max(floor);
    }
    let mut p = Argon2Params { variant, time: ARGON2_MIN_TIME, memory_kib: memory, parallel };
    let start = Instant::now();
    argon2(&p, b"sealdisk-benchmark", &salt, &mut out)?;
    let spent = start.elapsed().as_secs_f64().max(1e-9);
    if spent < target_s {
        let t = f64::from(p.time) * target_s / spent;
        p.time = (t.min(f64::from(u32::MAX)) as u32).max(ARGON2_MIN_TIME);
    }
    Ok(p)
}

/// Physical memory in KiB, from /proc/meminfo (4 GiB if unknown).
fn physical_memory_kib() -> u32 {
    let total = std::fs::read_to_string("/proc/meminfo").ok().and_then(|s| {
        s.lines()
            .find(|l| l.starts_with("MemTotal:"))
            .and_then(|l| l.split_whitespace().nth(1).and_then(|v| v.parse::<u64>().ok()))
    });
    u32::try_from(total.unwrap_or(4 * 1024 * 1024)).unwrap_or(u32::MAX)
}

/// Fills `buf` from the operating system's random source.
pub fn random_bytes(buf: &mut [u8]) -> Result<(), KdfError> {
    getrandom::fill(buf).map_err(|e| KdfError::InvalidParams { kdf: "random", reason: e.to_string() })
}

#[cfg(test)]
mod tests {
    use super::*;

    fn hex(s: &str) -> Vec<u8> {
        hex::decode(s.replace([' ', '\n'], "")).unwrap()
    }

    fn pb(hash: HashAlg, p: &[u8], s: &[u8], c: u32, len: usize) -> String {
        let mut out = vec![0u8; len];
        pbkdf2(hash, p, s, c, &mut out).unwrap();
        hex::encode(out)
    }

    /// RFC 6070 (PBKDF2-HMAC-SHA1). The 16777216-iteration vector is left out for time.
    #[test]
    fn pbkdf2_sha1_rfc6070() {
        use HashAlg::Sha1;
        assert_eq!(pb(Sha1, b"password", b"salt", 1, 20), "0c60c80f961f0e71f3a9b524af6012062fe037a6");
        assert_eq!(pb(Sha1, b"password", b"salt", 2, 20), "ea6c014dc72d6f8ccd1ed92ace1d41f0d8de8957");
        assert_eq!(pb(Sha1, b"password", b"salt", 4096, 20), "4b007901b765489abead49d926f721d065a429c1");
        assert_eq!(
            pb(Sha1, b"passwordPASSWORDpassword", b"saltSALTsaltSALTsaltSALTsaltSALTsalt", 4096, 25),
            "3d2eec4fe41c849b80c8d83662c0e44a8b291a964cf2f07038"
        );
        assert_eq!(pb(Sha1, b"pass\0word", b"sa\0lt", 4096, 16), "56fa6aa75548099dcc37d7f03425e0c3");
    }

    /// RFC 7914 §11 (PBKDF2-HMAC-SHA256), plus the RFC 6070 inputs over SHA-256 and SHA-512
    /// (outputs cross-checked with OpenSSL through Python's hashlib).
    #[test]
    fn pbkdf2_sha256_sha512_vectors() {
        use HashAlg::{Sha256, Sha512};
        assert_eq!(
            hex::decode(pb(Sha256, b"passwd", b"salt", 1, 64)).unwrap(),
            hex("55ac046e56e3089fec1691c22544b605f94185216dde0465e68b9d57c20dacbc
                 49ca9cccf179b645991664b39d77ef317c71b845b1e30bd509112041d3a19783")
        );
        assert_eq!(
            hex::decode(pb(Sha256, b"Password", b"NaCl", 80000, 64)).unwrap(),
            hex("4ddcd8f60b98be21830cee5ef22701f9641a4418d04c0414aeff08876b34ab56
                 a1d425a1225833549adb841b51c9b3176a272bdebba1d078478f62b397f33c8d")
        );
        assert_eq!(
            pb(Sha256, b"password", b"salt", 4096, 32),
            "c5e478d59288c841aa530db6845c4c8d962893a001ce4e11a4963873aa98134a"
        );
        assert_eq!(
            pb(Sha512, b"password", b"salt", 1, 64),
            "867f70cf1ade02cff3752599a3a53dc4af34c7a669815ae5d513554e1c8cf252\
             c02d470a285a0501bad999bfe943c08f050235d7d68b1da55e63f73b60a57fce"
        );
        assert_eq!(
            pb(Sha512, b"password", b"salt", 4096, 64),
            "d197b1b33db0143e018b12f3d1d1479e6cdebdcc97c5c0f87f6902e072f457b5\
             143f30602641b3d55cd335988cb36b84376060ecd532e039b742a239434af2d5"
        );
    }

    /// RFC 9106 §5 test vectors: password 32×0x01, salt 16×0x02, secret 8×0x03, associated
    /// data 12×0x04, m=32 KiB, t=3, p=4, 32-byte tag.
    #[test]
    fn argon2_rfc9106() {
        let (pwd, salt, secret, ad) = ([1u8; 32], [2u8; 16], [3u8; 8], [4u8; 12]);
        let run = |variant| {
            let p = Argon2Params { variant, time: 3, memory_kib: 32, parallel: 4 };
            let mut out = [0u8; 32];
            argon2_with(&p, &pwd, &salt, &secret, &ad, &mut out).unwrap();
            hex::encode(out)
        };
        assert_eq!(run(Argon2Variant::I), "c814d9d1dc7f37aa13f0d77f2494bda1c8de6b016dd388d29952a4c4672b6ce8");
        assert_eq!(
            run(Argon2Variant::Id),
            "0d640df58d78766c08c037a34a8b53c9d01ef0452d75b65eb52520e96b01e659"
        );
    }

    #[test]
    fn hash_names_round_trip_case_insensitively() {
        for &h in HashAlg::ALL {
            assert_eq!(h.name().parse::<HashAlg>().unwrap(), h);
            assert_eq!(h.name().to_uppercase().parse::<HashAlg>().unwrap(), h);
            let mut d = vec![0u8; 64];
            h.digest_into(&[b"a", b"bc"], &mut d[..h.output_len()]);
            let mut e = vec![0u8; 64];
            h.digest_into(&[b"abc"], &mut e[..h.output_len()]);
            assert_eq!(d, e);
        }
        assert_eq!("shake256".parse::<HashAlg>(), Err(KdfError::UnsupportedHash("shake256".into())));
    }

    #[test]
    fn invalid_params_are_errors_not_panics() {
        let mut out = [0u8; 32];
        assert!(pbkdf2(HashAlg::Sha256, b"p", b"s", 0, &mut out).is_err());
        let p = Argon2Params { variant: Argon2Variant::Id, time: 0, memory_kib: 32, parallel: 1 };
        assert!(argon2(&p, b"p", &[0; 32], &mut out).is_err());
        let p = Argon2Params { variant: Argon2Variant::Id, time: 1, memory_kib: 8, parallel: 4 };
        assert!(argon2(&p, b"p", &[0; 32], &mut out).is_err());
    }

    #[test]
    fn benchmarks_respect_floors() {
        let it = benchmark_pbkdf2(HashAlg::Sha256, 32, Duration::from_millis(1));
        assert!(it >= PBKDF2_MIN_ITERATIONS);
        let p = benchmark_argon2(Argon2Variant::Id, Duration::from_millis(20), 1024, 1).unwrap();
        assert!(p.time >= ARGON2_MIN_TIME && p.memory_kib >= ARGON2_MIN_MEMORY_KIB && p.memory_kib <= 1024);
    }

    #[test]
    fn passphrase_debug_is_redacted() {
        let p = Passphrase::new(b"hunter2".to_vec());
        assert_eq!(format!("{p:?}"), "Passphrase(7 bytes, redacted)");
    }
}
