//! What the `integrity_open` fuzz target runs, here so that its committed corpus replays
//! through the same code on stable (`tests/fuzz_corpus.rs`). Not part of the supported API.

use blockdev::{BlockDevice, MemDevice};
use formats::integrity::superblock::SB_AREA_BYTES;
use formats::integrity::{Mode, SbFlags, Superblock};
use sector_crypto::tag::TagHash;

use crate::integrity::{IntegrityConfig, IntegrityTarget};

/// Size of the device the image is opened on.
pub const DEVICE_SIZE: u64 = 256 << 10;

/// `integrity_open`: a hostile dm-integrity image, opened. `data` is the start of the
/// device (superblock, journal or bitmap, tags, data), on a 256 KiB in-memory device whose
/// remaining bytes are zero. The table is derived from the superblock so that inputs get
/// past the checks that compare the two (tag size, block size, journal MAC): crc32c as the
/// internal hash, hmac(sha256) with a fixed key as the journal MAC when the superblock says
/// it has one; the mode is J, or B / R when byte 4095 (beyond the struct, ignored by the
/// kernel) is 1 / 2. The open replays the journal (or reads the bitmap and recalculates
/// dirty regions) into the in-memory device; then the first and last blocks are read.
/// Oracle: no panic, no hang, bounded memory; every error is an `Err`. Returns whether the
/// image opened.
pub fn integrity_open(data: &[u8]) -> bool {
    let mut img = data.to_vec();
    img.resize(DEVICE_SIZE as usize, 0);
    let dev = MemDevice::from_vec(img, 512);

    let mode = match data.get(SB_AREA_BYTES - 1) {
        Some(1) => Mode::Bitmap,
        Some(2) => Mode::Recovery,
        _ => Mode::Journal,
    };
    let Ok(hash) = TagHash::new("crc32c", None) else { return false };
    let mut cfg = IntegrityConfig::new(mode, Some(hash));
    if let Ok(sb) = Superblock::decode(data) {
        cfg.tag_size = Some(u32::from(sb.integrity_tag_size));
        cfg.block_size = sb.block_size();
        if sb.flags.has(SbFlags::HAVE_JOURNAL_MAC) {
            cfg.journal_mac = TagHash::new("hmac(sha256)", Some(&[0x4b; 32])).ok();
        }
    }
    // No background threads: no commit or bitmap timer, no recalculation.
    cfg.commit_time_ms = 0;
    cfg.bitmap_flush_interval_ms = 0;
    cfg.read_only = true;
    cfg.metadata_cache_bytes = 1 << 20;
    let Ok(target) = IntegrityTarget::open(dev, cfg) else { return false };
    let g = target.geometry();
    let block = g.logical_block as usize;
    if g.size >= block as u64 {
        let mut buf = vec![0u8; block];
        let _ = target.read_at(0, &mut buf);
        let _ = target.read_at(g.size - block as u64, &mut buf);
    }
    target.abandon();
    true
}
