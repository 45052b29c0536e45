//! TrueCrypt and VeraCrypt volume headers (cryptsetup's `TCRYPT` type), sans-IO.
//!
//! A header is one 512-byte block: a 64-byte salt in the clear, then 448 bytes encrypted
//! with a key derived from the passphrase (and keyfiles) by PBKDF2 over the salt. Nothing in
//! it says which KDF or cipher was used: an opener tries every combination
//! ([`KDFS`] × [`CHAINS`]) until the decrypted bytes start with a known magic. This module
//! holds the tables, the decoder of the *decrypted* 448 bytes, the keyfile pool and the
//! PIM arithmetic, and where the header and the data are on the device; the KDF and the
//! ciphers run in `volume` (with `sector-crypto`).
//!
//! Decrypted header (big-endian fields, offsets within the 448 bytes; cryptsetup
//! `lib/tcrypt/tcrypt.h`, `struct tcrypt_phdr`):
//!
//! ```text
//!   offset  size  field
//!        0     4  magic               "TRUE" (TrueCrypt) or "VERA" (VeraCrypt)
//!        4     2  version             header format version
//!        6     2  version_tc          minimum program version (BCD, e.g. 0x0700)
//!        8     4  keys_crc32          CRC-32 of the 256-byte key area
//!       12    16  (ctimes, unused)
//!       28     8  hidden_volume_size  bytes (outer volume header: size of the hidden one)
//!       36     8  volume_size         bytes
//!       44     8  mk_offset           start of the encrypted data, bytes (0 means 512)
//!       52     8  mk_size             bytes of encrypted area
//!       60     4  flags               bit 0: system encryption
//!       64     4  sector_size         0 means 512
//!       68   120  (reserved)
//!      188     4  header_crc32        CRC-32 of bytes 0..188 (checked for version > 3)
//!      192   256  keys                the master keys (see [`CipherChain`])
//! ```
//!
//! Where the 512-byte header block is on the device ([`header_offset`]): at 0 (normal),
//! 64 KiB (hidden), `size − 128 KiB` (backup), `size − 64 KiB` (hidden backup), or byte 31744
//! = sector 62 (system encryption: the boot loader's track).
use zeroize::Zeroizing;

/// Bytes of the salt in front of the encrypted header.
pub const SALT_LEN: usize = 64;
/// Bytes of the encrypted (then decrypted) header.
pub const HDR_LEN: usize = 448;
/// Bytes of the whole on-disk header block: salt and encrypted header.
pub const BLOCK_LEN: usize = SALT_LEN + HDR_LEN;
/// Bytes of header key the KDF derives (enough for three ciphers' XTS keys).
pub const HDR_KEY_LEN: usize = 192;
/// Bytes of the key area in the decrypted header.
pub const KEYS_LEN: usize = 256;
/// Offset of the key area in the decrypted header.
pub const KEYS_OFFSET: usize = HDR_LEN - KEYS_LEN;
/// Offset of `header_crc32`; the CRC covers every byte before it.
pub const HEADER_CRC_OFFSET: usize = KEYS_OFFSET - 4;
/// The hidden volume's header.
pub const HIDDEN_OFFSET: u64 = 65536;
/// TrueCrypt < 6: the hidden header 1536 bytes before the end of the device.
pub const HIDDEN_OFFSET_OLD_FROM_END: u64 = 1536;
/// The backup header, this many bytes before the end of the device.
pub const BACKUP_FROM_END: u64 = 131072;
/// The hidden volume's backup header, this many bytes before the end.
pub const HIDDEN_BACKUP_FROM_END: u64 = 65536;
/// System encryption: the header in sector 62 of the disk.
pub const SYSTEM_OFFSET: u64 = 31744;
/// Bytes of a keyfile that count (the rest is ignored).
pub const KEYFILE_MAX: usize = 1 << 20;
/// TrueCrypt's keyfile pool and longest passphrase.
pub const TC_POOL_LEN: usize = 64;
/// VeraCrypt's keyfile pool and longest passphrase (the pool is this long only when the
/// passphrase is longer than [`TC_POOL_LEN`]).
pub const VC_POOL_LEN: usize = 128;
/// Header flag: system encryption.
pub const FLAG_SYSTEM: u32 = 1;

/// Which program wrote the header (its magic).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Magic {
    /// "TRUE".
    TrueCrypt,
    /// "VERA".
    VeraCrypt,
}

impl Magic {
    /// The four bytes.
    pub fn bytes(self) -> &'static [u8; 4] {
        match self {
            Magic::TrueCrypt => b"TRUE",
            Magic::VeraCrypt => b"VERA",
        }
    }

    /// The magic at the start of `plain`, if any: `VERA` only when `veracrypt` is allowed
    /// (cryptsetup's `--disable-veracrypt` turns it off).
    pub fn detect(plain: &[u8], veracrypt: bool) -> Option<Magic> {
        match plain.get(..4)? {
            b"TRUE" => Some(Magic::TrueCrypt),
            b"VERA" if veracrypt => Some(Magic::VeraCrypt),
            _ => None,
        }
    }
}

/// Why decrypted header bytes are not a usable header.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[non_exhaustive]
pub enum TcryptError {
    /// Fewer than [`HDR_LEN`] bytes.
    #[error("header is {0} bytes, {HDR_LEN} needed")]
    Short(usize),
    /// No TrueCrypt/VeraCrypt magic: wrong key, cipher or not a header.
    #[error("no TRUE/VERA magic")]
    Magic,
    /// The CRC-32 of the header fields does not match.
    #[error("header CRC32 mismatch (stored {stored:08x}, computed {computed:08x})")]
    HeaderCrc {
        /// `header_crc32`.
        stored: u32,
        /// CRC-32 of bytes 0..188.
        computed: u32,
    },
    /// The CRC-32 of the key area does not match.
    #[error("key area CRC32 mismatch (stored {stored:08x}, computed {computed:08x})")]
    KeysCrc {
        /// `keys_crc32`.
        stored: u32,
        /// CRC-32 of the 256 key bytes.
        computed: u32,
    },
    /// A sector size that is not 512 (cryptsetup maps only 512-byte sectors).
    #[error("sector size {0} is not supported (only 512)")]
    SectorSize(u32),
    /// The data area lies (partly) outside the device.
    #[error("data area (offset {offset}, {len} bytes) is outside the {device} byte device")]
    DataOutside {
        /// Offset in bytes.
        offset: u64,
        /// Length in bytes.
        len: u64,
        /// Device size in bytes.
        device: u64,
    },
    /// The header says the volume is empty.
    #[error("the header describes an empty volume")]
    Empty,
    /// The device is too small to hold the header asked for.
    #[error("device of {0} bytes is too small for this header position")]
    DeviceTooSmall(u64),
    /// A passphrase longer than the pool.
    #[error("Maximum TCRYPT passphrase length ({0}) exceeded.")]
    PassphraseTooLong(usize),
    /// A PIM whose iteration count does not fit 32 bits.
    #[error("PIM {0} is out of range")]
    PimRange(u32),
}

/// A decoded (decrypted) TrueCrypt/VeraCrypt header, defaults applied as cryptsetup does
/// (`mk_offset` 0 → 512, `sector_size` 0 → 512).
#[derive(Clone, PartialEq, Eq)]
pub struct TcryptHeader {
    /// Magic.
    pub magic: Magic,
    /// Header format version.
    pub version: u16,
    /// Minimum program version to open it.
    pub version_tc: u16,
    /// CRC-32 of the key area.
    pub keys_crc32: u32,
    /// Hidden volume size, bytes (in an outer header: 0 or the hidden volume's size).
    pub hidden_volume_size: u64,
    /// Volume size, bytes.
    pub volume_size: u64,
    /// Data offset, bytes.
    pub mk_offset: u64,
    /// Encrypted area size, bytes.
    pub mk_size: u64,
    /// Flags ([`FLAG_SYSTEM`]).
    pub flags: u32,
    /// Sector size, bytes.
    pub sector_size: u32,
    /// `header_crc32` as stored.
    pub header_crc32: u32,
    /// The master keys (wiped on drop).
    pub keys: Zeroizing<[u8; KEYS_LEN]>,
}

impl std::fmt::Debug for TcryptHeader {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("TcryptHeader")
            .field("magic", &self.magic)
            .field("version", &self.version)
            .field("version_tc", &self.version_tc)
            .field("hidden_volume_size", &self.hidden_volume_size)
            .field("volume_size", &self.volume_size)
            .field("mk_offset", &self.mk_offset)
            .field("mk_size", &self.mk_size)
            .field("flags", &self.flags)
            .field("sector_size", &self.sector_size)
            .finish_non_exhaustive()
    }
}

fn be16(b: &[u8], at: usize) -> u16 {
    u16::from_be_bytes([b[at], b[at + 1]])
}
fn be32(b: &[u8], at: usize) -> u32 {
    u32::from_be_bytes([b[at], b[at + 1], b[at + 2], b[at + 3]])
}
fn be64(b: &[u8], at: usize) -> u64 {
    let mut x = [0u8; 8];
    x.copy_from_slice(&b[at..at + 8]);
    u64::from_be_bytes(x)
}

/// CRC-32 (IEEE, as cryptsetup's `crypt_crc32(~0, ..) ^ ~0`).
pub fn crc32(data: &[u8]) -> u32 {
    crc32fast::hash(data)
}

impl TcryptHeader {
    /// Decodes decrypted header bytes (at least [`HDR_LEN`]), checking the magic and both
    /// CRCs as cryptsetup does (`TCRYPT_hdr_from_disk`: the header CRC only for version > 3).
    pub fn decode(plain: &[u8], veracrypt: bool) -> Result<TcryptHeader, TcryptError> {
        let b = plain.get(..HDR_LEN).ok_or(TcryptError::Short(plain.len()))?;
        let magic = Magic::detect(b, veracrypt).ok_or(TcryptError::Magic)?;
        let version = be16(b, 4);
        let header_crc32 = be32(b, HEADER_CRC_OFFSET);
        let computed = crc32(&b[..HEADER_CRC_OFFSET]);
        if version > 3 && computed != header_crc32 {
            return Err(TcryptError::HeaderCrc { stored: header_crc32, computed });
        }
        let keys_crc32 = be32(b, 8);
        let computed = crc32(&b[KEYS_OFFSET..]);
        if computed != keys_crc32 {
            return Err(TcryptError::KeysCrc { stored: keys_crc32, computed });
        }
        let mut keys = Zeroizing::new([0u8; KEYS_LEN]);
        keys.copy_from_slice(&b[KEYS_OFFSET..]);
        let mk_offset = match be64(b, 44) {
            0 => 512,
            o => o,
        };
        let sector_size = match be32(b, 64) {
            0 => 512,
            s => s,
        };
        Ok(TcryptHeader {
            magic,
            version,
            version_tc: be16(b, 6),
            keys_crc32,
            hidden_volume_size: be64(b, 28),
            volume_size: be64(b, 36),
            mk_offset,
            mk_size: be64(b, 52),
            flags: be32(b, 60),
            sector_size,
            header_crc32,
            keys,
        })
    }

    /// The 448 header bytes, both CRCs computed afresh (for tests and header writers;
    /// `mk_offset`/`sector_size` are written as they are, not as 0).
    pub fn encode(&self) -> Zeroizing<[u8; HDR_LEN]> {
        let mut b = Zeroizing::new([0u8; HDR_LEN]);
        b[..4].copy_from_slice(self.magic.bytes());
        b[4..6].copy_from_slice(&self.version.to_be_bytes());
        b[6..8].copy_from_slice(&self.version_tc.to_be_bytes());
        b[KEYS_OFFSET..].copy_from_slice(&self.keys[..]);
        let keys_crc = crc32(&b[KEYS_OFFSET..]);
        b[8..12].copy_from_slice(&keys_crc.to_be_bytes());
        b[28..36].copy_from_slice(&self.hidden_volume_size.to_be_bytes());
        b[36..44].copy_from_slice(&self.volume_size.to_be_bytes());
        b[44..52].copy_from_slice(&self.mk_offset.to_be_bytes());
        b[52..60].copy_from_slice(&self.mk_size.to_be_bytes());
        b[60..64].copy_from_slice(&self.flags.to_be_bytes());
        b[64..68].copy_from_slice(&self.sector_size.to_be_bytes());
        let crc = crc32(&b[..HEADER_CRC_OFFSET]);
        b[HEADER_CRC_OFFSET..KEYS_OFFSET].copy_from_slice(&crc.to_be_bytes());
        b
    }
}

/// One PBKDF2 variant cryptsetup tries (`tcrypt_kdf[]` of cryptsetup 2.6).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct KdfEntry {
    /// Tried only with legacy modes (the CLI always allows them).
    pub legacy: bool,
    /// A VeraCrypt KDF (tried unless `--disable-veracrypt`; only these with a PIM).
    pub veracrypt: bool,
    /// The PBKDF2 hash, cryptsetup's name.
    pub hash: &'static str,
    /// Iterations without a PIM.
    pub iterations: u32,
    /// With a PIM: `pim_const + pim_mult × PIM` iterations.
    pub pim_const: u32,
    /// See `pim_const`.
    pub pim_mult: u32,
}

const fn kdf(legacy: bool, veracrypt: bool, hash: &'static str, iterations: u32, c: u32, m: u32) -> KdfEntry {
    KdfEntry { legacy, veracrypt, hash, iterations, pim_const: c, pim_mult: m }
}

/// Every KDF, in cryptsetup's order of trial. The VeraCrypt entries with `pim_const` 0 are
/// the boot (system encryption) counts: `2048 × PIM` with a PIM.
pub const KDFS: &[KdfEntry] = &[
    kdf(false, false, "ripemd160", 2000, 0, 0),
    kdf(false, false, "ripemd160", 1000, 0, 0),
    kdf(false, false, "sha512", 1000, 0, 0),
    kdf(false, false, "whirlpool", 1000, 0, 0),
    kdf(true, false, "sha1", 2000, 0, 0),
    kdf(false, true, "sha512", 500000, 15000, 1000),
    kdf(false, true, "whirlpool", 500000, 15000, 1000),
    kdf(false, true, "sha256", 500000, 15000, 1000),
    kdf(false, true, "sha256", 200000, 0, 2048),
    kdf(false, true, "ripemd160", 655331, 15000, 1000),
    kdf(false, true, "ripemd160", 327661, 0, 2048),
    kdf(false, true, "stribog512", 500000, 15000, 1000),
];

impl KdfEntry {
    /// Iterations for this entry: its own count, or from `pim` (VeraCrypt entries only;
    /// see [`kdf_plan`]).
    pub fn iterations_for(&self, pim: Option<u32>) -> Result<u32, TcryptError> {
        match pim {
            None => Ok(self.iterations),
            Some(p) => self
                .pim_mult
                .checked_mul(p)
                .and_then(|x| x.checked_add(self.pim_const))
                .ok_or(TcryptError::PimRange(p)),
        }
    }
}

/// The KDFs to try, in order, with their iterations, as cryptsetup's `TCRYPT_init_hdr`
/// filters them: `hash` (`--hash`) matches by substring, legacy entries only with
/// `legacy`, VeraCrypt entries only with `veracrypt`, and with a `pim` only VeraCrypt
/// entries (their counts from the PIM).
pub fn kdf_plan(
    hash: Option<&str>,
    legacy: bool,
    veracrypt: bool,
    pim: Option<u32>,
) -> Result<Vec<(KdfEntry, u32)>, TcryptError> {
    let pim = pim.filter(|_| veracrypt);
    let mut plan = Vec::new();
    for k in KDFS {
        if hash.is_some_and(|h| !k.hash.contains(h)) || (k.legacy && !legacy) || (k.veracrypt && !veracrypt) {
            continue;
        }
        if pim.is_some() && !k.veracrypt {
            continue;
        }
        plan.push((*k, k.iterations_for(pim)?));
    }
    Ok(plan)
}

/// The chaining mode of a [`CipherChain`] (with its dm-crypt IV), as cryptsetup names it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ChainMode {
    /// `xts-plain64`: TrueCrypt ≥ 5 and VeraCrypt.
    Xts,
    /// `lrw-benbi`: TrueCrypt 4.1–4.3.
    Lrw,
    /// `cbc-tcw`: TrueCrypt < 4.1, one cipher (dm-crypt's `tcw` IV).
    CbcTcw,
    /// `cbci-tcrypt`: TrueCrypt < 4.1 cascades, "inner" CBC over the whole chain per block.
    /// cryptsetup decrypts the header but cannot map the data.
    CbciTcrypt,
    /// `cbc-tcrypt`: blowfish (little-endian) chains; header only, like `CbciTcrypt`.
    CbcTcrypt,
}

impl ChainMode {
    /// cryptsetup's name (the mode half of a dm-crypt cipher spec).
    pub fn name(self) -> &'static str {
        match self {
            ChainMode::Xts => "xts-plain64",
            ChainMode::Lrw => "lrw-benbi",
            ChainMode::CbcTcw => "cbc-tcw",
            ChainMode::CbciTcrypt => "cbci-tcrypt",
            ChainMode::CbcTcrypt => "cbc-tcrypt",
        }
    }

    /// Whether the kernel (so dm-crypt, so this implementation) can map the data.
    pub fn can_map(self) -> bool {
        !matches!(self, ChainMode::CbciTcrypt | ChainMode::CbcTcrypt)
    }
}

/// One cipher of a chain and where its keys are in the key material (`struct tcrypt_alg`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct ChainCipher {
    /// Kernel cipher name (`blowfish_le` is TrueCrypt's little-endian Blowfish).
    pub name: &'static str,
    /// Bytes of this layer's dm-crypt key for XTS/LRW (both halves), or of the cipher key
    /// for CBC.
    pub key_size: usize,
    /// Cipher block size.
    pub iv_size: usize,
    /// Offset of this cipher's key.
    pub key_offset: usize,
    /// XTS: offset of the tweak key; CBC: offset of the IV seed and whitening.
    pub iv_offset: usize,
    /// CBC: bytes of IV seed + whitening after the cipher key.
    pub key_extra_size: usize,
}

/// A cipher chain (cascade) in one mode (`struct tcrypt_algs`). `ciphers[0]` is the outer
/// cipher, applied first when encrypting: the dm-crypt layer on top; the last is the layer
/// on the device.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct CipherChain {
    /// Legacy (TrueCrypt < 5) chain.
    pub legacy: bool,
    /// cryptsetup's name, e.g. `serpent-twofish-aes`.
    pub name: &'static str,
    /// Mode.
    pub mode: ChainMode,
    /// Bytes of the whole volume key (`MK bits` / 8).
    pub key_size: usize,
    /// The ciphers, outer first.
    pub ciphers: &'static [ChainCipher],
}

const fn c(
    name: &'static str,
    key_size: usize,
    iv: usize,
    ko: usize,
    io: usize,
    extra: usize,
) -> ChainCipher {
    ChainCipher { name, key_size, iv_size: iv, key_offset: ko, iv_offset: io, key_extra_size: extra }
}

const fn chain(
    legacy: bool,
    name: &'static str,
    mode: ChainMode,
    key_size: usize,
    ciphers: &'static [ChainCipher],
) -> CipherChain {
    CipherChain { legacy, name, mode, key_size, ciphers }
}

use ChainMode::{CbcTcrypt, CbcTcw, CbciTcrypt, Lrw, Xts};

/// Every chain, in cryptsetup's order of trial (`tcrypt_cipher[]`).
pub const CHAINS: &[CipherChain] = &[
    chain(false, "aes", Xts, 64, &[c("aes", 64, 16, 0, 32, 0)]),
    chain(false, "serpent", Xts, 64, &[c("serpent", 64, 16, 0, 32, 0)]),
    chain(false, "twofish", Xts, 64, &[c("twofish", 64, 16, 0, 32, 0)]),
    chain(false, "twofish-aes", Xts, 128, &[c("twofish", 64, 16, 0, 64, 0), c("aes", 64, 16, 32, 96, 0)]),
    chain(
        false,
        "serpent-twofish-aes",
        Xts,
        192,
        &[c("serpent", 64, 16, 0, 96, 0), c("twofish", 64, 16, 32, 128, 0), c("aes", 64, 16, 64, 160, 0)],
    ),
    chain(false, "aes-serpent", Xts, 128, &[c("aes", 64, 16, 0, 64, 0), c("serpent", 64, 16, 32, 96, 0)]),
    chain(
        false,
        "aes-twofish-serpent",
        Xts,
        192,
        &[c("aes", 64, 16, 0, 96, 0), c("twofish", 64, 16, 32, 128, 0), c("serpent", 64, 16, 64, 160, 0)],
    ),
    chain(
        false,
        "serpent-twofish",
        Xts,
        128,
        &[c("serpent", 64, 16, 0, 64, 0), c("twofish", 64, 16, 32, 96, 0)],
    ),
    chain(false, "camellia", Xts, 64, &[c("camellia", 64, 16, 0, 32, 0)]),
    chain(false, "kuznyechik", Xts, 64, &[c("kuznyechik", 64, 16, 0, 32, 0)]),
    chain(
        false,
        "kuznyechik-camellia",
        Xts,
        128,
        &[c("kuznyechik", 64, 16, 0, 64, 0), c("camellia", 64, 16, 32, 96, 0)],
    ),
    chain(
        false,
        "twofish-kuznyechik",
        Xts,
        128,
        &[c("twofish", 64, 16, 0, 64, 0), c("kuznyechik", 64, 16, 32, 96, 0)],
    ),
    chain(
        false,
        "serpent-camellia",
        Xts,
        128,
        &[c("serpent", 64, 16, 0, 64, 0), c("camellia", 64, 16, 32, 96, 0)],
    ),
    chain(
        false,
        "aes-kuznyechik",
        Xts,
        128,
        &[c("aes", 64, 16, 0, 64, 0), c("kuznyechik", 64, 16, 32, 96, 0)],
    ),
    chain(
        false,
        "camellia-serpent-kuznyechik",
        Xts,
        192,
        &[
            c("camellia", 64, 16, 0, 96, 0),
            c("serpent", 64, 16, 32, 128, 0),
            c("kuznyechik", 64, 16, 64, 160, 0),
        ],
    ),
    chain(false, "aes", Lrw, 48, &[c("aes", 48, 16, 32, 0, 0)]),
    chain(false, "serpent", Lrw, 48, &[c("serpent", 48, 16, 32, 0, 0)]),
    chain(false, "twofish", Lrw, 48, &[c("twofish", 48, 16, 32, 0, 0)]),
    chain(false, "twofish-aes", Lrw, 96, &[c("twofish", 48, 16, 32, 0, 0), c("aes", 48, 16, 64, 0, 0)]),
    chain(
        false,
        "serpent-twofish-aes",
        Lrw,
        144,
        &[c("serpent", 48, 16, 32, 0, 0), c("twofish", 48, 16, 64, 0, 0), c("aes", 48, 16, 96, 0, 0)],
    ),
    chain(false, "aes-serpent", Lrw, 96, &[c("aes", 48, 16, 32, 0, 0), c("serpent", 48, 16, 64, 0, 0)]),
    chain(
        false,
        "aes-twofish-serpent",
        Lrw,
        144,
        &[c("aes", 48, 16, 32, 0, 0), c("twofish", 48, 16, 64, 0, 0), c("serpent", 48, 16, 96, 0, 0)],
    ),
    chain(
        false,
        "serpent-twofish",
        Lrw,
        96,
        &[c("serpent", 48, 16, 32, 0, 0), c("twofish", 48, 16, 64, 0, 0)],
    ),
    chain(true, "aes", CbcTcw, 64, &[c("aes", 32, 16, 32, 0, 32)]),
    chain(true, "serpent", CbcTcw, 64, &[c("serpent", 32, 16, 32, 0, 32)]),
    chain(true, "twofish", CbcTcw, 64, &[c("twofish", 32, 16, 32, 0, 32)]),
    chain(
        true,
        "twofish-aes",
        CbciTcrypt,
        96,
        &[c("twofish", 32, 16, 32, 0, 0), c("aes", 32, 16, 64, 0, 32)],
    ),
    chain(
        true,
        "serpent-twofish-aes",
        CbciTcrypt,
        128,
        &[c("serpent", 32, 16, 32, 0, 0), c("twofish", 32, 16, 64, 0, 0), c("aes", 32, 16, 96, 0, 32)],
    ),
    chain(
        true,
        "aes-serpent",
        CbciTcrypt,
        96,
        &[c("aes", 32, 16, 32, 0, 0), c("serpent", 32, 16, 64, 0, 32)],
    ),
    chain(
        true,
        "aes-twofish-serpent",
        CbciTcrypt,
        128,
        &[c("aes", 32, 16, 32, 0, 0), c("twofish", 32, 16, 64, 0, 0), c("serpent", 32, 16, 96, 0, 32)],
    ),
    chain(
        true,
        "serpent-twofish",
        CbciTcrypt,
        96,
        &[c("serpent", 32, 16, 32, 0, 0), c("twofish", 32, 16, 64, 0, 32)],
    ),
    chain(true, "cast5", CbcTcw, 40, &[c("cast5", 16, 8, 32, 0, 24)]),
    chain(true, "des3_ede", CbcTcw, 48, &[c("des3_ede", 24, 8, 32, 0, 24)]),
    chain(true, "blowfish_le", CbcTcrypt, 80, &[c("blowfish_le", 56, 8, 32, 0, 24)]),
    chain(
        true,
        "blowfish_le-aes",
        CbcTcrypt,
        120,
        &[c("blowfish_le", 56, 8, 32, 0, 0), c("aes", 32, 16, 88, 0, 32)],
    ),
    chain(
        true,
        "serpent-blowfish_le-aes",
        CbcTcrypt,
        152,
        &[c("serpent", 32, 16, 32, 0, 0), c("blowfish_le", 56, 8, 64, 0, 0), c("aes", 32, 16, 120, 0, 32)],
    ),
];

/// The chains to try, as cryptsetup filters them: `cipher` (`--cipher`) matches the chain
/// name by substring, legacy chains only with `legacy`.
pub fn chain_plan(cipher: Option<&str>, legacy: bool) -> Vec<&'static CipherChain> {
    CHAINS.iter().filter(|ch| cipher.is_none_or(|c| ch.name.contains(c)) && (legacy || !ch.legacy)).collect()
}

/// The chain named `name` in `mode` (e.g. a dump's "Cipher chain" and "Cipher mode").
pub fn find_chain(name: &str, mode: ChainMode) -> Option<&'static CipherChain> {
    CHAINS.iter().find(|c| c.name == name && c.mode == mode)
}

impl ChainCipher {
    /// This cipher's dm-crypt key taken from key material `key` (the KDF's 192 bytes for
    /// the header, the header's 256 key bytes for the data), as cryptsetup's
    /// `TCRYPT_copy_key`: XTS: both halves; LRW: cipher key then the shared 16-byte tweak
    /// key at offset 0; CBC: cipher key then IV seed and whitening. `None` if `key` is too
    /// short (never for the tables' entries and 192+ bytes).
    pub fn layer_key(&self, mode: ChainMode, key: &[u8]) -> Option<Zeroizing<Vec<u8>>> {
        let part = |at: usize, len: usize| key.get(at..at.checked_add(len)?);
        let mut out = Zeroizing::new(Vec::with_capacity(self.key_size + self.key_extra_size));
        match mode {
            ChainMode::Xts => {
                let half = self.key_size / 2;
                out.extend_from_slice(part(self.key_offset, half)?);
                out.extend_from_slice(part(self.iv_offset, half)?);
            }
            ChainMode::Lrw => {
                let k = self.key_size.checked_sub(16)?;
                out.extend_from_slice(part(self.key_offset, k)?);
                out.extend_from_slice(part(0, 16)?);
            }
            ChainMode::CbcTcw | ChainMode::CbciTcrypt | ChainMode::CbcTcrypt => {
                out.extend_from_slice(part(self.key_offset, self.key_size)?);
                out.extend_from_slice(part(self.iv_offset, self.key_extra_size)?);
            }
        }
        Some(out)
    }
}

impl CipherChain {
    /// The whole volume key, each cipher's [`layer_key`](ChainCipher::layer_key) in chain
    /// order (cryptsetup's `TCRYPT_get_volume_key`, what `--dump-volume-key` prints).
    pub fn volume_key(&self, keys: &[u8]) -> Option<Zeroizing<Vec<u8>>> {
        // Each layer key is written at the running index, which advances by the cipher key
        // only: a CBC chain's IV seed and whitening (after the last cipher's key) end it.
        let mut out = Zeroizing::new(vec![0u8; self.key_size]);
        let mut at = 0usize;
        for c in self.ciphers {
            let k = c.layer_key(self.mode, keys)?;
            let room = out.len().checked_sub(at)?;
            let n = k.len().min(room);
            out[at..at + n].copy_from_slice(&k[..n]);
            at += c.key_size;
        }
        Some(out)
    }
}

/// Which header to read (cryptsetup's `--tcrypt-hidden`, `--tcrypt-system`, `--tcrypt-backup`).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct HeaderFlags {
    /// The hidden volume's header.
    pub hidden: bool,
    /// System encryption (header in sector 62).
    pub system: bool,
    /// The backup header at the end of the device.
    pub backup: bool,
}

/// Where to look for the 512-byte header, in order (cryptsetup's `TCRYPT_read_phdr`): one
/// place, or for a hidden volume without `backup` the current place and then the old one
/// (TrueCrypt < 6: 1536 bytes before the end). Places that do not fit `device_size` are
/// left out; none fitting is [`TcryptError::DeviceTooSmall`].
pub fn header_offsets(flags: HeaderFlags, device_size: u64) -> Result<Vec<u64>, TcryptError> {
    let from_end = |n: u64| device_size.checked_sub(n);
    let places: Vec<Option<u64>> = if flags.system {
        vec![Some(SYSTEM_OFFSET)]
    } else if flags.hidden && flags.backup {
        vec![from_end(HIDDEN_BACKUP_FROM_END)]
    } else if flags.hidden {
        vec![Some(HIDDEN_OFFSET), from_end(HIDDEN_OFFSET_OLD_FROM_END)]
    } else if flags.backup {
        vec![from_end(BACKUP_FROM_END)]
    } else {
        vec![Some(0)]
    };
    let fit: Vec<u64> = places
        .into_iter()
        .flatten()
        .filter(|o| o.checked_add(BLOCK_LEN as u64).is_some_and(|e| e <= device_size))
        .collect();
    if fit.is_empty() {
        return Err(TcryptError::DeviceTooSmall(device_size));
    }
    Ok(fit)
}

/// Where the data is, in 512-byte sectors, as cryptsetup maps it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct DataLayout {
    /// Start of the ciphertext on the device.
    pub offset: u64,
    /// The IV offset of every layer.
    pub iv_offset: u64,
    /// Length of the volume.
    pub size: u64,
}

/// The data area of a volume opened with header `h` from `flags` on a device of
/// `device_size` bytes, in `mode` (cryptsetup's `TCRYPT_get_data_offset`,
/// `TCRYPT_get_iv_offset` and the size `TCRYPT_activate` maps), checked to lie inside the
/// device. System encryption is mapped as cryptsetup does when it finds no partition (an
/// image of the whole disk): the encrypted area from `mk_offset`, `volume_size` long, IVs
/// counted from the start of the disk.
pub fn data_layout(
    h: &TcryptHeader,
    mode: ChainMode,
    flags: HeaderFlags,
    device_size: u64,
) -> Result<DataLayout, TcryptError> {
    if h.sector_size != 512 {
        return Err(TcryptError::SectorSize(h.sector_size));
    }
    let hidden_old = || {
        device_size
            .checked_sub(h.hidden_volume_size)
            .and_then(|x| x.checked_sub(HIDDEN_OFFSET_OLD_FROM_END))
            .map(|x| x / 512)
    };
    let outside = |offset: u64, len: u64| TcryptError::DataOutside { offset, len, device: device_size };
    let mk = h.mk_offset / 512;
    let offset = if flags.system {
        mk
    } else if mode == ChainMode::Xts {
        if h.version < 3 {
            1
        } else if flags.hidden && h.version <= 3 {
            hidden_old().ok_or_else(|| outside(0, h.hidden_volume_size))?
        } else {
            mk
        }
    } else if flags.hidden {
        hidden_old().ok_or_else(|| outside(0, h.hidden_volume_size))?
    } else {
        mk
    };
    let iv_offset = match mode {
        ChainMode::Xts => offset,
        ChainMode::Lrw => 0,
        _ => mk,
    };
    let bytes = if flags.hidden { h.hidden_volume_size } else { h.volume_size };
    // TrueCrypt < 5 headers leave the size 0: cryptsetup then maps the rest of the device
    // (a dm table of size 0 is sized by `device_block_adjust`).
    let size = match bytes / 512 {
        0 if !flags.system => (device_size / 512).saturating_sub(offset),
        n => n,
    };
    if size == 0 {
        return Err(TcryptError::Empty);
    }
    let bytes = size * 512;
    let end = offset.checked_add(size).and_then(|e| e.checked_mul(512));
    if end.is_none_or(|e| e > device_size) {
        return Err(outside(offset.saturating_mul(512), bytes));
    }
    Ok(DataLayout { offset, iv_offset, size })
}

/// The keyfile pool length and longest passphrase for `passphrase_len` (cryptsetup: with
/// VeraCrypt modes a passphrase over 64 bytes switches both to 128).
pub fn pool_len(veracrypt: bool, passphrase_len: usize) -> usize {
    if veracrypt && passphrase_len > TC_POOL_LEN {
        VC_POOL_LEN
    } else {
        TC_POOL_LEN
    }
}

/// Mixes one keyfile into `pool` (TrueCrypt's keyfile algorithm): a running CRC-32 over
/// the first [`KEYFILE_MAX`] bytes (the CRC-32 register, started at all ones and never
/// inverted at the end), each step adding the register's four bytes (big-endian order) to
/// the next four pool bytes, wrapping around the pool.
pub fn mix_keyfile(pool: &mut [u8], data: &[u8]) {
    if pool.is_empty() {
        return;
    }
    let mut h = crc32fast::Hasher::new();
    let mut j = 0;
    for byte in data.iter().take(KEYFILE_MAX) {
        h.update(std::slice::from_ref(byte));
        // The running register, without the final inversion a finished CRC-32 has.
        let crc = !h.clone().finalize();
        for b in crc.to_be_bytes() {
            pool[j] = pool[j].wrapping_add(b);
            j += 1;
        }
        j %= pool.len();
    }
}

/// The KDF password from a passphrase and keyfiles (cryptsetup's `TCRYPT_init_hdr`):
/// without keyfiles the passphrase itself; with keyfiles the whole pool (each keyfile
/// mixed in, then the passphrase's bytes added to its start).
pub fn kdf_password(
    passphrase: &[u8],
    keyfiles: &[&[u8]],
    veracrypt: bool,
) -> Result<Zeroizing<Vec<u8>>, TcryptError> {
    let len = pool_len(veracrypt, passphrase.len());
    if passphrase.len() > len {
        return Err(TcryptError::PassphraseTooLong(len));
    }
    if keyfiles.is_empty() {
        return Ok(Zeroizing::new(passphrase.to_vec()));
    }
    let mut pool = Zeroizing::new(vec![0u8; len]);
    for k in keyfiles {
        mix_keyfile(&mut pool, k);
    }
    for (p, b) in pool.iter_mut().zip(passphrase) {
        *p = p.wrapping_add(*b);
    }
    Ok(pool)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn header() -> TcryptHeader {
        let mut keys = Zeroizing::new([0u8; KEYS_LEN]);
        keys.iter_mut().enumerate().for_each(|(i, k)| *k = i as u8);
        TcryptHeader {
            magic: Magic::VeraCrypt,
            version: 5,
            version_tc: 0x010b,
            keys_crc32: 0,
            hidden_volume_size: 0,
            volume_size: 1 << 20,
            mk_offset: 131072,
            mk_size: 1 << 20,
            flags: 0,
            sector_size: 512,
            header_crc32: 0,
            keys,
        }
    }

    #[test]
    fn header_round_trips_and_checks_both_crcs() {
        let b = header().encode();
        let h = TcryptHeader::decode(&b[..], true).unwrap();
        assert_eq!(h.encode()[..], b[..]);
        assert_eq!(h.volume_size, 1 << 20);
        assert_eq!(TcryptHeader::decode(&b[..], false).unwrap_err(), TcryptError::Magic);
        let mut bad = *b;
        bad[40] ^= 1;
        assert!(matches!(TcryptHeader::decode(&bad, true), Err(TcryptError::HeaderCrc { .. })));
        let mut bad = *b;
        bad[300] ^= 1;
        assert!(matches!(TcryptHeader::decode(&bad, true), Err(TcryptError::KeysCrc { .. })));
        assert_eq!(TcryptHeader::decode(&b[..100], true).unwrap_err(), TcryptError::Short(100));
    }

    #[test]
    fn old_versions_skip_the_header_crc_and_zero_fields_default() {
        let mut h = header();
        h.version = 3;
        h.mk_offset = 0;
        h.sector_size = 0;
        let mut b = h.encode();
        b[HEADER_CRC_OFFSET] ^= 0xff;
        let d = TcryptHeader::decode(&b[..], true).unwrap();
        assert_eq!((d.mk_offset, d.sector_size), (512, 512));
    }

    #[test]
    fn pim_iterations_follow_veracrypt() {
        let plan = kdf_plan(Some("sha512"), true, true, Some(10)).unwrap();
        assert_eq!(plan.len(), 1);
        assert_eq!(plan[0].1, 15000 + 10 * 1000);
        // Boot (system) KDF: 2048 × PIM.
        let plan = kdf_plan(Some("sha256"), true, true, Some(3)).unwrap();
        assert_eq!(plan.iter().map(|p| p.1).collect::<Vec<_>>(), [18000, 6144]);
        // Without a PIM, TrueCrypt first then VeraCrypt defaults.
        let all = kdf_plan(None, true, true, None).unwrap();
        assert_eq!(all.len(), KDFS.len());
        assert_eq!(all[0].1, 2000);
        assert!(kdf_plan(None, false, false, None).unwrap().iter().all(|(k, _)| !k.veracrypt && !k.legacy));
        assert_eq!(kdf_plan(None, true, true, Some(u32::MAX)).unwrap_err(), TcryptError::PimRange(u32::MAX));
    }

    #[test]
    fn keyfile_pool_is_crc_mixed() {
        // One byte 0x00: the register after it is !crc32([0]) = !0xd202ef8d = 0x2dfd1072,
        // its bytes added to the first four pool bytes.
        let mut pool = [0u8; 64];
        mix_keyfile(&mut pool, &[0]);
        assert_eq!(&pool[..5], &[0x2d, 0xfd, 0x10, 0x72, 0]);
        // 17 bytes wrap around a 64-byte pool (16 × 4 = 64), the 17th lands at 0 again.
        let mut a = [0u8; 64];
        mix_keyfile(&mut a, &[1u8; 17]);
        let mut b = [0u8; 64];
        mix_keyfile(&mut b, &[1u8; 16]);
        assert_ne!(a[..4], b[..4]);
        assert_eq!(a[4..], b[4..]);
        // Only the first MiB counts.
        let big = vec![7u8; KEYFILE_MAX + 10];
        let (mut x, mut y) = ([0u8; 64], [0u8; 64]);
        mix_keyfile(&mut x, &big);
        mix_keyfile(&mut y, &big[..KEYFILE_MAX]);
        assert_eq!(x, y);
    }

    #[test]
    fn password_is_the_pool_with_keyfiles() {
        let p = kdf_password(b"abc", &[], true).unwrap();
        assert_eq!(&p[..], b"abc");
        let p = kdf_password(b"abc", &[&[0u8]], false).unwrap();
        assert_eq!(p.len(), 64);
        assert_eq!(&p[..4], &[0x2d + b'a', 0xfd_u8.wrapping_add(b'b'), 0x10 + b'c', 0x72]);
        assert_eq!(kdf_password(&[1u8; 70], &[], false).unwrap_err(), TcryptError::PassphraseTooLong(64));
        assert_eq!(kdf_password(&[1u8; 70], &[&[0u8]], true).unwrap().len(), 128);
        assert_eq!(kdf_password(&[1u8; 129], &[], true).unwrap_err(), TcryptError::PassphraseTooLong(128));
    }

    #[test]
    fn layer_keys_follow_cryptsetups_layout() {
        let key: Vec<u8> = (0..=255u8).collect();
        let ch = CHAINS.iter().find(|c| c.name == "serpent-twofish-aes" && c.mode == ChainMode::Xts).unwrap();
        let k = ch.ciphers[2].layer_key(ch.mode, &key).unwrap();
        assert_eq!(&k[..32], &key[64..96]);
        assert_eq!(&k[32..], &key[160..192]);
        let lrw = CHAINS.iter().find(|c| c.name == "aes" && c.mode == ChainMode::Lrw).unwrap();
        let k = lrw.ciphers[0].layer_key(lrw.mode, &key).unwrap();
        assert_eq!(&k[..32], &key[32..64]);
        assert_eq!(&k[32..], &key[..16]);
        assert_eq!(ch.volume_key(&key).unwrap().len(), ch.key_size);
        for ch in CHAINS {
            assert_eq!(ch.volume_key(&key[..HDR_KEY_LEN]).unwrap().len(), ch.key_size, "{}", ch.name);
        }
    }

    #[test]
    fn header_positions() {
        let size = 4 << 20;
        assert_eq!(header_offsets(HeaderFlags::default(), size).unwrap(), [0]);
        let hidden = HeaderFlags { hidden: true, ..Default::default() };
        assert_eq!(header_offsets(hidden, size).unwrap(), [65536, size - 1536]);
        let backup = HeaderFlags { backup: true, ..Default::default() };
        assert_eq!(header_offsets(backup, size).unwrap(), [size - 131072]);
        assert_eq!(header_offsets(HeaderFlags { backup: true, ..hidden }, size).unwrap(), [size - 65536]);
        let system = HeaderFlags { system: true, ..Default::default() };
        assert_eq!(header_offsets(system, size).unwrap(), [31744]);
        assert_eq!(header_offsets(backup, 1000).unwrap_err(), TcryptError::DeviceTooSmall(1000));
    }

    #[test]
    fn data_layout_is_bounded() {
        let h = header();
        let size = 2 << 20;
        let l = data_layout(&h, ChainMode::Xts, HeaderFlags::default(), size).unwrap();
        assert_eq!(l, DataLayout { offset: 256, iv_offset: 256, size: 2048 });
        assert!(matches!(
            data_layout(&h, ChainMode::Xts, HeaderFlags::default(), 1 << 20),
            Err(TcryptError::DataOutside { .. })
        ));
        let mut huge = header();
        huge.mk_offset = u64::MAX;
        assert!(data_layout(&huge, ChainMode::Xts, HeaderFlags::default(), size).is_err());
        let mut s = header();
        s.sector_size = 4096;
        assert_eq!(
            data_layout(&s, ChainMode::Xts, HeaderFlags::default(), size),
            Err(TcryptError::SectorSize(4096))
        );
        // Size 0 (TrueCrypt < 5): the rest of the device, as cryptsetup; nothing left: empty.
        let mut e = header();
        e.volume_size = 100;
        let l = data_layout(&e, ChainMode::Xts, HeaderFlags::default(), size).unwrap();
        assert_eq!(l, DataLayout { offset: 256, iv_offset: 256, size: 4096 - 256 });
        e.mk_offset = size;
        assert_eq!(data_layout(&e, ChainMode::Xts, HeaderFlags::default(), size), Err(TcryptError::Empty));
        let l = data_layout(&h, ChainMode::Lrw, HeaderFlags::default(), size).unwrap();
        assert_eq!(l.iv_offset, 0);
    }
}
