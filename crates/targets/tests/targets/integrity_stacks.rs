//! The shared conformance suite and the model-based property test over integrity stacks:
//! integrity∘mem and integrity∘file in modes J, B and D, 512- and 4096-byte blocks, crc32c,
//! sha256 and hmac-sha256, and crypt∘integrity.

use crate::integrity_common;

use std::sync::Arc;

use blockdev::{BlockDevice, Checked, FileDevice, FileOptions};
use integrity_common::Shape;
use targets::integrity::{IntegrityTarget, Mode};
use testkit::conformance::Conformance;
use testkit::model::{self, DiscardModel, ModelConfig};

fn variants() -> Vec<(String, Shape, Mode)> {
    let mut small_il = Shape::new("crc32c", 512);
    small_il.interleave = 64;
    small_il.journal_sectors = Some(3 * 176);
    let mut legacy = Shape::new("hmac-sha256", 4096);
    legacy.fix_padding = false;
    vec![
        ("crc32c-512-J-il64".into(), small_il.clone(), Mode::Journal),
        ("crc32c-512-B-il64".into(), small_il, Mode::Bitmap),
        ("sha256-4096-D".into(), Shape::new("sha256", 4096), Mode::Direct),
        ("sha256-4096-J".into(), Shape::new("sha256", 4096), Mode::Journal),
        ("hmac-sha256-4096-legacy-B".into(), legacy, Mode::Bitmap),
    ]
}

fn over_mem(shape: &Shape, mode: Mode) -> Arc<dyn BlockDevice> {
    let dev = shape.mem(8 << 20);
    let mut cfg = shape.config(mode);
    cfg.allow_discards = true;
    cfg.commit_time_ms = 5; // the timer commits concurrently with requests
    Arc::new(Checked::expecting_rejections(IntegrityTarget::open(dev, cfg).unwrap()))
}

fn over_file(shape: &Shape, mode: Mode, dir: &std::path::Path) -> Arc<dyn BlockDevice> {
    use std::sync::atomic::{AtomicU64, Ordering};
    static N: AtomicU64 = AtomicU64::new(0);
    let path = dir.join(format!("i{}.img", N.fetch_add(1, Ordering::Relaxed)));
    let file = Arc::new(FileDevice::create(&path, 8 << 20, FileOptions::default()).unwrap());
    shape.format(file.clone());
    let mut cfg = shape.config(mode);
    cfg.allow_discards = true;
    Arc::new(IntegrityTarget::open(file, cfg).unwrap())
}

#[test]
fn integrity_over_mem_conforms() {
    for (label, shape, mode) in variants() {
        Conformance::new(|| over_mem(&shape, mode)).label(label).discard_model(DiscardModel::ZeroOrOld).run();
    }
}

#[test]
fn integrity_over_file_conforms() {
    let dir = tempfile::tempdir_in(env!("CARGO_TARGET_TMPDIR")).unwrap();
    for (label, shape, mode) in variants().into_iter().take(3) {
        Conformance::new(|| over_file(&shape, mode, dir.path()))
            .label(format!("{label}-file"))
            .discard_model(DiscardModel::ZeroOrOld)
            .run();
    }
}

#[test]
fn integrity_stacks_match_the_model() {
    let dir = tempfile::tempdir_in(env!("CARGO_TARGET_TMPDIR")).unwrap();
    for (_, shape, mode) in variants() {
        let config = ModelConfig { discard: DiscardModel::ZeroOrOld, cases: 12, ..ModelConfig::default() };
        model::run(|| over_mem(&shape, mode), config.clone());
        if mode != Mode::Journal {
            continue;
        }
        model::run(|| over_file(&shape, mode, dir.path()), config);
    }
}

#[test]
fn crypt_over_integrity_conforms() {
    let shape = Shape::new("crc32c", 4096);
    let make =
        || -> Arc<dyn BlockDevice> { Arc::new(integrity_common::xts4096(over_mem(&shape, Mode::Journal))) };
    Conformance::new(make).label("crypt-over-integrity-J").discard_model(DiscardModel::Anything).run();
}
