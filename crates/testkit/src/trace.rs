//! A pass-through device that records every call, for layer-order tests.
//!
//! Put one between each pair of layers, all sharing one [`TraceLog`], then assert on the
//! interleaving (nbdkit `tests/test-layers.c`):
//!
//! ```text
//!   TraceDevice "top"  ─► CryptTarget ─► TraceDevice "bottom" ─► MemDevice
//!
//!   log: top    Write { off: 0, len: 4096, .. }     (recorded when the call starts)
//!        bottom Write { off: 0, len: 4096, .. }     (the layer's own call, nested inside)
//! ```
//!
//! Entries are recorded when a call *starts*, so an outer call precedes the calls it makes
//! below; its result is filled in when it returns. `geometry()` and `caps()` are not recorded.

use std::sync::{Arc, Mutex};

use blockdev::{BlockDevice, BlockErrorKind, BlockResult, Caps, Geometry, WriteFlags, ZeroFlags};

use crate::pattern::checksum;

/// One recorded call, with its arguments.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Call {
    /// `read_at`.
    Read {
        /// Byte offset.
        off: u64,
        /// Byte length.
        len: u64,
    },
    /// `write_at`.
    Write {
        /// Byte offset.
        off: u64,
        /// Byte length.
        len: u64,
        /// Flags.
        flags: WriteFlags,
        /// [`checksum`] of the data written (compare with the plaintext's to see that a
        /// layer transformed it).
        data: u64,
    },
    /// `flush`.
    Flush,
    /// `discard`.
    Discard {
        /// Byte offset.
        off: u64,
        /// Byte length.
        len: u64,
    },
    /// `write_zeroes`.
    WriteZeroes {
        /// Byte offset.
        off: u64,
        /// Byte length.
        len: u64,
        /// Flags.
        flags: ZeroFlags,
    },
}

/// A recorded call: where, what, and how it ended.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct TraceEntry {
    /// Order of the call's start across the whole log.
    pub seq: u64,
    /// The label of the [`TraceDevice`] that saw it.
    pub layer: String,
    /// The call.
    pub call: Call,
    /// `None` while in flight, then `Ok(())` or the error's kind.
    pub result: Option<Result<(), BlockErrorKind>>,
}

#[derive(Debug, Default)]
struct LogInner {
    next_seq: u64,
    entries: Vec<TraceEntry>,
}

/// A log shared by any number of [`TraceDevice`]s (cheap to clone; clones share it).
#[derive(Debug, Clone, Default)]
pub struct TraceLog(Arc<Mutex<LogInner>>);

impl TraceLog {
    /// An empty log.
    pub fn new() -> Self {
        Self::default()
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, LogInner> {
        self.0.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// A copy of every entry so far, in start order.
    pub fn entries(&self) -> Vec<TraceEntry> {
        self.lock().entries.clone()
    }

    /// Takes every entry so far, leaving the log empty.
    pub fn take(&self) -> Vec<TraceEntry> {
        std::mem::take(&mut self.lock().entries)
    }

    /// Forgets every entry.
    pub fn clear(&self) {
        self.lock().entries.clear();
    }

    /// The calls seen by `layer`, in order.
    pub fn calls_of(&self, layer: &str) -> Vec<Call> {
        self.lock().entries.iter().filter(|e| e.layer == layer).map(|e| e.call.clone()).collect()
    }

    /// `(layer, call)` pairs in order: handy for `assert_eq!` against an expected script.
    pub fn script(&self) -> Vec<(String, Call)> {
        self.lock().entries.iter().map(|e| (e.layer.clone(), e.call.clone())).collect()
    }

    fn start(&self, layer: &str, call: Call) -> u64 {
        let mut inner = self.lock();
        let seq = inner.next_seq;
        inner.next_seq += 1;
        inner.entries.push(TraceEntry { seq, layer: layer.to_string(), call, result: None });
        seq
    }

    fn finish(&self, seq: u64, result: &BlockResult<()>) {
        let mut inner = self.lock();
        if let Some(e) = inner.entries.iter_mut().rev().find(|e| e.seq == seq) {
            e.result = Some(result.as_ref().map(|_| ()).map_err(|e| e.kind()));
        }
    }
}

/// Forwards every call to the device below and records it in a [`TraceLog`].
#[derive(Debug)]
pub struct TraceDevice<D> {
    inner: D,
    label: String,
    log: TraceLog,
}

impl<D: BlockDevice> TraceDevice<D> {
    /// Records `inner`'s calls under `label` in `log` (shared with other trace devices).
    pub fn new(inner: D, label: impl Into<String>, log: &TraceLog) -> Self {
        TraceDevice { inner, label: label.into(), log: log.clone() }
    }

    /// Records into a log of its own, labelled `"trace"`.
    pub fn standalone(inner: D) -> Self {
        Self::new(inner, "trace", &TraceLog::new())
    }

    /// The log this device records into.
    pub fn log(&self) -> &TraceLog {
        &self.log
    }

    /// The device below.
    pub fn inner(&self) -> &D {
        &self.inner
    }

    fn traced(&self, call: Call, f: impl FnOnce() -> BlockResult<()>) -> BlockResult<()> {
        let seq = self.log.start(&self.label, call);
        let r = f();
        self.log.finish(seq, &r);
        r
    }
}

impl<D: BlockDevice> BlockDevice for TraceDevice<D> {
    fn geometry(&self) -> Geometry {
        self.inner.geometry()
    }

    fn caps(&self) -> Caps {
        self.inner.caps()
    }

    fn read_at(&self, off: u64, buf: &mut [u8]) -> BlockResult<()> {
        let len = buf.len() as u64;
        self.traced(Call::Read { off, len }, || self.inner.read_at(off, buf))
    }

    fn write_at(&self, off: u64, buf: &[u8], flags: WriteFlags) -> BlockResult<()> {
        let call = Call::Write { off, len: buf.len() as u64, flags, data: checksum(buf) };
        self.traced(call, || self.inner.write_at(off, buf, flags))
    }

    fn flush(&self) -> BlockResult<()> {
        self.traced(Call::Flush, || self.inner.flush())
    }

    fn discard(&self, off: u64, len: u64) -> BlockResult<()> {
        self.traced(Call::Discard { off, len }, || self.inner.discard(off, len))
    }

    fn write_zeroes(&self, off: u64, len: u64, flags: ZeroFlags) -> BlockResult<()> {
        self.traced(Call::WriteZeroes { off, len, flags }, || self.inner.write_zeroes(off, len, flags))
    }
}

#[cfg(test)]
mod tests {
    use blockdev::{MemDevice, Slice};

    use super::*;

    #[test]
    fn calls_are_recorded_in_start_order_when_layers_are_stacked() {
        let log = TraceLog::new();
        let bottom = TraceDevice::new(MemDevice::new(64 * 1024, 512), "bottom", &log);
        let slice = Slice::new(bottom, 4096, 8192).unwrap();
        let top = TraceDevice::new(slice, "top", &log);
        let data = [3u8; 1024];
        top.write_at(512, &data, WriteFlags::FUA).unwrap();
        top.flush().unwrap();
        top.read_at(0, &mut [0u8; 512]).unwrap();
        let w = Call::Write { off: 512, len: 1024, flags: WriteFlags::FUA, data: checksum(&data) };
        let w_below =
            Call::Write { off: 4096 + 512, len: 1024, flags: WriteFlags::FUA, data: checksum(&data) };
        assert_eq!(
            log.script(),
            vec![
                ("top".to_string(), w),
                ("bottom".to_string(), w_below),
                ("top".to_string(), Call::Flush),
                ("bottom".to_string(), Call::Flush),
                ("top".to_string(), Call::Read { off: 0, len: 512 }),
                ("bottom".to_string(), Call::Read { off: 4096, len: 512 }),
            ]
        );
        assert!(log.entries().iter().all(|e| e.result == Some(Ok(()))));
        assert_eq!(log.calls_of("bottom").len(), 3);
    }

    #[test]
    fn failed_call_records_its_kind_when_rejected() {
        let t = TraceDevice::standalone(MemDevice::new(4096, 512));
        assert!(t.write_at(4096, &[0u8; 512], WriteFlags::empty()).is_err());
        t.write_zeroes(0, 512, ZeroFlags::MAY_UNMAP).unwrap();
        t.discard(0, 512).unwrap();
        let entries = t.log().take();
        assert_eq!(entries[0].result, Some(Err(BlockErrorKind::OutOfRange)));
        assert_eq!(entries[1].call, Call::WriteZeroes { off: 0, len: 512, flags: ZeroFlags::MAY_UNMAP });
        assert_eq!(entries[2].call, Call::Discard { off: 0, len: 512 });
        assert!(t.log().entries().is_empty());
    }
}
