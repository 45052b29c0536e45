//! `sealdisk luksFormat DEVICE [KEYFILE]`: cryptsetup's options and defaults.

use anyhow::{bail, Context, Result};
use clap::Args;
use volume::luks::{self, FormatParams, LuksIntegrity, LuksVersion, WipeEnd};
use volume::{FormatSpec, Formatted};

use super::luks::{confirm, luks_err, new_passphrase, open_meta, parse_size, KeyArgs, PbkdfArgs};
use super::wipe::{self, Progress, ProgressArgs};
use super::UsageError;

/// Arguments of `luksFormat`.
#[derive(Debug, Args)]
#[command(after_help = "\
Example (cheap KDF, for tests):
  sealdisk luksFormat -q --pbkdf pbkdf2 --pbkdf-force-iterations 1000 --key-file pass disk.img")]
pub struct LuksFormatArgs {
    /// luks1, luks2 or luks (= luks2).
    #[arg(long = "type", short = 'M', default_value = "luks2")]
    pub kind: String,
    /// Data cipher.
    #[arg(long, short = 'c', default_value = "aes-xts-plain64")]
    pub cipher: String,
    /// Volume key size in bits (default 512 for XTS, else 256).
    #[arg(long, short = 's')]
    pub key_size: Option<usize>,
    #[command(flatten)]
    pub pbkdf: PbkdfArgs,
    #[command(flatten)]
    pub key: KeyArgs,
    /// Keyslot for the passphrase (default 0).
    #[arg(long, short = 'S')]
    pub key_slot: Option<u32>,
    /// Encryption sector size (LUKS2): 512, 1024, 2048, 4096.
    #[arg(long, default_value_t = 512)]
    pub sector_size: u32,
    /// LUKS2 label.
    #[arg(long)]
    pub label: Option<String>,
    /// LUKS2 subsystem.
    #[arg(long)]
    pub subsystem: Option<String>,
    /// UUID to use instead of a random one.
    #[arg(long)]
    pub uuid: Option<String>,
    /// Data offset in 512-byte sectors.
    #[arg(long, short = 'o')]
    pub offset: Option<u64>,
    /// LUKS2 metadata size: 16k, 32k, 64k, 128k, 256k, 512k, 1m, 2m, 4m.
    #[arg(long, value_parser = parse_size)]
    pub luks2_metadata_size: Option<u64>,
    /// LUKS2 keyslots area size.
    #[arg(long, value_parser = parse_size)]
    pub luks2_keyslots_size: Option<u64>,
    /// Use this volume key (raw bytes) instead of a random one.
    #[arg(long, alias = "master-key-file", value_name = "FILE")]
    pub volume_key_file: Option<String>,
    /// Put the header in FILE (created or grown as needed); DEVICE holds only data.
    #[arg(long, value_name = "FILE")]
    pub header: Option<String>,
    /// LUKS2 authenticated encryption: hmac-sha256 (or hmac-sha1, hmac-sha512) with an
    /// aes-xts-plain64/aes-xts-random cipher, aead with --cipher aes-gcm-random, or poly1305
    /// with --cipher chacha20-random. The volume key grows by the HMAC key; the data area
    /// gets a dm-integrity layout.
    #[arg(long, short = 'I', value_name = "ALG")]
    pub integrity: Option<String>,
    /// With --integrity: do not wipe the data area (unwritten sectors then fail to read).
    #[arg(long)]
    pub integrity_no_wipe: bool,
    /// With --integrity: wipe without the dm-integrity journal (faster).
    #[arg(long)]
    pub integrity_no_journal: bool,
    #[command(flatten)]
    pub progress: ProgressArgs,
    /// Do not ask for confirmation.
    #[arg(long = "batch-mode", short = 'q')]
    pub batch_mode: bool,
    /// The device, then optionally a key file with the passphrase.
    #[arg(value_name = "DEVICE [KEYFILE]", required = true, num_args = 1..=2)]
    pub positional: Vec<String>,
}

/// Runs `luksFormat`: parses, then one `volume::format` call (the header, and for
/// `--integrity` the dm-integrity area and its wipe).
pub fn run(a: LuksFormatArgs) -> Result<()> {
    let device = a.positional[0].clone();
    let version = match a.kind.as_str() {
        "luks" | "luks2" => LuksVersion::V2,
        "luks1" => LuksVersion::V1,
        other => bail!(UsageError(format!("luksFormat --type {other:?}: use luks1 or luks2"))),
    };
    if let Some(bits) = a.key_size {
        volume::luks::key_bytes(bits)?;
    }
    let integrity = match &a.integrity {
        Some(alg) => {
            if version != LuksVersion::V2 {
                bail!(UsageError("--integrity needs LUKS2".into()));
            }
            let spec = sector_crypto::AeadSpec::from_luks2(&a.cipher, alg)
                .with_context(|| format!("--cipher {} --integrity {alg}", a.cipher))?;
            Some(LuksIntegrity {
                spec,
                no_wipe: a.integrity_no_wipe,
                no_journal: a.integrity_no_journal,
                journal_size: None,
            })
        }
        None if a.integrity_no_wipe || a.integrity_no_journal => {
            bail!(UsageError("--integrity-no-wipe and --integrity-no-journal need --integrity".into()))
        }
        None => None,
    };
    // Key sizes (cryptsetup's defaults, the MAC key added) are volume's decision.
    let mut params =
        FormatParams::for_cipher(version, &a.cipher, a.key_size, integrity).map_err(luks_err(&device))?;
    params.volume_key = match &a.volume_key_file {
        Some(f) => Some(crate::keys::read_key(
            &crate::keys::KeySource { path: f.clone(), offset: 0, size: None },
            params.key_bytes,
        )?),
        None => None,
    };
    params.pbkdf = a.pbkdf.params()?;
    params.sector_size = a.sector_size;
    params.label = a.label.clone();
    params.subsystem = a.subsystem.clone();
    params.uuid = a.uuid.clone();
    params.offset = a.offset;
    params.metadata_size = a.luks2_metadata_size;
    params.keyslots_size = a.luks2_keyslots_size;
    params.key_slot = a.key_slot;
    let meta_path = a.header.clone().unwrap_or_else(|| device.clone());
    // The data device must exist even with a detached header. Whenever it is written (it
    // holds the header, or an integrity area) it is opened and locked before anything is
    // asked, so a device in use is refused at once (exit 5).
    let data = open_meta(&device, a.header.is_some() && integrity.is_none())?;
    if version == LuksVersion::V2 {
        // cryptsetup refuses the size options before it asks anything, and warns about a
        // small keyslots area (stdout).
        let (_, ks, _) = luks::luks2_layout(&params).map_err(luks_err(&meta_path))?;
        super::luks::keyslots_warnings(ks, a.luks2_keyslots_size);
    }
    confirm(&format!("This will overwrite data on {meta_path} irrevocably."), a.batch_mode)?;
    let key_file = a.positional.get(1).map(String::as_str).or(a.key.key_file.as_deref());
    let pass = new_passphrase(
        key_file,
        a.key.keyfile_offset,
        a.key.keyfile_size,
        &format!("Enter passphrase for {device}: "),
    )?;
    let header = match &a.header {
        Some(h) => {
            let so = volume::OpenOptions { lock: true, ..Default::default() }.storage();
            Some(luks::open_header_for_format(h, &params, &so)?)
        }
        None => None,
    };
    let wiping = integrity.is_some_and(|i| !i.no_wipe);
    let mut progress = Progress::new(a.progress.progress_frequency, !wiping);
    let mut announced = false;
    let formatted = wipe::stoppable(|| {
        let spec = FormatSpec::Luks { params, header: header.as_ref(), passphrase: &pass };
        volume::format(spec, &data, |d, t| {
            if !announced {
                // The header is written and keyslot 0 made when the wipe starts.
                log::info!("Key slot {} created.", a.key_slot.unwrap_or(0));
                eprintln!(
                    "Wiping device to initialize integrity checksum.\nYou can interrupt this by pressing \
                     CTRL+c (the rest of the device then reads as integrity errors until \
                     `sealdisk luksResumeWipe` finishes it)."
                );
                announced = true;
            }
            progress.step(d, t)
        })
    });
    progress.finish();
    let Formatted::Luks { wipe: end, .. } =
        formatted.with_context(|| format!("formatting {meta_path} as LUKS{}", version.number()))?
    else {
        bail!("luksFormat made something other than a LUKS volume");
    };
    if !announced {
        log::info!("Key slot {} created.", a.key_slot.unwrap_or(0));
    }
    if let WipeEnd::Stopped { wiped, total } = end {
        return Err(wipe::interrupted(&device, a.header.as_deref(), a.integrity_no_journal, wiped, total));
    }
    if integrity.is_some_and(|i| i.no_wipe) {
        log::warn!("{device}: data area not wiped (--integrity-no-wipe): unwritten sectors fail to read");
    }
    Ok(())
}
