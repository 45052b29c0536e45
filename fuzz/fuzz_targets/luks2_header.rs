//! The LUKS2 header loader on arbitrary bytes (`formats::fuzzing::luks2_header`, cryptsetup's
//! `crypt2_load_fuzz` counterpart): binary headers, checksums, the JSON metadata and its
//! validation (segments, keyslots, digests, config, areas). Oracle: no panic; whatever loads
//! re-encodes to a header that loads to the same content (the input is also tried as a bare
//! JSON area, since the checksum makes byte-level mutations rarely load).
#![no_main]

use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| formats::fuzzing::luks2_header(data));
