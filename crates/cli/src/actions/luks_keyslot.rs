//! Keyslot actions: `luksAddKey`, `luksRemoveKey`, `luksChangeKey`, `luksKillSlot`, `erase`.

use anyhow::{bail, Context, Result};
use clap::Args;
use sector_crypto::kdf::Passphrase;
use volume::luks::Luks;

use super::luks::{
    confirm, luks_err, new_passphrase, open_meta, with_passphrase, KdfLimitArgs, KeyArgs, PbkdfArgs,
};
use super::UsageError;

/// Options every keyslot action has.
#[derive(Debug, Args)]
pub struct Common {
    #[command(flatten)]
    pub key: KeyArgs,
    #[command(flatten)]
    pub kdf_limits: KdfLimitArgs,
    /// Detached header file holding the LUKS metadata.
    #[arg(long, value_name = "FILE")]
    pub header: Option<String>,
    /// Do not ask for confirmation.
    #[arg(long = "batch-mode", short = 'q')]
    pub batch_mode: bool,
}

impl Common {
    fn meta_path<'a>(&'a self, device: &'a str) -> &'a str {
        self.header.as_deref().unwrap_or(device)
    }
}

fn load(path: &str) -> Result<(volume::Storage, Luks)> {
    let meta = open_meta(path, false)?;
    let luks = Luks::load(&*meta.device, true).map_err(luks_err(path))?;
    luks.check_supported().map_err(luks_err(path))?;
    Ok((meta, luks))
}

/// Where the new passphrase of `luksAddKey` / `luksChangeKey` comes from.
#[derive(Debug, Args)]
pub struct NewKeyArgs {
    /// Read the new passphrase from FILE.
    #[arg(long, value_name = "FILE")]
    pub new_keyfile: Option<String>,
    /// Skip this many bytes of the new key file.
    #[arg(long, default_value_t = 0)]
    pub new_keyfile_offset: u64,
    /// Read at most this many bytes of the new key file.
    #[arg(long)]
    pub new_keyfile_size: Option<usize>,
}

impl NewKeyArgs {
    /// The new key file: the positional NEW_KEYFILE (after DEVICE), else `--new-keyfile`;
    /// `None` means a prompt. Checked before anything is read: the existing and the new
    /// passphrase cannot both come from stdin.
    fn file<'a>(&'a self, positional: &'a [String], common: &Common) -> Result<Option<&'a str>> {
        let file = positional.get(1).or(self.new_keyfile.as_ref()).map(String::as_str);
        if file == Some("-") && common.key.key_file.as_deref() == Some("-") {
            bail!(UsageError("only one of the passphrases can come from stdin".into()));
        }
        Ok(file)
    }

    /// Reads the new passphrase from `file` (see [`NewKeyArgs::file`]) or a prompt.
    fn read(&self, file: Option<&str>, prompt: &str) -> Result<Passphrase> {
        new_passphrase(file, self.new_keyfile_offset, self.new_keyfile_size, prompt)
    }
}

/// Arguments of `luksAddKey DEVICE [NEW_KEYFILE]`.
#[derive(Debug, Args)]
pub struct AddKeyArgs {
    #[command(flatten)]
    pub common: Common,
    #[command(flatten)]
    pub pbkdf: PbkdfArgs,
    /// Keyslot for the new passphrase (default: the first free one).
    #[arg(long, short = 'S')]
    pub key_slot: Option<u32>,
    #[command(flatten)]
    pub new_key: NewKeyArgs,
    /// Authorize with the volume key in FILE instead of an existing passphrase.
    #[arg(long, alias = "master-key-file", value_name = "FILE")]
    pub volume_key_file: Option<String>,
    /// LUKS2: add a keyslot holding a new random key of --key-size bits that is not the
    /// volume key (an unbound key); no existing passphrase is needed.
    #[arg(long, requires = "key_size")]
    pub unbound: bool,
    /// With --unbound: the key size in bits.
    #[arg(long, short = 's', value_name = "BITS")]
    pub key_size: Option<u32>,
    /// DEVICE, then optionally the new key file.
    #[arg(value_name = "DEVICE [NEW_KEYFILE]", required = true, num_args = 1..=2)]
    pub positional: Vec<String>,
}

/// Runs `luksAddKey`.
pub fn add_key(a: AddKeyArgs) -> Result<()> {
    let device = &a.positional[0];
    let new_file = a.new_key.file(&a.positional, &a.common)?;
    let path = a.common.meta_path(device);
    let (meta, mut luks) = load(path)?;
    if a.unbound {
        return add_unbound(&a, path, &meta, &mut luks, new_file);
    }
    let vk = match &a.volume_key_file {
        Some(f) => {
            let src = crate::keys::KeySource { path: f.clone(), offset: 0, size: None };
            let vk = crate::keys::read_key(&src, luks.key_bytes())?;
            luks.verify_volume_key(&vk).map_err(luks_err(path))?;
            vk
        }
        None => {
            with_passphrase(&a.common.key, "Enter any existing passphrase: ", |old| {
                luks.unlock_with(&*meta.device, old, None, &a.common.kdf_limits.limits())
                    .map_err(luks_err(path))
            })?
            .1
        }
    };
    let new = a.new_key.read(new_file, "Enter new passphrase for key slot: ")?;
    let slot = luks
        .add_keyslot(&*meta.device, &vk, &new, a.key_slot, &a.pbkdf.params()?)
        .map_err(luks_err(path))
        .with_context(|| format!("adding a keyslot to {path}"))?;
    log::info!("Key slot {slot} created.");
    Ok(())
}

/// Arguments of `luksRemoveKey DEVICE [KEYFILE]`.
#[derive(Debug, Args)]
pub struct RemoveKeyArgs {
    #[command(flatten)]
    pub common: Common,
    /// DEVICE, then optionally a key file with the passphrase to remove.
    #[arg(value_name = "DEVICE [KEYFILE]", required = true, num_args = 1..=2)]
    pub positional: Vec<String>,
}

/// Runs `luksRemoveKey`: the keyslot that the passphrase opens is destroyed.
pub fn remove_key(a: RemoveKeyArgs) -> Result<()> {
    let device = &a.positional[0];
    let path = a.common.meta_path(device);
    let (meta, mut luks) = load(path)?;
    let limits = a.common.kdf_limits.limits();
    let (slot, _) = match a.positional.get(1) {
        Some(f) => {
            let pass = super::luks::read_keyfile(f, a.common.key.keyfile_offset, a.common.key.keyfile_size)?;
            luks.unlock_with(&*meta.device, &pass, None, &limits).map_err(luks_err(path))?
        }
        None => with_passphrase(&a.common.key, "Enter passphrase to be deleted: ", |pass| {
            luks.unlock_with(&*meta.device, pass, None, &limits).map_err(luks_err(path))
        })?,
    };
    if luks.active_keyslots().len() == 1 {
        confirm(
            "This is the last keyslot. Device will become unusable after purging this key.",
            a.common.batch_mode,
        )?;
    }
    luks.kill_keyslot(&*meta.device, slot).map_err(luks_err(path))?;
    log::info!("Key slot {slot} removed.");
    Ok(())
}

/// Arguments of `luksChangeKey DEVICE [NEW_KEYFILE]`.
#[derive(Debug, Args)]
pub struct ChangeKeyArgs {
    #[command(flatten)]
    pub common: Common,
    #[command(flatten)]
    pub pbkdf: PbkdfArgs,
    /// Only try this keyslot.
    #[arg(long, short = 'S')]
    pub key_slot: Option<u32>,
    #[command(flatten)]
    pub new_key: NewKeyArgs,
    /// DEVICE, then optionally the new key file.
    #[arg(value_name = "DEVICE [NEW_KEYFILE]", required = true, num_args = 1..=2)]
    pub positional: Vec<String>,
}

/// Runs `luksChangeKey`.
pub fn change_key(a: ChangeKeyArgs) -> Result<()> {
    let device = &a.positional[0];
    let new_file = a.new_key.file(&a.positional, &a.common)?;
    let path = a.common.meta_path(device);
    let (meta, mut luks) = load(path)?;
    let (slot, vk) = with_passphrase(&a.common.key, "Enter passphrase to be changed: ", |old| {
        luks.unlock_with(&*meta.device, old, a.key_slot, &a.common.kdf_limits.limits())
            .map_err(luks_err(path))
    })?;
    let new = a.new_key.read(new_file, "Enter new passphrase: ")?;
    let new_slot =
        luks.change_keyslot(&*meta.device, slot, &vk, &new, &a.pbkdf.params()?).map_err(luks_err(path))?;
    log::info!("Key slot {slot} changed (now key slot {new_slot}).");
    Ok(())
}

/// Arguments of `luksKillSlot DEVICE SLOT`.
#[derive(Debug, Args)]
pub struct KillSlotArgs {
    #[command(flatten)]
    pub common: Common,
    /// The device.
    pub device: String,
    /// The keyslot to destroy.
    pub slot: u32,
}

/// Runs `luksKillSlot`: unless in batch mode, a passphrase of another keyslot must be given.
pub fn kill_slot(a: KillSlotArgs) -> Result<()> {
    let path = a.common.meta_path(&a.device);
    let (meta, mut luks) = load(path)?;
    if !luks.active_keyslots().contains(&a.slot) {
        return Err(luks_err(path)(volume::luks::LuksError::KeyslotInactive(a.slot)));
    }
    let last = luks.active_keyslots().len() == 1;
    if last {
        confirm(
            "This is the last keyslot. Device will become unusable after purging this key.",
            a.common.batch_mode,
        )?;
    }
    if !last && (a.common.key.key_file.is_some() || !a.common.batch_mode) {
        let others: Vec<u32> = luks.active_keyslots().into_iter().filter(|&s| s != a.slot).collect();
        with_passphrase(&a.common.key, "Enter any remaining passphrase: ", |p| {
            let ok = others
                .iter()
                .any(|&s| luks.unlock_with(&*meta.device, p, Some(s), &a.common.kdf_limits.limits()).is_ok());
            if ok {
                Ok(())
            } else {
                Err(luks_err(path)(volume::luks::LuksError::WrongPassphrase))
            }
        })?;
    }
    luks.kill_keyslot(&*meta.device, a.slot).map_err(luks_err(path))?;
    log::info!("Key slot {} removed.", a.slot);
    Ok(())
}

/// Arguments of `erase DEVICE`.
#[derive(Debug, Args)]
pub struct EraseArgs {
    #[command(flatten)]
    pub common: Common,
    /// The device.
    pub device: String,
}

/// Runs `erase`: every keyslot is wiped.
pub fn erase(a: EraseArgs) -> Result<()> {
    let path = a.common.meta_path(&a.device);
    let meta = open_meta(path, false)?;
    let mut luks = Luks::load(&*meta.device, true).map_err(luks_err(path))?;
    confirm(
        &format!("This operation will erase all keyslots on device {path}.\nDevice will become unusable after this operation."),
        a.common.batch_mode,
    )?;
    luks.erase(&*meta.device).map_err(luks_err(path))?;
    Ok(())
}

/// `luksAddKey --unbound -s BITS`: a keyslot for a fresh random key that is not the volume
/// key (cryptsetup needs no existing passphrase for it either).
fn add_unbound(
    a: &AddKeyArgs,
    path: &str,
    meta: &volume::Storage,
    luks: &mut Luks,
    new_file: Option<&str>,
) -> Result<()> {
    let bits = a.key_size.unwrap_or(0);
    if bits == 0 || !bits.is_multiple_of(8) || bits > 8 * 512 {
        bail!(UsageError(format!(
            "Invalid key size {bits} for --unbound (a multiple of 8 bits, at most 4096)."
        )));
    }
    if luks.version() != volume::luks::LuksVersion::V2 {
        bail!(UsageError(format!("Device {path} is not a valid LUKS2 device.")));
    }
    let new = a.new_key.read(new_file, "Enter new passphrase for key slot: ")?;
    let mut key = sector_crypto::secure::SecretBuf::zeroed((bits / 8) as usize);
    sector_crypto::kdf::random_bytes(&mut key).context("generating the unbound key")?;
    let key = sector_crypto::VolumeKey::from_secret(key);
    let slot = luks
        .add_unbound_keyslot(&*meta.device, &key, &new, a.key_slot, &a.pbkdf.params()?)
        .map_err(luks_err(path))
        .with_context(|| format!("adding an unbound keyslot to {path}"))?;
    log::info!("Key slot {slot} created.");
    Ok(())
}
