//! LUKS2 in-place encryption and decryption with a detached header
//! (volume::luks::reencrypt::{init_encrypt, init_decrypt}): a plaintext device encrypts and
//! decrypts back in every resilience mode, with cryptsetup's segment layouts (encrypt
//! forward, decrypt backward); a run stopped by the caller resumes; the power lost at every
//! flush of init + run + finish (header and data on one crash device, so the flush order
//! across both counts) never loses data with `checksum` and `journal` resilience.

use std::sync::Arc;
use std::time::Duration;

use blockdev::{BlockDevice, MemDevice, Slice, WriteFlags};
use sector_crypto::kdf::{HashAlg, Passphrase};
use sector_crypto::{CipherSpec, SectorCipher, SectorParams};
use testkit::CrashDevice;
use volume::luks::reencrypt::{self, ReencryptParams, RunEnd, RunOptions};
use volume::luks::{Luks, LuksError, LuksHeader, PbkdfParams, PbkdfType};
use volume::{Keys, LuksSpec, OnePassphrase, OpenOptions, Spec, Storage};

const MIB: u64 = 1 << 20;
/// Size of the detached header (cryptsetup's default LUKS2 header).
const HDR: u64 = 16 * MIB;
const DATA_LEN: u64 = 3 * MIB;

fn pass() -> Passphrase {
    Passphrase::new(b"pw".to_vec())
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
    let mut x = 0x2545_f491_4f6c_dd1du64;
    (0..len)
        .map(|_| {
            x ^= x << 13;
            x ^= x >> 7;
            x ^= x << 17;
            x as u8
        })
        .collect()
}

fn params(resilience: &str) -> ReencryptParams {
    ReencryptParams { resilience: resilience.into(), pbkdf: pbkdf(), ..ReencryptParams::default() }
}

fn opts() -> RunOptions {
    RunOptions { hotzone_size: Some(MIB), ..RunOptions::default() }
}

/// One image: `[header (16 MiB) | data]`, the data holding `plaintext(DATA_LEN)`.
fn image() -> Vec<u8> {
    let mut v = vec![0u8; (HDR + DATA_LEN) as usize];
    v[HDR as usize..].copy_from_slice(&plaintext(DATA_LEN as usize));
    v
}

fn split(dev: &dyn BlockDevice) -> (Slice<&dyn BlockDevice>, Slice<&dyn BlockDevice>) {
    let size = dev.geometry().size;
    (Slice::new(dev, 0, HDR).unwrap(), Slice::new(dev, HDR, size - HDR).unwrap())
}

/// The data as a reader sees it: decrypted with the header's key when the header has a
/// crypt segment, raw when it has a linear one (or there is no header at all).
fn visible(hdr: &dyn BlockDevice, data: &dyn BlockDevice) -> Vec<u8> {
    let mut buf = vec![0u8; data.geometry().size as usize];
    data.read_at(0, &mut buf).unwrap();
    let Ok(l) = Luks::load(hdr, false) else { return buf };
    assert!(reencrypt::status(&l).unwrap().is_none(), "visible() needs a finished header");
    let Ok(seg) = l.segment() else { return buf };
    let (_, vk) = l.unlock(hdr, &pass(), None).unwrap();
    let spec: CipherSpec = seg.cipher.parse().unwrap();
    let c = SectorCipher::new(
        &spec,
        &vk,
        SectorParams { sector_size: seg.sector_size, iv_offset: 0, iv_large_sectors: false },
    )
    .unwrap();
    c.decrypt(0, &mut buf).unwrap();
    buf
}

fn metadata(l: &Luks) -> &formats::luks2::Luks2Metadata {
    match &l.header {
        LuksHeader::V2(s) => &s.header.metadata,
        LuksHeader::V1(_) => panic!("LUKS1"),
    }
}

fn encrypt(dev: &dyn BlockDevice, p: &ReencryptParams) -> Result<RunEnd, LuksError> {
    let (hdr, data) = split(dev);
    let (mut l, _) = reencrypt::init_encrypt(&hdr, &data, &pass(), p)?;
    reencrypt::run(&hdr, &data, &mut l, &pass(), &opts(), &mut |_, _| true)
}

fn decrypt(dev: &dyn BlockDevice, p: &ReencryptParams) -> Result<RunEnd, LuksError> {
    let (hdr, data) = split(dev);
    let mut l = Luks::load(&hdr, true)?;
    reencrypt::init_decrypt(&hdr, data.geometry().size, &mut l, &pass(), p)?;
    reencrypt::run(&hdr, &data, &mut l, &pass(), &opts(), &mut |_, _| true)
}

/// Resumes whatever is in progress on `dev` to the end.
fn resume(dev: &dyn BlockDevice, when: &str) {
    let (hdr, data) = split(dev);
    let Ok(mut l) = Luks::load(&hdr, true) else { return };
    if reencrypt::status(&l).unwrap().is_some() {
        let end = reencrypt::run(&hdr, &data, &mut l, &pass(), &opts(), &mut |_, _| true)
            .unwrap_or_else(|e| panic!("{when}: resume failed: {e:?}"));
        assert_eq!(end, RunEnd::Finished, "{when}");
    }
}

#[test]
fn encrypt_then_decrypt_keeps_data_in_every_resilience_mode() {
    for resilience in ["checksum", "journal", "none"] {
        let dev = MemDevice::from_vec(image(), 512);
        assert_eq!(encrypt(&dev, &params(resilience)).unwrap(), RunEnd::Finished);
        let (hdr, data) = split(&dev);
        let l = Luks::load(&hdr, false).unwrap();
        assert!(reencrypt::status(&l).unwrap().is_none());
        assert_eq!(l.active_keyslots(), vec![0]);
        let seg = l.segment().unwrap();
        assert_eq!((seg.offset, seg.cipher.as_str()), (0, "aes-xts-plain64"));
        let mut raw = vec![0u8; DATA_LEN as usize];
        data.read_at(0, &mut raw).unwrap();
        assert!(raw != plaintext(DATA_LEN as usize), "{resilience}: data not encrypted");
        assert!(visible(&hdr, &data) == plaintext(DATA_LEN as usize), "{resilience}: encrypt lost data");

        assert_eq!(decrypt(&dev, &params(resilience)).unwrap(), RunEnd::Finished);
        let (hdr, data) = split(&dev);
        let l = Luks::load(&hdr, false).unwrap();
        assert!(reencrypt::status(&l).unwrap().is_none());
        assert!(l.active_keyslots().is_empty(), "decryption drops every keyslot");
        let mut raw = vec![0u8; DATA_LEN as usize];
        data.read_at(0, &mut raw).unwrap();
        assert!(raw == plaintext(DATA_LEN as usize), "{resilience}: decrypt lost data");
    }
}

#[test]
fn layouts_mid_run_are_cryptsetups() {
    // Encryption goes forward: new crypt part first, linear old part after.
    let dev = MemDevice::from_vec(image(), 512);
    let (hdr, data) = split(&dev);
    let (mut l, _) = reencrypt::init_encrypt(&hdr, &data, &pass(), &params("checksum")).unwrap();
    let st = reencrypt::status(&l).unwrap().unwrap();
    assert_eq!((st.keyslot.mode.as_str(), st.keyslot.direction.as_str()), ("encrypt", "forward"));
    assert_eq!(st.digest_old, None);
    let mut n = 0;
    let end = reencrypt::run(&hdr, &data, &mut l, &pass(), &opts(), &mut |_, _| {
        n += 1;
        n < 2
    })
    .unwrap();
    assert_eq!(end, RunEnd::Interrupted);
    let l = Luks::load(&hdr, false).unwrap();
    let m = metadata(&l);
    let kinds: Vec<(&str, u64)> = formats::luks2::reencrypt::ReencryptState::regular_segments(m)
        .iter()
        .map(|(_, s)| (s.type_name.as_str(), s.offset))
        .collect();
    assert_eq!(kinds, vec![("crypt", 0), ("linear", MIB)]);
    resume(&dev, "encrypt");

    // Decryption goes backward: old crypt part first, new linear part at the end.
    let (hdr, data) = split(&dev);
    let mut l = Luks::load(&hdr, true).unwrap();
    reencrypt::init_decrypt(&hdr, data.geometry().size, &mut l, &pass(), &params("journal")).unwrap();
    let st = reencrypt::status(&l).unwrap().unwrap();
    assert_eq!((st.keyslot.mode.as_str(), st.keyslot.direction.as_str()), ("decrypt", "backward"));
    let mut seen = Vec::new();
    let end = reencrypt::run(&hdr, &data, &mut l, &pass(), &opts(), &mut |done, _| {
        seen.push(done);
        seen.len() < 2
    })
    .unwrap();
    assert_eq!(end, RunEnd::Interrupted);
    assert_eq!(seen, vec![0, MIB]);
    let l = Luks::load(&hdr, false).unwrap();
    let m = metadata(&l);
    let segs: Vec<(String, u64, Option<u64>)> =
        formats::luks2::reencrypt::ReencryptState::regular_segments(m)
            .iter()
            .map(|(_, s)| (s.type_name.clone(), s.offset, s.fixed_size()))
            .collect();
    assert_eq!(segs, vec![("crypt".into(), 0, Some(2 * MIB)), ("linear".into(), 2 * MIB, None)]);
    resume(&dev, "decrypt");
    let (_, data) = split(&dev);
    let mut raw = vec![0u8; DATA_LEN as usize];
    data.read_at(0, &mut raw).unwrap();
    assert!(raw == plaintext(DATA_LEN as usize));
}

/// Power lost at every flush of `op` (from `start`), then a resume: nothing lost.
fn crash_at_every_flush(start: Vec<u8>, op: fn(&dyn BlockDevice) -> Result<RunEnd, LuksError>, what: &str) {
    let want = plaintext(DATA_LEN as usize);
    let probe = CrashDevice::from_vec(start.clone(), 512);
    op(&probe).unwrap();
    let flushes = probe.flushes();
    assert!(flushes > 8, "expected many flushes, got {flushes}");
    let check = |dev: MemDevice, when: &str| {
        resume(&dev, when);
        let (hdr, data) = split(&dev);
        assert!(visible(&hdr, &data) == want, "{when}: data lost ({what})");
    };
    for n in 1..=flushes {
        let dev = CrashDevice::from_vec(start.clone(), 512).crash_at_flush(n);
        let _ = op(&dev);
        check(dev.crash(), &format!("{what}: crash at flush {n}"));
        check(dev.crash_keeping_some(n), &format!("{what}: crash at flush {n}, cache seed {n}"));
    }
}

#[test]
fn crash_at_every_flush_of_encryption_resumes_without_loss() {
    crash_at_every_flush(image(), |d| encrypt(d, &params("checksum")), "encrypt checksum");
    crash_at_every_flush(image(), |d| encrypt(d, &params("journal")), "encrypt journal");
}

#[test]
fn crash_at_every_flush_of_decryption_resumes_without_loss() {
    let dev = MemDevice::from_vec(image(), 512);
    encrypt(&dev, &params("checksum")).unwrap();
    let encrypted = dev.to_vec();
    crash_at_every_flush(encrypted.clone(), |d| decrypt(d, &params("checksum")), "decrypt checksum");
    crash_at_every_flush(encrypted, |d| decrypt(d, &params("journal")), "decrypt journal");
}

#[test]
fn bad_input_is_refused_before_any_write() {
    // Encrypting a device that is already LUKS.
    let luks = MemDevice::from_vec(image(), 512);
    encrypt(&luks, &params("checksum")).unwrap();
    let (hdr, _) = split(&luks);
    let mut whole = vec![0u8; HDR as usize];
    hdr.read_at(0, &mut whole).unwrap();
    let other_hdr = MemDevice::new(HDR, 512);
    let e = reencrypt::init_encrypt(&other_hdr, &hdr, &pass(), &params("checksum")).unwrap_err();
    assert!(e.to_string().contains("already LUKS device"), "{e}");
    assert!(other_hdr.to_vec().iter().all(|&b| b == 0), "nothing written");
    // Decrypting a volume already in reencryption.
    let dev = MemDevice::from_vec(image(), 512);
    let (hdr, data) = split(&dev);
    let (mut l, _) = reencrypt::init_encrypt(&hdr, &data, &pass(), &params("checksum")).unwrap();
    let before = dev.to_vec();
    let e = reencrypt::init_decrypt(&hdr, data.geometry().size, &mut l, &pass(), &params("checksum"))
        .unwrap_err();
    assert_eq!(e.to_string(), "LUKS2 reencryption already initialized. Aborting operation.");
    assert!(dev.to_vec() == before);
    // A wrong passphrase.
    let dev = MemDevice::from_vec(image(), 512);
    encrypt(&dev, &params("checksum")).unwrap();
    let (hdr, data) = split(&dev);
    let before = dev.to_vec();
    let mut l = Luks::load(&hdr, true).unwrap();
    let bad = Passphrase::new(b"nope".to_vec());
    reencrypt::init_decrypt(&hdr, data.geometry().size, &mut l, &bad, &params("checksum")).unwrap_err();
    assert!(dev.to_vec() == before);
    let _ = WriteFlags::empty();
}

/// cryptsetup's teardown wipes the old keyslots (a header write each) before it drops the
/// reencryption metadata. Killed in between, the volume has every hotzone written, no old
/// keyslot, and the requirement still set: cryptsetup cannot resume that ("No usable token
/// is available."); sealdisk finishes it without loss.
#[test]
fn cryptsetups_teardown_state_without_old_keyslots_finishes() {
    let dev = CrashDevice::from_vec(vec![0u8; (HDR + 2 * MIB) as usize], 512);
    let fp = volume::luks::FormatParams { pbkdf: pbkdf(), ..Default::default() };
    let (_, vk) = volume::luks::format(&dev, &fp, &pass()).unwrap();
    let mut data = plaintext(2 * MIB as usize);
    let spec: CipherSpec = "aes-xts-plain64".parse().unwrap();
    let sp = SectorParams { sector_size: 512, iv_offset: 0, iv_large_sectors: false };
    SectorCipher::new(&spec, &vk, sp).unwrap().encrypt(0, &mut data).unwrap();
    dev.write_at(HDR, &data, WriteFlags::empty()).unwrap();
    dev.flush().unwrap();
    let start = dev.live_image();
    // Find the last crash point before the end where every hotzone is written.
    let run_all = |d: &dyn BlockDevice| -> Result<RunEnd, LuksError> {
        let mut l = Luks::load(d, true)?;
        reencrypt::init(d, d.geometry().size, &mut l, &pass(), &params("checksum"))?;
        reencrypt::run(d, d, &mut l, &pass(), &opts(), &mut |_, _| true)
    };
    let probe = CrashDevice::from_vec(start.clone(), 512);
    run_all(&probe).unwrap();
    let mut state = None;
    for n in (1..=probe.flushes()).rev() {
        let d = CrashDevice::from_vec(start.clone(), 512).crash_at_flush(n);
        let _ = run_all(&d);
        let img = d.crash();
        let l = Luks::load(&img, false).unwrap();
        if let Some(st) = reencrypt::status(&l).unwrap() {
            if formats::luks2::reencrypt::all_done(&st, metadata(&l)) {
                state = Some((img, l, st));
                break;
            }
        }
    }
    let (img, l, st) = state.expect("a crash point with every hotzone written");
    // Do what cryptsetup's teardown does first: wipe the old keyslot from the header.
    let LuksHeader::V2(s) = &l.header else { unreachable!() };
    let mut h = s.header.clone();
    let old = st.digest_old.unwrap();
    let slots = std::mem::take(&mut h.metadata.digests.get_mut(&old).unwrap().keyslots);
    for k in slots {
        h.metadata.keyslots.remove(&k);
    }
    for step in h.write_plan(h.seqid + 1, &s.salts).unwrap().steps {
        if let formats::luks2::WriteStep::Write { offset, bytes } = step {
            img.write_at(offset, &bytes, WriteFlags::empty()).unwrap();
        }
    }
    let mut l = Luks::load(&img, true).unwrap();
    assert!(reencrypt::status(&l).unwrap().is_some());
    let end = reencrypt::run(&img, &img, &mut l, &pass(), &opts(), &mut |_, _| true).unwrap();
    assert_eq!(end, RunEnd::Finished);
    let l = Luks::load(&img, false).unwrap();
    assert!(reencrypt::status(&l).unwrap().is_none());
    let (_, vk) = l.unlock(&img, &pass(), None).unwrap();
    let mut data = vec![0u8; 2 * MIB as usize];
    img.read_at(HDR, &mut data).unwrap();
    SectorCipher::new(&spec, &vk, sp).unwrap().decrypt(0, &mut data).unwrap();
    assert!(data == plaintext(2 * MIB as usize), "data lost");
}

/// Opens the volume (header `hdr`, data `data`) through the one assembly path.
/// A volume stopped mid-run (header `hdr`, data `data`, which holds `plaintext`): opened
/// read-only it reads as the plaintext; opened read-write, a MiB written 1/2 MiB from each
/// end lands; the run then finished keeps both.
fn reads_writes_and_finishes(hdr: &Arc<MemDevice>, data: &Arc<MemDevice>, what: &str) {
    let len = data.geometry().size;
    let v = open_volume(hdr, data, true);
    let mut buf = vec![0u8; len as usize];
    v.device.read_at(0, &mut buf).unwrap();
    assert!(buf == plaintext(len as usize), "{what}: read through the device mid-run");
    drop(v);
    let mut want = plaintext(len as usize);
    let v = open_volume(hdr, data, false);
    let patch: Vec<u8> = (0..MIB as usize).map(|i| (i % 253) as u8).collect();
    for off in [MIB / 2, len - 3 * MIB / 2] {
        v.device.write_at(off, &patch, WriteFlags::empty()).unwrap();
        want[off as usize..(off + MIB) as usize].copy_from_slice(&patch);
    }
    v.device.flush().unwrap();
    drop(v);
    let mut l = Luks::load(&**hdr, true).unwrap();
    let end = reencrypt::run(&**hdr, &**data, &mut l, &pass(), &opts(), &mut |_, _| true).unwrap();
    assert_eq!(end, RunEnd::Finished, "{what}");
    assert!(visible(&**hdr, &**data) == want, "{what}: data written mid-run lost");
}

fn open_volume(hdr: &Arc<MemDevice>, data: &Arc<MemDevice>, read_only: bool) -> volume::Volume {
    let p = pass();
    let mut src = OnePassphrase::new(&p);
    let spec = LuksSpec { header: Some(Storage::new(hdr.clone(), "hdr")), ..LuksSpec::default() };
    let opts = OpenOptions { read_only, ..OpenOptions::default() };
    volume::open_storage(
        Storage::new(data.clone(), "data"),
        Spec::Luks(spec),
        Keys::passphrase(&mut src),
        &opts,
    )
    .unwrap()
}

/// A volume stopped mid-encryption (linear old side, forward) or mid-decryption (linear
/// new side, backward) opens as cryptsetup activates it: the device reads the plaintext
/// across the boundary and takes writes on both sides; the run then resumes and the data
/// written through the device is what the finished volume holds.
#[test]
fn a_volume_mid_encryption_or_decryption_opens_reads_and_writes() {
    for decrypting in [false, true] {
        let what = if decrypting { "mid-decryption" } else { "mid-encryption" };
        let hdr = Arc::new(MemDevice::new(HDR, 512));
        let data = Arc::new(MemDevice::from_vec(plaintext(DATA_LEN as usize), 512));
        let p = params("checksum");
        let (mut l, _) = reencrypt::init_encrypt(&*hdr, &*data, &pass(), &p).unwrap();
        if decrypting {
            let end = reencrypt::run(&*hdr, &*data, &mut l, &pass(), &opts(), &mut |_, _| true).unwrap();
            assert_eq!(end, RunEnd::Finished);
            let mut l2 = Luks::load(&*hdr, true).unwrap();
            reencrypt::init_decrypt(&*hdr, DATA_LEN, &mut l2, &pass(), &p).unwrap();
            l = l2;
        }
        // One hotzone (1 MiB of 3), then stop.
        let end = reencrypt::run(&*hdr, &*data, &mut l, &pass(), &opts(), &mut |done, _| done < MIB).unwrap();
        assert_eq!(end, RunEnd::Interrupted, "{what}");
        let st = reencrypt::status(&Luks::load(&*hdr, false).unwrap()).unwrap().expect("in progress");
        assert_eq!(st.keyslot.direction.as_str(), if decrypting { "backward" } else { "forward" });

        let v = open_volume(&hdr, &data, true);
        let kinds: Vec<bool> =
            v.layers.iter().map(|t| matches!(t, volume::LayerTable::Linear { .. })).collect();
        // Layers: new segment, then old; the plaintext side is linear.
        assert_eq!(kinds, if decrypting { vec![true, false] } else { vec![false, true] }, "{what}");
        drop(v);
        // Writes on both sides of the boundary (1 MiB from the start when encrypting, from
        // the end when decrypting), then the run finishes.
        reads_writes_and_finishes(&hdr, &data, what);
    }
}

/// An encryption and a decryption resumed online (`run_unlocked` over the served
/// [`ReencryptingDevice`](volume::luks::reencrypting::ReencryptingDevice), as the control
/// server runs it) while a client writes through the device: every write lands, in the
/// segment that holds its range at the time, and the finished volume holds them all.
#[test]
fn encryption_and_decryption_run_online_under_client_writes() {
    for decrypting in [false, true] {
        let what = if decrypting { "online decryption" } else { "online encryption" };
        let hdr = Arc::new(MemDevice::new(HDR, 512));
        let data = Arc::new(MemDevice::from_vec(plaintext(DATA_LEN as usize), 512));
        let p = params("checksum");
        let (mut l, _) = reencrypt::init_encrypt(&*hdr, &*data, &pass(), &p).unwrap();
        if decrypting {
            reencrypt::run(&*hdr, &*data, &mut l, &pass(), &opts(), &mut |_, _| true).unwrap();
            l = Luks::load(&*hdr, true).unwrap();
            reencrypt::init_decrypt(&*hdr, DATA_LEN, &mut l, &pass(), &p).unwrap();
        }
        let keys = reencrypt::unlock_keys(&*hdr, &l, &pass(), &Default::default()).unwrap();
        let storage = Storage::new(data.clone(), "data");
        let (dev, _, _) = volume::luks::reencrypting::activate(
            &storage,
            &*hdr,
            &mut l,
            &keys,
            &OpenOptions::default(),
            &Default::default(),
        )
        .unwrap();
        let mut want = plaintext(DATA_LEN as usize);
        let small = RunOptions { hotzone_size: Some(256 << 10), ..RunOptions::default() };
        std::thread::scope(|sc| {
            let (hdr2, data2, dev2) = (hdr.clone(), data.clone(), dev.clone());
            let (mut l2, keys2) = (l.clone(), &keys);
            let run = sc.spawn(move || {
                reencrypt::run_unlocked(&*hdr2, &*data2, &mut l2, keys2, &small, Some(&*dev2), &mut |_, _| {
                    std::thread::sleep(Duration::from_millis(5));
                    true
                })
            });
            for i in 0..48u64 {
                let off = (i * 61 * 4096) % (DATA_LEN - 8192);
                let patch = vec![i as u8 ^ 0x5a; 8192];
                dev.write_at(off, &patch, WriteFlags::empty()).unwrap();
                want[off as usize..off as usize + 8192].copy_from_slice(&patch);
                let mut back = vec![0u8; 8192];
                dev.read_at(off, &mut back).unwrap();
                assert!(back == patch, "{what}: read back at {off}");
                std::thread::sleep(Duration::from_millis(2));
            }
            assert_eq!(run.join().unwrap().unwrap(), RunEnd::Finished, "{what}");
        });
        let mut all = vec![0u8; DATA_LEN as usize];
        dev.read_at(0, &mut all).unwrap();
        assert!(all == want, "{what}: the device after the run");
        assert_eq!(dev.boundary(), if decrypting { 0 } else { DATA_LEN }, "{what}: boundary");
        drop(dev);
        assert!(visible(&*hdr, &*data) == want, "{what}: the finished volume");
    }
}

// Encryption in place with data shift (`--reduce-device-size`, header on the device).

/// 4 MiB device, 1.5 MiB given up: the header takes 768 KiB, 2.5 MiB of data (not a
/// multiple of the shift, so one hotzone is shorter), the first 768 KiB moved to the end.
const SHIFT_DEV: u64 = 4 * MIB;
const REDUCE: u64 = 3 * MIB / 2;
const SHIFT: u64 = REDUCE / 2;
const SHIFT_DATA: u64 = SHIFT_DEV - REDUCE;

fn shift_image() -> Vec<u8> {
    let mut v = plaintext(SHIFT_DEV as usize);
    // What lies past the data is given up; make it recognizable.
    v[SHIFT_DATA as usize..].fill(0xee);
    v
}

fn encrypt_shift(dev: &dyn BlockDevice) -> Result<RunEnd, LuksError> {
    let (mut l, _) = reencrypt::init_encrypt_shift(dev, &pass(), &params("checksum"), REDUCE)?;
    reencrypt::run(dev, dev, &mut l, &pass(), &opts(), &mut |_, _| true)
}

/// The data of a finished data-shift encryption, decrypted with the header's key (the
/// segment starts at the shift); the raw first `SHIFT_DATA` bytes when it is not LUKS.
fn visible_shift(dev: &dyn BlockDevice) -> Vec<u8> {
    let Ok(l) = Luks::load(dev, false) else {
        let mut buf = vec![0u8; SHIFT_DATA as usize];
        dev.read_at(0, &mut buf).unwrap();
        return buf;
    };
    assert!(reencrypt::status(&l).unwrap().is_none(), "visible_shift() needs a finished header");
    let seg = l.segment().unwrap();
    assert_eq!(seg.offset, SHIFT);
    let (_, vk) = l.unlock(dev, &pass(), None).unwrap();
    let mut buf = vec![0u8; SHIFT_DATA as usize];
    dev.read_at(SHIFT, &mut buf).unwrap();
    let spec: CipherSpec = seg.cipher.parse().unwrap();
    let sp = SectorParams { sector_size: seg.sector_size, iv_offset: 0, iv_large_sectors: false };
    SectorCipher::new(&spec, &vk, sp).unwrap().decrypt(0, &mut buf).unwrap();
    buf
}

/// Runs the reencryption in progress (header on `hdr`, data on `data`) one hotzone at a time:
/// after hotzone `i` the regular segments are `want[i]`, and the last step finishes it.
/// Returns the header as the run left it.
fn step_through(
    hdr: &dyn BlockDevice,
    data: &dyn BlockDevice,
    mut l: Luks,
    want: &[Vec<(String, u64, Option<u64>)>],
) -> Luks {
    for (i, w) in want.iter().enumerate().skip(1) {
        let mut n = 0;
        let end = reencrypt::run(hdr, data, &mut l, &pass(), &opts(), &mut |_, _| {
            n += 1;
            n < 2
        })
        .unwrap();
        if i < want.len() - 1 {
            assert_eq!(end, RunEnd::Interrupted);
            assert_eq!(&regular(hdr), w, "after hotzone {i}");
        } else {
            assert_eq!(end, RunEnd::Finished);
        }
        l = Luks::load(hdr, true).unwrap();
    }
    l
}

fn regular(dev: &dyn BlockDevice) -> Vec<(String, u64, Option<u64>)> {
    let l = Luks::load(dev, false).unwrap();
    formats::luks2::reencrypt::ReencryptState::regular_segments(metadata(&l))
        .iter()
        .map(|(_, s)| (s.type_name.clone(), s.offset, s.fixed_size()))
        .collect()
}

#[test]
fn data_shift_encryption_follows_cryptsetups_layouts() {
    let dev = MemDevice::from_vec(shift_image(), 512);
    let (l, slot) = reencrypt::init_encrypt_shift(&dev, &pass(), &params("checksum"), REDUCE).unwrap();
    assert_eq!(slot, 0);
    let st = reencrypt::status(&l).unwrap().unwrap();
    assert_eq!(
        (st.keyslot.mode.as_str(), st.keyslot.direction.as_str(), st.keyslot.resilience.type_name()),
        ("encrypt", "backward", "datashift")
    );
    assert_eq!(st.keyslot.resilience.shift(), SHIFT);
    assert_eq!((st.keyslot.area_offset, st.keyslot.area_size), (290816, 4096));
    let k = 1024;
    let lin = |o: u64, s: u64| ("linear".to_owned(), o * k, Some(s * k));
    let cr = |o: u64, s: Option<u64>| ("crypt".to_owned(), o * k, s.map(|s| s * k));
    // cryptsetup 2.6.1's states for 64 MiB with --reduce-device-size 24M, scaled by 1/16
    // (its header writes, traced): the start state, then one state after each hotzone.
    let want = [
        vec![lin(3328, 768), lin(768, 1792)],
        vec![lin(3328, 768), lin(768, 1024), cr(2560, Some(768))],
        vec![lin(3328, 768), lin(768, 256), cr(1792, Some(1536))],
        vec![lin(3328, 768), cr(1536, Some(1792))],
        vec![cr(768, None)],
    ];
    assert_eq!(regular(&dev), want[0], "start state");
    let mut l_meta = Luks::load(&dev, false).unwrap();
    let m = metadata(&l_meta);
    let backups: Vec<(String, u64, Option<u64>, String)> = m
        .segments
        .values()
        .filter(|s| s.is_backup())
        .map(|s| (s.type_name.clone(), s.offset, s.fixed_size(), s.flags.clone().unwrap().join(",")))
        .collect();
    assert_eq!(
        backups,
        vec![
            ("linear".into(), 3328 * k, Some(768 * k), "backup-moved-segment".into()),
            ("linear".into(), 0, Some(2560 * k), "backup-previous".into()),
            ("crypt".into(), 768 * k, None, "backup-final".into()),
        ]
    );
    step_through(&dev, &dev, l, &want);
    l_meta = Luks::load(&dev, false).unwrap();
    assert!(reencrypt::status(&l_meta).unwrap().is_none());
    assert_eq!(regular(&dev), want[4]);
    assert_eq!(l_meta.active_keyslots(), vec![0]);
    assert!(visible_shift(&dev) == plaintext(SHIFT_DATA as usize), "data lost");
    // The moved copy (plaintext) is gone.
    let mut tail = vec![0u8; SHIFT as usize];
    dev.read_at(SHIFT_DEV - SHIFT, &mut tail).unwrap();
    assert!(tail != plaintext(SHIFT as usize)[..], "moved plaintext left behind");
}

#[test]
fn crash_at_every_flush_of_data_shift_encryption_resumes_without_loss() {
    let want = plaintext(SHIFT_DATA as usize);
    // The run and finish from the start state (init's own window: see init_encrypt_shift).
    let dev = MemDevice::from_vec(shift_image(), 512);
    reencrypt::init_encrypt_shift(&dev, &pass(), &params("checksum"), REDUCE).unwrap();
    let start = dev.to_vec();
    let run = |d: &dyn BlockDevice| -> Result<RunEnd, LuksError> {
        let mut l = Luks::load(d, true)?;
        reencrypt::run(d, d, &mut l, &pass(), &opts(), &mut |_, _| true)
    };
    let probe = CrashDevice::from_vec(start.clone(), 512);
    assert_eq!(run(&probe).unwrap(), RunEnd::Finished);
    let flushes = probe.flushes();
    assert!(flushes > 12, "expected many flushes, got {flushes}");
    let check = |d: MemDevice, when: &str| {
        let mut l = Luks::load(&d, true).unwrap_or_else(|e| panic!("{when}: not LUKS: {e}"));
        if reencrypt::status(&l).unwrap().is_some() {
            let end = reencrypt::run(&d, &d, &mut l, &pass(), &opts(), &mut |_, _| true)
                .unwrap_or_else(|e| panic!("{when}: resume failed: {e:?}"));
            assert_eq!(end, RunEnd::Finished, "{when}");
        }
        assert!(visible_shift(&d) == want, "{when}: data lost");
    };
    for n in 1..=flushes {
        let d = CrashDevice::from_vec(start.clone(), 512).crash_at_flush(n);
        let _ = run(&d);
        check(d.crash(), &format!("data shift: crash at flush {n}"));
        check(d.crash_keeping_some(n), &format!("data shift: crash at flush {n}, cache seed {n}"));
    }
    // Init: power lost at each of its flushes leaves either the plaintext untouched (not
    // LUKS yet) or a start state that runs to the end.
    let probe = CrashDevice::from_vec(shift_image(), 512);
    reencrypt::init_encrypt_shift(&probe, &pass(), &params("checksum"), REDUCE).unwrap();
    for n in 1..=probe.flushes() {
        let d = CrashDevice::from_vec(shift_image(), 512).crash_at_flush(n);
        let _ = reencrypt::init_encrypt_shift(&d, &pass(), &params("checksum"), REDUCE);
        let img = d.crash();
        if Luks::load(&img, false).is_ok() {
            check(img, &format!("data shift init: crash at flush {n}"));
        } else {
            let mut head = vec![0u8; SHIFT_DATA as usize];
            img.read_at(0, &mut head).unwrap();
            // Only the first 32 KiB are sure to be plaintext once the keyslots area is
            // being written: the rest of the first shift is in the moved copy.
            let mut moved = vec![0u8; SHIFT as usize];
            img.read_at(SHIFT_DEV - SHIFT, &mut moved).unwrap();
            let intact = head == want;
            let recoverable =
                head[SHIFT as usize..] == want[SHIFT as usize..] && moved[..] == want[..SHIFT as usize];
            assert!(intact || recoverable, "data shift init: crash at flush {n}: data lost");
        }
    }
}

#[test]
fn data_shift_bad_input_is_refused_before_any_write() {
    let try_ = |img: Vec<u8>, reduce: u64, msg: &str| {
        let dev = MemDevice::from_vec(img, 512);
        let before = dev.to_vec();
        let e = reencrypt::init_encrypt_shift(&dev, &pass(), &params("checksum"), reduce).unwrap_err();
        assert!(e.to_string().contains(msg), "{reduce}: {e}");
        assert!(dev.to_vec() == before, "{reduce}: wrote");
    };
    try_(shift_image(), 1000, "Reduce size must be multiple of 512 bytes sector.");
    try_(shift_image(), SHIFT_DEV, "Failed to initialize LUKS2 reencryption in metadata.");
    try_(shift_image(), 2 * SHIFT_DEV, "too small");
    try_(shift_image(), 512 << 10, "No space for new keyslot.");
    let dev = MemDevice::from_vec(shift_image(), 512);
    encrypt_shift(&dev).unwrap();
    try_(dev.to_vec(), REDUCE, "already LUKS device");
}

/// A volume mid data-shift encryption opens as cryptsetup maps its segments (the moved
/// copy, the data in place, the crypt segment shift bytes up), at every state a run stops
/// in: the start state, after each hotzone, and with a hotzone left in reencryption by a
/// crash. The device reads the plaintext; writes across it (the moved part, the old side,
/// the boundary, the new side) land where the run finds them, so the finished volume
/// holds them.
#[test]
fn a_volume_mid_data_shift_encryption_opens_reads_and_writes() {
    let dev = MemDevice::from_vec(shift_image(), 512);
    let (mut l, _) = reencrypt::init_encrypt_shift(&dev, &pass(), &params("checksum"), REDUCE).unwrap();
    let start = dev.to_vec();
    let mut states = vec![("start state".to_owned(), start.clone())];
    for i in 1..=3 {
        let mut n = 0;
        let end = reencrypt::run(&dev, &dev, &mut l, &pass(), &opts(), &mut |_, _| {
            n += 1;
            n < 2
        })
        .unwrap();
        assert_eq!(end, RunEnd::Interrupted);
        states.push((format!("after hotzone {i}"), dev.to_vec()));
        l = Luks::load(&dev, true).unwrap();
    }
    // Crashes with a hotzone flagged in reencryption (its new place half written).
    let run = |d: &CrashDevice| {
        let mut l = Luks::load(d, true).unwrap();
        let _ = reencrypt::run(d, d, &mut l, &pass(), &opts(), &mut |_, _| true);
    };
    let probe = CrashDevice::from_vec(start.clone(), 512);
    run(&probe);
    let mut hot = 0;
    for n in 1..=probe.flushes() {
        let d = CrashDevice::from_vec(start.clone(), 512).crash_at_flush(n);
        run(&d);
        for img in [d.crash(), d.crash_keeping_some(n)] {
            let in_hot = Luks::load(&img, false)
                .ok()
                .and_then(|l| reencrypt::status(&l).ok().flatten())
                .is_some_and(|st| st.hot.is_some());
            if in_hot {
                hot += 1;
                states.push((format!("crash at flush {n}, hotzone in reencryption"), img.to_vec()));
            }
        }
    }
    assert!(hot >= 3, "expected crashes mid-hotzone, got {hot}");
    let want0 = plaintext(SHIFT_DATA as usize);
    for (what, img) in states {
        let dev = Arc::new(MemDevice::from_vec(img, 512));
        let open = |read_only: bool| {
            let p = pass();
            let mut src = OnePassphrase::new(&p);
            let opts = OpenOptions { read_only, ..OpenOptions::default() };
            let spec = Spec::Luks(LuksSpec::default());
            volume::open_storage(Storage::new(dev.clone(), "dev"), spec, Keys::passphrase(&mut src), &opts)
                .unwrap_or_else(|e| panic!("{what}: open: {e}"))
        };
        let v = open(true);
        assert_eq!(v.device.geometry().size, SHIFT_DATA, "{what}");
        let t = v.crypt_table().expect("a crypt layer");
        assert_eq!((t.offset, t.len, t.iv_offset), (SHIFT / 512, SHIFT_DATA / 512, 0), "{what}");
        // The old side: the moved copy, then the data in place (the kernel's table of the
        // start state is the same two linear lines: reencrypt_kernel.rs).
        let lin: Vec<(u64, u64)> = v
            .layers
            .iter()
            .filter_map(|l| match l {
                volume::LayerTable::Linear { offset, len } => Some((*offset, *len)),
                _ => None,
            })
            .collect();
        assert_eq!(
            lin,
            [((SHIFT_DEV - SHIFT) / 512, SHIFT / 512), (SHIFT / 512, (SHIFT_DATA - SHIFT) / 512)]
        );
        let mut buf = vec![0u8; SHIFT_DATA as usize];
        v.device.read_at(0, &mut buf).unwrap();
        assert!(buf == want0, "{what}: read through the device");
        drop(v);
        let mut want = want0.clone();
        let v = open(false);
        for (i, off) in
            [4096, SHIFT - 4096, MIB - 4096, SHIFT_DATA / 2 + 4096, 1792 * 1024 - 4096, SHIFT_DATA - 12288]
                .into_iter()
                .enumerate()
        {
            let patch = vec![0xa0 ^ i as u8; 8192];
            v.device.write_at(off, &patch, WriteFlags::empty()).unwrap();
            want[off as usize..off as usize + 8192].copy_from_slice(&patch);
        }
        v.device.flush().unwrap();
        v.device.read_at(0, &mut buf).unwrap();
        assert!(buf == want, "{what}: written data read back");
        drop(v);
        let mut l = Luks::load(&*dev, true).unwrap();
        let end = reencrypt::run(&*dev, &*dev, &mut l, &pass(), &opts(), &mut |_, _| true).unwrap();
        assert_eq!(end, RunEnd::Finished, "{what}");
        assert!(visible_shift(&*dev) == want, "{what}: data written mid-run lost");
    }
}

// Decryption with data shift (`--decrypt --header NEW` of a header on the device).

/// 4 MiB device whose LUKS2 header (and data offset) is 768 KiB: 3.25 MiB of data, whose
/// forward part (2.5 MiB) is not a multiple of the shift (one hotzone is shorter). The new
/// header file sits after the device on the same image (one crash device for both).
const DS_DEV: u64 = 4 * MIB;
const DS_SHIFT: u64 = 768 << 10;
const DS_DATA: u64 = DS_DEV - DS_SHIFT;

/// `[LUKS2 volume (header on it) | new header file (zeroes)]`, the volume's data
/// `plaintext(DS_DATA)`.
fn ds_image() -> Vec<u8> {
    let img = MemDevice::new(DS_DEV + DS_SHIFT, 512);
    let (dev, _) = ds_split(&img);
    let fp = volume::luks::FormatParams {
        pbkdf: pbkdf(),
        offset: Some(DS_SHIFT / 512),
        metadata_size: Some(16 << 10),
        keyslots_size: Some(DS_SHIFT - (32 << 10)),
        ..volume::luks::FormatParams::default()
    };
    let (l, vk) = volume::luks::format(&dev, &fp, &pass()).unwrap();
    let seg = l.segment().unwrap();
    assert_eq!(seg.offset, DS_SHIFT);
    let spec: CipherSpec = seg.cipher.parse().unwrap();
    let sp = SectorParams { sector_size: seg.sector_size, iv_offset: 0, iv_large_sectors: false };
    let mut data = plaintext(DS_DATA as usize);
    SectorCipher::new(&spec, &vk, sp).unwrap().encrypt(0, &mut data).unwrap();
    dev.write_at(DS_SHIFT, &data, WriteFlags::empty()).unwrap();
    img.to_vec()
}

/// The device and the new header file.
fn ds_split(img: &dyn BlockDevice) -> (Slice<&dyn BlockDevice>, Slice<&dyn BlockDevice>) {
    (Slice::new(img, 0, DS_DEV).unwrap(), Slice::new(img, DS_DEV, DS_SHIFT).unwrap())
}

fn decrypt_shift(img: &dyn BlockDevice) -> Result<RunEnd, LuksError> {
    let (dev, hdr) = ds_split(img);
    let mut l = reencrypt::init_decrypt_shift(&hdr, &dev, &pass(), &params("checksum"))?;
    reencrypt::run(&hdr, &dev, &mut l, &pass(), &opts(), &mut |_, _| true)
}

/// What a client of the volume mid data-shift decryption (header `hdr`, device bytes
/// `dev`) reads, activated (on copies) as the server activates it; whether the activation
/// wrote (it recovers a last hotzone a crash left in reencryption, as cryptsetup's open
/// does); and the data once a run finished it after that open.
fn served_ds(hdr: &dyn BlockDevice, dev: Vec<u8>) -> (Vec<u8>, bool, Vec<u8>) {
    let dev = Arc::new(MemDevice::from_vec(dev, 4096));
    let hdr = MemDevice::from_vec(read_all(hdr), 512);
    let before = (dev.to_vec(), hdr.to_vec());
    let mut l = Luks::load(&hdr, true).unwrap();
    let keys = reencrypt::unlock_keys(&hdr, &l, &pass(), &Default::default()).unwrap();
    let storage = Storage::new(dev.clone(), "data");
    // Read-only first: refused (nothing written) exactly where the open has to recover.
    let ro = OpenOptions { read_only: true, ..OpenOptions::default() };
    let ro_refused = match volume::luks::reencrypting::activate(
        &storage,
        &hdr,
        &mut l.clone(),
        &keys,
        &ro,
        &Default::default(),
    ) {
        Ok(_) => false,
        Err(e) => {
            let mut msg = e.to_string();
            let mut src = std::error::Error::source(&e);
            while let Some(s) = src {
                msg = format!("{msg}: {s}");
                src = s.source();
            }
            assert!(msg.contains("open it read-write"), "read-only open: {msg}");
            true
        }
    };
    assert!((dev.to_vec(), hdr.to_vec()) == before, "a read-only open wrote");
    let (vol, _, _) = volume::luks::reencrypting::activate(
        &storage,
        &hdr,
        &mut l,
        &keys,
        &OpenOptions::default(),
        &Default::default(),
    )
    .unwrap();
    let wrote = (dev.to_vec(), hdr.to_vec()) != before;
    assert_eq!(ro_refused, wrote, "a read-only open is refused where, and only where, the open recovers");
    assert_eq!(vol.geometry().size, DS_DATA);
    let mut got = vec![0u8; DS_DATA as usize];
    vol.read_at(0, &mut got).unwrap();
    drop(vol);
    let mut l = Luks::load(&hdr, true).unwrap();
    let end = reencrypt::run(&hdr, &*dev, &mut l, &pass(), &opts(), &mut |_, _| true).unwrap();
    assert_eq!(end, RunEnd::Finished);
    (got, wrote, dev.to_vec()[..DS_DATA as usize].to_vec())
}

fn read_all(d: &dyn BlockDevice) -> Vec<u8> {
    let mut v = vec![0u8; d.geometry().size as usize];
    d.read_at(0, &mut v).unwrap();
    v
}

/// A volume mid data-shift decryption is served as cryptsetup maps it (the moved
/// ciphertext, the plaintext done, the ciphertext `shift` bytes up), in each state a run
/// stops in: it reads as the plaintext, a write into each region and across each boundary
/// lands, and the run finished afterwards keeps every write.
#[test]
fn a_volume_mid_data_shift_decryption_serves_its_data_and_keeps_writes() {
    for hotzones in 0..=4u32 {
        let what = format!("stopped after {hotzones} hotzones");
        let img = ds_image();
        let dev = Arc::new(MemDevice::from_vec(img[..DS_DEV as usize].to_vec(), 512));
        let hdr = MemDevice::from_vec(img[DS_DEV as usize..].to_vec(), 512);
        let mut l = reencrypt::init_decrypt_shift(&hdr, &*dev, &pass(), &params("checksum")).unwrap();
        let mut n = 0;
        let end = reencrypt::run(&hdr, &*dev, &mut l, &pass(), &opts(), &mut |_, _| {
            n += 1;
            n <= hotzones
        })
        .unwrap();
        assert_eq!(end, RunEnd::Interrupted, "{what}");
        let mut want = plaintext(DS_DATA as usize);
        let (got, wrote, _) = served_ds(&hdr, dev.to_vec());
        assert!(got == want && !wrote, "{what}: reads (the open wrote: {wrote})");
        let mut l = Luks::load(&hdr, true).unwrap();
        let keys = reencrypt::unlock_keys(&hdr, &l, &pass(), &Default::default()).unwrap();
        let storage = Storage::new(dev.clone(), "data");
        let (vol, new, old) = volume::luks::reencrypting::activate(
            &storage,
            &hdr,
            &mut l,
            &keys,
            &OpenOptions::default(),
            &Default::default(),
        )
        .unwrap();
        assert!(new.crypt().is_none(), "{what}: the new side is plaintext");
        assert_eq!(old.len(), 2, "{what}: the moved and the shifted ciphertext");
        // The moved ciphertext, the cut at its end, both boundaries a run stops at (the
        // plaintext done / the ciphertext not reached), the ciphertext not reached, the end.
        let offs = [4096, DS_SHIFT - 8192, 2 * DS_SHIFT - 4096, 3 * DS_SHIFT - 12288, 3 * DS_SHIFT + 4096];
        for (i, &off) in offs.iter().chain([DS_DATA - 16384].iter()).enumerate() {
            let patch = vec![0xa0 + i as u8; 16384];
            vol.write_at(off, &patch, WriteFlags::empty()).unwrap();
            want[off as usize..off as usize + patch.len()].copy_from_slice(&patch);
        }
        vol.flush().unwrap();
        let mut got = vec![0u8; DS_DATA as usize];
        vol.read_at(0, &mut got).unwrap();
        assert!(got == want, "{what}: reads after the writes");
        drop(vol);
        let mut l = Luks::load(&hdr, true).unwrap();
        let end = reencrypt::run(&hdr, &*dev, &mut l, &pass(), &opts(), &mut |_, _| true).unwrap();
        assert_eq!(end, RunEnd::Finished, "{what}");
        assert!(dev.to_vec()[..DS_DATA as usize] == want[..], "{what}: the finished run lost writes");
    }
}

/// The data as a reader of the finished volume sees it: the plaintext at 0 with the new
/// header (`linear @0`), or decrypted at the shift with a plain LUKS2 header (in the new
/// file, or still on the device).
fn visible_ds(img: &dyn BlockDevice) -> Vec<u8> {
    let (dev, hdr) = ds_split(img);
    let mut buf = vec![0u8; DS_DATA as usize];
    let (l, meta): (Luks, &dyn BlockDevice) = match Luks::load(&hdr, false) {
        Ok(l) => (l, &hdr),
        Err(_) => (Luks::load(&dev, false).expect("neither header is LUKS"), &dev),
    };
    assert!(reencrypt::status(&l).unwrap().is_none(), "visible_ds() needs a finished header");
    let first = metadata(&l).segments.values().next().unwrap().clone();
    if first.type_name == "linear" {
        assert_eq!(first.offset, 0, "a decrypted volume's data starts at 0");
        assert!(l.active_keyslots().is_empty(), "a decrypted volume keeps no keyslot");
        dev.read_at(0, &mut buf).unwrap();
        return buf;
    }
    let seg = l.segment().unwrap();
    dev.read_at(seg.offset, &mut buf).unwrap();
    let (_, vk) = l.unlock(meta, &pass(), None).unwrap();
    let spec: CipherSpec = seg.cipher.parse().unwrap();
    let sp = SectorParams { sector_size: seg.sector_size, iv_offset: 0, iv_large_sectors: false };
    SectorCipher::new(&spec, &vk, sp).unwrap().decrypt(0, &mut buf).unwrap();
    buf
}

#[test]
fn data_shift_decryption_follows_cryptsetups_layouts() {
    let img = MemDevice::from_vec(ds_image(), 512);
    let (dev, hdr) = ds_split(&img);
    let mut l = reencrypt::init_decrypt_shift(&hdr, &dev, &pass(), &params("checksum")).unwrap();
    assert!(Luks::load(&dev, false).is_err(), "the device's header is still LUKS");
    let st = reencrypt::status(&l).unwrap().unwrap();
    assert_eq!(
        (st.keyslot.mode.as_str(), st.keyslot.direction.as_str(), st.keyslot.resilience.type_name()),
        ("decrypt", "forward", "datashift-checksum")
    );
    assert_eq!(st.version, 3);
    assert_eq!(st.keyslot.resilience.shift(), DS_SHIFT);
    let k = 1024;
    let lin = |o: u64, s: Option<u64>| ("linear".to_owned(), o * k, s.map(|s| s * k));
    let cr = |o: u64, s: Option<u64>| ("crypt".to_owned(), o * k, s.map(|s| s * k));
    // cryptsetup 2.6.1's states (64 MiB, 16 MiB header, traced; here scaled): the start
    // state, then one after each hotzone.
    let want = [
        vec![cr(0, Some(768)), cr(1536, None)],
        vec![cr(0, Some(768)), lin(768, Some(768)), cr(2304, None)],
        vec![cr(0, Some(768)), lin(768, Some(1536)), cr(3072, None)],
        vec![cr(0, Some(768)), lin(768, Some(2304)), cr(3840, None)],
        vec![cr(0, Some(768)), lin(768, None)],
        vec![lin(0, None)],
    ];
    assert_eq!(regular(&hdr), want[0], "start state");
    let m = Luks::load(&hdr, false).unwrap();
    let backups: Vec<(String, u64, Option<u64>, String)> = metadata(&m)
        .segments
        .values()
        .filter(|s| s.is_backup())
        .map(|s| (s.type_name.clone(), s.offset, s.fixed_size(), s.flags.clone().unwrap().join(",")))
        .collect();
    assert_eq!(
        backups,
        vec![
            ("crypt".into(), 0, Some(768 * k), "backup-moved-segment".into()),
            ("crypt".into(), 768 * k, None, "backup-previous".into()),
            ("linear".into(), 0, None, "backup-final".into()),
        ]
    );
    l = step_through(&hdr, &dev, l, &want);
    assert!(reencrypt::status(&l).unwrap().is_none());
    assert_eq!(regular(&hdr), want[5]);
    assert!(l.active_keyslots().is_empty(), "keyslots left");
    assert!(metadata(&l).digests.is_empty(), "digests left");
    assert!(visible_ds(&img) == plaintext(DS_DATA as usize), "data lost");
}

#[test]
fn crash_at_every_flush_of_data_shift_decryption_resumes_without_loss() {
    let want = plaintext(DS_DATA as usize);
    let start = ds_image();
    // 4096-byte blocks: the last hotzone's checksums are of 4096-byte blocks (cryptsetup's
    // choice), which a crash must not tear (on a 512-byte device the disk's cache could).
    let probe = CrashDevice::from_vec(start.clone(), 4096);
    assert_eq!(decrypt_shift(&probe).unwrap(), RunEnd::Finished);
    let flushes = probe.flushes();
    assert!(flushes > 12, "expected many flushes, got {flushes}");
    // What the CLI does next: resume a run in progress; with a plain header in the new file
    // (init cut short after the device lost its magic) decrypt in place with it, as
    // cryptsetup would; with the device still LUKS, start again (the new file is redone).
    let recovered = std::cell::Cell::new(0);
    let check = |img: MemDevice, when: &str| {
        let (dev, hdr) = ds_split(&img);
        match Luks::load(&hdr, true) {
            Ok(mut l) if reencrypt::status(&l).unwrap().is_some() => {
                // Served as it is (on copies): the plaintext, after the open recovered the
                // last hotzone (decrypted in place) if the crash hit it; a run finishes it.
                let (got, wrote, done) = served_ds(&hdr, read_all(&dev));
                assert!(got == want, "{when}: the served volume reads wrong");
                assert!(done == want, "{when}: the run after the serving open lost data");
                recovered.set(recovered.get() + wrote as u32);
                let end = reencrypt::run(&hdr, &dev, &mut l, &pass(), &opts(), &mut |_, _| true)
                    .unwrap_or_else(|e| panic!("{when}: resume failed: {e:?}"));
                assert_eq!(end, RunEnd::Finished, "{when}");
            }
            Ok(l) if metadata(&l).segments.values().next().is_some_and(|s| s.type_name == "linear") => {}
            Ok(mut l) if Luks::load(&dev, false).is_err() => {
                let (data_dev, size) = (&dev, DS_DEV);
                reencrypt::init_decrypt(&hdr, size, &mut l, &pass(), &params("checksum"))
                    .unwrap_or_else(|e| panic!("{when}: init of the in-place decryption: {e:?}"));
                let end = reencrypt::run(&hdr, data_dev, &mut l, &pass(), &opts(), &mut |_, _| true)
                    .unwrap_or_else(|e| panic!("{when}: in-place decryption: {e:?}"));
                assert_eq!(end, RunEnd::Finished, "{when}");
                let mut buf = vec![0u8; DS_DATA as usize];
                dev.read_at(DS_SHIFT, &mut buf).unwrap();
                assert!(buf == want, "{when}: data lost (in place)");
                return;
            }
            _ => {
                Luks::load(&dev, false).unwrap_or_else(|e| panic!("{when}: no header left: {e}"));
                assert_eq!(decrypt_shift(&img).unwrap(), RunEnd::Finished, "{when}: started again");
            }
        }
        assert!(visible_ds(&img) == want, "{when}: data lost");
    };
    for n in 1..=flushes {
        let d = CrashDevice::from_vec(start.clone(), 4096).crash_at_flush(n);
        let _ = decrypt_shift(&d);
        check(d.crash(), &format!("data shift decryption: crash at flush {n}"));
        check(d.crash_keeping_some(n), &format!("data shift decryption: crash at flush {n}, cache seed {n}"));
    }
    assert!(recovered.get() > 0, "no crash left the last hotzone in reencryption");
}

#[test]
fn data_shift_decryption_bad_input_is_refused_before_any_write() {
    let try_ = |img: Vec<u8>, pw: &[u8], p: ReencryptParams, msg: &str| {
        let m = MemDevice::from_vec(img, 512);
        let before = m.to_vec();
        let (dev, hdr) = ds_split(&m);
        let e = reencrypt::init_decrypt_shift(&hdr, &dev, &Passphrase::new(pw.to_vec()), &p).unwrap_err();
        assert!(e.to_string().contains(msg), "{e}");
        assert!(m.to_vec() == before, "{msg}: wrote");
    };
    try_(ds_image(), b"wrong", params("checksum"), "No key available with this passphrase.");
    try_(ds_image(), b"pw", params("journal"), "Moved segment too large. Requested size 786432");
    try_(ds_image(), b"pw", params("none"), "cannot be applied to current reencryption operation.");
    // Not LUKS (a finished decryption).
    let m = MemDevice::from_vec(ds_image(), 512);
    decrypt_shift(&m).unwrap();
    try_(m.to_vec(), b"pw", params("checksum"), "not a valid LUKS");
    // Mid-run it opens (see a_volume_mid_data_shift_decryption_serves_its_data_and_keeps_writes),
    // but not as a two-segment reencryption (what an online run would need).
    let m = MemDevice::from_vec(ds_image(), 512);
    let (dev, hdr) = ds_split(&m);
    reencrypt::init_decrypt_shift(&hdr, &dev, &pass(), &params("checksum")).unwrap();
    let mut l = Luks::load(&hdr, false).unwrap();
    reencrypt::check_openable(&l).unwrap();
    let keys = reencrypt::unlock_keys(&hdr, &l, &pass(), &Default::default()).unwrap();
    let before = m.to_vec();
    let e = reencrypt::prepare_activation(&hdr, &dev, &mut l, &keys, false).unwrap_err();
    assert!(e.to_string().contains("decryption with data shift"), "{e}");
    assert!(m.to_vec() == before, "activation refused after writing");
}

// Encryption with data shift and a detached header (cryptsetup 2.6.1 `reencrypt --encrypt
// --header FILE --reduce-device-size R`): the data is encrypted in place (offset 0) in
// R-long hotzones, backward; the header file is R long. Here R = 1 MiB and 3.5 MiB of
// data (cryptsetup's steps: the top R, then down, a [R, b) piece, the last [0, R)).
const DH_R: u64 = MIB;
const DH_DATA: u64 = 3 * MIB + MIB / 2;

/// `[header file (R, zeroes) | data (plaintext)]`.
fn dh_image() -> Vec<u8> {
    let mut v = vec![0u8; (DH_R + DH_DATA) as usize];
    v[DH_R as usize..].copy_from_slice(&plaintext(DH_DATA as usize));
    v
}

fn dh_split(dev: &dyn BlockDevice) -> (Slice<&dyn BlockDevice>, Slice<&dyn BlockDevice>) {
    (Slice::new(dev, 0, DH_R).unwrap(), Slice::new(dev, DH_R, DH_DATA).unwrap())
}

fn dh_params(reduce: u64) -> ReencryptParams {
    let mut p = params("checksum");
    p.layout.reduce_device_size = Some(reduce);
    p
}

fn encrypt_dh(dev: &dyn BlockDevice) -> Result<RunEnd, LuksError> {
    let (hdr, data) = dh_split(dev);
    let (mut l, _) = reencrypt::init_encrypt(&hdr, &data, &pass(), &dh_params(DH_R))?;
    reencrypt::run(&hdr, &data, &mut l, &pass(), &opts(), &mut |_, _| true)
}

#[test]
fn detached_data_shift_encryption_follows_cryptsetups_layouts() {
    let img = MemDevice::from_vec(dh_image(), 512);
    let (hdr, data) = dh_split(&img);
    let (mut l, slot) = reencrypt::init_encrypt(&hdr, &data, &pass(), &dh_params(DH_R)).unwrap();
    assert_eq!(slot, 0);
    let st = reencrypt::status(&l).unwrap().unwrap();
    assert_eq!(
        (st.keyslot.mode.as_str(), st.keyslot.direction.as_str(), st.keyslot.resilience.type_name()),
        ("encrypt", "backward", "datashift")
    );
    assert_eq!((st.keyslot.resilience.shift(), st.keyslot.area_size, st.version), (DH_R, 4096, 2));
    let m = metadata(&l);
    assert_eq!((m.metadata_size(), m.config.keyslots_size), (16 << 10, DH_R - (32 << 10)));
    let backups: Vec<(String, u64, Option<u64>, String)> = m
        .segments
        .values()
        .filter(|s| s.is_backup())
        .map(|s| (s.type_name.clone(), s.offset, s.fixed_size(), s.flags.clone().unwrap().join(",")))
        .collect();
    assert_eq!(
        backups,
        vec![
            ("linear".into(), 0, Some(DH_DATA), "backup-previous".into()),
            ("crypt".into(), 0, None, "backup-final".into()),
        ]
    );
    let k = 512 << 10;
    let lin = |o: u64, s: Option<u64>| ("linear".to_owned(), o * k, s.map(|s| s * k));
    let cr = |o: u64, s: Option<u64>| ("crypt".to_owned(), o * k, s.map(|s| s * k));
    // cryptsetup 2.6.1's states (30 MiB, R = 8 MiB, traced with strace; here in 512 KiB
    // units): the start state, then one after each hotzone.
    let want = [
        vec![lin(0, Some(7))],
        vec![lin(0, Some(5)), cr(5, None)],
        vec![lin(0, Some(3)), cr(3, None)],
        vec![lin(0, Some(2)), cr(2, None)],
        vec![cr(0, None)],
    ];
    assert_eq!(regular(&hdr), want[0], "start state");
    l = step_through(&hdr, &data, l, &want);
    assert!(reencrypt::status(&l).unwrap().is_none());
    assert_eq!(regular(&hdr), want[4]);
    assert!(visible(&hdr, &data) == plaintext(DH_DATA as usize), "data lost");
    // sealdisk's hotzone checksums (hashes of plaintext) are gone from the header.
    let h = {
        let mut b = vec![0u8; DH_R as usize];
        hdr.read_at(0, &mut b).unwrap();
        b
    };
    assert!(!h.windows(16).any(|w| w == b"sealdisk-hzsums\0"), "hotzone record left in the header");
}

#[test]
fn crash_at_every_flush_of_detached_data_shift_encryption_resumes_without_loss() {
    let want = plaintext(DH_DATA as usize);
    let probe = CrashDevice::from_vec(dh_image(), 512);
    assert_eq!(encrypt_dh(&probe).unwrap(), RunEnd::Finished);
    let flushes = probe.flushes();
    assert!(flushes > 12, "expected many flushes, got {flushes}");
    let mut hot = 0;
    let check = |img: MemDevice, when: &str, hot: &mut u32| {
        let (hdr, data) = dh_split(&img);
        if let Ok(mut l) = Luks::load(&hdr, true) {
            let st = reencrypt::status(&l).unwrap();
            if st.as_ref().is_some_and(|s| s.hot.is_some()) {
                *hot += 1;
                // Without sealdisk's record (a run cryptsetup left there) the hotzone is not
                // guessed at: refused, nothing written.
                let copy = MemDevice::from_vec(img.to_vec(), 512);
                let (ch, cd) = dh_split(&copy);
                let m = metadata(&l);
                let gap_start = m.keyslots.values().map(|k| k.area.offset + k.area.size).max().unwrap();
                let mut buf = vec![0u8; (DH_R - gap_start) as usize];
                ch.read_at(gap_start, &mut buf).unwrap();
                let at = buf.windows(16).position(|w| w == b"sealdisk-hzsums\0").expect("no hotzone record");
                ch.write_at(gap_start + at as u64, &[0u8; 512], WriteFlags::empty()).unwrap();
                let before = copy.to_vec();
                let mut cl = Luks::load(&ch, true).unwrap();
                let e = reencrypt::run(&ch, &cd, &mut cl, &pass(), &opts(), &mut |_, _| true).unwrap_err();
                assert!(e.to_string().contains("Cannot recover the interrupted hotzone"), "{when}: {e}");
                assert!(copy.to_vec() == before, "{when}: a refused recovery wrote");
            }
            if st.is_some() {
                let end = reencrypt::run(&hdr, &data, &mut l, &pass(), &opts(), &mut |_, _| true)
                    .unwrap_or_else(|e| panic!("{when}: resume failed: {e:?}"));
                assert_eq!(end, RunEnd::Finished, "{when}");
            }
        }
        assert!(visible(&hdr, &data) == want, "{when}: data lost");
    };
    for n in 1..=flushes {
        let d = CrashDevice::from_vec(dh_image(), 512).crash_at_flush(n);
        let _ = encrypt_dh(&d);
        check(d.crash(), &format!("detached data shift: crash at flush {n}"), &mut hot);
        check(
            d.crash_keeping_some(n),
            &format!("detached data shift: crash at flush {n}, cache seed {n}"),
            &mut hot,
        );
    }
    assert!(hot >= 4, "expected crashes mid-hotzone, got {hot}");
}

#[test]
fn detached_data_shift_bad_input_is_refused_before_any_write() {
    let try_ = |p: ReencryptParams, msg: &str| {
        let img = MemDevice::from_vec(dh_image(), 512);
        let before = img.to_vec();
        let (hdr, data) = dh_split(&img);
        let e = reencrypt::init_encrypt(&hdr, &data, &pass(), &p).unwrap_err();
        assert!(e.to_string().contains(msg), "{msg}: {e}");
        assert!(img.to_vec() == before, "{msg}: wrote");
    };
    try_(dh_params(DH_DATA + 4096), "Failed to initialize LUKS2 reencryption in metadata.");
    try_(dh_params(64 << 10), "No space for new keyslot.");
    let mut p = dh_params(DH_R);
    p.layout.keyslots_size = Some(DH_R);
    try_(p, "LUKS2 metadata size is larger than data shift value.");
    let mut p = dh_params(DH_R);
    p.layout.metadata_size = Some(3 << 10);
    try_(p, "Unsupported LUKS2 metadata size options.");
    let mut p = dh_params(DH_R - 512);
    p.sector_size = Some(4096);
    try_(p, "Unsupported LUKS2 metadata size options.");
    let mut p = dh_params(DH_R + 512);
    p.layout.keyslots_size = Some(DH_R - (32 << 10));
    p.sector_size = Some(4096);
    try_(p, "Data shift value is not aligned to encryption sector size (4096 bytes).");
}

/// `--hotzone-size` at the start of a data-shift decryption is the moved segment's size
/// (cryptsetup 2.6.1: `crypt @0 (H)`, then `crypt @S+H iv H/512`), at most the shift.
#[test]
fn data_shift_decryption_hotzone_size_is_the_moved_segment() {
    let mut p = params("checksum");
    p.layout.hotzone_size = Some(256 << 10);
    let img = MemDevice::from_vec(ds_image(), 512);
    let (dev, hdr) = ds_split(&img);
    let mut l = reencrypt::init_decrypt_shift(&hdr, &dev, &pass(), &p).unwrap();
    let k = 1024;
    let cr = |o: u64, s: Option<u64>| ("crypt".to_owned(), o * k, s.map(|s| s * k));
    assert_eq!(regular(&hdr), vec![cr(0, Some(256)), cr(768 + 256, None)]);
    let m = Luks::load(&hdr, false).unwrap();
    let seg1 = metadata(&m).segments[&1].clone();
    assert_eq!(seg1.crypt.unwrap().iv_tweak, 512, "iv tweak of the second segment");
    assert_eq!(
        reencrypt::run(&hdr, &dev, &mut l, &pass(), &opts(), &mut |_, _| true).unwrap(),
        RunEnd::Finished
    );
    assert!(visible_ds(&img) == plaintext(DS_DATA as usize), "data lost");
    // Crashes at every flush of that run resume without loss.
    let probe = CrashDevice::from_vec(ds_image(), 4096);
    let run = |d: &dyn BlockDevice| -> Result<RunEnd, LuksError> {
        let (dev, hdr) = ds_split(d);
        let mut l = reencrypt::init_decrypt_shift(&hdr, &dev, &pass(), &p)?;
        reencrypt::run(&hdr, &dev, &mut l, &pass(), &opts(), &mut |_, _| true)
    };
    run(&probe).unwrap();
    for n in 1..=probe.flushes() {
        let d = CrashDevice::from_vec(ds_image(), 4096).crash_at_flush(n);
        let _ = run(&d);
        let img = d.crash();
        let (dev, hdr) = ds_split(&img);
        if let Ok(mut l) = Luks::load(&hdr, true) {
            if reencrypt::status(&l).unwrap().is_some() {
                reencrypt::run(&hdr, &dev, &mut l, &pass(), &opts(), &mut |_, _| true)
                    .unwrap_or_else(|e| panic!("crash at flush {n}: {e}"));
                assert!(visible_ds(&img) == plaintext(DS_DATA as usize), "crash at flush {n}: data lost");
            }
        }
    }
    // Larger than the shift, or not a multiple of the checksum block: refused, unwritten.
    for (h, msg) in [
        (DS_SHIFT + 4096, "Moved segment size can not be greater than data shift value."),
        (6000, "Failed to initialize LUKS2 reencryption in metadata."),
    ] {
        let mut p = params("checksum");
        p.layout.hotzone_size = Some(h);
        let img = MemDevice::from_vec(ds_image(), 512);
        let before = img.to_vec();
        let (dev, hdr) = ds_split(&img);
        let e = reencrypt::init_decrypt_shift(&hdr, &dev, &pass(), &p).unwrap_err();
        assert!(e.to_string().contains(msg), "{h}: {e}");
        assert!(img.to_vec() == before, "{h}: wrote");
    }
}

/// A volume stopped mid detached data-shift encryption opens (old plaintext below the
/// boundary, the new crypt segment above, both in place): reads are the plaintext, writes
/// on both sides are kept by the rest of the run.
#[test]
fn a_volume_mid_detached_data_shift_encryption_opens_reads_and_writes() {
    let hdr = Arc::new(MemDevice::new(DH_R, 512));
    let data = Arc::new(MemDevice::from_vec(plaintext(DH_DATA as usize), 512));
    let (mut l, _) = reencrypt::init_encrypt(&*hdr, &*data, &pass(), &dh_params(DH_R)).unwrap();
    let end = reencrypt::run(&*hdr, &*data, &mut l, &pass(), &opts(), &mut |done, _| done < MIB).unwrap();
    assert_eq!(end, RunEnd::Interrupted);
    reads_writes_and_finishes(&hdr, &data, "detached data shift");
}

// The three data-shift runs online: under the device the server activates, while a client
// writes and reads all over it.

/// A device whose large reads (a hotzone's, not a client's 8 KiB or a whole-device read)
/// return 20 ms late: the run is slow between reading a hotzone and writing it, where a
/// client write into the hotzone would be lost if the run did not hold it.
#[derive(Debug)]
struct SlowHotzones(Arc<MemDevice>);

impl BlockDevice for SlowHotzones {
    fn geometry(&self) -> blockdev::Geometry {
        self.0.geometry()
    }
    fn caps(&self) -> blockdev::Caps {
        self.0.caps()
    }
    fn read_at(&self, off: u64, buf: &mut [u8]) -> blockdev::BlockResult<()> {
        let r = self.0.read_at(off, buf);
        if buf.len() >= 128 << 10 && buf.len() < self.0.geometry().size as usize / 2 {
            std::thread::sleep(Duration::from_millis(20));
        }
        r
    }
    fn write_at(&self, off: u64, buf: &[u8], flags: WriteFlags) -> blockdev::BlockResult<()> {
        self.0.write_at(off, buf, flags)
    }
    fn flush(&self) -> blockdev::BlockResult<()> {
        self.0.flush()
    }
}

fn slow(d: &Arc<MemDevice>) -> Arc<dyn BlockDevice> {
    Arc::new(SlowHotzones(d.clone()))
}

/// Runs the reencryption in progress (header `hdr`, data `data`: the same device when the
/// header is on it) online as the control server does: the device the server activates,
/// `run_unlocked` with it on a thread, and a client that meanwhile writes 8 KiB patterns
/// (at a pseudo-random place, across the run's boundary and 64 KiB either side of it, and
/// across `moved`, the end of the moved segment) and reads each back, and reads the whole
/// device now and then.
/// The progress callback stops the run after `stop_after` hotzones (`None`: to the end).
/// `model` (what the device holds) takes the writes. Returns how the run ended.
fn online_run(
    hdr: &Arc<dyn BlockDevice>,
    data: &Arc<dyn BlockDevice>,
    model: &mut [u8],
    moved: u64,
    stop_after: Option<u32>,
    what: &str,
) -> RunEnd {
    use std::sync::atomic::{AtomicBool, Ordering};
    let mut l = Luks::load(&**hdr, true).unwrap();
    let keys = reencrypt::unlock_keys(&**hdr, &l, &pass(), &Default::default()).unwrap();
    let storage = Storage::new(data.clone(), "data");
    let (dev, _, _) = volume::luks::reencrypting::activate(
        &storage,
        &**hdr,
        &mut l,
        &keys,
        &OpenOptions::default(),
        &Default::default(),
    )
    .unwrap_or_else(|e| panic!("{what}: activate: {e}"));
    let size = dev.geometry().size;
    assert_eq!(size, model.len() as u64, "{what}: size");
    assert!(read_all(&*dev) == model, "{what}: the served device before the run");
    let done = AtomicBool::new(false);
    let (mut writes, mut during) = (0u32, 0u32);
    let end = std::thread::scope(|sc| {
        let (dev2, keys2, done2) = (&dev, &keys, &done);
        let mut l2 = l.clone();
        let run = sc.spawn(move || {
            let mut n = 0u32;
            let r = reencrypt::run_unlocked(
                &**hdr,
                &**data,
                &mut l2,
                keys2,
                &opts(),
                Some(&**dev2),
                &mut |_, _| {
                    n += 1;
                    std::thread::sleep(Duration::from_millis(15));
                    stop_after.is_none_or(|s| n <= s)
                },
            );
            done2.store(true, Ordering::SeqCst);
            r
        });
        let mut x = 0x9e37_79b9_7f4a_7c15u64 ^ u64::from(stop_after.unwrap_or(99));
        loop {
            let finished = done.load(Ordering::SeqCst);
            x ^= x << 13;
            x ^= x >> 7;
            x ^= x << 17;
            let b = dev.boundary();
            let across = |p: u64| p.saturating_sub(4096).min(size - 8192);
            // Around the boundary: into the hotzone in flight and the next one, whichever
            // side of it they are.
            let near = |p: u64| across(p.clamp(4096, size));
            for off in [
                x % ((size - 8192) / 4096) * 4096,
                across(b),
                across(moved),
                near(b.saturating_sub(65536)),
                near(b + 65536),
            ] {
                writes += 1;
                let patch = vec![(writes % 251) as u8 + 1; 8192];
                dev.write_at(off, &patch, WriteFlags::empty()).unwrap();
                model[off as usize..off as usize + 8192].copy_from_slice(&patch);
                let mut back = vec![0u8; 8192];
                dev.read_at(off, &mut back).unwrap();
                assert!(back == patch, "{what}: read back at {off} (boundary {b})");
            }
            during += u32::from(!finished);
            if writes % 30 == 0 {
                assert!(read_all(&*dev) == model, "{what}: the device mid-run differs from the model");
            }
            if finished {
                break;
            }
            std::thread::sleep(Duration::from_millis(1));
        }
        run.join().unwrap().unwrap_or_else(|e| panic!("{what}: the online run: {e}"))
    });
    assert!(during >= 3, "{what}: only {during} client rounds during the run");
    assert!(read_all(&*dev) == model, "{what}: the device after the run");
    dev.flush().unwrap();
    end
}

/// Each data-shift mode stopped online after some hotzones, resumed online (a new server
/// activation), and finished online: every client write survives, and the finished volume
/// holds them (decrypted with its header's key, or plaintext in place).
#[test]
fn data_shift_runs_online_under_client_writes() {
    // 1. Encryption with data shift, header on the device (four hotzones).
    let dev = Arc::new(MemDevice::from_vec(shift_image(), 512));
    reencrypt::init_encrypt_shift(&*dev, &pass(), &params("checksum"), REDUCE).unwrap();
    let mut model = plaintext(SHIFT_DATA as usize);
    let d = slow(&dev);
    for (stop, end) in
        [(Some(1), RunEnd::Interrupted), (Some(2), RunEnd::Interrupted), (None, RunEnd::Finished)]
    {
        let what = format!("data shift encryption, stop {stop:?}");
        assert_eq!(online_run(&d, &d, &mut model, SHIFT, stop, &what), end, "{what}");
    }
    assert!(visible_shift(&*dev) == model, "data shift encryption: the finished volume");

    // 2. Encryption with data shift and a detached header: in place, backward.
    let hdr = Arc::new(MemDevice::new(DH_R, 512));
    let data = Arc::new(MemDevice::from_vec(plaintext(DH_DATA as usize), 512));
    reencrypt::init_encrypt(&*hdr, &*data, &pass(), &dh_params(DH_R)).unwrap();
    let mut model = plaintext(DH_DATA as usize);
    for (stop, end) in
        [(Some(1), RunEnd::Interrupted), (Some(2), RunEnd::Interrupted), (None, RunEnd::Finished)]
    {
        let what = format!("detached data shift encryption, stop {stop:?}");
        assert_eq!(
            online_run(&(hdr.clone() as Arc<dyn BlockDevice>), &slow(&data), &mut model, DH_R, stop, &what),
            end,
            "{what}"
        );
    }
    assert!(visible(&*hdr, &*data) == model, "detached data shift encryption: the finished volume");

    // 3. Decryption with data shift into a new header file: four forward hotzones, then the
    //    moved ciphertext in place (the second stop is right before it).
    let img = MemDevice::from_vec(ds_image(), 512);
    {
        let (d, h) = ds_split(&img);
        reencrypt::init_decrypt_shift(&h, &d, &pass(), &params("checksum")).unwrap();
    }
    let all = img.to_vec();
    let hdr = Arc::new(MemDevice::from_vec(all[DS_DEV as usize..].to_vec(), 512));
    let data = Arc::new(MemDevice::from_vec(all[..DS_DEV as usize].to_vec(), 4096));
    let mut model = plaintext(DS_DATA as usize);
    for (stop, end) in
        [(Some(1), RunEnd::Interrupted), (Some(3), RunEnd::Interrupted), (None, RunEnd::Finished)]
    {
        let what = format!("data shift decryption, stop {stop:?}");
        assert_eq!(
            online_run(
                &(hdr.clone() as Arc<dyn BlockDevice>),
                &slow(&data),
                &mut model,
                DS_SHIFT,
                stop,
                &what
            ),
            end,
            "{what}"
        );
    }
    let l = Luks::load(&*hdr, false).unwrap();
    assert!(reencrypt::status(&l).unwrap().is_none(), "data shift decryption: not finished");
    assert!(data.to_vec()[..DS_DATA as usize] == model[..], "data shift decryption: the finished data");
}
