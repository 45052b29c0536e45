//! A whole NBD connection from bytes: the real server (fixed-newstyle handshake, every
//! option, then transmission requests and payloads) over a socket pair, against a 1 MiB
//! writable and a 64 KiB read-only in-memory export (`nbd::fuzzing`). Oracle: no panic, no
//! hang (libFuzzer's -timeout), no allocation beyond -rss_limit_mb; the server always
//! sends its greeting.
#![no_main]

use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| {
    let out = nbd::fuzzing::run_session(data).expect("socket pair and threads");
    assert_eq!(out.get(..8), Some(&nbd::wire::NBDMAGIC.to_be_bytes()[..]));
});
