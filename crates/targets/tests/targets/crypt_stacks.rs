//! The shared conformance suite and the model-based property test, run over every crypt
//! stack: crypt∘mem, crypt∘file (buffered and O_DIRECT), crypt∘slice∘file, with 512-, 1024-
//! and 4096-byte sectors, XTS and CBC-ESSIV, inline and pooled crypto, and FaultDevice below.

use std::sync::Arc;

use blockdev::{BlockDevice, BlockErrorKind, Checked, FileDevice, FileOptions, MemDevice, Slice, WriteFlags};
use sector_crypto::{CipherSpec, SectorCipher, SectorParams, VolumeKey};
use targets::{CryptConfig, CryptMode, CryptTarget};
use testkit::conformance::Conformance;
use testkit::model::{self, DiscardModel, ModelConfig};
use testkit::{Fault, FaultDevice};

fn cipher(spec: &str, key_bytes: usize, sector_size: u32) -> SectorCipher {
    let spec: CipherSpec = spec.parse().unwrap();
    let key = VolumeKey::new((0..key_bytes as u8).map(|b| b.wrapping_mul(7) ^ 0x5c).collect());
    SectorCipher::new(&spec, &key, SectorParams { sector_size, iv_offset: 16, iv_large_sectors: false })
        .unwrap()
}

struct Variant {
    label: &'static str,
    spec: &'static str,
    key: usize,
    sector: u32,
    mode: CryptMode,
}

const VARIANTS: &[Variant] = &[
    Variant {
        label: "xts512-inline",
        spec: "aes-xts-plain64",
        key: 64,
        sector: 512,
        mode: CryptMode::Inline,
    },
    Variant { label: "xts4096-pool", spec: "aes-xts-plain64", key: 64, sector: 4096, mode: CryptMode::Pool },
    Variant {
        label: "essiv1024-pool",
        spec: "aes-cbc-essiv:sha256",
        key: 32,
        sector: 1024,
        mode: CryptMode::Pool,
    },
];

fn cfg(v: &Variant, offset: u64) -> CryptConfig {
    CryptConfig {
        offset,
        read_mode: v.mode,
        write_mode: v.mode,
        allow_discards: true,
        ..CryptConfig::default()
    }
}

fn over_mem(v: &Variant) -> Arc<dyn BlockDevice> {
    let below = MemDevice::new(8 << 20, 512);
    Arc::new(Checked::expecting_rejections(
        CryptTarget::new(below, cipher(v.spec, v.key, v.sector), cfg(v, 64 * 1024)).unwrap(),
    ))
}

fn over_file(v: &Variant, dir: &std::path::Path, direct: bool, slice: bool) -> Option<Arc<dyn BlockDevice>> {
    let path = dir.join(format!("{}-{}-{}.img", v.label, direct, next_id()));
    let opts = FileOptions { direct, ..FileOptions::default() };
    let file = match FileDevice::create(&path, 8 << 20, opts) {
        Ok(f) => f,
        Err(e) if e.kind() == BlockErrorKind::Unsupported => {
            eprintln!("SKIPPED PART: O_DIRECT is not supported in {}", dir.display());
            return None;
        }
        Err(e) => panic!("{e}"),
    };
    let dev: Arc<dyn BlockDevice> = if slice {
        let s = Slice::new(file, 1 << 20, 6 << 20).unwrap();
        Arc::new(CryptTarget::new(s, cipher(v.spec, v.key, v.sector), cfg(v, 8192)).unwrap())
    } else {
        Arc::new(CryptTarget::new(file, cipher(v.spec, v.key, v.sector), cfg(v, 4096)).unwrap())
    };
    Some(dev)
}

fn next_id() -> u64 {
    use std::sync::atomic::{AtomicU64, Ordering};
    static N: AtomicU64 = AtomicU64::new(0);
    N.fetch_add(1, Ordering::Relaxed)
}

/// A directory on a real filesystem (O_DIRECT does not work on every tmpfs).
fn workdir() -> tempfile::TempDir {
    tempfile::tempdir_in(env!("CARGO_TARGET_TMPDIR")).unwrap()
}

const BUFFERED_TORN: &str =
    "buffered pread may see a torn block during an overlapping pwrite; the contract leaves that unspecified";

#[test]
fn crypt_over_mem_conforms() {
    for v in VARIANTS {
        Conformance::new(|| over_mem(v)).label(v.label).discard_model(DiscardModel::Anything).run();
    }
}

#[test]
fn crypt_over_file_conforms() {
    let dir = workdir();
    for v in VARIANTS {
        for (direct, slice) in [(false, false), (true, false), (false, true)] {
            if over_file(v, dir.path(), direct, slice).is_none() {
                continue;
            }
            let label = format!("{}-direct{direct}-slice{slice}", v.label);
            let mut c = Conformance::new(|| over_file(v, dir.path(), direct, slice).unwrap())
                .label(label)
                .discard_model(DiscardModel::Anything);
            if !direct {
                c = c.skip("concurrent_reads_see_whole_blocks", BUFFERED_TORN);
            }
            c.run();
        }
    }
}

#[test]
fn crypt_stacks_match_the_model() {
    let dir = workdir();
    for v in VARIANTS {
        let config = ModelConfig { discard: DiscardModel::Anything, cases: 24, ..ModelConfig::default() };
        model::run(|| over_mem(v), config.clone());
        model::run(|| over_file(v, dir.path(), false, true).unwrap(), config);
    }
}

#[test]
fn io_errors_below_fail_the_request_and_nothing_else() {
    let v = &VARIANTS[1];
    let below = FaultDevice::new(MemDevice::new(1 << 20, 512));
    let t = CryptTarget::new(below, cipher(v.spec, v.key, v.sector), cfg(v, 0)).unwrap();
    let data = vec![0x42u8; 8192];
    t.write_at(0, &data, WriteFlags::empty()).unwrap();
    t.inner().inject(Fault::range(4096, 4096));
    let mut buf = vec![0u8; 8192];
    assert_eq!(t.read_at(0, &mut buf).unwrap_err().kind(), BlockErrorKind::Io);
    assert_eq!(t.write_at(4096, &data[..4096], WriteFlags::empty()).unwrap_err().kind(), BlockErrorKind::Io);
    let mut first = vec![0u8; 4096];
    t.read_at(0, &mut first).unwrap();
    assert_eq!(first, data[..4096]);
    t.inner().clear();
    t.read_at(0, &mut buf).unwrap();
    assert_eq!(buf, data, "a failed write must not have reached the device");
}
