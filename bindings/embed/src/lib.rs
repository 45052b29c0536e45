//! What sealdisk's C ABI (`bindings/c`) and Python package (`bindings/python`) expose, over
//! the `volume` crate: probe, open (read-only or read-write), read/write/flush, LUKS format,
//! keyslot add/remove/kill, and the metadata as JSON. Both bindings are marshalling over
//! this crate and nothing else: a volume is opened by [`Volume::open`], which is
//! `volume::open` (the library's one way in); errors carry one [`Kind`] and a message.
//!
//! Secrets (passphrases) are taken as byte slices and copied only into
//! `sector_crypto::kdf::Passphrase`, which is wiped on drop and redacted in `Debug`; no
//! message here contains one.
#![forbid(unsafe_code)]
#![deny(missing_docs)]

use std::fmt;

use blockdev::{BlockError, BlockErrorKind, WriteFlags};
use sector_crypto::kdf::Passphrase;
use volume::luks::{self, FormatParams, Luks, LuksVersion, PbkdfParams, PbkdfType};
use volume::{ErrorKind, FormatSpec, OpenOptions, StorageOptions, VolumeError, VolumeKind};

/// The cause of a failure, as a caller decides on it (`volume::ErrorKind`, plus `Internal`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Kind {
    /// Bad bytes on disk: a header or superblock that does not decode or check.
    Corrupt,
    /// The passphrase or key does not open the volume.
    WrongKey,
    /// A format, feature or cipher this build does not have.
    Unsupported,
    /// The caller asked for something impossible or inconsistent.
    Usage,
    /// The storage is in use (locked by another opener).
    Busy,
    /// The storage (or the volume) is read-only, or access to it is denied.
    Permission,
    /// The storage is too small for the layout.
    TooSmall,
    /// Reading or writing the storage failed.
    Io,
    /// A broken invariant inside sealdisk (a bug), or a panic caught at the boundary.
    Internal,
    /// Anything else (the system's random source failed, ...).
    Other,
}

impl Kind {
    /// The kind of a `volume` error kind.
    pub fn of(k: ErrorKind) -> Kind {
        match k {
            ErrorKind::Corrupt => Kind::Corrupt,
            ErrorKind::WrongKey => Kind::WrongKey,
            ErrorKind::Unsupported => Kind::Unsupported,
            ErrorKind::Usage => Kind::Usage,
            ErrorKind::Busy => Kind::Busy,
            ErrorKind::Permission => Kind::Permission,
            ErrorKind::TooSmall => Kind::TooSmall,
            ErrorKind::Io => Kind::Io,
            _ => Kind::Other,
        }
    }

    /// The kind of a storage error.
    pub fn of_block(e: &BlockError) -> Kind {
        match e.kind() {
            BlockErrorKind::Busy => Kind::Busy,
            BlockErrorKind::ReadOnly => Kind::Permission,
            BlockErrorKind::Unsupported => Kind::Unsupported,
            BlockErrorKind::OutOfRange | BlockErrorKind::Misaligned | BlockErrorKind::InvalidArgument => {
                Kind::Usage
            }
            BlockErrorKind::IntegrityMismatch { .. } => Kind::Corrupt,
            _ => Kind::Io,
        }
    }
}

/// A failure: its [`Kind`] and a message (the error and its causes, `: `-separated).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Error {
    kind: Kind,
    message: String,
}

impl Error {
    /// An error of `kind` saying `message`.
    pub fn new(kind: Kind, message: impl Into<String>) -> Self {
        Error { kind, message: message.into() }
    }

    /// A [`Kind::Usage`] error.
    pub fn usage(message: impl Into<String>) -> Self {
        Error::new(Kind::Usage, message)
    }

    /// The cause.
    pub fn kind(&self) -> Kind {
        self.kind
    }

    /// What failed, with its causes.
    pub fn message(&self) -> &str {
        &self.message
    }

    fn chain(kind: Kind, e: &dyn std::error::Error) -> Self {
        let mut message = e.to_string();
        let mut source = e.source();
        while let Some(s) = source {
            let text = s.to_string();
            // thiserror's `transparent` repeats the same text one level down.
            if !message.ends_with(&text) {
                message.push_str(": ");
                message.push_str(&text);
            }
            source = s.source();
        }
        Error { kind, message }
    }
}

impl fmt::Display for Error {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.message)
    }
}

impl std::error::Error for Error {}

impl From<VolumeError> for Error {
    fn from(e: VolumeError) -> Self {
        Error::chain(Kind::of(e.kind()), &e)
    }
}

fn block_error(e: BlockError) -> Error {
    Error::chain(Kind::of_block(&e), &e)
}

fn luks_error(path: &str) -> impl Fn(luks::LuksError) -> Error + '_ {
    move |source| Error::from(VolumeError::Luks { path: path.to_owned(), source })
}

/// The result of every operation here.
pub type Result<T> = std::result::Result<T, Error>;

/// What [`probe`] found on a device.
#[derive(Debug, Clone)]
pub struct Probe(volume::Description);

impl Probe {
    /// cryptsetup's `--type` of the format (`luks1`, `luks2`, `bitlk`, `fvault2`,
    /// `integrity`), `None` when nothing sealdisk knows is there.
    pub fn type_name(&self) -> Option<&'static str> {
        self.0.format.type_name()
    }

    /// A short name for people (`LUKS2`, `BitLocker`, `unknown`).
    pub fn name(&self) -> &'static str {
        self.0.format.name()
    }

    /// Everything as a JSON object: `type` (string or null), `name`, `size` (bytes), and what
    /// the header says in plaintext when present: `version`, `uuid`, `label`, `cipher`,
    /// `authenticated`, `tag_size`.
    pub fn to_json(&self) -> serde_json::Value {
        let d = &self.0;
        let mut o = serde_json::Map::new();
        o.insert("type".into(), self.type_name().into());
        o.insert("name".into(), self.name().into());
        o.insert("size".into(), d.size.into());
        let mut opt = |k: &str, v: Option<serde_json::Value>| {
            if let Some(v) = v {
                o.insert(k.into(), v);
            }
        };
        opt("version", d.version.clone().map(Into::into));
        opt("uuid", d.uuid.clone().map(Into::into));
        opt("label", d.label.clone().map(Into::into));
        opt("cipher", d.cipher.clone().map(Into::into));
        opt("authenticated", d.authenticated.map(Into::into));
        opt("tag_size", d.tag_size.map(Into::into));
        serde_json::Value::Object(o)
    }
}

fn storage(path: &str, read_only: bool) -> Result<volume::Storage> {
    let lock = if read_only { blockdev::FileLock::Shared } else { blockdev::FileLock::Exclusive };
    Ok(volume::storage::open(path, &StorageOptions { read_only, direct: false, lock })?)
}

/// Says what is on the device or image at `path` (no key needed; nothing is written).
pub fn probe(path: &str) -> Result<Probe> {
    let s = storage(path, true)?;
    Ok(Probe(volume::describe(&s)?))
}

/// An open volume: the plaintext device over its storage.
#[derive(Debug)]
pub struct Volume {
    inner: volume::Volume,
    read_only: bool,
}

impl Volume {
    /// Opens the volume at `path` (probed: LUKS1, LUKS2, dm-integrity, BitLocker,
    /// FileVault2) with `passphrase` (`None`: no key, so an encrypted volume fails as a
    /// wrong key would), read-only or read-write. The storage is locked as cryptsetup
    /// locks it: shared when read-only, exclusive when read-write.
    ///
    /// This is `volume::open` with `Spec::auto()`: the library probes and picks the format;
    /// nothing here knows one format from another.
    pub fn open(path: &str, passphrase: Option<&[u8]>, read_only: bool) -> Result<Volume> {
        let mut keys = volume::Keys::none();
        if let Some(p) = passphrase {
            keys = keys.with_passphrase(Passphrase::new(p.to_vec()));
        }
        let opts = OpenOptions { read_only, lock: true, ..OpenOptions::default() };
        let inner = volume::open(path, volume::Spec::auto(), keys, &opts)?;
        Ok(Volume { inner, read_only })
    }

    /// What it is: `luks1`, `luks2`, `luks2-aead` (authenticated), `bitlk`, `fvault2`,
    /// `integrity`, `tcrypt`, `plain`, `layers`.
    pub fn kind(&self) -> &'static str {
        match self.inner.kind {
            VolumeKind::Plain => "plain",
            VolumeKind::Luks1 => "luks1",
            VolumeKind::Luks2 => "luks2",
            VolumeKind::Luks2Aead => "luks2-aead",
            VolumeKind::Integrity => "integrity",
            VolumeKind::Layers => "layers",
            VolumeKind::Tcrypt => "tcrypt",
            VolumeKind::Fvault2 => "fvault2",
            VolumeKind::Bitlk => "bitlk",
            _ => "unknown",
        }
    }

    /// Whether it was opened read-only.
    pub fn read_only(&self) -> bool {
        self.read_only
    }

    /// Size of the plaintext in bytes.
    pub fn size(&self) -> u64 {
        self.inner.device.geometry().size
    }

    /// The logical block size in bytes (writes are whole blocks).
    pub fn block_size(&self) -> u32 {
        self.inner.device.geometry().logical_block
    }

    fn check_range(&self, offset: u64, len: usize, what: &str) -> Result<u64> {
        let len = len as u64;
        match offset.checked_add(len) {
            Some(end) if end <= self.size() => Ok(end),
            _ => Err(Error::usage(format!(
                "{what} of {len} bytes at offset {offset} goes past the end of the volume ({} bytes)",
                self.size()
            ))),
        }
    }

    /// Reads `buf.len()` bytes at `offset`; any offset and length inside the volume.
    pub fn read_at(&self, offset: u64, buf: &mut [u8]) -> Result<()> {
        let end = self.check_range(offset, buf.len(), "a read")?;
        if buf.is_empty() {
            return Ok(());
        }
        let dev = &self.inner.device;
        let bs = u64::from(self.block_size());
        if offset.is_multiple_of(bs) && end.is_multiple_of(bs) {
            return dev.read_at(offset, buf).map_err(block_error);
        }
        // Unaligned: the covering blocks through a bounce buffer.
        let start = offset / bs * bs;
        let stop = end.div_ceil(bs) * bs;
        let mut bounce = zeroize::Zeroizing::new(vec![0u8; (stop - start) as usize]);
        dev.read_at(start, &mut bounce).map_err(block_error)?;
        let from = (offset - start) as usize;
        buf.copy_from_slice(&bounce[from..from + buf.len()]);
        Ok(())
    }

    /// Writes `buf` at `offset`: both multiples of [`block_size`](Self::block_size).
    pub fn write_at(&self, offset: u64, buf: &[u8]) -> Result<()> {
        if self.read_only {
            return Err(Error::new(Kind::Permission, "the volume is open read-only"));
        }
        self.check_range(offset, buf.len(), "a write")?;
        let bs = u64::from(self.block_size());
        if !offset.is_multiple_of(bs) || !(buf.len() as u64).is_multiple_of(bs) {
            return Err(Error::usage(format!(
                "a write of {} bytes at offset {offset} is not whole {bs}-byte blocks",
                buf.len()
            )));
        }
        if buf.is_empty() {
            return Ok(());
        }
        self.inner.device.write_at(offset, buf, WriteFlags::empty()).map_err(block_error)
    }

    /// Makes every completed write durable on the storage.
    pub fn flush(&self) -> Result<()> {
        if self.read_only {
            return Ok(());
        }
        self.inner.device.flush().map_err(block_error)
    }

    /// Flushes and closes (the storage lock is released when the last reference goes).
    pub fn close(self) -> Result<()> {
        self.flush()
    }
}

/// PBKDF options of a new keyslot (cryptsetup's `--pbkdf`, `--pbkdf-force-iterations`,
/// `--pbkdf-memory`, `--pbkdf-parallel`); all `None`: cryptsetup's defaults (argon2id for
/// LUKS2, pbkdf2 for LUKS1, benchmarked to 2 s).
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Pbkdf {
    /// `pbkdf2`, `argon2i` or `argon2id`.
    pub kind: Option<String>,
    /// PBKDF2 iterations or Argon2 time cost; skips the benchmark.
    pub iterations: Option<u32>,
    /// Argon2 memory in KiB.
    pub memory_kib: Option<u32>,
    /// Argon2 lanes.
    pub parallel: Option<u32>,
}

impl Pbkdf {
    fn params(&self) -> Result<PbkdfParams> {
        let kind = match self.kind.as_deref() {
            None => None,
            Some(k) => Some(k.parse::<PbkdfType>().map_err(|e| Error::usage(e.to_string()))?),
        };
        Ok(PbkdfParams {
            kind,
            force_iterations: self.iterations,
            memory_kib: self.memory_kib,
            parallel: self.parallel,
            ..PbkdfParams::default()
        })
    }
}

/// Options of [`luks_format`]; the defaults are `sealdisk luksFormat`'s (and cryptsetup's):
/// LUKS2, `aes-xts-plain64`, a 512-bit key, argon2id.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct FormatOptions {
    /// `luks1` or `luks2`.
    pub luks_type: String,
    /// The data cipher (`aes-xts-plain64`, `aes-cbc-essiv:sha256`, ...).
    pub cipher: String,
    /// Key size in bits (`None`: 512 for XTS, else 256).
    pub key_bits: Option<u32>,
    /// The first keyslot's KDF.
    pub pbkdf: Pbkdf,
}

impl Default for FormatOptions {
    fn default() -> Self {
        FormatOptions {
            luks_type: "luks2".into(),
            cipher: "aes-xts-plain64".into(),
            key_bits: None,
            pbkdf: Pbkdf::default(),
        }
    }
}

/// Formats the device or image at `path` (which must exist, with its size) as LUKS, with
/// keyslot 0 opened by `passphrase`. Everything on it is lost.
pub fn luks_format(path: &str, passphrase: &[u8], o: &FormatOptions) -> Result<()> {
    let version = match o.luks_type.to_ascii_lowercase().as_str() {
        "luks1" => LuksVersion::V1,
        "luks2" | "luks" => LuksVersion::V2,
        other => return Err(Error::usage(format!("unknown LUKS type {other:?} (luks1, luks2)"))),
    };
    let key_bits = o.key_bits.map(|b| b as usize);
    let mut params =
        FormatParams::for_cipher(version, &o.cipher, key_bits, None).map_err(luks_error(path))?;
    params.pbkdf = o.pbkdf.params()?;
    let s = storage(path, false)?;
    let pass = Passphrase::new(passphrase.to_vec());
    let spec = FormatSpec::Luks { params, header: None, passphrase: &pass };
    volume::format(spec, &s, |_, _| std::ops::ControlFlow::Continue(()))?;
    s.device.flush().map_err(block_error)?;
    Ok(())
}

/// The LUKS header at `path`, loaded for a change (a damaged LUKS2 copy is repaired first,
/// as cryptsetup does).
fn load_luks(path: &str) -> Result<(volume::Storage, Luks)> {
    let s = storage(path, false)?;
    if luks::probe(&*s.device).map_err(luks_error(path))?.is_none() {
        let found = volume::probe(&s)?;
        return Err(VolumeError::NotLuks { path: path.to_owned(), found }.into());
    }
    let l = Luks::load(&*s.device, true).map_err(luks_error(path))?;
    l.check_supported().map_err(luks_error(path))?;
    Ok((s, l))
}

/// `luksAddKey`: a keyslot for `new_passphrase`, authorised by `passphrase` (any existing
/// one), in `slot` or the first free one. Returns the keyslot.
pub fn keyslot_add(
    path: &str,
    passphrase: &[u8],
    new_passphrase: &[u8],
    slot: Option<u32>,
    pbkdf: &Pbkdf,
) -> Result<u32> {
    let params = pbkdf.params()?;
    let (s, mut l) = load_luks(path)?;
    let old = Passphrase::new(passphrase.to_vec());
    let (_, vk) = l.unlock(&*s.device, &old, None).map_err(luks_error(path))?;
    let new = Passphrase::new(new_passphrase.to_vec());
    l.add_keyslot(&*s.device, &vk, &new, slot, &params).map_err(luks_error(path))
}

/// `luksRemoveKey`: destroys the keyslot `passphrase` opens (even the last one). Returns it.
pub fn keyslot_remove(path: &str, passphrase: &[u8]) -> Result<u32> {
    let (s, mut l) = load_luks(path)?;
    let pass = Passphrase::new(passphrase.to_vec());
    let (slot, _) = l.unlock(&*s.device, &pass, None).map_err(luks_error(path))?;
    l.kill_keyslot(&*s.device, slot).map_err(luks_error(path))?;
    Ok(slot)
}

/// `luksKillSlot` in batch mode: destroys keyslot `slot`, no passphrase asked.
pub fn keyslot_kill(path: &str, slot: u32) -> Result<()> {
    let (s, mut l) = load_luks(path)?;
    l.kill_keyslot(&*s.device, slot).map_err(luks_error(path))
}

/// The metadata as JSON text: a LUKS2 header's JSON exactly as `cryptsetup luksDump
/// --dump-json-metadata` prints it; for every other format, [`Probe::to_json`].
pub fn dump_json(path: &str) -> Result<String> {
    let s = storage(path, true)?;
    let d = volume::describe(&s)?;
    if let volume::Format::Luks2 { .. } = d.format {
        let l = Luks::load(&*s.device, false).map_err(luks_error(path))?;
        if let Some(json) = luks::dump_json_metadata(&l, &*s.device) {
            return Ok(json);
        }
    }
    Ok(Probe(d).to_json().to_string())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn image(dir: &tempfile::TempDir, size: u64) -> String {
        let p = dir.path().join("v.img");
        std::fs::File::create(&p).unwrap().set_len(size).unwrap();
        p.to_str().unwrap().to_owned()
    }

    fn fast() -> FormatOptions {
        FormatOptions {
            pbkdf: Pbkdf { kind: Some("pbkdf2".into()), iterations: Some(1000), ..Pbkdf::default() },
            ..FormatOptions::default()
        }
    }

    #[test]
    fn format_open_write_read_keyslots() {
        let dir = tempfile::tempdir().unwrap();
        let p = image(&dir, 32 << 20);
        luks_format(&p, b"one", &fast()).unwrap();
        let probe = probe(&p).unwrap();
        assert_eq!((probe.type_name(), probe.name()), (Some("luks2"), "LUKS2"));
        assert_eq!(probe.to_json()["cipher"], "aes-xts-plain64");

        let v = Volume::open(&p, Some(b"one"), false).unwrap();
        assert_eq!((v.kind(), v.block_size(), v.size()), ("luks2", 512, (32 << 20) - (16 << 20)));
        let data: Vec<u8> = (0..4096u32).map(|i| i as u8).collect();
        v.write_at(8192, &data).unwrap();
        assert_eq!(v.write_at(1, &data[..512]).unwrap_err().kind(), Kind::Usage);
        let mut back = vec![0u8; 100];
        v.read_at(8192 + 7, &mut back).unwrap();
        assert_eq!(back, data[7..107]);
        let mut past = vec![0u8; 512];
        assert_eq!(v.read_at(v.size(), &mut past).unwrap_err().kind(), Kind::Usage);
        v.close().unwrap();

        let e = Volume::open(&p, Some(b"two"), true).unwrap_err();
        assert_eq!(e.kind(), Kind::WrongKey, "{e}");
        assert!(!e.message().contains("two"));
        assert_eq!(Volume::open(&p, None, true).unwrap_err().kind(), Kind::WrongKey, "no passphrase to try");

        let pb = fast().pbkdf;
        assert_eq!(keyslot_add(&p, b"one", b"two", None, &pb).unwrap(), 1);
        assert_eq!(keyslot_add(&p, b"nope", b"x", None, &pb).unwrap_err().kind(), Kind::WrongKey);
        assert_eq!(keyslot_add(&p, b"one", b"x", Some(1), &pb).unwrap_err().kind(), Kind::Usage);
        let v = Volume::open(&p, Some(b"two"), true).unwrap();
        let mut again = vec![0u8; 4096];
        v.read_at(8192, &mut again).unwrap();
        assert_eq!(again, data);
        assert_eq!(v.write_at(0, &data).unwrap_err().kind(), Kind::Permission);
        drop(v);
        assert_eq!(keyslot_remove(&p, b"one").unwrap(), 0);
        assert_eq!(Volume::open(&p, Some(b"one"), true).unwrap_err().kind(), Kind::WrongKey);
        keyslot_kill(&p, 1).unwrap();
        assert_eq!(keyslot_kill(&p, 1).unwrap_err().kind(), Kind::Usage);

        let json: serde_json::Value = serde_json::from_str(&dump_json(&p).unwrap()).unwrap();
        assert!(json["keyslots"].as_object().unwrap().is_empty(), "{json}");
        assert_eq!(json["segments"]["0"]["encryption"], "aes-xts-plain64");
    }

    #[test]
    fn other_formats_and_bad_input() {
        let dir = tempfile::tempdir().unwrap();
        let p = image(&dir, 1 << 20);
        let json: serde_json::Value = serde_json::from_str(&dump_json(&p).unwrap()).unwrap();
        assert_eq!((json["type"].clone(), json["size"].clone()), (serde_json::Value::Null, (1 << 20).into()));
        // Nothing recognised: volume::open's refusal (not a LUKS device).
        assert_eq!(Volume::open(&p, Some(b"x"), true).unwrap_err().kind(), Kind::Usage);
        assert_eq!(keyslot_remove(&p, b"x").unwrap_err().kind(), Kind::Usage);
        let missing = format!("{p}.missing");
        assert_eq!(probe(&missing).unwrap_err().kind(), Kind::Io);
        let bad = FormatOptions { luks_type: "luks3".into(), ..fast() };
        assert_eq!(luks_format(&p, b"x", &bad).unwrap_err().kind(), Kind::Usage);
        let bits = FormatOptions { key_bits: Some(100), ..fast() };
        assert_eq!(luks_format(&p, b"x", &bits).unwrap_err().kind(), Kind::Usage);
        let kdf =
            FormatOptions { pbkdf: Pbkdf { kind: Some("scrypt".into()), ..Pbkdf::default() }, ..fast() };
        assert_eq!(luks_format(&p, b"x", &kdf).unwrap_err().kind(), Kind::Usage);
    }
}
