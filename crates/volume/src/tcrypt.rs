//! TrueCrypt and VeraCrypt volumes (cryptsetup's `--type tcrypt`): find the header's KDF
//! and cipher chain by trial, then stack one dm-crypt layer per cipher of the chain.
//!
//! ```text
//!   passphrase + keyfiles ──kdf_password──► KDF password (the keyfile pool)
//!   header block (512 B at 0 / 64 KiB / end−128 KiB / end−64 KiB / 31744) = salt ‖ 448 B
//!      │
//!      ├─ for each KDF (formats::tcrypt::kdf_plan; run on every core, lowest match wins)
//!      │    key = PBKDF2(hash, password, salt, iterations, 192 bytes)
//!      │    for each chain (chain_plan): decrypt the 448 bytes, last cipher first
//!      │         "TRUE" / "VERA" at the start? ── yes ─► CRC checks (TcryptHeader::decode)
//!      ▼
//!   Volume: layer per cipher, the chain's last cipher on the device, its first on top
//!
//!     top     ┌ crypt  ciphers[0]  (e.g. serpent-xts-plain64)  offset 0
//!             │ crypt  ciphers[1]  (twofish-xts-plain64)       offset 0
//!     device  └ crypt  ciphers[2]  (aes-xts-plain64)           offset = data offset
//!             every layer: the same size and IV offset, its own key slice
//! ```
//! as cryptsetup's `TCRYPT_activate` maps it (names `NAME_2`, `NAME_1`, `NAME`). The header
//! itself is decrypted as cryptsetup's backend does: XTS with tweak 0 and LRW with block
//! index 1 over the 448 bytes (one 512-byte sector 0 of `xts-plain64` / `lrw-benbi`, padded),
//! CBC modes with the header whitening removed first.
//!
//! The PBKDF2 runs are the whole cost (up to a dozen, some of 500 000+ iterations, when
//! nothing restricts them): `--hash`, `--cipher` and `--veracrypt-pim` narrow the search.
//! A signal ends a derivation at once (`sector_crypto::interrupt`); nothing is written
//! before the header is decoded and checked.

use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};

use blockdev::{BlockDevice, BlockError};
use formats::dm::{CryptOptions, CryptTable};
use formats::tcrypt::{
    self, chain_plan, data_layout, header_offsets, kdf_plan, ChainMode, CipherChain, DataLayout, HeaderFlags,
    KdfEntry, TcryptError, TcryptHeader, BLOCK_LEN, HDR_KEY_LEN, HDR_LEN, SALT_LEN,
};
use sector_crypto::kdf::HashAlg;
use sector_crypto::{CipherSpec, SectorCipher, SectorParams, VolumeKey};
use zeroize::Zeroizing;

use crate::assemble::{LayerTable, PassphraseSource, Volume, VolumeKind};
use crate::error::{block_kind, ErrorKind};
use crate::keys::Keys;
use crate::storage::Storage;
use crate::{crypt_over, OpenOptions, VolumeError};

/// How to unlock a TrueCrypt/VeraCrypt volume (cryptsetup `open --type tcrypt`,
/// `tcryptDump`). Passphrases and keyfiles (`-d`, in order; only the first MiB of each
/// counts) come from the [`Keys`] given beside it, each passphrase combined with the
/// keyfiles.
#[derive(Clone)]
pub struct TcryptSpec {
    /// Also try VeraCrypt KDFs and the "VERA" magic (cryptsetup's default; off with
    /// `--disable-veracrypt`).
    pub veracrypt: bool,
    /// `--veracrypt-pim`: VeraCrypt KDFs only, iterations from the PIM.
    pub pim: Option<u32>,
    /// Which header: hidden, system, backup.
    pub flags: HeaderFlags,
    /// `--hash`: only KDFs whose hash name contains this.
    pub hash: Option<String>,
    /// `--cipher`: only chains whose name contains this.
    pub cipher: Option<String>,
    /// Try the legacy (TrueCrypt < 5) KDF and chains too (the CLI always does).
    pub legacy: bool,
    /// Activation flags (`--allow-discards`, `--perf-*`).
    pub options: CryptOptions,
}

impl std::fmt::Debug for TcryptSpec {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("TcryptSpec")
            .field("veracrypt", &self.veracrypt)
            .field("pim", &self.pim.map(|_| "<set>"))
            .field("flags", &self.flags)
            .field("hash", &self.hash)
            .field("cipher", &self.cipher)
            .field("legacy", &self.legacy)
            .finish_non_exhaustive()
    }
}

impl Default for TcryptSpec {
    /// The normal header, VeraCrypt and legacy modes on, nothing restricted (the CLI's
    /// defaults).
    fn default() -> Self {
        TcryptSpec {
            veracrypt: true,
            pim: None,
            flags: HeaderFlags::default(),
            hash: None,
            cipher: None,
            legacy: true,
            options: CryptOptions::default(),
        }
    }
}

/// Why a TrueCrypt/VeraCrypt volume could not be opened.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum TcryptVolumeError {
    /// No KDF and cipher chain decrypt a header with this passphrase (and keyfiles, PIM).
    #[error("No device header detected with this passphrase.")]
    NoHeader,
    /// The header decrypted but is not usable (CRC, layout, passphrase length, PIM).
    #[error("invalid TCRYPT header")]
    Header(#[source] TcryptError),
    /// A legacy chain the kernel cannot map (the header opens, the data cannot).
    #[error("Kernel does not support activation for this TCRYPT legacy mode ({chain}-{mode}).")]
    LegacyMode {
        /// Chain name.
        chain: &'static str,
        /// Mode name.
        mode: &'static str,
    },
    /// Reading the header failed.
    #[error("reading the TCRYPT header at byte {offset}")]
    Read {
        /// Byte offset.
        offset: u64,
        /// Cause.
        #[source]
        source: BlockError,
    },
    /// `--cipher` names no cipher chain.
    #[error("no TCRYPT cipher chain matches --cipher {0:?}")]
    NoChain(String),
    /// `--tcrypt-hidden` with `--allow-discards` (discards would reveal the hidden volume).
    #[error("Option --tcrypt-hidden cannot be combined with --allow-discards.")]
    HiddenDiscards,
}

impl TcryptVolumeError {
    /// The cause, as cryptsetup's exit codes see it.
    pub fn kind(&self) -> ErrorKind {
        match self {
            TcryptVolumeError::NoHeader => ErrorKind::WrongKey,
            TcryptVolumeError::Header(e) => match e {
                TcryptError::PassphraseTooLong(_) => ErrorKind::WrongKey,
                TcryptError::PimRange(_) => ErrorKind::Usage,
                TcryptError::SectorSize(_) => ErrorKind::Unsupported,
                TcryptError::DeviceTooSmall(_) => ErrorKind::TooSmall,
                _ => ErrorKind::Corrupt,
            },
            TcryptVolumeError::LegacyMode { .. } => ErrorKind::Unsupported,
            TcryptVolumeError::Read { source, .. } => block_kind(source),
            TcryptVolumeError::HiddenDiscards | TcryptVolumeError::NoChain(_) => ErrorKind::Usage,
        }
    }
}

/// An unlocked header: what `tcryptDump` prints and what the volume is built from.
#[derive(Clone)]
pub struct TcryptUnlocked {
    /// The decoded header (its keys are the volume keys).
    pub header: TcryptHeader,
    /// The KDF that derived the header key.
    pub kdf: KdfEntry,
    /// Its iterations (from the PIM, if one was given).
    pub iterations: u32,
    /// The cipher chain.
    pub chain: &'static CipherChain,
    /// Which header opened.
    pub flags: HeaderFlags,
    /// Where the header block was.
    pub header_offset: u64,
}

impl std::fmt::Debug for TcryptUnlocked {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("TcryptUnlocked")
            .field("header", &self.header)
            .field("kdf", &self.kdf)
            .field("iterations", &self.iterations)
            .field("chain", &self.chain.name)
            .field("mode", &self.chain.mode)
            .field("flags", &self.flags)
            .finish()
    }
}

impl TcryptUnlocked {
    /// The volume key as cryptsetup's `--dump-volume-key` prints it.
    pub fn volume_key(&self) -> Option<VolumeKey> {
        self.chain.volume_key(&self.header.keys[..]).map(|k| VolumeKey::from_slice(&k))
    }
}

fn wrap(path: &str) -> impl Fn(TcryptVolumeError) -> VolumeError + '_ {
    move |source| VolumeError::Tcrypt { path: path.to_owned(), source }
}

/// Reads the 512-byte block at `offset`, through a read aligned to the device's logical
/// block (sector 62 of a 4K-sector disk is not aligned).
fn read_block(dev: &dyn BlockDevice, offset: u64) -> Result<Zeroizing<[u8; BLOCK_LEN]>, TcryptVolumeError> {
    let lb = u64::from(dev.geometry().logical_block.max(512));
    let start = offset / lb * lb;
    let end = (offset + BLOCK_LEN as u64).div_ceil(lb) * lb;
    let mut buf = Zeroizing::new(vec![0u8; (end - start) as usize]);
    dev.read_at(start, &mut buf).map_err(|source| TcryptVolumeError::Read { offset, source })?;
    let at = (offset - start) as usize;
    let mut out = Zeroizing::new([0u8; BLOCK_LEN]);
    out.copy_from_slice(&buf[at..at + BLOCK_LEN]);
    Ok(out)
}

/// One 512-byte sector holding the 448 header bytes at its start (XTS and LRW treat the
/// blocks independently, CBC decryption only looks back, so the padding changes nothing).
type Work = Zeroizing<[u8; 512]>;

fn sector_cipher(spec: &str, key: &[u8]) -> Option<SectorCipher> {
    let spec: CipherSpec = spec.parse().ok()?;
    let params = SectorParams { sector_size: 512, iv_offset: 0, iv_large_sectors: false };
    SectorCipher::new(&spec, &VolumeKey::from_slice(key), params).ok()
}

/// XORs the 448 header bytes with the 8-byte whitening at `key[8..16]`.
fn remove_whitening(buf: &mut Work, key: &[u8]) {
    for (i, b) in buf[..HDR_LEN].iter_mut().enumerate() {
        *b ^= key[8 + i % 8];
    }
}

/// XORs CBC's chaining into ECB-decrypted blocks: block `i` with ciphertext block `i − 1`,
/// block 0 with `iv`.
fn cbc_unchain(buf: &mut Work, cipher_text: &[u8], iv: &[u8]) {
    let bs = iv.len();
    for i in (0..HDR_LEN).step_by(bs) {
        let prev = if i == 0 { iv } else { &cipher_text[i - bs..i] };
        buf[i..i + bs].iter_mut().zip(prev).for_each(|(b, p)| *b ^= p);
    }
}

/// Reverses the byte order of each 32-bit word (the kernel's Blowfish is big-endian,
/// TrueCrypt's little-endian).
fn swab32(buf: &mut [u8]) {
    buf.chunks_exact_mut(4).for_each(|w| w.reverse());
}

/// Decrypts one chain's header with KDF output `key`; `None` if a cipher is not available
/// (skipped, as cryptsetup skips a chain whose cipher its backend lacks).
fn decrypt_header(chain: &CipherChain, key: &[u8], enc: &[u8]) -> Option<Work> {
    let mut buf: Work = Zeroizing::new([0u8; 512]);
    buf[..HDR_LEN].copy_from_slice(enc);
    match chain.mode {
        ChainMode::Xts | ChainMode::Lrw => {
            for c in chain.ciphers.iter().rev() {
                let k = c.layer_key(chain.mode, key)?;
                let sc = sector_cipher(&format!("{}-{}", c.name, chain.mode.name()), &k)?;
                sc.decrypt(0, &mut buf[..]).ok()?;
            }
        }
        ChainMode::CbcTcw | ChainMode::CbcTcrypt => {
            for c in chain.ciphers.iter().rev() {
                remove_whitening(&mut buf, key);
                let iv = key.get(c.iv_offset..c.iv_offset + c.iv_size)?;
                let ck = key.get(c.key_offset..c.key_offset + c.key_size)?;
                let before = Zeroizing::new(buf[..HDR_LEN].to_vec());
                if c.name == "blowfish_le" {
                    swab32(&mut buf[..]);
                    sector_cipher("blowfish-ecb", ck)?.decrypt(0, &mut buf[..]).ok()?;
                    swab32(&mut buf[..]);
                } else {
                    sector_cipher(&format!("{}-ecb", c.name), ck)?.decrypt(0, &mut buf[..]).ok()?;
                }
                cbc_unchain(&mut buf, &before, iv);
            }
        }
        ChainMode::CbciTcrypt => {
            remove_whitening(&mut buf, key);
            let first = chain.ciphers.first()?;
            let iv = key.get(first.iv_offset..first.iv_offset + first.iv_size)?;
            let before = Zeroizing::new(buf[..HDR_LEN].to_vec());
            for c in chain.ciphers.iter().rev() {
                let ck = key.get(c.key_offset..c.key_offset + c.key_size)?;
                sector_cipher(&format!("{}-ecb", c.name), ck)?.decrypt(0, &mut buf[..]).ok()?;
            }
            cbc_unchain(&mut buf, &before, iv);
        }
    }
    Some(buf)
}

/// What a successful trial found: the KDF's index in the plan, the chain, the plaintext.
struct Found {
    kdf: usize,
    chain: &'static CipherChain,
    plain: Work,
}

/// Tries every KDF of `plan` × chain of `chains` on one header block; the lowest KDF index
/// (then the first chain) whose decryption starts with a magic wins, as in cryptsetup's
/// sequential search. KDFs run on up to every core: a worker skips any KDF after a match
/// already found, and all finish their current one before the answer is taken.
fn search(
    plan: &[(KdfEntry, u32)],
    chains: &[&'static CipherChain],
    password: &[u8],
    block: &[u8; BLOCK_LEN],
    veracrypt: bool,
) -> Option<Found> {
    let (salt, enc) = block.split_at(SALT_LEN);
    let next = AtomicUsize::new(0);
    let best: Mutex<Option<Found>> = Mutex::new(None);
    let best_index = AtomicUsize::new(usize::MAX);
    let workers = std::thread::available_parallelism().map_or(1, |n| n.get()).min(plan.len()).max(1);
    let work = || loop {
        let i = next.fetch_add(1, Ordering::Relaxed);
        if i >= plan.len() || i > best_index.load(Ordering::Acquire) {
            return;
        }
        let (kdf, iterations) = plan[i];
        let Ok(hash) = kdf.hash.parse::<HashAlg>() else {
            log::debug!("TCRYPT: PBKDF2 hash {} not available, skipping", kdf.hash);
            continue;
        };
        let mut key = Zeroizing::new([0u8; HDR_KEY_LEN]);
        log::debug!("TCRYPT: trying KDF pbkdf2-{}-{iterations}", kdf.hash);
        if hash.pbkdf2(password, salt, iterations, &mut key[..]).is_err() {
            continue;
        }
        for chain in chains {
            let Some(plain) = decrypt_header(chain, &key[..], enc) else {
                continue;
            };
            if tcrypt::Magic::detect(&plain[..], veracrypt).is_none() {
                continue;
            }
            let mut b = best.lock().unwrap_or_else(|e| e.into_inner());
            if b.as_ref().is_none_or(|f| i < f.kdf) {
                *b = Some(Found { kdf: i, chain, plain });
                best_index.store(i, Ordering::Release);
            }
            break;
        }
    };
    std::thread::scope(|s| {
        for _ in 1..workers {
            s.spawn(work);
        }
        work();
    });
    best.into_inner().unwrap_or_else(|e| e.into_inner())
}

/// Finds and decodes the header on `meta` with the passphrases and keyfiles of `keys`
/// (and the PIM of `spec`; cryptsetup's `TCRYPT_read_phdr`). Nothing is written.
pub fn unlock(spec: &TcryptSpec, keys: &mut Keys<'_>, meta: &Storage) -> Result<TcryptUnlocked, VolumeError> {
    let w = wrap(&meta.name);
    let offsets = header_offsets(spec.flags, meta.size()).map_err(|e| w(TcryptVolumeError::Header(e)))?;
    let mut blocks = Vec::new();
    for &o in &offsets {
        blocks.push((o, read_block(&*meta.device, o).map_err(&w)?));
    }
    let plan = kdf_plan(spec.hash.as_deref(), spec.legacy, spec.veracrypt, spec.pim)
        .map_err(|e| w(TcryptVolumeError::Header(e)))?;
    let chains = chain_plan(spec.cipher.as_deref(), spec.legacy);
    if chains.is_empty() {
        // cryptsetup tries nothing and fails with -EINVAL (exit 1), before any passphrase.
        return Err(w(TcryptVolumeError::NoChain(spec.cipher.clone().unwrap_or_default())));
    }
    let keyfiles: Vec<Zeroizing<Vec<u8>>> =
        keys.keyfiles().iter().map(|k| Zeroizing::new(k.as_bytes().to_vec())).collect();
    let keyfiles: Vec<&[u8]> = keyfiles.iter().map(|k| k.as_slice()).collect();
    let mut last = TcryptVolumeError::NoHeader;
    while let Some(pass) = keys.next_passphrase()? {
        let password = match tcrypt::kdf_password(pass.as_bytes(), &keyfiles, spec.veracrypt) {
            Ok(p) => p,
            Err(e) => {
                log::error!("{e}");
                keys.rejected();
                last = TcryptVolumeError::Header(e);
                continue;
            }
        };
        for (offset, block) in &blocks {
            let Some(found) = search(&plan, &chains, &password, block, spec.veracrypt) else {
                continue;
            };
            let header = TcryptHeader::decode(&found.plain[..HDR_LEN], spec.veracrypt)
                .map_err(|e| w(TcryptVolumeError::Header(e)))?;
            let (kdf, iterations) = plan[found.kdf];
            log::debug!(
                "TCRYPT: header at {offset}: {}-{}, pbkdf2-{} {iterations}, version {}",
                found.chain.name,
                found.chain.mode.name(),
                kdf.hash,
                header.version
            );
            return Ok(TcryptUnlocked {
                header,
                kdf,
                iterations,
                chain: found.chain,
                flags: spec.flags,
                header_offset: *offset,
            });
        }
        keys.rejected();
        last = TcryptVolumeError::NoHeader;
    }
    Err(w(last))
}

/// The data layout of an unlocked volume on a device of `device_size` bytes, bounded.
pub fn layout(u: &TcryptUnlocked, device_size: u64) -> Result<DataLayout, TcryptVolumeError> {
    data_layout(&u.header, u.chain.mode, u.flags, device_size).map_err(TcryptVolumeError::Header)
}

/// The table of each layer, bottom (the device) first, for `u` on `device`.
pub fn tables(
    u: &TcryptUnlocked,
    device: &str,
    l: DataLayout,
    options: CryptOptions,
) -> Result<Vec<CryptTable>, TcryptVolumeError> {
    let chain = u.chain;
    if !chain.mode.can_map() {
        return Err(TcryptVolumeError::LegacyMode { chain: chain.name, mode: chain.mode.name() });
    }
    let n = chain.ciphers.len();
    let mut out = Vec::with_capacity(n);
    for (i, c) in chain.ciphers.iter().enumerate().rev() {
        let key = c
            .layer_key(chain.mode, &u.header.keys[..])
            .ok_or(TcryptVolumeError::Header(TcryptError::Short(tcrypt::KEYS_LEN)))?;
        let bottom = i == n - 1;
        out.push(CryptTable {
            len: l.size,
            cipher: format!("{}-{}", c.name, chain.mode.name()),
            key: Zeroizing::new(key.to_vec()),
            iv_offset: l.iv_offset,
            device: if bottom { device.to_owned() } else { format!("{device}_{}", i + 1) },
            offset: if bottom { l.offset } else { 0 },
            options,
        });
    }
    Ok(out)
}

/// Unlocks and assembles a TrueCrypt/VeraCrypt volume (the `Spec::Tcrypt` arm of `open`).
pub(crate) fn open(
    spec: TcryptSpec,
    keys: &mut Keys<'_>,
    storage: Storage,
    opts: &OpenOptions,
) -> Result<Volume, VolumeError> {
    if spec.flags.hidden && spec.options.allow_discards {
        return Err(wrap(&storage.name)(TcryptVolumeError::HiddenDiscards));
    }
    let u = unlock(&spec, keys, &storage)?;
    assemble(&u, storage, spec.options, opts)
}

/// Stacks the layers of an unlocked volume on `storage` (the second half of `open`, for a
/// caller that unlocked first, as `tcryptDump` and the CLI's PIM prompt do).
pub fn assemble(
    u: &TcryptUnlocked,
    storage: Storage,
    options: CryptOptions,
    opts: &OpenOptions,
) -> Result<Volume, VolumeError> {
    let w = wrap(&storage.name);
    // As cryptsetup's TCRYPT_activate: an unmappable legacy mode is refused before the layout.
    if !u.chain.mode.can_map() {
        return Err(w(TcryptVolumeError::LegacyMode { chain: u.chain.name, mode: u.chain.mode.name() }));
    }
    let l = layout(u, storage.size()).map_err(&w)?;
    let tables = tables(u, &storage.name, l, options).map_err(&w)?;
    let mut below: Arc<dyn BlockDevice> = storage.device;
    let mut layers = Vec::with_capacity(tables.len());
    for t in tables {
        let target = crypt_over(below, &t, opts)?;
        below = Arc::new(target);
        layers.push(LayerTable::Crypt(t));
    }
    Ok(Volume {
        device: below,
        kind: VolumeKind::Tcrypt,
        layers,
        integrity: None,
        luks: None,
        rotational: false,
    })
}
