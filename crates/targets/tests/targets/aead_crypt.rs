//! `AeadCryptTarget` over `IntegrityTarget` with external tags (LUKS2 authenticated
//! encryption's stack): the conformance suite, the model-based property test, tamper
//! detection (one flipped byte of data, tag or stored IV → that sector only fails), the
//! re-read before failing (the kernel's aead_recheck), and the checks at construction.

use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;

use blockdev::{BlockDevice, BlockErrorKind, BlockResult, Caps, Geometry, MemDevice, WriteFlags, ZeroFlags};
use formats::integrity::FormatParams;
use sector_crypto::{AeadSectorCipher, AeadSpec, SectorParams, VolumeKey};
use targets::integrity::{format, FormatOptions, IntegrityConfig, IntegrityTarget, Mode};
use targets::{AeadCryptTarget, CryptConfig, CryptError, CryptMode, TaggedDevice};
use testkit::conformance::Conformance;
use testkit::model::{self, DiscardModel, ModelConfig};

type Stack = AeadCryptTarget<IntegrityTarget<Arc<MemDevice>>>;

const HMAC: &str = "capi:authenc(hmac(sha256),xts(aes))-plain64";
const GCM: &str = "capi:gcm(aes)-random";
const CHACHA: &str = "capi:rfc7539(chacha20,poly1305)-random";

fn cipher(spec: &str, sector_size: u32) -> AeadSectorCipher {
    let spec: AeadSpec = spec.parse().unwrap();
    let klen = spec.valid_key_sizes().into_iter().max().unwrap();
    let key = VolumeKey::new((0..klen as u8).collect());
    let p = SectorParams { sector_size, iv_offset: 0, iv_large_sectors: false };
    AeadSectorCipher::new(&spec, &key, p, spec.tuple_size()).unwrap()
}

/// Formats `dev` as dm-integrity with external tags sized for `spec`.
fn format_for(dev: &MemDevice, spec: &str, ss: u32) {
    let tuple = spec.parse::<AeadSpec>().unwrap().tuple_size() as u32;
    let mut p = FormatParams::new(tuple, ss);
    p.interleave_sectors = 256;
    let opts = FormatOptions {
        params: p,
        start: 0,
        buffer_sectors: 128,
        sectors_per_bit: None,
        journal_mac: None,
        journal_crypt: None,
    };
    format(dev, &opts).unwrap();
}

fn integrity(dev: Arc<MemDevice>, spec: &str, ss: u32, mode: Mode) -> IntegrityTarget<Arc<MemDevice>> {
    let mut c = IntegrityConfig::new(mode, None);
    c.tag_size = Some(spec.parse::<AeadSpec>().unwrap().tuple_size() as u32);
    c.block_size = ss;
    c.commit_time_ms = 0;
    IntegrityTarget::open(dev, c).unwrap()
}

/// A fresh stack, wiped through the crypt layer as cryptsetup does (every sector gets a
/// valid tag).
fn stack(spec: &str, ss: u32, mode: Mode, size: u64) -> Stack {
    let dev = Arc::new(MemDevice::new(size, 512));
    format_for(&dev, spec, ss);
    let t = AeadCryptTarget::new(integrity(dev, spec, ss, mode), cipher(spec, ss), CryptConfig::default())
        .unwrap();
    let len = t.geometry().size;
    t.write_zeroes(0, len, ZeroFlags::empty()).unwrap();
    t
}

fn variants() -> Vec<(&'static str, u32, Mode)> {
    vec![
        (HMAC, 512, Mode::Direct),
        (HMAC, 4096, Mode::Journal),
        (GCM, 512, Mode::Journal),
        (GCM, 4096, Mode::Direct),
        (CHACHA, 512, Mode::Direct),
    ]
}

#[test]
fn aead_over_integrity_conforms() {
    for (spec, ss, mode) in variants() {
        Conformance::new(|| Arc::new(stack(spec, ss, mode, 4 << 20)) as Arc<dyn BlockDevice>)
            .label(format!("{spec}-{ss}-{mode:?}"))
            .run();
    }
}

#[test]
fn aead_over_integrity_matches_the_model() {
    for (spec, ss, mode) in variants() {
        let config = ModelConfig { discard: DiscardModel::ZeroOrOld, cases: 8, ..ModelConfig::default() };
        model::run(|| Arc::new(stack(spec, ss, mode, 2 << 20)) as Arc<dyn BlockDevice>, config);
    }
}

fn pattern(len: usize, seed: u64) -> Vec<u8> {
    testkit::pattern::pattern(seed, 0, len)
}

/// Flips one byte of what the integrity layer stores for crypt sector `idx` — in the data
/// (`Some(byte)`) or in the tuple (`None`, at `tuple_byte`) — bypassing the crypt layer.
fn tamper(t: &Stack, ss: usize, idx: u64, data_byte: Option<usize>, tuple_byte: usize) {
    let below = t.inner();
    let mut d = vec![0u8; ss];
    let mut tag = vec![0u8; below.tag_size()];
    below.read_tagged(idx * ss as u64, &mut d, &mut tag).unwrap();
    match data_byte {
        Some(b) => d[b] ^= 0x10,
        None => tag[tuple_byte] ^= 0x01,
    }
    below.write_tagged(idx * ss as u64, &d, &tag, WriteFlags::empty()).unwrap();
}

#[test]
fn one_flipped_byte_fails_that_sector_only() {
    for (spec, ss, mode) in variants() {
        let s: AeadSpec = spec.parse().unwrap();
        let ssz = ss as usize;
        let mut spots = vec![(Some(17usize), 0usize), (None, 5)];
        if s.stored_iv_size() > 0 {
            spots.push((None, s.auth_tag_size() + 2));
        }
        for (data_byte, tuple_byte) in spots {
            let t = stack(spec, ss, mode, 2 << 20);
            let data = pattern(8 * ssz, 3);
            t.write_at(0, &data, WriteFlags::empty()).unwrap();
            tamper(&t, ssz, 5, data_byte, tuple_byte);
            let mut all = vec![0xeeu8; 8 * ssz];
            let e = t.read_at(0, &mut all).unwrap_err();
            let bad_sector = 5 * u64::from(ss / 512);
            assert_eq!(e.kind(), BlockErrorKind::IntegrityMismatch { sector: bad_sector }, "{spec} {ss}");
            assert_eq!(e.kind().errno(), libc_eilseq(), "answered as EIO/EILSEQ, never data");
            assert!(all.iter().all(|&b| b == 0), "nothing of a failed read is returned");
            assert_eq!(t.auth_failures(), 1);
            // Every other sector reads back, singly and as ranges around the bad one.
            for i in (0..8).filter(|&i| i != 5) {
                let mut one = vec![0u8; ssz];
                t.read_at(i * u64::from(ss), &mut one).unwrap();
                assert_eq!(one, &data[i as usize * ssz..(i as usize + 1) * ssz]);
            }
            let mut head = vec![0u8; 5 * ssz];
            t.read_at(0, &mut head).unwrap();
            assert_eq!(head, &data[..5 * ssz]);
            // Rewriting the sector heals it.
            t.write_at(5 * u64::from(ss), &data[5 * ssz..6 * ssz], WriteFlags::empty()).unwrap();
            t.read_at(0, &mut all).unwrap();
            assert_eq!(all, data);
        }
    }
}

fn libc_eilseq() -> i32 {
    BlockErrorKind::IntegrityMismatch { sector: 0 }.errno()
}

/// A tagged device whose next `corrupt` tagged reads return a flipped data byte.
#[derive(Debug)]
struct Flaky<D> {
    inner: D,
    corrupt: AtomicUsize,
    reads: AtomicUsize,
}

impl<D: TaggedDevice> BlockDevice for Flaky<D> {
    fn geometry(&self) -> Geometry {
        self.inner.geometry()
    }
    fn caps(&self) -> Caps {
        self.inner.caps()
    }
    fn read_at(&self, off: u64, buf: &mut [u8]) -> BlockResult<()> {
        self.inner.read_at(off, buf)
    }
    fn write_at(&self, off: u64, buf: &[u8], flags: WriteFlags) -> BlockResult<()> {
        self.inner.write_at(off, buf, flags)
    }
    fn flush(&self) -> BlockResult<()> {
        self.inner.flush()
    }
}

impl<D: TaggedDevice> TaggedDevice for Flaky<D> {
    fn tag_size(&self) -> usize {
        self.inner.tag_size()
    }
    fn tag_block_size(&self) -> usize {
        self.inner.tag_block_size()
    }
    fn read_tagged(&self, off: u64, buf: &mut [u8], tags: &mut [u8]) -> BlockResult<()> {
        self.reads.fetch_add(1, Ordering::SeqCst);
        self.inner.read_tagged(off, buf, tags)?;
        if self.corrupt.load(Ordering::SeqCst) > 0 {
            self.corrupt.fetch_sub(1, Ordering::SeqCst);
            buf[buf.len() - 1] ^= 1;
        }
        Ok(())
    }
    fn write_tagged(&self, off: u64, buf: &[u8], tags: &[u8], flags: WriteFlags) -> BlockResult<()> {
        self.inner.write_tagged(off, buf, tags, flags)
    }
}

#[test]
fn a_failed_tag_is_read_once_more_before_the_read_fails() {
    for spec in [HMAC, GCM] {
        let dev = Arc::new(MemDevice::new(2 << 20, 512));
        format_for(&dev, spec, 4096);
        let flaky = Flaky {
            inner: integrity(dev, spec, 4096, Mode::Direct),
            corrupt: AtomicUsize::new(0),
            reads: AtomicUsize::new(0),
        };
        let t = AeadCryptTarget::new(flaky, cipher(spec, 4096), CryptConfig::default()).unwrap();
        let data = pattern(16384, 9);
        t.write_at(8192, &data, WriteFlags::empty()).unwrap();
        // One transient corruption: the re-read verifies, the read succeeds.
        t.inner().corrupt.store(1, Ordering::SeqCst);
        let mut back = vec![0u8; 16384];
        t.read_at(8192, &mut back).unwrap();
        assert_eq!(back, data);
        assert_eq!(t.inner().reads.load(Ordering::SeqCst), 2, "{spec}: exactly one re-read");
        assert_eq!(t.auth_failures(), 0);
        // Two: the read fails, naming the last sector of the request (where the byte flips).
        t.inner().corrupt.store(2, Ordering::SeqCst);
        let e = t.read_at(8192, &mut back).unwrap_err();
        assert_eq!(e.kind(), BlockErrorKind::IntegrityMismatch { sector: (8192 + 12288) / 512 });
        assert_eq!(t.auth_failures(), 1);
    }
}

#[test]
fn construction_checks_the_tagged_device_and_refuses_discards() {
    let dev = Arc::new(MemDevice::new(2 << 20, 512));
    format_for(&dev, GCM, 512);
    let below = || integrity(dev.clone(), GCM, 512, Mode::Direct);
    let e = AeadCryptTarget::new(below(), cipher(GCM, 4096), CryptConfig::default()).unwrap_err();
    assert!(
        matches!(e, CryptError::TagBlockSizeMismatch { .. }) && e.to_string().contains("sector size"),
        "{e}"
    );
    let e = AeadCryptTarget::new(below(), cipher(HMAC, 512), CryptConfig::default()).unwrap_err();
    assert!(matches!(e, CryptError::TagSizeMismatch { .. }) && e.to_string().contains("tag size"), "{e}");
    let e = AeadCryptTarget::new(
        below(),
        cipher(GCM, 512),
        CryptConfig { allow_discards: true, ..CryptConfig::default() },
    )
    .unwrap_err();
    assert!(matches!(e, CryptError::DiscardsWithAead) && e.to_string().contains("discard"), "{e}");
    let t = AeadCryptTarget::new(below(), cipher(GCM, 512), CryptConfig::default()).unwrap();
    assert!(!t.caps().contains(Caps::DISCARD));
    assert_eq!(t.discard(0, 4096).unwrap_err().kind(), BlockErrorKind::Unsupported);
    let ro = AeadCryptTarget::new(
        below(),
        cipher(GCM, 512),
        CryptConfig { read_only: true, ..CryptConfig::default() },
    )
    .unwrap();
    assert_eq!(ro.write_at(0, &[0; 512], WriteFlags::empty()).unwrap_err().kind(), BlockErrorKind::ReadOnly);
    let dbg = format!("{t:?}");
    assert!(!dbg.contains("0, 1, 2, 3, 4"), "{dbg}");
}

#[test]
fn the_aad_sector_is_relative_to_the_target_not_the_device_below() {
    // Two targets over the same tagged device, one shifted by 8 KiB: what the shifted target
    // wrote at its offset 0 only authenticates as target sector 0.
    let dev = Arc::new(MemDevice::new(2 << 20, 512));
    format_for(&dev, HMAC, 512);
    let shifted = AeadCryptTarget::new(
        integrity(dev.clone(), HMAC, 512, Mode::Direct),
        cipher(HMAC, 512),
        CryptConfig { offset: 8192, ..CryptConfig::default() },
    )
    .unwrap();
    let data = pattern(1024, 4);
    shifted.write_at(0, &data, WriteFlags::empty()).unwrap();
    let mut back = vec![0u8; 1024];
    shifted.read_at(0, &mut back).unwrap();
    assert_eq!(back, data);
    drop(shifted);
    let flat = AeadCryptTarget::new(
        integrity(dev, HMAC, 512, Mode::Direct),
        cipher(HMAC, 512),
        CryptConfig::default(),
    )
    .unwrap();
    let e = flat.read_at(8192, &mut back).unwrap_err();
    assert_eq!(e.kind(), BlockErrorKind::IntegrityMismatch { sector: 16 });
}

/// The same stack with crypto placed by `mode` in both directions.
fn stack_placed(spec: &str, ss: u32, placement: CryptMode, size: u64) -> Stack {
    let dev = Arc::new(MemDevice::new(size, 512));
    format_for(&dev, spec, ss);
    let cfg = CryptConfig { read_mode: placement, write_mode: placement, ..CryptConfig::default() };
    let t = AeadCryptTarget::new(integrity(dev, spec, ss, Mode::Direct), cipher(spec, ss), cfg).unwrap();
    let len = t.geometry().size;
    t.write_zeroes(0, len, ZeroFlags::empty()).unwrap();
    t
}

#[test]
fn large_requests_split_across_the_pool_read_back_and_name_the_first_bad_sector() {
    // 1 MiB requests are 16 chunks of 64 KiB: Auto and Pool spread them over the crypto
    // pool, Inline keeps them on this thread. Every placement must write what every other
    // placement reads (same AAD sector per chunk), and a failing request must name its first
    // bad sector whichever chunk finished first.
    for spec in [HMAC, GCM, CHACHA] {
        for ss in [512u32, 4096] {
            let data = pattern(1 << 20, 11);
            let stacks: Vec<(CryptMode, Stack)> = [CryptMode::Inline, CryptMode::Auto, CryptMode::Pool]
                .into_iter()
                .map(|m| (m, stack_placed(spec, ss, m, 4 << 20)))
                .collect();
            for (m, t) in &stacks {
                t.write_at(64 << 10, &data, WriteFlags::empty()).unwrap();
                let mut back = vec![0u8; 1 << 20];
                t.read_at(64 << 10, &mut back).unwrap();
                assert!(back == data, "{spec} {ss} {m:?}");
                // Read the same bytes sector by sector: the chunk boundaries carried the
                // right sector numbers.
                let mut piece = vec![0u8; ss as usize];
                for (i, want) in data.chunks(ss as usize).enumerate().step_by(37) {
                    t.read_at((64 << 10) + (i * ss as usize) as u64, &mut piece).unwrap();
                    assert!(piece == want, "{spec} {ss} {m:?} sector {i}");
                }
                // Two bad sectors in different chunks: the lower one is reported.
                let (lo, hi) = (3 * (64 << 10) / ss as u64 + 1, 12 * (64 << 10) / ss as u64);
                let base = (64 << 10) / u64::from(ss);
                tamper(t, ss as usize, base + hi, Some(3), 0);
                tamper(t, ss as usize, base + lo, Some(3), 0);
                let e = t.read_at(64 << 10, &mut back).unwrap_err();
                let want = (base + lo) * u64::from(ss / 512);
                assert_eq!(e.kind(), BlockErrorKind::IntegrityMismatch { sector: want }, "{spec} {ss} {m:?}");
                assert!(back.iter().all(|&b| b == 0), "{spec} {ss} {m:?}: nothing returned");
            }
        }
    }
}
