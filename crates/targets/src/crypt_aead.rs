//! `AeadCryptTarget`: dm-crypt with authenticated encryption (`integrity:<n>:aead`) over a
//! device that stores a tag per sector ([`TaggedDevice`], i.e. dm-integrity without an
//! internal hash): the data path of LUKS2 authenticated encryption.
//!
//! ```text
//!   read_at(off, buf)                          write_at(off, buf)
//!     next.read_tagged(off, buf, tuples)         copy → encrypt in place, one tuple per sector
//!     decrypt + verify every sector              next.write_tagged(off, ciphertext, tuples)
//!       │ a tag fails: re-read once (the kernel's aead_recheck), verify again
//!       │ still failing: log "integrity AEAD error, sector N", IntegrityMismatch (EIO/EILSEQ),
//!       │ the buffer is zeroed: unverified data is never returned
//!   TaggedDevice (IntegrityTarget, no internal hash; tag size = tuple size,
//!                 integrity block size = crypt sector size)
//! ```
//!
//! It is a separate type from [`crate::CryptTarget`] so the plain dm-crypt hot path pays
//! nothing for AEAD. Crypto placement is plain dm-crypt's, by the same engine
//! (`placement.rs`): `CryptConfig::{read_mode, write_mode}` and `same_cpu_crypt`, over
//! 64 KiB chunks of data with their tuples beside them. It matters most for HMAC-SHA256,
//! whose ~1.3 GB/s per core would otherwise cap a single large read.
//!
//! Sector numbers in the AAD are relative to this target (dm-crypt's `dm_target_offset`), not
//! to the device below: `CryptConfig::offset` moves the ciphertext, not the AAD. Discards are
//! refused (cryptsetup does not allow them with AEAD: a discarded sector would have no valid
//! tag); `write_zeroes` writes encrypted zeroes with fresh tags.

use std::fmt;
use std::sync::atomic::{AtomicU64, Ordering};

use blockdev::{BlockDevice, BlockError, BlockErrorKind, BlockResult, Caps, Geometry, WriteFlags};
use sector_crypto::{AeadSectorCipher, CryptoError};

use crate::crypt::CryptError;
use crate::integrity::TaggedDevice;
use crate::placement::{self, Policy};
use crate::CryptConfig;

/// The AEAD dm-crypt target over a tagged device `next`.
pub struct AeadCryptTarget<D> {
    next: D,
    cipher: AeadSectorCipher,
    offset: u64,
    read_only: bool,
    read: Policy,
    write: Policy,
    geometry: Geometry,
    /// Reads that failed authentication after the re-read.
    failures: AtomicU64,
}

impl<D: TaggedDevice> fmt::Debug for AeadCryptTarget<D> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        // The cipher's Debug shows only its shape, never key material.
        f.debug_struct("AeadCryptTarget")
            .field("geometry", &self.geometry)
            .field("cipher", &self.cipher)
            .field("offset", &self.offset)
            .field("next", &self.next)
            .finish()
    }
}

impl<D: TaggedDevice> AeadCryptTarget<D> {
    /// Stacks an AEAD crypt layer over `next`. `cfg.offset`, `cfg.len`, `cfg.read_only`, the
    /// placement modes and `same_cpu_crypt` apply as for [`crate::CryptTarget`]
    /// (`submit_from_crypt_cpus` is ignored: the tagged write is submitted from the request
    /// thread), and `cfg.allow_discards` is refused.
    ///
    /// Like the kernel's `crypt_integrity_ctr`, the device's tag block size must equal the
    /// cipher's sector size and its tag size must equal the cipher's tuple size.
    pub fn new(next: D, cipher: AeadSectorCipher, cfg: CryptConfig) -> Result<Self, CryptError> {
        if cfg.allow_discards {
            return Err(CryptError::DiscardsWithAead);
        }
        let sector_size = cipher.sector_size();
        if next.tag_block_size() != sector_size as usize {
            return Err(CryptError::TagBlockSizeMismatch {
                device_block: next.tag_block_size(),
                sector_size,
            });
        }
        if next.tag_size() != cipher.tuple_size() {
            return Err(CryptError::TagSizeMismatch {
                device_tag: next.tag_size(),
                spec: *cipher.spec(),
                tuple: cipher.tuple_size(),
            });
        }
        let below = next.geometry();
        let ss = u64::from(sector_size);
        if !cfg.offset.is_multiple_of(ss.max(u64::from(below.logical_block))) {
            return Err(CryptError::MisalignedOffset {
                offset: cfg.offset,
                block: sector_size.max(below.logical_block),
            });
        }
        let available = below.size.saturating_sub(cfg.offset);
        let len = match cfg.len {
            Some(len) => {
                let needed = cfg.offset.saturating_add(len);
                if needed > below.size {
                    return Err(CryptError::DeviceTooSmall { size: below.size, needed, offset: cfg.offset });
                }
                if !len.is_multiple_of(ss) {
                    return Err(CryptError::MisalignedLength { len, sector_size });
                }
                len
            }
            None => available - available % ss,
        };
        if len == 0 {
            return Err(CryptError::Empty { size: below.size, offset: cfg.offset });
        }
        let block = sector_size.max(below.logical_block);
        let geometry = Geometry {
            size: len - len % u64::from(block),
            logical_block: block,
            physical_block: below.physical_block.max(block),
        };
        Ok(AeadCryptTarget {
            next,
            cipher,
            offset: cfg.offset,
            read_only: cfg.read_only,
            read: Policy::new(cfg.read_mode).same_cpu(cfg.same_cpu_crypt),
            write: Policy::new(cfg.write_mode).same_cpu(cfg.same_cpu_crypt),
            geometry,
            failures: AtomicU64::new(0),
        })
    }

    /// The device below.
    pub fn inner(&self) -> &D {
        &self.next
    }

    /// Reads that failed authentication (after the re-read) since the target was built.
    pub fn auth_failures(&self) -> u64 {
        self.failures.load(Ordering::Relaxed)
    }

    fn tuples_for(&self, len: usize) -> Vec<u8> {
        vec![0u8; len / self.cipher.sector_size() as usize * self.cipher.tuple_size()]
    }

    fn crypt_err(e: CryptoError) -> BlockError {
        BlockError::new(BlockErrorKind::InvalidArgument, "authenticated sector encryption failed")
            .with_source(e)
    }

    fn check_writable(&self) -> BlockResult<()> {
        if self.read_only {
            Err(BlockError::read_only())
        } else {
            Ok(())
        }
    }

    /// Encrypts `data` (target offset `off`) in place and writes it with its tuples.
    fn seal_and_write(&self, off: u64, data: &mut [u8], flags: WriteFlags) -> BlockResult<()> {
        let mut tuples = self.tuples_for(data.len());
        let (chunk, tchunk) = self.chunks();
        let sector0 = off / 512;
        placement::run_paired(self.write, &mut *data, chunk, &mut tuples[..], tchunk, |o, d, t| {
            self.cipher.encrypt(sector0 + (o / 512) as u64, d, t)
        })
        .map_err(Self::crypt_err)?;
        self.next.write_tagged(self.offset + off, data, &tuples, flags)
    }

    /// Verifies and decrypts `buf` (target offset `off`) with `tuples`, where the read mode
    /// says. On failure the error of the lowest failing chunk (its first bad sector).
    fn open_all(&self, off: u64, buf: &mut [u8], tuples: &[u8]) -> Result<(), CryptoError> {
        let (chunk, tchunk) = self.chunks();
        let sector0 = off / 512;
        placement::run_paired(self.read, buf, chunk, tuples, tchunk, |o, d, t| {
            self.cipher.decrypt(sector0 + (o / 512) as u64, d, t)
        })
    }

    /// Bytes of data and of tuples per chunk.
    fn chunks(&self) -> (usize, usize) {
        let ss = self.cipher.sector_size() as usize;
        let chunk = placement::chunk_len(ss);
        (chunk, chunk / ss * self.cipher.tuple_size())
    }
}

impl<D: TaggedDevice> BlockDevice for AeadCryptTarget<D> {
    fn geometry(&self) -> Geometry {
        self.geometry
    }

    fn caps(&self) -> Caps {
        let below = self.next.caps();
        let mut caps = below & (Caps::FLUSH | Caps::FUA | Caps::READ_ONLY);
        if self.read_only {
            caps |= Caps::READ_ONLY;
        }
        caps
    }

    fn read_at(&self, off: u64, buf: &mut [u8]) -> BlockResult<()> {
        self.geometry.check_range(off, buf.len() as u64)?;
        if buf.is_empty() {
            return Ok(());
        }
        let mut tuples = self.tuples_for(buf.len());
        self.next.read_tagged(self.offset + off, buf, &mut tuples)?;
        let first = match self.open_all(off, buf, &tuples) {
            Ok(()) => return Ok(()),
            Err(CryptoError::AuthFailed { sector }) => sector,
            Err(e) => {
                buf.fill(0);
                return Err(Self::crypt_err(e));
            }
        };
        // The kernel's aead_recheck: the data may have changed under a racing writer (or a
        // transient fault below); read once more before failing the request.
        log::debug!("AEAD tag mismatch at sector {first}: re-reading");
        self.next.read_tagged(self.offset + off, buf, &mut tuples).inspect_err(|_| buf.fill(0))?;
        match self.open_all(off, buf, &tuples) {
            Ok(()) => Ok(()),
            Err(e) => {
                buf.fill(0);
                match e {
                    CryptoError::AuthFailed { sector } => {
                        self.failures.fetch_add(1, Ordering::Relaxed);
                        log::error!("integrity AEAD error, sector {sector}");
                        Err(BlockError::integrity(sector))
                    }
                    e => Err(Self::crypt_err(e)),
                }
            }
        }
    }

    fn write_at(&self, off: u64, buf: &[u8], flags: WriteFlags) -> BlockResult<()> {
        self.check_writable()?;
        self.geometry.check_range(off, buf.len() as u64)?;
        if buf.is_empty() {
            return Ok(());
        }
        let mut data = buf.to_vec();
        self.seal_and_write(off, &mut data, flags)
    }

    fn write_at_scratch(&self, off: u64, buf: &mut [u8], flags: WriteFlags) -> BlockResult<()> {
        self.check_writable()?;
        self.geometry.check_range(off, buf.len() as u64)?;
        if buf.is_empty() {
            return Ok(());
        }
        self.seal_and_write(off, buf, flags)
    }

    fn flush(&self) -> BlockResult<()> {
        self.next.flush()
    }

    fn discard(&self, _off: u64, _len: u64) -> BlockResult<()> {
        Err(BlockError::unsupported("discard with authenticated encryption"))
    }
    // write_zeroes: the trait default writes zero buffers through `write_at`, which encrypts
    // them with fresh tags (zeroes below would not authenticate).
}
