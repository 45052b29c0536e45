//! FileVault2 (cryptsetup's `--type fvault2`): `fvault2Dump DEVICE` and `open --type
//! fvault2 DEVICE NAME` (also `fvault2Open`, cryptsetup's old syntax), read-only. The
//! metadata is read and the key unwrapped by `volume::fvault2`; the volume is assembled by
//! `volume::open` with `volume::Spec::Fvault2`.

use std::io::Write;

use anyhow::{bail, Context, Result};
use clap::Args;
use volume::{Fvault2Spec, OpenOptions, VolumeError};

use super::luks::{open_meta, Passphrases};
use super::open::{masked, OpenArgs, OpenTarget};
use super::UsageError;
use crate::control::server::Rebuild;
use crate::serve::serve;

/// Arguments of `fvault2Dump DEVICE`.
#[derive(Debug, Args)]
pub struct DumpArgs {
    /// The device.
    pub device: String,
}

/// Runs `fvault2Dump`: the header as cryptsetup prints it. No passphrase is needed.
pub fn dump(a: DumpArgs) -> Result<()> {
    let meta = open_meta(&a.device, true)?;
    let text = volume::fvault2::dump(&*meta.device, &a.device)
        .map_err(|source| VolumeError::Fvault2 { path: a.device.clone(), source })?;
    std::io::stdout().lock().write_all(text.as_bytes()).context("writing the dump")?;
    Ok(())
}

/// Runs `open --type fvault2` (and `open` of a device the probe found FileVault2 on).
pub fn open(a: &OpenArgs, opts: &OpenOptions) -> Result<()> {
    if a.header.is_some() || a.key_slot.is_some() {
        bail!(UsageError("--header and --key-slot are not supported for FVAULT2 devices".into()));
    }
    let OpenTarget { device, name, listener } = a.target()?;
    if !a.readonly {
        log::info!("FVAULT2 devices are opened read-only.");
    }
    // Read-only whatever was asked (the storage is locked shared, the export is read-only).
    let opts = OpenOptions { read_only: true, ..*opts };
    let storage = volume::storage::open(&device, &opts.storage())?;
    let keys = a.key_args();
    let mut passphrases = Passphrases::new(&keys, format!("Enter passphrase for {device}: "));
    let spec = Fvault2Spec { kdf_limits: a.kdf_limits.limits() };
    let Some(listener) = listener else {
        volume::unlock_fvault2(&spec, &mut passphrases, &storage)?;
        return Ok(());
    };
    let keys = volume::Keys::passphrase(&mut passphrases);
    let vol = volume::open_storage(storage.clone(), volume::Spec::Fvault2(spec), keys, &opts)
        .with_context(|| format!("opening {device} as FVAULT2"))?;
    if let (true, Some(t)) = (a.print_table, vol.crypt_table()) {
        // Straight to stdout: no String copy of the key.
        if a.showkeys {
            println!("{t}");
        } else {
            println!("{}", masked(t));
        }
    }
    let claim = crate::control::claim(&name.unwrap_or_default())?;
    serve(claim, vol, Rebuild::on(storage, opts), listener, &a.serve, true)
}
