//! An in-memory device, striped into independently locked chunks so that concurrent
//! requests to different regions never contend.

use std::sync::RwLock;

use crate::{BlockDevice, BlockError, BlockResult, Caps, Geometry, WriteFlags, ZeroFlags};

const CHUNK: usize = 64 * 1024;

/// A device held in memory. Contents start as zeroes; flush is a no-op.
#[derive(Debug)]
pub struct MemDevice {
    geometry: Geometry,
    chunks: Vec<RwLock<Box<[u8]>>>,
}

impl MemDevice {
    /// A zero-filled device of `size` bytes (rounded down to `block`).
    pub fn new(size: u64, block: u32) -> Self {
        let size = size - size % u64::from(block);
        let n = (size as usize).div_ceil(CHUNK);
        let chunks = (0..n)
            .map(|i| {
                let len = CHUNK.min(size as usize - i * CHUNK);
                RwLock::new(vec![0u8; len].into_boxed_slice())
            })
            .collect();
        MemDevice { geometry: Geometry::new(size, block), chunks }
    }

    /// A device holding `data` (its length must be a multiple of `block`).
    pub fn from_vec(data: Vec<u8>, block: u32) -> Self {
        let dev = Self::new(data.len() as u64, block);
        dev.write_at(0, &data[..dev.geometry.size as usize], WriteFlags::empty())
            .expect("in-range write to a fresh MemDevice");
        dev
    }

    /// A copy of the whole contents.
    pub fn to_vec(&self) -> Vec<u8> {
        let mut v = vec![0u8; self.geometry.size as usize];
        self.read_at(0, &mut v).expect("in-range read of a MemDevice");
        v
    }

    fn for_each_chunk(&self, off: u64, len: usize, mut f: impl FnMut(usize, usize, usize, usize)) {
        // f(chunk index, offset in chunk, offset in request, length)
        let mut done = 0usize;
        while done < len {
            let pos = off as usize + done;
            let (ci, co) = (pos / CHUNK, pos % CHUNK);
            let n = (CHUNK - co).min(len - done);
            f(ci, co, done, n);
            done += n;
        }
    }
}

impl BlockDevice for MemDevice {
    fn geometry(&self) -> Geometry {
        self.geometry
    }

    fn caps(&self) -> Caps {
        Caps::FLUSH | Caps::FUA | Caps::DISCARD | Caps::WRITE_ZEROES
    }

    fn read_at(&self, off: u64, buf: &mut [u8]) -> BlockResult<()> {
        self.geometry.check_range(off, buf.len() as u64)?;
        self.for_each_chunk(off, buf.len(), |ci, co, bo, n| {
            let chunk = self.chunks[ci].read().unwrap_or_else(|e| e.into_inner());
            buf[bo..bo + n].copy_from_slice(&chunk[co..co + n]);
        });
        Ok(())
    }

    fn write_at(&self, off: u64, buf: &[u8], _flags: WriteFlags) -> BlockResult<()> {
        self.geometry.check_range(off, buf.len() as u64)?;
        self.for_each_chunk(off, buf.len(), |ci, co, bo, n| {
            let mut chunk = self.chunks[ci].write().unwrap_or_else(|e| e.into_inner());
            chunk[co..co + n].copy_from_slice(&buf[bo..bo + n]);
        });
        Ok(())
    }

    fn flush(&self) -> BlockResult<()> {
        Ok(())
    }

    fn discard(&self, off: u64, len: u64) -> BlockResult<()> {
        self.write_zeroes(off, len, ZeroFlags::MAY_UNMAP)
    }

    fn write_zeroes(&self, off: u64, len: u64, _flags: ZeroFlags) -> BlockResult<()> {
        self.geometry.check_range(off, len)?;
        let len = usize::try_from(len).map_err(|_| BlockError::out_of_range(off, len, self.geometry.size))?;
        self.for_each_chunk(off, len, |ci, co, _, n| {
            let mut chunk = self.chunks[ci].write().unwrap_or_else(|e| e.into_inner());
            chunk[co..co + n].fill(0);
        });
        Ok(())
    }
}
