//! A hostile dm-integrity image opened by `targets::integrity::IntegrityTarget` on a 256 KiB
//! in-memory device (`targets::fuzzing::integrity_open`): superblock checks, layout, journal
//! replay or dirty-bitmap recalculation into memory, then reads. Oracle: no panic, no hang,
//! no allocation beyond -rss_limit_mb.
#![no_main]

use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| {
    targets::fuzzing::integrity_open(data);
});
