//! In-process: the job calls the stack's `BlockDevice` directly.
//!
//! Queue depth maps to threads: `iodepth = N` runs N worker threads per clone, each making
//! one synchronous call at a time, so N requests are in flight, as with fio's `psync` engine
//! and `numjobs = N` (and as the NBD server does, one worker per request in flight). There is
//! no submission queue to time separately: a request's latency is its call.

use std::sync::Arc;

use blockdev::{BlockDevice, WriteFlags};

use super::{Target, TargetInfo};
use crate::engine::CloneCtx;
use crate::gen::Dir;
use crate::BenchError;

/// Any `BlockDevice`, in-process.
#[derive(Debug, Clone)]
pub struct DeviceTarget {
    dev: Arc<dyn BlockDevice>,
    info: TargetInfo,
}

impl DeviceTarget {
    /// `dev`, described as `description` in reports.
    pub fn new(dev: Arc<dyn BlockDevice>, description: impl Into<String>) -> Self {
        let g = dev.geometry();
        // FUA is always honoured in-process: the contract makes a device emulate it (with a
        // flush) where it lacks it natively, so `sync` works on every stack.
        let info =
            TargetInfo { size: g.size, block: g.logical_block, fua: true, description: description.into() };
        DeviceTarget { dev, info }
    }

    /// The device.
    pub fn device(&self) -> &Arc<dyn BlockDevice> {
        &self.dev
    }
}

impl Target for DeviceTarget {
    fn info(&self) -> &TargetInfo {
        &self.info
    }

    fn run_clone(&self, ctx: &CloneCtx<'_>) -> Result<(), BenchError> {
        let dev = &*self.dev;
        let flags = if ctx.sync() { WriteFlags::FUA } else { WriteFlags::empty() };
        let worker = |index: usize| -> Result<(), BenchError> {
            let mut w = ctx.worker();
            let mut buf: Option<blockdev::AlignedBuf> = None;
            let result = (|| {
                while let Some(op) = ctx.next_op() {
                    let len = op.len as usize;
                    if buf.as_ref().is_none_or(|b| b.len() < len) {
                        buf = Some(ctx.buffer(len, index as u64));
                    }
                    let data = &mut buf.as_mut().expect("buffer allocated above").as_mut_slice()[..len];
                    let r = match op.dir {
                        Dir::Read => {
                            let t0 = ctx.now();
                            let r = dev.read_at(op.offset, data);
                            (t0, ctx.now(), r)
                        }
                        Dir::Write => {
                            ctx.prepare_write(&op, data);
                            let t0 = ctx.now();
                            let r = dev.write_at(op.offset, data, flags);
                            (t0, ctx.now(), r)
                        }
                    };
                    let (t0, t1, r) = r;
                    r.map_err(|source| BenchError::Device {
                        op: op.dir,
                        offset: op.offset,
                        len: op.len,
                        source,
                    })?;
                    ctx.complete(&mut w, &op, t0, t1, data)?;
                }
                Ok(())
            })();
            ctx.finish(w);
            if result.is_err() {
                ctx.abort();
            }
            result
        };
        let depth = ctx.iodepth();
        let result = if depth == 1 {
            worker(0)
        } else {
            std::thread::scope(|s| {
                let handles: Vec<_> = (0..depth).map(|i| s.spawn(move || worker(i))).collect();
                let mut first = Ok(());
                for h in handles {
                    let r = h
                        .join()
                        .unwrap_or_else(|_| Err(BenchError::Internal("a worker thread panicked".into())));
                    if first.is_ok() {
                        first = r;
                    }
                }
                first
            })
        };
        result?;
        if ctx.end_fsync() {
            dev.flush().map_err(|source| BenchError::Flush { source })?;
        }
        Ok(())
    }
}
