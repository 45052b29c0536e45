//! Authenticated (AEAD) sector encryption: dm-crypt with `integrity:<n>:aead`, the data path
//! of LUKS2 authenticated encryption (`cryptsetup luksFormat --integrity ...`).
//!
//! ```text
//!   "capi:gcm(aes)-random" ─────────────────────────FromStr──► AeadSpec ─┐
//!   "capi:authenc(hmac(sha256),xts(aes))-plain64"                       │
//!   LUKS2 ("aes-xts-plain64", "hmac(sha256)") ───AeadSpec::from_luks2──►─┤
//!   VolumeKey = enc_key ‖ mac_key (zeroizing) ───────────────────────────┼─► AeadSectorCipher
//!   SectorParams + tuple size (the dm-integrity tag size) ───────────────┘     encrypt(sector, data, tuples)
//!                                                                             decrypt(sector, data, tuples)
//! ```
//!
//! What the kernel does per crypto sector (`drivers/md/dm-crypt.c`,
//! `crypt_convert_block_aead`, Linux 4.12+), reproduced here byte for byte:
//!
//! ```text
//!   AAD   = le64(sector) ‖ IV          sector: target-relative 512-byte sector of the crypto
//!                                      sector, WITHOUT iv_offset and never shifted by
//!                                      iv_large_sectors; IV: iv_size bytes (org_iv)
//!   IV    = random (write) / from the tuple (read)         for the `random` generator
//!         = ivgen(iv_sector) as for plain dm-crypt         otherwise (plain64, ...)
//!   data  = sector_size bytes, encrypted in place
//!   tuple = [auth tag: tag_size] [IV: iv_size, only for `random`] [zeros up to the tuple size]
//! ```
//!
//! * `gcm(aes)`: IV = the 12-byte GCM nonce, tag 16 bytes: tuple 28 (`aes-gcm-random`).
//! * `rfc7539(chacha20,poly1305)` (`crypto/chacha20poly1305.c`): RFC 8439 ChaCha20-Poly1305,
//!   256-bit key, IV = the 12-byte nonce (`CHACHAPOLY_IV_SIZE`; the `rfc7539` template has no
//!   salt in the key and passes the whole AAD to Poly1305, unlike `rfc7539esp`), tag 16
//!   bytes: tuple 28 (`chacha20-random` + `poly1305`), the same layout as GCM.
//! * `authenc(hmac(H),xts(aes))`: encrypt-then-MAC (the kernel's `crypto/authenc.c`): XTS
//!   with the generated IV as tweak, then `tag = HMAC_H(mac_key, AAD ‖ ciphertext)` (the
//!   full digest). The dm-crypt key is `enc_key ‖ mac_key`, `mac_key` being the last
//!   digest-size bytes (`crypt_copy_authenckey` re-packs it for the crypto API, mac key
//!   first; the volume key itself is encryption key first). `aes-xts-plain64` +
//!   `hmac(sha256)`: 64 + 32 key bytes, tuple 32; with `aes-xts-random` the 16-byte IV
//!   follows the tag (tuple 48).
//!
//! A read whose tag does not verify fails with [`CryptoError::AuthFailed`] naming the
//! sector, and the sector's buffer is zeroed: unauthenticated plaintext never leaves this
//! module.

use std::fmt;
use std::str::FromStr;

use hmac::{Hmac, KeyInit, Mac};
use sha1::Sha1;
use sha2::{Sha256, Sha512};

use crate::iv::IvGen;
use crate::provider::{self, Block, EvpAead, SectorMode, AEAD_NONCE, AEAD_TAG};
use crate::spec::IvMode;
use crate::{CryptoError, Provider, SectorParams, VolumeKey};

/// The hash of an `authenc(hmac(<hash>),...)` construction.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
#[non_exhaustive]
pub enum HmacHash {
    /// SHA-1 (20-byte tag).
    Sha1,
    /// SHA-256 (32-byte tag).
    Sha256,
    /// SHA-512 (64-byte tag).
    Sha512,
}

impl HmacHash {
    /// Kernel name, e.g. `sha256`.
    pub fn name(self) -> &'static str {
        match self {
            HmacHash::Sha1 => "sha1",
            HmacHash::Sha256 => "sha256",
            HmacHash::Sha512 => "sha512",
        }
    }

    /// Digest size in bytes: the tag size and the default MAC key size.
    pub fn digest_size(self) -> usize {
        match self {
            HmacHash::Sha1 => 20,
            HmacHash::Sha256 => 32,
            HmacHash::Sha512 => 64,
        }
    }

    fn from_name(s: &str) -> Option<Self> {
        match s {
            "sha1" => Some(HmacHash::Sha1),
            "sha256" => Some(HmacHash::Sha256),
            "sha512" => Some(HmacHash::Sha512),
            _ => None,
        }
    }
}

/// The authenticated algorithm.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
#[non_exhaustive]
pub enum AeadAlgorithm {
    /// `gcm(aes)`: AES-GCM, 12-byte nonce, 16-byte tag.
    Gcm,
    /// `authenc(hmac(<hash>),xts(aes))`: AES-XTS, then HMAC over AAD and ciphertext.
    AuthencXts(HmacHash),
    /// `rfc7539(chacha20,poly1305)`: ChaCha20-Poly1305 (RFC 8439), 12-byte nonce, 16-byte tag.
    ChaCha20Poly1305,
}

/// The IV generator of an AEAD specification.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
#[non_exhaustive]
pub enum AeadIv {
    /// Fresh random bytes per written sector, kept in the tuple after the tag.
    Random,
    /// `le64(iv_sector)`, zero padded (not stored).
    Plain64,
}

impl AeadIv {
    fn name(self) -> &'static str {
        match self {
            AeadIv::Random => "random",
            AeadIv::Plain64 => "plain64",
        }
    }
}

/// A parsed AEAD dm-crypt cipher such as `capi:gcm(aes)-random`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct AeadSpec {
    alg: AeadAlgorithm,
    iv: AeadIv,
}

fn unsupported(spec: &str, part: &str) -> CryptoError {
    CryptoError::Unsupported { spec: spec.to_string(), part: part.to_string() }
}

impl AeadSpec {
    /// A specification from its parts. GCM and ChaCha20-Poly1305 need the random IV: their
    /// nonce must never repeat under one key, and a sector-derived nonce is reused on every
    /// rewrite of the sector (same keystream, same one-time Poly1305/GHASH key).
    ///
    /// The kernel itself accepts `capi:rfc7539(chacha20,poly1305)-plain64` (cryptsetup
    /// `chacha20-plain64` + `poly1305`): 12-byte IV = le64(iv_sector) ‖ 4 zero bytes
    /// (`crypt_iv_plain64_gen` fills `iv_size` = 12 bytes), not stored (the tuple is the
    /// 16-byte tag only; cryptsetup formats `integrity:16:aead`), AAD = le64(sector) ‖ that
    /// IV. Checked once by hand against a Linux 6.1 + cryptsetup 2.6.1 image (Python
    /// `cryptography` decrypted its sectors with exactly that nonce and AAD). We refuse it
    /// for that nonce reuse.
    pub fn new(alg: AeadAlgorithm, iv: AeadIv) -> Result<Self, CryptoError> {
        let s = AeadSpec { alg, iv };
        if iv != AeadIv::Random {
            match alg {
                AeadAlgorithm::Gcm => {
                    return Err(unsupported(&s.to_string(), "gcm(aes) needs the random IV generator"))
                }
                AeadAlgorithm::ChaCha20Poly1305 => {
                    return Err(unsupported(
                        &s.to_string(),
                        "rfc7539(chacha20,poly1305) needs the random IV generator: with plain64 every \
                         rewrite of a sector reuses its nonce (keystream and Poly1305 key)",
                    ))
                }
                AeadAlgorithm::AuthencXts(_) => {}
            }
        }
        Ok(s)
    }

    /// The algorithm.
    pub fn algorithm(&self) -> AeadAlgorithm {
        self.alg
    }

    /// The IV generator.
    pub fn iv(&self) -> AeadIv {
        self.iv
    }

    /// The specification a LUKS2 segment describes with `encryption` and its `integrity`
    /// type (cryptsetup `LUKS2_get_integrity` + `cipher_dm2c`): `aes-gcm-random` + `aead`,
    /// `chacha20-random` + `poly1305`, `aes-xts-plain64` / `aes-xts-random` +
    /// `hmac(sha1|sha256|sha512)`. cryptsetup's spellings `hmac-sha256` are accepted too.
    pub fn from_luks2(encryption: &str, integrity: &str) -> Result<Self, CryptoError> {
        let spec = format!("{encryption} with integrity {integrity}");
        let hmac = integrity
            .strip_prefix("hmac(")
            .and_then(|r| r.strip_suffix(')'))
            .or_else(|| integrity.strip_prefix("hmac-"));
        match (encryption, integrity, hmac) {
            ("aes-gcm-random", "aead", _) => Self::new(AeadAlgorithm::Gcm, AeadIv::Random),
            (_, "aead", _) => Err(unsupported(
                &spec,
                &format!("cipher {encryption:?} with integrity aead (only aes-gcm-random is supported)"),
            )),
            ("chacha20-random", "poly1305", _) => Self::new(AeadAlgorithm::ChaCha20Poly1305, AeadIv::Random),
            ("chacha20-plain64", "poly1305", _) => {
                Self::new(AeadAlgorithm::ChaCha20Poly1305, AeadIv::Plain64)
            }
            (_, "poly1305", _) => Err(unsupported(
                &spec,
                &format!(
                    "integrity poly1305 is not supported with cipher {encryption:?} (only chacha20-random)"
                ),
            )),
            (enc, _, Some(h)) => {
                let hash = HmacHash::from_name(h)
                    .ok_or_else(|| unsupported(&spec, &format!("integrity hmac({h}) is not supported")))?;
                let iv = match enc {
                    "aes-xts-plain64" => AeadIv::Plain64,
                    "aes-xts-random" => AeadIv::Random,
                    _ => {
                        return Err(unsupported(
                            &spec,
                            &format!(
                                "cipher {enc:?} with an HMAC (only aes-xts-plain64 and aes-xts-random are supported)"
                            ),
                        ))
                    }
                };
                Self::new(AeadAlgorithm::AuthencXts(hash), iv)
            }
            _ => Err(unsupported(&spec, &format!("integrity type {integrity:?} is not supported"))),
        }
    }

    /// The LUKS2 segment `encryption` and `integrity.type` for this specification (what
    /// `from_luks2` parses back).
    pub fn luks2_names(&self) -> (String, String) {
        match self.alg {
            AeadAlgorithm::Gcm => ("aes-gcm-random".into(), "aead".into()),
            AeadAlgorithm::ChaCha20Poly1305 => (format!("chacha20-{}", self.iv.name()), "poly1305".into()),
            AeadAlgorithm::AuthencXts(h) => {
                (format!("aes-xts-{}", self.iv.name()), format!("hmac({})", h.name()))
            }
        }
    }

    /// The cipher's IV size in bytes (the kernel's `iv_size`): 12 for GCM and
    /// ChaCha20-Poly1305, 16 for XTS.
    pub fn iv_size(&self) -> usize {
        match self.alg {
            AeadAlgorithm::Gcm | AeadAlgorithm::ChaCha20Poly1305 => AEAD_NONCE,
            AeadAlgorithm::AuthencXts(_) => 16,
        }
    }

    /// Bytes of authentication tag (the kernel's `integrity_tag_size`).
    pub fn auth_tag_size(&self) -> usize {
        match self.alg {
            AeadAlgorithm::Gcm | AeadAlgorithm::ChaCha20Poly1305 => AEAD_TAG,
            AeadAlgorithm::AuthencXts(h) => h.digest_size(),
        }
    }

    /// Bytes of IV stored per sector (the kernel's `integrity_iv_size`): the IV size for
    /// `random`, else 0.
    pub fn stored_iv_size(&self) -> usize {
        match self.iv {
            AeadIv::Random => self.iv_size(),
            AeadIv::Plain64 => 0,
        }
    }

    /// Per-sector metadata this specification uses: tag + stored IV (cryptsetup's
    /// `INTEGRITY_tag_size`, the dm-integrity tag size it formats): 32 for
    /// xts-plain64 + hmac-sha256, 28 for gcm-random and chacha20-random + poly1305.
    pub fn tuple_size(&self) -> usize {
        self.auth_tag_size() + self.stored_iv_size()
    }

    /// Bytes of MAC key at the end of the volume key (0 for GCM and ChaCha20-Poly1305,
    /// whose one key also keys the authenticator).
    pub fn mac_key_size(&self) -> usize {
        match self.alg {
            AeadAlgorithm::Gcm | AeadAlgorithm::ChaCha20Poly1305 => 0,
            AeadAlgorithm::AuthencXts(h) => h.digest_size(),
        }
    }

    /// Valid volume key sizes in bytes (encryption key plus MAC key).
    pub fn valid_key_sizes(&self) -> Vec<usize> {
        match self.alg {
            AeadAlgorithm::Gcm => vec![16, 24, 32],
            AeadAlgorithm::ChaCha20Poly1305 => vec![32],
            AeadAlgorithm::AuthencXts(_) => [32, 48, 64].iter().map(|k| k + self.mac_key_size()).collect(),
        }
    }

    /// The integrity type dm-crypt's table names (`integrity:<n>:aead`): always `aead` here.
    pub fn dm_integrity_type(&self) -> &'static str {
        "aead"
    }
}

impl fmt::Display for AeadSpec {
    /// The `capi:` form dm-crypt's table uses (cryptsetup `cipher_dm2c`).
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self.alg {
            AeadAlgorithm::Gcm => write!(f, "capi:gcm(aes)-{}", self.iv.name()),
            AeadAlgorithm::ChaCha20Poly1305 => {
                write!(f, "capi:rfc7539(chacha20,poly1305)-{}", self.iv.name())
            }
            AeadAlgorithm::AuthencXts(h) => {
                write!(f, "capi:authenc(hmac({}),xts(aes))-{}", h.name(), self.iv.name())
            }
        }
    }
}

impl FromStr for AeadSpec {
    type Err = CryptoError;

    /// `capi:gcm(aes)-random`, `capi:rfc7539(chacha20,poly1305)-random`,
    /// `capi:authenc(hmac(sha256),xts(aes))-plain64|random`.
    fn from_str(s: &str) -> Result<Self, CryptoError> {
        let body = s.strip_prefix("capi:").ok_or_else(|| CryptoError::InvalidSpec {
            spec: s.to_string(),
            reason: "authenticated modes need the capi: syntax".to_string(),
        })?;
        let (api, iv) = body.rsplit_once('-').ok_or_else(|| CryptoError::InvalidSpec {
            spec: s.to_string(),
            reason: "IV generator required".to_string(),
        })?;
        let iv = match iv {
            "random" => AeadIv::Random,
            "plain64" => AeadIv::Plain64,
            other => {
                return Err(unsupported(s, &format!("IV generator '{other}' with an AEAD is not supported")))
            }
        };
        let alg = if api == "gcm(aes)" {
            AeadAlgorithm::Gcm
        } else if api == "rfc7539(chacha20,poly1305)" {
            AeadAlgorithm::ChaCha20Poly1305
        } else if let Some(h) = api.strip_prefix("authenc(hmac(").and_then(|r| r.strip_suffix("),xts(aes))"))
        {
            AeadAlgorithm::AuthencXts(
                HmacHash::from_name(h)
                    .ok_or_else(|| unsupported(s, &format!("hmac({h}) is not supported")))?,
            )
        } else {
            return Err(unsupported(s, &format!("AEAD crypto API algorithm '{api}' is not supported")));
        };
        let spec = AeadSpec::new(alg, iv)?;
        Ok(spec)
    }
}

/// A keyed HMAC (the MAC half of authenc), cloned per sector.
///
/// The keyed state (the ipad/opad digest states derived from the MAC key) is wiped on drop:
/// hmac 0.13's `HmacCore` has no `Drop` of its own, but its two digest cores do with the
/// `sha1`/`sha2` `zeroize` features this workspace enables (as does `tag::TagHash`). The MAC
/// key itself is only borrowed from the secret `VolumeKey`.
#[derive(Clone)]
enum MacKey {
    Sha1(Box<Hmac<Sha1>>),
    Sha256(Box<Hmac<Sha256>>),
    Sha512(Box<Hmac<Sha512>>),
}

impl MacKey {
    fn new(hash: HmacHash, key: &[u8]) -> Result<Self, CryptoError> {
        let bad = || CryptoError::Provider { op: "keying the HMAC" };
        Ok(match hash {
            HmacHash::Sha1 => {
                MacKey::Sha1(Box::new(<Hmac<Sha1> as KeyInit>::new_from_slice(key).map_err(|_| bad())?))
            }
            HmacHash::Sha256 => {
                MacKey::Sha256(Box::new(<Hmac<Sha256> as KeyInit>::new_from_slice(key).map_err(|_| bad())?))
            }
            HmacHash::Sha512 => {
                MacKey::Sha512(Box::new(<Hmac<Sha512> as KeyInit>::new_from_slice(key).map_err(|_| bad())?))
            }
        })
    }

    /// HMAC(aad ‖ data) into `out` (the digest size).
    fn tag(&self, aad: &[u8], data: &[u8], out: &mut [u8]) {
        fn run<M: Mac + Clone>(m: &M, aad: &[u8], data: &[u8], out: &mut [u8]) {
            let d = m.clone().chain_update(aad).chain_update(data).finalize().into_bytes();
            out.copy_from_slice(&d[..out.len()]);
        }
        match self {
            MacKey::Sha1(m) => run(m.as_ref(), aad, data, out),
            MacKey::Sha256(m) => run(m.as_ref(), aad, data, out),
            MacKey::Sha512(m) => run(m.as_ref(), aad, data, out),
        }
    }

    /// Constant-time check of `tag` against HMAC(aad ‖ data).
    fn verify(&self, aad: &[u8], data: &[u8], tag: &[u8]) -> bool {
        fn run<M: Mac + Clone>(m: &M, aad: &[u8], data: &[u8], tag: &[u8]) -> bool {
            m.clone().chain_update(aad).chain_update(data).verify_slice(tag).is_ok()
        }
        match self {
            MacKey::Sha1(m) => run(m.as_ref(), aad, data, tag),
            MacKey::Sha256(m) => run(m.as_ref(), aad, data, tag),
            MacKey::Sha512(m) => run(m.as_ref(), aad, data, tag),
        }
    }
}

enum Engine {
    /// GCM or ChaCha20-Poly1305 (aws-lc `EVP_AEAD`): nonce = IV, detached 16-byte tag.
    Aead(EvpAead),
    Authenc {
        xts: Box<dyn SectorMode>,
        mac: MacKey,
        ivgen: IvGen,
    },
}

/// A keyed AEAD sector cipher. `Send + Sync`: share it between threads.
pub struct AeadSectorCipher {
    spec: AeadSpec,
    params: SectorParams,
    sector_shift: u32,
    tuple_size: usize,
    engine: Engine,
}

impl fmt::Debug for AeadSectorCipher {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("AeadSectorCipher")
            .field("spec", &self.spec.to_string())
            .field("params", &self.params)
            .field("tuple_size", &self.tuple_size)
            .finish_non_exhaustive()
    }
}

/// Sectors whose random IVs come from one getrandom call.
const RANDOM_BATCH: usize = 64;

/// Longest AAD: le64 sector + a 16-byte IV.
const MAX_AAD: usize = 8 + 16;

impl AeadSectorCipher {
    /// Keys `spec` with `key` (`enc_key ‖ mac_key`) for per-sector tuples of `tuple_size`
    /// bytes (the dm-integrity tag size; at least `spec.tuple_size()`, the rest is zero
    /// padding as in the kernel).
    pub fn new(
        spec: &AeadSpec,
        key: &VolumeKey,
        params: SectorParams,
        tuple_size: usize,
    ) -> Result<Self, CryptoError> {
        let sector_shift = params.sector_shift()?;
        if params.iv_offset % (1u64 << sector_shift) != 0 {
            return Err(CryptoError::InvalidParams(format!(
                "iv_offset {} is not a multiple of sector_size/512",
                params.iv_offset
            )));
        }
        if tuple_size < spec.tuple_size() {
            return Err(CryptoError::InvalidParams(format!(
                "integrity tag size {tuple_size} is too small for {spec} (needs {} bytes)",
                spec.tuple_size()
            )));
        }
        let k = key.as_bytes();
        let valid = spec.valid_key_sizes();
        if !valid.contains(&k.len()) {
            let expected: Vec<String> = valid.iter().map(|b| (b * 8).to_string()).collect();
            return Err(CryptoError::InvalidKeySize {
                spec: spec.to_string(),
                bits: k.len() * 8,
                expected: format!("{} bits", expected.join(" or ")),
            });
        }
        let engine = match spec.alg {
            AeadAlgorithm::Gcm => {
                Engine::Aead(EvpAead::gcm(k).ok_or(CryptoError::Provider { op: "aws-lc: keying gcm(aes)" })?)
            }
            // aws-lc rather than RustCrypto's `chacha20poly1305`: it is already linked for
            // GCM, its ChaCha20-Poly1305 is assembly (SSE4/AVX2/NEON) and documented safe to
            // share between threads, and it takes the same detached-tag EVP_AEAD path as GCM,
            // so this adds no dependency and no new unsafe pattern.
            AeadAlgorithm::ChaCha20Poly1305 => Engine::Aead(
                EvpAead::chacha20_poly1305(k)
                    .ok_or(CryptoError::Provider { op: "aws-lc: keying rfc7539(chacha20,poly1305)" })?,
            ),
            AeadAlgorithm::AuthencXts(h) => {
                let (enc, mac) = k.split_at(k.len() - spec.mac_key_size());
                let xts = provider::aes_xts(Provider::Auto, enc)?;
                let iv = match spec.iv {
                    AeadIv::Plain64 => Some(IvMode::Plain64),
                    AeadIv::Random => None,
                };
                Engine::Authenc {
                    xts,
                    mac: MacKey::new(h, mac)?,
                    ivgen: IvGen::new(iv, enc, params.sector_size)?,
                }
            }
        };
        Ok(AeadSectorCipher { spec: *spec, params, sector_shift, tuple_size, engine })
    }

    /// The specification.
    pub fn spec(&self) -> &AeadSpec {
        &self.spec
    }

    /// The encryption sector size in bytes.
    pub fn sector_size(&self) -> u32 {
        self.params.sector_size
    }

    /// Which implementations run the data path, e.g. `aws-lc gcm(aes256)`.
    pub fn implementation(&self) -> String {
        match &self.engine {
            Engine::Aead(g) => g.name().to_string(),
            Engine::Authenc { xts, .. } => format!("{} + rustcrypto hmac", xts.name()),
        }
    }

    /// Bytes of per-sector metadata (tuple) this cipher reads and writes.
    pub fn tuple_size(&self) -> usize {
        self.tuple_size
    }

    fn check(&self, sector: u64, data: &[u8], tuples: &[u8]) -> Result<usize, CryptoError> {
        let ss = self.params.sector_size as usize;
        let step = 1u64 << self.sector_shift;
        if data.len() % ss != 0 || sector % step != 0 {
            return Err(CryptoError::Misaligned {
                sector,
                len: data.len(),
                sector_size: self.params.sector_size,
            });
        }
        let n = data.len() / ss;
        if tuples.len() != n * self.tuple_size {
            return Err(CryptoError::InvalidParams(format!(
                "{} bytes of integrity metadata for {n} sectors of {} bytes each",
                tuples.len(),
                self.tuple_size
            )));
        }
        Ok(n)
    }

    /// The IV of sector `i` of a request starting at `sector` for a non-random generator.
    fn derived_iv(&self, ivgen: &IvGen, xts: &dyn SectorMode, sector: u64) -> Result<Block, CryptoError> {
        let cc = sector.wrapping_add(self.params.iv_offset);
        let s = if self.params.iv_large_sectors { cc >> self.sector_shift } else { cc };
        let mut iv = [[0u8; 16]; 1];
        ivgen.fill(&[s], &mut iv, xts)?;
        Ok(iv[0])
    }

    /// The nonce and AAD (le64(sector) ‖ IV) of an `Engine::Aead` sector whose tuple holds
    /// `iv_part` after the tag; returns the AAD's length with it.
    fn aead_inputs(
        s: u64,
        iv_part: &[u8],
        iv_len: usize,
    ) -> Result<([u8; AEAD_NONCE], [u8; MAX_AAD], usize), CryptoError> {
        let nonce: [u8; AEAD_NONCE] =
            iv_part[..AEAD_NONCE].try_into().map_err(|_| CryptoError::Provider { op: "aead nonce" })?;
        let mut aad = [0u8; MAX_AAD];
        aad[..8].copy_from_slice(&s.to_le_bytes());
        aad[8..8 + iv_len].copy_from_slice(&iv_part[..iv_len]);
        Ok((nonce, aad, 8 + iv_len))
    }

    /// The XTS IV and AAD (le64(sector) ‖ IV) of an `Engine::Authenc` sector: the stored
    /// random IV (`iv_part`, after the tag) or the generator's IV for sector `s`.
    fn authenc_inputs(
        &self,
        ivgen: &IvGen,
        xts: &dyn SectorMode,
        s: u64,
        iv_part: &[u8],
    ) -> Result<(Block, [u8; MAX_AAD]), CryptoError> {
        let iv: Block = if self.spec.stored_iv_size() > 0 {
            iv_part[..16].try_into().map_err(|_| CryptoError::Provider { op: "xts iv" })?
        } else {
            self.derived_iv(ivgen, xts, s)?
        };
        let mut aad = [0u8; MAX_AAD];
        aad[..8].copy_from_slice(&s.to_le_bytes());
        aad[8..24].copy_from_slice(&iv);
        Ok((iv, aad))
    }

    /// Encrypts `data` (target-relative 512-byte sector `sector`, whole crypto sectors) in
    /// place and writes one tuple per crypto sector into `tuples`
    /// (`data.len() / sector_size × tuple_size` bytes).
    pub fn encrypt(&self, sector: u64, data: &mut [u8], tuples: &mut [u8]) -> Result<(), CryptoError> {
        let n = self.check(sector, data, tuples)?;
        let ss = self.params.sector_size as usize;
        let step = 1u64 << self.sector_shift;
        let (tag_len, iv_len, stored) =
            (self.spec.auth_tag_size(), self.spec.iv_size(), self.spec.stored_iv_size());
        if stored > 0 {
            // One getrandom call per batch of sectors (not one per sector: a format wipe of
            // 512-byte sectors would otherwise make millions of syscalls), scattered into the
            // tuples right after the tags.
            let mut pool = [0u8; RANDOM_BATCH * 16];
            for batch in tuples.chunks_mut(self.tuple_size * RANDOM_BATCH) {
                let k = batch.len() / self.tuple_size;
                let rnd = &mut pool[..k * stored];
                getrandom::fill(rnd).map_err(|_| CryptoError::Provider { op: "getrandom for random IVs" })?;
                for (t, r) in batch.chunks_exact_mut(self.tuple_size).zip(rnd.chunks_exact(stored)) {
                    t[tag_len..tag_len + stored].copy_from_slice(r);
                }
            }
        }
        for (i, (d, t)) in
            data.chunks_exact_mut(ss).zip(tuples.chunks_exact_mut(self.tuple_size)).enumerate().take(n)
        {
            let s = sector.wrapping_add(i as u64 * step);
            let (tag, rest) = t.split_at_mut(tag_len);
            match &self.engine {
                Engine::Aead(g) => {
                    let (nonce, aad, aad_len) = Self::aead_inputs(s, rest, iv_len)?;
                    let mut tg = [0u8; AEAD_TAG];
                    g.seal(&nonce, &aad[..aad_len], d, &mut tg)?;
                    tag.copy_from_slice(&tg);
                }
                Engine::Authenc { xts, mac, ivgen } => {
                    let (iv, aad) = self.authenc_inputs(ivgen, xts.as_ref(), s, rest)?;
                    xts.encrypt(d, ss, &[iv])?;
                    mac.tag(&aad[..24], d, tag);
                }
            }
            rest[stored..].fill(0);
        }
        Ok(())
    }

    /// Verifies and decrypts `data` in place with its `tuples` (as written by `encrypt`).
    /// The first sector whose tag does not verify fails the call with
    /// [`CryptoError::AuthFailed`]; its buffer is zeroed (sectors after it are left as
    /// ciphertext), so no unauthenticated plaintext is ever returned.
    pub fn decrypt(&self, sector: u64, data: &mut [u8], tuples: &[u8]) -> Result<(), CryptoError> {
        let n = self.check(sector, data, tuples)?;
        let ss = self.params.sector_size as usize;
        let step = 1u64 << self.sector_shift;
        let (tag_len, iv_len) = (self.spec.auth_tag_size(), self.spec.iv_size());
        for (i, (d, t)) in
            data.chunks_exact_mut(ss).zip(tuples.chunks_exact(self.tuple_size)).enumerate().take(n)
        {
            let s = sector.wrapping_add(i as u64 * step);
            let (tag, rest) = t.split_at(tag_len);
            let ok = match &self.engine {
                Engine::Aead(g) => {
                    let (nonce, aad, aad_len) = Self::aead_inputs(s, rest, iv_len)?;
                    let tg: [u8; AEAD_TAG] =
                        tag.try_into().map_err(|_| CryptoError::Provider { op: "aead tag" })?;
                    g.open(&nonce, &aad[..aad_len], d, &tg)
                }
                Engine::Authenc { xts, mac, ivgen } => {
                    let (iv, aad) = self.authenc_inputs(ivgen, xts.as_ref(), s, rest)?;
                    if mac.verify(&aad[..24], d, tag) {
                        xts.decrypt(d, ss, &[iv])?;
                        true
                    } else {
                        false
                    }
                }
            };
            if !ok {
                d.fill(0);
                return Err(CryptoError::AuthFailed { sector: s });
            }
        }
        Ok(())
    }
}
