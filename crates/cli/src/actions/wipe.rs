//! Long wipes: their progress (a bar on a terminal, or cryptsetup's `--progress-frequency`
//! lines), their interruption by SIGINT/SIGTERM, and `luksResumeWipe`, which finishes a
//! stopped `luksFormat --integrity` wipe.
//!
//! ```text
//!   luksFormat --integrity ── header written ── "Wiping device ..." ── wipe (1 MiB chunks)
//!                                                                       │ SIGINT/SIGTERM
//!                                                                       ▼ (hardening.rs)
//!                 stop requested ─► the chunk in flight ends, flush ─► exit 6 with the state
//!                 ("wiped 37.5%: bytes 0..N") and the command that finishes it:
//!   luksResumeWipe --from N DEVICE ── unlock ── wipe N.. ── exit 0
//! ```
//!
//! The library stays free of any UI: `volume::format` and `volume::luks::wipe_integrity`
//! take a `FnMut(done, total) -> ControlFlow<()>`, [`Progress::step`] is that callback.

use std::io::IsTerminal;
use std::ops::ControlFlow;
use std::time::{Duration, Instant};

use anyhow::{bail, Context, Result};
use clap::Args;
use volume::luks::{self, Luks, WipeEnd};

use super::luks::{luks_err, open_meta, passphrase, KdfLimitArgs, KeyArgs};
use super::UsageError;

/// Exit status of a wipe stopped by SIGINT/SIGTERM: the header is written and unlocks, the
/// volume is wiped only in part (distinct from 130/143, "nothing was written").
pub const WIPE_INTERRUPTED: u8 = 6;

/// A wipe stopped by a signal; the message says how far it got and how to finish it.
#[derive(Debug, thiserror::Error)]
#[error("{0}")]
pub struct WipeInterrupted(pub String);

/// How progress is shown.
#[derive(Debug, Clone, Args)]
pub struct ProgressArgs {
    /// Print a progress line (percent, ETA, bytes written, speed) every SECONDS instead of
    /// the bar, also when stderr is not a terminal (cryptsetup's option). The bar is drawn
    /// only on a terminal.
    #[arg(long, value_name = "SECONDS")]
    pub progress_frequency: Option<u64>,
}

/// The progress of one wipe; [`step`](Self::step) is the library's callback.
pub struct Progress {
    bar: Option<indicatif::ProgressBar>,
    every: Option<Duration>,
    start: Instant,
    last: Instant,
    /// Bytes done at the first call (a resumed wipe starts past 0).
    first: Option<u64>,
}

impl Progress {
    /// Nothing if `hidden`; else lines every `every` seconds if given, else a bar when
    /// stderr is a terminal.
    pub fn new(every: Option<u64>, hidden: bool) -> Self {
        let every = every.filter(|_| !hidden);
        let bar = (!hidden && every.is_none() && std::io::stderr().is_terminal()).then(|| {
            let b = indicatif::ProgressBar::new(0);
            b.set_style(
                indicatif::ProgressStyle::with_template(
                    "Wiping {bar:40} {bytes}/{total_bytes} {binary_bytes_per_sec} ETA {eta}",
                )
                .unwrap_or_else(|_| indicatif::ProgressStyle::default_bar()),
            );
            b
        });
        let now = Instant::now();
        Progress { bar, every: every.map(Duration::from_secs), start: now, last: now, first: None }
    }

    /// Shows `done` of `total` bytes; `Break` once a signal asked the wipe to stop.
    pub fn step(&mut self, done: u64, total: u64) -> ControlFlow<()> {
        self.show(done, total);
        match crate::hardening::stop_requested() {
            Some(_) => ControlFlow::Break(()),
            None => ControlFlow::Continue(()),
        }
    }

    fn show(&mut self, done: u64, total: u64) {
        let first = *self.first.get_or_insert(done);
        if let Some(b) = &self.bar {
            if b.length() != Some(total) {
                b.set_length(total);
                b.set_position(done);
                b.reset_eta();
            }
            b.set_position(done);
        }
        let Some(every) = self.every else { return };
        if done != total && self.last.elapsed() < every {
            return;
        }
        self.last = Instant::now();
        let secs = self.start.elapsed().as_secs_f64().max(1e-3);
        let rate = done.saturating_sub(first) as f64 / secs;
        let eta = if rate > 0.0 { (total.saturating_sub(done) as f64 / rate) as u64 } else { 0 };
        let pct = if total == 0 { 100.0 } else { done as f64 * 100.0 / total as f64 };
        eprintln!(
            "Progress: {pct:5.1}%, ETA {:02}:{:02}, {} MiB written, speed {:5.1} MiB/s",
            eta / 60,
            eta % 60,
            done.saturating_sub(first) >> 20,
            rate / (1 << 20) as f64
        );
    }

    /// Clears the bar.
    pub fn finish(self) {
        if let Some(b) = self.bar {
            b.finish_and_clear();
        }
    }
}

/// Runs `wipe` with SIGINT/SIGTERM turned into a stop request (polled by [`Progress::step`]).
pub fn stoppable<T>(wipe: impl FnOnce() -> T) -> T {
    crate::hardening::wiping(true);
    let r = wipe();
    crate::hardening::wiping(false);
    r
}

/// The error of a LUKS wipe stopped at `wiped` of `total` bytes: the state, how to finish,
/// how to roll back.
pub fn interrupted(
    device: &str,
    header: Option<&str>,
    no_journal: bool,
    wiped: u64,
    total: u64,
) -> anyhow::Error {
    let sig = crate::hardening::stop_requested().unwrap_or(0);
    let pct = if total == 0 { 100.0 } else { wiped as f64 * 100.0 / total as f64 };
    let mut cmd = format!("sealdisk luksResumeWipe --from {wiped}");
    if let Some(h) = header {
        cmd.push_str(&format!(" --header {h}"));
    }
    if no_journal {
        cmd.push_str(" --integrity-no-journal");
    }
    cmd.push_str(&format!(" {device}"));
    WipeInterrupted(format!(
        "Wipe interrupted by signal {sig}: {pct:.1}% of {device} wiped (volume bytes 0..{wiped} of \
         {total}, flushed).\nThe LUKS header is written and unlocks; sectors from byte {wiped} on read \
         as integrity errors (EIO) until written.\nTo finish the wipe: {cmd}\nTo roll back: sealdisk \
         erase {} (destroys every keyslot), or run luksFormat again.",
        header.unwrap_or(device)
    ))
    .into()
}

/// Arguments of `luksResumeWipe`.
#[derive(Debug, Args)]
#[command(after_help = "\
Example (after an interrupted `luksFormat --integrity` printed --from 402653184):
  sealdisk luksResumeWipe --from 402653184 --key-file pass disk.img")]
pub struct ResumeWipeArgs {
    /// Volume byte offset to resume from, as the interrupted wipe printed it (a multiple of
    /// the sector size); 0 wipes the whole volume again.
    #[arg(long, value_name = "BYTES", default_value_t = 0)]
    pub from: u64,
    /// The detached LUKS header, if the volume has one.
    #[arg(long, value_name = "FILE")]
    pub header: Option<String>,
    #[command(flatten)]
    pub key: KeyArgs,
    /// Try only this keyslot.
    #[arg(long, short = 'S')]
    pub key_slot: Option<u32>,
    #[command(flatten)]
    pub kdf_limits: KdfLimitArgs,
    /// Wipe without the dm-integrity journal (faster).
    #[arg(long)]
    pub integrity_no_journal: bool,
    #[command(flatten)]
    pub progress: ProgressArgs,
    /// The device, then optionally a key file with the passphrase.
    #[arg(value_name = "DEVICE [KEYFILE]", required = true, num_args = 1..=2)]
    pub positional: Vec<String>,
}

/// Runs `luksResumeWipe`: unlocks the authenticated LUKS2 volume and wipes it from `--from`.
pub fn resume(a: ResumeWipeArgs) -> Result<()> {
    let device = a.positional[0].clone();
    let meta_path = a.header.clone().unwrap_or_else(|| device.clone());
    let meta = open_meta(&meta_path, true)?;
    let l = Luks::load(&*meta.device, false).map_err(luks_err(&meta_path))?;
    let Some(spec) = l.aead().map_err(luks_err(&meta_path))? else {
        bail!(UsageError(format!(
            "{meta_path} has no integrity segment (not luksFormat --integrity): nothing to wipe"
        )));
    };
    let sector = u64::from(l.segment().map_err(luks_err(&meta_path))?.sector_size);
    if !a.from.is_multiple_of(sector) {
        bail!(UsageError(format!("--from {} is not a multiple of the sector size {sector}", a.from)));
    }
    // The data device must open for writing before the passphrase is asked for.
    let data = volume::storage::open(&device, &volume::StorageOptions::default())?;
    let key_file = a.positional.get(1).cloned().or(a.key.key_file.clone());
    let keys = KeyArgs { key_file, ..a.key.clone() };
    let pass = passphrase(&keys, &format!("Enter passphrase for {device}: "))?;
    let (slot, vk) = l
        .unlock_with(&*meta.device, &pass, a.key_slot, &a.kdf_limits.limits())
        .map_err(luks_err(&meta_path))?;
    drop(pass);
    log::info!("Key slot {slot} unlocked; wiping {spec} volume {device} from byte {}.", a.from);
    let mut progress = Progress::new(a.progress.progress_frequency, false);
    let end = stoppable(|| {
        eprintln!("Wiping device to initialize integrity checksum from byte {}.", a.from);
        luks::wipe_integrity(data.device, &l, &vk, a.integrity_no_journal, a.from, |d, t| progress.step(d, t))
    });
    progress.finish();
    match end.map_err(luks_err(&device)).with_context(|| format!("wiping {device}"))? {
        WipeEnd::Done => Ok(()),
        WipeEnd::Stopped { wiped, total } => {
            Err(interrupted(&device, a.header.as_deref(), a.integrity_no_journal, wiped, total))
        }
    }
}
