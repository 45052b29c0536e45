//! `sealdisk integrity format|open|dump|status`: integritysetup-shaped dm-integrity volumes.
//!
//! Option names and defaults are integritysetup 2.6's. The internal hash is not stored in the
//! superblock, so `open` needs `-I` (and the key) again, as with integritysetup.
//!
//! Status of a served volume: `open --status-file PATH` rewrites PATH every second (and at
//! exit) with `key: value` lines (mode, mismatches, provided_data_sectors, recalc_sector,
//! poisoned, engine counters); `sealdisk integrity status PATH` prints it; SIGUSR1 logs the
//! dmsetup-style status line (`<mismatches> <provided_data_sectors> <recalc_sector|->`).
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use anyhow::{bail, Context, Result};
use clap::{Args, Subcommand};
use sector_crypto::secure::SecretBuf;
use volume::integrity::{HashMode, IntegrityParams, IntegrityStatus, Mode};

use super::wipe::Progress;
use super::UsageError;
use crate::serve::ServeArgs;

/// `sealdisk integrity ...`.
#[derive(Debug, Args)]
pub struct IntegrityArgs {
    #[command(subcommand)]
    action: IntegrityAction,
}

impl IntegrityArgs {
    /// Whether this is `integrity open --daemon`.
    pub fn daemon_requested(&self) -> bool {
        matches!(&self.action, IntegrityAction::Open(o) if o.serve.daemon)
    }
}

#[derive(Debug, Subcommand)]
enum IntegrityAction {
    /// Format DEVICE (superblock, journal, and a wipe that writes valid tags).
    Format(Box<FormatArgs>),
    /// Open DEVICE and serve it as NAME over NBD until SIGINT/SIGTERM.
    Open(Box<OpenArgs>),
    /// Print the superblock as `integritysetup dump` does.
    Dump(DumpArgs),
    /// Print the status file a served volume writes (`open --status-file`).
    Status(StatusArgs),
}

/// integritysetup's options that format and open both use.
#[derive(Debug, Clone, Args)]
struct IntegrityOpts {
    /// Data integrity algorithm (crc32c, crc32, xxhash64, sha1, sha256, sha512, blake2b-256,
    /// hmac-sha1, hmac-sha256, hmac-sha512). Not stored on disk: open needs the same one.
    #[arg(short = 'I', long, default_value = "crc32c")]
    integrity: String,
    /// Read the integrity key from a file.
    #[arg(long, value_name = "FILE")]
    integrity_key_file: Option<String>,
    /// The size of the data integrity key in bytes (integritysetup's help says BITS; it
    /// reads bytes). Default: the whole key file.
    #[arg(long, value_name = "BYTES")]
    integrity_key_size: Option<usize>,
    /// Tag size (per-sector), default the digest size (open: the superblock's).
    #[arg(short = 't', long)]
    tag_size: Option<u32>,
    /// Metadata buffer size in sectors.
    #[arg(long, default_value_t = 128)]
    buffer_sectors: u32,
    /// Number of 512-byte sectors per bit (bitmap mode).
    #[arg(long)]
    bitmap_sectors_per_bit: Option<u64>,
    /// Journal integrity algorithm (`journal_mac`): hmac-sha1, hmac-sha256, hmac-sha512, or an
    /// unkeyed hash (crc32c, sha256, ...).
    #[arg(long, value_name = "ALG")]
    journal_integrity: Option<String>,
    /// Read the journal integrity key from a file.
    #[arg(long, value_name = "FILE")]
    journal_integrity_key_file: Option<String>,
    /// The size of the journal integrity key in bytes (as integritysetup reads it; its help
    /// says BITS). Default: the whole key file.
    #[arg(long, value_name = "BYTES")]
    journal_integrity_key_size: Option<usize>,
    /// Journal encryption algorithm (`journal_crypt`): ctr-aes or cbc-aes.
    #[arg(long, value_name = "ALG")]
    journal_crypt: Option<String>,
    /// Read the journal encryption key from a file.
    #[arg(long, value_name = "FILE")]
    journal_crypt_key_file: Option<String>,
    /// The size of the journal encryption key in bytes (16, 24 or 32). Default: the whole
    /// key file.
    #[arg(long, value_name = "BYTES")]
    journal_crypt_key_size: Option<usize>,
    /// sealdisk knob: always read a metadata buffer before modifying it, even when a write
    /// covers it whole (to measure the read-modify-write cost).
    #[arg(long)]
    perf_always_rmw: bool,
    /// sealdisk knob: where tags are computed: auto (inline up to 64 KiB), inline, pool.
    #[arg(long, value_enum, default_value = "auto")]
    perf_hash_mode: HashModeArg,
}

/// integritysetup's options that only format uses (they are written to the superblock).
#[derive(Debug, Clone, Args)]
struct FormatOpts {
    /// Sector size (integrity block size).
    #[arg(short = 's', long, default_value_t = 512)]
    sector_size: u32,
    /// Interleave sectors.
    #[arg(long, default_value_t = 32768)]
    interleave_sectors: u32,
    /// Journal size in bytes.
    #[arg(short = 'j', long)]
    journal_size: Option<u64>,
    /// Use inefficient legacy padding (old kernels).
    #[arg(long)]
    integrity_legacy_padding: bool,
    /// Do not protect the superblock with HMAC (old kernels).
    #[arg(long)]
    integrity_legacy_hmac: bool,
    /// Do not ask for confirmation (it is asked only when stdin is a terminal).
    #[arg(short = 'q', long)]
    batch_mode: bool,
}

/// integritysetup's options that only open uses (the activation's mode and tunables).
#[derive(Debug, Clone, Args)]
struct OpenOpts {
    /// Use a bitmap to track changes and disable the journal.
    #[arg(short = 'B', long = "integrity-bitmap-mode")]
    bitmap: bool,
    /// Disable the journal (direct writes).
    #[arg(short = 'D', long = "integrity-no-journal")]
    no_journal: bool,
    /// Recovery mode (no journal, no tag checking, read-only).
    #[arg(short = 'R', long = "integrity-recovery-mode")]
    recovery: bool,
    /// Journal watermark (percent).
    #[arg(long, default_value_t = 50)]
    journal_watermark: u32,
    /// Journal commit time in ms.
    #[arg(long, default_value_t = 10000)]
    journal_commit_time: u64,
    /// Allow discards (TRIM).
    #[arg(long)]
    allow_discards: bool,
    /// Bitmap mode flush time in ms.
    #[arg(long, default_value_t = 10000)]
    bitmap_flush_time: u64,
    /// Recalculate tags automatically (in the background, from recalc_sector).
    #[arg(long)]
    integrity_recalculate: bool,
}

impl OpenOpts {
    fn mode(&self) -> Result<Mode> {
        Ok(match (self.bitmap, self.no_journal, self.recovery) {
            (false, false, false) => Mode::Journal,
            (true, false, false) => Mode::Bitmap,
            (false, true, false) => Mode::Direct,
            (false, false, true) => Mode::Recovery,
            _ => bail!(UsageError("-B, -D and -R are mutually exclusive".into())),
        })
    }
}

#[derive(Debug, Clone, Copy, clap::ValueEnum)]
enum HashModeArg {
    Auto,
    Inline,
    Pool,
}

/// A key read from a file, if any.
type Key = Option<SecretBuf>;

/// The most key-file bytes read without `--*-key-size` (cryptsetup's key-file ceiling).
const KEY_FILE_MAX: usize = 8 << 20;

/// Reads a key file into secret memory, cut to `size` bytes when given.
pub(crate) fn read_key(file: &str, size: Option<usize>) -> Result<SecretBuf> {
    let limit = size.unwrap_or(KEY_FILE_MAX + 1);
    let k = crate::keys::read_key_file(file, 0, limit)?;
    match size {
        Some(n) if k.len() < n => {
            bail!(UsageError(format!("key file {file} holds {} bytes, need {n}", k.len())))
        }
        None if k.len() > KEY_FILE_MAX => {
            bail!(UsageError(format!("key file {file} is larger than {KEY_FILE_MAX} bytes")))
        }
        _ => Ok(k),
    }
}

impl IntegrityOpts {
    fn journal_keys(&self) -> Result<(Key, Key)> {
        let mac_key = match (&self.journal_integrity, &self.journal_integrity_key_file) {
            (Some(_), Some(f)) => Some(read_key(f, self.journal_integrity_key_size)?),
            (Some(a), None) if a.starts_with("hmac") => {
                bail!(UsageError(format!("{a} needs --journal-integrity-key-file")))
            }
            (None, Some(_)) => {
                bail!(UsageError("--journal-integrity-key-file needs --journal-integrity".into()))
            }
            _ => None,
        };
        let crypt_key = match (&self.journal_crypt, &self.journal_crypt_key_file) {
            (Some(_), Some(f)) => Some(read_key(f, self.journal_crypt_key_size)?),
            (Some(a), None) => bail!(UsageError(format!("{a} needs --journal-crypt-key-file"))),
            (None, Some(_)) => bail!(UsageError("--journal-crypt-key-file needs --journal-crypt".into())),
            (None, None) => None,
        };
        Ok((mac_key, crypt_key))
    }

    /// The volume parameters: these options, plus format's or open's own (integritysetup's
    /// defaults for the other side's).
    fn params(&self, f: Option<&FormatOpts>, o: Option<&OpenOpts>) -> Result<IntegrityParams> {
        let (journal_integrity_key, journal_crypt_key) = self.journal_keys()?;
        let key = match &self.integrity_key_file {
            Some(f) => Some(read_key(f, self.integrity_key_size)?),
            None if self.integrity.starts_with("hmac") => {
                bail!(UsageError(format!("{} needs --integrity-key-file", self.integrity)))
            }
            None => None,
        };
        let mut p = IntegrityParams {
            integrity: self.integrity.clone(),
            key,
            tag_size: self.tag_size,
            buffer_sectors: self.buffer_sectors,
            bitmap_sectors_per_bit: self.bitmap_sectors_per_bit,
            lock: true,
            skip_rmw: !self.perf_always_rmw,
            hash_mode: match self.perf_hash_mode {
                HashModeArg::Auto => HashMode::Auto,
                HashModeArg::Inline => HashMode::Inline,
                HashModeArg::Pool => HashMode::Pool,
            },
            journal_integrity: self.journal_integrity.clone(),
            journal_integrity_key,
            journal_crypt: self.journal_crypt.clone(),
            journal_crypt_key,
            ..IntegrityParams::default()
        };
        if let Some(f) = f {
            p.sector_size = f.sector_size;
            p.interleave_sectors = f.interleave_sectors;
            p.journal_size = f.journal_size;
            p.legacy_padding = f.integrity_legacy_padding;
            p.legacy_hmac = f.integrity_legacy_hmac;
        }
        if let Some(o) = o {
            p.mode = o.mode()?;
            p.journal_watermark = o.journal_watermark;
            p.journal_commit_time = o.journal_commit_time;
            p.allow_discards = o.allow_discards;
            p.bitmap_flush_time = o.bitmap_flush_time;
            p.recalculate = o.integrity_recalculate;
        }
        Ok(p)
    }
}

#[derive(Debug, Args)]
struct FormatArgs {
    #[command(flatten)]
    opts: IntegrityOpts,
    #[command(flatten)]
    format: FormatOpts,
    /// Do not wipe the device after format (tags stay invalid until written).
    #[arg(long)]
    no_wipe: bool,
    /// Hide the progress bar.
    #[arg(long)]
    no_progress: bool,
    #[command(flatten)]
    progress: super::wipe::ProgressArgs,
    /// The device (file or block device) to format.
    device: String,
}

#[derive(Debug, Args)]
struct OpenArgs {
    #[command(flatten)]
    opts: IntegrityOpts,
    #[command(flatten)]
    open: OpenOpts,
    /// Serve read-only.
    #[arg(long, short = 'r')]
    readonly: bool,
    /// Rewrite this file every second with the volume's status.
    #[arg(long, value_name = "PATH")]
    status_file: Option<String>,
    /// The dm-integrity device.
    device: String,
    /// Export name.
    name: String,
    #[command(flatten)]
    serve: ServeArgs,
}

#[derive(Debug, Args)]
struct DumpArgs {
    /// The dm-integrity device.
    device: String,
}

#[derive(Debug, Args)]
struct StatusArgs {
    /// The status file written by `integrity open --status-file`.
    status_file: String,
}

/// Runs `sealdisk integrity ...`.
pub fn run(a: IntegrityArgs) -> Result<()> {
    match a.action {
        IntegrityAction::Format(f) => format(*f),
        IntegrityAction::Open(o) => open(*o),
        IntegrityAction::Dump(d) => {
            print!("{}", volume::integrity::dump(&d.device)?);
            Ok(())
        }
        IntegrityAction::Status(s) => {
            let text = std::fs::read_to_string(&s.status_file)
                .with_context(|| format!("reading status file {}", s.status_file))?;
            print!("{text}");
            Ok(())
        }
    }
}

/// `1.8 GiB` / `512 MiB` as cryptsetup's progress lines print sizes.
fn size_str(bytes: u64) -> String {
    const GIB: u64 = 1 << 30;
    if bytes >= GIB {
        format!("{} GiB", bytes / GIB)
    } else {
        format!("{} MiB", bytes >> 20)
    }
}

fn speed_str(bytes_per_s: f64) -> String {
    const GIB: f64 = (1u64 << 30) as f64;
    if bytes_per_s >= GIB {
        format!("{:.1} GiB/s", bytes_per_s / GIB)
    } else {
        format!("{:.1} MiB/s", bytes_per_s / (1 << 20) as f64)
    }
}

fn format(a: FormatArgs) -> Result<()> {
    let p = a.opts.params(Some(&a.format), None)?;
    // integritysetup's yesDialog: asked only on a terminal, never with -q.
    super::luks::confirm(
        &format!("This will overwrite data on {} irrevocably.", a.device),
        a.format.batch_mode,
    )?;
    let mut salt = [0u8; 16];
    rand::fill(&mut salt);
    let mut progress = Progress::new(a.progress.progress_frequency, a.no_progress || a.no_wipe);
    let start = Instant::now();
    // SIGINT/SIGTERM during the wipe stop it after the chunks in flight (hardening.rs).
    super::ensure_device(&a.device)?;
    let so =
        volume::StorageOptions { direct: p.direct, lock: blockdev::FileLock::Exclusive, read_only: false };
    let storage = volume::storage::open(&a.device, &so)?;
    let spec = volume::FormatSpec::Integrity { params: p.clone(), salt, no_wipe: a.no_wipe };
    let formatted =
        super::wipe::stoppable(|| volume::format(spec, &storage, |done, total| progress.step(done, total)))
            .with_context(|| format!("formatting {}", a.device))?;
    progress.finish();
    let volume::Formatted::Integrity(report) = formatted else {
        bail!("integrity format made something other than a dm-integrity volume");
    };
    let sb = &report.superblock;
    println!("Formatted with tag size {}, internal integrity {}.", sb.integrity_tag_size, p.integrity);
    if report.wipe_stopped {
        let sig = crate::hardening::stop_requested().unwrap_or(0);
        let total = report.layout.provided_data_sectors * 512;
        let pct = if total == 0 { 100.0 } else { report.wiped_bytes as f64 * 100.0 / total as f64 };
        bail!(super::wipe::WipeInterrupted(format!(
            "Wipe interrupted by signal {sig}: {pct:.1}% of {} wiped (bytes 0..{} of {total}, flushed).\nThe \
             superblock and journal are written and the volume opens; sectors from byte {} on read as integrity \
             errors (EIO) until written.\nTo finish: run `sealdisk integrity format` again with the same options \
             (it formats anew and wipes the whole device), or write every sector before reading it.",
            a.device, report.wiped_bytes, report.wiped_bytes
        )));
    }
    if !a.no_wipe {
        let secs = start.elapsed().as_secs_f64();
        let t = start.elapsed().as_secs();
        println!(
            "Finished, time {:02}m{:02}s, {} written, speed {}",
            t / 60,
            t % 60,
            size_str(report.wiped_bytes),
            speed_str(report.wiped_bytes as f64 / secs.max(1e-9))
        );
    }
    Ok(())
}

fn status_text(s: &IntegrityStatus) -> String {
    let recalc = s.recalc_sector.map(|r| r.to_string()).unwrap_or_else(|| "-".into());
    format!(
        "mode: {}\nmismatches: {}\nprovided_data_sectors: {}\nrecalc_sector: {recalc}\npoisoned: {}\n\
         metadata_reads: {}\nrmw_reads: {}\nmetadata_writes: {}\njournal_commits: {}\n\
         journal_copyouts: {}\njournal_pending_blocks: {}\nbitmap_regions_pending: {}\n\
         dmsetup_status: {s}\n",
        s.mode.letter(),
        s.mismatches,
        s.provided_data_sectors,
        s.poisoned,
        s.metadata_reads,
        s.rmw_reads,
        s.metadata_writes,
        s.journal_commits,
        s.journal_copyouts,
        s.journal_pending_blocks,
        s.bitmap_regions_pending,
    )
}

fn write_status(path: &str, s: &IntegrityStatus) {
    let tmp = format!("{path}.tmp");
    let r = std::fs::write(&tmp, status_text(s)).and_then(|_| std::fs::rename(&tmp, path));
    if let Err(e) = r {
        log::warn!("writing status file {path}: {e}");
    }
}

fn open(a: OpenArgs) -> Result<()> {
    let mut p = a.opts.params(None, Some(&a.open))?;
    p.read_only = a.readonly || p.mode == Mode::Recovery;
    p.direct = a.serve.direct;
    let listener = crate::serve::listen(&a.serve)?;
    super::ensure_device(&a.device)?;
    let so = volume::StorageOptions {
        read_only: p.read_only,
        direct: p.direct,
        lock: if p.read_only { blockdev::FileLock::Shared } else { blockdev::FileLock::Exclusive },
    };
    let storage = volume::storage::open(&a.device, &so).with_context(|| format!("opening {}", a.device))?;
    let mut vol = volume::open_storage(
        storage.clone(),
        volume::Spec::Integrity(p.clone()),
        volume::Keys::none(),
        &volume::OpenOptions::default(),
    )
    .with_context(|| format!("opening {}", a.device))?;
    let Some(target) = vol.integrity.clone() else {
        bail!("{}: no dm-integrity layer was opened", a.device);
    };
    // The target served now: `resize NAME` replaces it (control::server::IntegrityRegrow).
    let slot: crate::control::server::IntegritySlot = Arc::new(std::sync::Mutex::new(Some(target)));
    vol.integrity = None;
    let current = |slot: &crate::control::server::IntegritySlot| {
        slot.lock().unwrap_or_else(std::sync::PoisonError::into_inner).clone()
    };
    let done = Arc::new(AtomicBool::new(false));
    let reporter = {
        let (slot, done, path) = (slot.clone(), done.clone(), a.status_file.clone());
        let mut usr1 = signal_hook::iterator::Signals::new([signal_hook::consts::SIGUSR1])
            .context("installing the SIGUSR1 handler")?;
        std::thread::Builder::new()
            .name("integrity-status".into())
            .spawn(move || {
                let mut last: Option<Instant> = None;
                while !done.load(Ordering::Relaxed) {
                    if let (Some(p), Some(t)) = (&path, current(&slot)) {
                        if last.is_none_or(|l| l.elapsed() >= Duration::from_secs(1)) {
                            write_status(p, &t.status());
                            last = Some(Instant::now());
                        }
                    }
                    for _ in usr1.pending() {
                        if let Some(t) = current(&slot) {
                            eprintln!("sealdisk: integrity status: {}", t.status());
                        }
                    }
                    std::thread::sleep(Duration::from_millis(200));
                }
            })
            .context("starting the status thread")?
    };
    let regrow = crate::control::server::IntegrityRegrow {
        storage: storage.clone(),
        params: p.clone(),
        current: slot.clone(),
    };
    let opened =
        volume::OpenOptions { read_only: p.read_only, direct: p.direct, ..volume::OpenOptions::default() };
    let rebuild = crate::control::server::Rebuild {
        regrow: Some(regrow),
        ..crate::control::server::Rebuild::on(storage, opened)
    };
    let r = crate::control::claim(&a.name)
        .and_then(|claim| crate::serve::serve(claim, vol, rebuild, listener, &a.serve, p.read_only));
    done.store(true, Ordering::Relaxed);
    let _ = reporter.join();
    if let (Some(path), Some(t)) = (&a.status_file, current(&slot)) {
        write_status(path, &t.status());
    }
    r
}
