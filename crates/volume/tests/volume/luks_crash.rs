//! Crash consistency of LUKS header updates: every keyslot add, kill and change, and UUID
//! change, is rerun with the power lost at each flush (testkit::CrashDevice), and with the
//! disk cache having written back a random subset of the unflushed blocks. After the
//! "reboot" the header must load (old or new state, never neither), the untouched
//! passphrase must still open, and the changed keyslot must be wholly old or wholly new.

use std::time::Duration;

use blockdev::{BlockDevice, MemDevice};
use sector_crypto::kdf::{HashAlg, Passphrase};
use testkit::CrashDevice;
use volume::luks::{self, FormatParams, Luks, LuksError, LuksVersion, PbkdfParams, PbkdfType};

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

/// A formatted image with "keep" in slot 0 and "victim" in slot 1.
fn base(version: LuksVersion) -> Vec<u8> {
    let dev = MemDevice::new(20 << 20, 512);
    let p = FormatParams { version, pbkdf: pbkdf(), ..FormatParams::default() };
    let (mut l, vk) = luks::format(&dev, &p, &pass("keep")).unwrap();
    l.add_keyslot(&dev, &vk, &pass("victim"), Some(1), &pbkdf()).unwrap();
    dev.to_vec()
}

/// Whether `p` opens keyslot `slot` (`None`: the slot is gone or holds something else).
fn opens(l: &Luks, dev: &dyn BlockDevice, p: &str, slot: u32) -> bool {
    match l.unlock(dev, &pass(p), Some(slot)) {
        Ok(_) => true,
        Err(LuksError::WrongPassphrase | LuksError::KeyslotInactive(_)) => false,
        Err(e) => panic!("unexpected error: {e:?}"),
    }
}

/// Runs `op` at every crash point; `check` judges each rebooted image.
fn at_every_flush(image: &[u8], op: impl Fn(&CrashDevice), check: impl Fn(&MemDevice, &str)) {
    let probe = CrashDevice::from_vec(image.to_vec(), 512);
    op(&probe);
    let flushes = probe.flushes();
    assert!(flushes >= 2, "the operation should flush at least twice, got {flushes}");
    check(&probe.crash(), "no crash");
    for n in 1..=flushes {
        let dev = CrashDevice::from_vec(image.to_vec(), 512).crash_at_flush(n);
        op(&dev);
        check(&dev.crash(), &format!("crash at flush {n}"));
        for seed in 0..3 {
            check(&dev.crash_keeping_some(seed), &format!("crash at flush {n}, cache seed {seed}"));
        }
    }
}

fn load_after(dev: &MemDevice, when: &str) -> Luks {
    Luks::load(dev, true).unwrap_or_else(|e| panic!("{when}: header does not load: {e:?}"))
}

#[test]
fn crash_during_keyslot_add_leaves_old_or_new() {
    for v in [LuksVersion::V1, LuksVersion::V2] {
        let image = base(v);
        let vk = {
            let d = MemDevice::from_vec(image.clone(), 512);
            Luks::load(&d, false).unwrap().unlock(&d, &pass("keep"), None).unwrap().1
        };
        at_every_flush(
            &image,
            |dev| {
                let mut l = Luks::load(dev, true).unwrap();
                let _ = l.add_keyslot(dev, &vk, &pass("added"), Some(2), &pbkdf());
            },
            |dev, when| {
                let l = load_after(dev, when);
                assert!(opens(&l, dev, "keep", 0), "{v:?} {when}: slot 0 lost");
                assert!(opens(&l, dev, "victim", 1), "{v:?} {when}: slot 1 lost");
                let listed = l.active_keyslots().contains(&2);
                assert_eq!(listed, opens(&l, dev, "added", 2), "{v:?} {when}: slot 2 half-added");
            },
        );
    }
}

#[test]
fn crash_during_keyslot_kill_leaves_old_or_new() {
    for v in [LuksVersion::V1, LuksVersion::V2] {
        at_every_flush(
            &base(v),
            |dev| {
                let mut l = Luks::load(dev, true).unwrap();
                let _ = l.kill_keyslot(dev, 1);
            },
            |dev, when| {
                let l = load_after(dev, when);
                assert!(opens(&l, dev, "keep", 0), "{v:?} {when}: slot 0 lost");
                // Slot 1 is listed or not; if listed its material may already be wiped
                // (cryptsetup wipes first), so all that is required is a loadable header.
                let _ = opens(&l, dev, "victim", 1);
            },
        );
    }
}

#[test]
fn crash_during_passphrase_change_keeps_one_of_them() {
    for v in [LuksVersion::V1, LuksVersion::V2] {
        let image = base(v);
        let vk = {
            let d = MemDevice::from_vec(image.clone(), 512);
            Luks::load(&d, false).unwrap().unlock(&d, &pass("victim"), None).unwrap().1
        };
        at_every_flush(
            &image,
            |dev| {
                let mut l = Luks::load(dev, true).unwrap();
                let _ = l.change_keyslot(dev, 1, &vk, &pass("changed"), &pbkdf());
            },
            |dev, when| {
                let l = load_after(dev, when);
                assert!(opens(&l, dev, "keep", 0), "{v:?} {when}: slot 0 lost");
                let old = l.unlock(dev, &pass("victim"), None).is_ok();
                let new = l.unlock(dev, &pass("changed"), None).is_ok();
                assert!(old || new, "{v:?} {when}: neither the old nor the new passphrase opens");
            },
        );
    }
}

#[test]
fn crash_during_luks2_uuid_change_gives_old_or_new_uuid() {
    let image = base(LuksVersion::V2);
    let old = Luks::load(&MemDevice::from_vec(image.clone(), 512), false).unwrap().uuid().to_owned();
    let new = "11111111-2222-3333-4444-555555555555";
    at_every_flush(
        &image,
        |dev| {
            let mut l = Luks::load(dev, true).unwrap();
            let _ = l.set_uuid(dev, Some(new));
        },
        |dev, when| {
            let l = load_after(dev, when);
            assert!(l.uuid() == old || l.uuid() == new, "{when}: uuid {}", l.uuid());
            assert!(opens(&l, dev, "keep", 0), "{when}: slot 0 lost");
        },
    );
}

/// A write or flush that fails part-way through a keyslot add (each one in turn, and a disk
/// that dies for good) returns an error, leaves a header that loads with the old keyslots,
/// and leaves the in-memory header unchanged.
#[test]
fn failed_write_during_keyslot_add_is_an_error_and_leaves_a_usable_header() {
    use testkit::{Fault, FaultDevice, OpKinds};
    for v in [LuksVersion::V1, LuksVersion::V2] {
        let image = base(v);
        let vk = {
            let d = MemDevice::from_vec(image.clone(), 512);
            Luks::load(&d, false).unwrap().unlock(&d, &pass("keep"), None).unwrap().1
        };
        let count = FaultDevice::new(MemDevice::from_vec(image.clone(), 512));
        let mut l = Luks::load(&count, true).unwrap();
        let before = count.ops();
        l.add_keyslot(&count, &vk, &pass("added"), Some(2), &pbkdf()).unwrap();
        let ops = count.ops() - before;
        for n in 1..=ops {
            for dead in [false, true] {
                let f = if dead { Fault::from_nth(n) } else { Fault::nth(n) };
                let dev = FaultDevice::new(MemDevice::from_vec(image.clone(), 512));
                let mut l = Luks::load(&dev, true).unwrap();
                dev.inject(f.only(OpKinds::WRITE | OpKinds::FLUSH));
                if l.add_keyslot(&dev, &vk, &pass("added"), Some(2), &pbkdf()).is_ok() {
                    continue; // the n-th op was a read
                }
                assert!(!l.active_keyslots().contains(&2), "{v:?} op {n}: in-memory header changed");
                dev.clear();
                let after = Luks::load(dev.inner(), false).unwrap_or_else(|e| panic!("{v:?} op {n}: {e:?}"));
                assert!(opens(&after, dev.inner(), "keep", 0), "{v:?} op {n}: slot 0 lost");
            }
        }
    }
}
