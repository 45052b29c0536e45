//! sealdisk's C ABI: `libsealdisk.so` / `libsealdisk.a` and `include/sealdisk.h` (generated
//! from this file by cbindgen; `tests/capi/header.rs` checks it is up to date).
//!
//! Every function returns an `int`: `SEALDISK_OK` (0) or a negative `SEALDISK_E_*` code,
//! and then `sealdisk_last_error()` says what failed. Strings are UTF-8 and
//! NUL-terminated; strings returned through `char **` are freed with
//! `sealdisk_string_free`; a volume is an opaque `sealdisk_volume *` freed by
//! `sealdisk_close`. Passphrases are byte strings with a length (they may hold NULs), copied
//! into memory that is wiped after use, and never appear in a message. No panic crosses
//! the boundary: one would be reported as `SEALDISK_E_INTERNAL`.
//!
//! The operations are the `embed` crate's, which opens volumes with `volume::open`.
#![allow(non_camel_case_types)]

use std::cell::RefCell;
use std::ffi::{c_char, c_int, CStr, CString};
use std::panic::{catch_unwind, AssertUnwindSafe};

use embed::{Error, FormatOptions, Kind, Pbkdf};

/// Success.
pub const SEALDISK_OK: c_int = 0;
/// The caller asked for something impossible or inconsistent (a bad option, an unaligned
/// write, a read past the end, a string that is not UTF-8, a device of another format).
pub const SEALDISK_E_USAGE: c_int = -1;
/// A pointer argument that must not be NULL was NULL.
pub const SEALDISK_E_NULL_ARG: c_int = -2;
/// The passphrase opens no keyslot (or no protector) of the volume.
pub const SEALDISK_E_WRONG_KEY: c_int = -3;
/// The metadata on the device does not decode or check.
pub const SEALDISK_E_CORRUPT: c_int = -4;
/// A format, feature or cipher this build does not have.
pub const SEALDISK_E_UNSUPPORTED: c_int = -5;
/// The device is in use (locked by another opener).
pub const SEALDISK_E_BUSY: c_int = -6;
/// The device or volume is read-only, or access to it is denied.
pub const SEALDISK_E_PERMISSION: c_int = -7;
/// The device is too small for the layout.
pub const SEALDISK_E_TOO_SMALL: c_int = -8;
/// Reading or writing the device failed.
pub const SEALDISK_E_IO: c_int = -9;
/// A bug in sealdisk (a broken invariant, or a panic caught at the boundary).
pub const SEALDISK_E_INTERNAL: c_int = -10;
/// Anything else (e.g. the system's random source failed).
pub const SEALDISK_E_OTHER: c_int = -11;

/// `sealdisk_open` flag: open read-only (writes fail with `SEALDISK_E_PERMISSION`). Without
/// it the volume is opened read-write and the device is locked exclusively.
pub const SEALDISK_READ_ONLY: u32 = 1;

/// An open volume: the decrypted block device. Opaque; made by `sealdisk_open`, freed by
/// `sealdisk_close`. Reads, writes and flushes may be issued from several threads at
/// once; `sealdisk_close` must not race with them.
pub struct sealdisk_volume {
    inner: embed::Volume,
}

/// KDF options of a new keyslot (cryptsetup's `--pbkdf`, `--pbkdf-force-iterations`,
/// `--pbkdf-memory`, `--pbkdf-parallel`). A NULL pointer, NULL string or 0 means the
/// default: argon2id for LUKS2 (pbkdf2 for LUKS1), benchmarked to 2 seconds.
///
/// cbindgen:field-names=[type, iterations, memory_kib, parallel]
#[repr(C)]
#[derive(Debug, Clone, Copy)]
pub struct sealdisk_pbkdf {
    /// `"pbkdf2"`, `"argon2i"` or `"argon2id"`; NULL: the default.
    pub type_: *const c_char,
    /// PBKDF2 iterations or Argon2 time cost (skips the benchmark); 0: benchmark.
    pub iterations: u32,
    /// Argon2 memory in KiB; 0: the default.
    pub memory_kib: u32,
    /// Argon2 lanes; 0: the default.
    pub parallel: u32,
}

/// Options of `sealdisk_luks_format`. A NULL pointer, NULL string or 0 means
/// `sealdisk luksFormat`'s (and cryptsetup's) default.
///
/// cbindgen:field-names=[type, cipher, key_bits, pbkdf]
#[repr(C)]
#[derive(Debug, Clone, Copy)]
pub struct sealdisk_format_options {
    /// `"luks1"` or `"luks2"`; NULL: LUKS2.
    pub type_: *const c_char,
    /// The data cipher, e.g. `"aes-xts-plain64"` (the default).
    pub cipher: *const c_char,
    /// Key size in bits; 0: 512 for XTS ciphers, else 256.
    pub key_bits: u32,
    /// The first keyslot's KDF.
    pub pbkdf: sealdisk_pbkdf,
}

thread_local! {
    static LAST_ERROR: RefCell<CString> = RefCell::new(CString::default());
}

fn code(kind: Kind) -> c_int {
    match kind {
        Kind::Usage => SEALDISK_E_USAGE,
        Kind::WrongKey => SEALDISK_E_WRONG_KEY,
        Kind::Corrupt => SEALDISK_E_CORRUPT,
        Kind::Unsupported => SEALDISK_E_UNSUPPORTED,
        Kind::Busy => SEALDISK_E_BUSY,
        Kind::Permission => SEALDISK_E_PERMISSION,
        Kind::TooSmall => SEALDISK_E_TOO_SMALL,
        Kind::Io => SEALDISK_E_IO,
        Kind::Internal => SEALDISK_E_INTERNAL,
        Kind::Other => SEALDISK_E_OTHER,
    }
}

fn set_last_error(message: &str) {
    // A message never holds a NUL (paths and text from Rust strings); if one did, it is cut.
    let text = message.split('\0').next().unwrap_or_default();
    let c = CString::new(text).unwrap_or_default();
    LAST_ERROR.with(|e| *e.borrow_mut() = c);
}

/// Why a call failed: an error code and its message.
struct Fail(c_int, String);

impl From<Error> for Fail {
    fn from(e: Error) -> Self {
        Fail(code(e.kind()), e.message().to_owned())
    }
}

fn null_arg(name: &str) -> Fail {
    Fail(SEALDISK_E_NULL_ARG, format!("argument {name} is NULL"))
}

fn usage(message: impl Into<String>) -> Fail {
    Fail(SEALDISK_E_USAGE, message.into())
}

/// Runs one entry point: its result becomes the return code and the thread's last error;
/// a panic becomes `SEALDISK_E_INTERNAL`.
fn entry(f: impl FnOnce() -> Result<(), Fail>) -> c_int {
    let (rc, message) = match catch_unwind(AssertUnwindSafe(f)) {
        Ok(Ok(())) => (SEALDISK_OK, String::new()),
        Ok(Err(Fail(rc, message))) => (rc, message),
        Err(panic) => {
            let what = panic
                .downcast_ref::<&str>()
                .map(|s| s.to_string())
                .or_else(|| panic.downcast_ref::<String>().cloned())
                .unwrap_or_else(|| "unknown cause".into());
            (SEALDISK_E_INTERNAL, format!("internal error (panic): {what}"))
        }
    };
    set_last_error(&message);
    rc
}

/// The string `p` points to.
///
/// # Safety
/// `p` is NULL or points to a NUL-terminated string that stays valid during the call.
unsafe fn str_arg<'a>(p: *const c_char, name: &str) -> Result<&'a str, Fail> {
    if p.is_null() {
        return Err(null_arg(name));
    }
    // SAFETY: not NULL, and NUL-terminated and valid for the call by the caller's contract.
    let c = unsafe { CStr::from_ptr(p) };
    c.to_str().map_err(|_| usage(format!("argument {name} is not UTF-8")))
}

/// An optional string: NULL is `None`.
///
/// # Safety
/// As [`str_arg`].
unsafe fn opt_str_arg<'a>(p: *const c_char, name: &str) -> Result<Option<&'a str>, Fail> {
    if p.is_null() {
        return Ok(None);
    }
    // SAFETY: the caller's contract, passed on.
    unsafe { str_arg(p, name) }.map(Some)
}

/// The `len` bytes at `p` (NULL with length 0 is the empty slice).
///
/// # Safety
/// Unless NULL, `p` points to `len` readable bytes that stay valid and unchanged during the
/// call.
unsafe fn bytes_arg<'a>(p: *const u8, len: usize, name: &str) -> Result<&'a [u8], Fail> {
    if len > isize::MAX as usize {
        return Err(usage(format!("length of {name} is too large")));
    }
    if p.is_null() {
        return if len == 0 { Ok(&[]) } else { Err(null_arg(name)) };
    }
    // SAFETY: not NULL, `len` readable bytes by the caller's contract, `len` checked against
    // isize::MAX above.
    Ok(unsafe { std::slice::from_raw_parts(p, len) })
}

/// The volume `v` points to.
///
/// # Safety
/// `v` is NULL or a pointer `sealdisk_open` returned that was not closed.
unsafe fn volume_arg<'a>(v: *const sealdisk_volume) -> Result<&'a embed::Volume, Fail> {
    if v.is_null() {
        return Err(null_arg("vol"));
    }
    // SAFETY: a live handle from `sealdisk_open` (a `Box` leaked there) by the contract.
    Ok(unsafe { &(*v).inner })
}

/// Stores `value` through `out`, a pointer the entry point checked is not NULL.
///
/// # Safety
/// `out` is not NULL and points to writable memory for a `T`.
unsafe fn put<T>(out: *mut T, value: T) {
    // SAFETY: by the caller's contract.
    unsafe { out.write(value) }
}

fn out_string(s: String) -> Result<*mut c_char, Fail> {
    CString::new(s)
        .map(CString::into_raw)
        .map_err(|_| Fail(SEALDISK_E_INTERNAL, "internal error: a result string holds a NUL".into()))
}

/// Checks an out pointer and clears what it points to (so it is NULL on failure).
///
/// # Safety
/// `out` is NULL or points to writable memory for a pointer.
unsafe fn clear_out<T>(out: *mut *mut T, name: &str) -> Result<(), Fail> {
    if out.is_null() {
        return Err(null_arg(name));
    }
    // SAFETY: not NULL, writable by the caller's contract.
    unsafe { put(out, std::ptr::null_mut()) };
    Ok(())
}

/// # Safety
/// `p` is NULL or a `sealdisk_pbkdf` whose strings are NULL or NUL-terminated.
unsafe fn pbkdf_arg(p: *const sealdisk_pbkdf) -> Result<Pbkdf, Fail> {
    if p.is_null() {
        return Ok(Pbkdf::default());
    }
    // SAFETY: not NULL, a valid struct by the caller's contract.
    let p = unsafe { *p };
    let nonzero = |x: u32| (x != 0).then_some(x);
    Ok(Pbkdf {
        // SAFETY: the caller's contract, passed on.
        kind: unsafe { opt_str_arg(p.type_, "pbkdf.type_") }?.map(str::to_owned),
        iterations: nonzero(p.iterations),
        memory_kib: nonzero(p.memory_kib),
        parallel: nonzero(p.parallel),
    })
}

/// The message of the last call on this thread that failed (empty after one that
/// succeeded). The pointer stays valid until the next sealdisk call on this thread; never
/// NULL; do not free it.
#[no_mangle]
pub extern "C" fn sealdisk_last_error() -> *const c_char {
    LAST_ERROR.with(|e| e.borrow().as_ptr())
}

/// A static name for an error code (`"SEALDISK_E_WRONG_KEY"`, `"SEALDISK_OK"`; an unknown
/// code gives `"SEALDISK_E_UNKNOWN"`). Never NULL; do not free it.
#[no_mangle]
pub extern "C" fn sealdisk_error_name(code: c_int) -> *const c_char {
    let name: &'static CStr = match code {
        SEALDISK_OK => c"SEALDISK_OK",
        SEALDISK_E_USAGE => c"SEALDISK_E_USAGE",
        SEALDISK_E_NULL_ARG => c"SEALDISK_E_NULL_ARG",
        SEALDISK_E_WRONG_KEY => c"SEALDISK_E_WRONG_KEY",
        SEALDISK_E_CORRUPT => c"SEALDISK_E_CORRUPT",
        SEALDISK_E_UNSUPPORTED => c"SEALDISK_E_UNSUPPORTED",
        SEALDISK_E_BUSY => c"SEALDISK_E_BUSY",
        SEALDISK_E_PERMISSION => c"SEALDISK_E_PERMISSION",
        SEALDISK_E_TOO_SMALL => c"SEALDISK_E_TOO_SMALL",
        SEALDISK_E_IO => c"SEALDISK_E_IO",
        SEALDISK_E_INTERNAL => c"SEALDISK_E_INTERNAL",
        SEALDISK_E_OTHER => c"SEALDISK_E_OTHER",
        _ => c"SEALDISK_E_UNKNOWN",
    };
    name.as_ptr()
}

/// The library's version (`"0.1.0"`). Never NULL; do not free it.
#[no_mangle]
pub extern "C" fn sealdisk_version() -> *const c_char {
    const VERSION: &CStr =
        match CStr::from_bytes_with_nul(concat!(env!("CARGO_PKG_VERSION"), "\0").as_bytes()) {
            Ok(v) => v,
            Err(_) => c"unknown",
        };
    VERSION.as_ptr()
}

/// Frees a string a sealdisk function returned through a `char **`. NULL is ignored.
///
/// # Safety
/// `s` is NULL or a string from sealdisk not yet freed.
#[no_mangle]
pub unsafe extern "C" fn sealdisk_string_free(s: *mut c_char) {
    if !s.is_null() {
        // SAFETY: made by `CString::into_raw` in `out_string`, freed once by the contract.
        drop(unsafe { CString::from_raw(s) });
    }
}

/// Says what is on the device or image `path` (no key needed, nothing written), as a JSON
/// object in `*out_json`: `type` (cryptsetup's `--type`: `"luks1"`, `"luks2"`, `"bitlk"`,
/// `"fvault2"`, `"integrity"`, or null when unknown), `name` (`"LUKS2"`, `"BitLocker"`,
/// `"unknown"`), `size` in bytes, and when the header says: `version`, `uuid`, `label`,
/// `cipher`, `authenticated`, `tag_size`. Free it with `sealdisk_string_free`.
///
/// # Safety
/// `path` is a NUL-terminated string; `out_json` points to writable memory for a pointer.
#[no_mangle]
pub unsafe extern "C" fn sealdisk_probe(path: *const c_char, out_json: *mut *mut c_char) -> c_int {
    entry(|| {
        // SAFETY: the caller's contract, passed on.
        unsafe { clear_out(out_json, "out_json") }?;
        // SAFETY: the caller's contract, passed on.
        let path = unsafe { str_arg(path, "path") }?;
        let json = embed::probe(path)?.to_json().to_string();
        // SAFETY: checked not NULL by `clear_out`.
        unsafe { put(out_json, out_string(json)?) };
        Ok(())
    })
}

/// Opens the volume on `path` (probed by the library: LUKS1, LUKS2 (also authenticated),
/// dm-integrity, BitLocker, FileVault2) with the passphrase's `passphrase_len` bytes (NULL
/// with length 0: no passphrase, and an encrypted volume fails with `SEALDISK_E_WRONG_KEY`;
/// a device with nothing recognised fails with `SEALDISK_E_USAGE`). `flags`:
/// `SEALDISK_READ_ONLY`, or 0 for read-write. The device is locked
/// (shared when read-only, exclusive when read-write) until `sealdisk_close`. On success
/// `*out_volume` is the volume; on failure NULL.
///
/// # Safety
/// `path` is a NUL-terminated string; `passphrase` is NULL or points to `passphrase_len`
/// bytes; `out_volume` points to writable memory for a pointer.
#[no_mangle]
pub unsafe extern "C" fn sealdisk_open(
    path: *const c_char,
    passphrase: *const u8,
    passphrase_len: usize,
    flags: u32,
    out_volume: *mut *mut sealdisk_volume,
) -> c_int {
    entry(|| {
        // SAFETY: the caller's contract, passed on.
        unsafe { clear_out(out_volume, "out_volume") }?;
        // SAFETY: the caller's contract, passed on.
        let path = unsafe { str_arg(path, "path") }?;
        // SAFETY: the caller's contract, passed on.
        let pass = unsafe { bytes_arg(passphrase, passphrase_len, "passphrase") }?;
        if flags & !SEALDISK_READ_ONLY != 0 {
            return Err(usage(format!("unknown flags {flags:#x}")));
        }
        let pass = (!passphrase.is_null()).then_some(pass);
        let inner = embed::Volume::open(path, pass, flags & SEALDISK_READ_ONLY != 0)?;
        let v = Box::into_raw(Box::new(sealdisk_volume { inner }));
        // SAFETY: checked not NULL by `clear_out`.
        unsafe { put(out_volume, v) };
        Ok(())
    })
}

/// What the volume is, as a static string in `*out_kind` (do not free): `"luks1"`,
/// `"luks2"`, `"luks2-aead"` (authenticated encryption), `"bitlk"`, `"fvault2"`,
/// `"integrity"`, `"tcrypt"`, `"plain"`, `"layers"`.
///
/// # Safety
/// `vol` is a live volume; `out_kind` points to writable memory for a pointer.
#[no_mangle]
pub unsafe extern "C" fn sealdisk_volume_kind(
    vol: *const sealdisk_volume,
    out_kind: *mut *const c_char,
) -> c_int {
    entry(|| {
        if out_kind.is_null() {
            return Err(null_arg("out_kind"));
        }
        // SAFETY: the caller's contract, passed on.
        let v = unsafe { volume_arg(vol) }?;
        let kind: &'static CStr = match v.kind() {
            "luks1" => c"luks1",
            "luks2" => c"luks2",
            "luks2-aead" => c"luks2-aead",
            "bitlk" => c"bitlk",
            "fvault2" => c"fvault2",
            "integrity" => c"integrity",
            "tcrypt" => c"tcrypt",
            "plain" => c"plain",
            "layers" => c"layers",
            _ => c"unknown",
        };
        // SAFETY: checked not NULL above.
        unsafe { put(out_kind, kind.as_ptr()) };
        Ok(())
    })
}

/// The size of the volume's plaintext in bytes, in `*out_size`.
///
/// # Safety
/// `vol` is a live volume; `out_size` points to a writable `uint64_t`.
#[no_mangle]
pub unsafe extern "C" fn sealdisk_volume_size(vol: *const sealdisk_volume, out_size: *mut u64) -> c_int {
    entry(|| {
        if out_size.is_null() {
            return Err(null_arg("out_size"));
        }
        // SAFETY: the caller's contract, passed on.
        let v = unsafe { volume_arg(vol) }?;
        // SAFETY: checked not NULL above.
        unsafe { put(out_size, v.size()) };
        Ok(())
    })
}

/// The volume's logical block size in bytes (512 or 4096), in `*out_block_size`: writes
/// are whole blocks.
///
/// # Safety
/// `vol` is a live volume; `out_block_size` points to a writable `uint32_t`.
#[no_mangle]
pub unsafe extern "C" fn sealdisk_volume_block_size(
    vol: *const sealdisk_volume,
    out_block_size: *mut u32,
) -> c_int {
    entry(|| {
        if out_block_size.is_null() {
            return Err(null_arg("out_block_size"));
        }
        // SAFETY: the caller's contract, passed on.
        let v = unsafe { volume_arg(vol) }?;
        // SAFETY: checked not NULL above.
        unsafe { put(out_block_size, v.block_size()) };
        Ok(())
    })
}

/// Reads `len` bytes of plaintext at byte `offset` into `buf`: any offset and length
/// inside the volume (past its end: `SEALDISK_E_USAGE`).
///
/// # Safety
/// `vol` is a live volume; `buf` points to `len` writable bytes (may be NULL when `len` is 0).
#[no_mangle]
pub unsafe extern "C" fn sealdisk_read(
    vol: *const sealdisk_volume,
    offset: u64,
    buf: *mut u8,
    len: usize,
) -> c_int {
    entry(|| {
        // SAFETY: the caller's contract, passed on.
        let v = unsafe { volume_arg(vol) }?;
        if len > isize::MAX as usize {
            return Err(usage("length is too large"));
        }
        if buf.is_null() {
            return if len == 0 { Ok(()) } else { Err(null_arg("buf")) };
        }
        // SAFETY: not NULL, `len` writable bytes by the contract, `len` ≤ isize::MAX.
        let buf = unsafe { std::slice::from_raw_parts_mut(buf, len) };
        Ok(v.read_at(offset, buf)?)
    })
}

/// Writes the `len` bytes at `buf` at byte `offset`: `offset` and `len` are multiples of
/// the block size (else `SEALDISK_E_USAGE`); a read-only volume gives
/// `SEALDISK_E_PERMISSION`. The write is durable after `sealdisk_flush` or `sealdisk_close`.
///
/// # Safety
/// `vol` is a live volume; `buf` points to `len` readable bytes (may be NULL when `len` is 0).
#[no_mangle]
pub unsafe extern "C" fn sealdisk_write(
    vol: *const sealdisk_volume,
    offset: u64,
    buf: *const u8,
    len: usize,
) -> c_int {
    entry(|| {
        // SAFETY: the caller's contract, passed on.
        let v = unsafe { volume_arg(vol) }?;
        // SAFETY: the caller's contract, passed on.
        let data = unsafe { bytes_arg(buf, len, "buf") }?;
        Ok(v.write_at(offset, data)?)
    })
}

/// Makes every completed write durable on the device.
///
/// # Safety
/// `vol` is a live volume.
#[no_mangle]
pub unsafe extern "C" fn sealdisk_flush(vol: *const sealdisk_volume) -> c_int {
    entry(|| {
        // SAFETY: the caller's contract, passed on.
        let v = unsafe { volume_arg(vol) }?;
        Ok(v.flush()?)
    })
}

/// Flushes and frees the volume and releases the device's lock. The handle is gone even
/// when the flush fails (the code says so). NULL is ignored (returns `SEALDISK_OK`).
///
/// # Safety
/// `vol` is NULL or a live volume, not used again after this call.
#[no_mangle]
pub unsafe extern "C" fn sealdisk_close(vol: *mut sealdisk_volume) -> c_int {
    entry(|| {
        if vol.is_null() {
            return Ok(());
        }
        // SAFETY: a `Box` leaked by `sealdisk_open`, freed once by the contract.
        let v = unsafe { Box::from_raw(vol) };
        Ok(v.inner.close()?)
    })
}

/// Formats the device or image `path` (an existing file or block device; everything on it
/// is lost) as LUKS, with keyslot 0 opened by the passphrase. `options` NULL: LUKS2,
/// `aes-xts-plain64`, 512-bit key, argon2id benchmarked to 2 s (cryptsetup's defaults).
///
/// # Safety
/// `path` is a NUL-terminated string; `passphrase` points to `passphrase_len` bytes;
/// `options` is NULL or a valid `sealdisk_format_options`.
#[no_mangle]
pub unsafe extern "C" fn sealdisk_luks_format(
    path: *const c_char,
    passphrase: *const u8,
    passphrase_len: usize,
    options: *const sealdisk_format_options,
) -> c_int {
    entry(|| {
        // SAFETY: the caller's contract, passed on.
        let path = unsafe { str_arg(path, "path") }?;
        // SAFETY: the caller's contract, passed on.
        let pass = unsafe { bytes_arg(passphrase, passphrase_len, "passphrase") }?;
        let mut o = FormatOptions::default();
        if !options.is_null() {
            // SAFETY: not NULL, a valid struct by the contract.
            let opts = unsafe { *options };
            // SAFETY: the caller's contract, passed on.
            if let Some(t) = unsafe { opt_str_arg(opts.type_, "options.type_") }? {
                o.luks_type = t.to_owned();
            }
            // SAFETY: the caller's contract, passed on.
            if let Some(c) = unsafe { opt_str_arg(opts.cipher, "options.cipher") }? {
                o.cipher = c.to_owned();
            }
            o.key_bits = (opts.key_bits != 0).then_some(opts.key_bits);
            // SAFETY: points into `opts`, a valid struct.
            o.pbkdf = unsafe { pbkdf_arg(&opts.pbkdf) }?;
        }
        Ok(embed::luks_format(path, pass, &o)?)
    })
}

/// `luksAddKey`: adds a keyslot opened by `new_passphrase`, authorised by `passphrase` (any
/// existing one). `slot`: the keyslot number, or -1 for the first free one; `pbkdf`: NULL
/// for the defaults. The keyslot used is stored in `*out_slot` (when not NULL).
///
/// # Safety
/// `path` is a NUL-terminated string; the passphrases point to their lengths' bytes;
/// `pbkdf` is NULL or valid; `out_slot` is NULL or points to a writable `int`.
#[no_mangle]
pub unsafe extern "C" fn sealdisk_keyslot_add(
    path: *const c_char,
    passphrase: *const u8,
    passphrase_len: usize,
    new_passphrase: *const u8,
    new_passphrase_len: usize,
    slot: c_int,
    pbkdf: *const sealdisk_pbkdf,
    out_slot: *mut c_int,
) -> c_int {
    entry(|| {
        // SAFETY: the caller's contract, passed on.
        let path = unsafe { str_arg(path, "path") }?;
        // SAFETY: the caller's contract, passed on.
        let old = unsafe { bytes_arg(passphrase, passphrase_len, "passphrase") }?;
        // SAFETY: the caller's contract, passed on.
        let new = unsafe { bytes_arg(new_passphrase, new_passphrase_len, "new_passphrase") }?;
        // SAFETY: the caller's contract, passed on.
        let pbkdf = unsafe { pbkdf_arg(pbkdf) }?;
        let slot = match slot {
            -1 => None,
            s => Some(
                u32::try_from(s).map_err(|_| usage(format!("keyslot {s} is not -1 or a keyslot number")))?,
            ),
        };
        let used = embed::keyslot_add(path, old, new, slot, &pbkdf)?;
        if !out_slot.is_null() {
            // SAFETY: not NULL, writable by the contract; keyslots are < 32.
            unsafe { put(out_slot, used as c_int) };
        }
        Ok(())
    })
}

/// `luksRemoveKey`: destroys the keyslot the passphrase opens (even the last one: the
/// volume then cannot be opened any more). Its number is stored in `*out_slot` (when not
/// NULL).
///
/// # Safety
/// `path` is a NUL-terminated string; `passphrase` points to `passphrase_len` bytes;
/// `out_slot` is NULL or points to a writable `int`.
#[no_mangle]
pub unsafe extern "C" fn sealdisk_keyslot_remove(
    path: *const c_char,
    passphrase: *const u8,
    passphrase_len: usize,
    out_slot: *mut c_int,
) -> c_int {
    entry(|| {
        // SAFETY: the caller's contract, passed on.
        let path = unsafe { str_arg(path, "path") }?;
        // SAFETY: the caller's contract, passed on.
        let pass = unsafe { bytes_arg(passphrase, passphrase_len, "passphrase") }?;
        let slot = embed::keyslot_remove(path, pass)?;
        if !out_slot.is_null() {
            // SAFETY: not NULL, writable by the contract; keyslots are < 32.
            unsafe { put(out_slot, slot as c_int) };
        }
        Ok(())
    })
}

/// `luksKillSlot` (batch mode): destroys keyslot `slot` without asking for a passphrase.
///
/// # Safety
/// `path` is a NUL-terminated string.
#[no_mangle]
pub unsafe extern "C" fn sealdisk_keyslot_kill(path: *const c_char, slot: c_int) -> c_int {
    entry(|| {
        // SAFETY: the caller's contract, passed on.
        let path = unsafe { str_arg(path, "path") }?;
        let slot =
            u32::try_from(slot).map_err(|_| usage(format!("keyslot {slot} is not a keyslot number")))?;
        Ok(embed::keyslot_kill(path, slot)?)
    })
}

/// The metadata of the device `path` as JSON in `*out_json`: for LUKS2, the header's JSON
/// exactly as `cryptsetup luksDump --dump-json-metadata` prints it; for other formats, the
/// object `sealdisk_probe` gives. Free it with `sealdisk_string_free`.
///
/// # Safety
/// `path` is a NUL-terminated string; `out_json` points to writable memory for a pointer.
#[no_mangle]
pub unsafe extern "C" fn sealdisk_dump_json(path: *const c_char, out_json: *mut *mut c_char) -> c_int {
    entry(|| {
        // SAFETY: the caller's contract, passed on.
        unsafe { clear_out(out_json, "out_json") }?;
        // SAFETY: the caller's contract, passed on.
        let path = unsafe { str_arg(path, "path") }?;
        let json = embed::dump_json(path)?;
        // SAFETY: checked not NULL by `clear_out`.
        unsafe { put(out_json, out_string(json)?) };
        Ok(())
    })
}
