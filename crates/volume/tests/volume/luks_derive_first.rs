//! Every operation that adds a keyslot derives its key before its first write, so a
//! derivation that fails — or is ended by a signal, which is what the CLI does on
//! SIGINT/SIGTERM — leaves the device as it was. Before this, `luksFormat` wiped and wrote
//! the header before deriving keyslot 0's key, and a LUKS1 `luksChangeKey` with no free
//! slot killed the old keyslot before deriving the new one (a failure lost the passphrase).
//! A KDF parameter the KDF refuses (too few forced iterations) stands in for the
//! interruption here.

use std::time::Duration;

use blockdev::{BlockDevice, MemDevice, WriteFlags};
use sector_crypto::kdf::{HashAlg, Passphrase};
use volume::luks::{self, FormatParams, Luks, LuksVersion, PbkdfParams, PbkdfType};

fn pass(s: &str) -> Passphrase {
    Passphrase::new(s.as_bytes().to_vec())
}

fn pbkdf(iterations: u32) -> PbkdfParams {
    PbkdfParams {
        kind: Some(PbkdfType::Pbkdf2),
        hash: HashAlg::Sha256,
        iter_time: Duration::from_millis(10),
        force_iterations: Some(iterations),
        memory_kib: None,
        parallel: None,
    }
}

fn image(dev: &MemDevice) -> Vec<u8> {
    let mut b = vec![0u8; dev.geometry().size as usize];
    dev.read_at(0, &mut b).unwrap();
    b
}

#[test]
fn format_whose_keyslot_derivation_fails_writes_nothing() {
    for version in [LuksVersion::V1, LuksVersion::V2] {
        let dev = MemDevice::new(20 << 20, 512);
        let pattern: Vec<u8> = (0..dev.geometry().size as usize).map(|i| (i % 251) as u8).collect();
        dev.write_at(0, &pattern, WriteFlags::empty()).unwrap();
        let p = FormatParams { version, pbkdf: pbkdf(999), ..FormatParams::default() };
        assert!(luks::format(&dev, &p, &pass("p")).is_err());
        assert!(image(&dev) == pattern, "{version:?}: format wrote before its derivation failed");
    }
}

#[test]
fn luks1_change_key_with_no_free_slot_keeps_the_old_slot_when_derivation_fails() {
    let dev = MemDevice::new(20 << 20, 512);
    let p = FormatParams { version: LuksVersion::V1, pbkdf: pbkdf(1000), ..FormatParams::default() };
    let (mut l, vk) = luks::format(&dev, &p, &pass("p0")).unwrap();
    for s in 1..8 {
        l.add_keyslot(&dev, &vk, &pass(&format!("p{s}")), Some(s), &pbkdf(1000)).unwrap();
    }
    assert_eq!(l.active_keyslots().len(), 8);
    let before = image(&dev);
    assert!(l.change_keyslot(&dev, 3, &vk, &pass("new"), &pbkdf(999)).is_err());
    assert!(image(&dev) == before, "the old keyslot was touched before the new key was derived");
    let l = Luks::load(&dev, false).unwrap();
    assert_eq!(l.unlock(&dev, &pass("p3"), Some(3)).unwrap().0, 3);
}
