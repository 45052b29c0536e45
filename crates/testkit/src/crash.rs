//! A device that models power loss: what was made durable survives, nothing else does.
//!
//! ```text
//!   write_at / write_zeroes / discard ──► live image   (blocks marked dirty)
//!   flush, FUA write ───────────────────► dirty blocks copied to the durable image
//!   the N-th flush (or sync point) ─────► power is lost: nothing is promoted any more
//!   crash() ────────────────────────────► MemDevice holding the durable image
//! ```
//!
//! Crash tests run in two passes (redb `tests/crash_consistency.rs`): pass 1 runs the
//! operation on a `CrashDevice` that never crashes and counts [`CrashDevice::flushes`]
//! (or [`CrashDevice::sync_points`]); pass 2 reruns it once per point `n` in `1..=count`
//! with [`CrashDevice::crash_at_flush`]`(n)`, reopens [`CrashDevice::crash`]'s image, and
//! asserts "old state or new state, never neither".
//!
//! After the crash point the device keeps serving (reads see everything written, as the
//! code under test expects) unless [`CrashDevice::failing_after_crash`] makes every later
//! operation fail with `Io`, which also exercises the caller's error paths.
//!
//! A real disk's volatile cache may also have written back any subset of the unflushed
//! blocks; [`CrashDevice::crash_keeping_some`] models that, block by block (never a torn
//! block).

use std::collections::BTreeMap;
use std::collections::BTreeSet;
use std::sync::Mutex;

use blockdev::{
    BlockDevice, BlockError, BlockErrorKind, BlockResult, Caps, Geometry, MemDevice, WriteFlags, ZeroFlags,
};

use crate::pattern::splitmix64;

/// Which durability event is the power loss.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum CrashPoint {
    /// The n-th `flush` (1-based).
    Flush(u64),
    /// The n-th sync point (1-based): a `flush`, or a write or write-zeroes carrying FUA.
    Sync(u64),
}

#[derive(Debug)]
struct State {
    live: Vec<u8>,
    durable: Vec<u8>,
    /// Blocks written since they were last promoted.
    dirty: BTreeSet<u64>,
    flushes: u64,
    syncs: u64,
    /// Set at the crash: the unflushed blocks and their content at that moment.
    crashed: Option<BTreeMap<u64, Vec<u8>>>,
}

/// A memory device with separate live and durable images (see the module docs).
#[derive(Debug)]
pub struct CrashDevice {
    geometry: Geometry,
    crash_at: Option<CrashPoint>,
    fail_after_crash: bool,
    state: Mutex<State>,
}

impl CrashDevice {
    /// A zero-filled device of `size` bytes (rounded down to `block`), durable as it is.
    pub fn new(size: u64, block: u32) -> Self {
        let size = size - size % u64::from(block);
        Self::from_vec(vec![0u8; size as usize], block)
    }

    /// A device holding `data` (length rounded down to `block`), durable as it is.
    pub fn from_vec(mut data: Vec<u8>, block: u32) -> Self {
        data.truncate(data.len() - data.len() % block as usize);
        let geometry = Geometry::new(data.len() as u64, block);
        let state = State {
            live: data.clone(),
            durable: data,
            dirty: BTreeSet::new(),
            flushes: 0,
            syncs: 0,
            crashed: None,
        };
        CrashDevice { geometry, crash_at: None, fail_after_crash: false, state: Mutex::new(state) }
    }

    /// Loses power at the `n`-th flush (1-based): flushes before it promote; that flush and
    /// everything after it do not (nor do FUA writes).
    pub fn crash_at_flush(mut self, n: u64) -> Self {
        assert!(n > 0, "flushes are counted from 1");
        self.crash_at = Some(CrashPoint::Flush(n));
        self
    }

    /// Loses power at the `n`-th sync point (1-based), counting flushes and FUA writes alike.
    pub fn crash_at_sync(mut self, n: u64) -> Self {
        assert!(n > 0, "sync points are counted from 1");
        self.crash_at = Some(CrashPoint::Sync(n));
        self
    }

    /// After the crash point, every operation fails with `BlockErrorKind::Io` (the crashing
    /// flush or FUA write included) instead of carrying on in the live image.
    pub fn failing_after_crash(mut self) -> Self {
        self.fail_after_crash = true;
        self
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, State> {
        self.state.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// Flushes seen so far (including any at or after the crash point).
    pub fn flushes(&self) -> u64 {
        self.lock().flushes
    }

    /// Sync points seen so far: flushes plus FUA writes and FUA write-zeroes.
    pub fn sync_points(&self) -> u64 {
        self.lock().syncs
    }

    /// Whether the crash point has been reached.
    pub fn has_crashed(&self) -> bool {
        self.lock().crashed.is_some()
    }

    /// The image a reboot would find: the durable image only.
    pub fn crash(&self) -> MemDevice {
        MemDevice::from_vec(self.durable_image(), self.geometry.logical_block)
    }

    /// The image a reboot would find if the disk's cache had also written back some of the
    /// blocks not yet flushed at the crash (or now, if it has not crashed): each such block
    /// is kept or lost by a coin flip seeded with `seed`.
    pub fn crash_keeping_some(&self, seed: u64) -> MemDevice {
        let st = self.lock();
        let bs = self.geometry.logical_block as usize;
        let mut image = st.durable.clone();
        let pending: Vec<(u64, &[u8])> = match &st.crashed {
            Some(frozen) => frozen.iter().map(|(&b, d)| (b, d.as_slice())).collect(),
            None => st.dirty.iter().map(|&b| (b, &st.live[b as usize * bs..(b as usize + 1) * bs])).collect(),
        };
        for (b, data) in pending {
            if splitmix64(seed ^ b) & 1 == 1 {
                image[b as usize * bs..(b as usize + 1) * bs].copy_from_slice(data);
            }
        }
        MemDevice::from_vec(image, self.geometry.logical_block)
    }

    /// A copy of the durable image.
    pub fn durable_image(&self) -> Vec<u8> {
        self.lock().durable.clone()
    }

    /// A copy of the live image (what reads return).
    pub fn live_image(&self) -> Vec<u8> {
        self.lock().live.clone()
    }

    fn powered_off(&self) -> BlockError {
        BlockError::new(BlockErrorKind::Io, "simulated power loss: the device is gone")
    }

    /// Counts a sync point (and a flush if `is_flush`); returns whether it may promote.
    fn sync_point(&self, st: &mut State, is_flush: bool) -> BlockResult<bool> {
        if st.crashed.is_some() {
            return if self.fail_after_crash { Err(self.powered_off()) } else { Ok(false) };
        }
        st.syncs += 1;
        if is_flush {
            st.flushes += 1;
        }
        let hit = match self.crash_at {
            Some(CrashPoint::Flush(n)) => is_flush && st.flushes == n,
            Some(CrashPoint::Sync(n)) => st.syncs == n,
            None => false,
        };
        if !hit {
            return Ok(true);
        }
        let bs = self.geometry.logical_block as usize;
        let frozen =
            st.dirty.iter().map(|&b| (b, st.live[b as usize * bs..(b as usize + 1) * bs].to_vec())).collect();
        st.crashed = Some(frozen);
        if self.fail_after_crash {
            Err(self.powered_off())
        } else {
            Ok(false)
        }
    }

    /// Writes `data` (or zeroes when `None`) to the live image at `off`, then handles FUA.
    fn modify(&self, off: u64, len: u64, data: Option<&[u8]>, fua: bool) -> BlockResult<()> {
        self.geometry.check_range(off, len)?;
        let mut st = self.lock();
        if st.crashed.is_some() && self.fail_after_crash {
            return Err(self.powered_off());
        }
        let (o, l) = (off as usize, len as usize);
        match data {
            Some(d) => st.live[o..o + l].copy_from_slice(d),
            None => st.live[o..o + l].fill(0),
        }
        let bs = u64::from(self.geometry.logical_block);
        let blocks = off / bs..(off + len) / bs;
        if st.crashed.is_none() {
            st.dirty.extend(blocks.clone());
        }
        if fua && len > 0 && self.sync_point(&mut st, false)? {
            let st = &mut *st;
            for b in blocks {
                st.dirty.remove(&b);
            }
            st.durable[o..o + l].copy_from_slice(&st.live[o..o + l]);
        }
        Ok(())
    }
}

impl BlockDevice for CrashDevice {
    fn geometry(&self) -> Geometry {
        self.geometry
    }

    fn caps(&self) -> Caps {
        Caps::FLUSH | Caps::FUA | Caps::DISCARD | Caps::WRITE_ZEROES
    }

    fn read_at(&self, off: u64, buf: &mut [u8]) -> BlockResult<()> {
        self.geometry.check_range(off, buf.len() as u64)?;
        let st = self.lock();
        if st.crashed.is_some() && self.fail_after_crash {
            return Err(self.powered_off());
        }
        buf.copy_from_slice(&st.live[off as usize..off as usize + buf.len()]);
        Ok(())
    }

    fn write_at(&self, off: u64, buf: &[u8], flags: WriteFlags) -> BlockResult<()> {
        self.modify(off, buf.len() as u64, Some(buf), flags.contains(WriteFlags::FUA))
    }

    fn flush(&self) -> BlockResult<()> {
        let mut st = self.lock();
        if self.sync_point(&mut st, true)? {
            let bs = self.geometry.logical_block as usize;
            let st = &mut *st;
            for b in std::mem::take(&mut st.dirty) {
                let r = b as usize * bs..(b as usize + 1) * bs;
                st.durable[r.clone()].copy_from_slice(&st.live[r]);
            }
        }
        Ok(())
    }

    /// Discarded blocks read as zeroes (and are durable as zeroes once flushed).
    fn discard(&self, off: u64, len: u64) -> BlockResult<()> {
        self.modify(off, len, None, false)
    }

    fn write_zeroes(&self, off: u64, len: u64, flags: ZeroFlags) -> BlockResult<()> {
        self.modify(off, len, None, flags.contains(ZeroFlags::FUA))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const BS: u64 = 512;

    fn block(dev: &dyn BlockDevice, n: u64) -> Vec<u8> {
        let mut b = vec![0u8; BS as usize];
        dev.read_at(n * BS, &mut b).unwrap();
        b
    }

    #[test]
    fn unflushed_writes_are_lost_when_crashed() {
        let d = CrashDevice::new(8 * BS, BS as u32);
        d.write_at(0, &[1u8; 512], WriteFlags::empty()).unwrap();
        assert_eq!(block(&d, 0), [1u8; 512], "live image serves reads");
        assert_eq!(block(&d.crash(), 0), [0u8; 512]);
    }

    #[test]
    fn flushed_writes_survive_when_crashed() {
        let d = CrashDevice::new(8 * BS, BS as u32);
        d.write_at(0, &[1u8; 512], WriteFlags::empty()).unwrap();
        d.flush().unwrap();
        d.write_at(BS, &[2u8; 512], WriteFlags::empty()).unwrap();
        d.write_zeroes(0, BS, ZeroFlags::empty()).unwrap();
        let img = d.crash();
        assert_eq!(block(&img, 0), [1u8; 512]);
        assert_eq!(block(&img, 1), [0u8; 512]);
        assert_eq!(d.flushes(), 1);
    }

    #[test]
    fn fua_write_survives_alone_when_crashed() {
        let d = CrashDevice::new(8 * BS, BS as u32);
        d.write_at(0, &[1u8; 512], WriteFlags::empty()).unwrap();
        d.write_at(BS, &[2u8; 512], WriteFlags::FUA).unwrap();
        let img = d.crash();
        assert_eq!(block(&img, 0), [0u8; 512], "FUA promotes only its own blocks");
        assert_eq!(block(&img, 1), [2u8; 512]);
        assert_eq!(d.sync_points(), 1);
        assert_eq!(d.flushes(), 0);
    }

    #[test]
    fn nothing_is_promoted_when_crash_flush_is_reached() {
        let d = CrashDevice::new(8 * BS, BS as u32).crash_at_flush(2);
        d.write_at(0, &[1u8; 512], WriteFlags::empty()).unwrap();
        d.flush().unwrap();
        d.write_at(0, &[2u8; 512], WriteFlags::empty()).unwrap();
        assert!(!d.has_crashed());
        d.flush().unwrap(); // the power loss
        assert!(d.has_crashed());
        d.write_at(BS, &[3u8; 512], WriteFlags::FUA).unwrap();
        d.flush().unwrap();
        assert_eq!(block(&d, 0), [2u8; 512], "the live image carries on");
        assert_eq!(block(&d, 1), [3u8; 512]);
        let img = d.crash();
        assert_eq!(block(&img, 0), [1u8; 512]);
        assert_eq!(block(&img, 1), [0u8; 512]);
        assert_eq!(d.flushes(), 2, "flushes after the crash are not counted");
    }

    #[test]
    fn sync_point_counts_fua_writes_when_crashing_at_sync() {
        let d = CrashDevice::new(8 * BS, BS as u32).crash_at_sync(2);
        d.write_at(0, &[1u8; 512], WriteFlags::FUA).unwrap();
        d.write_at(BS, &[2u8; 512], WriteFlags::FUA).unwrap(); // the power loss
        let img = d.crash();
        assert_eq!(block(&img, 0), [1u8; 512]);
        assert_eq!(block(&img, 1), [0u8; 512]);
    }

    #[test]
    fn every_op_fails_after_crash_when_failing_after_crash() {
        let d = CrashDevice::new(8 * BS, BS as u32).crash_at_flush(1).failing_after_crash();
        d.write_at(0, &[1u8; 512], WriteFlags::empty()).unwrap();
        assert_eq!(d.flush().unwrap_err().kind(), BlockErrorKind::Io);
        assert_eq!(d.write_at(0, &[1u8; 512], WriteFlags::empty()).unwrap_err().kind(), BlockErrorKind::Io);
        assert_eq!(d.read_at(0, &mut [0u8; 512]).unwrap_err().kind(), BlockErrorKind::Io);
        assert_eq!(d.flush().unwrap_err().kind(), BlockErrorKind::Io);
        assert_eq!(block(&d.crash(), 0), [0u8; 512]);
    }

    #[test]
    fn crash_keeping_some_keeps_whole_unflushed_blocks() {
        let d = CrashDevice::new(64 * BS, BS as u32).crash_at_flush(1);
        d.write_at(0, &[7u8; 64 * 512], WriteFlags::empty()).unwrap();
        d.flush().unwrap(); // crash: nothing durable, 64 blocks pending
        d.write_at(0, &[9u8; 64 * 512], WriteFlags::empty()).unwrap(); // after the crash: never kept
        let img = d.crash_keeping_some(42).to_vec();
        let kept = img.chunks(512).filter(|b| b.iter().all(|&x| x == 7)).count();
        let lost = img.chunks(512).filter(|b| b.iter().all(|&x| x == 0)).count();
        assert_eq!(kept + lost, 64, "no torn or post-crash block");
        assert!(kept > 0 && lost > 0, "kept {kept}");
        assert_eq!(d.crash_keeping_some(42).to_vec(), img, "deterministic per seed");
    }

    #[test]
    fn from_vec_is_durable_when_created() {
        let d = CrashDevice::from_vec(vec![5u8; 4 * 512 + 100], 512);
        assert_eq!(d.geometry().size, 4 * 512);
        assert_eq!(block(&d.crash(), 3), [5u8; 512]);
        assert_eq!(d.live_image(), d.durable_image());
    }
}
