//! Errors of block operations: a small stable kind, the operation's context, and a source.

use std::fmt;

/// What went wrong, for callers to match on (transports map it to an errno).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
#[non_exhaustive]
pub enum BlockErrorKind {
    /// Offset or length not a multiple of the logical block size.
    Misaligned,
    /// The range reaches past the end of the device.
    OutOfRange,
    /// The operation is not supported by this device.
    Unsupported,
    /// The device is read-only.
    ReadOnly,
    /// An I/O error from the layer below or the OS.
    Io,
    /// Stored data failed its integrity or authentication check. `sector` is the
    /// 512-byte sector (relative to the device reporting it) of the first bad block.
    IntegrityMismatch {
        /// First bad 512-byte sector.
        sector: u64,
    },
    /// An earlier metadata write failed; the device refuses writes until reopened.
    Poisoned,
    /// Out of space (e.g. a backing file could not grow).
    NoSpace,
    /// An invalid argument that is not an alignment or range problem.
    InvalidArgument,
    /// The storage is in use: another opener holds a conflicting lock on it
    /// (`FileOptions::lock`).
    Busy,
}

impl BlockErrorKind {
    /// The errno an NBD server or FUSE layer answers with for this kind.
    pub fn errno(self) -> i32 {
        match self {
            BlockErrorKind::Misaligned | BlockErrorKind::InvalidArgument => libc::EINVAL,
            BlockErrorKind::OutOfRange => libc::EINVAL,
            BlockErrorKind::Unsupported => libc::EOPNOTSUPP,
            BlockErrorKind::ReadOnly => libc::EPERM,
            BlockErrorKind::Io | BlockErrorKind::Poisoned => libc::EIO,
            BlockErrorKind::IntegrityMismatch { .. } => libc::EILSEQ,
            BlockErrorKind::NoSpace => libc::ENOSPC,
            BlockErrorKind::Busy => libc::EBUSY,
        }
    }
}

/// A failed block operation.
#[derive(Debug, thiserror::Error)]
pub struct BlockError {
    kind: BlockErrorKind,
    ctx: String,
    #[source]
    source: Option<Box<dyn std::error::Error + Send + Sync + 'static>>,
}

/// Result of block operations.
pub type BlockResult<T> = Result<T, BlockError>;

impl fmt::Display for BlockError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self.kind {
            BlockErrorKind::IntegrityMismatch { sector } => {
                write!(f, "integrity check failed at sector {sector}")?;
                if !self.ctx.is_empty() {
                    write!(f, " ({})", self.ctx)?;
                }
                Ok(())
            }
            _ => f.write_str(&self.ctx),
        }
    }
}

impl BlockError {
    /// An error of `kind` with a human-readable context for this level.
    pub fn new(kind: BlockErrorKind, ctx: impl Into<String>) -> Self {
        BlockError { kind, ctx: ctx.into(), source: None }
    }

    /// Attaches the underlying cause.
    pub fn with_source(mut self, source: impl std::error::Error + Send + Sync + 'static) -> Self {
        self.source = Some(Box::new(source));
        self
    }

    /// The kind, for matching.
    pub fn kind(&self) -> BlockErrorKind {
        self.kind
    }

    /// Offset or length not aligned to `block`.
    pub fn misaligned(off: u64, len: u64, block: u32) -> Self {
        Self::new(
            BlockErrorKind::Misaligned,
            format!("request at {off} length {len} is not aligned to {block}-byte blocks"),
        )
    }

    /// Range past the end.
    pub fn out_of_range(off: u64, len: u64, size: u64) -> Self {
        Self::new(
            BlockErrorKind::OutOfRange,
            format!("request at {off} length {len} is beyond the device end ({size} bytes)"),
        )
    }

    /// Unsupported operation.
    pub fn unsupported(op: &str) -> Self {
        Self::new(BlockErrorKind::Unsupported, format!("{op} is not supported by this device"))
    }

    /// Write to a read-only device.
    pub fn read_only() -> Self {
        Self::new(BlockErrorKind::ReadOnly, "device is read-only")
    }

    /// Integrity failure at `sector`.
    pub fn integrity(sector: u64) -> Self {
        Self::new(BlockErrorKind::IntegrityMismatch { sector }, String::new())
    }

    /// An OS I/O error during `what`.
    pub fn io(what: impl Into<String>, err: std::io::Error) -> Self {
        let kind = match err.raw_os_error() {
            Some(libc::ENOSPC) | Some(libc::EDQUOT) => BlockErrorKind::NoSpace,
            Some(libc::EROFS) | Some(libc::EPERM) | Some(libc::EACCES) => BlockErrorKind::ReadOnly,
            _ => BlockErrorKind::Io,
        };
        Self::new(kind, what).with_source(err)
    }
}
