//! cryptsetup's PBKDF options (`--pbkdf`, `--hash`, `--iter-time`,
//! `--pbkdf-force-iterations`, `--pbkdf-memory`, `--pbkdf-parallel`) turned into concrete
//! KDF costs for a new keyslot (cryptsetup `lib/utils_pbkdf.c`: `verify_pbkdf_params`,
//! `init_pbkdf_type`, and the benchmark in `crypt_benchmark_pbkdf`).

use std::time::Duration;

use sector_crypto::kdf::{
    self, Argon2Params, Argon2Variant, HashAlg, Kdf, ARGON2_DEFAULT_MAX_MEMORY_KIB, ARGON2_MIN_TIME,
    PBKDF2_MIN_ITERATIONS,
};

use super::LuksError;

/// Which KDF new keyslots use.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum PbkdfType {
    /// `pbkdf2` (LUKS1's only KDF).
    Pbkdf2,
    /// `argon2i`.
    Argon2i,
    /// `argon2id` (the LUKS2 default).
    Argon2id,
}

impl std::str::FromStr for PbkdfType {
    type Err = LuksError;
    fn from_str(s: &str) -> Result<Self, LuksError> {
        match s {
            "pbkdf2" => Ok(Self::Pbkdf2),
            "argon2i" => Ok(Self::Argon2i),
            "argon2id" => Ok(Self::Argon2id),
            other => Err(super::ParamError::UnknownPbkdf(other.to_owned()).into()),
        }
    }
}

/// PBKDF options for a new keyslot, with cryptsetup's defaults.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct PbkdfParams {
    /// `--pbkdf`; `None`: argon2id for LUKS2, pbkdf2 for LUKS1.
    pub kind: Option<PbkdfType>,
    /// `--hash` (PBKDF2 hash, also AF and digest hash). Default sha256.
    pub hash: HashAlg,
    /// `--iter-time`: target unlock time (default 2 s).
    pub iter_time: Duration,
    /// `--pbkdf-force-iterations`: skip the benchmark (PBKDF2 iterations, or Argon2 time).
    pub force_iterations: Option<u32>,
    /// `--pbkdf-memory` in KiB: the Argon2 memory (forced) or its ceiling (benchmark).
    pub memory_kib: Option<u32>,
    /// `--pbkdf-parallel`: Argon2 lanes (default min(4, online CPUs)).
    pub parallel: Option<u32>,
}

impl Default for PbkdfParams {
    fn default() -> Self {
        PbkdfParams {
            kind: None,
            hash: HashAlg::Sha256,
            iter_time: Duration::from_millis(2000),
            force_iterations: None,
            memory_kib: None,
            parallel: None,
        }
    }
}

/// Online CPUs, at most 4 (cryptsetup `DEFAULT_LUKS2_PARALLEL_THREADS` capped by the CPU count).
pub fn default_parallel() -> u32 {
    let n = std::thread::available_parallelism().map(|n| n.get()).unwrap_or(1);
    u32::try_from(n.min(4)).unwrap_or(4)
}

impl PbkdfParams {
    /// The effective KDF type for a LUKS version (LUKS1 allows only PBKDF2).
    pub fn kind_for(&self, luks1: bool) -> Result<PbkdfType, LuksError> {
        match (self.kind, luks1) {
            (None, true) => Ok(PbkdfType::Pbkdf2),
            (None, false) => Ok(PbkdfType::Argon2id),
            (Some(PbkdfType::Pbkdf2), _) => Ok(PbkdfType::Pbkdf2),
            (Some(k), true) => {
                Err(super::ParamError::Luks1Pbkdf2Only { kdf: format!("{k:?}").to_lowercase() }.into())
            }
            (Some(k), false) => Ok(k),
        }
    }

    /// Concrete costs for a keyslot of a `key_len`-byte area key: forced, or benchmarked.
    pub fn resolve(&self, luks1: bool, key_len: usize) -> Result<Kdf, LuksError> {
        let kind = self.kind_for(luks1)?;
        if kind == PbkdfType::Pbkdf2 {
            let iterations = match self.force_iterations {
                Some(i) if i < PBKDF2_MIN_ITERATIONS => {
                    return Err(super::ParamError::IterationsTooLow {
                        kdf: "pbkdf2",
                        min: PBKDF2_MIN_ITERATIONS,
                    }
                    .into())
                }
                Some(i) => i,
                None => kdf::benchmark_pbkdf2(self.hash, key_len, self.iter_time),
            };
            return Ok(Kdf::Pbkdf2 { hash: self.hash, iterations });
        }
        let variant = if kind == PbkdfType::Argon2i { Argon2Variant::I } else { Argon2Variant::Id };
        let parallel = self.parallel.unwrap_or_else(default_parallel).max(1);
        let memory = self.memory_kib.unwrap_or(ARGON2_DEFAULT_MAX_MEMORY_KIB);
        let p = match self.force_iterations {
            Some(t) if t < ARGON2_MIN_TIME => {
                return Err(
                    super::ParamError::IterationsTooLow { kdf: variant.name(), min: ARGON2_MIN_TIME }.into()
                )
            }
            Some(t) => Argon2Params { variant, time: t, memory_kib: memory, parallel },
            None => {
                kdf::benchmark_argon2(variant, self.iter_time, memory, parallel).map_err(LuksError::Kdf)?
            }
        };
        Ok(Kdf::Argon2(p))
    }

    /// Iterations of the volume-key digest: cryptsetup's 125 ms worth of PBKDF2 (1000 when
    /// the benchmark is skipped).
    pub fn digest_iterations(&self, key_len: usize) -> u32 {
        if self.force_iterations.is_some() {
            return PBKDF2_MIN_ITERATIONS;
        }
        kdf::benchmark_pbkdf2(self.hash, key_len, Duration::from_millis(125))
    }
}
