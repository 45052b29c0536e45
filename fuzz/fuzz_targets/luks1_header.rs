//! The LUKS1 phdr decoder on arbitrary bytes (`formats::fuzzing::luks1_header`). Oracle: no
//! panic, and a decoded header re-encodes to bytes that decode to the same header.
#![no_main]

use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| formats::fuzzing::luks1_header(data));
