//! IntegrityTarget engine: round trips in every mode, reopen, corruption detection, RMW and
//! hashing knobs, external tags, poisoning, recalculation, discards.

mod integrity_common;

use std::sync::Arc;

use blockdev::{BlockDevice, BlockErrorKind, MemDevice, WriteFlags};
use integrity_common::{pattern, Shape};
use targets::integrity::{HashMode, IntegrityTarget, Mode, TaggedDevice};

const MODES: [Mode; 3] = [Mode::Journal, Mode::Bitmap, Mode::Direct];

#[test]
fn data_round_trips_and_survives_reopen_in_every_mode() {
    for shape in [Shape::new("crc32c", 512), Shape::new("sha256", 4096), Shape::new("hmac-sha256", 4096)] {
        for mode in MODES {
            let dev = shape.mem(8 << 20);
            let t = shape.open(dev.clone(), mode);
            let size = t.geometry().size;
            let data = pattern(size as usize, 7);
            t.write_at(0, &data, WriteFlags::empty()).unwrap();
            let part = pattern(64 * 1024, 9);
            t.write_at(size / 2, &part, WriteFlags::FUA).unwrap();
            let mut expect = data.clone();
            expect[(size / 2) as usize..(size / 2) as usize + part.len()].copy_from_slice(&part);
            let mut back = vec![0u8; size as usize];
            t.read_at(0, &mut back).unwrap();
            assert!(back == expect, "{} {mode:?}: read after write", shape.alg);
            drop(t);
            let t = shape.open(dev.clone(), mode);
            let mut back = vec![0u8; size as usize];
            t.read_at(0, &mut back).unwrap();
            assert!(back == expect, "{} {mode:?}: read after reopen", shape.alg);
            assert_eq!(t.status().mismatches, 0);
            // Opened again in recovery mode, the data area holds the same.
            drop(t);
            let r = shape.open(dev.clone(), Mode::Recovery);
            let mut back = vec![0u8; size as usize];
            r.read_at(0, &mut back).unwrap();
            assert!(back == expect, "{} {mode:?}: recovery read", shape.alg);
        }
    }
}
