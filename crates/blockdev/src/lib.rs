//! The one narrow trait every sealdisk layer implements, and the basic devices.
//!
//! ```text
//!   nbd server ──► Arc<dyn BlockDevice>
//!                     │
//!            CryptTarget<D: BlockDevice>      (crates/targets)
//!                     │
//!     Slice<D> / Checked<D> / FileDevice / MemDevice   (this crate)
//! ```
//!
//! Every method takes `&self`: a device serves many requests in flight at once, from as many
//! threads as the caller likes. Implementations do their own (fine-grained) locking; requests
//! to disjoint ranges must never wait for each other.
//!
//! The devices here:
//! * [`MemDevice`]: memory, for tests and benchmarks of the layers above.
//! * [`FileDevice`]: a regular file or a block device, `pread`/`pwrite`, optional `O_DIRECT`
//!   (through [`AlignedBuf`] bounce buffers when the caller's buffer is not aligned).
//! * [`Slice`]: an offset/length window of another device.
//! * [`Checked`]: asserts the contract on both sides of a boundary, for tests.
//! * [`WritebackLatch`]: remembers a failed write-back so no later flush claims success.
//! * [`RangeLocked`]: orders overlapping requests with a [`RangeLock`] (disjoint ones never
//!   wait), for devices that do not keep blocks whole under concurrency by themselves.
//!
//! Allocation ([`BlockDevice::allocation`]): `FileDevice` reports a regular file's holes as
//! `HOLE | ZERO`; `Slice`, `Checked` and `RangeLocked` pass the answer of the device below
//! through; every other layer keeps the default (all allocated data, contents unknown),
//! because what a hole below reads as through an encrypting or tagging layer is not zeroes.
//!
//! This crate has no `unsafe` code: the aligned buffer over-allocates instead, and the
//! system calls go through `rustix`'s safe wrappers.
#![forbid(unsafe_code)]
#![warn(missing_docs)]

pub mod aligned;
mod checked;
mod error;
mod extents;
#[cfg(feature = "test-utils")]
pub mod fault_hook;
mod file;
mod latch;
mod mem;
mod range_lock;
mod slice;
mod sysfs;

pub use aligned::AlignedBuf;
pub use checked::{CheckMode, Checked};
pub use error::{BlockError, BlockErrorKind, BlockResult};
pub use file::{BackingKind, FileDevice, FileLock, FileOptions};
pub use latch::WritebackLatch;
pub use mem::MemDevice;
pub use range_lock::{RangeGuard, RangeLock, RangeLocked};
pub use slice::Slice;
pub use sysfs::is_rotational;

use std::fmt::Debug;

bitflags::bitflags! {
    /// Optional operations a device supports natively.
    ///
    /// Capabilities narrow as layers stack: a layer advertises only what it can honour itself
    /// (a crypt layer advertises `DISCARD` only with `allow_discards`).
    #[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
    pub struct Caps: u32 {
        /// `flush` makes every completed write durable (the device has a volatile cache).
        const FLUSH = 1 << 0;
        /// `WriteFlags::FUA` is honoured natively (otherwise it is emulated with a flush).
        const FUA = 1 << 1;
        /// `discard` releases the range; afterwards it reads as zeroes or as stale data.
        const DISCARD = 1 << 2;
        /// `write_zeroes` is efficient (no zero buffer is written).
        const WRITE_ZEROES = 1 << 3;
        /// The device rejects every write (`BlockErrorKind::ReadOnly`).
        const READ_ONLY = 1 << 4;
    }
}

bitflags::bitflags! {
    /// Per-write flags.
    #[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Default)]
    pub struct WriteFlags: u32 {
        /// Force Unit Access: the write is durable when it completes.
        const FUA = 1 << 0;
    }
}

bitflags::bitflags! {
    /// Flags of `write_zeroes`.
    #[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Default)]
    pub struct ZeroFlags: u32 {
        /// Durable on completion, as `WriteFlags::FUA`.
        const FUA = 1 << 0;
        /// The device may deallocate (punch a hole) instead of writing zeroes, as long as
        /// the range reads back as zeroes.
        const MAY_UNMAP = 1 << 1;
    }
}

bitflags::bitflags! {
    /// What is known of a run of blocks ([`BlockDevice::allocation`]). The empty set is
    /// always true: "allocated data, contents unknown".
    #[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Default)]
    pub struct ExtentFlags: u32 {
        /// Not allocated in this layer's storage: a later write may have to allocate (and may
        /// then fail with `NoSpace`). Says nothing about what a read returns.
        const HOLE = 1 << 0;
        /// Reads return zeroes.
        const ZERO = 1 << 1;
    }
}

/// A run of blocks with one [`ExtentFlags`] state, as [`BlockDevice::allocation`] reports it.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct Extent {
    /// Length in bytes: nonzero, a multiple of the device's logical block size.
    pub len: u64,
    /// What is known of these blocks.
    pub flags: ExtentFlags,
}

/// Size and block sizes of a device.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct Geometry {
    /// Size in bytes; a multiple of `logical_block`.
    pub size: u64,
    /// Smallest addressable unit in bytes (512..=4096, a power of two). Every offset and
    /// length passed to a device is a multiple of it.
    pub logical_block: u32,
    /// Preferred write granularity in bytes (a multiple of `logical_block`).
    pub physical_block: u32,
}

impl Geometry {
    /// A geometry with equal logical and physical block sizes.
    pub fn new(size: u64, block: u32) -> Self {
        Geometry { size, logical_block: block, physical_block: block }
    }

    /// Checks that `[off, off+len)` lies inside the device and is block-aligned.
    pub fn check_range(&self, off: u64, len: u64) -> BlockResult<()> {
        let bs = u64::from(self.logical_block);
        if off % bs != 0 || len % bs != 0 {
            return Err(BlockError::misaligned(off, len, self.logical_block));
        }
        match off.checked_add(len) {
            Some(end) if end <= self.size => Ok(()),
            _ => Err(BlockError::out_of_range(off, len, self.size)),
        }
    }
}

/// Sector-addressed storage.
///
/// # Contract
/// * Offsets and lengths are multiples of `geometry().logical_block` and the range lies in
///   `[0, geometry().size)`; otherwise the call fails with `Misaligned` or `OutOfRange` and
///   touches nothing.
/// * A zero-length call succeeds and does nothing.
/// * Calls may come concurrently from many threads. Overlapping concurrent writes land in
///   some order, whole blocks at a time (no torn logical block). A read that overlaps a
///   write still in flight returns unspecified content for the overlapping blocks (old,
///   new, a mix, or, below an encrypting layer, neither): as NBD and real disks say, a
///   client that needs a defined result waits for the write to complete. A layer whose own
///   correctness depends on ordering (integrity tags) orders overlapping requests itself,
///   e.g. with `RangeLocked`.
/// * A write is visible to reads once it returns. It is durable after a later `flush`
///   returns, or on return when it carried `WriteFlags::FUA`.
/// * **A failed write-back is latched.** Once a `flush`, or the durability step of a FUA
///   write or write-zeroes, has failed, every later `flush` and FUA request of the device
///   fails (`Io`, or `Poisoned` from a layer that refuses writes too) until the device is
///   dropped and opened again: data acknowledged before the failure may be lost, and a later
///   success would claim otherwise (Linux reports a failed write-back to one `fsync` only;
///   see [`WritebackLatch`]). A layer that passes flushes down inherits the latch of the
///   device below; a layer that buffers (dm-integrity's journal and tag buffers) latches
///   its own write-back failures. A failed plain write fails its own request and does not
///   latch (nothing acknowledged was lost); reads are never refused by the latch.
/// * On error the call's range is in an unspecified state (old, new, or a mix per block),
///   never garbage produced by this layer; every error carries a kind.
/// * Integrity and authentication failures are `BlockErrorKind::IntegrityMismatch` and fail
///   only the request that met them.
pub trait BlockDevice: Send + Sync + Debug {
    /// Size and block sizes. Constant for the life of the device.
    fn geometry(&self) -> Geometry;

    /// Optional operations this device supports natively.
    fn caps(&self) -> Caps {
        Caps::empty()
    }

    /// Reads `buf.len()` bytes at `off`.
    fn read_at(&self, off: u64, buf: &mut [u8]) -> BlockResult<()>;

    /// Writes `buf` at `off`. With `WriteFlags::FUA` the data is durable on return.
    fn write_at(&self, off: u64, buf: &[u8], flags: WriteFlags) -> BlockResult<()>;

    /// Writes `buf` at `off` like `write_at`, but the caller gives up the buffer's contents:
    /// the device may use it as scratch space (an encrypting layer encrypts in place instead
    /// of into a copy), so it holds unspecified bytes afterwards. A transport that owns its
    /// receive buffers (the NBD server) calls this. The default forwards to `write_at`.
    fn write_at_scratch(&self, off: u64, buf: &mut [u8], flags: WriteFlags) -> BlockResult<()> {
        self.write_at(off, buf, flags)
    }

    /// Makes every write that completed before this call durable. After it has failed once,
    /// it fails on every later call until the device is reopened (see the contract above).
    fn flush(&self) -> BlockResult<()>;

    /// Releases `[off, off+len)`. Afterwards the range's content is unspecified until
    /// rewritten: zeroes or the old data for plain devices, and through an encrypting layer
    /// the decryption of whatever the device below returns (dm-crypt's `allow_discards` has
    /// the same effect). Only callable when `caps()` has `DISCARD`.
    fn discard(&self, off: u64, len: u64) -> BlockResult<()> {
        let _ = (off, len);
        Err(BlockError::unsupported("discard"))
    }

    /// Which blocks of `[off, off+len)` are holes or read as zeroes, as consecutive extents
    /// starting at `off`.
    ///
    /// * Returns at most `max_extents` extents (at least one when `len > 0`, none when
    ///   `len == 0`; a `max_extents` of 0 counts as 1). Each has a nonzero length that is a
    ///   multiple of the logical block size; their sum is at most `len`. When it is less, the
    ///   rest of the range was not examined (too many extents, or too costly): ask again
    ///   from where the answer ended.
    /// * Every flag must be **true of this layer's contents**: a layer that transforms data
    ///   (encryption, integrity tags) must not pass up its device's `ZERO` (a hole below
    ///   decrypts to garbage), and reports `HOLE` only if writing there may allocate.
    ///   "Unknown" (no flags) is always correct, which is why layers do not inherit this.
    /// * The answer describes the moment of the call; a concurrent write may change it.
    ///
    /// The default reports the whole range as one extent of allocated data.
    fn allocation(&self, off: u64, len: u64, max_extents: usize) -> BlockResult<Vec<Extent>> {
        let _ = max_extents;
        self.geometry().check_range(off, len)?;
        Ok(if len == 0 { Vec::new() } else { vec![Extent { len, flags: ExtentFlags::empty() }] })
    }

    /// Makes `[off, off+len)` read as zeroes.
    ///
    /// The default writes zero buffers through `write_at` in chunks of at most 1 MiB.
    fn write_zeroes(&self, off: u64, len: u64, flags: ZeroFlags) -> BlockResult<()> {
        self.geometry().check_range(off, len)?;
        const CHUNK: u64 = 1 << 20;
        let zeroes = vec![0u8; CHUNK.min(len) as usize];
        let wflags = if flags.contains(ZeroFlags::FUA) { WriteFlags::FUA } else { WriteFlags::empty() };
        let mut pos = off;
        while pos < off + len {
            let n = CHUNK.min(off + len - pos);
            self.write_at(pos, &zeroes[..n as usize], wflags)?;
            pos += n;
        }
        Ok(())
    }
}

macro_rules! forward_block_device {
    ($($ptr:ty),*) => {$(
        impl<D: BlockDevice + ?Sized> BlockDevice for $ptr {
            fn geometry(&self) -> Geometry { (**self).geometry() }
            fn caps(&self) -> Caps { (**self).caps() }
            fn read_at(&self, off: u64, buf: &mut [u8]) -> BlockResult<()> { (**self).read_at(off, buf) }
            fn write_at(&self, off: u64, buf: &[u8], flags: WriteFlags) -> BlockResult<()> {
                (**self).write_at(off, buf, flags)
            }
            fn write_at_scratch(&self, off: u64, buf: &mut [u8], flags: WriteFlags) -> BlockResult<()> {
                (**self).write_at_scratch(off, buf, flags)
            }
            fn flush(&self) -> BlockResult<()> { (**self).flush() }
            fn discard(&self, off: u64, len: u64) -> BlockResult<()> { (**self).discard(off, len) }
            fn write_zeroes(&self, off: u64, len: u64, flags: ZeroFlags) -> BlockResult<()> {
                (**self).write_zeroes(off, len, flags)
            }
            fn allocation(&self, off: u64, len: u64, max_extents: usize) -> BlockResult<Vec<Extent>> {
                (**self).allocation(off, len, max_extents)
            }
        }
    )*};
}
forward_block_device!(std::sync::Arc<D>, Box<D>, &D);
