//! The device of a LUKS2 volume whose reencryption is in progress (cryptsetup activates it
//! as a dm table of two segments): the data is split at a boundary between the new segment
//! and the old one, each a crypt layer (its key and cipher) or, for the plaintext side of an
//! encryption or decryption, a linear window of the data. Forward runs (reencryption,
//! encryption) have the new segment below the boundary, backward runs (decryption) above it.
//! Each request is split at the boundary.
//!
//! ```text
//!   forward:  0                 boundary                              size
//!             [=== new segment ===|=========== old segment ============]
//!                                 [-- hotzone --]  held exclusively while an online run
//!                                                  rewrites it; the boundary moves to its
//!                                                  end, then the hold is released
//!   backward: [========= old segment =========|====== new segment =====]
//!                              [-- hotzone --]  the boundary moves to its start
//! ```
//!
//! Client requests hold their range shared, the run loop ([`super::reencrypt::run_unlocked`]
//! with `online`) holds each hotzone exclusively, so a request never sees a hotzone half
//! rewritten and the boundary it reads is right for its whole range (it only moves across a
//! held hotzone). Both crypt layers address sectors from the data offset, as the segments'
//! `iv_tweak` does, so one layer per key over the whole data area is the two-segment table.
//!
//! A data shift (the layers then sit at different places of the storage) holds only its
//! hotzone too: a hotzone's reads and writes touch the storage of no position outside it
//! while the boundary is on either side of it (the invariant is written down at
//! `run_datashift` and `run_decrypt_shift` in [`super::reencrypt`]). A data-shift
//! decryption also switches the part below the boundary from the moved ciphertext to the
//! plaintext in place after its last hotzone ([`ReencryptingDevice::set_moved_done`]).

use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::Arc;

use blockdev::{
    BlockDevice, BlockResult, Caps, Geometry, RangeGuard, RangeLock, Slice, WriteFlags, ZeroFlags,
};
use formats::dm::{CryptOptions, CryptTable};
use sector_crypto::VolumeKey;

use super::reencrypt::{
    decrypt_shift_activation, is_shift_decrypting, prepare_activation, recover_decrypt_shift,
    shift_activation, DecryptShiftActivation, ReencryptKeys, ShiftActivation,
};
use super::{Luks, LuksError};
use crate::{crypt_over, OpenOptions, Storage, VolumeError};

/// One segment of an activation.
#[derive(Debug, Clone)]
pub enum SegmentTable {
    /// A crypt segment: its table (it holds the key).
    Crypt(CryptTable),
    /// A linear (plaintext) segment: `offset` and `len` in 512-byte sectors of the data device.
    Linear {
        /// Start on the data device.
        offset: u64,
        /// Length.
        len: u64,
    },
}

impl SegmentTable {
    /// The crypt table, if this is a crypt segment.
    pub fn crypt(self) -> Option<CryptTable> {
        match self {
            SegmentTable::Crypt(t) => Some(t),
            SegmentTable::Linear { .. } => None,
        }
    }
}

/// Activates the LUKS2 volume `luks` (header on `meta`, data on `storage`) whose
/// reencryption is in progress: recovers a hotzone a crash left half rewritten (not when
/// read-only), then builds the device. Returns it with the new segment's table and the old
/// side's (they hold the keys; linear for a plaintext side: two for a data shift, the moved
/// copy then the data in place). A data-shift encryption is mapped as cryptsetup maps it
/// (no recovery: see `activate_shift`). `flags` are the activation
/// flags from the command line.
pub fn activate(
    storage: &Storage,
    meta: &dyn BlockDevice,
    luks: &mut Luks,
    keys: &ReencryptKeys,
    opts: &OpenOptions,
    flags: &CryptOptions,
) -> Result<(Arc<ReencryptingDevice>, SegmentTable, Vec<SegmentTable>), VolumeError> {
    let wrap = |source| VolumeError::Luks { path: storage.name.clone(), source };
    if let Some(sa) = shift_activation(luks, storage.size()).map_err(wrap)? {
        return activate_shift(storage, &sa, keys, opts, flags);
    }
    if !opts.read_only && is_shift_decrypting(luks) {
        // A crash in the last hotzone is recovered first (writes), as cryptsetup's open does.
        recover_decrypt_shift(meta, &*storage.device, luks, keys).map_err(wrap)?;
    }
    if let Some(da) = decrypt_shift_activation(luks, storage.size()).map_err(wrap)? {
        return activate_decrypt_shift(storage, &da, keys, opts, flags);
    }
    let act = prepare_activation(meta, &*storage.device, luks, keys, opts.read_only).map_err(wrap)?;
    if act.boundary > 0 && act.boundary < act.size {
        log::info!(
            "{}: reencryption in progress: boundary at {} of {} bytes ({} run)",
            storage.name,
            act.boundary,
            act.size,
            if act.backward { "backward" } else { "forward" }
        );
    }
    let table = |spec: &Option<(String, u32)>, vk: &Option<VolumeKey>| -> Result<SegmentTable, VolumeError> {
        match (spec, vk) {
            (None, _) => Ok(SegmentTable::Linear { offset: act.data_offset / 512, len: act.size / 512 }),
            (Some(spec), Some(vk)) => {
                Ok(SegmentTable::Crypt(segment_table(storage, spec, vk, flags, act.data_offset, act.size)))
            }
            (Some(_), None) => Err(wrap(LuksError::Internal("no key for a crypt segment"))),
        }
    };
    let (tn, to) = (table(&act.new, &keys.new)?, table(&act.old, &keys.old)?);
    let layer = |t: &SegmentTable| -> Result<Box<dyn BlockDevice>, VolumeError> {
        Ok(match t {
            SegmentTable::Crypt(t) => Box::new(crypt_over(storage.device.clone(), t, opts)?),
            SegmentTable::Linear { .. } => {
                Box::new(Slice::new(storage.device.clone(), act.data_offset, act.size).map_err(|_| {
                    VolumeError::Stack("the data area of the reencrypting volume does not fit the device")
                })?)
            }
        })
    };
    let (new, old) = (layer(&tn)?, layer(&to)?);
    let (below, above) = if act.backward { (old, new) } else { (new, old) };
    let device = ReencryptingDevice::from_layers(below, above, act.boundary).map_err(VolumeError::Stack)?;
    Ok((Arc::new(device), tn, vec![to]))
}

/// The crypt table of a segment of `storage` (`spec`: cipher and sector size; `offset` and
/// `len` in bytes) under the key `vk`, its IVs counted from the data's start (the segments'
/// `iv_tweak`), with the activation `flags`.
fn segment_table(
    storage: &Storage,
    (cipher, ss): &(String, u32),
    vk: &VolumeKey,
    flags: &CryptOptions,
    offset: u64,
    len: u64,
) -> CryptTable {
    CryptTable {
        len: len / 512,
        cipher: cipher.clone(),
        key: zeroize::Zeroizing::new(vk.as_bytes().to_vec()),
        iv_offset: 0,
        device: storage.name.clone(),
        offset: offset / 512,
        options: CryptOptions { sector_size: (*ss != 512).then_some(*ss), integrity_aead: None, ..*flags },
    }
}

/// The device of a volume mid data-shift encryption, as cryptsetup maps its segments: the
/// old (plaintext) side is the moved copy of the first `moved_size` bytes, then the data in
/// place; the new side is the crypt segment `shift` bytes up (IVs from 0 at its start).
/// Nothing is written: a hotzone left in reencryption is still old (its source is intact;
/// the run redoes it from there), so a write into it lands where the run reads it.
fn activate_shift(
    storage: &Storage,
    sa: &ShiftActivation,
    keys: &ReencryptKeys,
    opts: &OpenOptions,
    flags: &CryptOptions,
) -> Result<(Arc<ReencryptingDevice>, SegmentTable, Vec<SegmentTable>), VolumeError> {
    let g = &sa.geometry;
    let vk = keys.new.as_ref().ok_or_else(|| VolumeError::Luks {
        path: storage.name.clone(),
        source: LuksError::Internal("no key for the new segment"),
    })?;
    log::info!(
        "{}: encryption with data shift in progress: {} of {} bytes still plaintext",
        storage.name,
        sa.boundary,
        g.data_size
    );
    let tn = segment_table(storage, &sa.new, vk, flags, g.new_offset, g.data_size);
    let slice = |off: u64, len: u64| {
        Slice::new(storage.device.clone(), off, len)
            .map_err(|_| VolumeError::Stack("the data shift segments do not fit the device"))
    };
    let moved = slice(g.moved_offset, g.moved_size)?;
    let old: Box<dyn BlockDevice> = if g.moved_size < g.data_size {
        let rest = slice(g.old_offset + g.moved_size, g.data_size - g.moved_size)?;
        Box::new(Joined { first: Box::new(moved), rest: Box::new(rest), cut: g.moved_size })
    } else {
        Box::new(moved)
    };
    let new = Box::new(crypt_over(storage.device.clone(), &tn, opts)?);
    let mut to = vec![SegmentTable::Linear { offset: g.moved_offset / 512, len: g.moved_size / 512 }];
    if g.moved_size < g.data_size {
        to.push(SegmentTable::Linear {
            offset: (g.old_offset + g.moved_size) / 512,
            len: (g.data_size - g.moved_size) / 512,
        });
    }
    // A backward run: the old side below the boundary.
    let device = ReencryptingDevice::from_layers(old, new, sa.boundary).map_err(VolumeError::Stack)?;
    Ok((Arc::new(device), SegmentTable::Crypt(tn), to))
}

/// The device of a volume mid data-shift decryption (header moved to a file), as cryptsetup
/// maps its segments: below the boundary the moved ciphertext at the start of the device
/// (its first `moved_size` bytes, IVs from 0) and then the plaintext in place; from the
/// boundary up the ciphertext not reached yet, `shift` bytes up the device (IVs from 0 at
/// the data's start). Nothing is written: a forward hotzone left in reencryption is still
/// ciphertext there (its source is intact; the run redoes it from there), so a write into
/// it lands where the run reads it, as a write to the moved ciphertext does for the last
/// hotzone.
fn activate_decrypt_shift(
    storage: &Storage,
    da: &DecryptShiftActivation,
    keys: &ReencryptKeys,
    opts: &OpenOptions,
    flags: &CryptOptions,
) -> Result<(Arc<ReencryptingDevice>, SegmentTable, Vec<SegmentTable>), VolumeError> {
    let g = &da.geometry;
    let vk = keys.old.as_ref().ok_or_else(|| VolumeError::Luks {
        path: storage.name.clone(),
        source: LuksError::Internal("no key for the old segment"),
    })?;
    log::info!(
        "{}: decryption with data shift in progress: {} of {} bytes of data decrypted or moved",
        storage.name,
        da.boundary,
        g.data_size
    );
    let crypt = |offset: u64, len: u64| segment_table(storage, &da.old, vk, flags, offset, len);
    let slice = |off: u64, len: u64| {
        Slice::new(storage.device.clone(), off, len)
            .map_err(|_| VolumeError::Stack("the data shift segments do not fit the device"))
    };
    let new = SegmentTable::Linear { offset: 0, len: g.data_size / 512 };
    let (shifted, moved) = (crypt(g.shift, g.data_size), crypt(0, g.moved_size));
    let above = Box::new(crypt_over(storage.device.clone(), &shifted, opts)?);
    let below: Box<dyn BlockDevice> = if da.moved_plain {
        Box::new(slice(0, g.data_size)?)
    } else {
        let first = Box::new(crypt_over(storage.device.clone(), &moved, opts)?);
        if g.moved_size < g.data_size {
            let rest = slice(g.moved_size, g.data_size - g.moved_size)?;
            Box::new(Joined { first, rest: Box::new(rest), cut: g.moved_size })
        } else {
            first
        }
    };
    let mut old = vec![SegmentTable::Crypt(shifted)];
    if !da.moved_plain {
        old.insert(0, SegmentTable::Crypt(moved));
    }
    // A forward run: the decrypted data below the boundary. Until the moved ciphertext is
    // decrypted in place (the last hotzone), an online run switches the part below the
    // boundary to the plaintext in place once its header says so.
    let mut device =
        ReencryptingDevice::from_layers(below, above, da.boundary).map_err(VolumeError::Stack)?;
    if !da.moved_plain {
        device = device.with_moved_final(Box::new(slice(0, g.data_size)?)).map_err(VolumeError::Stack)?;
    }
    Ok((Arc::new(device), new, old))
}

/// Two devices one after the other (`first` is `cut` bytes long): the plaintext side of a
/// data shift, whose first part is the moved copy.
#[derive(Debug)]
struct Joined {
    first: Box<dyn BlockDevice>,
    rest: Box<dyn BlockDevice>,
    cut: u64,
}

impl Joined {
    fn split(
        &self,
        off: u64,
        len: u64,
        mut f: impl FnMut(&dyn BlockDevice, u64, usize, usize) -> BlockResult<()>,
    ) -> BlockResult<()> {
        self.geometry().check_range(off, len)?;
        let end = off + len;
        let mid = self.cut.clamp(off, end);
        if mid > off {
            f(&*self.first, off, 0, (mid - off) as usize)?;
        }
        if end > mid {
            f(&*self.rest, mid - self.cut, (mid - off) as usize, (end - mid) as usize)?;
        }
        Ok(())
    }
}

impl BlockDevice for Joined {
    fn geometry(&self) -> Geometry {
        let (a, b) = (self.first.geometry(), self.rest.geometry());
        Geometry {
            size: a.size + b.size,
            logical_block: a.logical_block.max(b.logical_block),
            physical_block: a.physical_block.max(b.physical_block),
        }
    }

    fn caps(&self) -> Caps {
        self.first.caps() & self.rest.caps()
    }

    fn read_at(&self, off: u64, buf: &mut [u8]) -> BlockResult<()> {
        self.split(off, buf.len() as u64, |d, o, s, l| d.read_at(o, &mut buf[s..s + l]))
    }

    fn write_at(&self, off: u64, buf: &[u8], flags: WriteFlags) -> BlockResult<()> {
        self.split(off, buf.len() as u64, |d, o, s, l| d.write_at(o, &buf[s..s + l], flags))
    }

    fn flush(&self) -> BlockResult<()> {
        // Both parts sit on the same storage.
        self.first.flush()
    }

    fn discard(&self, off: u64, len: u64) -> BlockResult<()> {
        self.split(off, len, |d, o, _, l| d.discard(o, l as u64))
    }

    fn write_zeroes(&self, off: u64, len: u64, flags: ZeroFlags) -> BlockResult<()> {
        self.split(off, len, |d, o, _, l| d.write_zeroes(o, l as u64, flags))
    }
}

/// A LUKS2 volume mid-reencryption (see the module docs).
#[derive(Debug)]
pub struct ReencryptingDevice {
    below: Box<dyn BlockDevice>,
    above: Box<dyn BlockDevice>,
    /// A data-shift decryption: the part below the boundary once the moved segment (the
    /// ciphertext moved to the device's start, decrypted in place by the last hotzone) is
    /// plaintext; used from [`Self::set_moved_done`] on.
    moved_final: Option<Box<dyn BlockDevice>>,
    moved_done: AtomicBool,
    geometry: Geometry,
    boundary: AtomicU64,
    locks: RangeLock,
}

impl ReencryptingDevice {
    /// The device over two layers of the same size: `below` under `boundary`, `above` from
    /// it on (forward runs: new, old; backward runs: old, new). Their block sizes may
    /// differ: the device's is the larger.
    pub fn new(
        below: impl BlockDevice + 'static,
        above: impl BlockDevice + 'static,
        boundary: u64,
    ) -> Result<Self, &'static str> {
        Self::from_layers(Box::new(below), Box::new(above), boundary)
    }

    /// [`Self::new`] of boxed layers.
    pub fn from_layers(
        below: Box<dyn BlockDevice>,
        above: Box<dyn BlockDevice>,
        boundary: u64,
    ) -> Result<Self, &'static str> {
        let (gn, go) = (below.geometry(), above.geometry());
        if gn.size != go.size {
            return Err("the two segments of a reencrypting device differ in size");
        }
        let block = gn.logical_block.max(go.logical_block);
        let geometry = Geometry {
            size: gn.size / u64::from(block) * u64::from(block),
            logical_block: block,
            physical_block: gn.physical_block.max(go.physical_block).max(block),
        };
        if boundary > geometry.size || !boundary.is_multiple_of(u64::from(block)) {
            return Err("the reencryption boundary is not a block boundary inside the device");
        }
        Ok(ReencryptingDevice {
            below,
            above,
            moved_final: None,
            moved_done: AtomicBool::new(false),
            geometry,
            boundary: AtomicU64::new(boundary),
            locks: RangeLock::new(),
        })
    }

    /// With `after`: the layer below the boundary once the moved segment of a data-shift
    /// decryption is plaintext (see [`Self::set_moved_done`]); the same size as the device.
    pub fn with_moved_final(mut self, after: Box<dyn BlockDevice>) -> Result<Self, &'static str> {
        let g = after.geometry();
        if g.size < self.geometry.size
            || u64::from(self.geometry.logical_block) % u64::from(g.logical_block) != 0
        {
            return Err("the plaintext layer of a data-shift decryption does not fit the device");
        }
        self.moved_final = Some(after);
        Ok(self)
    }

    /// The moved segment is plaintext now (the caller holds its range, and the header says
    /// so): requests below the boundary go to the final layer. Nothing without one.
    pub fn set_moved_done(&self) {
        self.moved_done.store(self.moved_final.is_some(), Ordering::Release);
    }

    /// `true` once [`Self::set_moved_done`] switched the part below the boundary.
    pub fn moved_done(&self) -> bool {
        self.moved_done.load(Ordering::Acquire)
    }

    fn below(&self) -> &dyn BlockDevice {
        match &self.moved_final {
            Some(f) if self.moved_done() => &**f,
            _ => &*self.below,
        }
    }

    /// Bytes (from the start of the device) below the boundary.
    pub fn boundary(&self) -> u64 {
        self.boundary.load(Ordering::Acquire)
    }

    /// Holds `[off, off+len)` against client requests until the guard is dropped.
    pub fn hold(&self, off: u64, len: u64) -> RangeGuard<'_> {
        self.locks.write(off, len)
    }

    /// Moves the boundary (the caller holds the range it moves across).
    pub fn set_boundary(&self, b: u64) {
        self.boundary.store(b.min(self.geometry.size), Ordering::Release);
    }

    /// Runs `f` on each part of `[off, off+len)`: `(device, offset, start in the request,
    /// length)`, the part below the boundary first.
    fn split(
        &self,
        off: u64,
        len: u64,
        mut f: impl FnMut(&dyn BlockDevice, u64, usize, usize) -> BlockResult<()>,
    ) -> BlockResult<()> {
        self.geometry.check_range(off, len)?;
        if len == 0 {
            return Ok(());
        }
        let _g = self.locks.read(off, len);
        let b = self.boundary();
        let end = off + len;
        let cut = b.clamp(off, end);
        if cut > off {
            f(self.below(), off, 0, (cut - off) as usize)?;
        }
        if end > cut {
            f(&*self.above, cut, (cut - off) as usize, (end - cut) as usize)?;
        }
        Ok(())
    }
}

impl BlockDevice for ReencryptingDevice {
    fn geometry(&self) -> Geometry {
        self.geometry
    }

    fn caps(&self) -> Caps {
        // Discard only when every segment passes it down.
        let c = self.below.caps() & self.above.caps();
        self.moved_final.as_ref().map_or(c, |f| c & f.caps())
    }

    fn read_at(&self, off: u64, buf: &mut [u8]) -> BlockResult<()> {
        self.split(off, buf.len() as u64, |d, o, s, l| d.read_at(o, &mut buf[s..s + l]))
    }

    fn write_at(&self, off: u64, buf: &[u8], flags: WriteFlags) -> BlockResult<()> {
        self.split(off, buf.len() as u64, |d, o, s, l| d.write_at(o, &buf[s..s + l], flags))
    }

    fn write_at_scratch(&self, off: u64, buf: &mut [u8], flags: WriteFlags) -> BlockResult<()> {
        self.split(off, buf.len() as u64, |d, o, s, l| d.write_at_scratch(o, &mut buf[s..s + l], flags))
    }

    fn flush(&self) -> BlockResult<()> {
        // Both layers sit on the same storage: one flush covers both.
        self.below.flush()
    }

    fn discard(&self, off: u64, len: u64) -> BlockResult<()> {
        self.split(off, len, |d, o, _, l| d.discard(o, l as u64))
    }

    fn write_zeroes(&self, off: u64, len: u64, flags: ZeroFlags) -> BlockResult<()> {
        self.split(off, len, |d, o, _, l| d.write_zeroes(o, l as u64, flags))
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use blockdev::MemDevice;
    use sector_crypto::{CipherSpec, SectorCipher, SectorParams, VolumeKey};
    use targets::{CryptConfig, CryptTarget};

    fn layer(dev: &Arc<dyn BlockDevice>, key: u8, ss: u32) -> CryptTarget<Arc<dyn BlockDevice>> {
        let spec: CipherSpec = "aes-xts-plain64".parse().unwrap();
        let bytes: Vec<u8> = (0..64u8).map(|i| i.wrapping_mul(37) ^ key).collect();
        let vk = VolumeKey::from_slice(&bytes);
        let c = SectorCipher::new(
            &spec,
            &vk,
            SectorParams { sector_size: ss, iv_offset: 0, iv_large_sectors: false },
        )
        .unwrap();
        CryptTarget::new(dev.clone(), c, CryptConfig { offset: 4096, ..CryptConfig::default() }).unwrap()
    }

    #[test]
    fn requests_split_at_the_boundary_and_follow_it() {
        let mem: Arc<dyn BlockDevice> = Arc::new(MemDevice::new(4096 + 64 * 1024, 512));
        let (newl, oldl) = (layer(&mem, 1, 4096), layer(&mem, 2, 512));
        let d = ReencryptingDevice::new(layer(&mem, 1, 4096), layer(&mem, 2, 512), 16384).unwrap();
        assert_eq!(d.geometry().logical_block, 4096);
        let data: Vec<u8> = (0..65536u32).map(|i| (i * 7 % 251) as u8).collect();
        d.write_at(0, &data, WriteFlags::empty()).unwrap();
        // Below the boundary the new key wrote, above it the old one.
        let mut buf = vec![0u8; 16384];
        newl.read_at(0, &mut buf).unwrap();
        assert_eq!(buf, data[..16384]);
        let mut buf = vec![0u8; 65536 - 16384];
        oldl.read_at(16384, &mut buf).unwrap();
        assert_eq!(buf, data[16384..]);
        // A request across the boundary reads back whole.
        let mut buf = vec![0u8; 8192];
        d.read_at(12288, &mut buf).unwrap();
        assert_eq!(buf, data[12288..20480]);
        // Misaligned for the larger block size: refused, nothing written.
        assert!(d.write_at(512, &data[..512], WriteFlags::empty()).is_err());
        assert!(ReencryptingDevice::new(layer(&mem, 1, 4096), layer(&mem, 2, 512), 512).is_err());
    }
}
