//! Stacks the harness builds for itself, on temporary volumes.
//!
//! Every stack is assembled by the same calls as the CLI's: `volume::storage::open`, then
//! `volume::format` (stacks that need a formatted volume) and `volume::open`:
//!
//! ```text
//!   StackSpec ──build(dir, size)──► temp file (preallocated, on a real filesystem)
//!                                      └─ volume::storage::open (buffered | O_DIRECT)
//!   raw               [lock: none | range | rwlock | mutex] over the storage
//!   crypt             the same, then volume::open(Spec::Plain) (cipher, key, sector size, mode)
//!   integrity         volume::format(FormatSpec::Integrity, no wipe) ─► open(Spec::Integrity)
//!   crypt-integrity   the same, then open(Spec::Layers[Integrity, Plain]) (plain aes-xts over it)
//!   luks2             volume::format(FormatSpec::Luks, PBKDF2 1000 iterations) ─► open(Spec::Luks)
//!   luks2-integrity   the same with `--integrity` (authenticated encryption: AEAD dm-crypt
//!                     over dm-integrity with external tags, one format call), J or D
//! ```
//! No wipe: the precondition pass writes every block (valid tags) before anything reads.
//! The file is made large enough for the metadata, and the top of the stack is cut to
//! exactly the requested size, so every variant of a comparison has the same region.
//!
//! **Extension point.** A new layer is a new [`StackKind`]: give it its knobs in
//! [`StackSpec`] (`set`), its description, and a branch in [`StackSpec::build`]. A kind whose
//! layer does not exist yet is refused by [`StackSpec::check`] with
//! [`BenchError::NotImplemented`], so presets that need it are listed, shaped, and say what is
//! missing.

use std::path::{Path, PathBuf};
use std::sync::Arc;

use blockdev::{BlockDevice, MemDevice, RangeLocked, Slice, WriteFlags};
use rand::RngCore;
use sector_crypto::kdf::Passphrase;
use sector_crypto::tag::TagHash;
use sector_crypto::{AeadSpec, CipherSpec, SectorCipher, SectorParams, VolumeKey};
use targets::integrity::{HashMode, Mode};
use targets::CryptMode;
use volume::integrity::IntegrityParams;
use volume::luks::CryptOptions;
use volume::plain::PlainParams;
use volume::{FormatSpec, Keys, Layer, Spec, Storage};

use crate::locks::GlobalLocked;
use crate::spec::{parse_bool, parse_size};
use crate::BenchError;

/// Which layers.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum StackKind {
    /// The backing file alone.
    Raw,
    /// Plain dm-crypt over the file.
    Crypt,
    /// dm-integrity over the file (a volume formatted by `volume::integrity`).
    Integrity,
    /// Plain dm-crypt (aes-xts) over a dm-integrity volume with an internal hash: the same
    /// I/O shape as authenticated encryption (data + tags per block, journal), with the tag
    /// computed below the cipher instead of by it.
    CryptIntegrity,
    /// A LUKS2 volume (made by `volume::luks::format`, opened by `volume::luks::open`).
    Luks2,
    /// A LUKS2 volume with authenticated encryption (`luksFormat --integrity`): AEAD
    /// dm-crypt over dm-integrity with external tags.
    Luks2Integrity,
}

impl std::str::FromStr for StackKind {
    type Err = BenchError;
    fn from_str(s: &str) -> Result<Self, BenchError> {
        Ok(match s {
            "raw" | "file" => StackKind::Raw,
            "crypt" | "plain" => StackKind::Crypt,
            "integrity" => StackKind::Integrity,
            "crypt-integrity" | "crypt+integrity" => StackKind::CryptIntegrity,
            "luks2" => StackKind::Luks2,
            "luks2-integrity" | "luks2-aead" | "aead" => StackKind::Luks2Integrity,
            _ => {
                return Err(BenchError::usage(format!(
                    "stack={s}: expected raw, crypt, integrity, crypt-integrity, luks2 or luks2-integrity"
                )))
            }
        })
    }
}

/// Lock between the file and the layers above (the lock-granularity knob).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum LockKind {
    /// No lock.
    None,
    /// `blockdev::RangeLocked`: overlapping requests are ordered, disjoint ones never wait.
    Range,
    /// One shared/exclusive lock: reads share, writes exclude (an inode rwsem).
    RwLock,
    /// One mutex: every request exclusive.
    Mutex,
}

impl std::str::FromStr for LockKind {
    type Err = BenchError;
    fn from_str(s: &str) -> Result<Self, BenchError> {
        Ok(match s {
            "none" => LockKind::None,
            "range" => LockKind::Range,
            "rwlock" | "inode" => LockKind::RwLock,
            "mutex" | "global" => LockKind::Mutex,
            _ => return Err(BenchError::usage(format!("lock={s}: expected none, range, rwlock or mutex"))),
        })
    }
}

/// dm-integrity knobs (integritysetup's options, plus the engine's two performance knobs).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct IntegrityKnobs {
    /// Internal hash (`-I`): `crc32c`, `sha256`, `hmac-sha256`, ... (HMACs get a random key).
    pub hash: String,
    /// `J` (journal), `B` (bitmap) or `D` (direct).
    pub mode: Mode,
    /// Integrity block size (`-s`, 512..4096). The bench default is 4096 (integritysetup's
    /// is 512): the workloads are 4k and up.
    pub block_size: u32,
    /// Metadata buffer size in 512-byte sectors (`buffer_sectors`, kernel default 128).
    pub buffer_sectors: u32,
    /// `--interleave-sectors` (`None`: integritysetup's 32768).
    pub interleave_sectors: Option<u32>,
    /// `-t` tag size (`None`: the digest size).
    pub tag_size: Option<u32>,
    /// `-j` journal size in bytes (`None`: the kernel's default, 1/128 of the device, at
    /// most 64 MiB: 2 MiB on a 256 MiB volume).
    pub journal_size: Option<u64>,
    /// `journal_watermark` percent (`None`: the kernel's 50): the journal fill at which its
    /// copy-out starts. Set at open, not in the format.
    pub journal_watermark: Option<u32>,
    /// Where tags are computed: inline (shash), pool (ahash-like offload), auto.
    pub hash_mode: HashMode,
    /// Always read a metadata buffer before writing it, even when a write covers it whole
    /// (the engine's `skip_rmw` off: the kernel before the seed-004 patch).
    pub rmw: bool,
}

impl Default for IntegrityKnobs {
    fn default() -> Self {
        IntegrityKnobs {
            hash: "crc32c".into(),
            mode: Mode::Journal,
            block_size: 4096,
            buffer_sectors: 128,
            interleave_sectors: None,
            tag_size: None,
            journal_size: None,
            journal_watermark: None,
            hash_mode: HashMode::Auto,
            rmw: false,
        }
    }
}

fn parse_integrity_mode(s: &str) -> Result<Mode, BenchError> {
    Ok(match s {
        "J" | "j" | "journal" => Mode::Journal,
        "B" | "b" | "bitmap" => Mode::Bitmap,
        "D" | "d" | "direct" => Mode::Direct,
        _ => return Err(BenchError::usage(format!("integrity-mode={s}: expected J, B or D"))),
    })
}

fn parse_hash_mode(s: &str) -> Result<HashMode, BenchError> {
    s.parse().map_err(|_| BenchError::usage(format!("hash-mode={s}: expected inline, pool or auto")))
}

/// PBKDF2 iterations of the bench's LUKS2 keyslot: the minimum, so that opening costs nothing.
pub const LUKS2_PBKDF2_ITERATIONS: u32 = sector_crypto::kdf::PBKDF2_MIN_ITERATIONS;
/// Bytes before the payload of a default LUKS2 header (cryptsetup's 16 MiB data offset).
const LUKS2_DATA_OFFSET: u64 = 16 << 20;

/// A stack to build on a temporary volume.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct StackSpec {
    /// Layers.
    pub kind: StackKind,
    /// dm-crypt cipher spec.
    pub cipher: String,
    /// Key size in bits (random key).
    pub key_bits: u32,
    /// Encryption sector size.
    pub sector_size: u32,
    /// IVs in sector-size units.
    pub iv_large_sectors: bool,
    /// Where crypto runs (both directions).
    pub crypt_mode: CryptMode,
    /// Lock under the layers.
    pub lock: LockKind,
    /// O_DIRECT on the backing file.
    pub direct: bool,
    /// dm-integrity knobs.
    pub integrity: IntegrityKnobs,
    /// `luksFormat --integrity` of the luks2-integrity stack: `hmac-sha256` (default),
    /// `hmac-sha1`, `hmac-sha512`, or `aead` (with `--cipher aes-gcm-random`).
    pub luks_integrity: String,
    /// Close and reopen the volume before every job (cold metadata caches, as after a fresh
    /// `integritysetup open`); the harness does it where it runs jobs (`compare`).
    pub reopen: bool,
}

impl Default for StackSpec {
    fn default() -> Self {
        StackSpec {
            kind: StackKind::Crypt,
            cipher: "aes-xts-plain64".into(),
            key_bits: 512,
            sector_size: 4096,
            iv_large_sectors: false,
            crypt_mode: CryptMode::Auto,
            lock: LockKind::None,
            direct: false,
            integrity: IntegrityKnobs::default(),
            luks_integrity: "hmac-sha256".into(),
            reopen: false,
        }
    }
}

fn parse_mode(s: &str) -> Result<CryptMode, BenchError> {
    s.parse().map_err(|_| BenchError::usage(format!("crypt-mode={s}: expected auto, pool or inline")))
}

impl StackSpec {
    /// The backing file alone.
    pub fn raw() -> Self {
        StackSpec { kind: StackKind::Raw, ..StackSpec::default() }
    }

    /// aes-xts-plain64, 512-bit random key, 4096-byte sectors, crypto where `mode` says.
    pub fn crypt(mode: CryptMode) -> Self {
        StackSpec { crypt_mode: mode, ..StackSpec::default() }
    }

    /// Applies one `key=value` stack option (`-` and `_` are the same). Returns `Ok(false)`
    /// for a key that is not a stack option.
    pub fn set(&mut self, key: &str, value: &str) -> Result<bool, BenchError> {
        let num =
            |v: &str| v.parse::<u32>().map_err(|_| BenchError::usage(format!("{key}={v}: not a number")));
        match key.replace('_', "-").as_str() {
            "stack" => self.kind = value.parse()?,
            "cipher" => self.cipher = value.to_string(),
            "key-size" => self.key_bits = num(value)?,
            "sector-size" => self.sector_size = parse_size(value)? as u32,
            "iv-large-sectors" => self.iv_large_sectors = parse_bool(key, value)?,
            "crypt-mode" => self.crypt_mode = parse_mode(value)?,
            "perf-no-read-workqueue" | "perf-no-write-workqueue" => {
                if parse_bool(key, value)? {
                    self.crypt_mode = CryptMode::Inline
                }
            }
            "lock" => self.lock = value.parse()?,
            "direct" => self.direct = parse_bool(key, value)?,
            "integrity-alg" | "integrity" | "hash" | "internal-hash" => {
                self.integrity.hash = value.to_string()
            }
            "integrity-mode" => self.integrity.mode = parse_integrity_mode(value)?,
            "luks-integrity" => self.luks_integrity = value.to_string(),
            "block-size" => self.integrity.block_size = parse_size(value)? as u32,
            "buffer-sectors" => self.integrity.buffer_sectors = num(value)?,
            "interleave-sectors" => self.integrity.interleave_sectors = Some(num(value)?),
            "tag-size" => self.integrity.tag_size = Some(num(value)?),
            "journal-size" => self.integrity.journal_size = Some(parse_size(value)?),
            "journal-watermark" => {
                let w: u32 = num(value)?;
                if w > 100 {
                    return Err(BenchError::usage(format!("journal-watermark={w}: a percentage, 0..100")));
                }
                self.integrity.journal_watermark = Some(w)
            }
            "hash-mode" => self.integrity.hash_mode = parse_hash_mode(value)?,
            "parallel-hash" | "hash-offload" => {
                self.integrity.hash_mode =
                    if parse_bool(key, value)? { HashMode::Pool } else { HashMode::Inline }
            }
            "rmw" => self.integrity.rmw = parse_bool(key, value)?,
            "reopen" => self.reopen = parse_bool(key, value)?,
            _ => return Ok(false),
        }
        Ok(true)
    }

    /// One line for reports.
    pub fn describe(&self) -> String {
        let io = if self.direct { "O_DIRECT" } else { "buffered" };
        let lock = match self.lock {
            LockKind::None => String::new(),
            LockKind::Range => " + range locks".into(),
            LockKind::RwLock => " + global rwlock".into(),
            LockKind::Mutex => " + global mutex".into(),
        };
        let crypt = || {
            format!(
                "crypt({}, {}-bit key, {}-byte sectors{}, {})",
                self.cipher,
                self.key_bits,
                self.sector_size,
                if self.iv_large_sectors { ", iv_large_sectors" } else { "" },
                self.crypt_mode.name()
            )
        };
        let i = &self.integrity;
        let integ = || {
            let mut s = format!(
                "integrity({}, {}, {}-byte blocks, buffer_sectors={}, hash {}",
                i.hash,
                i.mode.letter(),
                i.block_size,
                i.buffer_sectors,
                i.hash_mode.name()
            );
            if let Some(n) = i.interleave_sectors {
                s.push_str(&format!(", interleave_sectors={n}"));
            }
            if let Some(t) = i.tag_size {
                s.push_str(&format!(", tag_size={t}"));
            }
            if let Some(j) = i.journal_size {
                s.push_str(&format!(", journal {}", crate::spec::format_size(j)));
            }
            if let Some(w) = i.journal_watermark {
                s.push_str(&format!(", journal_watermark {w}"));
            }
            if i.rmw {
                s.push_str(", rmw forced");
            }
            s.push(')');
            s
        };
        let layers = match self.kind {
            StackKind::Raw => "raw".to_string(),
            StackKind::Crypt => crypt(),
            StackKind::Integrity => integ(),
            StackKind::CryptIntegrity => format!("{} over {}", crypt(), integ()),
            StackKind::Luks2 => format!("luks2 {} [pbkdf2, {LUKS2_PBKDF2_ITERATIONS} iterations]", crypt()),
            StackKind::Luks2Integrity => format!(
                "luks2 aead({} + {}, {}-bit key, {}-byte sectors) over integrity(external tags, {}{}) [pbkdf2, {LUKS2_PBKDF2_ITERATIONS} iterations]",
                self.cipher,
                self.luks_integrity,
                self.key_bits,
                self.sector_size,
                i.mode.letter(),
                i.journal_size.map(|j| format!(", journal {}", crate::spec::format_size(j))).unwrap_or_default()
                    + &i.journal_watermark.map(|w| format!(", journal_watermark {w}")).unwrap_or_default()
            ),
        };
        let reopen = if self.reopen { ", reopened before each job" } else { "" };
        format!("{layers}{lock} over file ({io}{reopen})")
    }

    /// Checks that this stack can be built here (before any volume is made).
    pub fn check(&self) -> Result<(), BenchError> {
        let check_cipher = || -> Result<(), BenchError> {
            let spec: CipherSpec =
                self.cipher.parse().map_err(|e| BenchError::setup(format!("cipher {}", self.cipher), e))?;
            let key = VolumeKey::new(vec![0x42; (self.key_bits / 8) as usize]);
            let params = SectorParams {
                sector_size: self.sector_size,
                iv_offset: 0,
                iv_large_sectors: self.iv_large_sectors,
            };
            SectorCipher::new(&spec, &key, params)
                .map_err(|e| BenchError::setup(format!("cipher {}", self.cipher), e))?;
            Ok(())
        };
        let check_integrity = || -> Result<(), BenchError> {
            let i = &self.integrity;
            TagHash::new(&i.hash, self.hmac_key_for_check().as_deref())
                .map_err(|e| BenchError::setup(format!("integrity algorithm {}", i.hash), e))?;
            if !matches!(i.block_size, 512 | 1024 | 2048 | 4096) {
                return Err(BenchError::usage(format!(
                    "block-size={}: expected 512, 1024, 2048 or 4096",
                    i.block_size
                )));
            }
            if i.buffer_sectors == 0 {
                return Err(BenchError::usage("buffer-sectors must be at least 1"));
            }
            if self.lock != LockKind::None {
                return Err(BenchError::usage("lock= applies to the raw and crypt stacks only"));
            }
            Ok(())
        };
        match self.kind {
            StackKind::Raw => Ok(()),
            StackKind::Crypt => check_cipher(),
            StackKind::Integrity => check_integrity(),
            StackKind::CryptIntegrity => check_integrity().and_then(|_| check_cipher()),
            StackKind::Luks2 => {
                if self.lock != LockKind::None {
                    return Err(BenchError::usage("lock= applies to the raw and crypt stacks only"));
                }
                check_cipher()
            }
            StackKind::Luks2Integrity => {
                if self.lock != LockKind::None {
                    return Err(BenchError::usage("lock= applies to the raw and crypt stacks only"));
                }
                if self.integrity.mode == Mode::Bitmap {
                    return Err(BenchError::usage(
                        "integrity-mode=B: LUKS2 authenticated encryption runs dm-integrity journaled (J) or direct (D)",
                    ));
                }
                let spec = self.aead_spec()?;
                if !volume::luks::key_bytes(self.key_bits as usize)
                    .is_ok_and(|b| spec.valid_key_sizes().contains(&b))
                {
                    return Err(BenchError::usage(format!(
                        "key-size={}: {} takes {} bits",
                        self.key_bits,
                        spec,
                        spec.valid_key_sizes()
                            .iter()
                            .map(|b| (b * 8).to_string())
                            .collect::<Vec<_>>()
                            .join(" or ")
                    )));
                }
                Ok(())
            }
        }
    }

    /// The authenticated cipher of the luks2-integrity stack.
    fn aead_spec(&self) -> Result<AeadSpec, BenchError> {
        AeadSpec::from_luks2(&self.cipher, &self.luks_integrity).map_err(|e| {
            BenchError::setup(format!("cipher {} with integrity {}", self.cipher, self.luks_integrity), e)
        })
    }

    fn hmac_key_for_check(&self) -> Option<Vec<u8>> {
        self.integrity.hash.contains("hmac").then(|| vec![0x42; 32])
    }

    /// Whether the stack is a volume the harness formats itself (integrity, LUKS2).
    pub fn needs_format(&self) -> bool {
        matches!(
            self.kind,
            StackKind::Integrity | StackKind::CryptIntegrity | StackKind::Luks2 | StackKind::Luks2Integrity
        )
    }

    /// The integritysetup parameters of this stack's integrity layer, with `key` for an HMAC.
    pub fn integrity_params(&self, key: &[u8]) -> IntegrityParams {
        let i = &self.integrity;
        let mut p = IntegrityParams {
            integrity: i.hash.clone(),
            key: i.hash.contains("hmac").then(|| sector_crypto::secure::SecretBuf::from_slice(key)),
            tag_size: i.tag_size,
            journal_size: i.journal_size,
            sector_size: i.block_size,
            mode: i.mode,
            buffer_sectors: i.buffer_sectors,
            direct: self.direct,
            skip_rmw: !i.rmw,
            hash_mode: i.hash_mode,
            ..IntegrityParams::default()
        };
        if let Some(w) = i.journal_watermark {
            p.journal_watermark = w;
        }
        if let Some(n) = i.interleave_sectors {
            p.interleave_sectors = n;
        }
        p
    }

    /// Size of the file an integrity volume of at least `size` provided bytes is made on.
    pub(crate) fn integrity_file_size(&self, size: u64) -> u64 {
        self.backing_size(size, 4 << 20)
    }

    /// Size of a backing file that gives at least `size` payload bytes, with `slack` extra
    /// bytes for an integrity layout (multiplied by 4 on each retry of `build`).
    fn backing_size(&self, size: u64, slack: u64) -> u64 {
        match self.kind {
            StackKind::Raw | StackKind::Crypt => size,
            StackKind::Luks2 => size + LUKS2_DATA_OFFSET,
            StackKind::Integrity | StackKind::CryptIntegrity => {
                let i = &self.integrity;
                let tag = u64::from(i.tag_size.unwrap_or(32));
                let tags = size / u64::from(i.block_size) * tag;
                // Journal (device/128, at most 64 MiB), tags, padding per interleave area.
                let journal = i.journal_size.unwrap_or((size >> 7).min(64 << 20));
                (size + journal + tags + slack).div_ceil(1 << 20) << 20
            }
            StackKind::Luks2Integrity => {
                // The LUKS2 header, then dm-integrity (journal, tags) in the data area.
                let tuple = self.aead_spec().map_or(64, |s| s.tuple_size() as u64);
                let tags = size / u64::from(self.sector_size) * tuple;
                let journal = self.integrity.journal_size.unwrap_or((size >> 7).min(64 << 20));
                (LUKS2_DATA_OFFSET + size + journal + tags + slack).div_ceil(1 << 20) << 20
            }
        }
    }

    /// Makes a temporary volume of `size` payload bytes in `dir` and stacks the layers on it.
    /// The file is removed when the returned stack is dropped.
    pub fn build(&self, dir: &Path, size: u64) -> Result<BuiltStack, BenchError> {
        self.check()?;
        let secrets = Secrets::random();
        let mut slack = 4 << 20;
        loop {
            let path = temp_volume(dir, self.backing_size(size, slack))?;
            self.format(&path, &secrets)?;
            let device = self.stack_on(&path, &secrets)?;
            let have = device.geometry().size;
            if have < size {
                if slack >= 1 << 30 {
                    return Err(BenchError::Internal(format!(
                        "{}: a volume of {have} bytes where {size} were asked",
                        self.describe()
                    )));
                }
                drop(device);
                slack *= 4;
                continue;
            }
            let device = cut(device, size)?;
            return Ok(BuiltStack {
                device,
                description: self.describe(),
                path: Backing::Temporary(path),
                spec: self.clone(),
                secrets,
                size,
            });
        }
    }

    /// Formats `path` for the stacks that need it (no wipe), with one `volume::format` call.
    fn format(&self, path: &Path, secrets: &Secrets) -> Result<(), BenchError> {
        let p = path_str(path)?;
        let spec = match self.kind {
            StackKind::Raw | StackKind::Crypt => return Ok(()),
            StackKind::Integrity | StackKind::CryptIntegrity => {
                let mut params = self.integrity_params(&secrets.hmac_key);
                params.direct = false;
                FormatSpec::Integrity { params, salt: secrets.salt, no_wipe: true }
            }
            StackKind::Luks2 | StackKind::Luks2Integrity => {
                // No wipe: the precondition pass writes every block (valid tags) first.
                let integrity = match self.kind {
                    StackKind::Luks2Integrity => Some(volume::luks::LuksIntegrity {
                        spec: self.aead_spec()?,
                        no_wipe: true,
                        no_journal: self.integrity.mode == Mode::Direct,
                        journal_size: self.integrity.journal_size,
                    }),
                    _ => None,
                };
                let mut params = volume::luks::FormatParams::for_cipher(
                    volume::luks::LuksVersion::V2,
                    &self.cipher,
                    Some(self.key_bits as usize),
                    integrity,
                )
                .map_err(|e| BenchError::setup(format!("formatting {p} as LUKS2"), e))?;
                params.sector_size = self.sector_size;
                params.pbkdf = volume::luks::PbkdfParams {
                    kind: Some(volume::luks::PbkdfType::Pbkdf2),
                    force_iterations: Some(LUKS2_PBKDF2_ITERATIONS),
                    ..volume::luks::PbkdfParams::default()
                };
                let pass = secrets.passphrase();
                let storage = self.storage(path, false)?;
                volume::format(FormatSpec::Luks { params, header: None, passphrase: &pass }, &storage, go_on)
                    .map_err(|e| BenchError::setup(format!("formatting {p} as LUKS2"), e))?;
                return storage.device.flush().map_err(|e| BenchError::setup(format!("flushing {p}"), e));
            }
        };
        let storage = self.storage(path, false)?;
        volume::format(spec, &storage, go_on)
            .map(|_| ())
            .map_err(|e| BenchError::setup(format!("formatting {p} for dm-integrity"), e))
    }

    /// The backing file (O_DIRECT when `direct` and this stack asks for it).
    fn storage(&self, path: &Path, direct: bool) -> Result<Storage, BenchError> {
        let p = path_str(path)?;
        let so =
            volume::StorageOptions { direct: direct && self.direct, ..volume::StorageOptions::default() };
        volume::storage::open(p, &so).map_err(|e| BenchError::setup(format!("opening {p}"), e))
    }

    /// Stacks the layers on an existing file or block device (fio's `filename`). Nothing
    /// is created or deleted; a crypt layer gets a fresh random key, so whatever the file
    /// held reads back as noise and writes destroy it. Stacks that need a format (integrity,
    /// LUKS2) are refused: the harness formats only volumes it made.
    pub fn open_existing(&self, path: &Path) -> Result<BuiltStack, BenchError> {
        self.check()?;
        if self.needs_format() {
            return Err(BenchError::usage(format!(
                "{}: this stack formats its volume; run it on a temporary volume (--dir), not --filename",
                self.describe()
            )));
        }
        let secrets = Secrets::random();
        let device = self.stack_on(path, &secrets)?;
        let size = device.geometry().size;
        let description = format!("{} {}", self.describe(), path.display());
        Ok(BuiltStack {
            device,
            description,
            path: Backing::Existing(path.to_path_buf()),
            spec: self.clone(),
            secrets,
            size,
        })
    }

    /// Assembles the stack on `path` through `volume::open`; the lock knob wraps the
    /// storage before the crypt layer goes on it.
    fn stack_on(&self, path: &Path, secrets: &Secrets) -> Result<Arc<dyn BlockDevice>, BenchError> {
        let p = path_str(path)?;
        let storage = self.storage(path, true)?;
        let opts =
            volume::OpenOptions { direct: self.direct, crypt_mode: self.crypt_mode, ..Default::default() };
        let spec = match self.kind {
            StackKind::Raw | StackKind::Crypt => {
                let dev = storage.device;
                let below: Arc<dyn BlockDevice> = match self.lock {
                    LockKind::None => dev,
                    LockKind::Range => Arc::new(RangeLocked::new(dev)),
                    LockKind::RwLock => Arc::new(GlobalLocked::shared_reads(dev)),
                    LockKind::Mutex => Arc::new(GlobalLocked::exclusive(dev)),
                };
                if self.kind == StackKind::Raw {
                    return Ok(below);
                }
                let storage = Storage::new(below, storage.name);
                let spec = Spec::Plain(self.plain_params(&secrets.crypt_key));
                return self.open(spec, Keys::none(), storage, &opts, p);
            }
            StackKind::Integrity => Spec::Integrity(self.integrity_params(&secrets.hmac_key)),
            StackKind::CryptIntegrity => Spec::Layers(vec![
                Layer::Integrity(self.integrity_params(&secrets.hmac_key)),
                Layer::Plain(self.plain_params(&secrets.crypt_key)),
            ]),
            StackKind::Luks2 | StackKind::Luks2Integrity => {
                let pass = secrets.passphrase();
                let mut once = volume::OnePassphrase::new(&pass);
                let mut l = volume::LuksSpec {
                    version: Some(volume::luks::LuksVersion::V2),
                    integrity_no_journal: self.kind == StackKind::Luks2Integrity
                        && self.integrity.mode == Mode::Direct,
                    ..volume::LuksSpec::default()
                };
                if self.kind == StackKind::Luks2Integrity && !l.integrity_no_journal {
                    l.integrity_journal.watermark = self.integrity.journal_watermark;
                }
                return self.open(Spec::Luks(l), Keys::passphrase(&mut once), storage, &opts, p);
            }
        };
        self.open(spec, Keys::none(), storage, &opts, p)
    }

    fn open(
        &self,
        spec: Spec,
        keys: Keys<'_>,
        storage: Storage,
        opts: &volume::OpenOptions,
        p: &str,
    ) -> Result<Arc<dyn BlockDevice>, BenchError> {
        volume::open_storage(storage, spec, keys, opts)
            .map(|v| v.device)
            .map_err(|e| BenchError::setup(format!("opening {} on {p}", self.describe()), e))
    }

    /// The plain dm-crypt parameters of this stack's crypt layer (from `key`, 128 bytes).
    fn plain_params(&self, key: &[u8]) -> PlainParams {
        PlainParams {
            cipher: self.cipher.clone(),
            key: VolumeKey::new(key[..(self.key_bits / 8) as usize].to_vec()),
            offset: 0,
            skip: 0,
            size: None,
            options: CryptOptions {
                sector_size: (self.sector_size != 512).then_some(self.sector_size),
                iv_large_sectors: self.iv_large_sectors,
                ..CryptOptions::default()
            },
        }
    }
}

/// A format's progress callback that never stops it.
fn go_on(_: u64, _: u64) -> std::ops::ControlFlow<()> {
    std::ops::ControlFlow::Continue(())
}

/// Key material of a built stack, kept so that a reopen finds the same data.
#[derive(Debug, Clone)]
struct Secrets {
    crypt_key: Vec<u8>,
    hmac_key: Vec<u8>,
    salt: [u8; 16],
    passphrase: Vec<u8>,
}

impl Secrets {
    fn random() -> Self {
        let mut r = rand::rng();
        let mut crypt_key = vec![0u8; 128];
        r.fill_bytes(&mut crypt_key);
        let mut hmac_key = vec![0u8; 32];
        r.fill_bytes(&mut hmac_key);
        let mut salt = [0u8; 16];
        r.fill_bytes(&mut salt);
        Secrets { crypt_key, hmac_key, salt, passphrase: b"sealdisk-bench".to_vec() }
    }

    fn passphrase(&self) -> Passphrase {
        Passphrase::new(self.passphrase.clone())
    }
}

fn path_str(path: &Path) -> Result<&str, BenchError> {
    path.to_str().ok_or_else(|| BenchError::usage(format!("{}: not a UTF-8 path", path.display())))
}

/// A preallocated temporary file of `bytes` in `dir`, removed when the path is dropped.
fn temp_volume(dir: &Path, bytes: u64) -> Result<tempfile::TempPath, BenchError> {
    let file = tempfile::Builder::new()
        .prefix("sealdisk-bench-")
        .suffix(".img")
        .tempfile_in(dir)
        .map_err(|e| BenchError::setup(format!("creating a temporary volume in {}", dir.display()), e))?;
    file.as_file().set_len(bytes).map_err(|e| BenchError::setup("sizing the temporary volume", e))?;
    // Real blocks, no holes: writes must not pay for allocation, reads not hit holes.
    let _ = rustix::fs::fallocate(file.as_file(), rustix::fs::FallocateFlags::empty(), 0, bytes);
    Ok(file.into_temp_path())
}

/// `dev` cut to exactly `size` bytes (a formatted volume gives a little more).
fn cut(dev: Arc<dyn BlockDevice>, size: u64) -> Result<Arc<dyn BlockDevice>, BenchError> {
    let have = dev.geometry().size;
    if have == size {
        return Ok(dev);
    }
    let block = u64::from(dev.geometry().logical_block);
    let size = size / block * block;
    Ok(Arc::new(Slice::new(dev, 0, size).map_err(|e| BenchError::setup("cutting the volume to size", e))?))
}

#[derive(Debug)]
enum Backing {
    /// Deleted on drop.
    Temporary(tempfile::TempPath),
    /// The user's; left alone.
    Existing(PathBuf),
}

/// A stack on a volume: a temporary one (deleted on drop) or an existing file.
#[derive(Debug)]
pub struct BuiltStack {
    /// The top of the stack.
    pub device: Arc<dyn BlockDevice>,
    /// What it is.
    pub description: String,
    path: Backing,
    spec: StackSpec,
    secrets: Secrets,
    size: u64,
}

impl BuiltStack {
    /// The backing file.
    pub fn path(&self) -> &Path {
        match &self.path {
            Backing::Temporary(p) => p,
            Backing::Existing(p) => p,
        }
    }

    /// Writes the whole device once, sequentially in 1 MiB requests from two threads, and
    /// flushes: reads then hit real data (ciphertext), and every variant starts alike.
    pub fn precondition(&self) -> Result<(), BenchError> {
        precondition(&*self.device)
    }

    /// Closes the stack (a dm-integrity volume commits its journal or clears its bitmap, as
    /// on suspend) and opens it again with the same keys: caches start cold. Nobody else may
    /// hold [`Self::device`] (drop every clone first).
    pub fn reopen(&mut self) -> Result<(), BenchError> {
        if Arc::strong_count(&self.device) != 1 {
            return Err(BenchError::Internal("reopen: the device is still in use".into()));
        }
        // Dropping the last reference closes the stack before it is opened again.
        self.device = Arc::new(MemDevice::new(0, 512));
        let path = self.path().to_path_buf();
        let dev = self.spec.stack_on(&path, &self.secrets)?;
        self.device = cut(dev, self.size)?;
        Ok(())
    }
}

/// See [`BuiltStack::precondition`].
pub fn precondition(dev: &dyn BlockDevice) -> Result<(), BenchError> {
    let g = dev.geometry();
    let chunk: u64 = (1 << 20) / u64::from(g.logical_block) * u64::from(g.logical_block);
    let chunks = g.size.div_ceil(chunk);
    let next = std::sync::atomic::AtomicU64::new(0);
    let work = || -> Result<(), BenchError> {
        let mut buf = blockdev::AlignedBuf::for_direct_io(chunk as usize);
        crate::rng::SplitMix64::new(0x9c0d).fill(buf.as_mut_slice());
        loop {
            let i = next.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
            if i >= chunks {
                return Ok(());
            }
            let off = i * chunk;
            let len = chunk.min(g.size - off) as usize;
            dev.write_at(off, &buf.as_slice()[..len], WriteFlags::empty()).map_err(|source| {
                BenchError::Device { op: crate::gen::Dir::Write, offset: off, len: len as u64, source }
            })?;
        }
    };
    std::thread::scope(|s| {
        let a = s.spawn(work);
        let b = work();
        a.join().unwrap_or_else(|_| Err(BenchError::Internal("precondition thread panicked".into()))).and(b)
    })?;
    dev.flush().map_err(|source| BenchError::Flush { source })
}

/// Where temporary volumes go by default: `$SEALDISK_BENCH_DIR`, else the system temp dir
/// unless it is a tmpfs (memory would flatter every number), else the current directory.
pub fn default_dir() -> PathBuf {
    if let Some(d) = std::env::var_os("SEALDISK_BENCH_DIR") {
        return PathBuf::from(d);
    }
    let tmp = std::env::temp_dir();
    if !is_tmpfs(&tmp) {
        return tmp;
    }
    std::env::current_dir().unwrap_or(tmp)
}

/// Whether `dir` is on a tmpfs (or ramfs).
pub fn is_tmpfs(dir: &Path) -> bool {
    const TMPFS_MAGIC: i64 = 0x0102_1994;
    const RAMFS_MAGIC: i64 = 0x8584_58f6;
    match rustix::fs::statfs(dir) {
        Ok(s) => {
            #[allow(clippy::unnecessary_cast)] // f_type is not i64 on every target
            let t = s.f_type as i64;
            t == TMPFS_MAGIC || t == RAMFS_MAGIC
        }
        Err(_) => false,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn options_parse_and_describe() {
        let mut s = StackSpec::default();
        assert!(s.set("crypt-mode", "pool").unwrap());
        assert!(s.set("sector_size", "512").unwrap());
        assert!(s.set("lock", "range").unwrap());
        assert!(!s.set("iodepth", "4").unwrap());
        assert_eq!(s.crypt_mode, CryptMode::Pool);
        assert_eq!(
            s.describe(),
            "crypt(aes-xts-plain64, 512-bit key, 512-byte sectors, pool) + range locks over file (buffered)"
        );
        assert!(s.set("lock", "sometimes").is_err());
        assert!(s.set("stack", "luks3").is_err());
    }

    #[test]
    fn integrity_options_parse_and_describe() {
        let mut s = StackSpec::default();
        for (k, v) in [
            ("stack", "integrity"),
            ("integrity-alg", "sha256"),
            ("integrity-mode", "B"),
            ("block-size", "512"),
            ("buffer-sectors", "1"),
            ("interleave-sectors", "65536"),
            ("journal-size", "8M"),
            ("journal-watermark", "25"),
            ("hash-mode", "pool"),
            ("rmw", "1"),
        ] {
            assert!(s.set(k, v).unwrap(), "{k}");
        }
        assert_eq!(s.integrity.mode, Mode::Bitmap);
        assert_eq!(s.integrity.hash_mode, HashMode::Pool);
        assert_eq!(
            s.describe(),
            "integrity(sha256, B, 512-byte blocks, buffer_sectors=1, hash pool, interleave_sectors=65536, \
             journal 8M, journal_watermark 25, rmw forced) over file (buffered)"
        );
        s.check().unwrap();
        assert!(s.set("integrity-mode", "R").is_err());
        assert!(s.set("hash-mode", "gpu").is_err());
        s.set("parallel-hash", "0").unwrap();
        assert_eq!(s.integrity.hash_mode, HashMode::Inline);
        let p = s.integrity_params(&[7; 32]);
        assert_eq!(
            (p.sector_size, p.buffer_sectors, p.interleave_sectors, p.skip_rmw),
            (512, 1, 65536, false)
        );
        assert_eq!((p.journal_size, p.journal_watermark), (Some(8 << 20), 25));
        assert!(s.set("journal-watermark", "101").is_err());
        assert!(p.key.is_none(), "sha256 takes no key");
        s.set("integrity-alg", "hmac-sha256").unwrap();
        assert!(s.integrity_params(&[7; 32]).key.is_some());
        s.set("block-size", "1000").unwrap();
        assert!(s.check().is_err());
        let mut l = StackSpec::default();
        l.set("stack", "luks2").unwrap();
        l.set("lock", "range").unwrap();
        assert!(l.check().is_err(), "locks apply to raw and crypt only");
    }

    /// Builds `s`, writes, reads back, reopens, reads again: the data survive a close.
    fn round_trip(s: &StackSpec, dir: &Path) -> BuiltStack {
        let mut b = s.build(dir, 4 << 20).unwrap();
        assert_eq!(b.device.geometry().size, 4 << 20, "{}", b.description);
        b.precondition().unwrap();
        let data: Vec<u8> = (0..8192u32).map(|i| (i * 7) as u8).collect();
        b.device.write_at(12288, &data, WriteFlags::empty()).unwrap();
        let mut r = vec![0u8; 8192];
        b.device.read_at(12288, &mut r).unwrap();
        assert_eq!(r, data, "{}", b.description);
        b.reopen().unwrap();
        let mut r = vec![0u8; 8192];
        b.device.read_at(12288, &mut r).unwrap();
        assert_eq!(r, data, "after reopen: {}", b.description);
        assert!(std::fs::metadata(b.path()).unwrap().len() >= 4 << 20);
        b
    }

    #[test]
    fn formatted_stacks_build_round_trip_and_reopen() {
        let dir = tempfile::tempdir().unwrap();
        let dir = dir.path();
        let mut i = StackSpec::default();
        i.set("stack", "integrity").unwrap();
        for mode in ["J", "B", "D"] {
            i.set("integrity-mode", mode).unwrap();
            round_trip(&i, dir);
        }
        let mut small = i.clone();
        small.set("block-size", "512").unwrap();
        small.set("buffer-sectors", "1").unwrap();
        small.set("rmw", "1").unwrap();
        round_trip(&small, dir);
        let mut ci = StackSpec::default();
        ci.set("stack", "crypt-integrity").unwrap();
        ci.set("integrity-alg", "hmac-sha256").unwrap();
        let b = round_trip(&ci, dir);
        let raw = std::fs::read(b.path()).unwrap();
        assert!(!raw.windows(8).any(|w| w == [0, 7, 14, 21, 28, 35, 42, 49]), "plaintext on disk");
        let mut l = StackSpec::default();
        l.set("stack", "luks2").unwrap();
        let b = round_trip(&l, dir);
        assert_eq!(&std::fs::read(b.path()).unwrap()[..6], b"LUKS\xba\xbe");
        assert!(b.description.starts_with("luks2 crypt(aes-xts-plain64"), "{}", b.description);
    }

    #[test]
    fn luks2_integrity_stacks_build_round_trip_and_reopen() {
        let dir = tempfile::tempdir().unwrap();
        let dir = dir.path();
        let mut hmac = StackSpec::default();
        hmac.set("stack", "luks2-integrity").unwrap();
        for mode in ["J", "D"] {
            hmac.set("integrity-mode", mode).unwrap();
            let b = round_trip(&hmac, dir);
            assert!(b.description.contains("aead(aes-xts-plain64 + hmac-sha256"), "{}", b.description);
            let raw = std::fs::read(b.path()).unwrap();
            assert_eq!(&raw[..6], b"LUKS\xba\xbe");
            assert!(!raw.windows(8).any(|w| w == [0, 7, 14, 21, 28, 35, 42, 49]), "plaintext on disk");
        }
        let mut gcm = StackSpec::default();
        for (k, v) in
            [("stack", "aead"), ("cipher", "aes-gcm-random"), ("key-size", "256"), ("luks-integrity", "aead")]
        {
            gcm.set(k, v).unwrap();
        }
        let b = round_trip(&gcm, dir);
        // journal-size reaches the dm-integrity superblock (journal_sections, le32 at byte 12,
        // after the 16 MiB LUKS2 header): more sections than the default 1/128 of the device.
        let sections = |b: &BuiltStack| {
            let raw = std::fs::read(b.path()).unwrap();
            let sb = &raw[LUKS2_DATA_OFFSET as usize..];
            assert_eq!(&sb[..8], b"integrt\0");
            u32::from_le_bytes(sb[12..16].try_into().unwrap())
        };
        let default = sections(&b);
        gcm.set("journal-size", "1M").unwrap();
        let b = round_trip(&gcm, dir);
        assert!(b.description.contains("journal 1"), "{}", b.description);
        let big = sections(&b);
        assert!(
            big > default.max(1) * 4,
            "journal sections: {big} with journal-size=1M, {default} by default"
        );
    }

    #[test]
    fn luks2_integrity_stack_refuses_bad_combinations_before_formatting() {
        let dir = tempfile::tempdir().unwrap();
        let mut bad = StackSpec::default();
        bad.set("stack", "luks2-integrity").unwrap();
        bad.set("integrity-mode", "B").unwrap();
        assert!(matches!(bad.build(dir.path(), 1 << 20), Err(BenchError::Usage(_))));
        let mut bad = StackSpec::default();
        for (k, v) in [("stack", "luks2-integrity"), ("cipher", "aes-gcm-random"), ("luks-integrity", "aead")]
        {
            bad.set(k, v).unwrap(); // the default 512-bit key does not fit aes-gcm
        }
        assert!(matches!(bad.build(dir.path(), 1 << 20), Err(BenchError::Usage(_))));
        let mut bad = StackSpec::default();
        bad.set("stack", "luks2-integrity").unwrap();
        bad.set("luks-integrity", "crc32c").unwrap();
        assert!(bad.build(dir.path(), 1 << 20).is_err());
        assert_eq!(std::fs::read_dir(dir.path()).unwrap().count(), 0, "nothing made for a refused stack");
    }

    #[test]
    fn reopen_refuses_a_device_still_in_use() {
        let dir = tempfile::tempdir().unwrap();
        let mut b = StackSpec::raw().build(dir.path(), 1 << 20).unwrap();
        let held = b.device.clone();
        assert!(b.reopen().is_err());
        drop(held);
        b.reopen().unwrap();
    }

    #[test]
    fn formatted_stacks_refuse_existing_files() {
        let f = tempfile::NamedTempFile::new().unwrap();
        f.as_file().set_len(8 << 20).unwrap();
        let mut s = StackSpec::default();
        s.set("stack", "integrity").unwrap();
        assert!(matches!(s.open_existing(f.path()), Err(BenchError::Usage(_))));
    }

    #[test]
    fn built_crypt_stack_round_trips_and_holds_ciphertext() {
        let dir = tempfile::tempdir().unwrap();
        let s = StackSpec::crypt(CryptMode::Inline);
        let b = s.build(dir.path(), 1 << 20).unwrap();
        assert_eq!(b.device.geometry().size, 1 << 20);
        b.precondition().unwrap();
        b.device.write_at(8192, &[0x55u8; 4096], WriteFlags::empty()).unwrap();
        let mut r = vec![0u8; 4096];
        b.device.read_at(8192, &mut r).unwrap();
        assert_eq!(r, vec![0x55u8; 4096]);
        let raw = std::fs::read(b.path()).unwrap();
        assert_ne!(&raw[8192..8192 + 4096], &r[..]);
        let path = b.path().to_path_buf();
        drop(b);
        assert!(!path.exists(), "the temporary volume is removed");
    }
}
