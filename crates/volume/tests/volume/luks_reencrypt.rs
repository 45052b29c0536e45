//! LUKS2 reencryption (volume::luks::reencrypt): the data decrypts with the new key after a
//! run, in every resilience mode; a run stopped by the caller resumes; the power lost at
//! every flush of init + run + finish (and the disk cache keeping a random part of what was
//! not flushed) never loses data with `checksum` and `journal` resilience; bad input gets
//! cryptsetup's errors and changes nothing. At every crash point inside a hotzone, `repair`'s
//! recovery ([`reencrypt::recover_interrupted`]) clears it, and the resume then loses nothing.

use std::time::Duration;

use blockdev::{BlockDevice, MemDevice, WriteFlags};
use sector_crypto::kdf::{HashAlg, Passphrase};
use sector_crypto::{CipherSpec, SectorCipher, SectorParams, VolumeKey};
use testkit::CrashDevice;
use volume::luks::reencrypt::{self, ReencryptParams, RunEnd, RunOptions};
use volume::luks::{self, FormatParams, Luks, LuksError, PbkdfParams, PbkdfType};

const MIB: u64 = 1 << 20;
/// Data offset of a default LUKS2 format.
const DATA: u64 = 16 * MIB;

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

fn plaintext(len: usize) -> Vec<u8> {
    let mut x = 0x9e37_79b9_7f4a_7c15u64;
    (0..len)
        .map(|_| {
            x ^= x << 13;
            x ^= x >> 7;
            x ^= x << 17;
            x as u8
        })
        .collect()
}

fn cipher(spec: &str, key: &VolumeKey, sector_size: u32) -> SectorCipher {
    let s: CipherSpec = spec.parse().unwrap();
    SectorCipher::new(&s, key, SectorParams { sector_size, iv_offset: 0, iv_large_sectors: false }).unwrap()
}

/// A LUKS2 image of `DATA + data_len` bytes whose data area holds `plaintext(data_len)`
/// encrypted with its volume key.
fn image(data_len: u64, sector_size: u32, block: u32) -> Vec<u8> {
    let dev = MemDevice::new(DATA + data_len, block);
    let p = FormatParams { pbkdf: pbkdf(), sector_size, ..FormatParams::default() };
    let (_, vk) = luks::format(&dev, &p, &pass("pw")).unwrap();
    let mut data = plaintext(data_len as usize);
    cipher("aes-xts-plain64", &vk, sector_size).encrypt(0, &mut data).unwrap();
    dev.write_at(DATA, &data, WriteFlags::empty()).unwrap();
    dev.to_vec()
}

/// The data area decrypted with the key the passphrase opens, and the header's cipher.
fn decrypted(dev: &dyn BlockDevice) -> Vec<u8> {
    let l = Luks::load(dev, false).unwrap();
    let (_, vk) = l.unlock(dev, &pass("pw"), None).unwrap();
    let seg = l.segment().unwrap();
    let mut data = vec![0u8; (dev.geometry().size - seg.offset) as usize];
    dev.read_at(seg.offset, &mut data).unwrap();
    cipher(&seg.cipher, &vk, seg.sector_size).decrypt(0, &mut data).unwrap();
    data
}

fn params(resilience: &str) -> ReencryptParams {
    ReencryptParams { resilience: resilience.into(), pbkdf: pbkdf(), ..ReencryptParams::default() }
}

fn init_and_run(dev: &dyn BlockDevice, p: &ReencryptParams, hotzone: u64) -> Result<RunEnd, LuksError> {
    let mut l = Luks::load(dev, true)?;
    reencrypt::init(dev, dev.geometry().size, &mut l, &pass("pw"), p)?;
    let opts = RunOptions { hotzone_size: Some(hotzone), ..RunOptions::default() };
    reencrypt::run(dev, dev, &mut l, &pass("pw"), &opts, &mut |_, _| true)
}

/// After a finished run: one segment, no requirement, only the new keyslot, new key.
fn assert_finished(dev: &dyn BlockDevice, old_vk: &VolumeKey) {
    let l = Luks::load(dev, false).unwrap();
    assert!(reencrypt::status(&l).unwrap().is_none());
    l.check_supported().unwrap();
    let (slot, vk) = l.unlock(dev, &pass("pw"), None).unwrap();
    assert_eq!(slot, 1, "the new keyslot keeps its number");
    assert_eq!(l.active_keyslots(), vec![1]);
    assert_ne!(vk.as_bytes(), old_vk.as_bytes(), "the volume key changed");
}

fn volume_key(image: &[u8]) -> VolumeKey {
    let d = MemDevice::from_vec(image.to_vec(), 512);
    Luks::load(&d, false).unwrap().unlock(&d, &pass("pw"), None).unwrap().1
}

#[test]
fn reencrypt_changes_key_and_keeps_data_in_every_resilience_mode() {
    for (resilience, ss) in [("checksum", 512), ("checksum", 4096), ("journal", 512), ("none", 4096)] {
        let img = image(4 * MIB, ss, 512);
        let old = volume_key(&img);
        let dev = MemDevice::from_vec(img, 512);
        assert_eq!(init_and_run(&dev, &params(resilience), MIB).unwrap(), RunEnd::Finished);
        assert_finished(&dev, &old);
        assert!(decrypted(&dev) == plaintext(4 * MIB as usize), "{resilience}/{ss}: data changed");
    }
}

#[test]
fn reencrypt_changes_cipher_key_size_and_sector_size() {
    let img = image(3 * MIB, 512, 512);
    let dev = MemDevice::from_vec(img, 512);
    let p = ReencryptParams {
        cipher: Some("aes-cbc-essiv:sha256".into()),
        key_bytes: Some(32),
        sector_size: Some(4096),
        ..params("checksum")
    };
    init_and_run(&dev, &p, MIB).unwrap();
    let l = Luks::load(&dev, false).unwrap();
    let seg = l.segment().unwrap();
    assert_eq!((seg.cipher.as_str(), seg.sector_size, l.key_bytes()), ("aes-cbc-essiv:sha256", 4096, 32));
    assert!(decrypted(&dev) == plaintext(3 * MIB as usize));
}

#[test]
fn stopped_run_resumes_and_finishes() {
    for resilience in ["checksum", "none"] {
        let img = image(4 * MIB, 512, 512);
        let dev = MemDevice::from_vec(img, 512);
        let mut l = Luks::load(&dev, true).unwrap();
        reencrypt::init(&dev, dev.geometry().size, &mut l, &pass("pw"), &params(resilience)).unwrap();
        let opts = RunOptions { hotzone_size: Some(MIB), ..RunOptions::default() };
        let mut steps = 0;
        let end = reencrypt::run(&dev, &dev, &mut l, &pass("pw"), &opts, &mut |_, _| {
            steps += 1;
            steps < 3
        })
        .unwrap();
        assert_eq!(end, RunEnd::Interrupted);
        // A fresh process: the header says where to go on.
        let mut l = Luks::load(&dev, true).unwrap();
        let st = reencrypt::status(&l).unwrap().expect("still in progress");
        assert_eq!(st.hot, None, "a clean stop leaves no hotzone");
        let mut seen = Vec::new();
        let end = reencrypt::run(&dev, &dev, &mut l, &pass("pw"), &opts, &mut |done, _| {
            seen.push(done);
            true
        })
        .unwrap();
        assert_eq!(end, RunEnd::Finished);
        assert_eq!(seen[0], 2 * MIB, "{resilience}: resumes where it stopped");
        assert!(decrypted(&dev) == plaintext(4 * MIB as usize));
    }
}

/// Power lost at every flush of init + run + finish, then a resume: the data is intact.
fn crash_at_every_flush(resilience: &str, sector_size: u32, block: u32) {
    crash_at_every_flush_of(resilience, sector_size, block, 3 * MIB, MIB);
}

/// [`crash_at_every_flush`] with `data_len` bytes of data in hotzones of `hotzone` bytes.
fn crash_at_every_flush_of(resilience: &str, sector_size: u32, block: u32, data_len: u64, hotzone: u64) {
    let img = image(data_len, sector_size, block);
    let want = plaintext(data_len as usize);
    let p = params(resilience);
    let probe = CrashDevice::from_vec(img.clone(), block);
    init_and_run(&probe, &p, hotzone).unwrap();
    let flushes = probe.flushes();
    let hotzones = data_len.div_ceil(hotzone);
    assert!(flushes > 4 * hotzones, "expected at least 4 flushes per hotzone, got {flushes}");
    let mut repaired = 0;
    let mut check = |dev: MemDevice, when: &str, repair: bool| {
        let mut l = Luks::load(&dev, true).unwrap_or_else(|e| panic!("{when}: header does not load: {e:?}"));
        let hot = reencrypt::status(&l).unwrap().is_some_and(|st| st.hot.is_some());
        if repair {
            // `repair` first (cryptsetup's resume asks for it after such a crash): it
            // recovers exactly a hotzone left in reencryption, and stops there.
            let keys = reencrypt::unlock_keys(&dev, &l, &pass("pw"), &Default::default()).ok();
            let done = keys.map(|k| reencrypt::recover_interrupted(&dev, &dev, &mut l, &k).unwrap());
            assert_eq!(
                done.unwrap_or(false),
                hot,
                "{when}: repair recovers exactly a hotzone left in reencryption"
            );
            let st = reencrypt::status(&l).unwrap();
            assert!(st.is_none_or(|st| st.hot.is_none()), "{when}: still flagged after repair");
            repaired += usize::from(hot);
            l = Luks::load(&dev, true).unwrap();
        }
        if reencrypt::status(&l).unwrap().is_some() {
            let opts = RunOptions { hotzone_size: Some(hotzone), ..RunOptions::default() };
            let end = reencrypt::run(&dev, &dev, &mut l, &pass("pw"), &opts, &mut |_, _| true)
                .unwrap_or_else(|e| panic!("{when}: resume failed: {e:?}"));
            assert_eq!(end, RunEnd::Finished, "{when}");
        }
        assert!(decrypted(&dev) == want, "{when}: data lost ({resilience}, sector {sector_size})");
    };
    for n in 1..=flushes {
        let dev = CrashDevice::from_vec(img.clone(), block).crash_at_flush(n);
        let _ = init_and_run(&dev, &p, hotzone);
        check(dev.crash(), &format!("crash at flush {n}"), true);
        check(dev.crash_keeping_some(n), &format!("crash at flush {n}, cache seed {n}"), false);
    }
    assert!(repaired as u64 >= hotzones, "only {repaired} crash points fell inside a hotzone");
}

#[test]
fn crash_at_every_flush_checksum_resumes_without_loss() {
    crash_at_every_flush("checksum", 512, 512);
}

#[test]
fn crash_at_every_flush_checksum_4k_sectors_resumes_without_loss() {
    crash_at_every_flush("checksum", 4096, 4096);
}

/// Hotzones of 8 MiB: the checksums and the crypto of each are cut across the cores (pieces
/// of at least 1 MiB), so a piece given the wrong sectors or checksums would show here, in
/// the data or in the recovery from a crash inside the hotzone.
#[test]
fn crash_at_every_flush_with_hotzones_cut_across_cores_resumes_without_loss() {
    crash_at_every_flush_of("checksum", 4096, 4096, 16 * MIB, 8 * MIB);
}

#[test]
fn crash_at_every_flush_journal_resumes_without_loss() {
    crash_at_every_flush("journal", 512, 512);
}

#[test]
fn crash_during_recovery_is_recovered_again() {
    // Crash in the middle of a hotzone, then crash again at every flush of the resume.
    let img = image(3 * MIB, 512, 512);
    let dev = CrashDevice::from_vec(img, 512).crash_at_flush(9);
    let _ = init_and_run(&dev, &params("checksum"), MIB);
    let crashed = dev.crash().to_vec();
    assert!(
        reencrypt::status(&Luks::load(&MemDevice::from_vec(crashed.clone(), 512), false).unwrap())
            .unwrap()
            .is_some_and(|s| s.hot.is_some()),
        "flush 9 should fall inside a hotzone"
    );
    let resume = |d: &dyn BlockDevice| {
        let mut l = Luks::load(d, true)?;
        let opts = RunOptions { hotzone_size: Some(MIB), ..RunOptions::default() };
        reencrypt::run(d, d, &mut l, &pass("pw"), &opts, &mut |_, _| true)
    };
    let probe = CrashDevice::from_vec(crashed.clone(), 512);
    resume(&probe).unwrap();
    for n in 1..=probe.flushes() {
        let d = CrashDevice::from_vec(crashed.clone(), 512).crash_at_flush(n);
        let _ = resume(&d);
        let d = d.crash();
        let mut l = Luks::load(&d, true).unwrap();
        if reencrypt::status(&l).unwrap().is_some() {
            let opts = RunOptions { hotzone_size: Some(MIB), ..RunOptions::default() };
            reencrypt::run(&d, &d, &mut l, &pass("pw"), &opts, &mut |_, _| true).unwrap();
        }
        assert!(decrypted(&d) == plaintext(3 * MIB as usize), "second crash at flush {n}");
    }
}

#[test]
fn bad_input_gets_cryptsetup_errors_and_changes_nothing() {
    let img = image(2 * MIB, 512, 512);
    let dev = MemDevice::from_vec(img.clone(), 512);
    let mut l = Luks::load(&dev, true).unwrap();
    // Not in progress.
    let e = reencrypt::run(&dev, &dev, &mut l, &pass("pw"), &RunOptions::default(), &mut |_, _| true)
        .unwrap_err();
    assert_eq!(e.to_string(), "Device reencryption not in progress.");
    // Wrong passphrase: nothing written.
    let e =
        reencrypt::init(&dev, dev.geometry().size, &mut l, &pass("nope"), &params("checksum")).unwrap_err();
    assert!(matches!(e, LuksError::WrongPassphrase), "{e:?}");
    assert!(dev.to_vec() == img, "a refused init wrote something");
    // Unknown resilience mode: nothing written.
    let e = reencrypt::init(&dev, dev.geometry().size, &mut l, &pass("pw"), &params("sideways")).unwrap_err();
    assert_eq!(e.to_string(), "Unsupported resilience mode sideways");
    assert!(dev.to_vec() == img);
    // Several keyslots: refused unless the one to keep is named (the others would go).
    let two = MemDevice::from_vec(img.clone(), 512);
    let mut l2 = Luks::load(&two, true).unwrap();
    let vk = l2.unlock(&two, &pass("pw"), None).unwrap().1;
    l2.add_keyslot(&two, &vk, &pass("other"), Some(3), &pbkdf()).unwrap();
    let with_two = two.to_vec();
    let e =
        reencrypt::init(&two, two.geometry().size, &mut l2, &pass("pw"), &params("checksum")).unwrap_err();
    assert!(
        matches!(&e, LuksError::Reencrypt(luks::ReencryptError::KeyslotNotNamed { keyslots }) if keyslots.len() == 2),
        "{e:?}"
    );
    assert!(two.to_vec() == with_two);
    let p = ReencryptParams { key_slot: Some(0), ..params("checksum") };
    reencrypt::init(&two, two.geometry().size, &mut l2, &pass("pw"), &p).unwrap();
    let opts = RunOptions { hotzone_size: Some(MIB), ..RunOptions::default() };
    reencrypt::run(&two, &two, &mut l2, &pass("pw"), &opts, &mut |_, _| true).unwrap();
    let l2 = Luks::load(&two, false).unwrap();
    assert_eq!(l2.active_keyslots(), vec![1], "keyslot 3 was removed with the old key");
    assert!(decrypted(&two) == plaintext(2 * MIB as usize));
    // A second init on a volume in progress.
    reencrypt::init(&dev, dev.geometry().size, &mut l, &pass("pw"), &params("checksum")).unwrap();
    let after_init = dev.to_vec();
    let e = reencrypt::init(&dev, dev.geometry().size, &mut l, &pass("pw"), &params("checksum")).unwrap_err();
    assert_eq!(e.to_string(), "LUKS2 reencryption already initialized. Aborting operation.");
    assert!(dev.to_vec() == after_init);
    // Opening a volume in reencryption is refused clearly.
    assert!(Luks::load(&dev, false).unwrap().check_supported().is_err());
    // Wrong passphrase on resume.
    let e = reencrypt::run(&dev, &dev, &mut l, &pass("nope"), &RunOptions::default(), &mut |_, _| true)
        .unwrap_err();
    assert!(matches!(e, LuksError::WrongPassphrase), "{e:?}");
    // Metadata changed behind the verification digest's back (resilience none instead of
    // checksum): refused, nothing written.
    let mut l2 = Luks::load(&dev, false).unwrap();
    if let luks::LuksHeader::V2(s) = &mut l2.header {
        let k = s.header.metadata.keyslots.values_mut().find(|k| k.type_name == "reencrypt").unwrap();
        k.area.type_name = "none".into();
        k.area.extra.clear();
        let plan = s.header.write_plan(s.header.seqid + 1, &s.salts).unwrap();
        for step in &plan.steps {
            if let formats::luks2::WriteStep::Write { offset, bytes } = step {
                dev.write_at(*offset, bytes, WriteFlags::empty()).unwrap();
            }
        }
    }
    let tampered = dev.to_vec();
    let mut l = Luks::load(&dev, false).unwrap();
    let e = reencrypt::run(&dev, &dev, &mut l, &pass("pw"), &RunOptions::default(), &mut |_, _| true)
        .unwrap_err();
    assert_eq!(e.to_string(), "Reencryption metadata is invalid.");
    assert!(dev.to_vec() == tampered);
}

/// `open --key-slot N` of a volume mid-reencryption tries keyslot N alone (cryptsetup
/// 2.6.1): a keyslot of only the old or only the new key opens one of the two keys the
/// segments need and is refused (exit code 1); a wrong passphrase for it is "No key
/// available with this passphrase."; the reencrypt keyslot and an empty one are "No usable
/// keyslot is available."; without --key-slot the passphrase opens both.
#[test]
fn a_key_slot_mid_reencryption_must_open_both_keys() {
    let dev = MemDevice::from_vec(image(2 * MIB, 512, 512), 512);
    let mut l = Luks::load(&dev, true).unwrap();
    let vk = l.unlock(&dev, &pass("pw"), None).unwrap().1;
    l.add_keyslot(&dev, &vk, &pass("other"), Some(1), &pbkdf()).unwrap();
    let p = ReencryptParams { key_slot: Some(0), ..params("checksum") };
    let new = reencrypt::init(&dev, dev.geometry().size, &mut l, &pass("pw"), &p).unwrap();
    assert_eq!(new, 2);
    let l = Luks::load(&dev, false).unwrap();
    let lim = Default::default();
    let with = |slot: Option<u32>, pw: &str| reencrypt::unlock_keys_with(&dev, &l, &pass(pw), slot, &lim);
    let k = with(None, "pw").unwrap();
    assert!(k.old.is_some() && k.new.is_some());
    for (slot, pw) in [(0, "pw"), (2, "pw"), (1, "other")] {
        let e = with(Some(slot), pw).unwrap_err();
        assert!(
            matches!(e, LuksError::Reencrypt(luks::ReencryptError::KeyslotOpensOneKey { .. })),
            "slot {slot}: {e:?}"
        );
        assert!(e.to_string().contains("required but not unlocked"), "slot {slot}: {e}");
    }
    for slot in [0, 1, 2] {
        assert!(matches!(with(Some(slot), "nope").unwrap_err(), LuksError::WrongPassphrase), "slot {slot}");
    }
    for slot in [3, 7] {
        assert_eq!(
            with(Some(slot), "pw").unwrap_err().to_string(),
            "No usable keyslot is available.",
            "{slot}"
        );
    }
    assert!(matches!(with(None, "other").unwrap_err(), LuksError::WrongPassphrase));
    // An encryption (one key): its keyslot opens all there is.
    let hdr = MemDevice::new(16 * MIB, 512);
    let data = MemDevice::from_vec(plaintext(MIB as usize), 512);
    let (l, slot) = reencrypt::init_encrypt(&hdr, &data, &pass("pw"), &params("checksum")).unwrap();
    let k = reencrypt::unlock_keys_with(&hdr, &l, &pass("pw"), Some(slot), &lim).unwrap();
    assert_eq!(k.keyslot, slot);
}
