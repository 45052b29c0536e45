//! dm-crypt cipher specifications, parsed once into enums.
//!
//! The kernel accepts two syntaxes (`drivers/md/dm-crypt.c`, `crypt_ctr_cipher`):
//!
//! ```text
//!  legacy:  cipher[:keycount]-chainmode-ivmode[:ivopts]     aes-xts-plain64, aes-cbc-essiv:sha256
//!           cipher                      (= cipher-cbc-plain) aes
//!           cipher-plain                (= cipher-cbc-plain) aes-plain
//!           cipher-ecb                  (no IV)              aes-ecb, cipher_null-ecb
//!  capi:    capi:<crypto API name>[-ivmode[:ivopts]]         capi:xts(aes)-plain64
//! ```
//!
//! Legacy parsing mirrors `crypt_ctr_cipher_old` (`strsep` on `-`, then `:`): the first `-`
//! ends the cipher, the second ends the chain mode, and the rest is `ivmode[:ivopts]`. The
//! capi form mirrors `crypt_ctr_cipher_new`: IV options start at the *last* `:`, the IV mode
//! at the *last* `-`, and what remains is the crypto API algorithm name.
//!
//! Authenticated (AEAD) specifications are [`crate::AeadSpec`]'s: they need per-sector tags
//! from a dm-integrity layer. Here, only what the kernel would accept is accepted, and of
//! that only what this crate implements: AES (and `cipher_null` with ECB) in CBC, XTS or ECB mode with the IV
//! generators `plain`, `plain64`, `plain64be`, `essiv:sha256`, `benbi`, `null` and `eboiv`.
//! Everything else fails with [`CryptoError::Unsupported`] naming the part (a cipher, chain
//! mode, IV generator, keycount or crypto API template), or [`CryptoError::InvalidSpec`]
//! when the kernel itself would refuse the string.
//!
//! `Display` re-emits the specification in the syntax it was written in, the way the kernel's
//! table status re-emits `cipher_string`, so `s.parse::<CipherSpec>()?.to_string() == s` for
//! every accepted canonical string.

use std::fmt;
use std::str::FromStr;

use crate::hash::HashAlg;
use crate::CryptoError;

/// The block cipher of a specification.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
#[non_exhaustive]
pub enum Cipher {
    /// AES (128, 192 or 256-bit keys; XTS takes two of them).
    Aes,
    /// The kernel's `cipher_null`: identity, no key (only with ECB).
    CipherNull,
    /// `xchacha12,aes`: Adiantum's stream and block ciphers (only with `adiantum`).
    XChaCha12Aes,
    /// `xchacha20,aes`: likewise, with XChaCha20.
    XChaCha20Aes,
}

impl Cipher {
    /// The kernel crypto API name.
    pub fn name(self) -> &'static str {
        match self {
            Cipher::Aes => "aes",
            Cipher::CipherNull => "cipher_null",
            Cipher::XChaCha12Aes => "xchacha12,aes",
            Cipher::XChaCha20Aes => "xchacha20,aes",
        }
    }
}

/// The chaining mode (the kernel's `chainmode`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
#[non_exhaustive]
pub enum ChainMode {
    /// Cipher block chaining; the IV is the chaining value of the first block.
    Cbc,
    /// XEX-based tweaked codebook with ciphertext stealing (IEEE 1619); the IV is the tweak.
    Xts,
    /// Electronic codebook: no IV.
    Ecb,
    /// Adiantum: a whole sector is one block (32-byte tweak); see `wide.rs`.
    Adiantum,
    /// HCTR2 (kernel 6.0+): likewise, over AES.
    Hctr2,
}

impl ChainMode {
    /// The kernel crypto API name.
    pub fn name(self) -> &'static str {
        match self {
            ChainMode::Cbc => "cbc",
            ChainMode::Xts => "xts",
            ChainMode::Ecb => "ecb",
            ChainMode::Adiantum => "adiantum",
            ChainMode::Hctr2 => "hctr2",
        }
    }
}

/// The hash of an ESSIV IV generator (`essiv:<hash>`), by its kernel crypto API name (the
/// kernel's names differ from cryptsetup's `--hash` names for Whirlpool, `wp256`/`wp384`/
/// `wp512`, Streebog, `streebog256`/`streebog512`, and RIPEMD-160, `rmd160`). The IV cipher
/// is keyed with the digest of the volume key, so the digest length must be a key size of
/// the cipher: for AES 16 or 32 bytes here (md4, md5; sha256, sha3-256, sm3, blake2b-256,
/// streebog256, wp256); the kernel refuses the others with AES, and so does [`CipherSpec`].
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
#[non_exhaustive]
pub enum EssivHash {
    /// `sha256` (cryptsetup's plain-mode default, `aes-cbc-essiv:sha256`).
    Sha256,
    /// `sha1`.
    Sha1,
    /// `sha224`.
    Sha224,
    /// `sha384`.
    Sha384,
    /// `sha512`.
    Sha512,
    /// `sha3-224`.
    Sha3_224,
    /// `sha3-256`.
    Sha3_256,
    /// `sha3-384`.
    Sha3_384,
    /// `sha3-512`.
    Sha3_512,
    /// `md4`.
    Md4,
    /// `md5`.
    Md5,
    /// `rmd160`.
    Rmd160,
    /// `wp256`: Whirlpool truncated to 32 bytes.
    Wp256,
    /// `wp384`: Whirlpool truncated to 48 bytes.
    Wp384,
    /// `wp512`: Whirlpool.
    Wp512,
    /// `sm3`.
    Sm3,
    /// `blake2b-160`.
    Blake2b160,
    /// `blake2b-256`.
    Blake2b256,
    /// `blake2b-384`.
    Blake2b384,
    /// `blake2b-512`.
    Blake2b512,
    /// `streebog256`.
    Streebog256,
    /// `streebog512`.
    Streebog512,
}

impl EssivHash {
    const ALL: &'static [EssivHash] = &[
        Self::Sha256,
        Self::Sha1,
        Self::Sha224,
        Self::Sha384,
        Self::Sha512,
        Self::Sha3_224,
        Self::Sha3_256,
        Self::Sha3_384,
        Self::Sha3_512,
        Self::Md4,
        Self::Md5,
        Self::Rmd160,
        Self::Wp256,
        Self::Wp384,
        Self::Wp512,
        Self::Sm3,
        Self::Blake2b160,
        Self::Blake2b256,
        Self::Blake2b384,
        Self::Blake2b512,
        Self::Streebog256,
        Self::Streebog512,
    ];

    /// The kernel crypto API name.
    pub fn name(self) -> &'static str {
        match self {
            Self::Sha256 => "sha256",
            Self::Sha1 => "sha1",
            Self::Sha224 => "sha224",
            Self::Sha384 => "sha384",
            Self::Sha512 => "sha512",
            Self::Sha3_224 => "sha3-224",
            Self::Sha3_256 => "sha3-256",
            Self::Sha3_384 => "sha3-384",
            Self::Sha3_512 => "sha3-512",
            Self::Md4 => "md4",
            Self::Md5 => "md5",
            Self::Rmd160 => "rmd160",
            Self::Wp256 => "wp256",
            Self::Wp384 => "wp384",
            Self::Wp512 => "wp512",
            Self::Sm3 => "sm3",
            Self::Blake2b160 => "blake2b-160",
            Self::Blake2b256 => "blake2b-256",
            Self::Blake2b384 => "blake2b-384",
            Self::Blake2b512 => "blake2b-512",
            Self::Streebog256 => "streebog256",
            Self::Streebog512 => "streebog512",
        }
    }

    /// The hash computing it (truncated to [`digest_len`](Self::digest_len) for `wp256`/`wp384`).
    pub fn hash(self) -> HashAlg {
        match self {
            Self::Sha256 => HashAlg::Sha256,
            Self::Sha1 => HashAlg::Sha1,
            Self::Sha224 => HashAlg::Sha224,
            Self::Sha384 => HashAlg::Sha384,
            Self::Sha512 => HashAlg::Sha512,
            Self::Sha3_224 => HashAlg::Sha3_224,
            Self::Sha3_256 => HashAlg::Sha3_256,
            Self::Sha3_384 => HashAlg::Sha3_384,
            Self::Sha3_512 => HashAlg::Sha3_512,
            Self::Md4 => HashAlg::Md4,
            Self::Md5 => HashAlg::Md5,
            Self::Rmd160 => HashAlg::Ripemd160,
            Self::Wp256 | Self::Wp384 | Self::Wp512 => HashAlg::Whirlpool,
            Self::Sm3 => HashAlg::Sm3,
            Self::Blake2b160 => HashAlg::Blake2b160,
            Self::Blake2b256 => HashAlg::Blake2b256,
            Self::Blake2b384 => HashAlg::Blake2b384,
            Self::Blake2b512 => HashAlg::Blake2b512,
            Self::Streebog256 => HashAlg::Stribog256,
            Self::Streebog512 => HashAlg::Stribog512,
        }
    }

    /// Digest (= ESSIV key) length in bytes.
    pub fn digest_len(self) -> usize {
        match self {
            Self::Wp256 => 32,
            Self::Wp384 => 48,
            h => h.hash().output_len(),
        }
    }

    fn from_name(name: &str) -> Option<Self> {
        Self::ALL.iter().copied().find(|h| h.name() == name)
    }
}

/// An IV generator (the kernel's `ivmode`). `iv_sector` is defined in [`crate::SectorParams`].
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
#[non_exhaustive]
pub enum IvMode {
    /// `le32(iv_sector & 0xffffffff)`, zero padded: wraps every 2 TiB of 512-byte sectors.
    Plain,
    /// `le64(iv_sector)`, zero padded.
    Plain64,
    /// `be64(iv_sector)` in the **last** 8 bytes of the IV, zeros before.
    Plain64Be,
    /// `E_salt(le64(iv_sector) ‖ 0⁸)` with `salt = hash(volume key)` keying the same block
    /// cipher (AES-256 for SHA-256, whatever the data key size).
    Essiv(EssivHash),
    /// `be64((iv_sector << 5) + 1)` in the last 8 bytes: the narrow-block count from 1.
    Benbi,
    /// All zeros.
    Null,
    /// BitLocker's encrypted byte offset: the volume's own cipher (same key, same mode)
    /// encrypts one zero block with IV `le64(iv_sector * sector_size)`; for CBC that is
    /// `E_K(le64(iv_sector * sector_size))`.
    Eboiv,
}

impl fmt::Display for IvMode {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            IvMode::Plain => f.write_str("plain"),
            IvMode::Plain64 => f.write_str("plain64"),
            IvMode::Plain64Be => f.write_str("plain64be"),
            IvMode::Essiv(h) => write!(f, "essiv:{}", h.name()),
            IvMode::Benbi => f.write_str("benbi"),
            IvMode::Null => f.write_str("null"),
            IvMode::Eboiv => f.write_str("eboiv"),
        }
    }
}

/// Which of the kernel's spellings a specification was written in (kept for `Display`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
enum Syntax {
    /// `cipher[:1]-chainmode[-ivmode[:ivopts]]`.
    Legacy,
    /// `cipher[:1]`, meaning cbc-plain.
    LegacyCipherOnly,
    /// `cipher[:1]-plain`, meaning cbc-plain.
    LegacyPlainShorthand,
    /// `capi:chainmode(cipher)[-ivmode[:ivopts]]`.
    Capi,
}

/// A parsed dm-crypt cipher specification such as `aes-xts-plain64`.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub struct CipherSpec {
    cipher: Cipher,
    mode: ChainMode,
    iv: Option<IvMode>,
    syntax: Syntax,
    /// A legacy `:1` keycount (one key: accepted by the kernel, kept for `Display`).
    explicit_keycount: bool,
}

/// IV generators the kernel has and this crate refuses.
const UNSUPPORTED_IVS: &[&str] = &["lmk", "tcw", "random", "elephant"];
/// Crypto API templates and modes that are authenticated (AEAD).
const AEAD_TEMPLATES: &[&str] =
    &["gcm", "ccm", "rfc4106", "rfc4309", "rfc7539", "rfc7539esp", "authenc", "authencesn"];

impl CipherSpec {
    /// The block cipher.
    pub fn cipher(&self) -> Cipher {
        self.cipher
    }

    /// The chaining mode.
    pub fn mode(&self) -> ChainMode {
        self.mode
    }

    /// The IV generator as written. `None` for ECB without one. With ECB an IV generator is
    /// accepted (the kernel warns "Selected cipher does not support IVs") and ignored.
    pub fn iv_mode(&self) -> Option<IvMode> {
        self.iv
    }

    /// The IV generator actually used: `None` when the mode takes no IV (ECB).
    pub fn effective_iv_mode(&self) -> Option<IvMode> {
        if self.iv_size() == 0 {
            None
        } else {
            self.iv
        }
    }

    /// True for the `capi:` syntax.
    pub fn is_capi(&self) -> bool {
        self.syntax == Syntax::Capi
    }

    /// IV size in bytes, as the kernel computes it: the mode's IV size (16 for AES CBC/XTS,
    /// 0 for ECB), at least 8 when non-zero.
    pub fn iv_size(&self) -> usize {
        match self.mode {
            ChainMode::Cbc | ChainMode::Xts => 16,
            ChainMode::Adiantum | ChainMode::Hctr2 => crate::wide::TWEAK_LEN,
            ChainMode::Ecb => 0,
        }
    }

    /// Valid volume key sizes in **bytes** (XTS keys are two AES keys).
    pub fn valid_key_sizes(&self) -> &'static [usize] {
        match (self.cipher, self.mode) {
            (Cipher::CipherNull, _) => &[0],
            (Cipher::Aes, ChainMode::Xts) => &[32, 48, 64],
            (Cipher::Aes, ChainMode::Cbc | ChainMode::Ecb | ChainMode::Hctr2) => &[16, 24, 32],
            (Cipher::XChaCha12Aes | Cipher::XChaCha20Aes, _) => &[32],
            // Refused by `finish`; no key fits.
            (Cipher::Aes, ChainMode::Adiantum) => &[],
        }
    }

    /// cryptsetup's default key size in bits: 512 for XTS (AES-256-XTS), 256 for other AES
    /// modes, 0 for `cipher_null`.
    pub fn default_key_bits(&self) -> usize {
        match (self.cipher, self.mode) {
            (Cipher::CipherNull, _) => 0,
            (Cipher::Aes, ChainMode::Xts) => 512,
            (Cipher::Aes, _) | (Cipher::XChaCha12Aes | Cipher::XChaCha20Aes, _) => 256,
        }
    }

    /// The kernel crypto API name the target would allocate, e.g. `xts(aes)` or
    /// `essiv(cbc(aes),sha256)`.
    pub fn crypto_api_name(&self) -> String {
        let base = format!("{}({})", self.mode.name(), self.cipher.name());
        match self.effective_iv_mode() {
            Some(IvMode::Essiv(h)) => format!("essiv({base},{})", h.name()),
            _ => base,
        }
    }

    fn parse_legacy(s: &str) -> Result<Self, CryptoError> {
        if s.contains('(') {
            return Err(invalid(s, "crypto API names need the 'capi:' prefix"));
        }
        // strsep(&tmp, "-"), then strsep(&keycount, ":").
        let (first, rest) = split_first(s, '-');
        let (cipher_name, keycount) = split_first(first, ':');
        let cipher = parse_cipher(s, cipher_name)?;
        let explicit_keycount = match keycount {
            None => false,
            Some(k) => {
                let n: u32 = k
                    .parse()
                    .ok()
                    .filter(|_| k.bytes().all(|b| b.is_ascii_digit()))
                    .ok_or_else(|| invalid(s, "bad cipher key count"))?;
                if !n.is_power_of_two() {
                    return Err(invalid(s, "bad cipher key count (not a power of 2)"));
                }
                if n != 1 {
                    return Err(unsupported(s, "multi-key (keycount) specs are not supported"));
                }
                true
            }
        };
        let (chainmode, rest) = match rest {
            None => (None, None),
            Some(r) => {
                let (c, r) = split_first(r, '-');
                (Some(c), r)
            }
        };
        let (ivmode, ivopts) = match rest {
            None => (None, None),
            Some(r) => {
                let (m, o) = split_first(r, ':');
                (Some(m), o)
            }
        };

        // "For compatibility with the original dm-crypt mapping format, if only the cipher
        // name is supplied, use cbc-plain."
        let (mode_name, ivmode, syntax) = match chainmode {
            None => ("cbc", Some("plain"), Syntax::LegacyCipherOnly),
            Some("plain") if ivmode.is_none() => ("cbc", Some("plain"), Syntax::LegacyPlainShorthand),
            Some(c) => (c, ivmode, Syntax::Legacy),
        };
        // The kernel checks this before it looks the chain mode up.
        if mode_name != "ecb" && ivmode.is_none() {
            return Err(invalid(s, "IV mechanism required"));
        }
        let mode = parse_chainmode(s, mode_name)?;
        Self::finish(s, cipher, mode, ivmode, ivopts, syntax, explicit_keycount)
    }

    fn parse_capi(s: &str) -> Result<Self, CryptoError> {
        let tmp = &s["capi:".len()..];
        let (tmp, ivopts) = match tmp.rsplit_once(':') {
            Some((a, b)) => (a, Some(b)),
            None => (tmp, None),
        };
        let (api, ivmode) = match tmp.rsplit_once('-') {
            Some((a, b)) => (a, Some(b)),
            None => (tmp, None),
        };
        let (mode, cipher) = parse_capi_name(s, api)?;
        if mode != ChainMode::Ecb && ivmode.is_none() {
            return Err(invalid(s, "IV generator required (the IV would be undefined)"));
        }
        Self::finish(s, cipher, mode, ivmode, ivopts, Syntax::Capi, false)
    }

    fn finish(
        s: &str,
        cipher: Cipher,
        mode: ChainMode,
        ivmode: Option<&str>,
        ivopts: Option<&str>,
        syntax: Syntax,
        explicit_keycount: bool,
    ) -> Result<Self, CryptoError> {
        check_wide(s, cipher, mode, ivmode)?;
        if cipher == Cipher::CipherNull && mode != ChainMode::Ecb {
            return Err(unsupported(
                s,
                &format!(
                    "chain mode '{}' with cipher_null is not supported (use cipher_null-ecb)",
                    mode.name()
                ),
            ));
        }
        let iv = match ivmode {
            None => None,
            Some(name) => Some(parse_ivmode(s, name, ivopts)?),
        };
        if let (Cipher::Aes, Some(IvMode::Essiv(h))) = (cipher, iv) {
            // The kernel keys the IV cipher with the digest: it must be an AES key size.
            if ![16, 24, 32].contains(&h.digest_len()) {
                return Err(invalid(
                    s,
                    &format!(
                        "ESSIV hash '{}' gives a {}-byte key, not an aes key size (16, 24 or 32 bytes)",
                        h.name(),
                        h.digest_len()
                    ),
                ));
            }
        }
        if mode == ChainMode::Ecb && matches!(iv, Some(IvMode::Essiv(_))) {
            // The kernel would allocate essiv(ecb(aes),sha256), which does not exist.
            return Err(invalid(s, "ESSIV needs a mode with an IV (ecb has none)"));
        }
        Ok(CipherSpec { cipher, mode, iv, syntax, explicit_keycount })
    }
}

/// Adiantum goes only with `xchacha12,aes`/`xchacha20,aes` and they only with it; HCTR2
/// only with AES. Their IV is 32 bytes: of the generators this crate has, those that fill
/// only its first 16 bytes work (`plain`, `plain64`, `null`); the kernel refuses `essiv`
/// and `eboiv` with them (IV size differs from the block size), and `plain64be` and
/// `benbi`, which fill the end of the 32-byte IV, are not implemented for them.
fn check_wide(s: &str, cipher: Cipher, mode: ChainMode, ivmode: Option<&str>) -> Result<(), CryptoError> {
    let adiantum_cipher = matches!(cipher, Cipher::XChaCha12Aes | Cipher::XChaCha20Aes);
    match mode {
        ChainMode::Adiantum if !adiantum_cipher => {
            return Err(invalid(
                s,
                &format!("adiantum needs xchacha12,aes or xchacha20,aes, not '{}'", cipher.name()),
            ))
        }
        ChainMode::Hctr2 if cipher != Cipher::Aes => {
            return Err(invalid(s, &format!("hctr2 needs aes, not '{}'", cipher.name())))
        }
        ChainMode::Adiantum | ChainMode::Hctr2 => {}
        _ if adiantum_cipher => {
            return Err(invalid(
                s,
                &format!(
                    "'{}' is only Adiantum's cipher pair (use {}-adiantum-plain64)",
                    cipher.name(),
                    cipher.name()
                ),
            ))
        }
        _ => return Ok(()),
    }
    match ivmode {
        Some("plain" | "plain64" | "null") => Ok(()),
        Some(iv @ ("essiv" | "eboiv")) => Err(invalid(
            s,
            &format!(
                "IV generator '{iv}' needs the IV size to equal the block size ({} has a 32-byte IV)",
                mode.name()
            ),
        )),
        Some(iv) => Err(unsupported(
            s,
            &format!("IV generator '{iv}' with {} is not supported (plain64 is)", mode.name()),
        )),
        None => Ok(()),
    }
}

/// `strsep` on one character: the part before it, and the rest if the character was found.
fn split_first(s: &str, c: char) -> (&str, Option<&str>) {
    match s.split_once(c) {
        Some((a, b)) => (a, Some(b)),
        None => (s, None),
    }
}

fn unsupported(spec: &str, part: &str) -> CryptoError {
    CryptoError::Unsupported { spec: spec.to_string(), part: part.to_string() }
}

fn invalid(spec: &str, reason: &str) -> CryptoError {
    CryptoError::InvalidSpec { spec: spec.to_string(), reason: reason.to_string() }
}

fn parse_cipher(spec: &str, name: &str) -> Result<Cipher, CryptoError> {
    match name {
        "aes" => Ok(Cipher::Aes),
        "xchacha12,aes" => Ok(Cipher::XChaCha12Aes),
        "xchacha20,aes" => Ok(Cipher::XChaCha20Aes),
        "cipher_null" => Ok(Cipher::CipherNull),
        "" => Err(invalid(spec, "empty cipher name")),
        other => Err(unsupported(spec, &format!("cipher '{other}' is not supported"))),
    }
}

fn parse_chainmode(spec: &str, name: &str) -> Result<ChainMode, CryptoError> {
    match name {
        "cbc" => Ok(ChainMode::Cbc),
        "xts" => Ok(ChainMode::Xts),
        "ecb" => Ok(ChainMode::Ecb),
        "adiantum" => Ok(ChainMode::Adiantum),
        "hctr2" => Ok(ChainMode::Hctr2),
        "" => Err(invalid(spec, "empty chain mode")),
        other if AEAD_TEMPLATES.contains(&other) => Err(invalid(
            spec,
            &format!("authenticated mode '{other}' needs the capi: syntax and an integrity profile"),
        )),
        other => Err(unsupported(spec, &format!("chain mode '{other}' is not supported"))),
    }
}

/// `xts(aes)` → (Xts, Aes). Names the unsupported part otherwise.
fn parse_capi_name(spec: &str, api: &str) -> Result<(ChainMode, Cipher), CryptoError> {
    let Some((outer, inner)) = api.split_once('(') else {
        return Err(unsupported(spec, &format!("crypto API algorithm '{api}' is not supported")));
    };
    let Some(inner) = inner.strip_suffix(')') else {
        return Err(invalid(spec, &format!("malformed crypto API name '{api}'")));
    };
    if AEAD_TEMPLATES.contains(&outer) {
        return Err(unsupported(
            spec,
            &format!(
                "authenticated (AEAD) crypto API algorithm '{api}' is not supported without a dm-integrity layer below (use LUKS2 --integrity)"
            ),
        ));
    }
    if outer == "essiv" {
        return Err(unsupported(
            spec,
            &format!("crypto API template '{api}' is not supported (write the IV as '-essiv:<hash>')"),
        ));
    }
    let mode = match outer {
        "cbc" => ChainMode::Cbc,
        "xts" => ChainMode::Xts,
        "ecb" => ChainMode::Ecb,
        "adiantum" => ChainMode::Adiantum,
        "hctr2" => ChainMode::Hctr2,
        _ => {
            return Err(unsupported(
                spec,
                &format!("crypto API algorithm '{api}' is not supported (chain mode '{outer}')"),
            ))
        }
    };
    let cipher = parse_cipher(spec, inner)?;
    Ok((mode, cipher))
}

fn parse_ivmode(spec: &str, name: &str, opts: Option<&str>) -> Result<IvMode, CryptoError> {
    let iv = match name {
        "plain" => IvMode::Plain,
        "plain64" => IvMode::Plain64,
        "plain64be" => IvMode::Plain64Be,
        "benbi" => IvMode::Benbi,
        "null" => IvMode::Null,
        "eboiv" => IvMode::Eboiv,
        "essiv" => {
            let hash = match opts {
                None | Some("") => return Err(invalid(spec, "digest algorithm missing for ESSIV mode")),
                Some(h) => EssivHash::from_name(h).ok_or_else(|| {
                    unsupported(spec, &format!("ESSIV hash '{h}' is not supported (kernel crypto API names: sha256, md5, sha3-256, wp256, ...)"))
                })?,
            };
            return Ok(IvMode::Essiv(hash));
        }
        n if UNSUPPORTED_IVS.contains(&n) => {
            return Err(unsupported(spec, &format!("IV generator '{n}' is not supported")))
        }
        n => return Err(invalid(spec, &format!("invalid IV mode '{n}'"))),
    };
    if let Some(o) = opts {
        // The kernel ignores options of these generators; refuse rather than drop them.
        return Err(unsupported(
            spec,
            &format!("IV options '{o}' for IV generator '{name}' are not supported"),
        ));
    }
    Ok(iv)
}

impl FromStr for CipherSpec {
    type Err = CryptoError;

    fn from_str(s: &str) -> Result<Self, CryptoError> {
        if s.is_empty() {
            return Err(invalid(s, "empty cipher specification"));
        }
        if s.chars().any(|c| c.is_whitespace() || c.is_control()) {
            return Err(invalid(s, "whitespace in cipher specification"));
        }
        if s.starts_with("capi:") {
            Self::parse_capi(s)
        } else {
            Self::parse_legacy(s)
        }
    }
}

impl fmt::Display for CipherSpec {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let keycount = if self.explicit_keycount { ":1" } else { "" };
        match self.syntax {
            Syntax::LegacyCipherOnly => write!(f, "{}{keycount}", self.cipher.name()),
            Syntax::LegacyPlainShorthand => write!(f, "{}{keycount}-plain", self.cipher.name()),
            Syntax::Legacy => {
                write!(f, "{}{keycount}-{}", self.cipher.name(), self.mode.name())?;
                match self.iv {
                    Some(iv) => write!(f, "-{iv}"),
                    None => Ok(()),
                }
            }
            Syntax::Capi => {
                write!(f, "capi:{}({})", self.mode.name(), self.cipher.name())?;
                match self.iv {
                    Some(iv) => write!(f, "-{iv}"),
                    None => Ok(()),
                }
            }
        }
    }
}
