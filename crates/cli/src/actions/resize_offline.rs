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
}

/// Whether `name` means an image to resize offline: a path, or an existing file.
pub fn is_offline(name: &str) -> bool {
    name.contains('/') || std::path::Path::new(name).is_file()
}

/// Grows image `path` so the volume's data area is `size` sectors.
pub fn resize(path: &str, size: Option<u64>, kind: Option<&str>, o: &OfflineArgs) -> Result<()> {
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
    let (offset, sector_size) = if plain {
        (o.offset.checked_mul(512).context("--offset too large")?, o.sector_size)
    } else {
        let meta = if o.header.is_some() { Some(open_meta(meta_path, false)?) } else { None };
        let dev = meta.as_ref().unwrap_or(&data);
        let luks = Luks::load(&*dev.device, true).map_err(luks_err(meta_path))?;
        luks.check_supported().map_err(luks_err(meta_path))?;
        if luks.aead().map_err(luks_err(meta_path))?.is_some() {
            // cryptsetup's refusal (crypt_resize).
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
    let file =
        std::fs::OpenOptions::new().write(true).open(path).with_context(|| format!("opening {path}"))?;
    let md = file.metadata().with_context(|| format!("reading the size of {path}"))?;
    if !md.is_file() {
        bail!(UsageError(format!(
            "{path} is not an image file: a block device's size is the device's (resize the device, then the running volume)"
        )));
    }
    let have = md.len();
    if new_len < have {
        bail!(UsageError(format!(
            "Shrinking {path} from {} to {size} sectors would cut off its data: refused (shrink the filesystem, \
             then the running volume with `sealdisk resize NAME --size`)",
            have.saturating_sub(offset) / 512
        )));
    }
    file.set_len(new_len).with_context(|| format!("growing {path} to {new_len} bytes"))?;
    file.sync_all().with_context(|| format!("syncing {path}"))?;
    drop(data);
    log::info!("{path}: data area now {size} sectors ({new_len} bytes in all)");
    Ok(())
}
