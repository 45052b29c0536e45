"""sealdisk: LUKS1/LUKS2, BitLocker and FileVault2 volumes read and written in userspace,
byte-compatible with cryptsetup and the kernel (no root, no device-mapper)."""

from types import TracebackType
from typing import Any, Literal

__version__: str

class Error(Exception):
    """Base class of every sealdisk error."""

class WrongKeyError(Error):
    """The passphrase opens no keyslot or protector."""

class CorruptError(Error):
    """The metadata on the device does not decode or check."""

class UnsupportedError(Error):
    """A format, feature or cipher this build does not have."""

class UsageError(Error):
    """Something impossible or inconsistent was asked (bad option, unaligned write, another format)."""

class BusyError(Error):
    """The device is in use (locked by another opener)."""

class PermissionDeniedError(Error):
    """The device or volume is read-only, or access to it is denied."""

class TooSmallError(Error):
    """The device is too small for the layout."""

class DeviceIOError(Error):
    """Reading or writing the device failed."""

class InternalError(Error):
    """A bug in sealdisk (a broken invariant)."""

Passphrase = str | bytes

class Volume:
    """An open volume: its plaintext as a block device. A context manager."""

    @property
    def kind(self) -> str:
        """"luks1", "luks2", "luks2-aead", "bitlk", "fvault2", "integrity", "tcrypt", "plain"."""
    @property
    def size(self) -> int:
        """Size of the plaintext in bytes."""
    @property
    def block_size(self) -> int:
        """Logical block size in bytes; writes are whole blocks."""
    @property
    def read_only(self) -> bool: ...
    @property
    def closed(self) -> bool: ...
    def read(self, offset: int, length: int) -> bytes:
        """Reads `length` bytes at byte `offset` (any offset and length inside the volume)."""
    def write(self, offset: int, data: bytes | bytearray) -> None:
        """Writes `data` at byte `offset`; offset and length are whole blocks."""
    def flush(self) -> None:
        """Makes every completed write durable."""
    def close(self) -> None:
        """Flushes and closes (releases the device's lock); closing twice is allowed."""
    def __enter__(self) -> Volume: ...
    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> Literal[False]: ...

def probe(path: str) -> dict[str, Any]:
    """What is on the device: {"type": "luks2" | "luks1" | "bitlk" | "fvault2" | "integrity" | None,
    "name", "size", and "uuid", "label", "cipher", ... when the header says}."""

def open(path: str, passphrase: Passphrase | None = None, read_only: bool = True) -> Volume:
    """Opens the volume at `path` (probed) with `passphrase`; read-only unless read_only=False."""

def luks_format(
    path: str,
    passphrase: Passphrase,
    type: Literal["luks1", "luks2"] = "luks2",
    cipher: str = "aes-xts-plain64",
    key_size: int | None = None,
    pbkdf: Literal["pbkdf2", "argon2i", "argon2id"] | None = None,
    iterations: int | None = None,
    memory_kib: int | None = None,
    parallel: int | None = None,
) -> None:
    """Formats the existing file or device at `path` as LUKS (key_size in bits)."""

def keyslot_add(
    path: str,
    passphrase: Passphrase,
    new_passphrase: Passphrase,
    slot: int | None = None,
    pbkdf: Literal["pbkdf2", "argon2i", "argon2id"] | None = None,
    iterations: int | None = None,
    memory_kib: int | None = None,
    parallel: int | None = None,
) -> int:
    """luksAddKey: a keyslot for new_passphrase, authorised by passphrase. Returns its number."""

def keyslot_remove(path: str, passphrase: Passphrase) -> int:
    """luksRemoveKey: destroys the keyslot passphrase opens. Returns its number."""

def keyslot_kill(path: str, slot: int) -> None:
    """luksKillSlot: destroys keyslot `slot`, no passphrase asked."""

def dump_json(path: str) -> dict[str, Any]:
    """LUKS2: the header's JSON as `cryptsetup luksDump --dump-json-metadata`; else probe()."""
