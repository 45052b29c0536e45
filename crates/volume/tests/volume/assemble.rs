//! The one assembly path: every volume kind formatted and opened through `volume::format`
//! and `volume::open` on storage the test builds (memory), as the CLI and bench do on files.
use std::ops::ControlFlow;
use std::sync::Arc;

use blockdev::{BlockDevice, MemDevice, WriteFlags};
use sector_crypto::kdf::Passphrase;
use sector_crypto::VolumeKey;
use volume::integrity::IntegrityParams;
use volume::luks::{FormatParams, LuksIntegrity, LuksVersion, PbkdfParams, PbkdfType};
use volume::plain::PlainParams;
use volume::{
    AutoSpec, ErrorKind, Format, FormatSpec, Formatted, Keys, Layer, LayerTable, LuksSpec, OpenOptions,
    PassphraseSource, Spec, Storage, VolumeError, VolumeKind,
};

fn mem(bytes: u64) -> Storage {
    Storage::new(Arc::new(MemDevice::new(bytes, 512)), "mem0")
}

fn fast(mut p: FormatParams) -> FormatParams {
    p.pbkdf = PbkdfParams {
        kind: Some(PbkdfType::Pbkdf2),
        force_iterations: Some(sector_crypto::kdf::PBKDF2_MIN_ITERATIONS),
        ..PbkdfParams::default()
    };
    p
}

fn go(_: u64, _: u64) -> ControlFlow<()> {
    ControlFlow::Continue(())
}

/// Passphrases in order; counts the rejections.
struct Tries(Vec<&'static [u8]>, u32);

impl PassphraseSource for Tries {
    fn next_passphrase(&mut self) -> Result<Option<Passphrase>, VolumeError> {
        Ok((!self.0.is_empty()).then(|| Passphrase::new(self.0.remove(0).to_vec())))
    }
    fn rejected(&mut self) {
        self.1 += 1;
    }
}

fn round_trip(dev: &dyn BlockDevice) {
    let data: Vec<u8> = (0..8192u32).map(|i| (i * 13) as u8).collect();
    dev.write_at(4096, &data, WriteFlags::empty()).unwrap();
    let mut r = vec![0u8; 8192];
    dev.read_at(4096, &mut r).unwrap();
    assert_eq!(r, data);
}

fn format_luks(s: &Storage, params: FormatParams) {
    let pass = Passphrase::new(b"right".to_vec());
    let f = volume::format(FormatSpec::Luks { params: fast(params), header: None, passphrase: &pass }, s, go)
        .unwrap();
    assert!(matches!(f, Formatted::Luks { wipe: volume::luks::WipeEnd::Done, .. }));
}

#[test]
fn luks_volumes_open_through_one_call_with_retried_passphrases() {
    for version in [LuksVersion::V1, LuksVersion::V2] {
        let s = mem(20 << 20);
        format_luks(&s, FormatParams::for_cipher(version, "aes-xts-plain64", None, None).unwrap());
        let want = if version == LuksVersion::V1 { Format::Luks1 } else { Format::Luks2 { aead: false } };
        assert_eq!(volume::probe(&s).unwrap(), want);
        let mut tries = Tries(vec![b"wrong", b"right"], 0);
        let v = volume::open_storage(
            s.clone(),
            Spec::Luks(LuksSpec::default()),
            Keys::passphrase(&mut tries),
            &OpenOptions::default(),
        )
        .unwrap();
        assert_eq!(tries.1, 1, "one rejection before the right passphrase");
        let kind = if version == LuksVersion::V1 { VolumeKind::Luks1 } else { VolumeKind::Luks2 };
        assert_eq!(v.kind, kind);
        assert_eq!(v.crypt_table().unwrap().key.len(), 64, "default XTS key is 512 bits");
        assert_eq!(v.luks.as_ref().unwrap().keyslot, 0);
        round_trip(&*v.device);
        drop(v);
        let mut wrong = Tries(vec![b"no", b"nope"], 0);
        let e = volume::open_storage(
            s,
            Spec::Luks(LuksSpec::default()),
            Keys::passphrase(&mut wrong),
            &OpenOptions::default(),
        )
        .unwrap_err();
        assert_eq!(e.kind(), ErrorKind::WrongKey, "{e:?}");
        assert_eq!(wrong.1, 2);
    }
}

#[test]
fn authenticated_luks2_formats_in_one_call_and_opens_as_two_layers() {
    let s = mem(24 << 20);
    let spec = sector_crypto::AeadSpec::from_luks2("aes-xts-plain64", "hmac-sha256").unwrap();
    let i = LuksIntegrity { spec, no_wipe: false, no_journal: true, journal_size: None };
    let p = FormatParams::for_cipher(LuksVersion::V2, "aes-xts-plain64", None, Some(i)).unwrap();
    assert_eq!(p.key_bytes, 64 + 32, "the HMAC key is added to the volume key");
    format_luks(&s, p);
    assert_eq!(volume::probe(&s).unwrap(), Format::Luks2 { aead: true });
    let pass = Passphrase::new(b"right".to_vec());
    let mut one = volume::OnePassphrase::new(&pass);
    let v = volume::open_storage(
        s,
        Spec::Luks(LuksSpec::default()),
        Keys::passphrase(&mut one),
        &OpenOptions::default(),
    )
    .unwrap();
    assert_eq!(v.kind, VolumeKind::Luks2Aead);
    assert!(
        matches!(&v.layers[..], [LayerTable::Integrity(i), LayerTable::Crypt(_)] if i.internal_hash.is_none())
    );
    let mut r = vec![1u8; 4096];
    v.device.read_at(v.device.geometry().size - 4096, &mut r).unwrap();
    assert!(r.iter().all(|&b| b == 0), "the format wiped the whole volume with valid tags");
    round_trip(&*v.device);
}

#[test]
fn plain_crypt_over_integrity_is_a_stack_of_layers() {
    let s = mem(16 << 20);
    let ip = IntegrityParams { integrity: "sha256".into(), sector_size: 4096, ..IntegrityParams::default() };
    let f =
        volume::format(FormatSpec::Integrity { params: ip.clone(), salt: [3; 16], no_wipe: true }, &s, go)
            .unwrap();
    assert!(matches!(f, Formatted::Integrity(_)));
    assert_eq!(volume::probe(&s).unwrap(), Format::Integrity);
    let plain = PlainParams {
        cipher: "aes-xts-plain64".into(),
        key: VolumeKey::new(vec![7; 64]),
        offset: 0,
        skip: 0,
        size: None,
        options: Default::default(),
    };
    let v = volume::open_storage(
        s.clone(),
        Spec::Layers(vec![Layer::Integrity(ip.clone()), Layer::Plain(plain.clone())]),
        Keys::none(),
        &OpenOptions::default(),
    )
    .unwrap();
    assert_eq!(v.kind, VolumeKind::Layers);
    assert_eq!(v.layers.len(), 2);
    let LayerTable::Integrity(il) = &v.layers[0] else { panic!("integrity first") };
    assert_eq!((il.mode, il.block_size, il.tag_size), ('J', 4096, 32));
    assert!(il.to_string().starts_with("0 "), "{il}");
    round_trip(&*v.device);
    assert_eq!(v.integrity.as_ref().unwrap().status().mismatches, 0);
    drop(v);
    // A LUKS open of it names what is there.
    let pass = Passphrase::new(b"x".to_vec());
    let mut one = volume::OnePassphrase::new(&pass);
    let e = volume::open_storage(
        s.clone(),
        Spec::Luks(LuksSpec::default()),
        Keys::passphrase(&mut one),
        &OpenOptions::default(),
    )
    .unwrap_err();
    assert_eq!(e.kind(), ErrorKind::Usage);
    assert_eq!(e.to_string(), "Device mem0 is not a valid LUKS device: it holds a dm-integrity superblock.");
    // Integrity alone, then an empty stack.
    let v =
        volume::open_storage(s.clone(), Spec::Integrity(ip), Keys::none(), &OpenOptions::default()).unwrap();
    assert_eq!(v.kind, VolumeKind::Integrity);
    drop(v);
    let e = volume::open_storage(s, Spec::Layers(vec![]), Keys::none(), &OpenOptions::default()).unwrap_err();
    assert_eq!(e.kind(), ErrorKind::Usage);
}

#[test]
fn plain_errors_are_typed() {
    let s = mem(1 << 20);
    assert_eq!(volume::probe(&s).unwrap(), Format::Unknown);
    let p = PlainParams {
        cipher: "aes-xts-plain64".into(),
        key: VolumeKey::new(vec![7; 64]),
        offset: 4096,
        skip: 0,
        size: None,
        options: Default::default(),
    };
    let e = volume::open_storage(s.clone(), Spec::Plain(p.clone()), Keys::none(), &OpenOptions::default())
        .unwrap_err();
    assert_eq!(e.kind(), ErrorKind::Usage);
    assert_eq!(e.to_string(), "device mem0 (2048 sectors) is smaller than the offset (4096 sectors)");
    let bad = PlainParams { cipher: "nonsense-xts".into(), offset: 0, ..p };
    let e = volume::open_storage(s, Spec::Plain(bad), Keys::none(), &OpenOptions::default()).unwrap_err();
    assert_eq!(e.kind(), ErrorKind::Unsupported, "{e:?}");
}

/// `--journal-commit-time` on an authenticated LUKS2 volume: the dm-integrity layer commits
/// a write nobody flushed after that long (seen in a copy of the device taken while the
/// volume is still open, as a crash would leave it); with the kernel's default (10 s) the copy
/// does not have it yet. A watermark above 100% and the options on a volume without
/// integrity are refused.
#[test]
fn authenticated_luks2_takes_the_journal_commit_time_and_watermark() {
    let dev = Arc::new(MemDevice::new(24 << 20, 512));
    let s = Storage::new(dev.clone(), "mem0");
    let spec = sector_crypto::AeadSpec::from_luks2("aes-xts-plain64", "hmac-sha256").unwrap();
    let i = LuksIntegrity { spec, no_wipe: false, no_journal: true, journal_size: None };
    format_luks(&s, FormatParams::for_cipher(LuksVersion::V2, "aes-xts-plain64", None, Some(i)).unwrap());
    let pass = Passphrase::new(b"right".to_vec());
    let data: Vec<u8> = (0..4096u32).map(|i| (i * 7 + 1) as u8).collect();
    let open = |s: Storage, t: volume::luks::IntegrityJournalTuning| {
        let mut one = volume::OnePassphrase::new(&pass);
        let spec = LuksSpec { integrity_journal: t, ..LuksSpec::default() };
        volume::open_storage(s, Spec::Luks(spec), Keys::passphrase(&mut one), &OpenOptions::default())
    };
    // What a crash now would leave: the block as written, or not.
    let committed = |image: Vec<u8>| {
        let v = open(Storage::new(Arc::new(MemDevice::from_vec(image, 512)), "copy"), Default::default())
            .unwrap();
        let mut r = vec![0u8; 4096];
        v.device.read_at(8192, &mut r).unwrap();
        r == data
    };
    for (tuning, want) in [
        (volume::luks::IntegrityJournalTuning::default(), false),
        (volume::luks::IntegrityJournalTuning { watermark: Some(90), commit_time_ms: Some(50) }, true),
    ] {
        let v = open(s.clone(), tuning).unwrap();
        v.device.write_at(8192, &data, WriteFlags::empty()).unwrap();
        let t0 = std::time::Instant::now();
        let mut seen = false;
        while !seen && t0.elapsed() < std::time::Duration::from_millis(if want { 5000 } else { 400 }) {
            std::thread::sleep(std::time::Duration::from_millis(20));
            seen = committed(dev.to_vec());
        }
        assert_eq!(seen, want, "{tuning:?}: the unflushed write committed");
        // Back to zeroes for the next round.
        v.device.write_at(8192, &[0u8; 4096], WriteFlags::FUA).unwrap();
        drop(v);
    }
    let e =
        open(s.clone(), volume::luks::IntegrityJournalTuning { watermark: Some(101), commit_time_ms: None })
            .unwrap_err();
    assert!(chain(&e).contains("watermark"), "{e:?}");
    let plain = mem(20 << 20);
    format_luks(&plain, FormatParams::for_cipher(LuksVersion::V2, "aes-xts-plain64", None, None).unwrap());
    let e = open(plain, volume::luks::IntegrityJournalTuning { watermark: None, commit_time_ms: Some(5) })
        .unwrap_err();
    assert!(chain(&e).contains("--integrity only"), "{e:?}");
}

fn chain(e: &dyn std::error::Error) -> String {
    let mut s = e.to_string();
    let mut c = e.source();
    while let Some(x) = c {
        s += &format!(": {x}");
        c = x.source();
    }
    s
}

/// `Spec::Auto`: one call opens whatever the probe finds, with the same keys, and the volume
/// knows its kind; a device without a signature gets LUKS's refusal, which says so.
#[test]
fn auto_opens_what_the_probe_finds() {
    let luks = mem(20 << 20);
    format_luks(&luks, FormatParams::for_cipher(LuksVersion::V1, "aes-xts-plain64", None, None).unwrap());
    let mut tries = Tries(vec![b"wrong", b"right"], 0);
    let v = volume::open_storage(
        luks.clone(),
        Spec::auto(),
        Keys::passphrase(&mut tries),
        &OpenOptions::default(),
    )
    .unwrap();
    assert_eq!((v.kind, v.kind.type_name(), tries.1), (VolumeKind::Luks1, "LUKS1", 1));
    round_trip(&*v.device);
    drop(v);

    let integ = mem(16 << 20);
    let ip = IntegrityParams { integrity: "crc32c".into(), sector_size: 4096, ..IntegrityParams::default() };
    volume::format(FormatSpec::Integrity { params: ip.clone(), salt: [9; 16], no_wipe: false }, &integ, go)
        .unwrap();
    let auto = AutoSpec { integrity: ip, ..AutoSpec::default() };
    let v = volume::open_storage(integ, Spec::Auto(auto), Keys::none(), &OpenOptions::default()).unwrap();
    assert_eq!((v.kind, v.kind.to_string().as_str()), (VolumeKind::Integrity, "INTEGRITY"));
    round_trip(&*v.device);
    drop(v);

    // Nothing there: LUKS's refusal, typed as the caller's mistake, before any key is asked for.
    let mut never = Tries(vec![], 0);
    let e = volume::open_storage(
        mem(1 << 20),
        Spec::auto(),
        Keys::passphrase(&mut never),
        &OpenOptions::default(),
    )
    .unwrap_err();
    assert_eq!(e.kind(), ErrorKind::Usage, "{e:?}");
    assert_eq!(e.to_string(), "Device mem0 is not a valid LUKS device.");
}

/// The locator form: a file by path (and as a `file://` URI), read-only, with no keys for a
/// volume that needs none.
#[test]
fn open_by_locator_reads_a_file() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("integrity.img");
    std::fs::File::create(&path).unwrap().set_len(16 << 20).unwrap();
    let path = path.to_str().unwrap().to_owned();
    // Direct mode: what was written is on the data area once flushed, so the read-only
    // open below has no journal to replay.
    let ip = IntegrityParams {
        integrity: "crc32c".into(),
        mode: volume::integrity::Mode::Direct,
        ..IntegrityParams::default()
    };
    let rw = OpenOptions::default();
    let s = volume::storage::open(&path, &rw.storage()).unwrap();
    volume::format(FormatSpec::Integrity { params: ip.clone(), salt: [1; 16], no_wipe: false }, &s, go)
        .unwrap();
    let v = volume::open(&path, Spec::Integrity(ip.clone()), Keys::none(), &rw).unwrap();
    v.device.write_at(0, &[0x42; 4096], WriteFlags::FUA).unwrap();
    drop((v, s));
    let ro = OpenOptions { read_only: true, ..OpenOptions::default() };
    let auto = AutoSpec { integrity: ip, ..AutoSpec::default() };
    let v = volume::open(&format!("file://{path}"), Spec::Auto(auto), Keys::none(), &ro).unwrap();
    let mut r = vec![0u8; 4096];
    v.device.read_at(0, &mut r).unwrap();
    assert!(r.iter().all(|&b| b == 0x42));
    assert!(v.device.write_at(0, &r, WriteFlags::empty()).is_err(), "read-only");
}
