//! Stacks the harness builds for itself, on temporary volumes.
//!
//! ```text
//!   StackSpec ──build(dir, size)──► temp file (preallocated, on a real filesystem)
//!                                      └─ FileDevice (buffered | O_DIRECT)
//!                                          └─ [lock: none | range | rwlock | mutex]
//!                                              └─ [CryptTarget: cipher, key, sector size, mode]
//!                                                  └─ Arc<dyn BlockDevice> ──► DeviceTarget
//! ```
//!
//! **Extension point.** A new layer (dm-integrity, LUKS2) is a new [`StackKind`]: give it
//! its knobs in [`StackSpec`] (`set`), its description, and a branch in [`StackSpec::build`].
//! Until the layer exists its kind is accepted by the parser and refused by
//! [`StackSpec::check`] with [`BenchError::NotImplemented`], so presets that need it are
//! listed, shaped, and say what is missing.

use std::path::{Path, PathBuf};
use std::sync::Arc;

use blockdev::{BlockDevice, FileDevice, FileOptions, RangeLocked, WriteFlags};
use rand::RngCore;
use sector_crypto::{CipherSpec, SectorCipher, SectorParams, VolumeKey};
use targets::{CryptConfig, CryptMode, CryptTarget};

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
    /// dm-integrity over the file (not implemented yet).
    Integrity,
    /// dm-crypt over dm-integrity (authenticated encryption; not implemented yet).
    CryptIntegrity,
    /// A LUKS2 volume (not implemented yet).
    Luks2,
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
            _ => {
                return Err(BenchError::usage(format!(
                    "stack={s}: expected raw, crypt, integrity, crypt-integrity or luks2"
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

/// dm-integrity knobs, for when `IntegrityTarget` lands (the seeds' integrity presets use them).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct IntegrityKnobs {
    /// Internal hash (`crc32c`, `sha256`, `hmac-sha256`).
    pub hash: String,
    /// `journal`, `bitmap` or `direct`.
    pub mode: String,
    /// Metadata buffer size in 512-byte sectors (`buffer_sectors`, kernel default 128).
    pub buffer_sectors: u32,
    /// Compute the tags of one request in parallel (the ahash analogue) instead of inline.
    pub parallel_hash: bool,
}

impl Default for IntegrityKnobs {
    fn default() -> Self {
        IntegrityKnobs {
            hash: "crc32c".into(),
            mode: "journal".into(),
            buffer_sectors: 128,
            parallel_hash: false,
        }
    }
}

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
        }
    }
}

fn parse_mode(s: &str) -> Result<CryptMode, BenchError> {
    Ok(match s {
        "auto" => CryptMode::Auto,
        "pool" => CryptMode::Pool,
        "inline" => CryptMode::Inline,
        _ => return Err(BenchError::usage(format!("crypt-mode={s}: expected auto, pool or inline"))),
    })
}

fn mode_name(m: CryptMode) -> &'static str {
    match m {
        CryptMode::Auto => "auto",
        CryptMode::Pool => "pool",
        CryptMode::Inline => "inline",
    }
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
            "integrity" | "hash" | "internal-hash" => self.integrity.hash = value.to_string(),
            "integrity-mode" => self.integrity.mode = value.to_string(),
            "buffer-sectors" => self.integrity.buffer_sectors = num(value)?,
            "parallel-hash" | "hash-offload" => self.integrity.parallel_hash = parse_bool(key, value)?,
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
                mode_name(self.crypt_mode)
            )
        };
        let i = &self.integrity;
        let integ = || {
            format!(
                "integrity({}, {} mode, buffer_sectors={}, {} hashing)",
                i.hash,
                i.mode,
                i.buffer_sectors,
                if i.parallel_hash { "parallel" } else { "inline" }
            )
        };
        let layers = match self.kind {
            StackKind::Raw => "raw".to_string(),
            StackKind::Crypt => crypt(),
            StackKind::Integrity => integ(),
            StackKind::CryptIntegrity => format!("{} over {}", crypt(), integ()),
            StackKind::Luks2 => format!("luks2 {}", crypt()),
        };
        format!("{layers}{lock} over file ({io})")
    }

    /// Checks that this stack can be built here (before any volume is made).
    pub fn check(&self) -> Result<(), BenchError> {
        match self.kind {
            StackKind::Raw => Ok(()),
            StackKind::Crypt => {
                let spec: CipherSpec = self.cipher.parse().map_err(|e| BenchError::setup(format!("cipher {}", self.cipher), e))?;
                let key = VolumeKey::new(vec![0x42; (self.key_bits / 8) as usize]);
                let params = SectorParams { sector_size: self.sector_size, iv_offset: 0, iv_large_sectors: self.iv_large_sectors };
                SectorCipher::new(&spec, &key, params).map_err(|e| BenchError::setup(format!("cipher {}", self.cipher), e))?;
                Ok(())
            }
            StackKind::Integrity | StackKind::CryptIntegrity => Err(BenchError::NotImplemented(
                "this stack needs the dm-integrity target (IntegrityTarget), which is not implemented yet".into(),
            )),
            StackKind::Luks2 => Err(BenchError::NotImplemented(
                "this stack needs LUKS2 volume assembly (volume::open for LUKS2), which is not implemented yet".into(),
            )),
        }
    }

    /// Makes a temporary volume of `size` payload bytes in `dir` and stacks the layers on it.
    /// The file is removed when the returned stack is dropped.
    pub fn build(&self, dir: &Path, size: u64) -> Result<BuiltStack, BenchError> {
        self.check()?;
        let file =
            tempfile::Builder::new().prefix("sealdisk-bench-").suffix(".img").tempfile_in(dir).map_err(
                |e| BenchError::setup(format!("creating a temporary volume in {}", dir.display()), e),
            )?;
        file.as_file().set_len(size).map_err(|e| BenchError::setup("sizing the temporary volume", e))?;
        // Real blocks, no holes: writes must not pay for allocation, reads not hit holes.
        let _ = rustix::fs::fallocate(file.as_file(), rustix::fs::FallocateFlags::empty(), 0, size);
        let path = file.into_temp_path();
        let device = self.stack_on(&path)?;
        Ok(BuiltStack { device, description: self.describe(), path: Backing::Temporary(path) })
    }

    /// Stacks the layers on an existing file or block device (fio's `filename`). Nothing
    /// is created or deleted; a crypt layer gets a fresh random key, so whatever the file
    /// held reads back as noise and writes destroy it.
    pub fn open_existing(&self, path: &Path) -> Result<BuiltStack, BenchError> {
        self.check()?;
        let device = self.stack_on(path)?;
        let description = format!("{} {}", self.describe(), path.display());
        Ok(BuiltStack { device, description, path: Backing::Existing(path.to_path_buf()) })
    }

    fn stack_on(&self, path: &Path) -> Result<Arc<dyn BlockDevice>, BenchError> {
        let opts = FileOptions { direct: self.direct, ..FileOptions::default() };
        let backing = FileDevice::open(path, opts)
            .map_err(|e| BenchError::setup(format!("opening {}", path.display()), e))?;
        let below: Arc<dyn BlockDevice> = match self.lock {
            LockKind::None => Arc::new(backing),
            LockKind::Range => Arc::new(RangeLocked::new(backing)),
            LockKind::RwLock => Arc::new(GlobalLocked::shared_reads(backing)),
            LockKind::Mutex => Arc::new(GlobalLocked::exclusive(backing)),
        };
        let device: Arc<dyn BlockDevice> = match self.kind {
            StackKind::Raw => below,
            StackKind::Crypt => {
                let spec: CipherSpec = self
                    .cipher
                    .parse()
                    .map_err(|e| BenchError::setup(format!("cipher {}", self.cipher), e))?;
                let mut key = vec![0u8; (self.key_bits / 8) as usize];
                rand::rng().fill_bytes(&mut key);
                let params = SectorParams {
                    sector_size: self.sector_size,
                    iv_offset: 0,
                    iv_large_sectors: self.iv_large_sectors,
                };
                let cipher = SectorCipher::new(&spec, &VolumeKey::new(key), params)
                    .map_err(|e| BenchError::setup(format!("cipher {}", self.cipher), e))?;
                let cfg = CryptConfig {
                    read_mode: self.crypt_mode,
                    write_mode: self.crypt_mode,
                    ..CryptConfig::default()
                };
                Arc::new(
                    CryptTarget::new(below, cipher, cfg)
                        .map_err(|e| BenchError::setup("stacking the crypt layer", e))?,
                )
            }
            StackKind::Integrity | StackKind::CryptIntegrity | StackKind::Luks2 => {
                return Err(BenchError::Internal("check() lets only buildable stacks through".into()))
            }
        };
        Ok(device)
    }
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
    fn unimplemented_layers_say_what_is_missing() {
        let mut s = StackSpec::default();
        s.set("stack", "integrity").unwrap();
        let e = s.check().unwrap_err();
        assert!(matches!(e, BenchError::NotImplemented(_)));
        assert!(e.to_string().contains("dm-integrity"), "{e}");
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
