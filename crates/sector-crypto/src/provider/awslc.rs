//! aws-lc provider: all of this crate's `unsafe` code lives in this file.
//!
//! ```text
//!   Xts256 ── key (zeroizing) ──► fresh EVP_CIPHER_CTX on demand (pool empty)
//!      └── enc pool ─┐  one ArrayQueue<CipherCtx> per CPU: pop → set IV per sector →
//!      └── dec pool ─┘  EVP_Cipher → push (lock-free; a context is used by one thread at a time)
//!   Cbc ── AES_KEY enc + AES_KEY dec, immutable after setup ──► AES_cbc_encrypt(ivec = local copy)
//!   EvpAead ── one EVP_AEAD_CTX (gcm(aes) or chacha20-poly1305), immutable after setup
//!              ──► seal_scatter / open_gather (detached tag)
//! ```
//!
//! Why a pool: an `EVP_CIPHER_CTX` carries the IV and a "data unit processed" flag, so it
//! cannot be shared between threads; re-keying one per sector would cost two key expansions.
//! A context keyed once and re-armed with `EVP_CipherInit_ex(ctx, NULL, NULL, NULL, iv, -1)`
//! per sector is what makes aws-lc's XTS fast. The pool is sharded by the CPU a thread runs on:
//! with one shared queue, every 4 KiB request on every core bounced the queue's head and tail
//! cache lines between cores (`ArrayQueue::push` was ~2% of the NBD server's profile at 4 KiB
//! QD32); a thread mostly finds its own CPU's shard in its own cache.
//! CBC needs no context at all: `AES_cbc_encrypt` takes a `const AES_KEY *` and a
//! caller-owned IV buffer.
//!
//! aws-lc only has AES-256-XTS (`EVP_aes_256_xts`), and refuses XTS keys whose halves are
//! equal (FIPS 140 IG A.9); [`Xts256::new`] returns `None` for those and the caller falls back.

use std::os::raw::{c_int, c_uint};
use std::ptr::{self, NonNull};

use aws_lc_sys as ffi;
use crossbeam_queue::ArrayQueue;
use zeroize::Zeroize;

use crate::secure::SecretBuf;

use super::{Block, SectorMode};
use crate::CryptoError;

/// Owns one `EVP_CIPHER_CTX`, freed (and its key schedule cleansed by aws-lc's
/// `OPENSSL_free`) on drop.
struct CipherCtx(NonNull<ffi::EVP_CIPHER_CTX>);

// SAFETY: an EVP_CIPHER_CTX has no thread affinity (no thread-local state is referenced from
// it); `CipherCtx` is its unique owner and is only used through `&mut self`, so moving it to
// another thread cannot create shared access.
unsafe impl Send for CipherCtx {}

impl CipherCtx {
    /// A context keyed for AES-256-XTS in one direction; `None` unless `key` is 64 bytes
    /// that aws-lc accepts.
    fn xts256(key: &[u8], encrypt: bool) -> Option<Self> {
        if key.len() != 64 {
            return None;
        }
        // SAFETY: EVP_CIPHER_CTX_new has no preconditions; it returns null only on allocation
        // failure, which NonNull::new turns into None.
        let ctx = CipherCtx(NonNull::new(unsafe { ffi::EVP_CIPHER_CTX_new() })?);
        // SAFETY: `ctx` is a valid context owned by us; EVP_aes_256_xts returns a pointer to a
        // static cipher whose key length is 64, and `key` points to 64 readable bytes; a null
        // engine and IV are allowed (length checked above). On failure `ctx` is dropped
        // (freed) below.
        let ok = unsafe {
            ffi::EVP_CipherInit_ex(
                ctx.0.as_ptr(),
                ffi::EVP_aes_256_xts(),
                ptr::null_mut(),
                key.as_ptr(),
                ptr::null(),
                c_int::from(encrypt),
            )
        };
        if ok != 1 {
            clear_errors();
            return None;
        }
        Some(ctx)
    }

    /// Runs one XTS data unit with tweak `iv`: from `src` into `data` (same length), or in
    /// place in `data` without `src`.
    fn xts_unit(&mut self, iv: &Block, src: Option<&[u8]>, data: &mut [u8]) -> bool {
        // SAFETY: the context is valid and keyed (constructor invariant) and exclusively
        // borrowed; `iv` points to 16 readable bytes, the IV length of AES-XTS; null cipher,
        // engine and key keep the cipher and key; -1 keeps the direction.
        let ok = unsafe {
            ffi::EVP_CipherInit_ex(
                self.0.as_ptr(),
                ptr::null(),
                ptr::null_mut(),
                ptr::null(),
                iv.as_ptr(),
                -1,
            )
        };
        if ok != 1 {
            clear_errors();
            return false;
        }
        let p = data.as_mut_ptr();
        let input = match src {
            Some(src) if src.len() == data.len() => src.as_ptr(),
            Some(_) => return false,
            None => p.cast_const(),
        };
        // SAFETY: `p` is valid for writes of `data.len()` bytes for the duration of the call
        // (we hold the only borrow of `data`), and `input` for reads of as many: either `p`
        // itself (aws-lc's XTS supports in == out) or `src`, which has that length and cannot
        // overlap `data` (a shared and an exclusive borrow). The context is armed with a
        // fresh IV, so exactly one data unit may be processed.
        let ok = unsafe { ffi::EVP_Cipher(self.0.as_ptr(), p, input, data.len()) };
        if ok != 1 {
            clear_errors();
            return false;
        }
        true
    }
}

impl Drop for CipherCtx {
    fn drop(&mut self) {
        // SAFETY: the pointer came from EVP_CIPHER_CTX_new and is freed exactly once, here.
        unsafe { ffi::EVP_CIPHER_CTX_free(self.0.as_ptr()) }
    }
}

/// Discards aws-lc's thread-local error queue after a failed call (we report our own error).
fn clear_errors() {
    // SAFETY: ERR_clear_error has no preconditions; it only touches this thread's error queue.
    unsafe { ffi::ERR_clear_error() }
}

/// Idle keyed contexts of one direction, one small lock-free queue per CPU.
///
/// `take` looks in the calling thread's CPU's shard first, then the others, and keys a fresh
/// context only when every shard is empty; `put` returns a context to the caller's (possibly
/// new) CPU's shard, or to any shard with room, and frees it when all are full. The CPU is
/// only a locality hint: a thread that migrates meanwhile still gets correct behaviour.
struct CtxPool {
    shards: Box<[ArrayQueue<CipherCtx>]>,
}

/// Idle contexts kept per CPU and direction: one for the running thread, slack for threads
/// preempted while holding one.
const PER_CPU: usize = 2;

impl CtxPool {
    fn new() -> Self {
        let cpus = std::thread::available_parallelism().map_or(4, |n| n.get()).clamp(1, 256);
        CtxPool { shards: (0..cpus).map(|_| ArrayQueue::new(PER_CPU)).collect() }
    }

    /// The shard to try first: the current CPU's.
    fn home(&self) -> usize {
        current_cpu() % self.shards.len()
    }

    fn take(&self) -> Option<CipherCtx> {
        let home = self.home();
        let n = self.shards.len();
        (0..n).find_map(|i| self.shards[(home + i) % n].pop())
    }

    fn put(&self, ctx: CipherCtx) {
        let home = self.home();
        let n = self.shards.len();
        let mut ctx = ctx;
        for i in 0..n {
            match self.shards[(home + i) % n].push(ctx) {
                Ok(()) => return,
                Err(back) => ctx = back,
            }
        }
        // Every shard is full: `ctx` is dropped (freed and cleansed) here.
    }
}

/// The CPU this thread is running on (a hint: it may change at any moment).
#[cfg(target_os = "linux")]
fn current_cpu() -> usize {
    rustix::thread::sched_getcpu()
}

#[cfg(not(target_os = "linux"))]
fn current_cpu() -> usize {
    0
}

/// AES-256-XTS (64-byte key) over pooled `EVP_CIPHER_CTX`s. The key (kept to key more
/// contexts on demand) is in secret memory; the contexts' key schedules are cleansed by
/// aws-lc when freed.
pub(crate) struct Xts256 {
    key: SecretBuf,
    enc: CtxPool,
    dec: CtxPool,
}

impl Xts256 {
    /// `None` unless `key` is 64 bytes that aws-lc accepts (its halves differ).
    pub(crate) fn new(key: &[u8]) -> Option<Self> {
        if key.len() != 64 {
            return None;
        }
        let key = SecretBuf::from_slice(key);
        let (enc, dec) = (CtxPool::new(), CtxPool::new());
        // Key once now: validates the key and warms the pool.
        enc.put(CipherCtx::xts256(&key, true)?);
        dec.put(CipherCtx::xts256(&key, false)?);
        Some(Xts256 { key, enc, dec })
    }

    fn run(
        &self,
        src: Option<&[u8]>,
        data: &mut [u8],
        unit: usize,
        ivs: &[Block],
        encrypt: bool,
    ) -> Result<(), CryptoError> {
        if unit < 16
            || unit % 16 != 0
            || data.len() % unit != 0
            || ivs.len() < data.len() / unit
            || src.is_some_and(|s| s.len() != data.len())
        {
            return Err(CryptoError::Provider { op: "mode called with a malformed unit layout" });
        }
        let pool = if encrypt { &self.enc } else { &self.dec };
        let mut ctx = match pool.take() {
            Some(c) => c,
            None => CipherCtx::xts256(&self.key, encrypt)
                .ok_or(CryptoError::Provider { op: "aws-lc: keying an XTS context" })?,
        };
        let mut ok = true;
        for (i, (u, iv)) in data.chunks_exact_mut(unit).zip(ivs).enumerate() {
            let s = src.map(|s| &s[i * unit..(i + 1) * unit]);
            if !ctx.xts_unit(iv, s, u) {
                ok = false;
                break;
            }
        }
        pool.put(ctx);
        if ok {
            Ok(())
        } else {
            Err(CryptoError::Provider { op: "aws-lc: EVP_Cipher(aes-256-xts)" })
        }
    }
}

impl SectorMode for Xts256 {
    fn encrypt(&self, data: &mut [u8], unit: usize, ivs: &[Block]) -> Result<(), CryptoError> {
        self.run(None, data, unit, ivs, true)
    }
    fn decrypt(&self, data: &mut [u8], unit: usize, ivs: &[Block]) -> Result<(), CryptoError> {
        self.run(None, data, unit, ivs, false)
    }
    fn encrypt_to(&self, src: &[u8], dst: &mut [u8], unit: usize, ivs: &[Block]) -> Result<(), CryptoError> {
        self.run(Some(src), dst, unit, ivs, true)
    }
    fn name(&self) -> &str {
        "aws-lc xts(aes256)"
    }
}

/// AES-CBC with immutable expanded keys (encrypt and decrypt schedules).
pub(crate) struct Cbc {
    enc: Box<ffi::AES_KEY>,
    dec: Box<ffi::AES_KEY>,
    name: &'static str,
}

impl Cbc {
    /// `None` unless `key` is 16, 24 or 32 bytes.
    pub(crate) fn new(key: &[u8]) -> Option<Self> {
        let name = match key.len() {
            16 => "aws-lc cbc(aes128)",
            24 => "aws-lc cbc(aes192)",
            32 => "aws-lc cbc(aes256)",
            _ => return None,
        };
        let bits = c_uint::try_from(key.len() * 8).ok()?;
        let mut enc = Box::new(ffi::AES_KEY { rd_key: [0; 60], rounds: 0 });
        let mut dec = Box::new(ffi::AES_KEY { rd_key: [0; 60], rounds: 0 });
        // SAFETY: `key` points to `bits / 8` readable bytes; `enc` and `dec` are valid,
        // exclusively borrowed AES_KEY structs for the call to write.
        let (e, d) = unsafe {
            (
                ffi::AES_set_encrypt_key(key.as_ptr(), bits, &mut *enc),
                ffi::AES_set_decrypt_key(key.as_ptr(), bits, &mut *dec),
            )
        };
        let cbc = Cbc { enc, dec, name };
        (e == 0 && d == 0).then_some(cbc)
    }

    fn run(&self, data: &mut [u8], unit: usize, ivs: &[Block], encrypt: bool) -> Result<(), CryptoError> {
        if unit < 16 || unit % 16 != 0 || data.len() % unit != 0 || ivs.len() < data.len() / unit {
            return Err(CryptoError::Provider { op: "mode called with a malformed unit layout" });
        }
        let (key, enc): (&ffi::AES_KEY, c_int) =
            if encrypt { (&self.enc, ffi::AES_ENCRYPT) } else { (&self.dec, ffi::AES_DECRYPT) };
        for (u, iv) in data.chunks_exact_mut(unit).zip(ivs) {
            let mut ivec = *iv;
            let p = u.as_mut_ptr();
            // SAFETY: `p` is valid for reads and writes of `u.len()` bytes (a multiple of 16)
            // and aws-lc's CBC supports in == out; `key` is an initialised schedule that is only
            // read; `ivec` is a 16-byte buffer owned by this frame that the call may update.
            unsafe { ffi::AES_cbc_encrypt(p, p, u.len(), key, ivec.as_mut_ptr(), enc) };
        }
        Ok(())
    }
}

impl Drop for Cbc {
    fn drop(&mut self) {
        self.enc.rd_key.zeroize();
        self.dec.rd_key.zeroize();
    }
}

impl SectorMode for Cbc {
    fn encrypt(&self, data: &mut [u8], unit: usize, ivs: &[Block]) -> Result<(), CryptoError> {
        self.run(data, unit, ivs, true)
    }
    fn decrypt(&self, data: &mut [u8], unit: usize, ivs: &[Block]) -> Result<(), CryptoError> {
        self.run(data, unit, ivs, false)
    }
    fn name(&self) -> &str {
        self.name
    }
}

/// An `EVP_AEAD` with a 12-byte nonce and a 16-byte tag: AES-GCM (128, 192 or 256-bit key)
/// or ChaCha20-Poly1305 (RFC 8439, 256-bit key), over one `EVP_AEAD_CTX` keyed once and then
/// only read: aws-lc documents concurrent seal/open on a shared context as safe for both
/// (`aead.h`, "Concurrency", which lists `EVP_aead_aes_*_gcm` and
/// `EVP_aead_chacha20_poly1305`). No other AEAD may be constructed here.
pub(crate) struct EvpAead {
    ctx: NonNull<ffi::EVP_AEAD_CTX>,
    name: &'static str,
}

// SAFETY: the context is created and keyed in `new`, then only passed as `const
// EVP_AEAD_CTX *` to seal/open, which aws-lc allows to run concurrently on one AES-GCM or
// ChaCha20-Poly1305 context (the only AEADs the constructors select); it is freed once, in
// `Drop`, when no reference remains.
unsafe impl Send for EvpAead {}
// SAFETY: see `Send`: shared use is read-only seal/open, documented as thread-safe for these
// AEADs.
unsafe impl Sync for EvpAead {}

/// Nonce size of both AEADs here (the kernel's `gcm(aes)` and `rfc7539(chacha20,poly1305)`
/// IV size).
pub(crate) const AEAD_NONCE: usize = 12;
/// Tag size of both AEADs here.
pub(crate) const AEAD_TAG: usize = 16;

impl EvpAead {
    /// AES-GCM; `None` unless `key` is 16, 24 or 32 bytes.
    pub(crate) fn gcm(key: &[u8]) -> Option<Self> {
        // SAFETY: these return pointers to static AEAD descriptors; no preconditions.
        let (aead, name) = unsafe {
            match key.len() {
                16 => (ffi::EVP_aead_aes_128_gcm(), "aws-lc gcm(aes128)"),
                24 => (ffi::EVP_aead_aes_192_gcm(), "aws-lc gcm(aes192)"),
                32 => (ffi::EVP_aead_aes_256_gcm(), "aws-lc gcm(aes256)"),
                _ => return None,
            }
        };
        Self::keyed(aead, key, name)
    }

    /// ChaCha20-Poly1305 as RFC 8439 (the kernel's `rfc7539(chacha20,poly1305)`: 32-bit block
    /// counter, 96-bit nonce, Poly1305 key from block 0); `None` unless `key` is 32 bytes.
    pub(crate) fn chacha20_poly1305(key: &[u8]) -> Option<Self> {
        if key.len() != 32 {
            return None;
        }
        // SAFETY: returns a pointer to a static AEAD descriptor; no preconditions.
        let aead = unsafe { ffi::EVP_aead_chacha20_poly1305() };
        Self::keyed(aead, key, "aws-lc rfc7539(chacha20,poly1305)")
    }

    /// A context for `aead` (one of the descriptors above, whose key length the caller
    /// checked against `key.len()`).
    fn keyed(aead: *const ffi::EVP_AEAD, key: &[u8], name: &'static str) -> Option<Self> {
        // SAFETY: `aead` is a valid static descriptor (from the constructors above) whose key
        // length is `key.len()` (checked there; aws-lc also rejects a mismatch and returns
        // null), `key` points to that many readable bytes; the tag length is the full 16 bytes
        // both AEADs produce. The call copies the key schedule into the new context; null is
        // returned on failure.
        let ctx = unsafe { ffi::EVP_AEAD_CTX_new(aead, key.as_ptr(), key.len(), AEAD_TAG) };
        match NonNull::new(ctx) {
            Some(ctx) => Some(EvpAead { ctx, name }),
            None => {
                clear_errors();
                None
            }
        }
    }

    /// Encrypts `data` in place and writes its 16-byte tag.
    pub(crate) fn seal(
        &self,
        nonce: &[u8; AEAD_NONCE],
        ad: &[u8],
        data: &mut [u8],
        tag: &mut [u8; AEAD_TAG],
    ) -> Result<(), CryptoError> {
        let mut tag_len = 0usize;
        let p = data.as_mut_ptr();
        // SAFETY: the context is valid and keyed (constructor invariant) and only read; `p` is
        // valid for reads and writes of `data.len()` bytes and in == out is allowed; `tag` is 16
        // writable bytes that do not alias `data`; `nonce` is 12 readable bytes (the nonce
        // length of both AEADs); `ad` is `ad.len()` readable bytes; no extra input.
        let ok = unsafe {
            ffi::EVP_AEAD_CTX_seal_scatter(
                self.ctx.as_ptr(),
                p,
                tag.as_mut_ptr(),
                &mut tag_len,
                AEAD_TAG,
                nonce.as_ptr(),
                AEAD_NONCE,
                p,
                data.len(),
                ptr::null(),
                0,
                ad.as_ptr(),
                ad.len(),
            )
        };
        if ok != 1 || tag_len != AEAD_TAG {
            clear_errors();
            return Err(CryptoError::Provider { op: "aws-lc: EVP_AEAD_CTX_seal_scatter" });
        }
        Ok(())
    }

    /// Checks the tag and decrypts `data` in place; `false` (and `data` zeroed) when the tag
    /// does not authenticate `ad` and `data`.
    pub(crate) fn open(
        &self,
        nonce: &[u8; AEAD_NONCE],
        ad: &[u8],
        data: &mut [u8],
        tag: &[u8; AEAD_TAG],
    ) -> bool {
        let p = data.as_mut_ptr();
        // SAFETY: as in `seal`: valid keyed context, only read; `p` valid for `data.len()`
        // bytes with in == out; `tag` 16 readable bytes not aliasing `data`; `nonce` 12 bytes;
        // `ad` `ad.len()` bytes. On failure aws-lc zero-fills `out` (no partial plaintext).
        let ok = unsafe {
            ffi::EVP_AEAD_CTX_open_gather(
                self.ctx.as_ptr(),
                p,
                nonce.as_ptr(),
                AEAD_NONCE,
                p,
                data.len(),
                tag.as_ptr(),
                AEAD_TAG,
                ad.as_ptr(),
                ad.len(),
            )
        };
        if ok != 1 {
            clear_errors();
            data.fill(0);
            return false;
        }
        true
    }

    /// Implementation name.
    pub(crate) fn name(&self) -> &'static str {
        self.name
    }
}

impl Drop for EvpAead {
    fn drop(&mut self) {
        // SAFETY: the pointer came from EVP_AEAD_CTX_new and is freed exactly once, here;
        // aws-lc cleanses the key schedule when it frees the context.
        unsafe { ffi::EVP_AEAD_CTX_free(self.ctx.as_ptr()) }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn key() -> [u8; 64] {
        std::array::from_fn(|i| i as u8)
    }

    #[test]
    fn pool_finds_contexts_in_any_shard_and_bounds_what_it_keeps() {
        let pool = CtxPool::new();
        assert!(pool.take().is_none());
        let room = pool.shards.len() * PER_CPU;
        // One more than fits: every shard fills (whatever CPU each put ran on), the last is freed.
        for _ in 0..=room {
            pool.put(CipherCtx::xts256(&key(), true).unwrap());
        }
        assert_eq!(pool.shards.iter().map(ArrayQueue::len).sum::<usize>(), room);
        // Every kept context is found, wherever this thread runs now.
        for _ in 0..room {
            assert!(pool.take().is_some());
        }
        assert!(pool.take().is_none());
    }

    #[test]
    fn many_threads_share_one_cipher() {
        // More threads than kept contexts: some key fresh ones, all agree on every sector.
        let xts = Xts256::new(&key()).unwrap();
        let ivs: Vec<Block> = (0..8u8).map(|i| [i; 16]).collect();
        let mut want = vec![0x5au8; 8 * 512];
        xts.encrypt(&mut want, 512, &ivs).unwrap();
        std::thread::scope(|s| {
            for _ in 0..16 {
                s.spawn(|| {
                    for _ in 0..200 {
                        let mut buf = vec![0x5au8; 8 * 512];
                        xts.encrypt(&mut buf, 512, &ivs).unwrap();
                        assert_eq!(buf, want);
                        xts.decrypt(&mut buf, 512, &ivs).unwrap();
                        assert_eq!(buf, vec![0x5au8; 8 * 512]);
                    }
                });
            }
        });
    }
}
