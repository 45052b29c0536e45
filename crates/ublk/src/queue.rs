//! One queue's thread (a task per tag and the completion task) and the worker pool.

use std::cell::RefCell;
use std::future::Future;
use std::os::fd::{AsRawFd, OwnedFd};
use std::pin::Pin;
use std::rc::Rc;
use std::sync::{mpsc, Arc, Mutex};
use std::task::{Context, Poll, Waker};

use blockdev::{BlockDevice, BlockError, WriteFlags, ZeroFlags};
use io_uring::{opcode, types};
use libublk::io::{BufDesc, UblkDev, UblkIOCtx, UblkQueue};
use libublk::{sys, UblkError};

use crate::lock;

/// What the queues share with [`crate::Server::run`].
pub(crate) struct Shared {
    /// Where jobs go; taken (closing the channel) once every queue has ended.
    pub(crate) tx: Mutex<Option<mpsc::Sender<Job>>>,
    /// A duplicate of `/dev/ublkcN` for the workers' user copies.
    pub(crate) cdev: Mutex<Option<Arc<OwnedFd>>>,
}

/// One request for a worker.
pub(crate) struct Job {
    op: u32,
    flags: u32,
    off: u64,
    len: u64,
    qid: u16,
    tag: u16,
    /// The tag's buffer, lent to the worker and returned in [`Done`].
    buf: Vec<u8>,
    cdev: Arc<OwnedFd>,
    done: Arc<Completions>,
}

/// A finished job.
struct Done {
    tag: u16,
    res: i32,
    buf: Vec<u8>,
}

/// A queue's finished jobs and the eventfd that tells its thread about them.
struct Completions {
    list: Mutex<Vec<Done>>,
    efd: OwnedFd,
}

impl Completions {
    fn push(&self, d: Done) {
        lock(&self.list).push(d);
        // Only fails if the counter would overflow, which a reader draining it prevents.
        let _ = rustix::io::write(&self.efd, &1u64.to_ne_bytes());
    }
}

/// Executes jobs until the channel closes.
pub(crate) fn worker(rx: &Mutex<mpsc::Receiver<Job>>, device: &dyn BlockDevice) {
    loop {
        let job = match lock(rx).recv() {
            Ok(j) => j,
            Err(_) => return,
        };
        let Job { op, flags, off, len, qid, tag, mut buf, cdev, done } = job;
        let res = execute(device, op, flags, off, len, qid, tag, &mut buf, &cdev);
        done.push(Done { tag, res, buf });
    }
}

fn errno(e: &BlockError) -> i32 {
    -e.kind().errno()
}

/// Runs one request on `device`; the ublk result (bytes done, or a negative errno).
#[allow(clippy::too_many_arguments)]
fn execute(
    device: &dyn BlockDevice,
    op: u32,
    flags: u32,
    off: u64,
    len: u64,
    qid: u16,
    tag: u16,
    buf: &mut Vec<u8>,
    cdev: &OwnedFd,
) -> i32 {
    let fua = flags & sys::UBLK_IO_F_FUA != 0;
    let Ok(n) = usize::try_from(len) else { return -libc::EINVAL };
    let Ok(res) = i32::try_from(len) else { return -libc::EINVAL };
    match op {
        sys::UBLK_IO_OP_READ => {
            buf.resize(n, 0);
            if let Err(e) = device.read_at(off, buf) {
                log::debug!("ublk read {off}+{len}: {e}");
                return errno(&e);
            }
            match copy(cdev, qid, tag, buf, true) {
                Ok(()) => res,
                Err(e) => e,
            }
        }
        sys::UBLK_IO_OP_WRITE => {
            buf.resize(n, 0);
            if let Err(e) = copy(cdev, qid, tag, buf, false) {
                return e;
            }
            let wflags = if fua { WriteFlags::FUA } else { WriteFlags::empty() };
            match device.write_at_scratch(off, buf, wflags) {
                Ok(()) => res,
                Err(e) => {
                    log::debug!("ublk write {off}+{len}: {e}");
                    errno(&e)
                }
            }
        }
        sys::UBLK_IO_OP_FLUSH => match device.flush() {
            Ok(()) => 0,
            Err(e) => {
                log::warn!("ublk flush: {e}");
                errno(&e)
            }
        },
        sys::UBLK_IO_OP_DISCARD => match device.discard(off, len) {
            Ok(()) => res,
            Err(e) => errno(&e),
        },
        sys::UBLK_IO_OP_WRITE_ZEROES => {
            let mut z = ZeroFlags::empty();
            if flags & sys::UBLK_IO_F_NOUNMAP == 0 {
                z |= ZeroFlags::MAY_UNMAP;
            }
            if fua {
                z |= ZeroFlags::FUA;
            }
            match device.write_zeroes(off, len, z) {
                Ok(()) => res,
                Err(e) => errno(&e),
            }
        }
        _ => -libc::EOPNOTSUPP,
    }
}

/// Copies the request's data between `buf` and the request (`to_request`: a read's data
/// out; otherwise a write's data in) through `/dev/ublkcN` (`UBLK_F_USER_COPY`).
fn copy(cdev: &OwnedFd, qid: u16, tag: u16, buf: &mut [u8], to_request: bool) -> Result<(), i32> {
    let mut done = 0usize;
    while done < buf.len() {
        let Ok(at) = u32::try_from(done) else { return Err(-libc::EINVAL) };
        let pos = UblkIOCtx::ublk_user_copy_pos(qid, tag, at);
        let r = if to_request {
            rustix::io::pwrite(cdev, &buf[done..], pos)
        } else {
            rustix::io::pread(cdev, &mut buf[done..], pos)
        };
        match r {
            Ok(0) => return Err(-libc::EIO),
            Ok(n) => done += n,
            Err(rustix::io::Errno::INTR) => {}
            Err(e) => {
                log::warn!("ublk user copy (queue {qid} tag {tag}): {e}");
                return Err(-e.raw_os_error());
            }
        }
    }
    Ok(())
}

/// Per-tag completion slots of one queue, on its thread.
struct Slots(RefCell<Vec<Slot>>);

#[derive(Default)]
struct Slot {
    done: Option<Done>,
    waker: Option<Waker>,
}

/// Resolves when the worker's [`Done`] for `tag` has arrived.
struct WaitDone<'a> {
    slots: &'a Slots,
    tag: u16,
}

impl Future for WaitDone<'_> {
    type Output = Done;
    fn poll(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Done> {
        let mut slots = self.slots.0.borrow_mut();
        let slot = &mut slots[usize::from(self.tag)];
        match slot.done.take() {
            Some(d) => Poll::Ready(d),
            None => {
                slot.waker = Some(cx.waker().clone());
                Poll::Pending
            }
        }
    }
}

/// State one queue's tasks share (single-threaded).
struct QueueCtx {
    qid: u16,
    slots: Slots,
    completions: Arc<Completions>,
    tx: Option<mpsc::Sender<Job>>,
    cdev: Option<Arc<OwnedFd>>,
    /// Tag tasks still running; the last one to end tells the completion task to stop.
    live: RefCell<usize>,
    closing: RefCell<bool>,
}

/// The thread of queue `qid`: serves its tags until the driver aborts them.
pub(crate) fn run_queue(qid: u16, dev: &UblkDev, shared: &Shared) {
    let efd = match rustix::event::eventfd(0, rustix::event::EventfdFlags::CLOEXEC) {
        Ok(fd) => fd,
        Err(e) => {
            log::error!("ublk queue {qid}: eventfd: {e}");
            return;
        }
    };
    let q = match UblkQueue::new(qid, dev) {
        Ok(q) => Rc::new(q),
        Err(e) => {
            log::error!("ublk queue {qid}: {e}");
            return;
        }
    };
    let tags: Vec<u16> = q.tags().collect();
    let ctx = Rc::new(QueueCtx {
        qid,
        slots: Slots(RefCell::new((0..q.get_depth()).map(|_| Slot::default()).collect())),
        completions: Arc::new(Completions { list: Mutex::new(Vec::new()), efd }),
        tx: lock(&shared.tx).clone(),
        cdev: lock(&shared.cdev).clone(),
        live: RefCell::new(tags.len()),
        closing: RefCell::new(false),
    });
    let exe_rc = Rc::new(smol::LocalExecutor::new());
    let exe = exe_rc.clone();
    let mut tasks = Vec::with_capacity(tags.len() + 1);
    {
        let (q, ctx) = (q.clone(), ctx.clone());
        tasks.push(exe.spawn(async move { completion_task(&q, &ctx).await }));
    }
    for tag in tags {
        let (q, ctx) = (q.clone(), ctx.clone());
        tasks.push(exe.spawn(async move {
            if let Err(e) = tag_task(&q, tag, &ctx).await {
                if !matches!(e, UblkError::QueueIsDown) {
                    log::warn!("ublk queue {} tag {tag}: {e}", ctx.qid);
                }
            }
            let last = {
                let mut live = ctx.live.borrow_mut();
                *live -= 1;
                *live == 0
            };
            if last {
                // Wake the completion task so that it sees `closing` and ends: its read
                // must not stay in flight past the executor.
                *ctx.closing.borrow_mut() = true;
                let _ = rustix::io::write(&ctx.completions.efd, &1u64.to_ne_bytes());
            }
        }));
    }
    smol::block_on(exe_rc.run(async move {
        let run_ops = || while exe.try_tick() {};
        let done = || tasks.iter().all(|t| t.is_finished());
        if let Err(e) = libublk::wait_and_handle_io_events(&q, Some(20), run_ops, done).await {
            log::error!("ublk queue {qid}: {e}");
        }
    }));
}

/// Waits for the queue's eventfd and hands finished jobs to their tags.
async fn completion_task(q: &UblkQueue<'_>, ctx: &QueueCtx) {
    let mut counter = Box::new([0u8; 8]);
    loop {
        let sqe =
            opcode::Read::new(types::Fd(ctx.completions.efd.as_raw_fd()), counter.as_mut_ptr(), 8).build();
        let r = q.ublk_submit_sqe(sqe).await;
        let finished = std::mem::take(&mut *lock(&ctx.completions.list));
        for d in finished {
            let mut slots = ctx.slots.0.borrow_mut();
            let Some(slot) = slots.get_mut(usize::from(d.tag)) else { continue };
            slot.done = Some(d);
            if let Some(w) = slot.waker.take() {
                w.wake();
            }
        }
        if *ctx.closing.borrow() {
            return;
        }
        if r < 0 && r != -libc::EINTR && r != -libc::EAGAIN {
            log::error!("ublk queue {}: reading the completion eventfd: {}", ctx.qid, -r);
            return;
        }
    }
}

/// One tag: fetch a request, hand it to a worker, commit its result and fetch the next.
async fn tag_task(q: &UblkQueue<'_>, tag: u16, ctx: &QueueCtx) -> Result<(), UblkError> {
    let mut buf = Vec::new();
    q.submit_io_prep_cmd(tag, BufDesc::Slice(&[]), -1, None).await?;
    loop {
        let iod = q.get_iod(tag);
        let op = iod.op_flags & 0xff;
        let flags = iod.op_flags & !0xff;
        let off = iod.start_sector << 9;
        let len = u64::from(iod.nr_sectors) << 9;
        let res = match (&ctx.tx, &ctx.cdev) {
            (Some(tx), Some(cdev)) => {
                let job = Job {
                    op,
                    flags,
                    off,
                    len,
                    qid: ctx.qid,
                    tag,
                    buf: std::mem::take(&mut buf),
                    cdev: cdev.clone(),
                    done: ctx.completions.clone(),
                };
                match tx.send(job) {
                    Ok(()) => {
                        let d = WaitDone { slots: &ctx.slots, tag }.await;
                        buf = d.buf;
                        d.res
                    }
                    Err(_) => -libc::EIO,
                }
            }
            _ => -libc::EIO,
        };
        q.submit_io_commit_cmd(tag, BufDesc::Slice(&[]), res).await?;
    }
}

#[cfg(test)]
mod tests {
    use std::os::unix::fs::FileExt;

    use blockdev::{Caps, Geometry, MemDevice};

    use super::*;

    /// A device that records flushes, discards and write-zeroes flags.
    #[derive(Debug)]
    struct Recorder {
        mem: MemDevice,
        log: Mutex<Vec<String>>,
    }

    impl BlockDevice for Recorder {
        fn geometry(&self) -> Geometry {
            self.mem.geometry()
        }
        fn caps(&self) -> Caps {
            Caps::DISCARD
        }
        fn read_at(&self, off: u64, buf: &mut [u8]) -> blockdev::BlockResult<()> {
            self.mem.read_at(off, buf)
        }
        fn write_at(&self, off: u64, buf: &[u8], flags: WriteFlags) -> blockdev::BlockResult<()> {
            lock(&self.log).push(format!("write {off} {} {flags:?}", buf.len()));
            self.mem.write_at(off, buf, flags)
        }
        fn flush(&self) -> blockdev::BlockResult<()> {
            lock(&self.log).push("flush".into());
            Ok(())
        }
        fn discard(&self, off: u64, len: u64) -> blockdev::BlockResult<()> {
            lock(&self.log).push(format!("discard {off} {len}"));
            Ok(())
        }
        fn write_zeroes(&self, off: u64, len: u64, flags: ZeroFlags) -> blockdev::BlockResult<()> {
            lock(&self.log).push(format!("zeroes {off} {len} {flags:?}"));
            Ok(())
        }
    }

    /// Every request kind reaches the matching trait call, and READ/WRITE data moves
    /// through the user-copy offsets of the char device (here a sparse file standing in).
    #[test]
    fn requests_map_to_the_trait_and_data_goes_through_the_user_copy_offsets() {
        let dev = Recorder { mem: MemDevice::new(1 << 20, 512), log: Mutex::new(Vec::new()) };
        let cdev_file = tempfile::tempfile().unwrap();
        let (qid, tag) = (1u16, 5u16);
        let pos = UblkIOCtx::ublk_user_copy_pos(qid, tag, 0);
        let data: Vec<u8> = (0..8192u32).map(|i| (i * 7 % 251) as u8).collect();
        cdev_file.write_all_at(&data, pos).unwrap();
        let cdev = OwnedFd::from(cdev_file);
        let mut buf = Vec::new();
        let run =
            |op, flags, off, len, buf: &mut Vec<u8>| execute(&dev, op, flags, off, len, qid, tag, buf, &cdev);

        assert_eq!(run(sys::UBLK_IO_OP_WRITE, sys::UBLK_IO_F_FUA, 4096, 8192, &mut buf), 8192);
        let mut back = vec![0u8; 8192];
        dev.mem.read_at(4096, &mut back).unwrap();
        assert_eq!(back, data, "the write's data is what the request carried");

        // A read puts the device's data where the request's data goes.
        let file = std::fs::File::from(cdev.try_clone().unwrap());
        file.write_all_at(&[0u8; 8192], pos).unwrap();
        assert_eq!(run(sys::UBLK_IO_OP_READ, 0, 4096, 8192, &mut buf), 8192);
        let mut out = vec![0u8; 8192];
        file.read_exact_at(&mut out, pos).unwrap();
        assert_eq!(out, data);

        assert_eq!(run(sys::UBLK_IO_OP_FLUSH, 0, 0, 0, &mut buf), 0);
        assert_eq!(run(sys::UBLK_IO_OP_DISCARD, 0, 0, 65536, &mut buf), 65536);
        assert_eq!(run(sys::UBLK_IO_OP_WRITE_ZEROES, 0, 512, 1024, &mut buf), 1024);
        assert_eq!(
            run(sys::UBLK_IO_OP_WRITE_ZEROES, sys::UBLK_IO_F_NOUNMAP | sys::UBLK_IO_F_FUA, 0, 512, &mut buf),
            512
        );
        assert_eq!(run(sys::UBLK_IO_OP_ZONE_OPEN, 0, 0, 512, &mut buf), -libc::EOPNOTSUPP);
        // Out of range: the device's error, as a negative errno.
        assert_eq!(run(sys::UBLK_IO_OP_READ, 0, 1 << 20, 512, &mut buf), -libc::EINVAL);
        assert_eq!(
            *lock(&dev.log),
            [
                "write 4096 8192 WriteFlags(FUA)".to_string(),
                "flush".into(),
                "discard 0 65536".into(),
                "zeroes 512 1024 ZeroFlags(MAY_UNMAP)".into(),
                "zeroes 0 512 ZeroFlags(FUA)".into(),
            ]
        );
    }
}
