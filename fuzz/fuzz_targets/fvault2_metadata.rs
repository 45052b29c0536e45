//! The FileVault2 (Core Storage) decoders: volume header, disk label, volume groups
//! descriptor, decrypted metadata blocks and their plists (`formats::fuzzing::fvault2_metadata`).
//! Oracle: no panic; what decodes is consistent (see the harness).
#![no_main]

use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| formats::fuzzing::fvault2_metadata(data));
