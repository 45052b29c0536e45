//! The BitLocker volume header, FVE metadata and .BEK decoders on arbitrary bytes
//! (`formats::fuzzing::bitlk_metadata`). Oracle: no panic.
#![no_main]

use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| formats::fuzzing::bitlk_metadata(data));
