//! The serving side of the control socket: a [`Live`] volume (its gate, its status, what
//! it needs to rebuild its stack) and the thread that answers requests about it.
//!
//! Everything here runs on control threads; the I/O path only ever sees the [`Gate`]. Each
//! live command that changes the volume is its own module: `refresh`, `resize`,
//! `suspend` (and resume), `reencrypt`; this one holds the volume, `status`, `close` and the
//! socket.

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

mod reencrypt;
mod refresh;
mod resize;
mod suspend;

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
    /// What the volume is (what `refresh` and `resize` may rebuild).
    kind: VolumeKind,
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
            if vol.kind.rebuilds_from_its_table() && data_layers == 1 {
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
        let Volume { device, kind, .. } = vol;
        let gate = Arc::new(Gate::new(device));
        let live = Arc::new(Live {
            name: name.to_owned(),
            kind,
            gate: gate.clone(),
            base,
            rebuild: Mutex::new(Some(rebuild)),
            regrow: Mutex::new(regrow),
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
