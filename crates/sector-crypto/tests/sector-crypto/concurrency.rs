//! One `SectorCipher` shared by many threads gives the same bytes as one thread.

use crate::common;

use std::sync::Arc;

use common::reference::pattern;
use sector_crypto::{CipherSpec, SectorCipher, SectorParams, VolumeKey};

fn assert_send_sync<T: Send + Sync>() {}

#[test]
fn sector_cipher_is_send_and_sync() {
    assert_send_sync::<SectorCipher>();
    assert_send_sync::<CipherSpec>();
    assert_send_sync::<VolumeKey>();
}

#[test]
fn many_threads_match_one_thread() {
    const THREADS: usize = 8;
    const ROUNDS: usize = 200;
    for (spec, klen, ss) in [
        ("aes-xts-plain64", 64, 4096),
        ("aes-xts-plain64", 32, 512),
        ("aes-cbc-essiv:sha256", 32, 512),
        ("aes-cbc-eboiv", 16, 4096),
    ] {
        let spec_p: CipherSpec = spec.parse().unwrap();
        let p = SectorParams { sector_size: ss, iv_offset: 0, iv_large_sectors: false };
        let c = Arc::new(SectorCipher::new(&spec_p, &VolumeKey::new(pattern(klen, 1)), p).unwrap());
        let data = pattern(ss as usize * 16, 2);
        // Expected, single-threaded: request r covers sectors starting at r * step * 16.
        let step = u64::from(ss / 512);
        let expected: Vec<Vec<u8>> = (0..ROUNDS)
            .map(|r| {
                let mut b = data.clone();
                c.encrypt(r as u64 * step * 16, &mut b).unwrap();
                b
            })
            .collect();
        std::thread::scope(|s| {
            for t in 0..THREADS {
                let c = Arc::clone(&c);
                let (data, expected) = (&data, &expected);
                s.spawn(move || {
                    for i in 0..ROUNDS {
                        let r = (i * 7 + t * 13) % ROUNDS;
                        let mut b = data.clone();
                        c.encrypt(r as u64 * step * 16, &mut b).unwrap();
                        assert!(b == expected[r], "{spec} thread {t} request {r}: encrypt differs");
                        c.decrypt(r as u64 * step * 16, &mut b).unwrap();
                        assert!(&b == data, "{spec} thread {t} request {r}: decrypt differs");
                    }
                });
            }
        });
    }
}
