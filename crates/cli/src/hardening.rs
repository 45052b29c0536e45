//! Process hardening for the actions that handle keys, and signals during key derivation.
//!
//! ```text
//!   main ── handles keys? ──► harden_process (non-dumpable, RLIMIT_CORE 0)
//!                        └──► signal thread: SIGINT/SIGTERM ──┬─ a KDF is running ──► "Interrupted by
//!                                                             │    signal, nothing was written.", exit 128+N
//!                                                             ├─ serving (serve.rs) ──► ignored here: the
//!                                                             │    server's own handler shuts down gracefully
//!                                                             ├─ wiping (first signal) ──► stop requested: the
//!                                                             │    wipe stops at its next chunk, flushes, and
//!                                                             │    the action says how far it got (wipe.rs)
//!                                                             └─ otherwise ──► the signal's default action
//! ```
//!
//! cryptsetup blocks or defers signals while it derives, so a header with a huge Argon2
//! time cost keeps it busy for as long as the header says. Here the KDF runs on the action's
//! thread and a separate thread waits for the signal; the KDF crates cannot be cancelled, so
//! the process exits, holding `sector_crypto::interrupt`'s gate so that no derivation can
//! complete and let a write begin. Every action derives all its keys before its first write
//! (`volume::luks` is built that way), so nothing has been written when this happens. Exit
//! status 128 + the signal number (130 for SIGINT, 143 for SIGTERM), the shell's convention:
//! cryptsetup has no status of its own for an interruption (it reports a generic failure).

use std::sync::atomic::{AtomicBool, AtomicI32, Ordering};

use anyhow::{Context, Result};
use signal_hook::consts::{SIGINT, SIGTERM};

/// Set once the NBD server has its own SIGINT/SIGTERM handler.
static SERVING: AtomicBool = AtomicBool::new(false);

/// Set while a long wipe runs that can stop cleanly (see [`wiping`]).
static WIPING: AtomicBool = AtomicBool::new(false);

/// The signal that asked a wipe to stop (0: none).
static STOP: AtomicI32 = AtomicI32::new(0);

/// The message printed when a signal ends a key derivation.
pub const INTERRUPTED: &str = "Interrupted by signal, nothing was written.";

/// Hardens the process (see `sector_crypto::secure::harden_process`) and starts the thread
/// that ends a key derivation on SIGINT/SIGTERM. Call first thing in actions that handle keys.
pub fn install() -> Result<()> {
    sector_crypto::secure::harden_process().context("making the process non-dumpable")?;
    let mut signals =
        signal_hook::iterator::Signals::new([SIGINT, SIGTERM]).context("installing signal handlers")?;
    std::thread::Builder::new()
        .name("kdf-signals".into())
        .spawn(move || {
            for sig in signals.forever() {
                sector_crypto::interrupt::abort_if_deriving(|| {
                    eprintln!("sealdisk: {INTERRUPTED}");
                    std::process::exit(128 + sig);
                });
                if SERVING.load(Ordering::SeqCst) {
                    continue;
                }
                // The first signal during a wipe asks it to stop; a second one is not held up.
                if WIPING.load(Ordering::SeqCst)
                    && STOP.compare_exchange(0, sig, Ordering::SeqCst, Ordering::SeqCst).is_ok()
                {
                    continue;
                }
                // Neither deriving nor serving: behave as if no handler were installed (after
                // giving the terminal its echo back, should a passphrase prompt be open).
                crate::keys::restore_terminal();
                if let Err(e) = signal_hook::low_level::emulate_default_handler(sig) {
                    eprintln!("sealdisk: signal {sig}: {e}");
                    std::process::exit(128 + sig);
                }
            }
        })
        .context("starting the signal thread")?;
    Ok(())
}

/// Hands SIGINT/SIGTERM to a server's graceful shutdown: registers a handler, marks the
/// process as serving (no key derivation happens after this point) and runs `on_signals` on a
/// thread named `signals` with the signals as they arrive.
pub fn serving(on_signals: impl FnOnce(&mut dyn Iterator<Item = i32>) + Send + 'static) -> Result<()> {
    let mut signals =
        signal_hook::iterator::Signals::new([SIGINT, SIGTERM]).context("installing signal handlers")?;
    SERVING.store(true, Ordering::SeqCst);
    std::thread::Builder::new()
        .name("signals".into())
        .spawn(move || on_signals(&mut signals.forever()))
        .context("starting the signal thread")?;
    Ok(())
}

/// Marks a wipe that can stop cleanly as running (`true`) or over (`false`): while it runs,
/// the first SIGINT/SIGTERM only sets [`stop_requested`], which the wipe polls between
/// chunks; a second signal has its default action.
pub fn wiping(on: bool) {
    WIPING.store(on, Ordering::SeqCst);
}

/// The signal that asked the running wipe to stop, if one did.
pub fn stop_requested() -> Option<i32> {
    match STOP.load(Ordering::SeqCst) {
        0 => None,
        sig => Some(sig),
    }
}
