//! `sealdisk benchmark`: in-memory throughput of the primitives, like `cryptsetup benchmark`.
//!
//! * Ciphers: encrypt and decrypt a 1 MiB buffer in place, in 64 KiB requests, for each
//!   cipher × mode × key size of `cryptsetup benchmark`'s table, then every other cipher
//!   sealdisk has ([`default_ciphers`]), at one sector size (512 by default). One thread:
//!   this is per-core speed.
//! * Tag hashes (dm-integrity `internal_hash`): one tag per 4096-byte block.
//! * PBKDF2-SHA256: iterations per second for a 256-bit derived key (LUKS keyslots).
//!
//! Rates are per second of this thread's CPU time (`/proc/thread-self/schedstat`), so time
//! slices lost to other load on a shared machine do not count; wall time where that file
//! is missing. Figures are the best of three short runs.

use std::fmt::Write as _;
use std::time::{Duration, Instant};

use hmac::{KeyInit, Mac};
use serde::Serialize;
use sha2::Sha256;

use sector_crypto::{CipherSpec, SectorCipher, SectorParams, VolumeKey};

use crate::BenchError;

/// `cryptsetup benchmark`'s cipher table, in its order: (cipher-mode, key bits).
pub const CRYPTSETUP_CIPHERS: &[(&str, u32)] = &[
    ("aes-cbc", 128),
    ("serpent-cbc", 128),
    ("twofish-cbc", 128),
    ("aes-cbc", 256),
    ("serpent-cbc", 256),
    ("twofish-cbc", 256),
    ("aes-xts", 256),
    ("serpent-xts", 256),
    ("twofish-xts", 256),
    ("aes-xts", 512),
    ("serpent-xts", 512),
    ("twofish-xts", 512),
];

/// Every other cipher and mode sealdisk has, after cryptsetup's table: (cipher-mode, key bits).
pub const MORE_CIPHERS: &[(&str, u32)] = &[
    ("aes-xts", 384),
    ("aes-lrw", 384),
    ("aes-ctr", 256),
    ("aes-pcbc", 256),
    ("camellia-cbc", 256),
    ("camellia-xts", 512),
    ("cast6-cbc", 256),
    ("cast6-xts", 512),
    ("sm4-cbc", 128),
    ("sm4-xts", 256),
    ("serpent-lrw", 384),
    ("twofish-lrw", 384),
    ("cast5-cbc", 128),
    ("blowfish-cbc", 256),
    ("des3_ede-cbc", 192),
    // Wide-block modes (a sector is one block): one 256-bit key each.
    ("xchacha12,aes-adiantum", 256),
    ("xchacha20,aes-adiantum", 256),
    ("aes-hctr2", 256),
];

/// The default cipher rows: [`CRYPTSETUP_CIPHERS`] then [`MORE_CIPHERS`].
pub fn default_ciphers() -> Vec<(String, u32)> {
    CRYPTSETUP_CIPHERS.iter().chain(MORE_CIPHERS).map(|&(c, k)| (c.to_string(), k)).collect()
}

/// The dm-crypt spec measured for a benchmark name: `cipher-mode` gets cryptsetup's
/// benchmark IV (`plain64`; ECB none); a full spec is taken as it is.
pub fn bench_spec(name: &str) -> String {
    match name.matches('-').count() {
        1 if name.ends_with("-ecb") => name.to_string(),
        1 => format!("{name}-plain64"),
        _ => name.to_string(),
    }
}
/// Tag hashes measured: (name, keyed).
pub const HASHES: &[(&str, bool)] = &[("crc32c", false), ("sha256", false), ("hmac-sha256", true)];

const BUF: usize = 1 << 20;
const REQUEST: usize = 64 << 10;

/// One cipher's result.
#[derive(Debug, Clone, Serialize)]
pub struct CipherResult {
    /// Cipher spec.
    pub cipher: String,
    /// Key bits.
    pub key_bits: u32,
    /// Sector size.
    pub sector_size: u32,
    /// Implementation that ran.
    pub implementation: String,
    /// Encryption, bytes per CPU-second.
    pub encrypt_bytes_per_s: f64,
    /// Decryption, bytes per CPU-second.
    pub decrypt_bytes_per_s: f64,
}

/// One hash's result.
#[derive(Debug, Clone, Serialize)]
pub struct HashResult {
    /// Hash name.
    pub hash: String,
    /// Block size hashed per tag.
    pub block: u32,
    /// Bytes per CPU-second.
    pub bytes_per_s: f64,
}

/// All results.
#[derive(Debug, Clone, Serialize)]
pub struct MicroReport {
    /// PBKDF2-SHA256 iterations per second (256-bit key).
    pub pbkdf2_sha256_iterations_per_s: f64,
    /// Ciphers.
    pub ciphers: Vec<CipherResult>,
    /// Tag hashes.
    pub hashes: Vec<HashResult>,
}

/// CPU time of the calling thread.
fn thread_cpu() -> Option<Duration> {
    let s = std::fs::read_to_string("/proc/thread-self/schedstat").ok()?;
    Some(Duration::from_nanos(s.split_whitespace().next()?.parse().ok()?))
}

/// Runs `f` (which returns the units it did) repeatedly for about `dur`; units per
/// CPU-second, best of three.
fn rate(dur: Duration, mut f: impl FnMut() -> u64) -> f64 {
    let mut best = 0.0f64;
    for _ in 0..3 {
        let (c0, t0) = (thread_cpu(), Instant::now());
        let mut units = 0u64;
        while t0.elapsed() < dur {
            units += f();
        }
        let secs = match (c0, thread_cpu()) {
            (Some(a), Some(b)) if b > a => (b - a).as_secs_f64(),
            _ => t0.elapsed().as_secs_f64(),
        };
        best = best.max(units as f64 / secs);
    }
    best
}

/// PBKDF2-HMAC-SHA256 (RFC 8018), one output block.
pub fn pbkdf2_sha256(password: &[u8], salt: &[u8], iterations: u32) -> [u8; 32] {
    let prf = <hmac::Hmac<Sha256> as KeyInit>::new_from_slice(password).expect("HMAC takes any key length");
    let mut m = prf.clone();
    m.update(salt);
    m.update(&1u32.to_be_bytes());
    let mut u: [u8; 32] = m.finalize().into_bytes().into();
    let mut t = u;
    for _ in 1..iterations {
        let mut m = prf.clone();
        m.update(&u);
        u = m.finalize().into_bytes().into();
        for (a, b) in t.iter_mut().zip(u.iter()) {
            *a ^= b;
        }
    }
    t
}

/// Measures everything with the default cipher rows at 512-byte sectors, `per_test` of CPU
/// per run (three runs each).
pub fn run(per_test: Duration) -> Result<MicroReport, BenchError> {
    run_selected(per_test, &default_ciphers(), 512)
}

/// Measures `ciphers` ((name, key bits); names as in [`bench_spec`]) at `sector` bytes per
/// crypto sector, the tag hashes and PBKDF2.
pub fn run_selected(
    per_test: Duration,
    ciphers_in: &[(String, u32)],
    sector: u32,
) -> Result<MicroReport, BenchError> {
    let pbkdf2 = rate(per_test, || {
        std::hint::black_box(pbkdf2_sha256(b"sealdisk benchmark", b"0123456789abcdef0123456789abcdef", 4096));
        4096
    });
    let mut ciphers = Vec::new();
    let mut buf = vec![0u8; BUF];
    crate::rng::SplitMix64::new(1).fill(&mut buf);
    for (name, bits) in ciphers_in {
        let (name, bits) = (name.as_str(), *bits);
        let full = bench_spec(name);
        let spec: CipherSpec = full.parse().map_err(|e| BenchError::setup(format!("cipher {name}"), e))?;
        let key = VolumeKey::new((0..bits / 8).map(|i| i as u8 ^ 0x5a).collect());
        let params = SectorParams { sector_size: sector, iv_offset: 0, iv_large_sectors: false };
        let c = SectorCipher::new(&spec, &key, params)
            .map_err(|e| BenchError::setup(format!("cipher {name}"), e))?;
        let per_req = (REQUEST / 512) as u64;
        // One 64 KiB request per call, walking the buffer: a short `per_test` (tests) costs a
        // few requests, not whole megabytes, of the slowest ciphers.
        let mut next = 0usize;
        let mut pass = |encrypt: bool| {
            rate(per_test, || {
                let i = next % (BUF / REQUEST);
                next += 1;
                let req = &mut buf[i * REQUEST..(i + 1) * REQUEST];
                let r = if encrypt {
                    c.encrypt(i as u64 * per_req, req)
                } else {
                    c.decrypt(i as u64 * per_req, req)
                };
                r.expect("aligned requests");
                REQUEST as u64
            })
        };
        let enc = pass(true);
        let dec = pass(false);
        ciphers.push(CipherResult {
            cipher: full.clone(),
            key_bits: bits,
            sector_size: sector,
            implementation: c.implementation().into(),
            encrypt_bytes_per_s: enc,
            decrypt_bytes_per_s: dec,
        });
    }
    let mut hashes = Vec::new();
    for &(name, keyed) in HASHES {
        let key = [0x33u8; 32];
        let h = sector_crypto::tag::TagHash::new(name, keyed.then_some(&key[..]))
            .map_err(|e| BenchError::setup(format!("hash {name}"), e))?;
        let mut out = vec![0u8; h.digest_size()];
        let block = 4096usize;
        let bps = rate(per_test, || {
            for (i, b) in buf.chunks(block).enumerate() {
                h.compute(None, i as u64 * 8, b, &mut out);
            }
            BUF as u64
        });
        hashes.push(HashResult { hash: name.into(), block: block as u32, bytes_per_s: bps });
    }
    Ok(MicroReport { pbkdf2_sha256_iterations_per_s: pbkdf2, ciphers, hashes })
}

/// cryptsetup's layout.
pub fn text(r: &MicroReport) -> String {
    let mib = |b: f64| b / 1048576.0;
    let mut s = String::new();
    let _ =
        writeln!(s, "# Tests are approximate using memory only (no storage IO), one thread, per CPU-second.");
    let _ = writeln!(
        s,
        "PBKDF2-sha256    {:>10.0} iterations per second for 256-bit key",
        r.pbkdf2_sha256_iterations_per_s
    );
    let sectors: Vec<String> = {
        let mut v: Vec<u32> = r.ciphers.iter().map(|c| c.sector_size).collect();
        v.dedup();
        v.iter().map(|n| n.to_string()).collect()
    };
    let _ = writeln!(
        s,
        "#     Algorithm |       Key |      Encryption |      Decryption   (sector {} B; implementation)",
        sectors.join("/")
    );
    for c in &r.ciphers {
        let _ = writeln!(
            s,
            "{:>15} {:>10}b {:>11.1} MiB/s {:>11.1} MiB/s   {}",
            table_name(&c.cipher),
            c.key_bits,
            mib(c.encrypt_bytes_per_s),
            mib(c.decrypt_bytes_per_s),
            c.implementation
        );
    }
    let _ = writeln!(s, "#      Tag hash | Block |   Throughput");
    for h in &r.hashes {
        let _ = writeln!(s, "{:>15} {:>7} {:>9.1} MiB/s", h.hash, h.block, mib(h.bytes_per_s));
    }
    s
}

/// `serpent-xts-plain64` → `serpent-xts` (cryptsetup's table shows cipher and mode only);
/// other IVs stay, so two rows never look alike.
fn table_name(spec: &str) -> &str {
    spec.strip_suffix("-plain64").unwrap_or(spec)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn pbkdf2_matches_rfc7914_vectors() {
        // RFC 7914 §11: PBKDF2-HMAC-SHA256("passwd", "salt", 1, 64) — first 32 bytes.
        let d = pbkdf2_sha256(b"passwd", b"salt", 1);
        assert_eq!(
            d.iter().map(|b| format!("{b:02x}")).collect::<String>(),
            "55ac046e56e3089fec1691c22544b605f94185216dde0465e68b9d57c20dacbc"
        );
        // Widely published: PBKDF2-HMAC-SHA256("password", "salt", 4096, 32).
        let d = pbkdf2_sha256(b"password", b"salt", 4096);
        assert_eq!(
            d.iter().map(|b| format!("{b:02x}")).collect::<String>(),
            "c5e478d59288c841aa530db6845c4c8d962893a001ce4e11a4963873aa98134a"
        );
    }

    #[test]
    fn a_quick_run_covers_every_case() {
        let r = run(Duration::from_millis(1)).unwrap();
        assert_eq!(r.ciphers.len(), CRYPTSETUP_CIPHERS.len() + MORE_CIPHERS.len());
        assert_eq!(r.hashes.len(), HASHES.len());
        assert!(r.ciphers.iter().all(|c| c.encrypt_bytes_per_s > 0.0 && c.decrypt_bytes_per_s > 0.0));
        assert!(r.pbkdf2_sha256_iterations_per_s > 0.0);
        let t = text(&r);
        assert!(t.contains("PBKDF2-sha256") && t.contains("hmac-sha256"));
        // cryptsetup's header and rows, then every other cipher.
        assert!(t.contains("#     Algorithm |       Key |      Encryption |      Decryption"), "{t}");
        for (name, bits) in default_ciphers() {
            let row = format!("{name:>15} {bits:>10}b ");
            assert!(t.contains(&row), "no row {row:?} in\n{t}");
        }
        assert!(t.contains("des3_ede-cbc") && t.contains("rustcrypto cbc(des3_ede)"), "{t}");
        assert!(t.contains("rustcrypto adiantum(xchacha12,aes)"), "{t}");
        assert!(t.contains("rustcrypto hctr2(aes256)"), "{t}");
    }
}
