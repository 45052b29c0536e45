//! `reencrypt`: LUKS2 reencryption, offline, cryptsetup-compatible on disk (see
//! `volume::luks::reencrypt`). Without `--init-only`/`--resume-only` it initializes a new
//! reencryption, or resumes the one in progress, and runs it to the end. The first
//! SIGINT/SIGTERM stops it cleanly after the current hotzone (resume later).

use std::io::{IsTerminal, Write};
use std::time::{Duration, Instant};

use anyhow::{bail, Context, Result};
use clap::Args;
use volume::luks::reencrypt::{self, EncryptLayout, ReencryptParams, RunEnd, RunOptions};
use volume::luks::Luks;

use super::luks::{luks_err, open_meta, parse_size, with_passphrase, KdfLimitArgs, KeyArgs, PbkdfArgs};
use super::UsageError;

/// Arguments of `reencrypt DEVICE`.
#[derive(Debug, Args)]
pub struct ReencryptArgs {
    #[command(flatten)]
    pub key: KeyArgs,
    #[command(flatten)]
    pub kdf_limits: KdfLimitArgs,
    #[command(flatten)]
    pub pbkdf: PbkdfArgs,
    /// Detached header file holding the LUKS metadata.
    #[arg(long, value_name = "FILE")]
    pub header: Option<String>,
    /// Only write the reencryption metadata; do not touch data.
    #[arg(long)]
    pub init_only: bool,
    /// Only resume a reencryption already in progress.
    #[arg(long)]
    pub resume_only: bool,
    /// New cipher (default: keep the current one).
    #[arg(long, short = 'c')]
    pub cipher: Option<String>,
    /// New volume key size in bits.
    #[arg(long, short = 's', value_name = "BITS")]
    pub key_size: Option<usize>,
    /// New encryption sector size.
    #[arg(long, value_name = "BYTES")]
    pub sector_size: Option<u32>,
    /// The keyslot whose passphrase is given.
    #[arg(long, short = 'S')]
    pub key_slot: Option<u32>,
    /// Hotzone protection: checksum (default), journal or none.
    #[arg(long)]
    pub resilience: Option<String>,
    /// Hash of the checksum resilience mode.
    #[arg(long, default_value = "sha256")]
    pub resilience_hash: String,
    /// Largest hotzone (k/m/g suffixes).
    #[arg(long, value_parser = parse_size, value_name = "SIZE")]
    pub hotzone_size: Option<u64>,
    /// Print progress every N seconds (default: 1 on a terminal, else none).
    #[arg(long, value_name = "SECONDS")]
    pub progress_frequency: Option<u64>,
    /// Encrypt a plaintext device in place.
    #[arg(long)]
    pub encrypt: bool,
    /// Decrypt a device in place (with --header).
    #[arg(long)]
    pub decrypt: bool,
    /// With --encrypt and no --header: give up this many bytes at the end of the device;
    /// the header takes the first half, the data moves up by as much (data shift). With
    /// --header: the data is encrypted in place in hotzones this long, and the header's
    /// keyslots area is this less both metadata copies (cryptsetup 2.6.1).
    #[arg(long, value_parser = parse_size, value_name = "SIZE")]
    pub reduce_device_size: Option<u64>,
    /// With --encrypt: where the data starts, in 512-byte sectors (with the header on the
    /// device, at most half of --reduce-device-size). Ignored otherwise, as in cryptsetup.
    #[arg(long, short = 'o', value_name = "SECTORS")]
    pub offset: Option<u64>,
    /// With --encrypt: the LUKS2 metadata size (16k, 32k, ..., 4m). Ignored otherwise.
    #[arg(long, value_parser = parse_size, value_name = "SIZE")]
    pub luks2_metadata_size: Option<u64>,
    /// With --encrypt: the LUKS2 keyslots area size. Ignored otherwise.
    #[arg(long, value_parser = parse_size, value_name = "SIZE")]
    pub luks2_keyslots_size: Option<u64>,
    /// Do not ask for confirmation.
    #[arg(long = "batch-mode", short = 'q')]
    pub batch_mode: bool,
    /// Reencrypt the active volume NAME online (its server runs the reencryption while it
    /// goes on serving). Without it, a DEVICE served by a running `sealdisk open` is found
    /// and reencrypted online the same way.
    #[arg(long, value_name = "NAME")]
    pub active_name: Option<String>,
    /// The LUKS2 device.
    pub device: String,
}

/// cryptsetup's progress line: percent, ETA, bytes written, speed.
struct Progress {
    every: Option<Duration>,
    start: Instant,
    last: Option<Instant>,
    first_done: Option<u64>,
    printed: bool,
}

impl Progress {
    fn new(frequency: Option<u64>) -> Self {
        let every = match frequency {
            Some(0) => None,
            Some(s) => Some(Duration::from_secs(s)),
            None if std::io::stderr().is_terminal() => Some(Duration::from_secs(1)),
            None => None,
        };
        Self { every, start: Instant::now(), last: None, first_done: None, printed: false }
    }

    fn update(&mut self, done: u64, total: u64) {
        let first = *self.first_done.get_or_insert(done);
        let Some(every) = self.every else { return };
        let now = Instant::now();
        if done < total && self.last.is_some_and(|l| now.duration_since(l) < every) {
            return;
        }
        self.last = Some(now);
        let secs = now.duration_since(self.start).as_secs_f64().max(1e-3);
        let rate = (done - first) as f64 / secs;
        let left = total.saturating_sub(done) as f64;
        let eta = if rate > 0.0 { (left / rate) as u64 } else { 0 };
        let pct = if total == 0 { 100.0 } else { done as f64 * 100.0 / total as f64 };
        let end = if std::io::stderr().is_terminal() { "\r" } else { "\n" };
        eprint!(
            "Progress: {pct:5.1}%, ETA {:02}:{:02}, {} MiB written, speed {:5.1} MiB/s{end}",
            eta / 60,
            eta % 60,
            (done - first) >> 20,
            rate / f64::from(1 << 20)
        );
        let _ = std::io::stderr().flush();
        self.printed = true;
    }

    fn finish(&self) {
        if self.printed && std::io::stderr().is_terminal() {
            eprintln!();
        }
    }
}

/// Runs `reencrypt`.
pub fn reencrypt(mut a: ReencryptArgs) -> Result<()> {
    // cryptsetup: a zero reduction is no reduction.
    if a.reduce_device_size == Some(0) {
        a.reduce_device_size = None;
    }
    if let Some(r) = a.reduce_device_size {
        if r % 512 != 0 {
            bail!(UsageError("Reduce size must be multiple of 512 bytes sector.".into()));
        }
        if r > 1 << 30 {
            bail!(UsageError("Maximum device reduce size is 1 GiB.".into()));
        }
        if a.encrypt && !a.decrypt && a.header.is_some() {
            // A detached header with a data shift: the encryption below, in place
            // (`encrypt`), or the resume of the one in progress.
        } else if a.decrypt && !a.encrypt {
            // cryptsetup 2.6.1 ignores it when decrypting (its data shift decryption takes
            // the shift from the data offset).
            a.reduce_device_size = None;
        } else if a.encrypt && !a.decrypt && a.header.is_none() {
            // An encryption with data shift already under way resumes; a device that is
            // LUKS otherwise is refused; a plaintext one is encrypted in place.
            if !is_luks(&a.device)? {
                if a.resume_only {
                    bail!(UsageError("Device reencryption not in progress.".into()));
                }
                return encrypt_shift(a, r);
            }
            if !shift_encryption_in_progress(&a.device) {
                if encryption_in_progress(&a.device) {
                    bail!(UsageError(
                        "Device is not in LUKS2 encryption. Conflicting option --encrypt.".into()
                    ));
                }
                bail!(UsageError(format!("Device {} is already LUKS device. Aborting operation.", a.device)));
            }
            // In progress: the same command resumes it, as any reencryption.
            a.encrypt = false;
            a.reduce_device_size = None;
        } else if a.encrypt && !a.decrypt && is_luks(&a.device)? {
            bail!(UsageError(format!("Device {} is already LUKS device. Aborting operation.", a.device)));
        } else {
            bail!(UsageError(
                "reencrypt --reduce-device-size (data shift) is implemented in sealdisk only for --encrypt"
                    .into()
            ));
        }
    }
    if a.encrypt && a.decrypt {
        bail!(UsageError("Options --encrypt and --decrypt are mutually exclusive.".into()));
    }
    if a.encrypt && a.header.is_none() {
        bail!(UsageError(
            "Encryption without detached header (--header) is not possible without data device size \
             reduction (--reduce-device-size)."
                .into()
        ));
    }
    if a.decrypt && a.header.is_none() {
        // cryptsetup 2.6 looks at the device first: a device that is not LUKS gets that
        // said; a LUKS one needs a header file to decrypt to (data shift: not done here).
        if !is_luks(&a.device)? {
            bail!(UsageError(format!("Device {} is not a valid LUKS device.", a.device)));
        }
        bail!(UsageError("LUKS2 decryption requires --header option.".into()));
    }
    if let (true, Some(h)) = (a.decrypt, &a.header) {
        // cryptsetup 2.6 decrypts a volume whose header is on the device into a new header
        // file (data shift, `online-reencrypt-v3`); of an active device, online, as its
        // server starts and runs it.
        let active = match &a.active_name {
            Some(n) => Some(n.clone()),
            None => crate::control::client::serving(&a.device),
        };
        if let (false, Some(name)) = (std::path::Path::new(h).exists(), &active) {
            if a.resume_only {
                bail!(UsageError("Device reencryption not in progress.".into()));
            }
            let abs = std::path::absolute(h).with_context(|| format!("the header file {h}"))?;
            return online(&a, name, Some(abs.to_string_lossy().into_owned()));
        }
        if !std::path::Path::new(h).exists() && is_luks(&a.device)? {
            if a.resume_only {
                bail!(UsageError("Device reencryption not in progress.".into()));
            }
            let h = h.clone();
            return decrypt_shift(a, h);
        }
    }
    if a.encrypt && !encryption_in_progress(a.header.as_deref().unwrap_or_default()) {
        if a.resume_only {
            bail!(UsageError("Device reencryption not in progress.".into()));
        }
        return encrypt(a);
    }
    if a.init_only && a.resume_only {
        bail!(UsageError("Options --init-only and --resume-only are mutually exclusive.".into()));
    }
    check_key_size(&a)?;
    let active = match &a.active_name {
        Some(n) => Some(n.clone()),
        None if a.header.is_none() => crate::control::client::serving(&a.device),
        None => None,
    };
    if let Some(name) = active {
        if (a.encrypt || a.decrypt) && !a.resume_only {
            // The server initializes only a reencryption; an encryption or decryption in
            // progress (initialized offline) is resumed online with --resume-only.
            bail!(UsageError(
                "starting --encrypt or --decrypt of an active device is not supported: initialize it with \
                 --init-only while closed, open it, then resume it with --resume-only --active-name NAME"
                    .into()
            ));
        }
        return online(&a, &name, None);
    }
    let meta_path = a.header.as_deref().unwrap_or(&a.device);
    let meta = open_meta(meta_path, false)?;
    let data = match &a.header {
        Some(_) => Some(open_meta(&a.device, false)?),
        None => None,
    };
    let data_dev: &dyn blockdev::BlockDevice = match &data {
        Some(d) => &*d.device,
        None => &*meta.device,
    };
    let mut luks = Luks::load(&*meta.device, true).map_err(luks_err(meta_path))?;
    let state = reencrypt::status(&luks).map_err(luks_err(meta_path))?;
    if let (Some(st), Some(r)) = (&state, &a.resilience) {
        if st.keyslot.resilience.type_name() != r {
            bail!(UsageError(format!(
                "The reencryption in progress uses resilience {}; changing it on resume is not supported yet.",
                st.keyslot.resilience.type_name()
            )));
        }
    }
    let in_progress = state.is_some();
    if a.resume_only && !in_progress {
        bail!(UsageError("Device reencryption not in progress.".into()));
    }
    let pass = if in_progress {
        if a.init_only {
            bail!(UsageError("LUKS2 reencryption already initialized. Aborting operation.".into()));
        }
        super::luks::passphrase(&a.key, "Enter passphrase: ")?
    } else {
        let params = params(&a)?;
        let data_size = data_dev.geometry().size;
        let mut pass_used = None;
        with_passphrase(&a.key, "Enter passphrase for key slot: ", |p| {
            if a.decrypt {
                reencrypt::init_decrypt(&*meta.device, data_size, &mut luks, p, &params)
                    .map_err(luks_err(meta_path))
                    .context("initializing LUKS2 decryption")?;
                pass_used = Some(p.clone());
                return Ok(());
            }
            let slot = reencrypt::init(&*meta.device, data_size, &mut luks, p, &params)
                .map_err(luks_err(meta_path))
                .context("initializing LUKS2 reencryption")?;
            log::info!("reencrypt: new volume key in keyslot {slot}");
            pass_used = Some(p.clone());
            Ok(())
        })?;
        match pass_used {
            Some(p) => p,
            None => bail!("no passphrase"),
        }
    };
    if a.init_only {
        return Ok(());
    }
    run_to_end(&a, &meta, data_dev, &mut luks, &pass, meta_path)
}

/// Runs the reencryption in progress to its end (or to a clean stop on SIGINT/SIGTERM).
fn run_to_end(
    a: &ReencryptArgs,
    meta: &volume::Storage,
    data_dev: &dyn blockdev::BlockDevice,
    luks: &mut Luks,
    pass: &sector_crypto::kdf::Passphrase,
    meta_path: &str,
) -> Result<()> {
    let opts = RunOptions { hotzone_size: a.hotzone_size, kdf_limits: a.kdf_limits.limits() };
    let mut progress = Progress::new(a.progress_frequency);
    crate::hardening::wiping(true);
    let r = reencrypt::run(data_dev_meta(meta), data_dev, luks, pass, &opts, &mut |done, total| {
        progress.update(done, total);
        crate::hardening::stop_requested().is_none()
    });
    crate::hardening::wiping(false);
    progress.finish();
    match r.map_err(luks_err(meta_path)).context("reencrypting")? {
        RunEnd::Finished => Ok(()),
        RunEnd::Interrupted => {
            eprintln!("Reencryption was interrupted; run `sealdisk reencrypt {}` to resume.", a.device);
            Ok(())
        }
    }
}

/// `true` when `device` starts with a LUKS header (opened read-only).
fn is_luks(device: &str) -> Result<bool> {
    let dev = open_meta(device, true)?;
    Ok(volume::luks::probe(&*dev.device).map_err(luks_err(device))?.is_some())
}

/// `true` when `header` holds a LUKS2 header with a reencryption in progress (an encryption
/// to resume rather than start).
fn encryption_in_progress(header: &str) -> bool {
    if !std::path::Path::new(header).exists() {
        return false;
    }
    let Ok(meta) = open_meta(header, true) else { return false };
    Luks::load(&*meta.device, false).ok().and_then(|l| reencrypt::status(&l).ok().flatten()).is_some()
}

/// `true` when `device` holds an encryption with data shift in progress.
fn shift_encryption_in_progress(device: &str) -> bool {
    let Ok(meta) = open_meta(device, true) else { return false };
    Luks::load(&*meta.device, false)
        .ok()
        .and_then(|l| reencrypt::status(&l).ok().flatten())
        .is_some_and(|st| st.keyslot.mode.as_str() == "encrypt" && st.keyslot.resilience.shift() != 0)
}

/// The start-state parameters the command line asks for (resilience `checksum` unless told).
fn params(a: &ReencryptArgs) -> Result<ReencryptParams> {
    Ok(ReencryptParams {
        cipher: a.cipher.clone(),
        key_bytes: a.key_size.map(|b| b / 8),
        sector_size: a.sector_size,
        resilience: a.resilience.clone().unwrap_or_else(|| "checksum".into()),
        resilience_hash: a.resilience_hash.clone(),
        key_slot: a.key_slot,
        pbkdf: a.pbkdf.params()?,
        kdf_limits: a.kdf_limits.limits(),
        layout: EncryptLayout {
            metadata_size: a.luks2_metadata_size,
            keyslots_size: a.luks2_keyslots_size,
            offset: a.offset.map(|o| o.saturating_mul(512)),
            reduce_device_size: a.reduce_device_size.filter(|_| a.header.is_some()),
            hotzone_size: a.hotzone_size,
        },
    })
}

/// `reencrypt --encrypt --header FILE DEVICE` (with `--reduce-device-size R`, cryptsetup
/// 2.6.1's in-place encryption with `datashift` hotzones): checks the layout options
/// against the device, refuses a data device or header file that is already LUKS, then
/// formats the detached header (created, or grown to the header's length) with the
/// encryption start state and runs it unless `--init-only`. A header file made here is
/// removed again when the initialization fails.
fn encrypt(a: ReencryptArgs) -> Result<()> {
    let header = a.header.clone().unwrap_or_default();
    check_key_size(&a)?;
    let data = open_meta(&a.device, false)?;
    let params = params(&a)?;
    // Refuse a LUKS data device before the header file is created or touched.
    if volume::luks::probe(&*data.device).map_err(luks_err(&a.device))?.is_some() {
        bail!(UsageError(format!("Device {} is already LUKS device. Aborting operation.", a.device)));
    }
    let exists = std::path::Path::new(&header).exists();
    if exists && std::fs::metadata(&header).is_ok_and(|m| m.len() > 0) && is_luks(&header)? {
        bail!(UsageError(format!("Device {header} is already LUKS device. Aborting operation.")));
    }
    let (fp, _, _, _) = reencrypt::plan_encrypt(data.device.geometry().size, &params)
        .map_err(|e| anyhow::Error::from(UsageError(crate::errors::message(&e))))?;
    let asked = params.layout.keyslots_size.or_else(|| {
        params.layout.reduce_device_size.map(|r| r - 2 * params.layout.metadata_size.unwrap_or(16 << 10))
    });
    super::luks::keyslots_warnings(
        volume::luks::header_size(&fp) - 2 * fp.metadata_size.unwrap_or(16 << 10),
        asked,
    );
    let so = volume::OpenOptions { lock: true, ..Default::default() }.storage();
    let meta = volume::luks::open_header_for_format(&header, &fp, &so)?;
    let made = with_passphrase(&a.key, "Enter passphrase: ", |p| {
        let (luks, slot) = reencrypt::init_encrypt(&*meta.device, &*data.device, p, &params)
            .map_err(luks_err(&header))
            .context("initializing LUKS2 encryption")?;
        log::info!("encrypt: volume key in keyslot {slot}");
        Ok((luks, p.clone()))
    });
    let (mut luks, pass) = match made {
        Ok(m) => m,
        Err(e) => {
            if !exists {
                drop(meta);
                let _ = std::fs::remove_file(&header);
            }
            return Err(e);
        }
    };
    if a.init_only {
        return Ok(());
    }
    run_to_end(&a, &meta, &*data.device, &mut luks, &pass, &header)
}

/// `reencrypt --encrypt --reduce-device-size R DEVICE`: encrypts the plaintext DEVICE in
/// place, its header in the first R/2 bytes and the data moved up by as much (see
/// `reencrypt::init_encrypt_shift`), then runs it unless `--init-only`.
fn encrypt_shift(a: ReencryptArgs, mut reduce: u64) -> Result<()> {
    check_key_size(&a)?;
    // cryptsetup: --offset is the header's size here, at most half the reduction; a
    // smaller one makes the reduction twice it.
    if let Some(o) = a.offset.filter(|o| *o != 0) {
        if o > reduce / 1024 {
            bail!(UsageError(
                "Requested data offset must be less than or equal to half of --reduce-device-size parameter."
                    .into()
            ));
        }
        if o < reduce / 1024 {
            reduce = o * 1024;
            println!("Adjusting --reduce-device-size value to twice the --offset {} (sectors).", o * 2);
        }
    }
    let dev = open_meta(&a.device, false)?;
    let size = dev.device.geometry().size;
    if reduce > size {
        bail!(UsageError(format!(
            "Device {} is too small.\nFailed to initialize LUKS2 reencryption in metadata.",
            a.device
        )));
    }
    let mut params = params(&a)?;
    params.resilience = "datashift".into();
    let (_, ks) = reencrypt::shift_header_layout(&params.layout, reduce / 2)
        .map_err(|e| anyhow::Error::from(UsageError(crate::errors::message(&e))))?;
    super::luks::keyslots_warnings(ks, a.luks2_keyslots_size);
    let (mut luks, pass) = with_passphrase(&a.key, "Enter passphrase: ", |p| {
        let (luks, slot) = reencrypt::init_encrypt_shift(&*dev.device, p, &params, reduce)
            .map_err(luks_err(&a.device))
            .context("initializing LUKS2 encryption")?;
        log::info!("encrypt: volume key in keyslot {slot}");
        Ok((luks, p.clone()))
    })?;
    if a.init_only {
        return Ok(());
    }
    run_to_end(&a, &dev, &*dev.device, &mut luks, &pass, &a.device)
}

/// `reencrypt --decrypt --header NEW DEVICE` of a LUKS2 DEVICE whose header is on it: the
/// header moves to the new file NEW (created here, as long as the header and its keyslots
/// area) and the data to the start of DEVICE (see `reencrypt::init_decrypt_shift`), then
/// the decryption runs unless `--init-only`. NEW is removed again when the init fails
/// before writing anything to DEVICE (a wrong passphrase, bad options).
fn decrypt_shift(a: ReencryptArgs, header: String) -> Result<()> {
    let dev = open_meta(&a.device, false)?;
    let luks = Luks::load(&*dev.device, false).map_err(luks_err(&a.device))?;
    let volume::luks::LuksHeader::V2(s) = &luks.header else {
        bail!(UsageError("Reencryption is supported only for LUKS2 in this version of sealdisk.".into()));
    };
    let hdr_len = s.header.metadata.metadata_and_keyslots_size();
    let params = params(&a)?;
    {
        use std::os::unix::fs::OpenOptionsExt;
        let f = std::fs::OpenOptions::new()
            .write(true)
            .create_new(true)
            .mode(0o600)
            .open(&header)
            .with_context(|| format!("creating the header file {header}"))?;
        f.set_len(hdr_len).with_context(|| format!("sizing the header file {header}"))?;
    }
    let meta = match open_meta(&header, false) {
        Ok(m) => m,
        Err(e) => {
            let _ = std::fs::remove_file(&header);
            return Err(e);
        }
    };
    let r = with_passphrase(&a.key, "Enter passphrase for key slot: ", |p| {
        let luks = reencrypt::init_decrypt_shift(&*meta.device, &*dev.device, p, &params)
            .map_err(luks_err(&a.device))
            .context("initializing LUKS2 decryption")?;
        Ok((luks, p.clone()))
    });
    let (mut luks, pass) = match r {
        Ok(made) => made,
        Err(e) => {
            // Nothing reached DEVICE unless its header is gone (the copy in NEW is then the
            // only one: keep it).
            if is_luks(&a.device).unwrap_or(false) {
                let _ = std::fs::remove_file(&header);
            }
            return Err(e);
        }
    };
    if a.init_only {
        return Ok(());
    }
    run_to_end(&a, &meta, &*dev.device, &mut luks, &pass, &header)
}

/// `--key-size` in whole bytes.
fn check_key_size(a: &ReencryptArgs) -> Result<()> {
    if a.key_size.is_some_and(|b| volume::luks::key_bytes(b).is_err()) {
        bail!(UsageError("Key size must be a multiple of 8 bits".into()));
    }
    Ok(())
}

fn data_dev_meta(s: &volume::Storage) -> &dyn blockdev::BlockDevice {
    &*s.device
}

/// Online reencryption (cryptsetup's `reencrypt` of an active device): the server of
/// `name` runs it; this shows its progress until it ends.
fn online(a: &ReencryptArgs, name: &str, decrypt_header: Option<String>) -> Result<()> {
    use crate::control::{client, proto};
    let pass = super::luks::passphrase(&a.key, "Enter passphrase for key slot: ")?;
    let p = &a.pbkdf;
    let req = proto::Reencrypt {
        secret_len: 0,
        init_only: a.init_only,
        resume_only: a.resume_only,
        cipher: a.cipher.clone(),
        key_bytes: a.key_size.map(|b| b / 8),
        sector_size: a.sector_size,
        key_slot: a.key_slot,
        resilience: a.resilience.clone(),
        resilience_hash: a.resilience_hash.clone(),
        hotzone_size: a.hotzone_size,
        pbkdf: p.pbkdf.clone(),
        hash: p.hash.clone(),
        iter_time_ms: p.iter_time,
        pbkdf_force_iterations: p.pbkdf_force_iterations,
        pbkdf_memory: p.pbkdf_memory,
        pbkdf_parallel: p.pbkdf_parallel,
        decrypt_header,
    };
    client::reencrypt(name, req, pass.as_bytes())?;
    if a.init_only {
        return Ok(());
    }
    let mut progress = Progress::new(a.progress_frequency);
    loop {
        let st = client::status_of(name).with_context(|| format!("following the reencryption of {name}"))?;
        let Some(r) = st.reencryption else { bail!("{name}'s server reports no reencryption") };
        progress.update(r.done, r.total);
        match r.state.as_str() {
            "running" => {}
            "finished" => break,
            "interrupted" => {
                progress.finish();
                eprintln!("Reencryption was interrupted; run `sealdisk reencrypt {}` to resume.", a.device);
                return Ok(());
            }
            _ => {
                progress.finish();
                bail!("reencrypting {name}: {}", r.error.unwrap_or_else(|| r.state.clone()));
            }
        }
        if crate::hardening::stop_requested().is_some() {
            progress.finish();
            eprintln!("The reencryption goes on in {name}'s server: `sealdisk status {name}` shows it.");
            return Ok(());
        }
        std::thread::sleep(Duration::from_millis(200));
    }
    progress.finish();
    Ok(())
}
