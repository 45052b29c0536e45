//! Hostile images (issue 10), library level: a LUKS header that asks for a huge KDF cost, a
//! huge key or stripe count is refused by `Luks::unlock` before any derivation runs, with an
//! error naming the field, the value, the bound and the option that lifts it; the device is
//! left byte for byte as it was. The bounds are in `formats::limits`.
//!
//! Before the bounds, each of these unlocks either ran a KDF for hours (PBKDF2 with
//! 2^32 − 1 iterations, Argon2 with time 2^32 − 1), or asked the allocator for terabytes
//! (Argon2 memory 4 TiB), or for an AF merge sized by the header.

use std::time::{Duration, Instant};

use blockdev::{BlockDevice, MemDevice, WriteFlags};
use formats::limits::{self, KdfLimits, LimitError};
use formats::luks2::{self, WriteStep};
use sector_crypto::kdf::{HashAlg, Passphrase};
use volume::luks::{self, FormatParams, Luks, LuksError, LuksHeader, LuksVersion, PbkdfParams, PbkdfType};

fn pass() -> Passphrase {
    Passphrase::new(b"hostile".to_vec())
}

fn formatted(version: LuksVersion) -> MemDevice {
    let kind = if version == LuksVersion::V1 { PbkdfType::Pbkdf2 } else { PbkdfType::Argon2id };
    let pbkdf = PbkdfParams {
        kind: Some(kind),
        hash: HashAlg::Sha256,
        iter_time: Duration::from_millis(10),
        force_iterations: Some(if kind == PbkdfType::Pbkdf2 { 1000 } else { 4 }),
        memory_kib: Some(32),
        parallel: Some(1),
    };
    let dev = MemDevice::new(20 << 20, 512);
    luks::format(&dev, &FormatParams { version, pbkdf, ..FormatParams::default() }, &pass()).unwrap();
    dev
}

fn bytes(dev: &MemDevice) -> Vec<u8> {
    let mut b = vec![0u8; dev.geometry().size as usize];
    dev.read_at(0, &mut b).unwrap();
    b
}

/// Rewrites the LUKS2 header after `f` changed its metadata (both copies, as cryptsetup would).
fn mangle_luks2(dev: &MemDevice, f: impl FnOnce(&mut luks2::Luks2Metadata)) {
    let l = Luks::load(dev, false).unwrap();
    let LuksHeader::V2(mut s) = l.header else { panic!("not LUKS2") };
    f(&mut s.header.metadata);
    let plan = s.header.write_plan(s.header.seqid + 1, &s.salts).unwrap();
    for step in &plan.steps {
        if let WriteStep::Write { offset, bytes } = step {
            dev.write_at(*offset, bytes, WriteFlags::empty()).unwrap();
        }
    }
}

/// Patches a big-endian u32 of the LUKS1 phdr.
fn patch_luks1(dev: &MemDevice, off: usize, v: u32) {
    let mut b = vec![0u8; 1024];
    dev.read_at(0, &mut b).unwrap();
    b[off..off + 4].copy_from_slice(&v.to_be_bytes());
    dev.write_at(0, &b, WriteFlags::empty()).unwrap();
}

/// Unlocks with `limits`; the error must be a `Limit` and come quickly (nothing derived),
/// and the device must be unchanged.
fn refused(dev: &MemDevice, limits: &KdfLimits) -> LimitError {
    let before = bytes(dev);
    let l = Luks::load(dev, false).unwrap();
    let start = Instant::now();
    let r = l.unlock_with(dev, &pass(), None, limits);
    // Generous: a refused header costs microseconds; a derivation it asked for, hours.
    assert!(start.elapsed() < Duration::from_secs(10), "took {:?}", start.elapsed());
    assert_eq!(bytes(dev), before, "the image was written to");
    match r {
        Err(LuksError::Limit(e)) => e,
        other => panic!("expected a limit error, got {:?}", other.map(|(s, _)| s)),
    }
}

fn set_kdf(m: &mut luks2::Luks2Metadata, kdf: luks2::Kdf) {
    m.keyslots.get_mut(&0).unwrap().kdf = Some(kdf);
}

fn argon2(time: u32, memory: u32, cpus: u32) -> luks2::Kdf {
    luks2::Kdf::Argon2 { id: true, time, memory, cpus, salt: vec![7; 32] }
}

#[test]
fn luks2_huge_argon2_memory_is_refused_even_with_the_bounds_lifted() {
    let dev = formatted(LuksVersion::V2);
    mangle_luks2(&dev, |m| set_kdf(m, argon2(4, u32::MAX, 1)));
    for lim in [KdfLimits::default(), KdfLimits::unbounded()] {
        let e = refused(&dev, &lim);
        assert_eq!(e, LimitError::Argon2Memory { what: "LUKS2 keyslot 0".into(), memory_kib: u32::MAX });
        let m = e.to_string();
        assert!(m.contains("4294967295") && m.contains("4194304"), "{m}");
    }
}

#[test]
fn luks2_huge_argon2_time_is_refused_and_names_the_option() {
    let dev = formatted(LuksVersion::V2);
    mangle_luks2(&dev, |m| set_kdf(m, argon2(u32::MAX, 1 << 20, 4)));
    let e = refused(&dev, &KdfLimits::default());
    assert!(matches!(e, LimitError::Argon2Cost { time: u32::MAX, memory_kib: 1048576, .. }), "{e:?}");
    assert!(e.to_string().contains("--max-argon2-cost"), "{e}");
    // Small memory, huge time: still huge work.
    mangle_luks2(&dev, |m| set_kdf(m, argon2(u32::MAX, 32, 1)));
    assert!(matches!(refused(&dev, &KdfLimits::default()), LimitError::Argon2Cost { .. }));
}

#[test]
fn luks2_huge_argon2_lanes_are_refused() {
    let dev = formatted(LuksVersion::V2);
    mangle_luks2(&dev, |m| set_kdf(m, argon2(4, 1 << 20, 1 << 20)));
    assert!(matches!(refused(&dev, &KdfLimits::default()), LimitError::Argon2Lanes { .. }));
}

#[test]
fn luks2_huge_pbkdf2_iterations_are_refused_and_lifted_by_the_option() {
    let dev = formatted(LuksVersion::V2);
    mangle_luks2(&dev, |m| {
        set_kdf(m, luks2::Kdf::Pbkdf2 { hash: "sha256".into(), iterations: u32::MAX, salt: vec![7; 32] })
    });
    let e = refused(&dev, &KdfLimits::default());
    assert_eq!(
        e,
        LimitError::Pbkdf2Iterations {
            what: "LUKS2 keyslot 0".into(),
            iterations: u32::MAX,
            max: limits::DEFAULT_MAX_PBKDF2_ITERATIONS
        }
    );
    assert!(e.to_string().contains("--max-pbkdf2-iterations 4294967295"), "{e}");
    // A raised bound below the value still refuses; the check is the option's, not a constant.
    let lim = KdfLimits { max_pbkdf2_iterations: u32::MAX - 1, ..KdfLimits::default() };
    assert!(matches!(refused(&dev, &lim), LimitError::Pbkdf2Iterations { max, .. } if max == u32::MAX - 1));
}

#[test]
fn luks2_huge_digest_iterations_are_refused_before_the_keyslot_kdf_runs() {
    let dev = formatted(LuksVersion::V2);
    mangle_luks2(&dev, |m| {
        for d in m.digests.values_mut() {
            d.pbkdf2.as_mut().unwrap().iterations = u32::MAX;
        }
    });
    let e = refused(&dev, &KdfLimits::default());
    assert!(matches!(&e, LimitError::Pbkdf2Iterations { what, .. } if what.contains("digest")), "{e:?}");
}

#[test]
fn luks2_stripes_other_than_4000_are_refused() {
    let dev = formatted(LuksVersion::V2);
    for stripes in [u32::MAX, 4001, 0] {
        mangle_luks2(&dev, |m| m.keyslots.get_mut(&0).unwrap().af.as_mut().unwrap().stripes = stripes);
        assert_eq!(
            refused(&dev, &KdfLimits::unbounded()),
            LimitError::Stripes { what: "keyslot 0".into(), stripes }
        );
    }
}

#[test]
fn luks1_huge_pbkdf2_iterations_are_refused() {
    let dev = formatted(LuksVersion::V1);
    // keyblock[0].passwordIterations at 208 + 4.
    patch_luks1(&dev, 212, u32::MAX);
    let e = refused(&dev, &KdfLimits::default());
    assert!(
        matches!(&e, LimitError::Pbkdf2Iterations { what, iterations: u32::MAX, .. } if what == "LUKS1 keyslot 0")
    );
    assert!(e.to_string().contains("--max-pbkdf2-iterations"), "{e}");
}

#[test]
fn luks1_huge_digest_iterations_are_refused() {
    let dev = formatted(LuksVersion::V1);
    // mkDigestIterations at 164.
    patch_luks1(&dev, 164, u32::MAX);
    let e = refused(&dev, &KdfLimits::default());
    assert!(matches!(&e, LimitError::Pbkdf2Iterations { what, .. } if what.contains("mkDigestIterations")));
    // --volume-key-file path: the digest is bounded there too.
    let l = Luks::load(&dev, false).unwrap();
    let vk = sector_crypto::VolumeKey::new(vec![0; 64]);
    assert!(matches!(l.verify_volume_key(&vk), Err(LuksError::Limit(_))));
}

#[test]
fn legitimate_costs_within_the_bounds_still_unlock() {
    for v in [LuksVersion::V1, LuksVersion::V2] {
        let dev = formatted(v);
        let l = Luks::load(&dev, false).unwrap();
        l.unlock(&dev, &pass(), None).unwrap();
        l.unlock_with(&dev, &pass(), Some(0), &KdfLimits::unbounded()).unwrap();
    }
}

#[test]
fn luks2_huge_header_size_is_refused_at_load() {
    let dev = formatted(LuksVersion::V2);
    let before = bytes(&dev);
    // hdr_size (be64 at 8) of both copies: the JSON area read is sized by it.
    let mut img = before.clone();
    for copy in [0usize, 16384] {
        img[copy + 8..copy + 16].copy_from_slice(&u64::MAX.to_be_bytes());
    }
    let hostile = MemDevice::from_vec(img.clone(), 512);
    let start = Instant::now();
    assert!(matches!(Luks::load(&hostile, true), Err(LuksError::Luks2(_))));
    assert!(start.elapsed() < Duration::from_secs(10));
    assert_eq!(bytes(&hostile), img, "a refused load wrote to the image");
    // (config.keyslots_size and json_size above cryptsetup's limits: luks2_malformed.rs.)
}
