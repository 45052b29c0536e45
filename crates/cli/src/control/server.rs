//! The serving side of the control socket: a [`Live`] volume (its gate, its status, what
//! it needs to rebuild its stack) and the thread that answers requests about it.
//!
//! Everything here runs on control threads; the I/O path only ever sees the [`Gate`].

use std::io::{BufReader, Read, Write};
use std::os::unix::fs::PermissionsExt;
use std::os::unix::net::{UnixListener, UnixStream};
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Condvar, Mutex, OnceLock, PoisonError};
use std::time::Duration;

use anyhow::{Context, Result};
use blockdev::BlockDevice;
use formats::dm::{CryptOptions, CryptTable};
use sector_crypto::kdf::Passphrase;
use sector_crypto::secure::SecretBuf;
use volume::luks::{KdfLimits, LuksVersion};
use volume::{Keys, LayerTable, LuksSpec, OnePassphrase, OpenOptions, Spec, Storage, Volume, VolumeKind};

use super::gate::Gate;
use super::proto::{self, Command, ReencryptProgress, Refresh, Response, Status, MAX_SECRET};
use super::Claim;
use crate::exit;

/// Control connections served at once; more are closed at accept.
const MAX_CONNECTIONS: usize = 16;

/// How long a control client may take to send its request (and take the reply).
const CLIENT_TIMEOUT: Duration = Duration::from_secs(10);

/// What a LUKS volume needs to be unlocked again (`luksResume`).
#[derive(Debug, Clone)]
pub struct LuksResume {
    pub version: LuksVersion,
    /// The header's UUID at open: a resume must find the same volume.
    pub uuid: String,
    pub integrity_no_journal: bool,
    pub integrity_journal: volume::luks::IntegrityJournalTuning,
    pub kdf_limits: KdfLimits,
}

/// Clients held by a data-shift decryption started online until the device mid-run
/// replaces the served one; if the request ends before that, their I/O fails from then on
/// (the old mapping no longer holds for the moved segment).
struct HeldGate<'a> {
    gate: &'a Gate,
    old: Option<Arc<dyn BlockDevice>>,
}

impl Drop for HeldGate<'_> {
    fn drop(&mut self) {
        if self.old.take().is_some() {
            log::error!("the data-shift decryption started but its device was not served: I/O fails");
            self.gate.close_held();
        }
    }
}

/// What the control plane keeps to rebuild a volume's stack on the same storage.
pub struct Rebuild {
    /// The data storage (opened and locked once, at open).
    pub storage: Storage,
    /// A detached header.
    pub header: Option<Storage>,
    pub opts: OpenOptions,
    /// The activation flags now in force.
    pub flags: CryptOptions,
    /// The crypt table (it holds the key) of a volume `refresh` can rebuild from it: plain
    /// and LUKS without integrity. `None` for other kinds, and while suspended.
    pub table: Option<CryptTable>,
    /// LUKS volumes: what `luksResume` needs.
    pub luks: Option<LuksResume>,
    /// Standalone integrity volumes: how `resize` grows them.
    pub regrow: Option<IntegrityRegrow>,
}

impl Rebuild {
    /// What the control plane keeps of a volume on `storage` opened with `opts` whose kind
    /// needs nothing else (no detached header, no LUKS resume, no integrity regrow).
    pub fn on(storage: Storage, opts: OpenOptions) -> Rebuild {
        Rebuild {
            storage,
            header: None,
            opts,
            flags: CryptOptions::default(),
            table: None,
            luks: None,
            regrow: None,
        }
    }
}

/// Where the served volume is reached, filled in by `serve` once it is listening.
pub struct Transport {
    pub kind: &'static str,
    pub address: String,
    pub clients: Option<Box<dyn Fn() -> usize + Send + Sync>>,
    /// Stops serving (the NBD server's graceful shutdown, the FUSE unmount).
    pub stop: Box<dyn Fn() + Send + Sync>,
    /// Tells the transport's kernel side of a new size in bytes (`resize`): the FUSE file's
    /// cached attributes are dropped; ublk updates the disk's capacity. Called after the
    /// swap when growing, before it when shrinking; an error before the swap refuses the
    /// resize. `None`: clients learn the size when they connect (NBD).
    pub resized: Option<ResizeHook>,
}

/// [`Transport::resized`]: tells the kernel side of a new size in bytes.
pub type ResizeHook = Box<dyn Fn(u64) -> Result<(), String> + Send + Sync>;

/// The integrity target a standalone integrity volume serves now (its status thread reads
/// it too); `resize` swaps it.
pub type IntegritySlot = Arc<Mutex<Option<Arc<volume::integrity::IntegrityTarget<Arc<dyn BlockDevice>>>>>>;

/// What a standalone integrity volume needs to be grown while it runs (`resize NAME`).
pub struct IntegrityRegrow {
    /// The storage, opened and locked once.
    pub storage: Storage,
    /// The open options (`-I`, keys, mode).
    pub params: volume::integrity::IntegrityParams,
    /// The target served.
    pub current: IntegritySlot,
}

/// A running volume, as the control plane sees it.
pub struct Live {
    pub name: String,
    gate: Arc<Gate>,
    /// The status fields fixed at open (flags and suspension are filled in when asked).
    base: Status,
    rebuild: Mutex<Option<Rebuild>>,
    /// Standalone integrity volumes: how `resize` grows them.
    regrow: Mutex<Option<IntegrityRegrow>>,
    transport: OnceLock<Transport>,
    /// The outcome of serving (set once the transport stopped and flushed), and whether the
    /// `close` that asked for it has been answered.
    finished: Mutex<(Option<Result<(), String>>, bool)>,
    finished_cv: Condvar,
    /// The online reencryption (its progress is shared with its thread).
    reenc: Arc<Mutex<Job>>,
}

/// An online reencryption run by this server.
#[derive(Default)]
struct Job {
    progress: Option<ReencryptProgress>,
    thread: Option<std::thread::JoinHandle<()>>,
    stop: Arc<std::sync::atomic::AtomicBool>,
    /// The new segment's table: once the run finished, the volume's one table.
    new_table: Option<CryptTable>,
}

impl Job {
    fn running(&self) -> bool {
        self.progress.as_ref().is_some_and(|p| p.state == "running")
    }
}

impl std::fmt::Debug for Live {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Live").field("name", &self.name).finish_non_exhaustive()
    }
}

fn lock<T>(m: &Mutex<T>) -> std::sync::MutexGuard<'_, T> {
    m.lock().unwrap_or_else(PoisonError::into_inner)
}

/// The flag words of `cryptsetup status` for `o`.
fn flag_words(o: &CryptOptions) -> Vec<String> {
    [
        (o.allow_discards, "discards"),
        (o.same_cpu_crypt, "same_cpu_crypt"),
        (o.submit_from_crypt_cpus, "submit_from_crypt_cpus"),
        (o.no_read_workqueue, "no_read_workqueue"),
        (o.no_write_workqueue, "no_write_workqueue"),
        (o.high_priority, "high_priority"),
    ]
    .iter()
    .filter(|(on, _)| *on)
    .map(|(_, w)| w.to_string())
    .collect()
}

impl Live {
    /// A volume assembled by `volume::open` on `rebuild.storage`. Every table of `vol`
    /// (they hold the key) is dropped here, but the one `rebuild` keeps for `refresh`.
    pub fn from_volume(name: &str, vol: Volume, mut rebuild: Rebuild) -> (Arc<Live>, Arc<Gate>) {
        let regrow = rebuild.regrow.take();
        let mut base = Status {
            name: name.to_owned(),
            kind: vol.kind.type_name().to_owned(),
            // cryptsetup shows the device's full path.
            device: std::fs::canonicalize(&rebuild.storage.name)
                .map(|p| p.display().to_string())
                .unwrap_or_else(|_| rebuild.storage.name.clone()),
            read_only: rebuild.opts.read_only,
            ..Status::default()
        };
        if let Some(t) = vol.crypt_table() {
            base.cipher = Some(t.cipher.clone());
            base.keysize_bits = u32::try_from(t.key.len() * 8).ok();
            base.key_location = Some("dm-crypt".into());
            base.sector_size = t.options.sector_size();
            base.offset = t.offset;
            base.size = t.len;
            base.skipped = t.iv_offset;
            base.crypt_mode = Some(rebuild.opts.crypt_mode.name().into());
            rebuild.flags = CryptOptions { integrity_aead: None, ..t.options };
            // One table cannot rebuild a volume mid-reencryption (two segments, two keys):
            // `refresh` and `resize` refuse it as they refuse an authenticated one, and the
            // kinds whose stack is more than a crypt table on the storage (BitLocker's
            // remapped segments, FileVault2's read-only volume, TrueCrypt's offsets).
            let data_layers = vol.layers.iter().filter(|l| !matches!(l, LayerTable::Integrity(_))).count();
            let one_table = matches!(vol.kind, VolumeKind::Plain | VolumeKind::Luks1 | VolumeKind::Luks2);
            if one_table && data_layers == 1 {
                rebuild.table = Some(t.clone());
            }
        } else {
            let g = vol.device.geometry();
            base.sector_size = g.logical_block;
            base.size = g.size / 512;
        }
        for l in &vol.layers {
            if let LayerTable::Integrity(i) = l {
                base.integrity = Some(i.internal_hash.clone().unwrap_or_else(|| "aead".into()));
                base.integrity_tag_size = Some(i.tag_size);
                base.journal = Some(
                    match i.mode {
                        'J' => "journal",
                        'B' => "bitmap",
                        'D' => "direct (no journal)",
                        'R' => "recovery",
                        _ => "unknown",
                    }
                    .into(),
                );
            }
        }
        let Volume { device, .. } = vol;
        let (live, gate) = Self::with(name, device, base, Some(rebuild));
        *lock(&live.regrow) = regrow;
        (live, gate)
    }

    fn with(
        name: &str,
        device: Arc<dyn BlockDevice>,
        base: Status,
        rebuild: Option<Rebuild>,
    ) -> (Arc<Live>, Arc<Gate>) {
        let gate = Arc::new(Gate::new(device));
        let live = Arc::new(Live {
            name: name.to_owned(),
            gate: gate.clone(),
            base,
            rebuild: Mutex::new(rebuild),
            regrow: Mutex::new(None),
            transport: OnceLock::new(),
            finished: Mutex::new((None, false)),
            finished_cv: Condvar::new(),
            reenc: Arc::new(Mutex::new(Job::default())),
        });
        (live, gate)
    }

    /// Tells the control plane how the volume is served.
    pub fn set_transport(&self, t: Transport) {
        let _ = self.transport.set(t);
    }

    /// Serving is over (`result` is the final flush's outcome): answers a waiting `close`,
    /// and gives it a moment to send its reply before the process exits.
    pub fn finish(&self, result: &Result<()>) {
        self.stop_reencryption();
        // The stack and the storage go first: a `close` caller may reopen the device at once.
        drop(lock(&self.rebuild).take());
        drop(lock(&self.regrow).take());
        self.gate.retire();
        let mut f = lock(&self.finished);
        f.0 = Some(result.as_ref().map(|_| ()).map_err(|e| format!("{e:#}")));
        self.finished_cv.notify_all();
        let deadline = std::time::Instant::now() + Duration::from_secs(2);
        while !f.1 && CLOSE_ASKED.load(Ordering::SeqCst) > 0 {
            let left = deadline.saturating_duration_since(std::time::Instant::now());
            if left.is_zero() {
                break;
            }
            f = self.finished_cv.wait_timeout(f, left).unwrap_or_else(PoisonError::into_inner).0;
        }
    }

    /// The status now.
    pub fn status(&self) -> Status {
        let mut s = self.base.clone();
        s.pid = std::process::id();
        s.suspended = self.gate.is_held();
        s.size = self.gate.geometry().size / 512;
        if let Some(r) = &*lock(&self.rebuild) {
            s.flags = flag_words(&r.flags);
            if s.crypt_mode.is_some() {
                s.crypt_mode = Some(r.opts.crypt_mode.name().into());
            }
        }
        if s.suspended {
            s.key_location = s.key_location.map(|_| "none (suspended: key wiped)".into());
        }
        {
            let j = lock(&self.reenc);
            s.reencryption = j.progress.clone();
            if let (Some(t), Some(p)) = (&j.new_table, &j.progress) {
                if p.state == "finished" {
                    s.cipher = Some(t.cipher.clone());
                    s.keysize_bits = u32::try_from(t.key.len() * 8).ok();
                }
            }
        }
        if let Some(t) = self.transport.get() {
            s.transport = t.kind.to_owned();
            s.address = t.address.clone();
            s.clients = t.clients.as_ref().map(|c| c());
        }
        s
    }

    fn close(&self) -> Response {
        if self.gate.is_held() {
            return Response::err(
                exit::BUSY,
                format!("Device {} is suspended: resume it (luksResume) before closing it.", self.name),
            );
        }
        let Some(t) = self.transport.get() else {
            return Response::err(exit::BUSY, format!("Device {} is still starting.", self.name));
        };
        CLOSE_ASKED.fetch_add(1, Ordering::SeqCst);
        // A reencryption stops after its hotzone, resumable (cryptsetup's close of a device
        // being reencrypted online leaves the same state).
        self.stop_reencryption();
        (t.stop)();
        let mut f = lock(&self.finished);
        while f.0.is_none() {
            f = self.finished_cv.wait(f).unwrap_or_else(PoisonError::into_inner);
        }
        let r = match f.0.clone() {
            Some(Ok(())) => Response::ok(),
            Some(Err(e)) => Response::err(exit::FAILURE, format!("closing {}: {e}", self.name)),
            None => Response::err(exit::FAILURE, "closing: no outcome"),
        };
        r
    }

    /// Marks the close reply as sent (the main thread may exit).
    fn close_answered(&self) {
        let mut f = lock(&self.finished);
        f.1 = true;
        self.finished_cv.notify_all();
    }

    /// Whether `refresh` and `resize` may rebuild this volume's stack from its crypt table
    /// (plain dm-crypt and LUKS; a standalone integrity volume grows through its regrow).
    fn rebuildable(&self) -> bool {
        matches!(self.base.kind.as_str(), "PLAIN" | "LUKS1" | "LUKS2")
    }

    fn refresh(&self, want: &Refresh) -> Response {
        let mut guard = lock(&self.rebuild);
        self.adopt_reencrypted(guard.as_mut());
        let Some(r) = guard.as_mut().filter(|_| self.rebuildable()) else {
            return Response::err(
                exit::BAD_ARGS,
                format!("Device {} ({}) has no crypt flags to refresh.", self.name, self.base.kind),
            );
        };
        if self.gate.is_held() {
            return Response::err(exit::BUSY, format!("Device {} is suspended.", self.name));
        }
        let Some(table) = &r.table else {
            // Why there is no one table to rebuild from: a reencryption (two segments, two
            // keys, and the keys are not kept) or an authenticated segment.
            if lock(&self.reenc).running() {
                return Response::err(
                    exit::BUSY,
                    format!(
                        "Device {} is being reencrypted: its flags cannot be refreshed until the reencryption \
                         finishes (`sealdisk status {}` shows its progress).",
                        self.name, self.name
                    ),
                );
            }
            if self.base.integrity.is_none() {
                return Response::err(
                    exit::BAD_ARGS,
                    format!(
                        "refresh of {} is not supported while its LUKS2 reencryption is unfinished (two segments, \
                         two keys): finish it (`sealdisk reencrypt --resume-only`), or close the volume and open it \
                         again with the new flags",
                        self.name
                    ),
                );
            }
            return Response::err(
                exit::BAD_ARGS,
                format!(
                    "refresh of {} is not supported: an authenticated (integrity) volume's flags cannot be changed live",
                    self.name
                ),
            );
        };
        if want.allow_discards != r.flags.allow_discards {
            return Response::err(
                exit::BAD_ARGS,
                "--allow-discards cannot be changed on a running volume: clients were told at connect \
                 whether it takes TRIM (close and open it again)",
            );
        }
        let mut opts = r.opts;
        if let Some(m) = &want.crypt_mode {
            match m.parse::<volume::CryptMode>().ok() {
                Some(m) => opts.crypt_mode = m,
                None => return Response::err(exit::BAD_ARGS, format!("invalid --crypt-mode {m:?}")),
            }
        }
        let mut t = table.clone();
        t.options.same_cpu_crypt = want.same_cpu_crypt;
        t.options.submit_from_crypt_cpus = want.submit_from_crypt_cpus;
        t.options.no_read_workqueue = want.no_read_workqueue;
        t.options.no_write_workqueue = want.no_write_workqueue;
        let vol = match volume::open_storage(r.storage.clone(), Spec::Table(t.clone()), Keys::none(), &opts) {
            Ok(v) => v,
            Err(e) => return Response::err(exit::FAILURE, format!("rebuilding {}: {e}", self.name)),
        };
        if !self.gate.fits(&*vol.device) {
            return Response::err(
                exit::FAILURE,
                "the rebuilt volume differs in size or capabilities: refused",
            );
        }
        let Volume { device, .. } = vol;
        // A request boundary: requests running finish on the old stack, new ones take this.
        drop(self.gate.replace(device));
        r.flags = CryptOptions { integrity_aead: None, ..t.options };
        r.opts = opts;
        r.table = Some(t);
        log::info!("{}: refreshed (flags: {:?})", self.name, flag_words(&r.flags));
        Response::ok()
    }

    fn resize(&self, sectors: Option<u64>, wipe: bool) -> Response {
        if let Some(g) = lock(&self.regrow).as_mut() {
            return self.resize_integrity(g, sectors, wipe);
        }
        if wipe {
            return Response::err(exit::BAD_ARGS, "--wipe applies to integrity volumes only");
        }
        let mut guard = lock(&self.rebuild);
        self.adopt_reencrypted(guard.as_mut());
        let Some(r) = guard.as_mut().filter(|_| self.rebuildable()) else {
            return Response::err(
                exit::BAD_ARGS,
                format!("Device {} ({}) cannot be resized.", self.name, self.base.kind),
            );
        };
        if self.gate.is_held() {
            return Response::err(exit::BUSY, format!("Device {} is suspended.", self.name));
        }
        let Some(table) = &r.table else {
            if self.base.integrity.is_some() {
                // cryptsetup 2.6.1's refusal, as its `resize` of a LUKS2 --integrity volume
                // answers on Linux 6.1 (grow, shrink or no size alike; exit 1; seen in the
                // oracle). cryptsetup 2.8 says "Resize of LUKS2 device with integrity
                // protection is not supported." instead. A grown dm-integrity area would
                // also need tags for its new sectors.
                return Response::err(
                    exit::BAD_ARGS,
                    format!("Unsupported parameters on device {}.", self.name),
                );
            }
            return Response::err(
                exit::BAD_ARGS,
                format!("Device {} ({}) cannot be resized.", self.name, self.base.kind),
            );
        };
        // The storage as it is now: grown (or shrunk) underneath since it was opened.
        let storage = match r.storage.remeasured() {
            Ok(s) => s,
            Err(e) => {
                return Response::err(exit::FAILURE, format!("reading the size of {}: {e}", r.storage.name))
            }
        };
        // cryptsetup's device_block_adjust, with its messages: the data must start inside the
        // device, and the mapping must end inside it; `--size 0` (or none) means the rest of
        // the device.
        let too_small = || Response::err(exit::BAD_ARGS, format!("Device {} is too small.", storage.name));
        let device_sectors = storage.size() / 512;
        if table.offset >= device_sectors {
            return Response::err(
                exit::BAD_ARGS,
                format!("Requested offset is beyond real size of device {}.", storage.name),
            );
        }
        let avail = device_sectors - table.offset;
        let len = sectors.filter(|&s| s != 0).unwrap_or(avail);
        let block = u64::from(table.options.sector_size() / 512).max(1);
        if !len.is_multiple_of(block) {
            return Response::err(exit::BAD_ARGS, "Device size is not aligned to requested sector size.");
        }
        if len > avail {
            return too_small();
        }
        let mut t = table.clone();
        t.len = len;
        let vol = match volume::open_storage(storage.clone(), Spec::Table(t.clone()), Keys::none(), &r.opts) {
            Ok(v) => v,
            Err(e) => return Response::err(exit::FAILURE, format!("rebuilding {}: {e}", self.name)),
        };
        if !self.gate.fits_resized(&*vol.device) {
            return Response::err(
                exit::FAILURE,
                "the resized volume differs in block size or capabilities: refused",
            );
        }
        let bytes = vol.device.geometry().size;
        let hook = self.transport.get().and_then(|t| t.resized.as_ref());
        let growing = bytes >= self.gate.geometry().size;
        if let (Some(h), false) = (hook, growing) {
            // Shrinking: the kernel stops sending requests past the new end first.
            if let Err(e) = h(bytes) {
                return Response::err(exit::FAILURE, format!("resizing {}: {e}", self.name));
            }
        }
        let Volume { device, .. } = vol;
        drop(self.gate.replace_resized(device));
        r.table = Some(t);
        r.storage = storage;
        if let (Some(h), true) = (hook, growing) {
            if let Err(e) = h(bytes) {
                log::warn!(
                    "{}: resized to {len} sectors, but its {} device was not told: {e}",
                    self.name,
                    self.transport.get().map_or("", |t| t.kind)
                );
                return Response::err(
                    exit::FAILURE,
                    format!(
                        "{} was resized to {len} sectors, but the kernel's device keeps its old size: {e}",
                        self.name
                    ),
                );
            }
        }
        log::info!("{}: resized to {len} sectors", self.name);
        Response::ok()
    }

    /// `resize NAME` of a standalone integrity volume (integritysetup's `resize`): the
    /// storage measured again; requests held while the target closes, the superblock is
    /// marked for recalculation of the new area (or the area wiped, `wipe`), and the target
    /// opens again at the new size (`volume::integrity::regrow`). `--size` maps fewer
    /// sectors than the volume provides (a window of it); more are refused with
    /// cryptsetup's "Device ... is too small.".
    fn resize_integrity(&self, g: &mut IntegrityRegrow, sectors: Option<u64>, wipe: bool) -> Response {
        if self.gate.is_held() {
            return Response::err(exit::BUSY, format!("Device {} is suspended.", self.name));
        }
        if g.params.read_only {
            return Response::err(
                exit::BAD_ARGS,
                format!("Device {} is read-only: it cannot be resized.", self.name),
            );
        }
        let Some(cur) = lock(&g.current).clone() else {
            return Response::err(exit::FAILURE, format!("Device {} has no integrity target.", self.name));
        };
        let storage = match g.storage.remeasured() {
            Ok(s) => s,
            Err(e) => {
                return Response::err(exit::FAILURE, format!("reading the size of {}: {e}", g.storage.name))
            }
        };
        let sb = cur.superblock();
        let provided = volume::integrity::provided_on(&sb, &g.params, storage.size() / 512);
        if !wipe && provided > sb.provided_data_sectors {
            match volume::integrity::recalculate_refused(&sb, &g.params) {
                Ok(false) => {}
                Ok(true) => {
                    return Response::err(
                        exit::BAD_ARGS,
                        "Setting recalculate flag is not supported, you may consider using --wipe instead.",
                    )
                }
                Err(e) => return Response::err(exit::FAILURE, format!("{:#}", anyhow::Error::new(e))),
            }
        }
        drop(cur);
        let len = sectors.filter(|&s| s != 0).unwrap_or(provided);
        let block = u64::from(sb.block_size() / 512).max(1);
        if !len.is_multiple_of(block) {
            return Response::err(exit::BAD_ARGS, "Device size is not aligned to requested sector size.");
        }
        if len > provided {
            return Response::err(exit::BAD_ARGS, format!("Device {} is too small.", storage.name));
        }
        let bytes = len * 512;
        let hook = self.transport.get().and_then(|t| t.resized.as_ref());
        let growing = bytes >= self.gate.geometry().size;
        if let (Some(h), false) = (hook, growing) {
            if let Err(e) = h(bytes) {
                return Response::err(exit::FAILURE, format!("resizing {}: {e}", self.name));
            }
        }
        // Suspend: no request runs on the old target, and nothing else holds it.
        drop(self.gate.hold());
        let mut slot = lock(&g.current).take();
        let old = loop {
            match slot.map(Arc::try_unwrap) {
                Some(Ok(t)) => break Some(t),
                Some(Err(again)) => {
                    slot = Some(again);
                    std::thread::sleep(Duration::from_millis(1));
                }
                None => break None,
            }
        };
        let Some(old) = old else {
            return Response::err(exit::FAILURE, format!("Device {} has no integrity target.", self.name));
        };
        let (target, outcome) = match volume::integrity::regrow(old, &storage, &g.params, wipe) {
            Ok((t, rep)) => (Ok(t), Ok(rep)),
            Err(e) => {
                // Serve the volume again as it is now on disk.
                let msg = format!("{:#}", anyhow::Error::new(e));
                let t = volume::integrity::open_on(storage.device.clone(), &storage.name, &g.params);
                (
                    t.map_err(|e| format!("{msg}; reopening it failed too: {:#}", anyhow::Error::new(e))),
                    Err(msg),
                )
            }
        };
        let target = match target {
            Ok(t) => t,
            Err(msg) => {
                // Nothing to serve: requests fail from now on.
                self.gate.close_held();
                return Response::err(exit::FAILURE, format!("resizing {}: {msg}", self.name));
            }
        };
        let size = target.geometry().size;
        let device: Arc<dyn BlockDevice> = if bytes < size && outcome.is_ok() {
            match blockdev::Slice::new(target.clone(), 0, bytes) {
                Ok(s) => Arc::new(s),
                Err(_) => target.clone(),
            }
        } else {
            target.clone()
        };
        *lock(&g.current) = Some(target);
        g.storage = storage;
        let served = device.geometry().size;
        drop(self.gate.replace_resized(device));
        if let Some(h) = hook {
            if let Err(e) = h(served) {
                log::warn!("{}: resized, but its transport was not told: {e}", self.name);
            }
        }
        match outcome {
            Ok(rep) => {
                log::info!(
                    "{}: integrity volume resized to {} sectors (provided {} -> {}, new area {})",
                    self.name,
                    served / 512,
                    rep.old_sectors,
                    rep.new_sectors,
                    if rep.wiped { "wiped" } else { "being recalculated" }
                );
                Response::ok()
            }
            Err(msg) => Response::err(exit::BAD_ARGS, msg),
        }
    }

    fn suspend(&self) -> Response {
        if lock(&self.reenc).running() {
            return Response::err(
                exit::BUSY,
                format!("Device {} is being reencrypted: it cannot be suspended now.", self.name),
            );
        }
        let mut guard = lock(&self.rebuild);
        let luks = guard.as_ref().and_then(|r| r.luks.as_ref());
        if luks.is_none() {
            return Response::err(
                exit::BAD_ARGS,
                format!("Device {} is not a LUKS device: luksSuspend works on LUKS volumes only.", self.name),
            );
        }
        if self.gate.is_held() {
            return Response::err(exit::BAD_ARGS, format!("Volume {} is already suspended.", self.name));
        }
        let Some(old) = self.gate.hold() else {
            return Response::err(exit::BAD_ARGS, format!("Volume {} is already suspended.", self.name));
        };
        if let Err(e) = old.flush() {
            drop(self.gate.replace(old));
            return Response::err(
                exit::FAILURE,
                format!("flushing {} failed, not suspended: {e}", self.name),
            );
        }
        // The stack, and with it every key schedule, goes here: nothing else refers to it
        // (the gate held it alone, and `hold` waited for the last request).
        drop(old);
        if let Some(r) = guard.as_mut() {
            r.table = None;
        }
        // Stack temporaries of the key schedules (cipher backends leave some) on the crypto
        // pool's threads and this one.
        targets::scrub_crypto_stacks();
        log::info!("{}: suspended, key wiped", self.name);
        Response::ok()
    }

    fn resume(&self, pass: Passphrase) -> Response {
        let mut guard = lock(&self.rebuild);
        let Some(r) = guard.as_mut() else {
            return Response::err(exit::BAD_ARGS, format!("Device {} is not a LUKS device.", self.name));
        };
        let Some(l) = r.luks.clone() else {
            return Response::err(exit::BAD_ARGS, format!("Device {} is not a LUKS device.", self.name));
        };
        if !self.gate.is_held() {
            return Response::err(exit::BAD_ARGS, format!("Volume {} is not suspended.", self.name));
        }
        let mut one = OnePassphrase::new(&pass);
        let spec = LuksSpec {
            version: Some(l.version),
            header: r.header.clone(),
            key_slot: None,
            flags: r.flags,
            integrity_no_journal: l.integrity_no_journal,
            integrity_journal: l.integrity_journal,
            kdf_limits: l.kdf_limits,
        };
        let vol = match volume::open_storage(
            r.storage.clone(),
            Spec::Luks(spec),
            Keys::passphrase(&mut one),
            &r.opts,
        ) {
            Ok(v) => v,
            Err(e) => {
                let code = crate::actions::luks::kind_code(e.kind());
                let msg = match e.kind() {
                    volume::ErrorKind::WrongKey => "No key available with this passphrase.".to_owned(),
                    _ => format!("resuming {}: {e}", self.name),
                };
                return Response::err(code, msg);
            }
        };
        if vol.luks.as_ref().map(|u| u.luks.uuid()) != Some(l.uuid.as_str()) {
            return Response::err(
                exit::FAILURE,
                "the LUKS header now on the device has another UUID: not resumed",
            );
        }
        if !self.gate.fits(&*vol.device) {
            return Response::err(
                exit::FAILURE,
                "the volume now differs in size or capabilities: not resumed",
            );
        }
        r.table = match vol.kind {
            VolumeKind::Luks2Aead => None,
            _ => vol.crypt_table().cloned(),
        };
        let Volume { device, .. } = vol;
        drop(self.gate.replace(device));
        log::info!("{}: resumed", self.name);
        Response::ok()
    }

    /// After an online reencryption finished, the new segment's table is the volume's
    /// (so `refresh` and `resize` rebuild from it again).
    fn adopt_reencrypted(&self, r: Option<&mut Rebuild>) {
        let mut j = lock(&self.reenc);
        if j.progress.as_ref().is_some_and(|p| p.state == "finished") {
            if let (Some(r), Some(t)) = (r, j.new_table.take()) {
                r.table = Some(t);
            }
        }
    }

    /// Stops the online reencryption, if one runs, after its current hotzone, and waits
    /// for it (its header is then resumable by any tool).
    fn stop_reencryption(&self) {
        let thread = {
            let mut j = lock(&self.reenc);
            j.stop.store(true, Ordering::SeqCst);
            j.thread.take()
        };
        if let Some(t) = thread {
            let _ = t.join();
        }
    }

    /// `reencrypt` of the served volume (cryptsetup's online reencryption): initializes it
    /// unless one is in progress, puts a [`volume::luks::reencrypting::ReencryptingDevice`]
    /// in the gate, and runs the hotzones on a thread while clients go on.
    fn reencrypt(&self, pass: Passphrase, q: &proto::Reencrypt) -> Response {
        use volume::luks::reencrypt::{self as re, ReencryptParams, RunEnd, RunOptions};
        let mut job = lock(&self.reenc);
        if job.running() {
            return Response::err(exit::BUSY, "Reencryption process is already running.");
        }
        let mut guard = lock(&self.rebuild);
        let not_luks =
            || Response::err(exit::BAD_ARGS, format!("Device {} is not a LUKS2 device.", self.name));
        let Some(r) = guard.as_mut() else { return not_luks() };
        let Some(l) = r.luks.clone() else { return not_luks() };
        if l.version != LuksVersion::V2 {
            return Response::err(
                exit::BAD_ARGS,
                "Reencryption is supported only for LUKS2 in this version of sealdisk.",
            );
        }
        if self.gate.is_held() {
            return Response::err(exit::BUSY, format!("Device {} is suspended.", self.name));
        }
        if r.opts.read_only {
            return Response::err(
                exit::BAD_ARGS,
                format!("Device {} is active read-only: it cannot be reencrypted online.", self.name),
            );
        }
        if q.sector_size.is_some() {
            return Response::err(
                exit::BAD_ARGS,
                "changing the sector size of an active volume is not supported online: close it and reencrypt offline",
            );
        }
        let fail = |e: volume::luks::LuksError| {
            let code = crate::actions::luks::kind_code(e.kind());
            let msg = match e.kind() {
                volume::ErrorKind::WrongKey => "No key available with this passphrase.".to_owned(),
                _ => e.to_string(),
            };
            Response::err(code, msg)
        };
        let mut meta = r.header.clone().unwrap_or_else(|| r.storage.clone());
        let mut luks = match volume::luks::Luks::load(&*meta.device, false) {
            Ok(h) => h,
            Err(e) => return fail(e),
        };
        if luks.uuid() != l.uuid {
            return Response::err(
                exit::FAILURE,
                "the LUKS header now on the device has another UUID: refused",
            );
        }
        // `--decrypt --header NEW` of a volume whose header is on the device (cryptsetup's
        // data-shift decryption, which it starts under an active device too): with the
        // clients held, the header moves to NEW and the first data segment to the device's
        // start; they go on only once the device mid-decryption has replaced the served one
        // (below), since the old mapping no longer holds for the moved segment.
        let mut held = HeldGate { gate: &self.gate, old: None };
        if let Some(path) = &q.decrypt_header {
            if r.header.is_some() || q.init_only {
                let why = if q.init_only {
                    "--init-only of a data-shift decryption on an active device is not supported: start it \
                     without --init-only, or close the device first"
                } else {
                    "the device's LUKS2 header is detached: decrypt it with --header naming that header"
                };
                return Response::err(exit::BAD_ARGS, why);
            }
            match self.start_decrypt_shift(r, &pass, q, &l.kdf_limits, path) {
                Ok((m, lk, old)) => {
                    meta = m;
                    luks = lk;
                    held.old = Some(old);
                }
                Err(resp) => return *resp,
            }
        }
        let in_progress = match re::status(&luks) {
            Ok(s) => s.is_some(),
            Err(e) => return fail(e),
        };
        if in_progress && q.init_only {
            return Response::err(
                exit::BAD_ARGS,
                "LUKS2 reencryption already initialized. Aborting operation.",
            );
        }
        if !in_progress {
            if q.resume_only {
                return Response::err(exit::BAD_ARGS, "Device reencryption not in progress.");
            }
            let params = match reencrypt_params(q, l.kdf_limits) {
                Ok(p) => ReencryptParams { cipher: q.cipher.clone(), key_bytes: q.key_bytes, ..p },
                Err(r) => return *r,
            };
            match re::init(&*meta.device, r.storage.size(), &mut luks, &pass, &params) {
                Ok(slot) => log::info!("{}: reencryption initialized, new key in keyslot {slot}", self.name),
                Err(e) => return fail(e),
            }
            if q.init_only {
                // Every sector is still in the old segment: the served stack stays right.
                return Response::ok();
            }
        } else if let (Some(res), None) = (&q.resilience, &held.old) {
            let cur = re::status(&luks).ok().flatten().map(|s| s.keyslot.resilience.type_name());
            if cur != Some(res.as_str()) {
                return Response::err(
                    exit::BAD_ARGS,
                    "changing the resilience mode on resume is not supported yet.",
                );
            }
        }
        let keys = match re::unlock_keys(&*meta.device, &luks, &pass, &l.kdf_limits) {
            Ok(k) => k,
            Err(e) => return fail(e),
        };
        // A data shift (encryption with --reduce-device-size, decryption into a new header
        // file) runs online too: the run holds each hotzone, whose source and destination
        // are live for no position outside it (see `run_datashift` / `run_decrypt_shift`).
        // The device for both segments replaces the served one between requests.
        let started = held.old.is_some();
        let Some(old) = held.old.take().or_else(|| self.gate.hold()) else {
            return Response::err(exit::BUSY, format!("Device {} is suspended.", self.name));
        };
        let built = volume::luks::reencrypting::activate(
            &r.storage,
            &*meta.device,
            &mut luks,
            &keys,
            &r.opts,
            &r.flags,
        );
        let (dev, new_table) = match built {
            Ok((d, tn, _)) if self.gate.fits(&*d) => (d, tn.crypt()),
            Ok(_) if started => {
                // The old mapping no longer holds for the moved segment: fail I/O instead.
                self.gate.close_held();
                return Response::err(
                    exit::FAILURE,
                    "the volume mid data-shift decryption differs in size: closed",
                );
            }
            Ok(_) => {
                drop(self.gate.replace(old));
                return Response::err(
                    exit::FAILURE,
                    "the reencrypting volume differs in size or capabilities: refused",
                );
            }
            Err(e) if started => {
                self.gate.close_held();
                return Response::err(crate::actions::luks::kind_code(e.kind()), format!("{e}"));
            }
            Err(e) => {
                drop(self.gate.replace(old));
                return Response::err(crate::actions::luks::kind_code(e.kind()), format!("{e}"));
            }
        };
        drop(self.gate.replace(dev.clone()));
        drop(old);
        // One crypt table cannot rebuild this volume any more (`refresh`, `resize`).
        r.table = None;
        let stop = Arc::new(std::sync::atomic::AtomicBool::new(false));
        job.stop = stop.clone();
        job.new_table = new_table;
        job.progress = Some(ReencryptProgress { state: "running".into(), ..ReencryptProgress::default() });
        let shared = self.reenc.clone();
        let (meta_dev, data) = (meta.device.clone(), r.storage.device.clone());
        let opts = RunOptions { hotzone_size: q.hotzone_size, kdf_limits: l.kdf_limits };
        let name = self.name.clone();
        let spawned = std::thread::Builder::new().name("reencrypt".into()).spawn(move || {
            let t0 = std::time::Instant::now();
            let mut first = None;
            let mut update = |done: u64, total: u64| {
                let f = *first.get_or_insert(done);
                let rate = (done - f) as f64 / t0.elapsed().as_secs_f64().max(1e-3);
                let eta = if rate > 0.0 { (total.saturating_sub(done) as f64 / rate) as u64 } else { 0 };
                if let Some(p) = lock(&shared).progress.as_mut() {
                    (p.done, p.total, p.rate, p.eta_secs) = (done, total, rate, eta);
                }
            };
            let r =
                re::run_unlocked(&*meta_dev, &*data, &mut luks, &keys, &opts, Some(&*dev), &mut |d, t| {
                    update(d, t);
                    !stop.load(Ordering::SeqCst)
                });
            drop(keys);
            let mut j = lock(&shared);
            if let Some(p) = j.progress.as_mut() {
                match r {
                    Ok(RunEnd::Finished) => {
                        p.state = "finished".into();
                        p.eta_secs = 0;
                        log::info!("{name}: reencryption finished");
                    }
                    Ok(RunEnd::Interrupted) => {
                        p.state = "interrupted".into();
                        log::info!("{name}: reencryption interrupted at {} of {} bytes", p.done, p.total);
                    }
                    Err(e) => {
                        log::error!("{name}: reencryption failed: {e}");
                        p.state = "failed".into();
                        p.error = Some(e.to_string());
                    }
                }
            }
        });
        match spawned {
            Ok(t) => job.thread = Some(t),
            Err(e) => {
                job.progress = None;
                return Response::err(exit::FAILURE, format!("starting the reencryption thread: {e}"));
            }
        }
        Response::ok()
    }

    /// Starts the data-shift decryption of the served volume (header on the device) into
    /// the new header file `path` (created here, 0600, as long as the header and its
    /// keyslots area): holds the clients, runs the start (`init_decrypt_shift`, its words
    /// and refusals), and returns the new header, the header state and the served device
    /// with the clients still held. On a refusal the clients go on and no file is left
    /// unless the device's header is already gone (the copy in it is then the only one).
    fn start_decrypt_shift(
        &self,
        r: &mut Rebuild,
        pass: &Passphrase,
        q: &proto::Reencrypt,
        limits: &KdfLimits,
        path: &str,
    ) -> Result<(Storage, volume::luks::Luks, Arc<dyn blockdev::BlockDevice>), Box<Response>> {
        use std::os::unix::fs::OpenOptionsExt;
        use volume::luks::reencrypt::{self as re, EncryptLayout, ReencryptParams};
        let fail = |e: volume::luks::LuksError| {
            Response::err(crate::actions::luks::kind_code(e.kind()), e.to_string())
        };
        let hdr_len = match volume::luks::Luks::load(&*r.storage.device, false) {
            Ok(l) => match &l.header {
                volume::luks::LuksHeader::V2(s) => s.header.metadata.metadata_and_keyslots_size(),
                volume::luks::LuksHeader::V1(_) => {
                    return Err(Box::new(Response::err(
                        exit::BAD_ARGS,
                        "Reencryption is supported only for LUKS2 in this version of sealdisk.",
                    )))
                }
            },
            Err(e) => return Err(Box::new(fail(e))),
        };
        let params = ReencryptParams {
            layout: EncryptLayout { hotzone_size: q.hotzone_size, ..EncryptLayout::default() },
            ..reencrypt_params(q, *limits)?
        };
        let made = std::fs::OpenOptions::new()
            .write(true)
            .create_new(true)
            .mode(0o600)
            .open(path)
            .and_then(|f| f.set_len(hdr_len));
        if let Err(e) = made {
            return Err(Box::new(Response::err(
                exit::FAILURE,
                format!("creating the header file {path}: {e}"),
            )));
        }
        let opts = OpenOptions { read_only: false, lock: true, ..OpenOptions::default() };
        let new = match volume::storage::open(path, &opts.storage()) {
            Ok(s) => s,
            Err(e) => {
                let _ = std::fs::remove_file(path);
                return Err(Box::new(Response::err(
                    exit::FAILURE,
                    format!("opening the header file {path}: {e}"),
                )));
            }
        };
        let Some(old) = self.gate.hold() else {
            let _ = std::fs::remove_file(path);
            return Err(Box::new(Response::err(exit::BUSY, format!("Device {} is suspended.", self.name))));
        };
        match re::init_decrypt_shift(&*new.device, &*r.storage.device, pass, &params) {
            Ok(luks) => {
                log::info!("{}: data-shift decryption started, header moved to {path}", self.name);
                r.header = Some(new.clone());
                Ok((new, luks, old))
            }
            Err(e) => {
                let device_header_kept = volume::luks::probe(&*r.storage.device).ok().flatten().is_some();
                drop(self.gate.replace(old));
                if device_header_kept {
                    drop(new);
                    let _ = std::fs::remove_file(path);
                }
                Err(Box::new(fail(e)))
            }
        }
    }

    /// Answers one control connection.
    fn answer(&self, stream: UnixStream) {
        let _ = stream.set_read_timeout(Some(CLIENT_TIMEOUT));
        let _ = stream.set_write_timeout(Some(CLIENT_TIMEOUT));
        let mut reader = BufReader::new(&stream);
        let mut closing = false;
        let resp = match proto::read_line(&mut reader) {
            Err(e) => Response::err(exit::BAD_ARGS, format!("bad request: {e}")),
            Ok(line) => match proto::parse_request(&line) {
                Err(e) => Response::err(exit::BAD_ARGS, e),
                Ok(req) => match req.cmd {
                    Command::Status => Response { status: Some(self.status()), ..Response::ok() },
                    Command::Close => {
                        closing = true;
                        self.close()
                    }
                    Command::Refresh(r) => self.refresh(&r),
                    Command::Suspend => self.suspend(),
                    Command::Resize { size, wipe } => self.resize(size, wipe),
                    Command::Resume { secret_len } => match read_secret(&mut reader, secret_len) {
                        Ok(pass) => self.resume(pass),
                        Err(e) => Response::err(exit::BAD_ARGS, e),
                    },
                    Command::Reencrypt(q) => match read_secret(&mut reader, q.secret_len) {
                        Ok(pass) => self.reencrypt(pass, &q),
                        Err(e) => Response::err(exit::BAD_ARGS, e),
                    },
                },
            },
        };
        // A resume or refresh built key schedules on this thread: leave no temporaries.
        targets::scrub_stack();
        let mut line = serde_json::to_vec(&resp).unwrap_or_else(|_| br#"{"v":1,"ok":false}"#.to_vec());
        line.push(b'\n');
        let _ = (&stream).write_all(&line);
        if closing {
            self.close_answered();
        }
    }
}

/// How many `close` requests are being answered: the main thread waits for their replies.
static CLOSE_ASKED: AtomicUsize = AtomicUsize::new(0);

/// Reads the `len`-byte passphrase that follows a `resume` line into secret memory.
fn read_secret(r: &mut impl Read, len: usize) -> Result<Passphrase, String> {
    if len == 0 || len > MAX_SECRET {
        return Err(format!("a passphrase is 1 to {MAX_SECRET} bytes, not {len}"));
    }
    let mut buf = SecretBuf::zeroed(len);
    r.read_exact(&mut buf).map_err(|e| format!("reading the passphrase: {e}"))?;
    Ok(Passphrase::from_secret(buf))
}

/// The control socket of a live volume, listening; its file is removed on drop.
#[derive(Debug)]
pub struct ControlServer {
    path: std::path::PathBuf,
    _claim: Claim,
}

impl Drop for ControlServer {
    fn drop(&mut self) {
        let _ = std::fs::remove_file(&self.path);
    }
}

/// Binds the control socket of `claim` (0600) and answers it on a thread for `live`.
pub fn start(claim: Claim, live: Arc<Live>) -> Result<ControlServer> {
    let path = claim.socket.clone();
    let listener = UnixListener::bind(&path).with_context(|| format!("binding {}", path.display()))?;
    std::fs::set_permissions(&path, std::fs::Permissions::from_mode(0o600))
        .with_context(|| format!("chmod 0600 {}", path.display()))?;
    let active = Arc::new(AtomicUsize::new(0));
    std::thread::Builder::new()
        .name("control".into())
        .spawn(move || {
            for stream in listener.incoming() {
                let Ok(stream) = stream else {
                    // Out of descriptors or memory: back off instead of spinning.
                    std::thread::sleep(std::time::Duration::from_millis(50));
                    continue;
                };
                if active.fetch_add(1, Ordering::SeqCst) >= MAX_CONNECTIONS {
                    active.fetch_sub(1, Ordering::SeqCst);
                    continue;
                }
                let (live, mine) = (live.clone(), active.clone());
                let spawned = std::thread::Builder::new().name("control-conn".into()).spawn(move || {
                    live.answer(stream);
                    mine.fetch_sub(1, Ordering::SeqCst);
                });
                if spawned.is_err() {
                    active.fetch_sub(1, Ordering::SeqCst);
                    log::warn!("control: cannot start a connection thread");
                }
            }
        })
        .context("starting the control thread")?;
    Ok(ControlServer { path, _claim: claim })
}

/// The reencryption parameters a request asks for (resilience, keyslot, PBKDF of the new
/// keyslot), or the response refusing it: an unknown PBKDF or hash.
fn reencrypt_params(
    q: &proto::Reencrypt,
    kdf_limits: volume::luks::KdfLimits,
) -> Result<volume::luks::reencrypt::ReencryptParams, Box<Response>> {
    let kind = match &q.pbkdf {
        Some(k) => Some(
            k.parse::<volume::luks::PbkdfType>()
                .map_err(|e| Box::new(Response::err(exit::BAD_ARGS, e.to_string())))?,
        ),
        None => None,
    };
    let Ok(hash) = q.hash.parse() else {
        return Err(Box::new(Response::err(exit::BAD_ARGS, format!("--hash: unknown hash {:?}", q.hash))));
    };
    Ok(volume::luks::reencrypt::ReencryptParams {
        resilience: q.resilience.clone().unwrap_or_else(|| "checksum".into()),
        resilience_hash: q.resilience_hash.clone(),
        key_slot: q.key_slot,
        pbkdf: volume::luks::PbkdfParams {
            kind,
            hash,
            iter_time: Duration::from_millis(q.iter_time_ms.max(1)),
            force_iterations: q.pbkdf_force_iterations,
            memory_kib: q.pbkdf_memory,
            parallel: q.pbkdf_parallel,
        },
        kdf_limits,
        ..Default::default()
    })
}
