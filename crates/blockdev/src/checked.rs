//! A contract-asserting wrapper: put it at a boundary between layers in tests.
//!
//! ```text
//!   caller (a layer above, a test, the NBD server)
//!      │   Checked asserts the *caller* keeps the contract:
//!      │   aligned, in range (Strict mode) — or that the device rejects it (ExpectRejection)
//!   Checked<D>
//!      │   …and that the *device* keeps it: geometry constant, valid requests not rejected as
//!      │   misaligned/out of range, invalid ones never succeed, zero-length calls succeed,
//!      │   read-only devices refuse writes
//!      ▼
//!   D: BlockDevice
//! ```
//!
//! In debug and test builds a broken contract panics with a message naming the side at
//! fault (as nbdkit asserts `backend_valid_range` in `server/backend.c`). In release builds a
//! caller's violation is answered with the contract's error and never reaches the device, and a
//! device's violation becomes an `Io` error.

use crate::{
    BlockDevice, BlockError, BlockErrorKind, BlockResult, Caps, Extent, Geometry, WriteFlags, ZeroFlags,
};

/// What [`Checked`] does with a request that breaks the contract.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum CheckMode {
    /// The caller is under test: a misaligned or out-of-range request is the caller's bug and
    /// panics (debug/test builds) before reaching the device.
    Strict,
    /// The device is under test: bad requests are forwarded on purpose, and the device must
    /// reject them with `Misaligned` or `OutOfRange` (or `Unsupported`/`ReadOnly` where those
    /// apply) instead of succeeding.
    ExpectRejection,
}

/// Wraps a device and checks both sides of the [`BlockDevice`] contract on every call.
#[derive(Debug)]
pub struct Checked<D> {
    inner: D,
    geometry: Geometry,
    mode: CheckMode,
}

/// Which operation a check is about, for messages and for the read-only rule.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Op {
    Read,
    Write,
    Discard,
    WriteZeroes,
    Allocation,
}

impl Op {
    fn name(self) -> &'static str {
        match self {
            Op::Read => "read_at",
            Op::Write => "write_at",
            Op::Discard => "discard",
            Op::WriteZeroes => "write_zeroes",
            Op::Allocation => "allocation",
        }
    }

    fn modifies(self) -> bool {
        !matches!(self, Op::Read | Op::Allocation)
    }
}

impl<D: BlockDevice> Checked<D> {
    /// A wrapper in [`CheckMode::Strict`] mode: the caller must keep the contract.
    pub fn new(inner: D) -> Self {
        Self::with_mode(inner, CheckMode::Strict)
    }

    /// A wrapper in [`CheckMode::ExpectRejection`] mode: bad requests go to the device, which
    /// must reject them.
    pub fn expecting_rejections(inner: D) -> Self {
        Self::with_mode(inner, CheckMode::ExpectRejection)
    }

    /// A wrapper in `mode`. The device's geometry is recorded now and must never change.
    pub fn with_mode(inner: D, mode: CheckMode) -> Self {
        let geometry = inner.geometry();
        Checked { inner, geometry, mode }
    }

    /// The wrapped device.
    pub fn inner(&self) -> &D {
        &self.inner
    }

    /// Gives back the wrapped device.
    pub fn into_inner(self) -> D {
        self.inner
    }

    /// The checking mode.
    pub fn mode(&self) -> CheckMode {
        self.mode
    }

    fn check_geometry(&self) -> BlockResult<()> {
        let now = self.inner.geometry();
        if now != self.geometry {
            return violation(format!(
                "device broke the contract: geometry changed from {:?} to {now:?}",
                self.geometry
            ));
        }
        Ok(())
    }

    /// Runs `call` for a request on `[off, off+len)` and checks both sides around it.
    fn checked(&self, op: Op, off: u64, len: u64, call: impl FnOnce() -> BlockResult<()>) -> BlockResult<()> {
        self.check_geometry()?;
        let valid = self.geometry.check_range(off, len);
        let caps = self.inner.caps();
        if self.mode == CheckMode::Strict {
            if let Err(e) = &valid {
                if cfg!(debug_assertions) {
                    panic!(
                        "caller broke the contract: {} at {off} length {len} on a device of {:?}: {e}",
                        op.name(),
                        self.geometry
                    );
                }
                return Err(BlockError::new(e.kind(), e.to_string()));
            }
        }
        let result = call();
        self.check_geometry()?;
        let what = || format!("{} at {off} length {len}", op.name());
        match (valid, result) {
            (Err(expected), Ok(())) => violation(format!(
                "device broke the contract: {} succeeded but should fail with {:?} ({expected})",
                what(),
                expected.kind()
            )),
            (Err(expected), Err(got)) => {
                let kind = got.kind();
                let acceptable = matches!(kind, BlockErrorKind::Misaligned | BlockErrorKind::OutOfRange)
                    || (op == Op::Discard
                        && !caps.contains(Caps::DISCARD)
                        && kind == BlockErrorKind::Unsupported)
                    || (op.modifies() && caps.contains(Caps::READ_ONLY) && kind == BlockErrorKind::ReadOnly);
                if !acceptable {
                    return violation(format!(
                        "device broke the contract: {} failed with {kind:?} ({got}) instead of {:?}",
                        what(),
                        expected.kind()
                    ));
                }
                Err(got)
            }
            (Ok(()), Ok(())) => {
                if op.modifies() && len > 0 && caps.contains(Caps::READ_ONLY) {
                    return violation(format!(
                        "device broke the contract: {} succeeded on a device advertising READ_ONLY",
                        what()
                    ));
                }
                Ok(())
            }
            (Ok(()), Err(got)) => {
                let kind = got.kind();
                if matches!(kind, BlockErrorKind::Misaligned | BlockErrorKind::OutOfRange) {
                    return violation(format!(
                        "device broke the contract: valid {} on a device of {:?} failed with {kind:?} ({got})",
                        what(),
                        self.geometry
                    ));
                }
                let excused = (op == Op::Discard && kind == BlockErrorKind::Unsupported)
                    || (op.modifies() && kind == BlockErrorKind::ReadOnly && caps.contains(Caps::READ_ONLY));
                if len == 0 && !excused {
                    return violation(format!(
                        "device broke the contract: zero-length {} failed with {kind:?} ({got})",
                        what()
                    ));
                }
                Err(got)
            }
        }
    }
}

/// A broken contract: a panic in debug/test builds, an error in release builds.
fn violation(msg: String) -> BlockResult<()> {
    if cfg!(debug_assertions) {
        panic!("{msg}");
    }
    Err(BlockError::new(BlockErrorKind::Io, msg))
}

impl<D: BlockDevice> BlockDevice for Checked<D> {
    fn geometry(&self) -> Geometry {
        // A violation here is reported by the next I/O call; geometry() itself cannot fail.
        self.geometry
    }

    fn caps(&self) -> Caps {
        self.inner.caps()
    }

    fn read_at(&self, off: u64, buf: &mut [u8]) -> BlockResult<()> {
        let len = buf.len() as u64;
        self.checked(Op::Read, off, len, || self.inner.read_at(off, buf))
    }

    fn write_at(&self, off: u64, buf: &[u8], flags: WriteFlags) -> BlockResult<()> {
        self.checked(Op::Write, off, buf.len() as u64, || self.inner.write_at(off, buf, flags))
    }

    fn flush(&self) -> BlockResult<()> {
        self.check_geometry()?;
        let r = self.inner.flush();
        if let Err(e) = &r {
            if matches!(e.kind(), BlockErrorKind::Misaligned | BlockErrorKind::OutOfRange) {
                violation(format!("device broke the contract: flush failed with {:?} ({e})", e.kind()))?;
            }
        }
        self.check_geometry()?;
        r
    }

    fn discard(&self, off: u64, len: u64) -> BlockResult<()> {
        self.checked(Op::Discard, off, len, || self.inner.discard(off, len))
    }

    fn write_zeroes(&self, off: u64, len: u64, flags: ZeroFlags) -> BlockResult<()> {
        self.checked(Op::WriteZeroes, off, len, || self.inner.write_zeroes(off, len, flags))
    }

    /// Also checks the answer: at most `max_extents` (at least one unless `len` is 0)
    /// extents of nonzero block-multiple lengths that add up to at most `len`.
    fn allocation(&self, off: u64, len: u64, max_extents: usize) -> BlockResult<Vec<Extent>> {
        let mut answer = Vec::new();
        self.checked(Op::Allocation, off, len, || {
            answer = self.inner.allocation(off, len, max_extents)?;
            Ok(())
        })?;
        let bs = u64::from(self.geometry.logical_block);
        let total = answer.iter().try_fold(0u64, |sum, e| sum.checked_add(e.len));
        let bad = if len == 0 {
            !answer.is_empty()
        } else {
            answer.is_empty()
                || answer.len() > max_extents.max(1)
                || answer.iter().any(|e| e.len == 0 || e.len % bs != 0)
                || total.is_none_or(|t| t > len)
        };
        if bad {
            violation(format!(
                "device broke the contract: allocation at {off} length {len} (at most {max_extents} extents) \
                 answered {answer:?}"
            ))?;
        }
        Ok(answer)
    }
}

#[cfg(test)]
mod tests {
    use std::sync::atomic::{AtomicU64, Ordering};

    use super::*;
    use crate::MemDevice;

    fn mem() -> MemDevice {
        MemDevice::new(16 * 1024, 512)
    }

    #[test]
    fn valid_requests_pass_through_in_strict_mode() {
        let c = Checked::new(mem());
        c.write_at(512, &[1u8; 1024], WriteFlags::FUA).unwrap();
        let mut buf = [0u8; 1024];
        c.read_at(512, &mut buf).unwrap();
        assert_eq!(buf, [1u8; 1024]);
        c.write_zeroes(0, 16 * 1024, ZeroFlags::MAY_UNMAP).unwrap();
        c.discard(0, 512).unwrap();
        c.flush().unwrap();
        c.read_at(16 * 1024, &mut []).unwrap();
        assert_eq!(c.geometry(), mem().geometry());
        assert_eq!(c.caps(), mem().caps());
    }

    #[test]
    #[should_panic(expected = "caller broke the contract: write_at at 100 length 512")]
    fn strict_mode_panics_when_caller_sends_misaligned_request() {
        let _ = Checked::new(mem()).write_at(100, &[0u8; 512], WriteFlags::empty());
    }

    #[test]
    #[should_panic(expected = "caller broke the contract: read_at at 16384 length 512")]
    fn strict_mode_panics_when_caller_reads_past_end() {
        let _ = Checked::new(mem()).read_at(16 * 1024, &mut [0u8; 512]);
    }

    #[test]
    fn expect_rejection_mode_returns_device_errors() {
        let c = Checked::expecting_rejections(mem());
        let e = c.write_at(100, &[0u8; 512], WriteFlags::empty()).unwrap_err();
        assert_eq!(e.kind(), BlockErrorKind::Misaligned);
        let e = c.discard(16 * 1024, 512).unwrap_err();
        assert_eq!(e.kind(), BlockErrorKind::OutOfRange);
        let e = c.write_zeroes(u64::MAX - 511, 512, ZeroFlags::empty()).unwrap_err();
        assert_eq!(e.kind(), BlockErrorKind::OutOfRange);
    }

    /// A device that forgets to check ranges: writes past the end are silently dropped.
    #[derive(Debug)]
    struct Sloppy(MemDevice);
    impl BlockDevice for Sloppy {
        fn geometry(&self) -> Geometry {
            self.0.geometry()
        }
        fn read_at(&self, off: u64, buf: &mut [u8]) -> BlockResult<()> {
            self.0.read_at(off, buf)
        }
        fn write_at(&self, _off: u64, _buf: &[u8], _flags: WriteFlags) -> BlockResult<()> {
            Ok(())
        }
        fn flush(&self) -> BlockResult<()> {
            Ok(())
        }
    }

    #[test]
    #[should_panic(expected = "device broke the contract: write_at at 16384 length 512 succeeded")]
    fn expect_rejection_mode_panics_when_device_accepts_out_of_range_write() {
        let _ = Checked::expecting_rejections(Sloppy(mem())).write_at(
            16 * 1024,
            &[0u8; 512],
            WriteFlags::empty(),
        );
    }

    /// A device whose size changes under its users.
    #[derive(Debug)]
    struct Shrinking(MemDevice, AtomicU64);
    impl BlockDevice for Shrinking {
        fn geometry(&self) -> Geometry {
            let calls = self.1.fetch_add(1, Ordering::Relaxed);
            Geometry { size: self.0.geometry().size - 512 * calls.min(1), ..self.0.geometry() }
        }
        fn read_at(&self, off: u64, buf: &mut [u8]) -> BlockResult<()> {
            self.0.read_at(off, buf)
        }
        fn write_at(&self, off: u64, buf: &[u8], flags: WriteFlags) -> BlockResult<()> {
            self.0.write_at(off, buf, flags)
        }
        fn flush(&self) -> BlockResult<()> {
            Ok(())
        }
    }

    #[test]
    #[should_panic(expected = "geometry changed")]
    fn any_call_panics_when_device_geometry_changes() {
        let _ = Checked::new(Shrinking(mem(), AtomicU64::new(0))).flush();
    }

    /// A device that claims READ_ONLY but accepts writes, and rejects valid reads as misaligned.
    #[derive(Debug)]
    struct Liar(MemDevice);
    impl BlockDevice for Liar {
        fn geometry(&self) -> Geometry {
            self.0.geometry()
        }
        fn caps(&self) -> Caps {
            Caps::READ_ONLY
        }
        fn read_at(&self, off: u64, buf: &mut [u8]) -> BlockResult<()> {
            Err(BlockError::misaligned(off, buf.len() as u64, 4096))
        }
        fn write_at(&self, off: u64, buf: &[u8], flags: WriteFlags) -> BlockResult<()> {
            self.0.write_at(off, buf, flags)
        }
        fn flush(&self) -> BlockResult<()> {
            Ok(())
        }
    }

    #[test]
    #[should_panic(expected = "succeeded on a device advertising READ_ONLY")]
    fn write_panics_when_read_only_device_accepts_it() {
        let _ = Checked::new(Liar(mem())).write_at(0, &[0u8; 512], WriteFlags::empty());
    }

    #[test]
    #[should_panic(expected = "valid read_at at 0 length 512 on a device of")]
    fn read_panics_when_device_rejects_valid_request_as_misaligned() {
        let _ = Checked::new(Liar(mem())).read_at(0, &mut [0u8; 512]);
    }

    #[test]
    fn discard_is_excused_when_device_lacks_discard() {
        let c = Checked::new(Sloppy(mem()));
        assert_eq!(c.discard(0, 512).unwrap_err().kind(), BlockErrorKind::Unsupported);
        assert_eq!(c.discard(0, 0).unwrap_err().kind(), BlockErrorKind::Unsupported);
    }
}
