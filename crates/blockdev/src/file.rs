//! A device backed by a regular file or a block device, using positional I/O.
//!
//! ```text
//!   read_at / write_at ──► pread / pwrite (FileExt::read_exact_at / write_all_at)
//!                             │  O_DIRECT and the caller's buffer not 4096-aligned?
//!                             └─► copy through a per-thread AlignedBuf, 1 MiB at a time
//!   write_at + FUA     ──► pwrite, then fdatasync         (Caps::FUA is not advertised)
//!   flush              ──► fdatasync
//!                             └─► failed once? every later flush / FUA fails (WritebackLatch)
//!   discard            ──► fallocate(PUNCH_HOLE | KEEP_SIZE)      a no-op where unsupported
//!   write_zeroes       ──► fallocate(ZERO_RANGE | KEEP_SIZE)      (PUNCH_HOLE with MAY_UNMAP)
//!                             └─► EOPNOTSUPP: pwrite zero buffers
//! ```
//!
//! No lock is taken per request: `pread`/`pwrite` carry their own offset, so requests from
//! many threads proceed in parallel and the kernel orders overlapping writes.
//!
//! # The storage lock
//! With [`FileOptions::lock`] the device takes a BSD `flock` on its descriptor at open and
//! holds it until it is dropped: shared (`LOCK_SH`) or exclusive (`LOCK_EX`), never waiting
//! (`LOCK_NB`). A conflicting holder makes the open fail with [`BlockErrorKind::Busy`]
//! before anything is read or written. This is the convention systemd documents for block
//! devices ("Locking Block Device Access": a tool that writes takes `LOCK_EX`, udev then
//! leaves the device alone), applied to image files as well. The lock is advisory (a
//! process that does not ask is not stopped) and belongs to the open file description: two
//! `FileDevice`s opened separately on one file conflict even within one process, so a
//! caller that needs the same storage twice opens it once.
//!
//! # Concurrent overlapping reads and writes
//! With buffered I/O (no `direct`), Linux copies data into and out of the page cache without
//! locking the page for readers (ext4's `filemap_read`), so a read racing an overlapping
//! write can return a block that is half old, half new — measured here in about half of 300
//! runs of the conformance case `concurrent_reads_see_whole_blocks`. That breaks the trait's
//! "old or new per block" for such races. Wrap the device in [`crate::RangeLocked`] when the
//! layer above needs it (a torn ciphertext block decrypts to garbage); O_DIRECT requests go to
//! the disk whole and did not tear in the same test.
//!
//! # Failed write-back is latched
//! The kernel reports a failed write-back to `fdatasync` once per open file and may drop the
//! pages that failed, so a second `fdatasync` can return 0 after data was lost. The first
//! failed `fdatasync` (of a flush, a FUA write or a FUA write-zeroes) therefore latches the
//! device ([`crate::WritebackLatch`]): every later flush and FUA request fails with `Io`
//! until the device is dropped and opened again. A FUA request refused by the latch writes
//! nothing. A failed `pwrite` (EIO, ENOSPC) fails its own request only and does not latch:
//! with buffered I/O the kernel reports it before anything was acknowledged, and nothing
//! acknowledged was lost. Plain writes and reads go on after a latch.
//!
//! `fdatasync` calls are serialised with group commit: a flush that waited while another
//! `fdatasync` started after its own request began is already covered and returns without a
//! second call. Serialising is what makes the latch exact: concurrent `fdatasync`s on one
//! descriptor would let one of them consume the kernel's error report and another return 0.
//!
//! # Geometry
//! * A regular file's size is its length when opened, **rounded down to the block size**: a
//!   trailing partial block is not addressable (it is neither read nor changed). The block size
//!   is `FileOptions::block_size`, or 512, or with `direct` the filesystem's direct-I/O offset
//!   alignment (`statx` `STATX_DIOALIGN`, 4096 when the kernel does not say).
//! * A block device's size comes from seeking to its end (the kernel answers with the same
//!   value as the `BLKGETSIZE64` ioctl, without `unsafe`); its logical and physical block sizes
//!   from `BLKSSZGET`/`BLKPBSZGET`. The block size may be raised above the logical block size
//!   (e.g. 4096 on a 512-byte disk) but never lowered below it.
//! * The geometry is fixed at open. If the file shrinks afterwards, reads past its new end fail
//!   with `Io` ("short read") rather than returning zeroes or short data.
//!
//! # Discard on block devices
//! There is no safe wrapper for `BLKDISCARD`, so a block device is discarded with
//! `fallocate(PUNCH_HOLE | KEEP_SIZE)`, which the kernel turns into a write-zeroes request that
//! may unmap and never falls back to writing zero pages. Where the device cannot do that, the
//! discard is a successful no-op — the contract allows discarded blocks to keep their data.
//! `write_zeroes` on a block device uses `fallocate(ZERO_RANGE | KEEP_SIZE)`, which the
//! kernel (`blkdev_fallocate`) runs as `blkdev_issue_zeroout`, the same request the
//! `BLKZEROOUT` ioctl issues (offloaded where the device has write-zeroes, else zero pages).
//! Both are checked on a loop device by `crates/cli/tests/loop_devices.rs`.

use std::cell::RefCell;
use std::fs::{File, OpenOptions};
use std::io::{self, Seek, SeekFrom};
use std::os::unix::fs::{FileExt, FileTypeExt, OpenOptionsExt};
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Mutex;

use rustix::fs::{AtFlags, FallocateFlags, StatxFlags};
use rustix::io::Errno;

use crate::aligned::{is_aligned, AlignedBuf, DIRECT_IO_ALIGN};
use crate::latch::WritebackLatch;
use crate::{
    BlockDevice, BlockError, BlockErrorKind, BlockResult, Caps, Extent, ExtentFlags, Geometry, WriteFlags,
    ZeroFlags,
};

/// Largest piece copied through the bounce buffer (and written per zero-filling `pwrite`).
const BOUNCE_CHUNK: usize = 1 << 20;

thread_local! {
    /// One bounce buffer per thread, kept between requests so that the O_DIRECT path with
    /// unaligned caller buffers does not allocate per request.
    static BOUNCE: RefCell<Option<AlignedBuf>> = const { RefCell::new(None) };
}

/// Runs `f` with this thread's `BOUNCE_CHUNK`-byte aligned buffer.
fn with_bounce<R>(f: impl FnOnce(&mut AlignedBuf) -> R) -> R {
    // Taken out of the cell for the duration, so a nested call (a FileDevice stacked over
    // another FileDevice's file, say) simply allocates its own.
    let mut buf = BOUNCE
        .with(|cell| cell.borrow_mut().take())
        .unwrap_or_else(|| AlignedBuf::for_direct_io(BOUNCE_CHUNK));
    let r = f(&mut buf);
    BOUNCE.with(|cell| *cell.borrow_mut() = Some(buf));
    r
}

/// How to open a [`FileDevice`].
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct FileOptions {
    /// Open `O_RDONLY`; the device advertises `Caps::READ_ONLY` and refuses every write,
    /// discard and write-zeroes with `BlockErrorKind::ReadOnly`.
    pub read_only: bool,
    /// Open with `O_DIRECT` (bypass the page cache). Opening fails with
    /// `BlockErrorKind::Unsupported` where the filesystem refuses direct I/O (e.g. old tmpfs).
    pub direct: bool,
    /// Logical block size to expose: a power of two in 512..=4096, at least the device's own
    /// logical block size (and, with `direct`, its direct-I/O alignment). `None` picks the
    /// smallest that works (see the module docs).
    pub block_size: Option<u32>,
    /// The storage lock taken at open and held while the device lives (module docs).
    pub lock: FileLock,
}

/// Which [`FileOptions::lock`] to take on the opened file.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Hash)]
pub enum FileLock {
    /// No lock (the default for a library user that coordinates itself).
    #[default]
    None,
    /// `flock(LOCK_SH)`: other shared holders may open too; an exclusive holder may not.
    Shared,
    /// `flock(LOCK_EX)`: nobody else may hold a lock on the file.
    Exclusive,
}

/// What backs a [`FileDevice`].
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum BackingKind {
    /// A regular file (an image).
    RegularFile,
    /// A block device node such as `/dev/sdb1` or `/dev/loop0`.
    BlockDevice,
}

/// A [`BlockDevice`] over a regular file or a block device node.
#[derive(Debug)]
pub struct FileDevice {
    file: File,
    path: PathBuf,
    geometry: Geometry,
    backing: BackingKind,
    options: FileOptions,
    /// Set by the first failed `fdatasync`; refuses later flushes and FUA requests.
    latch: WritebackLatch,
    /// Durability requests numbered as they begin (their writes already completed).
    sync_requests: AtomicU64,
    /// Held across each `fdatasync`; the highest request number a successful one covered.
    synced_upto: Mutex<u64>,
}

impl FileDevice {
    /// Opens `path` (a regular file or a block device) as a device.
    ///
    /// Errors: `InvalidArgument` for other file types or a bad `block_size`; `Unsupported` when
    /// `direct` is asked on a filesystem without direct I/O; `Busy` when `lock` conflicts with
    /// another holder's; otherwise the OS error's kind (`Io`, or `ReadOnly` for
    /// `EROFS`/`EACCES`/`EPERM`). Messages name the path.
    pub fn open(path: impl AsRef<Path>, options: FileOptions) -> BlockResult<Self> {
        let path = path.as_ref();
        let mut oo = OpenOptions::new();
        oo.read(true).write(!options.read_only);
        if options.direct {
            oo.custom_flags(libc::O_DIRECT);
        }
        let file = oo.open(path).map_err(|e| {
            if options.direct && e.raw_os_error() == Some(libc::EINVAL) {
                BlockError::new(
                    BlockErrorKind::Unsupported,
                    format!(
                        "opening {} with O_DIRECT: the filesystem does not support direct I/O",
                        path.display()
                    ),
                )
                .with_source(e)
            } else {
                BlockError::io(format!("opening {}", path.display()), e)
            }
        })?;
        take_lock(&file, path, options.lock)?;
        Self::from_open_file(file, path.to_path_buf(), options)
    }

    /// Creates (or truncates) a sparse regular file of `size` bytes at `path` and opens it.
    ///
    /// `size` is rounded down to the block size as in [`FileDevice::open`].
    pub fn create(path: impl AsRef<Path>, size: u64, options: FileOptions) -> BlockResult<Self> {
        let path = path.as_ref();
        let ctx = || format!("creating {} ({size} bytes)", path.display());
        let f = OpenOptions::new()
            .write(true)
            .create(true)
            .truncate(true)
            .open(path)
            .map_err(|e| BlockError::io(ctx(), e))?;
        f.set_len(size).map_err(|e| BlockError::io(ctx(), e))?;
        drop(f);
        Self::open(path, options)
    }

    fn from_open_file(mut file: File, path: PathBuf, options: FileOptions) -> BlockResult<Self> {
        let at = |what: &str| format!("{what} {}", path.display());
        let meta = file.metadata().map_err(|e| BlockError::io(at("stat"), e))?;
        let file_type = meta.file_type();
        let (backing, raw_size, block, physical) = if file_type.is_block_device() {
            // Seeking to the end of a block device yields its size in bytes (the same value
            // as BLKGETSIZE64). The file position is never used for I/O.
            let size =
                file.seek(SeekFrom::End(0)).map_err(|e| BlockError::io(at("seeking to the end of"), e))?;
            let logical = rustix::fs::ioctl_blksszget(&file)
                .map_err(|e| BlockError::io(at("BLKSSZGET on"), e.into()))?
                .max(512);
            let physical = rustix::fs::ioctl_blkpbszget(&file).unwrap_or(logical).max(logical);
            let block = options.block_size.unwrap_or(logical);
            check_block_size(block, &path)?;
            if block < logical {
                return Err(BlockError::new(
                    BlockErrorKind::InvalidArgument,
                    format!(
                        "block size {block} of {} is below the device's logical block size {logical}",
                        path.display()
                    ),
                ));
            }
            (BackingKind::BlockDevice, size, block, physical.max(block))
        } else if file_type.is_file() {
            let dio_align = if options.direct { dio_offset_align(&file) } else { None };
            let default = if options.direct { dio_align.unwrap_or(4096).max(512) } else { 512 };
            let block = options.block_size.unwrap_or(default);
            check_block_size(block, &path)?;
            if let Some(align) = dio_align.filter(|&a| block < a) {
                return Err(BlockError::new(
                    BlockErrorKind::InvalidArgument,
                    format!(
                        "block size {block} of {} is below its filesystem's direct-I/O alignment {align}",
                        path.display()
                    ),
                ));
            }
            // Page-sized writes avoid read-modify-write in the page cache.
            (BackingKind::RegularFile, meta.len(), block, block.max(4096))
        } else {
            return Err(BlockError::new(
                BlockErrorKind::InvalidArgument,
                format!("{} is neither a regular file nor a block device", path.display()),
            ));
        };
        let size = raw_size - raw_size % u64::from(block);
        let geometry = Geometry { size, logical_block: block, physical_block: physical };
        Ok(FileDevice {
            file,
            path,
            geometry,
            backing,
            options,
            latch: WritebackLatch::new(),
            sync_requests: AtomicU64::new(0),
            synced_upto: Mutex::new(0),
        })
    }

    /// Grows the regular file under this device to `bytes` (sparse) and makes the new size
    /// durable (`fsync`); a file already that long is left alone. This device keeps the size
    /// it was opened with: [`remeasured`](Self::remeasured) sees the new one. A block
    /// device's size is the device's: refused (`Unsupported`), as is growing a read-only
    /// device (`ReadOnly`).
    pub fn grow_file(&self, bytes: u64) -> BlockResult<()> {
        if self.backing != BackingKind::RegularFile {
            return Err(BlockError::new(
                BlockErrorKind::Unsupported,
                format!("{} is a block device: its size is the device's", self.path.display()),
            ));
        }
        if self.options.read_only {
            return Err(BlockError::new(
                BlockErrorKind::ReadOnly,
                format!("{} is open read-only", self.path.display()),
            ));
        }
        let have = self
            .file
            .metadata()
            .map_err(|e| BlockError::io(format!("stat of {}", self.path.display()), e))?
            .len();
        if bytes <= have {
            return Ok(());
        }
        self.file
            .set_len(bytes)
            .and_then(|_| self.file.sync_all())
            .map_err(|e| BlockError::io(format!("growing {} to {bytes} bytes", self.path.display()), e))
    }

    /// The same open file measured again: a device of the size the file (or block device)
    /// has now, for a volume whose storage was grown underneath it (`truncate -s`,
    /// `lvextend`) and is being resized. The new device shares the open file description
    /// (a `dup`), so the storage lock stays held as long as either device lives; its block
    /// sizes are this device's. Refused (`Io`) once a flush has failed here: the new
    /// device would not know of the lost writeback.
    pub fn remeasured(&self) -> BlockResult<FileDevice> {
        if self.writeback_failed() {
            return Err(BlockError::new(
                BlockErrorKind::Io,
                format!("{}: a flush failed earlier; not measuring it again", self.path.display()),
            ));
        }
        let file = self
            .file
            .try_clone()
            .map_err(|e| BlockError::io(format!("dup of {}", self.path.display()), e))?;
        let opts = FileOptions { block_size: Some(self.geometry.logical_block), ..self.options };
        let mut dev = Self::from_open_file(file, self.path.clone(), opts)?;
        dev.options = self.options;
        dev.geometry.physical_block = self.geometry.physical_block;
        Ok(dev)
    }

    /// The path this device was opened from.
    pub fn path(&self) -> &Path {
        &self.path
    }

    /// Whether a regular file or a block device backs this device.
    pub fn backing(&self) -> BackingKind {
        self.backing
    }

    /// The options it was opened with (`block_size` as given, not as chosen; see `geometry`).
    pub fn options(&self) -> FileOptions {
        self.options
    }

    /// Whether an `fdatasync` has failed since the device was opened (every later flush and
    /// FUA request then fails; see the module docs).
    pub fn writeback_failed(&self) -> bool {
        self.latch.is_latched()
    }

    fn op_error(&self, op: &str, off: u64, len: u64, err: io::Error) -> BlockError {
        if err.kind() == io::ErrorKind::UnexpectedEof {
            return BlockError::new(
                BlockErrorKind::Io,
                format!(
                    "short {op} of {} at {off} length {len}: the file ends before its size when opened \
                     ({} bytes); was it truncated?",
                    self.path.display(),
                    self.geometry.size
                ),
            )
            .with_source(err);
        }
        BlockError::io(format!("{op} {} at {off} length {len}", self.path.display()), err)
    }

    fn refuse_if_read_only(&self, op: &str) -> BlockResult<()> {
        if self.options.read_only {
            return Err(BlockError::new(
                BlockErrorKind::ReadOnly,
                format!("{op} {}: opened read-only", self.path.display()),
            ));
        }
        Ok(())
    }

    fn pread(&self, off: u64, buf: &mut [u8]) -> BlockResult<()> {
        injected(&self.path, FileOp::Read, off, buf.len() as u64)
            .and_then(|()| self.file.read_exact_at(buf, off))
            .map_err(|e| self.op_error("pread", off, buf.len() as u64, e))
    }

    fn pwrite(&self, off: u64, buf: &[u8]) -> BlockResult<()> {
        injected(&self.path, FileOp::Write, off, buf.len() as u64)
            .and_then(|()| self.file.write_all_at(buf, off))
            .map_err(|e| self.op_error("pwrite", off, buf.len() as u64, e))
    }

    /// `fdatasync` for a flush or a FUA request whose writes have completed, through the
    /// latch and with group commit (see the module docs).
    fn sync(&self, op: &str, off: u64, len: u64) -> BlockResult<()> {
        let mine = self.sync_requests.fetch_add(1, Ordering::SeqCst) + 1;
        let mut synced = self.synced_upto.lock().unwrap_or_else(|e| e.into_inner());
        self.latch.check(op)?;
        if *synced >= mine {
            return Ok(());
        }
        // Every request numbered up to `cover` had completed its writes before it was
        // numbered, so the fdatasync below covers them all.
        let cover = self.sync_requests.load(Ordering::SeqCst);
        let r = self
            .file
            .sync_data()
            .and_then(|()| injected(&self.path, FileOp::Sync, 0, 0))
            .map_err(|e| self.op_error(&format!("fdatasync after {op}"), off, len, e));
        self.latch.guard(r)?;
        *synced = cover;
        Ok(())
    }

    /// `fallocate`, with `Ok(false)` when the filesystem or device does not support `mode`.
    fn fallocate(&self, mode: FallocateFlags, off: u64, len: u64) -> BlockResult<bool> {
        match rustix::fs::fallocate(&self.file, mode, off, len) {
            Ok(()) => Ok(true),
            Err(Errno::OPNOTSUPP) => Ok(false),
            Err(e) => Err(self.op_error(&format!("fallocate({mode:?})"), off, len, e.into())),
        }
    }

    /// Writes zeroes with `pwrite` from an aligned buffer (valid with and without O_DIRECT).
    fn write_zero_buffers(&self, off: u64, len: u64) -> BlockResult<()> {
        let chunk = (BOUNCE_CHUNK as u64).min(len) as usize;
        let zeroes = AlignedBuf::for_direct_io(chunk);
        let mut pos = off;
        while pos < off + len {
            let n = (chunk as u64).min(off + len - pos) as usize;
            self.pwrite(pos, &zeroes.as_slice()[..n])?;
            pos += n as u64;
        }
        Ok(())
    }

    fn needs_bounce(&self, buf: &[u8]) -> bool {
        self.options.direct && !is_aligned(buf, DIRECT_IO_ALIGN)
    }
}

/// The error a test hook injects for this system call (feature `test-utils`).
#[cfg(feature = "test-utils")]
use crate::fault_hook::{injected, FileOp};

#[cfg(not(feature = "test-utils"))]
#[derive(Clone, Copy)]
enum FileOp {
    Read,
    Write,
    Sync,
}

/// Without `test-utils` nothing is injected (and this compiles to nothing).
#[cfg(not(feature = "test-utils"))]
#[inline(always)]
fn injected(_: &Path, _: FileOp, _: u64, _: u64) -> io::Result<()> {
    Ok(())
}

/// Takes `lock` on `file` (the file `path`) without waiting.
fn take_lock(file: &File, path: &Path, lock: FileLock) -> BlockResult<()> {
    use rustix::fs::FlockOperation;
    let op = match lock {
        FileLock::None => return Ok(()),
        FileLock::Shared => FlockOperation::NonBlockingLockShared,
        FileLock::Exclusive => FlockOperation::NonBlockingLockExclusive,
    };
    loop {
        match rustix::fs::flock(file, op) {
            Ok(()) => return Ok(()),
            Err(Errno::INTR) => continue,
            Err(Errno::WOULDBLOCK) => {
                return Err(BlockError::new(
                    BlockErrorKind::Busy,
                    format!(
                        "device {} is in use: another process holds {} lock on it",
                        path.display(),
                        if lock == FileLock::Shared { "an exclusive" } else { "a" }
                    ),
                ))
            }
            Err(e) => return Err(BlockError::io(format!("locking {}", path.display()), e.into())),
        }
    }
}

/// The filesystem's O_DIRECT offset alignment, where the kernel reports it (Linux 6.1+).
fn dio_offset_align(file: &File) -> Option<u32> {
    let st = rustix::fs::statx(file, "", AtFlags::EMPTY_PATH, StatxFlags::DIOALIGN).ok()?;
    let reported = StatxFlags::from_bits_retain(st.stx_mask).contains(StatxFlags::DIOALIGN);
    (reported && st.stx_dio_offset_align != 0).then_some(st.stx_dio_offset_align)
}

fn check_block_size(block: u32, path: &Path) -> BlockResult<()> {
    if !block.is_power_of_two() || !(512..=4096).contains(&block) {
        return Err(BlockError::new(
            BlockErrorKind::InvalidArgument,
            format!("block size {block} for {} is not a power of two in 512..=4096", path.display()),
        ));
    }
    Ok(())
}

impl BlockDevice for FileDevice {
    fn geometry(&self) -> Geometry {
        self.geometry
    }

    fn caps(&self) -> Caps {
        if self.options.read_only {
            Caps::READ_ONLY
        } else {
            // No FUA: it is emulated with fdatasync after the write.
            Caps::FLUSH | Caps::DISCARD | Caps::WRITE_ZEROES
        }
    }

    fn read_at(&self, off: u64, buf: &mut [u8]) -> BlockResult<()> {
        self.geometry.check_range(off, buf.len() as u64)?;
        if buf.is_empty() {
            return Ok(());
        }
        if !self.needs_bounce(buf) {
            return self.pread(off, buf);
        }
        with_bounce(|bounce| {
            let mut pos = off;
            for piece in buf.chunks_mut(BOUNCE_CHUNK) {
                let aligned = &mut bounce.as_mut_slice()[..piece.len()];
                self.pread(pos, aligned)?;
                piece.copy_from_slice(aligned);
                pos += piece.len() as u64;
            }
            Ok(())
        })
    }

    fn write_at(&self, off: u64, buf: &[u8], flags: WriteFlags) -> BlockResult<()> {
        self.geometry.check_range(off, buf.len() as u64)?;
        if buf.is_empty() {
            return Ok(());
        }
        self.refuse_if_read_only("writing")?;
        if flags.contains(WriteFlags::FUA) {
            self.latch.check("FUA write")?;
        }
        if self.needs_bounce(buf) {
            with_bounce(|bounce| {
                let mut pos = off;
                for piece in buf.chunks(BOUNCE_CHUNK) {
                    let aligned = &mut bounce.as_mut_slice()[..piece.len()];
                    aligned.copy_from_slice(piece);
                    self.pwrite(pos, aligned)?;
                    pos += piece.len() as u64;
                }
                Ok(())
            })?;
        } else {
            self.pwrite(off, buf)?;
        }
        if flags.contains(WriteFlags::FUA) {
            self.sync("FUA write", off, buf.len() as u64)?;
        }
        Ok(())
    }

    fn flush(&self) -> BlockResult<()> {
        if self.options.read_only {
            return Ok(());
        }
        self.sync("flush", 0, self.geometry.size)
    }

    fn discard(&self, off: u64, len: u64) -> BlockResult<()> {
        self.geometry.check_range(off, len)?;
        if len == 0 {
            return Ok(());
        }
        self.refuse_if_read_only("discarding")?;
        // Unsupported: a discard that keeps the old data is still a valid discard.
        self.fallocate(FallocateFlags::PUNCH_HOLE | FallocateFlags::KEEP_SIZE, off, len)?;
        Ok(())
    }

    fn write_zeroes(&self, off: u64, len: u64, flags: ZeroFlags) -> BlockResult<()> {
        self.geometry.check_range(off, len)?;
        if len == 0 {
            return Ok(());
        }
        self.refuse_if_read_only("writing zeroes to")?;
        if flags.contains(ZeroFlags::FUA) {
            self.latch.check("FUA write-zeroes")?;
        }
        let keep = FallocateFlags::KEEP_SIZE;
        let mut done = false;
        if flags.contains(ZeroFlags::MAY_UNMAP) {
            done = self.fallocate(FallocateFlags::PUNCH_HOLE | keep, off, len)?;
        }
        if !done {
            done = self.fallocate(FallocateFlags::ZERO_RANGE | keep, off, len)?;
        }
        if !done {
            self.write_zero_buffers(off, len)?;
        }
        if flags.contains(ZeroFlags::FUA) {
            self.sync("FUA write-zeroes", off, len)?;
        }
        Ok(())
    }

    /// A regular file's holes (`lseek` `SEEK_DATA`/`SEEK_HOLE`) are `HOLE | ZERO`: they read
    /// as zeroes and take space once written. A block device, or a filesystem without hole
    /// reporting (`EINVAL`/`EOPNOTSUPP`), is all data. `lseek` moves the descriptor's file
    /// position, which no I/O here uses.
    fn allocation(&self, off: u64, len: u64, max_extents: usize) -> BlockResult<Vec<Extent>> {
        self.geometry.check_range(off, len)?;
        let all_data =
            || Ok(if len == 0 { Vec::new() } else { vec![Extent { len, flags: ExtentFlags::empty() }] });
        if len == 0 || self.backing == BackingKind::BlockDevice {
            return all_data();
        }
        let seek = |whence: rustix::fs::SeekFrom| match rustix::fs::seek(&self.file, whence) {
            Ok(at) => Ok(Some(at)),
            Err(Errno::NXIO) => Ok(None),
            Err(e) => Err(io::Error::from(e)),
        };
        let walked = crate::extents::walk(
            off,
            len,
            u64::from(self.geometry.logical_block),
            max_extents,
            |pos| seek(rustix::fs::SeekFrom::Data(pos)),
            // Past the end of the file (it shrank) there is no hole to find: stop there.
            |pos| seek(rustix::fs::SeekFrom::Hole(pos)).map(|h| h.unwrap_or(off + len)),
        );
        match walked {
            Ok(list) => Ok(list),
            Err(e) if matches!(e.raw_os_error(), Some(libc::EINVAL | libc::EOPNOTSUPP)) => all_data(),
            Err(e) => Err(self.op_error("lseek(SEEK_DATA/SEEK_HOLE)", off, len, e)),
        }
    }
}
