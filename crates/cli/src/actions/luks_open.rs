//! `sealdisk open --type luks|luks1|luks2 DEVICE NAME`: unlock, assemble, serve over NBD
//! (the LUKS branch of `open`), and `open --test-passphrase DEVICE`. The volume is
//! assembled by `volume::open` with `volume::Spec::Luks`; this module only parses, asks for
//! passphrases (`--tries`) and prints.

use anyhow::{bail, Context, Result};
use formats::dm::CryptOptions;
use volume::luks::LuksVersion;
use volume::{Format, LuksSpec, OpenOptions, VolumeError};

use super::luks::Passphrases;
use super::open::{masked, OpenArgs, OpenTarget};
use super::UsageError;
use crate::control::server::{LuksResume, Rebuild};
use crate::serve::serve;

/// cryptsetup's refusal of a device without a LUKS header, with a hint for what it holds.
fn not_luks(e: VolumeError) -> anyhow::Error {
    match e {
        VolumeError::NotLuks { path, found: Format::Integrity } => UsageError(format!(
            "Device {path} is not a valid LUKS device: it holds a dm-integrity superblock.\n\
             Open it with `sealdisk integrity open {path} NAME --listen ADDR`."
        ))
        .into(),
        VolumeError::NotLuks { path, found: found @ (Format::Fvault2 | Format::Bitlk) } => UsageError(format!(
            "Device {path} is not a valid LUKS device: it holds a {} volume.\nOpen it with --type {}.",
            found.name(),
            found.type_name().unwrap_or_default()
        ))
        .into(),
        VolumeError::NotLuks { path, .. } => UsageError(format!(
            "Device {path} is not a valid LUKS device.\n\
             (Plain dm-crypt has no header: open it with --type plain and its --cipher, --key-size and --key-file.)"
        ))
        .into(),
        e => e.into(),
    }
}

/// Runs the LUKS branch of `open`.
pub fn run(a: &OpenArgs, version: Option<LuksVersion>, opts: &OpenOptions) -> Result<()> {
    let OpenTarget { device, name, listener } = a.target()?;
    // Everything cheap before the KDF: the socket, then the devices (opened and locked).
    let header = match &a.header {
        Some(h) => {
            super::ensure_device(h)?;
            Some(volume::storage::open(h, &opts.storage())?)
        }
        None => None,
    };
    let data = volume::storage::open(&device, &opts.storage())?;
    let keys = a.key_args();
    let lc = &a.lifecycle;
    if lc.persistent && a.test_passphrase {
        bail!(UsageError("Option --persistent is not allowed with --test-passphrase.".into()));
    }
    if lc.unbound {
        // `open --unbound --test-passphrase`: any keyslot, bound or not (luks_token.rs).
        return super::luks_token::test_unbound(a, header.as_ref().unwrap_or(&data), &keys);
    }
    let passphrases = Passphrases::new(&keys, format!("Enter passphrase for {device}: "));
    // LUKS2 tokens first (luks2-keyring), then the passphrase unless --token-only.
    let tokens = if lc.try_tokens(keys.key_file.is_some()) {
        super::luks_token::open_tokens(header.as_ref().unwrap_or(&data), lc)?
    } else {
        Vec::new()
    };
    let mut passphrases = super::luks_token::TokenFirst::new(tokens, (!lc.token_only).then_some(passphrases));
    let mut spec = LuksSpec {
        version,
        header,
        key_slot: a.key_slot,
        flags: CryptOptions {
            allow_discards: a.allow_discards,
            same_cpu_crypt: a.perf_same_cpu_crypt,
            submit_from_crypt_cpus: a.perf_submit_from_crypt_cpus,
            no_read_workqueue: a.perf_no_read_workqueue,
            no_write_workqueue: a.perf_no_write_workqueue,
            ..CryptOptions::default()
        },
        integrity_no_journal: a.integrity_no_journal,
        integrity_journal: journal_tuning(a),
        kdf_limits: a.kdf_limits.limits(),
    };
    let Some(listener) = listener else {
        // --test-passphrase: the header is opened (and locked) once, before the prompt.
        let meta = spec.header.take().unwrap_or(data);
        let (unlocked, _key) =
            volume::unlock_luks(&spec, &mut passphrases, &meta, opts.read_only).map_err(not_luks)?;
        log::info!("Key slot {} unlocked.", unlocked.keyslot);
        return Ok(());
    };
    let (storage, header) = (data.clone(), spec.header.clone());
    let persistent =
        lc.persistent.then(|| super::luks_token::persistent_flags(&spec.flags, a.integrity_no_journal));
    let vol = volume::open_storage(
        data,
        volume::Spec::Luks(spec),
        volume::Keys::passphrase(&mut passphrases),
        opts,
    )
    .map_err(not_luks)
    .with_context(|| format!("opening {device} as LUKS"))?;
    if let Some(flags) = persistent {
        // `--persistent`: after the unlock, the flags become the header's.
        super::luks_token::store_persistent(header.as_ref().unwrap_or(&storage), &flags)?;
    }
    if let Some(u) = &vol.luks {
        log::info!("Key slot {} unlocked.", u.keyslot);
    }
    if a.print_table {
        if let Some(t) = vol.crypt_table() {
            // Straight to stdout: no String copy of the key.
            if a.showkeys {
                println!("{t}");
            } else {
                println!("{}", masked(t));
            }
        }
    }
    let Some(name) = name else { bail!(UsageError("open needs DEVICE and NAME".into())) };
    // cryptsetup refuses a name in use at activation, after the passphrase; the early check
    // above spared the KDF when a server already answers.
    let claim = crate::control::claim(&name)?;
    let luks = vol.luks.as_ref().map(|u| LuksResume {
        version: u.luks.version(),
        uuid: u.luks.uuid().to_owned(),
        integrity_no_journal: a.integrity_no_journal,
        integrity_journal: journal_tuning(a),
        kdf_limits: a.kdf_limits.limits(),
    });
    let rebuild = Rebuild { header, luks, ..Rebuild::on(storage, *opts) };
    serve(claim, vol, rebuild, listener, &a.serve, a.readonly)
}

/// `--journal-watermark`, `--journal-commit-time` for the dm-integrity layer of an
/// authenticated volume.
fn journal_tuning(a: &OpenArgs) -> volume::luks::IntegrityJournalTuning {
    volume::luks::IntegrityJournalTuning {
        watermark: a.journal_watermark,
        commit_time_ms: a.journal_commit_time,
    }
}
