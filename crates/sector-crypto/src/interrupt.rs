//! Ending a key derivation early: a process-wide record of derivations in progress, so a
//! signal handler (the CLI's) can end the process while one runs, and only then.
//!
//! ```text
//!   pbkdf2 / argon2 ──► Deriving::enter() ── KDF runs ── drop: leave (waits if aborting)
//!   signal thread ───► abort_if_deriving(exit) ── lock; any derivation running? ── exit()
//! ```
//!
//! The KDF crates cannot be cancelled from outside, so the process ends instead. The gate's
//! lock is held while the abort callback runs (it exits the process and never returns), so
//! no derivation can *finish* meanwhile: code that derives and then writes a header never
//! reaches the write. Callers that write must derive everything first (`volume::luks` does).
//! Derivations nest (a benchmark runs the KDF), hence a count.

use std::sync::{Mutex, MutexGuard};

/// Derivations in progress.
static RUNNING: Mutex<usize> = Mutex::new(0);

fn lock() -> MutexGuard<'static, usize> {
    // The count stays valid even if a holder panicked (it only adds or subtracts one).
    RUNNING.lock().unwrap_or_else(|e| e.into_inner())
}

/// Marks a key derivation in progress for its lifetime.
pub(crate) struct Deriving(());

impl Deriving {
    /// Enters the gate (blocks forever if an abort is under way: the process is exiting).
    pub(crate) fn enter() -> Self {
        let mut n = lock();
        *n += 1;
        if *n == 1 {
            log::debug!("key derivation running (SIGINT/SIGTERM end it)");
        }
        Deriving(())
    }
}

impl Drop for Deriving {
    fn drop(&mut self) {
        let mut n = lock();
        *n = n.saturating_sub(1);
    }
}

/// True while a key derivation runs.
pub fn deriving() -> bool {
    *lock() > 0
}

/// If a key derivation is running, calls `abort` (which should end the process, e.g. with
/// `std::process::exit`) while no derivation can complete, and exits with status 1 should
/// it return; otherwise returns `false` at once.
pub fn abort_if_deriving(abort: impl FnOnce()) -> bool {
    let n = lock();
    if *n == 0 {
        return false;
    }
    abort();
    // Still holding the lock (`n`): exit never returns, so no derivation completes.
    std::process::exit(1)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn counts_nested_derivations() {
        let a = Deriving::enter();
        assert!(deriving());
        let b = Deriving::enter();
        drop(a);
        assert!(deriving());
        drop(b);
    }
}
