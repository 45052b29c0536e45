//! Growing a volume (`integritysetup resize`, and `sealdisk resize` of an integrity image).
//!
//! The kernel grows a dm-integrity device at a table reload: `dm_integrity_ctr` computes
//! `provided_data_sectors` from the device's size, and `dm_integrity_resume` writes it to
//! the superblock when it changed. Nothing else: the new area's tags are whatever the disk
//! holds, so its reads fail their checks unless something recalculates or writes them —
//! in mode B (Linux 6.1) the resume also sets the new area's bits in the on-disk bitmap.
//! integritysetup 2.6.1's `resize` then either wipes the new area through the device
//! (`--wipe`: zeroes with valid tags) or reloads the table with `recalculate`.
//!
//! Here the same two ways, crash-safe in this order:
//! 1. [`IntegrityTarget::prepare_grow`] on the closed volume, *before* the device grows:
//!    the superblock gets RECALCULATING with `recalc_sector` at the old end (one FUA
//!    write). At that size the mark asks for nothing; once the device grew, every open —
//!    the kernel's or ours — recalculates from there, and reads past it skip the check
//!    (in mode B the kernel sets the bitmap bits from it on).
//! 2. The device grows.
//! 3. An open ([`IntegrityTarget::open`], `resume`) writes the new `provided_data_sectors`;
//!    recalculation runs in the background ([`IntegrityTarget::wait_recalculated`]).
//!
//! With `--wipe` step 1 is skipped and [`IntegrityTarget::wipe_range`] writes the new area
//! after step 3 (integritysetup's order: an interrupted wipe leaves the rest reading as
//! integrity errors until written). That is also the only way for a keyed internal hash
//! the kernel refuses to recalculate ([`Superblock::recalculate_refused`]).
use blockdev::{BlockDevice, BlockError, BlockErrorKind, BlockResult, WriteFlags, ZeroFlags};
use formats::integrity::superblock::{verify_sb_mac, write_sb_mac, SB_AREA_BYTES};
use formats::integrity::{LayoutError, SbCheck, SbFlags, Superblock};

use super::config::io;
use super::{IntegrityConfig, IntegrityError, IntegrityTarget, Mode};

impl<D: BlockDevice + 'static> IntegrityTarget<D> {
    /// Step 1 of a grow (module docs): checks the superblock on the closed device `next`
    /// against `cfg` as an open would, refuses a recalculation the kernel would refuse
    /// ([`IntegrityError::RecalculateRefused`]), and marks the sectors past the current
    /// `provided_data_sectors` for recalculation. Returns that size (the old end).
    pub fn prepare_grow(next: &D, cfg: &IntegrityConfig) -> Result<u64, IntegrityError> {
        let tag_size = match (cfg.tag_size, &cfg.internal_hash) {
            (Some(t), _) => t,
            (None, Some(h)) => h.digest_size() as u32,
            (None, None) => return Err(IntegrityError::TagSizeNeeded),
        };
        let Some(hash) = &cfg.internal_hash else {
            return Err(IntegrityError::NeedsInternalHash { option: "recalculate" });
        };
        if cfg.read_only || cfg.mode == Mode::Recovery {
            return Err(IntegrityError::Io {
                what: "growing the volume",
                source: BlockError::new(BlockErrorKind::ReadOnly, "the volume is opened read-only"),
            });
        }
        let sb_off = cfg.start * 512;
        if sb_off + SB_AREA_BYTES as u64 > next.geometry().size {
            return Err(IntegrityError::Layout(LayoutError::TooSmall {
                device_sectors: next.geometry().size / 512,
            }));
        }
        let mut area = vec![0u8; SB_AREA_BYTES];
        next.read_at(sb_off, &mut area).map_err(io("reading the superblock"))?;
        let mut sb = Superblock::decode(&area).map_err(IntegrityError::Superblock)?;
        sb.check(&SbCheck {
            tag_size,
            block_size: cfg.block_size,
            meta_device: false,
            journal_mac: cfg.journal_mac.is_some(),
        })
        .map_err(IntegrityError::Superblock)?;
        let mac = cfg.journal_mac.as_ref().filter(|_| sb.flags.has(SbFlags::FIXED_HMAC));
        if let Some(m) = mac {
            verify_sb_mac(&area, m.digest_size(), |i| m.mac(i)).map_err(IntegrityError::Superblock)?;
        }
        let keyed_mac = cfg.journal_mac.as_ref().is_some_and(|m| m.algorithm().is_keyed());
        if sb.recalculate_refused(hash.algorithm().is_keyed(), keyed_mac, false) {
            return Err(IntegrityError::RecalculateRefused);
        }
        let old = sb.provided_data_sectors;
        if sb.mark_grow(old) {
            sb.set_version(cfg.mode, false);
            sb.encode_into(&mut area);
            if let Some(m) = mac {
                write_sb_mac(&mut area, m.digest_size(), |i| m.mac(i)).map_err(IntegrityError::Superblock)?;
            }
            next.write_at(sb_off, &area, WriteFlags::FUA).map_err(io("writing the superblock"))?;
            next.flush().map_err(io("flushing the superblock"))?;
        }
        Ok(old)
    }

    /// Writes zeroes with valid tags over `[from, to)` (512-byte sectors of this volume),
    /// then flushes: `integritysetup resize --wipe`'s wipe of the new area.
    pub fn wipe_range(&self, from: u64, to: u64) -> BlockResult<()> {
        let end = to.min(self.inner.geometry.size / 512);
        let chunk = 64u64 << 11;
        let mut s = from;
        while s < end {
            let n = chunk.min(end - s);
            self.write_zeroes(s * 512, n * 512, ZeroFlags::empty())?;
            s += n;
        }
        self.flush()
    }
}
