//! A device that fails chosen operations with `BlockErrorKind::Io`.
//!
//! ```text
//!   layer under test ──► FaultDevice ──► device below
//!                          │ Fault::nth(3)          the 3rd matching op fails, once
//!                          │ Fault::from_nth(3)     the 3rd and every later one fail (a dead disk)
//!                          │ Fault::range(off,len)  every op touching [off, off+len) fails
//!                          │   .only(OpKinds::WRITE | OpKinds::FLUSH)   restricts what matches
//! ```
//!
//! An operation that fails here never reaches the device below, so its range keeps the old
//! data (one of the states the contract allows after an error). Faults can be added and
//! cleared while the device is in use, through `&self`.

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Mutex;

use blockdev::{BlockDevice, BlockError, BlockErrorKind, BlockResult, Caps, Geometry, WriteFlags, ZeroFlags};

bitflags::bitflags! {
    /// Kinds of operations a [`Fault`] applies to.
    #[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
    pub struct OpKinds: u32 {
        /// `read_at`.
        const READ = 1 << 0;
        /// `write_at`.
        const WRITE = 1 << 1;
        /// `flush`.
        const FLUSH = 1 << 2;
        /// `discard`.
        const DISCARD = 1 << 3;
        /// `write_zeroes`.
        const WRITE_ZEROES = 1 << 4;
        /// Everything that changes data: writes, discards, write-zeroes.
        const MODIFY = Self::WRITE.bits() | Self::DISCARD.bits() | Self::WRITE_ZEROES.bits();
    }
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Trigger {
    Nth(u64),
    FromNth(u64),
    Range { off: u64, len: u64 },
}

/// One fault rule.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Fault {
    trigger: Trigger,
    kinds: OpKinds,
    /// Matching operations seen since the rule was added.
    seen: u64,
}

impl Fault {
    /// The `n`-th matching operation (1-based, counted from when the fault is added) fails,
    /// once.
    pub fn nth(n: u64) -> Self {
        assert!(n > 0, "operations are counted from 1");
        Fault { trigger: Trigger::Nth(n), kinds: OpKinds::all(), seen: 0 }
    }

    /// The `n`-th matching operation and every one after it fail.
    pub fn from_nth(n: u64) -> Self {
        assert!(n > 0, "operations are counted from 1");
        Fault { trigger: Trigger::FromNth(n), kinds: OpKinds::all(), seen: 0 }
    }

    /// Every matching operation whose range overlaps `[off, off+len)` fails (`flush` has no
    /// range and never matches).
    pub fn range(off: u64, len: u64) -> Self {
        Fault { trigger: Trigger::Range { off, len }, kinds: OpKinds::all(), seen: 0 }
    }

    /// Restricts the fault to operations of `kinds` (default: all).
    pub fn only(mut self, kinds: OpKinds) -> Self {
        self.kinds = kinds;
        self
    }

    /// Whether this operation fails; counts it if it matches.
    fn hits(&mut self, kind: OpKinds, range: Option<(u64, u64)>) -> bool {
        if !self.kinds.intersects(kind) {
            return false;
        }
        match self.trigger {
            Trigger::Nth(n) => {
                self.seen += 1;
                self.seen == n
            }
            Trigger::FromNth(n) => {
                self.seen += 1;
                self.seen >= n
            }
            Trigger::Range { off, len } => range.is_some_and(|(o, l)| {
                l > 0 && len > 0 && o < off.saturating_add(len) && off < o.saturating_add(l)
            }),
        }
    }
}

/// Wraps a device and fails operations chosen by [`Fault`] rules.
#[derive(Debug)]
pub struct FaultDevice<D> {
    inner: D,
    faults: Mutex<Vec<Fault>>,
    ops: AtomicU64,
    injected: AtomicU64,
}

impl<D: BlockDevice> FaultDevice<D> {
    /// A wrapper with no faults yet: everything passes through.
    pub fn new(inner: D) -> Self {
        FaultDevice {
            inner,
            faults: Mutex::new(Vec::new()),
            ops: AtomicU64::new(0),
            injected: AtomicU64::new(0),
        }
    }

    /// Adds `fault` (builder form).
    pub fn with_fault(self, fault: Fault) -> Self {
        self.inject(fault);
        self
    }

    /// Adds `fault` while the device is in use.
    pub fn inject(&self, fault: Fault) {
        self.lock().push(fault);
    }

    /// Removes every fault.
    pub fn clear(&self) {
        self.lock().clear();
    }

    /// Operations seen so far (failed or not), `flush` included.
    pub fn ops(&self) -> u64 {
        self.ops.load(Ordering::Relaxed)
    }

    /// Operations failed so far.
    pub fn injected(&self) -> u64 {
        self.injected.load(Ordering::Relaxed)
    }

    /// The device below.
    pub fn inner(&self) -> &D {
        &self.inner
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, Vec<Fault>> {
        self.faults.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// Fails the operation if any rule says so (every rule still counts it).
    fn gate(&self, kind: OpKinds, name: &str, range: Option<(u64, u64)>) -> BlockResult<()> {
        let n = self.ops.fetch_add(1, Ordering::Relaxed) + 1;
        let mut hit = false;
        for f in self.lock().iter_mut() {
            hit |= f.hits(kind, range);
        }
        if !hit {
            return Ok(());
        }
        self.injected.fetch_add(1, Ordering::Relaxed);
        let what = match range {
            Some((off, len)) => format!("{name} at {off} length {len}"),
            None => name.to_string(),
        };
        Err(BlockError::new(BlockErrorKind::Io, format!("injected fault: {what} (operation #{n})")))
    }
}

impl<D: BlockDevice> BlockDevice for FaultDevice<D> {
    fn geometry(&self) -> Geometry {
        self.inner.geometry()
    }

    fn caps(&self) -> Caps {
        self.inner.caps()
    }

    fn read_at(&self, off: u64, buf: &mut [u8]) -> BlockResult<()> {
        self.gate(OpKinds::READ, "read_at", Some((off, buf.len() as u64)))?;
        self.inner.read_at(off, buf)
    }

    fn write_at(&self, off: u64, buf: &[u8], flags: WriteFlags) -> BlockResult<()> {
        self.gate(OpKinds::WRITE, "write_at", Some((off, buf.len() as u64)))?;
        self.inner.write_at(off, buf, flags)
    }

    fn flush(&self) -> BlockResult<()> {
        self.gate(OpKinds::FLUSH, "flush", None)?;
        self.inner.flush()
    }

    fn discard(&self, off: u64, len: u64) -> BlockResult<()> {
        self.gate(OpKinds::DISCARD, "discard", Some((off, len)))?;
        self.inner.discard(off, len)
    }

    fn write_zeroes(&self, off: u64, len: u64, flags: ZeroFlags) -> BlockResult<()> {
        self.gate(OpKinds::WRITE_ZEROES, "write_zeroes", Some((off, len)))?;
        self.inner.write_zeroes(off, len, flags)
    }
}

#[cfg(test)]
mod tests {
    use blockdev::MemDevice;

    use super::*;

    fn dev() -> FaultDevice<MemDevice> {
        FaultDevice::new(MemDevice::new(64 * 1024, 512))
    }

    fn write(d: &dyn BlockDevice, off: u64) -> BlockResult<()> {
        d.write_at(off, &[1u8; 512], WriteFlags::empty())
    }

    #[test]
    fn nth_op_fails_once_when_counted() {
        let d = dev().with_fault(Fault::nth(3));
        write(&d, 0).unwrap();
        d.flush().unwrap();
        let e = write(&d, 512).unwrap_err();
        assert_eq!(e.kind(), BlockErrorKind::Io);
        assert!(e.to_string().contains("injected fault: write_at at 512 length 512 (operation #3)"), "{e}");
        write(&d, 512).unwrap();
        assert_eq!((d.ops(), d.injected()), (4, 1));
    }

    #[test]
    fn failed_write_leaves_old_data_when_injected() {
        let d = dev().with_fault(Fault::nth(1));
        assert!(write(&d, 0).is_err());
        assert_eq!(d.inner().to_vec()[..512], [0u8; 512]);
    }

    #[test]
    fn every_later_op_fails_when_from_nth() {
        let d = dev().with_fault(Fault::from_nth(2).only(OpKinds::WRITE));
        write(&d, 0).unwrap();
        d.read_at(0, &mut [0u8; 512]).unwrap();
        d.flush().unwrap();
        for _ in 0..3 {
            assert!(write(&d, 0).is_err());
        }
        d.clear();
        write(&d, 0).unwrap();
    }

    #[test]
    fn ops_touching_range_fail_when_range_faulted() {
        let d = dev();
        d.inject(Fault::range(4096, 1024).only(OpKinds::MODIFY));
        write(&d, 3584).unwrap();
        assert!(write(&d, 4096).is_err());
        assert!(d.write_at(3584, &[0u8; 1024], WriteFlags::empty()).is_err(), "overlaps the start");
        assert!(write(&d, 4608).is_err());
        write(&d, 5120).unwrap();
        assert!(d.write_zeroes(0, 8192, ZeroFlags::empty()).is_err());
        assert!(d.discard(4096, 512).is_err());
        d.read_at(4096, &mut [0u8; 512]).unwrap();
        d.write_zeroes(4096, 0, ZeroFlags::empty()).unwrap();
        d.flush().unwrap();
    }
}
