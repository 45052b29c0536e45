//! The object-storage device on gs:// against a real GCS emulator: `gcp-storage-emulator`
//! (PyPI; `pip install gcp-storage-emulator`), started and stopped here, reached through
//! `STORAGE_EMULATOR_HOST` as Google's client libraries do. Opt-in (`#[ignore]`: about 90 s
//! on the loaded 2-core machine, over the CI budget for object storage):
//! `cargo test -p objstore --test gcs -- --ignored`. Skips loudly when the emulator is not
//! installed.
//!
//! That emulator ignores `ifGenerationMatch=0` (a second create of an object succeeds), so
//! the one-writer lease cannot be tested on it; real GCS honours it.

use std::sync::atomic::{AtomicU32, Ordering};
use std::sync::Arc;

use blockdev::{BlockDevice, WriteFlags};
use objstore::OpenOptions;
use testkit::emulators::GcsEmulator;
use testkit::pattern::pattern;

const RW: OpenOptions = OpenOptions { read_only: false, create: false };
const RO: OpenOptions = OpenOptions { read_only: true, create: false };

/// Starts the emulator with bucket `vols` and points STORAGE_EMULATOR_HOST at it.
fn emulator(dir: &std::path::Path) -> Option<GcsEmulator> {
    let e = GcsEmulator::start(dir)?;
    std::env::set_var("STORAGE_EMULATOR_HOST", e.host());
    Some(e)
}

static N: AtomicU32 = AtomicU32::new(0);

fn fresh(params: &str) -> String {
    format!("gs://vols/t{}?{params}", N.fetch_add(1, Ordering::Relaxed))
}

/// One emulator for both checks (the environment variable is per process).
#[test]
#[ignore = "opt-in: needs gcp-storage-emulator and ~90 s (docs/TESTING.md)"]
fn conformance_and_reopen_on_gcs_emulator() {
    let dir = tempfile::tempdir().unwrap();
    let Some(_emu) = emulator(dir.path()) else { return };
    let make = || -> Arc<dyn BlockDevice> {
        Arc::new(objstore::open(&fresh("size=8M&object_size=64k&cache=256k"), RW).unwrap())
    };
    testkit::conformance::Conformance::new(make).label("objstore gcs emulator").run();

    // Write-back through a small cache, close, reopen read-only: every byte comes back.
    let uri = fresh("size=1M&object_size=64k&cache=128k");
    {
        let d = objstore::open(&uri, RW).unwrap();
        for i in 0..10u64 {
            let off = i * 65536 + 32768;
            d.write_at(off, &pattern(9, off, 65536), WriteFlags::empty()).unwrap();
        }
        d.flush().unwrap();
    }
    let d = objstore::open(&uri, RO).unwrap();
    let mut all = vec![1u8; 1 << 20];
    d.read_at(0, &mut all).unwrap();
    assert!(all[..32768].iter().all(|b| *b == 0));
    for i in 0..10u64 {
        let off = (i * 65536 + 32768) as usize;
        assert_eq!(&all[off..off + 65536], &pattern(9, off as u64, 65536)[..], "write {i}");
    }
    assert!(all[10 * 65536 + 32768..].iter().all(|b| *b == 0));
}
