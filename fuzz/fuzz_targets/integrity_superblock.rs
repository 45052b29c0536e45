//! The dm-integrity superblock decoder, its checks, its MAC ranges and the layout derived
//! from it (`formats::fuzzing::integrity_superblock`). Oracle: no panic; a decoded
//! superblock re-encodes to one that decodes the same.
#![no_main]

use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| formats::fuzzing::integrity_superblock(data));
