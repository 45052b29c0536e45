//! The dm-integrity journal scan and replay plan over arbitrary journal bytes
//! (`formats::fuzzing::integrity_journal`). Oracle: no panic; replayed entries lie inside
//! the device and have the geometry's sizes.
#![no_main]

use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| formats::fuzzing::integrity_journal(data));
