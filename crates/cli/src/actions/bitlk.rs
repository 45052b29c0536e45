//! BitLocker, as cryptsetup's `--type bitlk`: `bitlkDump DEVICE` (with `--dump-volume-key`)
//! and `open --type bitlk` / `bitlkOpen` (served like every volume). The passphrase is a
//! password or a recovery password; `--key-file` is a .BEK startup key file (or, if it is
//! not one, a passphrase file). Everything else is `volume::bitlk`.

use std::io::Write;

use anyhow::{bail, Context, Result};
use clap::Args;
use sector_crypto::kdf::Passphrase;
use volume::bitlk::{self, BitlkKey};
use volume::{OpenOptions, Spec, VolumeError};
use zeroize::Zeroizing;

use super::luks::{confirm, KeyArgs};
use super::open::{masked, OpenArgs, OpenTarget};
use super::UsageError;
use crate::control::server::Rebuild;
use crate::serve::serve;

/// The largest key file read (a .BEK file is a few hundred bytes; a passphrase 512).
const KEY_FILE_MAX: usize = 64 << 10;

/// Arguments of `bitlkDump`.
#[derive(Debug, Args)]
pub struct DumpArgs {
    #[command(flatten)]
    pub key: KeyArgs,
    /// Also print the volume key (needs the passphrase, recovery password or .BEK key file).
    #[arg(long, alias = "dump-master-key")]
    pub dump_volume_key: bool,
    /// Do not ask for confirmation.
    #[arg(long = "batch-mode", short = 'q')]
    pub batch_mode: bool,
    /// The device.
    pub device: String,
}

fn load(device: &str) -> Result<(volume::Storage, bitlk::Bitlk)> {
    super::ensure_device(device)?;
    let opts = volume::StorageOptions { read_only: true, ..Default::default() };
    let storage = volume::storage::open(device, &opts)?;
    let b = bitlk::load(&*storage.device)
        .map_err(|source| VolumeError::Bitlk { path: device.to_owned(), source })?;
    Ok((storage, b))
}

/// The key from `--key-file` (raw bytes: a .BEK file or a passphrase) or the prompt.
fn key(k: &KeyArgs, device: &str) -> Result<BitlkKey> {
    if let Some(f) = &k.key_file {
        let limit = k.keyfile_size.unwrap_or(KEY_FILE_MAX);
        let bytes = crate::keys::read_key_file(f, k.keyfile_offset, limit)
            .with_context(|| format!("reading key file {f}"))?;
        return Ok(BitlkKey::KeyFile(Zeroizing::new(bytes.to_vec())));
    }
    let prompt = format!("Enter passphrase for {device}: ");
    let pass = if std::io::IsTerminal::is_terminal(&std::io::stdin()) {
        crate::keys::prompt_tty(&prompt, 512)?
    } else {
        let stdin = std::io::stdin();
        crate::keys::read_secret(std::os::fd::AsFd::as_fd(&stdin), 512, true)
            .context("reading the passphrase")?
    };
    if pass.is_empty() {
        bail!(UsageError("Nothing to read on input.".into()));
    }
    Ok(BitlkKey::Passphrase(Passphrase::from_secret(pass)))
}

/// Runs `bitlkDump`.
pub fn dump(a: DumpArgs) -> Result<()> {
    let (_storage, b) = load(&a.device)?;
    let text = if a.dump_volume_key {
        confirm(
            "The header dump with volume key is sensitive information\n\
             that allows access to encrypted partition without a passphrase.\n\
             This dump should be stored encrypted in a safe place.",
            a.batch_mode,
        )?;
        let k = key(&a.key, &a.device)?;
        let vk = b.unlock(&k).map_err(|source| VolumeError::Bitlk { path: a.device.clone(), source })?;
        b.dump_volume_key(&a.device, &vk)
    } else {
        Zeroizing::new(b.dump(&a.device))
    };
    std::io::stdout().lock().write_all(text.as_bytes()).context("writing the dump")?;
    Ok(())
}

/// Runs `open --type bitlk` (and `bitlkOpen`).
pub fn open(a: &OpenArgs, opts: &OpenOptions) -> Result<()> {
    let OpenTarget { device, name, listener } = a.target()?;
    let storage = volume::storage::open(&device, &opts.storage())?;
    let keys = a.key_args();
    // The metadata first, as cryptsetup: a device that is not BitLocker is refused before a
    // passphrase is asked for.
    bitlk::load(&*storage.device).map_err(|source| VolumeError::Bitlk { path: device.clone(), source })?;
    let k = key(&keys, &device)?;
    let Some(listener) = listener else {
        // --test-passphrase: unlock only.
        bitlk::load(&*storage.device)
            .and_then(|b| b.unlock(&k))
            .map_err(|source| VolumeError::Bitlk { path: device.clone(), source })?;
        return Ok(());
    };
    let vol = volume::open_storage(storage.clone(), Spec::Bitlk, k.into(), opts)
        .with_context(|| format!("opening {device} as BITLK"))?;
    if a.print_table {
        if let Some(t) = vol.crypt_table() {
            if a.showkeys {
                println!("{t}");
            } else {
                println!("{}", masked(t));
            }
        }
    }
    let claim = crate::control::claim(&name.unwrap_or_default())?;
    serve(claim, vol, Rebuild::on(storage, *opts), listener, &a.serve, a.readonly)
}
