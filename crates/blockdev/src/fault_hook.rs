//! Test-only fault injection at the system-call level of [`crate::FileDevice`] (feature
//! `test-utils`; never in a release build).
//!
//! ```text
//!   FileDevice::read_at ──► hook(path, Read, off, len) ──Some(err)──► fails as pread would
//!   FileDevice::write_at ─► hook(path, Write, off, len) ─Some(err)──► fails before pwrite
//!   flush / FUA ──────────► fdatasync, then hook(path, Sync, 0, 0) ──Some(err)──► as if the
//!                                                         kernel's write-back had failed
//! ```
//!
//! The hook is process-wide (a test's server process opens its volume through the same code
//! as the CLI, so there is no other place to put it) and gets the file's path, so tests
//! running in parallel in one process each match their own files only.

use std::io;
use std::path::Path;
use std::sync::{Arc, RwLock};

/// The system call a [`Hook`] is asked about.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum FileOp {
    /// A `pread` of `len` bytes at `off`.
    Read,
    /// A `pwrite` of `len` bytes at `off`.
    Write,
    /// An `fdatasync` (flush, FUA); `off` and `len` are 0.
    Sync,
}

/// Decides whether a system call fails, and with which error.
pub type Hook = dyn Fn(&Path, FileOp, u64, u64) -> Option<io::Error> + Send + Sync;

static HOOK: RwLock<Option<Arc<Hook>>> = RwLock::new(None);

/// Installs `hook` for every `FileDevice` in the process (`None` removes it).
pub fn set(hook: Option<Arc<Hook>>) {
    *HOOK.write().unwrap_or_else(|e| e.into_inner()) = hook;
}

/// The error the installed hook injects for this call, if any.
pub(crate) fn injected(path: &Path, op: FileOp, off: u64, len: u64) -> io::Result<()> {
    let hook = HOOK.read().unwrap_or_else(|e| e.into_inner()).clone();
    match hook.and_then(|h| h(path, op, off, len)) {
        Some(e) => Err(e),
        None => Ok(()),
    }
}
