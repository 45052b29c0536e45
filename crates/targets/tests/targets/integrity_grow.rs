//! Growing a dm-integrity volume (grow.rs): the superblock is marked before the device
//! grows, the next open writes the new size and recalculates the new area; or the new
//! area is wiped. Old data must verify afterwards, the new area must read (as zeroes)
//! without integrity errors, and a power loss at any flush of the grow must lose nothing.

use crate::integrity_common;

use std::sync::Arc;

use blockdev::{BlockDevice, MemDevice, WriteFlags};
use integrity_common::{pattern, Shape};
use targets::integrity::{IntegrityError, IntegrityTarget, Mode};
use testkit::CrashDevice;

const OLD: u64 = 1 << 20;
const NEW: u64 = 2 << 20;

/// A formatted `OLD`-byte volume holding a pattern in its first 256 KiB; returns the image.
fn volume_with_data(shape: &Shape, mode: Mode) -> (Vec<u8>, Vec<u8>) {
    let dev = shape.mem(OLD);
    let data = pattern(256 << 10, 7);
    let t = shape.open(dev.clone(), mode);
    t.write_at(0, &data, WriteFlags::empty()).unwrap();
    t.close().unwrap();
    (dev.to_vec(), data)
}

fn grown(mut image: Vec<u8>) -> Vec<u8> {
    image.resize(NEW as usize, 0);
    image
}

/// Opens `image`, checks the old data and that every sector past it reads as zeroes
/// without an integrity error; returns the provided size.
fn check(shape: &Shape, mode: Mode, image: Vec<u8>, data: &[u8], what: &str) -> u64 {
    let t = IntegrityTarget::open(MemDevice::from_vec(image, 512), shape.config(mode))
        .unwrap_or_else(|e| panic!("{what}: open: {e}"));
    t.wait_recalculated();
    let size = t.geometry().size;
    let mut buf = vec![0u8; data.len()];
    t.read_at(0, &mut buf).unwrap_or_else(|e| panic!("{what}: old data: {e}"));
    assert!(buf == data, "{what}: old data changed");
    let mut rest = vec![0u8; (size - data.len() as u64) as usize];
    t.read_at(data.len() as u64, &mut rest).unwrap_or_else(|e| panic!("{what}: past the old data: {e}"));
    assert!(rest.iter().all(|&b| b == 0), "{what}: the rest is not zeroes");
    assert_eq!(t.status().mismatches, 0, "{what}");
    t.close().unwrap();
    size / 512
}

fn provided(shape: &Shape, mode: Mode, image: Vec<u8>) -> (u64, Option<u64>) {
    let t = IntegrityTarget::open(MemDevice::from_vec(image, 512), shape.config(mode)).unwrap();
    let s = t.superblock();
    (
        s.provided_data_sectors,
        s.flags.has(formats::integrity::SbFlags::RECALCULATING).then_some(s.recalc_sector),
    )
}

/// Opens `image` (which may need recalculation), lets it finish, closes: the image after.
fn settle(shape: &Shape, mode: Mode, image: Vec<u8>) -> Vec<u8> {
    let dev = Arc::new(MemDevice::from_vec(image, 512));
    let t = IntegrityTarget::open(dev.clone(), shape.config(mode)).unwrap();
    t.wait_recalculated();
    t.close().unwrap();
    dev.to_vec()
}

fn grow_recalculates_the_new_area(shape: Shape, mode: Mode) {
    let (image, data) = volume_with_data(&shape, mode);
    let (old_provided, _) = provided(&shape, mode, image.clone());
    let dev = Arc::new(MemDevice::from_vec(image.clone(), 512));
    let from = IntegrityTarget::prepare_grow(&dev, &shape.config(mode)).unwrap();
    assert_eq!(from, old_provided);
    let marked = dev.to_vec();
    // Marked, not grown: the volume opens at its old size and has nothing to recalculate.
    assert_eq!(check(&shape, mode, marked.clone(), &data, "marked"), old_provided);
    // Without the mark (the kernel's bare reload), the new area fails its checks.
    {
        let t = IntegrityTarget::open(MemDevice::from_vec(grown(image), 512), shape.config(mode)).unwrap();
        let mut buf = vec![0u8; 4096];
        let off = old_provided * 512 + 64 * 1024;
        assert!(t.read_at(off, &mut buf).is_err(), "an unmarked new area reads without error");
        t.abandon();
    }
    // Grown: the open writes the new size and recalculates from the old end; reads there
    // succeed even before it got to them.
    let dev = Arc::new(MemDevice::from_vec(grown(marked), 512));
    let t = IntegrityTarget::open(dev.clone(), shape.config(mode)).unwrap();
    let new_provided = t.superblock().provided_data_sectors;
    assert!(new_provided > old_provided, "{new_provided} <= {old_provided}");
    let mut buf = vec![0u8; 4096];
    t.read_at(new_provided * 512 - 4096, &mut buf).unwrap();
    t.wait_recalculated();
    t.close().unwrap();
    let grown_image = dev.to_vec();
    assert_eq!(check(&shape, mode, grown_image.clone(), &data, "grown"), new_provided);
    let (p, recalc) = provided(&shape, mode, grown_image);
    assert_eq!(p, new_provided);
    assert_eq!(recalc, Some(new_provided), "recalculation finished at the end");
}

#[test]
fn grow_recalculates_the_new_area_in_every_mode() {
    grow_recalculates_the_new_area(Shape::new("crc32c", 512), Mode::Journal);
    grow_recalculates_the_new_area(Shape::new("crc32c", 512), Mode::Direct);
    grow_recalculates_the_new_area(Shape::new("crc32c", 512), Mode::Bitmap);
    grow_recalculates_the_new_area(Shape::new("sha256", 4096), Mode::Journal);
    let mut s = Shape::new("crc32c", 512);
    s.interleave = 64;
    grow_recalculates_the_new_area(s, Mode::Journal);
}

#[test]
fn a_keyed_hash_is_refused_recalculation_and_wipes_instead() {
    let shape = Shape::new("hmac-sha256", 4096);
    let mode = Mode::Journal;
    let (image, data) = volume_with_data(&shape, mode);
    let dev = Arc::new(MemDevice::from_vec(image.clone(), 512));
    let e = IntegrityTarget::prepare_grow(&dev, &shape.config(mode)).unwrap_err();
    assert!(matches!(e, IntegrityError::RecalculateRefused), "{e}");
    assert_eq!(
        e.to_string(),
        "Setting recalculate flag is not supported, you may consider using --wipe instead."
    );
    assert!(dev.to_vec() == image, "a refused grow changed the device");
    // --wipe: grow, open, wipe the new area.
    let (old_provided, _) = provided(&shape, mode, image.clone());
    let dev = Arc::new(MemDevice::from_vec(grown(image), 512));
    let t = IntegrityTarget::open(dev.clone(), shape.config(mode)).unwrap();
    let new_provided = t.superblock().provided_data_sectors;
    t.wipe_range(old_provided, new_provided).unwrap();
    t.close().unwrap();
    assert_eq!(check(&shape, mode, dev.to_vec(), &data, "wiped"), new_provided);
    // With a keyed journal MAC the kernel allows it (FIXED_HMAC).
    let mut shape = Shape::new("hmac-sha256", 4096);
    shape.journal_mac = Some(("hmac-sha256", (100..132u8).collect()));
    let (image, data) = volume_with_data(&shape, mode);
    let dev = Arc::new(MemDevice::from_vec(image, 512));
    IntegrityTarget::prepare_grow(&dev, &shape.config(mode)).unwrap();
    let img = settle(&shape, mode, grown(dev.to_vec()));
    check(&shape, mode, img, &data, "keyed with journal mac");
}

/// A power loss at every flush of the grow: step 1 (the mark, on the old-size device) and
/// step 3 (open of the grown device, recalculation, close). The reboot finds the old data
/// intact, and the volume opens and reads all of its sectors without errors.
fn crash_at_every_flush(shape: Shape, mode: Mode) {
    let (image, data) = volume_with_data(&shape, mode);
    let cfg = shape.config(mode);
    // Pass 1: count the flushes of each step.
    let probe = Arc::new(CrashDevice::from_vec(image.clone(), 512));
    IntegrityTarget::prepare_grow(&probe, &cfg).unwrap();
    let marked = probe.live_image();
    let f1 = probe.flushes();
    let probe = Arc::new(CrashDevice::from_vec(grown(marked.clone()), 512));
    let t = IntegrityTarget::open(probe.clone(), cfg.clone()).unwrap();
    t.wait_recalculated();
    t.close().unwrap();
    let f2 = probe.flushes();
    assert!(f1 >= 1 && f2 >= 2, "flushes: {f1}, {f2}");
    for n in 1..=f1 {
        let dev = Arc::new(CrashDevice::from_vec(image.clone(), 512).crash_at_flush(n));
        let _ = IntegrityTarget::prepare_grow(&dev, &cfg);
        // The grow stopped here: the file never grew.
        let what = format!("{mode:?} crash at mark flush {n}/{f1}");
        check(&shape, mode, dev.crash().to_vec(), &data, &what);
    }
    for n in 1..=f2 {
        let dev = Arc::new(CrashDevice::from_vec(grown(marked.clone()), 512).crash_at_flush(n));
        let t = IntegrityTarget::open(dev.clone(), cfg.clone()).unwrap();
        t.wait_recalculated();
        t.abandon();
        let what = format!("{mode:?} crash at grow flush {n}/{f2}");
        check(&shape, mode, dev.crash().to_vec(), &data, &what);
        check(&shape, mode, dev.crash_keeping_some(n).to_vec(), &data, &format!("{what} (+cache)"));
    }
}

#[test]
fn a_crash_at_every_flush_of_a_grow_loses_nothing() {
    crash_at_every_flush(Shape::new("crc32c", 512), Mode::Journal);
    crash_at_every_flush(Shape::new("crc32c", 512), Mode::Bitmap);
    crash_at_every_flush(Shape::new("crc32c", 512), Mode::Direct);
}
