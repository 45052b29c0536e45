//! `sealdisk bench`: the same workloads against any stack, in-process or over NBD.
//!
//! ```text
//!   JobSpec (fio vocabulary) ──► engine::run_job ──► JobResult ──► report (fio text | JSON)
//!                                     │
//!                        Target ──────┴──────┐
//!              DeviceTarget (Arc<dyn BlockDevice>)   NbdTarget (nbd+unix://, nbd://)
//!                        ▲
//!   StackSpec (raw | crypt | integrity | crypt-integrity | luks2 | luks2-integrity) ──build──► temporary volume
//!             (integrity and LUKS2 formatted and opened through `volume`, as a user would)
//!
//!   compare: variants × points × repetitions (interleaved) ──► medians, spread, side-by-side
//!            table, SVG chart
//!   presets: one per seed experiment, each a list of comparisons (presets.rs)
//!   format_speed: integritysetup format (with wipe) beside a raw sequential write
//!   suite:   `sealdisk bench` with no arguments (suite.rs)
//!   micro:   `sealdisk benchmark`, cipher / hash / KDF throughput in memory (micro.rs)
//! ```
//!
//! Measurements: every request's completion latency goes into an HdrHistogram (ns, 3
//! significant digits) plus exact moments; percentiles 1…99.99, min/avg/max/stdev, IOPS and
//! bandwidth over the measured window; CPU from `getrusage` for the whole process.
#![forbid(unsafe_code)]
#![warn(missing_docs)]

pub mod clock;
pub mod compare;
pub mod cpu;
pub mod engine;
pub mod format_speed;
pub mod fs_workload;
pub mod gen;
pub mod locks;
pub mod micro;
pub mod presets;
mod progress;
pub mod report;
pub mod rng;
pub mod spec;
pub mod stack;
pub mod stats;
pub mod suite;
pub mod svg;
pub mod target;
pub mod verify;

pub use engine::{run_job, JobResult, RunOptions};
pub use spec::{JobSpec, RwMode};
pub use stack::{StackKind, StackSpec};
pub use target::{DeviceTarget, NbdTarget, NbdUri, Target};

use gen::Dir;

/// Everything that can go wrong in a benchmark. Display says what failed at this level; the
/// cause is the source.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum BenchError {
    /// Bad options or an impossible combination.
    #[error("{0}")]
    Usage(String),
    /// The stack, preset or feature exists in name only so far.
    #[error("{0}")]
    NotImplemented(String),
    /// A request failed on an in-process device.
    #[error("{op:?} of {len} bytes at offset {offset} failed")]
    Device {
        /// Direction.
        op: Dir,
        /// Offset.
        offset: u64,
        /// Length.
        len: u64,
        /// Cause.
        #[source]
        source: blockdev::BlockError,
    },
    /// A flush failed on an in-process device.
    #[error("flush failed")]
    Flush {
        /// Cause.
        #[source]
        source: blockdev::BlockError,
    },
    /// Data read back is not what was written.
    #[error("verify failed")]
    Verify(#[source] verify::VerifyError),
    /// A socket operation failed.
    #[error("NBD: {context}")]
    NbdIo {
        /// What was being done.
        context: String,
        /// Cause.
        #[source]
        source: std::io::Error,
    },
    /// The server broke the protocol or refused the connection.
    #[error("NBD: {0}")]
    NbdProtocol(String),
    /// The server answered a request with an error.
    #[error("NBD: {what} failed with NBD error {errno}")]
    NbdReply {
        /// The request.
        what: String,
        /// NBD error number (5 = EIO, 22 = EINVAL, ...).
        errno: u32,
    },
    /// Setting up a stack or temporary volume failed.
    #[error("{context}")]
    Setup {
        /// What was being set up.
        context: String,
        /// Cause.
        #[source]
        source: Box<dyn std::error::Error + Send + Sync>,
    },
    /// Stopped by a signal.
    #[error("interrupted")]
    Interrupted,
    /// A bug in the harness.
    #[error("internal error: {0}")]
    Internal(String),
}

impl BenchError {
    /// A usage error.
    pub fn usage(msg: impl Into<String>) -> Self {
        BenchError::Usage(msg.into())
    }

    /// A setup error with its cause.
    pub fn setup(context: impl Into<String>, source: impl std::error::Error + Send + Sync + 'static) -> Self {
        BenchError::Setup { context: context.into(), source: Box::new(source) }
    }
}
