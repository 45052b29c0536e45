//! Crash consistency of `convert` (LUKS1 ⇄ LUKS2): the conversion is rerun with the power
//! lost at each of its flushes (testkit::CrashDevice). After the "reboot" the header must
//! load as LUKS1 or LUKS2, both passphrases must open it and give the same volume key, and
//! the data area must be untouched.
//!
//! With a volatile cache that writes back an arbitrary subset of a step's blocks, the step
//! that moves key material (one flush) is the one that may leave neither layout: the test
//! runs that model too, asserts that every other crash point survives it, and counts the
//! move step's losses (documented in `volume/src/luks/convert.rs`).

use std::time::Duration;

use blockdev::MemDevice;
use sector_crypto::kdf::{HashAlg, Passphrase};
use testkit::CrashDevice;
use volume::luks::{self, FormatParams, Luks, LuksVersion, PbkdfParams, PbkdfType};

const BLOCK: u32 = 4096;

fn pass(s: &str) -> Passphrase {
    Passphrase::new(s.as_bytes().to_vec())
}

fn pbkdf() -> PbkdfParams {
    PbkdfParams {
        kind: Some(PbkdfType::Pbkdf2),
        hash: HashAlg::Sha256,
        iter_time: Duration::from_millis(10),
        force_iterations: Some(1000),
        memory_kib: None,
        parallel: None,
    }
}

/// A formatted image with "first" in slot 0 and "second" in slot 3, a pattern in the data
/// area, and its volume key.
fn base(version: LuksVersion) -> (Vec<u8>, Vec<u8>) {
    let dev = MemDevice::new(20 << 20, BLOCK);
    let p = FormatParams { version, pbkdf: pbkdf(), ..FormatParams::default() };
    let (mut l, vk) = luks::format(&dev, &p, &pass("first")).unwrap();
    l.add_keyslot(&dev, &vk, &pass("second"), Some(3), &pbkdf()).unwrap();
    let mut image = dev.to_vec();
    let data = l.segment().unwrap().offset as usize;
    for (i, b) in image[data..].iter_mut().enumerate() {
        *b = (i % 251) as u8;
    }
    (image, vk.as_bytes().to_vec())
}

/// Whether `dev` holds a LUKS header both passphrases open to `vk`, with the data intact;
/// the version found, or why not.
fn check(dev: &MemDevice, vk: &[u8], data_from: usize) -> Result<LuksVersion, String> {
    let l = Luks::load(dev, true).map_err(|e| format!("does not load: {e:?}"))?;
    for (p, slot) in [("first", 0), ("second", 3)] {
        let (_, key) = l.unlock(dev, &pass(p), Some(slot)).map_err(|e| format!("{p}: {e:?}"))?;
        if key.as_bytes() != vk {
            return Err(format!("{p}: another volume key"));
        }
    }
    let image = dev.to_vec();
    if image[data_from..].iter().enumerate().any(|(i, b)| *b != (i % 251) as u8) {
        return Err("data area changed".into());
    }
    Ok(l.version())
}

fn convert(dev: &CrashDevice, to: LuksVersion) {
    let Ok(mut l) = Luks::load(dev, true) else { return };
    // After the power loss the device fails every write: the conversion stops there.
    let _ = l.convert(dev, to);
}

fn crash_test(from: LuksVersion, to: LuksVersion, move_flush: u64) {
    let (image, vk) = base(from);
    let data_from =
        Luks::load(&MemDevice::from_vec(image.clone(), BLOCK), false).unwrap().segment().unwrap().offset;
    let probe = CrashDevice::from_vec(image.clone(), BLOCK);
    convert(&probe, to);
    assert_eq!(check(&probe.crash(), &vk, data_from as usize), Ok(to), "no crash");
    let flushes = probe.flushes();
    assert!(flushes >= 2, "{from:?} → {to:?} flushes {flushes} times");
    let mut torn = 0;
    for n in 1..=flushes {
        let dev = CrashDevice::from_vec(image.clone(), BLOCK).crash_at_flush(n).failing_after_crash();
        convert(&dev, to);
        let v = check(&dev.crash(), &vk, data_from as usize);
        assert!(v == Ok(from) || v == Ok(to), "{from:?} → {to:?}, crash at flush {n}: {v:?}");
        for seed in 0..8 {
            match check(&dev.crash_keeping_some(seed), &vk, data_from as usize) {
                Ok(v) => assert!(v == from || v == to),
                Err(e) if n == move_flush => {
                    torn += 1;
                    eprintln!(
                        "{from:?} → {to:?}: crash at the key-material move (flush {n}), seed {seed}: {e}"
                    );
                }
                Err(e) => panic!("{from:?} → {to:?}, crash at flush {n}, cache seed {seed}: {e}"),
            }
        }
    }
    eprintln!("{from:?} → {to:?}: {flushes} flushes; {torn} of 8 partial write-backs of the move step lost the header");
}

#[test]
fn crash_during_luks1_to_luks2_leaves_a_volume_that_opens() {
    crash_test(LuksVersion::V1, LuksVersion::V2, 1);
}

#[test]
fn crash_during_luks2_to_luks1_leaves_a_volume_that_opens() {
    crash_test(LuksVersion::V2, LuksVersion::V1, 2);
}

#[test]
fn refusals_write_nothing() {
    // A 4096-byte sector LUKS2 volume cannot become LUKS1.
    let dev = MemDevice::new(20 << 20, BLOCK);
    let p = FormatParams {
        version: LuksVersion::V2,
        sector_size: 4096,
        pbkdf: pbkdf(),
        ..FormatParams::default()
    };
    let (mut l, _) = luks::format(&dev, &p, &pass("first")).unwrap();
    let before = dev.to_vec();
    let e = l.convert(&dev, LuksVersion::V1).unwrap_err().to_string();
    assert!(e.contains("sector size is not 512 bytes"), "{e}");
    assert!(dev.to_vec() == before);
    // Same version.
    let e = l.convert(&dev, LuksVersion::V2).unwrap_err().to_string();
    assert_eq!(e, "Device is already LUKS2 type.");
    // A LUKS1 volume whose data starts right after its keyslots has no room to grow.
    let dev = MemDevice::new(20 << 20, BLOCK);
    let p = FormatParams {
        version: LuksVersion::V1,
        offset: Some(4040),
        pbkdf: pbkdf(),
        ..FormatParams::default()
    };
    let (mut l, _) = luks::format(&dev, &p, &pass("first")).unwrap();
    let before = dev.to_vec();
    let e = l.convert(&dev, LuksVersion::V2).unwrap_err().to_string();
    assert_eq!(e, "Unable to move keyslot area. Not enough space.");
    assert!(dev.to_vec() == before);
}
