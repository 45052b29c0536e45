//! `repair DEVICE`: cryptsetup's repair of a LUKS header, then of a reencryption a crash
//! interrupted mid-hotzone.
//!
//! As cryptsetup 2.6 (`action_luksRepair`): the header is repaired first (a damaged or
//! stale LUKS2 copy rewritten from the good one; a LUKS1 header's damaged disabled
//! keyslots reset), then, for LUKS2, a hotzone left in reencryption is recovered with the
//! passphrase, which cryptsetup's `reencrypt` asks for before it resumes ("Device requires
//! reencryption recovery. Run repair first."). sealdisk's own runs and opens recover such
//! a hotzone by themselves; `repair` does only that recovery and leaves the rest of the run
//! to `reencrypt --resume-only` in either tool.

use anyhow::{bail, Result};
use clap::Args;
use volume::luks::{self, reencrypt, Luks, LuksVersion};

use super::luks::{confirm, luks_err, open_meta, with_passphrase, KdfLimitArgs, KeyArgs};
use super::UsageError;

/// Arguments of `repair DEVICE`.
#[derive(Debug, Args)]
pub struct RepairArgs {
    #[command(flatten)]
    pub key: KeyArgs,
    #[command(flatten)]
    pub kdf_limits: KdfLimitArgs,
    /// luks, luks1 or luks2: only repair a header of this type.
    #[arg(long = "type", short = 'M')]
    pub kind: Option<String>,
    /// The keyslot whose passphrase is given (reencryption recovery).
    #[arg(long, short = 'S')]
    pub key_slot: Option<u32>,
    /// Detached header file (the device then holds the data only).
    #[arg(long, value_name = "FILE")]
    pub header: Option<String>,
    /// Do not ask for confirmation.
    #[arg(long = "batch-mode", short = 'q')]
    pub batch_mode: bool,
    /// The device.
    pub device: String,
}

/// Runs `repair`.
pub fn run(a: RepairArgs) -> Result<()> {
    let want = match a.kind.as_deref() {
        None | Some("luks") => None,
        Some("luks1") => Some(LuksVersion::V1),
        Some("luks2") => Some(LuksVersion::V2),
        Some(o) => bail!(UsageError(format!("Repair is supported for LUKS devices only (--type {o}).",))),
    };
    let meta_path = a.header.as_deref().unwrap_or(&a.device);
    let meta = open_meta(meta_path, false)?;
    let data = match &a.header {
        Some(_) => Some(open_meta(&a.device, false)?),
        None => None,
    };
    let found = luks::probe(&*meta.device).map_err(luks_err(meta_path))?;
    match (found, want) {
        (None, _) => bail!(UsageError(format!("Device {meta_path} is not a valid LUKS device."))),
        (Some(f), Some(w)) if f != w => bail!(UsageError(format!(
            "Device {meta_path} is not a valid LUKS{} device (it is LUKS{}).",
            w.number(),
            f.number()
        ))),
        _ => {}
    }
    let (mut luks, notes) = Luks::repair(&*meta.device).map_err(luks_err(meta_path))?;
    if notes.is_empty() {
        log::info!("No known problems detected for LUKS header.");
    }
    for n in &notes {
        eprintln!("{n}");
    }
    let Some(st) = reencrypt::status(&luks).map_err(luks_err(meta_path))? else {
        return Ok(());
    };
    if st.hot.is_none() {
        log::info!("Seems device does not require reencryption recovery.");
        return Ok(());
    }
    confirm("Really proceed with LUKS2 reencryption recovery?", a.batch_mode)?;
    let limits = a.kdf_limits.limits();
    let keys = with_passphrase(&a.key, "Enter passphrase for reencryption recovery: ", |pass| {
        reencrypt::unlock_keys_with(&*meta.device, &luks, pass, a.key_slot, &limits)
            .map_err(luks_err(meta_path))
    })?;
    let data_dev: &dyn blockdev::BlockDevice = match &data {
        Some(d) => &*d.device,
        None => &*meta.device,
    };
    // The recovery is not stopped half way by a first SIGINT/SIGTERM (a second one ends it).
    crate::hardening::wiping(true);
    let r = reencrypt::recover_interrupted(&*meta.device, data_dev, &mut luks, &keys);
    crate::hardening::wiping(false);
    if r.map_err(luks_err(meta_path))? {
        eprintln!("Reencryption recovered: resume it with `sealdisk reencrypt --resume-only`.");
    }
    Ok(())
}
