//! The one assembly path: storage in, one [`Volume`] out.
//!
//! ```text
//!   storage::open(locator) ─► Storage ─┐
//!                                      ▼
//!   open(Spec, Storage, OpenOptions) ── Spec::Luks ──── probe ─► load header ─► unlock (PassphraseSource,
//!     │                                                 │        tries) ─► LUKS1/LUKS2: crypt over storage
//!     │                                                 │                  LUKS2+AEAD: AEAD crypt over
//!     │                                                 │                  integrity (external tags)
//!     │                                 Spec::Plain ─── PlainParams ─► table line ─► crypt over storage
//!     │                                 Spec::Table ─── table line  ─────────────► crypt over storage
//!     │                                 Spec::Integrity ─ superblock ─► integrity over storage
//!     │                                 Spec::Fvault2 ── Core Storage metadata ─► unlock ─► read-only
//!     │                                                  crypt (aes-xts-plain64) over storage
//!     │                                 Spec::Layers ── each layer over the one below (bottom first)
//!     │                                 Spec::Tcrypt ── KDF × chain trial ─► one crypt layer per cipher
//!     ▼
//!   Volume { device: Arc<dyn BlockDevice>, kind, layers (table line of each), integrity status }
//!
//!   format(FormatSpec, Storage) ── Luks ─────── header (+ dm-integrity area and wipe for AEAD), one call
//!                                  Integrity ── superblock, journal, wipe
//! ```
//! The CLI, the bench harness, the tests and every transport build volumes only here. A new
//! format is one arm in [`open`] (and one variant of `probe::Format`); a new kind of storage
//! is one arm in `storage::open`.
use std::ops::ControlFlow;
use std::sync::Arc;

use blockdev::BlockDevice;
use formats::dm::{CryptOptions, CryptTable};
use sector_crypto::kdf::Passphrase;
use sector_crypto::VolumeKey;

use crate::integrity::{IntegrityParams, IntegrityTarget};
use crate::keys::Keys;
use crate::luks::{self, KdfLimits, Luks, LuksError, LuksVersion, WipeEnd};
use crate::plain::PlainParams;
use crate::probe::Format;
use crate::storage::Storage;
use crate::{crypt_over, OpenOptions, VolumeError};

/// Where the passphrases of a LUKS unlock come from: a key file (one try), a prompt (as
/// many tries as the user is allowed), a test's constant.
pub trait PassphraseSource {
    /// The next passphrase to try; `Ok(None)` when no try is left (the unlock then fails
    /// with the last "wrong passphrase").
    fn next_passphrase(&mut self) -> Result<Option<Passphrase>, VolumeError>;
    /// The last passphrase opened no keyslot (a prompt says so before asking again).
    fn rejected(&mut self) {}
    /// The keyslots the passphrase [`next_passphrase`](Self::next_passphrase) returned last
    /// may open, in the order to try them (a LUKS2 token's `keyslots`: cryptsetup's
    /// `LUKS2_keyslot_open_by_token` tries only those, whatever `--key-slot` says); `None`:
    /// any keyslot, or `--key-slot`.
    fn keyslots(&self) -> Option<Vec<u32>> {
        None
    }
}

/// One passphrase, tried once.
#[derive(Debug)]
pub struct OnePassphrase<'a>(Option<&'a Passphrase>);

impl<'a> OnePassphrase<'a> {
    /// Tries `p` once.
    pub fn new(p: &'a Passphrase) -> Self {
        OnePassphrase(Some(p))
    }
}

impl PassphraseSource for OnePassphrase<'_> {
    fn next_passphrase(&mut self) -> Result<Option<Passphrase>, VolumeError> {
        Ok(self.0.take().cloned())
    }
}

/// How to unlock a LUKS volume (cryptsetup `open --type luks`). The passphrases come from
/// the [`Keys`] given beside it.
#[derive(Debug, Default)]
pub struct LuksSpec {
    /// `--type luks1` / `luks2` (`None`: either).
    pub version: Option<LuksVersion>,
    /// A detached header (`--header`), already opened.
    pub header: Option<Storage>,
    /// `--key-slot`.
    pub key_slot: Option<u32>,
    /// Activation flags from the command line, added to the header's persistent flags.
    pub flags: CryptOptions,
    /// `--integrity-no-journal` (authenticated volumes).
    pub integrity_no_journal: bool,
    /// `--journal-watermark`, `--journal-commit-time` (authenticated volumes, mode J).
    pub integrity_journal: crate::luks::IntegrityJournalTuning,
    /// Bounds on the header's KDF costs.
    pub kdf_limits: KdfLimits,
}

/// How to unlock a FileVault2 volume (cryptsetup `open --type fvault2`), with the
/// passphrases of the [`Keys`] given beside it.
#[derive(Debug, Default, Clone, Copy)]
pub struct Fvault2Spec {
    /// Bounds on the passphrase derivation's cost.
    pub kdf_limits: KdfLimits,
}

/// What [`Spec::Auto`] opens: whatever the probe finds (`probe::Format`), with the
/// options for each format it may find.
///
/// | found          | opened as                                                  |
/// |----------------|------------------------------------------------------------|
/// | LUKS1, LUKS2   | `luks` (also authenticated LUKS2); a detached `luks.header` means LUKS whatever the device holds |
/// | dm-integrity   | `integrity` (its hash: integritysetup's default crc32c unless set) |
/// | BitLocker      | BitLocker, with the keys' volume key, key file or passphrases |
/// | FileVault2     | FileVault2, read-only, KDF bounded by `luks.kdf_limits`    |
/// | no signature   | `tcrypt` when given (TrueCrypt/VeraCrypt have none), else LUKS, whose refusal says what was found |
#[derive(Debug, Default)]
pub struct AutoSpec {
    /// Options for a LUKS volume (and the KDF bounds of every passphrase derivation).
    pub luks: LuksSpec,
    /// Options for a standalone dm-integrity volume.
    pub integrity: IntegrityParams,
    /// Try TrueCrypt/VeraCrypt on a device without a signature (cryptsetup needs
    /// `--type tcrypt` for them too: trying them costs seconds of key derivation).
    pub tcrypt: Option<crate::tcrypt::TcryptSpec>,
}

/// One layer of a [`Spec::Layers`] stack.
#[derive(Debug, Clone)]
pub enum Layer {
    /// A standalone dm-integrity layer (formatted with these parameters).
    Integrity(IntegrityParams),
    /// Plain dm-crypt over the layer below.
    Plain(PlainParams),
}

/// What to assemble on the storage. Key material is not part of it: it comes from the
/// [`Keys`] given beside it.
// Built once per open and moved once: the size of the biggest variant costs nothing, and
// boxing it would make every `Spec::Auto(..)` a caller writes noisier.
#[allow(clippy::large_enum_variant)]
#[derive(Debug)]
pub enum Spec {
    /// Whatever the probe finds (see [`AutoSpec`]).
    Auto(AutoSpec),
    /// A LUKS1 or LUKS2 volume (authenticated or not), unlocked by passphrase.
    Luks(LuksSpec),
    /// Plain dm-crypt with cryptsetup's plain options.
    Plain(PlainParams),
    /// Plain dm-crypt from a table line (its device field is informational: the storage
    /// given is what is opened).
    Table(CryptTable),
    /// A standalone dm-integrity volume.
    Integrity(IntegrityParams),
    /// Layers bottom first, each over the one below (e.g. plain crypt over integrity).
    Layers(Vec<Layer>),
    /// A TrueCrypt/VeraCrypt volume, unlocked by passphrase and keyfiles (`tcrypt.rs`).
    Tcrypt(crate::tcrypt::TcryptSpec),
    /// A FileVault2 (Core Storage) volume, unlocked by passphrase, always read-only.
    Fvault2(Fvault2Spec),
    /// A BitLocker volume (cryptsetup `--type bitlk`), unlocked by the keys' volume key,
    /// key file or passphrases.
    Bitlk,
}

impl Spec {
    /// [`Spec::Auto`] with default options: probe, and open what is found.
    pub fn auto() -> Spec {
        Spec::Auto(AutoSpec::default())
    }
}

/// What an assembled volume is.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[non_exhaustive]
pub enum VolumeKind {
    /// Plain dm-crypt (options or a table line).
    Plain,
    /// LUKS1.
    Luks1,
    /// LUKS2 without integrity.
    Luks2,
    /// LUKS2 authenticated encryption: AEAD crypt over dm-integrity.
    Luks2Aead,
    /// A standalone dm-integrity volume.
    Integrity,
    /// A [`Spec::Layers`] stack.
    Layers,
    /// TrueCrypt/VeraCrypt: one crypt layer per cipher of the chain.
    Tcrypt,
    /// A FileVault2 logical volume (read-only).
    Fvault2,
    /// BitLocker.
    Bitlk,
}

impl VolumeKind {
    /// The type `cryptsetup status` shows for it (`PLAIN`, `LUKS1`, `LUKS2`, `INTEGRITY`,
    /// `TCRYPT`, `FVAULT2`, `BITLK`); an authenticated LUKS2 volume is `LUKS2`, a stack of
    /// layers is named by its top layer (`PLAIN`).
    pub fn type_name(self) -> &'static str {
        match self {
            VolumeKind::Plain | VolumeKind::Layers => "PLAIN",
            VolumeKind::Luks1 => "LUKS1",
            VolumeKind::Luks2 | VolumeKind::Luks2Aead => "LUKS2",
            VolumeKind::Integrity => "INTEGRITY",
            VolumeKind::Tcrypt => "TCRYPT",
            VolumeKind::Fvault2 => "FVAULT2",
            VolumeKind::Bitlk => "BITLK",
        }
    }

    /// Whether its stack is at most one dm-crypt table over the storage (plain, LUKS1, LUKS2
    /// without integrity), so that a server can rebuild it from that table with new flags
    /// or a new size (`refresh`, `resize`). BitLocker remaps segments, TrueCrypt may
    /// cascade, FileVault2 is read-only, authenticated LUKS2 sits on dm-integrity.
    pub fn rebuilds_from_its_table(self) -> bool {
        matches!(self, VolumeKind::Plain | VolumeKind::Luks1 | VolumeKind::Luks2)
    }
}

impl std::fmt::Display for VolumeKind {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(self.type_name())
    }
}

/// A dm-integrity layer of a volume, as its table would describe it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct IntegrityLayer {
    /// The device below.
    pub device: String,
    /// Start of the superblock, 512-byte sectors.
    pub offset: u64,
    /// Provided data sectors (512 bytes).
    pub len: u64,
    /// Tag size in bytes.
    pub tag_size: u32,
    /// Mode letter: J, B, D or R.
    pub mode: char,
    /// Block size.
    pub block_size: u32,
    /// The internal hash (`None`: external tags, written by an AEAD layer above).
    pub internal_hash: Option<String>,
}

impl std::fmt::Display for IntegrityLayer {
    /// `0 <len> integrity <device> <offset> <tag_size> <mode> ...` as `dmsetup table` shows
    /// it (the options that matter here).
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let mut args = vec![format!("block_size:{}", self.block_size)];
        if let Some(h) = &self.internal_hash {
            args.push(format!("internal_hash:{h}"));
        }
        write!(
            f,
            "0 {} integrity {} {} {} {} {} {}",
            self.len,
            self.device,
            self.offset,
            self.tag_size,
            self.mode,
            args.len(),
            args.join(" ")
        )
    }
}

/// The table of one layer.
#[derive(Debug, Clone)]
pub enum LayerTable {
    /// A dm-crypt layer (the key is in it: print it masked).
    Crypt(CryptTable),
    /// A dm-integrity layer.
    Integrity(IntegrityLayer),
    /// A dm-linear layer: the plaintext segment of a LUKS2 volume mid-encryption or
    /// mid-decryption (`offset` and `len` in 512-byte sectors of the data device).
    Linear {
        /// Start on the data device.
        offset: u64,
        /// Length.
        len: u64,
    },
}

/// The unlocked header of a LUKS volume.
#[derive(Debug, Clone)]
pub struct Unlocked {
    /// The header.
    pub luks: Luks,
    /// The keyslot that opened.
    pub keyslot: u32,
}

/// An assembled volume: the top of the stack and what it is made of.
#[derive(Debug)]
pub struct Volume {
    /// The device to serve.
    pub device: Arc<dyn BlockDevice>,
    /// What it is.
    pub kind: VolumeKind,
    /// The table of each layer, bottom first.
    pub layers: Vec<LayerTable>,
    /// A standalone dm-integrity layer, for its status (also under a plain crypt layer).
    pub integrity: Option<Arc<IntegrityTarget<Arc<dyn BlockDevice>>>>,
    /// The header and keyslot of a LUKS volume.
    pub luks: Option<Unlocked>,
    /// Whether its data storage sits on rotational media (what NBD's `ROTATIONAL` flag says).
    pub rotational: bool,
}

impl Volume {
    /// The table line of the topmost dm-crypt layer.
    pub fn crypt_table(&self) -> Option<&CryptTable> {
        self.layers.iter().rev().find_map(|l| match l {
            LayerTable::Crypt(t) => Some(t),
            LayerTable::Integrity(_) | LayerTable::Linear { .. } => None,
        })
    }
}

/// Opens the storage `locator` names ([`crate::storage::open`]: a path, a `file://` URI or
/// an object-storage locator, with the lock `opts` ask for) and assembles `spec` on it with
/// `keys`: the one way in.
///
/// ```no_run
/// use sector_crypto::kdf::Passphrase;
/// use volume::{Keys, OnePassphrase, OpenOptions, Spec};
///
/// let pass = Passphrase::new(b"correct horse".to_vec());
/// let mut one = OnePassphrase::new(&pass);
/// let opts = OpenOptions { read_only: true, ..OpenOptions::default() };
/// let vol = volume::open("disk.img", Spec::auto(), Keys::passphrase(&mut one), &opts)?;
/// let mut sector = vec![0u8; 512];
/// vol.device.read_at(0, &mut sector)?;
/// println!("{} volume, {} bytes", vol.kind, vol.device.geometry().size);
/// # Ok::<(), Box<dyn std::error::Error>>(())
/// ```
pub fn open(locator: &str, spec: Spec, keys: Keys<'_>, opts: &OpenOptions) -> Result<Volume, VolumeError> {
    let storage = crate::storage::open(locator, &opts.storage())?;
    open_storage(storage, spec, keys, opts)
}

/// Assembles `spec` on `storage` with `keys` (see the module docs): [`open`] for a caller
/// that opened (and locked) the storage itself, or built it (memory, a test device).
pub fn open_storage(
    storage: Storage,
    spec: Spec,
    mut keys: Keys<'_>,
    opts: &OpenOptions,
) -> Result<Volume, VolumeError> {
    let rotational = storage.rotational;
    let volume = match spec {
        Spec::Auto(a) => open_auto(a, storage, &mut keys, opts),
        Spec::Luks(l) => open_luks(l, &mut keys, storage, opts),
        Spec::Plain(p) => {
            let table = crate::plain::table_on(&storage, &p)?;
            crypt_volume(storage, table, opts, VolumeKind::Plain, Vec::new(), None)
        }
        Spec::Table(t) => crypt_volume(storage, t, opts, VolumeKind::Plain, Vec::new(), None),
        Spec::Integrity(p) => open_integrity(&p, storage, opts),
        Spec::Layers(layers) => open_layers(layers, storage, opts),
        Spec::Tcrypt(t) => crate::tcrypt::open(t, &mut keys, storage, opts),
        Spec::Fvault2(f) => open_fvault2(f, &mut keys, storage, opts),
        Spec::Bitlk => open_bitlk(&mut keys, storage, opts),
    };
    volume.map(|v| Volume { rotational, ..v })
}

/// [`Spec::Auto`]: the probe's answer picks the arm (see [`AutoSpec`]).
fn open_auto(
    a: AutoSpec,
    storage: Storage,
    keys: &mut Keys<'_>,
    opts: &OpenOptions,
) -> Result<Volume, VolumeError> {
    if a.luks.header.is_some() {
        // A detached header: the device holds only ciphertext, the header says what it is.
        return open_luks(a.luks, keys, storage, opts);
    }
    let found = crate::probe::probe(&*storage.device, &storage.name)?;
    log::info!("{}: {} found.", storage.name, found.name());
    match found {
        Format::Luks1 | Format::Luks2 { .. } => open_luks(a.luks, keys, storage, opts),
        Format::Integrity => open_integrity(&a.integrity, storage, opts),
        Format::Bitlk => open_bitlk(keys, storage, opts),
        Format::Fvault2 => open_fvault2(Fvault2Spec { kdf_limits: a.luks.kdf_limits }, keys, storage, opts),
        _ => match a.tcrypt {
            Some(t) => crate::tcrypt::open(t, keys, storage, opts),
            // LUKS's refusal names what the device holds (plain dm-crypt: nothing).
            None => open_luks(a.luks, keys, storage, opts),
        },
    }
}

/// A standalone dm-integrity volume; read-only when either `p` or `opts` says so.
fn open_integrity(p: &IntegrityParams, storage: Storage, opts: &OpenOptions) -> Result<Volume, VolumeError> {
    let p = &IntegrityParams { read_only: p.read_only || opts.read_only, ..p.clone() };
    let t = crate::integrity::open_on(storage.device, &storage.name, p)?;
    let layer = crate::integrity::layer_table(&t, &storage.name, p);
    Ok(Volume {
        device: t.clone(),
        kind: VolumeKind::Integrity,
        layers: vec![LayerTable::Integrity(layer)],
        integrity: Some(t),
        luks: None,
        rotational: false,
    })
}

fn open_bitlk(keys: &mut Keys<'_>, storage: Storage, opts: &OpenOptions) -> Result<Volume, VolumeError> {
    let (device, table, _) = crate::bitlk::open_on(keys, storage, opts)?;
    Ok(Volume {
        device,
        kind: VolumeKind::Bitlk,
        layers: vec![LayerTable::Crypt(table)],
        integrity: None,
        luks: None,
        rotational: false,
    })
}

fn crypt_volume(
    storage: Storage,
    table: CryptTable,
    opts: &OpenOptions,
    kind: VolumeKind,
    mut layers: Vec<LayerTable>,
    luks: Option<Unlocked>,
) -> Result<Volume, VolumeError> {
    let target = crypt_over(storage.device, &table, opts)?;
    layers.push(LayerTable::Crypt(table));
    Ok(Volume { device: Arc::new(target), kind, layers, integrity: None, luks, rotational: false })
}

fn open_layers(layers: Vec<Layer>, storage: Storage, opts: &OpenOptions) -> Result<Volume, VolumeError> {
    if layers.is_empty() {
        return Err(VolumeError::Stack("no layers"));
    }
    let mut below = storage;
    let mut tables = Vec::new();
    let mut integrity = None;
    for layer in layers {
        match layer {
            Layer::Integrity(p) => {
                if !tables.is_empty() {
                    return Err(VolumeError::Stack("a dm-integrity layer goes directly on the storage"));
                }
                let p = IntegrityParams { read_only: p.read_only || opts.read_only, ..p };
                let t = crate::integrity::open_on(below.device, &below.name, &p)?;
                tables.push(LayerTable::Integrity(crate::integrity::layer_table(&t, &below.name, &p)));
                let name = format!("{}@dm-integrity", below.name);
                below = Storage::new(t.clone(), name);
                integrity = Some(t);
            }
            Layer::Plain(p) => {
                let table = crate::plain::table_on(&below, &p)?;
                let target = crypt_over(below.device, &table, opts)?;
                tables.push(LayerTable::Crypt(table));
                below = Storage::new(Arc::new(target), "dm-crypt");
            }
        }
    }
    Ok(Volume {
        device: below.device,
        kind: VolumeKind::Layers,
        layers: tables,
        integrity,
        luks: None,
        rotational: false,
    })
}

/// Loads the LUKS header on `meta` (repairing a damaged LUKS2 copy unless `read_only`),
/// checks the version asked for and that it can be opened, then tries the passphrases of
/// `l` until one opens a keyslot. Nothing is assembled: `open --test-passphrase`, and the
/// first half of [`open`] for LUKS. For a volume mid-reencryption the key returned is the
/// new one (the passphrase opened both).
pub fn unlock_luks(
    l: &LuksSpec,
    passphrases: &mut dyn PassphraseSource,
    meta: &Storage,
    read_only: bool,
) -> Result<(Unlocked, VolumeKey), VolumeError> {
    let (unlocked, keys) = unlock_keys(l, passphrases, meta, read_only)?;
    Ok((
        unlocked,
        match keys {
            Unlock::One(k) => k,
            Unlock::Reencrypt(k) => match k.volume_key() {
                Some(vk) => vk.clone(),
                None => {
                    return Err(VolumeError::Luks {
                        path: meta.name.clone(),
                        source: LuksError::Internal("the reencryption in progress has no volume key"),
                    })
                }
            },
        },
    ))
}

/// The keys an unlock found.
enum Unlock {
    /// The volume key.
    One(VolumeKey),
    /// Both keys of a reencryption in progress.
    Reencrypt(luks::reencrypt::ReencryptKeys),
}

fn unlock_keys(
    l: &LuksSpec,
    passphrases: &mut dyn PassphraseSource,
    meta: &Storage,
    read_only: bool,
) -> Result<(Unlocked, Unlock), VolumeError> {
    let path = meta.name.as_str();
    let wrap = |source| VolumeError::Luks { path: path.to_owned(), source };
    if luks::probe(&*meta.device).map_err(wrap)?.is_none() {
        let found = crate::probe::probe(&*meta.device, path)?;
        return Err(VolumeError::NotLuks { path: path.to_owned(), found });
    }
    let header = luks::load_checked(&*meta.device, path, l.version, !read_only).map_err(wrap)?;
    let reencrypting = luks::reencrypt::status(&header).map_err(wrap)?.is_some();
    if reencrypting {
        luks::reencrypt::check_openable(&header).map_err(wrap)?;
    } else {
        header.check_supported().map_err(wrap)?;
    }
    let mut last = None;
    while let Some(pass) = passphrases.next_passphrase()? {
        let slots = passphrases.keyslots();
        // One keyslot, any keyslot, or a token's keyslots in its order (a wrong passphrase
        // goes on to the next; any other error stops, as in cryptsetup).
        let unlock = |pass: &Passphrase| match &slots {
            None => header.unlock_with(&*meta.device, pass, l.key_slot, &l.kdf_limits),
            Some(list) => {
                let mut r = Err(LuksError::WrongPassphrase);
                for &s in list {
                    r = header.unlock_with(&*meta.device, pass, Some(s), &l.kdf_limits);
                    if !matches!(r, Err(LuksError::WrongPassphrase)) {
                        break;
                    }
                }
                r
            }
        };
        let tried = if reencrypting {
            // Both keys open with the passphrase (cryptsetup unlocks all segments' keys).
            // The keyslot is the one that opened the volume's key (during an encryption it is
            // bound to no regular segment yet). A --key-slot is the only keyslot tried, as in
            // cryptsetup: it must open both keys.
            let only = if slots.is_none() { l.key_slot } else { None };
            luks::reencrypt::unlock_keys_with(&*meta.device, &header, &pass, only, &l.kdf_limits).and_then(
                |k| {
                    // A token names its keyslots.
                    let slot = match &slots {
                        Some(_) => unlock(&pass)?.0,
                        None => k.keyslot,
                    };
                    Ok((slot, Unlock::Reencrypt(k)))
                },
            )
        } else {
            unlock(&pass).map(|(k, vk)| (k, Unlock::One(vk)))
        };
        match tried {
            Ok((keyslot, keys)) => return Ok((Unlocked { luks: header, keyslot }, keys)),
            Err(LuksError::WrongPassphrase) => {
                passphrases.rejected();
                last = Some(LuksError::WrongPassphrase);
            }
            Err(e) => return Err(wrap(e)),
        }
    }
    Err(wrap(last.unwrap_or(LuksError::WrongPassphrase)))
}

fn open_luks(
    mut l: LuksSpec,
    keys: &mut Keys<'_>,
    storage: Storage,
    opts: &OpenOptions,
) -> Result<Volume, VolumeError> {
    let header = l.header.take();
    let meta = header.as_ref().unwrap_or(&storage);
    let (unlocked, found) = unlock_keys(&l, keys, meta, opts.read_only)?;
    let vk = match found {
        Unlock::One(vk) => vk,
        Unlock::Reencrypt(k) => {
            let meta_dev = header.as_ref().map_or_else(|| storage.device.clone(), |h| h.device.clone());
            return open_reencrypting(&l, unlocked, &k, &*meta_dev, storage, opts);
        }
    };
    drop(header);
    let wrap = |source| VolumeError::Luks { path: storage.name.clone(), source };
    let version = unlocked.luks.version();
    if let Some(spec) = unlocked.luks.aead().map_err(wrap)? {
        let a = luks::AeadOpen {
            flags: &l.flags,
            no_journal: l.integrity_no_journal,
            journal: l.integrity_journal,
            open: opts,
        };
        let (device, layers) =
            luks::aead::open(&unlocked.luks, &spec, storage.device, &storage.name, &vk, &a).map_err(wrap)?;
        return Ok(Volume {
            device,
            kind: VolumeKind::Luks2Aead,
            layers,
            integrity: None,
            luks: Some(unlocked),
            rotational: false,
        });
    }
    if l.integrity_journal.is_set() {
        return Err(wrap(crate::luks::ParamError::JournalTuningWithoutIntegrity.into()));
    }
    let table = unlocked.luks.table(&storage.name, storage.size(), &vk, &l.flags).map_err(wrap)?;
    let kind = if version == LuksVersion::V1 { VolumeKind::Luks1 } else { VolumeKind::Luks2 };
    crypt_volume(storage, table, opts, kind, Vec::new(), Some(unlocked))
}

/// A LUKS2 volume mid-reencryption: a hotzone a crash left half rewritten is recovered, then
/// the device is the two segments split at the boundary (cryptsetup's two-segment
/// activation). Layers: the new segment's table, then the old's (a linear layer for the
/// plaintext side of an encryption or decryption).
fn open_reencrypting(
    l: &LuksSpec,
    mut unlocked: Unlocked,
    keys: &luks::reencrypt::ReencryptKeys,
    meta: &dyn BlockDevice,
    storage: Storage,
    opts: &OpenOptions,
) -> Result<Volume, VolumeError> {
    // The header's persistent flags (LUKS2 `config.flags`) join the command line's, as
    // `Luks::table` adds them for one segment.
    let flags = with_persistent_flags(&unlocked.luks, &l.flags);
    let (device, tn, to) =
        luks::reencrypting::activate(&storage, meta, &mut unlocked.luks, keys, opts, &flags)?;
    let layer = |t| match t {
        luks::reencrypting::SegmentTable::Crypt(t) => LayerTable::Crypt(t),
        luks::reencrypting::SegmentTable::Linear { offset, len } => LayerTable::Linear { offset, len },
    };
    let layers = std::iter::once(tn).chain(to).map(layer).collect();
    Ok(Volume {
        device,
        kind: VolumeKind::Luks2,
        layers,
        integrity: None,
        luks: Some(unlocked),
        rotational: false,
    })
}

/// `extra` (command-line activation flags) with the LUKS2 header's persistent flags added.
fn with_persistent_flags(luks: &Luks, extra: &CryptOptions) -> CryptOptions {
    let stored = match &luks.header {
        luks::LuksHeader::V2(s) => s.header.metadata.config.flags.clone().unwrap_or_default(),
        luks::LuksHeader::V1(_) => Vec::new(),
    };
    extra.with_persistent(&stored)
}

/// Reads the FileVault2 metadata on `storage` and tries the passphrases of `f` until one
/// unwraps the volume key: `open --test-passphrase`, and the first half of [`open`] for
/// FileVault2. Nothing is written.
pub fn unlock_fvault2(
    f: &Fvault2Spec,
    passphrases: &mut dyn PassphraseSource,
    storage: &Storage,
) -> Result<(formats::fvault2::Fvault2Params, VolumeKey), VolumeError> {
    let wrap = |source| VolumeError::Fvault2 { path: storage.name.clone(), source };
    let params = crate::fvault2::read_params(&*storage.device).map_err(wrap)?;
    let mut last = None;
    while let Some(pass) = passphrases.next_passphrase()? {
        match crate::fvault2::unlock(&params, &pass, &f.kdf_limits) {
            Ok(key) => return Ok((params, key)),
            Err(crate::fvault2::Fvault2VolumeError::WrongPassphrase) => {
                passphrases.rejected();
                last = Some(crate::fvault2::Fvault2VolumeError::WrongPassphrase);
            }
            Err(e) => return Err(wrap(e)),
        }
    }
    Err(wrap(last.unwrap_or(crate::fvault2::Fvault2VolumeError::WrongPassphrase)))
}

fn open_fvault2(
    f: Fvault2Spec,
    keys: &mut Keys<'_>,
    storage: Storage,
    opts: &OpenOptions,
) -> Result<Volume, VolumeError> {
    let (params, key) = unlock_fvault2(&f, keys, &storage)?;
    let table = crate::fvault2::table(&params, &storage.name, &key);
    // Read-only whatever was asked: FileVault2 is opened, never changed (as cryptsetup
    // never changes its metadata); the crypt layer refuses writes with a read-only error.
    let ro = OpenOptions { read_only: true, ..*opts };
    crypt_volume(storage, table, &ro, VolumeKind::Fvault2, Vec::new(), None)
}

/// What to format.
pub enum FormatSpec<'a> {
    /// LUKS1 or LUKS2, with `--integrity` in the same call (the dm-integrity area formatted
    /// and, unless `no_wipe`, wiped through the AEAD layer).
    Luks {
        /// Header parameters (see [`luks::FormatParams::for_cipher`] for the key size).
        params: luks::FormatParams,
        /// A detached header ([`luks::open_header_for_format`] makes it big enough).
        header: Option<&'a Storage>,
        /// The first keyslot's passphrase.
        passphrase: &'a Passphrase,
    },
    /// A standalone dm-integrity volume.
    Integrity {
        /// integritysetup's options.
        params: IntegrityParams,
        /// The superblock salt.
        salt: [u8; 16],
        /// Skip the wipe (unwritten blocks then read as integrity errors).
        no_wipe: bool,
    },
}

/// What a format made.
#[derive(Debug)]
pub enum Formatted {
    /// A LUKS header (and its volume key), and how the data-area wipe of an authenticated
    /// volume ended (`Done` for other volumes).
    Luks {
        /// The header written.
        luks: Box<Luks>,
        /// The volume key.
        key: VolumeKey,
        /// The wipe's end.
        wipe: WipeEnd,
    },
    /// A dm-integrity superblock and journal, and the wipe.
    Integrity(crate::integrity::FormatReport),
}

/// Formats `storage` as `spec` says; `progress(done, total)` is asked during a wipe (an
/// authenticated LUKS2 volume, or integrity) and may stop it (`Break`), flushed.
pub fn format(
    spec: FormatSpec<'_>,
    storage: &Storage,
    progress: impl FnMut(u64, u64) -> ControlFlow<()>,
) -> Result<Formatted, VolumeError> {
    match spec {
        FormatSpec::Luks { mut params, header, passphrase } => {
            if params.data_size.is_none() {
                params.data_size = Some(storage.size());
            }
            params.detached = header.is_some();
            let meta = header.unwrap_or(storage);
            let wrap = |path: &str| {
                let path = path.to_owned();
                move |source| VolumeError::Luks { path, source }
            };
            let (l, key) = luks::format(&*meta.device, &params, passphrase).map_err(wrap(&meta.name))?;
            let wipe = match &params.integrity {
                Some(i) => luks::format_integrity_until(storage.device.clone(), &l, &key, i, progress)
                    .map_err(wrap(&storage.name))?,
                None => WipeEnd::Done,
            };
            Ok(Formatted::Luks { luks: Box::new(l), key, wipe })
        }
        FormatSpec::Integrity { params, salt, no_wipe } => crate::integrity::format_on(
            storage.device.clone(),
            &storage.name,
            &params,
            salt,
            no_wipe,
            progress,
        )
        .map(Formatted::Integrity)
        .map_err(VolumeError::from),
    }
}

/// Says what is on `storage` and what its header tells in plaintext (see `probe::describe`).
pub fn describe(storage: &Storage) -> Result<crate::probe::Description, VolumeError> {
    crate::probe::describe(&*storage.device, &storage.name)
}

/// Says what is on `storage` (see `probe::probe`).
pub fn probe(storage: &Storage) -> Result<Format, VolumeError> {
    crate::probe::probe(&*storage.device, &storage.name)
}
