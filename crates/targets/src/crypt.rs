//! `CryptTarget`: the dm-crypt target in userspace.
//!
//! The layer owns the device below (`next`), maps target offset `o` to `offset + o` on it,
//! and runs every sector through a [`SectorCipher`] whose IVs are the kernel's (target-relative
//! 512-byte sector plus `iv_offset`). It keeps no state besides its configuration, so any
//! number of requests run concurrently without locks.
//!
//! Where the crypto runs is a knob per direction, like dm-crypt's `no_read_workqueue` and
//! `no_write_workqueue`: a [`CryptMode`] ([`crate::placement::Placement`]), carried out by
//! the crate's one placement engine (`placement.rs`) that AEAD crypt and integrity hashing
//! share. `Inline` decrypts on the request thread; `Pool` hands every request to the shared
//! pool (dm-crypt's kcryptd), a large one split across its threads unless `same_cpu_crypt`;
//! `Auto` (default) runs a request of at most one 64 KiB chunk inline and splits a larger one
//! between the request thread and the pool while a core is free. With `Pool` writes,
//! `submit_from_crypt_cpus` lets the pool thread that encrypted a write also submit it below.

use std::cell::RefCell;
use std::fmt;
use std::sync::Arc;

use blockdev::{BlockDevice, BlockError, BlockErrorKind, BlockResult, Caps, Geometry, WriteFlags};
use sector_crypto::{CryptoError, SectorCipher};

use crate::placement::{self, Placement, Policy};

/// Where sector crypto runs for one direction: the crate's one [`Placement`] policy.
pub type CryptMode = Placement;

/// How a `CryptTarget` maps onto the device below.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct CryptConfig {
    /// Byte offset of the ciphertext on the device below (dm `offset` × 512).
    pub offset: u64,
    /// Length of the target in bytes; `None` = everything after `offset`.
    pub len: Option<u64>,
    /// Where reads are decrypted.
    pub read_mode: CryptMode,
    /// Where writes are encrypted.
    pub write_mode: CryptMode,
    /// Keep a pooled request on one pool thread (dm-crypt `same_cpu_crypt`).
    pub same_cpu_crypt: bool,
    /// With `CryptMode::Pool` writes: the pool thread that encrypts a write also submits it
    /// below (dm-crypt `submit_from_crypt_cpus`); otherwise the request thread submits it.
    pub submit_from_crypt_cpus: bool,
    /// Pass discards to the device below (dm-crypt `allow_discards`).
    pub allow_discards: bool,
    /// Refuse writes.
    pub read_only: bool,
}

impl Default for CryptConfig {
    fn default() -> Self {
        CryptConfig {
            offset: 0,
            len: None,
            read_mode: CryptMode::Auto,
            write_mode: CryptMode::Auto,
            same_cpu_crypt: false,
            submit_from_crypt_cpus: false,
            allow_discards: false,
            read_only: false,
        }
    }
}

/// Why a `CryptTarget` could not be built.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum CryptError {
    /// The payload offset is not aligned to the device's block size.
    #[error("payload offset {offset} is not a multiple of the device block size {block}")]
    MisalignedOffset {
        /// Offset in bytes.
        offset: u64,
        /// Device logical block.
        block: u32,
    },
    /// The device is smaller than offset + length.
    #[error(
        "device is too small: {size} bytes, but the target needs {needed} bytes (offset {offset} + length)"
    )]
    DeviceTooSmall {
        /// Device size.
        size: u64,
        /// Bytes needed.
        needed: u64,
        /// Payload offset.
        offset: u64,
    },
    /// The target would be empty.
    #[error("the encrypted area is empty (device {size} bytes, offset {offset})")]
    Empty {
        /// Device size.
        size: u64,
        /// Payload offset.
        offset: u64,
    },
    /// Discards were asked for with authenticated encryption (a discarded sector would have
    /// no valid tag).
    #[error("discards are not supported with authenticated encryption")]
    DiscardsWithAead,
    /// The tagged device's block size is not the AEAD cipher's sector size.
    #[error(
        "integrity profile sector size mismatch: the tagged device has {device_block}-byte blocks, the cipher {sector_size}-byte sectors"
    )]
    TagBlockSizeMismatch {
        /// The tagged device's tag block size.
        device_block: usize,
        /// The cipher's sector size.
        sector_size: u32,
    },
    /// The tagged device's tag size is not the AEAD cipher's tuple (tag + IV) size.
    #[error("integrity profile tag size mismatch: the tagged device stores {device_tag} bytes per block, {spec} needs {tuple}")]
    TagSizeMismatch {
        /// Bytes per block the tagged device stores.
        device_tag: usize,
        /// The cipher.
        spec: sector_crypto::AeadSpec,
        /// Bytes per sector the cipher needs.
        tuple: usize,
    },
    /// Length not a multiple of the encryption sector size.
    #[error("target length {len} is not a multiple of the {sector_size}-byte encryption sector")]
    MisalignedLength {
        /// Length in bytes.
        len: u64,
        /// Sector size.
        sector_size: u32,
    },
}

thread_local! {
    /// Per-thread ciphertext bounce buffer for writes (the caller's buffer is immutable).
    static BOUNCE: RefCell<Vec<u8>> = const { RefCell::new(Vec::new()) };
}

/// The dm-crypt target over `next`.
pub struct CryptTarget<D> {
    next: D,
    cipher: Arc<SectorCipher>,
    cfg: CryptConfig,
    geometry: Geometry,
}

impl<D: BlockDevice> fmt::Debug for CryptTarget<D> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        // The cipher holds key material: show only its shape.
        f.debug_struct("CryptTarget")
            .field("geometry", &self.geometry)
            .field("sector_size", &self.cipher.sector_size())
            .field("cfg", &self.cfg)
            .field("next", &self.next)
            .finish()
    }
}

impl<D: BlockDevice> CryptTarget<D> {
    /// Stacks a crypt layer over `next`.
    ///
    /// The layer's block size is `max(cipher sector size, next's logical block)`; its size is
    /// `cfg.len` or everything after `cfg.offset`, which must fit in `next`.
    pub fn new(next: D, cipher: SectorCipher, cfg: CryptConfig) -> Result<Self, CryptError> {
        let below = next.geometry();
        let sector_size = cipher.sector_size();
        if !cfg.offset.is_multiple_of(u64::from(below.logical_block)) {
            return Err(CryptError::MisalignedOffset { offset: cfg.offset, block: below.logical_block });
        }
        let available = below.size.saturating_sub(cfg.offset);
        let len = match cfg.len {
            Some(len) => {
                let needed = cfg.offset.saturating_add(len);
                if needed > below.size {
                    return Err(CryptError::DeviceTooSmall { size: below.size, needed, offset: cfg.offset });
                }
                if !len.is_multiple_of(u64::from(sector_size)) {
                    return Err(CryptError::MisalignedLength { len, sector_size });
                }
                len
            }
            None => available - available % u64::from(sector_size),
        };
        if len == 0 || cfg.offset >= below.size {
            return Err(CryptError::Empty { size: below.size, offset: cfg.offset });
        }
        let block = sector_size.max(below.logical_block);
        let len = len - len % u64::from(block);
        let geometry =
            Geometry { size: len, logical_block: block, physical_block: below.physical_block.max(block) };
        Ok(CryptTarget { next, cipher: Arc::new(cipher), cfg, geometry })
    }

    /// The device below.
    pub fn inner(&self) -> &D {
        &self.next
    }

    /// The configuration this layer was built with.
    pub fn config(&self) -> &CryptConfig {
        &self.cfg
    }

    fn crypt_err(e: CryptoError) -> BlockError {
        BlockError::new(BlockErrorKind::InvalidArgument, "sector encryption failed").with_source(e)
    }

    /// Runs `op` (encrypt or decrypt) over `data`, whose first byte is target offset `off`,
    /// where `mode` says. With `src` (the write path, `op` is then encryption), each chunk is
    /// encrypted from `src` into `data` in one pass ([`SectorCipher::encrypt_to`]: no copy
    /// of the plaintext first where the provider reads one buffer and writes another), on
    /// the thread that encrypts it.
    fn run(
        &self,
        mode: CryptMode,
        off: u64,
        data: &mut [u8],
        src: Option<&[u8]>,
        op: fn(&SectorCipher, u64, &mut [u8]) -> Result<(), CryptoError>,
    ) -> BlockResult<()> {
        let cipher = &*self.cipher;
        let sector0 = off / 512;
        let chunk = placement::chunk_len(cipher.sector_size() as usize);
        let policy = Policy::new(mode).same_cpu(self.cfg.same_cpu_crypt);
        placement::run(policy, data, chunk, |o, part: &mut [u8]| {
            let sector = sector0 + (o / 512) as u64;
            match src {
                Some(src) => cipher.encrypt_to(sector, &src[o..o + part.len()], part),
                None => op(cipher, sector, part),
            }
        })
        .map_err(Self::crypt_err)
    }

    /// Encrypts `buf` (target offset `off`) into this thread's bounce buffer, where `mode`
    /// says, and writes the ciphertext below from the calling thread.
    fn encrypt_and_write(&self, mode: CryptMode, off: u64, buf: &[u8], flags: WriteFlags) -> BlockResult<()> {
        BOUNCE.with(|bounce| {
            // Crypto never calls back into a device, so the buffer is never borrowed twice;
            // should that change, fall back to a fresh buffer rather than panic.
            let mut owned;
            let mut guard = bounce.try_borrow_mut();
            let ct: &mut Vec<u8> = match guard {
                Ok(ref mut g) => g,
                Err(_) => {
                    owned = Vec::new();
                    &mut owned
                }
            };
            if ct.len() < buf.len() {
                ct.resize(buf.len(), 0);
            }
            let ct_slice = &mut ct[..buf.len()];
            self.run(mode, off, ct_slice, Some(buf), SectorCipher::encrypt)?;
            let r = self.next.write_at(self.cfg.offset + off, ct_slice, flags);
            // Don't keep huge buffers alive in every thread forever.
            if ct.capacity() > 8 << 20 {
                *ct = Vec::new();
            }
            r
        })
    }

    fn check_writable(&self) -> BlockResult<()> {
        if self.cfg.read_only {
            Err(BlockError::read_only())
        } else {
            Ok(())
        }
    }
}

impl<D: BlockDevice> BlockDevice for CryptTarget<D> {
    fn geometry(&self) -> Geometry {
        self.geometry
    }

    fn caps(&self) -> Caps {
        let below = self.next.caps();
        // Zeroes written below would decrypt to garbage, so WRITE_ZEROES is emulated by the
        // trait's default (encrypted zero buffers) and never passed through.
        let mut caps = below & (Caps::FLUSH | Caps::FUA | Caps::READ_ONLY);
        if self.cfg.allow_discards && below.contains(Caps::DISCARD) {
            caps |= Caps::DISCARD;
        }
        if self.cfg.read_only {
            caps |= Caps::READ_ONLY;
        }
        caps
    }

    fn read_at(&self, off: u64, buf: &mut [u8]) -> BlockResult<()> {
        self.geometry.check_range(off, buf.len() as u64)?;
        if buf.is_empty() {
            return Ok(());
        }
        self.next.read_at(self.cfg.offset + off, buf)?;
        self.run(self.cfg.read_mode, off, buf, None, SectorCipher::decrypt)
    }

    fn write_at(&self, off: u64, buf: &[u8], flags: WriteFlags) -> BlockResult<()> {
        self.check_writable()?;
        self.geometry.check_range(off, buf.len() as u64)?;
        if buf.is_empty() {
            return Ok(());
        }
        if self.cfg.write_mode == CryptMode::Pool && self.cfg.submit_from_crypt_cpus {
            // The pool thread that encrypts also submits the write below (or, while a layer
            // that waits on the pool holds a lock, this thread places the crypto as usual).
            return placement::submit_on_pool(|pooled| {
                let mode = if pooled { CryptMode::Inline } else { CryptMode::Pool };
                self.encrypt_and_write(mode, off, buf, flags)
            });
        }
        self.encrypt_and_write(self.cfg.write_mode, off, buf, flags)
    }

    fn write_at_scratch(&self, off: u64, buf: &mut [u8], flags: WriteFlags) -> BlockResult<()> {
        self.check_writable()?;
        self.geometry.check_range(off, buf.len() as u64)?;
        if buf.is_empty() {
            return Ok(());
        }
        // The caller's buffer is ours to clobber: encrypt in place, no bounce copy.
        let mode = self.cfg.write_mode;
        let pooled_submit = mode == CryptMode::Pool && self.cfg.submit_from_crypt_cpus;
        let go = |mode: CryptMode, buf: &mut [u8]| {
            self.run(mode, off, buf, None, SectorCipher::encrypt)?;
            self.next.write_at(self.cfg.offset + off, buf, flags)
        };
        if pooled_submit {
            placement::submit_on_pool(|pooled| go(if pooled { CryptMode::Inline } else { mode }, buf))
        } else {
            go(mode, buf)
        }
    }

    fn flush(&self) -> BlockResult<()> {
        self.next.flush()
    }

    fn discard(&self, off: u64, len: u64) -> BlockResult<()> {
        if !self.cfg.allow_discards {
            return Err(BlockError::unsupported("discard (the volume was opened without allow_discards)"));
        }
        self.check_writable()?;
        self.geometry.check_range(off, len)?;
        self.next.discard(self.cfg.offset + off, len)
    }
    // write_zeroes: the trait default writes zero buffers through `write_at`, which encrypts
    // them (zeroes below would decrypt to garbage).
}

#[cfg(test)]
mod tests {
    use blockdev::MemDevice;
    use sector_crypto::{CipherSpec, SectorParams, VolumeKey};

    use super::*;

    fn cipher(sector_size: u32, iv_offset: u64) -> SectorCipher {
        let spec: CipherSpec = "aes-xts-plain64".parse().unwrap();
        let key = VolumeKey::new((0..64u8).collect());
        SectorCipher::new(&spec, &key, SectorParams { sector_size, iv_offset, iv_large_sectors: false })
            .unwrap()
    }

    fn pattern(len: usize, seed: u8) -> Vec<u8> {
        (0..len).map(|i| (i as u8).wrapping_mul(31).wrapping_add(seed) ^ (i >> 9) as u8).collect()
    }

    fn cfg(mode: CryptMode) -> CryptConfig {
        CryptConfig { offset: 8192, read_mode: mode, write_mode: mode, ..CryptConfig::default() }
    }

    #[test]
    fn geometry_derives_from_below_and_sector_size() {
        let t =
            CryptTarget::new(MemDevice::new(1 << 20, 512), cipher(4096, 0), cfg(CryptMode::Inline)).unwrap();
        let g = t.geometry();
        assert_eq!(g.logical_block, 4096);
        assert_eq!(g.size, (1 << 20) - 8192);
        let t =
            CryptTarget::new(MemDevice::new(1 << 20, 4096), cipher(512, 0), cfg(CryptMode::Inline)).unwrap();
        assert_eq!(t.geometry().logical_block, 4096, "block size only goes up");
    }

    #[test]
    fn backing_holds_exactly_the_sector_ciphertext_in_every_mode() {
        let data = pattern(256 * 1024, 7);
        let mut expected = data.clone();
        cipher(4096, 0).encrypt(16, &mut expected).unwrap(); // target offset 8192 = sector 16
        for mode in [CryptMode::Inline, CryptMode::Pool, CryptMode::Auto] {
            for same_cpu in [false, true] {
                let c =
                    CryptConfig { same_cpu_crypt: same_cpu, submit_from_crypt_cpus: same_cpu, ..cfg(mode) };
                let t = CryptTarget::new(MemDevice::new(1 << 20, 512), cipher(4096, 0), c).unwrap();
                t.write_at(8192, &data, WriteFlags::empty()).unwrap();
                let raw = t.inner().to_vec();
                assert_eq!(&raw[8192 + 8192..8192 + 8192 + data.len()], &expected[..], "{mode:?}");
                let mut back = vec![0u8; data.len()];
                t.read_at(8192, &mut back).unwrap();
                assert_eq!(back, data, "{mode:?} same_cpu={same_cpu}");
            }
        }
    }

    #[test]
    fn auto_stores_the_same_ciphertext_whether_the_cores_are_busy_or_not() {
        // Auto splits a large request only while a core is free; with every core "taken" it
        // runs the same request serially. Both must write and read the same bytes.
        let data = pattern(512 * 1024, 5);
        let mut expected = data.clone();
        cipher(4096, 0).encrypt(16, &mut expected).unwrap();
        for busy in [false, true] {
            let _others: Vec<placement::Counted> = if busy {
                (0..placement::pool().current_num_threads())
                    .map(|_| placement::Counted::auto_request())
                    .collect()
            } else {
                Vec::new()
            };
            let t = CryptTarget::new(MemDevice::new(1 << 20, 512), cipher(4096, 0), cfg(CryptMode::Auto))
                .unwrap();
            t.write_at(8192, &data, WriteFlags::empty()).unwrap();
            assert_eq!(&t.inner().to_vec()[16384..16384 + data.len()], &expected[..], "busy={busy}");
            let mut back = vec![0u8; data.len()];
            t.read_at(8192, &mut back).unwrap();
            assert_eq!(back, data, "busy={busy}");
        }
        assert!(placement::auto_busy() < 1000, "the busy count leaks");
    }

    #[test]
    fn scratch_writes_store_the_same_ciphertext_as_copying_writes() {
        let data = pattern(192 * 1024, 3);
        for mode in [CryptMode::Inline, CryptMode::Pool, CryptMode::Auto] {
            let copy = CryptTarget::new(MemDevice::new(1 << 20, 512), cipher(4096, 8), cfg(mode)).unwrap();
            copy.write_at(4096, &data, WriteFlags::empty()).unwrap();
            let c = CryptConfig { submit_from_crypt_cpus: true, ..cfg(mode) };
            let scratch = CryptTarget::new(MemDevice::new(1 << 20, 512), cipher(4096, 8), c).unwrap();
            let mut buf = data.clone();
            scratch.write_at_scratch(4096, &mut buf, WriteFlags::empty()).unwrap();
            assert_eq!(copy.inner().to_vec(), scratch.inner().to_vec(), "{mode:?}");
            let mut back = vec![0u8; data.len()];
            scratch.read_at(4096, &mut back).unwrap();
            assert_eq!(back, data);
        }
    }

    #[test]
    fn ciphertext_differs_from_plaintext() {
        let t =
            CryptTarget::new(MemDevice::new(1 << 16, 512), cipher(512, 0), CryptConfig::default()).unwrap();
        let data = vec![0x55u8; 4096];
        t.write_at(0, &data, WriteFlags::empty()).unwrap();
        assert_ne!(&t.inner().to_vec()[..4096], &data[..]);
    }

    #[test]
    fn device_smaller_than_offset_is_refused() {
        let e = CryptTarget::new(
            MemDevice::new(4096, 512),
            cipher(512, 0),
            CryptConfig { offset: 8192, ..CryptConfig::default() },
        )
        .unwrap_err();
        assert!(matches!(e, CryptError::Empty { .. }), "{e}");
        let e = CryptTarget::new(
            MemDevice::new(16384, 512),
            cipher(512, 0),
            CryptConfig { offset: 8192, len: Some(16384), ..CryptConfig::default() },
        )
        .unwrap_err();
        assert!(matches!(e, CryptError::DeviceTooSmall { .. }), "{e}");
    }

    #[test]
    fn misaligned_offset_and_length_are_refused() {
        let e = CryptTarget::new(
            MemDevice::new(1 << 16, 4096),
            cipher(512, 0),
            CryptConfig { offset: 512, ..CryptConfig::default() },
        )
        .unwrap_err();
        assert!(matches!(e, CryptError::MisalignedOffset { .. }), "{e}");
        let e = CryptTarget::new(
            MemDevice::new(1 << 16, 512),
            cipher(4096, 0),
            CryptConfig { len: Some(4096 + 512), ..CryptConfig::default() },
        )
        .unwrap_err();
        assert!(matches!(e, CryptError::MisalignedLength { .. }), "{e}");
    }

    #[test]
    fn misaligned_and_out_of_range_requests_fail_and_change_nothing() {
        let t =
            CryptTarget::new(MemDevice::new(1 << 16, 512), cipher(4096, 0), CryptConfig::default()).unwrap();
        let before = t.inner().to_vec();
        let mut b = vec![0u8; 4096];
        assert_eq!(t.read_at(512, &mut b).unwrap_err().kind(), BlockErrorKind::Misaligned);
        assert_eq!(
            t.write_at(0, &b[..512], WriteFlags::empty()).unwrap_err().kind(),
            BlockErrorKind::Misaligned
        );
        assert_eq!(
            t.write_at(1 << 16, &b, WriteFlags::empty()).unwrap_err().kind(),
            BlockErrorKind::OutOfRange
        );
        assert_eq!(
            t.write_at(u64::MAX - 4095, &b, WriteFlags::empty()).unwrap_err().kind(),
            BlockErrorKind::OutOfRange
        );
        assert_eq!(t.inner().to_vec(), before);
    }

    #[test]
    fn discard_passes_through_only_when_allowed() {
        let t =
            CryptTarget::new(MemDevice::new(1 << 16, 512), cipher(512, 0), CryptConfig::default()).unwrap();
        assert!(!t.caps().contains(Caps::DISCARD));
        assert_eq!(t.discard(0, 4096).unwrap_err().kind(), BlockErrorKind::Unsupported);
        let t = CryptTarget::new(
            MemDevice::new(1 << 16, 512),
            cipher(512, 0),
            CryptConfig { allow_discards: true, ..CryptConfig::default() },
        )
        .unwrap();
        assert!(t.caps().contains(Caps::DISCARD));
        t.write_at(0, &[0xaa; 8192], WriteFlags::empty()).unwrap();
        t.discard(0, 4096).unwrap();
        let raw = t.inner().to_vec();
        assert!(raw[..4096].iter().all(|&b| b == 0), "discard reached the backing device");
        assert!(raw[4096..8192].iter().any(|&b| b != 0));
    }

    #[test]
    fn write_zeroes_stores_encrypted_zeroes() {
        let t =
            CryptTarget::new(MemDevice::new(1 << 16, 512), cipher(512, 8), CryptConfig::default()).unwrap();
        t.write_at(0, &[0xaa; 8192], WriteFlags::empty()).unwrap();
        t.write_zeroes(0, 8192, blockdev::ZeroFlags::MAY_UNMAP).unwrap();
        let mut back = vec![1u8; 8192];
        t.read_at(0, &mut back).unwrap();
        assert!(back.iter().all(|&b| b == 0));
        let mut expected = vec![0u8; 8192];
        cipher(512, 8).encrypt(0, &mut expected).unwrap();
        assert_eq!(&t.inner().to_vec()[..8192], &expected[..]);
    }

    #[test]
    fn read_only_refuses_writes() {
        let t = CryptTarget::new(
            MemDevice::new(1 << 16, 512),
            cipher(512, 0),
            CryptConfig { read_only: true, allow_discards: true, ..CryptConfig::default() },
        )
        .unwrap();
        assert!(t.caps().contains(Caps::READ_ONLY));
        assert_eq!(
            t.write_at(0, &[0; 512], WriteFlags::empty()).unwrap_err().kind(),
            BlockErrorKind::ReadOnly
        );
        assert_eq!(t.discard(0, 512).unwrap_err().kind(), BlockErrorKind::ReadOnly);
        assert_eq!(
            t.write_zeroes(0, 512, blockdev::ZeroFlags::empty()).unwrap_err().kind(),
            BlockErrorKind::ReadOnly
        );
    }

    #[test]
    fn concurrent_writers_to_disjoint_ranges() {
        let t = Arc::new(
            CryptTarget::new(MemDevice::new(4 << 20, 512), cipher(4096, 0), CryptConfig::default()).unwrap(),
        );
        std::thread::scope(|s| {
            for i in 0..8u8 {
                let t = &t;
                s.spawn(move || {
                    let data = pattern(512 * 1024, i);
                    t.write_at(u64::from(i) * 512 * 1024, &data, WriteFlags::empty()).unwrap();
                });
            }
        });
        for i in 0..8u8 {
            let mut back = vec![0u8; 512 * 1024];
            t.read_at(u64::from(i) * 512 * 1024, &mut back).unwrap();
            assert_eq!(back, pattern(512 * 1024, i));
        }
    }

    #[test]
    fn debug_shows_no_key_material() {
        let t =
            CryptTarget::new(MemDevice::new(1 << 16, 512), cipher(512, 0), CryptConfig::default()).unwrap();
        let d = format!("{t:?}");
        assert!(!d.contains("0, 1, 2, 3, 4, 5"), "{d}");
    }
}
