//! Memory for secrets, and the process settings that keep secrets out of core dumps.
//!
//! ```text
//!   SecretBuf::zeroed(n) ──► mmap(anonymous, private, whole pages)
//!                              ├─ madvise(MADV_DONTDUMP)   never in a core dump
//!                              ├─ madvise(MADV_WIPEONFORK) a forked child sees zeroes
//!                              └─ mlock                    never swapped (if RLIMIT_MEMLOCK allows)
//!   drop ──► volatile zeroing of every page ──► munlock ──► munmap
//! ```
//!
//! This is libsodium's `sodium_malloc` / cryptsetup's `crypt_safe_alloc` idea: secrets live
//! in pages of their own, so locking and dump exclusion never touch unrelated heap data, and
//! wiping cannot be skipped by a reallocation that left a copy behind (a [`SecretBuf`] never
//! grows). Every secret type of this crate ([`VolumeKey`](crate::VolumeKey),
//! [`Passphrase`](crate::kdf::Passphrase), KDF outputs, AF material) stores its bytes here.
//!
//! Degrading gracefully: an unprivileged process may lock only `RLIMIT_MEMLOCK` bytes (often
//! 64 KiB to 8 MiB). When `mlock` fails the buffer stays usable, unlocked, still excluded
//! from dumps and still wiped; the first failure is logged once at debug level. If even
//! `mmap` fails, the bytes go to an ordinary heap allocation that is still wiped on drop.
//!
//! [`harden_process`] makes the whole process non-dumpable (`PR_SET_DUMPABLE` 0: no core
//! dump, no ptrace attach or `/proc/PID/mem` read by other processes of the same user) and
//! sets `RLIMIT_CORE` to 0, for the key schedules that live outside these pages (aws-lc
//! contexts, RustCrypto cipher and MAC states: wiped on drop, but on the ordinary heap).
//!
//! All of this module's `unsafe` is the mapping's lifecycle; each block states its invariant.

use std::ffi::c_void;
use std::fmt;
use std::ops::{Deref, DerefMut};
use std::ptr::NonNull;
use std::sync::atomic::{AtomicBool, Ordering};

use zeroize::Zeroize;

/// Set after the first `mlock` failure was logged (logged once per process).
static MLOCK_FAILURE_LOGGED: AtomicBool = AtomicBool::new(false);

/// Where a [`SecretBuf`]'s bytes are.
enum Storage {
    /// Whole anonymous pages of our own (the normal case).
    Mapped {
        /// Start of the mapping (page-aligned).
        ptr: NonNull<u8>,
        /// Length of the mapping: `len` rounded up to whole pages, at least one page.
        map_len: usize,
        /// Whether `mlock` succeeded.
        locked: bool,
    },
    /// Ordinary heap bytes: empty buffers, or when `mmap` failed. Still wiped on drop.
    Heap(Box<[u8]>),
}

/// A fixed-length byte buffer for secrets: page-granular, locked in memory where the
/// `RLIMIT_MEMLOCK` allows, excluded from core dumps, zeroed on drop. Its `Debug` shows only
/// the length. It derefs to `[u8]`; it never grows (so no copy is ever left behind by a
/// reallocation), but [`truncate`](Self::truncate) can shorten it.
pub struct SecretBuf {
    storage: Storage,
    len: usize,
}

// SAFETY: a `SecretBuf` is the unique owner of its mapping (nothing else holds the pointer);
// the bytes are only reached through `&self` (shared reads) or `&mut self` (exclusive), as for
// a `Box<[u8]>`, which is `Send + Sync`.
unsafe impl Send for SecretBuf {}
// SAFETY: see `Send`: shared access is read-only.
unsafe impl Sync for SecretBuf {}

impl SecretBuf {
    /// `len` zero bytes in secret pages.
    pub fn zeroed(len: usize) -> Self {
        if len == 0 {
            return SecretBuf { storage: Storage::Heap(Box::default()), len };
        }
        match map_pages(len) {
            Some(storage) => SecretBuf { storage, len },
            None => SecretBuf { storage: Storage::Heap(vec![0u8; len].into_boxed_slice()), len },
        }
    }

    /// A secret copy of `bytes`.
    pub fn from_slice(bytes: &[u8]) -> Self {
        let mut s = Self::zeroed(bytes.len());
        s.copy_from_slice(bytes);
        s
    }

    /// Moves `bytes` into secret pages and wipes the vector (its whole capacity).
    pub fn from_vec(mut bytes: Vec<u8>) -> Self {
        let s = Self::from_slice(&bytes);
        bytes.zeroize();
        s
    }

    /// The bytes.
    pub fn as_bytes(&self) -> &[u8] {
        self
    }

    /// The bytes, writable.
    pub fn as_bytes_mut(&mut self) -> &mut [u8] {
        self
    }

    /// Shortens the buffer to `len` bytes (no effect if it is not longer), zeroing the rest.
    pub fn truncate(&mut self, len: usize) {
        if len < self.len {
            self.as_bytes_mut()[len..].zeroize();
            self.len = len;
        }
    }

    /// True if the pages are locked in memory (`mlock` succeeded).
    pub fn is_locked(&self) -> bool {
        matches!(self.storage, Storage::Mapped { locked: true, .. })
    }

    /// True if the bytes live in pages of their own (excluded from core dumps), false for
    /// an empty buffer or the heap fallback.
    pub fn is_mapped(&self) -> bool {
        matches!(self.storage, Storage::Mapped { .. })
    }
}

/// Maps `len` bytes of whole pages, marks them don't-dump and wipe-on-fork, and tries to
/// lock them. `None` if the mapping itself fails.
fn map_pages(len: usize) -> Option<Storage> {
    use rustix::mm::{MapFlags, ProtFlags};
    let page = rustix::param::page_size();
    let map_len = len.checked_next_multiple_of(page)?;
    // SAFETY: an anonymous private mapping at an address the kernel chooses (null hint) does
    // not alias any existing memory; the returned pointer is owned by the `Storage` built
    // below and unmapped exactly once, in `Drop`.
    let raw = unsafe {
        rustix::mm::mmap_anonymous(
            std::ptr::null_mut(),
            map_len,
            ProtFlags::READ | ProtFlags::WRITE,
            MapFlags::PRIVATE,
        )
    }
    .ok()?;
    let ptr = NonNull::new(raw.cast::<u8>())?;
    #[cfg(target_os = "linux")]
    {
        use rustix::mm::Advice;
        // SAFETY: `raw..raw + map_len` is exactly the mapping created above; these advices
        // change only dump and fork behaviour, never the contents or validity of the pages.
        let dontdump = unsafe { rustix::mm::madvise(raw, map_len, Advice::LinuxDontDump) };
        if let Err(e) = dontdump {
            log::debug!("madvise(MADV_DONTDUMP) on secret memory failed: {e}");
        }
        // SAFETY: as above. MADV_WIPEONFORK (Linux 4.14+) may be refused by older kernels.
        let _ = unsafe { rustix::mm::madvise(raw, map_len, Advice::LinuxWipeOnFork) };
    }
    // SAFETY: `raw..raw + map_len` is the mapping created above; locking does not change it.
    let locked = match unsafe { rustix::mm::mlock(raw, map_len) } {
        Ok(()) => true,
        Err(e) => {
            if !MLOCK_FAILURE_LOGGED.swap(true, Ordering::Relaxed) {
                log::debug!(
                    "cannot lock {map_len} bytes of key memory ({e}; RLIMIT_MEMLOCK too low?): \
                     keys may be swapped out; they are still wiped and kept out of core dumps"
                );
            }
            false
        }
    };
    Some(Storage::Mapped { ptr, map_len, locked })
}

impl Drop for SecretBuf {
    fn drop(&mut self) {
        match &mut self.storage {
            Storage::Heap(b) => b.zeroize(),
            Storage::Mapped { ptr, map_len, locked } => {
                let raw = ptr.as_ptr().cast::<c_void>();
                // SAFETY: `ptr` is valid for reads and writes of `map_len` bytes for as long as
                // the mapping exists (until the munmap below) and nothing else references it
                // (`&mut self`).
                let all = unsafe { std::slice::from_raw_parts_mut(ptr.as_ptr(), *map_len) };
                all.zeroize();
                if *locked {
                    // SAFETY: the range is the locked mapping; unlocking does not change it.
                    let _ = unsafe { rustix::mm::munlock(raw, *map_len) };
                }
                // SAFETY: the mapping was created by `map_pages` with this length, is unmapped
                // only here, and no reference into it outlives this call (`all` is dead).
                let _ = unsafe { rustix::mm::munmap(raw, *map_len) };
            }
        }
    }
}

impl Deref for SecretBuf {
    type Target = [u8];
    fn deref(&self) -> &[u8] {
        match &self.storage {
            Storage::Heap(b) => &b[..self.len],
            // SAFETY: the mapping is valid for `map_len >= len` bytes while `self` lives, and
            // is initialised (anonymous pages start zeroed); the borrow is tied to `&self`.
            Storage::Mapped { ptr, .. } => unsafe { std::slice::from_raw_parts(ptr.as_ptr(), self.len) },
        }
    }
}

impl DerefMut for SecretBuf {
    fn deref_mut(&mut self) -> &mut [u8] {
        match &mut self.storage {
            Storage::Heap(b) => &mut b[..self.len],
            // SAFETY: as in `deref`, and `&mut self` guarantees the only borrow.
            Storage::Mapped { ptr, .. } => unsafe { std::slice::from_raw_parts_mut(ptr.as_ptr(), self.len) },
        }
    }
}

impl Clone for SecretBuf {
    fn clone(&self) -> Self {
        Self::from_slice(self)
    }
}

/// Comparison without an early exit on the first differing byte.
impl PartialEq for SecretBuf {
    fn eq(&self, other: &Self) -> bool {
        self.len == other.len && self.iter().zip(other.iter()).fold(0u8, |acc, (a, b)| acc | (a ^ b)) == 0
    }
}

impl Eq for SecretBuf {}

impl fmt::Debug for SecretBuf {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "SecretBuf({} bytes, redacted)", self.len)
    }
}

/// Keeps secrets out of core dumps for the rest of the process's life: `PR_SET_DUMPABLE` 0
/// (no core dump, and other processes of the same user can no longer ptrace it or read its
/// `/proc/PID/mem`) and `RLIMIT_CORE` 0 (defence in depth, should something make the process
/// dumpable again). Call it before reading any key; the CLI does at startup.
pub fn harden_process() -> std::io::Result<()> {
    #[cfg(target_os = "linux")]
    rustix::process::set_dumpable_behavior(rustix::process::DumpableBehavior::NotDumpable)?;
    let none = rustix::process::Rlimit { current: Some(0), maximum: Some(0) };
    rustix::process::setrlimit(rustix::process::Resource::Core, none)?;
    Ok(())
}

/// Whether the process is dumpable (`PR_GET_DUMPABLE` ≠ 0); `None` where it cannot be asked.
pub fn is_dumpable() -> Option<bool> {
    #[cfg(target_os = "linux")]
    {
        rustix::process::dumpable_behavior().ok().map(|b| b != rustix::process::DumpableBehavior::NotDumpable)
    }
    #[cfg(not(target_os = "linux"))]
    {
        None
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The `VmFlags` line of the /proc/self/smaps entry that contains `addr`.
    fn vm_flags(addr: usize) -> String {
        let smaps = std::fs::read_to_string("/proc/self/smaps").unwrap();
        let mut inside = false;
        for line in smaps.lines() {
            let first = line.split_whitespace().next().unwrap_or("");
            if let Some((a, b)) = first.split_once('-') {
                if let (Ok(a), Ok(b)) = (usize::from_str_radix(a, 16), usize::from_str_radix(b, 16)) {
                    inside = a <= addr && addr < b;
                    continue;
                }
            }
            if inside && line.starts_with("VmFlags:") {
                return line.to_owned();
            }
        }
        panic!("no mapping holds {addr:#x}");
    }

    #[test]
    fn secret_pages_are_dontdump_and_locked_when_allowed() {
        let mut s = SecretBuf::zeroed(100);
        assert_eq!(s.len(), 100);
        assert!(s.iter().all(|&b| b == 0));
        s[..4].copy_from_slice(b"key!");
        assert!(s.is_mapped(), "an ordinary allocation must get pages of its own");
        let flags = vm_flags(s.as_ptr() as usize);
        assert!(flags.split_whitespace().any(|f| f == "dd"), "not MADV_DONTDUMP: {flags}");
        if s.is_locked() {
            assert!(flags.split_whitespace().any(|f| f == "lo"), "mlock claimed but not locked: {flags}");
        } else {
            eprintln!("note: mlock refused here (RLIMIT_MEMLOCK); only dump exclusion checked");
        }
    }

    #[test]
    fn copies_truncates_compares_and_redacts() {
        let v = vec![0xa5u8; 5000];
        let s = SecretBuf::from_vec(v);
        assert_eq!(s.len(), 5000);
        assert!(s.iter().all(|&b| b == 0xa5));
        let mut t = s.clone();
        assert_eq!(s, t);
        t.truncate(10);
        assert_eq!(t.len(), 10);
        assert_ne!(s, t);
        assert_eq!(format!("{t:?}"), "SecretBuf(10 bytes, redacted)");
        let e = SecretBuf::zeroed(0);
        assert!(e.is_empty() && !e.is_mapped());
        assert_eq!(SecretBuf::from_slice(b"abc"), SecretBuf::from_slice(b"abc"));
        assert_ne!(SecretBuf::from_slice(b"abc"), SecretBuf::from_slice(b"abd"));
    }

    /// Hardening clears PR_GET_DUMPABLE and RLIMIT_CORE in this (test) process.
    #[test]
    #[cfg(target_os = "linux")]
    fn harden_process_makes_it_non_dumpable() {
        harden_process().unwrap();
        assert_eq!(is_dumpable(), Some(false));
        let core = rustix::process::getrlimit(rustix::process::Resource::Core);
        assert_eq!((core.current, core.maximum), (Some(0), Some(0)));
    }
}
