//! The `nbd::wire` decoders (option header, NBD_OPT_INFO/GO data, request header, reply
//! chunk header) on arbitrary bytes. Oracle: no panic; what decodes re-encodes to the same
//! bytes.
#![no_main]

use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| nbd::fuzzing::decode_all(data));
