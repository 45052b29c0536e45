//! LUKS1/LUKS2 in-process: format, unlock (priorities, wrong passphrase), keyslot
//! add/kill/change, UUID, backup/restore, erase, damaged-copy repair, and refusals of what
//! cannot be opened (integrity segments, unknown requirements), all over memory devices.

use std::time::Duration;

use blockdev::{BlockDevice, MemDevice, WriteFlags};
use formats::dm::CryptOptions;
use formats::luks2::CopyKind;
use sector_crypto::kdf::{HashAlg, Passphrase};
use volume::luks::{self, FormatParams, Luks, LuksError, LuksHeader, LuksVersion, PbkdfParams, PbkdfType};

fn pass(s: &str) -> Passphrase {
    Passphrase::new(s.as_bytes().to_vec())
}

fn cheap(kind: PbkdfType) -> PbkdfParams {
    PbkdfParams {
        kind: Some(kind),
        hash: HashAlg::Sha256,
        iter_time: Duration::from_millis(10),
        force_iterations: Some(if kind == PbkdfType::Pbkdf2 { 1000 } else { 4 }),
        memory_kib: Some(32),
        parallel: Some(1),
    }
}

fn params(version: LuksVersion) -> FormatParams {
    FormatParams {
        version,
        pbkdf: cheap(if version == LuksVersion::V1 { PbkdfType::Pbkdf2 } else { PbkdfType::Argon2id }),
        ..FormatParams::default()
    }
}

fn formatted(version: LuksVersion) -> (MemDevice, Luks, sector_crypto::VolumeKey) {
    let dev = MemDevice::new(20 << 20, 512);
    let (l, vk) = luks::format(&dev, &params(version), &pass("first")).unwrap();
    (dev, l, vk)
}

#[test]
fn format_then_unlock_both_versions() {
    for v in [LuksVersion::V1, LuksVersion::V2] {
        let (dev, _, vk) = formatted(v);
        assert_eq!(luks::probe(&dev).unwrap(), Some(v));
        let l = Luks::load(&dev, false).unwrap();
        let (slot, got) = l.unlock(&dev, &pass("first"), None).unwrap();
        assert_eq!(slot, 0);
        assert_eq!(got.as_bytes(), vk.as_bytes());
        l.verify_volume_key(&vk).unwrap();
        let seg = l.segment().unwrap();
        match v {
            LuksVersion::V1 => assert_eq!(seg.offset, 4096 * 512),
            LuksVersion::V2 => assert_eq!(seg.offset, 16 << 20),
        }
    }
}

#[test]
fn wrong_passphrase_is_a_clear_error_naming_no_key() {
    for v in [LuksVersion::V1, LuksVersion::V2] {
        let (dev, l, vk) = formatted(v);
        let e = l.unlock(&dev, &pass("wrong"), None).unwrap_err();
        assert!(matches!(e, LuksError::WrongPassphrase), "{e:?}");
        let msg = format!("{e} {e:?}");
        assert_eq!(e.to_string(), "No key available with this passphrase.");
        assert!(!msg.contains(&hex::encode(vk.as_bytes())));
    }
}

#[test]
fn keyslot_add_kill_change() {
    for v in [LuksVersion::V1, LuksVersion::V2] {
        let (dev, mut l, vk) = formatted(v);
        let p = params(v).pbkdf;
        let s = l.add_keyslot(&dev, &vk, &pass("second"), None, &p).unwrap();
        assert_eq!(s, 1);
        let s5 = l.add_keyslot(&dev, &vk, &pass("fifth"), Some(5), &p).unwrap();
        assert_eq!(s5, 5);
        assert!(matches!(
            l.add_keyslot(&dev, &vk, &pass("x"), Some(5), &p),
            Err(LuksError::KeyslotActive(5))
        ));
        let l2 = Luks::load(&dev, false).unwrap();
        assert_eq!(l2.active_keyslots(), vec![0, 1, 5]);
        assert_eq!(l2.unlock(&dev, &pass("second"), None).unwrap().0, 1);
        assert_eq!(l2.unlock(&dev, &pass("fifth"), Some(5)).unwrap().0, 5);
        // A passphrase names only its own slot when --key-slot is given.
        assert!(matches!(l2.unlock(&dev, &pass("fifth"), Some(1)), Err(LuksError::WrongPassphrase)));
        l.kill_keyslot(&dev, 1).unwrap();
        let l3 = Luks::load(&dev, false).unwrap();
        assert_eq!(l3.active_keyslots(), vec![0, 5]);
        assert!(matches!(l3.unlock(&dev, &pass("second"), None), Err(LuksError::WrongPassphrase)));
        assert!(matches!(l.kill_keyslot(&dev, 1), Err(LuksError::KeyslotInactive(1))));
        let new = l.change_keyslot(&dev, 0, &vk, &pass("changed"), &p).unwrap();
        let l4 = Luks::load(&dev, false).unwrap();
        assert!(matches!(l4.unlock(&dev, &pass("first"), None), Err(LuksError::WrongPassphrase)));
        assert_eq!(l4.unlock(&dev, &pass("changed"), None).unwrap().0, new);
        assert_eq!(l4.unlock(&dev, &pass("changed"), None).unwrap().1.as_bytes(), vk.as_bytes());
    }
}

#[test]
fn luks2_fills_32_keyslots_then_reports_full_or_no_space() {
    let dev = MemDevice::new(20 << 20, 512);
    let mut p = params(LuksVersion::V2);
    p.pbkdf = cheap(PbkdfType::Pbkdf2);
    p.key_bytes = 32;
    let (mut l, vk) = luks::format(&dev, &p, &pass("0")).unwrap();
    for i in 1..32 {
        assert_eq!(l.add_keyslot(&dev, &vk, &pass(&i.to_string()), None, &p.pbkdf).unwrap(), i);
    }
    assert!(matches!(l.add_keyslot(&dev, &vk, &pass("x"), None, &p.pbkdf), Err(LuksError::NoFreeKeyslot)));
    assert!(matches!(
        l.add_keyslot(&dev, &vk, &pass("x"), Some(32), &p.pbkdf),
        Err(LuksError::BadKeyslot { .. })
    ));
    let l = Luks::load(&dev, false).unwrap();
    assert_eq!(l.unlock(&dev, &pass("31"), None).unwrap().0, 31);
}

#[test]
fn luks2_priorities_prefer_first_and_ignore_unless_named() {
    let (dev, mut l, vk) = formatted(LuksVersion::V2);
    let p = params(LuksVersion::V2).pbkdf;
    l.add_keyslot(&dev, &vk, &pass("first"), Some(3), &p).unwrap();
    // Slot 3 preferred, slot 0 ignored: "first" opens slot 3; slot 0 only when named.
    let LuksHeader::V2(s) = &mut l.header else { unreachable!() };
    s.header.metadata.keyslots.get_mut(&3).unwrap().priority = Some(2);
    s.header.metadata.keyslots.get_mut(&0).unwrap().priority = Some(0);
    let mut s2 = (**s).clone();
    let plan = s2.header.write_plan(s2.header.seqid + 1, &s2.salts).unwrap();
    for step in &plan.steps {
        if let formats::luks2::WriteStep::Write { offset, bytes } = step {
            dev.write_at(*offset, bytes, WriteFlags::empty()).unwrap();
        }
    }
    s2.header.seqid += 1;
    let l = Luks::load(&dev, false).unwrap();
    assert_eq!(l.unlock(&dev, &pass("first"), None).unwrap().0, 3);
    assert_eq!(l.unlock(&dev, &pass("first"), Some(0)).unwrap().0, 0);
}

#[test]
fn uuid_change_and_random_uuid() {
    for v in [LuksVersion::V1, LuksVersion::V2] {
        let (dev, mut l, _) = formatted(v);
        let u = l.set_uuid(&dev, Some("12345678-1234-1234-1234-123456789ABC")).unwrap();
        assert_eq!(u, "12345678-1234-1234-1234-123456789abc");
        assert_eq!(Luks::load(&dev, false).unwrap().uuid(), u);
        let r = l.set_uuid(&dev, None).unwrap();
        luks::check_uuid(&r).unwrap();
        assert_ne!(r, u);
        assert!(l.set_uuid(&dev, Some("not-a-uuid")).is_err());
    }
}

#[test]
fn backup_is_header_plus_keyslots_and_restore_brings_keyslots_back() {
    for v in [LuksVersion::V1, LuksVersion::V2] {
        let (dev, mut l, vk) = formatted(v);
        let b = l.backup(&dev).unwrap();
        match v {
            // End of keyslot 7 (3536 + 500 sectors), rounded up to 4 KiB.
            LuksVersion::V1 => assert_eq!(b.len(), 2_068_480),
            LuksVersion::V2 => assert_eq!(b.len() as u64, 16 << 20),
        }
        l.erase(&dev).unwrap();
        let erased = Luks::load(&dev, false).unwrap();
        assert!(erased.active_keyslots().is_empty());
        assert!(matches!(erased.unlock(&dev, &pass("first"), None), Err(LuksError::WrongPassphrase)));
        let restored = Luks::restore(&dev, &b).unwrap();
        assert_eq!(restored.unlock(&dev, &pass("first"), None).unwrap().1.as_bytes(), vk.as_bytes());
    }
}

#[test]
fn restore_refuses_garbage_and_writes_nothing() {
    let (dev, _, _) = formatted(LuksVersion::V2);
    let before = dev.to_vec();
    assert!(Luks::restore(&dev, &vec![0u8; 1 << 20]).is_err());
    let mut b = Luks::load(&dev, false).unwrap().backup(&dev).unwrap().to_vec();
    b[0x1000 + 5] ^= 0xff; // primary JSON: checksum mismatch
    b[0x4000 + 0x1000 + 5] ^= 0xff; // secondary JSON too
    assert!(Luks::restore(&dev, &b).is_err());
    assert!(dev.to_vec() == before);
}

#[test]
fn damaged_primary_is_repaired_only_when_writable() {
    let (dev, _, vk) = formatted(LuksVersion::V2);
    let mut junk = vec![0u8; 4096];
    junk[..4].copy_from_slice(b"junk");
    dev.write_at(0, &junk, WriteFlags::empty()).unwrap();
    let damaged = dev.to_vec();
    let ro = Luks::load(&dev, false).unwrap();
    assert_eq!(ro.needs_repair, Some(CopyKind::Primary));
    assert_eq!(ro.unlock(&dev, &pass("first"), None).unwrap().1.as_bytes(), vk.as_bytes());
    assert!(dev.to_vec() == damaged, "a read-only load writes nothing");
    let rw = Luks::load(&dev, true).unwrap();
    assert_eq!(rw.repaired, Some(CopyKind::Primary));
    let again = Luks::load(&dev, false).unwrap();
    assert_eq!(again.needs_repair, None);
    assert_eq!(again.unlock(&dev, &pass("first"), None).unwrap().0, 0);
}

#[test]
fn truncated_device_is_refused() {
    for v in [LuksVersion::V1, LuksVersion::V2] {
        let (dev, _, _) = formatted(v);
        let mut img = dev.to_vec();
        img.truncate(1 << 20);
        let e = Luks::load(&MemDevice::from_vec(img, 512), false).unwrap_err();
        assert!(
            matches!(e, LuksError::DeviceTooSmall { .. } | LuksError::Luks1(_) | LuksError::Luks2(_)),
            "{e:?}"
        );
    }
    let e = Luks::load(&MemDevice::new(4096, 512), false).unwrap_err();
    assert!(matches!(e, LuksError::NotLuks));
}

#[test]
fn integrity_segment_and_unknown_requirement_are_refused_clearly() {
    let (dev, mut l, vk) = formatted(LuksVersion::V2);
    let LuksHeader::V2(s) = &mut l.header else { unreachable!() };
    let with = |t: &str, je: &str, key_size: Option<u32>| {
        let mut h = s.header.clone();
        h.metadata.segments.get_mut(&0).unwrap().crypt.as_mut().unwrap().integrity =
            Some(formats::luks2::SegmentIntegrity {
                type_name: t.into(),
                journal_encryption: je.into(),
                journal_integrity: "none".into(),
                key_size,
                extra: Default::default(),
            });
        Luks {
            header: LuksHeader::V2(Box::new(luks::Luks2State { header: h, salts: s.salts })),
            repaired: None,
            needs_repair: None,
        }
    };
    // Supported (aes-xts-plain64 + hmac(sha256)), but not as a plain dm-crypt table.
    let ok = with("hmac(sha256)", "none", None);
    ok.check_supported().unwrap();
    assert_eq!(ok.aead().unwrap().unwrap().to_string(), "capi:authenc(hmac(sha256),xts(aes))-plain64");
    let e = ok.table("dev", 32 << 20, &vk, &CryptOptions::default()).unwrap_err();
    assert!(e.to_string().contains("no plain dm-crypt table"), "{e}");
    for (l2, msg) in [
        (with("hmac(md5)", "none", None), "hmac(md5) is not supported"),
        (with("poly1305", "none", None), "integrity poly1305 is not supported"),
        (with("hmac(sha256)", "aes", None), "journal_encryption \"aes\" is not supported"),
        (with("hmac(sha256)", "none", Some(40)), "integrity key size 320 bits is not supported"),
    ] {
        let e = l2.check_supported().unwrap_err();
        assert!(e.to_string().contains(msg), "{e}");
        assert!(l2.table("dev", 32 << 20, &vk, &CryptOptions::default()).is_err());
    }
    let mut with_req = s.header.clone();
    with_req.metadata.config.requirements = Some(formats::luks2::Requirements {
        mandatory: Some(vec!["future-thing".into()]),
        extra: Default::default(),
    });
    let l3 = Luks {
        header: LuksHeader::V2(Box::new(luks::Luks2State { header: with_req, salts: s.salts })),
        repaired: None,
        needs_repair: None,
    };
    let e = l3.check_supported().unwrap_err();
    assert!(e.to_string().contains("Unmet LUKS2 requirements detected: future-thing"), "{e}");
    let _ = dev;
}

#[test]
fn luks2_persistent_flags_and_segment_become_the_table() {
    let dev = MemDevice::new(20 << 20, 512);
    let mut p = params(LuksVersion::V2);
    p.sector_size = 4096;
    p.offset = Some(8192);
    let (mut l, vk) = luks::format(&dev, &p, &pass("x")).unwrap();
    let LuksHeader::V2(s) = &mut l.header else { unreachable!() };
    s.header.metadata.config.flags = Some(vec!["allow-discards".into(), "no-read-workqueue".into()]);
    let t = l
        .table("/dev/x", 20 << 20, &vk, &CryptOptions { same_cpu_crypt: true, ..Default::default() })
        .unwrap();
    assert_eq!(t.offset, 8192);
    assert_eq!(t.len, (20 << 11) - 8192);
    assert_eq!(t.options.sector_size, Some(4096));
    assert!(t.options.allow_discards && t.options.no_read_workqueue && t.options.same_cpu_crypt);
    assert!(!t.options.no_write_workqueue);
}

#[test]
fn format_layouts_match_cryptsetup_defaults() {
    let dev = MemDevice::new(20 << 20, 512);
    let mut p = params(LuksVersion::V2);
    p.metadata_size = Some(64 << 10);
    p.keyslots_size = Some(1 << 20);
    p.offset = Some(8192);
    let (l, _) = luks::format(&dev, &p, &pass("x")).unwrap();
    let LuksHeader::V2(s) = &l.header else { unreachable!() };
    let m = &s.header.metadata;
    assert_eq!((m.config.json_size, m.config.keyslots_size), ((64 << 10) - 4096, 1 << 20));
    assert_eq!(m.keyslots[&0].area.offset, 128 << 10);
    assert_eq!(m.keyslots[&0].area.size, 258_048);
    assert_eq!(s.header.seqid, 3, "cryptsetup's epoch after format + keyslot");
    // Detached header: data at --offset (default 0).
    let hdr = MemDevice::new(16 << 20, 512);
    let p = FormatParams { detached: true, ..params(LuksVersion::V2) };
    let (l, _) = luks::format(&hdr, &p, &pass("x")).unwrap();
    assert_eq!(l.segment().unwrap().offset, 0);
    let p = FormatParams { detached: true, ..params(LuksVersion::V1) };
    let hdr = MemDevice::new(4 << 20, 512);
    let (l, _) = luks::format(&hdr, &p, &pass("x")).unwrap();
    assert_eq!(l.segment().unwrap().offset, 0);
}
