//! Inputs that broke a decoder under the fuzzer (`fuzz/`), kept as ordinary tests: each file
//! of `tests/data/fuzz/` goes through the fuzz target's function again, and each bug has a
//! test of its own named after it.

use std::path::Path;

use formats::fuzzing;
use formats::integrity::{DeviceParams, Layout, LayoutError, Superblock};

fn data(name: &str) -> Vec<u8> {
    std::fs::read(Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/data/fuzz").join(name)).unwrap()
}

/// `Layout::open` computed byte addresses as `sectors * 512` for devices whose size in bytes
/// does not fit a u64 (a `DeviceParams` of more than 2^55 sectors with a `start` near the
/// end): "attempt to multiply with overflow" in `tag_location`. Such a device is now refused.
#[test]
fn integrity_layout_of_a_device_beyond_2_64_bytes_overflowed() {
    let input = data("integrity-layout-huge-device.bin");
    fuzzing::integrity_superblock(&input);

    let sb = Superblock::decode(&input[..4096]).unwrap();
    let mut dev = DeviceParams::new(u64::MAX >> 8);
    dev.start = u64::MAX >> 10;
    assert_eq!(Layout::open(&sb, &dev), Err(LayoutError::TooLarge { device_sectors: u64::MAX >> 8 }));
    // The largest addressable device still opens.
    assert!(Layout::open(&sb, &DeviceParams::new(u64::MAX >> 9)).is_ok());
}
