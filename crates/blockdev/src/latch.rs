//! Latched write-back errors: once durability has failed, every later durability request
//! fails too, until the device is reopened.
//!
//! ```text
//!   flush / FUA ──► latch.check() ──latched──► Err(Io "an earlier write-back failed …")
//!                        │ clear
//!                        ▼
//!                   fdatasync / flush below ──Err──► latch.record(err) ──► Err(err)
//! ```
//!
//! # Why
//! Linux reports a failed write-back (`EIO`, or `ENOSPC` on thin or network storage) to
//! `fsync` through the file's `errseq_t`: *once per open file description*. The pages whose
//! write-back failed are marked clean and may be dropped, so the data is gone, yet the next
//! `fsync` on the same descriptor returns 0. A device that forwards that second answer to an
//! NBD client turns a retried FLUSH into a lie: the client believes data is durable that was
//! lost ("fsyncgate", PostgreSQL 2018). A `WritebackLatch` remembers the first failure and
//! fails every later flush and FUA write with `BlockErrorKind::Io` until the device is
//! dropped and opened again; the caller (a file system, a database) then knows that it must
//! recover from its own log, not retry.
//!
//! Plain writes are not refused: a write never promised durability, and a failed `pwrite`
//! reports its error to the request that issued it (nothing acknowledged was lost), so it
//! does not latch either. Reads are never refused.
//!
//! Layers that buffer (dm-integrity's journal and tag buffers) keep their own latch (their
//! "poisoned" state) because a failure of *their* write-back loses data the layer below never
//! saw; layers that pass flushes straight down (crypt) inherit the latch of the device below.

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Mutex;

use crate::{BlockError, BlockErrorKind, BlockResult};

/// Remembers the first failed write-back of a device (see the module docs).
#[derive(Debug, Default)]
pub struct WritebackLatch {
    latched: AtomicBool,
    /// The first failure's message, quoted in every later refusal.
    first: Mutex<Option<String>>,
}

impl WritebackLatch {
    /// A clear latch.
    pub fn new() -> Self {
        Self::default()
    }

    /// Whether a write-back has failed.
    pub fn is_latched(&self) -> bool {
        self.latched.load(Ordering::SeqCst)
    }

    /// Fails with `Io` once a write-back has failed; `op` names the refused request.
    pub fn check(&self, op: &str) -> BlockResult<()> {
        if !self.is_latched() {
            return Ok(());
        }
        let first = self.first.lock().unwrap_or_else(|e| e.into_inner()).clone().unwrap_or_default();
        Err(BlockError::new(
            BlockErrorKind::Io,
            format!(
                "{op} refused: an earlier write-back failed ({first}); data written before it may be \
                 lost, so no flush can succeed until the volume is reopened"
            ),
        ))
    }

    /// Latches `err` (the first one is kept for messages).
    pub fn record(&self, err: &BlockError) {
        let mut first = self.first.lock().unwrap_or_else(|e| e.into_inner());
        if first.is_none() {
            *first = Some(err.to_string());
        }
        self.latched.store(true, Ordering::SeqCst);
    }

    /// Passes `r` through, latching it if it is an error. For a write-back step.
    pub fn guard<T>(&self, r: BlockResult<T>) -> BlockResult<T> {
        r.inspect_err(|e| self.record(e))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn first_failure_is_kept_and_refuses_later_checks() {
        let l = WritebackLatch::new();
        l.check("flush").unwrap();
        let _ = l.guard::<()>(Err(BlockError::new(BlockErrorKind::Io, "fdatasync: EIO")));
        let _ = l.guard::<()>(Err(BlockError::new(BlockErrorKind::NoSpace, "second")));
        assert!(l.is_latched());
        let e = l.check("flush").unwrap_err();
        assert_eq!(e.kind(), BlockErrorKind::Io);
        assert!(
            e.to_string().contains("flush refused: an earlier write-back failed (fdatasync: EIO)"),
            "{e}"
        );
        l.guard(Ok(())).unwrap();
    }
}
