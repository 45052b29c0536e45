//! `sealdisk open --type luks|luks1|luks2 DEVICE NAME`: unlock, assemble, serve over NBD
//! (the LUKS branch of `open`), and `open --test-passphrase DEVICE`.

use anyhow::{bail, Context, Result};
use formats::dm::CryptOptions;
use volume::luks::{self, LuksVersion, OpenParams};
use volume::OpenOptions;

use super::luks::{luks_err, with_passphrase, KeyArgs};
use super::open::{masked, OpenArgs};
use super::UsageError;
use crate::serve::serve;

/// Checks that `path` exists and starts with a LUKS header, naming what it holds instead
/// when it does not: a dm-integrity superblock, or nothing sealdisk knows (cryptsetup's
/// "Device X is not a valid LUKS device.", with a hint for plain dm-crypt).
fn expect_luks(path: &str, opts: &OpenOptions) -> Result<()> {
    super::ensure_device(path)?;
    // A read-only, unlocked look: the real open below takes the lock.
    let probe_opts = OpenOptions { read_only: true, lock: false, ..*opts };
    let dev = volume::open_backing(path, &probe_opts)?;
    if luks::probe(&dev).map_err(luks_err(path))?.is_some() {
        return Ok(());
    }
    if volume::integrity::probe(&dev).unwrap_or(false) {
        bail!(UsageError(format!(
            "Device {path} is not a valid LUKS device: it holds a dm-integrity superblock.\n\
             Open it with `sealdisk integrity open {path} NAME --listen ADDR`."
        )));
    }
    bail!(UsageError(format!(
        "Device {path} is not a valid LUKS device.\n\
         (Plain dm-crypt has no header: open it with --type plain and its --cipher, --key-size and --key-file.)"
    )))
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
        _ => bail!(UsageError("open needs DEVICE and NAME (or --test-passphrase DEVICE)".into())),
    };
    // Everything cheap before the KDF: the socket, then the devices and their header.
    let listener = match a.test_passphrase {
        true => None,
        false => Some(crate::serve::listen(&a.serve)?),
    };
    let meta_path = a.header.clone().unwrap_or_else(|| device.clone());
    if a.header.is_some() {
        super::ensure_device(&device)?;
    }
    expect_luks(&meta_path, opts)?;
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
        tries: a.tries,
    };
    let prompt = format!("Enter passphrase for {device}: ");
    let Some(listener) = listener else {
        // --test-passphrase: the header is opened (and locked) once, before the prompt.
        let (meta, l) = luks::load_for(&p)?;
        l.check_supported().map_err(luks_err(&meta_path))?;
        let slot = with_passphrase(&keys, &prompt, |pass| {
            l.unlock_with(&meta, pass, a.key_slot, &p.kdf_limits).map_err(luks_err(&meta_path))
        })?
        .0;
        log::info!("Key slot {slot} unlocked.");
        return Ok(());
    };
    let opened = with_passphrase(&keys, &prompt, |pass| {
        luks::open(&p, pass).with_context(|| format!("opening {device} as LUKS"))
    })?;
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
    serve(&name, opened.volume.device, &device, listener, &a.serve, a.readonly)
}
