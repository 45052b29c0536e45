//! `resize DEVICE --size SECTORS` for a volume that is not running (DEVICE is an image
//! path): the image file grows so the volume's data area holds SECTORS 512-byte sectors
//! after the data offset (LUKS: the header's; plain: `--offset`). A LUKS2 segment that is
//! `dynamic` (every segment luksFormat writes) then spans the new size at the next open;
//! no header changes. The running-volume `resize NAME` is the control plane's.
//!
//! Refused, before anything is changed: shrinking (cryptsetup never truncates a device;
//! the data past the new end would be lost), a size not a multiple of the encryption
//! sector size, a block device (its size is the device's), a volume being served (the
//! image is locked: exit 5), a LUKS header that does not load.
//!
//! An integrity image (`integrity format`; found by its superblock, or `--type integrity`)
//! grows through `volume::integrity::grow_image`: SECTORS is the size it then provides
//! (`--size`, or `--device-size` in bytes), the file the smallest that does; the new area is
//! recalculated, or wiped with `--wipe`. `-I` and the key files are `integrity open`'s.

use anyhow::{bail, Context, Result};
use clap::Args;
use volume::luks::Luks;

use super::luks::{luks_err, open_meta};
use super::UsageError;

/// `resize`'s options for an image that is not running.
#[derive(Debug, Clone, Args)]
pub struct OfflineArgs {
    /// Offline, LUKS: detached header file.
    #[arg(long, value_name = "FILE")]
    pub header: Option<String>,
    /// Offline, --type plain: start of the data in 512-byte sectors.
    #[arg(long, short = 'o', default_value_t = 0, value_name = "SECTORS")]
    pub offset: u64,
    /// Offline, --type plain: encryption sector size (the new size must be a multiple).
    #[arg(long, default_value_t = 512)]
    pub sector_size: u32,
    /// The new size in bytes instead of --size (a multiple of 512).
    #[arg(long, value_name = "BYTES")]
    pub device_size: Option<u64>,
    /// Integrity volume: wipe the new area (zeroes with valid tags) instead of recalculating
    /// its tags (integritysetup's `resize --wipe`; the one way for a keyed hash).
    #[arg(long)]
    pub wipe: bool,
    /// Offline, integrity image: its data integrity algorithm (as `integrity open -I`).
    #[arg(short = 'I', long, value_name = "ALG")]
    pub integrity: Option<String>,
    /// Offline, integrity image: the integrity key file.
    #[arg(long, value_name = "FILE")]
    pub integrity_key_file: Option<String>,
    /// Offline, integrity image: the journal integrity algorithm.
    #[arg(long, value_name = "ALG")]
    pub journal_integrity: Option<String>,
    /// Offline, integrity image: the journal integrity key file.
    #[arg(long, value_name = "FILE")]
    pub journal_integrity_key_file: Option<String>,
}

/// `--device-size BYTES` in 512-byte sectors.
pub fn device_size_sectors(bytes: u64) -> Result<u64> {
    if bytes == 0 || !bytes.is_multiple_of(512) {
        bail!(UsageError(format!("--device-size {bytes} is not a positive multiple of 512 bytes")));
    }
    Ok(bytes / 512)
}

/// Grows the integrity image `path` (its storage `data`, locked) to `size` sectors.
fn integrity(path: &str, data: volume::Storage, size: u64, o: &OfflineArgs) -> Result<()> {
    use volume::integrity::{GrowError, IntegrityParams};
    if data.kind != volume::StorageKind::File {
        bail!(UsageError(format!(
            "{path} is not an image file: a block device's size is the device's (resize the device, then the running volume)"
        )));
    }
    let alg = o.integrity.clone().unwrap_or_else(|| "crc32c".into());
    let key = match &o.integrity_key_file {
        Some(f) => Some(super::integrity::read_key(f, None)?),
        None if alg.starts_with("hmac") => bail!(UsageError(format!("{alg} needs --integrity-key-file"))),
        None => None,
    };
    let journal_integrity_key = match (&o.journal_integrity, &o.journal_integrity_key_file) {
        (Some(_), Some(f)) => Some(super::integrity::read_key(f, None)?),
        (Some(a), None) if a.starts_with("hmac") => {
            bail!(UsageError(format!("{a} needs --journal-integrity-key-file")))
        }
        (None, Some(_)) => bail!(UsageError("--journal-integrity-key-file needs --journal-integrity".into())),
        _ => None,
    };
    let p = IntegrityParams {
        integrity: alg,
        key,
        journal_integrity: o.journal_integrity.clone(),
        journal_integrity_key,
        lock: true,
        ..IntegrityParams::default()
    };
    let r = volume::integrity::grow_image(data, &p, size, o.wipe).map_err(|e| match e {
        e @ (GrowError::Shrink { .. } | GrowError::TooLarge { .. }) => {
            anyhow::Error::new(UsageError(e.to_string()))
        }
        GrowError::Volume(volume::integrity::IntegrityVolumeError::Target {
            source: e @ targets::integrity::IntegrityError::RecalculateRefused,
            ..
        }) => anyhow::Error::new(UsageError(e.to_string())),
        e => anyhow::Error::new(e),
    })?;
    log::info!(
        "{path}: integrity volume grown from {} to {} sectors (new area {})",
        r.old_sectors,
        r.new_sectors,
        if r.wiped { "wiped" } else { "recalculated" }
    );
    Ok(())
}

/// Whether `name` means an image to resize offline: a path, or an existing file.
pub fn is_offline(name: &str) -> bool {
    name.contains('/') || std::path::Path::new(name).is_file()
}

/// Grows image `path` so the volume's data area is `size` sectors.
pub fn resize(path: &str, size: Option<u64>, kind: Option<&str>, o: &OfflineArgs) -> Result<()> {
    let size = match (size, o.device_size) {
        (Some(_), Some(_)) => bail!(UsageError("--size and --device-size are mutually exclusive".into())),
        (s, None) => s,
        (None, Some(b)) => Some(device_size_sectors(b)?),
    };
    let Some(size) = size else {
        bail!(UsageError("resize of an image that is not running needs --size SECTORS".into()));
    };
    if size == 0 {
        bail!(UsageError("--size 0 means the whole device: give the new size in sectors".into()));
    }
    super::ensure_device(path)?;
    let meta_path = o.header.as_deref().unwrap_or(path);
    let plain = kind == Some("plain");
    // The image (and a detached header) locked exclusively: a served volume is refused.
    let data = open_meta(path, false)?;
    let integrity_image = match kind {
        Some("integrity") => true,
        None if o.header.is_none() => volume::integrity::probe(&*data.device).unwrap_or(false),
        _ => false,
    };
    if integrity_image {
        return integrity(path, data, size, o);
    }
    if o.wipe || o.integrity.is_some() {
        bail!(UsageError("--wipe and -I apply to integrity volumes only".into()));
    }
    let (offset, sector_size) = if plain {
        (o.offset.checked_mul(512).context("--offset too large")?, o.sector_size)
    } else {
        let meta = if o.header.is_some() { Some(open_meta(meta_path, false)?) } else { None };
        let dev = meta.as_ref().unwrap_or(&data);
        let luks = Luks::load(&*dev.device, true).map_err(luks_err(meta_path))?;
        luks.check_supported().map_err(luks_err(meta_path))?;
        if luks.aead().map_err(luks_err(meta_path))?.is_some() {
            // cryptsetup 2.8's text (crypt_resize); 2.6.1 refuses the running volume with
            // "Unsupported parameters on device NAME." (the control plane's answer).
            bail!(UsageError("Resize of LUKS2 device with integrity protection is not supported.".into()));
        }
        let seg = luks.segment().map_err(luks_err(meta_path))?;
        if seg.size.is_some() {
            bail!(UsageError("resize of a LUKS2 segment of fixed size is not supported".into()));
        }
        (seg.offset, seg.sector_size)
    };
    if !(size * 512).is_multiple_of(u64::from(sector_size)) {
        bail!(UsageError("Device size is not aligned to requested sector size.".into()));
    }
    let new_len = size.checked_mul(512).and_then(|b| b.checked_add(offset)).context("--size too large")?;
    if data.kind != volume::StorageKind::File {
        bail!(UsageError(format!(
            "{path} is not an image file: a block device's size is the device's (resize the device, then the running volume)"
        )));
    }
    let have = data.size();
    if new_len < have {
        bail!(UsageError(format!(
            "Shrinking {path} from {} to {size} sectors would cut off its data: refused (shrink the filesystem, \
             then the running volume with `sealdisk resize NAME --size`)",
            have.saturating_sub(offset) / 512
        )));
    }
    data.grow(new_len).with_context(|| format!("growing {path} to {new_len} bytes"))?;
    drop(data);
    log::info!("{path}: data area now {size} sectors ({new_len} bytes in all)");
    Ok(())
}
