//! A whole-device lock, the analogue of a filesystem's per-inode lock, to measure what lock
//! granularity costs (seed 002: ext4's "parallel DIO reads" took the inode lock shared for
//! reads while writes kept it exclusive, and mixed random read/write got 4× slower).
//!
//! ```text
//!   lock=none    requests go straight through (disjoint ranges never wait)
//!   lock=range   blockdev::RangeLocked: only overlapping requests wait (sealdisk's design)
//!   lock=rwlock  GlobalLocked::shared_reads: reads share one lock, a write excludes everything
//!   lock=mutex   GlobalLocked::exclusive: one request at a time
//! ```

use std::sync::RwLock;

use blockdev::{BlockDevice, BlockResult, Caps, Geometry, WriteFlags, ZeroFlags};

/// Which requests exclude each other.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum GlobalMode {
    /// Reads share, writes (and flush, discard) are exclusive: an inode rwsem.
    SharedReads,
    /// Every request is exclusive: a mutex.
    Exclusive,
}

/// `inner` behind one lock for the whole device.
#[derive(Debug)]
pub struct GlobalLocked<D> {
    inner: D,
    lock: RwLock<()>,
    mode: GlobalMode,
}

impl<D: BlockDevice> GlobalLocked<D> {
    /// Reads shared, writes exclusive.
    pub fn shared_reads(inner: D) -> Self {
        GlobalLocked { inner, lock: RwLock::new(()), mode: GlobalMode::SharedReads }
    }
    /// Everything exclusive.
    pub fn exclusive(inner: D) -> Self {
        GlobalLocked { inner, lock: RwLock::new(()), mode: GlobalMode::Exclusive }
    }
    fn with_read<T>(&self, f: impl FnOnce() -> T) -> T {
        match self.mode {
            GlobalMode::SharedReads => {
                let _g = self.lock.read().unwrap_or_else(|p| p.into_inner());
                f()
            }
            GlobalMode::Exclusive => self.with_write(f),
        }
    }
    fn with_write<T>(&self, f: impl FnOnce() -> T) -> T {
        let _g = self.lock.write().unwrap_or_else(|p| p.into_inner());
        f()
    }
}

impl<D: BlockDevice> BlockDevice for GlobalLocked<D> {
    fn geometry(&self) -> Geometry {
        self.inner.geometry()
    }
    fn caps(&self) -> Caps {
        self.inner.caps()
    }
    fn read_at(&self, off: u64, buf: &mut [u8]) -> BlockResult<()> {
        self.with_read(|| self.inner.read_at(off, buf))
    }
    fn write_at(&self, off: u64, buf: &[u8], flags: WriteFlags) -> BlockResult<()> {
        self.with_write(|| self.inner.write_at(off, buf, flags))
    }
    fn flush(&self) -> BlockResult<()> {
        self.with_write(|| self.inner.flush())
    }
    fn discard(&self, off: u64, len: u64) -> BlockResult<()> {
        self.with_write(|| self.inner.discard(off, len))
    }
    fn write_zeroes(&self, off: u64, len: u64, flags: ZeroFlags) -> BlockResult<()> {
        self.with_write(|| self.inner.write_zeroes(off, len, flags))
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use blockdev::MemDevice;

    #[test]
    fn locked_devices_pass_data_through() {
        for dev in [
            GlobalLocked::shared_reads(MemDevice::new(8192, 512)),
            GlobalLocked::exclusive(MemDevice::new(8192, 512)),
        ] {
            dev.write_at(512, &[7u8; 512], WriteFlags::empty()).unwrap();
            let mut b = [0u8; 512];
            dev.read_at(512, &mut b).unwrap();
            assert_eq!(b, [7u8; 512]);
            dev.flush().unwrap();
            assert_eq!(dev.geometry().size, 8192);
        }
    }
}
