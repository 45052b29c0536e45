//! `sealdisk open --type luks|luks1|luks2 DEVICE NAME`: unlock, assemble, serve over NBD
//! (the LUKS branch of `open`), and `open --test-passphrase DEVICE`.

use anyhow::{bail, Context, Result};
use formats::dm::CryptOptions;
use volume::luks::{self, LuksVersion, OpenParams};
use volume::OpenOptions;

use super::luks::{luks_err, passphrase, KeyArgs};
use super::open::{masked, OpenArgs};
use super::UsageError;
use crate::serve::serve;

/// `luks` if `device` starts with a LUKS header, else `plain` (also when it cannot be read:
/// the plain path then reports the error).
pub fn detect(device: &str, opts: &OpenOptions) -> String {
    let ro = OpenOptions { read_only: true, ..*opts };
    match volume::open_backing(device, &ro).map(|d| luks::probe(&d)) {
        Ok(Ok(Some(_))) => "luks".into(),
        _ => "plain".into(),
    }
}

/// Runs the LUKS branch of `open`.
pub fn run(a: &OpenArgs, kind: &str, opts: &OpenOptions) -> Result<()> {
    let version = match kind {
        "luks1" => Some(LuksVersion::V1),
        "luks2" => Some(LuksVersion::V2),
        _ => None,
    };
    let (device, name) = match (a.positional.as_slice(), a.test_passphrase) {
        ([d], true) => (d.clone(), None),
        ([d, n], _) => (d.clone(), Some(n.clone())),
        _ => bail!(UsageError("open --type luks needs DEVICE and NAME (or --test-passphrase DEVICE)".into())),
    };
    let flags = CryptOptions {
        allow_discards: a.allow_discards,
        same_cpu_crypt: a.perf_same_cpu_crypt,
        submit_from_crypt_cpus: a.perf_submit_from_crypt_cpus,
        no_read_workqueue: a.perf_no_read_workqueue,
        no_write_workqueue: a.perf_no_write_workqueue,
        ..CryptOptions::default()
    };
    let p = OpenParams {
        device: device.clone(),
        header: a.header.clone(),
        version,
        key_slot: a.key_slot,
        flags,
        open: *opts,
        integrity_no_journal: a.integrity_no_journal,
        kdf_limits: a.kdf_limits.limits(),
    };
    let keys = KeyArgs {
        key_file: a.key_file.clone(),
        keyfile_offset: a.keyfile_offset,
        keyfile_size: a.keyfile_size,
    };
    let meta_path = a.header.clone().unwrap_or_else(|| device.clone());
    if a.test_passphrase {
        let (meta, l) = luks::load_for(&p)?;
        l.check_supported().map_err(luks_err(&meta_path))?;
        let pass = passphrase(&keys, &format!("Enter passphrase for {device}: "))?;
        let (slot, _) =
            l.unlock_with(&meta, &pass, a.key_slot, &p.kdf_limits).map_err(luks_err(&meta_path))?;
        log::info!("Key slot {slot} unlocked.");
        return Ok(());
    }
    let pass = passphrase(&keys, &format!("Enter passphrase for {device}: "))?;
    let opened = luks::open(&p, &pass).with_context(|| format!("opening {device} as LUKS"))?;
    log::info!("Key slot {} unlocked.", opened.keyslot);
    if a.print_table {
        let t = &opened.volume.table;
        // Straight to stdout: no String copy of the key.
        if a.showkeys {
            println!("{t}");
        } else {
            println!("{}", masked(t));
        }
    }
    let name = name.unwrap_or_default();
    serve(&name, opened.volume.device, &a.serve, a.readonly)
}
