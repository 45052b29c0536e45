//! The `sealdisk` Python module: pyo3 over the `embed` crate (the operations the C ABI
//! exposes too), built by maturin (`pip install ./bindings/python`). See README.md and
//! sealdisk.pyi.
//!
//! Every operation that touches a device runs with the interpreter detached (key derivation
//! takes seconds), so other Python threads go on. Errors become exceptions by kind, all
//! subclasses of `sealdisk.Error`; a panic would be pyo3's `PanicException`, never an abort.
use std::borrow::Cow;
use std::sync::{Arc, Mutex, PoisonError};

use embed::{Error as EmbedError, FormatOptions, Kind, Pbkdf};
use pyo3::create_exception;
use pyo3::exceptions::{PyException, PyTypeError};
use pyo3::prelude::*;
use pyo3::types::{PyBytes, PyString};

create_exception!(sealdisk, Error, PyException, "Base class of every sealdisk error.");
create_exception!(sealdisk, WrongKeyError, Error, "The passphrase opens no keyslot or protector.");
create_exception!(sealdisk, CorruptError, Error, "The metadata on the device does not decode or check.");
create_exception!(sealdisk, UnsupportedError, Error, "A format, feature or cipher this build does not have.");
create_exception!(
    sealdisk,
    UsageError,
    Error,
    "Something impossible or inconsistent was asked (bad option, unaligned write, another format)."
);
create_exception!(sealdisk, BusyError, Error, "The device is in use (locked by another opener).");
create_exception!(
    sealdisk,
    PermissionDeniedError,
    Error,
    "The device or volume is read-only, or access to it is denied."
);
create_exception!(sealdisk, TooSmallError, Error, "The device is too small for the layout.");
create_exception!(sealdisk, DeviceIOError, Error, "Reading or writing the device failed.");
create_exception!(sealdisk, InternalError, Error, "A bug in sealdisk (a broken invariant).");

fn to_py(e: EmbedError) -> PyErr {
    let m = e.message().to_owned();
    match e.kind() {
        Kind::WrongKey => WrongKeyError::new_err(m),
        Kind::Corrupt => CorruptError::new_err(m),
        Kind::Unsupported => UnsupportedError::new_err(m),
        Kind::Usage => UsageError::new_err(m),
        Kind::Busy => BusyError::new_err(m),
        Kind::Permission => PermissionDeniedError::new_err(m),
        Kind::TooSmall => TooSmallError::new_err(m),
        Kind::Io => DeviceIOError::new_err(m),
        Kind::Internal => InternalError::new_err(m),
        Kind::Other => Error::new_err(m),
    }
}

/// A passphrase argument: `str` (its UTF-8 bytes) or `bytes`, borrowed from the Python
/// object (the library copies it into memory it wipes).
fn pass_bytes<'a>(p: &'a Bound<'_, PyAny>, name: &str) -> PyResult<&'a [u8]> {
    if let Ok(s) = p.cast::<PyString>() {
        return Ok(s.to_str()?.as_bytes());
    }
    if let Ok(b) = p.cast::<PyBytes>() {
        return Ok(b.as_bytes());
    }
    Err(PyTypeError::new_err(format!("{name} must be str or bytes")))
}

fn json_to_py<'py>(py: Python<'py>, text: &str) -> PyResult<Bound<'py, PyAny>> {
    py.import("json")?.call_method1("loads", (text,))
}

fn pbkdf(
    kind: Option<String>,
    iterations: Option<u32>,
    memory_kib: Option<u32>,
    parallel: Option<u32>,
) -> Pbkdf {
    Pbkdf { kind, iterations, memory_kib, parallel }
}

/// Says what is on the device or image at `path` (no key needed, nothing written): a dict
/// with `type` (`"luks1"`, `"luks2"`, `"bitlk"`, `"fvault2"`, `"integrity"`, or None),
/// `name`, `size`, and what the header says (`uuid`, `label`, `cipher`, ...).
#[pyfunction]
fn probe<'py>(py: Python<'py>, path: &str) -> PyResult<Bound<'py, PyAny>> {
    let json = py.detach(|| embed::probe(path).map(|p| p.to_json().to_string())).map_err(to_py)?;
    json_to_py(py, &json)
}

/// An open volume: its plaintext as a block device. Use as a context manager, or call
/// `close()`.
#[pyclass(module = "sealdisk", frozen)]
struct Volume {
    inner: Mutex<Option<Arc<embed::Volume>>>,
    kind: &'static str,
    size: u64,
    block_size: u32,
    read_only: bool,
}

impl Volume {
    fn get(&self) -> PyResult<Arc<embed::Volume>> {
        let g = self.inner.lock().unwrap_or_else(PoisonError::into_inner);
        g.clone().ok_or_else(|| UsageError::new_err("the volume is closed"))
    }
}

#[pymethods]
impl Volume {
    /// What it is: `"luks1"`, `"luks2"`, `"luks2-aead"`, `"bitlk"`, `"fvault2"`, ...
    #[getter]
    fn kind(&self) -> &'static str {
        self.kind
    }

    /// Size of the plaintext in bytes.
    #[getter]
    fn size(&self) -> u64 {
        self.size
    }

    /// Logical block size in bytes; writes are whole blocks.
    #[getter]
    fn block_size(&self) -> u32 {
        self.block_size
    }

    /// Whether it was opened read-only.
    #[getter]
    fn read_only(&self) -> bool {
        self.read_only
    }

    /// Whether `close()` was called.
    #[getter]
    fn closed(&self) -> bool {
        self.inner.lock().unwrap_or_else(PoisonError::into_inner).is_none()
    }

    /// Reads `length` bytes at byte `offset` (any offset and length inside the volume).
    fn read<'py>(&self, py: Python<'py>, offset: u64, length: usize) -> PyResult<Bound<'py, PyBytes>> {
        let v = self.get()?;
        // Checked before the buffer is allocated: a huge length is an error, not an abort.
        if (length as u64).checked_add(offset).is_none_or(|end| end > self.size) {
            let size = self.size;
            return Err(UsageError::new_err(format!(
                "a read of {length} bytes at offset {offset} goes past the end of the volume ({size} bytes)"
            )));
        }
        let mut buf = vec![0u8; length];
        py.detach(|| v.read_at(offset, &mut buf)).map_err(to_py)?;
        Ok(PyBytes::new(py, &buf))
    }

    /// Writes `data` (bytes-like) at byte `offset`: both whole blocks.
    fn write(&self, py: Python<'_>, offset: u64, data: Cow<'_, [u8]>) -> PyResult<()> {
        let v = self.get()?;
        py.detach(|| v.write_at(offset, &data)).map_err(to_py)
    }

    /// Makes every completed write durable.
    fn flush(&self, py: Python<'_>) -> PyResult<()> {
        let v = self.get()?;
        py.detach(|| v.flush()).map_err(to_py)
    }

    /// Flushes and closes (releases the device's lock). Closing twice is allowed.
    fn close(&self, py: Python<'_>) -> PyResult<()> {
        let taken = self.inner.lock().unwrap_or_else(PoisonError::into_inner).take();
        let Some(v) = taken else { return Ok(()) };
        py.detach(|| match Arc::try_unwrap(v) {
            Ok(v) => v.close(),
            // A read on another thread still holds it: flush now, closed when it ends.
            Err(shared) => shared.flush(),
        })
        .map_err(to_py)
    }

    fn __enter__(slf: Bound<'_, Self>) -> Bound<'_, Self> {
        slf
    }

    #[pyo3(signature = (*_exc))]
    fn __exit__(&self, py: Python<'_>, _exc: &Bound<'_, pyo3::types::PyTuple>) -> PyResult<bool> {
        self.close(py)?;
        Ok(false)
    }

    fn __repr__(&self) -> String {
        let state = if self.closed() { ", closed" } else { "" };
        format!(
            "<sealdisk.Volume {} {} bytes{}{state}>",
            self.kind,
            self.size,
            if self.read_only { ", read-only" } else { "" }
        )
    }
}

/// Opens the volume at `path` (probed: LUKS1, LUKS2, BitLocker, FileVault2, ...) with
/// `passphrase` (str or bytes), read-only unless `read_only=False`. The device is locked
/// (shared when read-only, exclusive when read-write) until the volume is closed.
#[pyfunction]
#[pyo3(signature = (path, passphrase=None, read_only=true))]
fn open(
    py: Python<'_>,
    path: &str,
    passphrase: Option<&Bound<'_, PyAny>>,
    read_only: bool,
) -> PyResult<Volume> {
    let pass = passphrase.map(|p| pass_bytes(p, "passphrase")).transpose()?;
    let v = py.detach(|| embed::Volume::open(path, pass, read_only)).map_err(to_py)?;
    Ok(Volume {
        kind: v.kind(),
        size: v.size(),
        block_size: v.block_size(),
        read_only: v.read_only(),
        inner: Mutex::new(Some(Arc::new(v))),
    })
}

/// Formats the existing file or device at `path` as LUKS (everything on it is lost), with
/// keyslot 0 opened by `passphrase`. Defaults are cryptsetup's: LUKS2, aes-xts-plain64,
/// a 512-bit key, argon2id for 2 s. `key_size` is in bits; `pbkdf`, `iterations`,
/// `memory_kib`, `parallel` are cryptsetup's `--pbkdf*` options (tests use
/// `pbkdf="pbkdf2", iterations=1000`).
#[pyfunction]
#[pyo3(signature = (path, passphrase, r#type="luks2", cipher="aes-xts-plain64", key_size=None, pbkdf=None, iterations=None, memory_kib=None, parallel=None))]
#[allow(clippy::too_many_arguments)]
fn luks_format(
    py: Python<'_>,
    path: &str,
    passphrase: &Bound<'_, PyAny>,
    r#type: &str,
    cipher: &str,
    key_size: Option<u32>,
    pbkdf: Option<String>,
    iterations: Option<u32>,
    memory_kib: Option<u32>,
    parallel: Option<u32>,
) -> PyResult<()> {
    let pass = pass_bytes(passphrase, "passphrase")?;
    let o = FormatOptions {
        luks_type: r#type.to_owned(),
        cipher: cipher.to_owned(),
        key_bits: key_size,
        pbkdf: self::pbkdf(pbkdf, iterations, memory_kib, parallel),
    };
    py.detach(|| embed::luks_format(path, pass, &o)).map_err(to_py)
}

/// `luksAddKey`: adds a keyslot for `new_passphrase`, authorised by `passphrase` (any
/// existing one), in `slot` or the first free one. Returns the keyslot number.
#[pyfunction]
#[pyo3(signature = (path, passphrase, new_passphrase, slot=None, pbkdf=None, iterations=None, memory_kib=None, parallel=None))]
#[allow(clippy::too_many_arguments)]
fn keyslot_add(
    py: Python<'_>,
    path: &str,
    passphrase: &Bound<'_, PyAny>,
    new_passphrase: &Bound<'_, PyAny>,
    slot: Option<u32>,
    pbkdf: Option<String>,
    iterations: Option<u32>,
    memory_kib: Option<u32>,
    parallel: Option<u32>,
) -> PyResult<u32> {
    let old = pass_bytes(passphrase, "passphrase")?;
    let new = pass_bytes(new_passphrase, "new_passphrase")?;
    let p = self::pbkdf(pbkdf, iterations, memory_kib, parallel);
    py.detach(|| embed::keyslot_add(path, old, new, slot, &p)).map_err(to_py)
}

/// `luksRemoveKey`: destroys the keyslot `passphrase` opens (even the last one). Returns
/// its number.
#[pyfunction]
fn keyslot_remove(py: Python<'_>, path: &str, passphrase: &Bound<'_, PyAny>) -> PyResult<u32> {
    let pass = pass_bytes(passphrase, "passphrase")?;
    py.detach(|| embed::keyslot_remove(path, pass)).map_err(to_py)
}

/// `luksKillSlot` (batch mode): destroys keyslot `slot`, no passphrase asked.
#[pyfunction]
fn keyslot_kill(py: Python<'_>, path: &str, slot: u32) -> PyResult<()> {
    py.detach(|| embed::keyslot_kill(path, slot)).map_err(to_py)
}

/// The metadata as a dict: a LUKS2 header's JSON (what `cryptsetup luksDump
/// --dump-json-metadata` prints), else what `probe` returns.
#[pyfunction]
fn dump_json<'py>(py: Python<'py>, path: &str) -> PyResult<Bound<'py, PyAny>> {
    let json = py.detach(|| embed::dump_json(path)).map_err(to_py)?;
    json_to_py(py, &json)
}

/// sealdisk: LUKS1/LUKS2, BitLocker and FileVault2 volumes read and written in userspace,
/// byte-compatible with cryptsetup and the kernel (no root, no device-mapper).
#[pymodule]
mod sealdisk {
    #[pymodule_export]
    use super::{
        dump_json, keyslot_add, keyslot_kill, keyslot_remove, luks_format, open, probe, BusyError,
        CorruptError, DeviceIOError, Error, InternalError, PermissionDeniedError, TooSmallError,
        UnsupportedError, UsageError, Volume, WrongKeyError,
    };

    #[pymodule_init]
    fn init(m: &pyo3::Bound<'_, pyo3::types::PyModule>) -> pyo3::PyResult<()> {
        use pyo3::types::PyModuleMethods;
        m.add("__version__", env!("CARGO_PKG_VERSION"))
    }
}
