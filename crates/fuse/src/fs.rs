//! The FUSE file system: a root directory holding one regular file, the volume.
//!
//! ```text
//!   DIR/      inode 1, dr-x------ (nothing can be created, renamed or removed)
//!   DIR/NAME  inode 2, -rw------- (-r-------- read-only), size = the volume, owner = server
//! ```
//!
//! Every handler runs on one of the session's request threads and answers before
//! returning, so N threads keep N requests in flight.

use std::ffi::OsStr;
use std::path::Path;
use std::sync::Arc;
use std::time::{Duration, SystemTime};

use blockdev::BlockDevice;
use fuser::{
    BsdFileFlags, Errno, FileAttr, FileHandle, FileType, Filesystem, FopenFlags, Generation, INodeNo,
    InitFlags, IoctlFlags, KernelConfig, LockOwner, OpenAccMode, OpenFlags, RenameFlags, ReplyAttr,
    ReplyCreate, ReplyData, ReplyDirectory, ReplyEmpty, ReplyEntry, ReplyIoctl, ReplyLseek, ReplyOpen,
    ReplyStatfs, ReplyWrite, ReplyXattr, Request, TimeOrNow, WriteFlags,
};

use crate::io::{VolumeIo, Zeroing};

pub(crate) const FILE: INodeNo = INodeNo(2);
/// Attributes never change behind the kernel's back (a running volume's `resize` changes
/// the size, and invalidates them with `crate::SizeNotifier`), so they may be cached for long.
const TTL: Duration = Duration::from_secs(3600);
/// The most bytes in one READ/WRITE request the kernel is asked to send (its own limit is
/// `max_pages`, 256 pages by default).
const MAX_IO: u32 = 1 << 20;

/// The FUSE handlers over a [`VolumeIo`].
#[derive(Debug)]
pub struct VolumeFs {
    io: VolumeIo,
    name: String,
    uid: u32,
    gid: u32,
    read_only: bool,
    started: SystemTime,
}

fn err(e: i32) -> Errno {
    Errno::from_i32(e)
}

impl VolumeFs {
    /// The file system for `dev` as the file `name`, owned by `uid:gid`.
    pub fn new(dev: Arc<dyn BlockDevice>, name: &str, uid: u32, gid: u32, read_only: bool) -> Self {
        VolumeFs {
            io: VolumeIo::new(dev),
            name: name.to_owned(),
            uid,
            gid,
            read_only,
            started: SystemTime::now(),
        }
    }

    fn attr(&self, ino: INodeNo) -> Option<FileAttr> {
        let (kind, perm, size, nlink) = match ino {
            INodeNo::ROOT => (FileType::Directory, 0o500, 0, 2),
            FILE => (FileType::RegularFile, if self.read_only { 0o400 } else { 0o600 }, self.io.size(), 1),
            _ => return None,
        };
        Some(FileAttr {
            ino,
            size,
            // Reported as fully allocated: every byte of the volume exists.
            blocks: size.div_ceil(512),
            atime: self.started,
            mtime: self.started,
            ctime: self.started,
            crtime: self.started,
            kind,
            perm,
            nlink,
            uid: self.uid,
            gid: self.gid,
            rdev: 0,
            blksize: self.io.block().clamp(512, 1 << 20) as u32,
            flags: 0,
        })
    }
}

impl Filesystem for VolumeFs {
    fn init(&mut self, _req: &Request, config: &mut KernelConfig) -> std::io::Result<()> {
        // Direct I/O from aio submitters (losetup --direct-io, qemu aio=native) stays
        // asynchronous; mmap of the direct-I/O file where the kernel allows it.
        for flag in [InitFlags::FUSE_ASYNC_DIO, InitFlags::FUSE_DIRECT_IO_ALLOW_MMAP] {
            if config.add_capabilities(flag).is_err() {
                log::debug!("the kernel does not offer {flag:?}");
            }
        }
        let _ = config.set_max_write(MAX_IO);
        let _ = config.set_max_background(64);
        Ok(())
    }

    fn lookup(&self, _req: &Request, parent: INodeNo, name: &OsStr, reply: ReplyEntry) {
        match (parent, self.attr(FILE)) {
            (INodeNo::ROOT, Some(a)) if name == OsStr::new(&self.name) => {
                reply.entry(&TTL, &a, Generation(0))
            }
            _ => reply.error(Errno::ENOENT),
        }
    }

    fn getattr(&self, _req: &Request, ino: INodeNo, _fh: Option<FileHandle>, reply: ReplyAttr) {
        match self.attr(ino) {
            Some(a) => reply.attr(&TTL, &a),
            None => reply.error(Errno::ENOENT),
        }
    }

    fn setattr(
        &self,
        _req: &Request,
        ino: INodeNo,
        mode: Option<u32>,
        uid: Option<u32>,
        gid: Option<u32>,
        size: Option<u64>,
        _atime: Option<TimeOrNow>,
        _mtime: Option<TimeOrNow>,
        _ctime: Option<SystemTime>,
        _fh: Option<FileHandle>,
        _crtime: Option<SystemTime>,
        _chgtime: Option<SystemTime>,
        _bkuptime: Option<SystemTime>,
        _flags: Option<BsdFileFlags>,
        reply: ReplyAttr,
    ) {
        let Some(a) = self.attr(ino) else { return reply.error(Errno::ENOENT) };
        // The size is the volume's, the owner and mode are the server's: truncation (also
        // O_TRUNC) and chmod/chown are refused. Timestamps are accepted and ignored, so
        // `touch` and tools that set them do not fail.
        let same_size = size.is_none_or(|s| s == a.size);
        let same_mode = mode.is_none_or(|m| m & 0o7777 == u32::from(a.perm));
        let same_owner = uid.is_none_or(|u| u == a.uid) && gid.is_none_or(|g| g == a.gid);
        if same_size && same_mode && same_owner {
            reply.attr(&TTL, &a)
        } else {
            reply.error(Errno::EPERM)
        }
    }

    fn open(&self, _req: &Request, ino: INodeNo, flags: OpenFlags, reply: ReplyOpen) {
        if ino != FILE {
            return reply.error(Errno::EISDIR);
        }
        if self.read_only && flags.acc_mode() != OpenAccMode::O_RDONLY {
            return reply.error(Errno::EROFS);
        }
        reply.opened(FileHandle(0), FopenFlags::FOPEN_DIRECT_IO | FopenFlags::FOPEN_PARALLEL_DIRECT_WRITES)
    }

    fn read(
        &self,
        _req: &Request,
        _ino: INodeNo,
        _fh: FileHandle,
        offset: u64,
        size: u32,
        _flags: OpenFlags,
        _lock_owner: Option<LockOwner>,
        reply: ReplyData,
    ) {
        match self.io.read(offset, size) {
            Ok(data) => reply.data(&data),
            Err(e) => reply.error(err(e)),
        }
    }

    fn write(
        &self,
        _req: &Request,
        _ino: INodeNo,
        _fh: FileHandle,
        offset: u64,
        data: &[u8],
        _write_flags: WriteFlags,
        _flags: OpenFlags,
        _lock_owner: Option<LockOwner>,
        reply: ReplyWrite,
    ) {
        if self.read_only {
            return reply.error(Errno::EROFS);
        }
        // O_SYNC/O_DSYNC writes: the kernel follows a direct write with FSYNC itself.
        match self.io.write(offset, data) {
            Ok(n) => reply.written(n),
            Err(e) => reply.error(err(e)),
        }
    }

    /// Called on every close() of a descriptor: the close makes the writes durable, which
    /// is what a user who just wrote an image and closed it expects.
    fn flush(
        &self,
        _req: &Request,
        _ino: INodeNo,
        _fh: FileHandle,
        _lock_owner: LockOwner,
        reply: ReplyEmpty,
    ) {
        if self.read_only {
            return reply.ok();
        }
        match self.io.flush() {
            Ok(()) => reply.ok(),
            Err(e) => reply.error(err(e)),
        }
    }

    fn fsync(&self, _req: &Request, _ino: INodeNo, _fh: FileHandle, _datasync: bool, reply: ReplyEmpty) {
        match self.io.flush() {
            Ok(()) => reply.ok(),
            Err(e) => reply.error(err(e)),
        }
    }

    fn fallocate(
        &self,
        _req: &Request,
        ino: INodeNo,
        _fh: FileHandle,
        offset: u64,
        length: u64,
        mode: i32,
        reply: ReplyEmpty,
    ) {
        if ino != FILE {
            return reply.error(Errno::EOPNOTSUPP);
        }
        if self.read_only {
            return reply.error(Errno::EROFS);
        }
        match fallocate(&self.io, offset, length, mode) {
            Ok(()) => reply.ok(),
            Err(e) => reply.error(err(e)),
        }
    }

    fn statfs(&self, _req: &Request, _ino: INodeNo, reply: ReplyStatfs) {
        let bsize = self.io.block() as u32;
        reply.statfs(self.io.size() / u64::from(bsize), 0, 0, 1, 0, bsize, 255, bsize)
    }

    fn readdir(&self, _req: &Request, ino: INodeNo, _fh: FileHandle, offset: u64, mut reply: ReplyDirectory) {
        if ino != INodeNo::ROOT {
            return reply.error(Errno::ENOTDIR);
        }
        let entries = [
            (INodeNo::ROOT, FileType::Directory, "."),
            (INodeNo::ROOT, FileType::Directory, ".."),
            (FILE, FileType::RegularFile, self.name.as_str()),
        ];
        for (i, (ino, kind, name)) in entries.iter().enumerate().skip(offset as usize) {
            // The offset given back is the next entry's index.
            if reply.add(*ino, i as u64 + 1, *kind, name) {
                break;
            }
        }
        reply.ok()
    }

    // The name space is fixed: nothing is created, linked, renamed or removed.
    fn mknod(&self, _: &Request, _: INodeNo, _: &OsStr, _: u32, _: u32, _: u32, reply: ReplyEntry) {
        reply.error(Errno::EPERM)
    }
    fn mkdir(&self, _: &Request, _: INodeNo, _: &OsStr, _: u32, _: u32, reply: ReplyEntry) {
        reply.error(Errno::EPERM)
    }
    fn unlink(&self, _: &Request, _: INodeNo, _: &OsStr, reply: ReplyEmpty) {
        reply.error(Errno::EPERM)
    }
    fn rmdir(&self, _: &Request, _: INodeNo, _: &OsStr, reply: ReplyEmpty) {
        reply.error(Errno::EPERM)
    }
    fn symlink(&self, _: &Request, _: INodeNo, _: &OsStr, _: &Path, reply: ReplyEntry) {
        reply.error(Errno::EPERM)
    }
    fn rename(
        &self,
        _: &Request,
        _: INodeNo,
        _: &OsStr,
        _: INodeNo,
        _: &OsStr,
        _: RenameFlags,
        reply: ReplyEmpty,
    ) {
        reply.error(Errno::EPERM)
    }
    fn link(&self, _: &Request, _: INodeNo, _: INodeNo, _: &OsStr, reply: ReplyEntry) {
        reply.error(Errno::EPERM)
    }
    fn create(&self, _: &Request, _: INodeNo, _: &OsStr, _: u32, _: u32, _: i32, reply: ReplyCreate) {
        reply.error(Errno::EPERM)
    }

    // Not offered, answered without fuser's "not implemented" warnings. ENOSYS makes the
    // kernel stop asking (xattrs, lseek) or do the work itself (locks, copy_file_range
    // through read and write).
    fn getxattr(&self, _: &Request, _: INodeNo, _: &OsStr, _: u32, reply: ReplyXattr) {
        reply.error(Errno::ENOSYS)
    }
    fn listxattr(&self, _: &Request, _: INodeNo, _: u32, reply: ReplyXattr) {
        reply.error(Errno::ENOSYS)
    }
    fn setxattr(&self, _: &Request, _: INodeNo, _: &OsStr, _: &[u8], _: i32, _: u32, reply: ReplyEmpty) {
        reply.error(Errno::ENOSYS)
    }
    fn removexattr(&self, _: &Request, _: INodeNo, _: &OsStr, reply: ReplyEmpty) {
        reply.error(Errno::ENOSYS)
    }
    fn lseek(&self, _: &Request, _: INodeNo, _: FileHandle, _: i64, _: i32, reply: ReplyLseek) {
        reply.error(Errno::ENOSYS)
    }
    /// Block-device ioctls (BLKGETSIZE64, BLKDISCARD, ...) sent by tools that probe the
    /// file: it is a regular file, so "not a tty", as any file system answers.
    fn ioctl(
        &self,
        _: &Request,
        _: INodeNo,
        _: FileHandle,
        _: IoctlFlags,
        _: u32,
        _: &[u8],
        _: u32,
        reply: ReplyIoctl,
    ) {
        reply.error(Errno::ENOTTY)
    }
}

/// `fallocate(2)` on the volume file (see the crate docs for the mapping).
fn fallocate(io: &VolumeIo, offset: u64, length: u64, mode: i32) -> Result<(), i32> {
    const KEEP_SIZE: i32 = libc::FALLOC_FL_KEEP_SIZE;
    const PUNCH_HOLE: i32 = libc::FALLOC_FL_PUNCH_HOLE;
    const ZERO_RANGE: i32 = libc::FALLOC_FL_ZERO_RANGE;
    let end = offset.checked_add(length).ok_or(libc::EFBIG)?;
    let beyond = end > io.size();
    match mode {
        // Allocation: every byte of the volume already exists; the file cannot grow.
        0 if beyond => Err(libc::EFBIG),
        0 | KEEP_SIZE => Ok(()),
        // fallocate(2) promises zeroes in a punched range; a discard through dm-crypt leaves
        // garbage, so punching is write-zeroes that may deallocate (a raw file gets a hole).
        m if m == PUNCH_HOLE | KEEP_SIZE => io.zero(offset, length, Zeroing::Zeroes { may_unmap: true }),
        ZERO_RANGE if beyond => Err(libc::EFBIG),
        m if m == ZERO_RANGE || m == ZERO_RANGE | KEEP_SIZE => {
            io.zero(offset, length, Zeroing::Zeroes { may_unmap: false })
        }
        _ => Err(libc::EOPNOTSUPP),
    }
}

#[cfg(test)]
mod tests {
    use blockdev::MemDevice;

    use super::*;

    #[test]
    fn fallocate_modes_map_when_size_is_fixed() {
        let io = VolumeIo::new(Arc::new(MemDevice::new(1 << 16, 512)));
        io.write(0, &[0xaa; 1 << 16]).unwrap();
        assert_eq!(fallocate(&io, 0, 1 << 16, 0), Ok(()));
        assert_eq!(fallocate(&io, 0, (1 << 16) + 1, 0), Err(libc::EFBIG));
        assert_eq!(fallocate(&io, 0, (1 << 16) + 1, libc::FALLOC_FL_KEEP_SIZE), Ok(()));
        assert_eq!(fallocate(&io, u64::MAX, 2, 0), Err(libc::EFBIG));
        assert_eq!(fallocate(&io, 0, 512, libc::FALLOC_FL_COLLAPSE_RANGE), Err(libc::EOPNOTSUPP));
        assert_eq!(fallocate(&io, 0, 512, libc::FALLOC_FL_PUNCH_HOLE), Err(libc::EOPNOTSUPP));
        fallocate(&io, 100, 1000, libc::FALLOC_FL_PUNCH_HOLE | libc::FALLOC_FL_KEEP_SIZE).unwrap();
        fallocate(&io, 3000, 10, libc::FALLOC_FL_ZERO_RANGE).unwrap();
        let data = io.read(0, 1 << 16).unwrap();
        for (i, &b) in data.iter().enumerate() {
            let zero = (100..1100).contains(&i) || (3000..3010).contains(&i);
            assert_eq!(b, if zero { 0 } else { 0xaa }, "byte {i}");
        }
    }
}
