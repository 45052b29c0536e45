//! What a job runs against: one small trait, two implementations.
//!
//! ```text
//!   Target ─┬─ DeviceTarget   any Arc<dyn BlockDevice>, in-process, no transport:
//!           │                 iodepth N = N worker threads, each making synchronous calls
//!           └─ NbdTarget      any NBD URI (sealdisk's server or a peer's): one connection per
//!                             clone, iodepth requests pipelined on it (fio's nbd engine)
//! ```
//!
//! A target knows how to keep `ctx.iodepth()` requests in flight for one clone of a job and
//! how to time them; the engine ([`crate::engine`]) owns everything else.

mod device;
mod nbd;

pub use device::DeviceTarget;
pub use nbd::{NbdTarget, NbdUri};

use crate::engine::CloneCtx;
use crate::BenchError;

/// What a target is.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct TargetInfo {
    /// Size in bytes.
    pub size: u64,
    /// Request alignment in bytes (the device's logical block, NBD's minimum block size).
    pub block: u32,
    /// Whether writes can be made durable on completion (FUA).
    pub fua: bool,
    /// One line for reports, e.g. `crypt(aes-xts-plain64, 4096) over file /tmp/x (buffered)`.
    pub description: String,
}

/// Something a job can run against.
pub trait Target: Send + Sync + std::fmt::Debug {
    /// Size, alignment and description.
    fn info(&self) -> &TargetInfo;

    /// Runs one clone of a job: takes requests from `ctx.next_op()` until it returns `None`,
    /// keeping up to `ctx.iodepth()` in flight; reports each completion with `ctx.complete`
    /// (timed from just before submission to just after completion, on `ctx.now()`), gives
    /// every worker's statistics back with `ctx.finish`, and flushes at the end when
    /// `ctx.end_fsync()`. Returns the first error; requests already in flight are completed
    /// or abandoned, never left running after return.
    fn run_clone(&self, ctx: &CloneCtx<'_>) -> Result<(), BenchError>;
}
