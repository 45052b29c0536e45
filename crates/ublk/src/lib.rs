//! The volume as a Linux ublk block device, `/dev/ublkbN`, served in-process over an
//! `Arc<dyn BlockDevice>` with the `libublk` crate. Knows nothing of crypto.
//!
//! ```text
//!   mkfs / mount / dd ──► /dev/ublkbN (blk-mq, one hardware queue per CPU)
//!                              │ ublk_drv
//!        /dev/ublkcN: per queue an io_uring of FETCH / COMMIT_AND_FETCH commands
//!                              │
//!   queue thread q (one per queue): a task per tag ──► job ──► worker pool (--threads)
//!                              ▲                              │ pread/pwrite /dev/ublkcN
//!                              └── eventfd (io_uring read) ◄──┤ (UBLK_F_USER_COPY)
//!                                                             ▼
//!                                           Arc<dyn BlockDevice> (crypt, integrity, ...)
//! ```
//!
//! * **Queues**: one per CPU unless told ([`UblkConfig::queues`]); each has `depth` tags.
//!   Its thread only moves commands: every request becomes a job for a shared pool of
//!   worker threads, so the device's blocking calls never stall a queue's other tags. A
//!   worker that finishes pushes the result to the queue's completion list and bumps the
//!   queue's eventfd, which the queue thread keeps an io_uring read on; that read
//!   completing wakes the tags whose jobs are done, and they commit and fetch the next
//!   request.
//! * **Buffers and copies** (`UBLK_F_USER_COPY`, Linux 6.5+): the worker copies a write's
//!   data from `/dev/ublkcN` into a buffer of its own (`pread` at the request's user-copy
//!   offset), and a read's data back (`pwrite`). That is the one copy every ublk server
//!   makes without zero-copy; buffers belong to the jobs and are reused per tag, so writes
//!   go down with `write_at_scratch` (the crypt layer encrypts in place).
//! * **No zero-copy**: `UBLK_F_SUPPORT_ZERO_COPY` (6.12 has it for root servers only) lends
//!   the request's pages to io_uring operations on another file, never to the server's own
//!   memory. Every layer here (encryption, integrity tags) has to see and change the bytes in
//!   user memory, so there is nothing for zero-copy to save; `UBLK_F_AUTO_BUF_REG` (6.16)
//!   is the same mechanism.
//! * **Requests**: READ, WRITE (with `FUA` → [`WriteFlags::FUA`]), FLUSH → `flush`,
//!   DISCARD → `discard` (advertised only when the device has [`Caps::DISCARD`]),
//!   WRITE_ZEROES → `write_zeroes` (`MAY_UNMAP` unless the request says `NOUNMAP`). Errors
//!   complete the request with the kind's errno; an integrity mismatch fails only the
//!   request that met it.
//! * **Parameters**: size, logical and physical block size from [`Geometry`]; a volatile
//!   write cache and FUA (so the kernel sends flushes); read-only and rotational when told.
//! * **Unprivileged devices**: when not running as root and the driver offers
//!   `UBLK_F_UNPRIVILEGED_DEV` (6.5+), the device is created as one (it needs
//!   `/dev/ublk-control` readable by the user and the udev rule that hands `/dev/ublk[bc]N`
//!   to the creating user, as the ublksrv/libublk documentation describes).
//! * **Death of the server**: without user recovery the driver notices the dead daemon,
//!   fails every queued and new request and removes `/dev/ublkbN` (its char device stays
//!   until deleted: [`delete_stale`]). With [`UblkConfig::recoverable`] (`UBLK_F_USER_RECOVERY`)
//!   the device is quiesced instead and a new server re-attaches with [`UblkConfig::recover`];
//!   requests wait for it meanwhile (`UBLK_F_USER_RECOVERY_FAIL_IO`, 6.13+, which would fail
//!   them, is refused by libublk 0.4).
#![warn(missing_docs)]

mod queue;

use std::os::fd::BorrowedFd;
use std::path::Path;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{mpsc, Arc, Mutex};

use blockdev::{BlockDevice, Caps, Geometry};
use libublk::ctrl::{UblkCtrl, UblkCtrlBuilder};
use libublk::{sys, UblkFlags};

pub use blockdev::WriteFlags;

/// The control device the ublk driver creates.
pub const CONTROL_PATH: &str = "/dev/ublk-control";

/// Why the ublk device could not be created or served.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum UblkError {
    /// No `/dev/ublk-control`: the driver is not loaded (or not in this container).
    #[error("{CONTROL_PATH} does not exist: this kernel has no ublk driver loaded (modprobe ublk_drv; Linux 6.0 or later with CONFIG_BLK_DEV_UBLK)")]
    NoDriver,
    /// `/dev/ublk-control` exists but cannot be opened.
    #[error(
        "cannot open {CONTROL_PATH} (needs root, or a udev rule making it accessible for unprivileged ublk)"
    )]
    NoAccess(#[source] std::io::Error),
    /// The driver lacks something this server needs.
    #[error("the ublk driver lacks {0} (needs Linux 6.5 or later)")]
    Unsupported(&'static str),
    /// The device's geometry cannot be expressed to the driver.
    #[error("device geometry not supported by ublk: {0}")]
    Geometry(String),
    /// A bad configuration value.
    #[error("{0}")]
    Config(String),
    /// The device to recover is not in a state that can be recovered, or does not match.
    #[error("cannot recover ublk device {id}: {reason}")]
    Recover {
        /// The device id.
        id: u32,
        /// Why.
        reason: String,
    },
    /// A ublk control or queue command failed.
    #[error("ublk {what} failed: {source}")]
    Driver {
        /// What was being done.
        what: &'static str,
        /// libublk's error (a negative errno for driver refusals).
        #[source]
        source: libublk::UblkError,
    },
    /// A system call of the server failed.
    #[error("{what}: {source}")]
    Os {
        /// What was being done.
        what: &'static str,
        /// The cause.
        #[source]
        source: std::io::Error,
    },
}

fn driver(what: &'static str) -> impl FnOnce(libublk::UblkError) -> UblkError {
    move |source| UblkError::Driver { what, source }
}

/// How to serve the device.
#[derive(Debug, Clone)]
pub struct UblkConfig {
    /// The device id to create (`/dev/ublkbID`), or `None` for the driver's next free one.
    /// With [`recover`](Self::recover), the id of the device to re-attach to (required).
    pub id: Option<u32>,
    /// Hardware queues; 0 = one per CPU.
    pub queues: u16,
    /// Requests in flight per queue (1..=4096).
    pub depth: u16,
    /// Largest request in bytes (a multiple of 4096, at most 1 MiB... the driver's limit).
    pub max_io: u32,
    /// Worker threads executing requests on the device (shared by all queues), at least 1.
    pub threads: usize,
    /// The device refuses writes (`UBLK_ATTR_READ_ONLY`).
    pub read_only: bool,
    /// The storage is rotational (`UBLK_ATTR_ROTATIONAL`).
    pub rotational: bool,
    /// Create the device with user recovery (`UBLK_F_USER_RECOVERY`), so that a server that
    /// died can be replaced by one started with [`recover`](Self::recover).
    pub recoverable: bool,
    /// Re-attach to the existing, quiesced device [`id`](Self::id) whose server died.
    pub recover: bool,
}

impl Default for UblkConfig {
    fn default() -> Self {
        UblkConfig {
            id: None,
            queues: 0,
            depth: 64,
            max_io: 512 << 10,
            threads: 8,
            read_only: false,
            rotational: false,
            recoverable: false,
            recover: false,
        }
    }
}

/// The driver's feature bits (`UBLK_U_CMD_GET_FEATURES`), after checking that
/// `/dev/ublk-control` can be opened. Cheap and changes nothing: call it before unlocking a
/// volume so that a host without ublk fails before any work.
pub fn check_available() -> Result<u64, UblkError> {
    if !Path::new(CONTROL_PATH).exists() {
        return Err(UblkError::NoDriver);
    }
    std::fs::OpenOptions::new().read(true).write(true).open(CONTROL_PATH).map_err(UblkError::NoAccess)?;
    let features = UblkCtrl::get_features().ok_or(UblkError::Unsupported("UBLK_U_CMD_GET_FEATURES"))?;
    if features & u64::from(sys::UBLK_F_USER_COPY) == 0 {
        return Err(UblkError::Unsupported("UBLK_F_USER_COPY"));
    }
    Ok(features)
}

/// Deletes the ublk device `id` if it exists and nothing serves it: state DEAD (its server
/// died without user recovery, or never started it) and the process that created or last
/// served it gone. Returns whether it deleted one.
pub fn delete_stale(id: u32) -> Result<bool, UblkError> {
    let Ok(id_i32) = i32::try_from(id) else { return Ok(false) };
    if !Path::new(&format!("/sys/class/ublk-char/ublkc{id}")).exists() {
        return Ok(false);
    }
    let Ok(ctrl) = UblkCtrl::new_simple(id_i32) else { return Ok(false) };
    let info = ctrl.dev_info();
    if u32::from(info.state) != sys::UBLK_S_DEV_DEAD {
        return Ok(false);
    }
    if info.ublksrv_pid > 0 && Path::new(&format!("/proc/{}", info.ublksrv_pid)).exists() {
        return Ok(false);
    }
    ctrl.del_dev().map_err(driver("deleting a stale device"))?;
    Ok(true)
}

fn shift_of(bytes: u32, what: &str) -> Result<u8, UblkError> {
    if !bytes.is_power_of_two() || !(512..=(64 << 10)).contains(&bytes) {
        return Err(UblkError::Geometry(format!("{what} {bytes} is not a power of two in 512..=64k")));
    }
    Ok(bytes.trailing_zeros() as u8)
}

/// The driver parameters for a device of geometry `g` and capabilities `caps`.
pub fn params_for(g: Geometry, caps: Caps, cfg: &UblkConfig) -> Result<sys::ublk_params, UblkError> {
    let logical = shift_of(g.logical_block, "logical block size")?;
    let physical = shift_of(g.physical_block, "physical block size")?;
    if physical < logical || logical > 12 {
        return Err(UblkError::Geometry(format!(
            "logical block {} / physical block {} (the block layer takes logical blocks up to 4096)",
            g.logical_block, g.physical_block
        )));
    }
    if g.size == 0 || g.size % u64::from(g.logical_block) != 0 {
        return Err(UblkError::Geometry(format!(
            "size {} is not a positive multiple of the block size",
            g.size
        )));
    }
    let mut attrs = sys::UBLK_ATTR_VOLATILE_CACHE | sys::UBLK_ATTR_FUA;
    if cfg.read_only || caps.contains(Caps::READ_ONLY) {
        attrs |= sys::UBLK_ATTR_READ_ONLY;
    }
    if cfg.rotational {
        attrs |= sys::UBLK_ATTR_ROTATIONAL;
    }
    let max_sectors = cfg.max_io >> 9;
    let mut p = sys::ublk_params {
        types: sys::UBLK_PARAM_TYPE_BASIC | sys::UBLK_PARAM_TYPE_DISCARD,
        basic: sys::ublk_param_basic {
            attrs,
            logical_bs_shift: logical,
            physical_bs_shift: physical,
            io_opt_shift: physical,
            io_min_shift: physical,
            max_sectors,
            dev_sectors: g.size >> 9,
            ..Default::default()
        },
        ..Default::default()
    };
    // Every device can write zeroes (the trait's default writes zero buffers); discard only
    // where the device releases blocks itself. Both are cut into requests of max_io.
    p.discard = sys::ublk_param_discard {
        discard_granularity: g.physical_block,
        max_discard_sectors: if caps.contains(Caps::DISCARD) { max_sectors } else { 0 },
        max_write_zeroes_sectors: max_sectors,
        max_discard_segments: 1,
        ..Default::default()
    };
    Ok(p)
}

/// Checks `cfg`'s values (depth, request size, queues, recovery id) without the driver.
pub fn validate(cfg: &UblkConfig) -> Result<(), UblkError> {
    if !(1..=4096).contains(&cfg.depth) {
        return Err(UblkError::Config(format!("queue depth {} must be 1..=4096", cfg.depth)));
    }
    if cfg.max_io < 4096 || cfg.max_io % 4096 != 0 || cfg.max_io > (1 << 20) {
        return Err(UblkError::Config(format!(
            "largest request {} must be a multiple of 4k up to 1m",
            cfg.max_io
        )));
    }
    if cfg.recover && cfg.id.is_none() {
        return Err(UblkError::Config("recovering a ublk device needs its id".into()));
    }
    if cfg.queues > 128 {
        return Err(UblkError::Config(format!("{} queues: at most 128", cfg.queues)));
    }
    Ok(())
}

fn nr_cpus() -> u16 {
    std::thread::available_parallelism().map_or(1, |n| n.get()).min(128) as u16
}

/// Stops a running [`Server`] from another thread (a signal handler thread).
#[derive(Clone)]
pub struct StopHandle {
    ctrl: Arc<UblkCtrl>,
    stop: Arc<AtomicBool>,
}

impl std::fmt::Debug for StopHandle {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("StopHandle").field("id", &self.ctrl.dev_info().dev_id).finish()
    }
}

impl StopHandle {
    /// Asks the driver to stop the device: the block device is removed (the kernel writes
    /// back its dirty pages first, through this server), queues end and [`Server::run`]
    /// returns. Also works before the device has started.
    pub fn stop(&self) {
        self.stop.store(true, Ordering::SeqCst);
        // libublk sends control commands on a per-thread io_uring, made by its constructors
        // on the thread that built the device: this thread needs its own.
        let ring = libublk::ublk_init_ctrl_task_ring(|ring| {
            if ring.is_none() {
                let r = io_uring::IoUring::<io_uring::squeue::Entry128>::builder().build(16)?;
                *ring = Some(r);
            }
            Ok(())
        });
        if let Err(e) = ring {
            log::error!("ublk stop: no control ring: {e}");
            return;
        }
        if let Err(e) = self.ctrl.kill_dev() {
            log::debug!("ublk stop: {e}");
        }
    }
}

/// Changes a running device's capacity from another thread (a running volume's `resize`).
#[derive(Clone)]
pub struct SizeHandle {
    ctrl: Arc<UblkCtrl>,
}

impl std::fmt::Debug for SizeHandle {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("SizeHandle").field("id", &self.ctrl.dev_info().dev_id).finish()
    }
}

impl SizeHandle {
    /// Whether the loaded driver can change a device's size (`UBLK_F_UPDATE_SIZE`: the
    /// `UBLK_U_CMD_UPDATE_SIZE` command, Linux 6.16+).
    pub fn supported() -> bool {
        UblkCtrl::get_features().is_some_and(|f| f & u64::from(sys::UBLK_F_UPDATE_SIZE) != 0)
    }

    /// Sets the block device's capacity to `bytes` (a multiple of the logical block size).
    /// The caller makes sure the served device covers it before growing, and stops using
    /// the end before shrinking.
    pub fn set_size(&self, bytes: u64) -> Result<(), UblkError> {
        control_ring().map_err(driver("setting up a control ring"))?;
        if !Self::supported() {
            return Err(UblkError::Unsupported(
                "UBLK_F_UPDATE_SIZE (a device's size changes with Linux 6.16+)",
            ));
        }
        self.ctrl.update_size(bytes).map_err(driver("UPDATE_SIZE"))?;
        Ok(())
    }
}

/// Makes sure this thread has libublk's control io_uring (libublk makes it on the thread
/// that built the device; another thread needs its own).
fn control_ring() -> Result<(), libublk::UblkError> {
    libublk::ublk_init_ctrl_task_ring(|ring| {
        if ring.is_none() {
            let r = io_uring::IoUring::<io_uring::squeue::Entry128>::builder().build(16)?;
            *ring = Some(r);
        }
        Ok(())
    })
}

/// A created (or recovering) ublk device, not yet serving.
pub struct Server {
    ctrl: Arc<UblkCtrl>,
    device: Arc<dyn BlockDevice>,
    cfg: UblkConfig,
    params: sys::ublk_params,
    stop: Arc<AtomicBool>,
}

impl std::fmt::Debug for Server {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Server").field("id", &self.id()).field("cfg", &self.cfg).finish()
    }
}

impl Server {
    /// Creates the device (ADD_DEV) for `device`, or with `cfg.recover` starts user recovery
    /// of device `cfg.id` after checking that it was made for a device of the same geometry.
    /// Nothing is read from or written to `device` here.
    pub fn new(device: Arc<dyn BlockDevice>, cfg: UblkConfig) -> Result<Server, UblkError> {
        validate(&cfg)?;
        let features = check_available()?;
        let params = params_for(device.geometry(), device.caps(), &cfg)?;
        let id = cfg.id.map_or(-1, |id| id as i32);
        if cfg.id.is_some_and(|id| i32::try_from(id).is_err()) {
            return Err(UblkError::Config("device id too large".into()));
        }
        let ctrl = if cfg.recover {
            Self::recover_ctrl(id, &params)?
        } else {
            if let Some(id) = cfg.id {
                if delete_stale(id)? {
                    log::warn!("deleted ublk device {id}, left behind by a server that died");
                }
            }
            let mut flags = u64::from(sys::UBLK_F_USER_COPY) | u64::from(sys::UBLK_F_CMD_IOCTL_ENCODE);
            flags &= features | u64::from(sys::UBLK_F_USER_COPY);
            if rustix::process::geteuid().as_raw() != 0 {
                if features & u64::from(sys::UBLK_F_UNPRIVILEGED_DEV) == 0 {
                    return Err(UblkError::Unsupported("UBLK_F_UNPRIVILEGED_DEV (or run as root)"));
                }
                flags |= u64::from(sys::UBLK_F_UNPRIVILEGED_DEV);
            }
            if cfg.recoverable {
                if features & u64::from(sys::UBLK_F_USER_RECOVERY) == 0 {
                    return Err(UblkError::Unsupported("UBLK_F_USER_RECOVERY"));
                }
                // Not UBLK_F_USER_RECOVERY_FAIL_IO (6.13+): libublk 0.4 refuses the flag.
                flags |= u64::from(sys::UBLK_F_USER_RECOVERY);
            }
            let queues = if cfg.queues == 0 { nr_cpus() } else { cfg.queues };
            UblkCtrlBuilder::default()
                .name("sealdisk")
                .id(id)
                .nr_queues(queues)
                .depth(cfg.depth)
                .io_buf_bytes(cfg.max_io)
                .ctrl_flags(flags)
                .dev_flags(UblkFlags::UBLK_DEV_F_ADD_DEV)
                .build()
                .map_err(driver("adding the device"))?
        };
        Ok(Server { ctrl: Arc::new(ctrl), device, cfg, params, stop: Arc::new(AtomicBool::new(false)) })
    }

    fn recover_ctrl(id: i32, params: &sys::ublk_params) -> Result<UblkCtrl, UblkError> {
        let uid = id as u32;
        let recover_err = |reason: String| UblkError::Recover { id: uid, reason };
        if !Path::new(&format!("/sys/class/ublk-char/ublkc{uid}")).exists() {
            return Err(recover_err("no such device".into()));
        }
        // The device's own queue count and depth: libublk sizes its per-queue state by the
        // builder's values, not by what it reads back from the driver.
        let info = UblkCtrl::new_simple(id).map_err(driver("reading the device"))?.dev_info();
        let ctrl = UblkCtrlBuilder::default()
            .name("sealdisk")
            .id(id)
            .nr_queues(info.nr_hw_queues)
            .depth(info.queue_depth)
            .io_buf_bytes(info.max_io_buf_bytes)
            .dev_flags(UblkFlags::UBLK_DEV_F_RECOVER_DEV)
            .build()
            .map_err(driver("opening the device for recovery"))?;
        let info = ctrl.dev_info();
        if info.flags & u64::from(sys::UBLK_F_USER_RECOVERY) == 0 {
            return Err(recover_err("it was created without user recovery (--ublk-recoverable)".into()));
        }
        if info.flags & u64::from(sys::UBLK_F_USER_COPY) == 0 {
            return Err(recover_err("it was not created by sealdisk (no UBLK_F_USER_COPY)".into()));
        }
        if u32::from(info.state) == sys::UBLK_S_DEV_LIVE {
            return Err(recover_err("its server is still running".into()));
        }
        let mut old = sys::ublk_params {
            types: sys::UBLK_PARAM_TYPE_BASIC | sys::UBLK_PARAM_TYPE_DISCARD,
            ..Default::default()
        };
        ctrl.get_params(&mut old).map_err(driver("reading the device's parameters"))?;
        let (a, b) = (old.basic, params.basic);
        if (a.dev_sectors, a.logical_bs_shift, a.physical_bs_shift)
            != (b.dev_sectors, b.logical_bs_shift, b.physical_bs_shift)
        {
            return Err(recover_err(format!(
                "it has {} sectors of {} bytes, this volume {} of {}",
                a.dev_sectors,
                1u32 << a.logical_bs_shift,
                b.dev_sectors,
                1u32 << b.logical_bs_shift
            )));
        }
        if a.attrs & sys::UBLK_ATTR_READ_ONLY != b.attrs & sys::UBLK_ATTR_READ_ONLY {
            return Err(recover_err("read-only differs from the original server's".into()));
        }
        ctrl.start_user_recover().map_err(driver("starting user recovery"))?;
        Ok(ctrl)
    }

    /// The device id (`/dev/ublkbID`).
    pub fn id(&self) -> u32 {
        self.ctrl.dev_info().dev_id
    }

    /// The block device's path.
    pub fn block_path(&self) -> String {
        self.ctrl.get_bdev_path()
    }

    /// The number of hardware queues.
    pub fn queues(&self) -> u16 {
        self.ctrl.dev_info().nr_hw_queues
    }

    /// Whether the device was created with user recovery.
    pub fn recoverable(&self) -> bool {
        self.ctrl.dev_info().flags & u64::from(sys::UBLK_F_USER_RECOVERY) != 0
    }

    /// A handle that changes the device's size from another thread.
    pub fn size_handle(&self) -> SizeHandle {
        SizeHandle { ctrl: self.ctrl.clone() }
    }

    /// A handle that stops the device from another thread.
    pub fn stop_handle(&self) -> StopHandle {
        StopHandle { ctrl: self.ctrl.clone(), stop: self.stop.clone() }
    }

    /// Starts the device and serves it until it is stopped ([`StopHandle::stop`], or
    /// deleted from outside), calling `started` once `/dev/ublkbN` exists. Then flushes the
    /// device and deletes the ublk device. A flush failure is returned after the deletion.
    pub fn run(self, started: impl FnOnce(&str) + Send + Sync + 'static) -> Result<(), UblkError> {
        let Server { ctrl, device, cfg, params, stop } = self;
        let (tx, rx) = mpsc::channel::<queue::Job>();
        let rx = Arc::new(Mutex::new(rx));
        let workers: Vec<_> = (0..cfg.threads.max(1))
            .map(|i| {
                let (rx, device) = (rx.clone(), device.clone());
                std::thread::Builder::new()
                    .name(format!("ublk-io-{i}"))
                    .spawn(move || queue::worker(&rx, &*device))
                    .map_err(|source| UblkError::Os { what: "starting a ublk worker thread", source })
            })
            .collect::<Result<_, _>>()?;
        let shared = Arc::new(queue::Shared { tx: Mutex::new(Some(tx)), cdev: Mutex::new(None) });
        let q_shared = shared.clone();
        let tgt_shared = shared.clone();
        let stop_after_start = (ctrl.clone(), stop.clone());
        let ran = ctrl.run_target(
            move |dev| {
                dev.tgt.dev_size = params.basic.dev_sectors << 9;
                dev.tgt.params = params;
                // One more io_uring slot per queue for the completion eventfd's read.
                dev.tgt.sq_depth = dev.dev_info.queue_depth + 1;
                dev.tgt.cq_depth = dev.dev_info.queue_depth + 1;
                // SAFETY: fds[0] is /dev/ublkcN, opened by `dev` and kept open until `dev`
                // is dropped; the borrow ends within this statement (the fd is duplicated).
                let cdev = unsafe { BorrowedFd::borrow_raw(dev.tgt.fds[0]) }.try_clone_to_owned()?;
                *lock(&tgt_shared.cdev) = Some(Arc::new(cdev));
                Ok(())
            },
            move |qid, dev| queue::run_queue(qid, dev, &q_shared),
            move |ctrl| {
                started(&ctrl.get_bdev_path());
                if stop_after_start.1.load(Ordering::SeqCst) {
                    let _ = stop_after_start.0.kill_dev();
                }
            },
        );
        // The queues are gone: no more jobs. Workers drain and exit, dropping their copies
        // of the char device (the driver frees the device only once every one is closed).
        lock(&shared.tx).take();
        for w in workers {
            let _ = w.join();
        }
        lock(&shared.cdev).take();
        let flushed = device.flush();
        let deleted = ctrl.del_dev();
        ran.map_err(driver("serving the device"))?;
        if let Err(e) = deleted {
            log::debug!("ublk delete: {e}");
        }
        flushed
            .map_err(|e| UblkError::Os { what: "flushing the volume", source: std::io::Error::other(e) })?;
        Ok(())
    }
}

fn lock<T>(m: &Mutex<T>) -> std::sync::MutexGuard<'_, T> {
    m.lock().unwrap_or_else(|p| p.into_inner())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn cfg() -> UblkConfig {
        UblkConfig::default()
    }

    #[test]
    fn params_follow_the_geometry() {
        let g = Geometry { size: 1 << 30, logical_block: 4096, physical_block: 4096 };
        let p =
            params_for(g, Caps::DISCARD | Caps::FLUSH, &UblkConfig { rotational: true, ..cfg() }).unwrap();
        assert_eq!((p.basic.logical_bs_shift, p.basic.physical_bs_shift), (12, 12));
        assert_eq!(p.basic.dev_sectors, (1 << 30) >> 9);
        assert_eq!(p.basic.max_sectors, (512 << 10) >> 9);
        assert_ne!(p.basic.attrs & sys::UBLK_ATTR_ROTATIONAL, 0);
        assert_eq!(p.basic.attrs & sys::UBLK_ATTR_READ_ONLY, 0);
        assert_ne!(p.basic.attrs & sys::UBLK_ATTR_VOLATILE_CACHE, 0);
        assert_eq!(p.discard.max_discard_sectors, p.basic.max_sectors);
        assert_eq!(p.discard.max_discard_segments, 1);

        let g = Geometry { size: 1 << 20, logical_block: 512, physical_block: 4096 };
        let p = params_for(g, Caps::empty(), &UblkConfig { read_only: true, ..cfg() }).unwrap();
        assert_eq!((p.basic.logical_bs_shift, p.basic.physical_bs_shift), (9, 12));
        assert_ne!(p.basic.attrs & sys::UBLK_ATTR_READ_ONLY, 0);
        assert_eq!(p.basic.attrs & sys::UBLK_ATTR_ROTATIONAL, 0);
        // No discard without the capability; write-zeroes always.
        assert_eq!(p.discard.max_discard_sectors, 0);
        assert_ne!(p.discard.max_write_zeroes_sectors, 0);
        // A read-only device says so even without the flag.
        let p = params_for(g, Caps::READ_ONLY, &cfg()).unwrap();
        assert_ne!(p.basic.attrs & sys::UBLK_ATTR_READ_ONLY, 0);
    }

    #[test]
    fn bad_geometry_and_config_are_refused() {
        for g in [
            Geometry { size: 1 << 20, logical_block: 1000, physical_block: 4096 },
            Geometry { size: 1 << 20, logical_block: 4096, physical_block: 512 },
            Geometry { size: 0, logical_block: 512, physical_block: 512 },
            Geometry { size: 1000, logical_block: 512, physical_block: 512 },
        ] {
            assert!(params_for(g, Caps::empty(), &cfg()).is_err(), "{g:?}");
        }
        for c in [
            UblkConfig { depth: 0, ..cfg() },
            UblkConfig { depth: 5000, ..cfg() },
            UblkConfig { max_io: 1000, ..cfg() },
            UblkConfig { max_io: 2 << 20, ..cfg() },
            UblkConfig { recover: true, id: None, ..cfg() },
        ] {
            assert!(validate(&c).is_err(), "{c:?}");
        }
        assert!(validate(&cfg()).is_ok());
    }
}
