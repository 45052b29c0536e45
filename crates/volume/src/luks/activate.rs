//! Activation: the dm-crypt table of an unlocked header, and the by-path open.
use blockdev::BlockDevice;
use formats::dm::CryptTable;
use sector_crypto::kdf::Passphrase;
use sector_crypto::VolumeKey;
use zeroize::Zeroizing;

use super::{luks2, CryptOptions, KdfLimits, Luks, LuksError, LuksVersion};

/// What `open --type luks` needs besides the passphrase, by path: the convenience form of
/// [`crate::open`] with [`crate::Spec::Luks`] for callers that have paths (tests, examples).
#[derive(Debug, Clone)]
pub struct OpenParams {
    /// The data device (and metadata device unless `header` is set).
    pub device: String,
    /// A detached header file (`--header`).
    pub header: Option<String>,
    /// `--type luks1` / `luks2` (`None`: either).
    pub version: Option<LuksVersion>,
    /// `--key-slot`.
    pub key_slot: Option<u32>,
    /// Activation flags from the command line (`--allow-discards`, `--perf-*`), added to the
    /// header's persistent flags.
    pub flags: CryptOptions,
    /// How to open the devices.
    pub open: crate::OpenOptions,
    /// `--integrity-no-journal`: open the dm-integrity layer of an authenticated volume in
    /// direct mode (D) instead of journaled (J). The header's `no-journal` flag does the same.
    pub integrity_no_journal: bool,
    /// `--journal-watermark`, `--journal-commit-time` of that dm-integrity layer (mode J).
    pub integrity_journal: super::IntegrityJournalTuning,
    /// Bounds on the header's KDF costs (`--max-pbkdf2-iterations`, `--max-argon2-cost`,
    /// `--allow-expensive-kdf`).
    pub kdf_limits: KdfLimits,
}

impl OpenParams {
    /// Opens `device` as cryptsetup would with no options: either LUKS version, any
    /// keyslot, the header's own flags, read-write, default crypto placement.
    pub fn new(device: impl Into<String>) -> Self {
        OpenParams {
            device: device.into(),
            header: None,
            version: None,
            key_slot: None,
            flags: CryptOptions::default(),
            open: crate::OpenOptions::default(),
            integrity_no_journal: false,
            integrity_journal: Default::default(),
            kdf_limits: KdfLimits::default(),
        }
    }
}

/// An unlocked and assembled LUKS volume.
#[derive(Debug)]
pub struct Opened {
    /// The stack to serve, and its tables.
    pub volume: crate::Volume,
    /// The header.
    pub luks: Luks,
    /// The keyslot that opened.
    pub keyslot: u32,
}

/// Loads the header on `meta` (named `path` in logs), with `repair` rewriting a damaged
/// LUKS2 copy from the good one, and checks the version asked for.
pub fn load_checked(
    meta: &dyn BlockDevice,
    path: &str,
    version: Option<LuksVersion>,
    repair: bool,
) -> Result<Luks, LuksError> {
    let luks = Luks::load(meta, repair)?;
    if let Some(v) = version {
        if v != luks.version() {
            return Err(LuksError::WrongVersion { wanted: v.number(), found: luks.version().number() });
        }
    }
    if let Some(k) = luks.repaired {
        log::warn!("{path}: repaired the damaged {} LUKS2 header copy", luks2::copy_name(k));
    }
    if let Some(k) = luks.needs_repair {
        log::warn!(
            "{path}: the {} LUKS2 header copy is damaged (read-only: not repaired)",
            luks2::copy_name(k)
        );
    }
    Ok(luks)
}

/// Unlocks with `passphrase` and assembles the stack (cryptsetup `open --type luks`): the
/// devices of `p` opened through [`crate::storage::open`], then [`crate::open`].
pub fn open(p: &OpenParams, passphrase: &Passphrase) -> Result<Opened, crate::VolumeError> {
    let so = p.open.storage();
    // With a detached header the data device is opened (and locked) before the KDF runs,
    // so a device in use is refused at once.
    let header = match &p.header {
        Some(h) => Some(crate::storage::open(h, &so)?),
        None => None,
    };
    let data = crate::storage::open(&p.device, &so)?;
    let mut once = crate::OnePassphrase::new(passphrase);
    let spec = crate::LuksSpec {
        version: p.version,
        header,
        key_slot: p.key_slot,
        flags: p.flags,
        integrity_no_journal: p.integrity_no_journal,
        integrity_journal: p.integrity_journal,
        kdf_limits: p.kdf_limits,
    };
    let mut volume =
        crate::open_storage(data, crate::Spec::Luks(spec), crate::Keys::passphrase(&mut once), &p.open)?;
    let crate::Unlocked { luks, keyslot } =
        volume.luks.take().ok_or(crate::VolumeError::Stack("a LUKS volume without its header"))?;
    Ok(Opened { volume, luks, keyslot })
}

impl Luks {
    /// The dm-crypt table that activates this volume on `data_device` (`data_size` bytes)
    /// with `vk`. `extra` holds flags from the command line; the header's persistent flags
    /// are added to them.
    pub fn table(
        &self,
        data_device: &str,
        data_size: u64,
        vk: &VolumeKey,
        extra: &CryptOptions,
    ) -> Result<CryptTable, LuksError> {
        self.check_supported()?;
        if self.aead()?.is_some() {
            return Err(LuksError::Unsupported(
                "an authenticated (integrity) segment has no plain dm-crypt table: open it with luks::open"
                    .into(),
            ));
        }
        let seg = self.segment()?;
        let per = u64::from(seg.sector_size);
        let len = match seg.size {
            Some(s) => {
                if seg.offset.saturating_add(s) > data_size {
                    return Err(LuksError::DeviceTooSmall { need: seg.offset + s, have: data_size });
                }
                s
            }
            None => data_size.saturating_sub(seg.offset) / per * per,
        };
        if len == 0 {
            return Err(super::ParamError::NoDataAfterOffset {
                device: data_device.to_string(),
                offset: seg.offset,
            }
            .into());
        }
        let options = CryptOptions {
            sector_size: (seg.sector_size != 512).then_some(seg.sector_size),
            iv_large_sectors: false,
            integrity_aead: None,
            ..extra.with_persistent(&seg.flags)
        };
        Ok(CryptTable {
            len: len / 512,
            cipher: seg.cipher,
            key: Zeroizing::new(vk.as_bytes().to_vec()),
            iv_offset: seg.iv_offset,
            device: data_device.to_owned(),
            offset: seg.offset / 512,
            options,
        })
    }
}
