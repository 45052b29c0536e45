//! Byte-addressed file I/O over a block-addressed device: what the FUSE handlers call.
//!
//! A FUSE client asks for any byte range; a [`BlockDevice`] takes whole logical blocks.
//!
//! ```text
//!   request:          [----------- bytes -----------)
//!   blocks:     |  head  |      |      |      |  tail  |
//!               ^ a_start                              ^ a_end   (the covering blocks)
//! ```
//!
//! * A read reads the covering blocks and returns the requested bytes.
//! * A write that does not cover whole blocks reads the partial head and tail blocks,
//!   merges the new bytes and writes the covering blocks back (read-modify-write).
//! * Every write-like request (write, zero, discard) holds its covering blocks exclusively
//!   in a [`RangeLock`] for the whole read-modify-write, so two unaligned writes into the
//!   same block never lose one another's bytes, and an aligned write cannot land between
//!   the read and the write-back of an overlapping one. Requests to disjoint blocks never
//!   wait for each other; reads take no lock (a read overlapping a write in flight sees
//!   unspecified content, as the device contract and real disks say).

use std::sync::Arc;

use blockdev::{BlockDevice, BlockError, BlockErrorKind, Caps, RangeLock, WriteFlags, ZeroFlags};

/// An errno to answer a FUSE request with.
pub type Errno = i32;

/// Pieces of at most this many bytes for discard and write-zeroes, so one huge
/// `fallocate` holds its range lock (and the device) in bounded steps.
const PIECE: u64 = 64 << 20;

/// The errno a failed device call is answered with.
///
/// An integrity or authentication failure is `EIO`: what a reader of a dm-integrity or
/// dm-crypt AEAD device gets through the page cache, and what tools treat as a media error
/// (`EILSEQ`, the bio status, is unknown to most of them). Only the request that met it fails.
pub fn errno_of(e: &BlockError) -> Errno {
    match e.kind() {
        BlockErrorKind::IntegrityMismatch { .. } => libc::EIO,
        BlockErrorKind::ReadOnly => libc::EROFS,
        kind => kind.errno(),
    }
}

/// The volume as a byte-addressed file of the device's size (which a running volume's
/// `resize` may change: it is read from the device at each request).
#[derive(Debug)]
pub struct VolumeIo {
    dev: Arc<dyn BlockDevice>,
    block: u64,
    caps: Caps,
    locks: RangeLock,
}

impl VolumeIo {
    /// Byte-level access to `dev`.
    pub fn new(dev: Arc<dyn BlockDevice>) -> Self {
        let g = dev.geometry();
        let caps = dev.caps();
        VolumeIo { dev, block: u64::from(g.logical_block.max(1)), caps, locks: RangeLock::new() }
    }

    /// The file size: the volume's size.
    pub fn size(&self) -> u64 {
        self.dev.geometry().size
    }

    /// The logical block size.
    pub fn block(&self) -> u64 {
        self.block
    }

    /// The device's capabilities.
    pub fn caps(&self) -> Caps {
        self.caps
    }

    fn down(&self, x: u64) -> u64 {
        x / self.block * self.block
    }

    fn up(&self, x: u64) -> u64 {
        // `x <= size`, a multiple of the block, so this cannot overflow past the size.
        x.div_ceil(self.block) * self.block
    }

    fn fail(&self, what: &str, off: u64, len: u64, e: &BlockError) -> Errno {
        let errno = errno_of(e);
        match e.kind() {
            BlockErrorKind::IntegrityMismatch { .. } => {
                log::warn!("{what} at {off} length {len}: {e}; answered EIO")
            }
            _ => log::debug!("{what} at {off} length {len}: {e} (errno {errno})"),
        }
        errno
    }

    /// Reads up to `len` bytes at `off`; fewer at the end of the file, none past it.
    pub fn read(&self, off: u64, len: u32) -> Result<Vec<u8>, Errno> {
        let size = self.size();
        if off >= size || len == 0 {
            return Ok(Vec::new());
        }
        let end = off.saturating_add(u64::from(len)).min(size);
        let (a_start, a_end) = (self.down(off), self.up(end));
        let mut buf = vec![0u8; (a_end - a_start) as usize];
        self.dev.read_at(a_start, &mut buf).map_err(|e| self.fail("read", off, end - off, &e))?;
        if a_start == off && a_end == end {
            return Ok(buf);
        }
        Ok(buf[(off - a_start) as usize..(end - a_start) as usize].to_vec())
    }

    /// Writes `data` at `off` and returns how many bytes were written: all of them, or the
    /// part before the end of the file. `ENOSPC` when `off` is at or past the end (a block
    /// device's answer: the file cannot grow).
    pub fn write(&self, off: u64, data: &[u8]) -> Result<u32, Errno> {
        if data.is_empty() {
            return Ok(0);
        }
        let size = self.size();
        if off >= size {
            return Err(libc::ENOSPC);
        }
        let end = off.saturating_add(data.len() as u64).min(size);
        let data = &data[..(end - off) as usize];
        let (a_start, a_end) = (self.down(off), self.up(end));
        let _held = self.locks.write(a_start, a_end - a_start);
        if a_start == off && a_end == end {
            self.dev
                .write_at(off, data, WriteFlags::empty())
                .map_err(|e| self.fail("write", off, end - off, &e))?;
        } else {
            let mut buf = self.merge_edges(off, end)?;
            buf[(off - a_start) as usize..(end - a_start) as usize].copy_from_slice(data);
            self.dev
                .write_at_scratch(a_start, &mut buf, WriteFlags::empty())
                .map_err(|e| self.fail("write", off, end - off, &e))?;
        }
        Ok(data.len() as u32)
    }

    /// A buffer over the blocks covering `[off, end)` whose partial head and tail blocks hold
    /// the device's current content (the middle is left for the caller to fill). The caller
    /// holds the covering range's lock.
    fn merge_edges(&self, off: u64, end: u64) -> Result<Vec<u8>, Errno> {
        let (a_start, a_end) = (self.down(off), self.up(end));
        let mut buf = vec![0u8; (a_end - a_start) as usize];
        let b = self.block as usize;
        let head_partial = off != a_start;
        let tail_partial = end != a_end;
        if head_partial {
            self.dev
                .read_at(a_start, &mut buf[..b])
                .map_err(|e| self.fail("read-modify-write", off, end - off, &e))?;
        }
        let tail_start = a_end - self.block;
        if tail_partial && !(head_partial && tail_start == a_start) {
            let at = (tail_start - a_start) as usize;
            self.dev
                .read_at(tail_start, &mut buf[at..at + b])
                .map_err(|e| self.fail("read-modify-write", off, end - off, &e))?;
        }
        Ok(buf)
    }

    /// Makes durable every write that completed before (fsync, and close through FUSE flush).
    pub fn flush(&self) -> Result<(), Errno> {
        self.dev.flush().map_err(|e| self.fail("flush", 0, 0, &e))
    }

    /// Zeroes `[off, off+len)` (clamped to the file): partial blocks by read-modify-write,
    /// whole blocks with the device's `write_zeroes`, or its `discard` when `discard` is set.
    pub fn zero(&self, off: u64, len: u64, how: Zeroing) -> Result<(), Errno> {
        let size = self.size();
        if off >= size || len == 0 {
            return Ok(());
        }
        let end = off.saturating_add(len).min(size);
        let (in_start, in_end) = (self.up(off), self.down(end));
        if in_start >= in_end {
            // Inside one block, or two adjacent partial blocks: no whole block to zero.
            return self.zero_partial(off, end);
        }
        if off < in_start {
            self.zero_partial(off, in_start)?;
        }
        let mut pos = in_start;
        while pos < in_end {
            let n = PIECE.min(in_end - pos);
            let _held = self.locks.write(pos, n);
            let r = match how {
                Zeroing::Discard => self.dev.discard(pos, n),
                Zeroing::Zeroes { may_unmap } => {
                    let flags = if may_unmap { ZeroFlags::MAY_UNMAP } else { ZeroFlags::empty() };
                    self.dev.write_zeroes(pos, n, flags)
                }
            };
            r.map_err(|e| self.fail(how.name(), pos, n, &e))?;
            pos += n;
        }
        if in_end < end {
            self.zero_partial(in_end, end)?;
        }
        Ok(())
    }

    /// Writes zeroes over `[off, end)` by read-modify-write of the covering blocks.
    fn zero_partial(&self, off: u64, end: u64) -> Result<(), Errno> {
        let (a_start, a_end) = (self.down(off), self.up(end));
        let _held = self.locks.write(a_start, a_end - a_start);
        let mut buf = self.merge_edges(off, end)?;
        buf[(off - a_start) as usize..(end - a_start) as usize].fill(0);
        self.dev
            .write_at_scratch(a_start, &mut buf, WriteFlags::empty())
            .map_err(|e| self.fail("zero", off, end - off, &e))
    }
}

/// How [`VolumeIo::zero`] clears whole blocks.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Zeroing {
    /// The device's `discard` (the range reads back as the device's discard leaves it).
    Discard,
    /// The device's `write_zeroes`; `may_unmap` lets it deallocate.
    Zeroes {
        /// `ZeroFlags::MAY_UNMAP`.
        may_unmap: bool,
    },
}

impl Zeroing {
    fn name(self) -> &'static str {
        match self {
            Zeroing::Discard => "discard",
            Zeroing::Zeroes { .. } => "write-zeroes",
        }
    }
}

#[cfg(test)]
mod tests {
    use std::sync::atomic::{AtomicU64, Ordering};

    use blockdev::{BlockResult, Checked, Geometry, MemDevice};

    use super::*;

    fn mem(size: u64, block: u32) -> Arc<dyn BlockDevice> {
        Arc::new(Checked::new(MemDevice::new(size, block)))
    }

    fn pattern(n: usize, seed: u8) -> Vec<u8> {
        (0..n).map(|i| (i as u8).wrapping_mul(31).wrapping_add(seed)).collect()
    }

    #[test]
    fn unaligned_write_keeps_neighbours_when_block_is_partial() {
        let io = VolumeIo::new(mem(1 << 16, 4096));
        let base = pattern(1 << 16, 7);
        assert_eq!(io.write(0, &base).unwrap(), 1 << 16);
        let mut model = base.clone();
        for (off, len) in [(1usize, 10usize), (4090, 12), (8191, 1), (100, 9000), (0, 4097), (65535, 1)] {
            let d = pattern(len, off as u8);
            assert_eq!(io.write(off as u64, &d).unwrap() as usize, len);
            model[off..off + len].copy_from_slice(&d);
            assert_eq!(io.read(0, 1 << 16).unwrap(), model, "after write at {off}+{len}");
        }
        assert_eq!(io.read(4093, 7).unwrap(), model[4093..4100]);
    }

    #[test]
    fn io_at_end_is_short_when_it_crosses_the_end() {
        let io = VolumeIo::new(mem(8192, 512));
        assert_eq!(io.write(8000, &[1u8; 500]).unwrap(), 192);
        assert_eq!(io.write(8192, &[1u8; 5]), Err(libc::ENOSPC));
        assert_eq!(io.read(8000, 500).unwrap(), vec![1u8; 192]);
        assert!(io.read(8192, 10).unwrap().is_empty());
        assert!(io.read(u64::MAX - 1, 10).unwrap().is_empty());
        assert_eq!(io.write(u64::MAX - 1, &[1]), Err(libc::ENOSPC));
    }

    #[test]
    fn zero_range_clears_exactly_the_range_when_unaligned() {
        for how in [Zeroing::Discard, Zeroing::Zeroes { may_unmap: false }] {
            let io = VolumeIo::new(mem(1 << 16, 512));
            let base = pattern(1 << 16, 3);
            io.write(0, &base).unwrap();
            let mut model = base.clone();
            for (off, len) in [(10u64, 20u64), (500, 600), (1000, 5000), (2048, 1024), (65000, 10_000)] {
                io.zero(off, len, how).unwrap();
                let end = (off + len).min(1 << 16) as usize;
                model[off as usize..end].fill(0);
                assert_eq!(io.read(0, 1 << 16).unwrap(), model, "{how:?} {off}+{len}");
            }
        }
    }

    /// Counts the device calls that reach the device, to see that whole blocks go to
    /// discard and partial ones do not.
    #[derive(Debug)]
    struct Counting {
        inner: MemDevice,
        discarded: AtomicU64,
    }

    impl BlockDevice for Counting {
        fn geometry(&self) -> Geometry {
            self.inner.geometry()
        }
        fn caps(&self) -> Caps {
            Caps::DISCARD
        }
        fn read_at(&self, off: u64, buf: &mut [u8]) -> BlockResult<()> {
            self.inner.read_at(off, buf)
        }
        fn write_at(&self, off: u64, buf: &[u8], flags: WriteFlags) -> BlockResult<()> {
            self.inner.write_at(off, buf, flags)
        }
        fn flush(&self) -> BlockResult<()> {
            Ok(())
        }
        fn discard(&self, off: u64, len: u64) -> BlockResult<()> {
            self.discarded.fetch_add(len, Ordering::SeqCst);
            self.inner.discard(off, len)
        }
    }

    #[test]
    fn discard_gets_only_whole_blocks_when_range_is_unaligned() {
        let dev = Arc::new(Counting { inner: MemDevice::new(1 << 20, 4096), discarded: AtomicU64::new(0) });
        let io = VolumeIo::new(dev.clone());
        io.zero(100, 3 * 4096, Zeroing::Discard).unwrap();
        assert_eq!(dev.discarded.load(Ordering::SeqCst), 2 * 4096);
    }

    #[test]
    fn integrity_error_is_eio_for_that_request_only() {
        #[derive(Debug)]
        struct BadBlock(MemDevice);
        impl BlockDevice for BadBlock {
            fn geometry(&self) -> Geometry {
                self.0.geometry()
            }
            fn read_at(&self, off: u64, buf: &mut [u8]) -> BlockResult<()> {
                if off <= 4096 && off + buf.len() as u64 > 4096 {
                    return Err(BlockError::integrity(8));
                }
                self.0.read_at(off, buf)
            }
            fn write_at(&self, off: u64, buf: &[u8], flags: WriteFlags) -> BlockResult<()> {
                self.0.write_at(off, buf, flags)
            }
            fn flush(&self) -> BlockResult<()> {
                Ok(())
            }
        }
        let io = VolumeIo::new(Arc::new(BadBlock(MemDevice::new(16384, 512))));
        assert_eq!(io.read(4000, 200), Err(libc::EIO));
        assert_eq!(io.read(0, 4096).unwrap().len(), 4096);
        assert_eq!(io.read(4608, 100).unwrap().len(), 100);
        // A partial write into the bad block needs its old content: it fails too.
        assert_eq!(io.write(4100, &[1]), Err(libc::EIO));
        assert_eq!(io.write(4096, &[1u8; 512]), Ok(512));
    }

    /// Reads take a little while, so a read-modify-write that is not ordered against
    /// another one on the same block would lose its bytes.
    #[derive(Debug)]
    struct SlowReads(MemDevice);

    impl BlockDevice for SlowReads {
        fn geometry(&self) -> Geometry {
            self.0.geometry()
        }
        fn read_at(&self, off: u64, buf: &mut [u8]) -> BlockResult<()> {
            self.0.read_at(off, buf)?;
            std::thread::sleep(std::time::Duration::from_micros(200));
            Ok(())
        }
        fn write_at(&self, off: u64, buf: &[u8], flags: WriteFlags) -> BlockResult<()> {
            self.0.write_at(off, buf, flags)
        }
        fn flush(&self) -> BlockResult<()> {
            Ok(())
        }
    }

    #[test]
    fn concurrent_unaligned_writes_into_one_block_lose_nothing() {
        const BLOCKS: u64 = 40;
        let io = Arc::new(VolumeIo::new(Arc::new(SlowReads(MemDevice::new(BLOCKS * 4096, 4096)))));
        let threads: Vec<_> = (0..8u8)
            .map(|t| {
                let io = io.clone();
                std::thread::spawn(move || {
                    // Thread t owns bytes [t*512, t*512+512) of every block; all threads
                    // go through the blocks in the same order, so they meet in each one.
                    for block in 0..BLOCKS {
                        io.write(block * 4096 + u64::from(t) * 512, &[t + 1; 512]).unwrap();
                    }
                })
            })
            .collect();
        for t in threads {
            t.join().unwrap();
        }
        let all = io.read(0, (BLOCKS * 4096) as u32).unwrap();
        for (i, piece) in all.chunks(512).enumerate() {
            assert!(piece.iter().all(|&b| b == (i % 8) as u8 + 1), "piece {i} lost its write");
        }
    }
}
