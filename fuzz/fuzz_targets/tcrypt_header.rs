//! The decrypted TrueCrypt/VeraCrypt header decoder and the layout computed from it, on
//! arbitrary bytes (`formats::fuzzing::tcrypt_header`). Oracle: no panic, a decoded header
//! re-encodes to bytes that decode to the same header, and no layout leaves the device.
#![no_main]

use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| formats::fuzzing::tcrypt_header(data));
