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
//! that only what this crate implements:
//!
//! ```text
//!   ciphers     aes serpent twofish camellia cast6 sm4      (128-bit blocks)
//!               kuznyechik                                  (128-bit; VeraCrypt's, not Linux's)
//!               cast5 blowfish des3_ede                     (64-bit blocks: no xts, no lrw)
//!               cipher_null                                 (ecb only)
//!               xchacha12,aes xchacha20,aes                 (adiantum only)
//!   chain modes cbc xts ecb lrw ctr pcbc
//!               adiantum hctr2                              (wide-block: a sector is one block)
//!   IVs         plain plain64 plain64be essiv:<hash> benbi null eboiv lmk tcw
//!   keycount    cipher:N with N a power of 2 (N subkeys, sector s uses subkey s mod N)
//! ```
//!
//! Everything else fails with [`CryptoError::Unsupported`] naming the part (a cipher, chain
//! mode, IV generator or crypto API template), or [`CryptoError::InvalidSpec`] when the
//! kernel itself would refuse the string (`blowfish-xts-plain64`: the kernel cannot build
//! `xts(blowfish)`). Key sizes are checked by [`CipherSpec::key_layout`].
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
    /// Serpent (128 to 256-bit keys).
    Serpent,
    /// Twofish (128, 192 or 256-bit keys).
    Twofish,
    /// Camellia (128, 192 or 256-bit keys).
    Camellia,
    /// CAST-128 (RFC 2144; 40 to 128-bit keys, 64-bit blocks).
    Cast5,
    /// CAST-256 (RFC 2612; 128, 160, 192, 224 or 256-bit keys).
    Cast6,
    /// Blowfish (32 to 448-bit keys, 64-bit blocks).
    Blowfish,
    /// Triple DES, EDE with three keys (192-bit key, 64-bit blocks).
    Des3Ede,
    /// SM4 (GB/T 32907; 128-bit keys).
    Sm4,
    /// Kuznyechik (GOST R 34.12-2015, RFC 7801; 256-bit keys). Not a Linux cipher: VeraCrypt's.
    Kuznyechik,
    /// The kernel's `cipher_null`: identity, no key (only with ECB).
    CipherNull,
    /// `xchacha12,aes`: Adiantum's stream and block ciphers (only with `adiantum`).
    XChaCha12Aes,
    /// `xchacha20,aes`: likewise, with XChaCha20.
    XChaCha20Aes,
}

impl Cipher {
    /// Every cipher, in the order `sealdisk benchmark` lists them.
    pub const ALL: &'static [Cipher] = &[
        Cipher::Aes,
        Cipher::Serpent,
        Cipher::Twofish,
        Cipher::Camellia,
        Cipher::Cast6,
        Cipher::Sm4,
        Cipher::Cast5,
        Cipher::Blowfish,
        Cipher::Des3Ede,
    ];

    /// The kernel crypto API name.
    pub fn name(self) -> &'static str {
        match self {
            Cipher::Aes => "aes",
            Cipher::Serpent => "serpent",
            Cipher::Twofish => "twofish",
            Cipher::Camellia => "camellia",
            Cipher::Cast5 => "cast5",
            Cipher::Cast6 => "cast6",
            Cipher::Blowfish => "blowfish",
            Cipher::Des3Ede => "des3_ede",
            Cipher::Sm4 => "sm4",
            Cipher::Kuznyechik => "kuznyechik",
            Cipher::CipherNull => "cipher_null",
            Cipher::XChaCha12Aes => "xchacha12,aes",
            Cipher::XChaCha20Aes => "xchacha20,aes",
        }
    }

    /// Block size in bytes (the kernel's `cra_blocksize`; 1 for `cipher_null`).
    pub fn block_size(self) -> usize {
        match self {
            Cipher::Cast5 | Cipher::Blowfish | Cipher::Des3Ede => 8,
            Cipher::CipherNull => 1,
            _ => 16,
        }
    }

    /// True if the cipher's `setkey` takes a key of `len` bytes (the kernel's and the
    /// implementation's ranges agree for every cipher here).
    pub fn accepts_key_len(self, len: usize) -> bool {
        match self {
            Cipher::Aes | Cipher::Twofish | Cipher::Camellia => matches!(len, 16 | 24 | 32),
            // The kernel takes 0..=32 bytes; the implementation here 16..=32 (as cryptsetup uses).
            Cipher::Serpent => (16..=32).contains(&len),
            Cipher::Cast5 => (5..=16).contains(&len),
            Cipher::Cast6 => matches!(len, 16 | 20 | 24 | 28 | 32),
            Cipher::Blowfish => (4..=56).contains(&len),
            Cipher::Des3Ede => len == 24,
            Cipher::Sm4 => len == 16,
            Cipher::Kuznyechik => len == 32,
            Cipher::CipherNull => len == 0,
            // Adiantum's one key: the XChaCha key, from which the AES and hash keys derive.
            Cipher::XChaCha12Aes | Cipher::XChaCha20Aes => len == 32,
        }
    }

    /// The largest key in bytes.
    pub fn max_key_len(self) -> usize {
        (0..=64).rev().find(|&n| self.accepts_key_len(n)).unwrap_or(0)
    }
}

/// The chaining mode (the kernel's `chainmode`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
#[non_exhaustive]
pub enum ChainMode {
    /// Cipher block chaining; the IV is the chaining value of the first block.
    Cbc,
    /// XEX-based tweaked codebook with ciphertext stealing (IEEE 1619); the IV is the tweak.
    /// 128-bit block ciphers only.
    Xts,
    /// Electronic codebook: no IV.
    Ecb,
    /// Liskov-Rivest-Wagner (the kernel's `lrw` template): key = cipher key ‖ 16-byte tweak
    /// key `K2`; block `j` of a sector is `E(P ⊕ T) ⊕ T` with `T = K2 ⊗ (IV + j)` in
    /// GF(2¹²⁸), the IV a big-endian block index. 128-bit block ciphers only.
    Lrw,
    /// Counter mode: keystream `E(IV + j)`, the IV a big-endian counter block.
    Ctr,
    /// Propagating CBC: `Cᵢ = E(Pᵢ ⊕ Pᵢ₋₁ ⊕ Cᵢ₋₁)`, with `P₋₁ ⊕ C₋₁ = IV`.
    Pcbc,
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
            ChainMode::Lrw => "lrw",
            ChainMode::Ctr => "ctr",
            ChainMode::Pcbc => "pcbc",
            ChainMode::Adiantum => "adiantum",
            ChainMode::Hctr2 => "hctr2",
        }
    }

    /// True for the modes whose kernel templates need a 128-bit block cipher.
    pub fn needs_128bit_block(self) -> bool {
        matches!(self, ChainMode::Xts | ChainMode::Lrw)
    }

    /// The key of one instance of this mode over a cipher key of `cipher_key` bytes.
    fn mode_key_len(self, cipher_key: usize) -> usize {
        match self {
            ChainMode::Xts => 2 * cipher_key,
            ChainMode::Lrw => cipher_key + LRW_TWEAK_KEY,
            _ => cipher_key,
        }
    }

    /// The cipher key inside a mode key of `mode_key` bytes, if it splits.
    fn cipher_key_len(self, mode_key: usize) -> Option<usize> {
        match self {
            ChainMode::Xts => (mode_key % 2 == 0).then_some(mode_key / 2),
            ChainMode::Lrw => mode_key.checked_sub(LRW_TWEAK_KEY),
            _ => Some(mode_key),
        }
    }
}

/// Bytes of LRW's tweak key (one cipher block).
pub(crate) const LRW_TWEAK_KEY: usize = 16;
/// Bytes of TCW's whitening key.
pub(crate) const TCW_WHITENING: usize = 16;
/// Bytes of the LMK seed buffer hashed before each sector (the seed key, zero padded).
pub(crate) const LMK_SEED: usize = 64;
/// The largest keycount accepted (loop-AES uses 64).
const MAX_KEYCOUNT: u32 = 64;

/// The hash of an ESSIV IV generator (`essiv:<hash>`), by its kernel crypto API name (the
/// kernel's names differ from cryptsetup's `--hash` names for Whirlpool, `wp256`/`wp384`/
/// `wp512`, Streebog, `streebog256`/`streebog512`, and RIPEMD-160, `rmd160`). The IV cipher
/// is keyed with the digest of the volume key, so the digest length must be a key size of
/// the cipher (for AES 16 or 32 bytes: md4, md5; sha256, sha3-256, sm3, blake2b-256,
/// streebog256, wp256); the kernel refuses the others when it sets the key, and
/// [`CipherSpec`] already when it parses.
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
    /// `E_salt(le64(iv_sector) ‖ 0⁸)` with `salt = hash(subkey)` keying another instance of
    /// the data cipher (AES-256 for SHA-256, whatever the data key size).
    Essiv(EssivHash),
    /// `be64((iv_sector << 5) + 1)` in the last 8 bytes: the narrow-block count from 1.
    Benbi,
    /// All zeros.
    Null,
    /// loop-AES compatible: MD5 over (seed ‖) plaintext blocks 1..31 of the 512-byte sector
    /// ‖ `le32(sector) ‖ le32((sector >> 32 & 0xffffff) | 0x80000000) ‖ le32(4024) ‖ 0⁴`,
    /// without MD5's padding; the IV is the raw MD5 state. Reads decrypt with a zero IV, then
    /// XOR the IV computed from the plaintext into the first block. CBC, 512-byte sectors.
    Lmk,
    /// TrueCrypt compatible: IV = `seed ⊕ le64(sector)`; the ciphertext is whitened with
    /// CRC32s of `whitening ⊕ le64(sector)`. The key ends with the IV seed and 16 bytes of
    /// whitening key. 512-byte sectors.
    Tcw,
    /// BitLocker's encrypted byte offset: the volume's own cipher (same key, same mode)
    /// encrypts one zero block with IV `le64(iv_sector * sector_size)`; for CBC that is
    /// `E_K(le64(iv_sector * sector_size))`.
    Eboiv,
    /// BitLocker's Elephant diffuser around AES-CBC (kernel 5.6+): `eboiv` IVs from the first
    /// half of the key; the second half keys the sector key; the plaintext goes through the
    /// sector-key XOR and diffusers A and B (see `elephant.rs`). The key is two equal halves.
    Elephant,
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
            IvMode::Elephant => f.write_str("elephant"),
            IvMode::Lmk => f.write_str("lmk"),
            IvMode::Tcw => f.write_str("tcw"),
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
    /// Number of subkeys (the kernel's `tfms_count`): a power of 2, 1 unless written.
    keycount: u32,
    /// A legacy `:N` keycount was written (kept for `Display`).
    explicit_keycount: bool,
}

/// How a volume key of a given length splits into the kernel's key parts
/// (`crypt_ctr_ivmode`, `crypt_subkey_size`): `keycount` subkeys of `subkey` bytes each
/// (each keys one instance of the chain mode), then `extra` bytes for the IV generator
/// (lmk's seed, tcw's IV seed and whitening key).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct KeyLayout {
    /// Subkeys, one per cipher instance.
    pub keycount: usize,
    /// Bytes of each subkey (a chain-mode key: both XTS keys, or LRW's cipher and tweak key).
    pub subkey: usize,
    /// Bytes after the subkeys that belong to the IV generator.
    pub extra: usize,
}

/// IV generators the kernel has and this crate refuses.
const UNSUPPORTED_IVS: &[&str] = &["random"];
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

    /// Number of subkeys (`cipher:N`; 1 unless written).
    pub fn keycount(&self) -> u32 {
        self.keycount
    }

    /// IV size in bytes, as the kernel computes it: the mode's IV size (the block size for
    /// CBC, PCBC and CTR, 16 for XTS and LRW, 0 for ECB), at least 8 when non-zero.
    pub fn iv_size(&self) -> usize {
        match self.mode {
            ChainMode::Xts | ChainMode::Lrw => 16,
            ChainMode::Cbc | ChainMode::Pcbc | ChainMode::Ctr => self.cipher.block_size().max(8),
            ChainMode::Adiantum | ChainMode::Hctr2 => crate::wide::TWEAK_LEN,
            ChainMode::Ecb => 0,
        }
    }

    /// The block size of the mode as the crypto API reports it (`crypto_skcipher_blocksize`):
    /// 1 for CTR (a stream mode), the cipher's block size otherwise. `benbi` counts in it.
    pub fn mode_block_size(&self) -> usize {
        match self.mode {
            ChainMode::Ctr => 1,
            _ => self.cipher.block_size(),
        }
    }

    /// The key parts of a volume key of `len` bytes, or why the kernel (or this crate) would
    /// refuse that length.
    pub fn key_layout(&self, len: usize) -> Result<KeyLayout, String> {
        let n = self.keycount as usize;
        let iv = self.effective_iv_mode();
        let extra = match iv {
            Some(IvMode::Tcw) => {
                let extra = self.iv_size() + TCW_WHITENING;
                if len <= extra {
                    return Err(format!(
                        "tcw needs more than {} key bits (IV seed and whitening)",
                        extra * 8
                    ));
                }
                extra
            }
            // loop-AES v3: one more part than keycount (the seed), all parts the same size.
            Some(IvMode::Lmk) if len % n != 0 => len / (n + 1),
            // crypt_iv_elephant_ctr: key_extra_size = key_size / 2, at the end of the key.
            Some(IvMode::Elephant) => len / 2,
            _ => 0,
        };
        let rest = len - extra;
        if rest % n != 0 {
            return Err(format!("the key does not split into {n} equal subkeys"));
        }
        let subkey = rest / n;
        let ok = self
            .mode
            .cipher_key_len(subkey)
            .is_some_and(|k| self.cipher.accepts_key_len(k) && self.mode.mode_key_len(k) == subkey);
        let elephant_bad = iv == Some(IvMode::Elephant) && extra != subkey;
        if !ok || elephant_bad || (iv == Some(IvMode::Lmk) && extra != 0 && extra != subkey) {
            return Err(String::new());
        }
        Ok(KeyLayout { keycount: n, subkey, extra })
    }

    /// Valid volume key sizes in **bytes**, smallest first (XTS keys are two cipher keys, LRW
    /// keys a cipher key and a tweak key, `cipher:N` specs N of those, `tcw` adds its IV seed
    /// and whitening key, `lmk` may add a seed the size of one subkey).
    pub fn valid_key_sizes(&self) -> Vec<usize> {
        let n = self.keycount as usize;
        let mut sizes = Vec::new();
        for k in 0..=self.cipher.max_key_len() {
            if !self.cipher.accepts_key_len(k) {
                continue;
            }
            let sub = self.mode.mode_key_len(k);
            let mut cands = vec![n * sub];
            match self.effective_iv_mode() {
                Some(IvMode::Tcw) => cands = vec![n * sub + self.iv_size() + TCW_WHITENING],
                Some(IvMode::Lmk) => cands.push((n + 1) * sub),
                Some(IvMode::Elephant) => cands = vec![2 * n * sub],
                _ => {}
            }
            for c in cands {
                if self.key_layout(c).is_ok() && !sizes.contains(&c) {
                    sizes.push(c);
                }
            }
        }
        sizes.sort_unstable();
        sizes
    }

    /// A one-line description of the valid key sizes in bits, for error messages.
    pub fn key_sizes_text(&self) -> String {
        let sizes = self.valid_key_sizes();
        match (sizes.first(), sizes.last()) {
            (Some(lo), Some(hi)) if sizes.len() > 4 => format!("{} to {} bits", lo * 8, hi * 8),
            _ => {
                let v: Vec<String> = sizes.iter().map(|b| (b * 8).to_string()).collect();
                format!("{} bits", v.join(" or "))
            }
        }
    }

    /// cryptsetup's default key size in bits: 512 for XTS (two 256-bit keys), 384 for LRW
    /// (256 + 128), 256 otherwise, each capped at the cipher's largest key (128 for cast5 and
    /// sm4, 192 for des3_ede); times the keycount, plus tcw's extra key; 0 for `cipher_null`.
    pub fn default_key_bits(&self) -> usize {
        if self.cipher == Cipher::CipherNull {
            return 0;
        }
        let k = (0..=32).rev().find(|&k| self.cipher.accepts_key_len(k)).unwrap_or(16);
        let mut bytes = self.keycount as usize * self.mode.mode_key_len(k);
        if self.effective_iv_mode() == Some(IvMode::Tcw) {
            bytes += self.iv_size() + TCW_WHITENING;
        }
        if self.effective_iv_mode() == Some(IvMode::Elephant) {
            bytes *= 2;
        }
        bytes * 8
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
        let keycount = match keycount {
            None => None,
            Some(k) => {
                let n: u32 = k
                    .parse()
                    .ok()
                    .filter(|_| k.bytes().all(|b| b.is_ascii_digit()))
                    .ok_or_else(|| invalid(s, "bad cipher key count"))?;
                if !n.is_power_of_two() {
                    return Err(invalid(s, "bad cipher key count (not a power of 2)"));
                }
                if n > MAX_KEYCOUNT {
                    return Err(unsupported(s, &format!("keycount {n} (at most {MAX_KEYCOUNT})")));
                }
                Some(n)
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
        Self::finish(s, cipher, mode, ivmode, ivopts, syntax, keycount)
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
        // crypt_ctr_cipher_new: "if (*ivmode && !strcmp(*ivmode, "lmk")) cc->tfms_count = 64;"
        let keycount = (ivmode == Some("lmk")).then_some(64);
        Self::finish(s, cipher, mode, ivmode, ivopts, Syntax::Capi, keycount)
    }

    fn finish(
        s: &str,
        cipher: Cipher,
        mode: ChainMode,
        ivmode: Option<&str>,
        ivopts: Option<&str>,
        syntax: Syntax,
        keycount: Option<u32>,
    ) -> Result<Self, CryptoError> {
        check_wide(s, cipher, mode, ivmode, keycount)?;
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
        if let Some(IvMode::Essiv(h)) = iv {
            // The kernel keys the IV cipher (the data cipher) with the digest: it must be a
            // key size of that cipher, or the table load fails in essiv_aead/skcipher_setkey.
            if cipher != Cipher::CipherNull && !cipher.accepts_key_len(h.digest_len()) {
                return Err(invalid(
                    s,
                    &format!(
                        "ESSIV hash '{}' gives a {}-bit key, which {} does not take",
                        h.name(),
                        h.digest_len() * 8,
                        cipher.name()
                    ),
                ));
            }
        }
        if mode == ChainMode::Ecb && matches!(iv, Some(IvMode::Essiv(_))) {
            // The kernel would allocate essiv(ecb(aes),sha256), which does not exist.
            return Err(invalid(s, "ESSIV needs a mode with an IV (ecb has none)"));
        }
        if mode.needs_128bit_block() && cipher.block_size() != 16 {
            // The kernel's xts and lrw templates refuse such ciphers ("Error allocating crypto tfm").
            return Err(invalid(
                s,
                &format!(
                    "chain mode '{}' needs a 128-bit block cipher; {} has {}-bit blocks",
                    mode.name(),
                    cipher.name(),
                    cipher.block_size() * 8
                ),
            ));
        }
        let explicit_keycount = keycount.is_some() && syntax != Syntax::Capi;
        let spec =
            CipherSpec { cipher, mode, iv, syntax, keycount: keycount.unwrap_or(1), explicit_keycount };
        match spec.effective_iv_mode() {
            Some(IvMode::Elephant) if mode != ChainMode::Cbc || cipher != Cipher::Aes => {
                return Err(unsupported(s, "IV generator 'elephant' goes only with aes-cbc (BitLocker)"));
            }
            Some(IvMode::Eboiv | IvMode::Elephant) if spec.mode_block_size() != spec.iv_size() => {
                return Err(invalid(
                    s,
                    "eboiv: the mode's block size does not match its IV size (the kernel's \"Block size of EBOIV cipher does not match IV size of block cipher\")",
                ));
            }
            Some(IvMode::Lmk) if mode != ChainMode::Cbc => {
                // The kernel takes it, but reads decrypt with a zero IV and fix only the first
                // block: with any mode but CBC it cannot read back what it wrote.
                return Err(unsupported(
                    s,
                    &format!("IV generator 'lmk' with chain mode '{}' (only cbc)", mode.name()),
                ));
            }
            _ => {}
        }
        Ok(spec)
    }
}

/// Adiantum goes only with `xchacha12,aes`/`xchacha20,aes` and they only with it; HCTR2
/// only with AES here (the kernel's takes any 128-bit block cipher). Their IV is 32 bytes: of the generators this crate has, those that fill
/// only its first 16 bytes work (`plain`, `plain64`, `null`); the kernel refuses `essiv`
/// and `eboiv` with them (IV size differs from the block size), and `plain64be` and
/// `benbi`, which fill the end of the 32-byte IV, are not implemented for them. Their key
/// is one key (keycount 1).
fn check_wide(
    s: &str,
    cipher: Cipher,
    mode: ChainMode,
    ivmode: Option<&str>,
    keycount: Option<u32>,
) -> Result<(), CryptoError> {
    let adiantum_cipher = matches!(cipher, Cipher::XChaCha12Aes | Cipher::XChaCha20Aes);
    match mode {
        ChainMode::Adiantum if !adiantum_cipher => {
            return Err(invalid(
                s,
                &format!("adiantum needs xchacha12,aes or xchacha20,aes, not '{}'", cipher.name()),
            ))
        }
        // The kernel's template takes any 128-bit block cipher; only AES is implemented here.
        ChainMode::Hctr2 if cipher != Cipher::Aes && cipher.block_size() == 16 && !adiantum_cipher => {
            return Err(unsupported(s, &format!("hctr2 with {} is not supported (only aes)", cipher.name())))
        }
        ChainMode::Hctr2 if cipher != Cipher::Aes => {
            return Err(invalid(s, &format!("hctr2 needs a 128-bit block cipher, not '{}'", cipher.name())))
        }
        ChainMode::Adiantum | ChainMode::Hctr2 if keycount.is_some_and(|n| n > 1) => {
            return Err(unsupported(
                s,
                &format!("a keycount with {} is not supported (it takes one key)", mode.name()),
            ))
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
        "serpent" => Ok(Cipher::Serpent),
        "twofish" => Ok(Cipher::Twofish),
        "camellia" => Ok(Cipher::Camellia),
        "cast5" => Ok(Cipher::Cast5),
        "cast6" => Ok(Cipher::Cast6),
        "blowfish" => Ok(Cipher::Blowfish),
        "des3_ede" => Ok(Cipher::Des3Ede),
        "sm4" => Ok(Cipher::Sm4),
        "kuznyechik" => Ok(Cipher::Kuznyechik),
        "xchacha12,aes" => Ok(Cipher::XChaCha12Aes),
        "xchacha20,aes" => Ok(Cipher::XChaCha20Aes),
        "cipher_null" => Ok(Cipher::CipherNull),
        "" => Err(invalid(spec, "empty cipher name")),
        other => Err(unsupported(spec, &format!("cipher '{other}' is not supported"))),
    }
}

fn parse_chainmode(spec: &str, name: &str) -> Result<ChainMode, CryptoError> {
    match name {
        "" => Err(invalid(spec, "empty chain mode")),
        other if chainmode_by_name(other).is_some() => {
            chainmode_by_name(other).ok_or_else(|| invalid(spec, "unknown chain mode"))
        }
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
    let mode = match chainmode_by_name(outer) {
        Some(m) => m,
        None => {
            return Err(unsupported(
                spec,
                &format!("crypto API algorithm '{api}' is not supported (chain mode '{outer}')"),
            ))
        }
    };
    let cipher = parse_cipher(spec, inner)?;
    Ok((mode, cipher))
}

/// The chain modes by kernel name.
fn chainmode_by_name(name: &str) -> Option<ChainMode> {
    Some(match name {
        "cbc" => ChainMode::Cbc,
        "xts" => ChainMode::Xts,
        "ecb" => ChainMode::Ecb,
        "lrw" => ChainMode::Lrw,
        "ctr" => ChainMode::Ctr,
        "pcbc" => ChainMode::Pcbc,
        "adiantum" => ChainMode::Adiantum,
        "hctr2" => ChainMode::Hctr2,
        _ => return None,
    })
}

fn parse_ivmode(spec: &str, name: &str, opts: Option<&str>) -> Result<IvMode, CryptoError> {
    let iv = match name {
        "plain" => IvMode::Plain,
        "plain64" => IvMode::Plain64,
        "plain64be" => IvMode::Plain64Be,
        "benbi" => IvMode::Benbi,
        "null" => IvMode::Null,
        "eboiv" => IvMode::Eboiv,
        "elephant" => IvMode::Elephant,
        "lmk" => IvMode::Lmk,
        "tcw" => IvMode::Tcw,
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
        let keycount = if self.explicit_keycount { format!(":{}", self.keycount) } else { String::new() };
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
