//! Header actions: `luksDump`, `luksUUID`, `isLuks`, `luksHeaderBackup`, `luksHeaderRestore`.

use std::io::Write;

use anyhow::{bail, Context, Result};
use clap::Args;
use volume::luks::{self, Luks, LuksVersion};

use super::luks::{confirm, luks_err, open_meta, with_passphrase, KdfLimitArgs, KeyArgs};
use super::{Quiet, UsageError};
use crate::exit;

/// Arguments of `luksDump DEVICE`.
#[derive(Debug, Args)]
pub struct DumpArgs {
    #[command(flatten)]
    pub key: KeyArgs,
    #[command(flatten)]
    pub kdf_limits: KdfLimitArgs,
    /// Also print the volume key (needs a passphrase; asks for confirmation unless -q).
    #[arg(long, alias = "dump-master-key")]
    pub dump_volume_key: bool,
    /// With --dump-volume-key: write the key to FILE instead of printing it.
    #[arg(long, alias = "master-key-file", value_name = "FILE")]
    pub volume_key_file: Option<String>,
    /// Only try this keyslot.
    #[arg(long, short = 'S')]
    pub key_slot: Option<u32>,
    /// Detached header file.
    #[arg(long, value_name = "FILE")]
    pub header: Option<String>,
    /// Do not ask for confirmation.
    #[arg(long = "batch-mode", short = 'q')]
    pub batch_mode: bool,
    /// LUKS2: print the JSON metadata (cryptsetup's layout) instead of the dump.
    #[arg(long, conflicts_with_all = ["dump_volume_key", "unbound"])]
    pub dump_json_metadata: bool,
    /// LUKS2: print the unbound key of --key-slot (needs its passphrase).
    #[arg(long, conflicts_with = "dump_volume_key")]
    pub unbound: bool,
    /// The device.
    pub device: String,
}

/// Runs `luksDump`.
pub fn dump(a: DumpArgs) -> Result<()> {
    let path = a.header.as_deref().unwrap_or(&a.device);
    let meta = open_meta(path, true)?;
    let luks = Luks::load(&*meta.device, false).map_err(luks_err(path))?;
    let name = a.device.clone();
    if a.dump_json_metadata {
        let Some(json) = luks::dump_json_metadata(&luks, &*meta.device) else {
            bail!(UsageError("Dump operation is not supported for this device type.".into()));
        };
        std::io::stdout().lock().write_all(json.as_bytes()).context("writing the dump")?;
        return Ok(());
    }
    let text = if a.unbound {
        let Some(slot) = a.key_slot else {
            bail!(UsageError("Keyslot specification is required.".into()));
        };
        if !luks.is_unbound(slot) {
            bail!(UsageError(format!("Keyslot {slot} does not contain unbound key.")));
        }
        let (_, key) = with_passphrase(&a.key, &format!("Enter passphrase for {}: ", a.device), |pass| {
            luks.unlock_any_keyslot(&*meta.device, pass, Some(slot), &a.kdf_limits.limits())
                .map_err(luks_err(path))
        })?;
        if let Some(f) = &a.volume_key_file {
            write_private(f, key.as_bytes()).with_context(|| format!("writing the unbound key to {f}"))?;
            log::info!("Unbound key of keyslot {slot} stored to {f}.");
            return Ok(());
        }
        zeroize::Zeroizing::new(luks::dump_unbound_key(&luks, &name, slot, &key))
    } else if a.dump_volume_key {
        confirm(
            "The header dump with volume key is sensitive information\n\
             that allows access to encrypted partition without a passphrase.\n\
             This dump should be stored encrypted in a safe place.",
            a.batch_mode,
        )?;
        let (slot, vk) = with_passphrase(&a.key, &format!("Enter passphrase for {}: ", a.device), |pass| {
            luks.unlock_with(&*meta.device, pass, a.key_slot, &a.kdf_limits.limits()).map_err(luks_err(path))
        })?;
        log::info!("Key slot {slot} unlocked.");
        if let Some(f) = &a.volume_key_file {
            write_private(f, vk.as_bytes()).with_context(|| format!("writing the volume key to {f}"))?;
        }
        zeroize::Zeroizing::new(luks::dump_volume_key(&luks, &name, &vk, a.volume_key_file.as_deref()))
    } else {
        zeroize::Zeroizing::new(luks::dump(&luks, &name))
    };
    let mut out = std::io::stdout().lock();
    out.write_all(text.as_bytes()).context("writing the dump")?;
    Ok(())
}

/// Creates `path` (mode 0600, must not exist) holding `data`.
fn write_private(path: &str, data: &[u8]) -> Result<()> {
    use std::os::unix::fs::OpenOptionsExt;
    let mut f = std::fs::OpenOptions::new().write(true).create_new(true).mode(0o600).open(path)?;
    f.write_all(data)?;
    f.sync_all()?;
    Ok(())
}

/// Arguments of `luksUUID DEVICE`.
#[derive(Debug, Args)]
pub struct UuidArgs {
    /// Set this UUID instead of printing it.
    #[arg(long)]
    pub uuid: Option<String>,
    /// Detached header file.
    #[arg(long, value_name = "FILE")]
    pub header: Option<String>,
    /// Do not ask for confirmation.
    #[arg(long = "batch-mode", short = 'q')]
    pub batch_mode: bool,
    /// The device.
    pub device: String,
}

/// Runs `luksUUID`: prints the UUID, or sets `--uuid`.
pub fn uuid(a: UuidArgs) -> Result<()> {
    let path = a.header.as_deref().unwrap_or(&a.device);
    let Some(new) = &a.uuid else {
        let meta = open_meta(path, true)?;
        let luks = Luks::load(&*meta.device, false).map_err(luks_err(path))?;
        println!("{}", luks.uuid());
        return Ok(());
    };
    let meta = open_meta(path, false)?;
    let mut luks = Luks::load(&*meta.device, true).map_err(luks_err(path))?;
    confirm(&format!("Do you really want to change UUID of device {path}?"), a.batch_mode)?;
    luks.set_uuid(&*meta.device, Some(new)).map_err(luks_err(path))?;
    Ok(())
}

/// Arguments of `isLuks DEVICE`.
#[derive(Debug, Args)]
pub struct IsLuksArgs {
    /// luks1 or luks2: also check the version.
    #[arg(long = "type", short = 'M')]
    pub kind: Option<String>,
    /// Detached header file.
    #[arg(long, value_name = "FILE")]
    pub header: Option<String>,
    /// The device.
    pub device: String,
}

/// Runs `isLuks`: exit 0 for a LUKS device (of the `--type`), else exit 1.
pub fn is_luks(a: IsLuksArgs) -> Result<()> {
    let path = a.header.as_deref().unwrap_or(&a.device);
    let meta = open_meta(path, true)?;
    let want = match a.kind.as_deref() {
        None | Some("luks") => None,
        Some("luks1") => Some(LuksVersion::V1),
        Some("luks2") => Some(LuksVersion::V2),
        Some(o) => bail!(UsageError(format!("isLuks --type {o:?}: use luks, luks1 or luks2"))),
    };
    // Silent on failure, as cryptsetup (exit 1); the reason is logged with -v.
    let not_luks = |why: String| -> Result<()> {
        log::info!("{why}");
        Err(Quiet(exit::BAD_ARGS).into())
    };
    match (luks::probe(&*meta.device), want) {
        (Ok(Some(f)), Some(w)) if f != w => {
            not_luks(format!("Device {path} is not a valid LUKS{} device.", w.number()))
        }
        (Ok(Some(_)), _) => Ok(()),
        (Ok(None), _) => not_luks(format!("Device {path} is not a valid LUKS device.")),
        (Err(e), _) => not_luks(format!("Device {path} is not a valid LUKS device: {e}")),
    }
}

/// Arguments of `luksHeaderBackup` / `luksHeaderRestore`.
#[derive(Debug, Args)]
pub struct BackupArgs {
    /// The backup file.
    #[arg(long, value_name = "FILE", required = true)]
    pub header_backup_file: String,
    /// Detached header file.
    #[arg(long, value_name = "FILE")]
    pub header: Option<String>,
    /// Do not ask for confirmation.
    #[arg(long = "batch-mode", short = 'q')]
    pub batch_mode: bool,
    /// The device.
    pub device: String,
}

/// Runs `luksHeaderBackup`: the header and keyslot areas, exactly, to a new file.
pub fn backup(a: BackupArgs) -> Result<()> {
    let path = a.header.as_deref().unwrap_or(&a.device);
    let meta = open_meta(path, true)?;
    let luks = Luks::load(&*meta.device, false).map_err(luks_err(path))?;
    let bytes = luks.backup(&*meta.device).map_err(luks_err(path))?;
    let f = &a.header_backup_file;
    if std::path::Path::new(f).exists() {
        bail!(UsageError(format!("Requested header backup file {f} already exists.")));
    }
    use std::os::unix::fs::OpenOptionsExt;
    let mut out = std::fs::OpenOptions::new()
        .write(true)
        .create_new(true)
        .mode(0o400)
        .open(f)
        .with_context(|| format!("Cannot create header backup file {f}."))?;
    out.write_all(&bytes).with_context(|| format!("Cannot write header backup file {f}."))?;
    out.sync_all().with_context(|| format!("syncing {f}"))?;
    Ok(())
}

/// Runs `luksHeaderRestore`: the backup is validated before anything is written.
pub fn restore(a: BackupArgs) -> Result<()> {
    let path = a.header.as_deref().unwrap_or(&a.device);
    let f = &a.header_backup_file;
    let image =
        zeroize::Zeroizing::new(std::fs::read(f).with_context(|| format!("reading header backup file {f}"))?);
    let backup = Luks::load_image(&image).map_err(luks_err(f)).context("checking the header backup")?;
    let meta = open_meta(path, false)?;
    if let Ok(Some(_)) = luks::probe(&*meta.device) {
        confirm(
            &format!(
                "Device {path} already contains LUKS{} header. Replacing header will destroy existing keyslots.",
                backup.version().number()
            ),
            a.batch_mode,
        )?;
    }
    Luks::restore(&*meta.device, &image).map_err(luks_err(path))?;
    Ok(())
}
