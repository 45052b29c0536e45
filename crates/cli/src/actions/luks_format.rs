//! `sealdisk luksFormat DEVICE [KEYFILE]`: cryptsetup's options and defaults.

use anyhow::{bail, Context, Result};
use clap::Args;
use volume::luks::{self, FormatParams, LuksIntegrity, LuksVersion, WipeEnd};

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

/// Runs `luksFormat`.
pub fn run(a: LuksFormatArgs) -> Result<()> {
    let device = a.positional[0].clone();
    let version = match a.kind.as_str() {
        "luks" | "luks2" => LuksVersion::V2,
        "luks1" => LuksVersion::V1,
        other => bail!(UsageError(format!("luksFormat --type {other:?}: use luks1 or luks2"))),
    };
    let key_bits = a.key_size.unwrap_or(if a.cipher.contains("xts") { 512 } else { 256 });
    if !key_bits.is_multiple_of(8) {
        bail!(UsageError(format!("--key-size {key_bits} is not a multiple of 8 bits")));
    }
    let integrity = match &a.integrity {
        Some(alg) => {
            if version != LuksVersion::V2 {
                bail!(UsageError("--integrity needs LUKS2".into()));
            }
            let spec = sector_crypto::AeadSpec::from_luks2(&a.cipher, alg)
                .with_context(|| format!("--cipher {} --integrity {alg}", a.cipher))?;
            Some(LuksIntegrity { spec, no_wipe: a.integrity_no_wipe, no_journal: a.integrity_no_journal })
        }
        None if a.integrity_no_wipe || a.integrity_no_journal => {
            bail!(UsageError("--integrity-no-wipe and --integrity-no-journal need --integrity".into()))
        }
        None => None,
    };
    // cryptsetup: --key-size is the encryption key; an HMAC key is added to the volume key.
    let key_bytes = key_bits / 8 + integrity.map_or(0, |i| i.spec.mac_key_size());
    let volume_key = match &a.volume_key_file {
        Some(f) => Some(crate::keys::read_key(
            &crate::keys::KeySource { path: f.clone(), offset: 0, size: None },
            key_bytes,
        )?),
        None => None,
    };
    let data_size = std::fs::metadata(&device).map(|m| m.len()).ok();
    let params = FormatParams {
        version,
        cipher: a.cipher.clone(),
        key_bytes,
        pbkdf: a.pbkdf.params()?,
        sector_size: a.sector_size,
        label: a.label.clone(),
        subsystem: a.subsystem.clone(),
        uuid: a.uuid.clone(),
        offset: a.offset,
        metadata_size: a.luks2_metadata_size,
        keyslots_size: a.luks2_keyslots_size,
        volume_key,
        key_slot: a.key_slot,
        detached: a.header.is_some(),
        data_size,
        integrity,
    };
    let meta_path = a.header.clone().unwrap_or_else(|| device.clone());
    // The data device must exist even with a detached header. Whenever it is written (it
    // holds the header, or an integrity area) it is opened and locked before anything is
    // asked, so a device in use is refused at once (exit 5).
    let data = open_meta(&device, a.header.is_some() && integrity.is_none())?;
    confirm(&format!("This will overwrite data on {meta_path} irrevocably."), a.batch_mode)?;
    let key_file = a.positional.get(1).map(String::as_str).or(a.key.key_file.as_deref());
    let pass = new_passphrase(
        key_file,
        a.key.keyfile_offset,
        a.key.keyfile_size,
        &format!("Enter passphrase for {device}: "),
    )?;
    if let Some(h) = &a.header {
        grow_header_file(h, &params)?;
    }
    let header = match &a.header {
        Some(h) => Some(open_meta(h, false)?),
        None => None,
    };
    let (l, vk) = luks::format(header.as_ref().unwrap_or(&data), &params, &pass)
        .map_err(luks_err(&meta_path))
        .with_context(|| format!("formatting {meta_path} as LUKS{}", version.number()))?;
    drop(header);
    log::info!("Key slot {} created.", a.key_slot.unwrap_or(0));
    if let Some(i) = &integrity {
        let mut progress = Progress::new(a.progress.progress_frequency, false);
        let end = wipe::stoppable(|| {
            if !i.no_wipe {
                eprintln!(
                    "Wiping device to initialize integrity checksum.\nYou can interrupt this by pressing \
                     CTRL+c (the rest of the device then reads as integrity errors until \
                     `sealdisk luksResumeWipe` finishes it)."
                );
            }
            luks::format_integrity_until(data, &l, &vk, i, |d, t| progress.step(d, t))
        });
        progress.finish();
        let end = end
            .map_err(luks_err(&device))
            .with_context(|| format!("formatting the integrity area of {device}"))?;
        if let WipeEnd::Stopped { wiped, total } = end {
            return Err(wipe::interrupted(&device, a.header.as_deref(), i.no_journal, wiped, total));
        }
        if i.no_wipe {
            log::warn!("{device}: data area not wiped (--integrity-no-wipe): unwritten sectors fail to read");
        }
    }
    Ok(())
}

/// A detached header file is created, or grown, to hold the whole metadata (cryptsetup
/// extends file-backed header devices the same way).
fn grow_header_file(path: &str, p: &FormatParams) -> Result<()> {
    let need = match p.version {
        LuksVersion::V1 => {
            let (_, end) = formats::luks1::standard_keyslot_layout(p.key_bytes as u32);
            (end * 512).div_ceil(4096) * 4096
        }
        LuksVersion::V2 => {
            let md = p.metadata_size.unwrap_or(16 << 10);
            let ks = p.keyslots_size.unwrap_or((16 << 20) - 2 * md);
            2 * md + ks
        }
    };
    let f = std::fs::OpenOptions::new()
        .create(true)
        .truncate(false)
        .write(true)
        .open(path)
        .with_context(|| format!("creating header file {path}"))?;
    let len = f.metadata().with_context(|| format!("reading {path}"))?.len();
    if f.metadata()?.file_type().is_file() && len < need {
        f.set_len(need).with_context(|| format!("growing header file {path}"))?;
    }
    Ok(())
}
