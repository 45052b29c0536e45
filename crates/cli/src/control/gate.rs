//! The served device of a running volume: the volume's stack behind a swappable slot, so
//! the control plane can change it at a request boundary (`refresh`) or hold requests while
//! the key is gone (`luksSuspend`/`luksResume`).
//!
//! The request path takes no lock: it loads the slot with `arc_swap` (a per-thread debt
//! slot, no shared cache line written) and calls the device. Only a request that finds the
//! volume suspended takes the gate's mutex, to sleep until it is resumed.

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Condvar, Mutex, PoisonError};
use std::time::Duration;

use arc_swap::ArcSwap;
use blockdev::{
    BlockDevice, BlockError, BlockErrorKind, BlockResult, Caps, Extent, Geometry, WriteFlags, ZeroFlags,
};

/// What the slot holds.
enum Slot {
    /// Requests go to this device.
    Live(Arc<dyn BlockDevice>),
    /// Suspended: requests wait.
    Held,
    /// Stopping while suspended (there is no key to serve with; everything written before
    /// the suspend was flushed by it), or stopped: requests fail.
    Closed,
}

/// The device the transports serve; see the module docs.
pub struct Gate {
    slot: ArcSwap<Slot>,
    /// Fixed when serving starts: what clients were told stays true across swaps (but the
    /// size, which `resize` changes for clients that connect afterwards).
    geometry: Geometry,
    size: AtomicU64,
    caps: Caps,
    held: Mutex<()>,
    resumed: Condvar,
}

impl std::fmt::Debug for Gate {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Gate").field("geometry", &self.geometry).field("held", &self.is_held()).finish()
    }
}

impl Gate {
    /// Serves `device`.
    pub fn new(device: Arc<dyn BlockDevice>) -> Self {
        let geometry = device.geometry();
        Gate {
            geometry,
            size: AtomicU64::new(geometry.size),
            caps: device.caps(),
            slot: ArcSwap::from_pointee(Slot::Live(device)),
            held: Mutex::new(()),
            resumed: Condvar::new(),
        }
    }

    /// Whether requests are being held.
    pub fn is_held(&self) -> bool {
        matches!(**self.slot.load(), Slot::Held | Slot::Closed)
    }

    /// Whether `device` may replace the current one: same geometry (with the current
    /// size), no capability a client was told about taken away or added.
    pub fn fits(&self, device: &dyn BlockDevice) -> bool {
        device.geometry() == self.geometry() && self.fits_resized(device)
    }

    /// Whether `device` may replace the current one with another size (`resize`).
    pub fn fits_resized(&self, device: &dyn BlockDevice) -> bool {
        let g = device.geometry();
        g.logical_block == self.geometry.logical_block
            && g.physical_block == self.geometry.physical_block
            && device.caps() == self.caps
    }

    /// Puts `device`, of another size, in place of the current one (`resize`): clients
    /// that connect from now on see its size.
    pub fn replace_resized(&self, device: Arc<dyn BlockDevice>) -> Option<Arc<dyn BlockDevice>> {
        let size = device.geometry().size;
        let old = self.replace(device);
        self.size.store(size, Ordering::Release);
        old
    }

    /// Puts `device` in place of the current one (requests already running finish on the
    /// old one) and wakes held requests. The old device, if any, is returned.
    pub fn replace(&self, device: Arc<dyn BlockDevice>) -> Option<Arc<dyn BlockDevice>> {
        let old = {
            let _g = self.held.lock().unwrap_or_else(PoisonError::into_inner);
            self.slot.swap(Arc::new(Slot::Live(device)))
        };
        self.resumed.notify_all();
        match Arc::try_unwrap(old) {
            Ok(Slot::Live(d)) => Some(d),
            Ok(Slot::Held | Slot::Closed) => None,
            // Someone still looks at the old slot: it holds its own reference.
            Err(slot) => match &*slot {
                Slot::Live(d) => Some(d.clone()),
                Slot::Held | Slot::Closed => None,
            },
        }
    }

    /// Holds new requests and waits until every request running on the current device has
    /// finished; returns that device (now idle, and only referenced by the caller), or
    /// `None` if the gate was already holding.
    pub fn hold(&self) -> Option<Arc<dyn BlockDevice>> {
        let old = {
            let _g = self.held.lock().unwrap_or_else(PoisonError::into_inner);
            self.slot.swap(Arc::new(Slot::Held))
        };
        // `swap` has turned every reader's debt on `old` into a real reference, so the
        // count falls to one when the last running request lets go of it.
        let mut old = old;
        loop {
            match Arc::try_unwrap(old) {
                Ok(Slot::Live(d)) => return Some(d),
                Ok(Slot::Held | Slot::Closed) => return None,
                Err(again) => {
                    old = again;
                    std::thread::sleep(Duration::from_millis(1));
                }
            }
        }
    }

    /// If requests are held, fails them and every later one instead (the server is
    /// stopping while suspended).
    pub fn close_held(&self) {
        {
            let _g = self.held.lock().unwrap_or_else(PoisonError::into_inner);
            if !matches!(**self.slot.load(), Slot::Held) {
                return;
            }
            self.slot.store(Arc::new(Slot::Closed));
        }
        self.resumed.notify_all();
    }

    /// Serving is over: drops the stack (and so the key and the storage lock); any late
    /// request fails.
    pub fn retire(&self) {
        {
            let _g = self.held.lock().unwrap_or_else(PoisonError::into_inner);
            self.slot.store(Arc::new(Slot::Closed));
        }
        self.resumed.notify_all();
    }

    /// Runs `f` on the live device, sleeping while the gate holds.
    fn with<T>(&self, f: impl Fn(&dyn BlockDevice) -> BlockResult<T>) -> BlockResult<T> {
        {
            let slot = self.slot.load();
            if let Slot::Live(d) = &**slot {
                return f(&**d);
            }
        }
        let slot = self.wait_live()?;
        match &*slot {
            Slot::Live(d) => f(&**d),
            Slot::Held | Slot::Closed => Err(closed()),
        }
    }

    /// The slow path: sleeps until the gate is live again (or closed).
    /// Returns the live slot itself (not a clone of its device), so that a later
    /// [`Gate::hold`] counts this request among those it waits for.
    fn wait_live(&self) -> BlockResult<Arc<Slot>> {
        let mut g = self.held.lock().unwrap_or_else(PoisonError::into_inner);
        loop {
            let slot = self.slot.load_full();
            match &*slot {
                Slot::Live(_) => return Ok(slot),
                Slot::Closed => return Err(closed()),
                Slot::Held => {}
            }
            drop(slot);
            g = self.resumed.wait(g).unwrap_or_else(PoisonError::into_inner);
        }
    }

    /// `with` for a request that needs its buffer mutably.
    fn with_mut<T>(
        &self,
        buf: &mut [u8],
        f: impl Fn(&dyn BlockDevice, &mut [u8]) -> BlockResult<T>,
    ) -> BlockResult<T> {
        {
            let slot = self.slot.load();
            if let Slot::Live(d) = &**slot {
                return f(&**d, buf);
            }
        }
        let slot = self.wait_live()?;
        match &*slot {
            Slot::Live(d) => f(&**d, buf),
            Slot::Held | Slot::Closed => Err(closed()),
        }
    }
}

/// The error of a request to a closed gate.
fn closed() -> BlockError {
    BlockError::new(BlockErrorKind::Io, "the volume is closed (or was suspended when its server stopped)")
}

impl BlockDevice for Gate {
    fn geometry(&self) -> Geometry {
        Geometry { size: self.size.load(Ordering::Acquire), ..self.geometry }
    }

    fn caps(&self) -> Caps {
        self.caps
    }

    fn read_at(&self, off: u64, buf: &mut [u8]) -> BlockResult<()> {
        self.with_mut(buf, |d, b| d.read_at(off, b))
    }

    fn write_at(&self, off: u64, buf: &[u8], flags: WriteFlags) -> BlockResult<()> {
        self.with(|d| d.write_at(off, buf, flags))
    }

    fn write_at_scratch(&self, off: u64, buf: &mut [u8], flags: WriteFlags) -> BlockResult<()> {
        self.with_mut(buf, |d, b| d.write_at_scratch(off, b, flags))
    }

    fn flush(&self) -> BlockResult<()> {
        // Stopping while suspended: the suspend flushed everything written before it.
        if matches!(**self.slot.load(), Slot::Closed) {
            return Ok(());
        }
        self.with(|d| d.flush())
    }

    fn discard(&self, off: u64, len: u64) -> BlockResult<()> {
        self.with(|d| d.discard(off, len))
    }

    fn allocation(&self, off: u64, len: u64, max_extents: usize) -> BlockResult<Vec<Extent>> {
        self.with(|d| d.allocation(off, len, max_extents))
    }

    fn write_zeroes(&self, off: u64, len: u64, flags: ZeroFlags) -> BlockResult<()> {
        self.with(|d| d.write_zeroes(off, len, flags))
    }
}

#[cfg(test)]
mod tests {
    use std::sync::atomic::{AtomicBool, Ordering};

    use blockdev::MemDevice;

    use super::*;

    #[test]
    fn held_requests_wait_and_run_on_the_new_device() {
        let a: Arc<dyn BlockDevice> = Arc::new(MemDevice::new(1 << 16, 512));
        let b: Arc<dyn BlockDevice> = Arc::new(MemDevice::new(1 << 16, 512));
        b.write_at(0, &[7u8; 512], WriteFlags::empty()).unwrap();
        let gate = Arc::new(Gate::new(a.clone()));
        let old = gate.hold().expect("was live");
        assert!(Arc::ptr_eq(&old, &a));
        assert!(gate.is_held());
        let done = Arc::new(AtomicBool::new(false));
        let reader = {
            let (gate, done) = (gate.clone(), done.clone());
            std::thread::spawn(move || {
                let mut buf = [0u8; 512];
                gate.read_at(0, &mut buf).unwrap();
                done.store(true, Ordering::SeqCst);
                buf[0]
            })
        };
        std::thread::sleep(Duration::from_millis(100));
        assert!(!done.load(Ordering::SeqCst), "a read got through a held gate");
        assert!(gate.fits(&*b));
        assert!(gate.replace(b).is_none());
        assert_eq!(reader.join().unwrap(), 7);
        assert!(gate.hold().is_some());
        assert!(gate.hold().is_none(), "holding twice");
    }
}
