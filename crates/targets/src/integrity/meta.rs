//! Tag metadata buffers: the userspace counterpart of the kernel's dm-bufio client.
//!
//! ```text
//!  metadata byte space (relative to `base` = (start + initial_sectors)·512 on the device)
//!  │ buffer 0 │ buffer 1 │ buffer 2 │ ...        each `buffer_sectors`·512 bytes
//!       ▲ one Slot per cached buffer: Mutex<{ data, valid, dirty range }>
//!  shards: Mutex<HashMap<index, Arc<Slot>>> × SHARDS   (lookup only, no I/O on hits)
//! ```
//!
//! * **Locking is per buffer.** Requests whose tags live in different buffers never wait
//!   for each other; the shard mutex is held only to look a slot up (and to evict).
//! * **No read-modify-write for whole buffers.** A tag write that covers a whole buffer that
//!   is not cached does not read it first (`skip_rmw`); with the knob off every uncached
//!   buffer is read before it is modified, which is what costs 10× on disks in the seed
//!   measurement. [`MetaCache::rmw_reads`] counts the reads done to modify a buffer.
//! * **Write-back.** Modified bytes are kept dirty (one byte range per buffer) until
//!   [`MetaCache::flush_dirty`] or eviction writes them, rounded out to the device's logical
//!   block. The engine calls `flush_dirty` before it flushes the device below, so tags are
//!   durable whenever the data they cover is declared durable.
use std::collections::HashMap;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex, MutexGuard};

use blockdev::{BlockDevice, BlockError, BlockResult, WriteFlags};

const SHARDS: usize = 16;

#[derive(Debug)]
struct SlotData {
    data: Vec<u8>,
    valid: bool,
    /// Dirty byte range `[lo, hi)` within the buffer.
    dirty: Option<(usize, usize)>,
}

#[derive(Debug)]
struct Slot {
    data: Mutex<SlotData>,
    last_use: AtomicU64,
}

#[derive(Debug, Default)]
struct Shard {
    map: HashMap<u64, Arc<Slot>>,
}

fn lock<T>(m: &Mutex<T>) -> MutexGuard<'_, T> {
    m.lock().unwrap_or_else(|e| e.into_inner())
}

/// Cached tag buffers over a device (see the module docs).
#[derive(Debug)]
pub(crate) struct MetaCache {
    base: u64,
    buf_bytes: usize,
    dev_size: u64,
    wblock: usize,
    skip_rmw: bool,
    cap_per_shard: usize,
    shards: Vec<Mutex<Shard>>,
    tick: AtomicU64,
    meta_reads: AtomicU64,
    rmw_reads: AtomicU64,
    buffer_writes: AtomicU64,
}

/// How a buffer is about to be used.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Access {
    /// Tags are read.
    Read,
    /// Part of the buffer is overwritten: the rest must be read first.
    Partial,
    /// Every byte is overwritten.
    Whole,
}

impl MetaCache {
    /// Buffers of `buf_bytes` from byte `base` of a device of `dev_size` bytes whose logical
    /// block is `wblock`; at most about `cache_bytes` of them are kept.
    pub(crate) fn new(
        base: u64,
        buf_bytes: usize,
        dev_size: u64,
        wblock: usize,
        skip_rmw: bool,
        cache_bytes: usize,
    ) -> Self {
        let cap = (cache_bytes / buf_bytes.max(1) / SHARDS).max(4);
        MetaCache {
            base,
            buf_bytes,
            dev_size,
            wblock: wblock.max(1),
            skip_rmw,
            cap_per_shard: cap,
            shards: (0..SHARDS).map(|_| Mutex::new(Shard::default())).collect(),
            tick: AtomicU64::new(0),
            meta_reads: AtomicU64::new(0),
            rmw_reads: AtomicU64::new(0),
            buffer_writes: AtomicU64::new(0),
        }
    }

    /// Buffers read from the device so far to check tags.
    pub(crate) fn meta_reads(&self) -> u64 {
        self.meta_reads.load(Ordering::Relaxed)
    }

    /// Buffers read from the device so far only to modify part of them (read-modify-write).
    pub(crate) fn rmw_reads(&self) -> u64 {
        self.rmw_reads.load(Ordering::Relaxed)
    }

    /// Dirty-range writes issued so far.
    pub(crate) fn buffer_writes(&self) -> u64 {
        self.buffer_writes.load(Ordering::Relaxed)
    }

    /// Reads tags `[addr, addr+out.len())` (absolute device byte addresses).
    pub(crate) fn read<D: BlockDevice>(&self, next: &D, addr: u64, out: &mut [u8]) -> BlockResult<()> {
        self.each_piece(addr, out.len(), |idx, lo, range| {
            self.with_slot(next, idx, Access::Read, |s| {
                out[range.clone()].copy_from_slice(&s.data[lo..lo + range.len()]);
            })
        })
    }

    /// Writes tags at `addr` (absolute device byte address); they stay dirty until flushed.
    pub(crate) fn write<D: BlockDevice>(&self, next: &D, addr: u64, tags: &[u8]) -> BlockResult<()> {
        self.each_piece(addr, tags.len(), |idx, lo, range| {
            let access =
                if lo == 0 && range.len() == self.buf_bytes { Access::Whole } else { Access::Partial };
            self.with_slot(next, idx, access, |s| {
                s.data[lo..lo + range.len()].copy_from_slice(&tags[range.clone()]);
                let hi = lo + range.len();
                s.dirty = Some(match s.dirty {
                    Some((a, b)) => (a.min(lo), b.max(hi)),
                    None => (lo, hi),
                });
            })
        })
    }

    /// Fills `len` tag bytes at `addr` with `byte` (the discard filler).
    pub(crate) fn fill<D: BlockDevice>(&self, next: &D, addr: u64, len: usize, byte: u8) -> BlockResult<()> {
        // Pieces of at most one buffer: a buffer-sized filler is enough.
        let filler = vec![byte; self.buf_bytes.min(len)];
        let mut done = 0;
        while done < len {
            let n = filler.len().min(len - done);
            self.write(next, addr + done as u64, &filler[..n])?;
            done += n;
        }
        Ok(())
    }

    /// Writes every dirty range to the device (not flushed below).
    pub(crate) fn flush_dirty<D: BlockDevice>(&self, next: &D) -> BlockResult<()> {
        let mut slots: Vec<(u64, Arc<Slot>)> = Vec::new();
        for shard in &self.shards {
            let sh = lock(shard);
            slots.extend(sh.map.iter().map(|(&i, s)| (i, s.clone())));
        }
        slots.sort_by_key(|(i, _)| *i);
        for (idx, slot) in slots {
            let mut s = lock(&slot.data);
            self.write_back(next, idx, &mut s)?;
        }
        Ok(())
    }

    fn buffer_offset(&self, idx: u64) -> u64 {
        self.base + idx * self.buf_bytes as u64
    }

    fn write_back<D: BlockDevice>(&self, next: &D, idx: u64, s: &mut SlotData) -> BlockResult<()> {
        let Some((lo, hi)) = s.dirty else { return Ok(()) };
        let lo = lo / self.wblock * self.wblock;
        let hi = hi.div_ceil(self.wblock) * self.wblock;
        let off = self.buffer_offset(idx) + lo as u64;
        let end = (off + (hi - lo) as u64).min(self.dev_size);
        if end > off {
            next.write_at(off, &s.data[lo..lo + (end - off) as usize], WriteFlags::empty())?;
        }
        self.buffer_writes.fetch_add(1, Ordering::Relaxed);
        s.dirty = None;
        Ok(())
    }

    /// Calls `f(buffer index, offset in buffer, range of the caller's slice)` per buffer.
    fn each_piece(
        &self,
        addr: u64,
        len: usize,
        mut f: impl FnMut(u64, usize, std::ops::Range<usize>) -> BlockResult<()>,
    ) -> BlockResult<()> {
        if addr < self.base {
            return Err(BlockError::new(
                blockdev::BlockErrorKind::InvalidArgument,
                format!("tag address {addr} is before the metadata area"),
            ));
        }
        let mut done = 0usize;
        while done < len {
            let rel = addr - self.base + done as u64;
            let idx = rel / self.buf_bytes as u64;
            let lo = (rel % self.buf_bytes as u64) as usize;
            let n = (self.buf_bytes - lo).min(len - done);
            f(idx, lo, done..done + n)?;
            done += n;
        }
        Ok(())
    }

    fn slot(&self, next: &impl BlockDevice, idx: u64) -> BlockResult<Arc<Slot>> {
        let tick = self.tick.fetch_add(1, Ordering::Relaxed);
        let mut sh = lock(&self.shards[(idx as usize) % SHARDS]);
        if let Some(s) = sh.map.get(&idx) {
            s.last_use.store(tick, Ordering::Relaxed);
            return Ok(s.clone());
        }
        if sh.map.len() >= self.cap_per_shard {
            self.evict(next, &mut sh)?;
        }
        let s = Arc::new(Slot {
            data: Mutex::new(SlotData { data: vec![0; self.buf_bytes], valid: false, dirty: None }),
            last_use: AtomicU64::new(tick),
        });
        sh.map.insert(idx, s.clone());
        Ok(s)
    }

    /// Drops about a quarter of the shard's least recently used idle buffers, writing dirty
    /// ones back first.
    fn evict(&self, next: &impl BlockDevice, sh: &mut Shard) -> BlockResult<()> {
        let mut by_age: Vec<(u64, u64)> =
            sh.map.iter().map(|(&i, s)| (s.last_use.load(Ordering::Relaxed), i)).collect();
        by_age.sort_unstable();
        let want = (by_age.len() / 4).max(1);
        let mut evicted = 0;
        for (_, idx) in by_age {
            if evicted >= want {
                break;
            }
            let Some(slot) = sh.map.get(&idx) else { continue };
            // Someone else holds it (about to use it): keep it.
            if Arc::strong_count(slot) > 1 {
                continue;
            }
            let Ok(mut s) = slot.data.try_lock() else { continue };
            self.write_back(next, idx, &mut s)?;
            drop(s);
            sh.map.remove(&idx);
            evicted += 1;
        }
        Ok(())
    }

    fn with_slot<D: BlockDevice, R>(
        &self,
        next: &D,
        idx: u64,
        access: Access,
        f: impl FnOnce(&mut SlotData) -> R,
    ) -> BlockResult<R> {
        let slot = self.slot(next, idx)?;
        let mut s = lock(&slot.data);
        if !s.valid {
            if access == Access::Whole && self.skip_rmw {
                // The caller overwrites every byte: no read (the RMW the seed measured).
            } else {
                let off = self.buffer_offset(idx);
                let end = (off + self.buf_bytes as u64).min(self.dev_size);
                if end > off {
                    let n = (end - off) as usize;
                    next.read_at(off, &mut s.data[..n])?;
                }
                let counter = if access == Access::Read { &self.meta_reads } else { &self.rmw_reads };
                counter.fetch_add(1, Ordering::Relaxed);
            }
            s.valid = true;
        }
        Ok(f(&mut s))
    }
}
