//! Single-thread sector encryption throughput, per spec, key size, sector size and provider.
//!
//! `cargo run --release -p sector-crypto --example throughput [seconds-per-case]`
//!
//! Each case encrypts (then decrypts) a 1 MiB buffer in place, one `encrypt` call per 64 KiB
//! request, and reports GB/s (10^9 bytes/s) per second of this thread's CPU time (from
//! `/proc/thread-self/schedstat`, so time slices lost to other load on a shared machine do not
//! count; wall time where that file is missing): the best of 5 runs.

use std::time::{Duration, Instant};

use sector_crypto::{CipherSpec, Provider, SectorCipher, SectorParams, VolumeKey};

const BUF: usize = 1 << 20;
const REQUEST: usize = 64 << 10;

/// CPU time of the calling thread in seconds, if the kernel exposes it.
fn thread_cpu_secs() -> Option<f64> {
    let s = std::fs::read_to_string("/proc/thread-self/schedstat").ok()?;
    let ns: u64 = s.split_whitespace().next()?.parse().ok()?;
    Some(ns as f64 / 1e9)
}

fn rate(c: &SectorCipher, buf: &mut [u8], encrypt: bool, dur: Duration) -> f64 {
    let step = u64::from(c.sector_size() / 512);
    let per_req = (REQUEST / c.sector_size() as usize) as u64 * step;
    let cpu0 = thread_cpu_secs();
    let start = Instant::now();
    let mut bytes = 0u64;
    while start.elapsed() < dur {
        for (i, req) in buf.chunks_mut(REQUEST).enumerate() {
            let sector = i as u64 * per_req;
            if encrypt {
                c.encrypt(sector, req).expect("encrypt");
            } else {
                c.decrypt(sector, req).expect("decrypt");
            }
        }
        bytes += buf.len() as u64;
    }
    let secs = match (cpu0, thread_cpu_secs()) {
        (Some(a), Some(b)) if b > a => b - a,
        _ => start.elapsed().as_secs_f64(),
    };
    bytes as f64 / secs / 1e9
}

fn best(v: impl Iterator<Item = f64>) -> f64 {
    v.fold(0.0, f64::max)
}

fn main() {
    let secs: f64 = std::env::args().nth(1).and_then(|s| s.parse().ok()).unwrap_or(0.2);
    let dur = Duration::from_secs_f64(secs);
    let cases: &[(&str, usize)] = &[
        ("aes-xts-plain64", 64),
        ("aes-xts-plain64", 32),
        ("aes-cbc-essiv:sha256", 32),
        ("aes-cbc-plain64", 32),
        ("aes-cbc-eboiv", 32),
    ];
    println!(
        "{:<22} {:>4} {:>5} {:<24} {:>9} {:>9}",
        "spec", "key", "sect", "implementation", "enc GB/s", "dec GB/s"
    );
    let mut buf: Vec<u8> = (0..BUF).map(|i| (i * 7) as u8).collect();
    for &(spec, klen) in cases {
        let spec_p: CipherSpec = spec.parse().expect("spec");
        let key = VolumeKey::new((0..klen).map(|i| (i * 37 + 11) as u8).collect());
        for ss in [512u32, 4096] {
            for provider in [Provider::Auto, Provider::RustCrypto] {
                let p = SectorParams { sector_size: ss, iv_offset: 0, iv_large_sectors: false };
                let c = SectorCipher::with_provider(&spec_p, &key, p, provider).expect("cipher");
                if provider == Provider::RustCrypto && c.implementation().starts_with("rustcrypto") {
                    // Auto already measured this implementation unless it picked aws-lc.
                    let auto = SectorCipher::new(&spec_p, &key, p).expect("cipher");
                    if auto.implementation() == c.implementation() {
                        continue;
                    }
                }
                let enc = best((0..5).map(|_| rate(&c, &mut buf, true, dur)));
                let dec = best((0..5).map(|_| rate(&c, &mut buf, false, dur)));
                println!(
                    "{:<22} {:>4} {:>5} {:<50} {:>9.2} {:>9.2}",
                    spec,
                    klen * 8,
                    ss,
                    c.implementation(),
                    enc,
                    dec
                );
            }
        }
    }
}
