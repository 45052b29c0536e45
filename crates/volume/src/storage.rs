//! Storage behind a seam: what a volume is assembled on, opened by *locator*.
//!
//! ```text
//!   locator ──open()──► scheme? ─ none / file:// ──► path ─ regular file ──► FileDevice (image)
//!                         │                              └ block device  ──► FileDevice (size from
//!                         │                                                  the device, its logical
//!                         │                                                  block size, O_DIRECT)
//!                         ├ s3://, gs://, azblob:// ──► objstore::ObjectDevice (objects in a
//!                         │                              bucket, local write-back cache, one writer's
//!                         │                              lease; crates/objstore)
//!                         └ nbd://, ... ──► VolumeError::UnsupportedScheme
//! ```
//! Everything above this module sees only [`Storage`]: an `Arc<dyn BlockDevice>` with a
//! display name and what it is. A caller that builds its own device (a memory device, a
//! lock wrapper, a test fault injector) wraps it with [`Storage::new`].
use std::sync::Arc;

use blockdev::{BackingKind, BlockDevice, FileDevice, FileLock, FileOptions};

use crate::VolumeError;

/// How to open storage.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct StorageOptions {
    /// Open read-only (writes are refused).
    pub read_only: bool,
    /// Bypass the page cache (O_DIRECT) on files and block devices.
    pub direct: bool,
    /// The storage lock held while the storage is open (`blockdev::FileLock`).
    pub lock: FileLock,
}

/// What a [`Storage`] is.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum StorageKind {
    /// A regular file (an image).
    File,
    /// A block device node (`/dev/sdb1`, `/dev/loop0`).
    BlockDevice,
    /// A device the caller built (memory, a wrapper, a test device).
    Other,
    /// A volume on object storage (`s3://bucket/prefix`, crates/objstore).
    Object,
}

/// Opened storage: the device a volume is assembled on.
#[derive(Clone)]
pub struct Storage {
    /// The device.
    pub device: Arc<dyn BlockDevice>,
    /// How it is named in messages and table lines (the path, or the locator).
    pub name: String,
    /// What it is.
    pub kind: StorageKind,
    /// Whether it sits on rotational media (`blockdev::is_rotational`); false when unknown.
    pub rotational: bool,
    /// The same device as `device` when it is a file or block device [`open`] opened, for
    /// [`Storage::remeasured`].
    file: Option<Arc<FileDevice>>,
}

impl std::fmt::Debug for Storage {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Storage")
            .field("name", &self.name)
            .field("kind", &self.kind)
            .field("size", &self.device.geometry().size)
            .finish()
    }
}

impl Storage {
    /// Storage over a device the caller built.
    pub fn new(device: Arc<dyn BlockDevice>, name: impl Into<String>) -> Self {
        Storage { device, name: name.into(), kind: StorageKind::Other, rotational: false, file: None }
    }

    /// The same storage measured again, after it was grown (or shrunk) underneath the open
    /// volume: a file's or block device's size as it is now (same open file, same lock;
    /// `FileDevice::remeasured`). Other storage keeps the size it was opened with, and is
    /// returned as it is.
    pub fn remeasured(&self) -> Result<Storage, VolumeError> {
        let Some(file) = &self.file else { return Ok(self.clone()) };
        let dev = Arc::new(
            file.remeasured().map_err(|source| VolumeError::Device { path: self.name.clone(), source })?,
        );
        Ok(Storage { device: dev.clone(), file: Some(dev), ..self.clone() })
    }

    /// Grows the storage to at least `bytes` and returns it measured again
    /// ([`remeasured`](Self::remeasured)): an image file is extended (sparse, synced); one
    /// already that long, and other storage already that long, are returned as they are. A
    /// block device, object storage and caller-built devices cannot be grown here
    /// (`Unsupported`: grow the device, or the bucket's volume, by its own means).
    pub fn grow(&self, bytes: u64) -> Result<Storage, VolumeError> {
        if bytes <= self.size() {
            return Ok(self.clone());
        }
        let what = match self.kind {
            StorageKind::File => None,
            StorageKind::BlockDevice => Some("a block device"),
            StorageKind::Object => Some("object storage"),
            StorageKind::Other => Some("a device the caller built"),
        };
        let (None, Some(file)) = (what, &self.file) else {
            return Err(VolumeError::NotGrowable {
                path: self.name.clone(),
                what: what.unwrap_or("unknown"),
            });
        };
        file.grow_file(bytes).map_err(|source| VolumeError::Device { path: self.name.clone(), source })?;
        self.remeasured()
    }

    /// Size in bytes.
    pub fn size(&self) -> u64 {
        self.device.geometry().size
    }
}

/// The URI scheme of `locator` (`s3` of `s3://bucket/key`), if it has one. A path never has
/// one: `./s3://x` and `/a://b` are paths.
pub fn scheme(locator: &str) -> Option<&str> {
    let (s, _) = locator.split_once("://")?;
    let mut chars = s.chars();
    let first = chars.next()?;
    (first.is_ascii_alphabetic() && chars.all(|c| c.is_ascii_alphanumeric() || matches!(c, '+' | '-' | '.')))
        .then_some(s)
}

/// The local path `locator` names: itself, or the path of a `file://` URI. Other schemes
/// are [`VolumeError::UnsupportedScheme`].
pub fn local_path(locator: &str) -> Result<&str, VolumeError> {
    match scheme(locator) {
        None => Ok(locator),
        Some(s) if s.eq_ignore_ascii_case("file") => Ok(&locator[s.len() + 3..]),
        // Object storage and other backends plug in here, one arm each.
        Some(s) => Err(VolumeError::UnsupportedScheme { scheme: s.to_owned(), locator: locator.to_owned() }),
    }
}

/// Opens the storage `locator` names: a regular file or a block device by path (or
/// `file://` URI), with the lock `o` asks for. A block device's size and logical block size
/// come from the device.
///
/// An object-storage locator (`s3://bucket/prefix?endpoint=…`, see `objstore::Locator`)
/// opens the volume in that bucket (created with `size=` on an empty prefix); opened
/// writable, it takes the volume's lease, so a second writer anywhere is refused (`Busy`).
pub fn open(locator: &str, o: &StorageOptions) -> Result<Storage, VolumeError> {
    if scheme(locator).is_some_and(objstore::is_object_scheme) {
        let dev = objstore::open(locator, objstore::OpenOptions { read_only: o.read_only, create: false })
            // The parameters stay out of messages (a refused one may be a secret).
            .map_err(|source| VolumeError::Device { path: display_locator(locator), source })?;
        return Ok(Storage {
            device: Arc::new(dev),
            name: locator.to_owned(),
            kind: StorageKind::Object,
            rotational: false,
            file: None,
        });
    }
    let path = local_path(locator)?;
    let fopts =
        FileOptions { read_only: o.read_only, direct: o.direct, lock: o.lock, ..FileOptions::default() };
    let dev = Arc::new(
        FileDevice::open(path, fopts)
            .map_err(|source| VolumeError::Device { path: path.to_owned(), source })?,
    );
    let kind = match dev.backing() {
        BackingKind::RegularFile => StorageKind::File,
        BackingKind::BlockDevice => StorageKind::BlockDevice,
    };
    let rotational = blockdev::is_rotational(std::path::Path::new(path));
    Ok(Storage { device: dev.clone(), name: path.to_owned(), kind, rotational, file: Some(dev) })
}

/// `locator` without its `?parameters`, for messages.
pub fn display_locator(locator: &str) -> String {
    locator.split('?').next().unwrap_or(locator).to_owned()
}

/// Makes sure `locator` can hold `size` bytes: a missing file is created, a shorter regular
/// file grown (sparse); a block device or a longer file is left alone. Used for detached
/// header files, which cryptsetup creates and extends the same way.
/// An object-storage locator is left to [`open`] (its `size=` creates the volume).
pub fn ensure_size(locator: &str, size: u64) -> Result<(), VolumeError> {
    if scheme(locator).is_some_and(objstore::is_object_scheme) {
        return Ok(());
    }
    let path = local_path(locator)?;
    let err = |source| VolumeError::Create { path: path.to_owned(), source };
    let f = std::fs::OpenOptions::new().create(true).truncate(false).write(true).open(path).map_err(err)?;
    let meta = f.metadata().map_err(err)?;
    if meta.file_type().is_file() && meta.len() < size {
        f.set_len(size).map_err(err)?;
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn schemes_and_paths() {
        assert_eq!(scheme("s3://bucket/key"), Some("s3"));
        assert_eq!(scheme("/dev/loop0"), None);
        assert_eq!(scheme("./s3://x"), None);
        assert_eq!(scheme("1x://y"), None);
        assert_eq!(local_path("file:///tmp/a.img").unwrap(), "/tmp/a.img");
        let e = open("nbd://host/disk", &StorageOptions::default()).unwrap_err();
        assert_eq!(e.kind(), crate::ErrorKind::Unsupported);
        assert!(e.to_string().contains("nbd"), "{e}");
        // An object-storage locator goes to objstore, which checks it before any request.
        let e = open("s3://bucket/disk?secret_access_key=x", &StorageOptions::default()).unwrap_err();
        let cause = std::error::Error::source(&e).map(|s| s.to_string()).unwrap_or_default();
        assert!(cause.contains("credentials are never taken from the locator"), "{e}: {cause}");
        assert_eq!(e.to_string(), "cannot open device s3://bucket/disk", "parameters stay out of messages");
    }

    #[test]
    fn files_open_and_grow() {
        let dir = tempfile::tempdir().unwrap();
        let p = dir.path().join("h.img");
        let p = p.to_str().unwrap();
        ensure_size(p, 1 << 20).unwrap();
        let s = open(&format!("file://{p}"), &StorageOptions::default()).unwrap();
        assert_eq!((s.size(), s.kind, s.name.as_str()), (1 << 20, StorageKind::File, p));
        ensure_size(p, 4096).unwrap();
        assert_eq!(std::fs::metadata(p).unwrap().len(), 1 << 20, "never shrunk");
        ensure_size(p, 2 << 20).unwrap();
        assert_eq!(s.size(), 1 << 20, "open storage keeps its size");
        let grown = s.remeasured().unwrap();
        assert_eq!((grown.size(), grown.kind, grown.name.as_str()), (2 << 20, StorageKind::File, p));
        let bigger = s.grow(3 << 20).unwrap();
        assert_eq!((bigger.size(), std::fs::metadata(p).unwrap().len()), (3 << 20, 3 << 20));
        assert_eq!(bigger.grow(4096).unwrap().size(), 3 << 20, "never shrunk");
        let e = Storage::new(Arc::new(blockdev::MemDevice::new(4096, 512)), "mem").grow(8192).unwrap_err();
        assert_eq!(e.kind(), crate::ErrorKind::Unsupported);
        let e = open(&format!("{p}.missing"), &StorageOptions::default()).unwrap_err();
        assert_eq!(e.kind(), crate::ErrorKind::Io);
    }
}
